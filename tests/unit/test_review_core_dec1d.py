"""Review findings of 1 December on the core's accounting (hami.core.usage, hami.core.fit).

1. A finished init container's GPU stays held: with ``app_only`` a device only classic init
   containers used kept an entry of one slot and no memory, refusing exclusive and mutex pods.
2. A namespace quota checked with the request while the ledger charges the grant: a MIG pick is
   the profile's memory and cores, so a namespace went past its quota about twice over.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hami.core.fit as fitmod
from hami.core import DeviceInfo, Ledger, NodeDevices, filter_pod, schedule_pod
from hami.core.ledger import allocation_from_pod
from hami.core.types import ContainerKind
from hami.core.usage import collapse_picks

from ._corekit import CONFIG, ctr, gpu, mig_gpu, pod

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALLOCATED = "hami.io/vgpu-devices-allocated"
MIG_ALLOCATED = "hami.io/vgpu-mig-allocations"


def _ledger(*nodes: NodeDevices) -> Ledger:
    led = Ledger(CONFIG.vendors)
    for n in nodes:
        led.set_node(n)
    return led


def _finished_job(p: dict, node: str, annotations: dict) -> dict:
    """``p`` placed on ``node`` with ``annotations``, restartPolicy Never, its init container done."""
    p["metadata"]["annotations"].update(annotations)
    p["spec"]["nodeName"] = node
    p["spec"]["restartPolicy"] = "Never"
    p["status"] = {
        "phase": "Running",
        "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
    }
    return p


# ---------------------------------------------------------------------- finding 1: init-rerun


def test_collapse_app_only_leaves_out_a_device_only_init_containers_used():
    """Found by review, 1 Dec: init container on GPU-0, app on GPU-1; after the init phase GPU-0
    must not be held (it was DeviceUse(slots=1, mem=0, cores=0))."""
    kinds = (ContainerKind.INIT, ContainerKind.APP)
    picks = [(0, "NVIDIA", "GPU-0", 6000, 30), (1, "NVIDIA", "GPU-1", 3000, 40)]
    steady = collapse_picks(picks, kinds, app_only=True)
    assert [(u.uuid, u.slots, u.mem, u.cores) for u in steady] == [("GPU-1", 1, 3000, 40)]
    # while the init container may still run, both are held
    both = collapse_picks(picks, kinds)
    assert [(u.uuid, u.slots, u.mem, u.cores) for u in both] == [("GPU-0", 1, 6000, 30), ("GPU-1", 1, 3000, 40)]
    # a device shared by init and app containers keeps the app's share only
    shared = [(0, "NVIDIA", "GPU-0", 6000, 30), (1, "NVIDIA", "GPU-0", 3000, 40)]
    assert [(u.slots, u.mem, u.cores) for u in collapse_picks(shared, kinds, app_only=True)] == [(1, 3000, 40)]


def test_finished_init_container_frees_its_gpu_for_exclusive_and_mutex_pods():
    """Found by review, 1 Dec: a restartPolicy Never Job, init container granted GPU-n-0, app
    GPU-n-1, init exited 0: GPU-n-0 stayed used=1, so an exclusive nvidia.com/gpu: 1 pod or a
    mutex pod pinned to it was refused ExclusiveDeviceAllocateConflict for the Job's life."""
    led = _ledger(NodeDevices("n", (gpu("n", 0), gpu("n", 1))))
    p = _finished_job(
        pod("job", [ctr("app", gpu=1)], init=[ctr("init", gpu=1)]),
        "n",
        {"hami.io/vgpu-node": "n", ALLOCATED: "GPU-n-0,NVIDIA,16384,100:;GPU-n-1,NVIDIA,16384,100:;"},
    )
    alloc = allocation_from_pod(p, CONFIG.vendors)
    assert alloc is not None and alloc.app_only
    assert [u.uuid for u in alloc.usage] == ["GPU-n-1"]
    led.add_pod(alloc)
    assert {d.id: (u, m, c) for d, u, m, c in led.device_usage("n")} == {
        "GPU-n-0": (0, 0, 0),
        "GPU-n-1": (1, 16384, 100),
    }
    for policy in ({}, {"hami.io/gpu-scheduler-policy": "mutex"}):
        q = pod("other", [ctr("c", gpu=1)], annotations={**policy, "nvidia.com/use-gpuuuid": "GPU-n-0"})
        r = filter_pod(q, None, led, CONFIG, 0)
        assert r.node == "n", (policy, r.reasons())
        assert r.annotations[ALLOCATED].startswith("GPU-n-0,"), policy


