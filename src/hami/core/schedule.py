"""The scheduler's entry point: pick a node and devices for one pod (§5.3).

    result = filter_pod(pod, candidate_nodes, ledger, config, now, busy)

``pod`` is a Pod dict as the API server returns it (already through admission, see
:func:`hami.core.requests.admit_pod`). The ledger must not hold this pod (``schedule_pod``
removes a previous reservation, reserves the new decision, and is what the extender and the
simulator call). Node search is lazy: nodes are ranked by a node score computed from the
ledger's per-node summaries plus this pod's request, obviously-full nodes are skipped without
visiting devices, and the first node in rank order where the full fit succeeds wins. When no
node fits, every candidate gets its exact reason: read from its summary where that settles it
(:mod:`hami.core.refuse`), the refusal it gave a pod of the same shape when it has not changed
since (:mod:`hami.core.verdicts`), or else fitted (``exact=True`` fits every node, the path
before both).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Iterable, Mapping, Sequence

from .fit import FitContext, NodeFit, fit_pod, make_context
from .ledger import NODE_ANNOTATION, Ledger, NodeSummary, make_allocation, pod_key
from .names import VGPU_TIME
from .reasons import NOT_SELECTED, UNREGISTERED, NodeFailure
from .refuse import SummaryRefusal, refusal
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
from .verdicts import signature

TIME_ANNOTATION = VGPU_TIME


@dataclass(frozen=True)
class SchedulerConfig:
    """Vendors plus cluster-wide default policies (scheduler flags).

    The caller passes the vendor table, the vendors package's ``build_vendors(device_config)``:
    the core imports nothing outside the core.
    """

    vendors: tuple[Any, ...]
    node_policy: str = "binpack"
    gpu_policy: str = "spread"
    #: True: node and device scores count this pod's request; False: HAMi v2.10's scores
    #: (docs/compatibility.md, "Scores count the request")
    request_in_scores: bool = True

    def __post_init__(self) -> None:
        parse_node_policy(self.node_policy, "--node-scheduler-policy")
        parse_gpu_policy(self.gpu_policy, "--gpu-scheduler-policy")


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


def _quick_reject(
    s: NodeSummary, demand: _Demand, gate: _TypeGate, prefilter: Mapping[str, bool], mutex: bool = False
) -> bool:
    """Necessary conditions from the summary; True means the pod certainly does not fit.

    The capacity conditions mirror the generic capacity rules, so they apply only to vendors
    that declare ``summary_prefilter`` (their ``capacity_check`` is at least as strict). Under
    the ``mutex`` device policy (``mutex``) they read the unused devices, the only ones open."""
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
        if mutex and _no_unused_room(v, need, memreq, pct, cores):
            return True
        if cores >= 100 and v.idle < need:
            return True
    return False


def _no_unused_room(v: Any, need: int, memreq: int, pct: int, cores: int) -> bool:
    """:func:`_quick_reject`'s capacity conditions over the unused devices of
    :class:`~hami.core.ledger.VendorSummary` ``v`` (under ``mutex``, the only open ones)."""
    return (
        v.unused < need
        or bool(memreq)
        and v.max_unused_mem < memreq
        or not memreq
        and pct != PERCENT_UNSET
        and pct >= v.max_unused_pct_bound
        or bool(cores)
        and v.max_unused_cores < cores
    )


def _score(s: NodeSummary, demand: _Demand, devices: int) -> float:
    mem = demand.mem + (demand.pct * s.totalmem / (100 * devices) if devices else 0)
    return node_score(
        s.used + demand.slots, s.count, s.usedcores + demand.cores, s.totalcore, s.usedmem + mem, s.totalmem
    )


def pod_policies(pod: PodRequest, config: SchedulerConfig) -> tuple[str, DevicePolicy, Any]:
    """``(node policy, device policy, score weights)`` for ``pod``: its annotations where set,
    else the config's defaults. Raises RequestError on an annotation that cannot be read."""
    a = pod.annotations
    where = f"pod {pod.namespace}/{pod.name} annotation"
    node_policy = (
        parse_node_policy(a[NODE_POLICY_ANNOTATION], f"{where} {NODE_POLICY_ANNOTATION}")
        if a.get(NODE_POLICY_ANNOTATION)
        else config.node_policy
    )
    gpu_policy = (
        parse_gpu_policy(a[GPU_POLICY_ANNOTATION], f"{where} {GPU_POLICY_ANNOTATION}")
        if a.get(GPU_POLICY_ANNOTATION)
        else parse_gpu_policy(config.gpu_policy)
    )
    weights = (
        parse_weights(a[WEIGHTS_ANNOTATION], f"{where} {WEIGHTS_ANNOTATION}")
        if a.get(WEIGHTS_ANNOTATION)
        else DEFAULT_WEIGHTS
    )
    return node_policy, gpu_policy, weights


