"""A Cambricon MLU pod placed by `hami scheduler` on the real control plane, under the vendor's
own node lock.

The kwok node carries the capacity the Cambricon device plugin advertises (cards synthesised
from ``cambricon.com/mlu.smlu.vcore`` / ``vmemory``, as in tests/unit/test_vendor_cambricon.py).
Bind must take ``cambricon.com/dsmlu.lock`` (a bare RFC3339 time, 2-minute expiry), not
``hami.io/mutex.lock``. The node starts with a 3-minute-old ``dsmlu.lock`` left behind: stale
under Cambricon's 2-minute expiry (it would still be live under the 5-minute default), so it is
taken over at once. A stand-in for the Cambricon plugin then finds the node's pending pod (the
lock names nobody), marks it ``bind-phase=success`` and releases the lock it found.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
import uuid

import pytest

from hami_devkit.cluster import DEFAULT_MANAGED_RESOURCES, ExtenderConfig, SchedulerConfig
from hami.kube import nodelock

from ._hami import MERGE, PluginStandIn, SchedulerProcess, pods, wait_pods

pytestmark = pytest.mark.integration
VMLU, VMEM, VCORE = "cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory", "cambricon.com/mlu.smlu.vcore"
LOCK = "cambricon.com/dsmlu.lock"
ALLOCATED, TO_ALLOCATE = "hami.io/cambricon-mlu-devices-allocated", "hami.io/cambricon-mlu-devices-to-allocate"
DEVICE_CONFIG = "nvidia: {resourceCountName: nvidia.com/gpu}\ncambricon: {resourceCountName: cambricon.com/vmlu}\n"


class CambriconStandIn(PluginStandIn):
    """The Cambricon plugin's side: the node's pending pod, then the lock it found released."""

    def __init__(self, cluster, nodes: set[str]) -> None:
        super().__init__(cluster, nodes)
        self.seen: list[dict] = []

    def _serve(self, node: dict) -> None:
        name = node["metadata"]["name"]
        node_ann = node["metadata"].get("annotations") or {}
        value = node_ann.get(LOCK)
        if value is None:
            return
        listed = self.api("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{name}")["items"]
        pending = [
            p for p in listed if (p["metadata"].get("annotations") or {}).get("hami.io/bind-phase") == "allocating"
        ]
        for pod in pending:
            ann, meta = pod["metadata"]["annotations"], pod["metadata"]
            self.seen.append(
                {
                    "lock": value,
                    "hami_lock": node_ann.get(nodelock.NODE_LOCK),
                    "to_allocate": ann.get(TO_ALLOCATE),
                    "profile": ann.get("CAMBRICON_DSMLU_PROFILE"),
                }
            )
            self.api(
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"metadata": {"annotations": {TO_ALLOCATE: None, "hami.io/bind-phase": "success"}}},
                content_type=MERGE,
            )
        if pending:
            self.api(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"metadata": {"annotations": {LOCK: None}, "resourceVersion": node["metadata"]["resourceVersion"]}},
                content_type=MERGE,
            )


@pytest.fixture
def cambricon_hami(kube_cluster, tmp_path):
    cfg = tmp_path / "device-config.yaml"
    cfg.write_text(DEVICE_CONFIG)
    proc = SchedulerProcess(kube_cluster, f"--device-config-file={cfg}").start()
    kube_cluster.configure_hami_scheduler(
        SchedulerConfig(
            extender=ExtenderConfig(
                url_prefix=proc.url, managed_resources=DEFAULT_MANAGED_RESOURCES + (VMLU, VMEM, VCORE)
            )
        )
    )
    try:
        yield proc
    finally:
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        proc.stop()


def test_cambricon_pod_is_bound_under_the_dsmlu_lock(kube_cluster, kube_namespace, cambricon_hami):
    ns = kube_namespace
    node = f"mlu-{uuid.uuid4().hex[:5]}"
    left_behind = (datetime.now(timezone.utc) - timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube_cluster.create_node(node, annotations={LOCK: left_behind}, allocatable={VCORE: 400, VMEM: 4 * 384, VMLU: 400})
    try:
        with CambriconStandIn(kube_cluster, {node}) as standin:
            kube_cluster.api(
                "POST",
                f"/api/v1/namespaces/{ns}/pods",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "mlu-infer"},
                    "spec": {
                        "schedulerName": "hami-scheduler",
                        "terminationGracePeriodSeconds": 0,
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox",
                                "resources": {"limits": {VMLU: 1, VMEM: 20, VCORE: 30}},
                            }
                        ],
                    },
                },
            )
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
                "Cambricon pod bound and handed off",
                timeout=90,
            )
            pod = done[0]
        assert standin.errors == []
        ann = pod["metadata"]["annotations"]
        assert pod["spec"]["nodeName"] == node and ann["hami.io/vgpu-node"] == node
        assert ann[ALLOCATED] == f"{node}-cambricon-mlu-0,MLU,5120,30:;"
        assert len(standin.seen) == 1
        seen = standin.seen[0]
        assert seen["hami_lock"] is None  # the shared HAMi lock is not taken for an MLU-only pod
        assert seen["lock"] != left_behind and nodelock.parse_node_lock(seen["lock"]) is None
        taken = datetime.fromisoformat(seen["lock"].replace("Z", "+00:00"))  # a bare RFC3339 time
        assert abs((datetime.now(timezone.utc) - taken).total_seconds()) < 90
        assert seen["to_allocate"] == f"{node}-cambricon-mlu-0,MLU,5120,30:;" and seen["profile"] == "0_30_20"
        after = kube_cluster.api("GET", f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}
        assert LOCK not in after and nodelock.NODE_LOCK not in after
        assert len(pods(kube_cluster, ns)) == 1
    finally:
        kube_cluster.delete_node(node)
