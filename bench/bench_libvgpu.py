"""Added cost of libvgpu per cuLaunchKernel (no compute limit) and per cuMemAlloc_v2 +
cuMemFree_v2 pair, against the same calls to the fake driver without the library.

Measured by a small C driver (native/bench/bench_driver.c) so Python overhead does not
blur nanoseconds; each configuration runs several times, interleaved, best run kept.
Targets (docs/libvgpu.md): launch fast path < 50 ns added, alloc/free pair < 2 us added.

    make -C native && .venv/bin/python bench/bench_libvgpu.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "native" / "build"
DRIVER = BUILD / "bench" / "bench_driver"
REPEATS = 5


def measure(env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([str(DRIVER), "200000", "50000", "3"], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    return {k: float(v) for k, v in (kv.split("=") for kv in out.split())}


def main() -> int:
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "FAKEGPU_", "LD_PRELOAD"))}
        base.update(LD_LIBRARY_PATH=str(BUILD / "fakegpu"), FAKEGPU_STATE_DIR=f"{tmp}/machine",
                    LIBCUDA_LOG_LEVEL="0")
        configs = {
            "fake driver alone": base,
            "libvgpu, 64 GiB limit": dict(base, LD_PRELOAD=str(BUILD / "libvgpu.so"),
                                          CUDA_DEVICE_MEMORY_LIMIT="64g",
                                          CUDA_DEVICE_MEMORY_SHARED_CACHE=f"{tmp}/a.cache"),
            "libvgpu, no limit": dict(base, LD_PRELOAD=str(BUILD / "libvgpu.so"),
                                      CUDA_DEVICE_MEMORY_SHARED_CACHE=f"{tmp}/b.cache"),
        }
        best: dict[str, dict[str, float]] = {}
        for _ in range(REPEATS):
            for name, env in configs.items():
                r = measure(env)
                cur = best.setdefault(name, r)
                for k, v in r.items():
                    cur[k] = min(cur[k], v)
    ref = best["fake driver alone"]
    print(f"{'configuration':<24} {'launch ns':>10} {'added':>8} {'ratio':>6}   "
          f"{'alloc+free ns':>13} {'added':>8} {'ratio':>6}")
    for name, r in best.items():
        dl, da = r["launch_ns"] - ref["launch_ns"], r["alloc_free_ns"] - ref["alloc_free_ns"]
        print(f"{name:<24} {r['launch_ns']:>10.1f} {dl:>8.1f} {r['launch_ns'] / ref['launch_ns']:>6.2f}   "
              f"{r['alloc_free_ns']:>13.1f} {da:>8.1f} {r['alloc_free_ns'] / ref['alloc_free_ns']:>6.2f}")
    lim = best["libvgpu, 64 GiB limit"]
    print(f"targets: launch added {lim['launch_ns'] - ref['launch_ns']:.1f} ns (< 50 ns), "
          f"alloc/free pair added {(lim['alloc_free_ns'] - ref['alloc_free_ns']) / 1000:.2f} us (< 2 us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
