"""The DRA view of a node's GPUs: ResourceSlice devices and the DeviceClasses that select them.

Pure functions from the discovered GPUs (:class:`hami.node.nvml.PhysicalGPU`-like
objects) and the node settings to ``resource.k8s.io/v1`` objects as plain dicts. No I/O: the
publisher (:mod:`hami.draplugin.publisher`) writes what these return.

Each GPU is one device named ``gpu-<n>`` (``n``: NVML's index when the agent first saw the GPU,
kept per UUID after, :func:`slot_of`) with ``allowMultipleAllocations: true`` (DRA
consumable capacity, KEP-5075), so kube-scheduler itself places several claims on one GPU as
long as the sum of what they consume stays within each capacity. The capacities and their
request policies restate HAMi's rules for a share:

==========  ==================================  ================================================
capacity    value                               request policy (what one allocation consumes)
==========  ==================================  ================================================
memory      bytes (NVML total x memory scaling) default: all of it (HAMi: no ``gpumem`` means
                                                100%); range min_memory .. value in MiB steps
cores       percent x core scaling (100)        default: ``defaultCores``, or :data:`IDLE_CORES`
                                                (a thousandth) when that is 0; range 0 .. value
shares      ``deviceSplitCount``                exactly 1 per allocation: the split count caps
                                                the number of claims sharing a GPU
==========  ==================================  ================================================

HAMi keeps a share that asks for no cores off a GPU whose cores are all taken
(``CardComputeUnitsExhausted``), and a consumable capacity can only say "the amounts fit". A
request that names no cores therefore consumes :data:`IDLE_CORES`, one thousandth of a core: it
does not fit beside shares that took every core, and neither does a ``gpucores: 100`` share
beside it. What the container is given is the whole part of what it consumed (no core limit for
the thousandth), and quotas count the whole part too. The cores range has no step, so kube-scheduler
takes the default and any explicit amount as they are (an explicit ``cores: 0`` consumes nothing,
as before; docs/dra.md says where this differs from the extender).

Attributes in the driver's domain (a CEL selector reads ``device.attributes["gpu.hami.io"]``):
``model``, ``type`` (HAMi's registration type, ``NVIDIA-<model>``), ``uuid``, ``index``,
``numa`` (0 when unknown, as in the registration), ``migCapable``, ``taskPriority`` (true: the
agent honours a ``GpuConfig``'s ``priority``, :data:`TASK_PRIORITY`), ``corePolicy`` (true: the
agent takes a ``GpuConfig``'s ``corePolicy``, :data:`CORE_POLICY`), and two ``version``
attributes named as NVIDIA's driver names them, ``driverVersion`` and ``cudaComputeCapability``
(semver: ``550.54.15``, ``8.6.0``). Kubernetes' standard device attributes (``numaNode``:
KEP-6072; the helper library ``k8s.io/dynamic-resource-allocation/deviceattribute``), in the
``resource.kubernetes.io`` domain, so that ``matchAttribute`` aligns a GPU with another
driver's device: ``numaNode`` (int), ``pcieRoot`` (``pci<domain>:<bus>``) and ``pciBusID``
(``<domain>:<bus>:<device>.<function>``, lower case). An attribute whose value the node cannot
tell is left out rather than published wrong: a ``numaNode`` of -1, say, would match every
other device without NUMA affinity.

The required facts of a GPU are :class:`GpuLike`'s; the optional ones (``numa_node``,
``pcie_root``, ``bus_id``, ``compute_capability``) are read by name when the object has them:
:class:`hami.node.nvml.PhysicalGPU` has them all, the simulator's GPUs from a registration none.

Two DeviceClasses select these devices: :data:`SHARE_CLASS` (a share, isolated by libvgpu) and
:data:`WHOLE_CLASS` (the whole GPU, no libvgpu: its class configuration tells the kubelet plugin
so, and a request through it must not ask for a part of the memory). The share class may also
carry ``extendedResourceName`` (KEP-5004) so that a plain ``nvidia.com/gpu: 1`` is served by DRA.

MIG (:class:`GpuMig`, one per GPU in MIG mode; such a GPU is not published as ``gpu-<n>``):

* static MIG (``migstrategy: mixed``): each MIG instance that exists (made by an administrator)
  is a device ``gpu-<n>-mig-<gpu instance id>``, allocated whole;
* dynamic MIG (``operatingmode: mig``): every placement of every profile the extender path
  would register (:func:`hami.node.nvml.registered_profiles`, the allowlist included) is a
  device ``gpu-<n>-<profile>-<start>`` that consumes the memory slices of its placement from
  the GPU's counter set ``gpu-<n>-slices`` (KEP-4815 partitionable devices): kube-scheduler
  then never allocates two overlapping placements, and the kubelet plugin creates the instance
  in prepare and destroys it in unprepare.

Both carry the attribute ``profile`` (``1g.5gb``; the share and whole-GPU classes select only
devices without it) and are selected by :data:`MIG_CLASS`. The API server takes ``sharedCounters``
only in a slice without devices, and at most 64 devices in a slice that has devices consuming
counters: :func:`resource_slices` splits the pool into as many slices as that needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, Sequence

from hami.core.names import (
    DEFAULT_PRIORITY,  # noqa: F401  (re-exported: the priority a GpuConfig without one runs at)
    DEVICE_CORDON,
    DRA_CONFIG_API_VERSION,
    DRA_DRIVER,
    DRA_SHARE_CLASS,
    DRA_WHOLE_CLASS,
    PRIORITY_RANGE,  # noqa: F401  (re-exported: the priorities a GpuConfig may name)
)

DRIVER = DRA_DRIVER
SHARE_CLASS = DRA_SHARE_CLASS
WHOLE_CLASS = DRA_WHOLE_CLASS
CONFIG_API_VERSION = DRA_CONFIG_API_VERSION
CONFIG_KIND = "GpuConfig"
MIG_CLASS = f"mig.{DRA_DRIVER}"
MEMORY, CORES, SHARES = "memory", "cores", "shares"
PROFILE = "profile"  # the attribute that marks a MIG device
#: the attribute that says the node's agent sets CUDA_TASK_PRIORITY from a ``GpuConfig``'s
#: ``priority``: an agent older than that ignored the field, so the webhook's claims that carry a
#: priority select only devices with it (a pod stays pending rather than run at the default)
TASK_PRIORITY = "taskPriority"
#: the attribute that says the node's agent takes a ``GpuConfig``'s ``corePolicy`` (writes it into
#: GPU_CORE_UTILIZATION_POLICY): an agent older than that refuses the field at prepare, so the
#: webhook's claims that carry one select only devices with it (a pod stays pending rather than
#: be placed on such a node during an upgrade and never start; review, 1 Dec)
CORE_POLICY = "corePolicy"
MAX_SLICE_DEVICES = 64  # a slice with devices consuming counters (or tainted) holds at most 64
MAX_COUNTER_SETS = 8  # counter sets in one slice, kept within the API server's limit
MIB = 1024 * 1024
#: what a share that names no cores consumes on a device whose ``defaultCores`` is 0 (module doc)
IDLE_CORES = "1m"

#: Kubernetes' standard device attributes (``k8s.io/dynamic-resource-allocation/deviceattribute``)
STANDARD_DOMAIN = "resource.kubernetes.io"
NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"

_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")
MAX_NUMA_NODES = 1024  # Linux's bound, which Kubernetes' helper checks too
MAX_VERSION = 64  # the API server's limit on a version attribute
_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")
_VERSION = re.compile(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?")


class GpuLike(Protocol):
    index: int
    uuid: str
    model: str
    memory_mib: int
    numa: int


@dataclass(frozen=True)
class SliceSettings:
    """The node settings that shape the published devices (HAMi's names in comments)."""

    split_count: int = 10  # deviceSplitCount
    memory_scaling: float = 1.0  # deviceMemoryScaling
    core_scaling: float = 1.0  # deviceCoreScaling
    default_cores: int = 0  # defaultCores
    min_memory_mib: int = 1  # the smallest share of memory one allocation may take
    driver_version: str = ""  # NVML's system driver version ("": unknown, not published)
    mig_capable: frozenset[str] = frozenset()  # UUIDs of GPUs that support MIG

    def __post_init__(self) -> None:
        for name, count, low in (
            ("split_count", self.split_count, 1),
            ("min_memory_mib", self.min_memory_mib, 1),
            ("default_cores", self.default_cores, 0),
        ):
            if not isinstance(count, int) or count < low:
                raise ValueError(f"SliceSettings.{name} must be an integer >= {low}, got {count!r}")
        for name, factor in (("memory_scaling", self.memory_scaling), ("core_scaling", self.core_scaling)):
            if not factor > 0:
                raise ValueError(f"SliceSettings.{name} must be > 0, got {factor!r}")


def device_name(index: int) -> str:
    return f"gpu-{index}"


def slot_of(gpu: GpuLike) -> int:
    """The number in a GPU's device names (``gpu-<slot>``, its MIG devices and counter set): the
    agent keeps it per UUID across restarts (:mod:`hami.draplugin.names`), so a name never comes
    to mean another GPU when one drops off the bus and NVML numbers the rest again; NVML's index
    where nothing keeps one (first start, ``hami simulate``)."""
    slot = getattr(gpu, "slot", None)
    return gpu.index if slot is None else slot


def gpu_device_name(gpu: GpuLike) -> str:
    return device_name(slot_of(gpu))


def memory_bytes(gpu: GpuLike, s: SliceSettings) -> int:
    """Published memory, whole MiB: the NVML total times ``deviceMemoryScaling``."""
    return int(gpu.memory_mib * s.memory_scaling) * MIB


def total_cores(s: SliceSettings) -> int:
    return int(100 * s.core_scaling)


def cores_policy(total: int, default_cores: int) -> dict[str, Any]:
    """The ``cores`` request policy of a device with ``total`` cores: the default is
    ``default_cores`` (at most ``total``), or :data:`IDLE_CORES` when that is 0; any amount from 0
    to ``total``, taken as asked (no step, so the default is never rounded up to a whole core)."""
    default = str(min(default_cores, total)) if default_cores > 0 or total < 1 else IDLE_CORES
    return {"default": default, "validRange": {"min": "0", "max": str(total)}}


def _attr(kind: str, value: Any) -> dict[str, Any]:
    return {kind: value}


def semver(text: str | None) -> str | None:
    """A dotted number as the semantic version a ``version`` attribute must hold: missing parts
    are 0 and leading zeros go (``535.104.05`` -> ``535.104.5``, ``8.6`` -> ``8.6.0``). None for
    anything else (more than three parts, letters, empty)."""
    m = _VERSION.fullmatch((text or "").strip())
    if m is None:
        return None
    version = ".".join(str(int(part or 0)) for part in m.groups())
    return version if len(version) <= MAX_VERSION else None


def _fact(gpu: GpuLike, name: str) -> Any:
    return getattr(gpu, name, None)


def _typed_attributes(gpu: GpuLike, s: SliceSettings) -> dict[str, dict[str, Any]]:
    """The version attributes and the standard ones, each only with a value that is well formed."""
    numa, bus_id, root = _fact(gpu, "numa_node"), _fact(gpu, "bus_id"), _fact(gpu, "pcie_root")
    candidates: tuple[tuple[str, str, Any, bool], ...] = (
        ("driverVersion", "version", semver(s.driver_version), True),
        ("cudaComputeCapability", "version", semver(_fact(gpu, "compute_capability")), True),
        (NUMA_NODE, "int", numa, type(numa) is int and 0 <= numa < MAX_NUMA_NODES),
        (PCIE_ROOT, "string", root, isinstance(root, str) and _PCIE_ROOT.fullmatch(root) is not None),
        (PCI_BUS_ID, "string", bus_id, isinstance(bus_id, str) and _BDF.fullmatch(bus_id) is not None),
    )
    return {name: _attr(kind, value) for name, kind, value, ok in candidates if ok and value is not None}


def device(gpu: GpuLike, s: SliceSettings) -> dict[str, Any]:
    """One ResourceSlice device for ``gpu``; raises ValueError when the GPU cannot hold one share."""
    mem = memory_bytes(gpu, s)
    cores = total_cores(s)
    if mem < s.min_memory_mib * MIB:
        raise ValueError(f"GPU {gpu.uuid}: memory {mem // MIB} MiB is below min_memory_mib={s.min_memory_mib}")
    return {
        "name": gpu_device_name(gpu),
        "attributes": {
            "model": _attr("string", gpu.model),
            "type": _attr("string", gpu.model if gpu.model.startswith("NVIDIA") else f"NVIDIA-{gpu.model}"),
            "uuid": _attr("string", gpu.uuid),
            "index": _attr("int", gpu.index),
            "numa": _attr("int", gpu.numa),
            "migCapable": _attr("bool", gpu.uuid in s.mig_capable),
            TASK_PRIORITY: _attr("bool", True),
            CORE_POLICY: _attr("bool", True),
            **_typed_attributes(gpu, s),
        },
        "capacity": {
            MEMORY: {
                "value": str(mem),
                "requestPolicy": {
                    "default": str(mem),
                    "validRange": {"min": f"{s.min_memory_mib}Mi", "max": str(mem), "step": "1Mi"},
                },
            },
            CORES: {"value": str(cores), "requestPolicy": cores_policy(cores, s.default_cores)},
            SHARES: {"value": str(s.split_count), "requestPolicy": {"default": "1", "validValues": ["1"]}},
        },
        "allowMultipleAllocations": True,
    }


def slice_name(node: str, part: int = 0) -> str:
    """The name of the node's slice ``part`` (0: the first, which has the GPUs)."""
    return f"{node}-{DRIVER}" if part == 0 else f"{node}-{DRIVER}-{part}"


# ------------------------------------------------------------------ MIG


@dataclass(frozen=True)
class MigProfileSpec:
    """A profile the extender path registers (:class:`hami.core.types.MigProfile`'s fields)."""

    name: str
    memory_mb: int
    core: int
    slice_count: int
    placements: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class StaticInstance:
    """A MIG instance that exists on the GPU (static MIG)."""

    gi: int
    profile: str
    start: int
    size: int
    mig_uuid: str
    memory_mb: int = 0
    core: int = 0


@dataclass(frozen=True)
class GpuMig:
    """A GPU in MIG mode: ``dynamic`` (its registered profiles) or static (its instances)."""

    dynamic: bool
    profiles: tuple[MigProfileSpec, ...] = ()
    instances: tuple[StaticInstance, ...] = ()


@dataclass(frozen=True)
class MigDevice:
    """One published MIG device and what prepare needs of it."""

    name: str
    gpu_uuid: str
    gpu_index: int
    profile: str
    start: int
    size: int
    memory_mb: int
    core: int
    mig_uuid: str = ""  # static: the existing instance's; dynamic: "" (made in prepare)

    @property
    def dynamic(self) -> bool:
        return not self.mig_uuid


def _label(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def counter_set_name(index: int) -> str:
    return f"gpu-{index}-slices"


def mig_devices(gpus: Iterable[GpuLike], mig: Mapping[str, GpuMig]) -> dict[str, MigDevice]:
    """Every MIG device of the node by name, in GPU index order, then profile order (the
    registration's: memory, then slices), then placement start; static instances by id."""
    out: dict[str, MigDevice] = {}
    for g in sorted(gpus, key=lambda g: g.index):
        m = mig.get(g.uuid)
        if m is None:
            continue
        if m.dynamic:
            for p in m.profiles:
                for start, size in p.placements:
                    if size <= 0:
                        continue
                    name = f"{gpu_device_name(g)}-{_label(p.name)}-{start}"
                    out[name] = MigDevice(name, g.uuid, g.index, p.name, start, size, p.memory_mb, p.core)
        else:
            for i in sorted(m.instances, key=lambda i: i.gi):
                if not i.mig_uuid:
                    continue
                name = f"{gpu_device_name(g)}-mig-{i.gi}"
                out[name] = MigDevice(
                    name, g.uuid, g.index, i.profile, i.start, i.size, i.memory_mb, i.core, i.mig_uuid
                )
    return out


def _mig_device(d: MigDevice, gpu: GpuLike, s: SliceSettings) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "model": _attr("string", gpu.model),
        "type": _attr("string", gpu.model if gpu.model.startswith("NVIDIA") else f"NVIDIA-{gpu.model}"),
        PROFILE: _attr("string", d.profile),
        "parentUUID": _attr("string", gpu.uuid),
        "index": _attr("int", gpu.index),
        "numa": _attr("int", gpu.numa),
        "placementStart": _attr("int", d.start),
        "placementSize": _attr("int", d.size),
        **_typed_attributes(gpu, s),
    }
    if d.mig_uuid:
        attrs["uuid"] = _attr("string", d.mig_uuid)
    out: dict[str, Any] = {
        "name": d.name,
        "attributes": attrs,
        "capacity": {MEMORY: {"value": str(d.memory_mb * MIB)}, CORES: {"value": str(d.core)}},
    }
    if d.dynamic:
        out["consumesCounters"] = [
            {
                "counterSet": counter_set_name(slot_of(gpu)),
                "counters": {f"slice-{k}": {"value": "1"} for k in range(d.start, d.start + d.size)},
            }
        ]
    return out


def counter_sets(gpus: Iterable[GpuLike], mig: Mapping[str, GpuMig]) -> list[dict[str, Any]]:
    """One counter set per GPU in dynamic MIG mode: one counter per memory slice."""
    out = []
    for g in sorted(gpus, key=lambda g: g.index):
        m = mig.get(g.uuid)
        if m is None or not m.dynamic:
            continue
        slices = max((start + size for p in m.profiles for start, size in p.placements), default=0)
        if slices:
            out.append(
                {
                    "name": counter_set_name(slot_of(g)),
                    "counters": {f"slice-{k}": {"value": "1"} for k in range(slices)},
                }
            )
    return out


#: the taint an unhealthy GPU carries (KEP-5055 device taints, GA in Kubernetes 1.37)
UNHEALTHY_TAINT_KEY = f"{DRIVER}/unhealthy"
UNHEALTHY_TAINT_VALUE = "xid"  # a fatal XID (or NVML failing) marked it
TAINT_EFFECTS = ("NoSchedule", "NoExecute")
#: the informational taint of a GPU that had a non-fatal XID: the value is the XID's number and
#: the effect ``None`` (resource.k8s.io/v1 since Kubernetes 1.35: "purely informational", no
#: claim is kept off the GPU or evicted)
XID_TAINT_KEY = f"{DRIVER}/xid"


def unhealthy_taint(effect: str) -> dict[str, str]:
    """The device taint of a GPU a fatal XID marked unhealthy. ``NoSchedule`` keeps new claims
    off it; ``NoExecute`` also evicts the pods of claims allocated on it."""
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"unhealthy taint effect must be one of {', '.join(TAINT_EFFECTS)}, got {effect!r}")
    return {"key": UNHEALTHY_TAINT_KEY, "value": UNHEALTHY_TAINT_VALUE, "effect": effect}


