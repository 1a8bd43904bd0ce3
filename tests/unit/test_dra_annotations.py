"""HAMi's pod annotations on the DRA front end: GPU type and UUID choices become CEL selectors,
numa-bind a matchAttribute constraint, and what DRA cannot express is refused by name. The
webhook and `hami simulate --front-end dra` run the same translation."""

import pytest

from hami.core import SchedulerConfig, admit_pod
from hami.dra.cel import DeviceCel, compile_selector
from hami.dra.model import SliceSettings, resource_slice
from hami.dra.translate import NUMA_ATTRIBUTE, TranslationError, annotation_selectors, cel_string, translate
from hami.node.nvml import PhysicalGPU
from hami.sim.dra import simulate_dra
from hami.vendors import build_vendors
from hami.vendors.nvidia import NvidiaVendor
from hami.webhook.admission import AdmissionSettings, decide

NV = NvidiaVendor()
DRA = AdmissionSettings([NV], front_end="dra")
CFG = SchedulerConfig(build_vendors(), "binpack", "spread")


def pod(annotations=None, *containers, name="p"):
    limits = containers or ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000},)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "annotations": dict(annotations or {})},
        "spec": {
            "containers": [
                {"name": f"c{i}", "image": "x", "resources": {"limits": dict(lim)}} for i, lim in enumerate(limits)
            ]
        },
    }


def claim_of(annotations=None, *containers):
    p = admit_pod(pod(annotations, *containers), [NV])[0]
    return [t["spec"]["spec"]["devices"] for t in translate(p, NV, namespace="ns")[1]]


def exprs(devices):
    [req] = devices["requests"]
    return [s["cel"]["expression"] for s in req["exactly"].get("selectors") or []]


def dev(type_="NVIDIA-Tesla T4", uuid="GPU-0"):
    return DeviceCel("gpu.hami.io", {"attributes": {"type": {"string": type_}, "uuid": {"string": uuid}}})


def passes(expressions, device):
    return all(device.matches(compile_selector(e)) for e in expressions)


# ------------------------------------------------------------------ each annotation


def test_no_annotation_no_selector_no_numa_constraint():
    [d] = claim_of()
    assert exprs(d) == [] and "constraints" not in d


def test_use_gputype_is_a_case_insensitive_substring_of_the_type_any_of_the_list():
    [d] = claim_of({"nvidia.com/use-gputype": "A100, t4"})
    [e] = exprs(d)
    assert passes([e], dev("NVIDIA-Tesla T4"))
    assert passes([e], dev("NVIDIA-A100-SXM4-80GB"))
    assert not passes([e], dev("NVIDIA-H100"))
    assert not passes([e], dev("NVIDIA-L4"))


def test_nouse_gputype_rules_out_every_listed_type():
    [d] = claim_of({"nvidia.com/nouse-gputype": "A10,T4"})
    [e] = exprs(d)
    assert not passes([e], dev("NVIDIA-A100"))  # HAMi's substring rule: A10 is in A100 too
    assert not passes([e], dev("NVIDIA-Tesla T4"))
    assert passes([e], dev("NVIDIA-H100"))


def test_use_and_nouse_gpuuuid_are_exact_lists():
    [d] = claim_of({"nvidia.com/use-gpuuuid": "GPU-a, GPU-b", "nvidia.com/nouse-gpuuuid": "GPU-b"})
    es = exprs(d)
    assert len(es) == 2
    assert passes(es, dev(uuid="GPU-a"))
    assert not passes(es, dev(uuid="GPU-b"))  # listed in both: excluded, as on the extender
    assert not passes(es, dev(uuid="GPU-c"))
    assert not passes(es, dev(uuid="GPU-a2"))  # exact, not a prefix


def test_empty_annotation_values_mean_no_constraint_as_on_the_extender():
    [d] = claim_of({"nvidia.com/use-gputype": "", "nvidia.com/use-gpuuuid": " , "})
    assert exprs(d) == []


def test_numa_bind_aligns_a_containers_gpus_on_the_drivers_numa_attribute():
    # the driver's gpu.hami.io/numa, on every device (0 when unknown, as the extender reads it);
    # the standard numaNode, left out where sysfs does not know it, kept such pods pending
    # (review, 1 Dec: tests/unit/test_review_dra_parity_dec1d.py)
    [d] = claim_of({"nvidia.com/numa-bind": "true"}, {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000})
    assert {"requests": ["gpu"], "matchAttribute": NUMA_ATTRIBUTE} in d["constraints"]
    assert {"requests": ["gpu"], "distinctAttribute": "gpu.hami.io/uuid"} in d["constraints"]
    # one GPU: nothing to align, and no NUMA attribute needed on the device
    [d] = claim_of({"nvidia.com/numa-bind": "true"})
    assert "constraints" not in d
    # HAMi binds only on "true"
    [d] = claim_of({"nvidia.com/numa-bind": "yes"}, {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000})
    assert d["constraints"] == [{"requests": ["gpu"], "distinctAttribute": "gpu.hami.io/uuid"}]


