"""Regression review of ``hami simulate --front-end dra``'s one warning for pods that hold an
extender allocation: it counted every copy of a pod it read, so a pod deleted later in the file
(a copy with ``deletionTimestamp``) was still said to hold its allocation, and a pod deleted and
given again was counted twice ("2 pods hold ... (default/old on a, default/old on a)")."""

from __future__ import annotations

import copy

from hami.core import DeviceInfo, SchedulerConfig, encode_node_devices_json
from hami.sim.dra import DraOptions, simulate_dra
from hami.vendors import build_vendors

CFG = SchedulerConfig(build_vendors(), "binpack", "spread")


def node(name: str) -> dict:
    dev = DeviceInfo(
        id=f"GPU-{name}-0",
        index=0,
        count=4,
        devmem=15360,
        devcore=100,
        type="NVIDIA-Tesla T4",
        mode="hami-core",
        health=True,
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {"hami.io/node-nvidia-register": encode_node_devices_json([dev])}},
    }


def extender_pod(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {"hami.io/vgpu-node": "a", "hami.io/vgpu-devices-allocated": "GPU-a-0,NVIDIA,1000,0:;"},
        },
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
    }


def held(pods: list[dict]) -> list[str]:
    r = simulate_dra([node("a")], pods, CFG, DraOptions())
    return [w for w in r.warnings if "extender allocation" in w]


def deleted(pod: dict) -> dict:
    out = copy.deepcopy(pod)
    out["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return out


def test_a_pod_deleted_later_in_the_file_holds_nothing():
    old = extender_pod("old")
    assert held([old, deleted(old)]) == []
    # another pod that stays is still named
    assert held([old, extender_pod("kept"), deleted(old)]) == [
        "1 pod holds an extender allocation (default/kept on a): the DRA path does not count it on "
        "the GPUs, only in its namespace's quota (docs/dra.md, Migrating from the extender)"
    ]


def test_a_pod_deleted_and_given_again_is_counted_once():
    old = extender_pod("old")
    assert held([old, deleted(old), copy.deepcopy(old)]) == [
        "1 pod holds an extender allocation (default/old on a): the DRA path does not count it on "
        "the GPUs, only in its namespace's quota (docs/dra.md, Migrating from the extender)"
    ]
