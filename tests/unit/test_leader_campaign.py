"""``--leader-elect-mode=campaign``: replicas that have no kube-scheduler beside them (the chart's
``scheduler.kubeScheduler.separatePod``) campaign for a Lease of their own. Exactly one leads;
another takes over only once the leader's record has stood still for the lease duration on its
own clock (after the old leader's deadline has passed), or at once when the leader gives the Lease
up; writes are conditional on the resourceVersion read, so two replicas taking an expired Lease
together cannot both win. The real API server: tests/integration/test_scheduler.py."""

from __future__ import annotations

import asyncio
import copy

import pytest

from hami.kube.client import KubeError
from hami.scheduler.leader import LEASE_DURATION, RENEW_DEADLINE, Leadership, _ts

T0 = 2_000_000.0
PATH = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/hami-extender"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Store:
    """One Lease with the API server's optimistic concurrency: a create of an existing Lease and a
    replace naming an old resourceVersion are refused with 409."""

    def __init__(self) -> None:
        self.lease: dict | None = None
        self.version = 0
        self.writes: list[str] = []
        self.labels: list[str] = []

    def _stored(self, body: dict) -> dict:
        self.version += 1
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(self.version)
        self.lease = body
        self.writes.append(body["spec"]["holderIdentity"])
        return copy.deepcopy(body)

    async def get(self, path: str) -> dict:
        assert path == PATH
        if self.lease is None:
            raise KubeError("GET", path, 404, '{"reason": "NotFound"}')
        return copy.deepcopy(self.lease)

    async def post(self, path: str, body: dict) -> dict:
        assert path == PATH.rsplit("/", 1)[0] and body["metadata"]["name"] == "hami-extender"
        if self.lease is not None:
            raise KubeError("POST", path, 409, '{"reason": "AlreadyExists"}')
        return self._stored(body)

    async def request(self, method: str, path: str, body: dict | None = None, **_: object) -> dict:
        assert (method, path) == ("PUT", PATH) and body is not None
        if self.lease is None or body["metadata"].get("resourceVersion") != str(self.version):
            raise KubeError(method, path, 409, '{"reason": "Conflict"}')
        return self._stored(body)

    async def merge_patch(self, path: str, body: dict) -> dict:
        self.labels.append(body["metadata"]["labels"]["hami.io/scheduler-role"])
        return {}


def _replica(store: Store, clock: Clock, name: str) -> Leadership:
    return Leadership(store, True, "hami-extender", "ns", name, name, "ns", clock=clock, campaign=True)  # type: ignore[arg-type]


async def test_one_replica_creates_the_lease_and_leads_the_other_follows():
    clock, store = Clock(), Store()
    a, b = _replica(store, clock, "sched-a"), _replica(store, clock, "sched-b")
    assert a.identity.startswith("sched-a_") and len(a.identity) > len("sched-a_") + 30  # a uuid
    assert await a.check() and a.is_leader
    assert store.lease is not None and store.lease["spec"]["holderIdentity"] == a.identity
    assert store.lease["spec"]["leaseDurationSeconds"] == LEASE_DURATION
    assert _ts(store.lease["spec"]["renewTime"]) == pytest.approx(T0, abs=1e-3)  # UTC MicroTime
    for _ in range(40):  # a renews every poll: b never takes over
        clock.now += 1
        assert not await b.check()
        assert await a.check()
        assert a.is_leader and not b.is_leader
    assert set(store.writes) == {a.identity}


async def test_a_silent_leader_is_replaced_only_after_its_own_deadline_has_passed():
    clock, store = Clock(), Store()
    a, b = _replica(store, clock, "sched-a"), _replica(store, clock, "sched-b")
    assert await a.check()
    assert not await b.check()  # b sees a's record at T0
    # a stops renewing (hung, partitioned): its leadership ends at its renew deadline ...
    clock.now = T0 + RENEW_DEADLINE + 0.1
    assert not a.is_leader
    assert not await b.check()  # ... and b still waits for the lease duration
    clock.now = T0 + LEASE_DURATION - 0.1
    assert not await b.check()
    clock.now = T0 + LEASE_DURATION + 0.1
    assert await b.check() and b.is_leader
    assert store.lease is not None and store.lease["spec"]["leaseTransitions"] == 1
    # a comes back: b's record is new to it, so it follows for a whole duration
    assert not await a.check() and not a.is_leader


