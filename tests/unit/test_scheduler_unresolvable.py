"""Where preemption cannot help (``FailedAndUnresolvableNodes``), and the refusal of a node the
scheduler's ``--node-label-selector`` leaves out.

kube-scheduler tries preemption on the nodes listed in ``FailedNodes``; a node whose refusal no
eviction can cure belongs in ``FailedAndUnresolvableNodes``: every GPU unhealthy or cordoned, a
node without a registration, one the node selector leaves out, and a node where no GPU the pod
could use (its type, UUID and health) has the memory it asks, whatever the other GPUs have.
"""

from __future__ import annotations

import pytest

from hami.core import NodeDevices, filter_pod, schedule_pod
from hami.core.reasons import UNREGISTERED
from hami.core.refuse import MemoryCeilings, _usable
from hami.scheduler.extender import failed_maps
from hami.scheduler.options import Options
from hami.scheduler.server import SchedulerService

from ._corekit import CONFIG, ctr, gpu, ledger, mig_gpu, node, pod
from .test_scheduler_state import node as node_obj
from .test_scheduler_state import pod as pod_obj


def answer(led, p):
    """``(FailedNodes, FailedAndUnresolvableNodes)`` as the extender answers a pod that fits nowhere."""
    r = filter_pod(p, None, led, CONFIG, 0.0)
    assert r.node is None
    return failed_maps(MemoryCeilings().mark(r.failed, r.pod, led, CONFIG.vendors))


def test_unhealthy_and_cordoned_nodes_are_unresolvable():
    led = ledger(node("sick", 2, health=False), node("cord", 2, cordoned=(0, 1)))
    resolvable, unresolvable = answer(led, pod(containers=[ctr(mem=1000)]))
    assert resolvable == {}
    assert unresolvable == {"cord": "2/2 CardCordoned", "sick": "2/2 CardNotHealth"}


def test_an_unhealthy_gpu_beside_a_full_one_leaves_the_node_resolvable():
    led = ledger(NodeDevices(name="n", devices=(gpu("n", 0), gpu("n", 1, health=False))))
    full = pod("full", containers=[ctr(mem=16384)], annotations={"nvidia.com/use-gpuuuid": "GPU-n-0"})
    assert schedule_pod(full, None, led, CONFIG, 0.0).node == "n"
    resolvable, unresolvable = answer(led, pod(containers=[ctr(mem=1000)]))
    assert resolvable == {"n": "1/2 CardInsufficientMemory, 1/2 CardNotHealth"} and unresolvable == {}


def test_an_unregistered_node_is_unresolvable():
    assert failed_maps({"off": UNREGISTERED}) == ({}, {"off": "node unregistered"})


MIXED = NodeDevices(name="mix", devices=(gpu("mix", 0, mem=16384), gpu("mix", 1, mem=81920, type_="NVIDIA-A100-80GB")))


@pytest.mark.parametrize(
    "annotations, final",
    [
        ({"nvidia.com/use-gputype": "T4"}, True),  # the only T4 has 16 GiB
        ({"nvidia.com/use-gpuuuid": "GPU-mix-0"}, True),
        ({"nvidia.com/nouse-gpuuuid": "GPU-mix-1"}, True),
        ({"nvidia.com/use-gputype": "A100"}, False),  # the A100 could hold it once freed
        ({}, False),
    ],
)
def test_the_memory_ceiling_is_over_the_gpus_the_pod_could_use(annotations, final):
    led = ledger(MIXED)
    # the A100 full, so that every pod below is refused on mix
    big = pod("big", containers=[ctr(mem=81920)], annotations={"nvidia.com/use-gpuuuid": "GPU-mix-1"})
    assert schedule_pod(big, None, led, CONFIG, 0.0).node == "mix"
    resolvable, unresolvable = answer(led, pod(containers=[ctr(mem=20000)], annotations=annotations))
    assert ("mix" in unresolvable) is final and ("mix" in resolvable) is not final


