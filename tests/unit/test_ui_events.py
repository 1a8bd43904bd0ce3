"""A pod's Kubernetes events in /api/v1 (issue 27, item 3): the newest first, cut to ``limit``,
``list events`` in the pod's namespace checked through SubjectAccessReview (403 naming it), a
bad ``limit`` or name 400 naming it, and an API server that cannot answer said in the answer."""

from __future__ import annotations

import pytest

from hami.kube.client import KubeError
from hami.ui.auth import Authorizer
from hami.ui.server import EVENT_MESSAGE, KubeEvents, UiApi

from .test_ui_api import NOW, validator_for
from .test_ui_auth import ADMIN, GRANTS, TENANT, FakeReviews, _client, bearer
from .test_ui_auth import shared as _shared_fixture

shared = _shared_fixture
EVENTS_PATH = "/api/v1/pods/{namespace}/{name}/events"


def event(reason: str, minute: int, message: str = "", kind: str = "Warning", count: int = 1) -> dict:
    return {
        "metadata": {"name": f"waiting-a.{minute}", "namespace": "team-a", "annotations": {"secret": "no"}},
        "involvedObject": {"kind": "Pod", "name": "waiting-a", "namespace": "team-a"},
        "type": kind,
        "reason": reason,
        "message": message or f"{reason} at minute {minute}",
        "count": count,
        "lastTimestamp": f"2026-11-26T08:{minute:02d}:00Z",
        "source": {"component": "hami-scheduler"},
    }


class FakeKube:
    def __init__(self, items: list[dict] | None = None, fail: Exception | None = None) -> None:
        self.items, self.fail, self.calls = items or [], fail, []

    async def request(self, method, path, query=(), body=None, **kw):
        self.calls.append((method, path, list(query)))
        if self.fail is not None:
            raise self.fail
        return {"kind": "EventList", "items": self.items}


def _api(state, kube: FakeKube) -> UiApi:
    return UiApi(
        state, "hami-scheduler", clock=lambda: NOW, authorizer=Authorizer(FakeReviews()), events=KubeEvents(kube)
    )


@pytest.fixture(autouse=True)
def tenant_may_list_events_of_team_a():
    GRANTS.add(("system:serviceaccount:team-a:viewer", "list", "events", "team-a"))
    yield
    GRANTS.discard(("system:serviceaccount:team-a:viewer", "list", "events", "team-a"))


async def test_the_newest_events_of_a_pod_first_cut_to_the_limit(shared):
    items = [event("FailedScheduling", m, count=m) for m in (3, 9, 1, 7)] + [event("Long", 5, "x" * 5000, "Normal")]
    kube = FakeKube(items)
    client = await _client(_api(shared, kube))
    try:
        resp = await client.get("/api/v1/pods/team-a/waiting-a/events?limit=3", headers=bearer(TENANT))
        assert resp.status == 200
        doc = await resp.json()
        validator_for(EVENTS_PATH).validate(doc)
        assert [e["lastSeen"] for e in doc["items"]] == [
            "2026-11-26T08:09:00Z",
            "2026-11-26T08:07:00Z",
            "2026-11-26T08:05:00Z",
        ]
        assert doc["items"][0] == {
            "type": "Warning",
            "reason": "FailedScheduling",
            "message": "FailedScheduling at minute 9",
            "count": 9,
            "lastSeen": "2026-11-26T08:09:00Z",
            "source": "hami-scheduler",
        }
        assert len(doc["items"][2]["message"]) == EVENT_MESSAGE
        assert (doc["total"], doc["truncated"], doc["error"]) == (5, True, None)
        assert "annotations" not in await resp.text()
        method, path, query = kube.calls[0]
        assert (method, path) == ("GET", "/api/v1/namespaces/team-a/events")
        assert ("fieldSelector", "involvedObject.kind=Pod,involvedObject.name=waiting-a") in query
        default = await (await client.get("/api/v1/pods/team-a/waiting-a/events", headers=bearer(TENANT))).json()
        assert len(default["items"]) == 5 and default["truncated"] is False
    finally:
        await client.close()


