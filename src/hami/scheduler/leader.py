"""Leadership: follow the Lease that the kube-scheduler beside us holds (§5.10).

HAMi's extender does not campaign: kube-scheduler (same pod) takes the Lease
``<namespace>/hami-scheduler``; this replica is leader while the Lease's ``holderIdentity``
is our identity followed by ``_<uuid>`` (kube-scheduler's: the hostname, the pod's name unless it
sets hostNetwork or spec.hostname; ours defaults to the same hostname) and the Lease has
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

import aiohttp

from hami.core.names import SCHEDULER_ROLE
from hami.kube.client import KubeClient, KubeError

log = logging.getLogger(__name__)
ROLE_LABEL = SCHEDULER_ROLE
_UNREAD: Any = object()  # the Lease could not be read (not: it does not exist)


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
        self.held_until = 0.0  # when the lease last read as ours runs out, unless renewed
        self.labelled: bool | None = None  # the role our pod's label says (None: not written yet)
        self.changed = asyncio.Event()
        self.on_elected: list[Callable[[], Awaitable[None]]] = []

    async def check(self) -> bool:
        """Read the Lease and follow it. A read that fails (the API server busy or away) changes
        nothing until the lease last read as ours runs out: a failed read is not a new holder, and
        stepping down on one would fail every Bind in flight for a second. The pod's role label is
        written until it is right (a write that failed, or a restart as a follower, is retried on
        the next poll), since the Service finds the leader by that label alone."""
        now = self.clock()
        try:
            lease = await self.kube.get(self.path)
        except KubeError as exc:
            if exc.status != 404:
                log.warning("cannot read the leader Lease: %s", exc)
                lease = _UNREAD
            else:
                lease = None
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            log.warning("cannot read the leader Lease: %s", str(exc) or type(exc).__name__)
            lease = _UNREAD
        if lease is _UNREAD:
            leader = self.is_leader and now < self.held_until
        else:
            leader = holds_lease(lease, self.identity, now)
            if leader:
                spec = lease.get("spec") or {}
                renewed = _ts(spec.get("renewTime")) or _ts(spec.get("acquireTime")) or now
                self.held_until = renewed + (spec.get("leaseDurationSeconds") or 15)
        if leader != self.is_leader:
            self.is_leader = leader
            log.info("this replica (%s) is now %s", self.identity, "leader" if leader else "a follower")
            self.changed.set()
            self.changed = asyncio.Event()
            await self._label(leader)
            if leader:
                for cb in self.on_elected:
                    await cb()
        elif self.labelled is not leader:
            await self._label(leader)
        return leader

    async def _label(self, leader: bool) -> None:
        if not (self.pod_name and self.pod_namespace):
            return
        path = f"/api/v1/namespaces/{self.pod_namespace}/pods/{self.pod_name}"
        try:
            await self.kube.merge_patch(
                path, {"metadata": {"labels": {ROLE_LABEL: "leader" if leader else "follower"}}}
            )
        except (KubeError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            self.labelled = None  # written again on the next poll
            log.warning("cannot label pod %s/%s: %s", self.pod_namespace, self.pod_name, str(exc) or type(exc).__name__)
        else:
            self.labelled = leader

    async def run(self) -> None:
        if not self.enabled:
            return
        while True:
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bug in one poll must not freeze leadership for good
                log.exception("leader check failed; trying again")
            await asyncio.sleep(self.interval)
