"""Remembered refusals: a node's exact failure for a pod shape, valid while the node is unchanged.

A pod that fits nowhere is fitted on every node to give each its exact reason, and
kube-scheduler sends it to Filter again on every cluster change. Between two of those calls
most nodes have not changed, so their verdicts cannot have changed either: the fit of a pod on
a node (:func:`hami.core.fit.fit_pod`) reads only the node's devices, usage, cordons, link
scores and slices, all of which move only through the ledger, which stamps the node with a
new version on each change (:meth:`hami.core.ledger.Ledger.versions`), and the pod's
:class:`~hami.core.fit.FitContext`, summed up here as a *signature*: each container's kind and
requests, each vendor's parsed selection, the device policy, the score weights, the namespace's
quota room and the request-in-scores switch. Two pods with the same signature get the same
verdict on the same node, so a queue of identical pending jobs shares one set of verdicts.

Only refusals are kept (a node that fits is chosen, and its usage changes), in a bounded memo
(the least recently used signatures go first), cleared whenever the scheduler configuration
object (the vendor table) changes. Pure data, no I/O; owned by the ledger it describes.

Worked example: a pod asking for a GPU by a UUID no node has, against 5000 nodes, is fitted on
all 5000 (about 0.1 ms apiece; the summary rules of :mod:`hami.core.refuse` do not cover a UUID
list). A pod is then placed on node-0042 and the pending pod is filtered again: 4999 nodes
have not changed since their refusal was taken and keep it; node-0042 is fitted again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import Any, Hashable, Mapping

from .fit import FitContext
from .reasons import NodeFailure

_GONE = 1 << 62  # the version of a node no longer in the ledger: later than any refusal


class Entry:
    """One pod signature's refusals: ``fail`` (node -> its failure) taken at ledger clock
    ``ver`` (node -> clock; the refusal holds while the node's version is not later: a node's
    version is the clock of its last change); ``pending``: the last Filter of this shape found
    no node (its next one likely finds none either); ``valid``: the refusals still current at ledger clock
    ``as_of`` (kept so that a retry only drops the nodes changed since, instead of comparing
    every node's version)."""

    __slots__ = ("ver", "fail", "pending", "valid", "as_of")

    def __init__(self) -> None:
        self.ver: dict[str, int] = {}
        self.fail: dict[str, NodeFailure] = {}
        self.pending = False
        self.valid: dict[str, NodeFailure] = {}
        self.as_of = -1

    def __len__(self) -> int:
        return len(self.ver)


def signature(ctx: FitContext) -> Hashable | None:
    """Everything in ``ctx`` that a node's verdict depends on, as a hashable value; None when a
    part cannot be hashed (a vendor's own selection type, say): such a pod is never memoised."""
    quota = None if ctx.quota is None else tuple(sorted(ctx.quota.room.items()))
    key = (
        tuple((c.kind, c.requests) for c in ctx.pod.containers),
        tuple(sorted(ctx.selections.items())),
        ctx.policy,
        ctx.weights,
        quota,
        ctx.request_in_scores,
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key


class VerdictMemo:
    """Per pod signature, the nodes that refused it and the ledger clock each refused at.

    Bounded by the number of verdicts held (``max_verdicts``, all signatures together; about
    70 bytes each, the failures being shared): the least recently used signatures go first. A
    failure is kept without its per-GPU UUIDs (what the scheduler answers and counts does not
    use them; ``hami explain`` fits the nodes itself), so equal refusals share one object."""

    __slots__ = ("max_verdicts", "_entries", "_size", "_shapes", "_config", "hits", "recorded")

    def __init__(self, max_verdicts: int = 200_000) -> None:
        self.max_verdicts = max_verdicts
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self._size = 0  # verdicts held, all entries together
        self._shapes: dict[NodeFailure, NodeFailure] = {}  # interned failures (without UUIDs)
        self._config: Any = None  # the SchedulerConfig the entries were taken under
        self.hits = 0  # verdicts reused (for tests and benchmarks)
        self.recorded = 0  # verdicts recorded

    def __len__(self) -> int:
        return len(self._entries)

    def size(self) -> int:
        """Verdicts held, all pod signatures together."""
        return self._size

    def clear(self) -> None:
        self._entries.clear()
        self._shapes.clear()
        self._size = 0

    def entry(self, key: Hashable, config: Any) -> Entry:
        """The (possibly new, empty) entry for ``key``; marks it most recently used."""
        if config is not self._config:
            self.clear()
            self._config = config
        got = self._entries.get(key)
        if got is None:
            got = self._entries[key] = Entry()
        else:
            self._entries.move_to_end(key)
        return got

    def current(self, entry: Entry, ledger: Any, wanted: set[str] | None) -> Mapping[str, NodeFailure]:
        """The entry's refusals whose node has not changed since they were taken (and, when
        ``wanted`` is given, is one of the candidates). Read-only."""
        changed = ledger.changed_since(entry.as_of) if entry.as_of >= 0 else None
        valid = entry.valid
        if changed is None or 4 * len(changed) > len(valid) + 64:
            versions = ledger.versions()
            fail = entry.fail
            valid = entry.valid = {n: fail[n] for n, v in entry.ver.items() if versions.get(n, _GONE) <= v}
        else:
            for n in changed:
                valid.pop(n, None)
        entry.as_of = ledger.clock()
        if wanted is not None and not valid.keys() <= wanted:
            valid = {n: f for n, f in valid.items() if n in wanted}
        self.hits += len(valid)
        return valid

    def record(
        self,
        entry: Entry,
        fitted: Mapping[str, NodeFailure],
        summarised: Mapping[str, NodeFailure],
        clock: int,
    ) -> None:
        """Remember the refusals one Filter found: ``fitted`` by a fit (kept without their UUIDs),
        ``summarised`` from summaries (shared objects already), at ledger clock ``clock``. Called
        after :meth:`current` in the same Filter, the ledger unchanged in between, so they are all
        current (and each node's version is at most ``clock``)."""
        shapes = self._shapes
        if len(shapes) > 4 * len(fitted) + 10_000:
            shapes.clear()  # only an intern table: held objects stay valid
        before = len(entry)
        for n, f in fitted.items():
            if f.devices:
                f = replace(f, devices=())
                f = shapes.setdefault(f, f)
            entry.ver[n] = clock
            entry.fail[n] = entry.valid[n] = f
        entry.ver.update(dict.fromkeys(summarised, clock))
        entry.fail.update(summarised)
        entry.valid.update(summarised)
        self.recorded += len(fitted) + len(summarised)
        self._size += len(entry) - before
        while self._size > self.max_verdicts and len(self._entries) > 1:
            oldest = next(iter(self._entries))
            if self._entries[oldest] is entry:
                self._entries.move_to_end(oldest)
                continue
            self._size -= len(self._entries.pop(oldest))
