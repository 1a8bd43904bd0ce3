"""Requests in access review are bounded over all users too (found by review, 1 Dec): the bound
of one user's (every ServiceAccount of a namespace counting as one) left a tenant holding many
users, ServiceAccounts in 26 namespaces or self-service namespaces, able to hold every connection
the listener allows with requests waiting for reviews. Now at most IN_REVIEW_TOTAL (half the
listener's connections) are in review; one more is answered 503 at once, and answers already
known are still served."""

from __future__ import annotations

import asyncio

import pytest

from hami.serve import MAX_CONNECTIONS
from hami.ui.auth import IN_REVIEW_TOTAL, AccessReviewsBusy, Authorizer, Identity, Permission

from .test_review_ui_lockout_dec1e import _turns
from .test_ui_auth import ADMIN, FakeReviews

TENANTS = 5  # ServiceAccounts of five namespaces: five users for the per-user bound


class ManyUsers(FakeReviews):
    """Tokens ``sa-<i>`` are ServiceAccounts of namespace ``t<i>``; their reviews of a namespace
    wait for ``release``; everyone else's are answered at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def token(self, token: str) -> Identity | None:
        if token.startswith("sa-"):
            i = token[3:]
            return Identity(f"system:serviceaccount:t{i}:default", f"u-{i}")
        return await super().token(token)

    async def allowed(self, who: Identity, perm: Permission) -> bool:
        if who.username.startswith("system:serviceaccount:t") and perm.namespace:
            await self.release.wait()
        return await super().allowed(who, perm)


def test_the_total_leaves_the_listener_half_its_connections():
    assert 0 < IN_REVIEW_TOTAL <= MAX_CONNECTIONS // 2


async def test_requests_in_review_past_the_total_are_refused_at_once_whoever_sends_them():
    reviews = ManyUsers()
    total = 3 * TENANTS - 1  # below the five users' own bounds together (3 each)
    auth = Authorizer(reviews, clock=lambda: 0.0, per_user=1, waiting_per_user=2, in_review_total=total)
    try:
        users = [await auth.authenticate(f"Bearer sa-{i}") for i in range(TENANTS)]
        admin = await auth.authenticate(f"Bearer {ADMIN}")
        assert await auth.allowed(admin, Permission("list", "nodes")) is True  # known from now on
        waiting = [
            asyncio.ensure_future(auth.allowed(u, Permission("list", "pods", f"made-up-{k}")))
            for k in range(3)
            for u in users
        ][:total]
        await _turns()
        assert not any(t.done() for t in waiting) and auth._in_review_sum == total
        # the last user has one place of its own left, but not one over all users
        with pytest.raises(AccessReviewsBusy, match=f"{total} requests are already in access review, over all users"):
            await auth.allowed(users[-1], Permission("list", "pods", "made-up-x"))
        assert await auth.allowed(admin, Permission("list", "nodes")) is True  # answered from the cache
        reviews.release.set()
        assert [await t for t in waiting] == [False] * total
        assert auth._in_review == {} and auth._in_review_sum == 0
        assert await auth.allowed(users[-1], Permission("list", "pods", "made-up-x")) is False  # a place again
    finally:
        reviews.release.set()
