"""`hami dra --dry-run` against the project's fake libnvidia-ml.so.1: what the node agent would
publish (subprocesses: the fake reads its GPU list once per process, from the environment)."""

import json
import os
import subprocess
import sys

import pytest

from .conftest import FAKE_NVML, ROOT

pytestmark = [pytest.mark.native, pytest.mark.usefixtures("need_fake_nvml")]

DEVICES = "name=Tesla T4,memory=16G,pci=0000:3b:00.0;name=NVIDIA A100-SXM4-40GB,memory=40G,pci=0000:5e:00.0"
G0 = "GPU-f00dfeed-0000-4000-8000-000000000000"


def hami(*args, tmp_path, devices=DEVICES):
    env = {
        **os.environ,
        "FAKEGPU_DEVICES": devices,
        "FAKEGPU_STATE_DIR": str(tmp_path),
        "PYTHONPATH": str(ROOT / "src"),
    }
    return subprocess.run(
        [sys.executable, "-m", "hami", "dra", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_dry_run_publishes_the_fake_gpus_with_node_config(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", "devicesplitcount": 3, "devicememoryscaling": 2}]}))
    out = hami(
        "--dry-run",
        "--node-name",
        "n1",
        "--node-config",
        str(cfg),
        "--sysfs-root",
        str(tmp_path / "sys"),
        "--nvml-library",
        str(FAKE_NVML),
        "--default-cores",
        "10",
        "--extended-resource-name",
        "nvidia.com/gpu",
        tmp_path=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    spec = doc["resourceSlice"]["spec"]
    assert spec["nodeName"] == "n1" and [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    t4 = spec["devices"][0]
    assert t4["attributes"]["uuid"] == {"string": G0} and t4["attributes"]["driverVersion"] == {"version": "550.54.15"}
    assert t4["attributes"]["migCapable"] == {"bool": False}
    assert t4["capacity"]["memory"]["value"] == str(2 * 16384 * 1024 * 1024)
    assert t4["capacity"]["shares"]["value"] == "3" and t4["capacity"]["cores"]["requestPolicy"]["default"] == "10"
    assert doc["deviceClasses"][0]["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_dry_run_publishes_standard_and_version_attributes_from_nvml_and_sysfs(tmp_path):
    """pciBusID and the versions from the fake NVML; numaNode and pcieRoot from a sysfs tree laid
    out as the kernel's (the T4 under root complex pci0000:3a on NUMA node 1). The A100 has no
    sysfs entry: its numaNode and pcieRoot are left out, not guessed."""
    sys_root = tmp_path / "sys"
    device = sys_root / "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    (sys_root / "bus/pci/devices").mkdir(parents=True)
    (sys_root / "bus/pci/devices/0000:3b:00.0").symlink_to("../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0")
    devices = DEVICES.replace("pci=0000:3b:00.0", "pci=0000:3b:00.0,cc=7.5").replace(
        "pci=0000:5e:00.0", "pci=0000:5e:00.0,cc=8.0"
    )
    out = hami(
        "--dry-run",
        "--node-name",
        "n1",
        "--sysfs-root",
        str(sys_root),
        "--nvml-library",
        str(FAKE_NVML),
        tmp_path=tmp_path,
        devices=devices,
    )
    assert out.returncode == 0, out.stderr
    t4, a100 = json.loads(out.stdout)["resourceSlice"]["spec"]["devices"]
    typed = ("driverVersion", "cudaComputeCapability", "numa")
    assert {k: v for k, v in t4["attributes"].items() if k in typed or k.startswith("resource.kubernetes.io/")} == {
        "driverVersion": {"version": "550.54.15"},
        "cudaComputeCapability": {"version": "7.5.0"},
        "numa": {"int": 1},
        "resource.kubernetes.io/numaNode": {"int": 1},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
    }
    assert {k: v for k, v in a100["attributes"].items() if k in typed or k.startswith("resource.kubernetes.io/")} == {
        "driverVersion": {"version": "550.54.15"},
        "cudaComputeCapability": {"version": "8.0.0"},
        "numa": {"int": 0},  # the registration's rule for an unknown node, kept for old selectors
        "resource.kubernetes.io/pciBusID": {"string": "0000:5e:00.0"},
    }


def test_refuses_without_node_name_or_nvml(tmp_path):
    out = hami("--node-name", "", tmp_path=tmp_path)
    assert out.returncode == 2 and "--node-name" in out.stderr
    out = hami("--node-name", "n1", "--nvml-library", str(tmp_path / "missing.so"), tmp_path=tmp_path)
    assert out.returncode == 3 and "NVML could not be loaded" in out.stderr
    out = hami("--explain", "just-a-pod", tmp_path=tmp_path)
    assert out.returncode == 2 and "--explain: expected NAMESPACE/POD, got 'just-a-pod'" in out.stderr


def test_dry_run_keeps_the_names_a_previous_start_recorded(tmp_path):
    # the record of a start that saw three GPUs; the one between is gone now, so NVML numbers
    # GPU-c 1: it keeps gpu-2, the name claims were booked on
    uuids = ["GPU-a0000000-0000-4000-8000-000000000000", "GPU-b0000000-0000-4000-8000-000000000000"]
    uuids.append("GPU-c0000000-0000-4000-8000-000000000000")
    state = tmp_path / "state"
    state.mkdir()
    (state / "device-names.json").write_text(json.dumps({"version": 1, "slots": {u: i for i, u in enumerate(uuids)}}))
    devices = ";".join(f"name=Tesla T4,memory=16G,uuid={u}" for u in (uuids[0], uuids[2]))
    out = hami(
        "--dry-run",
        "--node-name",
        "n1",
        "--state-dir",
        str(state),
        "--sysfs-root",
        str(tmp_path / "sys"),
        "--nvml-library",
        str(FAKE_NVML),
        tmp_path=tmp_path,
        devices=devices,
    )
    assert out.returncode == 0, out.stderr
    got = [
        (d["name"], d["attributes"]["uuid"]["string"], d["attributes"]["index"]["int"])
        for d in json.loads(out.stdout)["resourceSlice"]["spec"]["devices"]
    ]
    assert got == [("gpu-0", uuids[0], 0), ("gpu-2", uuids[2], 1)]
    assert "gpu-1" in out.stderr  # the gone GPU's name is said to stay unused
