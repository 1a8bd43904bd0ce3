"""Findings of the webhook's adversarial review: forged allocation pairs of any backend, the
admission quota of a pod with sidecars, and asks the webhook admits but reads otherwise than written."""

from __future__ import annotations

import base64
import json

import pytest

from hami.core.fit import QuotaRoom
from hami.core.types import ContainerKind
from hami.core.usage import collapse_picks
from hami.kube import nodelock
from hami.vendors import build_vendors
from hami.webhook.admission import AdmissionSettings, decide, review

S = AdmissionSettings(build_vendors())  # NVIDIA only: no other backend is enabled


def _pod(containers, init=(), annotations=None):
    meta = {"name": "p", "namespace": "team"}
    if annotations is not None:
        meta["annotations"] = annotations
    spec = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _ctr(name, limits, **extra):
    return {"name": name, "image": "busybox", "resources": {"limits": dict(limits)}, **extra}


# ---------------------------------------------------------------- any backend's allocation pair


def test_another_backends_allocation_pair_is_removed_at_creation():
    # The device plugin keeps the node lock, and bind-phase short of success, while any backend's
    # hami.io/<word>-devices-to-allocate names a device (nodelock.devices_pending), enabled or not:
    # a tenant's GPU pod carrying a forged one held its node's lock until it expired (5 min), so
    # no other pod could be bound there. The webhook removed only the enabled vendors' keys.
    forged = {
        "hami.io/ascend-devices-to-allocate": "npu-0,Ascend910B,32768,100:;",
        "hami.io/ascend-devices-allocated": "npu-0,Ascend910B,32768,100:;",
        "example.com/cache-allocated": "yes",  # a key of someone else's: kept
        "hami.io/webhook": "note",  # not an allocation key: kept
    }
    d = decide(_pod([_ctr("main", {"nvidia.com/gpu": 1})], annotations=forged), S)
    assert d.allowed, d.message
    kept = d.pod["metadata"]["annotations"]
    assert kept == {"example.com/cache-allocated": "yes", "hami.io/webhook": "note"}
    assert nodelock.devices_pending(kept) == []
    assert any("hami.io/ascend-devices-to-allocate" in w for w in d.warnings), d.warnings


def test_the_removal_is_in_the_patch_of_a_pod_for_another_scheduler_too():
    p = _pod([_ctr("main", {"cpu": 1})], annotations={"hami.io/foo-devices-to-allocate": "x"})
    p["spec"]["schedulerName"] = "volcano"
    answer = review({"request": {"uid": "u", "operation": "CREATE", "namespace": "team", "object": p}}, S)
    r = answer["response"]
    assert r["allowed"] and r["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(r["patch"]))
    assert {"op": "remove", "path": "/metadata/annotations/hami.io~1foo-devices-to-allocate"} in ops


# ---------------------------------------------------------------- quota with sidecars


def _quota(mib):
    return lambda ns, vendors: QuotaRoom({"NVIDIA": (mib, None)})


def test_an_init_container_counts_with_the_sidecars_declared_before_it():
    # sidecar `log` 4000 MiB runs through init `setup` 4000 MiB: 8000 MiB at once, whatever the
    # placement; the scheduler's quota counts that phase (collapse_picks) and never places the pod
    # within 5000 MiB. The webhook counted max(log + main, setup) = 5000 and admitted it.
    log = _ctr("log", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}, restartPolicy="Always")
    setup = _ctr("setup", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000})
    main = _ctr("main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
    kinds = (ContainerKind.SIDECAR, ContainerKind.INIT, ContainerKind.APP)
    # the cheapest placement for the quota, every container on one GPU: still 8000 MiB
    picks = [(i, "NVIDIA", "GPU-0", m, 0) for i, m in enumerate((4000, 4000, 1000))]
    assert sum(u.mem for u in collapse_picks(picks, kinds)) == 8000
    assert not QuotaRoom({"NVIDIA": (5000, None)}).allows(picks, kinds, "NVIDIA")

    d = decide(_pod([main], init=[log, setup]), S, quota_room=_quota(5000))
    assert not d.allowed
    assert "nvidia.com/gpumem requests 8000" in d.message and "5000 left" in d.message, d.message
    assert decide(_pod([main], init=[log, setup]), S, quota_room=_quota(8000)).allowed


def test_a_sidecar_declared_after_an_init_container_does_not_run_beside_it():
    log = _ctr("log", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}, restartPolicy="Always")
    setup = _ctr("setup", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000})
    main = _ctr("main", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000})
    d = decide(_pod([main], init=[setup, log]), S, quota_room=_quota(5000))
    assert d.allowed, d.message


