"""Allocate asked again after a kubelet restart: the kubelet goes away during an Allocate (gRPC
cancels the call), never records the answer, and asks for the same container again when it
admits the pod anew. Each test failed before the fix."""

from __future__ import annotations

import asyncio

import pytest

from hami.deviceplugin import allocate as A
from hami.deviceplugin.allocator import Allocator
from hami.node.layout import HookPaths
from hami.node.settings import NodeSettings

from .test_deviceplugin_allocator import LOCK_P, LOCK_Q, FakeKube, pod_obj


class KubeletGoesAway(FakeKube):
    """Pod writes that stall (the kubelet goes away meanwhile), ``after`` or ``before`` they land."""

    def __init__(self, lock, pods) -> None:
        super().__init__(lock, pods)
        self.stall: str | None = None
        self.stalled = asyncio.Event()

    async def patch_pod_annotations(self, pod, values, labels=None):
        if self.stall == "before":
            self.stalled.set()
            await asyncio.Event().wait()
        await super().patch_pod_annotations(pod, values, labels)
        if self.stall == "after":
            self.stalled.set()
            await asyncio.Event().wait()


def allocator(kube: FakeKube, tmp_path, delay: float = 1.0) -> Allocator:
    paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))
    return Allocator(kube, NodeSettings(), paths, release_delay=delay, gpus=["GPU-1", "GPU-2"])


async def cancelled_call(kube: KubeletGoesAway, alloc: Allocator, stall: str) -> None:
    kube.stall = stall
    call = asyncio.create_task(alloc.allocate([1]))
    await kube.stalled.wait()
    call.cancel()  # what gRPC does to the handler when the kubelet's connection goes
    with pytest.raises(asyncio.CancelledError):
        await call
    kube.stall = None


def ann(kube: FakeKube, name: str) -> dict:
    return kube.pods_by_name[name]["metadata"]["annotations"]


async def test_a_lock_naming_a_finished_pod_is_not_reported_as_no_lock(tmp_path):
    kube = FakeKube(LOCK_P, [pod_obj("p", phase="success", to_allocate=";")])
    with pytest.raises(A.AllocationError) as err:
        await allocator(kube, tmp_path).allocate([1])
    msg = str(err.value)
    assert "no node lock" not in msg
    assert f"node lock naming pod ns/p, whose allocation is over ({A.BIND_PHASE}=success)" in msg


async def test_the_retry_of_an_answer_the_kubelet_lost_gets_the_same_answer(tmp_path):
    kube = KubeletGoesAway(LOCK_P, [pod_obj("p")])
    alloc = allocator(kube, tmp_path)
    await cancelled_call(kube, alloc, "after")
    assert ann(kube, "p")[A.BIND_PHASE] == "success" and ann(kube, "p")[A.TO_ALLOCATE] == ";"
    writes = len(kube.journal)
    (again,) = await alloc.allocate([1])  # the restarted kubelet admits p again
    assert again.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1" and again.cache_dir.endswith("uid-p_main")
    assert (tmp_path / again.cache_dir / "hami-grant.env").read_text() == again.grant
    assert len(kube.journal) == writes and ann(kube, "p")[A.BIND_PHASE] == "success"
    # answered once more only: a later call is not taken for the retry
    with pytest.raises(A.AllocationError, match="no candidate pod"):
        await alloc.allocate([1])


async def test_the_retry_never_takes_the_entry_of_the_pod_the_lock_moved_on_to(tmp_path):
    q = pod_obj("q", to_allocate="GPU-2,NVIDIA,2000,20:;")
    kube = KubeletGoesAway(LOCK_P, [pod_obj("p"), q])
    alloc = allocator(kube, tmp_path)
    await cancelled_call(kube, alloc, "after")
    kube.annotations[A.NODE_LOCK] = LOCK_Q  # the scheduler saw p finished and bound q here
    # p's retry or q's admission: the kubelet does not say which; neither pod's grant is touched
    with pytest.raises(A.AllocationError, match="may be either one's"):
        await alloc.allocate([1])
    assert ann(kube, "q")[A.TO_ALLOCATE] == "GPU-2,NVIDIA,2000,20:;" and ann(kube, "q")[A.BIND_PHASE] == "allocating"
    assert ann(kube, "p")[A.BIND_PHASE] == "success" and kube.annotations[A.NODE_LOCK] == LOCK_Q
    # that call was q's: the kubelet rejected q; p's retry comes and gets p's own answer
    q["status"]["phase"] = "Failed"
    (again,) = await alloc.allocate([1])
    assert again.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1" and again.cache_dir.endswith("uid-p_main")
    assert ann(kube, "q")[A.TO_ALLOCATE] == "GPU-2,NVIDIA,2000,20:;"


async def test_once_the_kubelet_rejected_the_pod_the_next_pod_is_served(tmp_path):
    kube = KubeletGoesAway(LOCK_P, [pod_obj("p"), pod_obj("q", to_allocate="GPU-2,NVIDIA,2000,20:;")])
    alloc = allocator(kube, tmp_path)
    await cancelled_call(kube, alloc, "after")
    kube.annotations[A.NODE_LOCK] = LOCK_Q
    kube.pods_by_name["p"]["status"]["phase"] = "Failed"  # the kubelet rejected p's retry
    (answer,) = await alloc.allocate([1])
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-2" and ann(kube, "q")[A.BIND_PHASE] == "success"


async def test_a_call_cancelled_before_its_write_landed_is_served_again_from_the_entry(tmp_path):
    kube = KubeletGoesAway(LOCK_P, [pod_obj("p")])
    alloc = allocator(kube, tmp_path)
    await cancelled_call(kube, alloc, "before")
    assert ann(kube, "p")[A.TO_ALLOCATE] == "GPU-1,NVIDIA,1000,10:;"
    (again,) = await alloc.allocate([1])
    assert again.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1" and ann(kube, "p")[A.BIND_PHASE] == "success"
    assert ann(kube, "p")[A.TO_ALLOCATE] == ";"


