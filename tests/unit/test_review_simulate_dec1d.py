"""``hami simulate`` against what a cluster does (found by review, 1 Dec): pods sharing a uid,
a running pod's unreadable grant, the webhook's namespace quota at admission on both front ends,
kube-scheduler's NodeResourcesFit (cpu, memory, pods), a report that cannot be written, and
control characters from a node's registration on the terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from hami.config import load_device_config
from hami.core import DeviceInfo, SchedulerConfig, admit_pod, encode_node_devices_json, schedule_pod
from hami.scheduler.state import ClusterState
from hami.sim.dra import simulate_dra
from hami.sim.engine import SimulationError, simulate
from hami.vendors import build_vendors
from hami.webhook.admission import AdmissionSettings, decide

from .test_simulate import node_doc, pod_doc, sim, write
from .test_simulate_dump import node, placed, run

CFG = SchedulerConfig(build_vendors(), "binpack", "spread")
GPU8 = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000}


def by_name(result):
    return {p.name: p for p in result.pods}


def with_uid(pod, uid):
    pod["metadata"]["uid"] = uid
    return pod


# ---------------------------------------------------------------- 1. pods sharing metadata.uid


def test_a_copy_of_a_running_pod_keeping_its_uid_does_not_land_on_its_gpu():
    """Found by review, 1 Dec: a running pod copied with kubectl get -o yaml and renamed (uid kept)
    asking 8000 MiB landed on the original's 10000 MiB GPU (16000/10000): scheduling it first
    removed the original's grant from the ledger, by uid."""
    running = placed("running", "n1", "GPU-n1-0", mem=8000, uid="11111111-2222-3333-4444-555555555555")
    copy = with_uid(pod_doc("copy", GPU8, ns="default"), "11111111-2222-3333-4444-555555555555")
    for front in (simulate, simulate_dra):
        r = front([node("n1", mem=10000)], [running, copy], CFG)
        pods = by_name(r)
        assert pods["running"].status == "pre-placed"
        if front is simulate:  # (the DRA path does not count an extender grant on the GPUs)
            assert pods["copy"].status == "pending"
            assert [(d["used"], d["usedmem"]) for d in r.devices] == [(1, 8000)]


@pytest.mark.parametrize("front", [simulate, simulate_dra])
def test_new_pods_sharing_a_uid_are_two_pods(front):
    """Found by review, 1 Dec: two new pods with one uid were one pod to the ledger: the second
    took the first one's grant away (the GPU held one 8000 MiB share for two scheduled pods)."""
    a = with_uid(pod_doc("a", GPU8), "same")
    b = with_uid(pod_doc("b", GPU8), "same")
    r = front([node("n1", mem=10000), node("n2", mem=10000)], [a, b], CFG)
    pods = by_name(r)
    assert pods["a"].status == pods["b"].status == "scheduled"
    assert pods["a"].node != pods["b"].node
    assert sorted(d["usedmem"] for d in r.devices) == [8000, 8000]


def test_a_deleted_pod_sharing_a_uid_frees_its_own_share_on_the_dra_front_end():
    """Found by review, 1 Dec: deleting a released the claims of b (same uid, placed after it), so
    a's 6000 MiB stayed held and c, which fits once a is gone, read pending."""
    a = with_uid(pod_doc("a", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 6000}), "same")
    b = with_uid(pod_doc("b", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}), "same")
    gone = with_uid(pod_doc("a", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 6000}, deleted=True), "same")
    c = pod_doc("c", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 7000})
    r = simulate_dra([node("n1", mem=10000)], [a, b, gone, c], CFG)
    pods = by_name(r)
    assert (pods["a"].status, pods["b"].status, pods["c"].status) == ("deleted", "scheduled", "scheduled")
    assert [(d["used"], d["usedmem"]) for d in r.devices] == [(2, 10000)]


@pytest.mark.parametrize("front", [simulate, simulate_dra])
def test_two_running_pods_sharing_a_uid_stop_the_run_naming_both(front):
    """Found by review, 1 Dec: two pre-placed pods with one uid counted once (6000 + 3000 MiB read
    as 3000). No cluster holds two live pods of one uid: the file is refused, naming both."""
    r1 = placed("r1", "n1", "GPU-n1-0", mem=6000, uid="u-1")
    r2 = placed("r2", "n1", "GPU-n1-0", mem=3000, uid="u-1")
    with pytest.raises(SimulationError) as err:
        front([node("n1", mem=10000)], [r1, r2], CFG, sources=("n.yaml", "p.yaml"))
    text = str(err.value)
    assert text.startswith("p.yaml: document 2 (Pod default/r2): metadata.uid 'u-1' is also that of ")
    assert "Pod default/r1 (document 1)" in text and "remove metadata.uid" in text