def test_finished_init_container_on_a_mig_gpu_keeps_its_slice_but_not_the_gpu():
    """Found by review, 1 Dec (MIG case): the init container's 3g.20gb instance on GPU-m-0, the app
    on GPU-m-1. After the init phase GPU-m-0 holds no slot (it held one, with 0 MiB, refusing a
    mutex pod); the init container's slice stays reserved (slices last the pod's life), the GPU
    is not marked inconsistent, and a new instance is placed clear of the reserved one."""
    nodes = NodeDevices("m", (mig_gpu("m", 0), mig_gpu("m", 1)))
    p = pod("job", [ctr("app", gpu=1, mem=40000)], init=[ctr("init", gpu=1, mem=15000)])
    placed = schedule_pod(p, None, _ledger(nodes), CONFIG, 0)
    assert placed.node == "m", placed.reasons()
    alloc = allocation_from_pod(_finished_job(p, "m", dict(placed.annotations)), CONFIG.vendors)
    assert alloc is not None and alloc.app_only
    held = {s.uuid: (s.start, s.size) for s in alloc.slices}
    assert held == {"GPU-m-0": (4, 4), "GPU-m-1": (0, 8)}
    assert [u.uuid for u in alloc.usage] == ["GPU-m-1"]

    led = _ledger(nodes)
    led.add_pod(alloc)
    assert {d.id: (d.health, u, m) for d, u, m, _ in led.device_usage("m")} == {
        "GPU-m-0": (True, 0, 0),
        "GPU-m-1": (True, 1, 40192),
    }
    assert all(d.health for d in led.view("m").devices)  # recheck_slices finds nothing inconsistent
    assert [(s.start, s.size) for s in led.slices("m")["GPU-m-0"]] == [(4, 4)]
    q = pod(
        "other",
        [ctr("c", gpu=1, mem=15000)],
        annotations={"hami.io/gpu-scheduler-policy": "mutex", "nvidia.com/use-gpuuuid": "GPU-m-0"},
    )
    r = filter_pod(q, None, led, CONFIG, 0)
    assert r.node == "m", r.reasons()
    assert '"gpuUUID":"GPU-m-0"' in r.annotations[MIG_ALLOCATED]
    assert '"placement":{"start":0,"size":4}' in r.annotations[MIG_ALLOCATED]  # clear of the held 4..8


# ---------------------------------------------------------------------- finding 2: quota on MIG


def _quota_ledger(devices, hard: dict) -> Ledger:
    led = _ledger(NodeDevices("m", tuple(devices)))
    led.set_quota("a", "q", hard, CONFIG.vendors)
    return led


def test_mig_rounding_does_not_take_a_namespace_past_its_memory_quota():
    """Found by review, 1 Dec: limits.nvidia.com/gpumem 20000, pod nvidia.com/gpu 2 x 10000 MiB,
    10 cores on an A100-40GB in MIG mode: two 3g.20gb picks charged 39936 MiB (the quota probe
    counted 20000). The pod must be refused ResourceQuotaNotFit and nothing charged."""
    led = _quota_ledger([mig_gpu("m", 0)], {"limits.nvidia.com/gpumem": "20000"})
    r = schedule_pod(pod("x", [ctr("c", gpu=2, mem=10000, cores=10)], ns="a"), None, led, CONFIG, 0)
    assert r.node is None
    assert r.reasons() == {"m": "1/1 ResourceQuotaNotFit"}
    assert led.namespace_usage("a", "NVIDIA") == (0, 0)


