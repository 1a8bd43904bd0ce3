"""A running pod whose grant cannot be read never makes the GPUs it runs on look free."""

from __future__ import annotations

import copy

from hami.config import chart_device_config
from hami.core import SchedulerConfig, admit_pod, pod_key, schedule_pod
from hami.core.codec import encode_node_devices_json, encode_pod_devices
from hami.core.types import ContainerDevice, DeviceInfo
from hami.scheduler.state import ClusterState
from hami.vendors import build_vendors

CFG = SchedulerConfig(build_vendors(chart_device_config()))
NV_GRANT = encode_pod_devices([[ContainerDevice("g0", "NVIDIA", 1000, 100)]])
DCU_GRANT = "DCU-a,DCU,4000,20:;"
BAD_DCU = "DCU-a,DCU,notanumber,20:;"


DCU_SMALL = {"hygon.com/dcunum": 1, "hygon.com/dcumem": 1000, "hygon.com/dcucores": 10}


def gpu_node(name="n1"):
    gpus = [
        DeviceInfo(id=f"g{i}", index=i, count=10, devmem=1000, devcore=100, type="NVIDIA-T4", health=True)
        for i in range(2)
    ]
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "annotations": {
                "hami.io/node-nvidia-register": encode_node_devices_json(gpus),
                "hami.io/node-dcu-register": "DCU-a,4,16368,100,DCU-Z100,0,true:",
            },
        },
        "status": {"allocatable": {"nvidia.com/gpu": "20", "hygon.com/dcunum": "4"}},
    }


def running(name, allocated, node="n1", rv="5", phase="Running"):
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "annotations": {"hami.io/vgpu-node": node, **allocated},
        },
        "spec": {"nodeName": node, "schedulerName": "hami-scheduler", "containers": [{"name": "c"}]},
        "status": {"phase": phase},
    }


def asking(limits, name="new"):
    pod = {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "resources": {"limits": limits}}]},
    }
    return admit_pod(pod, CFG.vendors)[0]


def usage(state, node="n1"):
    return {d.id: (used, mem) for d, used, mem, _ in state.ledger.device_usage(node)}


def fits(state, limits) -> str | None:
    """Where a new pod asking ``limits`` would go (None: nowhere), without keeping its reservation."""
    pod = asking(limits)
    result = schedule_pod(copy.deepcopy(pod), ["n1"], state.ledger, CFG, 0)
    state.ledger.remove_pod(pod_key(pod))
    return result.node


def test_one_vendors_unreadable_grant_keeps_the_others_and_cordons_its_own():
    s = ClusterState(CFG)
    told = []
    s.on_unreadable_pod = lambda pod, message: told.append((pod["metadata"]["name"], message))
    s.node_handler.replace([gpu_node()])
    pod = running("p", {"hami.io/vgpu-devices-allocated": NV_GRANT, "hami.io/dcu-devices-allocated": BAD_DCU})
    s.pod_handler.replace([pod], "10")
    # the readable NVIDIA grant still counts (before: nothing did, g0 looked idle)
    assert usage(s)["g0"] == (1, 1000)
    assert fits(s, {"nvidia.com/gpu": 2}) is None  # g0 is taken whole
    # the DCU the pod holds cannot be named: no new DCU pod on this node meanwhile
    assert usage(s)["DCU-a"] == (0, 0)
    assert fits(s, DCU_SMALL) is None
    assert set(s.unreadable[pod_key(pod)].errors) == {"DCU"}
    assert [n for n, _ in told] == ["p"] and "hami.io/dcu-devices-allocated" in told[0][1]
    s.pod_handler.apply("MODIFIED", copy.deepcopy(pod))  # a duplicate event: no second report
    assert len(told) == 1
    # the owner repairs the annotation: it counts, the cordon lifts
    fixed = running(
        "p", {"hami.io/vgpu-devices-allocated": NV_GRANT, "hami.io/dcu-devices-allocated": DCU_GRANT}, rv="6"
    )
    s.pod_handler.apply("MODIFIED", fixed)
    assert s.unreadable == {} and usage(s)["DCU-a"] == (1, 4000)
    assert fits(s, DCU_SMALL) == "n1"


