"""hami.serve: the listener rules every HTTP port of the product shares (connection cap, request
head and body deadlines, TLS reload), on a bare application, then wired into each listener."""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import ssl
import struct

import pytest
from aiohttp import ClientConnectionError, ClientSession, TCPConnector, web
from prometheus_client import CollectorRegistry, Gauge

from hami import serve
from hami_devkit.pki import CertificateAuthority
from hami.serve import CertReloader, ConnectionGuard


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _closed(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), within) == b""
    except (asyncio.TimeoutError, ConnectionResetError):
        return False


def _echo_app() -> web.Application:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await serve.read_body(request))

    app = serve.application(max_body=1 << 20)
    app.add_routes([web.get("/", ok), web.post("/echo", echo)])
    return app


# ------------------------------------------------------------------ the guard (moved from test_scheduler_http_input)


async def test_a_slow_request_head_is_cut_off():
    port = _free_port()
    runner = await serve.start(_echo_app(), "127.0.0.1", port, guard=ConnectionGuard(head_timeout=0.3))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n")  # ... and never the rest
        await writer.drain()
        assert await _closed(reader, 10)
        writer.close()
    finally:
        await runner.cleanup()


async def test_an_idle_keep_alive_connection_outlives_the_head_deadline_and_serves_again():
    """After an answer the connection waits ``idle_timeout`` (longer than Go clients' 90 s idle),
    not ``head_timeout``, for the next request: closing it first races a client that reuses it
    (the API server's webhook call failing with EOF)."""
    port = _free_port()
    guard = ConnectionGuard(head_timeout=0.3)
    assert guard.idle_timeout > 90
    runner = await serve.start(_echo_app(), "127.0.0.1", port, guard=guard)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200"), head
            await asyncio.wait_for(reader.readexactly(2), 10)
            await asyncio.sleep(1.0)  # idle past the head deadline
        assert guard.timed_out == 0
        writer.close()
    finally:
        await runner.cleanup()


async def test_a_slow_body_gets_408(monkeypatch):
    monkeypatch.setattr(serve, "BODY_TIMEOUT", 0.3)
    port = _free_port()
    runner = await serve.start(_echo_app(), "127.0.0.1", port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readline(), 10)
        assert answer.startswith(b"HTTP/1.1 408")
        writer.close()
    finally:
        await runner.cleanup()


async def test_idle_connections_cannot_crowd_out_a_real_client():
    """With the cap at 8, 20 connections that never send a request do not keep a real request
    out: each new connection evicts the one that has waited longest for its head."""
    port = _free_port()
    guard = ConnectionGuard(max_connections=8, head_timeout=60)
    runner = await serve.start(_echo_app(), "127.0.0.1", port, guard=guard)
    idle = []
    try:
        for _ in range(20):
            idle.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.1)
        assert len(guard.conns) <= 8 and guard.evicted >= 12
        async with ClientSession() as session:
            r = await session.post(f"http://127.0.0.1:{port}/echo", data=b"hello")
            assert r.status == 200 and await r.read() == b"hello"
    finally:
        for _, w in idle:
            w.close()
        await runner.cleanup()


