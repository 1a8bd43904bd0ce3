"""The DRA front end keeps HAMi's rules where the extender keeps them (a review with reproductions,
findings A to G): the memory asked stays the limit of an exclusive share, a share asking for no
cores stays off a GPU whose cores are all taken, an init container's GPU is not held twice, what
the DRA front end ignores is said, an operator's GPU cordon holds, and quota messages speak the
quota's unit. Each test names its finding; each failed on the code before the fix."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import pytest

from hami.config import DeviceConfig, NvidiaConfig
from hami.core import DeviceInfo, SchedulerConfig, encode_node_devices_json
from hami.core.fit import QuotaRoom
from hami.dra import fit
from hami.dra.claims import claim_ask, claim_usage
from hami.dra.explain import explain_pod
from hami.dra.model import (
    CORDON_TAINT_KEY,
    DRIVER,
    IDLE_CORES,
    MIB,
    SliceSettings,
    cordon_taint,
    cordoned_gpus,
    resource_slice,
    resource_slices,
)
from hami.draplugin.command import CordonKeeper
from hami.draplugin.prepare import Options, Paths, cdi_spec, plan
from hami.draplugin.publisher import publish_slice
from hami.node.nvml import PhysicalGPU
from hami.sim.dra import DraOptions, simulate_dra
from hami.vendors import build_vendors
from hami.vendors.nvidia import NvidiaVendor
from hami.webhook.admission import AdmissionSettings, decide, decide_claim

from .test_dra_health_taints import FakeApi

CFG = SchedulerConfig(build_vendors(), "binpack", "spread")
DRA = AdmissionSettings(CFG.vendors, front_end="dra")
PATHS = Paths(hook_path="/usr/local", cdi_dir="/var/run/cdi")


def node(name="n1", devcore=100, n=1, cordon=None):
    devs = [
        DeviceInfo(
            id=f"GPU-{name}-{i}",
            index=i,
            count=10,
            devmem=16000,
            devcore=devcore,
            type="NVIDIA-T4",
            mode="hami-core",
            health=True,
        )
        for i in range(n)
    ]
    annotations = {"hami.io/node-nvidia-register": encode_node_devices_json(devs)}
    if cordon is not None:
        annotations["hami.io/device-cordon"] = cordon
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": annotations},
        "status": {"allocatable": {"nvidia.com/gpu": "10", "cpu": "64", "memory": "512Gi"}},
    }


def ctr(name, **limits):
    return {
        "name": name,
        "image": "x",
        "resources": {"limits": {f"nvidia.com/{k.replace('_', '-')}": v for k, v in limits.items()}},
    }


def pod(name, *containers, init=(), ns="default"):
    spec = {"containers": list(containers) or [ctr("c", gpu=1)]}
    if init:
        spec["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}


def simulate(nodes, pods, cfg=CFG, front_end="dra"):
    if front_end == "dra":
        r = simulate_dra(nodes, pods, cfg, DraOptions())
    else:
        from hami.sim.engine import simulate as simulate_extender

        r = simulate_extender(nodes, pods, cfg)
    return {p.name: p for p in r.pods}, r


def grants(p):
    return [(d["usedmem"], d["usedcores"]) for c in p.containers for d in c["devices"]]


def template_of(decision, entry):
    name = next(c["resourceClaimTemplateName"] for c in decision.pod["spec"]["resourceClaims"] if c["name"] == entry)
    return next(t for t in decision.templates if t["metadata"]["name"] == name)


def requests_of(template):
    [req] = template["spec"]["spec"]["devices"]["requests"]
    return (req["exactly"].get("capacity") or {}).get("requests") or {}


def allocated(template, device="gpu-0", pool="n1", consumed=None, name="c1"):
    """The claim a template makes, allocated as the simulation's allocator (kube-scheduler's) does."""
    return {
        "metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}"},
        "spec": template["spec"]["spec"],
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": pool,
                            "device": device,
                            "consumedCapacity": consumed,
                        }
                    ]
                }
            }
        },
    }


def cdi_env(claim, gpus, settings=SliceSettings()):
    spec = cdi_spec(plan(claim, "n1", gpus, settings), PATHS, Options())
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


GPU = [PhysicalGPU(0, "GPU-n1-0", "T4", 16000, "", 0)]


def consumed_for(template):
    """What kube-scheduler records for the template's request on a fresh 16000 MiB GPU."""
    [dev] = fit.devices_of([resource_slice("n1", GPU, SliceSettings())]).values()
    need = fit.wanted(dev, requests_of(template))
    return {
        "memory": f"{need['memory'] // MIB}Mi",
        "cores": fit.quantity_text(need["cores"]),
        "shares": str(need["shares"]),
    }


