"""A small JSON client over kubernetes_asyncio's transport (auth, TLS, connection pool).

Objects are plain dicts as the API server sends them: no model (de)serialisation, which is
both faster and what the pure core wants. Non-2xx answers raise :class:`KubeError`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any, Awaitable, Callable, Iterable, TypeVar
from urllib.parse import urlencode

import aiohttp
import orjson
from kubernetes_asyncio import client, config

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


log = logging.getLogger(__name__)
#: its "Config not found: <path>" warning came before the one line every command prints for a
#: missing kubeconfig (:func:`hami.cli.startup_error`), saying the same thing less well
logging.getLogger("kubernetes_asyncio.config.kube_config").setLevel(logging.ERROR)
T = TypeVar("T")


class KubeError(Exception):
    """An API request failed; ``status`` is the HTTP status (0 when no answer came back)."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        try:
            message = json.loads(body).get("message") or body
        except (ValueError, AttributeError):
            message = body
        super().__init__(f"{method} {path}: HTTP {status}: {str(message)[:300]}")


_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def skip_env_lookups(api: client.ApiClient) -> client.ApiClient:
    """kubernetes_asyncio's aiohttp session trusts the environment, so every request scans the
    proxy variables and parses ``~/.netrc`` again (about 7% of the scheduler's CPU under load).
    Without any proxy variable set, that lookup can only find nothing: turn it off. With one
    set, it stays on so the proxy is honoured."""
    import os

    if not any(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARS):
        session = api.rest_client.pool_manager
        if hasattr(session, "_trust_env"):
            session._trust_env = False
    return api


# Connections to the API server at once (HTTP/1.1: one request in flight on each; a watch holds
# one for as long as it runs). Each new one is a TLS handshake on both sides. With 100, a burst
# of 1000 pods opened all 100 (Bindings pile up while the API server is busy); with 32 the same
# bench ran as fast (A/B runs within the machine's noise) on a third of the handshakes.
POOL = 32


async def load_api_client(kubeconfig: str | None = None, qps_pool: int = POOL) -> client.ApiClient:
    """An ApiClient from ``kubeconfig``, else ``$KUBECONFIG``/``~/.kube/config``, else in-cluster;
    at most ``qps_pool`` connections (:data:`POOL`), requests beyond wait for one."""
    configuration = client.Configuration()
    try:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (config.ConfigException, FileNotFoundError, TypeError) as exc:
        if kubeconfig and isinstance(exc, TypeError):
            # the client's reading of an empty file or one that is not a mapping: a traceback
            raise config.ConfigException(f"{kubeconfig}: not a kubeconfig (empty, or not a YAML mapping)") from None
        if kubeconfig:
            raise
        # the client library's own "Config not found" warning is silenced (above): a $KUBECONFIG
        # naming no file that exists is said here, or a typo in it would pass unnoticed (in a pod:
        # the pod's service account used instead, without a word)
        missing = _missing_kubeconfig_env()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as incluster:
            if missing:
                raise config.ConfigException(f"{missing}; and not in a pod ({incluster})") from None
            raise
        if missing:
            log.warning("%s: using the pod's service account", missing)
    configuration.connection_pool_maxsize = qps_pool
    return skip_env_lookups(client.ApiClient(configuration))


def _missing_kubeconfig_env() -> str | None:
    """Why ``$KUBECONFIG`` gave no credentials when it names only files that are not there (the
    client library then reads nothing and falls back as if it were unset), else None."""
    import os

    paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if not paths or any(os.path.exists(os.path.expanduser(p)) for p in paths):
        return None
    return f"KUBECONFIG={os.environ['KUBECONFIG']!r}: no such file"


class ApiDisconnected(aiohttp.ClientConnectionError, ConnectionError):
    """The connection to the API server broke before a whole answer came (the server closed it,
    the body was cut): an aiohttp error that is also an :class:`OSError`, so every caller that
    handles an unreachable API server handles it (``ServerDisconnectedError`` and
    ``ClientPayloadError`` are neither ``OSError`` nor ``TimeoutError``: they escaped the Bind,
    leaving its lock and reservation behind; found by review, 1 Dec). A request that ends so may
    have been applied."""


