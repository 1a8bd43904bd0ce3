"""The node's GPUs as the plugin presents them: kubelet device IDs, health, registration.

Each physical GPU ``U`` is advertised to the kubelet as ``deviceSplitCount`` IDs
``U-0 … U-(n-1)`` (§6.2); the kubelet only counts them. Health is per physical GPU and,
as in HAMi, never recovers within one process (restart the plugin after fixing a GPU).
"""

from __future__ import annotations

import asyncio
from typing import Iterable

from hami.core.types import DeviceInfo
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings


def plugin_ids(uuid: str, split: int) -> list[str]:
    return [f"{uuid}-{i}" for i in range(split)]


def physical_id(device_id: str) -> str:
    """``GPU-…-3`` -> ``GPU-…`` (a UUID has 5 dashes, a kubelet ID 6); ``U::n`` -> ``U``."""
    if "::" in device_id:
        return device_id.split("::", 1)[0]
    if device_id.count("-") > 5:
        return device_id.rsplit("-", 1)[0]
    return device_id


class ChangeFeed:
    """A version that waiters (ListAndWatch, registration) wait to see change."""

    def __init__(self) -> None:
        self.version = 0
        self._changed = asyncio.Condition()

    async def changed(self) -> None:
        async with self._changed:
            self.version += 1
            self._changed.notify_all()

    async def wait_change(self, seen: int, timeout: float | None = None) -> int:
        """Wait until ``version`` differs from ``seen`` (or the timeout passes); return it."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.version != seen), timeout)
            except TimeoutError:
                pass
            return self.version


class DeviceState(ChangeFeed):
    """Physical GPUs plus their health; wakes waiters (ListAndWatch, registration) on change."""

    def __init__(
        self, gpus: Iterable[PhysicalGPU], settings: NodeSettings, pair_scores: dict[str, dict[str, int]] | None = None
    ) -> None:
        self.gpus = tuple(gpus)
        self.settings = settings
        #: ``hami.io/node-nvidia-score`` content (topology.py); None: not published
        self.pair_scores = pair_scores
        self.unhealthy: set[str] = set()
        super().__init__()

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]

    def healthy(self, uuid: str) -> bool:
        return uuid not in self.unhealthy

    async def mark_unhealthy(self, uuids: Iterable[str]) -> None:
        new = {u for u in uuids if u in self.uuids} - self.unhealthy
        if not new:
            return
        self.unhealthy |= new
        await self.changed()

    def kubelet_devices(self) -> list[tuple[str, bool, int | None]]:
        """(ID, healthy, NUMA node or None) for every kubelet-visible ID, in GPU index order."""
        numa = self.settings.enable_numa_topology
        return [
            (dev_id, self.healthy(g.uuid), g.numa if numa else None)
            for g in self.gpus
            for dev_id in plugin_ids(g.uuid, self.settings.device_split_count)
        ]

    def registration(self) -> list[DeviceInfo]:
        """The devices for ``hami.io/node-nvidia-register`` (units per §4.2)."""
        s = self.settings
        return [
            self._mig_device(g)
            if s.operating_mode == "mig"
            else DeviceInfo(
                id=g.uuid,
                index=g.index,
                count=s.device_split_count,
                devmem=int(g.memory_mib * s.device_memory_scaling),
                devcore=int(s.device_core_scaling * 100),
                type=g.type_name,
                numa=g.numa,
                mode=s.operating_mode,
                health=self.healthy(g.uuid),
            )
            for g in self.gpus
        ]

    def _mig_device(self, g: PhysicalGPU) -> DeviceInfo:
        """MIG mode (§4.3): count = the most instances any profile allows, devcore 100, no memory
        scaling, and the GPU's MIG profiles."""
        slices = {}
        for p in g.mig_profiles:  # instances of a profile = its placements that do not overlap
            taken: list[tuple[int, int]] = []
            for start, size in sorted(p.placements):
                if all(start >= s + z or s >= start + size for s, z in taken):
                    taken.append((start, size))
            slices[p.name] = len(taken)
        return DeviceInfo(
            id=g.uuid,
            index=g.index,
            count=max(slices.values(), default=0),
            devmem=g.memory_mib,
            devcore=100,
            type=g.type_name,
            numa=g.numa,
            mode="mig",
            health=self.healthy(g.uuid),
            mig_profiles=g.mig_profiles,
        )
