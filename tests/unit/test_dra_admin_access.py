"""Admin access on the DRA path: a claim with ``adminAccess: true`` is placed by the allocator's
search like any claim, but once allocated consumes nothing (kube-scheduler does not count such a
result), and the kubelet plugin gives it the GPUs without libvgpu and without a region."""

import asyncio
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from hami.core import SchedulerConfig
from hami.dra import fit
from hami.dra.claims import ClaimError, claim_usage
from hami.dra.model import DRIVER, MIB, SliceSettings, resource_slice
from hami.draplugin.checkpoint import Checkpoint
from hami.draplugin.plugin import Driver
from hami.draplugin.prepare import Options, Paths, PrepareError, cdi_spec, plan
from hami.node.nvml import PhysicalGPU
from hami.sim.dra import simulate_dra
from hami.vendors import build_vendors

CFG = SchedulerConfig(build_vendors(), "binpack", "spread")
GPUS = [PhysicalGPU(i, f"GPU-{i}", "Tesla T4", 15360, f"0000:{i + 1:02x}:00.0", 0) for i in range(2)]
SETTINGS = SliceSettings(split_count=4)
SLICE = resource_slice("n1", GPUS, SETTINGS)


def spec(memory=None, admin=None, count=1):
    exactly = {"deviceClassName": "gpu.hami.io", "count": count}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    if admin is not None:
        exactly["adminAccess"] = admin
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def ask(name, **kw):
    requests, constraints = fit.claim_spec_requests(spec(**kw), name)
    return fit.ClaimAsk(name, requests, constraints)


def devices():
    return list(fit.devices_of([SLICE]).values())


# ------------------------------------------------------------------ the allocator's rules


def test_an_admin_claim_is_searched_like_any_but_takes_nothing_once_allocated():
    devs = devices()
    [[held]] = fit.allocate_claims(devs, [ask("held", memory="10000Mi")]).picks
    fit.commit([held], "held")
    [[watch]] = fit.allocate_claims(devs, [ask("watch", memory="4000Mi", admin=True)]).picks
    assert watch.device.device == "gpu-0" and watch.admin
    assert watch.result()["adminAccess"] is True
    fit.commit([watch], "watch")
    assert devs[0].used["memory"] == 10000 * MIB and devs[0].used["shares"] == 1
    assert "watch" not in devs[0].claims
    # what is left on gpu-0 is what it was before the admin claim: 5360 MiB
    [[after]] = fit.allocate_claims(devs, [ask("after", memory="5360Mi")]).picks
    assert after.device.device == "gpu-0"
    fit.release([watch], "watch")  # releasing takes nothing back either
    assert devs[0].used["memory"] == 10000 * MIB


def test_an_admin_request_must_still_fit_what_is_left_as_the_allocator_checks_capacity():
    devs = devices()
    fit.commit(fit.allocate_claims(devs, [ask("held", memory="10000Mi")]).picks[0], "held")
    [[watch]] = fit.allocate_claims(devs, [ask("watch", memory="6000Mi", admin=True)]).picks
    assert watch.device.device == "gpu-1"


def test_within_one_search_an_admin_pick_counts_against_the_pods_later_claims():
    devs = devices()
    found = fit.allocate_claims(devs, [ask("watch", memory="10000Mi", admin=True), ask("work", memory="10000Mi")])
    [[w], [k]] = found.picks
    assert (w.device.device, k.device.device) == ("gpu-0", "gpu-1")


def test_admin_access_is_a_field_of_exactly_requests_only_and_must_be_a_bool():
    with pytest.raises(fit.ClaimError, match=r"adminAccess: must be true or false, got 'yes'"):
        fit.claim_spec_requests(spec(admin="yes"), "c")
    sub = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "firstAvailable": [{"name": "a", "deviceClassName": "gpu.hami.io", "adminAccess": True}],
                }
            ]
        }
    }
    with pytest.raises(fit.ClaimError, match=r"firstAvailable\[0\].adminAccess: a subrequest has no such field"):
        fit.claim_spec_requests(sub, "c")


def result(device="gpu-0", admin=None, memory="3000Mi"):
    r = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "n1",
        "device": device,
        "shareID": f"s-{device}",
        "consumedCapacity": {"memory": memory, "cores": "10", "shares": "1"},
    }
    if admin is not None:
        r["adminAccess"] = admin
    return r


def allocated(*results, uid="u1"):
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": uid},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def test_claim_usage_counts_no_admin_result():
    assert claim_usage(allocated(result(admin=True))) is None
    u = claim_usage(allocated(result("gpu-0"), result("gpu-1", admin=True)))
    assert [r.device for r in u.results] == ["gpu-0"] and [r.device for r in u.admin] == ["gpu-1"]
    assert u.totals() == (3000, 10)
    used = fit.usage([SLICE], [allocated(result(admin=True)), allocated(result("gpu-1"), uid="u2")])
    assert used[("n1", "gpu-0")].used["memory"] == 0 and used[("n1", "gpu-1")].used["memory"] == 3000 * MIB
    with pytest.raises(ClaimError, match=r"adminAccess must be true or false"):
        claim_usage(allocated(result(admin="true")))