def xid_taint(xid: int) -> dict[str, str]:
    """The informational device taint of a GPU whose last non-fatal XID was ``xid``."""
    if not isinstance(xid, int) or isinstance(xid, bool) or xid < 0:
        raise ValueError(f"xid taint: the XID must be a number >= 0, got {xid!r}")
    return {"key": XID_TAINT_KEY, "value": str(xid), "effect": "None"}


#: the taint of a GPU the operator cordoned: its UUID is in the Node's ``hami.io/device-cordon``
CORDON_TAINT_KEY = f"{DRIVER}/cordoned"


def cordon_taint() -> dict[str, str]:
    """The device taint of a cordoned GPU: ``NoSchedule`` (new claims stay off it unless they
    tolerate it; claims already there keep running, as the extender's cordon leaves running pods)."""
    return {"key": CORDON_TAINT_KEY, "effect": "NoSchedule"}


def cordoned_gpus(node: Mapping[str, Any]) -> frozenset[str]:
    """The GPU UUIDs a Node's ``hami.io/device-cordon`` annotation lists (comma separated, blanks
    around each ignored), as the extender's ledger reads it; empty for anything else."""
    meta = node.get("metadata") if isinstance(node, Mapping) else None
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    text = annotations.get(DEVICE_CORDON) if isinstance(annotations, Mapping) else None
    if not isinstance(text, str):
        return frozenset()
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def _taints(
    uuid: str,
    unhealthy: frozenset[str],
    mark: dict[str, str] | None,
    notes: Mapping[str, int],
    cordoned: frozenset[str] = frozenset(),
) -> list:
    """The taints of a device on GPU ``uuid``: the unhealthy mark, the cordon, then the last
    non-fatal XID."""
    out = [dict(mark)] if mark is not None and uuid in unhealthy else []
    if uuid in cordoned:
        out.append(cordon_taint())
    if uuid in notes:
        out.append(xid_taint(notes[uuid]))
    return out


