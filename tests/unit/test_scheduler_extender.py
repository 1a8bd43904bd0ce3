"""The extender's decisions (cache only, decisions not patched: ``record=False``), the HTTP
server's routes and answers, leadership rules and TLS certificate reload."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hami.core.codec import decode_pod_devices, encode_node_devices_json
from hami.core.reasons import NodeFailure, Reason
from hami.core.types import DeviceInfo
from hami.scheduler.events import EventRecorder
from hami.scheduler.extender import failed_maps, failure_summary
from hami.scheduler.leader import holds_lease
from hami.scheduler.options import Options
from hami.scheduler.server import SchedulerService
from hami.sim.engine import simulate

from .test_scheduler_state import node, pod


def service(*nodes_):
    svc = SchedulerService(Options(), None)
    svc.extender.record = False
    svc.state.node_handler.replace(list(nodes_))
    return svc


def args(p, names):
    return {"Pod": p, "NodeNames": names, "Nodes": None}


def seen(svc, p):
    """``p`` as the pod watch delivered it (a Filter is only for a pod the API server has)."""
    svc.state.put_pod(p)
    return p


async def test_filter_reserves_refilter_releases_and_reasons():
    svc = service(node("n1", gpus=1), node("n2", gpus=1))
    ext = svc.extender
    a = await ext.filter(args(seen(svc, pod("a", mem=600)), ["n1", "n2"]))
    assert a["NodeNames"] in (["n1"], ["n2"]) and a["Error"] == ""
    first = a["NodeNames"][0]
    again = await ext.filter(
        args(seen(svc, pod("a", mem=600)), ["n1", "n2"])
    )  # re-filter: the old reservation goes first
    assert again["NodeNames"] == [first]
    assert sum(m for n in ("n1", "n2") for _, _, m, _ in svc.state.ledger.device_usage(n)) == 600
    b = await ext.filter(args(seen(svc, pod("b", mem=600)), ["n1", "n2"]))
    assert b["NodeNames"] != a["NodeNames"]
    c = await ext.filter(args(seen(svc, pod("c", mem=600)), ["n1", "n2", "ghost"]))
    assert c["NodeNames"] == [] and c["Error"] == ""
    assert c["FailedNodes"] == {
        "n1": "1/1 CardInsufficientMemory",
        "n2": "1/1 CardInsufficientMemory",
    }
    assert c["FailedAndUnresolvableNodes"] == {"ghost": "node unregistered"}  # no eviction registers it
    typed = pod("t", mem=10)
    typed["metadata"]["annotations"] = {"nvidia.com/use-gputype": "H100"}
    t = await ext.filter(args(seen(svc, typed), ["n1", "n2"]))
    assert t["FailedAndUnresolvableNodes"] == {"n1": "1/1 CardTypeMismatch", "n2": "1/1 CardTypeMismatch"}
    assert t["FailedNodes"] == {}


async def test_filter_passes_pods_without_devices_and_reports_bad_input():
    svc = service(node("n1"))
    plain = pod("plain")
    plain["spec"]["containers"][0]["resources"] = {}
    assert (await svc.extender.filter(args(seen(svc, plain), ["n1", "n9"])))["NodeNames"] == ["n1", "n9"]
    bad = pod("bad")
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "lots"
    answer = await svc.extender.filter(args(seen(svc, bad), ["n1"]))
    assert "nvidia.com/gpumem" in answer["Error"] and "lots" in answer["Error"]
    assert "Pod is missing" in (await svc.extender.filter({"NodeNames": ["n1"]}))["Error"]


def finished(svc, p):
    """The device plugin marked ``p`` allocated (bind-phase success), as the pod watch shows it."""
    done = {
        **p,
        "metadata": {
            **p["metadata"],
            "resourceVersion": str(int(p["metadata"]["resourceVersion"]) + 1),
            "annotations": {**p["metadata"]["annotations"], "hami.io/bind-phase": "success"},
        },
    }
    svc.state.put_pod(done)
    return done


async def test_extender_takes_the_simulators_decisions():
    """Same pods, same nodes, same order: `hami simulate` and /filter choose the same devices
    (each pod's allocation finished before the next arrives, as in the simulator's snapshot)."""
    nodes_ = [node(f"n{i}", gpus=2) for i in range(3)]
    pods_ = [pod(f"p{i}", mem=150 + 70 * (i % 4)) for i in range(12)]
    sim = simulate(nodes_, pods_, SchedulerService(Options(), None).state.config)
    svc = service(*nodes_)
    for p, outcome in zip(pods_, sim.pods):
        got = await svc.extender.filter(args(seen(svc, p), [n["metadata"]["name"] for n in nodes_]))
        assert got["NodeNames"] == ([outcome.node] if outcome.node else [])
        finished(svc, p)
        alloc = svc.state.ledger.pod(p["metadata"]["uid"])
        if alloc:
            assert [d.uuid for c in alloc.devices["NVIDIA"] for d in c] == [
                d["uuid"] for c in outcome.containers for d in c["devices"]
            ]


async def test_a_node_with_an_unfinished_bind_is_offered_only_when_no_other_fits():
    """A Bind on a node whose lock another unfinished bind holds must wait for it (and fails past
    the retry timeout: a FailedScheduling for a pod that fits). Filter sends the next pod to a
    node nobody is binding to, when one fits; binpack's choice comes back once the first pod's
    allocation finished."""
    svc = service(node("n1", gpus=1), node("n2", gpus=1))
    ext = svc.extender
    ext.busy_wait = 0  # (waiting for a free node: the next test)
    ext.queue_depth = 1  # busy from the first bind in flight (the default, 2: the test after the next)
    a = seen(svc, pod("a", mem=300))
    assert (await ext.filter(args(a, ["n1", "n2"])))["NodeNames"] == ["n1"]
    assert ext.busy_nodes() == {"n1": 1}
    b = seen(svc, pod("b", mem=300))
    assert (await ext.filter(args(b, ["n1", "n2"])))["NodeNames"] == ["n2"]  # binpack alone says n1
    assert ext.busy_nodes() == {"n1": 1, "n2": 1}
    # every node busy: the one with the fewest binds in flight, if it fits
    assert (await ext.filter(args(seen(svc, pod("c", mem=600)), ["n1", "n2"])))["NodeNames"] == ["n1"]
    assert ext.busy_nodes() == {"n1": 2, "n2": 1}
    finished(svc, a)
    finished(svc, svc.state.pod("ns", "c"))
    assert ext.busy_nodes() == {"n2": 1}
    assert (await ext.filter(args(seen(svc, pod("d", mem=50)), ["n1", "n2"])))["NodeNames"] == ["n1"]
    svc.state.apply_pod("DELETED", b)  # a pod gone is no longer in flight
    assert ext.busy_nodes() == {"n1": 1}


async def test_when_every_node_that_fits_is_busy_filter_waits_for_one_to_be_free():
    svc = service(node("n1", gpus=1), node("n2", gpus=1))
    ext = svc.extender
    ext.queue_depth = 1
    a = seen(svc, pod("a", mem=300))
    b = seen(svc, pod("b", mem=200))
    assert (await ext.filter(args(a, ["n1", "n2"])))["NodeNames"] == ["n1"]
    assert (await ext.filter(args(b, ["n1", "n2"])))["NodeNames"] == ["n2"]
    c = asyncio.create_task(ext.filter(args(seen(svc, pod("c", mem=100)), ["n1", "n2"])))
    await asyncio.sleep(0.2)
    assert not c.done()  # both nodes have a bind in flight: no answer yet
    finished(svc, b)  # n2's pod allocated: n2 is free
    assert (await asyncio.wait_for(c, 5))["NodeNames"] == ["n2"]  # not binpack's n1, still busy
    assert [m for _, _, m, _ in svc.state.ledger.device_usage("n2")] == [300]  # b + c, one reservation each
    # nothing frees up within busy_wait: the least busy node that fits is answered
    ext.busy_wait = 0.3
    began = time.monotonic()
    # (one bind in flight on each: binpack's order, n2 holds two pods)
    assert (await ext.filter(args(seen(svc, pod("d", mem=100)), ["n1", "n2"])))["NodeNames"] == ["n2"]
    assert time.monotonic() - began >= 0.3
    # the pod is deleted while its Filter waits: nothing stays reserved
    ext.busy_wait = 5
    e = seen(svc, pod("e", mem=100))
    task = asyncio.create_task(ext.filter(args(e, ["n1", "n2"])))
    await asyncio.sleep(0.2)
    svc.state.apply_pod("DELETED", e)
    assert "went away" in (await asyncio.wait_for(task, 5))["Error"]
    assert svc.state.ledger.pod("uid-e") is None


async def test_by_default_a_node_is_busy_from_its_second_bind_in_flight():
    """One bind in flight costs a Bind at most one handoff: pods arriving one after the other keep
    binpack's order; a third pod goes elsewhere."""
    svc = service(node("n1", gpus=1), node("n2", gpus=1))
    ext = svc.extender
    assert ext.queue_depth == 2
    assert (await ext.filter(args(seen(svc, pod("a", mem=100)), ["n1", "n2"])))["NodeNames"] == ["n1"]
    assert (await ext.filter(args(seen(svc, pod("b", mem=100)), ["n1", "n2"])))["NodeNames"] == ["n1"]
    assert (await ext.filter(args(seen(svc, pod("c", mem=100)), ["n1", "n2"])))["NodeNames"] == ["n2"]
    assert ext.busy_nodes() == {"n1": 2, "n2": 1}


