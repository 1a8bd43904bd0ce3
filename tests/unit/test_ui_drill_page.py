"""Drill-down in headless Chromium (issue 27, item 3): search, sort and pages in the tables and
the node grid; node, GPU and pod pages linked to each other (hash routes, under a path prefix);
a pending pod's Kubernetes events beside hami's reasons; a tenant without ``list nodes`` gets
"Not allowed" on a node page and one without ``list events`` on the events. With
``HAMI_DOCS_IMAGES=1`` a node page and the pending pod's page are saved as
docs/images/ui-node.png and docs/images/ui-pod.png."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hami.scheduler.state import ClusterState
from hami.ui.auth import Authorizer

from ._browser import browser as _browser_fixture
from ._browser import open_page, require, serving
from .test_ui_api import CFG, gpu_node, gpu_pod, placed
from .test_ui_auth import TENANT, FakeReviews
from .test_ui_auth import shared as _shared_state

pytestmark = pytest.mark.browser
sync_api = require()
browser = _browser_fixture
shared = _shared_state
PREFIX = "/hami"
EVENTS = [
    {
        "type": "Warning",
        "reason": "FailedScheduling",
        "message": "0/150 nodes are available: 150 Insufficient nvidia.com/gpumem.",
        "count": 7,
        "lastTimestamp": "2026-11-26T08:10:00Z",
        "source": {"component": "hami-scheduler"},
    },
    {
        "type": "Normal",
        "reason": "NotTriggerScaleUp",
        "message": "pod didn't trigger scale-up",
        "count": 2,
        "lastTimestamp": "2026-11-26T08:05:00Z",
        "source": {"component": "cluster-autoscaler"},
    },
]


@pytest.fixture(scope="module")
def served():
    """150 nodes x 2 GPUs (300 device rows: three pages), three pods on n000 and n001, one
    pending pod with two events; under the path prefix /hami."""
    from hami.ui.server import UiApi

    state = ClusterState(CFG)
    state.node_handler.replace([gpu_node(f"n{i:03d}") for i in range(150)])
    placed(state, gpu_pod("train", mem=3000), "n000")
    placed(state, gpu_pod("infer", ns="team-b", mem=1000), "n000")
    placed(state, gpu_pod("eval", mem=2000), "n001")
    state.pod_handler.apply("ADDED", gpu_pod("huge", ns="team-c", mem=40000))
    asked: list[tuple[str, str]] = []

    async def events(namespace: str, name: str) -> list[dict]:
        asked.append((namespace, name))
        return EVENTS if (namespace, name) == ("team-c", "huge") else []

    with serving(UiApi(state, "hami-scheduler", events=events, prefix=PREFIX), prefix=PREFIX) as url:
        yield url


def _rows(page, table: str, attr: str) -> list[str]:
    return page.eval_on_selector_all(f"#{table} tbody tr", f"(rows) => rows.map((r) => r.getAttribute('{attr}'))")


def test_search_sort_and_pages(served, browser):
    page, errors = open_page(browser, served)
    try:
        # 300 device rows: 100 drawn, the rest on two more pages
        assert page.get_attribute("#gpu-table", "data-rows") == "300"
        assert page.locator("#gpu-table tbody tr").count() == 100
        assert page.locator("article.node").count() == 12
        pager = '.pager[data-table="gpu-table"]'
        assert "1–100 of 300" in page.inner_text(pager)
        page.click(pager + " .page-next")
        page.click(pager + " .page-next")
        assert page.get_attribute("#gpu-table", "data-page") == "3" and page.is_disabled(pager + " .page-next")
        assert page.locator("#gpu-table tbody tr").count() == 100
        # search narrows the table (and goes back to its first page)
        page.fill('.table-search[data-table="gpu-table"]', "n007")
        assert page.get_attribute("#gpu-table", "data-rows") == "2"
        assert page.locator("#gpu-table tbody tr").count() == 2 and page.is_hidden(pager)
        assert "2 of 300 rows match" in page.inner_text('.table-tools[data-table="gpu-table"]')
        page.fill('.table-search[data-table="node-grid"]', "n14")
        assert page.locator("article.node").count() == 10  # n140..n149
        page.fill('.table-search[data-table="pod-table"]', "team-b")
        assert _rows(page, "pod-table", "data-pod") == ["team-b/infer"]
        page.fill('.table-search[data-table="pod-table"]', "")
        # sort: the node column descending, then the pods by the memory they hold
        page.fill('.table-search[data-table="gpu-table"]', "")
        node_header = "#gpu-table th:nth-child(1) button"
        page.click(node_header)
        assert page.get_attribute("#gpu-table th:nth-child(1)", "aria-sort") == "ascending"
        page.click(node_header)
        assert page.get_attribute("#gpu-table th:nth-child(1)", "aria-sort") == "descending"
        assert page.inner_text("#gpu-table tbody tr:first-child td:first-child") == "n149"
        page.click("#pod-table th:nth-child(4) button")
        assert _rows(page, "pod-table", "data-pod") == ["team-b/infer", "team-a/eval", "team-a/train"]
        page.click("#pod-table th:nth-child(4) button")
        assert _rows(page, "pod-table", "data-pod") == ["team-a/train", "team-a/eval", "team-b/infer"]
        # the state survives a refresh
        page.click("#refresh-now")
        page.get_by_text("Updated").wait_for(timeout=10_000)
        assert _rows(page, "pod-table", "data-pod") == ["team-a/train", "team-a/eval", "team-b/infer"]
        assert errors == [], errors
    finally:
        page.close()


def _arrive(page, url: str, title: str) -> None:
    """Wait for the address, then for the page it names: the URL changes before the page's
    hashchange handler has drawn it, so the old page's title can still be read in between."""
    page.wait_for_url(url)
    try:
        page.wait_for_function(
            "t => document.getElementById('detail-title')?.textContent === t", arg=title, timeout=10_000
        )
    except sync_api.TimeoutError:
        pass  # the assertion below says what was shown instead
    assert page.inner_text("#detail-title") == title


