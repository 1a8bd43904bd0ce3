"""The device plugin's watch cache of its node's pods: when a cached copy may stand in for a
fresh read of the pod the node lock names (it must provably postdate the lock)."""

from __future__ import annotations

from hami.deviceplugin.allocate import BIND_PHASE, PodCache, pod_view_from_object


def pod(name: str, rv: str, node: str = "n1", phase: str = "allocating", ns: str = "ns") -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}-{rv}",
            "resourceVersion": rv,
            "annotations": {BIND_PHASE: phase, "hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,1000,10:;"},
        },
        "spec": {
            "nodeName": node,
            "initContainers": [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            "containers": [
                {
                    "name": "main",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {}}],
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def test_a_copy_newer_than_the_node_stands_in_for_a_read():
    cache = PodCache()
    cache.replace([pod("a", "120")])
    view = cache.usable("ns", "a", "n1", node_rv="100")
    assert view is not None and view.uid == "uid-a-120" and cache.hits == 1
    assert [c.name for c in view.containers] == ["init", "main"]  # init containers first, as Allocate counts them
    assert view.containers[0].limits == {"nvidia.com/gpu": "1"} and view.containers[1].env == {"A": "1"}


def test_a_copy_that_may_predate_the_lock_is_not_used():
    cache = PodCache()
    cache.replace([pod("a", "90")])
    assert cache.usable("ns", "a", "n1", node_rv="100") is None  # the lock (node rv 100) may be newer
    assert cache.usable("ns", "a", "n1", node_rv="90") is None  # equal is not newer
    cache.apply("MODIFIED", pod("b", "x1"))
    assert cache.usable("ns", "b", "n1", node_rv="1") is None  # not a number: read instead
    assert cache.misses == 3 and cache.hits == 0


def test_only_a_pod_bound_here_and_still_allocating_is_used():
    cache = PodCache()
    cache.replace(
        [pod("other-node", "200", node="n2"), pod("unbound", "200", node=""), pod("done", "200", phase="success")]
    )
    for name in ("other-node", "unbound", "done", "missing"):
        assert cache.usable("ns", name, "n1", node_rv="100") is None


def test_events_keep_the_newest_copy_and_deletions_drop_it():
    cache = PodCache()
    cache.apply("ADDED", pod("a", "150"))
    cache.apply("MODIFIED", pod("a", "140"))  # an older event arriving late changes nothing
    assert cache.usable("ns", "a", "n1", node_rv="145").uid == "uid-a-150"
    cache.apply("DELETED", pod("a", "151"))
    assert cache.usable("ns", "a", "n1", node_rv="100") is None
    being_deleted = pod("b", "170")
    being_deleted["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    cache.apply("ADDED", being_deleted)
    assert cache.usable("ns", "b", "n1", node_rv="100") is None


def test_a_copy_from_before_the_plugins_own_write_never_stands_in_again():
    """Container 1's Allocate patched the pod (to-allocate remainder). The Binding's event,
    delivered late by a lagging watch while that patch was in flight, must not serve container
    2's Allocate with the list container 1 already took from."""
    cache = PodCache()
    cache.writing("ns", "a")  # patch sent
    cache.apply("MODIFIED", pod("a", "13"))  # the late Binding event
    assert cache.usable("ns", "a", "n1", node_rv="12") is None  # in flight: nothing stands in
    cache.written("ns", "a", "14")  # the patch landed as 14
    assert cache.usable("ns", "a", "n1", node_rv="12") is None  # 13 < 14: from before the write
    cache.replace([pod("a", "13")])  # nor a relist answered from before it
    assert cache.usable("ns", "a", "n1", node_rv="12") is None
    cache.apply("MODIFIED", pod("a", "14"))  # the write's own event
    assert cache.usable("ns", "a", "n1", node_rv="12").uid == "uid-a-14"
    cache.writing("ns", "b")
    cache.written("ns", "b", None)  # the write failed (or no version came back): fresh reads only
    cache.apply("MODIFIED", pod("b", "99"))
    assert cache.usable("ns", "b", "n1", node_rv="12") is None


def test_pod_view_from_object_matches_the_fields_allocate_uses():
    view = pod_view_from_object(pod("a", "1"))
    assert (view.namespace, view.name, view.node_name, view.phase) == ("ns", "a", "n1", "Pending")
    assert view.annotations[BIND_PHASE] == "allocating"
