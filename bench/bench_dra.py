"""DRA front end vs extender front end, end to end, in the same run.

One real control plane (the test harness: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok) with the DRA gates a v1.34 cluster needs. The same ``--nodes`` kwok nodes x
8 GPUs (80 GiB each) carry both HAMi's registration annotation (extender path) and a ResourceSlice
written by `hami dra`'s publisher (DRA path); the capacity holds both batches at once, so the two
paths, which do not see each other's usage, cannot run out.

1. DRA: ``--pods`` HAMi pods (``nvidia.com/gpu: 1, gpumem: 4000, gpucores: 5``) created at once
   through ``hami scheduler --front-end dra`` as the cluster's mutating webhook (``--dra-via
   webhook``, the default: its template creation and its latency in the pods' create path are
   counted), or translated here beforehand as the webhook would (``--dra-via direct``: the
   Kubernetes side alone); either way one ResourceClaimTemplate, each pod a claim from it:
   kube-controller-manager creates the claims, kube-scheduler allocates and binds.
2. Extender: the same pods through ``hami scheduler`` (loopback listener, as the chart sets it up)
   and the test suite's device-plugin stand-in (as in bench_scheduler.py --e2e); with
   ``--injection nri`` the lockless path instead (the nodes say ``hami.io/node-injection: nri``,
   the NRI agent's stand-in marks the pods, no node lock).
0. Before both, the GPU-less baseline: the same number of pods without GPUs through
   default-scheduler on the same nodes; each path's pods/s is printed as a ratio to it.

Both use a kube-scheduler with client qps 1000 (its default 50 caps either path near 50 pods/s) and
kube-controller-manager with ``--kube-api-qps=1000`` (its default 20 would cap claim creation).
Printed per path: pods/s from the first creation to the last PodScheduled, and API requests per pod
(kube-apiserver's ``apiserver_request_total`` over the run, every client included: kwok, the
controllers, the scheduler, the plugin stand-in, the creation itself), with the biggest
verb/resource[/subresource] pairs, and the webhook's admissions with their mean latency as
kube-apiserver measures it (``apiserver_admission_webhook_admission_duration_seconds``).
``--audit`` turns kube-apiserver's audit log on (:mod:`hami_devkit.audit`) and prints each path's
requests per pod by client (user agent), with what each client writes in a pod's status: which
requests are HAMi's and which are Kubernetes' own. ``--no-extender`` stops after the DRA path.

Run: ``.venv/bin/python bench/bench_dra.py [--nodes 100 --pods 1000] [--injection nri]``; on v1.34 a node's second
GPU is not used by DRA (kubernetes/kubernetes#133705, docs/dra.md), so the pinned v1.37.2
is the one to measure.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import http.client
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "devkit" / "src"))  # the test harness (hami_devkit)
sys.path.insert(0, str(ROOT))

from bench_pending_queue import process_cpu  # noqa: E402
from hami.core import admit_pod  # noqa: E402
from hami.node.nvml import PhysicalGPU  # noqa: E402
from hami_devkit.binaries import KUBE_VERSION  # noqa: E402
from hami.dra.model import SliceSettings  # noqa: E402
from hami.dra.translate import translate  # noqa: E402
from hami.vendors.nvidia import NvidiaVendor  # noqa: E402

RESOURCE = "/apis/resource.k8s.io/v1"
GPU_MIB = 81920
WEBHOOK_LABEL = "hami.io/bench-dra"


def apiserver_metrics(cluster) -> str:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", cluster.ports["kube-apiserver"], context=cluster._client_context(), timeout=30
    )
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def _labels(line: str) -> dict[str, str]:
    inner = line[line.index("{") + 1 : line.rindex("}")]
    return {k: v.strip('"') for k, v in (kv.split("=", 1) for kv in inner.split(",") if "=" in kv)}


def request_counts(cluster) -> Counter:
    """kube-apiserver's apiserver_request_total, summed per (verb, resource[/subresource]); with
    the webhook's admission latency sums and counts under ("webhook", "sum"|"count")."""
    out: Counter = Counter()
    for line in apiserver_metrics(cluster).splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = _labels(line)
            resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            out[(labels.get("verb", ""), resource)] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("apiserver_admission_webhook_admission_duration_seconds_sum{"):
            out[("webhook", "sum")] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("apiserver_admission_webhook_admission_duration_seconds_count{"):
            out[("webhook", "count")] += float(line.rsplit(" ", 1)[1])
    return out


