"""``hami explain`` as an on-call engineer reads it, on clusters with more than one kind of node.

Each test is a case where the text was untrue or not actionable: a node kube-scheduler never
offers the pod (node selector, affinity, taint, cordon) named as where it "would" go, thousands
of nodes printed one by one with no count per reason, nodes whose registration cannot be read or
whose device plugin stopped answering lumped with nodes that have no GPU, the events of an
earlier pod of the same name shown as this pod's, and a refused read crashing with a traceback.
"""

from __future__ import annotations

import argparse

from hami.core import DeviceInfo, SchedulerConfig, encode_node_devices_json
from hami.kube.client import KubeError
from hami.scheduler import explain
from hami.scheduler.explain import render
from hami.scheduler.state import ClusterState, handshake_value
from hami.vendors import build_vendors

NOW = 1_795_000_000.0
CFG = SchedulerConfig(build_vendors(), "binpack", "spread")


def node_obj(name: str, gpus: int = 4, mem: int = 16384, model: str = "NVIDIA-Tesla T4", **kw) -> dict:
    devs = [
        DeviceInfo(id=f"GPU-{name}-{i}", index=i, count=10, devmem=mem, devcore=100, type=model, health=True)
        for i in range(gpus)
    ]
    annotations = {"hami.io/node-nvidia-register": encode_node_devices_json(devs), **kw.get("annotations", {})}
    return {
        "metadata": {"name": name, "annotations": annotations, "labels": kw.get("labels", {}), "resourceVersion": "1"},
        "spec": {"taints": kw.get("taints", []), "unschedulable": kw.get("unschedulable", False)},
        "status": {"allocatable": {} if kw.get("stale") else {"nvidia.com/gpu": str(gpus * 10)}},
    }


def pending(name: str = "p", ns: str = "default", limits=None, annotations=None, **spec) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "annotations": dict(annotations or {}),
            "resourceVersion": "5",
        },
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "resources": {"limits": limits or {"nvidia.com/gpu": 1}}}],
            **spec,
        },
        "status": {"phase": "Pending"},
    }


def state_of(*nodes: dict) -> ClusterState:
    state = ClusterState(CFG, "hami-scheduler", clock=lambda: NOW)
    state.node_handler.replace(list(nodes))
    return state


# ------------------------------------------------------------------ kube-scheduler's own filters


def mixed() -> ClusterState:
    return state_of(
        node_obj("a100", gpus=2, mem=40960, model="NVIDIA-A100-PCIE-40GB"),
        node_obj(
            "h100",
            gpus=8,
            mem=81559,
            model="NVIDIA-H100-80GB",
            taints=[{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}],
        ),
        node_obj("t4-batch", labels={"pool": "batch"}),
        node_obj("t4-drained", labels={"pool": "batch"}, unschedulable=True),
    )


def test_a_node_the_pods_node_selector_excludes_is_not_where_it_would_go():
    p = pending(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}, nodeSelector={"pool": "batch"})
    out = render(p, mixed(), [], NOW)
    # the GPUs of a100 and h100 would take it, but kube-scheduler never offers it those nodes
    assert "would choose" not in out
    assert "It fits on none of the 1 nodes with devices kube-scheduler offers it (3 more are left out" in out
    assert "Its devices would fit on 2 node(s) kube-scheduler leaves out: a100, h100" in out
    assert (
        "node a100: left out by kube-scheduler: node(s) didn't match Pod's node affinity/selector; its devices: fit"
        in out
    )
    assert (
        "node h100: left out by kube-scheduler: node(s) had untolerated taint {dedicated: llm}; its devices: fit" in out
    )
    assert (
        "node t4-drained: left out by kube-scheduler: node(s) were unschedulable; its devices: 4/4 CardInsufficientMemory"
        in out
    )
    assert "node t4-batch: 4/4 CardInsufficientMemory (container #0)" in out


def test_a_toleration_and_affinity_bring_the_node_back():
    p = pending(
        limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 60000},
        tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["h100"]}]}
                    ]
                }
            }
        },
    )
    out = render(p, mixed(), [], NOW)
    assert "It fits now: the scheduler would choose node h100" in out


def test_an_unreadable_node_affinity_is_said_and_every_node_offered():
    p = pending(nodeSelector={"pool": "batch"}, tolerations=[{"key": "k", "operator": "Bogus"}])
    out = render(p, mixed(), [], NOW)
    assert (
        "kube-scheduler's node filters are not applied: spec.tolerations[0].operator: 'Bogus' is not one of Equal, Exists"
        in out
    )
    assert "It fits now: the scheduler would choose node" in out


