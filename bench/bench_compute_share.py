"""Compute-share accuracy and launch-path overhead of libvgpu's limiter, on the fake GPU.

1. Accuracy: saturating `cshare_load` processes (1 ms fake kernels, at most 8 in flight)
   under CUDA_DEVICE_SM_LIMIT; achieved share = the process's device time / elapsed, from
   the fake GPU's own accounting, over the steady window (first 0.5 s excluded); settling =
   time to the first 100 ms window within 5 points of the limit; "worst 100ms" = largest
   deviation of any 100 ms window after settling (oscillation and noise together).
2. Overhead: ns per cuLaunchKernel of zero-length kernels (best of 5 interleaved runs) for
   the fake driver alone, libvgpu without a compute limit, and with a limit that does not
   bind (default policy, GPU not shared) or is disabled.

    make -C native && .venv/bin/python bench/bench_compute_share.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "native"))

from cshare import BUILD, LIB, LOAD, base_env, start  # noqa: E402

SETTLE_MS = 500
DEPTH = 8  # launches in flight (the tests use 32 to ride out a saturated CPU)
REPEATS = 5
LAUNCHES = 200_000


def row(name: str, lim: int, tr, a: float, b: float) -> tuple[str, int, float, float, float]:
    """Mean share over [a, b], settling time, worst 100 ms window after settling."""
    worst = max(abs(s - lim) for _, s in tr.windows(a, b))
    return (name, lim, tr.share(a, b), tr.settling_s(lim), worst)


def accuracy(tmp: Path) -> list[tuple[str, int, float, float, float]]:
    env = base_env(BUILD / "fakegpu")
    rows = []
    singles = [
        (lim, start(env, tmp / f"m{lim}", tmp / f"f{lim}.cache", limit=lim, policy="force", seconds=3, depth=DEPTH))
        for lim in (10, 30, 50, 70, 90)
    ]
    for lim, task in singles:
        tr = task.trace()
        rows.append(row("1 process, force", lim, tr, tr.start + SETTLE_MS, tr.end - 50))
    for group in ((30, 70), (20, 30, 50)):
        m = tmp / ("m" + "_".join(map(str, group)))
        tasks = [
            start(env, m, tmp / f"g{'_'.join(map(str, group))}-{lim}.cache", limit=lim, seconds=3, depth=DEPTH)
            for lim in group
        ]
        traces = [t.trace() for t in tasks]
        a, b = max(t.start for t in traces), min(t.end for t in traces)
        for lim, tr in zip(group, traces):
            rows.append(row(f"{len(group)} containers {'/'.join(map(str, group))}", lim, tr, a + SETTLE_MS, b - 50))
    for kind in ("graph", "coop", "ex_ptsz"):
        tr = start(
            env, tmp / f"k{kind}", tmp / f"k{kind}.cache", limit=40, policy="force", kind=kind, seconds=2, depth=DEPTH
        ).trace()
        rows.append(row(f"1 process, force, {kind}", 40, tr, tr.start + SETTLE_MS, tr.end - 50))
    return rows


def overhead(tmp: Path) -> dict[str, float]:
    base = base_env(BUILD / "fakegpu")
    base.update(FAKEGPU_STATE_DIR=str(tmp / "bench-machine"), LIBCUDA_LOG_LEVEL="0")
    lib = dict(base, LD_PRELOAD=str(LIB))
    configs = {
        "fake driver alone": base,
        "libvgpu, no compute limit": dict(lib, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp / "o1.cache")),
        "libvgpu, limit 50, not binding (default policy, GPU not shared)": dict(
            lib, CUDA_DEVICE_SM_LIMIT="50", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp / "o2.cache")
        ),
        "libvgpu, limit 50, policy disable": dict(
            lib,
            CUDA_DEVICE_SM_LIMIT="50",
            GPU_CORE_UTILIZATION_POLICY="disable",
            CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp / "o3.cache"),
        ),
    }
    best: dict[str, float] = {}
    for _ in range(REPEATS):
        for name, env in configs.items():
            out = subprocess.run(
                [str(LOAD), "bench", str(LAUNCHES)], env=env, capture_output=True, text=True, timeout=300, check=True
            ).stdout
            ns = float(out.split()[1])
            best[name] = min(best.get(name, ns), ns)
    return best


def main() -> int:
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows = accuracy(tmp)
        over = overhead(tmp)
    print("Compute-share accuracy on the fake GPU (1 ms kernels, NVML sample period 50 ms)")
    print(f"{'scenario':<34} {'limit %':>7} {'achieved %':>10} {'|error|':>8} {'settling s':>10} {'worst 100ms':>11}")
    for name, lim, got, settle, worst in rows:
        print(f"{name:<34} {lim:>7} {got:>10.1f} {abs(got - lim):>8.1f} {settle:>10.2f} {worst:>11.1f}")
    errs = [abs(r[2] - r[1]) for r in rows]
    print(
        f"mean |error| {sum(errs) / len(errs):.2f} points, worst {max(errs):.2f} points, "
        f"worst settling {max(r[3] for r in rows):.2f} s, "
        f"worst 100 ms window after settling {max(r[4] for r in rows):.1f} points"
    )
    print()
    print("Launch-path cost (ns per cuLaunchKernel, best of 5; added = vs the fake driver alone)")
    ref = over["fake driver alone"]
    for name, ns in over.items():
        print(f"{name:<66} {ns:>8.1f} ns   added {ns - ref:>+7.1f} ns")
    print(f"(total bench time {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
