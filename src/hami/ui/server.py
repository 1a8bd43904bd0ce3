"""The UI listener of ``hami scheduler`` (``--ui-bind``): the ``/api/v1`` API, its OpenAPI
document and the page. Read-only.

Who may call it: whoever reaches the listener (plain HTTP, no authentication): the flag is off
by default, the chart exposes it only when ``scheduler.ui.enabled`` and then as a ClusterIP
Service (docs/security.md, "The web UI"). So it serves nothing that is not already readable
by anyone who may ``get`` pods and nodes: no Secret, token, environment variable or
annotation value is copied into its answers, only the ledger's allocations and the
scheduler's own verdicts.

- ``GET``/``HEAD`` only: any other method is 405 (with ``Allow: GET, HEAD``), on every path.
- A query parameter an endpoint does not take, or one given twice, is 400 naming it; an unknown
  path is 404.
- Strict headers on every answer (:data:`hami.serve.SECURITY_HEADERS`): a Content-Security-Policy
  that allows the page's own assets only (no inline script, no other origin), ``nosniff``, no
  framing, no referrer; no caching of API answers.
- The listener's connection cap, deadlines and header limits are :func:`hami.serve.start`'s.
- An unexpected failure while building an answer is logged and answered 503 with one line
  (the scheduler keeps running; the next refresh tries again).
"""

from __future__ import annotations

import logging
import time
from importlib import resources
from typing import Any, Callable, Mapping

import orjson
from aiohttp import web

from hami.serve import ConnectionGuard, application, security_headers, start

from . import model, page

log = logging.getLogger(__name__)
ALLOWED = ("GET", "HEAD")
STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
PENDING_TTL = 2.0  # s an /api/v1/pending answer is reused


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
        return web.Response(status=503, text="the answer could not be built; try again\n")


class UiApi:
    """The routes, over a *source* (ClusterState) and an optional live-usage reader."""

    def __init__(
        self,
        source: Any,
        scheduler_name: str,
        live: Any = None,
        clock: Callable[[], float] = time.time,
        synced: Callable[[], bool] = lambda: True,
    ) -> None:
        self.source, self.scheduler_name, self.live, self.clock, self.synced = (
            source,
            scheduler_name,
            live,
            clock,
            synced,
        )
        self._pending_cache: dict[tuple, tuple[float, dict]] = {}

    def _readings(self) -> Mapping[str, Any] | None:
        return None if self.live is None else self.live.readings

    def _answer(self, build: Callable[[dict], dict], request: web.Request) -> web.Response:
        twice = [k for k in dict.fromkeys(request.query) if len(request.query.getall(k)) > 1]
        if twice:  # dict() would keep one of them silently
            n = len(request.query.getall(twice[0]))
            return web.json_response(
                {"error": f"query parameter {twice[0]!r} given {n} times (give it once)"}, status=400
            )
        try:
            doc = build(dict(request.query))
        except model.FilterError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        doc["cacheSynced"] = self.synced()
        # orjson: the nodes answer at 1000 nodes x 8 GPUs is ~3 MB, ~8x faster to write than with json
        return web.Response(
            body=orjson.dumps(doc), content_type="application/json", headers={"Cache-Control": "no-store"}
        )

    async def nodes(self, request: web.Request) -> web.Response:
        return self._answer(lambda q: model.nodes_document(self.source, self.clock(), self._readings(), q), request)

    async def pods(self, request: web.Request) -> web.Response:
        return self._answer(lambda q: model.pods_document(self.source, self.clock(), self._readings(), q), request)

    async def pending(self, request: web.Request) -> web.Response:
        return self._answer(self._pending, request)

    def _pending(self, q: dict) -> dict:
        """Explaining runs the filter over every node: one answer per query is reused for
        ``PENDING_TTL`` seconds, however many pages refresh."""
        key = tuple(sorted(q.items()))
        hit = self._pending_cache.get(key)
        now = self.clock()
        if hit is not None and 0 <= now - hit[0] < PENDING_TTL:
            return dict(hit[1])
        doc = model.pending_document(self.source, now, self.scheduler_name, q)
        if len(self._pending_cache) > 64:
            self._pending_cache.clear()
        self._pending_cache[key] = (now, doc)
        return dict(doc)

    async def quotas(self, request: web.Request) -> web.Response:
        return self._answer(lambda q: model.quotas_document(self.source, self.clock(), q), request)

    async def openapi(self, request: web.Request) -> web.Response:
        return web.Response(text=openapi_text(), content_type="application/yaml")

    async def index(self, request: web.Request) -> web.Response:
        return web.Response(text=page.served_page(), content_type="text/html", headers={"Cache-Control": "no-cache"})

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound(text=f"no asset {name!r}\n")
        return web.Response(text=page.asset(name), content_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    def app(self) -> web.Application:
        app = application(security_headers, _read_only, max_body=1024)
        app.add_routes(
            [
                web.get("/", self.index),
                web.get("/static/{name}", self.static),
                web.get("/healthz", self.healthz),
                web.get("/api/v1/nodes", self.nodes),
                web.get("/api/v1/pods", self.pods),
                web.get("/api/v1/pending", self.pending),
                web.get("/api/v1/quotas", self.quotas),
                web.get("/api/v1/openapi.yaml", self.openapi),
            ]
        )
        return app


async def serve_ui(api: UiApi, host: str, port: int, guard: ConnectionGuard | None = None) -> web.AppRunner:
    return await start(api.app(), host, port, guard=guard, backlog=128)
