"""Enflame: DRS slices and profiles, whole GCUs."""

from __future__ import annotations

import json
import re

import pytest

from hami.core import decode_pod_devices, rebuild, schedule_pod
from hami.core.errors import RequestError

from ._vendorkit import NOW, admit, config, ctr, node, one, place, pod, running

CFG = config()
DRS, GMEM, GCORE, GCU = "enflame.com/drs-gcu", "enflame.com/gcu-memory", "enflame.com/gcu-core", "enflame.com/gcu"
GCU_ALLOCATED, GCU_TO_ALLOCATE = "hami.io/enflame-gcu-devices-allocated", "hami.io/enflame-gcu-devices-to-allocate"
WHOLE = next(v for v in CFG.vendors if v.name == "GCU")

PROFILES = {"1g.8gb": 11, "2g.16gb": 12, "3g.24gb": 13, "6g.48gb": 16}


def drs_node(name: str = "gcu", devices: int = 2) -> dict:
    cap = {"devices": [{"index": i, "minor": 10 + i, "capacity": 6} for i in range(devices)], "profiles": PROFILES}
    return node(name, {"enflame.com/gcu-drs-capacity": json.dumps(cap)})


@pytest.mark.parametrize(
    "limits,message",
    [
        ({DRS: 0}, "enflame.com/drs-gcu must be greater than 0, got 0"),
        ({GMEM: 8}, "give enflame.com/drs-gcu > 0, or enflame.com/gcu-memory > 0 with enflame.com/gcu-core in 1..100"),
        (
            {GMEM: 8, GCORE: 101},
            "enflame.com/gcu-core in 1..100 (got enflame.com/gcu-memory=8, enflame.com/gcu-core=101)",
        ),
    ],
)
def test_admission_rejects(limits, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        admit(pod("bad", [ctr(limits=limits)]), CFG)


def test_admission_mirrors_limits_into_requests():
    p = admit(pod("p", [ctr(limits={GMEM: 8, GCORE: 20})]), CFG)
    assert p["spec"]["containers"][0]["resources"]["requests"] == {GMEM: 8, GCORE: 20}


def test_drs_annotations_exact():
    """As Enflame's gcushare device plugin reads them (corrected by review, 1 Dec: the record is
    ``assigned-containers`` without a prefix, ``allocated`` false, the profile ID a string, and
    ``gcu-assigned-id`` the GCU's index, not the profile ID)."""
    r = one([drs_node()], pod("p", [ctr("worker", limits={DRS: 2})]))
    assert r.annotations == {
        "hami.io/vgpu-node": "gcu",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/enflame-vgpu-devices-allocated": "gcu-enflame-drs-0,Enflame,16384,2:;",
        "enflame.com/gcu-request-size": "2",
        "enflame.com/gcu-assigned-id": "0",
        "enflame.com/gcu-assigned": "false",
        "enflame.com/gcu-assigned-index": "0",
        "enflame.com/gcu-assigned-minor": "10",
        "enflame.com/gcu-assigned-time": str(int(NOW) * 1_000_000_000),
        "assigned-containers": '{"worker":{"allocated":false,"request":2,"profileID":"12","profileName":"2g.16gb"}}',
    }


@pytest.mark.parametrize(
    "limits,expected",
    [
        ({GMEM: 20, GCORE: 10}, "gcu-enflame-drs-0,Enflame,24576,3:;"),  # 20 GiB -> 3g.24gb
        ({GMEM: 4, GCORE: 40}, "gcu-enflame-drs-0,Enflame,24576,3:;"),  # 40% of 6 slices -> 3g.24gb
        ({GMEM: 1, GCORE: 1}, "gcu-enflame-drs-0,Enflame,8192,1:;"),
        ({DRS: 4}, "2/2 CardNotFoundCustomFilterRule"),  # no 4-slice profile
        ({GMEM: 64, GCORE: 10}, "2/2 CardNotFoundCustomFilterRule"),  # larger than the largest profile
    ],
)
def test_profile_mapping(limits, expected):
    r = one([drs_node()], pod("p", [ctr(limits=limits)]))
    got = r.annotations.get("hami.io/enflame-vgpu-devices-allocated") or r.reasons()["gcu"]
    assert got == expected


def test_slices_run_out():
    results = place([drs_node(devices=1)], [pod("a", [ctr(limits={DRS: 6})]), pod("b", [ctr(limits={DRS: 1})])])
    assert results[0].node == "gcu"
    assert results[1].reasons() == {"gcu": "1/1 CardInsufficientCore"}


def test_whole_gcu():
    n = node("w", capacity={GCU: 2})
    results = place([n], [pod(f"p{i}", [ctr(limits={GCU: 1})]) for i in range(3)])
    assert results[0].annotations[GCU_ALLOCATED] == "w-GCU-0,GCU,100,100:;"
    assert results[0].annotations[GCU_TO_ALLOCATE] == "w-GCU-0,GCU,100,100:;"
    assert results[1].annotations[GCU_ALLOCATED] == "w-GCU-1,GCU,100,100:;"
    assert results[2].reasons() == {"w": "2/2 CardTimeSlicingExhausted"}


def test_whole_gcus_as_hami_registers_them():
    devices = WHOLE.node_devices(node("n1", capacity={GCU: 2}))
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type) for d in devices] == [
        ("n1-GCU-0", 0, 1, 100, 100, "GCU"),
        ("n1-GCU-1", 1, 1, 100, 100, "GCU"),
    ]