async def test_a_small_body_has_a_shorter_deadline(monkeypatch):
    """The body deadline is ``BODY_GRACE`` plus one second per ``BODY_RATE`` bytes declared, at
    most ``BODY_TIMEOUT``: a small body that trickles is cut off long before the 30 s."""
    assert serve.body_deadline(0) == pytest.approx(serve.body_deadline(100), abs=0.01) == serve.BODY_GRACE
    assert serve.BODY_GRACE < serve.body_deadline(1 << 20) < serve.BODY_TIMEOUT
    assert serve.body_deadline(4 << 20) == serve.body_deadline(None) == serve.BODY_TIMEOUT
    monkeypatch.setattr(serve, "BODY_GRACE", 0.3)
    port = _free_port()
    runner = await serve.start(_echo_app(), "127.0.0.1", port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        began = asyncio.get_running_loop().time()
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readline(), 10)
        assert answer.startswith(b"HTTP/1.1 408")
        assert asyncio.get_running_loop().time() - began < 5  # not BODY_TIMEOUT (30 s)
        writer.close()
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("listener", ["echo", "webhook"])
async def test_slow_bodies_cannot_crowd_out_a_real_client(listener, caplog):
    """With the cap at 8, 20 connections whose head is in and whose body trickles (their handler
    runs, waiting on the body) do not keep a real request out: a connection still waiting for its
    body is evicted like one waiting for its head, oldest first, and its handler ends without a
    traceback. (They used to count as busy, never evicted: 8 of them closed every new
    connection at once, the API server's admission call included.)"""
    caplog.set_level(logging.DEBUG)
    port = _free_port()
    guard = ConnectionGuard(max_connections=8, head_timeout=60)
    if listener == "echo":
        runner, path = await serve.start(_echo_app(), "127.0.0.1", port, guard=guard), "/echo"
    else:
        runner, path = (await _extender(guard, port))[0], "/webhook"
    review = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1"}}'
    slow = []
    try:
        for _ in range(20):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: 4000000\r\n\r\n{{".encode()
            )
            await writer.drain()
            slow.append((reader, writer))
            await asyncio.sleep(0.02)  # its handler starts (the connection is busy) before the next one
        await asyncio.sleep(0.1)
        assert len(guard.conns) <= 8 and guard.evicted >= 12
        assert all(c.busy for c in guard.conns.values())  # all of them in a handler, reading the body
        closed = [await _closed(reader, 0.5) for reader, _ in slow[:12]]
        assert all(closed), closed  # the oldest slow ones were closed by the server
        async with ClientSession() as session:
            async with session.post(
                f"http://127.0.0.1:{port}{path}", data=review, headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status == 200
                if listener == "webhook":
                    assert (await r.json())["response"]["uid"] == "u1"
                else:
                    assert await r.read() == review
    finally:
        for _, w in slow:
            w.close()
        await runner.cleanup()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR
    ]


async def test_request_lines_and_header_fields_are_limited(caplog):
    """Each refused request costs one line in the log, not aiohttp's ERROR with a traceback (found by
    make fuzz on the UI listener: a GET with 70 headers logged "Error handling request" and a
    traceback of the parser's BadHttpMessage)."""
    caplog.set_level(logging.DEBUG)
    port = _free_port()
    runner = await serve.start(_echo_app(), "127.0.0.1", port)
    try:
        async with ClientSession() as session:
            r = await session.get(f"http://127.0.0.1:{port}/", headers={"X-Big": "a" * (serve.MAX_HEADER_BYTES + 10)})
            assert r.status in (400, 431)
            r = await session.get(
                f"http://127.0.0.1:{port}/", headers={f"X-{i}": "1" for i in range(serve.MAX_HEADERS + 1)}
            )
            assert r.status in (400, 431)
            r = await session.get(f"http://127.0.0.1:{port}/", headers={"X-Fine": "a" * 100})
            assert r.status == 200
    finally:
        await runner.cleanup()
    refused = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(refused) == 2 and not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert all("request refused" in r.getMessage() for r in refused), [r.getMessage() for r in refused]


# ------------------------------------------------------------------ TLS (moved from test_scheduler_extender/_auth)


def _client(ca: CertificateAuthority) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca.pair.cert_pem.decode())


