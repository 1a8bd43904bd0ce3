"""The UI's history from Prometheus (issue 27, item 2; ``--ui-prometheus-url``): the range queries
sent (metric names from hami.metricnames, the 60-bucket grid, a tenant's namespaces as label
matchers), the answer built from them, the refusal of names that could inject PromQL (400 before
any query), and the ring as the fallback when Prometheus fails, said in ``error``.

Prometheus is not part of Kubernetes: the stand-in below is a small aiohttp server speaking its
``/api/v1/query_range`` API. It evaluates just enough PromQL to answer the UI's queries (the
outer ``sum/max by (...)``, the label matchers, ``/ 1048576``) over a few stored series, and it
refuses any query whose matchers are not the strict form the UI must write."""

from __future__ import annotations

import argparse
import asyncio
import re

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hami import metricnames as M
from hami.core.errors import ConfigError
from hami.scheduler import metrics as scheduler_metrics
from hami.scheduler import options as O
from hami.ui import history as H
from hami.ui import prometheus as P
from hami.ui.auth import Authorizer
from hami.ui.server import UiApi

from .test_ui_api import validator_for
from .test_ui_auth import ADMIN, TENANT, FakeReviews, _client
from .test_ui_auth import shared as _shared_state

shared = _shared_state
NOW = 1_780_000_000 + 17  # not on a bucket edge
MIB = 1024 * 1024
JOIN = " * on (node, device_uuid) group_left (device_cores)"
MATCHER = re.compile(r'([a-z_]+)(=~|=)"([A-Za-z0-9._:|\\-]*)"')

# raw series the stand-in holds: metric -> [(labels, value)]
SERIES = {
    M.POD_MEMORY_ALLOCATED: [
        (
            {"namespace": "team-a", "node": "gpu-s", "pod": "mine", "container_index": "0", "device_uuid": "GPU-1"},
            2000 * MIB,
        ),
        (
            {
                "namespace": "team-x",
                "node": "gpu-s",
                "pod": "secret-trainer",
                "container_index": "0",
                "device_uuid": "GPU-1",
            },
            3000 * MIB,
        ),
        (
            {
                "namespace": "team-b",
                "node": "gpu-o",
                "pod": "elsewhere",
                "container_index": "0",
                "device_uuid": "GPU-2",
            },
            1000 * MIB,
        ),
    ],
    M.POD_CORES_ALLOCATED: [
        ({"namespace": "team-a", "node": "gpu-s", "pod": "mine", "container_index": "0", "device_uuid": "GPU-1"}, 20),
        (
            {
                "namespace": "team-x",
                "node": "gpu-s",
                "pod": "secret-trainer",
                "container_index": "0",
                "device_uuid": "GPU-1",
            },
            30,
        ),
    ],
    M.CONTAINER_MEMORY_USED: [
        ({"namespace": "team-a", "pod": "mine", "container": "c", "device_uuid": "GPU-1"}, 500 * MIB),
        ({"namespace": "team-x", "pod": "secret-trainer", "container": "c", "device_uuid": "GPU-1"}, 900 * MIB),
    ],
    M.CONTAINER_UTILIZATION: [({"namespace": "team-a", "pod": "mine", "container": "c", "device_uuid": "GPU-1"}, 42)],
    M.GPU_MEMORY_ALLOCATED: [
        # device_cores: the GPU's registered cores (100 for an NVIDIA GPU; were 60 and 10 before
        # the cores queries read it, 1 Dec)
        ({"node": "gpu-s", "device_uuid": "GPU-1", "device_type": "NVIDIA-A10", "device_cores": "100"}, 6000 * MIB),
        ({"node": "gpu-o", "device_uuid": "GPU-2", "device_type": "NVIDIA-A10", "device_cores": "100"}, 1000 * MIB),
    ],
    M.GPU_CORES_ALLOCATED: [({"node": "gpu-s", "device_uuid": "GPU-1", "device_type": "NVIDIA-A10"}, 60)],
    M.HOST_MEMORY_USED: [({"node": "gpu-s", "device_uuid": "GPU-1", "device_type": "NVIDIA-A10"}, 1400 * MIB)],
    M.HOST_UTILIZATION: [({"node": "gpu-s", "device_uuid": "GPU-1", "device_type": "NVIDIA-A10"}, 55)],
}


def _matches(labels: dict, matchers: list[tuple[str, str, str]]) -> bool:
    for name, op, value in matchers:
        got = labels.get(name, "")
        if op == "=" and got != value:
            return False
        if op == "=~" and not re.fullmatch(value.replace("\\\\", "\\"), got):
            return False
    return True


