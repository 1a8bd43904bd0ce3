"""The watch-fed state: level-triggered ledger, reservations, node health, quotas, options."""

from __future__ import annotations

import argparse
import time
from datetime import datetime

import pytest

from hami.core import SchedulerConfig, pod_key
from hami.core.codec import encode_node_devices_json, encode_pod_devices
from hami.core.errors import ConfigError
from hami.core.types import ContainerDevice, DeviceInfo
from hami.scheduler import options as O
from hami.scheduler.state import ClusterState, handshake_value, vendor_alive
from hami.vendors import build_vendors

CONFIG = SchedulerConfig(build_vendors())
NV = build_vendors()[0]


def node(name, gpus=2, allocatable=True, handshake=None, labels=None):
    devs = [
        DeviceInfo(id=f"{name}-g{i}", index=i, count=10, devmem=1000, devcore=100, type="NVIDIA-T4", health=True)
        for i in range(gpus)
    ]
    ann = {"hami.io/node-nvidia-register": encode_node_devices_json(devs)}
    if handshake:
        ann["hami.io/node-handshake"] = handshake
    return {
        "metadata": {"name": name, "annotations": ann, "labels": labels or {}, "resourceVersion": "1"},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus * 10) if allocatable else "0"}},
    }


def pod(name, node_name=None, uuid=None, mem=100, phase="Running", uid=None):
    ann = {}
    if node_name:
        ann = {
            "hami.io/vgpu-node": node_name,
            "hami.io/vgpu-devices-allocated": encode_pod_devices([[ContainerDevice(uuid, "NVIDIA", mem, 0)]]),
        }
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{name}",
            "annotations": ann,
            "resourceVersion": "1",
        },
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mem}}}],
        },
        "status": {"phase": phase},
    }


def used(state, name):
    return [m for _, _, m, _ in state.ledger.device_usage(name)]


def test_ledger_follows_pod_events_and_relists():
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    s.pod_handler.replace([pod("a", "n1", "n1-g0", 300)])
    assert used(s, "n1") == [300, 0]
    s.pod_handler.apply("ADDED", pod("b", "n1", "n1-g1", 200))
    s.pod_handler.apply("MODIFIED", pod("a", "n1", "n1-g0", 300, phase="Succeeded"))
    assert used(s, "n1") == [0, 200]
    s.pod_handler.replace([pod("c", "n1", "n1-g0", 50)])  # relist: b is gone
    assert used(s, "n1") == [50, 0]
    s.pod_handler.apply("DELETED", pod("c", "n1", "n1-g0", 50))
    assert used(s, "n1") == [0, 0]


def test_reservation_survives_stale_events_until_annotations_arrive():
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    from hami.core import schedule_pod

    p = pod("x")
    result = schedule_pod(p, ["n1"], s.ledger, CONFIG, 0)
    assert s.ledger.is_reserved(pod_key(p))
    s.pod_handler.apply("MODIFIED", p)  # an event from before the decision patch
    assert s.ledger.pod(pod_key(p)) is not None
    s.pod_handler.apply("MODIFIED", {**p, "metadata": {**p["metadata"], "annotations": dict(result.annotations)}})
    assert not s.ledger.is_reserved(pod_key(p)) and s.ledger.pod(pod_key(p)).node == "n1"
    s.restore_pod(pod_key(p), "ns", "x")  # cache has the annotated pod: the allocation stays
    assert s.ledger.pod(pod_key(p)) is not None


def test_node_health_follows_allocatable_and_handshake():
    now = time.time()
    fresh = handshake_value(now - 10)
    stale = handshake_value(now - 120)
    assert vendor_alive(node("a"), NV, now)
    assert vendor_alive(node("a", allocatable=False, handshake=fresh), NV, now)
    assert vendor_alive(node("a", allocatable=False, handshake="Reported 2026"), NV, now)
    assert not vendor_alive(node("a", allocatable=False, handshake=stale), NV, now)
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("up"), node("gone", allocatable=False, handshake=stale)])
    assert s.ledger.node_names() == ["up"]
    s.node_handler.apply("DELETED", node("up"))
    assert s.ledger.node_names() == []


