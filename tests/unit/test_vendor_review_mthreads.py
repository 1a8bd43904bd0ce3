"""Moore Threads: a GPU has 16 cores (``mthreads.com/sgpu-core``). Found by an adversarial
review: a container asking more than 16 cores of one GPU had its request cut to 16 and was
placed (the device plugin then cannot serve 20 cores from one GPU); HAMi's Fit compares the
request as asked with the GPU's 16 cores and refuses it (``CardInsufficientCore``)."""

from __future__ import annotations

import pytest

from ._vendorkit import ctr, node, one, pod

VGPU, MEM, CORE = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"


def mt_node() -> dict:
    return node("mt", capacity={CORE: 32, MEM: 192})


def test_more_cores_than_a_gpu_has_do_not_fit():
    r = one([mt_node()], pod("p", [ctr(limits={VGPU: 1, MEM: 8, CORE: 20})]))
    assert r.node is None
    assert r.reasons() == {"mt": "2/2 CardInsufficientCore"}


@pytest.mark.parametrize("cores,granted", [(16, 16), (4, 4)])
def test_a_gpus_worth_of_cores_or_less_still_fits(cores, granted):
    r = one([mt_node()], pod("p", [ctr(limits={VGPU: 1, MEM: 8, CORE: cores})]))
    assert r.annotations["hami.io/mthreads-vgpu-devices-allocated"] == f"mt-mthreads-0,Mthreads,4096,{granted}:;"
