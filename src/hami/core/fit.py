"""The one generic fit loop: can this pod go on this node, and on which devices? (§5.3-§5.4)

Vendors only supply hooks (``device_filter``, ``resolve_memory``, ``capacity_check``,
``custom_filter``, ``repeats``, ``grant``, ``place``, ``choose``); the walk, NUMA binding, quota,
reason counting and container phases (init / sidecar / regular) are here.

Slices (NVIDIA MIG instances, :class:`~hami.core.types.Slice`): the view carries the slices
already held on each device; ``custom_filter`` decides whether one more fits, ``place`` picks
it when the container's devices are granted. A vendor's ``repeats(device)`` lets one device
serve several of a container's ``nums`` (HAMi revisits MIG-mode GPUs). Slices are held for the
pod's whole life, so an init container's slices stay taken for the containers after it.

A namespace quota is checked with what each pick asks and, when its grant charges more (a MIG
instance is its profile's memory and cores, and the ledger counts the grant), again with what
the grants charge: the walk then passes the device over (``ResourceQuotaNotFit``) and a choice
among the picks (topology-aware, a choosing vendor) refuses the combination.

One container on one node goes through four named phases (kube-scheduler's PreFilter/Filter
split: :func:`make_context` plans each container once per pod; the phases only read the plan):

1. :func:`candidates` - the devices that may be considered at all: the request's vendor serves
   them (HAMi's ``<cards>``); and :func:`static_reason`, why one of them cannot take the request
   whatever its usage (health, cordon, the vendor's type / UUID / mode filter);
2. :func:`rank` - the order they are tried in (GPU policy, score, NUMA, index);
3. :func:`walk` - devices taken in that order while the request is not met, with the reason
   each device is passed over (NUMA binding restarts the walk on a new NUMA node; a collecting
   walk keeps each NUMA node's devices apart instead);
4. :func:`choose` - the devices granted, or the node's failure (each device counted under one
   reason, so the counts add up to the devices considered).

:func:`fit_container` is their composition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import combinations
from typing import Any, Callable, Iterator, Mapping, Sequence

from .reasons import NodeFailure, Reason, ReasonCounter
from .score import DevicePolicy, Weights, device_score, device_sort_key
from .types import ContainerDevice, ContainerDeviceRequest, ContainerKind, DeviceInfo, PodRequest, Slice
from .usage import Pick, pod_peak


@dataclass(slots=True)
class NodeView:
    """A mutable working copy of one node's device usage (index-aligned with ``devices``)."""

    name: str
    devices: tuple[DeviceInfo, ...]
    used: list[int]
    usedmem: list[int]
    usedcores: list[int]
    cordoned: frozenset[str] = frozenset()
    pair_scores: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    slices: dict[int, tuple[Slice, ...]] = field(default_factory=dict)  # device position -> slices held
    #: device position -> the classes of the pods holding it (a vendor's ``holder_class``, e.g.
    #: MetaX sGPU's app class) -> how many of those pods; read-only (the pod being fitted adds none)
    classes: Mapping[int, Mapping[str, int]] = field(default_factory=dict)

    def copy(self) -> "NodeView":
        return NodeView(
            self.name,
            self.devices,
            self.used[:],
            self.usedmem[:],
            self.usedcores[:],
            self.cordoned,
            self.pair_scores,
            dict(self.slices),
            self.classes,
        )

    def take(self, i: int, mem: int, cores: int, slots: int = 1) -> None:
        self.used[i] += slots
        self.usedmem[i] += mem
        self.usedcores[i] += cores

    def hold(self, i: int, piece: Slice) -> None:
        self.slices[i] = self.slices.get(i, ()) + (piece,)


_NO_CLASSES: Mapping[str, int] = {}  # a device no classed pod holds


