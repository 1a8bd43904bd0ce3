"""From the UI review: query parameters. ``node`` on /nodes and /pods was matched as given, so a
value no node can have (``Gpu_S``, an empty ``?node=``, a stray space) answered an empty list as
if the node held nothing; it is a 400 naming the parameter and the value, as /history's ``node``
already was. No bad value is ever a 5xx."""

from __future__ import annotations

from .test_ui_auth import ADMIN, TENANT, FakeReviews, _api, _client, bearer, shared  # noqa: F401 - the fixture


async def test_a_node_value_no_node_can_have_is_a_400_naming_it(shared):  # noqa: F811
    client = await _client(_api(shared, FakeReviews()))
    try:
        for path in ("/api/v1/nodes", "/api/v1/pods"):
            for bad in ("Gpu_S", "", "gpu-s%20", "-gpu", "gpu-s/x"):
                resp = await client.get(f"{path}?node={bad}", headers=bearer(ADMIN))
                assert resp.status == 400, (path, bad, resp.status)
                error = (await resp.json())["error"]
                assert error.startswith("query parameter node: not a Kubernetes node name"), error
            resp = await client.get(f"{path}?node=gpu-s", headers=bearer(ADMIN))  # a real one still filters
            assert resp.status == 200
            assert (await resp.json())["items"], path
        # checked before any permission: a tenant gets the same 400, not an empty 200
        assert (await client.get("/api/v1/pods?node=Gpu_S", headers=bearer(TENANT))).status == 400
    finally:
        await client.close()


async def test_no_bad_query_value_is_a_server_error(shared):  # noqa: F811
    client = await _client(_api(shared, FakeReviews()))
    paths = ["nodes", "pods", "pending", "quotas", "history", "pods/team-a/mine/events", "openapi.yaml"]
    queries = [
        "namespace=",
        "namespace=%00",
        "namespace=%FF",
        "node=%ff%fe",
        "limit=-1",
        "limit=99999999999999999999999",
        "limit=%C2%B2",
        "range=",
        "kind=gpu&uuid=",
        "kind=pod&pod=",
        "=1",
        "%ZZ=1",
        "model=" + "m" * 300,
    ]
    try:
        for token in (ADMIN, TENANT):
            for path in paths:
                for q in queries:
                    resp = await client.get(f"/api/v1/{path}?{q}", headers=bearer(token))
                    assert resp.status in (400, 403), (path, q, resp.status)
                    assert "error" in await resp.json()
    finally:
        await client.close()
