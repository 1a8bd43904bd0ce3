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
* two processes of one container (one shared region) stay under its one limit together;
* compute share (`--gpucores N --core-policy force`) for 10/30/50/70/90 alone and 30/70 as two
  containers together: PyTorch matmul throughput relative to the unlimited run;
* CUDA graph memory (driver API through ctypes, no PyTorch needed): allocation nodes whose pages
  alone exceed the limit are refused at instantiation; an allocation freed inside the graph and a
  later one get the same pages (its peak is charged, not the sum); a graph's memory is charged at
  its first launch (a launch beside an allocation that leaves no room is refused) and given back
  by cuDeviceGraphMemTrim;
* PyTorch CUDA graphs (default allocator and cudaMallocAsync): a graph under the limit captures
  and replays with the right result; one whose live temporaries exceed the limit is refused with
  an out-of-memory error and the process stays usable;
* task priority (`--priority 0|1`): a low-priority matmul loop beside a high-priority one pauses
  (at most 15 % of its rate alone) while the high one keeps at least 70 % of its own;
* what libvgpu adds to small operations: cuLaunchKernel of an empty kernel, a 1 MiB
  cuMemAlloc+cuMemFree pair, cuMemGetInfo, nvmlDeviceGetMemoryInfo (native/bench/bench_driver
  with BENCH_PTX=1) and a PyTorch x.add_(1) loop, with vs without the library (ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import select
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


GRAPH_SLACK_MIB = 64  # the free figure's drift over the probe (pool granularity, 2 MiB pages)


def graph_rows(res: dict) -> list[Row]:
    """Rows of the driver-API graph probe (GRAPH_PROBE's JSON). `free0` is cuMemGetInfo's free
    MiB under the limit after the context; `part` = 60 % and `half` = 50 % of it; `over` is 60 %
    of the limit (two such nodes live at once can never fit it)."""
    if "err" in res:
        return [Row("CUDA graph memory (driver API)", f"probe: {res['err']}"[:160], "runs", False)]
    free0, part, half = res["free0"], res["part"], res["half"]
    rows = [
        Row(
            "graph: live alloc nodes over the limit",
            f"2 x {res['over']} MiB: instantiate -> CUresult {res['over_rc']}",
            "refused at instantiation (2, out of memory)",
            res["over_rc"] == 2,
        )
    ]
    same, seq_rc, seq_launch = res["seq"]
    rows.append(
        Row(
            "graph: alloc, free, alloc again",
            f"same address: {'yes' if same else 'no'}; instantiate {seq_rc}, launch {seq_launch}",
            "peak charged, not the sum: instantiates and runs (0, 0)",
            seq_rc == 0 and seq_launch == 0,
        )
    )
    after = res["free_after_launch"]
    rows.append(
        Row(
            "graph: memory charged at first launch",
            f"launch beside {part} MiB -> {res['launch_beside']}; alone -> {res['launch']}; "
            f"free {free0} -> {after} MiB; {part} MiB alloc then -> {res['alloc_after_launch']}",
            f"refused beside (2), runs alone (0), free <= {free0 - half} MiB, alloc refused (2)",
            res["inst_rc"] == 0
            and res["launch_beside"] == 2
            and res["launch"] == 0
            and after <= free0 - half + GRAPH_SLACK_MIB
            and res["alloc_after_launch"] == 2,
        )
    )
    back = res["free_after_trim"]
    rows.append(
        Row(
            "graph: cuDeviceGraphMemTrim gives it back",
            f"free after trim {back} MiB; {part} MiB alloc -> {res['alloc_after_trim']}",
            f"free >= {free0 - GRAPH_SLACK_MIB} MiB, alloc runs (0)",
            back >= free0 - GRAPH_SLACK_MIB and res["alloc_after_trim"] == 0,
        )
    )
    return rows


def torch_graph_rows(conf: str, res: dict) -> list[Row]:
    """Rows of the PyTorch graph probe (TORCH_GRAPH_PROBE's JSON) under allocator `conf`."""
    if "probe" in res:
        return [Row(f"PyTorch CUDA graph ({conf})", f"probe: {res['probe']}"[:160], "runs", False)]
    fits, over = res["fits"], res["over"]
    rows = [
        Row(
            f"PyTorch CUDA graph under the limit ({conf})",
            f"{fits['mib']} MiB of temporaries, {fits.get('replays', 0)} replays: "
            + (f"error {fits['err']}" if fits.get("err") else f"result {'right' if fits.get('right') else 'WRONG'}"),
            "captures, replays, right result",
            not fits.get("err") and fits.get("right") is True,
        )
    ]
    # refused in the graph (capture or first replay), not in the small warm-up before it
    oom = (
        bool(over.get("err")) and "out of memory" in over["err"].lower() and over.get("phase") in ("capture", "replay")
    )
    rows.append(
        Row(
            f"PyTorch CUDA graph over the limit ({conf})",
            f"2 x {over['mib']} MiB live: "
            + (f"{over.get('phase')}: {over['err']}" if over.get("err") else "ran")
            + f"; usable after: {'yes' if over.get('after') else 'no'}",
            "out-of-memory error, usable after",
            oom and over.get("after") is True,
        )
    )
    return rows


def shared_row(limit_mib: int, first: dict, second: dict) -> Row:
    """Two processes of one container: `first` stopped at its figure, `second` ran until refused."""
    a, b = first["reached"], second["reached"]
    ok = (
        first.get("rc") == 0  # the first holds what it was told to, not what it was refused at
        and second["rc"] == 2
        and a + b <= limit_mib
        and second["free0"] <= limit_mib - a
        and b >= second["free0"] - 128  # its 64 MiB steps, short of what it saw free
    )
    return Row(
        "two processes, one limit",
        f"first holds {a} MiB; second saw {second['free0']} MiB free, got {b} MiB, then CUresult {second['rc']}",
        f"together <= {limit_mib} MiB, then out of memory (2)",
        ok,
    )


PRIORITY_HIGH_MIN, PRIORITY_LOW_MAX = 70.0, 15.0  # % of the task's rate alone


def priority_row(high: float, low: float) -> Row:
    """Rates (% of one task alone) of a high- and a low-priority task run together."""
    return Row(
        "priority: high and low together",
        f"high {high:.1f} %, low {low:.1f} % of its rate alone",
        f"high >= {PRIORITY_HIGH_MIN:.0f} %, low <= {PRIORITY_LOW_MAX:.0f} %",
        high >= PRIORITY_HIGH_MIN and low <= PRIORITY_LOW_MAX,
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

# Best of five windows of 20000 ops: on an H200 VM one 50000-op window ran anywhere from 6.9 to
# 10.5 us per op in back-to-back processes, library or not (30 Nov 2026).
LOOP_PROBE = r"""
import time, torch
x = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
for _ in range(5000): x.add_(1)
torch.cuda.synchronize(); best = float("inf")
for _ in range(5):
    n = 20000; t = time.perf_counter()
    for _ in range(n): x.add_(1)
    torch.cuda.synchronize(); best = min(best, (time.perf_counter() - t) / n * 1e9)
print(best)
"""


# The driver API, as the fake GPU's tests drive it (tests/native/test_libvgpu_graphs.py), with
# sizes taken from the free memory the limit leaves after the context. Prints one JSON object.
GRAPH_PROBE = r"""
import ctypes as C, json, sys
cu = C.CDLL("libcuda.so.1")
MiB = 1 << 20
def ck(rc, what):
    if rc:
        print(json.dumps({"err": f"{what} -> CUresult {rc}"})); sys.exit(0)
class Loc(C.Structure): _fields_ = [("type", C.c_int), ("id", C.c_int)]
class PoolProps(C.Structure):
    _fields_ = [("atype", C.c_int), ("htypes", C.c_int), ("loc", Loc), ("win", C.c_void_p),
                ("maxsize", C.c_size_t), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 54)]
class AllocParams(C.Structure):
    _fields_ = [("props", PoolProps), ("access", C.c_void_p), ("naccess", C.c_size_t),
                ("bytesize", C.c_size_t), ("dptr", C.c_uint64)]
def graph():
    g = C.c_void_p(); ck(cu.cuGraphCreate(C.byref(g), 0), "cuGraphCreate"); return g
def alloc_node(g, mib, after=None):
    node, p = C.c_void_p(), AllocParams(PoolProps(1, 0, Loc(1, 0)), None, 0, mib * MiB, 0)
    deps = (C.c_void_p * 1)(after) if after else None
    ck(cu.cuGraphAddMemAllocNode(C.byref(node), g, deps, 1 if after else 0, C.byref(p)), "alloc node")
    return node, p.dptr
def free_node(g, dptr, after):
    node = C.c_void_p()
    ck(cu.cuGraphAddMemFreeNode(C.byref(node), g, (C.c_void_p * 1)(after), 1, C.c_uint64(dptr)), "free node")
    return node
def instantiate(g):
    x = C.c_void_p(); return cu.cuGraphInstantiateWithFlags(C.byref(x), g, C.c_ulonglong(0)), x
def launch(x):
    rc = cu.cuGraphLaunch(x, None)
    return rc if rc else cu.cuCtxSynchronize()
def alloc(mib):
    p = C.c_uint64(); rc = cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(mib * MiB)); return rc, p.value
def free_mib():
    f, t = C.c_size_t(), C.c_size_t(); ck(cu.cuMemGetInfo_v2(C.byref(f), C.byref(t)), "cuMemGetInfo"); return f.value // MiB
ck(cu.cuInit(0), "cuInit")
ctx = C.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0), "retain"); ck(cu.cuCtxSetCurrent(ctx), "current")
free0 = free_mib(); part, half = free0 * 6 // 10, free0 // 2
f, t = C.c_size_t(), C.c_size_t(); cu.cuMemGetInfo_v2(C.byref(f), C.byref(t)); over = t.value // MiB * 6 // 10
res = dict(free0=free0, part=part, half=half, over=over)
two = graph(); alloc_node(two, over); alloc_node(two, over)
rc, x = instantiate(two); res["over_rc"] = rc
if rc == 0:
    launch(x); cu.cuGraphExecDestroy(x)
seq = graph(); a, d1 = alloc_node(seq, part); f = free_node(seq, d1, a)
b, d2 = alloc_node(seq, part, after=f); free_node(seq, d2, b)
rc, x = instantiate(seq)
res["seq"] = [d1 == d2, rc, launch(x) if rc == 0 else -1]
if rc == 0:
    cu.cuGraphExecDestroy(x)
ck(cu.cuDeviceGraphMemTrim(0), "trim")
g = graph(); a, d = alloc_node(g, half); free_node(g, d, a)
rc, x = instantiate(g); res["inst_rc"] = rc
rc, big = alloc(part)
res["launch_beside"] = launch(x) if rc == 0 else -1
if rc == 0:
    cu.cuMemFree_v2(C.c_uint64(big))
res["launch"] = launch(x)
res["free_after_launch"] = free_mib()
rc, p = alloc(part); res["alloc_after_launch"] = rc
if rc == 0:
    cu.cuMemFree_v2(C.c_uint64(p))
cu.cuGraphExecDestroy(x); ck(cu.cuDeviceGraphMemTrim(0), "trim")
res["free_after_trim"] = free_mib()
rc, p = alloc(part); res["alloc_after_trim"] = rc
print(json.dumps(res))
"""

# One graph whose temporaries fit (35 % of what is free) and one holding two of 60 % live at once,
# captured with torch.cuda.graph and replayed. Prints one JSON object.
TORCH_GRAPH_PROBE = r"""
import json, torch
free, total = torch.cuda.mem_get_info()
MiB = 1 << 20
def attempt(n_tmp, frac):
    n = int(free * frac) // 8  # int64 elements: exact sums, and sum() makes no widened copy
    res = dict(mib=n * 8 // MiB, phase="warm-up")
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    out = torch.zeros(1, device="cuda", dtype=torch.int64)
    def body(k):
        ts = [torch.ones(k, device="cuda", dtype=torch.int64) for _ in range(n_tmp)]
        out.copy_(sum(t.sum() for t in ts))
    try:
        with torch.cuda.stream(s):
            body(1 << 20)  # warm-up outside the graph, as PyTorch asks (small: the real size may not fit)
        torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
        torch.cuda.empty_cache()
        res["phase"] = "capture"
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body(n)
        res["phase"] = "replay"
        for _ in range(5):
            out.zero_(); g.replay()
        torch.cuda.synchronize()
        res["replays"] = 5
        res["value"], res["want"] = out.item(), n * n_tmp
        res["right"] = res["value"] == res["want"]
        del g
    except Exception as e:
        res["err"] = f"{type(e).__name__}: {e}".splitlines()[0][:140]
    torch.cuda.synchronize(); torch.cuda.empty_cache()
    try:
        res["after"] = torch.ones(1 << 20, device="cuda", dtype=torch.int64).sum().item() == 1 << 20
    except Exception:
        res["after"] = False
    return res
print(json.dumps(dict(fits=attempt(1, 0.35), over=attempt(2, 0.6))))
"""


# A process of a container: allocates 64 MiB blocks until it holds argv[1] MiB (0: until refused),
# prints what it saw and got, and holds it until its stdin closes.
SHARED_PROBE = r"""
import ctypes as C, json, sys
cu = C.CDLL("libcuda.so.1")
MiB = 1 << 20
ctx = C.c_void_p()
assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
f, t = C.c_size_t(), C.c_size_t(); cu.cuMemGetInfo_v2(C.byref(f), C.byref(t))
stop, got, rc = int(sys.argv[1]), 0, 0
while stop == 0 or got < stop:
    p = C.c_uint64(); rc = cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(64 * MiB))
    if rc:
        break
    got += 64
print(json.dumps(dict(free0=f.value // MiB, reached=got, rc=rc)), flush=True)
sys.stdin.read()
"""


# Matmul batches completed inside a fixed wall-clock window [argv[1], argv[2]] (epoch seconds),
# per second. A task paused by a higher-priority one blocks inside a launch (its warm-up too), so
# only the window tells what it got while the other ran: a rate counted from its own start after
# the pause would be its rate alone.
WINDOW_WORKER = r"""
import sys, time, torch
t_start, t_end = float(sys.argv[1]), float(sys.argv[2])
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16); b = a.clone()
for _ in range(20):
    a @ b
torch.cuda.synchronize()
n = 0
while time.time() < t_end:
    for _ in range(8):
        a @ b
    torch.cuda.synchronize()
    if t_start <= time.time() <= t_end:
        n += 8
print(n / (t_end - t_start))
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
        argv = self._argv(cmd, gpumem, extra)
        try:
            p = subprocess.run(argv, env=env or self.env, capture_output=True, text=True, timeout=self.a.timeout, **kw)
        except subprocess.TimeoutExpired as e:
            self._keep(argv, "killed: " + hung(e), e.stdout, e.stderr, self.n)
            raise
        self._keep(argv, f"exit {p.returncode}", p.stdout, p.stderr, self.n)
        return p

    def _argv(self, cmd: list[str], gpumem: str | None = None, extra=(), cache: str | None = None) -> list[str]:
        """`hami exec` of `cmd` under the limit; processes given one `cache` share one container's region."""
        self.n += 1
        return [
            sys.executable,
            "-m",
            "hami",
            "exec",
            "--gpumem",
            gpumem or f"{self.a.limit_mib}m",
            "--lib",
            str(LIB),
            "--cache",
            cache or str(self.tmp / f"{self.n}.cache"),
            *extra,
            "--",
            *cmd,
        ]

    def _keep(self, argv: list[str], how: str, out, err, n: int) -> None:
        """With --raw DIR: probe number `n`'s command, exit and whole output in DIR/<pid>-NN.log."""
        if not self.a.raw:
            return
        text = [t.decode(errors="replace") if isinstance(t, bytes) else (t or "") for t in (out, err)]
        Path(self.a.raw).mkdir(parents=True, exist_ok=True)
        cmd = " ".join(a if len(a) < 200 else a[:60] + "..." for a in argv)
        body = f"$ {cmd}\n{how}\n--- stdout\n{text[0]}--- stderr\n{text[1]}"
        (Path(self.a.raw) / f"{os.getpid()}-{n:02d}.log").write_text(body)

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
        """A matmul loop printing its rate; under `hami exec` when given a share."""
        cmd = [self.a.torch_python, "-c", SHARE_WORKER, str(self.a.seconds), "2"]
        extra = [
            *(["--gpucores", str(cores)] if cores is not None else []),
            *(["--core-policy", policy] if policy else []),
        ]
        if extra:
            cmd = self._argv(cmd, "1T", extra)
        return subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _window(self, lead: float, priority: int | None = None) -> subprocess.Popen:
        t0 = time.time() + lead  # room for PyTorch's import and the warm-up
        cmd = [self.a.torch_python, "-c", WINDOW_WORKER, f"{t0:.3f}", f"{t0 + self.a.seconds:.3f}"]
        if priority is not None:
            cmd = self._argv(cmd, "1T", ["--priority", str(priority)])
        return subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def priority(self) -> list[Row]:
        """A high- (0) and a low-priority (1) task on one GPU, both matmul loops, no share: what
        each completes in one wall-clock window, against one task alone in the same kind of window."""
        base = self._rate(self._window(8.0))
        pair = [self._window(10.0, priority=0), self._window(10.0, priority=1)]
        try:
            high, low = (self._rate(p) / base * 100 for p in pair)
        finally:
            for p in pair:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        return [priority_row(high, low)]

    def graphs(self) -> list[Row]:
        try:
            p = self.hexec([sys.executable, "-c", GRAPH_PROBE])
            res = json.loads(p.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired as e:
            res = {"err": hung(e)}
        except (IndexError, ValueError):
            res = {"err": f"exit {p.returncode}: {last_line(p.stderr)}"}
        rows = graph_rows(res)
        if self.a.torch_python == "-":
            return rows
        for conf in ("", "backend:cudaMallocAsync"):
            env = dict(self.env, PYTORCH_CUDA_ALLOC_CONF=conf) if conf else self.env
            try:
                p = self.hexec([self.a.torch_python, "-c", TORCH_GRAPH_PROBE], env=env)
                out = json.loads(p.stdout.strip().splitlines()[-1])
            except subprocess.TimeoutExpired as e:
                out = {"probe": hung(e)}
            except (IndexError, ValueError):
                out = {"probe": f"exit {p.returncode}: {last_line(p.stderr)}"}
            rows += torch_graph_rows(conf or "default allocator", out)
        return rows

    def shared(self) -> list[Row]:
        """Two processes of one container (one region): the first holds 40 % of the limit, the
        second allocates until refused. Together they stay under the limit."""
        cache = str(self.tmp / "shared.cache")
        hold = self.a.limit_mib * 4 // 10
        argv_a = self._argv([sys.executable, "-c", SHARED_PROBE, str(hold)], cache=cache)
        n_a, line = self.n, ""
        a = subprocess.Popen(
            argv_a,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            ready, _, _ = select.select([a.stdout], [], [], self.a.timeout)
            line = a.stdout.readline() if ready else ""
            first = json.loads(line) if line else None
            if not first:
                raise RuntimeError(f"first process: no figure within {self.a.timeout:.0f} s")
            argv_b = self._argv([sys.executable, "-c", SHARED_PROBE, "0"], cache=cache)
            p = subprocess.run(
                argv_b,
                env=self.env,
                input="",
                capture_output=True,
                text=True,
                timeout=self.a.timeout,
            )
            self._keep(argv_b, f"exit {p.returncode}", p.stdout, p.stderr, self.n)
            second = json.loads(p.stdout.strip().splitlines()[-1])
        finally:
            try:
                out, err = a.communicate("", timeout=30)
            except subprocess.TimeoutExpired:
                a.kill()
                out, err = a.communicate()
            self._keep(argv_a, f"exit {a.returncode}", line + (out or ""), err, n_a)
        return [shared_row(self.a.limit_mib, first, second)]

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
        for _ in range(5):  # alternating, so drift of the machine falls on both sides
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


CHECKS = ("discovery", "alloc", "smi", "shared", "graphs", "share", "priority", "overhead", "torch_loop")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one-table real-GPU check of hami's claims")
    ap.add_argument(
        "--torch-python",
        default=os.environ.get("GPU_CHECK_PYTHON", sys.executable),
        help="a Python with PyTorch (scripts/gpu-check.sh makes one); '-': none, the PyTorch rows of graphs are left out",
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
    ap.add_argument("--raw", default="", help="folder where each hami exec probe's command and whole output are kept")
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
