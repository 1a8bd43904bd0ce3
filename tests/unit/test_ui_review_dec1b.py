"""Found by review, 1 Dec: what callers cost the scheduler's loop on /api/v1/pods, DRA claims
counted once per container using them, and sign-ins a flood of made-up tokens locked out.

1. Every /api/v1/pods request walked the whole cluster: the candidate namespaces (every pod of
   the ledger and of the watch cache) before any permission check, then every item and grant of
   the shared document to cut a tenant's scope; a made-up ``?node=`` built a document each.
2. A DRA claim's grants are repeated on every container using it: the history, the anonymous
   shared-device totals and the page's memory sort added each copy; a pod's claims shared one
   history key and were averaged, not added.
3. Accepted and refused tokens shared one LRU, and unknown tokens held every review slot: a flood
   of junk tokens pushed signed-in users out and then left them no slot to sign in again.
"""

from __future__ import annotations

import asyncio

import pytest

from hami.scheduler.state import ClusterState
from hami.ui import history, model, scope
from hami.ui.auth import (
    ACCEPTED_BEFORE,
    RENEWALS_IN_FLIGHT,
    TOKEN_REVIEWS_IN_FLIGHT,
    Authorizer,
    Identity,
    ReviewBusy,
    Unauthenticated,
    token_owner,
)
from hami.ui.server import UiApi

from ._vendorkit import config
from .test_dra_claims import claim, result
from .test_ui_api import NOW, gpu_node, gpu_pod, placed
from .test_ui_auth import ADMIN, NOBODY, TENANT, USERS, FakeReviews, _api, _client, bearer, shared  # noqa: F401
from .test_ui_dra import cluster as dra_cluster  # noqa: F401 - the fixture
from .test_ui_dra import dra_pod


# ---------------------------------------------------------------------- 1. what callers cost
def _old_scope(doc: dict, visible: set[str]) -> dict:
    """The narrowing as it was before the index (one walk over every item and grant), each DRA
    claim's grant counted once (finding 2): the answers must stay the same."""
    kept = [i for i in doc["items"] if i["namespace"] in visible]
    hidden = [i for i in doc["items"] if i["namespace"] not in visible]

    def key(item: dict, g: dict) -> tuple[str, str]:
        return (g.get("node") or item.get("node") or "", g.get("uuid") or "")

    used = {key(i, g) for i in kept for c in i["containers"] for g in c["grants"]}
    totals: dict = {}
    for item in hidden:
        holders = set()
        for g in model.counted_grants(item):
            k = key(item, g)
            if k not in used or not k[1]:
                continue
            t = totals.setdefault(k, {"node": k[0], "uuid": k[1], "pods": 0, "memoryMiB": 0, "cores": 0})
            t["memoryMiB"] += int(g.get("memoryMiB") or 0)
            t["cores"] += int(g.get("cores") or 0)
            if k not in holders:
                holders.add(k)
                t["pods"] += 1
    return {**doc, "items": kept, "othersOnSharedDevices": [totals[k] for k in sorted(totals)]}


def _many() -> ClusterState:
    """Four nodes (their first GPU takes every pod: the second is cordoned), 24 pods of six
    namespaces sharing them."""
    s = ClusterState(config())
    s.node_handler.replace([gpu_node(f"n{i}") for i in range(4)])
    for i in range(24):
        placed(s, gpu_pod(f"p{i}", ns=f"ns-{i % 6}", mem=100 + 10 * i, cores=1 + i % 3), f"n{i % 4}")
    return s


def test_a_scope_cut_from_the_index_is_the_scope_of_the_full_walk(dra_cluster):  # noqa: F811
    """Found by review, 1 Dec: the tenant's scope is now cut from an index of the document;
    every visible set (none, one, several, all, unknown namespaces) answers as before, DRA
    claims included."""
    for source in (_many(), dra_cluster):
        doc = model.pods_document(source, NOW)
        index = scope.pods_index(doc)
        spaces = sorted({i["namespace"] for i in doc["items"]})
        cases = [set(), {"nowhere"}, *({ns} for ns in spaces), set(spaces[:2]), set(spaces[1::2]), set(spaces)]
        for visible in cases:
            assert scope.pods(doc, visible, index) == _old_scope(doc, visible), visible
            assert scope.pods(doc, visible) == _old_scope(doc, visible), visible
        assert scope.pods(doc, None, index) == {**doc, "othersOnSharedDevices": []}
        assert any(scope.pods(doc, {ns}, index)["othersOnSharedDevices"] for ns in spaces)  # shared, really


