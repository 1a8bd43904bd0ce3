"""hami.scheduler.metrics: HAMi's allocation metrics from the ledger, and the scheduler's SLIs."""

from __future__ import annotations


import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami.core.ledger import make_allocation
from hami.core.types import ContainerDevice
from hami.core.reasons import NodeFailure, Reason
from hami.scheduler.metrics import AllocationSnapshot, SchedulerMetrics, metric_names, snapshot_of

from . import _corekit as kit

MIB = 1 << 20

#: reference hami-control-plane §9.1, copied literally (zone="vGPU" on every one)
REFERENCE = {
    "hami_gpu_memory_limit_bytes": {"node", "device_uuid", "device_index", "device_type"},
    "hami_gpu_core_limit_ratio": {"node", "device_uuid", "device_index", "device_type"},
    "hami_gpu_memory_allocated_bytes": {"node", "device_uuid", "device_index", "device_cores", "device_type"},
    "hami_gpu_shared_count": {"node", "device_uuid", "device_index", "device_type"},
    "hami_gpu_core_allocated_ratio": {"node", "device_uuid", "device_index", "device_type"},
    "hami_node_gpu_overview": {
        "node",
        "device_uuid",
        "device_index",
        "device_cores",
        "device_memory_limit",
        "device_type",
    },
    "hami_node_gpu_memory_allocated_ratio": {"node", "device_uuid", "device_index", "device_type"},
    "hami_resource_quota_used": {"namespace", "quota_name", "limit"},
    "hami_resource_quota_limit": {"namespace", "quota_name"},
    "hami_vgpu_memory_allocated_bytes": {"namespace", "node", "pod", "container_index", "device_uuid"},
    "hami_vgpu_core_allocated_ratio": {"namespace", "node", "pod", "container_index", "device_uuid"},
    "hami_build_info": {"version", "revision", "build_date", "go_version", "compiler", "platform"},
    "hami_node_gpu_mig_instance_info": {
        "node",
        "device_uuid",
        "device_index",
        "mig_uuid",
        "profile",
        "gpu_instance_id",
        "compute_instance_id",
        "placement_start",
        "placement_size",
    },
}
REFERENCE_LEGACY = {
    "GPUDeviceMemoryLimit",
    "GPUDeviceCoreLimit",
    "GPUDeviceMemoryAllocated",
    "GPUDeviceSharedNum",
    "GPUDeviceCoreAllocated",
    "nodeGPUOverview",
    "nodeGPUMemoryPercentage",
    "QuotaUsed",
    "vGPUMemoryAllocated",
    "vGPUCoreAllocated",
}  # nodeGPUMigInstance: HAMi's old template design, not exported


def test_names_and_labels_match_the_reference():
    names = metric_names()
    for name, labels in REFERENCE.items():
        assert set(names[name]) == labels | {"zone"}, name
    assert set(metric_names(legacy=True)) - set(names) == REFERENCE_LEGACY


def _placed():
    led = kit.ledger(kit.node("n1", 2, mem=16000), kit.node("n2", 1, mem=8000))
    cfg = kit.CONFIG
    placed = []
    for name, mem, cores in (("a", 3000, 30), ("b", 2000, 20)):
        p = kit.pod(name, [kit.ctr(mem=mem, cores=cores)], ns="team")
        alloc = make_allocation(p, "n1", {"NVIDIA": ((ContainerDevice("GPU-n1-0", "NVIDIA", mem, cores),),)})
        led.add_pod(alloc)
        placed.append(alloc)
    led.set_quota("team", "q", {"limits.nvidia.com/gpumem": "10000", "limits.nvidia.com/gpucores": "80"}, cfg.vendors)
    return led, placed


def _scrape(metrics: SchedulerMetrics) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(metrics.render().decode())}


def _v(samples, **match):
    return [s.value for s in samples if all(s.labels.get(k) == str(v) for k, v in match.items())]


