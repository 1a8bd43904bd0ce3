"""The gRPC stubs of the kubelet APIs hami serves, compiled from the ``.proto`` files kept in
the package: the device plugin API (``hami/deviceplugin/api``) and the DRA plugin and plugin
registration APIs (``hami/draplugin/api``), and the protobuf messages of the NRI plugin API and
its ttrpc envelope (``hami/node/nri``; no gRPC service there).

``make proto`` and the image build compile them with grpcio-tools (the image runs this file as
a script, before hami is installed: it needs nothing but the standard library and grpc_tools);
when they are missing (a fresh checkout run without make) each API package compiles its own on
first use. Output goes through a temporary directory so that concurrent first imports never
read a half-written file. Generated files are git-ignored.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_SRC = Path(__file__).resolve().parents[1]  # .../src
#: package directory (under src/hami) -> the protos in it
STUB_SETS = {
    "deviceplugin/api": ("api",),
    "draplugin/api": ("dra", "registration", "dra_health"),
    "node/nri": ("ttrpc", "nri"),  # messages only: NRI speaks ttrpc, hami.node.nri.ttrpc frames it
}


def stub_names(proto: str) -> tuple[str, str]:
    return f"{proto}_pb2.py", f"{proto}_pb2_grpc.py"


def compile_protos(here: Path, protos: tuple[str, ...], what: str, force: bool = False) -> None:
    """Write ``<proto>_pb2.py`` and ``<proto>_pb2_grpc.py`` next to each ``<proto>.proto`` in
    ``here`` unless they exist (or ``force``); ``what`` names them in the error without grpcio-tools."""
    if not force and all((here / n).exists() for p in protos for n in stub_names(p)):
        return
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            f"{what} are not generated and grpcio-tools is not installed; "
            "run `make proto` (or `pip install grpcio-tools`)"
        ) from exc
    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(dir=here) as tmp:
        for proto in protos:
            rel = here.relative_to(_SRC) / f"{proto}.proto"
            code = protoc.main(
                ["protoc", f"-I{_SRC}", f"-I{include}", f"--python_out={tmp}", f"--grpc_python_out={tmp}", str(rel)]
            )
            if code != 0:
                raise RuntimeError(f"protoc failed on {rel} (exit {code})")
            for name in stub_names(proto):
                os.replace(Path(tmp) / rel.parent / name, here / name)


def main() -> None:
    for package, protos in STUB_SETS.items():
        compile_protos(_SRC / "hami" / package, protos, f"the gRPC stubs of hami/{package}", force=True)


if __name__ == "__main__":
    main()
