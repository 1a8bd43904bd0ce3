"""The allocation ledger: who holds what, per device, per node and per namespace quota.

Everything in it can be rebuilt from Kubernetes objects: node registration annotations
(:func:`node_devices_from_object`) and pod allocation annotations
(:func:`allocation_from_pod`). Per-node summaries are kept up to date incrementally so the
scheduler can rank and reject most nodes without visiting their devices.

Slices (NVIDIA MIG instances) are attached to their device from the pods that hold them, and
re-derived from the node's pods whenever one of them changes (level-triggered, §5.3 step 5).
A sliced device in an inconsistent state is treated as unhealthy (``CardNotHealth``) until the
state is consistent again: a slice on a device that is not sliced (a MIG pod on a hami-core
GPU), a pod using a sliced device without holding a slice on it, or two overlapping slices.

The ledger is a plain in-memory object; it does no I/O and is not thread-safe (adapters
serialise access).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import AbstractSet as Set, Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from sortedcontainers import SortedList

from .errors import CodecError, CoreError
from .codec import decode_pod_devices
from .fit import NodeView, QuotaRoom
from .names import DEVICE_CORDON, VGPU_NODE
from .quantity import QuantityError, parse_int_quantity, parse_quantity
from .rank import NodeRanking, room
from .requests import ordered_containers, pod_name
from .shape import check_node
from .types import (
    MAX_NODE_DEVICES,
    ContainerKind,
    DeviceInfo,
    NodeDevices,
    PodRequest,
    PodAllocation,
    PodSingleDevice,
    Slice,
)
from .usage import collapse, picks_of, pod_peak
from .verdicts import VerdictMemo

NODE_ANNOTATION = VGPU_NODE
_E = TypeVar("_E")
_NO_BOUND = float("inf")
CORDON_ANNOTATION = DEVICE_CORDON


@dataclass(slots=True)
class VendorSummary:
    """Fast-reject data for one vendor's schedulable (healthy, uncordoned) devices on a node."""

    devices: int = 0
    free_slot: int = 0  # devices with used < count
    idle: int = 0  # devices that can take an exclusive (100-core) request: used == 0 or devcore != 100
    # the three below over the devices with a free slot only (a full device takes nothing)
    max_free_mem: int = 0
    max_free_cores: int = 0
    # max (free+1)*100/devmem: a pct request >= this finds no device with the memory (exactly:
    # free < devmem*pct//100 on each; infinite when a device with a slot has no memory at all)
    max_pct_bound: float = 0.0
    types: frozenset[str] = frozenset()  # models of the schedulable devices
    sliced: int = 0  # sliced (MIG) devices: one may serve several of a container's nums
    # for exact refusals (hami.core.refuse): every device of the vendor, schedulable or not; the
    # (model, mode) pairs of the schedulable ones; the least memory and the fewest cores free on
    # a device with a free slot
    all: int = 0
    kinds: frozenset[tuple[str, str]] = frozenset()
    min_free_mem: int = 0
    min_free_cores: int = 0
    # the same over the unused devices alone (a free slot and no use at all): the only ones a pod
    # under the ``mutex`` device policy may take (every other one refuses it, for its slots or
    # ExclusiveDeviceAllocateConflict)
    unused: int = 0
    max_unused_mem: int = 0
    max_unused_cores: int = 0
    max_unused_pct_bound: float = 0.0
    min_unused_mem: int = 0
    min_unused_cores: int = 0


#: (devices of the vendor, all of them schedulable, their (model, mode) pairs, devices with a free
#: slot, unused devices)
RefusalClass = tuple[int, bool, frozenset[tuple[str, str]], int, int]


@dataclass(slots=True)
class NodeSummary:
    count: int = 0
    used: int = 0
    totalcore: int = 0
    usedcores: int = 0
    totalmem: int = 0
    usedmem: int = 0
    vendors: dict[str, VendorSummary] = field(default_factory=dict)


@dataclass(slots=True)
class NodeState:
    node: NodeDevices
    used: list[int]
    usedmem: list[int]
    usedcores: list[int]
    index_of: dict[str, int]
    summary: NodeSummary = field(default_factory=NodeSummary)
    devices: tuple[DeviceInfo, ...] = ()  # node.devices, with inconsistent sliced devices marked unhealthy
    slices: dict[int, tuple[Slice, ...]] = field(default_factory=dict)  # device position -> slices held
    sliced: bool = False  # the node has a sliced (MIG-mode) device
    #: device position -> the classes of the pods holding it (PodAllocation.classes) -> how many pods
    classes: dict[int, dict[str, int]] = field(default_factory=dict)

    def recheck_slices(self, allocs: Iterable[PodAllocation]) -> None:
        """Attach every pod's slices to their device and mark inconsistent devices unhealthy."""
        held: dict[int, list[Slice]] = {}
        bad: set[int] = set()
        devs = self.node.devices
        for alloc in allocs:
            mine = set()
            for piece in alloc.slices:
                i = self.index_of.get(piece.uuid)
                if i is None:
                    continue
                mine.add(piece.uuid)
                held.setdefault(i, []).append(piece)
                if not devs[i].sliced:
                    bad.add(i)  # a MIG pod on a hami-core GPU
            # every device of the grant, not only those the pod still holds: a finished init
            # container's instance without a reservation (HAMi's old grant form) still sits on
            # its GPU (the regression review of 1 Dec: the GPU came back healthy and free once it
            # finished)
            granted = {cd.uuid for ctrs in alloc.devices.values() for ctr in ctrs for cd in ctr}
            for uuid in sorted(granted | {u.uuid for u in alloc.usage}):
                i = self.index_of.get(uuid)
                if i is not None and devs[i].sliced and uuid not in mine:
                    bad.add(i)  # a MIG GPU used without a reservation
        for i, pieces in held.items():
            if any(a.overlaps(b) for k, a in enumerate(pieces) for b in pieces[k + 1 :]):
                bad.add(i)
        self.slices = {i: tuple(p) for i, p in held.items()}
        self.devices = tuple(replace(d, health=False) if i in bad and d.health else d for i, d in enumerate(devs))

    def resummarise(self) -> None:
        s = NodeSummary()
        for i, d in enumerate(self.devices):
            u, m, c = self.used[i], self.usedmem[i], self.usedcores[i]
            s.count += d.count
            s.used += u
            s.totalcore += d.devcore
            s.usedcores += c
            s.totalmem += d.devmem
            s.usedmem += m
            v = s.vendors.get(d.vendor)
            if v is None:
                v = s.vendors[d.vendor] = VendorSummary()
            v.all += 1
            if not d.health or d.id in self.node.cordoned:
                continue
            v.devices += 1
            v.sliced += d.sliced
            if d.type not in v.types:
                v.types = v.types | {d.type}
            if (d.type, d.mode) not in v.kinds:
                v.kinds = v.kinds | {(d.type, d.mode)}
            v.idle += u == 0 or d.devcore != 100
            if u >= d.count:
                continue  # no container can take it (every summary_prefilter vendor checks slots first)
            fm, fc = d.devmem - m, d.devcore - c
            # (a percentage of no memory is 0 MiB: no bound from the percentage asked)
            bound = (fm + 1) * 100 / d.devmem if d.devmem > 0 else _NO_BOUND
            v.free_slot += 1
            if v.free_slot == 1:
                v.min_free_mem, v.min_free_cores = fm, fc
                v.max_free_mem, v.max_free_cores, v.max_pct_bound = fm, fc, bound
            else:
                if fm < v.min_free_mem:
                    v.min_free_mem = fm
                if fc < v.min_free_cores:
                    v.min_free_cores = fc
                if fm > v.max_free_mem:
                    v.max_free_mem = fm
                if fc > v.max_free_cores:
                    v.max_free_cores = fc
                if bound > v.max_pct_bound:
                    v.max_pct_bound = bound
            if u > 0:
                continue  # mutex: ExclusiveDeviceAllocateConflict
            v.unused += 1
            if v.unused == 1:
                v.min_unused_mem, v.min_unused_cores = fm, fc
                v.max_unused_mem, v.max_unused_cores, v.max_unused_pct_bound = fm, fc, bound
            else:
                if fm < v.min_unused_mem:
                    v.min_unused_mem = fm
                if fc < v.min_unused_cores:
                    v.min_unused_cores = fc
                if fm > v.max_unused_mem:
                    v.max_unused_mem = fm
                if fc > v.max_unused_cores:
                    v.max_unused_cores = fc
                if bound > v.max_unused_pct_bound:
                    v.max_unused_pct_bound = bound
        self.summary = s


