"""DRA allocations in the UI's read API, beside the extender's: GPUs from the driver's slices with
what claims consume, one /api/v1/pods item per allocated claim (front end, claim, reserving pods),
quotas counting claims; every answer still validates against openapi.yaml."""

from __future__ import annotations

import pytest

from hami.dra.model import SliceSettings, resource_slice
from hami.scheduler.state import ClusterState
from hami.ui import model
from hami.ui.live import NodeReading, Usage
from hami.ui.server import UiApi

from .test_dra_claims import Gpu, claim, result
from .test_ui_api import CFG, NOW, _client, gpu_node, gpu_pod, placed, validator_for


def dra_pod(name: str, ns: str = "team-a") -> dict:
    """A pod as the webhook's DRA front end leaves it, its claim generated from a template."""
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": "3"},
        "spec": {
            "schedulerName": "default-scheduler",
            "nodeName": "dra-1",
            "resourceClaims": [{"name": "hami-gpu-1", "resourceClaimTemplateName": "hami-gpu-abc"}],
            "initContainers": [{"name": "setup"}],
            "containers": [{"name": "other"}, {"name": "main", "resources": {"claims": [{"name": "hami-gpu-1"}]}}],
        },
        "status": {"phase": "Running", "resourceClaimStatuses": [{"name": "hami-gpu-1", "resourceClaimName": "c1"}]},
    }


@pytest.fixture
def cluster() -> ClusterState:
    s = ClusterState(CFG)
    s.node_handler.replace(
        [
            gpu_node("gpu-1"),
            {
                "metadata": {"name": "dra-1", "resourceVersion": "1"},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            },
        ]
    )
    s.quota_handler.replace(
        [
            {
                "metadata": {"name": "q", "namespace": "team-a"},
                "spec": {"hard": {"limits.nvidia.com/gpumem": "20000", "limits.nvidia.com/gpucores": "200"}},
            }
        ]
    )
    placed(s, gpu_pod("train"), "gpu-1")
    s.slice_handler.replace(
        [resource_slice("dra-1", [Gpu(0, "GPU-dra-0"), Gpu(1, "GPU-dra-1")], SliceSettings(split_count=4))]
    )
    s.pod_handler.apply("ADDED", dra_pod("p1"))
    s.claim_handler.replace(
        [
            claim("c1", results=[result("dra-1", "gpu-0", "3000Mi", "25")], reserved=("p1",)),
            claim(
                "c2",
                ns="team-b",
                results=[result("dra-1", "gpu-0", "1000Mi", "5"), result("dra-1", "gpu-1", None, None)],
                reserved=(),
            ),
            claim("unallocated"),
        ]
    )
    return s


def test_dra_gpus_are_listed_with_what_their_claims_consume(cluster):
    doc = model.nodes_document(cluster, NOW)
    nodes = {n["name"]: n for n in doc["items"]}
    assert sorted(nodes) == ["dra-1", "gpu-1"]
    assert {d["frontEnd"] for d in nodes["gpu-1"]["devices"]} == {"extender"}
    dra = nodes["dra-1"]
    assert dra["ready"] is True
    g0, g1 = dra["devices"]
    assert (g0["uuid"], g0["index"], g0["model"], g0["frontEnd"]) == ("GPU-dra-0", 0, "NVIDIA-Tesla T4", "dra")
    assert g0["memoryMiB"] == {"allocated": 4000, "total": 15360}
    assert g0["cores"] == {"allocated": 30, "total": 100, "unit": "percent"}
    assert g0["slots"] == {"allocated": 2, "total": 4}
    assert g0["claims"] == ["team-a/c1", "team-b/c2"]
    assert g1["memoryMiB"] == {"allocated": 15360, "total": 15360} and g1["cores"]["allocated"] == 100
    assert g1["claims"] == ["team-b/c2"]
    assert [n["name"] for n in model.nodes_document(cluster, NOW, params={"node": "dra-1"})["items"]] == ["dra-1"]
    assert [n["name"] for n in model.nodes_document(cluster, NOW, params={"model": "NVIDIA-Tesla T4"})["items"]] == [
        "dra-1",
        "gpu-1",
    ]
    assert model.nodes_document(cluster, NOW, params={"vendor": "Ascend910B3"})["items"] == []


def test_a_gpu_published_by_both_front_ends_adds_the_claims_to_its_allocation(cluster):
    before = {d["uuid"]: d for d in model.nodes_document(cluster, NOW)["items"][1]["devices"]}["GPU-gpu-1-0"]
    both = resource_slice("gpu-1", [Gpu(0, "GPU-gpu-1-0", 16384)], SliceSettings(split_count=10))
    cluster.slice_handler.apply("ADDED", both)
    cluster.claim_handler.apply("ADDED", claim("c9", results=[result("gpu-1", "gpu-0", "500Mi", "7")]))
    [gpu1] = [n for n in model.nodes_document(cluster, NOW)["items"] if n["name"] == "gpu-1"]
    after = {d["uuid"]: d for d in gpu1["devices"]}["GPU-gpu-1-0"]
    assert len(gpu1["devices"]) == 2  # listed once, not again as a DRA device
    assert after["memoryMiB"]["allocated"] == before["memoryMiB"]["allocated"] + 500
    assert after["cores"]["allocated"] == before["cores"]["allocated"] + 7
    assert after["slots"]["allocated"] == before["slots"]["allocated"] + 1
    assert after["claims"] == ["team-a/c9"] and after["frontEnd"] == "extender"