def filter_pod(
    pod: Mapping[str, Any],
    candidate_nodes: Iterable[str] | None,
    ledger: Ledger,
    config: SchedulerConfig,
    now: float,
    busy: Mapping[str, int] | None = None,
    exact: bool = False,
    outside: AbstractSet[str] = frozenset(),
) -> FilterResult:
    """Choose a node and devices for ``pod``; does not modify the ledger (its verdict memo
    aside). Raises RequestError.

    ``outside``: nodes the scheduler's node selector (``--node-label-selector``) leaves out; a
    candidate among them that the ledger does not hold is refused ``NodeLabelSelectorMismatch``
    (any other candidate the ledger lacks: ``node unregistered``).

    ``busy``: nodes to choose only when no other candidate fits (the scheduler passes the nodes
    whose node lock an unfinished bind holds or is about to take: a pod placed there would wait
    for it); among them, a smaller value (binds in flight) first, then the usual order.
    ``exact``: fit every node the search visits, device by device (the path before refusals were
    read from summaries or remembered; ``hami explain`` and the UI fit every node themselves).
    Otherwise a node's refusal may come from the ledger's memo (the node has not changed since it
    refused a pod of this shape, :mod:`hami.core.verdicts`) or from its summary
    (:mod:`hami.core.refuse`): the same node is chosen, and every refusal renders as the fit's."""
    req = pod_request(pod, config.vendors)
    if not req.has_devices:
        return FilterResult(pod=req, node=None, allocation=None, needs_devices=False)
    node_policy, gpu_policy, weights = pod_policies(req, config)
    used_vendors = [v for v in config.vendors if v.name in req.vendors()]
    ctx = make_context(
        req,
        config.vendors,
        gpu_policy,
        weights,
        ledger.quota_room(req.namespace, used_vendors),
        request_in_scores=config.request_in_scores,
    )
    wanted = None if candidate_nodes is None else set(candidate_nodes)
    failed: dict[str, NodeFailure] = {}
    if wanted is not None:
        failed = {n: NOT_SELECTED if n in outside else UNREGISTERED for n in ledger.unknown(wanted)}
    memo = None if exact else ledger.verdicts
    key = signature(ctx) if memo is not None else None
    entry = memo.entry(key, config) if memo is not None and key is not None else None
    # nodes that refused this pod shape and have not changed since: the same refusal, unfitted
    known = memo.current(entry, ledger, wanted) if memo is not None and entry is not None else {}
    demand = _demand(req)
    search = _Search(
        ledger,
        ctx,
        demand,
        demand if config.request_in_scores else _NO_DEMAND,
        -1.0 if node_policy == "binpack" else 1.0,
        used_vendors,
        node_policy,
        failed,
        busy or {},
        known,
        exact,
    )
    best = None
    # the walk pays off over many candidates; over a few (some named; or, for a pod of a shape
    # that found no node last time, most of them known to refuse) ranking just those is
    # cheaper, and chooses the same node
    open_ = len(ledger.ranking) if wanted is None else len(wanted) - len(failed)
    if entry is not None and entry.pending:
        open_ -= len(known)
    if search.lazy and 4 * open_ >= len(ledger.ranking) and not search.hopeless():
        best = search.walk(wanted)  # visits nodes in rank order, stops at the first that fits
    if best is None:
        # a remembered refusal stands for its node: those nodes are left out of the search
        # (they cannot fit), and get their refusal whatever the outcome (as a fit would give)
        failed.update(known)
        # the other candidates, by name (any order would do: the search ranks them, and the
        # result is sorted; by name, that sort has little left to do)
        if wanted is None:
            rest = ledger.node_set() - failed.keys()
        else:
            rest = wanted.difference(failed) if failed else wanted  # read-only below
        refuse = search.refusal
        remaining = _in_order(rest, ledger)
        if refuse is not None:  # exact refusals read from summaries (hami.core.refuse)
            # by class first (the rules that need no node's own memory), then node by node
            remaining = refuse.by_class(
                *ledger.refusal_tags(refuse.vendor), remaining, search.summarised, search.no_memory(refuse)
            )
            remaining = refuse.split(remaining, ledger.summary, search.summarised)
            failed.update(search.summarised)
        kept: list[str] = []
        skipped: list[str] = []
        for n in remaining:
            (skipped if search.rejects(n) else kept).append(n)
        # skipped nodes are searched only when nothing else fits: that yields their exact
        # reasons, and keeps the result right even if a vendor's prefilter were too strict
        best = (
            search.among([n for n in kept if n not in search.busy])
            or search.among([n for n in kept if n in search.busy], by_busy=True)
            or search.among(skipped)
        )
    if entry is not None and memo is not None:
        memo.record(entry, search.refused, search.summarised, ledger.clock())
        entry.pending = best is None
    if best is None:
        return FilterResult(pod=req, node=None, allocation=None, failed=_by_name(failed, ledger), scores=search.scores)
    fit = best[1]
    annotations = {NODE_ANNOTATION: fit.node, TIME_ANNOTATION: str(int(now))}
    for v in used_vendors:
        annotations.update(
            v.pod_annotations(fit.devices[v.name], node=fit.node, now=now, pod=req, view=ledger.view(fit.node))
        )
    return FilterResult(
        pod=req,
        node=fit.node,
        allocation=make_allocation(pod, fit.node, fit.devices, vendors=used_vendors),
        failed=dict(sorted(failed.items())),
        scores=search.scores,
        annotations=annotations,
    )


