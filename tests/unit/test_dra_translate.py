"""HAMi manifests -> ResourceClaimTemplates + pod claims (the DRA front end of the webhook)."""

import pytest

from hami.core import admit_pod
from hami.config import NvidiaConfig
from hami.dra.translate import TranslationError, translate
from hami.vendors.nvidia import NvidiaVendor

NV = NvidiaVendor()


def pod(*limits, init=None, name="p"):
    def ctr(i, lim):
        return {"name": f"c{i}", "image": "busybox", "resources": {"limits": dict(lim), "requests": {"cpu": "1"}}}

    spec = {"containers": [ctr(i, lim) for i, lim in enumerate(limits)]}
    if init is not None:
        spec["initContainers"] = [{**ctr(9, init), "name": "init"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def admitted(p, vendor=NV):
    return admit_pod(p, [vendor])[0]


def requests_of(template):
    [req] = template["spec"]["spec"]["devices"]["requests"]
    return req["exactly"]


def test_share_request_becomes_a_template_with_capacity_requests_and_the_pod_references_it():
    out, templates = translate(
        admitted(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}, {"cpu": "1"})),
        NV,
        namespace="ns",
    )
    [t] = templates
    assert t["kind"] == "ResourceClaimTemplate" and t["metadata"]["namespace"] == "ns"
    assert t["metadata"]["name"].startswith("hami-gpu-")
    assert requests_of(t) == {
        "deviceClassName": "gpu.hami.io",
        "allocationMode": "ExactCount",
        "count": 1,
        "capacity": {"requests": {"memory": "3000Mi", "cores": "30"}},
    }
    assert "constraints" not in t["spec"]["spec"]["devices"]
    c0, c1 = out["spec"]["containers"]
    assert c0["resources"] == {"requests": {"cpu": "1"}, "claims": [{"name": "hami-gpu-0"}]}
    assert c1["resources"] == {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}
    assert out["spec"]["resourceClaims"] == [{"name": "hami-gpu-0", "resourceClaimTemplateName": t["metadata"]["name"]}]
    assert "schedulerName" not in out["spec"]


def test_same_shape_shares_a_template_and_another_shape_gets_another():
    a = translate(admitted(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30})), NV)[1]
    b = translate(
        admitted(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}, name="q")), NV
    )[1]
    c = translate(admitted(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3001, "nvidia.com/gpucores": 30})), NV)[1]
    assert a[0]["metadata"]["name"] == b[0]["metadata"]["name"] != c[0]["metadata"]["name"]


@pytest.mark.parametrize(
    "limits",
    [
        {"nvidia.com/gpu": 1},
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100},
    ],
)
def test_requests_without_memory_take_the_default_memory_which_is_all_of_it(limits):
    [t] = translate(admitted(pod(limits)), NV)[1]
    assert requests_of(t)["capacity"]["requests"] == {"cores": "100"}


@pytest.mark.parametrize(
    ("limits", "config", "want"),
    [
        # gpucores: 100 keeps other shares off the GPU by its cores; its memory stays the hard limit
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 100}, {}, "2000Mi"),
        # a bare nvidia.com/gpu with defaultMemory: that much, as the extender grants
        ({"nvidia.com/gpu": 1}, {"defaultMemory": 4000}, "4000Mi"),
        # gpumem beside gpumem-percentage: 100 (the amount wins on the extender)
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1500, "nvidia.com/gpumem-percentage": 100}, {}, "1500Mi"),
    ],
)
def test_the_memory_asked_is_kept_as_the_limit_also_for_an_exclusive_share(limits, config, want):
    """Review, finding A: ``gpucores: 100`` or a bare GPU under ``defaultMemory`` used to drop the
    memory request, so the claim (and libvgpu's limit) took the whole GPU's memory."""
    vendor = NvidiaVendor(NvidiaConfig(**config))
    [t] = translate(admitted(pod(limits), vendor), vendor)[1]
    assert requests_of(t)["capacity"]["requests"] == {"memory": want, "cores": "100"}


