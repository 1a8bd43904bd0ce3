"""Migrating in place from HAMi: a node lock HAMi's scheduler took, for a pod HAMi placed.

Built from the strings HAMi's releases write; the test failed on the code before its fix."""

from __future__ import annotations

from datetime import datetime, timezone

from hami.kube import nodelock as L

# HAMi's lock value: time.Now().Format(time.RFC3339) in the scheduler's zone, namespace, pod
# (Project-HAMi/HAMi pkg/util/nodelock/nodelock.go, GenerateNodeLockKeyByPod)
HAMI_LOCK = "2026-05-01T20:00:00+08:00,ns,p"
NOW = datetime(2026, 5, 1, 12, 1, 0, tzinfo=timezone.utc)  # one minute after it was taken
GPU = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"


def _owner(to_allocate: str) -> dict:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "annotations": {
                "hami.io/vgpu-node": "n1",
                "hami.io/bind-phase": "success",
                "hami.io/vgpu-devices-to-allocate": to_allocate,
            },
        },
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Pending"},
    }


def test_a_pod_whose_only_entry_left_is_hamis_zero_padding_has_finished_with_the_lock():
    """HAMi's calcScore (pkg/scheduler/score.go, the release of pkg/device/nvidia/device.go at
    024910e1 that takes owner-named locks) padded a GPU-less container that follows a GPU one with
    a zero ``util.ContainerDevice{}``, written ``,,0,0:``. Once the GPU container is handed out the
    to-allocate value is ``;,,0,0:;``: HAMi's plugin counts the pod done (the value holds no
    ``GPU``) and so does ours (no NVIDIA entry left), but the lock logic read ``0,0`` as a device
    still to hand out: the owner never finished, and the node took no other pod until the lock
    expired (5 minutes, longer with a raised ``nodeLockExpire``)."""
    done = _owner(";,,0,0:;")
    assert L.devices_pending(done["metadata"]["annotations"]) == []
    assert L.finished(done)
    assert "finished its allocation" in (L.stale_reason(HAMI_LOCK, "n1", NOW, 300, done) or "")
    # the GPU container not handed out yet: the lock is still needed
    left = _owner(f"{GPU},NVIDIA,2000,30:;,,0,0:;")
    assert L.devices_pending(left["metadata"]["annotations"]) == ["hami.io/vgpu-devices-to-allocate"]
    assert not L.finished(left) and L.stale_reason(HAMI_LOCK, "n1", NOW, 300, left) is None
