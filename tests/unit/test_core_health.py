from datetime import datetime, timedelta

import pytest

from hami.core.health import HealthMemo, HealthVerdict, handshake_health, nvidia_health, requesting_value
from hami.vendors import NvidiaVendor

NOW = datetime(2026, 11, 21, 22, 0, 0)


@pytest.mark.parametrize(
    "value,alloc,expect",
    [
        (None, 0, (True, True, "Requesting_2026-11-21 22:00:00")),
        ("Reported 2026-11-21 21:59:00 +0000 UTC", 0, (True, True, "Requesting_2026-11-21 22:00:00")),
        ("Requesting_2026-11-21 21:59:30", 0, (True, False, None)),  # fresh
        ("Requesting_2026-11-21 21:58:00", 0, (False, False, None)),  # expired, nothing allocatable
        ("Requesting_2026-11-21 21:58:00", 80, (True, False, None)),  # expired but still allocatable
        ("Requesting_garbage", 0, (True, False, None)),  # unparsable time
        ("Deleted_2026-11-21 21:00:00", 0, (True, True, "Requesting_2026-11-21 22:00:00")),
    ],
)
def test_generic_handshake(value, alloc, expect):
    v = handshake_health(value, alloc, NOW)
    assert (v.healthy, v.need_update, v.write_handshake) == expect


def test_requesting_value_format():
    assert requesting_value(NOW + timedelta(seconds=5)) == "Requesting_2026-11-21 22:00:05"


def test_nvidia_override_sequence():
    memo = HealthMemo()
    generic = HealthVerdict(True, False)
    assert nvidia_health(memo, "n", 0, "", generic) == generic  # 0 and was 0: generic
    assert nvidia_health(memo, "n", 80, "[a]", generic).need_update  # count changed
    assert nvidia_health(memo, "n", 80, "[a]", generic) == generic  # nothing changed
    assert nvidia_health(memo, "n", 80, "[b]", generic) == HealthVerdict(True, True)  # text changed
    assert nvidia_health(memo, "n", 0, "[b]", generic) == HealthVerdict(False, False)  # dropped to 0
    memo.forget("n")
    assert "n" not in memo.allocatable


def test_vendor_check_health_reads_the_node():
    v = NvidiaVendor()
    node = {
        "metadata": {"name": "n", "annotations": {v.register_annotation: "[]"}},
        "status": {"allocatable": {"nvidia.com/gpu": "40"}},
    }
    verdict = v.check_health(node, NOW, HealthMemo())
    assert verdict.healthy and verdict.need_update and verdict.write_handshake == "Requesting_2026-11-21 22:00:00"
