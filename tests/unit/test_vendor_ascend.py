"""Ascend: admission (templates, 910C pairs, hami-core), fit reasons, NetworkID, exact annotations."""

from __future__ import annotations

import json
import re

import pytest

from hami.config import VnpusConfig, chart_device_config, default_vnpu_chips
from hami.core.errors import RequestError

from ._vendorkit import NOW, admit, config, ctr, node, one, place, pod

CFG = config()
B3 = "huawei.com/Ascend910B3"
B3MEM = "huawei.com/Ascend910B3-memory"
B3CORE = "huawei.com/Ascend910B3-core"


def npu(i: int, cw: str = "Ascend910B3", mem: int = 65536, net: int | None = None, health: bool = True) -> dict:
    d = {"id": f"{cw}-npu-{i}", "index": i, "count": 4, "devmem": mem, "devcore": 20, "type": cw, "health": health}
    if net is not None:
        d["custominfo"] = {"NetworkID": net}
    return d


def ascend_node(name: str, devices: list[dict], cw: str = "Ascend910B3", soft: bool = False) -> dict:
    ann = {
        f"hami.io/node-register-{cw}": json.dumps(devices),
        f"hami.io/node-handshake-{cw}": "Requesting_2026-11-21 22:00:00",
    }
    if soft:
        ann["hami-vnpu-core"] = "true"
    return node(name, ann)


def limits_of(p: dict) -> dict:
    return p["spec"]["containers"][0]["resources"]["limits"]


# ---------------------------------------------------------------- admission


@pytest.mark.parametrize(
    "cw,asked,snapped",
    [
        ("Ascend910B3", 3000, 16384),  # smallest template >= request
        ("Ascend910B3", 16385, 32768),
        ("Ascend910B3", 40000, 65536),  # above every template, within capacity: the whole card
        ("Ascend910A", 2000, 2184),
        ("Ascend310P", 22000, 21527),  # whole 310P card is memoryAllocatable, not capacity
        ("Ascend910B4", 12000, 16384),
        ("Ascend910B4-1", 30000, 32768),  # 910B4-1 has its own (larger) templates, not 910B4's
        ("Ascend910B4", 30000, 32768),
    ],
)
def test_memory_is_snapped_to_a_template_in_limits_and_requests(cw, asked, snapped):
    p = admit(pod("p", [ctr(limits={f"huawei.com/{cw}": 1, f"huawei.com/{cw}-memory": asked})]), CFG)
    res = p["spec"]["containers"][0]["resources"]
    assert res["limits"][f"huawei.com/{cw}-memory"] == snapped
    assert res["requests"][f"huawei.com/{cw}-memory"] == snapped


def test_no_memory_means_the_whole_card():
    p = admit(pod("p", [ctr(limits={B3: 2})]), CFG)
    assert limits_of(p)[B3MEM] == 65536


