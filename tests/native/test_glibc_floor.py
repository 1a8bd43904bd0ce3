"""libvgpu runs inside every process of a container, on the image's C library, not the node's:
built on glibc >= 2.34 it asked for that glibc's symbol versions, and every process of a
container on an older image (Ubuntu 20.04, Debian 11, RHEL 8) failed to start. The library binds
each glibc symbol to a version every glibc since 2.17 provides (native/libvgpu/glibc_floor.h).
A container with glibc 2.31 running the library under a 1 GiB limit was checked by hand
(docs/libvgpu.md, "C library")."""

from __future__ import annotations

import re
import subprocess

import pytest

from .conftest import BUILD

pytestmark = pytest.mark.native

FLOOR = (2, 17)


def _required_versions(lib) -> dict[str, set[str]]:
    """GLIBC version -> the dynamic symbols that ask for it."""
    out = subprocess.run(["objdump", "-T", str(lib)], capture_output=True, text=True, check=True).stdout
    need: dict[str, set[str]] = {}
    for line in out.splitlines():
        m = re.search(r"\(?(GLIBC_[0-9.]+)\)?\s+(\S+)$", line)
        if m and "*UND*" in line:
            need.setdefault(m.group(1), set()).add(m.group(2))
    return need


def _version(tag: str) -> tuple[int, ...]:
    return tuple(int(x) for x in tag.removeprefix("GLIBC_").split("."))


def test_libvgpu_asks_for_no_glibc_newer_than_2_17():
    need = _required_versions(BUILD / "libvgpu.so")
    assert need, "objdump found no GLIBC symbol versions at all"
    newer = {tag: sorted(syms) for tag, syms in need.items() if _version(tag) > FLOOR}
    assert newer == {}, f"libvgpu.so needs a glibc newer than 2.17 for: {newer}"


def test_libvgpu_names_the_libraries_that_held_pthread_and_dl_before_2_34():
    """Before glibc 2.34 the pinned pthread and dl symbols live in libpthread.so.0 and libdl.so.2,
    which an image's process does not load by itself."""
    out = subprocess.run(["readelf", "-d", str(BUILD / "libvgpu.so")], capture_output=True, text=True, check=True)
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out.stdout))
    assert {"libpthread.so.0", "libdl.so.2", "libc.so.6"} <= needed, needed
