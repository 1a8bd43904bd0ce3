"""The Helm chart `charts/hami` against the real test control plane.

- `helm lint`;
- `helm template` with default and non-default values, every object applied with
  `kubectl apply --dry-run=server` (ServiceMonitor and cert-manager kinds get minimal CRDs);
- `helm install`, then the chart's own scheduler configuration run for real: kube-scheduler
  with the rendered KubeSchedulerConfiguration and `hami scheduler` with the Deployment's
  arguments, the chart's certificate and device-config.yaml (processes instead of containers:
  kwok runs no containers), the webhook reached through the chart's MutatingWebhookConfiguration
  (customURL), and a GPU pod created without a schedulerName scheduled through all of it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hami.config import load_device_config
from hami.core.codec import encode_node_devices_json
from hami.core.types import DeviceInfo
from hami_devkit.cluster import die_with_parent, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "hami"
KUBE_VERSION = "1.34.4"

NON_DEFAULT_VALUES = {
    "schedulerName": "hami-alt",
    "devices": {"nvidia": {"config": {"overwriteEnv": True}}},
    "resourceMem": "nvidia.com/gpu-memory",
    "resourcePriority": "example.com/gpu-priority",
    "legacyMetrics": True,
    "global": {"imageRegistry": "registry.example.com", "gpuHookPath": "/opt/gpu"},
    "prometheus": {"enabled": True},
    "grafana": {"dashboard": {"enabled": True}},
    "scheduler": {
        "certManager": {"enabled": True},
        "leaderElect": False,
        "replicas": 3,
        "nodeLabelSelector": {"gpu": "on"},
        "service": {"type": "NodePort"},
        "admissionWebhook": {"customURL": {"enabled": True}, "whitelistNamespaces": ["kube-system", "monitoring"]},
        "extender": {"loopbackPort": 0},
        "allocationGuard": {"enabled": False},
        "ui": {"enabled": True, "port": 9191, "monitorURL": "http://{node_ip}:9394/metrics"},
    },
    "devicePlugin": {
        "createRuntimeClass": True,
        "runtimeClassName": "nvidia-hami",
        "service": {"type": "ClusterIP"},
        "monitor": {"priorityBlocking": True},
        "nodeConfiguration": {"config": json.dumps({"nodeconfig": [{"name": "n1", "devicesplitcount": 4}]})},
    },
}
NON_DEFAULT = ["-f", "<written by the helm fixture>"]

# Minimal CRDs so the server can dry-run the optional kinds (schema left open on purpose).
CRDS = [
    ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
    ("cert-manager.io", "Issuer", "issuers"),
    ("cert-manager.io", "Certificate", "certificates"),
]


def _crd(group: str, kind: str, plural: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def helm(kube_cluster, tmp_path_factory):
    home = tmp_path_factory.mktemp("helm")
    env = {
        **os.environ,
        **kube_cluster.env(),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    binary = str(kube_cluster.binaries["helm"])
    NON_DEFAULT[1] = str(home / "non-default-values.yaml")
    Path(NON_DEFAULT[1]).write_text(yaml.safe_dump(NON_DEFAULT_VALUES))

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([binary, *args], env=env, text=True, capture_output=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    return run


@pytest.fixture(scope="module")
def crds(kube_cluster):
    for group, kind, plural in CRDS:
        name = f"{plural}.{group}"
        kube_cluster.api(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            _crd(group, kind, plural),
            expect=(201, 409),
        )
        kube_cluster.wait_for(
            lambda: any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in (
                    kube_cluster.api("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                    .get("status", {})
                    .get("conditions")
                    or []
                )
            ),
            f"CRD {name}",
        )
    kube_cluster.wait_for(
        lambda: kube_cluster.kubectl("get", "servicemonitors", "-A", check=False).returncode == 0,
        "ServiceMonitor served",
    )


def test_helm_lint(helm):
    out = helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION)
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout
    helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, *NON_DEFAULT)


def _render(helm, ns: str, *values: str) -> list[dict]:
    out = helm("template", "hami", str(CHART), "--namespace", ns, "--kube-version", KUBE_VERSION, *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


SEPARATE_KUBE_SCHEDULER = ["--set", "scheduler.kubeScheduler.separatePod=true", "--set", "scheduler.replicas=2"]
#: the DRA front end: the webhook's claim and claim-template entries, whose match conditions
#: (CEL) only the API server compiles
DRA_FRONT_END = ["--set", "dra.enabled=true", "--set", "frontEnd=dra"]


@pytest.mark.parametrize(
    "values",
    [[], NON_DEFAULT, SEPARATE_KUBE_SCHEDULER, DRA_FRONT_END],
    ids=["defaults", "non-defaults", "separate-kube-scheduler", "dra"],
)
def test_rendered_objects_pass_server_side_dry_run(kube_cluster, helm, crds, kube_namespace, values):
    docs = _render(helm, kube_namespace, *values)
    kinds = sorted({d["kind"] for d in docs})
    expected = {
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "MutatingWebhookConfiguration",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    }
    assert expected <= set(kinds), kinds
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert ((kind, "hami-allocation-guard") in names) == (values is not NON_DEFAULT)  # off in the non-defaults
        assert (kind, "hami-device-plugin-node-guard") in names and (kind, "hami-scheduler-pod-guard") in names
    if values is DRA_FRONT_END:
        (hooks,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
        entries = {w["name"]: w for w in hooks["webhooks"]}
        assert {"claims.vgpu.hami.io", "claimtemplates.vgpu.hami.io"} <= set(entries)
        assert entries["claimtemplates.vgpu.hami.io"]["rules"][0]["resources"] == ["resourceclaimtemplates"]
    result = kube_cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(docs)
    # the device-config.yaml the chart writes is one our own loader accepts
    device = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-scheduler-device"))
    config = load_device_config(device["data"]["device-config.yaml"])
    assert config is not None


def test_kube_scheduler_calls_the_extender_on_the_pods_loopback_by_default(helm):
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _render(helm, "gpu")}
    ext = docs[("Deployment", "hami-scheduler")]["spec"]["template"]["spec"]["containers"][1]
    assert "--extender-bind=127.0.0.1:9080" in ext["command"]
    assert "--decision-write=binding" in ext["command"]
    config = yaml.safe_load(docs[("ConfigMap", "hami-scheduler")]["data"]["config.yaml"])
    # kube-scheduler's client rate limit is set high: the API server is the limit, not qps 50
    assert config["clientConnection"] == {"qps": 1000, "burst": 2000}
    extender = config["extenders"][0]
    assert extender["urlPrefix"] == "http://127.0.0.1:9080" and extender["enableHTTPS"] is False
    assert "tlsConfig" not in extender
    # the https port (the Service's) then serves no /filter or /bind: no client CA, no client certificate
    assert not any(a.startswith("--extender-client-ca") for a in ext["command"])
    assert not [k for k in docs if k[1].startswith("hami-scheduler-extender-client")]


def test_over_https_kube_scheduler_presents_a_client_certificate_of_its_own_ca(helm):
    """loopbackPort 0 (helm-made certificates): a client CA that is not the serving CA, kube-scheduler's
    certificate signed by it, each container mounting only what it needs."""
    from cryptography import x509

    docs = {
        (d["kind"], d["metadata"]["name"]): d
        for d in _render(helm, "gpu", "--set", "scheduler.extender.loopbackPort=0")
    }
    pod = docs[("Deployment", "hami-scheduler")]["spec"]["template"]["spec"]
    ks, ext = pod["containers"]
    assert "--extender-client-ca=/extender-client-ca/ca.crt" in ext["command"]
    assert not any(a.startswith("--extender-bind") for a in ext["command"])
    extender = yaml.safe_load(docs[("ConfigMap", "hami-scheduler")]["data"]["config.yaml"])["extenders"][0]
    assert extender["urlPrefix"] == "https://127.0.0.1:9443" and extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {
        "caFile": "/extender-tls/ca.crt",
        "certFile": "/extender-client/tls.crt",
        "keyFile": "/extender-client/tls.key",
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = lambda c: {m["name"]: m["mountPath"] for m in c["volumeMounts"]}  # noqa: E731
    assert mounts(ks)["extender-client"] == "/extender-client" and mounts(ks)["extender-tls-ca"] == "/extender-tls"
    assert mounts(ext)["extender-client-ca"] == "/extender-client-ca" and "extender-client" not in mounts(ext)
    assert volumes["extender-client-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert volumes["extender-tls-ca"]["secret"] == {
        "secretName": "hami-scheduler-tls",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    client = {
        k: __import__("base64").b64decode(v)
        for k, v in docs[("Secret", "hami-scheduler-extender-client")]["data"].items()
    }
    serving = __import__("base64").b64decode(docs[("Secret", "hami-scheduler-tls")]["data"]["ca.crt"])
    cert, client_ca = (
        x509.load_pem_x509_certificate(client["tls.crt"]),
        x509.load_pem_x509_certificate(client["ca.crt"]),
    )
    assert cert.issuer == client_ca.subject and client_ca.subject != x509.load_pem_x509_certificate(serving).subject
    cert.verify_directly_issued_by(client_ca)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH in usages


def test_kube_scheduler_in_a_pod_of_its_own_takes_its_roles_away_from_the_extender(helm):
    """scheduler.kubeScheduler.separatePod: kube-scheduler runs in a Deployment and ServiceAccount of
    its own, calls the extender through the scheduler's Service over https with its client
    certificate, and holds Kubernetes' scheduler roles; the extender's ServiceAccount holds none of
    them and its replicas campaign for a Lease of their own. The default layout is HAMi's."""
    default = {(d["kind"], d["metadata"]["name"]): d for d in _render(helm, "gpu")}
    assert ("Deployment", "hami-kube-scheduler") not in default
    subjects = lambda docs, name: [s["name"] for s in docs[("ClusterRoleBinding", name)]["subjects"]]  # noqa: E731
    assert subjects(default, "hami-scheduler-kube-scheduler") == ["hami-scheduler"]

    aliases = '[{"ip": "10.96.7.7", "hostnames": ["hami-scheduler.gpu.svc"]}]'
    docs = {
        (d["kind"], d["metadata"]["name"]): d
        for d in _render(
            helm, "gpu", *SEPARATE_KUBE_SCHEDULER, "--set-json", f"scheduler.kubeScheduler.hostAliases={aliases}"
        )
    }
    ext_pod = docs[("Deployment", "hami-scheduler")]["spec"]["template"]["spec"]
    ks_deploy = docs[("Deployment", "hami-kube-scheduler")]
    ks_pod = ks_deploy["spec"]["template"]["spec"]
    assert [c["name"] for c in ext_pod["containers"]] == ["vgpu-scheduler-extender"]
    assert [c["name"] for c in ks_pod["containers"]] == ["kube-scheduler"]
    assert ext_pod["serviceAccountName"] == "hami-scheduler" and ks_pod["serviceAccountName"] == "hami-kube-scheduler"
    assert ks_pod["hostAliases"] == [{"ip": "10.96.7.7", "hostnames": ["hami-scheduler.gpu.svc"]}]
    assert ks_deploy["spec"]["replicas"] == 2
    # Kubernetes' scheduler roles go to kube-scheduler's identity only
    for binding in ("hami-scheduler-kube-scheduler", "hami-scheduler-volume-scheduler"):
        assert subjects(docs, binding) == ["hami-kube-scheduler"]
    assert [s["name"] for s in docs[("RoleBinding", "hami-scheduler-auth-reader")]["subjects"]] == [
        "hami-kube-scheduler"
    ]
    extender_roles = [
        d["roleRef"]["name"]
        for (kind, _), d in docs.items()
        if kind in ("ClusterRoleBinding", "RoleBinding") and "hami-scheduler" in [s["name"] for s in d["subjects"]]
    ]
    assert not any(r.startswith("system:") or r == "extension-apiserver-authentication-reader" for r in extender_roles)
    # the extender campaigns for a Lease of its own, which it alone may read and renew
    ext = ext_pod["containers"][0]["command"]
    assert "--leader-elect-mode=campaign" in ext and "--leader-elect-resource-name=hami-scheduler-extender" in ext
    assert "--extender-client-ca=/extender-client-ca/ca.crt" in ext
    assert not any(a.startswith("--extender-bind") for a in ext)
    lease_rules = [r for r in docs[("Role", "hami-scheduler")]["rules"] if "leases" in r["resources"]]
    assert docs[("Lease", "hami-scheduler-extender")]["spec"] == {}  # the chart makes it: no create right
    assert lease_rules == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["hami-scheduler-extender"],
            "verbs": ["get", "update"],
        },
    ]
    assert docs[("Role", "hami-kube-scheduler")]["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["hami-scheduler"],
            "verbs": ["get", "update"],
        }
    ]
    # kube-scheduler calls the Service over https with its client certificate; the serving
    # certificate names that host
    config = yaml.safe_load(docs[("ConfigMap", "hami-scheduler")]["data"]["config.yaml"])
    extender = config["extenders"][0]
    assert extender["urlPrefix"] == "https://hami-scheduler.gpu.svc:443" and extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {
        "caFile": "/extender-tls/ca.crt",
        "certFile": "/extender-client/tls.crt",
        "keyFile": "/extender-client/tls.key",
    }
    names = json.loads(docs[("Secret", "hami-scheduler-tls")]["metadata"]["annotations"]["hami.io/tls-names"])
    assert "hami-scheduler.gpu.svc" in names["dns"]
    # kube-scheduler's configuration restarts kube-scheduler, not the extender (a needless hand-over)
    assert "checksum/config" in ks_deploy["spec"]["template"]["metadata"]["annotations"]
    assert (
        "checksum/config" not in docs[("Deployment", "hami-scheduler")]["spec"]["template"]["metadata"]["annotations"]
    )
    volumes = lambda pod: {v["name"] for v in pod["volumes"]}  # noqa: E731
    assert volumes(ks_pod) == {"scheduler-config", "extender-client", "extender-tls-ca"}
    assert volumes(ext_pod) == {"device-config", "tls", "extender-client-ca"}  # no client key in the extender's pod
    # the Services and the scheduler's PDB select extender pods only; kube-scheduler has a PDB of its own
    ks_labels = ks_deploy["spec"]["template"]["metadata"]["labels"]
    for service in ("hami-scheduler", "hami-scheduler-webhook"):
        selector = docs[("Service", service)]["spec"]["selector"]
        assert not all(ks_labels.get(k) == v for k, v in selector.items()), service
    assert (
        docs[("PodDisruptionBudget", "hami-kube-scheduler")]["spec"]["selector"]["matchLabels"]
        == (ks_deploy["spec"]["selector"]["matchLabels"])
    )
    ext_selector = docs[("Deployment", "hami-scheduler")]["spec"]["selector"]["matchLabels"]
    assert not all(ks_labels.get(k) == v for k, v in ext_selector.items())


