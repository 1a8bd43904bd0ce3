"""One vendor's unreadable node registration drops that vendor's devices only (HAMi's
RegisterFromNodeAnnotations skips the backend whose GetNodeDevices failed and goes on with the
others); its error stays visible per vendor (log line, ``MalformedRegistration`` event), and the
pods holding its devices count again, once, when the registration is readable again."""

from __future__ import annotations

import copy
import json
import logging

from hami.config import chart_device_config
from hami.core import SchedulerConfig, admit_pod, schedule_pod
from hami.core.codec import encode_node_devices_json, encode_pod_devices
from hami.core.types import ContainerDevice, DeviceInfo
from hami.scheduler.state import ClusterState
from hami.vendors import build_vendors

CONFIG = SchedulerConfig(build_vendors(chart_device_config()))
NOW = 1_795_000_000.0
NV_REG = "hami.io/node-nvidia-register"
NPU_REG = "hami.io/node-register-Ascend910B3"


def gpus(name: str) -> str:
    return encode_node_devices_json(
        [
            DeviceInfo(id=f"{name}-g{i}", index=i, count=10, devmem=1000, devcore=100, type="NVIDIA-T4", health=True)
            for i in range(2)
        ]
    )


def npus(name: str) -> str:
    return json.dumps(
        [
            {"id": f"{name}-npu-{i}", "index": i, "count": 4, "devmem": 65536, "devcore": 20, "type": "Ascend910B3"}
            for i in range(2)
        ]
    )


BROKEN_NPUS = '[{"id":"npu-0","count":4,"devmem":65536.0,"devcore":20,"type":"Ascend910B3"}]'  # a float


def node(name: str = "n1", rv: int = 1, **annotations: str) -> dict:
    ann = {NV_REG: gpus(name), NPU_REG: npus(name), **annotations}
    return {
        "metadata": {"name": name, "annotations": ann, "resourceVersion": str(rv)},
        "status": {"allocatable": {"nvidia.com/gpu": "20", "huawei.com/Ascend910B3": "8"}},
    }


def holder(name: str, node_name: str, annotation: str, device: ContainerDevice) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "annotations": {"hami.io/vgpu-node": node_name, annotation: encode_pod_devices([[device]])},
        },
        "spec": {"schedulerName": "hami-scheduler", "nodeName": node_name, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def state() -> tuple[ClusterState, list[tuple[str, str]]]:
    s = ClusterState(CONFIG, clock=lambda: NOW)
    seen: list[tuple[str, str]] = []
    s.on_malformed = lambda n, message: seen.append((n["metadata"]["name"], message))
    return s, seen


def vendors_on(s: ClusterState, name: str) -> set[str]:
    return {d.vendor for d in s.ledger.node(name).devices} if s.ledger.has_node(name) else set()


def usage(s: ClusterState, name: str) -> dict[str, tuple[int, int, int]]:
    return {d.id: (u, m, c) for d, u, m, c in s.ledger.device_usage(name)}


def place(s: ClusterState, limits: dict) -> str | None:
    p = {
        "metadata": {"name": "new", "namespace": "ns", "uid": "uid-new", "annotations": {}},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "resources": {"limits": limits}}]},
    }
    return schedule_pod(admit_pod(p, CONFIG.vendors)[0], None, s.ledger, CONFIG, NOW).node


def test_an_unreadable_registration_drops_only_that_vendors_devices(caplog):
    s, seen = state()
    s.node_handler.replace([node()])
    assert vendors_on(s, "n1") == {"NVIDIA", "Ascend910B3"}
    with caplog.at_level(logging.WARNING, logger="hami.scheduler.state"):
        s.node_handler.apply("MODIFIED", node(rv=2, **{NPU_REG: BROKEN_NPUS}))
    assert vendors_on(s, "n1") == {"NVIDIA"}  # the node's GPUs stay schedulable
    assert place(s, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}) == "n1"
    assert place(s, {"huawei.com/Ascend910B3": 1}) is None  # its NPUs are not (stale or not)
    # the error is reported as before, for the failing vendor alone: one event, one log line
    assert len(seen) == 1 and seen[0][0] == "n1" and NPU_REG in seen[0][1] and "devmem" in seen[0][1]
    assert s.registration_errors == {"n1": {"Ascend910B3": seen[0][1]}}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "n1" in lines[0] and "Ascend910B3" in lines[0] and NPU_REG in lines[0]


