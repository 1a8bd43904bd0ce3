"""The Chinese page in headless Chromium (issue 27, item 4): a browser whose language is zh-CN
gets the page in Chinese (headings, badges, units), the switch turns it to English and the tab
keeps the choice; an English browser gets English."""

from __future__ import annotations

import pytest

from ._browser import browser as _browser_fixture
from ._browser import open_page, require, serving
from .test_ui_api import cluster as _cluster_fixture

pytestmark = pytest.mark.browser
require()
browser = _browser_fixture  # the shared fixture, under its own name
cluster = _cluster_fixture


@pytest.fixture
def served(cluster):
    from hami.ui.server import UiApi

    with serving(UiApi(cluster, "hami-scheduler")) as url:
        yield url


def test_a_chinese_browser_gets_the_chinese_page_and_can_switch(served, browser):
    page, errors = open_page(browser, served, locale="zh-CN")
    try:
        assert page.evaluate("navigator.language") == "zh-CN"
        assert page.get_attribute("html", "lang") == "zh-CN"
        assert page.inner_text("#summary-title") == "按厂商和型号汇总"
        assert page.inner_text("#nodes-title") == "节点与设备"
        assert page.inner_text("#pods-title") == "Pod 及其分配"
        assert page.title() == "hami：集群中的 GPU"
        assert page.inner_text("#status").startswith("更新于")
        assert "个节点上共" in page.inner_text("p.totals")
        assert page.get_attribute("#refresh-seconds", "aria-label") == "刷新间隔（秒）"
        npu = page.inner_text('#summary-table tr[data-vendor="Ascend910B3"]')
        assert "个 AI Core" in npu and "GiB" in npu  # units per vendor, in Chinese
        assert "无实时用量" in page.inner_text("#node-grid")  # a badge
        assert "Summary" not in page.inner_text("body") and "Refresh" not in page.inner_text("body")

        page.select_option("#lang", "en")  # the switch: English at once, kept in this tab
        assert page.inner_text("#summary-title") == "Summary by vendor and model"
        assert "AI cores" in page.inner_text('#summary-table tr[data-vendor="Ascend910B3"]')
        assert page.get_attribute("html", "lang") == "en"
        page.reload()
        page.locator("#status[data-updated]").wait_for(timeout=30_000)
        assert page.inner_text("#nodes-title") == "Nodes and devices"
        assert errors == [], errors
    finally:
        page.close()


def test_an_english_browser_gets_english(served, browser):
    page, errors = open_page(browser, served, locale="en-US")
    try:
        assert page.inner_text("#summary-title") == "Summary by vendor and model"
        assert page.inner_text("#status").startswith("Updated")
        assert [page.inner_text(o) for o in ("#lang option[value=en]", "#lang option[value=zh]")] == ["English", "中文"]
        assert errors == [], errors
    finally:
        page.close()
