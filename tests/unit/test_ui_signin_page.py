"""The page's sign-in in headless Chromium (issue 27, item 1): the UI listener with token sign-in
over in-memory reviews (tests/unit/test_ui_auth.py's stand-in for the API server).

The page asks for a token when the API answers 401, refuses a bad one, keeps a good one in the
tab's sessionStorage only (not localStorage, not a cookie, not another tab) and sends it as the
bearer header; a tenant sees its own pod, anonymous totals for the others on its GPU, and
"Not allowed" naming list nodes on the node grid (403); sign-out forgets the token."""

from __future__ import annotations

import pytest

from hami.ui.auth import Authorizer

from ._browser import browser as _browser_fixture
from ._browser import require, serving
from .test_ui_auth import ADMIN, TENANT, FakeReviews
from .test_ui_auth import shared as _shared_state

pytestmark = pytest.mark.browser
sync_api = require()
browser = _browser_fixture  # the shared fixture, under its own name
shared = _shared_state  # the fixture, under its own name


@pytest.fixture
def served(shared):
    from hami.ui.server import UiApi

    with serving(UiApi(shared, "hami-scheduler", authorizer=Authorizer(FakeReviews()))) as url:
        yield url


def _sign_in(page, token: str) -> None:
    page.fill("#token", token)
    page.click("#sign-in")


def test_sign_in_scoping_and_sign_out(served, browser):
    context = browser.new_context(viewport={"width": 1366, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    sent: list[str | None] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # Chromium logs every 4xx answer as a console error; the rest must stay empty
    page.on(
        "console",
        lambda m: errors.append(m.text) if m.type in ("error", "warning") and "status of 40" not in m.text else None,
    )
    page.on("request", lambda r: sent.append(r.headers.get("authorization")) if "/api/v1/" in r.url else None)
    try:
        page.goto(served)
        page.locator("#signin").wait_for(state="visible", timeout=30_000)
        assert "Sign in" in page.inner_text("#status")
        assert page.locator("tr[data-pod]").count() == 0

        _sign_in(page, "not-a-token")  # refused: the form again, saying why
        page.locator("#signin-error").wait_for(state="visible", timeout=10_000)
        assert "not accepted" in page.inner_text("#signin-error")
        assert page.evaluate("sessionStorage.length") == 0

        _sign_in(page, TENANT)
        page.get_by_text("Updated").wait_for(timeout=30_000)
        assert page.is_hidden("#signin") and page.is_visible("#sign-out")
        assert [page.get_attribute(r, "data-pod") for r in ["tr[data-pod]"]] == ["team-a/mine"]
        assert page.locator("tr[data-pod]").count() == 1
        body = page.inner_text("body")
        for leak in ("team-x", "team-y", "secret-trainer", "hidden-infer", "elsewhere"):
            assert leak not in body, leak
        shared_line = page.inner_text("#shared-devices")
        assert "2 pods of other namespaces" in shared_line and "3.9 GiB" in shared_line
        denied = page.inner_text('p.denied[data-denied="nodes"]')  # 403: the permission is named
        assert "list nodes at the cluster scope" in denied
        assert page.locator("article.node").count() == 0
        assert "list resourcequotas" in page.inner_text('p.denied[data-denied="quotas"]')
        assert f"Bearer {TENANT}" in sent
        # kept in this tab only: sessionStorage, not localStorage, no cookie
        assert page.evaluate("Object.values(sessionStorage)") == [TENANT]
        assert page.evaluate("localStorage.length") == 0 and page.evaluate("document.cookie") == ""
        assert context.cookies() == []
        other_tab = context.new_page()
        other_tab.goto(served)
        other_tab.locator("#signin").wait_for(state="visible", timeout=30_000)  # a new tab asks again
        other_tab.close()
        page.reload()  # the same tab keeps it
        page.get_by_text("Updated").wait_for(timeout=30_000)
        assert page.locator("tr[data-pod]").count() == 1

        page.click("#sign-out")
        page.locator("#signin").wait_for(state="visible", timeout=10_000)
        assert page.evaluate("sessionStorage.length") == 0
        assert page.locator("tr[data-pod]").count() == 0 and page.locator("p.denied").count() == 0

        _sign_in(page, ADMIN)  # everything, nothing denied
        page.locator('tr[data-pod="team-x/secret-trainer"]').wait_for(timeout=30_000)
        assert page.locator("tr[data-pod]").count() == 4 and page.locator("article.node").count() == 2
        assert page.locator("p.denied").count() == 0 and page.inner_text("#shared-devices") == ""
        assert errors == [], errors
    finally:
        context.close()
