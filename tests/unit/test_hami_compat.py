"""Drop-in compatibility with HAMi v2.10, as data (issue 20; cases in hami_compat_cases.py).

Each case runs once: our output must be the literal one written down. Where HAMi's output
differs, the case names a row of docs/compatibility.md, which must exist; where we offer HAMi's
behaviour as a setting (``knobs``), our output with it must equal HAMi's."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from hami.scheduler import options as O

from . import hami_compat_cases as K

COMPAT_DOC = (Path(__file__).resolve().parents[2] / "docs" / "compatibility.md").read_text(encoding="utf-8")
CASES = [(group, c) for group, cases in K.ALL.items() for c in cases]


@pytest.mark.parametrize("group,case", CASES, ids=[f"{g}: {c.name}" for g, c in CASES])
def test_case(group, case):
    got = K.outcome(case)
    assert K.matches(got, case.ours), f"{group} / {case.name}: got {got!r}, want {case.ours!r}"
    if case.agrees:
        assert not case.knobs and not case.doc, "a case that agrees with HAMi needs neither knobs nor a doc row"
        return
    assert case.doc, f"{case.name}: differs from HAMi without a docs/compatibility.md row"
    assert re.search(rf"\|\s*`{re.escape(case.doc)}`\s*\|", COMPAT_DOC), f"no row `{case.doc}` in compatibility.md"
    if case.knobs:
        with_knobs = K.outcome(case, **case.knobs)
        assert K.matches(with_knobs, case.hami), (
            f"{case.name} with {case.knobs}: got {with_knobs!r}, HAMi gives {case.hami!r}"
        )


def test_every_difference_row_is_backed_by_a_case():
    rows = set(re.findall(r"^\|\s*`([a-z0-9-]+)`\s*\|", COMPAT_DOC, flags=re.M))
    cased = {c.doc for _, c in CASES if c.doc}
    assert cased <= rows
    assert rows - cased <= {"float32", "limit-suffixes", "decision-write"}, rows - cased


def test_counts_add_up():
    checked, agreeing, documented = K.counts(K.CODEC_GROUPS)
    assert checked == agreeing + documented and checked >= 60
    checked, agreeing, documented = K.counts(K.DECISION_GROUPS)
    assert checked == agreeing + documented and documented >= 4


def test_scheduler_flag_gives_hamis_scores():
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    opts = O.options_from_args(parser.parse_args(["--score-with-request=false"]))
    assert opts.scheduler_config().request_in_scores is False
    assert O.options_from_args(parser.parse_args([])).scheduler_config().request_in_scores is True


# ------------------------------------------------------------------ integrations (docs/integrations.md)


@pytest.mark.parametrize(
    "argv,want",
    [
        (["-v=4"], ["-v"] * 4),
        (["--v=2", "--once"], ["-v", "-v", "--once"]),
        (["-v", "3", "--node-name", "n1"], ["-v"] * 3 + ["--node-name", "n1"]),
        (["-v"], ["-v"]),
        (["-v=0", "--metrics-bind-address=:9394"], ["--metrics-bind-address=:9394"]),
    ],
)
def test_klog_verbosity_flags_of_hamis_binaries(argv, want):
    from hami.cli import klog_verbosity

    assert klog_verbosity(argv) == want


def test_klog_verbosity_refuses_a_word():
    from hami.cli import klog_verbosity

    with pytest.raises(SystemExit, match="expected a number"):
        klog_verbosity(["-v=high"])


def test_vgpumonitor_is_hamis_monitor_on_hamis_port(tmp_path, monkeypatch, capsys):
    """Koordinator's hami-daemon runs `vGPUmonitor -v=4` with HOOK_PATH and NODE_NAME set."""
    from hami.cli import vgpumonitor_main
    from hami.monitor import command as M

    parser = argparse.ArgumentParser()
    M.add_arguments(parser)
    assert parser.parse_args([]).metrics_bind_address == ":9394"
    (tmp_path / "containers").mkdir()
    monkeypatch.setenv("HOOK_PATH", str(tmp_path))
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    assert vgpumonitor_main(["-v=4", "--once", "--no-nvml", "--standalone"]) == 0
    out = capsys.readouterr().out
    assert 'hami_monitor_regions{node="gpu-node-1",state="ok"' in out


def test_vgpumonitor_exports_hamis_metric_names_without_a_flag(monkeypatch):
    """The names Koordinator's guide lists for the hami-daemon's port 9394: its chart cannot
    pass --legacy-metrics (issue 28)."""
    import hami.cli as cli

    seen: list[list[str]] = []
    monkeypatch.setattr(cli, "main", lambda argv: seen.append(argv) or 0)
    assert cli.vgpumonitor_main(["-v=4"]) == 0
    assert cli.vgpumonitor_main(["--legacy-metrics"]) == 0
    assert seen == [["monitor", "-v", "-v", "-v", "-v", "--legacy-metrics"], ["monitor", "--legacy-metrics"]]


def test_the_chart_serves_the_monitor_on_hamis_port():
    import yaml

    values = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "charts/hami/values.yaml").read_text(encoding="utf-8")
    )
    assert values["devicePlugin"]["monitor"]["metricsPort"] == 9394


def test_pyproject_installs_the_vgpumonitor_command():
    import tomllib

    data = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    assert data["project"]["scripts"]["vGPUmonitor"] == "hami.cli:vgpumonitor_main"
