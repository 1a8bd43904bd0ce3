"""Exact refusals from a node's summary: a node's :class:`NodeFailure` without visiting its devices.

When a pod fits nowhere, every node must say why, in HAMi's words (``"2/8 CardInsufficientMemory,
6/8 CardTimeSlicingExhausted"``): kube-scheduler turns those into the pod's events. Fitting each
node device by device (:func:`hami.core.fit.fit_pod`) costs about 0.1 ms a node, 0.5 s at 5000
nodes, for every Filter of a pending pod. For the pod's first device request (the first one the
fit tries, on the node as it is: its refusal is the node's), asking one vendor for ``nums``
devices of an absolute ``memreq`` MiB or a percentage ``pct`` of each device's memory (and
``coresreq`` cores), the walk's outcome on many nodes follows from the node's
:class:`~hami.core.ledger.VendorSummary` alone:

* the node has no device of the vendor: ``NodeInsufficientDevice`` (HAMi prints the bare code);
* every device of the vendor is schedulable (healthy, not cordoned) and served, no device may
  serve two of the ``nums`` (no MIG), and the vendor's static filter (the type and mode
  selection; UUIDs the pod names, none of them on this node) answers alike for all of them (a
  node of one GPU model, or of models all refused), so the candidates are all ``all`` devices;
  then

  - ``nums > all``: ``NodeInsufficientDevice``;
  - the static filter refuses them (``use-gputype`` names another model, or ``use-gpuuuid``
    GPUs of other nodes): ``all/all`` of its reason (``CardTypeMismatch``, ``CardUuidMismatch``);
  - one device's use alone (the request's memory and cores) exceeds the room left in the
    namespace's quota: each device with a free slot fails on quota, each without on slots (the
    capacity rules check slots, then quota, then memory): ``k/all ResourceQuotaNotFit,
    (all-k)/all CardTimeSlicingExhausted``;
  - no device with a free slot has the memory (``max_free_mem < memreq``; for a percentage,
    ``pct >= max_pct_bound``, exactly ``free < devmem * pct // 100`` on each): the same with
    ``CardInsufficientMemory``;
  - every device with a slot has the memory (``min_free_mem >= memreq``, absolute memory only)
    but none the cores (``max_free_cores < coresreq``): the same with ``CardInsufficientCore``;
  - every device with a slot passes every capacity rule (the memory, the cores, some cores
    left when the pod asks none; a pod asking 100 cores, whose rule also reads each device's
    use, is left to the fit) but there are fewer than ``nums`` of them: the walk took each and
    fell short, ``k/all AllocatedCardsInsufficientRequest`` beside the slot refusals (not under
    NUMA binding, whose walk drops devices on the way, nor under a quota, which may stop the
    walk part way).

The memory and cores rules hold under a quota whose room takes one device's use: a walk that
takes no device probes the quota with that one device alone.

Under the ``mutex`` device policy (only GPUs nobody uses) the capacity rules refuse a device in
use right after the slots (``ExclusiveDeviceAllocateConflict``), before the quota, memory and
cores: the open devices are the unused ones, and the summary keeps the same fields over them
(``unused``, ``max_unused_mem`` and so on). The rules above then read those, each device with a
free slot but in use counting ``ExclusiveDeviceAllocateConflict``: ``k/all <reason>,
s/all ExclusiveDeviceAllocateConflict, (all-k-s)/all CardTimeSlicingExhausted``. A node with no
unused device (every GPU has a sharer) refuses on those two alone, whatever the request; a pod
asking 100 cores is not left out of the "too few" rule (no unused device has a use to
conflict with).

Where these do not settle it (a node with an unhealthy GPU, with models the selection splits,
or with a GPU the pod names by UUID; a pod asking a percentage under a memory quota; a vendor
without ``summary_prefilter``; a request after the first, whose node already holds the earlier
containers' picks), the caller fits the node as before. The rules hold for the vendors that
declare ``summary_prefilter`` (the generic capacity rules, :func:`hami.vendors.base.slot_check`
first): the same promise the node search's prefilter already relies on, checked against the
full fit by ``tests/unit/test_core_refuse.py``.

A node's answer from the rules that do not read its memory (the static filter, the quota), and
from the memory rule when no GPU with a free slot in the whole cluster has the memory asked (the
ledger's :meth:`~hami.core.ledger.Ledger.best_room` and :meth:`~hami.core.ledger.Ledger.best_pct`),
depends only on its refusal class (devices, all schedulable, models and modes, devices with a
slot, unused devices), which the ledger keeps for each node: each class is judged once, and the
nodes take their class's refusal in one pass without a Python step per node
(:meth:`SummaryRefusal.by_class`). Under ``mutex`` the memory rule reads the cluster's best
unused GPU (:meth:`~hami.core.ledger.Ledger.best_unused`), and a class with no unused GPU is
settled whatever the request.

The failure carries the counts (its rendering and codes are the fit's) but not the per-GPU
UUIDs: ``hami explain`` and the UI fit every node themselves for those.

Worked example: ``nums=1, memreq=8000``; a node of 8 GPUs, 3 with every slot taken and the
largest free memory among the other 5 at 6000 MiB: ``5/8 CardInsufficientMemory,
3/8 CardTimeSlicingExhausted``, the string the walk gives, read from four summary fields.
"""

