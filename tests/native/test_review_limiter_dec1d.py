"""Compute shares and priority after a sibling dies, a stale monitor block, a future-stamped peer
(review, 1 Dec). On the fake GPU, as tests/native/test_compute_share.py and test_priority.py:
orderings and ratios measured inside the run's own windows, no wall-clock limits."""

from __future__ import annotations

import os
import signal
import struct
import time

import pytest

from hami.monitor.region import LEASE_UNTIL_AT, V1, read_region, write_int32

from .cshare import base_env, start
from .test_priority import PAUSED, RUNNING

pytestmark = pytest.mark.native


@pytest.fixture
def env(native_build):
    return base_env(native_build / "fakegpu")


def _wait_for_region(path, size=V1.size, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size >= size:
            return
        time.sleep(0.02)
    raise AssertionError(f"{path} never reached {size} bytes")


def test_survivor_takes_back_a_killed_siblings_share(env, tmp_path):
    """Found by review, 1 Dec: two processes of one container at limit 40 hold ~20 % each; the
    sibling is SIGKILLed and its slot (status 1, last published share 20) stayed in the split, so
    the survivor was held at ~20 % for ever instead of taking back the container's 40 %."""
    m, region = tmp_path / "m", tmp_path / "c.cache"
    victim = start(env, m, region, limit=40, policy="force", seconds=10)
    survivor = start(env, m, region, limit=40, policy="force", seconds=6)
    time.sleep(2.5)
    victim.proc.send_signal(signal.SIGKILL)
    killed = time.time() * 1000
    victim.proc.wait()
    tr = survivor.trace()
    before = tr.share(tr.start + 1000, killed - 50)
    after = tr.share(killed + 2000, tr.end - 50)
    print(f"survivor at limit 40: {before:.1f}% beside its sibling, {after:.1f}% after the sibling's SIGKILL")
    assert after <= 40 + 5  # still held at the container's limit ...
    # ... but at all of it: twice its half (a ratio, so a loaded machine that slows both windows
    # alike does not matter); with the dead sibling's share still counted it stayed at ~1x
    assert after >= 1.5 * before, (before, after)


def _mono_ms() -> int:
    return int(time.monotonic() * 1000)


def _pwrite(path, offset: int, fmt: str, value: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, struct.pack(fmt, value), offset)
    finally:
        os.close(fd)


def test_a_monitor_block_holds_only_while_its_lease_runs(env, tmp_path):
    """Found by review, 1 Dec: recent_kernel = -1 paused launches with no expiry, so the monitor
    kept blocking off by default (a monitor that died after blocking stalled the container) and
    nvidia.com/priority did nothing for pods. Now the monitor writes a lease with each -1 and
    libvgpu honours the -1 only while it runs: a fresh one pauses, an expired one (the monitor
    gone) or one too far ahead (another clock) is ignored. The task has a compute limit: a block
    holds only there, as in HAMi-core (test_review_priority_dec1d.py)."""
    region = tmp_path / "c.cache"
    task = start(env, tmp_path / "m", region, limit=50, seconds=3.2, depth=8)
    _wait_for_region(region)
    time.sleep(0.4)  # launching by now (the mark is written at the first launch)
    marked = read_region(str(region)).priority_lease
    write_int32(str(region), "recent_kernel", -1)  # what the monitor writes: lease, then -1
    fresh = time.time() * 1000
    time.sleep(0.5)
    _pwrite(region, LEASE_UNTIL_AT, "<Q", _mono_ms() - 1000)  # the monitor died: its lease ran out
    stale = time.time() * 1000
    time.sleep(0.7)
    _pwrite(region, LEASE_UNTIL_AT, "<Q", _mono_ms() + 600_000)  # 10 min ahead: no lease of this clock
    far = time.time() * 1000
    time.sleep(0.7)
    write_int32(str(region), "recent_kernel", 0)  # lifted; clears the lease
    lifted = time.time() * 1000
    tr = task.trace()
    late = tr.count_at(stale - 20) - tr.count_at(fresh + 60)
    print(
        f"lease: {late} launches while freshly blocked, {tr.share(stale + 100, far):.1f}% with the lease "
        f"expired, {tr.share(far + 100, lifted):.1f}% with it too far ahead"
    )
    assert late <= 2 * 8  # a fresh block pauses (at most the launches already in flight count)
    assert tr.share(stale + 100, far) > RUNNING  # an expired lease does not
    assert tr.share(far + 100, lifted) > RUNNING  # nor one a clock of ours never reaches
    assert marked  # libvgpu tells the monitor it takes leases
    with open(region, "rb") as f:
        f.seek(LEASE_UNTIL_AT)
        assert struct.unpack("<Q", f.read(8))[0] == 0  # lifting the block cleared the lease


def _peer_region(path, uuid: bytes, priority: int, pid: int) -> None:
    """A peer task's region, written by hand: one live slot (``pid``, status 1) on ``uuid``."""
    buf = bytearray(V1.size + 1)
    struct.pack_into("<iII", buf, 0, 19920718, 1, 2)
    struct.pack_into("<Q", buf, V1.device_num, 1)
    buf[V1.uuids : V1.uuids + len(uuid)] = uuid
    struct.pack_into("<iiii", buf, V1.proc_num, 1, 1, 2, priority)
    struct.pack_into("<ii", buf, V1.procs, pid, 0)
    struct.pack_into("<i", buf, V1.procs + V1.slot_status, 1)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(bytes(buf))
    tmp.rename(path)


def test_a_peer_launch_stamped_in_the_future_does_not_pause(env, tmp_path):
    """Found by review, 1 Dec: a peer's latest-launch stamp (wall-clock ms) written before the
    clock was set back lies ahead of the clock; it counted as a launch within the quiet time, so a
    low-priority task paused until the clock caught up (the step's length). Contrast: the same
    peer with a current stamp does pause it."""
    m, peers = tmp_path / "m", tmp_path / "regions"
    peers.mkdir()
    low = start(env, m, peers / "low.cache", priority=1, seconds=3.0, depth=8, extra={"HAMI_PEER_REGIONS": str(peers)})
    _wait_for_region(peers / "low.cache")
    time.sleep(0.3)
    with open(peers / "low.cache", "rb") as f:
        f.seek(V1.uuids)
        uuid = f.read(96).split(b"\0", 1)[0]
    assert uuid
    peer = peers / "high.cache"
    _peer_region(peer, uuid, priority=0, pid=os.getpid())
    stamp_at = V1.procs + 8 + 40  # slot 0, used[0].unused[0]: latest launch on device 0, wall ms
    _pwrite(peer, stamp_at, "<Q", int(time.time() * 1000) + 600_000)  # ten minutes ahead
    future = time.time() * 1000
    time.sleep(0.8)
    current = time.time() * 1000
    while time.time() * 1000 < current + 800:  # the peer launching now
        _pwrite(peer, stamp_at, "<Q", int(time.time() * 1000))
        time.sleep(0.01)
    quiet = time.time() * 1000
    tr = low.trace()
    ahead, now = tr.share(future + 200, current), tr.share(current + 200, quiet)
    print(f"peer stamped 10 min ahead: low at {ahead:.1f}%; peer launching now: low at {now:.1f}%")
    assert now < PAUSED  # the peer region is read, and a current launch of it pauses the task
    assert ahead > RUNNING  # one stamped in the future does not
