"""glibc's allocator, set for programs that run for weeks under churn.

glibc serves a request above its mmap threshold (128 KiB at start) with its own mapping, given
back at ``free``; but each time such a block is freed the threshold rises to its size (up to
32 MiB). After the first large JSON documents (a LIST answer, a UI document) have come and gone,
blocks of that size are carved from the main heap instead, and the holes they leave between
long-lived objects are rarely reused whole: the heap grows while what is in use stays flat. Seen
in the DRA front-end soak (bench/bench_soak.py, 26 Nov): the scheduler's heap grew 3.3 MB over
4,500 pod cycles with 0.3 MB more in use (``malloc_stats``), Python's own objects flat
(tracemalloc), RSS +0.5 MiB per 1,000 cycles.

:func:`tune` fixes the threshold (which also stops the trim threshold from moving), so large
blocks keep their own mappings. A user who sets ``MALLOC_MMAP_THRESHOLD_`` keeps their value.
Elsewhere than glibc on Linux it does nothing. Standard library only."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD = 128 * 1024  # glibc's starting value, kept for good
ENV = "MALLOC_MMAP_THRESHOLD_"


def tune(env: Mapping[str, str] | None = None) -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD`; True when it was set. False where
    the user set :data:`ENV` (glibc read it at start), off Linux, or without glibc's ``mallopt``."""
    env = os.environ if env is None else env
    if ENV in env or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):
            return False  # musl and others: their mallopt is not glibc's
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
