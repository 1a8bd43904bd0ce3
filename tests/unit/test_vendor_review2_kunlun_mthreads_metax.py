"""Kunlunxin, Moore Threads and MetaX against HAMi's own scheduler code (second adversarial review).

* Kunlun vXPU: HAMi places vXPUs with the whole cards' ``graghSelect`` (groups of four 0-3 / 4-7
  joined by the links 0-4, 1-5, 2-6, 3-7); we took the first cards the GPU policy ranked, so a
  2-vXPU pod could get two cards with no link between them.
* Moore Threads: HAMi's ``customFilterRule`` lets a container take a GPU only when every GPU the
  pod's earlier containers hold is that GPU (the plugin reads one ``mthreads.com/gpu-index`` list
  for the pod); we applied it to single-GPU containers only, so a pod could hold three GPUs.
* MetaX sGPU: HAMi marshals ``metax-tech.com/gpu-devices-allocated`` with ``compute`` and ``vRam``
  ``omitempty``; an online pod's grant (compute 0) carried ``"compute":0``.
"""

from __future__ import annotations

import json

import pytest

from ._vendorkit import ctr, node, on_node, one, place, pod

XPU, VXPU, VMEM = "kunlunxin.com/xpu", "kunlunxin.com/vxpu", "kunlunxin.com/vxpu-memory"
MT_GPU, MT_MEM, MT_CORE = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"
SGPU, SGPU_MEM = "metax-tech.com/sgpu", "metax-tech.com/vmemory"


# ---------------------------------------------------------------- Kunlun vXPU


def vxpu_node(cards: int = 8) -> dict:
    devs = [
        {"id": f"xpu-{i}", "index": i, "count": 4, "devmem": 98304, "devcore": 100, "type": "P800", "health": True}
        for i in range(cards)
    ]
    return node("vx", {"hami.io/node-register-xpu": json.dumps(devs)})


def vxpu_holder(indexes: tuple[int, ...], mib: int = 24576, name: str = "old") -> dict:
    """A running pod holding one vXPU of ``mib`` on each card of ``indexes``."""
    value = "".join(f"xpu-{i},XPU,{mib},{mib * 100 // 98304}:" for i in indexes) + ";"
    return on_node(
        pod(name, [ctr(limits={VXPU: len(indexes), VMEM: mib})]), "vx", {"hami.io/xpu-devices-allocated": value}
    )


def vxpu_cards(r) -> list[int]:
    value = r.annotations["hami.io/xpu-devices-allocated"]
    return [int(piece.split(",")[0].split("-")[1]) for piece in value.rstrip(";").split(":") if piece]


@pytest.mark.parametrize("policy", ["spread", "binpack"])
@pytest.mark.parametrize(
    "held,nums,mib,expected",
    [
        # quarters on 1, 2, 3, 4, 7: halves fit on 0, 5, 6 only; the group 4-7 holds two of them
        # (HAMi's right wing), while the first two ranked were 0 and 5, which have no link
        ((1, 2, 3, 4, 7), 2, 49152, [5, 6]),
        # quarters on 1, 2, 5, 6: whole cards fit on 0, 3, 4, 7; no group holds four: HAMi's ring 0-3-4-7
        ((1, 2, 5, 6), 4, 98304, [0, 3, 4, 7]),
        # quarters on 0-2 and 4: halves fit on 3, 5, 6, 7; two cards: the group 4-7 (three fit) over
        # a cross pair (3-7)
        ((0, 1, 2, 4), 2, 49152, [5, 6]),
    ],
)
def test_vxpu_cards_are_taken_along_hamis_links(policy, held, nums, mib, expected):
    p = pod("p", [ctr(limits={VXPU: nums, VMEM: mib})], {"hami.io/gpu-scheduler-policy": policy})
    r = place([vxpu_node()], [p], placed=[vxpu_holder(held)])[0]
    assert r.node == "vx", r.reasons()
    assert sorted(vxpu_cards(r)) == expected


def test_vxpu_cards_without_a_link_between_them_do_not_fit():
    # quarters on 1, 2, 3, 4, 6, 7: halves fit on 0 and 5 only, which have no link (HAMi: NumaNotFit)
    p = pod("p", [ctr(limits={VXPU: 2, VMEM: 49152})])
    r = place([vxpu_node()], [p], placed=[vxpu_holder((1, 2, 3, 4, 6, 7))])[0]
    assert r.node is None
    assert r.reasons() == {"vx": "2/8 NumaNotFit, 6/8 CardNotFoundCustomFilterRule"}


