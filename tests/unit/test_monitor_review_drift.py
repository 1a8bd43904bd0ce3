"""``hami_vgpu_memory_drift_bytes`` and host PIDs a container writes into its own region.

Drift is NVML's memory of the region's host PIDs minus the library's ledger. The host PIDs come
from the region, which the container writes, and NVML inside a container lists the host PIDs of
every process on its GPU: a tenant that wrote a neighbour's PID into its slot was shown, under its
own pod's labels, the neighbour's memory as its own drift. A host PID that two regions claim
makes the drift of both unknowable (one of them lies, or a PID was reused): no series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami.monitor.exporter import ContainerGrant, MonitorCollector, PodRef
from hami.node.nvml import HostGPU

from . import _regionkit as kit

GiB = 1 << 30
VICTIM = "0b6f3b4e-2222-4d7e-9a8e-bbbbbbbbbbbb"
TENANT = "0b6f3b4e-1111-4d7e-9a8e-aaaaaaaaaaaa"
OTHER = "0b6f3b4e-3333-4d7e-9a8e-cccccccccccc"


def _drift(root, pods, gpus) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(MonitorCollector("n1", str(root), pods=lambda: pods, host=lambda: gpus))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if s.name == "hami_vgpu_memory_drift_bytes":
                out[s.labels["pod"]] = s.value
    return out


def test_a_neighbours_host_pid_in_a_region_shows_no_ones_memory(tmp_path):
    root = tmp_path / "containers"
    ledger = {0: (0, 0, 2 * GiB, 2 * GiB)}
    kit.write(root / f"{VICTIM}_main" / "r.cache", uuids=("GPU-1",), procs=[kit.Proc(pid=1, hostpid=500, used=ledger)])
    # the tenant holds nothing and claims the victim's process
    kit.write(root / f"{TENANT}_main" / "r.cache", uuids=("GPU-1",), procs=[kit.Proc(pid=1, hostpid=500)])
    kit.write(root / f"{OTHER}_main" / "r.cache", uuids=("GPU-1",), procs=[kit.Proc(pid=1, hostpid=600, used=ledger)])
    grant = (ContainerGrant("main", ("GPU-1",), 1),)
    pods = {
        VICTIM: PodRef("a", "victim", VICTIM, grants=grant),
        TENANT: PodRef("b", "tenant", TENANT, grants=grant),
        OTHER: PodRef("c", "other", OTHER, grants=grant),
    }
    gpus = [HostGPU(0, "GPU-1", "H100", process_memory={500: 8 * GiB, 600: 2 * GiB + 5})]
    got = _drift(root, pods, gpus)
    assert "tenant" not in got  # was 8 GiB: the victim's memory under the tenant's labels
    assert "victim" not in got  # which of the two runs PID 500 is unknowable
    assert got == {"other": 5}  # a PID only its own region names still counts
