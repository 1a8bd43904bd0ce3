"""HAMi's scheduler.podDisruptionBudget as HAMi's chart reads it (found by a regression review of
the chart's HAMi values): its values.yaml has ``minAvailable: 1`` with ``# maxUnavailable: 1``
below it, and its template uses maxUnavailable whenever the key is there. A copied file with that
line uncommented, or ``--set scheduler.podDisruptionBudget.maxUnavailable=1`` over it, stopped the
install here ("give minAvailable or maxUnavailable, not both"), and so did the usual way to drop a
copied key (``minAvailable: null``). Rendered with the helm that `make kube` installs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from hami_devkit.binaries import bin_dir

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"
HELM = bin_dir() / "helm"

pytestmark = pytest.mark.skipif(not HELM.is_file(), reason=f"helm not installed in {HELM.parent} (make kube)")


def budget(tmp_path: Path, pdb: dict) -> dict:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump({"scheduler": {"replicas": 2, "podDisruptionBudget": pdb}}))
    args = [str(HELM), "template", "t", str(CHART), "--kube-version", "1.34.4", "-f", str(f)]
    args += ["-s", "templates/scheduler/pdb.yaml"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    (pdb_doc,) = [d for d in yaml.safe_load_all(result.stdout) if d and d["metadata"]["name"] == "t-hami-scheduler"]
    spec = pdb_doc["spec"]
    return {k: spec[k] for k in ("minAvailable", "maxUnavailable") if k in spec}


@pytest.mark.parametrize(
    "pdb, expected",
    [
        ({"minAvailable": 1, "maxUnavailable": 1}, {"maxUnavailable": 1}),
        ({"minAvailable": None, "maxUnavailable": 1}, {"maxUnavailable": 1}),
        ({"minAvailable": None}, {"minAvailable": 1}),
        ({"maxUnavailable": None, "minAvailable": 0}, {"minAvailable": 0}),
        ({"maxUnavailable": "50%"}, {"maxUnavailable": "50%"}),
        ({}, {"minAvailable": 1}),
    ],
    ids=["both", "min-null", "only-null", "max-null", "percent", "unset"],
)
def test_the_budget_is_read_as_hamis_chart_reads_it(tmp_path, pdb, expected):
    assert budget(tmp_path, pdb) == expected
