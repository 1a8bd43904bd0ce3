"""Cheap refusals never change a Filter's answer (hami.core.refuse, hami.core.verdicts).

1. Property: on random clusters (NVIDIA with MIG, unhealthy and cordoned GPUs, Hygon DCU, AMD,
   which has no summary rules) put through random changes (pods placed and removed, nodes
   re-registered, removed and added back, quotas set), every probe pod gets from ``filter_pod``
   the same node, devices and annotations as from the exact path (``exact=True``: every visited
   node fitted, nothing remembered); when it fits nowhere, the same nodes refuse it, each with
   the exact path's reason (rendering, codes, failing container and vendor); when it fits, every
   refusal it lists is the one fitting that node alone gives. Probe shapes repeat, so remembered
   refusals are taken after every kind of change. Probes include the ``mutex`` device policy,
   whose refusals are read from the summary's unused GPUs.
2. Property: a summary refusal, where it is given, renders as the fit of that node does.
3. A retry re-fits only the nodes that changed; a pod of the same shape shares the refusals.
4. The ledger's cluster-wide best room and node versions follow every change.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hami.config import chart_device_config
from hami.core import DeviceInfo, Ledger, NodeDevices, SchedulerConfig, admit_pod, filter_pod, schedule_pod
from hami.core.fit import fit_pod, make_context
from hami.core.reasons import NodeFailure, Reason
from hami.core.refuse import SummaryRefusal, refusal
from hami.core.requests import pod_request
from hami.core import schedule as schedule_module
from hami.core.schedule import pod_policies
from hami.vendors import build_vendors

from ._corekit import mig_gpu

VENDORS = build_vendors(chart_device_config())
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODELS = ("NVIDIA-Tesla T4", "NVIDIA-A100-PCIE-40GB")
RES = {
    "NVIDIA": ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"),
    "DCU": ("hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores"),
    "AMD": ("amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores"),
}
ANNOTATIONS = (
    {},
    {"nvidia.com/use-gputype": "T4"},
    {"nvidia.com/nouse-gputype": "A100"},
    {"nvidia.com/use-gputype": "H100"},
    {"nvidia.com/use-gputype": "A100,T4"},
    {"nvidia.com/vgpu-mode": "hami-core"},
    {"nvidia.com/nouse-gpuuuid": "GPU-n1-0"},
    {"nvidia.com/use-gpuuuid": "GPU-n2-1,GPU-n0-0"},
    {"nvidia.com/use-gpuuuid": "GPU-elsewhere"},
    {"nvidia.com/vgpu-mode": "mig"},
    {"nvidia.com/numa-bind": "true"},
    {"hami.io/gpu-scheduler-policy": "topology-aware"},
    {"hami.io/node-scheduler-policy": "spread"},
    # the mutex device policy: only GPUs nobody uses (the summaries' unused devices)
    {"hami.io/gpu-scheduler-policy": "mutex"},
    {"hami.io/gpu-scheduler-policy": "binpack,mutex"},
    {"hami.io/gpu-scheduler-policy": "mutex", "nvidia.com/use-gputype": "T4"},
    {"hami.io/gpu-scheduler-policy": "mutex", "nvidia.com/numa-bind": "true"},
)


def device(node: str, i: int, vendor: str, model: int, mem: int, count: int, health: bool, mig: bool) -> DeviceInfo:
    if vendor == "NVIDIA" and mig:
        return mig_gpu(node, i, health=health, numa=i % 2)
    typ = {"NVIDIA": MODELS[model], "DCU": "DCU-Z100", "AMD": "AMD-Instinct-MI300X"}[vendor]
    return DeviceInfo(
        id=f"GPU-{node}-{i}",
        index=i,
        count=count,
        devmem=mem,
        devcore=100,
        type=typ,
        numa=i % 2,
        mode="hami-core",
        health=health,
        vendor=vendor,
    )


device_st = st.tuples(
    st.sampled_from(("NVIDIA", "NVIDIA", "NVIDIA", "DCU", "AMD")),
    st.integers(0, 1),
    st.sampled_from((8000, 16384)),
    st.sampled_from((1, 2, 4)),
    st.sampled_from((True, True, True, True, False)),
    st.sampled_from((False, False, False, False, True)),
)
# a node of random devices, or of one kind of device (one model, as most nodes are)
devices_st = st.one_of(
    st.lists(device_st, min_size=0, max_size=4),
    st.builds(lambda d, k: [d] * k, device_st, st.integers(1, 4)),
)
request_st = st.tuples(
    st.sampled_from(("NVIDIA", "NVIDIA", "DCU", "AMD")),
    st.integers(1, 3),
    # MiB, or a percentage of each device's memory (NVIDIA; None: NVIDIA's default, 100 %)
    st.sampled_from((None, 1000, 4000, 9000, 20000, "30%", "60%", "100%")),
    st.sampled_from((None, 0, 30, 60, 80, 100)),
)
QUOTAS = (
    None,
    {"limits.nvidia.com/gpumem": 6000},
    {"limits.nvidia.com/gpumem": 30000},
    {"limits.nvidia.com/gpucores": 70},
    {"limits.nvidia.com/gpumem": 20000, "limits.nvidia.com/gpucores": 150},
)
probe_st = st.tuples(
    st.lists(request_st, min_size=1, max_size=2),
    st.sampled_from(ANNOTATIONS),
    st.sampled_from(("default", "team")),
    st.booleans(),  # a second, GPU-less container
)


def make_node(name: str, spec, cordon: tuple[int, ...] = ()) -> NodeDevices:
    devs = tuple(device(name, i, *d) for i, d in enumerate(spec))
    return NodeDevices(name=name, devices=devs, cordoned=frozenset(f"GPU-{name}-{i}" for i in cordon))


def make_pod(name: str, reqs, annotations=None, ns: str = "default", idle_ctr: bool = False) -> dict:
    containers = []
    for k, (vendor, nums, mem, cores) in enumerate(reqs):
        count, memory, core = RES[vendor]
        limits = {count: nums}
        if isinstance(mem, str):
            if vendor == "NVIDIA":
                limits["nvidia.com/gpumem-percentage"] = int(mem.rstrip("%"))
        elif mem is not None:
            limits[memory] = mem
        if cores:
            limits[core] = cores
        containers.append({"name": f"c{k}", "resources": {"limits": limits}})
    if idle_ctr:
        containers.append({"name": "idle", "resources": {}})
    raw = {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "annotations": dict(annotations or {})},
        "spec": {"containers": containers},
    }
    return admit_pod(raw, VENDORS)[0]


def same(a: NodeFailure, b: NodeFailure) -> bool:
    return (a.render(), a.codes(), a.container, a.vendor, a.bare) == (
        b.render(),
        b.codes(),
        b.container,
        b.vendor,
        b.bare,
    )


def check(led: Ledger, cfg: SchedulerConfig, p: dict, cands, busy) -> None:
    fast = filter_pod(p, cands, led, cfg, 0.0, busy=busy)
    slow = filter_pod(p, cands, led, cfg, 0.0, busy=busy, exact=True)
    assert fast.node == slow.node
    assert fast.allocation == slow.allocation and fast.annotations == slow.annotations
    if slow.node is None:
        assert set(fast.failed) == set(slow.failed)
        for n, f in slow.failed.items():
            assert same(fast.failed[n], f), (n, fast.failed[n], f)
    else:
        assert set(slow.failed) <= set(fast.failed)
        for n, f in fast.failed.items():
            alone = filter_pod(p, [n], led, cfg, 0.0, exact=True).failed[n]
            assert same(f, alone), (n, f, alone)


def unused_devices(led: Ledger, n: str, vendor: str) -> list[tuple[int, int, float]]:
    """``(MiB free, cores free, percentage bound)`` of each schedulable unused device of the vendor."""
    cordoned = led.node(n).cordoned
    return [
        (d.devmem - mem, d.devcore - cores, (d.devmem - mem + 1) * 100 / d.devmem if d.devmem else float("inf"))
        for d, used, mem, cores in led.device_usage(n)
        if d.vendor == vendor and d.health and d.id not in cordoned and used == 0 and d.count > 0
    ]


def check_ledger(led: Ledger) -> None:
    best: dict[str, tuple[int, int]] = {}
    unused: dict[str, tuple[int, int, float, int]] = {}
    for n in led.node_names():
        for v, vs in led.summary(n).vendors.items():
            if vs.free_slot:
                m, c = best.get(v, (-(10**9), -(10**9)))
                best[v] = (max(m, vs.max_free_mem), max(c, vs.max_free_cores))
            devs = unused_devices(led, n, v)  # the mutex fields, from the devices themselves
            assert vs.unused == len(devs), (n, v)
            if devs:
                mems, cores, pcts = zip(*devs)
                got = (vs.max_unused_mem, vs.min_unused_mem, vs.max_unused_cores, vs.min_unused_cores)
                assert got == (max(mems), min(mems), max(cores), min(cores)), (n, v)
                assert vs.max_unused_pct_bound == max(pcts), (n, v)
                m, c, p, k = unused.get(v, (-1, -1, -1.0, 0))
                unused[v] = (max(m, max(mems)), max(c, max(cores)), max(p, max(pcts)), max(k, len(devs)))
    for v in ("NVIDIA", "DCU", "AMD"):
        assert led.best_room(v) == best.get(v), v
        assert led.best_unused(v) == unused.get(v), v
    assert set(led.versions()) == set(led.node_names())
    for n in led.node_names():  # every device UUID leads to its node
        assert all(n in led.uuid_nodes([d.id]) for d in led.node(n).devices)
    assert led.uuid_nodes(["GPU-elsewhere"]) == set()
    for v in ("NVIDIA", "DCU", "AMD"):  # refusal classes: every node with the vendor, once
        classes = led.refusal_classes(v)
        expect: dict = {}
        for n in led.node_names():
            vs = led.summary(n).vendors.get(v)
            if vs is not None:
                expect.setdefault((vs.all, vs.devices == vs.all, vs.kinds, vs.free_slot, vs.unused), set()).add(n)
        assert {k: set(ns) for k, ns in classes.items()} == expect
        tags, tag_of = led.refusal_tags(v)  # each class one tag of its own; each node its class's
        assert set(tags) == set(expect) and len(set(tags.values())) == len(tags)
        assert tag_of == {n: tags[k] for k, ns in expect.items() for n in ns}


step_st = st.one_of(
    st.tuples(st.just("place"), request_st, st.integers(0, 9)),
    st.tuples(st.just("remove"), st.integers(0, 30)),
    st.tuples(st.just("reset"), st.integers(0, 9), devices_st, st.lists(st.integers(0, 3), max_size=2)),
    st.tuples(st.just("drop"), st.integers(0, 9)),
    st.tuples(st.just("quota"), st.sampled_from(QUOTAS)),
    st.tuples(st.just("busy"), st.integers(0, 9), st.sampled_from(("all", "named", "few"))),
)


@SETTINGS
@given(
    st.lists(devices_st, min_size=2, max_size=7),
    st.lists(probe_st, min_size=1, max_size=3),
    st.lists(step_st, min_size=1, max_size=15),
    st.sampled_from(("binpack", "spread")),
)
def test_cheap_refusals_give_the_exact_paths_answer(nodes, probes, steps, policy):
    cfg = SchedulerConfig(VENDORS, node_policy=policy)
    pool = [make_pod(f"probe{k}", reqs, ann, ns, idle) for k, (reqs, ann, ns, idle) in enumerate(probes)]
    cands, busy = None, None
    led = Ledger()
    specs = {f"n{i}": spec for i, spec in enumerate(nodes)}
    for name, spec in specs.items():
        led.set_node(make_node(name, spec))
    names = sorted(specs)
    placed: list[str] = []
    for k, step in enumerate(steps):
        kind = step[0]
        if kind == "place":
            _, req, where = step
            r = schedule_pod(make_pod(f"bg{k}", [req], ns="team"), [names[where % len(names)]], led, cfg, 0.0)
            if r.allocation is not None:
                placed.append(r.allocation.key)
        elif kind == "remove" and placed:
            led.remove_pod(placed.pop(step[1] % len(placed)))
        elif kind == "reset":
            _, where, spec, cordon = step
            led.set_node(make_node(names[where % len(names)], spec, tuple(cordon)))
        elif kind == "drop":
            name = names[step[1] % len(names)]
            if led.has_node(name):
                led.remove_node(name)
            else:
                led.set_node(make_node(name, specs[name]))
        elif kind == "quota":
            led.set_quota("team", "q", step[1] or {}, VENDORS)
        elif kind == "busy":  # what kube-scheduler offers from now on, and the nodes binding
            pick, which = step[1], step[2]
            cands = {"all": None, "named": names + ["ghost"], "few": names[pick % len(names) :][:2]}[which]
            busy = {names[pick % len(names)]: 2} if pick % 3 == 0 else None
        # the same pods again after every change (kube-scheduler's retries of pending pods)
        for p in pool:
            check(led, cfg, p, cands, busy)
        check_ledger(led)


single_node_st = (
    st.lists(devices_st, min_size=1, max_size=5),
    st.lists(request_st, max_size=12),
    st.lists(request_st, min_size=1, max_size=3),
    st.sampled_from(QUOTAS),
    st.data(),
)


@SETTINGS
@given(*single_node_st)
def test_a_summary_refusal_is_the_fits_refusal(nodes, background, reqs, quota, data):
    summary_matches_fit(nodes, background, reqs, quota, data)


def drawn_cluster(nodes, background, reqs, quota, data, cfg: SchedulerConfig) -> tuple[Ledger, dict, str]:
    """The ledger of drawn nodes (some GPUs cordoned), a quota in ``team`` and the background pods
    placed by ``cfg``; and the probe pod with its namespace."""
    led = Ledger()
    for i, spec in enumerate(nodes):
        cordon = tuple(data.draw(st.lists(st.integers(0, 3), max_size=1)))
        led.set_node(make_node(f"n{i}", spec, cordon))
    led.set_quota("team", "q", quota or {}, VENDORS)
    for k, b in enumerate(background):
        schedule_pod(make_pod(f"bg{k}", [b], ns="team"), [f"n{k % len(nodes)}"], led, cfg, 0.0)
    ns = data.draw(st.sampled_from(("default", "team")))
    p = make_pod("probe", reqs, data.draw(st.sampled_from(ANNOTATIONS)), ns, data.draw(st.booleans()))
    return led, p, ns


def summary_matches_fit(nodes, background, reqs, quota, data) -> None:
    cfg = SchedulerConfig(VENDORS)
    led, p, ns = drawn_cluster(nodes, background, reqs, quota, data, cfg)
    pr = pod_request(p, VENDORS)
    _, policy, weights = pod_policies(pr, cfg)
    ctx = make_context(pr, VENDORS, policy, weights, led.quota_room(ns, VENDORS))
    refuse = refusal(ctx, led.uuid_nodes)
    for n in led.node_names():
        got = refuse(led.summary(n), n) if refuse is not None else None
        if got is not None:
            fit = fit_pod(led.view(n), ctx)
            assert isinstance(fit, NodeFailure), (n, got)
            assert same(got, fit) and got.total == fit.total, (n, got, fit)


def _plant_static_pass(mp: pytest.MonkeyPatch) -> None:
    """The static filter's refusal read as a pass: a model the pod excludes judged on memory."""
    real = SummaryRefusal.static
    mp.setattr(
        SummaryRefusal,
        "static",
        lambda self, kinds: True if isinstance(real(self, kinds), Reason) else real(self, kinds),
    )


