"""The product ships the product only: the test harness (``devkit/``, import package
``hami_devkit``) stays out of the hami wheel, out of ``hami``'s command table and out of every
import under ``src/hami``.

The wheels are built for real, from a copy of the files the build reads (``pyproject.toml``,
``README.md``, ``src/`` and, beside them as in the repository, ``devkit/``), with the installed
setuptools' PEP 517 backend in a subprocess: no network, no build isolation, nothing written into
the checkout. The harness may import ``hami``; the other direction is what these tests refuse.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hami.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[2]
PRODUCT = REPO / "src" / "hami"
HARNESS = "hami_devkit"
# what the harness starts; a product module has no business naming one as a program to run
HARNESS_PROGRAMS = {
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "containerd",
    "runc",
    "kwok",
    "kube-proxy",
}
_BUILD = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")


def _wheel(tree: Path, out: Path) -> zipfile.ZipFile:
    proc = subprocess.run(
        [sys.executable, "-c", _BUILD, str(out)], cwd=tree, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return zipfile.ZipFile(out / proc.stdout.strip().splitlines()[-1])


def _entry_points(wheel: zipfile.ZipFile) -> str:
    (name,) = [name for name in wheel.namelist() if name.endswith(".dist-info/entry_points.txt")]
    return wheel.read(name).decode()


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools")
    root = tmp_path_factory.mktemp("checkout")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, root / name)
    for name in ("src", "devkit"):
        shutil.copytree(REPO / name, root / name, ignore=_SKIP)
    return root


@pytest.fixture(scope="module")
def product_wheel(tree, tmp_path_factory):
    with _wheel(tree, tmp_path_factory.mktemp("wheel")) as wheel:
        yield wheel


def test_the_product_wheel_holds_no_harness(product_wheel):
    names = product_wheel.namelist()
    assert "hami/cli.py" in names and "hami/deviceplugin/allocate.py" in names
    harness = [name for name in names if name.startswith(("hami/dev/", f"{HARNESS}/")) or "kubelet_standin" in name]
    assert harness == []


def test_the_product_wheel_installs_no_harness_command(product_wheel):
    scripts = _entry_points(product_wheel)
    assert "hami = hami.cli:main" in scripts
    assert "hami-dev" not in scripts and HARNESS not in scripts


def test_the_harness_wheel_holds_the_harness(tree, tmp_path):
    with _wheel(tree / "devkit", tmp_path) as wheel:
        names = wheel.namelist()
        assert {
            f"{HARNESS}/command.py",
            f"{HARNESS}/__main__.py",
            f"{HARNESS}/kubelet_standin.py",
            f"{HARNESS}/cluster.py",
            f"{HARNESS}/images.py",
        } <= set(names)
        assert [name for name in names if name.startswith("hami/")] == []
        assert "hami-dev = hami_devkit.command:main" in _entry_points(wheel)


def test_hami_has_no_dev_command(capsys):
    assert "dev" not in COMMANDS
    assert not [module for module, _ in COMMANDS.values() if not module.startswith("hami.")]
    with pytest.raises(SystemExit) as exit_:
        main(["dev", "cluster", "up"])
    assert exit_.value.code == 2 and "invalid choice: 'dev'" in capsys.readouterr().err


def _product_modules():
    for path in sorted(PRODUCT.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _harness_name(name: str) -> bool:
    return name.split(".")[0] == HARNESS or name == "hami.dev" or name.startswith("hami.dev.")


def test_the_product_never_imports_the_harness():
    """``import``/``from`` statements, and strings that could name a module to import (the
    command table imports its modules by name)."""
    found = []
    for path, module in _product_modules():
        for node in ast.walk(module):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value]
            else:
                continue
            found += [f"{path.relative_to(REPO)}:{node.lineno}: {name}" for name in names if _harness_name(name)]
    assert found == []


def test_the_product_starts_no_harness_program():
    found = [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}"
        for path, module in _product_modules()
        for node in ast.walk(module)
        if isinstance(node, ast.Constant) and node.value in HARNESS_PROGRAMS
    ]
    assert found == []


def test_the_product_tree_has_no_harness_modules():
    assert not (PRODUCT / "dev").exists() or not list((PRODUCT / "dev").rglob("*.py"))
    assert not (PRODUCT / "deviceplugin" / "kubelet_standin.py").exists()


def test_the_image_build_leaves_the_harness_out():
    """The image installs the product wheel only; its build context does not even carry devkit/."""
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "devkit" in ignored
    copies = [line for line in (REPO / "Containerfile").read_text().splitlines() if line.startswith("COPY ")]
    assert copies and not [line for line in copies if "devkit" in line]


def test_both_packages_build_with_the_same_pinned_backend():
    import tomllib

    product, harness = (
        tomllib.loads((REPO / path).read_text()) for path in ("pyproject.toml", "devkit/pyproject.toml")
    )
    assert product["build-system"] == harness["build-system"]
    assert [req for req in product["build-system"]["requires"] if req.startswith("setuptools==")]
    assert product["tool"]["setuptools"]["packages"]["find"]["include"] == ["hami", "hami.*"]
    assert harness["project"]["scripts"] == {"hami-dev": "hami_devkit.command:main"}
