"""Leadership ends at its deadline, whatever the poll loop is doing: a Lease read that hangs or
fails, a slow pod label write or a long ``on_elected`` callback cannot keep a deposed replica
acting as leader (its Binds would pass the LeadershipLost check while the new leader places pods
from a ledger lacking its decisions: double booking)."""

from __future__ import annotations

import asyncio
import time

from hami.kube.client import KubeError
from hami.scheduler.leader import LEASE_DURATION, RENEW_DEADLINE, Leadership

T0 = 1_000_000.0


def _lease(holder: str, renewed: float, duration: float = 15) -> dict:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(renewed)) + f".{int(renewed % 1 * 1e6):06d}Z"
    return {"spec": {"holderIdentity": holder, "renewTime": stamp, "leaseDurationSeconds": duration}}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class FakeKube:
    """A Lease read that can take (fake) time, fail, or hang; the pod label writes, recorded."""

    def __init__(self, clock: Clock, lease: dict | None) -> None:
        self.clock, self.lease = clock, lease
        self.read_takes = 0.0  # fake seconds a read takes
        self.read_fails: BaseException | None = None
        self.read_hangs = False
        self.patch_hangs = False
        self.labels: list[str] = []
        self.reads = 0

    async def get(self, path):
        self.reads += 1
        if self.read_hangs:
            await asyncio.Event().wait()
        self.clock.now += self.read_takes
        if self.read_fails is not None:
            raise self.read_fails
        return self.lease

    async def merge_patch(self, path, body):
        if self.patch_hangs:
            await asyncio.Event().wait()
        self.labels.append(body["metadata"]["labels"]["hami.io/scheduler-role"])
        return {}


def _setup(**kw) -> tuple[Clock, FakeKube, Leadership]:
    clock = Clock()
    kube = FakeKube(clock, _lease("hami-0_1a2b", clock.now))
    lead = Leadership(kube, True, "hami-scheduler", "ns", "hami-0", "hami-0", "ns", clock=clock, **kw)  # type: ignore[arg-type]
    return clock, kube, lead


def test_the_deadlines_sit_well_inside_the_lease():
    _, _, lead = _setup()
    assert RENEW_DEADLINE < LEASE_DURATION
    assert 0 < lead.request_timeout <= 5 and lead.request_timeout < RENEW_DEADLINE / 2


async def test_a_read_that_fails_slowly_does_not_keep_an_expired_leader():
    """The reviewer's case: the read times out after the client's 30 s; the time it started at
    must not be taken as now."""
    clock, kube, lead = _setup()
    assert await lead.check() and lead.is_leader
    kube.read_takes, kube.read_fails = 29.9, asyncio.TimeoutError()
    assert not await lead.check()
    assert not lead.is_leader
    assert kube.labels == ["leader", "follower"]


async def test_leadership_as_callers_read_it_ends_at_the_deadline_with_no_poll():
    """The poll loop stalled (or not scheduled): ``is_leader`` still turns false on time."""
    clock, kube, lead = _setup()
    assert await lead.check()
    clock.now = T0 + RENEW_DEADLINE - 0.5
    assert lead.is_leader
    assert lead.time_left() == 0.5
    clock.now = T0 + RENEW_DEADLINE + 0.5  # kube-scheduler beside us has given up by now
    assert not lead.is_leader and lead.time_left() == 0
    clock.now = T0 + LEASE_DURATION + 1
    assert not lead.is_leader


async def test_a_failed_read_keeps_the_leader_only_until_the_renew_deadline():
    clock, kube, lead = _setup()
    assert await lead.check()
    kube.read_fails = KubeError("GET", "lease", 500, '{"message": "etcdserver: request timed out"}')
    clock.now = T0 + 5
    assert await lead.check() and lead.is_leader  # Binds in flight are not failed for one bad read
    clock.now = T0 + RENEW_DEADLINE + 0.5
    assert not await lead.check() and not lead.is_leader


async def test_validity_counts_from_before_the_read_was_sent():
    """A read that takes 9 s answers with a renewal made while it was in flight: the renewal is
    only known to hold from when the read was sent."""
    clock, kube, lead = _setup()
    kube.read_takes = 9
    kube.lease = _lease("hami-0_1a2b", T0 + 9)  # renewed during the read
    assert await lead.check()
    assert lead.held_until <= T0 + RENEW_DEADLINE
    clock.now = T0 + RENEW_DEADLINE + 0.5
    assert not lead.is_leader


