"""The GPU path of `make gpu-check` (tests/gpu/gpu_check.py) against the fake GPU, with an
nvidia-smi stand-in over NVML: discovery, nvidia-smi inside `hami exec`, two processes under one limit, the driver-API rows of
the CUDA graph check, and the libvgpu overhead rows from bench_driver. (PyTorch is not installed
here; its rows need a real GPU.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import BUILD, FAKE

pytestmark = pytest.mark.native
ROOT = Path(__file__).resolve().parents[2]


def fake_gpu(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """An nvidia-smi stand-in over the fake NVML, and an environment on the fake GPU (no library
    preloaded, no limits inherited)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(__file__).parent / "fake_nvidia_smi.py"} "$@"\n')
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKEGPU_", "CUDA_", "LD_PRELOAD"))}
    env.update(
        LD_LIBRARY_PATH=str(FAKE),
        FAKEGPU_STATE_DIR=str(tmp_path / "machine"),
        HAMI_NVML_LIBRARY=str(FAKE / "libnvidia-ml.so.1"),
    )
    return smi, env


def test_gpu_path_against_the_fake_gpu(native_build, tmp_path):
    smi, env = fake_gpu(tmp_path)
    env["PYTHONPATH"] = str(ROOT / "src")
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "gpu" / "gpu_check.py"),
            "--nvidia-smi",
            str(smi),
            "--torch-python",
            "-",
            "--only",
            "discovery,smi,shared,graphs,overhead",
            "--overhead-n",
            "300",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = p.stdout.splitlines()
    assert lines[0].startswith("hami gpu-check on NVIDIA H100 80GB HBM3"), p.stdout + p.stderr
    rows = {re.split(r"\s{2,}", ln)[0]: ln for ln in lines[2:-1]}
    assert rows["device plugin discovery (real NVML)"].endswith("PASS")
    assert "memory.total 3000 MiB" in rows["nvidia-smi in limited process"]
    assert rows["nvidia-smi in limited process"].endswith("PASS")
    assert rows["two processes, one limit"].endswith("PASS"), p.stdout
    graph_rows = [ln for claim, ln in rows.items() if claim.startswith("graph: ")]
    assert len(graph_rows) == 4 and all(ln.endswith("PASS") for ln in graph_rows), p.stdout
    for op in (
        "cuLaunchKernel (empty kernel)",
        "cuMemAlloc+cuMemFree 1 MiB",
        "cuMemGetInfo_v2",
        "nvmlDeviceGetMemoryInfo",
    ):
        assert " ns (x" in rows[f"overhead: {op}"]  # timed; PASS/FAIL is the machine's, not asserted
    assert (BUILD / "bench" / "bench_driver").is_file()


def test_the_offline_runner_against_the_fake_gpu(native_build, tmp_path):
    """scripts/gpu-check-offline.sh, as on a GPU machine without a package index: each check alone
    under its time limit, every table in OUT/log, each probe's whole output in OUT/raw.tgz. (No
    PyTorch here: its rows fail, the driver-API rows must pass.)"""
    smi, env = fake_gpu(tmp_path)
    env.update(
        NVIDIA_SMI=str(smi),
        GPU_CHECK_PYTHON=sys.executable,
        GPU_CHECK_CHECKS="shared:120 graphs:120",
        GPU_CHECK_WHEELS=str(tmp_path / "no-wheels"),  # this Python has hami's dependencies
    )
    out = tmp_path / "out"
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check-offline.sh"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = (out / "log").read_text()
    assert p.returncode == 1, p.stdout + p.stderr  # the PyTorch rows of graphs fail without PyTorch
    assert "== shared exit 0" in log and "== graphs exit 1" in log, log
    assert re.search(r"two processes, one limit .* PASS", log), log
    assert len(re.findall(r"^graph: .* PASS$", log, re.M)) == 4, log
    listing = subprocess.run(["tar", "tzf", str(out / "raw.tgz")], capture_output=True, text=True, check=True).stdout
    assert len([n for n in listing.split() if n.endswith(".log")]) == 5  # 2 shared + 1 driver API + 2 PyTorch


def test_the_offline_runner_skips_without_a_gpu(tmp_path):
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check-offline.sh"), str(tmp_path / "out")],
        env={"PATH": "/usr/bin:/bin", "NVIDIA_SMI": "/nonexistent/nvidia-smi"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (p.returncode, p.stdout.strip()) == (0, "SKIP: no NVIDIA driver (/nonexistent/nvidia-smi not found)")
    assert not (tmp_path / "out").exists()