def test_combinations_apply_to_every_gpu_container_of_the_pod():
    ann = {"nvidia.com/use-gputype": "A100", "nvidia.com/nouse-gpuuuid": "GPU-x", "nvidia.com/numa-bind": "True"}
    a, b = claim_of(
        ann, {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000}, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}
    )
    assert exprs(a) == exprs(b) and len(exprs(a)) == 2
    assert {"requests": ["gpu"], "matchAttribute": NUMA_ATTRIBUTE} in a["constraints"]
    assert "constraints" not in b
    assert passes(exprs(a), dev("NVIDIA-A100", "GPU-y")) and not passes(exprs(a), dev("NVIDIA-A100", "GPU-x"))


def test_the_selectors_change_the_template_name():
    p = admit_pod(pod(), [NV])[0]
    q = admit_pod(pod({"nvidia.com/use-gputype": "A100"}), [NV])[0]
    assert translate(p, NV)[1][0]["metadata"]["name"] != translate(q, NV)[1][0]["metadata"]["name"]


def test_vgpu_mode_with_hami_core_is_accepted_and_without_it_refused():
    assert claim_of({"nvidia.com/vgpu-mode": "hami-core"})
    assert claim_of({"nvidia.com/vgpu-mode": "mig,hami-core"})
    with pytest.raises(TranslationError, match=r"nvidia.com/vgpu-mode='mig'"):
        claim_of({"nvidia.com/vgpu-mode": "mig"})


@pytest.mark.parametrize(
    "key,value",
    [
        ("hami.io/gpu-scheduler-policy", "binpack"),
        ("hami.io/gpu-scheduler-policy", "topology-aware"),
        ("hami.io/node-scheduler-policy", "spread"),
        ("hami.io/device-scoring-weights", "slot=1,core=1,memory=3"),
    ],
)
def test_what_dra_cannot_express_is_refused_naming_the_annotation_and_value(key, value):
    with pytest.raises(TranslationError, match=f"annotation {key}={value!r} cannot be expressed"):
        claim_of({key: value})
    d = decide(pod({key: value}), DRA)
    assert not d.allowed and d.code == 400 and f"{key}={value!r}" in d.message and not d.templates


def test_a_refused_annotation_on_a_pod_without_gpus_is_left_alone():
    p = pod({"hami.io/gpu-scheduler-policy": "binpack"}, {"cpu": "1"})
    d = decide(p, DRA)
    assert d.allowed and not d.templates


