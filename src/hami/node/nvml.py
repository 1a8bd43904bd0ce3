"""The node's one door to NVML (``nvidia-ml-py``): every NVML call a node program makes is here.

What this module owns, by section:

* loading: :func:`open_nvml` loads and initialises the library (optionally from an explicit
  path, which is how tests point at the project's fake ``libnvidia-ml.so.1``), :func:`close_nvml`;
* discovery: :func:`discover` lists the physical GPUs (:class:`PhysicalGPU`), with their NUMA node
  and PCIe root complex from sysfs through the PCI bus id (:func:`sysfs_numa`, :func:`pcie_root`;
  under a configurable root so tests can supply their own tree), their CUDA compute capability
  and, in ``operatingmode: mig``, the MIG profiles they register (:func:`registered_profiles`);
  small facts (:func:`driver_version`, :func:`mig_capable`, :func:`mig_enabled`,
  :func:`gpu_uuids`, :func:`minor_number`);
* health: :class:`XidWatcher` turns NVML XID/ECC events into "this UUID is unhealthy" callbacks
  from a background thread, :func:`ignored_xids` reads the ``DP_*_HEALTHCHECKS`` switches;
* MIG: :class:`MigNvml`, the MIG calls (profiles and placements of a GPU, its instances, create
  and destroy), nothing else;
* topology: :func:`read_links`, each GPU's NVLinks and every pair's PCIe level;
* host readings: :func:`read_host`, what ``hami monitor`` exports per GPU at scrape time.

What it does not own: decisions on what NVML reports (the MIG lifecycle and its checkpoint,
``hami.node.mig``; pair scores, ``hami.deviceplugin.topology``; metrics,
``hami.monitor.exporter``), and anything written to the node (``hami.node.layout``).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import re
import threading
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

import pynvml

from hami.core.types import MigProfile

if TYPE_CHECKING:  # read only: the monitor loads NVML without the settings model
    from .settings import NodeSettings

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------- loading, discovery

MIB = 1024 * 1024


class NvmlUnavailable(RuntimeError):
    """NVML cannot be loaded or initialised; the message says what to check."""


@dataclass(frozen=True)
class PhysicalGPU:
    index: int
    uuid: str
    model: str  # NVML name, e.g. "Tesla V100-PCIE-32GB"
    memory_mib: int
    bus_id: str  # sysfs form, e.g. "0000:3b:00.0"
    numa: int  # the registration's NUMA node: sysfs, 0 when unknown (HAMi's rule)
    mig_profiles: tuple[MigProfile, ...] = ()  # operatingmode mig: what the GPU can be cut into
    # what the DRA slice publishes when known (None: unknown, the attribute is left out)
    numa_node: int | None = None  # sysfs numa_node when it is >= 0
    pcie_root: str | None = None  # "pci<domain>:<bus>", the root complex above the GPU in sysfs
    compute_capability: str | None = None  # NVML's CUDA compute capability, "<major>.<minor>"
    #: the number in the GPU's DRA device names when the DRA agent keeps them per UUID
    #: (:mod:`hami.draplugin.names`): None = the NVML index, as the device plugin names it
    slot: int | None = None

    @property
    def type_name(self) -> str:
        """The registration ``type`` (:func:`type_name`)."""
        return type_name(self.model)


def type_name(model: str) -> str:
    """The registration ``type`` of an NVML device name: prefixed ``NVIDIA-`` unless it starts with NVIDIA."""
    return model if model.startswith("NVIDIA") else f"NVIDIA-{model}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def open_nvml(library: str | None = None) -> None:
    """Load NVML (from ``library`` when given, else the usual ``libnvidia-ml.so.1``) and init it."""
    try:
        if library:
            pynvml.nvmlLib = ctypes.CDLL(os.fspath(library))
        pynvml.nvmlInit()
    except (OSError, pynvml.NVMLError) as exc:
        where = library or "libnvidia-ml.so.1"
        raise NvmlUnavailable(
            f"NVML could not be loaded from {where}: {exc}. Check that the NVIDIA driver is installed on "
            "the node and that the plugin container runs with the NVIDIA runtime "
            "(NVIDIA_VISIBLE_DEVICES=all) or has the driver libraries mounted"
        ) from None


def close_nvml() -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:  # pragma: no cover - shutdown errors are not actionable
        pass


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML ``00000000:3B:00.0`` (or sysfs ``0000:3b:00.0``) -> sysfs ``0000:3b:00.0``."""
    domain, _, rest = nvml_bus_id.strip().partition(":")
    return f"{domain[-4:]}:{rest}".lower()


