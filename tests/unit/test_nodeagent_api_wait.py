"""Start-up with an API server that cannot be reached: the scheduler and the DRA agent say what
they wait for (the server's URL, the error), at the first failure and then every 30 s, keep
retrying, and are not ready meanwhile."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket

import aiohttp
import pytest
from kubernetes_asyncio import client

from hami.kube.client import ApiWait, KubeClient, KubeError, until_answered


def _closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kubeconfig(tmp_path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
users: [{{name: u, user: {{token: t}}}}]
"""
    )
    return str(path)


class _OnLine(logging.Handler):
    """Calls ``then`` once, at the first record whose message contains ``text``."""

    def __init__(self, text: str, then) -> None:
        super().__init__()
        self.text, self.then, self.lines = text, then, []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.lines.append(message)
        if self.text in message and self.then is not None:
            then, self.then = self.then, None
            then()


def test_the_wait_is_logged_at_the_first_failure_then_every_30s_and_when_over():
    wait = ApiWait("https://api:6443", start=100.0)
    assert wait.waiting(100.5, "first lists: nodes", None) is None  # no failure yet, no answer yet
    first = wait.waiting(101.0, "first lists: nodes", "Cannot connect to host api:6443")
    assert first == (
        "waiting for the API server at https://api:6443 (first lists: nodes, 1s so far): "
        "Cannot connect to host api:6443; still retrying"
    )
    failures = [wait.waiting(101.0 + t, "first lists: nodes", "refused") for t in range(1, 60)]
    assert [i + 1 for i, line in enumerate(failures) if line] == [30]  # one more, 30 s after the first
    assert wait.over(175.0, "first lists") == "the API server at https://api:6443 answered: first lists after 75s"


def test_requests_that_just_hang_are_reported_after_30s():
    wait = ApiWait("https://api:6443", start=0.0)
    assert wait.waiting(29.0, "x", None) is None
    assert "no answer yet" in wait.waiting(30.0, "x", None)
    assert wait.over(31.0, "x") is not None
    assert ApiWait("https://api:6443", start=0.0).over(5.0, "x") is None  # never reported: nothing to end


async def test_the_client_keeps_why_the_last_request_got_no_answer():
    port = _closed_port()
    kube = KubeClient(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")), timeout=5)
    try:
        assert kube.server == f"http://127.0.0.1:{port}" and kube.failure is None
        with pytest.raises(aiohttp.ClientError):
            await kube.get("/api/v1/nodes")
        assert kube.failure is not None and f"127.0.0.1:{port}" in kube.failure and not kube.answered
    finally:
        await kube.close()


async def test_until_answered_retries_logs_at_a_bounded_rate_and_returns_the_answer(caplog):
    now = [0.0]
    calls = []

    async def call():
        now[0] += 5.0  # each attempt takes 5 s of the fake clock
        calls.append(now[0])
        if len(calls) <= 20:
            raise aiohttp.ClientConnectionError("Cannot connect to host api:6443")
        if len(calls) == 21:
            raise KubeError("GET", "/api/v1/nodes/n1", 503, "starting")
        return "node"

    kube = KubeClient(client.ApiClient(client.Configuration(host="https://api:6443")))
    try:
        with caplog.at_level(logging.INFO, logger="hami.test"):
            got = await until_answered(
                kube, call, "Node n1", asyncio.Event(), logging.getLogger("hami.test"), delay=0, clock=lambda: now[0]
            )
    finally:
        await kube.close()
    assert got == "node" and len(calls) == 22
    lines = [r.getMessage() for r in caplog.records if r.name == "hami.test"]
    # 21 failures over 105 s: the first, then one every 30 s; then the end of the wait
    assert len(lines) == 5
    assert lines[0].startswith("waiting for the API server at https://api:6443 (Node n1, 5s so far): Cannot connect")
    assert lines[-1] == "the API server at https://api:6443 answered: Node n1 after 110s"


async def test_until_answered_raises_what_is_not_the_servers_absence():
    async def call():
        raise KubeError("GET", "/api/v1/nodes/n1", 404, "not found")

    kube = KubeClient(client.ApiClient(client.Configuration(host="https://api:6443")))
    try:
        with pytest.raises(KubeError):
            await until_answered(kube, call, "Node n1", asyncio.Event(), delay=0)
    finally:
        await kube.close()


async def test_the_scheduler_says_what_it_waits_for_and_is_not_ready(tmp_path):
    from hami.scheduler.command import main
    from hami.scheduler.options import add_arguments, options_from_args

    api = f"https://127.0.0.1:{_closed_port()}"
    port = _closed_port()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--kubeconfig",
            _kubeconfig(tmp_path, api),
            "--http_bind",
            f"127.0.0.1:{port}",
            "--metrics-bind-address",
            "127.0.0.1:0",
        ]
    )
    seen = asyncio.Event()
    loop = asyncio.get_running_loop()
    handler = _OnLine(f"waiting for the API server at {api}", lambda: loop.call_soon_threadsafe(seen.set))
    logger = logging.getLogger("hami.scheduler")
    logger.addHandler(handler)
    task = asyncio.create_task(main(options_from_args(args)))
    try:
        await asyncio.wait_for(seen.wait(), 60)  # a safety cap only: the line comes within a second
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                assert resp.status == 503
    finally:
        logger.removeHandler(handler)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    line = next(m for m in handler.lines if "waiting for the API server" in m)
    assert "first lists: nodes, pods" in line and "Cannot connect" in line


async def test_the_dra_agent_waits_for_the_api_server_instead_of_failing(tmp_path):
    from hami.dra.model import SliceSettings
    from hami.draplugin.command import _serve
    from hami.node.settings import NodeSettings

    api = f"https://127.0.0.1:{_closed_port()}"
    args = argparse.Namespace(
        state_dir=str(tmp_path),
        kubeconfig=_kubeconfig(tmp_path, api),
        node_name="n1",
        health_recovery_seconds=0.0,
        unhealthy_taint="NoSchedule",
        apply_classes=False,
        extended_resource_name="",
    )
    # SIGTERM at the first "waiting" line: the agent stops waiting and ends normally
    handler = _OnLine(f"waiting for the API server at {api}", lambda: os.kill(os.getpid(), signal.SIGTERM))
    logger = logging.getLogger("hami.dra")
    logger.addHandler(handler)
    try:
        rc = await asyncio.wait_for(_serve(args, NodeSettings(), [], SliceSettings()), 120)
    finally:
        logger.removeHandler(handler)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    assert rc == 0
    line = next(m for m in handler.lines if "waiting for the API server" in m)
    assert (
        line.startswith(f"waiting for the API server at {api} (Node n1 and its ResourceSlice")
        and "Cannot connect" in line
    )
