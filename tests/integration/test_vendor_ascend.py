"""An Ascend pod placed by `hami scheduler` on the real control plane.

A kwok node carries the registration annotation exactly as the Ascend device plugin writes it
(``hami.io/node-register-Ascend910B3``, JSON with ``custominfo.NetworkID``); the pod goes
through our webhook (memory snapped to a vNPU template, schedulerName set), the
kube-scheduler's `hami-scheduler` profile with our extender, and our bind. A small stand-in for
the Ascend plugin then does the node side from annotations only: it reads
``hami.io/Ascend910B3-devices-to-allocate`` and ``huawei.com/Ascend910B3``, marks the pod
``hami.io/bind-phase=success`` and releases the node lock.
"""

from __future__ import annotations

import json
import uuid

import pytest

from hami_devkit.cluster import DEFAULT_MANAGED_RESOURCES, ExtenderConfig, SchedulerConfig

from ._hami import (
    PluginStandIn,
    SchedulerProcess,
    delete_webhook,
    label_namespace,
    nodelock,
    pods,
    register_webhook,
    wait_pods,
    wait_webhook_routes,
)

pytestmark = pytest.mark.integration
CW = "Ascend910B3"
RES, MEM = f"huawei.com/{CW}", f"huawei.com/{CW}-memory"
ALLOCATED, TO_ALLOCATE = f"hami.io/{CW}-devices-allocated", f"hami.io/{CW}-devices-to-allocate"
RUNTIME = f"huawei.com/{CW}"
WEBHOOK_LABEL = "hami.io/webhook-ascend-test"
DEVICE_CONFIG = f"""
nvidia: {{resourceCountName: nvidia.com/gpu}}
vnpus:
  configs:
  - {{chipName: 910B3, commonWord: {CW}, resourceName: {RES}, resourceMemoryName: {MEM},
     resourceCoreName: huawei.com/{CW}-core, memoryAllocatable: 65536, memoryCapacity: 65536,
     templates: [{{name: vir05_1c_16g, memory: 16384}}, {{name: vir10_3c_32g, memory: 32768}}]}}
"""


class AscendStandIn(PluginStandIn):
    """The Ascend plugin's side of the handoff, from annotations only."""

    def __init__(self, cluster, nodes: set[str]) -> None:
        super().__init__(cluster, nodes)
        self.seen: list[dict] = []

    def _serve(self, node: dict) -> None:
        name = node["metadata"]["name"]
        raw = (node["metadata"].get("annotations") or {}).get(nodelock.NODE_LOCK)
        lock = nodelock.parse_node_lock(raw)
        if lock is None:
            return
        pod = self.cluster.api("GET", f"/api/v1/namespaces/{lock.namespace}/pods/{lock.name}")
        if pod["spec"].get("nodeName") != name:
            return
        ann = pod["metadata"].get("annotations") or {}
        if ann.get("hami.io/bind-phase") != "success":
            self.seen.append({k: ann.get(k) for k in (TO_ALLOCATE, RUNTIME, "predicate-time")})
            self.cluster.api(
                "PATCH",
                f"/api/v1/namespaces/{lock.namespace}/pods/{lock.name}",
                {"metadata": {"annotations": {TO_ALLOCATE: None, "hami.io/bind-phase": "success"}}},
                content_type="application/merge-patch+json",
            )
        self._release(name, raw)


@pytest.fixture
def ascend_hami(kube_cluster, tmp_path):
    cfg = tmp_path / "device-config.yaml"
    cfg.write_text(DEVICE_CONFIG)
    proc = SchedulerProcess(kube_cluster, f"--device-config-file={cfg}").start()
    webhook = f"hami-ascend-{uuid.uuid4().hex[:6]}"
    kube_cluster.configure_hami_scheduler(
        SchedulerConfig(
            extender=ExtenderConfig(url_prefix=proc.url, managed_resources=DEFAULT_MANAGED_RESOURCES + (RES, MEM))
        )
    )
    register_webhook(kube_cluster, proc.url, webhook, WEBHOOK_LABEL)
    try:
        yield proc
    finally:
        delete_webhook(kube_cluster, webhook)
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        proc.stop()


def test_ascend_pod_is_placed_with_the_annotations_the_plugin_reads(kube_cluster, kube_namespace, ascend_hami):
    ns = kube_namespace
    label_namespace(kube_cluster, ns, WEBHOOK_LABEL)
    node = f"npu-{uuid.uuid4().hex[:5]}"
    npus = [
        {
            "id": f"{node}-npu-{i}",
            "index": i,
            "count": 4,
            "devmem": 65536,
            "devcore": 20,
            "type": CW,
            "health": True,
            "custominfo": {"NetworkID": 1 + i // 2},
        }
        for i in range(4)
    ]
    kube_cluster.create_node(
        node, annotations={f"hami.io/node-register-{CW}": json.dumps(npus)}, allocatable={RES: "4"}
    )
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "npu-infer"},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "mindie", "image": "busybox", "resources": {"limits": {RES: 1, MEM: 12000}}}],
            },
        }
        wait_webhook_routes(kube_cluster, ns, pod)
        with AscendStandIn(kube_cluster, {node}) as standin:
            kube_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
            done = wait_pods(
                kube_cluster,
                ns,
                lambda ps: (
                    ps
                    if ps
                    and ps[0]["spec"].get("nodeName")
                    and (ps[0]["metadata"].get("annotations") or {}).get("hami.io/bind-phase") == "success"
                    else None
                ),
                "Ascend pod bound and handed off",
                timeout=90,
            )
            pod = done[0]
        assert standin.errors == []
        ann = pod["metadata"]["annotations"]
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert pod["spec"]["schedulerName"] == "hami-scheduler"
        assert limits[MEM] == "16384"  # 12000 MiB snapped to vir05_1c_16g by our webhook
        assert pod["spec"]["nodeName"] == node and ann["hami.io/vgpu-node"] == node
        assert ann[ALLOCATED] == f"{node}-npu-0,{CW},16384,0:;"
        assert TO_ALLOCATE not in ann  # consumed by the plugin stand-in
        assert standin.seen == [
            {
                TO_ALLOCATE: f"{node}-npu-0,{CW},16384,0:;",
                RUNTIME: f'[{{"UUID":"{node}-npu-0","temp":"vir05_1c_16g"}}]',
                "predicate-time": ann["predicate-time"],
            }
        ]
        assert ann[RUNTIME] == f'[{{"UUID":"{node}-npu-0","temp":"vir05_1c_16g"}}]'
        lock = kube_cluster.api("GET", f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}
        assert nodelock.NODE_LOCK not in lock
        assert len(pods(kube_cluster, ns)) == 1
    finally:
        kube_cluster.delete_node(node)