async def test_events_of_another_namespace_are_403_naming_list_events(shared):
    kube = FakeKube([event("FailedScheduling", 1)])
    client = await _client(_api(shared, kube))
    try:
        resp = await client.get("/api/v1/pods/team-x/waiting-x/events", headers=bearer(TENANT))
        assert resp.status == 403
        body = await resp.json()
        validator_for(EVENTS_PATH, "403").validate(body)
        assert body["missing"] == {"verb": "list", "resource": "events", "namespace": "team-x"}
        assert "list events" in body["error"] and "team-x" in body["error"]
        assert kube.calls == []  # nothing read for a caller who may not
        assert (await client.get("/api/v1/pods/team-a/waiting-a/events")).status == 401
    finally:
        await client.close()


@pytest.mark.parametrize(
    "path,named",
    [
        ("/api/v1/pods/team-a/waiting-a/events?limit=0", "limit"),
        ("/api/v1/pods/team-a/waiting-a/events?limit=101", "limit"),
        ("/api/v1/pods/team-a/waiting-a/events?limit=-1", "limit"),
        ("/api/v1/pods/team-a/waiting-a/events?limit=ten", "limit"),
        ("/api/v1/pods/team-a/waiting-a/events?limit=%C2%B2", "limit"),  # "²".isdigit(), but not int()
        ("/api/v1/pods/team-a/waiting-a/events?limit=1&limit=2", "limit"),
        ("/api/v1/pods/team-a/waiting-a/events?since=1", "since"),
        ("/api/v1/pods/Team_A/waiting-a/events", "namespace"),
        ("/api/v1/pods/team-a/Waiting%20A/events", "name"),
        ("/api/v1/pods/team-a/" + "a" * 300 + "/events", "name"),
    ],
)
async def test_a_bad_limit_or_name_is_400_naming_it(shared, path, named):
    kube = FakeKube([event("FailedScheduling", 1)])
    client = await _client(_api(shared, kube))
    try:
        resp = await client.get(path, headers=bearer(ADMIN))
        assert resp.status == 400, path
        body = await resp.json()
        validator_for(EVENTS_PATH, "400").validate(body)
        assert named in body["error"], body
        assert kube.calls == []
    finally:
        await client.close()


async def test_an_api_server_that_cannot_list_events_is_said_in_the_answer(shared):
    kube = FakeKube(fail=KubeError("GET", "/api/v1/namespaces/team-a/events", 403, "events is forbidden"))
    client = await _client(_api(shared, kube))
    try:
        resp = await client.get("/api/v1/pods/team-a/waiting-a/events", headers=bearer(TENANT))
        assert resp.status == 200
        doc = await resp.json()
        validator_for(EVENTS_PATH).validate(doc)
        assert doc["items"] == [] and "could not list the events" in doc["error"]
        # without any client (--ui-auth=none in a test): said too, never a crash
        bare = await _client(UiApi(shared, "hami-scheduler", clock=lambda: NOW))
        try:
            doc = await (await bare.get("/api/v1/pods/team-a/waiting-a/events")).json()
            assert doc["items"] == [] and "no Kubernetes client" in doc["error"]
        finally:
            await bare.close()
    finally:
        await client.close()


class PagedKube(FakeKube):
    """The API server's chunked list: ``page`` items an answer, a continue token while more remain."""

    def __init__(self, items: list[dict], page: int) -> None:
        super().__init__(items)
        self.page = page

    async def request(self, method, path, query=(), body=None, **kw):
        self.calls.append((method, path, list(query)))
        start = int(dict(query).get("continue", "0"))
        rest = self.items[start + self.page :]
        meta = {"continue": str(start + self.page)} if rest else {}
        return {"kind": "EventList", "metadata": meta, "items": self.items[start : start + self.page]}


async def test_the_newest_event_on_a_later_page_is_found():
    # the list comes in name order: the newest event may be on the last page (only the first
    # page was read before, so it was missed and the total said one page)
    items = [event("Old", m % 50) for m in range(7)] + [event("Newest", 59)]
    kube = PagedKube(items, page=3)
    found = await KubeEvents(kube)("team-a", "waiting-a")
    assert len(found) == 8 and "Newest" in [e["reason"] for e in found]
    assert [dict(q).get("continue") for _, _, q in kube.calls] == [None, "3", "6"]
