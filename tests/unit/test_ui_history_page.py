"""The history chart in headless Chromium (issue 27, item 2): half an hour of samples in the ring,
the section opened, a uPlot chart drawn with the points of the chosen series; the series of
another kind and range on demand; in Chinese the chart's legend is Chinese too. With
``HAMI_DOCS_IMAGES=1`` the English chart is saved as docs/images/ui-history.png."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hami.ui import page as ui_page
from hami.ui.live import NodeReading, Usage

from ._browser import browser as _browser_fixture
from ._browser import open_page, require, serving
from .test_ui_api import cluster as _cluster_fixture

pytestmark = pytest.mark.browser
require()
if not ui_page.chart_library():
    pytest.skip("uPlot is not installed into src/hami/ui/static: run make ui-assets", allow_module_level=True)
browser = _browser_fixture
cluster = _cluster_fixture


@pytest.fixture
def served(cluster):
    from hami.ui.server import UiApi

    now: dict = {"t": None}
    live = type("Live", (), {"readings": {}})()
    api = UiApi(cluster, "hami-scheduler", live, clock=lambda: now["t"] or time.time())
    began = time.time()
    for minute in range(30):  # the last half hour, one sample a minute; team-a/train's use rises
        now["t"] = t = began - 60 * (29 - minute)
        used = 600 + 70 * minute
        live.readings = {
            "gpu-1": NodeReading(
                scraped_at=t - 5,
                stale_after=45,
                devices={"GPU-gpu-1-0": Usage(used + 100, 40.0)},
                containers={("team-a", "train", "main", "GPU-gpu-1-0"): Usage(used, 35.0)},
            )
        }
        api.sample_history()
    now["t"] = None
    with serving(api) as url:
        yield url


def _open_history(page):
    page.click("#history-details > summary")
    page.locator("#history-chart canvas").first.wait_for(timeout=30_000)


def test_a_history_chart_with_data_points(served, browser):
    page, errors = open_page(browser, served, locale="en-US")
    try:
        assert page.locator("#history-chart canvas").count() == 0  # closed: nothing fetched or drawn
        assert page.evaluate("typeof window.uPlot") == "undefined"  # the library waits for the first chart
        _open_history(page)
        assert page.input_value("#history-series") == "team-a"
        assert page.get_attribute("#history-chart", "data-points") == "30"
        assert page.locator("#history-chart .uplot").count() == 1
        legend = page.inner_text("#history-chart .u-legend")
        assert "memory allocated" in legend and "memory used" in legend
        assert "30 points, one per 1 min" in page.inner_text("#history-note")
        assert page.get_attribute("#history-chart", "data-used-points") == "30"  # live use, sampled too
        if os.environ.get("HAMI_DOCS_IMAGES") == "1":
            page.locator("#history").screenshot(
                path=str(Path(__file__).parents[2] / "docs" / "images" / "ui-history.png")
            )
        # a GPU over 7 days: the same samples in 168-minute buckets (one or two of them)
        page.select_option("#history-kind", "gpu")
        page.select_option("#history-range", "7d")
        page.wait_for_function("() => document.getElementById('history-note').textContent.includes('168 min')")
        assert page.locator("#history-series option").count() >= 2
        assert 1 <= int(page.get_attribute("#history-chart", "data-points")) <= 2
        page.select_option("#history-kind", "pod")
        page.select_option("#history-range", "1h")
        page.wait_for_function("() => document.getElementById('history-note').textContent.includes('1 min')")
        assert page.get_attribute("#history-chart", "data-points") == "30"
        assert errors == [], errors
    finally:
        page.close()


def test_the_history_in_chinese(served, browser):
    page, errors = open_page(browser, served, locale="zh-CN")
    try:
        assert page.inner_text("#history-title") == "历史：已分配与实际使用的显存"
        _open_history(page)
        assert "已分配显存" in page.inner_text("#history-chart .u-legend")
        assert "30 个数据点" in page.inner_text("#history-note")
        assert page.inner_text("#history-range option[value='7d']") == "7 天"
        assert errors == [], errors
    finally:
        page.close()


def test_the_note_says_when_prometheus_did_not_answer(cluster, browser):
    """With --ui-prometheus-url and nothing listening there, the page draws the ring's series and
    its note says why they are not from Prometheus."""
    from hami.ui.prometheus import PrometheusHistory
    from hami.ui.server import UiApi

    api = UiApi(cluster, "hami-scheduler", prometheus=PrometheusHistory("http://127.0.0.1:1"))
    api.sample_history()
    with serving(api) as url:
        page, errors = open_page(browser, url, locale="en-US")
        try:
            _open_history(page)
            note = page.inner_text("#history-note")
            assert "History source: Prometheus could not answer (" in note, note
            assert "this answer comes from the scheduler's memory" in note
            assert errors == [], errors
        finally:
            page.close()
