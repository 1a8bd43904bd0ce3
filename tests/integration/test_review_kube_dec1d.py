"""Found by review, 1 Dec, checked on a real API server: a ResourceClaim whose opaque parameters
hold a lone surrogate (stored and served verbatim) stopped the reflector; relists and the node
monitor's pod lists now ask the watch cache for data not older than what they had, and fall back
to a consistent list when it refuses. The protocol details: tests/unit/test_review_kube_dec1d.py.
"""

from __future__ import annotations

import asyncio

import pytest

from ._hami import claim_json, post_json_text
from .test_scheduler import _Seen

pytestmark = pytest.mark.integration


async def _until(probe, seconds: float = 10.0) -> bool:
    for _ in range(int(seconds / 0.1)):
        if probe():
            return True
        await asyncio.sleep(0.1)
    return probe()


def test_a_claim_with_a_lone_surrogate_is_listed_and_watched(kube_cluster, kube_namespace):
    """found by review, 1 Dec (v1.37.2): the API server takes a claim whose opaque parameters hold
    ``"\\ud800"`` (Go's JSON accepts it) and serves it byte for byte; orjson refused it, so the
    list carrying it never synced (a restarted scheduler never ready) and the watch carrying it
    resumed before it for ever. Both read it now (U+FFFD, as Go), and later claims arrive."""
    from hami.kube.client import KubeClient
    from hami.kube.reflector import Reflector

    path = f"/apis/resource.k8s.io/v1/namespaces/{kube_namespace}/resourceclaims"
    lone = '{"x": "a\\ud800b", "y": "\\udc00"}'
    post_json_text(kube_cluster, path, claim_json("lone-before", lone))

    async def scenario():
        kube = await KubeClient.connect(str(kube_cluster.kubeconfig))
        seen = _Seen()
        r = Reflector(kube, path, seen, watch_timeout=30)
        task = asyncio.create_task(r.run())
        try:
            await asyncio.wait_for(r.synced.wait(), 20)
            assert "lone-before" in seen.items
            for name, params in (("lone-after", lone), ("plain", '{"a": 1}')):
                await asyncio.to_thread(post_json_text, kube_cluster, path, claim_json(name, params))
            assert await _until(lambda: {"lone-after", "plain"} <= set(seen.items)), sorted(seen.items)
            params = seen.items["lone-after"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
            assert params == {"x": "a\ufffdb", "y": "\ufffd"} and r.relists == 1
        finally:
            task.cancel()
            await kube.close()

    asyncio.run(scenario())


class _Recording:
    """A KubeClient that records each list's query, and rewrites the first not-older-than
    list's version to ``ahead`` when given (a store behind it: an etcd restore)."""

    def __init__(self, kube, ahead: str | None = None):
        self.kube, self.ahead = kube, ahead
        self.lists: list[dict] = []

    async def request(self, method, path, query=(), **kw):
        q = dict(query)
        if self.ahead and q.get("resourceVersionMatch") == "NotOlderThan":
            q["resourceVersion"], self.ahead = self.ahead, None
        self.lists.append(q)
        return await self.kube.request(method, path, list(q.items()), **kw)

    async def open(self, method, path, query=(), **kw):
        return await self.kube.open(method, path, query, **kw)


@pytest.mark.parametrize("ahead", [None, "999999999"])
def test_a_relist_after_an_api_server_restart_converges(kube_cluster, kube_namespace, ahead):
    """found by review, 1 Dec: after an API server restart every watch expires (410: its new
    watch cache begins after the version the watch had), and every agent relisted with a
    consistent list read from etcd. The relist asks the watch cache for data not older than the
    last version taken now, which the real API server serves; when the store is behind that
    version (``ahead``: an etcd restore), its "too large" answer makes the next list a
    consistent one. Either way the cache converges, with what was written meanwhile."""
    from hami.kube.client import KubeClient
    from hami.kube.reflector import Reflector

    path = f"/api/v1/namespaces/{kube_namespace}/configmaps"

    def create(name: str, kind: str = "ConfigMap") -> None:
        where = path if kind == "ConfigMap" else path.replace("configmaps", "secrets")
        kube_cluster.api("POST", where, {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}})

    create("before")

    async def scenario():
        kube = await KubeClient.connect(str(kube_cluster.kubeconfig))
        client = _Recording(kube, ahead)
        seen = _Seen()
        r = Reflector(client, path, seen, watch_timeout=300)  # type: ignore[arg-type]
        task = asyncio.create_task(r.run())
        try:
            await asyncio.wait_for(r.synced.wait(), 20)
            await asyncio.to_thread(create, "watched")
            assert await _until(lambda: "watched" in seen.items)
            # a write elsewhere: the watch's version falls behind where the new watch cache begins
            await asyncio.to_thread(create, "elsewhere", "Secret")
            await asyncio.to_thread(kube_cluster.restart, "kube-apiserver")
            await asyncio.to_thread(create, "after")
            assert await _until(lambda: "after" in seen.items and r.relists >= 2, 30), (seen.items, client.lists)
            assert {"before", "watched", "after"} <= set(seen.items)
            cached = client.lists[1]
            assert cached.get("resourceVersionMatch") == "NotOlderThan" and "limit" not in cached, client.lists
            if ahead:  # refused (504 too large), then a consistent list
                assert "resourceVersion" not in client.lists[-1], client.lists
            else:
                assert cached["resourceVersion"] == seen.items["watched"]["metadata"]["resourceVersion"]
                assert r.relists == 2, client.lists
        finally:
            task.cancel()
            await kube.close()

    asyncio.run(scenario())


