"""KubeClient sends its requests straight on kubernetes_asyncio's session: what reaches the API
server must be what ``call_api`` sent (credentials asked per request, default headers, query,
JSON body), and a refusal is a KubeError with the server's message."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from hami.kube.client import KubeClient, KubeError


async def test_a_request_carries_the_token_headers_query_and_body():
    seen: list[dict] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": list(request.query.items()),
                "headers": dict(request.headers),
                "body": await request.read(),
            }
        )
        if request.path.endswith("/missing"):
            return web.json_response({"kind": "Status", "message": 'pods "missing" not found'}, status=404)
        return web.json_response({"ok": True, "n": 1 << 40})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with TestServer(app) as server:
        configuration = client.Configuration(host=str(server.make_url("")).rstrip("/"))
        tokens = iter(["first", "second"])  # a refreshed token (exec plugin, projected token) is asked each time

        async def refresh(conf):
            conf.api_key["BearerToken"] = next(tokens)

        configuration.api_key = {"BearerToken": "stale"}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        configuration.refresh_api_key_hook = refresh
        api = client.ApiClient(configuration)
        api.default_headers["X-Extra"] = "kept"
        kube = KubeClient(api)
        try:
            got = await kube.request(
                "POST",
                "/api/v1/namespaces/ns/pods/p/binding",
                [("dryRun", "All"), ("fieldManager", "hami scheduler")],
                {"target": {"name": "n1", "ünïcode": "ok"}, "n": 3},
            )
            assert got == {"ok": True, "n": 1 << 40}
            with pytest.raises(KubeError) as refused:
                await kube.merge_patch("/api/v1/namespaces/ns/pods/missing", {"metadata": {"labels": {"a": "b"}}})
        finally:
            await kube.close()
    assert refused.value.status == 404 and 'pods "missing" not found' in str(refused.value)
    post, patch = seen
    assert (post["method"], post["path"]) == ("POST", "/api/v1/namespaces/ns/pods/p/binding")
    assert post["query"] == [("dryRun", "All"), ("fieldManager", "hami scheduler")]
    assert post["headers"]["Authorization"] == "Bearer first" and patch["headers"]["Authorization"] == "Bearer second"
    assert post["headers"]["Content-Type"] == "application/json" and post["headers"]["Accept"] == "application/json"
    assert post["headers"]["X-Extra"] == "kept" and post["headers"]["User-Agent"] == api.user_agent
    assert json.loads(post["body"]) == {"target": {"name": "n1", "ünïcode": "ok"}, "n": 3}
    assert patch["headers"]["Content-Type"] == "application/merge-patch+json"
    assert json.loads(patch["body"]) == {"metadata": {"labels": {"a": "b"}}}


async def test_without_a_token_no_authorization_header_is_sent():
    headers: list[dict] = []

    async def handler(request: web.Request) -> web.Response:
        headers.append(dict(request.headers))
        return web.Response(body=b"", status=200)

    app = web.Application()
    app.router.add_get("/api/v1/nodes", handler)
    async with TestServer(app) as server:
        kube = KubeClient(client.ApiClient(client.Configuration(host=str(server.make_url("")).rstrip("/"))))
        try:
            assert await kube.get("/api/v1/nodes") is None  # an empty answer reads as None
        finally:
            await kube.close()
    assert "Authorization" not in headers[0]


async def test_a_body_orjson_will_not_write_is_sent_as_json_writes_it():
    bodies: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/ns/events", handler)
    async with TestServer(app) as server:
        kube = KubeClient(client.ApiClient(client.Configuration(host=str(server.make_url("")).rstrip("/"))))
        try:
            await kube.post("/api/v1/namespaces/ns/events", {"message": "pod a\ud800 refused"})
        finally:
            await kube.close()
    assert bodies == [json.dumps({"message": "pod a\ud800 refused"}).encode()]


async def test_a_watch_stream_that_goes_quiet_ends_after_idle_not_at_its_total():
    """A black-holed connection never closes: only a limit on the wait for the next piece of the
    stream (``idle``) ends it; the total (minutes for a watch) would leave the cache stale."""
    import asyncio

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'{"type": "ADDED", "object": {}}\n')
        await asyncio.sleep(60)  # then nothing, the connection open
        return resp

    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    async with TestServer(app) as server:
        kube = KubeClient(client.ApiClient(client.Configuration(host=str(server.make_url("")).rstrip("/"))))
        try:
            resp = await kube.open("GET", "/api/v1/pods", [("watch", "true")], timeout=600, idle=0.3)
            lines = []

            async def read() -> None:
                async for line in resp.content:
                    lines.append(line)

            import aiohttp

            # the read's own time-out (aiohttp's), not the guard's: far above idle, far below the total
            with pytest.raises(aiohttp.ServerTimeoutError):
                await asyncio.wait_for(read(), 20)
            assert lines == [b'{"type": "ADDED", "object": {}}\n']
            resp.release()
        finally:
            await kube.close()


async def test_a_connection_the_server_drops_is_an_os_error_for_every_caller():
    """Found by review (1 Dec): ServerDisconnectedError and ClientPayloadError are aiohttp errors
    but not OSError, and callers that handle an unreachable API server catch OSError: one
    escaped the extender's Bind as a 500, leaving its lock and reservation behind."""
    import asyncio

    import aiohttp

    from hami.kube.client import ApiDisconnected

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/cut"):  # headers promise more body than comes
            resp = web.StreamResponse(headers={"Content-Length": "100", "Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(b'{"kind":')
            request.transport.close()
            return resp
        request.transport.close()  # no answer at all
        await asyncio.sleep(0)
        return web.Response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with TestServer(app) as server:
        kube = KubeClient(client.ApiClient(client.Configuration(host=str(server.make_url("")).rstrip("/"))))
        try:
            for path in ("/api/v1/namespaces/ns/pods/p/binding", "/api/v1/namespaces/ns/pods/cut"):
                with pytest.raises(OSError) as lost:
                    await kube.post(path, {"target": {"name": "n1"}})
                assert isinstance(lost.value, ApiDisconnected) and isinstance(lost.value, aiohttp.ClientError)
                assert isinstance(lost.value.__cause__, aiohttp.ClientError)
        finally:
            await kube.close()
