"""The page waits out a 503's Retry-After (bounded) and says so, then asks again, instead of
failing at once or asking again at every refresh; in headless Chromium with a fake clock."""

from __future__ import annotations

import pytest

from hami.scheduler.state import ClusterState

from ._browser import LOADED, require, serving
from ._browser import browser as _browser_fixture
from .test_ui_api import CFG, gpu_node, gpu_pod, placed

pytestmark = pytest.mark.browser
sync_api = require()
browser = _browser_fixture  # the shared fixture, under its own name


@pytest.fixture(scope="module")
def served():
    from hami.ui.server import UiApi

    state = ClusterState(CFG)
    state.node_handler.replace([gpu_node("n00")])
    placed(state, gpu_pod("train"), "n00")
    with serving(UiApi(state, "hami-scheduler")) as url:
        yield url


def _busy(page, asked: list, retry_after: str, times: int) -> None:
    """``/api/v1/pods`` answers 503 with ``retry_after`` the first ``times`` times."""

    def handle(route):
        asked.append(route.request.url)
        if len(asked) <= times:
            route.fulfill(status=503, headers={"Retry-After": retry_after}, json={"error": "busy; try again"})
        else:
            route.continue_()

    page.route("**/api/v1/pods", handle)


def test_a_503_is_waited_out_as_the_server_asks_then_the_page_loads(served, browser):
    page = browser.new_page()
    try:
        page.clock.install()
        asked: list = []
        _busy(page, asked, "2", 2)
        page.goto(served)
        status = page.locator("#status")
        page.locator("#status[data-waiting='2']").wait_for()
        assert "busy" in status.text_content() and "2" in status.text_content()
        assert len(asked) == 1  # before: the refresh failed at once ("HTTP 503")
        with page.expect_request("**/api/v1/pods"):
            page.clock.run_for(2_000)
        page.locator("#status[data-waiting='2']").wait_for()  # the second 503 answered: waiting again
        assert len(asked) == 2
        with page.expect_request("**/api/v1/pods"):
            page.clock.run_for(2_000)
        page.locator(LOADED).wait_for()
        assert len(asked) == 3 and page.locator("#status[data-waiting]").count() == 0
        assert "train" in page.locator("#pods").text_content()
        assert "error" not in (status.get_attribute("class") or "")
    finally:
        page.close()


def test_a_long_retry_after_is_bounded_and_a_server_that_stays_busy_fails_after_a_few_tries(served, browser):
    page = browser.new_page()
    try:
        page.clock.install()
        asked: list = []
        _busy(page, asked, "3600", 100)
        page.goto(served)
        for _ in range(3):
            page.locator("#status[data-waiting='30']").wait_for()  # an hour asked: 30 s waited
            with page.expect_request("**/api/v1/pods"):
                page.clock.run_for(30_000)
        page.locator("#status.error").wait_for()
        assert len(asked) == 4  # the first answer and three waits, no more
        assert "503" in page.locator("#status").text_content()
    finally:
        page.close()