class FakePrometheus:
    """A stand-in for Prometheus' ``/api/v1/query_range``; keeps every form it received."""

    def __init__(self) -> None:
        self.forms: list[dict[str, str]] = []
        self.fail: tuple[int, str] | None = None  # (status, error) to answer instead
        self.hang = asyncio.Event()  # cleared: answer; set: never answer
        self.hang_now = False

    async def query_range(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.forms.append(form)
        if self.hang_now:
            await self.hang.wait()
        if self.fail is not None:
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": self.fail[1]}, status=self.fail[0]
            )
        q = form["query"]
        if JOIN in q:
            return self._joined(form)
        selectors = re.findall(r"(hami_[a-z_]+)\{([^}]*)\}", q)
        assert len(selectors) == 1, q
        metric, inner = selectors[0]
        assert metric in SERIES or metric.startswith("hami_"), q
        matchers = MATCHER.findall(inner)
        # every matcher in the strict form, nothing else between the braces
        assert ",".join(f'{n}{op}"{v}"' for n, op, v in matchers) == inner, inner
        outer = re.match(r"(sum|max) by \(([^)]*)\)", q)
        assert outer, q
        by = [x.strip() for x in outer.group(2).split(",")]
        groups: dict[tuple, float] = {}
        for labels, value in SERIES.get(metric, []):
            if not _matches(labels, matchers):
                continue
            key = tuple((b, labels[b]) for b in by if b in labels)
            groups[key] = (
                (groups.get(key, 0.0) + value) if outer.group(1) == "sum" else max(groups.get(key, value), value)
            )
        divide = MIB if q.endswith(f"/ {MIB}") else 1
        start, end, step = int(form["start"]), int(form["end"]), int(form["step"])
        times = range(start, end + 1, step)
        result = [
            {"metric": dict(k), "values": [[t, str(v / divide)] for t in times]} for k, v in sorted(groups.items())
        ]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})

    def _joined(self, form: dict[str, str]) -> web.Response:
        """A cores query: ``(sum|max) by (..., device_cores) (max by (...) (<cores>) * on (node,
        device_uuid) group_left (device_cores) (topk by (node, device_uuid) (1, max by (node,
        device_uuid, device_cores) (<gpu memory allocated>)) * 0 + 1))``: each series of the
        cores family is given its GPU's ``device_cores`` label (a GPU without one is left out)."""
        q = form["query"]
        m = re.fullmatch(
            r"(sum|max) by \(([a-z_, ]+)\) \(max by \(([a-z_, ]+)\) \((?:avg_over_time\()?(hami_[a-z_]+)\{([^}]*)\}"
            r"(?:\[\d+s\]\))?\)"
            + re.escape(JOIN)
            + r" \(topk by \(node, device_uuid\) \(1, max by \(node, device_uuid, device_cores\) "
            r"\((?:avg_over_time\()?(hami_[a-z_]+)\{([^}]*)\}(?:\[\d+s\]\))?\)\) \* 0 \+ 1\)\)",
            q,
        )
        assert m, q
        outer, by, inner, metric, left, right_metric, right = m.groups()
        assert right_metric == M.GPU_MEMORY_ALLOCATED, q
        for text in (left, right):
            assert ",".join(f'{n}{op}"{v}"' for n, op, v in MATCHER.findall(text)) == text, text
        cores_of = {
            (labels["node"], labels["device_uuid"]): labels["device_cores"]
            for labels, _ in SERIES[right_metric]
            if _matches(labels, MATCHER.findall(right))
        }
        inner_by = [x.strip() for x in inner.split(",")]
        by_ = [x.strip() for x in by.split(",")]
        first: dict[tuple, tuple[dict, float]] = {}
        for labels, value in SERIES.get(metric, []):
            if _matches(labels, MATCHER.findall(left)):
                key = tuple(labels[b] for b in inner_by if b in labels)
                first[key] = (labels, max(first.get(key, (labels, value))[1], value))
        groups: dict[tuple, float] = {}
        for labels, value in first.values():
            cores = cores_of.get((labels["node"], labels["device_uuid"]))
            if cores is None:
                continue
            joined = {**labels, "device_cores": cores}
            key = tuple((b, joined[b]) for b in by_ if b in joined)
            groups[key] = groups.get(key, 0.0) + value if outer == "sum" else max(groups.get(key, value), value)
        times = range(int(form["start"]), int(form["end"]) + 1, int(form["step"]))
        result = [{"metric": dict(k), "values": [[t, str(v)] for t in times]} for k, v in sorted(groups.items())]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})

    async def query(self, request: web.Request) -> web.Response:
        """The instant query listing the keys: ``group by (...) (last_over_time(sel[Ns])) or ...``."""
        form = dict(await request.post())
        self.forms.append(form)
        if self.hang_now:
            await self.hang.wait()
        if self.fail is not None:
            return web.json_response({"status": "error", "error": self.fail[1]}, status=self.fail[0])
        q = form["query"]
        parts = q.split(" or ")
        keys: set[tuple] = set()
        for part in parts:
            m = re.fullmatch(
                r"group by \(([a-z_, ]+)\) \(last_over_time\((hami_[a-z_]+)\{([^}]*)\}\[(\d+)s\]\)\)", part
            )
            assert m, part
            by = [x.strip() for x in m.group(1).split(",")]
            matchers = MATCHER.findall(m.group(3))
            assert ",".join(f'{n}{op}"{v}"' for n, op, v in matchers) == m.group(3), m.group(3)
            for labels, _ in SERIES.get(m.group(2), []):
                if _matches(labels, matchers):
                    keys.add(tuple((b, labels[b]) for b in by if b in labels))
        result = [{"metric": dict(k), "value": [int(form["time"]), "1"]} for k in sorted(keys)]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/prom/api/v1/query_range", self.query_range)
        app.router.add_post("/prom/api/v1/query", self.query)
        return app


