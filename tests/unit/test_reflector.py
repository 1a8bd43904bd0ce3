"""Reflector protocol handling: a 410 (HTTP status or ERROR event) makes it relist.

A real API server keeps recent versions in its watch cache, so an expired resourceVersion
cannot be provoked there on demand; this test serves the two documented 410 forms from a
tiny local HTTP server instead. List+watch against the real API server is covered in
tests/integration/test_scheduler.py.
"""

from __future__ import annotations

import asyncio

import pytest
import json

from aiohttp import web
from aiohttp.test_utils import TestServer

from hami.kube.client import KubeError, loads
from hami.kube.reflector import Reflector


class Client:
    """The subset of KubeClient the reflector uses, over plain aiohttp."""

    def __init__(self, base: str, session) -> None:
        self.base, self.session = base, session

    async def request(self, method, path, query=(), **_):
        async with self.session.request(method, self.base + path, params=list(query)) as r:
            if r.status >= 400:
                raise KubeError(method, path, r.status, await r.text())
            return loads(await r.read())  # as KubeClient.request reads an answer

    async def open(self, method, path, query=(), timeout=None, **_):
        return await self.session.request(method, self.base + path, params=[(k, str(v)) for k, v in query])


async def test_relists_on_410_event_and_on_http_410():
    lists, watches = [], []

    async def handler(request):
        if request.query.get("watch") != "true":
            lists.append(1)
            return web.json_response(
                {
                    "metadata": {"resourceVersion": str(10 * len(lists))},
                    "items": [{"metadata": {"name": f"obj{len(lists)}", "resourceVersion": "1"}}],
                }
            )
        watches.append(request.query["resourceVersion"])
        if len(watches) == 2:
            return web.Response(status=410, text="gone")
        resp = web.StreamResponse()
        await resp.prepare(request)
        if len(watches) == 1:
            await resp.write(
                json.dumps({"type": "ADDED", "object": {"metadata": {"name": "w", "resourceVersion": "11"}}}).encode()
                + b"\n"
            )
            await resp.write(
                json.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old"}}).encode() + b"\n"
            )
        else:
            await asyncio.sleep(30)
        return resp

    app = web.Application()
    app.router.add_get("/items", handler)
    server = TestServer(app)
    await server.start_server()
    import aiohttp

    seen: dict[str, list] = {"replace": [], "apply": []}

    class H:
        def replace(self, items, resource_version=None):
            seen["replace"].append([i["metadata"]["name"] for i in items])

        def apply(self, kind, obj):
            seen["apply"].append((kind, obj["metadata"]["name"]))

    async with aiohttp.ClientSession() as session:
        r = Reflector(Client(str(server.make_url("")).rstrip("/"), session), "/items", H())
        task = asyncio.create_task(r.run())
        for _ in range(100):
            if len(watches) >= 3:
                break
            await asyncio.sleep(0.02)
        task.cancel()
    await server.close()
    assert seen["replace"] == [["obj1"], ["obj2"], ["obj3"]]  # 410 event -> relist; HTTP 410 -> relist
    assert seen["apply"] == [("ADDED", "w")]
    assert watches[:3] == ["10", "20", "30"]
    assert r.relists == 3


async def test_a_failing_handler_relists_instead_of_stopping():
    import aiohttp

    lists = []

    async def handler(request):
        if request.query.get("watch") != "true":
            lists.append(1)
            return web.json_response({"metadata": {"resourceVersion": "5"}, "items": [{"metadata": {"name": "a"}}]})
        await asyncio.sleep(30)
        return web.Response()

    app = web.Application()
    app.router.add_get("/items", handler)
    server = TestServer(app)
    await server.start_server()

    class Flaky:
        calls = 0

        def replace(self, items, resource_version=None):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise KeyError("bug")

        def apply(self, kind, obj):
            pass

    async with aiohttp.ClientSession() as session:
        r = Reflector(Client(str(server.make_url("")).rstrip("/"), session), "/items", Flaky())
        task = asyncio.create_task(r.run())
        for _ in range(100):
            if r.synced.is_set():
                break
            await asyncio.sleep(0.02)
        task.cancel()
    await server.close()
    assert r.synced.is_set() and len(lists) == 2 and Flaky.calls == 2


