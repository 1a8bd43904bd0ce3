"""Soak: pod churn through the scheduler, and claim churn through the DRA node agent; does
anything grow or drift?

1. ``--scheduler`` (default on): the real control plane of the test harness (kube-apiserver,
   kube-scheduler, kwok), ``hami scheduler`` as a subprocess (extender + webhook, as the chart
   runs it), the suite's PluginStandIn in the device plugin's place, ``--nodes`` kwok nodes x 8
   GPUs. Waves of ``--wave`` GPU pods are created, all bound and marked allocated, then deleted
   (grace 0) until ``--cycles`` pods went through. After every wave the scheduler's own ledger
   (its ``/metrics``: memory and share count per GPU) is compared with the truth (the pods'
   allocation annotations as the API server has them); after every deletion the ledger must be
   empty again (a phantom reservation shows here) and no node lock may be left. The scheduler's
   resident memory (``VmRSS``) and open file descriptors are sampled after each wave.
2. ``--dra-agent``: the DRA kubelet plugin (:mod:`hami.draplugin`) served on a unix socket in
   this process, called over gRPC as the kubelet calls it: ``--dra-cycles`` claims prepared and
   unprepared in batches of 8, each on a GPU share; RSS and fds of this process (plugin and
   client) sampled; at the end the checkpoint holds no claim, the CDI directory no spec and the
   region directory no claim directory.

Printed: cycles, waves, RSS and fds after warm-up (the first 10 % of the cycles) and at the end,
their growth (target < 5 %), ledger mismatches, phantom reservations, leaked locks, leaked claims,
orphan CDI specs and regions. Not a timed test: a short version of each runs in the suite
(tests/integration/test_soak.py, tests/unit/test_soak_dra_agent.py).

Run: ``.venv/bin/python bench/bench_soak.py [--cycles 20000 --wave 200 --nodes 20] [--dra-cycles 20000]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "devkit" / "src"))  # the test harness (hami_devkit)
sys.path.insert(0, str(ROOT))


def proc_sample(pid: int | str = "self") -> tuple[int, int]:
    """(VmRSS in KiB, open file descriptors) of process ``pid``."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class SoakReport:
    cycles: int = 0
    waves: int = 0
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # (cycles done, rss KiB, fds)
    mismatches: list[str] = field(default_factory=list)  # ledger != truth, after a wave's binds
    phantoms: list[str] = field(default_factory=list)  # ledger not empty after a wave's deletion
    leaked_locks: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)  # claims, CDI specs, regions left

    def growth(self) -> tuple[tuple[int, int], tuple[int, int], float, float]:
        """((rss, fds) after warm-up, (rss, fds) at the end, rss growth %, fds growth %). Warm-up:
        the first sample past 10 % of the cycles; the end: the mean of the last three samples."""
        warm_at = self.cycles * 0.1
        warm = next((s for s in self.samples if s[0] >= warm_at), self.samples[0])
        tail = self.samples[-3:]
        end = (sum(s[1] for s in tail) // len(tail), round(sum(s[2] for s in tail) / len(tail)))
        return (
            (warm[1], warm[2]),
            end,
            100.0 * (end[0] - warm[1]) / warm[1],
            100.0 * (end[1] - warm[2]) / max(warm[2], 1),
        )

    def lines(self, what: str) -> list[str]:
        (rss0, fd0), (rss1, fd1), g_rss, g_fd = self.growth()
        verdict = "met" if g_rss < 5 and g_fd < 5 else "NOT met"
        return [
            f"{what}: {self.cycles} cycles in {self.waves} waves",
            f"  RSS {rss0 / 1024:.1f} MiB after warm-up -> {rss1 / 1024:.1f} MiB at the end ({g_rss:+.1f} %); "
            f"fds {fd0} -> {fd1} ({g_fd:+.1f} %); target < 5 %: {verdict}",
            f"  ledger vs API truth after each wave: {len(self.mismatches)} mismatches; phantom reservations after "
            f"deletion: {len(self.phantoms)}; leaked node locks: {len(self.leaked_locks)}; leaked claims/files: "
            f"{len(self.leaked)}",
            *[f"    {m}" for m in (self.mismatches + self.phantoms + self.leaked_locks + self.leaked)[:10]],
        ]


# ------------------------------------------------------------------------------ the scheduler


def ledger_from_metrics(text: str, nodes: set[str]) -> dict[str, tuple[int, int]]:
    """uuid -> (memory MiB, shares) the scheduler's /metrics says are allocated on ``nodes``
    (devices with nothing allocated left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[int]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("node") not in nodes:
                continue
            uuid = labels.get("device_uuid", "")
            if sample.name == "hami_gpu_memory_allocated_bytes":
                out.setdefault(uuid, [0, 0])[0] = int(sample.value) // (1 << 20)
            elif sample.name == "hami_gpu_shared_count":
                out.setdefault(uuid, [0, 0])[1] = int(sample.value)
    return {u: (m, s) for u, (m, s) in out.items() if m or s}


def truth_from_pods(pods: list[dict]) -> dict[str, tuple[int, int]]:
    from tests.integration._hami import device_usage

    return {u: (mem, slots) for u, (slots, mem, _cores) in device_usage(pods).items()}


def scheduler_soak(
    cluster,
    proc,
    ns: str,
    nodes: list[str],
    selector: dict,
    cycles: int,
    wave: int,
    log=print,
    minutes: float | None = None,
) -> SoakReport:
    """Churn ``cycles`` pods through the running scheduler ``proc`` in waves of ``wave``; with
    ``minutes``, stop after the wave that ends past that time (the report says how many went)."""
    stop_at = time.monotonic() + minutes * 60 if minutes else None
    from tests.integration._hami import KeepAliveApi, gpu_pod

    api = KeepAliveApi(cluster)
    report = SoakReport()
    node_set = set(nodes)

    def metrics() -> str:
        url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
        return urllib.request.urlopen(url, timeout=10).read().decode()

    def settled_ledger(expected: dict[str, tuple[int, int]], timeout: float = 20.0) -> dict[str, tuple[int, int]]:
        """The ledger, once it equals ``expected`` (the watch may trail the API by a moment)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = ledger_from_metrics(metrics(), node_set)
            if seen == expected or time.monotonic() > deadline:
                return seen
            time.sleep(0.2)

    n = 0
    while report.cycles < cycles and (stop_at is None or time.monotonic() < stop_at):
        size = min(wave, cycles - report.cycles)
        pods = [
            gpu_pod(f"s{n + i:06d}", ns, mem=1000 + 100 * ((n + i) % 9), cores=5 + (n + i) % 6, node_selector=selector)
            for i in range(size)
        ]
        n += size
        for p in pods:
            api("POST", f"/api/v1/namespaces/{ns}/pods", p)

        def allocated() -> list[dict] | None:
            items = api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
            done = [p for p in items if (p["metadata"].get("annotations") or {}).get("hami.io/bind-phase") == "success"]
            return items if len(done) == size == len(items) else None

        items = cluster.wait_for(allocated, f"wave {report.waves}: {size} pods allocated", timeout=300, interval=0.5)
        truth = truth_from_pods(items)
        ledger = settled_ledger(truth)
        if ledger != truth:
            diff = {u: (ledger.get(u), truth.get(u)) for u in set(ledger) | set(truth) if ledger.get(u) != truth.get(u)}
            report.mismatches.append(
                f"wave {report.waves}: ledger vs truth (MiB, shares) {dict(list(diff.items())[:3])}"
            )
        api("DELETE", f"/api/v1/namespaces/{ns}/pods", {"gracePeriodSeconds": 0})
        cluster.wait_for(
            lambda: not api("GET", f"/api/v1/namespaces/{ns}/pods")["items"],
            f"wave {report.waves}: pods deleted",
            timeout=120,
            interval=0.3,
        )
        left = settled_ledger({})
        if left:
            report.phantoms.append(f"wave {report.waves}: {len(left)} GPUs still hold {dict(list(left.items())[:3])}")
        report.cycles += size
        report.waves += 1
        report.samples.append((report.cycles, *proc_sample(proc.proc.pid)))
        if report.waves % 10 == 0:
            rss, fds = report.samples[-1][1:]
            log(f"  {report.cycles} cycles: scheduler RSS {rss / 1024:.1f} MiB, {fds} fds")

    def locks() -> list[str]:
        out = []
        for name in nodes:
            value = (api("GET", f"/api/v1/nodes/{name}")["metadata"].get("annotations") or {}).get("hami.io/mutex.lock")
            if value:
                out.append(f"{name}: {value}")
        return out

    # the plugin's delayed release (1 s) or the next sweep takes the last locks
    deadline = time.monotonic() + 30
    while (left_locks := locks()) and time.monotonic() < deadline:
        time.sleep(0.5)
    report.leaked_locks = left_locks
    return report


def run_scheduler(args: argparse.Namespace) -> None:
    import uuid

    from hami_devkit.cluster import KubeCluster, MissingBinaries, SchedulerConfig as KubeSchedulerConfig
    from tests.integration._hami import (
        PluginStandIn,
        SchedulerProcess,
        delete_webhook,
        label_namespace,
        make_gpu_node,
        register_webhook,
    )

    cluster = KubeCluster()
    try:
        cluster.start()
    except MissingBinaries as exc:
        print(f"scheduler soak skipped: {exc}")
        return
    proc = None
    try:
        proc = SchedulerProcess(cluster).start()
        cluster.configure_hami_scheduler(KubeSchedulerConfig(extender=proc.extender()))
        webhook = f"hami-soak-{uuid.uuid4().hex[:6]}"
        register_webhook(cluster, proc.url, webhook, "hami.io/soak")
        selector = {"soak": "on"}
        nodes = [f"soak-{i:03d}" for i in range(args.nodes)]
        for name in nodes:
            make_gpu_node(cluster, name, gpus=8, labels=selector)
        ns = "soak"
        cluster.create_namespace(ns)
        label_namespace(cluster, ns, "hami.io/soak")
        time.sleep(2.0)
        began = time.monotonic()
        with PluginStandIn(cluster, workers=max(args.nodes // 2, 4)):
            report = scheduler_soak(cluster, proc, ns, nodes, selector, args.cycles, args.wave, minutes=args.minutes)
        took = time.monotonic() - began
        for line in report.lines(f"scheduler soak ({args.nodes} kwok nodes x 8 GPUs, waves of {args.wave})"):
            print(line)
        print(f"  {took:.0f}s, {report.cycles / took:.1f} pod cycles/s")
        delete_webhook(cluster, webhook)
    finally:
        if cluster.binaries:
            cluster.configure_hami_scheduler(KubeSchedulerConfig())
        if proc:
            proc.stop()
        cluster.stop()


# ------------------------------------------------------------------------------ the DRA agent


def dra_claim(uid: str, gpu: int, memory_mib: int, cores: int) -> dict:
    """A ResourceClaim as kube-scheduler leaves it allocated: one share of ``gpu-<gpu>``."""
    from hami.dra.model import DRIVER

    from tests.unit._fuzzkit_dra import NODE

    return {
        "metadata": {"namespace": "soak", "name": f"c-{uid[-12:]}", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": NODE,
                            "device": f"gpu-{gpu}",
                            "consumedCapacity": {"memory": f"{memory_mib}Mi", "cores": str(cores), "shares": "1"},
                        }
                    ]
                }
            }
        },
    }


