"""Helpers for the node monitors' chart tests (`test_chart_monitor.py`: the extender's
``<release>-vgpu-monitor``; `test_chart_dra_monitor.py`: the DRA front end's
``<release>-dra-monitor``).

The chart rendered with `helm template`; the checks both monitors share on what it renders (a
DaemonSet and ServiceAccount of its own, a ClusterRole that lists pods and nothing else, a
ServiceMonitor that picks its own Service alone); and :func:`monitor_on_node`, which applies a
monitor's RBAC to the real API server and gives its ServiceAccount a token bound to a pod of its
own on a kwok node, beside a tenant's pod, to run the monitor's own pod list with and to be
refused everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hami.monitor.exporter import PodRef
from hami.monitor.kube import api_client, node_pods

from .test_chart import CHART, KUBE_VERSION, _bearer, _pod_token

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate", "*"}
#: a monitor's whole ClusterRole: the one call of src/hami/monitor/kube.py (list_pod_for_all_namespaces)
LIST_PODS_ONLY = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
MERGE = "application/merge-patch+json"


def sets(*pairs: str) -> list[str]:
    """``--set`` arguments for `helm template`, one a pair."""
    return [a for p in pairs for a in ("--set", p)]


def template(helm_bin, release: str, namespace: str, *args: str) -> list[dict]:
    """The documents `helm template` renders for ``release`` in ``namespace`` with ``args``."""
    out = helm_bin(
        "template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION, *args
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def render(helm_bin, *pairs: str, args: Sequence[str] = ()) -> dict[tuple[str, str], dict]:
    """Release ``hami`` in namespace ``gpu`` with ``--set`` ``pairs`` and further ``args``, by
    (kind, name)."""
    docs = template(helm_bin, "hami", "gpu", *sets(*pairs), *args)
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def render_values(helm_bin, values: dict, tmp_path: Path) -> dict[tuple[str, str], dict]:
    """:func:`render` with ``values`` in a values file (``-f``)."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return render(helm_bin, args=("-f", str(path)))


def monitor_rbac(helm_bin, release: str, namespace: str, *pairs: str) -> list[dict]:
    """What templates/monitor/rbac.yaml renders for ``release`` in ``namespace`` with ``--set``
    ``pairs``."""
    return template(helm_bin, release, namespace, *sets(*pairs), "--show-only", "templates/monitor/rbac.yaml")


def pod_spec(docs: dict, name: str) -> dict:
    """The pod spec of DaemonSet ``name``."""
    return docs[("DaemonSet", name)]["spec"]["template"]["spec"]


def pod_labels(docs: dict, name: str) -> dict:
    """The pod labels of DaemonSet ``name``."""
    return docs[("DaemonSet", name)]["spec"]["template"]["metadata"]["labels"]


def assert_own_daemonset_and_account(docs: dict, name: str, beside: str) -> None:
    """``hami monitor`` runs alone in DaemonSet ``name`` under ServiceAccount ``name`` (not the
    one of DaemonSet ``beside``), bound to ClusterRole ``name`` and to no other role."""
    pod = pod_spec(docs, name)
    assert [c["name"] for c in pod["containers"]] == ["vgpu-monitor"]
    assert pod["containers"][0]["command"][:2] == ["hami", "monitor"]
    assert pod["serviceAccountName"] == name != pod_spec(docs, beside)["serviceAccountName"]
    assert ("ServiceAccount", name) in docs
    binding = docs[("ClusterRoleBinding", name)]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": "gpu"}]
    # nothing binds the monitor's ServiceAccount to any other role
    for (kind, other), d in docs.items():
        if kind in ("ClusterRoleBinding", "RoleBinding") and other != name:
            assert all(s.get("name") != name for s in d.get("subjects") or ()), other


def assert_lists_pods_only(rules: list[dict]) -> None:
    """A monitor's ClusterRole: ``list`` on pods, no write verb, no get or watch, nothing else."""
    assert rules == LIST_PODS_ONLY
    assert not {v for r in rules for v in r["verbs"]} & WRITE_VERBS


def assert_service_monitor_picks_only(docs: dict, service: str) -> dict:
    """ServiceMonitor ``service`` selects Service ``service`` and no other Service of the chart's;
    returns the ServiceMonitor."""
    sm = docs[("ServiceMonitor", service)]
    selector = sm["spec"]["selector"]["matchLabels"].items()
    assert selector <= docs[("Service", service)]["metadata"]["labels"].items()
    for (kind, name), d in docs.items():
        if kind == "Service" and name != service:
            assert not selector <= d["metadata"]["labels"].items(), name
    return sm


