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


# ---------------------------------------------------------------------------------------------
# Found by review, 1 Dec (regression review of the change above): the instances kept at start-up
# stayed after the legacy pod ended. Only the next start would destroy them, and nothing starts
# the plugin: the scheduler, seeing the GPU free, placed a new MIG pod there, and its Allocate
# failed ("overlaps GPU instance 1 ... claimed by no pod") for every pod placed there. Now the
# clean-up (Allocator.collect_mig, every --mig-collect-interval and before an Allocate's retry)
# destroys what nobody claims on such a GPU once no live pod holds it through the legacy grant.

import pynvml  # noqa: E402
import pytest  # noqa: E402

from hami.core.codec import MigAllocation, encode_mig_allocations  # noqa: E402
from hami.deviceplugin.allocate import AllocationError  # noqa: E402
from hami.deviceplugin.allocator import Allocator  # noqa: E402
from hami.node.mig import Entry, PodRef  # noqa: E402
from hami.node.nvml import GpuProfile  # noqa: E402

ONE_G = GpuProfile("1g.10gb", 19, 1, 7, 14, 9984, tuple((s, 1) for s in range(7)))
NEW = PodRef("uid-new", "ml", "train")  # the pod the scheduler places on OLD once it looks free


class MakingNvml(TwoGpuNvml):
    """TwoGpuNvml that also makes instances (1g.10gb only); ``busy`` GPU instances (processes on
    them) are refused a destroy as NVML refuses them (NVML_ERROR_IN_USE)."""

    def __init__(self) -> None:
        super().__init__()
        self.busy: set[int] = set()

    def profiles(self, uuid):
        return [ONE_G]

    def destroy(self, uuid, gi):
        if gi in self.busy:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
        super().destroy(uuid, gi)

    def create_gi(self, uuid, profile, start):
        if any(i.start <= start < i.start + i.size for i in self.live[uuid].values()):
            raise AssertionError(f"NVML would refuse a {profile.name} instance at {start} on {uuid}")
        gi = 1 + max((g for per in self.live.values() for g in per), default=0)
        self.live[uuid][gi] = Instance(gi, profile.name, start, 1)
        return gi

    def create_ci(self, uuid, gi, profile):
        i = self.live[uuid][gi]
        self.live[uuid][gi] = Instance(gi, i.profile, i.start, i.size, 0, f"MIG-{gi}")
        return 0, f"MIG-{gi}"


def plain_pod(uid: str, name: str, annotations=None) -> PodView:
    return PodView("ml", name, uid, dict(annotations or {}), (), node_name="n1", phase="Running")


class FlakyPods(Pods):
    """This node's pods; ``down`` makes the read fail as an unreachable API server does."""

    down = False

    async def pods_on_node(self):
        if self.down:
            raise OSError("connection refused")
        return self.pods


def kept_node(tmp_path):
    """OLD as an old HAMi release left it (mig-parted, all 1g.10gb): the notebook's idle instance
    (1, at 0), the template's other slots (2 at 1, 5 at 4), one a checkpoint entry of pod ``ck``
    holds (3, at 2: a pod of this plugin) and one pod ``ann``'s hami.io/vgpu-mig-allocations names
    (4, at 3: adopted at start). The plugin starts with the notebook running."""
    nvml = MakingNvml()
    for gi, start in ((1, 0), (2, 1), (3, 2), (4, 3), (5, 4)):
        nvml.live[OLD][gi] = Instance(gi, "1g.10gb", start, 1, 0, f"MIG-old-{gi}")
    checkpoint = Checkpoint(tmp_path / "c.json")
    checkpoint.save({"uid-ck/0/0": Entry("uid-ck", "ml/ck", 0, 0, OLD, "1g.10gb", 2, 1, "ready", 3, 0, "MIG-old-3")})
    named = MigAllocation(0, 0, OLD, "1g.10gb", 3, 1, "MIG-old-4", 4, 0)
    ann = plain_pod("uid-ann", "ann", {"hami.io/vgpu-mig-allocations": encode_mig_allocations([named])})
    kube = FlakyPods([legacy_pod(), plain_pod("uid-ck", "ck"), ann])
    allocator = object.__new__(Allocator)  # collect_mig and _prepare_mig read .mig and .kube only
    allocator.mig = MigManager(nvml, checkpoint, [OLD, OTHER])
    allocator.kube = kube
    return nvml, kube, allocator


