"""/api/v1/nodes for a MIG GPU both front ends publish: the extender's document with the DRA
claims' instances added (they were left out: the page and the metrics disagreed)."""

from __future__ import annotations

from hami.ui.model import nodes_document

from .test_dra_mig import A100
from .test_regcp_metrics import _mig_on_both


def test_the_extenders_mig_gpu_shows_the_dra_claims_instances_too():
    doc = nodes_document(_mig_on_both(), 0.0)
    [node] = doc["items"]
    a100 = [d for d in node["devices"] if d["uuid"] == A100]
    assert len(a100) == 1 and a100[0]["frontEnd"] == "extender"  # listed once
    d = a100[0]
    assert d["memoryMiB"]["allocated"] == 2000 + 19968 and d["slots"]["allocated"] == 2
    assert d["cores"]["allocated"] == 20 + 43
    assert {"profile": "3g.20gb", "start": 0, "size": 4} in d["slices"]
    assert d["claims"] == ["team-a/m"]
