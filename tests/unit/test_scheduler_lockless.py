"""The lockless bind path (docs/scheduler.md, "Bind on a node that injects at creation"): on a node
whose agent gives each container its grant at creation (``hami.io/node-injection: nri``), a pod
asking for NVIDIA GPUs only is bound without the node lock and that node is never busy for it;
every other node and every other pod keeps HAMi's lock. A Binding the API server refuses leaves
no reservation, on either path."""

from __future__ import annotations

import asyncio
import time

import pytest

from hami.core import SchedulerConfig
from hami.core.names import NODE_INJECTION
from hami.kube import nodelock
from hami.kube.client import KubeError
from hami.scheduler.events import EventRecorder
from hami.scheduler.extender import CUT_BINDING_LIVES
from hami.scheduler.options import Options
from hami.scheduler.server import SchedulerService

from .test_scheduler_extender import FakeDecisionApi, args, finished, seen
from .test_scheduler_state import node, pod


def nri(n: dict) -> dict:
    n["metadata"]["annotations"][NODE_INJECTION] = "nri"
    return n


def bind_args(name: str, chosen: str) -> dict:
    return {"PodName": name, "PodNamespace": "ns", "PodUID": f"uid-{name}", "Node": chosen}


def setup(n1: dict, n2: dict, *names: str, api_class: type = FakeDecisionApi):
    svc = SchedulerService(Options(), None)
    svc.state.node_handler.replace([n1, n2])
    pods_ = [pod(n, mem=600) for n in names]
    for p in pods_:
        svc.state.apply_pod("ADDED", p)
    api = api_class(svc.state.nodes["n1"], pods_)
    api.nodes["n2"] = svc.state.nodes["n2"]
    svc.extender.kube = api
    svc.extender.events = EventRecorder(object(), "hami-scheduler")
    return svc, api


def locks(api) -> dict[str, str]:
    return {
        name: n["metadata"]["annotations"][nodelock.NODE_LOCK]
        for name, n in api.nodes.items()
        if nodelock.NODE_LOCK in n["metadata"]["annotations"]
    }


@pytest.mark.parametrize(
    "annotation, vendors, expected",
    [
        ("nri", {"NVIDIA"}, True),
        ("nri", {"NVIDIA", "DCU"}, False),  # the other vendor's plugin finds its pod by the lock
        ("nri", {"DCU"}, False),
        ("nri", set(), False),
        ("allocate", {"NVIDIA"}, False),
        ("NRI", {"NVIDIA"}, False),  # exact value only
        (None, {"NVIDIA"}, False),
    ],
)
def test_lockless_needs_an_injecting_node_and_nvidia_only(annotation, vendors, expected):
    n = node("n1")
    if annotation is not None:
        n["metadata"]["annotations"][NODE_INJECTION] = annotation
    assert nodelock.lockless(n, vendors) is expected
    assert nodelock.lockless(None, {"NVIDIA"}) is False


async def test_a_bind_on_an_injecting_node_writes_no_lock_and_carries_the_decision():
    svc, api = setup(nri(node("n1")), nri(node("n2")), "a")
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    assert ext.busy_nodes() == {}  # a lockless bind is never in flight
    assert (await ext.bind(bind_args("a", chosen))) == {"Error": ""}
    assert api.patches == 0 and locks(api) == {}  # no node write at all
    (binding,) = api.bindings
    ann = binding["metadata"]["annotations"]
    # nothing is left for a device plugin: the Binding completes the allocation (no later pod write)
    assert ann["hami.io/vgpu-node"] == chosen and ann["hami.io/bind-phase"] == "success"
    assert ann["hami.io/vgpu-devices-allocated"] and ann["hami.io/bind-time"]
    assert ann["hami.io/vgpu-devices-to-allocate"] == ";" * len(svc.state.pod("ns", "a")["spec"]["containers"])
    assert ext.stats["bind_lockless"] == 1
    svc.state.apply_pod("MODIFIED", api.pods["a"])  # the bound pod's event confirms the reservation
    assert not svc.state.ledger.is_reserved("uid-a") and svc.state.ledger.pod("uid-a").node == chosen


