"""The one reader of a DRA claim's allocation (hami.dra.claims) and what the scheduler's watch cache
does with it: namespace quota usage in the ledger, slices filling in whole-device allocations, and
an optional watch that tolerates an API server without resource.k8s.io/v1."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hami.dra.claims import ClaimError, Consumer, DeviceShare, claim_usage, slice_devices
from hami.dra.explain import usage
from hami.dra.model import MIB, SliceSettings, resource_slice
from hami.kube.client import KubeError
from hami.kube.reflector import Reflector
from hami.scheduler.state import ClusterState

from ._vendorkit import config

CFG = config()


class Gpu:
    def __init__(self, index: int, uuid: str, memory_mib: int = 15360) -> None:
        self.index, self.uuid, self.model, self.memory_mib, self.numa = index, uuid, "Tesla T4", memory_mib, 0


def a_slice(node: str, n: int = 2, split: int = 4) -> dict:
    return resource_slice(node, [Gpu(i, f"GPU-{node}-{i}") for i in range(n)], SliceSettings(split_count=split))


def claim(name: str, ns: str = "team-a", results=None, reserved=("p",), rv: str = "5") -> dict:
    out = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": rv},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.hami.io"}}]}},
    }
    if results is not None:
        out["status"] = {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in reserved],
        }
    return out


def result(
    node: str,
    device: str = "gpu-0",
    memory: str | None = "3000Mi",
    cores: str | None = "25",
    driver: str = "gpu.hami.io",
) -> dict:
    consumed = {k: v for k, v in (("memory", memory), ("cores", cores), ("shares", "1")) if v is not None}
    return {
        "request": "gpu",
        "driver": driver,
        "pool": node,
        "device": device,
        "consumedCapacity": consumed,
        "shareID": "abc",
    }


def test_claim_usage_reads_each_result_of_the_driver_and_the_reserving_pods():
    c = claim(
        "c1",
        results=[
            result("n1", "gpu-0"),
            result("n1", "gpu-1", "1Gi", "10"),
            result("n1", "x", driver="other.example.com"),
        ],
        reserved=("p1", "p2"),
    )
    u = claim_usage(c)
    assert u is not None and u.key == "team-a/c1" and u.uid == "uid-c1" and u.nodes == ("n1",)
    assert u.results == (
        DeviceShare("n1", "gpu-0", "gpu", 3000 * MIB, 25, 1, "abc"),
        DeviceShare("n1", "gpu-1", "gpu", 1024 * MIB, 10, 1, "abc"),
    )
    assert u.pods == (Consumer("pods", "p1", "uid-p1"), Consumer("pods", "p2", "uid-p2"))
    assert u.totals() == (3000 + 1024, 35)


def test_claim_usage_is_none_for_unallocated_claims_and_claims_of_other_drivers():
    assert claim_usage(claim("pending")) is None
    assert claim_usage(claim("other", results=[result("n1", driver="gpu.nvidia.com")])) is None


def test_a_missing_consumed_capacity_is_the_whole_device_when_its_total_is_known():
    u = claim_usage(claim("whole", results=[result("n1", memory=None, cores=None)]))
    assert u.results[0].memory is None and u.results[0].cores is None
    devices = {k: d["total"] for k, d in slice_devices([a_slice("n1")]).items()}
    assert u.totals(devices) == (15360, 100)
    assert u.totals() == (0, 0)  # unknown device: nothing to go by


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"memory": "lots"}, "results[0].consumedCapacity.memory"),
        ({"cores": "-5"}, "results[0].consumedCapacity.cores"),
        ({"memory": "1.5"}, "results[0].consumedCapacity.memory"),
    ],
)
def test_a_bad_amount_is_an_error_naming_the_claim_and_the_field(bad, field):
    r = result("n1")
    r["consumedCapacity"].update(bad)
    with pytest.raises(ClaimError, match=rf"ResourceClaim team-a/bad: status\.allocation\.devices\.{re_escape(field)}"):
        claim_usage(claim("bad", results=[r]))


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_bad_shapes_are_errors_not_crashes():
    with pytest.raises(ClaimError, match="must be a list"):
        claim_usage(
            {"metadata": {"name": "x", "namespace": "y"}, "status": {"allocation": {"devices": {"results": "no"}}}}
        )
    with pytest.raises(ClaimError, match=r"results\[0\] must be an object"):
        claim_usage({"status": {"allocation": {"devices": {"results": [3]}}}})
    with pytest.raises(ClaimError, match="must be an object"):
        claim_usage([])


def test_hami_dra_explain_counts_claims_through_the_same_parser():
    claims = [
        claim("a", results=[result("n1", "gpu-0")]),
        claim("b", results=[result("n1", "gpu-0", None, None)]),
        claim("bad", results=[result("n1", "gpu-1", "junk")]),
    ]
    uses = usage([a_slice("n1")], claims)
    g0, g1 = uses[("n1", "gpu-0")], uses[("n1", "gpu-1")]
    assert g0.used == {"memory": 3000 * MIB + 15360 * MIB, "cores": 125, "shares": 2}
    assert g0.claims == ["team-a/a", "team-a/b"]
    assert g1.used == {"memory": 0, "cores": 0, "shares": 0} and g1.claims == []  # unreadable: nothing


# ---------------------------------------------------------------------- the watch cache
@pytest.fixture
def state() -> ClusterState:
    s = ClusterState(CFG)
    s.quota_handler.replace(
        [
            {
                "metadata": {"name": "q", "namespace": "team-a"},
                "spec": {"hard": {"limits.nvidia.com/gpumem": "8000", "limits.nvidia.com/gpucores": "60"}},
            }
        ]
    )
    return s


def room(s: ClusterState, ns: str = "team-a") -> tuple:
    return s.ledger.quota_room(ns, CFG.vendors).room["NVIDIA"]


def test_allocated_claims_count_against_their_namespace_quota_and_leave_it_when_gone(state):
    assert room(state) == (8000, 60)
    state.claim_handler.replace(
        [claim("c1", results=[result("n1")]), claim("pending"), claim("other-ns", ns="team-b", results=[result("n1")])]
    )
    assert sorted(state.claims) == ["team-a/c1", "team-b/other-ns"]
    assert room(state) == (5000, 35)
    assert state.ledger.namespace_usage("team-b", "NVIDIA") == (3000, 25)
    # the claim grows to a second GPU (a new allocation after a deallocation): counted once
    state.claim_handler.apply(
        "MODIFIED", claim("c1", results=[result("n1"), result("n1", "gpu-1", "2000Mi", "5")], rv="6")
    )
    assert room(state) == (3000, 30)
    state.claim_handler.apply("MODIFIED", claim("c1", rv="7"))  # deallocated
    assert room(state) == (8000, 60) and "team-a/c1" not in state.claims
    state.claim_handler.apply("ADDED", claim("c2", results=[result("n1")]))
    state.claim_handler.apply("DELETED", claim("c2", results=[result("n1")]))
    assert room(state) == (8000, 60)
    state.claim_handler.apply("ADDED", claim("c3", results=[result("n1")]))
    state.claim_handler.replace([])  # a relist without it
    assert room(state) == (8000, 60) and not state.claims


def test_a_whole_device_claim_is_counted_once_the_slice_is_known(state):
    state.claim_handler.replace([claim("whole", results=[result("n1", memory=None, cores=None)])])
    assert room(state) == (8000, 60)  # the device's size is not known yet
    state.slice_handler.replace([a_slice("n1")])
    assert room(state) == (8000 - 15360, 60 - 100)
    assert sorted(state.dra_devices) == [("n1", "gpu-0"), ("n1", "gpu-1")]
    assert state.device_node_names() == ["n1"]
    state.slice_handler.apply("ADDED", a_slice("n2", n=1))  # another node's slice: n1's devices stay
    assert sorted(state.dra_devices) == [("n1", "gpu-0"), ("n1", "gpu-1"), ("n2", "gpu-0")]
    assert room(state) == (8000 - 15360, 60 - 100)
    smaller = resource_slice("n1", [Gpu(0, "GPU-n1-0", 10240)], SliceSettings(split_count=4))
    state.slice_handler.apply("MODIFIED", smaller)  # n1 republished with one smaller GPU
    assert sorted(state.dra_devices) == [("n1", "gpu-0"), ("n2", "gpu-0")]
    assert room(state) == (8000 - 10240, 60 - 100)
    state.slice_handler.apply("DELETED", smaller)
    assert room(state) == (8000, 60) and state.device_node_names() == ["n2"]


def test_slices_of_other_drivers_are_ignored(state):
    other = a_slice("n2")
    other["spec"]["driver"] = "gpu.nvidia.com"
    state.slice_handler.apply("ADDED", other)
    assert state.slices == {} and state.dra_devices == {}


def test_an_unreadable_claim_is_logged_and_counted_as_nothing(state, caplog):
    state.claim_handler.apply("ADDED", claim("c1", results=[result("n1")]))
    with caplog.at_level(logging.WARNING):
        state.claim_handler.apply("MODIFIED", claim("c1", results=[result("n1", memory="junk")], rv="9"))
    assert "team-a/c1" in caplog.text and "consumedCapacity.memory" in caplog.text
    assert room(state) == (8000, 60) and not state.claims


def test_pods_with_resource_claims_are_cached_for_the_ui(state):
    pod = {
        "metadata": {"name": "p", "namespace": "team-a", "uid": "u", "resourceVersion": "1"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}], "containers": [{"name": "c"}]},
    }
    plain = {
        "metadata": {"name": "q", "namespace": "team-a", "uid": "v", "resourceVersion": "1"},
        "spec": {"containers": [{"name": "c"}]},
    }
    state.pod_handler.replace([pod, plain])
    assert list(state.pods) == ["team-a/p"]
    assert state.ledger.pods() == []


# ---------------------------------------------------------------------- optional watch
class FakeKube:
    """Answers the list with 404 ``absent`` times, then an empty list; a watch that ends at once."""

    def __init__(self, status: int, absent: int) -> None:
        self.status, self.absent, self.lists = status, absent, 0

    async def request(self, method, path, query=(), *rest, **kw):
        self.lists += 1
        if self.lists <= self.absent:
            raise KubeError("GET", path, self.status, '{"kind":"Status","code":%d}' % self.status)
        return {"metadata": {"resourceVersion": "7"}, "items": [claim("c1", results=[result("n1")])]}

    async def open(self, *a, **kw):
        await asyncio.sleep(3600)


@pytest.mark.parametrize(
    "status, words", [(404, "is not served by the API server"), (403, "may not be read by this identity")]
)
async def test_an_optional_resource_that_is_absent_is_logged_once_and_listed_again(status, words, caplog):
    s = ClusterState(CFG)
    kube = FakeKube(status, absent=3)
    r = Reflector(
        kube,
        "/apis/resource.k8s.io/v1/resourceclaims",
        s.claim_handler,
        name="resourceclaims",
        optional="DRA claims are not counted",
        absent_retry=0.01,
    )
    with caplog.at_level(logging.INFO):
        task = asyncio.create_task(r.run())
        for _ in range(500):
            if s.claims:
                break
            await asyncio.sleep(0.01)
        task.cancel()
    assert r.synced.is_set() and r.absent is None and kube.lists == 4
    assert list(s.claims) == ["team-a/c1"]
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert warnings == [
        f"resourceclaims {words} (HTTP {status}): DRA claims are not counted; listing again every 0.01s"
    ]
    assert any("serves it now" in rec.getMessage() for rec in caplog.records)


async def test_a_required_resource_is_not_taken_as_absent():
    s = ClusterState(CFG)
    r = Reflector(FakeKube(404, absent=10**6), "/api/v1/pods", s.pod_handler, name="pods")
    task = asyncio.create_task(r.run())
    await asyncio.sleep(0.3)
    task.cancel()
    assert not r.synced.is_set() and r.absent is None


# found by make fuzz (claim and slice watches): inputs that crashed the watch cache or were misread


def test_an_allocation_with_no_results_holds_nothing_and_is_not_an_error():
    # was ClaimError "results must be a list, got tuple": the empty list was replaced by ()
    assert claim_usage(claim("c", results=[])) is None


def test_slice_fields_of_the_wrong_type_are_read_as_missing():
    bad = a_slice("n1")
    bad["spec"]["devices"][0]["capacity"] = [True, None]  # was AttributeError: 'list' has no 'get'
    bad["spec"]["devices"][0]["attributes"]["uuid"] = [1, 2]
    bad["spec"]["devices"][1] = "gpu-1"
    got = slice_devices([bad])
    assert list(got) == [("n1", "gpu-0")]
    assert got[("n1", "gpu-0")]["total"] == {"memory": 0, "cores": 0, "shares": 0}
    assert got[("n1", "gpu-0")]["uuid"] == ""
    assert slice_devices([{"spec": {"driver": "gpu.hami.io", "pool": "n1", "devices": {"a": 1}}}]) == {}


def test_the_watch_cache_takes_malformed_slices_and_claims_without_an_exception(state):
    odd = a_slice("n1")
    odd["spec"]["nodeName"] = {"watch": [1]}  # was TypeError: unhashable type (the recount's node set)
    state.slice_handler.apply("ADDED", odd)
    assert sorted(state.dra_devices) == [("n1", "gpu-0"), ("n1", "gpu-1")]
    state.slice_handler.apply("MODIFIED", {"metadata": {"name": odd["metadata"]["name"]}, "spec": [1]})
    assert state.dra_devices == {}
    nameless = claim("c", results=[result("n1")])
    nameless["metadata"] = []  # was AttributeError in the cache's key; now the key ClaimUsage has too
    state.claim_handler.apply("ADDED", nameless)
    assert sorted(state.claims) == ["/"] and state.ledger.claim_keys() == ["/"]
    state.claim_handler.apply("DELETED", nameless)
    assert state.claims == {} and state.ledger.claim_keys() == []


def asking(name: str, memory: str = "3000Mi", cores: str = "25", **kw) -> dict:
    """A claim whose request names its amounts (claim(): the class's defaults, counting nothing)."""
    c = claim(name, **kw)
    c["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": memory, "cores": cores}}
    return c


