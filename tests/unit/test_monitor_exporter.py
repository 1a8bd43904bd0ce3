"""hami.monitor.exporter / containers / feedback: what a scrape shows, cleanup, feedback decisions."""

from __future__ import annotations

import json
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami.monitor.containers import GoneDirs, remove, scan, split_name
from hami.monitor.exporter import LEGACY_METRICS, METRICS, MonitorCollector, PodRef, memory_drift
from hami.monitor.feedback import Reading, Writes, decide, release
from hami.node.nvml import HostGPU
from hami.monitor.region import read_region

from . import _regionkit as kit

MiB = 1 << 20
UID_A = "0b6f3b4e-1111-4d7e-9a8e-aaaaaaaaaaaa"
UID_B = "0b6f3b4e-2222-4d7e-9a8e-bbbbbbbbbbbb"

#: reference hami-control-plane §9.2, copied literally: metric -> labels (zone="vGPU" on all)
REFERENCE_MONITOR = {
    "hami_host_gpu_memory_used_bytes": {"node", "device_index", "device_uuid", "device_type"},
    "hami_host_gpu_utilization_ratio": {"node", "device_index", "device_uuid", "device_type"},
    "hami_host_gpu_memory_controller_utilization_ratio": {"device_index", "device_uuid", "device_type"},
    "hami_vgpu_memory_used_bytes": {"namespace", "pod", "container", "vdevice_index", "device_uuid"},
    "hami_vgpu_memory_limit_bytes": {"namespace", "pod", "container", "vdevice_index", "device_uuid"},
    "hami_container_device_memory_bytes": {"namespace", "pod", "container", "vdevice_index", "device_uuid"},
    "hami_container_device_utilization_ratio": {"namespace", "pod", "container", "vdevice_index", "device_uuid"},
    "hami_container_last_kernel_elapsed_seconds": {"namespace", "pod", "container", "vdevice_index", "device_uuid"},
    "hami_vgpu_memory_context_bytes": {"namespace", "pod", "container", "vdevice_index", "device_uuid"},
    "hami_vgpu_memory_module_bytes": {"namespace", "pod", "container", "vdevice_index", "device_uuid"},
    "hami_vgpu_memory_buffer_bytes": {"namespace", "pod", "container", "vdevice_index", "device_uuid"},
    "hami_build_info": {"version", "revision", "build_date", "go_version", "compiler", "platform"},
    # added by HAMi PR #2732 (Aug 2026, cmd/vGPUmonitor/metrics.go), after the reference was written
    "hami_host_gpu_temperature_celsius": {"node", "device_index", "device_uuid", "device_type"},
    "hami_host_gpu_power_usage_watts": {"node", "device_index", "device_uuid", "device_type"},
    "hami_host_gpu_ecc_errors_total": {"node", "device_index", "device_uuid", "device_type", "error_type"},
}
REFERENCE_MONITOR_LEGACY = {
    "HostGPUMemoryUsage",
    "HostCoreUtilization",
    "vGPU_device_memory_usage_in_bytes",
    "vGPU_device_memory_limit_in_bytes",
    "Device_memory_desc_of_container",
    "Device_utilization_desc_of_container",
    "Device_last_kernel_of_container",
}
#: the legacy names' labels, from HAMi's cmd/vGPUmonitor/metrics.go (initLegacyDescriptors, the
#: versions with --legacy-metrics: v2.9/v2.10); the host ones gained "nodeid" with the new names'
#: "node". MigInfo's have not changed since it was added (podnamespace ... deviceuuid, instanceid).
_LEGACY_CTR = {"podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid"}
REFERENCE_LEGACY_LABELS = {
    "HostGPUMemoryUsage": {"nodeid", "deviceidx", "deviceuuid", "devicetype"},
    "HostCoreUtilization": {"nodeid", "deviceidx", "deviceuuid", "devicetype"},
    "vGPU_device_memory_usage_in_bytes": _LEGACY_CTR,
    "vGPU_device_memory_limit_in_bytes": _LEGACY_CTR,
    "Device_memory_desc_of_container": _LEGACY_CTR | {"context", "module", "data", "offset"},
    "Device_utilization_desc_of_container": _LEGACY_CTR,
    "Device_last_kernel_of_container": _LEGACY_CTR,
    "MigInfo": _LEGACY_CTR | {"instanceid"},
}
OURS = {"hami_vgpu_memory_drift_bytes", "hami_monitor_regions"}  # additions, documented in docs/metrics.md
REFERENCE_MIG = {
    "namespace",
    "pod",
    "container",
    "vdevice_index",
    "device_uuid",
    "mig_uuid",
    "profile",
    "gpu_instance_id",
    "compute_instance_id",
}


