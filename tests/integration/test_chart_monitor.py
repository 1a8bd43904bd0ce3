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

import asyncio
import json
import uuid

import pytest
import yaml

from hami.monitor.kube import api_client, node_pods

from .test_chart import CHART, KUBE_VERSION, _bearer, _pod_token

pytestmark = pytest.mark.integration

NAME = "hami-vgpu-monitor"
PLUGIN = "hami-device-plugin"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate", "*"}


def _render(helm_bin, *args: str) -> dict[tuple[str, str], dict]:  # noqa: F811
    out = helm_bin("template", "hami", str(CHART), "--namespace", "gpu", "--kube-version", KUBE_VERSION, *args).stdout
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}


def _sets(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


def _pod(docs: dict, name: str) -> dict:
    return docs[("DaemonSet", name)]["spec"]["template"]["spec"]


def _monitor_objects(docs: dict) -> set[tuple[str, str]]:
    """Every object of the monitor: its own, and the metrics Service/ServiceMonitor."""
    return {
        key
        for key, d in docs.items()
        if key[1] in (NAME, f"{PLUGIN}-monitor")
        or d.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component") == "hami-vgpu-monitor"
    }


def test_the_monitor_is_a_daemonset_of_its_own_with_its_own_service_account(helm_bin):
    docs = _render(helm_bin)
    pod = _pod(docs, NAME)
    assert [c["name"] for c in pod["containers"]] == ["vgpu-monitor"]
    assert pod["containers"][0]["command"][:2] == ["hami", "monitor"]
    assert pod["serviceAccountName"] == NAME != _pod(docs, PLUGIN)["serviceAccountName"]
    assert ("ServiceAccount", NAME) in docs
    binding = docs[("ClusterRoleBinding", NAME)]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": "gpu"}]
    # its pods are its own: the device plugin's selector does not pick them, nor the other way round
    mine = docs[("DaemonSet", NAME)]["spec"]["selector"]["matchLabels"]
    theirs = docs[("DaemonSet", PLUGIN)]["spec"]["selector"]["matchLabels"]
    assert not mine.items() <= docs[("DaemonSet", PLUGIN)]["spec"]["template"]["metadata"]["labels"].items()
    assert not theirs.items() <= docs[("DaemonSet", NAME)]["spec"]["template"]["metadata"]["labels"].items()
    # nothing binds the monitor's ServiceAccount to any other role
    for (kind, name), d in docs.items():
        if kind in ("ClusterRoleBinding", "RoleBinding") and name != NAME:
            assert all(s.get("name") != NAME for s in d.get("subjects") or ()), name


def test_the_monitor_may_only_list_pods(helm_bin):
    """Exactly the one call of src/hami/monitor/kube.py (list_pod_for_all_namespaces): no write
    verb, no get or watch, no resource but pods."""
    rules = _render(helm_bin)[("ClusterRole", NAME)]["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert not {v for r in rules for v in r["verbs"]} & WRITE_VERBS
    # the RBAC file says why for every rule, as the other components' do
    lines = (CHART / "templates" / "monitor" / "rbac.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("- apiGroups:"):
            assert lines[i - 1].strip().startswith("#"), f"rule without a comment: line {i + 1}"


def test_the_monitor_is_trusted_by_no_guard(helm_bin):
    """A read-only identity: the allocation guard's trusted writers never include it."""
    docs = _render(helm_bin)
    guard = docs[("ValidatingAdmissionPolicy", "hami-allocation-guard")]
    assert f"system:serviceaccount:gpu:{NAME}" not in json.dumps(guard)
    assert f"system:serviceaccount:gpu:{PLUGIN}" in json.dumps(guard)


def test_the_device_plugin_pod_has_no_monitor(helm_bin):
    docs = _render(helm_bin, *_sets("scheduler.ui.enabled=true"))
    pod = _pod(docs, PLUGIN)
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
    docs = _render(helm_bin, *_sets(*sets))
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
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    docs = _render(helm_bin, "-f", str(path))
    ds, plugin = docs[("DaemonSet", NAME)], _pod(docs, PLUGIN)
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
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged")


def test_the_metrics_service_and_service_monitor_select_the_monitors_pods(helm_bin):
    docs = _render(helm_bin, *_sets("prometheus.enabled=true"))
    labels = docs[("DaemonSet", NAME)]["spec"]["template"]["metadata"]["labels"]
    plugin_labels = docs[("DaemonSet", PLUGIN)]["spec"]["template"]["metadata"]["labels"]
    svc = docs[("Service", f"{PLUGIN}-monitor")]  # HAMi's Service name, kept
    assert svc["spec"]["selector"].items() <= labels.items()
    assert not svc["spec"]["selector"].items() <= plugin_labels.items()
    assert svc["spec"]["ports"] == [{"name": "monitor", "port": 9394, "targetPort": "metrics", "nodePort": 31992}]
    sm = docs[("ServiceMonitor", f"{PLUGIN}-monitor")]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # and only that Service of the chart's
    for (kind, name), d in docs.items():
        if kind == "Service" and name != f"{PLUGIN}-monitor":
            assert not sm["spec"]["selector"]["matchLabels"].items() <= d["metadata"]["labels"].items(), name


def test_the_monitors_own_pod_list_works_with_its_role_and_nothing_else_does(
    kube_cluster, helm_bin, kube_namespace, tmp_path
):
    """Against the real API server: the monitor's RBAC applied, a token of its ServiceAccount
    bound to a pod, and the monitor's own code (hami.monitor.kube.node_pods) listing its node's
    pods; every other call it might be tricked into (get, watch, patch a pod, read or patch a
    node, create an Event) is refused."""
    ns, release = kube_namespace, f"m{uuid.uuid4().hex[:6]}"
    account = f"{release}-hami-vgpu-monitor"
    out = helm_bin(
        "template",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--kube-version",
        KUBE_VERSION,
        "--show-only",
        "templates/monitor/rbac.yaml",
    ).stdout
    manifest = yaml.safe_dump_all([d for d in yaml.safe_load_all(out) if d])
    node = f"{release}-gpu"
    pods = f"/api/v1/namespaces/{ns}/pods"
    kube_cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        kube_cluster.create_node(node)
        made = {}
        for name, account_name in (("monitor", account), ("tenant", "default")):
            made[name] = kube_cluster.api(
                "POST",
                pods,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {
                        "nodeName": node,
                        "serviceAccountName": account_name,
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "c", "image": "busybox"}],
                    },
                },
            )
        token = _pod_token(kube_cluster, ns, account, made["monitor"])
        kubeconfig = tmp_path / "monitor.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "c",
                            "cluster": {
                                "server": kube_cluster.server,
                                "certificate-authority-data": kube_cluster.ca_bundle,
                            },
                        }
                    ],
                    "users": [{"name": "u", "user": {"token": token}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )

        async def listed() -> set[str]:
            api = await api_client(str(kubeconfig))
            try:
                return {p.name for p in (await node_pods(api, node)).values()}
            finally:
                await api.close()

        kube_cluster.wait_for(
            lambda: _bearer(kube_cluster, token, "GET", f"/api/v1/pods?fieldSelector=spec.nodeName={node}")[0] == 200,
            "the monitor's ClusterRoleBinding in force",
            timeout=30,
            interval=0.5,
        )
        assert asyncio.run(listed()) == {"monitor", "tenant"}

        def refused(method: str, path: str, body=None, content_type: str = "application/merge-patch+json") -> None:
            status, answer = _bearer(kube_cluster, token, method, path, body, content_type=content_type)
            assert status == 403, (method, path, status, answer)

        patch = {"metadata": {"annotations": {"hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1000,10:;"}}}
        refused("GET", f"{pods}/tenant")
        refused("GET", f"/api/v1/pods?watch=true&fieldSelector=spec.nodeName={node}")
        refused("PATCH", f"{pods}/tenant", patch)
        refused("DELETE", f"{pods}/tenant")
        refused("GET", f"/api/v1/nodes/{node}")
        refused("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"annotations": {"hami.io/node-handshake": "x"}}})
        refused(
            "POST",
            f"/api/v1/namespaces/{ns}/events",
            {"metadata": {"generateName": "m-"}, "involvedObject": {"kind": "Node", "name": node}, "message": "x"},
            content_type="application/json",
        )
        refused("GET", f"/api/v1/namespaces/{ns}/secrets")
        tenant = kube_cluster.api("GET", f"{pods}/tenant")["metadata"]
        assert "hami.io/vgpu-devices-allocated" not in (tenant.get("annotations") or {})
    finally:
        kube_cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=manifest, check=False)
        kube_cluster.delete_node(node)
