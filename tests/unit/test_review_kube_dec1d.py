"""Found by review, 1 Dec: what the API server stores verbatim and orjson refused (a lone
surrogate, bytes that are not UTF-8) stopped the reflector; a TLS listener's handshakes were not
counted by the connection guard; relists and the node monitor's pod lists were read from etcd.

A real API server for the first and third: tests/integration/test_review_kube_dec1d.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl

import orjson
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client as kclient

from hami import serve
from hami.kube import reflector
from hami.kube.client import KubeClient, encode_json, loads
from hami.kube.reflector import Reflector
from hami.serve import CertReloader, ConnectionGuard
from hami_devkit.pki import CertificateAuthority

from .test_serve import _closed

#: a claim's opaque parameters as another driver's client may send them: Go's JSON accepts a lone
#: surrogate escape, and the API server serves a RawExtension byte for byte
LONE = rb'{"opaque": {"driver": "other.example.com", "parameters": {"x": "a\ud800b", "y": ["\udc00"]}}}'


# ------------------------------------------------------------------ loads


def test_a_lone_surrogate_in_a_nested_string_reads_as_go_reads_it():
    """found by review, 1 Dec: orjson raised on ``"\\ud800"``, so one claim with such opaque
    parameters stopped every list and watch of claims. It now reads as U+FFFD (Go's reading),
    a string that can be written again (as JSON and as UTF-8)."""
    doc = b'{"spec": {"devices": {"config": [' + LONE + b"]}}}"
    value = loads(doc)
    params = value["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params == {"x": "a\ufffdb", "y": ["\ufffd"]}
    assert orjson.loads(orjson.dumps(value)) == value and orjson.loads(encode_json(value)) == value
    params["x"].encode()  # (a string json.loads keeps a lone surrogate in cannot be)
    # a pair stays a pair, an escaped backslash is no escape, and a byte that is not UTF-8 reads as U+FFFD
    assert loads(rb'["\ud83d\ude00", "\\ud800", "\ud800\ud83d\ude00"]') == ["\U0001f600", "\\ud800", "\ufffd\U0001f600"]
    assert loads(b'{"b": "x\xffy"}') == {"b": "x\ufffdy"}
    assert loads('["\\ud800"]') == ["\ufffd"]  # (a str too)
    with pytest.raises(ValueError):
        loads(b'{"a": "\\ud800"')  # malformed stays malformed
    with pytest.raises(ValueError):
        loads(b"[NaN]")  # (json would read it; Go does not)


# ------------------------------------------------------------------ the reflector


class Client(KubeClient):
    """The product's KubeClient on ``base`` (its request reads each list, its open each watch),
    recording each list's query (the test review, 1 Dec: a stub of its own read the lists, so
    KubeClient.request's reading of what the API server sends was never tried here)."""

    def __init__(self, base: str) -> None:
        super().__init__(kclient.ApiClient(kclient.Configuration(host=base)))
        self.lists: list[dict[str, str]] = []

    async def request(self, method, path, query=(), *args, **kwargs):
        query = list(query)
        self.lists.append({k: str(v) for k, v in query})
        return await super().request(method, path, query, *args, **kwargs)


class Seen:
    def __init__(self):
        self.replaced: list[tuple[list[str], str | None]] = []
        self.applied: list[tuple[str, str]] = []
        self.objects: dict[str, dict] = {}

    def replace(self, items, resource_version=None):
        self.replaced.append(([i["metadata"]["name"] for i in items], resource_version))
        self.objects = {i["metadata"]["name"]: i for i in items}

    def apply(self, kind, obj):
        self.applied.append((kind, obj["metadata"]["name"]))
        self.objects[obj["metadata"]["name"]] = obj


async def run_against(handler, seen, until, seconds=5.0, **kwargs) -> tuple[Reflector, Client]:
    """A Reflector on ``handler`` (an aiohttp handler of /items) until ``until(r)`` or ``seconds``."""
    app = web.Application()
    app.router.add_get("/items", handler)
    server = TestServer(app)
    await server.start_server()
    client = Client(str(server.make_url("")).rstrip("/"))
    try:
        r = Reflector(client, "/items", seen, **kwargs)
        task = asyncio.create_task(r.run())
        for _ in range(int(seconds / 0.02)):
            if until(r):
                break
            await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await client.close()
        await server.close()
    return r, client


def event(kind: str, name: str, rv: str, spec: bytes = b"{}") -> bytes:
    head = json.dumps({"type": kind, "object": {"metadata": {"name": name, "resourceVersion": rv}}})
    return head[:-2].encode() + b', "spec": ' + spec + b"}}\n"


async def stream(request, *lines: bytes) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    for line in lines:
        await resp.write(line)
    await asyncio.sleep(30)
    return resp


async def test_a_claim_with_a_lone_surrogate_in_a_list_syncs_and_in_a_watch_is_applied():
    """found by review, 1 Dec: the list that carried such a claim failed for good (a restarted
    scheduler never became ready: /readyz 503, no GPU pod placed), and a watch event carrying one
    was resumed before, for ever (the cache silently stale). Both are read now, and later objects
    arrive: the list through KubeClient.request, the watch through KubeClient.open (the test
    review, 1 Dec: the list was read by the test's own stub)."""

    async def handler(request):
        if request.query.get("watch") != "true":
            page = b'{"metadata": {"resourceVersion": "100"}, "items": [{"metadata": {"name": "old", "resourceVersion": "99"}, "spec": %s}]}'
            return web.Response(body=page % LONE, content_type="application/json")
        return await stream(request, event("ADDED", "evil", "101", LONE), event("ADDED", "after", "102"))

    seen = Seen()
    r, _ = await run_against(handler, seen, lambda r: ("ADDED", "after") in seen.applied)
    assert r.synced.is_set() and seen.replaced == [(["old"], "100")]
    assert seen.applied == [("ADDED", "evil"), ("ADDED", "after")] and r.relists == 1
    assert seen.objects["evil"]["spec"]["opaque"]["parameters"]["x"] == "a\ufffdb"
    assert seen.objects["old"]["spec"]["opaque"]["parameters"] == {"x": "a\ufffdb", "y": ["\ufffd"]}  # (the list's)


async def test_a_watch_line_that_is_not_json_relists_not_resumes():
    """found by review, 1 Dec: a watch line that cannot be read (a proxy mangling the stream) was
    taken for a dropped connection: the watch resumed from the version before it and got the same
    line again, for ever. It relists now (not older than the last version taken) and goes on."""
    watches: list[str] = []

    async def handler(request):
        if request.query.get("watch") != "true":
            rv = "100" if not watches else "105"
            return web.json_response({"metadata": {"resourceVersion": rv}, "items": []})
        watches.append(request.query["resourceVersion"])
        if len(watches) == 1:
            return await stream(request, event("ADDED", "a", "101"), b'{"type": "ADDED", "object": {"meta\n')
        return await stream(request, event("ADDED", "b", "106"))

    seen = Seen()
    r, client = await run_against(handler, seen, lambda r: ("ADDED", "b") in seen.applied)
    assert watches == ["100", "105"] and r.relists == 2, (watches, r.relists)
    assert client.lists[1] == {"resourceVersion": "101", "resourceVersionMatch": "NotOlderThan"}


async def test_a_relist_after_an_expiry_is_served_from_the_watch_cache_not_older_than_what_was_seen():
    """found by review, 1 Dec: every list had a limit and no resourceVersion, a read of etcd (a
    scan of every key of the resource before v1.31), and after an API server restart every agent
    relisted so within half a second. The first list stays consistent; a relist after an expiry
    asks for data not older than the last version taken, unpaged (what the watch cache serves),
    and first waits a random moment."""
    watches: list[str] = []
    jitter: list[tuple[float, float]] = []

    async def handler(request):
        if request.query.get("watch") != "true":
            if request.query.get("continue"):
                return web.json_response(
                    {"metadata": {"resourceVersion": "30"}, "items": [{"metadata": {"name": "p2"}}]}
                )
            if request.query.get("resourceVersionMatch"):  # from the cache, and (as it may) in pages
                page = {"resourceVersion": "30", "continue": "tok"}
                return web.json_response({"metadata": page, "items": [{"metadata": {"name": "p1"}}]})
            return web.json_response({"metadata": {"resourceVersion": "10"}, "items": []})
        watches.append(request.query["resourceVersion"])
        if len(watches) == 1:
            expired = json.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old"}}).encode()
            return await stream(
                request,
                event("ADDED", "w", "17"),
                b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "21"}}}\n',
                expired + b"\n",
            )
        return await stream(request)

    real = reflector.random.uniform

    def uniform(a, b):
        jitter.append((a, b))
        return real(a, b)

    seen = Seen()
    mp = pytest.MonkeyPatch()
    mp.setattr(reflector.random, "uniform", uniform)
    try:
        r, client = await run_against(handler, seen, lambda r: len(watches) >= 2)
    finally:
        mp.undo()
    assert client.lists[0] == {"limit": "2000"}  # consistent, paged
    assert client.lists[1] == {"resourceVersion": "21", "resourceVersionMatch": "NotOlderThan"}
    assert client.lists[2] == {"limit": "2000", "continue": "tok"}  # (a next page carries no version)
    assert seen.replaced == [([], "10"), (["p1", "p2"], "30")] and watches == ["10", "30"]
    assert (0, reflector.RELIST_JITTER_S) in jitter and 0 < reflector.RELIST_JITTER_S <= 1


