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

Only refusals are kept (a node that fits is chosen, and its usage changes). The memo is bounded
(least recently used signatures go first) and is cleared whenever the scheduler configuration
object (the vendor table) changes. Pure data, no I/O; owned by the ledger it describes.

Worked example: a 100 GB pod against 5000 nodes of 80 GB GPUs fails on all 5000 (each fitted,
about 0.1 ms apiece). A pod is then placed on node-0042; the pod is filtered again: 4999 nodes
still carry the version their verdict was taken at and keep it, node-0042 is fitted again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Mapping

from .fit import FitContext
from .reasons import NodeFailure

#: node -> (the node's ledger version when fitted, its failure)
Entry = dict[str, tuple[int, NodeFailure]]


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
    """Per pod signature, the nodes that refused it and the node version each refused at."""

    __slots__ = ("capacity", "_entries", "_config", "hits", "fitted")

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self._config: Any = None  # the SchedulerConfig the entries were taken under
        self.hits = 0  # verdicts reused (for tests and benchmarks)
        self.fitted = 0  # verdicts recorded

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def entry(self, key: Hashable, config: Any) -> Entry:
        """The (possibly new, empty) entry for ``key``; marks it most recently used."""
        if config is not self._config:
            self._entries.clear()
            self._config = config
        got = self._entries.get(key)
        if got is None:
            got = self._entries[key] = {}
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        return got

    def current(self, entry: Entry, versions: Mapping[str, int], wanted: set[str] | None) -> dict[str, NodeFailure]:
        """The entry's verdicts whose node still has the version they were taken at (and, when
        ``wanted`` is given, is one of the candidates)."""
        if wanted is None:
            got = {n: f for n, (v, f) in entry.items() if versions.get(n) == v}
        else:
            got = {n: f for n, (v, f) in entry.items() if versions.get(n) == v and n in wanted}
        self.hits += len(got)
        return got

    def record(self, entry: Entry, failed: Mapping[str, NodeFailure], versions: Mapping[str, int]) -> None:
        """Remember the refusals a Filter fitted (nodes not in the ledger are left out)."""
        for n, f in failed.items():
            v = versions.get(n)
            if v is not None:
                entry[n] = (v, f)
                self.fitted += 1
