"""``hami simulate`` on dumps of live clusters (``kubectl get nodes/pods -o yaml``): pods that
finished, pods being deleted, running pods listed after pending ones, deletions without a uid,
kube-scheduler's node filters, the webhook's denials, one bad pod among many, allocations no
scheduler could have written. Both front ends where the rule is theirs alike."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core import DeviceInfo, SchedulerConfig, encode_node_devices_json
from hami.dra.model import SliceSettings, resource_slice
from hami.node.nvml import PhysicalGPU
from hami.core import nodefit
from hami.sim.dra import simulate_dra
from hami.sim.engine import SimulationError, simulate
from hami.vendors import build_vendors

from .test_simulate import pod_doc, sim, write

CFG = SchedulerConfig(build_vendors(), "binpack", "spread")
GPU = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000}
BOTH = pytest.mark.parametrize("front_end", ["extender", "dra"])


def node(name, n=1, mem=16000, labels=None, taints=None, unschedulable=None, ready=None):
    devs = [
        DeviceInfo(
            id=f"GPU-{name}-{i}",
            index=i,
            count=10,
            devmem=mem,
            devcore=100,
            type="NVIDIA-A10",
            mode="hami-core",
            health=True,
        )
        for i in range(n)
    ]
    out = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {"hami.io/node-nvidia-register": encode_node_devices_json(devs)}},
    }
    if labels:
        out["metadata"]["labels"] = labels
    spec = {}
    if taints is not None:
        spec["taints"] = taints
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    if spec:
        out["spec"] = spec
    if ready is not None:
        out["status"] = {
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}]
        }
    return out


def placed(name, node_name, uuid, mem=10000, cores=0, phase="Running", uid=None, **extra):
    p = pod_doc(
        name,
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mem},
        annotations={
            "hami.io/vgpu-node": node_name,
            "hami.io/vgpu-devices-allocated": f"{uuid},NVIDIA,{mem},{cores}:;",
            "hami.io/bind-phase": "success",
        },
    )
    p["spec"]["nodeName"] = node_name
    p["status"] = {"phase": phase}
    if uid:
        p["metadata"]["uid"] = uid
    p["metadata"].update(extra)
    return p


def deleting(p):
    p["metadata"]["deletionTimestamp"] = "2026-11-29T10:00:00Z"
    return p


def run(tmp_path, capsys, nodes, pods, *extra):
    code, out, err = sim(
        capsys,
        "--nodes",
        write(tmp_path, "n.yaml", nodes),
        "--pods",
        write(tmp_path, "p.yaml", pods),
        "-o",
        "json",
        *extra,
    )
    assert code == 0, err
    data = json.loads(out)
    return {p["name"]: p for p in data["pods"]}, data, err


def held(data):
    return {d["uuid"]: (d["used"], d["usedmem"], d["usedcores"]) for d in data["devices"] if d["used"]}


# ---------------------------------------------------------------- 1. finished pods hold nothing


@BOTH
def test_succeeded_and_failed_pods_are_finished_and_hold_nothing(tmp_path, capsys, front_end):
    done = placed("done-job", "n1", "GPU-n1-0", mem=16000, cores=100, phase="Succeeded")
    failed = pod_doc("failed-job", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 16000})
    failed["spec"]["nodeName"] = "n1"
    failed["status"] = {"phase": "Failed"}
    new = pod_doc("new", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 16000})
    pods, data, _ = run(tmp_path, capsys, [node("n1")], [done, failed, new], "--front-end", front_end)
    assert {n: (p["status"], p["node"]) for n, p in pods.items()} == {
        "done-job": ("finished", None),
        "failed-job": ("finished", None),
        "new": ("scheduled", "n1"),
    }
    assert all(not c["devices"] for n in ("done-job", "failed-job") for c in pods[n]["containers"])
    assert [(d["used"], d["usedmem"]) for d in data["devices"]] == [(1, 16000)]


# ---------------------------------------------------------------- 2. placed pods first, whatever the order


def test_a_running_pod_listed_after_a_pending_one_keeps_its_gpu(tmp_path, capsys):
    pending = pod_doc("a-pending", GPU)
    running = placed("b-running", "solo", "GPU-solo-0")
    pods, data, _ = run(tmp_path, capsys, [node("solo")], [pending, running])
    assert [p["name"] for p in data["pods"]] == ["a-pending", "b-running"]  # the output keeps file order
    assert pods["b-running"]["status"] == "pre-placed"
    assert pods["a-pending"]["status"] == "pending"
    assert pods["a-pending"]["reasons"] == {"solo": "1/1 CardInsufficientMemory"}
    assert held(data) == {"GPU-solo-0": (1, 10000, 0)}


def test_a_pod_bound_by_node_name_alone_keeps_its_place_after_the_placed_ones(tmp_path, capsys):
    """The placed pod first; the nodeName-only pod in file order, so a quota given before it
    applies to it (it was hoisted past the quota: placed where the webhook would refuse it)."""
    new = pod_doc("a-new", GPU)
    bound = pod_doc("b-bound", GPU)
    bound["spec"]["nodeName"] = "solo"
    running = placed("c-running", "solo", "GPU-solo-0", mem=6000)
    pods, data, _ = run(tmp_path, capsys, [node("solo")], [new, bound, running])
    assert pods["c-running"]["status"] == "pre-placed"
    assert (pods["a-new"]["status"], pods["a-new"]["node"]) == ("scheduled", "solo")
    assert pods["b-bound"]["status"] == "pending" and pods["b-bound"]["reasons"] == {
        "solo": "1/1 CardInsufficientMemory"
    }
    assert held(data) == {"GPU-solo-0": (2, 16000, 0)}
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "q", "namespace": "default"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}},
    }
    pods, _, _ = run(tmp_path, capsys, [node("solo")], [quota, bound])
    assert pods["b-bound"]["status"] == "pending" and "ResourceQuotaNotFit" in str(pods["b-bound"]["reasons"])


def test_events_after_the_dump_still_play_in_file_order(tmp_path, capsys):
    # a pod placed before the sequence is deleted in it: the GPU is free from that point only, and
    # "before", pending until then, takes it on kube-scheduler's retry (since 1 Dec: review)
    docs = [
        pod_doc("before", GPU),
        placed("old", "solo", "GPU-solo-0"),
        deleting(pod_doc("old")),
        pod_doc("after", GPU),
        pod_doc("after", deleted=True),
        pod_doc("after", GPU),
    ]
    pods, data, _ = run(tmp_path, capsys, [node("solo")], docs)
    assert [(p["name"], p["status"]) for p in data["pods"]] == [
        ("before", "scheduled"),
        ("old", "deleted"),
        ("after", "pending"),
    ]
    assert held(data) == {"GPU-solo-0": (1, 10000, 0)}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.integers(0, 6), st.integers(1, 8))
def test_property_a_dump_in_any_order_keeps_every_running_pod_on_its_gpu(rnd: random.Random, running, new):
    """Each pod once: whatever the order of the documents, every running pod holds its grant and
    no GPU is over its memory (the new pods only fill what the running ones leave)."""
    nodes = [node("a", n=2), node("b", n=1)]
    gpus = ["GPU-a-0", "GPU-a-1", "GPU-b-0"]
    docs = [placed(f"run{i}", gpus[i % 3][4], gpus[i % 3], mem=5000) for i in range(running)]
    docs += [pod_doc(f"new{i}", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 7000}) for i in range(new)]
    rnd.shuffle(docs)
    result = simulate(nodes, docs, CFG)
    status = {p.name: p.status for p in result.pods}
    assert all(status[f"run{i}"] == "pre-placed" for i in range(running))
    assert [p.name for p in result.pods] == [d["metadata"]["name"] for d in docs]
    for d in result.devices:
        assert d["usedmem"] <= d["totalmem"], d
    order = sorted(docs, key=lambda d: "hami.io/vgpu-node" not in (d["metadata"].get("annotations") or {}))
    again = simulate(nodes, order, CFG)  # running pods first: the same placement
    assert {p.name: p.node for p in again.pods} == {p.name: p.node for p in result.pods}


# ---------------------------------------------------------------- 3. terminating pods keep their GPUs


def test_a_terminating_pod_in_a_dump_keeps_its_gpu_until_deleted(tmp_path, capsys):
    term = deleting(placed("terminating", "solo", "GPU-solo-0", mem=16000, cores=100))
    new = pod_doc("new", GPU)
    pods, data, err = run(tmp_path, capsys, [node("solo")], [term, new])
    assert "deleted before it was created" not in err and "warning" not in err
    assert (pods["terminating"]["status"], pods["terminating"]["node"]) == ("terminating", "solo")
    assert pods["terminating"]["containers"][0]["devices"][0]["uuid"] == "GPU-solo-0"
    assert pods["new"]["status"] == "pending"
    assert held(data) == {"GPU-solo-0": (1, 16000, 100)}
    # a second deletionTimestamp copy, given after it, deletes it: the GPU is free again
    pods, data, _ = run(tmp_path, capsys, [node("solo")], [term, deleting(pod_doc("terminating")), new])
    assert pods["terminating"]["status"] == "deleted" and pods["new"]["status"] == "scheduled"


@BOTH
def test_an_unplaced_terminating_pod_is_not_scheduled_anew(tmp_path, capsys, front_end):
    pods, data, err = run(tmp_path, capsys, [node("solo")], [deleting(pod_doc("going", GPU))], "--front-end", front_end)
    assert "deleted before it was created" not in err
    assert pods["going"]["status"] == "terminating" and pods["going"]["node"] is None
    assert all(d["used"] == 0 for d in data["devices"])


# ---------------------------------------------------------------- 4. deletions by namespace/name


@BOTH
def test_a_delete_without_the_uid_frees_the_pod_that_has_one(tmp_path, capsys, front_end):
    whole = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 16000, "nvidia.com/gpucores": 100}
    first = pod_doc("web", whole)
    first["metadata"]["uid"] = "11111111-2222-3333-4444-555555555555"
    docs = [first, pod_doc("web", deleted=True), pod_doc("web", whole)]
    pods, data, _ = run(tmp_path, capsys, [node("n1")], docs, "--front-end", front_end)
    assert [(p["name"], p["status"]) for p in data["pods"]] == [("web", "scheduled")]
    assert [(d["used"], d["usedmem"], d["usedcores"]) for d in data["devices"]] == [(1, 16000, 100)]


def test_a_pre_placed_pod_with_a_uid_is_deleted_by_name(tmp_path, capsys):
    web = placed("web", "n1", "GPU-n1-0", mem=16000, cores=100, uid="11111111-2222-3333-4444-555555555555")
    docs = [web, deleting(pod_doc("web")), pod_doc("web", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 16000})]
    pods, data, _ = run(tmp_path, capsys, [node("n1", n=2)], docs)
    assert [(p["name"], p["status"]) for p in data["pods"]] == [("web", "scheduled")]
    assert held(data) == {"GPU-n1-0": (1, 16000, 0)}


# ---------------------------------------------------------------- 5. kube-scheduler's node filters


def test_selector_taints_and_tolerations_filter_the_nodes(tmp_path, capsys):
    nodes = [
        node("node-a", labels={"pool": "a"}),
        node("node-b", labels={"pool": "b"}, taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
    ]
    plain = pod_doc("plain", GPU)
    wants_b = pod_doc("wants-b", GPU)
    wants_b["spec"]["nodeSelector"] = {"pool": "b"}
    wants_b["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    nowhere = pod_doc("wants-zzz", GPU)
    nowhere["spec"]["nodeSelector"] = {"pool": "zzz"}
    pods, _, _ = run(tmp_path, capsys, nodes, [plain, wants_b, nowhere])
    assert (pods["plain"]["node"], pods["wants-b"]["node"]) == ("node-a", "node-b")
    assert pods["wants-zzz"]["reasons"] == {
        "node-a": "node(s) didn't match Pod's node affinity/selector",
        "node-b": "node(s) had untolerated taint {dedicated: x}",
    }


@BOTH
def test_cordoned_and_not_ready_nodes_are_left_out_with_kube_schedulers_words(tmp_path, capsys, front_end):
    nodes = [
        node(
            "a-cordoned",
            unschedulable=True,
            taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}],
        ),
        node("b-not-ready", ready="False"),
        node("c-unknown", ready="Unknown"),
        node("d-ready", ready="True"),
    ]
    pods, _, _ = run(tmp_path, capsys, nodes, [pod_doc("x1", GPU), pod_doc("x2", GPU)], "--front-end", front_end)
    assert pods["x1"]["node"] == "d-ready"
    assert pods["x2"]["status"] == "pending"
    reasons = pods["x2"]["reasons"]
    assert reasons["a-cordoned"] == "node(s) were unschedulable"
    assert reasons["b-not-ready"].startswith("node(s) had untolerated taint {node.kubernetes.io/not-ready: }")
    assert reasons["c-unknown"].startswith("node(s) had untolerated taint {node.kubernetes.io/unreachable: }")
    assert "d-ready" in reasons and "taint" not in reasons["d-ready"]


def test_dra_filters_nodes_given_as_node_objects_and_not_those_known_by_a_slice_alone():
    """A ResourceSlice says nothing of its node's labels or taints: such a node is not filtered
    (kube-scheduler reads the Node, which the file does not give)."""
    sliced = resource_slice("s", [PhysicalGPU(0, "GPU-s-0", "A10", 23028, "", 0)], SliceSettings())
    labelled = node("n", labels={"pool": "y"})
    p = pod_doc("p", GPU)
    p["spec"]["nodeSelector"] = {"pool": "x"}
    result = simulate_dra([labelled, sliced], [p, pod_doc("q", GPU)], CFG)
    by_name = {o.name: o for o in result.pods}
    assert (by_name["p"].status, by_name["p"].node) == ("scheduled", "s")
    tight = {**p, "metadata": {"name": "t", "namespace": "default"}}
    tight["spec"] = {**p["spec"], "nodeSelector": {"pool": "z"}}
    result = simulate_dra([labelled], [tight], CFG)
    assert result.pods[0].reasons == {"n": nodefit.AFFINITY}


def test_a_pod_tolerating_the_cordon_may_go_there(tmp_path, capsys):
    nodes = [node("a", unschedulable=True)]
    p = pod_doc("tolerant", GPU)
    p["spec"]["tolerations"] = [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    ]
    pods, _, _ = run(tmp_path, capsys, nodes, [p, pod_doc("plain", GPU)])
    assert pods["tolerant"]["node"] == "a"
    assert pods["plain"]["reasons"] == {"a": "node(s) were unschedulable"}


def test_a_bad_affinity_operator_stops_the_run_naming_the_field(tmp_path, capsys):
    p = pod_doc("odd", GPU)
    p["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["x"]}]}]
            }
        }
    }
    code, out, err = sim(
        capsys, "--nodes", write(tmp_path, "n.yaml", [node("n1")]), "--pods", write(tmp_path, "p.yaml", [p])
    )
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert "p.yaml: document 1 (Pod default/odd): spec.affinity.nodeAffinity" in err
    assert "nodeSelectorTerms[0].matchExpressions[0].operator: 'Near' is not one of In, NotIn" in err


FACTS = nodefit.NodeFacts(
    "gpu-7",
    {"zone": "eu-1", "gen": "4", "gpu": "a10"},
    (
        nodefit.Taint("dedicated", "ml", "NoSchedule"),
        nodefit.Taint("spot", "", "PreferNoSchedule"),
        nodefit.Taint("evict", "now", "NoExecute"),
    ),
)
ALL = {"key": "", "operator": "Exists"}
ML = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}, {"key": "evict", "operator": "Exists"}]


def _term(*exprs, fields=()):
    return {"matchExpressions": list(exprs), "matchFields": list(fields)}


def _ask(tolerations=(ALL,), selector=None, terms=None):
    spec = {"tolerations": list(tolerations)}
    if selector is not None:
        spec["nodeSelector"] = selector
    if terms is not None:
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    return nodefit.pod_asks({"spec": spec})


def _req(key, op, *values):
    return {"key": key, "operator": op, "values": list(values)}


@pytest.mark.parametrize(
    "asks, refused",
    [
        (_ask(), None),
        (_ask(tolerations=()), "node(s) had untolerated taint {dedicated: ml}"),
        (_ask(tolerations=ML), None),
        (_ask(tolerations=ML[:1]), "node(s) had untolerated taint {evict: now}"),
        (
            _ask(tolerations=[{"key": "dedicated", "value": "other"}, ML[1]]),
            "node(s) had untolerated taint {dedicated: ml}",
        ),
        (
            _ask(tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, ML[1]]),
            "taint {dedicated: ml}",
        ),
        (_ask(tolerations=[{"key": "dedicated", "operator": "Exists"}, ML[1]]), None),
        (_ask(selector={"zone": "eu-1"}), None),
        (_ask(selector={"zone": "eu-1", "gpu": "t4"}), nodefit.AFFINITY),
        (_ask(terms=[_term(_req("zone", "In", "eu-1", "eu-2"))]), None),
        (_ask(terms=[_term(_req("zone", "NotIn", "eu-1"))]), nodefit.AFFINITY),
        (_ask(terms=[_term(_req("rack", "NotIn", "r1"))]), None),
        (_ask(terms=[_term(_req("gpu", "Exists"), _req("rack", "DoesNotExist"))]), None),
        (_ask(terms=[_term(_req("rack", "Exists"))]), nodefit.AFFINITY),
        (_ask(terms=[_term(_req("gen", "Gt", "3"))]), None),
        (_ask(terms=[_term(_req("gen", "Lt", "4"))]), nodefit.AFFINITY),
        (_ask(terms=[_term(_req("zone", "Gt", "3"))]), nodefit.AFFINITY),  # not an integer: no match
        (_ask(terms=[_term(fields=[_req("metadata.name", "In", "gpu-7")])]), None),
        (_ask(terms=[_term(fields=[_req("metadata.name", "NotIn", "gpu-7")])]), nodefit.AFFINITY),
        (_ask(terms=[_term(_req("zone", "In", "us")), _term(_req("gpu", "In", "a10"))]), None),  # terms: OR
        (_ask(terms=[_term(_req("zone", "In", "eu-1"), _req("gpu", "In", "t4"))]), nodefit.AFFINITY),  # AND
        (_ask(terms=[_term()]), nodefit.AFFINITY),  # an empty term selects nothing
        (_ask(terms=[_term(_req("gen", "Gt", "3_0"))]), nodefit.AFFINITY),  # Go's ParseInt refuses it
        (_ask(selector={"gpu": "t4"}, tolerations=()), "node(s) had untolerated taint {dedicated: ml}"),  # taints first
    ],
)
def test_node_filters_as_kube_scheduler_runs_them(asks, refused):
    got = nodefit.refusal(asks, FACTS)
    if refused is None or refused == nodefit.AFFINITY:
        assert got == refused
    else:  # a taint: its key and value in kube-scheduler's words
        assert got is not None and refused in got, got


def _required(*terms):
    return {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
        }
    }


@pytest.mark.parametrize(
    "spec, needle",
    [
        (
            {"tolerations": [{"key": "a", "operator": "Maybe"}]},
            "spec.tolerations[0].operator: 'Maybe' is not one of Equal",
        ),
        ({"tolerations": [{"key": "a", "operator": "Exists", "value": "v"}]}, "spec.tolerations[0].value: 'v'"),
        ({"tolerations": [{"value": "v"}]}, "must be Exists when the key is empty"),
        ({"tolerations": [{"key": "a", "effect": "Sometimes"}]}, "spec.tolerations[0].effect: 'Sometimes'"),
        (_required(), "nodeSelectorTerms: must have at least one node selector term"),
        (_required(_term(_req("a", "In"))), "nodeSelectorTerms[0].matchExpressions[0].values: must be non-empty"),
        (_required(_term(_req("a", "Exists", "x"))), "must be empty with operator Exists"),
        (
            _required(_term(), _term(_req("a", "Gt", "1", "2"))),
            "[1].matchExpressions[0].values: ['1', '2']: must be one",
        ),
        (_required(_term(fields=[_req("metadata.uid", "In", "x")])), "matchFields supports metadata.name only"),
        (_required(_term(fields=[_req("metadata.name", "In", "a", "b")])), "must be one value for matchFields"),
        (
            _required(_term(fields=[_req("metadata.name", "Exists")])),
            "matchFields[0].operator: 'Exists' is not one of In",
        ),
    ],
)
def test_what_the_api_server_refuses_in_the_filters_fields_is_named(spec, needle):
    with pytest.raises(nodefit.NodeFitError, match=None) as err:
        nodefit.pod_asks({"spec": spec})
    assert needle in str(err.value)


def test_a_not_ready_node_already_tainted_is_not_tainted_twice():
    facts = nodefit.node_facts(
        {
            "metadata": {"name": "n"},
            "spec": {"taints": [{"key": nodefit.NOT_READY_TAINT, "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        }
    )
    assert facts.taints == (nodefit.Taint(nodefit.NOT_READY_TAINT, "", "NoSchedule"),)
    assert nodefit.node_facts({"metadata": {"name": "n"}, "status": {"conditions": []}}).taints == ()


# ---------------------------------------------------------------- 6. the webhook's denials on the extender


def test_the_webhook_denies_a_privileged_gpu_pod_and_leaves_other_schedulers_pods_alone(tmp_path, capsys):
    priv = pod_doc("priv", GPU)
    priv["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    other = pod_doc("other-sched", GPU)
    other["spec"]["schedulerName"] = "volcano"
    ours = pod_doc("ours", GPU)
    ours["spec"]["schedulerName"] = "hami-scheduler"
    pods, data, _ = run(tmp_path, capsys, [node("n1", n=2)], [priv, other, ours])
    assert pods["priv"]["status"] == "denied" and "privileged" in pods["priv"]["reasons"]["webhook"]
    assert pods["other-sched"]["status"] == "pending"
    assert "spec.schedulerName is 'volcano'" in pods["other-sched"]["reasons"]["*"]
    assert pods["ours"]["status"] == "scheduled"
    assert held(data) == {"GPU-n1-0": (1, 10000, 0)}
    pods, _, _ = run(tmp_path, capsys, [node("n1", n=2)], [other], "--scheduler-name", "volcano")
    assert pods["other-sched"]["status"] == "scheduled"


# ---------------------------------------------------------------- 7. one bad pod does not stop the run


@pytest.mark.parametrize(
    "annotation, value, needle",
    [
        ("hami.io/gpu-scheduler-policy", "binpak", "unknown GPU policy 'binpak'"),
        ("hami.io/device-scoring-weights", "slot=1,core=1", "must set all of slot, core and memory"),
        ("hami.io/node-scheduler-policy", "random", "unknown node policy 'random'"),
    ],
)
def test_a_policy_the_filter_refuses_leaves_that_pod_pending(tmp_path, capsys, annotation, value, needle):
    bad = pod_doc("bad", GPU, annotations={annotation: value})
    pods, _, _ = run(tmp_path, capsys, [node("n1")], [bad, pod_doc("good", GPU)])
    assert pods["bad"]["status"] == "pending" and needle in pods["bad"]["reasons"]["*"]
    assert pods["good"]["status"] == "scheduled"


def test_a_malformed_allocation_is_a_warning_and_cordons_its_vendor_on_its_node(tmp_path, capsys):
    """As the scheduler's cache (hami.core.grants): the running pod uses GPUs nobody can name, so the
    node's NVIDIA devices take no new pod while it runs (it held nothing and freed them: review, 1 Dec)."""
    odd = placed("odd", "n1", "GPU-n1-0")
    odd["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = "GPU-n1-0,NVIDIA,abc:;"
    whole = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 16000, "nvidia.com/gpucores": 100}
    nodes = [node("n1"), node("n2")]
    pods, data, err = run(tmp_path, capsys, nodes, [odd, pod_doc("fine", whole), pod_doc("more", whole)])
    assert "p.yaml: " in err and "pod default/odd: annotation hami.io/vgpu-devices-allocated" in err
    assert "'GPU-n1-0,NVIDIA,abc'" in err and "the NVIDIA devices of node n1, which it runs on" in err
    assert "counted as holding nothing" not in err
    assert (pods["odd"]["status"], pods["odd"]["node"]) == ("pre-placed", "n1")
    assert (pods["fine"]["status"], pods["fine"]["node"]) == ("scheduled", "n2")
    assert pods["more"]["status"] == "pending" and "CardCordoned" in pods["more"]["reasons"]["n1"]
    assert [(d["node"], d["used"], d["cordoned"]) for d in data["devices"]] == [("n1", 0, True), ("n2", 1, False)]