def test_the_scheduler_has_no_cluster_wide_pod_patch_unless_decision_write_filter(helm):
    def pod_verbs(values: list[str]) -> tuple[set, set]:
        docs = {(d["kind"], d["metadata"]["name"]): d for d in _render(helm, "gpu", *values)}
        verbs = lambda kind: {
            v
            for r in docs[(kind, "hami-scheduler")]["rules"]  # noqa: E731
            if "pods" in r["resources"]
            for v in r["verbs"]
        }
        return verbs("ClusterRole"), verbs("Role")

    cluster, namespaced = pod_verbs([])
    assert cluster == {"get", "list", "watch"} and namespaced == {"patch"}  # its own pod's role label
    cluster, _ = pod_verbs(["--set", "scheduler.extender.decisionWrite=filter"])
    assert "patch" in cluster  # HAMi's decision patch on any pod


def test_the_web_ui_is_served_and_exposed_only_when_enabled(helm):
    """scheduler.ui: off by default (no --ui-bind, no port, no Service); on, a ClusterIP Service
    of its own selecting the leader, never the webhook's port."""

    def scheduler_parts(docs):
        dep = next(
            d for d in docs.values() if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-scheduler")
        )
        ctr = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vgpu-scheduler-extender")
        return ctr["command"], {p["name"]: p["containerPort"] for p in ctr.get("ports", [])}

    off = {(d["kind"], d["metadata"]["name"]): d for d in _render(helm, "gpu")}
    args, ports = scheduler_parts(off)
    assert not [a for a in args if a.startswith("--ui-")] and "ui" not in ports
    assert ("Service", "hami-scheduler-ui") not in off
    on = {(d["kind"], d["metadata"]["name"]): d for d in _render(helm, "gpu", "--set", "scheduler.ui.enabled=true")}
    args, ports = scheduler_parts(on)
    assert "--ui-bind=0.0.0.0:9090" in args and ports["ui"] == 9090 and ports["http"] != 9090
    # live usage is wired to each node's monitor by default (test_chart_ui_live.py)
    assert [a for a in args if a.startswith("--ui-monitor-url")] == ["--ui-monitor-url=http://{node_ip}:9394/metrics"]
    svc = on[("Service", "hami-scheduler-ui")]
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "ui", "port": 9090, "targetPort": "ui"}]
    assert svc["spec"]["selector"]["hami.io/scheduler-role"] == "leader"


