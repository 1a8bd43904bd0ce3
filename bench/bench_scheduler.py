"""`hami scheduler` figures: /filter latency over HTTP, and end-to-end placement throughput.

1. /filter over HTTP (default; no API server): 1000 fake nodes x 8 GPUs, 5000 pods placed, then
   5000 nodes x 8 GPUs, 25,000 pods placed (``--sizes``), with the resident memory (RSS) of this
   process, which is the scheduler's service with its caches (the Node and Pod objects the bench
   builds are the very objects the caches keep).
   The scheduler's cache is filled from Node and Pod objects (registration and allocation
   annotations) through the same watch handlers a live cluster feeds, then the in-process
   aiohttp server is called over loopback TCP exactly as kube-scheduler calls it
   (``ExtenderArgs`` with every node in ``NodeNames``), one new pod per call. Each call decides and
   reserves; nothing is written to an API server here (``record=False``; by default a decision
   is written by the Binding anyway, and the cost of the writes is in figure 2). Printed beside it, as in-process
   baselines, the same decision through ``Extender.filter`` without HTTP and through
   ``hami.core.schedule_pod`` alone. Each probe pod's allocation is marked finished (bind-phase
   success, as the device plugin does) 50 probes later, so 50 binds are always in flight, as in
   a burst (Filter avoids their nodes while another fits).
2. ``--e2e``: the real control plane (kube-apiserver + kube-scheduler + kwok, the test
   harness), 100 kwok nodes x 8 GPUs, ``hami scheduler`` as a subprocess called as the chart
   sets it up (plain HTTP on its loopback listener, ``--extender-bind``), 1000
   GPU pods created at once; pods/s from the first creation to the last pod bound (the
   Binding's PodScheduled condition). One run per node policy (``--policies``, default
   binpack and spread) and node side (``--injection``): ``allocate``, HAMi's lock protocol, where
   kwok runs no device plugin and the test suite's PluginStandIn plays the node side of the
   handoff as `hami device-plugin` does with its defaults (marks the pod allocated, leaves the
   node lock for the next Bind to swap over and removes it after 1 s if none did; the nodes
   declare hami.io/node-lock-handoff=swap); ``nri``, the lockless path, where NriStandIn plays
   `hami device-plugin --injection=nri` (writes hami.io/node-injection=nri on every node, marks
   each bound pod allocated from its own annotations, never touches a lock). The stand-in runs
   in a process of its own (bench/standin_process.py; its CPU is counted as "node stand-in"):
   in this process it shared the interpreter lock with the threads creating the pods, which the
   baseline's creation does not pay. Each run starts on
   empty nodes (the previous run's pods force-deleted); printed per run: pods/s and the ratio to
   the baseline, nodes used beside the nodes placing the same pods one by one uses (the
   simulator), GPUs over capacity (from the pods' own allocation annotations), API requests per
   pod (kube-apiserver's ``apiserver_request_total``, every client), and the machine's load. ``FailedScheduling`` events of each run are counted and grouped by
   message (numbers and names folded). Filter/Bind latencies including the API writes
   are read from the scheduler's own /metrics histograms (bucket bounds). Beside it: the same
   nodes with GPU-less pods through default-scheduler (both kube-schedulers with the
   harness's client rate limit, qps 1000 / burst 2000, as the chart sets it); per run, how many nodes were busy binding
   at once and at what rate each (the node lock serialises one node's binds), and the CPU the
   whole machine spent per pod, by process (control plane, kwok, the stand-in and this
   process included: on a machine this small, pods/s is about cores / CPU per pod); the
   stand-in's own API time per pod. Completion is polled on the unbound pods only (watch cache).

``--floor`` adds a run of the GPU pods through ``bench/null_extender`` (Go, built once with the
local toolchain): Filter answers the first candidate, Bind forwards the Binding, nothing else;
the floor under any extender on this machine; ``--floor-filter-only`` also runs it without
``bindVerb`` (kube-scheduler posts the Binding itself). Each pod's end is its ``Scheduled`` event's
``eventTime`` (microseconds; the PodScheduled condition's whole seconds as the fallback).

Run: ``.venv/bin/python bench/bench_scheduler.py [--sizes 1000x5000,5000x25000 --runs 500] [--e2e]``
(``--sizes none --e2e --injection allocate,nri``: the end-to-end runs alone, before and after the
lockless path; ``--profile FILE``: the scheduler under cProfile).
Targets: filter p99 <= 15 ms; >= 50 pods/s; no FailedScheduling event for pods that fit.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "devkit" / "src"))  # the test harness (hami_devkit)
sys.path.insert(0, str(ROOT))

from hami.core import Ledger, SchedulerConfig, admit_pod, schedule_pod  # noqa: E402
from hami.core.codec import encode_node_devices_json  # noqa: E402
from hami.core.types import DeviceInfo  # noqa: E402

MODELS = (("NVIDIA-A100-SXM4-80GB", 81920), ("NVIDIA-H100-80GB-HBM3", 81559), ("NVIDIA-L4", 23034))


def percentile(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def node_object(n: int) -> dict:
    model, mem = MODELS[n % len(MODELS)]
    name = f"node-{n:04d}"
    devices = [
        DeviceInfo(
            id=f"GPU-{n:04d}-{i}",
            index=i,
            count=10,
            devmem=mem,
            devcore=100,
            type=model,
            numa=i // 4,
            mode="hami-core",
            health=True,
        )
        for i in range(8)
    ]
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "annotations": {"hami.io/node-nvidia-register": encode_node_devices_json(devices)},
        },
        "status": {"allocatable": {"nvidia.com/gpu": "80"}},
    }


def pod_object(name: str, gpus: int, mem: int, cores: int) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"uid-{name}",
            "annotations": {},
            "resourceVersion": "1",
        },
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [
                {
                    "name": "c",
                    "resources": {
                        "limits": {"nvidia.com/gpu": gpus, "nvidia.com/gpumem": mem, "nvidia.com/gpucores": cores}
                    },
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def rss_mib() -> float:
    """Resident memory of this process (MiB), from /proc; NaN where there is none."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, ValueError):
        return float("nan")


