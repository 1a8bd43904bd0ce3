"""The admission rules (§3.2-§3.3 plus the security denials) and the JSON patch, table-driven."""

from __future__ import annotations

import base64
import copy
import json

from dataclasses import replace

import pytest

from hami.config import device_config_from_dict
from hami.core.fit import QuotaRoom
from hami.vendors import build_vendors
from hami.webhook.admission import AdmissionSettings, decide, json_patch, review

S = AdmissionSettings(build_vendors())


def pod(
    limits=None,
    scheduler=None,
    annotations=None,
    labels=None,
    env=None,
    privileged=False,
    node=None,
    init=None,
    ns="team",
):
    c = {"name": "main", "image": "busybox", "resources": {"limits": dict(limits or {})}}
    if env:
        c["env"] = env
    if privileged:
        c["securityContext"] = {"privileged": True}
    spec = {"containers": [c]}
    if scheduler:
        spec["schedulerName"] = scheduler
    if node:
        spec["nodeName"] = node
    if init:
        spec["initContainers"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": ns, "annotations": annotations or {}, "labels": labels or {}},
        "spec": spec,
    }


GPU = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}
OFF = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]


@pytest.mark.parametrize(
    "case, p, labels, text",
    [
        ("no containers", {"metadata": {"name": "p"}, "spec": {"containers": []}}, None, "pod has no containers"),
        ("disable control", pod(GPU, env=OFF), {}, "CUDA_DISABLE_CONTROL"),
        (
            "disable control, label false",
            pod(GPU, env=OFF),
            {"hami.io/allow-disable-control": "false"},
            "CUDA_DISABLE_CONTROL",
        ),
        ("disable control in an init container", pod(GPU, init=[{"name": "i", "env": OFF}]), {}, "'i'"),
        ("privileged", pod(GPU, privileged=True), None, "privileged"),
        ("node assigned", pod(GPU, node="n1"), None, "pod has node assigned"),
        ("bad percentage", pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 150}), None, "0..100"),
        ("negative memory", pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": -1}), None, "must not be negative"),
    ],
)
def test_denials(case, p, labels, text):
    d = decide(p, S, labels)
    assert not d.allowed and text in d.message, (case, d)


@pytest.mark.parametrize(
    "case, p, removed",
    [
        (
            "allocation",
            pod(GPU, annotations={"hami.io/vgpu-devices-allocated": "x", "keep": "1"}),
            "hami.io/vgpu-devices-allocated",
        ),
        ("to-allocate", pod(annotations={"hami.io/vgpu-devices-to-allocate": "x"}), "hami.io/vgpu-devices-to-allocate"),
        ("node", pod(GPU, annotations={"hami.io/vgpu-node": "n1"}), "hami.io/vgpu-node"),
        ("bind phase", pod(GPU, annotations={"hami.io/bind-phase": "success"}), "hami.io/bind-phase"),
        ("label", pod(GPU, labels={"hami.io/vgpu-node": "n1", "app": "x"}), "label hami.io/vgpu-node"),
        ("another scheduler", pod(scheduler="volcano", annotations={"hami.io/vgpu-time": "1"}), "hami.io/vgpu-time"),
    ],
)
def test_internal_annotations_are_removed_and_the_pod_placed_afresh(case, p, removed):
    """A copy of a placed pod (kubectl debug --copy-to, a re-applied get -o yaml) carries another
    pod's decision: it was refused (403), which HAMi does not do; now the keys are removed by the
    patch, with a warning naming them, and nothing else of the pod's metadata changes."""
    d = decide(p, S)
    assert d.allowed, (case, d)
    meta = d.pod["metadata"]
    assert not [k for k in meta.get("annotations", {}) if k.startswith("hami.io/")], case
    assert "hami.io/vgpu-node" not in meta.get("labels", {}), case
    assert {k: v for k, v in p["metadata"]["annotations"].items() if not k.startswith("hami.io/")} == meta.get(
        "annotations", {}
    )
    assert {k: v for k, v in p["metadata"]["labels"].items() if not k.startswith("hami.io/")} == meta.get("labels", {})
    assert len(d.warnings) == 1 and removed in d.warnings[0], d.warnings