def _pci_device(sysfs_root: str | Path, bus_id: str) -> Path:
    return Path(sysfs_root) / "bus" / "pci" / "devices" / bus_id


def sysfs_numa(sysfs_root: str | Path, bus_id: str) -> int | None:
    """``/sys/bus/pci/devices/<bus>/numa_node`` as the kernel gives it; None when unreadable or
    negative (-1: the device has no NUMA affinity). NVML's ``nvmlDeviceGetNumaNodeId`` is not
    a substitute: it answers only where the GPU itself is a NUMA node (coherent platforms)."""
    path = _pci_device(sysfs_root, bus_id) / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        log.debug("no NUMA information at %s", path)
        return None
    return value if value >= 0 else None


def numa_node(sysfs_root: str | Path, bus_id: str) -> int:
    """The registration's NUMA node: :func:`sysfs_numa`, negative or unreadable -> 0 (§4.3)."""
    value = sysfs_numa(sysfs_root, bus_id)
    return 0 if value is None else value


_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def pcie_root(sysfs_root: str | Path, bus_id: str) -> str | None:
    """The PCIe root complex above ``bus_id`` (``pci<domain>:<bus>``), as Kubernetes' standard
    ``pcieRoot`` attribute names it: ``/sys/bus/pci/devices/<bus>`` is a link into the device
    tree ``/sys/devices/pci<domain>:<bus>/.../<bus>``, whose first part below ``devices`` is the
    root. None when there is no such link or it points elsewhere."""
    link = _pci_device(sysfs_root, bus_id)
    try:
        target = os.readlink(link)
    except OSError:
        log.debug("no PCIe root for %s: %s is not a link", bus_id, link)
        return None
    resolved = Path(os.path.normpath(link.parent / target))
    try:
        parts = resolved.relative_to(Path(os.path.normpath(Path(sysfs_root) / "devices"))).parts
    except ValueError:
        parts = ()
    if len(parts) < 2 or parts[-1] != bus_id or not _PCIE_ROOT.fullmatch(parts[0]):
        log.debug("no PCIe root for %s: %s points to %s", bus_id, link, resolved)
        return None
    return parts[0]


def _compute_capability(handle) -> str | None:
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    except pynvml.NVMLError:
        return None
    return f"{int(major)}.{int(minor)}"


def _memory_mib(handle, settings: NodeSettings, uuid: str) -> int | None:
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total // MIB)
    except pynvml.NVMLError_NotSupported:
        if settings.preconfigured_device_memory > 0:
            return settings.preconfigured_device_memory
        log.warning("GPU %s: NVML cannot report memory and preconfigureddevicememory is unset; skipped", uuid)
        return None


def _mig_on(handle) -> bool:
    try:
        current, _ = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:  # NotSupported: a GPU without MIG
        return False
    return current == pynvml.NVML_DEVICE_MIG_ENABLE