async def test_kept_instances_are_destroyed_once_the_legacy_pod_ends(tmp_path, caplog):
    """Kept at start and through every clean-up while the notebook lives; once it has ended, the
    next clean-up destroys the instances nobody claims on OLD (one line naming OLD), not the
    checkpoint entry's or the one pod ann's annotation names, and an Allocate of a new pod's
    reservation at placement 0 there succeeds (before: refused, "claimed by no pod")."""
    nvml, kube, allocator = kept_node(tmp_path)
    await NodeAgent._recover_mig(allocator)
    assert sorted(nvml.live[OLD]) == [1, 2, 3, 4, 5]
    await allocator.collect_mig()
    assert sorted(nvml.live[OLD]) == [1, 2, 3, 4, 5]

    kube.pods = [legacy_pod("Succeeded"), *kube.pods[1:]]
    caplog.set_level("INFO", logger="hami.deviceplugin.allocator")
    await allocator.collect_mig()
    assert sorted(nvml.live[OLD]) == [3, 4]
    assert allocator.mig.kept == {}
    lines = [r.getMessage() for r in caplog.records if "legacy MIG grant any more" in r.getMessage()]
    assert len(lines) == 1 and OLD in lines[0]
    assert {e.gpu_instance_id for e in allocator.mig.entries.values()} == {3, 4}  # 4 adopted at start

    [made] = await allocator._prepare_mig(NEW, [MigAllocation(0, 0, OLD, "1g.10gb", 0, 1)])
    assert made.mig_uuid and nvml.live[OLD][made.gpu_instance_id].start == 0
    kube.pods = [*kube.pods[1:], plain_pod(NEW.uid, NEW.name)]  # the notebook deleted: nothing more goes
    await allocator.collect_mig()
    assert sorted(nvml.live[OLD]) == sorted([3, 4, made.gpu_instance_id])


async def test_an_allocate_over_a_kept_gpu_collects_first(tmp_path):
    """The notebook ends and the scheduler places the new pod at once, before the periodic
    clean-up: the Allocate collects (with a fresh pod list) and retries. While the notebook still
    runs the Allocate is refused naming the pod that holds the GPU, and nothing is destroyed."""
    nvml, kube, allocator = kept_node(tmp_path)
    await NodeAgent._recover_mig(allocator)
    with pytest.raises(AllocationError, match=r"overlaps GPU instance 1 .*kept at start-up.*ml/notebook"):
        await allocator._prepare_mig(NEW, [MigAllocation(0, 0, OLD, "1g.10gb", 0, 1)])
    assert sorted(nvml.live[OLD]) == [1, 2, 3, 4, 5]
    kube.pods = kube.pods[1:]  # the notebook is deleted
    [made] = await allocator._prepare_mig(NEW, [MigAllocation(0, 0, OLD, "1g.10gb", 0, 1)])
    assert sorted(nvml.live[OLD]) == sorted([3, 4, made.gpu_instance_id]) and allocator.mig.kept == {}


async def test_a_failed_pod_read_keeps_the_kept_instances(tmp_path):
    """The notebook has ended but the clean-up cannot read the node's pods: nothing on OLD is
    destroyed and OLD stays kept; the next read that succeeds releases it."""
    nvml, kube, allocator = kept_node(tmp_path)
    await NodeAgent._recover_mig(allocator)
    kube.pods, kube.down = kube.pods[1:], True
    with pytest.raises(OSError):
        await allocator.collect_mig()
    assert sorted(nvml.live[OLD]) == [1, 2, 3, 4, 5]
    kube.down = False
    await allocator.collect_mig()
    assert sorted(nvml.live[OLD]) == [3, 4] and allocator.mig.kept == {}


def test_release_spares_claimed_instances_and_retries_refused_ones(tmp_path):
    """MigManager.release_kept alone: an instance a live pod's annotation names (not adopted at
    start: the pod came later) is adopted, not destroyed; one NVML refuses (a process still on it)
    is reported, OLD stays kept, and the next call destroys it and releases OLD."""
    nvml = MakingNvml()
    for gi, start in ((1, 0), (2, 1), (3, 2)):
        nvml.live[OLD][gi] = Instance(gi, "1g.10gb", start, 1, 0, f"MIG-old-{gi}")
    mig = MigManager(nvml, Checkpoint(tmp_path / "c.json"), [OLD, OTHER])
    mig.recover([], True, {OLD: "held by pod ml/notebook"})
    assert mig.release_kept({OLD}) == [] and sorted(nvml.live[OLD]) == [1, 2, 3]  # still held
    nvml.busy.add(1)
    claim = (PodRef("uid-late", "ml", "late"), MigAllocation(0, 0, OLD, "1g.10gb", 2, 1, "MIG-old-3", 3, 0))
    done = mig.release_kept(set(), [claim])
    assert sorted(nvml.live[OLD]) == [1, 3] and list(mig.kept) == [OLD]
    assert [e.gpu_instance_id for e in mig.entries.values()] == [3]
    assert any("cannot destroy GPU instance" in line and "1 (1g.10gb at 0)" in line for line in done)
    nvml.busy.clear()
    done = mig.release_kept(set(), [claim])
    assert sorted(nvml.live[OLD]) == [3] and mig.kept == {} and len(done) == 1 and OLD in done[0]
