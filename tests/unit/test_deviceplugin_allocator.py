"""The Allocate flow's handling of the node lock (allocator.py), over an in-memory API: the
handoff (--lock-release-delay > 0: the success write first, the lock left for the scheduler to
swap over, removed after the delay only while it still has the value read), the immediate
release (0: removed before the success write), and a lock naming a finished pod."""

from __future__ import annotations

import asyncio

import pytest

from hami.deviceplugin import allocate as A
from hami.node.layout import HookPaths
from hami.deviceplugin.allocator import Allocator
from hami.node.settings import NodeSettings

LOCK_P = "2026-11-22T03:00:00Z,ns,p"
LOCK_Q = "2026-11-22T03:00:01Z,ns,q"


def pod_obj(name: str, phase: str = "allocating", to_allocate: str = "GPU-1,NVIDIA,1000,10:;") -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": {
                A.BIND_PHASE: phase,
                A.TO_ALLOCATE: to_allocate,
                A.ALLOCATED: to_allocate,
                A.VGPU_NODE: "n1",
                A.BIND_TIME: "1",
            },
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"},
    }


class FakeKube:
    """The calls Allocator makes (deviceplugin/kube.py Kube), with a journal of the writes."""

    def __init__(self, lock: str | None, pods: list[dict]) -> None:
        self.node_name = "n1"
        self.annotations = {A.NODE_LOCK: lock} if lock else {}
        self.pods_by_name = {p["metadata"]["name"]: p for p in pods}
        self.journal: list[tuple] = []
        self.pods = A.PodCache()

    async def node_annotations(self):
        return dict(self.annotations), "7"

    async def lock_owner(self, namespace, name, node_rv):
        obj = self.pods_by_name.get(name)
        return (A.pod_view_from_object(obj) if obj else None), False

    async def get_pod(self, namespace, name):
        obj = self.pods_by_name.get(name)
        return A.pod_view_from_object(obj) if obj else None

    async def pods_on_node(self):
        return [A.pod_view_from_object(p) for p in self.pods_by_name.values()]

    async def patch_pod_annotations(self, pod, values, labels=None):
        self.journal.append(("pod", pod.name, dict(values), dict(labels or {})))
        ann = self.pods_by_name[pod.name]["metadata"]["annotations"]
        for k, v in values.items():
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v

    async def release_held_lock(self, value, key=A.NODE_LOCK):
        self.journal.append(("release", value, self.annotations.get(key) == value))
        if self.annotations.get(key) == value:
            del self.annotations[key]

    async def release_lock(self, pod, attempts=5):
        self.journal.append(("release_owned", pod.name if pod else None))
        held = A.parse_node_lock(self.annotations.get(A.NODE_LOCK))
        if held is not None and pod is not None and held.name == pod.name:
            del self.annotations[A.NODE_LOCK]
        return True


def allocator(kube: FakeKube, delay: float, tmp_path) -> Allocator:
    return Allocator(
        kube,
        NodeSettings(),
        HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock")),
        release_delay=delay,
        gpus=["GPU-1"],
    )


async def test_the_lock_is_left_for_a_swap_and_removed_after_the_delay(tmp_path):
    kube = FakeKube(LOCK_P, [pod_obj("p")])
    alloc = allocator(kube, 0.2, tmp_path)
    await alloc.allocate([1])
    # the success write came first, the lock is still there (for the next Bind to swap over)
    assert kube.journal[0][:2] == ("pod", "p") and kube.journal[0][2][A.BIND_PHASE] == "success"
    assert kube.journal[0][3] == {A.VGPU_NODE: "n1"}
    assert kube.annotations[A.NODE_LOCK] == LOCK_P
    await asyncio.sleep(0.4)
    assert kube.journal[-1] == ("release", LOCK_P, True) and A.NODE_LOCK not in kube.annotations
    assert alloc.deferred_stats == {"released": 1, "taken_over": 0}


async def test_allocate_writes_the_grant_file_it_mounts(tmp_path):
    import stat
    from pathlib import Path

    kube = FakeKube(LOCK_P, [pod_obj("p")])
    alloc = allocator(kube, 0, tmp_path)
    (answer,) = await alloc.allocate([1])
    (mount,) = [m for m in answer.mounts if m.container_path.endswith("/hami-grant.env")]
    grant = Path(mount.host_path)
    assert mount.read_only and grant.read_text() == answer.grant and stat.S_IMODE(grant.stat().st_mode) == 0o644
    assert grant.parent == Path(answer.cache_dir)
    assert f"CUDA_DEVICE_MEMORY_SHARED_CACHE={answer.envs['CUDA_DEVICE_MEMORY_SHARED_CACHE']}\n" in answer.grant