def test_from_a_node_to_a_gpu_to_a_pod_and_back(served, browser):
    page, errors = open_page(browser, served)
    try:
        assert page.url.endswith(PREFIX + "/")
        page.click('article.node[data-node="n000"] h3 a')
        _arrive(page, "**/hami/#/node/n000", "Node n000")
        assert page.is_hidden("#overview") and page.is_visible("#detail")
        assert page.locator("#detail-devices tbody tr").count() == 2
        assert sorted(_rows(page, "detail-pods", "data-pod")) == ["team-a/train", "team-b/infer"]
        if os.environ.get("HAMI_DOCS_IMAGES") == "1":
            page.locator("#detail").screenshot(path=str(Path(__file__).parents[2] / "docs" / "images" / "ui-node.png"))
        # the GPU train holds
        page.click('#detail-pods tr[data-pod="team-a/train"] .grant a')
        page.wait_for_url("**/#/gpu/*")
        uuid = page.url.rsplit("/", 1)[1]
        _arrive(page, f"**/#/gpu/{uuid}", f"Device {uuid}")
        assert sorted(_rows(page, "detail-pods", "data-pod")) == ["team-a/train", "team-b/infer"]
        page.click('#detail-pods tr[data-pod="team-a/train"] a')
        _arrive(page, "**/#/pod/team-a/train", "Pod team-a/train")
        assert _rows(page, "detail-grants", "data-grant-uuid") == [uuid]
        assert "not waiting" in page.inner_text("#detail-reasons")
        # and back: to the node by its link, then the browser's back button, then the overview
        page.click("#detail .detail-info a")
        page.wait_for_url("**/#/node/n000")
        page.go_back()
        _arrive(page, "**/#/pod/team-a/train", "Pod team-a/train")
        page.click("#detail-back")
        page.locator("#overview").wait_for(state="visible", timeout=10_000)
        assert page.is_hidden("#detail") and page.locator("article.node").count() == 12
        # a page of nothing says so, never a crash
        page.goto(served + "#/node/no-such-node")
        page.locator("#detail-title").wait_for(timeout=30_000)
        assert "No node named no-such-node" in page.inner_text("#detail")
        page.goto(served + "#/gpu/%E0%A4%A")  # a bad escape: the overview
        page.locator("#overview").wait_for(state="visible", timeout=30_000)
        assert errors == [], errors
    finally:
        page.close()


