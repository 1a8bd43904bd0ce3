"""Scheduler metrics on ``--metrics-bind-address`` (``:9395``): HAMi's allocation metrics plus SLIs.

Allocation metrics (reference hami-control-plane §9.1, names and labels as HAMi's, every one
with ``zone="vGPU"``) are computed at scrape time from the ledger and, for the DRA front end, the
watch cache's ResourceSlices and allocated claims: no API calls, nothing cached between scrapes. The
core ratio families are a percentage of the GPU for every vendor (:func:`core_percent`), their
legacy names the vendor's raw counts, as HAMi's. The scheduler's own signals, which HAMi lacks (A20), are recorded as they happen:

=================================================  ======================================================
``hami_scheduler_filter_duration_seconds``         histogram, label ``outcome`` (``scheduled``,
                                                   ``unschedulable``, ``error``)
``hami_scheduler_filter_rejections_total``         counter, label ``reason`` (reason code, §5.7): +1 per
                                                   unschedulable Filter for each code among its nodes
``hami_scheduler_bind_duration_seconds``           histogram, label ``outcome`` (``bound``, ``error``)
``hami_scheduler_node_lock_wait_seconds``          histogram, label ``outcome`` (``acquired``, ``timeout``)
``hami_scheduler_cache_age_seconds``               gauge, label ``resource``: seconds since that watch
                                                   last delivered anything (event, bookmark or relist)
=================================================  ======================================================

Integration (what ``hami scheduler`` calls)::

    from hami.scheduler.metrics import SchedulerMetrics, snapshot_of

    metrics = SchedulerMetrics(lambda: snapshot_of(state), legacy=opts.legacy_metrics)
    runner = await metrics.serve(host, port)            # aiohttp on the scheduler's event loop
    ...
    t0 = time.perf_counter()
    result = ...                                        # Filter
    metrics.observe_filter(time.perf_counter() - t0, "unschedulable", reasons=result.failed.values())
    metrics.observe_bind(seconds, "bound")              # or "error"
    metrics.observe_lock_wait(seconds, "acquired")      # or "timeout"
    metrics.cache_touched("pods")                       # from the watch handlers (and "nodes", ...)
    await runner.cleanup()

``reasons`` accepts :class:`hami.core.reasons.NodeFailure` objects, :class:`Reason` values or
plain strings. ``serve`` copies the allocation rows out of the ledger on the event loop that
mutates it (a few ms for 1000 nodes x 8 GPUs, so a scrape never sees the ledger half-updated)
and formats the text in a worker thread (~130 ms for that cluster, ``bench/bench_scheduler_metrics.py``).
Scrapes that arrive while one is being made share its answer (one copy, one render, however
many clients call at once). :meth:`render` does both at once for any other server.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from hami.core.ledger import Ledger
from hami.dra.claims import ClaimUsage
from hami.dra.fit import DeviceUse, add_claims
from hami.dra.model import CORES, MEMORY, SHARES
from hami.metricnames import BUILD_INFO, BUILD_INFO_HELP, BUILD_LABELS as BUILD, ZONE, build_info_values

if TYPE_CHECKING:
    from hami.serve import ConnectionGuard

MIB = 1024 * 1024

DEV = ("node", "device_uuid", "device_index", "device_type")
DEV_CORES = ("node", "device_uuid", "device_index", "device_cores", "device_type")
OVERVIEW = ("node", "device_uuid", "device_index", "device_cores", "device_memory_limit", "device_type")
POD = ("namespace", "node", "pod", "container_index", "device_uuid")

#: name -> (labels without zone, legacy name, legacy labels, help)
ALLOCATION: dict[str, tuple[tuple[str, ...], str | None, tuple[str, ...], str]] = {
    "hami_gpu_memory_limit_bytes": (
        DEV,
        "GPUDeviceMemoryLimit",
        ("nodeid", "deviceuuid", "deviceidx", "devicetype"),
        "Registered device memory",
    ),
    "hami_gpu_core_limit_ratio": (
        DEV,
        "GPUDeviceCoreLimit",
        ("nodeid", "deviceuuid", "deviceidx", "devicetype"),
        "Registered device cores as a percentage: 100 for a GPU with cores, 0 for one without",
    ),
    "hami_gpu_memory_allocated_bytes": (
        DEV_CORES,
        "GPUDeviceMemoryAllocated",
        ("nodeid", "deviceuuid", "deviceidx", "devicecores", "devicetype"),
        "Device memory allocated to pods",
    ),
    "hami_gpu_shared_count": (
        DEV,
        "GPUDeviceSharedNum",
        ("nodeid", "deviceuuid", "deviceidx", "devicetype"),
        "Tasks sharing the device",
    ),
    "hami_gpu_core_allocated_ratio": (
        DEV,
        "GPUDeviceCoreAllocated",
        ("nodeid", "deviceuuid", "deviceidx", "devicetype"),
        "Device cores allocated to pods, percent of the GPU's registered cores (rounded up)",
    ),
    "hami_node_gpu_overview": (
        OVERVIEW,
        "nodeGPUOverview",
        ("nodeid", "deviceuuid", "deviceidx", "devicecores", "devicememorylimit", "devicetype"),
        "Device memory allocated, with registered cores and memory (MiB) as labels",
    ),
    "hami_node_gpu_memory_allocated_ratio": (
        DEV,
        "nodeGPUMemoryPercentage",
        ("nodeid", "deviceuuid", "deviceidx", "devicetype"),
        "Allocated / registered device memory",
    ),
    "hami_node_gpu_mig_instance_info": (
        (
            "node",
            "device_uuid",
            "device_index",
            "mig_uuid",
            "profile",
            "gpu_instance_id",
            "compute_instance_id",
            "placement_start",
            "placement_size",
        ),
        None,
        (),
        "A MIG instance the device plugin made for a reservation (1); reservations not made yet have no series",
    ),
    "hami_resource_quota_used": (
        ("namespace", "quota_name", "limit"),
        "QuotaUsed",
        ("quotanamespace", "quotaName", "limit"),
        "Namespace usage of a quota-tracked resource",
    ),
    "hami_resource_quota_limit": (("namespace", "quota_name"), None, (), "Namespace limit of a quota-tracked resource"),
    "hami_vgpu_memory_allocated_bytes": (
        POD,
        "vGPUMemoryAllocated",
        ("podnamespace", "nodename", "podname", "containeridx", "deviceuuid"),
        "Device memory allocated to a pod (collapsed over its containers)",
    ),
    "hami_vgpu_core_allocated_ratio": (
        POD,
        "vGPUCoreAllocated",
        ("podnamespace", "nodename", "podname", "containeridx", "deviceuuid"),
        "Device cores allocated to a pod (collapsed over its containers), percent of the GPU's registered cores (rounded up)",
    ),
}

FILTER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BIND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LOCK_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: our additions: name -> labels (histograms export _bucket/_sum/_count, counters _total)
SIGNALS: dict[str, tuple[str, ...]] = {
    "hami_scheduler_filter_duration_seconds": ("outcome",),
    "hami_scheduler_filter_rejections_total": ("reason",),
    "hami_scheduler_bind_duration_seconds": ("outcome",),
    "hami_scheduler_node_lock_wait_seconds": ("outcome",),
    "hami_scheduler_cache_age_seconds": ("resource",),
}


def metric_names(legacy: bool = False) -> dict[str, tuple[str, ...]]:
    """Every metric family this module exports, with its labels (zone included where present)."""
    out = {BUILD_INFO: BUILD + ("zone",)}
    for name, (labels, old, old_labels, _) in ALLOCATION.items():
        out[name] = labels + ("zone",)
        if legacy and old:
            out[old] = old_labels + ("zone",)
    out.update(SIGNALS)
    return out


@dataclass(frozen=True)
class AllocationSnapshot:
    """What the allocation metrics are computed from; take it on the ledger's own thread/loop."""

    ledger: Ledger
    vendors: Sequence[Any] = ()  # to name quota resources (vendor.resources.memory / .cores, .name)
    quota_namespaces: Iterable[str] = ()
    #: the DRA front end: (node, device) -> :func:`hami.dra.claims.slice_devices` entry, and the
    #: allocated claims of driver gpu.hami.io
    dra_devices: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    claims: Sequence[ClaimUsage] = ()
    #: (node, uuid) of the devices whose cores are bitmasks (AWS Neuron): their percentages count
    #: set bits
    masked: frozenset[tuple[str, str]] = frozenset()