@pytest.mark.parametrize(
    "limits,annotations,message",
    [
        ({B3: 1, B3MEM: 70000}, {}, "huawei.com/Ascend910B3-memory 70000 is invalid"),
        ({B3: 2, B3MEM: 3000}, {}, "cannot span 2 devices"),
        (
            {B3: 1, B3CORE: 30},
            {},
            "huawei.com/Ascend910B3-core needs the pod annotation huawei.com/vnpu-mode: hami-core",
        ),
        ({B3: 0}, {}, "huawei.com/Ascend910B3 must be a positive integer, got 0"),
        (
            {"huawei.com/Ascend910C": 3},
            {},
            "huawei.com/Ascend910C must be 1 or an even number on Ascend910C (superPod), got 3",
        ),
        (  # was "cannot span 2 devices" for a request of 1
            {"huawei.com/Ascend910C": 1, "huawei.com/Ascend910C-memory": 16000},
            {},
            "huawei.com/Ascend910C-memory 16384 asks for a vNPU, but Ascend910C (superPod) is taken by whole "
            "modules of 2 NPUs (a request of 1 is 2)",
        ),
    ],
)
def test_admission_rejects(limits, annotations, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        admit(pod("bad", [ctr(limits=limits)], annotations), CFG)


def test_910c_single_npu_is_admitted_as_one_module():
    p = admit(pod("p", [ctr(limits={"huawei.com/Ascend910C": 1}, requests={"huawei.com/Ascend910C": 1})]), CFG)
    res = p["spec"]["containers"][0]["resources"]
    assert res["limits"]["huawei.com/Ascend910C"] == 2 and res["requests"]["huawei.com/Ascend910C"] == 2


def test_hami_core_keeps_raw_memory_and_runtime_class_and_overwrite_env():
    chips = [
        c.model_copy(update={"runtime_class_name": "ascend", "overwrite_env": True})
        for c in default_vnpu_chips()
        if c.common_word == "Ascend910B3"
    ]
    cfg = config(chart_device_config().model_copy(update={"vnpus": VnpusConfig(configs=chips)}))
    p = admit(
        pod(
            "p",
            [ctr(limits={B3: 1, B3MEM: 3000, B3CORE: 30}), ctr("side", limits={"cpu": 1})],
            {"huawei.com/vnpu-mode": "hami-core"},
        ),
        cfg,
    )
    assert limits_of(p)[B3MEM] == 3000
    assert p["spec"]["runtimeClassName"] == "ascend"
    assert p["spec"]["containers"][1]["env"] == [{"name": "ASCEND_VISIBLE_DEVICES", "value": ""}]


# ---------------------------------------------------------------- fit and annotations


def test_vnpu_annotations_exact():
    n = ascend_node("npu-1", [npu(0), npu(1)])
    r = one([n], pod("infer", [ctr(limits={B3: 1, B3MEM: 3000})]))
    assert r.node == "npu-1"
    assert r.annotations == {
        "hami.io/vgpu-node": "npu-1",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/Ascend910B3-devices-allocated": "Ascend910B3-npu-0,Ascend910B3,16384,0:;",
        "hami.io/Ascend910B3-devices-to-allocate": "Ascend910B3-npu-0,Ascend910B3,16384,0:;",
        "predicate-time": str(int(NOW)),
        "huawei.com/Ascend910B3": '[{"UUID":"Ascend910B3-npu-0","temp":"vir05_1c_16g"}]',
    }


def test_hami_core_annotation_carries_memory_and_core():
    n = ascend_node("npu-soft", [npu(0)], soft=True)
    r = one([n], pod("soft", [ctr(limits={B3: 1, B3MEM: 3000, B3CORE: 30})], {"huawei.com/vnpu-mode": "hami-core"}))
    assert r.annotations["hami.io/Ascend910B3-devices-allocated"] == "Ascend910B3-npu-0,Ascend910B3,3000,30:;"
    assert r.annotations["huawei.com/Ascend910B3"] == '[{"UUID":"Ascend910B3-npu-0","memory":3000,"core":30}]'


def test_hami_core_anywhere_when_globally_enabled():
    cfg = config(chart_device_config().model_copy(update={"vnpus": VnpusConfig(hamiVnpuCore=True)}))
    r = one(
        [ascend_node("n", [npu(0)])],
        pod("soft", [ctr(limits={B3: 1, B3MEM: 3000, B3CORE: 30})], {"huawei.com/vnpu-mode": "hami-core"}),
        cfg,
    )
    assert r.node == "n"


def test_the_nodes_hami_vnpu_core_annotation_overrides_the_global_flag():
    """HAMi (pkg/device/ascend TestVNPUModeConfig): the node's ``hami-vnpu-core`` decides, the
    global ``vnpus.hamiVnpuCore`` only when the node has none. The Ascend device plugin writes
    ``"true"`` or ``"false"`` on every registration (internal/server/register.go registerHAMi)."""
    soft_pod = pod("soft", [ctr(limits={B3: 1, B3MEM: 3000, B3CORE: 30})], {"huawei.com/vnpu-mode": "hami-core"})
    for everywhere in (False, True):
        cfg = config(chart_device_config().model_copy(update={"vnpus": VnpusConfig(hamiVnpuCore=everywhere)}))
        for value, soft in (("true", True), ("false", False), ("TRUE", True), (None, everywhere)):
            n = ascend_node("n", [npu(0), npu(1)])
            if value is not None:
                n["metadata"]["annotations"]["hami-vnpu-core"] = value
            case = f"hamiVnpuCore={everywhere}, hami-vnpu-core={value!r}"
            r = one([n], soft_pod, cfg)
            if soft:
                assert r.node == "n", case
            else:
                assert r.node is None and r.reasons() == {"n": "2/2 ModeNotFit"}, case
            vendor = next(v for v in cfg.vendors if v.name == "Ascend910B3")
            assert {d.mode for d in vendor.node_devices(n)} == {"hami-core" if soft else ""}, case


@pytest.mark.parametrize(
    "name,nodes,p,reason",
    [
        (
            "soft pod on a node without hami-vnpu-core",
            [ascend_node("n", [npu(0), npu(1)])],
            pod("s", [ctr(limits={B3: 1, B3MEM: 3000, B3CORE: 30})], {"huawei.com/vnpu-mode": "hami-core"}),
            "2/2 ModeNotFit",
        ),
        (
            "uuid pinned to a missing device",
            [ascend_node("n", [npu(0), npu(1)])],
            pod("u", [ctr(limits={B3: 1})], {"hami.io/use-Ascend910B3-uuid": "Ascend910B3-npu-9"}),
            "2/2 CardUuidMismatch",
        ),
        (
            "unhealthy and excluded",
            [ascend_node("n", [npu(0, health=False), npu(1)])],
            pod("u", [ctr(limits={B3: 1})], {"hami.io/no-use-Ascend910B3-uuid": "Ascend910B3-npu-1"}),
            "1/2 CardNotHealth, 1/2 CardUuidMismatch",
        ),
        (
            "more NPUs than the node has",
            [ascend_node("n", [npu(0), npu(1)])],
            pod("big", [ctr(limits={B3: 4})]),
            "NodeInsufficientDevice",
        ),
        (
            "910B4 pod never lands on 910B4-1 devices",
            [ascend_node("n", [npu(0, "Ascend910B4-1")], cw="Ascend910B4-1")],
            pod("b4", [ctr(limits={"huawei.com/Ascend910B4": 1})]),
            "NodeInsufficientDevice",
        ),
    ],
)
def test_misfits(name, nodes, p, reason):
    r = one(nodes, p)
    assert r.node is None, name
    assert r.reasons() == {nodes[0]["metadata"]["name"]: reason}, name


def test_memory_runs_out_after_four_vnpus_of_16g():
    n = ascend_node("n", [npu(0)])
    pods = [pod(f"p{i}", [ctr(limits={B3: 1, B3MEM: 16384})]) for i in range(5)]
    results = place([n], pods)
    assert [r.node for r in results] == ["n"] * 4 + [None]
    assert results[4].reasons() == {"n": "1/1 CardTimeSlicingExhausted"}


def test_memory_check_when_slots_remain():
    n = ascend_node("n", [dict(npu(0), count=10)])
    results = place([n], [pod("a", [ctr(limits={B3: 1, B3MEM: 32768})]), pod("b", [ctr(limits={B3: 1, B3MEM: 40000})])])
    assert results[0].node == "n" and results[1].node is None
    assert results[1].reasons() == {"n": "1/1 CardInsufficientMemory"}


def test_network_id_groups_are_preferred_for_multi_npu():
    n = ascend_node("n", [npu(0, net=1), npu(1, net=2), npu(2, net=3), npu(3, net=2)])
    r = one([n], pod("train", [ctr(limits={B3: 2})]))
    assert (
        r.annotations["hami.io/Ascend910B3-devices-allocated"]
        == "Ascend910B3-npu-1,Ascend910B3,65536,0:Ascend910B3-npu-3,Ascend910B3,65536,0:;"
    )
    assert r.annotations["huawei.com/Ascend910B3"] == '[{"UUID":"Ascend910B3-npu-1"},{"UUID":"Ascend910B3-npu-3"}]'


def test_node_score_prefers_the_node_where_the_npus_share_a_network():
    split = ascend_node("a-split", [npu(0, net=1), npu(1, net=2)])
    joined = ascend_node("b-joined", [npu(0, net=7), npu(1, net=7)])
    r = one([split, joined], pod("train", [ctr(limits={B3: 2})]))
    assert r.node == "b-joined"
    assert r.scores["b-joined"] - r.scores["a-split"] == pytest.approx(5.0)  # 10 x (2/2 - 1/2)


def test_910c_takes_whole_modules_only():
    cw = "Ascend910C"
    devs = [npu(i, cw, net=1) for i in range(4)]
    devs[1]["health"] = False  # module 0 is broken: NPUs 2 and 3 form the only whole module
    r = one([ascend_node("sp", devs, cw)], pod("m", [ctr(limits={"huawei.com/Ascend910C": 1})]))
    assert (
        r.annotations["hami.io/Ascend910C-devices-allocated"]
        == "Ascend910C-npu-2,Ascend910C,65536,0:Ascend910C-npu-3,Ascend910C,65536,0:;"
    )
    devs[3]["health"] = False
    r = one([ascend_node("sp", devs, cw)], pod("m", [ctr(limits={"huawei.com/Ascend910C": 2})]))
    assert r.reasons() == {"sp": "2/4 AllocatedCardsInsufficientRequest, 2/4 CardNotHealth"}


def test_hami_core_without_cores_keeps_raw_memory_end_to_end():
    n = ascend_node("npu-soft", [npu(0)], soft=True)
    p = pod("soft", [ctr(limits={B3: 1, B3MEM: 3000})], {"huawei.com/vnpu-mode": "hami-core"})
    assert limits_of(admit(p, CFG))[B3CORE] == 0
    r = one([n], p)
    assert r.annotations["hami.io/Ascend910B3-devices-allocated"] == "Ascend910B3-npu-0,Ascend910B3,3000,0:;"
    assert r.annotations["huawei.com/Ascend910B3"] == '[{"UUID":"Ascend910B3-npu-0","memory":3000}]'


def test_hami_core_containers_start_the_limiter_unless_they_have_a_post_start():
    p = pod(
        "soft",
        [ctr(limits={B3: 1, B3MEM: 3000}), ctr("own", limits={B3: 1, B3MEM: 3000})],
        {"huawei.com/vnpu-mode": "hami-core"},
    )
    p["spec"]["containers"][1]["lifecycle"] = {"postStart": {"exec": {"command": ["true"]}}}
    first, second = admit(p, CFG)["spec"]["containers"]
    assert first["lifecycle"]["postStart"]["exec"]["command"] == [
        "sh",
        "-c",
        "RUST_LOG=info /hami-vnpu-core/limiter > /tmp/limiter_manager.log 2>&1 &",
    ]
    assert second["lifecycle"]["postStart"]["exec"]["command"] == ["true"]
    hard = admit(pod("hard", [ctr(limits={B3: 1, B3MEM: 3000})]), CFG)
    assert "lifecycle" not in hard["spec"]["containers"][0]
