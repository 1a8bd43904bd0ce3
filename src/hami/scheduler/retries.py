"""Answering kube-scheduler's retry of an unschedulable pod from the previous answer.

kube-scheduler keeps a pod that fits nowhere and sends it to ``/filter`` again after each
cluster event and at least every five minutes. When nothing the answer reads has changed since
the last one, the answer is the same: the ledger (:meth:`hami.core.ledger.Ledger.generation`
moves on every change of a node's devices, health or usage, of a reservation, a quota or a
claim), the nodes the scheduler's ``--node-label-selector`` leaves out (a node that leaves or
joins it changes their refusal), the pod as the API server has it (its UID and resourceVersion:
a pod edited, or deleted and created again, is a new question), and the candidate nodes
kube-scheduler sent (their count and a digest of the list; kube-scheduler sends the same list
while its own view is unchanged).
The configuration and the vendors are fixed for the process's life.

What is kept per pod is the grouped refusal (:data:`hami.scheduler.extender.Rows`: one text per
distinct refusal with the names of its nodes, names the ledger holds anyway) and the event
lines, not the two maps of the answer (rebuilt on a hit in C loops): a 5000-node refusal costs
about 40 KB here. The cache is bounded in pods and in node entries; the oldest entry goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class _Entry:
    version: tuple[Any, ...]  # (pod resourceVersion, ledger and selector generations, candidate count, digest)
    rows: list  # render_failures' rows
    lines: tuple[str, ...]  # the FilteringFailed event lines
    size: int  # node entries in rows


def candidates_digest(names: Sequence[str]) -> tuple[int, int]:
    """``(count, hash)`` of the candidate node names, in the order sent."""
    return len(names), hash(tuple(names))


class RetryAnswers:
    """Unschedulable answers by pod UID, valid while their version holds (module docstring)."""

    def __init__(self, max_pods: int = 1024, max_nodes: int = 2_000_000) -> None:
        self.max_pods, self.max_nodes = max_pods, max_nodes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._nodes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, uid: str, version: tuple[Any, ...]) -> tuple[list, tuple[str, ...]] | None:
        """The rows and event lines answered for pod ``uid`` at ``version``; None (and the stale
        entry dropped) when the pod was not answered at that version."""
        entry = self._entries.get(uid)
        if entry is None or entry.version != version:
            if entry is not None:
                self.forget(uid)
            self.misses += 1
            return None
        self._entries.move_to_end(uid)
        self.hits += 1
        return entry.rows, entry.lines

    def put(self, uid: str, version: tuple[Any, ...], rows: list, lines: Sequence[str]) -> None:
        """Keep an unschedulable answer (the oldest entries go beyond the bounds)."""
        self.forget(uid)
        size = sum(len(r[3]) for r in rows)
        if size > self.max_nodes:
            return
        self._entries[uid] = _Entry(version, rows, tuple(lines), size)
        self._nodes += size
        while len(self._entries) > self.max_pods or self._nodes > self.max_nodes:
            _, old = self._entries.popitem(last=False)
            self._nodes -= old.size

    def forget(self, uid: str) -> None:
        """Drop pod ``uid``'s entry (it fits now, was bound or deleted)."""
        old = self._entries.pop(uid, None)
        if old is not None:
            self._nodes -= old.size

    def clear(self) -> None:
        self._entries.clear()
        self._nodes = 0
