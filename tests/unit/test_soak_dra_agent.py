"""The short soak of the DRA node agent (bench/bench_soak.py --dra-cycles is the long one):
claims prepared and unprepared over the plugin's gRPC service leave no checkpoint entry, no CDI
spec and no region directory behind, and no file descriptor."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_soak.py"


def test_claim_churn_leaves_nothing_behind():
    spec = importlib.util.spec_from_file_location("bench_soak", BENCH)
    bench = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    report = bench.dra_agent_soak(200, log=lambda *_: None)
    assert report.cycles == 200 and report.waves == 25
    assert not report.leaked, report.leaked
    fds = [s[2] for s in report.samples]
    assert max(fds) == min(fds), f"open fds changed under churn: {fds}"
