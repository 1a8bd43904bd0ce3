"""Kunlunxin whole cards follow HAMi's topology: two fully linked groups of four (0-3, 4-7) per
eight cards, joined only by the links 0-4, 1-5, 2-6, 3-7 (HAMi ``graghSelect``). Found by an
adversarial review: we grouped the cards as 0-1-4-5 / 2-3-6-7 and handed out unlinked pairs."""

from __future__ import annotations

import pytest

from ._vendorkit import ctr, node, place, pod

XPU = "kunlunxin.com/xpu"


def taken(node_name: str, *indexes: int) -> dict:
    p = pod(f"old-{'-'.join(map(str, indexes))}", [ctr(limits={XPU: len(indexes)})])
    value = "".join(f"{node_name}-kunlun-{i},kunlun,98304,100:" for i in indexes) + ";"
    p["metadata"]["annotations"].update({"hami.io/vgpu-node": node_name, "hami.io/kunlun-allocated": value})
    return p


def pick(used: tuple[int, ...], nums: int, cards: int = 8):
    placed = [taken("kl", *used)] if used else []
    return place([node("kl", capacity={XPU: cards})], [pod("p", [ctr(limits={XPU: nums})])], placed=placed)[0]


@pytest.mark.parametrize(
    "used,nums,expected",
    [
        ((0,), 2, "1,2"),  # was 1,4: cards 1 and 4 have no link
        ((0,), 4, "4,5,6,7"),  # was 2,3,6,7, a ring across the groups while a whole group is free
        ((0,), 1, "1"),  # one card: the group with 3 free before the one with 4 (pairs stay whole)
        ((1, 2, 4, 7), 2, "0,3"),  # both groups hold two: the first
        ((0, 1, 2, 4, 5, 6), 2, "3,7"),  # one free card per group: the cross link 3-7
        ((1, 2, 5, 6), 4, "0,3,4,7"),  # no group holds four: HAMi's ring 0-3-4-7
        ((1, 5), 4, "2,3,6,7"),  # six free: a ring leaving a linked pair (0, 4) free
    ],
)
def test_cards_are_taken_along_hamis_links(used, nums, expected):
    r = pick(used, nums)
    assert r.node == "kl", r.reasons()
    assert r.annotations["BAIDU_COM_DEVICE_IDX"] == expected


@pytest.mark.parametrize(
    "used,nums",
    [
        ((1, 2, 3, 4, 6, 7), 2),  # free 0 and 5: no link between them
        ((1, 2, 4, 7), 4),  # free 0, 3, 5, 6: no ring among them
    ],
)
def test_cards_without_links_between_them_do_not_fit(used, nums):
    r = pick(used, nums)
    assert r.node is None
    assert set(r.reasons()["kl"].split(", ")) == {
        f"{8 - len(used)}/8 NumaNotFit",
        f"{len(used)}/8 ExclusiveDeviceAllocateConflict",
    }