def test_a_pending_pod_shows_its_events_beside_our_reasons(served, browser):
    page, errors = open_page(browser, served + "#/pod/team-c/huge", locale="en-US")
    try:
        page.locator('#detail-events tr[data-event-reason="FailedScheduling"]').wait_for(timeout=30_000)
        assert page.inner_text("#detail-title") == "Pod team-c/huge"
        assert "pending" in page.inner_text("#detail .detail-info")
        reasons = page.inner_text("#detail-reasons")
        assert "no node" in reasons.lower() or "insufficient" in reasons.lower() or "memory" in reasons.lower()
        assert _rows(page, "detail-events", "data-event-reason") == ["FailedScheduling", "NotTriggerScaleUp"]
        assert "150 Insufficient" in page.inner_text("#detail-events")
        assert page.locator("#detail-events tr.warning").count() == 1
        if os.environ.get("HAMI_DOCS_IMAGES") == "1":
            page.locator("#detail").screenshot(path=str(Path(__file__).parents[2] / "docs" / "images" / "ui-pod.png"))
        # the pending list of the overview links to it
        page.click("#detail-back")
        page.click('[data-pending="team-c/huge"] h3 a')
        page.locator('#detail-events tr[data-event-reason="FailedScheduling"]').wait_for(timeout=30_000)
        assert errors == [], errors
    finally:
        page.close()


def test_a_tenant_without_list_nodes_or_events_is_told_so(shared, browser):
    from hami.ui.server import UiApi

    async def events(namespace: str, name: str) -> list[dict]:
        raise AssertionError("read for a caller who may not list events")

    api = UiApi(shared, "hami-scheduler", authorizer=Authorizer(FakeReviews()), events=events)
    with serving(api) as url:
        context = browser.new_context(viewport={"width": 1366, "height": 800})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on(
            "console",
            lambda m: (
                errors.append(m.text) if m.type in ("error", "warning") and "status of 40" not in m.text else None
            ),
        )
        try:
            page.goto(url + "#/node/gpu-s")
            page.locator("#signin").wait_for(state="visible", timeout=30_000)
            page.fill("#token", TENANT)
            page.click("#sign-in")
            page.locator("#detail p.denied").wait_for(timeout=30_000)
            denied = page.inner_text("#detail p.denied")
            assert denied.startswith("Not allowed") and "list nodes" in denied
            assert _rows(page, "detail-pods", "data-pod") == ["team-a/mine"]  # its own pod on that node
            page.click('#detail-pods tr[data-pod="team-a/mine"] th a')
            page.wait_for_url("**/#/pod/team-a/mine")
            page.locator("#detail-events-note.denied").wait_for(timeout=30_000)
            assert "list events" in page.inner_text("#detail-events-note")
            assert "secret-trainer" not in page.inner_text("body")
            assert errors == [], errors
        finally:
            context.close()


def test_the_pages_in_chinese(served, browser):
    page, errors = open_page(browser, served + "#/pod/team-c/huge", locale="zh-CN")
    try:
        page.locator('#detail-events tr[data-event-reason="FailedScheduling"]').wait_for(timeout=30_000)
        assert page.inner_text("#detail-title") == "Pod team-c/huge 的详情"
        assert "Kubernetes 事件" in page.inner_text("#detail") and "等待原因" in page.inner_text("#detail")
        page.click("#detail-back")
        page.locator("#overview").wait_for(state="visible", timeout=10_000)
        assert "第 1–100 行，共 300 行" in page.inner_text('.pager[data-table="gpu-table"]')
        assert page.inner_text('.table-tools[data-table="gpu-table"] label').strip() == "搜索"
        assert errors == [], errors
    finally:
        page.close()
