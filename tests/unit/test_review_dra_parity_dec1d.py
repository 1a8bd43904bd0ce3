"""The DRA front end gives a pod written for HAMi the extender's meaning (found by review, 1 Dec;
reproductions in /tmp/review-a9): the GPU count quota counts the claims' devices, ``gpu: 0``
leaves no NVIDIA resource behind, ``numa-bind`` aligns on the driver's own NUMA attribute, a
container's ``GPU_CORE_UTILIZATION_POLICY=force`` reaches libvgpu through its claim, and a
percentage beside ``gpumem`` is ignored rather than refused. Each test failed before the fix."""

from __future__ import annotations

import pytest

from hami.dra import gpuconfig
from hami.dra.model import CONFIG_API_VERSION, CONFIG_KIND, DRIVER, WHOLE_CLASS, SliceSettings, resource_slice
from hami.draplugin.prepare import Options, Paths, PrepareError, cdi_spec, claim_grant, plan, spec_env
from hami.node.nvml import PhysicalGPU
from hami.webhook import admission
from hami.webhook.admission import AdmissionSettings, decide, decide_claim, decide_template, review_with_templates

from .test_dra_parity import CFG, DRA, ctr, pod, requests_of, simulate, template_of

# ---------------------------------------------------------------------------------------- helpers


def quota(ns="team", used=None, **hard):
    q = {"metadata": {"name": "q", "namespace": ns}, "spec": {"hard": dict(hard)}}
    if used is not None:
        q["status"] = {"used": dict(used)}
    return q


def room_of(*quotas, held=0):
    """The GPU count room the scheduler's state gives the webhook: the namespace's ResourceQuotas
    and the devices its claims hold."""
    return lambda ns: admission.gpu_count_room(quotas, ns, "nvidia.com/gpu", held)


def claim_of(spec, ns="team", name="mine"):
    return {"metadata": {"namespace": ns, "name": name}, "spec": spec}


def exactly(count=1, cls="gpu.hami.io", **extra):
    return {"deviceClassName": cls, "count": count, **extra}


def one_request(**kw):
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly(**kw)}]}}


def policy_env(value):
    return [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": value}]


def allocated_with_config(template, device="gpu-0", consumed=None):
    """The claim a template makes, allocated as kube-scheduler allocates it: the class's
    configuration (FromClass) and the claim's own (FromClaim) copied into the allocation."""
    from hami.dra.gpuconfig import class_configs

    spec = template["spec"]["spec"]
    cls = spec["devices"]["requests"][0]["exactly"]["deviceClassName"]
    config = [*class_configs()[cls], *({"source": "FromClaim", **c} for c in spec["devices"].get("config") or ())]
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "n1",
        "device": device,
        "consumedCapacity": consumed or {"memory": "3000Mi", "cores": "30", "shares": "1"},
    }
    return {
        "metadata": {"namespace": "default", "name": "c1", "uid": "uid-c1"},
        "spec": spec,
        "status": {"allocation": {"devices": {"results": [result], "config": config}}},
    }


GPU = [PhysicalGPU(0, "GPU-n1-0", "T4", 16000, "", 0)]


def cdi_of(claim, opts=Options()):
    return cdi_spec(plan(claim, "n1", GPU, SliceSettings()), Paths(), opts)


# ------------------------------------------------------------------ 1. the GPU count quota (High)


def test_a_gpu_count_quota_refuses_a_translated_pod_asking_more_gpus():
    """Found by review, 1 Dec (quota_count.py): quota requests.nvidia.com/gpu: 1, a pod asking
    nvidia.com/gpu: 8 + gpumem 1000 was refused on the extender (the API server's quota) and
    admitted on DRA, whose pod asks for no nvidia.com/gpu any more, with a claim of count 8."""
    room = room_of(quota(**{"requests.nvidia.com/gpu": "1", "limits.nvidia.com/gpu": "1"}))
    big = pod("big", ctr("c", gpu=8, gpumem=1000), ns="team")
    d = decide(big, DRA, gpu_room=room)
    assert not d.allowed and d.code == 403
    assert d.message == "exceeding resource quota: nvidia.com/gpu requests 8, namespace team has 1 left"
    assert decide(pod("one", ctr("c", gpu=1, gpumem=1000), ns="team"), DRA, gpu_room=room).allowed
    # another namespace's quota does not apply
    assert decide(pod("big", ctr("c", gpu=8, gpumem=1000), ns="other"), DRA, gpu_room=room).allowed