# ------------------------------------------------------------------------------------- A


@pytest.mark.parametrize("devcore, second", [(100, "pending"), (200, "scheduled")])
def test_a_gpucores_100_share_keeps_its_memory_limit_on_dra_as_on_the_extender(devcore, second):
    """Finding A (/tmp/review-dra/pods3.yaml): two ``gpucores: 100, gpumem: 3000`` pods. The
    extender grants 3000 MiB each, and on a GPU of 200 cores places both; DRA used to give the
    first all 16000 MiB and keep the second off even a 200-core GPU."""
    pods = [pod(n, ctr("c", gpu=1, gpumem=3000, gpucores=100)) for n in ("x", "y")]
    for front_end in ("extender", "dra"):
        got, _ = simulate([node(devcore=devcore)], pods, front_end=front_end)
        assert grants(got["x"]) == [(3000, 100)], front_end
        assert got["y"].status == second, front_end
        if second == "scheduled":
            assert grants(got["y"]) == [(3000, 100)], front_end


def test_a_bare_gpu_under_default_memory_gets_that_memory_on_dra_as_on_the_extender():
    """Finding A (/tmp/review-dra/pods4.yaml, cfg-defmem.yaml): ``nvidia.com/gpu: 1`` with
    ``defaultMemory: 4000`` is 4000 MiB (and 100 cores) on the extender; DRA gave all of it."""
    cfg = SchedulerConfig(build_vendors(DeviceConfig(nvidia=NvidiaConfig(defaultMemory=4000))), "binpack", "spread")
    got, _ = simulate([node(devcore=200)], [pod("d1"), pod("d2")], cfg)
    assert [grants(got[n]) for n in ("d1", "d2")] == [[(4000, 100)], [(4000, 100)]]


def test_the_grant_and_the_quota_carry_the_memory_of_an_exclusive_share():
    """Finding A: the claim of a ``gpucores: 100, gpumem: 3000`` pod is limited to 3000 MiB inside
    the container (CDI) and counts 3000 MiB against the namespace quota (it counted 0 before
    allocation and all 16000 after)."""
    d = decide(pod("x", ctr("c", gpu=1, gpumem=3000, gpucores=100)), DRA)
    t = template_of(d, "hami-gpu-0")
    assert claim_ask({"spec": t["spec"]["spec"]}).memory_mib == 3000
    claim = allocated(t, consumed=consumed_for(t))
    env = cdi_env(claim, GPU)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m" and env["CUDA_DEVICE_SM_LIMIT"] == "100"
    assert claim_usage(claim).totals() == (3000, 100)


# ------------------------------------------------------------------------------------- B


def test_a_share_asking_for_no_cores_stays_off_a_gpu_whose_cores_are_taken():
    """Finding B (/tmp/review-dra/pods2.yaml): two 50-core shares fill the GPU's cores; a third
    asking none is refused on the extender (``CardComputeUnitsExhausted``) and used to land on
    DRA, unthrottled."""
    pods = [
        pod("a", ctr("c", gpu=1, gpumem=1000, gpucores=50)),
        pod("b", ctr("c", gpu=1, gpumem=1000, gpucores=50)),
        pod("c", ctr("c", gpu=1, gpumem=1000)),
    ]
    for front_end in ("extender", "dra"):
        got, _ = simulate([node()], pods, front_end=front_end)
        assert [got[n].status for n in "abc"] == ["scheduled", "scheduled", "pending"], front_end
    assert "no cores left" in got["c"].reasons["n1"]


