"""Filter cost of a pod that fits nowhere, before and after cheap refusals, in one process.

Clusters of 1000 and 5000 nodes x 8 GPUs (5 background pods a node, placed by the core) as in
``bench_core_filter.py``. Each case times ``hami.core.filter_pod`` on the exact path
(``exact=True``: every node fitted device by device for its reason, the path before) and on the
default path (summary refusals, :mod:`hami.core.refuse`; refusals remembered per pod shape and
node version, :mod:`hami.core.verdicts`), runs interleaved so both see the same machine load,
and checks that both give the same node and the same reasons. Beside the wall-clock p50, the
CPU time of the default path (the machine is shared: wall time includes waiting for a core).

* ``unschedulable, first Filter``: a 1-GPU pod asking more memory than any GPU has, a new
  request size every run (nothing remembered helps);
* ``unschedulable, retry after a change``: the same pod again after one background pod was
  placed or removed (what kube-scheduler does on every cluster event);
* ``type nowhere``: a pod asking for a GPU model no node has (``use-gputype``), first Filter
  and retry;
* ``quota spent``: a 1-GPU pod in a namespace whose quota has less memory left than it asks;
* ``two containers``: a pod whose first container asks more memory than any GPU has;
* ``UUID nowhere``: a pod naming a GPU UUID no node has (``use-gpuuuid``);
* ``mutex, type nowhere``: the same as ``type nowhere`` under the ``mutex`` device policy (only
  GPUs nobody uses), first Filter and retry;
* ``mutex, larger than any unused GPU``: a 1-GPU ``mutex`` pod asking more memory than any
  unused GPU has, a new size every run, and its retry after a change;
* ``schedulable 1-GPU pod`` (the target case of ``bench_core_filter.py``) and the same after a
  change: must not get slower;
* last, after one sharer is placed on every GPU: ``whole GPU``, a pod asking 100 % of a GPU's
  memory (``gpumem-percentage``, the default of a pod asking ``nvidia.com/gpu`` alone); and
  ``mutex, every GPU has a sharer``: a small 1-GPU ``mutex`` pod (a new size every run) that
  every GPU refuses for its sharer (``ExclusiveDeviceAllocateConflict``).

Also the extender's share for an unschedulable result (``FailedNodes`` and the event lines), and
the whole ``Extender.filter`` for it: a retry with nothing changed (answered from the previous
answer) and a retry after a change.
Run: ``.venv/bin/python bench/bench_unschedulable.py [--sizes 1000,5000] [--runs R] [--fill F]``.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from bench_core_filter import build, make_pod, percentile

from hami.core import SchedulerConfig, admit_pod, filter_pod, schedule_pod
from hami.core.ledger import make_allocation
from hami.core.types import ContainerDevice
from hami.core.refuse import MemoryCeilings
from hami.scheduler.extender import failed_maps, failure_summary, render_failures
from hami.vendors import build_vendors


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1e3, out


def case(label: str, runs: int, make, change, ledger, names, config, fits: bool = False) -> None:
    """Time ``make(i)``'s pod on both paths, ``change(i)`` applied before each run."""
    before, after, cpu = [], [], []
    for i in range(runs):
        change(i)
        pod = make(i)
        order = (True, False) if i % 2 else (False, True)  # alternate which path goes first
        got = {}
        for exact in order:
            c = time.thread_time()
            ms, got[exact] = timed(lambda: filter_pod(pod, names, ledger, config, 0.0, exact=exact))
            (before if exact else after).append(ms)
            if not exact:
                cpu.append((time.thread_time() - c) * 1e3)
        slow, fast = got[True], got[False]
        assert slow.node == fast.node, (label, slow.node, fast.node)
        assert (slow.node is not None) == fits, (label, slow.node)
        if slow.node is None:
            assert slow.reasons() == fast.reasons(), label
    b, a = percentile(before, 50), percentile(after, 50)
    print(
        f"  {label:<44} before p50 {b:9.3f} ms  after p50 {a:8.3f} ms  ({b / a:7.1f}x)  "
        f"p99 {percentile(before, 99):9.3f} / {percentile(after, 99):8.3f} ms  "
        f"after's CPU p50 {percentile(cpu, 50):.3f} ms  over {runs} runs"
    )


def share_every_gpu(ledger) -> None:
    """One pod a node holding 100 MiB and 1 core of each of its GPUs (no GPU left idle)."""
    for name in ledger.node_names():
        gpus = ledger.node(name).devices
        pod = {"metadata": {"name": f"sharer-{name}", "namespace": "bench", "uid": f"sharer-{name}"}, "spec": {}}
        pod["spec"]["containers"] = [{"name": "c"}]
        used = tuple(ContainerDevice(uuid=d.id, type="NVIDIA", usedmem=100, usedcores=1, index=d.index) for d in gpus)
        ledger.add_pod(make_allocation(pod, name, {"NVIDIA": (used,)}))


