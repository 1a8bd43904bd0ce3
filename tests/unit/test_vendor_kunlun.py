"""Kunlunxin: whole-card interconnect groups and vXPU memory rounding."""

from __future__ import annotations

import json
import re

import pytest

from hami.core.errors import RequestError
from hami.vendors import KunlunVendor
from hami.vendors.kunlun import interconnect_group

from ._vendorkit import NOW, admit, config, ctr, node, one, place, pod

CFG = config()
XPU, VXPU, VMEM = "kunlunxin.com/xpu", "kunlunxin.com/vxpu", "kunlunxin.com/vxpu-memory"


def xpu_node(name: str = "kl", cards: int = 8) -> dict:
    return node(name, capacity={XPU: cards})


def taken(node_name: str, *indexes: int) -> dict:
    p = pod(f"old-{'-'.join(map(str, indexes))}", [ctr(limits={XPU: len(indexes)})])
    value = "".join(f"{node_name}-kunlun-{i},kunlun,98304,100:" for i in indexes) + ";"
    p["metadata"]["annotations"].update({"hami.io/vgpu-node": node_name, "hami.io/kunlun-allocated": value})
    return p


def test_groups_and_numa():
    assert [interconnect_group(i) for i in range(16)] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert [d.numa for d in KunlunVendor().node_devices(xpu_node())] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_annotations_exact():
    r = one([xpu_node()], pod("p", [ctr(limits={XPU: 1})]))
    assert r.annotations == {
        "hami.io/vgpu-node": "kl",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/kunlun-allocated": "kl-kunlun-0,kunlun,98304,100:;",
        "BAIDU_COM_DEVICE_IDX": "0",
    }


@pytest.mark.parametrize(
    "used,nums,expected",
    [
        ((0,), 2, "1,2"),  # group 0-3 has 3 free, 4-7 has 4: the tighter group
        ((0,), 4, "4,5,6,7"),  # only group 4-7 holds four
        ((0, 2, 5), 3, None),  # a count HAMi refuses: best-ranked cards
        ((), 8, "0,1,2,3,4,5,6,7"),
    ],
)
def test_group_selection(used, nums, expected):
    r = place([xpu_node()], [pod("p", [ctr(limits={XPU: nums})])], placed=[taken("kl", *used)] if used else ())[0]
    assert r.node == "kl"
    idx = r.annotations["BAIDU_COM_DEVICE_IDX"].split(",")
    if expected is None:
        assert len(idx) == nums and not {"0", "2", "5"} & set(idx)
    else:
        assert r.annotations["BAIDU_COM_DEVICE_IDX"] == expected


def test_cards_are_never_shared():
    r = place([xpu_node(cards=2)], [pod("p", [ctr(limits={XPU: 1})])], placed=[taken("kl", 0, 1)])[0]
    assert r.reasons() == {"kl": "2/2 ExclusiveDeviceAllocateConflict"}


# ---------------------------------------------------------------- vXPU


def vxpu_node(name: str = "vx") -> dict:
    devs = [
        {"id": f"xpu-{i}", "index": i, "count": 4, "devmem": 98304, "devcore": 100, "type": "P800", "health": True}
        for i in range(2)
    ]
    return node(name, {"hami.io/node-register-xpu": json.dumps(devs)})


@pytest.mark.parametrize("asked,rounded", [(1, 24576), (24576, 24576), (30000, 49152), (98304, 98304)])
def test_vxpu_memory_rounding(asked, rounded):
    p = admit(pod("p", [ctr(limits={VXPU: 1, VMEM: asked})]), CFG)
    res = p["spec"]["containers"][0]["resources"]
    assert res["limits"][VMEM] == rounded and res["requests"][VMEM] == rounded


def test_vxpu_rejects_more_than_a_card():
    with pytest.raises(RequestError, match=re.escape("kunlunxin.com/vxpu-memory must be in 1..98304 MiB, got 100000")):
        admit(pod("p", [ctr(limits={VXPU: 1, VMEM: 100000})]), CFG)


@pytest.mark.parametrize(
    "limits,allocated",
    [
        ({VXPU: 1, VMEM: 30000}, "xpu-0,XPU,49152,50:;"),
        ({VXPU: 1}, "xpu-0,XPU,98304,100:;"),
    ],
)
def test_vxpu_annotations(limits, allocated):
    r = one([vxpu_node()], pod("p", [ctr(limits=limits)]))
    assert r.annotations == {
        "hami.io/vgpu-node": "vx",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/xpu-devices-allocated": allocated,
        "hami.io/xpu-devices-to-allocate": allocated,
    }


def test_vxpu_misfit():
    pods = [pod(f"p{i}", [ctr(limits={VXPU: 1, VMEM: 49152})]) for i in range(5)]
    results = place([vxpu_node()], pods)
    assert [r.node for r in results] == ["vx"] * 4 + [None]
    assert results[4].reasons() == {"vx": "2/2 CardInsufficientMemory"}


