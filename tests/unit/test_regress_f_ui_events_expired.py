"""A pod's events read page by page when the continue token expires between pages (found by a
regression review of the paged read): the API server answers 410 Gone once it has compacted the
list's snapshot (every few minutes), and the pages already read were thrown away with the whole
read reported as failed ("could not list the events"). The list is read again from the start,
once, as client-go's pager does; a second expiry is still said."""

from __future__ import annotations

import pytest

from hami.kube.client import KubeError
from hami.ui.server import EventsUnavailable, KubeEvents

from .test_ui_events import event

PATH = "/api/v1/namespaces/team-a/events"


class ExpiringKube:
    """Three events a page; the continue token of the first ``expire`` reads past the first page
    answers 410, as an API server does after compacting the snapshot the token points into."""

    def __init__(self, items: list[dict], expire: int) -> None:
        self.items, self.expire, self.calls = items, expire, []

    async def request(self, method, path, query=(), body=None, **kw):
        self.calls.append(dict(query).get("continue"))
        start = int(dict(query).get("continue", "0"))
        if start and self.expire:
            self.expire -= 1
            raise KubeError(method, path, 410, '{"message": "The provided continue parameter is too old"}')
        rest = self.items[start + 3 :]
        meta = {"continue": str(start + 3)} if rest else {}
        return {"kind": "EventList", "metadata": meta, "items": self.items[start : start + 3]}


ITEMS = [event("Old", m) for m in range(5)] + [event("Newest", 59)]


async def test_an_expired_token_reads_the_list_again_from_the_start():
    kube = ExpiringKube(ITEMS, expire=1)
    found = await KubeEvents(kube)("team-a", "waiting-a")
    assert [e["reason"] for e in found] == [e["reason"] for e in ITEMS]  # each event once
    assert kube.calls == [None, "3", None, "3"]


async def test_a_second_expiry_is_said():
    kube = ExpiringKube(ITEMS, expire=2)
    with pytest.raises(EventsUnavailable, match="410"):
        await KubeEvents(kube)("team-a", "waiting-a")
    assert kube.calls == [None, "3", None, "3"]


async def test_a_410_on_the_first_page_is_not_read_again():
    class Gone(ExpiringKube):
        async def request(self, method, path, query=(), body=None, **kw):
            self.calls.append(dict(query).get("continue"))
            raise KubeError(method, path, 410, "gone")

    kube = Gone(ITEMS, expire=0)
    with pytest.raises(EventsUnavailable):
        await KubeEvents(kube)("team-a", "waiting-a")
    assert kube.calls == [None]
