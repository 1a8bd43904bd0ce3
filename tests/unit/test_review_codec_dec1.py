"""Found by review, 1 Dec: a node's (or a pod's) bad values in registrations and annotations made
the scheduler's Filter raise something other than CoreError (an HTTP 500, no event) or grow
without bound. Each test names its scenario."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from hami.config import device_config_from_dict
from hami.core import rebuild, schedule_pod
from hami.core.errors import RequestError
from hami.core.nodefit import Requirement
from hami.core.score import parse_weights
from hami.vendors.nvidia import NvidiaVendor

from ._corekit import A100_40_MIG, mig_gpu
from ._vendorkit import NOW, admit, config, ctr, node, pod

CFG = config()
NVIDIA_REG = "hami.io/node-nvidia-register"


def nvidia_devices(name: str) -> str:
    return json.dumps(
        [{"id": f"GPU-{name}", "count": 10, "devmem": 81920, "devcore": 100, "type": "NVIDIA-A100", "health": True}]
    )


def nvidia_pod(name: str = "p", annotations: dict | None = None) -> dict:
    return pod(name, [ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})], annotations)


def schedule(nodes: list[dict], p: dict):
    """Every node's registration is read (warnings returned), the pod is scheduled over all nodes."""
    ledger, warnings = rebuild(nodes, [], CFG.vendors)
    return schedule_pod(admit(p, CFG), None, ledger, CFG, NOW), warnings


# ---------------------------------------------------------------- 1. Ascend NetworkID of any JSON type


def ascend_node(name: str, net) -> dict:
    devs = [
        {
            "id": f"{name}-npu{i}",
            "index": i,
            "count": 4,
            "devmem": 65536,
            "devcore": 20,
            "type": "Ascend910B3",
            "health": True,
            "custominfo": {"NetworkID": net},
        }
        for i in range(4)
    ]
    return node(
        name,
        {
            "hami.io/node-register-Ascend910B3": json.dumps(devs),
            "hami.io/node-handshake-Ascend910B3": "Requesting_2026-11-21 22:00:00",
        },
    )


@pytest.mark.parametrize("bad", [[1], {"id": 1}, True])
@pytest.mark.parametrize("nums", [1, 2])  # 1: the node score groups by NetworkID; 2: the choice does
def test_an_ascend_network_id_that_is_not_a_number_reads_as_absent(bad, nums):
    """Found by review, 1 Dec: one node registering custominfo {"NetworkID": [1]} made every
    Ascend910 Filter raise TypeError (unhashable list); now that node's NPUs are taken without
    NetworkID groups and the good node keeps its groups."""
    p = pod("p", [ctr(limits={"huawei.com/Ascend910B3": nums})])
    good, evil = ascend_node("good", 0), ascend_node("evil", bad)
    ledger, warnings = rebuild([good, evil], [], CFG.vendors)
    assert not warnings
    for candidates in (None, ["evil"], ["good"]):
        res = schedule_pod(admit(p, CFG), candidates, ledger, CFG, NOW)
        assert res.node in ("good", "evil") and res.node in (candidates or ("good", "evil"))
    assert all("NetworkID" not in (d.custominfo or {}) for d in ledger.node("evil").devices)
    assert all(d.custominfo == {"NetworkID": 0} for d in ledger.node("good").devices)


# ---------------------------------------------------------------- 2. unbounded capacities (MetaX, Enflame)

BIG = 10**400


@pytest.mark.parametrize("field", ["totalDevCount", "totalCompute", "totalVRam"])
@pytest.mark.parametrize("value", [pytest.param(BIG, id="10^400"), pytest.param(2**31, id="2^31")])
def test_a_metax_sgpu_capacity_beyond_int32_refuses_that_registration_only(field, value):
    """Found by review, 1 Dec: totalVRam 10^400 on one node made every Filter scoring that node raise
    OverflowError (for any vendor's pod); now that node's sGPU registration is refused, by name, and
    its NVIDIA GPU still takes pods."""
    dev = {"uuid": "sg-1", "totalDevCount": 4, "totalCompute": 100, "totalVRam": 65536, "healthy": True, field: value}
    evil = node("evil", {NVIDIA_REG: nvidia_devices("evil"), "metax-tech.com/node-gpu-devices": json.dumps([dev])})
    good = node("good", {NVIDIA_REG: nvidia_devices("good")})
    res, warnings = schedule([good, evil], nvidia_pod())
    assert res.node in ("good", "evil")
    assert len(warnings) == 1 and f"field {field!r} must be in 0..2147483647" in warnings[0], warnings
    assert "node evil: annotation metax-tech.com/node-gpu-devices" in warnings[0]


