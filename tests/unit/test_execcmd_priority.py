"""`hami exec --priority/--core-policy` and the peer-region directory (no process is started)."""

from __future__ import annotations

import argparse
import os

import pytest

from hami import execcmd


def plan(tmp_path, *extra: str, environ: dict[str, str] | None = None):
    lib = tmp_path / "libvgpu.so"
    lib.write_bytes(b"")
    p = argparse.ArgumentParser()
    execcmd.add_arguments(p)
    a = p.parse_args(["--gpumem", "1G", "--lib", str(lib), *extra, "--", "true"])
    return execcmd.build_plan(a, dict(environ or {}))


def test_priority_and_policy_reach_the_library(tmp_path):
    env = plan(tmp_path, "--priority", "0", "--core-policy", "force", "--cache", str(tmp_path / "a.cache")).env
    assert env["CUDA_TASK_PRIORITY"] == "0"
    assert env["GPU_CORE_UTILIZATION_POLICY"] == "force"
    assert env["HAMI_PEER_REGIONS"] == str(tmp_path)  # regions beside each other are peers


def test_defaults_leave_priority_and_policy_to_the_library(tmp_path):
    env = plan(tmp_path, "--cache", str(tmp_path / "a.cache")).env
    assert "CUDA_TASK_PRIORITY" not in env and "GPU_CORE_UTILIZATION_POLICY" not in env


def test_default_region_lives_in_the_per_user_exec_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(execcmd.tempfile, "tempdir", str(tmp_path))
    env = plan(tmp_path).env
    mine = tmp_path / f"hami-exec-{os.getuid()}"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith(str(mine) + "/")
    assert env["HAMI_PEER_REGIONS"] == str(mine)


def test_shared_region_lives_in_the_shared_exec_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(execcmd.tempfile, "tempdir", str(tmp_path))
    env = plan(tmp_path, "--shared").env
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith(str(tmp_path / "hami-exec") + "/")
    assert env["HAMI_PEER_REGIONS"] == str(tmp_path / "hami-exec")


def test_explicit_peer_dir_is_kept(tmp_path):
    env = plan(tmp_path, "--cache", str(tmp_path / "a.cache"), environ={"HAMI_PEER_REGIONS": "/srv/regions"}).env
    assert env["HAMI_PEER_REGIONS"] == "/srv/regions"


@pytest.mark.parametrize("argv", [["--priority", "2"], ["--core-policy", "always"]])
def test_bad_values_are_refused_by_name(tmp_path, argv, capsys):
    p = argparse.ArgumentParser()
    execcmd.add_arguments(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--gpumem", "1G", *argv, "--", "true"])
    assert argv[0] in capsys.readouterr().err