@dataclass(frozen=True, slots=True)
class QuotaRoom:
    """What the pod's namespace may still allocate per vendor: ``(mem, cores)``; None = no limit.

    ``masks``: the vendors whose grants record cores as a bit mask (AWS Neuron): a pick counts
    the cores its mask names (its set bits), as the ledger counts placed pods.

    ``claim_sizes``: (the DRA front end) device class -> the MiB one device counts when a claim
    asks for it without a memory amount, before allocation (the largest published device)."""

    room: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict)
    masks: frozenset[str] = frozenset()
    claim_sizes: Mapping[str, int] = field(default_factory=dict)

    def allows(self, picks: Sequence[Pick], kinds: Sequence[ContainerKind], vendor: str) -> bool:
        mem_room, core_room = self.room.get(vendor, (None, None))
        if mem_room is None and core_room is None:
            return True
        mem, cores = pod_peak(picks, kinds, vendor, masks=vendor in self.masks)
        if mem_room is not None and mem > mem_room:
            return False
        return core_room is None or cores <= core_room


@dataclass(frozen=True, slots=True)
class FitContext:
    """Per-pod inputs, computed once and shared by every node."""

    pod: PodRequest
    vendors: Mapping[str, Any]  # vendor name -> vendor
    selections: Mapping[str, Any]  # vendor name -> Selection
    policy: DevicePolicy
    weights: Weights
    quota: QuotaRoom | None = None
    #: False: HAMi v2.10's device score (the request counts only where its type equals the device type)
    request_in_scores: bool = True
    #: (container index, vendor) -> the container's plan; filled by :func:`make_context`
    plans: Mapping[tuple[int, str], "ContainerPlan"] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeFit:
    node: str
    devices: Mapping[str, tuple[tuple[ContainerDevice, ...], ...]]  # vendor -> per container
    picks: tuple[Pick, ...]


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    """PreFilter state: what fitting one container's request needs that depends only on the pod.

    Built once per pod by :func:`make_context` (:func:`plan_container`); every node's phases read it."""

    ci: int  # the container's index (annotation order)
    req: ContainerDeviceRequest
    vendor: Any
    sel: Any  # the vendor's Selection, from the pod's annotations
    policy: DevicePolicy
    weights: Weights
    request_in_scores: bool
    quota: QuotaRoom | None
    kinds: tuple[ContainerKind, ...]  # every container's kind (a quota check collapses the pod's picks)
    order: Callable[[tuple[float, int, int, int]], tuple]  # device_sort_key for the policy and NUMA binding
    collect: bool  # gather every fitting device and choose after (topology-aware policy, a choosing vendor)


def plan_container(ctx: FitContext, ci: int, req: ContainerDeviceRequest) -> ContainerPlan:
    """Container ``ci``'s plan for ``req`` (its one request to that vendor)."""
    vendor = ctx.vendors[req.vendor]
    sel = ctx.selections[req.vendor]
    return ContainerPlan(
        ci=ci,
        req=req,
        vendor=vendor,
        sel=sel,
        policy=ctx.policy,
        weights=ctx.weights,
        request_in_scores=ctx.request_in_scores,
        quota=ctx.quota,
        kinds=tuple(c.kind for c in ctx.pod.containers),
        order=device_sort_key(ctx.policy, sel.numa_bind),
        collect=ctx.policy.topology_aware or vendor.chooses,
    )


#: Phase 1's answer for one node: the position in ``view.devices`` of each device serving the
#: request (HAMi's <cards>), in device order -> the MiB the request takes on it.
Candidates = dict[int, int]


@dataclass(slots=True)
class Walk:
    """Phase 3's answer for one node."""

    chosen: list[tuple[int, int]]  # (device position, MiB) taken, in order; a position repeats when the vendor allows
    reasons: ReasonCounter  # the reason for each device passed over
    met: bool = False  # the request was met on the way (first fit: nothing left to choose)
    #: collecting under NUMA binding: what was taken on each NUMA node walked before the last,
    #: in walk order (``chosen`` holds the last one's); the choice is made within one of them
    groups: list[list[tuple[int, int]]] = field(default_factory=list)
    #: positions already counted in ``reasons``: a device that took some of the request and then
    #: refused one more pick (a full MIG GPU) counts once, under the reason it refused it for
    counted: set[int] = field(default_factory=set)
    #: (a namespace quota only) a pick taken would be charged more than the request asks (a MIG
    #: instance: the profile's memory and cores): a choice among the picks checks the quota again
    #: with what the grants charge (:func:`_charged_fits`)
    overcharged: bool = False