def load() -> str:
    """The machine's load average (1, 5, 15 min), printed beside each figure."""
    try:
        with open("/proc/loadavg") as f:
            return "load " + " ".join(f.read().split()[:3])
    except OSError:
        return "load ?"


def per_pod(before: Counter, after: Counter, pods: int) -> str:
    diff = Counter({k: after[k] - before.get(k, 0) for k in after if k[0] != "webhook"})
    total = sum(diff.values())
    top = ", ".join(f"{v} {r or '-'} {n / pods:.2f}" for (v, r), n in diff.most_common(8) if n >= pods / 20)
    out = f"{total / pods:.1f} API requests per pod (biggest: {top})"
    calls = after[("webhook", "count")] - before.get(("webhook", "count"), 0)
    if calls:
        spent = after[("webhook", "sum")] - before.get(("webhook", "sum"), 0)
        out += f"; webhook: {calls:.0f} admissions, {1000 * spent / calls:.1f} ms each (kube-apiserver's view)"
    return out


def by_client(cluster, offset: int, pods: int) -> str:
    """The audit log's requests since ``offset`` per client and request, per pod (``--audit``)."""
    from hami_devkit import audit

    time.sleep(2.0)  # the batch writer's last flush
    events = list(audit.read_events(cluster.audit_log, offset))
    counts = audit.tally(events, skip_verbs=frozenset({"watch"}))
    lines = [
        f"    {n / pods:5.2f}  {client:<24} {request}" + (f" -> {code}" if code >= 300 else "")
        for (client, request, code), n in counts.most_common()
        if n >= pods / 50
    ]
    lines += [
        f"    {client} PATCH pods/status, e.g.: {body}"
        for client, body in audit.samples(events, "PATCH pods/status").items()
    ]
    return "\n".join(lines)