def test_node_selector_and_bad_registration():
    s = ClusterState(CONFIG, node_selector={"gpu": "on"})
    bad = node("bad", labels={"gpu": "on"})
    bad["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "{not json"
    s.node_handler.replace([node("on", labels={"gpu": "on"}), node("off"), bad])
    assert s.ledger.node_names() == ["on"]


def test_quota_events():
    s = ClusterState(CONFIG)
    q = {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}}}
    s.quota_handler.replace([q])
    assert s.ledger.quota_room("ns", CONFIG.vendors).room["NVIDIA"] == (1000, None)
    s.quota_handler.apply("DELETED", q)
    assert s.ledger.quota_room("ns", CONFIG.vendors) is None


def _args(*argv):
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    "argv, text",
    [
        (["--node-lock-timeout", "5x"], "--node-lock-timeout"),
        (["--bind-timeout", "soon"], "--bind-timeout"),
        (["--bind-timeout", "0s"], "--bind-timeout: must be positive"),
        (["--http_bind", "nohost"], "--http_bind"),
        (["--node-label-selector", "gpu"], "--node-label-selector"),
        (["--cert_file", "/etc/hostname"], "go together"),
        (["--device-config-file", "/nonexistent.yaml"], "--device-config-file"),
        (["--node-scheduler-policy", "fastest"], "--node-scheduler-policy"),
        (["--gpu-scheduler-policy", "random"], "--gpu-scheduler-policy"),
        (["--extender-bind", "0.0.0.0:9080"], "not a loopback address"),
        (["--extender-bind", "10.0.0.5:9080"], "--extender-bind"),
        (["--extender-bind", "9080"], "--extender-bind"),
    ],
)
def test_bad_flags_name_the_flag(argv, text):
    with pytest.raises(ConfigError) as err:
        O.options_from_args(_args(*argv))
    assert text in str(err.value)


def test_bad_device_config_names_the_key(tmp_path):
    f = tmp_path / "device-config.yaml"
    f.write_text("nvidia:\n  deviceSplitCount: lots\n")
    with pytest.raises(ConfigError) as err:
        O.options_from_args(_args("--device-config-file", str(f)))
    assert "nvidia.deviceSplitCount" in str(err.value)


def test_flags_with_hami_names(monkeypatch):
    monkeypatch.setenv("HAMI_NODELOCK_EXPIRE", "2m")
    o = O.options_from_args(
        _args(
            "--http_bind=0.0.0.0:443",
            "--extender-bind=127.0.0.1:9080",
            "--node-label-selector=gpu=on,zone=a",
            "--node-lock-retry-timeout=1m30s",
            "--leader-elect",
            "--leader-elect-identity=me",
        )
    )
    assert (o.host, o.port, o.node_selector) == ("0.0.0.0", 443, {"gpu": "on", "zone": "a"})
    assert (o.node_lock_timeout, o.node_lock_retry_timeout, o.leader_elect, o.identity) == (120, 90, True, "me")
    assert O.options_from_args(_args("--node-lock-timeout=30s")).node_lock_timeout == 30
    assert O.parse_duration("250ms", "x") == 0.25
    assert O.options_from_args(_args()).bind_timeout is None
    assert O.options_from_args(_args("--bind-timeout=43s")).bind_timeout == 43


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--bind-timeout=12s"], 12),
        ([], 28),  # unset: the lock retry timeout (28s), at least 28 s
        (["--node-lock-retry-timeout=60s"], 60),  # a raised lock wait is not cut at 28 s
        (["--node-lock-retry-timeout=60s", "--bind-timeout=20s"], 20),
    ],
)
def test_the_bind_timeout_reaches_the_extender(argv, expected):
    from hami.scheduler.server import SchedulerService

    service = SchedulerService(O.options_from_args(_args(*argv)), None)
    assert service.extender.bind_timeout == expected


def test_extender_bind_takes_loopback_addresses_only():
    assert (O.options_from_args(_args()).extender_port) is None
    o = O.options_from_args(_args("--extender-bind=127.0.0.1:9080"))
    assert (o.extender_host, o.extender_port) == ("127.0.0.1", 9080)
    assert O.options_from_args(_args("--extender-bind=[::1]:9080")).extender_host == "::1"


