"""The plugin's gRPC server across kubelet restarts that take the device-plugin directory with
them (server.py PluginServer.check), driven one watch step at a time against the kubelet
stand-in."""

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from hami.deviceplugin.allocate import ContainerResponse
from hami.deviceplugin.devices import DeviceState
from hami.deviceplugin.server import PluginServer
from hami.node.settings import NodeSettings
from hami_devkit.kubelet_standin import KubeletStandIn

from .test_deviceplugin_grpc import GPUS, U0, NoAllocator


@pytest.fixture
def plugin_dir():
    d = Path(tempfile.mkdtemp(prefix="dpr", dir="/tmp"))  # short: unix socket paths are limited
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_a_directory_wiped_and_recreated_is_served_and_registered_again(plugin_dir):
    """The watch step that found the directory gone (kubelet restarting, the directory removed
    and not yet back) raised grpc's bind error out of run(): the plugin stopped for good."""
    kubelet = KubeletStandIn(plugin_dir)
    await kubelet.start()
    server = PluginServer(plugin_dir, DeviceState(GPUS, NodeSettings(device_split_count=3)), NoAllocator())
    await server.serve()
    try:
        assert await server.register()
        await kubelet.stop()
        shutil.rmtree(plugin_dir)
        await server.check()  # nothing to bind to: retried at the next step
        await server.check()
        assert server.registrations == 1 and not plugin_dir.exists()
        kubelet = KubeletStandIn(plugin_dir)
        await kubelet.start()  # the directory is back, with a new kubelet.sock
        await server.check()
        assert (plugin_dir / "nvidia-gpu.sock").exists() and server.registrations == 2
        await kubelet.wait_for(lambda: len(kubelet.plugins["nvidia.com/gpu"].devices) == 6)
    finally:
        await server.stop_serving()
        await kubelet.stop()


class SlowAllocator:
    """An Allocate that takes a second (an API server slow to answer its writes)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finished = False

    async def allocate(self, requests):
        self.started.set()
        await asyncio.sleep(1.0)
        self.finished = True
        return [ContainerResponse({"NVIDIA_VISIBLE_DEVICES": U0}, (), "") for _ in requests]


async def test_an_allocate_in_flight_at_shutdown_is_answered(plugin_dir):
    """The plugin stopping (a rollout, SIGTERM) cut an Allocate off after half a second: the
    kubelet got UNAVAILABLE and failed the pod it was admitting, and the allocation stopped
    wherever it was (bind-phase allocating, the node lock held)."""
    kubelet = KubeletStandIn(plugin_dir)
    await kubelet.start()
    allocator = SlowAllocator()
    server = PluginServer(plugin_dir, DeviceState(GPUS, NodeSettings()), allocator, poll=0.05)
    task = asyncio.create_task(server.run())
    try:
        await kubelet.wait_for(
            lambda: bool(kubelet.plugins.get("nvidia.com/gpu") and kubelet.plugins["nvidia.com/gpu"].devices)
        )
        call = asyncio.create_task(kubelet.allocate_container("nvidia.com/gpu", 1))
        await allocator.started.wait()
        task.cancel()  # the agent stopping
        await asyncio.gather(task, return_exceptions=True)
        answer = await call
        assert allocator.finished and answer.envs["NVIDIA_VISIBLE_DEVICES"] == U0
        assert not (plugin_dir / "nvidia-gpu.sock").exists()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kubelet.stop()
