"""Pods HAMi v2.10 placed: ``hami.io/vgpu-devices-allocated`` holds the entries of the GPU
containers alone, in container order (found by review, 1 Dec).

HAMi v2.10's scheduler pads a container that asks for no device under the node's device model
types (``NVIDIA-A100-SXM4-80GB``), not under ``NVIDIA`` (pkg/scheduler/score.go,
allocateAppContainers / allocateInitContainers), and the NVIDIA ``PatchAnnotations`` encodes only
the ``NVIDIA`` list; HAMi's device plugin pops the first non-empty entry. Read one entry per
container, the entry went to the pod's first container (an init container, a sidecar). Each test
failed on the code before the fix.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from hami.core import rebuild
from hami.core.codec import MigAllocation, decode_pod_devices, encode_mig_allocations
from hami.core.ledger import allocation_from_pod
from hami.core.types import ContainerDevice
from hami.deviceplugin import allocate as A
from hami.deviceplugin.injection import container_grant, gpu_entries
from hami.monitor.exporter import ContainerGrant
from hami.monitor.kube import container_grants, mig_devices
from hami.node.nri.plugin import Refusal
from hami.vendors import build_vendors
from hami.vendors.nvidia import MIG_ALLOCATIONS_ANNOTATION

from .test_deviceplugin_allocator import LOCK_P, FakeKube
from .test_dp_migrate_layout import G1, G2, allocate_mig, allocator, ann, hami_pod
from .test_migrate_ledger import _node, placed_pod
from .test_monitor_region_trust import mig_pod_annotations

VENDORS = build_vendors()
GPU = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"  # the GPU test_migrate_ledger's node registers
MAIN = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"}


def _gpu(name: str, limits: dict | None = None) -> dict:
    return {"name": name, "resources": {"limits": dict(limits or {"nvidia.com/gpu": "1"})}}


def _held(pod: dict) -> tuple[tuple[int, int, int], tuple[int, int]]:
    ledger, warnings = rebuild([_node()], [pod], VENDORS)
    assert not warnings
    [(_, used, mem, cores)] = ledger.device_usage("n1")
    return (used, mem, cores), ledger.namespace_usage("ns", "NVIDIA")


# ------------------------------------------------------------------------------- the ledger


def test_the_ledger_counts_mains_grant_while_main_runs_after_its_init_container_finished():
    """Found by review, 1 Dec: [init (no GPU)], [wait (no GPU), main (1 GPU, 20000 MiB, 30 %)],
    HAMi wrote ``GPU,NVIDIA,20000,30:;``: read as init's entry, the pod held 0 slots, 0 MiB and 0
    quota once init had finished, while main ran with 20000 MiB (double booking)."""
    pod = placed_pod(f"{GPU},NVIDIA,20000,30:;", [{"name": "init"}], [{"name": "wait"}, _gpu("main", MAIN)])
    assert _held(pod) == ((1, 20000, 30), (20000, 30))
    running = placed_pod(f"{GPU},NVIDIA,20000,30:;", [{"name": "init"}], [{"name": "wait"}, _gpu("main", MAIN)], False)
    assert _held(running) == ((1, 20000, 30), (20000, 30))
    alloc = allocation_from_pod(pod, VENDORS)
    assert alloc is not None and [bool(c) for c in alloc.devices["NVIDIA"]] == [False, False, True]


def test_the_ledger_gives_the_entry_to_the_gpu_container_not_the_sidecar_before_it():
    """Found by review, 1 Dec: [istio-proxy (no GPU), main (GPU)], no init containers."""
    pod = placed_pod(f"{GPU},NVIDIA,20000,30:;", [], [{"name": "istio-proxy"}, _gpu("main", MAIN)])
    alloc = allocation_from_pod(pod, VENDORS)
    assert alloc is not None and [[d.uuid for d in c] for c in alloc.devices["NVIDIA"]] == [[], [GPU]]


def test_a_mig_reservation_of_a_compact_list_is_attached_to_its_containers_device():
    """Found by review, 1 Dec: the reservation's containerIndex counts the list's entries (0 here),
    so it maps to main as its grant does; left at 0 it named no device of the pod."""
    pod = placed_pod(f"{GPU},NVIDIA,9984,0:;", [{"name": "init"}], [{"name": "wait"}, _gpu("main")])
    reservation = [MigAllocation(container=0, device=0, gpu_uuid=GPU, profile="1g.10gb", start=0, size=1)]
    pod["metadata"]["annotations"][MIG_ALLOCATIONS_ANNOTATION] = encode_mig_allocations(reservation)
    alloc = allocation_from_pod(pod, VENDORS)
    assert alloc is not None
    [held] = alloc.devices["NVIDIA"][2]
    assert held.slice is not None and held.slice.profile == "1g.10gb"


def _entries(text: str) -> tuple:
    return decode_pod_devices(text)


def test_the_rule_keeps_todays_and_the_old_layout_and_leaves_what_cannot_be_aligned():
    """The one rule (hami.core.ledger.entry_layout): today's consistent order and the old layout
    as before; the k-th entry naming a device to the k-th asking container otherwise; counts that
    differ, or one entry per container, stay in order; UUID-less padding names no device."""
    from hami.core.ledger import entry_layout

    one = _entries(f"{GPU},NVIDIA,1,0:;")
    assert entry_layout(one, 0, [False, True]).container(0) == 1  # compact
    assert entry_layout(one, 0, [True, False]).container(0) == 0  # today's, consistent
    assert entry_layout(one, 1, [False, True]).container(0) == 1 and entry_layout(one, 1, [False, True]).shift == 1
    assert entry_layout(one, 0, [False, True, True]).container(0) == 0  # 1 entry, 2 asking: as today
    assert entry_layout(_entries(f"{GPU},NVIDIA,1,0:;;"), 0, [False, True]).container(0) == 0  # one per container
    padded = entry_layout(_entries(f",NVIDIA,0,0:;{GPU},NVIDIA,1,0:;"), 0, [True, False, False])
    assert padded.container(1) == 0 and padded.container(0) == 1  # the padding goes to a GPU-less container
    two = entry_layout(_entries(f"{GPU},NVIDIA,1,0:;{GPU},NVIDIA,2,0:;"), 1, [False, True, False, True])
    assert (two.container(0), two.container(1)) == (1, 3)


# ------------------------------------------------------------------------------- the monitor


def test_the_monitor_gives_the_grant_to_the_gpu_container():
    """Found by review, 1 Dec: [istio-proxy, main (GPU)]: the grant went to istio-proxy, main's
    region was neither exported nor fed back; with an init container and a GPU-less container
    before main too."""
    proxy = NS(name="istio-proxy", resources=None)
    main = NS(name="main", resources=NS(limits=dict(MAIN), requests=None))
    allocated = {"hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,20000,30:;"}
    want = (ContainerGrant("main", ("GPU-1",), 1, memory_mib=(("GPU-1", 20000),)),)
    assert container_grants(allocated, [proxy, main]) == want
    init, wait = NS(name="init", resources=None), NS(name="wait", resources=None)
    assert container_grants(allocated, [init, wait, main], inits=1) == want


def test_the_monitor_names_the_mig_instance_after_the_gpu_container():
    """Found by review, 1 Dec: the MIG series named istio-proxy (the reservation's index 0)."""
    from hami.monitor.kube import allocation_layout

    proxy = NS(name="istio-proxy", resources=None)
    main = NS(name="main", resources=NS(limits={"nvidia.com/gpu": "1"}, requests=None))
    allocated = mig_pod_annotations()
    layout = allocation_layout(allocated, [proxy, main], 0, frozenset({"nvidia.com/gpu"}))
    [dev] = mig_devices(allocated, ["istio-proxy", "main"], layout)
    assert dev.container == "main"
    [grant] = container_grants(allocated, [proxy, main])
    assert grant.container == "main" and set(grant.uuids) == {"GPU-1", "MIG-1"}


# ------------------------------------------------------------------------------- Allocate


async def test_allocate_serves_main_not_the_sidecar_before_it(tmp_path):
    """Found by review, 1 Dec: [istio-proxy (no GPU), main (GPU)]: Allocate refused main ("the
    annotation was not written for this container"), the entry read as istio-proxy's."""
    kube = FakeKube(LOCK_P, [hami_pod(f"{G1},NVIDIA,20000,30:;", [], [{"name": "istio-proxy"}, _gpu("main", MAIN)])])
    (answer,) = await allocator(kube, tmp_path).allocate([1])
    assert answer.cache_dir.endswith("uid-p_main") and "istio-proxy" not in answer.cache_dir
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == G1 and answer.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert ann(kube)[A.BIND_PHASE] == "success" and not any(decode_pod_devices(ann(kube)[A.TO_ALLOCATE]))


async def test_allocate_serves_main_after_an_init_container_and_a_gpu_less_one(tmp_path):
    pod = hami_pod(f"{G1},NVIDIA,20000,30:;", [{"name": "init"}], [{"name": "wait"}, _gpu("main", MAIN)])
    kube = FakeKube(LOCK_P, [pod])
    (answer,) = await allocator(kube, tmp_path).allocate([1])
    assert answer.cache_dir.endswith("uid-p_main") and answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20000m"


def _hamis_pop(text: str) -> int:
    """HAMi's device plugin: the index of the first non-empty entry."""
    return next(i for i, ctr in enumerate(decode_pod_devices(text)) if ctr)


async def test_the_remainder_of_a_compact_list_is_read_right_by_both_plugins(tmp_path):
    """[a (GPU), b (no GPU), c (GPU)], HAMi wrote ``A;C;``: after a's Allocate the remainder is
    written one entry per container, so c's entry sits at c's index (HAMi's plugin pops it there)
    and this plugin, reading it alone (a different length from the allocated list), serves c."""
    kube = FakeKube(
        LOCK_P, [hami_pod(f"{G1},NVIDIA,1000,30:;{G2},NVIDIA,2000,40:;", [], [_gpu("a"), {"name": "b"}, _gpu("c")])]
    )
    alloc = allocator(kube, tmp_path)
    (first,) = await alloc.allocate([1])
    assert first.cache_dir.endswith("uid-p_a") and first.envs["NVIDIA_VISIBLE_DEVICES"] == G1
    assert _hamis_pop(ann(kube)[A.TO_ALLOCATE]) == 2
    (second,) = await alloc.allocate([1])
    assert second.cache_dir.endswith("uid-p_c") and second.envs["NVIDIA_VISIBLE_DEVICES"] == G2
    assert ann(kube)[A.BIND_PHASE] == "success"


def test_hamis_own_remainder_of_a_compact_list_is_read_by_the_allocated_list():
    """HAMi's plugin empties a popped entry in place (``;C;`` after ``A;C;``): told from the
    allocated list, C is still c's."""
    obj = hami_pod(f"{G1},NVIDIA,1000,30:;{G2},NVIDIA,2000,40:;", [], [_gpu("a"), {"name": "b"}, _gpu("c")])
    obj["metadata"]["annotations"][A.TO_ALLOCATE] = f";{G2},NVIDIA,2000,40:;"
    view = A.pod_view_from_object(obj)
    grant = A.pop_next(view, A.pending_devices(view), 1, gpus=[G1, G2], resource="nvidia.com/gpu")
    assert grant.container.name == "c" and [d.uuid for d in grant.devices] == [G2]


# ------------------------------------------------------------------------------- NRI


def test_the_nri_hook_serves_main_and_not_the_sidecar():
    """Found by review, 1 Dec: the hook refused main (its entry read as istio-proxy's)."""
    obj = hami_pod(f"{G1},NVIDIA,20000,30:;", [], [{"name": "istio-proxy"}, _gpu("main", MAIN)])
    view, annotations = A.pod_view_from_object(obj), obj["metadata"]["annotations"]
    assert [[d.uuid for d in e] for e in gpu_entries(view, annotations, "nvidia.com/gpu")] == [[], [G1]]
    grant = container_grant(view, annotations, "main", gpus=[G1, G2], node="n1", resource="nvidia.com/gpu")
    assert grant.container.name == "main" and [d.uuid for d in grant.devices] == [G1]
    with pytest.raises(Refusal, match="'istio-proxy' was given GPUs by the kubelet but has no entry"):
        container_grant(view, annotations, "istio-proxy", gpus=[G1, G2], node="n1", resource="nvidia.com/gpu")


def test_the_nri_hook_serves_main_after_an_init_container_and_a_gpu_less_one():
    obj = hami_pod(f"{G1},NVIDIA,20000,30:;", [{"name": "init"}], [{"name": "wait"}, _gpu("main", MAIN)])
    view, annotations = A.pod_view_from_object(obj), obj["metadata"]["annotations"]
    grant = container_grant(view, annotations, "main", gpus=[G1], node="n1", resource="nvidia.com/gpu")
    assert grant.index == 2 and [d.uuid for d in grant.devices] == [G1]


def test_an_unaligned_list_is_read_as_before():
    """A list that cannot be aligned (one entry, two containers asking) stays in today's order:
    Allocate refuses it as before, nothing crashes; the NRI hook and the ledger read the entry as
    x's too (review, 1 Dec: the last check only decoded the test's own input)."""
    obj = hami_pod(f"{G1},NVIDIA,1000,30:;", [], [{"name": "x"}, _gpu("a"), _gpu("b")])
    view = A.pod_view_from_object(obj)
    assert [bool(c) for c in A.pending_devices(view)] == [True]
    with pytest.raises(A.AllocationError, match="container 'x' .* asks for nvidia.com/gpu=nothing"):
        A.pop_next(view, A.pending_devices(view), 1, gpus=[G1], resource="nvidia.com/gpu")
    entries = gpu_entries(view, obj["metadata"]["annotations"], "nvidia.com/gpu")
    assert entries == [[ContainerDevice(G1, "NVIDIA", 1000, 30)], [], []]
    placed = placed_pod(f"{GPU},NVIDIA,1000,30:;", [], [{"name": "x"}, _gpu("a"), _gpu("b")])
    alloc = allocation_from_pod(placed, VENDORS)
    assert alloc is not None and [[d.uuid for d in c] for c in alloc.devices["NVIDIA"]] == [[GPU]]


def test_the_mig_reservations_index_maps_by_the_allocated_list():
    """``hami.io/vgpu-mig-allocations`` counts the allocated list's entries: its index 0 of
    ``[istio-proxy, main]`` is main's (for the allocator's MIG step, allocator.py)."""
    obj = hami_pod(f"{G1},NVIDIA,10240,100:;", [], [{"name": "istio-proxy"}, _gpu("main")])
    # what is left once main was served, written back one entry per container: read alone it
    # gives entry 0 to istio-proxy (review, 1 Dec: the test set it without checking that)
    obj["metadata"]["annotations"][A.TO_ALLOCATE] = ";;"
    view = A.pod_view_from_object(obj)
    assert A.layout_of(view, decode_pod_devices(";;")).container(0) == 0
    assert A.allocated_layout(view).container(0) == 1


async def test_allocate_in_mig_mode_finds_mains_reservation_in_a_compact_list(tmp_path):
    """The MIG reservation's containerIndex counts the compact list's entries (0: the one GPU
    container): Allocate matched it to container 0 (the sidecar) and refused main, "does not name
    one MIG instance per granted GPU"."""
    pod = hami_pod(f"{G1},NVIDIA,10240,100:;", [], [{"name": "istio-proxy"}, _gpu("main", MAIN)])
    answer, _ = await allocate_mig(pod, tmp_path)
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-0-0" and answer.cache_dir.endswith("uid-p_main")


# ------------------------------------------------- one rule of asking for every reader (review, 1 Dec)

#: pods HAMi v2.10 placed, where a container names the vendor's resources without being given an
#: entry: HAMi's scheduler (and ours) gives one only to a container whose device count is above 0
ZERO_INIT = ([{"name": "prep", "resources": {"limits": {"nvidia.com/gpu": "0"}}}], [_gpu("main", MAIN)])
MEM_INIT = ([{"name": "prep", "resources": {"limits": {"nvidia.com/gpumem": "8000"}}}], [_gpu("main", MAIN)])
ZERO_SIDECAR = ([], [{"name": "proxy", "resources": {"limits": {"nvidia.com/gpu": "0"}}}, _gpu("main", MAIN)])
ASKING_FOR_NOTHING = pytest.mark.parametrize(
    "inits, apps", [ZERO_INIT, MEM_INIT, ZERO_SIDECAR], ids=["gpu-0-init", "gpumem-only-init", "gpu-0-sidecar"]
)


def _v1(c: dict) -> NS:
    """A pod spec's container as kubernetes_asyncio's V1Container shows it to the monitor."""
    r = c.get("resources")
    return NS(name=c["name"], resources=NS(limits=r.get("limits"), requests=r.get("requests")) if r else None)


async def _readers(tmp_path, inits: list[dict], apps: list[dict]) -> dict[str, list[str]]:
    """The container(s) each reader gives HAMi's one entry ``GPU,NVIDIA,20000,30:;`` to."""
    names = [c["name"] for c in inits + apps]
    placed = placed_pod(f"{G1},NVIDIA,20000,30:;", inits, apps)
    alloc = allocation_from_pod(placed, VENDORS)
    assert alloc is not None
    ledger = [names[i] for i, c in enumerate(alloc.devices["NVIDIA"]) if any(d.uuid for d in c)]
    obj = hami_pod(f"{G1},NVIDIA,20000,30:;", inits, apps)
    view, annotations = A.pod_view_from_object(obj), obj["metadata"]["annotations"]
    nri = [names[i] for i, e in enumerate(gpu_entries(view, annotations, "nvidia.com/gpu")) if e]
    monitor = [g.container for g in container_grants(annotations, [_v1(c) for c in inits + apps], inits=len(inits))]
    try:
        (answer,) = await allocator(FakeKube(LOCK_P, [obj]), tmp_path).allocate([1])
        allocate = [n for n in names if answer.cache_dir.endswith(f"uid-p_{n}")]
    except A.AllocationError as exc:
        allocate = [f"refused: {exc}"]
    return {"ledger": ledger, "allocate": allocate, "nri": nri, "monitor": monitor}


@ASKING_FOR_NOTHING
async def test_every_reader_gives_the_entry_to_the_container_counting_gpus(tmp_path, inits, apps):
    """Found by review, 1 Dec: each reader judged "asks" its own way (the ledger and the monitor:
    any of gpu, gpumem, gpumem-percentage, gpucores named; Allocate and NRI: nvidia.com/gpu in the
    limits), none as entries are given (a count above 0). (a) an init container with
    ``nvidia.com/gpu: "0"``: the ledger put main's entry on it (held nothing once it finished
    while main held 20000 MiB), Allocate and NRI refused main; (b) one with ``gpumem`` and no
    count (HAMi's webhook defaults the count on regular containers only): the ledger and the
    monitor read the entry as its, Allocate and NRI as main's."""
    got = await _readers(tmp_path, inits, apps)
    assert got == {"ledger": ["main"], "allocate": ["main"], "nri": ["main"], "monitor": ["main"]}


def test_the_ledger_holds_mains_grant_after_an_init_container_asking_for_0_gpus_finished():
    """Found by review, 1 Dec: scenario (a): the entry read as prep's, the pod held 0 slots, 0 MiB
    and 0 quota once prep finished while main ran with 20000 MiB (double booking)."""
    assert _held(placed_pod(f"{GPU},NVIDIA,20000,30:;", *ZERO_INIT)) == ((1, 20000, 30), (20000, 30))


def test_asking_is_a_count_above_0_read_as_the_scheduler_reads_it():
    """The one predicate (hami.core.ledger.asks_devices, vendor_asks): a count above 0, the limit
    or else the request, as a quantity; a malformed or negative count asks for nothing; the
    ledger's vendor parser and the plain count agree."""
    from hami.core.ledger import asks_devices, vendor_asks

    n = "nvidia.com/gpu"
    assert asks_devices({n: "1"}, {}, n) and asks_devices({}, {n: 2}, n) and asks_devices({n: "1k"}, {}, n)
    assert not asks_devices({n: "0"}, {n: "1"}, n)  # the limit first, as the vendors' parsers read it
    assert not any(asks_devices(lim, {}, n) for lim in ({}, {n: "0"}, {n: "-1"}, {n: "1.5"}, {n: "x"}, {"a": "1"}))
    nvidia = next(v for v in VENDORS if v.name == "NVIDIA")
    for limits in (
        {n: "1"},
        {n: "0"},
        {"nvidia.com/gpumem": "8000"},
        {n: "-1"},
        {n: "x"},
        {n: "1", "nvidia.com/gpumem": "-5"},
    ):
        container = {"name": "c", "resources": {"limits": limits}}
        assert vendor_asks(container, nvidia) == asks_devices(limits, {}, n), limits


def _padded() -> dict:
    """[x (no GPU), a (GPU), y (no GPU)] with a GPU entry and UUID-less padding: the layout gives
    the GPU entry to a and the padding to x, before a's entry."""
    return hami_pod(f"{G1},NVIDIA,1000,30:;,NVIDIA,0,0:;", [], [{"name": "x"}, _gpu("a"), {"name": "y"}])


async def test_the_preferred_allocation_skips_uuid_less_padding(tmp_path):
    """Found by review, 1 Dec: GetPreferredAllocation took every non-empty entry for a GPU entry;
    with the padding placed before a's entry its preference was [''] (plain order), not a's GPU."""
    from hami.deviceplugin.allocator import preferred_allocation

    alloc = allocator(FakeKube(LOCK_P, [_padded()]), tmp_path)
    assert await preferred_allocation(alloc, [(["GPU-other::0", f"{G1}::0"], [], 1)]) == [[f"{G1}::0"]]


async def test_allocate_skips_uuid_less_padding_before_the_gpu_entry(tmp_path):
    """Found by review, 1 Dec (the same scenario): Allocate took the padding for the first grant
    ("gives container 'x' the device '', which is not a GPU of this node") and the padding left
    in the remainder kept the pod from completing."""
    kube = FakeKube(LOCK_P, [_padded()])
    (answer,) = await allocator(kube, tmp_path).allocate([1])
    assert answer.cache_dir.endswith("uid-p_a") and answer.envs["NVIDIA_VISIBLE_DEVICES"] == G1
    assert ann(kube)[A.BIND_PHASE] == "success"


def test_the_monitor_reads_the_configured_count_resource():
    """Review, 1 Dec: the count is what ``--resource-name`` configures, not guessed among
    ``--resource-names`` (no order; with every name custom none could be told). Without one (a
    library caller): NVIDIA's default count, or the one name of a set of one. Scenario (b) with a
    configured count name gives main the grant."""
    from hami.monitor.kube import count_resource

    names = frozenset({"example.com/vgpu", "nvidia.com/gpumem", "nvidia.com/gpucores"})
    assert count_resource(names, "example.com/vgpu") == "example.com/vgpu"
    assert count_resource(names) == "nvidia.com/gpu"  # not guessed: the default count
    assert count_resource(frozenset({"nvidia.com/gpu", "example.com/mem"})) == "nvidia.com/gpu"
    assert count_resource(frozenset({"example.com/vgpu", "example.com/mem"}), "example.com/vgpu") == "example.com/vgpu"
    assert count_resource(frozenset({"example.com/vgpu"})) == "example.com/vgpu"
    prep = _v1({"name": "prep", "resources": {"limits": {"nvidia.com/gpumem": "8000"}}})
    main = _v1({"name": "main", "resources": {"limits": {"example.com/vgpu": "1", "nvidia.com/gpumem": "20000"}}})
    allocated = {A.ALLOCATED: f"{G1},NVIDIA,20000,30:;"}
    grants = container_grants(allocated, [prep, main], inits=1, resources=names, count="example.com/vgpu")
    assert [g.container for g in grants] == ["main"]
