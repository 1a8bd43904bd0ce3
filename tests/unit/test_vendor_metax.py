"""MetaX GPU (whole cards, topology node scores) and MetaX sGPU (QoS, app class, memory units)."""

from __future__ import annotations

import json
import re

import pytest

from hami.core import rebuild
from hami.core.codec import decode_pod_devices
from hami.core.errors import RequestError

from ._vendorkit import NOW, admit, config, ctr, node, one, place, pod, on_node

CFG = config()
MX_GPU = next(v for v in CFG.vendors if v.name == "Metax-GPU")

GPU = "metax-tech.com/gpu"
SGPU, VMEM, VCORE = "metax-tech.com/sgpu", "metax-tech.com/vmemory", "metax-tech.com/vcore"


def gpu_node(name: str, cards: int = 4, losses: dict | None = None, scores: dict | None = None) -> dict:
    ann = {}
    if losses is not None:
        ann["metax-tech.com/gpu.topology.losses"] = json.dumps(losses)
    if scores is not None:
        ann["metax-tech.com/gpu.topology.scores"] = json.dumps(scores)
    return node(name, ann, {GPU: cards})


def sgpu(uuid: str, qos: str = "", healthy: bool = True) -> dict:
    d = {
        "uuid": uuid,
        "bdf": "0000:0a:00.0",
        "model": "MXC500",
        "totalDevCount": 16,
        "totalCompute": 100,
        "totalVRam": 65536,
        "availableDevCount": 16,
        "availableCompute": 100,
        "availableVRam": 65536,
        "numa": 0,
        "healthy": healthy,
        "linkZone": 1,
    }
    if qos:
        d["qosPolicy"] = qos
    return d


def sgpu_node(name: str, devices: list[dict]) -> dict:
    return node(name, {"metax-tech.com/node-gpu-devices": json.dumps(devices)})


# ---------------------------------------------------------------- MetaX GPU


def test_whole_cards_exact_annotations():
    r = one([gpu_node("mx")], pod("p", [ctr(limits={GPU: 2})]))
    value = "mx-metax-0,Metax-GPU,65536,100:mx-metax-1,Metax-GPU,65536,100:;"  # IDs as HAMi's GetNodeDevices
    assert r.annotations == {
        "hami.io/vgpu-node": "mx",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/metax-gpu-devices-allocated": value,
        "hami.io/metax-gpu-devices-to-allocate": value,
    }


def test_a_card_is_never_shared():
    results = place([gpu_node("mx", cards=1)], [pod("a", [ctr(limits={GPU: 1})]), pod("b", [ctr(limits={GPU: 1})])])
    assert results[1].reasons() == {"mx": "1/1 CardTimeSlicingExhausted"}


def running_gpu_pod(node_name: str, allocated: str) -> dict:
    return on_node(
        pod("running", [ctr(limits={GPU: 1})]), node_name, {"hami.io/metax-gpu-devices-allocated": allocated}
    )


@pytest.mark.parametrize(
    "held",
    [
        "n1-metax-0,Metax-GPU,65536,100:;",  # placed by HAMi (or by this release)
        pytest.param("n1-metax-gpu-0,Metax-GPU,65536,100:;"),  # by our earlier releases
    ],
)
def test_running_pods_keep_their_cards(held):
    running = running_gpu_pod("n1", held)
    ledger, warnings = rebuild([gpu_node("n1", cards=2)], [running], CFG.vendors)
    assert not warnings
    assert [(d.id, used) for d, used, _, _ in ledger.device_usage("n1")] == [("n1-metax-0", 1), ("n1-metax-1", 0)]
    r = place([gpu_node("n1", cards=1)], [pod("new", [ctr(limits={GPU: 1})])], placed=[running])[0]
    assert r.reasons() == {"n1": "1/1 CardTimeSlicingExhausted"}  # no double booking


