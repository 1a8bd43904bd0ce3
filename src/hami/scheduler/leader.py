"""Leadership: follow the Lease that the kube-scheduler beside us holds (§5.10).

HAMi's extender does not campaign: kube-scheduler (same pod) takes the Lease
``<namespace>/hami-scheduler``; this replica is leader while the Lease's ``holderIdentity``
is our identity followed by ``_<uuid>`` (kube-scheduler's: the hostname, which in a pod is the pod
name cut to 63 characters; ours defaults to the same hostname) and the Lease has
not expired. Only the leader answers ``/filter`` and ``/bind`` and is ready; followers keep
their caches warm, so a failover does not start cold. Without ``--leader-elect`` this replica
is always leader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from typing import Any, Awaitable, Callable, Mapping

from hami.core.names import SCHEDULER_ROLE
from hami.kube.client import KubeClient, KubeError

log = logging.getLogger(__name__)
ROLE_LABEL = SCHEDULER_ROLE


def _ts(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def holds_lease(lease: Mapping[str, Any] | None, identity: str, now: float) -> bool:
    """True when ``lease`` is held by ``identity`` and not expired: the holder is ``identity`` or
    ``identity_<anything>`` (kube-scheduler's ``<hostname>_<uuid>``); a mere prefix is not enough,
    ``hami-0`` does not hold ``hami-01_<uuid>``'s lease."""
    if not lease or not identity:
        return False
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    renewed = _ts(spec.get("renewTime")) or _ts(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds") or 15
    held = holder == identity or holder.startswith(identity + "_")
    return held and renewed is not None and renewed + duration > now


class Leadership:
    def __init__(
        self,
        kube: KubeClient | None,
        enabled: bool,
        name: str,
        namespace: str,
        identity: str,
        pod_name: str = "",
        pod_namespace: str = "",
        interval: float = 1.0,
        clock=time.time,
    ) -> None:
        self.kube = kube
        self.enabled = enabled
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.identity = identity
        self.pod_name, self.pod_namespace = pod_name, pod_namespace
        self.interval = interval
        self.clock = clock
        self.is_leader = not enabled
        self.changed = asyncio.Event()
        self.on_elected: list[Callable[[], Awaitable[None]]] = []

    async def check(self) -> bool:
        try:
            lease = await self.kube.get(self.path)
        except KubeError as exc:
            if exc.status != 404:
                log.warning("cannot read the leader Lease: %s", exc)
            lease = None
        leader = holds_lease(lease, self.identity, self.clock())
        if leader != self.is_leader:
            self.is_leader = leader
            log.info("this replica (%s) is now %s", self.identity, "leader" if leader else "a follower")
            self.changed.set()
            self.changed = asyncio.Event()
            await self._label(leader)
            if leader:
                for cb in self.on_elected:
                    await cb()
        return leader

    async def _label(self, leader: bool) -> None:
        if not (self.pod_name and self.pod_namespace):
            return
        path = f"/api/v1/namespaces/{self.pod_namespace}/pods/{self.pod_name}"
        try:
            await self.kube.merge_patch(
                path, {"metadata": {"labels": {ROLE_LABEL: "leader" if leader else "follower"}}}
            )
        except KubeError as exc:
            log.warning("cannot label pod %s/%s: %s", self.pod_namespace, self.pod_name, exc)

    async def run(self) -> None:
        if not self.enabled:
            return
        while True:
            await self.check()
            await asyncio.sleep(self.interval)