def discover(settings: NodeSettings, sysfs_root: str | Path = "/sys") -> list[PhysicalGPU]:
    """The node's physical GPUs in NVML index order, minus those filtered out by config and those in
    MIG mode that nothing here would cut into instances (shared whole, their containers would find
    no CUDA device)."""
    out = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        # a GPU NVML cannot read (fallen off the bus: GpuIsLost) is left out, loudly; raised, it
        # stopped the plugin, and the node offered none of its healthy GPUs (found by review, 1 Dec)
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as exc:
            log.error("GPU %d: NVML cannot read its handle or UUID (%s); left out, the others are served", index, exc)
            continue
        if uuid in settings.filter_uuids or index in settings.filter_indexes:
            log.info("GPU %d (%s) excluded by filterdevices", index, uuid)
            continue
        if settings.operating_mode != "mig" and settings.mig_strategy != "mixed" and _mig_on(handle):
            log.warning(
                "GPU %d (%s) is in MIG mode: no CUDA process can use it whole, so it is left out "
                "(operatingmode %s, migstrategy %s); set operatingmode mig or migstrategy mixed for it, "
                "or turn MIG mode off (nvidia-smi -i %d -mig 0)",
                index,
                uuid,
                settings.operating_mode,
                settings.mig_strategy,
                index,
            )
            continue
        try:
            memory = _memory_mib(handle, settings, uuid)
            if memory is None:
                continue
            bus = sysfs_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
            model = _text(pynvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError as exc:
            log.error(
                "GPU %d (%s): NVML cannot read its memory, PCI bus id or name (%s); left out, the others are served",
                index,
                uuid,
                exc,
            )
            continue
        out.append(
            PhysicalGPU(
                index=index,
                uuid=uuid,
                model=model,
                memory_mib=memory,
                bus_id=bus,
                numa=numa_node(sysfs_root, bus),
                mig_profiles=_mig_profiles(uuid, model, settings) if settings.operating_mode == "mig" else (),
                numa_node=sysfs_numa(sysfs_root, bus),
                pcie_root=pcie_root(sysfs_root, bus),
                compute_capability=_compute_capability(handle),
            )
        )
    return out


def _mig_profiles(uuid: str, model: str, settings: NodeSettings) -> tuple[MigProfile, ...]:
    """operatingmode mig: MIG mode on, and the profiles the scheduler may choose."""
    nvml = MigNvml()
    nvml.enable(uuid)
    return registered_profiles(nvml.profiles(uuid), model, settings.mig_allowlist)


def registered_profiles(
    profiles: Sequence[GpuProfile], model: str, allowlist: Sequence[tuple[Sequence[str], Sequence[str]]]
) -> tuple[MigProfile, ...]:
    """The ``migProfiles`` of the registration: NVML's profiles, narrowed by the first allowlist
    entry whose model is contained in ``model`` (an entry without profiles keeps all); with no
    entry, the plain profiles (no ``+me``-style variants). ``core`` = ceil(SMs x 100 / the
    largest profile's SMs)."""
    full = max((p.sms for p in profiles), default=0) or 1
    keep: Callable[[GpuProfile], bool] = lambda p: "+" not in p.name and "-" not in p.name  # noqa: E731
    for models, names in allowlist:
        if any(m and m in model for m in models):
            keep = (lambda p: p.name in names) if names else (lambda p: True)  # noqa: E731
            break
    return tuple(
        MigProfile(p.name, p.memory_mb, math.ceil(p.sms * 100 / full), p.slices, p.placements)
        for p in sorted(profiles, key=lambda p: (p.memory_mb, p.slices, p.name))
        if keep(p)
    )


# ------------------------------------------------------------------------------- facts


def driver_version() -> str:
    """The driver version NVML reports; "" when it cannot say."""
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
    except pynvml.NVMLError:
        return ""
    return version.decode() if isinstance(version, bytes) else str(version)


def mig_capable(uuids: Iterable[str]) -> frozenset[str]:
    """The GPUs among ``uuids`` that have a MIG mode at all (on or off)."""
    out = set()
    for uuid in uuids:
        try:
            pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByUUID(uuid))
            out.add(uuid)
        except pynvml.NVMLError:  # NotSupported: not MIG capable
            pass
    return frozenset(out)


def mig_enabled(uuid: str) -> bool:
    """Whether the GPU is in MIG mode now."""
    try:
        current, _ = pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByUUID(uuid))
    except pynvml.NVMLError:
        return False
    return current == pynvml.NVML_DEVICE_MIG_ENABLE


def gpu_uuids() -> list[str]:
    """Every GPU's UUID in NVML index order (no filter applied)."""
    return [
        _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
        for i in range(pynvml.nvmlDeviceGetCount())
    ]


def minor_number(uuid: str) -> int:
    """The GPU's device node number: ``/dev/nvidia<minor>``."""
    return int(pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByUUID(uuid)))


# ------------------------------------------------------------------------------- health

#: XIDs that are application errors, not device faults (§6.5); never mark a GPU unhealthy.
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
HEALTH_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError | pynvml.nvmlEventTypeSingleBitEccError
)


def ignored_xids(env: dict[str, str] | None = None) -> frozenset[int] | None:
    """XIDs to ignore, from ``DP_DISABLE_HEALTHCHECKS``; None means health checks are off."""
    env = os.environ if env is None else env
    raw = env.get("DP_DISABLE_HEALTHCHECKS", "").strip().lower()
    if raw in ("all", "xids"):
        return None
    extra = set()
    for part in filter(None, (p.strip() for p in raw.split(","))):
        try:
            extra.add(int(part))
        except ValueError:
            log.warning("DP_DISABLE_HEALTHCHECKS: ignoring %r (not an XID number)", part)
    forced = {p.strip() for p in env.get("DP_ENABLE_HEALTHCHECKS", "").split(",") if p.strip().isdigit()}
    return frozenset((IGNORED_XIDS | extra) - {int(x) for x in forced})