def test_the_priority_resource_and_its_env_leave_the_container():
    """The priority has no effect on the DRA front end (the claim's CDI spec sets
    CUDA_TASK_PRIORITY empty); the variable admission wrote goes with its resource, else the pod
    carries it without the resource, which the webhook (on reinvocation) and the device-pod guard
    refuse (found by the regression review). Other env is kept."""
    raw = pod(None, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/priority": 0})
    raw["spec"]["containers"][0]["env"] = [{"name": "APP", "value": "1"}]
    p = admit_pod(raw, [NV])[0]
    assert {"name": "CUDA_TASK_PRIORITY", "value": "0"} in p["spec"]["containers"][0]["env"]
    out, _ = translate(p, NV)
    [c] = out["spec"]["containers"]
    assert "nvidia.com/priority" not in (c["resources"].get("limits") or {})
    assert c["env"] == [{"name": "APP", "value": "1"}]


# ------------------------------------------------------------------ CEL string safety


@pytest.mark.parametrize(
    "value",
    [
        'x") || true || ("',
        'a"b',
        "back\\slash",
        '\\") || true || ("',
        "new\nline\ttab",
        "\u00e9\u4e2d\U0001f600",
        "\x00\x7f",
        "'single' ${x}",
    ],
)
def test_a_value_is_one_cel_literal_whatever_it_holds(value):
    lit = cel_string(value)
    # the literal compiles, and reads back as the very value on a device holding it
    sel = compile_selector(f'device.attributes["gpu.hami.io"].uuid == {lit}')
    assert dev(uuid=value).matches(sel)
    assert not dev(uuid=value + "z").matches(sel)
    assert not dev(uuid="GPU-0").matches(sel)


def test_an_injection_attempt_in_an_annotation_selects_nothing_it_should_not():
    evil = 'A100") || true || ("'
    [d] = claim_of({"nvidia.com/use-gputype": evil, "nvidia.com/use-gpuuuid": 'GPU-0"] || true || ["'})
    es = exprs(d)
    assert len(es) == 2
    for e in es:
        compile_selector(e)
    assert not passes(es, dev("NVIDIA-A100", "GPU-0"))
    assert not passes(es, dev("NVIDIA-H100", "GPU-1"))


def test_a_lone_surrogate_is_refused_naming_the_annotation():
    with pytest.raises(TranslationError, match="nvidia.com/use-gpuuuid"):
        annotation_selectors(pod({"nvidia.com/use-gpuuuid": "GPU-\ud800"}), NV)


def test_a_selector_longer_than_the_api_server_takes_is_refused():
    many = ",".join(f"GPU-{i:036d}" for i in range(400))
    with pytest.raises(TranslationError, match="more than the API server's 10240"):
        claim_of({"nvidia.com/use-gpuuuid": many})


# ------------------------------------------------------------------ webhook and simulator agree


def gpu(i, model, numa_node):
    # as the agent reads sysfs: the registration's NUMA node is the kernel's when it knows it
    return PhysicalGPU(i, f"GPU-{i}", model, 15360, f"0000:{i + 1:02x}:00.0", numa_node, numa_node=numa_node)


SLICE = resource_slice(
    "n1",
    [gpu(0, "Tesla T4", 0), gpu(1, "A100-PCIE-40GB", 0), gpu(2, "Tesla T4", 1), gpu(3, "A100-PCIE-40GB", 1)],
    SliceSettings(split_count=4),
)


def test_the_simulator_places_annotated_pods_only_on_matching_gpus_and_refuses_the_rest():
    pods = [
        pod({"nvidia.com/use-gputype": "a100"}, name="a100"),
        pod({"nvidia.com/nouse-gputype": "A100", "nvidia.com/nouse-gpuuuid": "GPU-0"}, name="not-a100-not-0"),
        pod({"nvidia.com/use-gpuuuid": "GPU-3"}, name="uuid3"),
        # two GPUs on one NUMA node, and not the T4 on node 0: only GPU-2 and GPU-3 (NUMA 1) qualify
        pod(
            {"nvidia.com/numa-bind": "true", "nvidia.com/nouse-gpuuuid": "GPU-0"},
            {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000},
            name="numa",
        ),
        pod({"nvidia.com/use-gputype": "H100"}, name="h100"),
        pod({"hami.io/gpu-scheduler-policy": "spread"}, name="policy"),
    ]
    result = simulate_dra([SLICE], pods, CFG)
    got = {p.name: p for p in result.pods}
    devices = {n: sorted(d["device"] for c in p.containers for d in c["devices"]) for n, p in got.items()}
    assert devices["a100"] == ["n1/gpu-1"]
    assert devices["not-a100-not-0"] == ["n1/gpu-2"]
    assert devices["uuid3"] == ["n1/gpu-3"]
    assert devices["numa"] == ["n1/gpu-2", "n1/gpu-3"]
    assert got["h100"].status == "pending" and "is false" in got["h100"].reasons["n1"]
    assert got["policy"].status == "denied"
    assert "hami.io/gpu-scheduler-policy='spread'" in got["policy"].reasons["webhook"]
    assert not any("not expressed" in w for w in result.warnings)


def test_numa_bind_keeps_a_pair_pending_where_no_numa_node_has_two_matching_gpus():
    # the T4s are GPU-0 (NUMA 0) and GPU-2 (NUMA 1)
    bound = pod({"nvidia.com/use-gputype": "T4", "nvidia.com/numa-bind": "true"}, {"nvidia.com/gpu": 2}, name="b")
    free = pod({"nvidia.com/use-gputype": "T4"}, {"nvidia.com/gpu": 2}, name="f")
    assert decide(bound, DRA).allowed
    [b] = simulate_dra([SLICE], [bound], CFG).pods
    assert b.status == "pending" and "not together" in b.reasons["n1"]
    [f] = simulate_dra([SLICE], [free], CFG).pods
    assert sorted(d["device"] for c in f.containers for d in c["devices"]) == ["n1/gpu-0", "n1/gpu-2"]


# ------------------------------------------------------------------ other vendors


def test_another_vendors_device_is_refused_unless_the_pod_is_routed_to_the_extender():
    from hami.vendors.amd import AmdVendor

    vendors = (NvidiaVendor(), AmdVendor())
    dra = AdmissionSettings(vendors, front_end="dra")
    amd = pod(None, {"amd.com/gpu": 1}, name="amd")
    d = decide(amd, dra)
    assert not d.allowed and d.code == 400
    assert "container 'c0': amd.com/gpu cannot be expressed on the DRA front end" in d.message
    assert "spec.schedulerName: hami-scheduler" in d.message
    # routed to the extender by name: the extender places the AMD GPU, the NVIDIA one becomes a claim
    both = pod(None, {"amd.com/gpu": 1}, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, name="both")
    both["spec"]["schedulerName"] = "hami-scheduler"
    d = decide(both, dra)
    assert d.allowed and len(d.templates) == 1
    c0, c1 = d.pod["spec"]["containers"]
    assert c0["resources"]["limits"] == {"amd.com/gpu": 1} and c1["resources"]["claims"] == [{"name": "hami-gpu-1"}]
    # the simulator runs the same decision
    [out] = simulate_dra([SLICE], [amd], SchedulerConfig(vendors, "binpack", "spread")).pods
    assert out.status == "denied" and "amd.com/gpu cannot be expressed" in out.reasons["webhook"]
