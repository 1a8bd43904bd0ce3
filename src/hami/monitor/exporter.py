"""The monitor's Prometheus collector: host GPUs from NVML, containers from their regions.

Everything is read at scrape time: the containers directory is listed, each region file is read
(:mod:`.region`) and each directory ``<podUID>_<container>`` is named after its pod through a
pod map the refresh loop keeps (``pods()``; ``None`` = standalone, label the pod by its UID).
A region that fails validation is skipped with one warning per file and problem, and counted in
``hami_monitor_regions{state="invalid"}``; it never fails the scrape.

Regions of DRA claims (``<claims_dir>/<claim UID>/``, :func:`.containers.scan_claims`) are read
too, under the same metric names and labels: ``namespace`` is the claim's, ``pod`` the pod on this
node whose ``status.resourceClaimStatuses`` name the claim, ``container`` the one container of
that pod using it, or the claim's name when several share it (they share one region, one memory
budget). Standalone, ``pod`` is the claim's UID and ``container`` its name.

Metric names and labels are HAMi's (reference hami-control-plane §9.2); every metric carries
``zone="vGPU"``. With ``legacy=True`` the old names are exported as well, with HAMi's old label
names (``MigInfo`` included: ``podnamespace, podname, ctrname, vdeviceid, deviceuuid, instanceid``).
The host metrics' ``device_type`` is :func:`host_device_type`, as HAMi's monitor writes it, which
is not the registration's ``type``.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hami.metricnames import (
    BUILD_INFO,
    BUILD_INFO_HELP,
    BUILD_LABELS,
    CONTAINER_MEMORY_USED,
    CONTAINER_UTILIZATION,
    HOST_MEMORY_USED,
    HOST_UTILIZATION,
    ZONE,
    build_info_values,
)
from hami.node.nvml import HostGPU

from .containers import ClaimDir, ContainerDir, printable, scan, scan_claims
from .region import Region, RegionError, read_region

log = logging.getLogger(__name__)

_DIGITS = re.compile(r"\d+")
MIB = 1 << 20
_MESSAGE_LIMIT = 400  # characters of a problem logged; the container writes what goes into it

HOST_LABELS = ("node", "device_index", "device_uuid", "device_type")
HOST_TEMPERATURE = "hami_host_gpu_temperature_celsius"
HOST_POWER = "hami_host_gpu_power_usage_watts"
HOST_ECC = "hami_host_gpu_ecc_errors"  # a counter: exported as hami_host_gpu_ecc_errors_total
HOST_MC_LABELS = ("device_index", "device_uuid", "device_type")
CTR_LABELS = ("namespace", "pod", "container", "vdevice_index", "device_uuid")
MIG_LABELS = CTR_LABELS + ("mig_uuid", "profile", "gpu_instance_id", "compute_instance_id")
MIG_INFO = "hami_mig_device_info"
LEGACY_HOST_LABELS = ("nodeid", "deviceidx", "deviceuuid", "devicetype")
LEGACY_CTR_LABELS = ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid")
LEGACY_MIG_LABELS = LEGACY_CTR_LABELS + ("instanceid",)  # the GPU instance ID


def host_device_type(nvml_name: str) -> str:
    """The ``device_type`` (legacy ``devicetype``) of the host metrics: ``NVIDIA-`` + the NVML
    name, always, as HAMi's monitor writes it up to v2.10 (``"NVIDIA-" + deviceName`` in
    cmd/vGPUmonitor/metrics.go), so ``NVIDIA-NVIDIA H100 80GB HBM3`` on current drivers. The
    registration's type (and so the scheduler's ``device_type``) prefixes only a name without
    ``NVIDIA``; HAMi's monitor took that rule after v2.10 (HAMi PR #2991)."""
    return f"NVIDIA-{nvml_name}"


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG instance a pod's container holds (from ``hami.io/vgpu-mig-allocations``)."""

    container: str
    vdevice_index: int
    device_uuid: str
    mig_uuid: str
    profile: str
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    """What the scheduler gave one container of a pod (``hami.io/vgpu-devices-allocated``, MIG
    instances of ``hami.io/vgpu-mig-allocations``) and its priority (the priority resource;
    libvgpu's default, 1, when unset): what the feedback loop trusts, never the region's copy."""

    container: str
    uuids: tuple[str, ...]  # GPU UUIDs, and MIG device UUIDs in MIG mode
    priority: int
    #: the memory granted on each device, MiB, as ``(UUID as the grant names it, MiB)`` (the
    #: ``usedmem`` of the allocation annotation): exported as ``hami_vgpu_memory_limit_bytes``
    #: in place of the region's ``limit``, which the container writes. None (or a device not
    #: listed): the region's value, as before
    memory_mib: tuple[tuple[str, int], ...] | None = None

    def memory_bytes(self) -> dict[str, int]:
        """:func:`device_key` -> the memory granted on that device, bytes (first entry wins)."""
        out: dict[str, int] = {}
        for uuid, mib in self.memory_mib or ():
            out.setdefault(device_key(uuid), mib * MIB)
        return out


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    mig: tuple[MigDevice, ...] = ()
    #: the ResourceClaims the pod uses: (claim name, names of the containers using it)
    claims: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: the device plugin's grants, one per container given GPUs
    grants: tuple[ContainerGrant, ...] = ()
    #: init containers that ran to their end (not sidecars): they hold nothing and run no more
    finished: frozenset[str] = frozenset()

    def grant(self, container: str) -> ContainerGrant | None:
        return next((g for g in self.grants if g.container == container), None)