def test_the_simulator_places_an_admin_claim_and_later_pods_see_it_consume_nothing():
    def claim(name, memory, admin=None):
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec(memory, admin),
        }

    def pod(name, claim):
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                "containers": [{"name": "m", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
            },
        }

    one = resource_slice("n1", GPUS[:1], SETTINGS)
    docs = [claim("watch", "15360Mi", True), pod("monitor", "watch"), claim("work", "15360Mi"), pod("job", "work")]
    r = simulate_dra([one], docs, CFG)
    pods = {p.name: p for p in r.pods}
    assert pods["monitor"].status == pods["job"].status == "scheduled"
    rows = {c["name"]: c for c in r.claims}
    assert rows["watch"]["results"][0]["adminAccess"] is True
    assert "adminAccess" not in rows["work"]["results"][0]
    [dev] = r.devices
    assert dev["usedmem"] == 15360 and dev["used"] == 1  # the job's only
    # without admin access the second whole-memory claim does not fit
    docs[0] = claim("watch", "15360Mi")
    r = simulate_dra([one], docs, CFG)
    assert {p.name: p.status for p in r.pods} == {"monitor": "scheduled", "job": "pending"}


# ------------------------------------------------------------------ the kubelet plugin


def test_prepare_gives_an_admin_claim_its_gpus_without_libvgpu_or_limits():
    p = plan(allocated(result("gpu-0", True), result("gpu-1", True, memory="15360Mi")), "n1", GPUS, SETTINGS)
    assert p.isolation == "admin" and all(s.admin for s in p.shares)
    paths = Paths(hook_path="/usr/local/vgpu", driver_mounts=())
    edits = cdi_spec(p, paths, Options())["devices"][0]["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-0,GPU-1"]
    assert "mounts" not in edits  # no libvgpu, no ld.so.preload, no region


def test_prepare_refuses_a_claim_mixing_admin_and_ordinary_results():
    with pytest.raises(PrepareError, match=r"mix admin access and ordinary shares .*results\[1\].adminAccess=True"):
        plan(allocated(result("gpu-0"), result("gpu-1", True)), "n1", GPUS, SETTINGS)
    with pytest.raises(PrepareError, match=r"adminAccess='yes'"):
        plan(allocated(result("gpu-0", "yes")), "n1", GPUS, SETTINGS)


def test_the_driver_prepares_an_admin_claim_without_a_region_and_unprepares_it():
    root = Path(tempfile.mkdtemp(prefix="draadm", dir="/tmp"))
    try:
        claim = allocated(result("gpu-0", True), uid="adm-1")

        async def read(namespace, name):
            return claim

        paths = Paths(hook_path=str(root / "usr"), lock_dir=str(root / "lock"), cdi_dir=str(root / "cdi"))
        driver = Driver("n1", GPUS, SETTINGS, Checkpoint(root / "state" / "cp.json"), read, paths)
        devices = asyncio.run(driver.prepare("ns", "c", "adm-1"))
        assert devices[0]["device_name"] == "gpu-0" and devices[0]["cdi_device_ids"] == ["gpu.hami.io/claim=adm-1"]
        spec_doc = json.loads(Path(paths.cdi_file("adm-1")).read_text())
        env = spec_doc["devices"][0]["containerEdits"]["env"]
        assert not any(e.startswith(("CUDA_DEVICE_MEMORY", "CUDA_DEVICE_SM")) for e in env)
        assert not Path(paths.claim_dir("adm-1")).exists() and not Path(paths.claim_record("adm-1")).exists()
        assert asyncio.run(driver.release("ns", "c", "adm-1"))
        assert not Path(paths.cdi_file("adm-1")).exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_prepare_names_a_result_field_of_the_wrong_type():
    """A result's ``request`` that is not a string, or a ``consumedCapacity`` that is not an
    object, is refused naming the field (the first was echoed as the text of a list, the second
    failed with an AttributeError's message)."""
    bad_request = {**result("gpu-0"), "request": ["gpu", "other"]}
    with pytest.raises(PrepareError, match=r"results\[0\]\.request=\['gpu', 'other'\]: must be the name"):
        plan(allocated(bad_request), "n1", GPUS, SETTINGS)
    bad_capacity = {**result("gpu-0"), "consumedCapacity": ["3000Mi"]}
    with pytest.raises(PrepareError, match=r"results\[0\]\.consumedCapacity=\['3000Mi'\]: must be an object"):
        plan(allocated(bad_capacity), "n1", GPUS, SETTINGS)
