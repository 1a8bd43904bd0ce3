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


# ------------------------------------- regression review of the count quota and the policy (1 Dec)
# reproductions in /tmp/review-r5 (t_leak.py, t_scope.py, t_upg.py, t_init.py)


def special_claim(ns="team", name="p-extended-resources-x1", results=None):
    """kube-scheduler's claim for a plain ``nvidia.com/gpu: 1`` pod served by the share class
    (KEP-5004): the annotation, the class, one device."""
    out = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "namespace": ns,
            "name": name,
            "uid": f"uid-{name}",
            "generateName": "p-extended-resources-",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
        },
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": exactly(1)}]}},
    }
    if results is not None:
        out["status"] = {"allocation": {"devices": {"results": results}}}
    return out


def test_kube_schedulers_extended_resource_claim_is_not_counted_twice():
    """Found by review, 1 Dec (t_leak.py): a plain nvidia.com/gpu: 1 pod served through KEP-5004
    is counted by the API server (status.used 1 of 1); kube-scheduler's special claim for it was
    counted again (1 - 1 - 1): refused, the pod never started, and once held it charged every
    later pod twice. Its devices are the pod's: it counts no GPU; its memory still counts."""
    from hami.scheduler.state import ClusterState

    from .test_dra_claims import result

    s = ClusterState(CFG)
    s.quota_handler.replace([quota(used={"requests.nvidia.com/gpu": "1"}, **{"requests.nvidia.com/gpu": "1"})])
    assert s.gpu_count_room("team") == 0  # the pod took the one GPU of the quota
    v = decide_claim(special_claim(), DRA, s.claim_room, gpu_room=s.gpu_count_room)
    assert v.allowed, v.message
    assert admission.claim_devices(special_claim()) == (0, None)
    q = quota(used={"requests.nvidia.com/gpu": "1"}, **{"requests.nvidia.com/gpu": "2"})
    s.quota_handler.replace([q])
    assert s.gpu_count_room("team") == 1
    # watched, waiting or allocated, it takes no room; a pod after it still has the one left
    s.claim_handler.apply("ADDED", special_claim())
    assert s.gpu_count_room("team") == 1
    s.claim_handler.apply("MODIFIED", special_claim(results=[result("n1")]))
    assert s.gpu_count_room("team") == 1 and "team/p-extended-resources-x1" in s.claims  # memory: counted
    assert decide(pod("next", ctr("c", gpu=1, gpumem=1000), ns="team"), DRA, gpu_room=s.gpu_count_room).allowed
    # the same claim without the annotation is a claim of the namespace's own, counted as before
    own = special_claim(name="mine")
    del own["metadata"]["annotations"]
    s.claim_handler.apply("ADDED", own)
    assert s.gpu_count_room("team") == 0


