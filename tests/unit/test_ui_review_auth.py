"""From the UI review: how long a review's answer is reused. A no (a token refused, a permission
missing) is kept for DENIED_TTL, far shorter than a yes (TTL), as kube-apiserver's webhook
authorizer keeps its denials (30 s) shorter than its grants (5 min): a tenant just granted
access must not stay refused for the grant's whole TTL. A revoked grant still works for up to
TTL: the usual trade-off, said in docs/ui.md. The clock is injected: no wall-clock waits. And
requests with one token not yet reviewed share one TokenReview."""

from __future__ import annotations

import asyncio

import pytest

from hami.ui.auth import (
    DENIED_TTL,
    TOKEN_REVIEWS_IN_FLIGHT,
    TTL,
    Authorizer,
    Identity,
    Permission,
    ReviewBusy,
    ReviewUnavailable,
    Unauthenticated,
)

from .test_ui_api import NOW
from .test_ui_auth import TENANT, _client, bearer, shared  # noqa: F401 - the fixture
from hami.ui.server import UiApi

CAROL = Identity("carol", "u-c", ("dev",))


class Rbac:
    """The API server's reviews over grants a test changes as it goes (a RoleBinding created or
    deleted), counting the calls."""

    def __init__(self) -> None:
        self.grants: set[tuple[str, str, str, str]] = set()  # (user, verb, resource, namespace)
        self.tokens: dict[str, Identity] = {}
        self.token_calls = 0
        self.access_calls: list[Permission] = []

    async def token(self, token: str) -> Identity | None:
        self.token_calls += 1
        return self.tokens.get(token)

    async def allowed(self, who: Identity, perm: Permission) -> bool:
        self.access_calls.append(perm)
        return {(who.username, perm.verb, perm.resource, ns) for ns in ("", perm.namespace)} & self.grants != set()


def test_denials_are_kept_far_shorter_than_grants():
    assert 0 < DENIED_TTL <= TTL / 4


async def test_a_new_grant_lifts_a_403_after_the_short_denied_ttl_not_the_grant_ttl():
    rbac, now = Rbac(), [0.0]
    rbac.tokens["t"] = CAROL
    auth = Authorizer(rbac, clock=lambda: now[0])
    caller = await auth.authenticate("Bearer t")
    nodes = Permission("list", "nodes")
    assert not await auth.allowed(caller, nodes)
    rbac.grants.add(("carol", "list", "nodes", ""))  # the ClusterRoleBinding is created
    now[0] = DENIED_TTL - 0.1
    assert not await auth.allowed(caller, nodes)  # still the cached denial
    assert len(rbac.access_calls) == 1
    now[0] = DENIED_TTL + 0.1  # before: refused until TTL (10 s)
    assert await auth.allowed(caller, nodes)
    assert len(rbac.access_calls) == 2


async def test_a_revoked_grant_keeps_working_for_the_grant_ttl_then_stops():
    rbac, now = Rbac(), [0.0]
    rbac.tokens["t"] = CAROL
    rbac.grants.add(("carol", "list", "nodes", ""))
    auth = Authorizer(rbac, clock=lambda: now[0])
    caller = await auth.authenticate("Bearer t")
    nodes = Permission("list", "nodes")
    assert await auth.allowed(caller, nodes)
    rbac.grants.clear()  # the binding is deleted
    now[0] = TTL - 0.1
    assert await auth.allowed(caller, nodes)  # the documented trade-off: up to TTL
    now[0] = TTL + 0.1
    assert not await auth.allowed(caller, nodes)


async def test_a_refused_token_is_asked_again_after_the_denied_ttl():
    rbac, now = Rbac(), [0.0]
    auth = Authorizer(rbac, clock=lambda: now[0])
    for _ in range(3):  # refusals are still cached: a repeated bad token costs one review
        try:
            await auth.authenticate("Bearer late")
        except Unauthenticated:
            pass
        else:
            raise AssertionError("a token the API server does not know was accepted")
    assert rbac.token_calls == 1
    rbac.tokens["late"] = CAROL  # e.g. the token's ServiceAccount reached the API server's cache
    now[0] = DENIED_TTL + 0.1
    assert (await auth.authenticate("Bearer late")).identity == CAROL
    now[0] = DENIED_TTL + TTL - 0.2  # an accepted token's answer is kept the full TTL
    await auth.authenticate("Bearer late")
    assert rbac.token_calls == 2