@pytest.mark.parametrize(
    "text,expected",
    [
        ("n1-metax-gpu-1,Metax-GPU,65536,100:;", "n1-metax-1,Metax-GPU,65536,100:;"),
        # only the card part of the ID is ours: a node name may hold anything
        (
            "a-metax-gpu-1-metax-gpu-0,Metax-GPU,65536,100:a-metax-gpu-1-metax-gpu-3,Metax-GPU,65536,100:;",
            "a-metax-gpu-1-metax-0,Metax-GPU,65536,100:a-metax-gpu-1-metax-3,Metax-GPU,65536,100:;",
        ),
        (  # containers of both spellings, an empty one between
            "n1-metax-0,Metax-GPU,65536,100:;;n1-metax-gpu-2,Metax-GPU,65536,100:;",
            "n1-metax-0,Metax-GPU,65536,100:;;n1-metax-2,Metax-GPU,65536,100:;",
        ),
        ("n1-metax-0,Metax-GPU,65536,100:;", "n1-metax-0,Metax-GPU,65536,100:;"),  # today's IDs: unchanged
    ],
)
def test_legacy_card_ids_read_as_hami_spells_them(text, expected):
    got = MX_GPU.read_allocation(decode_pod_devices(text), {"hami.io/metax-gpu-devices-allocated": text})
    assert got == decode_pod_devices(expected)


@pytest.mark.parametrize(
    "policy,winner,vendor_terms",
    [
        ("binpack", "b", {"a": 1700.0, "b": 1900.0}),  # 2000 - losses[2]
        ("spread", "b", {"a": 1950.0, "b": 1600.0}),  # 2000 - scores[2]; spread keeps the lowest
    ],
)
def test_topology_node_scores(policy, winner, vendor_terms):
    nodes = [gpu_node("a", losses={"2": 300}, scores={"2": 50}), gpu_node("b", losses={"2": 100}, scores={"2": 400})]
    r = one(nodes, pod("p", [ctr(limits={GPU: 2})], {"hami.io/node-scheduler-policy": policy}))
    assert r.node == winner
    base = r.scores["a"] - vendor_terms["a"]  # the generic node score, equal on both idle nodes
    assert r.scores == pytest.approx({n: base + t for n, t in vendor_terms.items()})


def test_bad_topology_annotation_is_reported():
    bad = node("mx", {"metax-tech.com/gpu.topology.losses": '{"two": 1}'}, {GPU: 2})
    _, warnings = rebuild([bad], [], CFG.vendors)
    assert warnings == [
        "skipping node: node mx: annotation metax-tech.com/gpu.topology.losses: "
        "entry 'two': 1 must map a card count to a number"
    ]


# ---------------------------------------------------------------- MetaX sGPU


