"""Priority blocking by default for regions whose library takes leases (review, 1 Dec).

Found by review, 1 Dec: ``nvidia.com/priority`` did nothing for pods in the default deployment:
the monitor wrote ``recent_kernel = -1`` only with ``--priority-blocking`` (off by default, since
a -1 held with no expiry and a monitor that died after blocking stalled the container), and
libvgpu paused otherwise only between ``hami exec`` tasks (peer regions). Now our libvgpu marks
its region and honours a -1 only while the monitor's lease runs; the monitor blocks such regions
by default, renews the lease each round, and keeps HAMi-core regions (no mark) opt-in.
"""

from __future__ import annotations

import asyncio
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


# ------------------------------------------------------------------ regression review, 1 Dec (2)


def test_only_a_container_with_a_compute_limit_is_active_or_blocked():
    """Found by review, 1 Dec: any launch made a container active and any low-priority container
    was blocked, so a priority-0 pod without gpucores paused a memory-only priority-1 pod on its
    GPU. In HAMi a block only takes effect, and a container only becomes active, in HAMi-core's
    rate limiter, which returns at once without a compute limit (0 < sm_limit < 100)."""
    hi_free = Reading("hi", ("GPU-a",), 0, 3, 1, limited=False)  # no gpucores
    lo = Reading("lo", ("GPU-a",), 1, 3, 1, lease=True, limited=True)
    mem = Reading("mem", ("GPU-a",), 1, 3, 1, lease=True, limited=False)  # memory only
    out = decide([hi_free, lo, mem], blocking=True)
    assert out["lo"].recent_kernel == 2 and out["mem"].recent_kernel == 2  # the free one is not active
    assert out["lo"].utilization_switch == 0  # the only active container on its GPU: "mem" is not either
    hi = Reading("hi", ("GPU-a",), 0, 3, 1, limited=True)
    out = decide([hi, lo, mem], blocking=True)
    assert out["lo"].recent_kernel == -1  # a limited high-priority container blocks a limited one ...
    assert out["mem"].recent_kernel == 2  # ... never a memory-only one
    # a memory-only container found blocked (by an older monitor) is lifted
    assert decide([hi, Reading("mem", ("GPU-a",), 1, -1, 1, lease=True, limited=False)])["mem"].recent_kernel == 0


def test_feedback_reads_the_compute_limit_from_the_region(tmp_path):
    """The review's scenario end to end: pod A (priority 0, no gpucores: libvgpu writes sm_limit
    100) launches; pod B (priority 1, memory only) and pod C (priority 1, gpucores 30) share its
    GPU, both running our libvgpu. Neither is blocked; with gpucores on A, C is and B is not."""
    cdir = tmp_path / "containers"
    a = kit.write(cdir / "a_main" / "a.cache", uuids=("GPU-a",), sm_limits=(100,), priority=0, recent_kernel=3)
    b = kit.write(cdir / "b_main" / "a.cache", uuids=("GPU-a",), sm_limits=(0,), priority=1, recent_kernel=3)
    c = kit.write(cdir / "c_main" / "a.cache", uuids=("GPU-a",), sm_limits=(30,), priority=1, recent_kernel=3)
    _mark(b)
    _mark(c)
    command.feedback_once(str(cdir), blocking=False)
    assert read_region(b).recent_kernel == 2 and read_region(c).recent_kernel == 2
    _pwrite_u64(a, kit.RegionV1.sm_limit.offset, 50)  # A is given gpucores
    command.feedback_once(str(cdir), blocking=False)
    assert read_region(b).recent_kernel == 1 and _until(b) == 0
    assert read_region(c).recent_kernel == -1 and _until(c) > time.monotonic() * 1000


def _pwrite_u64(path: str, offset: int, value: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, struct.pack("<Q", value), offset)
    finally:
        os.close(fd)


def test_the_lease_follows_the_interval():
    """Found by review, 1 Dec: the lease was a fixed 15 s whatever --interval was: with 20 s
    between rounds a blocked container ran free ~5 s of every 20. It now covers two periods and a
    slack (a round up to one period late keeps its blocks), within libvgpu's 60 s bound."""
    from hami.monitor.region import LEASE_MAX_S, LEASE_SLACK_S, lease_for

    assert lease_for(5) == LEASE_S == 15  # the default is unchanged
    assert lease_for(20) == 45 and lease_for(0.05) == 5.1
    assert lease_for(600) == LEASE_MAX_S < 60
    for interval in (0.05, 1, 5, 20, 30, 50):
        assert lease_for(interval) >= interval + LEASE_SLACK_S  # a renewal up to the slack late is in time


