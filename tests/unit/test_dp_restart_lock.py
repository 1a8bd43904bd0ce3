"""What a restarting plugin does with the node lock its predecessor left (allocator.py
Allocator.reclaim_finished_lock): only a lock whose owner can never need it again goes."""

from __future__ import annotations

from hami.deviceplugin import allocate as A

from .test_deviceplugin_allocator import DCU, LOCK_P, FakeKube, _with, allocator, pod_obj


async def test_a_lock_whose_owner_still_has_gpus_to_hand_out_is_kept_at_start(tmp_path):
    """Another vendor's plugin (HAMi's looks at its own key only) finished its part first and
    wrote success; our GPUs are still to be handed out, and Allocate finds the pod by this lock.
    The start-up check took success alone for the end and removed the lock: the scheduler could
    then give it to the next pod, whose grant the admitted pod's GPU container would have got."""
    kube = FakeKube(LOCK_P, [_with(pod_obj("p", phase="success"), **{DCU: ";"})])
    alloc = allocator(kube, 1.0, tmp_path)
    assert await alloc.reclaim_finished_lock() is False
    assert kube.annotations[A.NODE_LOCK] == LOCK_P and kube.journal == []
    (answer,) = await alloc.allocate([1])  # the kubelet's Allocate still finds its pod
    assert "uid-p" in answer.cache_dir


async def test_a_lock_whose_owner_has_another_vendors_devices_left_is_kept_at_start(tmp_path):
    """The other way round: ours are handed out and another vendor's plugin has its part to do."""
    obj = _with(pod_obj("p", phase="success", to_allocate=";"), **{DCU: "DCU-0,DCU,1000,10:;"})
    kube = FakeKube(LOCK_P, [obj])
    assert await allocator(kube, 1.0, tmp_path).reclaim_finished_lock() is False
    assert kube.annotations[A.NODE_LOCK] == LOCK_P


async def test_a_lock_whose_owner_has_nothing_left_goes_at_start(tmp_path):
    kube = FakeKube(LOCK_P, [_with(pod_obj("p", phase="success", to_allocate=";"), **{DCU: ";"})])
    assert await allocator(kube, 1.0, tmp_path).reclaim_finished_lock() is True
    assert A.NODE_LOCK not in kube.annotations
