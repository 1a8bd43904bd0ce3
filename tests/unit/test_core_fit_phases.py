"""One table per phase of ``hami.core.fit.fit_container``: candidates (with ``static_reason``),
rank, walk and choose; and the per-pod plan that ``make_context`` computes once."""

from dataclasses import replace

import pytest

from hami.core import NodeDevices, pod_request
from hami.core.fit import (
    QuotaRoom,
    Walk,
    candidates,
    choose,
    make_context,
    rank,
    static_reason,
    walk,
)
from hami.core.reasons import NodeFailure, Reason, ReasonCounter
from hami.core.score import DEFAULT_WEIGHTS, parse_gpu_policy
from hami.core.types import ContainerKind

from ._corekit import CONFIG, ctr, gpu, ledger, mig_gpu, pod

T4 = 16384  # MiB of the default test GPU


def setup(
    devices, container=None, annotations=None, policy="spread", cordoned=(), usage=None, pair_scores=None, init=None
):
    """A view of node ``n`` holding ``devices`` (``usage``: position -> (slots, MiB, cores) already
    taken) and the plan of the pod's first container with a device request."""
    nd = NodeDevices(
        name="n",
        devices=tuple(devices),
        cordoned=frozenset(f"GPU-n-{i}" for i in cordoned),
        pair_scores=pair_scores or {},
    )
    view = ledger(nd).view("n")
    for i, (slots, mem, cores) in (usage or {}).items():
        view.take(i, mem, cores, slots)
    req = pod_request(pod(containers=[container or ctr()], init=init, annotations=annotations), CONFIG.vendors)
    ctx = make_context(req, CONFIG.vendors, parse_gpu_policy(policy), DEFAULT_WEIGHTS)
    return view, ctx.plans[(len(init or ()), "NVIDIA")]


def gpus(n, **kw):
    return [gpu("n", i, **kw) for i in range(n)]


def by_reason(counter: ReasonCounter) -> dict[str, list[str]]:
    return {r.value: uuids for r, uuids in counter.by_reason.items()}


# ------------------------------------------------------------------ the plan (PreFilter)


def test_make_context_plans_every_container_request_once():
    req = pod_request(
        pod(
            containers=[ctr("a", mem=1000), ctr("b", gpu=None), ctr("c", gpu=2, mem=500)],
            init=[ctr("i", mem=100)],
            annotations={"nvidia.com/numa-bind": "true"},
        ),
        CONFIG.vendors,
    )
    ctx = make_context(req, CONFIG.vendors, parse_gpu_policy("binpack,topology-aware"), DEFAULT_WEIGHTS)
    assert sorted(ctx.plans) == [(0, "NVIDIA"), (1, "NVIDIA"), (3, "NVIDIA")]
    plan = ctx.plans[(3, "NVIDIA")]
    assert (plan.ci, plan.req.nums, plan.req.memreq) == (3, 2, 500)
    assert plan.kinds == (ContainerKind.INIT, ContainerKind.APP, ContainerKind.APP, ContainerKind.APP)
    assert plan.sel.numa_bind and plan.collect  # topology-aware: every fitting device is gathered first
    assert plan.sel is ctx.plans[(0, "NVIDIA")].sel  # one Selection per vendor per pod


# ------------------------------------------------------------------ phase 1: candidates