def test_allocation_metrics_follow_the_ledger():
    led, placed = _placed()
    metrics = SchedulerMetrics(lambda: AllocationSnapshot(led, kit.CONFIG.vendors, ["team"]))
    got = _scrape(metrics)
    a_uuid = placed[0].usage[0].uuid
    used_mem = sum(a.usage[0].mem for a in placed if a.usage[0].uuid == a_uuid)
    used_cores = sum(a.usage[0].cores for a in placed if a.usage[0].uuid == a_uuid)
    assert _v(got["hami_gpu_memory_limit_bytes"], node="n1", device_uuid=a_uuid, zone="vGPU") == [16000 * MIB]
    assert _v(got["hami_gpu_core_limit_ratio"], node="n2", device_index=0) == [100]
    assert _v(got["hami_gpu_memory_allocated_bytes"], device_uuid=a_uuid, device_cores=100) == [used_mem * MIB]
    assert sum(_v(got["hami_gpu_shared_count"], node="n1")) == 2
    assert _v(got["hami_gpu_core_allocated_ratio"], device_uuid=a_uuid) == [used_cores]
    assert _v(got["hami_node_gpu_overview"], device_uuid=a_uuid, device_memory_limit=16000) == [used_mem * MIB]
    assert _v(got["hami_node_gpu_memory_allocated_ratio"], device_uuid=a_uuid) == [pytest.approx(used_mem / 16000)]
    assert _v(
        got["hami_vgpu_memory_allocated_bytes"],
        namespace="team",
        pod="a",
        node="n1",
        container_index=0,
        device_uuid=a_uuid,
    ) == [3000 * MIB]
    assert _v(got["hami_vgpu_core_allocated_ratio"], pod="b") == [20]
    assert _v(got["hami_resource_quota_used"], namespace="team", quota_name="nvidia.com/gpumem", limit=10000) == [5000]
    assert _v(got["hami_resource_quota_limit"], namespace="team", quota_name="nvidia.com/gpucores") == [80]
    assert "GPUDeviceMemoryLimit" not in got


def test_allocation_metrics_change_with_the_ledger_and_legacy_names():
    led, placed = _placed()
    metrics = SchedulerMetrics(lambda: AllocationSnapshot(led, kit.CONFIG.vendors), legacy=True)
    led.remove_pod(placed[0].key)
    got = _scrape(metrics)
    assert [s.labels["pod"] for s in got["hami_vgpu_memory_allocated_bytes"]] == ["b"]
    assert sum(_v(got["hami_gpu_memory_allocated_bytes"])) == 2000 * MIB
    assert sum(_v(got["GPUDeviceMemoryAllocated"], nodeid="n1")) == 2000 * MIB
    assert _v(got["vGPUMemoryAllocated"], podname="b", podnamespace="team", nodename="n1") == [2000 * MIB]
    assert "hami_resource_quota_used" not in got  # no quota namespace given
    names = metric_names(legacy=True)
    for name, samples in got.items():
        if name in names and not name.startswith("hami_scheduler_"):
            for s in samples:
                assert set(s.labels) == set(names[name]), name


def test_mig_instance_info_for_instances_the_plugin_made():
    """One series per reservation with its runtime identity (added by the device plugin); a
    reservation not made yet has none."""
    import json

    from hami.core.ledger import allocation_from_pod

    led = kit.ledger()
    led.set_node(kit.NodeDevices(name="m1", devices=(kit.mig_gpu("m1", 0), kit.mig_gpu("m1", 1))))
    mig = [
        {
            "containerIndex": 0,
            "deviceIndex": 0,
            "gpuUUID": "GPU-m1-1",
            "profile": "3g.20gb",
            "placement": {"start": 4, "size": 4},
            "migUUID": "MIG-abc",
            "gpuInstanceID": 2,
            "computeInstanceID": 0,
        },
        {
            "containerIndex": 1,
            "deviceIndex": 0,
            "gpuUUID": "GPU-m1-1",
            "profile": "1g.5gb",
            "placement": {"start": 0, "size": 1},
        },
    ]
    devs = "GPU-m1-1,NVIDIA,19968,43:;GPU-m1-1,NVIDIA,4864,15:;"
    pod = kit.pod("p", [kit.ctr("a", mem=19000), kit.ctr("b", mem=4000)], admit=False)
    pod["spec"]["nodeName"] = "m1"
    pod["metadata"]["annotations"].update(
        {
            "hami.io/vgpu-node": "m1",
            "hami.io/vgpu-devices-allocated": devs,
            "hami.io/vgpu-mig-allocations": json.dumps(mig),
        }
    )
    led.add_pod(allocation_from_pod(pod, kit.CONFIG.vendors))
    got = _scrape(SchedulerMetrics(lambda: AllocationSnapshot(led, kit.CONFIG.vendors), legacy=True))
    [s] = got["hami_node_gpu_mig_instance_info"]
    assert s.value == 1 and s.labels == {
        "node": "m1",
        "device_uuid": "GPU-m1-1",
        "device_index": "1",
        "mig_uuid": "MIG-abc",
        "profile": "3g.20gb",
        "gpu_instance_id": "2",
        "compute_instance_id": "0",
        "placement_start": "4",
        "placement_size": "4",
        "zone": "vGPU",
    }
    assert "nodeGPUMigInstance" not in got


