"""Helpers for the compute-share tests and benchmark: start `cshare_load` processes under
libvgpu on a fake GPU and turn their launch timelines into achieved shares.

Achieved share is measured from the fake GPU's own accounting: every admitted launch costs
exactly KERNEL_US of device time (the fake device runs one kernel at a time, FIFO across
processes), so share = launches x KERNEL_US / elapsed. The load keeps at most DEPTH launches
in flight (32 by default: 32 ms of queued work keeps the device busy through host
scheduling delays on a loaded machine), so admissions and execution differ by at most
DEPTH kernels.
"""

from __future__ import annotations

import bisect
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "native" / "build"
LOAD = BUILD / "tests" / "cshare_load"
LIB = BUILD / "libvgpu.so"
KERNEL_US = 1000
SAMPLE_PERIOD_US = 50000  # fake NVML sample period for these tests (real NVML: ~1/6 s)
WINDOW_MS = 100


def base_env(fake_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FAKEGPU_", "CUDA_", "LIBCUDA_", "LD_PRELOAD", "GPU_CORE", "HAMI_"))
    }
    env["LD_LIBRARY_PATH"] = str(fake_dir)
    env["FAKEGPU_SAMPLE_PERIOD_US"] = str(SAMPLE_PERIOD_US)
    return env


@dataclass
class Task:
    name: str
    proc: subprocess.Popen
    limit: int | None
    kernel_us: int = KERNEL_US

    def trace(self, timeout: float = 60) -> "Trace":
        out, err = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            raise AssertionError(f"{self.name} failed rc={self.proc.returncode}\n{err}")
        return Trace.parse(out, self.kernel_us)


def start(
    env: dict[str, str],
    machine: Path,
    region: Path,
    *,
    limit: int | None = None,
    policy: str | None = None,
    kind: str = "plain",
    seconds: float = 2.5,
    device: int = 0,
    priority: int | None = None,
    linger: float = 0,
    extra: dict[str, str] | None = None,
    via_exec: bool = False,
    depth: int = 32,
    kernel_us: int = KERNEL_US,
) -> Task:
    e = dict(env)
    e["FAKEGPU_STATE_DIR"] = str(machine)
    argv = [str(LOAD), kind, str(kernel_us), str(seconds), str(depth), str(device), str(linger)]
    if via_exec:  # the `hami exec` front end sets the library's environment itself
        opts = ["--gpumem", "1G", "--cache", str(region)]
        opts += ["--gpucores", str(limit)] if limit is not None else []
        opts += ["--priority", str(priority)] if priority is not None else []
        opts += ["--core-policy", policy] if policy else []
        e["PYTHONPATH"] = str(ROOT / "src")
        argv = [sys.executable, "-m", "hami", "exec", *opts, "--", *argv]
    else:
        e["LD_PRELOAD"] = str(LIB)
        e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(region)
        if limit is not None:
            e["CUDA_DEVICE_SM_LIMIT"] = str(limit)
        if policy:
            e["GPU_CORE_UTILIZATION_POLICY"] = policy
        if priority is not None:
            e["CUDA_TASK_PRIORITY"] = str(priority)
    e.update(extra or {})
    proc = subprocess.Popen(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return Task(region.stem, proc, limit, kernel_us)


@dataclass
class Trace:
    t: list[float]  # wall-clock ms of each report
    n: list[int]  # launches admitted by then
    kernel_us: int = KERNEL_US  # device time per launch

    @classmethod
    def parse(cls, text: str, kernel_us: int = KERNEL_US) -> "Trace":
        t, n = [], []
        for line in text.splitlines():
            if line and not line.startswith("done"):
                a, b = line.split()
                t.append(float(a))
                n.append(int(b))
        if not t:
            raise AssertionError("load printed no timeline")
        return cls(t, n, kernel_us)

    @property
    def start(self) -> float:
        return self.t[0]

    @property
    def end(self) -> float:
        return self.t[-1]

    def count_at(self, ms: float) -> int:
        i = bisect.bisect_right(self.t, ms) - 1
        return self.n[i] if i >= 0 else 0

    def share(self, a: float, b: float) -> float:
        """Achieved share (percent of the device) between wall-clock ms a and b."""
        return (self.count_at(b) - self.count_at(a)) * self.kernel_us / 1000.0 / (b - a) * 100.0

    def windows(self, a: float, b: float, width: float = WINDOW_MS) -> list[tuple[float, float]]:
        out, x = [], a
        while x + width <= b:
            out.append((x, self.share(x, x + width)))
            x += width
        return out

    def settling_s(self, limit: float, tol: float = 5.0) -> float:
        """Seconds from the first launch to the first 100 ms window within tol of limit."""
        for x, s in self.windows(self.start, self.end):
            if abs(s - limit) <= tol:
                return (x + WINDOW_MS - self.start) / 1000.0
        return float("inf")

    def last_before_gap(self, after: float, gap_ms: float = 100) -> float | None:
        """Time of the last report before the first pause of >= gap_ms after `after`."""
        for i in range(1, len(self.t)):
            if self.t[i] > after and self.t[i] - self.t[i - 1] >= gap_ms:
                return self.t[i - 1]
        return None

    def gap_across(self, ms: float, gap_ms: float = 100) -> tuple[float, float] | None:
        """The reports either side of wall-clock `ms` when they are >= gap_ms apart (a pause
        across that instant), else None."""
        i = bisect.bisect_right(self.t, ms)
        if 0 < i < len(self.t) and self.t[i] - self.t[i - 1] >= gap_ms:
            return self.t[i - 1], self.t[i]
        return None