def test_the_count_room_is_the_quota_less_the_apiservers_count_less_the_claims():
    """What the API server counted (pods asking nvidia.com/gpu: the extender's) and what the
    namespace's claims hold both take room; the smallest limit of several wins."""
    q = quota(used={"requests.nvidia.com/gpu": "2"}, **{"requests.nvidia.com/gpu": "4"})
    assert admission.gpu_count_room([q], "team", "nvidia.com/gpu", 0) == 2
    assert admission.gpu_count_room([q], "team", "nvidia.com/gpu", 1) == 1
    small = {**quota(**{"limits.nvidia.com/gpu": "1"}), "metadata": {"name": "small", "namespace": "team"}}
    assert admission.gpu_count_room([q, small], "team", "nvidia.com/gpu", 0) == 1
    assert admission.gpu_count_room([quota(**{"requests.cpu": "4"})], "team", "nvidia.com/gpu", 3) is None
    two = pod("two", ctr("c", gpu=2, gpumem=1000), ns="team")
    d = decide(two, DRA, gpu_room=lambda ns: admission.gpu_count_room([q], ns, "nvidia.com/gpu", 1))
    assert d.message == "exceeding resource quota: nvidia.com/gpu requests 2, namespace team has 1 left"


def test_the_pod_check_counts_its_claims_as_the_extender_counts_its_gpus():
    """An init container sharing the app container's claim counts once, as Kubernetes counts
    max(init, app) of the pod's nvidia.com/gpu; two app containers count both."""
    room = room_of(quota(**{"requests.nvidia.com/gpu": "1"}))
    shared = pod("s", ctr("app", gpu=1, gpumem=2000), init=[ctr("warm", gpu=1, gpumem=1000)], ns="team")
    assert decide(shared, DRA, gpu_room=room).allowed
    both = pod("b", ctr("a", gpu=1, gpumem=1000), ctr("b", gpu=1, gpumem=1000), ns="team")
    d = decide(both, DRA, gpu_room=room)
    assert d.message == "exceeding resource quota: nvidia.com/gpu requests 2, namespace team has 1 left"


def test_a_claim_is_checked_against_the_gpu_count_quota():
    """A claim of count 8 (written by hand, or made from the webhook's template) in a namespace
    with requests.nvidia.com/gpu: 1 is refused at its creation, in the memory quota's words."""
    room = room_of(quota(**{"requests.nvidia.com/gpu": "1"}))
    v = decide_claim(claim_of(one_request(count=8)), DRA, None, gpu_room=room)
    assert not v.allowed and v.code == 403
    assert v.message == (
        "ResourceClaim team/mine: exceeding resource quota: nvidia.com/gpu requests 8, namespace team has 1 left"
    )
    assert decide_claim(claim_of(one_request(count=1)), DRA, None, gpu_room=room).allowed
    # admin access consumes nothing, as for memory; another driver's class is not ours to count
    assert decide_claim(claim_of(one_request(count=8, adminAccess=True)), DRA, None, gpu_room=room).allowed
    assert decide_claim(claim_of(one_request(count=8, cls="nic.example.com")), DRA, None, gpu_room=room).allowed
    # a count that cannot be bounded cannot be counted
    unbounded = one_request(allocationMode="All")
    unbounded["devices"]["requests"][0]["exactly"].pop("count")
    v = decide_claim(claim_of(unbounded), DRA, None, gpu_room=room)
    assert not v.allowed and "allocationMode=All cannot be counted" in v.message and "nvidia.com/gpu" in v.message
    # the claim made from the translated pod's template is refused too
    d = decide(pod("big", ctr("c", gpu=8, gpumem=1000), ns="team"), DRA)
    made = claim_of(template_of(d, "hami-gpu-0")["spec"]["spec"], name="big-hami-gpu-0-x")
    assert not decide_claim(made, DRA, None, gpu_room=room).allowed


def test_a_claims_devices_are_its_results_once_allocated_and_its_largest_alternative_before():
    fa = {
        "devices": {
            "requests": [
                {"name": "gpu", "firstAvailable": [{"name": "big", **exactly(3)}, {"name": "small", **exactly(1)}]},
                {"name": "two", "exactly": exactly(2)},
            ]
        }
    }
    assert admission.claim_devices(claim_of(fa)) == (5, None)
    held = claim_of(fa)
    held["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu/small", "driver": DRIVER, "pool": "n1", "device": "gpu-0"},
                    {"request": "two", "driver": DRIVER, "pool": "n1", "device": "gpu-1", "adminAccess": True},
                    {"request": "two", "driver": "nic.example.com", "pool": "n1", "device": "nic-0"},
                ]
            }
        }
    }
    assert admission.claim_devices(held) == (1, None)