def placed_pods(
    nodes: list[dict], n_pods: int, config: SchedulerConfig, fill: str = "binpack", seed: int = 7
) -> list[dict]:
    """Pods with allocation annotations, decided by the core (as if a scheduler placed them):
    each offered every node (``binpack``, the default policy) or one node each in turn
    (``round-robin``: an even fill, quick to build)."""
    from hami.core import node_devices_from_object

    rng = random.Random(seed)
    ledger = Ledger()
    for n in nodes:
        ledger.set_node(node_devices_from_object(n, config.vendors))
    out = []
    for i in range(n_pods):
        p = pod_object(f"bg-{i}", rng.choice((1, 1, 1, 2)), rng.choice((2000, 4000, 8000)), rng.choice((5, 10, 20)))
        offered = None if fill == "binpack" else [nodes[i % len(nodes)]["metadata"]["name"]]
        r = schedule_pod(admit_pod(p, config.vendors)[0], offered, ledger, config, 0.0)
        p["metadata"]["annotations"] = dict(r.annotations)
        out.append(p)
    return out


async def filter_figures(args: argparse.Namespace, n_nodes: int, n_pods: int) -> None:
    import gc

    import aiohttp
    from aiohttp import web

    from hami.scheduler.options import Options
    from hami.scheduler.server import SchedulerService

    gc.collect()
    rss0 = rss_mib()
    svc = SchedulerService(Options(), None)
    svc.extender.record = False
    config = svc.state.config
    t0 = time.perf_counter()
    nodes = [node_object(n) for n in range(n_nodes)]
    pods = placed_pods(nodes, n_pods, config, args.fill)
    t1 = time.perf_counter()
    svc.state.node_handler.replace(nodes)
    svc.state.pod_handler.replace(pods)
    t2 = time.perf_counter()
    assert len(svc.state.ledger.pods()) == n_pods, "not every background pod was rebuilt from its annotations"
    names = [n["metadata"]["name"] for n in nodes]
    del nodes, pods  # from here on only the caches hold them
    gc.collect()
    rss1 = rss_mib()
    print(
        f"cluster: {n_nodes} nodes x 8 GPUs, {n_pods} pods placed ({args.fill} fill); cache filled from objects in "
        f"{(t2 - t1) * 1e3:.0f} ms (objects built in {t1 - t0:.1f}s); scheduler process RSS {rss1:.0f} MiB "
        f"({rss1 - rss0:.0f} MiB for this cluster's caches and ledger, {rss0:.0f} MiB before)"
    )

    runner = web.AppRunner(svc.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    rng = random.Random(11)

    in_flight: list[dict] = []

    def probe(i: int) -> dict:
        p = pod_object(f"probe-{i}", 1, rng.choice((1000, 3000)), rng.choice((10, 30)))
        svc.state.put_pod(p)  # as the pod watch would: a Filter is only for a pod the API server has
        in_flight.append(p)
        if len(in_flight) > 50:  # the device plugin marks an earlier pod allocated (its watch event)
            done = in_flight.pop(0)
            meta = done["metadata"]
            svc.state.put_pod(
                {
                    **done,
                    "metadata": {
                        **meta,
                        "resourceVersion": "2",
                        "annotations": {**meta["annotations"], "hami.io/bind-phase": "success"},
                    },
                }
            )
        return p

    http, direct, core = [], [], []
    results = {"scheduled": 0, "pending": 0}
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{port}/filter"
        for i in range(20):  # warm-up (connection, code paths)
            await session.post(url, data=json.dumps({"Pod": probe(-1 - i), "NodeNames": names}))
        for i in range(args.runs):  # interleaved, so the three see the same cluster fill
            body = json.dumps({"Pod": probe(i), "NodeNames": names, "Nodes": None})
            t = time.perf_counter()
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                answer = await r.json()
            http.append(time.perf_counter() - t)
            results["scheduled" if answer.get("NodeNames") else "pending"] += 1
            t = time.perf_counter()
            await svc.extender.filter({"Pod": probe(100000 + i), "NodeNames": names})
            direct.append(time.perf_counter() - t)
            p = admit_pod(probe(200000 + i), config.vendors)[0]
            t = time.perf_counter()
            schedule_pod(p, names, svc.state.ledger, config, 0.0)
            core.append(time.perf_counter() - t)
    await runner.cleanup()
    ms = lambda xs, q: percentile(xs, q) * 1e3  # noqa: E731
    c50 = ms(core, 50)
    print(
        f"/filter over HTTP (decide + reserve, no API patch): p50 {ms(http, 50):.2f} ms  p99 {ms(http, 99):.2f} ms "
        f"over {args.runs} new 1-GPU pods ({results['scheduled']} placed, {results['pending']} pending) "
        f"[{ms(http, 50) / c50:.1f}x core]"
    )
    print(
        f"Extender.filter in process (no HTTP):                p50 {ms(direct, 50):.2f} ms  p99 {ms(direct, 99):.2f} ms"
    )
    print(f"hami.core.schedule_pod alone (baseline):             p50 {c50:.2f} ms  p99 {ms(core, 99):.2f} ms")
    print(
        f"target /filter p99 <= 15 ms: {'met' if ms(http, 99) <= 15 else 'NOT met'}; "
        f"RSS after the runs {rss_mib():.0f} MiB"
    )


def _histogram_quantiles(text: str, name: str, label: str) -> str:
    buckets = []
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{") and f'outcome="{label}"' in line:
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    if not buckets or buckets[-1][1] == 0:
        return "no samples"
    total = buckets[-1][1]
    q = lambda f: next(le for le, c in buckets if c >= f * total)  # noqa: E731
    return f"p50 <= {q(0.5) * 1e3:g} ms, p99 <= {q(0.99) * 1e3:g} ms over {int(total)} calls"


def bound_times(items: list[dict], events: list[dict]) -> dict[str, float]:
    """When each pod was bound: the ``eventTime`` of kube-scheduler's ``Scheduled`` event (written
    once the Binding succeeded; microseconds), else the PodScheduled condition's time (whole
    seconds: a run of 2-4 s would be cut by up to one, the ratios moving with it)."""
    from datetime import datetime

    when = {
        p["metadata"]["name"]: calendar.timegm(time.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ"))
        for p in items
        for c in p["status"].get("conditions") or ()
        if c["type"] == "PodScheduled"
    }
    for e in events:
        stamp, name = e.get("eventTime"), (e.get("involvedObject") or {}).get("name")
        if e.get("reason") == "Scheduled" and stamp and name in when:
            when[name] = datetime.fromisoformat(stamp).timestamp()
    return when


def node_spread(items: list[dict], when: dict[str, float], span: float) -> str:
    """Where the time went, per node: how many nodes received pods, how many were busy binding
    at once on average (sum of each node's first-to-last bind span / total span), and the rate
    one busy node sustained. HAMi's node lock serialises the binds of one node, so the overall
    rate is about (nodes busy at once) x (rate of one busy node)."""
    by_node: dict[str, list[float]] = {}
    for p in items:
        by_node.setdefault(p["spec"]["nodeName"], []).append(when.get(p["metadata"]["name"], 0.0))
    spans = [max(ts) - min(ts) + 1e-3 for ts in by_node.values()]
    busy = sum(spans) / span
    per_node = sum(len(ts) for ts in by_node.values()) / sum(spans)
    return (
        f"{len(by_node)} nodes received pods ({len(items) / len(by_node):.0f} each on average); "
        f"{busy:.1f} nodes busy at once on average, {per_node:.1f} pods/s per busy node"
    )


def cpu_seconds(own: dict[str, int] | None = None) -> dict[str, float]:
    """CPU seconds (user + system) used so far by every process on this machine, by program
    name (a Python process by its module or script), from /proc; empty where there is none.
    ``own``: only these processes (name -> pid), e.g. this run's control plane, its scheduler
    and this process, when other work shares the machine (other jobs' API servers would
    otherwise count as this run's)."""
    import os

    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, float] = {}
    if own is not None:
        for name, pid in own.items():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[f"{pid} {name}"] = (int(fields[11]) + int(fields[12])) / tick
        return out
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                argv = f.read().split("\0")
        except OSError:
            continue
        name = argv[0].rsplit("/", 1)[-1] or "?"
        if name.startswith("python") and len(argv) > 1:
            name = "hami " + argv[3] if argv[1:3] == ["-m", "hami"] and len(argv) > 3 else "bench (stand-in, creation)"
        out[f"{pid} {name}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_per_pod(before: dict[str, float], after: dict[str, float], pods: int) -> str:
    """Where the machine's CPU went during a run, in ms per pod, biggest first."""
    by_name: dict[str, float] = {}
    for key, t in after.items():
        name = key.split(" ", 1)[1]
        by_name[name] = by_name.get(name, 0.0) + t - before.get(key, 0.0)
    total = sum(by_name.values())
    parts = sorted(((v, k) for k, v in by_name.items() if v / pods >= 0.5e-3), reverse=True)
    return f"{total / pods * 1e3:.1f} ms CPU per pod (" + ", ".join(f"{k} {v / pods * 1e3:.1f}" for v, k in parts) + ")"


def failed_scheduling(events: list[dict]) -> str:
    """``FailedScheduling`` events (kube-scheduler's, one per failed attempt; a repeated one
    counts its ``count``), grouped by message with pod/node names and numbers folded."""
    import re

    kinds: dict[str, int] = {}
    for e in events:
        if e.get("reason") != "FailedScheduling":
            continue
        text = re.sub(r"\d+", "N", e.get("message") or "")[:160]
        kinds[text] = kinds.get(text, 0) + (e.get("count") or 1)
    if not kinds:
        return "0 FailedScheduling events"
    return f"{sum(kinds.values())} FailedScheduling events: " + "; ".join(
        f"{c}x {k!r}" for k, c in sorted(kinds.items(), key=lambda kv: -kv[1])
    )


def timed_standin(base: type) -> type:
    """The test suite's PluginStandIn, timing each pod it serves: queueing in its worker pool
    (seen bound -> work starts) and its own API calls (work starts -> pod marked)."""

    class Timed(base):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            self.queued: list[float] = []
            self.worked: list[float] = []

        def _offer(self, pod: dict) -> None:
            pod.setdefault("metadata", {})["_seen"] = time.perf_counter()
            super()._offer(pod)

        def _serve_safely(self, node: str, pod: dict, key: str) -> None:
            began = time.perf_counter()
            self.queued.append(began - pod["metadata"].get("_seen", began))
            super()._serve_safely(node, pod, key)
            self.worked.append(time.perf_counter() - began)

        def summary(self) -> str:
            if not self.worked:
                return "no pod served"
            return (
                f"{len(self.worked)} serves; queued p50 {percentile(self.queued, 50) * 1e3:.0f} ms, "
                f"p99 {percentile(self.queued, 99) * 1e3:.0f} ms; own API calls (like the plugin: node metadata, pod unless its watched copy postdates the lock, pod patch) "
                f"p50 {percentile(self.worked, 50) * 1e3:.0f} ms, p99 {percentile(self.worked, 99) * 1e3:.0f} ms"
            )

    return Timed


def node_standin(cluster, injection: str, names: list[str]):
    """The node side's stand-in for a run, in a process of its own (bench/standin_process.py): on
    a real cluster it runs on the GPU nodes, and in the bench's process it held the interpreter
    lock that the threads creating the pods need. With ``nri`` it writes
    ``hami.io/node-injection: nri`` on the nodes, as the NRI agent does."""
    from bench.standin_process import StandInProcess

    if injection == "nri":
        return StandInProcess(cluster, "nri", nodes=set(names), workers=len(names) // 2)
    return StandInProcess(cluster, "allocate", workers=len(names) // 2)


def load() -> str:
    """The machine's load average (1, 5, 15 min), printed beside each figure."""
    try:
        with open("/proc/loadavg") as f:
            return "load " + " ".join(f.read().split()[:3])
    except OSError:
        return "load ?"


def over_capacity(items: list[dict], slots: int = 10, mem: int = 81920) -> int:
    """GPUs whose pods, by their own allocation annotations, hold more than the GPU has."""
    from tests.integration._hami import device_usage

    return sum(1 for s, m, c in device_usage(items).values() if s > slots or m > mem or c > 100)


def one_by_one_nodes(nodes: list[dict], pods: list[dict], policy: str) -> int:
    """How many nodes placing ``pods`` one by one (each decision final before the next, the
    simulator) uses on the empty ``nodes`` with node policy ``policy``."""
    from hami.scheduler.options import Options
    from hami.scheduler.server import SchedulerService
    from hami.sim.engine import simulate

    config = SchedulerService(Options(node_policy=policy), None).state.config
    return len({o.node for o in simulate(nodes, pods, config).pods if o.node})


def ensure_namespace(cluster, ns: str) -> None:
    """Create ``ns``; a later round finds it there (its pods cleared), which is fine."""
    from hami_devkit.errors import ApiError

    try:
        cluster.create_namespace(ns)
    except ApiError as exc:
        if exc.status != 409:
            raise


def whole_gpu_pods(plain: list[dict]) -> list[dict]:
    """Kubernetes alone with GPU pods: the GPU-less pods asking ``nvidia.com/gpu: 1`` (the count
    the kwok nodes advertise), for default-scheduler without any extender: what Kubernetes' own
    path costs for a pod with an extended resource, beside the GPU-less baseline."""
    limits = {"limits": {"nvidia.com/gpu": 1}}
    return [
        {**p, "spec": {**p["spec"], "containers": [{"name": "c", "image": "busybox", "resources": limits}]}}
        for p in plain
    ]


def kubernetes_alone(on: bool, run, clear, pods: list[dict], base: float, alones: list) -> None:
    """The run of :func:`whole_gpu_pods` (when ``on``), beside the round's baseline span ``base``."""
    if not on:
        return
    n = len(pods)
    alone, _, _ = run("bench-kubernetes-gpu", pods)
    clear("bench-kubernetes-gpu")
    alones.append((alone, base))
    print(
        f"e2e Kubernetes alone: {n} pods asking nvidia.com/gpu: 1, default-scheduler, no extender, same "
        f"nodes: {n / alone:.0f} pods/s ({base / alone:.2f}x the baseline; {load()})"
    )


def print_alone(alones: list[tuple[float, float]], n: int) -> None:
    for alone, base in alones:
        print(f"  Kubernetes alone, nvidia.com/gpu: 1: {n / alone:5.0f} pods/s {base / alone:.2f}x")


def e2e(args: argparse.Namespace) -> None:
    from concurrent.futures import ThreadPoolExecutor
    import urllib.request

    from bench.bench_dra import per_pod, request_counts
    from hami.core.names import NODE_INJECTION
    from hami_devkit.cluster import KubeCluster, MissingBinaries, SchedulerConfig as KubeSchedulerConfig
    from tests.integration._hami import (
        METADATA_ONLY,
        KeepAliveApi,
        SchedulerProcess,
        gpu_pod,
        make_gpu_node,
    )

    METADATA_LIST = METADATA_ONLY.replace("PartialObjectMetadata", "PartialObjectMetadataList")
    cluster = KubeCluster()
    try:
        cluster.start()
    except MissingBinaries as exc:
        print(f"e2e skipped: {exc}")
        return
    proc = None
    standin_pids: dict[str, int] = {}  # the node side's stand-in process, while one runs
    try:
        names = [f"bench-{i:03d}" for i in range(args.e2e_nodes)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: make_gpu_node(cluster, n, gpus=8, mem=81920, labels={"bench": "on"}), names))
        time.sleep(2.0)  # nodes reach the scheduler's cache
        create = KeepAliveApi(cluster)

        def own_processes() -> dict[str, int]:
            """This run's processes: the control plane, the hami scheduler, this process (the
            stand-in and the pods' creation)."""
            import os

            got = {"bench (creation)": os.getpid()}
            got.update(standin_pids)
            if proc is not None:
                got["hami scheduler"] = proc.proc.pid
            for name, component in cluster.components.items():
                process = getattr(component, "process", None)
                if process is not None:
                    got["kube-scheduler (hami's)" if name == "hami-scheduler" else name] = process.pid
            return got

        def run(ns: str, pods: list[dict]) -> tuple[float, list[dict], str]:
            """Create the pods at once; seconds from the first creation to the last PodScheduled,
            the pods, and the API requests per pod over the run."""
            ensure_namespace(cluster, ns)
            cpu0 = cpu_seconds(own_processes())
            requests0 = request_counts(cluster)
            began = time.time()
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda p: create("POST", f"/api/v1/namespaces/{ns}/pods", p), pods))

            def bound():
                # poll only for one unbound pod, its metadata alone, from the watch cache
                # (resourceVersion=0): listing the unbound pods whole every poll cost the very API
                # server being measured up to ~1 ms per pod, the more the slower the run
                unbound = create(
                    "GET",
                    f"/api/v1/namespaces/{ns}/pods?fieldSelector=spec.nodeName%3D&resourceVersion=0&limit=1",
                    accept=METADATA_LIST,
                )
                return not unbound["items"]

            # the span comes from the PodScheduled timestamps, not from this poll: a slow poll
            # only delays the end of the run, and loads the API server less while it is measured
            cluster.wait_for(bound, f"{len(pods)} pods bound in {ns}", timeout=600, interval=2.0)
            cpu = cpu_per_pod(cpu0, cpu_seconds(own_processes()), len(pods))
            requests = per_pod(requests0, request_counts(cluster), len(pods))
            events = create("GET", f"/api/v1/namespaces/{ns}/events")["items"]
            failed = failed_scheduling(events)
            items = create("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
            assert len(items) == len(pods) and all(p["spec"].get("nodeName") for p in items), "a pod is not bound"
            when = bound_times(items, events)
            span = max(max(when.values()) - began, 1e-3)
            print(f"  {ns}: {node_spread(items, when, span)}")
            print(f"  {ns}: {cpu}")
            print(f"  {ns}: {requests}")
            print(f"  {ns}: {failed}")
            return span, items, requests

        def clear(ns: str) -> None:
            """Remove a run's pods at once (force), so the next run starts from empty nodes."""
            create("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
            cluster.wait_for(
                lambda: not create("GET", f"/api/v1/namespaces/{ns}/pods?limit=1")["items"],
                f"pods of {ns} gone",
                timeout=300,
                interval=1.0,
            )

        def set_injection(value: str | None) -> None:
            """Every bench node says (nri) or stops saying (None) that it injects at creation."""
            with ThreadPoolExecutor(8) as pool:
                list(
                    pool.map(
                        lambda n: create(
                            "PATCH",
                            f"/api/v1/nodes/{n}",
                            {"metadata": {"annotations": {NODE_INJECTION: value}}},
                            content_type="application/merge-patch+json",
                        ),
                        names,
                    )
                )
            time.sleep(2.0)  # the nodes' change reaches the scheduler's cache

        n = args.e2e_pods
        alones: list[tuple[float, float]] = []  # (span of Kubernetes alone with GPU pods, its round's baseline)
        plain = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"b{i:04d}"},
                "spec": {"nodeSelector": {"bench": "on"}, "containers": [{"name": "c", "image": "busybox"}]},
            }
            for i in range(n)
        ]
        whole = whole_gpu_pods(plain)

        # both kube-schedulers run with the harness's client rate limit (qps 1000, burst 2000, as
        # the chart sets it; kube-scheduler's own 50/100 would cap GPU-less pods near 50 pods/s)

        def policy_runs(base: float, rnd: int) -> list[tuple]:
            """One run per node policy and node side, each beside the round's baseline ``base``."""
            out = []
            nonlocal proc
            policies = list(filter(None, args.policies.split(",")))
            for policy in policies if rnd % 2 == 0 else policies[::-1]:  # every other round the other way round
                proc = SchedulerProcess(
                    cluster,
                    "--node-lock-retry-timeout=28s",
                    f"--node-scheduler-policy={policy}",
                    *args.scheduler_flags,
                    loopback=True,
                    profile=f"{args.profile}.{policy}" if args.profile else None,
                ).start()
                cluster.configure_hami_scheduler(KubeSchedulerConfig(extender=proc.extender()))
                for injection in args.injection.split(","):
                    ns = f"bench-{policy}-{injection}"
                    pods = [
                        gpu_pod(f"p{i:04d}", ns, mem=4000, cores=5, node_selector={"bench": "on"}) for i in range(n)
                    ]
                    if injection != "nri":  # a real cluster has one plugin per node
                        set_injection(None)
                    standin = node_standin(cluster, injection, names)
                    with standin:
                        standin_pids["node stand-in"] = standin.pid
                        if injection == "nri":
                            time.sleep(2.0)  # its writes reach the scheduler's cache
                        span, items, requests = run(ns, pods)
                    standin_pids.clear()
                    print(f"  plugin stand-in ({injection}): {standin.summary()}")
                    rate = n / span
                    used = len({p["spec"]["nodeName"] for p in items})
                    ideal = one_by_one_nodes(node_objects, pods, policy)
                    over = over_capacity(items)
                    print(
                        f"e2e {policy}, injection {injection}: {n} GPU pods through hami scheduler: all bound after "
                        f"{span:.1f}s -> {rate:.0f} pods/s ({rate / (n / base):.2f}x the baseline); {used} nodes used "
                        f"(one by one: {ideal}); {over} GPUs over capacity ({load()})"
                    )
                    out.append((rnd, policy, injection, rate, rate / (n / base), used, ideal, over, requests))
                    clear(ns)
                metrics = (
                    urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=10).read().decode()
                )
                print(
                    f"  {policy}: /filter (decision reserved, written by the Binding): "
                    f"{_histogram_quantiles(metrics, 'hami_scheduler_filter_duration_seconds', 'scheduled')}"
                )
                print(
                    f"  {policy}: /bind (lock when the node needs one, then Binding): "
                    f"{_histogram_quantiles(metrics, 'hami_scheduler_bind_duration_seconds', 'bound')}"
                )
                print(
                    f"  {policy}: node-lock wait in Bind: "
                    f"{_histogram_quantiles(metrics, 'hami_scheduler_node_lock_wait_seconds', 'acquired')}"
                )
                cluster.configure_hami_scheduler(KubeSchedulerConfig())
                proc.stop()
                proc = None
            return out

        print(f"e2e: {n} pods, {args.e2e_nodes} kwok nodes x 8 GPUs; {load()} at the start")
        node_objects = [create("GET", f"/api/v1/nodes/{name}") for name in names]
        rows = []
        bases = []
        for rnd in range(args.rounds):
            if args.rounds > 1:
                print(f"round {rnd + 1} of {args.rounds} ({load()})")
            base, _, base_requests = run("bench-baseline", plain)
            clear("bench-baseline")
            bases.append(base)
            print(
                f"e2e baseline: {n} pods without GPUs, default-scheduler, same nodes: {n / base:.0f} pods/s "
                f"({base:.1f}s; {load()})"
            )
            kubernetes_alone(args.kubernetes_gpu, run, clear, whole, base, alones)
            if args.floor:
                floor_pods = [
                    gpu_pod(f"p{i:04d}", "bench-floor", mem=4000, cores=5, node_selector={"bench": "on"})
                    for i in range(n)
                ]
                rows += floor_run(cluster, run, clear, floor_pods, base, rnd, args.floor_filter_only)
            rows += policy_runs(base, rnd)
        print(f"summary (baseline {', '.join(f'{n / b:.0f}' for b in bases)} pods/s, {base_requests}):")
        print_alone(alones, n)
        for rnd, policy, injection, rate, ratio, used, ideal, over, requests in rows:
            print(
                f"  {rnd + 1} {policy:8} {injection:8} {rate:5.0f} pods/s {ratio:.2f}x  nodes {used} (one by one {ideal})  "
                f"over capacity {over}  {requests.split(' (')[0]}"
            )
    finally:
        cluster.configure_hami_scheduler(KubeSchedulerConfig()) if cluster.binaries else None
        if proc:
            proc.stop()
        cluster.stop()


