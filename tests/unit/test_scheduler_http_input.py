"""The scheduler's HTTP surface under bad input and slow clients: every malformed body gets a
4xx (or the protocol's error field) with a reason, never a 500; slow or idle connections are
closed and cannot crowd out a real client."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer

from hami.scheduler import server as S
from hami.scheduler.options import Options
from hami.scheduler.server import ConnectionGuard, SchedulerService, serve

from .test_scheduler_state import node, pod


def service(*nodes_):
    svc = SchedulerService(Options(), None)
    svc.extender.record = False
    svc.state.node_handler.replace(list(nodes_))
    return svc


BAD_BODIES = [
    (b"{nope", "not JSON"),
    (b"[1]", "must be a JSON object"),
    (b"\xff\xfe{}", "not JSON"),
    (b'{"a": NaN}', "NaN"),
    (b'{"a": Infinity}', "Infinity"),
    (b'{"a": -Infinity}', "Infinity"),
    (b'{"a": ' + b"9" * 5000 + b"}", "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested"),
    (b'{"a": ' + b"[" * 80 + b"]" * 80 + b"}", "nested more than 64"),
]


@pytest.mark.parametrize("path", ["/filter", "/bind", "/webhook"])
@pytest.mark.parametrize("body, text", BAD_BODIES)
async def test_malformed_bodies_get_400_with_the_reason(path, body, text):
    async with TestClient(TestServer(service(node("n1")).app())) as client:
        r = await client.post(path, data=body)
        assert r.status == 400 and text in await r.text()


async def test_an_oversize_body_gets_413():
    async with TestClient(TestServer(service(node("n1")).app())) as client:
        r = await client.post("/filter", data=b" " * (S.MAX_BODY + 1))
        assert r.status == 413 and "exceeded" in await r.text()


@pytest.mark.parametrize("args, text", [
    ({"Pod": []}, "ExtenderArgs.Pod: must be a map"),
    ({"Pod": pod("a"), "NodeNames": "n1"}, "ExtenderArgs.NodeNames: must be a list"),
    ({"Pod": pod("a"), "NodeNames": [1]}, "ExtenderArgs.NodeNames[0]: must be a string"),
    # (a list of names is checked in one pass; a bad element deep in a long one is still named)
    ({"Pod": pod("a"), "NodeNames": [f"n{i}" for i in range(3000)] + [None]}, "ExtenderArgs.NodeNames[3000]: must not"),
    ({"Pod": pod("a"), "NodeNames": [f"n{i}" for i in range(3000)] + [[]]}, "ExtenderArgs.NodeNames[3000]: must be a"),
    ({"Pod": {"metadata": {"name": "a", "annotations": {"x": 1}}}, "NodeNames": ["n1"]}, "annotations[x]"),
    ({"Pod": {"metadata": {"name": "a"}, "spec": {"containers": [{"resources": {"limits": []}}]}},
      "NodeNames": ["n1"]}, "containers[0].resources.limits: must be a map"),
    ({"Pod": pod("a"), "Nodes": {"items": [{"metadata": {"annotations": []}}]}}, "Nodes.items[0].metadata.annotations"),
])
async def test_wrongly_typed_filter_args_get_the_error_field(args, text):
    async with TestClient(TestServer(service(node("n1")).app())) as client:
        r = await client.post("/filter", json=args)
        assert r.status == 200 and text in (await r.json())["Error"]


@pytest.mark.parametrize("args", [{"PodName": 1, "Node": "n1"}, {"PodName": "a", "Node": ["n1"]},
                                  {"PodName": "a", "PodNamespace": {}, "Node": "n1"}])
async def test_wrongly_typed_bind_args_get_the_error_field(args):
    async with TestClient(TestServer(service(node("n1")).app())) as client:
        r = await client.post("/bind", json=args)
        assert r.status == 200 and "ExtenderBindingArgs." in (await r.json())["Error"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _closed(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), within) == b""
    except (asyncio.TimeoutError, ConnectionResetError):
        return False


async def test_a_slow_request_head_is_cut_off(monkeypatch):
    port = _free_port()
    runner = await serve(service(node("n1")), "127.0.0.1", port, guard=ConnectionGuard(head_timeout=0.3))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\n")  # ... and never the rest
        await writer.drain()
        assert await _closed(reader, 10)
        writer.close()
    finally:
        await runner.cleanup()


async def test_a_slow_body_gets_408(monkeypatch):
    monkeypatch.setattr(S, "BODY_TIMEOUT", 0.3)
    port = _free_port()
    runner = await serve(service(node("n1")), "127.0.0.1", port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readline(), 10)
        assert answer.startswith(b"HTTP/1.1 408")
        writer.close()
    finally:
        await runner.cleanup()


async def test_idle_connections_cannot_crowd_out_a_real_client():
    """With the cap at 8, 20 connections that never send a request do not keep a real Filter
    out: each new connection evicts the one that has waited longest for its head."""
    port = _free_port()
    guard = ConnectionGuard(max_connections=8, head_timeout=60)
    svc = service(node("n1"))
    real = pod("a", mem=10, phase="Pending")
    svc.state.put_pod(real)  # as the pod watch would: a Filter is only for a pod the API server has
    runner = await serve(svc, "127.0.0.1", port, guard=guard)
    idle = []
    try:
        for _ in range(20):
            idle.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.1)
        assert len(guard.conns) <= 8 and guard.evicted >= 12
        async with ClientSession() as session:
            r = await session.post(f"http://127.0.0.1:{port}/filter",
                                   json={"Pod": real, "NodeNames": ["n1"]})
            assert r.status == 200 and (await r.json())["NodeNames"] == ["n1"]
    finally:
        for _, w in idle:
            w.close()
        await runner.cleanup()


async def test_webhook_answers_a_well_formed_review():
    svc = service(node("n1"))
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"}, "namespace": "ns",
                          "object": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}}}
    async with TestClient(TestServer(svc.app())) as client:
        r = await client.post("/webhook", data=json.dumps(review))
        body = await r.json()
        assert r.status == 200 and body["response"] == {"uid": "u", "allowed": True}


async def test_bind_without_an_api_client_is_an_error_not_a_500():
    async with TestClient(TestServer(service(node("n1")).app())) as client:
        r = await client.post("/bind", json={"PodName": "a", "PodNamespace": "ns", "Node": "n1"})
        assert r.status == 200 and "no API server client" in (await r.json())["Error"]


def test_a_list_of_strings_counts_every_value_and_its_depth_in_the_tree_check():
    from hami.core.shape import ShapeError, check_tree

    check_tree({"names": ["n"] * 10}, "body", max_nodes=12)  # the map, the list, ten names
    with pytest.raises(ShapeError, match="more than 11 values"):
        check_tree({"names": ["n"] * 10}, "body", max_nodes=11)
    deep: object = ["n", "m"]
    for _ in range(63):
        deep = [deep]
    check_tree(deep, "body", max_depth=64)
    with pytest.raises(ShapeError, match="nested more than 64"):
        check_tree([deep], "body", max_depth=64)
