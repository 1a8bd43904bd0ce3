"""What every browser test of the UI (and bench/bench_ui_api.py) shares: where Chromium is, the UI
listener run on a thread of its own (Playwright's sync API blocks the test's thread), and one
launched headless Chromium.

A test module calls :func:`require` at import time (it skips the module without Chromium or
Playwright, naming the install step) and takes the ``browser`` fixture from here::

    from ._browser import browser, open_page, require, serving  # noqa: F401 - browser: a fixture

    sync_api = require()
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import ssl
import threading
from typing import Any, Iterator

import pytest

CHROMIUM = os.environ.get("HAMI_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu"]


def missing() -> str:
    """Why the browser tests cannot run here ("" when they can)."""
    if not os.access(CHROMIUM, os.X_OK):
        return "no chromium: run scripts/install-browser.sh (Debian's chromium package) for the browser tests"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "no playwright: pip install -e '.[test]'"
    return ""


def require() -> Any:
    """``playwright.sync_api``, or skip the calling module saying what to install."""
    why = missing()
    if why:
        pytest.skip(why, allow_module_level=True)
    import playwright.sync_api

    return playwright.sync_api


def launch(playwright: Any) -> Any:
    """Headless Debian Chromium (Playwright's own browsers are not downloaded)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)


@contextlib.contextmanager
def serving(
    api: Any, host: str = "127.0.0.1", port: int = 0, ssl_context: ssl.SSLContext | None = None, prefix: str = ""
) -> Iterator[str]:
    """Run ``api`` (a :class:`hami.ui.server.UiApi`) on a loop in a thread; yields the page's URL
    (``http(s)://host:port/PREFIX/``) and stops the listener on exit."""
    from hami.ui.server import serve_ui

    loop = asyncio.new_event_loop()
    box: dict = {}
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            box["runner"] = loop.run_until_complete(serve_ui(api, host, port, ssl_context=ssl_context))
        except BaseException as exc:  # noqa: BLE001 - reported on the test's thread
            box["error"] = exc
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30), "the UI listener did not start"
    if "error" in box:
        loop.call_soon_threadsafe(loop.stop)
        raise box["error"]
    scheme = "https" if ssl_context is not None else "http"
    path = prefix.rstrip("/") + "/"
    try:
        yield f"{scheme}://{host}:{box['runner'].addresses[0][1]}{path}"
    finally:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture(scope="module")
def browser():
    sync_api = require()
    with sync_api.sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


LOADED = "#status[data-updated]"  # the page's status once every answer is in and drawn (any language)


def open_page(browser: Any, url: str, wait: str | None = LOADED, **context: Any) -> tuple[Any, list[str]]:
    """A fresh 1366x800 page at ``url`` (``context``: Playwright's new_page options, e.g. ``locale``)
    with the script errors and console errors/warnings it logs collected (a CSP violation is
    one); for an http(s) URL, waits for the selector ``wait``."""
    page = browser.new_page(viewport={"width": 1366, "height": 800}, **context)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.goto(url)
    if wait and url.startswith("http"):
        page.locator(wait).first.wait_for(timeout=30_000)
    return page, errors
