"""Found by review, 1 Dec: a new leader's catch-up that never ended, a Binding that could land
after failover, and a pod a relist dropped brought back by a late read.

1. A relist asked while the reflector slept its watch backoff (the watch version kept), whose one
   list failed (a 429), resumed the watch from the old version and never listed again: relist(),
   and with it a new leader's catch-up, waited for good (Filter and Bind "not ready" all term).
2. The Binding POST asked the API server for ``?timeout=45s`` whatever was left of the lease (15 s
   from the last renewal to another replica's takeover); and ``hami scheduler``'s shutdown gave
   the Lease up even while a Binding of its own could still be written.
3. A pod a relist did not name was dropped without remembering its UID, so a copy read before
   its deletion and applied after the relist put it (its GPU share, its quota) back.
"""

from __future__ import annotations

import asyncio
import copy
import json
import signal
import time
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from hami.kube.client import KubeError
from hami.kube.reflector import Reflector
import hami.scheduler.extender as extender_module
from hami.scheduler.extender import CUT_BINDING_LIVES
from hami.scheduler.options import Options
from hami.scheduler.state import ClusterState

from .test_failover_decisions import T0, _bind, _campaigner, _led
from .test_fresh_leader_catch_up import _Api, _elected, _service
from .test_leader_campaign import Store
from .test_reflector import Client
from .test_scheduler_extender import _decision_setup, args
from .test_scheduler_state import CONFIG, node, pod, used

GUARD_S = 30.0  # only against a hang: every wait below ends on an event first


async def _until(cond: Any) -> None:
    while not cond():
        await asyncio.sleep(0.005)


async def _first(*aws: Any) -> None:
    """Wait until the first of ``aws`` (futures/tasks) is done."""
    await asyncio.wait(set(aws), timeout=GUARD_S, return_when=asyncio.FIRST_COMPLETED)


# ------------------------------------------------------------------ 1. relist after a failed list
async def test_a_relist_asked_during_the_watch_backoff_whose_list_fails_lists_again():
    """Found by review, 1 Dec: the watch was refused (the reflector sleeping its backoff, its
    version kept), relist() was asked, and its one list was throttled (429): the watch resumed
    from the old version, no list was tried again, and relist() never returned."""
    log: list[Any] = []
    ctl: dict[str, Any] = {"refuse_watch": False, "fail_list": False, "listed": 0}
    cut, done = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    resumed_unlisted = loop.create_future()  # a watch opened after the failed list, no list between

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            if ctl["fail_list"]:
                ctl.update(fail_list=False, refuse_watch=False)  # the API server recovers
                log.append("list refused")
                return web.Response(status=429, text='{"message": "too many requests"}')
            ctl["listed"] += 1
            log.append("list")
            return web.json_response({"metadata": {"resourceVersion": str(10 * ctl["listed"])}, "items": []})
        if ctl["refuse_watch"]:
            log.append("watch refused")
            return web.Response(status=500, text="{}")
        log.append(("watch", request.query["resourceVersion"]))
        if "list refused" in log and log[log.index("list refused") + 1 :].count("list") == 0:
            if not resumed_unlisted.done():
                resumed_unlisted.set_result(None)
        resp = web.StreamResponse()
        await resp.prepare(request)
        if ctl["listed"] == 1 and not cut.is_set():
            bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "11"}}}
            await resp.write(json.dumps(bookmark).encode() + b"\n")
            await cut.wait()  # then the API server drops the watch
            return resp
        await done.wait()
        return resp

    class Quiet:
        def replace(self, items: list, resource_version: str | None = None) -> None:
            pass

        def apply(self, kind: str, obj: dict) -> None:
            pass

    import aiohttp

    app = web.Application()
    app.router.add_get("/items", handler)
    server = TestServer(app)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            r = Reflector(Client(str(server.make_url("")).rstrip("/"), session), "/items", Quiet())
            task = loop.create_task(r.run())
            relisted: asyncio.Task | None = None
            try:
                await _until(lambda: r.synced.is_set() and r.events >= 1)  # the bookmark arrived
                ctl["refuse_watch"] = True
                cut.set()
                await _until(lambda: r._failing >= 1)  # a watch was refused: asleep, version kept
                assert r.resource_version == "11"
                ctl["fail_list"] = True
                relisted = loop.create_task(r.relist())
                await _first(relisted, resumed_unlisted)
                after = log[log.index("list refused") + 1 :]
                assert relisted.done(), f"relist() still waits; requests after the failed list: {after}"
                assert after[0] == "list", after  # listed again before any watch
                assert r.relists == 2
            finally:
                done.set()
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                if relisted is not None:
                    relisted.cancel()
                    await asyncio.gather(relisted, return_exceptions=True)
    finally:
        await server.close()