async def test_a_node_locked_by_an_unfinished_pod_of_another_replica_is_avoided():
    from datetime import datetime, timezone

    from hami.kube import nodelock

    n1 = node("n1", gpus=1)
    n1["metadata"]["annotations"][nodelock.NODE_LOCK] = nodelock.lock_value(datetime.now(timezone.utc), "ns", "other")
    svc = service(n1, node("n2", gpus=1))
    svc.extender.queue_depth = 1
    other = pod("other", node_name="n1", uuid="n1-g0", mem=100)
    other["spec"]["nodeName"] = "n1"
    other["metadata"]["annotations"]["hami.io/bind-phase"] = "allocating"
    svc.state.put_pod(other)
    assert svc.extender.busy_nodes() == {"n1": 1}
    assert (await svc.extender.filter(args(seen(svc, pod("a", mem=300)), ["n1", "n2"])))["NodeNames"] == ["n2"]
    finished(svc, other)  # its allocation done: the lock waits only for a swap, the node is free
    assert svc.extender.busy_nodes() == {"n2": 1}
    assert (await svc.extender.filter(args(seen(svc, pod("b", mem=300)), ["n1", "n2"])))["NodeNames"] == ["n1"]
    unlocked = {
        **n1,
        "metadata": {
            **n1["metadata"],
            "resourceVersion": "2",
            "annotations": {k: v for k, v in n1["metadata"]["annotations"].items() if k != nodelock.NODE_LOCK},
        },
    }
    svc.state.put_node(unlocked)
    assert svc.state.locked_nodes == set()


async def test_simulation_path_with_full_nodes_reserves_nothing():
    svc = service()
    answer = await svc.extender.filter({"Pod": pod("s", mem=100), "Nodes": {"items": [node("x")]}})
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["x"]
    assert svc.state.ledger.pods() == []


def test_failed_maps_and_event_summary():
    mem = NodeFailure(total=2, counts=((Reason.CARD_INSUFFICIENT_MEMORY, 2),))
    typ = NodeFailure(total=2, counts=((Reason.CARD_TYPE_MISMATCH, 1), (Reason.CARD_UUID_MISMATCH, 1)))
    assert failed_maps({"a": mem, "b": typ}) == (
        {"a": "2/2 CardInsufficientMemory"},
        {"b": "1/2 CardTypeMismatch, 1/2 CardUuidMismatch"},
    )
    assert failure_summary({"a": mem, "b": mem, "c": typ}) == [
        "2 nodes CardInsufficientMemory(a,b)",
        "1 nodes CardTypeMismatch(c)",
        "1 nodes CardUuidMismatch(c)",
    ]


def test_leadership_follows_the_lease_holder_prefix_and_expiry():
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(now - 5))
    lease = {"spec": {"holderIdentity": "hami-0_3f2a", "renewTime": stamp, "leaseDurationSeconds": 15}}
    assert holds_lease(lease, "hami-0", now)
    assert not holds_lease(lease, "hami-1", now)
    assert not holds_lease(lease, "hami-0", now + 20)
    assert not holds_lease(None, "hami-0", now)
    assert not holds_lease(lease, "hami", now)  # a mere prefix of the holder's name is someone else
    assert holds_lease({"spec": {**lease["spec"], "holderIdentity": "hami-0"}}, "hami-0", now)


def test_the_default_identity_is_the_hostname_kube_scheduler_names_itself_by(monkeypatch):
    """kube-scheduler's Lease identity is ``<hostname>_<uuid>``, and a pod's hostname is not its
    name with hostNetwork (the node's) or spec.hostname: ``$POD_NAME`` would never match it."""
    import argparse
    import socket

    from hami.scheduler import options as O

    pod, host = "hami-scheduler-6b8f9c7d5f-x2k9q", "gpu-node-17"  # hostNetwork: the node's hostname
    monkeypatch.setenv("POD_NAME", pod)
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    opts = O.options_from_args(parser.parse_args(["--leader-elect"]))
    assert (opts.identity, opts.pod_name) == (host, pod)  # the pod is still labelled by its name
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    lease = {"spec": {"holderIdentity": f"{host}_9d1c", "renewTime": stamp, "leaseDurationSeconds": 15}}
    assert holds_lease(lease, opts.identity, time.time())
    explicit = O.options_from_args(parser.parse_args(["--leader-elect", "--leader-elect-identity=other"]))
    assert explicit.identity == "other"


async def test_http_routes_health_readiness_and_bad_bodies():
    svc = service(node("n1"))
    async with TestClient(TestServer(svc.app())) as client:
        assert (await client.get("/healthz")).status == 200
        assert (await client.get("/readyz")).status == 200  # no watches to wait for, always leader
        svc.leader.is_leader = False
        r = await client.get("/readyz")  # a follower is ready (a rolling update needs it), and says so
        assert r.status == 200 and "follower" in await r.text()
        svc.synced = lambda: False
        r = await client.get("/readyz")
        assert r.status == 503 and "not synced" in await r.text()
        svc.synced = lambda: True
        svc.extender.ready_wait = 0.05
        answer = await (await client.post("/filter", json=args(pod("a", mem=10), ["n1"]))).json()
        assert "not the leader" in answer["Error"]
        r = await client.post("/filter", data=b"{nope")
        assert r.status == 400 and "not JSON" in await r.text()
        assert (await client.post("/bind", data=b"[1]")).status == 400


async def test_success_events_can_be_switched_off_failures_never():
    p = pod("e")
    quiet = EventRecorder(object(), "hami-scheduler", success=False)
    quiet.record(p, "FilteringSucceed", "ok")
    quiet.record(p, "FilteringFailed", "1 nodes CardInsufficientMemory(n1)", "Warning")
    assert [quiet.queue.get_nowait()["reason"] for _ in range(quiet.queue.qsize())] == ["FilteringFailed"]
    loud = EventRecorder(object(), "hami-scheduler")
    loud.record(p, "BindingSucceed", "Successfully binding node [n1] to ns/e")
    body = loud.queue.get_nowait()
    assert (body["reason"], body["type"], body["source"]["component"]) == ("BindingSucceed", "Normal", "hami-scheduler")
    assert body["involvedObject"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "namespace": "ns",
        "name": "e",
        "uid": "uid-e",
        "resourceVersion": "1",
    }