def snapshot_of(state: Any) -> AllocationSnapshot:
    """From a ``hami.scheduler.state.ClusterState`` (``ledger``, ``vendors``, ``quotas`` "ns/name",
    and the DRA front end's ``dra_devices`` and ``claims`` when it has them)."""
    namespaces = sorted({key.split("/", 1)[0] for key in getattr(state, "quotas", {})})
    claims = getattr(state, "claims", None) or {}
    return AllocationSnapshot(
        state.ledger,
        tuple(state.vendors),
        namespaces,
        dict(getattr(state, "dra_devices", None) or {}),
        [claims[k] for k in sorted(claims)],
    )


def _quota_rows(snap: AllocationSnapshot) -> Iterator[tuple[str, str, int, int]]:
    """``(namespace, resource, used, limit)`` for every limited quota resource."""
    for ns in sorted(set(snap.quota_namespaces)):
        room = snap.ledger.quota_room(ns, snap.vendors)
        if room is None:
            continue
        for v in snap.vendors:
            mem_room, core_room = room.room.get(v.name, (None, None))
            used_mem, used_cores = snap.ledger.namespace_usage(ns, v.name)
            for resource, left, used in (
                (v.resources.memory, mem_room, used_mem),
                (v.resources.cores, core_room, used_cores),
            ):
                if resource and left is not None:
                    yield ns, resource, used, left + used


