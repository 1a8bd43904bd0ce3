"""Hygon DCU: legacy colon registration, generic fit, exact annotations."""

from __future__ import annotations

import pytest

from hami.config import HygonConfig, chart_device_config
from hami.core import rebuild

from ._vendorkit import NOW, config, ctr, node, one, place, pod

CFG = config()
REG = "DCU-a,4,16368,100,DCU-Z100,0,true:DCU-b,4,16368,100,DCU-Z100,1,true,1,hami-core:"


def dcu_node(name: str = "dcu-1", reg: str = REG) -> dict:
    return node(
        name, {"hami.io/node-dcu-register": reg, "hami.io/node-handshake-dcu": "Requesting_2026-11-21 22:00:00"}
    )


# equal scores: DCU-b (NUMA 1) before DCU-a (NUMA 0), as HAMi walks its sorted list
@pytest.mark.parametrize(
    "limits,allocated",
    [
        ({"hygon.com/dcunum": 1, "hygon.com/dcumem": 4000, "hygon.com/dcucores": 20}, "DCU-b,DCU,4000,20:;"),
        ({"hygon.com/dcunum": 1}, "DCU-b,DCU,16368,100:;"),  # default cores 100, whole memory
        ({"hygon.com/dcunum": 2, "hygon.com/dcumem": 1000}, "DCU-b,DCU,1000,100:DCU-a,DCU,1000,100:;"),
    ],
)
def test_annotations_exact(limits, allocated):
    r = one([dcu_node()], pod("p", [ctr(limits=limits)]))
    assert r.annotations == {
        "hami.io/vgpu-node": "dcu-1",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/dcu-devices-allocated": allocated,
        "hami.io/dcu-devices-to-allocate": allocated,
    }


@pytest.mark.parametrize(
    "annotations,limits,reason",
    [
        ({"hygon.com/use-dcutype": "K100"}, {"hygon.com/dcunum": 1}, "2/2 CardTypeMismatch"),
        ({"hygon.com/nouse-gpuuuid": "DCU-a,DCU-b"}, {"hygon.com/dcunum": 1}, "2/2 CardUuidMismatch"),
        ({}, {"hygon.com/dcunum": 1, "hygon.com/dcumem": 20000}, "2/2 CardInsufficientMemory"),
        ({}, {"hygon.com/dcunum": 3}, "NodeInsufficientDevice"),
    ],
)
def test_misfits(annotations, limits, reason):
    r = one([dcu_node()], pod("p", [ctr(limits=limits)], annotations))
    assert r.reasons() == {"dcu-1": reason}


def test_exclusive_then_shared():
    results = place(
        [dcu_node(reg="DCU-a,4,16368,100,DCU-Z100,0,true:")],
        [
            pod("a", [ctr(limits={"hygon.com/dcunum": 1})]),
            pod("b", [ctr(limits={"hygon.com/dcunum": 1, "hygon.com/dcumem": 10, "hygon.com/dcucores": 0})]),
        ],
    )
    assert results[1].reasons() == {"dcu-1": "1/1 CardInsufficientMemory"}


def test_memory_factor():
    cfg = config(chart_device_config().model_copy(update={"hygon": HygonConfig(memoryFactor=4)}))
    r = one([dcu_node()], pod("p", [ctr(limits={"hygon.com/dcunum": 1, "hygon.com/dcumem": 1000})]), cfg)
    assert r.annotations["hami.io/dcu-devices-allocated"] == "DCU-b,DCU,4000,100:;"


def test_malformed_registration_names_the_annotation():
    _, warnings = rebuild([dcu_node(reg="DCU-a,4,16368:")], [], CFG.vendors)
    assert warnings == [
        "skipping node: node dcu-1: annotation hami.io/node-dcu-register: device[0]: "
        "expected 7 or 9 comma-separated fields, got 3 in 'DCU-a,4,16368'"
    ]
