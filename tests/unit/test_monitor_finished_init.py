"""An init container that ran to its end holds nothing: the monitor leaves its region out of the
series (its limit counted in a GPU's sum of limits as long as the pod lived) and counts it as
``hami_monitor_regions{state="finished"}``; a sidecar (restartPolicy Always) and a running init
container keep theirs."""

from __future__ import annotations

from kubernetes_asyncio import client as kclient
from prometheus_client import CollectorRegistry, generate_latest

from hami.monitor import kube as mkube
from hami.monitor.exporter import MonitorCollector

from . import _regionkit as kit
from .test_monitor_review_churn import _FakeCore

GiB = 1 << 30


def _pod(init_states: dict[str, dict], sidecars=()) -> dict:
    return {
        "metadata": {"name": "web", "namespace": "team", "uid": "uid-1"},
        "spec": {
            "nodeName": "n1",
            "restartPolicy": "Never",  # an init container of another policy may run again: never finished
            "initContainers": [
                {"name": n, **({"restartPolicy": "Always"} if n in sidecars else {})} for n in init_states
            ],
            "containers": [{"name": "main"}],
        },
        "status": {
            "phase": "Running",
            "initContainerStatuses": [
                {"name": n, "state": st, "ready": False, "restartCount": 0, "image": "i", "imageID": ""}
                for n, st in init_states.items()
            ],
        },
    }


async def test_a_finished_init_container_has_no_series(tmp_path, monkeypatch):
    done = {"terminated": {"exitCode": 0}}
    _FakeCore.pods = [_pod({"prep": done, "proxy": done, "wait": {"running": {}}}, sidecars=("proxy",))]
    monkeypatch.setattr(kclient, "CoreV1Api", _FakeCore)
    pods = await mkube.node_pods(object(), "n1")
    assert pods["uid-1"].finished == frozenset({"prep"})  # the sidecar ended too, but it is restarted

    root = tmp_path / "containers"
    for name in ("prep", "proxy", "wait", "main"):
        kit.write(root / f"uid-1_{name}" / "r.cache", uuids=("GPU-1",), procs=[])
    registry = CollectorRegistry()
    registry.register(MonitorCollector("n1", str(root), pods=lambda: pods))
    text = generate_latest(registry).decode()
    limits = [line for line in text.splitlines() if line.startswith("hami_vgpu_memory_limit_bytes{")]
    assert sorted(line.split('container="')[1].split('"')[0] for line in limits) == ["main", "proxy", "wait"]
    assert 'hami_monitor_regions{node="n1",state="finished",zone="vGPU"} 1.0' in text