@pytest.mark.parametrize("refusal", ["410", "too large"])
async def test_a_relist_the_cache_refuses_is_asked_again_consistently(refusal):
    """The cache answers the not-older-than list 410, or 504 "too large" (an etcd restore put the
    store behind that version): the next list is a consistent one, as the first."""
    too_large = {
        "kind": "Status",
        "code": 504,
        "details": {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]},
    }
    watches: list[str] = []

    async def handler(request):
        if request.query.get("watch") != "true":
            if request.query.get("resourceVersionMatch"):
                if refusal == "410":
                    return web.json_response({"kind": "Status", "code": 410}, status=410)
                return web.json_response(too_large, status=504)
            return web.json_response({"metadata": {"resourceVersion": str(10 * (len(watches) + 1))}, "items": []})
        watches.append(request.query["resourceVersion"])
        if len(watches) == 1:
            expired = json.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old"}}).encode()
            return await stream(request, event("ADDED", "w", "11"), expired + b"\n")
        return await stream(request)

    seen = Seen()
    r, client = await run_against(handler, seen, lambda r: len(watches) >= 2)
    assert [q.get("resourceVersionMatch") for q in client.lists] == [None, "NotOlderThan", None], client.lists
    assert client.lists[2] == {"limit": "2000"} and watches == ["10", "20"]