def assert_hardened(container: dict, removes_trees: bool = False) -> None:
    """No privilege, a read-only root filesystem, and no capability, except DAC_OVERRIDE and FOWNER
    for an agent that removes directories tenants wrote (docs/security.md)."""
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    caps = {"drop": ["ALL"], "add": ["DAC_OVERRIDE", "FOWNER"]} if removes_trees else {"drop": ["ALL"]}
    assert sc["capabilities"] == caps and not sc.get("privileged")


def kubeconfig(kube_cluster, token: str, path: Path) -> str:
    """A kubeconfig at ``path`` for the cluster, authenticating with ``token``; returns its path."""
    path.write_text(
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
    return str(path)


@dataclass
class MonitorOnNode:
    """Pods ``monitor`` (the monitor's ServiceAccount, its token :attr:`token`) and ``tenant`` on
    kwok node :attr:`node` in :attr:`namespace`, the monitor's RBAC in force."""

    cluster: Any
    namespace: str
    node: str
    token: str
    kubeconfig: str

    @property
    def pods(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    def listed(self) -> list[PodRef]:
        """The monitor's own code (hami.monitor.kube.node_pods) with its token: its node's pods."""

        async def listed() -> list[PodRef]:
            api = await api_client(self.kubeconfig)
            try:
                return list((await node_pods(api, self.node)).values())
            finally:
                await api.close()

        return asyncio.run(listed())

    def refused(self, method: str, path: str, body=None, content_type: str = MERGE) -> None:
        """The API server answers 403 to this call with the monitor's token."""
        status, answer = _bearer(self.cluster, self.token, method, path, body, content_type=content_type)
        assert status == 403, (method, path, status, answer)

    def refused_all_but_its_list(self, pod_patch: dict) -> None:
        """Every other call a monitor might be tricked into is refused: get, watch, patch (with
        ``pod_patch``) or delete a pod, read its node, create an Event, read Secrets."""
        self.refused("GET", f"{self.pods}/tenant")
        self.refused("GET", f"/api/v1/pods?watch=true&fieldSelector=spec.nodeName={self.node}")
        self.refused("PATCH", f"{self.pods}/tenant", pod_patch)
        self.refused("DELETE", f"{self.pods}/tenant")
        self.refused("GET", f"/api/v1/nodes/{self.node}")
        self.refused(
            "POST",
            f"/api/v1/namespaces/{self.namespace}/events",
            {"metadata": {"generateName": "m-"}, "involvedObject": {"kind": "Node", "name": self.node}, "message": "x"},
            content_type="application/json",
        )
        self.refused("GET", f"/api/v1/namespaces/{self.namespace}/secrets")


@contextlib.contextmanager
def monitor_on_node(
    kube_cluster,
    rbac: list[dict],
    namespace: str,
    release: str,
    account: str,
    kubeconfig_path: Path,
    tenant_claim: str | None = None,
) -> Iterator[MonitorOnNode]:
    """Apply the monitor's ``rbac``; on a kwok node ``<release>-gpu`` create pod ``monitor`` under
    ServiceAccount ``account`` and pod ``tenant`` under ``default`` (using ResourceClaim
    ``tenant_claim``, as the DRA front end's webhook writes it, if one is named); wait until the
    monitor's token, bound to its pod, may list the node's pods. Everything is removed after."""
    manifest = yaml.safe_dump_all(rbac)
    node = f"{release}-gpu"
    pods = f"/api/v1/namespaces/{namespace}/pods"
    kube_cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        kube_cluster.create_node(node)
        made = {}
        for name, account_name, claim in (("monitor", account, None), ("tenant", "default", tenant_claim)):
            spec: dict = {
                "nodeName": node,
                "serviceAccountName": account_name,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "busybox"}],
            }
            if claim:
                spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
                spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
            made[name] = kube_cluster.api(
                "POST", pods, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
            )
        token = _pod_token(kube_cluster, namespace, account, made["monitor"])
        path = kubeconfig(kube_cluster, token, kubeconfig_path)
        kube_cluster.wait_for(
            lambda: _bearer(kube_cluster, token, "GET", f"/api/v1/pods?fieldSelector=spec.nodeName={node}")[0] == 200,
            f"the ClusterRoleBinding of {account} in force",
            timeout=30,
            interval=0.5,
        )
        yield MonitorOnNode(kube_cluster, namespace, node, token, path)
    finally:
        kube_cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=manifest, check=False)
        kube_cluster.delete_node(node)
