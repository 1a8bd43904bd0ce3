"""The DRA view of a node's GPUs: ResourceSlice devices and the DeviceClasses that select them.

Pure functions from the discovered GPUs (:class:`hami.node.nvml.PhysicalGPU`-like
objects) and the node settings to ``resource.k8s.io/v1`` objects as plain dicts. No I/O: the
publisher (:mod:`hami.draplugin.publisher`) writes what these return.

Each GPU is one device named ``gpu-<index>`` with ``allowMultipleAllocations: true`` (DRA
consumable capacity, KEP-5075), so kube-scheduler itself places several claims on one GPU as
long as the sum of what they consume stays within each capacity. The capacities and their
request policies restate HAMi's rules for a share:

==========  ==================================  ================================================
capacity    value                               request policy (what one allocation consumes)
==========  ==================================  ================================================
memory      bytes (NVML total x memory scaling) default: all of it (HAMi: no ``gpumem`` means
                                                100%); range min_memory .. value in MiB steps
cores       percent x core scaling (100)        default: ``defaultCores`` (0); range 0 .. value
shares      ``deviceSplitCount``                exactly 1 per allocation: the split count caps
                                                the number of claims sharing a GPU
==========  ==================================  ================================================

Attributes in the driver's domain (a CEL selector reads ``device.attributes["gpu.hami.io"]``):
``model``, ``type`` (HAMi's registration type, ``NVIDIA-<model>``), ``uuid``, ``index``,
``numa`` (0 when unknown, as in the registration), ``migCapable``, and two ``version``
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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

from hami.core.names import DRA_CONFIG_API_VERSION, DRA_DRIVER, DRA_SHARE_CLASS, DRA_WHOLE_CLASS

DRIVER = DRA_DRIVER
SHARE_CLASS = DRA_SHARE_CLASS
WHOLE_CLASS = DRA_WHOLE_CLASS
CONFIG_API_VERSION = DRA_CONFIG_API_VERSION
CONFIG_KIND = "GpuConfig"
MEMORY, CORES, SHARES = "memory", "cores", "shares"
MIB = 1024 * 1024

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


def memory_bytes(gpu: GpuLike, s: SliceSettings) -> int:
    """Published memory, whole MiB: the NVML total times ``deviceMemoryScaling``."""
    return int(gpu.memory_mib * s.memory_scaling) * MIB


def total_cores(s: SliceSettings) -> int:
    return int(100 * s.core_scaling)


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
    default_cores = min(s.default_cores, cores)
    return {
        "name": device_name(gpu.index),
        "attributes": {
            "model": _attr("string", gpu.model),
            "type": _attr("string", gpu.model if gpu.model.startswith("NVIDIA") else f"NVIDIA-{gpu.model}"),
            "uuid": _attr("string", gpu.uuid),
            "index": _attr("int", gpu.index),
            "numa": _attr("int", gpu.numa),
            "migCapable": _attr("bool", gpu.uuid in s.mig_capable),
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
            CORES: {
                "value": str(cores),
                "requestPolicy": {
                    "default": str(default_cores),
                    "validRange": {"min": "0", "max": str(cores), "step": "1"},
                },
            },
            SHARES: {"value": str(s.split_count), "requestPolicy": {"default": "1", "validValues": ["1"]}},
        },
        "allowMultipleAllocations": True,
    }


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


#: the taint an unhealthy GPU carries (KEP-5055 device taints, GA in Kubernetes 1.37)
UNHEALTHY_TAINT_KEY = f"{DRIVER}/unhealthy"
UNHEALTHY_TAINT_VALUE = "xid"  # a fatal XID (or NVML failing) marked it
TAINT_EFFECTS = ("NoSchedule", "NoExecute")


def unhealthy_taint(effect: str) -> dict[str, str]:
    """The device taint of a GPU a fatal XID marked unhealthy. ``NoSchedule`` keeps new claims
    off it; ``NoExecute`` also evicts the pods of claims allocated on it."""
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"unhealthy taint effect must be one of {', '.join(TAINT_EFFECTS)}, got {effect!r}")
    return {"key": UNHEALTHY_TAINT_KEY, "value": UNHEALTHY_TAINT_VALUE, "effect": effect}


def resource_slice(
    node: str,
    gpus: Iterable[GpuLike],
    s: SliceSettings,
    generation: int = 1,
    unhealthy: frozenset[str] = frozenset(),
    taint: str | None = None,
) -> dict[str, Any]:
    """The node's one ResourceSlice (pool = node name). An unhealthy GPU carries the device taint
    :func:`unhealthy_taint` with effect ``taint`` (kube-scheduler allocates no claim there that
    does not tolerate it); with ``taint`` None it is left out, which keeps new claims off it on
    clusters without device taints (claims already prepared keep running either way)."""
    if not node:
        raise ValueError("resource_slice: node name is empty")
    mark = unhealthy_taint(taint) if taint is not None else None
    devices = []
    for g in sorted(gpus, key=lambda g: g.index):
        if g.uuid in unhealthy:
            if mark is None:
                continue
            devices.append({**device(g, s), "taints": [dict(mark)]})
        else:
            devices.append(device(g, s))
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node), "labels": {"app.kubernetes.io/managed-by": "hami-dra"}},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def class_config(isolation: str) -> dict[str, Any]:
    """The opaque configuration a DeviceClass hands the kubelet plugin: ``hami-core`` (libvgpu)
    or ``none`` (a whole GPU, no preload)."""
    return {
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "isolation": isolation},
        }
    }


def device_classes(extended_resource_name: str | None = None) -> list[dict[str, Any]]:
    """The share class and the whole-GPU class. ``extended_resource_name`` (e.g.
    ``nvidia.com/gpu``) maps that extended resource onto the share class (KEP-5004)."""
    selector = [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
    share: dict[str, Any] = {"selectors": selector, "config": [class_config("hami-core")]}
    if extended_resource_name:
        share["extendedResourceName"] = extended_resource_name
    whole = {"selectors": selector, "config": [class_config("none")]}
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}
        for name, spec in ((SHARE_CLASS, share), (WHOLE_CLASS, whole))
    ]