def test_metric_names_and_labels_match_the_reference():
    for name, labels in REFERENCE_MONITOR.items():
        assert set(METRICS[name]) == labels | {"zone"}, name
    assert set(METRICS["hami_mig_device_info"]) == REFERENCE_MIG | {"zone"}
    assert set(METRICS) - set(REFERENCE_MONITOR) - {"hami_mig_device_info"} == OURS
    assert set(LEGACY_METRICS) == REFERENCE_MONITOR_LEGACY | {"MigInfo"}
    for name, labels in REFERENCE_LEGACY_LABELS.items():
        assert set(LEGACY_METRICS[name]) == labels | {"zone"}, name


def test_mig_device_info_from_the_pods_annotation(node_dir):
    from hami.monitor.kube import mig_devices

    ann = {
        "hami.io/vgpu-mig-allocations": json.dumps(
            [
                {
                    "containerIndex": 1,
                    "deviceIndex": 0,
                    "gpuUUID": "GPU-a",
                    "profile": "3g.20gb",
                    "placement": {"start": 4, "size": 4},
                    "migUUID": "MIG-x",
                    "gpuInstanceID": 2,
                    "computeInstanceID": 0,
                },
                {
                    "containerIndex": 0,
                    "deviceIndex": 0,
                    "gpuUUID": "GPU-a",
                    "profile": "1g.5gb",
                    "placement": {"start": 0, "size": 1},
                },
            ]
        )
    }  # not made yet: no series
    pods = {UID_A: PodRef("team-a", "train-0", UID_A, mig_devices(ann, ["init", "main"]))}
    got = _scrape(_collector(node_dir, pods=lambda: pods, legacy=True))
    [s] = got["hami_mig_device_info"]
    assert s.value == 1 and {k: v for k, v in s.labels.items()} == {
        "namespace": "team-a",
        "pod": "train-0",
        "container": "main",
        "vdevice_index": "0",
        "device_uuid": "GPU-a",
        "mig_uuid": "MIG-x",
        "profile": "3g.20gb",
        "gpu_instance_id": "2",
        "compute_instance_id": "0",
        "zone": "vGPU",
    }
    # HAMi's legacy MigInfo: its own label names, the GPU instance ID as "instanceid", one series
    # per instance (not a copy of hami_mig_device_info's labels, which no HAMi query names)
    [legacy] = got["MigInfo"]
    assert legacy.value == 1 and dict(legacy.labels) == {
        "podnamespace": "team-a",
        "podname": "train-0",
        "ctrname": "main",
        "vdeviceid": "0",
        "deviceuuid": "GPU-a",
        "instanceid": "2",
        "zone": "vGPU",
    }
    assert mig_devices({"hami.io/vgpu-mig-allocations": "not json"}, ["main"]) == ()


def _scrape(collector) -> dict[str, list]:
    reg = CollectorRegistry()
    reg.register(collector)
    text = generate_latest(reg).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _values(samples, **match):
    return [s.value for s in samples if all(s.labels.get(k) == v for k, v in match.items())]