class _Broken:
    """A watch response that breaks (a connection reset) once ``cut`` is set."""

    status = 200

    def __init__(self, cut: asyncio.Event) -> None:
        self.content, self.cut = self, cut

    def __aiter__(self) -> "_Broken":
        return self

    async def __anext__(self) -> bytes:
        await self.cut.wait()
        raise ConnectionResetError("reset by peer")

    def release(self) -> None:
        pass


class _UnsteadyApi(_Api):
    """The API server restarting: the first watch breaks when ``cut`` is set, then watches are
    refused (503) until a list is refused once (429); after that every request works."""

    def __init__(self) -> None:
        super().__init__()
        self.cut = asyncio.Event()
        self.refuse_watches = False
        self.fail_list = False
        self.failed_list = False
        self.resumed_unlisted = asyncio.get_running_loop().create_future()

    async def request(self, method: str, path: str, query: Any = (), body: Any = None, **kw: Any) -> Any:
        if self.fail_list and not dict(query).get("continue"):
            self.fail_list, self.refuse_watches, self.failed_list = False, False, True
            raise KubeError("GET", path, 429, '{"message": "throttled"}')
        answer = await super().request(method, path, query, body, **kw)
        self.failed_list = False
        return answer

    async def open(self, method: str, path: str, query: Any = (), **kw: Any) -> Any:
        if self.refuse_watches:
            raise KubeError("WATCH", path, 503, "{}")
        if self.failed_list and not self.resumed_unlisted.done():
            self.resumed_unlisted.set_result(dict(query)["resourceVersion"])
        if not self.watches:
            self.watches.append(dict(query)["resourceVersion"])
            return _Broken(self.cut)
        return await super().open(method, path, query, **kw)


async def test_a_new_leaders_catch_up_ends_though_its_list_failed_once_during_a_watch_backoff():
    """Found by review, 1 Dec: the API server unstable, the pod watch failing (the reflector
    sleeping its backoff), the Lease came to this replica and its catch-up's one list was
    throttled: the watch resumed, no list came, and Filter and Bind answered "not ready" for the
    rest of the term."""
    api, now = _UnsteadyApi(), [T0]
    api.pods = {"a": pod("a", mem=600)}
    svc, pods = _service(api, now)
    task = asyncio.get_running_loop().create_task(pods.run())
    try:
        await asyncio.wait_for(pods.synced.wait(), GUARD_S)
        api.refuse_watches = True
        api.cut.set()  # the API server restarts: the watch breaks, the next ones are refused
        await _until(lambda: pods._failing >= 1)
        assert pods.resource_version == "10"  # kept: the watch is to resume from it
        api.fail_list = True  # the first list after the restart is throttled (APF 429)
        await _elected(svc, api, now, "hami-0_aaaa")
        assert svc.leader.elected_task is not None
        await _first(svc.leader.elected_task, api.resumed_unlisted)
        assert svc.leader.caught_up and svc.ready(), (
            f"not caught up; the watch resumed from {api.resumed_unlisted.result()} with no list"
            if api.resumed_unlisted.done()
            else "not caught up"
        )
        assert api.lists == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# ------------------------------------------------------------------ 2. the Binding's own timeout
async def _posted_path(ext: Any, api: Any, chosen: str) -> str:
    paths: list[str] = []
    post = api.post

    async def recording(path: str, body: dict) -> Any:
        paths.append(path)
        return await post(path, body)

    api.post = recording
    assert await ext.bind(_bind("a", chosen)) == {"Error": ""}
    (path,) = paths
    return path


async def test_the_binding_asks_the_api_server_for_no_longer_than_the_leadership_left():
    """Found by review, 1 Dec: the Binding asked for ``?timeout=45s`` while another replica may
    take the Lease 15 s after the last renewal; the API server could write it after that replica
    relisted and gave the same share to another pod."""
    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    ext.lease_left = lambda: 7.9  # the leadership's deadline plus its margin, in seconds
    path = await _posted_path(ext, api, chosen)
    assert path == f"/api/v1/namespaces/ns/pods/a/binding?timeout={7}s", path


