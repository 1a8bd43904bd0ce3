"""The scheduler's allocation metrics as HAMi's dashboards read them, while pods come and go.

HAMi's ``hami_node_gpu_overview`` has always been in bytes (Usedmem x 1048576, like every
memory value of the scheduler's endpoint), and since HAMi #2142 the ``device_cores`` label of
``hami_node_gpu_overview`` and ``hami_gpu_memory_allocated_bytes`` is the GPU's registered cores:
a label that followed the allocation made a new series (and ended one) at every placement."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from hami.core.ledger import make_allocation
from hami.core.types import ContainerDevice
from hami.scheduler.metrics import AllocationSnapshot, SchedulerMetrics

from . import _corekit as kit

MIB = 1 << 20
PER_DEVICE = ("hami_gpu_memory_allocated_bytes", "hami_node_gpu_overview")


def _series(metrics: SchedulerMetrics) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(metrics.render().decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _place(led, name: str, mem: int, cores: int):
    pod = kit.pod(name, [kit.ctr(mem=mem, cores=cores)], ns="team")
    alloc = make_allocation(pod, "n1", {"NVIDIA": ((ContainerDevice("GPU-n1-0", "NVIDIA", mem, cores),),)})
    led.add_pod(alloc)
    return alloc


def test_overview_is_in_bytes_and_device_series_keep_their_labels_through_churn():
    led = kit.ledger(kit.node("n1", 1, mem=16000))
    metrics = SchedulerMetrics(lambda: AllocationSnapshot(led, kit.CONFIG.vendors))
    first = _place(led, "a", 3000, 30)
    before = _series(metrics)
    assert list(before["hami_node_gpu_overview"].values()) == [3000 * MIB]
    assert list(before["hami_gpu_memory_allocated_bytes"].values()) == [3000 * MIB]
    assert {dict(k)["device_cores"] for k in before["hami_node_gpu_overview"]} == {"100"}  # registered

    _place(led, "b", 2000, 20)
    led.remove_pod(first.key)
    after = _series(metrics)
    for name in PER_DEVICE:
        # one series per GPU, the same one before and after: only its value moved
        assert list(after[name]) == list(before[name]), name
    assert list(after["hami_node_gpu_overview"].values()) == [2000 * MIB]
    # what was allocated is still there, as a value: cores allocated and memory limit
    assert list(after["hami_gpu_core_allocated_ratio"].values()) == [20]


def test_legacy_overview_is_in_bytes_too():
    led = kit.ledger(kit.node("n1", 1, mem=16000))
    _place(led, "a", 3000, 30)
    got = _series(SchedulerMetrics(lambda: AllocationSnapshot(led, kit.CONFIG.vendors), legacy=True))
    assert list(got["nodeGPUOverview"].values()) == [3000 * MIB]
    assert {dict(k)["devicecores"] for k in got["GPUDeviceMemoryAllocated"]} == {"100"}


async def test_scrapes_that_arrive_together_share_one_copy_and_one_render():
    """The endpoint answers anyone who reaches it (Service port and NodePort 31993). Each scrape
    copied the ledger on the scheduler's event loop (10-45 ms for 1000 nodes, Filter and Bind
    waiting meanwhile) and formatted ~9 MB in a thread: a client opening many connections at once
    bought that many copies. Scrapes that arrive while one is being made now get its answer."""
    import asyncio
    import threading

    import aiohttp

    from hami.serve import ConnectionGuard

    led = kit.ledger(kit.node("n1", 1, mem=16000))
    _place(led, "a", 3000, 30)
    metrics = SchedulerMetrics(lambda: AllocationSnapshot(led, kit.CONFIG.vendors))
    copies, renders, release = [], [], threading.Event()
    rows, render = metrics.rows, metrics.render

    def counted_rows():
        copies.append(1)
        return rows()

    def held_render(r):
        renders.append(1)
        release.wait(30)  # the first scrape is still being formatted when the others come
        return render(r)

    metrics.rows, metrics.render = counted_rows, held_render  # type: ignore[method-assign]
    guard = ConnectionGuard()
    runner = await metrics.serve("127.0.0.1", 0, guard=guard)
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
        async with aiohttp.ClientSession() as s:

            async def get() -> bytes:
                async with s.get(url, timeout=aiohttp.ClientTimeout(total=60)) as r:
                    assert r.status == 200
                    return await r.read()

            first = asyncio.ensure_future(get())
            while not renders:
                await asyncio.sleep(0.01)
            more = [asyncio.ensure_future(get()) for _ in range(5)]
            while sum(1 for c in guard.conns.values() if c.busy) < 6:  # every handler is running
                await asyncio.sleep(0.01)
            release.set()
            bodies = await asyncio.gather(first, *more)
    finally:
        release.set()
        await runner.cleanup()
    assert (len(copies), len(renders)) == (1, 1)
    assert len(set(bodies)) == 1 and b"hami_node_gpu_overview{" in bodies[0]
    # a scrape after that one is a new one: it sees what changed since
    later = metrics.render(metrics.rows())
    assert (len(copies), len(renders)) == (2, 2) and later == bodies[0]
