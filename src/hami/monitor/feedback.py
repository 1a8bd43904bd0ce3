"""Priority and utilisation-switch feedback for the in-container library (HAMi's vGPUmonitor loop).

Every period, for every container region (reference hami-core §6.5):

1. ``recent_kernel > 0`` is decremented; a container whose value is still > 0 and that has a
   compute limit (``Reading.limited``) is *active* at its ``priority`` (0 = high, 1 = low; lower
   number wins) on each of its devices.
2. ``utilization_switch`` = 1 (SM limit enforced) when a higher-priority container, or another
   container of the same priority, is active on one of its devices; 0 otherwise (a container
   alone on its GPU runs unthrottled).
3. Blocking (``recent_kernel = -1``, which makes the library's launches wait) when a
   higher-priority container is active on one of its devices and the container has a compute
   limit: always for a region whose library takes leases (``Reading.lease``: our libvgpu), others
   (HAMi-core) only when ``blocking`` is on. A blocked region's -1 is written again every period:
   the write renews its lease (:func:`hami.monitor.region.write_int32`).

The compute limit (a device of the container with ``0 < sm_limit < 100``) is HAMi's rule:
HAMi-core waits on a block, and marks the container active (``recent_kernel = 2``), only in its
rate limiter, which returns at once on a device without one; so HAMi never pauses a memory-only
container, nor lets one pause others. Our libvgpu marks every launch, so the monitor applies the
rule here (and libvgpu honours a -1 only on its limited devices). Until 1 Dec a priority-0 pod
without ``gpucores`` paused a memory-only priority-1 pod on its GPU (found by review).

Our libvgpu honours a -1 only while the monitor's lease on it runs (two periods and 5 s, renewed
each period: :func:`hami.monitor.region.lease_for`), so a monitor that dies after blocking leaves
a container stalled for the rest of that lease at most; HAMi-core honours -1 with no expiry, so
a container blocked by a monitor that then dies
would stay blocked until a monitor comes back: for HAMi-core, blocking stays opt-in
(``--priority-blocking``). When the loop stops, :func:`release` puts every region back to
switch 1 (enforce) and un-blocks it, so a monitor that exits leaves limits on and nothing blocked.
Until 1 Dec no region was blocked by default, so ``nvidia.com/priority`` did nothing for pods
(found by review).

:func:`decide` is pure: it takes readings and returns the writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True, slots=True)
class Reading:
    key: str  # the container's region path
    uuids: tuple[str, ...]  # devices of the container ("" entries are ignored)
    priority: int
    recent_kernel: int
    utilization_switch: int
    lease: bool = False  # the region's library honours a block only while its lease runs (region.priority_lease)
    #: a device of the container has a compute limit that can bind (0 < sm_limit < 100): only such a
    #: container counts as active and is blocked, as in HAMi (module docstring)
    limited: bool = True


@dataclass(frozen=True, slots=True)
class Writes:
    recent_kernel: int | None = None  # None = leave as is
    utilization_switch: int | None = None


def decide(readings: Iterable[Reading], blocking: bool = False) -> dict[str, Writes]:
    """The writes for one feedback period, keyed like the readings (only changed fields, and the
    -1 of every blocked region, which renews its lease). ``blocking`` also blocks regions without
    leases (HAMi-core)."""
    readings = list(readings)
    recent: dict[str, int] = {}
    active: dict[str, list[tuple[str, int]]] = {}  # uuid -> [(key, priority)] of active containers
    for r in readings:
        rk = r.recent_kernel - 1 if r.recent_kernel > 0 else r.recent_kernel
        recent[r.key] = rk
        if rk > 0 and r.limited:
            for uuid in set(u for u in r.uuids if u):
                active.setdefault(uuid, []).append((r.key, r.priority))
    out: dict[str, Writes] = {}
    for r in readings:
        higher = same = False
        for uuid in set(u for u in r.uuids if u):
            acts = active.get(uuid, ())
            higher = higher or any(p < r.priority for k, p in acts if k != r.key)
            same = same or sum(1 for _, p in acts if p == r.priority) > 1  # this one included when active
        rk = recent[r.key]
        block = higher and r.limited and (blocking or r.lease)
        if block:
            rk = -1
        elif rk < 0:
            rk = 0
        switch = 1 if (higher or same) else 0
        w = Writes(
            recent_kernel=rk if rk != r.recent_kernel or block else None,
            utilization_switch=switch if switch != r.utilization_switch else None,
        )
        if w != Writes():
            out[r.key] = w
    return out


def release(readings: Iterable[Reading]) -> dict[str, Writes]:
    """Writes that leave every region safe without a monitor: limiter on, nothing blocked."""
    out = {}
    for r in readings:
        w = Writes(
            recent_kernel=0 if r.recent_kernel < 0 else None,
            utilization_switch=1 if r.utilization_switch != 1 else None,
        )
        if w != Writes():
            out[r.key] = w
    return out
