"""The UI's per-user limits go by the user, not by the token: every ServiceAccount token the
API server issues carries its own ``authentication.kubernetes.io/credential-id`` in the
TokenReview's ``extra`` (seen on kube-apiserver 1.37: two `kubectl create token` of one
ServiceAccount, two JTIs), so limits keyed by the whole identity were per token and a tenant
who minted tokens (or opened a tab per token) multiplied them."""

from __future__ import annotations

import asyncio

from hami.ui.auth import Authorizer, Identity
from hami.ui.server import EVENTS_PER_USER, UiApi

from .test_ui_api import NOW
from .test_ui_auth import _client, bearer, shared  # noqa: F401 - the fixture
from .test_ui_review_load import SlowEvents
from .test_uifair_auth import HeldReviews
from .test_uifair_events import EventReaders, _settle

SA = "system:serviceaccount:team-a:dev"
GROUPS = ("system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated")


def _sa_token(jti: str) -> Identity:
    return Identity(SA, "u-sa", GROUPS, (("authentication.kubernetes.io/credential-id", (f"JTI={jti}",)),))


TOKENS = {f"sa-token-{i}": _sa_token(f"jti-{i}") for i in range(4)}


class TokenPerJti(EventReaders):
    async def token(self, token: str) -> Identity | None:
        self.token_calls.append(token)
        return TOKENS.get(token) or await super().token(token)


class HeldTenant(HeldReviews):
    """The ServiceAccount's reviews in a namespace wait for ``release`` (as alice's do there)."""

    async def token(self, token: str) -> Identity | None:
        return TOKENS.get(token) or await super().token(token)

    async def allowed(self, who: Identity, perm) -> bool:
        return await super().allowed(Identity("alice") if who.username == SA else who, perm)


async def test_a_users_tokens_share_one_limit_of_access_reviews():
    reviews = HeldTenant()
    auth = Authorizer(reviews, concurrency=16, per_user=4)
    try:
        callers = [await auth.authenticate(f"Bearer {tok}") for tok in TOKENS]
        assert len({c.who for c in callers}) == 4  # four answers' caches: the SARs differ in extra
        scans = [
            asyncio.ensure_future(auth.namespaces(c, "list", "pods", [f"ns-{k}-{i}" for i in range(50)]))
            for k, c in enumerate(callers)
        ]
        for _ in range(100):
            await asyncio.sleep(0)
        assert reviews.most == 4  # before: 16, four per token, every shared slot the tenant's
        reviews.release.set()
        assert [await s for s in scans] == [set()] * 4
        assert auth._user_gates == {}
    finally:
        reviews.release.set()


async def test_a_users_tokens_share_one_limit_of_event_reads(shared):  # noqa: F811
    events = SlowEvents()
    api = UiApi(shared, "hami-scheduler", clock=lambda: NOW, authorizer=Authorizer(TokenPerJti()), events=events)
    client = await _client(api)
    try:
        mine = [
            asyncio.ensure_future(client.get(f"/api/v1/pods/team-a/slow-{i}/events", headers=bearer(tok)))
            for i, tok in enumerate(TOKENS)
        ]
        await _settle(events, mine, EVENTS_PER_USER)
        refused = [t.result() for t in mine if t.done()]
        # before: one read per token, both of the EVENTS_IN_FLIGHT slots the tenant's
        assert len(refused) == len(mine) - EVENTS_PER_USER and {r.status for r in refused} == {503}
        assert len(events.reads) == EVENTS_PER_USER
    finally:
        events.release.set()
        await client.close()
