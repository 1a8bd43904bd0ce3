"""kubelet APIs of a DRA driver: DRA plugin v1 and plugin registration v1 (protobuf + gRPC stubs).

``dra.proto`` and ``registration.proto`` are compiled with grpcio-tools at build time
(``make proto``); when the stubs are missing (a fresh checkout run without make), :func:`load`
generates them once, through a temporary directory so that concurrent first imports never read a
half-written file. Generated files are git-ignored.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from pathlib import Path
from types import ModuleType

DRA_SERVICE = "v1.DRAPlugin"  # what the plugin advertises in PluginInfo.supported_versions
PLUGIN_TYPE = "DRAPlugin"

_HERE = Path(__file__).resolve().parent
_SRC = _HERE.parents[2]  # .../src
_PROTOS = ("dra", "registration")


def _stubs(proto: str) -> tuple[str, str]:
    return f"{proto}_pb2.py", f"{proto}_pb2_grpc.py"


def generate(force: bool = False) -> None:
    """Write <proto>_pb2.py and <proto>_pb2_grpc.py next to each .proto (needs grpcio-tools)."""
    if not force and all((_HERE / n).exists() for p in _PROTOS for n in _stubs(p)):
        return
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "the DRA gRPC stubs are not generated and grpcio-tools is not installed; "
            "run `make proto` (or `pip install grpcio-tools`)"
        ) from exc
    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(dir=_HERE) as tmp:
        for proto in _PROTOS:
            rel = _HERE.relative_to(_SRC) / f"{proto}.proto"
            code = protoc.main(["protoc", f"-I{_SRC}", f"-I{include}", f"--python_out={tmp}",
                                f"--grpc_python_out={tmp}", str(rel)])
            if code != 0:
                raise RuntimeError(f"protoc failed on {rel} (exit {code})")
            for name in _stubs(proto):
                os.replace(Path(tmp) / rel.parent / name, _HERE / name)


def load(proto: str) -> tuple[ModuleType, ModuleType]:
    """(pb2, pb2_grpc) of ``proto`` ("dra" or "registration"), generating the stubs if needed."""
    if proto not in _PROTOS:
        raise ValueError(f"unknown proto {proto!r}; expected one of {_PROTOS}")
    generate()
    return (importlib.import_module(f"{__name__}.{proto}_pb2"),
            importlib.import_module(f"{__name__}.{proto}_pb2_grpc"))


if __name__ == "__main__":
    generate(force=True)