async def test_a_relist_asked_for_is_consistent_even_after_an_expiry():
    """A caller's relist() (a new leader catching up) wants what the API server holds now, not
    its cache's: that list stays a consistent one."""
    watches: list[str] = []

    async def handler(request):
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "10"}, "items": []})
        watches.append(request.query["resourceVersion"])
        return await stream(request, event("ADDED", "w", "11"))

    seen = Seen()

    async def ask(r):
        while not r.synced.is_set() or not seen.applied:
            await asyncio.sleep(0.01)
        r.relist_from = "11"  # (as an expiry leaves it)
        await r.relist()

    asking: list[asyncio.Task] = []

    def until(r):
        if not asking:
            asking.append(asyncio.ensure_future(ask(r)))
        return asking[0].done()

    r, client = await run_against(handler, seen, until)
    assert asking[0].done() and [q.get("resourceVersion") for q in client.lists] == [None, None], client.lists


# ------------------------------------------------------------------ the monitor's pod list


class _Core:
    """kubernetes_asyncio's CoreV1Api: answers from ``answers`` (a page dict, or an exception)
    and records each call's arguments."""

    calls: list[dict] = []
    answers: list = []

    def __init__(self, _api) -> None:
        pass

    async def list_pod_for_all_namespaces(self, **kw):
        from kubernetes_asyncio import client as kclient

        _Core.calls.append({k: v for k, v in kw.items() if k != "_request_timeout"})
        answer = _Core.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        async with kclient.ApiClient() as api:
            return api._ApiClient__deserialize(answer, "V1PodList")


