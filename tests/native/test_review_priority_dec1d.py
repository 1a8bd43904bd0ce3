"""A node monitor's block and HAMi's semantics, a block left from before a reboot, and the
watcher's reaping (regression review of the 1 Dec priority work). On the fake GPU, as
tests/native/test_priority.py: contrasts of shares and launch counts measured inside the run's
own windows, no wall-clock limits."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import struct
import time

import pytest

from hami.monitor.region import LEASE_MAGIC, LEASE_MAGIC_AT, LEASE_UNTIL_AT, V1, read_region, write_int32

from .cshare import base_env, start
from .conftest import run_py
from .region_layout import BOOT_ID_OFFSET, LOCK_OFFSET, SLOT_SIZE
from .test_priority import RUNNING
from .test_review_limiter_dec1d import _mono_ms, _pwrite, _wait_for_region

pytestmark = pytest.mark.native

DEPTH = 8


@pytest.fixture
def env(native_build):
    return base_env(native_build / "fakegpu")


def _u64(path, offset: int) -> int:
    with open(path, "rb") as f:
        f.seek(offset)
        return int(struct.unpack("<Q", f.read(8))[0])


def test_a_block_pauses_only_a_container_with_a_compute_limit(env, tmp_path):
    """Found by review, 1 Dec: every launch waited on recent_kernel = -1, so the monitor's default
    blocking paused containers HAMi never pauses: HAMi-core waits on a block only in its rate
    limiter, which returns at once when the device's sm_limit is 0 or >= 100. Scenario: a
    memory-only container (no gpucores) and one with gpucores 50, each alone on its GPU, both
    blocked, first with the monitor's lease, then with none (HAMi's monitor): the memory-only
    one keeps launching, the limited one pauses."""
    free_region, limited_region = tmp_path / "free.cache", tmp_path / "limited.cache"
    free = start(env, tmp_path / "m1", free_region, seconds=3.5, depth=DEPTH)
    limited = start(env, tmp_path / "m2", limited_region, limit=50, seconds=3.5, depth=DEPTH)
    for region in (free_region, limited_region):
        _wait_for_region(region)
    time.sleep(0.5)  # both launching by now (the lease mark is written at the first launch)
    assert read_region(str(free_region)).priority_lease and read_region(str(limited_region)).priority_lease
    for region in (free_region, limited_region):
        write_int32(str(region), "recent_kernel", -1)  # the monitor's block: a lease, then -1
    leased = time.time() * 1000
    time.sleep(0.7)
    for region in (free_region, limited_region):
        _pwrite(region, LEASE_UNTIL_AT, "<Q", 0)  # a block without a lease (HAMi's monitor)
    bare = time.time() * 1000
    time.sleep(0.7)
    for region in (free_region, limited_region):
        write_int32(str(region), "recent_kernel", 0)
    lifted = time.time() * 1000
    tf, tl = free.trace(), limited.trace()
    late = tl.count_at(lifted - 20) - tl.count_at(leased + 60)
    print(
        f"blocked: memory-only {tf.share(leased + 100, bare):.1f}% (leased) {tf.share(bare + 100, lifted):.1f}% "
        f"(lease-less); limited: {late} launches, {tl.share(lifted + 100, tl.end - 50):.1f}% once lifted"
    )
    assert tf.share(leased + 100, bare) > RUNNING  # never paused by a leased block ...
    assert tf.share(bare + 100, lifted) > RUNNING  # ... nor by a lease-less one
    assert late <= 2 * DEPTH  # the limited container paused through both (launches in flight aside)
    assert tl.share(lifted + 100, tl.end - 50) > RUNNING


def test_a_block_from_before_a_reboot_is_lifted_at_attach(vgpu_env, tmp_path):
    """Found by review, 1 Dec: the first process after a reboot reset the region's lock and slots
    but kept recent_kernel = -1 and its lease, whose end is a CLOCK_MONOTONIC time of the last
    boot (the clock restarts): a lease ending within 60 s of the new clock's start held the
    block on, a lease-less -1 held it until a monitor came back. Contrast: a region of this boot
    keeps its block (the live monitor's)."""
    cache = tmp_path / "vgpu.cache"
    run_py("import cuda_probe as c; c.init()", vgpu_env)
    this_boot = tmp_path / "this_boot.cache"
    this_boot.write_bytes(cache.read_bytes())
    for path in (cache, this_boot):
        _pwrite(path, LEASE_MAGIC_AT, "<I", LEASE_MAGIC)
        _pwrite(path, LEASE_UNTIL_AT, "<Q", _mono_ms() + 30_000)  # a lease that still runs
        _pwrite(path, V1.recent_kernel, "<i", -1)
    with open(cache, "r+b") as f:
        f.seek(BOOT_ID_OFFSET)
        f.write(b"00000000-0000-4000-8000-000000000000\0")
    p = run_py("import cuda_probe as c; c.init()", dict(vgpu_env, LIBCUDA_LOG_LEVEL="3"))
    run_py("import cuda_probe as c; c.init()", dict(vgpu_env, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(this_boot)))
    assert read_region(str(cache)).recent_kernel == 0 and _u64(cache, LEASE_UNTIL_AT) == 0
    assert "the monitor's block lifted" in p.stderr
    assert read_region(str(this_boot)).recent_kernel == -1 and _u64(this_boot, LEASE_UNTIL_AT) > 0


def _stamps(region, pids: list[int]) -> dict[int, int]:
    """Each process's share stamp on device 0 (device_util[0].unused[0], CLOCK_MONOTONIC ms)."""
    out = {}
    with open(region, "rb") as f:
        buf = f.read()
    if len(buf) < V1.size:
        return out
    (n,) = struct.unpack_from("<i", buf, V1.proc_num)
    for i in range(max(0, min(n, 1023))):
        (pid,) = struct.unpack_from("<i", buf, V1.procs + i * SLOT_SIZE)
        if pid in pids:
            out[pid] = struct.unpack_from("<Q", buf, V1.procs + i * SLOT_SIZE + V1.slot_util + 24)[0]
    return out


def _slot_pids(region) -> list[int]:
    with open(region, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack_from("<i", buf, V1.proc_num)
    return [struct.unpack_from("<i", buf, V1.procs + i * SLOT_SIZE)[0] for i in range(max(0, min(n, 1023)))]


def test_the_watcher_reaps_only_when_a_share_went_stale(env, tmp_path):
    """Found by review, 1 Dec: every process with a limit reaped the region's slots once a second
    (a pass over every slot under the region lock), whatever they held: N processes made N^2 slot
    checks a second under the lock. Now a reap follows a split that found a stale share of a
    slot marked running. Seen here by holding the region lock: two live siblings keep publishing
    their shares through it (before, each watcher stopped at its next reap, within a second);
    once one is SIGKILLed, the other still reclaims its slot without any allocation."""
    region = tmp_path / "c.cache"
    a = start(env, tmp_path / "m", region, limit=40, policy="force", seconds=9, depth=DEPTH)
    b = start(env, tmp_path / "m", region, limit=40, policy="force", seconds=9, depth=DEPTH)
    pids = [a.proc.pid, b.proc.pid]
    _wait_for_region(region)
    deadline = time.monotonic() + 20  # a hang guard
    while len(s := _stamps(region, pids)) < 2 or not all(s.values()):
        assert time.monotonic() < deadline, "the siblings never published their shares"
        time.sleep(0.05)
    libc = ctypes.CDLL(None, use_errno=True)
    with open(region, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        mutex = ctypes.c_char.from_buffer(mm, LOCK_OFFSET)
        assert libc.pthread_mutex_lock(ctypes.byref(mutex)) == 0
        try:
            held = _stamps(region, pids)
            time.sleep(1.5)
            mid = _stamps(region, pids)
            time.sleep(1.5)
            after = _stamps(region, pids)
        finally:
            libc.pthread_mutex_unlock(ctypes.byref(mutex))
            del mutex
    print(f"share stamps while the region lock was held (0, 1.5, 3 s): {held} {mid} {after}")
    # a watcher stuck on the lock stops within REAP_MS (1 s) of taking it, so its stamp stands
    # still in the second half; a free one goes on publishing in both (the test review, 1 Dec:
    # an order of stamps, not a wall-clock amount)
    for pid in pids:
        assert held[pid] < mid[pid] < after[pid], (pid, held, mid, after)
    os.kill(b.proc.pid, signal.SIGKILL)
    b.proc.wait()
    deadline = time.monotonic() + 20  # a hang guard
    while b.proc.pid in _slot_pids(region):
        assert time.monotonic() < deadline, "the killed sibling's slot was never reclaimed"
        time.sleep(0.05)
    a.trace()
