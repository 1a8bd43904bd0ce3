"""Start-up checks that refuse to run next to another plugin serving the same GPUs (A14).

Every live socket in the kubelet device-plugin directory (other than ``kubelet.sock``) is
asked for its device list. If it advertises any of this node's GPU UUIDs (the NVIDIA device
plugin does, as ``GPU-…`` IDs), or if a live process already serves our socket name, the
plugin refuses to start with a message that says what to turn off. Dead sockets left by a
previous run are ignored.
"""

from __future__ import annotations

import logging
import stat
from pathlib import Path
from typing import Iterable

import grpc

from .api import KUBELET_SOCKET, load
from .devices import physical_id

log = logging.getLogger(__name__)


class PreflightError(RuntimeError):
    pass


def _sockets(plugin_dir: Path) -> list[Path]:
    out = []
    for entry in sorted(plugin_dir.iterdir()) if plugin_dir.is_dir() else []:
        try:
            if entry.name != KUBELET_SOCKET and stat.S_ISSOCK(entry.stat().st_mode):
                out.append(entry)
        except OSError:
            continue
    return out


async def _advertised(path: Path, timeout: float) -> list[str] | None:
    """The device IDs a plugin on ``path`` advertises; None when nothing live answers."""
    pb, pb_grpc = load()
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        call = stub.ListAndWatch(pb.Empty(), timeout=timeout)
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return None
            return []  # something live that is not a device plugin we can read
        finally:
            call.cancel()
        if first is grpc.aio.EOF:
            return []
        return [d.ID for d in first.devices]


async def check_other_plugins(
    plugin_dir: str | Path, our_socket: str, uuids: Iterable[str], resource: str, timeout: float = 2.0
) -> None:
    """Raise :class:`PreflightError` if another live plugin serves these GPUs or our socket."""
    ours = set(uuids)
    for sock in _sockets(Path(plugin_dir)):
        ids = await _advertised(sock, timeout)
        if ids is None:
            log.info("preflight: %s is not live (stale socket); ignored", sock)
            continue
        if sock.name == our_socket:
            raise PreflightError(
                f"another process is already serving {sock}; stop the other device plugin for {resource} "
                "(e.g. a second hami device-plugin or the NVIDIA device plugin) before starting this one"
            )
        clash = sorted({physical_id(i) for i in ids} & ours)
        if clash:
            raise PreflightError(
                f"the device plugin on {sock} already advertises this node's GPUs ({', '.join(clash[:3])}); "
                f"two plugins must not serve {resource} on one node. Disable the NVIDIA device plugin "
                "(GPU Operator: devicePlugin.enabled=false, or label the node so its DaemonSet skips it), "
                "then start hami device-plugin again"
            )