async def test_tls_certificate_is_reloaded_when_the_files_change(tmp_path):
    ca = CertificateAuthority()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"

    def issue(name):
        pair = ca.issue(name, hosts=("127.0.0.1",))
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)

    issue("first")
    reloader = CertReloader(str(cert), str(key))
    port = _free_port()
    runner = await serve.start(_echo_app(), "127.0.0.1", port, ssl_context=reloader.context)

    async def served_name() -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=_client(ca), server_hostname="127.0.0.1")
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        from cryptography import x509

        return x509.load_der_x509_certificate(der).subject.rfc4514_string()

    try:
        assert "first" in await served_name()
        assert not reloader.check()
        issue("second")
        assert reloader.check() and reloader.reloads == 1
        assert "second" in await served_name()
        key.write_text("garbage")  # a half-written rotation keeps the old certificate
        assert not reloader.check()
        assert "second" in await served_name()
    finally:
        await runner.cleanup()


async def test_a_renewed_client_ca_is_trusted_without_a_restart(tmp_path):
    serving, client_ca, renewed = (
        CertificateAuthority("serving-ca"),
        CertificateAuthority("client-ca"),
        CertificateAuthority("client-ca-renewed"),
    )
    files = {"ca.crt": serving.pair.cert_pem, "rotating-ca.crt": client_ca.pair.cert_pem}
    for name, ca, kw in (
        ("tls", serving, {"hosts": ("127.0.0.1",)}),
        ("renewed", renewed, {"server": False, "client": True}),
    ):
        pair = ca.issue(name, **kw)
        files[f"{name}.crt"], files[f"{name}.key"] = pair.cert_pem, pair.key_pem
    for name, pem in files.items():
        (tmp_path / name).write_bytes(pem)
    ca_file = tmp_path / "rotating-ca.crt"
    reloader = CertReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), client_ca=str(ca_file))

    async def who(request: web.Request) -> web.Response:
        return web.Response(status=200 if serve.client_verified(request) else 403)

    app = serve.application()
    app.add_routes([web.get("/who", who)])
    port = _free_port()
    runner = await serve.start(app, "127.0.0.1", port, ssl_context=reloader.context)

    async def call(with_cert: bool) -> int:
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        if with_cert:
            context.load_cert_chain(str(tmp_path / "renewed.crt"), str(tmp_path / "renewed.key"))
        async with ClientSession(connector=TCPConnector(ssl=context)) as session:
            async with session.get(f"https://127.0.0.1:{port}/who") as resp:
                return resp.status

    try:
        with pytest.raises(ClientConnectionError):  # not yet trusted
            await call(True)
        assert not reloader.check_client_ca()  # unchanged file: nothing to do
        ca_file.write_bytes(renewed.pair.cert_pem)
        assert reloader.check_client_ca() and reloader.ca_reloads == 1
        assert await call(True) == 200
        assert await call(False) == 403
    finally:
        await runner.cleanup()


# ------------------------------------------------------------------ WSGI: prometheus_client's exposition


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("hami_test_value", "a test gauge", registry=registry).set(3)
    Gauge("hami_other_value", "another", registry=registry).set(4)
    return registry


async def test_the_wsgi_bridge_serves_what_prometheus_clients_server_served():
    from prometheus_client import generate_latest, make_wsgi_app

    registry = _registry()
    port = _free_port()
    runner = await serve.start(serve.wsgi_application(make_wsgi_app(registry)), "127.0.0.1", port)
    base = f"http://127.0.0.1:{port}"
    try:
        async with ClientSession(auto_decompress=False) as session:
            for path in ("/metrics", "/", "/anything"):  # any path, as before
                async with session.get(base + path, headers={"Accept-Encoding": "identity"}) as r:
                    assert r.status == 200 and await r.read() == generate_latest(registry)
                    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            async with session.get(base + "/metrics?name[]=hami_other_value", headers={"Accept-Encoding": ""}) as r:
                text = (await r.read()).decode()
                assert "hami_other_value 4.0" in text and "hami_test_value" not in text
            async with session.get(base + "/metrics", headers={"Accept-Encoding": "gzip"}) as r:
                assert r.headers["Content-Encoding"] == "gzip"
                assert gzip.decompress(await r.read()) == generate_latest(registry)
            async with session.get(
                base + "/metrics", headers={"Accept": "application/openmetrics-text", "Accept-Encoding": "identity"}
            ) as r:
                assert r.headers["Content-Type"].startswith("application/openmetrics-text")
                assert (await r.read()).endswith(b"# EOF\n")
            async with session.post(base + "/metrics", data=b"x") as r:
                assert r.status == 405 and r.headers["Allow"] == "OPTIONS,GET"
    finally:
        await runner.cleanup()


