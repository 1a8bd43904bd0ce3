"""`hami-dev cluster up|env|down` starts a usable control plane and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hami_devkit.cluster import MissingBinaries, bin_dir, find_binaries

pytestmark = pytest.mark.integration


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_up_env_down(tmp_path):
    try:
        binaries = find_binaries()
    except MissingBinaries as exc:
        pytest.skip(str(exc))
    env = {**os.environ, "HAMI_CACHE": str(tmp_path), "HAMI_KUBE_BIN": str(bin_dir())}
    hami_dev = [sys.executable, "-m", "hami_devkit", "cluster"]
    up = subprocess.run(
        [*hami_dev, "up", "--nodes", "1", "--gpus", "2"], env=env, capture_output=True, text=True, timeout=240
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "KUBECONFIG=" in up.stdout
        exports = subprocess.run(
            [*hami_dev, "env"], env=env, capture_output=True, text=True, timeout=30, check=True
        ).stdout
        assert "export KUBECONFIG=" in exports and "export PATH=" in exports
        shell = f"{exports}\nkubectl get node kwok-node-0 -o jsonpath='{{.status.allocatable.nvidia\\.com/gpu}}'"
        gpus = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
        assert gpus.stdout == "20", gpus.stderr
        assert _processes_mentioning(str(tmp_path)), "the components should run with their workdir under HAMI_CACHE"
        assert str(binaries["kube-apiserver"].parent) in exports
    finally:
        down = subprocess.run([*hami_dev, "down"], env=env, capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stdout + down.stderr
    assert _processes_mentioning(str(tmp_path)) == []
    status = subprocess.run([*hami_dev, "status"], env=env, capture_output=True, text=True, timeout=30)
    assert status.returncode == 3 and "not running" in status.stdout