def _pods(rv: str, *uids: str, cont: str | None = None) -> dict:
    meta = {"resourceVersion": rv, **({"continue": cont} if cont else {})}
    items = [
        {"metadata": {"name": u, "namespace": "ns", "uid": u}, "spec": {"containers": [{"name": "c"}]}} for u in uids
    ]
    return {"metadata": meta, "items": items}


async def test_the_node_monitor_lists_its_pods_from_the_watch_cache_after_the_first_time(monkeypatch):
    """found by review, 1 Dec: each GPU node listed its pods every 5 s with a field selector, a
    limit and no resourceVersion: a read of etcd scanning every pod of the cluster (before
    v1.31), ~20 a second with 100 nodes. After its first (consistent, paged) list, a node asks
    for pods not older than its last list, unpaged: its watch cache answers, by its node index."""
    from kubernetes_asyncio import client as kclient

    from hami.monitor import kube as mkube

    monkeypatch.setattr(kclient, "CoreV1Api", _Core)
    monkeypatch.setattr(mkube, "_LISTED", {})
    monkeypatch.setattr(mkube, "_SINCE_CONSISTENT", {})
    _Core.calls, _Core.answers = [], [_pods("50", "a", cont="t1"), _pods("50", "b"), _pods("70", "a", "b", "c")]
    first = await mkube.node_pods(object(), "n1")
    second = await mkube.node_pods(object(), "n1")
    assert sorted(first) == ["a", "b"] and sorted(second) == ["a", "b", "c"]
    selector = {"field_selector": "spec.nodeName=n1"}
    assert _Core.calls == [
        {**selector, "limit": 500},
        {**selector, "limit": 500, "_continue": "t1"},
        {**selector, "resource_version": "50", "resource_version_match": "NotOlderThan"},
    ]
    assert mkube._LISTED == {"n1": "70"}


@pytest.mark.parametrize("status", [410, 504])
async def test_the_node_monitor_lists_consistently_when_the_cache_refuses(monkeypatch, status):
    """An etcd restore put the store behind the last list's version (504 "too large"), or a 410:
    the same round asks again, consistently, instead of failing every round after."""
    from kubernetes_asyncio import client as kclient
    from kubernetes_asyncio.client.exceptions import ApiException

    from hami.monitor import kube as mkube

    monkeypatch.setattr(kclient, "CoreV1Api", _Core)
    monkeypatch.setattr(mkube, "_LISTED", {"n1": "900"})
    monkeypatch.setattr(mkube, "_SINCE_CONSISTENT", {})
    _Core.calls, _Core.answers = [], [ApiException(status=status), _pods("500", "a")]
    assert sorted(await mkube.node_pods(object(), "n1")) == ["a"]
    assert [c.get("resource_version") for c in _Core.calls] == ["900", None]
    assert mkube._LISTED == {"n1": "500"}


# ------------------------------------------------------------------ TLS listeners


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _settle(done, seconds: float = 10.0) -> None:
    """Wait until ``done()`` (the listener's loop has caught up), at most ``seconds``."""
    for _ in range(int(seconds / 0.02)):
        if done():
            return
        await asyncio.sleep(0.02)