@pytest.mark.parametrize("policy,winner", [("binpack", "a-filling"), ("spread", "b-empty")])
def test_fragmentation_node_score(policy, winner):
    # a-filling has card 0 in use (one bubble); taking card 1 keeps it at one bubble (2000), while
    # b-empty goes from zero bubbles to one (1000)
    nodes = [xpu_node("a-filling"), xpu_node("b-empty")]
    r = place(
        nodes,
        [pod("p", [ctr(limits={XPU: 1})], {"hami.io/node-scheduler-policy": policy})],
        placed=[taken("a-filling", 0)],
    )[0]
    assert r.node == winner
    base = {"a-filling": 2000.0, "b-empty": 1000.0}
    generic = {n: r.scores[n] - base[n] for n in r.scores}
    assert all(0 <= g < 100 for g in generic.values()), r.scores


def one_card_vxpu_node(name: str = "vx", cards: int = 1) -> dict:
    devs = [
        {"id": f"xpu-{i}", "index": i, "count": 4, "devmem": 98304, "devcore": 100, "type": "P800", "health": True}
        for i in range(cards)
    ]
    return node(name, {"hami.io/node-register-xpu": json.dumps(devs)})


def vxpu_pod(name: str, mib: int, annotations: dict | None = None) -> dict:
    return pod(name, [ctr(limits={VXPU: 1, VMEM: mib})], annotations)


@pytest.mark.parametrize(
    "cards,second,expected",
    [
        # HAMi FitVXPU: a card holding vXPUs takes only vXPUs of the same size (Usedmem / Used == Memreq)
        (1, 49152, "1/1 CardNotFoundCustomFilterRule"),  # memory and cores would allow it
        (2, 49152, "xpu-1,XPU,49152,50:;"),  # the half goes to the empty card, binpack or not
        (1, 24576, "xpu-0,XPU,24576,25:;"),  # the same size stacks
    ],
)
def test_vxpu_card_takes_one_size_only(cards, second, expected):
    binpack = {"hami.io/gpu-scheduler-policy": "binpack"}  # would put it beside the quarter
    first, then = place(
        [one_card_vxpu_node(cards=cards)], [vxpu_pod("quarter", 24576), vxpu_pod("next", second, binpack)]
    )
    assert first.annotations["hami.io/xpu-devices-allocated"] == "xpu-0,XPU,24576,25:;"
    if then.node is None:
        assert then.reasons() == {"vx": expected}
    else:
        assert then.annotations["hami.io/xpu-devices-allocated"] == expected


def test_vxpu_size_rule_reads_running_pods():
    # a running pod holding a half (placed before the rule, or by HAMi) keeps quarters off its card
    running = vxpu_pod("old", 49152)
    running["metadata"]["annotations"].update(
        {"hami.io/vgpu-node": "vx", "hami.io/xpu-devices-allocated": "xpu-0,XPU,49152,50:;"}
    )
    binpack = {"hami.io/gpu-scheduler-policy": "binpack"}
    r = place([one_card_vxpu_node(cards=2)], [vxpu_pod("p", 24576, binpack)], placed=[running])[0]
    assert r.annotations["hami.io/xpu-devices-allocated"] == "xpu-1,XPU,24576,25:;"
    r = place([one_card_vxpu_node(cards=1)], [vxpu_pod("p", 24576)], placed=[running])[0]
    assert r.reasons() == {"vx": "1/1 CardNotFoundCustomFilterRule"}


def test_a_node_claiming_a_hundred_million_cards_is_refused_not_held():
    """The node writes its own capacity: 10^8 cards made 10^8 devices in the scheduler's memory
    (a MemoryError, and the same on every restart). Found by an adversarial review."""
    from hami.core.ledger import read_node_devices

    devices, errors = read_node_devices(xpu_node(cards=100_000_000), CFG.vendors)
    assert (
        "kunlun" in errors
        and "status.capacity[kunlunxin.com/xpu] gives 100000000 cards: more than any machine has (1024 at most)"
        in errors["kunlun"]
    )
    devices, errors = read_node_devices(xpu_node(cards=8), CFG.vendors)
    assert not errors


def test_a_node_whose_card_count_changes_is_read_again():
    """Capacity vendors have no registration annotation: a node going from 8 cards to 2 (or 0,
    its plugin gone) kept 8 in the ledger. Found by an adversarial review."""
    from hami.scheduler.state import ClusterState

    s = ClusterState(CFG)
    first = xpu_node(cards=8)
    first["metadata"]["resourceVersion"] = "1"
    s.node_handler.apply("ADDED", first)
    assert len(list(s.ledger.device_usage("kl"))) == 8
    fewer = xpu_node(cards=2)
    fewer["metadata"]["resourceVersion"] = "2"
    s.node_handler.apply("MODIFIED", fewer)
    assert len(list(s.ledger.device_usage("kl"))) == 2