def test_the_node_monitor_lists_from_the_watch_cache_on_a_real_api_server(kube_cluster, kube_namespace, monkeypatch):
    """found by review, 1 Dec: the node monitor's list every 5 s read etcd. After its first
    list it asks for pods not older than that list (no limit), which the real API server
    answers; a version ahead of the store (504) is asked again consistently in the same call.
    Each list the monitor sends is recorded on its way to the API server (the test review,
    1 Dec: converging alone did not show the watch cache was asked)."""
    from kubernetes_asyncio import client as kclient

    from hami.monitor import kube as mkube

    node = f"review-{kube_namespace}"[:60]
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    calls: list[dict] = []
    real = kclient.CoreV1Api.list_pod_for_all_namespaces

    async def recording(self, **kwargs):
        calls.append(dict(kwargs))
        return await real(self, **kwargs)

    monkeypatch.setattr(kclient.CoreV1Api, "list_pod_for_all_namespaces", recording)

    def create(name: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "example.invalid/x"}]},
        }
        kube_cluster.api("POST", pods, body)

    create("a")

    async def scenario():
        api = await mkube.api_client(str(kube_cluster.kubeconfig))
        mkube._SINCE_CONSISTENT.pop(node, None)
        try:
            first = await mkube.node_pods(api, node)
            assert [p.name for p in first.values()] == ["a"] and node in mkube._LISTED
            listed = mkube._LISTED[node]  # the first list's version
            await asyncio.to_thread(create, "b")
            names: set[str] = set()
            for _ in range(50):
                names = {p.name for p in (await mkube.node_pods(api, node)).values()}
                if names == {"a", "b"}:
                    break
                await asyncio.sleep(0.2)
            assert names == {"a", "b"}
            # the first list consistent (paged), the second from the watch cache: unpaged, not older
            assert "resource_version" not in calls[0] and calls[0].get("limit") == 500, calls
            assert calls[1].get("resource_version_match") == "NotOlderThan" and "limit" not in calls[1], calls
            assert calls[1].get("resource_version") == listed, calls
            mkube._LISTED[node] = "999999999"  # (as after an etcd restore)
            mkube._SINCE_CONSISTENT.pop(node, None)  # (not the every-so-often consistent list)
            del calls[:]
            assert {p.name for p in (await mkube.node_pods(api, node)).values()} == {"a", "b"}
            assert mkube._LISTED[node] != "999999999"
            assert len(calls) == 2, calls  # refused ("too large"), then asked again consistently
            assert calls[0].get("resource_version") == "999999999", calls
            assert calls[0].get("resource_version_match") == "NotOlderThan" and "limit" not in calls[0], calls
            assert "resource_version" not in calls[1] and "resource_version_match" not in calls[1], calls
        finally:
            mkube._LISTED.pop(node, None)
            mkube._SINCE_CONSISTENT.pop(node, None)
            await api.close()

    asyncio.run(scenario())