async def test_a_lock_swapped_over_is_never_removed_and_its_removal_is_dropped(tmp_path):
    kube = FakeKube(LOCK_P, [pod_obj("p"), pod_obj("q")])
    alloc = allocator(kube, 0.3, tmp_path)
    await alloc.allocate([1])
    kube.annotations[A.NODE_LOCK] = LOCK_Q  # the scheduler's swap for its next Bind
    await alloc.allocate([1])  # the kubelet admits q: its read shows the lock moved on
    assert alloc.deferred_stats["taken_over"] == 1
    assert kube.pods_by_name["q"]["metadata"]["annotations"][A.BIND_PHASE] == "success"
    await asyncio.sleep(0.5)
    releases = [j for j in kube.journal if j[0] == "release"]
    assert releases == [("release", LOCK_Q, True)]  # p's value was never sent; q's went after its delay


async def test_a_delayed_removal_that_finds_another_value_leaves_it(tmp_path):
    kube = FakeKube(LOCK_P, [pod_obj("p")])
    alloc = allocator(kube, 0.1, tmp_path)
    await alloc.allocate([1])
    kube.annotations[A.NODE_LOCK] = LOCK_Q  # swapped over; no Allocate came to notice it
    await asyncio.sleep(0.3)
    assert kube.annotations[A.NODE_LOCK] == LOCK_Q  # the compare-and-remove of p's value did nothing


async def test_flush_removes_a_pending_lock_at_once(tmp_path):
    kube = FakeKube(LOCK_P, [pod_obj("p")])
    alloc = allocator(kube, 30.0, tmp_path)
    await alloc.allocate([1])
    await alloc.flush()
    assert A.NODE_LOCK not in kube.annotations and alloc.deferred_stats["released"] == 1


async def test_with_no_delay_the_lock_goes_right_after_the_success_write(tmp_path):
    """Not before it: a write the kubelet cut would leave the pod allocating with no lock
    (test_dp_migrate_retry.py::test_without_a_release_delay_the_lock_outlives_a_write_the_kubelet_cut)."""
    kube = FakeKube(LOCK_P, [pod_obj("p")])
    await allocator(kube, 0, tmp_path).allocate([1])
    assert kube.journal[0][:2] == ("pod", "p") and kube.journal[0][2][A.BIND_PHASE] == "success"
    assert kube.journal[1] == ("release", LOCK_P, True)


async def test_a_lock_naming_a_finished_pod_is_not_taken_for_the_pod_being_admitted(tmp_path):
    """Inside the handoff window an Allocate for a pod bound without the lock: the finished pod
    is neither allocated again nor marked failed; the pending pod is found as HAMi does."""
    done = pod_obj("p", phase="success", to_allocate=";")
    other = pod_obj("r")
    kube = FakeKube(LOCK_P, [done, other])
    [resp] = await allocator(kube, 1.0, tmp_path).allocate([1])
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"
    assert kube.pods_by_name["p"]["metadata"]["annotations"][A.BIND_PHASE] == "success"
    assert kube.pods_by_name["r"]["metadata"]["annotations"][A.BIND_PHASE] == "success"
    assert [j[1] for j in kube.journal if j[0] == "pod"] == ["r"]
    # and with no pending pod at all, the error names the situation and touches nothing
    kube2 = FakeKube(LOCK_P, [pod_obj("p", phase="success", to_allocate=";")])
    with pytest.raises(A.AllocationError, match="no pod is waiting"):
        await allocator(kube2, 1.0, tmp_path).allocate([1])
    assert kube2.pods_by_name["p"]["metadata"]["annotations"][A.BIND_PHASE] == "success"


async def test_mig_allocate_collects_a_gone_pods_instance_before_refusing_its_placement(tmp_path):
    """operatingmode mig: the placement the scheduler chose is still held by the instance of a pod
    that is gone (the clean-up loop has not run yet): Allocate collects it, then makes the new
    instance, and writes its runtime identity next to the pod's other annotations."""
    import json

    from hami.node.mig import Checkpoint, MigManager, PodRef
    from hami.core.codec import MigAllocation

    from .test_deviceplugin_mig_topology import MemoryNvml

    nvml = MemoryNvml()
    mgr = MigManager(nvml, Checkpoint(tmp_path / "c.json"), ["GPU-1"])
    mgr.recover()
    mgr.prepare(PodRef("uid-gone", "ns", "gone"), [MigAllocation(0, 0, "GPU-1", "3g.20gb", 4, 4)])
    obj = pod_obj("p", to_allocate="GPU-1,NVIDIA,19968,43:;")
    obj["metadata"]["annotations"]["hami.io/vgpu-mig-allocations"] = json.dumps(
        [
            {
                "containerIndex": 0,
                "deviceIndex": 0,
                "gpuUUID": "GPU-1",
                "profile": "3g.20gb",
                "placement": {"start": 4, "size": 4},
            }
        ]
    )
    kube = FakeKube(LOCK_P, [obj])  # the gone pod is not on the node any more
    alloc = Allocator(
        kube,
        NodeSettings(operating_mode="mig"),
        HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock")),
        release_delay=0,
        mig=mgr,
        gpus=["GPU-1"],
    )
    [resp] = await alloc.allocate([1])
    assert [(i.gi, i.start) for i in nvml.instances("GPU-1")] == [(1, 4)] and list(mgr.entries) == ["uid-p/0/0"]
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-1" and resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "19968m"
    [written] = json.loads(kube.pods_by_name["p"]["metadata"]["annotations"]["hami.io/vgpu-mig-allocations"])
    assert (written["migUUID"], written["gpuInstanceID"], written["computeInstanceID"]) == ("MIG-1", 1, 0)


