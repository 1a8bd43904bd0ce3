"""Shared fixtures for the native tests: build native/ once, give each test its own fake
machine (FAKEGPU_STATE_DIR) and a helper to run probe programs in a fresh process; the paths of
the build (``BUILD``, ``FAKE``, ``FAKE_NVML``) and a skip for tests that need the fake NVML built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "native" / "build"
FAKE = BUILD / "fakegpu"
#: the fake driver's NVML, which the node programs under test load (``--nvml-library``)
FAKE_NVML = FAKE / "libnvidia-ml.so.1"


@pytest.fixture(scope="session")
def native_build() -> Path:
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    return BUILD


@pytest.fixture
def need_fake_nvml() -> Path:
    """Skips the test when the fake NVML is not built (for tests that do not build native/
    themselves: ``pytestmark = pytest.mark.usefixtures("need_fake_nvml")``)."""
    if not FAKE_NVML.exists():
        pytest.skip(f"{FAKE_NVML} is not built (run `make -C native`)")
    return FAKE_NVML


@pytest.fixture
def fake_env(native_build, tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKEGPU_", "CUDA_", "LIBCUDA_", "LD_PRELOAD"))}
    env["LD_LIBRARY_PATH"] = str(FAKE)
    env["FAKEGPU_STATE_DIR"] = str(tmp_path / "machine")
    env["PYTHONPATH"] = str(Path(__file__).parent)
    return env


@pytest.fixture
def vgpu_env(fake_env, tmp_path) -> dict[str, str]:
    """``fake_env`` with libvgpu preloaded: a 1 GiB limit per device, a region of the test's own."""
    fake_env["LD_PRELOAD"] = str(BUILD / "libvgpu.so")
    fake_env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(tmp_path / "vgpu.cache")
    fake_env["CUDA_DEVICE_MEMORY_LIMIT"] = "1g"
    fake_env["LIBCUDA_LOG_LEVEL"] = "0"
    return fake_env


def run_py(code: str, env: dict[str, str], timeout: float = 60, check: bool = True):
    """Run `code` in a fresh interpreter; returns CompletedProcess (text)."""
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"probe failed rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc
