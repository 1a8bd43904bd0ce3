"""``hami simulate`` retries its pending pods as kube-scheduler does (found by review, 1 Dec): a
pod left pending stayed so after a later deletion in the file freed the GPU it needed, its reasons
contradicting the final per-GPU usage the same report showed (pods5.yaml: holder takes 20000 of the
only 24000 MiB GPU, waiter arrives and is pending, holder is deleted: ``n1 0/10 0.0G/23.4G`` next to
``pending a/waiter: n1: 1/1 CardInsufficientMemory``); the bundled example's pending H100 jobs
read ``2/8 AllocatedCardsInsufficientRequest, 6/8 CardInsufficientMemory`` against a final ledger
where no H100 has the memory."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from hami.cli import main
from hami.core import SchedulerConfig, admit_pod, filter_pod
from hami.sim.engine import simulate
from hami.vendors import build_vendors

CFG = SchedulerConfig(build_vendors(None))
EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "hami" / "sim" / "examples"


def gpu_node(name: str, *mems: int, cpu: str | None = None) -> dict:
    devices = [
        {
            "id": f"GPU-{name}-{i}",
            "index": i,
            "count": 10,
            "devmem": mem,
            "devcore": 100,
            "type": "NVIDIA-A10",
            "mode": "hami-core",
            "health": True,
        }
        for i, mem in enumerate(mems)
    ]
    doc: dict = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                "hami.io/node-nvidia-register": json.dumps(devices),
                "hami.io/node-handshake": "Requesting_2099-11-21 22:00:00",
            },
        },
    }
    if cpu is not None:
        doc["status"] = {"allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"}}
    return doc


def gpu_pod(name: str, ns: str, mem: int, gpus: int = 1, cpu: str | None = None, delete: bool = False) -> dict:
    resources: dict = {"limits": {"nvidia.com/gpu": gpus, "nvidia.com/gpumem": mem}}
    if cpu is not None:
        resources["requests"] = {"cpu": cpu}
    meta: dict = {"name": name, "namespace": ns}
    if delete:
        meta["deletionTimestamp"] = "2026-11-21T22:30:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "x", "resources": resources}]},
    }


def quota(ns: str, hard: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "q", "namespace": ns},
        "spec": {"hard": hard},
    }


def by_name(result) -> dict:
    return {f"{p.namespace}/{p.name}": p for p in result.pods}


def reasons_at_the_end(result) -> dict[str, dict[str, str]]:
    """Each pending pod's reasons as HAMi's Filter gives them against the report's final ledger."""
    out = {}
    for p in result.pods:
        if p.status == "pending":
            admitted, _ = admit_pod(result.objects[f"{p.namespace}/{p.name}"], CFG.vendors)
            fit = filter_pod(admitted, None, result.ledger, CFG, 0.0)
            assert fit.node is None, f"{p.namespace}/{p.name} fits {fit.node} at the end but is shown pending"
            out[f"{p.namespace}/{p.name}"] = fit.reasons()
    return out


PODS5 = [gpu_pod("holder", "b", 20000), gpu_pod("waiter", "a", 20000), gpu_pod("holder", "b", 20000, delete=True)]


def test_pods5_the_waiter_is_placed_when_the_holder_is_deleted():
    """Found by review, 1 Dec (pods5.yaml): waiter stayed pending beside the GPU holder's deletion freed."""
    result = simulate([gpu_node("n1", 24000)], PODS5, CFG)
    pods = by_name(result)
    assert pods["b/holder"].status == "deleted"
    waiter = pods["a/waiter"]
    assert (waiter.status, waiter.node, waiter.reasons) == ("scheduled", "n1", {})
    assert [(d["uuid"], d["usedmem"]) for c in waiter.containers for d in c["devices"]] == [("GPU-n1-0", 20000)]
    assert "document 3" in waiter.note and "deleted b/holder" in waiter.note
    assert [(d["used"], d["usedmem"]) for d in result.devices] == [(1, 20000)]
    assert not pods["b/holder"].note


def test_retried_in_arrival_order_and_the_one_left_gets_the_final_reasons():
    """Found by review, 1 Dec: two pods wait for one GPU; the deletion places the first to arrive
    (not the first by name), and the other's reasons are those of the GPU as it is then."""
    docs = [
        gpu_pod("holder", "b", 20000),
        gpu_pod("z-first", "a", 20000),
        gpu_pod("a-second", "a", 20000),
        gpu_pod("holder", "b", 20000, delete=True),
    ]
    result = simulate([gpu_node("n1", 24000)], docs, CFG)
    pods = by_name(result)
    assert (pods["a/z-first"].status, pods["a/z-first"].node) == ("scheduled", "n1")
    assert pods["a/a-second"].status == "pending"
    assert pods["a/a-second"].reasons == {"n1": "1/1 CardInsufficientMemory"}
    assert reasons_at_the_end(result) == {"a/a-second": pods["a/a-second"].reasons}


