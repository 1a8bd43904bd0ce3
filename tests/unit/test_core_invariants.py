"""Property tests: random clusters, random arrivals and deletions.

1. No device ever exceeds its slots, memory or cores, and the ledger's incremental usage equals
   a recomputation from the recorded allocations. On MIG-mode GPUs (the second test's clusters),
   the slices held never overlap and the ledger never finds its own decisions inconsistent.
2. A pod left pending really fits nowhere at that moment (checked against an independent,
   exhaustive oracle for pods whose containers do not share a phase: one optional classic init
   container plus one regular container, where greedy choice is exact).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core import DeviceInfo, Ledger, NodeDevices, PERCENT_UNSET, filter_pod, pod_request, schedule_pod
from hami.core.types import ContainerKind, PodAllocation

from ._corekit import CONFIG, ctr, mig_gpu, pod

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def clusters(draw, mig: bool = False):
    nodes = []
    for n in range(draw(st.integers(1, 3))):
        devs = []
        for i in range(draw(st.integers(1, 4))):
            if mig and draw(st.integers(0, 2)) == 0:
                devs.append(mig_gpu(str(n), i, numa=draw(st.integers(0, 1))))
                continue
            devs.append(
                DeviceInfo(
                    id=f"GPU-{n}-{i}",
                    index=i,
                    count=draw(st.integers(1, 4)),
                    devmem=draw(st.sampled_from([1000, 4000, 8000])),
                    devcore=draw(st.sampled_from([100, 100, 200])),
                    type=draw(st.sampled_from(["NVIDIA-T4", "NVIDIA-A100"])),
                    numa=draw(st.integers(0, 1)),
                    mode="hami-core",
                    health=draw(st.booleans()) or i == 0,
                    vendor="NVIDIA",
                )
            )
        cordon = frozenset(d.id for d in devs if draw(st.integers(0, 9)) == 0)
        nodes.append(NodeDevices(name=f"node-{n}", devices=tuple(devs), cordoned=cordon))
    return nodes


def containers(sidecars: bool):
    one = st.builds(
        lambda g, mem, pct, cores: ctr(gpu=g, mem=mem, pct=pct, cores=cores),
        st.integers(1, 3),
        st.one_of(st.none(), st.sampled_from([500, 1000, 3000, 7000])),
        st.one_of(st.none(), st.sampled_from([25, 50, 100])),
        st.one_of(st.none(), st.sampled_from([0, 10, 50, 100])),
    )
    return one


@st.composite
def events(draw, sidecars: bool):
    out = []
    for k in range(draw(st.integers(1, 25))):
        if out and draw(st.integers(0, 3)) == 0:
            out.append(("delete", draw(st.integers(0, k))))
            continue
        c = containers(sidecars)
        app = [{**draw(c), "name": "app"}]
        init = []
        if draw(st.booleans()):
            first = {**draw(c), "name": "first"}
            if sidecars:
                first["restartPolicy"] = draw(st.sampled_from(["Always", "OnFailure"]))
                app.append({**draw(c), "name": "app2"})
            init.append(first)
        annotations = {}
        if draw(st.booleans()):
            annotations["hami.io/gpu-scheduler-policy"] = draw(st.sampled_from(["binpack", "spread", "numa,binpack"]))
        if draw(st.booleans()):
            annotations["hami.io/node-scheduler-policy"] = draw(st.sampled_from(["binpack", "spread"]))
        out.append(("add", pod(f"p{k}", containers=app, init=init, annotations=annotations)))
    return out


def check_capacity(led: Ledger) -> None:
    fresh = Ledger()
    for name in led.node_names():
        fresh.set_node(led.node(name))
    for alloc in led.pods():
        fresh.add_pod(alloc)
    for name in led.node_names():
        rows = list(led.device_usage(name))
        assert rows == list(fresh.device_usage(name))
        assert led.slices(name) == fresh.slices(name)
        registered = {d.id: d.health for d in led.node(name).devices}
        for d, used, mem, cores in rows:
            assert 0 <= used <= d.count, (d.id, used, d.count)
            assert 0 <= mem <= d.devmem, (d.id, mem, d.devmem)
            assert 0 <= cores <= d.devcore, (d.id, cores, d.devcore)
            assert d.health == registered[d.id], d.id  # our own decisions are never inconsistent
        for uuid, pieces in led.slices(name).items():
            assert not any(a.overlaps(b) for k, a in enumerate(pieces) for b in pieces[k + 1 :]), (uuid, pieces)


def oracle_pod_usage(alloc: PodAllocation) -> dict[str, list[int]]:
    """``uuid -> [slots, MiB, cores]`` one pod holds, from its containers' own grants and kinds:
    per term the larger of the steady phase (every sidecar and regular container together) and
    each classic init container's phase (it plus the sidecars declared before it). Once the init
    containers have finished (``app_only``) they hold nothing."""
    phases: dict[str, dict] = {}  # uuid -> {"steady": [..], "side": [(index, [..])], "init": [(index, [..])]}
    for vendor_containers in alloc.devices.values():
        for index, granted in enumerate(vendor_containers):
            kind = alloc.kinds[index] if index < len(alloc.kinds) else ContainerKind.APP
            if kind is ContainerKind.INIT and alloc.app_only:
                continue
            for d in granted:
                ph = phases.setdefault(d.uuid, {"steady": [0, 0, 0], "side": [], "init": []})
                term = [1, d.usedmem, d.usedcores]
                if kind is ContainerKind.INIT:
                    ph["init"].append((index, term))
                    continue
                ph["steady"] = [a + b for a, b in zip(ph["steady"], term)]
                if kind is ContainerKind.SIDECAR:
                    ph["side"].append((index, term))
    held = {}
    for uuid, ph in phases.items():
        peak = list(ph["steady"])
        for index, term in ph["init"]:
            phase = list(term)
            for side_index, side in ph["side"]:
                if side_index < index:
                    phase = [a + b for a, b in zip(phase, side)]
            peak = [max(a, b) for a, b in zip(peak, phase)]
        held[uuid] = peak
    return held


def check_capacity_independently(led: Ledger) -> None:
    """Found by review, 1 Dec: check_capacity rebuilt a second Ledger with the same collapse
    code, so an under-count there (half the memory, one slot per pod) passed. Here each device's
    load is summed from the pods' own per-container grants and checked against its capacity and
    against what the ledger counts."""
    for name in led.node_names():
        load: dict[str, list[int]] = {}
        for alloc in led.pods():
            if alloc.node != name:
                continue
            for uuid, term in oracle_pod_usage(alloc).items():
                load[uuid] = [a + b for a, b in zip(load.get(uuid, [0, 0, 0]), term)]
        for d, used, mem, cores in led.device_usage(name):
            slots_held, mem_held, cores_held = load.pop(d.id, [0, 0, 0])
            assert slots_held <= d.count, (d.id, "slots", slots_held, d.count)
            assert mem_held <= d.devmem, (d.id, "devmem", mem_held, d.devmem)
            assert cores_held <= d.devcore, (d.id, "devcore", cores_held, d.devcore)
            assert (used, mem, cores) == (slots_held, mem_held, cores_held), (d.id, (used, mem, cores))
        assert not load, (name, "pods hold devices the node does not have", load)


def oracle_fits(led: Ledger, p: dict) -> bool:
    """Exhaustive and independent: each container (init / app) checked against current usage."""
    req = pod_request(p, CONFIG.vendors)
    for name in led.node_names():
        cordoned = led.node(name).cordoned
        rows = list(led.device_usage(name))
        ok = True
        for c in req.containers:
            for r in c.requests:
                good = 0
                for d, used, mem, cores in rows:
                    need = r.memreq or (d.devmem * r.mem_percentage // 100 if r.mem_percentage != PERCENT_UNSET else 0)
                    good += (
                        d.health
                        and d.id not in cordoned
                        and used < d.count
                        and d.devmem - mem >= need
                        and d.devcore - cores >= r.coresreq
                        and not (d.devcore == 100 and r.coresreq == 100 and used > 0)
                        and not (d.devcore and cores == d.devcore and r.coresreq == 0)
                    )
                ok = ok and good >= r.nums
        if ok:
            return True
    return False


def run(nodes, evs, check_oracle: bool) -> None:
    led = Ledger()
    for n in nodes:
        led.set_node(n)
    placed: list[str] = []
    for kind, arg in evs:
        if kind == "delete":
            if placed:
                led.remove_pod(placed[arg % len(placed)])
        else:
            before_pending = None
            if check_oracle:
                before_pending = filter_pod(arg, None, led, CONFIG, 0)
            result = schedule_pod(arg, None, led, CONFIG, 0)
            if result.node is None:
                if check_oracle:
                    assert not oracle_fits(led, arg), result.reasons()
                assert set(result.failed) == set(led.node_names())
            else:
                placed.append(result.allocation.key)
                if before_pending is not None:
                    assert before_pending.node == result.node  # filter_pod is pure and deterministic
        check_capacity(led)
        check_capacity_independently(led)


@SETTINGS
@given(clusters(), events(sidecars=False))
def test_capacity_and_pending_really_fits_nowhere(nodes, evs):
    run(nodes, evs, check_oracle=True)


@SETTINGS
@given(clusters(mig=True), events(sidecars=True))
def test_capacity_with_sidecars_and_several_containers(nodes, evs):
    run(nodes, evs, check_oracle=False)
