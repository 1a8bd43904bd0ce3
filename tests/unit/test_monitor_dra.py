"""`hami monitor` on a DRA node: regions under <hook>/claims/<claim UID>/ are read with the same
metric names and labels as containers' regions, named after the claim's record and the node's pods."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace as NS

import pytest

from hami.monitor.command import readings
from hami.monitor.containers import scan_claims
from hami.monitor.exporter import MonitorCollector, PodRef
from hami.monitor.kube import pod_claims

from . import _regionkit as kit
from .test_monitor_exporter import MiB, _scrape, _values

CLAIM_UID = "7c1d0b52-5555-4e1e-8f00-cccccccccccc"
OTHER_UID = "7c1d0b52-6666-4e1e-8f00-dddddddddddd"


@pytest.fixture
def hook(tmp_path):
    """``$HOOK_PATH`` with one container region and two claim regions (one without a record)."""
    kit.write(
        tmp_path / "containers" / "0b6f3b4e-1111-4d7e-9a8e-aaaaaaaaaaaa_main" / "x.cache",
        uuids=("GPU-x",),
        procs=[kit.Proc(pid=1, hostpid=10, used={0: (0, 0, 5, 5)})],
    )
    claims = tmp_path / "claims"
    kit.write(
        claims / CLAIM_UID / "r.cache",
        uuids=("GPU-a",),
        limits=(3000 * MiB,),
        procs=[kit.Proc(pid=7, hostpid=70, used={0: (0, 0, 120 * MiB, 120 * MiB)}, sm_util={0: 30})],
    )
    (claims / f"{CLAIM_UID}.json").write_text(
        json.dumps({"namespace": "team-a", "name": "p1-hami-gpu-0-x7k", "uid": CLAIM_UID, "devices": ["GPU-a"]})
    )
    kit.write(claims / OTHER_UID / "r.cache", uuids=("GPU-b",))
    return tmp_path


def collector(hook, pods=None):
    return MonitorCollector(
        "node-1", str(hook / "containers"), pods=pods, claims_dir=str(hook / "claims"), clock=lambda: 1030.0
    )


def test_scan_claims_reads_the_record_beside_each_directory(hook):
    found = {c.uid: c for c in scan_claims(str(hook / "claims"))}
    assert sorted(found) == [CLAIM_UID, OTHER_UID]
    good, missing = found[CLAIM_UID], found[OTHER_UID]
    assert (good.namespace, good.name, good.problem) == ("team-a", "p1-hami-gpu-0-x7k", "")
    assert good.region.endswith(f"{CLAIM_UID}/r.cache")
    assert (missing.namespace, missing.name) == ("", "") and "no record of the claim" in missing.problem
    assert scan_claims(str(hook / "nowhere")) == []


@pytest.mark.parametrize(
    "record",
    [
        "not json",
        json.dumps({"namespace": "a", "name": "b", "uid": "someone-else"}),
        json.dumps(["a"]),
        json.dumps({"namespace": "", "name": "b", "uid": CLAIM_UID}),
    ],
)
def test_a_bad_record_is_a_problem_not_a_label(hook, record):
    (hook / "claims" / f"{CLAIM_UID}.json").write_text(record)
    [c] = [c for c in scan_claims(str(hook / "claims")) if c.uid == CLAIM_UID]
    assert c.namespace == "" and c.problem


def test_a_claims_region_is_labelled_with_the_pod_and_the_one_container_using_it(hook, caplog):
    pods = {
        "pod-uid": PodRef("team-a", "p1", "pod-uid", claims=(("p1-hami-gpu-0-x7k", ("main",)),)),
        "other": PodRef("team-b", "p1", "other", claims=(("p1-hami-gpu-0-x7k", ("main",)),)),
    }  # other namespace
    with caplog.at_level(logging.WARNING):
        got = _scrape(collector(hook, lambda: pods))
    used = got["hami_vgpu_memory_used_bytes"]
    assert _values(used, namespace="team-a", pod="p1", container="main", vdevice_index="0", device_uuid="GPU-a") == [
        120 * MiB
    ]
    assert _values(got["hami_vgpu_memory_limit_bytes"], pod="p1", device_uuid="GPU-a") == [3000 * MiB]
    assert _values(got["hami_container_device_utilization_ratio"], pod="p1", device_uuid="GPU-a") == [30]
    assert _values(used, device_uuid="GPU-b") == []  # no record: not exported, counted
    assert _values(got["hami_monitor_regions"], state="unmatched") == [2]  # the container dir's pod too
    assert _values(got["hami_monitor_regions"], state="ok") == [1]
    assert "no record of the claim" in caplog.text


def test_a_claim_shared_by_containers_is_labelled_with_the_claims_name(hook):
    pods = {"u": PodRef("team-a", "p1", "u", claims=(("p1-hami-gpu-0-x7k", ("a", "b")),))}
    used = _scrape(collector(hook, lambda: pods))["hami_vgpu_memory_used_bytes"]
    assert _values(used, pod="p1", container="p1-hami-gpu-0-x7k", device_uuid="GPU-a") == [120 * MiB]


def test_a_claim_no_pod_on_the_node_uses_is_unmatched(hook):
    got = _scrape(collector(hook, lambda: {}))
    assert "hami_vgpu_memory_used_bytes" not in got  # no series at all
    assert _values(got["hami_monitor_regions"], state="unmatched") == [3]


def test_standalone_labels_a_claims_region_by_the_claim(hook):
    used = _scrape(collector(hook))["hami_vgpu_memory_used_bytes"]
    assert _values(used, namespace="team-a", pod=CLAIM_UID, container="p1-hami-gpu-0-x7k") == [120 * MiB]


def test_the_feedback_loop_sees_claim_regions_too(hook):
    paths = [r.key for r, _ in readings(str(hook / "containers"), str(hook / "claims"))]
    assert [p.rsplit("/", 2)[-2] for p in paths] == ["0b6f3b4e-1111-4d7e-9a8e-aaaaaaaaaaaa_main", CLAIM_UID, OTHER_UID]
    assert len(readings(str(hook / "containers"))) == 1


def test_a_claims_region_counts_only_on_the_gpus_the_driver_gave_the_claim(hook):
    """The claim's container writes its region: a UUID it adds (another tenant's GPU) is neither
    exported nor fed back, where the driver's record names the claim's GPUs."""
    claims = hook / "claims"
    kit.write(
        claims / CLAIM_UID / "r.cache",
        uuids=("GPU-a", "GPU-victim"),
        procs=[kit.Proc(pid=7, hostpid=70, used={0: (0, 0, 5, 5), 1: (0, 0, 70 * MiB, 70 * MiB)})],
        recent_kernel=1000,
    )
    record = {"namespace": "team-a", "name": "p1-hami-gpu-0-x7k", "uid": CLAIM_UID, "devices": ["GPU-a"]}
    (claims / f"{CLAIM_UID}.json").write_text(json.dumps(record))
    pods = {"u": PodRef("team-a", "p1", "u", claims=(("p1-hami-gpu-0-x7k", ("main",)),))}
    used = _scrape(collector(hook, lambda: pods))["hami_vgpu_memory_used_bytes"]
    assert {s.labels["device_uuid"] for s in used if s.labels["pod"] == "p1"} == {"GPU-a"}
    [(r, _)] = [x for x in readings(str(hook / "containers"), str(claims), pods) if CLAIM_UID in x[0].key]
    assert r.uuids == ("GPU-a", "")
    record["devices"] = "GPU-a"
    (claims / f"{CLAIM_UID}.json").write_text(json.dumps(record))
    [c] = [c for c in scan_claims(str(claims)) if c.uid == CLAIM_UID]
    assert "devices must be a list" in c.problem and c.namespace == ""


def test_pod_claims_resolves_template_claims_through_the_pods_status():
    def ctr(name, *claims):
        return NS(name=name, resources=NS(claims=[NS(name=c) for c in claims]))

    pod = NS(
        spec=NS(
            resource_claims=[
                NS(name="gpu", resource_claim_name=None),
                NS(name="shared", resource_claim_name="team-claim"),
            ],
            init_containers=[ctr("init", "shared")],
            containers=[ctr("main", "gpu", "shared"), ctr("plain"), NS(name="bare", resources=None)],
        ),
        status=NS(resource_claim_statuses=[NS(name="gpu", resource_claim_name="p1-gpu-abc")]),
    )
    assert pod_claims(pod) == (("p1-gpu-abc", ("main",)), ("team-claim", ("init", "main")))
    assert pod_claims(NS(spec=None, status=None)) == ()


async def test_pod_claims_reads_the_kubernetes_client_s_own_pod_objects():
    """The same through kubernetes_asyncio's V1Pod (what node_pods gets from the API server)."""
    from kubernetes_asyncio import client

    raw = {
        "metadata": {"name": "p", "namespace": "team-a", "uid": "u"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "hami-gpu-abc"}],
            "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}, {"name": "side"}],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-hami-gpu-0-x7k"}]},
    }
    async with client.ApiClient() as api:
        pod = api._ApiClient__deserialize(raw, "V1Pod")
    assert pod_claims(pod) == (("p-hami-gpu-0-x7k", ("main",)),)


