"""Table-driven fit, reason, scoring, tie-breaking, init/sidecar and quota tests."""

import pytest

from hami.core import (
    ContainerDevice,
    Reason,
    RequestError,
    SchedulerConfig,
    allocation_from_pod,
    collapse,
    filter_pod,
    make_allocation,
    parse_reason,
    schedule_pod,
)
from hami.core.types import ContainerKind
from hami.vendors import build_vendors

from ._corekit import CONFIG, ctr, gpu, ledger, node, pod


def occupy(led, node_name, idx, mem=0, cores=0, slots=1, name=None):
    """Put ``slots`` one-container pods on device ``idx`` of ``node_name``."""
    for s in range(slots):
        raw = {
            "metadata": {"name": name or f"occ-{node_name}-{idx}-{s}-{mem}-{cores}", "namespace": "bg"},
            "spec": {"containers": [{"name": "c"}]},
        }
        dev = ContainerDevice(f"GPU-{node_name}-{idx}", "NVIDIA", mem if s == 0 else 0, cores if s == 0 else 0)
        led.add_pod(make_allocation(raw, node_name, {"NVIDIA": ((dev,),)}))


def one(result):
    (only,) = result.failed.values()
    return only.render()


# (description, node kwargs, occupancy [(idx, mem, cores, slots)], cordoned, pod containers, annotations, expected)
CASES = [
    ("fits", dict(n=2), [], (), [ctr(mem=1000, cores=10)], {}, "fit"),
    ("memory", dict(n=2, mem=1000), [], (), [ctr(mem=2000)], {}, "2/2 CardInsufficientMemory"),
    ("cores", dict(n=2), [(0, 0, 80, 1), (1, 0, 80, 1)], (), [ctr(mem=10, cores=30)], {}, "2/2 CardInsufficientCore"),
    ("slots", dict(n=1, count=2), [(0, 0, 0, 2)], (), [ctr(mem=10, cores=1)], {}, "1/1 CardTimeSlicingExhausted"),
    ("bare gpu on a used card", dict(n=1), [(0, 10, 0, 1)], (), [ctr()], {}, "1/1 CardInsufficientMemory"),
    (
        "exclusive on a used card",
        dict(n=1),
        [(0, 10, 0, 1)],
        (),
        [ctr(mem=100, cores=100)],
        {},
        "1/1 ExclusiveDeviceAllocateConflict",
    ),
    (
        "0-core job on a fully booked card",
        dict(n=1),
        [(0, 10, 100, 1)],
        (),
        [ctr(mem=10, cores=0)],
        {},
        "1/1 CardComputeUnitsExhausted",
    ),
    ("unhealthy", dict(n=1, health=False), [], (), [ctr(mem=10)], {}, "1/1 CardNotHealth"),
    ("cordoned", dict(n=2), [], (0, 1), [ctr(mem=10)], {}, "2/2 CardCordoned"),
    ("type use", dict(n=2), [], (), [ctr(mem=10)], {"nvidia.com/use-gputype": "A100"}, "2/2 CardTypeMismatch"),
    (
        "type use substring, case-insensitive",
        dict(n=2),
        [],
        (),
        [ctr(mem=10)],
        {"nvidia.com/use-gputype": "a100,t4"},
        "fit",
    ),
    ("type nouse", dict(n=2), [], (), [ctr(mem=10)], {"nvidia.com/nouse-gputype": "Tesla"}, "2/2 CardTypeMismatch"),
    ("uuid use", dict(n=3), [], (), [ctr(mem=10)], {"nvidia.com/use-gpuuuid": "GPU-n-9"}, "3/3 CardUuidMismatch"),
    (
        "uuid nouse",
        dict(n=2),
        [],
        (),
        [ctr(mem=10)],
        {"nvidia.com/nouse-gpuuuid": "GPU-n-0, GPU-n-1"},
        "2/2 CardUuidMismatch",
    ),
    ("vgpu-mode", dict(n=2), [], (), [ctr(mem=10)], {"nvidia.com/vgpu-mode": "mps"}, "2/2 CardTypeMismatch"),
    ("vgpu-mode ok", dict(n=2), [], (), [ctr(mem=10)], {"nvidia.com/vgpu-mode": "hami-core"}, "fit"),
    ("too many devices", dict(n=2), [], (), [ctr(gpu=3)], {}, "NodeInsufficientDevice"),
    (
        "partial pick",
        dict(n=2, mem=1000),
        [(1, 500, 0, 1)],
        (),
        [ctr(gpu=2, mem=800)],
        {},
        "1/2 AllocatedCardsInsufficientRequest, 1/2 CardInsufficientMemory",
    ),
    (
        "mutex policy",
        dict(n=2),
        [(0, 1, 1, 1), (1, 1, 1, 1)],
        (),
        [ctr(mem=10, cores=1)],
        {"hami.io/gpu-scheduler-policy": "mutex"},
        "2/2 ExclusiveDeviceAllocateConflict",
    ),
    ("percentage", dict(n=1, mem=1000), [(0, 600, 0, 1)], (), [ctr(pct=50)], {}, "1/1 CardInsufficientMemory"),
    ("percentage fits", dict(n=1, mem=1000), [(0, 500, 0, 1)], (), [ctr(pct=50, cores=10)], {}, "fit"),
]