def test_a_gcu_hami_placed_is_counted():
    """A running pod HAMi placed holds ``n1-GCU-0`` (HAMi's ID): the only GCU is taken."""
    held = "n1-GCU-0,GCU,100,100:;"
    placed = running(pod("old", [ctr(limits={GCU: 1})]), "n1", {GCU_ALLOCATED: held, GCU_TO_ALLOCATE: held})
    r = place([node("n1", capacity={GCU: 1})], [pod("new", [ctr(limits={GCU: 1})])], placed=[placed])[0]
    assert r.node is None and r.reasons() == {"n1": "1/1 CardTimeSlicingExhausted"}


@pytest.mark.parametrize(
    "text,expected",
    [
        ("n1-enflame-gcu-1,GCU,0,100:;", "n1-GCU-1,GCU,100,100:;"),  # our earlier releases
        ("n1-GCU-0,GCU,100,100:;", "n1-GCU-0,GCU,100,100:;"),  # HAMi's spelling, read as it is
        (";n1-enflame-gcu-0,GCU,0,100:n1-enflame-gcu-1,GCU,0,100:;", ";n1-GCU-0,GCU,100,100:n1-GCU-1,GCU,100,100:;"),
    ],
)
def test_legacy_gcu_allocations_read_as_hami_writes_them(text, expected):
    assert WHOLE.read_allocation(decode_pod_devices(text), {GCU_ALLOCATED: text}) == decode_pod_devices(expected)


def test_gcu_pods_our_earlier_releases_placed_still_count():
    """After an upgrade from our previous release, its pods (IDs ``<node>-enflame-gcu-<i>``) hold
    their GCUs: no double booking."""
    held = "n1-enflame-gcu-0,GCU,0,100:;"
    placed = running(pod("old", [ctr(limits={GCU: 1})]), "n1", {GCU_ALLOCATED: held, GCU_TO_ALLOCATE: held})
    ledger, warnings = rebuild([node("n1", capacity={GCU: 2})], [placed], CFG.vendors)
    assert not warnings
    assert [(d.id, used, mem) for d, used, mem, _ in ledger.device_usage("n1")] == [
        ("n1-GCU-0", 1, 100),
        ("n1-GCU-1", 0, 0),
    ]
    r = schedule_pod(admit(pod("new", [ctr(limits={GCU: 1})]), CFG), None, ledger, CFG, NOW)
    assert r.annotations[GCU_ALLOCATED] == "n1-GCU-1,GCU,100,100:;"
    r = schedule_pod(admit(pod("more", [ctr(limits={GCU: 1})]), CFG), None, ledger, CFG, NOW)
    assert r.node is None
