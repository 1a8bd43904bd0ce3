"""The hardened HTTP listener: every HTTP port the product opens is started here.

Owns the rules a listener applies before any route sees a request, so that the extender and
webhook port, its loopback extender port, the web UI, the scheduler's ``/metrics`` and the node
monitor's ``/metrics`` all keep the same limits (docs/security.md, "Every listener"):

- :class:`ConnectionGuard`: at most ``MAX_CONNECTIONS`` open connections per listener (one more
  evicts the connection that has waited longest for its client: for its request head, or for the
  rest of a request body still coming in; never one whose request is all in and being handled,
  so that connections trickling a body cannot fill the listener and lock every other caller out),
  a complete request head within ``HEAD_TIMEOUT`` of opening, and the next
  one within ``IDLE_TIMEOUT`` of the previous answer (idle keep-alive). aiohttp has neither.
  On a TLS listener a connection counts, and its head deadline runs, from its TCP accept: the
  handshake is part of it (at most ``HANDSHAKE_TIMEOUT``), and past the cap a connection still
  in its handshake is evicted before any other (:class:`_TlsSite`).
  ``IDLE_TIMEOUT`` is longer than the 90 s after which Go's HTTP clients (the API server calling
  the webhook, kube-scheduler calling the extender, Prometheus) drop an idle connection
  themselves: a server that closes first races the client's reuse of the connection, and the
  request the client had just sent on it fails with ``EOF`` (a pod creation refused by the
  webhook's fail-closed policy: seen once in 4,000 pods of the DRA soak, bench/bench_soak.py).
- request limits: request line and each header field at most ``MAX_HEADER_BYTES``, at most
  ``MAX_HEADERS`` headers, compressed bodies not decoded, a body size per application
  (:func:`application`) and a body deadline (:func:`read_body`: :func:`body_deadline`, at most
  ``BODY_TIMEOUT``, shorter for a small body; 408). A
  request refused by these limits or by the parser is one line in the log, not a traceback.
- :class:`CertReloader`: the TLS context (TLS 1.2 or later, an optional client CA) whose
  certificate, key and client CA are re-read when their files change.
- ``SECURITY_HEADERS`` and :func:`security_headers`, for listeners that serve a browser.
- :func:`start`: the one function that opens a listening site with all of the above (a port
  it cannot open is a :class:`ListenError`).
- :func:`wsgi_application`: a WSGI app (prometheus_client's exposition) behind the same rules.

What it does not own: routes, who may call them (each program's module decides: the scheduler's
client-certificate check uses :func:`client_verified` from here), and what a body must contain.
gRPC unix sockets (device plugin, DRA plugin) are not HTTP listeners and do not come here.
It imports only the standard library and aiohttp.
"""

from __future__ import annotations

import asyncio
import functools
import io
import itertools
import logging
import os
import socket
import ssl
import sys
from typing import Any, Awaitable, Callable, Iterable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)
HEAD_TIMEOUT = 30.0  # s: request line + headers, counted from connect (the TCP accept: a TLS handshake included)
HANDSHAKE_TIMEOUT = 10.0  # s: a TLS handshake, from the TCP accept (asyncio's default is 60 s)
IDLE_TIMEOUT = 120.0  # s: the next request head, counted from the previous answer (> Go clients' 90 s idle)
BODY_TIMEOUT = 30.0  # s: the whole body, once the head is in (the most; see body_deadline)
BODY_GRACE = 5.0  # s: the whole of a small body, once the head is in
BODY_RATE = 128 * 1024  # bytes/s: the slowest a larger body may come in, beyond BODY_GRACE
MAX_CONNECTIONS = 512  # open connections per listener
MAX_HEADER_BYTES = 8190  # one request line / header field
MAX_HEADERS = 64
LINGER = 1.0  # s spent reading a body nobody read before the connection is closed
SMALL_BODY = 1024  # bytes: the body limit of a listener whose routes take no body

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _ServerLog(logging.LoggerAdapter):
    """aiohttp's server logger, except that a request its parser refuses (a line or header too
    long, too many headers, a malformed head: the client's error, answered 400/431) is one line at
    INFO instead of "Error handling request" at ERROR with a traceback."""

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self.logger.info("request refused: " + str(msg) + ": %s", *args, str(exc_info).splitlines()[0][:200])
            return
        self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)


# ---------------------------------------------------------------------------- connections


