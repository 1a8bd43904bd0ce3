"""The registration loop (register.py Registrar.run) through an API server that is briefly not
itself: it keeps going, and each write is whole (the device list and the handshake together)."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from hami.deviceplugin.devices import DeviceState
from hami.deviceplugin.kube import Kube
from hami.deviceplugin.register import HANDSHAKE, REGISTER, Registrar
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings

GPU = PhysicalGPU(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "T4", 15360, "0000:3b:00.0", 0)


async def test_a_garbled_answer_during_an_outage_does_not_stop_the_registration_loop():
    """A proxy or load balancer in front of a restarting API server answered 200 with its own
    page: the JSON error left the loop (only API, connection and time-out errors were caught),
    and with it the whole plugin, whose tasks are watched for the first to end."""
    reads: list[int] = []
    patches: list[dict] = []
    written = asyncio.Event()

    async def get_node(request: web.Request) -> web.Response:
        reads.append(1)
        if len(reads) == 1:
            return web.Response(text="<html>502 upstream restarting</html>", content_type="text/html")
        return web.json_response({"metadata": {"name": "n1", "resourceVersion": "5", "annotations": {}}})

    async def patch_node(request: web.Request) -> web.Response:
        patches.append(json.loads(await request.read()))
        written.set()
        return web.json_response({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})

    app = web.Application()
    app.router.add_get("/api/v1/nodes/n1", get_node)
    app.router.add_patch("/api/v1/nodes/n1", patch_node)
    server = TestServer(app)
    await server.start_server()
    api = client.ApiClient(client.Configuration(host=str(server.make_url(""))))
    registrar = Registrar(Kube(api, "n1"), DeviceState([GPU], NodeSettings()), retry=0)
    task = asyncio.create_task(registrar.run())
    try:
        done, _ = await asyncio.wait([task, asyncio.create_task(written.wait())], return_when=asyncio.FIRST_COMPLETED)
        assert task not in done, task.exception()
        [patch] = patches
        assert {REGISTER, HANDSHAKE} <= set(patch["metadata"]["annotations"]) and len(reads) == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
        await server.close()
