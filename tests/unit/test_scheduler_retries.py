"""Answers kept across Filters (issue 29): the retry of an unschedulable pod answered from the
previous answer, the memory ceilings kept per device list, the ledger's generations that say
when either is stale, and the quantity memo. Each test changes one thing an answer reads and
fails if the kept answer were given again."""

from __future__ import annotations

import copy

import pytest

from hami.core.codec import encode_node_devices_json
from hami.core.errors import RequestError
from hami.core.ledger import Ledger, make_allocation
from hami.core.quantity import parse_int_quantity
from hami.core.refuse import MemoryCeilings
from hami.core.types import ContainerDevice, DeviceInfo, NodeDevices
from hami.scheduler.retries import RetryAnswers
from hami.vendors import build_vendors

from .test_scheduler_extender import args, seen, service
from .test_scheduler_state import node, pod


def bigger(name: str, gpus: int = 1, mem: int = 4000) -> dict:
    """Node ``name`` registering GPUs of ``mem`` MiB (``node`` registers 1000 MiB ones)."""
    obj = node(name, gpus=gpus)
    devs = [
        DeviceInfo(id=f"{name}-g{i}", index=i, count=10, devmem=mem, devcore=100, type="NVIDIA-T4", health=True)
        for i in range(gpus)
    ]
    obj["metadata"]["annotations"]["hami.io/node-nvidia-register"] = encode_node_devices_json(devs)
    obj["metadata"]["resourceVersion"] = "2"
    return obj


def again(p: dict, rv: str, mem: int | None = None) -> dict:
    """The same pod (same UID) as a later revision, asking ``mem`` MiB when given."""
    q = copy.deepcopy(p)
    q["metadata"]["resourceVersion"] = rv
    if mem is not None:
        q["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = mem
    return q


async def test_a_retry_with_nothing_changed_is_answered_from_the_previous_answer():
    svc = service(node("n1"), node("n2"))
    ext = svc.extender
    big = seen(svc, pod("big", mem=1500))
    first = await ext.filter(args(big, ["n1", "n2"]))
    assert first["NodeNames"] == [] and set(first["FailedAndUnresolvableNodes"]) == {"n1", "n2"}
    second = await ext.filter(args(big, ["n1", "n2"]))
    assert second == first
    assert ext.stats["filter_retry_answered"] == 1 and ext.retries.hits == 1


async def test_a_node_registering_bigger_gpus_ends_the_kept_answer():
    svc = service(node("n1"), node("n2"))
    ext = svc.extender
    big = seen(svc, pod("big", mem=1500))
    assert (await ext.filter(args(big, ["n1", "n2"])))["NodeNames"] == []
    svc.state.node_handler.apply("MODIFIED", bigger("n2"))
    assert (await ext.filter(args(big, ["n1", "n2"])))["NodeNames"] == ["n2"]
    assert ext.stats["filter_retry_answered"] == 0


async def test_a_pod_leaving_a_full_node_ends_the_kept_answer():
    svc = service(node("n1", gpus=1))
    ext = svc.extender
    held = pod("held", node_name="n1", uuid="n1-g0", mem=900)
    svc.state.pod_handler.apply("ADDED", held)
    want = seen(svc, pod("want", mem=500))
    first = await ext.filter(args(want, ["n1"]))
    assert first["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"}
    assert (await ext.filter(args(want, ["n1"])))["NodeNames"] == []  # kept
    svc.state.pod_handler.apply("DELETED", held)
    assert (await ext.filter(args(want, ["n1"])))["NodeNames"] == ["n1"]


async def test_the_pods_own_change_or_other_candidates_end_the_kept_answer():
    svc = service(node("n1"), bigger("n2"))
    ext = svc.extender
    big = seen(svc, pod("big", mem=1500))
    assert (await ext.filter(args(big, ["n1"])))["NodeNames"] == []
    # other candidates: n2 has the memory
    assert (await ext.filter(args(big, ["n1", "n2"])))["NodeNames"] == ["n2"]
    small = seen(svc, pod("small", mem=1500))
    assert (await ext.filter(args(small, ["n1"])))["NodeNames"] == []
    # the same pod (UID) edited to ask less: a new question
    assert (await ext.filter(args(seen(svc, again(small, "2", mem=500)), ["n1"])))["NodeNames"] == ["n1"]
    assert ext.stats["filter_retry_answered"] == 0


async def test_a_quota_change_ends_the_kept_answer():
    svc = service(node("n1"))
    ext = svc.extender
    quota = {
        "metadata": {"name": "q", "namespace": "ns", "resourceVersion": "1"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "100"}},
    }
    svc.state.quota_handler.apply("ADDED", quota)
    p = seen(svc, pod("p", mem=500))
    assert (await ext.filter(args(p, ["n1"])))["NodeNames"] == []
    assert (await ext.filter(args(p, ["n1"])))["NodeNames"] == []  # kept
    svc.state.quota_handler.apply("DELETED", quota)
    assert (await ext.filter(args(p, ["n1"])))["NodeNames"] == ["n1"]