# (description, devices, container, positions, MiB per position), or a bare failure's rendering
CANDIDATES = [
    ("every device of the vendor", gpus(3), ctr(mem=1000), [0, 1, 2], {0: 1000, 1: 1000, 2: 1000}),
    (
        "another vendor's devices are left out",
        [gpu("n", 0), replace(gpu("n", 1), vendor="DCU"), gpu("n", 2)],
        ctr(mem=1000),
        [0, 2],
        {0: 1000, 2: 1000},
    ),
    (
        "a type without NVIDIA in it is not served",
        [gpu("n", 0), gpu("n", 1, type_="Tesla T4")],
        ctr(mem=10),
        [0],
        {0: 10},
    ),
    (
        "unhealthy and cordoned devices are still candidates (counted in the reasons)",
        [gpu("n", 0, health=False), gpu("n", 1)],
        ctr(mem=10),
        [0, 1],
        {0: 10, 1: 10},
    ),
    (
        "percentage memory is resolved per device",
        [gpu("n", 0), gpu("n", 1, mem=8192)],
        ctr(pct=50),
        [0, 1],
        {0: 8192, 1: 4096},
    ),
    ("no memory asked: the whole card", gpus(1), ctr(), [0], {0: T4}),
    ("too few devices", gpus(2), ctr(gpu=3), "NodeInsufficientDevice", None),
    (
        "too few counting only the vendor's devices",
        [gpu("n", 0), replace(gpu("n", 1), vendor="DCU")],
        ctr(gpu=2),
        "NodeInsufficientDevice",
        None,
    ),
    ("one MIG-mode GPU may serve several of nums", [mig_gpu("n", 0)], ctr(gpu=2, mem=4000), [0], {0: 4000}),
]


@pytest.mark.parametrize(
    "devices, container, positions, mems", [c[1:] for c in CANDIDATES], ids=[c[0] for c in CANDIDATES]
)
def test_candidates(devices, container, positions, mems):
    view, plan = setup(devices, container)
    got = candidates(view, plan)
    if isinstance(positions, str):
        assert isinstance(got, NodeFailure) and got.bare and got.render() == positions
        assert (got.total, got.container, got.vendor) == (sum(d.vendor == "NVIDIA" for d in devices), 0, "NVIDIA")
    else:
        assert (list(got), got) == (positions, mems)


# (description, device, cordoned positions, pod annotations, reason or None)
STATIC = [
    ("healthy, no selection", gpu("n", 0), (), {}, None),
    ("not healthy", gpu("n", 0, health=False), (), {}, Reason.CARD_NOT_HEALTH),
    ("not healthy wins over cordoned", gpu("n", 0, health=False), (0,), {}, Reason.CARD_NOT_HEALTH),
    ("cordoned", gpu("n", 0), (0,), {}, Reason.CARD_CORDONED),
    ("cordoned wins over a type mismatch", gpu("n", 0), (0,), {"nvidia.com/use-gputype": "A100"}, Reason.CARD_CORDONED),
    ("use-gputype", gpu("n", 0), (), {"nvidia.com/use-gputype": "A100"}, Reason.CARD_TYPE_MISMATCH),
    ("nouse-gputype", gpu("n", 0), (), {"nvidia.com/nouse-gputype": "t4"}, Reason.CARD_TYPE_MISMATCH),
    ("use-gpuuuid elsewhere", gpu("n", 0), (), {"nvidia.com/use-gpuuuid": "GPU-n-1"}, Reason.CARD_UUID_MISMATCH),
    ("nouse-gpuuuid", gpu("n", 0), (), {"nvidia.com/nouse-gpuuuid": "GPU-n-0"}, Reason.CARD_UUID_MISMATCH),
    (
        "vgpu-mode excludes the device's mode",
        gpu("n", 0),
        (),
        {"nvidia.com/vgpu-mode": "mig"},
        Reason.CARD_TYPE_MISMATCH,
    ),
]


@pytest.mark.parametrize("device, cordoned, annotations, reason", [c[1:] for c in STATIC], ids=[c[0] for c in STATIC])
def test_static_reason(device, cordoned, annotations, reason):
    view, plan = setup([device], ctr(mem=10), annotations, cordoned=cordoned)
    assert static_reason(view, plan, view.devices[0]) == reason


# ------------------------------------------------------------------ phase 2: rank

