"""The node monitor's own DaemonSet and identity, rendered with `helm template` (and its RBAC
against the real API server):

- `hami monitor` reads region files that tenant containers write, so it runs in a DaemonSet of
  its own (``<release>-vgpu-monitor``) under a ServiceAccount of its own, never in the device
  plugin's pod (whose ServiceAccount patches nodes and pods);
- that ServiceAccount's ClusterRole holds exactly what the monitor calls: ``list`` on pods (one
  paged, field-selected list of its node's pods), no write verb, no other resource;
- the monitor still lands where the device plugin does (same nodes, tolerations, runtime class,
  pull secrets), with the user's ``devicePlugin.monitor.*`` values, the regions' hostPath, the
  web UI's hostPort, and the metrics Service and ServiceMonitor pointing at its pods;
- ``devicePlugin.monitor.enabled=false`` (or ``devicePlugin.enabled=false``) renders none of it.
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
from .test_chart import CHART

pytestmark = pytest.mark.integration

NAME = "hami-vgpu-monitor"
PLUGIN = "hami-device-plugin"


def _monitor_objects(docs: dict) -> set[tuple[str, str]]:
    """Every object of the monitor: its own, and the metrics Service/ServiceMonitor."""
    return {
        key
        for key, d in docs.items()
        if key[1] in (NAME, f"{PLUGIN}-monitor")
        or d.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component") == "hami-vgpu-monitor"
    }


def test_the_monitor_is_a_daemonset_of_its_own_with_its_own_service_account(helm_bin):
    docs = render(helm_bin)
    assert_own_daemonset_and_account(docs, NAME, beside=PLUGIN)
    # its pods are its own: the device plugin's selector does not pick them, nor the other way round
    mine = docs[("DaemonSet", NAME)]["spec"]["selector"]["matchLabels"]
    theirs = docs[("DaemonSet", PLUGIN)]["spec"]["selector"]["matchLabels"]
    assert not mine.items() <= pod_labels(docs, PLUGIN).items()
    assert not theirs.items() <= pod_labels(docs, NAME).items()


def test_the_monitor_may_only_list_pods(helm_bin):
    """Exactly the one call of src/hami/monitor/kube.py (list_pod_for_all_namespaces): no write
    verb, no get or watch, no resource but pods."""
    assert_lists_pods_only(render(helm_bin)[("ClusterRole", NAME)]["rules"])
    # the RBAC file says why for every rule, as the other components' do
    lines = (CHART / "templates" / "monitor" / "rbac.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("- apiGroups:"):
            assert lines[i - 1].strip().startswith("#"), f"rule without a comment: line {i + 1}"


def test_the_monitor_is_trusted_by_no_guard(helm_bin):
    """A read-only identity: the allocation guard's trusted writers never include it."""
    docs = render(helm_bin)
    guard = docs[("ValidatingAdmissionPolicy", "hami-allocation-guard")]
    assert f"system:serviceaccount:gpu:{NAME}" not in json.dumps(guard)
    assert f"system:serviceaccount:gpu:{PLUGIN}" in json.dumps(guard)


def test_the_device_plugin_pod_has_no_monitor(helm_bin):
    docs = render(helm_bin, "scheduler.ui.enabled=true")
    pod = pod_spec(docs, PLUGIN)
    assert [c["name"] for c in pod["containers"]] == ["device-plugin"]
    assert not [c for c in pod["containers"] if c["command"][:2] == ["hami", "monitor"]]
    # nor the monitor's mount or port: the regions' directory and the UI's hostPort left with it
    assert "containers" not in {v["name"] for v in pod["volumes"]}
    assert not [p for c in pod["containers"] for p in c.get("ports") or ()]


@pytest.mark.parametrize(
    "sets",
    [
        ("devicePlugin.monitor.enabled=false",),
        ("devicePlugin.enabled=false",),
        ("devicePlugin.monitor.enabled=false", "prometheus.enabled=true", "scheduler.ui.enabled=true"),
    ],
)
def test_no_monitor_objects_when_the_monitor_is_off(helm_bin, sets):
    docs = render(helm_bin, *sets)
    assert _monitor_objects(docs) == set()
    assert "vgpu-monitor" not in yaml.safe_dump_all(list(docs.values()))


