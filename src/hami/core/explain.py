"""Why a pod is pending, per node and per device: the verdicts ``hami explain``, the UI's
``/api/v1/pending`` and ``hami simulate`` show.

Owns :func:`pending_verdict`, which runs the scheduler's own filter (:func:`hami.core.schedule.filter_pod`)
and then the per-node fit on every node (no laziness: each node gets its verdict), and the
verdict types it returns. Pure, like the rest of the core: the ledger, config and vendors are
passed in and nothing is changed. It does not read the cluster nor print: ``hami explain``
(:mod:`hami.scheduler.explain`) and the UI model turn a verdict into text or JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from .fit import FitContext, NodeView, fit_pod, make_context
from .ledger import Ledger
from .reasons import NodeFailure, Reason
from .requests import admit_pod, pod_request
from .schedule import SchedulerConfig, filter_pod, pod_policies
from .types import DeviceInfo, PodRequest


def _why_devices(failure: NodeFailure) -> dict[str, str]:
    return {uuid: reason.value for reason, uuids in failure.devices for uuid in uuids}


@dataclass(frozen=True)
class DeviceVerdict:
    """One device of a node, its usage and why it cannot serve the pod ("ok" when it can).

    The usage is the node's as the failing container saw it: ``pod_slots``, ``pod_mem`` and
    ``pod_cores`` are the part of ``slots``, ``mem`` and ``cores`` that this pod's earlier
    containers took on the device (0 for the pod's first container)."""

    device: DeviceInfo
    slots: int
    mem: int
    cores: int
    reason: str
    pod_slots: int = 0
    pod_mem: int = 0
    pod_cores: int = 0
    detail: str = ""  # the reason in plain words where the code leaves out what to do (MIG: too small or fragmented)


@dataclass(frozen=True)
class NodeVerdict:
    """One node's answer for a pending pod: ``reason`` is HAMi's string ("" when it fits);
    ``detail`` says in plain words what a bare code leaves out (``NodeInsufficientDevice``: how
    many devices the node has of those asked)."""

    node: str
    fits: bool
    reason: str = ""
    container: int = -1  # the failing container (annotation order); -1 = node-level
    devices: tuple[DeviceVerdict, ...] = ()
    detail: str = ""


@dataclass(frozen=True)
class PendingVerdict:
    """Why a pod without an allocation is pending: its requests and every node's verdict."""

    request: PodRequest
    chosen: str | None  # the node the scheduler would choose now (None: fits nowhere)
    nodes: tuple[NodeVerdict, ...]


def pending_verdict(
    pod: dict,
    ledger: Ledger,
    config: SchedulerConfig,
    vendors: Any,
    now: float,
    candidates: Iterable[str] | None = None,
) -> PendingVerdict:
    """Run the scheduler's filter and the per-node fit for a pod that holds nothing in
    ``ledger`` (read-only: the ledger is not changed). Raises CoreError on a pod whose
    requests or annotations cannot be read.

    ``candidates``: the nodes kube-scheduler offers the extender (None: every node); ``chosen``
    is chosen among them, as the scheduler chooses. Every node still gets its verdict: a node
    kube-scheduler leaves out may be the one whose devices would take the pod."""
    admitted, _ = admit_pod(pod, vendors)
    req = pod_request(admitted, vendors)
    if not req.has_devices:
        return PendingVerdict(req, None, ())
    result = filter_pod(admitted, None if candidates is None else list(candidates), ledger, config, now)
    _, gpu_policy, weights = pod_policies(req, config)
    used = [v for v in vendors if v.name in req.vendors()]
    ctx = make_context(
        req,
        vendors,
        gpu_policy,
        weights,
        ledger.quota_room(req.namespace, used),
        request_in_scores=config.request_in_scores,
    )
    verdicts = []
    for name in ledger.node_names():
        seen: list[NodeView] = []
        res = fit_pod(ledger.view(name), ctx, seen)
        if isinstance(res, NodeFailure):
            verdicts.append(_refused(name, res, ledger, ctx, seen[0] if seen else None))
        else:
            verdicts.append(NodeVerdict(name, True))
    return PendingVerdict(req, result.node, tuple(verdicts))


def _refused(name: str, failure: NodeFailure, ledger: Ledger, ctx: FitContext, seen: NodeView | None) -> NodeVerdict:
    """Node ``name``'s verdict for ``failure``: each device's reason, and its usage as the
    failing container saw it (``seen``). A device the failing request never considered (another
    vendor's, or one its vendor does not serve) says so instead of "ok"; under a bare
    ``NodeInsufficientDevice`` each device considered says how many there are of those asked."""
    why = _why_devices(failure)
    plan = ctx.plans.get((failure.container, failure.vendor))
    fallback, detail = "ok", ""
    if failure.bare and failure.codes() == (Reason.NODE_INSUFFICIENT_DEVICE,):
        asked = failure.counts[0][1]
        detail = f"the node has {failure.total} of the {asked} {failure.vendor} devices the container asks for"
        fallback = f"considered, but too few: {failure.total} of the {asked} asked (NodeInsufficientDevice)"
    at = {d.id: i for i, d in enumerate(seen.devices)} if seen is not None else {}
    devices = []
    for d, slots, mem, cores in ledger.device_usage(name):
        if plan is not None and (d.vendor != failure.vendor or not plan.vendor.serves(d, plan.req)):
            reason = f"not considered ({d.vendor})"
        else:
            reason = why.get(d.id, fallback)
        own = (0, 0, 0)
        i = at.get(d.id)
        if seen is not None and i is not None:
            own = (seen.used[i] - slots, seen.usedmem[i] - mem, seen.usedcores[i] - cores)
        more = ""
        if reason == Reason.CARD_MIG_TOPOLOGY_INFEASIBLE.value and plan is not None:
            mig_detail = getattr(plan.vendor, "mig_detail", None)
            if mig_detail is not None:
                # the instances as the failing container saw them (the pod's earlier containers'
                # too), and how many it asks for: its own instances may be what does not fit
                held = (
                    seen.slices.get(i, ()) if seen is not None and i is not None else ledger.slices(name).get(d.id, ())
                )
                more = mig_detail(d, plan.vendor.resolve_memory(d, plan.req), held, plan.req.nums)
        devices.append(DeviceVerdict(d, slots + own[0], mem + own[1], cores + own[2], reason, *own, detail=more))
    return NodeVerdict(name, False, failure.render(), failure.container, tuple(devices), detail)
