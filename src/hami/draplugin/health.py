"""Which of the node's GPUs are unhealthy, for the ResourceSlice's device taints, and when one is
healthy again.

The NVML watcher (:class:`hami.node.nvml.XidWatcher`) marks a GPU unhealthy on a fatal XID (an
application error's XID is ignored there) or when NVML itself fails; the agent then publishes the
GPU with the device taint ``gpu.hami.io/unhealthy=xid`` (:func:`hami.dra.model.unhealthy_taint`,
``NoSchedule`` by default, ``NoExecute`` on request). NVML has no "healthy again" event, so with
``--health-recovery`` set a GPU counts as recovered once that long has passed since its last fatal
XID and NVML still answers for it (the probe); its taint is then removed. A GPU whose probe fails
stays marked and is probed again one period later. Without it (0, the default) a GPU stays
marked until the node reboots (which resets it).

Marks and notes outlive a restart of the agent (:class:`hami.draplugin.checkpoint.HealthRecord`,
``<state dir>/health.json``): HAMi's device plugin and NVIDIA's DRA driver keep them in memory
only, so a restarted agent published a failed GPU as healthy until it failed again. Restored, a
mark clears by the rule above, its wait counted from the mark, not from the restart; a record
made before the node rebooted is not restored. The marks of NVML itself failing (``mark(...,
lasting=False)``) are not recorded: a restart is what clears the watcher's own failure.

A non-fatal XID (the ones the watcher does not count as a fault) is only noted (:meth:`HealthBook.note`):
the GPU stays healthy and the agent publishes the XID as an informational device taint
(``gpu.hami.io/xid=<code>``, effect ``None``: :func:`hami.dra.model.xid_taint`). A note goes
``--health-recovery`` after the GPU's last non-fatal XID (no probe: nothing was wrong with it);
without recovery it stays until the node reboots, as a fatal mark does.

:class:`HealthBook` is called from the watcher's thread (:meth:`mark`) and from the agent's loop
(the rest), hence its lock. :class:`HealthFeed` hands the same health to the kubelet (KEP-4680).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable, Iterable

log = logging.getLogger(__name__)


class HealthBook:
    def __init__(
        self,
        recovery: float = 0.0,
        probe: Callable[[str], bool] = lambda uuid: True,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        saved: Callable[[dict[str, float], dict[str, tuple[int, float]]], None] | None = None,
    ) -> None:
        if recovery < 0:
            raise ValueError(f"recovery must be >= 0 seconds, got {recovery!r}")
        self.recovery, self._probe, self._clock, self._wall = recovery, probe, clock, wall
        self._note_saved: dict[str, float] = {}  # GPU -> when its note was last handed to ``saved``
        self._since: dict[str, float] = {}  # UUID -> when it was last marked (or last failed a probe)
        self._noted: dict[str, tuple[int, float]] = {}  # UUID -> (its last non-fatal XID, when)
        #: marked only because NVML itself failed (``mark(..., lasting=False)``): not recorded
        self._passing: set[str] = set()
        self._lock = threading.Lock()
        #: told the marks and notes (in Unix seconds) after every change: the agent's
        #: :class:`hami.draplugin.checkpoint.HealthRecord`, so that a restart keeps them
        self.saved = saved
        self._save_lock = threading.Lock()  # one save at a time, each with the newest state

    def restore(self, marks: dict[str, float], notes: dict[str, tuple[int, float]]) -> None:
        """Take back what a previous run recorded (Unix seconds): a GPU marked then is unhealthy
        now, and recovers by the rule it would have recovered by had the agent kept running (its
        wait counted from the mark; a mark dated in the future, a clock set back, waits anew)."""
        now, wall = self._clock(), self._wall()
        with self._lock:
            for uuid, at in marks.items():
                self._since[uuid] = now - max(wall - at, 0.0)
            for uuid, (xid, at) in notes.items():
                self._noted[uuid] = (xid, now - max(wall - at, 0.0))
        for uuid in sorted(marks):
            log.warning("GPU %s: marked unhealthy before the restart (fatal XID); still unhealthy", uuid)

    def _changed(self) -> None:
        """Hand the new state to :attr:`saved`; a failure is logged, the marks in memory stay."""
        if self.saved is None:
            return
        with self._save_lock:
            now, wall = self._clock(), self._wall()
            with self._lock:
                marks = {u: wall - (now - t) for u, t in self._since.items() if u not in self._passing}
                notes = {u: (x, wall - (now - t)) for u, (x, t) in self._noted.items()}
            try:
                self.saved(marks, notes)
            except Exception as exc:  # noqa: BLE001 - the mark holds until the agent restarts
                log.error("GPU health not recorded (a restart would forget it): %s", exc)

    def mark(self, uuids: Iterable[str], lasting: bool = True) -> None:
        """A fatal XID (or NVML failing) on these GPUs: unhealthy from now on, the recovery wait
        starting again for a GPU already marked. ``lasting`` False: NVML itself failed (the
        watcher's ``on_failure``), not the GPU; such a mark is not recorded for the next run, as a
        restart is what clears a watcher's failure (and a failing wait marks every GPU once a
        period: no write each time). A GPU an XID marked stays recorded."""
        now = self._clock()
        recorded = False
        with self._lock:
            for uuid in uuids:
                if lasting:
                    self._passing.discard(uuid)
                elif uuid not in self._since or uuid in self._passing:
                    self._passing.add(uuid)
                recorded = recorded or uuid not in self._passing
                self._since[uuid] = now
        if recorded:
            self._changed()

    def note(self, uuid: str, xid: int) -> None:
        """A non-fatal XID on this GPU: recorded (the last one wins), the GPU's health unchanged."""
        now = self._clock()
        with self._lock:
            same = self._noted.get(uuid, (None, 0.0))[0] == xid
            self._noted[uuid] = (xid, now)
            # the same XID again: its time moves on in memory, written (an fsync) only once the
            # saved time is half the quiet period old (a restart then still keeps the note)
            fresh = same and now - self._note_saved.get(uuid, float("-inf")) < (self.recovery / 2 or float("inf"))
            if not fresh:
                self._note_saved[uuid] = now
        if not fresh:
            self._changed()

    def unhealthy(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._since)

    def notes(self) -> dict[str, int]:
        """The last non-fatal XID of each GPU that has one noted."""
        with self._lock:
            return {uuid: xid for uuid, (xid, _) in self._noted.items()}

    def due(self) -> float | None:
        """Seconds until the next GPU may recover or lose its note (0: now); None when nothing
        is marked or noted, or recovery is off."""
        if not self.recovery:
            return None
        with self._lock:
            times = [*self._since.values(), *(t for _, t in self._noted.values())]
        if not times:
            return None
        return max(min(times) + self.recovery - self._clock(), 0.0)

    def forget(self) -> list[str]:
        """The GPUs whose note is dropped now: their last non-fatal XID is ``recovery`` old."""
        if not self.recovery:
            return []
        now = self._clock()
        with self._lock:
            old = sorted(u for u, (_, t) in self._noted.items() if now - t >= self.recovery)
            for uuid in old:
                del self._noted[uuid]
        if old:
            self._changed()
        return old

    def recover(self) -> list[str]:
        """The GPUs healthy again now (unmarked): marked at least ``recovery`` ago and answering
        the probe. A GPU whose probe fails waits another period."""
        if not self.recovery:
            return []
        now = self._clock()
        with self._lock:
            ready = {u: t for u, t in self._since.items() if now - t >= self.recovery}
        healed = []
        for uuid, marked in sorted(ready.items()):
            try:
                ok = self._probe(uuid)
            except Exception as exc:  # a probe that raises is a GPU that is not back
                log.warning("GPU %s: health probe failed: %s", uuid, exc)
                ok = False
            with self._lock:
                if self._since.get(uuid) != marked:
                    continue  # marked again meanwhile: the new XID wins
                if ok:
                    del self._since[uuid]
                    self._passing.discard(uuid)
                    healed.append(uuid)
                else:
                    self._since[uuid] = now
        for uuid in healed:
            log.info("GPU %s: no fatal XID for %gs and NVML answers: healthy again", uuid, self.recovery)
        if ready:  # healed, or a failed probe's new wait
            self._changed()
        return healed