def test_a_claim_counts_what_it_asks_from_its_creation_and_what_it_holds_once_allocated(state):
    """As Kubernetes' own quota counts claims: from creation. Counting allocated claims only let
    claims created together all pass the webhook (kube-scheduler allocates without any quota)."""
    state.claim_handler.apply("ADDED", asking("w"))  # not allocated yet: it asks 3000 MiB, 25 cores
    assert room(state) == (5000, 35) and state.waiting_claims == {"team-a/w": (3000, 25)}
    allocated = asking("w", results=[result("n1", memory="2000Mi", cores="20")], rv="6")
    state.claim_handler.apply("MODIFIED", allocated)  # counted once, as what it holds
    assert room(state) == (6000, 40) and not state.waiting_claims and "team-a/w" in state.claims
    state.claim_handler.apply("MODIFIED", asking("w", rv="7"))  # deallocated: it still asks
    assert room(state) == (5000, 35) and "team-a/w" not in state.claims
    state.claim_handler.replace([])  # a relist without it
    assert room(state) == (8000, 60) and not state.waiting_claims
    state.claim_handler.apply("ADDED", asking("x"))
    state.claim_handler.apply("DELETED", asking("x"))
    assert room(state) == (8000, 60)
    state.claim_handler.apply("ADDED", asking("all", memory="1Gi", cores="1"))
    state.claim_handler.apply("ADDED", claim("defaults"))  # no amounts, no GPU published: nothing to count yet
    assert room(state) == (8000 - 1024, 59)


