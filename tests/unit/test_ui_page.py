"""The page's own behaviour in headless Chromium, without a cluster: the UI listener over an
in-memory scheduler state (filters, "Show all", verdicts opened on demand, nothing blocked by
the CSP) and the `hami simulate --output html` file opened from disk."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading

import pytest

from hami.scheduler.state import ClusterState

from .test_ui_api import CFG, gpu_node, gpu_pod, placed

CHROMIUM = os.environ.get("HAMI_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.browser
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(
        "no chromium: run scripts/install-browser.sh (Debian's chromium package) for the browser tests",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="no playwright: pip install -e '.[test]'")


@pytest.fixture(scope="module")
def served():
    """60 nodes x 2 GPUs (more than the grid draws at first), one pod, one pending pod."""
    from hami.ui import page as _page  # noqa: F401 - the assets must be importable
    from hami.ui.server import UiApi, serve_ui

    state = ClusterState(CFG)
    state.node_handler.replace(
        [gpu_node(f"n{i:02d}", model_="NVIDIA-A10" if i % 2 else "NVIDIA-L4") for i in range(60)]
    )
    placed(state, gpu_pod("train"), "n00")
    state.pod_handler.apply("ADDED", gpu_pod("huge", ns="team-c", mem=40000))
    loop = asyncio.new_event_loop()
    box: dict = {}
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        box["runner"] = loop.run_until_complete(serve_ui(UiApi(state, "hami-scheduler"), "127.0.0.1", 0))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    yield f"http://127.0.0.1:{box['runner'].addresses[0][1]}/"
    asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def _open(browser, url):
    page = browser.new_page(viewport={"width": 1366, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.goto(url)
    page.get_by_text("Updated").wait_for(timeout=30_000) if url.startswith("http") else None
    return page, errors


def test_grid_filters_and_show_all(served, browser):
    page, errors = _open(browser, served)
    try:
        assert page.get_attribute("#gpu-count", "data-count") == "120"
        assert page.locator("article.node").count() == 48  # the rest behind "Show all"
        page.click("#show-all-nodes")
        assert page.locator("article.node").count() == 60 and page.locator(".gpu").count() == 120
        page.select_option("#filter-model", "NVIDIA-A10")
        assert page.get_attribute("#gpu-count", "data-count") == "60"
        assert page.locator("article.node").count() == 30
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
    page, errors = _open(browser, served)
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
    page, errors = _open(browser, out.as_uri())
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
