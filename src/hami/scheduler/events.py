"""Pod events (core/v1 Event), posted in the background so no request waits on them.

Reasons (§5.7): ``FilteringFailed``, ``FilteringSucceed``, ``BindingFailed``, ``BindingSucceed``;
on a Node (beyond HAMi): ``MalformedRegistration`` (Warning) when its registration cannot be read;
the source component is the scheduler name. The queue is bounded: when the API server is slow,
events are dropped (and counted), never the scheduling work; success (Normal) events may fill
only half of it, so a burst of placements cannot crowd out the Warnings (a pending pod's
``FilteringFailed``: with one writer and a loaded API server, 500 placements kept the queue full
and not one Warning of 200 pending pods was written). ``workers`` writes run at once.

A repeated Warning (same object, reason and message) is not a new Event: as the Kubernetes event
recorder does, the Event already written gets its ``count`` and ``lastTimestamp`` raised, at most
once per ``repeat_interval`` per series (the repeats in between are counted and carried by the
next write). A pod that fits nowhere is refused again on every retry of kube-scheduler's; without
this each retry wrote one Event per reason line. Success (Normal) events are written once per
placement and not remembered: a placed pod does not repeat them, and keeping a series for each
(two per pod) filled the ``max_series`` bound with placed pods' lines, memory that grew with
the first thousands of pods of a churning cluster (issue 26's soak) for no repeat to find.

Success events are also paced: at most ``success_rate`` a second on average, ``success_burst``
at once (10 and 50). A cluster placing a few pods a second gets every one; a burst of a thousand
placements gets the first fifty and ten a second after, and the API server's time goes to the
Bindings (two success events a pod were a quarter of the API server's writes in such a burst,
kube-scheduler writes its own ``Scheduled`` event for each pod anyway). Skipped ones are counted
in ``skipped``. Warnings are never paced. A ``success_rate`` of 0 writes every one, as HAMi does
(``--success-event-rate=0``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from hami.kube.client import KubeClient, KubeError

log = logging.getLogger(__name__)


def event_body(
    pod: Mapping[str, Any], reason: str, message: str, kind: str, component: str, now: datetime, involved: str = "Pod"
) -> dict:
    """An Event about ``pod`` (or, with ``involved="Node"``, about a Node: its events live in
    the ``default`` namespace, as kubelet's do)."""
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace") if involved == "Pod" else "default"
    stamp = _stamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta.get('name')}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": {
            "kind": involved,
            "apiVersion": "v1",
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            **({"namespace": namespace} if involved == "Pod" else {}),
        },
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": component,
    }


class _Series:
    """One Event already written and its repeats since."""

    __slots__ = ("namespace", "name", "count", "first", "written", "unwritten")

    def __init__(self, namespace: str, name: str, first: str, now: float) -> None:
        self.namespace, self.name, self.first = namespace, name, first
        self.count = 1
        self.written = now  # time.monotonic() of the last write
        self.unwritten = 0  # repeats counted but not written yet


