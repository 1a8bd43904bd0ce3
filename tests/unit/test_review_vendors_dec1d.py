"""Vendor defects found by review, 1 Dec: Enflame DRS against Enflame's own gcushare device plugin,
Ascend ``overwriteEnv`` with several chips, MetaX sGPU QoS of the pods holding a device, and
namespace memory quotas of the vendors whose pods ask in GiB (MetaX sGPU, Enflame DRS)."""

from __future__ import annotations

import copy
import json
import logging

from hami.config import VnpusConfig, chart_device_config, default_vnpu_chips
from hami.core import pod_request, quota_admission_check, rebuild, schedule_pod
from hami.webhook.admission import AdmissionSettings, decide

from ._vendorkit import NOW, admit, config, ctr, node, on_node, place, pod

CFG = config()
DRS, GMEM, GCORE = "enflame.com/drs-gcu", "enflame.com/gcu-memory", "enflame.com/gcu-core"
SGPU, VMEM, VCORE = "metax-tech.com/sgpu", "metax-tech.com/vmemory", "metax-tech.com/vcore"
QOS = "metax-tech.com/sgpu-qos-policy"
SGPU_ALLOCATED = "hami.io/metax-sgpu-devices-allocated"

# ---------------------------------------------------------------- 1. Enflame DRS and the gcushare plugin

#: the registration as Enflame's gcushare device plugin writes it: index, minor and profile IDs strings
PLUGIN_CAPACITY = {
    "devices": [{"index": "0", "minor": "4", "capacity": 6}, {"index": "1", "minor": "5", "capacity": "6"}],
    "profiles": {"1g.6gb": "0", "3g.20gb": "1", "3g.24gb": "7", "6g.40gb": "2"},
}


def gcu_node(capacity: dict, name: str = "gcu") -> dict:
    return node(name, {"enflame.com/gcu-drs-capacity": json.dumps(capacity)})


def test_enflame_registration_the_gcushare_plugin_writes_is_read():
    """Found by review, 1 Dec: index/minor/profile IDs as strings (the plugin's Go struct) were
    refused ("field 'index' must be an integer") and the node's DRS GCUs dropped."""
    ledger, warnings = rebuild([gcu_node(PLUGIN_CAPACITY)], [], CFG.vendors)
    assert warnings == []
    devs = [d for d in ledger.view("gcu").devices if d.vendor == "Enflame"]
    assert [(d.id, d.index, d.count, d.custominfo["minor"]) for d in devs] == [
        ("gcu-enflame-drs-0", 0, 6, 4),
        ("gcu-enflame-drs-1", 1, 6, 5),
    ]
    assert devs[0].custominfo["profiles"] == PLUGIN_CAPACITY["profiles"]


def test_enflame_decision_annotations_are_those_the_gcushare_plugin_reads():
    """Found by review, 1 Dec: the record was written as ``enflame.com/assigned-containers``
    (the plugin reads ``assigned-containers``) with ``allocated`` a device ID (the plugin's bool)
    and a numeric profile ID, and ``gcu-assigned-id`` held the profile ID, not the GCU's index.
    Scenario: the second GCU is the only one free; a container asks 22 GiB and 10% (the 3g.24gb
    profile, ID "7", not 3g.20gb, ID "1", which has as many slices)."""
    n = gcu_node(PLUGIN_CAPACITY)
    first, r = place(
        [n], [pod("full", [ctr("a", limits={DRS: 6})]), pod("p", [ctr("w", limits={GMEM: 22, GCORE: 10})])]
    )
    assert first.annotations["hami.io/enflame-vgpu-devices-allocated"].startswith("gcu-enflame-drs-0,")
    a = r.annotations
    assert a["hami.io/enflame-vgpu-devices-allocated"].startswith("gcu-enflame-drs-1,Enflame,")
    assert "enflame.com/assigned-containers" not in a
    assert json.loads(a["assigned-containers"]) == {
        "w": {"allocated": False, "request": 3, "profileID": "7", "profileName": "3g.24gb"}
    }
    assert (a["enflame.com/gcu-assigned-id"], a["enflame.com/gcu-assigned-index"]) == ("1", "1")
    assert a["enflame.com/gcu-assigned-minor"] == "5"
    assert (a["enflame.com/gcu-request-size"], a["enflame.com/gcu-assigned"]) == ("3", "false")