def test_the_answer_patches_the_internal_keys_out_and_warns():
    p = pod(GPU, annotations={"hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1,1:;", "keep": "1"})
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "operation": "CREATE", "namespace": "ns", "kind": {"kind": "Pod"}, "object": p},
    }
    resp = review(body, S)["response"]
    assert resp["allowed"] is True
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert {"op": "remove", "path": "/metadata/annotations/hami.io~1vgpu-devices-allocated"} in ops, ops
    assert not any(o["path"] == "/metadata/annotations/keep" for o in ops)
    assert resp["warnings"] == [
        "hami: removed the internal annotations only hami scheduler writes (the pod is placed afresh): "
        "hami.io/vgpu-devices-allocated"
    ]


def test_a_refused_pod_with_internal_keys_is_still_refused_for_its_own_reason():
    d = decide(pod(GPU, privileged=True, annotations={"hami.io/vgpu-node": "n1"}), S)
    assert not d.allowed and "privileged" in d.message


def _with(section: str) -> AdmissionSettings:
    """The settings of a release serving NVIDIA and the vendor of ``section`` (at its defaults)."""
    return AdmissionSettings(
        build_vendors(device_config_from_dict({"nvidia": {"gpuCorePolicy": "default"}, section: {}}))
    )


@pytest.mark.parametrize(
    "section, key",
    [
        ("enflame", "enflame.com/gcu-assigned-index"),
        ("enflame", "enflame.com/gcu-assigned-id"),
        ("enflame", "enflame.com/gcu-assigned"),
        ("enflame", "enflame.com/gcu-request-size"),
        ("enflame", "enflame.com/gcu-assigned-minor"),
        ("enflame", "enflame.com/gcu-assigned-time"),
        ("enflame", "assigned-containers"),  # the key Enflame's plugin reads (no prefix)
        ("metax", "metax-tech.com/gpu-devices-allocated"),
        ("metax", "metax-tech.com/predicate-time"),
        ("cambricon", "CAMBRICON_DSMLU_PROFILE"),
        ("cambricon", "CAMBRICON_DSMLU_ASSIGNED"),
        ("kunlun", "BAIDU_COM_DEVICE_IDX"),
        ("awsneuron", "AWS_NEURON_IDS"),
        ("awsneuron", "NEURON_ALLOCATED"),
        ("awsneuron", "aws.amazon.com/predicate-node"),
        ("mthreads", "mthreads.com/gpu-index"),
        ("mthreads", "mthreads.com/predicate-node"),
        ("vnpus", "huawei.com/Ascend910B3"),
        ("vnpus", "predicate-time"),
    ],
)
def test_an_enabled_vendors_decision_annotations_are_removed_like_hamis_own(section, key):
    """Beside the hami.io allocation pair, some vendors' decisions write keys of their own that
    their device plugins read at Allocate (which GCU slice, which MLU profile, which NeuronCores):
    a pod created with one (a copy of a placed pod, or a tenant choosing its own grant) has it
    removed, with the warning, when that vendor is enabled; without the vendor it is the pod's own."""
    p = pod(GPU, annotations={key: "0", "keep": "1"})
    d = decide(p, _with(section))
    assert d.allowed, d
    assert d.pod["metadata"]["annotations"] == {"keep": "1"}
    assert len(d.warnings) == 1 and d.warnings[0].endswith(f"(the pod is placed afresh): {key}"), d.warnings
    kept = decide(p, S)  # NVIDIA only
    assert kept.allowed and kept.pod["metadata"]["annotations"] == {key: "0", "keep": "1"} and not kept.warnings