def _disconnected(exc: aiohttp.ClientError) -> ApiDisconnected:
    return ApiDisconnected(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


class KubeClient:
    """``await kube.request("GET", "/api/v1/nodes")`` -> dict. One shared connection pool."""

    def __init__(self, api: client.ApiClient, timeout: float = 30.0) -> None:
        self.api = api
        self.timeout = timeout
        #: why the last request got no answer (no connection, a time-out); None once one is
        #: answered, whatever its status: what a start-up waiting on the API server reports
        self.failure: str | None = None
        self.answered = False  # some request was answered

    @property
    def server(self) -> str:
        return str(self.api.configuration.host)

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, timeout: float = 30.0, pool: int = POOL) -> "KubeClient":
        return cls(await load_api_client(kubeconfig, pool), timeout)

    async def close(self) -> None:
        await self.api.close()

    async def open(
        self,
        method: str,
        path: str,
        query: Iterable[tuple[str, Any]] = (),
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        idle: float | None = None,
    ) -> Any:
        """The raw aiohttp response (for watches); the caller reads and releases it. ``timeout``
        bounds the whole exchange; ``idle``, when given, the wait for each next piece of the body
        (a watch's stream: a connection the network black-holed says nothing, it never closes).

        Sent straight on kubernetes_asyncio's session (its TLS, pool and proxy settings) with its
        configuration's credentials, asked for per request (an exec plugin's or a projected
        ServiceAccount's token is refreshed there). Not through ``ApiClient.call_api``, which walks
        every body to sanitise it and encodes it with ``json``: the body is encoded here with
        orjson, once."""
        rest = self.api.rest_client
        configuration = self.api.configuration
        # the ApiClient's default headers (its User-Agent, any the caller set), as call_api sends them
        headers = {**self.api.default_headers, "Content-Type": content_type, "Accept": "application/json"}
        if configuration.api_key:
            for setting in (await configuration.auth_settings()).values():
                headers[setting["key"]] = setting["value"]
        url = configuration.host + path
        params = [(k, v) for k, v in query]
        if params:
            url += "?" + urlencode(params)
        extra: dict[str, Any] = {}
        if rest.proxy:
            extra["proxy"] = rest.proxy
            if rest.proxy_headers:
                extra["proxy_headers"] = rest.proxy_headers
        if rest.server_hostname:
            extra["server_hostname"] = rest.server_hostname
        total = timeout if timeout is not None else self.timeout
        try:
            resp = await rest.pool_manager.request(
                method,
                url,
                headers=headers,
                data=None if body is None else encode_json(body),
                timeout=aiohttp.ClientTimeout(total=total, sock_read=idle),
                **extra,
            )
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self.failure = no_answer(exc, total)
            if isinstance(exc, aiohttp.ClientError) and not isinstance(exc, OSError):
                raise _disconnected(exc) from exc
            raise
        self.failure, self.answered = None, True
        return resp

    async def request(
        self,
        method: str,
        path: str,
        query: Iterable[tuple[str, Any]] = (),
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        resp = await self.open(method, path, query, body, content_type, timeout)
        try:
            data = await resp.read()
        except aiohttp.ClientError as exc:  # the body cut short (ClientPayloadError), the server gone
            if isinstance(exc, OSError):
                raise
            raise _disconnected(exc) from exc
        finally:
            resp.release()
        if not 200 <= resp.status <= 299:
            raise KubeError(method, path, resp.status, data.decode(errors="replace"))
        return loads(data) if data else None

    # -- conveniences -----------------------------------------------------------------------
    async def get(self, path: str, **query: Any) -> Any:
        return await self.request("GET", path, query.items())

    async def merge_patch(self, path: str, body: Any) -> Any:
        return await self.request("PATCH", path, body=body, content_type=MERGE_PATCH)

    async def json_patch(self, path: str, ops: list[dict[str, Any]]) -> Any:
        return await self.request("PATCH", path, body=ops, content_type=JSON_PATCH)

    async def post(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body=body)


#: nesting kept of what the API server sends: a subtree below it reads as null. orjson reads 1024
#: levels; the API server stores deeper (a ResourceClaim's opaque parameters for another driver,
#: up to its own limit of 10000), and one such claim in a list or watch stopped the reflector for
#: good: the scheduler's claim cache froze and, after a restart, never synced (its /readyz 503,
#: every GPU pod refused by the webhook; found by review)
READ_DEPTH = 512

# a JSON string (escapes included) or a bracket: all a depth count needs to look at
_STRUCTURE = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)