# ------------------------------------------------------------------ every listener of the product


async def _extender(guard, port):
    from hami.scheduler.options import Options
    from hami.scheduler.server import SchedulerService, serve as serve_extender

    return await serve_extender(SchedulerService(Options(), None), "127.0.0.1", port, guard=guard), "/healthz"


async def _ui(guard, port):
    from hami.core import SchedulerConfig
    from hami.scheduler.state import ClusterState
    from hami.ui.server import UiApi, serve_ui
    from hami.vendors import build_vendors

    api = UiApi(ClusterState(SchedulerConfig(build_vendors())), "hami-scheduler")
    return await serve_ui(api, "127.0.0.1", port, guard=guard), "/healthz"


async def _scheduler_metrics(guard, port):
    from hami.scheduler.metrics import SchedulerMetrics

    return await SchedulerMetrics().serve("127.0.0.1", port, guard=guard), "/metrics"


async def _monitor_metrics(guard, port):
    from hami.monitor.command import serve_metrics

    return await serve_metrics(_registry(), "127.0.0.1", port, guard=guard), "/metrics"


LISTENERS = {"extender": _extender, "ui": _ui, "scheduler-metrics": _scheduler_metrics, "monitor": _monitor_metrics}


@pytest.mark.parametrize("listener", sorted(LISTENERS))
async def test_every_listener_caps_its_connections(listener):
    """Past the cap, a new connection evicts the idle one that waited longest; a real request
    still gets through. (The metrics listeners had no cap before hami.serve.)"""
    port = _free_port()
    guard = ConnectionGuard(max_connections=8, head_timeout=60)
    runner, path = await LISTENERS[listener](guard, port)
    idle = []
    try:
        for _ in range(20):
            idle.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.1)
        assert len(guard.conns) <= 8 and guard.evicted >= 12
        closed = [await _closed(reader, 0.5) for reader, _ in idle[:12]]
        assert all(closed), closed  # the oldest idle connections were closed by the server
        async with ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}{path}") as r:
                assert r.status == 200
    finally:
        for _, w in idle:
            w.close()
        await runner.cleanup()


@pytest.mark.parametrize("listener", ["scheduler-metrics", "monitor"])
async def test_a_client_that_resets_costs_one_line_not_a_traceback(listener, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    port = _free_port()
    runner, path = await LISTENERS[listener](None, port)
    try:
        for request in (
            b"GET " + path.encode() + b" HTTP/1.1\r\nHo",
            b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        ):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(request)
            await asyncio.sleep(0.2)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # RST
            await asyncio.sleep(0.3)
        async with ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}{path}") as r:
                assert r.status == 200  # still serving
    finally:
        await runner.cleanup()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    lines = [r.getMessage() for r in caplog.records if r.name == "hami.serve"]
    assert 1 <= len(lines) <= 2 and all("reset" in line for line in lines), lines  # at most one per client


async def test_an_application_built_elsewhere_gets_the_guard_too():
    """start() puts the guard's middleware first when the app was not made by application()."""
    app = web.Application()

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)  # busy: never evicted while it is answered
        return web.Response(text="done")

    app.add_routes([web.get("/slow", slow)])
    port = _free_port()
    guard = ConnectionGuard(max_connections=2, head_timeout=60)
    runner = await serve.start(app, "127.0.0.1", port, guard=guard)
    try:
        assert app.middlewares[0] is serve.guarded
        async with ClientSession() as session:
            answer = asyncio.ensure_future(session.get(f"http://127.0.0.1:{port}/slow"))
            await asyncio.sleep(0.1)
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            await asyncio.sleep(0.1)
            r = await answer
            assert r.status == 200 and await r.text() == "done"
            assert guard.evicted >= 2 and len(guard.conns) <= 2
            for _, w in idle:
                w.close()
    finally:
        await runner.cleanup()


