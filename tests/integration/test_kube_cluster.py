"""The test control plane itself: scheduling, the extender wiring, the webhook wiring."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hami_devkit.cluster import ExtenderConfig, KubeCluster, SchedulerConfig

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0


def _pod(name: str, node: str, scheduler: str = "default-scheduler", resources: dict | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": "busybox", "resources": resources or {}}],
        },
    }


async def _wait(probe, what: str, timeout: float = TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await probe()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


async def _running_on(core: client.CoreV1Api, namespace: str, name: str, node: str):
    async def probe():
        pod = await core.read_namespaced_pod(name, namespace)
        return pod if pod.spec.node_name == node and pod.status.phase == "Running" else None

    return await _wait(probe, f"pod {namespace}/{name} Running on {node}")


async def _gone(core: client.CoreV1Api, namespace: str, name: str) -> None:
    async def probe():
        try:
            await core.read_namespaced_pod(name, namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    await _wait(probe, f"pod {namespace}/{name} deleted")


class _Server:
    """A tiny aiohttp server on 127.0.0.1 that records the JSON bodies it receives."""

    def __init__(self, routes: dict, ssl_context=None) -> None:
        self.calls: list[tuple[str, dict]] = []
        self._routes = routes
        self._ssl = ssl_context
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def __aenter__(self) -> _Server:
        app = web.Application()
        for path, handler in self._routes.items():
            app.router.add_post(path, self._recording(path, handler))
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()

    def _recording(self, path, handler):
        async def handle(request: web.Request) -> web.Response:
            body = await request.json()
            self.calls.append((path, body))
            return web.json_response(await handler(body))

        return handle

    def bodies(self, path: str) -> list[dict]:
        return [body for called, body in self.calls if called == path]


@pytest.fixture
def kwok_node(kube_cluster: KubeCluster):
    name = f"kwok-{uuid.uuid4().hex[:8]}"
    kube_cluster.create_node(name, gpus=2, labels={"gpu": "on"}, annotations={"hami.io/test": "yes"})
    yield name
    kube_cluster.delete_node(name)


def test_node_has_requested_labels_annotations_and_gpus(kube_cluster: KubeCluster, kwok_node: str):
    node = kube_cluster.api("GET", f"/api/v1/nodes/{kwok_node}")
    assert node["metadata"]["labels"]["gpu"] == "on"
    assert node["metadata"]["annotations"]["hami.io/test"] == "yes"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "20"  # 2 GPUs x split count 10


async def test_default_scheduler_pod_runs_on_kwok_node_and_is_deleted(kube_api, kube_namespace, kwok_node):
    core = client.CoreV1Api(kube_api)
    await core.create_namespaced_pod(kube_namespace, _pod("plain", kwok_node))
    pod = await _running_on(core, kube_namespace, "plain", kwok_node)
    assert pod.spec.scheduler_name == "default-scheduler"
    await core.delete_namespaced_pod("plain", kube_namespace)
    await _gone(core, kube_namespace, "plain")


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_hami_scheduler_pod_goes_through_the_extender(scheme, kube_cluster, kube_api, kube_namespace, kwok_node):
    """HTTPS: the scheduler verifies the extender's certificate against the cluster CA."""
    core = client.CoreV1Api(kube_api)

    async def filter_(args: dict) -> dict:
        return {"NodeNames": [n for n in args.get("NodeNames") or [] if n == kwok_node], "FailedNodes": {}, "Error": ""}

    async def bind(args: dict) -> dict:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": args["PodName"], "uid": args["PodUID"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]},
        }
        await core.create_namespaced_binding(args["PodNamespace"], binding, _preload_content=False)
        return {"Error": ""}

    tls = kube_cluster.server_ssl_context("extender") if scheme == "https" else None
    async with _Server({"/filter": filter_, "/bind": bind}, ssl_context=tls) as extender:
        url = f"{scheme}://127.0.0.1:{extender.port}"
        kube_cluster.configure_hami_scheduler(extender=ExtenderConfig(url_prefix=url))
        try:
            gpu = {"limits": {"nvidia.com/gpu": "1"}}
            await core.create_namespaced_pod(kube_namespace, _pod("gpu", kwok_node, "hami-scheduler", gpu))
            pod = await _running_on(core, kube_namespace, "gpu", kwok_node)
        finally:
            kube_cluster.configure_hami_scheduler(extender=None)

    filters, binds = extender.bodies("/filter"), extender.bodies("/bind")
    assert filters and binds, extender.calls
    assert {"Pod", "NodeNames"} <= filters[0].keys()  # nodeCacheCapable: names, not Node objects
    assert filters[0]["Pod"]["metadata"]["name"] == "gpu"
    assert kwok_node in filters[0]["NodeNames"]
    assert binds[0]["PodName"] == "gpu" and binds[0]["PodNamespace"] == kube_namespace
    assert binds[0]["Node"] == kwok_node and binds[0]["PodUID"] == pod.metadata.uid


async def test_mutating_webhook_is_called_with_the_cluster_ca(kube_cluster, kube_api, kube_namespace, kwok_node):
    core = client.CoreV1Api(kube_api)
    admission = client.AdmissionregistrationV1Api(kube_api)
    patch = [{"op": "add", "path": "/metadata/labels", "value": {"hami.io/mutated": "yes"}}]

    async def mutate(review: dict) -> dict:
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": review["request"]["uid"],
                "allowed": True,
                "patchType": "JSONPatch",
                "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
            },
        }

    name = f"hami-test-{kube_namespace}"[:63]
    async with _Server({"/mutate": mutate}, ssl_context=kube_cluster.server_ssl_context()) as webhook:
        await admission.create_mutating_webhook_configuration(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": name},
                "webhooks": [
                    {
                        "name": "mutate.test.hami.io",
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{webhook.port}/mutate",
                            "caBundle": kube_cluster.ca_bundle,
                        },
                        "rules": [
                            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                        ],
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kube_namespace}},
                        "failurePolicy": "Fail",
                        "sideEffects": "None",
                        "admissionReviewVersions": ["v1"],
                        "timeoutSeconds": 10,
                    }
                ],
            }
        )
        try:

            async def active():  # the API server picks the configuration up asynchronously
                await core.create_namespaced_pod(kube_namespace, _pod("probe", kwok_node), dry_run="All")
                return webhook.bodies("/mutate")

            await _wait(active, "the webhook configuration to take effect")
            created = await core.create_namespaced_pod(kube_namespace, _pod("mutated", kwok_node))
        finally:
            await admission.delete_mutating_webhook_configuration(name)

    assert created.metadata.labels == {"hami.io/mutated": "yes"}
    request = webhook.bodies("/mutate")[-1]["request"]
    assert request["kind"]["kind"] == "Pod" and request["operation"] == "CREATE"
    assert request["namespace"] == kube_namespace and request["object"]["metadata"]["name"] == "mutated"
    await _running_on(core, kube_namespace, "mutated", kwok_node)


def test_hami_scheduler_with_leader_election_holds_its_lease(kube_cluster: KubeCluster):
    previous = kube_cluster.configure_hami_scheduler(SchedulerConfig(leader_elect=True))
    try:
        lease = kube_cluster.wait_for(
            lambda: kube_cluster.api(
                "GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/hami-scheduler"
            ),
            "the kube-system/hami-scheduler Lease",
        )
        assert lease["spec"]["holderIdentity"]
    finally:
        kube_cluster.configure_hami_scheduler(previous)
