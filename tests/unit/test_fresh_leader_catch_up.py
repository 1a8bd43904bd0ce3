"""A newly elected leader places pods only from a pod cache that has caught up with the API
server. A follower's pod watch can lag without anyone noticing (an API server restart, a watch
held by a proxy that forwards nothing until ``watch_idle`` reopens it): it still counts as
synced, and elected, it would place pods from a ledger missing the old leader's last Bindings
(two pods on one share). On each new term (and only then: a renewal costs nothing) the pod
reflector lists again, and Filter and Bind wait for that list, answering "not ready" past their
wait; ``/readyz`` stays 200 (readiness does not follow leadership) and says so."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hami.scheduler.events import EventRecorder
from hami.scheduler.options import Options
from hami.scheduler.server import SchedulerService

from .test_failover_decisions import T0, _bound, _lease
from .test_scheduler_extender import args
from .test_scheduler_state import node, pod


class _Stalled:
    """A watch response that never delivers anything (a proxy holding the stream)."""

    status = 200

    def __init__(self) -> None:
        self.content = self

    def __aiter__(self) -> "_Stalled":
        return self

    async def __anext__(self) -> bytes:
        await asyncio.Event().wait()
        raise StopAsyncIteration

    def release(self) -> None:
        pass


class _Api:
    """The API server as far as these tests need it: the Lease, pod lists (paged, from ``pods``,
    the truth), pod watches that stall, and pod reads."""

    def __init__(self) -> None:
        self.lease: dict = {}
        self.pods: dict[str, dict] = {}
        self.rv = 10
        self.lists = 0
        self.watches: list[str] = []
        self.list_gate: asyncio.Event | None = None  # set: a list waits for it
        self.nodes: dict[str, dict] = {}

    async def get(self, path: str) -> Any:
        if "/leases/" in path:
            return self.lease
        from hami.kube.client import KubeError

        p = self.pods.get(path.rsplit("/", 1)[1])
        if p is None:
            raise KubeError("GET", path, 404, "{}")
        return p

    async def request(self, method: str, path: str, query: Any = (), body: Any = None, **_: Any) -> Any:
        assert method == "GET" and path == "/api/v1/pods", (method, path)
        q = dict(query)
        if self.list_gate is not None:
            await self.list_gate.wait()
        items = sorted(self.pods.values(), key=lambda p: p["metadata"]["name"])
        start = int(q.get("continue") or 0)
        limit = int(q.get("limit") or len(items) or 1)
        page = items[start : start + limit]
        if start == 0:
            self.lists += 1
        more = start + limit < len(items)
        return {
            "metadata": {"resourceVersion": str(self.rv), "continue": str(start + limit) if more else ""},
            "items": page,
        }

    async def open(self, method: str, path: str, query: Any = (), **_: Any) -> _Stalled:
        self.watches.append(dict(query)["resourceVersion"])
        return _Stalled()

    async def merge_patch(self, path: str, body: Any) -> Any:
        # the leader pass's node handshakes (the service has no pod name: no label writes)
        name = path.rsplit("/", 1)[1]
        n = self.nodes[name]
        meta = n["metadata"]
        meta = {**meta, "annotations": {**meta["annotations"], **body["metadata"]["annotations"]}}
        self.nodes[name] = {**n, "metadata": {**meta, "resourceVersion": str(int(meta["resourceVersion"]) + 1)}}
        return self.nodes[name]


def _service(api: _Api, now: list[float]) -> tuple[SchedulerService, Any]:
    """Replica ``hami-0`` following kube-scheduler's Lease, two nodes of one 1000 MiB GPU; only
    its pod reflector runs (the others count as listed)."""
    svc = SchedulerService(Options(leader_elect=True, identity="hami-0"), api)
    svc.leader.clock = lambda: now[0]
    svc.extender.events = EventRecorder(None, "hami-scheduler")
    api.nodes = {n: node(n, gpus=1) for n in ("n1", "n2")}
    svc.state.node_handler.replace(list(api.nodes.values()))
    for r in svc.reflectors:
        if r.name != "pods":
            r.synced.set()
    pods = next(r for r in svc.reflectors if r.name == "pods")
    return svc, pods


async def _until(cond: Any, what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def _mem(svc: SchedulerService, name: str) -> list[int]:
    return [m for _, _, m, _ in svc.state.ledger.device_usage(name)]


async def test_a_follower_whose_pod_watch_lagged_catches_up_before_placing_a_pod():
    """hami-1 leads and binds pod x to n1's GPU (600 of its 1000 MiB); hami-0's pod watch is held
    by a proxy and never shows it. The Lease comes to hami-0: before it places pod a (600 MiB),
    its pod cache is listed again, so n1 is seen full and a goes to n2 (it went to n1: 1200 MiB
    booked on a 1000 MiB GPU)."""
    api, now = _Api(), [T0]
    api.pods = {"x": pod("x", mem=600), "a": pod("a", mem=600)}
    svc, pods = _service(api, now)
    task = asyncio.get_running_loop().create_task(pods.run())
    try:
        await asyncio.wait_for(pods.synced.wait(), 5)
        api.lease = _lease("hami-1_bbbb", now[0])
        assert not await svc.leader.check()
        # hami-1 binds x to n1; the watch shows nothing of it
        api.pods["x"] = _bound("x", "n1", "n1-g0")
        api.rv = 20
        api.pods["x"]["metadata"]["resourceVersion"] = "20"
        assert _mem(svc, "n1") == [0]
        now[0] += 20
        api.lease = _lease("hami-0_cccc", now[0])
        assert await svc.leader.check()
        answer = await svc.extender.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"]))
        assert answer["NodeNames"] == ["n2"], answer
        assert _mem(svc, "n1") == [600] and _mem(svc, "n2") == [600]
        assert api.lists == 2 and pods.relists == 2
        assert api.watches[-1] == "20"  # the watch goes on from the new list
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _elected(svc: SchedulerService, api: _Api, now: list[float], holder: str) -> None:
    now[0] += 20
    api.lease = _lease(holder, now[0])
    assert await svc.leader.check()


async def test_renewals_cost_no_list_and_each_new_term_lists_once():
    api, now = _Api(), [T0]
    api.pods = {"a": pod("a", mem=600)}
    svc, pods = _service(api, now)
    task = asyncio.get_running_loop().create_task(pods.run())
    try:
        await asyncio.wait_for(pods.synced.wait(), 5)
        await _elected(svc, api, now, "hami-0_aaaa")
        await asyncio.wait_for(svc.leader.elected_task, 5)
        assert svc.ready() and api.lists == 2
        acquired = now[0]
        for _ in range(5):  # renewals by the same holder: the same term
            now[0] += 2
            api.lease = _lease("hami-0_aaaa", now[0], acquired=acquired)
            assert await svc.leader.check()
            assert svc.ready()
        await asyncio.sleep(0.05)
        assert api.lists == 2 and len(api.watches) == 2
        # kube-scheduler beside us restarted (a new holder): a new term, one more list
        await _elected(svc, api, now, "hami-0_bbbb")
        await asyncio.wait_for(svc.leader.elected_task, 5)
        assert svc.ready() and api.lists == 3
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_while_catching_up_filter_and_bind_answer_not_ready_and_readyz_says_so():
    api, now = _Api(), [T0]
    api.pods = {"a": pod("a", mem=600)}
    svc, pods = _service(api, now)
    svc.extender.ready_wait = 0.2
    task = asyncio.get_running_loop().create_task(pods.run())
    try:
        await asyncio.wait_for(pods.synced.wait(), 5)
        api.list_gate = asyncio.Event()  # the API server is slow to list
        await _elected(svc, api, now, "hami-0_aaaa")
        assert svc.leader.is_leader and not svc.leader.caught_up and not svc.ready()
        ready = await svc._readyz(None)
        assert ready.status == 200 and "catching up" in (ready.text or "")
        answer = await svc.extender.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"]))
        assert "not ready" in answer["Error"] and "catching up" in answer["Error"], answer
        assert not svc.state.ledger.is_reserved("uid-a")
        bound = await svc.extender.bind({"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": "n1"})
        assert "not ready" in bound["Error"]
        api.list_gate.set()
        await asyncio.wait_for(svc.leader.elected_task, 5)
        assert svc.ready()
        assert (await svc._readyz(None)).text == "ok: leader"
        answer = await svc.extender.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"]))
        assert answer["NodeNames"] and not answer["Error"], answer
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_term_that_ends_while_catching_up_does_not_hold_the_next_one():
    """The catch-up waits on a list the API server does not answer; the Lease goes elsewhere and
    comes back (a new term): the first catch-up ends with its term, the second one's list is the
    one that counts."""
    api, now = _Api(), [T0]
    svc, pods = _service(api, now)
    task = asyncio.get_running_loop().create_task(pods.run())
    try:
        await asyncio.wait_for(pods.synced.wait(), 5)
        api.list_gate = asyncio.Event()
        await _elected(svc, api, now, "hami-0_aaaa")
        first = svc.leader.elected_task
        api.lease = _lease("hami-1_bbbb", now[0])
        assert not await svc.leader.check()
        await asyncio.wait_for(first, 5)
        assert not svc.leader.caught_up
        await _elected(svc, api, now, "hami-0_cccc")
        assert not svc.leader.caught_up
        api.list_gate.set()
        await asyncio.wait_for(svc.leader.elected_task, 5)
        assert svc.ready() and svc.leader.term == ("hami-0_cccc", _lease("x", now[0])["spec"]["acquireTime"])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_relist_asked_while_a_list_is_under_way_waits_for_the_next_one():
    """A list that began before the relist was asked may have read the API server before the
    reason to ask (an election): it does not count."""
    api, now = _Api(), [T0]
    api.pods = {"a": pod("a", mem=600)}
    svc, pods = _service(api, now)
    api.list_gate = asyncio.Event()
    task = asyncio.get_running_loop().create_task(pods.run())
    try:
        await asyncio.sleep(0.01)  # the first list is out
        relisted = asyncio.get_running_loop().create_task(pods.relist())
        await asyncio.sleep(0.01)
        api.pods["b"] = pod("b", mem=600)  # written after the first list's read
        api.list_gate.set()
        await asyncio.wait_for(relisted, 5)
        assert api.lists == 2 and svc.state.pod("ns", "b") is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_catch_up_at_ten_thousand_pods(capsys):
    """How long a new leader's catch-up takes with 10,000 bound pods (the list served by a fake
    at no cost, so what is measured is ours: paging, the ledger's rebuild). Printed, not
    asserted (no wall-clock limits in tests)."""
    api, now = _Api(), [T0]
    nodes = {f"n{i}": node(f"n{i}", gpus=8) for i in range(1250)}
    api.nodes = nodes
    for i in range(10_000):
        name = f"p{i:05d}"
        api.pods[name] = _bound(name, f"n{i // 8}", f"n{i // 8}-g{i % 8}", mem=500)
    svc, pods = _service(api, now)
    svc.state.node_handler.replace(list(nodes.values()))
    task = asyncio.get_running_loop().create_task(pods.run())
    try:
        await asyncio.wait_for(pods.synced.wait(), 60)
        api.rv = 30
        took = []

        async def timed() -> None:
            began = time.perf_counter()
            await svc.catch_up()
            took.append(time.perf_counter() - began)

        svc.leader.catch_up = timed
        await _elected(svc, api, now, "hami-0_aaaa")
        await asyncio.wait_for(svc.leader.elected_task, 60)
        assert svc.ready() and api.lists == 2 and pods.relists == 2
        assert len(svc.state.ledger.pods()) == 10_000
        with capsys.disabled():
            print(f"\ncatch-up of 10,000 bound pods (fake list, 5 pages): {took[0]:.3f}s")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