def _plant_quota_ignored(mp: pytest.MonkeyPatch) -> None:
    """A namespace quota that one device's use exceeds, overlooked."""
    real = SummaryRefusal.__init__

    def init(self, ctx, ci, req, over_quota, *rest):
        real(self, ctx, ci, req, False, *rest)

    mp.setattr(SummaryRefusal, "__init__", init)


def _plant_percent_as_mib(mp: pytest.MonkeyPatch) -> None:
    """A percentage of each device's memory compared with the free MiB as if it were MiB x 100."""
    real = SummaryRefusal.__init__

    def init(self, *args):
        real(self, *args)
        if self.pct is not None:
            self.memreq, self.pct = self.pct * 100, None

    mp.setattr(SummaryRefusal, "__init__", init)


def _plant_last_request(mp: pytest.MonkeyPatch) -> None:
    """The last device request summarised, where the fit refuses the node at the first."""

    real = refusal

    def last(ctx, *rest):
        asks = [(ci, r) for ci, c in enumerate(ctx.pod.containers) for r in c.requests]
        got = real(ctx, *rest)
        if got is None or len(asks) < 2:
            return got
        ci, req = asks[-1]
        return SummaryRefusal(ctx, ci, req, got.over_quota, False, got.holders)

    mp.setattr(sys.modules[__name__], "refusal", last)