async def test_an_ipv6_wildcard_takes_ipv4_too_when_asked():
    if not socket.has_ipv6 or not socket.has_dualstack_ipv6():
        pytest.skip("no dual-stack IPv6 here")
    try:
        runner = await serve.start(_echo_app(), "::", 0, dual_stack=True)
    except OSError as exc:
        pytest.skip(f"cannot listen on [::]: {exc}")
    try:
        port = runner.addresses[0][1]
        async with ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/") as r:
                assert r.status == 200
    finally:
        await runner.cleanup()


# ------------------------------------------------------------------ large answers (send_body)

BIG = bytes(range(256)) * (32 * 1024)  # 8 MiB, a scheduler's metrics answer for ~1000 nodes


async def _big_answer_server() -> tuple[web.AppRunner, int, list[web.Request], asyncio.Event]:
    seen: list[web.Request] = []
    done = asyncio.Event()

    async def big(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        try:
            return await serve.send_body(request, BIG, {"Content-Type": "text/plain"})
        finally:
            done.set()

    app = serve.application()
    app.router.add_get("/big", big)
    port = _free_port()
    return await serve.start(app, "127.0.0.1", port), port, seen, done


async def _stalled_client(port: int) -> socket.socket:
    """A client that asks for the answer and reads none of it (a small receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    sock.send(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


async def test_a_client_that_does_not_read_holds_no_copy_of_a_large_answer():
    """A whole web.Response went into the connection's buffer at once: each stalled client held
    ~8 MiB (512 of them: 4 GiB). Sent a chunk at a time, what waits for it stays under 1 MiB."""
    runner, port, seen, _ = await _big_answer_server()
    sock = await _stalled_client(port)
    try:
        for _ in range(100):  # until the answer has begun and the kernel's buffers are full
            await asyncio.sleep(0.05)
            if seen and seen[0].transport is not None and seen[0].transport.get_write_buffer_size() > 0:
                break
        await asyncio.sleep(0.3)
        assert seen and seen[0].transport is not None
        assert seen[0].transport.get_write_buffer_size() < 1 << 20
    finally:
        sock.close()
        await runner.cleanup()


async def test_a_client_that_does_not_take_the_answer_in_time_is_disconnected(monkeypatch):
    monkeypatch.setattr(serve, "send_deadline", lambda length: 0.3)
    runner, port, seen, done = await _big_answer_server()
    sock = await _stalled_client(port)
    try:
        await asyncio.wait_for(done.wait(), 10)
        for _ in range(100):
            if seen[0].transport is None or seen[0].transport.is_closing():
                break
            await asyncio.sleep(0.05)
        assert seen[0].transport is None or seen[0].transport.is_closing()  # (it was held for ever)
    finally:
        sock.close()
        await runner.cleanup()


async def test_a_large_answer_arrives_whole():
    runner, port, _, _ = await _big_answer_server()
    try:
        async with ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/big") as resp:
                assert resp.status == 200 and resp.headers["Content-Length"] == str(len(BIG))
                assert await resp.read() == BIG
    finally:
        await runner.cleanup()


async def test_a_client_that_leaves_mid_answer_logs_no_error(caplog):
    """A scrape that times out and resets: written by send_body, the ConnectionError left the
    handler and aiohttp logged "Error handling request" with a traceback, once per scrape."""
    runner, port, _, done = await _big_answer_server()
    try:
        with caplog.at_level(logging.DEBUG):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            await reader.read(1000)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
            writer.close()
            await asyncio.wait_for(done.wait(), 10)
            await asyncio.sleep(0.2)  # (aiohttp logs after the handler returns)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    finally:
        await runner.cleanup()