def test_allocation_guard_is_left_out_before_kubernetes_1_30(helm):
    """ValidatingAdmissionPolicy is GA from 1.30: older clusters get the rest of the chart."""
    older = helm("template", "hami", str(CHART), "--namespace", "gpu", "--kube-version", "1.29.0").stdout
    kinds = {d["kind"] for d in yaml.safe_load_all(older) if d}
    assert "Deployment" in kinds and not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def test_non_default_values_are_honoured(helm):
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _render(helm, "gpu", *NON_DEFAULT)}
    assert ("RuntimeClass", "nvidia-hami") in docs
    dashboard = json.loads(docs[("ConfigMap", "hami-dashboard")]["data"]["hami.json"])
    assert dashboard["uid"] == "hami-gpu-sharing"
    assert ("ServiceMonitor", "hami-scheduler") in docs and ("ServiceMonitor", "hami-device-plugin-monitor") in docs
    for name in ("hami-scheduler", "hami-device-plugin-monitor"):  # tenant pods' labels kept (the UI's history)
        assert all(e.get("honorLabels") is True for e in docs[("ServiceMonitor", name)]["spec"]["endpoints"]), name
    assert ("Certificate", "hami-scheduler-serving") in docs and ("Secret", "hami-scheduler-tls") not in docs
    hook, env = docs[("MutatingWebhookConfiguration", "hami-scheduler-webhook")]["webhooks"]
    assert hook["clientConfig"]["url"] == "https://127.0.0.1:31998/webhook" and "caBundle" not in hook["clientConfig"]
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "monitoring"]} in hook[
        "namespaceSelector"
    ]["matchExpressions"]
    # overwriteEnv changes pods that ask for no device: a second entry sends those, failing open
    # (the scheduler down must not refuse every pod), the chart's own pods opted out
    assert env["name"] == "env.vgpu.hami.io" and env["failurePolicy"] == "Ignore"
    assert env["clientConfig"] == hook["clientConfig"] and env["namespaceSelector"] == hook["namespaceSelector"]
    assert env["matchConditions"][0]["expression"].startswith("!(")
    assert {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]} in env["objectSelector"][
        "matchExpressions"
    ]
    assert (
        yaml.safe_load(docs[("ConfigMap", "hami-scheduler-device")]["data"]["device-config.yaml"])["nvidia"][
            "overwriteEnv"
        ]
        is True
    )
    deploy = docs[("Deployment", "hami-scheduler")]
    assert deploy["spec"]["replicas"] == 1  # replicas only count with leader election
    ext = deploy["spec"]["template"]["spec"]["containers"][1]
    assert ext["image"].startswith("registry.example.com/")
    assert "--scheduler-name=hami-alt" in ext["command"] and "--node-label-selector=gpu=on" in ext["command"]
    assert "--legacy-metrics=true" in ext["command"]
    sched_cfg = yaml.safe_load(docs[("ConfigMap", "hami-scheduler")]["data"]["config.yaml"])
    assert sched_cfg["profiles"] == [{"schedulerName": "hami-alt"}]
    # loopbackPort 0: kube-scheduler calls the extender over https, as HAMi (cert-manager: CA unknown)
    assert sched_cfg["extenders"][0]["urlPrefix"] == "https://127.0.0.1:9443"
    assert sched_cfg["extenders"][0]["enableHTTPS"] is True
    assert sched_cfg["extenders"][0]["tlsConfig"] == {
        "caFile": "/extender-tls/ca.crt",
        "certFile": "/extender-client/tls.crt",
        "keyFile": "/extender-client/tls.key",
    }
    assert not any(a.startswith("--extender-bind") for a in ext["command"])
    # mTLS with cert-manager: a client CA of kube-scheduler's own, its Issuer, the client certificate
    assert "--extender-client-ca=/extender-client-ca/ca.crt" in ext["command"]
    client = docs[("Certificate", "hami-scheduler-extender-client")]["spec"]
    assert client["issuerRef"] == {"name": "hami-scheduler-extender-client-ca"} and "client auth" in client["usages"]
    assert client["secretName"] == "hami-scheduler-extender-client"
    assert docs[("Issuer", "hami-scheduler-extender-client-ca")]["spec"] == {
        "ca": {"secretName": "hami-scheduler-extender-client-ca"}
    }
    client_ca = docs[("Certificate", "hami-scheduler-extender-client-ca")]["spec"]
    assert client_ca["isCA"] is True and client_ca["duration"] == "87600h"  # scheduler.tls.validityDays
    assert {"name": "nvidia.com/gpu-memory", "ignoredByScheduler": True} in sched_cfg["extenders"][0][
        "managedResources"
    ]
    device = yaml.safe_load(docs[("ConfigMap", "hami-scheduler-device")]["data"]["device-config.yaml"])
    assert device["nvidia"]["resourceMemoryName"] == "nvidia.com/gpu-memory"
    node_cfg = json.loads(docs[("ConfigMap", "hami-device-plugin")]["data"]["config.json"])
    assert node_cfg["nodeconfig"][0]["devicesplitcount"] == 4
    ds = docs[("DaemonSet", "hami-device-plugin")]["spec"]["template"]["spec"]
    (monitor,) = docs[("DaemonSet", "hami-vgpu-monitor")]["spec"]["template"]["spec"]["containers"]
    assert "--legacy-metrics" in monitor["command"] and "--priority-blocking" in monitor["command"]
    # the monitor reads priorities from the resource the device plugin does (resourcePriorityName)
    assert "--priority-resource=example.com/gpu-priority" in monitor["command"]
    assert device["nvidia"]["resourcePriorityName"] == "example.com/gpu-priority"
    assert {"name": "HOOK_PATH", "value": "/opt/gpu/vgpu"} in monitor["env"]  # follows gpuHookPath (A13)
    assert monitor["volumeMounts"] == [{"name": "containers", "mountPath": "/opt/gpu/vgpu/containers"}]
    plugin = next(c for c in ds["containers"] if c["name"] == "device-plugin")
    assert "--hook-path=/opt/gpu" in plugin["command"]
    assert "--lock-release-delay=1" in plugin["command"]
    assert docs[("Service", "hami-device-plugin-monitor")]["spec"]["clusterIP"] == "None"


def test_every_privilege_has_a_reason_and_nothing_is_privileged(helm):
    text = "".join(
        (CHART / "templates" / part / "rbac.yaml").read_text() for part in ("scheduler", "device-plugin", "monitor")
    )
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("- apiGroups:"):
            assert lines[i - 1].strip().startswith("#"), f"rule without a comment: {line.strip()} (line {i + 1})"
    docs = _render(helm, "gpu")
    separate = [d for d in _render(helm, "gpu", *SEPARATE_KUBE_SCHEDULER) if d["kind"] != "DaemonSet"]
    for d in docs + separate:
        for rule in d.get("rules") or ():
            assert "*" not in rule.get("verbs", []) and "*" not in rule.get("resources", []), (
                d["metadata"]["name"],
                rule,
            )
            assert "secrets" not in rule.get("resources", []), (d["metadata"]["name"], rule)
        for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or ():
            sc = c.get("securityContext") or {}
            assert not sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False, c["name"]
            added = sc.get("capabilities", {}).get("add") or []
            # only the node agents that remove directories tenants wrote add these two (docs/security.md)
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
            assert added in ([], ["DAC_OVERRIDE", "FOWNER"]), (c["name"], added)
            assert sc.get("readOnlyRootFilesystem") is True, c["name"]  # they write host directories only
    daemonsets = [d for d in docs if d["kind"] == "DaemonSet"]
    assert len(daemonsets) == 2  # the device plugin's and the monitor's
    for d in daemonsets:
        assert d["spec"]["template"]["spec"]["hostPID"] is False, d["metadata"]["name"]
    for d in docs + separate:  # the runtime's default syscall filter for every pod
        if d["kind"] in ("DaemonSet", "Deployment"):
            pod = d["spec"]["template"]["spec"]
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, d["metadata"]["name"]


# ---------------------------------------------------------------------------------------------
# helm install + the chart's scheduler configuration running for real


def _gpu_node(kube_cluster, name: str) -> list[DeviceInfo]:
    devices = [
        DeviceInfo(
            id=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{name}-{i}')}",
            index=i,
            count=10,
            devmem=16384,
            devcore=100,
            type="NVIDIA-Tesla T4",
            numa=0,
            mode="hami-core",
            health=True,
        )
        for i in range(2)
    ]
    kube_cluster.create_node(
        name,
        gpus=2,
        labels={"gpu": "on"},
        annotations={"hami.io/node-nvidia-register": encode_node_devices_json(devices)},
    )
    return devices


