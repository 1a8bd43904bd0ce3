#!/usr/bin/env python3
"""`make gpu-check`: every claim the fake GPU supports, checked on a real NVIDIA GPU, printed as
one table (claim, measured, target, PASS/FAIL). Prints "SKIP: ..." and exits 0 on a machine
without an NVIDIA GPU.

Run it through scripts/gpu-check.sh, which builds native/ and installs PyTorch into a venv of
its own and passes it as --torch-python. Runs with the project's venv (hami importable):

    .venv/bin/python tests/gpu/gpu_check.py --torch-python ~/.cache/hami/gpu-check-venv/bin/python

Claims:
* device plugin discovery on real NVML: `hami device-plugin --dry-run` finds every GPU
  nvidia-smi lists, same UUIDs and memory;
* PyTorch under a 3000 MiB limit (`hami exec --gpumem 3000m`) allocates up to the limit, then
  raises torch.cuda.OutOfMemoryError and stays usable (default allocator, expandable
  segments, cudaMallocAsync);
* nvidia-smi inside the limited process shows total = 3000 MiB;
* compute share (`--gpucores N --core-policy force`) for 10/30/50/70/90 alone and 30/70 as two
  containers together: PyTorch matmul throughput relative to the unlimited run;
* what libvgpu adds to small operations: cuLaunchKernel of an empty kernel, a 1 MiB
  cuMemAlloc+cuMemFree pair, cuMemGetInfo, nvmlDeviceGetMemoryInfo (native/bench/bench_driver
  with BENCH_PTX=1) and a PyTorch x.add_(1) loop, with vs without the library (ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "native" / "build" / "libvgpu.so"
DRIVER = ROOT / "native" / "build" / "bench" / "bench_driver"
MiB = 1 << 20
SHARE_TOLERANCE = 10.0  # percentage points
CONTEXT_SLACK_MIB = 1536  # PyTorch's CUDA context + cuBLAS workspace are charged too


@dataclass
class Row:
    claim: str
    measured: str
    target: str
    ok: bool


def no_gpu_reason(nvidia_smi: str) -> str | None:
    """Why this machine cannot run the check, or None if it has an NVIDIA GPU."""
    exe = shutil.which(nvidia_smi)
    if not exe:
        return f"no NVIDIA driver ({nvidia_smi} not found)"
    try:
        p = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{nvidia_smi} -L failed: {e}"
    if p.returncode != 0 or not any(ln.startswith("GPU ") for ln in p.stdout.splitlines()):
        return f"{nvidia_smi} lists no GPU"
    return None


def hung(e: subprocess.TimeoutExpired) -> str:
    """A probe that outlived --timeout, as one table cell."""
    return f"hung: no exit within {e.timeout:.0f} s"


def last_line(text: str, width: int = 100) -> str:
    """The last non-empty line of `text`, cut to `width` characters (error cells stay one line)."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:width]


# ---- verdicts (pure; unit-tested in tests/unit/test_gpu_check.py) ----


def alloc_row(conf: str, limit: int, res: dict) -> Row:
    reached, total = res.get("reached", 0), res.get("total", 0)
    ok = (
        res.get("err") == "OutOfMemoryError"
        and res.get("after") is True
        and total == limit
        and limit - CONTEXT_SLACK_MIB * MiB <= reached <= limit
    )
    measured = (
        f"{reached // MiB} MiB, then {res.get('err') or 'no error'}; total {total // MiB} MiB; "
        f"usable after: {'yes' if res.get('after') else 'no'}"
    )
    return Row(f"PyTorch alloc to limit ({conf})", measured, f"<= {limit // MiB} MiB, OutOfMemoryError, usable", ok)


def smi_row(limit: int, csv: str) -> Row:
    first = csv.strip().splitlines()[0] if csv.strip() else ""
    try:
        total = int(first.split(",")[0])
    except ValueError:
        total = -1
    return Row(
        "nvidia-smi in limited process",
        f"memory.total {total} MiB" if total >= 0 else f"unparsed: {first!r}",
        f"{limit // MiB} MiB",
        total == limit // MiB,
    )


def share_row(name: str, target: int, measured: float) -> Row:
    return Row(
        name, f"{measured:.1f} %", f"{target} % +-{SHARE_TOLERANCE:.0f}", abs(measured - target) <= SHARE_TOLERANCE
    )