class EventRecorder:
    def __init__(
        self,
        kube: KubeClient | None,
        component: str,
        maxsize: int = 1000,
        success: bool = True,
        repeat_interval: float = 30.0,
        max_series: int = 4096,
        clock=time.monotonic,
        workers: int = 4,
        success_rate: float = 10.0,
        success_burst: int = 50,
    ) -> None:
        self.kube = kube
        self.success = success  # False: Normal (success) events are not recorded
        self.component = component
        self.queue: asyncio.Queue[dict] = asyncio.Queue(maxsize)
        self.dropped = 0
        self.posted = 0
        self.repeat_interval = repeat_interval
        self.max_series = max_series  # series remembered (least recently used go first)
        self.clock = clock
        self._series: OrderedDict[tuple, _Series] = OrderedDict()
        self.coalesced = 0  # repeats that wrote nothing (counted in a later write)
        self.workers = workers
        self.success_rate, self.success_burst = success_rate, success_burst
        self._tokens = float(success_burst)  # success events that may be written now
        self._filled = clock()
        self.skipped = 0  # success events not written: over the pace

    def record(
        self,
        pod: Mapping[str, Any],
        reason: str,
        message: str | Callable[[], str],
        kind: str = "Normal",
        involved: str = "Pod",
    ) -> None:
        """Queue an Event (``message``: the text, or a function that words it, called only when
        the event is written: a paced or dropped success event costs no formatting)."""
        if self.kube is None or (kind == "Normal" and not self.success):
            return
        if kind == "Normal" and self.queue.maxsize and self.queue.qsize() >= self.queue.maxsize // 2:
            self._drop()  # the other half is kept for Warnings
            return
        if kind == "Normal":  # written once, not remembered (module docstring)
            if not self._paced():
                self.skipped += 1
                return
            text = message if isinstance(message, str) else message()
            self._put(event_body(pod, reason, text, kind, self.component, datetime.now(timezone.utc), involved))
            return
        if not isinstance(message, str):
            message = message()
        meta = pod.get("metadata") or {}
        key = (involved, meta.get("namespace"), meta.get("name"), meta.get("uid"), reason, kind, message[:1024])
        now = self.clock()
        series = self._series.get(key)
        if series is not None:
            self._series.move_to_end(key)
            series.count += 1
            if now - series.written < self.repeat_interval:
                series.unwritten += 1
                self.coalesced += 1
                return
            stamp = _stamp(datetime.now(timezone.utc))
            item = {
                "_patch": f"/api/v1/namespaces/{series.namespace}/events/{series.name}",
                "_series": key,
                "body": {"count": series.count, "lastTimestamp": stamp},
            }
            if self._put(item):
                series.written, series.unwritten = now, 0
            else:
                series.unwritten += 1
            return
        body = event_body(pod, reason, message, kind, self.component, datetime.now(timezone.utc), involved)
        if self._put(body):
            self._series[key] = _Series(
                body["metadata"]["namespace"], body["metadata"]["name"], body["firstTimestamp"], now
            )
            while len(self._series) > self.max_series:
                self._series.popitem(last=False)

    def _paced(self) -> bool:
        """Take one success event's token (``success_rate`` come back a second, up to ``success_burst``;
        a rate of 0 does not pace)."""
        if self.success_rate <= 0:
            return True
        now = self.clock()
        self._tokens = min(float(self.success_burst), self._tokens + (now - self._filled) * self.success_rate)
        self._filled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _put(self, item: dict) -> bool:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self._drop()
            return False
        return True

    def _drop(self) -> None:
        self.dropped += 1
        if self.dropped & (self.dropped - 1) == 0:  # 1, 2, 4, 8, ...: seen, not flooding the log
            log.warning("%d events dropped so far: the API server takes them slower than they come", self.dropped)

    async def run(self) -> None:
        await asyncio.gather(*(self._work() for _ in range(max(1, self.workers))))

    async def _work(self) -> None:
        while True:
            body = await self.queue.get()
            path = body.get("_patch")
            if path is not None:
                try:
                    await self.kube.merge_patch(path, body["body"])
                    self.posted += 1
                except Exception as exc:  # noqa: BLE001 - an event is best effort
                    # gone (events expire) or unreachable: the next repeat starts a new Event
                    self._series.pop(body["_series"], None)
                    gone = isinstance(exc, KubeError) and exc.status == 404
                    log.info("event series %s not updated%s: %s", path, " (expired)" if gone else "", exc)
                continue
            ns = body["metadata"]["namespace"]
            try:
                await self.kube.post(f"/api/v1/namespaces/{ns}/events", body)
                self.posted += 1
            except Exception as exc:  # noqa: BLE001 - an event is best effort
                log.info("event %s for %s/%s not recorded: %s", body["reason"], ns, body["involvedObject"]["name"], exc)


def _stamp(now: datetime) -> str:
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
