"""The short soak of the DRA node agent (bench/bench_soak.py --dra-cycles is the long one):
claims prepared and unprepared over the plugin's gRPC service leave no checkpoint entry, no CDI
spec and no region directory behind, and no file descriptor. And the checks of the DRA front
end's soak (tests/integration/test_soak.py): what counts as a leaked claim, and the per-GPU
figures it compares with the scheduler's view."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_soak.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_soak", BENCH)
    bench = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    return bench


def test_claim_churn_leaves_nothing_behind():
    bench = _bench()
    report = bench.dra_agent_soak(200, log=lambda *_: None)
    assert report.cycles == 200 and report.waves == 25
    assert not report.leaked, report.leaked
    fds = [s[2] for s in report.samples]
    # no growth: never above the first sample, and flat over the second half (descriptors an
    # earlier test of the same process left to the garbage collector may close during the first)
    later = fds[len(fds) // 2 :]
    assert max(fds) <= fds[0] and max(later) == min(later), f"open fds changed under churn: {fds}"


def _claim(name: str, reserved: list[str], results: list[tuple[str, str, str]] | None) -> dict:
    status: dict = {}
    if results is not None:
        status["allocation"] = {
            "devices": {
                "results": [
                    {
                        "driver": driver,
                        "pool": "n1",
                        "device": device,
                        "consumedCapacity": {"memory": memory, "cores": "10", "shares": "1"},
                    }
                    for driver, device, memory in results
                ]
            }
        }
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": n, "uid": f"u-{n}"} for n in reserved]
    return {"metadata": {"namespace": "ns", "name": name}, "status": status}


def test_a_claim_reserved_for_a_deleted_pod_or_allocated_for_nobody_is_a_leak():
    bench = _bench()
    claims = [
        _claim("live", ["p1"], [("gpu.hami.io", "gpu-0", "1000Mi")]),
        _claim("orphan", ["gone"], [("gpu.hami.io", "gpu-0", "1000Mi")]),
        _claim("idle", [], [("gpu.hami.io", "gpu-1", "1000Mi")]),
        _claim("pending", [], None),  # not allocated yet: not a leak
    ]
    assert bench.leaked_claims(claims, {"p1"}) == [
        "claim ns/orphan reserved for deleted pod(s) ['gone']",
        "claim ns/idle allocated, reserved for nobody",
    ]


def test_the_truth_sums_shares_memory_and_cores_per_gpu_of_our_driver_only():
    bench = _bench()
    claims = [
        _claim("a", ["p1"], [("gpu.hami.io", "gpu-0", "1000Mi")]),
        _claim("b", ["p2"], [("gpu.hami.io", "gpu-0", str(1500 << 20))]),
        _claim("c", ["p3"], [("other.example.com", "gpu-0", "9Gi")]),
    ]
    assert bench.dra_truth_from_claims(claims) == {("n1", "gpu-0"): (2, 2500, 20)}
    doc = {
        "items": [
            {
                "name": "n1",
                "devices": [
                    {
                        "index": 0,
                        "frontEnd": "dra",
                        "slots": {"allocated": 2},
                        "memoryMiB": {"allocated": 2500},
                        "cores": {"allocated": 20},
                    },
                    {
                        "index": 1,
                        "frontEnd": "dra",
                        "slots": {"allocated": 0},
                        "memoryMiB": {"allocated": 0},
                        "cores": {"allocated": 0},
                    },
                ],
            },
            {"name": "elsewhere", "devices": []},
        ]
    }
    assert bench.dra_ledger_from_ui(doc, {"n1"}) == {("n1", "gpu-0"): (2, 2500, 20)}
