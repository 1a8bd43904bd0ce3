"""Kunlunxin XPUs: whole cards (HAMi backend ``kunlun``) and vXPU slices (HAMi backend ``XPU``).

Facts: §3.4, §4.1, §4.5, §7.1 ``kunlun``, §8.2, §8.3.

Whole cards: ``kunlunxin.com/xpu`` from node capacity (IDs ``<node>-kunlun-<i>``, 98304 MiB; cards
with index >= cards/2 are on NUMA 1). A card is never shared. HAMi's topology (``graghSelect``):
each eight cards form two fully linked groups of four, ``0-3`` and ``4-7``, joined only by the
links ``0-4``, ``1-5``, ``2-6``, ``3-7``. A request of 1, 2 or 4 cards takes them inside one group,
the group whose free cards equal the request or exceed it least (for one card: a group with 1,
then 3, then 2, then 4 free, keeping pairs whole); when no group holds it, 2 cards take a linked
pair across groups (``i``, ``i+4``) and 4 cards one of HAMi's cross-group rings (``0-1-4-5``,
``2-3-6-7``, ``0-2-4-6``, ``1-3-5-7``, ``0-3-4-7``, ``1-2-5-6``), else the node does not fit
(``NumaNotFit``, as HAMi). 8 cards take a whole eight; other counts (HAMi refuses them) the
free cards of lowest index. The node score adds 3000 / 2000 / 1000 / 0 when the pod removes / keeps /
adds one / adds several "bubbles" (groups of four left partly used). Decision annotation
``BAIDU_COM_DEVICE_IDX`` lists the card indexes. No node lock.

vXPU: registration ``hami.io/node-register-xpu`` (JSON); ``kunlunxin.com/vxpu-memory`` is rounded
up to 24576, 49152 or 98304 MiB (admission writes the rounded value to limits and requests) and
takes ``memory x 100 / 98304`` percent of the cores; no memory means the whole card. A card that
already holds vXPUs takes only vXPUs of that same size (``CardNotFoundCustomFilterRule``). The
cards are chosen as whole cards are (HAMi runs the same ``graghSelect``), among those that can take
one more vXPU of the size asked.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hami.config import KunlunConfig
from hami.core.errors import RequestError
from hami.core.names import NODE_LOCK, node_handshake
from hami.core.reasons import Reason
from hami.core.types import ContainerDeviceRequest, DeviceInfo, PodSingleDevice

from .base import BaseVendor, ResourceNames, lookup
from .common import capacity, present, set_both, synth_cards, where_of, whole_card_request

CARD_MEMORY = 98304
VXPU_SIZES = (24576, 49152, 98304)
INDEX_ANNOTATION = "BAIDU_COM_DEVICE_IDX"


#: HAMi's ``InterGroupConnection2``: the 4-card rings across the two groups of an eight, in its order
CROSS_RINGS = ((0, 1, 4, 5), (2, 3, 6, 7), (0, 2, 4, 6), (1, 3, 5, 7), (0, 3, 4, 7), (1, 2, 5, 6))
#: HAMi tries the groups whose free cards number these, in order (one card: odd counts first)
_GROUP_ORDER = {1: (1, 3, 2, 4), 2: (2, 3, 4), 4: (4,)}


def interconnect_group(index: int) -> int:
    """The fully linked group of four a card belongs to: 0-3 -> 0, 4-7 -> 1, 8-11 -> 2, ..."""
    return index // 4


def _linked(a: int, b: int) -> bool:
    """Whether two cards have a direct link: same group of four, or partners across (i, i+4)."""
    return interconnect_group(a) == interconnect_group(b) or (a // 8 == b // 8 and abs(a - b) == 4)


class KunlunVendor(BaseVendor):
    name = "kunlun"
    request_type = "kunlun"
    allocated_annotation = "hami.io/kunlun-allocated"
    to_allocate_annotation = None
    lock_annotation = None
    use_uuid_annotation = "baidu.com/use-gpuuuid"
    nouse_uuid_annotation = "baidu.com/nouse-gpuuuid"
    decision_annotations = (INDEX_ANNOTATION,)
    chooses = True
    node_score_neutral = False

    def __init__(self, config: KunlunConfig | None = None) -> None:
        c = self.config = config or KunlunConfig()
        super().__init__(ResourceNames(count=c.resource_count_name))

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        cards = capacity(node, self.resources.count)
        return (
            synth_cards(
                node,
                self.name,
                "kunlun",
                cards,
                count=100,
                devmem=CARD_MEMORY,
                devcore=100,
                type_=self.name,
                numa_split=True,
                source=self.resources.count,
            )
            if cards > 0
            else ()
        )

    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        return whole_card_request(self, container, where)

    def capacity_check(self, device, used, usedmem, usedcores, request, mem, mutex, quota_fits):
        if used > 0:  # whole cards only
            return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
        return super().capacity_check(device, used, usedmem, usedcores, request, mem, mutex, quota_fits)

    def choose(
        self,
        devices: Sequence[DeviceInfo],
        request: ContainerDeviceRequest,
        candidates: Sequence[int],
        prior: Sequence[str],
    ) -> Sequence[int] | Reason:
        # HAMi walks the free cards in index order (they are all alike: nothing else to rank them by)
        return graph_select(devices, sorted(candidates, key=lambda j: devices[j].index), request.nums)

    def node_score(self, node: str, devices: PodSingleDevice, policy: str, view: Any = None) -> float:
        """3000 / 2000 / 1000 / 0 when the pod removes / keeps / adds one / adds several "bubbles"
        (interconnect groups left partly used)."""
        if view is None:
            return 0.0
        mine = [(d, view.used[i] > 0) for i, d in enumerate(view.devices) if d.vendor == self.name]
        taken = {cd.uuid for ctr in devices for cd in ctr}
        before = _bubbles([(d, busy) for d, busy in mine])
        after = _bubbles([(d, busy or d.id in taken) for d, busy in mine])
        delta = after - before
        return 3000.0 if delta < 0 else 2000.0 if delta == 0 else 1000.0 if delta == 1 else 0.0

    def pod_annotations(
        self, devices: PodSingleDevice, *, node: str = "", now: float = 0.0, pod: Any = None, view: Any = None
    ) -> dict[str, str]:
        out = super().pod_annotations(devices, node=node, now=now, pod=pod, view=view)
        indexes = list(dict.fromkeys(cd.index for ctr in devices for cd in ctr))
        if indexes:
            out[INDEX_ANNOTATION] = ",".join(map(str, indexes))
        return out


def graph_select(devices: Sequence[DeviceInfo], candidates: Sequence[int], n: int) -> list[int] | Reason:
    """HAMi's ``graghSelect`` over the cards that can take the request (``candidates``, in the order
    to take them within a group): 1, 2 or 4 cards inside one group of four (the group whose
    fitting cards equal ``n`` or exceed it least, lower group first on a tie), else across the
    groups along the links (:func:`_across_groups`); 8 cards a whole eight; ``NumaNotFit`` when
    none of these is free. Other counts (HAMi refuses them): the first ``n`` candidates."""
    groups: dict[int, list[int]] = {}
    for j in sorted(candidates, key=lambda j: interconnect_group(devices[j].index)):  # stable: keeps the order within
        groups.setdefault(interconnect_group(devices[j].index), []).append(j)
    if n in _GROUP_ORDER:
        for free in _GROUP_ORDER[n]:
            for g in groups.values():
                if len(g) == free:
                    return g[:n]
        across = _across_groups(devices, list(candidates), n)
        return across if across is not None else Reason.NUMA_NOT_FIT
    if n == 8:  # a whole eight (HAMi: all eight cards fit)
        eights: dict[int, list[int]] = {}
        for j in sorted(candidates, key=lambda j: devices[j].index):
            eights.setdefault(devices[j].index // 8, []).append(j)
        whole = [g for g in eights.values() if len(g) == 8]
        return whole[0] if whole else Reason.NUMA_NOT_FIT
    return list(candidates[:n])


def _across_groups(devices: Sequence[DeviceInfo], candidates: list[int], n: int) -> list[int] | None:
    """HAMi's ``interconnect``, for a request no group of four holds: 2 cards = a linked pair
    across the groups; 4 cards = a free ring of :data:`CROSS_RINGS` (with six free, one that
    leaves a linked pair free, else the last free ring, as HAMi). None when there is none."""
    at = {devices[j].index: j for j in candidates}
    if n == 2:
        for j in candidates:
            i = devices[j].index
            mate = i + 4 if i % 8 < 4 else i - 4
            if mate in at:
                return [j, at[mate]]
        return None
    if n != 4:
        return None
    for base in sorted({i - i % 8 for i in at}):
        free = {i for i in at if i - base in range(8)}
        rings = [[base + k for k in ring] for ring in CROSS_RINGS if all(base + k in free for k in ring)]
        if not rings:
            continue
        if len(free) == 6:
            for ring in rings:
                a, b = sorted(free - set(ring))
                if _linked(a, b):
                    return [at[i] for i in ring]
        return [at[i] for i in rings[-1 if len(free) == 6 else 0]]
    return None


def _bubbles(cards: list[tuple[DeviceInfo, bool]]) -> int:
    """Interconnect groups with some but not all cards in use."""
    groups: dict[int, list[bool]] = {}
    for d, busy in cards:
        groups.setdefault(interconnect_group(d.index), []).append(busy)
    return sum(1 for g in groups.values() if any(g) and not all(g))


def round_vxpu(mib: int) -> int:
    """The smallest vXPU size >= ``mib``; 0 when larger than a card."""
    return next((s for s in VXPU_SIZES if mib <= s), 0)


class KunlunVxpuVendor(BaseVendor):
    name = "XPU"
    request_type = "XPU"
    register_annotation = "hami.io/node-register-xpu"
    register_format = "json"
    handshake_annotation = node_handshake("xpu")
    allocated_annotation = "hami.io/xpu-devices-allocated"
    to_allocate_annotation = "hami.io/xpu-devices-to-allocate"
    lock_annotation = NODE_LOCK
    use_uuid_annotation = "hami.io/use-xpu-uuid"
    nouse_uuid_annotation = "hami.io/no-use-xpu-uuid"
    chooses = True  # HAMi places vXPUs with the whole cards' graghSelect

    def __init__(self, config: KunlunConfig | None = None) -> None:
        c = self.config = config or KunlunConfig()
        super().__init__(ResourceNames(count=c.resource_vcount_name, memory=c.resource_vmemory_name))

    def choose(
        self,
        devices: Sequence[DeviceInfo],
        request: ContainerDeviceRequest,
        candidates: Sequence[int],
        prior: Sequence[str],
    ) -> Sequence[int] | Reason:
        """The cards along the links, as for whole cards (:func:`graph_select`), among those
        that can take one more vXPU of the size asked; within the chosen group, in the GPU
        policy's order (a partly used card first under binpack)."""
        return graph_select(devices, candidates, request.nums)

    def admit_container(self, container: dict, pod: Mapping[str, Any]) -> bool:
        r = self.resources
        has = present(container)
        if r.count not in has:
            return False
        if r.memory in has:
            where = where_of(container)
            raw = lookup(container, where)(r.memory)
            size = round_vxpu(raw)
            if raw <= 0 or not size:
                raise RequestError(f"{where}: {r.memory} must be in 1..{CARD_MEMORY} MiB, got {raw}")
            set_both(container, r.memory, size)
        return True

    def capacity_check(self, device, used, usedmem, usedcores, request, mem, mutex, quota_fits):
        """The generic rules, then HAMi's vXPU rule: a card that already holds vXPUs takes only
        vXPUs of the size it holds (its used memory over its used slots equals the size asked),
        so a P800 is cut into equal quarters or equal halves."""
        bad = super().capacity_check(device, used, usedmem, usedcores, request, mem, mutex, quota_fits)
        if bad is None and used > 0 and usedmem // used != mem:
            return Reason.CARD_NOT_FOUND_CUSTOM_FILTER_RULE
        return bad

    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        r = self.resources
        res = lookup(container, where)
        n = res(r.count)
        if n == 0:
            return None
        raw = res(r.memory) if r.memory in present(container) else CARD_MEMORY
        mem = round_vxpu(raw)
        if n < 0 or raw <= 0 or not mem:
            raise RequestError(
                f"{where}: {r.count} must be positive and {r.memory} in 1..{CARD_MEMORY} (got {n} and {raw})"
            )
        return ContainerDeviceRequest(
            vendor=self.name, nums=n, type=self.request_type, memreq=mem, coresreq=mem * 100 // CARD_MEMORY
        )


def make_kunlun(config: KunlunConfig) -> tuple[BaseVendor, ...]:
    return (KunlunVendor(config), KunlunVxpuVendor(config))