def fit_container(
    view: NodeView, ci: int, req: ContainerDeviceRequest, ctx: FitContext, picks: list[Pick]
) -> tuple[ContainerDevice, ...] | NodeFailure:
    """Choose ``req.nums`` devices for container ``ci`` on ``view`` (does not modify ``view``)."""
    plan = ctx.plans.get((ci, req.vendor))
    if plan is None or plan.req is not req:
        plan = plan_container(ctx, ci, req)
    cands = candidates(view, plan)
    if isinstance(cands, NodeFailure):
        return cands
    return choose(view, plan, walk(view, plan, cands, rank(view, plan, cands), picks), picks)


def candidates(view: NodeView, plan: ContainerPlan) -> Candidates | NodeFailure:
    """Phase 1: the node's devices that serve the request and the MiB it takes on each. Devices
    the vendor does not serve are left out (not counted in the reasons). Too few devices for
    ``nums`` (and none the vendor may repeat): the node fails at once. Which of the candidates
    cannot take the request whatever their usage is :func:`static_reason`, asked by the walk
    only of the devices it reaches."""
    vendor, req = plan.vendor, plan.req
    devices = view.devices
    idxs = [i for i, d in enumerate(devices) if d.vendor == req.vendor and vendor.serves(d, req)]
    if req.nums > len(idxs) and not any(vendor.repeats(devices[i], plan.sel) for i in idxs):
        # HAMi prints the bare code; the data keeps "wanted req.nums of len(idxs)"
        return NodeFailure(
            total=len(idxs),
            counts=((Reason.NODE_INSUFFICIENT_DEVICE, req.nums),),
            container=plan.ci,
            vendor=req.vendor,
            bare=True,
            final=True,  # the devices the vendor serves, whatever their usage
        )
    return {i: vendor.resolve_memory(devices[i], req) for i in idxs}


def static_reason(view: NodeView, plan: ContainerPlan, d: DeviceInfo) -> Reason | None:
    """Phase 1, per device: why candidate ``d`` cannot take the request whatever its usage (not
    healthy, cordoned, or the vendor's ``device_filter``: type, UUID and mode selections), or None."""
    if not d.health:
        return Reason.CARD_NOT_HEALTH
    if d.id in view.cordoned:
        return Reason.CARD_CORDONED
    return plan.vendor.device_filter(d, plan.req, plan.sel)


def rank(view: NodeView, plan: ContainerPlan, cands: Candidates) -> list[int]:
    """Phase 2: the candidates' positions in the order they are tried (``device_sort_key`` over the
    device score with the request, the NUMA node, the index and, under ``mutex``, the use)."""
    req, w, order, with_request = plan.req, plan.weights, plan.order, plan.request_in_scores
    devices, used, usedcores, usedmem = view.devices, view.used, view.usedcores, view.usedmem
    keys = {}
    for i, mem in cands.items():
        d = devices[i]
        if with_request or req.type == d.type:
            score = device_score(d.count, d.devcore, d.devmem, used[i], usedcores[i], usedmem[i], req.coresreq, mem, w)
        else:
            score = device_score(d.count, d.devcore, d.devmem, used[i], usedcores[i], usedmem[i], 0, 0, w, slots=0)
        keys[i] = order((score, d.numa, d.index, used[i]))
    return sorted(keys, key=keys.__getitem__)  # stable: equal keys keep the device order


