"""Priority blocking by default for regions whose library takes leases (review, 1 Dec).

Found by review, 1 Dec: ``nvidia.com/priority`` did nothing for pods in the default deployment:
the monitor wrote ``recent_kernel = -1`` only with ``--priority-blocking`` (off by default, since
a -1 held with no expiry and a monitor that died after blocking stalled the container), and
libvgpu paused otherwise only between ``hami exec`` tasks (peer regions). Now our libvgpu marks
its region and honours a -1 only while the monitor's lease runs; the monitor blocks such regions
by default, renews the lease each round, and keeps HAMi-core regions (no mark) opt-in.
"""

from __future__ import annotations

import os
import struct
import time


from hami.monitor import command
from hami.monitor.feedback import Reading, Writes, decide, release
from hami.monitor.region import (
    LEASE_MAGIC,
    LEASE_MAGIC_AT,
    LEASE_S,
    LEASE_UNTIL_AT,
    LOCK_MAGIC,
    LOCK_MAGIC_AT,
    read_region,
    write_int32,
)

from . import _regionkit as kit


def R(key, priority=1, recent=3, switch=1, lease=False, uuids=("GPU-a",)):
    return Reading(key, tuple(uuids), priority, recent, switch, lease=lease)


def test_a_leasing_region_is_blocked_by_default_a_hami_core_one_only_when_asked():
    """Scenario: a priority-0 and two priority-1 containers active on one GPU; "ours" runs our
    libvgpu (leases), "core" HAMi-core. Without --priority-blocking only ours is blocked."""
    readings = [R("hi", priority=0), R("ours", lease=True), R("core")]
    out = decide(readings)
    assert out["ours"].recent_kernel == -1
    assert out["core"].recent_kernel == 2  # decremented, not blocked: no expiry for it
    assert decide(readings, blocking=True)["core"].recent_kernel == -1  # opt-in, as before


def test_a_blocked_leasing_region_gets_its_minus_one_every_round():
    """The -1 of a region still blocked is written again: that write renews its lease (before, an
    unchanged -1 was not written, and a lease would have run out under a live monitor)."""
    out = decide([R("hi", priority=0), R("ours", recent=-1, switch=1, lease=True)])
    assert out["ours"] == Writes(recent_kernel=-1)
    # once the high-priority container is idle it is lifted as before
    out = decide([R("hi", priority=0, recent=1), R("ours", recent=-1, switch=1, lease=True)])
    assert out["ours"] == Writes(recent_kernel=0, utilization_switch=0)
    assert release([R("ours", recent=-1, lease=True)]) == {"ours": Writes(recent_kernel=0)}


def _mark(path: str, lock: int = LOCK_MAGIC, lease: int = LEASE_MAGIC) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, struct.pack("<I", lock), LOCK_MAGIC_AT)
        os.pwrite(fd, struct.pack("<I", lease), LEASE_MAGIC_AT)
    finally:
        os.close(fd)


def _until(path: str) -> int:
    with open(path, "rb") as f:
        f.seek(LEASE_UNTIL_AT)
        return int(struct.unpack("<Q", f.read(8))[0])


def test_the_region_tells_a_leasing_library_and_a_block_carries_its_lease(tmp_path):
    ours = kit.write(tmp_path / "ours.cache", recent_kernel=2)
    _mark(ours)
    core = kit.write(tmp_path / "core.cache", recent_kernel=2)
    lock_only = kit.write(tmp_path / "old.cache", recent_kernel=2)  # an older libvgpu: lock, no lease mark
    _mark(lock_only, lease=0)
    assert [read_region(p).priority_lease for p in (ours, core, lock_only)] == [True, False, False]

    before = time.monotonic() * 1000
    write_int32(ours, "recent_kernel", -1)
    after = time.monotonic() * 1000
    assert read_region(ours).recent_kernel == -1
    assert before + LEASE_S * 1000 - 1 <= _until(ours) <= after + LEASE_S * 1000 + 1
    write_int32(core, "recent_kernel", -1)
    write_int32(lock_only, "recent_kernel", -1)
    assert _until(core) == 0 and _until(lock_only) == 0  # no lease where nobody reads one
    write_int32(ours, "recent_kernel", 0)
    assert _until(ours) == 0  # lifted: no lease left (a later lease-less -1, HAMi's monitor's, holds)


def test_feedback_blocks_a_leasing_region_by_default(tmp_path):
    """End to end, the monitor's defaults (blocking False): the low-priority container running
    our libvgpu is blocked with a lease; the HAMi-core one beside it is not."""
    cdir = tmp_path / "containers"
    kit.write(cdir / "hi_main" / "a.cache", uuids=("GPU-a",), priority=0, recent_kernel=3)
    ours = kit.write(cdir / "lo_main" / "a.cache", uuids=("GPU-a",), priority=1, recent_kernel=3)
    _mark(ours)
    core = kit.write(cdir / "core_main" / "a.cache", uuids=("GPU-a",), priority=1, recent_kernel=3)
    command.feedback_once(str(cdir), blocking=False)
    assert read_region(ours).recent_kernel == -1 and _until(ours) > time.monotonic() * 1000
    assert read_region(core).recent_kernel == 2