@pytest.fixture
def node_dir(tmp_path):
    root = tmp_path / "containers"
    kit.write(
        root / f"{UID_A}_main" / "x.cache",
        uuids=("GPU-a", "GPU-b"),
        limits=(3000 * MiB, 1000 * MiB),
        procs=[
            kit.Proc(
                pid=7, hostpid=70, used={0: (10 * MiB, 5 * MiB, 85 * MiB, 100 * MiB), 1: (0, 0, 7, 7)}, sm_util={0: 40}
            ),
            kit.Proc(pid=8, hostpid=80, used={0: (0, 0, 50 * MiB, 50 * MiB)}, sm_util={0: 15}),
        ],
        last_kernel_time=1000,
    )
    kit.write(
        root / f"{UID_B}_side" / "y.cache",
        uuids=("GPU-a",),
        limits=(500 * MiB,),
        procs=[kit.Proc(pid=9, hostpid=0, used={0: (0, 0, 1, 1)})],
    )
    return root


def _collector(root, pods=None, host=None, legacy=False):
    return MonitorCollector("node-1", str(root), pods=pods, host=host, legacy=legacy, clock=lambda: 1030.0)


def test_container_metrics_carry_pod_labels_and_the_right_numbers(node_dir):
    pods = {UID_A: PodRef("team-a", "train-0", UID_A), UID_B: PodRef("team-b", "infer", UID_B)}
    got = _scrape(_collector(node_dir, pods=lambda: pods))
    used = got["hami_vgpu_memory_used_bytes"]
    assert _values(used, pod="train-0", namespace="team-a", container="main", vdevice_index="0", device_uuid="") == [
        150 * MiB
    ]  # no grant to check the region's UUIDs against: none exported (the tenant writes them)
    assert _values(used, pod="train-0", vdevice_index="1", device_uuid="") == [7]
    assert _values(used, pod="infer", container="side") == [1]
    assert all(s.labels["zone"] == "vGPU" for s in used)
    assert _values(got["hami_vgpu_memory_limit_bytes"], pod="train-0", vdevice_index="0") == [3000 * MiB]
    assert _values(got["hami_container_device_memory_bytes"], pod="train-0", vdevice_index="0") == [150 * MiB]
    assert _values(got["hami_container_device_utilization_ratio"], pod="train-0", vdevice_index="0") == [55]
    assert _values(got["hami_container_last_kernel_elapsed_seconds"], pod="train-0", vdevice_index="0") == [30]
    assert _values(got["hami_container_last_kernel_elapsed_seconds"], pod="infer") == []  # never launched
    assert _values(got["hami_vgpu_memory_context_bytes"], pod="train-0", vdevice_index="0") == [10 * MiB]
    assert _values(got["hami_vgpu_memory_module_bytes"], pod="train-0", vdevice_index="0") == [5 * MiB]
    assert _values(got["hami_vgpu_memory_buffer_bytes"], pod="train-0", vdevice_index="0") == [135 * MiB]
    assert _values(got["hami_monitor_regions"], state="ok") == [2]
    assert "vGPU_device_memory_usage_in_bytes" not in got


def test_directories_of_unknown_pods_are_counted_not_exported(node_dir):
    pods = {UID_A: PodRef("team-a", "train-0", UID_A)}
    got = _scrape(_collector(node_dir, pods=lambda: pods))
    assert {s.labels["pod"] for s in got["hami_vgpu_memory_used_bytes"]} == {"train-0"}
    assert _values(got["hami_monitor_regions"], state="unmatched") == [1]


def test_standalone_labels_pods_by_uid(node_dir):
    got = _scrape(_collector(node_dir))
    assert {(s.labels["namespace"], s.labels["pod"]) for s in got["hami_vgpu_memory_used_bytes"]} == {
        ("", UID_A),
        ("", UID_B),
    }