class CountingItems(list):
    """A document's items, counting the walks over them."""

    walks = 0

    def __iter__(self):
        CountingItems.walks += 1
        return super().__iter__()


async def test_callers_cost_their_own_items_and_a_403_walks_nothing(shared, monkeypatch):  # noqa: F811
    """Found by review, 1 Dec: at 8000 pods a caller without RBAC cost ~4.3 ms a request before
    its 403 (the namespaces of every pod, looked for before the permission check) and a tenant of
    one namespace 15-23 ms (every item and grant walked to cut its scope), on the loop Filter and
    Bind run on. Counted here: the walks over the ledger's pods and over the document's items."""
    ledger_walks = []
    real_pods = shared.ledger.pods
    monkeypatch.setattr(shared.ledger, "pods", lambda: ledger_walks.append(1) or real_pods())
    real_doc = model.pods_document

    def counted(*a, **k):
        doc = real_doc(*a, **k)
        return {**doc, "items": CountingItems(doc["items"])}

    monkeypatch.setattr(model, "pods_document", counted)
    CountingItems.walks = 0
    client = await _client(_api(shared, FakeReviews()))
    try:
        for _ in range(20):  # a caller with no permission polling
            assert (await client.get("/api/v1/pods", headers=bearer(NOBODY))).status == 403
        assert len(ledger_walks) <= 1  # the namespaces are looked for once, then kept
        assert CountingItems.walks == 0  # and no document
        # the cluster-wide caller needs no candidates: one build, then nothing per request
        before = len(ledger_walks)
        admin = [await (await client.get("/api/v1/pods", headers=bearer(ADMIN))).json() for _ in range(10)]
        assert len(ledger_walks) == before + 1  # the document's build
        walks = CountingItems.walks
        tenant = [await (await client.get("/api/v1/pods", headers=bearer(TENANT))).json() for _ in range(20)]
        assert len(ledger_walks) == before + 1
        assert CountingItems.walks == walks  # twenty scopes cut without walking the cluster's items
        # and they see what they saw
        whole = {k: v for k, v in admin[0].items() if k != "cacheSynced"}
        expected = _old_scope(whole, {"team-a"})
        assert {k: v for k, v in tenant[-1].items() if k != "cacheSynced"} == expected
        assert [i["name"] for i in tenant[-1]["items"]] == ["mine"]
        assert tenant[-1]["othersOnSharedDevices"] == [
            {"node": "gpu-s", "uuid": "GPU-gpu-s-0", "pods": 2, "memoryMiB": 4000, "cores": 40}
        ]
    finally:
        await client.close()


async def test_a_made_up_node_is_an_empty_list_without_a_document(shared, monkeypatch):  # noqa: F811
    """Found by review, 1 Dec: each new ``?node=`` value (only its format checked) built a
    document of its own on the scheduler's loop. A node no item is on is answered empty from the
    shared document; a node with items is answered as before."""
    built = []
    real = model.pods_document
    monkeypatch.setattr(model, "pods_document", lambda *a, **k: built.append(dict(a[3] or {})) or real(*a, **k))
    client = await _client(_api(shared, FakeReviews()))
    try:
        for who in (ADMIN, TENANT):
            for i in range(10):
                resp = await client.get(f"/api/v1/pods?node=made-up-{i}", headers=bearer(who))
                body = await resp.json()
                assert resp.status == 200 and body["items"] == [] and body["othersOnSharedDevices"] == []
                assert body["kind"] == "PodList"
        assert built == [{}]  # the shared document only
        resp = await client.get("/api/v1/pods?node=gpu-s", headers=bearer(TENANT))
        body = await resp.json()
        assert [i["name"] for i in body["items"]] == ["mine"] and body["othersOnSharedDevices"][0]["pods"] == 2
        assert built == [{}, {"node": "gpu-s"}]
        body = await (await client.get("/api/v1/pods?node=gpu-o", headers=bearer(TENANT))).json()
        assert body["items"] == [] and body["othersOnSharedDevices"] == []  # team-b's node: nothing of team-a
        body = await (await client.get("/api/v1/pods?node=gpu-o", headers=bearer(ADMIN))).json()
        assert [i["name"] for i in body["items"]] == ["elsewhere"]
        # a caller with no permission is still refused first
        assert (await client.get("/api/v1/pods?node=made-up-x", headers=bearer(NOBODY))).status == 403
    finally:
        await client.close()


