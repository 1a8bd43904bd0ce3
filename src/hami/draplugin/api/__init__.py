"""kubelet APIs of a DRA driver: DRA plugin v1, plugin registration v1 and resource health
v1alpha1 (protobuf + gRPC stubs).

``dra.proto``, ``registration.proto`` and ``dra_health.proto`` are compiled with grpcio-tools at build time
(``make proto``, :mod:`hami.protostubs`); when the stubs are missing (a fresh checkout run without
make), :func:`load` generates them once.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

DRA_SERVICE = "v1.DRAPlugin"  # what the plugin advertises in PluginInfo.supported_versions
PLUGIN_TYPE = "DRAPlugin"
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"  # KEP-4680: the kubelet's device health stream

_HERE = Path(__file__).resolve().parent
_PROTOS = ("dra", "registration", "dra_health")


def generate(force: bool = False) -> None:
    """Compile the protos next to this file (needs grpcio-tools)."""
    from hami.protostubs import compile_protos

    compile_protos(_HERE, _PROTOS, "the DRA gRPC stubs", force)


def load(proto: str) -> tuple[ModuleType, ModuleType]:
    """(pb2, pb2_grpc) of ``proto`` ("dra", "registration" or "dra_health"), generating the stubs if needed."""
    if proto not in _PROTOS:
        raise ValueError(f"unknown proto {proto!r}; expected one of {_PROTOS}")
    generate()
    return (importlib.import_module(f"{__name__}.{proto}_pb2"), importlib.import_module(f"{__name__}.{proto}_pb2_grpc"))
