"""A platform team's trial of the installed product on the real node, as the docs tell one to do
it (README.md, docs/install.md, docs/ui.md, docs/metrics.md): install with the web UI on, share a
GPU, read why a pod waits, watch both metrics endpoints follow the pods, sign in to the read API
as two tenants, upgrade under running pods, and uninstall. What test_chart_e2e.py already checks
(every pod Ready, the user guide's pods, a single pod's metrics, faults) is not repeated.

The last test uninstalls the release (the module's fixture then has nothing left to remove) and
checks that nothing cluster-scoped the release made is left behind."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
import uuid
from typing import Any, Generator, Iterator, cast

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_devkit.cluster import KubeCluster

from . import test_chart_e2e as e2e
from .product import GPU_MEMORY_MIB, NAMESPACE, RELEASE, Product, installed

GPU0, GPU1 = "GPU-a1000000-0000-4000-8000-000000000000", "GPU-a1000000-0000-4000-8000-000000000001"
UI_PORT = 9090
MiB = 1 << 20

#: the cluster-scoped kinds a chart may create (API path, kind)
CLUSTER_KINDS = [
    "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
    "/apis/node.k8s.io/v1/runtimeclasses",
    "/apis/scheduling.k8s.io/v1/priorityclasses",
    "/apis/resource.k8s.io/v1/deviceclasses",
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
]
#: what docs/install.md says `helm uninstall` leaves on each Node (the programs wrote them)
DOCUMENTED_NODE_LEFTOVERS = {
    "hami.io/node-nvidia-register",
    "hami.io/node-handshake",
    "hami.io/node-nvidia-score",
    "hami.io/node-lock-handoff",
    "hami.io/node-injection",
}

#: the UI's live usage through the monitor's NodePort Service (one node: it is that node's
#: monitor). The chart's default, a hostPort at the Node's InternalIP, needs the CNI ``portmap``
#: plugin, which the real node's bridge network does not chain (hami_devkit.realnode)
MONITOR_URL = "http://{node_ip}:31992/metrics"

_trial: dict[str, Any] = {}


def cluster_objects(cluster: KubeCluster) -> set[str]:
    names = set()
    for path in CLUSTER_KINDS:
        for item in cluster.api("GET", path)["items"]:
            names.add(f"{path.rsplit('/', 1)[-1]}/{item['metadata']['name']}")
    return names


def node_marks(cluster: KubeCluster, node: str) -> dict[str, set[str]]:
    meta = cluster.api("GET", f"/api/v1/nodes/{node}")["metadata"]
    return {"labels": set(meta.get("labels") or {}), "annotations": set(meta.get("annotations") or {})}


@pytest.fixture(scope="module")
def product(real_node_holder, real_cluster: KubeCluster, tmp_path_factory, request) -> Iterator[Product]:
    node = real_node_holder.get()
    _trial["before"] = cluster_objects(real_cluster)
    _trial["node before"] = node_marks(real_cluster, node.name)
    body = cast(
        Generator[Product, None, None],
        installed(
            real_node_holder,
            real_cluster,
            tmp_path_factory.mktemp("trial"),
            request,
            extra_values={"scheduler": {"ui": {"enabled": True, "monitorURL": MONITOR_URL}}},
            label="platform trial",
        ),
    )
    made = next(body)
    yield made
    if _trial.get("uninstalled"):
        body.close()  # the last test uninstalled it
    else:
        next(body, None)


#: the probe's namespace fixture of test_chart_e2e.py, here over this module's product
gpu_namespace = e2e.gpu_namespace


@pytest.fixture
def ns(gpu_namespace: str) -> str:
    """A namespace with the probe script as ConfigMap ``gpu-probe``."""
    return gpu_namespace


def gpu_pod(
    product: Product, name: str, limits: dict, uuid_: str | None = None, probe: list[str] | None = None, image: str = ""
) -> dict:
    """A pod with one container asking ``limits``; pinned to GPU ``uuid_``; running the probe
    (``probe``: its arguments) in the product image, else ``sleep`` in ``image``."""
    container: dict[str, Any] = {"name": "main", "resources": {"limits": limits}}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 1}
    if probe is not None:
        container.update(image=product.images["hami"], command=["python", "/probe/gpu_probe.py", *probe])
        container["volumeMounts"] = [{"name": "probe", "mountPath": "/probe"}]
        spec["volumes"] = [{"name": "probe", "configMap": {"name": "gpu-probe"}}]
    else:
        container.update(image=image, imagePullPolicy="IfNotPresent", command=["sleep", "3600"])
    annotations = {"nvidia.com/use-gpuuuid": uuid_} if uuid_ else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations}, "spec": spec}


def get_pod(cluster: KubeCluster, ns: str, name: str) -> dict:
    return cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")


def wait_running(cluster: KubeCluster, product: Product, ns: str, name: str, timeout: float = 180) -> dict:
    def probe():
        pod = get_pod(cluster, ns, name)
        statuses = pod["status"].get("containerStatuses") or [{}]
        return pod if pod["status"].get("phase") == "Running" and all(c.get("ready") for c in statuses) else None

    try:
        return cluster.wait_for(probe, f"pod {ns}/{name} Running", timeout=timeout, interval=0.3)
    except TimeoutError as exc:
        raise AssertionError(
            f"{exc}: {json.dumps(get_pod(cluster, ns, name)['status'])}\n{product.describe()}"
        ) from None


def wait_refused(cluster: KubeCluster, ns: str, name: str, code: str) -> dict:
    def probe():
        pod = get_pod(cluster, ns, name)
        scheduled = {c["type"]: c for c in pod["status"].get("conditions") or []}.get("PodScheduled", {})
        return pod if scheduled.get("status") == "False" and code in scheduled.get("message", "") else None

    try:
        return cluster.wait_for(probe, f"pod {ns}/{name} Pending with {code}", timeout=120, interval=0.5)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {json.dumps(get_pod(cluster, ns, name)['status'])}") from None


def probe_output(cluster: KubeCluster, ns: str, pod: str) -> dict:
    def line():
        out = cluster.kubectl("logs", "-n", ns, pod, "-c", "main", check=False).stdout
        return next((json.loads(x) for x in out.splitlines() if x.startswith("{")), None)

    return cluster.wait_for(line, f"probe output of {pod}", timeout=120, interval=0.3)


def series(text: str) -> list[tuple[str, dict, float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def value(text: str, name: str, **labels: str) -> list[float]:
    return [v for n, lb, v in series(text) if n == name and all(lb.get(k) == w for k, w in labels.items())]


def delete_and_wait(cluster: KubeCluster, ns: str, *names: str) -> None:
    for name in names:
        cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", expect=(200, 202, 404))
    cluster.wait_for(
        lambda: (
            not {p["metadata"]["name"] for p in cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]}
            & set(names)
        ),
        f"pods {names} gone",
        timeout=120,
        interval=0.5,
    )


# ---------------------------------------------------------------------------------------------


def test_helm_reports_the_release_deployed_with_its_notes(product: Product):
    status = json.loads(product.helm("status", RELEASE, "--namespace", NAMESPACE, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed", status["info"]
    notes = status["info"].get("notes") or ""
    assert notes.strip(), "the release has no NOTES: nothing tells the installer what to do next"


def test_two_pods_share_a_gpu_a_third_waits_with_a_reason_and_both_metrics_follow_them(
    product: Product, real_cluster: KubeCluster, ns: str
):
    node = product.node.name
    # two pods on one GPU whose memory they fill between them (30000 + 10000 of 40960 MiB)
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod(
        product, "big", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000, "nvidia.com/gpucores": 50}, GPU0,
        probe=["1000", "--hold"],
    ))  # fmt: skip
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod(
        product, "small", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000, "nvidia.com/gpucores": 40}, GPU0,
        probe=["500", "--hold"],
    ))  # fmt: skip
    for name, total in (("big", 30000), ("small", 10000)):
        wait_running(real_cluster, product, ns, name)
        out = probe_output(real_cluster, ns, name)
        assert (out["cuda_total_mib"], out["nvml_total_mib"], out["allocs"]) == (total, total, [0]), out
        assert out["env"]["NVIDIA_VISIBLE_DEVICES"] == GPU0, out
    # a third that does not fit beside them waits, saying why where a person looks
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod(
        product, "late", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}, GPU0, probe=["--hold"],
    ))  # fmt: skip
    pod = wait_refused(real_cluster, ns, "late", "CardInsufficientMemory")
    assert not pod["spec"].get("nodeName")
    # memory to spare (40500 of 40960) but 50 + 40 + 20 cores: over the GPU's 100
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod(
        product, "late-cores", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 500, "nvidia.com/gpucores": 20}, GPU0,
        probe=["--hold"],
    ))  # fmt: skip
    assert not wait_refused(real_cluster, ns, "late-cores", "CardInsufficientCore")["spec"].get("nodeName")

    def failed_scheduling():
        events = real_cluster.api("GET", f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name=late")[
            "items"
        ]
        return [e["message"] for e in events if e.get("reason") == "FailedScheduling"] or None

    messages = real_cluster.wait_for(
        failed_scheduling, "a FailedScheduling event for the pod", timeout=60, interval=0.5
    )
    assert any("CardInsufficientMemory" in m for m in messages), messages
    scheduled = {c["type"]: c for c in pod["status"]["conditions"]}["PodScheduled"]
    print(f"PodScheduled: {scheduled['message']!r}\nevents: {messages!r}")

    # the scheduler counts both pods on GPU0; the monitor sees both containers
    def scheduler_counts():
        text = product.scheduler_metrics()
        got = {
            "memory": value(text, "hami_gpu_memory_allocated_bytes", node=node, device_uuid=GPU0),
            "cores": value(text, "hami_gpu_core_allocated_ratio", node=node, device_uuid=GPU0),
            "tasks": value(text, "hami_gpu_shared_count", node=node, device_uuid=GPU0),
            "big": value(text, "hami_vgpu_memory_allocated_bytes", namespace=ns, pod="big"),
            "small": value(text, "hami_vgpu_memory_allocated_bytes", namespace=ns, pod="small"),
        }
        return got if got["tasks"] == [2.0] else None

    got = real_cluster.wait_for(scheduler_counts, "the scheduler's metrics counting both pods", timeout=60, interval=1)
    assert got == {
        "memory": [float(40000 * MiB)],
        "cores": [90.0],
        "tasks": [2.0],
        "big": [float(30000 * MiB)],
        "small": [float(10000 * MiB)],
    }, got
    assert not [lb for n, lb, _ in series(product.scheduler_metrics()) if lb.get("pod") == "late"]

    def monitor_counts():
        text = product.monitor_metrics()
        limits = {p: value(text, "hami_vgpu_memory_limit_bytes", namespace=ns, pod=p) for p in ("big", "small")}
        return limits if all(limits.values()) else None

    limits = real_cluster.wait_for(monitor_counts, "the monitor reporting both containers", timeout=90, interval=1)
    assert limits == {"big": [float(30000 * MiB)], "small": [float(10000 * MiB)]}, limits

    # deleted: nothing of the three pods stays in either endpoint, and GPU0 is free again
    delete_and_wait(real_cluster, ns, "late", "late-cores")
    delete_and_wait(real_cluster, ns, "big", "small")
    ours = {"big", "small", "late", "late-cores"}

    def forgotten():
        scheduler, monitor = product.scheduler_metrics(), product.monitor_metrics()
        left = [
            (n, lb) for text in (scheduler, monitor) for n, lb, _ in series(text)
            if lb.get("namespace") == ns or lb.get("pod") in ours
        ]  # fmt: skip
        gpu = (
            value(scheduler, "hami_gpu_memory_allocated_bytes", node=node, device_uuid=GPU0),
            value(scheduler, "hami_gpu_core_allocated_ratio", node=node, device_uuid=GPU0),
            value(scheduler, "hami_gpu_shared_count", node=node, device_uuid=GPU0),
        )
        _trial["left"] = (left, gpu)
        return not left and gpu == ([0.0], [0.0], [0.0])

    try:
        real_cluster.wait_for(forgotten, "every series of the pods gone, GPU0 free", timeout=120, interval=1)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: left {_trial['left']}") from None


def test_a_finished_pod_frees_its_share_quota_and_series(product: Product, real_cluster: KubeCluster, ns: str):
    """A Job's pod stays in the API after it ends (phase Succeeded): what it held must be free
    again, in the ledger, the namespace's quota and both endpoints' series, without deleting it."""
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/resourcequotas", {
        "metadata": {"name": "gpu"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "8000"}},
    })  # fmt: skip
    once = gpu_pod(product, "once", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 6000}, GPU0, probe=["100"])
    once["spec"]["restartPolicy"] = "Never"
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", once)
    real_cluster.wait_for(
        lambda: get_pod(real_cluster, ns, "once")["status"].get("phase") == "Succeeded",
        "the pod finished",
        timeout=180,
        interval=0.5,
    )

    def freed():
        scheduler, monitor = product.scheduler_metrics(), product.monitor_metrics()
        got = {
            "pod series": [(n, lb) for t in (scheduler, monitor) for n, lb, _ in series(t) if lb.get("pod") == "once"],
            "quota used": value(scheduler, "hami_resource_quota_used", namespace=ns, quota_name="nvidia.com/gpumem"),
        }
        _trial["freed"] = got
        return got == {"pod series": [], "quota used": [0.0]}

    try:
        real_cluster.wait_for(freed, "the finished pod's share and quota freed", timeout=60, interval=1)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {_trial['freed']}") from None
    # the quota has room for the same again while the finished pod is still listed
    again = gpu_pod(product, "again", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 6000}, GPU0, probe=["--hold"])
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", again)
    wait_running(real_cluster, product, ns, "again")
    delete_and_wait(real_cluster, ns, "again", "once")
    # the quota deleted (as with its namespace): its series go too
    real_cluster.api("DELETE", f"/api/v1/namespaces/{ns}/resourcequotas/gpu")

    def quota_gone():
        text = product.scheduler_metrics()
        return not [
            lb for n, lb, _ in series(text) if n.startswith("hami_resource_quota") and lb.get("namespace") == ns
        ]

    real_cluster.wait_for(quota_gone, "the quota's series gone", timeout=60, interval=1)


def ui_client(product: Product, cluster: KubeCluster):
    """``get(path, token) -> (status, JSON or text)`` against the scheduler pod's UI listener
    (HTTPS with the scheduler's serving certificate, checked against its CA)."""
    secret = cluster.api("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/{RELEASE}-scheduler-tls")
    context = ssl.create_default_context(cadata=base64.b64decode(secret["data"]["ca.crt"]).decode())
    context.check_hostname = False  # the pod's address is not among the certificate's names
    base = f"https://{product.pod_ip('hami-scheduler')}:{UI_PORT}"

    def get(path: str, token: str | None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(base + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=15, context=context) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = exc.read()
            return exc.code, json.loads(body) if body.startswith(b"{") else body.decode()

    return get


def _rbac_viewer(cluster: KubeCluster, ns: str) -> str:
    """ServiceAccount ``viewer`` in ``ns`` that may list pods and events there; returns a token
    of it (TokenRequest, as `kubectl -n NS create token viewer` makes)."""
    cluster.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "viewer"}})
    cluster.api("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", {
        "metadata": {"name": "viewer"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["get", "list"]}],
    })  # fmt: skip
    cluster.api("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", {
        "metadata": {"name": "viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": ns}],
    })  # fmt: skip
    made = cluster.api(
        "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/viewer/token", {"spec": {"expirationSeconds": 3600}}
    )
    return made["status"]["token"]