from __future__ import annotations

from dataclasses import replace
from typing import AbstractSet, Any, Callable, Hashable, Iterable, Mapping, NamedTuple, Sequence

from .fit import FitContext
from .ledger import NodeSummary, RefusalClass
from .reasons import NodeFailure, Reason
from .types import DeviceInfo

_MEM, _CORE, _SLOTS, _FEW, _TAKEN, _QUOTA, _SHARED = (
    Reason.CARD_INSUFFICIENT_MEMORY,
    Reason.CARD_INSUFFICIENT_CORE,
    Reason.CARD_TIME_SLICING_EXHAUSTED,
    Reason.NODE_INSUFFICIENT_DEVICE,
    Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    Reason.RESOURCE_QUOTA_NOT_FIT,
    Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
)

#: :meth:`SummaryRefusal.static`'s answer when every device passes the static filter
PASS = True
#: ... when the static filter's answers do not settle the node (fit it)
UNSETTLED = None


class SummaryRefusal:
    """One pod's refusals from node summaries (:func:`refusal` builds it; None: not such a pod)."""

    __slots__ = (
        "vendor",
        "ci",
        "nums",
        "memreq",
        "pct",
        "cores",
        "short",
        "over_quota",
        "holders",
        "mutex",
        "_plan",
        "_kinds",
        "_made",
    )

    def __init__(
        self, ctx: FitContext, ci: int, req: Any, over_quota: bool, quota: bool, holders: AbstractSet[str] = frozenset()
    ) -> None:
        # nodes with a device the pod's selection names by UUID: left to the fit
        self.holders = holders
        self.vendor, self.ci, self.nums, self.memreq, self.cores = req.vendor, ci, req.nums, req.memreq, req.coresreq
        # a percentage of each device's memory (absolute memory asked: None)
        self.pct: int | None = None if req.memreq > 0 else req.mem_percentage
        self._plan = ctx.plans[(ci, req.vendor)]
        self.over_quota = over_quota  # one device's use alone exceeds the namespace's room
        # the mutex device policy: only unused devices are open (see the module docstring)
        self.mutex = bool(ctx.policy.mutex)
        # the "too few open devices" rule applies (see the module docstring); a 100-core
        # request's exclusive rule reads each device's use, none on an unused device
        self.short = (
            req.nums > 1
            and (req.coresreq < 100 or self.mutex)
            and self.pct is None
            and not quota
            and not getattr(self._plan.sel, "numa_bind", True)
        )
        self._kinds: dict[frozenset[tuple[str, str]], Reason | bool | None] = {}  # (model, mode) sets -> static
        self._made: dict[tuple[int, int, Reason, int], NodeFailure] = {}  # shared failures

    def static(self, kinds: frozenset[tuple[str, str]]) -> Reason | bool | None:
        """What the static filter makes of a node whose schedulable devices are of these (model,
        mode) pairs: :data:`PASS` (each is served, passes and serves at most one of the
        ``nums``), the one :class:`Reason` it refuses each of them for, or :data:`UNSETTLED`
        (a device not served or served twice, or answers that differ). The answers depend on the
        model and mode only, the pod's selection naming no UUIDs: see :func:`refusal`."""
        got = self._kinds.get(kinds, False)
        if got is False:
            plan = self._plan
            vendor, req, sel = plan.vendor, plan.req, plan.sel
            answers: set[Reason | bool | None] = set()
            for model, mode in kinds:
                d = DeviceInfo(id="", type=model, mode=mode, health=True, vendor=self.vendor)
                if not vendor.serves(d, req) or vendor.repeats(d, sel):
                    answers.add(UNSETTLED)
                    break
                bad = vendor.device_filter(d, req, sel)
                answers.add(PASS if bad is None else bad)
            got = answers.pop() if len(answers) == 1 else UNSETTLED
            self._kinds[kinds] = got
        return got

    def _failure(self, total: int, short: int, why: Reason, shared: int = 0) -> NodeFailure:
        """``short`` devices fail for ``why``, ``shared`` (in use, under ``mutex``) for
        ``ExclusiveDeviceAllocateConflict``, the other ``total - short - shared`` on slots."""
        key = (total, short, why, shared)
        f = self._made.get(key)
        if f is None:
            each = ((why, short), (_SHARED, shared), (_SLOTS, total - short - shared))
            counts = tuple(sorted(((r, k) for r, k in each if k), key=_code))
            f = self._made[key] = NodeFailure(total=total, counts=counts, container=self.ci, vendor=self.vendor)
        return f

    def __call__(self, s: NodeSummary, name: str = "") -> NodeFailure | None:
        """Node ``name``'s exact failure, or None when its summary ``s`` does not settle it (fit
        the node)."""
        out: dict[str, NodeFailure] = {}
        self.split((name,), lambda _: s, out)
        return out.get(name)

    def split(
        self, names: Iterable[str], summary: Callable[[str], NodeSummary], refused: dict[str, NodeFailure]
    ) -> list[str]:
        """Put the nodes of ``names`` that the summary rules refuse in ``refused`` (node -> failure);
        return the others, in order. The rules of the module docstring, in that order (one loop,
        everything it reads held in locals: it runs for every node of a cluster)."""
        if self.mutex:
            return self._split_unused(names, summary, refused)
        rest = []
        vendor, nums, memreq, pct, cores, short = self.vendor, self.nums, self.memreq, self.pct, self.cores, self.short
        over_quota, holders = self.over_quota, self.holders
        static_of, judge, failure = self._kinds.get, self.static, self._failure
        for n in names:
            if holders and n in holders:
                rest.append(n)
                continue
            v = summary(n).vendors.get(vendor)
            if v is None:
                refused[n] = self._few(0)
                continue
            total = v.all
            ok = static_of(v.kinds, False)
            if ok is False:
                ok = judge(v.kinds)
            if v.devices != total or ok is UNSETTLED:
                rest.append(n)
            elif nums > total:
                refused[n] = self._few(total)
            elif ok is not PASS:
                refused[n] = failure(total, total, ok)  # type: ignore[arg-type]
            elif over_quota:
                refused[n] = failure(total, v.free_slot, _QUOTA)
            elif pct is not None:
                if pct >= v.max_pct_bound:
                    refused[n] = failure(total, v.free_slot, _MEM)
                else:
                    rest.append(n)
            elif v.max_free_mem < memreq:
                refused[n] = failure(total, v.free_slot, _MEM)
            elif v.min_free_mem < memreq:
                rest.append(n)
            elif v.max_free_cores < cores:
                refused[n] = failure(total, v.free_slot, _CORE)
            elif short and v.free_slot < nums and v.min_free_cores >= cores and (cores or v.min_free_cores > 0):
                refused[n] = failure(total, v.free_slot, _TAKEN)
            else:
                rest.append(n)
        return rest

    def _split_unused(
        self, names: Iterable[str], summary: Callable[[str], NodeSummary], refused: dict[str, NodeFailure]
    ) -> list[str]:
        """:meth:`split` under the ``mutex`` device policy: the same rules over the unused
        devices, each device in use refused for ``ExclusiveDeviceAllocateConflict``."""
        rest = []
        vendor, nums, holders = self.vendor, self.nums, self.holders
        static_of, judge, failure, rule = self._kinds.get, self.static, self._failure, self._unused_rule
        for n in names:
            if holders and n in holders:
                rest.append(n)
                continue
            v = summary(n).vendors.get(vendor)
            if v is None:
                refused[n] = self._few(0)
                continue
            total = v.all
            ok = static_of(v.kinds, False)
            if ok is False:
                ok = judge(v.kinds)
            if v.devices != total or ok is UNSETTLED:
                rest.append(n)
            elif nums > total:
                refused[n] = self._few(total)
            elif ok is not PASS:
                refused[n] = failure(total, total, ok)  # type: ignore[arg-type]
            else:
                why = rule(v)
                if why is None:
                    rest.append(n)
                else:
                    refused[n] = failure(total, v.unused, why, v.free_slot - v.unused)
        return rest

    def _unused_rule(self, v: Any) -> Reason | None:
        """Why each unused device of a node (:class:`~hami.core.ledger.VendorSummary` ``v``, its
        devices all schedulable and passing the static filter) refuses a ``mutex`` pod, when the
        summary settles it; None: fit the node. No unused device: the reason is counted for none."""
        if self.over_quota:
            return _QUOTA
        if self.pct is not None:
            return _MEM if self.pct >= v.max_unused_pct_bound else None
        memreq, cores = self.memreq, self.cores
        if v.max_unused_mem < memreq:
            return _MEM
        if v.min_unused_mem < memreq:
            return None
        if v.max_unused_cores < cores:
            return _CORE
        if self.short and v.unused < self.nums and v.min_unused_cores >= cores and (cores or v.min_unused_cores > 0):
            return _TAKEN
        return None

    def judge_class(self, key: RefusalClass, no_memory: bool) -> NodeFailure | None:
        """The refusal of every node of refusal class ``key``, when the class alone settles it
        (the rules of :meth:`split` that do not read a node's memory; the memory rule too when
        ``no_memory``: no device with a free slot in the whole cluster, under ``mutex`` no unused
        one, has the memory asked); None: judge the nodes one by one."""
        total, schedulable, kinds, free, unused = key
        ok = self.static(kinds) if schedulable else UNSETTLED
        if ok is UNSETTLED:
            return None
        if self.nums > total:
            return self._few(total)
        if ok is not PASS:
            return self._failure(total, total, ok)  # type: ignore[arg-type]
        open_, shared = (unused, free - unused) if self.mutex else (free, 0)
        if self.over_quota:
            return self._failure(total, open_, _QUOTA, shared)
        if no_memory or not open_:  # (no open device: each refuses on slots, or as shared)
            return self._failure(total, open_, _MEM, shared)
        return None

    def by_class(
        self,
        tags: Mapping[RefusalClass, int],
        tag_of: Mapping[str, int],
        names: Sequence[str],
        refused: dict[str, NodeFailure],
        no_memory: bool,
    ) -> Sequence[str]:
        """The class rules (:meth:`judge_class`) over ``names`` (ledger nodes), each class
        (``tags``: its tag) judged once and each node given its class's refusal (``tag_of``: the
        node's class's tag; a node without the vendor has none) in one pass, in their order. Puts
        the refused nodes in ``refused``; returns the others, in order."""
        judged: dict[int | None, NodeFailure | None] = {
            tag: self.judge_class(key, no_memory) for key, tag in tags.items()
        }
        if tags and all(f is None for f in judged.values()):
            return names  # no class settled: every node of the vendor is judged alone
        judged[None] = self._few(0)
        got = dict(zip(names, map(judged.__getitem__, map(tag_of.get, names))))
        for n in self.holders:
            if n in got:
                got[n] = None
        rest: list[str] = []
        if None in judged.values() or self.holders:
            rest = [n for n, f in got.items() if f is None]
            for n in rest:
                del got[n]
        refused.update(got)  # type: ignore[arg-type]  # the Nones were taken out
        return rest

    def _few(self, total: int) -> NodeFailure:
        key = (total, -1, _FEW, 0)
        f = self._made.get(key)
        if f is None:
            f = self._made[key] = NodeFailure(
                total=total,
                counts=((_FEW, self.nums),),
                container=self.ci,
                vendor=self.vendor,
                bare=True,
                final=True,  # fewer devices than asked: no eviction adds one
            )
        return f