def test_a_running_pod_given_again_after_its_deletion_may_keep_its_uid():
    old = placed("r1", "n1", "GPU-n1-0", mem=6000, uid="u-1")
    gone = placed("r1", "n1", "GPU-n1-0", mem=6000, uid="u-1", deletionTimestamp="2026-11-29T10:00:00Z")
    again = placed("r1", "n1", "GPU-n1-0", mem=6000, uid="u-1")
    r = simulate([node("n1", mem=10000)], [old, gone, again], CFG)
    assert [(d["used"], d["usedmem"]) for d in r.devices] == [(1, 6000)]


# ---------------------------------------------------------------- 2. an unreadable grant


MIXED = SchedulerConfig(
    build_vendors(
        load_device_config(
            open(
                os.path.join(
                    os.path.dirname(__file__), "..", "..", "src", "hami", "sim", "examples", "mixed-device-config.yaml"
                )
            ).read(),
            "mixed",
        )
    ),
    "binpack",
    "spread",
)


def mixed_node():
    nvidia = [
        DeviceInfo(
            id="GPU-n1-0",
            index=0,
            count=10,
            devmem=10000,
            devcore=100,
            type="NVIDIA-A10",
            mode="hami-core",
            health=True,
        )
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "n1",
            "annotations": {
                "hami.io/node-nvidia-register": encode_node_devices_json(nvidia),
                "hami.io/node-handshake": "Requesting_" + time.strftime("%Y-%m-%d %H:%M:%S"),
                "hami.io/node-dcu-register": "DCU-n1-0,4,65520,100,DCU-K100_AI,0,true,0,hami-core:",
                "hami.io/node-handshake-dcu": "Requesting_" + time.strftime("%Y-%m-%d %H:%M:%S"),
            },
        },
    }


def mixed_running():
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "running",
            "namespace": "t",
            "uid": "u-running",
            "annotations": {
                "hami.io/vgpu-node": "n1",
                "hami.io/vgpu-devices-allocated": "GPU-n1-0,NVIDIA,8000,0:;",
                "hami.io/dcu-devices-allocated": "DCU-n1-0,DCU,notanumber,0:;",
            },
        },
        "spec": {
            "nodeName": "n1",
            "containers": [
                {
                    "name": "c",
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": 1,
                            "nvidia.com/gpumem": 8000,
                            "hygon.com/dcunum": 1,
                            "hygon.com/dcumem": 1000,
                        }
                    },
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def test_an_unreadable_grant_keeps_the_readable_ones_and_cordons_its_vendor_as_the_scheduler_does():
    """Found by review, 1 Dec: a running pod with an unreadable grant of one vendor was counted as
    holding nothing (its readable NVIDIA grant freed, its DCU freed), 'as the scheduler counts it';
    the scheduler (commit cbd41f8) keeps the readable grants and cordons the unreadable vendor's
    devices on the pod's node."""
    new_gpu = pod_doc("new-gpu", GPU8, ns="t")
    new_dcu = pod_doc("new-dcu", {"hygon.com/dcunum": 1, "hygon.com/dcumem": 1000}, ns="t")
    r = simulate([mixed_node()], [mixed_running(), new_gpu, new_dcu], MIXED)
    warnings = r.warnings
    pods = by_name(r)
    assert pods["running"].status == "pre-placed"
    assert pods["new-gpu"].status == "pending" and pods["new-gpu"].reasons == {"n1": "1/1 CardInsufficientMemory"}
    assert pods["new-dcu"].status == "pending" and "CardCordoned" in pods["new-dcu"].reasons["n1"]
    rows = {d["uuid"]: d for d in r.devices}
    assert (rows["GPU-n1-0"]["usedmem"], rows["GPU-n1-0"]["cordoned"]) == (8000, False)
    assert (rows["DCU-n1-0"]["used"], rows["DCU-n1-0"]["cordoned"]) == (0, True)
    (line,) = [w for w in warnings if "notanumber" in w]
    assert "its readable grants count, and the DCU devices of node n1, which it runs on, take no new pod" in line
    assert "holding nothing" not in line

    # the scheduler's cache, fed the same objects, reads it the same way
    state = ClusterState(MIXED)
    state._apply_node("ADDED", mixed_node())
    state.apply_pod("ADDED", mixed_running())
    assert state.ledger.node("n1").cordoned == frozenset({"DCU-n1-0"})
    usage = {d.id: usedmem for d, _, usedmem, _ in state.ledger.device_usage("n1")}
    assert usage == {d["uuid"]: d["usedmem"] for d in r.devices}
    for p in (new_gpu, new_dcu):
        admitted, _ = admit_pod({**p, "metadata": {**p["metadata"], "uid": p["metadata"]["name"]}}, MIXED.vendors)
        real = schedule_pod(admitted, ["n1"], state.ledger, MIXED, time.time())
        assert real.node is None and real.reasons() == pods[p["metadata"]["name"]].reasons


def test_the_cordon_of_an_unreadable_grant_ends_with_its_pod():
    odd = placed("odd", "n1", "GPU-n1-0")
    odd["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = "GPU-n1-0,NVIDIA,abc:;"
    gone = placed("odd", "n1", "GPU-n1-0", deletionTimestamp="2026-11-29T10:00:00Z")
    # while odd runs, its node's NVIDIA devices take no new pod
    running = by_name(simulate([node("n1")], [odd, pod_doc("before", GPU8)], CFG))
    assert running["before"].status == "pending" and "CardCordoned" in running["before"].reasons["n1"]
    # its deletion ends the cordon: "before", pending until then, is placed on kube-scheduler's
    # retry (since 1 Dec: it kept its CardCordoned next to an uncordoned GPU; review), and "after" too
    pods = by_name(simulate([node("n1")], [odd, pod_doc("before", GPU8), gone, pod_doc("after", GPU8)], CFG))
    assert pods["before"].status == "scheduled" and "deleted default/odd" in pods["before"].note
    assert pods["after"].status == "scheduled" and not pods["after"].note


# ---------------------------------------------------------------- 3. the namespace quota at admission

QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "q", "namespace": "team"},
    "spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}},
}