def claim_room(s: ClusterState, ns: str = "team-a") -> tuple:
    return s.claim_room(ns, CFG.vendors).room["NVIDIA"]


def test_claims_admitted_together_see_each_other_until_their_watch_events_arrive(state):
    from hami.scheduler.state import ADMITTED_CLAIM_TTL

    state.admit_claim(asking("a"), 100.0, CFG.vendors)
    assert claim_room(state) == (5000, 35)
    assert room(state) == (8000, 60)  # only the claim check counts admissions: not pods, not Filter
    generated = asking("")
    generated["metadata"]["generateName"] = "pod-gpu-"  # named by the API server after admission
    state.admit_claim(generated, 100.5, CFG.vendors)
    assert claim_room(state) == (2000, 10)
    # their watch events: each counts as itself, the admissions no more (nothing counted twice)
    state.claim_handler.apply("ADDED", asking("a"))
    state.claim_handler.apply("ADDED", asking("pod-gpu-x7k2q"))
    assert claim_room(state) == room(state) == (2000, 10)
    assert sorted(state.waiting_claims) == ["team-a/a", "team-a/pod-gpu-x7k2q"]
    # an admission whose create the API server refused afterwards stops counting after the TTL
    state.admit_claim(asking("refused-later", memory="1000Mi", cores="5"), 200.0, CFG.vendors)
    assert claim_room(state) == (1000, 5)
    state.expire_admitted(200.0 + ADMITTED_CLAIM_TTL - 0.1)
    assert claim_room(state) == (1000, 5)
    state.expire_admitted(200.0 + ADMITTED_CLAIM_TTL)
    assert claim_room(state) == (2000, 10)
    # another namespace's claim of the same shape answers no admission of this one
    state.admit_claim(asking("b"), 300.0, CFG.vendors)
    state.claim_handler.apply("ADDED", asking("b", ns="team-b"))
    assert claim_room(state) == (2000 - 3000, 10 - 25)