def overhead_row(
    name: str,
    without_ns: float,
    with_ns: float,
    max_added_ns: float,
    max_ratio: float,
    cpu: tuple[float, float] | None = None,
) -> Row:
    """Wall time without vs with libvgpu; `cpu` = the same in thread CPU time, when measured.
    Passes when the added cost is within either bound, on either clock (CPU time is not
    inflated by time spent descheduled; wall time is what the application waits)."""

    def fits(a: float, b: float) -> bool:
        return b - a <= max_added_ns or b / a <= max_ratio

    added, ratio = with_ns - without_ns, with_ns / without_ns
    measured = f"{without_ns:.0f} -> {with_ns:.0f} ns (x{ratio:.2f}, {added:+.0f} ns)"
    ok = fits(without_ns, with_ns)
    if cpu:
        measured += f"; CPU {cpu[0]:.0f} -> {cpu[1]:.0f} ns ({cpu[1] - cpu[0]:+.0f} ns)"
        ok = ok or fits(*cpu)
    return Row(f"overhead: {name}", measured, f"<= +{max_added_ns:.0f} ns or x{max_ratio:.2f}", ok)


def discovery_row(smi_gpus: list[dict], plugin: dict) -> Row:
    found = {g["uuid"]: g["memoryMiB"] for g in plugin.get("gpus", [])}
    want = {g["uuid"]: g["memoryMiB"] for g in smi_gpus}
    return Row(
        "device plugin discovery (real NVML)",
        f"{len(found)} GPU(s): " + ", ".join(sorted(found)),
        f"{len(want)} GPU(s), same UUIDs and MiB",
        found == want and bool(want),
    )


def render(rows: list[Row]) -> str:
    w = [
        max(len(h), *(len(getattr(r, f)) for r in rows))
        for h, f in (("claim", "claim"), ("measured", "measured"), ("target", "target"))
    ]
    out = [f"{'claim':<{w[0]}}  {'measured':<{w[1]}}  {'target':<{w[2]}}  result"]
    out += [f"{r.claim:<{w[0]}}  {r.measured:<{w[1]}}  {r.target:<{w[2]}}  {'PASS' if r.ok else 'FAIL'}" for r in rows]
    return "\n".join(out)


# ---- probes ----

ALLOC_PROBE = r"""
import json, sys, torch
limit, step = int(sys.argv[1]), 64 << 20
free, total = torch.cuda.mem_get_info()
blocks, err = [], None
try:
    while len(blocks) * step <= 2 * limit:
        blocks.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    err = "OutOfMemoryError"
except Exception as e:
    err = f"{type(e).__name__}: {e}"[:160]
reached = len(blocks) * step
del blocks[-4:]
torch.cuda.empty_cache()
try:
    after = torch.ones(step // 8, device="cuda").sum().item() == step // 8
except Exception:
    after = False
print(json.dumps(dict(total=total, reached=reached, err=err, after=after)))
"""

SHARE_WORKER = r"""
import sys, time, torch
seconds, settle = float(sys.argv[1]), float(sys.argv[2])
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for _ in range(20):
    a @ b
torch.cuda.synchronize()
t0 = time.time(); n = 0; start_n = start_t = None
while time.time() - t0 < seconds:
    for _ in range(8):
        a @ b
    torch.cuda.synchronize()
    n += 8
    if start_n is None and time.time() - t0 >= settle:
        start_n, start_t = n, time.time()
print((n - start_n) / (time.time() - start_t))
"""

LOOP_PROBE = r"""
import time, torch
x = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
for _ in range(2000): x.add_(1)
torch.cuda.synchronize(); n = 50000; t = time.perf_counter()
for _ in range(n): x.add_(1)
torch.cuda.synchronize(); print((time.perf_counter() - t) / n * 1e9)
"""