def test_handshake_value_is_hami_local_time():
    assert handshake_value(0).startswith("Requesting_")
    datetime.strptime(handshake_value(time.time()).split("_", 1)[1], "%Y-%m-%d %H:%M:%S")


def test_stale_event_does_not_undo_a_newer_reservation():
    """A re-filter moved the pod: an old event (previous placement) must not replace it."""
    from hami.core import schedule_pod

    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1"), node("n2")])
    old = pod("m", "n1", "n1-g0", 100)
    s.pod_handler.apply("ADDED", old)
    fresh = pod("m")
    result = schedule_pod(fresh, ["n2"], s.ledger, CONFIG, 0)  # re-filter, only n2 offered
    assert result.node == "n2"
    s.pod_handler.apply("MODIFIED", old)  # a late event still showing n1
    assert s.ledger.pod(pod_key(fresh)).node == "n2" and s.ledger.is_reserved(pod_key(fresh))
    s.pod_handler.apply(
        "MODIFIED", {**fresh, "metadata": {**fresh["metadata"], "annotations": dict(result.annotations)}}
    )
    assert not s.ledger.is_reserved(pod_key(fresh)) and s.ledger.pod(pod_key(fresh)).node == "n2"


def test_cli_refuses_bad_configuration_with_one_line(tmp_path, capsys):
    from hami.cli import main

    f = tmp_path / "device-config.yaml"
    f.write_text("nvidia:\n  gpuCorePolicy: sometimes\n")
    assert main(["scheduler", "--device-config-file", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hami scheduler: ") and "nvidia.gpuCorePolicy" in err and "sometimes" in err
    assert len(err.splitlines()) == 1


def _at(p, rv, **ann):
    out = {
        **p,
        "metadata": {**p["metadata"], "resourceVersion": rv, "annotations": {**p["metadata"]["annotations"], **ann}},
    }
    return out


def test_pod_events_are_monotonic_in_resource_version():
    """A late watch event (or a put of an older read) never rolls a pod back."""
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1"), node("n2")])
    bound = _at(pod("a", "n2", "n2-g0", 300), "7", **{"hami.io/bind-phase": "allocating"})
    bound["spec"] = {**bound["spec"], "nodeName": "n2"}
    s.apply_pod("MODIFIED", bound)
    s.apply_pod("MODIFIED", _at(pod("a", "n1", "n1-g0", 300), "5"))  # stale: the older node choice
    assert s.pod("ns", "a") is bound and used(s, "n2") == [300, 0] and used(s, "n1") == [0, 0]
    s.put_pod(_at(pod("a", "n1", "n1-g0", 300), "6"))
    assert s.pod("ns", "a") is bound
    newer = _at(bound, "8", **{"hami.io/bind-phase": "success"})
    s.apply_pod("MODIFIED", newer)
    assert s.pod("ns", "a") is newer
    odd = _at(newer, "not-a-number")  # non-numeric versions are accepted, never crash
    s.apply_pod("MODIFIED", odd)
    assert s.pod("ns", "a") is odd
    s.node_handler.apply("MODIFIED", {**node("n1"), "metadata": {**node("n1")["metadata"], "resourceVersion": "x"}})
    s.put_node(node("n1"))


def test_a_delete_wins_and_a_stale_add_does_not_resurrect():
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    s.apply_pod("ADDED", _at(pod("a", "n1", "n1-g0", 300), "5"))
    s.apply_pod("DELETED", _at(pod("a", "n1", "n1-g0", 300), "9"))
    s.apply_pod("MODIFIED", _at(pod("a", "n1", "n1-g0", 300), "6"))  # late event, same UID
    s.put_pod(_at(pod("a", "n1", "n1-g0", 300), "5"))
    assert s.pod("ns", "a") is None and used(s, "n1") == [0, 0]
    s.apply_pod("ADDED", _at(pod("a", "n1", "n1-g1", 200, uid="uid-a2"), "10"))  # same name, new pod
    assert used(s, "n1") == [0, 200]


def test_tombstones_are_bounded(monkeypatch):
    from hami.scheduler import state as S

    monkeypatch.setattr(S, "TOMBSTONES", 3)
    s = ClusterState(CONFIG)
    for i in range(5):
        s.apply_pod("DELETED", _at(pod(f"p{i}"), str(i + 1)))
    assert list(s._deleted) == ["uid-p2", "uid-p3", "uid-p4"]


def test_a_relist_keeps_a_newer_cached_pod():
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1"), node("n2")])
    mine = _at(pod("a", "n2", "n2-g0", 300), "9")
    s.put_pod(mine)  # written while the list was in flight
    s.pod_handler.replace([_at(pod("a", "n1", "n1-g0", 300), "8"), _at(pod("b"), "8")])
    assert s.pod("ns", "a") is mine and used(s, "n2") == [300, 0] and s.pod("ns", "b") is not None


@pytest.mark.parametrize(
    "value",
    [
        "[" * 100_000,  # nesting deeper than the parser's stack
        '[{"id": "g0", "count": ' + "9" * 5000 + "}]",  # an integer of thousands of digits
        '[{"id": "g0", "count": NaN}]',
        '[{"id": "g0", "count": 1e400}]',
        "g0,-1,1000,100,T4,0,true:",  # legacy: negative count
        "g0,2147483648,1000,100,T4,0,true:",  # legacy: beyond int32 (HAMi refuses it too)
        "g0,١,1000,100,T4,0,true:",  # legacy: Arabic-Indic digit
        "g0,1,1_000,100,T4,0,true:",  # legacy: Python's digit separator
        "g0,1, 1000,100,T4,0,true:",
        ",1,1000,100,T4,0,true:",  # legacy: no id
    ],
)
def test_any_unreadable_registration_drops_the_nodes_gpus_with_an_event(value):
    s = ClusterState(CONFIG)
    seen = []
    s.on_malformed = lambda n, message: seen.append((n["metadata"]["name"], message))
    s.node_handler.replace([node("n1"), node("n2")])
    assert s.ledger.node_names() == ["n1", "n2"]
    broken = node("n1")
    broken["metadata"]["annotations"]["hami.io/node-nvidia-register"] = value
    s.node_handler.apply("MODIFIED", broken)
    assert s.ledger.node_names() == ["n2"]  # the stale GPUs of n1 are gone, not kept
    assert len(seen) == 1 and seen[0][0] == "n1" and "hami.io/node-nvidia-register" in seen[0][1]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda n: n["metadata"]["annotations"].update({"hami.io/node-nvidia-register": 7}),
        lambda n: n["metadata"].update({"annotations": ["x"]}),
        lambda n: n["metadata"]["annotations"].update({"hami.io/node-nvidia-score": {"a": 1}}),
        lambda n: n["metadata"]["annotations"].update({"hami.io/node-handshake": None}),
    ],
)
def test_a_node_of_the_wrong_shape_is_malformed_not_a_crash(mutate):
    s = ClusterState(CONFIG)
    seen = []
    s.on_malformed = lambda n, message: seen.append(message)
    s.node_handler.replace([node("n1")])
    broken = node("n1")
    mutate(broken)
    s.node_handler.apply("MODIFIED", broken)
    assert s.ledger.node_names() == [] and len(seen) == 1


