"""hami.malloc: glibc's mmap threshold fixed at start of the long-running programs."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from hami import malloc

GLIBC = sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


def test_a_users_own_setting_is_kept():
    assert malloc.tune({malloc.ENV: "65536"}) is False


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_on_glibc_the_threshold_is_fixed_so_a_large_block_freed_does_not_move_it():
    """A 1 MiB block freed raises glibc's dynamic threshold: a later 512 KiB block then comes
    from the heap (brk grows). With the threshold fixed it gets its own mapping again."""
    probe = (
        "import ctypes, sys\n"
        "from hami import malloc\n"
        "libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p; libc.sbrk.restype = ctypes.c_void_p\n"
        "libc.free.argtypes = (ctypes.c_void_p,); libc.sbrk.argtypes = (ctypes.c_long,)\n"
        "if sys.argv[1] == 'tuned': assert malloc.tune({})\n"
        "libc.free(libc.malloc(1 << 20))\n"
        "before = libc.sbrk(0); blocks = [libc.malloc(512 << 10) for _ in range(8)]\n"
        "print(libc.sbrk(0) - before)\n"
    )
    grown = {}
    for mode in ("default", "tuned"):
        out = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True, check=True)
        grown[mode] = int(out.stdout.strip())
    assert grown["default"] >= 8 * (512 << 10), grown  # from the heap: the threshold had moved
    assert grown["tuned"] < 512 << 10, grown  # each block its own mapping
