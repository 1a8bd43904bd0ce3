"""The UI listener of ``hami scheduler`` (``--ui-bind``): the ``/api/v1`` API, its OpenAPI
document and the page. Read-only.

Who may call it (docs/ui.md, "Signing in and permissions"; docs/security.md):

- ``--ui-auth=token`` (the default): every ``/api/`` request carries ``Authorization: Bearer
  <token>``, a Kubernetes token the API server accepts (TokenReview); each answer needs the RBAC
  permissions of :data:`NEEDS` (SubjectAccessReview) and shows only the namespaces where the
  caller may list (:mod:`.auth`, :mod:`.scope`). No token or a bad one: 401 with
  ``WWW-Authenticate: Bearer``; a missing permission: 403 naming it; a review the API server
  could not answer: 503. The page, its assets and ``/healthz`` need no token (the page asks for
  one when the API answers 401).
- ``--ui-auth=none``: no check at all (a loopback bind only, for ``kubectl port-forward``; the
  scheduler refuses it on any other address). :class:`UiApi` without an ``authorizer``.

Nothing secret is served: no Secret, token, environment variable or annotation value is copied
into its answers, only the ledger's allocations and the scheduler's own verdicts.

- ``GET``/``HEAD`` only: any other method is 405 (with ``Allow: GET, HEAD``), on every path.
- A query parameter an endpoint does not take, or one given twice, is 400 naming it; an unknown
  path is 404.
- Strict headers on every answer (:data:`hami.serve.SECURITY_HEADERS`): a Content-Security-Policy
  that allows the page's own assets only (no inline script, no other origin), ``nosniff``, no
  framing, no referrer; no caching of API answers. ``frame_ancestors`` (``--ui-frame-ancestors``,
  validated by the scheduler's options) replaces the CSP's ``'none'`` to let a portal embed the
  page; ``X-Frame-Options: DENY`` is then left out (it cannot name a portal).
- ``prefix`` (``--ui-path-prefix``): every route under it (``/hami/``, ``/hami/api/v1/...``;
  ``/hami`` redirects to ``/hami/``), for a reverse proxy that passes the prefix on; ``/healthz``
  also stays at the root for probes. The page's own URLs are all relative, so a proxy that strips
  the prefix works without it.
- The listener's connection cap, deadlines and header limits are :func:`hami.serve.start`'s.
- An unexpected failure while building an answer is logged and answered 503 with one line
  (the scheduler keeps running; the next refresh tries again).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import ssl
import time
from importlib import resources
from typing import Any, Callable, Iterable, Mapping

import orjson
from aiohttp import web

from hami.serve import SECURITY_HEADERS, ConnectionGuard, application, start

from . import history as hist
from . import model, page, scope
from .prometheus import SAFE as PROMQL_SAFE
from .prometheus import PrometheusError, PrometheusHistory
from .auth import AccessReviewsBusy, Authorizer, Caller, Permission, ReviewBusy, ReviewUnavailable, Unauthenticated

log = logging.getLogger(__name__)
ALLOWED = ("GET", "HEAD")
STATIC = {
    "app.js": "text/javascript",
    "style.css": "text/css",
    page.CHART_JS: "text/javascript",  # uPlot, when installed (make ui-assets)
    page.CHART_CSS: "text/css",
}
PENDING_TTL = 2.0  # s an /api/v1/pending answer is reused (and the shared nodes and pods documents)
SHARED_DOCS = 64  # queries whose nodes (pods) document is kept: ?node= values, each a cheap build
#: a shared document is reused, ledger changed or not, until it is this many times as old as it
#: took to build: the UI's builds take at most about 1/LOOP_SHARE of the loop Filter and Bind run on
LOOP_SHARE = 10
HISTORY_ITEMS = 100  # series per /api/v1/history answer (narrow it with node, namespace, uuid, pod)
EVENTS_LIMIT = 20  # events per /api/v1/pods/{ns}/{name}/events answer unless ?limit= (1..EVENTS_MAX)
EVENTS_MAX = 100
EVENTS_READ = 500  # events asked of the API server for one pod per page (the newest EVENTS_MAX of them are kept)
#: pages read for one pod: the list is in name order, not time order, so the newest event may be
#: on any page (a pod with thousands of distinct events is rare: series fold repeats into one)
EVENTS_PAGES = 10
EVENT_MESSAGE = 1024  # characters of one event's message
EVENTS_TIMEOUT = 5.0  # s for the API server's answer
# pods whose events are being read at once, over all callers: the reads share the UI's 4
# connections with every caller's sign-in (auth.UI_CONNECTIONS), so the rest is answered 503
EVENTS_IN_FLIGHT = 2
# of them, started by one user (however many tokens): one caller's slow reads leave the other
# slot to everyone else (a caller joining a read already under way costs nothing)
EVENTS_PER_USER = 1
# history answers one user may have asking Prometheus at once (its slots, prometheus.CONCURRENT,
# are shared by every caller: made-up ?uuid= values each started new queries and held them all)
HISTORY_PER_USER = 2
EVENTS_REUSE_S = 2.0  # s one pod's events (or why they could not be read) are given again
POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
HISTORY_FILTERS = {"namespace": ("namespace",), "gpu": ("node", "uuid"), "pod": ("namespace", "node", "pod")}
CALLER = web.RequestKey("hami.ui.caller", Caller)
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# what each endpoint needs (docs/ui.md keeps the same table): "ns" = in each namespace shown
NEEDS = {
    "/api/v1/nodes": "list nodes (cluster scope); DRA claim names only of namespaces with list pods",
    "/api/v1/pods": "list pods (cluster scope, or per namespace: those namespaces only)",
    "/api/v1/pending": "list pods (as /pods); per-node verdicts also need list nodes",
    "/api/v1/quotas": "list resourcequotas (cluster scope, or per namespace)",
    "/api/v1/history": "kind=gpu: list nodes (cluster scope); kind=pod|namespace: list pods, as /pods",
    "/api/v1/pods/{namespace}/{name}/events": "list events in that namespace",
    "/api/v1/openapi.yaml": "an accepted token only",
}


class EventsUnavailable(Exception):
    """The API server could not list a pod's events (the answer says so; the page shows it)."""