async def test_the_binding_asks_for_no_longer_than_the_binds_own_deadline():
    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    ext.bind_timeout = 6.5  # kube-scheduler stops waiting about then; the lease is not the limit
    path = await _posted_path(ext, api, chosen)
    asked = int(path.rsplit("timeout=", 1)[1].rstrip("s"))
    assert 1 <= asked <= 6, path


async def test_a_binding_cut_at_the_leases_end_is_kept_only_as_long_as_it_asked_to_live():
    """The window in which a Binding that got no answer may still land (its lock and reservation
    kept, the Lease not given up) follows the timeout that POST asked for, not a fixed 60 s."""
    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    ends = time.monotonic() + 0.3
    ext.lease_left = lambda: max(0.0, ends - time.monotonic())  # not renewed any more
    paths: list[str] = []

    async def hanging(path: str, body: dict) -> Any:
        paths.append(path)
        await asyncio.Event().wait()

    api.post = hanging
    sent = time.monotonic()
    answer = await asyncio.wait_for(ext.bind(_bind("a", chosen)), GUARD_S)
    assert "may still land" in answer["Error"], answer
    (path,) = paths
    asked = int(path.rsplit("timeout=", 1)[1].rstrip("s"))
    assert asked == 1  # (at least 1: 0 would ask for no timeout at all)
    _, until = ext._binding[("ns/a", "uid-a")]
    assert until is not None and until < time.monotonic() + CUT_BINDING_LIVES - 1, "kept the longest window"
    assert until <= time.monotonic() + asked + extender_module.BINDING_LAND_SLACK
    assert until >= sent + asked  # (and no shorter than what was asked)
    assert ext.binding_may_land()


class _Kube:
    """What ``hami scheduler``'s main does with its API client before serving."""

    closed = False

    async def close(self) -> None:
        self.closed = True


async def test_the_scheduler_keeps_the_lease_at_exit_while_its_binding_may_still_land(monkeypatch):
    """Found by review, 1 Dec: ``main``'s last step gave the campaigned Lease up whatever was in
    flight (after ``hand_over`` had kept it, too), so another replica led at once and placed pods
    from a ledger without a Binding this replica had sent and the API server could still write."""
    import hami.scheduler.server as server_module
    from hami.kube.client import KubeClient
    from hami.scheduler import command

    svc, api, now = _led("a")
    svc.opts = Options(
        leader_elect=True, leader_campaign=True, identity="hami-0", lease_name="hami-extender", lease_namespace="ns"
    )
    store = Store()
    svc.leader = lead = _campaigner(store)
    ext = svc.extender
    assert await lead.check()
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    ends = time.monotonic() + 0.2
    ext.lease_left = lambda: max(0.0, ends - time.monotonic())

    async def hanging(path: str, body: dict) -> Any:
        await asyncio.Event().wait()

    api.post = hanging
    assert "may still land" in (await ext.bind(_bind("a", chosen)))["Error"]
    assert ext.binding_may_land()

    kube = _Kube()

    async def connect(*_: Any, **__: Any) -> _Kube:
        return kube

    def start_background() -> None:
        raise RuntimeError("stopped before serving")  # main's finally runs at once

    svc.start_background = start_background  # type: ignore[method-assign]
    monkeypatch.setattr(KubeClient, "connect", connect)
    monkeypatch.setattr(server_module, "SchedulerService", lambda opts, kube: svc)
    loop = asyncio.get_running_loop()
    try:
        try:
            await command.main(svc.opts)
        except RuntimeError as exc:
            assert "stopped before serving" in str(exc)
        else:
            raise AssertionError("main returned")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    assert kube.closed and not lead.is_leader
    assert store.lease is not None and store.lease["spec"]["holderIdentity"] == lead.identity  # not given up