class FakeNodeApi:
    """GET/merge-PATCH of nodes with resourceVersion checks (what Bind's lock needs)."""

    def __init__(self, *nodes_):
        self.nodes = {n["metadata"]["name"]: n for n in nodes_}
        self.patches = 0

    async def get(self, path):
        return self.nodes[path.rsplit("/", 1)[1]]

    async def merge_patch(self, path, body):
        name = path.rsplit("/", 1)[1]
        meta = self.nodes[name]["metadata"]
        assert body["metadata"]["resourceVersion"] == meta["resourceVersion"]
        ann = dict(meta.get("annotations") or {})
        for k, v in body["metadata"]["annotations"].items():
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v
        self.patches += 1
        new = {
            **self.nodes[name],
            "metadata": {**meta, "annotations": ann, "resourceVersion": str(int(meta["resourceVersion"]) + 1)},
        }
        self.nodes[name] = new
        return new

    async def json_patch(self, path, ops):
        """test + replace/remove of one annotation (nodelock.swap_patch); a failed test -> 422."""
        from hami.kube.client import KubeError

        name = path.rsplit("/", 1)[1]
        meta = self.nodes[name]["metadata"]
        ann = dict(meta.get("annotations") or {})
        test, change = ops
        key = test["path"].split("/", 3)[3].replace("~1", "/").replace("~0", "~")
        if ann.get(key) != test["value"]:
            raise KubeError("PATCH", path, 422, '{"message": "test failed"}')
        if change["op"] == "remove":
            ann.pop(key)
        else:
            ann[key] = change["value"]
        self.patches += 1
        new = {
            **self.nodes[name],
            "metadata": {**meta, "annotations": ann, "resourceVersion": str(int(meta["resourceVersion"]) + 1)},
        }
        self.nodes[name] = new
        return new


def _stretch_lock_poll(svc) -> None:
    """A lock wait re-reads the node every second; here every minute, so that what ends a wait
    is told apart by what happened (an event, the handoff grace), not by how long it took: a
    loaded machine can stall the loop past any tight bound (a CI of 2 cores under load)."""
    wait = svc.state.node_changed

    async def node_changed(name, timeout):
        await wait(name, 60.0 if timeout == 1.0 else timeout)

    svc.state.node_changed = node_changed


def _held_by_allocating_owner():
    from datetime import datetime, timezone

    from hami.kube import nodelock

    held = node("n1")
    held["metadata"]["annotations"][nodelock.NODE_LOCK] = nodelock.lock_value(datetime.now(timezone.utc), "ns", "a")
    svc = service(held)
    api = FakeNodeApi(held)
    svc.extender.kube = api
    owner = pod("a", node_name="n1", uuid="n1-g0")
    owner["metadata"]["annotations"]["hami.io/bind-phase"] = "allocating"
    owner["spec"]["nodeName"] = "n1"
    svc.state.apply_pod("MODIFIED", owner)
    done = {
        **owner,
        "metadata": {
            **owner["metadata"],
            "resourceVersion": "2",
            "annotations": {**owner["metadata"]["annotations"], "hami.io/bind-phase": "success"},
        },
    }
    return svc, api, held, done


async def test_a_bind_waiting_for_a_lock_takes_it_right_after_the_plugins_release():
    """Owner finishes, the plugin's release comes back through the node watch: the waiter takes
    the free lock with one resourceVersion-guarded write, without racing the release."""
    from hami.kube import nodelock

    svc, api, held, done = _held_by_allocating_owner()
    svc.extender.handoff_grace = 30.0
    _stretch_lock_poll(svc)
    waiter = asyncio.create_task(svc.extender.acquire_lock("n1", "ns", "b"))
    await asyncio.sleep(0.05)
    assert not waiter.done() and api.patches == 0  # a live owner: Bind waits
    svc.state.apply_pod("MODIFIED", done)
    await asyncio.sleep(0.05)
    assert not waiter.done() and api.patches == 0  # finished: the plugin's release is awaited, not raced
    released = {
        **held,
        "metadata": {
            **held["metadata"],
            "resourceVersion": "2",
            "annotations": {k: v for k, v in held["metadata"]["annotations"].items() if k != nodelock.NODE_LOCK},
        },
    }
    api.nodes["n1"] = released
    svc.state.put_node(released)  # the watch event of the release
    value = await asyncio.wait_for(waiter, 5)  # woken by the node event: no poll, a 30 s grace
    assert nodelock.owned_by(value, "ns", "b") and api.patches == 1
    assert api.nodes["n1"]["metadata"]["annotations"][nodelock.NODE_LOCK] == value


async def test_on_a_node_whose_plugin_hands_the_lock_on_a_finished_owners_lock_is_swapped_at_once():
    """hami.io/node-lock-handoff=swap (our plugin, --lock-release-delay > 0): no waiting for a
    release that will not come soon; one compare-and-swap as soon as the owner is seen finished."""
    from hami.kube import nodelock

    svc, api, held, done = _held_by_allocating_owner()
    declared = {
        **held,
        "metadata": {
            **held["metadata"],
            "annotations": {**held["metadata"]["annotations"], nodelock.LOCK_HANDOFF: nodelock.HANDOFF_SWAP},
        },
    }
    api.nodes["n1"] = declared
    svc.state.put_node(declared)
    svc.extender.handoff_grace = 30.0
    node_get = api.get
    pod_reads = []

    async def get(path):
        if "/pods/" in path:
            pod_reads.append(path)
            return done
        return await node_get(path)

    api.get = get
    waiter = asyncio.create_task(svc.extender.acquire_lock("n1", "ns", "b"))
    await asyncio.sleep(0.05)
    assert not waiter.done() and api.patches == 0  # a live owner: Bind waits
    svc.state.apply_pod("MODIFIED", done)
    value = await asyncio.wait_for(waiter, 10)  # (the grace would be 30 s)
    assert nodelock.owned_by(value, "ns", "b") and api.patches == 1
    assert api.nodes["n1"]["metadata"]["annotations"][nodelock.NODE_LOCK] == value
    assert svc.extender.stats["lock_handoffs"] == 1 and svc.extender.stats["lock_reclaims"] == 0
    assert pod_reads == []  # the finished copy (revision 2) postdates the node copy with the lock (1): trusted


async def test_a_swap_at_once_reads_the_owner_first_a_same_name_successor_keeps_its_lock():
    """The lock names no UID: the cache's finished copy may be an earlier pod of that name while
    the lock belongs to its successor, bound here and still allocating. The owner is read before
    the swap; a live successor keeps the lock and the Bind waits."""
    from hami.kube import nodelock

    svc, api, held, done = _held_by_allocating_owner()
    declared = {
        **held,
        "metadata": {
            **held["metadata"],
            "resourceVersion": "5",
            "annotations": {**held["metadata"]["annotations"], nodelock.LOCK_HANDOFF: nodelock.HANDOFF_SWAP},
        },
    }
    api.nodes["n1"] = declared
    svc.state.put_node(declared)  # the lock was written at revision 5, after the predecessor's last write (2)
    successor = {
        **done,
        "metadata": {
            **done["metadata"],
            "uid": "uid-a-2",
            "resourceVersion": "9",
            "annotations": {**done["metadata"]["annotations"], "hami.io/bind-phase": "allocating"},
        },
    }
    node_get = api.get

    async def get(path):
        return successor if "/pods/" in path else await node_get(path)

    api.get = get
    svc.state.apply_pod("MODIFIED", done)  # the cache: the earlier pod of that name, finished
    svc.extender.lock_retry_timeout = 0.3
    with pytest.raises(nodelock.LockContention):
        await svc.extender.acquire_lock("n1", "ns", "b")
    assert api.patches == 0 and nodelock.owned_by(
        api.nodes["n1"]["metadata"]["annotations"][nodelock.NODE_LOCK], "ns", "a"
    )


async def test_a_finished_owners_lock_is_swapped_over_when_the_plugin_never_releases_it():
    """No release within the handoff grace: one compare-and-swap of exactly the owner's value;
    the value stays HAMi's `time,ns,name`."""
    from hami.kube import nodelock

    svc, api, held, done = _held_by_allocating_owner()
    svc.extender.handoff_grace = 0.3
    _stretch_lock_poll(svc)
    waiter = asyncio.create_task(svc.extender.acquire_lock("n1", "ns", "b"))
    await asyncio.sleep(0.05)
    began = time.monotonic()
    svc.state.apply_pod("MODIFIED", done)
    value = await asyncio.wait_for(waiter, 5)  # not the poll (a minute here) nor the retry timeout (28 s)
    assert time.monotonic() - began >= 0.29  # after the grace (0.3 s; timers may fire a hair early), not at once
    assert nodelock.owned_by(value, "ns", "b") and api.patches == 1
    assert api.nodes["n1"]["metadata"]["annotations"][nodelock.NODE_LOCK] == value


