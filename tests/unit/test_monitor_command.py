"""`hami monitor` command: flag errors, --once output, the serve loop (standalone, no NVML)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from hami.cli import main
from hami_devkit.cluster import free_port
from hami.monitor.command import UsageError, parse_bind, parse_duration
from hami.monitor.region import read_region

from . import _regionkit as kit

UID = "0b6f3b4e-1111-4d7e-9a8e-aaaaaaaaaaaa"


@pytest.mark.parametrize("text, seconds", [("5m", 300), ("30s", 30), ("1h30m", 5400), ("2.5", 2.5), ("1m30s", 90)])
def test_durations(text, seconds):
    assert parse_duration(text, "--x") == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "m", "-3s", "5ms"])
def test_bad_durations_name_the_flag(text):
    with pytest.raises(UsageError, match="--x: invalid duration"):
        parse_duration(text, "--x")


def test_bind_addresses():
    assert parse_bind(":9394") == ("0.0.0.0", 9394)
    assert parse_bind("127.0.0.1:0") == ("127.0.0.1", 0)
    with pytest.raises(UsageError, match="--metrics-bind-address"):
        parse_bind("9394")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--interval", "0"], "--interval: must be positive"),
        (["--resync-interval", "soon"], "--resync-interval: invalid duration 'soon'"),
        (["--metrics-bind-address", "nope"], "--metrics-bind-address: invalid address 'nope'"),
        (["--node-name", ""], "--node-name (or NODE_NAME) is required"),
        (["--resource-names", " , "], "--resource-names: no resource name in ' , '"),
        # found by review, 1 Dec: the count resource is configured; an empty one counts nothing
        (["--resource-name", " "], "--resource-name: no resource name in ' '"),
        (["--resource-name="], "--resource-name: no resource name in ''"),
        (
            ["--resource-name", "a.com/gpu,a.com/mem"],
            "--resource-name: one resource name expected, got 'a.com/gpu,a.com/mem'",
        ),
    ],
)
def test_bad_flags_exit_2_with_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["monitor", "--no-nvml", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_once_prints_the_metrics_of_every_region(tmp_path, capsys):
    kit.write(
        tmp_path / "containers" / f"{UID}_main" / "a.cache",
        uuids=("GPU-x",),
        limits=(1 << 30,),
        procs=[kit.Proc(pid=3, used={0: (0, 0, 0, 12345)})],
    )
    assert main(["monitor", "--once", "--no-nvml", "--hook-path", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        f'hami_vgpu_memory_used_bytes{{container="main",device_uuid="",namespace="",pod="{UID}",'
        f'vdevice_index="0",zone="vGPU"}} 12345.0'
    ) in out
    assert "hami_vgpu_memory_limit_bytes{" in out and "hami_build_info{" in out


def test_serve_standalone_runs_feedback_and_releases_on_exit(tmp_path):
    region = kit.write(tmp_path / "containers" / f"{UID}_main" / "a.cache", recent_kernel=5, utilization_switch=1)
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hami",
            "monitor",
            "--standalone",
            "--no-nvml",
            "--hook-path",
            str(tmp_path),
            "--metrics-bind-address",
            f"127.0.0.1:{port}",
            "--interval",
            "0.2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        body = ""
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                if read_region(region).utilization_switch == 0:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert "hami_vgpu_memory_limit_bytes{" in body
        r = read_region(region)
        assert r.utilization_switch == 0 and r.recent_kernel < 5  # alone on its GPU: unthrottled, decaying
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert read_region(region).utilization_switch == 1  # released: limits back on without a monitor


@pytest.mark.parametrize(
    "argv, legacy",
    [([], False), (["--legacy-metrics"], True), (["--legacy-metrics=true"], True), (["--legacy-metrics=false"], False)],
)
def test_legacy_metrics_takes_the_forms_hami_scheduler_takes(argv, legacy):
    import argparse

    from hami.monitor.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(argv).legacy_metrics is legacy


def test_a_bad_legacy_metrics_value_is_refused_naming_the_flag(capsys):
    import argparse

    from hami.monitor.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--legacy-metrics=sometimes"])
    err = capsys.readouterr().err
    assert "--legacy-metrics" in err and "expected true or false" in err