def test_the_read_api_shows_each_tenant_only_its_own_namespace(
    product: Product, real_cluster: KubeCluster, ns: str, busybox: str
):
    other = f"trial-other-{uuid.uuid4().hex[:6]}"
    real_cluster.create_namespace(other)
    try:
        mine, theirs = _rbac_viewer(real_cluster, ns), _rbac_viewer(real_cluster, other)
        limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 500}
        real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod(product, "mine", limits, GPU1, image=busybox))
        real_cluster.api(
            "POST", f"/api/v1/namespaces/{other}/pods", gpu_pod(product, "theirs", limits, GPU1, image=busybox)
        )
        real_cluster.api("POST", f"/api/v1/namespaces/{other}/pods", gpu_pod(
            product, "theirs-waiting", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 50000}, image=busybox
        ))  # fmt: skip
        wait_running(real_cluster, product, ns, "mine")
        wait_running(real_cluster, product, other, "theirs")
        wait_refused(real_cluster, other, "theirs-waiting", "CardInsufficientMemory")

        get = ui_client(product, real_cluster)

        def names(answer: Any) -> set[tuple[str, str]]:
            return {(i["namespace"], i["name"]) for i in answer["items"]}

        assert get("/api/v1/pods", None)[0] == 401
        assert get("/api/v1/pods", "made-up")[0] == 401
        # the scheduler's cache may lag the pods by a watch event: wait for both to be listed
        status, answer = real_cluster.wait_for(
            lambda: (lambda r: r if r[0] == 200 and names(r[1]) else None)(get("/api/v1/pods", mine)),
            "tenant A's pods in the read API",
            timeout=30,
            interval=0.5,
        )
        assert names(answer) == {(ns, "mine")}, answer
        # the other tenant's pod shares GPU1: counted, never named
        assert all(
            other not in json.dumps(x) and "theirs" not in json.dumps(x)
            for x in answer.get("othersOnSharedDevices") or []
        ), answer
        status, answer = get("/api/v1/pods", theirs)
        assert status == 200 and names(answer) == {(other, "theirs")}, answer
        status, answer = get(f"/api/v1/pods?namespace={other}", mine)
        assert status == 403, (status, answer)
        status, answer = get("/api/v1/nodes", mine)
        assert status == 403 and "list nodes" in json.dumps(answer), (status, answer)
        status, answer = get("/api/v1/pending", mine)
        assert status == 200 and "theirs-waiting" not in json.dumps(answer), answer
        status, answer = get("/api/v1/pending", theirs)
        assert status == 200 and "theirs-waiting" in json.dumps(answer), answer
        assert get(f"/api/v1/pods/{other}/theirs-waiting/events", mine)[0] == 403
        status, answer = get(f"/api/v1/pods/{other}/theirs-waiting/events", theirs)
        assert status == 200 and any(e["reason"] == "FailedScheduling" for e in answer["items"]), answer
        delete_and_wait(real_cluster, ns, "mine")
    finally:
        real_cluster.delete_namespace(other)


