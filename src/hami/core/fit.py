"""The one generic fit loop: can this pod go on this node, and on which devices? (§5.3-§5.4)

Vendors only supply hooks (``device_filter``, ``resolve_memory``, ``capacity_check``,
``custom_filter``, ``repeats``, ``grant``, ``place``, ``choose``); the walk, NUMA binding, quota,
reason counting and container phases (init / sidecar / regular) are here.

Slices (NVIDIA MIG instances, :class:`~hami.core.types.Slice`): the view carries the slices
already held on each device; ``custom_filter`` decides whether one more fits, ``place`` picks
it when the container's devices are granted. A vendor's ``repeats(device)`` lets one device
serve several of a container's ``nums`` (HAMi revisits MIG-mode GPUs). Slices are held for the
pod's whole life, so an init container's slices stay taken for the containers after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Callable, Mapping, Sequence

from .reasons import NodeFailure, Reason, ReasonCounter
from .score import DevicePolicy, Weights, device_score, device_sort_key
from .types import ContainerDevice, ContainerDeviceRequest, ContainerKind, DeviceInfo, PodRequest, Slice
from .usage import Pick, collapse_picks


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

    def copy(self) -> "NodeView":
        return NodeView(self.name, self.devices, self.used[:], self.usedmem[:], self.usedcores[:], self.cordoned,
                        self.pair_scores, dict(self.slices))

    def take(self, i: int, mem: int, cores: int, slots: int = 1) -> None:
        self.used[i] += slots
        self.usedmem[i] += mem
        self.usedcores[i] += cores

    def hold(self, i: int, piece: Slice) -> None:
        self.slices[i] = self.slices.get(i, ()) + (piece,)


@dataclass(frozen=True, slots=True)
class QuotaRoom:
    """What the pod's namespace may still allocate per vendor: ``(mem, cores)``; None = no limit."""

    room: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict)

    def allows(self, picks: Sequence[Pick], kinds: Sequence[ContainerKind], vendor: str) -> bool:
        mem_room, core_room = self.room.get(vendor, (None, None))
        if mem_room is None and core_room is None:
            return True
        uses = [u for u in collapse_picks(picks, kinds) if u.vendor == vendor]
        if mem_room is not None and sum(u.mem for u in uses) > mem_room:
            return False
        return core_room is None or sum(u.cores for u in uses) <= core_room


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


@dataclass(frozen=True, slots=True)
class NodeFit:
    node: str
    devices: Mapping[str, tuple[tuple[ContainerDevice, ...], ...]]  # vendor -> per container
    picks: tuple[Pick, ...]


