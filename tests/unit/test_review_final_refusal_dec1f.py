"""Nodes where too few GPUs pass the pod's static selection are unresolvable (found by review, 1 Dec).

The extender answered a pod asking ``nvidia.com/gpu: 2`` with ``use-gputype: A100`` on a node of
one A100 and three T4s with ``1/4 AllocatedCardsInsufficientRequest, 3/4 CardTypeMismatch`` in
``FailedNodes``; the same for one healthy GPU beside an unhealthy one (``CardNotHealth``) and for
NUMA binding with one GPU per NUMA node (``NumaNotFit``). kube-scheduler's preemption re-checks
only its own filters, so it could evict pods on such a node and the pod still not fit. Those
nodes now go to ``FailedAndUnresolvableNodes``; a node where eviction would make room stays in
``FailedNodes``; and a node marked final cannot fit the pod even with every pod on it removed
(property: random NVIDIA clusters of mixed models, health, NUMA nodes, MIG and cordons, with the
probe shapes and annotations of ``test_core_refuse``).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.core import Ledger, NodeDevices, SchedulerConfig, filter_pod, schedule_pod
from hami.core.codec import encode_node_devices_json
from hami.core.refuse import MemoryCeilings, _usable
from hami.scheduler.extender import failed_maps
from hami.scheduler.options import Options
from hami.scheduler.server import SchedulerService

from ._corekit import CONFIG, ctr, gpu, ledger, mig_gpu, pod
from .test_core_refuse import ANNOTATIONS, MODELS, SETTINGS, VENDORS, make_pod

A100 = {"nvidia.com/use-gputype": "A100"}
NUMA = {"nvidia.com/numa-bind": "true"}

# one A100 and three T4s; one healthy GPU and one not; two GPUs on two NUMA nodes
MIXED = NodeDevices("n1", (gpu("n1", 0, type_="NVIDIA-A100"),) + tuple(gpu("n1", i) for i in (1, 2, 3)))
SICK = NodeDevices("n2", (gpu("n2", 0), gpu("n2", 1, health=False)))
SPLIT = NodeDevices("n3", (gpu("n3", 0, numa=0), gpu("n3", 1, numa=1)))


def answer(led: Ledger, p: dict, names=None) -> tuple[dict[str, str], dict[str, str]]:
    """``(FailedNodes, FailedAndUnresolvableNodes)`` as the extender answers a pod that fits nowhere."""
    r = filter_pod(p, names, led, CONFIG, 0.0)
    assert r.node is None
    return failed_maps(MemoryCeilings().mark(r.failed, r.pod, led, CONFIG.vendors))


def fill(led: Ledger, node: str, uuids: list[str], mem: int = 16384) -> None:
    """Fill each GPU of ``uuids`` with a pod of ``mem`` MiB (evicting them would make room)."""
    for k, u in enumerate(uuids):
        p = pod(f"fill-{node}-{k}", containers=[ctr(mem=mem)], annotations={"nvidia.com/use-gpuuuid": u})
        assert schedule_pod(p, [node], led, CONFIG, 0.0).node == node


@pytest.mark.parametrize(
    "nd, annotations, text",
    [
        (MIXED, A100, "1/4 AllocatedCardsInsufficientRequest, 3/4 CardTypeMismatch"),
        (SICK, {}, "1/2 AllocatedCardsInsufficientRequest, 1/2 CardNotHealth"),
        (SPLIT, NUMA, "1/2 AllocatedCardsInsufficientRequest, 1/2 NumaNotFit"),
    ],
    ids=["type-mismatch", "unhealthy", "numa"],
)
def test_too_few_gpus_the_pod_could_use_is_unresolvable(nd, annotations, text):
    led = ledger(nd)
    resolvable, unresolvable = answer(led, pod(containers=[ctr(gpu=2, mem=1000)], annotations=annotations))
    assert resolvable == {} and unresolvable == {nd.name: text}


@pytest.mark.parametrize(
    "nd, annotations, full",
    [
        # three T4s, two of them needed: freeing the full ones makes room
        (MIXED, {"nvidia.com/use-gputype": "T4"}, ["GPU-n1-1", "GPU-n1-2", "GPU-n1-3"]),
        # two usable GPUs, both full of other pods' memory
        (NodeDevices("n4", (gpu("n4", 0), gpu("n4", 1))), {}, ["GPU-n4-0", "GPU-n4-1"]),
        # two GPUs on two NUMA nodes, no NUMA binding: either may serve
        (NodeDevices("n7", (gpu("n7", 0, numa=0), gpu("n7", 1, numa=1))), {}, ["GPU-n7-0", "GPU-n7-1"]),
        # NUMA binding: two GPUs on NUMA node 0, full
        (
            NodeDevices("n5", (gpu("n5", 0, numa=0), gpu("n5", 1, numa=0), gpu("n5", 2, numa=1))),
            NUMA,
            ["GPU-n5-0", "GPU-n5-1"],
        ),
    ],
    ids=["three-t4s", "two-full-gpus", "two-numa-nodes-unbound", "numa-node-with-two"],
)
def test_a_node_where_eviction_makes_room_stays_resolvable(nd, annotations, full):
    led = ledger(nd)
    fill(led, nd.name, full)
    resolvable, unresolvable = answer(led, pod(containers=[ctr(gpu=2, mem=1000)], annotations=annotations))
    assert nd.name in resolvable and unresolvable == {}


def test_a_mig_gpu_may_serve_several_picks_so_it_stays_resolvable():
    """One MIG GPU can host both of a container's 2 instances: taken whole, eviction frees it."""
    led = ledger(NodeDevices("m", (mig_gpu("m", 0),)))
    assert schedule_pod(pod("big", containers=[ctr(mem=40192)]), None, led, CONFIG, 0.0).node == "m"
    resolvable, unresolvable = answer(led, pod(containers=[ctr(gpu=2, mem=4000)]))
    assert "m" in resolvable and unresolvable == {}


