"""The scheduler's HTTP surface under bad input and slow clients: every malformed body gets a
4xx (or the protocol's error field) with a reason, never a 500; slow or idle connections are
closed and cannot crowd out a real client."""

from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hami.scheduler import server as S
from hami.scheduler.options import Options
from hami.scheduler.server import SchedulerService

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


@pytest.mark.parametrize(
    "args, text",
    [
        ({"Pod": []}, "ExtenderArgs.Pod: must be a map"),
        ({"Pod": pod("a"), "NodeNames": "n1"}, "ExtenderArgs.NodeNames: must be a list"),
        ({"Pod": pod("a"), "NodeNames": [1]}, "ExtenderArgs.NodeNames[0]: must be a string"),
        # (a list of names is checked in one pass; a bad element deep in a long one is still named)
        (
            {"Pod": pod("a"), "NodeNames": [f"n{i}" for i in range(3000)] + [None]},
            "ExtenderArgs.NodeNames[3000]: must not",
        ),
        (
            {"Pod": pod("a"), "NodeNames": [f"n{i}" for i in range(3000)] + [[]]},
            "ExtenderArgs.NodeNames[3000]: must be a",
        ),
        ({"Pod": {"metadata": {"name": "a", "annotations": {"x": 1}}}, "NodeNames": ["n1"]}, "annotations[x]"),
        (
            {
                "Pod": {"metadata": {"name": "a"}, "spec": {"containers": [{"resources": {"limits": []}}]}},
                "NodeNames": ["n1"],
            },
            "containers[0].resources.limits: must be a map",
        ),
        (
            {"Pod": pod("a"), "Nodes": {"items": [{"metadata": {"annotations": []}}]}},
            "Nodes.items[0].metadata.annotations",
        ),
    ],
)
async def test_wrongly_typed_filter_args_get_the_error_field(args, text):
    async with TestClient(TestServer(service(node("n1")).app())) as client:
        r = await client.post("/filter", json=args)
        assert r.status == 200 and text in (await r.json())["Error"]


@pytest.mark.parametrize(
    "args",
    [
        {"PodName": 1, "Node": "n1"},
        {"PodName": "a", "Node": ["n1"]},
        {"PodName": "a", "PodNamespace": {}, "Node": "n1"},
    ],
)
async def test_wrongly_typed_bind_args_get_the_error_field(args):
    async with TestClient(TestServer(service(node("n1")).app())) as client:
        r = await client.post("/bind", json=args)
        assert r.status == 200 and "ExtenderBindingArgs." in (await r.json())["Error"]


async def test_webhook_answers_a_well_formed_review():
    svc = service(node("n1"))
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "operation": "CREATE",
            "kind": {"kind": "Pod"},
            "namespace": "ns",
            "object": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}},
        },
    }
    async with TestClient(TestServer(svc.app())) as client:
        r = await client.post("/webhook", data=json.dumps(review))
        body = await r.json()
        assert r.status == 200 and body["response"] == {"uid": "u", "allowed": True}


async def test_a_review_of_more_values_than_any_stored_pod_gets_400_without_the_exact_walk(monkeypatch):
    """Anyone who reaches the port may POST a review: 4 MiB of empty lists (1.3 million values)
    held the event loop, Filter and Bind with it, about 7 s (found by review). Refused after the
    quick pass; /filter keeps the general limit (a Filter without a node cache carries nodes)."""
    from hami.core import shape

    attack = b'{"request": {"object": {"spec": {"x": [' + b",".join([b"[]"] * 1_300_000) + b"]}}}}"
    assert len(attack) < S.MAX_BODY
    walk = shape._walk
    walked = []
    monkeypatch.setattr(shape, "_walk", lambda *a: walked.append(1) or walk(*a))
    async with TestClient(TestServer(service(node("n1")).app())) as client:
        r = await client.post("/webhook", data=attack)
        assert r.status == 400 and f"more than {S.WEBHOOK_MAX_VALUES} values" in await r.text()
        assert walked == []
        r = await client.post("/filter", data=attack)  # not a review: within the general limit
        assert r.status == 200 and walked == [1]


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


async def test_a_lone_surrogate_a_body_carried_is_answered_not_a_500():
    """orjson reads what json read (the escape "\\ud800" decodes to a lone surrogate) but will not
    write it back; the answers that repeat it (the AdmissionReview's uid, a pod name in an Error)
    fall back to json, which escapes it."""
    review = (
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"\\ud800",'
        b'"operation":"CREATE","object":{"metadata":{"name":"a"},"spec":{"containers":[]}}}}'
    )
    args = b'{"Pod":{"metadata":{"name":"a\\ud800","uid":"u1"},"spec":{"containers":[]}},"NodeNames":["n1"]}'
    async with TestClient(TestServer(service(node("n1")).app())) as client:
        r = await client.post("/webhook", data=review)
        assert r.status == 200 and (await r.json())["response"]["uid"] == "\ud800"
        r = await client.post("/filter", data=args)
        assert r.status == 200 and "a\ud800" in (await r.json())["Error"]
