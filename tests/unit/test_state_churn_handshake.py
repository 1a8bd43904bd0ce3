"""Handshake stamps HAMi up to v2.3 left on nodes (``Requesting_2006.01.02 15:04:05``) expire."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest

from hami.core.health import handshake_health, handshake_time
from hami.scheduler.state import ClusterState, vendor_alive

from .test_scheduler_state import CONFIG, NV, node

LEGACY = "%Y.%m.%d %H:%M:%S"  # Go layout 2006.01.02 15:04:05, in the writer's local time


def legacy(at: float, prefix: str = "Requesting_") -> str:
    return prefix + datetime.fromtimestamp(at).strftime(LEGACY)


def test_a_legacy_requesting_stamp_expires_and_the_dead_node_leaves():
    now = time.time()
    old = legacy(now - 30 * 24 * 3600)  # left by the old scheduler a month ago, the plugin gone
    assert not vendor_alive(node("dead", allocatable=False, handshake=old), NV, now)
    assert vendor_alive(node("dead", allocatable=False, handshake=legacy(now - 10)), NV, now)  # fresh
    assert vendor_alive(node("up", handshake=old), NV, now)  # the kubelet still advertises GPUs
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("dead", allocatable=False, handshake=old), node("up")])
    assert s.ledger.node_names() == ["up"]


def test_the_legacy_stamp_ages_on_the_clock():
    now = [time.time()]
    s = ClusterState(CONFIG, clock=lambda: now[0])
    s.node_handler.replace([node("n", allocatable=False, handshake=legacy(now[0] - 5))])
    assert s.ledger.node_names() == ["n"]
    now[0] += 120
    s.recheck_nodes()
    assert s.ledger.node_names() == []


NOW = datetime(2026, 11, 21, 22, 0, 0)


@pytest.mark.parametrize(
    "value,alloc,expect",
    [
        ("Requesting_2026.11.21 21:59:30", 0, (True, False)),  # fresh
        ("Requesting_2026.11.21 21:58:00", 0, (False, False)),  # expired, nothing allocatable
        ("Requesting_2026.11.21 21:58:00", 8, (True, False)),  # expired but still allocatable
        ("Requesting_2026-11-21 21:58:00", 0, (False, False)),  # today's form, unchanged
        ("Requesting_21:58 2026/11/21", 0, (True, False)),  # neither form: healthy, as HAMi
    ],
)
def test_generic_handshake_reads_both_forms(value, alloc, expect):
    v = handshake_health(value, alloc, NOW)
    assert (v.healthy, v.need_update) == expect


def test_handshake_time_forms():
    assert handshake_time("2026.11.21 21:58:00") == handshake_time("2026-11-21 21:58:00") == NOW - timedelta(minutes=2)
    assert handshake_time("garbage") is None