def test_corrupt_and_truncated_regions_are_skipped_with_one_warning(node_dir, caplog):
    bad = node_dir / "0b6f3b4e-3333-4d7e-9a8e-cccccccccccc_bad" / "z.cache"
    bad.parent.mkdir()
    bad.write_bytes(kit.build(magic=12345))
    short = node_dir / "0b6f3b4e-4444-4d7e-9a8e-dddddddddddd_short" / "z.cache"
    short.parent.mkdir()
    short.write_bytes(kit.build()[:5000])
    (node_dir / "0b6f3b4e-5555-4d7e-9a8e-eeeeeeeeeeee_starting").mkdir()  # no region yet
    (node_dir / "not-a-container-dir").mkdir()
    collector = _collector(node_dir)
    with caplog.at_level(logging.WARNING, logger="hami.monitor.exporter"):
        got = _scrape(collector)
        _scrape(collector)
    assert _values(got["hami_monitor_regions"], state="invalid") == [2]
    assert _values(got["hami_monitor_regions"], state="waiting") == [1]
    assert _values(got["hami_monitor_regions"], state="ok") == [2]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings  # once per file, not once per scrape
    assert any("bad magic 12345" in w for w in warnings) and any("smaller than any known layout" in w for w in warnings)


def test_a_region_that_changes_its_garbage_every_scrape_is_said_once_and_forgotten_when_gone(node_dir, caplog):
    """The container writes what goes into the warning (the magic, the sizes): the warnings kept
    are one per path and kind of problem, and a path gone from the directory is forgotten."""
    bad = node_dir / "0b6f3b4e-3333-4d7e-9a8e-cccccccccccc_bad" / "z.cache"
    bad.parent.mkdir()
    collector = _collector(node_dir)
    with caplog.at_level(logging.WARNING, logger="hami.monitor.exporter"):
        for magic in range(1000, 1050):
            bad.write_bytes(kit.build(magic=magic))
            _scrape(collector)
    assert len([r for r in caplog.records if "bad magic" in r.getMessage()]) == 1
    assert list(collector._warned) == [str(bad)]
    bad.unlink()
    bad.parent.rmdir()
    _scrape(collector)
    assert collector._warned == {}


def test_region_replaced_by_garbage_after_a_good_scrape_is_skipped(node_dir):
    collector = _collector(node_dir)
    assert len(_scrape(collector)["hami_vgpu_memory_used_bytes"]) == 3
    (node_dir / f"{UID_A}_main" / "x.cache").write_bytes(b"\0" * 100)
    got = _scrape(collector)
    assert {s.labels["pod"] for s in got["hami_vgpu_memory_used_bytes"]} == {UID_B}


def test_host_metrics_drift_and_legacy_names(node_dir):
    gpus = [
        HostGPU(
            0,
            "GPU-a",
            "Tesla T4",
            memory_used=9 * MiB,
            utilization=70,
            memory_utilization=20,
            process_memory={70: 120 * MiB, 80: 50 * MiB, 999: 1},
        ),
        HostGPU(1, "GPU-b", "NVIDIA H100", memory_used=1, utilization=0, memory_utilization=0),
    ]
    got = _scrape(_collector(node_dir, host=lambda: gpus, legacy=True))
    assert _values(
        got["hami_host_gpu_memory_used_bytes"],
        node="node-1",
        device_index="0",
        device_uuid="GPU-a",
        device_type="NVIDIA-Tesla T4",
    ) == [9 * MiB]
    assert _values(got["hami_host_gpu_utilization_ratio"], device_uuid="GPU-a") == [70]
    # HAMi's monitor (v2.10 and before) prefixes the NVML name unconditionally, unlike the
    # registration's type: a current driver's "NVIDIA H100" is "NVIDIA-NVIDIA H100" here
    assert _values(got["hami_host_gpu_memory_controller_utilization_ratio"], device_type="NVIDIA-NVIDIA H100") == [0]
    assert {s.labels["device_type"] for s in got["hami_host_gpu_memory_used_bytes"]} == {
        "NVIDIA-Tesla T4",
        "NVIDIA-NVIDIA H100",
    }
    assert "node" not in got["hami_host_gpu_memory_controller_utilization_ratio"][0].labels
    # 170 MiB by NVML for PIDs 70+80 vs 150 MiB in the ledger; GPU-b has none of their memory
    assert _values(got["hami_vgpu_memory_drift_bytes"], pod=UID_A, vdevice_index="0") == [20 * MiB]
    assert _values(got["hami_vgpu_memory_drift_bytes"], pod=UID_A, vdevice_index="1") == [-7]
    assert _values(got["hami_vgpu_memory_drift_bytes"], pod=UID_B) == []  # host PID unknown: no guess
    assert _values(got["HostGPUMemoryUsage"], deviceuuid="GPU-a", deviceidx="0") == [9 * MiB]
    assert _values(got["HostCoreUtilization"], nodeid="node-1", devicetype="NVIDIA-NVIDIA H100") == [0]
    assert _values(got["vGPU_device_memory_usage_in_bytes"], podname=UID_A, ctrname="main", vdeviceid="0") == [
        150 * MiB
    ]
    assert _values(got["Device_memory_desc_of_container"], podname=UID_A, vdeviceid="0", context=str(10 * MiB)) == [
        150 * MiB
    ]
    for name, samples in got.items():
        table = METRICS if name in METRICS else LEGACY_METRICS
        for s in samples:
            assert set(s.labels) == set(table[name]), name