def test_every_key_a_vendors_decision_writes_is_one_the_webhook_removes():
    """One pod per vendor placed by the real core: each decision writes exactly the vendor's
    allocation pair and its decision_annotations (no key missing from that list, none listed that
    is never written), and the webhook of a release serving those vendors treats each as internal."""
    from hami.config import chart_device_config
    from hami.core.names import BIND_PHASE, VGPU_NODE, VGPU_TIME

    from ._vendorkit import config, ctr, node, one
    from ._vendorkit import pod as vpod

    npus = [
        {
            "id": f"npu-{i}",
            "index": i,
            "count": 4,
            "devmem": 65536,
            "devcore": 20,
            "type": "Ascend910B3",
            "health": True,
        }
        for i in range(2)
    ]
    sgpu = {
        "uuid": "sgpu-0",
        "bdf": "0000:0a:00.0",
        "model": "MXC500",
        "totalDevCount": 16,
        "totalCompute": 100,
        "totalVRam": 65536,
        "availableDevCount": 16,
        "availableCompute": 100,
        "availableVRam": 65536,
        "numa": 0,
        "healthy": True,
    }
    drs = {"devices": [{"index": 0, "minor": 3, "capacity": 6}], "profiles": {"1g.8gb": 1, "2g.16gb": 2}}
    cases = {
        "Ascend910B3": (
            node("n", {"hami.io/node-register-Ascend910B3": json.dumps(npus)}),
            {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 16384},
        ),
        "MLU": (
            node("n", capacity={"cambricon.com/mlu.smlu.vcore": 200, "cambricon.com/mlu.smlu.vmemory": 128}),
            {"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 4, "cambricon.com/mlu.smlu.vcore": 10},
        ),
        "Metax-SGPU": (
            node("n", {"metax-tech.com/node-gpu-devices": json.dumps([sgpu])}),
            {"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": 4, "metax-tech.com/vcore": 30},
        ),
        "Metax-GPU": (node("n", capacity={"metax-tech.com/gpu": 2}), {"metax-tech.com/gpu": 1}),
        "Mthreads": (
            node("n", capacity={"mthreads.com/sgpu-core": 32, "mthreads.com/sgpu-memory": 192}),
            {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 4},
        ),
        "Enflame": (node("n", {"enflame.com/gcu-drs-capacity": json.dumps(drs)}), {"enflame.com/drs-gcu": 2}),
        "GCU": (node("n", capacity={"enflame.com/gcu": 2}), {"enflame.com/gcu": 1}),
        "kunlun": (node("n", capacity={"kunlunxin.com/xpu": 4}), {"kunlunxin.com/xpu": 2}),
        "AWSNeuron": (
            node("n", capacity={"aws.amazon.com/neuron": 2, "aws.amazon.com/neuroncore": 4}),
            {"aws.amazon.com/neuroncore": 1},
        ),
        "DCU": (
            node("n", {"hami.io/node-dcu-register": "d0,4,16000,100,DCU,0,true:"}),
            {"hygon.com/dcunum": 1, "hygon.com/dcumem": 1000},
        ),
    }
    cfg = config(chart_device_config())
    settings = AdmissionSettings(cfg.vendors)
    by_name = {v.name: v for v in cfg.vendors}
    for name, (n, limits) in cases.items():
        r = one([n], vpod("p", [ctr(limits=limits)]), cfg)
        assert r.node == "n", (name, r.reasons())
        v = by_name[name]
        written = set(r.annotations) - {VGPU_NODE, VGPU_TIME, BIND_PHASE}
        assert written == {v.allocated_annotation, v.to_allocate_annotation, *v.decision_annotations} - {None}, name
        assert all(settings.internal_annotation(k) for k in r.annotations), name


def test_opt_in_label_allows_disable_control():
    assert decide(pod(GPU, env=OFF), S, {"hami.io/allow-disable-control": "true"}).allowed


@pytest.mark.parametrize(
    "cap", ["SYS_ADMIN", "sys_admin", "CAP_SYS_ADMIN", "ALL", "cap_all", "sys_adm\u0131n", "NET_\u0280AW"]
)
def test_a_device_container_adding_sys_admin_is_refused_like_a_privileged_one(cap):
    """The NVIDIA runtime counts CAP_SYS_ADMIN in the bounding set as privileged: its
    NVIDIA_VISIBLE_DEVICES (the image's, an envFrom's) is honoured where an unprivileged one is
    not, every GPU of the node (found by review)."""
    p = pod(GPU)
    p["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["NET_ADMIN", cap]}}
    d = decide(p, S)
    assert not d.allowed and d.code == 403 and f"adds capability {cap!r}" in d.message
    p["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["NET_ADMIN", "SYS_PTRACE"]}}
    assert decide(p, S).allowed
    init = {"name": "setup", "image": "busybox", "securityContext": {"capabilities": {"add": [cap]}}}
    assert not decide(pod(GPU, init=[init]), S).allowed  # in an init container too
    assert decide(pod(init=[init]), S).allowed  # a pod asking for no device: not ours to judge


def test_privileged_without_devices_is_left_alone():
    d = decide(pod(privileged=True), S)
    assert d.allowed and d.pod["spec"].get("schedulerName") is None


@pytest.mark.parametrize(
    "scheduler, routed",
    [
        (None, True),
        ("default-scheduler", True),
        ("hami-scheduler", True),
        ("volcano", False),
    ],
)
def test_scheduler_name_gate(scheduler, routed):
    d = decide(pod(GPU, scheduler=scheduler), S)
    assert d.allowed
    assert (d.pod["spec"].get("schedulerName") == "hami-scheduler") is routed


def test_gate_without_force_overwrite_keeps_default_scheduler():
    s = AdmissionSettings(S.vendors, force_overwrite_default_scheduler=False)
    assert decide(pod(GPU, scheduler="default-scheduler"), s).pod["spec"]["schedulerName"] == "default-scheduler"


def test_defaults_whole_card_priority_and_default_count():
    d = decide(pod({"nvidia.com/gpu": 1, "nvidia.com/priority": 0}), S)
    c = d.pod["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpucores"] == 100
    assert {"name": "CUDA_TASK_PRIORITY", "value": "0"} in c["env"]
    d = decide(pod({"nvidia.com/gpumem": 2000}), S)
    assert d.pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpucores" not in d.pod["spec"]["containers"][0]["resources"]["limits"]


def test_admission_quota():
    def room(ns, vendors):
        return QuotaRoom({"NVIDIA": (2500, None)}) if ns == "team" else None

    init = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}}}]
    assert decide(pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000}, init=init), S, quota_room=room).allowed
    d = decide(pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1500}), S, quota_room=room)
    assert not d.allowed and "exceeding resource quota" in d.message and "2500 left" in d.message
    assert decide(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 9000}, ns="other"), S, quota_room=room).allowed