# ---------------------------------------------------------------- asks read otherwise than written


@pytest.mark.parametrize(
    "limits, text",
    [
        (
            {"nvidia.com/gpu": 0, "nvidia.com/gpumem": 1000},
            "nvidia.com/gpu 0 gives no GPU (gpumem ignored)",
        ),
        (
            {"nvidia.com/gpu": 0, "nvidia.com/gpucores": 30, "nvidia.com/gpumem-percentage": 50},
            "nvidia.com/gpu 0 gives no GPU (gpumem-percentage, gpucores ignored)",
        ),
        ({"nvidia.com/gpu": 2, "nvidia.com/gpucores": 200}, "nvidia.com/gpucores 200 is read as 100"),
        (
            {"nvidia.com/gpumem": 1000, "nvidia.com/gpumem-percentage": 50},  # the count defaulted to 1
            "nvidia.com/gpumem-percentage 50 is ignored, nvidia.com/gpumem 1000 is given",
        ),
    ],
)
def test_asks_read_otherwise_than_written_are_admitted_with_a_warning(limits, text):
    # HAMi admits these as they are (a chart's gpu: 0 turns its GPU off), so they are not refused;
    # the user, who got something else than written, is told (kubectl prints the warnings)
    p = _pod([_ctr("main", limits)])
    answer = review({"request": {"uid": "u", "operation": "CREATE", "namespace": "team", "object": p}}, S)
    r = answer["response"]
    assert r["allowed"], r
    assert [w for w in r.get("warnings", ()) if text in w and "'main'" in w], r.get("warnings")
    assert all(len(w) < 120 for w in r["warnings"]), r["warnings"]


@pytest.mark.parametrize(
    "limits",
    [
        {"nvidia.com/gpu": 0},  # gpucores: 100 is the webhook's own default, not the user's ask
        {"nvidia.com/gpu": 1},
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 100},
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50},
    ],
)
def test_asks_read_as_written_carry_no_warning(limits):
    d = decide(_pod([_ctr("main", limits)]), S)
    assert d.allowed and d.warnings == (), d


def test_the_dra_front_end_warns_of_the_same_asks():
    dra = AdmissionSettings(build_vendors(), front_end="dra")
    d = decide(_pod([_ctr("main", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150})]), dra)
    assert d.allowed, d.message
    assert any("nvidia.com/gpucores 150 is read as 100" in w for w in d.warnings), d.warnings


# ---------------------------------------------------------------- the priority resource


@pytest.mark.parametrize("value, shown", [(1001, "1001"), ("5k", "5000"), ("1M", "1000000")])
def test_a_priority_libvgpu_cannot_run_with_is_refused_naming_it(value, shown):
    # the webhook wrote it into CUDA_TASK_PRIORITY and the grant passed it on; libvgpu reads the
    # variable in -1000..1000 and exits (78) at the first CUDA call otherwise: the pod was admitted,
    # placed and given a GPU, then crashed in a loop. (Negative values the API server refuses.)
    d = decide(_pod([_ctr("main", {"nvidia.com/gpu": 1, "nvidia.com/priority": value})]), S)
    assert not d.allowed and d.code == 400
    assert (
        d.message == f"container 'main': nvidia.com/priority must be an integer in 0..1000 (0 high, 1 low), got {shown}"
    )


@pytest.mark.parametrize("value", [0, 1, "7", 1000])
def test_a_priority_libvgpu_runs_with_is_admitted(value):
    d = decide(_pod([_ctr("main", {"nvidia.com/gpu": 1, "nvidia.com/priority": value})]), S)
    assert d.allowed, d.message
    env = d.pod["spec"]["containers"][0]["env"]
    assert {"name": "CUDA_TASK_PRIORITY", "value": str(int(value))} in env


def test_a_priority_in_a_container_without_a_gpu_is_read_too():
    p = _pod([_ctr("main", {"nvidia.com/gpu": 1}), _ctr("side", {"nvidia.com/priority": "abc"})])
    d = decide(p, S)
    assert not d.allowed and d.code == 400 and "'abc' is not a quantity" in d.message, d
