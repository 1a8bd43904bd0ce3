"""The gRPC side: the ``DevicePlugin`` service on our socket and registration with the kubelet.

``PluginServer`` serves on ``<plugin dir>/<socket>``, registers for the resource with the
kubelet's ``Registration`` service on ``<plugin dir>/kubelet.sock``, and watches both files:
when the kubelet restarts it deletes the plugin sockets and creates a new ``kubelet.sock``,
so a vanished socket means "serve again", a new ``kubelet.sock`` means "register again".
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Awaitable, Callable

import grpc

from .allocate import AllocationError, ContainerResponse
from .allocator import Allocator, preferred_allocation
from .api import API_VERSION, HEALTHY, KUBELET_SOCKET, UNHEALTHY, load
from .devices import DeviceState

log = logging.getLogger(__name__)
pb, pb_grpc = load()
#: at shutdown, how long the calls in flight may take to finish: an Allocate cut off had the
#: kubelet fail the pod it was admitting (a DaemonSet rollout under load) and left the pod
#: ``allocating`` with the node lock held. Allocate normally takes milliseconds; ListAndWatch
#: ends within its one-second wait once ``closing`` is set.
STOP_GRACE_S = 5.0


def list_response(state: DeviceState):
    devices = []
    for dev_id, healthy, numa in state.kubelet_devices():
        dev = pb.Device(ID=dev_id, health=HEALTHY if healthy else UNHEALTHY)
        if numa is not None:
            dev.topology.nodes.add(ID=numa)
        devices.append(dev)
    return pb.ListAndWatchResponse(devices=devices)


def container_response(r: ContainerResponse):
    return pb.ContainerAllocateResponse(
        envs=r.envs,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only) for m in r.mounts
        ],
        annotations=r.annotations,
        cdi_devices=[pb.CDIDevice(name=n) for n in r.cdi_devices],
        devices=[
            pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in r.devices
        ],
    )


class DevicePluginService(pb_grpc.DevicePluginServicer):
    def __init__(self, state: DeviceState, allocator: Allocator) -> None:
        self.state = state
        self.allocator = allocator
        self.closing = asyncio.Event()

    async def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions(
            pre_start_required=False,
            get_preferred_allocation_available=self.state.settings.enable_preferred_allocation,
        )

    async def ListAndWatch(self, request, context):
        seen = self.state.version
        yield list_response(self.state)
        while not self.closing.is_set():
            version = await self.state.wait_change(seen, timeout=1.0)
            if version != seen:
                seen = version
                yield list_response(self.state)

    async def GetPreferredAllocation(self, request, context):
        reqs = [
            (list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size)
            for r in request.container_requests
        ]
        chosen = await preferred_allocation(self.allocator, reqs)
        return pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in chosen]
        )

    async def Allocate(self, request, context):
        try:
            responses = await self.allocator.allocate([len(r.devices_ids) for r in request.container_requests])
        except AllocationError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.AllocateResponse(container_responses=[container_response(r) for r in responses])

    async def PreStartContainer(self, request, context):
        return pb.PreStartContainerResponse()


async def register_with_kubelet(
    plugin_dir: Path, endpoint: str, resource: str, preferred: bool, timeout: float = 5.0
) -> None:
    async with grpc.aio.insecure_channel(f"unix://{plugin_dir / KUBELET_SOCKET}") as channel:
        stub = pb_grpc.RegistrationStub(channel)
        await stub.Register(
            pb.RegisterRequest(
                version=API_VERSION,
                endpoint=endpoint,
                resource_name=resource,
                options=pb.DevicePluginOptions(get_preferred_allocation_available=preferred),
            ),
            timeout=timeout,
        )


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


class PluginServer:
    """Serve, register, and keep both alive across kubelet restarts (bounded poll loop)."""

    def __init__(
        self,
        plugin_dir: str | os.PathLike,
        state: DeviceState,
        allocator: Allocator,
        poll: float = 1.0,
        on_registered: Callable[[], Awaitable[None]] | None = None,
        service=None,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.state = state
        self.settings = state.settings
        self.socket = self.plugin_dir / self.settings.socket_name
        #: the DevicePlugin service (default: the shared-GPU one; static_mig.py passes its own)
        self.service = service if service is not None else DevicePluginService(state, allocator)
        self.poll = poll
        self.on_registered = on_registered
        self.registrations = 0
        self._server: grpc.aio.Server | None = None
        self._kubelet: tuple[int, int] | None = None
        self._serve_failed = False  # the last serve() failed (logged once until it works)

    async def serve(self) -> None:
        if self.socket.exists() or self.socket.is_symlink():
            self.socket.unlink()
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server
        log.info("serving %s on %s", self.settings.resource_name, self.socket)

    async def register(self) -> bool:
        ident = _identity(self.plugin_dir / KUBELET_SOCKET)
        if ident is None:
            return False
        try:
            await register_with_kubelet(
                self.plugin_dir,
                self.socket.name,
                self.settings.resource_name,
                self.settings.enable_preferred_allocation,
            )
        except grpc.aio.AioRpcError as exc:
            log.error("registration with the kubelet failed: %s %s", exc.code().name, exc.details())
            return False
        self._kubelet = ident
        self.registrations += 1
        log.info("registered %s with the kubelet (%d)", self.settings.resource_name, self.registrations)
        if self.on_registered:
            await self.on_registered()
        return True

    async def stop_serving(self, grace: float = 0.5) -> None:
        if self._server is not None:
            await self._server.stop(grace=grace)
            self._server = None

    async def check(self) -> None:
        """One watch step: re-serve if our socket vanished, re-register if the kubelet changed."""
        if not self.socket.exists():
            if self._server is not None:
                log.warning("socket %s disappeared (kubelet restart?); serving again", self.socket)
                await self.stop_serving()
                self._kubelet = None
            try:
                await self.serve()
            except (RuntimeError, OSError) as exc:
                # the directory itself is gone (a kubelet restart that removed it, not yet made
                # again): raised out of run(), this stopped the plugin; try again next step
                if not self._serve_failed:
                    log.error("cannot serve on %s (%s); trying again every %gs", self.socket, exc, self.poll)
                self._serve_failed = True
                return
            self._serve_failed = False
        ident = _identity(self.plugin_dir / KUBELET_SOCKET)
        if ident is not None and ident != self._kubelet:
            await self.register()

    async def run(self) -> None:
        """Serve and watch until cancelled; always stops the gRPC server on the way out."""
        await self.serve()
        try:
            await self.register()
            while True:
                await asyncio.sleep(self.poll)
                await self.check()
        finally:
            self.service.closing.set()
            await self.stop_serving(grace=STOP_GRACE_S)
            try:
                self.socket.unlink()
            except FileNotFoundError:
                pass