def _handle_key(handle) -> object:
    """What tells NVML device handles apart: the address a ctypes handle points to (each read of
    an event's ``device`` field is a new pointer object), else the handle itself."""
    if isinstance(handle, (ctypes._Pointer, ctypes.c_void_p)):
        return ctypes.cast(handle, ctypes.c_void_p).value
    try:
        hash(handle)
    except TypeError:
        return id(handle)
    return handle


class XidWatcher:
    """Waits on NVML health events in a thread and reports unhealthy UUIDs.

    ``on_unhealthy(uuids)`` is called from the watcher thread with the UUIDs to mark
    unhealthy (all of them when NVML itself fails, as HAMi does). ``on_minor(uuid, xid)``, when
    given, is called for a critical-XID event whose XID is in ``ignored`` (an application error,
    or one ``DP_DISABLE_HEALTHCHECKS`` names) on one of ``uuids``: not a fault, but worth
    recording (the DRA agent's informational device taint). ``on_failure(uuids)``, when given,
    is called instead of ``on_unhealthy`` when the marks come from NVML itself failing (events
    not registered, a failed wait, an event naming no device of ours) rather than an XID on a
    GPU: a caller that keeps marks across restarts (the DRA agent) keeps only the XIDs', since
    a restart is what clears a watcher's own failure. ``stop()`` ends the thread within one
    wait period.
    """

    def __init__(
        self,
        uuids: Iterable[str],
        on_unhealthy: Callable[[list[str]], None],
        ignored: frozenset[int] = IGNORED_XIDS,
        wait_ms: int = 1000,
        on_minor: Callable[[str, int], None] | None = None,
        on_failure: Callable[[list[str]], None] | None = None,
    ) -> None:
        self._uuids = list(uuids)
        self._on_unhealthy = on_unhealthy
        self._on_failure = on_failure or on_unhealthy
        self._on_minor = on_minor
        self._ignored = ignored
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: the handles registered (_handle_key) -> UUID: names an event's device when NVML
        #: cannot read its UUID any more (a GPU fallen off the bus)
        self._handles: dict[object, str] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hami-xid-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._wait_ms / 1000 + 5)

    def _register(self):
        event_set = pynvml.nvmlEventSetCreate()
        for uuid in self._uuids:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            self._handles[_handle_key(handle)] = uuid
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, HEALTH_EVENTS, event_set)
            except pynvml.NVMLError_NotSupported:
                log.warning("GPU %s does not support health events; it is never marked unhealthy", uuid)
        return event_set

    def _run(self) -> None:
        try:
            event_set = self._register()
        except pynvml.NVMLError as exc:
            log.error("cannot register NVML health events (%s); marking all GPUs unhealthy", exc)
            self._on_failure(list(self._uuids))
            return
        try:
            while not self._stop.is_set():
                self._wait_once(event_set)
        finally:
            try:
                pynvml.nvmlEventSetFree(event_set)
            except pynvml.NVMLError:  # pragma: no cover
                pass

    def _wait_once(self, event_set) -> None:
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
        except pynvml.NVMLError_Timeout:
            return
        except pynvml.NVMLError as exc:
            log.error("NVML event wait failed (%s); marking all GPUs unhealthy", exc)
            self._on_failure(list(self._uuids))
            self._stop.wait(self._wait_ms / 1000)
            return
        xid = int(data.eventData)
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            log.info("ECC event type %#x (data %d) noted; only critical XIDs mark a GPU unhealthy", data.eventType, xid)
            return
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as exc:
            # a GPU fallen off the bus answers nothing, but its handle is the one registered for
            # it: that GPU, not every GPU of the node (found by review, 1 Dec)
            uuid = self._handles.get(_handle_key(data.device), "")
            log.warning(
                "health event (XID %d): NVML cannot read the device's UUID (%s); %s",
                xid,
                exc,
                f"its handle is GPU {uuid}'s" if uuid else "its handle is none registered",
            )
        if xid in self._ignored:
            log.info("GPU %s: XID %d is not a device fault (application error or disabled check)", uuid or "?", xid)
            if self._on_minor is not None and uuid in self._uuids:
                self._on_minor(uuid, xid)
            return
        if uuid not in self._uuids:
            log.error("health event (XID %d) for an unknown device; marking all GPUs unhealthy", xid)
            self._on_failure(list(self._uuids))
            return
        log.warning("GPU %s: XID %d (event type %#x); marking it unhealthy", uuid, xid, data.eventType)
        self._on_unhealthy([uuid])