def test_the_ui_shows_a_cluster_reader_each_gpus_live_usage_from_the_nodes_monitor(
    product: Product, real_cluster: KubeCluster, ns: str
):
    """docs/ui.md: with the UI on, the scheduler reads each node's monitor (here through
    ``scheduler.ui.monitorURL``, see :data:`MONITOR_URL`): a cluster-wide reader sees the memory
    a pod really uses on its GPU."""
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "reader"}})
    binding = f"trial-reader-{ns}"
    real_cluster.api("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view-nodes-pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
    })  # fmt: skip
    real_cluster.api("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "metadata": {"name": "view-nodes-pods"},
        "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list"]}],
    }, expect=(201, 409))  # fmt: skip
    try:
        token = real_cluster.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/reader/token", {"spec": {}})[
            "status"
        ]["token"]
        real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod(
            product, "busy", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}, GPU1, probe=["1500", "--hold"]
        ))  # fmt: skip
        wait_running(real_cluster, product, ns, "busy")
        assert probe_output(real_cluster, ns, "busy")["allocs"] == [0]
        get = ui_client(product, real_cluster)

        def live():
            status, answer = get(f"/api/v1/nodes?node={product.node.name}", token)
            _trial["nodes"] = (status, answer)
            if status != 200 or not answer["items"]:
                return None
            (node,) = answer["items"]
            gpu = next(d for d in node["devices"] if d["uuid"] == GPU1)
            used = gpu["usage"]["memoryUsedMiB"]
            return (node, gpu) if node["monitor"]["state"] == "live" and used and used >= 1500 else None

        try:
            node, gpu = real_cluster.wait_for(live, "the GPU's live usage on /api/v1/nodes", timeout=60, interval=1)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {json.dumps(_trial['nodes'])[:3000]}") from None
        assert gpu["usage"]["state"] == "live" and node["monitor"]["error"] is None, node["monitor"]
        status, answer = get(f"/api/v1/pods?namespace={ns}", token)
        (item,) = [i for i in answer["items"] if i["name"] == "busy"]
        (grant,) = item["containers"][0]["grants"]
        assert grant["uuid"] == GPU1 and grant["memoryMiB"] == 4000, grant
        delete_and_wait(real_cluster, ns, "busy")
    finally:
        real_cluster.api(
            "DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}", expect=(200, 404)
        )
        real_cluster.api("DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterroles/view-nodes-pods", expect=(200, 404))