@pytest.mark.parametrize("front_end", ["extender", "dra"])
def test_a_pod_over_its_namespace_quota_is_denied_with_the_webhooks_words(tmp_path, capsys, front_end):
    """Found by review, 1 Dec: simulate called the webhook's decide() without the quota room, so a
    pod the webhook denies ('exceeding resource quota ...') read pending (extender) or scheduled
    (DRA, where the ResourceQuota was ignored with a stale warning)."""
    big = pod_doc("big", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}, ns="team")
    pods, _, err = run(tmp_path, capsys, [node("n1")], [QUOTA, big], "--front-end", front_end)
    state = ClusterState(CFG)
    state._apply_quota("ADDED", QUOTA)
    settings = AdmissionSettings(CFG.vendors, scheduler_name="hami-scheduler", front_end=front_end)
    real = decide(big, settings, quota_room=state.pod_room)
    assert not real.allowed
    assert pods["big"]["status"] == "denied" and pods["big"]["reasons"] == {"webhook": real.message}
    assert "exceeding resource quota: nvidia.com/gpumem requests 2000, namespace team has 1000 left" in real.message
    assert "ignored" not in err


def test_on_the_dra_front_end_the_quota_counts_the_claims_simulated_so_far():
    """Found by review, 1 Dec (docs/dra.md, Seeing and accounting DRA allocations): claims count
    against their namespace's quota, and a deleted pod's claims give their room back."""
    quota = {**QUOTA, "spec": {"hard": {"limits.nvidia.com/gpumem": "10000"}}}
    six = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 6000}
    docs = [
        quota,
        pod_doc("a", six, ns="team"),
        pod_doc("b", six, ns="team"),
        pod_doc("a", six, ns="team", deleted=True),
        pod_doc("c", six, ns="team"),
        pod_doc("other", six, ns="elsewhere"),
    ]
    pods = by_name(simulate_dra([node("n1", n=4)], docs, CFG))
    assert pods["b"].status == "denied"
    assert pods["b"].reasons == {
        "webhook": "exceeding resource quota: nvidia.com/gpumem requests 6000, namespace team has 4000 left"
    }
    assert (pods["a"].status, pods["c"].status, pods["other"].status) == ("deleted", "scheduled", "scheduled")


