"""kubelet device plugin API v1beta1: protobuf and gRPC stubs.

The stubs are generated from ``api.proto`` at build time (``make proto``). When they are
missing (a fresh checkout run without make), :func:`load` generates them once with
grpcio-tools, writing through a temporary directory so concurrent first imports never see a
half-written file.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from pathlib import Path
from types import ModuleType

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

_HERE = Path(__file__).resolve().parent
_SRC = _HERE.parents[2]  # .../src
_STUBS = ("api_pb2.py", "api_pb2_grpc.py")


def generate(force: bool = False) -> None:
    """Write api_pb2.py and api_pb2_grpc.py next to api.proto (needs grpcio-tools)."""
    if not force and all((_HERE / name).exists() for name in _STUBS):
        return
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "the device plugin gRPC stubs are not generated and grpcio-tools is not installed; "
            "run `make proto` (or `pip install grpcio-tools`)"
        ) from exc
    include = Path(protoc.__file__).parent / "_proto"
    rel = _HERE.relative_to(_SRC) / "api.proto"
    with tempfile.TemporaryDirectory(dir=_HERE) as tmp:
        code = protoc.main(
            ["protoc", f"-I{_SRC}", f"-I{include}", f"--python_out={tmp}", f"--grpc_python_out={tmp}", str(rel)]
        )
        if code != 0:
            raise RuntimeError(f"protoc failed on {rel} (exit {code})")
        for name in _STUBS:
            os.replace(Path(tmp) / rel.parent / name, _HERE / name)


def load() -> tuple[ModuleType, ModuleType]:
    """Return (api_pb2, api_pb2_grpc), generating them first if needed."""
    generate()
    pb2 = importlib.import_module(f"{__name__}.api_pb2")
    pb2_grpc = importlib.import_module(f"{__name__}.api_pb2_grpc")
    return pb2, pb2_grpc


if __name__ == "__main__":
    generate(force=True)