async def test_a_renewal_dated_in_our_future_counts_from_when_we_asked():
    clock, kube, lead = _setup()
    kube.lease = _lease("hami-0_1a2b", T0 + 60)  # a clock ahead of ours
    assert await lead.check()
    assert lead.held_until <= T0 + RENEW_DEADLINE


async def test_a_hanging_read_is_cut_short_and_fails_like_any_other():
    clock, kube, lead = _setup(request_timeout=0.05)
    assert await lead.check()
    kube.read_hangs = True
    clock.now = T0 + 2
    assert await asyncio.wait_for(lead.check(), 2)  # still inside the deadline: still leader
    clock.now = T0 + RENEW_DEADLINE + 1
    assert not await asyncio.wait_for(lead.check(), 2)
    assert kube.labels == ["leader", "follower"]


async def test_a_hanging_label_write_does_not_stall_the_poll():
    clock, kube, lead = _setup(request_timeout=0.05)
    kube.patch_hangs = True
    assert await asyncio.wait_for(lead.check(), 2)
    assert lead.labelled is None  # written again on the next poll
    kube.patch_hangs = False
    assert await asyncio.wait_for(lead.check(), 2)
    assert kube.labels == ["leader"] and lead.labelled is True


async def test_a_long_on_elected_callback_does_not_stall_leadership():
    """``on_elected`` (a resync) runs beside the poll: the label is written before it starts, it
    sees this replica as leader, and a lease lost meanwhile is followed at once."""
    clock, kube, lead = _setup()
    started, release = asyncio.Event(), asyncio.Event()
    seen: list[tuple[list[str], bool]] = []

    async def resync():
        seen.append((list(kube.labels), lead.is_leader))
        started.set()
        await release.wait()

    lead.on_elected.append(resync)
    assert await asyncio.wait_for(lead.check(), 2)
    await asyncio.wait_for(started.wait(), 2)
    assert seen == [(["leader"], True)]
    kube.lease = _lease("hami-1_9f9f", T0 + 1)  # the lease went elsewhere while resync runs
    clock.now = T0 + 1
    assert not await asyncio.wait_for(lead.check(), 2)
    assert not lead.is_leader and kube.labels == ["leader", "follower"]
    release.set()
    await asyncio.wait_for(lead.elected_task, 2)  # type: ignore[arg-type]


async def test_on_elected_callbacks_run_in_order_and_never_overlap():
    clock, kube, lead = _setup()
    running, log = [0], []
    gate = asyncio.Event()

    async def first():
        running[0] += 1
        log.append(("first", running[0]))
        await gate.wait()
        running[0] -= 1

    async def second():
        log.append(("second", running[0]))

    lead.on_elected += [first, second]
    assert await asyncio.wait_for(lead.check(), 2)
    await asyncio.sleep(0)
    kube.lease = _lease("hami-1_9f9f", T0)  # lost ...
    assert not await asyncio.wait_for(lead.check(), 2)
    kube.lease = _lease("hami-0_1a2b", T0 + 1)  # ... and elected again while the first pass runs
    clock.now = T0 + 1
    assert await asyncio.wait_for(lead.check(), 2)
    for _ in range(5):
        await asyncio.sleep(0)
    assert log == [("first", 1)]  # the second election's pass waits for the first's
    gate.set()
    await asyncio.wait_for(lead.elected_task, 2)  # type: ignore[arg-type]
    assert log == [("first", 1), ("second", 0), ("first", 1), ("second", 0)]


async def test_a_failing_on_elected_callback_is_logged_not_raised(caplog):
    clock, kube, lead = _setup()

    async def broken():
        raise RuntimeError("boom")

    ran = []

    async def after():
        ran.append(True)

    lead.on_elected += [broken, after]
    assert await lead.check()
    await asyncio.wait_for(lead.elected_task, 2)  # type: ignore[arg-type]
    assert "boom" in caplog.text
    assert ran == [True]  # one callback failing does not skip the next


async def test_stopping_the_loop_stops_a_callback_in_progress():
    clock, kube, lead = _setup(interval=0.01)
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def resync():
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    lead.on_elected.append(resync)
    task = asyncio.create_task(lead.run())
    await asyncio.wait_for(started.wait(), 2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.wait_for(cancelled.wait(), 2)


async def test_without_leader_election_always_leader_and_callers_can_depose():
    lead = Leadership(None, False, "hami-scheduler", "ns", "hami-0", clock=lambda: 0.0)
    assert lead.is_leader and lead.time_left() == float("inf")  # no lease, no deadline
    lead.is_leader = False  # what tests of the extender do to simulate a lost lease
    assert not lead.is_leader
