"""NVIDIA dynamic MIG (§5.3 step 5, §5.4 step 15 and AddResourceUsage, §5.5, §6.6): profile and
placement choice, CardMigTopologyInfeasible, hami.io/vgpu-mig-allocations, rebuild, consistency."""

from __future__ import annotations

import json

import pytest

from hami.config import device_config_from_dict
from hami.core import (
    CodecError,
    ContainerDevice,
    Ledger,
    NodeDevices,
    SchedulerConfig,
    allocation_from_pod,
    filter_pod,
    make_allocation,
    schedule_pod,
)
from hami.core.codec import MigAllocation, decode_mig_allocations, encode_mig_allocations
from hami.core.types import MigProfile, Slice
from hami.vendors import build_vendors
from hami.vendors.nvidia import MIG_ALLOCATIONS_ANNOTATION, NvidiaVendor, select_mig

from ._corekit import A100_40_MIG as A100_40
from ._corekit import CONFIG, ctr, gpu, mig_gpu, pod


def mig_ledger(n: int = 1, name: str = "m", **kw) -> Ledger:
    led = Ledger()
    led.set_node(NodeDevices(name=name, devices=tuple(mig_gpu(name, i, **kw) for i in range(n))))
    return led


def occupied(*pairs):
    return [tuple(p) for p in pairs]


# ---------------------------------------------------------------------- profile and placement choice

SELECT = [
    # (description, request MiB, occupied placements, expected (profile, start) or None)
    ("smallest profile, 1g prefers the highest start", 4000, [], ("1g.5gb", 6)),
    ("1g next highest free start", 4000, [(6, 1), (5, 1)], ("1g.5gb", 4)),
    ("memory tie: fewer slices first (1g.10gb before 2g.10gb)", 9000, [], ("1g.10gb", 6)),
    ("every 10gb and 20gb placement blocked", 9000, [(0, 1), (2, 1), (4, 1), (6, 1)], None),
    ("1g.10gb falls back to the lowest free start", 9000, [(6, 2), (4, 2), (2, 2)], ("1g.10gb", 0)),
    ("3g prefers the highest start", 15000, [], ("3g.20gb", 4)),
    ("3g falls back to the low half", 15000, [(4, 1)], ("3g.20gb", 0)),
    ("3g blocked on both halves, 4g blocked too: 7g blocked", 15000, [(1, 1), (5, 1)], None),
    ("exact profile memory fits", 4864, [], ("1g.5gb", 6)),
    ("one MiB more takes the next size", 4865, [], ("1g.10gb", 6)),
    ("whole GPU", 40000, [], ("7g.40gb", 0)),
    ("more than any profile", 40960, [], None),
    ("overlap: a 2-slice hold at 6 blocks 1g at 6 and 7", 4000, [(6, 2)], ("1g.5gb", 5)),
]


@pytest.mark.parametrize("desc,mem,held,want", SELECT, ids=[c[0] for c in SELECT])
def test_select_mig(desc, mem, held, want):
    got = select_mig(A100_40, occupied(*held), mem)
    assert (None if got is None else (got[0].name, got[1][0])) == want


def test_two_g_profile_prefers_lowest_and_four_g_only_start_zero():
    assert select_mig([A100_40[2]], [], 1)[1] == (0, 2)
    assert select_mig([A100_40[2]], [(0, 1)], 1)[1] == (2, 2)
    assert select_mig([A100_40[4]], [(3, 1)], 1) is None


# ---------------------------------------------------------------------- fit through the core


def fit(led, *containers, annotations=None, init=None, config=CONFIG):
    return filter_pod(pod("p", containers=list(containers), init=init, annotations=annotations), None, led, config, 0)


def slices_of(result):
    return [
        (cd.uuid, cd.slice.profile, cd.slice.start, cd.usedmem, cd.usedcores)
        for ctr_ in result.allocation.devices["NVIDIA"]
        for cd in ctr_
    ]