def _check_args(interval: str, *more: str):
    import argparse

    p = argparse.ArgumentParser()
    command.add_arguments(p)
    args = p.parse_args(["--standalone", "--interval", interval, *more])
    command._check(args)
    return args


def test_the_monitor_writes_the_lease_its_interval_needs_and_warns_when_none_can_cover_it(tmp_path, caplog):
    ours = kit.write(tmp_path / "containers" / "lo_main" / "a.cache", uuids=("GPU-a",), priority=1, recent_kernel=3)
    kit.write(tmp_path / "containers" / "hi_main" / "a.cache", uuids=("GPU-a",), priority=0, recent_kernel=3)
    _mark(ours)
    with caplog.at_level("WARNING", logger="hami.monitor"):
        args = _check_args("20s")
    assert args.lease_s == 45 and not caplog.records
    before = time.monotonic() * 1000
    command.feedback_once(str(tmp_path / "containers"), False, None, None, args.lease_s)
    assert before + 45_000 - 1 <= _until(ours) <= time.monotonic() * 1000 + 45_000 + 1
    with caplog.at_level("WARNING", logger="hami.monitor"):
        _check_args("2m")
    assert "--interval 2m: longer than a priority block's lease can cover" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hami.monitor"):
        _check_args("2m", "--no-feedback")  # no blocks, no lease
    assert not caplog.records


UID_HI = "0b6f3b4e-4444-4d7e-9a8e-dddddddddddd"
UID_LO = "0b6f3b4e-5555-4d7e-9a8e-eeeeeeeeeeee"


async def test_blocks_are_renewed_while_the_pod_list_hangs(black_hole, monkeypatch, tmp_path):
    """Found by review, 1 Dec: the feedback ran after the pod list (up to 10 s) and the clean-up
    (up to 30 s) in one round, so renewals came further apart than the lease. Now it runs on its
    own timer: here the API server never answers, and the rounds (with the last pod list) keep
    renewing the low-priority container's lease."""
    import argparse

    from hami.monitor import kube as mkube
    from hami.monitor.exporter import ContainerGrant, PodRef

    from ._apikit import within

    monkeypatch.setattr(mkube, "API_TIMEOUT_S", 3600.0)  # a list waits for the whole of it
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{black_hole}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    cdir = tmp_path / "containers"
    kit.write(cdir / f"{UID_HI}_main" / "a.cache", uuids=("GPU-s",), priority=0, recent_kernel=1000)
    lo = kit.write(cdir / f"{UID_LO}_main" / "a.cache", uuids=("GPU-s",), priority=1, recent_kernel=1000)
    _mark(lo)
    pods = command.PodMap()  # the last list, from before the API server went quiet
    pods.set(
        {
            UID_HI: PodRef("ns", "hi", UID_HI, grants=(ContainerGrant("main", ("GPU-s",), 0),)),
            UID_LO: PodRef("ns", "lo", UID_LO, grants=(ContainerGrant("main", ("GPU-s",), 1),)),
        }
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    leases: list[int] = []
    real = command.feedback_once

    def counting(*a, **k):
        out = real(*a, **k)
        leases.append(_until(lo))
        if len(leases) == 3:
            loop.call_soon_threadsafe(stop.set)
        return out

    monkeypatch.setattr(command, "feedback_once", counting)
    args = argparse.Namespace(
        node_name="n1",
        kubeconfig=str(kubeconfig),
        containers_dir=str(cdir),
        claims_dir=str(tmp_path / "claims"),
        resync_s=300.0,
        interval_s=0.05,
        lease_s=5.0,
        no_feedback=False,
        priority_blocking=False,
    )
    await within(command._refresh(args, pods, stop))
    assert len(leases) >= 3
    assert read_region(lo).recent_kernel == -1
    assert leases[0] > 0 and leases[2] > leases[0]  # each round wrote a later end