@dataclass(frozen=True)
class AllocationRows:
    """Plain data copied out of the ledger (cheap, on its loop); formatting can then run anywhere."""

    devices: list[
        tuple[str, str, int, str, int, int, int, int, int]
    ]  # node, uuid, index, type, devmem, devcore, used, usedmem, usedcores
    pods: list[tuple[str, str, str, str, int, int]]  # namespace, node, pod, uuid, mem, cores
    quotas: list[tuple[str, str, int, int]]  # namespace, resource, used, limit
    #: node, uuid, index, mig uuid, profile, GPU instance id, compute instance id, start, size
    mig: list[tuple[str, str, int, str, str, int, int, int, int]] = field(default_factory=list)
    #: the DRA front end's devices and claims as the snapshot had them (entries never written:
    #: the watch cache replaces them), added to ``devices`` and ``pods`` by :meth:`merged` in
    #: the formatting thread: 8000 DRA GPUs took ~150 ms, which on the loop held up Filter
    dra_devices: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    claims: Sequence[ClaimUsage] = ()
    #: (node, uuid) of the devices whose cores are bitmasks (AWS Neuron): their percentages count
    #: set bits
    masked: frozenset[tuple[str, str]] = frozenset()

    def merged(self) -> AllocationRows:
        """These rows with the DRA front end's GPUs and claims counted in (:func:`_with_dra`)."""
        if not self.dra_devices:
            return self
        devices, pods = _with_dra(self.dra_devices, self.claims, self.devices, self.pods)
        return AllocationRows(devices, pods, self.quotas, self.mig, masked=self.masked)


