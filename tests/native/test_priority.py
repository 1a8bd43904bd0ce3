"""Task priority (CUDA_TASK_PRIORITY) between two `hami exec` tasks on one fake GPU, with no
node agent: the low-priority task pauses at its next launch while the high-priority one
launches, and resumes after it goes quiet (HAMI_PRIORITY_QUIET_MS, default 200 ms).
Also: HAMi's monitor protocol (recent_kernel = -1 blocks) and the host PID in a PID namespace.
Run with `-s` to see the measured times.

The assertions are orderings and contrasts that hold on a saturated machine too: a paused task
admits (almost) nothing, a running one admits far more (> RUNNING %, where an idle machine gives
~98 and two CPU hogs on two cores ~40). How fast a pause or resume happens is a figure (printed),
not an assertion: it depends on how soon the host schedules the load."""

from __future__ import annotations

import mmap
import shutil
import struct
import subprocess
import time

import pytest

from .cshare import LIB, LOAD, base_env, start
from .region_layout import read_region

pytestmark = pytest.mark.native

RECENT_KERNEL = 2_008_904
PAUSED = 5  # % of the device: a paused or blocked task (idle machine: 0)
RUNNING = 20  # % of the device: a task that is not paused (idle machine: ~98; saturated CPU: ~40)


@pytest.fixture
def env(native_build):
    return base_env(native_build / "fakegpu")


def test_low_priority_yields_and_resumes(env, tmp_path):
    m, peers = tmp_path / "m", tmp_path / "regions"
    peers.mkdir()
    low = start(env, m, peers / "low.cache", priority=1, seconds=3.0, via_exec=True, depth=8)
    time.sleep(0.8)
    # the high-priority task launches for 0.8 s, then stays alive but quiet for 1.5 s
    high = start(env, m, peers / "high.cache", priority=0, seconds=0.8, linger=1.5, via_exec=True, depth=8)
    tl, th = low.trace(), high.trace()
    paused_at = tl.last_before_gap(th.start - 20)
    # the resume ends the pause that spans the high task's last launch, not the first gap after
    # its start: that one can be the low task descheduled on a loaded machine just before it
    # paused (a 400 ms SIGSTOP there had it "resume" 300-500 ms before the high task ended)
    across = tl.gap_across(th.end)
    resumed_at = across[1] if across else None
    assert paused_at is not None and resumed_at is not None, "the low-priority task never paused"
    yield_ms = paused_at - th.start
    resume_ms = resumed_at - th.end
    during = tl.share(th.start + 100, th.end)
    print(
        f"priority: low paused {yield_ms:.0f} ms after the high task's first launch, resumed "
        f"{resume_ms:.0f} ms after its last; low share while high ran {during:.1f}%, "
        f"high share {th.share(th.start + 100, th.end):.1f}%"
    )
    assert paused_at < th.end  # paused while the high task launched ...
    assert resumed_at > th.end  # ... and only resumed once it went quiet
    assert tl.share(paused_at + 1, th.end) < PAUSED
    assert tl.share(resumed_at + 100, tl.end - 50) > RUNNING  # running again (~98 on an idle machine)


def test_priority_is_per_gpu(env, tmp_path):
    """A high-priority task on GPU 1 does not pause a low-priority one on GPU 0; on GPU 0 it does."""
    m, peers = tmp_path / "m", tmp_path / "regions"
    peers.mkdir()
    low = start(env, m, peers / "low.cache", priority=1, seconds=3.0, device=0, via_exec=True, depth=8)
    time.sleep(0.6)
    other = start(env, m, peers / "other.cache", priority=0, seconds=0.7, device=1, via_exec=True, depth=8)
    t_other = other.trace()
    same = start(env, m, peers / "same.cache", priority=0, seconds=0.6, device=0, via_exec=True, depth=8)
    tl, t_same = low.trace(), same.trace()
    print(
        f"priority per GPU: low share while high ran on the other GPU "
        f"{tl.share(t_other.start + 100, t_other.end):.1f}%, on the same GPU "
        f"{tl.share(t_same.start + 150, t_same.end):.1f}%"
    )
    assert tl.share(t_other.start + 100, t_other.end) > RUNNING  # not paused (~98 on an idle machine)
    paused_at = tl.last_before_gap(t_same.start - 20)
    assert paused_at is not None and paused_at < t_same.end  # paused by the task on its own GPU
    assert tl.share(paused_at + 1, t_same.end) < PAUSED