def test_an_admission_is_answered_by_its_own_claim_only(state):
    """Overlapping generateName prefixes: the longest prefix (an exact name first) answers; a name
    deleted and created again (a new uid, seen in a relist) answers a new admission; odd names
    are no crash."""
    for prefix, at in (("a-", 1.0), ("a-b-", 1.1)):
        gen = asking("")
        gen["metadata"]["generateName"] = prefix
        state.admit_claim(gen, at, CFG.vendors)
    assert claim_room(state) == (2000, 10)
    state.claim_handler.apply("ADDED", asking("a-b-xxxxx"))  # answers a-b-, not a-
    state.claim_handler.apply("ADDED", asking("a-qwert"))  # answers a-
    assert claim_room(state) == room(state) == (2000, 10)
    state.claim_handler.replace([])
    state.admit_claim(asking("foo"), 2.0, CFG.vendors)
    state.claim_handler.replace([asking("foo")])
    state.admit_claim(asking("foo"), 3.0, CFG.vendors)  # deleted and made again meanwhile
    again = asking("foo")
    again["metadata"]["uid"] = "uid-foo-2"
    state.claim_handler.replace([again])  # a relist shows the new one
    assert claim_room(state) == room(state) == (5000, 35)
    odd = asking("x")
    odd["metadata"]["name"] = 7
    state.claim_handler.apply("ADDED", odd)  # logged or dropped, never an exception
    odd["metadata"] = "not an object"
    state.admit_claim(odd, 4.0, CFG.vendors)