async def test_a_watch_that_goes_quiet_is_opened_again_from_the_last_event():
    """No bookmark, no event for ``watch_idle``: the connection is taken for dead and the watch
    opened again from the version of the last event it delivered, without a relist."""
    import aiohttp

    lists, watches = [], []

    async def handler(request):
        if request.query.get("watch") != "true":
            lists.append(1)
            return web.json_response({"metadata": {"resourceVersion": "10"}, "items": []})
        watches.append(request.query["resourceVersion"])
        resp = web.StreamResponse()
        await resp.prepare(request)
        if len(watches) == 1:
            await resp.write(
                json.dumps({"type": "ADDED", "object": {"metadata": {"name": "w", "resourceVersion": "12"}}}).encode()
                + b"\n"
            )
        await asyncio.sleep(30)  # then silence on an open connection
        return resp

    class IdleClient(Client):
        async def open(self, method, path, query=(), timeout=None, idle=None, **_):
            return await self.session.request(
                method,
                self.base + path,
                params=[(k, str(v)) for k, v in query],
                timeout=aiohttp.ClientTimeout(total=timeout, sock_read=idle),
            )

    app = web.Application()
    app.router.add_get("/items", handler)
    server = TestServer(app)
    await server.start_server()

    class H:
        def replace(self, items, resource_version=None):
            pass

        def apply(self, kind, obj):
            pass

    async with aiohttp.ClientSession() as session:
        r = Reflector(IdleClient(str(server.make_url("")).rstrip("/"), session), "/items", H(), watch_idle=0.3)
        task = asyncio.create_task(r.run())
        for _ in range(250):
            if len(watches) >= 2:
                break
            await asyncio.sleep(0.02)
        task.cancel()
    await server.close()
    assert watches[:2] == ["10", "12"] and len(lists) == 1


async def _run_against(handler, reflector_handler, until, seconds=1.0, **kwargs):
    """Run a Reflector against ``handler`` (an aiohttp handler of /items) until ``until(r)`` or
    ``seconds`` pass; returns the Reflector."""
    import aiohttp

    app = web.Application()
    app.router.add_get("/items", handler)
    server = TestServer(app)
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        r = Reflector(Client(str(server.make_url("")).rstrip("/"), session), "/items", reflector_handler, **kwargs)
        task = asyncio.create_task(r.run())
        for _ in range(int(seconds / 0.02)):
            if until(r):
                break
            await asyncio.sleep(0.02)
        task.cancel()
    await server.close()
    return r


class _Quiet:
    def __init__(self):
        self.replaced, self.applied = [], []

    def replace(self, items, resource_version=None):
        self.replaced.append(([i["metadata"]["name"] for i in items], resource_version))

    def apply(self, kind, obj):
        self.applied.append((kind, obj["metadata"]["name"]))


async def test_an_expiring_watch_or_one_closed_at_once_waits_the_backoff():
    """A server that answers every watch 410 (a list whose version is already compacted) or ends
    every watch at once with no event: the reflector relists/re-watches after a growing wait,
    not thousands of times a second (it did: ~65,000 full lists in a second)."""
    counts = {"list": 0, "watch": 0}

    def server(mode):
        async def handler(request):
            if request.query.get("watch") != "true":
                counts["list"] += 1
                return web.json_response({"metadata": {"resourceVersion": "7"}, "items": []})
            counts["watch"] += 1
            if mode == "410":
                return web.Response(status=410, text="too old")
            return web.Response(status=200, text="")  # ended at once, no event

        return handler

    await _run_against(server("410"), _Quiet(), lambda r: False, seconds=1.0)
    assert 2 <= counts["list"] <= 8 and counts["watch"] <= 8, counts
    counts.update(list=0, watch=0)
    await _run_against(server("empty"), _Quiet(), lambda r: False, seconds=1.0)
    assert counts["list"] == 1 and 2 <= counts["watch"] <= 8, counts


