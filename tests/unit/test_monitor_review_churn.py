"""`hami monitor` under pod churn: pods that finished, and what stays on the node after them.

A Job's pod that succeeded or failed stays in the API (until its TTL, or for ever) but never runs
again: its containers hold no GPU, the scheduler has released its devices, and its region is
garbage. The monitor must neither export its series (a killed process leaves its slot behind,
so a failed pod showed its memory in use for as long as the pod object lived) nor keep its
directory."""

from __future__ import annotations

from kubernetes_asyncio import client as kclient
from prometheus_client import CollectorRegistry, generate_latest

from hami.monitor import command
from hami.monitor import kube as mkube
from hami.monitor.containers import GoneDirs, scan
from hami.monitor.exporter import MonitorCollector

from . import _regionkit as kit

GiB = 1 << 30
ALLOCATED = "hami.io/vgpu-devices-allocated"


def _pod(uid: str, name: str, phase: str, gpu: str) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": uid,
            "annotations": {ALLOCATED: f"{gpu},NVIDIA,4000,30:;"},
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
        "status": {"phase": phase},
    }


class _FakeCore:
    """kubernetes_asyncio's CoreV1Api, answering one page of pods as the API server would."""

    pods: list[dict] = []

    def __init__(self, _api) -> None:
        pass

    async def list_pod_for_all_namespaces(self, **_kw):
        async with kclient.ApiClient() as api:
            return api._ApiClient__deserialize({"metadata": {}, "items": self.pods}, "V1PodList")


async def test_finished_pods_are_not_on_the_node_any_more(tmp_path, monkeypatch):
    _FakeCore.pods = [
        _pod("uid-run", "web", "Running", "GPU-1"),
        _pod("uid-ok", "job-ok", "Succeeded", "GPU-1"),
        _pod("uid-bad", "job-killed", "Failed", "GPU-1"),
        _pod("uid-new", "pending", "Pending", "GPU-1"),
    ]
    monkeypatch.setattr(kclient, "CoreV1Api", _FakeCore)
    pods = await mkube.node_pods(object(), "n1")
    assert sorted(pods) == ["uid-new", "uid-run"]

    # what that means for a scrape: the killed job's slot (its process died by SIGKILL, so the
    # library never cleared it) is not shown, and its directory is due for removal
    root = tmp_path / "containers"
    for uid in ("uid-run", "uid-bad"):
        kit.write(
            root / f"{uid}_main" / "r.cache",
            uuids=("GPU-1",),
            procs=[kit.Proc(pid=7, hostpid=700, used={0: (0, 0, 3 * GiB, 3 * GiB)})],
        )
    registry = CollectorRegistry()
    registry.register(MonitorCollector("n1", str(root), pods=lambda: pods))
    text = generate_latest(registry).decode()
    assert 'pod="web"' in text
    assert "job-killed" not in text
    assert [d.pod_uid for d in GoneDirs().due(scan(str(root)), set(pods), now=0.0, grace_s=0.0)] == ["uid-bad"]
    assert command.sweep(str(root), set(pods), 0.0, 0.0) == [str(root / "uid-bad_main")]
