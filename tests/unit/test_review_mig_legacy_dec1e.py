"""Found by review, 1 Dec: on its first start the device plugin destroyed MIG instances that
running pods placed by an older HAMi release still used. Those releases wrote a MIG grant only as
``<GPU UUID>[<template>-<slot>]`` in ``hami.io/vgpu-devices-allocated`` (no
``hami.io/vgpu-mig-allocations``), so the start-up recovery found no claim and destroyed every
instance of an idle pod (no process on it: NVML does not refuse). Now a GPU a live pod holds
through such a grant keeps every instance on it; other GPUs are cleaned up as before."""

from __future__ import annotations

from types import SimpleNamespace

from hami.deviceplugin.agent import NodeAgent
from hami.deviceplugin.allocate import PodView
from hami.node.mig import Checkpoint, MigManager
from hami.node.nvml import Instance

OLD = "GPU-aaaaaaaa-0000-4000-8000-000000000000"  # the GPU an old HAMi release cut for the notebook
OTHER = "GPU-bbbbbbbb-0000-4000-8000-000000000000"


class TwoGpuNvml:
    """In-memory NVML for several GPUs: instances per GPU, destroy always succeeds (idle)."""

    def __init__(self) -> None:
        self.live: dict[str, dict[int, Instance]] = {OLD: {}, OTHER: {}}

    def enable(self, uuid):
        pass

    def profiles(self, uuid):
        return []

    def instances(self, uuid):
        return sorted(self.live[uuid].values(), key=lambda i: i.gi)

    def destroy(self, uuid, gi):
        self.live[uuid].pop(gi, None)


class Pods:
    def __init__(self, pods):
        self.pods = pods

    async def pods_on_node(self):
        return self.pods


def legacy_pod(phase: str = "Running") -> PodView:
    return PodView(
        "ml",
        "notebook",
        "uid-nb",
        {"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": f"{OLD}[1-0],NVIDIA,9984,0:;"},
        (),
        node_name="n1",
        phase=phase,
    )


def setup(tmp_path, pods):
    nvml = TwoGpuNvml()
    nvml.live[OLD][1] = Instance(1, "1g.10gb", 0, 1, 0, "MIG-notebook")  # the notebook's, idle
    nvml.live[OLD][2] = Instance(2, "1g.10gb", 1, 1, 0, "MIG-sibling")  # the template's other slot
    nvml.live[OTHER][5] = Instance(5, "3g.40gb", 0, 4, 0, "MIG-stray")  # nobody's
    agent = SimpleNamespace(mig=MigManager(nvml, Checkpoint(tmp_path / "c.json"), [OLD, OTHER]), kube=Pods(pods))
    return nvml, agent


async def test_a_live_pods_legacy_mig_grant_keeps_every_instance_on_its_gpu(tmp_path, caplog):
    """A node switches to this chart (operatingmode mig) while an idle notebook pod from old HAMi
    holds ``OLD[1-0]``: the instances on OLD are kept (one line names the pod and the GPU); the
    unclaimed instance on the other GPU is still destroyed."""
    nvml, agent = setup(tmp_path, [legacy_pod()])
    caplog.set_level("INFO", logger="hami.deviceplugin.agent")
    await NodeAgent._recover_mig(agent)
    assert sorted(nvml.live[OLD]) == [1, 2]
    assert nvml.live[OTHER] == {}
    kept = [r.getMessage() for r in caplog.records if "kept every MIG instance" in r.getMessage()]
    assert len(kept) == 1 and OLD in kept[0] and "ml/notebook" in kept[0] and f"{OLD}[1-0]" in kept[0]


async def test_a_finished_legacy_pod_keeps_nothing(tmp_path):
    """The same pod, Succeeded: it holds nothing, and its GPU is cleaned up like any other."""
    nvml, agent = setup(tmp_path, [legacy_pod("Succeeded")])
    await NodeAgent._recover_mig(agent)
    assert nvml.live == {OLD: {}, OTHER: {}}


def test_legacy_grants_are_read_for_this_nodes_gpus_only():
    from hami.deviceplugin.agent import legacy_mig_grants

    text = f"{OLD}[1-0],NVIDIA,9984,0:{OTHER},NVIDIA,1000,10:;GPU-elsewhere[2-1],NVIDIA,9984,0:;"
    assert legacy_mig_grants(text, [OLD, OTHER]) == [(OLD, f"{OLD}[1-0]")]
    # an annotation that does not decode still keeps a GPU it names in the legacy form
    assert legacy_mig_grants(f"{OLD}[1-0],NVIDIA;", [OLD, OTHER]) == [(OLD, f"{OLD}[...]")]
    assert legacy_mig_grants("", [OLD]) == []