def _app() -> web.Application:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok " + request.scheme)

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await serve.read_body(request))

    app = serve.application(max_body=1 << 20)
    app.add_routes([web.get("/", ok), web.post("/echo", echo)])
    return app


@pytest.fixture
def tls(tmp_path):
    ca = CertificateAuthority()
    pair = ca.issue("listener", hosts=("127.0.0.1",))
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    server = CertReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")).context
    return server, ssl.create_default_context(cadata=ca.pair.cert_pem.decode())


async def _silent_connections_are_counted(server_ctx, client_ctx) -> None:
    port = _free_port()
    guard = ConnectionGuard(max_connections=8, head_timeout=60)
    runner = await serve.start(_app(), "127.0.0.1", port, ssl_context=server_ctx, guard=guard)
    silent = []
    try:
        # two real clients, done with their handshake and idle (keep-alive) ...
        kept = [await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx) for _ in range(2)]
        await _settle(lambda: sum(not c.handshake for c in guard.conns.values()) == 2)
        # ... then 20 TCP connections that never start a handshake
        for _ in range(20):
            silent.append(await asyncio.open_connection("127.0.0.1", port))
        await _settle(lambda: guard.evicted >= 14)
        assert len(guard.conns) == 8 and guard.evicted == 14, (len(guard.conns), guard.evicted)
        closed = [await _closed(reader, 5) for reader, _ in silent[:14]]
        assert all(closed), closed  # the oldest of those still in their handshake went first
        assert sum(c.handshake for c in guard.conns.values()) == 6
        for reader, writer in kept:  # the clients that did their handshake stay, and are served
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200"), head
            writer.close()
        async with ClientSession() as session:
            async with session.get(f"https://127.0.0.1:{port}/", ssl=client_ctx) as r:
                assert r.status == 200 and await r.text() == "ok https"
    finally:
        for _, w in silent:
            w.close()
        await runner.cleanup()


async def test_silent_tcp_connections_to_a_tls_listener_count_against_its_cap(tls):
    """found by review, 1 Dec: the guard saw a TLS connection only once its handshake was done
    (asyncio's TLS server calls the protocol then), and the handshake waited 60 s: 2000 silent
    TCP connections to the webhook port held 643 MiB, none counted by the 512 cap. They count from
    their TCP accept now; past the cap those still in their handshake go first, and a real
    client is served."""
    await _silent_connections_are_counted(*tls)


def test_silent_tcp_connections_to_a_tls_listener_count_against_its_cap_on_uvloop(tls):
    """The same on uvloop, the scheduler's default event loop (its own TLS transport)."""
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_silent_connections_are_counted(*tls))


async def test_a_silent_tls_connection_meets_the_head_deadline_from_its_accept(tls):
    """found by review, 1 Dec: the head deadline ran from the end of the handshake, so a
    connection that never started one stayed for asyncio's 60 s handshake timeout."""
    server_ctx, _ = tls
    port = _free_port()
    guard = ConnectionGuard(head_timeout=0.3)
    runner = await serve.start(_app(), "127.0.0.1", port, ssl_context=server_ctx, guard=guard)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed(reader, 10)
        assert guard.timed_out == 1 and not guard.conns
        writer.close()
    finally:
        await runner.cleanup()


async def test_a_stalled_tls_handshake_ends_at_the_handshake_timeout(tls, monkeypatch):
    """A client that starts its handshake and stalls is cut at HANDSHAKE_TIMEOUT (asyncio's was
    60 s), whatever the head deadline."""
    monkeypatch.setattr(serve, "HANDSHAKE_TIMEOUT", 0.3)
    server_ctx, _ = tls
    port = _free_port()
    guard = ConnectionGuard(head_timeout=60)
    runner = await serve.start(_app(), "127.0.0.1", port, ssl_context=server_ctx, guard=guard)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, and no more
        await writer.drain()
        assert await _closed(reader, 10)
        await asyncio.sleep(0.1)
        assert not guard.conns and guard.timed_out == 0
        writer.close()
    finally:
        await runner.cleanup()