@pytest.mark.parametrize("desc,nkw,occ,cordon,containers,annos,expected", CASES, ids=[c[0] for c in CASES])
def test_fit_and_reasons(desc, nkw, occ, cordon, containers, annos, expected):
    led = ledger(node("n", cordoned=cordon, **nkw))
    for idx, mem, cores, slots in occ:
        occupy(led, "n", idx, mem, cores, slots)
    result = filter_pod(pod(containers=containers, annotations=annos), None, led, CONFIG, 0)
    if expected == "fit":
        assert result.node == "n", result.reasons()
    else:
        assert result.node is None
        assert one(result) == expected
        if "/" in expected:
            assert parse_reason(expected)  # the rendering parses back


def test_numa_bind_keeps_devices_on_one_numa_node():
    led = ledger(node("n", n=4))
    led.set_node(type(led.node("n"))(name="n", devices=tuple(gpu("n", i, numa=i % 2) for i in range(4))))
    occupy(led, "n", 0, 15000, 0)  # numa 0 has one free card left (idx 2)
    r = filter_pod(
        pod(containers=[ctr(gpu=2, mem=2000, cores=10)], annotations={"nvidia.com/numa-bind": "true"}),
        None,
        led,
        CONFIG,
        0,
    )
    assert r.node == "n"
    (devs,) = r.allocation.devices["NVIDIA"]
    assert sorted(d.uuid for d in devs) == ["GPU-n-1", "GPU-n-3"]


def test_unregistered_candidate():
    r = filter_pod(pod(), ["ghost"], ledger(node("n")), CONFIG, 0)
    assert r.reasons() == {"ghost": "node unregistered"}


def test_pod_without_devices_passes_through():
    p = pod(containers=[{"name": "web"}])
    r = filter_pod(p, None, ledger(node("n")), CONFIG, 0)
    assert r.needs_devices is False and r.node is None


def test_annotations_written_on_success():
    r = filter_pod(
        pod(containers=[ctr(mem=100, cores=5)], init=[ctr("init", gpu=None, mem=None)]),
        None,
        ledger(node("n", n=1)),
        CONFIG,
        1234.9,
    )
    assert r.annotations == {
        "hami.io/vgpu-node": "n",
        "hami.io/vgpu-time": "1234",
        "hami.io/vgpu-devices-allocated": ";GPU-n-0,NVIDIA,100,5:;",
        "hami.io/vgpu-devices-to-allocate": ";GPU-n-0,NVIDIA,100,5:;",
    }


# ---------------------------------------------------------------- scoring and ties


def test_node_binpack_prefers_fuller_node_and_spread_the_emptier():
    led = ledger(node("a", n=2), node("b", n=2))
    occupy(led, "b", 0, 4000, 20)
    p = pod(containers=[ctr(mem=100, cores=5)])
    assert filter_pod(p, None, led, CONFIG, 0).node == "b"
    spread = SchedulerConfig(build_vendors(), node_policy="spread")
    assert filter_pod(p, None, led, spread, 0).node == "a"
    p2 = pod(containers=[ctr(mem=100, cores=5)], annotations={"hami.io/node-scheduler-policy": "spread"})
    assert filter_pod(p2, None, led, CONFIG, 0).node == "a"


