"""A GPU a fatal XID marked unhealthy carries a device taint in the ResourceSlice (KEP-5055), the
taint goes when the GPU recovers, a cluster that drops taints gets the GPU left out instead, and
the simulator keeps claims off a tainted GPU unless they tolerate it, as kube-scheduler does."""

import asyncio

import pytest

from hami.core import SchedulerConfig
from hami.dra import fit
from hami.dra.model import UNHEALTHY_TAINT_KEY, SliceSettings, resource_slice, unhealthy_taint
from hami.draplugin.health import HealthBook
from hami.draplugin.publisher import publish_slice
from hami.kube.client import KubeError
from hami.node.nvml import PhysicalGPU
from hami.sim.dra import simulate_dra
from hami.vendors import build_vendors

GPUS = [PhysicalGPU(i, f"GPU-{i}", "Tesla T4", 15360, f"0000:{i + 1:02x}:00.0", 0) for i in range(2)]
S = SliceSettings(split_count=4)
CFG = SchedulerConfig(build_vendors(), "binpack", "spread")


def test_an_unhealthy_gpu_is_tainted_or_left_out():
    spec = resource_slice("n", GPUS, S, unhealthy=frozenset({"GPU-1"}), taint="NoSchedule")["spec"]
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    assert "taints" not in spec["devices"][0]
    assert spec["devices"][1]["taints"] == [{"key": "gpu.hami.io/unhealthy", "value": "xid", "effect": "NoSchedule"}]
    noexec = resource_slice("n", GPUS, S, unhealthy=frozenset({"GPU-1"}), taint="NoExecute")["spec"]
    assert noexec["devices"][1]["taints"][0]["effect"] == "NoExecute"
    left_out = resource_slice("n", GPUS, S, unhealthy=frozenset({"GPU-1"}))["spec"]
    assert [d["name"] for d in left_out["devices"]] == ["gpu-0"]
    with pytest.raises(ValueError, match="effect must be one of NoSchedule, NoExecute, got 'None'"):
        unhealthy_taint("None")


class FakeApi:
    """KubeClient's get/request over one stored ResourceSlice; ``keep_taints`` False plays an API
    server without device taints (the field is dropped on write)."""

    def __init__(self, keep_taints=True):
        self.stored = None
        self.keep_taints = keep_taints
        self.writes = []

    async def get(self, path, **query):
        if self.stored is None:
            raise KubeError("GET", path, 404, "not found")
        return self.stored

    async def request(self, method, path, query=None, body=None, content_type=None):
        assert method == "PATCH"
        import copy

        obj = copy.deepcopy(body)
        if not self.keep_taints:
            for d in obj["spec"]["devices"]:
                d.pop("taints", None)
        self.stored = obj
        self.writes.append(obj)
        return obj


def names(obj):
    return [d["name"] for d in obj["spec"]["devices"]]


def test_the_publisher_taints_bumps_the_generation_and_untaints():
    api = FakeApi()
    asyncio.run(publish_slice(api, "n", GPUS, S, frozenset(), "", "NoSchedule"))
    assert api.stored["spec"]["pool"]["generation"] == 1
    got = asyncio.run(publish_slice(api, "n", GPUS, S, frozenset({"GPU-0"}), "", "NoSchedule"))
    assert names(got) == ["gpu-0", "gpu-1"] and got["spec"]["devices"][0]["taints"][0]["key"] == UNHEALTHY_TAINT_KEY
    assert got["spec"]["pool"]["generation"] == 2  # a taint is a change of the pool
    healed = asyncio.run(publish_slice(api, "n", GPUS, S, frozenset(), "", "NoSchedule"))
    assert "taints" not in healed["spec"]["devices"][0] and healed["spec"]["pool"]["generation"] == 3


