"""An NRI plugin client: hami as a plugin of the container runtime's Node Resource Interface
(containerd >= 1.7, CRI-O >= 1.26), written on asyncio without the Go stub.

What NRI is on the wire (containerd/nri v0.8.0, what containerd 1.7.35 vendors): one unix
socket (``/var/run/nri/nri.sock`` by default), the plugin dials it. Over it run two logical
connections, multiplexed (``pkg/net/multiplex``): connection 1, where the runtime calls the
plugin (``nri.pkg.api.v1alpha1.Plugin``: Configure, Synchronize, CreateContainer, ...), and
connection 2, where the plugin calls the runtime (``nri.pkg.api.v1alpha1.Runtime``:
RegisterPlugin). Each carries ttrpc (containerd's small RPC protocol, not gRPC).

* :mod:`.ttrpc`: the multiplex framing and ttrpc's request/response over it (:class:`Mux`,
  :class:`Endpoint`); no NRI knowledge.
* :mod:`.plugin`: the NRI plugin: register, answer Configure / Synchronize / Shutdown, hand
  CreateContainer to a :class:`ContainerHook`, reconnect when the runtime goes away.

Not here: what a container is given (``hami.deviceplugin.nri``, from the libvgpu container
contract). The protobuf messages are compiled from ``nri.proto`` and ``ttrpc.proto`` beside this
file (``make proto``, :mod:`hami.protostubs`; generated files are git-ignored).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

_HERE = Path(__file__).resolve().parent

#: where containerd and CRI-O listen for NRI plugins unless configured otherwise
DEFAULT_SOCKET = "/var/run/nri/nri.sock"


def generate(force: bool = False) -> None:
    """Compile nri.proto and ttrpc.proto next to this file (needs grpcio-tools)."""
    from hami.protostubs import compile_protos

    compile_protos(_HERE, ("ttrpc", "nri"), "the NRI protobuf messages", force)


def load() -> tuple[ModuleType, ModuleType]:
    """Return (ttrpc_pb2, nri_pb2), generating them first if needed."""
    generate()
    return importlib.import_module(f"{__name__}.ttrpc_pb2"), importlib.import_module(f"{__name__}.nri_pb2")