def test_a_pod_that_still_does_not_fit_has_the_reasons_of_the_final_ledger():
    """Found by review, 1 Dec: a 2-GPU pod tried when one GPU was free kept
    "1/2 AllocatedCardsInsufficientRequest, 1/2 CardInsufficientMemory" after later pods filled
    that GPU (and after a deletion that freed too little)."""
    docs = [
        gpu_pod("first", "b", 20000),
        gpu_pod("pair", "a", 10000, gpus=2),
        gpu_pod("second", "b", 16000),
        gpu_pod("small", "b", 2000),
        gpu_pod("small", "b", 2000, delete=True),  # frees 2000 MiB: not enough for pair
    ]
    result = simulate([gpu_node("n1", 24000, 24000)], docs, CFG)
    pods = by_name(result)
    assert pods["a/pair"].status == "pending"
    assert pods["a/pair"].reasons == {"n1": "2/2 CardInsufficientMemory"}
    assert reasons_at_the_end(result) == {"a/pair": pods["a/pair"].reasons}


def test_the_bundled_examples_pending_reasons_agree_with_its_final_ledger():
    """Found by review, 1 Dec: the H100 jobs read 2/8 AllocatedCardsInsufficientRequest,
    6/8 CardInsufficientMemory against a final ledger where no H100 has their memory."""
    nodes = list(yaml.safe_load_all((EXAMPLES / "nodes.yaml").read_text()))
    pods = list(yaml.safe_load_all((EXAMPLES / "pods.yaml").read_text()))
    result = simulate(nodes, pods, CFG)
    pending = {f"{p.namespace}/{p.name}": p.reasons for p in result.pods if p.status == "pending"}
    assert pending and reasons_at_the_end(result) == pending
    assert pending["training/train-gpt-8x-h100"]["gpu-h100-01"] == "8/8 CardInsufficientMemory"


def test_a_freed_cpu_share_retries_the_pod_kube_scheduler_refused():
    """Found by review, 1 Dec: a pod refused by NodeResourcesFit (Insufficient cpu) stayed pending
    after the deletion of the pod that held the cpu."""
    docs = [
        gpu_pod("holder", "b", 1000, cpu="6"),
        gpu_pod("waiter", "a", 1000, cpu="6"),
        gpu_pod("holder", "b", 1000, cpu="6", delete=True),
    ]
    result = simulate([gpu_node("n1", 24000, cpu="8")], docs, CFG)
    assert (by_name(result)["a/waiter"].status, by_name(result)["a/waiter"].node) == ("scheduled", "n1")


def test_a_denied_pod_stays_denied_and_the_quota_counts_a_retried_pod_once():
    """Found by review, 1 Dec: a retry must not admit again. A pod the API server's quota
    (requests.nvidia.com/gpu) or the webhook's (limits.nvidia.com/gpumem) refused is never
    placed, and a pending pod placed on retry is counted once."""
    docs = [
        quota("a", {"requests.nvidia.com/gpu": "1"}),
        quota("c", {"limits.nvidia.com/gpumem": "20000"}),
        gpu_pod("holder", "b", 20000, gpus=2),  # 20000 of both GPUs
        gpu_pod("hog", "c", 4000),
        gpu_pod("waiter", "a", 20000),  # pending, counted by a's quota: 1 of 1
        gpu_pod("over", "a", 1000),  # refused by the API server: 1 + 1 > 1
        gpu_pod("greedy", "c", 20000),  # refused by the webhook: c has 16000 MiB left
        gpu_pod("holder", "b", 20000, gpus=2, delete=True),  # waiter placed
        gpu_pod("hog", "c", 4000, delete=True),  # room (and a GPU) for greedy, were it retried
        gpu_pod("late", "a", 1000),  # waiter counted once: still 1 of 1
        gpu_pod("waiter", "a", 20000, delete=True),
        gpu_pod("last", "a", 1000),  # waiter gone: 0 of 1
    ]
    result = simulate([gpu_node("n1", 24000, 24000)], docs, CFG)
    pods = by_name(result)
    assert pods["a/waiter"].status == "deleted" and pods["a/waiter"].note  # placed on retry, then deleted
    assert pods["a/over"].status == "denied" and "apiserver" in pods["a/over"].reasons
    assert pods["c/greedy"].status == "denied" and "webhook" in pods["c/greedy"].reasons
    assert pods["a/late"].status == "denied"
    assert "used: requests.nvidia.com/gpu=1," in pods["a/late"].reasons["apiserver"]
    assert pods["a/last"].status == "scheduled"


def test_same_input_same_report(tmp_path, capsys):
    """Found by review, 1 Dec: the retry keeps the report deterministic (pods5, and the example)."""
    nodes, pods = tmp_path / "nodes.yaml", tmp_path / "pods.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [gpu_node("n1", 24000)]}))
    pods.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": PODS5}))

    def run(*args: str) -> str:
        assert main(["simulate", *args]) == 0
        return capsys.readouterr().out

    first = run("--nodes", str(nodes), "--pods", str(pods), "-o", "json")
    assert first == run("--nodes", str(nodes), "--pods", str(pods), "-o", "json")
    assert {p["name"]: p["status"] for p in json.loads(first)["pods"]} == {"holder": "deleted", "waiter": "scheduled"}
    table = run("--nodes", str(nodes), "--pods", str(pods))
    assert "pending" not in table and table == run("--nodes", str(nodes), "--pods", str(pods))
    assert run() == run()