def _apply(doc, ops):
    """A minimal RFC 6902 applier (add/remove/replace) to check our patches."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        if not parts:
            doc = op["value"]
            continue
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        key = int(parts[-1]) if isinstance(parent, list) else parts[-1]
        if op["op"] == "remove":
            del parent[key]
        else:
            parent[key] = op["value"]
    return doc


@pytest.mark.parametrize(
    "old, new",
    [
        ({"a": 1}, {"a": 2}),
        ({"a": {"b/c": 1, "d~": 2}}, {"a": {"b/c": 3}}),
        ({"l": [1, 2]}, {"l": [1, 2, 3]}),
        ({"l": [{"x": 1}, {"y": 2}]}, {"l": [{"x": 1}, {"y": 3, "z": []}]}),
        ({}, {"spec": {"schedulerName": "s"}}),
    ],
)
def test_json_patch_round_trip(old, new):
    assert _apply(old, json_patch(old, new)) == new


def test_review_response_shape():
    p = pod({"nvidia.com/gpu": 1})
    body = {
        "apiVersion": "admission.k8s.io/v1beta1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "operation": "CREATE", "kind": {"kind": "Pod"}, "namespace": "team", "object": p},
    }
    out = review(body, S)
    assert out["apiVersion"] == "admission.k8s.io/v1beta1" and out["response"]["uid"] == "u1"
    assert out["response"]["allowed"] and out["response"]["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(out["response"]["patch"]))
    patched = _apply(p, ops)
    assert patched["spec"]["schedulerName"] == "hami-scheduler"
    assert patched["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == 100
    denied = review({**body, "request": {**body["request"], "object": pod(GPU, privileged=True)}}, S)["response"]
    assert not denied["allowed"] and denied["status"]["code"] == 403 and "privileged" in denied["status"]["message"]
    assert review({"request": {"uid": "u2", "object": "nope"}}, S)["response"]["status"]["code"] == 400


def _patch_of(answer):
    r = answer["response"]
    return json.loads(base64.b64decode(r["patch"])) if "patch" in r else None


def _review(p, uid="u1"):
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": uid, "operation": "CREATE", "kind": {"kind": "Pod"}, "namespace": "team", "object": p},
    }


@pytest.mark.parametrize("limits", [{}, {"cpu": "1", "memory": "1Gi"}, {"nvidia.com/priority": 0}])
def test_a_pod_asking_for_no_device_gets_no_patch(limits):
    settings = AdmissionSettings(build_vendors(device_config_from_dict({"nvidia": {"gpuCorePolicy": "force"}})))
    answer = review(_review(pod(limits)), settings)
    assert answer["response"]["allowed"] is True and _patch_of(answer) is None
    assert "patchType" not in answer["response"]


@pytest.mark.parametrize(
    "quantity, expect",
    [
        ("1e3", 1000),
        ("1E3", 1000),
        ("1k", 1000),
        ("1Ki", 1024),
        ("1P", 10**15),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("+1000", 1000),
        ("1000000m", 1000),
        ("0.5Ki", 512),
        (" 2000 ", 2000),
        (1.0e3, 1000),
    ],
)
def test_memory_quantities_read_like_the_api_server(quantity, expect):
    mutated = decide(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": quantity}), S).pod
    from hami.core import pod_request

    (c,) = pod_request(mutated, S.vendors).containers
    assert c.requests[0].memreq == expect


@pytest.mark.parametrize(
    "quantity, text",
    [
        ("١٠٠٠", "is not a quantity"),
        ("0.5", "whole number"),
        ("1m", "whole number"),
        ("1e", "is not a quantity"),
        ("9" * 5000, "out of range"),
        ("1e999999999", "out of range"),
        (float("nan"), "not a number JSON can carry"),
        ([1], "quantity"),
    ],
)
def test_bad_quantities_are_denied_naming_the_field(quantity, text):
    d = decide(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": quantity}), S)
    assert not d.allowed and d.code == 400 and text in d.message and "nvidia.com/gpumem" in d.message


def test_reinvocation_does_not_duplicate_env():
    settings = AdmissionSettings(build_vendors(device_config_from_dict({"nvidia": {"gpuCorePolicy": "force"}})))
    first = decide(pod({"nvidia.com/gpu": 1, "nvidia.com/priority": 0}), settings).pod
    second = decide(first, settings).pod  # reinvocationPolicy IfNeeded: the webhook sees its own output
    env = second["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env].count("CUDA_TASK_PRIORITY") == 1
    assert [e["name"] for e in env].count("GPU_CORE_UTILIZATION_POLICY") == 1
    assert json_patch(first, second) == []


@pytest.mark.parametrize(
    "body",
    [
        {"request": []},
        {"request": {"uid": 5}},
        {"request": {"object": {"spec": {"containers": "x"}}}},
        {"request": {"kind": "Pod", "object": {}}},
        {"apiVersion": 1, "request": None},
        _review({"metadata": [], "spec": {"containers": [{}]}}),
        _review({"spec": {"containers": [{"resources": {"limits": ["nvidia.com/gpu"]}}]}}),
        _review({"spec": {"containers": [{"env": [{"name": 5}]}]}}),
        _review({"metadata": {"annotations": {"a": 1}}, "spec": {"containers": [{}]}}),
    ],
)
def test_malformed_reviews_are_denied_with_400_not_an_exception(body):
    r = review(body, S)["response"]
    assert r["allowed"] is False and r["status"]["code"] == 400 and r["status"]["message"]


@pytest.mark.parametrize(
    "container",
    [
        {"name": "c", "env": None, "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/priority": 1}}},
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": None}},
        {"name": "c", "resources": {"limits": {"nvidia.com/gpumem": 1000}}},  # count defaulted into limits
    ],
)
def test_null_fields_are_filled_not_crashed_on(container):
    d = decide({"metadata": {"name": "p", "namespace": "n"}, "spec": {"containers": [container]}}, S)
    assert d.allowed, d


def test_a_null_container_is_denied():
    d = decide({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}], "initContainers": [None]}}, S)
    assert not d.allowed and d.code == 400 and "spec.initContainers[0]: must not be null" in d.message


# ---------------------------------------------------------------------------------------------
# the grant's own variables (found by an adversarial review: a pod's env comes after the device
# plugin's in the runtime's list, so each of these replaced the grant's value)


@pytest.mark.parametrize(
    "name, value",
    [
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "0"),  # no memory limit on the granted GPU
        ("CUDA_DEVICE_MEMORY_LIMIT", "80g"),
        ("CUDA_DEVICE_SM_LIMIT", "100"),
        ("CUDA_DEVICE_SM_LIMIT_0", "100"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/mine.cache"),
        ("CUDA_OVERSUBSCRIBE", "true"),
        ("HAMI_NRI_INJECTION", "done"),
        ("HAMI_PEER_REGIONS", "/tmp"),
        ("LIBVGPU_CONTEXT_SIZE", "0"),
        ("NVIDIA_VISIBLE_DEVICES", "all"),  # every GPU of the node, none of them limited
        ("NVIDIA_VISIBLE_DEVICES", "GPU-other"),
        ("CUDA_TASK_PRIORITY", "0"),  # high priority without asking for it
    ],
)
def test_a_device_pod_may_not_set_the_variables_of_its_grant(name, value):
    for p in (
        pod(GPU, env=[{"name": name, "value": value}]),
        pod(GPU, init=[{"name": "i", "env": [{"name": name, "value": value}]}]),
    ):
        d = decide(p, S, {})
        assert not d.allowed and name in d.message and "docs/security.md" in d.message, d
    from_config = {"name": name, "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
    assert not decide(pod(GPU, env=[from_config]), S, {}).allowed


@pytest.mark.parametrize(
    "env",
    [
        [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],  # fewer GPUs is fine
        [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}],  # CUDA's choice among the granted GPUs
        [{"name": "CUDA_DEVICE_MEMORY_LIMITS", "value": "x"}],  # not one of libvgpu's names, nor a suffix
        [{"name": "LIBCUDA_LOG_LEVEL", "value": "4"}],
        [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}],
    ],
)
def test_variables_that_give_no_more_are_allowed(env):
    assert decide(pod(GPU, env=env), S, {}).allowed


def _mounting(path: str, *, init: bool = False) -> dict:
    mount = {
        "name": "main" if not init else "i",
        "image": "busybox",
        "volumeMounts": [{"name": "v", "mountPath": path}],
    }
    p = pod(GPU, init=[mount] if init else None)
    if not init:
        p["spec"]["containers"][0]["volumeMounts"] = mount["volumeMounts"]
    p["spec"]["volumes"] = [{"name": "v", "configMap": {"name": "mine"}}]
    return p


@pytest.mark.parametrize(
    "path",
    [
        "/etc/ld.so.preload",  # a ConfigMap key there (subPath): no libvgpu at all
        "/etc//ld.so.preload/",
        "/usr/local/vgpu/libvgpu.so",  # the pod's own library
        "/usr/local/vgpu",
        "/usr/local/./vgpu/x",
        "/usr/local/lib/../vgpu",
        "/data/hami-grant.env",  # libvgpu finds these two by name in its mount table
        "/tmp/grant-pending/",
        "/x/hami-grant.env/.",
    ],
)
def test_a_device_pod_may_not_mount_over_libvgpus_mounts(path):
    for init in (False, True):
        d = decide(_mounting(path, init=init), S, {})
        assert not d.allowed and repr(path) in d.message and "libvgpu" in d.message, d


@pytest.mark.parametrize("mounts", [None, [None], ["x"], [{"mountPath": None}], {"a": 1}])
def test_odd_volume_mounts_are_not_crashed_on(mounts):
    p = pod(GPU)
    p["spec"]["containers"][0]["volumeMounts"] = mounts
    assert decide(p, S, {}).allowed in (True, False)  # the API server's validation refuses the shape; no exception


@pytest.mark.parametrize("path", ["/etc/ld.so.preload", "/usr/local/vgpu/libvgpu.so", "/hami-grant.env"])
def test_a_termination_message_path_over_libvgpus_mounts_is_refused(path):
    # the kubelet mounts a file of its own there, after the device plugin's mounts
    p = pod(GPU)
    p["spec"]["containers"][0]["terminationMessagePath"] = path
    d = decide(p, S, {})
    assert not d.allowed and "terminationMessagePath" in d.message and repr(path) in d.message, d
    p["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    assert decide(p, S, {}).allowed


def test_libvgpus_mounts_follow_the_hook_path():
    moved = replace(S, hook_path="/opt/hami/")
    assert not decide(_mounting("/opt/hami/vgpu/libvgpu.so"), moved, {}).allowed
    assert decide(_mounting("/usr/local/vgpu/libvgpu.so"), moved, {}).allowed
    for path in ("/etc/ld.so.preload.d", "/usr/local/vgpu-data", "/etc", "/usr/local"):
        assert decide(_mounting(path), S, {}).allowed, path


def test_a_pod_without_devices_may_set_them():
    assert decide(pod(env=[{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "0"}]), S, {}).allowed


def test_priority_env_only_with_the_priority_resource_whose_value_the_webhook_writes():
    d = decide(pod({**GPU, "nvidia.com/priority": 1}, env=[{"name": "CUDA_TASK_PRIORITY", "value": "0"}]), S, {})
    assert d.allowed
    env = d.pod["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "CUDA_TASK_PRIORITY"] == [{"name": "CUDA_TASK_PRIORITY", "value": "1"}]
    d = decide(pod(GPU, env=[{"name": "CUDA_TASK_PRIORITY", "value": "0"}]), S, {})
    assert not d.allowed and "nvidia.com/priority" in d.message


@pytest.mark.parametrize("value", ["disable", "DISABLE", "Disable"])
def test_core_policy_disable_is_an_opt_in_like_disable_control(value):
    env = [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": value}]
    d = decide(pod(GPU, env=env), S, {})
    assert not d.allowed and "GPU_CORE_UTILIZATION_POLICY=disable" in d.message
    assert "hami.io/allow-disable-control=true" in d.message
    assert decide(pod(GPU, env=env), S, {"hami.io/allow-disable-control": "true"}).allowed
    # a value admission cannot read counts as disable (found by the regression review)
    from_config = [{"name": "GPU_CORE_UTILIZATION_POLICY", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
    d = decide(pod(GPU, env=from_config), S, {})
    assert not d.allowed and "GPU_CORE_UTILIZATION_POLICY=disable" in d.message
    # the node-wide policy: the webhook writes it itself, so a pod may too
    settings = AdmissionSettings(build_vendors(device_config_from_dict({"nvidia": {"gpuCorePolicy": "disable"}})))
    assert decide(pod(GPU, env=env), settings, {}).allowed


@pytest.mark.parametrize("scheduler", ["volcano", "no-such-scheduler"])
def test_a_device_pod_with_a_node_assigned_is_denied_whatever_its_scheduler(scheduler):
    """A pod naming any other scheduler skipped the nodeName rule; the kubelet then called the
    device plugin's Allocate for it, which in the lock mode hands out the grant of the pod the
    node lock names (another tenant's GPU). Found by an adversarial review."""
    d = decide(pod(GPU, scheduler=scheduler, node="n1"), S)
    assert not d.allowed and "spec.nodeName=n1" in d.message
    # without a device, or without a node, such a pod is left to its scheduler as before
    assert decide(pod(scheduler=scheduler, node="n1"), S).allowed
    d = decide(pod(GPU, scheduler=scheduler), S)
    assert d.allowed and d.pod["spec"]["schedulerName"] == scheduler


@pytest.mark.parametrize("scheduler", ["volcano", "hami-scheduler"])
def test_a_pinned_pod_whose_device_request_is_unreadable_is_denied_not_waved_through(scheduler):
    """A value the vendors refuse (gpumem-percentage 101) once made a pinned pod of another
    scheduler "not ours": admitted, the kubelet kept the count it could read (nvidia.com/gpu: 1)
    and called Allocate for it. Found by an adversarial review."""
    d = decide(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 101}, scheduler=scheduler, node="n1"), S)
    assert not d.allowed and d.code == 400 and "gpumem-percentage" in d.message