def _in_order(nodes: AbstractSet[str], ledger: Ledger) -> Sequence[str]:
    """``nodes`` (ledger nodes) sorted by name: the ledger's sorted names themselves when they are
    all of them, a walk of those when they are many, else a sort."""
    names = ledger.sorted_names()
    if len(nodes) == len(names):
        return names
    if 8 * len(nodes) < len(names):
        return sorted(nodes)
    return [n for n in names if n in nodes]


def _by_name(failed: dict[str, NodeFailure], ledger: Ledger) -> dict[str, NodeFailure]:
    """``failed`` sorted by node name: itself when built in that order (refusing a whole cluster
    by class, :func:`_in_order`); refusing most of a large cluster, the ledger's sorted names are
    walked instead of sorting thousands of names again."""
    keys = list(failed)
    names = ledger.sorted_names()
    if keys == names:
        return failed
    if 8 * len(failed) >= len(names):
        keep = [n for n in names if n in failed]
        if len(keep) == len(failed):  # else some are not ledger nodes (UNREGISTERED, NOT_SELECTED)
            return dict(zip(keep, map(failed.__getitem__, keep)))
    keys.sort()
    return dict(zip(keys, map(failed.__getitem__, keys)))


_UNSET = object()


class _Search:
    """One pod's node search: rank nodes by node score (with the pod's request), fit them in
    that order. With only score-neutral vendors the first node that fits wins (``lazy``);
    otherwise every ranked node is fitted and the best final score wins. Ties: node name."""

    def __init__(
        self,
        ledger: Ledger,
        ctx: FitContext,
        demand: _Demand,
        score_demand: _Demand,
        sign: float,
        used_vendors: list[Any],
        node_policy: str,
        failed: dict[str, NodeFailure],
        busy: Mapping[str, int],
        known: Mapping[str, NodeFailure],
        exact: bool = False,
    ) -> None:
        # demand: what the pod needs (fit, prefilters); score_demand: what node scores count
        # (the same, or nothing with request_in_scores=False: HAMi's scores)
        self.ledger, self.ctx, self.demand, self.sign = ledger, ctx, demand, sign
        self.score_demand = score_demand
        self.used_vendors, self.node_policy, self.failed, self.busy = used_vendors, node_policy, failed, busy
        self.known = known  # remembered refusals (hami.core.verdicts): taken as the fit's answer
        self.refused: dict[str, NodeFailure] = {}  # refusals fitted by this search (to remember)
        self.summarised: dict[str, NodeFailure] = {}  # refusals read from summaries (to remember)
        self._refusal: object = _UNSET
        self.exact = exact
        self.lazy = all(v.node_score_neutral for v in used_vendors)
        self.gate = _TypeGate(ctx)
        self.prefilter = {v.name: bool(getattr(v, "summary_prefilter", False)) for v in used_vendors}
        self.mutex = bool(ctx.policy.mutex)  # only unused devices are open to the pod
        self.scores: dict[str, float] = {}

    @property
    def refusal(self) -> SummaryRefusal | None:
        """Refusals from node summaries (:mod:`hami.core.refuse`), for the pods they cover; built
        when first needed (a pod that fits is rarely asked)."""
        if self._refusal is _UNSET:
            self._refusal = None if self.exact else refusal(self.ctx, self.ledger.uuid_nodes)
        return self._refusal  # type: ignore[return-value]

    def hopeless(self) -> bool:
        """True when no device in the whole cluster can take one of the pod's requests (its
        vendor has no device with a free slot, or none with the memory, absolute or as a
        percentage, or none with the cores, :meth:`Ledger.best_room`; under ``mutex`` none of
        that among unused devices, or no node with as many unused, :meth:`Ledger.best_unused`;
        or no node has a model the pod's type selection accepts, or a GPU it names by UUID; or
        one device's use exceeds the namespace's quota room, which the pod's whole use on the
        vendor cannot be less than): no node fits, so the walk would visit nodes for nothing."""
        if self.exact:
            return False
        ledger, quota = self.ledger, self.ctx.quota
        for vendor, nums, memreq, pct, cores in self.demand.checks:
            if self.prefilter[vendor]:
                if quota is not None:  # one device's use alone is more than the namespace has left
                    mem_room, core_room = quota.room.get(vendor, (None, None))
                    if mem_room is not None and memreq > mem_room or core_room is not None and cores > core_room:
                        return True
                if self.mutex:  # only unused devices are open, each for one of the nums
                    unused = ledger.best_unused(vendor)
                    if unused is None or unused[0] < memreq or unused[1] < cores or unused[3] < nums:
                        return True
                    if not memreq and pct != PERCENT_UNSET and pct >= unused[2]:
                        return True
                best = ledger.best_room(vendor)
                if best is None or best[0] < memreq or best[1] < cores:
                    return True
                if not memreq and pct != PERCENT_UNSET and pct >= ledger.best_pct(vendor):
                    return True
                models = {m for _, _, kinds, *_ in ledger.refusal_classes(vendor) for m, _ in kinds}
                if not self.gate.admits(vendor, frozenset(models)):
                    return True
                named = getattr(self.ctx.selections[vendor], "use_uuids", None)
                if named and not ledger.uuid_nodes(named):
                    return True  # the GPUs it names are on no node
        return False

    def no_memory(self, refuse: SummaryRefusal) -> bool:
        """Whether no device with a free slot in the whole cluster (under ``mutex``, no unused
        device) has the memory ``refuse``'s request asks (absolute, or as a percentage of the
        device's)."""
        if refuse.mutex:
            unused = self.ledger.best_unused(refuse.vendor)
            if unused is None:
                return True
            return refuse.pct >= unused[2] if refuse.pct is not None else unused[0] < refuse.memreq
        if refuse.pct is not None:
            return refuse.pct >= self.ledger.best_pct(refuse.vendor)
        room = self.ledger.best_room(refuse.vendor)
        return room is None or room[0] < refuse.memreq

    def rejects(self, n: str) -> bool:
        return _quick_reject(self.ledger.summary(n), self.demand, self.gate, self.prefilter, self.mutex)

    def score(self, n: str) -> float:
        return _score(self.ledger.summary(n), self.score_demand, len(self.ledger.node(n).devices))

    def _fit(self, n: str, score: float) -> NodeFit | None:
        refusal = self.known.get(n)
        if refusal is not None:
            self.failed[n] = refusal
            return None
        res = fit_pod(self.ledger.view(n), self.ctx)
        if isinstance(res, NodeFailure):
            self.failed[n] = self.refused[n] = res
            return None
        self.scores[n] = score + sum(
            ledger_vendor_score(v, n, res, self.node_policy, self.ledger) for v in self.used_vendors
        )
        return res

    def among(self, group: list[str], by_busy: bool = False) -> tuple[float, NodeFit] | None:
        """The best node of ``group`` (sorted by name), in rank order (busy count first)."""
        sign, busy = self.sign, self.busy
        ranked = sorted(
            ((self.score(n), n) for n in group),
            key=(lambda t: (busy[t[1]], sign * t[0], t[1])) if by_busy else (lambda t: (sign * t[0], t[1])),
        )
        best: tuple[float, NodeFit] | None = None
        for score, n in ranked:
            res = self._fit(n, score)
            if res is None:
                continue
            score = self.scores[n]
            if best is None or (sign * score, n) < (sign * best[0], best[1].node):
                best = (score, res)
            if self.lazy:
                break
        return best

    def walk(self, wanted: set[str] | None) -> tuple[float, NodeFit] | None:
        """Lazy search over the ledger's ranking (:mod:`hami.core.rank`): the same order as
        :meth:`among` over every node, but visiting only the nodes before the first fit."""
        sign, demand, ledger = self.sign, self.demand, self.ledger
        checks = [(vendor, memreq, cores) for vendor, _, memreq, _, cores in demand.checks if self.prefilter[vendor]]
        streams = []
        for shape, rooms, names in ledger.ranking.groups(fullest_first=sign < 0):
            if not all(_room_for(rooms.get(vendor), memreq, cores) for vendor, memreq, cores in checks):
                continue  # no node of the group has a device with a slot, the cores, the memory
            streams.append(_keyed(names, ledger, self.score_demand, shape[3], sign))
        deferred: list[str] = []
        for key, n in heapq.merge(*streams):
            if wanted is not None and n not in wanted or self.rejects(n):
                continue
            if n in self.busy:
                deferred.append(n)
                continue
            res = self._fit(n, sign * key)
            if res is not None:
                return self.scores[n], res
        for n in sorted(deferred, key=self.busy.__getitem__):  # stable: rank order among equals
            res = self._fit(n, self.score(n))
            if res is not None:
                return self.scores[n], res
        return None