def test_mig_rounding_does_not_take_a_namespace_past_its_cores_quota():
    """Found by review, 1 Dec: limits.nvidia.com/gpucores 50, two 10000 MiB / 10-core picks on a
    MIG GPU are charged 39 cores each (3g.20gb): 78 > 50. Two 4000 MiB picks (1g.5gb, 13 cores
    each: 26) still fit."""
    hard = {"limits.nvidia.com/gpucores": "50"}
    led = _quota_ledger([mig_gpu("m", 0)], hard)
    r = schedule_pod(pod("x", [ctr("c", gpu=2, mem=10000, cores=10)], ns="a"), None, led, CONFIG, 0)
    assert r.node is None and r.reasons() == {"m": "1/1 ResourceQuotaNotFit"}
    r = schedule_pod(pod("y", [ctr("c", gpu=2, mem=4000, cores=10)], ns="a"), None, led, CONFIG, 0)
    assert r.node == "m", r.reasons()
    assert led.namespace_usage("a", "NVIDIA") == (2 * 4864, 2 * 13)


def test_mig_rounding_over_quota_moves_the_pick_to_the_next_device():
    """Found by review, 1 Dec: limits.nvidia.com/gpumem 15000, one 10000 MiB pick: the MIG GPU
    (ranked first) would charge 19968; the hami-core GPU beside it charges 10000 and takes it, for
    the first-fit walk and the topology-aware choice alike."""
    for policy in ({"hami.io/gpu-scheduler-policy": "spread"}, {"hami.io/gpu-scheduler-policy": "topology-aware"}):
        led = _quota_ledger([mig_gpu("m", 0), gpu("m", 1)], {"limits.nvidia.com/gpumem": "15000"})
        r = schedule_pod(pod("x", [ctr("c", gpu=1, mem=10000)], ns="a", annotations=policy), None, led, CONFIG, 0)
        assert r.node == "m", (policy, r.reasons())
        assert r.annotations[ALLOCATED] == "GPU-m-1,NVIDIA,10000,0:;", policy
        assert led.namespace_usage("a", "NVIDIA") == (10000, 0)
        # without a quota the MIG GPU is the first choice (the quota is what moved the pick)
        free = _ledger(NodeDevices("m", (mig_gpu("m", 0), gpu("m", 1))))
        r = filter_pod(pod("x", [ctr("c", gpu=1, mem=10000)], ns="a", annotations=policy), None, free, CONFIG, 0)
        assert r.annotations[ALLOCATED].startswith("GPU-m-0,"), policy


def test_mig_rounding_over_quota_refuses_a_topology_aware_combination():
    """Found by review, 1 Dec (topology-aware choice): two MIG GPUs, two 10000 MiB picks, quota
    30000 MiB: each pick alone fits (19968) and the request (20000) fits, but the two grants charge
    39936: refused ResourceQuotaNotFit, not placed past the quota."""
    led = _quota_ledger([mig_gpu("m", 0), mig_gpu("m", 1)], {"limits.nvidia.com/gpumem": "30000"})
    p = pod("x", [ctr("c", gpu=2, mem=10000)], ns="a", annotations={"hami.io/gpu-scheduler-policy": "topology-aware"})
    r = schedule_pod(p, None, led, CONFIG, 0)
    assert r.node is None
    assert "ResourceQuotaNotFit" in r.reasons()["m"]
    assert led.namespace_usage("a", "NVIDIA") == (0, 0)


def test_mig_rounding_counts_the_earlier_containers_grants():
    """Guard for the review fix of 1 Dec: the charged check counts the pod's phases, not their sum:
    quota 25000, init 10000 MiB (3g.20gb, 19968) then app 5000 MiB (1g.10gb, 9856) on one MIG GPU
    peak at 19968 (the init phase), so the pod is placed, within quota."""
    led = _quota_ledger([mig_gpu("m", 0)], {"limits.nvidia.com/gpumem": "25000"})
    p = pod("x", [ctr("app", gpu=1, mem=5000)], init=[ctr("init", gpu=1, mem=10000)], ns="a")
    r = schedule_pod(p, None, led, CONFIG, 0)
    assert r.node == "m", r.reasons()
    mem, _ = led.namespace_usage("a", "NVIDIA")
    assert mem <= 25000


# ---------------------------------------------------------------------- properties


