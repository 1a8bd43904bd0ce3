"""What libvgpu adds to cuLaunchKernel, to a cuMemAlloc_v2 + cuMemFree_v2 pair, to
cuMemGetInfo_v2 and to nvmlDeviceGetMemoryInfo, with and without a memory limit, against the
same calls to the fake driver alone; and the same for an earlier libvgpu ("before", built
from git, by default the last revision whose allocation path took an fcntl record lock), all
in one run so the figures compare.

Three measures per operation (C driver native/bench/bench_driver.c, so Python does not blur
nanoseconds):
* wall ns per operation: best of REPEATS interleaved runs of ROUNDS short loops each (noisy on
  a shared machine);
* CPU ns per operation: the thread's CPU time (user + kernel), best of the same runs: what the
  call costs when the machine is loaded and the wall clock also counts time spent waiting for a
  core (system calls are in it, time descheduled is not);
* instructions per operation: valgrind --tool=callgrind, counting only the measured loop
  (stable on a noisy machine, but blind to time spent in the kernel);
* system calls per operation: strace, the main thread's calls inside the measured loop.

    make -C native && .venv/bin/python bench/bench_libvgpu.py [--before REV] [--repeats N]

Targets (docs/libvgpu.md, issue 17): launch < 50 ns added; alloc/free pair with a limit
<= +0.5 us wall and no system call added.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "native" / "build"
DRIVER = BUILD / "bench" / "bench_driver"
BEFORE_REV = "c2bef71"  # last revision with the OFD (fcntl) lock around check-and-add
OPS = [  # (driver op, key it prints, label, iterations per N)
    ("launch", "launch_ns", "cuLaunchKernel", 4),
    ("alloc", "alloc_free_ns", "cuMemAlloc+cuMemFree", 1),
    ("meminfo", "meminfo_ns", "cuMemGetInfo_v2", 1),
    ("nvml", "nvml_meminfo_ns", "nvmlDeviceGetMemoryInfo", 1),
]
ROUNDS = 20  # short timed loops, many of them: the best one is likeliest to have run undisturbed
LOOP_FN = {"launch": "op_launch", "alloc": "op_alloc_free", "meminfo": "op_meminfo", "nvml": "op_nvml"}


def build_before(rev: str, dest: Path) -> Path | None:
    """libvgpu.so of revision `rev`, compiled like the Makefile does; None if git cannot give it."""
    src = dest / "src"
    src.mkdir(parents=True)
    try:
        arch = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "native/libvgpu", "native/common"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"(no 'before' column: git archive {rev} failed: {e})", file=sys.stderr)
        return None
    subprocess.run(["tar", "-x", "-C", str(src)], input=arch, check=True)
    lib = dest / "libvgpu.so"
    sources = sorted(str(p) for p in (src / "native" / "libvgpu").glob("*.c"))
    # revisions with glibc_floor.h are built with it included first, as the Makefile does (it
    # defines the stat wrappers their sources call)
    floor = src / "native" / "libvgpu" / "glibc_floor.h"
    subprocess.run(
        [
            "cc",
            "-O2",
            "-fPIC",
            "-std=gnu11",
            "-pthread",
            "-fvisibility=hidden",
            *(["-include", str(floor)] if floor.is_file() else []),
            f"-I{BUILD / 'include'}",
            "-shared",
            "-Wl,-soname,libvgpu.so",
            "-Wl,-z,defs",
            "-o",
            str(lib),
            *sources,
            "-ldl",
            "-lpthread",
        ],
        check=True,
    )
    return lib


def wall(env: dict[str, str], n: int) -> dict[str, float]:
    out = subprocess.run(
        [str(DRIVER), "all", str(n), str(ROUNDS)], env=env, capture_output=True, text=True, timeout=600, check=True
    ).stdout
    return {k: float(v) for k, v in (kv.split("=") for kv in out.split())}


def instructions(env: dict[str, str], op: str, iters: int, tmp: Path) -> float:
    out = tmp / f"cg.{os.getpid()}.out"
    n = iters // dict((o, s) for o, _, _, s in OPS)[op]
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--toggle-collect={LOOP_FN[op]}",
            f"--callgrind-out-file={out}",
            str(DRIVER),
            op,
            str(n),
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    m = re.search(r"^totals:\s+(\d+)", out.read_text(), re.M) or re.search(r"^summary:\s+(\d+)", out.read_text(), re.M)
    out.unlink()
    return int(m.group(1)) / iters


def syscalls(env: dict[str, str], n: int, tmp: Path) -> dict[str, float]:
    """System calls per operation made by the main thread inside each measured loop."""
    log = tmp / "strace.log"
    p = subprocess.Popen(
        ["strace", "-f", "-qq", "-o", str(log), str(DRIVER), "all", str(n), "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    p.wait(timeout=600)
    lines = log.read_text().splitlines()
    main = lines[0].split()[0]  # execve of the driver: its PID is the main thread's TID
    res = {}
    for k, (op, key, _, scale) in enumerate(OPS):
        inside, count = False, 0
        for ln in lines:
            pid, _, call = ln.partition(" ")
            call = call.lstrip()
            if pid != main:
                continue
            if call.startswith(f"close({-1001 - k})"):
                inside = True
            elif call.startswith(f"close({-2001 - k})"):
                inside = False
            elif inside and not call.startswith(("<...", "+++", "---")):
                count += 1
        res[key] = count / (n * scale)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=BEFORE_REV, help="git revision of the 'before' libvgpu ('' = none)")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved wall-clock runs (best kept)")
    ap.add_argument("-n", type=int, default=1000, help="alloc/free pairs and queries per timed loop (4n launches)")
    args = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    have_vg, have_st = shutil.which("valgrind"), shutil.which("strace")
    with tempfile.TemporaryDirectory() as tmps:
        tmp = Path(tmps)
        base = {
            k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "FAKEGPU_", "LD_PRELOAD", "LIBCUDA_"))
        }
        base.update(LD_LIBRARY_PATH=str(BUILD / "fakegpu"), FAKEGPU_STATE_DIR=f"{tmp}/machine", LIBCUDA_LOG_LEVEL="0")
        libs = {"after": BUILD / "libvgpu.so"}
        if args.before:
            before = build_before(args.before, tmp / "before")
            if before:
                libs = {f"before ({args.before})": before, **libs}
        configs = {"fake driver alone": base}
        for tag, lib in libs.items():
            configs[f"{tag}, limit"] = dict(
                base,
                LD_PRELOAD=str(lib),
                CUDA_DEVICE_MEMORY_LIMIT="64g",
                CUDA_DEVICE_MEMORY_SHARED_CACHE=f"{tmp}/{len(configs)}.cache",
            )
            configs[f"{tag}, no limit"] = dict(
                base, LD_PRELOAD=str(lib), CUDA_DEVICE_MEMORY_SHARED_CACHE=f"{tmp}/{len(configs)}.cache"
            )
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.repeats):
            for name, env in configs.items():
                for k, v in wall(env, args.n).items():
                    best.setdefault(name, {})[k] = min(best.get(name, {}).get(k, v), v)
        ins = (
            {
                name: {key: instructions(env, op, 2000 * scale, tmp) for op, key, _, scale in OPS}
                for name, env in configs.items()
            }
            if have_vg
            else {}
        )
        sc = {name: syscalls(env, 200, tmp) for name, env in configs.items()} if have_st else {}
    if not have_vg or not have_st:
        print(
            f"(valgrind {'found' if have_vg else 'missing'}, strace {'found' if have_st else 'missing'}:"
            " missing columns read '-')"
        )
    ref = "fake driver alone"
    print(
        f"{'operation':<24} {'configuration':<27} {'wall ns':>8} {'added':>7} {'ratio':>5}  "
        f"{'cpu ns':>8} {'added':>7} {'ratio':>5}  {'instr':>6} {'added':>5}  {'syscalls':>8} {'added':>5}"
    )
    for op, key, label, _ in OPS:
        for name in configs:
            cols = []
            for k in (key, f"cpu_{key}"):
                v, v0 = best[name][k], best[ref][k]
                cols.append(f"{v:>8.1f} {v - v0:>+7.1f} {v / v0:>5.2f}")
            i = f"{ins[name][key]:>6.0f} {ins[name][key] - ins[ref][key]:>+5.0f}" if ins else f"{'-':>6} {'-':>5}"
            s_ = f"{sc[name][key]:>8.2f} {sc[name][key] - sc[ref][key]:>+5.2f}" if sc else f"{'-':>8} {'-':>5}"
            print(f"{label:<24} {name:<27} {cols[0]}  {cols[1]}  {i}  {s_}")
    pair = "alloc_free_ns"
    for tag in [t for t in libs]:
        name = f"{tag}, limit"
        wall_us = (best[name][pair] - best[ref][pair]) / 1000
        cpu_us = (best[name][f"cpu_{pair}"] - best[ref][f"cpu_{pair}"]) / 1000
        extra = f", {sc[name][pair] - sc[ref][pair]:+.2f} syscalls" if sc else ""
        extra += f", {ins[name][pair] - ins[ref][pair]:+.0f} instructions" if ins else ""
        print(
            f"{tag}: alloc/free pair with a limit adds {wall_us:+.2f} us wall, {cpu_us:+.2f} us CPU{extra} "
            f"(target <= +0.5 us, 0 syscalls); launch adds "
            f"{best[name]['launch_ns'] - best[ref]['launch_ns']:+.1f} ns wall (< 50 ns)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
