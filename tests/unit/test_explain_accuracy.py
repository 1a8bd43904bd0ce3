"""``hami explain`` says what the scheduler would do, device by device.

Each test is a case where the explanation used to be wrong: a device the failing request never
considered marked "ok", a pending pod with a stale decision said to be placed, quota room that
ignored the DRA claims the scheduler counts, usage shown before the pod's earlier containers'
picks, a percentage printed as MiB, and the scheduler's ``--node-label-selector`` ignored.
"""

from __future__ import annotations

import argparse

from hami.core import DeviceInfo, NodeDevices, SchedulerConfig, encode_node_devices_json
from hami.core.explain import pending_verdict
from hami.kube.client import KubeError
from hami.scheduler import explain
from hami.scheduler.explain import read_cluster, render
from hami.scheduler.state import ClusterState
from hami.vendors import build_vendors

from ._corekit import CONFIG, ctr, gpu, ledger, pod
from .test_explain_dra import WHOLE

CFG = SchedulerConfig(build_vendors(), "binpack", "spread")


def node_obj(name: str, gpus: int = 1, mem: int = 16000, labels=None) -> dict:
    devs = [
        DeviceInfo(id=f"{name}-g{i}", index=i, count=10, devmem=mem, devcore=100, type="NVIDIA-T4", health=True)
        for i in range(gpus)
    ]
    return {
        "metadata": {
            "name": name,
            "annotations": {"hami.io/node-nvidia-register": encode_node_devices_json(devs)},
            "labels": labels or {},
            "resourceVersion": "1",
        },
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus * 10)}},
    }


def pending(name: str = "p", ns: str = "default", **limits) -> dict:
    p = pod(name, containers=[ctr(**limits)], ns=ns)
    p["metadata"]["resourceVersion"] = "5"
    p["spec"]["schedulerName"] = "hami-scheduler"
    p["status"] = {"phase": "Pending"}
    return p


DCU = DeviceInfo(
    id="DCU-n1-0",
    index=0,
    count=4,
    devmem=16000,
    devcore=100,
    type="DCU-Z100",
    mode="hami-core",
    health=True,
    vendor="DCU",
)


def reasons_of(verdict, node: str) -> dict[str, str]:
    (v,) = [v for v in verdict.nodes if v.node == node]
    return {dv.device.id: dv.reason for dv in v.devices}


# ------------------------------------------------------------------ devices the request never considered


def test_another_vendors_device_is_not_considered():
    led = ledger(NodeDevices(name="n1", devices=(gpu("n1", 0, mem=8000), DCU)))
    v = pending_verdict(pod(containers=[ctr(mem=10000)]), led, CONFIG, CONFIG.vendors, 0.0)
    assert reasons_of(v, "n1") == {"GPU-n1-0": "CardInsufficientMemory", "DCU-n1-0": "not considered (DCU)"}


def test_too_few_devices_says_how_many_of_those_asked():
    led = ledger(NodeDevices(name="n1", devices=(gpu("n1", 0, mem=8000), DCU)))
    v = pending_verdict(pod(containers=[ctr(gpu=2, mem=1000)]), led, CONFIG, CONFIG.vendors, 0.0)
    assert reasons_of(v, "n1") == {
        "GPU-n1-0": "considered, but too few: 1 of the 2 asked (NodeInsufficientDevice)",
        "DCU-n1-0": "not considered (DCU)",
    }
    assert v.nodes[0].detail == "the node has 1 of the 2 NVIDIA devices the container asks for"
    state = ClusterState(CFG)
    state.node_handler.replace([node_obj("n1")])
    out = render(pending(gpu=2, mem=1000), state, [], 0.0)
    assert "node n1: NodeInsufficientDevice (container #0): the node has 1 of the 2 NVIDIA devices" in out
    assert "-> ok" not in out


# ------------------------------------------------------------------ a stale decision


def stuck_state():
    state = ClusterState(CFG, "hami-scheduler")
    state.node_handler.replace([node_obj("n1")])
    other = pending("other", mem=12000)
    other["spec"]["nodeName"] = "n1"
    other["status"] = {"phase": "Running"}
    other["metadata"]["resourceVersion"] = "3"
    decision = {"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": "n1-g0,NVIDIA,12000,0:;"}
    other["metadata"]["annotations"].update({**decision, "hami.io/bind-phase": "success"})
    stuck = pending("stuck", mem=12000)
    stuck["metadata"]["annotations"].update(decision)  # Filter's patch; its Bind then failed
    state.pod_handler.replace([other, stuck])
    return state, stuck


def test_a_pending_pod_with_a_stale_decision_is_explained_as_filter_sees_it():
    state, stuck = stuck_state()
    out = render(stuck, state, [], 0.0)
    assert "It is placed on node" not in out
    assert "It carries a decision for node n1 (bind-phase -) but is not bound" in out
    assert "node n1: 1/1 CardInsufficientMemory (container #0)" in out
    assert "mem 12000/16000 MiB" in out  # the other pod's use, not this pod's own decision


def test_a_bound_pod_is_placed():
    state, _ = stuck_state()
    other = state.pod("default", "other")
    out = render(other, state, [], 0.0)
    assert "It is placed on node n1 (bind-phase success):" in out
    assert "NVIDIA n1-g0: 12000 MiB" in out