def test_legacy_memory_desc_offset_is_what_the_parts_leave_of_the_total(tmp_path):
    # HAMi: offset = total - context - module - data (HAMi-core's own offset field is not read)
    kit.write(
        tmp_path / f"{UID_A}_main" / "x.cache",
        uuids=("GPU-a",),
        procs=[
            kit.Proc(pid=7, hostpid=70, used={0: (1, 2, 3, 10)}),
            kit.Proc(pid=8, hostpid=80, used={0: (0, 0, 5, 9)}),
        ],
    )
    [desc] = _scrape(_collector(tmp_path, legacy=True))["Device_memory_desc_of_container"]
    assert desc.value == 19
    assert [desc.labels[k] for k in ("context", "module", "data", "offset")] == ["1", "2", "8", "8"]


def test_nvml_failure_keeps_container_metrics(node_dir):
    def broken():
        raise RuntimeError("NVML gone")

    got = _scrape(_collector(node_dir, host=broken))
    assert "hami_host_gpu_memory_used_bytes" not in got and len(got["hami_vgpu_memory_used_bytes"]) == 3


def test_memory_drift_needs_every_host_pid(tmp_path):
    path = kit.write(
        tmp_path / "r.cache", procs=[kit.Proc(1, 11, used={0: (0, 0, 0, 5)}), kit.Proc(2, 0, used={0: (0, 0, 0, 5)})]
    )
    gpu = HostGPU(0, "GPU-a", "x", process_memory={11: 100})
    assert memory_drift(read_region(path), 0, gpu) is None
    assert memory_drift(read_region(path), 0, None) is None


# ---------------------------------------------------------------------- containers directory


def test_split_name():
    assert split_name(f"{UID_A}_main") == (UID_A, "main")
    assert split_name("nounderscore") is None and split_name("_x") is None and split_name("a_b_c") is None


def test_stale_directories_of_gone_pods_are_removed_after_the_grace(node_dir):
    dirs = scan(str(node_dir))
    gone = GoneDirs()
    assert gone.due(dirs, {UID_A, UID_B}, 1000.0, 0) == []
    assert gone.due(dirs, {UID_A}, 1000.0, 300) == []  # B first seen gone now
    assert gone.due(dirs, {UID_A}, 1299.0, 300) == []
    due = gone.due(dirs, {UID_A}, 1300.0, 300)
    assert [d.pod_uid for d in due] == [UID_B]
    assert remove(due) == [str(node_dir / f"{UID_B}_side")]
    assert [d.pod_uid for d in scan(str(node_dir))] == [UID_A]


def test_a_pod_back_in_the_list_starts_its_grace_again(node_dir):
    dirs = scan(str(node_dir))
    gone = GoneDirs()
    assert gone.due(dirs, {UID_A}, 0.0, 300) == []
    assert gone.due(dirs, {UID_A, UID_B}, 200.0, 300) == []  # back (a stale list before)
    assert gone.due(dirs, {UID_A}, 400.0, 300) == []
    assert [d.pod_uid for d in gone.due(dirs, {UID_A}, 700.0, 300)] == [UID_B]