def test_a_pinned_device_pod_is_denied_on_the_dra_front_end_too():
    dra = AdmissionSettings(build_vendors(), scheduler_name="hami-scheduler", front_end="dra")
    d = decide(pod(GPU, scheduler="hami-scheduler", node="n1"), dra)
    assert not d.allowed and "spec.nodeName=n1" in d.message
    assert decide(pod(GPU, scheduler="hami-scheduler"), dra).allowed


def test_a_pod_with_more_than_64_device_containers_is_refused_by_name():
    """Each device container is fitted against every earlier one's picks; with a quota, 4000 init
    containers held a Filter for 26 s. Found by an adversarial review."""
    from hami.core.requests import MAX_DEVICE_CONTAINERS, pod_request

    init = [
        {"name": f"i{i}", "image": "b", "resources": {"limits": dict(GPU)}} for i in range(MAX_DEVICE_CONTAINERS + 1)
    ]
    p = pod(GPU, init=init)
    d = decide(p, S)
    assert not d.allowed and d.code == 400 and "more than 64 containers ask for devices" in d.message
    with pytest.raises(Exception, match="more than 64 containers ask for devices"):
        pod_request(p, S.vendors)
    assert decide(pod(GPU, init=init[:63]), S).allowed  # 63 + 1 is the bound


