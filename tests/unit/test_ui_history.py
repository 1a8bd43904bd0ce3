"""The UI's history (issue 27, item 2): the in-process ring (buckets, means, gaps, the memory
bound), the samples taken from the UI's own documents, and ``/api/v1/history`` (validated against
openapi.yaml, scoped like /pods: a tenant sees its namespace's pods only; GPU series need list
nodes)."""

from __future__ import annotations

import tracemalloc

import pytest

from hami.ui import history as H
from hami.ui.auth import Authorizer
from hami.ui.server import UiApi

from .test_ui_api import NOW, validator_for
from .test_ui_auth import ADMIN, TENANT, FakeReviews, _client
from .test_ui_auth import shared as _shared_state

shared = _shared_state
T0 = (NOW // 3600) * 3600  # the start of an hour: bucket edges are easy to read


def _one(h: H.History, t: float, key: str = "a", mem: float = 1.0, used: float = float("nan")) -> None:
    h.record(t, [("pod", key, {"namespace": "ns", "node": "n"}, (mem, 10.0, used, float("nan")))])


def test_a_bucket_keeps_the_mean_and_an_empty_bucket_is_none():
    h = H.History()
    _one(h, T0 + 1, mem=100, used=10)
    _one(h, T0 + 30, mem=200)  # same minute: memory mean 150; used stays 10 (nan is no sample)
    _one(h, T0 + 125, mem=400, used=40)  # two minutes later: the minute between is empty
    (series,) = h.series("pod")
    p = series.points("1h", T0 + 125)
    assert len(p["t"]) == H.POINTS and p["t"][-1] == T0 + 120 and p["t"][-1] - p["t"][-2] == 60
    assert p["memoryAllocatedMiB"][-3:] == [150.0, None, 400.0]
    assert p["memoryUsedMiB"][-3:] == [10.0, None, 40.0]
    assert p["utilizationPercent"][-1] is None
    assert p["memoryAllocatedMiB"][: H.POINTS - 3] == [None] * (H.POINTS - 3)
    # the 6-minute buckets hold all three samples' mean
    p6 = series.points("6h", T0 + 125)
    assert p6["t"][-1] - p6["t"][-2] == 360 and p6["memoryAllocatedMiB"][-1] == pytest.approx(700 / 3, abs=0.01)


def test_an_old_bucket_is_not_read_as_a_new_one():
    h = H.History()
    _one(h, T0, mem=100)
    _one(h, T0 + 3600, mem=300)  # the same slot of the 1 h ring, one lap later
    (series,) = h.series("pod")
    p = series.points("1h", T0 + 3600)
    assert p["memoryAllocatedMiB"].count(None) == H.POINTS - 1 and p["memoryAllocatedMiB"][-1] == 300
    assert series.points("24h", T0 + 3600)["memoryAllocatedMiB"][-3:].count(None) <= 2


def test_the_ring_is_bounded_in_series_and_bytes():
    h = H.History(max_series=10)
    for t in range(3):
        h.record(T0 + 60 * t, [("pod", f"p{i}", {"namespace": "ns"}, (1.0, 1.0, 1.0, 1.0)) for i in range(25)])
    assert len(h) == 10 and h.refused == 3 * 15
    per_series = len(H.RANGES) * H.POINTS * (4 * len(H.VALUES) + 4 + 2)
    assert per_series == 5280 and h.nbytes() == 10 * per_series
    assert H.MAX_SERIES * H.SERIES_BYTES <= 24 * 1024 * 1024  # the bound docs/ui.md states


def test_one_series_takes_at_most_series_bytes():
    tracemalloc.start()
    try:
        h = H.History(max_series=2000)
        before = tracemalloc.get_traced_memory()[0]
        h.record(
            T0,
            [
                ("gpu", f"GPU-{i:05d}", {"node": f"n{i // 8}", "model": "A10"}, (1.0, 2.0, 3.0, 4.0))
                for i in range(2000)
            ],
        )
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(h) == 2000
    assert grown / 2000 <= H.SERIES_BYTES, grown / 2000


def test_room_is_made_from_the_series_sampled_longest_ago_and_a_week_old_one_is_forgotten():
    h = H.History(max_series=2)
    _one(h, T0, key="gone")
    _one(h, T0 + 60, key="b")
    _one(h, T0 + 120, key="c")  # full: "gone" (last sampled at T0) makes room
    assert [s.key for s in h.series("pod")] == ["b", "c"]
    h.record(T0 + 120 + H.FORGET + 1, [])
    assert len(h) == 0


def test_namespaces_then_pods_then_gpus_are_recorded(shared):
    api = UiApi(shared, "hami-scheduler", clock=lambda: T0, history=H.History(max_series=3))
    api.sample_history()
    assert {s.kind for s in api.history._series.values()} == {"namespace"}  # 4 namespaces: 3 kept
    api = UiApi(shared, "hami-scheduler", clock=lambda: T0, history=H.History(max_series=8))
    api.sample_history()
    assert sorted(k for (k, _) in api.history._series) == ["namespace"] * 4 + ["pod"] * 4  # tenants' first
    assert api.history.refused == 2  # the two GPUs
    api = UiApi(shared, "hami-scheduler", clock=lambda: T0)
    api.sample_history()
    kinds = [k for (k, _) in api.history._series]
    assert kinds.count("namespace") == 4 and kinds.count("gpu") == 2 and kinds.count("pod") == 4
    (ns_a,) = [s for s in api.history.series("namespace") if s.key == "team-a"]
    assert ns_a.points("1h", T0)["memoryAllocatedMiB"][-1] == 2000
    (gpu,) = [s for s in api.history.series("gpu") if s.labels["node"] == "gpu-s"]
    assert gpu.points("1h", T0)["memoryAllocatedMiB"][-1] == 6000 and gpu.points("1h", T0)["coresAllocated"][-1] == 60


def _api(shared, clock):
    return UiApi(shared, "hami-scheduler", clock=clock, authorizer=Authorizer(FakeReviews()))


async def _ran_for_a_while(shared):
    now = {"t": T0}
    api = _api(shared, lambda: now["t"])
    for minute in range(30):  # half an hour of samples
        now["t"] = T0 + 60 * minute
        api.sample_history()
    return api


async def test_a_pod_that_ran_for_a_while_has_points_and_a_tenant_sees_only_its_namespace(shared):
    api = await _ran_for_a_while(shared)
    client = await _client(api)
    valid = validator_for("/api/v1/history")
    try:
        r = await client.get("/api/v1/history?kind=pod&range=1h")
        assert r.status == 401
        r = await client.get("/api/v1/history?kind=pod&range=1h", headers={"Authorization": f"Bearer {TENANT}"})
        doc = await r.json()
        assert r.status == 200, doc
        valid.validate(doc)
        assert [i["key"] for i in doc["items"]] == ["team-a/mine"]
        points = doc["items"][0]["points"]
        assert (
            sum(v is not None for v in points["memoryAllocatedMiB"]) == 30 and points["memoryAllocatedMiB"][-1] == 2000
        )
        assert doc["range"] == "1h" and doc["step"] == 60 and doc["source"] == "memory"
        r = await client.get("/api/v1/history?kind=namespace", headers={"Authorization": f"Bearer {TENANT}"})
        assert [i["key"] for i in (await r.json())["items"]] == ["team-a"]
        r = await client.get("/api/v1/history?kind=pod&namespace=team-x", headers={"Authorization": f"Bearer {TENANT}"})
        assert r.status == 403 and "list pods" in (await r.json())["error"]
        r = await client.get("/api/v1/history?kind=gpu", headers={"Authorization": f"Bearer {TENANT}"})
        assert r.status == 403 and (await r.json())["missing"]["resource"] == "nodes"
        r = await client.get("/api/v1/history?kind=gpu&range=7d", headers={"Authorization": f"Bearer {ADMIN}"})
        doc = await r.json()
        valid.validate(doc)
        assert len(doc["items"]) == 2 and doc["step"] == 10080
        r = await client.get("/api/v1/history?kind=pod&node=gpu-o", headers={"Authorization": f"Bearer {ADMIN}"})
        assert [i["key"] for i in (await r.json())["items"]] == ["team-b/elsewhere"]
    finally:
        await client.close()


@pytest.mark.parametrize(
    "query, text",
    [
        ("range=2h", "query parameter range: expected one of 1h, 6h, 24h, 7d"),
        ("kind=node", "query parameter kind: expected one of"),
        ("kind=gpu&namespace=team-a", "query parameter namespace: not a filter of kind=gpu"),
        ("kind=namespace&node=gpu-s", "query parameter node: not a filter of kind=namespace"),
        ("step=5", "unknown query parameter 'step'"),
    ],
)
async def test_bad_history_queries_are_400_naming_the_parameter(shared, query, text):
    client = await _client(_api(shared, lambda: T0))
    try:
        r = await client.get(f"/api/v1/history?{query}", headers={"Authorization": f"Bearer {ADMIN}"})
        body = await r.json()
        assert r.status == 400 and text in body["error"], body
    finally:
        await client.close()


async def test_without_the_chart_library_the_page_leaves_it_out(shared, monkeypatch):
    from hami.ui import page

    monkeypatch.setattr(page, "chart_library", lambda: False)
    assert "uplot" not in page.served_page()
    client = await _client(_api(shared, lambda: T0))
    try:
        assert (await client.get("/static/uplot.iife.min.js")).status == 404
    finally:
        await client.close()


def test_the_installed_chart_library_is_the_pinned_one():
    """scripts/install-ui-assets.sh pins uPlot's version and the npm registry's integrity hash and
    checks the tarball against it; what lies in the package must be what it pinned."""
    import base64
    import re
    from importlib import resources
    from pathlib import Path

    script = (Path(__file__).parents[2] / "scripts" / "install-ui-assets.sh").read_text()
    version = re.search(r"^VERSION=(\S+)$", script, re.M).group(1)
    integrity = re.search(r"^INTEGRITY=(sha512-\S+)$", script, re.M).group(1)
    assert len(base64.b64decode(integrity.removeprefix("sha512-"))) == 64
    stamp = resources.files("hami.ui") / "static" / "uplot.version"
    if not stamp.is_file():
        pytest.skip("uPlot is not installed: make ui-assets")
    assert stamp.read_text().split() == [version, integrity]
    js = (resources.files("hami.ui") / "static" / "uplot.iife.min.js").read_text()
    assert "uPlot" in js and len(js) < 80_000  # the small library it was chosen for