def device_key(uuid: str) -> str:
    """A device UUID without its 4-character kind prefix: libvgpu writes every device it sees as
    ``GPU-<uuid bytes>``, a MIG instance included, where the grant says ``MIG-<same bytes>``
    (libvgpu's region.c compares devices the same way)."""
    return uuid[4:] if len(uuid) > 4 and uuid[3] == "-" else uuid


def _granted(pod: PodRef, container: str) -> Mapping[str, str] | None:
    """The devices ``pod`` was granted for ``container``, :func:`device_key` -> the UUID the grant
    names (``MIG-...`` for a MIG instance): none when the pod has grants but not for it, None
    (unchecked) when the pod has no grant at all."""
    grant = pod.grant(container)
    if grant is not None:
        return {device_key(u): u for u in grant.uuids}
    return {} if pod.grants else None


def taken_devices(pods: Mapping[str, PodRef], claims: Iterable[ClaimDir] = ()) -> frozenset[str]:
    """The :func:`device_key` of every GPU a grant on this node names: the device plugin's (the
    pods' annotations) and the DRA driver's (its records of the claims). A region with no grant
    to check it against counts only on other GPUs: it is its container's to write, and would
    otherwise put its usage (or its activity, for the feedback loop) on another tenant's GPU."""
    out = {device_key(u) for pod in pods.values() for g in pod.grants for u in g.uuids}
    out.update(device_key(u) for c in claims for u in c.devices or ())
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class ContainerReading:
    dir: ContainerDir
    pod: PodRef | None
    region: Region
    #: the GPUs its pod was granted for it (None: nothing to check against, e.g. standalone, a
    #: claim, or a pod without grants); a region's other UUIDs are not exported: the container
    #: writes its region and could otherwise put its usage under another tenant's GPU
    granted: Mapping[str, str] | None = None
    #: without ``granted``, the GPUs other grants name (:func:`taken_devices`), not exported
    taken: frozenset[str] = frozenset()
    #: :func:`device_key` -> the memory its grant gives the container there, bytes
    #: (:meth:`ContainerGrant.memory_bytes`): its limit series, in place of the region's own
    granted_memory: Mapping[str, int] | None = None


# name -> (help, HostGPU attribute (None leaves the series out), whether the labels start with "node")
_HOST_VALUES: dict[str, tuple[str, str, bool]] = {
    HOST_MEMORY_USED: ("Device memory used on the GPU (NVML)", "memory_used", True),
    HOST_UTILIZATION: ("GPU utilisation, percent (NVML)", "utilization", True),
    "hami_host_gpu_memory_controller_utilization_ratio": (
        "Memory controller utilisation, percent (NVML)",
        "memory_utilization",
        False,
    ),
    HOST_TEMPERATURE: ("GPU temperature, degrees Celsius (NVML)", "temperature", True),
    HOST_POWER: ("GPU power draw, watts (NVML)", "power_watts", True),
}
_HOST_LEGACY = {
    HOST_MEMORY_USED: "HostGPUMemoryUsage",
    HOST_UTILIZATION: "HostCoreUtilization",
}