# ---------------------------------------------------------------------- 2. DRA counted once
def _both_containers_on_c1(cluster: ClusterState) -> None:  # noqa: F811
    pod = dra_pod("p1")
    pod["metadata"]["resourceVersion"] = "4"
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "hami-gpu-1"}]}  # "other" uses it too
    cluster.pod_handler.apply("MODIFIED", pod)


def test_a_claim_used_by_two_containers_counts_once(dra_cluster):  # noqa: F811
    """Found by review, 1 Dec: team-a/p1 with both containers on claim c1 (3000 MiB, 25 cores)
    was recorded 6000 MiB / 50 in the history, and a team-b caller sharing the GPU saw others
    holding 6000 / 50, while /nodes shows the claim's 3000 allocated."""
    _both_containers_on_c1(dra_cluster)
    nodes = model.nodes_document(dra_cluster, NOW)
    pods = model.pods_document(dra_cluster, NOW)
    [p1] = [i for i in pods["items"] if i["name"] == "p1"]
    assert [c["name"] for c in p1["containers"]] == ["other", "main"]  # each still shows its grant
    samples = {(kind, key): values for kind, key, _, values in history.samples(nodes, pods)}
    assert samples[("pod", "team-a/p1")][:2] == (3000.0, 25.0)
    [train] = [i for i in pods["items"] if i["name"] == "train"]
    train_mem = sum(g["memoryMiB"] for c in train["containers"] for g in c["grants"])
    assert samples[("namespace", "team-a")][0] == 3000.0 + train_mem
    [gpu0] = [d for n in nodes["items"] for d in n["devices"] if d["uuid"] == "GPU-dra-0"]
    others = scope.pods(pods, {"team-b"})["othersOnSharedDevices"]
    assert others == [{"node": "dra-1", "uuid": "GPU-dra-0", "pods": 1, "memoryMiB": 3000, "cores": 25}]
    assert gpu0["memoryMiB"]["allocated"] == 3000 + 1000  # c1 and team-b's own c2


def test_a_claim_shared_by_containers_counts_its_used_memory_once(dra_cluster):  # noqa: F811
    """Found by review, 1 Dec: the monitor labels a region shared by containers with the claim's
    name, so every container's grant carries the same reading: it was added once per container."""
    from hami.ui.live import NodeReading, Usage

    _both_containers_on_c1(dra_cluster)
    live = {
        "dra-1": NodeReading(
            scraped_at=NOW - 1, stale_after=45, containers={("team-a", "p1", "c1", "GPU-dra-0"): Usage(1200, 20.0)}
        )
    }
    pods = model.pods_document(dra_cluster, NOW, live)
    samples = {(kind, key): values for kind, key, _, values in history.samples({"items": []}, pods)}
    assert samples[("pod", "team-a/p1")][2:] == (1200.0, 20.0)
    assert samples[("namespace", "team-a")][2] == 1200.0


def test_the_claims_of_one_pod_add_up_in_its_history(dra_cluster):  # noqa: F811
    """Found by review, 1 Dec: a pod with claims d1 (1000 MiB) and d2 (2000 MiB) is two items of
    the pods document under one history key, and the ring averaged them: 1500 MiB."""
    pod = dra_pod("p2")
    pod["spec"]["resourceClaims"] = [{"name": "a", "resourceClaimName": "d1"}, {"name": "b", "resourceClaimName": "d2"}]
    pod["spec"]["containers"][1]["resources"] = {"claims": [{"name": "a"}, {"name": "b"}]}
    pod["status"]["resourceClaimStatuses"] = []
    dra_cluster.pod_handler.apply("ADDED", pod)
    for name, mem, cores in (("d1", "1000Mi", "10"), ("d2", "2000Mi", "20")):
        dra_cluster.claim_handler.apply(
            "ADDED", claim(name, results=[result("dra-1", "gpu-0", mem, cores)], reserved=("p2",))
        )
    nodes = model.nodes_document(dra_cluster, NOW)
    pods = model.pods_document(dra_cluster, NOW)
    assert [i["claim"]["name"] for i in pods["items"] if i["name"] == "p2"] == ["d1", "d2"]
    batch = history.samples(nodes, pods)
    assert [key for kind, key, _, _ in batch if kind == "pod"].count("team-a/p2") == 1
    ring = history.History()
    ring.record(NOW, batch)
    [series] = [s for s in ring.series("pod") if s.key == "team-a/p2"]
    point = series.points("1h", NOW)
    assert (point["memoryAllocatedMiB"][-1], point["coresAllocated"][-1]) == (3000.0, 30.0)


