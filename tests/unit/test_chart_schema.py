"""charts/hami/values.schema.json is derived from values.yaml by the rules below (helm checks
values against it at install, upgrade, lint and template): a switch is a boolean (the templates
take the string "false", which Argo CD's forced strings produce, for true), a count or a port an
integer (or a string of digits), a few fields are enums. Regenerate after changing values.yaml:
``python tests/unit/test_chart_schema.py``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"
SCHEMA = CHART / "values.schema.json"

ENUMS = {  # (frontEnd is checked by the templates, with a message naming the choices)
    ("devicePlugin", "service", "type"): ["ClusterIP", "NodePort", "LoadBalancer"],
    ("scheduler", "service", "type"): ["ClusterIP", "NodePort", "LoadBalancer"],
}
#: numbers that may have a fraction (a scaling, seconds, a rate), and fields Kubernetes also takes as strings ("10%")
NUMBERS = {"deviceMemoryScaling", "deviceCoreScaling", "lockReleaseDelay", "qps"}
FREE = {"maxUnavailable", "maxSurge"}


def _node(value, path: tuple[str, ...]):
    if path in ENUMS:
        return {"enum": ENUMS[path]}
    if path and path[-1] in FREE:
        return None
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, (int, float)) and path and path[-1] in NUMBERS:
        return {"type": ["number", "string"], "pattern": r"^[0-9]+(\.[0-9]+)?$"}
    if isinstance(value, int):
        return {"type": ["integer", "string"], "pattern": "^[0-9]+$"}
    if isinstance(value, dict):
        props = {k: p for k, p in ((k, _node(v, (*path, k))) for k, v in value.items()) if p}
        return {"type": "object", "properties": props} if props else {"type": "object"}
    return None


def schema() -> dict:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return {
        "$schema": "https://json-schema.org/draft-07/schema#",
        "description": "hami chart values, generated from values.yaml by tests/unit/test_chart_schema.py: switches "
        "are booleans, counts and ports integers, a few fields enums; the rest is checked by the templates",
        **_node(values, ()),
    }


def render() -> str:
    return json.dumps(schema(), indent=2) + "\n"


def test_the_schema_is_the_one_values_yaml_gives():
    assert SCHEMA.read_text() == render(), "values.yaml changed: run python tests/unit/test_chart_schema.py"


def test_the_schema_types_what_it_should():
    props = schema()["properties"]
    assert props["scheduler"]["properties"]["leaderElect"] == {"type": "boolean"}
    assert props["scheduler"]["properties"]["replicas"]["type"] == ["integer", "string"]
    assert "frontEnd" not in props
    assert props["devicePlugin"]["properties"]["deviceMemoryScaling"]["type"] == ["number", "string"]


def _helm() -> str | None:
    found = sorted(Path.home().glob(".cache/hami/kube/*/bin/helm"))
    return str(found[-1]) if found else None


@pytest.mark.parametrize(
    "setting, field",
    [
        (("--set-string", "scheduler.leaderElect=false"), "/scheduler/leaderElect"),
        (("--set", "scheduler.replicas=two"), "/scheduler/replicas"),
        (("--set", "devicePlugin.enabled=no"), "/devicePlugin/enabled"),
        (("--set", "devicePlugin.service.type=Nodeport"), "/devicePlugin/service/type"),
    ],
)
def test_helm_refuses_wrong_types_by_field(setting, field):
    helm = _helm()
    assert helm, "helm is installed by `make kube` (the tests' install step)"
    out = subprocess.run(
        [helm, "template", "x", str(CHART), "--kube-version", "1.34.4", *setting], capture_output=True, text=True
    )
    assert out.returncode != 0 and field in out.stderr, out.stderr
    ok = subprocess.run(
        [
            helm,
            "template",
            "x",
            str(CHART),
            "--kube-version",
            "1.34.4",
            "--set",
            "devicePlugin.deviceMemoryScaling=1.5",
        ],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr


if __name__ == "__main__":
    SCHEMA.write_text(render())
    print(f"wrote {SCHEMA}")
