"""``--pass-device-specs`` with a CDI ``--device-list-strategy``: allowed, as in NVIDIA's
k8s-device-plugin (its Allocate adds DeviceSpecs whatever the strategy). The Allocate answer
carries both the CDI device names and the DeviceSpecs, down to the gRPC message the kubelet
reads; the runtime's CDI edits replace a device node of the same path, so the container gets each
node once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hami.cli import main
from hami.deviceplugin import command
from hami.node import nvml
from hami.node.cdi import CdiConfig
from hami.node.nvml import PhysicalGPU

from .test_deviceplugin_devspecs_wiring import allocate_gpu1_with_specs

U0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
U1 = "GPU-bbbbbbbb-0000-4000-8000-000000000001"


def dev_root(tmp_path: Path, *names: str) -> Path:
    for name in names:
        (tmp_path / "root" / "dev" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "root" / "dev" / name).touch()
    (tmp_path / "root" / "dev").mkdir(parents=True, exist_ok=True)
    return tmp_path / "root"


@pytest.mark.parametrize("strategy", ["cdi-annotations", "cdi-cri"])
def test_the_plugin_starts_with_device_specs_and_a_cdi_strategy(monkeypatch, capsys, tmp_path, strategy):
    """Refused at start-up before (exit 2, "goes with --device-list-strategy envvar only")."""
    root = dev_root(tmp_path, "nvidia0", "nvidia3", "nvidiactl")
    cfg = tmp_path / "config.json"
    cfg.write_text('{"nodeconfig": []}')
    gpus = [PhysicalGPU(0, U0, "Tesla T4", 15360, "0000:3b:00.0", 0), PhysicalGPU(1, U1, "Tesla T4", 15360, "", 0)]
    monkeypatch.setattr(command, "open_nvml", lambda library: None)
    monkeypatch.setattr(command, "close_nvml", lambda: None)
    monkeypatch.setattr(command, "discover", lambda settings, sysfs: gpus)
    monkeypatch.setattr(nvml, "minor_number", {U0: 0, U1: 3}.__getitem__)
    code = main(
        [
            "device-plugin",
            "--dry-run",
            "--node-name=n1",
            f"--node-config={cfg}",
            "--topology-score=false",
            f"--device-list-strategy={strategy}",
            "--pass-device-specs",
            f"--dev-root={root}",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    shown = json.loads(out)
    assert [d["name"] for d in shown["cdiSpec"]["devices"]] == [U0, U1]
    assert [d["containerPath"] for d in shown["deviceSpecs"][U1]] == ["/dev/nvidia3", "/dev/nvidiactl"]


@pytest.mark.parametrize("strategy", ["cdi-annotations", "cdi-cri"])
async def test_the_allocate_answer_has_the_cdi_devices_and_the_device_specs(tmp_path, strategy):
    wire = await allocate_gpu1_with_specs(tmp_path, cdi=CdiConfig(strategy))
    names = [d.name for d in wire.cdi_devices] if strategy == "cdi-cri" else list(wire.annotations.values())
    assert names == [f"hami.io/gpu={U1}"]
    assert "NVIDIA_VISIBLE_DEVICES" not in wire.envs
    assert wire.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"  # libvgpu's limits stay
