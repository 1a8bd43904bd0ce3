"""Pod events (core/v1 Event), posted in the background so no request waits on them.

Reasons (§5.7): ``FilteringFailed``, ``FilteringSucceed``, ``BindingFailed``, ``BindingSucceed``;
on a Node (beyond HAMi): ``MalformedRegistration`` (Warning) when its registration cannot be read;
the source component is the scheduler name. The queue is bounded: when the API server is slow,
events are dropped (and counted), never the scheduling work.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime, timezone
from typing import Any, Mapping

from hami.kube.client import KubeClient

log = logging.getLogger(__name__)


def event_body(
    pod: Mapping[str, Any], reason: str, message: str, kind: str, component: str, now: datetime, involved: str = "Pod"
) -> dict:
    """An Event about ``pod`` (or, with ``involved="Node"``, about a Node: its events live in
    the ``default`` namespace, as kubelet's do)."""
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace") if involved == "Pod" else "default"
    stamp = now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
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


class EventRecorder:
    def __init__(self, kube: KubeClient | None, component: str, maxsize: int = 1000, success: bool = True) -> None:
        self.kube = kube
        self.success = success  # False: Normal (success) events are not recorded
        self.component = component
        self.queue: asyncio.Queue[dict] = asyncio.Queue(maxsize)
        self.dropped = 0
        self.posted = 0

    def record(
        self, pod: Mapping[str, Any], reason: str, message: str, kind: str = "Normal", involved: str = "Pod"
    ) -> None:
        if self.kube is None or (kind == "Normal" and not self.success):
            return
        try:
            self.queue.put_nowait(
                event_body(pod, reason, message, kind, self.component, datetime.now(timezone.utc), involved)
            )
        except asyncio.QueueFull:
            self.dropped += 1

    async def run(self) -> None:
        while True:
            body = await self.queue.get()
            ns = body["metadata"]["namespace"]
            try:
                await self.kube.post(f"/api/v1/namespaces/{ns}/events", body)
                self.posted += 1
            except Exception as exc:  # noqa: BLE001 - an event is best effort
                log.info("event %s for %s/%s not recorded: %s", body["reason"], ns, body["involvedObject"]["name"], exc)