class HealthFeed:
    """What the kubelet's health stream (KEP-4680, :class:`hami.draplugin.plugin.HealthService`)
    sends: every published device of the node with its GPU's health, as a snapshot, and a version
    that :meth:`changed` raises so that open streams send a new one. ``devices`` are (pool,
    device name, GPU UUID); a MIG device has its GPU's health."""

    def __init__(
        self, book: HealthBook, devices: Iterable[tuple[str, str, str]], clock: Callable[[], float] = time.time
    ) -> None:
        self.book, self.devices, self._clock = book, tuple(devices), clock
        self.version = 0
        self._cond = asyncio.Condition()
        self._stamp: dict[str, int] = {}  # device -> Unix seconds its health was last determined
        self._last: dict[str, bool] = {}

    def snapshot(self) -> list[tuple[str, str, bool, int]]:
        """(pool, device, healthy, last updated) for every device; the time moves only when the
        device's health changed (or on the first snapshot)."""
        bad = self.book.unhealthy()
        now = int(self._clock())
        out = []
        for pool, name, uuid in self.devices:
            healthy = uuid not in bad
            if self._last.get(name) != healthy:
                self._last[name], self._stamp[name] = healthy, now
            out.append((pool, name, healthy, self._stamp[name]))
        return out

    async def changed(self) -> None:
        """Health may have changed (a mark, a recovery): streams send a new snapshot."""
        async with self._cond:
            self.version += 1
            self._cond.notify_all()

    async def wait(self, seen: int, timeout: float) -> int:
        """The version once it passes ``seen``, or after ``timeout`` seconds (a periodic resend)."""
        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(lambda: self.version != seen), timeout)
            except asyncio.TimeoutError:
                pass
            return self.version
