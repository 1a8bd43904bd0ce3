"""The nodes and pods documents are built once for every caller (on the scheduler's loop, in
time proportional to the cluster) and a caller's made-up ``?node=`` values cannot push the one
everybody shares out of the cache."""

from __future__ import annotations

from hami.ui import model as ui_model
from hami.ui.server import PENDING_TTL, SHARED_DOCS

from .test_ui_api import NOW, gpu_pod, placed
from .test_ui_auth import ADMIN, FakeReviews, _api, _client, bearer, shared  # noqa: F401 - the fixture


def _counting(monkeypatch, name: str) -> list:
    built: list = []
    real = getattr(ui_model, name)
    monkeypatch.setattr(ui_model, name, lambda *a, **k: built.append(a[-1]) or real(*a, **k))
    return built


async def test_node_refreshes_share_one_nodes_document(shared, monkeypatch):  # noqa: F811
    built = _counting(monkeypatch, "nodes_document")
    now = [NOW]
    api = _api(shared, FakeReviews())
    api.clock = lambda: now[0]
    client = await _client(api)
    try:
        for _ in range(20):  # twenty pages refreshing: twenty builds of every node before
            resp = await client.get("/api/v1/nodes", headers=bearer(ADMIN))
            doc = await resp.json()
            assert resp.status == 200 and [n["name"] for n in doc["items"]] == ["gpu-o", "gpu-s"]
            assert doc["cacheSynced"] is True
        assert len(built) == 1
        assert "cacheSynced" not in api._nodes_cache[()][2]  # the shared document is never written
        # a pod placed changes the ledger: its allocation shows at once
        placed(shared, gpu_pod("second", ns="team-a", mem=500, cores=5), "gpu-o")
        doc = await (await client.get("/api/v1/nodes", headers=bearer(ADMIN))).json()
        gpu_o = next(n for n in doc["items"] if n["name"] == "gpu-o")
        assert sum(d["memoryMiB"]["allocated"] for d in gpu_o["devices"]) == 1500 and len(built) == 2
        now[0] += PENDING_TTL  # an unchanged ledger is read again after the window (live usage, readiness)
        assert (await client.get("/api/v1/nodes", headers=bearer(ADMIN))).status == 200
        assert len(built) == 3
    finally:
        await client.close()


async def test_made_up_node_filters_do_not_evict_the_shared_documents(shared, monkeypatch):  # noqa: F811
    nodes, pods = _counting(monkeypatch, "nodes_document"), _counting(monkeypatch, "pods_document")
    client = await _client(_api(shared, FakeReviews()))
    try:
        for path in ("nodes", "pods"):
            assert (await client.get(f"/api/v1/{path}", headers=bearer(ADMIN))).status == 200
        for i in range(2 * SHARED_DOCS):  # one caller's script: a new ?node= each time
            for path in ("nodes", "pods"):
                resp = await client.get(f"/api/v1/{path}?node=made-up-{i}", headers=bearer(ADMIN))
                assert resp.status == 200 and (await resp.json())["items"] == []
        # everyone else's refresh still gets the shared answers (before: the cache was wiped at
        # the 64th value and the whole cluster's documents were built again)
        for path in ("nodes", "pods"):
            assert (await client.get(f"/api/v1/{path}", headers=bearer(ADMIN))).status == 200
        assert [q for q in nodes if not q] == [{}] and [q for q in pods if not q] == [{}]
    finally:
        await client.close()