def test_filter_bind_lock_and_cache_signals():
    now = [1000.0]
    metrics = SchedulerMetrics(clock=lambda: now[0])
    failure = NodeFailure(total=4, counts=((Reason.CARD_INSUFFICIENT_MEMORY, 3), (Reason.CARD_NOT_HEALTH, 1)))
    metrics.observe_filter(0.002, "scheduled")
    metrics.observe_filter(
        0.004, "unschedulable", reasons=[failure, Reason.RESOURCE_QUOTA_NOT_FIT, "CardInsufficientMemory"]
    )
    metrics.observe_bind(0.05, "bound")
    metrics.observe_lock_wait(2.0, "timeout")
    metrics.cache_touched("pods")
    now[0] = 1012.5
    got = _scrape(metrics)
    assert _v(got["hami_scheduler_filter_duration_seconds"], outcome="unschedulable", le="0.005") == [1]
    count = [s.value for s in got["hami_scheduler_filter_duration_seconds"] if s.name.endswith("_count")]
    assert sorted(count) == [1, 1]
    rej = {s.labels["reason"]: s.value for s in got["hami_scheduler_filter_rejections"] if s.name.endswith("_total")}
    assert rej == {"CardInsufficientMemory": 1, "CardNotHealth": 1, "ResourceQuotaNotFit": 1}
    assert _v(got["hami_scheduler_bind_duration_seconds"], outcome="bound", le="0.05") == [1]
    assert _v(got["hami_scheduler_node_lock_wait_seconds"], outcome="timeout", le="1.0") == [0]
    assert _v(got["hami_scheduler_cache_age_seconds"], resource="pods") == [12.5]


def test_snapshot_of_a_cluster_state_like_object():
    led, _ = _placed()

    class State:
        ledger, vendors, quotas = led, kit.CONFIG.vendors, {"team/q": {}, "other/x": {}}

    snap = snapshot_of(State())
    assert snap.quota_namespaces == ["other", "team"] and snap.ledger is led


async def test_serves_metrics_over_http():
    led, _ = _placed()
    metrics = SchedulerMetrics(lambda: AllocationSnapshot(led, kit.CONFIG.vendors))
    runner = await metrics.serve("127.0.0.1", 0)
    try:
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
                assert "hami_gpu_memory_limit_bytes{" in await r.text()
    finally:
        await runner.cleanup()


def test_filter_answers_become_outcomes_and_reason_codes():
    from hami.scheduler.server import filter_outcome, reason_codes

    assert reason_codes("1/8 CardInsufficientMemory, 7/8 CardTypeMismatch") == [
        "CardInsufficientMemory",
        "CardTypeMismatch",
    ]
    assert reason_codes("NodeInsufficientDevice") == ["NodeInsufficientDevice"]
    assert reason_codes("node unregistered") == ["node unregistered"]
    answer = {
        "NodeNames": [],
        "Error": "",
        "FailedNodes": {"a": "1/2 CardNotHealth, 1/2 CardInsufficientMemory"},
        "FailedAndUnresolvableNodes": {"b": "2/2 CardTypeMismatch"},
    }
    assert filter_outcome(answer) == ("unschedulable", ["CardInsufficientMemory", "CardNotHealth", "CardTypeMismatch"])
    assert filter_outcome({"NodeNames": ["a"], "Error": ""}) == ("scheduled", [])
    assert filter_outcome({"NodeNames": None, "Error": "not ready"}) == ("error", [])


def test_scheduler_options_parse_the_metrics_flags():
    import argparse

    from hami.core.errors import ConfigError
    from hami.scheduler.options import add_arguments, options_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    opts = options_from_args(parser.parse_args(["--metrics-bind-address=127.0.0.1:9999", "--legacy-metrics=true"]))
    assert (opts.metrics_host, opts.metrics_port, opts.legacy_metrics) == ("127.0.0.1", 9999, True)
    assert options_from_args(parser.parse_args(["--metrics-bind-address="])).metrics_port is None
    with pytest.raises(ConfigError, match="--metrics-bind-address"):
        options_from_args(parser.parse_args(["--metrics-bind-address=nope"]))
