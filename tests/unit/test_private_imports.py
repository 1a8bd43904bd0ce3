"""No module of ``hami.vendors`` or ``hami.sim`` imports another module's private (``_name``) names
or a private module: what they share is public in the module that owns it (``vendors.base.lookup``,
``vendors.common``, ``sim.engine.flatten_objects`` / ``check_document``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hami

SRC = Path(hami.__file__).parent


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(path: Path) -> list[str]:
    """``file:line: what`` for every ``from X import _name`` and every import of a ``_module``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if any(_private(part) for part in (node.module or "").split(".")):
                out.append(f"{path.name}:{node.lineno}: from {module} import ...")
            out.extend(f"{path.name}:{node.lineno}: from {module} import {a.name}" for a in node.names
                       if _private(a.name))
        elif isinstance(node, ast.Import):
            out.extend(f"{path.name}:{node.lineno}: import {a.name}" for a in node.names
                       if any(_private(part) for part in a.name.split(".")))
    return out


@pytest.mark.parametrize("package", ["vendors", "sim"])
def test_no_private_names_cross_modules(package):
    found = [hit for path in sorted((SRC / package).rglob("*.py")) for hit in private_imports(path)]
    assert found == []


@pytest.mark.parametrize("source, hits", [
    ("from .base import lookup\n", 0),
    ("from .base import _lookup\n", 1),
    ("from ._util import present\n", 1),
    ("from .engine import flatten_objects, _checked, _objects\n", 2),
    ("import hami.vendors._util\n", 1),
    ("from __future__ import annotations\n", 0),
])
def test_the_scan_sees_private_imports(tmp_path, source, hits):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert len(private_imports(path)) == hits