def test_a_cluster_that_drops_taints_gets_the_unhealthy_gpu_left_out():
    api = FakeApi(keep_taints=False)
    asyncio.run(publish_slice(api, "n", GPUS, S, frozenset(), "", "NoSchedule"))
    got = asyncio.run(publish_slice(api, "n", GPUS, S, frozenset({"GPU-1"}), "", "NoSchedule"))
    assert names(got) == ["gpu-0"]  # never published as if healthy
    assert [names(w) for w in api.writes[1:]] == [["gpu-0", "gpu-1"], ["gpu-0"]]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_gpu_recovers_after_the_quiet_period_if_nvml_answers():
    clock, answering = Clock(), {"GPU-0": False, "GPU-1": True}
    book = HealthBook(60, lambda u: answering[u], clock)
    assert book.due() is None and book.recover() == []
    book.mark(["GPU-0", "GPU-1"])
    assert book.unhealthy() == {"GPU-0", "GPU-1"} and book.due() == 60
    clock.now += 30
    book.mark(["GPU-1"])  # a new XID starts its wait again
    clock.now += 30
    assert book.recover() == []  # GPU-0's probe fails: it waits another period
    assert book.unhealthy() == {"GPU-0", "GPU-1"} and book.due() == 30
    clock.now += 30
    assert book.recover() == ["GPU-1"] and book.unhealthy() == {"GPU-0"}
    answering["GPU-0"] = True
    clock.now += 30
    assert book.recover() == ["GPU-0"] and book.unhealthy() == frozenset() and book.due() is None


def test_without_recovery_a_gpu_stays_unhealthy_and_a_raising_probe_is_not_back():
    clock = Clock()
    book = HealthBook(0, lambda u: True, clock)
    book.mark(["GPU-0"])
    clock.now += 1e6
    assert book.due() is None and book.recover() == [] and book.unhealthy() == {"GPU-0"}

    def broken(uuid):
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    book = HealthBook(5, broken, clock)
    book.mark(["GPU-0"])
    clock.now += 5
    assert book.recover() == [] and book.unhealthy() == {"GPU-0"}
    with pytest.raises(ValueError, match="recovery must be >= 0"):
        HealthBook(-1)


# ------------------------------------------------------------------ the allocator's rule


def claim_spec(tolerations=None, mode=None):
    exactly = {"deviceClassName": "gpu.hami.io", "capacity": {"requests": {"memory": "1Gi"}}}
    if tolerations is not None:
        exactly["tolerations"] = tolerations
    if mode:
        exactly["allocationMode"] = mode
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def place(spec, taint="NoSchedule", unhealthy=("GPU-0",)):
    devs = list(fit.devices_of([resource_slice("n", GPUS, S, unhealthy=frozenset(unhealthy), taint=taint)]).values())
    requests, constraints = fit.claim_spec_requests(spec, "c")
    found = fit.allocate_claims(devs, [fit.ClaimAsk("c", requests, constraints)])
    return None if found.picks is None else [p.device.device for p in found.picks[0]], devs, requests


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_a_tainted_gpu_is_passed_over_unless_tolerated(effect):
    got, devs, requests = place(claim_spec(), effect)
    assert got == ["gpu-1"]
    assert fit.device_why(devs[0], requests[0]) == f"taint gpu.hami.io/unhealthy=xid:{effect} not tolerated"
    for tol in (
        [{"key": "gpu.hami.io/unhealthy", "operator": "Exists"}],
        [{"key": "gpu.hami.io/unhealthy", "value": "xid"}],
        [{"operator": "Exists", "effect": effect}],
        [{"operator": "Exists"}],
    ):
        assert place(claim_spec(tol), effect)[0] == ["gpu-0"], tol
    for tol in (
        [{"key": "gpu.hami.io/unhealthy", "value": "other"}],
        [{"key": "other", "operator": "Exists"}],
        [{"operator": "Exists", "effect": "NoExecute" if effect == "NoSchedule" else "NoSchedule"}],
    ):
        assert place(claim_spec(tol), effect)[0] == ["gpu-1"], tol


def test_all_mode_with_a_tainted_gpu_fails_as_the_allocator_does():
    assert place(claim_spec(mode="All"))[0] is None
    assert place(claim_spec(mode="All"), unhealthy=())[0] == ["gpu-0", "gpu-1"]
    assert place(claim_spec([{"operator": "Exists"}], mode="All"))[0] == ["gpu-0", "gpu-1"]


def test_a_bad_toleration_operator_is_refused_by_name():
    with pytest.raises(fit.ClaimError, match=r"tolerations\[0\].operator: 'Maybe' is not Equal or Exists"):
        fit.claim_spec_requests(claim_spec([{"operator": "Maybe"}]), "c")


def test_the_simulator_reads_taints_from_given_slices():
    tainted = resource_slice("n", GPUS[:1], S, unhealthy=frozenset({"GPU-0"}), taint="NoSchedule")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "m", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
    }
    [out] = simulate_dra([tainted], [pod], CFG).pods
    assert out.status == "pending" and "not tolerated" in out.reasons["n"]
