"""The scheduler's entry point: pick a node and devices for one pod (§5.3).

    result = filter_pod(pod, candidate_nodes, ledger, config, now)

``pod`` is a Pod dict as the API server returns it (already through admission, see
:func:`hami.core.requests.admit_pod`). The ledger must not hold this pod (``schedule_pod``
removes a previous reservation, reserves the new decision, and is what the extender and the
simulator call). Node search is lazy: nodes are ranked by a node score computed from the
ledger's per-node summaries plus this pod's request, obviously-full nodes are skipped without
visiting devices, and the first node in rank order where the full fit succeeds wins. When no
node fits, every candidate is fitted so that each gets its exact reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from .fit import FitContext, NodeFit, fit_pod, make_context
from .ledger import NODE_ANNOTATION, Ledger, NodeSummary, make_allocation, pod_key
from .reasons import UNREGISTERED, NodeFailure
from .requests import pod_request
from .score import (
    DEFAULT_WEIGHTS,
    GPU_POLICY_ANNOTATION,
    NODE_POLICY_ANNOTATION,
    WEIGHTS_ANNOTATION,
    DevicePolicy,
    node_score,
    parse_gpu_policy,
    parse_node_policy,
    parse_weights,
)
from .types import PERCENT_UNSET, ContainerKind, PodAllocation, PodRequest

TIME_ANNOTATION = "hami.io/vgpu-time"


@dataclass(frozen=True)
class SchedulerConfig:
    """Vendors plus cluster-wide default policies (scheduler flags)."""

    vendors: tuple[Any, ...]
    node_policy: str = "binpack"
    gpu_policy: str = "spread"
    #: True: node and device scores count this pod's request; False: HAMi v2.10's scores
    #: (docs/compatibility.md, "Scores count the request")
    request_in_scores: bool = True

    def __post_init__(self) -> None:
        parse_node_policy(self.node_policy, "--node-scheduler-policy")
        parse_gpu_policy(self.gpu_policy, "--gpu-scheduler-policy")

    @classmethod
    def from_device_config(cls, device_config: Any = None, node_policy: str = "binpack",
                           gpu_policy: str = "spread", request_in_scores: bool = True) -> "SchedulerConfig":
        from hami.vendors import build_vendors  # the core never imports vendors at module level

        return cls(vendors=build_vendors(device_config), node_policy=node_policy, gpu_policy=gpu_policy,
                   request_in_scores=request_in_scores)


@dataclass(frozen=True)
class FilterResult:
    pod: PodRequest
    node: str | None  # chosen node; None = pending (or no device request, see needs_devices)
    allocation: PodAllocation | None  # what to reserve in the ledger
    failed: Mapping[str, NodeFailure] = field(default_factory=dict)  # examined nodes that cannot fit
    scores: Mapping[str, float] = field(default_factory=dict)  # node score of the examined fitting nodes
    annotations: Mapping[str, str] = field(default_factory=dict)  # to merge-patch onto the pod
    needs_devices: bool = True  # False: the pod requests no device; pass candidates through

    def reasons(self) -> dict[str, str]:
        """``node -> HAMi reason string`` (the extender's ``FailedNodes``)."""
        return {n: f.render() for n, f in sorted(self.failed.items())}


@dataclass(frozen=True, slots=True)
class _Demand:
    """What the pod adds to a node's totals, for the node score (vendor-independent sums)."""

    slots: int
    cores: int
    mem: int
    pct: int  # percent-of-a-device units, resolved against the node's average device memory
    checks: tuple[tuple[str, int, int, int, int], ...]  # (vendor, nums, memreq, pct, cores) per request


def _demand(pod: PodRequest) -> _Demand:
    def amounts(reqs) -> list[int]:
        out = [0, 0, 0, 0]
        for r in reqs:
            out[0] += r.nums
            out[1] += r.coresreq * r.nums
            if r.memreq:
                out[2] += r.memreq * r.nums
            elif r.mem_percentage != PERCENT_UNSET:
                out[3] += r.mem_percentage * r.nums
        return out

    steady = [0, 0, 0, 0]
    side = [0, 0, 0, 0]
    peak = [0, 0, 0, 0]
    for c in pod.containers:
        a = amounts(c.requests)
        if c.kind is ContainerKind.INIT:
            peak = [max(p, x + s) for p, x, s in zip(peak, a, side)]
        else:
            steady = [x + y for x, y in zip(steady, a)]
            if c.kind is ContainerKind.SIDECAR:
                side = [x + y for x, y in zip(side, a)]
    total = [max(x, y) for x, y in zip(steady, peak)]
    checks = tuple(
        (r.vendor, r.nums, r.memreq, r.mem_percentage, r.coresreq) for c in pod.containers for r in c.requests
    )
    return _Demand(slots=total[0], cores=total[1], mem=total[2], pct=total[3], checks=checks)


_NO_DEMAND = _Demand(slots=0, cores=0, mem=0, pct=0, checks=())  # HAMi's node score: usage before the pod


class _TypeGate:
    """Per pod: does a node have at least one device model the pod's selection accepts?"""

    def __init__(self, ctx: FitContext) -> None:
        self._ctx = ctx
        self._memo: dict[tuple[str, frozenset[str]], bool] = {}

    def admits(self, vendor: str, types: frozenset[str]) -> bool:
        key = (vendor, types)
        hit = self._memo.get(key)
        if hit is None:
            v, sel = self._ctx.vendors[vendor], self._ctx.selections[vendor]
            hit = self._memo[key] = any(v.type_admits(t, sel) for t in types)
        return hit


def _quick_reject(s: NodeSummary, demand: _Demand, gate: _TypeGate, prefilter: Mapping[str, bool]) -> bool:
    """Necessary conditions from the summary; True means the pod certainly does not fit.

    The capacity conditions mirror the generic capacity rules, so they apply only to vendors
    that declare ``summary_prefilter`` (their ``capacity_check`` is at least as strict)."""
    for vendor, nums, memreq, pct, cores in demand.checks:
        v = s.vendors.get(vendor)
        if v is None:
            return True
        need = 1 if v.sliced else nums  # a sliced (MIG) device may serve several of the nums
        if v.devices < need:
            return True
        if not prefilter.get(vendor):
            continue
        if v.free_slot < need or not gate.admits(vendor, v.types):
            return True
        if memreq and v.max_free_mem < memreq:
            return True
        if not memreq and pct != PERCENT_UNSET and pct >= v.max_pct_bound:
            return True
        if cores and v.max_free_cores < cores:
            return True
        if cores >= 100 and v.idle < need:
            return True
    return False


def _score(s: NodeSummary, demand: _Demand, devices: int) -> float:
    mem = demand.mem + (demand.pct * s.totalmem / (100 * devices) if devices else 0)
    return node_score(s.used + demand.slots, s.count, s.usedcores + demand.cores, s.totalcore,
                      s.usedmem + mem, s.totalmem)


def _policies(pod: PodRequest, config: SchedulerConfig) -> tuple[str, DevicePolicy, Any]:
    a = pod.annotations
    where = f"pod {pod.namespace}/{pod.name} annotation"
    node_policy = parse_node_policy(a[NODE_POLICY_ANNOTATION], f"{where} {NODE_POLICY_ANNOTATION}") \
        if a.get(NODE_POLICY_ANNOTATION) else config.node_policy
    gpu_policy = parse_gpu_policy(a[GPU_POLICY_ANNOTATION], f"{where} {GPU_POLICY_ANNOTATION}") \
        if a.get(GPU_POLICY_ANNOTATION) else parse_gpu_policy(config.gpu_policy)
    weights = parse_weights(a[WEIGHTS_ANNOTATION], f"{where} {WEIGHTS_ANNOTATION}") \
        if a.get(WEIGHTS_ANNOTATION) else DEFAULT_WEIGHTS
    return node_policy, gpu_policy, weights


def filter_pod(pod: Mapping[str, Any], candidate_nodes: Iterable[str] | None, ledger: Ledger,
               config: SchedulerConfig, now: float) -> FilterResult:
    """Choose a node and devices for ``pod``; does not modify the ledger. Raises RequestError."""
    req = pod_request(pod, config.vendors)
    if not req.has_devices:
        return FilterResult(pod=req, node=None, allocation=None, needs_devices=False)
    node_policy, gpu_policy, weights = _policies(req, config)
    used_vendors = [v for v in config.vendors if v.name in req.vendors()]
    ctx = make_context(req, config.vendors, gpu_policy, weights, ledger.quota_room(req.namespace, used_vendors),
                       request_in_scores=config.request_in_scores)
    names = ledger.node_names() if candidate_nodes is None else sorted(set(candidate_nodes))
    failed: dict[str, NodeFailure] = {n: UNREGISTERED for n in names if not ledger.has_node(n)}
    names = [n for n in names if n not in failed]
    demand = _demand(req)
    score_demand = demand if config.request_in_scores else _NO_DEMAND
    lazy = all(v.node_score_neutral for v in used_vendors)
    kept, skipped = [], []
    gate = _TypeGate(ctx)
    prefilter = {v.name: bool(getattr(v, "summary_prefilter", False)) for v in used_vendors}
    for n in names:
        (skipped if _quick_reject(ledger.summary(n), demand, gate, prefilter) else kept).append(n)
    sign = -1.0 if node_policy == "binpack" else 1.0
    scores: dict[str, float] = {}

    def search(group: list[str]) -> tuple[float, NodeFit] | None:
        ranked = sorted(((_score(ledger.summary(n), score_demand, len(ledger.node(n).devices)), n) for n in group),
                        key=lambda t: (sign * t[0], t[1]))
        best: tuple[float, NodeFit] | None = None
        for score, n in ranked:
            res = fit_pod(ledger.view(n), ctx)
            if isinstance(res, NodeFailure):
                failed[n] = res
                continue
            score += sum(ledger_vendor_score(v, n, res, node_policy, ledger) for v in used_vendors)
            scores[n] = score
            if best is None or (sign * score, n) < (sign * best[0], best[1].node):
                best = (score, res)
            if lazy:
                break
        return best

    # skipped nodes are searched only when nothing else fits: that yields their exact reasons,
    # and keeps the result right even if a vendor's prefilter were too strict
    best = search(kept) or search(skipped)
    if best is None:
        return FilterResult(pod=req, node=None, allocation=None, failed=dict(sorted(failed.items())), scores=scores)
    fit = best[1]
    annotations = {NODE_ANNOTATION: fit.node, TIME_ANNOTATION: str(int(now))}
    for v in used_vendors:
        annotations.update(v.pod_annotations(fit.devices[v.name], node=fit.node, now=now, pod=req,
                                             view=ledger.view(fit.node)))
    return FilterResult(
        pod=req, node=fit.node, allocation=make_allocation(pod, fit.node, fit.devices),
        failed=dict(sorted(failed.items())), scores=scores, annotations=annotations,
    )


def ledger_vendor_score(vendor: Any, node: str, fit: NodeFit, policy: str, ledger: Ledger | None = None) -> float:
    if vendor.node_score_neutral:
        return vendor.node_score(node, fit.devices.get(vendor.name, ()), policy)
    view = ledger.view(node) if ledger is not None else None
    return vendor.node_score(node, fit.devices.get(vendor.name, ()), policy, view=view)


def schedule_pod(pod: Mapping[str, Any], candidate_nodes: Iterable[str] | None, ledger: Ledger,
                 config: SchedulerConfig, now: float) -> FilterResult:
    """Filter + reserve: drop this pod's previous reservation, choose, reserve the decision.

    This is what the extender's ``/filter`` and ``hami simulate`` call. On a patch failure the
    adapter rolls back with ``ledger.remove_pod(result.allocation.key)``.
    """
    previous = ledger.remove_pod(pod_key(pod))
    try:
        result = filter_pod(pod, candidate_nodes, ledger, config, now)
    except Exception:
        if previous is not None:
            ledger.add_pod(previous)
        raise
    if result.allocation is not None:
        ledger.reserve(result.allocation)
    return result


__all__: Sequence[str] = ("SchedulerConfig", "FilterResult", "filter_pod", "schedule_pod", "FitContext")