@st.composite
def _devices(draw, mig: bool):
    devs = []
    for i in range(draw(st.integers(1, 4))):
        if mig and draw(st.booleans()):
            devs.append(mig_gpu("m", i, numa=draw(st.integers(0, 1))))
            continue
        devs.append(
            DeviceInfo(
                id=f"GPU-m-{i}",
                index=i,
                count=draw(st.integers(1, 4)),
                devmem=draw(st.sampled_from([4000, 16384, 40960])),
                devcore=100,
                type=draw(st.sampled_from(["NVIDIA-T4", "NVIDIA-A100"])),
                numa=draw(st.integers(0, 1)),
                mode="hami-core",
                health=True,
                vendor="NVIDIA",
            )
        )
    return devs


@st.composite
def _pods(draw):
    out = []
    for k in range(draw(st.integers(1, 8))):

        def one(name: str) -> dict:
            return ctr(
                name,
                gpu=draw(st.integers(1, 2)),
                mem=draw(st.sampled_from([1000, 4000, 10000, 15000])),
                cores=draw(st.one_of(st.none(), st.sampled_from([0, 10, 30]))),
            )

        init = [one("init")] if draw(st.booleans()) else None
        policy = draw(st.sampled_from([None, "binpack", "spread", "topology-aware", "mutex"]))
        annotations = {"hami.io/gpu-scheduler-policy": policy} if policy else {}
        if draw(st.booleans()):
            annotations["nvidia.com/numa-bind"] = "true"
        out.append(pod(f"p{k}", [one("app")], init=init, ns="a", annotations=annotations))
    return out


def _hard(draw_mem: int | None, draw_cores: int | None) -> dict:
    hard = {}
    if draw_mem is not None:
        hard["limits.nvidia.com/gpumem"] = str(draw_mem)
    if draw_cores is not None:
        hard["limits.nvidia.com/gpucores"] = str(draw_cores)
    return hard or {"limits.nvidia.com/gpumem": "30000"}


_MEM_LIMITS = st.one_of(st.none(), st.sampled_from([8000, 20000, 30000, 60000]))
_CORE_LIMITS = st.one_of(st.none(), st.sampled_from([20, 50, 120]))


@SETTINGS
@given(_devices(mig=True), _pods(), _MEM_LIMITS, _CORE_LIMITS)
def test_a_namespace_never_goes_past_its_quota_with_mig_gpus(devices, pods, mem_limit, core_limit):
    """Found by review, 1 Dec: whatever the mix of MIG and hami-core GPUs, policies and init
    containers, what the ledger charges a namespace stays within its quota."""
    led = _quota_ledger(devices, _hard(mem_limit, core_limit))
    for p in pods:
        schedule_pod(p, None, led, CONFIG, 0)
        mem, cores = led.namespace_usage("a", "NVIDIA")
        assert mem_limit is None or mem <= mem_limit, (mem, mem_limit)
        assert core_limit is None or cores <= core_limit, (cores, core_limit)


@SETTINGS
@given(_devices(mig=False), _pods(), _MEM_LIMITS, _CORE_LIMITS)
def test_non_mig_decisions_are_unchanged_by_the_charged_quota_check(devices, pods, mem_limit, core_limit):
    """The review fix of 1 Dec (the quota checked again with what the grants charge) refuses no
    non-MIG pod: on hami-core GPUs a grant never charges more than its request, and every
    decision equals the one made with the new check switched off."""
    hard = _hard(mem_limit, core_limit)
    now, off = _quota_ledger(devices, hard), _quota_ledger(devices, hard)
    real = fitmod._charges_more
    more: list[bool] = []

    def recorded(*args):
        got = bool(real(*args))
        more.append(got)
        return got

    def run(led: Ledger, p: dict, check) -> tuple:
        # patched unconditionally: a renamed check raises here instead of making the test vacuous
        # (the test review, 1 Dec: it was patched only when found)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fitmod, "_charges_more", check)
            r = schedule_pod(p, None, led, CONFIG, 0)
        return r.node, r.annotations.get(ALLOCATED), r.reasons()

    placed = 0
    for p in pods:
        decision = run(now, p, recorded)
        assert decision == run(off, p, lambda *args: False)
        placed += decision[0] is not None
    # a pod placed passed the charged check on each device it was given: the check was asked
    assert more or not placed, (placed, more)
    assert not any(more)
    assert now.namespace_usage("a", "NVIDIA") == off.namespace_usage("a", "NVIDIA")