def test_enflame_garbage_index_falls_back_with_a_warning_and_bad_capacity_is_refused(caplog):
    """Found by review, 1 Dec: an index that is not a number is the device's position (a minor the
    index), as HAMi reads it, with a warning naming the field and the value; a capacity that is
    not a number refuses the node's DRS GCUs, naming the field and the value."""
    cap = copy.deepcopy(PLUGIN_CAPACITY)
    cap["devices"][1] = {"index": "gcu1", "minor": "", "capacity": "6"}
    with caplog.at_level(logging.WARNING, logger="hami.vendors.enflame"):
        ledger, warnings = rebuild([gcu_node(cap)], [], CFG.vendors)
    assert warnings == []
    devs = [d for d in ledger.view("gcu").devices if d.vendor == "Enflame"]
    assert [(d.id, d.index, d.custominfo["minor"]) for d in devs] == [
        ("gcu-enflame-drs-0", 0, 4),
        ("gcu-enflame-drs-1", 1, 1),
    ]
    assert any("devices[1]: field 'index'" in m and "'gcu1'" in m for m in caplog.messages), caplog.messages
    assert not any("field 'minor'" in m for m in caplog.messages)  # empty: HAMi's default, no warning

    cap["devices"][1]["capacity"] = "six"
    _, warnings = rebuild([gcu_node(cap)], [], CFG.vendors)
    assert len(warnings) == 1 and "devices[1]: field 'capacity'" in warnings[0] and "'six'" in warnings[0]


def test_webhook_strips_a_tenants_assigned_containers():
    """Found by review, 1 Dec: a pod created with its own ``assigned-containers`` (a bigger profile
    than it is charged for) kept it: the key was not among the scheduler-owned annotations."""
    s = AdmissionSettings(CFG.vendors)
    forged = '{"w":{"allocated":false,"request":6,"profileID":"2","profileName":"6g.40gb"}}'
    d = decide(pod("p", [ctr("w", limits={DRS: 1})], {"assigned-containers": forged, "keep": "1"}), s)
    assert d.allowed, d
    assert d.pod["metadata"]["annotations"] == {"keep": "1"}
    assert d.warnings and d.warnings[0].endswith("assigned-containers")


# ---------------------------------------------------------------- 2. Ascend overwriteEnv, two chips


def test_ascend_overwrite_env_leaves_a_container_of_another_chip_alone():
    """Found by review, 1 Dec: with two chips configured (overwriteEnv on), the other chip's backend
    gave the container asking for an Ascend910B3 NPU ``ASCEND_VISIBLE_DEVICES=""`` and it started
    without its NPU. Only the container without NPUs gets it."""
    chips = [c.model_copy(update={"overwrite_env": True}) for c in default_vnpu_chips()]
    chips = [c for c in chips if c.common_word in ("Ascend910A", "Ascend910B3")]
    assert len(chips) == 2
    cfg = config(chart_device_config().model_copy(update={"vnpus": VnpusConfig(configs=chips)}))
    p = admit(
        pod(
            "p",
            [
                ctr("b3", limits={"huawei.com/Ascend910B3": 1}),
                ctr("a", limits={"huawei.com/Ascend910A": 1}),
                ctr("cpu", limits={"cpu": 1}),
            ],
        ),
        cfg,
    )
    env = {c["name"]: c.get("env") for c in p["spec"]["containers"]}
    assert env["b3"] is None and env["a"] is None
    assert env["cpu"] == [{"name": "ASCEND_VISIBLE_DEVICES", "value": ""}]


# ---------------------------------------------------------------- 3. MetaX sGPU QoS of the holders


def sgpu_node(qos: str = "") -> dict:
    dev = {
        "uuid": "sgpu-0",
        "model": "MXC500",
        "totalDevCount": 16,
        "totalCompute": 100,
        "totalVRam": 65536,
        "numa": 0,
        "healthy": True,
    }
    if qos:
        dev["qosPolicy"] = qos
    return node("sg", {"metax-tech.com/node-gpu-devices": json.dumps([dev])})


FIXED = pod("a", [ctr(limits={SGPU: 1, VMEM: 4, VCORE: 50})], {QOS: "fixed-share"})
BEST = pod("b", [ctr(limits={SGPU: 1, VMEM: 4, VCORE: 30})], {QOS: "best-effort"})


def test_metax_qos_of_a_share_placed_in_the_same_pass_binds_the_sgpu():
    """Found by review, 1 Dec: the sGPU's policy came from the registration only, so on an sGPU
    registered best-effort (or with no policy) a fixed-share vcore 50 pod and then a best-effort
    vcore 30 pod shared it. The holder's policy overrides the registration (HAMi AddResourceUsage)."""
    for registered in ("best-effort", ""):
        a, b, c = place(
            [sgpu_node(registered)],
            [FIXED, BEST, pod("c", [ctr(limits={SGPU: 1, VMEM: 4, VCORE: 20})], {QOS: "fixed-share"})],
        )
        assert a.annotations[SGPU_ALLOCATED] == "sgpu-0,Metax-SGPU,4096,50:;"
        assert b.node is None and b.reasons() == {"sg": "1/1 CardQosPolicyMismatch"}, registered
        assert c.annotations[SGPU_ALLOCATED] == "sgpu-0,Metax-SGPU,4096,20:;"  # the same policy joins