# ------------------------------------------------------------------------------- MIG

PROFILE_COUNT = pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT  # profile indices to ask about (unknown ones fail, skipped)
#: compute-instance profile covering a whole GPU instance of N compute slices
CI_PROFILE = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}


class MigError(RuntimeError):
    """A MIG instance cannot be made or found; the message names the GPU, profile and placement."""


@dataclass(frozen=True)
class GpuProfile:
    """One GPU-instance profile as NVML reports it."""

    name: str  # "1g.5gb"
    nvml_id: int
    slices: int
    instances: int
    sms: int
    memory_mb: int
    placements: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Instance:
    """A GPU instance on one GPU, with its compute instance and MIG device when they exist."""

    gi: int
    profile: str
    start: int
    size: int
    ci: int | None = None
    mig_uuid: str = ""


def _profile_name(raw: str) -> str:
    return raw[4:] if raw.startswith("MIG ") else raw


class MigNvml:
    """NVML's MIG API for one node (NVML already initialised)."""

    def handle(self, uuid: str):
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)

    def enable(self, uuid: str) -> None:
        """Turn MIG mode on (a no-op when it is on); refuses with a clear error when it cannot."""
        h = self.handle(uuid)
        try:
            current, _ = pynvml.nvmlDeviceGetMigMode(h)
        except pynvml.NVMLError_NotSupported:
            raise MigError(
                f"GPU {uuid} does not support MIG (operatingmode: mig needs A100/A30/H100-class GPUs)"
            ) from None
        if current == pynvml.NVML_DEVICE_MIG_ENABLE:
            return
        try:
            pynvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
        except pynvml.NVMLError as exc:
            raise MigError(f"GPU {uuid}: cannot enable MIG mode ({exc}); stop the processes using it") from None
        log.info("GPU %s: MIG mode enabled", uuid)

    def profiles(self, uuid: str) -> list[GpuProfile]:
        h = self.handle(uuid)
        out = []
        for index in range(PROFILE_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
            except pynvml.NVMLError:
                continue
            arr = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()
            count = ctypes.c_uint(len(arr))
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(count))
            out.append(
                GpuProfile(
                    name=_profile_name(_text(info.name)),
                    nvml_id=int(info.id),
                    slices=int(info.sliceCount),
                    instances=int(info.instanceCount),
                    sms=int(info.multiprocessorCount),
                    memory_mb=int(info.memorySizeMB),
                    placements=tuple((int(arr[i].start), int(arr[i].size)) for i in range(count.value)),
                )
            )
        return out

    def _mig_uuids(self, h) -> dict[int, str]:
        """GPU instance id -> MIG device UUID, for the instances that have a compute instance."""
        out = {}
        for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except pynvml.NVMLError:
                continue
            out[int(pynvml.nvmlDeviceGetGpuInstanceId(m))] = _text(pynvml.nvmlDeviceGetUUID(m))
        return out

    def instances(self, uuid: str) -> list[Instance]:
        h = self.handle(uuid)
        migs = self._mig_uuids(h)
        out = []
        for p in self.profiles(uuid):
            arr = (pynvml.c_nvmlGpuInstance_t * max(p.instances, 1))()
            count = ctypes.c_uint(len(arr))
            pynvml.nvmlDeviceGetGpuInstances(h, p.nvml_id, arr, ctypes.byref(count))
            for k in range(count.value):
                info = pynvml.nvmlGpuInstanceGetInfo(arr[k])
                gid = int(info.id)
                ci = self._ci_id(arr[k], p.slices)
                out.append(
                    Instance(
                        gid,
                        p.name,
                        int(info.placement.start),
                        int(info.placement.size),
                        ci,
                        migs.get(gid, "") if ci is not None else "",
                    )
                )
        return sorted(out, key=lambda i: i.gi)

    @staticmethod
    def _ci_id(gi, slices: int) -> int | None:
        arr = (pynvml.c_nvmlComputeInstance_t * 8)()
        count = ctypes.c_uint(len(arr))
        try:
            pynvml.nvmlGpuInstanceGetComputeInstances(gi, CI_PROFILE[slices], arr, ctypes.byref(count))
        except pynvml.NVMLError:
            return None
        return int(pynvml.nvmlComputeInstanceGetInfo(arr[0]).id) if count.value else None

    def create_gi(self, uuid: str, profile: GpuProfile, start: int) -> int:
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, dict(profile.placements).get(start, 0)
        try:
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                self.handle(uuid), profile.nvml_id, ctypes.byref(placement)
            )
        except pynvml.NVMLError as exc:
            raise MigError(
                f"GPU {uuid}: cannot create a {profile.name} instance at placement {start}+{placement.size}: {exc}"
            ) from None
        return int(pynvml.nvmlGpuInstanceGetInfo(gi).id)

    def create_ci(self, uuid: str, gi_id: int, profile: GpuProfile) -> tuple[int, str]:
        h = self.handle(uuid)
        gi = pynvml.nvmlDeviceGetGpuInstanceById(h, gi_id)
        try:
            ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI_PROFILE[profile.slices])
        except pynvml.NVMLError as exc:
            raise MigError(f"GPU {uuid}: cannot create the compute instance of GPU instance {gi_id}: {exc}") from None
        ci_id = int(pynvml.nvmlComputeInstanceGetInfo(ci).id)
        return ci_id, self._mig_uuids(h).get(gi_id, "")

    def destroy(self, uuid: str, gi_id: int) -> None:
        """Destroy GPU instance ``gi_id`` and its compute instances; gone already is fine."""
        h = self.handle(uuid)
        try:
            gi = pynvml.nvmlDeviceGetGpuInstanceById(h, gi_id)
        except pynvml.NVMLError_NotFound:
            return
        arr = (pynvml.c_nvmlComputeInstance_t * 8)()
        for profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            count = ctypes.c_uint(len(arr))
            try:
                pynvml.nvmlGpuInstanceGetComputeInstances(gi, profile, arr, ctypes.byref(count))
            except pynvml.NVMLError:
                continue
            for k in range(count.value):
                pynvml.nvmlComputeInstanceDestroy(arr[k])
        pynvml.nvmlGpuInstanceDestroy(gi)