def _code(item: tuple[Reason, int]) -> str:
    return item[0].value


def refusal(
    ctx: FitContext, uuid_nodes: Callable[[AbstractSet[str]], AbstractSet[str]] | None = None
) -> SummaryRefusal | None:
    """The pod's :class:`SummaryRefusal`, for its first device request (the first container
    with one, its first vendor), when the summary rules cover it: a request to a
    ``summary_prefilter`` vendor, of absolute memory or a percentage of it (under any device
    policy, ``mutex`` included), and no namespace memory quota for a percentage (whose MiB
    differ per device) unless the cores alone exceed the room. A selection by UUID (``use-gpuuuid``,
    ``nouse-gpuuuid``) needs ``uuid_nodes`` (the ledger's: which nodes hold those UUIDs): the
    nodes that do are fitted; on the others no device is named, so the static filter answers
    per model and mode (``CardUuidMismatch`` for each device a ``use`` list leaves out)."""
    asks = [(ci, r) for ci, c in enumerate(ctx.pod.containers) for r in c.requests]
    if not asks:
        return None
    ci, req = asks[0]
    plan = ctx.plans.get((ci, req.vendor))
    if plan is None or not getattr(plan.vendor, "summary_prefilter", False) or req.nums < 1:
        return None
    if req.memreq <= 0 and not 0 < req.mem_percentage <= 100:
        return None  # neither absolute memory nor a percentage (no memory asked)
    sel = plan.sel
    use, nouse = getattr(sel, "use_uuids", None), getattr(sel, "nouse_uuids", None)
    if not isinstance(use, frozenset) or not isinstance(nouse, frozenset):
        return None  # a selection of unknown shape
    holders: AbstractSet[str] = frozenset()
    if use or nouse:
        if uuid_nodes is None:
            return None  # no way to tell which nodes hold them: per device, fit the node
        holders = uuid_nodes(use | nouse)
    mem_room, core_room = (None, None) if ctx.quota is None else ctx.quota.room.get(req.vendor, (None, None))
    over_cores = core_room is not None and req.coresreq > core_room
    if req.memreq > 0:
        over = over_cores or (mem_room is not None and req.memreq > mem_room)
    elif mem_room is not None and not over_cores:
        return None  # a percentage under a memory quota: each device's MiB is checked against it
    else:
        over = over_cores
    return SummaryRefusal(ctx, ci, req, over, (mem_room, core_room) != (None, None), holders)


