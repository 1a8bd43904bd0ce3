"""The scheduler's allocation metrics show the DRA front end's GPUs and claims, counted as the UI
counts them: a Grafana dashboard on HAMi's metric names sees a cluster on ``frontEnd: dra``."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from hami.core.ledger import make_allocation
from hami.core.types import ContainerDevice
from hami.dra.model import SliceSettings, resource_slice, resource_slices
from hami.scheduler.metrics import SchedulerMetrics, snapshot_of
from hami.scheduler.state import ClusterState

from . import _corekit as kit
from ._vendorkit import config
from .test_dra_claims import Gpu, claim, result
from .test_dra_mig import A100, DYNAMIC, GPUS

MIB = 1 << 20


def _scrape(state: ClusterState) -> dict[str, list]:
    text = SchedulerMetrics(lambda: snapshot_of(state)).render().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _v(samples, **match):
    return [s.value for s in samples if all(s.labels.get(k) == str(v) for k, v in match.items())]


def _dra_state() -> ClusterState:
    s = ClusterState(config())
    s.slice_handler.replace([resource_slice("n1", [Gpu(0, "GPU-a"), Gpu(1, "GPU-b")], SliceSettings(split_count=4))])
    s.claim_handler.replace(
        [
            claim("c1", results=[result("n1", "gpu-0", "3000Mi", "25")], reserved=("web-0",)),
            # two requests of one claim on one GPU: one pod row, the sum
            claim("c2", results=[result("n1", "gpu-0", "1Gi", "10"), result("n1", "gpu-0", "1Gi", "5")]),
            claim("c3", results=[result("n1", "gpu-1", None, None)], reserved=()),  # whole GPU, no pod yet
        ]
    )
    return s


def test_dra_gpus_and_claims_have_the_allocation_series():
    got = _scrape(_dra_state())
    assert _v(got["hami_gpu_memory_limit_bytes"], node="n1", device_uuid="GPU-a", device_index=0) == [15360 * MIB]
    assert _v(got["hami_gpu_core_limit_ratio"], device_uuid="GPU-b", device_index=1) == [100]
    assert _v(got["hami_gpu_shared_count"], device_uuid="GPU-a") == [3]
    assert _v(got["hami_gpu_memory_allocated_bytes"], device_uuid="GPU-a", device_type="NVIDIA-Tesla T4") == [
        5048 * MIB
    ]
    assert _v(got["hami_gpu_core_allocated_ratio"], device_uuid="GPU-a") == [40]
    assert _v(got["hami_gpu_memory_allocated_bytes"], device_uuid="GPU-b") == [15360 * MIB]  # taken whole
    assert _v(got["hami_vgpu_memory_allocated_bytes"], namespace="team-a", pod="web-0", device_uuid="GPU-a") == [
        3000 * MIB
    ]
    assert _v(got["hami_vgpu_core_allocated_ratio"], pod="p", device_uuid="GPU-a") == [15]
    assert len(got["hami_vgpu_core_allocated_ratio"]) == 2  # c3 has no pod: its GPU's row counts it


def test_a_gpu_published_by_both_front_ends_is_one_series_with_both_allocations():
    s = _dra_state()
    s.ledger.set_node(kit.node("n1", 1, mem=15360))
    uuid = "GPU-n1-0"
    s.slice_handler.replace([resource_slice("n1", [Gpu(0, uuid)], SliceSettings(split_count=4))])
    pod = kit.pod("ext", [kit.ctr(mem=2000, cores=20)], ns="team-a")
    s.ledger.add_pod(make_allocation(pod, "n1", {"NVIDIA": ((ContainerDevice(uuid, "NVIDIA", 2000, 20),),)}))
    got = _scrape(s)
    assert _v(got["hami_gpu_memory_allocated_bytes"], device_uuid=uuid) == [(2000 + 3000 + 2048) * MIB]
    assert _v(got["hami_gpu_shared_count"], device_uuid=uuid) == [4]
    assert len(_v(got["hami_gpu_memory_limit_bytes"], device_uuid=uuid)) == 1
    assert sorted(s.labels["pod"] for s in got["hami_vgpu_memory_allocated_bytes"]) == ["ext", "p", "web-0"]


def test_a_dra_mig_gpu_is_one_device_named_by_its_uuid_not_one_per_placement():
    s = ClusterState(config())
    s.slice_handler.replace(resource_slices("n1", GPUS, SliceSettings(split_count=4), mig=DYNAMIC))
    s.claim_handler.replace(
        [claim("m", results=[{"request": "gpu", "driver": "gpu.hami.io", "pool": "n1", "device": "gpu-0-3g-20gb-0"}])]
    )
    got = _scrape(s)
    limits = {x.labels["device_uuid"]: x.value for x in got["hami_gpu_memory_limit_bytes"]}
    assert sorted(limits) == sorted(g.uuid for g in GPUS)  # the A100 once, beside the T4
    assert limits[A100] == 40192 * MIB  # the largest profile: the most one claim can have
    assert _v(got["hami_gpu_shared_count"], device_uuid=A100) == [1]
    assert _v(got["hami_gpu_memory_allocated_bytes"], device_uuid=A100) == [19968 * MIB]
    assert _v(got["hami_vgpu_memory_allocated_bytes"], pod="p", device_uuid=A100) == [19968 * MIB]


def test_without_dra_objects_the_series_are_the_extenders_alone():
    s = ClusterState(config())
    assert "hami_gpu_memory_limit_bytes" not in _scrape(s)
