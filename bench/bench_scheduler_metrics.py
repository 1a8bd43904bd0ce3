"""Cost of one scheduler `/metrics` render (HAMi's allocation metrics computed from the ledger at
scrape time) for 1000 nodes x 8 GPUs with 5000 pods placed. Baseline: one pass over the same
ledger's devices and pods doing nothing but reading them. Then the same cluster on the DRA front
end (8000 GPUs in ResourceSlices, 5000 allocated claims): the render, and the part of it on the
scheduler's event loop, which must stay small (Filter and Bind wait for it)."""

from __future__ import annotations

import gc
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hami.core import DeviceInfo, Ledger, NodeDevices  # noqa: E402
from hami.core.ledger import make_allocation  # noqa: E402
from hami.core.types import ContainerDevice  # noqa: E402
from hami.dra.claims import claim_usage, slice_devices  # noqa: E402
from hami.dra.model import SliceSettings, resource_slice  # noqa: E402
from hami.scheduler.metrics import AllocationSnapshot, SchedulerMetrics  # noqa: E402

NODES, GPUS, PODS, RUNS = 1000, 8, 5000, 10


def build() -> Ledger:
    led = Ledger()
    for n in range(NODES):
        led.set_node(
            NodeDevices(
                f"node-{n:04d}",
                tuple(
                    DeviceInfo(
                        id=f"GPU-{n:04d}-{i}",
                        index=i,
                        count=10,
                        devmem=81920,
                        devcore=100,
                        type="NVIDIA-H100",
                        health=True,
                        vendor="NVIDIA",
                    )
                    for i in range(GPUS)
                ),
            )
        )
    for p in range(PODS):
        n, g = p % NODES, (p // NODES) % GPUS
        pod = {
            "metadata": {"name": f"p{p}", "namespace": f"ns{p % 20}", "uid": f"uid-{p}"},
            "spec": {"containers": [{"name": "c"}]},
        }
        led.add_pod(
            make_allocation(
                pod, f"node-{n:04d}", {"NVIDIA": ((ContainerDevice(f"GPU-{n:04d}-{g}", "NVIDIA", 4000, 10),),)}
            )
        )
    return led


class _Gpu:
    def __init__(self, n: int, i: int) -> None:
        self.index, self.uuid, self.model, self.memory_mib, self.numa = i, f"GPU-dra-{n:04d}-{i}", "H100", 81920, 0


def build_dra() -> AllocationSnapshot:
    """The DRA front end's view of the same cluster: one slice per node, one claim per pod."""
    slices = [resource_slice(f"node-{n:04d}", [_Gpu(n, i) for i in range(GPUS)], SliceSettings()) for n in range(NODES)]
    claims = []
    for p in range(PODS):
        n, g = p % NODES, (p // NODES) % GPUS
        result = {
            "request": "gpu",
            "driver": "gpu.hami.io",
            "pool": f"node-{n:04d}",
            "device": f"gpu-{g}",
            "consumedCapacity": {"memory": "4000Mi", "cores": "10", "shares": "1"},
            "shareID": f"s{p}",
        }
        claim = {
            "metadata": {"name": f"c{p}", "namespace": f"ns{p % 20}", "uid": f"uid-c{p}"},
            "status": {
                "allocation": {"devices": {"results": [result]}},
                "reservedFor": [{"resource": "pods", "name": f"p{p}", "uid": f"uid-{p}"}],
            },
        }
        claims.append(claim_usage(claim))
    return AllocationSnapshot(Ledger(), dra_devices=slice_devices(slices), claims=claims)


def timed(fn) -> list[float]:
    """``RUNS`` timings of one call each (garbage collection left on, as in the real process)."""
    return timeit.repeat(fn, setup=gc.enable, repeat=RUNS, number=1)


def main() -> None:
    led = build()
    metrics = SchedulerMetrics(lambda: AllocationSnapshot(led))
    size = len(metrics.render())
    render = timed(metrics.render)
    copy = timed(metrics.rows)  # the part that runs on the scheduler's event loop

    def walk():
        for node in led.node_names():
            for _ in led.device_usage(node):
                pass
        for alloc in led.pods():
            for _ in alloc.usage:
                pass

    base = timed(walk)
    r50, b50 = statistics.median(render), statistics.median(base)
    print(
        f"scheduler /metrics, {NODES} nodes x {GPUS} GPUs, {PODS} pods ({size / 1e6:.1f} MB of text): "
        f"p50 {r50 * 1e3:.0f} ms, max {max(render) * 1e3:.0f} ms over {RUNS} runs"
    )
    print(
        f"  of which on the event loop (copying rows out of the ledger): p50 {statistics.median(copy) * 1e3:.1f} ms; "
        "the text is formatted in a worker thread"
    )
    print(f"baseline (walk the same ledger): p50 {b50 * 1e3:.1f} ms; ratio {r50 / b50:.0f}")

    dra = build_dra()
    dra_metrics = SchedulerMetrics(lambda: dra)
    dra_render = timed(dra_metrics.render)
    dra_copy = timed(dra_metrics.rows)
    print(
        f"the same cluster on the DRA front end ({NODES * GPUS} GPUs in slices, {PODS} claims): "
        f"render p50 {statistics.median(dra_render) * 1e3:.0f} ms, of which on the event loop "
        f"p50 {statistics.median(dra_copy) * 1e3:.1f} ms (the claims are counted in the worker thread)"
    )


if __name__ == "__main__":
    main()