def _largest_grant(d: DeviceInfo) -> int:
    """The most memory one container can get of ``d``: a MIG GPU's largest profile (an A100-40GB
    hands out at most 40192 of its 40960 MiB), a shared GPU's whole memory."""
    if d.sliced and d.mig_profiles:
        return max(p.memory_mb for p in d.mig_profiles)
    return d.devmem


class Usable(NamedTuple):
    """Which devices a container's request could ever use, for :meth:`MemoryCeilings.below`
    (:func:`_usable` builds it from the walk's static checks)."""

    #: names ``test`` and ``repeats`` (the per-node answers are kept under it)
    key: Hashable
    #: whether a device could ever take the request, whatever its usage
    test: Callable[[DeviceInfo], bool]
    #: whether a usable device may serve several of the request's ``nums`` (a MIG GPU); None:
    #: not known, any may (the count rule then marks nothing)
    repeats: Callable[[DeviceInfo], bool] | None = None
    #: the request's devices must share one NUMA node (the pod's NUMA binding)
    numa_bind: bool = False


#: one usable device, as :meth:`MemoryCeilings.below` judges it: (the most MiB one container can
#: get of it, its NUMA node, whether it may serve several picks)
_Kept = tuple[int, int, bool]


class MemoryCeilings:
    """Marks refusals no eviction can cure: a container asking ``nums`` devices of a vendor, of
    ``memreq`` MiB each, on a node where fewer than ``nums`` devices of that vendor could ever
    take one of them, i.e. are usable (healthy, and passing its type, UUID and mode selection:
    the walk's static checks, used or not) and have that much memory in all (``devmem``; a MIG
    GPU's largest profile); under NUMA binding, fewer than ``nums`` such devices on any one NUMA
    node. When one of those devices may serve several picks (a MIG GPU) only "none at all"
    counts. Read from the node's device list, never from its usage: with every pod on the node
    gone, the walk would still refuse (found by review, 1 Dec: 2 GPUs asked of ``use-gputype:
    A100`` on a node of one A100 and three T4s went to ``FailedNodes``, and kube-scheduler's
    preemption could evict pods there for nothing). A cordoned GPU still counts (the cordon is
    an annotation an operator lifts, and the device lists' generation does not follow it).

    Kept across Filters while the ledger's device lists stay the same
    (:meth:`~hami.core.ledger.Ledger.device_generation`): each node's usable devices per request
    shape, and for each ``(vendor, memreq, nums, NUMA binding, shape)`` asked the set of nodes
    that cannot hold it, so a pending pod's retries mark thousands of refusals with set
    operations instead of a Python step per node. Any change of a device list (a node added,
    removed or registering other devices, a GPU's health) drops both."""

    __slots__ = ("_top", "_below", "_generation")

    #: ``(vendor, memreq, nums, numa_bind, shape)`` sets kept at most (pending pods ask few
    #: distinct shapes)
    MAX_SIZES = 256

    def __init__(self) -> None:
        # node -> (its NodeDevices, usable-device key -> {vendor: its usable devices})
        self._top: dict[str, tuple[Any, dict[Hashable, dict[str, tuple[_Kept, ...]]]]] = {}
        self._below: dict[tuple[str, int, int, bool, Hashable], frozenset[str]] = {}
        self._generation: int | None = None

    def _usable_devices(self, nd: Any, usable: Usable) -> dict[str, tuple[_Kept, ...]]:
        """Node ``nd``'s usable devices per vendor (a vendor whose devices ``usable`` all refuses:
        an empty tuple; a vendor without devices there: absent)."""
        got = self._top.get(nd.name)
        if got is None or got[0] is not nd:
            got = self._top[nd.name] = (nd, {})
        ukey = (usable.key, usable.repeats is None)
        kept = got[1].get(ukey)
        if kept is None:
            test, repeats = usable.test, usable.repeats
            each: dict[str, list[_Kept]] = {}
            for d in nd.devices:
                mine = each.setdefault(d.vendor, [])
                if test(d):
                    mine.append((_largest_grant(d), d.numa, True if repeats is None else repeats(d)))
            kept = got[1][ukey] = {v: tuple(ds) for v, ds in each.items()}
        return kept

    def below(
        self,
        ledger: Any,
        vendor: str,
        memreq: int,
        usable: Usable | tuple[Hashable, Callable[[DeviceInfo], bool]] | None = None,
        nums: int = 1,
    ) -> frozenset[str]:
        """The ledger's nodes with devices of ``vendor`` where fewer than ``nums`` of them (under
        ``usable``'s NUMA binding, on one NUMA node) could hold ``memreq`` MiB, so no eviction
        makes room for such a request (kept while the ledger's device lists stay the same).
        ``usable``: only the devices it accepts count (a node whose devices of ``vendor`` it all
        refuses is under any ceiling); a bare ``(key, test)``, or None (every device), says
        nothing of repeats: "too few" is then "none"."""
        generation = ledger.device_generation()
        if generation != self._generation:
            self._below.clear()
            names = ledger.node_set()
            for gone in [n for n in self._top if n not in names]:  # nodes removed: forgotten
                del self._top[gone]
            self._generation = generation
        use = Usable(None, _every) if usable is None else Usable(*usable)
        want = (vendor, memreq, nums, use.numa_bind, (use.key, use.repeats is None))
        got = self._below.get(want)
        if got is None:
            if len(self._below) >= self.MAX_SIZES:
                self._below.clear()
                for _, tops in self._top.values():
                    tops.clear()
            devices, node, numa_bind = self._usable_devices, ledger.node, use.numa_bind
            hopeless: list[str] = []
            for n in ledger.node_set():
                mine = devices(node(n), use).get(vendor)
                if mine is not None and _too_few(mine, memreq, nums, numa_bind):
                    hopeless.append(n)
            got = self._below[want] = frozenset(hopeless)
        return got

    def mark(
        self, failed: Mapping[str, NodeFailure], pod: Any, ledger: Any, vendors: Iterable[Any]
    ) -> Mapping[str, NodeFailure]:
        """``failed`` with the refusals of the nodes where the failing container's request could
        not be met with every pod gone (:meth:`below`) set ``final``; ``failed`` itself when
        none changes (never mutated). The memory counts only for the ``vendors`` that check
        each device's memory with the generic capacity rules (``summary_prefilter``): another
        may count memory its own way; the number of devices counts for every vendor (the walk
        takes ``nums`` distinct devices unless one ``repeats``)."""
        by_name = {v.name: v for v in vendors}
        asks: dict[tuple[int, str], tuple[Any, int]] = {}
        for ci, c in enumerate(pod.containers):
            for r in c.requests:
                v = by_name.get(r.vendor)
                if v is None or r.nums < 1:
                    continue
                memreq = r.memreq if r.memreq > 0 and getattr(v, "summary_prefilter", False) else 0
                if memreq > 0 or r.nums > 1:  # (else: only "no usable device", whose codes say it)
                    asks[(ci, r.vendor)] = (r, memreq)
        out: dict[str, NodeFailure] | None = None
        for (ci, vendor), (req, memreq) in asks.items():
            low = self.below(ledger, vendor, memreq, _usable(by_name[vendor], req, pod.annotations), req.nums)
            if not low:
                continue
            hits = list(low.intersection(failed.keys()))
            if not hits:
                continue
            got = list(map(failed.__getitem__, hits))
            # the refusals are mostly a few shared objects: each judged once, by identity
            marked: dict[int, NodeFailure | None] = {}
            for f in dict(zip(map(id, got), got)).values():
                hit = not f.final and f.container == ci and f.vendor == vendor
                marked[id(f)] = replace(f, final=True) if hit else None
            new = list(map(marked.__getitem__, map(id, got)))
            if all(g is None for g in marked.values()):
                continue
            if out is None:
                out = dict(failed)
            if None in marked.values():
                out.update((n, g) for n, g in zip(hits, new) if g is not None)
            else:
                out.update(zip(hits, new))  # type: ignore[arg-type]  # no None among them
        return failed if out is None else out