# name -> (help, value of (region, dev, now) or None to leave the series out)
_CTR_VALUES: dict[str, tuple[str, Callable[[Region, int, float], float | None]]] = {
    CONTAINER_MEMORY_USED: (
        "Device memory the container's processes hold (library ledger)",
        lambda r, d, _: r.used(d).total,
    ),
    # the grant's memory in place of this where the pod's grant says it (_container_metrics)
    "hami_vgpu_memory_limit_bytes": ("Device memory limit of the container", lambda r, d, _: r.limits[d]),
    "hami_container_device_memory_bytes": (
        "Same value as hami_vgpu_memory_used_bytes (HAMi name)",
        lambda r, d, _: r.used(d).total,
    ),
    CONTAINER_UTILIZATION: (
        "SM utilisation of the container's processes, percent (0-100 per device)",
        lambda r, d, _: r.sm_util(d),
    ),
    "hami_container_last_kernel_elapsed_seconds": (
        "Seconds since the container last launched a kernel",
        lambda r, d, now: max(now - r.last_kernel_time, 0.0) if r.last_kernel_time > 0 else None,
    ),
    "hami_vgpu_memory_context_bytes": (
        "Context memory of the container's processes",
        lambda r, d, _: r.used(d).context,
    ),
    "hami_vgpu_memory_module_bytes": (
        "Module (code) memory of the container's processes",
        lambda r, d, _: r.used(d).module,
    ),
    "hami_vgpu_memory_buffer_bytes": (
        "Data buffer memory of the container's processes",
        lambda r, d, _: r.used(d).buffer,
    ),
}
_CTR_LEGACY = {
    CONTAINER_MEMORY_USED: "vGPU_device_memory_usage_in_bytes",
    "hami_vgpu_memory_limit_bytes": "vGPU_device_memory_limit_in_bytes",
    CONTAINER_UTILIZATION: "Device_utilization_desc_of_container",
    "hami_container_last_kernel_elapsed_seconds": "Device_last_kernel_of_container",
}
DRIFT = "hami_vgpu_memory_drift_bytes"
LIMIT = "hami_vgpu_memory_limit_bytes"
REGIONS = "hami_monitor_regions"

#: Every metric this collector can export, with its labels (zone included) — checked by tests
#: against the reference and used to validate the dashboard.
METRICS: dict[str, tuple[str, ...]] = {
    BUILD_INFO: BUILD_LABELS + ("zone",),
    HOST_MEMORY_USED: HOST_LABELS + ("zone",),
    HOST_UTILIZATION: HOST_LABELS + ("zone",),
    "hami_host_gpu_memory_controller_utilization_ratio": HOST_MC_LABELS + ("zone",),
    HOST_TEMPERATURE: HOST_LABELS + ("zone",),
    HOST_POWER: HOST_LABELS + ("zone",),
    HOST_ECC + "_total": HOST_LABELS + ("error_type", "zone"),
    **{name: CTR_LABELS + ("zone",) for name in _CTR_VALUES},
    DRIFT: CTR_LABELS + ("zone",),
    REGIONS: ("node", "state", "zone"),
    MIG_INFO: MIG_LABELS + ("zone",),
}
LEGACY_METRICS: dict[str, tuple[str, ...]] = {
    "HostGPUMemoryUsage": LEGACY_HOST_LABELS + ("zone",),
    "HostCoreUtilization": LEGACY_HOST_LABELS + ("zone",),
    **{legacy: LEGACY_CTR_LABELS + ("zone",) for legacy in _CTR_LEGACY.values()},
    "Device_memory_desc_of_container": LEGACY_CTR_LABELS + ("context", "module", "data", "offset", "zone"),
    "MigInfo": LEGACY_MIG_LABELS + ("zone",),
}


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class _Flight:
    """One collection in progress, and the scrapes waiting for its metrics."""

    __slots__ = ("done", "metrics", "error", "joined")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.metrics: list[Metric] = []
        self.error: BaseException | None = None
        self.joined = 0  # scrapes that came while it ran