def _plant_holders_ignored(mp: pytest.MonkeyPatch) -> None:
    """The nodes holding a GPU the pod names by UUID judged like the others."""
    real = SummaryRefusal.__init__

    def init(self, *args):
        real(self, *args)
        self.holders = frozenset()

    mp.setattr(SummaryRefusal, "__init__", init)


def _plant_mutex_ignored(mp: pytest.MonkeyPatch) -> None:
    """A pod under the mutex device policy judged as if every GPU with a free slot were open."""
    real = SummaryRefusal.__init__

    def init(self, *args):
        real(self, *args)
        self.mutex = False

    mp.setattr(SummaryRefusal, "__init__", init)


def _plant_shared_as_slots(mp: pytest.MonkeyPatch) -> None:
    """Under mutex, a GPU in use counted on its slots instead of ExclusiveDeviceAllocateConflict."""
    real = SummaryRefusal._failure
    mp.setattr(SummaryRefusal, "_failure", lambda self, total, short, why, shared=0: real(self, total, short, why))


FAULTS = {
    "mutex ignored": _plant_mutex_ignored,
    "shared GPUs counted on slots": _plant_shared_as_slots,
    "UUID holders summarised": _plant_holders_ignored,
    "static refusal read as a pass": _plant_static_pass,
    "quota ignored": _plant_quota_ignored,
    "percentage read as MiB": _plant_percent_as_mib,
    "last request summarised": _plant_last_request,
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_wrong_summary_is_caught(fault, monkeypatch):
    """The comparison with the fit can fail: each planted fault in the summary rules is found."""
    FAULTS[fault](monkeypatch)
    run = settings(
        max_examples=1500,
        deadline=None,
        derandomize=True,
        database=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )(given(*single_node_st)(summary_matches_fit))
    with pytest.raises(AssertionError):
        run()


GOOD, SICK = ("NVIDIA", 0, 16384, 4, True, False), ("NVIDIA", 0, 16384, 4, False, False)


def test_a_retry_refits_only_the_nodes_that_changed():
    cfg = SchedulerConfig(VENDORS)
    led = Ledger()
    for i in range(6):
        led.set_node(make_node(f"n{i}", [GOOD, SICK]))
    memo = led.verdicts
    # an unhealthy GPU on every node: the summary rules do not cover it, so nodes are fitted
    uuid = {"nvidia.com/use-gputype": "H100"}
    p = make_pod("big", [("NVIDIA", 1, 1000, None)], uuid)
    first = filter_pod(p, None, led, cfg, 0.0)
    assert first.node is None and len(first.failed) == 6 and memo.recorded == 6
    again = filter_pod(p, None, led, cfg, 0.0)
    assert memo.recorded == 6 and again.reasons() == first.reasons()
    schedule_pod(make_pod("bg", [("NVIDIA", 1, 1000, None)]), ["n3"], led, cfg, 0.0)
    third = filter_pod(p, None, led, cfg, 0.0)
    assert memo.recorded == 7 and third.reasons() == first.reasons()  # n3 alone was fitted again
    # another pod of the same shape (other name, same request): the same refusals, nothing fitted
    twin = make_pod("twin", [("NVIDIA", 1, 1000, None)], uuid)  # the same type
    assert filter_pod(twin, None, led, cfg, 0.0).reasons() == first.reasons() and memo.recorded == 7
    # another shape is fitted afresh; a node re-registered is fitted afresh
    led.set_node(make_node("n0", [GOOD, GOOD, SICK]))
    assert filter_pod(p, None, led, cfg, 0.0).failed["n0"].total == 3 and memo.recorded == 8
    # a new configuration object forgets everything
    other = replace(cfg, gpu_policy="binpack")
    filter_pod(p, None, led, other, 0.0)
    assert memo.recorded == 14


def test_a_pod_too_big_for_every_gpu_is_refused_from_summaries():
    cfg = SchedulerConfig(VENDORS)
    led = Ledger()
    for i in range(4):
        led.set_node(make_node(f"n{i}", [("NVIDIA", 0, 16384, 1, True, False)] * 4))
    schedule_pod(make_pod("bg", [("NVIDIA", 2, 1000, None)]), ["n1"], led, cfg, 0.0)
    result = filter_pod(make_pod("big", [("NVIDIA", 1, 20000, None)]), None, led, cfg, 0.0)
    assert result.node is None and led.verdicts.recorded == 4
    assert result.reasons()["n0"] == "4/4 CardInsufficientMemory"
    assert result.reasons()["n1"] == "2/4 CardInsufficientMemory, 2/4 CardTimeSlicingExhausted"
    exact = filter_pod(make_pod("big", [("NVIDIA", 1, 20000, None)]), None, led, cfg, 0.0, exact=True)
    assert exact.reasons() == result.reasons()
    too_many = filter_pod(make_pod("many", [("NVIDIA", 5, 1000, None)]), None, led, cfg, 0.0)
    assert too_many.reasons()["n0"] == "NodeInsufficientDevice"


def test_cores_refusal_only_when_every_open_gpu_has_the_memory():
    cfg = SchedulerConfig(VENDORS)
    led = Ledger()
    led.set_node(make_node("n0", [("NVIDIA", 0, 16384, 4, True, False)] * 2))
    led.set_node(make_node("n1", [("NVIDIA", 0, 16384, 4, True, False)] * 2))
    for k, (where, mem, cores) in enumerate(((0, 12000, 70), (1, 1000, 80), (2, 1000, 80), (3, 1000, 70))):
        node, gpu = divmod(where, 2)
        p = make_pod(f"bg{k}", [("NVIDIA", 1, mem, cores)], {"nvidia.com/use-gpuuuid": f"GPU-n{node}-{gpu}"})
        assert schedule_pod(p, [f"n{node}"], led, cfg, 0.0).node == f"n{node}"
    probe = make_pod("probe", [("NVIDIA", 1, 8000, 50)])
    fast = filter_pod(probe, None, led, cfg, 0.0)
    exact = filter_pod(probe, None, led, cfg, 0.0, exact=True)
    # n0: one GPU lacks the memory, the other the cores; n1: both lack the cores (summary-refused)
    assert exact.reasons() == {
        "n0": "1/2 CardInsufficientCore, 1/2 CardInsufficientMemory",
        "n1": "2/2 CardInsufficientCore",
    }
    assert fast.reasons() == exact.reasons()


def _placed(led: Ledger, cfg: SchedulerConfig, node: str, gpus: list[tuple[int, int, int]]) -> None:
    """One background pod per ``(gpu, MiB, cores)`` on that very GPU of ``node``."""
    for k, (gpu, mem, cores) in enumerate(gpus):
        p = make_pod(f"bg-{node}-{k}", [("NVIDIA", 1, mem, cores)], {"nvidia.com/use-gpuuuid": f"GPU-{node}-{gpu}"})
        assert schedule_pod(p, [node], led, cfg, 0.0).node == node


@pytest.mark.parametrize(
    "devices, background, probe, annotations, expected",
    [
        # a GPU with a slot but every core taken refuses a pod asking no cores
        (
            2,
            [(0, 1000, 100), (1, 1000, 0), (1, 1000, 0)],
            (2, 1000, None),
            {},
            "1/2 CardComputeUnitsExhausted, 1/2 CardTimeSlicingExhausted",
        ),
        # under NUMA binding the walk drops a GPU of the other NUMA node
        (
            4,
            [(2, 1000, 0), (2, 1000, 0), (3, 1000, 0), (3, 1000, 0)],
            (3, 1000, None),
            {"nvidia.com/numa-bind": "true"},
            "1/4 AllocatedCardsInsufficientRequest, 1/4 NumaNotFit, 2/4 CardTimeSlicingExhausted",
        ),
        # one open GPU lacks the cores, the other is taken, and still too few
        (
            3,
            [(0, 1000, 80), (2, 1000, 10), (2, 1000, 10)],
            (3, 1000, 30),
            {},
            "1/3 AllocatedCardsInsufficientRequest, 1/3 CardInsufficientCore, 1/3 CardTimeSlicingExhausted",
        ),
        # the summary settles it: every open GPU would do, there are too few
        (
            3,
            [(2, 1000, 10), (2, 1000, 10)],
            (3, 1000, 30),
            {},
            "1/3 CardTimeSlicingExhausted, 2/3 AllocatedCardsInsufficientRequest",
        ),
    ],
)
def test_too_few_open_gpus(devices, background, probe, annotations, expected):
    cfg = SchedulerConfig(VENDORS)
    led = Ledger()
    led.set_node(make_node("n0", [("NVIDIA", 0, 16384, 2, True, False)] * devices))
    _placed(led, cfg, "n0", background)
    p = make_pod("probe", [("NVIDIA", *probe)], annotations)
    exact = filter_pod(p, None, led, cfg, 0.0, exact=True)
    assert exact.reasons() == {"n0": expected}
    assert filter_pod(p, None, led, cfg, 0.0).reasons() == {"n0": expected}


MUTEX = {"hami.io/gpu-scheduler-policy": "mutex"}


def _one_model_cluster() -> tuple[Ledger, SchedulerConfig]:
    """n0, n1: two T4s each, in use (one pod on each of n0's, one on n1's first); n2: two idle
    A100s; n3: a T4 and an A100 (models a type selection splits: left to the fit)."""
    cfg = SchedulerConfig(VENDORS)
    led = Ledger()
    t4, a100 = ("NVIDIA", 0, 16384, 2, True, False), ("NVIDIA", 1, 16384, 2, True, False)
    for name, spec in (("n0", [t4] * 2), ("n1", [t4] * 2), ("n2", [a100] * 2), ("n3", [t4, a100])):
        led.set_node(make_node(name, spec))
    _placed(led, cfg, "n0", [(0, 4000, 10), (1, 4000, 10)])
    _placed(led, cfg, "n1", [(0, 4000, 10)])
    return led, cfg


@pytest.mark.parametrize(
    "reqs, annotations, ns, summarised",
    [
        # a model the selection refuses on every GPU of the node: one judgment per class
        ([("NVIDIA", 1, 20000, None)], {"nvidia.com/use-gputype": "A100"}, "default", {"n0", "n1", "n2"}),
        # a percentage of each GPU's memory (100 %: a whole GPU), every T4 of n0 in use
        ([("NVIDIA", 2, "100%", None)], {"nvidia.com/nouse-gputype": "A100"}, "default", {"n0", "n2"}),
        # one GPU's memory exceeds what the namespace quota has left: ResourceQuotaNotFit on every open GPU
        ([("NVIDIA", 1, 9000, None)], {}, "team", {"n0", "n1", "n2", "n3"}),
        # two containers: the first one's request decides (it is fitted first, on the node as it is)
        (
            [("NVIDIA", 1, 20000, None), ("NVIDIA", 1, 1000, None)],
            {"nvidia.com/use-gputype": "T4"},
            "default",
            {"n0", "n1", "n2"},
        ),
        # mutex: only unused GPUs are open; n0's T4s are both in use, n1 has one unused, too few
        ([("NVIDIA", 2, 1000, None)], MUTEX | {"nvidia.com/use-gputype": "T4"}, "default", {"n0", "n1", "n2"}),
        # mutex: no unused GPU has the memory (n0: none unused; n3's two models both pass)
        ([("NVIDIA", 1, 20000, None)], MUTEX, "default", {"n0", "n1", "n2", "n3"}),
        # mutex: one GPU's memory exceeds the quota's room: every unused GPU refuses on quota
        ([("NVIDIA", 1, 9000, 100)], MUTEX, "team", {"n0", "n1", "n2", "n3"}),
        # mutex, a whole GPU each: n1's unused T4 has the memory (fitted), n0 has none unused
        ([("NVIDIA", 2, "100%", None)], MUTEX | {"nvidia.com/nouse-gputype": "A100"}, "default", {"n0", "n2"}),
    ],
)
def test_new_shapes_are_refused_from_summaries(reqs, annotations, ns, summarised, monkeypatch):
    led, cfg = _one_model_cluster()
    led.set_quota("team", "q", {"limits.nvidia.com/gpumem": 6000}, VENDORS)
    p = make_pod("probe", reqs, annotations, ns)
    exact = filter_pod(p, None, led, cfg, 0.0, exact=True)
    assert exact.node is None and set(exact.failed) == {"n0", "n1", "n2", "n3"}
    fitted: list[str] = []
    real = schedule_module.fit_pod
    monkeypatch.setattr(schedule_module, "fit_pod", lambda view, ctx: fitted.append(view.name) or real(view, ctx))
    fast = filter_pod(p, None, led, cfg, 0.0)
    assert fast.reasons() == exact.reasons()
    assert set(fitted) == {"n0", "n1", "n2", "n3"} - summarised  # the others read from summaries


def test_the_ledger_keeps_the_unused_gpus_of_each_node_and_the_clusters_best():
    cfg = SchedulerConfig(VENDORS)
    led = Ledger()
    led.set_node(make_node("n0", [("NVIDIA", 0, 16384, 4, True, False), ("NVIDIA", 1, 8000, 4, True, False)] * 2))
    led.set_node(make_node("n1", [("NVIDIA", 0, 16384, 4, True, False)] * 2, cordon=(1,)))
    _placed(led, cfg, "n0", [(0, 1000, 30)])
    v = led.summary("n0").vendors["NVIDIA"]
    # GPU 0 in use; the unused: an 8000 MiB A100 (1), a 16384 MiB T4 (2) and an 8000 MiB A100 (3)
    assert (v.free_slot, v.unused) == (4, 3)
    assert (v.max_unused_mem, v.min_unused_mem, v.max_unused_cores, v.min_unused_cores) == (16384, 8000, 100, 100)
    assert led.summary("n1").vendors["NVIDIA"].unused == 1  # the cordoned GPU is not open
    # the percentage bound: (free + 1) * 100 / memory, largest on the smaller GPU
    assert led.best_unused("NVIDIA") == (16384, 100, (8000 + 1) * 100 / 8000, 3)
    _placed(led, cfg, "n1", [(0, 1000, 30)])
    (gone,) = [a.key for a in led.pods() if a.node == "n0"]
    led.remove_pod(gone)
    assert led.summary("n0").vendors["NVIDIA"].unused == 4 and led.best_unused("NVIDIA")[3] == 4
    for node, gpus in (("n0", 4), ("n1", 1)):  # every schedulable GPU with a sharer: none left
        _placed(led, cfg, node, [(g, 1000, 10) for g in range(gpus)])
    assert led.best_unused("NVIDIA") is None and led.best_room("NVIDIA") is not None


def test_a_mutex_pod_when_every_gpu_has_a_sharer_is_refused_without_a_fit(monkeypatch):
    cfg = SchedulerConfig(VENDORS)
    led = Ledger()
    for name in ("n0", "n1", "n2"):
        led.set_node(make_node(name, [("NVIDIA", 0, 16384, 2, True, False)] * 3))
    _placed(led, cfg, "n0", [(0, 1000, 10), (1, 1000, 10), (2, 1000, 10)])
    _placed(led, cfg, "n1", [(0, 1000, 10), (0, 1000, 10), (1, 1000, 10), (2, 1000, 10)])
    _placed(led, cfg, "n2", [(0, 1000, 10), (0, 1000, 10), (1, 1000, 10), (1, 1000, 10), (2, 1000, 10)])
    p = make_pod("probe", [("NVIDIA", 1, 1000, 10)], MUTEX)
    expected = {
        "n0": "3/3 ExclusiveDeviceAllocateConflict",
        "n1": "1/3 CardTimeSlicingExhausted, 2/3 ExclusiveDeviceAllocateConflict",
        "n2": "1/3 ExclusiveDeviceAllocateConflict, 2/3 CardTimeSlicingExhausted",
    }
    assert filter_pod(p, None, led, cfg, 0.0, exact=True).reasons() == expected
    fitted: list[str] = []
    real = schedule_module.fit_pod
    monkeypatch.setattr(schedule_module, "fit_pod", lambda view, ctx: fitted.append(view.name) or real(view, ctx))
    assert filter_pod(p, None, led, cfg, 0.0).reasons() == expected
    assert fitted == []  # no node fitted: not in the search (no unused GPU anywhere), nor for its reason