def test_ties_are_broken_by_node_name_then_device_index():
    led = ledger(node("zeta", n=4), node("alpha", n=4), node("mid", n=4))
    r = filter_pod(pod(containers=[ctr(mem=100, cores=5)]), None, led, CONFIG, 0)
    assert r.node == "alpha"
    assert r.allocation.devices["NVIDIA"][0][0].uuid == "GPU-alpha-0"


def test_gpu_binpack_and_spread():
    led = ledger(node("n", n=3))
    occupy(led, "n", 1, 4000, 20)
    p_spread = pod(containers=[ctr(mem=100, cores=5)])
    p_bin = pod(containers=[ctr(mem=100, cores=5)], annotations={"hami.io/gpu-scheduler-policy": "binpack"})
    assert filter_pod(p_spread, None, led, CONFIG, 0).allocation.devices["NVIDIA"][0][0].uuid == "GPU-n-0"
    assert filter_pod(p_bin, None, led, CONFIG, 0).allocation.devices["NVIDIA"][0][0].uuid == "GPU-n-1"


def test_request_counts_in_device_score_with_weights():
    # two cards, one big one small; memory-only weights: spread picks the card where the request
    # is the smaller share of its memory
    led = ledger(node("n", n=1))
    led.set_node(type(led.node("n"))(name="n", devices=(gpu("n", 0, mem=8000), gpu("n", 1, mem=80000))))
    p = pod(
        containers=[ctr(mem=4000, cores=0)], annotations={"hami.io/device-scoring-weights": "slot=0,core=0,memory=1"}
    )
    assert filter_pod(p, None, led, CONFIG, 0).allocation.devices["NVIDIA"][0][0].uuid == "GPU-n-1"


@pytest.mark.parametrize(
    "key,value",
    [
        ("hami.io/device-scoring-weights", "slot=1,core=1"),
        ("hami.io/device-scoring-weights", "slot=0,core=0,memory=0"),
        ("hami.io/device-scoring-weights", "slot=-1,core=1,memory=1"),
        ("hami.io/gpu-scheduler-policy", "fastest"),
        ("hami.io/node-scheduler-policy", "random"),
    ],
)
def test_bad_scheduling_annotations_are_errors(key, value):
    with pytest.raises(RequestError, match=key):
        filter_pod(pod(annotations={key: value}), None, ledger(node("n")), CONFIG, 0)


def test_comma_chain_numa_first_tries_the_highest_numa_node_as_hami():
    led = ledger(node("n", n=1))
    led.set_node(type(led.node("n"))(name="n", devices=(gpu("n", 0, numa=0), gpu("n", 1, numa=1))))
    p = pod(containers=[ctr(mem=100, cores=5)], annotations={"hami.io/gpu-scheduler-policy": "numa,binpack"})
    assert filter_pod(p, None, led, CONFIG, 0).allocation.devices["NVIDIA"][0][0].uuid == "GPU-n-1"


# ---------------------------------------------------------------- init containers and sidecars


def test_collapse_peak_of_init_vs_sum_of_apps():
    d = lambda mem, cores: (ContainerDevice("GPU-x", "NVIDIA", mem, cores),)  # noqa: E731
    kinds = (ContainerKind.INIT, ContainerKind.INIT, ContainerKind.APP, ContainerKind.APP)
    (u,) = collapse({"NVIDIA": (d(5000, 50), d(3000, 10), d(1000, 10), d(1500, 20))}, kinds)
    assert (u.slots, u.mem, u.cores) == (2, 5000, 50)
    (u,) = collapse({"NVIDIA": (d(5000, 50), d(3000, 10), d(1000, 10), d(1500, 20))}, kinds, app_only=True)
    assert (u.slots, u.mem, u.cores) == (2, 2500, 30)


