"""Adversarial review of dynamic MIG on the node (hami.node.mig.MigManager): instances that NVML
refuses to destroy (processes still on them), instances this plugin did not make, and what the
clean-up does around them. NVML is faked in memory; a destroy of a busy instance fails as the
real driver's does (NVML_ERROR_IN_USE)."""

from __future__ import annotations

import pynvml
import pytest

from hami.core.codec import MigAllocation
from hami.node.mig import Checkpoint, MigManager, PodRef
from hami.node.nvml import GpuProfile, Instance, MigError

GPU = "GPU-aaaaaaaa-0000-4000-8000-000000000000"

A100 = (
    GpuProfile("1g.5gb", 19, 1, 7, 14, 4864, tuple((s, 1) for s in range(7))),
    GpuProfile("2g.10gb", 14, 2, 3, 28, 9856, ((0, 2), (2, 2), (4, 2))),
    GpuProfile("3g.20gb", 9, 3, 2, 42, 19968, ((0, 4), (4, 4))),
    GpuProfile("4g.20gb", 5, 4, 1, 56, 19968, ((0, 4),)),
    GpuProfile("7g.40gb", 0, 7, 1, 98, 40192, ((0, 8),)),
)

POD_A = PodRef("uid-a", "ns", "a")
POD_B = PodRef("uid-b", "ns", "b")
POD_C = PodRef("uid-c", "ns", "c")


class BusyMig:
    """One fake A100; ``busy`` holds the GPU instances with processes on them."""

    def __init__(self) -> None:
        self.live: dict[int, Instance] = {}
        self.busy: set[int] = set()

    def enable(self, uuid):
        pass

    def profiles(self, uuid):
        return list(A100)

    def instances(self, uuid):
        return sorted(self.live.values(), key=lambda i: i.gi)

    def create_gi(self, uuid, profile, start):
        size = dict(profile.placements)[start]
        for i in self.live.values():
            if i.start < start + size and start < i.start + i.size:
                raise MigError(f"GPU {uuid}: cannot create a {profile.name} instance at placement {start}+{size}")
        gi = max(self.live, default=0) + 1
        self.live[gi] = Instance(gi, profile.name, start, size)
        return gi

    def create_ci(self, uuid, gi, profile):
        i = self.live[gi]
        self.live[gi] = Instance(gi, i.profile, i.start, i.size, 0, f"MIG-{gi:04d}")
        return 0, f"MIG-{gi:04d}"

    def destroy(self, uuid, gi):
        if gi in self.busy:  # MigNvml.destroy lets NVML's own error through
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
        self.live.pop(gi, None)

    def foreign(self, profile: str, start: int, size: int, busy: bool = True) -> int:
        """An instance somebody else made (an administrator, mig-parted), with its MIG device."""
        gi = max(self.live, default=0) + 1
        self.live[gi] = Instance(gi, profile, start, size, 0, f"MIG-foreign-{gi}")
        if busy:
            self.busy.add(gi)
        return gi


def alloc(profile: str, start: int, size: int, **kw) -> MigAllocation:
    return MigAllocation(0, 0, GPU, profile, start, size, **kw)


def manager(tmp_path, nvml: BusyMig) -> MigManager:
    return MigManager(nvml, Checkpoint(tmp_path / "checkpoint.json"), [GPU])


def test_a_busy_instance_does_not_stop_the_clean_up_of_the_others(tmp_path):
    """Two pods are gone; NVML refuses to destroy the first one's instance (a process still holds
    it). The clean-up raised NVML's error at the first and never reached the second, whose
    placement the scheduler hands out again: every later Allocate there failed. Now each
    instance is tried on its own; the busy one stays recorded and is tried again next round."""
    nvml = BusyMig()
    mig = manager(tmp_path, nvml)
    mig.recover()
    [a] = mig.prepare(POD_A, [alloc("3g.20gb", 4, 4)])
    [b] = mig.prepare(POD_B, [alloc("3g.20gb", 0, 4)])
    nvml.busy.add(a.gpu_instance_id)
    done = mig.collect(set())
    assert b.gpu_instance_id not in nvml.live  # B's instance is destroyed
    assert a.gpu_instance_id in nvml.live  # A's is kept, and stays recorded
    assert [e.pod_uid for e in mig.entries.values()] == ["uid-a"]
    assert [e.pod_uid for e in Checkpoint(tmp_path / "checkpoint.json").load().values()] == ["uid-a"]
    assert any("ns/a" in line and "cannot destroy" in line for line in done)
    [c] = mig.prepare(POD_C, [alloc("3g.20gb", 0, 4)])  # B's placement is free again
    assert c.mig_uuid
    nvml.busy.clear()  # the process ends: the next round destroys A's instance
    mig.collect({"uid-c"})
    assert list(nvml.live) == [c.gpu_instance_id] and list(mig.entries) == ["uid-c/0/0"]


