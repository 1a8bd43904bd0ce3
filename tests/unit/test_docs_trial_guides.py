"""The user guides hold as a new user follows them (README.md and the install, simulate,
configuration, concepts and troubleshooting pages): every link and anchor resolves, every
`hami ...` command line they show parses with the flags and values it shows, the pod of
docs/install.md is placed with the limits it asks for, and the configuration table's keys and
defaults are those of charts/hami/values.yaml. Found by a trial of the docs: a link to a section
testing.md never had, a pod the guide then `kubectl exec`s into that was only a resources
fragment."""

from __future__ import annotations

import argparse
import importlib
import json
import re
from pathlib import Path

import pytest
import yaml

from hami.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
GUIDES = (
    "README.md",
    "docs/install.md",
    "docs/simulate.md",
    "docs/configuration.md",
    "docs/concepts.md",
    "docs/troubleshooting.md",
)


def _slug(heading: str) -> str:
    # GitHub's anchors: lower case, punctuation dropped (not '-' or '_'), spaces to hyphens
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#+\s+(.*?)\s*$", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


@pytest.mark.parametrize("guide", GUIDES)
def test_every_link_and_anchor_of_a_guide_resolves(guide):
    doc = ROOT / guide
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert broken == []


def _command_lines(text: str) -> list[str]:
    # `hami simulate --example mixed`, not a message such as `hami simulate: warning: …`
    lines = [m.group(1) for m in re.finditer(r"`(hami [a-z-]+(?: [^`]*)?)`", text)]
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("hami "):
                lines.append(line)
    return lines


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"hami {command}")
    importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
    return parser


def _problems(line: str) -> list[str]:
    words = line.split()
    command = words[1]
    if command not in COMMANDS:
        return [f"{line}: no command {command!r}"]
    actions = {o: a for a in _parser(command)._actions for o in a.option_strings}
    out = []
    for i, word in enumerate(words[2:], start=2):
        if word == "--":  # hami exec: the command to run follows
            break
        word = word.strip("[]")
        if not word.startswith("--"):
            continue
        flag, eq, value = word.partition("=")
        action = actions.get(flag)
        if action is None:
            out.append(f"{line}: {flag} is not a flag of hami {command}")
            continue
        if not eq and i + 1 < len(words):
            value = words[i + 1].strip("[]")
        # a literal value (or a|b|c of them), not a placeholder such as N, MIB, ... or <x>
        if action.choices and value and re.fullmatch(r"[a-z0-9][a-z0-9,|-]*", value):
            choices = {str(c) for c in action.choices}
            out += [f"{line}: {flag} {v!r} not in {sorted(choices)}" for v in value.split("|") if v not in choices]
    return out


@pytest.mark.parametrize("guide", GUIDES)
def test_every_hami_command_line_of_a_guide_parses(guide):
    lines = _command_lines((ROOT / guide).read_text())
    problems = [p for line in lines for p in _problems(line)]
    assert problems == []


def test_the_command_lines_are_found():
    # the check above is not vacuous: the guides show these, flags and values included
    lines = [line for guide in GUIDES for line in _command_lines((ROOT / guide).read_text())]
    assert any(line.startswith("hami simulate --nodes nodes.yaml --pods pods.yaml") for line in lines)
    assert any(line.startswith("hami exec --gpumem 4G") for line in lines)
    assert any("--output table|json|html" in line for line in lines)
    assert _problems("hami simulate --output yaml") and _problems("hami simulate --no-such-flag")


def test_the_install_guides_gpu_pod_is_placed_with_the_limits_it_asks_for(tmp_path, capsys):
    text = (ROOT / "docs/install.md").read_text()
    section = text[text.index("\n## Install\n") :]
    pod = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    assert pod["kind"] == "Pod" and pod["metadata"]["name"] == "gpu-pod"  # step 5 execs into it by name
    pods = tmp_path / "gpu-pod.yaml"
    pods.write_text(yaml.safe_dump(pod))
    nodes = ROOT / "src/hami/sim/examples/nodes.yaml"
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "-o", "json"]) == 0
    (placed,) = json.loads(capsys.readouterr().out)["pods"]
    assert placed["status"] == "scheduled"
    (device,) = placed["containers"][0]["devices"]
    assert (device["usedmem"], device["usedcores"]) == (3000, 30)


def _value(values: dict, key: str):
    node = values
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def _table_rows(text: str):
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| `") and len(cells) >= 3:
            yield cells[0], cells[1]


def _keys(cell: str, values: dict) -> list[str]:
    keys: list[str] = []
    for name in re.findall(r"`([^`]+)`", cell):
        if keys and "." in keys[0] and (name.startswith(".") or ("." not in name and name not in values)):
            # `a.b.c`, `.d` or `d`: a sibling of the first
            name = keys[0].rsplit(".", 1)[0] + "." + name.lstrip(".")
        if "{" in name:  # `a.b.{c,d}`
            stem, rest = name.split("{")
            keys += [stem + part for part in rest.rstrip("}").split(",")]
        else:
            keys.append(name)
    return keys


def test_the_configuration_tables_keys_exist_and_their_defaults_are_the_charts():
    values = yaml.safe_load((ROOT / "charts/hami/values.yaml").read_text())
    text = (ROOT / "docs/configuration.md").read_text()
    chart_table = text[text.index("## Chart values") : text.index("## `device-config.yaml`")]
    missing, wrong, checked = [], [], 0
    for key_cell, default_cell in _table_rows(chart_table):
        keys = [k for k in _keys(key_cell, values) if "<" not in k and not k.endswith(".*")]
        for key in keys:
            try:
                _value(values, key)
            except KeyError:
                missing.append(key)
        # a default stated as exactly one literal per key (`true`, `""`, `[-v=2]`, ...)
        literals = re.findall(r"`([^`]*)`", default_cell)
        if len(literals) != len(keys) or re.sub(r"`[^`]*`|[, ]", "", default_cell):
            continue
        for key, literal in zip(keys, literals, strict=True):
            if key in missing or "…" in literal:  # `…/gpumem`: shorthand of the key before
                continue
            actual, stated = _value(values, key), yaml.safe_load(literal)
            if isinstance(actual, (list, dict)) and isinstance(stated, str):
                continue  # a summary of a structure (`nvidia.com/gpu:NoSchedule`)
            checked += 1
            if actual != stated:
                wrong.append((key, literal, actual))
    assert missing == []
    assert wrong == []
    assert checked >= 60