class _Procs:
    def __init__(self, logdir: Path) -> None:
        self.logdir, self.procs = logdir, []

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "ab")
        proc = subprocess.Popen(
            die_with_parent(argv),
            env={**os.environ, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((name, proc, log))
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n" + (self.logdir / f"{n}.log").read_text()[-3000:] for n, _, _ in self.procs)

    def stop(self) -> None:
        for _, proc, log in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=5)
            log.close()


def _extender_argv(
    deploy: dict, files: dict[str, Path], kubeconfig: Path, port: int, metrics_port: int, loopback: int
) -> list[str]:
    """The Deployment's extender command, with in-pod paths mapped to local files."""
    ext = next(c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "vgpu-scheduler-extender")
    assert ext["command"][:2] == ["hami", "scheduler"]
    out = [sys.executable, "-m", "hami", "scheduler", f"--kubeconfig={kubeconfig}"]
    for arg in ext["command"][2:]:
        flag, _, value = arg.partition("=")
        if flag == "--http_bind":
            value = f"127.0.0.1:{port}"
        elif flag == "--extender-bind":
            value = f"127.0.0.1:{loopback}"
        elif flag == "--metrics-bind-address":
            value = f"127.0.0.1:{metrics_port}"
        else:
            value = str(files.get(value, value))
        out.append(f"{flag}={value}" if value or "=" in arg else flag)
    return out


def _post(url: str, context: ssl.SSLContext, body: dict) -> int:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, context=context, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("https_extender", [False, True], ids=["loopback-extender", "mtls-extender"])
def test_helm_install_and_a_gpu_pod_scheduled_through_the_chart(
    kube_cluster, helm, kube_namespace, tmp_path, https_extender
):
    """The chart's default (kube-scheduler calls the extender on the pod's loopback; the Service's
    https port answers 404 to /filter and /bind) and loopbackPort 0 (kube-scheduler calls it over
    https with its client certificate; 403 without one). A pod is scheduled through either."""
    pytest.importorskip("hami.scheduler.command", reason="hami scheduler is not in this build")
    ns, release = kube_namespace, f"h{uuid.uuid4().hex[:6]}"
    sched_name = f"hami-{release}"
    port, metrics_port = free_port(), free_port()
    loopback = 0 if https_extender else free_port()
    helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--set",
        f"schedulerName={sched_name}",
        "--set",
        f"scheduler.service.httpTargetPort={port}",
        "--set",
        f"scheduler.extender.loopbackPort={loopback}",
        "--set",
        "scheduler.admissionWebhook.customURL.enabled=true",
        "--set",
        f"scheduler.admissionWebhook.customURL.port={port}",
        "--set",
        f"scheduler.metricsBindAddress=:{metrics_port}",
        "--set",
        "scheduler.admissionWebhook.objectSelector.matchExpressions[0].key=hami-chart-test",
        "--set",
        "scheduler.admissionWebhook.objectSelector.matchExpressions[0].operator=In",
        "--set",
        f"scheduler.admissionWebhook.objectSelector.matchExpressions[0].values[0]={release}",
        "--set",
        "devicePlugin.nvidiaNodeSelector.hami-chart-test=none",
        # the allocation guard stays on, in this namespace only (the cluster is shared), trusting
        # the identity the extender runs with here (the pod would use the chart's service account)
        "--set",
        f"scheduler.allocationGuard.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={ns}",
        "--set",
        "scheduler.allocationGuard.trustedUsers[0]=hami-admin",
    )
    procs = _Procs(tmp_path)
    node = f"chart-{release}"
    try:
        full = f"{release}-hami"
        secret = kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/secrets/{full}-scheduler-tls")
        files = {}
        for key, local in (("tls.crt", "tls.crt"), ("tls.key", "tls.key"), ("ca.crt", "ca.crt")):
            path = tmp_path / local
            path.write_bytes(__import__("base64").b64decode(secret["data"][key]))
            files[f"/tls/{key}"] = path
        files["/extender-tls/ca.crt"] = files["/tls/ca.crt"]
        if https_extender:  # the extender gets the client CA; kube-scheduler its certificate and key
            client = kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/secrets/{full}-scheduler-extender-client")
            for key, mount in (
                ("ca.crt", "/extender-client-ca/ca.crt"),
                ("tls.crt", "/extender-client/tls.crt"),
                ("tls.key", "/extender-client/tls.key"),
            ):
                path = tmp_path / f"client-{key}"
                path.write_bytes(__import__("base64").b64decode(client["data"][key]))
                files[mount] = path
        device_cm = kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/configmaps/{full}-scheduler-device")
        (tmp_path / "device-config.yaml").write_text(device_cm["data"]["device-config.yaml"])
        files["/device-config.yaml"] = tmp_path / "device-config.yaml"
        sched_cm = kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/configmaps/{full}-scheduler")
        config = yaml.safe_load(sched_cm["data"]["config.yaml"])
        # the chart's client rate limit (qps, burst) kept: the real kube-scheduler must accept it
        config["clientConnection"] = {**config.get("clientConnection", {}), "kubeconfig": str(kube_cluster.kubeconfig)}
        tls_config = config["extenders"][0].get("tlsConfig") or {}
        assert bool(tls_config) == https_extender
        for key, mounted in tls_config.items():  # the files the Deployment mounts, here local
            tls_config[key] = str(files[mounted])
        (tmp_path / "kube-scheduler.yaml").write_text(yaml.safe_dump(config))
        deploy = kube_cluster.api("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{full}-scheduler")

        ext = procs.start(
            "hami-scheduler",
            _extender_argv(deploy, files, kube_cluster.kubeconfig, port, metrics_port, loopback),
            env={"PYTHONPATH": str(ROOT / "src"), "POD_NAME": "", "POD_NAMESPACE": ns},
        )
        ca = ssl.create_default_context(cadata=__import__("base64").b64decode(secret["data"]["ca.crt"]).decode())

        def ready() -> bool:
            assert ext.poll() is None, procs.logs()
            try:
                return urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ca, timeout=2).status == 200
            except OSError:
                return False

        ks_port = free_port()
        procs.start(
            "kube-scheduler",
            [
                str(kube_cluster.binaries["kube-scheduler"]),
                f"--config={tmp_path / 'kube-scheduler.yaml'}",
                f"--authentication-kubeconfig={kube_cluster.kubeconfig}",
                f"--authorization-kubeconfig={kube_cluster.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ks_port}",
                "--v=2",
            ],
        )
        kube_cluster.wait_for(ready, "hami scheduler (chart arguments) ready", timeout=60)
        # the Service's port: /webhook and health for anyone; /filter and /bind for no one without
        # kube-scheduler's client certificate (404: not served there at all; 403: no certificate)
        for path, body in (
            ("/filter", {"Pod": {"metadata": {"name": "x", "namespace": ns, "uid": "u"}}, "NodeNames": [node]}),
            ("/bind", {"PodName": "x", "PodNamespace": ns, "PodUID": "u", "Node": node}),
        ):
            assert _post(f"https://127.0.0.1:{port}{path}", ca, body) == (403 if https_extender else 404), path
        devices = _gpu_node(kube_cluster, node)

        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpu", "namespace": ns, "labels": {"hami-chart-test": release}},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}},
                    }
                ],
            },
        }
        created = kube_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
        assert created["spec"]["schedulerName"] == sched_name, "the chart's webhook did not route the pod"
        bound = kube_cluster.wait_for(
            lambda: (p := kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/gpu"))["spec"].get("nodeName") and p,
            "GPU pod bound through the chart's scheduler",
            timeout=60,
        )
        ann = bound["metadata"]["annotations"]
        assert bound["spec"]["nodeName"] == node and ann["hami.io/vgpu-node"] == node
        assert any(d.id in ann["hami.io/vgpu-devices-allocated"] for d in devices)
        assert ",3000," in ann["hami.io/vgpu-devices-allocated"]
        # the scheduler serves its metrics where the chart's --metrics-bind-address says
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        got = {f.name: f.samples for f in text_string_to_metric_families(text)}
        assert [
            s.value
            for s in got["hami_vgpu_memory_allocated_bytes"]
            if s.labels["pod"] == "gpu" and s.labels["namespace"] == ns
        ] == [3000 * 1024 * 1024]
        assert any(s.labels["node"] == node for s in got["hami_gpu_memory_limit_bytes"])
        counts = {
            (s.name, s.labels.get("outcome")): s.value
            for f in ("hami_scheduler_filter_duration_seconds", "hami_scheduler_bind_duration_seconds")
            for s in got[f]
            if s.name.endswith("_count")
        }
        assert counts[("hami_scheduler_filter_duration_seconds_count", "scheduled")] >= 1
        assert counts[("hami_scheduler_bind_duration_seconds_count", "bound")] >= 1
        assert {s.labels["resource"] for s in got["hami_scheduler_cache_age_seconds"]} >= {"nodes", "pods"}
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop()
        kube_cluster.delete_node(node)
        helm("uninstall", release, "--namespace", ns, check=False)


# ---------------------------------------------------------------------------------------------
# the chart's allocation guard (ValidatingAdmissionPolicy), enforced by the real API server

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
ENFLAME_DECISION = (
    "enflame.com/gcu-request-size",
    "enflame.com/gcu-assigned-id",
    "enflame.com/gcu-assigned",
    "enflame.com/gcu-assigned-index",
    "enflame.com/gcu-assigned-minor",
    "enflame.com/gcu-assigned-time",
    "assigned-containers",
)


def guarded_decision_keys(policy: dict) -> list[str]:
    """The vendors' decision annotations the allocation guard's ``internal`` variable lists
    (the JSON list after its fixed hami.io/ keys; [] when no enabled vendor has any)."""
    expr = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "internal")
    found = re.findall(r"\|\| k in (\[\".*?\"\])", expr)
    assert len(found) <= 1, expr
    return json.loads(found[0]) if found else []