def extender_figures(ledger, names: list[str], runs: int, churn) -> None:
    """The whole ``Extender.filter`` for a pod that fits nowhere (the pod read from the cache,
    the core, the memory-ceiling marks, the maps and event lines; not HTTP nor JSON), on this
    ledger: kube-scheduler's retry with nothing changed (answered from the previous answer,
    :mod:`hami.scheduler.retries`), and a retry after a change (a pod placed or removed: decided
    again, the ceilings kept)."""
    import asyncio

    from hami.scheduler.options import Options
    from hami.scheduler.server import SchedulerService

    svc = SchedulerService(Options(), None)
    svc.extender.record = False
    svc.state.ledger = ledger
    pod = make_pod("pending", 1, 102400, 10)
    pod["metadata"]["resourceVersion"] = "1"
    pod["spec"]["schedulerName"] = svc.state.scheduler_name
    svc.state.put_pod(pod)
    body = {"Pod": pod, "NodeNames": names}
    loop = asyncio.new_event_loop()

    def filter_ms(change) -> list[float]:
        out = []
        for i in range(runs):
            change(i)
            t = time.thread_time()
            answer = loop.run_until_complete(svc.extender.filter(body))
            out.append((time.thread_time() - t) * 1e3)
            assert answer["NodeNames"] == [] and len(answer["FailedAndUnresolvableNodes"]) == len(names)
        return out

    filter_ms(lambda i: None)  # the first answer
    still = filter_ms(lambda i: None)
    changed = filter_ms(churn)
    loop.close()
    print(
        f"  Extender.filter, unschedulable pod, CPU p50: retry with nothing changed {percentile(still, 50):.3f} ms "
        f"({getattr(getattr(svc.extender, 'retries', None), 'hits', 0)} answered from the previous answer); retry after a change "
        f"{percentile(changed, 50):.3f} ms; over {runs} runs each"
    )


