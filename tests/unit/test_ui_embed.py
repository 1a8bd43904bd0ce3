"""The UI under a path prefix and in a portal's frame (issue 27, item 5): ``--ui-path-prefix`` and
``--ui-frame-ancestors``, their validation, and the listener's routes and headers; the page under
a prefix in Chromium."""

from __future__ import annotations

import argparse
import re

import pytest

from hami.core.errors import ConfigError
from hami.scheduler import options as O
from hami.serve import SECURITY_HEADERS
from hami.ui.server import UiApi, embedding_headers

from ._browser import browser as _browser_fixture
from ._browser import missing, open_page, serving
from .test_ui_api import _client
from .test_ui_api import cluster as _cluster_fixture

cluster = _cluster_fixture
browser = _browser_fixture


def _args(*argv):
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    return parser.parse_args(list(argv))


def _opts(*argv):
    return O.options_from_args(_args("--ui-bind", "127.0.0.1:9090", *argv))


def test_defaults_keep_the_root_and_no_framing():
    opts = _opts()
    assert (opts.ui_path_prefix, opts.ui_frame_ancestors) == ("", "'none'")
    assert embedding_headers() == SECURITY_HEADERS


@pytest.mark.parametrize(
    "given, kept",
    [("/hami", "/hami"), ("/hami/", "/hami"), ("/tools/gpu-ui", "/tools/gpu-ui"), ("/", ""), ("", "")],
)
def test_path_prefix_accepted(given, kept):
    assert _opts("--ui-path-prefix", given).ui_path_prefix == kept


@pytest.mark.parametrize("bad", ["hami", "/a/../b", "/a b", "/a?x=1", "//x", "/%2e", "/a/./b", "/a\n"])
def test_path_prefix_refused_naming_the_flag(bad):
    with pytest.raises(ConfigError, match=r"^--ui-path-prefix: "):
        _opts("--ui-path-prefix", bad)


@pytest.mark.parametrize(
    "given, kept",
    [
        ("'none'", "'none'"),
        ("'self'", "'self'"),
        ("'self'  https://portal.example.com", "'self' https://portal.example.com"),
        ("https://*.example.com:8443", "https://*.example.com:8443"),
        ("https:", "https:"),
    ],
)
def test_frame_ancestors_accepted(given, kept):
    assert _opts("--ui-frame-ancestors", given).ui_frame_ancestors == kept


@pytest.mark.parametrize(
    "bad, why",
    [
        ("'self'; script-src *", "contains ';'"),
        ("https://a.example\nX-Injected: 1", "contains '\\n'"),
        ("https://a.example, https://b.example", "contains ','"),
        ("", "expected 'none' alone"),
        ("'none' 'self'", "expected 'none' alone"),
        ("'unsafe-inline'", "not a source"),
    ],
)
def test_frame_ancestors_refused_naming_the_flag(bad, why):
    with pytest.raises(ConfigError, match=r"^--ui-frame-ancestors: .*" + re.escape(why)):
        _opts("--ui-frame-ancestors", bad)


def test_the_embedding_flags_need_the_ui():
    for flag, value in (("--ui-path-prefix", "/hami"), ("--ui-frame-ancestors", "'self'")):
        with pytest.raises(ConfigError, match=f"^{flag}: .*only used with --ui-bind"):
            O.options_from_args(_args(flag, value))


def test_embedding_headers_replace_frame_ancestors_and_drop_x_frame_options():
    h = embedding_headers("'self' https://portal.example.com")
    assert "frame-ancestors 'self' https://portal.example.com" in h["Content-Security-Policy"]
    assert "frame-ancestors 'none'" not in h["Content-Security-Policy"] and "X-Frame-Options" not in h
    assert h["Content-Security-Policy"].count(";") == SECURITY_HEADERS["Content-Security-Policy"].count(";")
    with pytest.raises(ValueError, match="frame-ancestors"):
        embedding_headers("'self'; script-src *")


async def test_routes_under_a_prefix_with_their_headers(cluster):
    client = await _client(UiApi(cluster, "hami-scheduler", prefix="/hami", frame_ancestors="'self'"))
    try:
        r = await client.get("/hami", allow_redirects=False)
        assert r.status == 302 and r.headers["Location"] == "/hami/"
        r = await client.get("/hami/")
        assert r.status == 200 and 'src="static/app.js"' in await r.text()
        assert "frame-ancestors 'self'" in r.headers["Content-Security-Policy"] and "X-Frame-Options" not in r.headers
        for path in (
            "/hami/static/app.js",
            "/hami/api/v1/nodes",
            "/healthz",
            "/hami/healthz",
        ):
            assert (await client.get(path)).status == 200, path
        for path in ("/", "/api/v1/nodes", "/static/app.js", "/hamix/"):
            r = await client.get(path)
            assert r.status == 404 and "frame-ancestors 'self'" in r.headers["Content-Security-Policy"], path
        assert (await client.post("/hami/api/v1/nodes")).status == 405
    finally:
        await client.close()


async def test_the_prefix_is_authenticated_like_the_root(cluster):
    from hami.ui.auth import Authorizer

    from .test_ui_auth import FakeReviews

    client = await _client(UiApi(cluster, "hami-scheduler", authorizer=Authorizer(FakeReviews()), prefix="/hami"))
    try:
        assert (await client.get("/hami/api/v1/pods")).status == 401
        assert (await client.get("/hami/")).status == 200  # the page itself needs no token
    finally:
        await client.close()


@pytest.mark.browser
@pytest.mark.skipif(bool(missing()), reason=missing() or "browser present")
def test_the_page_under_a_prefix_loads_and_shows_data(cluster, browser):
    with serving(UiApi(cluster, "hami-scheduler", prefix="/tools/gpus"), prefix="/tools/gpus") as url:
        assert url.endswith("/tools/gpus/")
        page, errors = open_page(browser, url.rstrip("/"))  # /tools/gpus redirects to /tools/gpus/
        try:
            assert page.url == url
            assert int(page.get_attribute("#gpu-count", "data-count")) > 0
            assert page.locator("article.node").count() > 0 and page.locator("tr[data-pod]").count() > 0
            # every script, stylesheet and API answer came from under the prefix
            fetched = page.evaluate("performance.getEntriesByType('resource').map((e) => e.name)")
            assert any("/tools/gpus/api/v1/nodes" in f for f in fetched), fetched
            assert any(f.endswith("/tools/gpus/static/app.js") for f in fetched), fetched
            assert [f for f in fetched if not f.startswith(url)] == []
            assert errors == [], errors
        finally:
            page.close()