async def test_a_takeover_that_loses_to_the_plugins_release_rereads_and_takes_the_free_lock():
    """The cache still shows the finished owner's lock; on the server the plugin already removed
    it. The compare-and-swap fails (422, nothing written), the node is re-read, the free lock
    is taken with a resourceVersion guard: two writes, never a lock over someone else's."""
    from datetime import datetime, timezone

    from hami.kube import nodelock

    held = node("n1")
    old = nodelock.lock_value(datetime.now(timezone.utc), "ns", "a")
    held["metadata"]["annotations"][nodelock.NODE_LOCK] = old
    svc = service(held)
    released = {
        **held,
        "metadata": {
            **held["metadata"],
            "resourceVersion": "7",
            "annotations": {k: v for k, v in held["metadata"]["annotations"].items() if k != nodelock.NODE_LOCK},
        },
    }
    api = FakeNodeApi(released)
    svc.extender.kube = api
    owner = pod("a", node_name="n1", uuid="n1-g0")
    owner["metadata"]["annotations"]["hami.io/bind-phase"] = "success"
    svc.state.apply_pod("MODIFIED", owner)
    value = await asyncio.wait_for(svc.extender.acquire_lock("n1", "ns", "b"), 5)
    assert nodelock.owned_by(value, "ns", "b") and api.patches == 1
    assert api.nodes["n1"]["metadata"]["annotations"][nodelock.NODE_LOCK] == value
    assert api.nodes["n1"]["metadata"]["resourceVersion"] == "8"


async def test_the_sweep_leaves_a_finished_owners_lock_to_the_plugin_for_one_pass():
    """Owner finished, lock still there: the first pass leaves it (the plugin's release or a
    waiting Bind's takeover is on its way); the same value on the next pass is released."""
    from hami.kube import nodelock

    svc, api, held, done = _held_by_allocating_owner()
    svc.state.apply_pod("MODIFIED", done)
    assert await svc.extender.sweep_locks() == 0 and api.patches == 0
    assert await svc.extender.sweep_locks() == 1 and api.patches == 1
    assert nodelock.NODE_LOCK not in api.nodes["n1"]["metadata"]["annotations"]


async def test_a_lock_already_naming_the_pod_is_written_anew():
    """A retried Bind, or a new pod that inherits a deleted namesake's lock: a fresh value is
    swapped in, so the lock's revision postdates everything the old pod was (PodCache relies on it)."""
    from datetime import datetime, timedelta, timezone

    from hami.kube import nodelock

    held = node("n1")
    old = nodelock.lock_value(datetime.now(timezone.utc) - timedelta(seconds=30), "ns", "a")
    held["metadata"]["annotations"][nodelock.NODE_LOCK] = old
    svc = service(held)
    api = FakeNodeApi(held)
    svc.extender.kube = api
    value = await asyncio.wait_for(svc.extender.acquire_lock("n1", "ns", "a"), 5)
    assert value != old and nodelock.owned_by(value, "ns", "a") and api.patches == 1
    assert api.nodes["n1"]["metadata"]["annotations"][nodelock.NODE_LOCK] == value


async def test_a_lock_write_refused_on_an_unchanged_node_is_an_error_not_a_retry_loop():
    """A 422 that is not a lost compare (a policy on nodes, annotations over 256 KiB): the node
    read again is unchanged, so the refusal is the API server's answer, raised at once with its
    message. It was retried without a pause until the retry timeout: ~690 GETs and PATCHes in 2 s
    against a fast API server, then "locked by ''" (28 s of that per Bind by default)."""
    from datetime import datetime, timezone

    from hami.kube import nodelock
    from hami.kube.client import KubeError

    class Refusing(FakeNodeApi):
        gets = 0

        async def get(self, path):
            if "/pods/" in path:  # the lock's owner is gone
                raise KubeError("GET", path, 404, '{"message": "not found"}')
            Refusing.gets += 1
            return await super().get(path)

        async def json_patch(self, path, ops):
            self.patches += 1
            raise KubeError("PATCH", path, 422, '{"message": "denied by policy"}')

        async def merge_patch(self, path, body):
            self.patches += 1
            raise KubeError("PATCH", path, 422, '{"message": "metadata.annotations: Too long"}')

    held = node("n1")
    held["metadata"]["annotations"][nodelock.NODE_LOCK] = nodelock.lock_value(datetime.now(timezone.utc), "ns", "gone")
    svc = service(held)
    api = svc.extender.kube = Refusing(held)
    svc.extender.lock_retry_timeout = 5
    with pytest.raises(KubeError, match="denied by policy"):
        await asyncio.wait_for(svc.extender.acquire_lock("n1", "ns", "b"), 10)
    assert api.patches == 1, api.patches
    free = node("n2")
    svc = service(free)
    api = svc.extender.kube = Refusing(free)
    svc.extender.lock_retry_timeout = 5
    with pytest.raises(KubeError, match="Too long"):
        await asyncio.wait_for(svc.extender.acquire_lock("n2", "ns", "b"), 10)
    assert api.patches == 1, api.patches


async def test_a_lock_write_lost_to_a_changed_node_is_tried_again():
    """A 409/422 after which the node reads changed was a lost race: read, judge, write again."""
    from hami.kube import nodelock
    from hami.kube.client import KubeError

    class Racing(FakeNodeApi):
        raced = False

        async def merge_patch(self, path, body):
            if not Racing.raced:  # someone else's write lands first: a new version, no lock
                Racing.raced = True
                name = path.rsplit("/", 1)[1]
                meta = self.nodes[name]["metadata"]
                self.nodes[name] = {**self.nodes[name], "metadata": {**meta, "resourceVersion": "7"}}
                raise KubeError("PATCH", path, 409, '{"message": "the object has been modified"}')
            return await super().merge_patch(path, body)

    free = node("n1")
    svc = service(free)
    api = svc.extender.kube = Racing(free)
    value = await asyncio.wait_for(svc.extender.acquire_lock("n1", "ns", "b"), 10)
    assert nodelock.owned_by(value, "ns", "b") and api.patches == 1


def test_swap_patch_escapes_the_annotation_key_and_tests_the_old_value():
    from hami.kube import nodelock

    ops = nodelock.swap_patch("cambricon.com/dsmlu~lock", "t0", None)
    assert ops == [
        {"op": "test", "path": "/metadata/annotations/cambricon.com~1dsmlu~0lock", "value": "t0"},
        {"op": "remove", "path": "/metadata/annotations/cambricon.com~1dsmlu~0lock"},
    ]
    assert nodelock.swap_patch("hami.io/mutex.lock", "a", "b")[1] == {
        "op": "replace",
        "path": "/metadata/annotations/hami.io~1mutex.lock",
        "value": "b",
    }


class FakeBindApi(FakeNodeApi):
    """Nodes as FakeNodeApi; pods by GET; the Binding POST fails with ``post_error`` after it
    did (``lands``) or did not bind the pod on the server."""

    def __init__(self, node_, pod_, post_error, lands, get_error=None):
        super().__init__(node_)
        self.pod, self.post_error, self.lands, self.get_error = pod_, post_error, lands, get_error

    async def get(self, path):
        if "/pods/" not in path:
            return await super().get(path)
        if self.get_error is not None:
            raise self.get_error
        return self.pod

    async def post(self, path, body):
        assert path.startswith("/api/v1/namespaces/ns/pods/a/binding?timeout=")  # bounded on the server too
        if self.lands:
            self.pod = {
                **self.pod,
                "spec": {**self.pod["spec"], "nodeName": body["target"]["name"]},
                "metadata": {
                    **self.pod["metadata"],
                    "resourceVersion": "2",
                    "annotations": {**self.pod["metadata"]["annotations"], **body["metadata"]["annotations"]},
                },
            }
        raise self.post_error