def figures(n_nodes: int, runs: int, fill: str) -> None:
    config = SchedulerConfig(build_vendors())
    t0 = time.perf_counter()
    ledger = build(n_nodes, 5 * n_nodes, config, fill)
    names = ledger.node_names()
    print(
        f"cluster: {n_nodes} nodes x 8 GPUs, {5 * n_nodes} pods placed ({fill} fill, setup {time.perf_counter() - t0:.1f}s)"
    )
    rng = random.Random(11)
    extra: list[str] = []

    def churn(i: int) -> None:  # one cluster change: a pod placed, or the last one removed
        if extra and i % 2:
            ledger.remove_pod(extra.pop())
            return
        pod = make_pod(f"churn-{i}", 1, 1000, 5)
        r = schedule_pod(pod, [names[rng.randrange(len(names))]], ledger, config, 0.0)
        if r.allocation is not None:
            extra.append(r.allocation.key)

    def still(i: int) -> None:
        pass

    def forget(i: int) -> None:  # nothing remembered: each run a first Filter
        ledger.verdicts.clear()

    def admitted(raw: dict) -> dict:
        return admit_pod(raw, config.vendors)[0]

    slow_runs = max(3, runs // 20)
    too_big = admitted(make_pod("too-big", 1, 102400, 10))
    b200 = {"nvidia.com/use-gputype": "B200"}  # a model no node has
    nowhere = admitted(make_pod("nowhere", 1, 3000, 10, b200))
    uuid = {"nvidia.com/use-gpuuuid": "GPU-elsewhere"}  # a GPU no node has
    target = admitted(make_pod("probe", 1, 3000, 30))
    ledger.set_quota("capped", "q", {"limits.nvidia.com/gpumem": "2000"}, config.vendors)

    def capped(i: int) -> dict:
        pod = make_pod(f"capped-{i}", 1, 3000 + i, 10)
        pod["metadata"]["namespace"] = "capped"
        return admitted(pod)

    def two(i: int) -> dict:
        pod = make_pod(f"two-{i}", 1, 102400 + i, 10)
        pod["spec"]["containers"].append({"name": "d", "resources": {"limits": {"nvidia.com/gpu": 1}}})
        return admitted(pod)

    def whole(i: int) -> dict:  # nvidia.com/gpu alone: 100 % of a GPU's memory, all its cores
        return admitted(make_pod(f"whole-{i}", 1, None, None))

    new_size = lambda i: admitted(make_pod(f"big-{i}", 1, 102400 + i, 10))  # noqa: E731
    case("unschedulable, first Filter", slow_runs, new_size, still, ledger, names, config)
    filter_pod(too_big, names, ledger, config, 0.0)
    case("unschedulable, retry after a change", slow_runs, lambda i: too_big, churn, ledger, names, config)
    b200_pod = lambda i: admitted(make_pod(f"b200-{i}", 1, 3000 + i, 10, b200))  # noqa: E731
    case("type nowhere, first Filter", slow_runs, b200_pod, still, ledger, names, config)
    filter_pod(nowhere, names, ledger, config, 0.0)
    case("type nowhere, retry", slow_runs, lambda i: nowhere, churn, ledger, names, config)
    case("quota spent, first Filter", slow_runs, capped, still, ledger, names, config)
    case("two containers, the first too big, first", slow_runs, two, still, ledger, names, config)
    uuid_pod = lambda i: admitted(make_pod(f"uuid-{i}", 1, 3000 + i, 10, uuid))  # noqa: E731
    case("UUID nowhere, first", slow_runs, uuid_pod, still, ledger, names, config)
    filter_pod(admitted(make_pod("uuid", 1, 3000, 10, uuid)), names, ledger, config, 0.0)
    case(
        "UUID nowhere, retry",
        slow_runs,
        lambda i: admitted(make_pod("uuid", 1, 3000, 10, uuid)),
        churn,
        ledger,
        names,
        config,
    )
    mutex = {**b200, "hami.io/gpu-scheduler-policy": "mutex"}
    mutex_pod = lambda i: admitted(make_pod(f"mutex-{i}", 1, 3000 + i, 10, mutex))  # noqa: E731
    case("mutex, type nowhere, first", slow_runs, mutex_pod, still, ledger, names, config)
    filter_pod(admitted(make_pod("mutex", 1, 3000, 10, mutex)), names, ledger, config, 0.0)
    same_mutex = lambda i: admitted(make_pod("mutex", 1, 3000, 10, mutex))  # noqa: E731
    case("mutex, type nowhere, retry", slow_runs, same_mutex, churn, ledger, names, config)
    alone = {"hami.io/gpu-scheduler-policy": "mutex"}
    mutex_big = lambda i: admitted(make_pod(f"mutex-big-{i}", 1, 102400 + i, 10, alone))  # noqa: E731
    case("mutex, larger than any unused GPU, first", slow_runs, mutex_big, still, ledger, names, config)
    filter_pod(admitted(make_pod("mutex-big", 1, 102400, 10, alone)), names, ledger, config, 0.0)
    same_big = lambda i: admitted(make_pod("mutex-big", 1, 102400, 10, alone))  # noqa: E731
    case("mutex, larger than any unused GPU, retry", slow_runs, same_big, churn, ledger, names, config)
    case("schedulable 1-GPU pod", runs, lambda i: target, still, ledger, names, config, fits=True)
    case("schedulable 1-GPU pod, after a change", runs, lambda i: target, churn, ledger, names, config, fits=True)
    result = filter_pod(too_big, names, ledger, config, 0.0)
    slow = filter_pod(too_big, names, ledger, config, 0.0, exact=True)

    ceilings = MemoryCeilings()

    def extender(r) -> None:  # what Extender.filter does with a refusal besides the core
        failed = ceilings.mark(r.failed, r.pod, ledger, config.vendors)
        rows = render_failures(failed)
        resolvable, unresolvable = failed_maps(failed, rows)
        failure_summary(failed, rows)
        answer = {"NodeNames": [], "FailedNodes": resolvable, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
        json.dumps(answer)  # the HTTP answer's body

    ms = {
        k: [timed(lambda: extender(r))[0] for _ in range(slow_runs)] for k, r in (("before", slow), ("after", result))
    }
    marks = [
        timed(lambda: ceilings.mark(result.failed, result.pod, ledger, config.vendors))[0] for _ in range(slow_runs)
    ]
    print(
        "  extender's FailedNodes, FailedAndUnresolvableNodes, event lines and JSON for that refusal "
        f"(besides the above): p50 {percentile(ms['before'], 50):.3f} ms with fitted refusals, "
        f"{percentile(ms['after'], 50):.3f} ms after; of which the memory-ceiling marks "
        f"{percentile(marks, 50):.3f} ms"
    )
    extender_figures(ledger, names, slow_runs, churn)
    t0 = time.perf_counter()
    share_every_gpu(ledger)
    print(f"  then one sharer on every GPU ({time.perf_counter() - t0:.1f}s):")
    case("whole GPU (100 % of its memory), first", slow_runs, whole, forget, ledger, names, config)
    shy = lambda i: admitted(make_pod(f"mutex-small-{i}", 1, 1000 + i, 10, alone))  # noqa: E731
    case("mutex, every GPU has a sharer, first", slow_runs, shy, still, ledger, names, config)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,5000", help="node counts, comma-separated")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--fill", choices=("binpack", "round-robin"), default="binpack")
    args = ap.parse_args()
    print("before: filter_pod(exact=True), every node fitted; after: the default path; p50 over interleaved runs")
    for size in args.sizes.split(","):
        figures(int(size), args.runs, args.fill)


if __name__ == "__main__":
    main()