def test_a_busy_instance_nobody_claims_does_not_stop_the_start(tmp_path):
    """An instance made by someone else, with a process on it, and an unclaimed idle one: the
    start-up raised NVML's error (the plugin never came up, and restarted into the same error).
    Now the idle one is destroyed and the busy one is kept with a line naming it."""
    nvml = BusyMig()
    busy = nvml.foreign("3g.20gb", 4, 4)
    idle = nvml.foreign("1g.5gb", 0, 1, busy=False)
    done = manager(tmp_path, nvml).recover()
    assert list(nvml.live) == [busy] and idle not in nvml.live
    assert any(f"GPU instance {busy}" in line and "in use" in line for line in done)


def test_an_instance_not_made_for_the_pod_is_never_handed_to_it(tmp_path):
    """An instance somebody else made (kept at start-up: busy, or the pods could not be listed)
    sits at the placement the scheduler gives a new pod. Allocate reused it as "left by an
    earlier attempt": the pod got a MIG device another workload was running on. Now the pod's
    Allocate fails (NVML refuses an overlapping instance) and the foreign instance is untouched."""
    nvml = BusyMig()
    theirs = nvml.foreign("3g.20gb", 4, 4, busy=False)
    mig = manager(tmp_path, nvml)
    mig.recover(destroy_unclaimed=False)  # the pods could not be listed: nothing unclaimed destroyed
    with pytest.raises(MigError, match="overlaps GPU instance 1 .3g.20gb at 4, claimed by no pod"):
        mig.prepare(POD_A, [alloc("3g.20gb", 4, 4)])
    assert nvml.live[theirs].mig_uuid == f"MIG-foreign-{theirs}"
    assert mig.entries == {}  # no entry claims it, so a later start still sees it as unclaimed


def test_the_pods_own_instance_named_by_its_annotation_is_still_reused(tmp_path):
    """The counterpart: a pod whose annotation names the instance (the checkpoint was lost and
    the pods could not be listed at start-up) gets it back on a retried Allocate."""
    nvml = BusyMig()
    gi = nvml.foreign("3g.20gb", 4, 4, busy=False)
    mig = manager(tmp_path, nvml)
    mig.recover(destroy_unclaimed=False)
    [got] = mig.prepare(
        POD_A, [alloc("3g.20gb", 4, 4, mig_uuid=f"MIG-foreign-{gi}", gpu_instance_id=gi, compute_instance_id=0)]
    )
    assert (got.gpu_instance_id, got.mig_uuid) == (gi, f"MIG-foreign-{gi}")
    assert list(nvml.live) == [gi]


def test_a_gpu_instance_without_compute_instance_is_completed(tmp_path):
    """A GPU instance at the placement with no compute instance runs nothing: it is taken over
    (no MIG device exists yet) rather than refused. NVML numbers GPU instances from 0 (a 7g
    instance is usually 0): id 0 was read as "none found" and a second one was created over it."""
    nvml = BusyMig()
    nvml.live[0] = Instance(0, "7g.40gb", 0, 8)
    mig = manager(tmp_path, nvml)
    mig.recover(destroy_unclaimed=False)
    [got] = mig.prepare(POD_A, [alloc("7g.40gb", 0, 8)])
    assert (got.gpu_instance_id, got.mig_uuid) == (0, "MIG-0000")
    assert list(nvml.live) == [0]


def test_a_retry_that_cannot_undo_its_half_made_instance_keeps_it_recorded(tmp_path):
    """A creation stopped after the GPU instance (the compute instance failed) is undone by the
    retried Allocate; when NVML refuses that destroy the retry fails and the entry keeps the
    instance, so the pod's clean-up still destroys it later (dropped, it was nobody's until the
    next start)."""
    nvml = BusyMig()
    mig = manager(tmp_path, nvml)
    mig.recover()
    create_ci = nvml.create_ci
    nvml.create_ci = lambda *a: (_ for _ in ()).throw(MigError("no compute instance"))
    with pytest.raises(MigError, match="no compute instance"):
        mig.prepare(POD_A, [alloc("3g.20gb", 4, 4)])
    [gi] = list(nvml.live)
    nvml.create_ci = create_ci
    nvml.busy.add(gi)
    with pytest.raises(MigError, match=f"cannot destroy GPU instance {gi}"):
        mig.prepare(POD_A, [alloc("3g.20gb", 4, 4)])
    assert [e.gpu_instance_id for e in mig.entries.values()] == [gi]
    nvml.busy.clear()
    mig.collect(set())
    assert nvml.live == {} and mig.entries == {}
