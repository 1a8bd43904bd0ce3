"""The Grafana dashboard only queries metrics the project exports (and uses their real labels)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hami.monitor.exporter import METRICS as MONITOR
from hami.scheduler.metrics import SIGNALS, metric_names

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "hami" / "dashboards" / "hami.json"
PROMQL_WORDS = {
    "sum",
    "count",
    "avg",
    "min",
    "max",
    "topk",
    "bottomk",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "rate",
    "irate",
    "increase",
    "histogram_quantile",
    "vector",
    "label_values",
    "offset",
    "bool",
    "abs",
    "clamp_min",
    "clamp_max",
    "time",
    "le",
}


def exported() -> dict[str, set[str]]:
    """Every series name we export -> its labels (histogram/counter sample suffixes included)."""
    names: dict[str, set[str]] = {n: set(ls) for n, ls in {**MONITOR, **metric_names()}.items()}
    for n, ls in SIGNALS.items():
        base = n.removesuffix("_total")
        if n.endswith("_total"):
            names[n] = set(ls)
        elif n.endswith(("_seconds",)) and "cache_age" not in n:
            for suffix in ("_bucket", "_sum", "_count"):
                names[base + suffix] = set(ls) | ({"le"} if suffix == "_bucket" else set())
    return names


def expressions(dashboard: dict) -> list[str]:
    out = []

    def walk(panels):
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", ()) if t.get("expr"))
            walk(p.get("panels", ()))

    walk(dashboard["panels"])
    for var in dashboard["templating"]["list"]:
        q = var.get("query")
        if isinstance(q, dict):
            out.append(q["query"])
    return out


def referenced(expr: str) -> list[tuple[str, set[str]]]:
    """``(metric, labels it is filtered on)`` for every metric in a PromQL expression (or label_values())."""
    expr = re.sub(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_]+)\s*\)", r'\1{\2=""}', expr)
    labels = set(re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr))
    grouped = {l.strip() for group in labels for l in group.split(",") if l.strip()}
    out = []
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?", re.sub(r'"[^"]*"|\[[^\]]*\]', "", expr)):
        name, matcher = m.group(1), m.group(2) or ""
        if name in PROMQL_WORDS or name in grouped or re.fullmatch(r"[0-9.]+", name):
            continue
        out.append((name, set(re.findall(r"([a-zA-Z_]+)\s*=~?", matcher))))
    return out


def test_dashboard_is_valid_json_with_a_templated_datasource():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["templating"]["list"][0]["type"] == "datasource"
    assert len(expressions(dash)) > 20


def test_every_query_names_an_exported_metric_with_real_labels():
    names = exported()
    dash = json.loads(DASHBOARD.read_text())
    problems = []
    for expr in expressions(dash):
        refs = referenced(expr)
        assert refs, f"no metric found in {expr!r}"
        for name, labels in refs:
            if name not in names:
                problems.append(f"{name} (in {expr!r}) is not exported")
            elif not labels <= names[name]:
                problems.append(f"{name} has no label(s) {sorted(labels - names[name])} (in {expr!r})")
        grouped = {l.strip() for g in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr) for l in g.split(",")}
        for label in grouped - {"le", ""}:
            if not any(label in names.get(n, set()) for n, _ in refs):
                problems.append(f"grouping label {label!r} exists on none of the metrics of {expr!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "expr, bad",
    [
        ("sum(hami_gpu_memory_used_bytes)", "hami_gpu_memory_used_bytes"),
        ('hami_vgpu_memory_used_bytes{nodeid="x"}', "nodeid"),
    ],
)
def test_the_checker_catches_wrong_names_and_labels(expr, bad):
    names = exported()
    refs = referenced(expr)
    assert any(n not in names or not labels <= names[n] for n, labels in refs), bad