def test_the_review_passes_the_count_room_to_the_pod_and_the_claim_checks():
    room = room_of(quota(**{"requests.nvidia.com/gpu": "1"}))

    def body(obj, kind):
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "u", "operation": "CREATE", "namespace": "team", "kind": {"kind": kind}, "object": obj},
        }

    answer, _ = review_with_templates(
        body(pod("big", ctr("c", gpu=8, gpumem=1000), ns="team"), "Pod"), DRA, gpu_room=room
    )
    assert answer["response"]["allowed"] is False
    assert "nvidia.com/gpu requests 8" in answer["response"]["status"]["message"]
    answer, _ = review_with_templates(body(claim_of(one_request(count=2)), "ResourceClaim"), DRA, gpu_room=room)
    assert answer["response"]["allowed"] is False
    assert "nvidia.com/gpu requests 2, namespace team has 1 left" in answer["response"]["status"]["message"]


# --------------------------------------------------- 2. nvidia.com/gpu: 0 beside other asks (Medium)


def test_gpu_zero_leaves_no_nvidia_resource_on_the_dra_pod():
    """Found by review, 1 Dec (gpu0.py): nvidia.com/gpu: 0 beside gpumem/gpucores kept those on the
    DRA pod, which kube-scheduler could place nowhere (no node advertises nvidia.com/gpumem): the
    pod stayed Pending for ever, where the extender ignores them. Now removed, with the warning."""
    off = ctr("off", gpu=0, gpumem=4000, gpucores=30, priority=0, gpumem_percentage=50)
    off["resources"]["requests"] = {"nvidia.com/gpumem": 4000, "cpu": "1"}
    d = decide(pod("p", off, ctr("on", gpu=1, gpumem=1000)), DRA)
    assert d.allowed
    zero, on = d.pod["spec"]["containers"]
    leftover = [k for part in zero["resources"].values() if isinstance(part, dict) for k in part]
    assert leftover == ["cpu"]  # only what is not NVIDIA's
    assert "claims" not in zero["resources"] and "env" not in zero  # no claim; the priority variable gone
    assert on["resources"]["claims"] == [{"name": "hami-gpu-1"}]
    assert "hami: container 'off': nvidia.com/gpu 0 gives no GPU (gpumem, gpumem-percentage, gpucores ignored)" in (
        d.warnings
    )
    # the pod asking no GPU at all is left to kube-scheduler with nothing it cannot place
    alone = decide(pod("q", ctr("c", gpu=0, gpumem=4000, gpucores=30)), DRA)
    assert alone.allowed and not alone.pod["spec"]["containers"][0]["resources"].get("limits")


# -------------------------------------------------------------------------- 3. numa-bind (Medium)


