"""The layout's rules that import-linter cannot state (docs/development.md, "Layout").

import-linter (``make check``, contracts in pyproject.toml) holds the floors between packages.
This file holds what it does not see: names. A module never imports another module's
``_private`` name, and nothing in the product starts the test harness's binaries. Each rule is
checked on a small planted example too, so a rule that stopped finding anything would fail here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PRODUCT = SRC / "hami"

# Programs the test harness (devkit/) starts; the product only ever talks to them over the API.
HARNESS_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kwok", "kubelet", "containerd")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(module: str, is_package: bool, tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, "module.name")`` for each ``_private`` name (or ``_private`` module) imported from
    another module. ``__dunder__`` names are public."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(
                (node.lineno, alias.name)
                for alias in node.names
                if alias.name.startswith("hami")
                and any(p.startswith("_") and not p.startswith("__") for p in alias.name.split("."))
            )
        if not isinstance(node, ast.ImportFrom):
            continue
        source = resolve(module, is_package, node)
        if not source.startswith("hami") or source == module:
            continue
        hidden_module = any(p.startswith("_") and not p.startswith("__") for p in source.split("."))
        for alias in node.names:
            hidden_name = alias.name.startswith("_") and not alias.name.startswith("__")
            if hidden_module or hidden_name:
                found.append((node.lineno, f"{source}.{alias.name}"))
    return found


def harness_starts(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, text)`` for each string literal that is a harness binary's name (how a program to
    run is named); a path such as ``/var/lib/kubelet`` is a place, not a program."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in HARNESS_BINARIES:
                found.append((node.lineno, node.value))
    return found


def product_modules():
    for path in sorted(PRODUCT.rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        yield path, module_name(path), path.name == "__init__.py", ast.parse(path.read_text(), str(path))


def test_no_module_imports_another_modules_private_names():
    found = [
        f"{path.relative_to(SRC.parent)}:{line}: imports {name}"
        for path, module, is_package, tree in product_modules()
        for line, name in private_imports(module, is_package, tree)
    ]
    assert found == []


def test_nothing_in_the_product_starts_the_harness_binaries():
    found = [
        f"{path.relative_to(SRC.parent)}:{line}: {text!r}"
        for path, _, _, tree in product_modules()
        for line, text in harness_starts(tree)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("module", "is_package", "source", "expected"),
    [
        (
            "hami.ui.server",
            False,
            "from hami.scheduler.server import GUARD, _guarded",
            ["hami.scheduler.server._guarded"],
        ),
        ("hami.vendors.nvidia", False, "from .base import _lookup", ["hami.vendors.base._lookup"]),
        ("hami.vendors.nvidia", False, "from ._util import present", ["hami.vendors._util.present"]),
        ("hami.vendors", True, "from .base import _lookup", ["hami.vendors.base._lookup"]),
        ("hami.sim.dra", False, "from ..core import _x", ["hami.core._x"]),
        ("hami.core.fit", False, "from .fit import _phase", []),  # its own name
        ("hami.core.fit", False, "from hami.core import __version__", []),  # dunder is public
        ("hami.core.fit", False, "from hami.core.types import Device", []),
        ("hami.core.fit", False, "from os import _exit", []),  # not ours
        ("hami.vendors.nvidia", False, "import hami.vendors._util", ["hami.vendors._util"]),
        (
            "hami.sim.dra",
            False,
            "from .engine import flatten_objects, _checked, _objects",
            ["hami.sim.engine._checked", "hami.sim.engine._objects"],
        ),
        ("hami.core.fit", False, "from __future__ import annotations", []),
    ],
)
def test_private_import_rule_on_planted_sources(module, is_package, source, expected):
    assert [name for _, name in private_imports(module, is_package, ast.parse(source))] == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("run(['kube-apiserver', '--etcd-servers', url])", ["kube-apiserver"]),
        ("Popen([str(bin_dir / 'etcd'), '--data-dir', d])", ["etcd"]),
        ("log.info('etcd is slow')", []),
        ("KUBELET_DIR = '/var/lib/kubelet'", []),
    ],
)
def test_harness_rule_on_planted_sources(source, expected):
    assert [text for _, text in harness_starts(ast.parse(source))] == expected