async def test_a_handler_failing_on_an_event_relists_and_the_next_events_arrive():
    """A handler raising ValueError (CoreError is one) on an event was taken for a transport error:
    the watch resumed from the version before it, replayed it every 5 s and never got past it."""
    watches = []

    async def handler(request):
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "100"}, "items": []})
        watches.append(request.query["resourceVersion"])
        resp = web.StreamResponse()
        await resp.prepare(request)
        for name, rv in (("poison", "101"), ("fine", "102")):
            event = {"type": "ADDED", "object": {"metadata": {"name": name, "resourceVersion": rv}}}
            await resp.write(json.dumps(event).encode() + b"\n")
        await asyncio.sleep(30)
        return resp

    class Picky(_Quiet):
        failed = 0

        def apply(self, kind, obj):
            if obj["metadata"]["name"] == "poison" and not Picky.failed:
                Picky.failed += 1
                raise ValueError("a parser bug")
            super().apply(kind, obj)

    h = Picky()
    r = await _run_against(handler, h, lambda r: ("ADDED", "fine") in h.applied, seconds=5.0)
    assert ("ADDED", "fine") in h.applied and r.relists == 2, (h.applied, r.relists, watches)
    assert [rv for _, rv in h.replaced] == ["100", "100"]


async def test_an_optional_resource_whose_watch_is_refused_is_listed_again_and_found_absent():
    """resource.k8s.io switched off (or the read right taken away) while the watch was down: the
    watch is answered 404; the next list finds it absent and the handler drops what it held (it
    resumed the watch every 5 s forever, the cached claims still counted against quotas)."""
    served = {"list": 0}

    async def handler(request):
        if request.query.get("watch") == "true":
            return web.Response(status=404, text="not found")
        served["list"] += 1
        if served["list"] == 1:
            return web.json_response({"metadata": {"resourceVersion": "5"}, "items": [{"metadata": {"name": "c1"}}]})
        return web.Response(status=404, text="not found")

    h = _Quiet()
    r = await _run_against(handler, h, lambda r: r.absent is not None, seconds=5.0, optional="claims")
    assert r.absent == 404 and h.replaced == [(["c1"], "5"), ([], None)], h.replaced


async def test_a_watch_that_worked_then_expired_relists_at_once_whatever_failed_before():
    """Refused watches (an API server restarting) raised the backoff to seconds; the watch that
    then delivered events and expired waited that backoff before relisting (5 s of a stale cache
    right after a restart). A watch that delivered events counts as healthy however it ends."""
    import time

    watches, lists = [], []

    async def handler(request):
        if request.query.get("watch") != "true":
            lists.append(time.monotonic())
            return web.json_response({"metadata": {"resourceVersion": "10"}, "items": []})
        watches.append(1)
        if len(watches) <= 4:
            return web.Response(status=503, text="starting")
        resp = web.StreamResponse()
        await resp.prepare(request)
        event = {"type": "ADDED", "object": {"metadata": {"name": "w", "resourceVersion": "11"}}}
        await resp.write(json.dumps(event).encode() + b"\n")
        expired = {"type": "ERROR", "object": {"code": 410, "message": "too old"}}
        await resp.write(json.dumps(expired).encode() + b"\n")
        watches.append(time.monotonic())  # when it expired
        await asyncio.sleep(30)
        return resp

    h = _Quiet()
    await _run_against(handler, h, lambda r: len(lists) >= 2, seconds=20.0)
    expired_at = next(w for w in watches if isinstance(w, float))
    assert len(lists) >= 2 and lists[1] - expired_at < 1.0, (lists, expired_at)