@pytest.fixture
def prom():
    return FakePrometheus()


async def _started(prom: FakePrometheus) -> TestServer:
    """The stand-in, listening on a free loopback port (started in the test's own event loop)."""
    server = TestServer(prom.app())
    await server.start_server()
    prom.url = str(server.make_url("/prom"))
    return server


async def _setup(state, prom, **kw):
    server = await _started(prom)
    api = UiApi(
        state,
        "hami-scheduler",
        clock=lambda: NOW,
        authorizer=Authorizer(FakeReviews()),
        prometheus=P.PrometheusHistory(prom.url, **kw),
    )
    return api, server


async def _close(prom: FakePrometheus, server: TestServer, client) -> None:
    prom.hang.set()
    await client.close()
    await server.close()


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_the_names_queried_are_the_ones_exported():
    for name in (M.POD_MEMORY_ALLOCATED, M.POD_CORES_ALLOCATED, M.GPU_MEMORY_ALLOCATED, M.GPU_CORES_ALLOCATED):
        assert name in scheduler_metrics.ALLOCATION
    for kind in ("namespace", "pod", "gpu"):
        for q in P.queries(kind, {}, 60).values():
            metrics = re.findall(r"(hami_[a-z_]+)\{", q)
            assert metrics and all(m in vars(M).values() for m in metrics)


