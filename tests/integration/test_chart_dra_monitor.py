"""The DRA front end's node monitor in a DaemonSet and identity of its own, rendered with `helm
template` (and its RBAC and metrics Service against the real API server):

- `hami monitor` parses the claims' region files that tenant containers write, so with
  ``dra.enabled`` it runs in a DaemonSet of its own (``<release>-dra-monitor``) under a
  ServiceAccount of its own, never in the DRA agent's pod (whose ServiceAccount writes
  ResourceSlices and reads claims and nodes);
- that ServiceAccount's ClusterRole holds exactly what the monitor calls on this front end too:
  ``list`` on pods (its node's, which also say which pod uses each claim), no write verb, no
  ResourceClaim or any other resource; and the agent's role lost the rule it held for the monitor;
- the monitor lands where the agent does (same nodes, tolerations, pull secrets, image), with the
  ``dra.monitor.*`` values, the claims' hostPath only, and the headless Service
  ``<release>-dra-monitor`` and its ServiceMonitor reaching both its pods (port ``monitor``) and the
  agent's (port ``agent-metrics``);
- ``dra.monitor.enabled=false`` (or ``dra.enabled=false``) renders none of it.
"""

from __future__ import annotations

import json
import uuid

import pytest
import yaml

from ._monitor_chart import (
    assert_hardened,
    assert_lists_pods_only,
    assert_own_daemonset_and_account,
    assert_service_monitor_picks_only,
    monitor_on_node,
    monitor_rbac,
    pod_labels,
    pod_spec,
    render,
    render_values,
)

pytestmark = pytest.mark.integration

NAME = "hami-dra-monitor"
AGENT = "hami-dra"
EXTENDER_MONITOR = "hami-vgpu-monitor"
#: the DRA front end alone, as a DRA cluster installs it (one node agent per node)
DRA = ("frontEnd=dra", "dra.enabled=true", "devicePlugin.enabled=false")


def _port_names(docs: dict, name: str) -> set[str]:
    return {p["name"] for c in pod_spec(docs, name)["containers"] for p in c.get("ports") or ()}


def test_the_dra_monitor_is_a_daemonset_of_its_own_with_its_own_service_account(helm_bin):
    assert_own_daemonset_and_account(render(helm_bin, *DRA), NAME, beside=AGENT)


def test_each_daemonset_picks_its_own_pods_beside_the_extenders_monitor(helm_bin):
    """With both front ends' agents in one release (on different nodes), the two monitors, the
    agent and the device plugin are four DaemonSets whose selectors never pick another's pods."""
    docs = render(helm_bin, "dra.enabled=true")
    daemonsets = {name: d for (kind, name), d in docs.items() if kind == "DaemonSet"}
    assert set(daemonsets) == {"hami-device-plugin", EXTENDER_MONITOR, AGENT, NAME}
    for name, d in daemonsets.items():
        selector = d["spec"]["selector"]["matchLabels"]
        picked = [n for n, o in daemonsets.items() if selector.items() <= pod_labels(docs, n).items()]
        assert picked == [name], (name, picked)
    assert pod_spec(docs, NAME)["serviceAccountName"] != pod_spec(docs, EXTENDER_MONITOR)["serviceAccountName"]


def test_the_dra_monitor_may_only_list_pods_and_the_agent_no_longer_may(helm_bin):
    """Exactly the one call of src/hami/monitor/kube.py (list_pod_for_all_namespaces, which also
    names each claim's users): no write verb, no get or watch, no resourceclaims, nothing else."""
    docs = render(helm_bin, *DRA)
    assert_lists_pods_only(docs[("ClusterRole", NAME)]["rules"])
    # the agent reads no pods (src/hami/draplugin): the rule it held for the monitor is gone
    agent = docs[("ClusterRole", AGENT)]["rules"]
    assert not [r for r in agent if "pods" in r["resources"]]
    assert agent == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["get", "list", "watch", "create", "patch", "delete"],
        },
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    ]


def test_the_dra_monitor_is_trusted_by_no_guard(helm_bin):
    docs = render(helm_bin, *DRA)
    guards = [d for (kind, _), d in docs.items() if kind.startswith("ValidatingAdmissionPolicy")]
    assert guards and f"system:serviceaccount:gpu:{NAME}" not in json.dumps(guards)


def test_the_dra_agent_pod_has_no_monitor(helm_bin):
    docs = render(helm_bin, *DRA, "scheduler.ui.enabled=true")
    pod = pod_spec(docs, AGENT)
    assert [c["name"] for c in pod["containers"]] == ["dra"]
    assert not [c for c in pod["containers"] + pod["initContainers"] if c["command"][:2] == ["hami", "monitor"]]
    # nor the monitor's mount or port: the claims' directory and the metrics port left with it
    assert "claims" not in {v["name"] for v in pod["volumes"]}
    assert _port_names(docs, AGENT) == {"agent-metrics"}


