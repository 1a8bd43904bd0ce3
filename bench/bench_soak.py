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

3. ``--dra-front-end`` (default on): the DRA front end under pod churn, on a control plane of its
   own (kube-controller-manager with ``--kube-api-qps=1000``, as in bench_dra.py): ``hami
   scheduler --front-end=dra --ui-bind`` as the cluster's webhook, ``--nodes`` kwok nodes whose
   ResourceSlices (8 GPUs, 10 shares each) ``hami dra``'s publisher code writes. Waves of
   ``--wave`` HAMi GPU pods, written as the user guide writes them, are turned by the webhook into
   claims from ResourceClaimTemplates, placed by kube-scheduler, then deleted (grace 0), which
   lets kube-controller-manager delete their claims, until ``--dra-pods`` pods went through. After
   every wave the scheduler's view of the claims (its ``/api/v1/nodes``: shares, MiB and cores per
   GPU) is compared with the claims' allocations; after every deletion no claim may be left
   (allocated, or reserved for a deleted pod) and the view must be empty again. The scheduler
   process's RSS and fds (webhook, watch cache of claims and slices, UI API) sampled per wave.

Printed: cycles, waves, RSS and fds after warm-up (the first 10 % of the cycles) and at the end,
their growth (target < 5 %), ledger mismatches, phantom reservations, leaked locks, leaked claims,
orphan CDI specs and regions. Not a timed test: a short version of each runs in the suite
(tests/integration/test_soak.py, tests/unit/test_soak_dra_agent.py).

Run: ``.venv/bin/python bench/bench_soak.py [--cycles 20000 --wave 200 --nodes 20] [--dra-cycles 20000]
[--dra-pods 20000] [--no-scheduler] [--no-dra-agent] [--no-dra-front-end] [--minutes M]``
(``--minutes`` stops each pod soak after the wave that ends past M minutes).
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
        the first sample past 10 % of the cycles; the end: the mean of the last three samples.
        Open fds swing with the keep-alive connections open at the moment of a sample (22 to 31
        all through a 20,000-cycle DRA run), so fds compare the most seen in the first third
        after warm-up with the most seen in the last third: a leak raises that ceiling."""
        warm_at = self.cycles * 0.1
        warm = next((s for s in self.samples if s[0] >= warm_at), self.samples[0])
        tail = self.samples[-3:]
        end_rss = sum(s[1] for s in tail) // len(tail)
        after = [s for s in self.samples if s[0] >= warm[0]]
        third = max(len(after) // 3, 1)
        fd0, fd1 = max(s[2] for s in after[:third]), max(s[2] for s in after[-third:])
        return (
            (warm[1], fd0),
            (end_rss, fd1),
            100.0 * (end_rss - warm[1]) / warm[1],
            100.0 * (fd1 - fd0) / max(fd0, 1),
        )

    def lines(self, what: str) -> list[str]:
        (rss0, fd0), (rss1, fd1), g_rss, g_fd = self.growth()
        verdict = "met" if g_rss < 5 and g_fd < 5 else "NOT met"
        return [
            f"{what}: {self.cycles} cycles in {self.waves} waves",
            f"  RSS {rss0 / 1024:.1f} MiB after warm-up -> {rss1 / 1024:.1f} MiB at the end ({g_rss:+.1f} %); "
            f"fds at most {fd0} -> at most {fd1} ({g_fd:+.1f} %); target < 5 %: {verdict}",
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


# ------------------------------------------------------------------------------ the DRA front end

RESOURCE = "/apis/resource.k8s.io/v1"
DRA_GPU_MIB = 81920


def dra_ledger_from_ui(doc: dict, nodes: set[str]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(node, device) -> (shares, memory MiB, cores) that the scheduler's ``/api/v1/nodes`` says
    DRA claims hold on ``nodes`` (devices with nothing allocated left out)."""
    out = {}
    for node in doc.get("items") or ():
        if node.get("name") not in nodes:
            continue
        for d in node.get("devices") or ():
            if d.get("frontEnd") != "dra":
                continue
            got = (d["slots"]["allocated"], d["memoryMiB"]["allocated"], d["cores"]["allocated"])
            if any(got):
                out[(node["name"], f"gpu-{d['index']}")] = got
    return out