# ------------------------------------------------------------------------------- topology

#: NVML's PCIe topology levels (``nvmlDeviceGetTopologyCommonAncestor``), nearest first
TOPOLOGY_INTERNAL = pynvml.NVML_TOPOLOGY_INTERNAL
TOPOLOGY_SINGLE = pynvml.NVML_TOPOLOGY_SINGLE
TOPOLOGY_MULTIPLE = pynvml.NVML_TOPOLOGY_MULTIPLE
TOPOLOGY_HOSTBRIDGE = pynvml.NVML_TOPOLOGY_HOSTBRIDGE
TOPOLOGY_NODE = pynvml.NVML_TOPOLOGY_NODE
TOPOLOGY_SYSTEM = pynvml.NVML_TOPOLOGY_SYSTEM
MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS


@dataclass(frozen=True)
class GpuLinks:
    """One GPU's view of its links: direct NVLinks per peer UUID and NVLinks into an NVSwitch."""

    uuid: str
    direct: dict[str, int] = field(default_factory=dict)
    switch: int = 0


@dataclass(frozen=True)
class Topology:
    """Everything the pair score needs: per-GPU links and the PCIe level of every pair (a, b)."""

    gpus: tuple[GpuLinks, ...]
    pcie: dict[tuple[str, str], int]  # (uuid a, uuid b) -> NVML topology level, a before b