def _guard_policy(helm_bin, *args: str) -> dict:
    out = helm_bin(
        "template",
        "hami",
        str(CHART),
        "--namespace",
        "gpu",
        "--kube-version",
        KUBE_VERSION,
        "--show-only",
        "templates/scheduler/allocation-guard.yaml",
        *args,
    ).stdout
    return next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "ValidatingAdmissionPolicy")


def test_allocation_guard_keeps_the_decision_annotations_of_enabled_vendors_only(helm_bin):
    """Enflame's, MetaX's, Cambricon's ... decisions write keys outside hami.io/ that their own
    device plugins read at Allocate: the guard lists those of the vendors the release enables,
    and no others (an unrelated workload may use a disabled vendor's keys)."""
    assert guarded_decision_keys(_guard_policy(helm_bin)) == []  # NVIDIA only: its key is in the fixed list
    enflame = guarded_decision_keys(_guard_policy(helm_bin, "--set", "devices.enflame.enabled=true"))
    assert enflame == sorted(ENFLAME_DECISION)
    both = guarded_decision_keys(
        _guard_policy(
            helm_bin,
            "--set",
            "devices.enflame.enabled=true",
            "--set",
            "devices.cambricon.enabled=true",
            "--set",
            "devices.vnpus.enabled=true",
            "--set",
            "devices.vnpus.config.configs[0].commonWord=Ascend910B3",
            "--set",
            "devices.vnpus.config.configs[0].resourceName=huawei.com/npu",
            "--set",
            "devices.vnpus.config.configs[0].memoryAllocatable=65536",
            "--set",
            "devices.vnpus.config.configs[0].memoryCapacity=65536",
        )
    )
    assert both == sorted(
        [
            *ENFLAME_DECISION,
            "CAMBRICON_DSMLU_PROFILE",
            "CAMBRICON_DSMLU_ASSIGNED",
            "CAMBRICON_DSMLU_ASSIGHED",
            "huawei.com/Ascend910B3",
            "predicate-time",
        ]
    )
    assert not [k for k in both if k.startswith(("metax-tech.com/", "mthreads.com/", "NEURON_"))]


def test_allocation_guard_lets_only_hamis_service_accounts_write_allocation_annotations(
    kube_cluster, helm, kube_namespace
):
    from hami_devkit.cluster import ApiError

    ns, release = kube_namespace, f"g{uuid.uuid4().hex[:6]}"
    full = f"{release}-hami"
    out = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--kube-version",
        KUBE_VERSION,
        "--show-only",
        "templates/scheduler/allocation-guard.yaml",
        "--set",
        f"scheduler.allocationGuard.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={ns}",
        "--set",
        "scheduler.allocationGuard.trustedUsers[0]=ops:repair-bot",
        "--set",
        "scheduler.allocationGuard.nodeLabelWriters[0]=koord:scheduler",
        "--set",
        "devices.enflame.enabled=true",
    ).stdout
    policy, binding = [d for d in yaml.safe_load_all(out) if d]
    tenant, scheduler = "tenant-a", f"system:serviceaccount:{ns}:{full}-scheduler"
    plugin = f"system:serviceaccount:{ns}:{full}-device-plugin"
    pods = f"/api/v1/namespaces/{ns}/pods"
    merge = "application/merge-patch+json"

    def pod(name: str, annotations: dict | None = None) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "busybox"}]},
        }

    def denied(call) -> str:
        with pytest.raises(ApiError) as err:
            call()
        assert err.value.status in (403, 422), err.value
        return str(err.value)

    def patch(name: str, user: str, annotations: dict | None = None, labels: dict | None = None) -> dict:
        meta = {k: v for k, v in (("annotations", annotations), ("labels", labels)) if v is not None}
        return kube_cluster.api("PATCH", f"{pods}/{name}", {"metadata": meta}, content_type=merge, as_user=user)

    kube_cluster.api("POST", f"{ADMISSION}/validatingadmissionpolicies", policy)
    kube_cluster.api("POST", f"{ADMISSION}/validatingadmissionpolicybindings", binding)
    try:
        forged = pod("forged", {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,81920,100:;"})

        def enforced() -> str | None:  # the API server picks a new policy up within seconds
            try:
                kube_cluster.api("POST", pods, forged, as_user=tenant)
            except ApiError as exc:
                return str(exc) if exc.status in (403, 422) else None
            kube_cluster.api("DELETE", f"{pods}/forged?gracePeriodSeconds=0")
            return None

        message = kube_cluster.wait_for(enforced, "the allocation guard in force", timeout=60, interval=0.5)
        assert "hami.io/vgpu-devices-allocated" in message and tenant in message

        # an enabled vendor's decision annotations, outside hami.io/, are guarded the same way
        message = denied(lambda: kube_cluster.api("POST", pods, pod("gcu", {ENFLAME_DECISION[3]: "0"}), as_user=tenant))
        assert ENFLAME_DECISION[3] in message and tenant in message

        kube_cluster.api("POST", pods, pod("job"), as_user=tenant)  # an ordinary pod is fine
        patch("job", tenant, {"team": "a"})  # and so is an ordinary annotation
        assert "hami.io/bind-phase" in denied(lambda: patch("job", tenant, {"hami.io/bind-phase": "success"}))

        # the scheduler records its decision; the plugin marks the pod allocated
        patch(
            "job",
            scheduler,
            {
                "hami.io/vgpu-node": "n1",
                "hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,1000,10:;",
                "hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,1000,10:;",
                "enflame.com/gcu-assigned-index": "0",
                "enflame.com/gcu-assigned": "false",
            },
            labels={"hami.io/vgpu-node": "n1"},
        )
        for change in (
            {"hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,81920,100:;"},  # edit
            {"hami.io/vgpu-devices-to-allocate": None},  # removal
            {"hami.io/kunlun-allocated": "x"},  # another vendor's key
            {"enflame.com/gcu-assigned-index": "1"},  # an enabled vendor's decision: another GCU
            {"enflame.com/gcu-assigned": None},
            {"assigned-containers": "{}"},
        ):
            key = next(iter(change))
            assert key in denied(lambda: patch("job", tenant, change))
        assert "hami.io/vgpu-node" in denied(lambda: patch("job", tenant, labels={"hami.io/vgpu-node": "n2"}))
        patch("job", tenant, labels={"team": "a"})  # unrelated updates of an allocated pod still pass
        # a label writer (koord-scheduler's PreBind patch; review, 1 Dec: trustedUsers let it write
        # every grant) may write the label, and nothing else the guard keeps
        kube_cluster.api("POST", pods, pod("koord"), as_user=tenant)
        patch("koord", "koord:scheduler", labels={"hami.io/vgpu-node": "n3"})
        assert "hami.io/vgpu-devices-allocated" in denied(
            lambda: patch("koord", "koord:scheduler", {"hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,81920,100:;"})
        )
        assert "hami.io/bind-phase" in denied(lambda: patch("koord", "koord:scheduler", {"hami.io/bind-phase": "x"}))
        patch("job", tenant, {"CAMBRICON_DSMLU_PROFILE": "x"})  # a vendor this release does not enable: not guarded
        # a status write keeps the metadata it sends (only spec is reset): guarded the same way
        forged_status = {"metadata": {"annotations": {"hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,81920,100:;"}}}
        assert "hami.io/vgpu-devices-allocated" in denied(
            lambda: kube_cluster.api("PATCH", f"{pods}/job/status", forged_status, content_type=merge, as_user=tenant)
        )
        kube_cluster.api(  # an ordinary status write (a kubelet's, a controller's) still passes
            "PATCH",
            f"{pods}/job/status",
            {"status": {"conditions": [{"type": "example.com/Ready", "status": "True"}]}},
            content_type=merge,
            as_user=tenant,
        )

        # a Binding's annotations land on the pod: any scheduler's identity could write a grant
        # when it binds (found by review); only hami's scheduler's Binding may carry one
        def bind(name: str, user: str, annotations: dict) -> dict:
            kube_cluster.api("POST", pods, pod(name), as_user=tenant)
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "annotations": annotations},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
            }
            return kube_cluster.api("POST", f"{pods}/{name}/binding", body, as_user=user)

        grant = {"hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,81920,100:;", "hami.io/bind-phase": "allocating"}
        message = denied(lambda: bind("bound-by-other", "system:kube-scheduler", grant))
        assert "hami.io/vgpu-devices-to-allocate" in message and "system:kube-scheduler" in message
        bind("bound-plain", "system:kube-scheduler", {"team": "a"})  # an ordinary Binding still passes
        bind("bound-by-hami", scheduler, grant)
        assert (
            kube_cluster.api("GET", f"{pods}/bound-by-hami")["metadata"]["annotations"]["hami.io/bind-phase"]
            == "allocating"
        )
        patch("job", plugin, {"hami.io/bind-phase": "success", "hami.io/vgpu-devices-to-allocate": None})
        patch("job", "ops:repair-bot", {"hami.io/bind-phase": "failed"})  # a configured trusted user
        final = kube_cluster.api("GET", f"{pods}/job")["metadata"]
        assert final["annotations"]["hami.io/vgpu-devices-allocated"] == "GPU-1,NVIDIA,1000,10:;"
        assert final["annotations"]["hami.io/bind-phase"] == "failed"
        assert final["annotations"]["enflame.com/gcu-assigned-index"] == "0"
        assert "hami.io/vgpu-devices-to-allocate" not in final["annotations"]
        assert final["labels"] == {"hami.io/vgpu-node": "n1", "team": "a"}
    finally:
        kube_cluster.api(
            "DELETE", f"{ADMISSION}/validatingadmissionpolicybindings/{binding['metadata']['name']}", expect=(200, 404)
        )
        kube_cluster.api(
            "DELETE", f"{ADMISSION}/validatingadmissionpolicies/{policy['metadata']['name']}", expect=(200, 404)
        )