def test_scan_of_a_missing_directory_is_empty(tmp_path):
    assert scan(str(tmp_path / "none")) == []


def test_two_region_files_in_one_directory_are_reported(tmp_path):
    d = tmp_path / f"{UID_A}_main"
    kit.write(d / "a.cache")
    kit.write(d / "b.cache")
    (entry,) = scan(str(tmp_path))
    assert entry.region.endswith("a.cache") and "2 region files" in entry.problem


# ---------------------------------------------------------------------- feedback (hami-core §6.5)


def R(key, uuids=("GPU-a",), priority=1, recent=0, switch=1):
    return Reading(key, tuple(uuids), priority, recent, switch)


def test_alone_on_a_gpu_runs_unthrottled_and_recent_kernel_decays():
    assert decide([R("a", recent=2, switch=1)]) == {"a": Writes(recent_kernel=1, utilization_switch=0)}


def test_two_active_containers_of_the_same_priority_keep_the_limit():
    out = decide([R("a", recent=2, switch=0), R("b", recent=3, switch=0)])
    assert out == {"a": Writes(1, 1), "b": Writes(2, 1)}


def test_only_still_active_containers_count():
    # b decays 1 -> 0 this period and is no longer active; a is alone
    assert decide([R("a", recent=3, switch=1), R("b", recent=1, switch=0)]) == {
        "a": Writes(2, 0),
        "b": Writes(recent_kernel=0),
    }


def test_a_higher_priority_peer_throttles_and_blocks_only_when_enabled():
    readings = [R("hi", priority=0, recent=3, switch=1), R("lo", priority=1, recent=3, switch=0)]
    assert decide(readings) == {"hi": Writes(2, 0), "lo": Writes(2, 1)}
    assert decide(readings, blocking=True) == {"hi": Writes(2, 0), "lo": Writes(-1, 1)}


def test_blocked_container_is_released_when_the_high_priority_one_is_idle():
    readings = [R("hi", priority=0, recent=0), R("lo", priority=1, recent=-1, switch=1)]
    assert decide(readings, blocking=True) == {"hi": Writes(utilization_switch=0), "lo": Writes(0, 0)}


def test_different_gpus_do_not_interact():
    out = decide([R("a", uuids=("GPU-a",), recent=3), R("b", uuids=("GPU-b",), priority=0, recent=3)], blocking=True)
    assert out == {"a": Writes(2, 0), "b": Writes(2, 0)}


def test_release_leaves_limits_on_and_nothing_blocked():
    out = release([R("a", recent=-1, switch=0), R("b", recent=2, switch=1), R("c", recent=0, switch=0)])
    assert out == {"a": Writes(0, 1), "c": Writes(utilization_switch=1)}


def test_a_mig_containers_usage_is_labelled_with_the_instance_the_pod_was_granted(tmp_path):
    """libvgpu writes every device it sees as GPU-<uuid bytes>, a MIG instance included; that name
    is no device's, so the container's usage could be joined neither to its instance
    (hami_mig_device_info's mig_uuid) nor to its GPU. The grant's MIG-<same bytes> is exported."""
    from hami.monitor.exporter import ContainerGrant

    root = tmp_path / "containers"
    kit.write(
        root / f"{UID_A}_main" / "x.cache",
        uuids=("GPU-bd0dfeed-0000-4000-8000-000001000001",),
        limits=(1000 * MiB,),
        procs=[kit.Proc(pid=7, hostpid=70, used={0: (0, 0, 300 * MiB, 300 * MiB)})],
    )
    grant = ContainerGrant("main", ("MIG-bd0dfeed-0000-4000-8000-000001000001",), 1)
    pods = {UID_A: PodRef("team-a", "train-0", UID_A, grants=(grant,))}
    got = _scrape(_collector(root, pods=lambda: pods))
    assert [s.labels["device_uuid"] for s in got["hami_vgpu_memory_used_bytes"]] == [
        "MIG-bd0dfeed-0000-4000-8000-000001000001"
    ]
    assert _values(got["hami_vgpu_memory_used_bytes"], pod="train-0") == [300 * MiB]
