"""Schedulable GPU pods behind a queue of unschedulable ones, on the real control plane (issue 29).

kube-scheduler keeps a pod that fits nowhere and tries it again whenever the cluster changes
(each pod bound is such a change) and at least every five minutes, after a backoff of 1 s
doubling to 10 s. A queue of pending GPU jobs is the normal state of a busy GPU cluster, so
each of those retries, a ``/filter`` call that refuses every node with its reason, competes with
the pods that fit. This bench measures how much.

The control plane of ``bench_scheduler.py --e2e`` (kube-apiserver + kube-scheduler + kwok, the
test harness; ``hami scheduler`` as a subprocess on its loopback listener; the test suite's
PluginStandIn playing the device plugin's side of each bind), 100 kwok nodes x 8 GPUs of
81920 MiB. In one run, three rounds of N schedulable 1-GPU pods (4000 MiB, 5 cores), each
created at once, pods/s from the first creation to the last pod bound:

1. ``no queue``;
2. ``behind the queue``: first 200 GPU pods that fit nowhere (102400 MiB, more than any GPU),
   waited for until kube-scheduler has marked each ``Unschedulable``, then the N pods while the
   200 stay pending (and are retried);
3. ``no queue`` again, after the 200 are deleted (a second baseline, so that a drift of the
   machine's load over the run shows).

Printed: each round's pods/s, the ratio of round 2 to the mean of rounds 1 and 3 (target
>= 0.9), and for each round the ``/filter`` calls that found no node (the scheduler's own
histogram), the ``FailedScheduling`` (kube-scheduler) and ``FilteringFailed`` (hami) events
written for the pending pods, and the CPU seconds of the scheduler, kube-scheduler,
kube-apiserver and etcd (by process id: other work on the machine is not counted), summed per
schedulable pod: on a shared machine pods/s moves with the other work, CPU per pod much less,
so the ratio of pods per CPU second is printed beside the ratio of pods/s.

Run: ``.venv/bin/python bench/bench_pending_queue.py [--pods N] [--pending P] [--nodes K]``.
"""

from __future__ import annotations

import argparse
import calendar
import os
import time
from concurrent.futures import ThreadPoolExecutor

from bench_scheduler import failed_scheduling, node_spread

PENDING_MIB = 102400  # more than any GPU of the bench's nodes (81920 MiB)


def process_cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) so far of each named process, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / tick
    return out


