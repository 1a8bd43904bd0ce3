"""KEP-4680 (``v1alpha1.DRAResourceHealth``): the kubelet plugin streams every published device's
health to the kubelet over its DRA socket, called here as the kubelet calls it: a snapshot at
once, a new one when a fatal XID marks a GPU (its MIG devices too) and when it recovers."""

import asyncio
import shutil
import tempfile
from pathlib import Path

import grpc
import pytest

from hami.dra.model import GpuMig, MigProfileSpec, SliceSettings, mig_devices
from hami.draplugin.api import load
from hami.draplugin.checkpoint import Checkpoint
from hami.draplugin.health import HealthBook, HealthFeed
from hami.draplugin.plugin import Driver, PluginServer, socket_paths
from hami.draplugin.prepare import Paths
from hami.node.nvml import PhysicalGPU

health_pb, health_grpc = load("dra_health")
A100, T4 = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000001"
GPUS = [
    PhysicalGPU(0, A100, "NVIDIA A100-SXM4-40GB", 40960, "0000:3b:00.0", 0),
    PhysicalGPU(1, T4, "Tesla T4", 15360, "0000:5e:00.0", 0),
]
MIG = {A100: GpuMig(True, (MigProfileSpec("3g.20gb", 19968, 43, 3, ((0, 4), (4, 4))),))}


@pytest.fixture
def root():
    d = Path(tempfile.mkdtemp(prefix="drah", dir="/tmp"))  # short: unix socket paths are limited
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def health(resp) -> dict[str, tuple[str, int]]:
    return {
        d.device.device_name: (health_pb.HealthStatus.Name(d.health), d.last_updated_time)
        for d in resp.devices
        if d.device.pool_name == "node-a"
    }


async def test_the_kubelet_sees_every_device_healthy_then_the_marked_gpu_unhealthy_then_recovered(root):
    book, clock = HealthBook(), Clock()
    migs = mig_devices(GPUS, MIG)
    feed = HealthFeed(book, [("node-a", "gpu-1", T4)] + [("node-a", m.name, m.gpu_uuid) for m in migs.values()], clock)

    async def read(ns, name):
        raise LookupError(name)

    driver = Driver(
        "node-a", GPUS, SliceSettings(), Checkpoint(root / "cp.json"), read, Paths(cdi_dir=str(root)), migs=migs
    )
    reg, dra = socket_paths(root / "kubelet")
    server = PluginServer(driver, reg, dra, health=feed)
    await server.start()
    try:
        reg_pb, reg_grpc = load("registration")
        async with grpc.aio.insecure_channel(f"unix://{reg}") as ch:  # advertised at registration
            info = await reg_grpc.RegistrationStub(ch).GetInfo(reg_pb.InfoRequest())
            assert list(info.supported_versions) == ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
        async with grpc.aio.insecure_channel(f"unix://{dra}") as ch:
            stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(health_pb.NodeWatchResourcesRequest())
            first = health(await stream.read())
            assert first == {
                "gpu-1": ("HEALTHY", 1_800_000_000),
                "gpu-0-3g-20gb-0": ("HEALTHY", 1_800_000_000),
                "gpu-0-3g-20gb-4": ("HEALTHY", 1_800_000_000),
            }
            clock.now += 60
            book.mark([A100])  # a fatal XID on the A100: its MIG devices are unhealthy
            await feed.changed()
            second = health(await stream.read())
            assert second["gpu-0-3g-20gb-0"] == second["gpu-0-3g-20gb-4"] == ("UNHEALTHY", 1_800_000_060)
            assert second["gpu-1"] == ("HEALTHY", 1_800_000_000)  # unchanged: its time stays
            clock.now += 60
            book._since.clear()  # recovered (HealthBook.recover's effect)
            await feed.changed()
            third = health(await stream.read())
            assert third["gpu-0-3g-20gb-4"] == ("HEALTHY", 1_800_000_120)
            stream.cancel()
    finally:
        await server.stop()


async def test_a_stream_resends_the_snapshot_without_a_change():
    book = HealthBook()
    feed = HealthFeed(book, [("n", "gpu-0", A100)])
    seen = feed.version
    assert await feed.wait(seen, 0.01) == seen  # a timeout: the same version, the stream sends again
    waiter = asyncio.create_task(feed.wait(seen, 60))
    await asyncio.sleep(0)
    await feed.changed()
    assert await waiter == seen + 1
