"""Moore Threads: 512 MiB units, fixed sizes, whole GPUs for n > 1, single-card rule."""

from __future__ import annotations

import re

import pytest

from hami.core.errors import RequestError
from hami.vendors import MthreadsVendor

from ._vendorkit import NOW, admit, config, ctr, node, one, pod

CFG = config()
CNT, MEM, CORE = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"


def mt_node(name: str = "mt", cards: int = 2) -> dict:
    return node(name, capacity={CORE: 16 * cards, MEM: 96 * cards, CNT: 100 * cards})


def test_cards_from_capacity():
    devs = MthreadsVendor().node_devices(mt_node())
    assert [(d.id, d.count, d.devmem, d.devcore) for d in devs] == [
        ("mt-mthreads-0", 100, 49152, 16),
        ("mt-mthreads-1", 100, 49152, 16),
    ]


@pytest.mark.parametrize(
    "limits,message",
    [
        ({CNT: 0}, "mthreads.com/vgpu must be greater than 0, got 0"),
        ({CNT: 1, MEM: 3}, "mthreads.com/sgpu-memory must be one of 2, 4, 8, 16, 32, 64, 96 (units of 512 MiB), got 3"),
    ],
)
def test_admission_rejects(limits, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        admit(pod("bad", [ctr(limits=limits)]), CFG)


def test_admission_defaults():
    multi = admit(pod("m", [ctr(limits={CNT: 2})]), CFG)
    assert multi["spec"]["containers"][0]["resources"]["limits"] == {CNT: 2, CORE: 32, MEM: 192}
    assert multi["metadata"]["annotations"]["mthreads.com/request-gpu-num"] == "2"
    whole = admit(pod("w", [ctr(limits={CNT: 1})]), CFG)
    assert whole["spec"]["containers"][0]["resources"]["limits"] == {CNT: 1, MEM: 96, CORE: 16}


def test_annotations_exact():
    r = one([mt_node()], pod("p", [ctr(limits={CNT: 1, MEM: 8, CORE: 4})]))
    assert r.annotations == {
        "hami.io/vgpu-node": "mt",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/mthreads-vgpu-devices-allocated": "mt-mthreads-0,Mthreads,4096,4:;",
        "mthreads.com/gpu-index": "0",
        "mthreads.com/predicate-time": str(int(NOW) * 1_000_000_000),
        "mthreads.com/predicate-node": "mt",
    }


def test_multi_gpu_takes_whole_gpus():
    r = one([mt_node()], pod("p", [ctr(limits={CNT: 2})]))
    assert (
        r.annotations["hami.io/mthreads-vgpu-devices-allocated"]
        == "mt-mthreads-0,Mthreads,49152,16:mt-mthreads-1,Mthreads,49152,16:;"
    )
    assert r.annotations["mthreads.com/gpu-index"] == "0,1"


def test_single_card_rule_keeps_a_pods_shared_gpus_together():
    # spread would put the second container on the idle GPU; the rule keeps it on the first one
    r = one(
        [mt_node()], pod("p", [ctr("a", limits={CNT: 1, MEM: 2, CORE: 1}), ctr("b", limits={CNT: 1, MEM: 2, CORE: 1})])
    )
    assert (
        r.annotations["hami.io/mthreads-vgpu-devices-allocated"]
        == "mt-mthreads-0,Mthreads,1024,1:;mt-mthreads-0,Mthreads,1024,1:;"
    )
    r = one(
        [mt_node()],
        pod("q", [ctr("a", limits={CNT: 1, MEM: 64, CORE: 1}), ctr("b", limits={CNT: 1, MEM: 64, CORE: 1})]),
    )
    assert r.reasons() == {"mt": "1/2 CardInsufficientMemory, 1/2 CardNotFoundCustomFilterRule"}


def test_no_node_lock_and_too_many_gpus():
    assert MthreadsVendor.lock_annotation is None
    assert one([mt_node()], pod("p", [ctr(limits={CNT: 3})])).reasons() == {"mt": "NodeInsufficientDevice"}