def fit_container(view: NodeView, ci: int, req: ContainerDeviceRequest, ctx: FitContext,
                  picks: list[Pick]) -> tuple[ContainerDevice, ...] | NodeFailure:
    """Choose ``req.nums`` devices for container ``ci`` on ``view`` (does not modify ``view``)."""
    vendor = ctx.vendors[req.vendor]
    sel = ctx.selections[req.vendor]
    idxs = [i for i, d in enumerate(view.devices) if d.vendor == req.vendor and vendor.serves(d, req)]
    if req.nums > len(idxs) and not any(vendor.repeats(view.devices[i], sel) for i in idxs):
        # HAMi prints the bare code; the data keeps "wanted req.nums of len(idxs)"
        return NodeFailure(total=len(idxs), counts=((Reason.NODE_INSUFFICIENT_DEVICE, req.nums),),
                           container=ci, vendor=req.vendor, bare=True)
    mems = {i: vendor.resolve_memory(view.devices[i], req) for i in idxs}
    w = ctx.weights
    order = device_sort_key(ctx.policy, sel.numa_bind)

    def score(i: int, d: DeviceInfo) -> float:
        if ctx.request_in_scores or req.type == d.type:
            return device_score(d.count, d.devcore, d.devmem, view.used[i], view.usedcores[i], view.usedmem[i],
                                req.coresreq, mems[i], w)
        return device_score(d.count, d.devcore, d.devmem, view.used[i], view.usedcores[i], view.usedmem[i],
                            0, 0, w, slots=0)

    ranked = sorted(((score(i, view.devices[i]), view.devices[i].numa, view.devices[i].index, view.used[i], i)
                     for i in idxs), key=lambda t: order(t[:4]))
    kinds = [c.kind for c in ctx.pod.containers]
    reasons = ReasonCounter(total=len(idxs))
    chosen: list[tuple[int, int]] = []  # (device position, mem); a position repeats when the vendor allows
    collect = ctx.policy.topology_aware or vendor.chooses  # gather every fitting device, choose after
    prev_numa: int | None = None
    for _score, numa, _index, _used, i in ranked:
        d = view.devices[i]
        if not d.health:
            reasons.add(Reason.CARD_NOT_HEALTH, d.id)
            continue
        if d.id in view.cordoned:
            reasons.add(Reason.CARD_CORDONED, d.id)
            continue
        bad = vendor.device_filter(d, req, sel)
        if bad is not None:
            reasons.add(bad, d.id)
            continue
        if sel.numa_bind and prev_numa is not None and numa != prev_numa:
            for j in dict.fromkeys(j for j, _ in chosen):  # each device once (MIG GPUs may repeat)
                reasons.add(Reason.NUMA_NOT_FIT, view.devices[j].id)
            chosen = []
        prev_numa = numa
        mem = mems[i]
        held = view.slices.get(i, ())
        n = 0  # picks of this container already on device i (only when the vendor repeats devices)
        while True:
            prior = [] if collect else chosen  # collecting: combinations are checked jointly later
            quota_fits = _always if ctx.quota is None else _quota_probe(ctx.quota, picks, prior, view, ci, req, d, mem,
                                                                         kinds)
            bad = vendor.capacity_check(d, view.used[i] + n, view.usedmem[i] + n * mem,
                                        view.usedcores[i] + n * req.coresreq, req, mem, ctx.policy.mutex, quota_fits)
            if bad is None:
                bad = vendor.custom_filter(d, req, mem, held, n)
            if bad is not None:
                reasons.add(bad, d.id)
                break
            chosen.append((i, mem))
            if len(chosen) == req.nums and not collect:
                return _granted(view, vendor, req, chosen)
            if collect or not vendor.repeats(d, sel):
                break
            n += 1
    if vendor.chooses and len(chosen) >= req.nums:
        got = _vendor_choice(view, vendor, req, chosen, picks, ctx, ci, kinds)
        if not isinstance(got, Reason):
            return _granted(view, vendor, req, got)
        for j, _ in chosen:
            reasons.add(got, view.devices[j].id)
        return reasons.failure(ci, req.vendor)
    if ctx.policy.topology_aware and len(chosen) >= req.nums:
        best = _best_topology(view, req, chosen, ctx, picks, ci, kinds, sel.numa_bind)
        if best is not None:
            return _granted(view, vendor, req, best)
        for j, _ in chosen:
            reasons.add(Reason.RESOURCE_QUOTA_NOT_FIT, view.devices[j].id)
        return reasons.failure(ci, req.vendor)
    if chosen:
        for j in dict.fromkeys(j for j, _ in chosen):  # each device once (MIG GPUs may repeat)
            reasons.add(Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST, view.devices[j].id)
    return reasons.failure(ci, req.vendor)


def _granted(view: NodeView, vendor: Any, req: ContainerDeviceRequest,
             chosen: Sequence[tuple[int, int]]) -> tuple[ContainerDevice, ...]:
    """The container's device records, in pick order; ``place`` sees the slices held on the
    device plus those placed for this container's earlier picks (HAMi ``AddResourceUsage``)."""
    out = []
    extra: dict[int, tuple[Slice, ...]] = {}
    for j, m in chosen:
        d = view.devices[j]
        cd = vendor.place(d, vendor.grant(d, req, m), view.slices.get(j, ()) + extra.get(j, ()))
        if cd.slice is not None:
            extra[j] = extra.get(j, ()) + (cd.slice,)
        out.append(cd)
    return tuple(out)