@pytest.mark.parametrize(
    "sets",
    [
        ("dra.monitor.enabled=false",),
        ("dra.monitor.enabled=false", "prometheus.enabled=true", "scheduler.ui.enabled=true"),
        ("dra.enabled=false", "frontEnd=extender"),  # (frontEnd=dra without the driver is refused)
    ],
)
def test_no_dra_monitor_objects_when_the_monitor_is_off(helm_bin, sets):
    docs = render(helm_bin, *DRA, *sets)
    mine = {
        key
        for key, d in docs.items()
        if key[0] not in ("Service", "ServiceMonitor")  # named <release>-dra-monitor for the agent's metrics too
        and (
            key[1] == NAME
            or d.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component") == "hami-dra-monitor"
        )
    }
    assert mine == set()
    assert "vgpu-monitor" not in yaml.safe_dump_all(list(docs.values()))
    # the Service, if any, carries the agent's own metrics alone
    for kind in ("Service", "ServiceMonitor"):
        if (kind, NAME) in docs:
            spec = docs[(kind, NAME)]["spec"]
            assert [p.get("name") or p.get("port") for p in spec.get("ports") or spec["endpoints"]] == ["agent-metrics"]


def test_the_dra_monitor_lands_on_the_agents_nodes_with_the_users_values(helm_bin, tmp_path):
    values = {
        "frontEnd": "dra",
        "global": {"gpuHookPath": "/opt/gpu", "imagePullSecrets": ["regcred"]},
        "legacyMetrics": True,
        "resourcePriority": "example.com/gpu-priority",  # the device plugin's; no DRA claim has one
        "scheduler": {"ui": {"enabled": True}},
        "devicePlugin": {
            "enabled": False,
            "driverMounts": [{"hostPath": "/home/kubernetes/bin/nvidia", "containerPath": "/usr/local/nvidia"}],
        },
        "dra": {
            "enabled": True,
            "image": {"registry": "reg.example", "repository": "me/hami", "tag": "v9", "pullPolicy": "Always"},
            "nodeSelector": {"accelerator": "nvidia"},
            "tolerations": [{"key": "gpu-only", "operator": "Exists"}],
            "monitor": {
                "metricsPort": 9500,
                "extraArgs": ["--interval=10s"],
                "resources": {"limits": {"memory": "256Mi"}},
            },
        },
    }
    docs = render_values(helm_bin, values, tmp_path)
    ds, agent = docs[("DaemonSet", NAME)], pod_spec(docs, AGENT)
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    # the agent's pod-level settings, the same on both DaemonSets
    for key in ("nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets", "securityContext"):
        assert pod[key] == agent[key], key
    assert pod["nodeSelector"] == {"accelerator": "nvidia"}
    assert pod["tolerations"] == [{"key": "gpu-only", "operator": "Exists"}]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["priorityClassName"] == "system-node-critical"
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and "runtimeClassName" not in pod
    assert "updateStrategy" not in ds["spec"] and "updateStrategy" not in docs[("DaemonSet", AGENT)]["spec"]
    assert ds["spec"]["template"]["metadata"]["labels"]["hami.io/webhook"] == "ignore"
    # the agent's image, dra.monitor.*
    (agent_c,) = agent["containers"]
    assert c["image"] == agent_c["image"] == "reg.example/me/hami:v9" and c["imagePullPolicy"] == "Always"
    assert c["command"] == ["hami", "monitor", "--metrics-bind-address=:9500", "--legacy-metrics", "--interval=10s"]
    assert c["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "HOOK_PATH", "value": "/opt/gpu/vgpu"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    ]
    assert c["resources"] == {"limits": {"memory": "256Mi"}}
    # the web UI (on, no device plugin) reads each node's own DRA monitor through the hostPort
    assert c["ports"] == [{"name": "metrics", "containerPort": 9500, "hostPort": 9500}]
    # the claims' regions and records (where the agent writes them) and the driver, nothing else
    assert c["volumeMounts"] == [
        {"name": "claims", "mountPath": "/opt/gpu/vgpu/claims"},
        {"name": "driver-0", "mountPath": "/usr/local/nvidia", "readOnly": True},
    ]
    assert pod["volumes"] == [
        {"name": "claims", "hostPath": {"path": "/opt/gpu/vgpu/claims", "type": "DirectoryOrCreate"}},
        {"name": "driver-0", "hostPath": {"path": "/home/kubernetes/bin/nvidia", "type": "Directory"}},
    ]
    hook = next(v for v in agent["volumes"] if v["name"] == "hook")["hostPath"]["path"]
    assert f"{hook}/claims" == pod["volumes"][0]["hostPath"]["path"]
    assert_hardened(c)


def test_the_metrics_service_and_service_monitor_select_the_dra_monitors_and_agents_pods(helm_bin):
    """One headless Service <release>-dra-monitor (its name kept): port monitor reaches the
    monitor's pods, port agent-metrics the agent's, each through a named port only one kind of
    pod has. With the extender's agents in the same release it picks none of theirs."""
    docs = render(helm_bin, "frontEnd=dra", "dra.enabled=true", "prometheus.enabled=true")
    svc = docs[("Service", NAME)]
    selector = svc["spec"]["selector"].items()
    assert svc["spec"]["clusterIP"] == "None"
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
    assert ports == {"monitor": (9394, "metrics"), "agent-metrics": (9396, "agent-metrics")}
    assert selector <= pod_labels(docs, NAME).items() and selector <= pod_labels(docs, AGENT).items()
    assert "metrics" in _port_names(docs, NAME) and "metrics" not in _port_names(docs, AGENT)
    assert "agent-metrics" in _port_names(docs, AGENT) and "agent-metrics" not in _port_names(docs, NAME)
    for (kind, name), d in docs.items():
        if kind in ("DaemonSet", "Deployment") and name not in (NAME, AGENT):
            assert not selector <= d["spec"]["template"]["metadata"]["labels"].items(), name
    # the ServiceMonitor picks that Service, and of the chart's Services only that one
    sm = assert_service_monitor_picks_only(docs, NAME)
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["monitor", "agent-metrics"]


def test_the_dra_monitors_pod_list_works_with_its_role_and_nothing_else_does(
    kube_cluster, helm_bin, kube_namespace, tmp_path
):
    """Against the real API server: the DRA monitor's RBAC applied, a token of its ServiceAccount
    bound to a pod, and the monitor's own code (hami.monitor.kube.node_pods) listing its node's
    pods, a claim's user among them; every other call (a claim read, a slice write, a node, a pod
    patch, an Event) is refused."""
    ns, release = kube_namespace, f"d{uuid.uuid4().hex[:6]}"
    account = f"{release}-hami-dra-monitor"
    rbac = monitor_rbac(helm_bin, release, ns, *DRA)
    assert {d["metadata"]["name"] for d in rbac} == {account}  # the DRA monitor's alone
    claims = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    kubeconfig = tmp_path / "dra-monitor.kubeconfig"
    with monitor_on_node(kube_cluster, rbac, ns, release, account, kubeconfig, tenant_claim="gpu-claim") as monitor:
        assert {p.name: p.claims for p in monitor.listed()} == {"monitor": (), "tenant": (("gpu-claim", ("c",)),)}
        monitor.refused("GET", f"{claims}/gpu-claim")
        monitor.refused("GET", claims)
        monitor.refused("GET", "/apis/resource.k8s.io/v1/resourceslices")
        monitor.refused(
            "PATCH",
            "/apis/resource.k8s.io/v1/resourceslices/x?fieldManager=m",
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "x"}},
            content_type="application/apply-patch+yaml",
        )
        monitor.refused_all_but_its_list({"metadata": {"labels": {"x": "y"}}})