def test_same_priority_does_not_pause(env, tmp_path):
    m, peers = tmp_path / "m", tmp_path / "regions"
    peers.mkdir()
    a = start(env, m, peers / "a.cache", priority=1, seconds=2.0, via_exec=True, depth=8)
    time.sleep(0.5)
    b = start(env, m, peers / "b.cache", priority=1, seconds=1.0, via_exec=True, depth=8)
    ta, tb = a.trace(), b.trace()
    # a pause would last all of b's run (and its quiet time after): a's share would be ~0
    print(f"same priority: a {ta.share(tb.start + 100, tb.end):.1f}%, b {tb.share(tb.start + 100, tb.end):.1f}%")
    assert ta.share(tb.start + 100, tb.end) > RUNNING


def test_monitor_block_recent_kernel(env, tmp_path):
    """HAMi's monitor blocks a container by writing recent_kernel = -1 into its region; the block
    holds for a container with a compute limit (as HAMi-core: test_review_priority_dec1d.py)."""
    region = tmp_path / "c.cache"
    task = start(env, tmp_path / "m", region, limit=50, seconds=2.0, depth=8)
    deadline = time.time() + 10
    while (not region.exists() or region.stat().st_size < RECENT_KERNEL + 4) and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.4)
    with open(region, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        # the window is read after the block is written and before it is lifted: this process
        # descheduled between a write and its stamp (80 ms will do on a loaded machine) would
        # otherwise count launches from outside the block as admitted through it
        mm[RECENT_KERNEL : RECENT_KERNEL + 4] = struct.pack("<i", -1)
        blocked = time.time() * 1000
        time.sleep(0.5)
        released = time.time() * 1000
        mm[RECENT_KERNEL : RECENT_KERNEL + 4] = struct.pack("<i", 0)
    tr = task.trace()
    # launches that had passed the check before the block (at most the 8 in flight) and a late
    # timeline report may still count after `blocked`; nothing new is admitted while blocked
    late = tr.count_at(released - 20) - tr.count_at(blocked + 60)
    print(
        f"monitor block: {late} launches counted in the blocked window, "
        f"{tr.share(released + 100, tr.end - 50):.1f}% after release"
    )
    assert late <= 2 * 8
    assert tr.share(released + 100, tr.end - 50) > RUNNING


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")
def test_host_pid_in_a_pid_namespace(env, tmp_path):
    """Inside a new PID namespace getpid() is small. The namespace method must name the outer
    PID, and the slot holds it: the fake GPU, like a real driver, reports the host PID (here it
    reads it from NSpid, since /proc is the host's), so NVML agrees and no probe is needed."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "--map-root-user", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unprivileged PID namespaces are not available here")
    region = tmp_path / "c.cache"
    e = dict(
        env,
        FAKEGPU_STATE_DIR=str(tmp_path / "m"),
        LD_PRELOAD=str(LIB),
        CUDA_DEVICE_MEMORY_SHARED_CACHE=str(region),
        CUDA_DEVICE_SM_LIMIT="50",
        LIBCUDA_LOG_LEVEL="3",
    )
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--map-root-user", str(LOAD), "plain", "1000", "0.3", "8", "0", "2"],
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 30
        slots, children = [], []
        while time.time() < deadline and proc.poll() is None:
            # unshare's child (the load) as seen from outside, read while it runs
            children = children or _children(proc.pid)
            if region.exists() and region.stat().st_size > RECENT_KERNEL:
                slots = [s for s in read_region(region)["slots"] if s["pid"]]
                if children and slots and slots[0]["hostpid"]:
                    break
            time.sleep(0.05)
        assert slots, "no process slot"
        inner, host = slots[0]["pid"], slots[0]["hostpid"]
    finally:
        _, err = proc.communicate(timeout=20)
    print(f"PID namespace: getpid() = {inner}, unshare's children = {children}, slot hostpid = {host}")
    assert host in children and host != inner
    assert "memory probe" not in err  # NVML listed the namespace method's answer
    assert f"pid={host}]" not in err  # log lines carry getpid(), never the outer PID


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def test_bad_setting_is_refused_with_its_name(env, tmp_path):
    task = start(
        env, tmp_path / "m", tmp_path / "c.cache", limit=30, seconds=0.2, extra={"HAMI_PRIORITY_QUIET_MS": "fast"}
    )
    _, err = task.proc.communicate(timeout=30)
    assert task.proc.returncode == 78
    assert "invalid HAMI_PRIORITY_QUIET_MS='fast'" in err