def _rv(p, rv):
    return {**p, "metadata": {**p["metadata"], "resourceVersion": rv}}


def test_a_relist_keeps_a_reservation_for_a_pod_newer_than_its_snapshot():
    """A Filter read pod p (created after the list's snapshot, so the list does not name it) and
    reserved its GPU; the relist must not free that GPU (another pod was given it while p's Bind
    posted the decision); a pod older than the snapshot and not listed is gone, reservation and all."""
    from hami.core import schedule_pod

    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1", gpus=1)])
    p, old = _rv(pod("p", mem=600), "120"), _rv(pod("old", mem=300), "90")
    for x in (p, old):
        s.put_pod(x)
        assert schedule_pod(x, ["n1"], s.ledger, CONFIG, 0).node == "n1"
    assert used(s, "n1") == [900]
    s.pod_handler.replace([], "100")  # a relist as of revision 100
    assert s.ledger.is_reserved(pod_key(p)) and used(s, "n1") == [600]
    assert s.pod("ns", "p") is not None and s.pod("ns", "old") is None
    q = _rv(pod("q", mem=600), "130")
    s.put_pod(q)
    assert schedule_pod(q, ["n1"], s.ledger, CONFIG, 0).node is None  # 600 + 600 > 1000
    # the watch from 100 then tells p's fate: deleted, its reservation goes
    s.pod_handler.apply("DELETED", p)
    assert used(s, "n1") == [0]


