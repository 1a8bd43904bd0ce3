"""The nodes and pods documents are built once for every caller (on the scheduler's loop, in
time proportional to the cluster) and a caller's made-up ``?node=`` values cannot push the one
everybody shares out of the cache."""

from __future__ import annotations

from hami.ui import model as ui_model
from hami.ui.server import LOOP_SHARE, PENDING_TTL, SHARED_DOCS

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
        # a pod placed changes the ledger: its allocation shows once the document is LOOP_SHARE
        # times as old as its build took (a few ms here)
        placed(shared, gpu_pod("second", ns="team-a", mem=500, cores=5), "gpu-o")
        now[0] += LOOP_SHARE * api._nodes_cache[()][3] + 1e-6
        doc = await (await client.get("/api/v1/nodes", headers=bearer(ADMIN))).json()
        gpu_o = next(n for n in doc["items"] if n["name"] == "gpu-o")
        assert sum(d["memoryMiB"]["allocated"] for d in gpu_o["devices"]) == 1500 and len(built) == 2
        now[0] += PENDING_TTL  # an unchanged ledger is read again after the window (live usage, readiness)
        assert (await client.get("/api/v1/nodes", headers=bearer(ADMIN))).status == 200
        assert len(built) == 3
    finally:
        await client.close()


async def test_a_ledger_changing_all_the_time_does_not_rebuild_the_document_for_every_request(
    shared,  # noqa: F811
    monkeypatch,
):
    """Pods placed between any two requests changed the ledger's generation every time, so each
    request built the whole cluster's document on the scheduler's loop (0.4 s at 8000 pods: one
    tenant polling /api/v1/pods without pause held Filter and Bind ~0.3 s a time; found by
    review). A document is reused until it is LOOP_SHARE times as old as its build took."""
    built = _counting(monkeypatch, "pods_document")
    now = [NOW]
    api = _api(shared, FakeReviews())
    api.clock = lambda: now[0]
    client = await _client(api)
    try:
        assert (await client.get("/api/v1/pods", headers=bearer(ADMIN))).status == 200
        when, generation, doc, _ = api._pods_cache[()]
        api._pods_cache[()] = (when, generation, doc, 0.5)  # as if the build took 0.5 s (8000 pods)
        churn = None
        for i in range(10):  # a pod placed or removed before every request, for LOOP_SHARE x 0.5 s
            seen = shared.ledger.generation()
            if churn is None:
                churn = placed(shared, gpu_pod("churn", ns="team-a", mem=10, cores=1), "gpu-o")
            else:
                shared.pod_handler.apply("DELETED", churn)
                churn = None
            assert shared.ledger.generation() != seen
            now[0] = NOW + i * LOOP_SHARE * 0.5 / 10
            assert (await client.get("/api/v1/pods", headers=bearer(ADMIN))).status == 200
        assert len(built) == 1
        placed(shared, gpu_pod("last", ns="team-a", mem=10, cores=1), "gpu-o")
        now[0] = NOW + LOOP_SHARE * 0.5  # then it is built again, with what changed meanwhile
        names = {p["name"] for p in (await (await client.get("/api/v1/pods", headers=bearer(ADMIN))).json())["items"]}
        assert len(built) == 2 and "last" in names
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


async def test_callers_without_permission_do_not_walk_every_pod_each_request(shared, monkeypatch):  # noqa: F811
    """/api/v1/pending read the namespaces of every pending pod before the caller's permission
    was known (~15 ms at 8000 pods): any token the API server accepts could run it in a loop
    (found by review). Read at most once per PENDING_TTL now."""
    from .test_ui_auth import NOBODY

    walks = _counting(monkeypatch, "pending_pods")
    now = [NOW]
    api = _api(shared, FakeReviews())
    api.clock = lambda: now[0]
    client = await _client(api)
    try:
        for _ in range(10):
            assert (await client.get("/api/v1/pending", headers=bearer(NOBODY))).status == 403
        assert len(walks) == 1
        now[0] += PENDING_TTL
        assert (await client.get("/api/v1/pending", headers=bearer(NOBODY))).status == 403
        assert len(walks) == 2
    finally:
        await client.close()
