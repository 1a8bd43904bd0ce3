"""Every API call of the device plugin is bounded in time (kube.API_TIMEOUT_S, and the retried
writes by kube.TRANSIENT_BUDGET_S): without a ``_request_timeout`` kubernetes_asyncio waits for
an answer for ever, so a connection the network black-holes (an API server failing over) hung
Allocate, and the kubelet, which calls Allocate without a deadline, with it. Here the API server
accepts connections and never answers (or answers reads only); the calls must fail in time, as
the API failures they are, and Allocate must still try every write of its failure path."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from hami.deviceplugin import allocate as A
from hami.deviceplugin import kube as dkube
from hami.deviceplugin.allocator import Allocator, preferred_allocation
from hami.node.layout import HookPaths
from hami.node.settings import NodeSettings

from ._apikit import within

LOCK_P = "2026-11-22T03:00:00Z,ns,p"


@pytest.fixture
def short(monkeypatch):
    """Time-outs short enough for a unit test."""
    monkeypatch.setattr(dkube, "API_TIMEOUT_S", 0.5)
    monkeypatch.setattr(dkube, "TRANSIENT_BUDGET_S", 0.5)
    monkeypatch.setattr(dkube, "MIN_ATTEMPT_S", 0.2)


def api_for(host: str) -> client.ApiClient:
    return client.ApiClient(client.Configuration(host=host))


def pod_obj() -> dict:
    to_allocate = "GPU-1,NVIDIA,1000,10:;"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "uid-p",
            "resourceVersion": "9",
            "annotations": {
                A.BIND_PHASE: "allocating",
                A.TO_ALLOCATE: to_allocate,
                A.ALLOCATED: to_allocate,
                A.VGPU_NODE: "n1",
                A.BIND_TIME: "1",
            },
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Pending"},
    }


CALLS = {
    "node": lambda k: k.node(),
    "node_annotations": lambda k: k.node_annotations(),
    "patch_node_annotations": lambda k: k.patch_node_annotations({"a": "b"}, "7"),
    "node_event": lambda k: k.node_event("Warning", "Test", "a message"),
    "get_pod": lambda k: k.get_pod("ns", "p"),
    "pods_on_node": lambda k: k.pods_on_node(),
    "patch_pod_annotations": lambda k: k.patch_pod_annotations(A.pod_view_from_object(pod_obj()), {"a": "b"}),
    "release_held_lock": lambda k: k.release_held_lock(LOCK_P),
    "release_lock": lambda k: k.release_lock(None),
}


@pytest.mark.parametrize("name", sorted(CALLS))
async def test_every_call_fails_in_time_as_a_transient_api_failure(name, black_hole, short):
    kube = dkube.Kube(api_for(black_hole), "n1")
    try:
        with pytest.raises(Exception) as failed:
            await within(CALLS[name](kube))
        assert dkube.transient(failed.value), failed.value  # what the retries and the callers expect
        assert "in time" in dkube.describe(failed.value)
    finally:
        await kube.close()


async def test_a_retried_write_that_gets_no_answer_ends_with_its_budget(monkeypatch):
    monkeypatch.setattr(dkube, "MIN_ATTEMPT_S", 0.1)
    attempts = []

    async def unanswered():
        attempts.append(1)
        await asyncio.Event().wait()

    with pytest.raises(asyncio.TimeoutError):
        await within(dkube.retry_transient(unanswered, "test write", budget=0.3, delay=0.05))
    assert len(attempts) == 1  # the attempt ran to the budget's end: nothing left to retry in


async def test_allocate_fails_in_time_when_the_api_server_does_not_answer(black_hole, short, tmp_path):
    kube = dkube.Kube(api_for(black_hole), "n1")
    alloc = Allocator(kube, NodeSettings(), HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock")), gpus=["GPU-1"])
    try:
        with pytest.raises(A.AllocationError, match="node n1: allocation failed: no answer from the API server"):
            await within(alloc.allocate([1]))
    finally:
        await kube.close()


async def test_preferred_allocation_falls_back_to_plain_order_in_time(black_hole, short, tmp_path):
    kube = dkube.Kube(api_for(black_hole), "n1")
    alloc = Allocator(kube, NodeSettings(), HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock")), gpus=["GPU-1"])
    try:
        assert await within(preferred_allocation(alloc, [(["id-a", "id-b"], [], 1)])) == [["id-a"]]
    finally:
        await kube.close()


async def test_unanswered_writes_fail_the_allocation_in_time_and_every_failure_write_is_tried(short, tmp_path):
    """Reads are answered, writes never: the lock release, the success write, the failed write
    and the lock release of the failure path each time out, and Allocate still answers, with the
    pod named, after trying each of them (none of them skipped because an earlier one hung)."""
    patches: list[tuple[str, str, dict | list]] = []
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/api/v1/nodes/n1":
            return web.json_response({"metadata": {"annotations": {A.NODE_LOCK: LOCK_P}, "resourceVersion": "7"}})
        if request.method == "GET" and request.path == "/api/v1/namespaces/ns/pods/p":
            return web.json_response(pod_obj())
        if request.method == "PATCH":
            patches.append((request.path, request.content_type, json.loads(await request.read())))
            await release.wait()  # no answer (until the test ends)
            return web.json_response({}, status=500)
        return web.json_response({"kind": "Status", "message": "unexpected"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = TestServer(app)
    await server.start_server()
    kube = dkube.Kube(api_for(str(server.make_url("")).rstrip("/")), "n1")
    alloc = Allocator(
        kube, NodeSettings(), HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock")), release_delay=0, gpus=["GPU-1"]
    )
    try:
        with pytest.raises(A.AllocationError, match="pod ns/p: allocation failed: no answer from the API server"):
            await within(alloc.allocate([1]))
    finally:
        release.set()
        await kube.close()
        await server.close()

    def kind(path: str, content_type: str, body) -> str:
        if path == "/api/v1/nodes/n1":
            return "lock compare-and-remove" if content_type == "application/json-patch+json" else "lock removal"
        return f"pod {body['metadata']['annotations'].get(A.BIND_PHASE)}"

    kinds = [kind(*p) for p in patches]
    firsts = list(dict.fromkeys(kinds))
    # release_delay 0: the success write first (the lock goes once it lands); its time-out fails
    # the pod: failed write, then the lock release all the same (a compare-and-remove of the
    # value read); each pod write names the UID read (a precondition)
    assert firsts == ["pod success", "pod failed", "lock compare-and-remove"], kinds
    assert {body["metadata"].get("uid") for path, _, body in patches if "/pods/" in path} == {
        pod_obj()["metadata"]["uid"]
    }


@pytest.mark.parametrize("injection", ["allocate", "nri"])
async def test_shutdown_writes_are_bounded_as_a_whole(black_hole, monkeypatch, tmp_path, caplog, injection):
    """SIGTERM with the API server unreachable: the node lock release and the withdrawal of the
    node's hami.io/node-lock-handoff run side by side under SHUTDOWN_WRITES_S, each call's own
    time-outs being longer here, so the plugin ends inside the pod's grace period instead of
    being killed mid-write. hami.io/node-injection (NRI) is not withdrawn at shutdown: the next
    plugin keeps it while its hook registers, or withdraws it (withdrawn here, the scheduler bound
    with the node lock until the next plugin's hook was back: the real-node kill test)."""
    from hami.core.names import NODE_INJECTION
    from hami.deviceplugin import agent as G
    from hami.kube.nodelock import LOCK_HANDOFF

    monkeypatch.setattr(dkube, "API_TIMEOUT_S", 60.0)  # alone, each write would outlast the guard
    monkeypatch.setattr(dkube, "TRANSIENT_BUDGET_S", 60.0)
    monkeypatch.setattr(G, "SHUTDOWN_WRITES_S", 0.5, raising=False)
    kube = dkube.Kube(api_for(black_hole), "n1")
    patches: list[dict] = []
    patch = kube.patch_node_annotations

    async def recorded(changes, *a, **kw):
        patches.append(dict(changes))
        return await patch(changes, *a, **kw)

    monkeypatch.setattr(kube, "patch_node_annotations", recorded)
    paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))
    node = G.NodeAgent(kube, NodeSettings(), [], tmp_path / "plugins", paths, injection=injection)
    try:
        with caplog.at_level("ERROR", logger=G.log.name):
            await within(node.stop(), bound=5.0)
    finally:
        await kube.close()
    assert patches == [{LOCK_HANDOFF: None}], patches
    assert all(NODE_INJECTION not in p for p in patches)
    assert "shutdown writes not done within 0.5s" in caplog.text, caplog.text