def test_the_page_sorts_a_claim_by_the_memory_it_holds(dra_cluster):  # noqa: F811
    """Found by review, 1 Dec: the pod table's memory column added a claim's grant once per
    container using it: p1 (one 3000 MiB claim on two containers) sorted after a 4500 MiB pod."""
    from ._browser import missing

    if missing():
        pytest.skip(missing())
    from ._browser import launch, open_page, serving

    import playwright.sync_api as sync_api

    _both_containers_on_c1(dra_cluster)
    dra_cluster.node_handler.apply("ADDED", gpu_node("gpu-2"))
    placed(dra_cluster, gpu_pod("big", ns="team-c", mem=4500), "gpu-2")
    with serving(UiApi(dra_cluster, "hami-scheduler")) as url, sync_api.sync_playwright() as p:
        b = launch(p)
        try:
            page, errors = open_page(b, url)
            page.click("#pod-table th:nth-child(4) button")
            rows = page.eval_on_selector_all(
                "#pod-table tbody tr", "(rows) => rows.map((r) => r.getAttribute('data-pod'))"
            )
            assert rows.index("team-a/p1") < rows.index("team-c/big") < rows.index("team-b/"), rows
            assert errors == [], errors
        finally:
            b.close()


# ---------------------------------------------------------------------- 3. sign-ins under a flood
class JunkHeld(FakeReviews):
    """Reviews of tokens starting with "junk" wait for ``release`` (and are refused); others answer."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def token(self, token: str) -> Identity | None:
        if token.startswith("junk"):
            self.token_calls.append(token)
            await self.release.wait()
            return None
        return await super().token(token)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_refused_tokens_do_not_push_accepted_ones_out():
    """Found by review, 1 Dec: accepted and refused tokens shared one 4096-entry LRU: a flood of
    made-up tokens from any pod pushed every signed-in user's answer out."""
    reviews = FakeReviews()
    auth = Authorizer(reviews, clock=lambda: 0.0, max_entries=8)
    assert (await auth.authenticate(f"Bearer {TENANT}")).identity == USERS[TENANT]
    for i in range(50):
        with pytest.raises(Unauthenticated):
            await auth.authenticate(f"Bearer junk-{i}")
    assert (await auth.authenticate(f"Bearer {TENANT}")).identity == USERS[TENANT]
    assert reviews.token_calls.count(TENANT) == 1  # still known: no review again
    # and a refused token is still kept (for the denied TTL): no review per request
    with pytest.raises(Unauthenticated):
        await auth.authenticate("Bearer junk-49")
    assert reviews.token_calls.count("junk-49") == 1


