"""The DRA agent's first ResourceSlice publish through an API server that is briefly not itself
(command.py _serve, publisher.py): it keeps waiting, and it does not die."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import tempfile
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from hami.dra.model import SliceSettings, slice_name
from hami.draplugin.command import _serve, add_arguments
from hami.node.settings import NodeSettings

SLICE = f"/apis/resource.k8s.io/v1/resourceslices/{slice_name('n1')}"


def _kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
users: [{{name: u, user: {{token: t}}}}]
"""
    )
    return str(path)


def _args(tmp_path: Path, api: str, kubelet: Path) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(
        [
            "--node-name=n1",
            f"--kubeconfig={_kubeconfig(tmp_path, api)}",
            f"--state-dir={tmp_path / 'state'}",
            f"--kubelet-dir={kubelet}",  # short: unix socket paths are limited
            f"--cdi-dir={tmp_path / 'cdi'}",
            f"--hook-path={tmp_path / 'hook'}",
            f"--lock-dir={tmp_path / 'lock'}",
        ]
    )
    args.bind, args.sweep_seconds, args.sweep_grace_seconds, args.health_recovery_seconds = None, 0, 0, 0.0
    return args


async def _run(tmp_path: Path, node_answers: list, slice_answers: list) -> tuple[int, list[str]]:
    """_serve against a fake API server whose Node and slice reads give ``node_answers`` and
    ``slice_answers`` in turn (the last one from then on); SIGTERM once a slice is applied."""
    seen: list[str] = []

    def answer(answers: list) -> web.Response:
        what = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(what, str):  # a proxy's own page, 200
            return web.Response(text=what, content_type="text/html")
        status, body = what
        return web.json_response(body, status=status)

    async def node(request: web.Request) -> web.Response:
        seen.append("get node")
        return answer(node_answers)

    async def get_slice(request: web.Request) -> web.Response:
        seen.append("get slice")
        return answer(slice_answers)

    async def apply_slice(request: web.Request) -> web.Response:
        seen.append("apply slice")
        body = await request.json()
        os.kill(os.getpid(), signal.SIGTERM)
        return web.json_response(body)

    async def empty_list(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)  # a watch that stays quiet
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/api/v1/nodes/n1", node)
    app.router.add_get(SLICE, get_slice)
    app.router.add_patch(SLICE, apply_slice)
    app.router.add_get("/apis/resource.k8s.io/v1/resourceslices", empty_list)
    app.router.add_get("/api/v1/nodes", empty_list)
    server = TestServer(app)
    await server.start_server()
    loop = asyncio.get_running_loop()
    kubelet = Path(tempfile.mkdtemp(prefix="arp", dir="/tmp"))
    try:
        args = _args(tmp_path, str(server.make_url("")).rstrip("/"), kubelet)
        rc = await _serve(args, NodeSettings(), [], SliceSettings())
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.close()
        shutil.rmtree(kubelet, ignore_errors=True)
    return rc, seen


NODE = (200, {"kind": "Node", "metadata": {"name": "n1", "uid": "node-uid"}})
NOT_FOUND = (404, {"kind": "Status", "code": 404})


async def test_a_proxys_page_for_the_node_during_an_outage_is_waited_out(tmp_path):
    """A load balancer in front of a restarting API server answered 200 with its own page: the
    JSON error left the first publish's wait (only the server's absence was waited out), and
    with it the agent, into the kubelet's crash-loop back-off."""
    rc, seen = await _run(tmp_path, ["<html>502 upstream restarting</html>", NODE], [NOT_FOUND])
    assert rc == 0
    assert seen[:2] == ["get node", "get node"] and seen[-1] == "apply slice"


async def test_a_slice_answer_that_is_no_resourceslice_is_waited_out(tmp_path):
    """The slice read answered with JSON that is no ResourceSlice (no spec.pool): a KeyError
    out of the publish, and the agent gone; nothing may be applied on a generation not known."""
    rc, seen = await _run(tmp_path, [NODE], [(200, {"kind": "Status", "status": "Success"}), NOT_FOUND])
    assert rc == 0
    assert seen == ["get node", "get slice", "get node", "get slice", "apply slice"]