async def test_binpack_keeps_packing_an_injecting_node_under_a_burst():
    """Ten pods filtered before any finishes: on plain nodes Filter moves on from a node with
    binds in flight (busy); on injecting nodes it packs the first node as one-by-one would."""
    for injecting, expected in ((True, ["n1"] * 10), (False, None)):
        make = nri if injecting else (lambda n: n)
        svc = SchedulerService(Options(), None)
        svc.state.node_handler.replace([make(node("n1", gpus=1)), make(node("n2", gpus=1))])
        ext = svc.extender
        ext.busy_wait = 0
        svc.state.config = SchedulerConfig(svc.state.vendors, node_policy="binpack")
        got = [
            (await ext.filter(args(seen(svc, pod(f"p{i}", mem=50)), ["n1", "n2"])))["NodeNames"][0] for i in range(10)
        ]
        if injecting:
            assert got == expected and ext.busy_nodes() == {}
        else:
            assert set(got) == {"n1", "n2"} and ext.busy_nodes()  # spread by the busy rule


async def test_a_mixed_cluster_keeps_the_lock_on_the_nodes_that_do_not_inject():
    svc, api = setup(nri(node("n1", gpus=1)), node("n2", gpus=1), "a", "b")
    ext = svc.extender
    assert (await ext.filter(args(svc.state.pod("ns", "a"), ["n1"])))["NodeNames"] == ["n1"]
    assert (await ext.filter(args(svc.state.pod("ns", "b"), ["n2"])))["NodeNames"] == ["n2"]
    assert ext.busy_nodes() == {"n2": 1}  # only the locked bind is in flight
    assert (await ext.bind(bind_args("a", "n1"))) == {"Error": ""}
    assert (await ext.bind(bind_args("b", "n2"))) == {"Error": ""}
    assert set(locks(api)) == {"n2"} and nodelock.owned_by(locks(api)["n2"], "ns", "b")
    assert ext.stats["bind_lockless"] == 1
    phases = {b["metadata"]["name"]: b["metadata"]["annotations"]["hami.io/bind-phase"] for b in api.bindings}
    assert phases == {"a": "success", "b": "allocating"}  # the locked node's plugin still has Allocate to do
    to_allocate = {
        b["metadata"]["name"]: b["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] for b in api.bindings
    }
    assert to_allocate["a"] == ";" and to_allocate["b"].strip(";")  # b's is still there for Allocate


async def test_a_pod_asking_for_another_vendor_too_takes_the_lock_on_an_injecting_node():
    """NVIDIA + Hygon DCU in one pod, on a node that injects NVIDIA grants at creation: the DCU
    plugin still finds its pod through hami.io/mutex.lock, so the Bind takes it."""
    from hami.config import chart_device_config
    from hami.vendors import build_vendors

    svc, api = setup(nri(node("n1")), node("n2"), "a")
    svc.state.vendors = build_vendors(chart_device_config())
    mixed = pod("a", node_name="n1", uuid="n1-g0")  # the decision is on the pod (as with decision_write filter)
    mixed["spec"]["containers"][0]["resources"]["limits"]["hygon.com/dcunum"] = 1
    svc.state.apply_pod("MODIFIED", mixed)
    api.pods["a"] = mixed
    assert svc.extender._wanted(mixed) == {"NVIDIA", "DCU"}
    assert (await svc.extender.bind(bind_args("a", "n1"))) == {"Error": ""}
    assert nodelock.owned_by(locks(api).get("n1"), "ns", "a")
    assert svc.extender.stats["bind_lockless"] == 0


class RefusingApi(FakeDecisionApi):
    """The API server refuses every Binding (an admission policy, say): nothing is bound."""

    status = 422

    async def post(self, path, body):
        self.bindings.append(body)
        raise KubeError("POST", path, self.status, '{"message": "binding denied by policy"}')


class TimeoutApi(FakeDecisionApi):
    """The Binding POST times out and the pod, read again, is not bound (yet)."""

    async def post(self, path, body):
        self.bindings.append(body)
        raise asyncio.TimeoutError()


@pytest.mark.parametrize("injecting", [True, False])
async def test_a_binding_the_api_server_refuses_leaves_no_reservation_and_no_lock(injecting):
    make = nri if injecting else (lambda n: n)
    svc, api = setup(make(node("n1", gpus=1)), make(node("n2", gpus=1)), "a", "b", api_class=RefusingApi)
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    assert svc.state.ledger.is_reserved("uid-a")
    answer = await ext.bind(bind_args("a", chosen))
    assert "binding denied by policy" in answer["Error"] and len(api.bindings) == 1
    assert svc.state.ledger.pod("uid-a") is None  # nothing reserved that is not real
    assert sum(m for n in ("n1", "n2") for _, _, m, _ in svc.state.ledger.device_usage(n)) == 0
    assert locks(api) == {} and ext.busy_nodes() == {}
    assert ext.expire_decisions(time.monotonic() + ext.decision_ttl + 1) == 0  # no decision kept either
    # the capacity is free at once: another pod gets the same place
    assert (await ext.filter(args(svc.state.pod("ns", "b"), [chosen])))["NodeNames"] == [chosen]


async def test_a_filter_while_the_bind_runs_is_refused_and_the_refused_binding_gives_its_share_back():
    """kube-scheduler gave up on a slow Bind and filtered the pod again meanwhile: that Filter is
    refused (it replaced the reservation the Bind then posted anyway: review, 1 Dec), and the
    refusal of the Binding gives the share back; the next Filter decides anew."""
    svc, api = setup(nri(node("n1", gpus=1)), nri(node("n2", gpus=1)), "a", api_class=RefusingApi)
    ext = svc.extender
    first = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    refuse = api.post
    during = []

    async def refilter_then_refuse(path, body):
        during.append(await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))
        await refuse(path, body)

    api.post = refilter_then_refuse
    assert (await ext.bind(bind_args("a", first)))["Error"]
    assert "under way" in during[0]["Error"] and not during[0].get("NodeNames")
    assert svc.state.ledger.pod("uid-a") is None  # refused: nothing of it was real
    assert (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"]
    assert svc.state.ledger.is_reserved("uid-a")


@pytest.mark.parametrize("injecting", [True, False])
async def test_a_binding_that_may_still_land_keeps_its_reservation(injecting):
    """A timeout is no refusal: the Binding may land after the read-back, so its reservation stays
    (dropping it could double-book the GPU) until a re-filter replaces it or it expires."""
    make = nri if injecting else (lambda n: n)
    svc, api = setup(make(node("n1", gpus=1)), make(node("n2", gpus=1)), "a", api_class=TimeoutApi)
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    assert (await ext.bind(bind_args("a", chosen)))["Error"]
    assert svc.state.ledger.is_reserved("uid-a") and svc.state.ledger.pod("uid-a").node == chosen
    # the locked path keeps its lock until the Binding can no longer land, then it goes
    assert set(locks(api)) == (set() if injecting else {chosen})
    await ext.settle_unverified(time.monotonic() + CUT_BINDING_LIVES + 1)
    assert locks(api) == {}
    assert ext.expire_decisions(time.monotonic() + ext.decision_ttl + 1) == 1
    assert svc.state.ledger.pod("uid-a") is None


async def test_a_bound_pod_on_an_injecting_node_counts_in_the_ledger_until_it_goes():
    """No double booking: the bound pod's allocation holds its GPU memory after the reservation
    ends, whether or not the node agent has marked it yet."""
    svc, api = setup(nri(node("n1", gpus=1)), nri(node("n2", gpus=1)), "a", "b", "c")
    ext = svc.extender
    for name in ("a", "b"):
        chosen = (await ext.filter(args(svc.state.pod("ns", name), ["n1", "n2"])))["NodeNames"][0]
        assert (await ext.bind(bind_args(name, chosen))) == {"Error": ""}
        svc.state.apply_pod("MODIFIED", api.pods[name])
    finished(svc, api.pods["a"])
    # 600 of 1000 MiB taken on each node: a third 600 MiB pod fits nowhere
    answer = await ext.filter(args(svc.state.pod("ns", "c"), ["n1", "n2"]))
    assert answer["NodeNames"] == [] and set(answer["FailedNodes"]) == {"n1", "n2"}
