"""The page: ``static/index.html`` with its assets linked (served) or inlined with a snapshot
(``hami simulate --output html``: one file that opens anywhere, no server, no network).

Every text of the page is in the message catalogue ``static/messages.<language>.json`` (flat keys,
``{name}`` placeholders; :data:`LANGUAGES`); the script reads it from ``window.HAMI_MESSAGES``,
which :func:`messages_js` writes (served in front of ``static/app.js``, one request: :func:`app_js`;
inlined in a snapshot).
To add a language: a JSON file with every key of ``en.json``, and its code in :data:`LANGUAGES`
(``tests/unit/test_ui_i18n.py`` checks both)."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

HEAD, SCRIPTS = "<!--HAMI-HEAD-->", "<!--HAMI-SCRIPTS-->"
LANGUAGES = ("en", "zh")  # the first is the fallback of a missing key


def catalogue(language: str) -> dict[str, str]:
    """One language's messages (``static/messages.<language>.json``)."""
    text = (resources.files("hami.ui") / "static" / f"messages.{language}.json").read_text(encoding="utf-8")
    return json.loads(text)


@functools.cache
def messages_js() -> str:
    """The script that hands every catalogue to ``app.js``."""
    return f"window.HAMI_MESSAGES = {_script_json({lang: catalogue(lang) for lang in LANGUAGES})};\n"


@functools.cache
def app_js() -> str:
    """``static/app.js`` as served: the catalogues first, then the script."""
    return messages_js() + asset("app.js")


def asset(name: str) -> str:
    return (resources.files("hami.ui") / "static" / name).read_text(encoding="utf-8")


CHART_JS, CHART_CSS = "uplot.iife.min.js", "uplot.min.css"  # scripts/install-ui-assets.sh


def chart_library() -> bool:
    """Whether uPlot was installed into the package (``make ui-assets``); without it the page
    leaves the history charts out and says so."""
    static = resources.files("hami.ui") / "static"
    return (static / CHART_JS).is_file() and (static / CHART_CSS).is_file()


def served_page() -> str:
    """The page the UI listener serves: assets from ``static/`` (allowed by its CSP). uPlot is
    named in a ``<meta>`` only: the script loads it when the history is first opened, so the
    first paint never waits for it."""
    head = '<link rel="stylesheet" href="static/style.css">'
    if chart_library():
        head += f'\n<meta name="hami-chart-library" content="static/{CHART_JS} static/{CHART_CSS}">'
    scripts = '<script src="static/app.js" defer></script>'
    return asset("index.html").replace(HEAD, head).replace(SCRIPTS, scripts)


def _script_json(doc: Any) -> str:
    """JSON that cannot end the ``<script>`` element it sits in (``<``, ``>``, ``&`` escaped)."""
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def snapshot_page(snapshot: dict) -> str:
    """One self-contained HTML file: the same page, its CSS and JS inline, ``snapshot`` (a dict
    with ``nodes``, ``pods``, ``pending``, ``quotas`` documents and a ``title``) embedded."""
    for key in ("nodes", "pods", "pending", "quotas"):
        if key not in snapshot:
            raise ValueError(f"snapshot: missing the {key!r} document")
    js = asset("app.js").replace("</", "<\\/")
    css = asset("style.css").replace("</", "<\\/")
    head = f"<style>\n{css}</style>"
    scripts = (
        f'<script type="application/json" id="hami-snapshot">{_script_json(snapshot)}</script>\n'
        f"<script>\n{messages_js()}</script>\n<script>\n{js}</script>"
    )
    return asset("index.html").replace(HEAD, head).replace(SCRIPTS, scripts)
