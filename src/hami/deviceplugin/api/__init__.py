"""kubelet device plugin API v1beta1: protobuf and gRPC stubs.

The stubs are generated from ``api.proto`` at build time (``make proto``,
:mod:`hami.protostubs`). When they are missing (a fresh checkout run without make),
:func:`load` generates them once with grpcio-tools.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

_HERE = Path(__file__).resolve().parent


def generate(force: bool = False) -> None:
    """Compile api.proto next to this file (needs grpcio-tools)."""
    from hami.protostubs import compile_protos

    compile_protos(_HERE, ("api",), "the device plugin gRPC stubs", force)


def load() -> tuple[ModuleType, ModuleType]:
    """Return (api_pb2, api_pb2_grpc), generating them first if needed."""
    generate()
    pb2 = importlib.import_module(f"{__name__}.api_pb2")
    pb2_grpc = importlib.import_module(f"{__name__}.api_pb2_grpc")
    return pb2, pb2_grpc