async def test_a_retry_of_one_container_of_several_gets_that_containers_answer(tmp_path):
    # the kubelet went away during the first of two containers' calls, after the write landed
    p = pod_obj("p", to_allocate="GPU-1,NVIDIA,1000,10:;GPU-2,NVIDIA,2000,20:;")
    p["spec"]["containers"].append({"name": "second", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    kube = KubeletGoesAway(LOCK_P, [p])
    alloc = allocator(kube, tmp_path)
    await cancelled_call(kube, alloc, "after")
    (first,) = await alloc.allocate([1])  # the retry for the first container
    (second,) = await alloc.allocate([1])
    assert first.cache_dir.endswith("uid-p_main") and first.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"
    assert second.cache_dir.endswith("uid-p_second") and second.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-2"
    assert ann(kube, "p")[A.BIND_PHASE] == "success"


async def test_without_a_release_delay_the_lock_outlives_a_write_the_kubelet_cut(tmp_path):
    """--lock-release-delay=0 handed the lock back before the success write: a kubelet gone
    during that write left the pod allocating with no lock, the scheduler bound the next pod
    under a new one, and the pod's retry took that pod's entry (found by review). The lock now
    goes only once the pod is marked, so the retry finds its own pod by it."""
    kube = KubeletGoesAway(LOCK_P, [pod_obj("p"), pod_obj("q", to_allocate="GPU-2,NVIDIA,2000,20:;")])
    alloc = allocator(kube, tmp_path, delay=0)
    await cancelled_call(kube, alloc, "before")
    assert kube.annotations[A.NODE_LOCK] == LOCK_P  # the scheduler binds no other pod here
    (again,) = await alloc.allocate([1])  # the restarted kubelet admits p again
    assert again.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1" and again.cache_dir.endswith("uid-p_main")
    assert ann(kube, "p")[A.BIND_PHASE] == "success" and ann(kube, "q")[A.BIND_PHASE] == "allocating"
    assert A.NODE_LOCK not in kube.annotations  # released once p was marked


async def test_a_pod_re_created_under_its_name_during_allocate_keeps_its_new_lock(tmp_path):
    """The success write of a pod force-deleted and re-created (same name) meanwhile is refused
    (422: the UID it names cannot change). The failure path then released whatever lock
    named that name: the re-created pod's, which the scheduler had just written for it (found
    by review). It goes by the value read now: a lock written since is left alone."""
    from kubernetes_asyncio.client.exceptions import ApiException

    kube = FakeKube(LOCK_P, [pod_obj("p")])
    renewed = "2026-11-22T03:00:09Z,ns,p"  # the scheduler's lock for the new pod of that name

    async def recreated(pod, values, labels=None):
        kube.annotations[A.NODE_LOCK] = renewed
        raise ApiException(status=422, reason="Unprocessable Entity")

    kube.patch_pod_annotations = recreated
    with pytest.raises(A.AllocationError, match="pod ns/p: allocation failed"):
        await allocator(kube, tmp_path, delay=0).allocate([1])
    assert kube.annotations[A.NODE_LOCK] == renewed
    assert ("release", LOCK_P, False) in kube.journal and not [j for j in kube.journal if j[0] == "release_owned"]


@pytest.mark.parametrize("delay", [0, 0.2])
async def test_a_call_cut_after_its_success_write_hands_the_lock_on_at_the_retry(tmp_path, delay):
    """With the lock released after the success write, a kubelet gone between the two left the
    lock for good (--lock-release-delay=0: HAMi's scheduler waits a lock out for 5 minutes;
    found by review). The retry that is answered again hands it on as the call would have."""
    kube = KubeletGoesAway(LOCK_P, [pod_obj("p")])
    alloc = allocator(kube, tmp_path, delay=delay)
    await cancelled_call(kube, alloc, "after")
    assert kube.annotations[A.NODE_LOCK] == LOCK_P and ann(kube, "p")[A.BIND_PHASE] == "success"
    (again,) = await alloc.allocate([1])
    assert again.cache_dir.endswith("uid-p_main")
    await asyncio.sleep(delay + 0.2)
    assert A.NODE_LOCK not in kube.annotations


async def test_a_lost_answer_handed_on_at_its_retry_leaves_another_pods_pending_release(tmp_path):
    """Between the lost call and its retry the next pod (another request) was allocated and its
    lock's removal waits for the delay: the retry's hand-on replaced that pending removal with
    its own, a compare-and-remove of a value long gone, and the next pod's finished lock stayed
    (found by review). Now the retry's goes at once and the other waits as it did."""
    q = pod_obj("q", to_allocate="GPU-2,NVIDIA,2000,20:GPU-1,NVIDIA,1000,10:;")
    q["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    kube = KubeletGoesAway(LOCK_P, [pod_obj("p"), q])
    alloc = allocator(kube, tmp_path, delay=0.5)
    await cancelled_call(kube, alloc, "after")
    kube.annotations[A.NODE_LOCK] = LOCK_Q  # the scheduler saw p finished and bound q here
    await alloc.allocate([2])  # q's admission (not p's retry: another request)
    assert alloc._deferred is not None and alloc._deferred[0] == LOCK_Q
    (again,) = await alloc.allocate([1])  # p's retry
    assert again.cache_dir.endswith("uid-p_main")
    assert alloc._deferred is not None and alloc._deferred[0] == LOCK_Q
    await asyncio.sleep(0.8)
    assert A.NODE_LOCK not in kube.annotations