def test_several_gpus_must_be_distinct_devices():
    [t] = translate(admitted(pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 10})), NV)[1]
    assert requests_of(t)["count"] == 2
    assert t["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu"], "distinctAttribute": "gpu.hami.io/uuid"}
    ]


def test_memory_factor_and_default_cores_apply_as_on_the_extender_path():
    vendor = NvidiaVendor(NvidiaConfig(memoryFactor=2, defaultCores=15))
    [t] = translate(admitted(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1500}), vendor), vendor)[1]
    assert requests_of(t)["capacity"]["requests"] == {"memory": "3000Mi", "cores": "15"}


def test_an_init_container_asking_less_shares_an_app_containers_claim():
    p = pod(
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 10},
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 10},
        init={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 500, "nvidia.com/gpucores": 5},
    )
    notes: list[str] = []
    out, templates = translate(admitted(p), NV, notes=notes)
    assert len(templates) == 1  # the init container's claim takes the first app container's shape
    assert requests_of(templates[0])["capacity"]["requests"] == {"memory": "1000Mi", "cores": "10"}
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["hami-gpu-0", "hami-gpu-2"]
    assert out["spec"]["initContainers"][0]["resources"]["claims"] == [{"name": "hami-gpu-0"}]
    assert [c["resources"]["claims"] for c in out["spec"]["containers"]] == [
        [{"name": "hami-gpu-0"}],
        [{"name": "hami-gpu-2"}],
    ]
    assert notes == []  # no app container is given more than it asked


def test_an_app_container_asking_what_an_init_container_asked_takes_its_claim_once():
    same = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 20}
    p = pod(same, same, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 500}, init=same)
    out, templates = translate(admitted(p), NV)
    claims = out["spec"]["resourceClaims"]
    assert [c["name"] for c in claims] == ["hami-gpu-0", "hami-gpu-2", "hami-gpu-3"]  # 3 claims for 4 containers
    assert out["spec"]["initContainers"][0]["resources"]["claims"] == [{"name": "hami-gpu-0"}]
    # the first app container with the same request reuses it; the second (running beside the
    # first) and the other shape get their own
    assert [c["resources"]["claims"] for c in out["spec"]["containers"]] == [
        [{"name": "hami-gpu-0"}],
        [{"name": "hami-gpu-2"}],
        [{"name": "hami-gpu-3"}],
    ]
    assert {c["resourceClaimTemplateName"] for c in claims} == {t["metadata"]["name"] for t in templates}


def test_a_sidecar_init_containers_claim_is_never_reused():
    same = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 20}
    p = pod(same, init=same)
    p["spec"]["initContainers"][0]["restartPolicy"] = "Always"  # runs beside the app container
    out, _ = translate(admitted(p), NV)
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["hami-gpu-0", "hami-gpu-1"]
    assert out["spec"]["containers"][0]["resources"]["claims"] == [{"name": "hami-gpu-1"}]


def test_existing_claims_of_the_pod_are_kept_and_names_do_not_clash():
    p = admitted(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 10}))
    p["spec"]["resourceClaims"] = [{"name": "hami-gpu-0", "resourceClaimName": "mine"}]
    out, _ = translate(p, NV)
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["hami-gpu-0", "hami-gpu-0x"]
    assert out["spec"]["containers"][0]["resources"]["claims"] == [{"name": "hami-gpu-0x"}]


def test_a_pod_without_gpus_is_unchanged():
    p = pod({"cpu": "1"})
    assert translate(p, NV) == (p, [])


def test_a_memory_percentage_below_100_is_refused_naming_container_and_resource():
    with pytest.raises(TranslationError, match=r"container 'c0'.*nvidia.com/gpumem-percentage=50"):
        translate(
            admitted(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50, "nvidia.com/gpucores": 10})), NV
        )
