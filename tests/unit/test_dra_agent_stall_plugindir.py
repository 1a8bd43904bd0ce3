"""A kubelet plugin directory removed on the host under the DRA agent (plugin.py PluginServer,
command.py _serve). The chart mounts ``plugins_registry`` and ``plugins/gpu.hami.io`` as hostPath
volumes: after the host removes such a directory (and makes it again), the container still sees
the removed one, where no socket can be bound and none the kubelet sees. The agent logged
"cannot serve ... trying again" every second for ever, never registered again; it must exit so
that the kubelet restarts it with fresh mounts. Found by an adversarial review.

The container's view is made with a held directory handle: ``/proc/self/fd/N/...`` resolves to
the directory the handle was opened on, removed or not, as the container's mount does."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hami.dra.model import SliceSettings, slice_name
from hami.draplugin.api import load
from hami.draplugin.checkpoint import Checkpoint
from hami.draplugin.command import EXIT_PLUGIN_DIR, _serve
from hami.draplugin.plugin import Driver, PluginDirectoryGone, PluginServer, socket_paths
from hami.draplugin.prepare import Paths
from hami.node.settings import NodeSettings

from .test_agent_restart_dra_publish import _args
from .test_dra_plugin_grpc import GPUS, Claims

reg_pb, reg_grpc = load("registration")


@pytest.fixture
def root():
    d = Path(tempfile.mkdtemp(prefix="spd", dir="/tmp"))  # short: unix socket paths are limited
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _driver(root: Path) -> Driver:
    paths = Paths(hook_path=str(root / "usr"), lock_dir=str(root / "lock"), cdi_dir=str(root / "cdi"))
    return Driver("node-a", GPUS, SliceSettings(), Checkpoint(root / "state" / "checkpoint.json"), Claims().read, paths)


class Mounted:
    """The kubelet's two plugin directories on the "host" and the paths the "container" sees
    them by (held handles)."""

    def __init__(self, root: Path) -> None:
        self.registry, self.plugins = root / "plugins_registry", root / "plugins" / "gpu.hami.io"
        self.fds = []
        for d in (self.registry, self.plugins):
            d.mkdir(parents=True)
            self.fds.append(os.open(d, os.O_RDONLY | os.O_DIRECTORY))
        self.seen = [Path(f"/proc/self/fd/{fd}") for fd in self.fds]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


async def _info(reg_sock: Path) -> str:
    async with grpc.aio.insecure_channel(f"unix://{reg_sock}") as ch:
        return (await reg_grpc.RegistrationStub(ch).GetInfo(reg_pb.InfoRequest(), timeout=30)).endpoint


@pytest.mark.parametrize("which", [0, 1], ids=["plugins_registry", "plugins/gpu.hami.io"])
async def test_a_mounted_plugin_directory_removed_and_made_again_on_the_host_ends_the_agent(root, which):
    mounted = Mounted(root)
    reg_sock, dra_sock = mounted.seen[0] / "gpu.hami.io-reg.sock", mounted.seen[1] / "dra.sock"
    server = PluginServer(_driver(root), reg_sock, dra_sock)
    await server.start()
    try:
        await server.check()  # all in order: nothing raised
        assert await _info(reg_sock) == str(dra_sock)
        host = (mounted.registry, mounted.plugins)[which]
        shutil.rmtree(host)
        host.mkdir()  # the host's new directory, which the container does not see
        with pytest.raises(PluginDirectoryGone, match=f"{mounted.seen[which]} was removed under the agent"):
            await server.check()
        assert list(host.iterdir()) == []  # (nothing of the agent's reaches the new directory)
    finally:
        await server.stop()
        mounted.close()


async def test_a_plugin_directory_removed_and_made_again_on_an_agent_without_mounts_is_served_again(root):
    """An agent on the host sees the new directory at the path: it binds there again and goes on."""
    reg_sock, dra_sock = socket_paths(root / "kubelet")
    server = PluginServer(_driver(root), reg_sock, dra_sock)
    await server.start()
    try:
        shutil.rmtree(reg_sock.parent)
        reg_sock.parent.mkdir()
        await server.check()
        assert await _info(reg_sock) == str(dra_sock)
    finally:
        await server.stop()


async def test_the_watch_ends_when_a_plugin_directory_is_gone_and_goes_on_after_other_failures(root):
    server = PluginServer(_driver(root), *socket_paths(root / "kubelet"))
    calls = []

    async def check():
        calls.append(len(calls))
        if len(calls) == 1:
            raise OSError("a failure of one check")  # logged, the watch goes on
        if len(calls) == 2:
            raise PluginDirectoryGone("gone")
        raise asyncio.CancelledError  # (only reached when the watch swallowed the second)

    server.check = check  # type: ignore[method-assign]
    with pytest.raises(PluginDirectoryGone):
        await server.watch(poll=0)
    assert calls == [0, 1]


async def test_the_agent_exits_for_a_restart_when_its_registration_directory_is_removed_under_its_mount(
    tmp_path, caplog
):
    async def node(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Node", "metadata": {"name": "n1", "uid": "node-uid"}})

    async def get_slice(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "code": 404}, status=404)

    async def apply_slice(request: web.Request) -> web.Response:
        return web.json_response(await request.json())

    async def quiet(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)  # a watch that stays quiet
        return web.json_response({})

    slice_path = f"/apis/resource.k8s.io/v1/resourceslices/{slice_name('n1')}"
    app = web.Application()
    app.router.add_get("/api/v1/nodes/n1", node)
    app.router.add_get(slice_path, get_slice)
    app.router.add_patch(slice_path, apply_slice)
    app.router.add_get("/apis/resource.k8s.io/v1/resourceslices", quiet)
    app.router.add_get("/api/v1/nodes", quiet)
    api = TestServer(app)
    await api.start_server()
    loop = asyncio.get_running_loop()
    kubelet = Path(tempfile.mkdtemp(prefix="spk", dir="/tmp"))
    mounted = Mounted(kubelet / "host")
    (kubelet / "plugins").mkdir()
    (kubelet / "plugins_registry").symlink_to(mounted.seen[0])  # the container's mounts
    (kubelet / "plugins" / "gpu.hami.io").symlink_to(mounted.seen[1])
    reg_sock, _ = socket_paths(kubelet)

    async def remove_on_the_host() -> None:
        while not reg_sock.exists():  # the agent is serving
            await asyncio.sleep(0.05)
        shutil.rmtree(mounted.registry)
        mounted.registry.mkdir()

    remover = asyncio.ensure_future(remove_on_the_host())
    fallback = loop.call_later(30, os.kill, os.getpid(), signal.SIGTERM)  # only for the code that never ends
    try:
        with caplog.at_level(logging.ERROR, logger="hami.dra"):
            rc = await _serve(
                _args(tmp_path, str(api.make_url("")).rstrip("/"), kubelet), NodeSettings(), [], SliceSettings()
            )
    finally:
        fallback.cancel()
        remover.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await api.close()
        mounted.close()
        shutil.rmtree(kubelet, ignore_errors=True)
    assert rc == EXIT_PLUGIN_DIR
    assert any("exiting so that the container restarts with fresh mounts" in r.getMessage() for r in caplog.records)
