"""The web UI's sign-in against the real API server (issue 27, item 1): `hami scheduler
--ui-bind` with the default `--ui-auth=token` reviews ServiceAccount tokens the API server
issued (TokenRequest) with TokenReview, and their RBAC with SubjectAccessReview.

- a tenant ServiceAccount bound by a RoleBinding to `list pods` in namespace A sees A's pod on a
  GPU it shares with namespace B's pod, and B's only as anonymous totals; `?namespace=B` is 403;
  node endpoints are 403 naming `list nodes`; pending pods of B are not shown;
- a ServiceAccount with a ClusterRole that lists pods, nodes and resourcequotas sees everything;
- no token, a made-up token, and the token of a deleted ServiceAccount are 401.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import pytest

from hami_devkit.cluster import SchedulerConfig, free_port

from ._hami import PluginStandIn, SchedulerProcess, gpu_pod, make_gpu_node, wait_pods

pytestmark = pytest.mark.integration


def _get(url: str, token: str | None = None) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"{}")


def _token(cluster, ns: str, sa: str) -> str:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    return cluster.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", body)["status"]["token"]


def _sa(cluster, ns: str, name: str) -> None:
    cluster.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": name}})


@pytest.fixture
def two_tenants(kube_cluster):
    tag = uuid.uuid4().hex[:6]
    a, b = f"ui-auth-a-{tag}", f"ui-auth-b-{tag}"
    for ns in (a, b):
        kube_cluster.create_namespace(ns)
    try:
        yield tag, a, b
    finally:
        for kind, name in (("clusterrolebindings", f"ui-auth-ops-{tag}"), ("clusterroles", f"ui-auth-ops-{tag}")):
            kube_cluster.api("DELETE", f"/apis/rbac.authorization.k8s.io/v1/{kind}/{name}", expect=(200, 202, 404))
        for ns in (a, b):
            kube_cluster.delete_namespace(ns)


def test_a_namespace_token_sees_its_pods_and_only_anonymous_totals_of_others(kube_cluster, two_tenants):
    tag, ns_a, ns_b = two_tenants
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    # tenant: list pods in A only (a Role and a RoleBinding, as a platform team would hand out)
    _sa(kube_cluster, ns_a, "tenant")
    kube_cluster.api(
        "POST",
        f"{rbac}/namespaces/{ns_a}/roles",
        {"metadata": {"name": "pod-reader"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
    )
    kube_cluster.api(
        "POST",
        f"{rbac}/namespaces/{ns_a}/rolebindings",
        {
            "metadata": {"name": "tenant-pod-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns_a}],
        },
    )
    # ops: list pods, nodes and quotas everywhere
    _sa(kube_cluster, ns_a, "ops")
    kube_cluster.api(
        "POST",
        f"{rbac}/clusterroles",
        {
            "metadata": {"name": f"ui-auth-ops-{tag}"},
            "rules": [{"apiGroups": [""], "resources": ["pods", "nodes", "resourcequotas"], "verbs": ["list"]}],
        },
    )
    kube_cluster.api(
        "POST",
        f"{rbac}/clusterrolebindings",
        {
            "metadata": {"name": f"ui-auth-ops-{tag}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"ui-auth-ops-{tag}"},
            "subjects": [{"kind": "ServiceAccount", "name": "ops", "namespace": ns_a}],
        },
    )
    _sa(kube_cluster, ns_b, "gone")
    tenant, ops, gone = (
        _token(kube_cluster, ns_a, "tenant"),
        _token(kube_cluster, ns_a, "ops"),
        _token(kube_cluster, ns_b, "gone"),
    )
    kube_cluster.api("DELETE", f"/api/v1/namespaces/{ns_b}/serviceaccounts/gone")

    node = f"ui-auth-gpu-{tag}"
    make_gpu_node(kube_cluster, node, gpus=1, labels={"ui-auth": tag})
    ui_port = free_port()
    proc = SchedulerProcess(kube_cluster, f"--ui-bind=127.0.0.1:{ui_port}").start()  # --ui-auth=token: the default
    kube_cluster.configure_hami_scheduler(SchedulerConfig(extender=proc.extender()))
    ui = f"http://127.0.0.1:{ui_port}"
    try:
        with PluginStandIn(kube_cluster, {node}) as standin:
            sel = {"ui-auth": tag}
            kube_cluster.api(
                "POST", f"/api/v1/namespaces/{ns_a}/pods", gpu_pod("mine", ns_a, mem=2000, cores=20, node_selector=sel)
            )
            kube_cluster.api(
                "POST",
                f"/api/v1/namespaces/{ns_b}/pods",
                gpu_pod("their-secret-job", ns_b, mem=3000, cores=30, node_selector=sel),
            )
            kube_cluster.api(
                "POST",
                f"/api/v1/namespaces/{ns_b}/pods",
                gpu_pod("their-waiting-job", ns_b, mem=90000, node_selector=sel),
            )
            for ns in (ns_a, ns_b):
                wait_pods(
                    kube_cluster,
                    ns,
                    lambda ps: [p for p in ps if p["spec"].get("nodeName")] or None,
                    f"a pod of {ns} bound",
                )

            def both_shown():
                status, _, doc = _get(f"{ui}/api/v1/pods?node={node}", ops)
                return status == 200 and len(doc["items"]) == 2

            kube_cluster.wait_for(both_shown, "both pods in the UI's ledger", timeout=60)
            assert standin.errors == []

        # --- no token, a made-up one, a deleted ServiceAccount's: 401 with a bearer challenge
        for token in (None, "made-up-token", gone):
            status, headers, body = _get(f"{ui}/api/v1/pods", token)
            assert status == 401, (token, body)
            assert headers["WWW-Authenticate"].startswith("Bearer "), headers
        # --- the tenant: its own pod, anonymous totals of the other namespace on the shared GPU
        status, _, doc = _get(f"{ui}/api/v1/pods", tenant)
        assert status == 200, doc
        assert [(i["namespace"], i["name"]) for i in doc["items"]] == [(ns_a, "mine")]
        text = json.dumps(doc)
        assert ns_b not in text and "their-secret-job" not in text
        uuid_ = doc["items"][0]["containers"][0]["grants"][0]["uuid"]
        assert doc["othersOnSharedDevices"] == [
            {"node": node, "uuid": uuid_, "pods": 1, "memoryMiB": 3000, "cores": 30}
        ]
        status, _, body = _get(f"{ui}/api/v1/pods?namespace={ns_b}", tenant)
        assert status == 403 and body["missing"] == {"verb": "list", "resource": "pods", "namespace": ns_b}, body
        status, _, body = _get(f"{ui}/api/v1/pending", tenant)
        assert status == 200 and "their-waiting-job" not in json.dumps(body) and ns_b not in json.dumps(body)
        # --- no list nodes: 403 on the node endpoint, naming the permission
        for path in ("/api/v1/nodes", f"/api/v1/nodes?node={node}"):
            status, _, body = _get(ui + path, tenant)
            assert status == 403, body
            assert body["missing"] == {"verb": "list", "resource": "nodes", "namespace": ""}
            assert "list nodes" in body["error"] and f"system:serviceaccount:{ns_a}:tenant" in body["error"]
        # --- a cluster-wide reader sees both namespaces, the node and the pending pod with its verdicts
        status, _, doc = _get(f"{ui}/api/v1/pods?node={node}", ops)
        assert {i["namespace"] for i in doc["items"]} == {ns_a, ns_b} and doc["othersOnSharedDevices"] == []
        status, _, doc = _get(f"{ui}/api/v1/nodes?node={node}", ops)
        assert status == 200 and [n["name"] for n in doc["items"]] == [node]
        status, _, doc = _get(f"{ui}/api/v1/pending?namespace={ns_b}", ops)
        assert [p["name"] for p in doc["items"]] == ["their-waiting-job"] and doc["items"][0]["nodes"]
        # the page itself needs no token (it asks for one)
        with urllib.request.urlopen(f"{ui}/", timeout=30) as r:
            assert r.status == 200 and b"signin-form" in r.read()
    finally:
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        proc.stop()


def test_the_charts_review_role_is_all_the_scheduler_needs(kube_cluster, two_tenants, tmp_path):
    """The ClusterRole the chart renders for sign-in (`<release>-scheduler-ui-auth`), applied to a
    ServiceAccount that has nothing else: with it, the scheduler's review client (KubeReviews over
    KubeClient, as `hami scheduler` builds it) reviews a token and a permission; without the
    binding, a review fails (ReviewUnavailable: the UI answers 503, never a pass)."""
    import asyncio

    import yaml

    from hami.kube.client import KubeClient
    from hami.ui.auth import KubeReviews, Permission, ReviewUnavailable

    from .test_chart import CHART, KUBE_VERSION

    tag, ns_a, _ = two_tenants
    helm = _find_helm()
    out = helm(
        "template",
        "hami",
        str(CHART),
        "--namespace",
        ns_a,
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "scheduler.ui.enabled=true",
    )
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
    role = docs[("ClusterRole", "hami-scheduler-ui-auth")]
    role["metadata"]["name"] = f"ui-auth-ops-{tag}-review"  # a name of this test's own
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    kube_cluster.api("POST", f"{rbac}/clusterroles", role)
    _sa(kube_cluster, ns_a, "hami-scheduler")
    _sa(kube_cluster, ns_a, "someone")
    sched_token, someone = _token(kube_cluster, ns_a, "hami-scheduler"), _token(kube_cluster, ns_a, "someone")
    config = kube_cluster.write_kubeconfig(tmp_path / "sched.kubeconfig", user={"token": sched_token})

    async def review() -> tuple:
        kube = await KubeClient.connect(str(config), 10.0)
        try:
            reviews = KubeReviews(kube)
            who = await reviews.token(someone)
            assert who is not None
            return who, await reviews.allowed(who, Permission("list", "pods", ns_a))
        finally:
            await kube.close()

    try:
        with pytest.raises(ReviewUnavailable, match="403"):  # no binding yet: fails closed
            asyncio.run(review())
        binding = docs[("ClusterRoleBinding", "hami-scheduler-ui-auth")]
        binding["metadata"]["name"] = f"ui-auth-ops-{tag}-review"
        binding["roleRef"]["name"] = role["metadata"]["name"]
        kube_cluster.api("POST", f"{rbac}/clusterrolebindings", binding)

        def works():
            try:
                return asyncio.run(review())
            except ReviewUnavailable:
                return None  # RBAC caches settle within a moment

        who, allowed = kube_cluster.wait_for(works, "the review role in effect", timeout=30)
        assert who.username == f"system:serviceaccount:{ns_a}:someone" and allowed is False
    finally:
        for kind in ("clusterrolebindings", "clusterroles"):
            kube_cluster.api("DELETE", f"{rbac}/{kind}/ui-auth-ops-{tag}-review", expect=(200, 202, 404))


def _find_helm():
    import subprocess

    from hami_devkit.binaries import find_binaries

    binary = find_binaries().get("helm")
    if binary is None:
        pytest.skip("helm is not installed (scripts/install-kube.sh)")

    def run(*args: str) -> str:
        return subprocess.run([str(binary), *args], text=True, capture_output=True, timeout=120, check=True).stdout

    return run