def test_on_the_dra_front_end_a_tenants_own_template_makes_a_claim_the_quota_refuses():
    """A pod naming a template of its own asks for no extended resource: its claim is checked when
    kube-controller-manager makes it (decide_claim), and the pod waits."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "big", "namespace": "team"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": "gpu.hami.io", "capacity": {"requests": {"memory": "4Gi"}}},
                        }
                    ]
                }
            }
        },
    }
    user = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "tenant", "namespace": "team"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "big"}],
            "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    pods = by_name(simulate_dra([node("n1")], [QUOTA, template, user], CFG))
    assert pods["tenant"].status == "pending"
    (why,) = pods["tenant"].reasons.values()
    assert why.startswith("creating its claim team/tenant-gpu failed: the webhook refused it: ResourceClaim team/")
    assert "exceeding resource quota: nvidia.com/gpumem requests 4096, namespace team has 1000 left" in why


# ---------------------------------------------------------------- 4. kube-scheduler's NodeResourcesFit


def cpu_node(name, cpu="8", memory="32Gi", pods="110"):
    out = node(name, mem=10000)
    allocatable = {k: v for k, v in (("cpu", cpu), ("memory", memory), ("pods", pods)) if v is not None}
    out["status"] = {"allocatable": {**allocatable, "nvidia.com/gpu": "10"}}
    return out


def asking(name, cpu=None, memory=None, init=None, sidecar=None, node_name=None, limits_only=False):
    p = pod_doc(name, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
    res = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    c = p["spec"]["containers"][0]["resources"]
    if limits_only:
        c["limits"].update(res)
    else:
        c["requests"] = res
    inits = []
    if sidecar:
        inits.append({"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": sidecar}}})
    if init:
        inits.append({"name": "init", "resources": {"requests": {"cpu": init}}})
    if inits:
        p["spec"]["initContainers"] = inits
    if node_name:
        p["spec"]["nodeName"] = node_name
        p["status"] = {"phase": "Running"}
    return p


@pytest.mark.parametrize("front", [simulate, simulate_dra])
def test_a_pod_asking_more_cpu_or_memory_than_the_node_has_is_pending(front):
    """Found by review, 1 Dec: a node with allocatable cpu 8 / memory 32Gi took a GPU pod
    requesting cpu 64 and memory 1Ti (kube-scheduler's NodeResourcesFit refuses it)."""
    pods = by_name(front([cpu_node("n1")], [asking("big", cpu="64", memory="1Ti")], CFG))
    assert pods["big"].status == "pending"
    why = pods["big"].reasons["n1"]
    assert why.startswith("Insufficient cpu (the pod requests 64; the node has 8 allocatable, 0 requested by its pods)")
    assert "Insufficient memory (the pod requests 1Ti; the node has 32Gi allocatable" in why


@pytest.mark.parametrize("front", [simulate, simulate_dra])
def test_cpu_is_counted_for_pods_bound_to_the_node_wherever_the_file_lists_them(front):
    new = asking("a-new", cpu="4")
    running = pod_doc("z-running")  # a CPU pod bound to the node, listed after (a dump is sorted by name)
    running["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "6"}}
    running["spec"]["nodeName"], running["status"] = "n1", {"phase": "Running"}
    pods = by_name(front([cpu_node("n1"), cpu_node("n2")], [new, running, asking("fits", cpu="2")], CFG))
    assert (pods["a-new"].status, pods["a-new"].node) == ("scheduled", "n2")
    assert pods["fits"].status == "scheduled"
    pods = by_name(front([cpu_node("n1")], [new, running], CFG))
    assert pods["a-new"].status == "pending" and pods["a-new"].reasons["n1"].startswith(
        "Insufficient cpu (the pod requests 4; the node has 8 allocatable, 6 requested by its pods)"
    )


def test_init_containers_sidecars_limits_and_the_pod_count_add_up_as_in_kubernetes():
    bound = asking("bound", cpu="3", node_name="n1")
    cases = {
        "init-over": (asking("x", cpu="1", init="6"), "pending"),  # max(1, 6) = 6 > 5 left
        "init-fits": (asking("x", cpu="1", init="5"), "scheduled"),  # max(1, 5) = 5
        "sidecar-over": (asking("x", cpu="3", sidecar="2500m"), "pending"),  # 3 + 2.5 = 5.5
        "limit-only": (asking("x", cpu="6", limits_only=True), "pending"),  # the request defaults to the limit
    }
    for what, (pod, status) in cases.items():
        pods = by_name(simulate([cpu_node("n1")], [bound, pod], CFG))
        assert pods["x"].status == status, (what, pods["x"].reasons)
    pods = by_name(simulate([cpu_node("n1", pods="1")], [bound, asking("x")], CFG))
    assert pods["x"].reasons == {"n1": "Too many pods (1 of 1 allocatable on the node)"}


def test_a_node_without_allocatable_is_not_checked_and_a_bad_one_is_named():
    pods = by_name(simulate([node("n1")], [asking("big", cpu="64", memory="1Ti")], CFG))
    assert pods["big"].status == "scheduled"
    with pytest.raises(SimulationError, match=r"status\.allocatable\.cpu: 'lots' is not a quantity"):
        simulate([cpu_node("n1", cpu="lots")], [asking("x")], CFG, sources=("n.yaml", "p.yaml"))
    with pytest.raises(SimulationError, match=r"spec\.containers\[0\]\.resources\.requests\.cpu"):
        simulate([cpu_node("n1")], [asking("x", cpu="many")], CFG, sources=("n.yaml", "p.yaml"))


# ---------------------------------------------------------------- 5. output that cannot be written


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_to_a_full_device_is_one_line_and_status_1():
    """Found by review, 1 Dec: `hami simulate -o json > /dev/full` ended in a traceback."""
    for output in ("json", "table"):
        with open("/dev/full", "w") as full:
            done = subprocess.run(
                [sys.executable, "-m", "hami", "simulate", "-o", output],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=120,
            )
        assert done.returncode == 1
        assert done.stderr.strip().splitlines() == ["hami simulate: cannot write output (No space left on device)"]


def test_a_closed_standard_output_is_one_line_and_status_1(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)
    code = __import__("hami.cli", fromlist=["main"]).main(["simulate"])
    assert code == 1
    assert capsys.readouterr().err == "hami simulate: cannot write output (standard output is closed)\n"


# ---------------------------------------------------------------- 6. control characters on the terminal


def test_control_and_bidi_characters_from_a_nodes_registration_are_escaped_in_the_table(tmp_path, capsys):
    """Found by review, 1 Dec: a device type like '\\u202eevil\\x1b[31m' reached the terminal raw."""
    evil = "NVIDIA\u202e\x1b[31m"
    devs = [
        DeviceInfo(
            id="GPU-e\x07-0", index=0, count=10, devmem=16000, devcore=100, type=evil, mode="hami-core", health=True
        )
    ]
    bad = node_doc("n\x1b]0;pwned\x07", annotation=encode_node_devices_json(devs))
    broken = node_doc("b\x1b[2J", annotation="not json")
    pods = [pod_doc("p", {"nvidia.com/gpu": 1})]
    code, out, err = sim(
        capsys, "--nodes", write(tmp_path, "n.yaml", [bad, broken]), "--pods", write(tmp_path, "p.yaml", pods)
    )
    assert code == 0, err
    for text in (out, err):
        assert not any(ch in text for ch in "\x1b\x07\u202e"), text
    assert "NVIDIA\\u202e\\x1b[31m" in out and "n\\x1b]0;pwned\\x07" in out and "GPU-e\\x07-0" in out
    assert "b\\x1b[2J" in err
    json_out = sim(
        capsys, "--nodes", write(tmp_path, "n.yaml", [bad]), "--pods", write(tmp_path, "p.yaml", pods), "-o", "json"
    )[1]
    assert json.loads(json_out)["devices"][0]["type"] == evil  # JSON carries the value, escaped by JSON


# ---------------------------------------------------------------- 7. second review (1 Dec)

TEAM_QUOTA = {**QUOTA, "spec": {"hard": {"limits.nvidia.com/gpumem": "10000"}}}
ASK_4000 = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}


def team_running(name="z-old", **extra):
    """A running pod of namespace team holding 8000 MiB through the extender."""
    p = placed(name, "n1", "GPU-n1-0", mem=8000, uid=f"u-{name}", **extra)
    p["metadata"]["namespace"] = "team"
    return p


def webhooks_word(new, *running):
    """What the webhook answers ``new`` with, its quota room from the scheduler's own ledger."""
    state = ClusterState(CFG)
    state._apply_quota("ADDED", TEAM_QUOTA)
    for p in running:
        state.apply_pod("ADDED", p)
    settings = AdmissionSettings(CFG.vendors, scheduler_name="hami-scheduler", front_end="dra")
    return decide(new, settings, quota_room=state.pod_room)


@pytest.mark.parametrize("front", [simulate, simulate_dra])
@pytest.mark.parametrize("terminating", [False, True])
def test_an_extender_grant_counts_in_the_quota_wherever_the_file_lists_it(front, terminating):
    """Found by review, 1 Dec (second pass): on the DRA front end an extender grant counted in its
    namespace's quota only once the file reached its pod, and a terminating one never: quota 10000,
    running z-old holding 8000 listed after a-new asking 4000 (a dump is sorted by name): the DRA
    front end scheduled a-new; the extender front end and the webhook deny it (2000 left)."""
    extra = {"deletionTimestamp": "2026-11-30T10:00:00Z"} if terminating else {}
    old = team_running(**extra)
    new = pod_doc("a-new", ASK_4000, ns="team")
    real = webhooks_word(new, old)
    assert not real.allowed and "namespace team has 2000 left" in real.message
    for docs in ([TEAM_QUOTA, new, old], [TEAM_QUOTA, old, new]):
        pods = by_name(front([node("n1", mem=81920)], docs, CFG))
        assert pods["a-new"].status == "denied", (docs, pods["a-new"])
        assert pods["a-new"].reasons == {"webhook": real.message}
        assert pods["z-old"].status == ("terminating" if terminating else "pre-placed")


@pytest.mark.parametrize("front", [simulate, simulate_dra])
def test_a_deleted_extender_pod_gives_its_quota_back_once(front):
    """The grant counted from the start leaves the quota when the file deletes its pod (terminating
    or running), and a pod given again after its deletion counts again, once."""
    for extra in ({}, {"deletionTimestamp": "2026-11-30T10:00:00Z"}):
        old = team_running(**extra)
        gone = team_running(deletionTimestamp="2026-11-30T10:00:00Z")
        docs = [TEAM_QUOTA, pod_doc("a-new", ASK_4000, ns="team"), old, gone, pod_doc("b-new", ASK_4000, ns="team")]
        pods = by_name(front([node("n1", mem=81920)], docs, CFG))
        assert (pods["a-new"].status, pods["z-old"].status, pods["b-new"].status) == ("denied", "deleted", "scheduled")
        two, one = ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": m} for m in (2000, 1000))
        again = [TEAM_QUOTA, old, gone, team_running(), pod_doc("c-new", two, ns="team"), pod_doc("d", one, ns="team")]
        pods = by_name(front([node("n1", mem=81920)], again, CFG))
        assert (pods["z-old"].status, pods["c-new"].status) == ("pre-placed", "scheduled")
        assert pods["d"].reasons == {
            "webhook": "exceeding resource quota: nvidia.com/gpumem requests 1000, namespace team has 0 left"
        }


def test_the_dra_warning_says_an_extender_grant_counts_in_the_quota_not_on_the_gpus():
    r = simulate_dra([node("n1", mem=81920)], [TEAM_QUOTA, team_running(), team_running("y-old")], CFG)
    (line,) = [w for w in r.warnings if "extender allocation" in w]
    assert line == (
        "2 pods hold an extender allocation (team/z-old on n1, team/y-old on n1): the DRA path does not count "
        "them on the GPUs, only in their namespaces' quotas (docs/dra.md, Migrating from the extender)"
    )


def test_a_yaml_float_quantity_is_read_from_its_text():
    """Found by review, 1 Dec (second pass): a YAML/JSON float was read as the binary fraction
    nearest it (Fraction(0.1) is a little over 1/10), so cpu: 0.1 was 101m; Kubernetes parses the
    number's text, and 0.1 is 100m (as "100m" is)."""
    from fractions import Fraction

    from hami.core.quantity import QuantityError, parse_int_quantity, parse_quantity

    for value, text in ((0.1, "0.1"), (0.2, "0.2"), (0.4, "0.4"), (0.8, "0.8"), (0.9, "0.9"), (1.1, "1.1")):
        assert parse_quantity(value, "cpu") == parse_quantity(text, "cpu") == Fraction(text)
    assert parse_quantity(-0.5, "x") == Fraction(-1, 2) and parse_quantity(1e-7, "x") == Fraction(1, 10**7)
    # whole numbers keep their exact value, ints and whole floats alike
    for value in (0, 7, 3000, 2**62, -(2**63), 3000.0, 1e18, 2.0**62):
        assert parse_quantity(value, "x") == int(value)
    assert parse_int_quantity(3000.0, "x") == 3000 and parse_int_quantity(2**63 - 1, "x") == 2**63 - 1
    with pytest.raises(QuantityError, match=r"x: must be a whole number, got 0\.5"):
        parse_int_quantity(0.5, "x")
    for bad in ("inf", "-inf", "nan"):  # refused as before, naming the field and the value
        with pytest.raises(QuantityError, match=f"^limits.cpu: must be a finite quantity, got {bad}$"):
            parse_quantity(float(bad), "limits.cpu")
    with pytest.raises(QuantityError, match=r"x: 9\.3e\+18 is out of range"):
        parse_quantity(9.3e18, "x")


@pytest.mark.parametrize("front", [simulate, simulate_dra])
def test_ten_pods_of_cpu_0_1_fit_a_one_cpu_node(front):
    """Found by review, 1 Dec (second pass): the tenth pod of cpu: 0.1 on a 1-CPU node was pending,
    'Insufficient cpu (the pod requests 101m ...)'."""
    pods = [asking(f"p{i}", cpu=0.1) for i in range(10)] + [asking("extra", cpu=0.1)]
    out = by_name(front([cpu_node("n1", cpu="1")], pods, CFG))
    assert [out[f"p{i}"].status for i in range(10)] == ["scheduled"] * 10
    assert out["extra"].status == "pending"
    assert (
        out["extra"]
        .reasons["n1"]
        .startswith("Insufficient cpu (the pod requests 100m; the node has 1 allocatable, 1 requested by its pods)")
    )


def dumped_pending(name, **fields):
    """A pending pod as kubectl get pods -o yaml writes it (creationTimestamp and status)."""
    p = pod_doc(name, ASK_4000, ns="team")
    p["metadata"]["uid"] = f"u-{name}"
    p["spec"]["schedulerName"] = "hami-scheduler"
    p["metadata"].update(fields.get("metadata", {"creationTimestamp": "2026-11-30T09:00:00Z"}))
    if fields.get("status", True):
        p["status"] = {"phase": "Pending"}
    return p


@pytest.mark.parametrize("which", ["both", "status", "creationTimestamp"])
def test_a_dumped_pending_pod_over_its_quota_waits_at_filter_not_denied(which):
    """Found by review, 1 Dec (second pass): simulate ran the webhook's quota check again on pods a
    dump gives as existing (status, creationTimestamp), reading them 'denied by the webhook' where
    the cluster has them Pending with Filter's ResourceQuotaNotFit. The admission quota is for pods
    the file creates; a manifest over its quota is still denied."""
    pending = dumped_pending(
        "a-pending",
        metadata={} if which == "status" else {"creationTimestamp": "2026-11-30T09:00:00Z"},
        status=which != "creationTimestamp",
    )
    manifest = pod_doc("b-new", ASK_4000, ns="team")
    docs = [TEAM_QUOTA, pending, manifest, team_running()]
    pods = by_name(simulate([node("n1", mem=81920)], docs, CFG))
    assert pods["a-pending"].status == "pending"
    assert pods["a-pending"].reasons == {"n1": "1/1 ResourceQuotaNotFit"}
    assert pods["b-new"].status == "denied" and "namespace team has 2000 left" in pods["b-new"].reasons["webhook"]
    # the scheduler's own Filter, on its own ledger, says the same of the dumped pod
    state = ClusterState(CFG)
    state._apply_node("ADDED", node("n1", mem=81920))
    state._apply_quota("ADDED", TEAM_QUOTA)
    state.apply_pod("ADDED", team_running())
    admitted, _ = admit_pod(pending, CFG.vendors)
    real = schedule_pod(admitted, ["n1"], state.ledger, CFG, time.time())
    assert real.node is None and real.reasons() == pods["a-pending"].reasons

    # the DRA front end: admitted; the claim made from its template is what the quota refuses
    pods = by_name(simulate_dra([node("n1", mem=81920)], docs, CFG))
    assert pods["a-pending"].status == "pending"
    (why,) = pods["a-pending"].reasons.values()
    assert why.startswith("creating its claim team/a-pending-")
    assert "exceeding resource quota: nvidia.com/gpumem requests 4000, namespace team has 2000 left" in why
    assert pods["b-new"].status == "denied" and "namespace team has 2000 left" in pods["b-new"].reasons["webhook"]


def test_on_the_dra_front_end_a_gpu_count_quota_counts_the_claims_simulated_so_far():
    """The DRA front end's GPU count quota (review, 1 Dec) in the simulation, as the scheduler's
    webhook applies it: requests.nvidia.com/gpu 3 in `team`: a pod of 2 GPUs fits, the next one
    of 2 is denied in the webhook's words, and a deleted pod's claim gives its GPUs back."""
    quota = {**QUOTA, "spec": {"hard": {"requests.nvidia.com/gpu": "3"}}}
    two = {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000}
    docs = [
        quota,
        pod_doc("a", two, ns="team"),
        pod_doc("b", two, ns="team"),
        pod_doc("a", two, ns="team", deleted=True),
        pod_doc("c", two, ns="team"),
    ]
    pods = by_name(simulate_dra([node("n1", n=4)], docs, CFG))
    assert pods["b"].status == "denied"
    assert pods["b"].reasons == {
        "webhook": "exceeding resource quota: nvidia.com/gpu requests 2, namespace team has 1 left"
    }
    assert (pods["a"].status, pods["c"].status) == ("deleted", "scheduled")


# ---------------------------------------------------------------- the API server's quota on extended resources


def _count_quota(ns="team", gpus="2", **extra_hard):
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": ns},
        "spec": {"hard": {"requests.nvidia.com/gpu": gpus, **extra_hard}},
    }


