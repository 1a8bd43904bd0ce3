"""A pod relist at an earlier resourceVersion than the watch had reached (an etcd restore)."""

from __future__ import annotations

from hami.scheduler.state import ClusterState

from .test_scheduler_state import CONFIG, node, pod, used


def at(p, rv):
    p["metadata"]["resourceVersion"] = str(rv)
    return p


def test_a_rewound_relist_replaces_the_cache():
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    s.pod_handler.replace([at(pod("a", "n1", "n1-g0", 300), 400), at(pod("b", "n1", "n1-g1", 200), 450)], "500")
    s.pod_handler.apply("ADDED", at(pod("c", "n1", "n1-g1", 100), 800))  # made after the snapshot
    s.pod_handler.apply("MODIFIED", at(pod("a", "n1", "n1-g0", 300), 900))
    s.pod_handler.apply("DELETED", at(pod("b", "n1", "n1-g1", 200), 950))
    assert used(s, "n1") == [300, 100]
    # etcd restored from the snapshot at 500: a and b exist (b with its UID), c does not
    s.pod_handler.replace([at(pod("a", "n1", "n1-g0", 300), 400), at(pod("b", "n1", "n1-g1", 200), 450)], "501")
    assert used(s, "n1") == [300, 200]  # before: c stayed for good and b's GPU looked free
    # later events count, although their versions are below those cached before the restore
    s.pod_handler.apply("MODIFIED", at(pod("a", "n1", "n1-g0", 300, phase="Succeeded"), 502))
    s.pod_handler.apply("MODIFIED", at(pod("b", "n1", "n1-g1", 250), 503))
    assert used(s, "n1") == [0, 250]


def test_an_ordinary_relist_still_keeps_a_pod_written_after_its_snapshot():
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    s.pod_handler.replace([at(pod("a", "n1", "n1-g0", 300), 400)], "500")
    s.pod_handler.apply("MODIFIED", at(pod("a", "n1", "n1-g0", 300), 600))
    s.put_pod(at(pod("w", "n1", "n1-g1", 100), 720))  # our write, after the next list's snapshot
    s.pod_handler.replace([at(pod("a", "n1", "n1-g0", 300), 600)], "700")
    assert used(s, "n1") == [300, 100]
