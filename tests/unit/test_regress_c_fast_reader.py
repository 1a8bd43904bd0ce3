"""hami simulate's fast readers (libyaml, json) against hami.safeyaml: for any text, the fast
path reads the same documents safeyaml reads, or declines (None) and leaves the text to safeyaml."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami import safeyaml
from hami.sim import command
from hami.safeyaml import fast_docs as _fast_docs
from hami.sim.command import _yaml_docs

pytestmark = pytest.mark.skipif(not hasattr(yaml, "CSafeLoader"), reason="PyYAML without libyaml")


def _safe(text: str):
    try:
        return ("docs", safeyaml.load_all(text, "f"))
    except Exception as exc:  # noqa: BLE001 - any outcome of safeyaml is what the fast path must match
        return ("error", type(exc).__name__)


def _agrees(text: str, exact: bool = True) -> None:
    fast = _fast_docs(text)
    if fast is None:
        return  # declined: safeyaml reads it, whatever it says
    got = _safe(text)
    if not exact and got == ("error", "YamlInputError"):
        return  # libyaml is laxer on some syntax PyYAML refuses (a block scalar's "|#"): read, not misread
    assert got == ("docs", fast), repr(text[:300])


# ------------------------------------------------------------------ what was read differently


@pytest.mark.parametrize(
    "text",
    [
        "a:\t1\n",  # libyaml takes a tab PyYAML refuses
        '{\n\t"kind": "Pod",\n\t"metadata": {"name": "p"}\n}\n',  # JSON indented with tabs (jq --tab)
        "a: b\tc\n",
        '{"a": "x\x85y"}',  # NEL: json keeps it, PyYAML folds it to a space
        '{"a": "x\x7fy"}',  # DEL: json takes it, PyYAML refuses it
        '{"a": "\x9b"}',
        '{"a": "\\ud83d\\ude00"}',  # json joins the surrogate pair, PyYAML keeps two characters
        "kind: Pod\n---\n\ufeffkind: Node\n",  # a BOM mid-file: libyaml skips it, PyYAML keeps it in the key
        "a: !\n",  # an empty node with a non-specific tag: libyaml '', PyYAML None
    ],
)
def test_what_pyyaml_reads_otherwise_is_left_to_safeyaml(text):
    _agrees(text)
    assert _fast_docs(text) is None


@pytest.mark.parametrize("text", ["a: !!bool abc\n", "a: !!int ''\n", "a: !!int\n"])
def test_a_tag_pyyaml_cannot_construct_is_one_line_not_a_traceback(text):
    assert _fast_docs(text) is None
    with pytest.raises(command.SimulationError, match=r"^pods.yaml: not valid YAML"):
        _yaml_docs(text, "pods.yaml")


def test_a_bad_tag_in_the_pods_file_is_an_error_line(tmp_path, capsys):
    nodes, pods = tmp_path / "nodes.yaml", tmp_path / "pods.yaml"
    nodes.write_text("kind: Node\nmetadata: {name: n}\n")
    pods.write_text("kind: Pod\nmetadata: {name: p, namespace: d}\nspec:\n  hostNetwork: !!bool maybe\n")
    parser = command.argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(["--nodes", str(nodes), "--pods", str(pods)])
    assert command.run(args) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"hami simulate: {pods}: not valid YAML") and "Traceback" not in err


def test_without_libyaml_the_fast_path_leaves_yaml_to_safeyaml(monkeypatch):
    # a copy of the module as PyYAML without libyaml builds it: the YAML path would parse the
    # text twice in pure Python (slower than safeyaml's one read) for nothing
    monkeypatch.delattr(yaml, "CSafeLoader")
    spec = importlib.util.spec_from_file_location("hami._safeyaml_without_libyaml", safeyaml.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    assert copy.fast_docs("kind: Pod\nmetadata: {name: p}\n") is None
    assert copy.fast_docs('{"kind": "Pod"}') == [{"kind": "Pod"}]  # json needs no libyaml


# ------------------------------------------------------------------ differential, at random

_SCALARS = [
    "1",
    "-0",
    "+12",
    "0x1F",
    "0o17",
    "017",
    "0b101",
    "1_000",
    "190:20:30",
    "1.5",
    "1.0e+3",
    "1e3",
    ".5",
    "-.inf",
    ".NaN",
    "685.230_15e+03",
    "yes",
    "No",
    "on",
    "OFF",
    "y",
    "n",
    "~",
    "null",
    "Null",
    "true",
    "2001-12-14",
    "2001-12-14t21:59:43.10-05:00",
    "12:30",
    "=",
    "<<",
    "x",
    "a b",
    "'q ''x'''",
    '"d\\t\\u00e9"',
    '"\\ud800"',
    "é",
    "1Gi",
    "500m",
    "9" * 65,
    "!!str 1",
    "!!int 7",
    "!!float 1",
    "!!bool yes",
    "!!null ''",
    "!!binary aGk=",
    "!foo x",
    "&x 1",
    "*x",
    "|\n  lit\n  eral",
    ">\n  fol\n\n  ded",
    "[]",
    "{}",
    "",
]
_KEYS = ["a", "b", "'a'", '"k"', "<<", "1", "~", "? c", "a b", "x" * 1030]


@st.composite
def _yaml_text(draw) -> str:
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        indent = "  " * draw(st.integers(0, 3))
        kind = draw(st.sampled_from(["map", "seq", "flow", "doc", "raw"]))
        if kind == "map":
            lines.append(f"{indent}{draw(st.sampled_from(_KEYS))}: {draw(st.sampled_from(_SCALARS))}")
        elif kind == "seq":
            lines.append(f"{indent}- {draw(st.sampled_from(_SCALARS))}")
        elif kind == "flow":
            items = draw(st.lists(st.sampled_from(_SCALARS[:40]), max_size=4))
            if draw(st.booleans()):
                lines.append(f"{indent}{draw(st.sampled_from(_KEYS[:4]))}: [{', '.join(items)}]")
            else:
                keys = draw(st.lists(st.sampled_from(_KEYS[:6]), min_size=len(items), max_size=len(items)))
                lines.append(f"{indent}{{{', '.join(f'{k}: {v}' for k, v in zip(keys, items))}}}")
        elif kind == "doc":
            lines.append(draw(st.sampled_from(["---", "...", "--- ", "%YAML 1.1\n---", "# c"])))
        else:
            lines.append(draw(st.text(alphabet=" \t-:,[]{}#&*!|>'\"\\%@`x1.\u0085\u2028\ufeff\x7f", max_size=12)))
    end = draw(st.sampled_from(["\n", "\r\n", ""]))
    return end.join(lines) + end


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**70), 10**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_yaml_text())
def test_random_yaml_is_read_as_safeyaml_reads_it(text):
    _agrees(text, exact=False)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.text(max_size=8), _JSON, max_size=5),
    st.sampled_from([None, 0, 2, "\t", " "]),
    st.booleans(),
    st.sampled_from(["", " ", "\n", " x", "\n{}", "\n---\n"]),
)
def test_random_json_is_read_as_safeyaml_reads_it(tree, indent, ascii_only, tail):
    text = json.dumps(tree, indent=indent, ensure_ascii=ascii_only) + tail
    _agrees(text)
    fast = _fast_docs(text)
    if (
        fast is not None
        and tail.strip() == ""
        and not any(isinstance(v, float) and not math.isfinite(v) for v in tree.values())
    ):
        assert fast == [tree] or safeyaml.load_all(text, "f") == fast


@pytest.mark.parametrize("closed", [True, False])
def test_standard_input_closed_is_an_error_line(monkeypatch, capsys, tmp_path, closed):
    # hami simulate --pods - <&- : Python starts with sys.stdin None
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("kind: Node\nmetadata: {name: n}\n")
    if closed:
        monkeypatch.setattr(command.sys, "stdin", None)
    else:
        stream = open(tmp_path / "empty", "w+")  # noqa: SIM115 - closed below, as a closed stdin is
        stream.close()
        monkeypatch.setattr(command.sys, "stdin", stream)
    parser = command.argparse.ArgumentParser()
    command.add_arguments(parser)
    assert command.run(parser.parse_args(["--nodes", str(nodes), "--pods", "-"])) == 1
    assert capsys.readouterr().err == "hami simulate: (stdin): cannot read (standard input is closed)\n"