def test_the_metrics_service_finds_each_port_on_its_own_pods(kube_cluster, helm_bin, kube_namespace):
    """Against the real API server and its EndpointSlice controller: the chart's Service
    <release>-dra-monitor and one pod with each DaemonSet's labels and ports (the monitor's, the
    agent's) on a kwok node; port monitor has the monitor's pod alone, agent-metrics the agent's."""
    ns = kube_namespace
    docs = render(helm_bin, *DRA)
    node = f"m{uuid.uuid4().hex[:6]}-gpu"
    service = docs[("Service", NAME)]
    service["metadata"]["namespace"] = ns
    kube_cluster.create_node(node)
    try:
        kube_cluster.api("POST", f"/api/v1/namespaces/{ns}/services", service)
        ips = {}
        for ds in (NAME, AGENT):
            template = docs[("DaemonSet", ds)]["spec"]["template"]
            containers = [
                {"name": c["name"], "image": "busybox", "ports": c["ports"]}
                for c in template["spec"]["containers"]
                if c.get("ports")
            ]
            kube_cluster.api(
                "POST",
                f"/api/v1/namespaces/{ns}/pods",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": ds, "labels": template["metadata"]["labels"]},
                    "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0, "containers": containers},
                },
            )

        def pod_ips():
            for ds in (NAME, AGENT):
                ips[ds] = kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/{ds}")["status"].get("podIP")
            return all(ips.values())

        kube_cluster.wait_for(pod_ips, "both pods given an IP", timeout=60, interval=0.5)

        def by_port() -> dict[str, set[str]] | None:
            slices = kube_cluster.api(
                "GET",
                f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
                f"?labelSelector=kubernetes.io/service-name={NAME}",
            )["items"]
            out: dict[str, set[str]] = {}
            for s in slices:
                for p in s.get("ports") or ():
                    out.setdefault(p["name"], set()).update(a for e in s.get("endpoints") or () for a in e["addresses"])
            return out if set(out) == {"monitor", "agent-metrics"} else None

        found = kube_cluster.wait_for(by_port, "the Service's EndpointSlices", timeout=60, interval=0.5)
        assert found == {"monitor": {ips[NAME]}, "agent-metrics": {ips[AGENT]}}, (found, ips)
    finally:
        kube_cluster.delete_node(node)
