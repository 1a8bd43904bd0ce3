"""Dynamic MIG through DRA against the fake NVML's MIG model: what ``hami dra`` publishes for a
GPU in ``operatingmode: mig`` (the extender path's profiles, as partitionable devices with
shared counters), and a claim's instance made in prepare, kept across a plugin restart, and
destroyed in unprepare (each step a fresh process, as after a restart)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import FAKE_NVML, ROOT

pytestmark = [pytest.mark.native, pytest.mark.usefixtures("need_fake_nvml")]

A100 = "GPU-f00dfeed-0000-4000-8000-000000000000"
DEVICES = "name=NVIDIA A100-SXM4-40GB,memory=40Gi,sms=108"


def env(tmp_path: Path) -> dict:
    return {
        **os.environ,
        "FAKEGPU_DEVICES": DEVICES,
        "FAKEGPU_STATE_DIR": str(tmp_path / "fg"),
        "FAKE_NVML": str(FAKE_NVML),
        "PYTHONPATH": str(ROOT / "src"),
    }


def claim(uid: str, *devices: str) -> dict:
    results = [{"request": "mig", "driver": "gpu.hami.io", "pool": "n1", "device": d} for d in devices]
    return {
        "metadata": {"namespace": "ns", "name": f"c-{uid}", "uid": uid},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def probe(tmp_path: Path, **cmd) -> dict:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("dra_mig_probe.py")), str(tmp_path / "state"), json.dumps(cmd)],
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_dry_run_publishes_the_mig_placements_as_partitionable_devices(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", "operatingmode": "mig"}]}))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami",
            "dra",
            "--dry-run",
            "--node-name",
            "n1",
            "--node-config",
            str(cfg),
            "--sysfs-root",
            str(tmp_path / "sys"),
            "--nvml-library",
            str(FAKE_NVML),
        ],
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    devs, counters = json.loads(out.stdout)["resourceSlices"]
    names = [d["name"] for d in devs["spec"]["devices"]]
    # the profiles the extender path registers (test_mig.py), one device per placement
    assert names[:8] == [f"gpu-0-1g-5gb-{s}" for s in range(7)] + ["gpu-0-1g-10gb-0"]
    assert names[-1] == "gpu-0-7g-40gb-0" and "gpu-0" not in names
    assert counters["spec"]["sharedCounters"] == [
        {"name": "gpu-0-slices", "counters": {f"slice-{k}": {"value": "1"} for k in range(8)}}
    ]


def test_prepare_creates_the_instance_a_restart_keeps_it_and_unprepare_destroys_it(tmp_path):
    first = probe(tmp_path, prepare=[claim("u1", "gpu-0-3g-20gb-4")])
    assert first["prepared"] == {"u1": ["gpu-0-3g-20gb-4"]}
    [[profile, start, mig_uuid]] = first["instances"][A100]
    assert (profile, start) == ("3g.20gb", 4) and mig_uuid.startswith("MIG-")
    assert f"NVIDIA_VISIBLE_DEVICES={mig_uuid}" in first["env"]["u1"]
    # a new process (the plugin restarted): the prepared claim's instance is kept
    again = probe(tmp_path)
    assert again["recover"] == [] and again["instances"][A100] == first["instances"][A100]
    # an overlapping placement for another claim is refused, and leaves nothing behind
    clash = probe(tmp_path, prepare=[claim("u2", "gpu-0-4g-20gb-0", "gpu-0-7g-40gb-0")])
    assert "still held" in clash["prepared"]["u2"] or "cannot create" in clash["prepared"]["u2"]
    assert clash["instances"][A100] == first["instances"][A100]
    gone = probe(tmp_path, unprepare=["u1"])
    assert gone["instances"][A100] == []


def test_mig_strategy_mixed_as_a_flag_publishes_the_existing_instances(tmp_path):
    """``hami dra --mig-strategy mixed`` (the chart's devicePlugin.migStrategy) serves a GPU in MIG
    mode by its instances, as config.json's migstrategy does; without it the GPU is left out
    (shared whole, its containers would find no CUDA device)."""
    from .test_mig import make_instances

    e = {**env(tmp_path), "FAKEGPU_DEVICES": DEVICES + ",mig_mode=1"}
    [mig_uuid] = make_instances(e, [[A100, "3g.20gb", 4]])
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1"}]}))

    def dry_run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "hami", "dra", "--dry-run", "--node-name", "n1", "--node-config", str(cfg)]
            + ["--sysfs-root", str(tmp_path / "sys"), "--nvml-library", str(FAKE_NVML), *extra],
            env=e,
            capture_output=True,
            text=True,
            timeout=60,
        )

    out = dry_run("--mig-strategy", "mixed")
    assert out.returncode == 0, out.stderr
    devices = json.loads(out.stdout)["resourceSlice"]["spec"]["devices"]
    assert [d["attributes"]["uuid"]["string"] for d in devices] == [mig_uuid]
    out = dry_run()
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["resourceSlice"]["spec"]["devices"] == []
    assert "is in MIG mode: no CUDA process can use it whole" in out.stderr