class _Conn:
    __slots__ = ("transport", "since", "order", "busy", "timer", "request", "handshake")

    def __init__(self, transport: Any, since: float, order: int, handshake: bool = False) -> None:
        self.transport, self.since, self.busy, self.timer = transport, since, False, None
        self.order = order  # when opened among this guard's connections: ties of ``since`` broken by it
        self.request: web.BaseRequest | None = None  # the request being handled (busy)
        self.handshake = handshake  # a TLS connection accepted, its handshake not done

    @property
    def waiting(self) -> bool:
        """Whether the connection waits for its client: for a request head (not busy), or for
        the rest of the body of the request being handled (a handler reading it, e.g.
        :func:`read_body`, waits on the client, not on the server)."""
        return not self.busy or (self.request is not None and not self.request.content.is_eof())


class ConnectionGuard:
    """Connection limits aiohttp does not have: a deadline for each request head (the first
    ``head_timeout`` after connecting, the next ``idle_timeout`` after an answer: idle
    keep-alive) and a cap on open connections that evicts the slowest waiter.

    Installed on a runner's low-level ``web.Server`` (:meth:`install`, done by :func:`start`);
    the :func:`guarded` middleware marks a connection busy while its handler runs (a handler may
    wait on a node lock, or format a large scrape in a thread). A busy connection whose request
    body is not all in yet still counts as waiting (:attr:`_Conn.waiting`): past the cap it is
    evicted like one that waits for its head, oldest first. Were it protected, ``max_connections``
    POSTs that declare a large ``Content-Length`` and trickle their body, renewed each
    ``BODY_TIMEOUT``, would hold the listener and every new connection would be closed at once
    (the webhook answers any caller: an unauthenticated client could refuse every pod)."""

    def __init__(
        self,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout: float = HEAD_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        self.max_connections, self.head_timeout, self.idle_timeout = max_connections, head_timeout, idle_timeout
        self.conns: dict[Any, _Conn] = {}
        self.evicted = self.timed_out = self.resets = 0
        self._opened = itertools.count()

    def install(self, server: web.Server) -> None:
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: Any) -> None:
            made(handler, transport)
            self.opened(handler, transport)

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            conn = self.conns.get(handler)
            self.closed(handler)
            if isinstance(exc, ConnectionError):  # a client that reset: one line, never a traceback
                self.resets += 1
                peer = conn.transport.get_extra_info("peername") if conn is not None else None
                log.debug("connection from %s lost: %s", peer or "a client", exc)
            lost(handler, exc)

        server.connection_made, server.connection_lost = connection_made, connection_lost  # type: ignore[method-assign]

    def opened(self, handler: Any, transport: Any, handshake: bool = False) -> None:
        """A connection opened (``handshake``: a TLS one at its TCP accept, ``transport`` a
        :class:`_Handshake`; the same ``handler`` opened again is its handshake done, and its
        head deadline still runs from the accept). Past the cap, one is evicted: the oldest still
        in its TLS handshake, else the one that has waited longest for its client (this one,
        when no other waits)."""
        conn = self.conns.get(handler)
        if conn is not None:  # a TLS connection counted since its accept: its handshake is done
            conn.transport, conn.handshake = transport, False
            return
        loop = asyncio.get_running_loop()
        conn = self.conns[handler] = _Conn(transport, loop.time(), next(self._opened), handshake)
        self._arm(handler, conn)
        if len(self.conns) > self.max_connections:
            # (the new one is never the "oldest handshake": else a listener full of idle
            # connections that did their handshake would take no new TLS client at all.) Oldest
            # by ``since`` then ``order``: uvloop's clock moves once per loop turn, and a flood
            # accepted in one turn was evicted in no order at all
            shaking = [(c.since, c.order, h) for h, c in self.conns.items() if c.handshake and h is not handler]
            waiting = shaking or [(c.since, c.order, h) for h, c in self.conns.items() if c.waiting]
            victim = min(waiting)[2] if waiting else handler
            self.evicted += 1
            self._close(victim)

    def closed(self, handler: Any) -> None:
        conn = self.conns.pop(handler, None)
        if conn is not None and conn.timer is not None:
            conn.timer.cancel()

    def begin(self, handler: Any, request: web.BaseRequest | None = None) -> None:
        """The handler of ``request`` runs on the connection (``request``: whose body may still be
        coming in; None: the connection is busy whatever its body)."""
        conn = self.conns.get(handler)
        if conn is not None:
            conn.busy, conn.request = True, request
            if conn.timer is not None:
                conn.timer.cancel()
                conn.timer = None

    def end(self, handler: Any) -> None:
        conn = self.conns.get(handler)
        if conn is not None:
            conn.busy, conn.request = False, None
            conn.since = asyncio.get_running_loop().time()
            self._arm(handler, conn, self.idle_timeout)

    def _arm(self, handler: Any, conn: _Conn, timeout: float | None = None) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
        wait = self.head_timeout if timeout is None else timeout
        conn.timer = asyncio.get_running_loop().call_later(wait, self._expire, handler)

    def _expire(self, handler: Any) -> None:
        conn = self.conns.get(handler)
        if conn is not None and not conn.busy:
            self.timed_out += 1
            self._close(handler)

    def _close(self, handler: Any) -> None:
        conn = self.conns.pop(handler, None)
        if conn is None:
            return
        if conn.timer is not None:
            conn.timer.cancel()
        conn.transport.close()  # (in its handshake: a _Handshake, which ends it at once)