def test_collapse_counts_sidecars_with_the_apps_and_under_later_inits():
    d = lambda mem: (ContainerDevice("GPU-x", "NVIDIA", mem, 0),)  # noqa: E731
    kinds = (ContainerKind.SIDECAR, ContainerKind.INIT, ContainerKind.APP)
    (u,) = collapse({"NVIDIA": (d(1000), d(4000), d(2000))}, kinds)
    # init phase: sidecar + init = 5000; steady: sidecar + app = 3000 (HAMi would say max(4000, 2000))
    assert (u.slots, u.mem) == (2, 5000)
    (u,) = collapse({"NVIDIA": (d(3000), d(1000), d(2000))}, kinds)
    assert u.mem == 5000  # steady: sidecar 3000 + app 2000


def test_sidecar_and_app_must_fit_together_but_init_reuses_the_room():
    led = ledger(node("n", n=1, mem=10000))
    ok = pod(containers=[ctr("app", mem=6000, cores=10)], init=[ctr("init", mem=9000, cores=10)])
    assert filter_pod(ok, None, led, CONFIG, 0).node == "n"
    bad = pod(containers=[ctr("app", mem=6000, cores=10)], init=[ctr("side", mem=5000, cores=10, sidecar=True)])
    r = filter_pod(bad, None, led, CONFIG, 0)
    assert r.node is None and one(r) == "1/1 CardInsufficientMemory"


