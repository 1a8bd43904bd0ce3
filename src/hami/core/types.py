"""Plain data types shared by the core, the vendors and every adapter.

All types are frozen dataclasses (immutable, hashable where useful) except the ledger's
own mutable usage records. Units: memory in MiB, cores in percent of one device (a device
with ``deviceCoreScaling: 2`` has ``devcore == 200``), slots = concurrent tasks per device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

#: ``MemPercentagereq`` sentinel meaning "no percentage given" (HAMi uses 101).
PERCENT_UNSET = 101
#: devices one vendor may register on one node: the node writes its registration (annotations,
#: capacity), so a number past any machine's is refused rather than held in the scheduler's memory
MAX_NODE_DEVICES = 1024


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile a device can host, with the placements NVML reports for it (§4.2, §6.6)."""

    name: str
    memory_mb: int
    core: int
    slice_count: int
    placements: tuple[tuple[int, int], ...] = ()  # (start, size)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One physical device as registered by a node (HAMi ``DeviceInfo``, §4.2)."""

    id: str  # UUID, e.g. "GPU-0fc3..."
    index: int = 0
    count: int = 0  # slots (deviceSplitCount)
    devmem: int = 0  # MiB, after deviceMemoryScaling
    devcore: int = 0  # 100 x deviceCoreScaling
    type: str = ""  # model, e.g. "NVIDIA-Tesla V100-PCIE-32GB"
    numa: int = 0
    mode: str = ""  # "hami-core" | "mig" | "mps"; "" read as hami-core
    health: bool = False  # Go omitempty: a missing field is false
    vendor: str = ""  # backend key ("NVIDIA"); set by the reader, never transported
    mig_profiles: tuple[MigProfile, ...] = ()
    custominfo: Mapping[str, Any] | None = None

    @property
    def sliced(self) -> bool:
        """True when the device is handed out as positioned slices (NVIDIA MIG mode): every pod
        on it must hold a :class:`Slice`, and slices on it must not overlap (§5.3 step 5)."""
        return self.mode in SLICED_MODES


#: Device modes whose capacity is handed out as positioned, non-overlapping slices.
SLICED_MODES = frozenset({"mig"})


@dataclass(frozen=True, slots=True)
class Slice:
    """A positioned part of one device held by a pod for its whole life: a MIG profile at a
    placement ``[start, start + size)`` in memory-slice units (``hami.io/vgpu-mig-allocations``)."""

    uuid: str
    profile: str
    start: int
    size: int
    #: the instance's runtime identity, once the device plugin made it (not part of equality)
    mig_uuid: str = field(default="", compare=False)
    gpu_instance_id: int | None = field(default=None, compare=False)
    compute_instance_id: int | None = field(default=None, compare=False)

    def overlaps(self, other: "Slice") -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """Everything the core knows about one node: its devices (all vendors) and node-side knobs."""

    name: str
    devices: tuple[DeviceInfo, ...]
    cordoned: frozenset[str] = frozenset()  # UUIDs from hami.io/device-cordon
    #: uuid -> uuid -> link score (hami.io/node-nvidia-score); used by the topology-aware policy
    pair_scores: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ContainerDeviceRequest:
    """What one container asks of one vendor (HAMi ``ContainerDeviceRequest``)."""

    vendor: str  # backend key, e.g. "NVIDIA"
    nums: int  # number of physical devices
    type: str  # request type string written in the allocation annotation, e.g. "NVIDIA"
    memreq: int = 0  # MiB per device (after memoryFactor); 0 = see mem_percentage
    mem_percentage: int = PERCENT_UNSET  # 0..100, or PERCENT_UNSET
    coresreq: int = 0  # percent of one device


class ContainerKind(str, Enum):
    INIT = "init"  # classic init container: runs alone, before the next one
    SIDECAR = "sidecar"  # init container with restartPolicy: Always: runs until the pod ends
    APP = "app"  # regular container


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container, in annotation order (init containers first), with its per-vendor requests."""

    name: str
    kind: ContainerKind
    requests: tuple[ContainerDeviceRequest, ...] = ()  # at most one per vendor

    def for_vendor(self, vendor: str) -> ContainerDeviceRequest | None:
        for req in self.requests:
            if req.vendor == vendor:
                return req
        return None


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod reduced to what scheduling needs. ``containers``: init containers, then regular."""

    namespace: str
    name: str
    uid: str
    containers: tuple[ContainerRequest, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.uid or f"{self.namespace}/{self.name}"

    @property
    def has_devices(self) -> bool:
        return any(c.requests for c in self.containers)

    def vendors(self) -> tuple[str, ...]:
        return tuple(sorted({r.vendor for c in self.containers for r in c.requests}))


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One device granted to one container (serialised as ``UUID,TYPE,USEDMEM,USEDCORES``)."""

    uuid: str
    type: str
    usedmem: int
    usedcores: int
    index: int = -1  # device index on the node when known (not serialised)
    slice: Slice | None = None  # MIG profile + placement (serialised in hami.io/vgpu-mig-allocations)


#: Per container (annotation order), the devices of one vendor. ``()`` = no device.
PodSingleDevice = tuple[tuple[ContainerDevice, ...], ...]


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """Collapsed usage of one device by one pod: what the ledger, quota and metrics count."""

    uuid: str
    vendor: str
    slots: int
    mem: int
    cores: int


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """A pod's placement: node, raw per-vendor container devices, and collapsed usage."""

    key: str  # uid, or "namespace/name" when there is no uid
    namespace: str
    name: str
    node: str
    devices: Mapping[str, PodSingleDevice]  # vendor -> per container
    kinds: tuple[ContainerKind, ...]  # per container, same order
    usage: tuple[DeviceUse, ...]  # collapsed, sorted by uuid
    #: every slice the pod holds (all containers, init included: held for the pod's whole life)
    slices: tuple[Slice, ...] = ()
    #: vendor -> the class the pod's annotations put it in on that vendor's devices (the vendor's
    #: ``holder_class``: MetaX sGPU's app class); only vendors it holds devices of and that name one
    classes: Mapping[str, str] = field(default_factory=dict)
    #: its classic init containers have all finished: they hold nothing any more (``usage`` too)
    app_only: bool = False

    def memory(self) -> int:
        return sum(u.mem for u in self.usage)

    def cores(self) -> int:
        return sum(u.cores for u in self.usage)
