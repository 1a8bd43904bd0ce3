"""The task priority on the DRA path, in the kubelet plugin: a ``GpuConfig``'s ``priority`` (class
or claim configuration, the claim's winning) becomes ``CUDA_TASK_PRIORITY`` in the claim's CDI
edits, its grant file and its record for ``hami monitor``; a value libvgpu or the webhook would
refuse, and a priority where no libvgpu runs, is a PrepareError naming the field."""

from dataclasses import dataclass

import pytest

from hami.dra.model import (
    CONFIG_API_VERSION,
    CONFIG_KIND,
    DRIVER,
    GpuMig,
    SliceSettings,
    StaticInstance,
    class_config,
    mig_devices,
)
from hami.draplugin.prepare import Options, Paths, PrepareError, cdi_spec, claim_grant, claim_record, plan, spec_env
from hami.node.nvml import PhysicalGPU

GPUS = [PhysicalGPU(i, f"GPU-{i}", "Tesla T4", 15360, f"0000:{i + 1:02x}:00.0", 0) for i in range(2)]
SETTINGS = SliceSettings(split_count=4)


def entry(source="FromClaim", requests=None, driver=DRIVER, **params):
    e = {
        "source": source,
        "opaque": {"driver": driver, "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, **params}},
    }
    if requests is not None:
        e["requests"] = requests
    return e


def share_class():
    return {"source": "FromClass", **class_config("hami-core")}


def result(device="gpu-0", request="gpu", admin=None):
    r = {
        "request": request,
        "driver": DRIVER,
        "pool": "n1",
        "device": device,
        "shareID": f"s-{device}",
        "consumedCapacity": {"memory": "3000Mi", "cores": "10", "shares": "1"},
    }
    if admin is not None:
        r["adminAccess"] = admin
    return r


def claim(*config, results=None):
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u1"},
        "status": {"allocation": {"devices": {"results": results or [result()], "config": list(config)}}},
    }


def env_of(c):
    p = plan(c, "n1", GPUS, SETTINGS)
    return spec_env(cdi_spec(p, Paths(), Options()))


def test_a_claims_priority_is_cuda_task_priority_in_its_cdi_edits_grant_and_record():
    c = claim(share_class(), entry(priority=0))
    p = plan(c, "n1", GPUS, SETTINGS)
    assert (p.isolation, p.priority) == ("hami-core", 0)
    spec = cdi_spec(p, Paths(), Options())
    env = spec_env(spec)
    assert env["CUDA_TASK_PRIORITY"] == "0"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m" and env["CUDA_DEVICE_SM_LIMIT"] == "10"  # limits as before
    # libvgpu takes its settings from the grant file over the container's env
    assert "CUDA_TASK_PRIORITY=0\n" in claim_grant(spec)
    assert claim_record("ns", "c", "u1", spec) == {
        "namespace": "ns",
        "name": "c",
        "uid": "u1",
        "devices": ["GPU-0"],
        "priority": 0,
    }


def test_without_a_priority_the_variable_stays_sealed_empty_and_the_record_unchanged():
    spec = cdi_spec(plan(claim(share_class()), "n1", GPUS, SETTINGS), Paths(), Options())
    assert spec_env(spec)["CUDA_TASK_PRIORITY"] == ""  # libvgpu's default (1), none of the pod's
    assert "CUDA_TASK_PRIORITY=\n" in claim_grant(spec)
    assert claim_record("ns", "c", "u1", spec) == {"namespace": "ns", "name": "c", "uid": "u1", "devices": ["GPU-0"]}


@pytest.mark.parametrize(
    "config, want",
    [
        ([{"source": "FromClass", **class_config("hami-core")}, entry(priority=0)], "0"),
        ([entry("FromClass", priority=1)], "1"),  # a class of its own may set one for all its claims
        ([entry("FromClass", priority=1), entry(priority=0)], "0"),  # the claim's wins
        ([entry(priority=0), entry("FromClass", priority=7)], "0"),  # whatever order they are listed in
        ([entry(priority=5), entry(priority=0)], "0"),  # later wins
        ([entry(priority=5), entry(isolation="hami-core")], "5"),  # an entry without it keeps it
        ([entry(priority=3, requests=["other"])], ""),  # for another request
        ([entry(priority=3, requests=["gpu"])], "3"),
        ([entry(priority=3, driver="other.example.com")], ""),  # another driver's
        ([entry(priority=None)], ""),  # null is absent
    ],
)
def test_class_and_claim_configuration_precedence(config, want):
    assert env_of(claim(*config))["CUDA_TASK_PRIORITY"] == want