def test_retry_answers_are_bounded_in_pods_and_nodes():
    cache = RetryAnswers(max_pods=2, max_nodes=5)
    row = lambda k: [("text", ("Code",), False, [f"n{i}" for i in range(k)])]  # noqa: E731
    cache.put("a", (1,), row(2), ["line"])
    cache.put("b", (1,), row(2), ["line"])
    cache.put("c", (1,), row(2), ["line"])  # three pods: the oldest goes
    assert cache.get("a", (1,)) is None and len(cache) == 2
    cache.put("d", (1,), row(3), ["line"])  # 2 + 2 + 3 nodes > 5: the oldest goes
    assert cache.get("b", (1,)) is None and cache.get("d", (1,)) is not None
    assert cache.get("d", (2,)) is None and len(cache) == 1  # another version: dropped
    cache.put("e", (1,), row(6), ["line"])  # larger than the whole bound: not kept
    assert cache.get("e", (1,)) is None


def _nodes(name: str, mem: int) -> NodeDevices:
    devs = [
        DeviceInfo(
            id=f"{name}-g0", index=0, count=10, devmem=mem, devcore=100, type="NVIDIA-T4", health=True, vendor="NVIDIA"
        )
    ]
    return NodeDevices(name=name, devices=tuple(devs))


def test_ledger_generations_move_with_every_change_a_filter_reads():
    vendors = build_vendors()
    ledger = Ledger()
    steps = []

    def step(what, fn, devices_too=False):
        g, d = ledger.generation(), ledger.device_generation()
        fn()
        assert ledger.generation() != g, what
        assert (ledger.device_generation() != d) == devices_too, what
        steps.append(what)

    step("node added", lambda: ledger.set_node(_nodes("n1", 1000)), devices_too=True)
    step("node's devices changed", lambda: ledger.set_node(_nodes("n1", 2000)), devices_too=True)
    step("node written again unchanged", lambda: ledger.set_node(_nodes("n1", 2000)))
    p = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"containers": [{"name": "c"}]}}
    alloc = make_allocation(p, "n1", {"NVIDIA": ((ContainerDevice("n1-g0", "NVIDIA", 100, 1),),)})
    step("pod reserved", lambda: ledger.reserve(alloc))
    step("pod removed", lambda: ledger.remove_pod(alloc.key))
    elsewhere = make_allocation(p, "gone", {"NVIDIA": ((ContainerDevice("x", "NVIDIA", 100, 1),),)})
    step("pod on a node the ledger lacks (namespace usage)", lambda: ledger.add_pod(elsewhere))
    step("quota set", lambda: ledger.set_quota("ns", "q", {"limits.nvidia.com/gpumem": "1"}, vendors))
    step("quota removed", lambda: ledger.remove_quota("ns", "q"))
    step("claim counted", lambda: ledger.set_claim("ns/c", "ns", "NVIDIA", 10, 1))
    step("claim removed", lambda: ledger.remove_claim("ns/c"))
    step("node removed", lambda: ledger.remove_node("n1"), devices_too=True)
    assert len(steps) == 11


def test_memory_ceilings_follow_the_device_lists():
    vendors = build_vendors()
    ledger = Ledger()
    ledger.set_node(_nodes("n1", 1000))
    ledger.set_node(_nodes("n2", 4000))
    ceilings = MemoryCeilings()
    assert ceilings.below(ledger, "NVIDIA", 2000) == {"n1"}
    ledger.set_node(_nodes("n1", 8000))  # re-registered bigger: no longer under the ceiling
    assert ceilings.below(ledger, "NVIDIA", 2000) == frozenset()
    ledger.set_node(_nodes("n3", 500))  # a small node joins
    assert ceilings.below(ledger, "NVIDIA", 2000) == {"n3"}
    ledger.remove_node("n3")
    assert ceilings.below(ledger, "NVIDIA", 2000) == frozenset()
    assert ceilings.below(ledger, "Other", 2000) == frozenset()  # a vendor no node has
    assert vendors  # (the vendor table builds)


@pytest.mark.parametrize("value", ["1500m", "lots", "", "1e400", 1.5])
def test_the_quantity_memo_keeps_each_error_naming_its_field(value):
    for where in ("first.field", "second.field"):
        with pytest.raises(RequestError, match=where):
            parse_int_quantity(value, where)


def test_the_quantity_memo_gives_the_parsed_values():
    assert [parse_int_quantity(v, "f") for v in ("80", "80", "1Gi", " 2k ", 7, "0.5Ki")] == [
        80,
        80,
        2**30,
        2000,
        7,
        512,
    ]
    with pytest.raises(RequestError, match="out of range"):
        parse_int_quantity(2**63, "f")