def test_grant_takes_the_profile_memory_and_cores_and_writes_the_annotation():
    res = fit(mig_ledger(), ctr(mem=4000))
    assert slices_of(res) == [("GPU-m-0", "1g.5gb", 6, 4864, 13)]
    assert res.annotations["hami.io/vgpu-devices-allocated"] == "GPU-m-0,NVIDIA,4864,13:;"
    assert res.annotations[MIG_ALLOCATIONS_ANNOTATION] == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-m-0","profile":"1g.5gb","placement":{"start":6,"size":1}}]'
    )
    assert res.allocation.slices == (Slice("GPU-m-0", "1g.5gb", 6, 1),)


def test_percentage_request_resolves_against_device_memory():
    res = fit(mig_ledger(), ctr(pct=40))  # 16384 MiB -> 3g.20gb
    assert slices_of(res)[0][1:3] == ("3g.20gb", 4)


INFEASIBLE = [
    # (description, request, held slices per device, expected reason)
    ("no profile large enough", dict(mem=40500), [], "1/1 CardMigTopologyInfeasible"),
    ("bare nvidia.com/gpu: whole memory, no profile", dict(), [], "1/1 CardMigTopologyInfeasible"),
    (
        "every 3g/4g/7g placement overlaps",
        dict(mem=15000),
        [("1g.5gb", 1, 1), ("1g.5gb", 5, 1)],
        "1/1 CardMigTopologyInfeasible",
    ),
    ("generic memory rule first", dict(mem=39000), [("1g.5gb", 6, 1)], "1/1 CardInsufficientMemory"),
]


@pytest.mark.parametrize("desc,req,held,want", INFEASIBLE, ids=[c[0] for c in INFEASIBLE])
def test_infeasible_reasons(desc, req, held, want):
    led = mig_ledger()
    for k, (profile, start, size) in enumerate(held):
        p = pod(f"h{k}", containers=[ctr(mem=1)], admit=False)
        prof = next(x for x in A100_40 if x.name == profile)
        cd = ContainerDevice(
            "GPU-m-0", "NVIDIA", prof.memory_mb, prof.core, slice=Slice("GPU-m-0", profile, start, size)
        )
        led.add_pod(make_allocation(p, "m", {"NVIDIA": ((cd,),)}))
    res = fit(led, ctr(**req))
    assert res.node is None
    assert res.reasons() == {"m": want}


def test_several_instances_of_one_container_on_one_gpu():
    res = fit(mig_ledger(), ctr(gpu=2, mem=4000))
    assert [s[:3] for s in slices_of(res)] == [("GPU-m-0", "1g.5gb", 6), ("GPU-m-0", "1g.5gb", 5)]
    entries = decode_mig_allocations(res.annotations[MIG_ALLOCATIONS_ANNOTATION])
    assert [(e.container, e.device, e.start) for e in entries] == [(0, 0, 6), (0, 1, 5)]
    assert res.allocation.usage[0].slots == 2 and res.allocation.usage[0].mem == 2 * 4864


def test_second_instance_without_a_placement_is_infeasible():
    only_one = (MigProfile("1g.5gb", 4864, 13, 1, ((6, 1),)),)
    res = fit(mig_ledger(profiles=only_one), ctr(gpu=2, mem=4000))
    assert res.reasons() == {"m": "1/1 CardMigTopologyInfeasible"}  # one GPU, counted once


def test_hami_core_mode_pod_keeps_the_physical_device_count():
    res = fit(mig_ledger(), ctr(gpu=2, mem=4000), annotations={"nvidia.com/vgpu-mode": "hami-core"})
    assert res.reasons() == {"m": "NodeInsufficientDevice"}
    res = fit(mig_ledger(), ctr(mem=4000), annotations={"nvidia.com/vgpu-mode": "hami-core"})
    assert res.reasons() == {"m": "1/1 CardTypeMismatch"}


def test_mig_mode_pod_avoids_hami_core_gpus():
    led = Ledger()
    led.set_node(NodeDevices(name="m", devices=(gpu("m", 0, mem=40960), mig_gpu("m", 1))))
    res = fit(led, ctr(mem=4000), annotations={"nvidia.com/vgpu-mode": "mig"})
    assert slices_of(res)[0][0] == "GPU-m-1"


