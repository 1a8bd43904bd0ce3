"""From the UI review: a GPU the DRA kubelet plugin marked unhealthy (a fatal XID) or cordoned
is published with a device taint; the UI showed it healthy and not cordoned, while kube-scheduler
(and `hami explain`'s DRA fit) kept claims off it."""

from __future__ import annotations

from hami.dra.model import SliceSettings, resource_slices
from hami.ui import model

from .test_dra_claims import Gpu
from .test_ui_api import NOW, validator_for
from .test_ui_dra import cluster  # noqa: F401 - the fixture


def test_a_tainted_dra_gpu_is_shown_unhealthy_or_cordoned(cluster):  # noqa: F811
    gpus = [Gpu(0, "GPU-dra-0"), Gpu(1, "GPU-dra-1"), Gpu(2, "GPU-dra-2")]
    slices = resource_slices(
        "dra-1",
        gpus,
        SliceSettings(split_count=4),
        unhealthy=frozenset({"GPU-dra-1"}),
        taint="NoSchedule",
        cordoned=frozenset({"GPU-dra-2"}),
        notes={"GPU-dra-0": 13},  # an informational XID taint: still healthy
    )
    cluster.slice_handler.replace(slices)
    doc = model.nodes_document(cluster, NOW)
    validator_for("/api/v1/nodes").validate(doc)
    [node] = [n for n in doc["items"] if n["name"] == "dra-1"]
    shown = {d["uuid"]: (d["health"], d["cordoned"]) for d in node["devices"]}
    assert shown == {"GPU-dra-0": (True, False), "GPU-dra-1": (False, False), "GPU-dra-2": (True, True)}


def test_a_dra_mig_gpu_is_one_gpu_with_its_instances_as_slices():
    """An A100 in dynamic MIG mode is published as 14 possible placements with no UUID (static
    MIG: one device per instance): the UI listed 14 "GPUs" of index 0, mode hami-core, with
    163,712 MiB between them for a 40 GiB card, and a claim's grant had no UUID."""
    from hami.scheduler.state import ClusterState
    from hami.ui import history

    from .test_dra_claims import claim, result
    from .test_dra_mig import A100, T4, slices
    from .test_ui_api import CFG

    s = ClusterState(CFG)
    s.node_handler.replace([{"metadata": {"name": "n1", "resourceVersion": "1"}}])
    s.slice_handler.replace(slices())
    s.claim_handler.replace(
        [
            claim("c1", results=[result("n1", "gpu-0-3g-20gb-4", None, None)], reserved=()),
            claim("c2", ns="team-b", results=[result("n1", "gpu-0-1g-5gb-0", None, None)], reserved=()),
        ]
    )
    nodes = model.nodes_document(s, NOW)
    validator_for("/api/v1/nodes").validate(nodes)
    [node] = nodes["items"]
    a100, t4 = node["devices"]
    assert (a100["uuid"], a100["index"], a100["mode"], a100["frontEnd"]) == (A100, 0, "mig", "dra")
    assert a100["memoryMiB"] == {"allocated": 19968 + 4864, "total": 40192}
    assert a100["cores"] == {"allocated": 43 + 15, "total": 100, "unit": "percent"}
    assert a100["slots"] == {"allocated": 2, "total": 7}
    assert a100["slices"] == [
        {"profile": "1g.5gb", "start": 0, "size": 1},
        {"profile": "3g.20gb", "start": 4, "size": 4},
    ]
    assert a100["claims"] == ["team-a/c1", "team-b/c2"]
    assert (t4["uuid"], t4["mode"], t4["memoryMiB"]["total"]) == (T4, "hami-core", 15360)
    pods = model.pods_document(s, NOW)
    validator_for("/api/v1/pods").validate(pods)
    grants = {i["claim"]["name"]: i["containers"][0]["grants"][0] for i in pods["items"]}
    assert (grants["c1"]["uuid"], grants["c1"]["slice"]) == (A100, {"profile": "3g.20gb", "start": 4, "size": 4})
    assert grants["c1"]["memoryMiB"] == 19968
    # the history keeps one series for the GPU, under its UUID
    gpus = [key for kind, key, _, _ in history.samples(nodes, pods) if kind == "gpu"]
    assert gpus == [A100, T4]