def walk(view: NodeView, plan: ContainerPlan, cands: Candidates, ranked: Sequence[int], picks: list[Pick]) -> Walk:
    """Phase 3: take devices in ``ranked`` order until the request is met (or, when the plan
    collects, every device that fits), with the reason for each device passed over: its
    :func:`static_reason`, or the vendor's ``capacity_check`` / ``custom_filter`` on its usage.
    A device the vendor ``repeats`` is taken again while it fits (collecting: up to ``nums``
    times, as many as one choice can use). Each device counts under one reason: one that took
    some of the request and refused one more pick counts under that refusal. Under NUMA
    binding, a device on another NUMA node than the one before drops what was taken so far
    (each dropped device counts ``NumaNotFit``) and the walk goes on from there; a collecting
    walk sets it aside instead (:attr:`Walk.groups`) for :func:`choose`, which chooses within
    any NUMA node with enough devices."""
    req, vendor, sel, collect, quota, mutex = (
        plan.req,
        plan.vendor,
        plan.sel,
        plan.collect,
        plan.quota,
        plan.policy.mutex,
    )
    devices = view.devices
    reasons = ReasonCounter(total=len(cands))
    chosen: list[tuple[int, int]] = []  # (device position, mem); a position repeats when the vendor allows
    groups: list[list[tuple[int, int]]] = []  # collecting under NUMA binding: the earlier NUMA nodes' picks
    counted: set[int] = set()  # devices taken and then refused one more pick (already counted)
    # a quota: what the grants of ``chosen`` charge (first fit: the quota is checked again with
    # them when one is charged more than the request asks) and whether any is
    charged: list[Pick] = []
    over = overcharged = False
    prev_numa: int | None = None
    for i in ranked:
        d = devices[i]
        bad = static_reason(view, plan, d)
        if bad is None:
            bad = plan.vendor.usage_filter(d, plan.req, plan.sel, view.used[i], view.classes.get(i, _NO_CLASSES))
        if bad is not None:
            reasons.add(bad, d.id)
            continue
        if sel.numa_bind and prev_numa is not None and d.numa != prev_numa:
            if collect:
                if chosen:
                    groups.append(chosen)
            else:
                _count(reasons, view, (chosen,), Reason.NUMA_NOT_FIT, counted)
            chosen = []
            charged = []
            over = False
        prev_numa = d.numa
        mem = cands[i]
        held = view.slices.get(i, ())
        n = 0  # picks of this container already on device i (only when the vendor repeats devices)
        placed, placed_cores = held, 0  # with this container's earlier picks of device i (as _granted)
        while True:
            prior = [] if collect else chosen  # collecting: combinations are checked jointly later
            quota_fits = (
                _always
                if quota is None
                else _quota_probe(quota, picks, prior, view, plan.ci, req, i, mem, plan.kinds, vendor, n)
            )
            bad = vendor.capacity_check(
                d,
                view.used[i] + n,
                view.usedmem[i] + n * mem,
                view.usedcores[i] + n * req.coresreq,
                req,
                mem,
                mutex,
                quota_fits,
            )
            if bad is None:
                bad = vendor.custom_filter(d, req, mem, held, n)
            cd = None
            if bad is None and quota is not None:
                # the quota probe counted the request; the grant may charge more (a MIG
                # instance is the profile's memory and cores), and the ledger counts the grant
                cd = vendor.place(d, vendor.grant_on(d, req, mem, view.usedcores[i] + placed_cores), placed)
                pick = (plan.ci, req.vendor, d.id, cd.usedmem, cd.usedcores)
                more = _charges_more(quota, req.vendor, cd, mem, _quota_cores(vendor, view, i, req, n))
                if (more or over and not collect) and not quota.allows(
                    [*picks, *([] if collect else charged), pick], plan.kinds, req.vendor
                ):
                    bad = Reason.RESOURCE_QUOTA_NOT_FIT
                else:
                    over = over or more
                    overcharged = overcharged or more
                    if not collect:
                        charged.append(pick)
            if bad is not None:
                if n:
                    counted.add(i)
                reasons.add(bad, d.id)
                break
            if cd is not None:
                if cd.slice is not None:
                    placed = placed + (cd.slice,)
                placed_cores += cd.usedcores
            chosen.append((i, mem))
            if len(chosen) == req.nums and not collect:
                return Walk(chosen, reasons, True, groups, counted, overcharged)
            if not vendor.repeats(d, sel) or collect and n + 1 >= req.nums:
                break
            n += 1
    return Walk(chosen, reasons, False, groups, counted, overcharged)