class MonitorCollector(Collector):
    """``registry.register(MonitorCollector(...))``; see the module docstring."""

    def __init__(
        self,
        node: str,
        containers_dir: str,
        pods: Callable[[], Mapping[str, PodRef]] | None = None,
        host: Callable[[], Sequence[HostGPU]] | None = None,
        legacy: bool = False,
        clock: Callable[[], float] = time.time,
        claims_dir: str | None = None,
    ) -> None:
        self.node = node
        self.containers_dir = containers_dir
        self.claims_dir = claims_dir
        self.pods = pods
        self.host = host
        self.legacy = legacy
        self.clock = clock
        # path -> the last problem said about it, digits masked: one log line per kind of problem,
        # forgotten with the path (the container writes what goes into these messages)
        self._warned: dict[str, str] = {}
        self._before: dict[str, str] = {}
        self._lock = threading.Lock()
        self._flight: _Flight | None = None

    # ------------------------------------------------------------------ reading
    def read_containers(self) -> tuple[list[ContainerReading], dict[str, int]]:
        """Valid, matched regions plus counts per state (ok, invalid, waiting, unmatched)."""
        states = {"ok": 0, "invalid": 0, "waiting": 0, "unmatched": 0, "finished": 0}
        pods = self.pods() if self.pods is not None else None
        out: list[ContainerReading] = []
        self._before, self._warned = self._warned, {}  # paths not seen in this scan are forgotten
        claims = scan_claims(self.claims_dir) if self.claims_dir else []
        taken = taken_devices(pods, claims) if pods is not None else frozenset()
        for d in scan(self.containers_dir):
            pod = pods.get(d.pod_uid) if pods is not None else PodRef("", d.pod_uid, d.pod_uid)
            if pod is None:
                # not read: a gone pod's directory, waiting for its removal, which a tenant can
                # make fail for good (a subdirectory of its own, mode 0700: the monitor holds no
                # capability to override it); each scrape read such leftovers again, a hostile
                # region ~64 ms each (found by review)
                states["unmatched"] += 1
                continue
            region = self._region(d.path, d.problem, d.region, states)
            if region is None:
                continue
            if d.container in pod.finished:  # its limit is no longer held: no series (the pod's
                states["finished"] += 1  # sum of limits on a GPU counted it as long as the pod lived)
                continue
            states["ok"] += 1
            granted = _granted(pod, d.container) if pods is not None else None
            grant = pod.grant(d.container) if pods is not None else None
            memory = grant.memory_bytes() if grant is not None and grant.memory_mib is not None else None
            out.append(ContainerReading(d, pod, region, granted, taken if granted is None else frozenset(), memory))
        for c in claims:
            region = self._region(c.path, c.problem, c.region, states)
            if region is None:
                continue
            owner = claim_owner(c, pods) if c.namespace else None
            if owner is None:
                states["unmatched"] += 1
                continue
            states["ok"] += 1
            pod, container = owner
            cdir = ContainerDir(pod.uid, container, c.path, c.region)
            if c.devices is None:  # a record from an older driver: nothing of its own to check against
                out.append(ContainerReading(cdir, pod, region, None, taken))
            else:
                out.append(ContainerReading(cdir, pod, region, {device_key(u): u for u in c.devices}))
        return out, states

    def _region(self, path: str, problem: str | None, region_path: str | None, states: dict[str, int]) -> Any:
        """A directory's region, read; None (counted as waiting or invalid) when there is none to
        read, and None, neither counted nor warned about, when the directory itself has gone since
        it was listed (its pod's end: the sweep or the DRA driver removed it meanwhile)."""
        if problem or region_path is None:
            if _gone(path):
                return None
        if problem:
            self._warn(path, problem)
        if region_path is None:
            states["waiting"] += 1
            return None
        try:
            return read_region(region_path)
        except RegionError as exc:
            if _gone(path):
                return None
            self._warn(region_path, str(exc))
            states["invalid"] += 1
            return None

    def _warn(self, path: str, message: str) -> None:
        text = printable(message)[:_MESSAGE_LIMIT]
        kind = _DIGITS.sub("#", text)
        said = self._before.get(path)
        self._warned[path] = kind
        if said != kind:
            log.warning("skipping region: %s", text)

    def _host(self) -> Sequence[HostGPU]:
        if self.host is None:
            return ()
        try:
            return self.host()
        except Exception as exc:  # NVML trouble must not fail the container metrics
            log.warning("host GPU metrics unavailable: %s", exc)
            return ()

    # ------------------------------------------------------------------ metrics
    def describe(self) -> Iterable[Metric]:
        return []  # collected on demand; no fixed series to describe

    def collect(self) -> Iterator[Metric]:
        """The metrics of one collection. The endpoint answers whoever reaches it (NodePort 31992
        by default) and a collection reads every region (a hostile one costs ~75 ms of CPU): a
        scrape that comes while one is being collected gets that one's metrics, so many clients
        at once cost one collection, not one each (in threads that would also slow the feedback
        round). The metrics are only read by the exposition, so they are shared as they are."""
        with self._lock:
            flight = self._flight
            lead = flight is None
            if flight is None:
                flight = self._flight = _Flight()
            else:
                flight.joined += 1
        if not lead:
            flight.done.wait()
            if flight.error is not None:
                raise RuntimeError(f"the collection this scrape joined failed: {flight.error}")
            yield from flight.metrics
            return
        try:
            flight.metrics = list(self._collect())
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                self._flight = None
            flight.done.set()
        yield from flight.metrics

    def _collect(self) -> Iterator[Metric]:
        fams: dict[str, GaugeMetricFamily] = {}

        def fam(name: str, doc: str = "", labels: Sequence[str] | None = None) -> GaugeMetricFamily:
            if name not in fams:
                table = METRICS if name in METRICS else LEGACY_METRICS
                fams[name] = _gauge(name, doc or name, labels or table[name])
            return fams[name]

        fam(BUILD_INFO, BUILD_INFO_HELP).add_metric(list(build_info_values()) + [ZONE], 1)
        gpus = self._host()
        self._host_metrics(gpus, fam)
        ecc = CounterMetricFamily(
            HOST_ECC,
            "GPU ECC errors since the driver was loaded, by type (NVML)",
            labels=list(HOST_LABELS) + ["error_type", "zone"],
        )
        for g in sorted(gpus, key=lambda g: g.index):
            for kind, n in sorted(g.ecc_errors.items()):
                ecc.add_metric([self.node, str(g.index), g.uuid, host_device_type(g.name), kind, ZONE], n)
        if ecc.samples:
            yield ecc
        containers, states = self.read_containers()
        self._container_metrics(containers, {g.uuid: g for g in gpus}, fam)
        self._mig_metrics(fam)
        regions = fam(REGIONS, "Container directories seen by the monitor, by state")
        for state, n in sorted(states.items()):
            regions.add_metric([self.node, state, ZONE], n)
        yield from fams.values()

    def _host_metrics(self, gpus: Sequence[HostGPU], fam: Callable[..., GaugeMetricFamily]) -> None:
        for g in sorted(gpus, key=lambda g: g.index):
            full = [self.node, str(g.index), g.uuid, host_device_type(g.name), ZONE]
            for name, (doc, attr, with_node) in _HOST_VALUES.items():
                value = getattr(g, attr)
                if value is None:
                    continue
                fam(name, doc).add_metric(full if with_node else full[1:], value)
                if self.legacy and name in _HOST_LEGACY:  # nodeid, deviceidx, deviceuuid, devicetype
                    fam(_HOST_LEGACY[name], f"Legacy name of {name}").add_metric(full, value)

    def _container_metrics(
        self, containers: Sequence[ContainerReading], gpus: Mapping[str, HostGPU], fam: Callable[..., GaugeMetricFamily]
    ) -> None:
        now = self.clock()
        # a region's host PIDs are its container's to write: one that another region names too
        # (a neighbour's process copied from NVML, or a PID reused) is nobody's for the drift
        named: dict[int, int] = {}
        for c in containers:
            for pid in c.region.hostpids():
                named[pid] = named.get(pid, 0) + 1
        contested = {pid for pid, n in named.items() if n > 1}
        for c in containers:
            r = c.region
            done: set[str] = set()  # libvgpu lists a device once: a repeat would count its usage again
            for dev, seen in enumerate(r.uuids):
                key = device_key(seen)
                if not seen or key in done or key in c.taken or (c.granted is not None and key not in c.granted):
                    continue
                done.add(key)
                # the UUID of the grant: an older libvgpu wrote a MIG instance's as GPU-<bytes>,
                # which names no device; the grant's MIG-<bytes> joins hami_mig_device_info. Without a
                # grant, none: the region's UUID is the container's to write (any string, or
                # another tenant's GPU), so the series is named by vdevice_index alone
                uuid = c.granted[key] if c.granted is not None else ""
                labels = [c.pod.namespace, c.pod.name, c.dir.container, str(dev), uuid, ZONE]
                limit = c.granted_memory.get(key) if c.granted_memory is not None else None
                for name, (doc, value_of) in _CTR_VALUES.items():
                    value = limit if name == LIMIT and limit is not None else value_of(r, dev, now)
                    if value is None:
                        continue
                    fam(name, doc).add_metric(labels, value)
                    if self.legacy and name in _CTR_LEGACY:
                        fam(_CTR_LEGACY[name], f"Legacy name of {name}").add_metric(labels, value)
                if self.legacy:
                    u = r.used(dev)
                    offset = u.total - u.context - u.module - u.buffer  # as HAMi computes it
                    fam("Device_memory_desc_of_container", "Legacy: memory breakdown of the container").add_metric(
                        labels[:-1] + [str(u.context), str(u.module), str(u.buffer), str(offset), ZONE], u.total
                    )
                # without a grant the region's UUID only picks the NVML device whose per-process
                # memory of the region's own host PIDs is compared (never a label)
                drift = memory_drift(r, dev, gpus.get(uuid or seen), contested)
                if drift is not None:
                    fam(
                        DRIFT, "NVML per-process memory of the container's processes minus the library ledger"
                    ).add_metric(labels, drift)

    def _mig_metrics(self, fam: Callable[..., GaugeMetricFamily]) -> None:
        """``hami_mig_device_info`` = 1 per MIG instance a pod on this node holds (its annotation)."""
        pods = self.pods() if self.pods is not None else {}
        for pod in sorted(pods.values(), key=lambda p: (p.namespace, p.name)):
            for m in pod.mig:
                labels = [
                    pod.namespace,
                    pod.name,
                    m.container,
                    str(m.vdevice_index),
                    m.device_uuid,
                    m.mig_uuid,
                    m.profile,
                    str(m.gpu_instance_id),
                    str(m.compute_instance_id),
                    ZONE,
                ]
                fam(MIG_INFO, "A MIG instance held by a pod's container (1)").add_metric(labels, 1)
                if self.legacy:  # HAMi's labels: the pod's, the GPU's and the GPU instance ID
                    fam("MigInfo", f"Legacy name of {MIG_INFO}").add_metric(
                        labels[:5] + [str(m.gpu_instance_id), ZONE], 1
                    )


