"""``hami simulate`` (extender front end), the API server's quota on extended resources
(``requests.nvidia.com/gpu``), found by review, 1 Dec: a quota's ``spec.scopeSelector`` or
``spec.scopes`` of the wrong type, a pod stuck Terminating past its grace period, and a dump's
pods counted from their place in the file rather than from the start."""

from __future__ import annotations

import copy

import pytest

from hami.core import SchedulerConfig
from hami.sim.engine import SimulationError, simulate
from hami.vendors import build_vendors

from .test_simulate import pod_doc, sim, write
from .test_simulate_dump import node, placed

CFG = SchedulerConfig(build_vendors(), "binpack", "spread")
GPU1 = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}


def by_name(result):
    return {p.name: p for p in result.pods}


def gpu_quota(gpus="1", ns="team", **spec):
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": ns},
        "spec": {"hard": {"requests.nvidia.com/gpu": gpus}, **spec},
    }


# ---------------------------------------------------------------- 1. scopes of the wrong type


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("scopeSelector", "PriorityClass", "spec.scopeSelector: must be a map, got string 'PriorityClass'"),
        ("scopeSelector", [1], "spec.scopeSelector: must be a map, got list [1]"),
        ("scopeSelector", {"matchExpressions": "x"}, "spec.scopeSelector.matchExpressions: must be a list, got string"),
        ("scopes", "BestEffort", "spec.scopes: must be a list, got string 'BestEffort'"),
    ],
)
def test_a_quota_scope_of_the_wrong_type_is_one_line_naming_the_field(tmp_path, capsys, field, value, words):
    """Found by review, 1 Dec: ``scopeSelector: PriorityClass`` (or a list) made ApiServerQuota.capped
    raise AttributeError, a traceback from the CLI; ``scopes: BestEffort`` (a string) was silently
    read as a scoped quota. Now one line naming the field and its value, exit status 1."""
    nodes = write(tmp_path, "n.yaml", [node("n1")])
    pods = write(tmp_path, "p.yaml", [gpu_quota(**{field: value}), pod_doc("a", GPU1, ns="team")])
    code, out, err = sim(capsys, "--nodes", nodes, "--pods", pods)
    assert code == 1 and out == ""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(f"hami simulate: {pods}: document 1 (ResourceQuota team/gpus): {words}")


def test_a_well_formed_scoped_quota_is_still_left_out():
    selector = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}
    docs = [
        gpu_quota("0", scopeSelector=selector),
        gpu_quota("0", scopes=["BestEffort"]),
        pod_doc("a", GPU1, ns="team"),
    ]
    docs[1]["metadata"]["name"] = "other"
    assert by_name(simulate([node("n1")], docs, CFG))["a"].status == "scheduled"


# ---------------------------------------------------------------- 2. a pod stuck Terminating


def _stuck(name, deleted_at, grace=30):
    pod = placed(name, "n1", "GPU-n1-0", mem=1000, deletionTimestamp=deleted_at, deletionGracePeriodSeconds=grace)
    pod["metadata"]["namespace"] = "team"
    return pod


def test_a_pod_stuck_terminating_past_its_grace_period_is_not_charged_to_the_quota():
    """Found by review, 1 Dec: a pod stuck Terminating (a lost node) since 2020 with a 30 s grace
    period took the namespace's one GPU of quota, and a new pod was denied; Kubernetes' quota
    evaluator (QuotaV1Pod) stops charging it once deletionTimestamp + deletionGracePeriodSeconds
    has passed. It still holds its GPU share for the scheduler."""
    r = simulate(
        [node("n1", n=4)],
        [gpu_quota("1"), _stuck("stuck", "2020-01-01T00:00:00Z"), pod_doc("new", GPU1, ns="team")],
        CFG,
    )
    pods = by_name(r)
    assert (pods["stuck"].status, pods["new"].status) == ("terminating", "scheduled")
    assert sum(d["used"] for d in r.devices) == 2


def test_a_pod_within_its_grace_period_or_without_one_is_still_charged():
    """Charged until its grace period is over (the simulation's clock: ``now``), and without
    deletionGracePeriodSeconds at all, as in Kubernetes."""
    now = 1_900_000_000.0  # 2030-03-17
    for stuck in (
        _stuck("stuck", "2030-03-17T17:46:30Z", grace=60),
        _stuck("stuck", "2020-01-01T00:00:00Z", grace=None),
    ):
        pods = by_name(
            simulate([node("n1", n=4)], [gpu_quota("1"), stuck, pod_doc("new", GPU1, ns="team")], CFG, now=now)
        )
        assert pods["new"].status == "denied" and "used: requests.nvidia.com/gpu=1" in pods["new"].reasons["apiserver"]
    past = _stuck("stuck", "2030-03-17T17:45:00Z", grace=30)  # 17:45:30 < now (17:46:40)
    pods = by_name(simulate([node("n1", n=4)], [gpu_quota("1"), past, pod_doc("new", GPU1, ns="team")], CFG, now=now))
    assert pods["new"].status == "scheduled"


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("deletionTimestamp", "yesterday", "metadata.deletionTimestamp must be an RFC 3339 time"),
        ("deletionTimestamp", "2020-01-01T00:00:00", "got '2020-01-01T00:00:00'"),
        ("deletionGracePeriodSeconds", "30", "metadata.deletionGracePeriodSeconds must be an integer, got '30'"),
    ],
)
def test_an_unreadable_deletion_time_names_its_field(field, value, words):
    stuck = _stuck("stuck", "2020-01-01T00:00:00Z")
    stuck["metadata"][field] = value
    with pytest.raises(SimulationError) as err:
        simulate([node("n1")], [stuck], CFG, sources=("n.yaml", "p.yaml"))
    assert str(err.value).startswith("p.yaml: document 1 (Pod team/stuck): ") and words in str(err.value)


# ---------------------------------------------------------------- 3. a dump's pods, wherever the file lists them


def _dumped_pending():
    pod = pod_doc("dumped", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}, ns="team")  # fits no GPU: pending
    pod["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    pod["status"] = {"phase": "Pending"}
    return pod


def test_a_dumped_pending_pod_counts_in_the_quota_wherever_the_file_lists_it():
    """Found by review, 1 Dec: with one GPU of quota, a dumped pending 1-GPU pod and a new 1-GPU pod,
    the new pod was denied when the dump came first (cat dump.yaml new.yaml) but placed when it came
    last (cat new.yaml dump.yaml): the dumped pod, which exists before the new one, was counted only
    from its place in the file. Both orders now deny the new pod, and the dumped one counts once."""
    for order in ("dump first", "dump last"):
        new = pod_doc("new", GPU1, ns="team")
        pods = [_dumped_pending(), new] if order == "dump first" else [new, _dumped_pending()]
        r = by_name(simulate([node("n1", n=4)], [gpu_quota("1"), *pods], CFG))
        assert r["dumped"].status == "pending", order
        assert r["new"].status == "denied", order
        assert "used: requests.nvidia.com/gpu=1," in r["new"].reasons["apiserver"], order


def test_a_dumped_pod_deleted_later_in_the_file_gives_its_quota_back_there():
    dumped = _dumped_pending()
    gone = copy.deepcopy(dumped)
    gone["metadata"]["deletionTimestamp"] = "2026-01-02T00:00:00Z"
    docs = [gpu_quota("1"), pod_doc("before", GPU1, ns="team"), dumped, gone, pod_doc("after", GPU1, ns="team")]
    r = by_name(simulate([node("n1", n=4)], docs, CFG))
    assert (r["before"].status, r["dumped"].status, r["after"].status) == ("denied", "deleted", "scheduled")
