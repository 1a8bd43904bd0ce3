"""The gRPC side against the kubelet stand-in: register, ListAndWatch, kubelet restart, preflight."""

import asyncio
import shutil
import socket
import tempfile
from pathlib import Path

import grpc
import pytest

from hami.deviceplugin.api import HEALTHY, UNHEALTHY, load
from hami.deviceplugin.devices import DeviceState
from hami.node.nvml import PhysicalGPU
from hami_devkit.kubelet_standin import KubeletStandIn
from hami.node.settings import NodeSettings
from hami.deviceplugin.preflight import PreflightError, check_other_plugins
from hami.deviceplugin.server import PluginServer

pb, pb_grpc = load()
U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
U1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
GPUS = [PhysicalGPU(0, U0, "T4", 15360, "0000:3b:00.0", 1), PhysicalGPU(1, U1, "T4", 15360, "0000:5e:00.0", 0)]


@pytest.fixture
def plugin_dir():
    d = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # short: unix socket paths are limited
    yield d
    shutil.rmtree(d, ignore_errors=True)


class NoAllocator:
    async def allocate(self, requests):  # pragma: no cover - not reached in these tests
        raise AssertionError("no allocation expected")


async def start(plugin_dir, settings=NodeSettings(device_split_count=3, enable_numa_topology=True)):
    kubelet = KubeletStandIn(plugin_dir)
    await kubelet.start()
    state = DeviceState(GPUS, settings)
    server = PluginServer(plugin_dir, state, NoAllocator(), poll=0.05)
    task = asyncio.create_task(server.run())
    return kubelet, state, server, task


async def stop(kubelet, task):
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await kubelet.stop()


async def test_register_list_and_health_update(plugin_dir):
    kubelet, state, server, task = await start(plugin_dir)
    try:
        await kubelet.wait_for(
            lambda: "nvidia.com/gpu" in kubelet.plugins and len(kubelet.plugins["nvidia.com/gpu"].devices) == 6
        )
        ep = kubelet.plugins["nvidia.com/gpu"]
        assert kubelet.registrations == [("nvidia.com/gpu", "nvidia-gpu.sock")]
        assert not ep.options.get_preferred_allocation_available
        assert set(ep.devices.values()) == {HEALTHY}
        await state.mark_unhealthy([U1])
        await kubelet.wait_for(lambda: ep.devices[f"{U1}-0"] == UNHEALTHY)
        assert [i for i, h in sorted(ep.devices.items()) if h == HEALTHY] == [f"{U0}-{i}" for i in range(3)]
        # topology is attached when enablenumatopology is on
        async with grpc.aio.insecure_channel(f"unix://{plugin_dir / 'nvidia-gpu.sock'}") as ch:
            first = await pb_grpc.DevicePluginStub(ch).ListAndWatch(pb.Empty()).read()
        assert {d.ID: d.topology.nodes[0].ID for d in first.devices}[f"{U0}-0"] == 1
    finally:
        await stop(kubelet, task)
    assert not (plugin_dir / "nvidia-gpu.sock").exists()


async def test_reregisters_after_kubelet_restart(plugin_dir):
    kubelet, state, server, task = await start(plugin_dir)
    try:
        await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
        await kubelet.restart()  # deletes our socket and brings a new kubelet.sock
        assert not (plugin_dir / "nvidia-gpu.sock").exists()
        await kubelet.wait_for(
            lambda: (
                len(kubelet.registrations) == 2
                and kubelet.plugins.get("nvidia.com/gpu") is not None
                and len(kubelet.plugins["nvidia.com/gpu"].devices) == 6
            )
        )
        assert (plugin_dir / "nvidia-gpu.sock").exists() and server.registrations == 2
    finally:
        await stop(kubelet, task)


async def test_registers_when_kubelet_comes_up_late(plugin_dir):
    state = DeviceState(GPUS, NodeSettings(enable_preferred_allocation=True))
    server = PluginServer(plugin_dir, state, NoAllocator(), poll=0.05)
    task = asyncio.create_task(server.run())
    await asyncio.sleep(0.2)
    assert server.registrations == 0
    kubelet = KubeletStandIn(plugin_dir)
    await kubelet.start()
    try:
        await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
        await kubelet.wait_for(lambda: kubelet.plugins["nvidia.com/gpu"].updates >= 1)
        assert kubelet.plugins["nvidia.com/gpu"].options.get_preferred_allocation_available
    finally:
        await stop(kubelet, task)


class OtherPlugin(pb_grpc.DevicePluginServicer):
    def __init__(self, ids):
        self.ids = ids

    async def ListAndWatch(self, request, context):
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=HEALTHY) for i in self.ids])
        await asyncio.sleep(30)


async def serve_other(path, ids):
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(OtherPlugin(ids), server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


async def test_preflight_refuses_another_plugin_serving_our_gpus(plugin_dir):
    other = await serve_other(plugin_dir / "nvidia-gpu.sock", [U1])  # the NVIDIA plugin uses this name too
    try:
        with pytest.raises(PreflightError, match="already serving"):
            await check_other_plugins(plugin_dir, "nvidia-gpu.sock", [U0, U1], "nvidia.com/gpu")
        with pytest.raises(
            PreflightError, match=f"already advertises this node's GPUs \\({U1}\\).*Disable the NVIDIA device plugin"
        ):
            await check_other_plugins(plugin_dir, "nvidia-vgpu.sock", [U0, U1], "nvidia.com/gpu")
    finally:
        await other.stop(0)


async def test_preflight_ignores_stale_and_unrelated_sockets(plugin_dir):
    other = await serve_other(plugin_dir / "rdma.sock", ["mlx5_0"])
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(plugin_dir / "nvidia-gpu.sock"))  # a socket file nobody listens on
    stale.close()
    try:
        await check_other_plugins(plugin_dir, "nvidia-gpu.sock", [U0, U1], "nvidia.com/gpu", timeout=1.0)
    finally:
        await other.stop(0)


async def test_static_mig_resource_is_served_and_allocated_by_mig_uuid(plugin_dir):
    """migstrategy mixed: one resource per profile, the kubelet picks instances, Allocate passes
    their MIG UUIDs on (and refuses IDs it does not serve)."""
    from hami.node.layout import MountSpec
    from hami.deviceplugin.static_mig import StaticMigResource, StaticMigService

    kubelet = KubeletStandIn(plugin_dir)
    await kubelet.start()
    res = StaticMigResource("nvidia.com/mig-1g.10gb", ["MIG-a", "MIG-b"])
    server = PluginServer(
        plugin_dir,
        res,
        None,
        poll=0.05,
        service=StaticMigService(res, (MountSpec("/usr/local/nvidia", "/opt/drv", True),)),
    )
    task = asyncio.create_task(server.run())
    try:
        await kubelet.wait_for(lambda: len(kubelet.plugins.get("nvidia.com/mig-1g.10gb", _NoEp).devices) == 2)
        assert kubelet.registrations == [("nvidia.com/mig-1g.10gb", "nvidia-mig-1g.10gb.sock")]
        resp = await kubelet.allocate_container("nvidia.com/mig-1g.10gb", 2)
        assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": "MIG-a,MIG-b"}
        assert [(m.container_path, m.host_path) for m in resp.mounts] == [("/usr/local/nvidia", "/opt/drv")]
        ep = kubelet.plugins["nvidia.com/mig-1g.10gb"]
        with pytest.raises(grpc.aio.AioRpcError, match="unknown MIG device"):
            await ep.stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["MIG-z"])])
            )
    finally:
        await stop(kubelet, task)


class _NoEp:
    devices: dict = {}