def allocation_rows(snap: AllocationSnapshot) -> AllocationRows:
    led = snap.ledger
    devices = [
        (node, d.id, d.index, d.type, d.devmem, d.devcore, used, usedmem, usedcores)
        for node in led.node_names()
        for d, used, usedmem, usedcores in led.device_usage(node)
    ]
    pods = [(a.namespace, a.node, a.name, u.uuid, u.mem, u.cores) for a in led.pods() for u in a.usage]
    index = {(node, uuid): i for node, uuid, i, *_ in devices}
    mig = [
        (
            node,
            uuid,
            index.get((node, uuid), 0),
            s.mig_uuid,
            s.profile,
            s.gpu_instance_id,
            s.compute_instance_id,
            s.start,
            s.size,
        )
        for node in led.node_names()
        for uuid, pieces in led.slices(node).items()
        for s in pieces
        if s.mig_uuid and s.gpu_instance_id is not None and s.compute_instance_id is not None
    ]
    masks = led.mask_vendors
    masked = frozenset(
        (node, d.id) for node in led.node_names() for d, *_ in led.device_usage(node) if d.vendor in masks
    )
    return AllocationRows(
        devices, pods, list(_quota_rows(snap)), mig, dict(snap.dra_devices), list(snap.claims), masked=masked
    )


