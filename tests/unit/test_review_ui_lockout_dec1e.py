"""A user's requests waiting for access reviews are bounded (found by review, 1 Dec): a signed-in
tenant sending requests for made-up namespaces (each a new SubjectAccessReview) queued them without
bound behind its 4 review slots, and their connections, all busy, filled the listener's 512 and
closed every other user's at accept. Now at most PER_USER + REVIEWS_WAITING_PER_USER of one
user's requests (every ServiceAccount of a namespace counting as one user) are in review; one
more is answered 503 at once, and the other users' requests are still reviewed."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hami import serve
from hami.ui.auth import (
    PER_USER,
    REVIEWS_WAITING_PER_USER,
    AccessReviewsBusy,
    Authorizer,
    Identity,
    Permission,
    ReviewBusy,
)
from hami.ui.server import UiApi

from .test_ui_api import NOW
from .test_ui_auth import ADMIN, USERS, FakeReviews, _client, bearer, shared  # noqa: F401 - the fixture

FLOOD, FLOOD2 = "flood-token-1", "flood-token-2"  # two ServiceAccounts of one namespace
LIMIT = PER_USER + REVIEWS_WAITING_PER_USER


class BlockedTenant(FakeReviews):
    """Team-m's reviews in a namespace wait for ``release`` (a slow or flooded API server);
    everyone else's are answered at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.held = 0

    async def token(self, token: str) -> Identity | None:
        self.token_calls.append(token)
        return {
            FLOOD: Identity("system:serviceaccount:team-m:a", "u-m1"),
            FLOOD2: Identity("system:serviceaccount:team-m:b", "u-m2"),
        }.get(token) or USERS.get(token)

    async def allowed(self, who: Identity, perm: Permission) -> bool:
        if who.username.startswith("system:serviceaccount:team-m:") and perm.namespace:
            self.held += 1
            try:
                await self.release.wait()
            finally:
                self.held -= 1
        return await super().allowed(who, perm)


async def _turns(n: int = 50) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_bound_leaves_room_for_a_page_and_is_far_below_the_listeners_connections():
    """The listener's cap read from hami.serve (the test review, 1 Dec: 512 was written here)."""
    assert REVIEWS_WAITING_PER_USER > 0 and LIMIT >= 4 * 5  # four tabs' page loads at once
    # one user's requests in review hold a few of the listener's connections, not all
    assert serve.MAX_CONNECTIONS // LIMIT >= 20, (serve.MAX_CONNECTIONS, LIMIT)


async def test_a_users_requests_past_the_bound_are_refused_at_once_and_others_still_reviewed():
    """21 requests of one tenant, each for a new namespace, the reviews blocked: 20 wait, the
    21st raises at once (before: it queued like the others, without bound)."""
    reviews = BlockedTenant()
    auth = Authorizer(reviews, clock=lambda: 0.0, concurrency=16, per_user=4)
    try:
        flood = await auth.authenticate(f"Bearer {FLOOD}")
        reviews.release.set()
        assert await auth.allowed(flood, Permission("list", "pods", "team-m")) is False  # kept 2 s
        reviews.release.clear()
        waiting = [
            asyncio.ensure_future(auth.allowed(flood, Permission("list", "pods", f"made-up-{i}"))) for i in range(LIMIT)
        ]
        await _turns()
        assert reviews.held == PER_USER and not any(t.done() for t in waiting)
        one_more = asyncio.ensure_future(auth.allowed(flood, Permission("list", "pods", "made-up-x")))
        await _turns()
        assert one_more.done(), "the request past the bound queued for a review slot"
        with pytest.raises(AccessReviewsBusy, match=f'{LIMIT} requests of user "system:serviceaccounts:team-m"'):
            one_more.result()
        assert isinstance(one_more.exception(), ReviewBusy)  # answered as the sign-in bound is
        # another ServiceAccount of the same namespace shares the bound (minting SAs does not raise it)
        flood2 = await auth.authenticate(f"Bearer {FLOOD2}")
        with pytest.raises(AccessReviewsBusy):
            await auth.allowed(flood2, Permission("list", "pods", "made-up-y"))
        # another user's request is still reviewed while the flood waits
        admin = await auth.authenticate(f"Bearer {ADMIN}")
        assert await auth.allowed(admin, Permission("list", "nodes")) is True
        assert ("admin", Permission("list", "nodes")) in reviews.access_calls
        # an answer already known costs no place: served at once past the bound
        assert await auth.allowed(flood, Permission("list", "pods", "team-m")) is False
        reviews.release.set()
        assert [await t for t in waiting] == [False] * LIMIT
        assert auth._in_review == {} and auth._user_gates == {}
    finally:
        reviews.release.set()


