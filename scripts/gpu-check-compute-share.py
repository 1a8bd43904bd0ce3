#!/usr/bin/env python3
"""Compute-share accuracy on a real GPU: PyTorch matmul loops under `hami exec --gpucores N`.

Achieved share = matmul throughput under the limit / throughput of the same loop alone and
unlimited (so it measures what the user gets, not what NVML reports). Prints the same table
as bench/bench_compute_share.py. Skips (exit 0) when there is no GPU or no PyTorch.

    make -C native && python scripts/gpu-check-compute-share.py [--seconds 8]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTLE_S = 2.0

WORKER = r"""
import sys, time, torch
seconds, settle = float(sys.argv[1]), float(sys.argv[2])
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for _ in range(20):
    a @ b
torch.cuda.synchronize()
t0 = time.time(); n = 0; start_n = None; start_t = None
while time.time() - t0 < seconds:
    for _ in range(8):
        a @ b
    torch.cuda.synchronize()
    n += 8
    if start_n is None and time.time() - t0 >= settle:
        start_n, start_t = n, time.time()
print((n - start_n) / (time.time() - start_t))
"""


def has_gpu() -> str | None:
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run python: {exc}"
    if out.returncode != 0:
        return "PyTorch is not installed"
    if out.stdout.strip() != "True":
        return "no CUDA GPU visible to PyTorch"
    return None


def worker(seconds: float, limit: int | None = None, policy: str | None = None, cache: str | None = None,
           ) -> subprocess.Popen:
    argv = [sys.executable, "-c", WORKER, str(seconds), str(SETTLE_S)]
    env = dict(os.environ)
    if limit is not None:
        opts = ["--gpumem", "1T", "--gpucores", str(limit)] + (["--core-policy", policy] if policy else [])
        opts += ["--cache", cache] if cache else []
        env["PYTHONPATH"] = str(ROOT / "src")
        argv = [sys.executable, "-m", "hami", "exec", *opts, "--", *argv]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rate(p: subprocess.Popen) -> float:
    out, err = p.communicate(timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"worker failed: {err[-2000:]}")
    return float(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="run time per measurement (default 8)")
    args = ap.parse_args()
    why = has_gpu()
    if why:
        print(f"skipped: {why}")
        return 0
    if not (ROOT / "native" / "build" / "libvgpu.so").is_file():
        subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    base = rate(worker(args.seconds))
    rows = []
    for lim in (10, 30, 50, 70, 90):
        got = rate(worker(args.seconds, lim, "force")) / base * 100
        rows.append(("1 process, force", lim, got))
    for group in ((30, 70), (20, 30, 50)):
        procs = [worker(args.seconds, lim) for lim in group]
        for lim, p in zip(group, procs):
            rows.append((f"{len(group)} containers {'/'.join(map(str, group))}", lim, rate(p) / base * 100))
    print(f"Compute-share accuracy on {gpu_name()} (4096^2 fp16 matmul loop, sync every 8; "
          f"unlimited alone = {base:.0f} matmul/s)")
    print(f"{'scenario':<34} {'limit %':>7} {'achieved %':>10} {'|error|':>8}")
    for name, lim, got in rows:
        print(f"{name:<34} {lim:>7} {got:>10.1f} {abs(got - lim):>8.1f}")
    errs = [abs(got - lim) for _, lim, got in rows]
    print(f"mean |error| {sum(errs) / len(errs):.2f} points, worst {max(errs):.2f} points")
    return 0


def gpu_name() -> str:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "GPU"


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"(total {time.time() - t0:.0f} s)")
    sys.exit(rc)