def test_a_claim_entry_without_isolation_keeps_the_classs():
    """An entry naming only a priority must not switch a whole-GPU class's claim to libvgpu (the
    old reading took a missing isolation as hami-core): it keeps isolation none, and the priority
    is then refused, as libvgpu would not run to honour it."""
    whole = {"source": "FromClass", **class_config("none")}
    full = {**result(), "consumedCapacity": {"memory": "15360Mi", "cores": "100", "shares": "1"}}
    assert plan(claim(whole, entry(), results=[full]), "n1", GPUS, SETTINGS).isolation == "none"
    with pytest.raises(PrepareError, match=r"priority=0 needs libvgpu .*isolation none runs without it"):
        plan(claim(whole, entry(priority=0), results=[full]), "n1", GPUS, SETTINGS)


@pytest.mark.parametrize("value", [-1, 1001, "0", True, 1.0, [0], {"v": 0}, 2**70])
def test_a_bad_priority_is_refused_naming_the_field_and_value(value):
    with pytest.raises(PrepareError) as err:
        plan(claim(share_class(), entry(priority=value)), "n1", GPUS, SETTINGS)
    msg = str(err.value)
    assert "ResourceClaim ns/c: request 'gpu': configuration priority=" in msg
    assert repr(value)[:20] in msg and "0..1000" in msg


@pytest.mark.parametrize("value", [0, 1, 1000])
def test_every_priority_the_webhook_admits_is_taken(value):
    assert env_of(claim(entry(priority=value)))["CUDA_TASK_PRIORITY"] == str(value)


def test_the_range_is_the_webhooks():
    # both front ends take the one constant below them: the webhook refuses what a claim may not name
    from hami.core import names
    from hami.dra.model import PRIORITY_RANGE

    assert PRIORITY_RANGE is names.PRIORITY_RANGE
    low, high = names.PRIORITY_RANGE
    pod = {
        "spec": {
            "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": str(high + 1)}}}
            ]
        }
    }
    from hami.webhook.admission import AdmissionSettings, priority_error

    from ._fuzzkit import VENDORS

    assert str(high + 1) in priority_error(pod, AdmissionSettings(VENDORS))
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/priority"] = str(high)
    assert priority_error(pod, AdmissionSettings(VENDORS)) == ""


def test_requests_of_one_claim_must_run_at_one_priority():
    two = [result("gpu-0", "a"), result("gpu-1", "b")]
    with pytest.raises(PrepareError, match="requests mix priority 0 and 1"):
        plan(claim(entry(priority=0, requests=["a"]), results=two), "n1", GPUS, SETTINGS)
    # one priority for both, set once or twice: one CUDA_TASK_PRIORITY
    p = plan(
        claim(entry(priority=0, requests=["a"]), entry(priority=0, requests=["b"]), results=two), "n1", GPUS, SETTINGS
    )
    assert p.priority == 0
    # 1 is libvgpu's default: naming it for one request only is no conflict
    p = plan(claim(entry(priority=1, requests=["a"]), results=two), "n1", GPUS, SETTINGS)
    assert spec_env(cdi_spec(p, Paths(), Options()))["CUDA_TASK_PRIORITY"] == "1"


def test_an_admin_access_claim_with_a_priority_is_refused():
    admin = claim(share_class(), entry(priority=0), results=[result(admin=True)])
    with pytest.raises(PrepareError, match=r"priority=0 needs libvgpu .*admin access runs without it"):
        plan(admin, "n1", GPUS, SETTINGS)
    assert plan(claim(share_class(), results=[result(admin=True)]), "n1", GPUS, SETTINGS).isolation == "admin"


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str
    memory_mib: int
    numa: int = 0


def test_a_mig_claim_with_a_priority_is_refused():
    gpus = [Gpu(0, "GPU-a100", "NVIDIA A100-SXM4-40GB", 40960)]
    migs = mig_devices(
        gpus, {"GPU-a100": GpuMig(False, instances=(StaticInstance(3, "3g.20gb", 4, 4, "MIG-x", 19968, 43),))}
    )
    mig = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0-mig-3"}
    assert plan(claim(results=[mig]), "n1", gpus, SETTINGS, migs).isolation == "mig"
    with pytest.raises(PrepareError, match=r"priority=0 needs libvgpu .*a MIG device runs without it"):
        plan(claim(entry(priority=0), results=[mig]), "n1", gpus, SETTINGS, migs)
