"""`hami monitor` against the real API server: region directories are named after the pods on
its node, and the directories of pods that are gone are removed (after the grace period)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_devkit.cluster import free_port

from ..unit import _regionkit as kit

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _scrape(port: int) -> dict[str, list]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_monitor_names_regions_after_pods_and_removes_gone_ones(kube_cluster, kube_namespace, tmp_path):
    node = f"mon-{uuid.uuid4().hex[:6]}"
    kube_cluster.create_node(node, gpus=1)
    ns = kube_namespace
    pod = kube_cluster.api(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            # its grant: the series name the granted GPU (a region's own UUIDs are not exported)
            "metadata": {
                "name": "train",
                "namespace": ns,
                "annotations": {"hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1024,0:;"},
            },
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "busybox"}],
            },
        },
    )
    uid = pod["metadata"]["uid"]
    hook = tmp_path / "hook"
    live = kit.write(
        hook / "containers" / f"{uid}_main" / "r.cache",
        uuids=("GPU-x",),
        limits=(1 << 30,),
        procs=[kit.Proc(pid=5, used={0: (0, 0, 4096, 4096)})],
    )
    gone_dir = hook / "containers" / f"{uuid.uuid4()}_old"  # a pod not on the node
    kit.write(gone_dir / "r.cache")
    future = time.time() + 80 * 365 * 86400  # stamped by its container: removed all the same
    for p in (gone_dir / "r.cache", gone_dir):
        os.utime(p, (future, future))
    port = free_port()
    log = open(tmp_path / "monitor.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hami",
            "monitor",
            f"--node-name={node}",
            f"--kubeconfig={kube_cluster.kubeconfig}",
            f"--hook-path={hook}",
            f"--metrics-bind-address=127.0.0.1:{port}",
            "--interval=0.2",
            "--resync-interval=2s",  # gone from the pod list this long (by the monitor's clock): removed
            "--no-nvml",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def named():
            assert proc.poll() is None, (tmp_path / "monitor.log").read_text()
            try:
                got = _scrape(port)
            except OSError:
                return None
            used = [s for s in got.get("hami_vgpu_memory_used_bytes", ()) if s.labels["pod"] == "train"]
            return (used, got) if used and not gone_dir.exists() else None

        used, got = kube_cluster.wait_for(named, "monitor names the region and removes the gone one", timeout=30)
        assert used[0].labels == {
            "namespace": ns,
            "pod": "train",
            "container": "main",
            "vdevice_index": "0",
            "device_uuid": "GPU-x",
            "zone": "vGPU",
        }
        assert used[0].value == 4096
        regions = {s.labels["state"]: s.value for s in got["hami_monitor_regions"]}
        assert regions["ok"] == 1 and Path(live).exists()
        # the pod goes away: its series disappears (its directory stays until the grace period)
        kube_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/train?gracePeriodSeconds=0", expect=(200, 202, 404))
        kube_cluster.wait_for(
            lambda: not [s for s in _scrape(port).get("hami_vgpu_memory_used_bytes", ()) if s.labels["pod"] == "train"],
            "series of the deleted pod gone",
            timeout=30,
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        log.close()
        kube_cluster.delete_node(node)
    assert proc.returncode == 0, (tmp_path / "monitor.log").read_text()
