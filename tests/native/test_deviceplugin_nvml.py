"""The device plugin's NVML code against the project's fake libnvidia-ml.so.1 (subprocesses:
the fake reads its GPU list once per process, from the environment)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import FAKE_NVML, ROOT

pytestmark = [pytest.mark.native, pytest.mark.usefixtures("need_fake_nvml")]

DEVICES = "name=Tesla T4,memory=16G,pci=0000:3b:00.0;name=NVIDIA A100-SXM4-40GB,memory=40G,pci=0000:5e:00.0"
G0 = "GPU-f00dfeed-0000-4000-8000-000000000000"
G1 = "GPU-f00dfeed-0000-4000-8000-000000000001"


def env(tmp_path, **extra):
    return {
        **os.environ,
        "FAKEGPU_DEVICES": DEVICES,
        "FAKEGPU_STATE_DIR": str(tmp_path),
        "PYTHONPATH": str(ROOT / "src"),
        **extra,
    }


def hami(*args, tmp_path, **kw):
    return subprocess.run(
        [sys.executable, "-m", "hami", "device-plugin", *args],
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        **kw,
    )


def test_dry_run_discovers_fake_gpus_with_config_and_numa(tmp_path):
    d = tmp_path / "sys/bus/pci/devices/0000:5e:00.0"
    d.mkdir(parents=True)
    (d / "numa_node").write_text("1\n")
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "nodeconfig": [
                    {"name": "n1", "devicesplitcount": 3, "devicememoryscaling": 2, "filterdevices": {"index": [0]}}
                ]
            }
        )
    )
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
        tmp_path=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [(g["uuid"], g["model"], g["memoryMiB"], g["busId"], g["numa"]) for g in doc["gpus"]] == [
        (G1, "NVIDIA A100-SXM4-40GB", 40960, "0000:5e:00.0", 1)
    ]
    assert doc["kubeletDevices"] == 3
    reg = json.loads(doc["annotations"]["hami.io/node-nvidia-register"])
    assert reg == [
        {
            "id": G1,
            "index": 1,
            "count": 3,
            "devmem": 81920,
            "devcore": 100,
            "type": "NVIDIA A100-SXM4-40GB",
            "numa": 1,
            "mode": "hami-core",
            "health": True,
        }
    ]


def test_refuses_without_nvml(tmp_path):
    out = hami("--node-name", "n1", "--nvml-library", str(tmp_path / "missing.so"), tmp_path=tmp_path)
    assert out.returncode == 3
    assert "refusing to start: NVML could not be loaded" in out.stderr and "NVIDIA driver" in out.stderr


def test_bad_node_config_is_one_clear_line(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", "devicesplitcount": "many"}]}))
    out = hami("--node-name", "n1", "--node-config", str(cfg), "--nvml-library", str(FAKE_NVML), tmp_path=tmp_path)
    assert out.returncode == 2 and "field 'devicesplitcount'" in out.stderr and "'many'" in out.stderr
    assert "Traceback" not in out.stderr


def test_xid_watcher_reports_critical_xids_only(tmp_path):
    """A fault (79) marks its GPU; an application error (13) is only passed to ``on_minor``."""
    script = textwrap.dedent(f"""
        import time
        from hami.node.nvml import open_nvml, XidWatcher
        open_nvml({str(FAKE_NVML)!r})
        got, minor = [], []
        w = XidWatcher([{G0!r}, {G1!r}], got.append, wait_ms=100, on_minor=lambda u, x: minor.append((u, x)))
        w.start()
        time.sleep(0.3)
        open({str(tmp_path / "xid")!r}, "w").write("0 13\\n{G1} 79\\n")
        deadline = time.time() + 10
        while not got and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        w.stop()
        print(got, minor)
    """)
    out = subprocess.run([sys.executable, "-c", script], env=env(tmp_path), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{[[G1]]} {[(G0, 13)]}"


@pytest.mark.parametrize("mode", ["hami-core", "mig"])
def test_a_gpu_in_mig_mode_is_left_out_unless_something_cuts_it_into_instances(tmp_path, mode):
    """A whole-GPU share of a GPU in MIG mode would give its containers no CUDA device: under
    operatingmode hami-core it is not registered (a warning says why and what to set); under
    operatingmode mig it is, with its profiles."""
    cfg = tmp_path / "config.json"
    entry = {"name": "n1", "operatingmode": mode}
    if mode == "mig":
        entry["filterdevices"] = {"index": [0]}  # the T4 has no MIG: refused under operatingmode mig
    cfg.write_text(json.dumps({"nodeconfig": [entry]}))
    out = subprocess.run(
        [sys.executable, "-m", "hami", "device-plugin", "--dry-run", "--node-name", "n1"]
        + ["--node-config", str(cfg), "--nvml-library", str(FAKE_NVML)],
        env=env(tmp_path, FAKEGPU_DEVICES=DEVICES.replace("memory=40G,", "memory=40G,mig_mode=1,")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    uuids = [g["uuid"] for g in json.loads(out.stdout)["gpus"]]
    if mode == "hami-core":
        assert uuids == [G0]
        assert f"GPU 1 ({G1}) is in MIG mode: no CUDA process can use it whole, so it is left out" in out.stderr
    else:
        assert uuids == [G1] and "is in MIG mode" not in out.stderr