def _slice(node: str, part: int, generation: int, count: int, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, part), "labels": {"app.kubernetes.io/managed-by": "hami-dra"}},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            **body,
        },
    }


def resource_slices(
    node: str,
    gpus: Iterable[GpuLike],
    s: SliceSettings,
    generation: int = 1,
    unhealthy: frozenset[str] = frozenset(),
    taint: str | None = None,
    mig: Mapping[str, GpuMig] | None = None,
    notes: Mapping[str, int] | None = None,
    cordoned: frozenset[str] = frozenset(),
    device_taints: bool = True,
) -> list[dict[str, Any]]:
    """The node's ResourceSlices (pool = node name), the first named :func:`slice_name`. An
    unhealthy GPU (and its MIG devices) carries the device taint :func:`unhealthy_taint` with effect
    ``taint`` (kube-scheduler allocates no claim there that does not tolerate it); with ``taint``
    None it is left out, which keeps new claims off it on clusters without device taints (claims
    already prepared keep running either way). A GPU in ``cordoned`` (the UUIDs of the Node's
    ``hami.io/device-cordon``, :func:`cordoned_gpus`) carries :func:`cordon_taint`, or is left
    out when ``device_taints`` is False (a cluster that drops device taints). A GPU in ``notes``
    (UUID -> its last non-fatal XID) also carries the informational :func:`xid_taint`. A GPU in
    ``mig`` is published as its MIG devices (module doc). Without MIG this is one slice, as before."""
    if not node:
        raise ValueError("resource_slices: node name is empty")
    mig = mig or {}
    notes = notes or {}
    gpus = sorted(gpus, key=lambda g: g.index)
    mark = unhealthy_taint(taint) if taint is not None else None
    migs = mig_devices(gpus, mig)
    by_uuid = {g.uuid: g for g in gpus}

    def left_out(uuid: str) -> bool:
        return (uuid in unhealthy and mark is None) or (uuid in cordoned and not device_taints)

    cordons = cordoned if device_taints else frozenset()
    devices = []
    for g in gpus:
        if g.uuid in mig or left_out(g.uuid):
            continue
        taints = _taints(g.uuid, unhealthy, mark, notes, cordons)
        devices.append({**device(g, s), "taints": taints} if taints else device(g, s))
    for d in migs.values():
        if left_out(d.gpu_uuid):
            continue
        doc = _mig_device(d, by_uuid[d.gpu_uuid], s)
        taints = _taints(d.gpu_uuid, unhealthy, mark, notes, cordons)
        if taints:
            doc["taints"] = taints
        devices.append(doc)
    sets = counter_sets(gpus, mig)
    if not sets:  # no partitionable devices: the one slice of old
        return [_slice(node, 0, generation, 1, {"devices": devices})]
    chunks = [devices[i : i + MAX_SLICE_DEVICES] for i in range(0, len(devices), MAX_SLICE_DEVICES)] or [[]]
    set_chunks = [sets[i : i + MAX_COUNTER_SETS] for i in range(0, len(sets), MAX_COUNTER_SETS)]
    count = len(chunks) + len(set_chunks)
    out = [_slice(node, i, generation, count, {"devices": c}) for i, c in enumerate(chunks)]
    out += [_slice(node, len(chunks) + i, generation, count, {"sharedCounters": c}) for i, c in enumerate(set_chunks)]
    return out


