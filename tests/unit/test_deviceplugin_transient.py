"""The device plugin's idempotent writes ride out a short API-server outage (found by
tests/integration/test_chaos.py: a kube-apiserver restart during Allocate failed the pod)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from hami.deviceplugin import kube as dkube


def _api_error(status: int) -> ApiException:
    exc = ApiException(status=status, reason="x")
    return exc


@pytest.mark.parametrize(
    "exc, expected",
    [
        (ConnectionRefusedError(111, "refused"), True),
        (ConnectionResetError(104, "reset"), True),
        (aiohttp.ClientConnectionError("gone"), True),
        (asyncio.TimeoutError(), True),
        (_api_error(503), True),
        (_api_error(429), True),
        (_api_error(422), False),
        (_api_error(404), False),
        (_api_error(403), False),
        (ValueError("bad"), False),
    ],
)
def test_what_counts_as_transient(exc, expected):
    assert dkube.transient(exc) is expected


async def test_a_write_is_retried_through_an_outage_then_succeeds():
    calls = []

    async def write():
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionRefusedError(111, "Connection refused")
        return "written"

    assert await dkube.retry_transient(write, "test write", budget=5.0, delay=0.01) == "written"
    assert len(calls) == 4


async def test_a_non_transient_error_is_raised_at_once_and_an_outage_past_the_budget_is_raised():
    calls = []

    async def refused():
        calls.append(1)
        raise _api_error(422)

    with pytest.raises(ApiException):
        await dkube.retry_transient(refused, "test write", budget=5.0, delay=0.01)
    assert len(calls) == 1

    async def down():
        calls.append(1)
        raise ConnectionRefusedError(111, "Connection refused")

    calls.clear()
    with pytest.raises(ConnectionRefusedError):
        await dkube.retry_transient(down, "test write", budget=0.05, delay=0.01)
    assert 2 <= len(calls) < 50


async def test_allocates_reads_ride_out_a_busy_api_server(monkeypatch):
    """One 429 (API Priority and Fairness) or refused connection on Allocate's first reads failed
    the pod for good (the kubelet's UnexpectedAdmissionError), nothing written: reads are retried
    as the writes are."""
    from types import SimpleNamespace

    from kubernetes_asyncio import client

    monkeypatch.setattr(dkube, "TRANSIENT_BUDGET_S", 5.0)
    kube = dkube.Kube(client.ApiClient(), "n1")
    tries = {"pod": 0, "list": 0, "node": 0}

    def pod_obj():
        meta = SimpleNamespace(namespace="ns", name="p", uid="u", annotations={})
        spec = SimpleNamespace(init_containers=None, containers=[], node_name="n1")
        return SimpleNamespace(metadata=meta, spec=spec, status=None)

    async def read_namespaced_pod(name, namespace, **_):
        tries["pod"] += 1
        if tries["pod"] == 1:
            raise _api_error(429)
        return pod_obj()

    async def list_pod_for_all_namespaces(**_):
        tries["list"] += 1
        if tries["list"] == 1:
            raise ConnectionRefusedError(111, "Connection refused")
        return SimpleNamespace(items=[pod_obj()])

    async def node_annotations():
        tries["node"] += 1
        if tries["node"] == 1:
            raise _api_error(503)
        return {"k": "v"}, "7"

    monkeypatch.setattr(kube.core, "read_namespaced_pod", read_namespaced_pod)
    monkeypatch.setattr(kube.core, "list_pod_for_all_namespaces", list_pod_for_all_namespaces)
    monkeypatch.setattr(kube, "_node_annotations", node_annotations)
    try:
        assert (await kube.get_pod("ns", "p")).name == "p"
        assert [p.name for p in await kube.pods_on_node()] == ["p"]
        assert await kube.node_annotations() == ({"k": "v"}, "7")
        assert tries == {"pod": 2, "list": 2, "node": 2}
    finally:
        await kube.api.close()
