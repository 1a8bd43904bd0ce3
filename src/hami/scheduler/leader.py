"""Leadership: follow the Lease that the kube-scheduler beside us holds (§5.10).

HAMi's extender does not campaign: kube-scheduler (same pod) takes the Lease
``<namespace>/hami-scheduler``; this replica is leader while the Lease's ``holderIdentity``
is our identity followed by ``_<uuid>`` (kube-scheduler's: the hostname, the pod's name unless it
sets hostNetwork or spec.hostname; ours defaults to the same hostname) and the Lease has
not expired. Only the leader answers ``/filter`` and ``/bind`` and is ready; followers keep
their caches warm, so a failover does not start cold. Without ``--leader-elect`` this replica
is always leader.

With ``--leader-elect-mode=campaign`` (the chart's ``scheduler.kubeScheduler.separatePod``, where
kube-scheduler runs in a pod of its own under another ServiceAccount and calls the extender
through its Service) there is no kube-scheduler beside us to follow: each replica campaigns for a
Lease of its own as client-go's leader election does (create it, or take it once its record has
not changed for its duration on our own clock, or renew it while ours; every write conditional on
the resourceVersion read), with a unique ``<identity>_<uuid>``, and gives it up when it stops.

A *term* is one holding of the Lease: its holder and ``acquireTime`` while ours (:attr:`Leadership.term`).
Filter decisions live in memory for their term only (``on_deposed``): a kube-scheduler that lost the
Lease exits, and one restarted beside us holds it under a new ``<hostname>_<uuid>``, so no Bind of
an earlier term's decision comes from it, and another replica may have placed pods on the same
shares meanwhile.

A new term is led only once :attr:`Leadership.catch_up` has run for it (:attr:`Leadership.caught_up`):
a follower's caches may lag the API server unseen (a watch held by a proxy, an API server restart),
and a leader placing pods from a ledger without its predecessor's last Bindings books shares twice.
Renewals of the same term cost nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Mapping

import aiohttp

from hami.core.names import SCHEDULER_ROLE
from hami.kube.client import KubeClient, KubeError

log = logging.getLogger(__name__)
ROLE_LABEL = SCHEDULER_ROLE
_UNREAD: Any = object()  # the Lease could not be read (not: it does not exist)
# kube-scheduler's defaults (--leader-elect-lease-duration, --leader-elect-renew-deadline): it
# stops leading (and exits) when it has not renewed for the renew deadline; another replica can
# take the lease only once the lease duration has passed since the last renewal
LEASE_DURATION = 15.0
RENEW_DEADLINE = 10.0
# each Lease read and label write: a few seconds, so that a poll ends well before the deadline
REQUEST_TIMEOUT = (LEASE_DURATION - RENEW_DEADLINE) / 2
# how far past its deadline a write sent while leader may still be in flight: half the gap before
# another replica can take the Lease over (the other half for clock rates and the watch)
LEASE_MARGIN = (LEASE_DURATION - RENEW_DEADLINE) / 2
# a catch-up still running after this long is worth a warning (Filter answers "not ready" meanwhile)
CATCH_UP_SLOW = 10.0


def _ts(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _stamp(when: float) -> str:
    """A Lease's MicroTime: RFC 3339 in UTC with microseconds."""
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def holds_lease(lease: Mapping[str, Any] | None, identity: str, now: float) -> bool:
    """True when ``lease`` is held by ``identity`` and not expired: the holder is ``identity`` or
    ``identity_<anything>`` (kube-scheduler's ``<hostname>_<uuid>``); a mere prefix is not enough,
    ``hami-0`` does not hold ``hami-01_<uuid>``'s lease."""
    if not lease or not identity:
        return False
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    renewed = _ts(spec.get("renewTime")) or _ts(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds") or LEASE_DURATION
    held = holder == identity or holder.startswith(identity + "_")
    return held and renewed is not None and renewed + duration > now


class Leadership:
    """This replica's leadership, as the Lease last read says.

    ``is_leader`` is what callers (readiness, Filter, Bind) read: it turns false by itself once
    the clock passes ``held_until``, whatever the poll loop is doing (a read hanging, a label
    write, a resync). ``held_until`` is the renew deadline of the last renewal read as ours,
    counted from no later than when that read was sent: kube-scheduler beside us gives the lease
    up (and exits) when it has not renewed for its renew deadline, and no other replica can take
    it before the lease duration has passed, so the gap between the two covers a Bind that passed
    the check just before the deadline, and clock differences."""

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
        clock: Callable[[], float] | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        campaign: bool = False,
        wall: Callable[[], float] | None = None,
    ) -> None:
        self.kube = kube
        self.enabled = enabled
        self.name, self.namespace = name, namespace
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        # campaigning, the identity written in the Lease is unique to this process (a restarted
        # replica must not mistake its predecessor's record for its own)
        self.campaign = campaign
        self.identity = f"{identity}_{uuid.uuid4()}" if campaign else identity
        self._observed: tuple[Any, ...] | None = None  # campaign: the record last read
        self._observed_at = 0.0  # campaign: our clock when that record last changed
        self.pod_name, self.pod_namespace = pod_name, pod_namespace
        self.interval = interval
        # what deadlines are counted on: following, the wall clock (they are compared with the
        # renewals kube-scheduler writes); campaigning, a monotonic one (only our own intervals
        # count, and a stepped wall clock must not end or extend them), the wall clock only
        # stamping what we write. A test passes one clock for both.
        self.clock = clock or (time.monotonic if campaign else time.time)
        self.wall = wall or clock or time.time
        self._lock = asyncio.Lock()  # campaigning: one poll or release at a time
        self.stopping = False  # campaigning: stop_leading() was called; never lead again
        self.request_timeout = request_timeout  # each Lease read and label write
        self._leader = not enabled  # the last poll's answer, before its deadline is applied
        self.held_until = 0.0  # when the lease last read as ours stops counting, unless renewed
        self.labelled: bool | None = None  # the role our pod's label says (None: not written yet)
        self.changed = asyncio.Event()
        self.on_elected: list[Callable[[], Awaitable[None]]] = []
        # run (in the poll, at once) when this replica's term ends: it leads no more, or the Lease
        # read as ours names another holder or acquisition than before (a new term)
        self.on_deposed: list[Callable[[], None]] = []
        # the term being led: (holderIdentity, acquireTime) of the Lease last read (or written) as
        # ours; None while not leading; one fixed value without --leader-elect
        self.term: Any = None if enabled else ()
        self._round_term: Any = None  # the term the last round read as ours
        self._written_term: Any = None  # campaigning: the term of the Lease last written
        self.elected_task: asyncio.Task[None] | None = None  # the on_elected callbacks, running
        # run on each new term before anything else (the on_elected callbacks, Filter, Bind): bring
        # the caches up to the API server's (a relist); None: nothing to catch up (always caught up)
        self.catch_up: Callable[[], Awaitable[None]] | None = None
        self._caught_up_term: Any = None  # the term catch_up last finished for (None after a deposition)

    @property
    def is_leader(self) -> bool:
        """Leader now: the last poll said so and its deadline has not passed (always, without
        ``--leader-elect``, unless a caller set it false)."""
        return self._leader and (not self.enabled or self.clock() < self.held_until)

    @is_leader.setter
    def is_leader(self, value: bool) -> None:
        self._leader = value

    @property
    def caught_up(self) -> bool:
        """The term being led has had its :attr:`catch_up` (always, without ``--leader-elect`` or a
        catch-up to run): until then this replica does not place or bind pods."""
        if not self.enabled or self.catch_up is None:
            return True
        return self.term is not None and self._caught_up_term == self.term

    def time_left(self) -> float:
        """Seconds this replica stays leader unless a poll renews it (0 when not leader; infinite
        without ``--leader-elect``): a write that must land while leader can be bounded by it
        plus the gap between the renew deadline and the lease duration."""
        if not self.is_leader:
            return 0.0
        return float("inf") if not self.enabled else self.held_until - self.clock()

    def _deadline(self, lease: Mapping[str, Any], sent: float) -> float:
        """When a lease read as ours stops counting: its renewal (no later than when we asked:
        a renewal dated in our future is a clock ahead of ours) plus the renew deadline, scaled
        to the lease's duration."""
        spec = lease.get("spec") or {}
        renewed = _ts(spec.get("renewTime")) or _ts(spec.get("acquireTime")) or sent
        duration = spec.get("leaseDurationSeconds") or LEASE_DURATION
        return min(renewed, sent) + duration * RENEW_DEADLINE / LEASE_DURATION

    async def _read(self) -> Any:
        """The Lease, None when there is none, or ``_UNREAD``; never longer than the timeout."""
        assert self.kube is not None
        try:
            return await asyncio.wait_for(self.kube.get(self.path), self.request_timeout)
        except KubeError as exc:
            if exc.status == 404:
                return None
            log.warning("cannot read the leader Lease: %s", exc)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            log.warning("cannot read the leader Lease: %s", str(exc) or type(exc).__name__)
        return _UNREAD

    async def check(self) -> bool:
        """Read the Lease and follow it. A read that fails (the API server busy or away) changes
        nothing until the deadline of the lease last read as ours: a failed read is not a new
        holder, and stepping down on one would fail every Bind in flight for a second. The time is
        read after the request (a read can take its whole timeout), and a renewal counts from no
        later than when the read was sent. The pod's role label is written until it is right (a
        write that failed, or a restart as a follower, is retried on the next poll), since the
        Service finds the leader by that label alone. ``on_elected`` runs beside the poll, not in
        it: a long resync must not keep leadership from being followed."""
        if self.campaign:
            async with self._lock:
                if self.stopping:
                    return False
                leader = await self._campaign_round()
                if self.stopping:  # stop_leading() came while this round was out: it stands
                    return False
        else:
            leader = await self._follow_round()
        term = self._round_term if leader else None
        # a new holder (or acquisition) while we lead: kube-scheduler beside us restarted, or the
        # Lease went elsewhere and came back, with no poll of ours seeing the gap
        new_term = leader and self._leader and term != self.term
        if self._leader and (not leader or new_term):
            self._deposed()
        self.term = term
        if new_term:
            log.info("this replica (%s) leads under a new lease term %s", self.identity, term)
            if self.on_elected:
                self.elected_task = asyncio.get_running_loop().create_task(self._elected(self.elected_task))
        if leader != self._leader:
            self._leader = leader
            log.info("this replica (%s) is now %s", self.identity, "leader" if leader else "a follower")
            self.changed.set()
            self.changed = asyncio.Event()
            await self._label(leader)
            if leader and self.on_elected:
                self.elected_task = asyncio.get_running_loop().create_task(self._elected(self.elected_task))
        elif self.labelled is not leader:
            await self._label(leader)
        return leader

    async def _follow_round(self) -> bool:
        """Following: leader while the Lease read names us and its renewal's deadline is ahead."""
        sent = self.clock()
        lease = await self._read()
        now = self.clock()
        if lease is _UNREAD:
            return self._leader and now < self.held_until
        if holds_lease(lease, self.identity, now):
            self.held_until = self._deadline(lease, sent)
            spec = lease.get("spec") or {}
            self._round_term = (spec.get("holderIdentity") or "", spec.get("acquireTime") or "")
            return now < self.held_until
        return False

    async def _campaign_round(self) -> bool:
        """Campaigning: leader while our last renewal that the API server took was sent less than
        the renew deadline ago (on the monotonic clock; another replica can take over only a lease
        duration after it saw that renewal)."""
        sent = self.clock()
        lease = await self._read()
        outcome = _UNREAD if lease is _UNREAD else await self._campaign(lease)
        now = self.clock()
        if outcome is _UNREAD:
            return self._leader and now < self.held_until
        if outcome:
            self.held_until = sent + RENEW_DEADLINE  # we wrote leaseDurationSeconds LEASE_DURATION
            self._round_term = self._written_term
            return now < self.held_until
        return False

    async def _campaign(self, lease: Mapping[str, Any] | None) -> Any:
        """One round of the campaign on the Lease just read (None: there is none): create it, take
        it, renew it, or leave it to its holder. Returns the Lease we wrote after a write that
        succeeded, ``{}`` when the Lease is another's (left to it, or a write another replica beat
        us to: 409), ``_UNREAD`` after a write that failed otherwise (which may have landed: the
        deadline then stays that of the last write known to have). Another holder's Lease is taken
        only once its record has stood unchanged for its duration on our monotonic clock (neither
        its holder's clock nor a step of ours counts), or when its holder gave it up (empty)."""
        assert self.kube is not None
        now = self.clock()
        spec = dict((lease or {}).get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("acquireTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = spec.get("leaseDurationSeconds") or LEASE_DURATION
        if holder and holder != self.identity and self._observed_at + duration > now:
            return {}
        stamp = _stamp(self.wall())
        mine = {"holderIdentity": self.identity, "leaseDurationSeconds": int(LEASE_DURATION), "renewTime": stamp}
        if holder != self.identity:
            mine["acquireTime"] = stamp
            mine["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease is not None else 0)
        self._written_term = (self.identity, mine.get("acquireTime") or spec.get("acquireTime") or "")
        try:
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": mine,
                }
                write = self.kube.post(self.path.rsplit("/", 1)[0], body)
            else:
                body = {**lease, "spec": {**spec, **mine}}
                write = self.kube.request("PUT", self.path, body=body)
            return await asyncio.wait_for(write, self.request_timeout)
        except KubeError as exc:
            if exc.status == 409:  # another replica created or wrote it first
                return {}
            log.warning("cannot write the leader Lease: %s", exc)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            log.warning("cannot write the leader Lease: %s", str(exc) or type(exc).__name__)
        return _UNREAD

    def stop_leading(self) -> None:
        """Campaigning, at a stop: lead no more from now on (``is_leader`` false at once, so a Bind
        that has not posted its Binding gives up; no poll takes the Lease again). The Lease stays
        ours until :meth:`release`, once the Binds already posting have ended."""
        if self.enabled and self.campaign:
            self.stopping = True
            if self._leader:
                self._deposed()
            self._leader = False
            self.term = None
            self.held_until = 0.0

    def _deposed(self) -> None:
        """The term ends: the ``on_deposed`` callbacks, each whatever the others do. The next term
        catches up again (the caches may lag from here on, unseen)."""
        self._caught_up_term = None
        for cb in list(self.on_deposed):
            try:
                cb()
            except Exception:  # noqa: BLE001 - one failed callback must not keep the others from running
                log.exception("leader deposition callback %s failed", getattr(cb, "__qualname__", cb))

    async def release(self, give_up: bool = True) -> None:
        """Campaigning: stop leading (:meth:`stop_leading`) and give the Lease up (holder emptied,
        as client-go does on a cancelled election) so that another replica takes it at once rather
        than after its duration. A poll in progress is waited for (its renewal would otherwise land
        after the release and make it fail); none starts after. ``give_up=False``: the Lease is
        left to expire (a write of ours may still land), only the pod's label changes. Following,
        there is nothing to do: kube-scheduler gives its Lease up itself."""
        if not (self.enabled and self.campaign and self.kube is not None):
            return
        self.stop_leading()
        async with self._lock:
            if give_up:
                await self._give_up()
        if self.labelled is not False:
            await self._label(False)

    async def _give_up(self) -> None:
        assert self.kube is not None
        try:
            lease = await asyncio.wait_for(self.kube.get(self.path), self.request_timeout)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            stamp = _stamp(self.wall())
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=stamp, acquireTime=stamp)
            await asyncio.wait_for(
                self.kube.request("PUT", self.path, body={**lease, "spec": spec}), self.request_timeout
            )
            log.info("gave the leader Lease %s up", self.name)
        except (KubeError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            log.warning("cannot give the leader Lease up (it expires by itself): %s", str(exc) or type(exc).__name__)

    async def _elected(self, before: asyncio.Task[None] | None) -> None:
        """The :attr:`catch_up` of the new term, then the ``on_elected`` callbacks, in order, after
        those of an earlier election (passes never overlap); one that fails is logged and the next
        still runs."""
        if before is not None and not before.done():
            await asyncio.gather(before, return_exceptions=True)
        if not await self._catch_up():
            return  # the term ended first: the next election's pass runs
        for cb in list(self.on_elected):
            if not self.is_leader:
                return  # lost again meanwhile: the next election runs them
            try:
                await cb()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one failed pass must not skip the others
                log.exception("leader election callback %s failed", getattr(cb, "__qualname__", cb))

    async def _catch_up(self) -> bool:
        """Run :attr:`catch_up` for the term being led now, again after a failure, until it ends
        or the term does (False then: a relist that waits on an API server gone away must not
        hold the next election's pass). Meanwhile :attr:`caught_up` is false."""
        term = self.term
        if self.catch_up is None or term is None:
            return self.catch_up is None or not self.enabled
        if self._caught_up_term == term:
            return True
        began = time.monotonic()
        warned = False
        while self.term == term:
            task = asyncio.ensure_future(self.catch_up())
            try:
                while not task.done() and self.term == term:
                    # (woken by a change of leadership too: a lost term ends the wait at once)
                    changed = asyncio.ensure_future(self.changed.wait())
                    try:
                        await asyncio.wait({task, changed}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        changed.cancel()
                    if not task.done() and not warned and time.monotonic() - began >= CATCH_UP_SLOW:
                        warned = True
                        log.warning(
                            "new lease term %s: the caches have not caught up with the API server after %.0fs; "
                            "Filter and Bind answer 'not ready' until they have",
                            term,
                            time.monotonic() - began,
                        )
            finally:
                if not task.done():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            if task.cancelled():
                break  # the term ended
            if task.exception() is None:
                if self.term != term:
                    break
                self._caught_up_term = term
                log.info("new lease term %s: caches caught up in %.2fs", term, time.monotonic() - began)
                return True
            log.error("new lease term %s: catching up failed (again in 1s): %r", term, task.exception())
            await asyncio.sleep(1.0)
        log.info("lease term %s ended before the caches caught up", term)
        return False

    async def _label(self, leader: bool) -> None:
        if not (self.pod_name and self.pod_namespace):
            return
        assert self.kube is not None
        path = f"/api/v1/namespaces/{self.pod_namespace}/pods/{self.pod_name}"
        try:
            await asyncio.wait_for(
                self.kube.merge_patch(path, {"metadata": {"labels": {ROLE_LABEL: "leader" if leader else "follower"}}}),
                self.request_timeout,
            )
        except (KubeError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            self.labelled = None  # written again on the next poll
            log.warning("cannot label pod %s/%s: %s", self.pod_namespace, self.pod_name, str(exc) or type(exc).__name__)
        else:
            self.labelled = leader

    async def run(self) -> None:
        if not self.enabled:
            return
        try:
            while not self.stopping:
                try:
                    await self.check()
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - a bug in one poll must not freeze leadership for good
                    log.exception("leader check failed; trying again")
                await asyncio.sleep(self.interval)
        finally:
            if self.elected_task is not None and not self.elected_task.done():
                self.elected_task.cancel()