def loads(data: bytes | str) -> Any:
    """JSON from the API server: orjson, read as Go's ``encoding/json`` reads it where orjson
    refuses what Go accepts. The API server stores a field it does not decode (a ResourceClaim's
    opaque parameters, a ``RawExtension``) byte for byte as the client sent it, and serves it so:
    such a field may be nested deeper than orjson reads (every container below
    :data:`READ_DEPTH` levels reads as null), hold a lone surrogate escape (``"\\ud800"``) or a
    byte that is not UTF-8 (each reads as U+FFFD, as in Go), or a number beyond a double (read by
    ``json``). Orjson refused all of these, and one such claim in a list or a watch stopped the
    scheduler's claim cache: the watch resumed before it for ever, a fresh list never synced
    (found by review, 1 Dec). Whatever is malformed still raises ValueError."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        error = exc
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    pruned = mended = False
    while True:
        if "depth" in str(error) and not pruned:
            log.warning(
                "a document from the API server nested deeper than %d levels: its deeper parts read as null",
                READ_DEPTH,
            )
            raw, pruned = prune_depth(raw, READ_DEPTH), True
        elif not mended:
            raw, mended = go_strings(raw), True
        else:
            break
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            error = exc
    try:
        return json.loads(raw, parse_constant=_no_constant)  # (a number beyond a double: Go reads it)
    except RecursionError:  # deeper than Python's stack, within what orjson reads: cut as above
        try:
            return json.loads(prune_depth(raw, READ_DEPTH), parse_constant=_no_constant)
        except ValueError:
            pass
    except ValueError:
        pass
    raise error


#: a backslash escape in a JSON text: a surrogate pair, a lone surrogate (group 1), or any other
_ESCAPE = re.compile(
    r"\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|(u[dD][89a-fA-F][0-9a-fA-F]{2})|.)", re.S
)


def go_strings(data: bytes) -> bytes:
    """``data`` with what Go's JSON decoder reads as U+FFFD written as U+FFFD: a byte that is not
    UTF-8, and an escaped surrogate that is not half of a pair (orjson refuses both; ``json``
    keeps the lone surrogate in a string that then cannot be encoded to UTF-8)."""
    try:
        text, bad_bytes = data.decode(), False
    except UnicodeDecodeError:
        text, bad_bytes = data.decode("utf-8", "replace"), True
    mended = _ESCAPE.sub(lambda m: "\\ufffd" if m.group(1) else m.group(0), text)
    if bad_bytes or mended != text:
        log.warning(
            "a document from the API server holds a string that is not valid Unicode (a lone surrogate "
            "escape, or bytes that are not UTF-8): read with U+FFFD in their place, as Go reads it"
        )
    return mended.encode()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def prune_depth(data: bytes, limit: int) -> bytes:
    """``data`` with each array or object that opens below ``limit`` levels replaced by ``null``
    (brackets inside strings are not counted). Malformed input stays malformed."""
    out: list[bytes] = []
    depth = 0
    copied = 0  # data[copied:] is still to be copied
    cut: int | None = None  # where the container being replaced began
    for m in _STRUCTURE.finditer(data):
        c = data[m.start()]
        if c == 0x22:  # a string
            continue
        if c in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth == limit + 1:
                cut = m.start()
        else:
            if depth == limit + 1 and cut is not None:
                out += (data[copied:cut], b"null")
                copied, cut = m.end(), None
            depth -= 1
    out.append(data[copied:])
    return b"".join(out)


def encode_json(body: Any) -> bytes:
    """A body as JSON: orjson, or ``json`` for what orjson will not write (a lone surrogate in a
    string, which ``json`` escapes), so that such a body goes out as it did with ``json``. For
    the requests sent here and the scheduler's answers."""
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(body).encode()


def pod_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")


def node_path(name: str = "") -> str:
    return "/api/v1/nodes" + (f"/{name}" if name else "")


def no_answer(exc: BaseException, timeout: float | None = None) -> str:
    """One line for a request the API server did not answer (a time-out's own text is empty)."""
    if isinstance(exc, asyncio.TimeoutError) and not str(exc):
        return f"no answer within {timeout:g}s" if timeout else "no answer in time"
    return str(exc) or type(exc).__name__