def test_numa_bind_matches_on_the_drivers_numa_attribute_published_on_every_gpu():
    """Found by review, 1 Dec (numa.py): numa-bind matched resource.kubernetes.io/numaNode, which
    the agent leaves out when sysfs does not know the NUMA node: a 2-GPU numa-bind pod never
    scheduled there, where the extender (unknown = 0) places it. The driver's own gpu.hami.io/numa
    is always published (0 when unknown)."""
    p = pod("nb", ctr("c", gpu=2, gpumem=1000))
    p["metadata"]["annotations"] = {"nvidia.com/numa-bind": "true"}
    d = decide(p, DRA)
    constraints = template_of(d, "hami-gpu-0")["spec"]["spec"]["devices"]["constraints"]
    assert {"requests": ["gpu"], "matchAttribute": "gpu.hami.io/numa"} in constraints
    unknown = [PhysicalGPU(i, f"GPU-n1-{i}", "T4", 16000, "", 0) for i in range(2)]
    sl = resource_slice("n1", unknown, SliceSettings())
    assert "numaNode" not in str(sl["spec"]["devices"][0]["attributes"])  # no standard attribute here
    got, _ = simulate([sl], [p])
    assert got["nb"].status == "scheduled"
    # GPUs on two NUMA nodes: still one node for both, as on the extender
    split = [PhysicalGPU(i, f"GPU-n1-{i}", "T4", 16000, "", i, numa_node=i) for i in range(2)]
    got, _ = simulate([resource_slice("n1", split, SliceSettings())], [p])
    assert got["nb"].status == "pending"
    four = [PhysicalGPU(i, f"GPU-n1-{i}", "T4", 16000, "", i // 2, numa_node=i // 2) for i in range(4)]
    q = {**p, "metadata": {**p["metadata"], "name": "nb4"}}
    got, _ = simulate([resource_slice("n1", four, SliceSettings())], [q])
    assert got["nb4"].status == "scheduled"


# ------------------------------------------------ 4. GPU_CORE_UTILIZATION_POLICY=force (Medium-low)


@pytest.mark.parametrize("value", ["force", "FORCE", "Force"])
def test_a_forced_core_policy_reaches_the_claims_cdi_env_and_grant(value):
    """Found by review, 1 Dec (force_policy.py): the extender's grant file copies a container's
    GPU_CORE_UTILIZATION_POLICY=force; on DRA the claim's CDI spec set it empty (the container's
    env is sealed) and its grant file too, with no warning. Now it rides in the claim's GpuConfig."""
    c = ctr("c", gpu=1, gpumem=3000, gpucores=30)
    c["env"] = policy_env(value)
    d = decide(pod("f", c), DRA)
    assert d.allowed and d.warnings == ()
    t = template_of(d, "hami-gpu-0")
    [entry] = t["spec"]["spec"]["devices"]["config"]
    assert entry["requests"] == ["gpu"]
    assert entry["opaque"]["parameters"] == {
        "apiVersion": CONFIG_API_VERSION,
        "kind": CONFIG_KIND,
        "corePolicy": "force",
    }
    assert decide_template(t).allowed
    spec = cdi_of(allocated_with_config(t))
    env = spec_env(spec)
    assert env["GPU_CORE_UTILIZATION_POLICY"] == "force" and env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert "GPU_CORE_UTILIZATION_POLICY=force\n" in claim_grant(spec)
    # the node's own policy wins, as the device plugin's grant file takes it over the pod's
    assert spec_env(cdi_of(allocated_with_config(t), Options(core_policy="disable")))[
        "GPU_CORE_UTILIZATION_POLICY"
    ] == ("disable")


@pytest.mark.parametrize("env", [None, policy_env("default"), policy_env("forced"), policy_env("")])
def test_without_force_the_template_is_the_one_it_was(env):
    plain = decide(pod("p", ctr("c", gpu=1, gpumem=3000, gpucores=30)), DRA)
    c = ctr("c", gpu=1, gpumem=3000, gpucores=30)
    if env is not None:
        c["env"] = env
    d = decide(pod("p", c), DRA)
    assert d.templates == plain.templates
    assert spec_env(cdi_of(allocated_with_config(template_of(d, "hami-gpu-0"))))["GPU_CORE_UTILIZATION_POLICY"] == ""


def test_containers_of_different_policies_never_share_a_claim():
    warm = ctr("warm", gpu=1, gpumem=1000)
    app = ctr("app", gpu=1, gpumem=3000)
    app["env"] = policy_env("force")
    d = decide(pod("p", app, init=[warm]), DRA)
    claims = d.pod["spec"]["resourceClaims"]
    assert len(claims) == 2 and len({c["resourceClaimTemplateName"] for c in claims}) == 2
    forced = [t for t in d.templates if t["spec"]["spec"]["devices"].get("config")]
    assert [requests_of(t)["memory"] for t in forced] == ["3000Mi"]
    assert any("not sharing the init containers' claim: priority 1 (force), theirs 1" in w for w in d.warnings)
    # of one policy they still share
    warm["env"] = policy_env("force")
    assert len(decide(pod("p", app, init=[warm]), DRA).pod["spec"]["resourceClaims"]) == 1


def test_the_whole_gpu_class_leaves_the_policy_out_with_a_note():
    c = ctr("c", gpu=1)
    c["env"] = policy_env("force")
    d = decide(pod("w", c), AdmissionSettings(CFG.vendors, front_end="dra", dra_device_class=WHOLE_CLASS))
    assert d.allowed and "config" not in template_of(d, "hami-gpu-0")["spec"]["spec"]["devices"]
    assert f"hami: GPU_CORE_UTILIZATION_POLICY=force ignored, class {WHOLE_CLASS} has no libvgpu: 'c'" in d.warnings


def _cfg(**params):
    return {
        "requests": ["gpu"],
        "opaque": {"driver": DRIVER, "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, **params}},
    }


@pytest.mark.parametrize("value", ["disable", "FORCE", "", 1, True, "force\n"])
def test_a_core_policy_out_of_its_values_is_refused_naming_it(value):
    """Only the values libvgpu accepts and the claim may carry (default, force) reach the CDI env
    and the grant file; ``disable`` needs a namespace's opt-in a claim cannot be checked for."""
    spec = {**one_request(), "devices": {**one_request()["devices"], "config": [_cfg(corePolicy=value)]}}
    bad = gpuconfig.claim_spec_error(spec)
    assert f"corePolicy={value!r}" in bad and "is not one of default, force" in bad
    v = decide_claim(claim_of(spec), DRA, None)
    assert not v.allowed and v.code == 400 and "corePolicy=" in v.message
    allocated = {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}],
                    "config": [{"source": "FromClaim", **_cfg(corePolicy=value)}],
                }
            }
        },
    }
    with pytest.raises(PrepareError, match="corePolicy="):
        plan(allocated, "n1", GPU, SliceSettings())