def test_init_container_slice_stays_held_for_the_app_containers():
    res = fit(mig_ledger(), ctr("app", mem=4000), init=[ctr("init", mem=4000)])
    assert [s[2] for s in slices_of(res)] == [6, 5]


def test_later_containers_and_pods_see_earlier_slices():
    led = mig_ledger()
    first = schedule_pod(pod("a", containers=[ctr("x", mem=9000), ctr("y", mem=9000)]), None, led, CONFIG, 0)
    assert [s[1:3] for s in slices_of(first)] == [("1g.10gb", 6), ("1g.10gb", 4)]
    second = schedule_pod(pod("b", containers=[ctr(mem=15000)]), None, led, CONFIG, 0)
    assert slices_of(second)[0][1:3] == ("3g.20gb", 0)
    third = filter_pod(pod("c", containers=[ctr(mem=100)]), None, led, CONFIG, 0)
    assert third.reasons() == {"m": "1/1 CardMigTopologyInfeasible"}
    led.remove_pod(first.allocation.key)  # deleting a pod frees its placements
    assert slices_of(filter_pod(pod("c", containers=[ctr(mem=100)]), None, led, CONFIG, 0))[0][1:3] == ("1g.5gb", 6)


def test_nums_above_the_mig_gpu_count_is_not_prefiltered_away():
    led = mig_ledger()
    led.set_node(NodeDevices(name="big", devices=tuple(gpu("big", i, mem=1000) for i in range(4))))
    res = filter_pod(pod("p", containers=[ctr(gpu=3, mem=4000)]), None, led, CONFIG, 0)
    assert res.node == "m" and len(slices_of(res)) == 3


def test_allowlist_narrows_the_profiles():
    cfg = device_config_from_dict(
        {
            "nvidia": {
                "migProfileAllowlist": [
                    {"models": ["H100"], "profiles": ["7g.80gb"]},
                    {"models": ["A100-SXM4-40GB"], "profiles": ["3g.20gb", "7g.40gb"]},
                ]
            }
        }
    )
    config = SchedulerConfig(build_vendors(cfg))
    res = fit(mig_ledger(), ctr(mem=4000), config=config)
    assert slices_of(res)[0][1:3] == ("3g.20gb", 4)
    nv = NvidiaVendor()
    assert nv.allowed_profiles(mig_gpu("m", 0)) == A100_40  # no allowlist: every registered profile


# ---------------------------------------------------------------------- rebuild and consistency


def placed(name, node, devices, mig=None, uid=None):
    ann = {"hami.io/vgpu-node": node, "hami.io/vgpu-devices-allocated": devices}
    if mig is not None:
        ann[MIG_ALLOCATIONS_ANNOTATION] = mig if isinstance(mig, str) else json.dumps(mig)
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}", "annotations": ann},
        "spec": {"containers": [{"name": "c"}]},
    }


def entry(uuid, profile, start, size, c=0, d=0, **extra):
    return {
        "containerIndex": c,
        "deviceIndex": d,
        "gpuUUID": uuid,
        "profile": profile,
        "placement": {"start": start, "size": size},
        **extra,
    }


def health(led, node="m"):
    return [d.health for d, *_ in led.device_usage(node)]


def test_rebuild_from_annotations_restores_the_placement():
    led = mig_ledger()
    p = placed(
        "old",
        "m",
        "GPU-m-0,NVIDIA,4864,13:;",
        [entry("GPU-m-0", "1g.5gb", 6, 1, migUUID="MIG-a", gpuInstanceID=7, computeInstanceID=0)],
    )
    alloc = allocation_from_pod(p, CONFIG.vendors)
    assert alloc.slices == (Slice("GPU-m-0", "1g.5gb", 6, 1),)
    assert alloc.devices["NVIDIA"][0][0].slice == Slice("GPU-m-0", "1g.5gb", 6, 1)
    led.add_pod(alloc)
    assert led.slices("m") == {"GPU-m-0": (Slice("GPU-m-0", "1g.5gb", 6, 1),)} and health(led) == [True]
    assert slices_of(fit(led, ctr(mem=4000)))[0][2] == 5