def test_metax_qos_of_a_running_holder_binds_the_sgpu():
    """Found by review, 1 Dec: after the fixed-share pod runs (re-read from its annotations, the
    registration still best-effort or unset), a best-effort share joined it."""
    held = on_node(admit(copy.deepcopy(FIXED), CFG), "sg", {SGPU_ALLOCATED: "sgpu-0,Metax-SGPU,4096,50:;"})
    for registered in ("best-effort", ""):
        b = place([sgpu_node(registered)], [BEST], placed=[held])[0]
        assert b.reasons() == {"sg": "1/1 CardQosPolicyMismatch"}, registered
    # an exclusive holder (vcore 100) sets no policy, as HAMi's AddResourceUsage: the registration decides
    whole = on_node(admit(copy.deepcopy(FIXED), CFG), "sg", {SGPU_ALLOCATED: "sgpu-0,Metax-SGPU,4096,100:;"})
    ledger, _ = rebuild([sgpu_node("best-effort")], [whole], CFG.vendors)
    assert ledger.view("sg").classes == {}


# ---------------------------------------------------------------- 4. quotas of GiB-asking vendors


def quota_paths(nodes: list[dict], hard: dict, p: dict) -> tuple[str | None, str | None]:
    """(the quota check the webhook makes, the Filter's refusal) for ``p`` under quota ``hard``."""
    ledger, warnings = rebuild(nodes, [], CFG.vendors)
    assert not warnings
    ledger.set_quota("team", "q", hard, CFG.vendors)
    admitted = admit(p, CFG)
    webhook = quota_admission_check(ledger, pod_request(admitted, CFG.vendors), CFG.vendors)
    s = AdmissionSettings(CFG.vendors)
    d = decide(copy.deepcopy(p), s, quota_room=lambda ns, vendors: ledger.quota_room(ns, vendors))
    assert d.allowed == (webhook is None), (d.message, webhook)
    r = schedule_pod(admitted, None, ledger, CFG, NOW)
    return webhook, (None if r.node else str(r.reasons()))


def test_metax_vmemory_quota_counts_gib():
    """Found by review, 1 Dec: ``limits.metax-tech.com/vmemory: 16`` (GiB, as the pods ask) was
    read as 16 MiB, so a 4 GiB pod was refused "request 4096 > remaining 16" by the webhook and
    the Filter. Both now count 16384 MiB: 4 GiB fits, 20 GiB does not."""
    n = sgpu_node()
    ok = pod("p", [ctr(limits={SGPU: 1, VMEM: 4, VCORE: 30})], ns="team")
    assert quota_paths([n], {"limits.metax-tech.com/vmemory": "16"}, ok) == (None, None)
    big = pod("p", [ctr(limits={SGPU: 1, VMEM: 20, VCORE: 30})], ns="team")
    webhook, filt = quota_paths([n], {"limits.metax-tech.com/vmemory": "16"}, big)
    assert webhook is not None and "metax-tech.com/vmemory request 20480 > remaining 16384" in webhook
    assert filt == "{'sg': '1/1 ResourceQuotaNotFit'}"


def test_enflame_gcu_memory_quota_counts_mib_as_hami_charges_it():
    """Regression review, 1 Dec: a fix made ``limits.enflame.com/gcu-memory`` count GiB, which
    made a quota written for HAMi (or our earlier release), MiB as HAMi charges a profile's memory,
    1024 times looser: ``49152`` (48 GiB) became 48 TiB. It counts MiB, and a profile beyond the
    quota is refused by the Filter while one within it fits."""
    n = gcu_node(PLUGIN_CAPACITY)
    ok = pod("p", [ctr(limits={GMEM: 8, GCORE: 10})], ns="team")
    assert quota_paths([n], {"limits.enflame.com/gcu-memory": "65536"}, ok) == (None, None)
    big = pod("p", [ctr(limits={GMEM: 18, GCORE: 10})], ns="team")  # 3g.20gb: 3 slices, 24576 MiB
    _, filt = quota_paths([n], {"limits.enflame.com/gcu-memory": "16384"}, big)
    assert filt == "{'gcu': '2/2 ResourceQuotaNotFit'}"
    ledger, _ = rebuild([n], [], CFG.vendors)
    ledger.set_quota(
        "team", "q", {"limits.enflame.com/gcu-memory": "49152", "limits.metax-tech.com/vmemory": "1.5"}, CFG.vendors
    )
    assert ledger.quota_limits("team", "q") == {"enflame.com/gcu-memory": 49152, "metax-tech.com/vmemory": 1536}
