"""Regression review of ``--pass-device-specs``: a dev root that holds none of the GPUs' nodes
(HAMi's chart defaults, ``passDeviceSpecsEnabled: true`` with ``nvidiaDriverRoot: auto``, on a
GPU Operator node, whose driver container makes them under /run/nvidia/driver/dev) left every
Allocate without the GPU's node and the plugin silent about it; it now says so once at start-up,
naming the flag, its value, the missing nodes and the chart key to set."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from hami.deviceplugin import command
from hami.deviceplugin.devices import DeviceState
from hami.node import nvml
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings

U0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
U1 = "GPU-bbbbbbbb-0000-4000-8000-000000000001"


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    return p.parse_args(list(argv))


def state() -> DeviceState:
    gpus = [PhysicalGPU(i, u, "Tesla T4", 15360, f"0000:0{i}:00.0", 0) for i, u in enumerate((U0, U1))]
    return DeviceState(gpus, NodeSettings())


def make_root(tmp_path: Path, *names: str) -> Path:
    (tmp_path / "root" / "dev").mkdir(parents=True)
    for n in names:
        (tmp_path / "root" / "dev" / n).touch()
    return tmp_path / "root"


def test_a_dev_root_without_the_gpus_nodes_is_named_at_start_up(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(nvml, "minor_number", {U0: 0, U1: 1}.get)
    root = make_root(tmp_path, "nvidia0", "nvidiactl")  # nvidia1 missing
    with caplog.at_level(logging.WARNING, logger="hami.deviceplugin"):
        specs = command.device_specs(
            parse("--pass-device-specs", "--dev-root=/", f"--dev-root-ctr-path={root}"), state()
        )
    assert specs is not None
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "--dev-root=/ has no nvidia1 under" in warning and "devicePlugin.devRoot" in warning
    assert "nvidia0" not in warning.split("under")[0]


def test_a_dev_root_with_every_gpus_node_says_nothing(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(nvml, "minor_number", {U0: 0, U1: 1}.get)
    root = make_root(tmp_path, "nvidia0", "nvidia1")
    with caplog.at_level(logging.WARNING, logger="hami.deviceplugin"):
        command.device_specs(parse("--pass-device-specs", f"--dev-root={root}"), state())
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