def test_a_forced_policy_where_no_libvgpu_runs_or_mixed_in_one_claim_is_refused():
    whole = {
        "devices": {
            "requests": [{"name": "gpu", "exactly": exactly(cls=WHOLE_CLASS)}],
            "config": [_cfg(corePolicy="force")],
        }
    }
    assert "corePolicy=force needs libvgpu" in gpuconfig.claim_spec_error(whole)
    mixed = {
        "devices": {
            "requests": [{"name": "a", "exactly": exactly()}, {"name": "b", "exactly": exactly()}],
            "config": [{**_cfg(corePolicy="force"), "requests": ["a"]}],
        }
    }
    assert gpuconfig.claim_spec_error(mixed).startswith("requests mix corePolicy default and force")
    results = [
        {"request": r, "driver": DRIVER, "pool": "n1", "device": "gpu-0", "consumedCapacity": {"memory": "1000Mi"}}
        for r in ("a", "b")
    ]
    claim = {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u"},
        "status": {
            "allocation": {
                "devices": {"results": results, "config": [{"source": "FromClaim", **mixed["devices"]["config"][0]}]}
            }
        },
    }
    with pytest.raises(PrepareError, match="requests mix corePolicy default and force"):
        plan(claim, "n1", GPU, SliceSettings())


# ------------------------------------------------- 5. gpumem-percentage beside gpumem (Low)


def test_a_percentage_beside_gpumem_is_ignored_as_on_the_extender():
    """Found by review, 1 Dec (pct.py): gpumem 3000 + gpumem-percentage 50 was placed by the
    extender with 3000 MiB (the percentage ignored, with a warning) and refused on DRA."""
    d = decide(pod("pm", ctr("c", gpu=1, gpumem=3000, gpumem_percentage=50)), DRA)
    assert d.allowed
    assert requests_of(template_of(d, "hami-gpu-0"))["memory"] == "3000Mi"
    assert "hami: container 'c': nvidia.com/gpumem-percentage 50 is ignored, nvidia.com/gpumem 3000 is given" in (
        d.warnings
    )
    alone = decide(pod("pa", ctr("c", gpu=1, gpumem_percentage=50)), DRA)
    assert not alone.allowed and "nvidia.com/gpumem-percentage=50 cannot be expressed" in alone.message


def test_the_schedulers_state_gives_the_count_room_less_its_claims_devices():
    """The wiring of the GPU count quota (review, 1 Dec): the scheduler's watch cache counts each
    claim of this driver (allocated: its results; waiting: what it asks) against the namespace's
    requests.nvidia.com/gpu, and its webhook passes that room to the pod and claim checks."""
    from hami.scheduler.state import ClusterState

    from .test_dra_claims import claim as watched_claim
    from .test_dra_claims import result

    s = ClusterState(CFG)
    assert s.gpu_count_room("team-a") is None  # no count quota
    s.quota_handler.replace([quota(ns="team-a", **{"requests.nvidia.com/gpu": "4"})])
    assert s.gpu_count_room("team-a") == 4
    s.claim_handler.replace(
        [
            watched_claim("two", results=[result("n1"), result("n1", "gpu-1")]),
            watched_claim("waiting"),  # asks one, not allocated yet
            watched_claim("elsewhere", ns="team-b", results=[result("n1")]),
        ]
    )
    assert s.gpu_count_room("team-a") == 1 and s.gpu_count_room("team-b") is None
    d = decide(pod("big", ctr("c", gpu=2, gpumem=1000), ns="team-a"), DRA, gpu_room=s.gpu_count_room)
    assert not d.allowed and "nvidia.com/gpu requests 2, namespace team-a has 1 left" in d.message
    s.claim_handler.apply("DELETED", watched_claim("two", results=[result("n1"), result("n1", "gpu-1")]))
    assert s.gpu_count_room("team-a") == 3
    assert decide(pod("big", ctr("c", gpu=2, gpumem=1000), ns="team-a"), DRA, gpu_room=s.gpu_count_room).allowed