# ---------------------------------------------------------------------------------------------
# least privilege of hami's own identities, enforced by the real API server with the chart's RBAC
# and its policies, using service account tokens bound to pods (as the pods themselves get them)


def _bearer(
    kube_cluster, token: str, method: str, path: str, body=None, content_type: str = "application/merge-patch+json"
) -> tuple[int, dict]:
    import http.client

    conn = http.client.HTTPSConnection(
        "127.0.0.1", kube_cluster.ports["kube-apiserver"], context=kube_cluster.token_context(), timeout=30
    )
    try:
        conn.request(
            method,
            path,
            body=None if body is None else json.dumps(body),
            headers={"Authorization": f"Bearer {token}", "Content-Type": content_type, "Accept": "application/json"},
        )
        resp = conn.getresponse()
        text = resp.read().decode(errors="replace")
    finally:
        conn.close()
    return resp.status, (json.loads(text) if text.startswith("{") else {"message": text})


def _pod_token(kube_cluster, ns: str, account: str, pod: dict | None) -> str:
    """A TokenRequest for ``account``, bound to ``pod`` (as the kubelet asks for a pod's
    projected token), or unbound."""
    spec: dict = {"expirationSeconds": 600}
    if pod is not None:
        spec["boundObjectRef"] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
        }
    review = kube_cluster.api(
        "POST",
        f"/api/v1/namespaces/{ns}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return review["status"]["token"]


def test_device_plugin_and_scheduler_may_change_only_their_own_node_and_pods(kube_cluster, helm, kube_namespace):
    ns, release = kube_namespace, f"p{uuid.uuid4().hex[:6]}"
    full = f"{release}-hami"
    plugin_sa, sched_sa = f"{full}-device-plugin", f"{full}-scheduler"
    out = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--kube-version",
        KUBE_VERSION,
        "--show-only",
        "templates/device-plugin/rbac.yaml",
        "--show-only",
        "templates/device-plugin/node-guard.yaml",
        "--show-only",
        "templates/scheduler/rbac.yaml",
        "--show-only",
        "templates/scheduler/pod-guard.yaml",
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    kinds = {d["kind"] for d in docs}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole", "Role"} <= kinds
    manifest = yaml.safe_dump_all(docs)
    mine_node, other_node = f"{release}-a", f"{release}-b"
    pods = f"/api/v1/namespaces/{ns}/pods"

    def pod(name: str, node: str, account: str = "default") -> dict:
        return kube_cluster.api(
            "POST",
            pods,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": account,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "busybox"}],
                },
            },
        )

    kube_cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        for n in (mine_node, other_node):
            kube_cluster.create_node(n)
        plugin_pod, sched_pod = pod("plugin", mine_node, plugin_sa), pod("scheduler", mine_node, sched_sa)
        theirs, neighbour = pod("theirs", other_node), pod("neighbour", mine_node)
        plugin = _pod_token(kube_cluster, ns, plugin_sa, plugin_pod)

        # the API server puts the pod's node into the token's identity (what the policy checks)
        status, review = _bearer(
            kube_cluster,
            plugin,
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            content_type="application/json",
        )
        assert status == 201, review
        user = review["status"]["userInfo"]
        assert user["username"] == f"system:serviceaccount:{ns}:{plugin_sa}"
        assert user["extra"]["authentication.kubernetes.io/node-name"] == [mine_node]
        assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["plugin"]

        def annotate(token: str, path: str, value: str, labels: dict | None = None) -> tuple[int, dict]:
            meta: dict = {"annotations": {"hami.io/node-handshake": value}}
            if labels:
                meta["labels"] = labels
            return _bearer(kube_cluster, token, "PATCH", path, {"metadata": meta})

        def denied(result: tuple[int, dict], text: str) -> None:
            status, body = result
            assert status in (403, 422) and text in body.get("message", ""), (status, body)

        # RBAC lets the plugin patch every node; the policy (picked up within seconds) does not.
        # The probe writes its own key: a probe that lands before the policy is in force must
        # not be mistaken below for a write the guard let through.
        def probe_other_node() -> int:
            return _bearer(
                kube_cluster,
                plugin,
                "PATCH",
                f"/api/v1/nodes/{other_node}",
                {"metadata": {"annotations": {"hami.io/guard-probe": "x"}}},
            )[0]

        kube_cluster.wait_for(
            lambda: probe_other_node() in (403, 422),
            "the device plugin's node guard in force",
            timeout=60,
            interval=0.5,
        )
        denied(
            annotate(plugin, f"/api/v1/nodes/{other_node}", "Reported_y"),
            f"on node {mine_node} may not change node {other_node}",
        )
        assert annotate(plugin, f"/api/v1/nodes/{mine_node}", "Reported_1")[0] == 200
        denied(
            annotate(plugin, f"/api/v1/nodes/{mine_node}", "Reported_2", labels={"gpu": "on"}),
            f"may change only the annotations of node {mine_node}",
        )
        assert annotate(plugin, f"{pods}/neighbour", "x")[0] == 200  # a pod bound to its node
        # with the label it writes, and nothing else of a pod on its node (found by review: an
        # image swapped, a pod relabelled into another Service, an owner that does not exist)
        assert annotate(plugin, f"{pods}/neighbour", "y", labels={"hami.io/vgpu-node": mine_node})[0] == 200
        image = {"spec": {"containers": [{"name": "c", "image": "evil/backdoor"}]}}
        denied(
            _bearer(
                kube_cluster,
                plugin,
                "PATCH",
                f"{pods}/neighbour",
                image,
                content_type="application/strategic-merge-patch+json",
            ),
            f"may change only the annotations and the label hami.io/vgpu-node of pod {ns}/neighbour",
        )
        denied(
            annotate(plugin, f"{pods}/neighbour", "z", labels={"app": "db"}),
            f"may change only the annotations and the label hami.io/vgpu-node of pod {ns}/neighbour",
        )
        # its node's annotations of other components (a CNI's) are not its to change
        flannel = "flannel.alpha.coreos.com/public-ip"
        denied(
            _bearer(
                kube_cluster,
                plugin,
                "PATCH",
                f"/api/v1/nodes/{mine_node}",
                {"metadata": {"annotations": {flannel: "x"}}},
            ),
            f"may change only its own annotations (hami.io/...) of node {mine_node}, not {flannel}",
        )
        cordon = "hami.io/device-cordon"  # the operator's, hami.io/ by name
        denied(
            _bearer(
                kube_cluster,
                plugin,
                "PATCH",
                f"/api/v1/nodes/{mine_node}",
                {"metadata": {"annotations": {cordon: "GPU-x"}}},
            ),
            f"may change only its own annotations (hami.io/...) of node {mine_node}, not {cordon}",
        )
        # found by review, 1 Dec: nor a pod's CNI annotation on its node (Multus' networks, read
        # when the pod's sandbox is made: a pod moved onto another network)
        multus = "k8s.v1.cni.cncf.io/networks"
        denied(
            _bearer(
                kube_cluster,
                plugin,
                "PATCH",
                f"{pods}/neighbour",
                {"metadata": {"annotations": {multus: "kube-system/evil-net"}}},
            ),
            f"may change only its own annotations (hami.io/...) of pod {ns}/neighbour, not {multus}",
        )
        assert multus not in (kube_cluster.api("GET", f"{pods}/neighbour")["metadata"].get("annotations") or {})
        owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": str(uuid.uuid4())}
        for path, what in (
            (f"{pods}/neighbour", f"pod {ns}/neighbour"),
            (f"/api/v1/nodes/{mine_node}", f"node {mine_node}"),
        ):
            for meta in ({"ownerReferences": [owner]}, {"finalizers": ["example.com/hold"]}):
                denied(
                    _bearer(kube_cluster, plugin, "PATCH", path, {"metadata": meta}),
                    f"may not change the finalizers or owner references of {what}",
                )
        denied(annotate(plugin, f"{pods}/theirs", "x"), f"may not change pod {ns}/theirs (bound to node {other_node})")
        # a token that is not bound to a pod names no node: no writes at all
        unbound = _pod_token(kube_cluster, ns, plugin_sa, None)
        denied(annotate(unbound, f"/api/v1/nodes/{mine_node}", "Reported_3"), "no node-name claim")
        final = kube_cluster.api("GET", f"/api/v1/nodes/{mine_node}")["metadata"]
        assert final["annotations"]["hami.io/node-handshake"] == "Reported_1" and "gpu" not in final.get("labels", {})
        assert "hami.io/node-handshake" not in (
            kube_cluster.api("GET", f"/api/v1/nodes/{other_node}")["metadata"].get("annotations") or {}
        )
        assert "hami.io/node-handshake" not in (
            kube_cluster.api("GET", f"{pods}/theirs")["metadata"].get("annotations") or {}
        )

        # the scheduler (decisionWrite binding): its own pod only, no pod patch outside its namespace
        sched = _pod_token(kube_cluster, ns, sched_sa, sched_pod)
        role = {"hami.io/scheduler-role": "leader"}
        # as above, the probe writes a key of its own: one that lands before the policy is in force
        # (under load it did) must not leave the role label on the pod the status check uses below
        probe = {"hami.test/guard-probe": "x"}
        kube_cluster.wait_for(
            lambda: (
                _bearer(kube_cluster, sched, "PATCH", f"{pods}/neighbour", {"metadata": {"labels": probe}})[0]
                in (403, 422)
            ),
            "the scheduler's pod guard in force",
            timeout=60,
            interval=0.5,
        )
        status, body = _bearer(kube_cluster, sched, "PATCH", f"{pods}/scheduler", {"metadata": {"labels": role}})
        assert status == 200 and body["metadata"]["labels"] == role, json.dumps(body)
        denied(
            _bearer(kube_cluster, sched, "PATCH", f"{pods}/neighbour", {"metadata": {"labels": role}}),
            f"may change only its own pod, not {ns}/neighbour",
        )
        status, body = _bearer(
            kube_cluster, sched, "PATCH", "/api/v1/namespaces/kube-system/pods/anything", {"metadata": {"labels": role}}
        )
        assert status == 403 and "cannot patch resource" in body["message"], body  # RBAC: no cluster-wide patch
        # kube-scheduler (the same ServiceAccount) writes every placed pod's status: never its metadata
        denied(
            _bearer(kube_cluster, sched, "PATCH", f"{pods}/neighbour/status", {"metadata": {"labels": role}}),
            f"may not change the labels or annotations of {ns}/neighbour through its status",
        )
        condition = {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
        assert _bearer(kube_cluster, sched, "PATCH", f"{pods}/neighbour/status", condition)[0] == 200
        assert "hami.io/scheduler-role" not in (
            kube_cluster.api("GET", f"{pods}/neighbour")["metadata"].get("labels") or {}
        )
        assert theirs["spec"]["nodeName"] == other_node and neighbour["spec"]["nodeName"] == mine_node
    finally:
        kube_cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=manifest, check=False)
        for n in (mine_node, other_node):
            kube_cluster.delete_node(n)


