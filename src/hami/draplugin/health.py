"""Which of the node's GPUs are unhealthy, for the ResourceSlice's device taints, and when one is
healthy again.

The NVML watcher (:class:`hami.node.nvml.XidWatcher`) marks a GPU unhealthy on a fatal XID (an
application error's XID is ignored there) or when NVML itself fails; the agent then publishes the
GPU with the device taint ``gpu.hami.io/unhealthy=xid`` (:func:`hami.dra.model.unhealthy_taint`,
``NoSchedule`` by default, ``NoExecute`` on request). NVML has no "healthy again" event, so with
``--health-recovery`` set a GPU counts as recovered once that long has passed since its last fatal
XID and NVML still answers for it (the probe); its taint is then removed. A GPU whose probe fails
stays marked and is probed again one period later. Without it (0, the default) a GPU stays
marked until the agent restarts, as HAMi's device plugin and NVIDIA's DRA driver keep it.

:class:`HealthBook` is called from the watcher's thread (:meth:`mark`) and from the agent's loop
(the rest), hence its lock.
"""

from __future__ import annotations

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
    ) -> None:
        if recovery < 0:
            raise ValueError(f"recovery must be >= 0 seconds, got {recovery!r}")
        self.recovery, self._probe, self._clock = recovery, probe, clock
        self._since: dict[str, float] = {}  # UUID -> when it was last marked (or last failed a probe)
        self._lock = threading.Lock()

    def mark(self, uuids: Iterable[str]) -> None:
        """A fatal XID (or NVML failing) on these GPUs: unhealthy from now on, the recovery wait
        starting again for a GPU already marked."""
        now = self._clock()
        with self._lock:
            for uuid in uuids:
                self._since[uuid] = now

    def unhealthy(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._since)

    def due(self) -> float | None:
        """Seconds until the next GPU may recover (0: now); None when none is marked or
        recovery is off."""
        if not self.recovery:
            return None
        with self._lock:
            if not self._since:
                return None
            first = min(self._since.values())
        return max(first + self.recovery - self._clock(), 0.0)

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
                    healed.append(uuid)
                else:
                    self._since[uuid] = now
        for uuid in healed:
            log.info("GPU %s: no fatal XID for %gs and NVML answers: healthy again", uuid, self.recovery)
        return healed