def choose(
    view: NodeView, plan: ContainerPlan, done: Walk, picks: list[Pick]
) -> tuple[ContainerDevice, ...] | NodeFailure:
    """Phase 4: the devices granted, or the node's failure. A first-fit walk that met the request
    is granted as is; a collecting walk is chosen from by the vendor (``choose``) or by the
    topology-aware policy, within the NUMA nodes that gave ``nums`` devices or more under NUMA
    binding (the others' devices count ``NumaNotFit``); a walk that fell short counts
    ``NumaNotFit`` for the devices of the NUMA nodes it left and
    ``AllocatedCardsInsufficientRequest`` for those of the last one. A device already counted
    (:attr:`Walk.counted`) is not counted again."""
    req, vendor, reasons, counted = plan.req, plan.vendor, done.reasons, done.counted
    if done.met:
        return _granted(view, vendor, req, done.chosen)
    groups = [*done.groups, done.chosen]
    if vendor.chooses or plan.policy.topology_aware:
        enough = [g for g in groups if len(g) >= req.nums]
        if enough:
            got = _choice(view, plan, enough, picks, done.overcharged)
            if not isinstance(got, Reason):
                return _granted(view, vendor, req, got)
            _count(reasons, view, [g for g in groups if len(g) < req.nums], Reason.NUMA_NOT_FIT, counted)
            _count(reasons, view, enough, got, counted)
            return reasons.failure(plan.ci, req.vendor)
    _count(reasons, view, groups[:-1], Reason.NUMA_NOT_FIT, counted)
    _count(reasons, view, groups[-1:], Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST, counted)
    return reasons.failure(plan.ci, req.vendor)


def _count(
    reasons: ReasonCounter,
    view: NodeView,
    groups: Sequence[Sequence[tuple[int, int]]],
    why: Reason,
    counted: set[int],
) -> None:
    """Count ``why`` once for each device taken in ``groups`` (a MIG GPU may have been taken
    several times) that is not counted yet."""
    for j in dict.fromkeys(j for g in groups for j, _ in g):
        if j not in counted:
            reasons.add(why, view.devices[j].id)


def _choice(
    view: NodeView,
    plan: ContainerPlan,
    enough: Sequence[list[tuple[int, int]]],
    picks: list[Pick],
    overcharged: bool = False,
) -> list[tuple[int, int]] | Reason:
    """A collecting walk's choice among ``enough``, the groups (NUMA nodes, under NUMA binding;
    else the one) with ``nums`` fitting devices or more: the vendor's (``choose``), in the first
    group where it finds one; else the topology-aware policy's in each group, the best of those
    (each group searched on its own: pooled, a 20-GPU node of two NUMA nodes went past the
    exhaustive search's limit, and one GPU was weighed against the other NUMA node's).
    ``overcharged``: some pick would be charged more than the request asks (:attr:`Walk.overcharged`):
    the quota is checked again with what the chosen grants charge."""
    if plan.vendor.chooses:
        got: list[tuple[int, int]] | Reason = Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST
        for group in enough:
            got = _vendor_choice(view, plan, group, picks, overcharged)
            if not isinstance(got, Reason):
                break
        return got
    best: list[tuple[int, int]] | None = None
    best_score = 0
    for group in enough:
        found = _best_topology(view, plan, group, picks, overcharged)
        if found is None:
            continue
        if len(enough) == 1:
            return found
        score = _topology_score(view, found, group)
        if best is None or score > best_score:
            best, best_score = found, score
    return Reason.RESOURCE_QUOTA_NOT_FIT if best is None else best


def _topology_score(view: NodeView, combo: Sequence[tuple[int, int]], group: Sequence[tuple[int, int]]) -> int:
    """How good a topology-aware choice is, to compare the choices of several groups: the links
    among several devices (more is better), or for one device minus its links to the rest of its
    group (less connected is better, as :func:`_best_topology` chooses it)."""
    if len(combo) == 1:
        j = combo[0][0]
        return -sum(_pair(view, j, o) for o in dict.fromkeys(k for k, _ in group) if o != j)
    return sum(_pair(view, a[0], b[0]) for a, b in combinations(combo, 2))


def _granted(
    view: NodeView, vendor: Any, req: ContainerDeviceRequest, chosen: Sequence[tuple[int, int]]
) -> tuple[ContainerDevice, ...]:
    """The container's device records, in pick order; ``place`` sees the slices held on the
    device plus those placed for this container's earlier picks (HAMi ``AddResourceUsage``)."""
    out = []
    extra: dict[int, tuple[Slice, ...]] = {}
    cores: dict[int, int] = {}  # cores of this container's earlier picks, per device position
    for j, m in chosen:
        d = view.devices[j]
        granted = vendor.grant_on(d, req, m, view.usedcores[j] + cores.get(j, 0))
        cd = vendor.place(d, granted, view.slices.get(j, ()) + extra.get(j, ()))
        if cd.slice is not None:
            extra[j] = extra.get(j, ()) + (cd.slice,)
        cores[j] = cores.get(j, 0) + cd.usedcores
        out.append(cd)
    return tuple(out)


