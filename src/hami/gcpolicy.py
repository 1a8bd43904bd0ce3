"""Python's cyclic garbage collector, set for a process whose heap is a large long-lived cache.

`hami scheduler` keeps every watched pod and node as the decoded JSON: about a hundred tracked
containers (lists, dicts holding lists) per pod. With the interpreter's thresholds (700, 10, 10)
a burst of pods triggers young collections every few hundred objects and, each time the heap
has grown by a quarter, a full collection that walks the whole cache. Measured in
bench/bench_scheduler.py --e2e (29 Nov, 1000 GPU pods, 100 nodes): 243 collections in the
4.7 s burst, 395 ms in all, the two full ones 116 and 152 ms; kube-scheduler calls the extender
one pod at a time, so every pause stalls scheduling. A cluster of 25,000 pods has a million or
more tracked objects, which a full collection walks in about a second.

:func:`tune` sets young collections every :data:`GEN0` allocations (short-lived request objects
mostly die by reference counting before one runs) and no automatic full collection. The
program then runs :func:`collect_periodically`: every ``interval`` a full collection, after which
what survived is frozen (:func:`gc.freeze`), so the next periodic pass walks only what was made
since. Every :data:`THAW_EVERY` passes the frozen objects are put back first, so garbage cycles
among them (a connection or task that was live when frozen) are collected within that many
intervals: memory stays bounded, and the one long walk happens once an hour, not per burst.
Frozen objects are still freed by reference counting when dropped (a pod replaced in the cache).
Standard library only."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger("hami.gc")

GEN0 = 50_000  # allocations (net of deallocations) between young collections; Python's is 700
GEN1 = 10  # young collections per middle one, as Python's
NEVER = 1_000_000  # middle collections per full one: no automatic full collection
INTERVAL = 600.0  # seconds between full collections (collect_periodically)
THAW_EVERY = 6  # every this many passes the frozen objects are collected too (hourly)


def tune() -> tuple[int, int, int]:
    """Set the thresholds above; returns the previous ones (for :func:`gc.set_threshold`)."""
    previous = gc.get_threshold()
    gc.set_threshold(GEN0, GEN1, NEVER)
    return previous


def full_pass(thaw: bool) -> tuple[int, float]:
    """One periodic pass: (with ``thaw``, the frozen objects back first) a full collection, then
    freeze what survived. Returns (objects collected, seconds)."""
    began = time.perf_counter()
    if thaw:
        gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    return found, time.perf_counter() - began


async def collect_periodically(interval: float = INTERVAL, thaw_every: int = THAW_EVERY) -> None:
    """Run :func:`full_pass` every ``interval`` seconds until cancelled; every ``thaw_every``-th
    pass thaws first. The first pass, one interval after start, freezes the cache listed at start."""
    passes = 0
    while True:
        await asyncio.sleep(interval)
        passes += 1
        thaw = passes % thaw_every == 0
        found, took = full_pass(thaw)
        log.debug(
            "full collection%s: %d unreachable objects, %.1f ms; %d objects frozen",
            " (frozen objects included)" if thaw else "",
            found,
            took * 1000,
            gc.get_freeze_count(),
        )