def _gone(directory: str) -> bool:
    try:
        return not stat.S_ISDIR(os.lstat(directory).st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def claim_owner(c: ClaimDir, pods: Mapping[str, PodRef] | None) -> tuple[PodRef, str] | None:
    """``(pod, container label)`` for a claim's region (see the module docstring); None when no pod
    on this node uses the claim (yet, or any more)."""
    if pods is None:
        return PodRef(c.namespace, c.uid, c.uid), c.name
    for pod in sorted(pods.values(), key=lambda p: p.name):
        if pod.namespace != c.namespace:
            continue
        for claim, containers in pod.claims:
            if claim == c.name:
                return pod, containers[0] if len(containers) == 1 else c.name
    return None


def memory_drift(region: Region, dev: int, gpu: HostGPU | None, contested: Collection[int] = ()) -> int | None:
    """NVML's usage of the container's host PIDs on the device minus the ledger's; None if unknowable:
    a process's host PID unknown, or one of them in ``contested`` (named by another region too)."""
    if gpu is None:
        return None
    pids = [p.hostpid for p in region.procs if p.hostpid > 0]
    if not pids or len(pids) != len(region.procs):
        return None  # a process whose host PID is unknown would show up as false drift
    if any(pid in contested for pid in pids):
        return None  # another container's process would be counted as this one's
    nvml = sum(gpu.process_memory.get(pid, 0) for pid in set(pids))
    return nvml - region.used(dev).total