def _vendor_choice(
    view: NodeView, plan: ContainerPlan, cands: list[tuple[int, int]], picks: list[Pick], overcharged: bool = False
) -> list[tuple[int, int]] | Reason:
    """The vendor's own pick among all fitting devices (``vendor.choose``), then the joint quota
    check (``overcharged``: again with what the grants charge, :func:`_charged_fits`)."""
    req = plan.req
    mem_of = dict(cands)
    prior = [p[2] for p in picks if p[1] == req.vendor]
    got = plan.vendor.choose(view.devices, req, list(mem_of), prior)  # each device once
    if isinstance(got, Reason):
        return got
    if len(got) != req.nums or len(set(got)) != req.nums or any(j not in mem_of for j in got):
        raise ValueError(f"vendor {req.vendor}: choose() must return {req.nums} of the candidates, got {list(got)}")
    combo = [(j, mem_of[j]) for j in got]
    if plan.quota is not None:
        trial = picks + [
            (plan.ci, req.vendor, view.devices[j].id, m, _quota_cores(plan.vendor, view, j, req)) for j, m in combo
        ]
        if not plan.quota.allows(trial, plan.kinds, req.vendor):
            return Reason.RESOURCE_QUOTA_NOT_FIT
        if overcharged and not _charged_fits(view, plan, combo, picks):
            return Reason.RESOURCE_QUOTA_NOT_FIT
    return combo


def _pair(view: NodeView, a: int, b: int) -> int:
    ua, ub = view.devices[a].id, view.devices[b].id
    return view.pair_scores.get(ua, {}).get(ub, 0)


def _best_topology(
    view: NodeView, plan: ContainerPlan, cands: list[tuple[int, int]], picks: list[Pick], overcharged: bool = False
) -> list[tuple[int, int]] | None:
    """HAMi's topology-aware choice among all fitting devices (§5.4), ties to the earlier-ranked.

    One device: the candidate least connected to the others (keeps well-connected groups free).
    Several: the combination with the highest sum of pairwise link scores.
    A combination must keep the namespace within its quota, counted with the request and
    (``overcharged``) with what the grants charge.
    """
    req, quota = plan.req, plan.quota

    def quota_ok(combo) -> bool:
        if quota is None:
            return True
        trial = picks + [
            (plan.ci, req.vendor, view.devices[j].id, m, _quota_cores(plan.vendor, view, j, req)) for j, m in combo
        ]
        if not quota.allows(trial, plan.kinds, req.vendor):
            return False
        return not overcharged or _charged_fits(view, plan, combo, picks)

    if req.nums == 1:
        order = sorted(
            range(len(cands)),
            key=lambda k: (sum(_pair(view, cands[k][0], o[0]) for o in cands if o[0] != cands[k][0]), k),
        )
        return next(([cands[k]] for k in order if quota_ok([cands[k]])), None)
    if _choices(cands, req.nums) > TOPOLOGY_EXHAUSTIVE:
        return _topology_greedy(plan, view, cands, quota_ok)
    # the link scores among the candidates, read once (a node without link scores: all 0, the
    # first combination that may be taken wins)
    where = list(dict.fromkeys(j for j, _ in cands))
    links = {(a, b): _pair(view, a, b) for a in where for b in where if a != b} if view.pair_scores else {}
    numa = {j: view.devices[j].numa for j in where} if plan.sel.numa_bind else None
    best, best_score = None, -1
    for combo in _combinations(cands, req.nums):
        if numa is not None and len({numa[j] for j, _ in combo}) > 1:
            continue
        score = sum(links.get((a[0], b[0]), 0) for a, b in combinations(combo, 2)) if links else 0
        if score > best_score and quota_ok(combo):
            best, best_score = list(combo), score
            if not links:
                break
    return best


#: combinations the topology-aware choice weighs one by one (C(16, 8) = 12,870: every 8 of a
#: 16-GPU node); past it, a greedy choice (a node writes its own device list, and C(40, 10) is
#: 850 million: the Filter would hold the scheduler's loop for minutes)
TOPOLOGY_EXHAUSTIVE = 20_000


