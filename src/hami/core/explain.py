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
from typing import Any

from .fit import fit_pod, make_context
from .ledger import Ledger
from .reasons import NodeFailure
from .requests import admit_pod, pod_request
from .schedule import SchedulerConfig, filter_pod, pod_policies
from .types import DeviceInfo, PodRequest


def _why_devices(failure: NodeFailure) -> dict[str, str]:
    return {uuid: reason.value for reason, uuids in failure.devices for uuid in uuids}


@dataclass(frozen=True)
class DeviceVerdict:
    """One device of a node, its usage and why it cannot serve the pod ("ok" when it can)."""

    device: DeviceInfo
    slots: int
    mem: int
    cores: int
    reason: str


@dataclass(frozen=True)
class NodeVerdict:
    """One node's answer for a pending pod: ``reason`` is HAMi's string ("" when it fits)."""

    node: str
    fits: bool
    reason: str = ""
    container: int = -1  # the failing container (annotation order); -1 = node-level
    devices: tuple[DeviceVerdict, ...] = ()


@dataclass(frozen=True)
class PendingVerdict:
    """Why a pod without an allocation is pending: its requests and every node's verdict."""

    request: PodRequest
    chosen: str | None  # the node the scheduler would choose now (None: fits nowhere)
    nodes: tuple[NodeVerdict, ...]


def pending_verdict(pod: dict, ledger: Ledger, config: SchedulerConfig, vendors: Any, now: float) -> PendingVerdict:
    """Run the scheduler's filter and the per-node fit for a pod that holds nothing in
    ``ledger`` (read-only: the ledger is not changed). Raises CoreError on a pod whose
    requests or annotations cannot be read."""
    admitted, _ = admit_pod(pod, vendors)
    req = pod_request(admitted, vendors)
    if not req.has_devices:
        return PendingVerdict(req, None, ())
    result = filter_pod(admitted, None, ledger, config, now)
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
        res = fit_pod(ledger.view(name), ctx)
        if not isinstance(res, NodeFailure):
            verdicts.append(NodeVerdict(name, True))
            continue
        why = _why_devices(res)
        devices = tuple(
            DeviceVerdict(d, slots, mem, cores, why.get(d.id, "ok"))
            for d, slots, mem, cores in ledger.device_usage(name)
        )
        verdicts.append(NodeVerdict(name, False, res.render(), res.container, devices))
    return PendingVerdict(req, result.node, tuple(verdicts))
