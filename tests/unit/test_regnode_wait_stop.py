"""The DRA agent's start-up wait for the API server (hami.kube.client.until_answered) and
SIGTERM: a request that hangs (a server that accepts and never answers, a black-holed address)
must not hold the stop back until its time-out (30 s, the kubelet's default grace period, after
which the agent is killed instead of ending)."""

from __future__ import annotations

import asyncio

from kubernetes_asyncio import client

from hami.kube.client import KubeClient, until_answered


async def _turns(n: int = 50) -> None:
    """Let the loop run ``n`` turns (no wall-clock time: the steps below need a few)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_stop_ends_the_wait_while_a_request_hangs():
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def call():
        started.set()
        try:
            await asyncio.Future()  # never answered
        except asyncio.CancelledError:
            cancelled.set()
            raise

    stop = asyncio.Event()
    kube = KubeClient(client.ApiClient(client.Configuration(host="https://api:6443")))
    waiting = asyncio.create_task(until_answered(kube, call, "Node n1", stop, delay=0))
    try:
        await started.wait()
        stop.set()  # SIGTERM while the request is out
        await _turns()
        assert waiting.done(), "until_answered still waits on the hanging request after the stop"
        assert waiting.result() is None and cancelled.is_set()
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await kube.close()


async def test_a_stop_set_before_the_start_asks_nothing():
    calls = []

    async def call():
        calls.append(1)
        return "node"

    stop = asyncio.Event()
    stop.set()
    kube = KubeClient(client.ApiClient(client.Configuration(host="https://api:6443")))
    try:
        assert await until_answered(kube, call, "Node n1", stop, delay=0) is None
    finally:
        await kube.close()
    assert calls == []


async def test_an_answer_still_comes_back_and_the_stop_waiter_is_not_left_behind():
    async def call():
        await asyncio.sleep(0)
        return "node"

    stop = asyncio.Event()
    kube = KubeClient(client.ApiClient(client.Configuration(host="https://api:6443")))
    before = len(asyncio.all_tasks())
    try:
        assert await until_answered(kube, call, "Node n1", stop, delay=0) == "node"
        await _turns()
        assert len(asyncio.all_tasks()) == before
    finally:
        await kube.close()