def unanswered(exc: BaseException) -> bool:
    """The API server could not be reached, or answered that it cannot serve yet (starting,
    overloaded, behind a load balancer with no backend): worth waiting for at start-up."""
    if isinstance(exc, KubeError):
        return exc.status in (0, 429, 500, 502, 503, 504)
    return isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, OSError))


#: a program waiting on the API server at start says so at its first failure, then this often
WAIT_LOG_S = 30.0


class ApiWait:
    """What a start-up waiting on the API server logs, and when: a line at the first failure
    (or, when requests just hang, once :data:`WAIT_LOG_S` passed without an answer), then one
    every ``every`` seconds while it still waits, and one when the wait is over, if it was
    reported at all. A component that retries every second or two would otherwise either log
    nothing (its failures swallowed until it is up) or one line per retry."""

    def __init__(self, server: str, start: float, every: float = WAIT_LOG_S) -> None:
        self.server, self.start, self.every = server, start, every
        self.last: float | None = None  # when the last line was due

    def waiting(self, now: float, what: str, failure: str | None, answered: bool = False) -> str | None:
        """The line to log now while ``what`` is awaited (None: not yet). ``failure``: why the
        last request got no answer (None when it was answered or is still out)."""
        waited = now - self.start
        if self.last is None and failure is None and waited < self.every:
            return None
        if self.last is not None and now - self.last < self.every:
            return None
        self.last = now
        if failure is not None:
            why = failure
        elif answered:
            why = "it answers, the rest is still to come"
        else:
            why = "no answer yet"
        return f"waiting for the API server at {self.server} ({what}, {waited:.0f}s so far): {why}; still retrying"

    def over(self, now: float, what: str) -> str | None:
        """The line to log once the wait is over (None when it never was reported)."""
        if self.last is None:
            return None
        return f"the API server at {self.server} answered: {what} after {now - self.start:.0f}s"


async def report_wait(
    kube: KubeClient,
    pending: Callable[[], list[str]],
    what: str,
    logger: logging.Logger = log,
    every: float = WAIT_LOG_S,
    poll: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Log, at the pace of :class:`ApiWait`, while ``pending()`` (what is still awaited, e.g. the
    watches not listed yet) is not empty; ends when it is. The requests themselves are other
    tasks' (the reflectors', which retry on their own): this only reads ``kube.failure``."""
    wait = ApiWait(kube.server, clock(), every)
    while True:
        left = pending()
        if not left:
            line = wait.over(clock(), what)
            if line:
                logger.info("%s", line)
            return
        line = wait.waiting(clock(), f"{what}: {', '.join(left)}", kube.failure, kube.answered)
        if line:
            logger.warning("%s", line)
        await asyncio.sleep(poll)


async def until_answered(
    kube: KubeClient,
    call: Callable[[], Awaitable[T]],
    what: str,
    stop: asyncio.Event,
    logger: logging.Logger = log,
    every: float = WAIT_LOG_S,
    delay: float = 1.0,
    max_delay: float = 15.0,
    clock: Callable[[], float] = time.monotonic,
) -> T | None:
    """``await call()`` until it is not refused for want of an API server (:func:`unanswered`):
    again after 1 s, doubling up to ``max_delay``, logged at the pace of :class:`ApiWait`. Any
    other error is raised; None when ``stop`` is set first. For a start-up's requests, which
    must be idempotent (a read, a server-side apply)."""
    wait = ApiWait(kube.server, clock(), every)
    while not stop.is_set():
        # raced against the stop: a request to a server that accepts and never answers hangs
        # for the client's time-out (30 s, the kubelet's whole grace period), and a SIGTERM
        # meanwhile must end the wait, not get the program killed
        attempt = asyncio.ensure_future(call())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((attempt, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not attempt.done():
                attempt.cancel()
                await asyncio.gather(attempt, return_exceptions=True)
        if not attempt.done() or attempt.cancelled():
            return None
        try:
            result = attempt.result()
        except Exception as exc:  # noqa: BLE001 - only the API server's absence is waited out
            if not unanswered(exc):
                raise
            line = wait.waiting(clock(), what, no_answer(exc, kube.timeout), kube.answered)
            if line:
                logger.warning("%s", line)
        else:
            line = wait.over(clock(), what)
            if line:
                logger.info("%s", line)
            return result
        try:
            await asyncio.wait_for(stop.wait(), delay)
            return None
        except asyncio.TimeoutError:
            delay = min(delay * 2, max_delay)
    return None
