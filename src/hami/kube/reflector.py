"""List+watch of one resource into a handler, resumed after drops and relisted on expiry.

``Reflector(kube, "/api/v1/pods", handler).run()`` lists, calls ``handler.replace(items, rv)``,
then watches from the list's resourceVersion and calls ``handler.apply(type, obj)`` for each
ADDED/MODIFIED/DELETED event. A dropped connection resumes the watch from the last version
seen (bookmarks included); a "410 Gone" (the version was compacted away) triggers a fresh
list, so the handler is always level-triggered: after ``replace`` it holds exactly what the
API server holds. ``synced`` is set after the first successful list.

Which list: the first one, and one :meth:`Reflector.relist` asks for, is a consistent read (no
``resourceVersion``: what etcd holds now; paged by ``limit``). A relist after the watch expired,
after a handler failure or an event that could not be read asks for data *not older than* the
last version the handler took (``resourceVersion=<it>&resourceVersionMatch=NotOlderThan``, no
``limit``), which the API server answers from its watch cache: a consistent or paged list is read
from etcd (before Kubernetes v1.31, and paged on later ones too: a scan of the resource's keys), and every node
agent relisting so within a second of an API server restart (all their watches expire at once)
was that many full scans (found by review, 1 Dec). Such a list is never older than anything the
handler has applied (the list contains every change up to at least that version, and the next
watch goes on from the list's own version), so nothing the handler holds is undone by it, and the
scheduler's ledger cannot lose a placement it had seen (a double booking). The API server
answering it 410 or "too large" (its store went back, an etcd restore) makes the next list a
consistent one again. An immediate relist waits a random moment (up to
:data:`RELIST_JITTER_S`) first, so that agents expiring together do not list together.

An *optional* resource (``optional="what is lost without it"``, e.g. ``resource.k8s.io/v1``
ResourceClaims on a cluster older than v1.34) may be absent: a list answered 404 (the API is not
served) or 403 (this identity may not read it) logs one warning naming the resource and what is
lost, hands the handler an empty list, sets ``synced`` (readiness does not wait for it) and lists
again every ``absent_retry`` seconds, quietly, until the API server serves it.

``await reflector.relist()`` returns once a list begun after the call has reached the handler:
the watch in progress is dropped for it and the next one starts from that list. ``synced`` says
a list was applied once, not that the watch is current (one held by a proxy stays quiet until
``watch_idle``): a caller about to act on what the cache lacks (a newly elected scheduler
leader) asks for a relist.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from typing import Any, Protocol

import aiohttp

from .client import KubeClient, KubeError, loads

log = logging.getLogger(__name__)


class Handler(Protocol):
    def replace(self, items: list[dict], resource_version: str | None = None) -> None:
        """Hold exactly ``items``: the list as of ``resource_version`` (its metadata's; None when
        there is none, e.g. an optional resource found absent). An object the handler holds at a
        later version than that was written after the list's snapshot: the watch from that
        version delivers what becomes of it, so a handler may keep it."""

    def apply(self, event_type: str, obj: dict) -> None: ...


#: the cause an API server gives a request for a resourceVersion newer than its store has
TOO_LARGE_CAUSE = "ResourceVersionTooLarge"


def too_large(exc: KubeError) -> bool:
    """``exc`` is the API server saying the resourceVersion asked for is ahead of its store (HTTP
    504, or an ERROR event with code 504, with the cause ``ResourceVersionTooLarge``)."""
    if exc.status != 504:
        return False
    try:
        body = json.loads(exc.body)
    except ValueError:
        return False
    details = body.get("details") if isinstance(body, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    # (any other shape, a proxy's own 504 say, is not this: the watch is resumed as before)
    return isinstance(causes, list) and any(isinstance(c, dict) and c.get("reason") == TOO_LARGE_CAUSE for c in causes)


class Expired(Exception):
    """The watch's resourceVersion is too old (HTTP/event 410): relist."""


class HandlerFailed(Exception):
    """The handler raised on what the API server sent (a bug): relist, never resume past it."""


class Undecodable(Exception):
    """A watch line that is not a JSON event: relist, never resume past it (resumed from the
    version before it, the watch sent the same line again, for ever, the cache stale: found by
    review, 1 Dec)."""


