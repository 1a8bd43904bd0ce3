"""kubelet APIs of a DRA driver: DRA plugin v1 and plugin registration v1 (protobuf + gRPC stubs).

``dra.proto`` and ``registration.proto`` are compiled with grpcio-tools at build time
(``make proto``, :mod:`hami.protostubs`); when the stubs are missing (a fresh checkout run without
make), :func:`load` generates them once.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

DRA_SERVICE = "v1.DRAPlugin"  # what the plugin advertises in PluginInfo.supported_versions
PLUGIN_TYPE = "DRAPlugin"

_HERE = Path(__file__).resolve().parent
_PROTOS = ("dra", "registration")


def generate(force: bool = False) -> None:
    """Compile dra.proto and registration.proto next to this file (needs grpcio-tools)."""
    from hami.protostubs import compile_protos

    compile_protos(_HERE, _PROTOS, "the DRA gRPC stubs", force)


def load(proto: str) -> tuple[ModuleType, ModuleType]:
    """(pb2, pb2_grpc) of ``proto`` ("dra" or "registration"), generating the stubs if needed."""
    if proto not in _PROTOS:
        raise ValueError(f"unknown proto {proto!r}; expected one of {_PROTOS}")
    generate()
    return (importlib.import_module(f"{__name__}.{proto}_pb2"), importlib.import_module(f"{__name__}.{proto}_pb2_grpc"))