def test_driver_mounts_reach_the_plugin_the_monitor_and_allocate(helm):
    """devicePlugin.driverMounts (nodes without the NVIDIA container runtime): a hostPath volume
    each in both DaemonSets (the device plugin's and the monitor's), mounted into their
    containers, and handed to Allocate by --driver-mount."""
    docs = {
        (d["kind"], d["metadata"]["name"]): d
        for d in _render(
            helm,
            "gpu",
            "--set",
            "devicePlugin.driverMounts[0].hostPath=/home/kubernetes/bin/nvidia",
            "--set",
            "devicePlugin.driverMounts[0].containerPath=/usr/local/nvidia",
            "--set",
            "devicePlugin.driverMounts[1].hostPath=/var/run/fake",
            "--set",
            "devicePlugin.driverMounts[1].readOnly=false",
        )
    }
    pod = docs[("DaemonSet", "hami-device-plugin")]["spec"]["template"]["spec"]
    monitor_pod = docs[("DaemonSet", "hami-vgpu-monitor")]["spec"]["template"]["spec"]
    (plugin,), (monitor,) = pod["containers"], monitor_pod["containers"]
    assert [a for a in plugin["command"] if a.startswith("--driver-mount")] == [
        "--driver-mount=/home/kubernetes/bin/nvidia:/usr/local/nvidia:ro",
        "--driver-mount=/var/run/fake:/var/run/fake:rw",
    ]
    for p in (pod, monitor_pod):
        volumes = {v["name"]: v for v in p["volumes"]}
        assert volumes["driver-0"]["hostPath"] == {"path": "/home/kubernetes/bin/nvidia", "type": "Directory"}
        assert volumes["driver-1"]["hostPath"] == {"path": "/var/run/fake", "type": "Directory"}
    for container in (plugin, monitor):
        mounts = {m["name"]: (m["mountPath"], m.get("readOnly")) for m in container["volumeMounts"]}
        assert mounts["driver-0"] == ("/usr/local/nvidia", True) and mounts["driver-1"] == ("/var/run/fake", False)
    plain = _render(helm, "gpu")
    assert "driver-0" not in yaml.safe_dump_all(plain)


def test_the_webhook_fails_closed_for_device_pods_only(kube_cluster, helm, kube_namespace):
    """With the scheduler down (nothing listens at the webhook's address), a pod asking for a
    GPU is refused, so its controller retries instead of it going to default-scheduler and
    staying Pending for ever (A15); a pod asking for no device, or only for another device
    plugin's resources, never reaches the webhook and is created. (Scoped to this test's pods by an object selector: the cluster is shared.)"""
    from hami_devkit.cluster import ApiError

    ns, release = kube_namespace, f"w{uuid.uuid4().hex[:6]}"
    helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--set",
        "scheduler.admissionWebhook.customURL.enabled=true",
        "--set",
        f"scheduler.admissionWebhook.customURL.port={free_port()}",  # nothing listens there
        "--set",
        "scheduler.admissionWebhook.objectSelector.matchExpressions[0].key=hami-webhook-test",
        "--set",
        "scheduler.admissionWebhook.objectSelector.matchExpressions[0].operator=In",
        "--set",
        f"scheduler.admissionWebhook.objectSelector.matchExpressions[0].values[0]={release}",
        "--set",
        "scheduler.allocationGuard.enabled=false",
        "--set",
        "scheduler.podGuard.enabled=false",
        "--set",
        "devicePlugin.nvidiaNodeSelector.hami-chart-test=none",
    )
    try:

        def pod(name: str, limits: dict, init: bool = False) -> dict:
            container = {"name": "main", "image": "busybox", "resources": {"limits": limits}}
            spec: dict = {"containers": [{"name": "main", "image": "busybox"}] if init else [container]}
            if init:
                spec["initContainers"] = [{**container, "name": "init"}]
            return {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"hami-webhook-test": release}},
                "spec": spec,
            }

        path = f"/api/v1/namespaces/{ns}/pods"
        for name, limits, init in (
            ("gpu", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}, False),
            ("gpu-in-init", {"nvidia.com/gpu": "1"}, True),
        ):
            with pytest.raises(ApiError, match="failed calling webhook"):
                kube_cluster.api("POST", path, pod(name, limits, init))
        kube_cluster.api("POST", path, pod("cpu-only", {"cpu": "100m", "memory": "64Mi"}))
        kube_cluster.api("POST", path, pod("no-resources", {}))
        # another device plugin's pods are not ours to refuse (they were: any domain/name matched)
        kube_cluster.api("POST", path, pod("kubevirt", {"devices.kubevirt.io/kvm": "1"}))
        kube_cluster.api("POST", path, pod("sriov-in-init", {"intel.com/sriov_netdevice": "1"}, True))
        mine = kube_cluster.api("GET", f"{path}?labelSelector=hami-webhook-test%3D{release}")["items"]
        names = {p["metadata"]["name"] for p in mine}
        assert names == {"cpu-only", "no-resources", "kubevirt", "sriov-in-init"}
    finally:
        helm("uninstall", release, "--namespace", ns, check=False)