def _with_dra(
    dra_devices: Mapping[tuple[str, str], Mapping[str, Any]], claims: Sequence[ClaimUsage], devices: list, pods: list
) -> tuple[list, list]:
    """The extender's rows with the DRA front end's GPUs and claims added, counted as the UI counts
    them: a whole GPU is one device (added to the extender's row when both front ends publish
    it); a MIG GPU's devices (instances, or possible placements) are one device named by the
    GPU's UUID, its totals the largest profile's and its shares the devices held (added to the
    extender's row, totals and all, when the extender registers that GPU too: a row replaced
    lost the extender's instances); a claim is a pod row of its first consumer pod (none until
    a pod reserves it), per GPU."""
    uses = {k: DeviceUse(k[0], k[1], d.get("uuid") or "", dict(d["total"]), {}) for k, d in dra_devices.items()}
    add_claims(uses, claims)
    rows = {(r[0], r[1]): r for r in devices}
    migs: dict[tuple[str, str], list[tuple[DeviceUse, Mapping[str, Any]]]] = {}
    for key in sorted(uses):
        use, info = uses[key], dra_devices[key]
        if info.get("parent"):
            migs.setdefault((key[0], info["parent"]), []).append((use, info))
            continue
        uuid = use.uuid or key[1]
        used = (use.used[SHARES], -(-use.used[MEMORY] // MIB), use.used[CORES])
        old = rows.get((key[0], uuid))
        if old is not None:  # one GPU published by both front ends
            rows[(key[0], uuid)] = old[:6] + tuple(a + b for a, b in zip(old[6:], used))
            continue
        total = use.total
        rows[(key[0], uuid)] = (
            key[0],
            uuid,
            info.get("index", -1),
            info.get("model") or "",
            total[MEMORY] // MIB,
            total[CORES],
            *used,
        )
    for (node, parent), members in migs.items():
        use0, info0 = members[0]
        used = (
            sum(1 for u, _ in members if u.claims),
            sum(-(-u.used[MEMORY] // MIB) for u, _ in members),
            sum(u.used[CORES] for u, _ in members),
        )
        old = rows.get((node, parent))
        if old is not None:  # the extender registers it too: its row, with the claims' instances added
            rows[(node, parent)] = old[:6] + tuple(a + b for a, b in zip(old[6:], used))
            continue
        rows[(node, parent)] = (
            node,
            parent,
            info0.get("index", -1),
            info0.get("model") or "",
            max(u.total[MEMORY] for u, _ in members) // MIB,
            max(u.total[CORES] for u, _ in members),
            *used,
        )
    by_pod: dict[tuple[str, str, str, str], list[int]] = {(r[0], r[1], r[2], r[3]): [r[4], r[5]] for r in pods}
    for claim in claims:
        consumers = sorted(c.name for c in claim.pods)
        if not consumers:
            continue
        for r in claim.results:
            dev = uses.get((r.pool, r.device))
            if dev is None:
                continue
            got = r.resolved(dev.total)
            uuid = dra_devices[(r.pool, r.device)].get("parent") or dev.uuid or r.device
            at = by_pod.setdefault((claim.namespace, r.pool, consumers[0], uuid), [0, 0])
            at[0] += -(-got[MEMORY] // MIB)
            at[1] += got[CORES]
    return list(rows.values()), [(*k, mem, cores) for k, (mem, cores) in by_pod.items()]


def _esc(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


def _labels(names: Sequence[str], values: Sequence[Any]) -> str:
    return ",".join(f'{k}="{_esc(v)}"' for k, v in zip(names, values))


class _Text:
    """Prometheus text exposition for gauge families, written directly: a 1000-node cluster has
    ~70k allocation series, and prometheus_client's generic path takes over a second for them.
    Label strings are built once per device and reused by every family of that device."""

    def __init__(self, legacy: bool) -> None:
        self.legacy = legacy
        self.lines: dict[str, list[str]] = {n: [] for n in ALLOCATION}
        if legacy:
            self.lines.update({old: [] for _, old, _, _ in ALLOCATION.values() if old})

    def add(
        self,
        name: str,
        values: Sequence[Any],
        value: float,
        extra: tuple[str, str] | None = None,
        legacy_value: float | None = None,
    ) -> None:
        """One series; ``extra`` = already-built (label string, legacy label string) to reuse;
        ``legacy_value``: the legacy name's value where it differs (the raw core counts)."""
        labels, old, old_labels, _ = ALLOCATION[name]
        new_s, old_s = extra or (_labels(labels, values), _labels(old_labels, values) if self.legacy and old else "")
        v = _num(value)
        self.lines[name].append(f'{name}{{{new_s},zone="{ZONE}"}} {v}\n')
        if self.legacy and old:
            old_v = v if legacy_value is None else _num(legacy_value)
            self.lines[old].append(f'{old}{{{old_s},zone="{ZONE}"}} {old_v}\n')

    def render(self) -> str:
        docs = {n: d for n, (_, _, _, d) in ALLOCATION.items()}
        docs.update({old: f"Legacy name of {n}" for n, (_, old, _, _) in ALLOCATION.items() if old})
        for n in RAW_LEGACY_CORES:
            docs[ALLOCATION[n][1] or n] = f"Legacy name of {n}, in the vendor's core unit (not a percentage)"
        out = []
        for name, lines in self.lines.items():
            if lines:
                out.append(f"# HELP {name} {docs[name]}\n# TYPE {name} gauge\n")
                out.extend(lines)
        return "".join(out)


_LEGACY_DEV = ("nodeid", "deviceuuid", "deviceidx", "devicetype")

#: the core families exported as a percentage of the GPU whose legacy names keep the raw counts
RAW_LEGACY_CORES = ("hami_gpu_core_limit_ratio", "hami_gpu_core_allocated_ratio", "hami_vgpu_core_allocated_ratio")


def core_percent(total: float, used: float, masks: bool = False) -> tuple[int, int]:
    """``(limit, allocated)`` of the core ratio families for a GPU of ``total`` registered cores
    (the vendor's unit: percent x deviceCoreScaling for NVIDIA, compute units for AMD, AI cores
    for an Ascend vNPU, ...) of which ``used`` are allocated: 100 and ``used`` as a percentage of
    ``total`` rounded up (an exact integer ceiling), as HAMi's scheduler exports them for every
    vendor; (0, 0) for a GPU without cores (or none known). With ``masks`` (AWS Neuron, whose
    grants and registration name cores by bit), the set bits are counted (the regression review
    of 1 Dec: one NeuronCore of an Inf2's two read 34 or 67 %, by which bit it was)."""
    if total <= 0:
        return 0, 0
    if masks:
        total, used = int(total).bit_count(), int(used).bit_count()
    if isinstance(total, int) and isinstance(used, int):
        return 100, -(-used * 100 // total)
    return 100, math.ceil(used * 100 / total)


def render_allocation(rows: AllocationRows, legacy: bool = False) -> str:
    """HAMi's §9.1 metrics (and ``hami_build_info``) as exposition text."""
    rows = rows.merged()
    t = _Text(legacy)
    info = _labels(BUILD, build_info_values())
    head = f'# HELP {BUILD_INFO} {BUILD_INFO_HELP}\n# TYPE {BUILD_INFO} gauge\n{BUILD_INFO}{{{info},zone="{ZONE}"}} 1\n'
    totals: dict[tuple[str, str], int] = {}  # (node, uuid) -> registered cores, for the pods' percentages
    for node, uuid, index, typ, devmem, devcore, used, usedmem, usedcores in rows.devices:
        totals[(node, uuid)] = devcore
        dev = (node, uuid, index, typ)
        shared = (_labels(DEV, dev), _labels(_LEGACY_DEV, dev) if legacy else "")
        # the ratio families are a percentage of the GPU whatever the vendor's unit (HAMi's
        # scheduler normalises them; an AMD GPU's 304 compute units were exported as 304, and a
        # quarter of them as 76, on a dashboard reading 100 per GPU); the legacy names stay raw
        limit_pct, used_pct = core_percent(devcore, usedcores, (node, uuid) in rows.masked)
        t.add("hami_gpu_memory_limit_bytes", dev, devmem * MIB, shared)
        t.add("hami_gpu_core_limit_ratio", dev, limit_pct, shared, legacy_value=devcore)
        # device_cores is the GPU's registered cores, as HAMi since #2142: a label that followed
        # the allocation began a new series (and ended one) at every placement and release
        t.add("hami_gpu_memory_allocated_bytes", (node, uuid, index, devcore, typ), usedmem * MIB)
        t.add("hami_gpu_shared_count", dev, used, shared)
        t.add("hami_gpu_core_allocated_ratio", dev, used_pct, shared, legacy_value=usedcores)
        t.add("hami_node_gpu_overview", (node, uuid, index, devcore, devmem, typ), usedmem * MIB)
        t.add("hami_node_gpu_memory_allocated_ratio", dev, usedmem / devmem if devmem else 0.0, shared)
    for row in rows.mig:
        t.add("hami_node_gpu_mig_instance_info", row, 1)
    for ns, resource, used, limit in rows.quotas:
        t.add("hami_resource_quota_used", (ns, resource, limit), used)
        t.add("hami_resource_quota_limit", (ns, resource), limit)
    for ns, node, pod, uuid, mem, cores in rows.pods:
        labels = (ns, node, pod, 0, uuid)
        shared = (
            _labels(POD, labels),
            _labels(ALLOCATION["hami_vgpu_memory_allocated_bytes"][2], labels) if legacy else "",
        )
        t.add("hami_vgpu_memory_allocated_bytes", labels, mem * MIB, shared)
        _, pct = core_percent(totals.get((node, uuid), 0), cores, (node, uuid) in rows.masked)
        t.add("hami_vgpu_core_allocated_ratio", labels, pct, shared, legacy_value=cores)
    return head + t.render()


class _CacheAge(Collector):
    def __init__(self, touched: dict[str, float], clock: Callable[[], float]) -> None:
        self.touched, self.clock = touched, clock

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily(
            "hami_scheduler_cache_age_seconds",
            "Seconds since the watch of this resource last delivered anything",
            labels=["resource"],
        )
        now = self.clock()
        for resource, at in sorted(self.touched.items()):
            fam.add_metric([resource], max(now - at, 0.0))
        yield fam


class _Count(Collector):
    """One gauge read from ``count`` at each scrape."""

    def __init__(self, name: str, doc: str, count: Callable[[], int]) -> None:
        self.name, self.doc, self.count = name, doc, count

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, self.doc, value=self.count())


def _reason_codes(reasons: Iterable[Any]) -> set[str]:
    codes: set[str] = set()
    for r in reasons:
        if hasattr(r, "codes"):
            codes.update(c.value for c in r.codes())
        else:
            codes.add(getattr(r, "value", str(r)))
    return codes


class SchedulerMetrics:
    """One registry with the allocation collector and the scheduler's own signals."""

    def __init__(
        self,
        snapshot: Callable[[], AllocationSnapshot] | None = None,
        legacy: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = CollectorRegistry()  # the scheduler's own signals; allocation text is rendered apart
        self.snapshot = snapshot
        self.legacy = legacy
        self.filter_duration = Histogram(
            "hami_scheduler_filter_duration_seconds",
            "Extender Filter latency",
            ["outcome"],
            buckets=FILTER_BUCKETS,
            registry=self.registry,
        )
        self.filter_rejections = Counter(
            "hami_scheduler_filter_rejections",
            "Unschedulable Filter calls by reason code",
            ["reason"],
            registry=self.registry,
        )
        self.bind_duration = Histogram(
            "hami_scheduler_bind_duration_seconds",
            "Extender Bind latency",
            ["outcome"],
            buckets=BIND_BUCKETS,
            registry=self.registry,
        )
        self.lock_wait = Histogram(
            "hami_scheduler_node_lock_wait_seconds",
            "Time Bind waited for the node lock",
            ["outcome"],
            buckets=LOCK_BUCKETS,
            registry=self.registry,
        )
        self._touched: dict[str, float] = {}
        self.clock = clock
        self.registry.register(_CacheAge(self._touched, clock))

    def observe_filter(self, seconds: float, outcome: str, reasons: Iterable[Any] = ()) -> None:
        self.filter_duration.labels(outcome).observe(max(seconds, 0.0))
        for code in sorted(_reason_codes(reasons)):
            self.filter_rejections.labels(code).inc()

    def observe_bind(self, seconds: float, outcome: str) -> None:
        self.bind_duration.labels(outcome).observe(max(seconds, 0.0))

    def observe_lock_wait(self, seconds: float, outcome: str = "acquired") -> None:
        self.lock_wait.labels(outcome).observe(max(seconds, 0.0))

    def count(self, name: str, doc: str, count: Callable[[], int]) -> None:
        """Export ``name``, a gauge of ``count()`` read at each scrape."""
        self.registry.register(_Count(name, doc, count))

    def cache_touched(self, resource: str) -> None:
        self._touched[resource] = self.clock()

    def rows(self) -> AllocationRows:
        """Copy the allocation data out of the ledger (call on the ledger's loop)."""
        return allocation_rows(self.snapshot()) if self.snapshot else AllocationRows([], [], [])

    def render(self, rows: AllocationRows | None = None) -> bytes:
        rows = self.rows() if rows is None else rows
        return render_allocation(rows, self.legacy).encode() + generate_latest(self.registry)

    async def serve(self, host: str, port: int, guard: ConnectionGuard | None = None):
        """Serve ``GET /metrics`` on the running loop, through :func:`hami.serve.start` (the same
        connection cap, deadlines and header limits as every listener); returns the ``AppRunner``
        (``cleanup()`` it). ``guard``: a :class:`hami.serve.ConnectionGuard` (tests)."""
        from aiohttp import web

        from hami.serve import application, send_body, start

        flight: asyncio.Future[bytes] | None = None

        async def scrape() -> bytes:
            rows = self.rows()  # on the loop: a consistent copy; the formatting runs in a thread
            return await asyncio.to_thread(self.render, rows)

        async def handler(request: web.Request) -> web.StreamResponse:
            # anyone who reaches the port may scrape: those who come while a scrape is being
            # made get its answer (at most one render old) instead of one more copy of the
            # ledger on this loop and one more render each
            nonlocal flight
            if flight is None or flight.done():
                flight = asyncio.ensure_future(scrape())
                flight.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no warning
            body = await asyncio.shield(flight)  # a client that leaves does not cancel the others' answer
            return await send_body(request, body, {"Content-Type": CONTENT_TYPE_LATEST})

        app = application()
        app.router.add_get("/metrics", handler)
        return await start(app, host, port, guard=guard)