def test_the_monitor_lands_on_the_device_plugins_nodes_with_the_users_values(helm_bin, tmp_path):
    values = {
        "global": {"gpuHookPath": "/opt/gpu", "imagePullSecrets": ["regcred"]},
        "legacyMetrics": True,
        "resourcePriority": "example.com/gpu-priority",
        "scheduler": {"ui": {"enabled": True}},
        "devicePlugin": {
            "runtimeClassName": "nvidia",
            "hostPID": True,
            "nvidiaNodeSelector": {"accelerator": "nvidia"},
            "tolerations": [{"key": "gpu-only", "operator": "Exists"}],
            "podAnnotations": {"example.com/team": "gpu"},
            "updateStrategy": {"type": "OnDelete", "rollingUpdate": None},
            "driverMounts": [{"hostPath": "/home/kubernetes/bin/nvidia", "containerPath": "/usr/local/nvidia"}],
            "monitor": {
                "image": {"registry": "reg.example", "repository": "me/monitor", "tag": "v9", "pullPolicy": "Always"},
                "metricsPort": 9500,
                "ctrPath": "/opt/gpu/vgpu/containers",
                "priorityBlocking": True,
                "resyncInterval": "2m",
                "extraArgs": ["--interval=10s"],
                "extraEnvs": {"HAMI_EXAMPLE": "1"},
                "resources": {"limits": {"memory": "256Mi"}},
            },
        },
    }
    docs = render_values(helm_bin, values, tmp_path)
    ds, plugin = docs[("DaemonSet", NAME)], pod_spec(docs, PLUGIN)
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    # the device plugin's pod-level settings, the same on both DaemonSets
    for key in ("nodeSelector", "tolerations", "runtimeClassName", "priorityClassName", "hostPID"):
        assert pod[key] == plugin[key], key
    assert pod["nodeSelector"] == {"gpu": "on", "accelerator": "nvidia"} and pod["runtimeClassName"] == "nvidia"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["hostPID"] is True
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"} == docs[("DaemonSet", PLUGIN)]["spec"]["updateStrategy"]
    assert ds["spec"]["template"]["metadata"]["annotations"] == {"example.com/team": "gpu"}
    # devicePlugin.monitor.*
    assert c["image"] == "reg.example/me/monitor:v9" and c["imagePullPolicy"] == "Always"
    assert c["command"] == [
        "hami",
        "monitor",
        "--metrics-bind-address=:9500",
        "--legacy-metrics",
        "--priority-blocking",
        "--priority-resource=example.com/gpu-priority",
        "--interval=10s",
    ]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HOOK_PATH"] == "/opt/gpu/vgpu" and env["HAMI_RESYNC_INTERVAL"] == "2m"
    assert env["HAMI_EXAMPLE"] == "1" and env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert c["resources"] == {"limits": {"memory": "256Mi"}}
    # the web UI reads each node's own monitor through the hostPort
    assert c["ports"] == [{"name": "metrics", "containerPort": 9500, "hostPort": 9500}]
    # the regions' directory and the driver, nothing else of the host
    assert c["volumeMounts"] == [
        {"name": "containers", "mountPath": "/opt/gpu/vgpu/containers"},
        {"name": "driver-0", "mountPath": "/usr/local/nvidia", "readOnly": True},
    ]
    assert pod["volumes"] == [
        {"name": "containers", "hostPath": {"path": "/opt/gpu/vgpu/containers", "type": "DirectoryOrCreate"}},
        {"name": "driver-0", "hostPath": {"path": "/home/kubernetes/bin/nvidia", "type": "Directory"}},
    ]
    assert_hardened(c, removes_trees=True)  # it removes the regions of containers gone


def test_the_metrics_service_and_service_monitor_select_the_monitors_pods(helm_bin):
    docs = render(helm_bin, "prometheus.enabled=true")
    labels, plugin_labels = pod_labels(docs, NAME), pod_labels(docs, PLUGIN)
    svc = docs[("Service", f"{PLUGIN}-monitor")]  # HAMi's Service name, kept
    assert svc["spec"]["selector"].items() <= labels.items()
    assert not svc["spec"]["selector"].items() <= plugin_labels.items()
    assert svc["spec"]["ports"] == [{"name": "monitor", "port": 9394, "targetPort": "metrics", "nodePort": 31992}]
    # the ServiceMonitor picks that Service, and only that Service of the chart's
    assert_service_monitor_picks_only(docs, f"{PLUGIN}-monitor")


def test_the_monitors_own_pod_list_works_with_its_role_and_nothing_else_does(
    kube_cluster, helm_bin, kube_namespace, tmp_path
):
    """Against the real API server: the monitor's RBAC applied, a token of its ServiceAccount
    bound to a pod, and the monitor's own code (hami.monitor.kube.node_pods) listing its node's
    pods; every other call it might be tricked into (get, watch, patch a pod, read or patch a
    node, create an Event) is refused."""
    ns, release = kube_namespace, f"m{uuid.uuid4().hex[:6]}"
    account = f"{release}-hami-vgpu-monitor"
    rbac = monitor_rbac(helm_bin, release, ns)
    with monitor_on_node(kube_cluster, rbac, ns, release, account, tmp_path / "monitor.kubeconfig") as monitor:
        assert {p.name for p in monitor.listed()} == {"monitor", "tenant"}
        patch = {"metadata": {"annotations": {"hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1000,10:;"}}}
        monitor.refused_all_but_its_list(patch)
        monitor.refused(
            "PATCH", f"/api/v1/nodes/{monitor.node}", {"metadata": {"annotations": {"hami.io/node-handshake": "x"}}}
        )
        tenant = kube_cluster.api("GET", f"{monitor.pods}/tenant")["metadata"]
        assert "hami.io/vgpu-devices-allocated" not in (tenant.get("annotations") or {})
