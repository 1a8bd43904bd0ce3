"""One user's history answers cannot hold every Prometheus slot: made-up ``?uuid=`` values each
started new queries and took all four slots, so every other caller waited up to 10 s and got
the ring's answer with an error."""

from __future__ import annotations

import asyncio

import pytest

from aiohttp import web

from hami.ui import prometheus as P
from hami.ui.server import HISTORY_PER_USER

from .test_ui_auth import ADMIN, TENANT, _client, shared  # noqa: F401 - the fixture
from .test_ui_prometheus import FakePrometheus, _close, _setup, bearer


class SlowForMadeUp(FakePrometheus):
    """Queries naming a made-up GPU (``GPU-made-up-*``) hang until ``hang`` is set."""

    held = 0

    async def _maybe_hang(self, request: web.Request) -> None:
        if "GPU-made-up" in str((await request.post()).get("query", "")):
            self.held += 1
            await self.hang.wait()

    async def query(self, request: web.Request) -> web.Response:
        await self._maybe_hang(request)
        return await super().query(request)

    async def query_range(self, request: web.Request) -> web.Response:
        await self._maybe_hang(request)
        return await super().query_range(request)


async def test_one_users_slow_history_answers_leave_prometheus_slots_for_the_others(shared):  # noqa: F811
    prom = SlowForMadeUp()
    api, server = await _setup(shared, prom)
    client = await _client(api)
    try:
        assert P.CONCURRENT > HISTORY_PER_USER
        mine = [
            asyncio.ensure_future(client.get(f"/api/v1/history?kind=gpu&uuid=GPU-made-up-{i}", headers=bearer(ADMIN)))
            for i in range(P.CONCURRENT)
        ]
        for _ in range(6000):  # the first ones are asking Prometheus (bounded: a hang is a failure)
            if prom.held >= HISTORY_PER_USER:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail(f"{prom.held} of {HISTORY_PER_USER} history answers reached Prometheus")
        refused = [await t for t in mine[HISTORY_PER_USER:]]
        assert {r.status for r in refused} == {503} and {r.headers["Retry-After"] for r in refused} == {"1"}
        # the tenant's answer still comes from Prometheus (before: no slot within 10 s, the ring's)
        resp = await client.get("/api/v1/history?kind=namespace", headers=bearer(TENANT))
        doc = await resp.json()
        assert resp.status == 200 and doc["source"] == "prometheus" and doc["error"] is None
        prom.hang.set()
        assert [(await t).status for t in mine[:HISTORY_PER_USER]] == [200] * HISTORY_PER_USER
        assert api._history_by == {}
        # done, the user may ask again
        resp = await client.get("/api/v1/history?kind=gpu&uuid=GPU-made-up-9", headers=bearer(ADMIN))
        assert resp.status == 200
    finally:
        await _close(prom, server, client)