async def test_an_admin_gets_every_pod_from_prometheus_on_the_rings_grid(shared, prom):
    api, server = await _setup(shared, prom)
    client = await _client(api)
    try:
        r = await client.get("/api/v1/history?kind=pod&range=1h", headers=bearer(ADMIN))
        doc = await r.json()
        assert r.status == 200, doc
        validator_for("/api/v1/history").validate(doc)
        assert doc["source"] == "prometheus" and doc["error"] is None and doc["step"] == 60
        assert [i["key"] for i in doc["items"]] == ["team-a/mine", "team-b/elsewhere", "team-x/secret-trainer"]
        mine = doc["items"][0]
        assert mine["labels"] == {"namespace": "team-a", "node": "gpu-s"}
        p = mine["points"]
        assert len(p["t"]) == H.POINTS and p["t"][-1] == (NOW // 60) * 60 and p["t"][1] - p["t"][0] == 60
        assert p["memoryAllocatedMiB"] == [2000.0] * H.POINTS and p["coresAllocated"][-1] == 20
        assert p["memoryUsedMiB"][-1] == 500.0 and p["utilizationPercent"][-1] == 42
        # the keys first (an instant query at the grid's end), then one range query per value, on
        # the grid: 60 evaluations, each at a bucket's end
        assert len(prom.forms) == 5 and prom.forms[0]["time"] == str((NOW // 60 + 1) * 60)
        for form in prom.forms[1:]:
            start, end, step = int(form["start"]), int(form["end"]), int(form["step"])
            assert step == 60 and (end - start) // step + 1 == H.POINTS and end == (NOW // 60 + 1) * 60
            assert "avg_over_time" not in form["query"]  # 1-minute buckets: the value at the bucket's end
    finally:
        await _close(prom, server, client)


async def test_a_tenants_queries_carry_its_namespaces_only(shared, prom):
    api, server = await _setup(shared, prom)
    client = await _client(api)
    try:
        for kind in ("pod", "namespace"):
            prom.forms.clear()
            r = await client.get(f"/api/v1/history?kind={kind}&range=6h", headers=bearer(TENANT))
            text = await r.text()
            assert r.status == 200, text
            for leak in ("team-x", "team-b", "secret-trainer", "elsewhere"):
                assert leak not in text
            assert prom.forms and all('namespace=~"team-a"' in f["query"] for f in prom.forms), prom.forms
            assert all("avg_over_time(" in f["query"] and "[360s])" in f["query"] for f in prom.forms[1:])
        doc = await (await client.get("/api/v1/history?kind=namespace", headers=bearer(TENANT))).json()
        assert [i["key"] for i in doc["items"]] == ["team-a"]
        assert doc["items"][0]["points"]["memoryAllocatedMiB"][-1] == 2000.0
        prom.forms.clear()
        r = await client.get("/api/v1/history?kind=pod&namespace=team-x", headers=bearer(TENANT))
        assert r.status == 403 and prom.forms == []  # refused before any query
        r = await client.get("/api/v1/history?kind=gpu", headers=bearer(TENANT))
        assert r.status == 403 and prom.forms == []
    finally:
        await _close(prom, server, client)


async def test_gpu_series_over_seven_days(shared, prom):
    api, server = await _setup(shared, prom)
    client = await _client(api)
    try:
        r = await client.get("/api/v1/history?kind=gpu&range=7d&node=gpu-s", headers=bearer(ADMIN))
        doc = await r.json()
        assert r.status == 200, doc
        validator_for("/api/v1/history").validate(doc)
        (gpu,) = doc["items"]
        assert gpu["key"] == "GPU-1" and gpu["labels"]["model"] == "NVIDIA-A10" and gpu["labels"]["node"] == "gpu-s"
        assert gpu["points"]["memoryAllocatedMiB"][-1] == 6000.0 and gpu["points"]["utilizationPercent"][-1] == 55
        assert doc["step"] == 10080 and all("[10080s]" in f["query"] for f in prom.forms[1:])
        assert all('node="gpu-s"' in f["query"] for f in prom.forms)
    finally:
        await _close(prom, server, client)


@pytest.mark.parametrize(
    "query, name",
    [
        ('kind=pod&namespace=team-a"} or vector(1) #', "namespace"),
        ("kind=pod&namespace=team-a%22%7D%20or%20vector(1)", "namespace"),
        ('kind=pod&pod=mine"}or{__name__=~".%2B', "pod"),
        ("kind=pod&pod=mine%5C", "pod"),
        ('kind=gpu&uuid=GPU-1",node=~".%2A', "uuid"),
        ("kind=gpu&node=gpu-s%0Aup", "node"),
        ("kind=pod&node=.%2A", "node"),
        ("kind=gpu&uuid=", "uuid"),
    ],
)
async def test_promql_injection_is_refused_before_any_query(shared, prom, query, name):
    api, server = await _setup(shared, prom)
    client = await _client(api)
    try:
        r = await client.get(f"/api/v1/history?{query}", headers=bearer(ADMIN))
        body = await r.json()
        assert r.status == 400 and f"query parameter {name}" in body["error"], body
        assert prom.forms == []
    finally:
        await _close(prom, server, client)


@pytest.mark.parametrize("value", ['a"', "a\\", "a}", "a b", "a,b", "a\n", "", "-a", "a=~b", "a|b"])
def test_a_label_value_that_is_not_a_plain_name_never_reaches_a_query(value):
    with pytest.raises(ValueError):
        P.label_value(value)
    with pytest.raises(ValueError):
        P.selector("hami_x", {"namespace": {value}})


def test_a_dot_in_a_set_of_values_is_no_wildcard():
    assert P.selector("m", {"node": {"a.b", "c"}}) == 'm{node=~"a\\\\.b|c"}'


async def test_prometheus_failing_is_said_and_the_ring_answers(shared, prom):
    api, server = await _setup(shared, prom)
    api.sample_history()
    client = await _client(api)
    try:
        prom.fail = (422, "parse error at char 3")
        r = await client.get("/api/v1/history?kind=pod", headers=bearer(ADMIN))
        doc = await r.json()
        assert r.status == 200
        validator_for("/api/v1/history").validate(doc)
        assert doc["source"] == "memory" and "HTTP 422: parse error at char 3" in doc["error"]
        assert "team-a/mine" in [i["key"] for i in doc["items"]]
    finally:
        await _close(prom, server, client)


async def test_no_answer_within_the_timeout_falls_back(shared, prom):
    prom.hang_now = True  # the stand-in never answers
    api, server = await _setup(shared, prom, timeout=0.2)
    client = await _client(api)
    try:
        r = await client.get("/api/v1/history?kind=namespace", headers=bearer(ADMIN))
        doc = await r.json()
        assert r.status == 200 and doc["source"] == "memory"
        assert "0.2 s" in doc["error"] or "Timeout" in doc["error"], doc["error"]
    finally:
        await _close(prom, server, client)


async def test_an_answer_over_the_byte_bound_is_refused(shared, prom):
    api, server = await _setup(shared, prom, max_bytes=200)
    client = await _client(api)
    try:
        doc = await (await client.get("/api/v1/history?kind=pod", headers=bearer(ADMIN))).json()
        assert doc["source"] == "memory" and "larger than" in doc["error"]
    finally:
        await _close(prom, server, client)


async def test_unreachable_prometheus_falls_back(shared):
    server = TestServer(web.Application())
    await server.start_server()
    url = str(server.make_url("/"))
    await server.close()  # nothing listens there now
    api = UiApi(
        shared, "h", clock=lambda: NOW, authorizer=Authorizer(FakeReviews()), prometheus=P.PrometheusHistory(url)
    )
    client = await _client(api)
    try:
        doc = await (await client.get("/api/v1/history?kind=namespace", headers=bearer(ADMIN))).json()
        assert doc["source"] == "memory" and doc["error"].startswith("Prometheus could not answer")
    finally:
        await client.close()


def _args(*argv):
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_flag():
    assert O.options_from_args(_args()).ui_prometheus_url == ""
    opts = O.options_from_args(_args("--ui-bind", "127.0.0.1:9090", "--ui-prometheus-url", "http://prom:9090/x"))
    assert opts.ui_prometheus_url == "http://prom:9090/x"


@pytest.mark.parametrize(
    "argv, text",
    [
        (["--ui-prometheus-url", "http://prom:9090"], "only used with --ui-bind"),
        (["--ui-bind", "127.0.0.1:9090", "--ui-prometheus-url", "file:///etc/passwd"], "--ui-prometheus-url"),
        (["--ui-bind", "127.0.0.1:9090", "--ui-prometheus-url", "http://prom:9090/?query=up"], "--ui-prometheus-url"),
        (["--ui-bind", "127.0.0.1:9090", "--ui-prometheus-url", "http://u:p@prom:9090"], "--ui-prometheus-url"),
        (["--ui-bind", "127.0.0.1:9090", "--ui-prometheus-url", "http://prom:99999"], "--ui-prometheus-url"),
    ],
)
def test_a_bad_flag_is_named(argv, text):
    with pytest.raises(ConfigError, match=re.escape(text)):
        O.options_from_args(_args(*argv))


async def test_only_the_first_series_are_asked_for_and_the_total_counts_all(shared, prom):
    """The keys come first; the range queries then name the first ``limit`` series only, so an
    answer stays small on a cluster with thousands of GPUs."""
    api, server = await _setup(shared, prom)
    client = await _client(api)
    try:
        history = P.PrometheusHistory(prom.url)
        items, total = await history.series("pod", "1h", NOW, {}, None, limit=2)
        assert total == 3 and [i["key"] for i in items] == ["team-a/mine", "team-b/elsewhere"]
        for form in prom.forms[1:]:
            assert 'pod=~"elsewhere|mine"' in form["query"] and "secret-trainer" not in form["query"], form
        prom.forms.clear()
        items, total = await history.series("gpu", "1h", NOW, {"uuid": "GPU-9"}, None)
        assert (items, total) == ([], 0) and len(prom.forms) == 1  # no key: no range query
    finally:
        await _close(prom, server, client)


def test_callers_cannot_multiply_the_queries_sent_to_prometheus():
    """Each history answer opened its own session and sent its queries, with no bound: many
    parallel requests were many parallel query sets. Found by an adversarial review."""
    from hami.ui.prometheus import PrometheusHistory

    async def run() -> tuple[int, int]:
        prom = PrometheusHistory("http://prometheus.invalid:9090", concurrent=2)
        calls = in_flight = most = 0

        async def series(session, kind, matchers, *rest):
            nonlocal calls, in_flight, most
            calls += 1
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1
            return [{"key": str(matchers)}], 1

        prom._series = series
        same = [prom.series("pod", "1h", 1_795_000_000.0, {}, {"team-a"}) for _ in range(10)]
        other = [prom.series("pod", "1h", 1_795_000_000.0, {"node": f"n{i}"}, None) for i in range(6)]
        answers = await asyncio.gather(*same, *other)
        assert all(a == answers[0] for a in answers[:10])
        return calls, most

    calls, most = asyncio.run(run())
    assert calls == 7 and most == 2  # one for the ten same questions, one per other; two at a time