# ------------------------------------------------------------------ 5000 nodes


def test_five_thousand_nodes_are_counted_per_reason_and_the_text_stays_bounded():
    nodes = [node_obj(f"node-{i:04d}", gpus=8 if i % 5 else 4) for i in range(5000)]
    nodes += [{"metadata": {"name": f"cpu-{i:04d}", "resourceVersion": "1"}} for i in range(300)]
    state = state_of(*nodes)
    out = render(pending(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}), state, [], NOW)
    lines = out.splitlines()
    assert len(lines) < 400, len(lines)
    assert "It fits on none of the 5000 nodes with devices:" in out
    assert "  4000 nodes: 8/8 CardInsufficientMemory" in out
    assert "  1000 nodes: 4/4 CardInsufficientMemory" in out
    assert "4980 more nodes not shown" in out
    assert "... and 280 more" in out  # the GPU-less nodes: how many, not a bare "..."


# ------------------------------------------------------------------ nodes whose devices are ignored


def test_unreadable_and_expired_registrations_are_told_apart_from_gpu_less_nodes():
    bad = node_obj("bad")
    bad["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "[{garbage"
    stale = node_obj("stale", stale=True, annotations={"hami.io/node-handshake": handshake_value(NOW - 600)})
    cpu = {"metadata": {"name": "cpu-1", "resourceVersion": "1"}}
    out = render(pending(), state_of(node_obj("ok"), bad, stale, cpu), [], NOW)
    assert "nodes whose device registration cannot be read (their devices are ignored): bad (NVIDIA: " in out
    assert "not valid JSON" in out
    assert (
        "nodes whose device plugin stopped answering (their devices are ignored): stale "
        "(NVIDIA: handshake hami.io/node-handshake Requesting_" in out
    )
    assert "nodes without registered devices (ignored): cpu-1" in out


# ------------------------------------------------------------------ events


def test_events_of_an_earlier_pod_of_the_same_name_are_not_this_pods():
    old = {"reason": "FilteringFailed", "message": "OLD", "involvedObject": {"kind": "Pod", "name": "p", "uid": "old"}}
    job = {"reason": "FailedScheduling", "message": "JOB", "involvedObject": {"kind": "Job", "name": "p"}}
    mine = {
        "reason": "FilteringFailed",
        "message": "MINE",
        "involvedObject": {"kind": "Pod", "name": "p", "uid": "uid-p"},
    }
    out = render(pending(), state_of(node_obj("n1")), [old, job, mine], NOW)
    assert "FilteringFailed: MINE" in out
    assert "OLD" not in out and "JOB" not in out


# ------------------------------------------------------------------ a refused read


class Refusing:
    """A client for an identity that may read its own pod but not the cluster's."""

    def __init__(self, pod: dict) -> None:
        self._pod = pod

    @classmethod
    async def connect(cls, kubeconfig):
        return cls(pending())

    async def get(self, path: str) -> dict:
        if path.startswith("/api/v1/namespaces/"):
            return self._pod
        raise KubeError("GET", path, 403, '{"message": "forbidden"}')

    async def close(self) -> None:
        pass


def test_a_forbidden_cluster_read_is_one_line_not_a_traceback(monkeypatch, capsys):
    from hami.kube import client

    monkeypatch.setattr(client, "KubeClient", Refusing)
    parser = argparse.ArgumentParser()
    explain.add_arguments(parser)
    assert explain.run(parser.parse_args(["team/p"])) == 1
    err = capsys.readouterr().err
    assert "hami explain: GET /api/v1/nodes: HTTP 403: forbidden" in err
    assert "list" in err and "Traceback" not in err


def test_devices_held_back_for_an_unreadable_grant_say_by_whom():
    """A running pod whose allocation cannot be read has its node's NVIDIA devices cordoned (the
    scheduler cannot name the GPUs it holds); explain said only CardCordoned, which reads like
    hami.io/device-cordon: it names the pod and why."""
    state = state_of(node_obj("n1", gpus=1))
    running = pending(
        "old", annotations={"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": "GPU-n1-0,NVIDIA,x,0:;"}
    )
    running["spec"]["nodeName"] = "n1"
    running["status"]["phase"] = "Running"
    state.pod_handler.replace([running])
    out = render(pending(), state, [], NOW)
    assert "CardCordoned" in out
    assert "NVIDIA devices held back: running pod default/old's allocation cannot be read" in out, out
