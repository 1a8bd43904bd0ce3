"""The page's own behaviour in headless Chromium, without a cluster: the UI listener over an
in-memory scheduler state (filters, the grid's pages, verdicts opened on demand, nothing blocked by
the CSP) and the `hami simulate --output html` file opened from disk."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hami.scheduler.state import ClusterState

from ._browser import browser as _browser_fixture
from ._browser import open_page, require, serving
from .test_ui_api import CFG, gpu_node, gpu_pod, placed

pytestmark = pytest.mark.browser
sync_api = require()
browser = _browser_fixture  # the shared fixture, under its own name


@pytest.fixture(scope="module")
def served():
    """60 nodes x 2 GPUs (more than the grid draws at first), one pod, one pending pod."""
    from hami.ui.server import UiApi

    state = ClusterState(CFG)
    state.node_handler.replace(
        [gpu_node(f"n{i:02d}", model_="NVIDIA-A10" if i % 2 else "NVIDIA-L4") for i in range(60)]
    )
    placed(state, gpu_pod("train"), "n00")
    state.pod_handler.apply("ADDED", gpu_pod("huge", ns="team-c", mem=40000))
    with serving(UiApi(state, "hami-scheduler")) as url:
        yield url


def test_grid_filters_and_pages(served, browser):
    page, errors = open_page(browser, served)
    try:
        assert page.get_attribute("#gpu-count", "data-count") == "120"
        assert page.locator("article.node").count() == 12  # 12 cards a page: five pages
        assert page.get_attribute("#node-grid", "data-rows") == "60"
        for _ in range(4):
            page.click('.pager[data-table="node-grid"] .page-next')
        assert page.get_attribute("#node-grid", "data-page") == "5"
        assert page.locator("article.node").count() == 12 and page.locator("#node-grid .gpu").count() == 24
        assert page.get_attribute("article.node >> nth=0", "data-node") == "n48"
        page.click('.pager[data-table="node-grid"] .page-prev')
        assert page.get_attribute("article.node >> nth=0", "data-node") == "n36"
        page.select_option("#filter-model", "NVIDIA-A10")
        assert page.get_attribute("#gpu-count", "data-count") == "60"
        assert page.get_attribute("#node-grid", "data-rows") == "30" and page.locator("article.node").count() == 12
        page.select_option("#filter-model", "")
        page.select_option("#filter-node", "n00")
        assert page.locator("article.node").count() == 1
        assert page.locator('tr[data-pod="team-a/train"]').count() == 1
        page.select_option("#filter-node", "")
        page.select_option("#filter-namespace", "team-c")
        assert page.locator('tr[data-pod="team-a/train"]').count() == 0
        assert page.locator('[data-pending="team-c/huge"]').count() == 1
        assert errors == [], errors  # nothing blocked by the CSP, no script error
    finally:
        page.close()


def test_pending_verdicts_are_drawn_when_opened_and_stay_open(served, browser):
    page, errors = open_page(browser, served)
    try:
        pending = page.locator('[data-pending="team-c/huge"]')
        assert pending.locator("li").count() == 0  # not drawn while closed
        pending.locator("summary").focus()
        page.keyboard.press("Enter")  # keyboard opens it
        pending.locator('li[data-node="n01"]').first.wait_for(timeout=10_000)
        assert pending.locator("details > ul > li").count() == 60
        page.click("#refresh-now")
        page.get_by_text("Updated").wait_for(timeout=10_000)
        assert page.locator('[data-pending="team-c/huge"] details').get_attribute("open") is not None
        assert errors == [], errors
    finally:
        page.close()


def test_the_simulate_file_opens_from_disk_without_a_server(browser, tmp_path):
    out = tmp_path / "what-if.html"
    out.write_text(
        subprocess.run(
            [sys.executable, "-m", "hami", "simulate", "--example", "mixed", "-o", "html"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    page, errors = open_page(browser, out.as_uri())
    try:
        page.locator("article.node").first.wait_for(timeout=30_000)
        assert page.get_attribute("#gpu-count", "data-count") == "14"
        assert page.is_disabled("#refresh-now")
        assert "Snapshot from" in page.inner_text("#status")
        assert "AI cores" in page.inner_text('#summary-table tr[data-vendor="Ascend910B3"]')
        assert page.locator('[data-pending="ml/dcu-too-big"]').count() == 1
        assert errors == [], errors
    finally:
        page.close()
