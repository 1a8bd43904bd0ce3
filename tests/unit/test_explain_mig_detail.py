"""`hami explain` on a MIG GPU says which of the two CardMigTopologyInfeasible cases it is: no
allowed profile is big enough (change the request) or the big-enough profiles have no free
placement (fragmented: wait, or ask for less)."""

from __future__ import annotations

import pytest

from hami.core import ContainerDevice, Ledger, NodeDevices, make_allocation
from hami.core.explain import pending_verdict
from hami.core.types import Slice

from ._corekit import A100_40_MIG as A100_40
from ._corekit import CONFIG, ctr, mig_gpu, pod


def _ledger(*held: tuple[str, int, int]) -> Ledger:
    led = Ledger()
    led.set_node(NodeDevices(name="m", devices=(mig_gpu("m", 0),)))
    for k, (profile, start, size) in enumerate(held):
        prof = next(x for x in A100_40 if x.name == profile)
        cd = ContainerDevice(
            "GPU-m-0", "NVIDIA", prof.memory_mb, prof.core, slice=Slice("GPU-m-0", profile, start, size)
        )
        led.add_pod(make_allocation(pod(f"h{k}", containers=[ctr(mem=1)], admit=False), "m", {"NVIDIA": ((cd,),)}))
    return led


CASES = [
    ("too small", dict(mem=40500), (), "too small: no MIG profile has 40500 MiB (the largest, 7g.40gb, has 40192 MiB)"),
    (
        "fragmented",
        dict(mem=15000),
        (("1g.5gb", 1, 1), ("1g.5gb", 5, 1)),
        "fragmented: 3g.20gb, 4g.20gb, 7g.40gb would hold 15000 MiB, but no placement of it is clear of the "
        "instances there (1g.5gb@1, 1g.5gb@5)",
    ),
]


@pytest.mark.parametrize("desc,req,held,want", CASES, ids=[c[0] for c in CASES])
def test_a_mig_refusal_says_too_small_or_fragmented(desc, req, held, want):
    v = pending_verdict(pod("p", containers=[ctr(**req)]), _ledger(*held), CONFIG, CONFIG.vendors, 0.0)
    [node] = v.nodes
    [dev] = node.devices
    assert (node.reason, dev.reason, dev.detail) == ("1/1 CardMigTopologyInfeasible", "CardMigTopologyInfeasible", want)


def test_other_reasons_carry_no_mig_detail():
    v = pending_verdict(pod("p", containers=[ctr(mem=39000)]), _ledger(("1g.5gb", 6, 1)), CONFIG, CONFIG.vendors, 0.0)
    [dev] = v.nodes[0].devices
    assert (dev.reason, dev.detail) == ("CardInsufficientMemory", "")


def test_hami_explain_prints_the_detail_after_the_code():
    from hami.scheduler.explain import render
    from hami.scheduler.state import ClusterState

    state = ClusterState(CONFIG)
    state.ledger = _ledger(("1g.5gb", 1, 1), ("1g.5gb", 5, 1))
    p = pod("p", containers=[ctr(mem=15000)])
    p.setdefault("status", {})["phase"] = "Pending"
    out = render(p, state, [], 0.0)
    assert "-> CardMigTopologyInfeasible: fragmented: 3g.20gb, 4g.20gb, 7g.40gb would hold 15000 MiB" in out