@pytest.mark.parametrize("value", ["force\nCUDA_DEVICE_SM_LIMIT=100", "force\r", "de\tfault"])
def test_a_core_policy_with_a_control_character_is_refused(value):
    """The grant file carries the pod's GPU_CORE_UTILIZATION_POLICY one line per setting: a line
    break in it failed Allocate (the device plugin refuses to write it), so it is refused here."""
    d = decide(pod(GPU, env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "value": value}]), S, {})
    assert not d.allowed and "GPU_CORE_UTILIZATION_POLICY" in d.message and "control character" in d.message, d


def test_a_device_selection_the_scheduler_would_refuse_is_refused_at_creation():
    """Found by review, 1 Dec: a pod with 65 distinct nvidia.com/use-gputype entries was admitted
    and then refused at every Filter (a FilteringFailed event per retry); the webhook now reads the
    selection of each vendor the pod asks for and refuses it, naming the annotation. A pod that asks
    for no GPU keeps its annotations unread, and 64 entries are still admitted."""
    many = ",".join(f"x{i}" for i in range(65))
    d = decide(pod(GPU, annotations={"nvidia.com/use-gputype": many}), S)
    assert not d.allowed and d.code == 400, d
    assert "annotation nvidia.com/use-gputype: 65 distinct device types listed" in d.message
    assert decide(pod({"cpu": 1}, annotations={"nvidia.com/use-gputype": many}), S).allowed
    at_cap = ",".join(["A100"] + [f"x{i}" for i in range(63)])
    assert decide(pod(GPU, annotations={"nvidia.com/use-gputype": at_cap}), S).allowed