async def test_the_duration_counts_on_the_followers_clock_not_the_holders_timestamps():
    """A holder whose clock runs 60 s behind writes renewals that look long expired; the follower
    goes by when it saw the record change, so it does not take a Lease that is being renewed."""
    clock, store = Clock(), Store()
    a, b = _replica(store, clock, "sched-a"), _replica(store, clock, "sched-b")
    behind = Clock()
    a.clock = behind
    behind.now = T0 - 60
    assert await a.check()
    for step in range(30):
        clock.now = T0 + step
        behind.now = T0 - 60 + step
        assert not await b.check()
        assert await a.check()


async def test_giving_the_lease_up_hands_it_over_at_once():
    clock, store = Clock(), Store()
    a, b = _replica(store, clock, "sched-a"), _replica(store, clock, "sched-b")
    assert await a.check()
    assert not await b.check()
    clock.now += 1
    await a.release()
    assert not a.is_leader and a.time_left() == 0
    assert store.lease is not None and store.lease["spec"]["holderIdentity"] == ""
    clock.now += 0.5
    assert await b.check() and b.is_leader  # not after a lease duration
    # a release by a replica that no longer holds the Lease writes nothing
    writes = list(store.writes)
    await a.release()
    assert store.writes == writes and store.lease["spec"]["holderIdentity"] == b.identity


async def test_two_replicas_taking_an_expired_lease_together_cannot_both_win():
    clock, store = Clock(), Store()
    old, a, b = _replica(store, clock, "gone"), _replica(store, clock, "sched-a"), _replica(store, clock, "sched-b")
    assert await old.check()
    assert not await a.check() and not await b.check()
    clock.now = T0 + LEASE_DURATION + 1
    stale = await store.get(PATH)  # b has read the expired Lease ...
    assert await a.check()  # ... a takes it meanwhile ...
    assert await b._campaign(stale) == {}  # ... and b's write, on the old version, is refused
    assert not await b.check() and not b.is_leader and a.is_leader


async def test_two_replicas_creating_the_lease_together_cannot_both_win():
    clock, store = Clock(), Store()
    a, b = _replica(store, clock, "sched-a"), _replica(store, clock, "sched-b")
    assert await a.check()
    assert await b._campaign(None) == {}  # b read "no Lease" before a created it
    assert not await b.check()


async def test_a_restarted_replica_does_not_take_its_predecessors_record_for_its_own():
    """Same pod name, new process: a new identity, so the old record is another holder's and is
    waited out (the old process may still be finishing a Bind)."""
    clock, store = Clock(), Store()
    before = _replica(store, clock, "sched-a")
    assert await before.check()
    after = _replica(store, clock, "sched-a")
    assert after.identity != before.identity
    clock.now += 1
    assert not await after.check()
    clock.now = T0 + LEASE_DURATION + 1.5
    assert await after.check()


async def test_a_failed_write_keeps_the_leader_only_until_its_deadline():
    clock, store = Clock(), Store()
    a = _replica(store, clock, "sched-a")
    assert await a.check()

    async def refused(*_args, **_kw):
        raise KubeError("PUT", PATH, 500, '{"message": "etcdserver: request timed out"}')

    store.request = refused  # type: ignore[method-assign]
    clock.now = T0 + 5
    assert await a.check() and a.is_leader  # one failed renewal does not fail Binds in flight
    clock.now = T0 + RENEW_DEADLINE + 0.5
    assert not await a.check() and not a.is_leader


async def test_following_mode_is_unchanged_by_the_campaign():
    """Without campaign the identity is the one given (kube-scheduler's hostname prefix) and the
    replica never writes the Lease."""
    clock, store = Clock(), Store()
    follower = Leadership(store, True, "hami-extender", "ns", "sched-a", clock=clock)  # type: ignore[arg-type]
    assert follower.identity == "sched-a"
    assert not await follower.check()
    assert store.lease is None and store.writes == []
    await follower.release()
    assert store.writes == []


async def test_a_release_waits_for_a_poll_in_progress_and_no_poll_takes_the_lease_back():
    """The poll loop keeps running while the process stops: a renewal in flight when the release
    starts must not make the release fail (409), and no later poll may take the emptied Lease."""
    clock, store = Clock(), Store()
    a, b = _replica(store, clock, "sched-a"), _replica(store, clock, "sched-b")
    assert await a.check()
    gate = asyncio.Event()
    real_get = store.get

    async def slow_get(path):
        lease = await real_get(path)
        await gate.wait()
        return lease

    store.get = slow_get  # type: ignore[method-assign]
    clock.now += 1
    renewing = asyncio.ensure_future(a.check())
    await asyncio.sleep(0)
    releasing = asyncio.ensure_future(a.release())
    await asyncio.sleep(0)
    assert not a.is_leader  # stepped down at once: Binds that have not posted give up
    store.get = real_get  # type: ignore[method-assign]
    gate.set()
    await asyncio.gather(renewing, releasing)
    assert store.lease is not None and store.lease["spec"]["holderIdentity"] == ""  # the release landed
    assert not await a.check() and not a.is_leader  # and a stopping replica never campaigns again
    assert store.lease["spec"]["holderIdentity"] == ""
    assert store.labels[-1] == "follower"
    assert await b.check()