def test_helm_upgrade_with_a_changed_value_keeps_the_running_pods_allocations(
    product: Product, real_cluster: KubeCluster, ns: str, busybox: str
):
    node = product.node.name
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod(
        product, "kept", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000, "nvidia.com/gpucores": 60}, GPU1, image=busybox
    ))  # fmt: skip
    before = wait_running(real_cluster, product, ns, "kept")
    grant = before["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
    old = {p["metadata"]["uid"] for p in product.pods()}
    # a changed value that rolls the scheduler, the device plugin and the monitor
    stamp = {"podAnnotations": {"hami.test/trial": uuid.uuid4().hex[:8]}}
    product.upgrade({"scheduler": stamp, "devicePlugin": stamp})
    new = {p["metadata"]["uid"] for p in product.pods()}
    assert not old & new, "the upgrade did not replace the product's pods"
    after = get_pod(real_cluster, ns, "kept")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] == grant
    assert after["status"]["phase"] == "Running"
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0

    def counted():
        text = product.scheduler_metrics()
        got = (
            value(text, "hami_vgpu_memory_allocated_bytes", namespace=ns, pod="kept"),
            value(text, "hami_gpu_memory_allocated_bytes", node=node, device_uuid=GPU1),
        )
        return got if got[0] else None

    pod_bytes, gpu_bytes = real_cluster.wait_for(counted, "the new scheduler counting the pod", timeout=60, interval=1)
    assert pod_bytes == [float(30000 * MiB)] and gpu_bytes == [float(30000 * MiB)], (pod_bytes, gpu_bytes)
    # the new scheduler does not hand out what the running pod holds ...
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod(
        product, "over", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": GPU_MEMORY_MIB - 30000 + 1000}, GPU1, image=busybox
    ))  # fmt: skip
    wait_refused(real_cluster, ns, "over", "CardInsufficientMemory")
    # ... and gives out what is left
    real_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", gpu_pod(
        product, "beside", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 5000}, GPU1, image=busybox
    ))  # fmt: skip
    wait_running(real_cluster, product, ns, "beside")
    delete_and_wait(real_cluster, ns, "over", "beside", "kept")