def test_the_simulator_counts_no_gpu_for_a_dumped_extended_resource_claim():
    """The same in hami simulate: a cluster dump's allocated special claim (its pod counted in the
    quota's status.used) leaves the new pod its room (before: denied, 2 - 1 - 1)."""
    gpus = [PhysicalGPU(i, f"GPU-n1-{i}", "T4", 16000, "", 0) for i in range(2)]
    sl = resource_slice("n1", gpus, SliceSettings())
    q = {**quota(used={"requests.nvidia.com/gpu": "1"}, **{"requests.nvidia.com/gpu": "2"}), "kind": "ResourceQuota"}
    held = special_claim(
        results=[{"request": "container-0-request-0", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]
    )
    got, _ = simulate([sl], [q, held, pod("next", ctr("c", gpu=1, gpumem=1000), ns="team")])
    assert got["next"].status == "scheduled", got["next"].reasons
    # a claim of the namespace's own, held the same way, does take the room
    own = {**held, "metadata": {"namespace": "team", "name": "mine"}}
    got, _ = simulate([sl], [q, own, pod("next", ctr("c", gpu=1, gpumem=1000), ns="team")])
    assert got["next"].status == "denied" and "nvidia.com/gpu requests 1, namespace team has 0 left" in str(
        got["next"].reasons
    )


def scoped(name, hard, operator=None, values=(), scopes=None):
    q = {**quota(**hard), "metadata": {"name": name, "namespace": "ml"}}
    if scopes is not None:
        q["spec"]["scopes"] = list(scopes)
    else:
        q["spec"]["scopeSelector"] = {
            "matchExpressions": [{"scopeName": "PriorityClass", "operator": operator, "values": list(values)}]
        }
    return q


def test_a_scoped_count_quota_is_not_applied_to_every_pod_and_claim():
    """Found by review, 1 Dec (t_scope.py): quotas gpu-high (PriorityClass In [gpu-high], 8) and
    gpu-others (NotIn [gpu-high], 0): a gpu-high pod asking one GPU was refused by gpu-others
    (0 left), the API server applying neither to it. Scoped quotas are left out of the count
    (claims match no scope in Kubernetes, and their devices cannot be told apart by scope:
    docs/dra.md); unscoped ones in the same namespace still apply."""
    from hami.scheduler.state import ClusterState

    s = ClusterState(CFG)
    allowed = scoped("gpu-high", {"requests.nvidia.com/gpu": "8"}, "In", ["gpu-high"])
    deny = scoped("gpu-others", {"requests.nvidia.com/gpu": "0"}, "NotIn", ["gpu-high"])
    terminating = scoped("short", {"requests.nvidia.com/gpu": "0"}, scopes=["Terminating"])
    s.quota_handler.replace([allowed, deny, terminating])
    assert s.gpu_count_room("ml") is None
    p = pod("p", ctr("c", gpu=1, gpumem=1000), ns="ml")
    p["spec"]["priorityClassName"] = "gpu-high"
    d = decide(p, DRA, gpu_room=s.gpu_count_room)
    assert d.allowed, d.message
    assert decide_claim(claim_of(one_request(count=1), ns="ml"), DRA, None, gpu_room=s.gpu_count_room).allowed
    # an empty selector scopes nothing (the API server applies such a quota to every pod)
    empty = {**quota(**{"requests.nvidia.com/gpu": "1"}), "metadata": {"name": "all", "namespace": "ml"}}
    empty["spec"]["scopeSelector"] = {"matchExpressions": []}
    s.quota_handler.apply("ADDED", empty)
    assert s.gpu_count_room("ml") == 1
    big = pod("big", ctr("c", gpu=2, gpumem=1000), ns="ml")
    assert decide(big, DRA, gpu_room=s.gpu_count_room).message == (
        "exceeding resource quota: nvidia.com/gpu requests 2, namespace ml has 1 left"
    )


def test_a_forced_core_policy_selects_devices_whose_agent_takes_it():
    """Found by review, 1 Dec (t_upg.py): during an upgrade a claim with corePolicy: force could be
    allocated a device of an older agent, which refuses the unknown field at prepare: the pod sat
    in ContainerCreating. New agents publish corePolicy: true and the webhook's forced claims
    select it (as priority does with taskPriority); a claim without a policy asks nothing more."""
    from hami.sim.dra import simulate_dra

    attribute = "corePolicy"  # hami.dra.model.CORE_POLICY
    c = ctr("c", gpu=1, gpumem=3000)
    c["env"] = policy_env("force")
    forced = pod("forced", c)
    exact = template_of(decide(forced, DRA), "hami-gpu-0")["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert {"cel": {"expression": '"corePolicy" in device.attributes["gpu.hami.io"]'}} in exact.get("selectors", [])
    plain = pod("plain", ctr("c", gpu=1, gpumem=3000))
    assert (
        "selectors"
        not in template_of(decide(plain, DRA), "hami-gpu-0")["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    )

    new = resource_slice("n1", GPU, SliceSettings(split_count=4))
    assert all(dev["attributes"].get(attribute) == {"bool": True} for dev in new["spec"]["devices"])
    old = resource_slice("n1", GPU, SliceSettings(split_count=4))
    for dev in old["spec"]["devices"]:  # as an agent that predates the field publishes them
        dev["attributes"].pop(attribute, None)
    on_old = simulate_dra([old], [forced, plain], CFG)
    assert {p.name: p.status for p in on_old.pods} == {"forced": "pending", "plain": "scheduled"}
    on_new = simulate_dra([new], [forced, plain], CFG)
    assert {p.name: p.status for p in on_new.pods} == {"forced": "scheduled", "plain": "scheduled"}


def test_a_claim_written_with_a_core_policy_and_no_selector_is_warned_of():
    """A claim a user writes with a corePolicy (either value: an older agent refuses the field)
    and no corePolicy selector is admitted with a warning, as one with a priority is."""
    spec = one_request()
    spec["devices"]["config"] = [{"requests": ["gpu"], **_cfg(corePolicy="default")}]
    v = decide_claim(claim_of(spec), DRA, None)
    assert v.allowed and v.warnings == ("hami: corePolicy without a corePolicy selector (older agents refuse it): gpu",)
    spec["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": '"corePolicy" in device.attributes["gpu.hami.io"]'}}
    ]
    assert decide_claim(claim_of(spec), DRA, None).warnings == ()
    assert decide_claim(claim_of(one_request()), DRA, None).warnings == ()


def test_a_relist_without_a_claim_only_the_count_quota_held_frees_its_gpus():
    """Found by review, 1 Dec (t_leak.py): a MIG claim waiting for allocation asks no memory the
    state knows a size for, so only claim_device_counts held it; deleted while the watch was down,
    the relist kept it charged (room 0 for good, every pod refused)."""
    from hami.scheduler.state import ClusterState

    s = ClusterState(CFG)
    s.quota_handler.replace([quota(ns="team-a", **{"requests.nvidia.com/gpu": "2"})])
    mig = claim_of(one_request(count=2, cls="mig.gpu.hami.io"), ns="team-a", name="m")
    s.claim_handler.apply("ADDED", mig)
    assert s.gpu_count_room("team-a") == 0 and "team-a/m" not in s.waiting_claims
    s.claim_handler.replace([])  # the relist after the outage: the claim is gone
    assert s.gpu_count_room("team-a") == 2 and s.claim_device_counts == {}
    assert decide(pod("p", ctr("c", gpu=1, gpumem=1000), ns="team-a"), DRA, gpu_room=s.gpu_count_room).allowed


def test_the_count_quota_reads_the_configured_count_resource():
    """Found by review, 1 Dec: the scheduler's state and hami simulate read requests.nvidia.com/gpu
    whatever resourceCountName says, while the webhook's messages name the configured one: with
    resourceCountName example.com/vgpu its quota was never read (a pod of 2 passed a quota of 1)."""
    from hami.config import DeviceConfig, NvidiaConfig
    from hami.core import SchedulerConfig
    from hami.scheduler.state import ClusterState
    from hami.vendors import build_vendors

    nvidia = NvidiaConfig(resourceCountName="example.com/vgpu")
    cfg = SchedulerConfig(build_vendors(DeviceConfig(nvidia=nvidia)), "binpack", "spread")
    dra = AdmissionSettings(cfg.vendors, front_end="dra")
    renamed = quota(**{"requests.example.com/vgpu": "1"})
    s = ClusterState(cfg)
    s.quota_handler.replace([renamed])
    assert s.gpu_count_room("team") == 1
    big = pod("big", {"name": "c", "image": "x", "resources": {"limits": {"example.com/vgpu": 2}}}, ns="team")
    d = decide(big, dra, gpu_room=s.gpu_count_room)
    assert d.message == "exceeding resource quota: example.com/vgpu requests 2, namespace team has 1 left"
    gpus = [PhysicalGPU(i, f"GPU-n1-{i}", "T4", 16000, "", 0) for i in range(2)]
    got, _ = simulate([resource_slice("n1", gpus, SliceSettings())], [{**renamed, "kind": "ResourceQuota"}, big], cfg)
    assert got["big"].status == "denied" and "example.com/vgpu requests 2, namespace team has 1 left" in str(
        got["big"].reasons
    )


def test_an_init_container_kept_from_the_apps_claim_counts_on_top_as_its_claim_is_held():
    """Found by review, 1 Dec (t_init.py): the pod check sums its claims, so an init container that
    cannot share the app's claim (another policy) counts on top where the extender counts
    max(init, app). Kept, and documented (docs/dra.md): a claim is allocated for the pod's whole
    life, the init container's GPU is held while the app runs, and the claim check of each claim
    counts it so; max() would admit a pod whose second claim is then refused at its creation,
    the pod pending for good. Passes before and after (no behaviour changed)."""
    app = ctr("app", gpu=1, gpumem=3000)
    app["env"] = policy_env("force")
    p = pod("p", app, init=[ctr("warm", gpu=1, gpumem=1000)], ns="team")
    d = decide(p, DRA)
    assert len(d.pod["spec"]["resourceClaims"]) == 2
    room = room_of(quota(**{"requests.nvidia.com/gpu": "1"}))
    refused = decide(p, DRA, gpu_room=room)
    assert refused.message == "exceeding resource quota: nvidia.com/gpu requests 2, namespace team has 1 left"
    # what the claim checks would do with the room max() would have given: the second is refused
    made = [claim_of(t["spec"]["spec"], name=f"c{i}") for i, t in enumerate(d.templates)]
    assert decide_claim(made[0], DRA, None, gpu_room=room_of(quota(**{"requests.nvidia.com/gpu": "1"}))).allowed
    assert not decide_claim(
        made[1], DRA, None, gpu_room=room_of(quota(**{"requests.nvidia.com/gpu": "1"}), held=1)
    ).allowed
    assert decide(p, DRA, gpu_room=room_of(quota(**{"requests.nvidia.com/gpu": "2"}))).allowed