def test_nor_does_a_gpucores_100_share_join_a_gpu_holding_a_share_that_asked_for_none():
    """Finding B, the other way round (the extender's ``ExclusiveDeviceAllocateConflict``)."""
    pods = [pod("idle", ctr("c", gpu=1, gpumem=1000)), pod("excl", ctr("c", gpu=1, gpumem=1000, gpucores=100))]
    for front_end in ("extender", "dra"):
        got, _ = simulate([node()], pods, front_end=front_end)
        assert (got["idle"].status, got["excl"].status) == ("scheduled", "pending"), front_end


def test_a_share_asking_for_no_cores_consumes_a_thousandth_gets_no_limit_and_counts_none():
    """Finding B: the request names no cores and takes the device's default, a thousandth of a
    core; the container gets no core limit (0, as on the extender) and the quota counts 0 cores."""
    d = decide(pod("p", ctr("c", gpu=1, gpumem=1000)), DRA)
    t = template_of(d, "hami-gpu-0")
    assert requests_of(t) == {"memory": "1000Mi", "cores": "1m"}  # said explicitly: no agent default applies
    sl = resource_slice("n1", GPU, SliceSettings())
    assert sl["spec"]["devices"][0]["capacity"]["cores"]["requestPolicy"] == {
        "default": IDLE_CORES,
        "validRange": {"min": "0", "max": "100"},
    }
    consumed = consumed_for(t)
    assert consumed["cores"] == "1m"
    claim = allocated(t, consumed=consumed)
    assert cdi_env(claim, GPU)["CUDA_DEVICE_SM_LIMIT"] == "0"
    assert claim_usage(claim).totals() == (1000, 0)
    assert claim_ask({"spec": t["spec"]["spec"]}).cores == 0
    [r] = claim_usage(claim).results
    assert r.consumed({})["cores"] == Fraction(1, 1000)  # what the simulation adds up


def test_with_default_cores_set_an_explicit_zero_is_said_as_a_thousandth():
    """Finding B: with the webhook's ``defaultCores`` set (and so the agent's), a container asking
    ``gpucores: 0`` must not take that default: its claim names the thousandth itself."""
    vendor = NvidiaVendor(NvidiaConfig(defaultCores=20))
    s = AdmissionSettings([vendor], front_end="dra")
    d = decide(pod("p", ctr("c", gpu=1, gpumem=1000, gpucores=0)), s)
    assert requests_of(template_of(d, "hami-gpu-0")) == {"memory": "1000Mi", "cores": IDLE_CORES}
    d = decide(pod("p", ctr("c", gpu=1, gpumem=1000)), s)
    assert requests_of(template_of(d, "hami-gpu-0")) == {"memory": "1000Mi", "cores": "20"}