def metric_count(text: str, name: str, outcome: str) -> float:
    """The ``_count`` of one outcome of a histogram in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(f"{name}_count{{") and f'outcome="{outcome}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> None:
    import urllib.request

    from hami_devkit.cluster import KubeCluster, MissingBinaries, SchedulerConfig as KubeSchedulerConfig
    from tests.integration._hami import KeepAliveApi, PluginStandIn, SchedulerProcess, gpu_pod, make_gpu_node

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--pods", type=int, default=1000, help="schedulable pods per round")
    ap.add_argument("--pending", type=int, default=200, help="unschedulable pods in the queue")
    args = ap.parse_args()

    cluster = KubeCluster()
    try:
        cluster.start()
    except MissingBinaries as exc:
        print(f"skipped: {exc}")
        return
    proc = None
    try:
        proc = SchedulerProcess(cluster, "--node-lock-retry-timeout=28s", loopback=True).start()
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda i: make_gpu_node(cluster, f"bench-{i:03d}", gpus=8, mem=81920, labels={"bench": "on"}),
                    range(args.nodes),
                )
            )
        time.sleep(2.0)  # nodes reach the scheduler's cache
        cluster.configure_hami_scheduler(KubeSchedulerConfig(extender=proc.extender()))
        api = KeepAliveApi(cluster)
        select = {"bench": "on"}

        def pids() -> dict[str, int]:
            got = {"hami scheduler": proc.proc.pid}
            for name, component in cluster.components.items():
                process = getattr(component, "process", None)
                if process is not None and name in ("hami-scheduler", "kube-apiserver", "etcd"):
                    got["kube-scheduler (hami's)" if name == "hami-scheduler" else name] = process.pid
            return got

        def metrics() -> str:
            url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
            return urllib.request.urlopen(url, timeout=10).read().decode()

        def create(ns: str, pods: list[dict]) -> None:
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda p: api("POST", f"/api/v1/namespaces/{ns}/pods", p), pods))

        def unbound(ns: str) -> list[dict]:
            # from the watch cache (resourceVersion=0): the poll should not load the API server
            path = f"/api/v1/namespaces/{ns}/pods?fieldSelector=spec.nodeName%3D&resourceVersion=0"
            return api("GET", path)["items"]

        def round_(ns: str) -> tuple[float, float]:
            """N schedulable pods created at once: pods/s until the last is bound, and the CPU
            seconds per pod of the processes above."""
            cluster.create_namespace(ns)
            pods = [gpu_pod(f"p{i:04d}", ns, mem=4000, cores=5, node_selector=select) for i in range(args.pods)]
            before_m, before_cpu = metrics(), process_cpu(pids())
            began = time.perf_counter()
            create(ns, pods)
            while unbound(ns):
                time.sleep(0.2)
            span = time.perf_counter() - began
            after_m, after_cpu = metrics(), process_cpu(pids())
            name = "hami_scheduler_filter_duration_seconds"
            refused = metric_count(after_m, name, "unschedulable") - metric_count(before_m, name, "unschedulable")
            used = {k: after_cpu[k] - before_cpu.get(k, 0.0) for k in sorted(after_cpu)}
            per_pod = sum(used.values()) / args.pods
            cpu = ", ".join(f"{k} {v:.1f}" for k, v in used.items())
            items = api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
            when = {
                p["metadata"]["name"]: calendar.timegm(time.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ"))
                for p in items
                for c in p["status"].get("conditions") or ()
                if c["type"] == "PodScheduled"
            }
            print(f"  {ns}: {args.pods} pods bound in {span:.1f}s -> {args.pods / span:.1f} pods/s")
            print(f"  {ns}: {node_spread(items, when, max(max(when.values()) - min(when.values()), 1.0))}")
            print(
                f"  {ns}: /filter calls that found no node: {refused:.0f}; CPU seconds: {cpu} "
                f"-> {per_pod * 1e3:.1f} ms CPU per pod"
            )
            print(f"  {ns}: {failed_scheduling(api('GET', f'/api/v1/namespaces/{ns}/events')['items'])}")
            return args.pods / span, per_pod

        def pending_events() -> dict[str, int]:
            """Events about the pending pods by reason (a repeated one counts its ``count``)."""
            got: dict[str, int] = {}
            for e in api("GET", "/api/v1/namespaces/q-pending/events")["items"]:
                got[e.get("reason") or "?"] = got.get(e.get("reason") or "?", 0) + (e.get("count") or 1)
            return got

        with PluginStandIn(cluster, workers=max(1, args.nodes // 2)):
            print(f"{args.nodes} kwok nodes x 8 GPUs; rounds of {args.pods} schedulable GPU pods")
            base1, cpu1 = round_("q-base1")
            cluster.create_namespace("q-pending")
            stuck = [
                gpu_pod(f"w{i:04d}", "q-pending", mem=PENDING_MIB, cores=5, node_selector=select)
                for i in range(args.pending)
            ]
            create("q-pending", stuck)

            def all_unschedulable() -> bool:
                items = api("GET", "/api/v1/namespaces/q-pending/pods")["items"]
                return len(items) == args.pending and all(
                    any(
                        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                        for c in p["status"].get("conditions") or ()
                    )
                    for p in items
                )

            cluster.wait_for(all_unschedulable, f"{args.pending} pods marked Unschedulable", timeout=300, interval=1.0)
            ev0 = pending_events()
            print(f"  queue: {args.pending} pods pending (each refused by every node); events so far: {ev0}")
            behind, cpu_behind = round_("q-behind")
            ev1 = pending_events()
            grew = {k: v - ev0.get(k, 0) for k, v in ev1.items() if v != ev0.get(k, 0)}
            print(f"  queue during q-behind: events about the pending pods: {grew}")
            for p in stuck:
                api("DELETE", f"/api/v1/namespaces/q-pending/pods/{p['metadata']['name']}?gracePeriodSeconds=0")
            cluster.wait_for(
                lambda: not api("GET", "/api/v1/namespaces/q-pending/pods")["items"], "pending pods gone", timeout=120
            )
            base2, cpu2 = round_("q-base2")
        base = (base1 + base2) / 2
        ratio = behind / base
        cpu_ratio = (cpu1 + cpu2) / 2 / cpu_behind
        print(
            f"behind {args.pending} unschedulable pods: {behind:.1f} pods/s vs {base:.1f} without a queue "
            f"({base1:.1f} before, {base2:.1f} after) -> {ratio:.2f}x (target >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'}); "
            f"CPU per schedulable pod {cpu_behind * 1e3:.1f} vs {(cpu1 + cpu2) / 2 * 1e3:.1f} ms without a queue -> "
            f"{cpu_ratio:.2f}x the pods per CPU second"
        )
    finally:
        if proc:  # events the scheduler could not write (the recorder logs each and goes on)
            lost = [line for line in proc.logs().splitlines() if "not recorded" in line or "not updated" in line]
            print(f"scheduler log: {len(lost)} events not written" + (f"; first: {lost[0][:400]}" if lost else ""))
        if cluster.binaries:
            cluster.configure_hami_scheduler(KubeSchedulerConfig())
        if proc:
            proc.stop()
        cluster.stop()


if __name__ == "__main__":
    main()
