"""The node monitor and a libvgpu process killed on the fake GPU (review of 1 Dec): libvgpu
clears its slot only in its exit handler, so a SIGKILLed process leaves status 1 and its whole
charge in the region, which the monitor summed until the container went away."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hami.monitor.region import read_region

pytestmark = pytest.mark.native

MiB = 1 << 20
HOLD = """
import sys, cuda_probe as c
c.init(); rc, _ = c.alloc({mib} << 20)
print(rc, flush=True); sys.stdin.read()
"""


def _holder(env: dict[str, str], mib: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(mib=mib)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "0"
    return proc


def test_the_monitor_stops_counting_a_sigkilled_process(vgpu_env):
    """Found by review, 1 Dec: two processes hold 300 and 200 MiB; the first is SIGKILLed. Its
    slot keeps status 1 and 300 MiB (nothing else in the region changes until the next process
    allocates), but its lock byte is free: the monitor counts 200 MiB, not 500."""
    cache = vgpu_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    killed, kept = _holder(vgpu_env, 300), _holder(vgpu_env, 200)
    try:
        both = read_region(cache)
        killed.kill()
        killed.wait()
        after = read_region(cache)
    finally:
        for p in (killed, kept):
            p.kill()
            p.wait()
    assert sorted(p.pid for p in both.procs) == sorted([killed.pid, kept.pid])
    assert both.used(0).total == 500 * MiB
    assert [p.pid for p in after.procs] == [kept.pid]  # was both: the dead process's 300 MiB counted
    assert after.used(0).total == 200 * MiB