def test_each_allocated_claim_is_an_allocation_of_the_dra_front_end(cluster):
    live = {
        "dra-1": NodeReading(
            scraped_at=NOW - 1, stale_after=45, containers={("team-a", "p1", "main", "GPU-dra-0"): Usage(1234, 20.0)}
        )
    }
    items = model.pods_document(cluster, NOW, live)["items"]
    assert [(i["frontEnd"], i["namespace"], i["name"]) for i in items] == [
        ("extender", "team-a", "train"),
        ("dra", "team-a", "p1"),
        ("dra", "team-b", ""),
    ]
    c1, c2 = items[1], items[2]
    assert c1["claim"] == {
        "namespace": "team-a",
        "name": "c1",
        "uid": "uid-c1",
        "reservedFor": [{"resource": "pods", "name": "p1", "uid": "uid-p1"}],
    }
    assert (c1["uid"], c1["node"], c1["phase"], c1["memoryMiB"]) == ("uid-p1", "dra-1", "Running", 3000)
    [ctr] = c1["containers"]  # only the container that uses the claim
    assert (ctr["name"], ctr["kind"]) == ("main", "app")
    [g] = ctr["grants"]
    assert (g["uuid"], g["index"], g["memoryMiB"], g["cores"], g["node"], g["device"], g["request"]) == (
        "GPU-dra-0",
        0,
        3000,
        25,
        "dra-1",
        "gpu-0",
        "gpu",
    )
    assert g["usage"] == {"state": "live", "memoryUsedMiB": 1234, "utilizationPercent": 20.0}
    # nobody reserves c2 (yet): no pod, one unnamed container, the whole of gpu-1 counted
    assert c2["claim"]["reservedFor"] == [] and c2["uid"] == "" and c2["phase"] == "Unknown"
    assert c2["memoryMiB"] == 1000 + 15360 and [c["name"] for c in c2["containers"]] == [""]
    assert [g["memoryMiB"] for g in c2["containers"][0]["grants"]] == [1000, 15360]
    assert [i["name"] for i in model.pods_document(cluster, NOW, params={"namespace": "team-b"})["items"]] == [""]
    assert [i["frontEnd"] for i in model.pods_document(cluster, NOW, params={"node": "dra-1"})["items"]] == [
        "dra",
        "dra",
    ]
    assert model.pods_document(cluster, NOW, params={"node": "elsewhere"})["items"] == []


def test_quotas_count_dra_claims_beside_extender_pods(cluster):
    [q] = model.quotas_document(cluster, NOW)["items"]
    used = {r["kind"]: r["used"] for r in q["resources"]}
    # the extender's "train" + claim c1 + claim "unallocated", which names no amount: until it is
    # allocated, all the memory of the largest GPU published (15360 MiB)
    assert used == {"memory": 3000 + 3000 + 15360, "cores": 30 + 25}


def test_a_source_without_dra_objects_still_answers(cluster):
    snap = model.Snapshot(cluster.ledger, cluster.vendors, cluster.config, cluster.nodes, cluster.pods, cluster.quotas)
    assert [n["name"] for n in model.nodes_document(snap, NOW)["items"]] == ["gpu-1"]
    assert [i["frontEnd"] for i in model.pods_document(snap, NOW)["items"]] == ["extender"]


async def test_the_dra_answers_validate_against_the_openapi_document(cluster):
    client = await _client(UiApi(cluster, "hami-scheduler", clock=lambda: NOW))
    try:
        for path in ("/api/v1/nodes", "/api/v1/pods", "/api/v1/quotas"):
            body = await (await client.get(path)).json()
            errors = sorted(validator_for(path).iter_errors(body), key=str)
            assert not errors, (path, [e.message for e in errors][:5])
        bad = await (await client.get("/api/v1/pods")).json()
        bad["items"][1]["frontEnd"] = "webhook"
        assert list(validator_for("/api/v1/pods").iter_errors(bad)), "the schema must constrain frontEnd"
    finally:
        await client.close()


def test_live_usage_of_a_claim_shared_by_containers_is_found_under_the_claims_name(cluster):
    pod = dra_pod("p1")
    pod["metadata"]["resourceVersion"] = "4"
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "hami-gpu-1"}]}  # "other" uses it too
    cluster.pod_handler.apply("MODIFIED", pod)
    live = {
        "dra-1": NodeReading(
            scraped_at=NOW - 1, stale_after=45, containers={("team-a", "p1", "c1", "GPU-dra-0"): Usage(777, 9.0)}
        )
    }
    [item] = [
        i for i in model.pods_document(cluster, NOW, live)["items"] if i["frontEnd"] == "dra" and i["name"] == "p1"
    ]
    assert [c["name"] for c in item["containers"]] == ["other", "main"]
    assert [c["grants"][0]["usage"]["memoryUsedMiB"] for c in item["containers"]] == [777, 777]


