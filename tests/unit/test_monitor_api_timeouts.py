"""The monitor's pod list is bounded in time (kube.API_TIMEOUT_S) and a SIGTERM ends a refresh
round that is waiting on the API server: without a ``_request_timeout`` kubernetes_asyncio waits
for an answer for ever, so a connection the network black-holes (an API server failing over)
stopped the refresh loop for good, and with it the clean-up, the feedback and the shutdown
(``stop`` is checked between rounds; release_all runs after the loop). Here the API server
accepts connections and never answers."""

from __future__ import annotations

import argparse
import asyncio
import logging

import pytest
from kubernetes_asyncio import client

from hami.monitor import command
from hami.monitor import kube as mkube
from hami.monitor.exporter import PodRef

from ._apikit import within

UID = "0b6f3b4e-1111-4d7e-9a8e-aaaaaaaaaaaa"  # a pod no longer on the node


def refresh_args(tmp_path, **extra) -> argparse.Namespace:
    return argparse.Namespace(
        node_name="n1",
        containers_dir=str(tmp_path / "containers"),
        claims_dir=str(tmp_path / "claims"),
        resync_s=0.0,  # a gone pod's directory would go at once after a successful list
        interval_s=5.0,
        no_feedback=True,
        priority_blocking=False,
        **extra,
    )


async def test_the_pod_list_fails_in_time(black_hole, monkeypatch):
    monkeypatch.setattr(mkube, "API_TIMEOUT_S", 0.5)
    api = client.ApiClient(client.Configuration(host=black_hole))
    try:
        with pytest.raises(asyncio.TimeoutError):
            await within(mkube.node_pods(api, "n1"))
    finally:
        await api.close()


async def test_a_round_without_an_answer_keeps_the_last_map_and_removes_nothing(
    black_hole, monkeypatch, tmp_path, caplog
):
    monkeypatch.setattr(mkube, "API_TIMEOUT_S", 0.5)
    gone = tmp_path / "containers" / f"{UID}_main"
    gone.mkdir(parents=True)
    pods = command.PodMap()
    last = {"uid-a": PodRef("ns", "a", "uid-a")}
    pods.set(last)
    api = client.ApiClient(client.Configuration(host=black_hole))
    try:
        with caplog.at_level(logging.WARNING, logger="hami.monitor"):
            await within(command._refresh_once(refresh_args(tmp_path), pods, api))
    finally:
        await api.close()
    assert dict(pods.get()) == last
    assert gone.is_dir()
    assert "cannot list the pods of node n1: no answer within 0.5s" in caplog.text


async def test_a_stop_ends_a_round_that_waits_on_the_api_server(black_hole, monkeypatch, tmp_path):
    monkeypatch.setattr(mkube, "API_TIMEOUT_S", 3600.0)  # the round would wait for the whole of it
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{black_hole}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    gone = tmp_path / "containers" / f"{UID}_main"
    gone.mkdir(parents=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, stop.set)  # SIGTERM while the list waits
    await within(command._refresh(refresh_args(tmp_path, kubeconfig=str(kubeconfig)), command.PodMap(), stop))
    assert gone.is_dir()  # the round cut short removed nothing