async def _six_failures_then_a_watch(monkeypatch, caplog, fail) -> tuple[list[tuple[str, str]], int]:
    """A reflector against a server whose first six watches end as ``await fail(request)``
    answers them, the seventh delivering an event: the reflector's log lines about /items, and
    how many watches were opened."""
    import logging

    from hami.kube import reflector

    monkeypatch.setattr(reflector.random, "uniform", lambda a, b: 0.0)  # no backoff wait
    watches = []

    async def handler(request):
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "10"}, "items": []})
        watches.append(1)
        if len(watches) <= 6:
            return await fail(request)
        resp = web.StreamResponse()
        await resp.prepare(request)
        event = {"type": "ADDED", "object": {"metadata": {"name": "w", "resourceVersion": "11"}}}
        await resp.write(json.dumps(event).encode() + b"\n")
        await asyncio.sleep(30)
        return resp

    h = _Quiet()
    with caplog.at_level(logging.DEBUG, logger=reflector.log.name):
        await _run_against(handler, h, lambda r: ("ADDED", "w") in h.applied, seconds=10.0)
    assert ("ADDED", "w") in h.applied
    return [(rec.levelname, rec.getMessage()) for rec in caplog.records if "/items" in rec.getMessage()], len(watches)


async def test_a_watch_failing_again_and_again_warns_once_then_says_when_it_works(monkeypatch, caplog):
    """The API server down: every reflector logged a warning for each failed try (every 5 s each,
    a dozen watches: 150 lines a minute that said nothing new). Now the first failure warns, the
    next ones within a minute are debug lines, and the recovery is one info line with the count."""

    async def refused(request):
        return web.Response(status=503, text="the API server is starting")

    lines, _ = await _six_failures_then_a_watch(monkeypatch, caplog, refused)
    warned = [m for lv, m in lines if lv == "WARNING"]
    assert len(warned) == 1 and "starting" in warned[0], lines
    assert sum(1 for lv, m in lines if lv == "DEBUG" and "failed" in m) == 5, lines
    assert ("INFO", "watch /items works again after 6 failures in a row") in lines, lines


async def test_a_watch_that_opens_and_then_breaks_is_not_logged_as_working_on_each_try(monkeypatch, caplog):
    """A proxy that lets each watch open (HTTP 200) and then cuts it before anything arrives:
    "works again" was logged on every opening, so the failure after it warned again, two lines
    per try for as long as it lasted. An opened watch has worked only once something arrives."""

    async def cut(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'{"type": "ADDED", "obj')  # half an event, then the connection is cut
        request.transport.close()
        return resp

    lines, watches = await _six_failures_then_a_watch(monkeypatch, caplog, cut)
    assert watches == 7 and sum(1 for lv, m in lines if lv == "WARNING") == 1, lines
    assert [m for lv, m in lines if "works again" in m] == ["watch /items works again after 6 failures in a row"], lines


async def test_a_watch_answering_only_error_events_warns_once(monkeypatch, caplog):
    """An ERROR event is something arriving, and it is the failure itself: an API server
    answering each watch with one (a watch cache behind the asked version: code 504; an etcd
    error: 500) logged "works again" and then the failure's warning on every try."""

    async def error_event(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        error = {"kind": "Status", "status": "Failure", "reason": "Timeout", "code": 504}
        await resp.write(json.dumps({"type": "ERROR", "object": error}).encode() + b"\n")
        return resp

    lines, watches = await _six_failures_then_a_watch(monkeypatch, caplog, error_event)
    assert watches == 7 and sum(1 for lv, m in lines if lv == "WARNING") == 1, lines
    assert [m for lv, m in lines if "works again" in m] == ["watch /items works again after 6 failures in a row"], lines


TOO_LARGE = {
    "kind": "Status",
    "status": "Failure",
    "message": "Too large resource version: 900, current: 500",
    "reason": "Timeout",
    "details": {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]},
    "code": 504,
}


async def test_a_watch_ahead_of_the_store_relists():
    """After an etcd restore the store is behind the version the watch reached: the API server
    answers the watch 504 ResourceVersionTooLarge (as the HTTP status, or as an ERROR event) and
    the reflector relists, as client-go does (it resumed from the same version every backoff)."""
    served = {"list": 0, "watch": 0}

    async def handler(request):
        if request.query.get("watch") != "true":
            served["list"] += 1
            return web.json_response(
                {"metadata": {"resourceVersion": "900" if served["list"] < 3 else "500"}, "items": []}
            )
        served["watch"] += 1
        if request.query["resourceVersion"] == "500":
            await asyncio.sleep(30)
        if served["watch"] == 1:
            return web.json_response(TOO_LARGE, status=504)
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(json.dumps({"type": "ERROR", "object": TOO_LARGE}).encode() + b"\n")
        return resp

    h = _Quiet()
    r = await _run_against(handler, h, lambda r: len(h.replaced) >= 3, seconds=5.0)
    # the HTTP 504 relists, the ERROR event relists, and the watch goes on from the store's version
    assert h.replaced == [([], "900"), ([], "900"), ([], "500")], h.replaced
    assert r.relists == 3 and served["watch"] == 3