def test_an_unreadable_single_vendor_grant_blocks_its_node_until_the_pod_goes():
    s = ClusterState(CFG)
    s.node_handler.replace([gpu_node()])
    pod = running("p", {"hami.io/vgpu-devices-allocated": "g0,NVIDIA,lots,100:;"})
    s.pod_handler.apply("ADDED", pod)
    assert fits(s, {"nvidia.com/gpu": 1}) is None
    assert fits(s, DCU_SMALL) == "n1"  # other vendors' devices are not concerned
    s.pod_handler.apply("DELETED", pod)
    assert s.unreadable == {} and fits(s, {"nvidia.com/gpu": 1}) == "n1"


def test_the_cordon_lifts_when_the_pod_finishes_or_a_relist_drops_it():
    s = ClusterState(CFG)
    s.node_handler.replace([gpu_node()])
    bad = {"hami.io/vgpu-devices-allocated": "g0,NVIDIA,lots,100:;"}
    s.pod_handler.replace([running("a", bad)], "10")
    s.pod_handler.apply("MODIFIED", running("a", bad, rv="11", phase="Succeeded"))
    assert s.unreadable == {} and fits(s, {"nvidia.com/gpu": 1}) == "n1"
    s.pod_handler.apply("ADDED", running("b", bad, rv="12"))
    assert fits(s, {"nvidia.com/gpu": 1}) is None
    s.pod_handler.replace([], "20")  # b is gone
    assert s.unreadable == {} and fits(s, {"nvidia.com/gpu": 1}) == "n1"


def test_the_pod_arriving_before_its_node_still_cordons_it():
    s = ClusterState(CFG)
    s.pod_handler.replace([running("p", {"hami.io/vgpu-devices-allocated": "g0,NVIDIA,lots,100:;"})], "10")
    s.node_handler.replace([gpu_node()])
    assert fits(s, {"nvidia.com/gpu": 1}) is None


def test_an_unbound_pod_with_an_unreadable_grant_holds_nothing():
    s = ClusterState(CFG)
    s.node_handler.replace([gpu_node()])
    pod = running("p", {"hami.io/vgpu-devices-allocated": "g0,NVIDIA,lots,100:;"})
    del pod["spec"]["nodeName"]
    pod["status"]["phase"] = "Pending"
    s.pod_handler.apply("ADDED", pod)
    assert s.unreadable == {} and fits(s, {"nvidia.com/gpu": 1}) == "n1"


def test_a_grant_read_once_still_counts_when_it_becomes_unreadable():
    s = ClusterState(CFG)
    s.node_handler.replace([gpu_node()])
    s.pod_handler.apply("ADDED", running("p", {"hami.io/vgpu-devices-allocated": NV_GRANT}))
    s.pod_handler.apply("MODIFIED", running("p", {"hami.io/vgpu-devices-allocated": "garbage"}, rv="6"))
    assert usage(s)["g0"] == (1, 1000) and s.unreadable == {}  # the grant it was bound with counts
    assert fits(s, {"nvidia.com/gpu": 1}) == "n1"  # on g1


def test_the_scheduler_tells_of_an_unreadable_grant_by_an_event_and_a_gauge():
    """An operator sees it: an ``UnreadableAllocation`` Warning on the pod, and
    ``hami_scheduler_unreadable_allocations`` (a log line alone was all there was)."""
    from hami.scheduler.options import Options
    from hami.scheduler.server import UNREADABLE_GRANT, SchedulerService

    svc = SchedulerService(Options(), None)
    recorded = []
    svc.events.record = lambda pod, reason, message, kind="Normal", involved="Pod": recorded.append(
        (pod["metadata"]["name"], reason, kind)
    )
    svc.state.node_handler.replace([gpu_node()])
    svc.state.pod_handler.replace([running("p", {"hami.io/vgpu-devices-allocated": "g0,NVIDIA,notanumber,100:;"})])
    assert recorded == [("p", UNREADABLE_GRANT, "Warning")]
    assert b"hami_scheduler_unreadable_allocations 1.0" in svc.metrics.render()
