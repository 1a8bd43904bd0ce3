"""The scheduler's ledger under churn and tampering: nothing that was allocated is lost or
double-booked (adversarial review of the watch cache and the ledger)."""

from __future__ import annotations

import copy

from hami.core.codec import encode_pod_devices
from hami.core.types import ContainerDevice
from hami.scheduler.state import ClusterState

from .test_scheduler_state import CONFIG, node, pod, used

ALLOCATED = "hami.io/vgpu-devices-allocated"


def _bound(name, uuid, mem, uid=None):
    p = pod(name, "n1", uuid, mem, uid=uid)
    p["spec"]["nodeName"] = "n1"
    p["metadata"]["annotations"]["hami.io/bind-phase"] = "success"
    return p


def _edited(p, rv, **annotations):
    """``p`` as its owner rewrote it (``None`` removes an annotation)."""
    q = copy.deepcopy(p)
    q["metadata"]["resourceVersion"] = str(rv)
    ann = q["metadata"]["annotations"]
    for k, v in annotations.items():
        if v is None:
            ann.pop(k, None)
        else:
            ann[k] = v
    return q


def _grant(uuid, mem):
    return encode_pod_devices([[ContainerDevice(uuid, "NVIDIA", mem, 0)]])


def test_a_bound_pods_grant_rewritten_by_its_owner_still_counts_as_bound():
    """A running pod's owner can patch its annotations: claiming 1 MiB instead of the 800 it was
    given (or removing the grant, or moving it to another GPU or node) freed GPU memory its
    container still holds, and the next pod was placed on it (and the namespace left its quota).
    HAMi's scheduler keeps the first grant it saw for a pod; so does the ledger now."""
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1"), node("n2")])
    a = _bound("a", "n1-g0", 800)
    s.apply_pod("ADDED", a)
    assert used(s, "n1") == [800, 0] and s.ledger.namespace_usage("ns", "NVIDIA")[0] == 800
    tampered = [
        {ALLOCATED: _grant("n1-g0", 1)},  # smaller
        {ALLOCATED: _grant("n1-g1", 800)},  # another GPU
        {ALLOCATED: None},  # removed
        {ALLOCATED: "garbage"},  # unreadable
        {"hami.io/vgpu-node": "n2", ALLOCATED: _grant("n2-g0", 800)},  # another node
    ]
    for rv, change in enumerate(tampered, start=2):
        s.apply_pod("MODIFIED", _edited(a, rv, **change))
        assert used(s, "n1") == [800, 0], change
        assert used(s, "n2") == [0, 0], change
        assert s.ledger.namespace_usage("ns", "NVIDIA")[0] == 800, change
    # a relist carrying the edited copy keeps the grant too
    s.pod_handler.replace([_edited(a, 10, **{ALLOCATED: _grant("n1-g0", 1)})], "10")
    assert used(s, "n1") == [800, 0]
    # the pod's end gives it back, and a new pod of that name counts what it was given
    s.apply_pod("MODIFIED", {**_edited(a, 11), "status": {"phase": "Succeeded"}})
    assert used(s, "n1") == [0, 0]
    s.apply_pod("DELETED", _edited(a, 12))
    s.apply_pod("ADDED", _bound("a", "n1-g1", 300, uid="uid-a2"))
    assert used(s, "n1") == [0, 300]


def test_a_grant_written_before_the_bind_may_still_change():
    """HAMi's way (decision patched at Filter): a pending pod's decision is not final, a re-filter
    rewrites it; only from the bound copy on is the grant kept."""
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    a = pod("a", "n1", "n1-g0", 800)
    s.apply_pod("ADDED", a)
    s.apply_pod("MODIFIED", _edited(a, 2, **{ALLOCATED: _grant("n1-g1", 500)}))
    assert used(s, "n1") == [0, 500]
    bound = _edited(a, 3, **{ALLOCATED: _grant("n1-g1", 500)})
    bound["spec"]["nodeName"] = "n1"
    s.apply_pod("MODIFIED", bound)
    s.apply_pod("MODIFIED", _edited(bound, 4, **{ALLOCATED: _grant("n1-g1", 5)}))
    assert used(s, "n1") == [0, 500]


def test_a_relist_keeps_the_reservation_of_a_same_name_successor_newer_than_its_snapshot():
    """Pod ``a`` (UID 1) was deleted and re-created (UID 2) after a relist's snapshot; a Filter
    read the new one by GET and reserved its GPU. The list, older, still names ``a`` with UID 1:
    the relist kept the newer cached copy but dropped its reservation (the note of session 24's
    fix covered a pod the list does not name, not one it names with another UID), and the GPU
    was free for the next pod while the new ``a``'s Bind posted its decision."""
    from hami.core import pod_key, schedule_pod

    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1", gpus=1)])
    first = pod("a", "n1", "n1-g0", 300)
    first["spec"]["nodeName"] = "n1"
    first["metadata"]["resourceVersion"] = "80"
    s.apply_pod("ADDED", first)
    second = pod("a", mem=600, uid="uid-a2")
    second["metadata"]["resourceVersion"] = "120"
    s.put_pod(second)  # Filter's GET
    assert schedule_pod(second, ["n1"], s.ledger, CONFIG, 0).node == "n1"
    assert used(s, "n1") == [900]
    s.pod_handler.replace([first], "100")  # a relist as of revision 100: ``a`` is still UID 1
    assert s.pod("ns", "a") is second
    assert s.ledger.is_reserved(pod_key(second)) and used(s, "n1") == [900]
    # the deletion of UID 1, after the snapshot, comes through the watch
    s.apply_pod("DELETED", {**first, "metadata": {**first["metadata"], "resourceVersion": "110"}})
    assert used(s, "n1") == [600] and s.pod("ns", "a") is second
