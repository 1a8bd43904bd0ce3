"""The page in English and Chinese (issue 27, item 4): every text of ``index.html`` and
``app.js`` is in the message catalogues (``static/messages.<language>.json``), which hold the same
keys and placeholders; the scans below fail on an English sentence or word left in the page's
files outside the catalogue."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from hami.ui import page

# What may stay in the files as it is: product, command and technical names, not prose.
NAMES = {"hami", "hami simulate", "DRA", "+DRA", "Bearer ", "Authorization", "HTTP 403", "use strict"}
PLACEHOLDER = re.compile(r"\{(\w+)\}")
WORDS = re.compile(r"[A-Za-z]{2,}")
PROSE = re.compile(r"[A-Za-z]{2,}[,.;:!?]?\s+[A-Za-z]{2,}|^[A-Z][a-z]+$|^[a-z]{3,} ")


def en() -> dict[str, str]:
    return page.catalogue("en")


@pytest.mark.parametrize("language", page.LANGUAGES)
def test_every_catalogue_has_every_key_with_the_same_placeholders(language):
    cat, base = page.catalogue(language), en()
    assert sorted(cat) == sorted(base), set(cat) ^ set(base)
    for key, text in base.items():
        assert sorted(PLACEHOLDER.findall(cat[key])) == sorted(PLACEHOLDER.findall(text)), (language, key)
        assert cat[key].strip(), (language, key)


def test_the_chinese_catalogue_is_a_translation():
    zh = page.catalogue("zh")
    # texts that may read the same in both: units and names
    same = {
        k for k in zh if k.startswith("unit.") and k not in ("unit.seconds",) or k in ("pods.pod", "pods.claimTitle")
    }
    untranslated = [k for k, v in zh.items() if v == en()[k] and k not in same and WORDS.search(v)]
    assert untranslated == []


class _Texts(HTMLParser):
    """Text and labelling attributes of the page outside <code>, <script>, <style>."""

    def __init__(self) -> None:
        super().__init__()
        self.skip = 0
        self.texts: list[str] = []
        self.attributes: list[tuple[str, str]] = []
        self.keys: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("code", "script", "style"):
            self.skip += 1
        for name, value in attrs:
            if name in ("title", "aria-label", "placeholder", "alt") and value:
                self.attributes.append((name, value))
            if name in ("data-i18n", "data-i18n-aria-label"):
                self.keys.append(value or "")

    def handle_endtag(self, tag):
        if tag in ("code", "script", "style"):
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip and data.strip():
            self.texts.append(data.strip())


def _html() -> _Texts:
    parsed = _Texts()
    parsed.feed(page.asset("index.html"))
    return parsed


def test_index_html_has_no_text_outside_the_catalogue():
    parsed = _html()
    assert [t for t in parsed.texts if WORDS.search(t) and t not in NAMES and not t.isdigit()] == []
    assert parsed.attributes == []  # labels come from data-i18n-aria-label
    assert sorted(k for k in parsed.keys if k not in en()) == []


def _js_literals() -> list[str]:
    js = page.asset("app.js")
    js = re.sub(r"^\s*//.*$|\s//\s.*$", "", js, flags=re.M)  # comments (none inside a literal)
    # a class list ("badge warn") is not text
    found = re.finditer(r'"((?:[^"\\\n]|\\.)*)"', js)
    return [m.group(1) for m in found if not js[: m.start()].endswith("class: ")]


def test_app_js_has_no_english_outside_the_catalogue():
    cat = en()
    prose = [s for s in _js_literals() if PROSE.search(s) and s not in NAMES and s not in cat]
    assert prose == []


def test_no_element_text_or_title_is_written_literally_in_app_js():
    js = page.asset("app.js")
    assert re.findall(r'(?:text|title|"aria-label"): "[^"]*[A-Za-z][^"]*"', js) == []


def test_every_key_app_js_asks_for_is_in_the_catalogue():
    js = page.asset("app.js")
    keys = re.findall(r'\bt\("([\w.]+)"', js)
    plurals = re.findall(r'\bplural\("([\w.]+)"', js)
    assert keys and plurals
    missing = [k for k in keys if k not in en()] + [p for p in plurals if f"{p}.other" not in en()]
    assert missing == []


def test_the_scan_catches_an_english_string():
    # the scans must be able to fail: an English literal and an English heading are found
    assert PROSE.search("Refresh every") and PROSE.search("Updated") and PROSE.search("no live usage")
    parsed = _Texts()
    parsed.feed('<h2>Pods and their grants</h2><p title="a label">x</p><code>kubectl get pods</code>')
    assert parsed.texts == ["Pods and their grants", "x"] and parsed.attributes == [("title", "a label")]


def test_units_of_every_vendor_are_in_both_languages():
    import importlib
    import inspect
    import pkgutil

    import hami.vendors

    units = {"percent", "MiB", "GiB", "cores"}
    for info in pkgutil.iter_modules(hami.vendors.__path__):
        module = importlib.import_module(f"hami.vendors.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if isinstance(unit := cls.__dict__.get("cores_unit"), str):
                units.add(unit)
    assert {"compute units", "NeuronCores", "slices"} <= units  # AMD, AWS Neuron, Enflame
    units.add("AI cores")  # Ascend's core_unit(device) in its vNPU mode
    for language in page.LANGUAGES:
        cat = page.catalogue(language)
        assert [u for u in units if f"unit.{u}" not in cat] == [], language


def test_the_served_page_and_the_snapshot_carry_the_catalogues():
    js = page.messages_js()
    assert js.startswith("window.HAMI_MESSAGES = ")
    doc = json.loads(js.split("=", 1)[1].strip().rstrip(";"))
    assert sorted(doc) == sorted(page.LANGUAGES) and doc["zh"]["nodes.title"] == "节点与设备"
    assert page.app_js().startswith(js) and page.app_js().endswith(page.asset("app.js"))  # read first, one request
    snap = page.snapshot_page({"nodes": {}, "pods": {}, "pending": {}, "quotas": {}, "title": "t"})
    assert "window.HAMI_MESSAGES" in snap and "</script" not in js