def test_grants_survive_one_vendors_outage_and_count_once_when_it_comes_back():
    s, seen = state()
    s.node_handler.replace([node()])
    s.pod_handler.replace(
        [
            holder("gpu-user", "n1", "hami.io/vgpu-devices-allocated", ContainerDevice("n1-g0", "NVIDIA", 300, 10)),
            holder(
                "npu-user",
                "n1",
                "hami.io/Ascend910B3-devices-allocated",
                ContainerDevice("n1-npu-0", "Ascend910B3", 65536, 20),
            ),
        ]
    )
    before = usage(s, "n1")
    assert before["n1-g0"] == (1, 300, 10) and before["n1-npu-0"] == (1, 65536, 20)

    s.node_handler.apply("MODIFIED", node(rv=2, **{NPU_REG: BROKEN_NPUS}))
    during = usage(s, "n1")
    assert during == {k: v for k, v in before.items() if k.startswith("n1-g")}  # GPU grants kept as they were
    # a pod placed on the NPUs while they are out of the ledger is still recorded
    s.pod_handler.apply(
        "ADDED",
        holder(
            "late", "n1", "hami.io/Ascend910B3-devices-allocated", ContainerDevice("n1-npu-1", "Ascend910B3", 16384, 0)
        ),
    )

    s.node_handler.apply("MODIFIED", node(rv=3))
    after = usage(s, "n1")
    assert after == {**before, "n1-npu-1": (1, 16384, 0)}  # every grant counted once, none twice
    assert s.registration_errors == {}
    assert len(seen) == 1
    # the whole-card NPU is still taken: a new whole-card pod gets the other NPU's remaining room or nothing
    assert place(s, {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 65536}) is None


def test_each_unreadable_vendor_is_reported():
    s, seen = state()
    s.node_handler.replace([node()])
    s.node_handler.apply("MODIFIED", node(rv=2, **{NV_REG: "[{", NPU_REG: BROKEN_NPUS}))
    assert not s.ledger.has_node("n1")
    assert [m for _, m in seen] == [s.registration_errors["n1"]["NVIDIA"], s.registration_errors["n1"]["Ascend910B3"]]
    assert NV_REG in seen[0][1] and NPU_REG in seen[1][1]


def test_a_device_listed_twice_drops_its_vendor_only():
    s, seen = state()
    twice = json.dumps([{"id": "npu-0", "count": 4, "devmem": 65536, "devcore": 20, "type": "Ascend910B3"}] * 2)
    s.node_handler.replace([node(**{NPU_REG: twice})])
    assert vendors_on(s, "n1") == {"NVIDIA"}
    assert len(seen) == 1 and "'npu-0' is registered twice" in seen[0][1]


def test_a_device_id_two_vendors_register_drops_both():
    s, seen = state()
    npu = json.loads(npus("n1"))
    npu[1]["id"] = "n1-g1"  # the same id as a GPU: no grant could tell which device it names
    s.node_handler.replace([node(**{NPU_REG: json.dumps(npu)})])
    assert not s.ledger.has_node("n1")
    assert set(s.registration_errors["n1"]) == {"NVIDIA", "Ascend910B3"}
    assert len(seen) == 2 and all("'n1-g1' is registered twice" in m for _, m in seen)


def test_a_change_of_the_nodes_hami_vnpu_core_annotation_alone_is_read():
    s, _ = state()
    n = node()
    s.node_handler.replace([n])
    assert {d.mode for d in s.ledger.node("n1").devices if d.vendor == "Ascend910B3"} == {""}
    soft = copy.deepcopy(n)
    soft["metadata"]["annotations"]["hami-vnpu-core"] = "true"
    soft["metadata"]["resourceVersion"] = "2"
    s.node_handler.apply("MODIFIED", soft)
    assert {d.mode for d in s.ledger.node("n1").devices if d.vendor == "Ascend910B3"} == {"hami-core"}