@pytest.mark.parametrize(
    "annotations,limits,message",
    [
        ({"metax-tech.com/sgpu-app-class": "batch"}, {SGPU: 1}, "must be online or offline, got 'batch'"),
        ({"metax-tech.com/sgpu-app-class": "online"}, {SGPU: 2}, "metax-tech.com/sgpu must be 1 for a pod with"),
        (
            {"metax-tech.com/sgpu-qos-policy": "greedy"},
            {SGPU: 1},
            "must be one of best-effort, fixed-share, burst-share",
        ),
    ],
)
def test_sgpu_admission_rejects(annotations, limits, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        admit(pod("bad", [ctr(limits=limits)], annotations), CFG)


def test_sgpu_admission_defaults():
    p = admit(pod("p", [ctr(limits={SGPU: 1})]), CFG)
    assert p["metadata"]["annotations"]["metax-tech.com/sgpu-qos-policy"] == "best-effort"
    online = admit(pod("o", [ctr(limits={SGPU: 1, VCORE: 40})], {"metax-tech.com/sgpu-app-class": "online"}), CFG)
    assert online["spec"]["containers"][0]["resources"]["limits"][VCORE] == 0
    assert "metax-tech.com/sgpu-qos-policy" not in online["metadata"]["annotations"]


@pytest.mark.parametrize(
    "annotations,limits,expected",
    [
        ({}, {SGPU: 1, VMEM: 4, VCORE: 30}, "sgpu-0,Metax-SGPU,4096,30:;"),  # plain number: GiB
        ({}, {SGPU: 1, VMEM: "2Gi"}, "sgpu-0,Metax-SGPU,2048,100:;"),  # with a unit: bytes
        # vcore 100 (the default) asks for the whole sGPU: HAMi's checkDeviceQos lets it onto a device
        # of any qosPolicy (the first device here is best-effort)
        ({"metax-tech.com/sgpu-qos-policy": "fixed-share"}, {SGPU: 1, VMEM: 1}, "sgpu-0,Metax-SGPU,1024,100:;"),
        ({"metax-tech.com/sgpu-qos-policy": "burst-share"}, {SGPU: 1}, "sgpu-0,Metax-SGPU,65536,100:;"),
        ({}, {SGPU: 2, VMEM: 1, VCORE: 100}, "sgpu-0,Metax-SGPU,1024,100:sgpu-1,Metax-SGPU,1024,100:;"),
        ({}, {SGPU: 3}, "1/3 CardNotHealth, 2/3 AllocatedCardsInsufficientRequest"),
    ],
)
def test_sgpu_fit_table(annotations, limits, expected):
    n = sgpu_node("sg", [sgpu("sgpu-0", "best-effort"), sgpu("sgpu-1", "fixed-share"), sgpu("sgpu-2", healthy=False)])
    r = one([n], pod("p", [ctr(limits=limits)], annotations))
    if r.node is None:
        assert r.reasons() == {"sg": expected}
    else:
        assert r.annotations["hami.io/metax-sgpu-devices-allocated"] == expected


def test_sgpu_annotations_exact():
    n = sgpu_node("sg", [sgpu("sgpu-0")])
    r = one([n], pod("p", [ctr("a", limits={SGPU: 1, VMEM: 4, VCORE: 30}), ctr("b", limits={"cpu": 1})]))
    assert r.annotations == {
        "hami.io/vgpu-node": "sg",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/metax-sgpu-devices-allocated": "sgpu-0,Metax-SGPU,4096,30:;;",
        "hami.io/metax-sgpu-devices-to-allocate": "sgpu-0,Metax-SGPU,4096,30:;;",
        "metax-tech.com/gpu-devices-allocated": '[[{"uuid":"sgpu-0","compute":30,"vRam":4096}],[]]',
        "metax-tech.com/predicate-time": str(int(NOW) * 1_000_000_000),  # unix nanoseconds (HAMi UnixNano)
    }


@pytest.mark.parametrize("policy,winner", [("binpack", "busy"), ("spread", "idle")])
def test_sgpu_policy_neutral_score(policy, winner):
    nodes = [sgpu_node("busy", [sgpu("b-0")]), sgpu_node("idle", [sgpu("i-0")])]
    placed = pod("old", [ctr(limits={SGPU: 1})])
    placed["metadata"]["annotations"].update(
        {"hami.io/vgpu-node": "busy", "hami.io/metax-sgpu-devices-allocated": "b-0,Metax-SGPU,1024,50:;"}
    )
    r = place(
        nodes,
        [pod("p", [ctr(limits={SGPU: 1, VMEM: 1, VCORE: 10})], {"hami.io/node-scheduler-policy": policy})],
        placed=[placed],
    )[0]
    assert r.node == winner
    assert r.scores["busy"] - r.scores["idle"] == pytest.approx(5000.0, abs=20)  # 10000 x (60% - 10%) + base


def holding(name: str, node_name: str, allocated: str, annotations: dict | None = None) -> dict:
    """A running pod that holds ``allocated`` (its hami.io/metax-sgpu-devices-allocated) on ``node_name``."""
    return on_node(
        pod(name, [ctr(limits={SGPU: 1})], annotations), node_name, {"hami.io/metax-sgpu-devices-allocated": allocated}
    )


@pytest.mark.parametrize(
    "annotations,limits,expected",
    [
        # HAMi checkDeviceQos: a request for the whole sGPU (vcore 100, the default) skips the QoS
        # check, on an idle device of another policy ...
        ({}, {SGPU: 1}, "sgpu-0,Metax-SGPU,65536,100:;"),
        ({"metax-tech.com/sgpu-qos-policy": "burst-share"}, {SGPU: 1, VMEM: 4}, "sgpu-0,Metax-SGPU,4096,100:;"),
    ],
)
def test_sgpu_exclusive_request_skips_qos_check(annotations, limits, expected):
    r = one([sgpu_node("sg", [sgpu("sgpu-0", "fixed-share")])], pod("p", [ctr(limits=limits)], annotations))
    assert r.annotations["hami.io/metax-sgpu-devices-allocated"] == expected


@pytest.mark.parametrize(
    "limits,expected",
    [
        # ... and on a device in use it meets the capacity rules (here the sharer's 30% of the
        # compute), not the QoS one
        ({SGPU: 1, VMEM: 4}, "1/1 CardInsufficientCore"),
        ({SGPU: 1, VMEM: 4, VCORE: 20}, "1/1 CardQosPolicyMismatch"),  # a share still checks the policy
    ],
)
def test_sgpu_qos_on_a_device_in_use(limits, expected):
    sharer = holding("old", "sg", "sgpu-0,Metax-SGPU,4096,30:;", {"metax-tech.com/sgpu-qos-policy": "best-effort"})
    r = place(
        [sgpu_node("sg", [sgpu("sgpu-0", "best-effort")])],
        [pod("p", [ctr(limits=limits)], {"metax-tech.com/sgpu-qos-policy": "fixed-share"})],
        placed=[sharer],
    )[0]
    assert r.reasons() == {"sg": expected}


def test_sgpu_predicate_time_is_unix_nanoseconds():
    r = one([sgpu_node("sg", [sgpu("sgpu-0")])], pod("p", [ctr(limits={SGPU: 1, VMEM: 4, VCORE: 30})]))
    assert r.annotations["metax-tech.com/predicate-time"] == str(int(NOW) * 1_000_000_000)  # HAMi: UnixNano


def test_sgpu_idle_device_takes_any_qos():
    # HAMi checkDeviceQos: a device nobody uses (Used == 0) switches to any policy
    r = one(
        [sgpu_node("sg", [sgpu("sgpu-0", "fixed-share")])],
        pod("be", [ctr(limits={SGPU: 1, VMEM: 4, VCORE: 30})]),  # best-effort by admission
    )
    assert r.annotations["hami.io/metax-sgpu-devices-allocated"] == "sgpu-0,Metax-SGPU,4096,30:;"


def test_health_rules():
    from hami.vendors import MetaxGpuVendor, MetaxSgpuVendor

    gpu, sg = MetaxGpuVendor(), MetaxSgpuVendor()
    assert gpu.check_health(gpu_node("mx", cards=2), None, None).healthy
    assert not gpu.check_health(gpu_node("mx", cards=0), None, None).healthy
    assert sg.check_health(sgpu_node("sg", [sgpu("a")]), None, None).healthy
    assert not sg.check_health(sgpu_node("sg", []), None, None).healthy
    assert not sg.check_health(node("sg", {"metax-tech.com/node-gpu-devices": "{"}), None, None).healthy


APP = "metax-tech.com/sgpu-app-class"
SHARE = {SGPU: 1, VMEM: 4, VCORE: 20}


@pytest.mark.parametrize(
    "held_by,asks,expected",
    [
        # HAMi checkAppClass (pkg/device/metax/sdevice.go): on a device in use, pods with an app class
        # and pods without one do not share ...
        (None, None, "sgpu-0,Metax-SGPU,4096,20:;"),
        (None, "online", "1/1 CardAppClassMismatch"),
        (None, "offline", "1/1 CardAppClassMismatch"),
        ("online", None, "1/1 CardAppClassMismatch"),
        ("offline", None, "1/1 CardAppClassMismatch"),
        # ... online and offline pods do, except an offline pod joining an online one
        ("online", "online", "sgpu-0,Metax-SGPU,4096,0:;"),  # online pods take no compute share
        ("offline", "offline", "sgpu-0,Metax-SGPU,4096,20:;"),
        ("offline", "online", "sgpu-0,Metax-SGPU,4096,0:;"),
        ("online", "offline", "1/1 CardAppClassMismatch"),
    ],
)
def test_sgpu_app_classes_keep_pods_apart(held_by, asks, expected):
    sharer = holding("old", "sg", "sgpu-0,Metax-SGPU,4096,30:;", {APP: held_by} if held_by else {})
    r = place(
        [sgpu_node("sg", [sgpu("sgpu-0")])],
        [pod("p", [ctr(limits=SHARE)], {APP: asks} if asks else {})],
        placed=[sharer],
    )[0]
    got = r.annotations["hami.io/metax-sgpu-devices-allocated"] if r.node else r.reasons()["sg"]
    assert got == expected


@pytest.mark.parametrize("asks", [None, "online", "offline"])
def test_sgpu_idle_device_takes_any_app_class(asks):
    r = one([sgpu_node("sg", [sgpu("sgpu-0")])], pod("p", [ctr(limits=SHARE)], {APP: asks} if asks else {}))
    assert r.node == "sg"


def test_sgpu_app_class_of_a_decision_and_of_each_holder_is_counted():
    """The ledger records the app class of each pod holding a device: of a decision it reserves
    (the next pod is judged against it), and of every holder (one online pod among offline ones
    still closes the device to offline pods; its end opens it again)."""
    n = sgpu_node("sg", [sgpu("sgpu-0"), sgpu("sgpu-1")])
    online = pod("on", [ctr(limits=SHARE)], {APP: "online"})
    plain, offline = pod("plain", [ctr(limits=SHARE)]), pod("off", [ctr(limits=SHARE)], {APP: "offline"})
    first, second, third = place([n], [online, plain, offline])
    held = {r.annotations["hami.io/metax-sgpu-devices-allocated"].split(",")[0] for r in (first, second)}
    assert held == {"sgpu-0", "sgpu-1"}  # the plain pod does not join the online one
    assert third.reasons() == {"sg": "2/2 CardAppClassMismatch"}

    holders = [
        holding("a", "sg", "sgpu-0,Metax-SGPU,4096,10:;", {APP: "offline"}),
        holding("b", "sg", "sgpu-0,Metax-SGPU,4096,0:;", {APP: "online"}),
    ]
    one_gpu = sgpu_node("sg", [sgpu("sgpu-0")])
    ledger, warnings = rebuild([one_gpu], holders, CFG.vendors)
    assert not warnings
    assert ledger.view("sg").classes == {0: {"offline": 1, "online": 1}}
    from hami.core import schedule_pod

    r = schedule_pod(admit(pod("off2", [ctr(limits=SHARE)], {APP: "offline"}), CFG), None, ledger, CFG, NOW)
    assert r.reasons() == {"sg": "1/1 CardAppClassMismatch"}
    ledger.remove_pod("uid-b")
    r = schedule_pod(admit(pod("off3", [ctr(limits=SHARE)], {APP: "offline"}), CFG), None, ledger, CFG, NOW)
    assert r.annotations["hami.io/metax-sgpu-devices-allocated"] == "sgpu-0,Metax-SGPU,4096,20:;"
    # off3 was admitted (QoS best-effort by default) and runs a share: its policy is recorded too
    assert ledger.view("sg").classes == {0: {"offline": 2, "qos:best-effort": 1}}


def test_sgpu_app_class_follows_pod_events():
    """The scheduler's watch-fed ledger records a holder's app class, and an edit of it on a
    running pod (same devices) reaches the ledger (HAMi's pod cache keeps the updated pod)."""
    from hami.scheduler.state import ClusterState

    s = ClusterState(CFG)
    s.node_handler.replace([sgpu_node("sg", [sgpu("sgpu-0")])])
    holder = holding("old", "sg", "sgpu-0,Metax-SGPU,4096,30:;", {APP: "offline"})
    holder["metadata"]["resourceVersion"] = "1"
    s.pod_handler.replace([holder])
    assert s.ledger.view("sg").classes == {0: {"offline": 1}}
    edited = json.loads(json.dumps(holder))
    edited["metadata"]["annotations"][APP] = "online"
    edited["metadata"]["resourceVersion"] = "2"
    s.pod_handler.apply("MODIFIED", edited)
    assert s.ledger.view("sg").classes == {0: {"online": 1}}
    s.pod_handler.apply("DELETED", edited)
    assert s.ledger.view("sg").classes == {}