def floor_run(cluster, run, clear, pods: list[dict], base: float, rnd: int, filter_only: bool) -> list[tuple]:
    """``pods`` (GPU pods of namespace bench-floor) through hami's kube-scheduler calling the null
    extender (no hami scheduler, no node stand-in): what the extender protocol itself costs here,
    beside the round's baseline span ``base``; with ``filter_only`` a second run without bindVerb."""
    rows = []
    for bind in (True, False)[: 1 + filter_only]:
        rows += _floor_run(cluster, run, clear, pods, base, rnd, bind)
    return rows


def _floor_run(cluster, run, clear, pods: list[dict], base: float, rnd: int, bind: bool) -> list[tuple]:
    import tempfile

    from hami_devkit.schedconfig import ExtenderConfig, SchedulerConfig as KubeSchedulerConfig

    n = len(pods)
    with tempfile.TemporaryDirectory() as work:
        floor, addr = null_extender(cluster, Path(work))
        try:
            extender = ExtenderConfig(url_prefix=f"http://{addr}", bind_verb="bind" if bind else None)
            cluster.configure_hami_scheduler(KubeSchedulerConfig(extender=extender))
            span, items, requests = run("bench-floor", pods)
            clear("bench-floor")
        finally:
            cluster.configure_hami_scheduler(KubeSchedulerConfig())
            floor.terminate()
            floor.wait(10)
    rate = n / span
    used = len({p["spec"]["nodeName"] for p in items})
    what = "Bind forwards the Binding" if bind else "no Bind: kube-scheduler posts the Binding"
    print(
        f"e2e floor: {n} GPU pods through kube-scheduler and the null Go extender (Filter answers the first "
        f"candidate, {what}): {rate:.0f} pods/s ({rate / (n / base):.2f}x the baseline; {load()})"
    )
    return [(rnd, "floor" if bind else "floor-nb", "-", rate, rate / (n / base), used, used, 0, requests)]


