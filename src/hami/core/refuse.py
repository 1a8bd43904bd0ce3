"""Exact refusals from a node's summary: a node's :class:`NodeFailure` without visiting its devices.

When a pod fits nowhere, every node must say why, in HAMi's words (``"2/8 CardInsufficientMemory,
6/8 CardTimeSlicingExhausted"``): kube-scheduler turns those into the pod's events. Fitting each
node device by device (:func:`hami.core.fit.fit_pod`) costs about 0.1 ms a node, 0.5 s at 5000
nodes, for every Filter of a pending pod. For the commonest pending pod, one container asking one
vendor for ``nums`` devices of an absolute ``memreq`` MiB (and ``coresreq`` cores), the walk's
outcome on many nodes follows from the node's :class:`~hami.core.ledger.VendorSummary` alone:

* the node has no device of the vendor: ``NodeInsufficientDevice`` (HAMi prints the bare code);
* every device of the vendor is schedulable (healthy, not cordoned), served and passed by the
  vendor's static filter (type, mode; the pod names no UUIDs), and no device may serve two of the
  ``nums`` (no MIG), so the candidates are all ``all`` devices; then

  - ``nums > all``: ``NodeInsufficientDevice``;
  - no device with a free slot has ``memreq`` MiB free (``max_free_mem < memreq``): each device
    with a slot fails on memory, each without on slots (the capacity rules check slots first,
    then memory): ``k/all CardInsufficientMemory, (all-k)/all CardTimeSlicingExhausted``;
  - every device with a slot has the memory (``min_free_mem >= memreq``) but none the cores
    (``max_free_cores < coresreq``): the same with ``CardInsufficientCore``;
  - every device with a slot passes every capacity rule (the memory, the cores, some cores
    left when the pod asks none; a pod asking 100 cores, whose rule also reads each device's
    use, is left to the fit) but there are fewer than ``nums`` of them: the walk took each and
    fell short, ``k/all AllocatedCardsInsufficientRequest`` beside the slot refusals (not under
    NUMA binding, whose walk drops devices on the way).

Where these do not settle it (a node with an unhealthy GPU, a pod with quota or ``mutex`` or a
UUID list, a vendor without ``summary_prefilter``, several containers), the caller fits the node
as before. The rules hold for the vendors that declare ``summary_prefilter`` (the generic
capacity rules, :func:`hami.vendors.base.slot_check` first): the same promise the node search's
prefilter already relies on, checked against the full fit by ``tests/unit/test_core_refuse.py``.
When no GPU with a free slot in the whole cluster has the memory asked (the ledger's
:meth:`~hami.core.ledger.Ledger.best_room`), the answer depends only on a node's refusal class
(devices, all schedulable, models and modes, devices with a slot), which the ledger keeps for
each node: each class is judged once, and the nodes take their class's refusal in one pass
without a Python step per node (:meth:`SummaryRefusal.by_class`).

The failure carries the counts (its rendering and codes are the fit's) but not the per-GPU
UUIDs: ``hami explain`` and the UI fit every node themselves for those.

Worked example: ``nums=1, memreq=8000``; a node of 8 GPUs, 3 with every slot taken and the
largest free memory among the other 5 at 6000 MiB: ``5/8 CardInsufficientMemory,
3/8 CardTimeSlicingExhausted``, the string the walk gives, read from four summary fields.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

from .fit import FitContext
from .ledger import NodeSummary, RefusalClass
from .reasons import NodeFailure, Reason
from .types import DeviceInfo

_MEM, _CORE, _SLOTS, _FEW, _TAKEN = (
    Reason.CARD_INSUFFICIENT_MEMORY,
    Reason.CARD_INSUFFICIENT_CORE,
    Reason.CARD_TIME_SLICING_EXHAUSTED,
    Reason.NODE_INSUFFICIENT_DEVICE,
    Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
)


class SummaryRefusal:
    """One pod's refusals from node summaries (:func:`refusal` builds it; None: not such a pod)."""

    __slots__ = ("vendor", "ci", "nums", "memreq", "cores", "short", "_plan", "_kinds", "_made")

    def __init__(self, ctx: FitContext, ci: int, req: Any) -> None:
        self.vendor, self.ci, self.nums, self.memreq, self.cores = req.vendor, ci, req.nums, req.memreq, req.coresreq
        self._plan = ctx.plans[(ci, req.vendor)]
        # the "too few open devices" rule applies (see the module docstring)
        self.short = req.nums > 1 and req.coresreq < 100 and not getattr(self._plan.sel, "numa_bind", True)
        self._kinds: dict[frozenset[tuple[str, str]], bool] = {}  # (model, mode) sets -> all plain candidates
        self._made: dict[tuple[int, int, Reason], NodeFailure] = {}  # shared failures

    def _plain(self, kinds: frozenset[tuple[str, str]]) -> bool:
        """Every device of these (model, mode) pairs is served, passes the static filter and
        serves at most one of the ``nums`` (the answers depend on the model and mode only, with
        no UUID list in the pod's selection: see :func:`refusal`)."""
        got = self._kinds.get(kinds)
        if got is None:
            plan = self._plan
            vendor, req, sel = plan.vendor, plan.req, plan.sel
            got = True
            for model, mode in kinds:
                d = DeviceInfo(id="", type=model, mode=mode, health=True, vendor=self.vendor)
                if not vendor.serves(d, req) or vendor.device_filter(d, req, sel) is not None or vendor.repeats(d, sel):
                    got = False
                    break
            self._kinds[kinds] = got
        return got

    def _failure(self, total: int, short: int, why: Reason) -> NodeFailure:
        """``short`` devices fail for ``why``, the other ``total - short`` on slots."""
        key = (total, short, why)
        f = self._made.get(key)
        if f is None:
            counts = tuple(sorted(((r, k) for r, k in ((why, short), (_SLOTS, total - short)) if k), key=_code))
            f = self._made[key] = NodeFailure(total=total, counts=counts, container=self.ci, vendor=self.vendor)
        return f

    def __call__(self, s: NodeSummary) -> NodeFailure | None:
        """The node's exact failure, or None when its summary does not settle it (fit the node)."""
        out: dict[str, NodeFailure] = {}
        self.split(("",), lambda _: s, out)
        return out.get("")

    def split(
        self, names: Iterable[str], summary: Callable[[str], NodeSummary], refused: dict[str, NodeFailure]
    ) -> list[str]:
        """Put the nodes of ``names`` that the summary rules refuse in ``refused`` (node -> failure);
        return the others, in order. The rules of the module docstring, in that order (one loop,
        everything it reads held in locals: it runs for every node of a cluster)."""
        rest = []
        vendor, nums, memreq, cores, short = self.vendor, self.nums, self.memreq, self.cores, self.short
        plain, plain_of, failure = self._kinds.get, self._plain, self._failure
        for n in names:
            v = summary(n).vendors.get(vendor)
            if v is None:
                refused[n] = self._few(0)
                continue
            total = v.all
            ok = plain(v.kinds)
            if ok is None:
                ok = plain_of(v.kinds)
            if v.devices != total or not ok:
                rest.append(n)
            elif nums > total:
                refused[n] = self._few(total)
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

    def by_class(
        self,
        tags: Mapping[RefusalClass, int],
        tag_of: Mapping[str, int],
        names: Sequence[str],
        refused: dict[str, NodeFailure],
    ) -> list[str]:
        """:meth:`split` for a pod that no GPU with a free slot in the whole cluster has the memory
        for (the caller checks :meth:`Ledger.best_room`): then a node's refusal depends only on
        its :data:`RefusalClass`, so each class (``tags``: the class's tag) is judged once and
        ``names`` (ledger nodes) take their class's refusal (``tag_of``: the node's class's tag;
        a node without the vendor has none) in one pass, in their order. Puts the refused nodes
        in ``refused``; returns the others (of classes the rules do not settle), in order."""
        judged: dict[int | None, NodeFailure | None] = {None: self._few(0)}
        for (total, schedulable, kinds, free), tag in tags.items():
            if not schedulable or not self._plain(kinds):
                judged[tag] = None  # fit these nodes
            elif self.nums > total:
                judged[tag] = self._few(total)
            else:  # every device with a slot lacks the memory
                judged[tag] = self._failure(total, free, _MEM)
        got = dict(zip(names, map(judged.__getitem__, map(tag_of.get, names))))
        rest: list[str] = []
        if None in judged.values():
            rest = [n for n, f in got.items() if f is None]
            for n in rest:
                del got[n]
        refused.update(got)
        return rest

    def _few(self, total: int) -> NodeFailure:
        key = (total, -1, _FEW)
        f = self._made.get(key)
        if f is None:
            f = self._made[key] = NodeFailure(
                total=total, counts=((_FEW, self.nums),), container=self.ci, vendor=self.vendor, bare=True
            )
        return f


def _code(item: tuple[Reason, int]) -> str:
    return item[0].value


def refusal(ctx: FitContext) -> SummaryRefusal | None:
    """The pod's :class:`SummaryRefusal`, when the pod is one the summary rules cover: one device
    request in all, to a ``summary_prefilter`` vendor, of absolute memory, with no namespace
    quota on that vendor, no ``mutex`` device policy and no UUID list in its selection."""
    asks = [(ci, r) for ci, c in enumerate(ctx.pod.containers) for r in c.requests]
    if len(asks) != 1:
        return None
    ci, req = asks[0]
    plan = ctx.plans.get((ci, req.vendor))
    if plan is None or not getattr(plan.vendor, "summary_prefilter", False) or req.memreq <= 0 or req.nums < 1:
        return None
    if ctx.policy.mutex or (ctx.quota is not None and ctx.quota.room.get(req.vendor, (None, None)) != (None, None)):
        return None
    sel = plan.sel
    if getattr(sel, "use_uuids", True) or getattr(sel, "nouse_uuids", True):
        return None  # a UUID list (or a selection of unknown shape): per device, fit the node
    return SummaryRefusal(ctx, ci, req)