def test_a_fraction_of_a_core_is_taken_whole_part_in_prepare_and_counts():
    """Finding B: hand-written claims may ask fractions now that the range has no step: the grant
    and the quota take the whole part."""
    claim = allocated(
        {"spec": {"spec": {"devices": {"requests": []}}}},
        consumed={"memory": "2000Mi", "cores": "30500m", "shares": "1"},
    )
    assert cdi_env(claim, GPU)["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert claim_usage(claim).totals() == (2000, 30)


# ------------------------------------------------------------------------------------- C


def test_an_init_container_and_the_app_container_share_one_claim_sized_to_the_larger():
    """Finding C (/tmp/review-dra/pods5.yaml): init 2000 MiB / 10 cores, app 3000 MiB / 30 cores.
    They used to get a claim each, held for the pod's life (5000 MiB); the extender counts the
    larger (3000)."""
    p = pod(
        "withinit", ctr("app", gpu=1, gpumem=3000, gpucores=30), init=[ctr("warm", gpu=1, gpumem=2000, gpucores=10)]
    )
    d = decide(p, DRA)
    assert d.allowed, d.message
    assert [c["name"] for c in d.pod["spec"]["resourceClaims"]] == ["hami-gpu-0"]
    assert d.pod["spec"]["initContainers"][0]["resources"]["claims"] == [{"name": "hami-gpu-0"}]
    assert d.pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": "hami-gpu-0"}]
    assert requests_of(template_of(d, "hami-gpu-0")) == {"memory": "3000Mi", "cores": "30"}
    assert d.warnings == ()  # the app container asked the larger request: nothing given beyond it
    got, _ = simulate([node()], [p])
    assert got["withinit"].status == "scheduled"
    assert sum(m for m, _ in grants(got["withinit"])) <= 2 * 3000  # one claim, seen by both containers


def test_the_init_claim_passes_the_quota_the_pod_passed():
    """Finding C (/tmp/review-dra/initquota.py): quota 4000 MiB; the pod passed (3000), its two
    claims did not (2000, then 3000 beside it), and the pod waited forever for its second claim.
    The scheduler's own ledger counts each admitted claim, as in the cluster."""
    from hami.scheduler.state import ClusterState

    state = ClusterState(CFG)
    state.quota_handler.replace(
        [{"metadata": {"name": "q", "namespace": "team"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "4000"}}}]
    )
    p = pod(
        "p",
        ctr("app", gpu=1, gpumem=3000, gpucores=30),
        init=[ctr("warm", gpu=1, gpumem=2000, gpucores=10)],
        ns="team",
    )
    d = decide(p, DRA, quota_room=state.ledger.quota_room)
    assert d.allowed, d.message
    for i, entry in enumerate(d.pod["spec"]["resourceClaims"]):
        t = next(t for t in d.templates if t["metadata"]["name"] == entry["resourceClaimTemplateName"])
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"p-{entry['name']}-x", "namespace": "team", "uid": f"u{i}", "resourceVersion": "1"},
            "spec": t["spec"]["spec"],
        }
        verdict = decide_claim(claim, DRA, state.claim_room)
        assert verdict.allowed, verdict.message
        state.claim_handler.apply("ADDED", claim)


def test_the_pod_check_counts_what_its_claims_will_ask():
    """Finding C: requests that cross (init 2 GPUs of 1000 MiB, app 1 GPU of 3000 MiB) keep a
    claim each (one claim of the larger of each, 2 x 3000, was more than either and could fit
    nowhere: regression review), and the pod is counted as its claims will be (5000 MiB), refused
    at once, naming the amount, rather than admitted with a claim the claim check then refuses."""
    quota = lambda ns, vendors: QuotaRoom({"NVIDIA": (4000, None)})  # noqa: E731
    p = pod("p", ctr("app", gpu=1, gpumem=3000), init=[ctr("warm", gpu=2, gpumem=1000)])
    d = decide(p, DRA, quota_room=quota)
    assert not d.allowed
    assert d.message == "exceeding resource quota: nvidia.com/gpumem requests 5000, namespace default has 4000 left"
    ok = decide(p, DRA)
    assert ok.warnings == () and len(ok.pod["spec"]["resourceClaims"]) == 2
    # one that holds the other (init 1 x 1000 under app 1 x 3000) shares the app's claim: 3000
    shared = pod("q", ctr("app", gpu=1, gpumem=3000), init=[ctr("warm", gpu=1, gpumem=1000)])
    assert decide(shared, DRA, quota_room=quota).allowed


def test_the_pod_check_counts_a_gpu_without_gpumem_at_the_largest_published_size():
    """A pod asking for GPUs without gpumem gets claims without a memory amount (all of a GPU's
    memory): it is counted at the largest GPU published (it counted 0, and nothing refused its
    claims after admission). With no GPU published it is admitted; its claims are checked."""
    sized = lambda ns, vendors: QuotaRoom(  # noqa: E731
        {"NVIDIA": (100000, None)}, claim_sizes={"gpu.hami.io": 81559, "whole-gpu.hami.io": 81559}
    )
    two = pod("p", ctr("app", gpu=2))
    d = decide(two, DRA, quota_room=sized)
    assert not d.allowed
    assert d.message == "exceeding resource quota: nvidia.com/gpumem requests 163118, namespace default has 100000 left"
    assert decide(pod("q", ctr("app", gpu=1)), DRA, quota_room=sized).allowed
    assert decide(two, DRA, quota_room=lambda ns, vendors: QuotaRoom({"NVIDIA": (100000, None)})).allowed


