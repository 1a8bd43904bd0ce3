"""The shared node lock: value format, staleness rules, owner-checked release with write races."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hami.kube import nodelock as L

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
VALUE = L.lock_value(NOW, "ns", "p")


def test_value_format_round_trips():
    assert VALUE == "2026-05-01T12:00:00Z,ns,p"
    assert L.parse_node_lock(VALUE) == L.NodeLock("2026-05-01T12:00:00Z", "ns", "p")
    assert L.parse_node_lock("2026-05-01T12:00:00+02:00,ns,p") is not None  # Go RFC3339 with an offset
    assert L.parse_node_lock("2026-05-01T12:00:00Z") is None  # legacy: names no pod
    assert L.owned_by(VALUE, "ns", "p") and not L.owned_by(VALUE, "ns", "q")
    assert L.lock_time("2026-05-01T12:00:00Z") == NOW


def owner(node_name=None, vgpu_node=None, phase=None, deleting=False, pod_phase=None):
    ann = {}
    if vgpu_node:
        ann[L.VGPU_NODE] = vgpu_node
    if phase:
        ann[L.BIND_PHASE] = phase
    meta = {"annotations": ann}
    if deleting:
        meta["deletionTimestamp"] = "2026-05-01T12:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node_name} if node_name else {},
        "status": {"phase": pod_phase} if pod_phase else {},
    }


@pytest.mark.parametrize(
    "age, who, stale",
    [
        (10, owner(vgpu_node="n1", phase="allocating"), None),
        (10, owner(node_name="n1", vgpu_node="n1", phase="allocating"), None),
        (301, owner(vgpu_node="n1"), "expired"),
        (10, L.MISSING, "no longer exists"),
        (10, owner(deleting=True), "being deleted"),
        (10, owner(deleting=True, vgpu_node="n1", phase="allocating"), "being deleted"),  # never bound
        # bound here and being deleted before the kubelet admitted it: the kubelet may still call
        # Allocate, which finds its pod by this lock (found by review: handed on, two pods swapped grants)
        (10, owner(deleting=True, node_name="n1", vgpu_node="n1", phase="allocating"), None),
        (301, owner(deleting=True, node_name="n1", vgpu_node="n1", phase="allocating"), "expired"),
        (10, owner(deleting=True, node_name="n1", vgpu_node="n1", phase="success"), "finished"),
        (10, owner(deleting=True, node_name="n2", vgpu_node="n2", phase="allocating"), "being deleted"),
        (10, owner(vgpu_node="n1", phase="success"), "finished"),
        (10, owner(vgpu_node="n1", phase="failed"), "finished"),
        (10, owner(node_name="n2"), "bound to node n2"),
        # bound here but refused by the kubelet at admission: no Allocate will ever release it
        (10, owner(node_name="n1", vgpu_node="n1", phase="allocating", pod_phase="Failed"), "ended (Failed)"),
        (10, owner(node_name="n1", vgpu_node="n1", phase="allocating", pod_phase="Running"), None),
        (10, owner(vgpu_node="n2"), "placed on node n2"),
    ],
)
def test_stale_reasons(age, who, stale):
    why = L.stale_reason(VALUE, "n1", NOW + timedelta(seconds=age), 300, who)
    assert (why is None) if stale is None else (stale in why)


def test_legacy_lock_only_expires():
    assert L.stale_reason("2026-05-01T12:00:00Z", "n1", NOW + timedelta(seconds=10), 300, None) is None
    assert "expired" in L.stale_reason("2026-05-01T12:00:00Z", "n1", NOW + timedelta(seconds=400), 300, None)
    assert "unreadable" in L.stale_reason("garbage", "n1", NOW, 300, None)


class Conflict(Exception):
    status = 409


class Node:
    """An in-memory node annotation store with resourceVersion checks (what the API server does)."""

    def __init__(self, value=None, conflicts=0):
        self.annotations = {} if value is None else {L.NODE_LOCK: value}
        self.rv = 1
        self.conflicts = conflicts

    async def read(self):
        return dict(self.annotations), str(self.rv)

    async def write(self, patch, rv):
        if self.conflicts:
            self.conflicts -= 1
            self.rv += 1
            raise Conflict()
        assert rv == str(self.rv)
        for k, v in patch.items():
            if v is None:
                self.annotations.pop(k, None)
            else:
                self.annotations[k] = v
        self.rv += 1


async def test_release_owner_checked_and_retried():
    n = Node(VALUE, conflicts=2)
    assert await L.release(n.read, n.write, ("ns", "p"), delay=0)
    assert L.NODE_LOCK not in n.annotations
    other = Node(VALUE)
    assert await L.release(other.read, other.write, ("ns", "q"), delay=0)  # not ours: left in place
    assert other.annotations[L.NODE_LOCK] == VALUE
    busy = Node(VALUE, conflicts=10)
    assert not await L.release(busy.read, busy.write, ("ns", "p"), attempts=3, delay=0)
    assert await L.release(Node().read, Node().write, None)


# ---------------------------------------------------------------- per-vendor locks (§5.8)
from hami.vendors import CambriconVendor  # noqa: E402
from hami.vendors.mthreads import MthreadsVendor  # noqa: E402
from hami.vendors.nvidia import NvidiaVendor  # noqa: E402


def test_vendor_lock_specs_follow_the_vendor_attributes():
    mlu = L.vendor_lock(CambriconVendor())
    assert mlu == L.LockSpec("cambricon.com/dsmlu.lock", L.TIME, 120.0)
    assert mlu.value(NOW, "ns", "p") == "2026-05-01T12:00:00Z"  # bare RFC3339, names nobody
    assert mlu.holder(mlu.value(NOW, "ns", "p")) is None
    assert mlu.expiry(300) == 120.0
    gpu = L.vendor_lock(NvidiaVendor())
    assert gpu == L.HAMI_LOCK and gpu.value(NOW, "ns", "p") == VALUE
    assert gpu.holder(VALUE) == L.NodeLock("2026-05-01T12:00:00Z", "ns", "p")
    assert gpu.expiry(300) == 300  # None: the scheduler's --node-lock-timeout
    assert L.vendor_lock(MthreadsVendor()) is None


def test_cambricon_lock_expires_after_two_minutes_and_never_by_owner():
    mlu = L.vendor_lock(CambriconVendor())
    value = mlu.value(NOW, "ns", "p")
    assert L.stale_reason(value, "n1", NOW + timedelta(seconds=119), mlu.expiry(300), None) is None
    assert "expired" in L.stale_reason(value, "n1", NOW + timedelta(seconds=121), mlu.expiry(300), None)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"format": "json"}, "lock_format: 'json'"),
        ({"key": ""}, "lock_annotation"),
        ({"expiry_s": 0}, "lock_expiry_seconds: 0"),
    ],
)
def test_bad_lock_attributes_are_named(kw, field):
    with pytest.raises(ValueError, match=field):
        L.LockSpec(**kw)


def test_vendor_locks_sorted_by_backend_key_one_per_key():
    vendors = [NvidiaVendor(), CambriconVendor(), MthreadsVendor()]
    assert L.vendor_locks(vendors, {"NVIDIA", "MLU", "Mthreads"}) == [L.vendor_lock(CambriconVendor()), L.HAMI_LOCK]
    assert L.vendor_locks(vendors, {"Mthreads"}) == []
    assert L.vendor_locks([NvidiaVendor(), NvidiaVendor()], {"NVIDIA"}) == [L.HAMI_LOCK]


async def test_release_by_exact_value_for_a_bare_time_lock():
    key = "cambricon.com/dsmlu.lock"
    n = Node()
    n.annotations[key] = "2026-05-01T12:00:00Z"
    assert await L.release(n.read, n.write, ("ns", "p"), key=key, value="2026-05-01T12:05:00Z", delay=0)
    assert n.annotations[key] == "2026-05-01T12:00:00Z"  # another taker's value: left in place
    assert await L.release(n.read, n.write, ("ns", "p"), key=key, value="2026-05-01T12:00:00Z", delay=0)
    assert key not in n.annotations


def test_an_owner_that_ended_is_finished_for_good():
    assert L.finished(owner(node_name="n1", phase="allocating", pod_phase="Failed"))
    assert L.finished(owner(node_name="n1", phase="allocating", pod_phase="Succeeded"))
    assert not L.finished(owner(node_name="n1", phase="allocating", pod_phase="Pending"))


def test_an_owner_being_deleted_is_finished_only_if_it_was_never_bound():
    assert L.finished(owner(deleting=True, vgpu_node="n1", phase="allocating"))
    assert not L.finished(owner(deleting=True, node_name="n1", vgpu_node="n1", phase="allocating"))
    assert L.finished(owner(deleting=True, node_name="n1", vgpu_node="n1", phase="success"))


def test_a_success_with_another_vendors_devices_left_is_not_finished():
    """A pod asking for GPUs and a DCU: HAMi's DCU plugin writes success for its own part; the
    NVIDIA part still finds its pod by the lock, so the owner has not finished with it."""
    left = owner(node_name="n1", vgpu_node="n1", phase="success")
    left["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] = "GPU-1,NVIDIA,1000,10:;"
    left["metadata"]["annotations"]["hami.io/dcu-devices-to-allocate"] = ";"
    assert L.stale_reason(VALUE, "n1", NOW, 300, left) is None and not L.finished(left)
    assert L.devices_pending(left["metadata"]["annotations"]) == ["hami.io/vgpu-devices-to-allocate"]
    left["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] = ";"
    assert "finished" in L.stale_reason(VALUE, "n1", NOW, 300, left) and L.finished(left)