@pytest.mark.parametrize("policy", ["spread", "binpack"])
def test_one_vxpu_goes_to_the_group_with_fewest_fitting_cards(policy):
    # halves on 0-2 (quarters do not fit there), a quarter on 5: one more quarter goes to card 3,
    # the group with one fitting card (HAMi's order: groups with 1, 3, 2, 4 fitting cards), not
    # beside the quarter on 5 where binpack ranked first
    p = pod("p", [ctr(limits={VXPU: 1, VMEM: 24576})], {"hami.io/gpu-scheduler-policy": policy})
    held = [vxpu_holder((0, 1, 2), 49152, "halves"), vxpu_holder((5,), 24576, "quarter")]
    r = place([vxpu_node()], [p], placed=held)[0]
    assert vxpu_cards(r) == [3]


def test_vxpu_within_the_chosen_group_the_policy_orders_the_cards():
    # a quarter on 1: all eight cards fit more quarters, both groups have four fitting cards; the
    # first group (0-3) is chosen, and within it binpack's order puts the partly used card 1 first
    p = pod("p", [ctr(limits={VXPU: 2, VMEM: 24576})], {"hami.io/gpu-scheduler-policy": "binpack"})
    r = place([vxpu_node()], [p], placed=[vxpu_holder((1,), 24576)])[0]
    assert vxpu_cards(r) == [1, 0]


# ---------------------------------------------------------------- Kunlun whole cards, several containers


def test_kunlun_containers_get_their_own_cards():
    r = one([node("kl", capacity={XPU: 8})], pod("p", [ctr("a", limits={XPU: 2}), ctr("b", limits={XPU: 2})]))
    assert r.annotations["hami.io/kunlun-allocated"] == (
        "kl-kunlun-0,kunlun,98304,100:kl-kunlun-1,kunlun,98304,100:;kl-kunlun-2,kunlun,98304,100:kl-kunlun-3,kunlun,98304,100:;"
    )


# ---------------------------------------------------------------- Moore Threads, several containers


def mt_node() -> dict:
    return node("mt", capacity={MT_CORE: 64, MT_MEM: 384})  # four GPUs of 48 GiB


@pytest.mark.parametrize(
    "first,second",
    [
        ({MT_GPU: 1, MT_MEM: 8, MT_CORE: 4}, {MT_GPU: 2}),  # was placed on GPUs 0, 1, 2: gpu-index "0,1,2"
        ({MT_GPU: 1, MT_MEM: 8, MT_CORE: 4}, {MT_GPU: 2, MT_MEM: 8, MT_CORE: 4}),
    ],
)
def test_mthreads_a_pod_holds_one_gpu(first, second):
    r = one([mt_node()], pod("p", [ctr("a", limits=first), ctr("b", limits=second)]))
    assert r.node is None
    assert "CardNotFoundCustomFilterRule" in r.reasons()["mt"]
    assert "mthreads.com/gpu-index" not in r.annotations


def test_mthreads_after_a_multi_gpu_container_nothing_more_fits():
    two = {MT_GPU: 2, MT_MEM: 8, MT_CORE: 2}  # admission makes it two whole GPUs
    r = one([mt_node()], pod("p", [ctr("a", limits=two), ctr("b", limits={MT_GPU: 1, MT_MEM: 2, MT_CORE: 1})]))
    assert r.node is None
    assert "CardNotFoundCustomFilterRule" in r.reasons()["mt"]


def test_mthreads_shared_containers_still_share_their_gpu():
    one_gpu = {MT_GPU: 1, MT_MEM: 8, MT_CORE: 4}
    r = one([mt_node()], pod("p", [ctr("a", limits=one_gpu), ctr("b", limits=one_gpu)]))
    assert r.annotations["hami.io/mthreads-vgpu-devices-allocated"] == (
        "mt-mthreads-0,Mthreads,4096,4:;mt-mthreads-0,Mthreads,4096,4:;"
    )
    assert r.annotations["mthreads.com/gpu-index"] == "0"


# ---------------------------------------------------------------- MetaX sGPU decision bytes


def test_metax_online_grant_has_no_compute_key():
    dev = {"uuid": "sgpu-0", "totalDevCount": 16, "totalCompute": 100, "totalVRam": 65536, "healthy": True}
    n = node("sg", {"metax-tech.com/node-gpu-devices": json.dumps([dev])})
    r = one([n], pod("p", [ctr(limits={SGPU: 1, SGPU_MEM: 4})], {"metax-tech.com/sgpu-app-class": "online"}))
    assert r.annotations["hami.io/metax-sgpu-devices-allocated"] == "sgpu-0,Metax-SGPU,4096,0:;"
    assert r.annotations["metax-tech.com/gpu-devices-allocated"] == '[[{"uuid":"sgpu-0","vRam":4096}]]'