def dra_agent_soak(cycles: int, batch: int = 8, log=print) -> SoakReport:
    """Prepare and unprepare ``cycles`` claims through the plugin's gRPC service, ``batch`` at a time."""
    import json

    from tests.unit._fuzzkit_dra import N_GPUS, PluginSurface

    surface = PluginSurface()
    report = SoakReport()
    try:
        n = 0
        while report.cycles < cycles:
            size = min(batch, cycles - report.cycles)
            refs = []
            for i in range(size):
                uid = f"0b3e9d52-0000-4000-8000-{n + i:012d}"
                claim = dra_claim(uid, (n + i) % N_GPUS, 500 + 10 * ((n + i) % 50), 5 + (n + i) % 10)
                surface.api[("soak", claim["metadata"]["name"])] = claim
                refs.append(("soak", claim["metadata"]["name"], uid))
            n += size
            answer = surface.call("prepare", refs)
            errors = [f"{uid}: {r.error}" for uid, r in answer.claims.items() if r.error]
            if errors:
                report.leaked.append(f"prepare failed: {errors[:2]}")
                break
            specs = len(list(Path(surface.paths.cdi_dir).glob("*.json")))
            if specs != size:  # each prepared claim has its CDI spec while prepared
                report.leaked.append(f"batch {report.waves}: {specs} CDI specs for {size} prepared claims")
                break
            answer = surface.call("unprepare", refs)
            errors = [f"{uid}: {r.error}" for uid, r in answer.claims.items() if r.error]
            if errors:
                report.leaked.append(f"unprepare failed: {errors[:2]}")
                break
            for ns, name, _ in refs:
                del surface.api[(ns, name)]
            report.cycles += size
            report.waves += 1
            if report.waves % max(cycles // batch // 50, 1) == 0:
                report.samples.append((report.cycles, *proc_sample()))
            if report.waves % max(cycles // batch // 10, 1) == 0:
                rss, fds = proc_sample()
                log(f"  {report.cycles} cycles: RSS {rss / 1024:.1f} MiB, {fds} fds")
        report.samples.append((report.cycles, *proc_sample()))
        claims = json.loads(surface.checkpoint_path.read_text())["claims"] if surface.checkpoint_path.exists() else {}
        report.leaked += [f"checkpoint claim {uid}" for uid in claims]
        cdi = Path(surface.paths.cdi_dir)
        report.leaked += [f"CDI spec {p.name}" for p in (cdi.iterdir() if cdi.exists() else ())]
        regions = Path(surface.paths.vgpu_dir) / "claims"  # region directories and claim records
        report.leaked += [f"claim region/record {p.name}" for p in (regions.iterdir() if regions.exists() else ())]
    finally:
        surface.close()
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20000, help="pods created and deleted through the scheduler")
    ap.add_argument("--wave", type=int, default=200)
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--dra-cycles", type=int, default=20000, help="claims prepared and unprepared by the DRA agent")
    ap.add_argument("--minutes", type=float, default=None, help="stop the scheduler soak after this long")
    ap.add_argument("--no-scheduler", action="store_true")
    ap.add_argument("--no-dra-agent", action="store_true")
    args = ap.parse_args()
    if not args.no_dra_agent:
        began = time.monotonic()
        report = dra_agent_soak(args.dra_cycles)
        for line in report.lines("DRA agent soak (prepare + unprepare over gRPC, batches of 8)"):
            print(line)
        print(f"  {time.monotonic() - began:.0f}s")
    if not args.no_scheduler:
        run_scheduler(args)


if __name__ == "__main__":
    main()
