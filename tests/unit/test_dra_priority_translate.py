"""The task priority on the DRA path, in the webhook: a container's ``nvidia.com/priority`` goes
into the claim it is translated to (a ``GpuConfig`` with ``priority`` for its request), which the
kubelet plugin turns into ``CUDA_TASK_PRIORITY``, instead of being dropped with a warning. The
simulator and ``hami dra --explain`` take such claims."""

import pytest

from hami.core import CoreError, SchedulerConfig, admit_pod
from hami.dra.explain import explain_pod
from hami.dra.model import CONFIG_API_VERSION, CONFIG_KIND, DRIVER, SliceSettings, device_classes, resource_slice
from hami.dra.translate import translate
from hami.draplugin.prepare import Options, Paths, cdi_spec, plan, spec_env
from hami.node.nvml import PhysicalGPU
from hami.sim.dra import simulate_dra
from hami.vendors import build_vendors
from hami.vendors.nvidia import NvidiaVendor
from hami.webhook.admission import AdmissionSettings, decide

NV = NvidiaVendor()
DRA = AdmissionSettings([NV], front_end="dra")
CFG = SchedulerConfig(build_vendors(), "binpack", "spread")
GPUS = [PhysicalGPU(i, f"GPU-{i}", "Tesla T4", 15360, f"0000:{i + 1:02x}:00.0", 0) for i in range(2)]


def ctr(name, priority=None, gpumem=1000, env=None):
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": gpumem}
    if priority is not None:
        limits["nvidia.com/priority"] = priority
    c = {"name": name, "image": "x", "resources": {"limits": limits}}
    if env:
        c["env"] = env
    return c


def pod(*containers, init=(), name="p"):
    spec = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def config(priority):
    return [
        {
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "priority": priority},
            },
        }
    ]


def allocate(template, device="gpu-0", memory="1000Mi"):
    """The claim kube-controller-manager makes from ``template`` as kube-scheduler allocates it: the
    class's configuration, then the claim's (``status.allocation.devices.config``)."""
    devices = template["spec"]["spec"]["devices"]
    cls = next(
        c for c in device_classes() if c["metadata"]["name"] == devices["requests"][0]["exactly"]["deviceClassName"]
    )
    cfg = [{"source": "FromClass", **c} for c in cls["spec"].get("config") or ()]
    cfg += [{"source": "FromClaim", **c} for c in devices.get("config") or ()]
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "n1",
        "device": device,
        "consumedCapacity": {"memory": memory, "cores": "1m", "shares": "1"},
    }
    return {
        "metadata": {"namespace": "ns", "name": "p-gpu", "uid": "u1"},
        "spec": template["spec"]["spec"],
        "status": {"allocation": {"devices": {"results": [result], "config": cfg}}},
    }


@pytest.mark.parametrize("priority", [0, 1, "0", 1000])
def test_the_priority_goes_into_the_claim_and_reaches_the_containers_env(priority):
    d = decide(pod(ctr("c", priority)), DRA)
    assert d.allowed and d.warnings == ()  # nothing is ignored any more
    [t] = d.templates
    assert t["spec"]["spec"]["devices"]["config"] == config(int(priority))
    [c] = d.pod["spec"]["containers"]
    # the resource (no DRA node advertises it) and the variable admission wrote from it leave the
    # container: the claim's CDI spec sets it
    assert "limits" not in c["resources"] and "env" not in c
    env = spec_env(cdi_spec(plan(allocate(t), "n1", GPUS, SliceSettings()), Paths(), Options()))
    assert env["CUDA_TASK_PRIORITY"] == str(int(priority))


def test_a_pod_without_a_priority_gets_the_template_it_had():
    d = decide(pod(ctr("c")), DRA)
    [t] = d.templates
    assert "config" not in t["spec"]["spec"]["devices"]
    assert t["metadata"]["name"] == "hami-gpu-1b3dbba93fb1"  # the name before priorities were carried
    env = spec_env(cdi_spec(plan(allocate(t), "n1", GPUS, SliceSettings()), Paths(), Options()))
    assert env["CUDA_TASK_PRIORITY"] == ""


