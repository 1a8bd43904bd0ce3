"""A flood of large AdmissionReviews must not take the event loop from the health checks, Filter
and Bind. Found by review, 1 Dec: ``/webhook`` answers anyone, and each review ran on the loop
at once; 24 callers posting forged 1.8 MB reviews (0.65 s of loop each) made every ``/healthz``
probe time out (readiness, then liveness failed). Scenario: heavy reviews are held inside their
review (the body parse, which runs in the review's turn); at most one runs at a time, the ones
beyond the waiting limit get 429 at once, and a light review, ``/healthz`` and ``/filter`` are
answered while they wait."""

from __future__ import annotations

import asyncio
import json

from aiohttp.test_utils import TestClient, TestServer

from hami.scheduler import server as S
from hami.scheduler.options import Options
from hami.scheduler.server import SchedulerService

from .test_scheduler_state import node

HEAVY_BYTES = 300_000  # over the heavy threshold (checked below): a pod with a 300 KB annotation


def review(uid: str, note: str = "") -> bytes:
    meta = {"name": "p", **({"annotations": {"note": note}} if note else {})}
    pod = {"metadata": meta, "spec": {"containers": [{"name": "c"}]}}
    req = {"uid": uid, "operation": "CREATE", "kind": {"kind": "Pod"}, "namespace": "ns", "object": pod}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}).encode()


async def until(condition, what: str) -> None:
    """Wait for the server to get somewhere (a guard against a hang, not a timing check)."""
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def test_heavy_reviews_run_one_at_a_time_and_probes_filter_and_light_reviews_go_past(monkeypatch):
    svc = SchedulerService(Options(), None)
    svc.extender.record = False
    svc.state.node_handler.replace([node("n1")])
    arrived: dict[int, object] = {}  # the heavy requests whose body is in
    running, peak, release = [0], [0], asyncio.Event()
    read_body, parse = S.read_body, SchedulerService._json

    async def counted_read(request):
        raw = await read_body(request)
        if len(raw) >= HEAVY_BYTES:
            arrived[id(request)] = request
        return raw

    async def held_parse(self, request, max_values=S.MAX_NODES):
        # the review's first step: a heavy one is held here, inside its turn, until released
        raw = await S.read_body(request)
        if len(raw) >= HEAVY_BYTES:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            await release.wait()
            running[0] -= 1
        return await parse(self, request, max_values)

    monkeypatch.setattr(S, "read_body", counted_read)
    monkeypatch.setattr(SchedulerService, "_json", held_parse)
    heavy = [review(f"h{i}", "x" * HEAVY_BYTES) for i in range(12)]
    async with TestClient(TestServer(svc.app())) as client:

        async def post(body: bytes):
            r = await client.post("/webhook", data=body)
            return r.status, await r.text()

        tasks = [asyncio.create_task(post(heavy[i])) for i in range(3)]
        await until(lambda: len(arrived) == 3 and running[0] >= 1, "3 heavy bodies in, one under review")
        for _ in range(10):
            await asyncio.sleep(0)
        assert peak[0] == 1, f"{peak[0]} heavy reviews ran at once"

        # while heavy reviews wait: the probes, a Filter and a light review are answered
        r = await client.get("/healthz")
        assert r.status == 200 and await r.text() == "ok"
        r = await client.get("/readyz")
        assert r.status == 200
        status, text = await post(review("light"))
        assert status == 200 and json.loads(text)["response"] == {"uid": "light", "allowed": True}
        r = await client.post("/filter", data=json.dumps({"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["n1"]}))
        assert r.status == 200

        # fill the heavy lane up to its waiting limit; the next one is refused at once
        assert HEAVY_BYTES > S.WEBHOOK_HEAVY_BODY and len(heavy) > S.WEBHOOK_HEAVY_WAITING + 2
        full = 1 + S.WEBHOOK_HEAVY_WAITING
        tasks += [asyncio.create_task(post(heavy[i])) for i in range(3, full)]
        await until(lambda: len(arrived) == full and svc.webhook_gate.heavy_admitted == full, "the heavy lane full")
        r = await client.post("/webhook", data=heavy[full])
        text = await r.text()
        assert r.status == 429 and r.headers.get("Retry-After") == "1", (r.status, text)
        assert f"body of {len(heavy[full])} bytes" in text and f"at most {S.WEBHOOK_HEAVY_WAITING} wait" in text
        assert svc.webhook_gate.refused == 1 and not release.is_set() and peak[0] == 1

        # released: every admitted heavy review is answered, still one at a time
        release.set()
        answers = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        assert [s for s, _ in answers] == [200] * full
        assert sorted(json.loads(t)["response"]["uid"] for _, t in answers) == sorted(f"h{i}" for i in range(full))
        assert all(json.loads(t)["response"]["allowed"] for _, t in answers)
        assert peak[0] == 1 and svc.webhook_gate.heavy_admitted == 0
        # room again: a heavy review is taken once more
        status, text = await post(heavy[full])
        assert status == 200 and json.loads(text)["response"]["uid"] == f"h{full}"


async def test_a_claim_review_keeps_its_quota_check_and_count_in_one_turn(monkeypatch):
    """The claim path's room check and its count (admit_claim) stay one step: nothing else runs
    between them, also with the review in a turn of the gate."""
    svc = SchedulerService(Options(), None)
    steps: list[str] = []
    real_review, real_admit = S.review_with_templates, svc.state.admit_claim

    def review_then_mark(*a, **k):
        steps.append("review")
        asyncio.get_running_loop().call_soon(steps.append, "other")  # anything queued meanwhile
        return real_review(*a, **k)

    def admit(*a, **k):
        steps.append("admit")
        return real_admit(*a, **k)

    monkeypatch.setattr(S, "review_with_templates", review_then_mark)
    monkeypatch.setattr(svc.state, "admit_claim", admit)
    claim = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "c",
            "operation": "CREATE",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "namespace": "ns",
            "object": {
                "metadata": {"name": "c", "namespace": "ns"},
                "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.hami.io"}}]}},
            },
        },
    }
    async with TestClient(TestServer(svc.app())) as client:
        r = await client.post("/webhook", data=json.dumps(claim))
        assert r.status == 200 and (await r.json())["response"]["allowed"] is True
    assert steps[:3] == ["review", "admit", "other"], steps


async def test_cheap_light_reviews_run_back_to_back_and_yield_once_they_used_their_slice(monkeypatch):
    """Regression review, 1 Dec: each light review yielded the loop with its lane held, so a review
    took two loop passes at least and 500 ordinary reviews beside 20 ms of other loop work waited
    11 s at the median (past the webhook's timeout). Cheap ones now run back to back until they
    used their slice of the loop, then yield once."""
    gate = S.ReviewGate()
    passes = 0

    async def other_loop_work():
        nonlocal passes
        while True:
            passes += 1
            await asyncio.sleep(0)

    beside = asyncio.ensure_future(other_loop_work())
    await asyncio.sleep(0)
    try:
        monkeypatch.setattr(S, "WEBHOOK_LIGHT_SLICE", 3600.0)  # never used up here
        before = passes
        for _ in range(20):
            async with gate.turn(100):
                pass
        assert passes == before, "a light review yielded the loop before its slice was used"
        monkeypatch.setattr(S, "WEBHOOK_LIGHT_SLICE", 0.0)  # used up by every review
        before = passes
        for _ in range(5):
            async with gate.turn(100):
                pass
        assert passes >= before + 5, "light reviews past their slice did not yield the loop"
    finally:
        beside.cancel()