def test_unconsumed_reservations_are_kept_and_stay_healthy():
    led = mig_ledger()
    led.add_pod(
        allocation_from_pod(
            placed(
                "old",
                "m",
                "GPU-m-0,NVIDIA,4864,13:;",
                [entry("GPU-m-0", "1g.5gb", 6, 1), entry("GPU-m-0", "1g.5gb", 5, 1, d=1)],
            ),
            CONFIG.vendors,
        )
    )
    assert len(led.slices("m")["GPU-m-0"]) == 2 and health(led) == [True]
    assert slices_of(fit(led, ctr(mem=4000)))[0][2] == 4


INCONSISTENT = [
    # (description, node devices, pod annotations (devices, mig))
    ("MIG pod on a hami-core GPU", "core", ("GPU-m-0,NVIDIA,4864,13:;", [entry("GPU-m-0", "1g.5gb", 6, 1)])),
    ("MIG GPU used without a reservation", "mig", ("GPU-m-0,NVIDIA,4864,13:;", None)),
    ("reservation for another GPU only", "mig", ("GPU-m-0,NVIDIA,4864,13:;", [entry("GPU-x-9", "1g.5gb", 6, 1)])),
]


@pytest.mark.parametrize("desc,kind,ann", INCONSISTENT, ids=[c[0] for c in INCONSISTENT])
def test_inconsistent_state_marks_the_device_unhealthy_until_it_is_gone(desc, kind, ann):
    led = Ledger()
    dev = mig_gpu("m", 0) if kind == "mig" else gpu("m", 0, mem=40960)
    led.set_node(NodeDevices(name="m", devices=(dev,)))
    alloc = allocation_from_pod(placed("bad", "m", *ann), CONFIG.vendors)
    led.add_pod(alloc)
    assert health(led) == [False]
    assert fit(led, ctr(mem=100)).reasons() == {"m": "1/1 CardNotHealth"}
    led.remove_pod(alloc.key)  # level-triggered: consistent again
    assert health(led) == [True]


def test_overlapping_reservations_mark_the_device_unhealthy():
    led = mig_ledger()
    led.add_pod(
        allocation_from_pod(
            placed("a", "m", "GPU-m-0,NVIDIA,19968,39:;", [entry("GPU-m-0", "3g.20gb", 4, 4)]), CONFIG.vendors
        )
    )
    assert health(led) == [True]
    b = allocation_from_pod(
        placed("b", "m", "GPU-m-0,NVIDIA,4864,13:;", [entry("GPU-m-0", "1g.5gb", 6, 1)]), CONFIG.vendors
    )
    led.add_pod(b)
    assert health(led) == [False]
    led.remove_pod(b.key)
    assert health(led) == [True]


def test_node_registered_after_its_pods_is_checked_too():
    led = Ledger()
    led.add_pod(allocation_from_pod(placed("a", "m", "GPU-m-0,NVIDIA,4864,13:;", None), CONFIG.vendors))
    led.set_node(NodeDevices(name="m", devices=(mig_gpu("m", 0),)))
    assert health(led) == [False]


# ---------------------------------------------------------------------- the annotation codec

HAMI_TEXT = (
    '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,'
    '"size":1},"migUUID":"MIG-a","gpuInstanceID":7,"computeInstanceID":0},{"containerIndex":1,'
    '"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb","placement":{"start":0,"size":2}}]'
)


def test_codec_round_trip_is_byte_exact():
    entries = decode_mig_allocations(HAMI_TEXT)
    assert entries[0] == MigAllocation(0, 0, "GPU-a", "1g.5gb", 6, 1, "MIG-a", 7, 0)
    assert encode_mig_allocations(entries) == HAMI_TEXT
    assert decode_mig_allocations("") == () and decode_mig_allocations("null") == ()