def test_init_containers_share_one_claim_and_sidecars_keep_their_own():
    """Finding C: init containers run one at a time, so they share one claim (with the app
    container that grows least); a sidecar runs beside the app containers and keeps its own."""
    side = {**ctr("side", gpu=1, gpumem=500), "restartPolicy": "Always"}
    p = pod(
        "p",
        ctr("small", gpu=1, gpumem=1000),
        ctr("big", gpu=1, gpumem=4000),
        init=[ctr("i1", gpu=1, gpumem=3000), side, ctr("i2", gpu=1, gpumem=3500)],
    )
    d = decide(p, DRA)
    spec = d.pod["spec"]
    claims_of = {c["name"]: c["resources"]["claims"][0]["name"] for c in spec["initContainers"] + spec["containers"]}
    assert claims_of == {
        "i1": "hami-gpu-0",
        "i2": "hami-gpu-0",
        "big": "hami-gpu-0",
        "side": "hami-gpu-1",
        "small": "hami-gpu-3",
    }
    assert requests_of(template_of(d, "hami-gpu-0")) == {"memory": "4000Mi", "cores": "1m"}


def test_the_explanation_names_a_claim_whose_creation_was_refused():
    """Finding C: ``hami dra --explain`` said "not created yet" for a claim the webhook had refused;
    kube-controller-manager's FailedResourceClaimCreation event says why, and is shown."""
    p = pod("p", ctr("c", gpu=1, gpumem=3000))
    p["metadata"]["uid"] = "pod-uid"
    p["spec"]["resourceClaims"] = [{"name": "hami-gpu-0", "resourceClaimTemplateName": "hami-gpu-abc"}]
    refusal = (
        'create ResourceClaim p-hami-gpu-0-x7k2p: admission webhook "claims.vgpu.hami.io" denied the request: '
        "ResourceClaim default/p-hami-gpu-0-x7k2p: exceeding resource quota: nvidia.com/gpumem requests 3000, "
        "namespace default has 2000 left"
    )
    event = {
        "reason": "FailedResourceClaimCreation",
        "involvedObject": {"kind": "Pod", "name": "p", "uid": "pod-uid"},
        "message": f"PodResourceClaim hami-gpu-0: {refusal}",
        "lastTimestamp": "2026-11-30T10:00:00Z",
    }
    sl = resource_slice("n1", GPU, SliceSettings())
    lines = explain_pod(p, [sl], [], [event])
    assert f"claim hami-gpu-0: not created: kube-controller-manager's last attempt failed: {refusal}" in lines
    other = {**event, "involvedObject": {"kind": "Pod", "name": "p", "uid": "an-older-pod"}}
    assert any("not created yet" in line for line in explain_pod(p, [sl], [], [other]))


# ------------------------------------------------------------------------------------- D


def test_a_priority_rides_in_the_claim_on_dra():
    """Finding D (/tmp/review-dra/prio.py): ``nvidia.com/priority`` was removed without a word; then
    with a warning that it was ignored; now the claim's configuration carries it (the kubelet
    plugin sets CUDA_TASK_PRIORITY from it, tests/unit/test_dra_priority_*.py)."""
    d = decide(pod("p", ctr("c", gpu=1, gpumem=3000, gpucores=30, priority=0)), DRA)
    assert d.allowed and d.warnings == ()
    [t] = d.templates
    [entry] = t["spec"]["spec"]["devices"]["config"]
    assert entry["opaque"]["parameters"]["priority"] == 0
    extender = decide(pod("p", ctr("c", gpu=1, gpumem=3000, gpucores=30, priority=0)), AdmissionSettings(CFG.vendors))
    assert extender.warnings == ()