def test_an_upgrade_keeps_a_certificate_made_for_its_names_and_remakes_one_that_is_not(helm, kube_cluster):
    """The helm-made serving certificate is read back on upgrade (lookup, here against the real API
    server with --dry-run=server). A Secret made for the names wanted now is reused as it is. One
    made for other names (an older chart's, without the webhook Service) is made again, and the
    webhook trusts the new CA and the old one: running pods keep serving the old certificate until
    the kubelet refreshes their mounted Secret."""
    import base64

    from cryptography import x509

    ns = "hami-tls-upgrade"
    kube_cluster.api("POST", "/api/v1/namespaces", {"metadata": {"name": ns}}, expect=(201, 409))

    def render() -> dict:
        out = helm("template", "hami", str(CHART), "-n", ns, "--dry-run=server", "--kube-version", KUBE_VERSION).stdout
        return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}

    def bundle(docs: dict) -> list[x509.Certificate]:
        (hook,) = docs[("MutatingWebhookConfiguration", "hami-scheduler-webhook")]["webhooks"]
        return x509.load_pem_x509_certificates(base64.b64decode(hook["clientConfig"]["caBundle"]))

    first = render()
    secret = first[("Secret", "hami-scheduler-tls")]
    secret["metadata"]["namespace"] = ns
    kube_cluster.api("POST", f"/api/v1/namespaces/{ns}/secrets", secret, expect=(201,))
    # made for these names: reused whole, one CA trusted
    again = render()
    assert again[("Secret", "hami-scheduler-tls")]["data"] == secret["data"]
    assert [c.subject for c in bundle(again)] == [
        x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"])).subject
    ]
    # an older chart's Secret (no names annotation): a new certificate naming the webhook Service,
    # trusted beside the old CA, and the scheduler's pods rolled onto it
    old = {**secret, "metadata": {k: v for k, v in secret["metadata"].items() if k != "annotations"}}
    kube_cluster.api("PUT", f"/api/v1/namespaces/{ns}/secrets/hami-scheduler-tls", old, expect=(200,))
    remade = render()
    new_secret = remade[("Secret", "hami-scheduler-tls")]
    assert new_secret["data"]["tls.crt"] != secret["data"]["tls.crt"]
    old_ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    new_ca = x509.load_pem_x509_certificate(base64.b64decode(new_secret["data"]["ca.crt"]))
    trusted = bundle(remade)
    assert [c.fingerprint(c.signature_hash_algorithm) for c in trusted] == [
        c.fingerprint(c.signature_hash_algorithm) for c in (new_ca, old_ca)
    ]
    cert = x509.load_pem_x509_certificate(base64.b64decode(new_secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(new_ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"hami-scheduler-webhook.{ns}.svc" in sans.get_values_for_type(x509.DNSName)
    annotations = lambda d: d[("Deployment", "hami-scheduler")]["spec"]["template"]["metadata"]["annotations"]  # noqa: E731
    assert annotations(remade)["checksum/tls"] != annotations(again)["checksum/tls"]
    # a certificate reused as it was rolls nothing: the upgrade after the install keeps the checksum
    assert annotations(again)["checksum/tls"] == annotations(first)["checksum/tls"]


def test_the_install_notes_warn_when_writes_rbac_cannot_narrow_are_unguarded(helm):
    """NOTES.txt (helm install prints it) names every guard the release goes without: a policy
    switched off, decisionWrite filter (cluster-wide pod patch), a cluster too old for a guard.
    Found by review: the guards could disappear silently while the write rights stayed."""

    def notes(*sets: str) -> str:
        args = [a for s in sets for a in ("--set", s)]
        out = helm("install", "notes-probe", str(CHART), "--namespace", "default", "--dry-run=server", *args).stdout
        return out[out.index("NOTES:") :]

    quiet = notes()
    assert "hami" in quiet and "WARNING" not in quiet
    loud = notes("scheduler.extender.decisionWrite=filter", "devicePlugin.nodeGuard.enabled=false")
    assert "WARNING: writes that RBAC cannot narrow are not guarded" in loud
    assert "decisionWrite=filter: the scheduler's identity may patch every pod of the cluster" in loud
    assert "devicePlugin.nodeGuard is off" in loud
    assert "scheduler.podGuard" not in loud  # filter mode's warning covers the pods
    # the allocation guard narrowed to some namespaces (review, 1 Dec: silently reopened forged grants)
    narrowed = notes("scheduler.allocationGuard.namespaceSelector.matchLabels.gpu=true")
    assert "scheduler.allocationGuard.namespaceSelector is set" in narrowed
    # the UI in the process that holds kube-scheduler's roles: the notes point at the separate layout
    assert "kubeScheduler.separatePod=true" not in quiet
    ui = notes("scheduler.ui.enabled=true")
    assert "NOTE: the web UI is served by the scheduler process" in ui and "kubeScheduler.separatePod=true" in ui
    assert "NOTE: the web UI" not in notes("scheduler.ui.enabled=true", "scheduler.kubeScheduler.separatePod=true")
    # no kube-scheduler of the chart: how to give the cluster's own the extender
    external = notes("scheduler.kubeScheduler.enabled=false")
    assert "scheduler.kubeScheduler.enabled is false" in external and "hami-scheduler-extender-client" in external
    assert "scheduler.kubeScheduler.enabled is false" not in quiet
    # the DRA agent must outlive its claims' pods (review, 1 Dec: an uninstall left them Terminating)
    assert "the DRA agent must outlive" not in quiet
    dra = notes("dra.enabled=true", "devicePlugin.enabled=false")
    assert "the DRA agent must outlive the pods holding its claims" in dra and "Terminating" in dra


def test_the_monitor_service_type_changes_on_upgrade_as_kubernetes_allows(helm, kube_cluster):
    """Kubernetes never changes a Service's clusterIP between None (headless) and an address: an
    upgrade NodePort -> ClusterIP rendered a headless Service and failed, leaving the release
    failed. Read back with lookup (--dry-run=server): a Service with an address keeps it as
    ClusterIP; a headless one asked to become NodePort fails the render saying what to do."""
    ns = "hami-monitor-svc"
    kube_cluster.api("POST", "/api/v1/namespaces", {"metadata": {"name": ns}}, expect=(201, 409))

    def render(*sets: str):
        args = [a for s in sets for a in ("--set", s)]
        return helm(
            "template",
            "hami",
            str(CHART),
            "-n",
            ns,
            "--dry-run=server",
            "--kube-version",
            KUBE_VERSION,
            *args,
            "--show-only",
            "templates/monitor/service.yaml",
            check=False,
        )

    def post(spec: dict) -> None:
        kube_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/services/hami-device-plugin-monitor", expect=(200, 404))
        body = {"metadata": {"name": "hami-device-plugin-monitor"}, "spec": {"ports": [{"port": 9394}], **spec}}
        kube_cluster.api("POST", f"/api/v1/namespaces/{ns}/services", body, expect=(201,))

    fresh = yaml.safe_load(render("devicePlugin.service.type=ClusterIP").stdout)
    assert fresh["spec"]["clusterIP"] == "None"  # a new Service: headless
    post({"type": "NodePort"})  # installed with the default NodePort
    kept = yaml.safe_load(render("devicePlugin.service.type=ClusterIP").stdout)
    assert kept["spec"]["type"] == "ClusterIP" and "clusterIP" not in kept["spec"]
    post({"type": "ClusterIP", "clusterIP": "None"})
    refused = render()  # back to the default NodePort
    assert refused.returncode != 0
    assert f"Service {ns}/hami-device-plugin-monitor is headless" in refused.stderr
    assert f"kubectl -n {ns} delete service hami-device-plugin-monitor" in refused.stderr