@pytest.mark.parametrize(
    "phase,gone,removed",
    [("success", False, True), ("failed", False, True), ("allocating", True, True), ("allocating", False, False)],
)
async def test_at_start_a_lock_left_by_a_killed_predecessor_for_a_finished_pod_is_removed(
    tmp_path, phase, gone, removed
):
    """A plugin killed during its --lock-release-delay leaves the finished pod's lock; its
    successor removes it at start-up, but never a lock whose pod is still being admitted."""
    # a pod is through with the lock at success only once every vendor's devices are handed out
    # (a plugin emptied its to-allocate entry): tests/unit/test_dp_restart_lock.py has the others
    done = {"to_allocate": ";"} if phase == "success" else {}
    kube = FakeKube(LOCK_P, [] if gone else [pod_obj("p", phase=phase, **done)])
    assert await allocator(kube, 1.0, tmp_path).reclaim_finished_lock() is removed
    assert (A.NODE_LOCK not in kube.annotations) is removed
    assert kube.journal == ([("release", LOCK_P, True)] if removed else [])


def _with(obj: dict, **annotations: str) -> dict:
    obj["metadata"]["annotations"].update(annotations)
    return obj


DCU = "hami.io/dcu-devices-to-allocate"


@pytest.mark.parametrize("delay", [0, 1.0])
async def test_a_pod_with_another_vendors_devices_left_keeps_its_lock_and_phase(tmp_path, delay):
    """GPUs and a Hygon DCU in one pod: with the GPUs handed out, the DCU plugin still has to
    find this pod by the node lock. It was marked success and the lock released (or left for a
    swap): the scheduler took it for the next pod, whose name the DCU plugin then read."""
    kube = FakeKube(LOCK_P, [_with(pod_obj("p"), **{DCU: "DCU-0,DCU,1000,10:;"})])
    alloc = allocator(kube, delay, tmp_path)
    await alloc.allocate([1])
    ann = kube.pods_by_name["p"]["metadata"]["annotations"]
    assert ann[A.BIND_PHASE] == "allocating" and kube.annotations[A.NODE_LOCK] == LOCK_P
    assert not [j for j in kube.journal if j[0].startswith("release")], kube.journal
    assert ann[A.TO_ALLOCATE].strip(";") == ""  # our part is done
    await alloc.flush()
    assert kube.annotations[A.NODE_LOCK] == LOCK_P


async def test_a_lock_owner_marked_success_by_another_vendor_with_gpus_left_is_the_pod_admitted(tmp_path):
    """The DCU plugin finished first and wrote success (HAMi's looks at its own key only): the
    pod named by the lock still has GPUs to hand out, so it is the one the kubelet admits."""
    p = _with(pod_obj("p", phase="success"), **{DCU: ";"})
    q = pod_obj("q")
    kube = FakeKube(LOCK_P, [p, q])
    (answer,) = await allocator(kube, 0, tmp_path).allocate([1])
    assert "uid-p" in answer.cache_dir
    assert kube.pods_by_name["p"]["metadata"]["annotations"][A.BIND_PHASE] == "success"
    assert kube.pods_by_name["q"]["metadata"]["annotations"][A.BIND_PHASE] == "allocating"


async def test_an_unexpected_failure_fails_the_pod_and_releases_the_lock(tmp_path):
    """A value of the pod's spec the grant cannot carry (a line break in
    GPU_CORE_UTILIZATION_POLICY) raised ValueError past the failure path: bind-phase stayed
    allocating and the node lock held, by any tenant's choice."""
    obj = pod_obj("p")
    obj["spec"]["containers"][0]["env"] = [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force\nX=1"}]
    kube = FakeKube(LOCK_P, [obj])
    with pytest.raises(A.AllocationError, match="line break"):
        await allocator(kube, 0, tmp_path).allocate([1])
    assert kube.pods_by_name["p"]["metadata"]["annotations"][A.BIND_PHASE] == "failed"
    assert A.NODE_LOCK not in kube.annotations


async def test_a_grant_naming_a_gpu_unhealthy_since_it_was_placed_is_refused(tmp_path):
    """A fatal XID after the pod was placed: ListAndWatch marks the GPU's IDs unhealthy, but
    Allocate granted whatever the annotation named, the failed GPU included."""
    kube = FakeKube(LOCK_P, [pod_obj("p")])
    alloc = Allocator(
        kube,
        NodeSettings(),
        HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock")),
        release_delay=0,
        gpus=["GPU-1"],
        healthy=lambda uuid: uuid != "GPU-1",
    )
    with pytest.raises(A.AllocationError, match="GPU-1, unhealthy"):
        await alloc.allocate([1])
    assert kube.pods_by_name["p"]["metadata"]["annotations"][A.BIND_PHASE] == "failed"
    assert A.NODE_LOCK not in kube.annotations
