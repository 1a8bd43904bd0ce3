"""Failover and Filter decisions: a decision (taken in Filter, reserved in the ledger, written by
Bind) belongs to the leadership term it was taken in. kube-scheduler beside this replica exits
when it loses the Lease (a restarted one holds it under a new ``<hostname>_<uuid>``), and with
kube-scheduler in a pod of its own the next Bind goes to whichever replica leads: a decision of
an earlier term is never bound, and its reservation does not outlive the term (a follower's
ledger feeds its webhook's quota check; a replica elected again must not count GPUs for Binds
that will never come)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

from hami.kube import nodelock
from hami.scheduler.options import Options

from .test_scheduler_extender import _decision_setup, args
from .test_scheduler_state import pod

T0 = 1_000_000.0


def _lease(holder: str, renewed: float, acquired: float | None = None) -> dict:
    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(t))

    spec = {"holderIdentity": holder, "renewTime": stamp(renewed), "leaseDurationSeconds": 15}
    spec["acquireTime"] = stamp(renewed if acquired is None else acquired)
    return {"spec": spec}


class _Lease:
    """The Lease as the API server has it (no label writes: the service has no pod name)."""

    def __init__(self, lease: dict) -> None:
        self.lease = lease

    async def get(self, path: str) -> dict:
        return self.lease


def _led(*names: str, gpus: int = 1):
    """A service following kube-scheduler's Lease as replica ``hami-0``, two nodes of ``gpus``
    1000 MiB GPUs, pods ``names`` asking 600 MiB each; the clock is ``now[0]``."""
    svc, api = _decision_setup("binding", *names, gpus=gpus, leader_elect=True, identity="hami-0")
    now = [T0]
    svc.leader.kube = _Lease(_lease("hami-0_aaaa", now[0]))
    svc.leader.clock = lambda: now[0]
    return svc, api, now


def _bound(name: str, node_name: str, uuid: str, mem: int = 600) -> dict:
    p = pod(name, node_name=node_name, uuid=uuid, mem=mem)
    p["spec"]["nodeName"] = node_name
    p["metadata"]["resourceVersion"] = "5"
    return p


def _bind(name: str, node_name: str) -> dict:
    return {"PodName": name, "PodNamespace": "ns", "PodUID": f"uid-{name}", "Node": node_name}


def _mem(svc, name: str) -> list[int]:
    return [m for _, _, m, _ in svc.state.ledger.device_usage(name)]


async def test_a_decision_of_an_earlier_term_is_not_bound_when_this_replica_leads_again():
    """Replica hami-0 decides pod a on n1-g0; its kube-scheduler loses the Lease, hami-1 leads and
    binds pod x to n1-g0 (it never saw a's decision); hami-0's kube-scheduler (restarted) leads
    again. A Bind for a's old decision must not post: n1-g0 would hold 1200 MiB of 1000."""
    svc, api, now = _led("a")
    ext = svc.extender
    assert await svc.leader.check()
    assert (await ext.filter(args(svc.state.pod("ns", "a"), ["n1"])))["NodeNames"] == ["n1"]
    svc.leader.kube.lease = _lease("hami-1_bbbb", now[0])
    assert not await svc.leader.check()
    svc.state.apply_pod("MODIFIED", _bound("x", "n1", "n1-g0"))  # hami-1's placement, from the watch
    now[0] += 20
    svc.leader.kube.lease = _lease("hami-0_cccc", now[0])  # a new kube-scheduler process
    assert await svc.leader.check()
    answer = await ext.bind(_bind("a", "n1"))
    assert answer["Error"] and "carries no decision" in answer["Error"], answer
    assert api.bindings == []
    assert _mem(svc, "n1") == [600]  # x alone: a's old reservation went with its term
    assert nodelock.NODE_LOCK not in api.nodes["n1"]["metadata"]["annotations"]


async def test_a_new_holder_is_a_new_term_even_when_no_poll_saw_the_gap():
    """kube-scheduler beside this replica restarted (same hostname, new uuid) while no poll of
    ours ran in between (a busy event loop): the holder changed, so the term did, and the earlier
    term's decision is neither bound nor kept."""
    svc, api, now = _led("a")
    ext = svc.extender
    assert await svc.leader.check()
    assert (await ext.filter(args(svc.state.pod("ns", "a"), ["n1"])))["NodeNames"] == ["n1"]
    now[0] += 16
    svc.leader.kube.lease = _lease("hami-0_dddd", now[0])
    assert await svc.leader.check()
    assert not svc.state.ledger.is_reserved("uid-a") and _mem(svc, "n1") == [0]
    answer = await ext.bind(_bind("a", "n1"))
    assert answer["Error"] and api.bindings == []


async def test_a_renewal_by_the_same_holder_keeps_the_terms_decisions():
    """Renewals of the same holder (and a read that failed meanwhile) are the same term: the
    decision is bound as usual."""
    svc, api, now = _led("a")
    ext = svc.extender
    assert await svc.leader.check()
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    now[0] += 2
    svc.leader.kube.lease = _lease("hami-0_aaaa", now[0], acquired=T0)
    assert await svc.leader.check()
    assert await ext.bind(_bind("a", chosen)) == {"Error": ""}
    assert len(api.bindings) == 1


async def test_a_deposed_replica_gives_back_its_unbound_decisions_at_once():
    """A follower never binds what it decided as leader (its kube-scheduler exited with the Lease;
    the next Bind goes to the new leader): the reservations and their namespace usage go when the
    Lease is seen elsewhere, not 300 s later (the follower's webhook checks quotas on this ledger)."""
    svc, api, now = _led("a", "b")
    ext = svc.extender
    assert await svc.leader.check()
    for name in ("a", "b"):
        assert (await ext.filter(args(svc.state.pod("ns", name), ["n1", "n2"])))["NodeNames"]
    assert svc.state.ledger.namespace_usage("ns", "NVIDIA")[0] == 1200
    svc.leader.kube.lease = _lease("hami-1_bbbb", now[0])
    assert not await svc.leader.check()
    assert svc.state.ledger.namespace_usage("ns", "NVIDIA")[0] == 0
    assert not svc.state.ledger.is_reserved("uid-a") and not svc.state.ledger.is_reserved("uid-b")
    assert ext.busy_nodes() == {}


async def test_a_filter_that_outlives_the_lease_reserves_nothing():
    """A Filter that read its pod from the API server (a pod newer than the watch) while the
    Lease went elsewhere answers an error and keeps no reservation: kube-scheduler's Bind goes to
    the new leader, which never saw this decision."""
    svc, api, now = _led("a")
    ext = svc.extender
    assert await svc.leader.check()
    sent = svc.state.pods.pop("ns/a")  # not in the watch yet: Filter reads it
    real_get = api.get

    async def slow_get(path):
        if "/pods/" in path:
            svc.leader.kube.lease = _lease("hami-1_bbbb", now[0])
            await svc.leader.check()  # the poll sees the new holder while the GET is out
        return await real_get(path)

    api.get = slow_get
    answer = await ext.filter(args(sent, ["n1", "n2"]))
    assert answer["Error"] and not answer["NodeNames"], answer
    assert not svc.state.ledger.is_reserved("uid-a")
    assert _mem(svc, "n1") == [0] and _mem(svc, "n2") == [0]
    assert ext._decisions == {} and ext.busy_nodes() == {}


async def test_a_lock_a_failed_bind_could_not_give_back_is_removed_on_a_follower_too():
    """The API server went away between a Bind's lock and its Binding, and the lease went with
    it: the lock (naming a pod still pending, so live to every other replica until its expiry)
    is this replica's to remove, leader or not, exactly that value."""
    svc, api, now = _led("a")
    svc.opts = Options(leader_elect=True, identity="hami-0", resync_interval=0.01)
    ext = svc.extender
    value = nodelock.HAMI_LOCK.value(datetime.now(timezone.utc), "ns", "a")
    api.nodes["n1"]["metadata"]["annotations"][nodelock.NODE_LOCK] = value
    ext._owed_releases.add(("n1", nodelock.NODE_LOCK, value))
    svc.leader.kube.lease = _lease("hami-1_bbbb", now[0])
    assert not await svc.leader.check()
    loop = asyncio.get_running_loop().create_task(svc._resync_loop())
    try:
        for _ in range(200):
            if nodelock.NODE_LOCK not in api.nodes["n1"]["metadata"]["annotations"]:
                break
            await asyncio.sleep(0.01)
    finally:
        loop.cancel()
    assert nodelock.NODE_LOCK not in api.nodes["n1"]["metadata"]["annotations"]
    assert ext._owed_releases == set()


async def test_a_stopping_leader_whose_binding_may_still_land_leaves_the_lease_to_expire():
    """SIGTERM while a Binding POST hangs on a slow API server (kube-scheduler in a pod of its
    own, the replicas campaigning): the POST is no longer waited for past the lease's end, but the
    API server may still write it. Giving the Lease up then would let the next leader place pods
    at once, from a ledger without this Binding; left to expire, it waits the lease duration, as
    after a crash."""
    from .test_leader_campaign import Store

    svc, api, now = _led("a")
    svc.opts = Options(
        leader_elect=True, leader_campaign=True, identity="hami-0", lease_name="hami-extender", lease_namespace="ns"
    )
    store = Store()
    svc.leader = lead = _campaigner(store)
    ext = svc.extender
    assert await lead.check()
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    ext.lease_left = lambda: 0.05  # renewed while leading (read again as the POST runs)
    posted = asyncio.Event()

    async def hanging_post(path, body):
        posted.set()
        await asyncio.Event().wait()

    api.post = hanging_post

    async def bind():
        svc.binds_in_flight += 1
        try:
            return await ext.bind(_bind("a", chosen))
        finally:
            svc.binds_in_flight -= 1

    binding = asyncio.get_running_loop().create_task(bind())
    await posted.wait()
    await asyncio.wait_for(svc.hand_over(60), 60)
    assert "may still land" in (await binding)["Error"]
    assert store.lease["spec"]["holderIdentity"] == lead.identity  # not given up
    assert not lead.is_leader and store.labels[-1] == "follower"


def _campaigner(store):
    from hami.scheduler.leader import Leadership

    from .test_leader_campaign import PATH

    lead = Leadership(store, True, "hami-extender", "ns", "hami-0", "hami-0", "ns", campaign=True)
    assert lead.path == PATH
    return lead


async def test_a_bind_that_waited_across_a_new_term_does_not_post_its_decision():
    """The Bind took its decision, then waited for the node lock while kube-scheduler beside us
    restarted and another replica placed pod x on n1-g0 in the gap: the decision of the earlier
    term must not be posted once the lock comes (it was: 1200 MiB on the 1000 MiB GPU)."""
    svc, api, now = _led("a")
    ext = svc.extender
    assert await svc.leader.check()
    assert (await ext.filter(args(svc.state.pod("ns", "a"), ["n1"])))["NodeNames"] == ["n1"]
    gate, waiting = asyncio.Event(), asyncio.Event()
    real = ext.acquire_lock

    async def busy_lock(*a, **k):
        waiting.set()
        await gate.wait()  # another pod's allocation holds the node lock
        return await real(*a, **k)

    ext.acquire_lock = busy_lock
    bind = asyncio.create_task(ext.bind(_bind("a", "n1")))
    await waiting.wait()
    now[0] += 16
    svc.state.apply_pod("MODIFIED", _bound("x", "n1", "n1-g0"))
    svc.leader.kube.lease = _lease("hami-0_dddd", now[0])
    assert await svc.leader.check()
    gate.set()
    answer = await bind
    assert answer["Error"] and "term" in answer["Error"] and api.bindings == [], answer
    assert _mem(svc, "n1") == [600]  # x alone
    assert nodelock.NODE_LOCK not in api.nodes["n1"]["metadata"]["annotations"]
