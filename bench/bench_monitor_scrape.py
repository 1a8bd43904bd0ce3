"""Cost of one `hami monitor` scrape (list the containers dir, read and validate every region,
build the metric families, render the text) for a busy node: 100 GPU containers with 4 live
processes each on 2 GPUs. Baseline: reading the same region files whole with open().read()."""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from hami.monitor.exporter import MonitorCollector  # noqa: E402
from tests.unit import _regionkit as kit  # noqa: E402

CONTAINERS, PROCS, RUNS = 100, 4, 30


def timed(fn) -> list[float]:
    """``RUNS`` timings of one call each (garbage collection left on, as in the real process)."""
    return timeit.repeat(fn, setup=gc.enable, repeat=RUNS, number=1)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "containers"
        procs = [
            kit.Proc(
                pid=100 + i,
                hostpid=1000 + i,
                used={0: (1, 2, 3, 1 << 28), 1: (1, 2, 3, 1 << 27)},
                sm_util={0: 10, 1: 5},
            )
            for i in range(PROCS)
        ]
        data = kit.build(uuids=("GPU-a", "GPU-b"), limits=(1 << 33, 1 << 33), procs=procs)
        files = []
        for i in range(CONTAINERS):
            d = root / f"00000000-0000-4000-8000-{i:012d}_main"
            d.mkdir(parents=True)
            (d / "r.cache").write_bytes(data)
            files.append(d / "r.cache")
        registry = CollectorRegistry()
        registry.register(MonitorCollector("node", str(root)))
        scrape = timed(lambda: generate_latest(registry))
        base = timed(lambda: [f.read_bytes() for f in files])
    p50, p99 = statistics.median(scrape), max(scrape)
    b50 = statistics.median(base)
    print(
        f"monitor scrape, {CONTAINERS} containers x {PROCS} processes x 2 GPUs: "
        f"p50 {p50 * 1e3:.1f} ms, max {p99 * 1e3:.1f} ms over {RUNS} runs"
    )
    print(f"baseline (read every region file whole, 2 MB each): p50 {b50 * 1e3:.1f} ms; ratio {p50 / b50:.2f}")


if __name__ == "__main__":
    main()