def _links_of(handle, uuid: str, by_bus: dict[str, str]) -> GpuLinks:
    direct: dict[str, int] = {}
    switch = 0
    for link in range(MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
        except pynvml.NVMLError:  # not supported / no such link: the GPU has fewer links
            continue
        try:
            kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except pynvml.NVMLError:
            kind = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU  # older drivers: decide by the remote bus id
        if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            switch += 1
            continue
        try:
            bus = sysfs_bus_id(_text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except pynvml.NVMLError as exc:
            log.info("GPU %s link %d: remote end unknown (%s); not counted", uuid, link, exc)
            continue
        peer = by_bus.get(bus)
        if peer is not None and peer != uuid:
            direct[peer] = direct.get(peer, 0) + 1
    return GpuLinks(uuid, direct, switch)


def read_links(uuids: Sequence[str]) -> Topology:
    """Read the links of the GPUs ``uuids`` (NVML must be initialised). A GPU whose links
    cannot be read counts as PCIe-only; a pair whose PCIe level cannot be read, as SYSTEM."""
    handles = {u: pynvml.nvmlDeviceGetHandleByUUID(u) for u in uuids}
    by_bus = {sysfs_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(h).busId)): u for u, h in handles.items()}
    gpus = tuple(_links_of(handles[u], u, by_bus) for u in uuids)
    pcie = {}
    for a, b in combinations(uuids, 2):
        try:
            pcie[(a, b)] = int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
        except pynvml.NVMLError as exc:
            log.info("GPUs %s and %s: PCIe path unknown (%s); scored as different CPUs", a, b, exc)
            pcie[(a, b)] = TOPOLOGY_SYSTEM
    return Topology(gpus, pcie)


# ------------------------------------------------------------------------------- host readings
# What ``hami monitor`` exports per GPU, read at scrape time. Any NVML call that fails leaves
# that one value out; a scrape never fails because of one device.


@dataclass(frozen=True, slots=True)
class HostGPU:
    """One device as NVML shows it at scrape time (memory used, GPU and memory-controller
    utilisation, and the memory each host PID holds on it)."""

    index: int
    uuid: str
    name: str
    memory_used: int | None = None  # bytes
    utilization: int | None = None  # percent (0-100)
    memory_utilization: int | None = None  # percent
    process_memory: Mapping[int, int] = field(default_factory=dict)  # host PID -> bytes
    temperature: int | None = None  # degrees Celsius (the GPU die sensor)
    power_watts: float | None = None  # power draw
    #: lifetime ECC error counts (NVML's aggregate counter): error type -> count
    ecc_errors: Mapping[str, int] = field(default_factory=dict)


def _try(call: Callable[[], object], what: str) -> object | None:
    try:
        return call()
    except pynvml.NVMLError as exc:
        log.debug("NVML %s failed: %s", what, exc)
        return None


def _processes(handle: object) -> dict[int, int]:
    procs = _try(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle), "running processes") or []
    out: dict[int, int] = {}
    for p in procs:  # a PID may appear once per context; add them up
        used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else 0
        out[int(p.pid)] = out.get(int(p.pid), 0) + used
    return out


def read_host() -> list[HostGPU]:
    """Every device NVML shows (NVML must have been initialised)."""
    count = _try(pynvml.nvmlDeviceGetCount, "device count") or 0
    gpus: list[HostGPU] = []
    for i in range(int(count)):
        handle = _try(lambda: pynvml.nvmlDeviceGetHandleByIndex(i), f"handle {i}")
        if handle is None:
            continue
        uuid = _try(lambda: _text(pynvml.nvmlDeviceGetUUID(handle)), "uuid")
        if not uuid:
            continue
        mem = _try(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle), "memory info")
        util = _try(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle), "utilization")
        temp = _try(lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU), "temperature")
        power = _try(lambda: pynvml.nvmlDeviceGetPowerUsage(handle), "power usage")  # milliwatts
        gpus.append(
            HostGPU(
                index=i,
                uuid=str(uuid),
                name=str(_try(lambda: _text(pynvml.nvmlDeviceGetName(handle)), "name") or ""),
                memory_used=int(mem.used) if mem is not None else None,
                utilization=int(util.gpu) if util is not None else None,
                memory_utilization=int(util.memory) if util is not None else None,
                process_memory=_processes(handle),
                temperature=int(temp) if isinstance(temp, int) else None,
                power_watts=power / 1000.0 if isinstance(power, int) else None,
                ecc_errors=_ecc(handle),
            )
        )
    return gpus


def _ecc(handle: object) -> dict[str, int]:
    """Lifetime ECC errors by type (``corrected``, ``uncorrected``); empty where ECC is off or
    not supported (most consumer GPUs)."""
    out: dict[str, int] = {}
    for kind, code in (
        ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
    ):
        n = _try(lambda: pynvml.nvmlDeviceGetTotalEccErrors(handle, code, pynvml.NVML_AGGREGATE_ECC), "ECC errors")
        if isinstance(n, int):
            out[kind] = n
    return out