def test_helm_uninstall_leaves_nothing_cluster_scoped_behind(product: Product, real_cluster: KubeCluster):
    problems = product.uninstall()
    _trial["uninstalled"] = True
    assert not problems, problems
    real_cluster.wait_for(lambda: not product.pods(), "the release's pods gone", timeout=120, interval=0.5)
    left = sorted(cluster_objects(real_cluster) - _trial["before"])
    assert not left, f"left by helm uninstall: {left}"
    marks, before = node_marks(real_cluster, product.node.name), _trial["node before"]
    labels = marks["labels"] - before["labels"]
    annotations = marks["annotations"] - before["annotations"] - DOCUMENTED_NODE_LEFTOVERS
    assert not labels and not annotations, f"on the Node after uninstall: labels {labels}, annotations {annotations}"
    remaining = {}
    for kind in ("secrets", "configmaps", "serviceaccounts", "services"):
        items = real_cluster.api("GET", f"/api/v1/namespaces/{NAMESPACE}/{kind}")["items"]
        remaining[kind] = sorted(
            i["metadata"]["name"] for i in items if i["metadata"]["name"] not in ("default", "kube-root-ca.crt")
        )
    for kind in ("roles", "rolebindings"):
        items = real_cluster.api("GET", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/{kind}")["items"]
        remaining[kind] = sorted(i["metadata"]["name"] for i in items)
    assert not any(remaining.values()), f"left in {NAMESPACE}: {remaining}"