def test_a_malformed_allocation_holds_nothing_on_the_dra_front_end(tmp_path, capsys):
    odd = placed("odd", "n1", "GPU-n1-0")
    odd["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = "GPU-n1-0,NVIDIA,abc:;"
    whole = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 16000, "nvidia.com/gpucores": 100}
    pods, data, err = run(tmp_path, capsys, [node("n1")], [odd, pod_doc("fine", whole)], "--front-end", "dra")
    assert "p.yaml: " in err and "pod default/odd: annotation hami.io/vgpu-devices-allocated" in err
    assert "'GPU-n1-0,NVIDIA,abc'" in err and "no extender grant, readable or not, counts on the GPUs" in err
    assert (pods["odd"]["status"], pods["odd"]["node"]) == ("pre-placed", "n1")
    assert pods["fine"]["status"] == "scheduled"
    assert [(d["used"], d["usedmem"]) for d in data["devices"]] == [(1, 16000)]


def test_a_malformed_allocation_on_an_unbound_pod_is_scheduled_afresh(tmp_path, capsys):
    odd = pod_doc(
        "odd", GPU, annotations={"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,abc,0:;"}
    )
    pods, _, err = run(tmp_path, capsys, [node("n1")], [odd])
    assert "counted as holding nothing" in err and pods["odd"]["status"] == "scheduled"