@pytest.mark.parametrize(
    "losses,message",
    [
        pytest.param({"1": BIG}, "entry '1': a 1329-bit number is out of range (int64)", id="10^400"),
        ({"²": 1}, "entry '²': 1 must map a card count to a number"),
    ],
)
def test_a_metax_topology_map_with_a_huge_value_or_a_non_ascii_count_is_refused_by_name(losses, message):
    """Found by review, 1 Dec: a losses map {"1": 10^400} made the MetaX GPU node score raise
    OverflowError; {"²": 1} passed str.isdigit and failed in int(). Both are now refused naming
    the entry."""
    evil = node("evil", {"metax-tech.com/gpu.topology.losses": json.dumps(losses)}, {"metax-tech.com/gpu": 2})
    good = node("good", {}, {"metax-tech.com/gpu": 2})
    res, warnings = schedule([good, evil], pod("p", [ctr(limits={"metax-tech.com/gpu": 1})]))
    assert res.node == "good"
    assert len(warnings) == 1 and message in warnings[0], warnings


def enflame_node(name: str, capacity, profiles: dict) -> dict:
    cap = {"devices": [{"index": 0, "minor": 0, "capacity": capacity}], "profiles": profiles}
    return node(name, {NVIDIA_REG: nvidia_devices(name), "enflame.com/gcu-drs-capacity": json.dumps(cap)})


@pytest.mark.parametrize(
    "capacity,profiles,message",
    [
        pytest.param(
            BIG,
            {"1g.1gb": 1},
            "devices[0]: field 'capacity' must be in 0..2147483647, got a 1329-bit number",
            id="capacity",
        ),
        pytest.param(6, {f"1g.{'9' * 400}gb": 1}, "profile name '1g.999", id="400-digit-GiB"),
        (6, {"0g.8gb": 1}, "profile name '0g.8gb': slices must be 1..999999"),
        (2**30, {"1g.8gb": 1}, "field 'capacity' 1073741824 x 8192 MiB per slice is 8796093022208 MiB"),
    ],
)
def test_an_enflame_capacity_or_profile_beyond_int32_refuses_that_registration_only(capacity, profiles, message):
    """Found by review, 1 Dec: capacity 10^400 (or a profile 1g.<400 digits>gb) made every Filter
    scoring that node raise OverflowError; a profile 0g.8gb divided by zero. Now the node's DRS
    registration is refused, naming the field and value, and its NVIDIA GPU still takes pods."""
    evil, good = enflame_node("evil", capacity, profiles), node("good", {NVIDIA_REG: nvidia_devices("good")})
    res, warnings = schedule([good, evil], nvidia_pod())
    assert res.node in ("good", "evil")
    assert len(warnings) == 1 and message in warnings[0], warnings
    assert "node evil: annotation enflame.com/gcu-drs-capacity" in warnings[0]


# ---------------------------------------------------------------- 3. use/nouse type lists without a limit


def test_a_type_list_past_64_distinct_entries_is_refused_by_name():
    """Found by review, 1 Dec: a 120k-entry nvidia.com/nouse-gputype was matched against every
    device visited (6-19 s per Filter); now more than 64 distinct entries is a RequestError naming
    the annotation and the count."""
    ledger, _ = rebuild([node("n", {NVIDIA_REG: nvidia_devices("n")})], [], CFG.vendors)
    for key in ("nvidia.com/nouse-gputype", "nvidia.com/use-gputype"):
        many = ",".join(f"x{i}" for i in range(65))
        with pytest.raises(RequestError, match=re.escape(f"annotation {key}: 65 distinct device types listed")):
            schedule_pod(admit(nvidia_pod(annotations={key: many}), CFG), None, ledger, CFG, NOW)
        entries = (["A100"] if key == "nvidia.com/use-gputype" else ["x63"]) + [f"x{i}" for i in range(63)]
        at_cap = ",".join(entries * 3)  # 64 distinct entries, each three times
        assert schedule_pod(admit(nvidia_pod(annotations={key: at_cap}), CFG), None, ledger, CFG, NOW).node == "n"


def test_type_list_entries_are_deduplicated():
    """Found by review, 1 Dec: 120,000 copies of one entry were each matched per device; now the
    selection keeps each entry once (case-insensitively), in first-seen order."""
    nv = next(v for v in CFG.vendors if v.name == "NVIDIA")
    sel = nv.selection({"nvidia.com/nouse-gputype": ",".join(["q", "Q", "t4"] * 40_000)})
    assert sel.nouse_types == ("q", "t4")


# ---------------------------------------------------------------- 4. scoring weights