async def test_a_scan_of_many_namespaces_counts_as_one_request():
    reviews = BlockedTenant()
    auth = Authorizer(reviews, concurrency=16, per_user=4)
    try:
        flood = await auth.authenticate(f"Bearer {FLOOD}")
        scan = asyncio.ensure_future(auth.namespaces(flood, "list", "pods", [f"ns-{i}" for i in range(300)]))
        await _turns()
        assert reviews.held == PER_USER and not scan.done()  # its 300 reviews: one request
        others = [
            asyncio.ensure_future(auth.allowed(flood, Permission("list", "pods", f"made-up-{i}")))
            for i in range(LIMIT - 1)
        ]
        await _turns()
        assert not any(t.done() for t in others)
        one_more = asyncio.ensure_future(auth.allowed(flood, Permission("list", "pods", "made-up-x")))
        await _turns()
        assert one_more.done(), "the request past the bound queued for a review slot"
        assert isinstance(one_more.exception(), AccessReviewsBusy)
        reviews.release.set()
        assert await scan == set()
        assert [await t for t in others] == [False] * (LIMIT - 1)
        assert auth._in_review == {}
    finally:
        reviews.release.set()


async def test_the_flood_past_the_bound_is_answered_503_with_retry_after_and_not_logged(shared, caplog):  # noqa: F811
    reviews = BlockedTenant()
    auth = Authorizer(reviews, concurrency=16, per_user=4)
    client = await _client(UiApi(shared, "hami-scheduler", clock=lambda: NOW, authorizer=auth))
    try:
        mine = [
            asyncio.ensure_future(client.get(f"/api/v1/pods?namespace=made-up-{i}", headers=bearer(FLOOD)))
            for i in range(LIMIT)
        ]
        while len(auth._asking) < LIMIT:  # every one of them waiting for its review
            await asyncio.sleep(0)
        caplog.set_level(logging.DEBUG, logger="hami")
        one_more = asyncio.ensure_future(client.get("/api/v1/pods?namespace=made-up-x", headers=bearer(FLOOD)))
        # until it is answered, or (before the fix) its review is queued with the others
        while not one_more.done() and len(auth._asking) == LIMIT:
            await asyncio.sleep(0)
        assert len(auth._asking) == LIMIT, "the request past the bound queued for a review"
        refused = await one_more
        assert refused.status == 503 and refused.headers["Retry-After"] == "1"
        assert refused.headers["Cache-Control"] == "no-store"
        assert "already in access review" in (await refused.json())["error"]  # not the sign-in flood's words
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # the flood logs nothing
        # another user is still answered, with a review of his own, while the flood waits
        before = len(reviews.access_calls)
        assert (await client.get("/api/v1/nodes", headers=bearer(ADMIN))).status == 200
        assert ("admin", Permission("list", "nodes")) in reviews.access_calls[before:]
        assert not any(t.done() for t in mine)
        reviews.release.set()
        assert {(await t).status for t in mine} == {403}
        assert auth._in_review == {}
    finally:
        reviews.release.set()
        await client.close()