async def test_the_scheduler_gives_the_lease_up_at_exit_when_no_binding_may_land(monkeypatch):
    """The other side of the test above: nothing in flight, the Lease goes to the next replica."""
    import hami.scheduler.server as server_module
    from hami.kube.client import KubeClient
    from hami.scheduler import command

    svc, api, now = _led("a")
    svc.opts = Options(
        leader_elect=True, leader_campaign=True, identity="hami-0", lease_name="hami-extender", lease_namespace="ns"
    )
    store = Store()
    svc.leader = lead = _campaigner(store)
    assert await lead.check() and not svc.extender.binding_may_land()
    kube = _Kube()

    async def connect(*_: Any, **__: Any) -> _Kube:
        return kube

    def start_background() -> None:
        raise RuntimeError("stopped before serving")

    svc.start_background = start_background  # type: ignore[method-assign]
    monkeypatch.setattr(KubeClient, "connect", connect)
    monkeypatch.setattr(server_module, "SchedulerService", lambda opts, kube: svc)
    loop = asyncio.get_running_loop()
    try:
        try:
            await command.main(svc.opts)
        except RuntimeError:
            pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    assert store.lease is not None and store.lease["spec"]["holderIdentity"] == ""  # given up


# ------------------------------------------------------------------ 3. a pod dropped by a relist
def test_a_pod_a_relist_dropped_is_not_brought_back_by_a_late_read():
    """Found by review, 1 Dec: pod a (bound, 600 MiB of n1's GPU) was read at version 10 (a lock
    owner's GET, a Binding's re-read); it was deleted at 11, the pod watch expired and relisted at
    12 without it; the read's answer, applied after that, put it back, and the watch never said
    anything of it again: its share and quota counted until the next relist."""
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")], "5")
    a = pod("a", "n1", "n1-g0", 600)
    a["spec"]["nodeName"] = "n1"
    a["metadata"]["resourceVersion"] = "10"
    s.pod_handler.replace([a], "10")
    assert used(s, "n1") == [600, 0]
    read = copy.deepcopy(a)  # answered at version 10
    s.pod_handler.replace([], "12")  # the relist does not name it: deleted meanwhile
    assert used(s, "n1") == [0, 0]
    s.put_pod(read)
    assert s.pod("ns", "a") is None and s.ledger.pod(a["metadata"]["uid"]) is None
    assert used(s, "n1") == [0, 0]
    # a pod the list names, and one written after the list's snapshot, are not affected
    b = pod("b", "n1", "n1-g1", 300)
    b["spec"]["nodeName"] = "n1"
    b["metadata"]["resourceVersion"] = "13"
    s.put_pod(b)
    s.pod_handler.replace([], "12")  # (a list whose snapshot predates b: b is kept)
    assert s.pod("ns", "b") is not None and used(s, "n1") == [0, 300]


def test_after_an_etcd_restore_a_pod_a_relist_dropped_may_exist_again():
    """The tombstone of a dropped pod does not outlive an etcd restore (a list at a version
    before what the watch had shown): the list is the truth then, the pod exists again."""
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")], "5")
    a = pod("a", "n1", "n1-g0", 600)
    a["spec"]["nodeName"] = "n1"
    a["metadata"]["resourceVersion"] = "10"
    s.pod_handler.replace([a], "10")
    s.pod_handler.replace([], "20")
    assert s.was_deleted(a["metadata"]["uid"])
    s.pod_handler.replace([a], "15")  # the store went back
    assert s.pod("ns", "a") is not None and used(s, "n1") == [600, 0]


async def test_a_binding_that_waited_to_be_sent_is_kept_from_when_its_post_ended(monkeypatch):
    """Regression review, 1 Dec: the window was counted from when the POST was queued; one that
    waited for a pooled connection reached the API server late, which may write it ``asked`` s
    from then, and the lock and guard went while it still could (the slack scaled down here)."""
    monkeypatch.setattr(extender_module, "BINDING_LAND_SLACK", 0.2)
    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    ext.lease_left = lambda: 1.5  # a leader renewing all along
    ext.bind_timeout = 2.5
    reached: list[float] = []

    async def queued_then_sent(path: str, body: dict) -> Any:
        await asyncio.sleep(1.2)  # waiting for a connection of the pool
        reached.append(time.monotonic())
        await asyncio.Event().wait()  # the API server holds it

    api.post = queued_then_sent
    answer = await asyncio.wait_for(ext.bind(_bind("a", chosen)), GUARD_S)
    assert "may still write the Binding" in answer["Error"], answer
    _, until = ext._binding[("ns/a", "uid-a")]
    assert until is not None and until >= reached[0] + 1  # the server's context: from receipt, asked 1 s
    assert ext.binding_may_land()