async def test_a_tls_client_certificate_still_reaches_the_handler(tmp_path):
    """The handshake done by the listener itself: the peer certificate is still on the request's
    transport (client_verified), and a request sent with the handshake's last flight is read."""
    ca, clients = CertificateAuthority(), CertificateAuthority()
    pair = ca.issue("listener", hosts=("127.0.0.1",))
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    (tmp_path / "ca.crt").write_bytes(clients.pair.cert_pem)
    reloader = CertReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), client_ca=str(tmp_path / "ca.crt"))

    async def who(request: web.Request) -> web.Response:
        return web.Response(text=f"{serve.client_verified(request)} {request.scheme}")

    app = serve.application()
    app.add_routes([web.get("/who", who)])
    port = _free_port()
    runner = await serve.start(app, "127.0.0.1", port, ssl_context=reloader.context)
    try:
        plain = ssl.create_default_context(cadata=ca.pair.cert_pem.decode())
        signed = ssl.create_default_context(cadata=ca.pair.cert_pem.decode())
        me = clients.issue("caller", client=True)
        (tmp_path / "me.crt").write_bytes(me.cert_pem)
        (tmp_path / "me.key").write_bytes(me.key_pem)
        signed.load_cert_chain(str(tmp_path / "me.crt"), str(tmp_path / "me.key"))
        async with ClientSession() as session:
            for ctx, want in ((plain, "False https"), (signed, "True https")):
                async with session.get(f"https://127.0.0.1:{port}/who", ssl=ctx) as r:
                    assert r.status == 200 and await r.text() == want
    finally:
        await runner.cleanup()


async def test_the_node_monitor_lists_consistently_again_every_so_often(monkeypatch):
    """The regression review, 1 Dec: a watch cache that stopped advancing (one API server of
    several) answers "not older than" with the same stale list for ever, and a pod started since
    never showed: its containers' directories were removed as gone after the grace. Every
    CONSISTENT_EVERY-th list of a node reads etcd again."""
    from kubernetes_asyncio import client as kclient

    from hami.monitor import kube as mkube

    monkeypatch.setattr(kclient, "CoreV1Api", _Core)
    monkeypatch.setattr(mkube, "_LISTED", {})
    monkeypatch.setattr(mkube, "_SINCE_CONSISTENT", {})
    n = mkube.CONSISTENT_EVERY
    _Core.calls, _Core.answers = [], [_pods("50", "a") for _ in range(n + 1)]
    for _ in range(n + 1):
        await mkube.node_pods(object(), "n1")
    consistent = [i for i, c in enumerate(_Core.calls) if "resource_version" not in c]
    assert consistent == [0, n], _Core.calls


async def test_a_relist_after_a_handler_failure_is_consistent():
    """The regression review, 1 Dec: after the handler failed on an event, the relist asked the
    watch cache for data not older than the version before that event; the scheduler's pod cache
    had taken the failed event's version as seen, so a list older than it (another API server's
    cache) read as the store gone back and dropped every reservation not in it. It is consistent."""
    watches: list[str] = []

    class Failing(Seen):
        failed = False

        def apply(self, kind, obj):
            if obj["metadata"]["name"] == "bad" and not self.failed:
                self.failed = True
                raise RuntimeError("a handler bug")
            super().apply(kind, obj)

    async def handler(request):
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "10" if not watches else "20"}, "items": []})
        watches.append(request.query["resourceVersion"])
        if len(watches) == 1:
            return await stream(request, event("ADDED", "ok", "11"), event("ADDED", "bad", "12"))
        return await stream(request, event("ADDED", "after", "21"))

    seen = Failing()
    r, client = await run_against(handler, seen, lambda r: ("ADDED", "after") in seen.applied)
    assert ("ADDED", "after") in seen.applied, (watches, client.lists)
    assert client.lists[1] == {"limit": "2000"}, client.lists
