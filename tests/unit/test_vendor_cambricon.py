"""Cambricon MLU: capacity-synthesised cards, 256 MiB units, percentage cores, DSMLU annotations."""

from __future__ import annotations

import pytest

from hami.core import rebuild
from hami.vendors import CambriconVendor

from ._vendorkit import NOW, config, ctr, node, one, place, pod

CFG = config()
VMLU, VMEM, VCORE = "cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory", "cambricon.com/mlu.smlu.vcore"


def mlu_node(name: str = "mlu-1", cards: int = 4, units_per_card: int = 384) -> dict:
    return node(name, capacity={VCORE: 100 * cards, VMEM: units_per_card * cards, VMLU: 100 * cards})


def test_cards_are_synthesised_from_capacity():
    devs = CambriconVendor().node_devices(mlu_node())
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.health) for d in devs] == [
        (f"mlu-1-cambricon-mlu-{i}", i, 100, 384 * 256, 100, "MLU", True) for i in range(4)
    ]
    assert CambriconVendor().node_devices(node("plain")) == ()


def test_bad_capacity_is_reported_with_the_field():
    _, warnings = rebuild([node("m", capacity={VCORE: "lots"})], [], CFG.vendors)
    assert warnings == [
        "skipping node: node m: status.capacity[cambricon.com/mlu.smlu.vcore]: "
        "'lots' is not a quantity (e.g. 3000, 2k, 1Gi, 1e3, 500m)"
    ]


@pytest.mark.parametrize(
    "limits,allocated,profile",
    [
        ({VMLU: 1, VMEM: 20, VCORE: 30}, "mlu-1-cambricon-mlu-0,MLU,5120,30:;", "0_30_20"),
        ({VMLU: 1}, "mlu-1-cambricon-mlu-0,MLU,98304,100:;", "0_100_384"),  # default: the whole card
        ({VMLU: 2, VMEM: 8}, "mlu-1-cambricon-mlu-0,MLU,2048,100:mlu-1-cambricon-mlu-1,MLU,2048,100:;", "0_100_8"),
    ],
)
def test_annotations_exact(limits, allocated, profile):
    r = one([mlu_node()], pod("p", [ctr(limits=limits)]))
    assert r.annotations == {
        "hami.io/vgpu-node": "mlu-1",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/cambricon-mlu-devices-allocated": allocated,
        "hami.io/cambricon-mlu-devices-to-allocate": allocated,
        "CAMBRICON_DSMLU_PROFILE": profile,
        "CAMBRICON_DSMLU_ASSIGNED": "false",
        "CAMBRICON_DSMLU_ASSIGHED": "false",
    }


def test_profile_comes_from_the_first_container_holding_an_mlu():
    r = one(
        [mlu_node()], pod("p", [ctr("sidecar", limits={"cpu": 1}), ctr("main", limits={VMLU: 1, VMEM: 4, VCORE: 10})])
    )
    assert r.annotations["hami.io/cambricon-mlu-devices-allocated"] == ";mlu-1-cambricon-mlu-0,MLU,1024,10:;"
    assert r.annotations["CAMBRICON_DSMLU_PROFILE"] == "0_10_4"


@pytest.mark.parametrize(
    "first,second,reason",
    [
        ({VMLU: 1, VMEM: 4, VCORE: 100}, {VMLU: 1, VMEM: 4, VCORE: 10}, "1/1 CardInsufficientCore"),
        ({VMLU: 1, VMEM: 300, VCORE: 10}, {VMLU: 1, VMEM: 100, VCORE: 10}, "1/1 CardInsufficientMemory"),
        ({VMLU: 1, VMEM: 4, VCORE: 0}, {VMLU: 1, VMEM: 4}, "1/1 ExclusiveDeviceAllocateConflict"),
    ],
)
def test_misfits_on_a_one_card_node(first, second, reason):
    results = place([mlu_node(cards=1)], [pod("a", [ctr(limits=first)]), pod("b", [ctr(limits=second)])])
    assert results[0].node == "mlu-1" and results[1].node is None
    assert results[1].reasons() == {"mlu-1": reason}


def test_type_and_uuid_selection():
    r = one([mlu_node(cards=2)], pod("p", [ctr(limits={VMLU: 1})], {"cambricon.com/use-mlutype": "MLU370"}))
    assert r.reasons() == {"mlu-1": "2/2 CardTypeMismatch"}
    r = one(
        [mlu_node(cards=2)], pod("p", [ctr(limits={VMLU: 1})], {"cambricon.com/use-gpuuuid": "mlu-1-cambricon-mlu-1"})
    )
    assert r.annotations["CAMBRICON_DSMLU_PROFILE"] == "1_100_384"


def test_own_node_lock():
    v = CambriconVendor()
    assert (v.lock_annotation, v.lock_format, v.lock_expiry_seconds) == ("cambricon.com/dsmlu.lock", "time", 120.0)