def test_too_few_gpus_with_the_memory_is_unresolvable():
    """Two GPUs asked of 20000 MiB: only the A100 has that much, the T4s never will."""
    big = NodeDevices("n6", (gpu("n6", 0, mem=81920, type_="NVIDIA-A100-80GB"), gpu("n6", 1), gpu("n6", 2)))
    led = ledger(big)
    resolvable, unresolvable = answer(led, pod(containers=[ctr(gpu=2, mem=20000)]))
    assert resolvable == {} and set(unresolvable) == {"n6"}


def test_the_ceilings_follow_the_count_asked():
    """One MemoryCeilings for every pod: 1 GPU of A100 fits n1 (full: resolvable), 2 never do."""
    led = ledger(MIXED)
    fill(led, "n1", ["GPU-n1-0"])
    ceilings = MemoryCeilings()
    for nums, final in ((2, True), (1, False), (2, True)):
        r = filter_pod(pod(containers=[ctr(gpu=nums, mem=1000)], annotations=A100), None, led, CONFIG, 0.0)
        resolvable, unresolvable = failed_maps(ceilings.mark(r.failed, r.pod, led, CONFIG.vendors))
        assert ("n1" in unresolvable) is final and ("n1" in resolvable) is not final


async def test_the_extender_answers_the_type_mismatch_node_unresolvable():
    """Scenario 1 through ``/filter``: the node goes to ``FailedAndUnresolvableNodes``."""
    devs = (gpu("n1", 0, type_="NVIDIA-A100"),) + tuple(gpu("n1", i) for i in (1, 2, 3))
    node = {
        "metadata": {
            "name": "n1",
            "annotations": {"hami.io/node-nvidia-register": encode_node_devices_json(devs)},
            "labels": {},
            "resourceVersion": "1",
        },
        "status": {"allocatable": {"nvidia.com/gpu": "40"}},
    }
    svc = SchedulerService(Options(), None)
    svc.extender.record = False
    svc.state.node_handler.replace([node])
    p = pod(containers=[ctr(gpu=2, mem=1000)], annotations=A100, admit=False)
    p["metadata"]["resourceVersion"] = "1"
    p["spec"]["schedulerName"] = "hami-scheduler"
    p["status"] = {"phase": "Pending"}
    svc.state.put_pod(p)
    got = await svc.extender.filter({"Pod": p, "NodeNames": ["n1"], "Nodes": None})
    assert got["NodeNames"] == [] and got["FailedNodes"] == {}
    assert got["FailedAndUnresolvableNodes"] == {"n1": "1/4 AllocatedCardsInsufficientRequest, 3/4 CardTypeMismatch"}