def dumped(pod: dict) -> dict:
    """``pod`` as a dump gives it: it exists already (pending), the webhook saw it at its creation."""
    pod["status"] = {"phase": "Pending"}
    pod["metadata"]["creationTimestamp"] = "2026-11-21T22:00:00Z"
    return pod


def pooled(node: dict, pool: str) -> dict:
    node["metadata"]["labels"] = {"pool": pool}
    return node


def in_pool(pod: dict, pool: str) -> dict:
    pod["spec"]["nodeSelector"] = {"pool": pool}
    return pod


def test_a_deleted_grant_retries_its_namespaces_quota_bound_pods_on_every_node():
    """Found by review, 1 Dec: a pod held back by its namespace's quota (ResourceQuotaNotFit) on
    node n2 is placed there when a grant of its namespace on n1 is deleted."""
    docs = [
        quota("a", {"limits.nvidia.com/gpumem": "20000"}),
        in_pool(gpu_pod("first", "a", 20000), "one"),
        dumped(in_pool(gpu_pod("second", "a", 10000), "two")),
        gpu_pod("first", "a", 20000, delete=True),
    ]
    nodes = [pooled(gpu_node("n1", 24000), "one"), pooled(gpu_node("n2", 24000), "two")]
    pods = by_name(simulate(nodes, docs, CFG))
    assert (pods["a/second"].status, pods["a/second"].node) == ("scheduled", "n2")
    assert "deleted a/first" in pods["a/second"].note
    # without the deletion it waits at Filter for the quota
    pods = by_name(simulate(nodes, docs[:3], CFG))
    assert pods["a/second"].status == "pending" and "ResourceQuotaNotFit" in pods["a/second"].reasons["n2"]


def test_a_quota_raised_later_places_the_pod_on_the_last_retry():
    """Found by review, 1 Dec: a pod held back by its namespace's quota stayed pending with
    ResourceQuotaNotFit after a later ResourceQuota gave the room (kube-scheduler retries it)."""
    docs = [
        quota("a", {"limits.nvidia.com/gpumem": "20000"}),
        gpu_pod("first", "a", 20000),
        dumped(gpu_pod("second", "a", 10000)),
        quota("a", {"limits.nvidia.com/gpumem": "40000"}),
    ]
    pods = by_name(simulate([gpu_node("n1", 24000), gpu_node("n2", 24000)], docs, CFG))
    assert pods["a/second"].status == "scheduled" and "the end of pods" in pods["a/second"].note


def test_deletions_in_a_row_retry_once_on_every_node_they_free():
    """Found by review, 1 Dec: two holders deleted one after the other free a GPU each; the two
    waiters are placed, the note naming the deletions."""
    docs = [
        gpu_pod("h1", "b", 20000),
        gpu_pod("h2", "b", 20000),
        gpu_pod("w1", "a", 20000),
        gpu_pod("w2", "a", 20000),
        gpu_pod("h1", "b", 20000, delete=True),
        gpu_pod("h2", "b", 20000, delete=True),
    ]
    result = simulate([gpu_node("n1", 24000), gpu_node("n2", 24000)], docs, CFG)
    pods = by_name(result)
    assert {pods["a/w1"].node, pods["a/w2"].node} == {"n1", "n2"}
    assert "document 5 deleted b/h1 and 1 more pod up to document 6" in pods["a/w1"].note
    assert sorted((d["node"], d["usedmem"]) for d in result.devices) == [("n1", 20000), ("n2", 20000)]


def test_property_pending_reasons_are_those_of_the_final_ledger():
    """Found by review, 1 Dec: whatever the sequence of creations, deletions and quotas, no pod
    shown pending fits the final ledger, and its reasons are HAMi's Filter's against it."""
    import random

    for seed in range(60):
        rnd = random.Random(seed)
        nodes = [gpu_node(f"n{i}", *[rnd.choice([16000, 24000]) for _ in range(rnd.randint(1, 3))]) for i in range(3)]
        docs: list[dict] = []
        live: list[tuple[str, str]] = []
        for k in range(rnd.randint(4, 24)):
            if rnd.random() < 0.3 and live:
                name, ns = live.pop(rnd.randrange(len(live)))
                docs.append(gpu_pod(name, ns, 1, delete=True))
            elif rnd.random() < 0.08:
                docs.append(quota(rnd.choice("ab"), {"limits.nvidia.com/gpumem": str(rnd.choice([20000, 60000]))}))
            else:
                ns = rnd.choice("abc")
                pod = gpu_pod(f"p{k}", ns, rnd.choice([4000, 8000, 12000, 20000]), gpus=rnd.choice([1, 1, 2]))
                docs.append(dumped(pod) if rnd.random() < 0.2 else pod)
                live.append((f"p{k}", ns))
        result = simulate(nodes, docs, CFG)
        pending = {f"{p.namespace}/{p.name}": p.reasons for p in result.pods if p.status == "pending"}
        assert reasons_at_the_end(result) == pending, seed