async def test_campaign_deadlines_run_on_a_monotonic_clock_not_the_wall_clock():
    """client-go counts these intervals on a monotonic clock: a wall clock stepped forward must not
    make a follower take a live leader's Lease, nor one stepped back keep a leader past its
    deadline. The wall clock only stamps what is written."""
    mono_a, mono_b, wall = Clock(), Clock(), Clock()
    store = Store()
    a = Leadership(store, True, "hami-extender", "ns", "a", clock=mono_a, wall=wall, campaign=True)  # type: ignore[arg-type]
    b = Leadership(store, True, "hami-extender", "ns", "b", clock=mono_b, wall=wall, campaign=True)  # type: ignore[arg-type]
    assert await a.check()
    assert not await b.check()
    wall.now += 3600  # an NTP step: every renewal now looks an hour old or new
    for _ in range(5):
        mono_a.now += 1
        mono_b.now += 1
        assert await a.check() and not await b.check()
    wall.now -= 7200
    mono_a.now += RENEW_DEADLINE + 0.5  # a stalls: its deadline passes on its own clock whatever the wall says
    assert not a.is_leader


def test_defaults_monotonic_when_campaigning_wall_clock_when_following():
    import time as _time

    assert Leadership(None, True, "l", "ns", "x", campaign=True).clock is _time.monotonic
    assert Leadership(None, True, "l", "ns", "x").clock is _time.time


def test_campaigning_for_kube_schedulers_own_lease_is_refused_naming_the_flag():
    import argparse

    from hami.scheduler import options as O

    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    args = lambda *a: parser.parse_args(list(a))  # noqa: E731
    with pytest.raises(O.ConfigError, match="--leader-elect-resource-name=hami-scheduler: .*Lease of its own"):
        O.options_from_args(args("--leader-elect", "--leader-elect-mode=campaign"))
    opts = O.options_from_args(
        args("--leader-elect", "--leader-elect-mode=campaign", "--leader-elect-resource-name=hami-scheduler-extender")
    )
    assert opts.leader_campaign and opts.lease_name == "hami-scheduler-extender"
    assert not O.options_from_args(args("--leader-elect")).leader_campaign  # following kube-scheduler's, as HAMi


async def test_a_replica_that_does_not_lead_closes_kube_schedulers_connection_and_a_stopping_one_answers_at_once():
    """Through the Service, kube-scheduler's kept-alive connection stays on the pod it first
    reached: a follower's error answer closes it, so the next call is routed to the leader. A
    replica handing over (SIGTERM) refuses Filter and Bind at once instead of waiting to lead."""
    from aiohttp.test_utils import TestClient, TestServer

    from hami.scheduler.options import Options
    from hami.scheduler.server import _STOPPING, SchedulerService

    svc = SchedulerService(Options(leader_elect=True, leader_campaign=True, lease_name="hami-scheduler-extender"), None)
    svc.extender.ready_wait = 0.05
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": {"containers": []}}
    async with TestClient(TestServer(svc.app())) as client:
        r = await client.post("/filter", json={"Pod": pod, "NodeNames": ["n1"]})
        assert "not the leader" in (await r.json())["Error"] or "not ready" in (await r.json())["Error"]
        assert r.headers.get("Connection", "").lower() == "close"
        await svc.hand_over(1.0)  # no Bind in flight; no API client, so nothing to give up
        assert svc.leader.stopping and not svc.leader.is_leader
        for path, body in (
            ("/filter", {"Pod": pod, "NodeNames": ["n1"]}),
            ("/bind", {"PodName": "p", "PodNamespace": "ns", "PodUID": "u1", "Node": "n1"}),
        ):
            r = await client.post(path, json=body)
            assert (await r.json())["Error"] == _STOPPING, path
            assert r.headers.get("Connection", "").lower() == "close"
        assert svc.binds_in_flight == 0
