"""Accounting review: a namespace's quota usage and the GPUs' usage over pods' and nodes' lives,
through the scheduler's watch handlers (ClusterState) and the ledger. Each test failed on the
code before its fix."""

from __future__ import annotations

import copy

from hami.config import chart_device_config
from hami.core import Ledger, node_devices_from_object, rebuild, schedule_pod
from hami.scheduler.state import ClusterState
from hami.vendors import build_vendors

from .test_scheduler_state import CONFIG, node, pod, used


def _quota(hard, name="q", ns="ns"):
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": "1"}, "spec": {"hard": hard}}


def _bound(name, uuid, mem, rv="2"):
    p = pod(name, "n1", uuid, mem)
    p["spec"]["nodeName"] = "n1"
    p["metadata"]["resourceVersion"] = rv
    return p


def _at(obj, rv, **changes):
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = str(rv)
    for k, v in changes.items():
        out[k] = v
    return out


def test_a_node_registering_again_does_not_count_its_pods_in_the_quota_twice():
    """A node writing its registration again (a GPU added, the plugin restarted) or coming back
    from unhealthy re-added its pods' usage to their namespace: a 3000 MiB pod counted 6000,
    then 9000, and 3000 stayed counted after it was deleted (a 8000 MiB quota left 2000 room,
    then none, for ever)."""
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    s.quota_handler.replace([_quota({"limits.nvidia.com/gpumem": "8000"})])
    p = _bound("a", "n1-g0", 300)
    s.pod_handler.apply("ADDED", p)
    assert s.ledger.namespace_usage("ns", "NVIDIA") == (300, 0)
    s.node_handler.apply("MODIFIED", _at(node("n1", gpus=3), 2))  # re-registered, one GPU more
    unhealthy = _at(node("n1", gpus=3, allocatable=False, handshake="Requesting_2000-01-01 00:00:00"), 3)
    s.node_handler.apply("MODIFIED", unhealthy)  # the node's devices leave the ledger ...
    assert s.ledger.node_names() == []
    s.node_handler.apply("MODIFIED", _at(node("n1", gpus=3), 4))  # ... and come back
    assert used(s, "n1") == [300, 0, 0]
    assert s.ledger.namespace_usage("ns", "NVIDIA") == (300, 0)
    assert s.ledger.quota_room("ns", CONFIG.vendors).room["NVIDIA"] == (7700, None)
    s.pod_handler.apply("DELETED", p)
    assert s.ledger.namespace_usage("ns", "NVIDIA") == (0, 0)
    assert used(s, "n1") == [0, 0, 0]


def test_the_ledger_rebuilt_with_nodes_after_pods_counts_each_pod_once():
    """Ledger.set_node itself (a node added after its pods, as a relist may order them)."""
    ledger, warnings = rebuild([], [_bound("a", "n1-g0", 300)], CONFIG.vendors)
    assert not warnings
    ledger.set_node(node_devices_from_object(node("n1"), CONFIG.vendors))
    ledger.set_node(node_devices_from_object(node("n1"), CONFIG.vendors))
    assert ledger.namespace_usage("ns", "NVIDIA") == (300, 0)
    ledger.remove_pod(ledger.pods()[0].key)
    assert ledger.namespace_usage("ns", "NVIDIA") == (0, 0)


def test_a_fractional_quota_value_keeps_the_quotas_other_limits():
    """``limits.nvidia.com/gpucores: 1500m`` (a valid quantity the API server accepts) made the
    whole ResourceQuota unreadable: its gpumem limit went too, and the namespace had no limit.
    A fraction counts as its whole part (usage is whole cores: at most 1.5 is at most 1)."""
    s = ClusterState(CONFIG)
    s.quota_handler.replace([_quota({"limits.nvidia.com/gpumem": "8000", "limits.nvidia.com/gpucores": "1500m"})])
    assert s.ledger.quota_room("ns", CONFIG.vendors).room["NVIDIA"] == (8000, 1)
    s.quota_handler.apply("MODIFIED", _quota({"limits.nvidia.com/gpumem": "2.5k", "limits.nvidia.com/gpucores": 50}))
    assert s.ledger.quota_room("ns", CONFIG.vendors).room["NVIDIA"] == (2500, 50)


