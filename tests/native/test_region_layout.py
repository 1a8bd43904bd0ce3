"""The region file libvgpu writes is byte-compatible with the documented v1 layout."""

from __future__ import annotations

import os
import struct
import time

import pytest

from .conftest import BUILD, run_py
from .region_layout import HEADER, MAGIC, REGION_SIZE, SLOT, SLOT_SIZE, read_region

pytestmark = pytest.mark.native
MiB = 1 << 20


def test_offsets_table_is_self_consistent():
    """Each field ends where the next begins (no gap, no overlap) and the totals match."""
    for table, total in ((HEADER, REGION_SIZE), (SLOT, SLOT_SIZE)):
        for (name, off, fmt), (nxt, noff, _) in zip(table, table[1:]):
            end = off + struct.calcsize("<" + fmt)
            assert end == noff or (end + 4 == noff and name in ("status",)), (name, end, nxt, noff)
        name, off, fmt = table[-1]
        assert off + struct.calcsize("<" + fmt) == total


def test_region_file_matches_layout(fake_env, tmp_path):
    cache = tmp_path / "c.cache"
    fake_env.update(
        LD_PRELOAD=str(BUILD / "libvgpu.so"),
        CUDA_DEVICE_MEMORY_SHARED_CACHE=str(cache),
        CUDA_DEVICE_MEMORY_LIMIT_0="1g",
        CUDA_DEVICE_MEMORY_LIMIT_1="2048m",
        CUDA_DEVICE_SM_LIMIT="40",
        CUDA_TASK_PRIORITY="0",
        FAKEGPU_CONTEXT_MEM="64m",
        FAKEGPU_HOSTPID_OFFSET="100000",
        LIBCUDA_LOG_LEVEL="0",
    )
    out = run_py(
        """
import os, sys, cuda_probe as c
c.init(); rc, p = c.alloc(10 << 20); assert rc == 0
c.launch(c.function(b"k_1us"))
print(os.getpid(), flush=True)
sys.stdin = open(os.environ["HOLD"]) if "HOLD" in os.environ else sys.stdin
import time; time.sleep(float(os.environ.get("HOLD_S", "0")))
""",
        dict(fake_env, HOLD_S="0"),
    ).stdout
    pid = int(out)
    assert os.path.getsize(cache) == REGION_SIZE + 1
    r = read_region(cache)
    assert r["initialized_flag"] == MAGIC
    assert (r["major_version"], r["minor_version"]) == (1, 2)
    assert r["device_num"] == 2
    assert r["uuids"][:2] == ["GPU-f00dfeed-0000-4000-8000-000000000000", "GPU-f00dfeed-0000-4000-8000-000000000001"]
    assert r["limit"][:3] == [1 << 30, 2 << 30, 0]
    assert r["sm_limit"][:2] == [40, 40] and r["priority"] == 0
    assert r["utilization_switch"] == 1 and r["owner_pid"] == 0
    assert abs(r["last_kernel_time"] - time.time()) < 10
    # the process has exited: its slot says so (status 0) and is left for the next process to
    # reclaim once the process is gone (its memory was the driver's to release, after exit)
    assert [(s["pid"], s["status"]) for s in r["slots"] if s["pid"]] == [(pid, 0)]
    assert pid > 0


def test_live_slot_fields(fake_env, tmp_path):
    import subprocess
    import sys

    cache = tmp_path / "c.cache"
    env = dict(
        fake_env,
        LD_PRELOAD=str(BUILD / "libvgpu.so"),
        CUDA_DEVICE_MEMORY_SHARED_CACHE=str(cache),
        CUDA_DEVICE_MEMORY_LIMIT="1g",
        FAKEGPU_CONTEXT_MEM="64m",
        FAKEGPU_HOSTPID_OFFSET="100000",
        LIBCUDA_LOG_LEVEL="0",
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            """
import sys, cuda_probe as c
c.init(); assert c.alloc(10 << 20)[0] == 0
print("ready", flush=True); sys.stdin.read()
""",
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        r = read_region(cache)
        slot = next(s for s in r["slots"] if s["pid"] == proc.pid)
        assert slot["status"] == 1
        assert slot["hostpid"] == proc.pid + 100000  # learnt from NVML
        assert slot["used"][0]["context_size"] == 64 * MiB  # measured through NVML
        assert slot["used"][0]["data_size"] == 10 * MiB
        assert slot["used"][0]["total"] == 74 * MiB
        assert slot["seqlock"] % 2 == 0
    finally:
        proc.kill()
        proc.wait()