class Absent(Exception):
    """An optional resource the API server does not serve (404) or lets us read (403)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


#: a watch that delivers no event and ends sooner than this (the API server closing it at once)
#: counts as a failure: the next one waits the backoff, so a server that ends every watch cannot
#: spin the loop (client-go does the same).
SHORT_WATCH_S = 1.0
#: while a watch keeps failing (the API server down), one warning per this many seconds
FAILING_REPORT_S = 60.0

#: a watch that has said nothing this long is opened again from the last version it delivered. The
#: API server sends a watch that allows bookmarks one about every minute even when nothing changes,
#: so only a dead connection (one the network black-holed never closes) stays this quiet; without
#: it the cache would stay stale until the watch's own time-out, minutes later.
WATCH_IDLE_S = 150.0

#: the longest random wait before a relist that would otherwise start at once (a watch that worked
#: and expired): after an API server restart every agent's watch expires in the same second
RELIST_JITTER_S = 0.5


class Reflector:
    def __init__(
        self,
        kube: KubeClient,
        path: str,
        handler: Handler,
        *,
        name: str = "",
        label_selector: str = "",
        field_selector: str = "",
        watch_timeout: int = 300,
        watch_idle: float = WATCH_IDLE_S,
        resume_from: str | None = None,
        page_size: int = 2000,
        optional: str = "",
        absent_retry: float = 60.0,
    ) -> None:
        self.optional = optional
        self.absent_retry = absent_retry
        self.absent: int | None = None  # the status (404/403) while an optional resource is absent
        self.kube = kube
        self.path = path
        self.handler = handler
        self.name = name or path
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.watch_idle = watch_idle
        self.page_size = page_size
        self.synced = asyncio.Event()
        self.resource_version: str | None = resume_from
        self.relists = 0  # how many times the list ran (1 + one per expiry/error)
        self.events = 0  # events (bookmarks included) the watches delivered and the handler took
        self._failing, self._reported = 0, 0.0  # failures in a row (the API server down), last warned of
        self._lists_begun = 0  # lists started (each numbered by this count when it starts)
        self._lists_applied = 0  # the number of the last list that reached the handler
        self._relist_to = 0  # relist(): a list numbered this or later is owed
        self._relist_asked = asyncio.Event()  # relist() was called: the watch in progress stops
        self._list_applied = asyncio.Event()  # set (and replaced) whenever a list reached the handler
        #: the next list may be answered from the API server's watch cache, not older than this
        #: version (the last one the handler took); None: a consistent list (see the module's doc)
        self.relist_from: str | None = None

    def _query(self, **extra: Any) -> list[tuple[str, Any]]:
        q = [(k, v) for k, v in extra.items() if v not in (None, "")]
        if self.label_selector:
            q.append(("labelSelector", self.label_selector))
        if self.field_selector:
            q.append(("fieldSelector", self.field_selector))
        return q

    async def relist(self) -> None:
        """Return once a list begun after this call has reached the handler (a list already under
        way may have read the API server before the caller's reason to ask): the watch in
        progress stops at once for it. Waits as long as that takes (the API server away: every
        backoff); a caller bounds it."""
        need = self._lists_begun + 1
        self._relist_to = max(self._relist_to, need)
        self._relist_asked.set()
        while self._lists_applied < need:
            await self._list_applied.wait()

    def _list_owed(self) -> bool:
        """A :meth:`relist` waits for a list not applied yet. Owed until one is applied, not
        merely begun: one that failed (a 429, a 5xx, a timeout) while a watch version was kept
        let the watch resume from that version, and the caller waited for good (found by review,
        1 Dec: a new leader's catch-up hung for its whole term, Filter and Bind "not ready")."""
        return self._lists_applied < self._relist_to

    def _applied(self, number: int) -> None:
        self._lists_applied = max(self._lists_applied, number)
        self._list_applied.set()
        self._list_applied = asyncio.Event()

    def _list_query(self, since: str | None, cont: str | None) -> list[tuple[str, Any]]:
        """The query of a list's page. ``since`` None: a consistent list, paged. Else the whole
        list at once, not older than ``since``: the API server answers it from its watch cache,
        which every version does for such a list without ``limit`` (older ones read a list with
        a ``limit`` and a version from etcd). A next page (``cont``) carries no version: its token
        has it."""
        if cont or since is None:
            return self._query(limit=self.page_size, **{"continue": cont})
        return self._query(resourceVersion=since, resourceVersionMatch="NotOlderThan")

    async def list(self, since: str | None = None) -> str:
        """List into the handler; returns the list's version. ``since``: not older than this
        version, from the API server's watch cache (None: what etcd holds now)."""
        items: list[dict] = []
        cont = None
        self._lists_begun += 1
        number = self._lists_begun
        while True:
            try:
                page = await self.kube.request("GET", self.path, self._list_query(since, cont))
            except KubeError as exc:
                if self.optional and exc.status in (403, 404):
                    raise Absent(exc.status, str(exc)) from None
                raise
            items.extend(page.get("items") or ())
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                break
        self.relists += 1
        rv = (page.get("metadata") or {}).get("resourceVersion") or "0"
        try:
            self.handler.replace(items, rv)
        except Exception as exc:  # noqa: BLE001 - a bug, not the network: relist after the backoff
            raise HandlerFailed(f"{self.name}: handler failed on a list: {exc!r}") from exc
        self.synced.set()
        self._applied(number)
        self._recovered()
        if self.absent is not None:
            log.info("%s: the API server serves it now", self.name)
            self.absent = None
        return rv

    async def watch(self, rv: str) -> str:
        """Watch from ``rv`` until the server closes the stream; returns the last version seen
        (kept in :attr:`resource_version` as each event arrives, so a watch that fails part-way
        is resumed from there)."""
        self.resource_version = rv
        query = self._query(
            watch="true", resourceVersion=rv, allowWatchBookmarks="true", timeoutSeconds=self.watch_timeout
        )
        resp = await self.kube.open("GET", self.path, query, timeout=self.watch_timeout + 30, idle=self.watch_idle)
        try:
            if resp.status == 410:
                raise Expired(f"{self.name}: HTTP 410")
            if resp.status != 200:
                raise KubeError("WATCH", self.path, resp.status, (await resp.read()).decode(errors="replace"))
            # not "works again" on opening: a watch that opens and then breaks at once (a proxy
            # cutting streams) would log that line and a warning on every try; it has worked
            # when something arrives on it, or it lasted (:meth:`run`)
            async for line in resp.content:
                if not line.strip():
                    continue
                try:
                    event = loads(line)
                except ValueError as exc:
                    raise Undecodable(f"{self.name}: a watch event is not JSON ({exc}): {line[:120]!r}") from None
                if not isinstance(event, dict):
                    raise Undecodable(f"{self.name}: a watch event is not a JSON object: {line[:120]!r}")
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired(f"{self.name}: {obj.get('message')}")
                    raise KubeError("WATCH", self.path, obj.get("code") or 0, json.dumps(obj))
                if self._failing:  # (not on an ERROR event: that is the failure, not the watch working)
                    self._recovered()
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if kind != "BOOKMARK":
                    try:
                        self.handler.apply(kind, obj)
                    except Exception as exc:  # noqa: BLE001 - see HandlerFailed
                        raise HandlerFailed(f"{self.name}: handler failed on a {kind} event: {exc!r}") from exc
                self.events += 1  # (one its handler took: a failing one does not make the watch healthy)
                self.resource_version = rv
        finally:
            resp.release()
        return rv

    async def _watch_unless_relisted(self, rv: str) -> str | None:
        """:meth:`watch` from ``rv``, or None as soon as :meth:`relist` asks for a list."""
        self._relist_asked.clear()
        if self._list_owed():
            return None
        watch = asyncio.ensure_future(self.watch(rv))
        asked = asyncio.ensure_future(self._relist_asked.wait())
        try:
            await asyncio.wait({watch, asked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            asked.cancel()
            if not watch.done():
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
        if watch.cancelled():
            return None
        return watch.result()

    def _recovered(self) -> None:
        """A list answered, or a watch delivered an event or lasted: say so if it had been failing."""
        if self._failing:
            n = self._failing
            log.info("watch %s works again after %d failure%s in a row", self.name, n, "s"[: n - 1])
        self._failing = 0

    def _found_absent(self, exc: Absent) -> None:
        """An optional resource found absent: the handler holds none of it, and readiness does not wait."""
        if self.absent != exc.status:
            why = "is not served by the API server" if exc.status == 404 else "may not be read by this identity"
            log.warning(
                "%s %s (HTTP %d): %s; listing again every %gs",
                self.name,
                why,
                exc.status,
                self.optional,
                self.absent_retry,
            )
        self.absent = exc.status
        self.handler.replace([], None)
        self.synced.set()
        self._applied(self._lists_begun)  # (the list that found it absent)

    def _failed(self, exc: Exception, rv: str | None, backoff: float) -> str | None:
        """A list or watch that failed (the API server's answer, the network): logged at the pace of
        :data:`FAILING_REPORT_S`; returns the version to go on from (None: list)."""
        if self.optional and isinstance(exc, KubeError) and exc.status in (403, 404):
            rv = None  # gone (an upgrade, RBAC taken away): the list says so, as Absent
        elif isinstance(exc, KubeError) and too_large(exc):
            # the version is ahead of the API server's store: it went back (an etcd restore);
            # resumed from it, the watch failed again and again, or waited and then skipped every
            # change in between. Relisted (consistently: a list not older than that version would
            # fail the same way), as client-go does
            rv, self.relist_from = None, None
        elif isinstance(exc, KubeError) and exc.status == 410:
            rv, self.relist_from = None, None  # a list from the watch cache refused: a consistent one
        elif rv is not None and self.resource_version is not None:
            rv = self.resource_version  # a watch resumes from the last event it delivered
        self._failing += 1
        why = str(exc) or type(exc).__name__
        if self._failing == 1 or time.monotonic() - self._reported >= FAILING_REPORT_S:
            # once, then once a minute: an outage is not a line per watch every 5 s
            self._reported = time.monotonic()
            again = f" ({self._failing} times in a row)" if self._failing > 1 else ""
            log.warning("watch %s failed%s: %s; retrying in %.1fs", self.name, again, why, backoff)
        else:
            log.debug("watch %s failed: %s; retrying in %.1fs", self.name, why, backoff)
        return rv

    async def run(self) -> None:
        """List and watch until cancelled. Every failure waits the backoff (0.2 s doubling to
        5 s, with jitter) before the next request: an expired version (relist), a failed or
        refused watch (resumed from the last version delivered), a handler that raised (relist:
        the event it failed on is never skipped over), a watch ended at once with no event. A
        watch that delivered an event, or lasted :data:`SHORT_WATCH_S`, resets it, however it
        ended; one that delivered events and then expired relists at once (after a random wait of
        up to :data:`RELIST_JITTER_S`)."""
        backoff = 0.2
        rv = self.resource_version
        while True:
            started, seen = time.monotonic(), self.events
            try:
                if rv is None or self._list_owed():
                    # (a relist() asked for: what the API server holds now, not its cache's)
                    since = None if self._list_owed() else self.relist_from
                    rv = await self.list(since)
                    self.relist_from = None
                    started = time.monotonic()
                watched = await self._watch_unless_relisted(rv)
                if watched is None:  # relist() asked: listed at once, the watch resumes from it
                    log.info("watch %s: relisting on request", self.name)
                    rv, backoff = None, 0.2
                    continue
                rv = watched
                if self.events > seen or time.monotonic() - started >= SHORT_WATCH_S:
                    backoff = 0.2
                    self._recovered()
                    continue
                log.debug("watch %s ended at once with no event; again in %.1fs", self.name, backoff)
            except Expired as exc:
                if self.events > seen:  # a working watch that expired: relist at once (but for the jitter)
                    backoff = 0.0
                log.info("watch %s expired (%s); relisting in %.1fs", self.name, exc, backoff)
                rv, self.relist_from = None, self.resource_version
            except Absent as exc:
                self._found_absent(exc)
                rv = None
                await asyncio.sleep(self.absent_retry)
                continue
            except asyncio.CancelledError:
                raise
            except HandlerFailed:
                # a consistent list: the handler may have taken the failed event's version as seen
                # (the scheduler's pod cache does), and a list older than it reads as the store
                # gone back, which drops every reservation not in it (the regression review, 1 Dec)
                log.exception("watch %s: handler failed; relisting in %.1fs", self.name, backoff)
                rv, self.relist_from = None, None
            except Undecodable as exc:
                log.warning("watch %s: %s; relisting in %.1fs", self.name, exc, backoff)
                rv, self.relist_from = None, self.resource_version
            except (KubeError, aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                rv = self._failed(exc, rv, backoff)
            except Exception:  # noqa: BLE001 - a bug here must not freeze the cache silently
                log.exception("watch %s failed; relisting in %.1fs", self.name, backoff)
                rv, self.relist_from = None, None
            if backoff:
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
            elif rv is None:  # a relist at once: not in the same instant as every other agent's
                await asyncio.sleep(random.uniform(0, RELIST_JITTER_S))
            if self.events > seen:  # it delivered events before failing: it was healthy
                backoff = 0.2
            else:
                backoff = min(max(backoff, 0.1) * 2, 5.0)