def _choices(cands: Sequence[tuple[int, int]], nums: int) -> int:
    """How many choices :func:`_combinations` yields at most."""
    distinct = len(set(j for j, _ in cands))
    if distinct == len(cands):
        return math.comb(len(cands), nums)
    return min(math.comb(len(cands), nums), math.comb(distinct + nums - 1, nums))


def _combinations(cands: Sequence[tuple[int, int]], nums: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Every choice of ``nums`` of ``cands``, in the order of ``itertools.combinations``; a device
    that appears several times (a MIG GPU offered once per pick it can take) is taken at most
    that many times, and each choice is yielded once (6 MIG GPUs offered 4 times each make
    C(24, 4) = 10,626 combinations but 126 choices)."""
    positions = list(dict.fromkeys(j for j, _ in cands))
    if len(positions) == len(cands):
        yield from combinations(cands, nums)
        return
    mem = dict(cands)
    room = [sum(1 for j, _ in cands if j == p) for p in positions]

    def pick(k: int, left: int, acc: tuple[tuple[int, int], ...]) -> Iterator[tuple[tuple[int, int], ...]]:
        if left == 0:
            yield acc
            return
        if k == len(positions) or sum(room[k:]) < left:
            return
        j = positions[k]
        for take in range(min(room[k], left), -1, -1):  # the earlier-ranked device as often as it can first
            yield from pick(k + 1, left - take, acc + ((j, mem[j]),) * take)

    yield from pick(0, nums, ())


def _topology_greedy(
    plan: ContainerPlan, view: NodeView, cands: list[tuple[int, int]], quota_ok: Callable[[Any], bool]
) -> list[tuple[int, int]] | None:
    """The best-connected pair, then one device at a time, the one best connected to those
    chosen (ties to the earlier-ranked); with ``numa_bind`` within the pair's NUMA node."""
    n, nums = len(cands), plan.req.nums
    best, score = None, -1
    for a in range(n):
        for b in range(a + 1, n):
            if plan.sel.numa_bind and view.devices[cands[a][0]].numa != view.devices[cands[b][0]].numa:
                continue
            s = _pair(view, cands[a][0], cands[b][0])
            if s > score:
                best, score = [a, b], s
    if best is None:
        return None
    numa = view.devices[cands[best[0]][0]].numa
    while len(best) < nums:
        pick, pick_score = None, -1
        for k in range(n):
            if k in best or (plan.sel.numa_bind and view.devices[cands[k][0]].numa != numa):
                continue
            s = sum(_pair(view, cands[k][0], cands[c][0]) for c in best)
            if s > pick_score:
                pick, pick_score = k, s
        if pick is None:
            return None
        best.append(pick)
    combo = [cands[k] for k in best]
    return combo if quota_ok(combo) else None


def _always() -> bool:
    return True


def _charges_more(quota: QuotaRoom, vendor: str, cd: ContainerDevice, mem: int, cores: int) -> bool:
    """Whether grant ``cd`` charges the namespace more than the quota check of its pick counted
    (``mem`` MiB, ``cores`` as :func:`_quota_cores` gives them): a MIG instance charges its
    profile's memory and cores, which may be more than the request asks."""
    if cd.usedmem > mem:
        return True
    if vendor in quota.masks:
        return cd.usedcores.bit_count() > cores.bit_count()
    return cd.usedcores > cores


def _charged_fits(view: NodeView, plan: ContainerPlan, combo: Sequence[tuple[int, int]], picks: list[Pick]) -> bool:
    """Whether the namespace quota still holds the pod with ``combo`` granted, each pick counted
    as its grant charges it (:func:`_granted`: the memory and cores the ledger counts once the
    pod is placed)."""
    assert plan.quota is not None
    got = _granted(view, plan.vendor, plan.req, combo)
    trial = picks + [(plan.ci, plan.req.vendor, cd.uuid, cd.usedmem, cd.usedcores) for cd in got]
    return plan.quota.allows(trial, plan.kinds, plan.req.vendor)


def _quota_cores(vendor: Any, view: NodeView, j: int, req: ContainerDeviceRequest, repeat: int = 0) -> int:
    """The cores one more pick of ``req`` on device ``j`` counts in a quota check (the vendor's
    ``quota_cores``, given what the device holds: the ledger's figure and this container's
    ``repeat`` earlier picks of it)."""
    return vendor.quota_cores(view.devices[j], req, view.usedcores[j] + repeat * req.coresreq)


def _quota_probe(
    quota: QuotaRoom,
    picks: list[Pick],
    chosen: list[tuple[int, int]],
    view: NodeView,
    ci: int,
    req: ContainerDeviceRequest,
    i: int,
    mem: int,
    kinds: Sequence[ContainerKind],
    vendor: Any,
    repeat: int,
) -> Callable[[], bool]:
    """Would the pod's collapsed usage, with device ``i`` added, still fit the namespace quota?"""

    def probe() -> bool:
        taken: dict[int, int] = {}  # this container's earlier picks per device (a vendor that repeats)
        trial = list(picks)
        for j, m in chosen:
            trial.append((ci, req.vendor, view.devices[j].id, m, _quota_cores(vendor, view, j, req, taken.get(j, 0))))
            taken[j] = taken.get(j, 0) + 1
        trial.append((ci, req.vendor, view.devices[i].id, mem, _quota_cores(vendor, view, i, req, repeat)))
        return quota.allows(trial, kinds, req.vendor)

    return probe


def _apply(view: NodeView, devices: Sequence[ContainerDevice], index_of: Mapping[str, int]) -> None:
    for cd in devices:
        i = index_of[cd.uuid]
        view.take(i, cd.usedmem, cd.usedcores)
        if cd.slice is not None:
            view.hold(i, cd.slice)


def fit_pod(view: NodeView, ctx: FitContext, seen: list[NodeView] | None = None) -> NodeFit | NodeFailure:
    """Fit every container of the pod on one node, phase by phase. ``view`` is not modified.

    Classic init containers are each fitted on a copy holding the sidecars declared before them;
    sidecars and regular containers accumulate on one copy (they run together).
    ``seen``: on a failure, the node as the failing container saw it (the pod's earlier
    containers' picks applied) is appended to it (``hami explain`` shows that usage).
    """
    containers = ctx.pod.containers
    vendors = ctx.pod.vendors()
    index_of = {d.id: i for i, d in enumerate(view.devices)}
    running = view.copy()
    out: dict[str, list[tuple[ContainerDevice, ...]]] = {v: [] for v in vendors}
    picks: list[Pick] = []
    for ci, c in enumerate(containers):
        target = running.copy() if c.kind is ContainerKind.INIT else running
        got: dict[str, tuple[ContainerDevice, ...]] = {}
        for req in c.requests:
            res = fit_container(target, ci, req, ctx, picks)
            if isinstance(res, NodeFailure):
                if seen is not None:
                    seen.append(target)
                return res
            got[req.vendor] = res
            _apply(target, res, index_of)
            if target is not running:  # an init container's slices stay held for the whole pod
                for cd in res:
                    if cd.slice is not None:
                        running.hold(index_of[cd.uuid], cd.slice)
            picks.extend((ci, req.vendor, d.uuid, d.usedmem, d.usedcores) for d in res)
        for v in vendors:
            out[v].append(got.get(v, ()))
    return NodeFit(node=view.name, devices={v: tuple(cs) for v, cs in out.items()}, picks=tuple(picks))


def make_context(
    pod: PodRequest,
    vendors: Sequence[Any],
    policy: DevicePolicy,
    weights: Weights,
    quota: QuotaRoom | None = None,
    request_in_scores: bool = True,
) -> FitContext:
    """The pod's PreFilter state: vendors, selections, and one :class:`ContainerPlan` per container request."""
    by_name = {v.name: v for v in vendors}
    used = pod.vendors()
    ctx = FitContext(
        pod=pod,
        vendors=by_name,
        selections={n: by_name[n].selection(pod.annotations) for n in used},
        policy=policy,
        weights=weights,
        quota=quota,
        request_in_scores=request_in_scores,
    )
    return replace(
        ctx,
        plans={(ci, r.vendor): plan_container(ctx, ci, r) for ci, c in enumerate(pod.containers) for r in c.requests},
    )