def test_the_memory_ceiling_leaves_out_unhealthy_gpus():
    led = ledger(NodeDevices(name="mix2", devices=(gpu("mix2", 0), gpu("mix2", 1, mem=81920, health=False))))
    resolvable, unresolvable = answer(led, pod(containers=[ctr(mem=20000)]))
    assert unresolvable == {"mix2": "1/2 CardInsufficientMemory, 1/2 CardNotHealth"} and resolvable == {}


def test_memory_ceilings_are_kept_per_selection():
    """One MemoryCeilings serves every pod: the same size asked with two selections gets two answers."""
    led = ledger(MIXED)
    ceilings = MemoryCeilings()
    for asked, below in (
        ({"nvidia.com/use-gputype": "T4"}, {"mix"}),
        ({}, set()),
        ({"nvidia.com/use-gputype": "T4"}, {"mix"}),
    ):
        p = pod(containers=[ctr(mem=20000)], annotations=asked)
        r = filter_pod(p, None, led, CONFIG, 0.0)
        req = r.pod.containers[0].requests[0]
        vendor = next(v for v in CONFIG.vendors if v.name == "NVIDIA")
        assert ceilings.below(led, "NVIDIA", 20000, _usable(vendor, req, r.pod.annotations)) == below
    assert ceilings.below(led, "NVIDIA", 20000) == frozenset()  # every device counts: the A100 holds it


# ------------------------------------------------------------------ --node-label-selector


def service(*nodes):
    svc = SchedulerService(Options(node_selector={"gpu": "on"}), None)
    svc.extender.record = False
    svc.state.node_handler.replace(list(nodes))
    return svc


def args(p, names):
    return {"Pod": p, "NodeNames": names, "Nodes": None}


async def test_a_node_outside_the_selector_has_a_reason_of_its_own():
    svc = service(node_obj("on", labels={"gpu": "on"}), node_obj("off"))
    p = pod_obj("p", mem=5000)  # more than the 1000 MiB GPUs of "on"
    svc.state.put_pod(p)
    got = await svc.extender.filter(args(p, ["on", "off", "ghost"]))
    assert got["NodeNames"] == []
    assert got["FailedAndUnresolvableNodes"] == {
        "ghost": "node unregistered",
        "off": "NodeLabelSelectorMismatch",
        "on": "2/2 CardInsufficientMemory",
    }


async def test_a_node_leaving_the_selector_changes_the_retry_answer():
    """The node had no GPUs registered (not in the ledger): its labels changing does not move the
    ledger, yet the answer kept for the pod's retries must not be given again."""
    bare = node_obj("late", labels={"gpu": "on"})
    bare["metadata"]["annotations"] = {}
    svc = service(node_obj("on", labels={"gpu": "on"}), bare)
    p = pod_obj("p", mem=5000)
    svc.state.put_pod(p)
    first = await svc.extender.filter(args(p, ["on", "late"]))
    assert first["FailedAndUnresolvableNodes"]["late"] == "node unregistered"
    moved = node_obj("late")
    moved["metadata"]["annotations"] = {}
    moved["metadata"]["resourceVersion"] = "2"
    svc.state.node_handler.apply("MODIFIED", moved)
    again = await svc.extender.filter(args(p, ["on", "late"]))
    assert again["FailedAndUnresolvableNodes"]["late"] == "NodeLabelSelectorMismatch"
    svc.state.node_handler.apply("DELETED", moved)
    assert "late" not in svc.state.unselected


@pytest.mark.parametrize(("mem", "final"), [(40500, True), (40192, False), (30000, False)])
def test_a_mig_gpus_ceiling_is_its_largest_profile(mem, final):
    """An A100-40GB in MIG mode hands out at most 7g.40gb's 40192 of its 40960 MiB: a pod asking
    40500 was resolvable there, so kube-scheduler could evict pods for a pod it would refuse again."""
    led = ledger(NodeDevices(name="m", devices=(mig_gpu("m", 0),)))
    # the GPU taken whole, so that every pod below is refused on m
    assert schedule_pod(pod("big", containers=[ctr(mem=40192)]), None, led, CONFIG, 0.0).node == "m"
    resolvable, unresolvable = answer(led, pod(containers=[ctr(mem=mem)]))
    assert ("m" in unresolvable) is final and ("m" in resolvable) is not final
