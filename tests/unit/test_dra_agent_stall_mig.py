"""The DRA agent keeps serving while one claim's MIG instances are made (plugin.py): the MIG
manager holds its lock for the whole creation (seconds on a GPU), and a MIG call made on the
event loop while it was held (the snapshot of an unprepare's clean-up) stalled every call of
the agent: other claims' prepares, the kubelet's registration, the health stream. Found by an
adversarial review. Ordering is shown with events; a timer opens the creation's gate as a
fallback only, so that the stalled code still ends."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from pathlib import Path

import grpc
import pytest

from hami.dra.model import SliceSettings, mig_devices
from hami.draplugin.api import load
from hami.draplugin.checkpoint import Checkpoint
from hami.draplugin.plugin import Driver, PluginServer, socket_paths
from hami.draplugin.prepare import Paths
from hami.node.mig import Checkpoint as MigCheckpoint, MigManager

from .test_dra_mig import A100, DYNAMIC, GPUS, FakeMig, allocated

dra_pb, dra_grpc = load("dra")
reg_pb, reg_grpc = load("registration")

FALLBACK_S = 3.0  # the stalled code's creation ends after this; the fixed code never waits for it


def share(uid: str) -> dict:
    """A claim for a share of the T4 (gpu-1): no MIG in it."""
    return {
        "metadata": {"namespace": "ns", "name": f"c-{uid}", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.hami.io",
                            "pool": "n1",
                            "device": "gpu-1",
                            "shareID": f"share-{uid}",
                            "consumedCapacity": {"memory": "3000Mi", "cores": "30", "shares": "1"},
                        }
                    ]
                }
            }
        },
    }


class WatchedLock:
    """The MIG manager's lock, telling when a second caller waits for it."""

    def __init__(self) -> None:
        self.inner = threading.Lock()
        self.callers = 0
        self.contended = threading.Event()

    def __enter__(self) -> None:
        self.callers += 1
        if self.inner.locked():
            self.contended.set()
        self.inner.acquire()

    def __exit__(self, *exc: object) -> None:
        self.inner.release()


class Gated(FakeMig):
    """A GPU instance creation that waits until its gate opens (a real one takes seconds)."""

    def __init__(self, order: list[str]) -> None:
        super().__init__()
        self.order = order
        self.entered = threading.Event()
        self.gate = threading.Event()
        self._once = threading.Lock()

    def open(self, who: str) -> None:
        with self._once:
            if not self.gate.is_set():
                self.order.append(f"creation let go ({who})")
                self.gate.set()

    def create_gi(self, uuid, profile, start):
        self.entered.set()
        self.gate.wait()
        return super().create_gi(uuid, profile, start)


@pytest.fixture
def root():
    d = Path(tempfile.mkdtemp(prefix="stl", dir="/tmp"))  # short: unix socket paths are limited
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _driver(root: Path, nvml: FakeMig, claims: dict) -> Driver:
    async def read(ns, name):
        return claims[name]

    mig = MigManager(nvml, MigCheckpoint(root / "state" / "mig.json"), [A100])
    mig._lock = WatchedLock()  # type: ignore[assignment]
    return Driver(
        "n1",
        GPUS,
        SliceSettings(),
        Checkpoint(root / "state" / "checkpoint.json"),
        read,
        Paths(hook_path=str(root / "hook"), lock_dir=str(root / "lock"), cdi_dir=str(root / "cdi")),
        migs=mig_devices(GPUS, DYNAMIC),
        mig=mig,
    )


async def test_a_mig_creation_in_progress_does_not_stall_other_claims_or_registration(root):
    order: list[str] = []
    nvml = Gated(order)
    claims = {"c-u1": allocated("u1", "gpu-0-3g-20gb-4"), "c-u2": share("u2")}
    driver = _driver(root, nvml, claims)
    lock = driver.mig._lock  # type: ignore[union-attr]
    server = PluginServer(driver, *socket_paths(root / "kubelet"))
    reg_sock, dra_sock = socket_paths(root / "kubelet")
    fallback = threading.Timer(FALLBACK_S, nvml.open, ("fallback",))
    await server.start()
    fallback.start()
    try:
        async with (
            grpc.aio.insecure_channel(f"unix://{dra_sock}") as dra,
            grpc.aio.insecure_channel(f"unix://{reg_sock}") as reg,
        ):
            stub = dra_grpc.DRAPluginStub(dra)

            def claim(name, uid):
                return dra_pb.Claim(namespace="ns", name=name, uid=uid)

            making = asyncio.ensure_future(
                stub.NodePrepareResources(dra_pb.NodePrepareResourcesRequest(claims=[claim("c-u1", "u1")]))
            )
            await asyncio.to_thread(nvml.entered.wait)  # u1's creation holds the MIG lock
            # the unprepare of a claim never prepared here: its clean-up asks the MIG manager
            cleaning = asyncio.ensure_future(
                stub.NodeUnprepareResources(dra_pb.NodeUnprepareResourcesRequest(claims=[claim("c-u3", "u3")]))
            )
            await asyncio.to_thread(lock.contended.wait)  # ... and waits for the lock
            info = await reg_grpc.RegistrationStub(reg).GetInfo(reg_pb.InfoRequest())
            order.append("registration answered")
            other = await stub.NodePrepareResources(dra_pb.NodePrepareResourcesRequest(claims=[claim("c-u2", "u2")]))
            order.append("u2 prepared")
            nvml.open("test")
            made, cleaned = await making, await cleaning
    finally:
        fallback.cancel()
        nvml.gate.set()
        await server.stop()
    assert order == ["registration answered", "u2 prepared", "creation let go (test)"]
    assert info.endpoint == str(dra_sock)
    assert other.claims["u2"].error == "" and [d.device_name for d in other.claims["u2"].devices] == ["gpu-1"]
    assert made.claims["u1"].error == "" and cleaned.claims["u3"].error == ""
    assert [(i.profile, i.start) for i in nvml.instances(A100)] == [("3g.20gb", 4)]  # u1's, not u3's to destroy


async def test_a_cancelled_prepare_holds_its_claim_until_its_mig_work_is_done(root):
    """The kubelet's deadline cancels a prepare while its thread still makes the instances: the
    claim's next call (its unprepare) starts only once they are made and recorded, so it sees
    and destroys them (it could otherwise take the manager's snapshot first and spare them)."""
    order: list[str] = []
    nvml = Gated(order)
    driver = _driver(root, nvml, {"c-u1": allocated("u1", "gpu-0-3g-20gb-4")})
    removing = driver._remove_files

    def remove_files(*args):
        order.append("unprepare of u1 began")
        removing(*args)

    driver._remove_files = remove_files  # type: ignore[method-assign]
    fallback = threading.Timer(FALLBACK_S, nvml.open, ("fallback",))
    fallback.start()
    try:
        preparing = asyncio.ensure_future(driver.prepare("ns", "c-u1", "u1"))
        await asyncio.to_thread(nvml.entered.wait)
        preparing.cancel()
        unpreparing = asyncio.ensure_future(driver.unprepare("ns", "c-u1", "u1"))
        # until the unprepare either began or waits behind the cancelled prepare for the claim
        while "unprepare of u1 began" not in order and driver._locks.get("u1", (None, 0))[1] < 2:
            await asyncio.sleep(0.01)
        nvml.open("test")
        await unpreparing
    finally:
        fallback.cancel()
        nvml.gate.set()
    assert preparing.cancelled()
    assert order == ["creation let go (test)", "unprepare of u1 began"]
    assert nvml.live == {} and driver.mig is not None and driver.mig.entries == {}