# ---------------------------------------------------------------------- a DRA node's own monitor
# What the chart's DRA monitor (<release>-dra-monitor, reached through its hostPort) serves, made by
# `hami monitor`'s own code: a claim's region and record as the kubelet plugin leaves them, the pod
# map through the monitor's pod_claims, host GPUs as NVML reports them, served by serve_metrics and
# read by the UI's scraper; the figures must land on the DRA GPUs and the claim's grants.
async def _dra_monitor_reading(tmp_path, pod: dict) -> dict:
    import json

    import aiohttp
    from kubernetes_asyncio import client
    from prometheus_client import CollectorRegistry

    from hami.monitor.command import serve_metrics
    from hami.monitor.exporter import MonitorCollector, PodRef
    from hami.monitor.kube import pod_claims
    from hami.node.nvml import HostGPU
    from hami.ui.live import LiveUsage

    from . import _regionkit as kit

    MiB = 1 << 20
    claims = tmp_path / "claims"
    kit.write(  # claim c1 (uid-c1): 1200 MiB held and 20 % SM on the first DRA GPU
        claims / "uid-c1" / "r.cache",
        uuids=("GPU-dra-0",),
        limits=(3000 * MiB,),
        procs=[kit.Proc(pid=7, hostpid=70, used={0: (0, 0, 1200 * MiB, 1200 * MiB)}, sm_util={0: 20})],
    )
    (claims / "uid-c1.json").write_text(
        json.dumps({"namespace": "team-a", "name": "c1", "uid": "uid-c1", "devices": ["GPU-dra-0"]})
    )
    async with client.ApiClient() as api:
        v1pod = api._ApiClient__deserialize(pod, "V1Pod")
    meta = pod["metadata"]
    pods = {meta["uid"]: PodRef(meta["namespace"], meta["name"], meta["uid"], claims=pod_claims(v1pod))}
    gpus = [
        HostGPU(0, "GPU-dra-0", "Tesla T4", memory_used=5000 * MiB, utilization=61),
        HostGPU(1, "GPU-dra-1", "Tesla T4", memory_used=0, utilization=0),
    ]
    registry = CollectorRegistry()
    registry.register(
        MonitorCollector(
            "dra-1", str(tmp_path / "containers"), lambda: pods, lambda: gpus, claims_dir=str(claims), clock=lambda: NOW
        )
    )
    runner = await serve_metrics(registry, "127.0.0.1", 0)
    node = {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}}
    scraper = LiveUsage(
        f"http://{{node_ip}}:{runner.addresses[0][1]}/metrics", lambda: [("dra-1", node)], clock=lambda: NOW - 1
    )
    try:
        async with aiohttp.ClientSession() as session:
            await scraper.scrape_all(session)
    finally:
        await runner.cleanup()
    assert scraper.readings["dra-1"].error is None
    return scraper.readings


async def test_a_dra_monitors_metrics_give_the_dra_gpus_and_the_claim_their_live_figures(cluster, tmp_path):
    live = await _dra_monitor_reading(tmp_path, dra_pod("p1"))
    [node] = model.nodes_document(cluster, NOW, live, {"node": "dra-1"})["items"]
    assert node["monitor"] == {"state": "live", "ageSeconds": 1.0, "error": None}
    assert {d["uuid"]: d["usage"] for d in node["devices"]} == {
        "GPU-dra-0": {"state": "live", "memoryUsedMiB": 5000, "utilizationPercent": 61.0},
        "GPU-dra-1": {"state": "live", "memoryUsedMiB": 0, "utilizationPercent": 0.0},
    }
    [item] = [
        i for i in model.pods_document(cluster, NOW, live)["items"] if i["frontEnd"] == "dra" and i["name"] == "p1"
    ]
    [ctr] = item["containers"]
    assert ctr["name"] == "main"
    assert [(g["uuid"], g["usage"]) for g in ctr["grants"]] == [
        ("GPU-dra-0", {"state": "live", "memoryUsedMiB": 1200, "utilizationPercent": 20.0})
    ]


async def test_a_dra_monitors_metrics_of_a_claim_shared_by_containers_reach_each_of_them(cluster, tmp_path):
    pod = dra_pod("p1")
    pod["metadata"]["resourceVersion"] = "4"
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "hami-gpu-1"}]}  # "other" uses it too
    cluster.pod_handler.apply("MODIFIED", pod)
    live = await _dra_monitor_reading(tmp_path, pod)
    assert [k[2] for k in live["dra-1"].containers] == ["c1"]  # the monitor's label: the claim's name
    [item] = [
        i for i in model.pods_document(cluster, NOW, live)["items"] if i["frontEnd"] == "dra" and i["name"] == "p1"
    ]
    assert [(c["name"], [g["usage"]["memoryUsedMiB"] for g in c["grants"]]) for c in item["containers"]] == [
        ("other", [1200]),
        ("main", [1200]),
    ]