GUARD = web.AppKey("connection_guard", ConnectionGuard)


@web.middleware
async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Marks the connection busy while its handler runs (a no-op on an app without a guard,
    e.g. under aiohttp's TestServer); evictable all the same until the request body is all in."""
    guard = request.app.get(GUARD)
    if guard is None:
        return await handler(request)
    guard.begin(request.protocol, request)
    try:
        return await handler(request)
    finally:
        guard.end(request.protocol)


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``SECURITY_HEADERS`` on every answer, errors (404, 405, ...) included."""
    try:
        resp = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(SECURITY_HEADERS)
        raise
    resp.headers.update(SECURITY_HEADERS)
    return resp


def application(*middlewares: Any, max_body: int = SMALL_BODY) -> web.Application:
    """An application whose first middleware is :func:`guarded`; ``max_body``: the largest
    request body its routes may read (413 beyond)."""
    return web.Application(client_max_size=max_body, middlewares=[guarded, *middlewares])


def body_deadline(length: int | None) -> float:
    """Seconds a body of ``length`` bytes (None: chunked, size unknown) may take to come in once
    the head is in: ``BODY_GRACE`` plus one second per ``BODY_RATE`` bytes, at most
    ``BODY_TIMEOUT`` (5 s for an AdmissionReview or a Filter, which their callers send at once;
    the 30 s only for a body of about 3 MiB or more, or one of unknown size)."""
    if length is None:
        return BODY_TIMEOUT
    return min(BODY_TIMEOUT, BODY_GRACE + length / BODY_RATE)


async def read_body(request: web.Request) -> bytes:
    """The request body, or 408 (and the connection closed) when it is not all in within
    :func:`body_deadline` of the head; 413 beyond the application's ``max_body``. A client
    that goes away (or a connection the guard evicts) before its body is in ends the request
    with one debug line, not a traceback: nobody is left to answer."""
    timeout = body_deadline(request.content_length)
    try:
        async with asyncio.timeout(timeout):  # (no task per request, unlike wait_for)
            return await request.read()
    except TimeoutError:
        answer = web.HTTPRequestTimeout(text=f"request body not received within {timeout:g} s")
        answer.force_close()  # the rest of the body is not waited for
        raise answer from None
    except ConnectionError as exc:
        log.debug("connection from %s lost before its request body was in: %s", request.remote or "a client", exc)
        gone = web.HTTPBadRequest(text="connection lost before the request body was in")
        gone.force_close()
        raise gone from None


#: bytes handed to the connection at a time by :func:`send_body`, each after the last one drained
SEND_CHUNK = 64 * 1024
#: the slowest a client may read a large answer (a metrics body of 1000 nodes is ~9 MB)
SEND_RATE = 256 * 1024


def send_deadline(length: int) -> float:
    """Seconds a client has to take an answer of ``length`` bytes: ``BODY_GRACE`` plus one second
    per ``SEND_RATE`` bytes (40 s for 9 MB)."""
    return BODY_GRACE + length / SEND_RATE


async def send_body(
    request: web.Request, body: bytes, headers: Any, status: int = 200, reason: str | None = None
) -> web.StreamResponse:
    """Answer with ``body`` a chunk at a time, each once the connection has taken the last: a
    whole ``web.Response`` is copied into the connection's buffer at once, so every client that
    never reads held a copy (512 of a 9 MB metrics answer: 4.6 GB). A client that has not taken
    it all within :func:`send_deadline` is disconnected. (``headers``: a mapping or pairs.)"""
    if len(body) <= SEND_CHUNK or request.method == "HEAD":
        return web.Response(body=body, status=status, reason=reason, headers=headers)
    resp = web.StreamResponse(status=status, reason=reason, headers=headers)
    resp.content_length = len(body)
    view = memoryview(body)
    try:
        async with asyncio.timeout(send_deadline(len(body))):
            await resp.prepare(request)
            for at in range(0, len(body), SEND_CHUNK):
                await resp.write(view[at : at + SEND_CHUNK])  # (waits while the buffer is over its mark)
            await resp.write_eof()
    except TimeoutError:
        log.debug("%s did not take a %d-byte answer in time; disconnected", request.remote or "a client", len(body))
        if request.transport is not None:
            request.transport.abort()  # (what is buffered for it goes too)
    except ConnectionError as exc:
        # a client that left mid-answer (a scrape's time-out): nobody to tell, and no traceback
        # in the log for it (aiohttp's own writing of a whole answer drops it the same way)
        log.debug("%s left before the end of a %d-byte answer: %s", request.remote or "a client", len(body), exc)
    return resp


async def start(
    app: web.Application,
    host: str | None,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    guard: ConnectionGuard | None = None,
    backlog: int = 128,
    dual_stack: bool = False,
) -> web.AppRunner:
    """Listen on ``host:port`` (``""`` or None: every address) with the guard and the limits;
    returns the runner (``cleanup()`` it; ``runner.addresses`` has the port bound for ``port=0``).

    ``dual_stack``: an IPv6 wildcard (``::``) also takes IPv4 connections (the node monitor's
    listener did with prometheus_client's server; asyncio's default is IPv6 only)."""
    if guarded not in app.middlewares:
        app.middlewares.insert(0, guarded)
    app[GUARD] = guard = guard or ConnectionGuard()
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=IDLE_TIMEOUT,
        auto_decompress=False,
        max_line_size=MAX_HEADER_BYTES,
        max_field_size=MAX_HEADER_BYTES,
        max_headers=MAX_HEADERS,
        lingering_time=LINGER,
        logger=_ServerLog(logging.getLogger("aiohttp.server"), {}),
    )
    await runner.setup()
    guard.install(runner.server)
    try:
        sock = None
        if dual_stack and host in ("::", "[::]") and socket.has_dualstack_ipv6():
            sock = socket.create_server(("::", port), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=True)
        site: web.BaseSite
        if ssl_context is not None:  # (the handshake counted by the guard: _TlsSite)
            site = _TlsSite(runner, guard, ssl_context, host or None, port, sock=sock, backlog=backlog)
        elif sock is not None:
            site = web.SockSite(runner, sock, backlog=backlog)
        else:
            site = web.TCPSite(runner, host or None, port, backlog=backlog)
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ListenError(host, port, exc) from None
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def _bind(host: str | None, port: int) -> list[socket.socket]:
    """Sockets bound to ``host:port`` (None or "": every address), one per address it names, as
    asyncio's ``create_server`` binds them (address reuse; an IPv6 socket IPv6 only)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:  # a family this host has no support for
                continue
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class _Handshake:
    """What the guard holds of a TLS connection still in its handshake, in place of its
    transport (there is none yet): closing it ends the handshake at once."""

    __slots__ = ("sock", "peer", "handler", "task", "taken")

    def __init__(self, sock: socket.socket, peer: Any, handler: Any) -> None:
        self.sock, self.peer, self.handler = sock, peer, handler
        self.task: asyncio.Task | None = None
        self.taken = False  # the TLS layer's transport owns the socket (closes it)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def close(self) -> None:
        if not self.taken:
            self.sock.close()
        if self.task is not None:
            self.task.cancel()  # (the TLS layer closes its transport)

    abort = close


class _Listening:
    """A :class:`_TlsSite`'s listening sockets and their accept loops (what aiohttp keeps of a
    site's server: ``sockets`` for ``runner.addresses``, and ``close``)."""

    def __init__(self, sockets: list[socket.socket], tasks: list[asyncio.Task]) -> None:
        self.sockets, self.tasks = sockets, tasks

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()

    async def wait_closed(self) -> None:
        """The accept loops ended, then the sockets closed (not under a loop still polling them)."""
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for sock in self.sockets:
            sock.close()


class _TlsSite(web.BaseSite):
    """A TLS listening site (in place of aiohttp's ``TCPSite``/``SockSite`` with an
    ``ssl_context``) whose connections the guard counts from their TCP accept, the handshake
    included: each is accepted as plain TCP, counted (:meth:`ConnectionGuard.opened`, its head
    deadline running), and only then given the TLS layer (``loop.connect_accepted_socket``, at
    most :data:`HANDSHAKE_TIMEOUT`), which hands aiohttp's handler the connection once the
    handshake is done.

    With asyncio's own TLS server (``create_server(ssl=...)``), aiohttp and so the guard saw a
    connection only once its handshake was done, and the handshake waited 60 s: 2000 silent TCP
    connections held 643 MiB (each handshake's buffers), none of them counted by the cap (found
    by review, 1 Dec). Now the cap holds them too, and past it they are evicted first."""

    __slots__ = ("_host", "_port", "_sock", "guard", "context", "pending")

    def __init__(
        self,
        runner: web.BaseRunner,
        guard: ConnectionGuard,
        ssl_context: ssl.SSLContext,
        host: str | None = None,
        port: int = 0,
        sock: socket.socket | None = None,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host, self._port, self._sock = host, port, sock
        self.guard, self.context = guard, ssl_context
        self.pending: set[_Handshake] = set()  # the handshakes under way

    @property
    def name(self) -> str:
        host = self._host or "0.0.0.0"
        return f"https://{f'[{host}]' if ':' in host else host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        sockets = [self._sock] if self._sock is not None else _bind(self._host, self._port)
        try:
            for sock in sockets:
                sock.listen(self._backlog)
                sock.setblocking(False)
        except OSError:
            for sock in sockets:
                sock.close()
            raise
        loop = asyncio.get_running_loop()
        self._server = _Listening(sockets, [loop.create_task(self._accept(sock)) for sock in sockets])  # type: ignore[assignment]

    async def stop(self) -> None:
        await super().stop()
        if isinstance(self._server, _Listening):
            await self._server.wait_closed()
        pending = list(self.pending)
        for shake in pending:
            self._gone(shake)
            shake.close()
        await asyncio.gather(*(shake.task for shake in pending if shake.task), return_exceptions=True)

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except (BlockingIOError, InterruptedError, ConnectionError):  # (a client gone before its accept)
                continue
            except OSError as exc:  # out of file descriptors or memory: a pause, as asyncio's own server makes
                log.warning("%s: cannot accept a connection (%s); accepting again in 1 s", self.name, exc)
                await asyncio.sleep(1.0)
                continue
            try:
                self._accepted(conn, peer)
            except Exception:  # noqa: BLE001 - a bug here must not end the accept loop (the listener)
                log.exception("%s: a connection from %s could not be taken", self.name, peer)
                conn.close()

    def _accepted(self, conn: socket.socket, peer: Any) -> None:
        """A TCP connection accepted: counted by the guard, then its handshake begun."""
        shake = _Handshake(conn, peer, self._runner.server())  # type: ignore[misc]  # (aiohttp's protocol)
        self.guard.opened(shake.handler, shake, handshake=True)
        if shake.handler not in self.guard.conns:  # over the cap with nothing to evict: closed
            return
        shake.task = asyncio.get_running_loop().create_task(self._handshake(shake))
        self.pending.add(shake)
        shake.task.add_done_callback(functools.partial(self._ended, shake))

    async def _handshake(self, shake: _Handshake) -> None:
        """The TLS layer on an accepted connection. Once its handshake is done it calls
        ``handler.connection_made``, which the guard takes as the hand-over
        (:meth:`ConnectionGuard.opened`)."""

        def protocol() -> asyncio.BaseProtocol:
            return shake.handler

        shake.taken = True  # (connect_accepted_socket gives the socket to its transport before it awaits)
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                protocol, shake.sock, ssl=self.context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT
            )
        except (Exception, asyncio.CancelledError) as exc:  # failed, timed out, evicted, the site stopped
            self._gone(shake)
            log.debug("TLS handshake with %s not done: %s", shake.peer or "a client", str(exc) or type(exc).__name__)

    def _ended(self, shake: _Handshake, _task: asyncio.Task) -> None:
        self.pending.discard(shake)

    def _gone(self, shake: _Handshake) -> None:
        """The guard forgets a connection whose handshake ended without a hand-over."""
        entry = self.guard.conns.get(shake.handler)
        if entry is not None and entry.transport is shake:
            self.guard.closed(shake.handler)


class ListenError(OSError):
    """A listener that could not open (its port taken, an address not this host's): one line
    naming the address, which ``hami``'s entry point prints instead of a traceback."""

    def __init__(self, host: str | None, port: int, cause: OSError) -> None:
        where = f"[{host}]" if host and ":" in host and not host.startswith("[") else (host or "*")
        # asyncio's strerror repeats the address; the errno's own words are enough beside ours
        reason = os.strerror(cause.errno) if (cause.errno or 0) > 0 else (cause.strerror or str(cause))
        super().__init__(f"cannot listen on {where}:{port} ({reason})")
        self.errno = cause.errno


# ---------------------------------------------------------------------------- WSGI


def wsgi_application(wsgi: Callable[..., Iterable[bytes]]) -> web.Application:
    """Every path and method handed to ``wsgi`` (called in a worker thread; bodies are not
    read): prometheus_client's ``make_wsgi_app`` keeps its exposition, content negotiation,
    ``name[]`` filter and gzip exactly as its own threaded server served them."""

    async def handle(request: web.Request) -> web.StreamResponse:
        environ = _environ(request)
        status, headers, body = await asyncio.to_thread(_call, wsgi, environ)
        code, _, reason = status.partition(" ")
        return await send_body(request, body, headers, int(code), reason or None)

    app = application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def _environ(request: web.Request) -> dict[str, Any]:
    host, port = (request.transport.get_extra_info("sockname") or ("", 0))[:2] if request.transport else ("", 0)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": request.path,
        "QUERY_STRING": request.query_string,
        "SERVER_NAME": str(host),
        "SERVER_PORT": str(port),
        "SERVER_PROTOCOL": f"HTTP/{request.version.major}.{request.version.minor}",
        "REMOTE_ADDR": request.remote or "",
        "CONTENT_TYPE": request.headers.get("Content-Type", ""),
        "CONTENT_LENGTH": request.headers.get("Content-Length", ""),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": request.scheme,
        "wsgi.input": io.BytesIO(b""),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in request.headers.items():
        key = "HTTP_" + name.upper().replace("-", "_")
        if key not in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
            environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


def _call(wsgi: Callable[..., Iterable[bytes]], environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        started[:] = [status, headers]
        return lambda data: None  # the legacy write() callable: prometheus_client does not use it

    chunks = wsgi(environ, start_response)
    try:
        body = b"".join(chunks)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return started[0], list(started[1]), body


# ---------------------------------------------------------------------------- TLS


class CertReloader:
    """Keeps one SSLContext serving the current files: polls their mtime/size and reloads.

    ``client_ca``: also ask every caller for a client certificate (optional in the handshake: the
    API server calling /webhook has none) and verify one that is presented against this CA
    bundle alone (not the system's CAs); :func:`client_verified` tells the handlers. When the
    bundle file changes (a renewed CA) its certificates are trusted too; those trusted before
    stay trusted until a restart (an SSLContext can add trust anchors, not drop them)."""

    def __init__(self, cert: str, key: str, interval: float = 1.0, client_ca: str = "") -> None:
        self.cert, self.key, self.interval, self.client_ca = cert, key, interval, client_ca
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        if client_ca:
            self.context.verify_mode = ssl.CERT_OPTIONAL
            self.context.load_verify_locations(cafile=client_ca)
            self._ca_stamp = self._stat(client_ca)
        self.context.load_cert_chain(cert, key)
        self._stamp = self._current()
        self.reloads = 0
        self.ca_reloads = 0

    @staticmethod
    def _stat(path: str) -> tuple:
        s = os.stat(path)
        return s.st_mtime_ns, s.st_size, s.st_ino

    def check_client_ca(self) -> bool:
        """Trust the client CA file's certificates again when the file changed."""
        if not self.client_ca:
            return False
        try:
            stamp = self._stat(self.client_ca)
            if stamp == self._ca_stamp:
                return False
            self.context.load_verify_locations(cafile=self.client_ca)
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.warning("client CA %s not reloaded (will retry): %s", self.client_ca, exc)
            return False
        self._ca_stamp = stamp
        self.ca_reloads += 1
        log.info("client CA reloaded from %s (the previous one stays trusted until a restart)", self.client_ca)
        return True

    def _current(self) -> tuple:
        return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in (os.stat(self.cert), os.stat(self.key)))

    def check(self) -> bool:
        try:
            stamp = self._current()
            if stamp == self._stamp:
                return False
            self.context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.warning("TLS certificate not reloaded (will retry): %s", exc)
            return False
        self._stamp = stamp
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.cert)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()
            self.check_client_ca()


def client_verified(request: web.Request) -> bool:
    """Whether the request came over TLS with a client certificate the listener verified."""
    transport = request.transport
    return bool(transport is not None and transport.get_extra_info("peercert"))