@pytest.mark.parametrize(
    "weight",
    ["²", pytest.param("9" * 5000, id="5000-digits"), pytest.param("9" * 400, id="400-digits"), "1000000", "١"],
)
def test_a_scoring_weight_that_is_not_a_small_ascii_number_is_a_request_error(weight):
    """Found by review, 1 Dec: "slot=²" passed str.isdigit and failed in int() (ValueError),
    5000 digits failed in int(), 400 digits passed and overflowed the device score: all now the
    RequestError a malformed annotation gets, naming the annotation and the item."""
    text = f"slot={weight},core=1,memory=1"
    with pytest.raises(RequestError, match=r"hami.io/device-scoring-weights: invalid item 'slot="):
        parse_weights(text, "hami.io/device-scoring-weights")
    ledger, _ = rebuild([node("n", {NVIDIA_REG: nvidia_devices("n")})], [], CFG.vendors)
    p = nvidia_pod(annotations={"hami.io/device-scoring-weights": text})
    with pytest.raises(RequestError, match="each N in 0..999999"):
        schedule_pod(admit(p, CFG), None, ledger, CFG, NOW)


def test_scoring_weights_up_to_six_digits_still_work():
    """Found by review, 1 Dec (the bound above keeps ordinary weights)."""
    w = parse_weights("slot=999999,core=0,memory=007")
    assert (w.slot, w.core, w.memory) == (999999, 0, 7)


# ---------------------------------------------------------------- 5. NVIDIA allowed-profiles memo


def test_the_allowed_profiles_memo_stays_bounded_over_changing_registrations():
    """Found by review, 1 Dec: the memo was keyed by (type, every registered profile) and never
    evicted: 200 re-registrations with changing types held ~69 MiB. Now it is keyed by type and
    bounded, and the allowlist still narrows the profiles after entries are dropped."""
    cfg = device_config_from_dict({"nvidia": {"migProfileAllowlist": [{"models": ["A100"], "profiles": ["3g.20gb"]}]}})
    nv = NvidiaVendor(cfg.nvidia)
    gpu = mig_gpu("m", 0)
    for gen in range(1000):
        dev = replace(gpu, type=f"NVIDIA-A100 rev{gen}")
        assert [p.name for p in nv.allowed_profiles(dev)] == ["3g.20gb"]
    assert len(nv._allowed_memo) < 1000
    assert all(isinstance(k, str) for k in nv._allowed_memo)  # no registered profiles held
    other = replace(gpu, type="NVIDIA-H100")
    assert nv.allowed_profiles(other) == A100_40_MIG  # no allowlist entry: every registered profile


# ---------------------------------------------------------------- 6. nodefit: 19-digit int64 labels


@pytest.mark.parametrize(
    "label,op,value,expected",
    [
        ("9223372036854775807", "Gt", "9223372036854775806", True),  # int64 max: 19 digits
        ("-9223372036854775808", "Lt", "0", True),  # int64 min
        ("+0000000000000000000000012", "Gt", "11", True),  # leading zeros, as ParseInt
        ("9223372036854775808", "Gt", "0", False),  # beyond int64: not an integer
        ("1" * 5000, "Gt", "0", False),  # thousands of digits: not an integer, no error
        ("١٢", "Gt", "0", False),  # other scripts' digits: not an integer
    ],
)
def test_node_affinity_gt_lt_read_int64_as_kubernetes_does(label, op, value, expected):
    """Found by review, 1 Dec: hami simulate read only up to 18 digits, so a 19-digit int64 label
    (which Kubernetes' ParseInt accepts) never matched Gt/Lt."""
    assert Requirement("k", op, (value,)).matches(label) is expected


def test_a_device_amount_beyond_int32_from_any_vendors_parser_drops_that_registration_only():
    """Central guard (found by review, 1 Dec): each vendor's parser bounds its own numbers, and
    one that did not (MetaX sGPU, Enflame DRS) let a 400-digit capacity reach node scoring, which
    raised OverflowError for every pod on the node. read_node_devices now checks every vendor's
    devices: that vendor's registration is left out, naming the device and field."""
    from hami.core.ledger import MAX_DEVICE_AMOUNT, read_node_devices
    from hami.core.types import DeviceInfo

    class Stated:
        def __init__(self, name, **amounts):
            self.name, self.amounts = name, amounts

        def node_devices(self, node):
            return (DeviceInfo(id=f"{self.name}-0", **{"count": 10, "devmem": 1000, "devcore": 100, **self.amounts}),)

        def pair_scores(self, node):
            return {}

    node = {"metadata": {"name": "n1", "annotations": {}}}
    for field, value in (("devmem", 10**400), ("count", MAX_DEVICE_AMOUNT + 1), ("devcore", -1)):
        devices, errors = read_node_devices(node, [Stated("bad", **{field: value}), Stated("good")])
        assert [d.id for d in devices.devices] == ["good-0"]
        assert errors["bad"].startswith(f"node n1: device 'bad-0': {field} must be in 0..{MAX_DEVICE_AMOUNT}, got ")
    devices, errors = read_node_devices(node, [Stated("edge", devmem=MAX_DEVICE_AMOUNT)])
    assert not errors and devices.devices[0].devmem == MAX_DEVICE_AMOUNT