def test_a_claim_being_deleted_counts_what_it_holds_not_what_it_asks(state):
    going = asking("going")
    going["metadata"]["deletionTimestamp"] = "2026-11-29T20:00:00Z"
    state.claim_handler.apply("MODIFIED", going)  # deallocated on its way out
    assert room(state) == (8000, 60) and not state.waiting_claims


def test_no_quota_no_admission_recorded(state):
    state.admit_claim(asking("free", ns="no-quota"), 1.0, CFG.vendors)
    assert not state._admitted


def test_a_waiting_claim_without_a_memory_amount_counts_the_largest_published_gpu(state):
    """Found by review (30 Nov): such a claim counted 0 MiB until allocated; once allocated it
    holds a whole card's. It now counts the largest GPU published from its creation."""
    state.slice_handler.replace([a_slice("n1"), resource_slice("n2", [Gpu(0, "GPU-n2-0", 40960)], SliceSettings())])
    assert state.claim_sizes() == {"gpu.hami.io": 40960, "whole-gpu.hami.io": 40960}
    state.claim_handler.apply("ADDED", claim("defaults"))  # a share with no amounts: all of a GPU's memory
    assert state.waiting_claims == {"team-a/defaults": (40960, 0)}
    assert room(state) == (8000 - 40960, 60)
    # allocated on n1's 15360 MiB GPU: counted as what it holds
    state.claim_handler.apply("MODIFIED", claim("defaults", results=[result("n1", memory=None, cores=None)], rv="6"))
    assert room(state) == (8000 - 15360, 60 - 100) and not state.waiting_claims
    # the pod check and the claim check both see the sizes; n2 gone: the largest is n1's
    state.slice_handler.apply("DELETED", resource_slice("n2", [Gpu(0, "GPU-n2-0", 40960)], SliceSettings()))
    assert state.pod_room("team-a", CFG.vendors).claim_sizes == {"gpu.hami.io": 15360, "whole-gpu.hami.io": 15360}
    assert state.claim_room("team-a", CFG.vendors).claim_sizes["whole-gpu.hami.io"] == 15360
    state.slice_handler.replace([])
    assert state.claim_sizes() == {} and state.pod_room("team-a", CFG.vendors).claim_sizes == {}
