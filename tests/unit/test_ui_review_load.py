"""From the UI review: what one tenant's requests cost everyone else. The whole cluster's pods
document is built once per 2 s for every caller (not once per request on the scheduler's loop),
and a pod's events are read at most two at a time over the UI's shared API connections (the
sign-ins of everyone else use the same four)."""

from __future__ import annotations

import asyncio

from hami.ui import model as ui_model
from hami.ui.server import LOOP_SHARE, PENDING_TTL, UiApi

from .test_ui_api import NOW, gpu_pod, placed
from .test_ui_auth import TENANT, FakeReviews, _api, _client, bearer, shared  # noqa: F401 - the fixture


async def test_tenant_refreshes_share_one_pods_document(shared, monkeypatch):  # noqa: F811
    built = []
    real = ui_model.pods_document
    monkeypatch.setattr(ui_model, "pods_document", lambda *a, **k: built.append(1) or real(*a, **k))
    now = [NOW]
    api = _api(shared, FakeReviews())
    api.clock = lambda: now[0]
    client = await _client(api)
    try:
        for _ in range(20):  # a tenant (or twenty tenants) refreshing: O(cluster) work each time before
            resp = await client.get("/api/v1/pods", headers=bearer(TENANT))
            assert resp.status == 200
            assert [i["name"] for i in (await resp.json())["items"]] == ["mine"]
        assert len(built) == 1
        # a pod placed changes the ledger: it shows once the document is LOOP_SHARE times as old
        # as its build took (a few ms here)
        placed(shared, gpu_pod("second", ns="team-a", mem=500, cores=5), "gpu-o")
        now[0] += LOOP_SHARE * api._pods_cache[()][3] + 1e-6
        names = [i["name"] for i in (await (await client.get("/api/v1/pods", headers=bearer(TENANT))).json())["items"]]
        assert sorted(names) == ["mine", "second"] and len(built) == 2
        now[0] += PENDING_TTL  # and an unchanged ledger is read again after the window
        assert (await client.get("/api/v1/pods", headers=bearer(TENANT))).status == 200
        assert len(built) == 3
    finally:
        await client.close()


class SlowEvents:
    """An API server that holds every events list until released, counting the reads."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.reads: list[tuple[str, str]] = []
        self.most = self.now = 0

    async def __call__(self, namespace: str, name: str) -> list[dict]:
        self.reads.append((namespace, name))
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await self.release.wait()
        finally:
            self.now -= 1
        return [
            {
                "type": "Normal",
                "reason": "Scheduled",
                "message": f"{name} here",
                "lastTimestamp": "2026-01-01T00:00:00Z",
            }
        ]


async def test_event_reads_are_bounded_and_shared(shared):  # noqa: F811
    events = SlowEvents()
    now = [NOW]
    client = await _client(UiApi(shared, "hami-scheduler", clock=lambda: now[0], events=events))
    try:
        # eight pods' events at once (one caller's script, or a page per pod): before, eight reads
        # held the UI's API connections, and the sign-ins of every other caller timed out behind them
        asked = [asyncio.ensure_future(client.get(f"/api/v1/pods/team-a/pod-{i}/events")) for i in range(8)]
        same = [asyncio.ensure_future(client.get("/api/v1/pods/team-a/pod-0/events")) for _ in range(3)]
        while len(events.reads) + sum(t.done() for t in asked) < len(asked):
            await asyncio.sleep(0)
        busy = [t.result() for t in asked if t.done()]
        assert [r.status for r in busy] == [503] * 6
        assert all(r.headers["Retry-After"] == "1" for r in busy)
        assert "try again" in (await busy[0].json())["error"]
        events.release.set()
        answers = [await t for t in [*asked, *same] if not (t.done() and t.result() in busy)]
        assert [r.status for r in answers] == [200] * 5
        assert events.most == 2 and len(events.reads) == 2  # pod-0 asked four times: read once
        # and given again for a moment, however many ask
        for _ in range(5):
            doc = await (await client.get("/api/v1/pods/team-a/pod-0/events")).json()
            assert doc["items"][0]["message"] == "pod-0 here"
        assert len(events.reads) == 2
        now[0] += 2.0
        assert (await client.get("/api/v1/pods/team-a/pod-0/events")).status == 200
        assert len(events.reads) == 3
    finally:
        events.release.set()
        await client.close()


async def test_events_are_kept_cut_and_only_while_they_may_be_reused(shared):  # noqa: F811
    """The raw events (managedFields and all, ~0.4 MiB a pod) stayed until a 1024th pod wiped the
    cache: 200 pods read an hour ago held 88 MiB in the scheduler."""
    events = SlowEvents()
    events.release.set()
    now = [NOW]
    api = UiApi(shared, "hami-scheduler", clock=lambda: now[0], events=events)
    client = await _client(api)
    try:
        for i in range(20):
            assert (await client.get(f"/api/v1/pods/team-a/pod-{i}/events")).status == 200
        assert len(api._events_cache) == 20
        assert all(set(e) == {"type", "reason", "message", "count", "lastSeen", "source"} for e in cached(api))
        now[0] += 3600
        assert (await client.get("/api/v1/pods/team-a/pod-x/events")).status == 200
        assert list(api._events_cache) == [("team-a", "pod-x")]
    finally:
        await client.close()


def cached(api: UiApi) -> list[dict]:
    return [e for entry in api._events_cache.values() for e in entry[1]]
