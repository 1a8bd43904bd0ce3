"""`make gpu-check` without a GPU: the SKIP path (script and driver) and the verdicts its table
is made of (tests/gpu/gpu_check.py). The GPU path itself runs against the fake GPU in
tests/native/test_gpu_check_fake.py."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "tests" / "gpu" / "gpu_check.py")
gc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gc  # dataclasses look their module up there
_spec.loader.exec_module(gc)


@pytest.mark.parametrize(
    "smi,reason",
    [
        ("/nonexistent/nvidia-smi", "SKIP: no NVIDIA driver (/nonexistent/nvidia-smi not found)"),
        ("false", "SKIP: false lists no GPU"),
    ],
)
def test_script_skips_without_a_gpu_before_building_anything(tmp_path, smi, reason):
    venv = tmp_path / "torch-venv"
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NVIDIA_SMI": smi, "GPU_CHECK_VENV": str(venv)},
    )
    assert (p.returncode, p.stdout.strip()) == (0, reason), p.stderr
    assert not venv.exists()  # nothing installed


def test_driver_skips_without_a_gpu(capsys):
    assert gc.main(["--nvidia-smi", "/nonexistent/nvidia-smi"]) == 0
    assert capsys.readouterr().out == "SKIP: no NVIDIA driver (/nonexistent/nvidia-smi not found)\n"


def test_driver_rejects_an_unknown_check():
    with pytest.raises(SystemExit) as e:
        gc.main(["--only", "alloc,bogus"])
    assert e.value.code == 2


LIMIT = 3000 * MiB


@pytest.mark.parametrize(
    "res,ok",
    [
        ({"total": LIMIT, "reached": 2560 * MiB, "err": "OutOfMemoryError", "after": True}, True),
        ({"total": LIMIT, "reached": 3072 * MiB, "err": "OutOfMemoryError", "after": True}, False),  # past the limit
        ({"total": LIMIT, "reached": 1024 * MiB, "err": "OutOfMemoryError", "after": True}, False),  # stopped far short
        ({"total": LIMIT, "reached": 2560 * MiB, "err": "RuntimeError: CUDA error", "after": True}, False),  # not clean
        ({"total": LIMIT, "reached": 2560 * MiB, "err": "OutOfMemoryError", "after": False}, False),  # unusable after
        (
            {"total": 80 << 30, "reached": 2560 * MiB, "err": "OutOfMemoryError", "after": True},
            False,
        ),  # total not virtualized
        ({"err": "probe exit 1: ModuleNotFoundError"}, False),
    ],
)
def test_alloc_verdict(res, ok):
    row = gc.alloc_row("default allocator", LIMIT, res)
    assert row.ok is ok and row.claim == "PyTorch alloc to limit (default allocator)"


def test_smi_share_overhead_discovery_verdicts():
    assert gc.smi_row(LIMIT, "3000, 412\n3000, 0\n").ok
    assert not gc.smi_row(LIMIT, "81559, 412\n").ok
    assert gc.smi_row(LIMIT, "garbage").measured == "unparsed: 'garbage'"
    assert gc.share_row("s", 30, 38.5).ok and not gc.share_row("s", 30, 41.0).ok
    assert gc.overhead_row("x", 2000, 2040, 50, 1.05).ok  # +40 ns
    assert gc.overhead_row("x", 2000, 2090, 50, 1.05).ok  # x1.045
    assert not gc.overhead_row("x", 2000, 2200, 50, 1.05).ok
    # wall inflated by descheduling, CPU time within bounds: passes, both shown
    row = gc.overhead_row("x", 10000, 25000, 500, 1.10, (9000, 9100))
    assert row.ok and "CPU 9000 -> 9100 ns (+100 ns)" in row.measured
    assert not gc.overhead_row("x", 10000, 25000, 500, 1.10, (9000, 12000)).ok
    smi = [{"uuid": "GPU-a", "memoryMiB": 81559}]
    assert gc.discovery_row(smi, {"gpus": [{"uuid": "GPU-a", "memoryMiB": 81559}]}).ok
    assert not gc.discovery_row(smi, {"gpus": []}).ok
    assert not gc.discovery_row(smi, {"gpus": [{"uuid": "GPU-a", "memoryMiB": 40960}]}).ok


def test_render_is_one_aligned_table():
    rows = [gc.Row("a", "1", "2", True), gc.Row("longer claim", "measured", "t", False)]
    lines = gc.render(rows).splitlines()
    assert lines[0].split() == ["claim", "measured", "target", "result"]
    assert lines[1].endswith("PASS") and lines[2].endswith("FAIL")
    assert len({ln.index(ln.split()[-1]) for ln in lines[1:]}) == 1  # result column aligned


def test_last_line_keeps_error_cells_on_one_line():
    assert gc.last_line("Traceback\n  File x\nModuleNotFoundError: torch\n\n") == "ModuleNotFoundError: torch"
    assert len(gc.last_line("x" * 500)) == 100


def test_a_hung_probe_is_killed_and_fails_its_check(tmp_path):
    """On a real GPU a probe can hang (H200, 26 Nov 2026: every CUDA process under libvgpu);
    the check then FAILs after --timeout, the process killed, instead of waiting 15 minutes.
    Found by review, 1 Dec: a wall-clock bound here caught nothing; each probe started must be
    killed by a signal and reaped instead."""
    started = tmp_path / "pids"
    hang = tmp_path / "hang"
    hang.write_text(f"#!/bin/sh\necho $$ >> {started}\nexec sleep 600\n")
    hang.chmod(0o755)
    args = argparse.Namespace(
        torch_python=str(hang), timeout=1.0, limit_mib=3000, seconds=1.0, overhead_n=10, nvidia_smi="nvidia-smi"
    )
    c = gc.Checker(args, tmp_path)
    p = subprocess.Popen([str(hang)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match=r"^share worker hung: no exit within 1 s$"):
        c._rate(p)
    assert p.returncode == -signal.SIGKILL  # killed, not left running nor waited out
    with pytest.raises(RuntimeError, match=r"^loop probe \(without libvgpu\) hung: no exit within 1 s$"):
        c.torch_loop()
    pids = [int(line) for line in started.read_text().split()]
    assert len(pids) == 2 and pids[0] == p.pid, pids  # the share worker, then the one loop probe
    for pid in pids:  # each killed and reaped: no such process left, not even a zombie
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


GRAPH_OK = {
    "free0": 2500,
    "part": 1500,
    "half": 1250,
    "over": 1800,
    "over_rc": 2,
    "seq": [True, 0, 0],
    "inst_rc": 0,
    "launch_beside": 2,
    "launch": 0,
    "free_after_launch": 1248,
    "alloc_after_launch": 2,
    "free_after_trim": 2500,
    "alloc_after_trim": 0,
}


@pytest.mark.parametrize(
    "change,failing",
    [
        ({}, []),
        ({"over_rc": 0}, ["graph: live alloc nodes over the limit"]),  # instantiated past the limit
        ({"seq": [False, 2, -1]}, ["graph: alloc, free, alloc again"]),  # the sum refused, not the peak
        ({"launch_beside": 0}, ["graph: memory charged at first launch"]),  # ran beside a full limit
        ({"free_after_launch": 2500}, ["graph: memory charged at first launch"]),  # nothing charged
        ({"alloc_after_launch": 0}, ["graph: memory charged at first launch"]),
        ({"free_after_trim": 1250}, ["graph: cuDeviceGraphMemTrim gives it back"]),  # charge kept
        ({"alloc_after_trim": 2}, ["graph: cuDeviceGraphMemTrim gives it back"]),
    ],
)
def test_graph_verdicts(change, failing):
    rows = gc.graph_rows(dict(GRAPH_OK, **change))
    assert len(rows) == 4
    assert [r.claim for r in rows if not r.ok] == failing


def test_graph_probe_failure_is_one_failing_row():
    (row,) = gc.graph_rows({"err": "cuInit -> CUresult 100"})
    assert not row.ok and "cuInit -> CUresult 100" in row.measured


@pytest.mark.parametrize(
    "fits,over,ok",
    [
        (
            {"mib": 875, "replays": 5, "right": True, "after": True},
            {"mib": 1500, "phase": "capture", "err": "OutOfMemoryError: CUDA out of memory.", "after": True},
            [True, True],
        ),
        (  # ran past the limit: no error at all
            {"mib": 875, "replays": 5, "right": True, "after": True},
            {"mib": 1500, "phase": "replay", "replays": 5, "right": True, "after": True},
            [True, False],
        ),
        (  # refused, but not as out of memory; and the graph that fits gave a wrong sum
            {"mib": 875, "replays": 5, "right": False, "after": True},
            {"mib": 1500, "phase": "capture", "err": "RuntimeError: operation not permitted", "after": True},
            [False, False],
        ),
        (  # out of memory in the small warm-up: the graph was never tried
            {"mib": 875, "replays": 5, "right": True, "after": True},
            {"mib": 1500, "phase": "warm-up", "err": "OutOfMemoryError: CUDA out of memory.", "after": True},
            [True, False],
        ),
        (  # out of memory, but the process is broken after it
            {"mib": 875, "phase": "capture", "err": "RuntimeError: CUDA error: out of memory", "after": True},
            {"mib": 1500, "phase": "capture", "err": "OutOfMemoryError: CUDA out of memory.", "after": False},
            [False, False],
        ),
    ],
)
def test_torch_graph_verdicts(fits, over, ok):
    rows = gc.torch_graph_rows("backend:cudaMallocAsync", {"fits": fits, "over": over})
    assert [r.ok for r in rows] == ok
    assert rows[0].claim == "PyTorch CUDA graph under the limit (backend:cudaMallocAsync)"
    (row,) = gc.torch_graph_rows("default allocator", {"probe": "exit 1: ModuleNotFoundError: torch"})
    assert not row.ok and "ModuleNotFoundError" in row.measured


@pytest.mark.parametrize(
    "first,second,ok",
    [
        ({"reached": 1216, "rc": 0}, {"free0": 1266, "reached": 1216, "rc": 2}, True),  # contexts charged too
        ({"reached": 1216, "rc": 0}, {"free0": 3000, "reached": 2944, "rc": 2}, False),  # the first's memory unseen
        ({"reached": 1216, "rc": 0}, {"free0": 1784, "reached": 1728, "rc": 0}, False),  # never refused
        ({"reached": 1216, "rc": 0}, {"free0": 1784, "reached": 64, "rc": 2}, False),  # refused far short
        ({"reached": 640, "rc": 2}, {"free0": 2360, "reached": 2304, "rc": 2}, False),  # the first refused early
    ],
)
def test_shared_verdict(first, second, ok):
    row = gc.shared_row(3000, first, second)
    assert row.ok is ok and row.claim == "two processes, one limit"


def test_priority_verdict():
    assert gc.priority_row(92.0, 3.5).ok
    assert not gc.priority_row(52.0, 48.0).ok  # shared evenly: priority not applied
    assert not gc.priority_row(60.0, 2.0).ok  # the high task slowed too
    assert gc.priority_row(92.0, 3.5).claim == "priority: high and low together"