class Checker:
    def __init__(self, args: argparse.Namespace, tmp: Path):
        self.a, self.tmp, self.n = args, tmp, 0
        self.limit = args.limit_mib * MiB
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CUDA_DEVICE_", "LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF"))
        }

    def hexec(
        self, cmd: list[str], gpumem: str | None = None, extra: list[str] = (), env: dict | None = None, **kw
    ) -> subprocess.CompletedProcess:
        self.n += 1
        argv = [
            sys.executable,
            "-m",
            "hami",
            "exec",
            "--gpumem",
            gpumem or f"{self.a.limit_mib}m",
            "--lib",
            str(LIB),
            "--cache",
            str(self.tmp / f"{self.n}.cache"),
            *extra,
            "--",
            *cmd,
        ]
        return subprocess.run(argv, env=env or self.env, capture_output=True, text=True, timeout=self.a.timeout, **kw)

    def discovery(self) -> list[Row]:
        smi = subprocess.run(
            [self.a.nvidia_smi, "--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        gpus = [{"uuid": u.strip(), "memoryMiB": int(m)} for u, m in (ln.split(",") for ln in smi.strip().splitlines())]
        p = subprocess.run(
            [sys.executable, "-m", "hami", "device-plugin", "--dry-run"],
            env=dict(self.env, NODE_NAME=os.environ.get("NODE_NAME", os.uname().nodename)),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if p.returncode != 0:
            return [
                Row(
                    "device plugin discovery (real NVML)",
                    f"exit {p.returncode}: {last_line(p.stderr)}",
                    "all GPUs",
                    False,
                )
            ]
        return [discovery_row(gpus, json.loads(p.stdout))]

    def alloc(self) -> list[Row]:
        rows = []
        for conf in ("", "expandable_segments:True", "backend:cudaMallocAsync"):
            env = dict(self.env, PYTORCH_CUDA_ALLOC_CONF=conf) if conf else self.env
            try:
                p = self.hexec([self.a.torch_python, "-c", ALLOC_PROBE, str(self.limit)], env=env)
            except subprocess.TimeoutExpired as e:
                rows.append(alloc_row(conf or "default allocator", self.limit, {"err": f"probe {hung(e)}"}))
                continue
            try:
                res = json.loads(p.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                res = {"err": f"probe exit {p.returncode}: {last_line(p.stderr)}"}
            rows.append(alloc_row(conf or "default allocator", self.limit, res))
        return rows

    def smi(self) -> list[Row]:
        p = self.hexec([self.a.nvidia_smi, "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"])
        return [smi_row(self.limit, p.stdout)]

    def _rate(self, p: subprocess.Popen) -> float:
        try:
            out, err = p.communicate(timeout=self.a.timeout)
        except subprocess.TimeoutExpired as e:
            p.kill()
            p.communicate()
            raise RuntimeError(f"share worker {hung(e)}") from None
        if p.returncode != 0:
            raise RuntimeError(f"share worker failed: {last_line(err)}")
        return float(out.strip().splitlines()[-1])

    def _worker(self, cores: int | None, policy: str | None = None) -> subprocess.Popen:
        cmd = [self.a.torch_python, "-c", SHARE_WORKER, str(self.a.seconds), "2"]
        if cores is not None:
            self.n += 1
            cmd = [
                sys.executable,
                "-m",
                "hami",
                "exec",
                "--gpumem",
                "1T",
                "--gpucores",
                str(cores),
                *(["--core-policy", policy] if policy else []),
                "--lib",
                str(LIB),
                "--cache",
                str(self.tmp / f"{self.n}.cache"),
                "--",
                *cmd,
            ]
        return subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def share(self) -> list[Row]:
        base = self._rate(self._worker(None))
        rows = [
            share_row(f"compute share {c} % alone", c, self._rate(self._worker(c, "force")) / base * 100)
            for c in (10, 30, 50, 70, 90)
        ]
        pair = [(c, self._worker(c)) for c in (30, 70)]
        try:
            rows += [share_row(f"compute share {c} % (30/70 together)", c, self._rate(p) / base * 100) for c, p in pair]
        finally:
            for _, p in pair:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        return rows

    def overhead(self) -> list[Row]:
        plain = dict(self.env, BENCH_PTX="1")
        lib = dict(
            plain,
            LD_PRELOAD=str(LIB),
            CUDA_DEVICE_MEMORY_LIMIT=f"{self.a.limit_mib}m",
            CUDA_DEVICE_MEMORY_SHARED_CACHE=str(self.tmp / "overhead.cache"),
            LIBCUDA_LOG_LEVEL="0",
        )
        best: dict[str, dict[str, float]] = {"without": {}, "with": {}}
        for _ in range(3):
            for name, env in (("without", plain), ("with", lib)):
                try:
                    p = subprocess.run(
                        [str(DRIVER), "all", str(self.a.overhead_n), "3"],
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=self.a.timeout,
                    )
                except subprocess.TimeoutExpired as e:
                    raise RuntimeError(f"bench_driver ({name} libvgpu) {hung(e)}") from None
                if p.returncode != 0:
                    raise RuntimeError(f"bench_driver ({name} libvgpu) exit {p.returncode}: {last_line(p.stderr)}")
                out = p.stdout
                for k, v in (kv.split("=") for kv in out.split()):
                    best[name][k] = min(best[name].get(k, float(v)), float(v))
        w, o = best["without"], best["with"]
        ops = [
            ("cuLaunchKernel (empty kernel)", "launch_ns", 50, 1.05),
            ("cuMemAlloc+cuMemFree 1 MiB", "alloc_free_ns", 500, 1.10),
            ("cuMemGetInfo_v2", "meminfo_ns", 500, 1.10),
            ("nvmlDeviceGetMemoryInfo", "nvml_meminfo_ns", 500, 1.10),
        ]
        return [
            overhead_row(label, w[k], o[k], add, ratio, (w[f"cpu_{k}"], o[f"cpu_{k}"])) for label, k, add, ratio in ops
        ]

    def torch_loop(self) -> list[Row]:
        loop: dict[str, list[float]] = {"without": [], "with": []}
        for _ in range(3):
            for name in loop:
                cmd = [self.a.torch_python, "-c", LOOP_PROBE]
                try:
                    p = (
                        self.hexec(cmd)
                        if name == "with"
                        else subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=self.a.timeout)
                    )
                except subprocess.TimeoutExpired as e:
                    raise RuntimeError(f"loop probe ({name} libvgpu) {hung(e)}") from None
                if p.returncode != 0:
                    raise RuntimeError(f"loop probe ({name} libvgpu) exit {p.returncode}: {last_line(p.stderr)}")
                loop[name].append(float(p.stdout.strip().splitlines()[-1]))
        return [overhead_row("PyTorch x.add_(1) loop", min(loop["without"]), min(loop["with"]), 50, 1.05)]


CHECKS = ("discovery", "alloc", "smi", "share", "overhead", "torch_loop")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one-table real-GPU check of hami's claims")
    ap.add_argument(
        "--torch-python",
        default=os.environ.get("GPU_CHECK_PYTHON", sys.executable),
        help="a Python with PyTorch (scripts/gpu-check.sh makes one)",
    )
    ap.add_argument("--nvidia-smi", default=os.environ.get("NVIDIA_SMI", "nvidia-smi"))
    ap.add_argument("--limit-mib", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=8.0, help="run time per compute-share measurement")
    ap.add_argument("--overhead-n", type=int, default=5000, help="bench_driver iterations (N pairs, 4N launches)")
    ap.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds one probe process may run; past it the probe is killed and its row FAILs as hung",
    )
    ap.add_argument("--only", default="", help="comma list of checks: " + ",".join(CHECKS))
    args = ap.parse_args(argv)
    bad = [s for s in args.only.split(",") if s and s not in CHECKS]
    if bad:
        ap.error(f"--only: unknown check {bad[0]!r} (known: {', '.join(CHECKS)})")
    why = no_gpu_reason(args.nvidia_smi)
    if why:
        print(f"SKIP: {why}")
        return 0
    for f in (LIB, DRIVER):
        if not f.is_file():
            print(f"gpu-check: {f} missing: run `make native` first", file=sys.stderr)
            return 2
    t0 = time.time()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="hami-gpu-check-") as tmp:
        c = Checker(args, Path(tmp))
        wanted = [s for s in args.only.split(",") if s] or list(CHECKS)
        for name in wanted:
            try:
                rows += getattr(c, name)()
            except Exception as e:  # one broken check must not hide the others' figures
                rows.append(Row(name, f"error: {type(e).__name__}: {last_line(e)}", "-", False))
    gpu = (
        subprocess.run(
            [args.nvidia_smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()
    )
    print(f"hami gpu-check on {gpu[0] if gpu else 'GPU'} (limit {args.limit_mib} MiB, {time.time() - t0:.0f} s)")
    print(render(rows))
    failed = sum(not r.ok for r in rows)
    print(f"{len(rows) - failed} PASS, {failed} FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