def test_the_api_servers_gpu_count_quota_refuses_a_pod_being_created_past_it():
    """Found by review, 1 Dec: the extender simulation left a quota's ``requests.nvidia.com/gpu``
    out (the DRA one counted it): with 2 GPUs allowed, a running 1-GPU pod and two new ones, the
    second new pod was placed where the API server refuses to create it."""
    running = placed("running", "n1", "GPU-n1-0", mem=1000)
    running["metadata"]["namespace"] = "team"
    news = [pod_doc(f"new{i}", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, ns="team") for i in (1, 2)]
    other = pod_doc("elsewhere", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, ns="other")
    r = by_name(simulate([node("n1", n=4)], [_count_quota(), running, *news, other], CFG))
    assert [r[n].status for n in ("running", "new1", "new2", "elsewhere")] == [
        "pre-placed",
        "scheduled",
        "denied",
        "scheduled",
    ]
    assert r["new2"].reasons == {
        "apiserver": "exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=2, "
        "limited: requests.nvidia.com/gpu=2"
    }


def test_the_gpu_count_quota_frees_room_when_a_pod_goes_and_counts_pending_pods():
    """The namespace uses what its live pods request, placed or not: a pending pod counts (the API
    server created it), a deleted one gives its GPUs back, a pod that asks for none is not
    refused, and a scoped quota is left out."""
    big = pod_doc("big", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 20000}, ns="team")  # fits no GPU: pending
    small = pod_doc("small", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, ns="team")
    cpu = pod_doc("cpu-only", {"cpu": "1"}, ns="team")
    gone = pod_doc("big", deleted=True, ns="team")
    again = pod_doc("again", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, ns="team")
    scoped = _count_quota(gpus="0")
    scoped["metadata"]["name"] = "scoped"
    scoped["spec"]["scopes"] = ["BestEffort"]
    docs = [_count_quota(), scoped, big, small, cpu, gone, again]
    r = by_name(simulate([node("n1", n=4)], docs, CFG))
    assert r["big"].status == "deleted"
    assert r["small"].status == "denied" and "used: requests.nvidia.com/gpu=2" in r["small"].reasons["apiserver"]
    assert r["cpu-only"].status == "no-devices"
    assert r["again"].status == "scheduled"


def test_a_quota_given_after_pods_counts_them_and_a_bound_pod_being_created_is_refused_too():
    """A quota listed after pods of its namespace counts them from its place on (the quota
    controller counts the pods there); a new pod bound by ``spec.nodeName`` is refused as well
    (the API server's quota does not look at the node)."""
    first = pod_doc("first", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, ns="team")
    pinned = pod_doc("pinned", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, ns="team")
    pinned["spec"]["nodeName"] = "n1"
    r = by_name(simulate([node("n1", n=4)], [first, _count_quota(gpus="1"), pinned], CFG))
    assert r["first"].status == "scheduled"
    assert r["pinned"].status == "denied" and r["pinned"].reasons["apiserver"].startswith("exceeded quota: gpus")


def test_an_unreadable_gpu_count_quota_names_its_field():
    with pytest.raises(SimulationError, match=r"spec\.hard\.requests\.nvidia\.com/gpu"):
        simulate([node("n1")], [_count_quota(gpus="lots")], CFG)
