"""End to end on the real node: GPU pods through the chart-installed scheduler, as users run it.

A control plane of the test harness, one real node (kubelet + containerd + runc), kube-proxy,
and ``helm install charts/hami`` from the product image with the fake driver as host driver
(tests/realnode/product.py, as the end-to-end tests set it up). Then ``--pods`` (100) GPU pods
(``nvidia.com/gpu: 1``, ``nvidia.com/gpumem: 200``, ``nvidia.com/gpucores: 1``; busybox
``sleep``) are created at once from ``--writers`` threads, and the run measures, from the first
creation:

- time until every pod is Running (each container started by the real kubelet, after the
  webhook, kube-scheduler + the extender's Filter and Bind, the device plugin's Allocate with
  libvgpu's mounts), and pods/s = pods / that time; also when the first and the median pod
  were Running;
- API requests per pod: the API server's ``apiserver_request_total`` summed over every client
  (the pods' creation included), from before the first creation until
  all are Running, divided by the pods; the biggest (verb, resource) shares beside it;
- CPU per pod, by process (this machine runs everything: control plane, node, product).

Needs root, the binaries of scripts/install-kube.sh, scripts/install-node.sh's packages, and
the images (built on first use). Run:
``sudo .venv/bin/python bench/bench_realnode.py [--pods 100] [--writers 8]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "devkit" / "src"))  # the test harness (hami_devkit)
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.bench_scheduler import cpu_per_pod, cpu_seconds  # noqa: E402
from hami_devkit.controlplane import KubeCluster  # noqa: E402
from hami_devkit.images import build_busybox_image, build_hami_image, build_kube_scheduler_image, build_pause_image  # noqa: E402
from hami_devkit.realnode import RealNode  # noqa: E402
from tests.realnode.product import Product  # noqa: E402


def request_counts(cluster: KubeCluster) -> dict[tuple[str, str], float]:
    """``apiserver_request_total`` by (verb, resource[/subresource]), summed over codes."""
    text = _metrics(cluster)
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "apiserver_request_total":
                resource = s.labels.get("resource", "") + (
                    f"/{s.labels['subresource']}" if s.labels.get("subresource") else ""
                )
                key = (s.labels.get("verb", ""), resource)
                counts[key] = counts.get(key, 0.0) + s.value
    return counts


def _metrics(cluster: KubeCluster) -> str:
    import http.client

    connection = http.client.HTTPSConnection(
        "127.0.0.1", cluster.ports["kube-apiserver"], context=cluster._client_context(), timeout=30
    )
    try:
        connection.request("GET", "/metrics")
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def gpu_pod(name: str, image: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 200, "nvidia.com/gpucores": 1}},
                }
            ],
        },
    }


def run(args: argparse.Namespace) -> None:
    began = time.monotonic()
    busybox, pause = build_busybox_image(), build_pause_image()
    images = [build_hami_image(), build_kube_scheduler_image()]
    print(f"images ready in {time.monotonic() - began:.1f}s")
    with tempfile.TemporaryDirectory(prefix="hami-bench-realnode-") as work:
        cluster = KubeCluster(hami_scheduler=None, apiserver_bind_address="0.0.0.0").start()
        node = product = None
        try:
            node = RealNode(cluster, pause_image=pause, images=[busybox.path], lock_wait=900).start()
            print(node.describe_startup())
            product = Product(cluster, node, Path(work)).install(images)
            print("product: " + ", ".join(f"{k} {v:.1f}s" for k, v in product.timings.items()))
            ns = "bench"
            cluster.create_namespace(ns)
            pods = [gpu_pod(f"p{i:03d}", busybox.ref) for i in range(args.pods)]
            queue = list(pods)
            lock = threading.Lock()

            def writer() -> None:
                while True:
                    with lock:
                        if not queue:
                            return
                        pod = queue.pop()
                    cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)

            before, cpu_before = request_counts(cluster), cpu_seconds()
            t0 = time.monotonic()
            threads = [threading.Thread(target=writer) for _ in range(args.writers)]
            for t in threads:
                t.start()
            running_at: dict[str, float] = {}
            while len(running_at) < args.pods:
                items = cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
                now = time.monotonic() - t0
                for p in items:
                    if p["status"].get("phase") == "Running" and p["metadata"]["name"] not in running_at:
                        running_at[p["metadata"]["name"]] = now
                failed = [p["metadata"]["name"] for p in items if p["status"].get("phase") == "Failed"]
                if failed:
                    raise SystemExit(f"pods failed: {failed[:5]}")
                if now > args.timeout:
                    raise SystemExit(f"only {len(running_at)}/{args.pods} Running after {args.timeout}s")
                time.sleep(0.25)
            elapsed = max(running_at.values())
            after, cpu_after = request_counts(cluster), cpu_seconds()
            for t in threads:
                t.join()
            delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            total = sum(delta.values())
            top = sorted(((v, k) for k, v in delta.items() if v > 0), reverse=True)[:8]
            times = sorted(running_at.values())
            print(
                f"{args.pods} GPU pods created at once ({args.writers} writers) -> all Running in {elapsed:.1f}s "
                f"= {args.pods / elapsed:.1f} pods/s (first Running {times[0]:.1f}s, median "
                f"{statistics.median(times):.1f}s)"
            )
            print(
                f"API requests: {total:.0f} = {total / args.pods:.1f} per pod (the creation included; biggest: "
                + ", ".join(f"{verb} {res} {v / args.pods:.1f}" for v, (verb, res) in top)
                + ")"
            )
            print(cpu_per_pod(cpu_before, cpu_after, args.pods))
            cluster.delete_namespace(ns)
            cluster.wait_for(
                lambda: not cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"],
                "bench pods gone",
                timeout=300,
                interval=1,
            )
        finally:
            if product is not None:
                problems = product.uninstall()
                if problems:
                    print("uninstall left:", problems)
            if node is not None:
                node.stop()
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--writers", type=int, default=8, help="threads creating the pods")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for all Running")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