def null_extender(cluster, workdir: Path):
    """Build (once, cached by source hash) and start bench/null_extender: the thinnest extender
    kube-scheduler can call (Filter answers the first candidate, Bind forwards the Binding).
    Returns (process, "host:port")."""
    import hashlib
    import os
    import subprocess

    source = ROOT / "bench" / "null_extender" / "main.go"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    binary = Path.home() / ".cache" / "hami" / "bench" / f"null-extender-{digest}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
        subprocess.run(["go", "build", "-o", str(binary), str(source)], check=True, env=env, cwd=source.parent)
    ca, token = workdir / "ca.pem", workdir / "token"
    ca.write_bytes(cluster.ca_pem)
    token.write_text(cluster.component_token)
    token.chmod(0o600)
    proc = subprocess.Popen(
        [str(binary), "-api", cluster.server, "-ca", str(ca), "-token-file", str(token)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes", default="1000x5000,5000x25000", help="NODESxPODS[,...] for the /filter figures; none: skip them"
    )
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument(
        "--fill",
        choices=("binpack", "round-robin"),
        default="binpack",
        help="how the background pods were placed (see placed_pods)",
    )
    ap.add_argument("--e2e", action="store_true", help="also run the end-to-end throughput on the real control plane")
    ap.add_argument("--e2e-nodes", type=int, default=100)
    ap.add_argument("--e2e-pods", type=int, default=1000)
    ap.add_argument(
        "--injection",
        default="nri",
        help="--e2e: the node side, comma-separated, each a run: allocate (HAMi's lock protocol, the device "
        "plugin stand-in) and/or nri (the lockless path: nodes say hami.io/node-injection: nri, the NRI agent's "
        "stand-in)",
    )
    ap.add_argument("--profile", help="--e2e: run hami scheduler under cProfile, stats to PROFILE.<policy>")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="--e2e: repeat the baseline and every policy run this many times, alternating (a shared machine's "
        "load moves: each round's ratios are to its own baseline)",
    )
    ap.add_argument(
        "--kubernetes-gpu",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--e2e: also run the pods asking nvidia.com/gpu: 1 through default-scheduler alone (no extender): "
        "what Kubernetes' own path costs for a pod with an extended resource",
    )
    ap.add_argument(
        "--policies", default="binpack,spread", help="--e2e: node policies, comma-separated, each a run ('': none)"
    )
    ap.add_argument(
        "--floor",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="--e2e: also run the GPU pods through the null Go extender (bench/null_extender, built with the go "
        "toolchain): the floor under any extender on this machine",
    )
    ap.add_argument(
        "--floor-filter-only",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="--floor: also run the null extender without bindVerb (kube-scheduler posts the Binding itself)",
    )
    ap.add_argument(
        "--scheduler-flag",
        dest="scheduler_flags",
        action="append",
        default=[],
        help="extra `hami scheduler` flag for --e2e, e.g. --scheduler-flag=--node-scheduler-policy=spread",
    )
    args = ap.parse_args()
    for size in args.sizes.split(",") if args.sizes != "none" else ():
        n_nodes, _, n_pods = size.partition("x")
        asyncio.run(filter_figures(args, int(n_nodes), int(n_pods)))
    if args.e2e:
        e2e(args)


if __name__ == "__main__":
    main()
