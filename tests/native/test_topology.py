"""GPU topology end to end: the fake NVML's boards -> the device plugin's discovery ->
``hami.io/node-nvidia-score`` -> the scheduler core's topology-aware placement (the same core
the extender runs, through ``hami.sim``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hami.core import SchedulerConfig
from hami.sim.engine import simulate
from hami.vendors import build_vendors

from . import boards
from .boards import uuid
from .conftest import FAKE_NVML, ROOT

pytestmark = pytest.mark.native

SCORE = "hami.io/node-nvidia-score"
REGISTER = "hami.io/node-nvidia-register"


def dry_run(tmp_path: Path, devices: str, *extra: str) -> tuple[dict, str]:
    env = {
        **os.environ,
        "FAKEGPU_DEVICES": devices,
        "FAKEGPU_STATE_DIR": str(tmp_path / "fg"),
        "PYTHONPATH": str(ROOT / "src"),
    }
    env.pop("ENABLE_TOPOLOGY_SCORE", None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami",
            "device-plugin",
            "--dry-run",
            "--node-name",
            "n1",
            "--nvml-library",
            str(FAKE_NVML),
            "--sysfs-root",
            str(tmp_path / "nosys"),
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["annotations"], out.stderr


def scores_of(annotations: dict) -> dict[str, dict[str, int]]:
    return {e["uuid"]: e["score"] for e in json.loads(annotations[SCORE])}


@pytest.fixture(autouse=True)
def _built(native_build):
    assert FAKE_NVML.exists()


def test_nvswitch_board_every_pair_is_an_nvlink_pair(tmp_path):
    ann, _ = dry_run(tmp_path, boards.hgx_nvswitch())
    s = scores_of(ann)
    assert sorted(s) == sorted(uuid(i) for i in range(8))
    assert all(len(row) == 7 for row in s.values())
    # 18 NVLinks through the switches (1800) + the PCIe path: one switch 50, same CPU 40, other CPU 10
    assert s[uuid(0)][uuid(1)] == 1850
    assert s[uuid(0)][uuid(2)] == 1840
    assert s[uuid(0)][uuid(4)] == 1810
    assert s[uuid(5)][uuid(0)] == s[uuid(0)][uuid(5)] == 1810


def test_partial_nvlink_board_scores_links_and_pcie(tmp_path):
    s = scores_of(dry_run(tmp_path, boards.partial_nvlink())[0])
    assert s[uuid(0)] == {uuid(1): 250, uuid(2): 140, uuid(3): 40}
    assert s[uuid(3)] == {uuid(0): 40, uuid(1): 40, uuid(2): 250}


def test_pcie_only_board_scores_the_pcie_path(tmp_path):
    s = scores_of(dry_run(tmp_path, boards.pcie_only())[0])
    assert s[uuid(0)] == {uuid(1): 50, uuid(2): 30, uuid(3): 10}
    assert s[uuid(2)][uuid(3)] == 10


def test_asymmetric_links_score_zero_and_warn(tmp_path):
    ann, err = dry_run(tmp_path, boards.asymmetric())
    assert scores_of(ann) == {uuid(0): {uuid(1): 0}, uuid(1): {uuid(0): 0}}
    assert "AsymmetricGPUP2PLink" in err


def test_scores_can_be_turned_off(tmp_path):
    ann, _ = dry_run(tmp_path, boards.partial_nvlink(), "--topology-score", "false")
    assert SCORE not in ann and REGISTER in ann


def _node(name: str, annotations: dict) -> dict:
    return {
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "status": {"allocatable": {"nvidia.com/gpu": "40"}},
    }


def _pod(name: str, gpus: int, policy: str | None = "topology-aware", node: str | None = None) -> dict:
    ann = {"hami.io/gpu-scheduler-policy": policy} if policy else {}
    spec = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "default", "annotations": ann}, "spec": spec}


def _placed(result, name: str) -> list[str]:
    pod = next(p for p in result.pods if p.name == name)
    assert pod.status == "scheduled", (pod.status, pod.reasons)
    return [d["uuid"] for c in pod.containers for d in c["devices"]]


def test_topology_aware_placement_from_discovered_scores(tmp_path):
    """Discovery -> annotations -> placement: 2 GPUs go to an NVLink pair, 1 GPU to the least
    connected GPU (keeping the pairs free), and the next 2-GPU pod the NVLink pair left."""
    ann, _ = dry_run(tmp_path, boards.partial_nvlink())
    config = SchedulerConfig(build_vendors())
    nodes = [_node("n1", ann)]
    two = simulate(nodes, [_pod("two", 2)], config)
    assert sorted(_placed(two, "two")) in ([uuid(0), uuid(1)], [uuid(2), uuid(3)])
    one = simulate(nodes, [_pod("one", 1)], config)
    assert _placed(one, "one")[0] in (uuid(1), uuid(3))  # link sums: 0 -> 430, 1 -> 330, 2 -> 430, 3 -> 330
    # with GPU 1 taken, a 2-GPU pod gets the other NVLink pair (2, 3), not 0 + anything
    both = simulate(nodes, [_pod("one", 1), _pod("two", 2)], config)
    first = _placed(both, "one")
    second = _placed(both, "two")
    pair = {uuid(2), uuid(3)} if first[0] == uuid(1) else {uuid(0), uuid(1)}
    assert set(second) == pair


def test_topology_aware_on_nvswitch_prefers_same_pcie_switch(tmp_path):
    ann, _ = dry_run(tmp_path, boards.hgx_nvswitch())
    res = simulate([_node("n1", ann)], [_pod("four", 4)], SchedulerConfig(build_vendors()))
    got = sorted(_placed(res, "four"))
    # highest sum of pair scores: one NUMA node's four GPUs (two PCIe-switch pairs)
    assert got in ([uuid(i) for i in range(4)], [uuid(i) for i in range(4, 8)])