def _too_few(devices: Sequence[_Kept], memreq: int, nums: int, numa_bind: bool) -> bool:
    """Whether fewer than ``nums`` of ``devices`` (usable ones) could each hold ``memreq`` MiB:
    none at all, or (no device among them serving several picks) fewer than ``nums``, under
    ``numa_bind`` on every NUMA node."""
    fit = [(numa, again) for grant, numa, again in devices if grant >= memreq]
    if not fit:
        return True
    if (len(fit) >= nums and not numa_bind) or any(again for _, again in fit):
        return False
    if len(fit) < nums:
        return True
    per_numa: dict[int, int] = {}
    for numa, _ in fit:
        per_numa[numa] = per_numa.get(numa, 0) + 1
    return max(per_numa.values()) < nums


def _every(device: DeviceInfo) -> bool:
    return True


def _usable(vendor: Any, req: Any, annotations: Mapping[str, str]) -> Usable:
    """:class:`Usable` for :meth:`MemoryCeilings.below`: the devices ``req`` could ever use, as the
    walk's static checks see them (:func:`hami.core.fit.static_reason` less the cordon: healthy,
    served, passing the vendor's ``device_filter`` for the pod's selection), whether one may
    serve several picks (the vendor's ``repeats``) and the selection's NUMA binding. A
    selection that names no UUIDs answers per model and mode (as :meth:`SummaryRefusal.static`
    reads it), once each. A selection that cannot be hashed: the health check alone, repeats
    unknown and no NUMA binding (a ceiling over more devices marks fewer nodes)."""
    sel = vendor.selection(annotations)
    try:
        key: Hashable = (vendor.name, req, sel)
        hash(key)
    except TypeError:
        return Usable((vendor.name, "healthy"), _healthy)
    name = vendor.name
    by_kind: dict[tuple[str, str], bool] | None = (
        None if getattr(sel, "use_uuids", None) or getattr(sel, "nouse_uuids", None) else {}
    )

    def test(d: DeviceInfo) -> bool:
        if not d.health or d.vendor != name:
            return False
        if by_kind is None:
            return vendor.serves(d, req) and vendor.device_filter(d, req, sel) is None
        got = by_kind.get((d.type, d.mode))
        if got is None:
            got = by_kind[(d.type, d.mode)] = vendor.serves(d, req) and vendor.device_filter(d, req, sel) is None
        return got

    def repeats(d: DeviceInfo) -> bool:
        return bool(vendor.repeats(d, sel))

    return Usable(key, test, repeats, bool(getattr(sel, "numa_bind", False)))


def _healthy(device: DeviceInfo) -> bool:
    return bool(device.health)