# NVIDIA nodes of mixed models, health, NUMA nodes and MIG GPUs, some GPUs cordoned
nvidia_st = st.tuples(
    st.integers(0, 1),  # model
    st.sampled_from((8000, 16384)),
    st.sampled_from((1, 2, 4)),  # slots
    st.sampled_from((True, True, True, True, False)),  # healthy
    st.sampled_from((False, False, False, False, True)),  # MIG
    st.integers(0, 1),  # NUMA node
)
cluster_st = st.lists(st.lists(nvidia_st, min_size=1, max_size=4), min_size=1, max_size=3)
shape_st = st.tuples(st.sampled_from((1, 2, 2, 3)), st.sampled_from((None, 1000, 4000, 9000, 20000, "50%", "100%")))


def nvidia_node(name: str, spec, cordon: tuple[int, ...]) -> NodeDevices:
    devs = []
    for i, (model, mem, count, health, mig, numa) in enumerate(spec):
        if mig:
            devs.append(mig_gpu(name, i, health=health, numa=numa))
        else:
            devs.append(gpu(name, i, mem=mem, count=count, type_=MODELS[model], numa=numa, health=health))
    return NodeDevices(name=name, devices=tuple(devs), cordoned=frozenset(f"GPU-{name}-{i}" for i in cordon))


@SETTINGS
@given(
    cluster_st,
    st.lists(shape_st, max_size=8),
    st.lists(shape_st, min_size=1, max_size=2),
    st.sampled_from(ANNOTATIONS),
    st.sampled_from(("binpack", "spread")),
    st.data(),
)
def test_a_final_refusal_cannot_fit_with_every_pod_removed(nodes, background, probe, annotations, policy, data):
    """Property: every node ``mark`` sets final, and every node ``below`` gives for one of the
    pod's requests (whether it refused the pod or not), refuses the pod on a ledger holding that
    node alone, its GPUs all free and uncordoned (the exact fit)."""
    cfg = SchedulerConfig(VENDORS, node_policy=policy)
    led = Ledger()
    for i, spec in enumerate(nodes):
        led.set_node(nvidia_node(f"n{i}", spec, tuple(data.draw(st.lists(st.integers(0, 3), max_size=1)))))
    for k, shape in enumerate(background):
        schedule_pod(make_pod(f"bg{k}", [("NVIDIA", *shape, None)]), [f"n{k % len(nodes)}"], led, cfg, 0.0)
    p = make_pod("probe", [("NVIDIA", *shape, None) for shape in probe], annotations)
    r = filter_pod(p, None, led, cfg, 0.0)
    ceilings = MemoryCeilings()
    hopeless = {n for n, f in ceilings.mark(r.failed, r.pod, led, VENDORS).items() if f.final}
    nvidia = next(v for v in VENDORS if v.name == "NVIDIA")
    for c in r.pod.containers:
        for req in c.requests:
            memreq = max(req.memreq, 0)
            hopeless |= ceilings.below(led, "NVIDIA", memreq, _usable(nvidia, req, r.pod.annotations), req.nums)
    for n in sorted(hopeless):
        nd = led.node(n)
        empty = Ledger()
        empty.set_node(NodeDevices(name=n, devices=nd.devices))  # no pods, no cordons
        alone = filter_pod(p, [n], empty, cfg, 0.0, exact=True)
        assert alone.node is None, (n, nd.devices)
