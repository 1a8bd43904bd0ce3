"""Fairness of the UI's event reads between callers: one user's slow reads (slow pods, a slow API
server: up to 5 s each) must not leave every other tenant's event reads answered 503."""

from __future__ import annotations

import asyncio

from hami.ui.auth import Authorizer, Identity, Permission
from hami.ui.server import EVENTS_IN_FLIGHT, EVENTS_PER_USER, UiApi

from .test_ui_api import NOW
from .test_ui_auth import USERS, FakeReviews, _client, bearer, shared  # noqa: F401 - the fixture
from .test_ui_review_load import SlowEvents

ALICE, ALICE2, BOB = "alice-token-1", "alice-token-2", "bob-token-1"


class EventReaders(FakeReviews):
    """Everyone signed in may list events in team-a (and nothing else)."""

    async def token(self, token: str) -> Identity | None:
        self.token_calls.append(token)
        return {
            ALICE: Identity("alice", "u-a"),
            ALICE2: Identity("alice", "u-a"),
            BOB: Identity("bob", "u-b"),
        }.get(token) or USERS.get(token)

    async def allowed(self, who: Identity, perm: Permission) -> bool:
        self.access_calls.append((who.username, perm))
        return perm == Permission("list", "events", "team-a")


async def _settle(events: SlowEvents, tasks: list, reads: int) -> None:
    while len(events.reads) < reads and not all(t.done() for t in tasks):
        await asyncio.sleep(0)
    for _ in range(20):  # the answers past the bounds come back at once
        await asyncio.sleep(0)


async def test_one_users_slow_reads_leave_room_for_the_others(shared):  # noqa: F811
    assert EVENTS_IN_FLIGHT > EVENTS_PER_USER
    events = SlowEvents()
    api = UiApi(shared, "hami-scheduler", clock=lambda: NOW, authorizer=Authorizer(EventReaders()), events=events)
    client = await _client(api)
    try:
        # alice asks for the events of several slow pods, from two tokens (two tabs, two
        # `kubectl create token`): one read of hers at a time, the rest 503 at once
        mine = [
            asyncio.ensure_future(client.get(f"/api/v1/pods/team-a/slow-{i}/events", headers=bearer(tok)))
            for i, tok in enumerate((ALICE, ALICE2, ALICE, ALICE2))
        ]
        await _settle(events, mine, EVENTS_PER_USER)
        refused = [t.result() for t in mine if t.done()]
        assert len(refused) == len(mine) - EVENTS_PER_USER
        assert {r.status for r in refused} == {503} and {r.headers["Retry-After"] for r in refused} == {"1"}
        assert "you asked for" in (await refused[0].json())["error"]
        # bob, meanwhile, still gets his pod's events read (before: 503, both slots were alice's)
        his = asyncio.ensure_future(client.get("/api/v1/pods/team-a/bobs/events", headers=bearer(BOB)))
        # and joining alice's read under way costs bob nothing (shared per pod)
        joined = asyncio.ensure_future(client.get("/api/v1/pods/team-a/slow-0/events", headers=bearer(BOB)))
        await _settle(events, [his, joined], EVENTS_PER_USER + 1)
        assert not his.done() and not joined.done()
        assert sorted(events.reads) == [("team-a", "bobs"), ("team-a", "slow-0")]
        events.release.set()
        assert (await his).status == 200 and (await joined).status == 200
        doc = await (await joined).json()
        assert doc["items"][0]["message"] == "slow-0 here"
        assert len(events.reads) == 2
        # her read done, alice may start another
        resp = await client.get("/api/v1/pods/team-a/slow-1/events", headers=bearer(ALICE2))
        assert resp.status == 200
    finally:
        events.release.set()
        await client.close()