# (description, devices, usage, policy, annotations, order tried)
RANK = [
    ("spread: emptiest first, then index", gpus(3), {0: (1, 4000, 0)}, "spread", {}, [1, 2, 0]),
    ("binpack: fullest first", gpus(3), {1: (1, 4000, 0)}, "binpack", {}, [1, 0, 2]),
    ("equal scores: index order", gpus(3), {}, "binpack", {}, [0, 1, 2]),
    (
        "numa policy: highest NUMA node first",
        [gpu("n", i, numa=i // 2) for i in range(4)],
        {},
        "numa",
        {},
        [2, 3, 0, 1],
    ),
    (
        "numa-bind with binpack: lowest NUMA node first, binpack inside it",
        [gpu("n", i, numa=i // 2) for i in range(4)],
        {3: (1, 100, 0)},
        "binpack",
        {"nvidia.com/numa-bind": "true"},
        [0, 1, 3, 2],
    ),
    ("mutex alone: least used first", gpus(3), {0: (2, 0, 0), 1: (1, 0, 0)}, "mutex", {}, [2, 1, 0]),
    (
        "score counts the request: a smaller card fills faster",
        [gpu("n", 0), gpu("n", 1, mem=8192)],
        {},
        "binpack",
        {},
        [1, 0],
    ),
]


@pytest.mark.parametrize("devices, usage, policy, annotations, order", [c[1:] for c in RANK], ids=[c[0] for c in RANK])
def test_rank(devices, usage, policy, annotations, order):
    view, plan = setup(devices, ctr(mem=2000, cores=10), annotations, policy=policy, usage=usage)
    assert rank(view, plan, candidates(view, plan)) == order


# ------------------------------------------------------------------ phase 3: walk

# (description, devices, usage, cordoned, container, policy, annotations, positions taken, met, reasons)
WALK = [
    ("first fit", gpus(2), {}, (), ctr(mem=1000), "binpack", {}, [0], True, {}),
    (
        "memory short on the first tried",
        gpus(2),
        {0: (1, 16000, 0)},
        (),
        ctr(mem=1000),
        "binpack",
        {},
        [1],
        True,
        {"CardInsufficientMemory": ["GPU-n-0"]},
    ),
    (
        "static reasons in the order tried",
        [gpu("n", 0, health=False), gpu("n", 1), gpu("n", 2)],
        {},
        (1,),
        ctr(mem=10),
        "binpack",
        {},
        [2],
        True,
        {"CardNotHealth": ["GPU-n-0"], "CardCordoned": ["GPU-n-1"]},
    ),
    (
        "falls short: keeps what it took",
        gpus(2),
        {0: (1, 16000, 0)},
        (),
        ctr(gpu=2, mem=1000),
        "binpack",
        {},
        [1],
        False,
        {"CardInsufficientMemory": ["GPU-n-0"]},
    ),
    (
        "numa-bind: another NUMA node drops the partial pick",
        [gpu("n", 0), gpu("n", 1, numa=1), gpu("n", 2, numa=1)],
        {},
        (),
        ctr(gpu=2, mem=10),
        "binpack",
        {"nvidia.com/numa-bind": "true"},
        [1, 2],
        True,
        {"NumaNotFit": ["GPU-n-0"]},
    ),
    (
        "collecting (topology-aware): every fitting device",
        gpus(3),
        {2: (10, 0, 0)},
        (),
        ctr(mem=10),
        "topology-aware",
        {},
        [0, 1],
        False,
        {"CardTimeSlicingExhausted": ["GPU-n-2"]},
    ),
    (
        "a MIG-mode GPU is taken again while it fits",
        [mig_gpu("n", 0)],
        {},
        (),
        ctr(gpu=3, mem=9000),
        "binpack",
        {},
        [0, 0, 0],
        True,
        {},
    ),
    (
        "a MIG-mode GPU is left when full: the next one serves the rest",
        [mig_gpu("n", 0), mig_gpu("n", 1)],
        {},
        (),
        ctr(gpu=3, mem=19000),
        "binpack",
        {},
        [0, 0, 1],
        True,
        {"CardInsufficientMemory": ["GPU-n-0"]},
    ),
]


@pytest.mark.parametrize(
    "devices, usage, cordoned, container, policy, annotations, taken, met, reasons",
    [c[1:] for c in WALK],
    ids=[c[0] for c in WALK],
)
def test_walk(devices, usage, cordoned, container, policy, annotations, taken, met, reasons):
    view, plan = setup(devices, container, annotations, policy=policy, cordoned=cordoned, usage=usage)
    cands = candidates(view, plan)
    done = walk(view, plan, cands, rank(view, plan, cands), [])
    assert ([i for i, _ in done.chosen], done.met, by_reason(done.reasons)) == (taken, met, reasons)
    assert all(m == cands[i] for i, m in done.chosen)


# ------------------------------------------------------------------ phase 4: choose

LINKED = {
    "GPU-n-0": {"GPU-n-1": 100, "GPU-n-2": 10},
    "GPU-n-1": {"GPU-n-0": 100, "GPU-n-2": 10},
    "GPU-n-2": {"GPU-n-0": 10, "GPU-n-1": 10},
}


def counter(total, **reasons):
    out = ReasonCounter(total=total)
    for code, uuids in reasons.items():
        for u in uuids:
            out.add(Reason(code), u)
    return out


# (description, container, policy, quota MiB, walk (positions taken, met, reasons), granted UUIDs or failure)
CHOOSE = [
    (
        "met: granted as walked",
        ctr(gpu=2, mem=100),
        "binpack",
        None,
        ([1, 0], True, counter(3)),
        ["GPU-n-1", "GPU-n-0"],
    ),
    (
        "short: each device taken counts AllocatedCardsInsufficientRequest",
        ctr(gpu=2, mem=100),
        "binpack",
        None,
        ([1], False, counter(3, CardInsufficientMemory=["GPU-n-0", "GPU-n-2"])),
        "1/3 AllocatedCardsInsufficientRequest, 2/3 CardInsufficientMemory",
    ),
    (
        "nothing taken: the walk's reasons alone",
        ctr(mem=100),
        "binpack",
        None,
        ([], False, counter(3, CardNotHealth=["GPU-n-0", "GPU-n-1", "GPU-n-2"])),
        "3/3 CardNotHealth",
    ),
    (
        "topology-aware, one device: the least connected",
        ctr(mem=100),
        "topology-aware",
        None,
        ([0, 1, 2], False, counter(3)),
        ["GPU-n-2"],
    ),
    (
        "topology-aware, two devices: the best linked pair",
        ctr(gpu=2, mem=100),
        "topology-aware",
        None,
        ([2, 0, 1], False, counter(3)),
        ["GPU-n-0", "GPU-n-1"],
    ),
    (
        "topology-aware, too few collected",
        ctr(gpu=2, mem=100),
        "topology-aware",
        None,
        ([2], False, counter(3, CardInsufficientMemory=["GPU-n-0", "GPU-n-1"])),
        "1/3 AllocatedCardsInsufficientRequest, 2/3 CardInsufficientMemory",
    ),
    (
        "topology-aware, no combination within the quota",
        ctr(gpu=2, mem=100),
        "topology-aware",
        150,
        ([0, 1, 2], False, counter(3)),
        "3/3 ResourceQuotaNotFit",
    ),
]


@pytest.mark.parametrize(
    "container, policy, quota, walked, expected", [c[1:] for c in CHOOSE], ids=[c[0] for c in CHOOSE]
)
def test_choose(container, policy, quota, walked, expected):
    view, plan = setup(gpus(3), container, policy=policy, pair_scores=LINKED)
    if quota is not None:
        plan = replace(plan, quota=QuotaRoom({"NVIDIA": (quota, None)}))
    taken, met, reasons = walked
    got = choose(view, plan, Walk([(i, plan.req.memreq) for i in taken], reasons, met), [])
    if isinstance(expected, str):
        assert isinstance(got, NodeFailure) and got.render() == expected and got.container == 0
    else:
        assert [d.uuid for d in got] == expected
        assert all(d.usedmem == 100 for d in got)
