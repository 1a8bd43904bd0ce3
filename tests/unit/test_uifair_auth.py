"""Permission checks as a tenant with many namespaces sees them: a page load's five answers
must not repeat the same SubjectAccessReviews, a second token of the same user asks nothing
again, and one user's scan leaves room for everyone else's checks; token reviews ask for the
configured audiences."""

from __future__ import annotations

import asyncio

from hami.scheduler.state import ClusterState
from hami.ui.auth import Authorizer, Identity, KubeReviews, Permission

from ._vendorkit import config
from .test_ui_api import gpu_node, gpu_pod
from .test_ui_auth import GRANTS, USERS, FakeKube, FakeReviews, _api, _client, bearer

PAGE = ("nodes", "pods", "pending", "quotas", "history")  # what one load of the page asks at once


async def test_a_page_load_asks_each_namespace_once_and_a_second_token_asks_nothing():
    state = ClusterState(config())
    state.node_handler.replace([gpu_node("gpu-s", gpus=4)])
    for i in range(200):
        state.pod_handler.apply("ADDED", gpu_pod(f"p{i}", ns=f"ns-{i}", mem=90000))
    # one user, two tokens (two tabs, or `kubectl create token` each morning)
    USERS["alice-1"] = USERS["alice-2"] = Identity("alice", "u-9", ("dev",))
    # the same name in other groups is another subject: never shares an answer
    USERS["alice-admin"] = Identity("alice", "u-9", ("dev", "admins"))
    mine = {("alice", "list", "pods", f"ns-{i}") for i in range(0, 200, 2)}
    GRANTS.update(mine)
    reviews = FakeReviews()
    client = await _client(_api(state, reviews))
    try:
        asked = []
        for token in ("alice-1", "alice-2", "alice-admin"):
            before = len(reviews.access_calls)
            answers = await asyncio.gather(*(client.get(f"/api/v1/{p}", headers=bearer(token)) for p in PAGE))
            assert [r.status for r in answers] == [403, 200, 200, 403, 200]
            pods = await answers[1].json()
            assert {i["namespace"] for i in pods["items"]} <= {f"ns-{i}" for i in range(0, 200, 2)}
            asked.append(len(reviews.access_calls) - before)
        calls = reviews.access_calls[-asked[2] :]
        assert len(calls) == len(set(calls))  # no review asked twice in one load
        # list pods and list resourcequotas: the cluster scope, then each of the 200 namespaces;
        # list nodes once (before: 803, the pods namespaces scanned by /pods, /pending and /history)
        assert asked == [2 * (1 + 200) + 1, 0, 2 * (1 + 200) + 1]
    finally:
        for token in ("alice-1", "alice-2", "alice-admin"):
            USERS.pop(token, None)
        GRANTS.difference_update(mine)
        await client.close()


class HeldReviews(FakeReviews):
    """Alice's reviews in a namespace wait for ``release``; everyone else's are answered at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.held = self.most = 0

    async def allowed(self, who: Identity, perm: Permission) -> bool:
        if who.username == "alice" and perm.namespace:
            self.held += 1
            self.most = max(self.most, self.held)
            try:
                await self.release.wait()
            finally:
                self.held -= 1
        return await super().allowed(who, perm)


async def test_one_users_scan_of_many_namespaces_leaves_room_for_the_others():
    reviews = HeldReviews()
    auth = Authorizer(reviews, concurrency=16, per_user=4)
    USERS["alice-1"] = Identity("alice", "u-9")
    try:
        alice = await auth.authenticate("Bearer alice-1")
        admin = await auth.authenticate("Bearer admin-token-bbbb")
        scan = asyncio.ensure_future(auth.namespaces(alice, "list", "pods", [f"ns-{i}" for i in range(300)]))
        for _ in range(50):
            await asyncio.sleep(0)
        check = asyncio.ensure_future(auth.allowed(admin, Permission("list", "nodes")))
        for _ in range(50):
            await asyncio.sleep(0)
        # before: alice's 300 reviews queued on the 16 shared slots, the admin's check behind them
        assert check.done() and check.result() is True
        assert reviews.most == 4 and not scan.done()
        reviews.release.set()
        assert await scan == set()
        assert reviews.most == 4 and auth._user_gates == {}
    finally:
        reviews.release.set()
        USERS.pop("alice-1", None)


async def test_token_reviews_ask_the_configured_audiences_and_refuse_others():
    user = {"username": "jane", "uid": "u-9"}
    kube = FakeKube(
        {"status": {"authenticated": True, "user": user, "audiences": ["hami-ui", "other"]}},
        {"status": {"authenticated": True, "user": user, "audiences": ["https://kubernetes.default.svc"]}},
        {"status": {"authenticated": True, "user": user}},  # an authenticator that names none
        {"status": {"authenticated": True, "user": user}},
    )
    reviews = KubeReviews(kube, audiences=["hami-ui", "hami"])
    assert await reviews.token("tok") == Identity("jane", "u-9")
    assert kube.sent[0][2]["spec"] == {"token": "tok", "audiences": ["hami-ui", "hami"]}
    assert await reviews.token("api-server-token") is None
    assert await reviews.token("no-audiences") is None
    # without audiences: the API server's default, as before, whatever status.audiences says
    plain = KubeReviews(kube)
    assert await plain.token("tok") == Identity("jane", "u-9")
    assert kube.sent[-1][2]["spec"] == {"token": "tok"}