def resource_slice(
    node: str,
    gpus: Iterable[GpuLike],
    s: SliceSettings,
    generation: int = 1,
    unhealthy: frozenset[str] = frozenset(),
    taint: str | None = None,
    notes: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The node's one ResourceSlice when no GPU is in MIG mode (:func:`resource_slices`)."""
    return resource_slices(node, gpus, s, generation, unhealthy, taint, notes=notes)[0]


def gpu_config(**parameters: Any) -> dict[str, Any]:
    """An opaque configuration entry for this driver: a ``GpuConfig`` with ``parameters``
    (``isolation``, ``priority``; the kubelet plugin reads them, :mod:`hami.draplugin.prepare`)."""
    return {
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, **parameters},
        }
    }


def class_config(isolation: str) -> dict[str, Any]:
    """The opaque configuration a DeviceClass hands the kubelet plugin: ``hami-core`` (libvgpu)
    or ``none`` (a whole GPU, no preload)."""
    return gpu_config(isolation=isolation)


#: what the share and whole-GPU classes select: our devices that are not MIG devices
_NOT_MIG = f'!("{PROFILE}" in device.attributes["{DRIVER}"])'


def device_classes(extended_resource_name: str | None = None) -> list[dict[str, Any]]:
    """The share class, the whole-GPU class and the MIG class. ``extended_resource_name`` (e.g.
    ``nvidia.com/gpu``) maps that extended resource onto the share class (KEP-5004)."""
    driver = f'device.driver == "{DRIVER}"'
    gpu_only = [{"cel": {"expression": f"{driver} && {_NOT_MIG}"}}]
    share: dict[str, Any] = {"selectors": gpu_only, "config": [class_config("hami-core")]}
    if extended_resource_name:
        share["extendedResourceName"] = extended_resource_name
    whole = {"selectors": gpu_only, "config": [class_config("none")]}
    mig = {"selectors": [{"cel": {"expression": f'{driver} && "{PROFILE}" in device.attributes["{DRIVER}"]'}}]}
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}
        for name, spec in ((SHARE_CLASS, share), (WHOLE_CLASS, whole), (MIG_CLASS, mig))
    ]


def mig_profiles_of(profiles: Sequence[Any]) -> tuple[MigProfileSpec, ...]:
    """:class:`MigProfileSpec` from the registration's profiles (any objects with
    ``name, memory_mb, core, slice_count, placements``)."""
    return tuple(MigProfileSpec(p.name, p.memory_mb, p.core, p.slice_count, tuple(p.placements)) for p in profiles)