def test_an_unreadable_quota_value_leaves_out_that_limit_only():
    hard = {"limits.nvidia.com/gpumem": "4000", "limits.nvidia.com/gpucores": "lots"}
    s = ClusterState(CONFIG)
    s.quota_handler.replace([_quota(hard)])
    assert s.ledger.quota_room("ns", CONFIG.vendors).room["NVIDIA"] == (4000, None)
    ledger, warnings = rebuild([], [], CONFIG.vendors, [_quota(hard)])
    assert ledger.quota_room("ns", CONFIG.vendors).room["NVIDIA"] == (4000, None)
    assert len(warnings) == 1 and "spec.hard.limits.nvidia.com/gpucores" in warnings[0], warnings


def test_a_fractional_memory_quota_is_scaled_by_the_memory_factor_before_rounding():
    """``1.5`` units of 1024 MiB are 1536 MiB (rounding the quantity first gave 1024, or nothing)."""
    vendors = build_vendors(chart_device_config())
    mlu = next(v for v in vendors if v.resources.memory_factor > 1)
    ledger = Ledger(vendors)
    ledger.set_quota("ns", "q", {f"limits.{mlu.resources.memory}": "1.5"}, vendors)
    assert ledger.quota_limits("ns", "q") == {mlu.resources.memory: 3 * mlu.resources.memory_factor // 2}


def test_a_finished_pod_releases_its_devices_even_after_its_node_annotation_was_removed():
    """A pod placed with our annotations under another scheduler's name (a batch scheduler that
    hands GPU pods to hami) whose owner removed ``hami.io/vgpu-node``: every later event of it was
    ignored, so when it Succeeded its GPU and quota stayed held until the pod object was deleted
    (a finished Job's pods are often kept for days)."""
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    p = _bound("v", "n1-g0", 300)
    p["spec"]["schedulerName"] = "volcano"
    s.pod_handler.apply("ADDED", p)
    assert s.ledger.namespace_usage("ns", "NVIDIA") == (300, 0)
    edited = _at(p, 3)
    del edited["metadata"]["annotations"]["hami.io/vgpu-node"]
    s.pod_handler.apply("MODIFIED", edited)  # running: the grant it was bound with still counts
    assert s.ledger.namespace_usage("ns", "NVIDIA") == (300, 0) and used(s, "n1") == [300, 0]
    s.pod_handler.apply("MODIFIED", _at(edited, 4, status={"phase": "Succeeded"}))
    assert s.ledger.namespace_usage("ns", "NVIDIA") == (0, 0) and used(s, "n1") == [0, 0]


def test_a_terminating_pod_holds_until_it_is_gone_and_a_finished_one_releases():
    """Reference: a pod being deleted (deletionTimestamp, grace period) still runs and holds its
    devices; Succeeded/Failed release them; a restart of the scheduler counts each once."""
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    a, b = _bound("a", "n1-g0", 300), _bound("b", "n1-g1", 200)
    s.pod_handler.replace([a, b], "5")
    going = _at(a, 6)
    going["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    s.pod_handler.apply("MODIFIED", going)
    assert used(s, "n1") == [300, 200] and s.ledger.namespace_usage("ns", "NVIDIA") == (500, 0)
    s.pod_handler.apply("MODIFIED", _at(b, 7, status={"phase": "Failed"}))
    assert used(s, "n1") == [300, 0] and s.ledger.namespace_usage("ns", "NVIDIA") == (300, 0)
    restarted = ClusterState(CONFIG)
    restarted.node_handler.replace([node("n1")])
    restarted.pod_handler.replace([going, _at(b, 7, status={"phase": "Failed"})], "8")
    assert used(restarted, "n1") == [300, 0] and restarted.ledger.namespace_usage("ns", "NVIDIA") == (300, 0)
    s.pod_handler.apply("DELETED", going)
    assert used(s, "n1") == [0, 0] and s.ledger.namespace_usage("ns", "NVIDIA") == (0, 0)


def test_a_refiltered_pod_counts_once_against_the_quota():
    """Filter twice for one pod (a failed bind): the second decision replaces the first."""
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    s.quota_handler.replace([_quota({"limits.nvidia.com/gpumem": "500"})])
    p = pod("x", mem=400)
    first = schedule_pod(p, ["n1"], s.ledger, CONFIG, 0)
    again = schedule_pod(p, ["n1"], s.ledger, CONFIG, 0)
    assert first.node == again.node == "n1"
    assert s.ledger.namespace_usage("ns", "NVIDIA") == (400, 0)
