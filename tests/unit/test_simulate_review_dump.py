"""``hami simulate`` on what ``kubectl get`` prints: a quota listed after the pods it should
have held back says so."""

from __future__ import annotations

import json

from .test_simulate import node_doc, pod_doc, sim, write

QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "gpu", "namespace": "ml"},
    "spec": {"hard": {"limits.nvidia.com/gpumem": "10000"}},
}


def test_a_quota_listed_after_the_pods_it_limits_is_warned_about(tmp_path, capsys):
    # kubectl get pods,resourcequotas -A -o yaml: every pod first, then the quotas
    big = pod_doc("big", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12000"}, ns="ml")
    nodes = write(tmp_path, "nodes.yaml", [node_doc("n1")])
    pods = write(tmp_path, "pods.yaml", [big, QUOTA], as_list=True)
    code, out, err = sim(capsys, "--nodes", nodes, "--pods", pods, "-o", "json")
    assert code == 0
    assert [p["status"] for p in json.loads(out)["pods"]] == ["scheduled"]  # as the file says
    assert "document 1 item 2 (ResourceQuota ml/gpu): comes after pods of namespace ml placed without it (big)" in err
    assert "kubectl get resourcequotas,pods" in err
    # listed first, it holds the pod back, and nothing is said
    pods = write(tmp_path, "pods.yaml", [QUOTA, big], as_list=True)
    code, out, err = sim(capsys, "--nodes", nodes, "--pods", pods, "-o", "json")
    # (the webhook's quota check denies it at admission, as in a cluster; it read 'pending' on
    # Filter's ResourceQuotaNotFit before the admission was given the quota room: review, 1 Dec)
    assert [p["status"] for p in json.loads(out)["pods"]] == ["denied"]
    assert "ResourceQuota" not in err


def test_a_late_quota_of_another_namespace_or_resource_is_not_warned_about(tmp_path, capsys):
    nodes = write(tmp_path, "nodes.yaml", [node_doc("n1")])
    cpu = {**QUOTA, "metadata": {"name": "cpu", "namespace": "ml"}, "spec": {"hard": {"limits.cpu": "4"}}}
    pods = [pod_doc("a", {"nvidia.com/gpu": "1"}, ns="web"), pod_doc("b", {"nvidia.com/gpu": "1"}, ns="ml"), cpu]
    pods_file = write(tmp_path, "pods.yaml", [pods[0], QUOTA])
    code, _, err = sim(capsys, "--nodes", nodes, "--pods", pods_file)
    assert code == 0 and "ResourceQuota" not in err
    code, _, err = sim(capsys, "--nodes", nodes, "--pods", write(tmp_path, "pods2.yaml", pods))
    assert code == 0 and "ResourceQuota" not in err


def test_the_cpu_nodes_of_a_cluster_are_one_warning(tmp_path, capsys):
    # kubectl get nodes -o yaml of a cluster with 300 CPU nodes printed 300 warnings
    bare = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"cpu-{i}"}} for i in range(300)]
    nodes = write(tmp_path, "nodes.yaml", [node_doc("n1"), *bare], as_list=True)
    pods = write(tmp_path, "pods.yaml", [pod_doc("a", {"nvidia.com/gpu": "1"})])
    code, _, err = sim(capsys, "--nodes", nodes, "--pods", pods)
    assert code == 0
    assert err.splitlines() == [
        "hami simulate: warning: skipping 300 nodes (cpu-0, cpu-1, cpu-2 and 297 more): no device "
        "registration annotation (hami.io/node-nvidia-register)"
    ]
