"""GPU discovery and health through NVML (``nvidia-ml-py``).

``open_nvml`` loads and initialises the library (optionally from an explicit path, which is
how tests point at the project's fake ``libnvidia-ml.so.1``); ``discover`` lists the physical
GPUs; ``XidWatcher`` turns NVML XID/ECC events into "this UUID is unhealthy" callbacks from a
background thread. NUMA nodes come from sysfs through the PCI bus id, under a configurable
root so tests can supply their own tree.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import pynvml

from hami.core.types import MigProfile

from .mig import MigNvml, registered_profiles
from .nodeconfig import NodeSettings

log = logging.getLogger(__name__)

MIB = 1024 * 1024
#: XIDs that are application errors, not device faults (§6.5); never mark a GPU unhealthy.
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
HEALTH_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError | pynvml.nvmlEventTypeSingleBitEccError
)


class NvmlUnavailable(RuntimeError):
    """NVML cannot be loaded or initialised; the message says what to check."""


@dataclass(frozen=True)
class PhysicalGPU:
    index: int
    uuid: str
    model: str  # NVML name, e.g. "Tesla V100-PCIE-32GB"
    memory_mib: int
    bus_id: str  # sysfs form, e.g. "0000:3b:00.0"
    numa: int
    mig_profiles: tuple[MigProfile, ...] = ()  # operatingmode mig: what the GPU can be cut into

    @property
    def type_name(self) -> str:
        """The registration ``type``: the model, prefixed ``NVIDIA-`` unless it starts with NVIDIA."""
        return self.model if self.model.startswith("NVIDIA") else f"NVIDIA-{self.model}"


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
    """NVML ``00000000:3B:00.0`` -> sysfs ``0000:3b:00.0``."""
    domain, _, rest = nvml_bus_id.strip().partition(":")
    return f"{domain[-4:]}:{rest}".lower()


def numa_node(sysfs_root: str | Path, bus_id: str) -> int:
    """``/sys/bus/pci/devices/<bus>/numa_node``; negative or unreadable -> 0 (§4.3)."""
    path = Path(sysfs_root) / "bus" / "pci" / "devices" / bus_id / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        log.debug("no NUMA information at %s; using node 0", path)
        return 0
    return max(value, 0)


def _memory_mib(handle, settings: NodeSettings, uuid: str) -> int | None:
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total // MIB)
    except pynvml.NVMLError_NotSupported:
        if settings.preconfigured_device_memory > 0:
            return settings.preconfigured_device_memory
        log.warning("GPU %s: NVML cannot report memory and preconfigureddevicememory is unset; skipped", uuid)
        return None


def discover(settings: NodeSettings, sysfs_root: str | Path = "/sys") -> list[PhysicalGPU]:
    """The node's physical GPUs in NVML index order, minus those filtered out by config."""
    out = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        if uuid in settings.filter_uuids or index in settings.filter_indexes:
            log.info("GPU %d (%s) excluded by filterdevices", index, uuid)
            continue
        memory = _memory_mib(handle, settings, uuid)
        if memory is None:
            continue
        bus = sysfs_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
        model = _text(pynvml.nvmlDeviceGetName(handle))
        out.append(
            PhysicalGPU(
                index=index,
                uuid=uuid,
                model=model,
                memory_mib=memory,
                bus_id=bus,
                numa=numa_node(sysfs_root, bus),
                mig_profiles=_mig_profiles(uuid, model, settings) if settings.operating_mode == "mig" else (),
            )
        )
    return out


def _mig_profiles(uuid: str, model: str, settings: NodeSettings) -> tuple[MigProfile, ...]:
    """operatingmode mig: MIG mode on, and the profiles the scheduler may choose (mig.py)."""
    nvml = MigNvml()
    nvml.enable(uuid)
    return registered_profiles(nvml.profiles(uuid), model, settings.mig_allowlist)


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


class XidWatcher:
    """Waits on NVML health events in a thread and reports unhealthy UUIDs.

    ``on_unhealthy(uuids)`` is called from the watcher thread with the UUIDs to mark
    unhealthy (all of them when NVML itself fails, as HAMi does). ``stop()`` ends the thread
    within one wait period.
    """

    def __init__(
        self,
        uuids: Iterable[str],
        on_unhealthy: Callable[[list[str]], None],
        ignored: frozenset[int] = IGNORED_XIDS,
        wait_ms: int = 1000,
    ) -> None:
        self._uuids = list(uuids)
        self._on_unhealthy = on_unhealthy
        self._ignored = ignored
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
            self._on_unhealthy(list(self._uuids))
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
            self._on_unhealthy(list(self._uuids))
            self._stop.wait(self._wait_ms / 1000)
            return
        xid = int(data.eventData)
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            log.info("ECC event type %#x (data %d) noted; only critical XIDs mark a GPU unhealthy", data.eventType, xid)
            return
        if xid in self._ignored:
            log.info("ignoring XID %d (application error, not a device fault)", xid)
            return
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError:
            uuid = ""
        if uuid not in self._uuids:
            log.error("health event (XID %d) for an unknown device; marking all GPUs unhealthy", xid)
            self._on_unhealthy(list(self._uuids))
            return
        log.warning("GPU %s: XID %d (event type %#x); marking it unhealthy", uuid, xid, data.eventType)
        self._on_unhealthy([uuid])
