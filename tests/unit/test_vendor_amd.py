"""AMD: cores as compute-unit counts, product name as the allocation type."""

from __future__ import annotations

import json
import re

import pytest

from hami.core.errors import RequestError

from ._vendorkit import NOW, admit, config, ctr, node, one, place, pod

CFG = config()
GPU, MEM, CORES = "amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores"
MODEL = "AMD Instinct MI300X"


def amd_node(name: str = "mi", n: int = 2) -> dict:
    devs = [
        {"id": f"amd-{i}", "index": i, "count": 10, "devmem": 196608, "devcore": 304, "type": MODEL, "health": True}
        for i in range(n)
    ]
    return node(name, {"hami.io/node-amd-register": json.dumps(devs)})


@pytest.mark.parametrize("value", [0, 101])
def test_admission_rejects_core_percent_out_of_range(value):
    with pytest.raises(RequestError, match=re.escape(f"amd.com/gpucores must be an integer in 1..100, got {value}")):
        admit(pod("bad", [ctr(limits={GPU: 1, CORES: value})]), CFG)


@pytest.mark.parametrize(
    "limits,allocated",
    [
        ({GPU: 1, MEM: 8192, CORES: 25}, f"amd-0,{MODEL},8192,76:;"),  # 304 CUs x 25%
        ({GPU: 1, CORES: 1}, f"amd-0,{MODEL},196608,3:;"),  # no memory: the whole card
        ({GPU: 2, MEM: 1024}, f"amd-0,{MODEL},1024,0:amd-1,{MODEL},1024,0:;"),
    ],
)
def test_annotations_exact(limits, allocated):
    r = one([amd_node()], pod("p", [ctr(limits=limits)]))
    assert r.annotations == {
        "hami.io/vgpu-node": "mi",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/amd-devices-allocated": allocated,
        "hami.io/amd-devices-to-allocate": allocated,
    }


@pytest.mark.parametrize(
    "first,second,reason",
    [
        ({GPU: 1, MEM: 1024, CORES: 90}, {GPU: 1, MEM: 1024, CORES: 20}, "1/1 CardInsufficientCore"),
        ({GPU: 1, MEM: 1024, CORES: 10}, {GPU: 1, MEM: 1024, CORES: 100}, "1/1 ExclusiveDeviceAllocateConflict"),
    ],
)
def test_misfits(first, second, reason):
    results = place([amd_node(n=1)], [pod("a", [ctr(limits=first)]), pod("b", [ctr(limits=second)])])
    assert results[1].reasons() == {"mi": reason}


def test_type_selection():
    r = one([amd_node()], pod("p", [ctr(limits={GPU: 1})], {"amd.com/use-gputype": "MI250"}))
    assert r.reasons() == {"mi": "2/2 CardTypeMismatch"}
    r = one([amd_node()], pod("p", [ctr(limits={GPU: 1})], {"amd.com/use-gpu-uuid": "amd-1"}))
    assert r.annotations["hami.io/amd-devices-allocated"].startswith("amd-1,")


def test_health_follows_capacity():
    from hami.vendors import AmdVendor

    v = AmdVendor()
    assert v.check_health(node("mi", capacity={GPU: 2}), None, None).healthy
    assert not v.check_health(amd_node(), None, None).healthy  # registered but the kubelet advertises none