def _bind_setup(post_error, lands, get_error=None):
    from hami.kube.client import KubeError

    svc = service(node("n1"))
    p = pod("a", node_name="n1", uuid="n1-g0")
    svc.state.apply_pod("MODIFIED", p)
    api = FakeBindApi(svc.state.nodes["n1"], p, post_error, lands, get_error)
    svc.extender.kube = api
    svc.extender.events = EventRecorder(object(), "hami-scheduler")
    return svc, api, KubeError


@pytest.mark.parametrize("error", ["timeout", "reset", "conflict"])
async def test_a_binding_that_landed_despite_an_error_is_a_success_and_keeps_the_lock(error):
    from hami.kube import nodelock
    from hami.kube.client import KubeError

    exc = {
        "timeout": asyncio.TimeoutError(),
        "reset": ConnectionResetError("reset by peer"),
        "conflict": KubeError("POST", "binding", 409, '{"message": "pod a is already assigned to node n1"}'),
    }[error]
    svc, api, _ = _bind_setup(exc, lands=True)
    answer = await svc.extender.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": "n1"})
    assert answer == {"Error": ""}
    assert nodelock.owned_by(api.nodes["n1"]["metadata"]["annotations"].get(nodelock.NODE_LOCK), "ns", "a")
    reasons = [svc.extender.events.queue.get_nowait()["reason"] for _ in range(svc.extender.events.queue.qsize())]
    assert reasons == ["BindingSucceed"]


async def test_a_binding_error_releases_the_lock_only_when_the_pod_is_verifiably_not_bound():
    from hami.kube import nodelock
    from hami.kube.client import KubeError as KubeError_
    from hami.scheduler.extender import CUT_BINDING_LIVES

    # refused (4xx): nothing was written, the lock goes at once
    svc, api, KubeError = _bind_setup(KubeError_("POST", "binding", 403, "forbidden"), lands=False)
    answer = await svc.extender.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": "n1"})
    assert "failed" in answer["Error"]
    assert nodelock.NODE_LOCK not in api.nodes["n1"]["metadata"]["annotations"]
    # no answer (a timeout) and not bound yet: the API server may still write it (review, 1 Dec):
    # the lock stays until it cannot, then the sweep removes it
    svc, api, KubeError = _bind_setup(asyncio.TimeoutError(), lands=False)
    answer = await svc.extender.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": "n1"})
    assert "may still write the Binding" in answer["Error"]
    assert nodelock.owned_by(api.nodes["n1"]["metadata"]["annotations"].get(nodelock.NODE_LOCK), "ns", "a")
    await svc.extender.settle_unverified(time.monotonic() + CUT_BINDING_LIVES + 1)
    assert nodelock.NODE_LOCK not in api.nodes["n1"]["metadata"]["annotations"]
    # the POST failed and the pod cannot be read either: it may be bound, the lock stays
    svc, api, KubeError = _bind_setup(
        asyncio.TimeoutError(), lands=True, get_error=KubeError("GET", "pod", 503, "busy")
    )
    answer = await svc.extender.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": "n1"})
    assert "cannot tell whether it is bound" in answer["Error"]
    assert nodelock.owned_by(api.nodes["n1"]["metadata"]["annotations"].get(nodelock.NODE_LOCK), "ns", "a")


async def test_a_lock_is_not_taken_over_from_a_pod_bound_here_whose_cached_copy_lags():
    """The cache says the owner was placed elsewhere (stale); the API says it is bound to this
    node and still allocating: the lock is live."""
    from datetime import datetime, timezone

    from hami.kube import nodelock

    held = node("n1")
    held["metadata"]["annotations"][nodelock.NODE_LOCK] = nodelock.lock_value(datetime.now(timezone.utc), "ns", "a")
    svc = service(held, node("n2"))
    svc.extender.lock_retry_timeout = 0
    stale = pod("a", node_name="n2", uuid="n2-g0")
    svc.state.apply_pod("MODIFIED", stale)
    live = {**pod("a", node_name="n1", uuid="n1-g0"), "spec": {**stale["spec"], "nodeName": "n1"}}
    live["metadata"] = {
        **live["metadata"],
        "resourceVersion": "5",
        "annotations": {**live["metadata"]["annotations"], "hami.io/bind-phase": "allocating"},
    }
    api = FakeBindApi(held, live, None, False)
    svc.extender.kube = api
    with pytest.raises(nodelock.LockContention):
        await svc.extender.acquire_lock("n1", "ns", "b")
    assert api.patches == 0 and svc.state.pod("ns", "a")["metadata"]["resourceVersion"] == "5"
    assert await svc.extender.sweep_locks() == 0
    # even a bound-here pod whose vgpu-node names another node keeps its lock (pure rule)
    odd = {
        **live,
        "metadata": {**live["metadata"], "annotations": {**live["metadata"]["annotations"], "hami.io/vgpu-node": "n2"}},
    }
    value = held["metadata"]["annotations"][nodelock.NODE_LOCK]
    assert nodelock.stale_reason(value, "n1", datetime.now(timezone.utc), 300, odd) is None


class FakeDecisionApi(FakeNodeApi):
    """Nodes as FakeNodeApi; pods: merge patches (decision_write "filter") and Bindings, recorded."""

    def __init__(self, node_, pods_):
        super().__init__(node_)
        self.pods = {p["metadata"]["name"]: p for p in pods_}
        self.pod_patches: list[dict] = []
        self.bindings: list[dict] = []

    async def get(self, path):
        if "/pods/" in path:
            from hami.kube.client import KubeError

            name = path.rsplit("/", 1)[1]
            if name not in self.pods:
                raise KubeError("GET", path, 404, '{"message": "not found"}')
            return self.pods[name]
        return await super().get(path)

    async def merge_patch(self, path, body):
        if "/pods/" not in path:
            return await super().merge_patch(path, body)
        name = path.rsplit("/", 1)[1]
        self.pod_patches.append(body)
        p = self.pods[name]
        meta = {
            **p["metadata"],
            "annotations": {**p["metadata"]["annotations"], **body["metadata"]["annotations"]},
            "labels": {**(p["metadata"].get("labels") or {}), **body["metadata"].get("labels", {})},
            "resourceVersion": str(int(p["metadata"]["resourceVersion"]) + 1),
        }
        self.pods[name] = {**p, "metadata": meta}
        return self.pods[name]

    async def post(self, path, body):
        name = path.split("/")[-2]
        self.bindings.append(body)
        p = self.pods[name]
        meta = {
            **p["metadata"],
            "annotations": {**p["metadata"]["annotations"], **body["metadata"]["annotations"]},
            "resourceVersion": str(int(p["metadata"]["resourceVersion"]) + 1),
        }
        self.pods[name] = {**p, "metadata": meta, "spec": {**p["spec"], "nodeName": body["target"]["name"]}}
        return {"kind": "Status", "status": "Success"}


def _decision_setup(mode, *names, gpus=1, api_class=None, **options):
    """A service writing decisions by ``mode``, nodes n1 and n2 of ``gpus`` 1000 MiB GPUs, pods
    ``names`` asking 600 MiB each, its API ``api_class`` (FakeDecisionApi) over them."""
    svc = SchedulerService(Options(decision_write=mode, **options), None)
    svc.state.node_handler.replace([node("n1", gpus=gpus), node("n2", gpus=gpus)])
    pods_ = [pod(n, mem=600) for n in names]
    for p in pods_:
        svc.state.apply_pod("ADDED", p)
    api = (api_class or FakeDecisionApi)(svc.state.nodes["n1"], pods_)
    api.nodes["n2"] = svc.state.nodes["n2"]
    svc.extender.kube = api
    svc.extender.events = EventRecorder(object(), "hami-scheduler")
    return svc, api