async def test_a_flood_of_unknown_tokens_leaves_signed_in_users_a_review_slot():
    """Found by review, 1 Dec: made-up tokens held all 8 token-review slots, so a user whose
    accepted answer's 10 s ran out got 503 on every request for as long as the flood lasted."""
    reviews = JunkHeld()
    now = [0.0]
    auth = Authorizer(reviews, clock=lambda: now[0])
    held = [f"held-{i}" for i in range(RENEWALS_IN_FLIGHT + 1)]  # users signed in before the flood
    for token in held:
        USERS[token] = Identity(f"user-{token}")
    block = asyncio.Event()
    block.set()
    real = reviews.token

    async def slow(token: str) -> Identity | None:
        if token.startswith("held"):
            await block.wait()
        return await real(token)

    reviews.token = slow  # type: ignore[method-assign]
    flood: list[asyncio.Future] = []
    try:
        await auth.authenticate(f"Bearer {TENANT}")
        for token in held:
            await auth.authenticate(f"Bearer {token}")
        now[0] = 11.0  # past the TTL: each token is reviewed again
        flood = [asyncio.ensure_future(auth.authenticate(f"Bearer junk-{i}")) for i in range(TOKEN_REVIEWS_IN_FLIGHT)]
        await _settle()
        with pytest.raises(ReviewBusy):  # the bound on unknown tokens holds
            await auth.authenticate("Bearer junk-one-more")
        caller = await auth.authenticate(f"Bearer {TENANT}")
        assert caller.identity == USERS[TENANT] and reviews.token_calls.count(TENANT) == 2
        # the reserved slots are bounded too: past them, one more user finds none
        block.clear()
        renewing = [asyncio.ensure_future(auth.authenticate(f"Bearer {t}")) for t in held[:RENEWALS_IN_FLIGHT]]
        await _settle()
        with pytest.raises(ReviewBusy):  # its own slots taken, and the flood holds the others
            await auth.authenticate(f"Bearer {held[-1]}")
        block.set()
        assert [(await r).identity.username for r in renewing] == [f"user-{t}" for t in held[:RENEWALS_IN_FLIGHT]]
    finally:
        for token in held:
            USERS.pop(token, None)
        reviews.release.set()
        for refused in await asyncio.gather(*flood, return_exceptions=True):
            assert isinstance(refused, Unauthenticated)


async def test_a_token_refused_after_it_was_accepted_loses_its_reserved_slot():
    """A revoked token is refused once and then reviewed as any unknown token."""
    reviews = JunkHeld()
    now = [0.0]
    USERS["revoked-token"] = Identity("gone")
    auth = Authorizer(reviews, clock=lambda: now[0])
    try:
        await auth.authenticate("Bearer revoked-token")
    finally:
        del USERS["revoked-token"]
    now[0] = 11.0
    with pytest.raises(Unauthenticated):
        await auth.authenticate("Bearer revoked-token")
    now[0] = 14.0  # past the denied TTL: unknown again
    flood = [asyncio.ensure_future(auth.authenticate(f"Bearer junk-{i}")) for i in range(TOKEN_REVIEWS_IN_FLIGHT)]
    await _settle()
    try:
        with pytest.raises(ReviewBusy):
            await auth.authenticate("Bearer revoked-token")
    finally:
        reviews.release.set()
        await asyncio.gather(*flood, return_exceptions=True)


async def test_minted_tokens_do_not_push_signed_in_users_out_of_their_reserved_slots():
    """Found by the regression review, 1 Dec: a tenant minting 4096 valid tokens (TokenRequest for
    the ServiceAccounts of its namespace) pushed every signed-in user out of the tokens accepted
    before; past their answer's TTL, with junk holding the other slots, they got 503. Each owner (a
    user; a namespace's ServiceAccounts together) now keeps at most ACCEPTED_PER_OWNER there."""
    reviews = JunkHeld()
    now = [0.0]
    auth = Authorizer(reviews, clock=lambda: now[0])
    minted = [f"minted-{i}" for i in range(ACCEPTED_BEFORE)]
    for i, token in enumerate(minted):
        USERS[token] = Identity(f"system:serviceaccount:tenant-ns:sa-{i}")
    flood: list[asyncio.Future] = []
    try:
        await auth.authenticate(f"Bearer {TENANT}")
        for token in minted:
            await auth.authenticate(f"Bearer {token}")
        now[0] = 11.0  # past the TTL
        flood = [asyncio.ensure_future(auth.authenticate(f"Bearer junk-{i}")) for i in range(TOKEN_REVIEWS_IN_FLIGHT)]
        await _settle()
        caller = await auth.authenticate(f"Bearer {TENANT}")  # its reserved slot is still its
        assert caller.identity == USERS[TENANT]
        # the namespace's minted tokens keep only ACCEPTED_PER_OWNER places: the newest
        await auth.authenticate(f"Bearer {minted[-1]}")
        with pytest.raises(ReviewBusy):
            await auth.authenticate(f"Bearer {minted[0]}")
        assert token_owner("system:serviceaccount:a:b") == token_owner("system:serviceaccount:a:c") != "alice"
        assert token_owner("alice") == "alice"
    finally:
        for token in minted:
            USERS.pop(token, None)
        reviews.release.set()
        await asyncio.gather(*flood, return_exceptions=True)