def dra_truth_from_claims(claims: list[dict]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """The same, from the allocations of the claims as the API server has them."""
    from hami.core.quantity import parse_int_quantity
    from hami.dra.model import DRIVER, MIB

    raw: dict[tuple[str, str], list[int]] = {}
    for c in claims:
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ():
            if r.get("driver") != DRIVER:
                continue
            used = r.get("consumedCapacity") or {}
            u = raw.setdefault((r["pool"], r["device"]), [0, 0, 0])
            u[0] += 1
            u[1] += parse_int_quantity(used.get("memory", 0), "memory")
            u[2] += parse_int_quantity(used.get("cores", 0), "cores")
    return {k: (s, -(-mem // MIB), cores) for k, (s, mem, cores) in raw.items()}


def leaked_claims(claims: list[dict], live_pods: set[str]) -> list[str]:
    """Claims still allocated, or reserved for a pod that is gone (a phantom reservation)."""
    out = []
    for c in claims:
        status = c.get("status") or {}
        name = f"{c['metadata']['namespace']}/{c['metadata']['name']}"
        dead = [r.get("name") for r in status.get("reservedFor") or () if r.get("name") not in live_pods]
        if dead:
            out.append(f"claim {name} reserved for deleted pod(s) {dead}")
        elif status.get("allocation") and not status.get("reservedFor"):
            out.append(f"claim {name} allocated, reserved for nobody")
    return out


def dra_frontend_soak(
    cluster,
    proc,
    ui_port: int,
    ns: str,
    nodes: list[str],
    selector: dict,
    cycles: int,
    wave: int,
    log=print,
    minutes: float | None = None,
    workers: int = 8,
    bind_timeout: float = 300.0,
) -> SoakReport:
    """Churn ``cycles`` HAMi GPU pods through the DRA front end in waves of ``wave``: each is
    created as a user writes it, turned by ``proc``'s webhook (``--front-end=dra``) into a claim
    from a ResourceClaimTemplate, placed by kube-scheduler on the kwok nodes' published GPUs, and
    deleted (grace 0) once all of the wave are bound, which lets kube-controller-manager delete
    the claims. After each wave's binds the scheduler's view of the claims (its ``/api/v1/nodes``,
    per GPU: shares, MiB, cores) is compared with the claims' allocations in the API server;
    after each deletion no claim may be left and the scheduler's view must be empty again.

    Each wave reuses the pod names of the one before (new UIDs, new claims): the UI's history
    keeps a series per pod name it sampled, a ring bounded at 4096 series (~24 MiB,
    :mod:`hami.ui.history`), which fresh names would fill over the first hours and show as RSS
    growth that is no leak (first runs: +4 to +7 % between 2,000 and 4,000 cycles)."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    from tests.integration._hami import KeepAliveApi, gpu_pod

    stop_at = time.monotonic() + minutes * 60 if minutes else None
    api = KeepAliveApi(cluster)
    report = SoakReport()
    node_set = set(nodes)

    def ledger() -> dict[tuple[str, str], tuple[int, int, int]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/api/v1/nodes", timeout=10) as r:
            return dra_ledger_from_ui(json.loads(r.read()), node_set)

    def settled_ledger(expected: dict, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            seen = ledger()
            if seen == expected or time.monotonic() > deadline:
                return seen
            time.sleep(0.2)

    def claims() -> list[dict]:
        return api("GET", f"{RESOURCE}/namespaces/{ns}/resourceclaims")["items"]

    def pod_names() -> set[str]:
        return {p["metadata"]["name"] for p in api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]}

    n = 0
    with ThreadPoolExecutor(workers) as pool:
        while report.cycles < cycles and (stop_at is None or time.monotonic() < stop_at):
            size = min(wave, cycles - report.cycles)
            pods = [
                gpu_pod(f"d{i:05d}", ns, mem=1000 + 100 * ((n + i) % 9), cores=5 + (n + i) % 6, node_selector=selector)
                for i in range(size)
            ]
            for p in pods:  # as the user guide writes it: the webhook picks the scheduler
                del p["spec"]["schedulerName"]
            n += size
            created = list(pool.map(lambda p: api("POST", f"/api/v1/namespaces/{ns}/pods", p), pods))
            untranslated = [p["metadata"]["name"] for p in created if not p["spec"].get("resourceClaims")]
            if untranslated:
                raise AssertionError(f"wave {report.waves}: pods not turned into claims: {untranslated[:3]}")

            def placed() -> list[dict] | None:
                items = api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
                if len(items) != size or not all(p["spec"].get("nodeName") for p in items):
                    return None
                held = [c for c in claims() if (c.get("status") or {}).get("reservedFor")]
                return held if len(held) == size else None

            try:
                held = cluster.wait_for(placed, f"wave {report.waves}: {size} pods bound", timeout=bind_timeout)
            except TimeoutError as exc:
                raise AssertionError(f"{exc}: {why_not_placed(api, ns)}") from None
            truth = dra_truth_from_claims(held)
            seen = settled_ledger(truth)
            if seen != truth:
                diff = {k: (seen.get(k), truth.get(k)) for k in set(seen) | set(truth) if seen.get(k) != truth.get(k)}
                report.mismatches.append(
                    f"wave {report.waves}: scheduler vs claims (shares, MiB, cores) {dict(list(diff.items())[:3])}"
                )
            api("DELETE", f"/api/v1/namespaces/{ns}/pods", {"gracePeriodSeconds": 0})
            try:
                cluster.wait_for(
                    lambda: not pod_names() and not claims(),
                    f"wave {report.waves}: pods and their claims deleted",
                    timeout=120,
                    interval=0.3,
                )
            except TimeoutError:
                left = claims()
                report.leaked += leaked_claims(left, pod_names())[:5] or [
                    f"wave {report.waves}: {len(left)} claims left after their pods were deleted"
                ]
            left = settled_ledger({})
            if left:
                report.phantoms.append(
                    f"wave {report.waves}: {len(left)} GPUs still hold {dict(list(left.items())[:3])}"
                )
            report.cycles += size
            report.waves += 1
            report.samples.append((report.cycles, *proc_sample(proc.proc.pid)))
            if report.waves % 10 == 0:
                rss, fds = report.samples[-1][1:]
                log(f"  {report.cycles} cycles: scheduler RSS {rss / 1024:.1f} MiB, {fds} fds")
    report.leaked += leaked_claims(claims(), pod_names())
    return report


def why_not_placed(api, ns: str) -> str:
    """A pod of ``ns`` left unbound, its conditions, and how many claims are allocated."""
    items = api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
    waiting = [p for p in items if not p["spec"].get("nodeName")]
    claims = api("GET", f"{RESOURCE}/namespaces/{ns}/resourceclaims")["items"]
    allocated = sum(1 for c in claims if (c.get("status") or {}).get("allocation"))
    first = waiting[0] if waiting else {}
    return (
        f"{len(waiting)} of {len(items)} pods unbound, {len(claims)} claims ({allocated} allocated); "
        f"first unbound {first.get('metadata', {}).get('name')}: {(first.get('status') or {}).get('conditions')}, "
        f"claim statuses {(first.get('status') or {}).get('resourceClaimStatuses')}"
    )


def publish_kwok_slices(cluster, nodes: list[str], split: int = 10, gpus: int = 8) -> None:
    """The DeviceClasses and each node's ResourceSlice, as ``hami dra``'s publisher writes them."""
    import asyncio

    from hami.draplugin.publisher import apply_device_classes, publish_slice
    from hami.dra.model import SliceSettings
    from hami.kube.client import KubeClient, load_api_client
    from hami.node.nvml import PhysicalGPU

    async def publish() -> None:
        k = KubeClient(await load_api_client(str(cluster.kubeconfig)))
        try:
            await apply_device_classes(k)
            for name in nodes:
                tag = sum(map(ord, name)) % 0xFFFF
                devs = [
                    PhysicalGPU(
                        i,
                        f"GPU-{tag:08x}-5a0c-4000-8000-{i:012x}",
                        "NVIDIA A100",
                        DRA_GPU_MIB,
                        f"0000:{i + 1:02x}:00.0",
                        0,
                    )
                    for i in range(gpus)
                ]
                await publish_slice(k, name, devs, SliceSettings(split_count=split))
        finally:
            await k.close()

    asyncio.run(publish())


def run_dra_frontend(args: argparse.Namespace) -> None:
    import uuid

    from hami_devkit.binaries import KUBE_VERSION
    from hami_devkit.cluster import KubeCluster, MissingBinaries, free_port
    from tests.integration._hami import SchedulerProcess, delete_webhook, label_namespace, register_webhook
    from tests.integration.test_dra import gates_for

    cluster = KubeCluster(
        hami_scheduler=None,  # kube-scheduler's default-scheduler places the claims
        feature_gates=gates_for(KUBE_VERSION),
        extra_args={"kube-controller-manager": ["--kube-api-qps=1000", "--kube-api-burst=2000"]},
    )
    try:
        cluster.start()
    except MissingBinaries as exc:
        print(f"DRA front-end soak skipped: {exc}")
        return
    proc = None
    try:
        ui_port = free_port()
        proc = SchedulerProcess(cluster, "--front-end=dra", f"--ui-bind=127.0.0.1:{ui_port}", "--ui-auth=none").start()
        webhook = f"hami-drasoak-{uuid.uuid4().hex[:6]}"
        register_webhook(cluster, proc.url, webhook, "hami.io/dra-soak")
        selector = {"dra-soak": "on"}
        nodes = [f"drasoak-{i:03d}" for i in range(args.nodes)]
        for name in nodes:
            cluster.create_node(name, labels=selector)
        publish_kwok_slices(cluster, nodes)
        ns = "dra-soak"
        cluster.create_namespace(ns)
        label_namespace(cluster, ns, "hami.io/dra-soak")
        wait_dra_webhook(cluster, ns)
        began = time.monotonic()
        try:
            report = dra_frontend_soak(
                cluster, proc, ui_port, ns, nodes, selector, args.dra_pods, args.wave, minutes=args.minutes
            )
        except Exception:
            print(f"the scheduler's log, last lines:\n{proc.logs()[-4000:]}")
            raise
        took = time.monotonic() - began
        for line in report.lines(
            f"DRA front-end soak (Kubernetes {KUBE_VERSION}, {args.nodes} kwok nodes x 8 GPUs, waves of {args.wave})"
        ):
            print(line)
        print(
            f"  {took:.0f}s, {report.cycles / took:.1f} pod cycles/s; samples (cycles, RSS KiB, fds): "
            f"{report.samples[:: max(len(report.samples) // 10, 1)]}"
        )
        delete_webhook(cluster, webhook)
    finally:
        if proc:
            proc.stop()
        cluster.stop()


def wait_dra_webhook(cluster, ns: str, timeout: float = 30.0) -> None:
    """Until the webhook turns a GPU pod of ``ns`` into a claim (dry-run creates): a webhook
    configuration reaches the API server's admission a moment after it is written."""
    from tests.integration._hami import gpu_pod

    probe = gpu_pod("probe", ns, mem=1000, cores=5)
    cluster.wait_for(
        lambda: cluster.api("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", probe)["spec"].get("resourceClaims"),
        f"the webhook turning GPU pods of {ns} into claims",
        timeout,
        interval=0.2,
    )


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
    ap.add_argument("--dra-pods", type=int, default=20000, help="pods created and deleted through the DRA front end")
    ap.add_argument("--no-scheduler", action="store_true")
    ap.add_argument("--no-dra-agent", action="store_true")
    ap.add_argument("--no-dra-front-end", action="store_true")
    args = ap.parse_args()
    if not args.no_dra_agent:
        began = time.monotonic()
        report = dra_agent_soak(args.dra_cycles)
        for line in report.lines("DRA agent soak (prepare + unprepare over gRPC, batches of 8)"):
            print(line)
        print(f"  {time.monotonic() - began:.0f}s")
    if not args.no_scheduler:
        run_scheduler(args)
    if not args.no_dra_front_end:
        run_dra_frontend(args)


if __name__ == "__main__":
    main()