async def test_a_tenant_that_sees_no_namespace_sees_its_new_one_after_the_denied_ttl():
    rbac, now = Rbac(), [0.0]
    rbac.tokens["t"] = CAROL
    auth = Authorizer(rbac, clock=lambda: now[0])
    caller = await auth.authenticate("Bearer t")
    names = [f"team-{i}" for i in range(50)]
    assert await auth.namespaces(caller, "list", "pods", names) == set()  # the page's 403
    rbac.grants.add(("carol", "list", "pods", "team-7"))  # the RoleBinding is created
    now[0] = DENIED_TTL + 0.1  # before: the empty scan was kept for TTL
    assert await auth.namespaces(caller, "list", "pods", names) == {"team-7"}
    # once it sees a namespace the scan is kept for TTL: a refresh does not ask the other 49 again
    before = len(rbac.access_calls)
    now[0] = 2 * DENIED_TTL + 0.2
    assert await auth.namespaces(caller, "list", "pods", names) == {"team-7"}
    assert len(rbac.access_calls) - before == 1  # the cluster scope only (a denial: short-lived)
    now[0] = DENIED_TTL + 0.1 + TTL + 0.1
    before = len(rbac.access_calls)
    await auth.namespaces(caller, "list", "pods", names)
    assert len(rbac.access_calls) - before == 1 + 50


async def test_over_http_a_403_turns_200_once_the_binding_exists(shared):  # noqa: F811
    rbac, now = Rbac(), [0.0]
    rbac.tokens[TENANT] = CAROL
    client = await _client(
        UiApi(shared, "hami-scheduler", clock=lambda: NOW, authorizer=Authorizer(rbac, clock=lambda: now[0]))
    )
    try:
        for path in ("/api/v1/nodes", "/api/v1/pods"):
            assert (await client.get(path, headers=bearer(TENANT))).status == 403, path
        rbac.grants |= {("carol", "list", "nodes", ""), ("carol", "list", "pods", "team-a")}
        now[0] = DENIED_TTL + 0.1
        assert (await client.get("/api/v1/nodes", headers=bearer(TENANT))).status == 200
        resp = await client.get("/api/v1/pods", headers=bearer(TENANT))
        assert resp.status == 200
        assert [i["name"] for i in (await resp.json())["items"]] == ["mine"]
    finally:
        await client.close()


async def _settle() -> None:
    """Let every started request run up to where it waits (a few loop turns, no clock)."""
    for _ in range(10):
        await asyncio.sleep(0)


class HeldTokens(Rbac):
    """Token reviews wait for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def token(self, token: str) -> Identity | None:
        self.token_calls += 1
        await self.release.wait()
        return self.tokens.get(token)


async def test_requests_with_one_new_token_share_one_token_review_and_none_is_503():
    # two tabs' page loads (5 answers each) and the events of an open pod, with a token not yet
    # reviewed: before, 8 TokenReviews and the last 3 of the user's own requests 503 ("too many
    # sign-ins"), the bound meant for floods of made-up tokens
    rbac = HeldTokens()
    rbac.tokens["t"] = CAROL
    auth = Authorizer(rbac)
    jobs = [asyncio.ensure_future(auth.authenticate("Bearer t")) for _ in range(11)]
    await _settle()
    assert rbac.token_calls == 1
    rbac.release.set()
    answers = await asyncio.gather(*jobs, return_exceptions=True)
    assert [getattr(a, "identity", a) for a in answers] == [CAROL] * 11
    assert rbac.token_calls == 1
    # and the bound still holds for different tokens: the ninth at once is 503
    rbac.release.clear()
    flood = [asyncio.ensure_future(auth.authenticate(f"Bearer made-up-{i}")) for i in range(TOKEN_REVIEWS_IN_FLIGHT)]
    await _settle()
    with pytest.raises(ReviewBusy):
        await auth.authenticate("Bearer one-more")
    rbac.release.set()
    for refused in await asyncio.gather(*flood, return_exceptions=True):
        assert isinstance(refused, Unauthenticated)


async def test_a_shared_token_review_that_fails_fails_every_request_and_is_not_cached():
    rbac = HeldTokens()
    rbac.tokens["t"] = CAROL
    auth = Authorizer(rbac)

    async def down(token: str) -> Identity | None:
        rbac.token_calls += 1
        await rbac.release.wait()
        raise ReviewUnavailable("connection refused")

    rbac.token = down  # type: ignore[method-assign]
    jobs = [asyncio.ensure_future(auth.authenticate("Bearer t")) for _ in range(3)]
    await _settle()
    rbac.release.set()
    assert all(isinstance(a, ReviewUnavailable) for a in await asyncio.gather(*jobs, return_exceptions=True))
    assert rbac.token_calls == 1
    del rbac.token  # the API server is back: asked again, not a cached failure
    assert (await auth.authenticate("Bearer t")).identity == CAROL
