"""``--pass-device-specs`` through the plugin's Allocate paths: the shared-GPU Allocator and the
gRPC answer the kubelet reads (its ``devices`` field), and a static MIG resource's Allocate over
the kubelet stand-in. The specs themselves: test_deviceplugin_devspecs_allocate.py."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from hami.deviceplugin import allocate as A
from hami.deviceplugin.allocator import Allocator
from hami.deviceplugin.server import PluginServer, container_response
from hami.deviceplugin.static_mig import StaticMigResource, StaticMigService
from hami.node.layout import HookPaths
from hami.node.settings import NodeSettings
from hami_devkit.kubelet_standin import KubeletStandIn

from .test_deviceplugin_allocator import FakeKube, pod_obj

U0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
U1 = "GPU-bbbbbbbb-0000-4000-8000-000000000001"


def dev_root(tmp_path: Path, *names: str) -> Path:
    for name in names:
        (tmp_path / "root" / "dev" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "root" / "dev" / name).touch()
    return tmp_path / "root"


async def allocate_gpu1_with_specs(tmp_path, **options):
    """The container answer for a pod granted U1, the device specs of both GPUs known: the GPU's
    node and the control nodes present under the root, checked here; ``options`` go to the
    Allocator (e.g. ``cdi=``)."""
    root = dev_root(tmp_path, "nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm")
    kube = FakeKube("2026-11-22T03:00:00Z,ns,p", [pod_obj("p", to_allocate=f"{U1},NVIDIA,1000,10:;")])
    alloc = Allocator(
        kube,
        NodeSettings(),
        HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock")),
        release_delay=0,
        gpus=[U0, U1],
        device_specs=A.DeviceSpecs({U0: ("nvidia0",), U1: ("nvidia1",)}, str(root)),
        **options,
    )
    [resp] = await alloc.allocate([1])
    wire = container_response(resp)
    assert [(d.container_path, d.host_path, d.permissions) for d in wire.devices] == [
        ("/dev/nvidia1", f"{root}/dev/nvidia1", "rw"),
        ("/dev/nvidiactl", f"{root}/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", f"{root}/dev/nvidia-uvm", "rw"),
    ]
    return wire


async def test_the_allocators_answer_carries_the_granted_gpus_nodes_to_the_kubelet(tmp_path):
    wire = await allocate_gpu1_with_specs(tmp_path)
    assert wire.envs["NVIDIA_VISIBLE_DEVICES"] == U1


async def test_without_device_specs_the_answer_has_none(tmp_path):
    kube = FakeKube("2026-11-22T03:00:00Z,ns,p", [pod_obj("p", to_allocate=f"{U0},NVIDIA,1000,10:;")])
    alloc = Allocator(kube, NodeSettings(), HookPaths(str(tmp_path / "h"), str(tmp_path / "l")), 0, gpus=[U0])
    [resp] = await alloc.allocate([1])
    assert list(container_response(resp).devices) == []


@pytest.fixture
def plugin_dir():
    d = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # short: unix socket paths are limited
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_a_static_mig_instance_gets_its_gpu_and_caps_nodes(plugin_dir, tmp_path):
    root = dev_root(tmp_path, "nvidia5", "nvidia-caps/nvidia-cap30", "nvidia-caps/nvidia-cap31", "nvidiactl")
    specs = A.DeviceSpecs({"MIG-a": ("nvidia5", "nvidia-caps/nvidia-cap30", "nvidia-caps/nvidia-cap31")}, str(root))
    kubelet = KubeletStandIn(plugin_dir)
    await kubelet.start()
    res = StaticMigResource("nvidia.com/mig-3g.20gb", ["MIG-a"])
    server = PluginServer(plugin_dir, res, None, poll=0.05, service=StaticMigService(res, (), specs))
    task = asyncio.create_task(server.run())
    try:
        await kubelet.wait_for(lambda: "nvidia.com/mig-3g.20gb" in kubelet.plugins)
        await kubelet.wait_for(lambda: len(kubelet.plugins["nvidia.com/mig-3g.20gb"].devices) == 1)
        resp = await kubelet.allocate_container("nvidia.com/mig-3g.20gb", 1)
        assert [d.container_path for d in resp.devices] == [
            "/dev/nvidia5",
            "/dev/nvidia-caps/nvidia-cap30",
            "/dev/nvidia-caps/nvidia-cap31",
            "/dev/nvidiactl",
        ]
        assert {d.host_path.removeprefix(str(root)) for d in resp.devices} == {d.container_path for d in resp.devices}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kubelet.stop()
