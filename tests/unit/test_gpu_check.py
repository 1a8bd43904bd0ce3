"""`make gpu-check` without a GPU: the SKIP path (script and driver) and the verdicts its table
is made of (tests/gpu/gpu_check.py). The GPU path itself runs against the fake GPU in
tests/native/test_gpu_check_fake.py."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
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
    the check then FAILs after --timeout, the process killed, instead of waiting 15 minutes."""
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    args = argparse.Namespace(
        torch_python=str(hang), timeout=1.0, limit_mib=3000, seconds=1.0, overhead_n=10, nvidia_smi="nvidia-smi"
    )
    c = gc.Checker(args, tmp_path)
    t0 = time.monotonic()
    p = subprocess.Popen([str(hang)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match=r"^share worker hung: no exit within 1 s$"):
        c._rate(p)
    assert p.returncode is not None  # killed, not left running
    with pytest.raises(RuntimeError, match=r"^loop probe \(without libvgpu\) hung: no exit within 1 s$"):
        c.torch_loop()
    assert time.monotonic() - t0 < 30