# ------------------------------------------------------------------ DRA claims in the quota room


class FakeKube:
    """Answers ``get(path)`` from a table; a path mapped to an int fails with that HTTP status."""

    def __init__(self, table: dict) -> None:
        self.table = table

    async def get(self, path: str) -> dict:
        got = self.table[path]
        if isinstance(got, int):
            raise KubeError("GET", path, got, '{"message": "no"}')
        return {"items": got}


QUOTA = {"metadata": {"namespace": "team", "name": "q"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "20000"}}}


def cluster(claims) -> FakeKube:
    return FakeKube(
        {
            "/api/v1/nodes": [node_obj("n1", gpus=2)],
            "/api/v1/pods": [],
            "/api/v1/resourcequotas": [QUOTA],
            "/apis/resource.k8s.io/v1/resourceslices": [] if claims != 404 else 404,
            "/apis/resource.k8s.io/v1/resourceclaims": claims,
        }
    )


async def test_explain_counts_the_dra_claims_the_scheduler_counts(capsys):
    state = ClusterState(CFG)
    p = pending(ns="team", mem=5000)
    assert await read_cluster(cluster([WHOLE]), state, p) is None  # the pod names no claim
    out = render(p, state, [], 0.0)
    # 15360 MiB of the 20000 the namespace may use are held by the claim: 4640 left, 5000 asked
    assert "It fits on none" in out and "node n1: 2/2 ResourceQuotaNotFit" in out
    assert capsys.readouterr().err == ""


async def test_a_cluster_without_the_dra_api_is_explained_as_before(capsys):
    state = ClusterState(CFG)
    p = pending(ns="team", mem=5000)
    assert await read_cluster(cluster(404), state, p) is None
    assert "It fits now" in render(p, state, [], 0.0)
    assert capsys.readouterr().err == ""  # an optional resource: absent without a word


async def test_a_dra_pod_reports_claims_it_cannot_read(capsys):
    from .test_explain_dra import dra_pod

    state = ClusterState(CFG)
    assert await read_cluster(cluster(403), state, dra_pod()) is None
    assert "reading resourceclaims" in capsys.readouterr().err


# ------------------------------------------------------------------ the pod's earlier containers


def test_device_usage_includes_the_pods_earlier_containers():
    led = ledger(NodeDevices(name="n", devices=(gpu("n", 0),)))
    p = pod(containers=[ctr("a", mem=10000), ctr("b", mem=10000)])
    v = pending_verdict(p, led, CONFIG, CONFIG.vendors, 0.0)
    (nv,) = v.nodes
    (dv,) = nv.devices
    assert nv.container == 1 and dv.reason == "CardInsufficientMemory"
    assert (dv.slots, dv.mem, dv.cores) == (1, 10000, 0)
    assert (dv.pod_slots, dv.pod_mem, dv.pod_cores) == (1, 10000, 0)
    assert list(led.device_usage("n"))[0][1:] == (0, 0, 0)  # the ledger is untouched


def test_render_says_which_usage_is_the_pods_own():
    state = ClusterState(CFG)
    state.node_handler.replace([node_obj("n1")])
    p = pending()
    p["spec"]["containers"] = [ctr("a", mem=10000), ctr("b", mem=10000)]
    out = render(p, state, [], 0.0)
    assert "mem 10000/16000 MiB" in out
    assert "(this pod's earlier containers: 1 slot(s), 10000 MiB, 0 cores)" in out


# ------------------------------------------------------------------ units


def test_a_percentage_is_not_printed_as_mib():
    state = ClusterState(CFG)
    state.node_handler.replace([node_obj("n1")])
    out = render(pending(pct=50), state, [], 0.0)
    assert "NVIDIA x1 mem=50% cores=0" in out and "%MiB" not in out
    assert "NVIDIA x1 mem=1000MiB cores=0" in render(pending(mem=1000), state, [], 0.0)


# ------------------------------------------------------------------ --node-label-selector


def test_explain_takes_the_schedulers_node_label_selector():
    parser = argparse.ArgumentParser()
    explain.add_arguments(parser)
    assert parser.parse_args(["p", "--node-label-selector", "gpu=on"]).node_label_selector == "gpu=on"
    assert parser.parse_args(["p"]).node_label_selector == ""


def test_a_bad_selector_is_refused_before_reading_the_cluster(capsys):
    parser = argparse.ArgumentParser()
    explain.add_arguments(parser)
    assert explain.run(parser.parse_args(["p", "--node-label-selector", "gpu"])) == 1
    assert "--node-label-selector" in capsys.readouterr().err


def test_nodes_outside_the_selector_are_not_offered_and_are_named():
    state = ClusterState(CFG, node_selector={"gpu": "on"})
    state.node_handler.replace([node_obj("on", labels={"gpu": "on"}, mem=8000), node_obj("off", mem=32000)])
    out = render(pending(mem=12000), state, [], 0.0)
    assert "It fits on none of the 1 nodes with devices" in out
    assert "nodes outside --node-label-selector (NodeLabelSelectorMismatch): off" in out
    assert "nodes without registered devices" not in out
