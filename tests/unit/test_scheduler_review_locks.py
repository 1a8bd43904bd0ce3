"""Node locks under churn: a lock left by a pod that is gone must not block its node for the
lock's whole expiry (adversarial review of the Bind's lock protocol)."""

from __future__ import annotations

import copy
from datetime import datetime, timezone

import pytest

from hami.kube import nodelock

from .test_scheduler_extender import FakeDecisionApi, service
from .test_scheduler_state import node, pod


def _node_locked_by_a(rv="10"):
    held = node("n1")
    held["metadata"]["resourceVersion"] = rv
    held["metadata"]["annotations"][nodelock.NODE_LOCK] = nodelock.lock_value(datetime.now(timezone.utc), "ns", "a")
    return held


def _bound_allocating(name, uid, rv):
    p = pod(name, node_name="n1", uuid="n1-g0", uid=uid)
    p["metadata"]["resourceVersion"] = rv
    p["metadata"]["annotations"]["hami.io/bind-phase"] = "allocating"
    p["spec"]["nodeName"] = "n1"
    return p


async def test_a_lock_of_a_deleted_pod_is_not_inherited_by_a_new_pod_of_that_name():
    """StatefulSet pod ``a`` bound to n1, allocating, holds n1's lock; it is deleted and re-created
    at once (same name, new UID, pending: quota or no room). The lock names only ``ns/a``: it was
    read as the new pod's, live, and every GPU pod bound to n1 waited for it (and failed) until
    the lock's 5 minute expiry. The lock was on the node before the old pod's deletion, so it
    cannot be the new pod's: it is taken over."""
    held = _node_locked_by_a()
    svc = service(held)
    ext = svc.extender
    ext.lock_retry_timeout = 0  # (no waiting: a live lock answers LockContention at once)
    old = _bound_allocating("a", "uid-a", "11")
    svc.state.apply_pod("ADDED", old)
    gone = copy.deepcopy(old)
    gone["metadata"]["resourceVersion"] = "12"
    svc.state.apply_pod("DELETED", gone)
    successor = pod("a", uid="uid-a2")  # pending, no decision
    successor["metadata"]["resourceVersion"] = "13"
    svc.state.apply_pod("ADDED", successor)
    api = FakeDecisionApi(held, [successor])
    ext.kube = api
    value = await ext.acquire_lock("n1", "ns", "b")
    assert nodelock.owned_by(value, "ns", "b")
    assert api.nodes["n1"]["metadata"]["annotations"][nodelock.NODE_LOCK] == value


@pytest.mark.parametrize("written_after_delete", [True, False])
async def test_a_lock_written_for_the_new_pod_or_of_unknown_age_stays_live(written_after_delete):
    """The new pod's own lock (written after the deletion), or a lock whose first sighting is not
    known to precede the deletion (this replica saw the deletion but not the lock's write), is live."""
    svc = service(node("n1"))
    ext = svc.extender
    ext.lock_retry_timeout = 0
    old = _bound_allocating("a", "uid-a", "11")
    svc.state.apply_pod("ADDED", old)
    gone = copy.deepcopy(old)
    gone["metadata"]["resourceVersion"] = "12"
    svc.state.apply_pod("DELETED", gone)
    successor = _bound_allocating("a", "uid-a2", "14")
    svc.state.apply_pod("ADDED", successor)
    held = _node_locked_by_a(rv="13" if written_after_delete else "")
    svc.state.put_node(held)
    ext.kube = FakeDecisionApi(held, [successor])
    with pytest.raises(nodelock.LockContention):
        await ext.acquire_lock("n1", "ns", "b")
    assert await ext.sweep_locks() == 0


async def test_a_filter_whose_pod_is_deleted_while_it_is_read_reserves_nothing():
    """Filter reads a pod the cache lacks by GET; the watch delivers the pod's deletion while the
    answer is on its way. The reservation made on the answer was dropped by nothing but a Bind
    (which need not come) or the decision's expiry (300 s): GPUs held for a pod that is gone."""
    from .test_scheduler_extender import args

    svc = service(node("n1"))
    a = pod("a", mem=600)

    class DeletedMeanwhile(FakeDecisionApi):
        async def get(self, path):
            got = await super().get(path)
            if "/pods/" in path:
                gone = copy.deepcopy(a)
                gone["metadata"]["resourceVersion"] = "2"
                svc.state.apply_pod("DELETED", gone)
            return got

    svc.extender.kube = DeletedMeanwhile(svc.state.nodes["n1"], [a])
    answer = await svc.extender.filter(args(a, ["n1"]))
    assert "was deleted" in answer["Error"] and not answer["NodeNames"]
    assert svc.state.ledger.pod("uid-a") is None
    assert [m for _, _, m, _ in svc.state.ledger.device_usage("n1")] == [0, 0]


async def test_a_bind_repeated_after_one_that_landed_writes_neither_lock_nor_binding():
    """kube-scheduler's Bind repeated for a pod the first Bind bound (its answer lost): the lock,
    held for the device plugin's Allocate, was written again with a new value (the plugin's
    release, by the value it read, then missed and the lock stayed), and a second Binding posted."""
    from .test_scheduler_extender import _decision_setup, args

    svc, api = _decision_setup("binding", "a")
    ext = svc.extender
    chosen = (await ext.filter(args(svc.state.pod("ns", "a"), ["n1", "n2"])))["NodeNames"][0]
    request = {"PodName": "a", "PodNamespace": "ns", "PodUID": "uid-a", "Node": chosen}
    assert await ext.bind(request) == {"Error": ""}
    svc.state.apply_pod("MODIFIED", api.pods["a"])  # the watch: bound, allocating
    held = api.nodes[chosen]["metadata"]["annotations"][nodelock.NODE_LOCK]
    writes = api.patches
    assert await ext.bind(request) == {"Error": ""}
    assert len(api.bindings) == 1 and api.patches == writes
    assert api.nodes[chosen]["metadata"]["annotations"][nodelock.NODE_LOCK] == held
    other = "n2" if chosen == "n1" else "n1"
    answer = await ext.bind({**request, "Node": other})
    assert f"already bound to node {chosen}" in answer["Error"] and api.patches == writes


def test_a_lock_contention_message_names_no_pod():
    """Found by review, 1 Dec: the message (a BindingFailed event in the waiting pod's namespace,
    copied into kube-scheduler's FailedScheduling) named the lock's holder, often another
    tenant's namespace and pod. It says when the lock was taken; the holder stays in ``value``."""
    exc = nodelock.LockContention("n1", "2026-12-01T07:00:00+01:00,team-b,secret-job")
    assert "team-b" not in str(exc) and "secret-job" not in str(exc)
    assert str(exc) == "node n1 is locked by another pod's device allocation since 2026-12-01T06:00:00Z"
    assert exc.value.endswith("team-b,secret-job")
    assert str(nodelock.LockContention("n1", "")) == "node n1 is locked by another pod's device allocation"
