"""Nodes kept in node-score order, so that a pod's node search visits only the nodes it needs.

The node score (:func:`hami.core.score.node_score`, HAMi's form plus this pod's request) is
``10 * ((used + a) / C + (usedcores + b) / T + (usedmem + d) / M)``, where ``C, T, M`` are the
node's totals (slots, cores, MiB) and ``a, b, d`` what the pod asks. Among nodes with the same
totals and device count (a *shape*: in a real cluster, one per machine model) the request adds
the same amount to every node's score, so their order by score is their order by usage alone,
whatever the pod: ``used*T*M + usedcores*C*M + usedmem*C*T`` (an exact integer, the score's
numerator over ``C*T*M``). This module keeps, per shape, the nodes sorted by that integer (both
ways: binpack reads fullest first, spread emptiest first; ties by node name ascending in both),
updated by the ledger whenever a node's usage changes (O(log n)). A pod's search merges the few
shapes' orders (:meth:`NodeRanking.walk`) and stops at the first node that fits, so its cost
depends on how many nodes it visits, not on the size of the cluster.

Shapes are further split by what each vendor can still offer on the node (:data:`Room`): for
every vendor with a device that has a free slot, the most cores free on one device (exact) and
an upper bound of the most memory free on one device (the next power of two, minus one). A pod
asking a vendor whose capacity rules the summary checks may safely (the vendor's
``summary_prefilter``) skips every group where that vendor has no free slot, or too few cores
or too little memory on every device, without visiting its nodes one by one: under binpack the
nearly full nodes rank first, and a pod would otherwise walk past all of them.

Pure data structure: no I/O, no clocks; the ledger owns one and keeps it current.
"""

from __future__ import annotations

from typing import Iterator

from sortedcontainers import SortedList

Shape = tuple[int, int, int, int]  # (slots, cores, MiB, devices) of the whole node
Room = tuple[tuple[str, int, int], ...]  # (vendor, bound of the most MiB free, most cores free), by vendor
GroupKey = tuple[Shape, Room]


def room(vendor: str, max_free_mem: int, max_free_cores: int) -> tuple[str, int, int]:
    """One vendor's entry of :data:`Room` (memory rounded up to 2**k - 1: few groups)."""
    return vendor, (1 << max(max_free_mem, 0).bit_length()) - 1, max_free_cores


class NodeRanking:
    """Per group of equal shape (and open vendors): node names sorted by usage, both ways."""

    __slots__ = ("_groups", "_where", "_rooms")

    def __init__(self) -> None:
        # group -> (emptiest first: (key, name); fullest first: (-key, name))
        self._groups: dict[GroupKey, tuple[SortedList, SortedList]] = {}
        self._rooms: dict[GroupKey, dict[str, tuple[int, int]]] = {}  # group -> vendor -> (MiB bound, cores)
        self._where: dict[str, tuple[GroupKey, int]] = {}  # node -> (its group, its usage key)

    def __len__(self) -> int:
        return len(self._where)

    def update(self, name: str, shape: Shape, rooms: Room, used: int, usedcores: int, usedmem: int) -> None:
        """Place (or move) ``name`` after a change of its totals or usage."""
        slots, cores, mem, _ = shape
        key = used * cores * mem + usedcores * slots * mem + usedmem * slots * cores if slots and cores and mem else 0
        group = (shape, rooms)
        if self._where.get(name) == (group, key):
            return
        self.remove(name)
        lists = self._groups.get(group)
        if lists is None:
            lists = self._groups[group] = (SortedList(), SortedList())
            self._rooms[group] = {v: (mem, cores) for v, mem, cores in rooms}
        lists[0].add((key, name))
        lists[1].add((-key, name))
        self._where[name] = (group, key)

    def remove(self, name: str) -> None:
        old = self._where.pop(name, None)
        if old is None:
            return
        group, key = old
        lists = self._groups[group]
        lists[0].remove((key, name))
        lists[1].remove((-key, name))
        if not lists[0]:
            del self._groups[group]
            del self._rooms[group]

    def groups(self, fullest_first: bool) -> Iterator[tuple[Shape, dict[str, tuple[int, int]], Iterator[str]]]:
        """``(shape, vendor -> (bound of the most MiB free, most cores free), node names in score
        order)`` for every group; a vendor with no free slot is absent. Names are read lazily
        (a group whose nodes a pod cannot use costs nothing to skip)."""
        side = 1 if fullest_first else 0
        for group, lists in self._groups.items():
            yield group[0], self._rooms[group], (name for _, name in lists[side])