def test_dra_warnings_are_short_and_one_per_kind():
    """Kubernetes asks for warnings under 120 characters, may cut them at 256 and drops them past
    4 KiB in all: 30 prioritized containers made 30 warnings of 187 characters (regression review;
    a priority is carried now, so 30 isolation opt-outs stand for them)."""
    off = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    many = pod("p", *[{**ctr(f"container-with-a-long-name-{i:02d}", gpu=1, gpumem=100), "env": off} for i in range(30)])
    d = decide(many, DRA, {"hami.io/allow-disable-control": "true"})
    # was 164 characters (three names of up to 30 after a 70-character head): as many as fit
    assert d.allowed and len(d.warnings) == 1 and len(d.warnings[0]) < 120 and d.warnings[0].endswith(" +29")
    shared = pod("q", ctr("app-" + "x" * 60, gpu=1, gpumem=1000), init=[ctr("warm", gpu=1, gpumem=3000)])
    (note,) = decide(shared, DRA).warnings
    assert len(note) < 120 and "1x3000MiB/0c (asked 1x1000MiB/0c)" in note, note


@pytest.mark.parametrize(
    "env, said",
    [
        ({"name": "CUDA_DISABLE_CONTROL", "value": "true"}, "CUDA_DISABLE_CONTROL"),
        ({"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}, "GPU_CORE_UTILIZATION_POLICY=disable"),
    ],
)
def test_an_isolation_opt_out_is_said_to_be_ignored_on_dra(env, said):
    """Finding D: in a namespace that allows switching isolation off, the switch is admitted and
    then overridden by the claim's CDI spec: the webhook says so, naming the container."""
    c = {**ctr("c", gpu=1, gpumem=3000), "env": [env]}
    plain = ctr("nogpu")
    plain["env"] = [env]
    d = decide(pod("p", c, plain), DRA, {"hami.io/allow-disable-control": "true"})
    assert d.allowed
    assert d.warnings == ("hami: isolation opt-out ignored on DRA, use class whole-gpu.hami.io: c",), said


# ------------------------------------------------------------------------------------- E


def test_a_cordoned_gpu_is_published_with_a_noschedule_taint_or_left_out():
    """Finding E: ``hami.io/device-cordon`` was ignored on DRA."""
    gpus = [PhysicalGPU(i, f"GPU-{i}", "T4", 16000, "", 0) for i in range(2)]
    assert cordoned_gpus({"metadata": {"annotations": {"hami.io/device-cordon": " GPU-1, ,GPU-9"}}}) == {
        "GPU-1",
        "GPU-9",
    }
    [sl] = resource_slices("n1", gpus, SliceSettings(), cordoned=frozenset({"GPU-1"}))
    assert [d.get("taints") for d in sl["spec"]["devices"]] == [None, [cordon_taint()]]
    assert cordon_taint() == {"key": CORDON_TAINT_KEY, "effect": "NoSchedule"}
    [dropped] = resource_slices("n1", gpus, SliceSettings(), cordoned=frozenset({"GPU-1"}), device_taints=False)
    assert [d["name"] for d in dropped["spec"]["devices"]] == ["gpu-0"]


def test_the_publisher_taints_a_cordoned_gpu_and_falls_back_where_taints_are_dropped():
    gpus = [PhysicalGPU(i, f"GPU-{i}", "T4", 16000, "", 0) for i in range(2)]
    api = FakeApi()
    got = asyncio.run(publish_slice(api, "n", gpus, SliceSettings(), cordoned=frozenset({"GPU-0"})))
    assert got["spec"]["devices"][0]["taints"] == [cordon_taint()]
    uncordoned = asyncio.run(publish_slice(api, "n", gpus, SliceSettings()))
    assert "taints" not in uncordoned["spec"]["devices"][0]
    assert uncordoned["spec"]["pool"]["generation"] == 2  # a cordon is a change of the pool
    told: list[str] = []
    api = FakeApi(keep_taints=False)
    got = asyncio.run(
        publish_slice(api, "n", gpus, SliceSettings(), fell_back=told.append, cordoned=frozenset({"GPU-0"}))
    )
    assert told == ["taints"] and [d["name"] for d in got["spec"]["devices"]] == ["gpu-1"]


def test_the_agent_follows_its_nodes_cordon_annotation():
    """Finding E: the agent watches its own Node; a change of the cordon list asks for a publish,
    anything else (another node, a list that cannot be read) does not."""

    async def scenario():
        changed = asyncio.Event()
        keeper = CordonKeeper("n1", changed)

        def node_doc(name, value):
            return {"metadata": {"name": name, "annotations": {"hami.io/device-cordon": value}}}

        keeper.read(node_doc("n1", "GPU-0"))
        assert keeper.cordoned == {"GPU-0"} and changed.is_set()
        changed.clear()
        keeper.apply("MODIFIED", node_doc("n1", "GPU-0"))
        keeper.apply("MODIFIED", node_doc("n2", "GPU-1"))
        keeper.replace([])  # 403 on list: the reflector's optional resource hands an empty list
        assert keeper.cordoned == {"GPU-0"} and not changed.is_set()
        keeper.replace([node_doc("n1", "")])
        assert keeper.cordoned == frozenset() and changed.is_set()

    asyncio.run(scenario())


def test_the_simulation_keeps_claims_off_a_cordoned_gpu_and_shows_it():
    """Finding E: ``hami simulate --front-end dra`` honours the cordon as the extender's does."""
    nodes = [node(n=2, cordon="GPU-n1-0")]
    pods = [pod("p", ctr("c", gpu=1, gpumem=1000, gpucores=10))]
    for front_end in ("extender", "dra"):
        got, r = simulate(nodes, pods, front_end=front_end)
        [dev] = got["p"].containers[0]["devices"]
        assert dev["uuid"] == "GPU-n1-1", front_end
    rows = {row["uuid"]: row["cordoned"] for row in r.devices}
    assert rows == {"GPU-n1-0": True, "GPU-n1-1": False}


# ------------------------------------------------------------------------------------- G


def test_quota_messages_say_the_amounts_in_the_quotas_unit():
    """Finding G: with ``memoryFactor: 1024`` a quota of 16 and a pod asking 20 read "requests
    20480, namespace default has 16384 left" (MiB, in the resource's name)."""
    vendor = NvidiaVendor(NvidiaConfig(memoryFactor=1024))
    quota = lambda ns, vendors: QuotaRoom({"NVIDIA": (16 * 1024, None)})  # noqa: E731
    for front_end in ("extender", "dra"):
        s = AdmissionSettings([vendor], front_end=front_end)
        d = decide(pod("p", ctr("c", gpu=1, gpumem=20, gpucores=10)), s, quota_room=quota)
        assert d.message == (
            "exceeding resource quota: nvidia.com/gpumem requests 20 (20480 MiB), "
            "namespace default has 16 (16384 MiB) left"
        ), front_end
    claim = {
        "metadata": {"name": "mine", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": "gpu.hami.io", "capacity": {"requests": {"memory": "17000Mi"}}},
                    }
                ]
            }
        },
    }
    verdict = decide_claim(claim, AdmissionSettings([vendor], front_end="dra"), quota)
    assert verdict.message == (
        "ResourceClaim default/mine: exceeding resource quota: nvidia.com/gpumem requests 16.6 (17000 MiB), "
        "namespace default has 16 (16384 MiB) left"
    )


def test_admitted_pods_are_unchanged_by_the_factor_of_one():
    """Finding G: with the default factor (1 MiB a unit) the message stays as documented."""
    quota = lambda ns, vendors: QuotaRoom({"NVIDIA": (2000, None)})  # noqa: E731
    d = decide(pod("p", ctr("c", gpu=1, gpumem=3000)), AdmissionSettings(CFG.vendors), quota_room=quota)
    assert d.message == "exceeding resource quota: nvidia.com/gpumem requests 3000, namespace default has 2000 left"