def test_a_claims_priority_comes_from_the_drivers_record_not_its_region(hook):
    """A claim's configuration may set a task priority (the webhook writes nvidia.com/priority into
    it); the driver records it beside the claim and the feedback loop takes it from there. The
    region's own field is the container's to write: 0 there lifts nothing (it was the default,
    1, for every claim whatever its configuration said)."""
    claims = hook / "claims"
    pods = {"u": PodRef("team-a", "p1", "u", claims=(("p1-hami-gpu-0-x7k", ("main",)),))}
    record = {"namespace": "team-a", "name": "p1-hami-gpu-0-x7k", "uid": CLAIM_UID, "devices": ["GPU-a"]}

    def priority():
        [(r, _)] = [x for x in readings(str(hook / "containers"), str(claims), pods) if CLAIM_UID in x[0].key]
        return r.priority

    kit.write(claims / CLAIM_UID / "r.cache", uuids=("GPU-a",), priority=0)  # the container's claim
    (claims / f"{CLAIM_UID}.json").write_text(json.dumps(record))
    assert priority() == 1
    (claims / f"{CLAIM_UID}.json").write_text(json.dumps({**record, "priority": 0}))
    assert priority() == 0
    for bad in (-1, 1001, "0", True):
        (claims / f"{CLAIM_UID}.json").write_text(json.dumps({**record, "priority": bad}))
        [c] = [c for c in scan_claims(str(claims)) if c.uid == CLAIM_UID]
        assert "priority must be an integer 0..1000" in c.problem and c.namespace == ""