def test_a_relist_without_comparable_versions_keeps_reserved_pods_only():
    from hami.core import schedule_pod

    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1", gpus=1)])
    p = pod("p", mem=600)
    s.put_pod(p)
    s.put_pod(pod("idle"))
    schedule_pod(p, ["n1"], s.ledger, CONFIG, 0)
    s.pod_handler.replace([], None)
    assert used(s, "n1") == [600] and s.pod("ns", "p") is not None and s.pod("ns", "idle") is None


def test_a_node_written_back_after_its_deletion_stays_deleted():
    """A lock PATCH's answer applied after the node's DELETED event brought it back (GPUs in the
    ledger, metrics, the UI) until the next relist; a node made again under that name counts."""
    s = ClusterState(CONFIG)
    old = node("n1")
    old["metadata"]["uid"] = "node-uid-1"
    s.node_handler.replace([old])
    s.node_handler.apply("DELETED", _rv(old, "5"))
    s.put_node(_rv(old, "4"))  # the answer of a write made before the delete
    assert "n1" not in s.nodes and not s.ledger.has_node("n1")
    new = _rv(node("n1"), "9")
    new["metadata"]["uid"] = "node-uid-2"
    s.put_node(new)  # read before the watch delivered the old node's delete ...
    s.node_handler.apply("DELETED", _rv(old, "5"))  # ... which must not remove the new node
    assert s.nodes["n1"]["metadata"]["uid"] == "node-uid-2" and used(s, "n1") == [0, 0]


def test_a_namespace_that_holds_nothing_any_more_is_forgotten():
    """Per-namespace usage and quota entries were kept forever: 50,000 CI namespaces, each with a
    GPU pod and a quota, all deleted, left 50,000 of each (31 MiB)."""
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    for i in range(3):
        ns = f"ci-{i}"
        p = pod("a", "n1", "n1-g0", 100, uid=f"u{i}")
        p["metadata"]["namespace"] = ns
        q = {"metadata": {"name": "gpu", "namespace": ns}, "spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}}}
        s.pod_handler.apply("ADDED", p)
        s.quota_handler.apply("ADDED", q)
        assert s.ledger.namespace_usage(ns, "NVIDIA")[0] == 100 and s.ledger.quota_room(ns, CONFIG.vendors)
        s.pod_handler.apply("DELETED", p)
        s.quota_handler.apply("DELETED", q)
        assert s.ledger.namespace_usage(ns, "NVIDIA") == (0, 0) and s.ledger.quota_room(ns, CONFIG.vendors) is None
    assert s.ledger._ns_used == {} and s.ledger._quota == {}


def test_a_pod_being_deleted_before_it_was_bound_holds_nothing():
    """Found by review (1 Dec): with decisionWrite filter, a pod deleted after its decision patch
    and kept by a finalizer held its GPU (and again after a restart); the API server binds no pod
    being deleted. A bound pod being deleted still holds its grant (its containers run on)."""
    s = ClusterState(CONFIG)
    s.node_handler.replace([node("n1")])
    decided = pod("a", "n1", "n1-g0", 300)  # decision annotations, no spec.nodeName
    s.pod_handler.replace([decided])
    assert used(s, "n1")[0] == 300
    going = {**decided, "metadata": {**decided["metadata"], "deletionTimestamp": "2026-12-01T03:00:00Z"}}
    s.pod_handler.apply("MODIFIED", going)
    assert used(s, "n1")[0] == 0
    s.pod_handler.replace([going])  # a restart reads the same
    assert used(s, "n1")[0] == 0
    bound = pod("b", "n1", "n1-g0", 200)
    bound["spec"]["nodeName"] = "n1"
    bound["metadata"]["deletionTimestamp"] = "2026-12-01T03:00:00Z"
    s.pod_handler.apply("ADDED", bound)
    assert used(s, "n1")[0] == 200
