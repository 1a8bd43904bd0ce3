"""`hami exec` end to end on the fake GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import BUILD, ROOT

pytestmark = pytest.mark.native


def hami_exec(env, *argv, timeout=60):
    env = dict(env, PYTHONPATH=f"{ROOT / 'src'}:{env['PYTHONPATH']}")
    return subprocess.run(
        [sys.executable, "-m", "hami", "exec", *argv], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_exec_limits_the_command(fake_env, tmp_path):
    probe = (
        "import cuda_probe as c, pynvml as n; c.init(); f, t = c.mem_info(); "
        "rcs = [c.alloc(100 << 20)[0] for _ in range(6)]; n.nvmlInit(); "
        "m = n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0)); print(t >> 20, rcs, m.total >> 20, m.used >> 20)"
    )
    p = hami_exec(
        fake_env,
        "--gpumem",
        "512m",
        "--lib",
        str(BUILD / "libvgpu.so"),
        "--cache",
        str(tmp_path / "x.cache"),
        "--",
        sys.executable,
        "-c",
        probe,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "512 [0, 0, 0, 0, 0, 2] 512 500"


def test_exec_devices_and_dry_run(fake_env, tmp_path):
    p = hami_exec(
        fake_env,
        "--gpumem",
        "2Gi",
        "--gpucores",
        "30",
        "--devices",
        "1",
        "--dry-run",
        "--lib",
        str(BUILD / "libvgpu.so"),
        "--cache",
        str(tmp_path / "y.cache"),
        "--",
        "nvidia-smi",
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "CUDA_DEVICE_MEMORY_LIMIT=2147483648" in lines
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=2147483648" in lines
    assert "CUDA_DEVICE_SM_LIMIT=30" in lines
    assert "CUDA_VISIBLE_DEVICES=1" in lines
    assert lines[-1] == "exec nvidia-smi"


def test_exec_unknown_command(fake_env):
    p = hami_exec(fake_env, "--gpumem", "1g", "--lib", str(BUILD / "libvgpu.so"), "--", "no-such-cmd-xyz")
    assert p.returncode == 127
    assert "CMD: command not found: 'no-such-cmd-xyz'" in p.stderr