BAD = [
    ("not JSON", "[{", "not valid JSON"),
    ("not a list", '{"a":1}', "must be a JSON array"),
    ("missing profile", json.dumps([{"gpuUUID": "GPU-a", "placement": {"start": 0, "size": 1}}]), "incomplete"),
    ("zero size", json.dumps([entry("GPU-a", "1g.5gb", 0, 0)]), "incomplete"),
    ("negative index", json.dumps([entry("GPU-a", "1g.5gb", 0, 1, c=-1)]), "incomplete"),
    ("partial runtime identity", json.dumps([entry("GPU-a", "1g.5gb", 0, 1, migUUID="MIG-a")]), "set together"),
    (
        "duplicate position",
        json.dumps([entry("GPU-a", "1g.5gb", 0, 1), entry("GPU-a", "1g.5gb", 1, 1)]),
        "duplicate entry for containerIndex 0 deviceIndex 0",
    ),
    ("placement not an object", json.dumps([{**entry("GPU-a", "1g.5gb", 0, 1), "placement": 3}]), "'placement'"),
]


@pytest.mark.parametrize("desc,text,needle", BAD, ids=[c[0] for c in BAD])
def test_codec_rejects_malformed_entries(desc, text, needle):
    with pytest.raises(CodecError, match=needle):
        decode_mig_allocations(text)


def test_malformed_annotation_on_a_pod_names_pod_and_annotation():
    with pytest.raises(CodecError, match=r"pod default/bad: annotation hami.io/vgpu-mig-allocations: entry 0"):
        allocation_from_pod(placed("bad", "m", "GPU-m-0,NVIDIA,1,1:;", "[1]"), CONFIG.vendors)


def test_topology_aware_policy_offers_a_mig_gpu_as_often_as_it_takes_instances():
    # (the walk takes a MIG GPU again while it fits, under every policy: topology-aware as spread)
    for n in (1, 2):
        spread = fit(mig_ledger(n=n), ctr(gpu=2, mem=4000))
        aware = fit(
            mig_ledger(n=n), ctr(gpu=2, mem=4000), annotations={"hami.io/gpu-scheduler-policy": "topology-aware"}
        )
        assert [s[:3] for s in slices_of(aware)] == [s[:3] for s in slices_of(spread)]
    # one GPU that takes two instances: placed twice on it, as spread places it (it was refused)
    res = fit(mig_ledger(n=1), ctr(gpu=2, mem=4000), annotations={"hami.io/gpu-scheduler-policy": "topology-aware"})
    assert res.node == "m" and [s[0] for s in slices_of(res)] == ["GPU-m-0", "GPU-m-0"]


def test_quota_is_charged_the_profile_memory():
    led = mig_ledger()
    led.set_quota("default", "q", {"limits.nvidia.com/gpumem": "10000"}, CONFIG.vendors)
    first = schedule_pod(pod("a", containers=[ctr(mem=4000)]), None, led, CONFIG, 0)
    assert slices_of(first)[0][3] == 4864 and led.namespace_usage("default", "NVIDIA")[0] == 4864
    second = filter_pod(pod("b", containers=[ctr(mem=5200)]), None, led, CONFIG, 0)  # 4864 + 5200 > 10000
    assert second.reasons() == {"m": "1/1 ResourceQuotaNotFit"}


def test_a_gpu_that_served_some_picks_is_counted_once_as_allocated():
    two_places = (MigProfile("1g.5gb", 4864, 13, 1, ((5, 1), (6, 1))),)
    res = fit(mig_ledger(profiles=two_places), ctr(gpu=3, mem=4000))
    # HAMi would print 2/1 here (one entry per pick); the GPU that took two picks counts once,
    # under the reason its next pick failed
    assert res.reasons() == {"m": "1/1 CardMigTopologyInfeasible"}


def test_mig_picks_of_one_container_on_one_gpu_are_bounded():
    """Each pick replays the earlier ones through the profile search: a node registering a
    profile with 200 placements made a pod asking 200 instances cost 15 s. Found by an
    adversarial review."""
    from hami.core.reasons import Reason
    from hami.core.types import ContainerDeviceRequest
    from hami.vendors.nvidia import MAX_MIG_INSTANCES

    v = NvidiaVendor()
    req = ContainerDeviceRequest("NVIDIA", 1, "NVIDIA", memreq=1)
    d = mig_gpu("m", 0)
    assert v.custom_filter(d, req, 1, [], 0) is None
    assert v.custom_filter(d, req, 1, [], MAX_MIG_INSTANCES) is Reason.CARD_MIG_TOPOLOGY_INFEASIBLE
