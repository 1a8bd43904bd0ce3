"""What seeing the DRA front end costs the scheduler: its watch cache and the UI's documents with
DRA objects at scale (in-process, no API server: the same handlers the watches feed).

The cache gets ``--nodes`` ResourceSlices of driver gpu.hami.io (8 GPUs each, as ``hami dra``
publishes them) and ``--claims`` allocated ResourceClaims spread over the GPUs (4000 MiB, 5 cores,
each reserved by one pod). Printed: the time to take the initial lists (slices, then claims), one
slice event and one claim event (each runs on the scheduler's event loop), and the time to build
``/api/v1/nodes`` and ``/api/v1/pods`` (model only, median of ``--runs``).

Run: ``.venv/bin/python bench/bench_dra_visibility.py [--nodes 1000 --claims 5000 --runs 5]``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hami.core import SchedulerConfig  # noqa: E402
from hami.dra.model import SliceSettings, resource_slice  # noqa: E402
from hami.scheduler.state import ClusterState  # noqa: E402
from hami.ui import model  # noqa: E402
from hami.vendors import build_vendors  # noqa: E402


class Gpu:
    def __init__(self, node: int, index: int) -> None:
        self.index, self.uuid, self.model, self.memory_mib, self.numa = index, f"GPU-{node}-{index}", "A100", 81920, 0


def claim(c: int, nodes: int) -> dict:
    n, g = c % nodes, (c // nodes) % 8
    return {
        "metadata": {"name": f"c{c}", "namespace": f"ns{c % 20}", "uid": f"u{c}", "resourceVersion": "1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "driver": "gpu.hami.io",
                            "pool": f"n{n}",
                            "device": f"gpu-{g}",
                            "request": "gpu",
                            "consumedCapacity": {"memory": "4000Mi", "cores": "5", "shares": "1"},
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": f"p{c}", "uid": f"pu{c}"}],
        },
    }


def timed(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--claims", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    state = ClusterState(SchedulerConfig(vendors=build_vendors()))
    slices = [resource_slice(f"n{n}", [Gpu(n, i) for i in range(8)], SliceSettings()) for n in range(a.nodes)]
    claims = [claim(c, a.nodes) for c in range(a.claims)]
    print(f"{a.nodes} nodes x 8 GPUs (ResourceSlices), {a.claims} allocated claims")
    print(f"list of slices into the cache: {timed(lambda: state.slice_handler.replace(slices)):.3f} s")
    print(f"list of claims into the cache: {timed(lambda: state.claim_handler.replace(claims)):.3f} s")
    changed = copy.deepcopy(slices[a.nodes // 2])
    print(f"one slice event: {timed(lambda: state.slice_handler.apply('MODIFIED', changed)) * 1000:.2f} ms")
    print(f"one claim event: {timed(lambda: state.claim_handler.apply('MODIFIED', claims[7])) * 1000:.2f} ms")
    for build in (model.nodes_document, model.pods_document):
        times = [timed(lambda: build(state, 0.0)) for _ in range(a.runs)]
        print(f"{build.__name__} (model only): median {statistics.median(times):.3f} s over {a.runs} runs")


if __name__ == "__main__":
    main()