def test_containers_asking_different_priorities_get_different_templates():
    d = decide(pod(ctr("hi", 0), ctr("lo", 1), ctr("plain")), DRA)
    assert d.allowed and d.warnings == ()
    by_claim = {c["name"]: c["resources"]["claims"][0]["name"] for c in d.pod["spec"]["containers"]}
    tmpl = {c["name"]: c["resourceClaimTemplateName"] for c in d.pod["spec"]["resourceClaims"]}
    got = {t["metadata"]["name"]: t["spec"]["spec"]["devices"].get("config") for t in d.templates}
    assert [got[tmpl[by_claim[n]]] for n in ("hi", "lo", "plain")] == [config(0), config(1), None]


@pytest.mark.parametrize("value", [1001, "2k", "0.5"])
def test_a_priority_the_webhook_refuses_is_refused_by_the_translation_too(value):
    d = decide(pod(ctr("c", value)), DRA)
    assert not d.allowed and d.code == 400 and "nvidia.com/priority" in d.message
    # what the webhook refuses before translating, the translation refuses on its own (simulate)
    admitted = admit_pod(pod(ctr("c")), [NV])[0]
    admitted["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/priority"] = value
    with pytest.raises(CoreError, match=r"pod p container 'c'.*nvidia.com/priority"):
        translate(admitted, NV)


def test_init_containers_share_a_claim_only_with_an_app_container_of_their_priority():
    same = decide(pod(ctr("app", 0), init=[ctr("warm", 0)]), DRA)
    assert same.allowed and same.warnings == () and len(same.templates) == 1
    assert same.templates[0]["spec"]["spec"]["devices"]["config"] == config(0)
    # no priority on the init container is libvgpu's 1: the same as asking for 1
    assert len(decide(pod(ctr("app", 1), init=[ctr("warm")]), DRA).pod["spec"]["resourceClaims"]) == 1
    apart = decide(pod(ctr("app", 0), init=[ctr("warm")]), DRA)
    assert apart.allowed and len(apart.pod["spec"]["resourceClaims"]) == 2
    (note,) = apart.warnings
    assert note == "hami: 'app' not sharing the init containers' claim: priority 0, theirs 1" and len(note) < 120
    # init containers of different priorities do not share one claim either: 'b' (no priority,
    # 1) shares the app's, 'a' (0) keeps its own, which is held for the pod's life: said
    mixed = decide(pod(ctr("app"), init=[ctr("a", 0), ctr("b")]), DRA)
    assert len(mixed.pod["spec"]["resourceClaims"]) == 2
    assert mixed.warnings == ("hami: a claim per init priority, held for the pod's life: 'a'=0, 'b'=1",)


def test_simulate_places_a_prioritized_pod_and_a_claim_carrying_the_configuration():
    slices = [resource_slice("n1", GPUS, SliceSettings(split_count=4))]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mine", "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": "gpu.hami.io", "capacity": {"requests": {"memory": "1000Mi"}}},
                    }
                ],
                "config": config(0),
            }
        },
    }
    own = pod(name="own")
    own["spec"] = {
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "mine"}],
        "containers": [{"name": "m", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
    }
    r = simulate_dra(slices, [pod(ctr("c", 0)), claim, own], CFG)
    assert {p.name: p.status for p in r.pods} == {"p": "scheduled", "own": "scheduled"}


def test_explain_reads_a_claim_carrying_the_configuration():
    slices = [resource_slice("n1", GPUS[:1], SliceSettings(split_count=4))]
    [t] = decide(pod(ctr("c", 0)), DRA).templates
    claim = allocate(t)
    claim["metadata"]["name"] = "p-gpu"
    explained = decide(pod(ctr("c", 0)), DRA).pod
    explained["metadata"]["uid"] = "pod-uid"
    explained["status"] = {
        "phase": "Pending",
        "resourceClaimStatuses": [{"name": "hami-gpu-0", "resourceClaimName": "p-gpu"}],
    }
    lines = explain_pod(explained, slices, [claim])
    assert any("p-gpu" in line and "n1/gpu-0" in line for line in lines), lines
    assert not any("error" in line.lower() or "cannot" in line.lower() for line in lines), lines