def test_shrink_after_init_containers_succeed():
    p = pod(containers=[ctr("app", mem=1000, cores=10)], init=[ctr("init", mem=8000, cores=10)])
    p["metadata"]["annotations"] = {
        "hami.io/vgpu-node": "n",
        "hami.io/vgpu-devices-allocated": "GPU-n-0,NVIDIA,8000,10:;GPU-n-0,NVIDIA,1000,10:;",
    }
    assert allocation_from_pod(p, CONFIG.vendors).usage[0].mem == 8000
    p["status"] = {"initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}]}
    # Found by review, 1 Dec: the kubelet runs the init containers again (with their grants) after
    # a new sandbox unless restartPolicy is Never, and whenever a container's RestartAllContainers
    # rule fires (beta, on in 1.37): shrinking then let another pod be given the memory the re-run
    # init container used. Only a pod whose init containers cannot run again shrinks.
    assert allocation_from_pod(p, CONFIG.vendors).usage[0].mem == 8000  # restartPolicy Always (default)
    p["spec"]["restartPolicy"] = "OnFailure"
    assert allocation_from_pod(p, CONFIG.vendors).usage[0].mem == 8000
    p["spec"]["restartPolicy"] = "Never"
    assert allocation_from_pod(p, CONFIG.vendors).usage[0].mem == 1000
    rule = [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]
    p["spec"]["containers"][0]["restartPolicyRules"] = rule
    assert allocation_from_pod(p, CONFIG.vendors).usage[0].mem == 8000
    del p["spec"]["containers"][0]["restartPolicyRules"]
    p["spec"]["containers"][0]["restartPolicy"] = "OnFailure"  # ContainerRestartRules
    assert allocation_from_pod(p, CONFIG.vendors).usage[0].mem == 8000
    p["spec"]["containers"][0]["restartPolicy"] = "Never"
    assert allocation_from_pod(p, CONFIG.vendors).usage[0].mem == 1000
    p["status"]["phase"] = "Succeeded"
    assert allocation_from_pod(p, CONFIG.vendors) is None


# ---------------------------------------------------------------- ledger and quota


def test_schedule_reserve_and_remove_restore_usage():
    led = ledger(node("n", n=1))
    p = pod(containers=[ctr(mem=3000, cores=30)])
    r = schedule_pod(p, None, led, CONFIG, 0)
    assert led.is_reserved(r.allocation.key)
    assert list(led.device_usage("n"))[0][1:] == (1, 3000, 30)
    r2 = schedule_pod(p, None, led, CONFIG, 0)  # re-filter of the same pod is idempotent
    assert r2.node == "n" and list(led.device_usage("n"))[0][1:] == (1, 3000, 30)
    led.remove_pod(r.allocation.key)
    assert list(led.device_usage("n"))[0][1:] == (0, 0, 0)


def test_node_reregistration_reapplies_pods():
    led = ledger(node("n", n=1))
    schedule_pod(pod(containers=[ctr(mem=3000, cores=30)]), None, led, CONFIG, 0)
    led.set_node(node("n", n=2))
    assert [u[1:] for u in led.device_usage("n")] == [(1, 3000, 30), (0, 0, 0)]


def test_quota_limits_memory_per_namespace():
    led = ledger(node("n", n=2))
    led.set_quota("team", "q", {"limits.nvidia.com/gpumem": "5000", "requests.cpu": "4"}, CONFIG.vendors)
    first = schedule_pod(pod("a", containers=[ctr(mem=3000, cores=5)], ns="team"), None, led, CONFIG, 0)
    assert first.node == "n"
    second = filter_pod(pod("b", containers=[ctr(mem=3000, cores=5)], ns="team"), None, led, CONFIG, 0)
    assert second.node is None and one(second) == "2/2 ResourceQuotaNotFit"
    assert filter_pod(pod("c", containers=[ctr(mem=3000, cores=5)], ns="other"), None, led, CONFIG, 0).node == "n"
    led.remove_quota("team", "q")
    assert filter_pod(pod("b", containers=[ctr(mem=3000, cores=5)], ns="team"), None, led, CONFIG, 0).node == "n"


def test_quota_zero_blocks_and_cores_count():
    led = ledger(node("n", n=1))
    led.set_quota("team", "q", {"limits.nvidia.com/gpucores": 0}, CONFIG.vendors)
    r = filter_pod(pod(containers=[ctr(mem=10, cores=1)], ns="team"), None, led, CONFIG, 0)
    assert one(r) == "1/1 ResourceQuotaNotFit"


def test_reason_codes_render_like_hami():
    assert Reason.CARD_INSUFFICIENT_MEMORY.value == "CardInsufficientMemory"
    assert parse_reason("1/4 CardInsufficientMemory, 3/4 CardUuidMismatch") == {
        "CardInsufficientMemory": (1, 4),
        "CardUuidMismatch": (3, 4),
    }


# ---------------------------------------------------------------- topology-aware


def _topology_ledger():
    from hami.core import encode_node_devices_json, node_devices_from_object
    from hami.core.codec import encode_pair_scores

    devs = [gpu("n", i) for i in range(4)]
    links = {(0, 1): 200, (2, 3): 100}
    scores = {
        f"GPU-n-{a}": {f"GPU-n-{b}": links.get((min(a, b), max(a, b)), 10) for b in range(4) if b != a}
        for a in range(4)
    }
    obj = {
        "metadata": {
            "name": "n",
            "annotations": {
                "hami.io/node-nvidia-register": encode_node_devices_json(devs),
                "hami.io/node-nvidia-score": encode_pair_scores(scores),
            },
        }
    }
    return ledger(node_devices_from_object(obj, CONFIG.vendors))


def test_topology_aware_picks_the_best_connected_pair():
    p = pod(containers=[ctr(gpu=2, mem=100, cores=5)], annotations={"hami.io/gpu-scheduler-policy": "topology-aware"})
    (devs,) = filter_pod(p, None, _topology_ledger(), CONFIG, 0).allocation.devices["NVIDIA"]
    assert sorted(d.uuid for d in devs) == ["GPU-n-0", "GPU-n-1"]


def test_topology_aware_single_gpu_keeps_well_connected_groups_free():
    p = pod(containers=[ctr(gpu=1, mem=100, cores=5)], annotations={"hami.io/gpu-scheduler-policy": "topology-aware"})
    (devs,) = filter_pod(p, None, _topology_ledger(), CONFIG, 0).allocation.devices["NVIDIA"]
    assert [d.uuid for d in devs] == ["GPU-n-2"]


def test_topology_aware_on_a_node_of_forty_gpus_chooses_greedily_not_every_combination():
    """C(40, 10) is 850 million combinations: a node that registers 40 GPUs held the Filter (and
    the scheduler's loop) for minutes. Past TOPOLOGY_EXHAUSTIVE the choice is greedy: the best
    pair, then the device best connected to those chosen. Found by an adversarial review."""
    from hami.core import encode_node_devices_json, node_devices_from_object
    from hami.core.codec import encode_pair_scores

    n = 40
    group = set(range(20, 30))  # ten GPUs linked 100 to each other, 10 to the rest
    scores = {
        f"GPU-n-{a}": {f"GPU-n-{b}": 100 if {a, b} <= group else 10 for b in range(n) if b != a} for a in range(n)
    }
    obj = {
        "metadata": {
            "name": "n",
            "annotations": {
                "hami.io/node-nvidia-register": encode_node_devices_json([gpu("n", i) for i in range(n)]),
                "hami.io/node-nvidia-score": encode_pair_scores(scores),
            },
        }
    }
    p = pod(containers=[ctr(gpu=10, mem=100, cores=5)], annotations={"hami.io/gpu-scheduler-policy": "topology-aware"})
    (devs,) = filter_pod(p, None, ledger(node_devices_from_object(obj, CONFIG.vendors)), CONFIG, 0).allocation.devices[
        "NVIDIA"
    ]
    assert sorted(int(d.uuid.rsplit("-", 1)[1]) for d in devs) == sorted(group)


def test_malformed_pair_scores_name_the_annotation():
    from hami.core import CodecError, node_devices_from_object

    obj = {"metadata": {"name": "n", "annotations": {"hami.io/node-nvidia-score": '[{"uuid": 3}]'}}}
    with pytest.raises(CodecError, match="hami.io/node-nvidia-score"):
        node_devices_from_object(obj, CONFIG.vendors)


def test_quota_admission_check_counts_init_peak_and_sidecars():
    from hami.core import pod_request, quota_admission_check

    led = ledger(node("n", n=2))
    assert quota_admission_check(led, pod_request(pod(ns="team"), CONFIG.vendors), CONFIG.vendors) is None
    led.set_quota("team", "q", {"limits.nvidia.com/gpumem": "6000"}, CONFIG.vendors)
    ok = pod(ns="team", containers=[ctr("app", mem=3000)], init=[ctr("init", mem=6000)])
    assert quota_admission_check(led, pod_request(ok, CONFIG.vendors), CONFIG.vendors) is None
    side = pod(ns="team", containers=[ctr("app", mem=3000)], init=[ctr("side", mem=3500, sidecar=True)])
    msg = quota_admission_check(led, pod_request(side, CONFIG.vendors), CONFIG.vendors)
    assert msg == "exceeding resource quota: namespace team nvidia.com/gpumem request 6500 > remaining 6000"
    pct = pod(ns="team", containers=[ctr("app", pct=100)])
    assert quota_admission_check(led, pod_request(pct, CONFIG.vendors), CONFIG.vendors) is None


def test_summary_prefilter_only_for_vendors_that_declare_it():
    from hami.vendors import NvidiaVendor

    class Lenient(NvidiaVendor):  # a vendor whose capacity rule ignores memory
        summary_prefilter = False

        def capacity_check(self, *args, **kwargs):
            return None

    cfg = SchedulerConfig(vendors=(Lenient(),))
    led = ledger(node("a", n=1, mem=1000), node("b", n=1, mem=100000))
    occupy(led, "a", 0, 900, 10)
    p = pod(containers=[ctr(mem=5000, cores=5)])
    assert filter_pod(p, None, led, cfg, 0).node == "a"  # binpack: fuller node, not pre-rejected
    assert filter_pod(p, None, led, CONFIG, 0).node == "b"  # NVIDIA rules: a has no room


@pytest.mark.parametrize(
    "value, binds",
    [
        ("true", True),
        ("True", True),
        ("TRUE", True),
        ("1", True),
        ("t", True),
        ("T", True),
        (" true", False),
        ("tRUE", False),
        ("yes", False),
        ("false", False),
        ("", False),
    ],
)
def test_numa_bind_is_read_as_hamis_parse_bool(value, binds):
    """HAMi's assertNuma reads nvidia.com/numa-bind with Go's strconv.ParseBool: "1" and "T" bind
    there (they were ignored here, so the GPUs could span NUMA nodes), " true" and "tRUE" do not."""
    from hami.vendors import NvidiaVendor

    assert NvidiaVendor().selection({"nvidia.com/numa-bind": value}).numa_bind is binds
