"""The DRA kubelet plugin's sockets across kubelet restarts, a second agent on the node (a
DaemonSet update with maxSurge) and the agent's own stop (plugin.py PluginServer), driven as the
kubelet drives them: gRPC over the unix sockets in a temp directory."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import grpc
import pytest

from hami.dra.model import SliceSettings
from hami.draplugin.api import load
from hami.draplugin.checkpoint import Checkpoint
from hami.draplugin.health import HealthBook, HealthFeed
from hami.draplugin.plugin import Driver, PluginServer, socket_paths
from hami.draplugin.prepare import Paths

from .test_dra_plugin_grpc import GPUS, Claims, claim_ref

dra_pb, dra_grpc = load("dra")
reg_pb, reg_grpc = load("registration")
health_pb, health_grpc = load("dra_health")


@pytest.fixture
def root():
    d = Path(tempfile.mkdtemp(prefix="ars", dir="/tmp"))  # short: unix socket paths are limited
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _server(root: Path, claims: Claims, health: HealthFeed | None = None) -> PluginServer:
    paths = Paths(hook_path=str(root / "usr"), lock_dir=str(root / "lock"), cdi_dir=str(root / "cdi"))
    driver = Driver("node-a", GPUS, SliceSettings(), Checkpoint(root / "state" / "checkpoint.json"), claims.read, paths)
    return PluginServer(driver, *socket_paths(root / "kubelet"), health=health)


async def _info(reg_sock: Path) -> str:
    async with grpc.aio.insecure_channel(f"unix://{reg_sock}") as ch:
        return (await reg_grpc.RegistrationStub(ch).GetInfo(reg_pb.InfoRequest(), timeout=30)).endpoint


async def _prepare(dra_sock: Path, name: str, uid: str) -> str:
    async with grpc.aio.insecure_channel(f"unix://{dra_sock}") as ch:
        resp = await dra_grpc.DRAPluginStub(ch).NodePrepareResources(
            dra_pb.NodePrepareResourcesRequest(claims=[claim_ref(name, uid)]), timeout=30
        )
        return resp.claims[uid].error


async def test_sockets_removed_under_a_running_agent_are_served_again(root):
    """The kubelet finds plugins by their registration socket: one removed (a kubelet restart
    that cleaned its plugin directories, an operator's clean-up) left the agent serving a file
    nobody can dial, never registered again until it restarted."""
    claims = Claims()
    claims.add("c1", "uid-1")
    server = _server(root, claims)
    reg_sock, dra_sock = socket_paths(root / "kubelet")
    await server.start()
    try:
        reg_sock.unlink()
        dra_sock.unlink()
        await server.check()
        assert await _info(reg_sock) == str(dra_sock)
        assert await _prepare(dra_sock, "c1", "uid-1") == ""
        shutil.rmtree(root / "kubelet")  # the directories too (an agent on the host, no mount)
        await server.check()
        assert await _info(reg_sock) == str(dra_sock)
        assert reg_sock.stat().st_mode & 0o777 == 0o600 and dra_sock.stat().st_mode & 0o777 == 0o600
    finally:
        await server.stop()
    assert not reg_sock.exists() and not dra_sock.exists()


async def test_a_socket_that_cannot_be_bound_is_tried_again_at_the_next_check(root, monkeypatch):
    """A check that cannot bind (the directory not there and not to be made, mid-restart) must
    not raise out of the watch: the agent would stop serving for good."""
    server = _server(root, Claims())
    reg_sock, dra_sock = socket_paths(root / "kubelet")
    await server.start()
    try:
        reg_sock.unlink()
        real_mkdir = Path.mkdir

        def no_mkdir(self, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(self))

        monkeypatch.setattr(Path, "mkdir", no_mkdir)
        shutil.rmtree(reg_sock.parent)
        await server.check()  # logged, not raised
        monkeypatch.setattr(Path, "mkdir", real_mkdir)
        await server.check()
        assert await _info(reg_sock) == str(dra_sock)
    finally:
        await server.stop()


async def test_a_stopping_agent_leaves_the_sockets_of_the_agent_that_replaced_it(root):
    """With maxSurge, the new agent starts before the old one stops and binds the same paths:
    the old agent's stop removed them, and the node's only DRA plugin became unreachable."""
    claims = Claims()
    claims.add("c1", "uid-1")
    old, new = _server(root, claims), _server(root, claims)
    reg_sock, dra_sock = socket_paths(root / "kubelet")
    await old.start()
    await new.start()
    try:
        await old.stop()
        assert reg_sock.exists() and dra_sock.exists()
        assert await _info(reg_sock) == str(dra_sock)
        assert await _prepare(dra_sock, "c1", "uid-1") == ""
    finally:
        await new.stop()
    assert not reg_sock.exists() and not dra_sock.exists()


async def test_a_check_leaves_sockets_another_agent_bound(root):
    """The watch serves a socket again only where none is: sockets another agent bound since are
    its own (the agents would otherwise take the paths from each other at every check)."""
    old, new = _server(root, Claims()), _server(root, Claims())
    reg_sock, dra_sock = socket_paths(root / "kubelet")
    await old.start()
    await new.start()
    try:
        before = (reg_sock.stat().st_ino, dra_sock.stat().st_ino)
        await old.check()
        assert (reg_sock.stat().st_ino, dra_sock.stat().st_ino) == before
    finally:
        await old.stop()
        await new.stop()


class SlowClaims(Claims):
    """A claim read that waits until told (an API server slow to answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release = asyncio.Event(), asyncio.Event()

    async def read(self, namespace, name):
        self.started.set()
        await self.release.wait()
        return await super().read(namespace, name)


async def test_a_prepare_in_flight_at_stop_gets_its_answer(root):
    """The stop gave calls in flight 1 s: a prepare waiting on a slow API server (or making MIG
    instances) was cut off, the kubelet got an error and its work was undone."""
    claims = SlowClaims()
    claims.add("c1", "uid-1")
    server = _server(root, claims)
    _, dra_sock = socket_paths(root / "kubelet")
    await server.start()
    call = asyncio.create_task(_prepare(dra_sock, "c1", "uid-1"))
    await claims.started.wait()
    stopping = asyncio.create_task(server.stop())
    await asyncio.sleep(1.5)
    claims.release.set()
    assert await call == ""
    await stopping
    assert (root / "cdi" / "gpu.hami.io-uid-1.json").exists()


async def test_an_open_health_stream_is_ended_at_stop(root):
    """The kubelet keeps a health stream open for good: the stop ends it (the kubelet sees the
    stream end and dials again, the next agent), rather than wait the grace given to prepares in
    flight and then cut it."""
    feed = HealthFeed(HealthBook(), [("node-a", "gpu-0", GPUS[0].uuid)])
    server = _server(root, Claims(), feed)
    _, dra_sock = socket_paths(root / "kubelet")
    await server.start()
    async with grpc.aio.insecure_channel(f"unix://{dra_sock}") as ch:
        stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(health_pb.NodeWatchResourcesRequest())
        first = await stream.read()
        assert [d.device.device_name for d in first.devices] == ["gpu-0"]
        await server.stop()
        assert await stream.read() is grpc.aio.EOF


async def test_the_watch_serves_a_removed_registration_socket_again(root):
    """What the agent runs (command.py): the check every poll, until cancelled."""
    server = _server(root, Claims())
    reg_sock, dra_sock = socket_paths(root / "kubelet")
    await server.start()
    watching = asyncio.create_task(server.watch(poll=0.01))
    try:
        gone = reg_sock.stat().st_ino
        reg_sock.unlink()
        while not reg_sock.exists() or reg_sock.stat().st_ino == gone:
            await asyncio.sleep(0.01)
        assert await _info(reg_sock) == str(dra_sock)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await server.stop()