def test_what_the_api_server_refuses_still_stops_the_run(tmp_path, capsys):
    bad = pod_doc("bad", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "abc"})
    code, out, err = sim(
        capsys, "--nodes", write(tmp_path, "n.yaml", [node("n1")]), "--pods", write(tmp_path, "p.yaml", [bad])
    )
    assert code == 1 and out == "" and "'abc' is not a quantity" in err


# ---------------------------------------------------------------- 8. allocations no scheduler could have written


def test_impossible_allocations_are_warned_and_counted_as_written(tmp_path, capsys):
    docs = [
        placed("ghost-node", "node-zzz", "GPU-z0", mem=1000),
        placed("ghost-gpu", "n1", "GPU-nope", mem=1000),
        placed("overcommit", "n1", "GPU-n1-0", mem=99999),
        placed("cores-a", "n1", "GPU-n1-1", mem=100, cores=70),
        placed("cores-b", "n1", "GPU-n1-1", mem=100, cores=70),
    ]
    pods, data, err = run(tmp_path, capsys, [node("n1", n=2)], docs)
    lines = [line for line in err.splitlines() if "warning" in line]
    assert len(lines) == 4, err
    assert (
        "p.yaml: document 1 (Pod default/ghost-node): hami.io/vgpu-node is node-zzz, which is not a usable node"
        in lines[0]
    )
    assert "document 2 (Pod default/ghost-gpu): its grant names GPU-nope, which node n1 does not register" in lines[1]
    assert "document 3 (Pod default/overcommit): GPU-n1-0 on node n1 is over its capacity" in lines[2]
    assert "memory 99999/16000 MiB" in lines[2]
    assert "document 5 (Pod default/cores-b): GPU-n1-1" in lines[3] and "cores 140/100" in lines[3]
    assert all(p["status"] == "pre-placed" for p in pods.values())
    assert held(data) == {"GPU-n1-0": (1, 99999, 0), "GPU-n1-1": (2, 200, 140)}


def test_a_sound_dump_gives_no_warning():
    docs = [placed("a", "n1", "GPU-n1-0", mem=8000), placed("b", "n1", "GPU-n1-0", mem=8000)]
    result = simulate([node("n1")], docs, CFG)
    assert result.warnings == [] and [p.status for p in result.pods] == ["pre-placed", "pre-placed"]


def test_a_node_with_malformed_taints_is_refused_by_field():
    bad = node("n1")
    bad["spec"] = {"taints": {"key": "x"}}
    with pytest.raises(SimulationError, match=r"nodes: document 1 \(Node n1\): spec.taints: must be a list"):
        simulate([bad], [], CFG)