class EventsBusy(Exception):
    """``EVENTS_IN_FLIGHT`` other pods' events are being read (or ``EVENTS_PER_USER`` of the
    caller's own): answered 503 at once, the message saying which."""


class KubeEvents:
    """A pod's events from the API server, read with the scheduler's own client (the caller's
    ``list events`` is checked first, by :meth:`UiApi.events`)."""

    def __init__(self, kube: Any) -> None:
        self.kube = kube

    async def __call__(self, namespace: str, name: str) -> list[dict]:
        first = [
            ("fieldSelector", f"involvedObject.kind=Pod,involvedObject.name={name}"),
            ("limit", str(EVENTS_READ)),
        ]
        query = first
        out: list[dict] = []
        restarted = False
        pages = 0
        while pages < EVENTS_PAGES:
            pages += 1
            try:
                answer = await self.kube.request(
                    "GET", f"/api/v1/namespaces/{namespace}/events", query, timeout=EVENTS_TIMEOUT
                )
            except Exception as exc:  # noqa: BLE001 - KubeError, aiohttp's errors, timeouts: said in the answer
                if query is not first and getattr(exc, "status", None) == 410 and not restarted:
                    # the continue token expired between pages (the API server compacted its
                    # snapshot): the pages read are of an older list, so it is read again from
                    # the start, once, as client-go's pager falls back to a fresh list
                    query, out, pages, restarted = first, [], 0, True
                    continue
                raise EventsUnavailable(f"{type(exc).__name__}: {str(exc)[:300]}") from exc
            items = answer.get("items") if isinstance(answer, dict) else None
            if not isinstance(items, list):
                raise EventsUnavailable("the API server's answer has no items")
            out += [i for i in items if isinstance(i, dict)]
            meta = answer.get("metadata")
            token = meta.get("continue") if isinstance(meta, dict) else None
            if not token or not isinstance(token, str):
                break
            query = [*first, ("continue", token)]
        return out


def _event_time(event: dict) -> str:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        value = event.get(key)
        if isinstance(value, str) and value:
            return value
    meta = event.get("metadata") if isinstance(event.get("metadata"), dict) else {}
    return str(meta.get("creationTimestamp") or "")


def event_items(events: list[dict], limit: int) -> list[dict]:
    """The newest ``limit`` events, newest first, each cut to the fields the page shows."""
    out = []
    for e in sorted(events, key=_event_time, reverse=True)[:limit]:
        source = e.get("source") if isinstance(e.get("source"), dict) else {}
        count = e.get("count")
        series = e.get("series") if isinstance(e.get("series"), dict) else {}
        out.append(
            {
                "type": str(e.get("type") or ""),
                "reason": str(e.get("reason") or "")[:128],
                "message": str(e.get("message") or "")[:EVENT_MESSAGE],
                "count": count if isinstance(count, int) else series.get("count", 1),
                "lastSeen": _event_time(e) or None,
                "source": str(source.get("component") or e.get("reportingComponent") or "")[:128],
            }
        )
    return out


class HistoryBusy(Exception):
    """``HISTORY_PER_USER`` of the caller's history answers are asking Prometheus: 503 at once."""


class Denied(Exception):
    """The caller lacks ``perm`` (403)."""

    def __init__(self, caller: Caller, perm: Permission, note: str = "") -> None:
        super().__init__(f'user "{caller.identity.username}" may not {perm.describe()}{note}')
        self.perm = perm


def _unauthenticated(exc: Unauthenticated) -> web.Response:
    challenge = 'Bearer realm="hami"' + (', error="invalid_token"' if exc.invalid else "")
    return web.json_response(
        {"error": str(exc)}, status=401, headers={"WWW-Authenticate": challenge, "Cache-Control": "no-store"}
    )


def openapi_text() -> str:
    return (resources.files("hami.ui") / "openapi.yaml").read_text(encoding="utf-8")