def _vendor_choice(view: NodeView, vendor: Any, req: ContainerDeviceRequest, cands: list[tuple[int, int]],
                   picks: list[Pick], ctx: FitContext, ci: int,
                   kinds: list[ContainerKind]) -> list[tuple[int, int]] | Reason:
    """The vendor's own pick among all fitting devices (``vendor.choose``), then the joint quota check."""
    mem_of = dict(cands)
    prior = [p[2] for p in picks if p[1] == req.vendor]
    got = vendor.choose(view.devices, req, [j for j, _ in cands], prior)
    if isinstance(got, Reason):
        return got
    if len(got) != req.nums or len(set(got)) != req.nums or any(j not in mem_of for j in got):
        raise ValueError(f"vendor {req.vendor}: choose() must return {req.nums} of the candidates, got {list(got)}")
    combo = [(j, mem_of[j]) for j in got]
    if ctx.quota is not None:
        trial = picks + [(ci, req.vendor, view.devices[j].id, m, req.coresreq) for j, m in combo]
        if not ctx.quota.allows(trial, kinds, req.vendor):
            return Reason.RESOURCE_QUOTA_NOT_FIT
    return combo


def _pair(view: NodeView, a: int, b: int) -> int:
    ua, ub = view.devices[a].id, view.devices[b].id
    return view.pair_scores.get(ua, {}).get(ub, 0)


def _best_topology(view: NodeView, req: ContainerDeviceRequest, cands: list[tuple[int, int]], ctx: FitContext,
                   picks: list[Pick], ci: int, kinds: list[ContainerKind],
                   numa_bind: bool) -> list[tuple[int, int]] | None:
    """HAMi's topology-aware choice among all fitting devices (§5.4), ties to the earlier-ranked.

    One device: the candidate least connected to the others (keeps well-connected groups free).
    Several: the combination with the highest sum of pairwise link scores.
    """
    def quota_ok(combo) -> bool:
        if ctx.quota is None:
            return True
        trial = picks + [(ci, req.vendor, view.devices[j].id, m, req.coresreq) for j, m in combo]
        return ctx.quota.allows(trial, kinds, req.vendor)

    if req.nums == 1:
        order = sorted(range(len(cands)), key=lambda k: (
            sum(_pair(view, cands[k][0], o[0]) for o in cands if o[0] != cands[k][0]), k))
        return next(([cands[k]] for k in order if quota_ok([cands[k]])), None)
    best, best_score = None, -1
    for combo in combinations(cands, req.nums):
        if numa_bind and len({view.devices[j].numa for j, _ in combo}) > 1:
            continue
        score = sum(_pair(view, a[0], b[0]) for a, b in combinations(combo, 2))
        if score > best_score and quota_ok(combo):
            best, best_score = list(combo), score
    return best


def _always() -> bool:
    return True


def _quota_probe(quota: QuotaRoom, picks: list[Pick], chosen: list[tuple[int, int]], view: NodeView, ci: int,
                 req: ContainerDeviceRequest, d: DeviceInfo, mem: int, kinds: list[ContainerKind]) -> Callable[[], bool]:
    """Would the pod's collapsed usage, with this device added, still fit the namespace quota?"""
    def probe() -> bool:
        trial = picks + [(ci, req.vendor, view.devices[j].id, m, req.coresreq) for j, m in chosen]
        trial.append((ci, req.vendor, d.id, mem, req.coresreq))
        return quota.allows(trial, kinds, req.vendor)

    return probe


def _apply(view: NodeView, devices: Sequence[ContainerDevice], index_of: Mapping[str, int]) -> None:
    for cd in devices:
        i = index_of[cd.uuid]
        view.take(i, cd.usedmem, cd.usedcores)
        if cd.slice is not None:
            view.hold(i, cd.slice)


def fit_pod(view: NodeView, ctx: FitContext) -> NodeFit | NodeFailure:
    """Fit every container of the pod on one node, phase by phase. ``view`` is not modified.

    Classic init containers are each fitted on a copy holding the sidecars declared before them;
    sidecars and regular containers accumulate on one copy (they run together).
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


def make_context(pod: PodRequest, vendors: Sequence[Any], policy: DevicePolicy, weights: Weights,
                 quota: QuotaRoom | None = None, request_in_scores: bool = True) -> FitContext:
    by_name = {v.name: v for v in vendors}
    used = pod.vendors()
    return FitContext(
        pod=pod, vendors=by_name, selections={n: by_name[n].selection(pod.annotations) for n in used},
        policy=policy, weights=weights, quota=quota, request_in_scores=request_in_scores,
    )