class Ledger:
    """Nodes' devices and usage, pods' allocations, namespace quota usage and limits."""

    def __init__(self, vendors: Iterable[Any] = ()) -> None:
        """``vendors``: the backends whose grants record cores as a bit mask
        (``cores_are_masks``, AWS Neuron as HAMi writes it) count their set bits against a
        namespace's quota; every other grant's cores count as they are."""
        self._mask_vendors = frozenset(v.name for v in vendors if getattr(v, "cores_are_masks", False))
        self._nodes: dict[str, NodeState] = {}
        self._pods: dict[str, PodAllocation] = {}
        self._pods_by_node: dict[str, set[str]] = {}
        self._reserved: set[str] = set()
        self._quota: dict[str, dict[str, dict[str, int]]] = {}  # ns -> quota name -> resource -> limit
        self._ns_used: dict[str, dict[str, list[int]]] = {}  # ns -> vendor -> [mem, cores]
        self._claims: dict[str, tuple[str, str, int, int]] = {}  # claim key -> (ns, vendor, mem, cores)
        self.ranking = NodeRanking()  # nodes in node-score order (kept current by every change)
        # node -> version, a new one (from one counter, never reused) on every change of what a
        # fit reads there: devices, cordons, link scores, usage, slices
        self._versions: dict[str, int] = {}
        self._clock = 0
        self._log: list[str] = []  # the node of each change: _log[i] got version _log_base + i + 1
        self._log_base = 0
        # caches' validity (never reused, never reset): one counter for every change a Filter's
        # answer may read (nodes, usage, reservations, quotas, claims), one for the device lists
        # alone (a node added, removed, or registering other devices)
        self._generation = 0
        self._device_generation = 0
        self._names: list[str] | None = None  # node names, sorted (None: to sort again)
        self.verdicts = VerdictMemo()  # refusals per pod shape, valid while a node's version holds
        # vendor -> (most MiB free on one device with a slot, most cores free, the largest
        # percentage bound), one entry per node, sorted: the cluster's best device in O(1) (a
        # pod asking more fits nowhere); the same over unused devices (a mutex pod's), and
        # vendor -> unused devices on a node -> nodes with that many
        self._best: dict[str, tuple[SortedList, SortedList, SortedList]] = {}
        self._best_of: dict[str, tuple[tuple[str, int, int, float], ...]] = {}
        self._unused: dict[str, tuple[SortedList, SortedList, SortedList]] = {}
        self._unused_of: dict[str, tuple[tuple[str, int, int, float], ...]] = {}
        self._unused_counts: dict[str, dict[int, int]] = {}
        self._unused_count_of: dict[str, tuple[tuple[str, int], ...]] = {}
        # vendor -> refusal class -> nodes (hami.core.refuse): nodes alike in every summary
        # field a refusal by a GPU too small reads (devices, all schedulable, models and modes,
        # devices with a free slot)
        self._classes: dict[str, dict[RefusalClass, set[str]]] = {}
        # vendor -> class -> its tag (a small int, unique among the vendor's live classes); vendor
        # -> node -> its class's tag: nodes mapped to their class without hashing the class
        self._class_tags: dict[str, dict[RefusalClass, int]] = {}
        self._tag_of: dict[str, dict[str, int]] = {}
        self._tag_clock = 0
        self._uuid_nodes: dict[str, set[str]] = {}  # device UUID -> the nodes that registered it
        self._class_of: dict[str, tuple[tuple[str, RefusalClass], ...]] = {}

    # ------------------------------------------------------------------ nodes
    def set_node(self, node: NodeDevices) -> None:
        """Add or replace a node's devices; usage is recomputed from the pods placed on it."""
        old = self._nodes.get(node.name)
        if old is None:
            self._names = None
        if old is None or old.node.devices != node.devices:
            self._device_generation += 1
        self._set_uuids(node.name, () if old is None else old.node.devices, node.devices)
        n = len(node.devices)
        st = self._nodes[node.name] = NodeState(
            node=node,
            used=[0] * n,
            usedmem=[0] * n,
            usedcores=[0] * n,
            index_of={d.id: i for i, d in enumerate(node.devices)},
            devices=node.devices,
            sliced=any(d.sliced for d in node.devices),
        )
        # (the node's side only: the pods' namespace usage is counted already, whatever becomes
        # of their node; counting it again inflated the quota on every re-registration)
        for key in sorted(self._pods_by_node.get(node.name, ())):
            self._apply(self._pods[key], +1, resummarise=False, namespace=False)
        self._recheck(st)
        st.resummarise()
        self._rank(st)
        self._touch(node.name)

    def remove_node(self, name: str) -> None:
        old = self._nodes.pop(name, None)
        if old is not None:
            self._names = None
            self._device_generation += 1
            self._set_uuids(name, old.node.devices, ())
            self._touch(name)
        self._versions.pop(name, None)
        self.ranking.remove(name)
        self._set_best(self._best, self._best_of, name, ())
        self._set_best(self._unused, self._unused_of, name, ())
        self._set_unused_counts(name, ())
        self._set_classes(name, ())

    @staticmethod
    def _set_best(
        index: dict[str, tuple[SortedList, SortedList, SortedList]],
        of: dict[str, tuple[tuple[str, int, int, float], ...]],
        name: str,
        best: tuple[tuple[str, int, int, float], ...],
    ) -> None:
        """Node ``name``'s ``(vendor, MiB, cores, percentage bound)`` entries in ``index`` (its
        previous ones, kept in ``of``, taken out)."""
        old = of.get(name, ())
        if old == best:
            return
        for vendor, mem, cores, pct in old:
            lists = index[vendor]
            lists[0].remove(mem)
            lists[1].remove(cores)
            lists[2].remove(pct)
            if not lists[0]:
                del index[vendor]
        for vendor, mem, cores, pct in best:
            into = index.get(vendor)
            if into is None:
                into = index[vendor] = (SortedList(), SortedList(), SortedList())
            into[0].add(mem)
            into[1].add(cores)
            into[2].add(pct)
        if best:
            of[name] = best
        else:
            of.pop(name, None)

    def _set_unused_counts(self, name: str, counts: tuple[tuple[str, int], ...]) -> None:
        old = self._unused_count_of.get(name, ())
        if old == counts:
            return
        for vendor, k in old:
            tally = self._unused_counts[vendor]
            tally[k] -= 1
            if not tally[k]:
                del tally[k]
                if not tally:
                    del self._unused_counts[vendor]
        for vendor, k in counts:
            tally = self._unused_counts.setdefault(vendor, {})
            tally[k] = tally.get(k, 0) + 1
        if counts:
            self._unused_count_of[name] = counts
        else:
            self._unused_count_of.pop(name, None)

    def _set_uuids(self, name: str, old: Sequence[DeviceInfo], new: Sequence[DeviceInfo]) -> None:
        for d in old:
            holders = self._uuid_nodes.get(d.id)
            if holders is not None:
                holders.discard(name)
                if not holders:
                    del self._uuid_nodes[d.id]
        for d in new:
            self._uuid_nodes.setdefault(d.id, set()).add(name)

    def uuid_nodes(self, uuids: Iterable[str]) -> set[str]:
        """The nodes that registered a device with one of ``uuids``."""
        out: set[str] = set()
        for u in uuids:
            out |= self._uuid_nodes.get(u, set())
        return out

    def _set_classes(self, name: str, keys: tuple[tuple[str, RefusalClass], ...]) -> None:
        old = self._class_of.get(name, ())
        if old == keys:
            return
        for vendor, key in old:
            group = self._classes[vendor]
            group[key].discard(name)
            if not group[key]:
                del group[key]
                del self._class_tags[vendor][key]
            del self._tag_of[vendor][name]
        for vendor, key in keys:
            self._classes.setdefault(vendor, {}).setdefault(key, set()).add(name)
            tags = self._class_tags.setdefault(vendor, {})
            tag = tags.get(key)
            if tag is None:
                self._tag_clock += 1
                tag = tags[key] = self._tag_clock
            self._tag_of.setdefault(vendor, {})[name] = tag
        if keys:
            self._class_of[name] = keys
        else:
            self._class_of.pop(name, None)

    def refusal_classes(self, vendor: str) -> Mapping[RefusalClass, Set[str]]:
        """Nodes with devices of ``vendor`` by :data:`RefusalClass` (read-only)."""
        return self._classes.get(vendor, {})

    def refusal_tags(self, vendor: str) -> tuple[Mapping[RefusalClass, int], Mapping[str, int]]:
        """``(class -> tag, node -> its class's tag)`` for the :meth:`refusal_classes` of
        ``vendor``: a tag is an int unique among the vendor's classes (read-only)."""
        return self._class_tags.get(vendor, {}), self._tag_of.get(vendor, {})

    def best_room(self, vendor: str) -> tuple[int, int] | None:
        """``(most MiB free, most cores free)`` on any one schedulable device of ``vendor`` with a
        free slot, over the whole cluster (each maximum on its own device); None when no such
        device exists."""
        lists = self._best.get(vendor)
        return None if lists is None else (lists[0][-1], lists[1][-1])

    def best_unused(self, vendor: str) -> tuple[int, int, float, int] | None:
        """``(most MiB free, most cores free, largest percentage bound, most devices)`` of the
        schedulable unused devices of ``vendor`` (a free slot, no use: what a ``mutex`` pod may
        take) over the whole cluster: the first three on any one device, the last on any one
        node, each maximum on its own; None when no such device exists."""
        lists, counts = self._unused.get(vendor), self._unused_counts.get(vendor)
        if lists is None or counts is None:
            return None
        return lists[0][-1], lists[1][-1], lists[2][-1], max(counts)

    def best_pct(self, vendor: str) -> float:
        """The largest :attr:`VendorSummary.max_pct_bound` of ``vendor`` over the cluster: a
        request of that percentage of a device's memory or more finds no device with a free slot
        and the memory anywhere (0.0 when no device of ``vendor`` has a free slot)."""
        lists = self._best.get(vendor)
        return 0.0 if lists is None else lists[2][-1]

    def _touch(self, name: str) -> None:
        self._generation += 1
        self._clock += 1
        self._versions[name] = self._clock
        self._log.append(name)
        if len(self._log) > 1 << 16:  # keep the recent half
            half = len(self._log) // 2
            del self._log[:half]
            self._log_base += half

    def clock(self) -> int:
        """The latest node version handed out (a node's version is the clock of its last change)."""
        return self._clock

    def generation(self) -> int:
        """A number that changes whenever anything a Filter's answer reads in the ledger may
        have: a node's devices, health, cordons or usage, a pod placed, reserved or removed
        (on a node or not: namespace usage), a quota or a DRA claim. Equal numbers: the same
        ledger for every decision (a cache of answers is valid while it holds)."""
        return self._generation

    def device_generation(self) -> int:
        """A number that changes whenever a node is added or removed or its device list
        changes (not its usage, nor a registration written again unchanged)."""
        return self._device_generation

    def changed_since(self, clock: int) -> set[str] | None:
        """The nodes changed after ``clock`` (added, removed, re-registered, usage); None when
        that is too long ago to tell."""
        if clock < self._log_base:
            return None
        return set(self._log[clock - self._log_base :])

    def versions(self) -> Mapping[str, int]:
        """``node -> version``: a node's version changes whenever anything a fit reads on it
        does (:mod:`hami.core.verdicts`). Read-only."""
        return self._versions

    def _rank(self, st: NodeState) -> None:
        s = st.summary
        vendors = sorted(s.vendors.items())
        self._set_classes(
            st.node.name,
            tuple((v, (vs.all, vs.devices == vs.all, vs.kinds, vs.free_slot, vs.unused)) for v, vs in vendors),
        )
        self._set_best(
            self._best,
            self._best_of,
            st.node.name,
            tuple((v, vs.max_free_mem, vs.max_free_cores, vs.max_pct_bound) for v, vs in vendors if vs.free_slot),
        )
        self._set_best(
            self._unused,
            self._unused_of,
            st.node.name,
            tuple(
                (v, vs.max_unused_mem, vs.max_unused_cores, vs.max_unused_pct_bound) for v, vs in vendors if vs.unused
            ),
        )
        self._set_unused_counts(st.node.name, tuple((v, vs.unused) for v, vs in vendors if vs.unused))
        self.ranking.update(
            st.node.name,
            (s.count, s.totalcore, s.totalmem, len(st.node.devices)),
            tuple(room(v, vs.max_free_mem, vs.max_free_cores) for v, vs in vendors if vs.free_slot),
            s.used,
            s.usedcores,
            s.usedmem,
        )

    @property
    def mask_vendors(self) -> frozenset[str]:
        """The vendors whose grants' cores are bitmasks of cores (``cores_are_masks``: AWS Neuron)."""
        return self._mask_vendors

    def node_names(self) -> list[str]:
        if self._names is None:
            self._names = sorted(self._nodes)
        return list(self._names)

    def node_set(self) -> Set[str]:
        """The node names, as a set view (read-only)."""
        return self._nodes.keys()

    def sorted_names(self) -> Sequence[str]:
        """The node names, sorted (shared, read-only: cheaper than :meth:`node_names`)."""
        if self._names is None:
            self._names = sorted(self._nodes)
        return self._names

    def has_node(self, name: str) -> bool:
        return name in self._nodes

    def unknown(self, names: set[str]) -> set[str]:
        """The names in ``names`` that are not nodes of the ledger."""
        return names.difference(self._nodes)

    def node(self, name: str) -> NodeDevices:
        return self._nodes[name].node

    def summary(self, name: str) -> NodeSummary:
        return self._nodes[name].summary

    def view(self, name: str) -> NodeView:
        st = self._nodes[name]
        return NodeView(
            name,
            st.devices,
            st.used[:],
            st.usedmem[:],
            st.usedcores[:],
            st.node.cordoned,
            st.node.pair_scores,
            dict(st.slices),
            {i: dict(held) for i, held in st.classes.items()} if st.classes else {},
        )

    def device_usage(self, name: str) -> Iterator[tuple[DeviceInfo, int, int, int]]:
        """``(device, used slots, used MiB, used cores)`` for every device of the node, by index order.
        ``device.health`` is False for a sliced device in an inconsistent state."""
        st = self._nodes[name]
        for i in sorted(range(len(st.devices)), key=lambda i: (st.devices[i].index, st.devices[i].id)):
            yield st.devices[i], st.used[i], st.usedmem[i], st.usedcores[i]

    def slices(self, name: str) -> dict[str, tuple[Slice, ...]]:
        """``uuid -> slices held on it`` (NVIDIA MIG reservations) for the node's devices."""
        st = self._nodes[name]
        return {st.node.devices[i].id: pieces for i, pieces in sorted(st.slices.items())}

    def _recheck(self, st: NodeState) -> None:
        if st.sliced or st.slices or any(self._pods[k].slices for k in self._pods_by_node.get(st.node.name, ())):
            st.recheck_slices(self._pods[k] for k in sorted(self._pods_by_node.get(st.node.name, ())))

    # ------------------------------------------------------------------ pods
    def add_pod(self, alloc: PodAllocation) -> None:
        """Record (or replace) a pod's allocation."""
        self.remove_pod(alloc.key)
        self._pods[alloc.key] = alloc
        self._pods_by_node.setdefault(alloc.node, set()).add(alloc.key)
        self._apply(alloc, +1)

    def reserve(self, alloc: PodAllocation) -> None:
        """Record a decision taken by Filter before the pod is patched (roll back with remove_pod)."""
        self.add_pod(alloc)
        self._reserved.add(alloc.key)

    def confirm(self, alloc: PodAllocation) -> bool:
        """End the reservation of a pod whose written allocation counts the same as what was
        reserved (node, namespace, per-device usage, slices, each container's picks): the record
        is replaced, the counts are not taken out and put back. False (nothing changed) when that
        does not hold: then :meth:`add_pod` is the way."""
        held = self._pods.get(alloc.key)
        if (
            held is None
            or alloc.key not in self._reserved
            or (held.node, held.namespace, held.usage, held.slices, held.classes)
            != (alloc.node, alloc.namespace, alloc.usage, alloc.slices, alloc.classes)
            # the namespace charge (usage.pod_peak) reads each container's picks, which the same
            # per-device usage does not pin down: removing the record gives back its own charge
            or (held.kinds, held.app_only, picks_of(held.devices))
            != (alloc.kinds, alloc.app_only, picks_of(alloc.devices))
        ):
            return False
        self._pods[alloc.key] = alloc
        self._reserved.discard(alloc.key)
        self._generation += 1  # reserved or not is part of what an answer read
        return True

    def is_reserved(self, key: str) -> bool:
        return key in self._reserved

    def remove_pod(self, key: str) -> PodAllocation | None:
        alloc = self._pods.pop(key, None)
        self._reserved.discard(key)
        if alloc is None:
            return None
        keys = self._pods_by_node.get(alloc.node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._pods_by_node[alloc.node]
        self._apply(alloc, -1)
        return alloc

    def pod(self, key: str) -> PodAllocation | None:
        return self._pods.get(key)

    def pods(self) -> list[PodAllocation]:
        return [self._pods[k] for k in sorted(self._pods)]

    def _apply(self, alloc: PodAllocation, sign: int, resummarise: bool = True, namespace: bool = True) -> None:
        """Add (``sign`` +1) or take out (-1) a pod's usage: its namespace's (unless ``namespace``
        is False) and its node's devices' (when the ledger holds the node)."""
        self._generation += 1
        if namespace:
            # the pod's peak over all its devices of a vendor (usage.pod_peak), as the fit's quota
            # check and the webhook count it: each device's own peak summed over-counted a pod
            # whose init container and app containers use different GPUs
            ns = self._ns_used.setdefault(alloc.namespace, {})
            picks = picks_of(alloc.devices)
            for vendor in sorted({u.vendor for u in alloc.usage}):
                mem, cores = pod_peak(picks, alloc.kinds, vendor, alloc.app_only, vendor in self._mask_vendors)
                acc = ns.setdefault(vendor, [0, 0])
                acc[0] += sign * mem
                acc[1] += sign * cores
            if sign < 0:
                self._prune_namespace(alloc.namespace)
        st = self._nodes.get(alloc.node)
        if st is None:
            return
        classes = alloc.classes
        for u in alloc.usage:
            i = st.index_of.get(u.uuid)
            if i is None:
                continue
            st.used[i] += sign * u.slots
            st.usedmem[i] += sign * u.mem
            st.usedcores[i] += sign * u.cores
            marks = classes.get(u.vendor) if classes else None
            for mark in marks.split(CLASS_SEPARATOR) if marks else ():
                held = st.classes.setdefault(i, {})
                n = held.get(mark, 0) + sign
                if n > 0:
                    held[mark] = n
                else:
                    held.pop(mark, None)
                    if not held:
                        del st.classes[i]
        if resummarise:
            self._touch(alloc.node)
            if st.sliced or st.slices or alloc.slices:
                self._recheck(st)
            st.resummarise()
            self._rank(st)

    # ------------------------------------------------------------------ DRA claims
    def set_claim(self, key: str, namespace: str, vendor: str, mem: int, cores: int) -> None:
        """Count what a claim allocated on the DRA front end (``hami.dra.claims``) against its
        namespace's quota, beside the pods' allocations. Per device placement is kube-scheduler's
        on that path, so only the namespace totals are kept here."""
        self.remove_claim(key)
        self._generation += 1
        self._claims[key] = (namespace, vendor, mem, cores)
        acc = self._ns_used.setdefault(namespace, {}).setdefault(vendor, [0, 0])
        acc[0] += mem
        acc[1] += cores

    def remove_claim(self, key: str) -> None:
        old = self._claims.pop(key, None)
        if old is not None:
            self._generation += 1
            ns, vendor, mem, cores = old
            acc = self._ns_used.setdefault(ns, {}).setdefault(vendor, [0, 0])
            acc[0] -= mem
            acc[1] -= cores
            self._prune_namespace(ns)

    def _prune_namespace(self, namespace: str) -> None:
        """Forget a namespace's usage once it holds nothing (namespaces come and go: CI makes
        thousands a day, and each kept its zeros)."""
        used = self._ns_used.get(namespace)
        if used is not None and not any(mem or cores for mem, cores in used.values()):
            del self._ns_used[namespace]

    def claim_keys(self) -> list[str]:
        return sorted(self._claims)

    # ------------------------------------------------------------------ quota (§10.1)
    def set_quota(self, namespace: str, name: str, hard: Mapping[str, Any], vendors: Sequence[Any]) -> None:
        """Replace one ResourceQuota's limits atomically. Only ``limits.<memory|cores resource>``.

        A fractional limit (``1500m``, ``7.5``) counts as its whole part: usage is whole MiB and
        cores, so ``used <= 7.5`` is ``used <= 7``. A value that cannot be read at all is left
        out and the quota's other limits still apply; QuantityError names it afterwards (dropping
        the whole quota for one such value lifted its every limit)."""
        tracked = {}
        for v in vendors:
            r = v.resources
            if r.memory:
                # MiB per unit: the request factor, and for a vendor whose pods ask in GiB that it
                # converts itself (MetaX sGPU, Enflame DRS) the quota-only factor too
                tracked[f"limits.{r.memory}"] = getattr(r, "quota_unit", r.memory_factor)
            if r.cores:
                tracked[f"limits.{r.cores}"] = 1
        limits: dict[str, int] = {}
        bad: list[str] = []
        for key, val in hard.items():
            factor = tracked.get(key)
            if factor is None:
                continue
            try:
                exact = parse_quantity(val, f"ResourceQuota {namespace}/{name} spec.hard.{key}")
            except QuantityError as exc:
                bad.append(str(exc))
                continue
            limits[key[len("limits.") :]] = math.floor(exact * factor)
        self._quota.setdefault(namespace, {})[name] = limits
        self._generation += 1
        if bad:
            raise QuantityError("; ".join(bad) + " (left out; the quota's other limits apply)")

    def remove_quota(self, namespace: str, name: str) -> None:
        quotas = self._quota.get(namespace)
        if quotas is not None and quotas.pop(name, None) is not None:
            self._generation += 1
            if not quotas:
                del self._quota[namespace]

    def namespace_usage(self, namespace: str, vendor: str) -> tuple[int, int]:
        mem, cores = self._ns_used.get(namespace, {}).get(vendor, (0, 0))
        return mem, cores

    def quota_limits(self, namespace: str, name: str) -> dict[str, int] | None:
        """One ResourceQuota's tracked limits (``resource -> limit``, memory in MiB after the
        vendor's factor); None when the ledger holds no such quota. A copy: read-only views."""
        limits = self._quota.get(namespace, {}).get(name)
        return None if limits is None else dict(limits)

    def quota_room(self, namespace: str, vendors: Sequence[Any]) -> QuotaRoom | None:
        """Remaining ``(mem, cores)`` per vendor for ``namespace``; None when it has no quota."""
        quotas = self._quota.get(namespace)
        if not quotas:
            return None
        room: dict[str, tuple[int | None, int | None]] = {}
        for v in vendors:
            mem_used, core_used = self.namespace_usage(namespace, v.name)
            mem_lim = _min_limit(quotas, v.resources.memory)
            core_lim = _min_limit(quotas, v.resources.cores)
            room[v.name] = (
                None if mem_lim is None else mem_lim - mem_used,
                None if core_lim is None else core_lim - core_used,
            )
        if all(r == (None, None) for r in room.values()):
            return None
        return QuotaRoom(room, self._mask_vendors.intersection(room))


def quota_admission_check(ledger: Ledger, pod: PodRequest, vendors: Sequence[Any]) -> str | None:
    """The webhook's ``fitResourceQuota`` (§10.1): None when the pod's effective request fits
    the namespace quota, else a message naming the resource. Per vendor, the request is
    max(Σ regular + sidecar containers, max over classic init containers of init + earlier
    sidecars) of ``memreq × nums`` and ``coresreq × nums``; percentage memory counts as 0."""
    for v in vendors:
        room = ledger.quota_room(pod.namespace, [v])
        if room is None:
            continue
        mem_room, core_room = room.room.get(v.name, (None, None))
        if not getattr(v, "admission_quota_cores", True):
            core_room = None  # a unit only the chosen device gives (AMD's CUs): Filter checks it
        steady, side, peak = [0, 0], [0, 0], [0, 0]
        for c in pod.containers:
            r = c.for_vendor(v.name)
            amount = [r.memreq * r.nums, r.coresreq * r.nums] if r else [0, 0]
            if c.kind is ContainerKind.INIT:
                peak = [max(p, a + s) for p, a, s in zip(peak, amount, side)]
                continue
            steady = [x + a for x, a in zip(steady, amount)]
            if c.kind is ContainerKind.SIDECAR:
                side = [x + a for x, a in zip(side, amount)]
        mem, cores = (max(x, y) for x, y in zip(steady, peak))
        if mem_room is not None and mem > mem_room:
            return (
                f"exceeding resource quota: namespace {pod.namespace} {v.resources.memory} "
                f"request {mem} > remaining {mem_room}"
            )
        if core_room is not None and cores > core_room:
            return (
                f"exceeding resource quota: namespace {pod.namespace} {v.resources.cores} "
                f"request {cores} > remaining {core_room}"
            )
    return None


def _min_limit(quotas: Mapping[str, Mapping[str, int]], resource: str) -> int | None:
    values = [q[resource] for q in quotas.values() if resource and resource in q]
    return min(values) if values else None


# ---------------------------------------------------------------------- from Kubernetes objects


def node_devices_from_object(node: Mapping[str, Any], vendors: Iterable[Any]) -> NodeDevices:
    """A Node dict -> :class:`NodeDevices` (every vendor's registration). Raises CodecError,
    whatever is wrong: a field of the wrong type, an annotation that does not parse, or a vendor
    parser failing in any other way (a registration that cannot be read is a malformed one).
    The strict reading (``hami simulate``, the decoders' tests); the scheduler reads a node with
    :func:`read_node_devices`, which leaves out the unreadable vendors only."""
    devices, errors = read_node_devices(node, vendors)
    if errors:
        raise CodecError(next(iter(errors.values())))
    return devices


#: the largest slot count, memory (MiB) or cores a registered device may state: Go's int32, as
#: HAMi's own registrations are; what every vendor's parser yields is checked against it here
#: (a 400-digit capacity of one vendor made node scoring raise OverflowError for every pod)
MAX_DEVICE_AMOUNT = 2**31 - 1


def _out_of_range(devices: Sequence[DeviceInfo]) -> str | None:
    """Why one of ``devices`` states an amount no GPU has (None when none does)."""
    for d in devices:
        for field_name in ("count", "devmem", "devcore"):
            value = getattr(d, field_name)
            if not isinstance(value, int) or not 0 <= value <= MAX_DEVICE_AMOUNT:
                shown = (
                    value
                    if not isinstance(value, int) or value.bit_length() < 64
                    else f"a {value.bit_length()}-bit number"
                )
                return f"device {d.id!r}: {field_name} must be in 0..{MAX_DEVICE_AMOUNT}, got {shown}"
    return None


def read_node_devices(node: Mapping[str, Any], vendors: Iterable[Any]) -> tuple[NodeDevices, dict[str, str]]:
    """A Node dict -> ``(its devices, {vendor: why its registration was left out})``.

    As HAMi's RegisterFromNodeAnnotations, one vendor whose registration cannot be read (an
    annotation that does not parse, a field of the wrong type, a device listed twice, its parser
    failing in any other way) loses its devices on the node, and only it: the other vendors'
    devices are returned. A device id that two vendors register is left out with both (no grant
    could tell which device it names). The messages begin with ``node NAME:`` and name the
    annotation (or the vendor). Raises CodecError when the Node object itself is of the wrong
    shape (no vendor's registration can be told apart then)."""
    meta = node.get("metadata") if isinstance(node, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    label = f"node {name}" if isinstance(name, str) and name else "node"
    try:
        check_node(node, label)
    except CoreError as exc:
        raise CodecError(str(exc)) from None
    if not isinstance(meta, Mapping):  # check_node refused it already; said again for the type checker
        raise CodecError(f"{label}: metadata must be an object")
    if not name:
        raise CodecError("node without metadata.name")
    vendors = tuple(vendors)  # read twice: the registrations, then the cordon list's IDs
    errors: dict[str, str] = {}
    read: list[tuple[str, tuple[DeviceInfo, ...], dict[str, dict[str, int]]]] = []
    for v in vendors:
        vendor = str(getattr(v, "name", v))
        try:
            found = tuple(v.node_devices(node))
            pairs = dict(v.pair_scores(node))
        except CoreError as exc:
            errors[vendor] = f"node {name}: {exc}"
            continue
        except (ArithmeticError, LookupError, TypeError, AttributeError, ValueError, RecursionError) as exc:
            errors[vendor] = (
                f"node {name}: vendor {vendor!r} cannot read its registration ({type(exc).__name__}: {str(exc)[:120]})"
            )
            continue
        if len(found) > MAX_NODE_DEVICES:
            errors[vendor] = f"node {name}: {len(found)} devices registered, more than {MAX_NODE_DEVICES}"
            continue
        seen: set[str] = set()
        twice = None
        for d in found:
            if d.id in seen:
                twice = d.id
                break
            seen.add(d.id)
        if twice is not None:
            errors[vendor] = f"node {name}: device id {twice!r} is registered twice"
            continue
        if (huge := _out_of_range(found)) is not None:
            errors[vendor] = f"node {name}: {huge}"
            continue
        read.append((vendor, found, pairs))
    owners: dict[str, list[str]] = {}
    for vendor, found, _ in read:
        for d in found:
            owners.setdefault(d.id, []).append(vendor)
    for device_id, names in owners.items():
        if len(names) > 1:
            for vendor in names:
                errors.setdefault(
                    vendor, f"node {name}: device id {device_id!r} is registered twice ({' and '.join(names)})"
                )
    devices: list[DeviceInfo] = []
    pair_scores: dict[str, dict[str, int]] = {}
    for vendor, found, pairs in read:
        if vendor not in errors:
            devices.extend(found)
            pair_scores.update(pairs)
    cordon = (meta.get("annotations") or {}).get(CORDON_ANNOTATION, "")
    readers = [v.read_device_id for v in vendors if hasattr(v, "read_device_id")]
    return (
        NodeDevices(
            name=name,
            devices=tuple(devices),
            cordoned=frozenset(_current_id(p.strip(), readers) for p in cordon.split(",") if p.strip()),
            pair_scores=pair_scores,
        ),
        errors,
    )


def _current_id(device_id: str, readers: Sequence[Any]) -> str:
    """``device_id`` in today's spelling (the first vendor that rewrites it; an ID our earlier
    releases wrote for a vendor whose IDs changed), else as written."""
    for read in readers:
        now = read(device_id)
        if now != device_id:
            return now
    return device_id


def init_containers_may_run_again(spec: Mapping[str, Any]) -> bool:
    """Whether the kubelet may run a pod's classic init containers again while the pod lives,
    with the grants they were given: a new pod sandbox (a node reboot, the pause process killed
    from a container sharing its process namespace) re-runs them in a pod whose
    ``restartPolicy`` is not ``Never``, and a container's ``restartPolicyRules`` can restart all
    of the pod's containers, init ones first (RestartAllContainersOnContainerExits, beta and on
    since Kubernetes 1.36), whenever the tenant likes. A regular container with a
    ``restartPolicy`` of its own (ContainerRestartRules) counts too: the kubelet may then keep
    the pod going through a new sandbox. Kubernetes itself holds an init container's CPU and
    memory requests for the pod's whole life."""
    if spec.get("restartPolicy") != "Never":
        return True
    if any(c.get("restartPolicyRules") for c in spec.get("initContainers") or () if isinstance(c, Mapping)):
        return True
    return any(
        c.get("restartPolicyRules") or c.get("restartPolicy") not in (None, "Never")
        for c in spec.get("containers") or ()
        if isinstance(c, Mapping)
    )


def init_containers_done(pod: Mapping[str, Any]) -> bool:
    """True when every classic init container terminated with exit code 0 and cannot run again
    (:func:`init_containers_may_run_again`): the pod's usage may shrink to its steady phase.
    (HAMi shrinks it whatever the restart policy: a re-run init container then used GPU memory
    another pod had been given since.)"""
    spec = pod.get("spec") or {}
    if init_containers_may_run_again(spec):
        return False
    classic = [c.get("name") for c in spec.get("initContainers") or () if c.get("restartPolicy") != "Always"]
    if not classic:
        return False
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("initContainerStatuses") or ()}
    for name in classic:
        term = ((statuses.get(name) or {}).get("state") or {}).get("terminated") or {}
        if term.get("exitCode") != 0 or not term:
            return False
    return True


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return meta.get("uid") or f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def make_allocation(
    pod: Mapping[str, Any],
    node: str,
    devices: Mapping[str, PodSingleDevice],
    slices: tuple[Slice, ...] | None = None,
    vendors: Iterable[Any] = (),
) -> PodAllocation:
    """A pod's allocation; ``slices`` default to those recorded on the container devices. The
    pod's class on each of ``vendors`` it holds devices of (the vendor's ``holder_class`` of its
    annotations) is recorded when the vendor names one."""
    meta = pod.get("metadata") or {}
    kinds = tuple(k for _, k in ordered_containers(pod))
    done = init_containers_done(pod)
    if slices is None:
        slices = tuple(cd.slice for v in sorted(devices) for ctr in devices[v] for cd in ctr if cd.slice is not None)
    return PodAllocation(
        key=pod_key(pod),
        namespace=meta.get("namespace") or "default",
        name=meta.get("name") or "",
        node=node,
        devices=dict(devices),
        kinds=kinds,
        usage=collapse(devices, kinds, app_only=done),
        slices=slices,
        classes=holder_classes(meta.get("annotations") or {}, devices, vendors),
        app_only=done,
    )


#: Between the marks of one pod on one vendor's devices in :attr:`PodAllocation.classes` (a
#: vendor's ``holder_class`` may name several: MetaX sGPU's app class and QoS policy). A mark
#: containing it is dropped (marks come from pod annotations: one must not forge two).
CLASS_SEPARATOR = "\n"


def holder_classes(
    annotations: Mapping[str, str], devices: Mapping[str, PodSingleDevice], vendors: Iterable[Any]
) -> dict[str, str]:
    """``vendor -> class`` for each of ``vendors`` whose devices the pod holds and whose
    ``holder_class`` puts the pod (by its annotations and its grants of that vendor) in one or
    more (several marks joined by :data:`CLASS_SEPARATOR`; the ledger counts each on every device
    the pod holds)."""
    out: dict[str, str] = {}
    for v in vendors:
        name = str(getattr(v, "name", ""))
        read = getattr(v, "holder_class", None)
        if name in devices and read is not None and any(devices[name]):
            got = read(annotations, devices[name])
            marks = (got,) if isinstance(got, str) else tuple(got or ())
            kept = [str(m) for m in marks if m and CLASS_SEPARATOR not in str(m)]
            if kept:
                out[name] = CLASS_SEPARATOR.join(dict.fromkeys(kept))
    return out


def allocation_from_pod(pod: Mapping[str, Any], vendors: Iterable[Any]) -> PodAllocation | None:
    """Rebuild a pod's allocation from its annotations; None when it holds nothing.

    Pods in phase Succeeded/Failed hold nothing, nor a pod being deleted that is not bound (the
    API server binds no such pod: a decision written at Filter, ``decisionWrite: filter``, held
    its GPUs for as long as a finalizer kept the pod; found by review, 1 Dec). Raises CodecError
    on a malformed annotation.
    Allocations HAMi's earlier releases wrote are read as they meant them: one entry per regular
    container only (:func:`init_offset`), only the entries of the containers given devices
    (:func:`entry_layout`), MIG grants named ``UUID[template-slot]`` (:func:`_parent_ids`).
    """
    vendors = tuple(vendors)  # read twice: the allocations, then the pod's classes
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    node = annotations.get(NODE_ANNOTATION)
    if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    if meta.get("deletionTimestamp") and not (pod.get("spec") or {}).get("nodeName"):
        return None
    devices: dict[str, PodSingleDevice] = {}
    slices: list[Slice] = []
    for v in vendors:
        text = annotations.get(v.allocated_annotation)
        if text is None:
            continue
        try:
            decoded = _parent_ids(v.read_allocation(decode_pod_devices(text), annotations))
        except CodecError as exc:
            raise CodecError(f"pod {pod_name(pod)}: annotation {v.allocated_annotation}: {exc}") from None
        asks, inits = container_asks(pod, v)
        layout = entry_layout(decoded, inits, asks)
        devices[v.name] = tuple(layout.place(decoded, tuple))
        try:
            found = v.read_slices(annotations)
        except CodecError as exc:
            raise CodecError(f"pod {pod_name(pod)}: {exc}") from None
        if layout.moves:
            found = tuple((layout.container(ci), di, piece) for ci, di, piece in found)
        devices[v.name] = _attach_slices(devices[v.name], found)
        slices.extend(piece for _, _, piece in found)
    if not devices:
        return None
    return make_allocation(pod, node, devices, tuple(slices), vendors)


def init_offset(devices: PodSingleDevice, inits: int, asks: Sequence[bool | None]) -> int:
    """How many empty entries to put before an allocation written without its init containers'.

    HAMi wrote one entry per regular container until its releases counted init containers too
    (``Resourcereqs`` over ``pod.Spec.Containers`` only); today's writers, ours and HAMi's newer
    ones, write one per container, init containers first, but HAMi v2.10 writes the entries of
    the containers given devices only (:func:`entry_layout`). So the entry count alone does not
    tell the layouts apart: the entries that name devices do. Read in today's order, each
    must fall on a container that asks for the vendor's resources; when one does not and, read
    past the init containers, each falls on a regular container that asks, the allocation is the
    old layout (read in today's order, an older pod's first regular container passed for its init
    container, and once the init containers had finished the pod held nothing). Anything else is
    read in today's order, as before. ``asks``: per container, init containers first (``inits`` of
    them), whether it asks for the vendor's devices (:func:`container_asks`, a count above 0:
    :func:`asks_devices`); None where that cannot be told
    (a vendor without resource names), and then the count alone decides."""
    regular = len(asks) - inits
    if not inits or not devices or len(devices) > regular:
        return 0
    if any(a is None for a in asks):
        return inits
    granted = [i for i, ctr in enumerate(devices) if any(cd.uuid for cd in ctr)]  # (not UUID-less padding)
    if all(asks[i] for i in granted):
        return 0
    return inits if all(asks[inits + i] for i in granted) else 0


@dataclass(frozen=True, slots=True)
class EntryLayout:
    """Which container each entry of one vendor's decoded allocation is for
    (:func:`entry_layout`): ``owners[i]`` is entry ``i``'s container (its index, init containers
    first); without owners, entry ``i`` is container ``i + shift`` (today's layout, ``shift`` 0,
    or the old one without init containers, :func:`init_offset`)."""

    owners: tuple[int, ...] | None = None
    shift: int = 0

    @property
    def moves(self) -> bool:
        """Whether any entry is for another container than its position says."""
        return bool(self.shift) or (self.owners is not None and self.owners != tuple(range(len(self.owners))))

    def container(self, entry: int) -> int:
        """The container entry ``entry`` is for (a MIG reservation's ``containerIndex`` counts
        entries as its grant does, so it maps the same way)."""
        if self.owners is not None and 0 <= entry < len(self.owners):
            return self.owners[entry]
        return entry + self.shift

    def place(self, entries: Sequence[_E], empty: Callable[[], _E]) -> list[_E]:
        """``entries`` one per container (``empty()`` for a container without one), up to the
        last container given one."""
        where = [self.container(i) for i in range(len(entries))]
        out = [empty() for _ in range(max(where, default=-1) + 1)]
        for i, entry in zip(where, entries):
            out[i] = entry
        return out


def entry_layout(devices: PodSingleDevice, inits: int, asks: Sequence[bool | None]) -> EntryLayout:
    """Which container each entry of ``devices`` (one vendor's decoded allocation) is for; the one
    rule of every reader (the scheduler's ledger, the device plugin's Allocate, the NRI hook, the
    monitor).

    Read in today's order (one entry per container, init containers first) when every entry that
    names a device (a UUID: an entry of UUID-less padding names none) falls on a container that
    asks for the vendor, and as :func:`init_offset`'s old layout where that rule applies.
    Otherwise, when as many entries name devices as there are containers asking for the vendor,
    the ``k``-th such entry is the ``k``-th asking container's: HAMi v2.10's scheduler pads a
    container that asks for no device under the node's device model types
    (``NVIDIA-A100-SXM4-80GB``), not under ``NVIDIA`` (pkg/scheduler/score.go,
    allocateAppContainers / allocateInitContainers), and the NVIDIA ``PatchAnnotations`` encodes
    only the ``NVIDIA`` list: a pod it placed carries the entries of its GPU containers alone, in
    container order, which HAMi's device plugin pops first non-empty first. Read in today's
    order, such an entry went to the pod's first container (an init container, a sidecar): the
    scheduler counted it while that container ran and nothing after (found by review, 1 Dec).
    The other entries (empty, padding) go to the containers that ask for nothing, in order. Such a
    list is shorter than the pod's containers (one entry per container is today's layout, read in
    its order). Anything else is read in today's order. ``asks`` as for :func:`init_offset` (None where it
    cannot be told: then the entries stay in order); asking is what is given an entry, a count
    above 0 (:func:`asks_devices`, :func:`vendor_asks`), for every reader alike."""
    shift = init_offset(devices, inits, asks)
    if shift or any(a is None for a in asks) or len(devices) >= len(asks):
        return EntryLayout(shift=shift)
    named = [i for i, ctr in enumerate(devices) if any(cd.uuid for cd in ctr)]
    if all(asks[i] for i in named):
        return EntryLayout()
    asking = [i for i, a in enumerate(asks) if a]
    if len(named) != len(asking):
        return EntryLayout()
    owner = dict(zip(named, asking))
    rest = iter([i for i, a in enumerate(asks) if not a])
    return EntryLayout(owners=tuple(owner[i] if i in owner else next(rest) for i in range(len(devices))))


def asks_devices(limits: Mapping[str, Any], requests: Mapping[str, Any], count: str) -> bool:
    """Whether a container with these ``limits`` and ``requests`` asks for devices of a vendor whose
    count resource is ``count`` (``nvidia.com/gpu``): its count, the limit or else the request
    (as the vendors' request parsers read it; the API server requires the limit of an extended
    resource and a request equal to it), read as a whole quantity, is above 0.

    The one predicate of every reader of an allocation (:func:`entry_layout`: the ledger, through
    the vendor's own parser, :func:`container_asks`; the device plugin's Allocate, the NRI hook,
    the monitor), and how entries are given: HAMi's scheduler and ours give one only to a
    container whose count is above 0 (``nums == 0``: no request). Before, each reader judged by
    another rule (any of the vendor's names present; the count named in the limits), and an init
    container with ``nvidia.com/gpu: "0"``, or with ``nvidia.com/gpumem`` and no count (HAMi's
    webhook adds the default count to regular containers only), took the GPU container's entry
    for one reader and not another (found by review, 1 Dec). A count that is not a whole
    quantity, or is negative, asks for nothing (HAMi's ``AsInt64`` gives no request; our
    scheduler refuses such a pod)."""
    if not count:
        return False
    raw = limits[count] if count in limits else requests.get(count)
    if raw is None:
        return False
    try:
        return parse_int_quantity(raw, count) > 0
    except QuantityError:
        return False


def _resources_of(container: Any) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    r = (container.get("resources") or {}) if isinstance(container, Mapping) else {}
    r = r if isinstance(r, Mapping) else {}
    limits, requests = r.get("limits") or {}, r.get("requests") or {}
    return (limits if isinstance(limits, Mapping) else {}), (requests if isinstance(requests, Mapping) else {})


def vendor_asks(container: Any, vendor: Any, where: str = "") -> bool | None:
    """Whether ``container`` (a pod spec's container dict) asks for ``vendor``'s devices: the
    vendor's own per-container request parser (``container_request``, what the scheduler builds
    the container's request with) returns a request for it. None for a vendor without resource
    names (it cannot be told). A container the parser refuses (a malformed value) is judged by
    its count alone (:func:`asks_devices`), as the device plugin and the monitor judge it."""
    names = getattr(vendor, "resources", None)
    count = str(getattr(names, "count", "") or "")
    if not getattr(names, "asking", None):
        return None
    parse = getattr(vendor, "container_request", None)
    if parse is None or not isinstance(container, Mapping):
        return asks_devices(*_resources_of(container), count)
    try:
        return parse(container, where or f"container {container.get('name')!r}") is not None
    except CoreError:
        return asks_devices(*_resources_of(container), count)


def container_asks(pod: Mapping[str, Any], vendor: Any) -> tuple[tuple[bool | None, ...], int]:
    """Per container of ``pod`` (init containers first), whether it asks for ``vendor``'s devices
    (:func:`vendor_asks`; None for each when there are no resource names to tell by); and how
    many init containers there are. For :func:`init_offset` and :func:`entry_layout`.

    ``vendor`` may also be a set of count resource names (a container asks when one of them is
    above 0, :func:`asks_devices`; an empty set: None for each)."""
    spec = pod.get("spec") or {}
    inits, regular = list(spec.get("initContainers") or ()), list(spec.get("containers") or ())
    containers = inits + regular
    if isinstance(vendor, Set) and not isinstance(vendor, str):
        if not vendor:
            return (None,) * len(containers), len(inits)
        return tuple(any(asks_devices(*_resources_of(c), n) for n in vendor) for c in containers), len(inits)

    def where(i: int, c: Any) -> str:
        name = c.get("name") if isinstance(c, Mapping) else None
        return f"pod {pod_name(pod)} container {name or i!r}"

    return tuple(vendor_asks(c, vendor, where(i, c)) for i, c in enumerate(containers)), len(inits)


def _parent_ids(devices: PodSingleDevice) -> PodSingleDevice:
    """HAMi's MIG grants before ``hami.io/vgpu-mig-allocations`` named the instance as
    ``<GPU UUID>[<template>-<slot>]``; HAMi counts them on the GPU before the ``[`` (its usage
    pass cuts the ID there), and so does the ledger: kept whole, the ID matched no device and the
    GPU looked free under a running MIG instance."""
    if not any("[" in cd.uuid for ctr in devices for cd in ctr):
        return devices
    return tuple(
        tuple(replace(cd, uuid=cd.uuid.split("[", 1)[0]) if "[" in cd.uuid else cd for cd in ctr) for ctr in devices
    )


def _attach_slices(devices: PodSingleDevice, found: Sequence[tuple[int, int, Slice]]) -> PodSingleDevice:
    """Record each slice on the container device it names (same position, same UUID). A slice
    that names no such device still counts as held on its GPU (see the ledger's consistency rule)."""
    if not found:
        return devices
    out = [list(ctr) for ctr in devices]
    for ci, di, piece in found:
        if ci < len(out) and di < len(out[ci]) and out[ci][di].uuid == piece.uuid:
            out[ci][di] = replace(out[ci][di], slice=piece)
    return tuple(tuple(ctr) for ctr in out)


def rebuild(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    vendors: Sequence[Any],
    quotas: Iterable[Mapping[str, Any]] = (),
) -> tuple[Ledger, list[str]]:
    """A ledger from Kubernetes objects. Returns ``(ledger, warnings)``; bad objects are skipped,
    and so are the devices of a vendor whose registration on a node cannot be read (the node
    keeps the other vendors' devices; with none left, the node is skipped)."""
    ledger = Ledger(vendors)
    warnings: list[str] = []
    for node in nodes:
        try:
            devices, errors = read_node_devices(node, vendors)
        except CoreError as exc:
            warnings.append(f"skipping node: {exc}")
            continue
        if errors and not devices.devices:
            warnings.extend(f"skipping node: {message}" for message in errors.values())
            continue
        warnings.extend(f"skipping the {vendor} devices: {message}" for vendor, message in errors.items())
        ledger.set_node(devices)
    for pod in pods:
        try:
            alloc = allocation_from_pod(pod, vendors)
        except CoreError as exc:
            warnings.append(f"skipping pod: {exc}")
            continue
        if alloc is not None:
            ledger.add_pod(alloc)
    for q in quotas:
        meta = q.get("metadata") or {}
        try:
            ledger.set_quota(
                meta.get("namespace") or "default",
                meta.get("name") or "",
                (q.get("spec") or {}).get("hard") or {},
                vendors,
            )
        except CoreError as exc:  # (the quota's readable limits apply)
            warnings.append(f"ignoring {exc}")
    return ledger, warnings