async def test_decision_rides_on_the_binding_and_no_pod_patch_is_made():
    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    assert api.pod_patches == [] and svc.state.ledger.is_reserved("uid-a")
    assert (await ext.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": chosen})) == {"Error": ""}
    assert api.pod_patches == []  # Filter and Bind together: one pod write, the Binding
    (binding,) = api.bindings
    ann = binding["metadata"]["annotations"]
    assert ann["hami.io/vgpu-node"] == chosen and ann["hami.io/bind-phase"] == "allocating"
    assert ann["hami.io/vgpu-time"] and ann["hami.io/bind-time"]
    (devices,) = decode_pod_devices(ann["hami.io/vgpu-devices-allocated"])
    assert [(d.uuid, d.usedmem) for d in devices] == [(f"{chosen}-g0", 600)]
    assert ann["hami.io/vgpu-devices-to-allocate"] == ann["hami.io/vgpu-devices-allocated"]
    # the bound pod's watch event confirms the reservation with the same allocation
    svc.state.apply_pod("MODIFIED", api.pods["a"])
    assert not svc.state.ledger.is_reserved("uid-a")
    assert svc.state.ledger.pod("uid-a").node == chosen
    assert sum(m for n in ("n1", "n2") for _, _, m, _ in svc.state.ledger.device_usage(n)) == 600


async def test_filter_mode_patches_the_pod_from_filter_as_hami_does():
    svc, api = _decision_setup("filter", "a")
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    await ext.decision_recorded("ns", "a")
    (patch,) = api.pod_patches
    assert patch["metadata"]["labels"] == {"hami.io/vgpu-node": chosen}
    assert patch["metadata"]["annotations"]["hami.io/vgpu-node"] == chosen
    assert (await ext.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": chosen})) == {"Error": ""}
    (binding,) = api.bindings
    assert set(binding["metadata"]["annotations"]) == {"hami.io/bind-phase", "hami.io/bind-time"}


async def test_a_bind_without_a_decision_for_that_node_fails_and_keeps_no_lock():
    """kube-scheduler binding elsewhere than decided, or a Bind reaching a replica that never
    filtered the pod (restarted, new leader): no allocation to write, so the Bind fails and the
    pod is filtered again; nothing is bound and no lock is left."""
    from hami.kube import nodelock

    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    other = "n2" if chosen == "n1" else "n1"
    answer = await ext.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": other})
    assert "carries no decision" in answer["Error"]
    assert api.bindings == [] and all(
        nodelock.NODE_LOCK not in n["metadata"]["annotations"] for n in api.nodes.values()
    )
    # the decision for the other node stays tracked: it expires with its reservation
    assert svc.state.ledger.is_reserved("uid-a")
    assert ext.expire_decisions(time.monotonic() + ext.decision_ttl + 1) == 1 and svc.state.ledger.pod("uid-a") is None
    fresh, api2 = _decision_setup("binding", "a")  # a replica that never saw the Filter
    answer = await fresh.extender.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": chosen})
    assert "carries no decision" in answer["Error"] and api2.bindings == []


async def test_a_decision_no_bind_comes_for_expires_with_its_reservation():
    svc, api = _decision_setup("binding", "a", "b")
    ext = svc.extender
    ext.decision_ttl = 60.0
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    assert ext.expire_decisions(time.monotonic() + 30) == 0 and svc.state.ledger.is_reserved("uid-a")
    assert ext.expire_decisions(time.monotonic() + 61) == 1
    assert svc.state.ledger.pod("uid-a") is None
    assert sum(m for n in ("n1", "n2") for _, _, m, _ in svc.state.ledger.device_usage(n)) == 0
    answer = await ext.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": chosen})
    assert "carries no decision" in answer["Error"] and api.bindings == []


def hold_lock_for_busy_pod(svc, api, node: str) -> dict:
    """``node``'s lock held by a live pod "busy", bound there and still allocating."""
    from datetime import datetime, timezone

    from hami.kube import nodelock

    api.nodes[node]["metadata"]["annotations"][nodelock.NODE_LOCK] = nodelock.lock_value(
        datetime.now(timezone.utc), "ns", "busy"
    )
    svc.state.put_node(api.nodes[node])
    busy = pod("busy", mem=10)
    busy["metadata"]["annotations"]["hami.io/bind-phase"] = "allocating"
    busy["spec"]["nodeName"] = node
    svc.state.apply_pod("ADDED", busy)
    api.pods["busy"] = busy
    return busy


async def test_a_failed_bind_keeps_the_decision_so_it_can_expire():
    """A Bind that fails (here: the node lock stays busy) leaves the reservation and the decision
    in place for kube-scheduler's retry; with no retry, the decision expires with it."""

    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    ext.lock_retry_timeout = 0
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    hold_lock_for_busy_pod(svc, api, chosen)
    answer = await ext.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": chosen})
    assert "failed" in answer["Error"] and api.bindings == []
    assert svc.state.ledger.is_reserved("uid-a")
    assert ext.expire_decisions(time.monotonic() + ext.decision_ttl + 1) == 1
    assert svc.state.ledger.pod("uid-a") is None


async def test_a_pod_bound_elsewhere_replaces_this_replicas_reservation():
    """This replica filtered the pod (reserved on one node), lost the lease; the new leader bound
    it to the other node. The bound pod's watch event wins over the stale reservation at once."""
    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    other = "n2" if chosen == "n1" else "n1"
    bound = pod("a", node_name=other, uuid=f"{other}-g0", mem=600)
    bound["metadata"]["resourceVersion"] = "5"
    bound["spec"]["nodeName"] = other
    svc.state.apply_pod("MODIFIED", bound)
    assert not svc.state.ledger.is_reserved("uid-a") and svc.state.ledger.pod("uid-a").node == other
    assert [m for _, _, m, _ in svc.state.ledger.device_usage(chosen)] == [0]
    assert [m for _, _, m, _ in svc.state.ledger.device_usage(other)] == [600]
    assert ext.expire_decisions(time.monotonic() + ext.decision_ttl + 1) == 1  # leaves the bound pod alone
    assert svc.state.ledger.pod("uid-a").node == other


async def test_a_refilter_replaces_the_unwritten_decision():
    svc, api = _decision_setup("binding", "a", gpus=1)
    ext = svc.extender
    first = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    other = "n2" if first == "n1" else "n1"
    again = await ext.filter(args(svc.state.pod("ns", "a"), [other]))
    assert again["NodeNames"] == [other]
    assert (await ext.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": other})) == {"Error": ""}
    assert api.bindings[0]["metadata"]["annotations"]["hami.io/vgpu-node"] == other
    assert [m for _, _, m, _ in svc.state.ledger.device_usage(first)] == [0]


def test_decision_write_is_validated():
    from hami.scheduler.options import add_arguments, options_from_args
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert options_from_args(parser.parse_args([])).decision_write == "binding"
    assert options_from_args(parser.parse_args(["--decision-write=filter"])).decision_write == "filter"
    with pytest.raises(SystemExit):
        parser.parse_args(["--decision-write=later"])
    with pytest.raises(ValueError, match="decision_write"):
        SchedulerService(Options(decision_write="later"), None)


async def test_a_lock_a_failed_bind_could_not_give_back_is_removed_by_the_next_sweep():
    """Found by tests/integration/test_chaos.py: the API server died between a Bind's lock and
    its Binding, and the release failed too. The lock named a pending pod (live by every
    stale_reason rule) and blocked the node until its expiry. The value is remembered and the
    next sweep removes exactly it; a newer value on the node is left alone."""
    from hami.kube import nodelock

    held = node("n1")
    svc = service(held)
    api = FakeNodeApi(held)
    svc.extender.kube = api
    value = await asyncio.wait_for(svc.extender.acquire_lock("n1", "ns", "a"), 5)

    class Down(FakeNodeApi):
        async def json_patch(self, path, ops):
            raise ConnectionRefusedError(111, "Connection refused")

    down = Down()
    down.nodes = api.nodes
    svc.extender.kube = down
    await svc.extender._release_quietly("n1", "ns", "a", nodelock.HAMI_LOCK, value)
    assert api.nodes["n1"]["metadata"]["annotations"][nodelock.NODE_LOCK] == value  # still there
    assert await svc.extender.release_owed() == 0  # still down: kept for the next pass
    svc.extender.kube = api  # the API server is back
    assert await svc.extender.sweep_locks() == 1
    assert nodelock.NODE_LOCK not in api.nodes["n1"]["metadata"]["annotations"]
    assert await svc.extender.release_owed() == 0 and not svc.extender._owed_releases
    # a value owed but replaced meanwhile (a retried Bind wrote a new one) is not touched
    newer = await asyncio.wait_for(svc.extender.acquire_lock("n1", "ns", "b"), 5)
    svc.extender._owed_releases.add(("n1", nodelock.NODE_LOCK, value))
    assert await svc.extender.release_owed() == 0 and not svc.extender._owed_releases
    assert api.nodes["n1"]["metadata"]["annotations"][nodelock.NODE_LOCK] == newer


async def test_refusals_no_eviction_cures_are_unresolvable_the_others_not():
    # n1: one GPU of 1000 MiB; n2: two, one holding 600 MiB
    svc = service(node("n1", gpus=1), node("n2", gpus=2))
    ext = svc.extender
    held = await ext.filter(args(seen(svc, pod("held", mem=600)), ["n2"]))
    assert held["NodeNames"] == ["n2"]
    two = pod("two", mem=600)
    two["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 2
    a = await ext.filter(args(seen(svc, two), ["n1", "n2"]))
    # n1 has one GPU for two: final; n2's GPUs are in use: an eviction may free them
    assert a["NodeNames"] == []
    assert a["FailedAndUnresolvableNodes"] == {"n1": "NodeInsufficientDevice"}
    assert set(a["FailedNodes"]) == {"n2"}
    big = await ext.filter(args(seen(svc, pod("big", mem=1500)), ["n1", "n2"]))
    # more memory than any GPU of either node has in all: no eviction makes room
    assert big["NodeNames"] == [] and big["FailedNodes"] == {}
    assert set(big["FailedAndUnresolvableNodes"]) == {"n1", "n2"}
    fill = await ext.filter(args(seen(svc, pod("fill", mem=900)), ["n1"]))
    assert fill["NodeNames"] == ["n1"]
    more = await ext.filter(args(seen(svc, pod("more", mem=900)), ["n1"]))
    # the memory is taken, not missing: preemption may help
    assert more["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"} and more["FailedAndUnresolvableNodes"] == {}


async def test_too_few_devices_found_by_the_fit_is_unresolvable_too():
    # an unhealthy GPU keeps the summary rules out: the node is fitted device by device
    sick = node("n1", gpus=2)
    devs = [
        DeviceInfo(id=f"n1-g{i}", index=i, count=10, devmem=1000, devcore=100, type="NVIDIA-T4", health=i == 0)
        for i in range(2)
    ]
    sick["metadata"]["annotations"]["hami.io/node-nvidia-register"] = encode_node_devices_json(devs)
    svc = service(sick)
    three = pod("three", mem=100)
    three["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 3
    got = await svc.extender.filter(args(seen(svc, three), ["n1"]))
    assert got["FailedAndUnresolvableNodes"] == {"n1": "NodeInsufficientDevice"}


def test_failed_maps_follow_the_final_flag():
    few = NodeFailure(total=1, counts=((Reason.NODE_INSUFFICIENT_DEVICE, 2),), bare=True, final=True)
    mem = NodeFailure(total=2, counts=((Reason.CARD_INSUFFICIENT_MEMORY, 2),))
    huge = NodeFailure(total=2, counts=((Reason.CARD_INSUFFICIENT_MEMORY, 2),), final=True)
    assert failed_maps({"a": few, "b": mem, "c": huge}) == (
        {"b": "2/2 CardInsufficientMemory"},
        {"a": "NodeInsufficientDevice", "c": "2/2 CardInsufficientMemory"},
    )


async def test_a_repeated_event_raises_the_count_of_the_one_written():
    class Api:
        def __init__(self):
            self.calls = []

        async def post(self, path, body):
            self.calls.append(("POST", path, body))

        async def merge_patch(self, path, body):
            self.calls.append(("PATCH", path, body))

    now = [100.0]
    api = Api()
    rec = EventRecorder(api, "hami-scheduler", repeat_interval=30.0, clock=lambda: now[0])
    p = pod("w")
    line = "2 nodes CardInsufficientMemory(n1,n2)"
    for _ in range(3):  # kube-scheduler's retries, close together
        rec.record(p, "FilteringFailed", line, "Warning")
    rec.record(p, "FilteringFailed", "1 nodes CardTypeMismatch(n3)", "Warning")  # another message: its own
    assert rec.queue.qsize() == 2 and rec.coalesced == 2
    now[0] += 31
    rec.record(p, "FilteringFailed", line, "Warning")
    runner = asyncio.ensure_future(rec.run())
    while rec.queue.qsize():
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    runner.cancel()
    verbs = [(verb, path.rsplit("/", 1)[1].startswith("w.")) for verb, path, _ in api.calls]
    assert verbs == [("POST", False), ("POST", False), ("PATCH", True)]
    first = api.calls[0][2]["metadata"]["name"]
    assert api.calls[2][1] == f"/api/v1/namespaces/ns/events/{first}"
    assert api.calls[2][2]["count"] == 4  # the three first ones and this one


def test_success_events_are_written_once_and_not_remembered_warnings_are():
    # issue 26: a series per placed pod's success line filled the bound over a churning soak
    rec = EventRecorder(object(), "hami-scheduler", maxsize=0)
    for i in range(50):
        rec.record(pod(f"s{i}"), "BindingSucceed", f"bound s{i}")
    assert rec.queue.qsize() == 50 and len(rec._series) == 0
    rec.record(pod("w"), "FilteringFailed", "1 nodes CardInsufficientMemory(n1)", "Warning")
    rec.record(pod("w"), "FilteringFailed", "1 nodes CardInsufficientMemory(n1)", "Warning")
    assert rec.queue.qsize() == 51 and len(rec._series) == 1 and rec.coalesced == 1


def test_success_events_never_crowd_out_warnings():
    rec = EventRecorder(object(), "hami-scheduler", maxsize=10)
    for i in range(20):  # a burst of placements
        rec.record(pod(f"s{i}"), "BindingSucceed", f"bound s{i}")
    for i in range(5):  # then pods that fit nowhere
        rec.record(pod(f"w{i}"), "FilteringFailed", "3 nodes CardInsufficientMemory(a,b,c)", "Warning")
    reasons = [rec.queue.get_nowait()["reason"] for _ in range(rec.queue.qsize())]
    assert reasons.count("BindingSucceed") == 5 and reasons.count("FilteringFailed") == 5
    assert rec.dropped == 15


async def test_a_lock_written_whose_answer_was_lost_is_removed_by_the_next_sweep():
    """Found by tests/integration/test_chaos.py (kube-apiserver killed mid-burst): the lock write
    was applied but its answer never came, so the Bind failed without knowing it held the lock,
    which named a pod never bound and blocked the node until its expiry. The value written is
    owed to the sweep like a failed release; a refused write (4xx) owes nothing."""
    from hami.kube import nodelock
    from hami.kube.client import KubeError

    held = node("n1")
    svc = service(held)

    class LostAnswer(FakeNodeApi):
        async def merge_patch(self, path, body):
            await super().merge_patch(path, body)  # applied on the server...
            raise ConnectionResetError(104, "Connection reset by peer")  # ...answer lost

    lost = LostAnswer(held)
    svc.extender.kube = lost
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(svc.extender.acquire_lock("n1", "ns", "a"), 5)
    written = lost.nodes["n1"]["metadata"]["annotations"][nodelock.NODE_LOCK]
    assert svc.extender._owed_releases == {("n1", nodelock.NODE_LOCK, written)}
    api = FakeNodeApi(held)
    api.nodes = lost.nodes
    svc.extender.kube = api
    assert await svc.extender.sweep_locks() >= 1
    assert nodelock.NODE_LOCK not in api.nodes["n1"]["metadata"]["annotations"]
    assert not svc.extender._owed_releases

    class Refused(FakeNodeApi):
        async def merge_patch(self, path, body):
            raise KubeError("PATCH", path, 403, '{"message": "forbidden"}')

    refused = Refused(held)
    refused.nodes = api.nodes
    svc.extender.kube = refused
    with pytest.raises(KubeError):
        await asyncio.wait_for(svc.extender.acquire_lock("n1", "ns", "b"), 5)
    assert not svc.extender._owed_releases


def test_success_events_are_paced_warnings_are_not():
    now = [100.0]
    rec = EventRecorder(
        object(), "hami-scheduler", maxsize=1000, clock=lambda: now[0], success_rate=10, success_burst=5
    )
    for i in range(8):  # a burst: the first five
        rec.record(pod(f"s{i}"), "BindingSucceed", f"bound s{i}")
    for i in range(8):  # warnings are not paced
        rec.record(pod(f"w{i}"), "FilteringFailed", "3 nodes CardInsufficientMemory(a,b,c)", "Warning")
    now[0] += 0.25  # two and a half tokens back: two more
    for i in range(8, 12):
        rec.record(pod(f"s{i}"), "BindingSucceed", f"bound s{i}")
    now[0] += 60  # a quiet minute refills the burst, no more
    for i in range(12, 20):
        rec.record(pod(f"s{i}"), "BindingSucceed", f"bound s{i}")
    items = [rec.queue.get_nowait() for _ in range(rec.queue.qsize())]
    written = [i["involvedObject"]["name"] for i in items if i["reason"] == "BindingSucceed"]
    assert written == ["s0", "s1", "s2", "s3", "s4", "s8", "s9", "s12", "s13", "s14", "s15", "s16"]
    assert sum(i["reason"] == "FilteringFailed" for i in items) == 8
    assert rec.skipped == 8 and rec.dropped == 0


def test_a_success_event_rate_of_zero_writes_every_one():
    now = [100.0]
    rec = EventRecorder(object(), "hami-scheduler", maxsize=1000, clock=lambda: now[0], success_rate=0, success_burst=5)
    for i in range(40):  # a burst eight times the burst size, no time passing
        rec.record(pod(f"s{i}"), "BindingSucceed", f"bound s{i}")
    items = [rec.queue.get_nowait() for _ in range(rec.queue.qsize())]
    assert [i["involvedObject"]["name"] for i in items] == [f"s{i}" for i in range(40)]
    assert rec.skipped == 0


async def test_a_bind_whose_lease_went_elsewhere_while_it_waited_writes_no_binding():
    """A rolling update: kube-scheduler gives its Lease up at SIGTERM while this replica's Bind
    waits for a node lock. The new leader never saw this decision, so a Binding written now
    could book the same share twice: the Bind fails, its lock is given back, no Binding."""
    from hami.kube import nodelock

    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    taking = ext.acquire_lock

    async def acquire_then_lose_the_lease(*a, **kw):
        value = await taking(*a, **kw)
        svc.leader.is_leader = False  # the lease changed hands during the wait
        return value

    ext.acquire_lock = acquire_then_lose_the_lease
    answer = await ext.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": chosen})
    assert "lost the lease" in answer["Error"]
    assert api.bindings == []
    assert all(nodelock.NODE_LOCK not in n["metadata"]["annotations"] for n in api.nodes.values())


async def test_a_binding_post_is_cut_where_this_replicas_leadership_ends():
    """A Binding sent just before the leader's deadline on a slow API server is not waited for
    past it (plus a margin), not for the whole Bind timeout: another replica may lead by then. The
    API server may still write it, so the Bind fails as unverified: its node lock and its
    reservation stay (the pod's watch event confirms them if it lands)."""
    from hami.kube import nodelock
    from hami.scheduler.leader import LEASE_MARGIN

    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    ext.bind_timeout = 3600.0  # were the POST given the Bind's deadline, this test would hang
    svc.leader.time_left = lambda: 0.05  # type: ignore[method-assign]
    posted = asyncio.Event()

    async def slow_post(path, body):
        posted.set()
        svc.leader.is_leader = False  # the lease is lost while the POST is out
        await asyncio.Event().wait()  # and the API server never answers

    api.post = slow_post  # type: ignore[method-assign]
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    assert 0 < ext.lease_left() <= 0.05 + LEASE_MARGIN
    answer = await asyncio.wait_for(
        ext.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": chosen}), 60
    )
    assert posted.is_set() and "leadership ended while its Binding was in flight" in answer["Error"], answer
    assert nodelock.owned_by(api.nodes[chosen]["metadata"]["annotations"].get(nodelock.NODE_LOCK), "ns", "a")
    assert svc.state.ledger.is_reserved("uid-a")
    # without leader election there is no lease to run out: the Bind's own deadline applies
    plain, _ = _decision_setup("binding", "b")
    assert plain.extender.lease_left() == float("inf")


async def test_renewals_while_a_binding_is_in_flight_extend_how_long_it_is_waited_for():
    """The cut is read again as the POST runs: a leader that keeps renewing waits for a slow POST
    (here longer than the lease end and margin read when it was sent) as long as the Bind's
    deadline allows."""
    from hami.scheduler import leader as L

    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    svc.leader.time_left = lambda: 0.1  # type: ignore[method-assign]  # renewed on every poll
    landed = api.post

    async def slow_post(path, body):
        await asyncio.sleep(0.1 + L.LEASE_MARGIN + 1.0)
        return await landed(path, body)

    api.post = slow_post  # type: ignore[method-assign]
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    answer = await ext.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": chosen})
    assert answer == {"Error": ""} and len(api.bindings) == 1


class _LeaseApi:
    """A Lease to read (or a read that fails) and the pod label writes, recorded."""

    def __init__(self, lease):
        self.lease, self.fail_reads, self.fail_patches = lease, False, 0
        self.labels: list[str] = []

    async def get(self, path):
        from hami.kube.client import KubeError

        if self.fail_reads:
            raise KubeError("GET", path, 500, '{"message": "etcdserver: request timed out"}')
        return self.lease

    async def merge_patch(self, path, body):
        from hami.kube.client import KubeError

        if self.fail_patches:
            self.fail_patches -= 1
            raise KubeError("PATCH", path, 503, '{"message": "unavailable"}')
        self.labels.append(body["metadata"]["labels"]["hami.io/scheduler-role"])


def _lease(holder, renewed, duration=15):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(renewed))
    return {"spec": {"holderIdentity": holder, "renewTime": stamp, "leaseDurationSeconds": duration}}


async def test_a_failed_lease_read_keeps_the_leader_until_its_lease_would_run_out():
    from hami.scheduler.leader import Leadership

    now = [1_000_000.0]
    api = _LeaseApi(_lease("hami-0_1a2b", now[0]))
    lead = Leadership(api, True, "hami-scheduler", "ns", "hami-0", "hami-0", "ns", clock=lambda: now[0])
    assert await lead.check() and api.labels == ["leader"]
    api.fail_reads = True  # the API server busy: no new holder is known
    now[0] += 5
    assert await lead.check() and lead.is_leader  # Binds in flight are not failed for it
    now[0] += 11  # past renewTime + 15 s: the lease may be someone else's by now
    assert not await lead.check() and api.labels == ["leader", "follower"]


async def test_the_role_label_is_written_until_it_is_right():
    """A follower from the start writes ``follower`` (a restarted leader's pod may still say
    ``leader``, and the Service would reach it); a label write that failed is retried."""
    from hami.scheduler.leader import Leadership

    now = [1_000_000.0]
    api = _LeaseApi(_lease("hami-1_9f9f", now[0]))
    api.fail_patches = 1
    lead = Leadership(api, True, "hami-scheduler", "ns", "hami-0", "hami-0", "ns", clock=lambda: now[0])
    assert not await lead.check() and api.labels == []  # the write failed
    assert not await lead.check() and api.labels == ["follower"]  # and is made on the next poll
    assert not await lead.check() and api.labels == ["follower"]  # once right, not again