def test_a_504_of_another_shape_is_not_taken_for_a_version_ahead_of_the_store():
    """A proxy's own 504 (details a string, a list, causes not a list) is an ordinary failure: the
    check raised AttributeError inside the reflector's except clause, which ended its task."""
    from hami.kube.reflector import too_large

    for body in (
        '{"code":504,"details":"upstream request timeout"}',
        '{"code":504,"details":["x"]}',
        '{"code":504,"details":{"causes":"x"}}',
        '["not", "a", "status"]',
        "<html>gateway timeout</html>",
    ):
        assert too_large(KubeError("WATCH", "/api/v1/pods", 504, body)) is False, body
    assert too_large(KubeError("WATCH", "/api/v1/pods", 504, json.dumps(TOO_LARGE))) is True


async def test_an_object_nested_deeper_than_orjson_reads_does_not_stop_the_watch():
    """The API server stores a ResourceClaim whose opaque parameters (another driver's) nest
    1100 levels; orjson reads 1024, so that watch event failed to parse, the watch resumed from
    before it and failed again, for ever: no later claim was seen, and a fresh scheduler never
    synced (found by review). Its parts below READ_DEPTH levels now read as null."""
    from hami.kube.client import READ_DEPTH

    deep = "[" * 1100 + "]" * 1100
    listed = {"deep": 0}

    async def handler(request):
        if request.query.get("watch") != "true":
            listed["deep"] += 1
            page = '{"metadata": {"resourceVersion": "100"}, "items": [{"metadata": {"name": "old", "resourceVersion": "99"}, "spec": {"p": %s}}]}'
            return web.Response(text=page % deep, content_type="application/json")
        resp = web.StreamResponse()
        await resp.prepare(request)
        for name, rv in (("deep", "101"), ("after", "102")):
            line = '{"type": "ADDED", "object": {"metadata": {"name": "%s", "resourceVersion": "%s"}, "spec": {"p": %s, "s": "[[{"}}}\n'
            await resp.write((line % (name, rv, deep)).encode())
        await asyncio.sleep(30)
        return resp

    class Keeping(_Quiet):
        objects: dict = {}

        def apply(self, kind, obj):
            super().apply(kind, obj)
            Keeping.objects[obj["metadata"]["name"]] = obj

    h = Keeping()
    r = await _run_against(handler, h, lambda r: ("ADDED", "after") in h.applied, seconds=5.0)
    assert h.applied == [("ADDED", "deep"), ("ADDED", "after")] and r.relists == 1, (h.applied, r.relists)
    obj, depth = Keeping.objects["after"]["spec"]["p"], 3  # levels kept: the event, its object, spec, then lists
    while isinstance(obj, list):
        obj, depth = obj[0] if obj else None, depth + 1
    assert obj is None and depth == READ_DEPTH and Keeping.objects["after"]["spec"]["s"] == "[[{"


def test_prune_depth_counts_brackets_outside_strings_only():
    from hami.kube.client import loads, prune_depth

    assert prune_depth(b'[[[1]], [["]]"]], {"a": {"b": 1}}]', 2) == b'[[null], [null], {"a": null}]'
    assert prune_depth(b'{"k": "\\"[[[", "v": [[1]]}', 2) == b'{"k": "\\"[[[", "v": [null]}'
    assert loads(b'{"a": [1]}') == {"a": [1]}
    with pytest.raises(Exception, match="unexpected|expected|invalid"):
        loads(b"[" * 1100 + b"]" * 1099)  # malformed stays malformed