def delete_pods(cluster, api, ns: str) -> None:
    """Delete a path's pods and wait until they are gone, so that the next path is not measured
    while they go (a 504 on a loaded machine: the deletion goes on regardless)."""
    from hami_devkit.errors import ApiError

    try:
        api("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
    except ApiError as exc:
        print(f"  ({ns} pods' deletion: {exc}; waiting for it)")
    cluster.wait_for(
        lambda: not api("GET", f"/api/v1/namespaces/{ns}/pods?limit=1")["items"],
        f"the pods of {ns} deleted",
        timeout=600,
        interval=2.0,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument(
        "--injection", choices=("allocate", "nri"), default="allocate", help="the extender path's node side"
    )
    ap.add_argument(
        "--dra-via",
        choices=("webhook", "direct"),
        default="webhook",
        help="webhook: the HAMi pods go through `hami scheduler --front-end dra` as the cluster's mutating "
        "webhook (its template creation and latency counted); direct: translated here, templates created beforehand",
    )
    ap.add_argument(
        "--audit", action="store_true", help="kube-apiserver's audit log: each path's requests per client, per pod"
    )
    ap.add_argument(
        "--profile-webhook", metavar="PATH", help="run the webhook under cProfile, its stats written to PATH"
    )
    ap.add_argument("--no-extender", action="store_true", help="the baseline and DRA only")
    args = ap.parse_args()

    from hami_devkit.cluster import KubeCluster, MissingBinaries, SchedulerConfig as KubeSchedulerConfig
    from hami.draplugin.publisher import apply_device_classes, publish_slice
    from hami.kube.client import KubeClient, load_api_client
    from tests.integration._hami import (
        KeepAliveApi,
        NriStandIn,
        PluginStandIn,
        SchedulerProcess,
        gpu_pod,
        label_namespace,
        make_gpu_node,
        register_webhook,
    )
    from hami_devkit import audit
    from tests.integration.test_dra import gates_for

    cluster = KubeCluster(
        feature_gates=gates_for(KUBE_VERSION),
        extra_args={"kube-controller-manager": ["--kube-api-qps=1000", "--kube-api-burst=2000"]},
        audit=args.audit,
    )
    try:
        cluster.start()
    except MissingBinaries as exc:
        print(f"skipped: {exc}")
        return
    proc = hook = None
    try:
        print(f"Kubernetes {KUBE_VERSION}, {args.nodes} kwok nodes x 8 GPUs, {args.pods} pods per path")
        proc = SchedulerProcess(cluster, "--node-lock-retry-timeout=28s", loopback=True).start()
        names = [f"bench-{i:03d}" for i in range(args.nodes)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: make_gpu_node(cluster, n, gpus=8, mem=GPU_MIB, labels={"bench": "on"}), names))

        async def publish():
            k = KubeClient(await load_api_client(str(cluster.kubeconfig)))
            try:
                await apply_device_classes(k)
                for n in names:
                    gpus = [
                        PhysicalGPU(
                            i,
                            f"GPU-{abs(hash(n)) % 10**8:08d}-0000-4000-8000-{i:012d}",
                            "NVIDIA A100",
                            GPU_MIB,
                            f"0000:{i + 1:02x}:00.0",
                            0,
                        )
                        for i in range(8)
                    ]
                    await publish_slice(k, n, gpus, SliceSettings(split_count=10))
            finally:
                await k.close()

        asyncio.run(publish())
        time.sleep(2.0)
        api = KeepAliveApi(cluster)

        cpu_ms: dict[str, float] = {}  # per namespace: CPU ms per pod, every process of the cluster
        cpu_text: dict[str, str] = {}

        def pids() -> dict[str, int]:
            got = {name: c.process.pid for name, c in cluster.components.items() if getattr(c, "process", None)}
            got.update({"hami webhook": hook.proc.pid} if hook and hook.proc else {})
            got.update({"hami scheduler": proc.proc.pid} if proc and proc.proc else {})
            return got

        def cpu_line(ns: str) -> str:
            ratio = cpu_ms["bench-baseline"] / cpu_ms[ns] if ns != "bench-baseline" else 1.0
            return f"{cpu_ms[ns]:.1f} ms CPU per pod ({ratio:.2f}x the baseline's pods per CPU second; {cpu_text[ns]})"

        def run(ns: str, pods: list[dict], templates: list[dict] = (), prepare=None) -> tuple[float, Counter, Counter]:
            cluster.create_namespace(ns)
            for t in templates:
                api("POST", f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", t)
            if prepare:
                prepare(ns)
            before = request_counts(cluster)
            cpu_before = process_cpu(pids())
            offset = audit.log_size(cluster.audit_log) if args.audit else 0
            began = time.time()
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda p: api("POST", f"/api/v1/namespaces/{ns}/pods", p), pods))

            def bound():
                return not api("GET", f"/api/v1/namespaces/{ns}/pods?fieldSelector=spec.nodeName%3D&resourceVersion=0")[
                    "items"
                ]

            cluster.wait_for(bound, f"{len(pods)} pods bound in {ns}", timeout=900, interval=2.0)
            after = request_counts(cluster)
            used = {k: v - cpu_before.get(k, 0.0) for k, v in process_cpu(pids()).items()}
            cpu_ms[ns] = 1e3 * sum(used.values()) / len(pods)
            cpu_text[ns] = ", ".join(
                f"{k} {1e3 * v / len(pods):.1f}" for k, v in sorted(used.items(), key=lambda kv: -kv[1])
            )
            if args.audit:
                print(f"  {ns}: requests per pod by client (audit log):\n{by_client(cluster, offset, len(pods))}")
            items = api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
            when = [
                calendar.timegm(time.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ"))
                for p in items
                for c in p["status"].get("conditions") or ()
                if c["type"] == "PodScheduled"
            ]
            return max(max(when) - began, 1e-3), before, after

        fast = {"client_qps": 1000.0, "client_burst": 2000}
        n = args.pods
        nv = NvidiaVendor()

        # 0. the GPU-less baseline: default-scheduler (the harness's client rate limit), same nodes
        plain = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"b{i:04d}"},
                "spec": {"nodeSelector": {"bench": "on"}, "containers": [{"name": "c", "image": "busybox"}]},
            }
            for i in range(n)
        ]
        span_b, before, after = run("bench-baseline", plain)
        base = n / span_b
        print(f"baseline: {n} pods without GPUs, default-scheduler: {base:.0f} pods/s ({load()})")
        print(f"  baseline: {per_pod(before, after, n)}")
        print(f"  baseline: {cpu_line('bench-baseline')}")
        delete_pods(cluster, api, "bench-baseline")

        # 1. DRA: the webhook's translation, kube-scheduler ("hami-scheduler" profile, no extender) places claims
        cluster.configure_hami_scheduler(KubeSchedulerConfig(**fast))
        dra_pods, templates = [], {}
        for i in range(n):
            p = gpu_pod(f"d{i:04d}", "bench-dra", mem=4000, cores=5, node_selector={"bench": "on"})
            if args.dra_via == "webhook":
                dra_pods.append(p)
                continue
            out, ts = translate(admit_pod(p, [nv])[0], nv, namespace="bench-dra")
            dra_pods.append(out)
            templates.update({t["metadata"]["name"]: t for t in ts})
        prepare = None
        if args.dra_via == "webhook":
            hook = SchedulerProcess(cluster, "--front-end=dra", profile=args.profile_webhook).start()
            register_webhook(cluster, hook.url, "hami-bench-dra", WEBHOOK_LABEL)

            def prepare(ns: str) -> None:  # the namespace's pods go through the webhook, checked with a dry run
                label_namespace(cluster, ns, WEBHOOK_LABEL)
                dry = f"/api/v1/namespaces/{ns}/pods?dryRun=All"
                cluster.wait_for(
                    lambda: api("POST", dry, dra_pods[0])["spec"].get("resourceClaims"),
                    "the webhook turning GPU requests into claims",
                    timeout=30,
                    interval=0.2,
                )

        span, before, after = run("bench-dra", dra_pods, list(templates.values()), prepare)
        claims = api("GET", f"{RESOURCE}/namespaces/bench-dra/resourceclaims")["items"]
        used = Counter(
            (r["pool"], r["device"]) for c in claims for r in c["status"]["allocation"]["devices"]["results"]
        )
        print(
            f"DRA: {n} pods bound after {span:.1f}s -> {n / span:.0f} pods/s ({n / span / base:.2f}x the "
            f"baseline; {load()}); claims on {len(used)} GPUs of "
            f"{len({p for p, _ in used})} nodes (at most {max(used.values())} per GPU)"
        )
        print(f"  DRA: {per_pod(before, after, n)}")
        print(f"  DRA: {cpu_line('bench-dra')}")

        if args.no_extender:
            return
        # 2. extender: hami scheduler behind the same kube-scheduler, the plugin stand-in on the node side
        cluster.configure_hami_scheduler(KubeSchedulerConfig(extender=proc.extender(), **fast))
        ext_pods = [
            gpu_pod(f"e{i:04d}", "bench-ext", mem=4000, cores=5, node_selector={"bench": "on"}) for i in range(n)
        ]
        workers = max(args.nodes // 2, 1)
        standin = (
            NriStandIn(cluster, nodes=set(names), workers=workers)
            if args.injection == "nri"
            else PluginStandIn(cluster, workers=workers)
        )
        with standin:
            if args.injection == "nri":
                time.sleep(2.0)  # its hami.io/node-injection writes reach the scheduler's cache
            span_e, before, after = run("bench-ext", ext_pods)
        print(
            f"extender ({args.injection}): {n} pods bound after {span_e:.1f}s -> {n / span_e:.0f} pods/s "
            f"({n / span_e / base:.2f}x the baseline; {load()})"
        )
        print(f"  extender: {per_pod(before, after, n)}")
        print(f"  extender: {cpu_line('bench-ext')}")
        print(f"DRA / extender pods/s: {(n / span) / (n / span_e):.2f}")
    finally:
        try:
            cluster.configure_hami_scheduler(KubeSchedulerConfig())
        except Exception:  # noqa: BLE001 - the cluster is going away anyway
            pass
        if proc:
            proc.stop()
        if hook:
            hook.stop()
        cluster.stop()


if __name__ == "__main__":
    main()
