"""A stand-in for the kubelet's device manager, for tests and local runs without a kubelet.

It serves ``Registration`` on ``<dir>/kubelet.sock``; when a plugin registers it opens the
plugin's socket, follows ``ListAndWatch`` and, like the kubelet, allocates per container:
it picks free healthy IDs (asking ``GetPreferredAllocation`` when the plugin offers it),
then calls ``Allocate`` with one container request. ``restart()`` behaves like a kubelet
restart: the sockets in the directory are removed and ``kubelet.sock`` comes back.
"""

from __future__ import annotations

import asyncio
import logging
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

import grpc

from hami.deviceplugin.api import HEALTHY, KUBELET_SOCKET, load

log = logging.getLogger(__name__)
pb, pb_grpc = load()


@dataclass
class PluginEndpoint:
    resource: str
    endpoint: str
    options: object
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    updates: int = 0
    channel: grpc.aio.Channel | None = None
    stub: object = None
    watcher: asyncio.Task | None = None


class KubeletStandIn:
    def __init__(
        self, plugin_dir: str | Path, on_devices: Callable[[str, dict[str, str]], Awaitable[None]] | None = None
    ) -> None:
        self.dir = Path(plugin_dir)
        self.on_devices = on_devices
        self.plugins: dict[str, PluginEndpoint] = {}
        self.registrations: list[tuple[str, str]] = []
        self.in_use: set[str] = set()
        self.allocated: list[list[str]] = []  # kubelet IDs passed to each Allocate, in order
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()

    # ------------------------------------------------------------------ Registration service
    async def Register(self, request, context):
        ep = PluginEndpoint(request.resource_name, request.endpoint, request.options)
        old = self.plugins.get(request.resource_name)
        if old is not None:
            await self._close(old)
        self.plugins[request.resource_name] = ep
        self.registrations.append((request.resource_name, request.endpoint))
        ep.channel = grpc.aio.insecure_channel(f"unix://{self.dir / request.endpoint}")
        ep.stub = pb_grpc.DevicePluginStub(ep.channel)
        ep.watcher = asyncio.create_task(self._watch(ep))
        return pb.Empty()

    async def _watch(self, ep: PluginEndpoint) -> None:
        try:
            async for resp in ep.stub.ListAndWatch(pb.Empty()):
                ep.devices = {d.ID: d.health for d in resp.devices}
                ep.updates += 1
                if self.on_devices:
                    await self.on_devices(ep.resource, dict(ep.devices))
                async with self._changed:
                    self._changed.notify_all()
        except grpc.aio.AioRpcError as exc:
            log.info("ListAndWatch for %s ended: %s", ep.resource, exc.code().name)
        except asyncio.CancelledError:
            pass

    async def _close(self, ep: PluginEndpoint) -> None:
        if ep.watcher:
            ep.watcher.cancel()
            await asyncio.gather(ep.watcher, return_exceptions=True)
        if ep.channel:
            await ep.channel.close()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` holds (re-checked on every device update and every 50 ms)."""

        async def loop():
            while not predicate():
                async with self._changed:
                    try:
                        await asyncio.wait_for(self._changed.wait(), 0.05)
                    except TimeoutError:
                        pass

        await asyncio.wait_for(loop(), timeout)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        sock = self.dir / KUBELET_SOCKET
        if sock.exists():
            sock.unlink()
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{sock}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        for ep in list(self.plugins.values()):
            await self._close(ep)
        self.plugins.clear()
        if self._server is not None:
            await self._server.stop(grace=0.2)
            self._server = None

    async def restart(self) -> None:
        """Like a kubelet restart: drop plugins, delete every socket in the dir, serve again."""
        await self.stop()
        for entry in self.dir.iterdir():
            try:
                if stat.S_ISSOCK(entry.stat().st_mode):
                    entry.unlink()
            except FileNotFoundError:
                pass
        self.in_use.clear()
        await self.start()

    # ------------------------------------------------------------------ admission
    def free_ids(self, resource: str) -> list[str]:
        ep = self.plugins[resource]
        return [i for i, h in ep.devices.items() if h == HEALTHY and i not in self.in_use]

    async def allocate_container(self, resource: str, count: int, timeout: float = 10.0):
        """Pick ``count`` free IDs and call Allocate for one container; returns its response."""
        ep = self.plugins[resource]
        free = self.free_ids(resource)
        if len(free) < count:
            raise RuntimeError(f"{resource}: requested {count}, available {len(free)}")
        ids = free[:count]
        if ep.options.get_preferred_allocation_available:
            pref = await ep.stub.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(available_deviceIDs=free, allocation_size=count)
                    ]
                ),
                timeout=timeout,
            )
            ids = list(pref.container_responses[0].deviceIDs) or ids
        resp = await ep.stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=timeout
        )
        self.in_use.update(ids)
        self.allocated.append(ids)
        return resp.container_responses[0]

    async def admit_pod(self, resource: str, counts: list[int], timeout: float = 10.0) -> list:
        """Allocate for each container (init first, then regular) that asks for ``resource``."""
        return [await self.allocate_container(resource, n, timeout) for n in counts if n > 0]
