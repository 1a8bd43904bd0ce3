"""Vastai and Biren: whole devices from JSON registrations (devcore forced to 100)."""

from __future__ import annotations

import json

import pytest

from hami.vendors import BirenVendor, VastaiVendor

from ._vendorkit import NOW, ctr, node, one, place, pod

CASES = [
    ("Vastai", "hami.io/node-va-register", "vastaitech.com/va", "vastaitech.com/use-va", "VA1-V"),
    ("Biren", "hami.io/node-biren-register", "birentech.com/gpu", "birentech.com/use-biren", "BR104"),
]


def whole_node(name: str, key: str, model: str, n: int = 2) -> dict:
    devs = [
        {"id": f"{name}-{i}", "index": i, "count": 4, "devmem": 32768, "devcore": 7, "type": model, "health": True}
        for i in range(n)
    ]
    return node(name, {key: json.dumps(devs)})


@pytest.mark.parametrize("vendor,key,res,use_type,model", CASES)
def test_whole_devices_exact_annotations(vendor, key, res, use_type, model):
    r = one([whole_node("n", key, model)], pod("p", [ctr(limits={res: 1})]))
    value = f"n-0,{vendor},32768,0:;"
    assert r.annotations == {
        "hami.io/vgpu-node": "n",
        "hami.io/vgpu-time": str(int(NOW)),
        f"hami.io/{vendor}-devices-allocated": value,
        f"hami.io/{vendor}-devices-to-allocate": value,
    }


@pytest.mark.parametrize("vendor,key,res,use_type,model", CASES)
def test_misfits(vendor, key, res, use_type, model):
    results = place(
        [whole_node("n", key, model, n=1)], [pod("a", [ctr(limits={res: 1})]), pod("b", [ctr(limits={res: 1})])]
    )
    assert results[1].reasons() == {"n": "1/1 CardInsufficientMemory"}
    r = one([whole_node("n", key, model)], pod("p", [ctr(limits={res: 1})], {use_type: "other-model"}))
    assert r.reasons() == {"n": "2/2 CardTypeMismatch"}


def test_devcore_is_forced_to_100():
    for v, key in ((VastaiVendor(), "hami.io/node-va-register"), (BirenVendor(), "hami.io/node-biren-register")):
        assert {d.devcore for d in v.node_devices(whole_node("n", key, "m"))} == {100}