@web.middleware
async def _read_only(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.method not in ALLOWED:
        return web.Response(
            status=405,
            text=f"{request.method} not allowed: this API is read-only (GET, HEAD)\n",
            headers={"Allow": ", ".join(ALLOWED)},
        )
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception:  # noqa: BLE001 - one bad answer must not take the scheduler down
        log.exception("ui: %s %s failed", request.method, request.path)
        return web.json_response(
            {"error": "the answer could not be built; try again"},
            status=503,
            headers={"Cache-Control": "no-store", "Retry-After": "5"},
        )


_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def _loopback_host(host: str | None) -> bool:
    """``Host`` names the loopback interface (``localhost``, ``*.localhost``, 127.0.0.1, [::1],
    with or without a port); an absent one (HTTP/1.0, no browser) counts as loopback."""
    if host is None:
        return True
    host = host.strip().lower()
    if host.startswith("["):
        name = host[1 : host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.rstrip(".")
    return name in _LOOPBACK_NAMES or name.endswith(".localhost")


class UiApi:
    """The routes, over a *source* (ClusterState) and an optional live-usage reader; with an
    ``authorizer`` every ``/api/`` request is authenticated and scoped, without one (``--ui-auth
    none``) everything is shown to whoever connects."""

    def __init__(
        self,
        source: Any,
        scheduler_name: str,
        live: Any = None,
        clock: Callable[[], float] = time.time,
        synced: Callable[[], bool] = lambda: True,
        authorizer: Authorizer | None = None,
        prefix: str = "",
        frame_ancestors: str = "'none'",
        history: hist.History | None = None,
        events: Callable[[str, str], Any] | None = None,
        prometheus: PrometheusHistory | None = None,
    ) -> None:
        self.source, self.scheduler_name, self.live, self.clock, self.synced = (
            source,
            scheduler_name,
            live,
            clock,
            synced,
        )
        self.authorizer = authorizer
        self.prefix = prefix.rstrip("/")
        self.headers = embedding_headers(frame_ancestors)
        self.history = hist.History() if history is None else history
        self.prometheus = prometheus  # --ui-prometheus-url: the history's source when set (the ring: fallback)
        self._pending_cache: dict[tuple, tuple[float, dict]] = {}
        # query -> (built, ledger generation, doc, seconds the build took)
        self._pods_cache: dict[tuple, tuple[float, int | None, dict, float]] = {}
        self._nodes_cache: dict[tuple, tuple[float, int | None, dict, float]] = {}  # the same, of /api/v1/nodes
        self._pending_ns: tuple[float, set[str]] | None = None  # (read, namespaces of pending pods)
        # a pods document's scope.pods_index, by query: (the document it was made of, index)
        self._pods_index: dict[tuple, tuple[dict, scope.PodsIndex]] = {}
        # (read, ledger generation, (namespaces holding devices, of every cached pod), seconds)
        self._ns_sets: tuple[float, int | None, tuple[frozenset[str], frozenset[str]], float] | None = None
        # one pod's explanation, by (uid, resourceVersion), shared by every caller's scope for
        # PENDING_TTL; and the explaining done on the loop in the current PENDING_TTL window, over
        # all answers: [window start, seconds spent] (perf_counter)
        self._explained: dict[tuple[str, str], tuple[float, dict]] = {}
        self._spent = [0.0, 0.0]
        self._answer_items = 0  # pods in the answer being built (the first is always explained)
        if events is None:  # the scheduler's client, as the reviews use it (None: --ui-auth=none in tests)
            kube = getattr(getattr(authorizer, "reviews", None), "kube", None)
            events = None if kube is None else KubeEvents(kube)
        self.events_source = events
        # (namespace, pod) -> (when read, the newest EVENTS_MAX events cut to what the page shows,
        # how many were read, why none)
        self._events_cache: dict[tuple[str, str], tuple[float, list[dict], int, str | None]] = {}
        self._events_asking: dict[tuple[str, str], asyncio.Future] = {}
        self._events_by: dict[tuple[str, str], str] = {}  # a read in flight -> the user who started it
        self._history_by: dict[str, int] = {}  # user -> its history answers asking Prometheus now

    def _readings(self) -> Mapping[str, Any] | None:
        return None if self.live is None else self.live.readings

    # -- who may see what ---------------------------------------------------------------------
    @web.middleware
    async def _security_headers(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """:data:`headers` on every answer, errors (404, 405, ...) included."""
        try:
            resp = await handler(request)
        except web.HTTPException as exc:
            exc.headers.update(self.headers)
            raise
        resp.headers.update(self.headers)
        return resp

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith(self.prefix + "/api/"):
            return await handler(request)
        if self.authorizer is None and not _loopback_host(request.headers.get("Host")):
            # --ui-auth=none answers whoever reaches the loopback port: a web page the operator
            # opens could rebind its own name to 127.0.0.1 and read the answers (its Host header
            # still names the page's site), so only a loopback name is answered
            return web.json_response(
                {
                    "error": f"Host {request.headers.get('Host', '')[:80]!r} is not a loopback name; "
                    "with --ui-auth=none the UI answers only http://localhost, 127.0.0.1 or [::1]"
                },
                status=421,
                headers={"Cache-Control": "no-store"},
            )
        try:
            if self.authorizer is not None:
                request[CALLER] = await self.authorizer.authenticate(request.headers.get("Authorization"))
            return await handler(request)
        except Unauthenticated as exc:
            return _unauthenticated(exc)
        except Denied as exc:
            return web.json_response(
                {"error": str(exc), "missing": exc.perm.doc()}, status=403, headers={"Cache-Control": "no-store"}
            )
        except AccessReviewsBusy as exc:  # one user's flood of reviews: no log line each either
            return web.json_response(
                {"error": f"{exc}; try again"},
                status=503,
                headers={"Cache-Control": "no-store", "Retry-After": "1"},
            )
        except ReviewBusy:  # a flood of new tokens: no log line each (it would be the flood's)
            return web.json_response(
                {"error": "too many sign-ins are being checked at once; try again"},
                status=503,
                headers={"Cache-Control": "no-store", "Retry-After": "1"},
            )
        except ReviewUnavailable as exc:
            log.warning(
                "ui: %s %s: the Kubernetes API server could not review the caller: %s",
                request.method,
                request.path,
                exc,
            )
            return web.json_response(
                {"error": "the Kubernetes API server could not check the token or its permissions; try again"},
                status=503,
                headers={"Cache-Control": "no-store", "Retry-After": "5"},
            )

    def _caller(self, request: web.Request) -> Caller | None:
        return request.get(CALLER) if self.authorizer is not None else None

    async def _require(self, request: web.Request, perm: Permission) -> None:
        caller = self._caller(request)
        if caller is not None and self.authorizer is not None and not await self.authorizer.allowed(caller, perm):
            raise Denied(caller, perm)

    async def _may(self, request: web.Request, perm: Permission) -> bool:
        caller = self._caller(request)
        return caller is None or self.authorizer is None or await self.authorizer.allowed(caller, perm)

    async def _visible(
        self, request: web.Request, resource: str, wanted: str | None, candidates: Callable[[], Iterable[str]]
    ) -> set[str] | None:
        """The namespaces the caller may ``list resource`` in (None = all): ``wanted`` alone when
        the query names one (403 without the permission there), else the candidates where it may;
        403 when it may in none of them."""
        caller = self._caller(request)
        if wanted is not None:
            await self._require(request, Permission("list", resource, wanted))
            return {wanted}
        if caller is None or self.authorizer is None:
            return None
        # the candidates are looked for only once the cluster-scope check said no (a caller
        # with cluster-wide access needs none; found by review, 1 Dec: every request walked
        # every pod in the cache for them first, permission or not)
        visible = await self.authorizer.namespaces(
            caller, "list", resource, lambda: self._known_namespaces(caller, candidates())
        )
        if visible is not None and not visible:
            raise Denied(
                caller,
                Permission("list", resource),
                f" or in any namespace that has {resource} here (ask for one with ?namespace=NAME)",
            )
        return visible

    def _namespace_sets(self) -> tuple[frozenset[str], frozenset[str]]:
        """The namespaces of the pods and claims that hold devices (what ``/pods`` lists, from the
        ledger and the claim cache) and of every pod in the scheduler's cache: two walks over
        every pod (~4 ms at 8000), made for callers without cluster-wide access before their
        answer (a 403 included), so they are kept and reused as the shared documents are
        (:meth:`_reused`: ``PENDING_TTL`` while the ledger holds, else ``LOOP_SHARE`` times as
        long as the walks took). Found by review, 1 Dec: every request made them again."""
        now = self.clock()
        generation = self._generation()
        hit = self._ns_sets
        if hit is not None and self._reused(hit, now, generation):
            return hit[2]
        began = time.perf_counter()
        holders = {a.namespace for a in self.source.ledger.pods()}
        holders.update(ref.split("/", 1)[0] for ref in getattr(self.source, "claims", None) or {})
        cached = {ref.split("/", 1)[0] for ref in getattr(self.source, "pods", {})}
        sets = (frozenset(holders), frozenset(cached))
        self._ns_sets = (now, generation, sets, time.perf_counter() - began)
        return sets

    def _holder_namespaces(self) -> frozenset[str]:
        """The namespaces of the pods and claims that hold devices (what ``/pods`` lists), from the
        ledger and the claim cache, without building an answer (kept: :meth:`_namespace_sets`)."""
        return self._namespace_sets()[0]

    def _known_namespaces(self, caller: Caller, extra: Iterable[str]) -> set[str]:
        """Where to look for a caller without cluster-wide access: the namespaces of the answer,
        of every pod in the scheduler's cache (its own and those holding devices) and, for a
        ServiceAccount, its own namespace (so that a tenant with nothing running yet gets an
        empty answer, not a 403)."""
        out = set(extra)
        out.update(self._namespace_sets()[1])
        parts = caller.identity.username.split(":")
        if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] and parts[2]:
            out.add(parts[2])
        return out

    @staticmethod
    def _query(request: web.Request) -> dict[str, str]:
        twice = [k for k in dict.fromkeys(request.query) if len(request.query.getall(k)) > 1]
        if twice:  # dict() would keep one of them silently
            n = len(request.query.getall(twice[0]))
            raise model.FilterError(f"query parameter {twice[0]!r} given {n} times (give it once)")
        q = dict(request.query)
        ns = q.get("namespace")
        if ns is not None and not NAMESPACE.fullmatch(ns):
            raise model.FilterError(f"query parameter namespace: not a Kubernetes namespace name: {ns[:60]!r}")
        return q

    async def _answer(self, request: web.Request, build: Callable[[dict], Any]) -> web.Response:
        try:
            doc = await build(self._query(request))
        except model.FilterError as exc:
            return web.json_response({"error": str(exc)}, status=400, headers={"Cache-Control": "no-store"})
        doc["cacheSynced"] = self.synced()
        # orjson: the nodes answer at 1000 nodes x 8 GPUs is ~3 MB, ~8x faster to write than with json
        return web.Response(
            body=orjson.dumps(doc), content_type="application/json", headers={"Cache-Control": "no-store"}
        )

    # -- the endpoints ------------------------------------------------------------------------
    async def nodes(self, request: web.Request) -> web.Response:
        async def build(q: dict) -> dict:
            model._check_params(q, ("node", "model", "vendor"))
            _check_node(q)
            await self._require(request, Permission("list", "nodes"))
            doc = self._shared_doc(self._nodes_cache, q, model.nodes_document)
            claimed = {c.split("/", 1)[0] for n in doc["items"] for d in n["devices"] for c in d.get("claims", ())}
            caller = self._caller(request)
            if not claimed or caller is None or self.authorizer is None:
                return dict(doc)  # the shared one is never written (cacheSynced goes on the copy)
            return scope.nodes(doc, await self.authorizer.namespaces(caller, "list", "pods", claimed))

        return await self._answer(request, build)

    async def pods(self, request: web.Request) -> web.Response:
        async def build(q: dict) -> dict:
            model._check_params(q, ("namespace", "node"))
            _check_node(q)
            wanted = q.pop("namespace", None)
            # who may see what first: a caller with no permission costs no document
            visible = await self._visible(request, "pods", wanted, self._holder_namespaces)
            if "node" in q and q["node"] not in self._pods({})[1].nodes:
                # no item is on that node: answered from the shared document, no document built
                # for it (each made-up ?node= value built one; found by review, 1 Dec)
                return scope.pods(model.envelope("PodList", self.clock(), []), visible)
            doc, index = self._pods(q)
            return scope.pods(doc, visible, index)

        return await self._answer(request, build)

    def _pods(self, q: dict) -> tuple[dict, scope.PodsIndex]:
        """The whole cluster's pods document (before any caller's scope), built on the loop in
        time proportional to every pod in the ledger (~40 us each: 0.3 s at 8000) however few
        the caller may see: one is reused for every caller and refresh as :meth:`_shared_doc`
        says; with it its :func:`scope.pods_index`, made once per document, so that cutting a
        caller's scope from it costs that caller's items only."""
        doc = self._shared_doc(self._pods_cache, q, model.pods_document)
        key = tuple(sorted(q.items()))
        hit = self._pods_index.get(key)
        if hit is not None and hit[0] is doc:
            return doc, hit[1]
        index = scope.pods_index(doc)
        for gone in [k for k in self._pods_index if k not in self._pods_cache]:
            del self._pods_index[gone]
        self._pods_index[key] = (doc, index)
        return doc, index

    def _generation(self) -> int | None:
        current = getattr(getattr(self.source, "ledger", None), "generation", None)
        return current() if callable(current) else None

    @staticmethod
    def _reused(hit: tuple[float, int | None, Any, float], now: float, generation: int | None) -> bool:
        """Whether a kept ``(built, ledger generation, value, seconds its build took)`` is still
        given: for ``PENDING_TTL`` while the ledger holds, and whatever changed until it is
        ``LOOP_SHARE`` times as old as its build took."""
        age = now - hit[0]
        return 0 <= age < max(PENDING_TTL if hit[1] == generation else 0.0, LOOP_SHARE * hit[3])

    def _shared_doc(self, cache: dict, q: dict, build: Callable[..., dict]) -> dict:
        """``build``'s document for the query ``q`` (every node's or pod's, before any caller's
        scope: never to be written), reused for ``PENDING_TTL`` seconds while the ledger holds.
        At most ``SHARED_DOCS`` queries are kept: past that the stale ones go, then the filtered
        ones (``?node=`` values a caller makes up), never the unfiltered answer everyone shares.
        While pods are being placed the ledger changes between any two requests: a document is
        then still reused until it is ``LOOP_SHARE`` times as old as its build took (at 8000
        pods, 0.4 s a build: one caller polling without pause held Filter and Bind ~0.3 s each
        time, found by review; a small cluster's answer, a few ms to build, stays fresh)."""
        now = self.clock()
        generation = self._generation()
        key = tuple(sorted(q.items()))
        hit = cache.get(key)
        if hit is not None and self._reused(hit, now, generation):
            return hit[2]
        began = time.perf_counter()
        doc = build(self.source, now, self._readings(), q)
        cost = time.perf_counter() - began
        if len(cache) >= SHARED_DOCS:
            for old in [k for k, v in cache.items() if v[1] != generation or not 0 <= now - v[0] < PENDING_TTL]:
                del cache[old]
        if len(cache) >= SHARED_DOCS:
            for old in [k for k in cache if k]:
                del cache[old]
        cache[key] = (now, generation, doc, cost)
        return doc

    async def pending(self, request: web.Request) -> web.Response:
        async def build(q: dict) -> dict:
            model._check_params(q, ("namespace",))
            visible = await self._visible(request, "pods", q.get("namespace"), self._pending_namespaces)
            doc = self._pending(q, visible)
            if not await self._may(request, Permission("list", "nodes")):
                doc["items"] = scope.pending_items(doc["items"], False)
            return doc

        return await self._answer(request, build)

    def _pending_namespaces(self) -> set[str]:
        """The namespaces of this scheduler's pending pods, read again at most every
        ``PENDING_TTL`` seconds: a walk over every pod (~15 ms at 8000) made before the caller's
        permission is known, which any token the API server accepts could have run each request."""
        now = self.clock()
        hit = self._pending_ns
        if hit is not None and 0 <= now - hit[0] < PENDING_TTL:
            return hit[1]
        found = {
            (p.get("metadata") or {}).get("namespace") or "default"
            for p in model.pending_pods(self.source, self.scheduler_name)
        }
        self._pending_ns = (now, found)
        return found

    def _pending(self, q: dict, visible: set[str] | None) -> dict:
        """Explaining runs the filter over every node: one answer per query and scope is reused
        for ``PENDING_TTL`` seconds, however many pages refresh."""
        key = (tuple(sorted(q.items())), None if visible is None else tuple(sorted(visible)))
        hit = self._pending_cache.get(key)
        now = self.clock()
        if hit is not None and 0 <= now - hit[0] < PENDING_TTL:
            return dict(hit[1])
        began = time.perf_counter()
        if began - self._spent[0] >= PENDING_TTL:
            self._spent[:] = [began, 0.0]
        self._answer_items = 0
        # the budget is _explain's (shared by all answers, charged for explanations made, not for
        # those reused): unbounded here
        doc = model.pending_document(
            self.source, now, self.scheduler_name, q, budget_s=math.inf, only=visible, explain=self._explain
        )
        if len(self._pending_cache) > 64:
            self._pending_cache.clear()
        self._pending_cache[key] = (now, doc)
        return dict(doc)

    def _explain(self, pod: Mapping[str, Any], source: Any, now: float) -> dict | None:
        meta = pod.get("metadata") or {}
        ref = meta.get("uid") or f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
        key = (str(ref), str(meta.get("resourceVersion") or ""))
        hit = self._explained.get(key)
        if hit is not None and 0 <= now - hit[0] < PENDING_TTL:
            self._answer_items += 1
            return hit[1]
        if self._answer_items and self._spent[1] >= model.PENDING_BUDGET_S:
            return None  # the window's budget is spent: the answer stops here (the first pod always is)
        began = time.perf_counter()
        doc = model.explain_doc(pod, source, now)
        self._spent[1] += time.perf_counter() - began
        self._answer_items += 1
        if len(self._explained) >= 4 * model.MAX_PENDING:
            self._explained = {k: v for k, v in self._explained.items() if 0 <= now - v[0] < PENDING_TTL}
        self._explained[key] = (now, doc)
        return doc

    async def quotas(self, request: web.Request) -> web.Response:
        async def build(q: dict) -> dict:
            model._check_params(q, ("namespace",))
            box: dict[str, dict] = {}

            def namespaces() -> set[str]:
                box["doc"] = model.quotas_document(self.source, self.clock(), q)
                return {i["namespace"] for i in box["doc"]["items"]}

            visible = await self._visible(request, "resourcequotas", q.get("namespace"), namespaces)
            doc = box.get("doc") or model.quotas_document(self.source, self.clock(), q)
            return scope.by_namespace(doc, visible)

        return await self._answer(request, build)

    async def events(self, request: web.Request) -> web.Response:
        """A pod's Kubernetes events, newest first, at most ``limit`` (``list events`` in its
        namespace); ``error`` says why there are none when the API server could not be read."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]

        async def build(q: dict) -> dict:
            model._check_params(q, ("limit",))
            if not NAMESPACE.fullmatch(namespace):
                raise model.FilterError(f"path namespace: not a Kubernetes namespace name: {namespace[:60]!r}")
            if not POD_NAME.fullmatch(name):
                raise model.FilterError(f"path name: not a Kubernetes pod name: {name[:60]!r}")
            raw = q.get("limit", str(EVENTS_LIMIT))
            if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= EVENTS_MAX:  # "²".isdigit()
                raise model.FilterError(
                    f"query parameter limit: expected a whole number 1..{EVENTS_MAX}, got {raw[:20]!r}"
                )
            limit = int(raw)
            await self._require(request, Permission("list", "events", namespace))
            caller = self._caller(request)
            newest, total, error = await self._pod_events(namespace, name, None if caller is None else caller.user)
            items = newest[:limit]
            return model.envelope(
                "EventList",
                self.clock(),
                items,
                namespace=namespace,
                name=name,
                total=total,
                truncated=total > len(items),
                error=error,
            )

        try:
            return await self._answer(request, build)
        except EventsBusy as exc:
            return web.json_response(
                {"error": f"{exc}; try again"},
                status=503,
                headers={"Cache-Control": "no-store", "Retry-After": "1"},
            )

    async def _pod_events(
        self, namespace: str, name: str, who: str | None = None
    ) -> tuple[list[dict], int, str | None]:
        """A pod's events and why there are none (None: read), read once for every caller asking
        within ``EVENTS_REUSE_S`` (callers asking meanwhile wait for the same read), at most
        ``EVENTS_IN_FLIGHT`` pods at once and ``EVENTS_PER_USER`` started by the user ``who``
        (None: no sign-in, the first bound only); :class:`EventsBusy` past either."""
        if self.events_source is None:
            return [], 0, "this listener has no Kubernetes client to read events with"
        key = (namespace, name)
        hit = self._events_cache.get(key)
        if hit is not None and 0 <= self.clock() - hit[0] < EVENTS_REUSE_S:
            return hit[1], hit[2], hit[3]
        task = self._events_asking.get(key)
        if task is None:
            if who is not None and sum(1 for w in self._events_by.values() if w == who) >= EVENTS_PER_USER:
                raise EventsBusy(f"the events of {EVENTS_PER_USER} other pod(s) you asked for are being read")
            if len(self._events_asking) >= EVENTS_IN_FLIGHT:
                raise EventsBusy(f"the events of {EVENTS_IN_FLIGHT} other pods are being read")
            task = self._events_asking[key] = asyncio.ensure_future(self._read_events(namespace, name))
            if who is not None:
                self._events_by[key] = who

            def done(_t: asyncio.Future) -> None:
                self._events_asking.pop(key, None)
                self._events_by.pop(key, None)

            task.add_done_callback(done)
        # a caller that leaves does not cancel the read the others wait for
        return await asyncio.shield(task)

    async def _read_events(self, namespace: str, name: str) -> tuple[list[dict], int, str | None]:
        assert self.events_source is not None
        found: list[dict] = []
        error = None
        try:
            found = await self.events_source(namespace, name)
        except EventsUnavailable as exc:
            log.warning("ui: the events of %s/%s could not be read: %s", namespace, name, exc)
            error = f"the Kubernetes API server could not list the events: {exc}"
        # kept cut to what an answer can show (raw events, managedFields and all, held ~0.4 MiB
        # a pod), and only while they may be reused
        now = self.clock()
        for gone in [k for k, v in self._events_cache.items() if not 0 <= now - v[0] < EVENTS_REUSE_S]:
            del self._events_cache[gone]
        if len(self._events_cache) >= 1024:
            self._events_cache.clear()
        newest = event_items(found, EVENTS_MAX)
        self._events_cache[(namespace, name)] = (now, newest, len(found), error)
        return newest, len(found), error

    async def history_answer(self, request: web.Request) -> web.Response:
        async def build(q: dict) -> dict:
            model._check_params(q, ("range", "kind", "namespace", "node", "uuid", "pod"))
            range_, kind = q.get("range", "1h"), q.get("kind", "namespace")
            if range_ not in hist.RANGES:
                raise model.FilterError(
                    f"query parameter range: expected one of {', '.join(hist.RANGES)}, got {range_[:20]!r}"
                )
            if kind not in hist.KINDS:
                raise model.FilterError(
                    f"query parameter kind: expected one of {', '.join(hist.KINDS)}, got {kind[:20]!r}"
                )
            for name in ("namespace", "node", "uuid", "pod"):
                if name in q and name not in HISTORY_FILTERS[kind]:
                    raise model.FilterError(
                        f"query parameter {name}: not a filter of kind={kind} (it takes: "
                        f"{', '.join(HISTORY_FILTERS[kind])})"
                    )
            for name, pattern, what in (
                ("node", POD_NAME, "a Kubernetes node name"),
                ("pod", POD_NAME, "a Kubernetes pod name"),
                ("uuid", PROMQL_SAFE, "a device UUID (letters, digits, '.', '_', ':', '-')"),
            ):
                if name in q and not pattern.fullmatch(q[name]):
                    raise model.FilterError(f"query parameter {name}: not {what}: {q[name][:60]!r}")
            if kind == "gpu":
                await self._require(request, Permission("list", "nodes"))
                visible = None
            else:
                visible = await self._visible(request, "pods", q.get("namespace"), self.history.namespaces)
            if self.prometheus is None:
                return self._history_document(q, range_, kind, visible)
            caller = self._caller(request)
            if caller is None:
                return await self._prometheus_document(q, range_, kind, visible)
            if self._history_by.get(caller.user, 0) >= HISTORY_PER_USER:
                raise HistoryBusy()
            self._history_by[caller.user] = self._history_by.get(caller.user, 0) + 1
            try:
                return await self._prometheus_document(q, range_, kind, visible)
            finally:
                self._history_by[caller.user] -= 1
                if not self._history_by[caller.user]:
                    del self._history_by[caller.user]

        try:
            return await self._answer(request, build)
        except HistoryBusy:
            return web.json_response(
                {"error": f"{HISTORY_PER_USER} of your history answers are being read from Prometheus; try again"},
                status=503,
                headers={"Cache-Control": "no-store", "Retry-After": "1"},
            )

    async def _prometheus_document(self, q: dict, range_: str, kind: str, visible: set[str] | None) -> dict:
        """The history from Prometheus; the ring's, with ``error`` saying why, when it fails."""
        assert self.prometheus is not None
        now = self.clock()
        filters = {k: q[k] for k in ("namespace", "node", "uuid", "pod") if k in q}
        try:
            items, total = await self.prometheus.series(
                kind, range_, now, filters, visible, lambda key: self.history.labels("gpu", key), HISTORY_ITEMS
            )
        except PrometheusError as exc:
            log.warning("ui: history from Prometheus failed, answered from the ring: %s", exc)
            doc = self._history_document(q, range_, kind, visible)
            doc["error"] = f"Prometheus could not answer ({exc}); this answer comes from the scheduler's memory"
            return doc
        except ValueError as exc:  # a value the validation above let through: never sent
            raise model.FilterError(str(exc)) from exc
        return model.envelope(
            "History",
            now,
            items[:HISTORY_ITEMS],
            range=range_,
            step=hist.RANGES[range_],
            source="prometheus",
            interval=hist.RANGES[range_],
            total=total,
            truncated=total > HISTORY_ITEMS,
            error=None,
        )

    def _history_document(self, q: dict, range_: str, kind: str, visible: set[str] | None) -> dict:
        now = self.clock()
        items, total = [], 0
        for s in self.history.series(kind):
            ns = s.labels.get("namespace")
            if (visible is not None and ns not in visible) or not _history_match(s, q):
                continue
            total += 1
            if len(items) < HISTORY_ITEMS:
                items.append({"kind": s.kind, "key": s.key, "labels": s.labels, "points": s.points(range_, now)})
        return model.envelope(
            "History",
            now,
            items,
            range=range_,
            step=hist.RANGES[range_],
            source="memory",
            interval=hist.INTERVAL,
            total=total,
            truncated=total > len(items),
            error=None,
        )

    def sample_history(self) -> None:
        """One sample of every GPU, pod and namespace into :attr:`history`, from the same documents
        ``/api/v1/nodes`` and ``/api/v1/pods`` answer (everything, before any caller's scope)."""
        now = self.clock()
        nodes = model.nodes_document(self.source, now, self._readings(), {})
        pods = model.pods_document(self.source, now, self._readings(), {})
        self.history.record(now, hist.samples(nodes, pods))

    async def run_history(self, interval: float = hist.INTERVAL) -> None:
        """Sample every ``interval`` seconds, from the first full cache on; a failed sample is
        logged and the next one tries again."""
        while True:
            if self.synced():
                try:
                    self.sample_history()
                except Exception:  # noqa: BLE001 - the history must not stop the scheduler
                    log.exception("ui: a history sample failed")
            await asyncio.sleep(interval)

    async def openapi(self, request: web.Request) -> web.Response:
        try:
            model._check_params(self._query(request), ())
        except model.FilterError as exc:
            return web.json_response({"error": str(exc)}, status=400, headers={"Cache-Control": "no-store"})
        return web.Response(text=openapi_text(), content_type="application/yaml")

    async def index(self, request: web.Request) -> web.Response:
        return web.Response(text=page.served_page(), content_type="text/html", headers={"Cache-Control": "no-cache"})

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC or (name in (page.CHART_JS, page.CHART_CSS) and not page.chart_library()):
            raise web.HTTPNotFound(text=f"no asset {name!r}\n")
        text = page.app_js() if name == "app.js" else page.asset(name)
        return web.Response(text=text, content_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def to_prefix(self, request: web.Request) -> web.Response:
        # the page's URLs are relative to its own: /hami must become /hami/
        raise web.HTTPFound(self.prefix + "/")

    def app(self) -> web.Application:
        app = application(self._security_headers, _read_only, self._authenticate, max_body=1024)
        p = self.prefix
        routes = [
            web.get(p + "/", self.index),
            web.get(p + "/static/{name}", self.static),
            web.get("/healthz", self.healthz),
            web.get(p + "/api/v1/nodes", self.nodes),
            web.get(p + "/api/v1/pods", self.pods),
            web.get(p + "/api/v1/pending", self.pending),
            web.get(p + "/api/v1/quotas", self.quotas),
            web.get(p + "/api/v1/history", self.history_answer),
            web.get(p + "/api/v1/pods/{namespace}/{name}/events", self.events),
            web.get(p + "/api/v1/openapi.yaml", self.openapi),
        ]
        if p:
            routes += [web.get(p, self.to_prefix), web.get(p + "/healthz", self.healthz)]
        app.add_routes(routes)
        return app


def _check_node(q: Mapping[str, str]) -> None:
    """``node`` must be a node name (as /history checks it): ``Gpu_1``, an empty value or a typo
    of that kind answered an empty list, as if the node had nothing."""
    if "node" in q and not POD_NAME.fullmatch(q["node"]):
        raise model.FilterError(f"query parameter node: not a Kubernetes node name: {q['node'][:60]!r}")


def _history_match(series: hist.Series, q: Mapping[str, str]) -> bool:
    """Whether a series passes the query's filters (those its kind takes, checked before)."""
    labels = series.labels
    return (
        q.get("namespace", labels.get("namespace")) == labels.get("namespace")
        and q.get("node", labels.get("node")) == labels.get("node")
        and q.get("uuid", series.key) == series.key
        and q.get("pod", series.key.split("/", 1)[-1]) == series.key.split("/", 1)[-1]
    )


def embedding_headers(frame_ancestors: str = "'none'") -> dict[str, str]:
    """:data:`hami.serve.SECURITY_HEADERS` with the CSP's ``frame-ancestors`` set to
    ``frame_ancestors`` (already validated: one directive's sources, no ``;``); without
    ``X-Frame-Options`` unless it is ``'none'``."""
    headers = dict(SECURITY_HEADERS)
    if frame_ancestors == "'none'":
        return headers
    csp = headers["Content-Security-Policy"]
    if any(c in ";,\r\n" for c in frame_ancestors):  # would end the directive: never written
        raise ValueError(f"frame-ancestors: {frame_ancestors[:80]!r} holds ';', ',' or a line break")
    headers["Content-Security-Policy"] = csp.replace("frame-ancestors 'none'", f"frame-ancestors {frame_ancestors}")
    del headers["X-Frame-Options"]
    return headers


async def serve_ui(
    api: UiApi, host: str, port: int, guard: ConnectionGuard | None = None, ssl_context: ssl.SSLContext | None = None
) -> web.AppRunner:
    return await start(api.app(), host, port, guard=guard, backlog=128, ssl_context=ssl_context)
