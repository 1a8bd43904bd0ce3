"""Static MIG (``migstrategy: mixed``) health: a fault on a GPU in MIG mode takes its instances out
of the kubelet's healthy devices (they were advertised healthy for ever), and only its own."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from hami.deviceplugin import static_mig
from hami.deviceplugin.agent import NodeAgent
from hami.deviceplugin.api import HEALTHY, UNHEALTHY
from hami.deviceplugin.server import PluginServer
from hami.node.nvml import Instance
from hami_devkit.kubelet_standin import KubeletStandIn

A100 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
H100 = "GPU-cccccccc-0000-4000-8000-000000000002"
RES = "nvidia.com/mig-1g.10gb"


@pytest.fixture
def plugin_dir():
    d = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # short: unix socket paths are limited
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_discovery_names_each_instances_gpu(monkeypatch):
    class Mig:
        def instances(self, uuid):
            n = 1 if uuid == A100 else 2
            return [Instance(n, "1g.10gb", 0, 1, 0, f"MIG-{n}"), Instance(9, "1g.10gb", 1, 1, None, "")]

    monkeypatch.setattr(static_mig, "MigNvml", Mig)
    monkeypatch.setattr(static_mig, "mig_enabled", lambda uuid: True)
    parents: dict[str, str] = {}
    found = static_mig.discover_static([A100, H100], parents=parents)
    assert found == {RES: ["MIG-1", "MIG-2"]} and parents == {"MIG-1": A100, "MIG-2": H100}
    [res] = static_mig.resources(found, parents)
    assert res.gpu_uuids == [A100, H100]


async def test_a_gpu_fault_marks_its_instances_unhealthy_for_the_kubelet(plugin_dir):
    kubelet = KubeletStandIn(plugin_dir)
    await kubelet.start()
    res = static_mig.StaticMigResource(RES, ["MIG-1", "MIG-2", "MIG-3"], {"MIG-1": A100, "MIG-2": A100, "MIG-3": H100})
    server = PluginServer(plugin_dir, res, None, poll=0.05, service=static_mig.StaticMigService(res))
    task = asyncio.create_task(server.run())
    try:
        await kubelet.wait_for(lambda: len(getattr(kubelet.plugins.get(RES), "devices", {})) == 3)
        ep = kubelet.plugins[RES]
        assert set(ep.devices.values()) == {HEALTHY}
        await res.mark_unhealthy(["GPU-not-here"])
        assert res.version == 0  # nothing of ours
        await res.mark_unhealthy([A100])
        await kubelet.wait_for(lambda: ep.devices["MIG-1"] == UNHEALTHY)
        assert ep.devices == {"MIG-1": UNHEALTHY, "MIG-2": UNHEALTHY, "MIG-3": HEALTHY}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kubelet.stop()


async def test_the_agents_health_watcher_covers_the_gpus_in_mig_mode(monkeypatch, plugin_dir):
    """The watcher is given the MIG GPUs beside the shared ones, and its report reaches the
    instances (before, it watched only the shared GPUs: a MIG GPU's XID went unseen)."""
    watched: list = []

    class Watcher:
        def __init__(self, uuids, report, *args, **kw):
            watched.extend(uuids)
            self.report = report

        def start(self):
            self.report([H100])

        def stop(self):
            pass

    from hami.deviceplugin import agent as agent_mod

    monkeypatch.setattr(agent_mod, "XidWatcher", Watcher)
    res = static_mig.StaticMigResource(RES, ["MIG-1", "MIG-3"], {"MIG-1": A100, "MIG-3": H100})
    agent = NodeAgent.__new__(NodeAgent)  # only what _start_watcher reads
    agent.static_mig = [res]
    agent.ignored_xids = frozenset()
    agent.xid_wait_ms = 10

    class State:
        uuids = ["GPU-shared"]
        marked: list = []

        async def mark_unhealthy(self, uuids):
            self.marked.extend(uuids)

    agent.state = State()
    agent._start_watcher()
    for _ in range(1000):
        if res.unhealthy:
            break
        await asyncio.sleep(0.01)
    assert watched == ["GPU-shared", A100, H100]
    assert res.unhealthy == {"MIG-3"} and agent.state.marked == [H100]
