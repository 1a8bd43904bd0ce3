"""Every ``hami.io/`` wire name is spelled once: in ``hami.core.names``, or in the one vendor
module that owns it (issue 24, point 4).

The scan reads ``src/hami`` with ``ast``: every string constant and every literal part of an
f-string counts; docstrings do not (they are prose about the keys). Tests may spell wire values
literally: they are the compatibility check against HAMi's spellings.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from hami.core import names

SRC = Path(__file__).resolve().parents[2] / "src" / "hami"
NAMES = SRC / "core" / "names.py"
DOMAIN = "hami.io/"


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.add(id(first.value))
    return found


def wire_strings(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each string constant or f-string part holding ``hami.io/``, docstrings
    left out."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and DOMAIN in node.value
        and id(node) not in skip
    )


def owns_wire_names(path: Path) -> bool:
    """core/names.py, and each vendor's own module (not the shared vendor helpers)."""
    rel = path.relative_to(SRC)
    if rel == Path("core", "names.py"):
        return True
    return (
        len(rel.parts) == 2
        and rel.parts[0] == "vendors"
        and not rel.stem.startswith("_")
        and rel.stem not in ("base", "common")
    )


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "_pb2" not in p.name)


def test_the_scan_sees_constants_and_f_string_parts_but_not_docstrings():
    source = '"""About hami.io/x."""\nA = "hami.io/a"\ndef f(w):\n    """hami.io/doc"""\n    return f"hami.io/{w}-b"\n'
    assert wire_strings(source) == [(2, "hami.io/a"), (5, "hami.io/")]


def test_no_hami_io_name_outside_names_and_the_vendor_modules():
    stray = [
        f"{p.relative_to(SRC.parent)}:{line}: {text!r}"
        for p in _sources()
        if not owns_wire_names(p)
        for line, text in wire_strings(p.read_text())
    ]
    assert not stray, "spell these in hami/core/names.py (or the owning vendor module) and import them:\n" + "\n".join(
        stray
    )


def test_each_wire_string_is_spelled_in_one_place():
    where: dict[str, list[str]] = {}
    for p in _sources():
        if owns_wire_names(p):
            for line, text in wire_strings(p.read_text()):
                where.setdefault(text, []).append(f"{p.relative_to(SRC.parent)}:{line}")
    twice = {text: places for text, places in where.items() if len(places) > 1}
    assert not twice, f"spelled more than once: {twice}"


def test_names_values_are_unique_literals():
    tree = ast.parse(NAMES.read_text())
    literals = [
        node.value.value for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
    ]
    repeated = [v for v, n in Counter(literals).items() if n > 1]
    assert not repeated, f"hami/core/names.py spells these twice: {repeated}"
    public = {k: v for k, v in vars(names).items() if k.isupper() and not k.startswith("_") and isinstance(v, str)}
    aliases = {k for k, v in public.items() if list(public.values()).count(v) > 1}
    assert aliases == {"DRA_DRIVER", "DRA_SHARE_CLASS"}  # the one name with two roles, on purpose


def test_names_imports_nothing():
    tree = ast.parse(NAMES.read_text())
    imports = [node.lineno for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not imports, f"hami/core/names.py must stay floor 0 (imports at lines {imports})"


def test_every_public_name_has_its_role_in_the_docstring():
    doc = names.__doc__ or ""
    public = [k for k in vars(names) if not k.startswith("_") and (k.isupper() or callable(vars(names)[k]))]
    missing = [k for k in public if k not in doc]
    assert not missing, f"say who writes and who reads: {missing}"


@pytest.mark.parametrize(
    "got, want",
    [
        (names.node_handshake("dcu"), "hami.io/node-handshake-dcu"),
        (names.node_handshake("Ascend910B3"), "hami.io/node-handshake-Ascend910B3"),
        (names.devices_allocated("BI-V150"), "hami.io/BI-V150-devices-allocated"),
        (names.devices_to_allocate("Ascend910B3"), "hami.io/Ascend910B3-devices-to-allocate"),
        (names.use_uuid("Ascend310P"), "hami.io/use-Ascend310P-uuid"),
        (names.no_use_uuid("MR-V100"), "hami.io/no-use-MR-V100-uuid"),
        (names.NODE_HANDSHAKE, "hami.io/node-handshake"),
        (names.NODE_LOCK, "hami.io/mutex.lock"),
        (names.BIND_PHASE, "hami.io/bind-phase"),
        (names.VGPU_NODE, "hami.io/vgpu-node"),
    ],
)
def test_composed_and_shared_keys_keep_hamis_spelling(got, want):
    assert got == want


def env_names() -> set[str]:
    """The values of names.py's ``ENV_*`` constants."""
    tree = ast.parse(NAMES.read_text())
    return {
        node.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and any(isinstance(t, ast.Name) and t.id.startswith("ENV_") for t in node.targets)
    }


def env_strings(source: str, wanted: set[str]) -> list[tuple[int, str]]:
    """``(line, text)`` of each string constant (docstrings left out) that is one of ``wanted``."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in wanted
        and id(node) not in skip
    )


def test_the_env_names_the_product_writes_are_spelled_only_in_names():
    wanted = env_names()
    assert {
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_DISABLE_CONTROL",
        "NVIDIA_VISIBLE_DEVICES",
    } <= wanted
    stray = [
        f"{p.relative_to(SRC.parent)}:{line}: {text!r}"
        for p in _sources()
        if p != NAMES
        for line, text in env_strings(p.read_text(), wanted)
    ]
    assert not stray, "import these from hami/core/names.py:\n" + "\n".join(stray)


def test_the_env_scan_finds_a_planted_name():
    assert env_strings(
        '"""CUDA_DEVICE_SM_LIMIT"""\nenv["CUDA_DEVICE_SM_LIMIT"] = "50"\n', {"CUDA_DEVICE_SM_LIMIT"}
    ) == [(2, "CUDA_DEVICE_SM_LIMIT")]