def _room_for(room: tuple[int, int] | None, memreq: int, cores: int) -> bool:
    """Whether a group's vendor room (:mod:`hami.core.rank`) may hold one device of a request
    (the conditions :func:`_quick_reject` checks per node, on the group's bounds)."""
    return room is not None and room[0] >= memreq and room[1] >= cores


def _keyed(names: Iterable[str], ledger: Ledger, demand: _Demand, devices: int, sign: float):
    for n in names:
        yield sign * _score(ledger.summary(n), demand, devices), n


def ledger_vendor_score(vendor: Any, node: str, fit: NodeFit, policy: str, ledger: Ledger | None = None) -> float:
    if vendor.node_score_neutral:
        return vendor.node_score(node, fit.devices.get(vendor.name, ()), policy)
    view = ledger.view(node) if ledger is not None else None
    return vendor.node_score(node, fit.devices.get(vendor.name, ()), policy, view=view)


def schedule_pod(
    pod: Mapping[str, Any],
    candidate_nodes: Iterable[str] | None,
    ledger: Ledger,
    config: SchedulerConfig,
    now: float,
    busy: Mapping[str, int] | None = None,
    exact: bool = False,
    outside: AbstractSet[str] = frozenset(),
) -> FilterResult:
    """Filter + reserve: drop this pod's previous reservation, choose, reserve the decision.

    This is what the extender's ``/filter`` and ``hami simulate`` call. On a patch failure the
    adapter rolls back with ``ledger.remove_pod(result.allocation.key)``.
    """
    previous = ledger.remove_pod(pod_key(pod))
    try:
        result = filter_pod(pod, candidate_nodes, ledger, config, now, busy, exact, outside)
    except Exception:
        if previous is not None:
            ledger.add_pod(previous)
        raise
    if result.allocation is not None:
        ledger.reserve(result.allocation)
    return result


__all__: Sequence[str] = ("SchedulerConfig", "FilterResult", "filter_pod", "schedule_pod", "FitContext")
