"""The UI's read API: every answer validates against openapi.yaml (the contract), values come from
the ledger, pending reasons are `hami explain`'s, read-only (405), no secret, live usage joined
in and marked stale, bad queries named, failures answered 503 (never 500)."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from jsonschema import Draft202012Validator

from hami.core import schedule_pod
from hami.core.codec import encode_node_devices_json
from hami.core.types import DeviceInfo
from hami.scheduler.explain import render
from hami.scheduler.state import ClusterState
from hami.ui import model
from hami.ui.live import NodeReading, Usage
from hami.serve import SECURITY_HEADERS
from hami.ui.server import UiApi

from ._vendorkit import config

CFG = config()
NOW = 1_795_000_000.0
SECRET = "s3cr3t-t0ken-value"
SPEC = yaml.safe_load((resources.files("hami.ui") / "openapi.yaml").read_text())
PATHS = ["/api/v1/nodes", "/api/v1/pods", "/api/v1/pending", "/api/v1/quotas"]


def validator_for(path: str, status: str = "200") -> Draft202012Validator:
    """The JSON Schema of one response of the OpenAPI document (its $refs resolve inside it)."""
    op = SPEC["paths"][path]["get"]["responses"][status]
    if "$ref" in op:
        op = SPEC["components"]["responses"][op["$ref"].rsplit("/", 1)[1]]
    schema = op["content"]["application/json"]["schema"]
    return Draft202012Validator({**SPEC, **schema}, format_checker=Draft202012Validator.FORMAT_CHECKER)


def gpu_node(name: str, gpus: int = 2, mem: int = 16384, model_: str = "NVIDIA-Tesla T4") -> dict:
    devs = [
        DeviceInfo(id=f"GPU-{name}-{i}", index=i, count=10, devmem=mem, devcore=100, type=model_, health=True)
        for i in range(gpus)
    ]
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "annotations": {
                "hami.io/node-nvidia-register": encode_node_devices_json(devs),
                "hami.io/device-cordon": f"GPU-{name}-1",
            },
        },
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus * 10)},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def npu_node(name: str) -> dict:
    npus = [
        {
            "id": f"{name}-npu-{i}",
            "index": i,
            "count": 4,
            "devmem": 65536,
            "devcore": 20,
            "type": "Ascend910B3",
            "health": True,
        }
        for i in range(2)
    ]
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "annotations": {"hami.io/node-register-Ascend910B3": json.dumps(npus)},
        },
        "status": {"allocatable": {"huawei.com/Ascend910B3": "2"}},
    }


def gpu_pod(name: str, ns: str = "team-a", mem: int = 3000, cores: int = 30, node_selector=None, **limits) -> dict:
    lim = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mem, "nvidia.com/gpucores": cores, **limits}
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{ns}-{name}",
            "resourceVersion": "1",
            "annotations": {"example.com/api-token": SECRET},
        },
        "spec": {
            "schedulerName": "hami-scheduler",
            "nodeSelector": node_selector or {},
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": lim},
                    "env": [{"name": "TOKEN", "value": SECRET}],
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def placed(state: ClusterState, p: dict, node: str) -> dict:
    """The pod as it is after the scheduler's decision came back through the watch."""
    result = schedule_pod(p, [node], state.ledger, state.config, NOW)
    assert result.node == node, result.reasons()
    out = json.loads(json.dumps(p))
    out["metadata"]["annotations"].update(result.annotations)
    out["metadata"]["annotations"]["hami.io/bind-phase"] = "success"
    out["metadata"]["resourceVersion"] = "2"
    out["spec"]["nodeName"] = node
    out["status"]["phase"] = "Running"
    state.pod_handler.apply("MODIFIED", out)
    return out


def npu_pod(name: str) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-b",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "annotations": {},
        },
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [
                {
                    "name": "mindie",
                    "resources": {"limits": {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 16384}},
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


@pytest.fixture
def cluster() -> ClusterState:
    s = ClusterState(CFG)
    s.node_handler.replace([gpu_node("gpu-1"), gpu_node("gpu-2", model_="NVIDIA-A10"), npu_node("npu-1")])
    s.quota_handler.replace(
        [
            {
                "metadata": {"name": "q", "namespace": "team-a"},
                "spec": {"hard": {"limits.nvidia.com/gpumem": "20000", "pods": "10"}},
            }
        ]
    )
    placed(s, gpu_pod("train"), "gpu-1")
    from hami.core import admit_pod

    admitted, _ = admit_pod(npu_pod("infer"), CFG.vendors)
    placed(s, admitted, "npu-1")
    s.pod_handler.apply("ADDED", gpu_pod("huge", ns="team-c", mem=40000))  # fits nowhere: pending
    return s


async def _client(api: UiApi) -> TestClient:
    client = TestClient(TestServer(api.app()))
    await client.start_server()
    return client


def readings(fresh: bool = True) -> dict[str, NodeReading]:
    r = NodeReading(
        scraped_at=NOW - (5 if fresh else 500),
        stale_after=45,
        devices={"GPU-gpu-1-0": Usage(2048, 37.0)},
        containers={("team-a", "train", "main", "GPU-gpu-1-0"): Usage(1900, 35.5)},
    )
    return {"gpu-1": r}


async def test_every_answer_validates_against_the_openapi_document(cluster):
    live = type("Live", (), {"readings": readings()})()
    client = await _client(UiApi(cluster, "hami-scheduler", live, clock=lambda: NOW))
    try:
        queries = {
            "/api/v1/nodes": ["", "?node=gpu-1", "?model=NVIDIA-A10", "?vendor=Ascend910B3"],
            "/api/v1/pods": ["", "?namespace=team-a", "?node=npu-1"],
            "/api/v1/pending": ["", "?namespace=team-a"],
            "/api/v1/quotas": ["", "?namespace=team-b"],
        }
        for path, qs in queries.items():
            for q in qs:
                resp = await client.get(path + q)
                assert resp.status == 200, (path, q, await resp.text())
                body = await resp.json()
                errors = sorted(validator_for(path).iter_errors(body), key=str)
                assert not errors, (path, q, [e.message for e in errors][:5])
                assert body["items"] or q, (path, "an unfiltered answer should hold something in this cluster")
        resp = await client.get("/api/v1/nodes?colour=red")
        assert resp.status == 400 and resp.headers["Cache-Control"] == "no-store"  # (as every API answer)
        body = await resp.json()
        assert not list(validator_for("/api/v1/nodes", "400").iter_errors(body))
        assert "colour" in body["error"]
    finally:
        await client.close()


def test_the_contract_rejects_a_wrong_document():
    """The contract test is only worth something if the schema is strict: a renamed field fails."""
    doc = model.envelope(
        "NodeList",
        NOW,
        [
            {
                "name": "n",
                "ready": True,
                "unschedulable": False,
                "devices": [],
                "monitor": {"state": "live", "ageSeconds": 1, "error": None},
                "extra": 1,
            }
        ],
    )
    assert list(validator_for("/api/v1/nodes").iter_errors(doc))
    doc["items"][0].pop("extra")
    assert not list(validator_for("/api/v1/nodes").iter_errors(doc))


def test_nodes_carry_the_ledgers_allocations_and_vendor_units(cluster):
    doc = model.nodes_document(cluster, NOW)
    by_name = {n["name"]: n for n in doc["items"]}
    assert sorted(by_name) == ["gpu-1", "gpu-2", "npu-1"]
    g0, g1 = by_name["gpu-1"]["devices"]
    assert g0["memoryMiB"] == {"allocated": 3000, "total": 16384}
    assert g0["cores"] == {"allocated": 30, "total": 100, "unit": "percent"}
    assert g0["slots"] == {"allocated": 1, "total": 10}
    assert g1["cordoned"] is True and g1["memoryMiB"]["allocated"] == 0
    assert by_name["gpu-1"]["ready"] is True and by_name["npu-1"]["ready"] is None
    npu = by_name["npu-1"]["devices"][0]
    assert npu["vendor"] == "Ascend910B3" and npu["cores"]["unit"] == "AI cores"
    assert npu["memoryMiB"] == {"allocated": 16384, "total": 65536}  # the 16 GiB template, in MiB
    assert g0["usage"] == {"state": "unavailable", "memoryUsedMiB": None, "utilizationPercent": None}


def test_pods_list_grants_per_container(cluster):
    doc = model.pods_document(cluster, NOW)
    pods = {f"{p['namespace']}/{p['name']}": p for p in doc["items"]}
    assert sorted(pods) == ["team-a/train", "team-b/infer"]
    train = pods["team-a/train"]
    assert train["node"] == "gpu-1" and train["phase"] == "Running" and train["bindPhase"] == "success"
    [c] = train["containers"]
    assert c["name"] == "main" and c["kind"] == "app"
    assert [(g["uuid"], g["memoryMiB"], g["cores"], g["coreUnit"]) for g in c["grants"]] == [
        ("GPU-gpu-1-0", 3000, 30, "percent")
    ]
    [grant] = pods["team-b/infer"]["containers"][0]["grants"]
    assert grant["vendor"] == "Ascend910B3" and grant["memoryMiB"] == 16384 and grant["coreUnit"] == "AI cores"


def test_pending_reasons_are_those_hami_explain_prints(cluster):
    doc = model.pending_document(cluster, NOW, "hami-scheduler")
    [p] = doc["items"]
    assert (p["namespace"], p["name"], p["fitsNow"], doc["total"], doc["truncated"]) == (
        "team-c",
        "huge",
        False,
        1,
        False,
    )
    assert p["requests"] == [
        {
            "container": "main",
            "kind": "app",
            "vendor": "NVIDIA",
            "count": 1,
            "memoryMiB": 40000,
            "memoryPercent": None,
            "cores": 30,
        }
    ]
    text = render(cluster.pods["team-c/huge"], cluster, [], NOW)
    for verdict in p["nodes"]:
        if verdict["devices"]:
            assert f"  node {verdict['node']}: {verdict['reason']}" in text
    gpu1 = next(v for v in p["nodes"] if v["node"] == "gpu-1")
    assert gpu1["reason"] == "1/2 CardCordoned, 1/2 CardInsufficientMemory"
    assert {d["uuid"]: d["reason"] for d in gpu1["devices"]} == {
        "GPU-gpu-1-0": "CardInsufficientMemory",
        "GPU-gpu-1-1": "CardCordoned",
    }
    assert "CardInsufficientMemory" in p["summary"]
    # a placed (or reserved) pod is not pending
    assert all(i["name"] != "train" for i in doc["items"])


def test_quotas_show_limit_and_namespace_usage(cluster):
    [q] = model.quotas_document(cluster, NOW)["items"]
    assert q == {
        "namespace": "team-a",
        "name": "q",
        "resources": [
            {
                "resource": "limits.nvidia.com/gpumem",
                "vendor": "NVIDIA",
                "kind": "memory",
                "unit": "MiB",
                "limit": 20000,
                "used": 3000,
            }
        ],
    }


def test_live_usage_is_joined_and_marked_stale_when_old(cluster):
    fresh = model.nodes_document(cluster, NOW, readings(True))
    gpu1 = next(n for n in fresh["items"] if n["name"] == "gpu-1")
    assert gpu1["monitor"]["state"] == "live" and gpu1["monitor"]["ageSeconds"] == 5
    assert gpu1["devices"][0]["usage"] == {"state": "live", "memoryUsedMiB": 2048, "utilizationPercent": 37.0}
    other = next(n for n in fresh["items"] if n["name"] == "gpu-2")
    assert other["monitor"]["state"] == "unavailable"
    pods = model.pods_document(cluster, NOW, readings(True))
    train = next(p for p in pods["items"] if p["name"] == "train")
    assert train["containers"][0]["grants"][0]["usage"] == {
        "state": "live",
        "memoryUsedMiB": 1900,
        "utilizationPercent": 35.5,
    }
    old = model.nodes_document(cluster, NOW, readings(False))
    gpu1 = next(n for n in old["items"] if n["name"] == "gpu-1")
    assert gpu1["monitor"]["state"] == "stale"
    assert gpu1["devices"][0]["usage"]["state"] == "stale" and gpu1["devices"][0]["usage"]["memoryUsedMiB"] == 2048
    failed = readings(True)
    failed["gpu-1"].error = "ClientConnectorError: refused"
    gpu1 = next(n for n in model.nodes_document(cluster, NOW, failed)["items"] if n["name"] == "gpu-1")
    assert gpu1["monitor"] == {"state": "stale", "ageSeconds": 5.0, "error": "ClientConnectorError: refused"}


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
async def test_every_path_is_read_only(cluster, method):
    client = await _client(UiApi(cluster, "hami-scheduler", clock=lambda: NOW))
    try:
        for path in PATHS + ["/", "/static/app.js", "/api/v1/openapi.yaml", "/nowhere"]:
            resp = await client.request(method, path, data=b"{}")
            assert resp.status == 405, (method, path)
            assert resp.headers["Allow"] == "GET, HEAD"
        assert len(model.pods_document(cluster, NOW)["items"]) == 2  # nothing changed
    finally:
        await client.close()


async def test_no_secret_or_token_is_ever_served(cluster):
    client = await _client(UiApi(cluster, "hami-scheduler", clock=lambda: NOW))
    try:
        for path in PATHS + ["/", "/static/app.js"]:
            resp = await client.get(path)
            assert resp.status == 200
            text = await resp.text()
            assert SECRET not in text and "api-token" not in text, path
            for header, value in SECURITY_HEADERS.items():
                assert resp.headers[header] == value
    finally:
        await client.close()


async def test_page_and_assets_are_served_without_any_other_origin(cluster):
    client = await _client(UiApi(cluster, "hami-scheduler", clock=lambda: NOW))
    try:
        page = await (await client.get("/")).text()
        assert 'src="static/app.js"' in page and 'href="static/style.css"' in page
        assert "http://" not in page and "https://" not in page  # nothing from the internet
        js = await client.get("/static/app.js")
        assert js.status == 200 and js.headers["Content-Type"].startswith("text/javascript")
        assert ".innerHTML" not in await js.text()  # API text is never parsed as HTML
        assert (await client.get("/static/../openapi.yaml")).status == 404
        assert (await client.get("/static/secret.txt")).status == 404
        spec = await client.get("/api/v1/openapi.yaml")
        assert yaml.safe_load(await spec.text())["info"]["version"] == "v1"
    finally:
        await client.close()


async def test_a_failing_answer_is_503_and_the_server_keeps_serving(cluster):
    class Broken:
        def __getattr__(self, name):
            raise RuntimeError("boom")

    client = await _client(UiApi(Broken(), "hami-scheduler", clock=lambda: NOW))
    try:
        resp = await client.get("/api/v1/nodes")
        assert resp.status == 503 and resp.headers["Retry-After"] == "5"
        body = await resp.json()  # the spec's Unavailable: JSON with an error (was text/plain)
        validator_for("/api/v1/nodes", "503").validate(body)
        assert "try again" in body["error"]
        assert (await client.get("/healthz")).status == 200
    finally:
        await client.close()


async def test_the_openapi_document_takes_no_query_parameters(cluster):
    client = await _client(UiApi(cluster, "hami-scheduler", clock=lambda: NOW))
    try:
        assert (await client.get("/api/v1/openapi.yaml")).status == 200
        for query in ("?anything=1", "?a=1&a=2"):
            resp = await client.get("/api/v1/openapi.yaml" + query)
            assert resp.status == 400, query
            body = await resp.json()
            validator_for("/api/v1/openapi.yaml", "400").validate(body)
            assert "'a" in body["error"]
    finally:
        await client.close()


def test_a_node_the_pods_selector_leaves_out_is_never_where_it_would_go(cluster):
    # gpu-2 has room, but kube-scheduler never offers it to a pod selecting pool=batch: the page
    # must not say the pod fits now there (as hami explain, hami.core.nodefit)
    cluster.pod_handler.apply("ADDED", gpu_pod("picky", ns="team-c", node_selector={"pool": "batch"}))
    doc = model.pending_document(cluster, NOW, "hami-scheduler")
    item = next(i for i in doc["items"] if i["name"] == "picky")
    assert (item["fitsNow"], item["wouldChoose"]) == (False, None)
    gpu2 = next(v for v in item["nodes"] if v["node"] == "gpu-2")
    assert gpu2["fits"] and gpu2["leftOut"] == "node(s) didn't match Pod's node affinity/selector"
    assert "left out by kube-scheduler: node(s) didn't match Pod's node affinity/selector" in item["summary"]
    huge = next(i for i in doc["items"] if i["name"] == "huge")
    assert all(v["leftOut"] is None for v in huge["nodes"])
    assert not list(validator_for("/api/v1/pending").iter_errors(doc))


def test_pending_pod_with_unreadable_requests_says_why(cluster):
    bad = gpu_pod("bad")
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "lots"
    cluster.pod_handler.apply("ADDED", bad)
    doc = model.pending_document(cluster, NOW, "hami-scheduler")
    item = next(i for i in doc["items"] if i["name"] == "bad")
    assert item["error"].startswith("cannot read the pod's requests") and "nvidia.com/gpumem" in item["error"]
    assert not list(validator_for("/api/v1/pending").iter_errors(doc))


def test_pending_list_is_capped(cluster, monkeypatch):
    monkeypatch.setattr(model, "MAX_PENDING", 1)
    cluster.pod_handler.apply("ADDED", gpu_pod("huge2", mem=40000))
    doc = model.pending_document(cluster, NOW, "hami-scheduler")
    assert (len(doc["items"]), doc["total"], doc["truncated"]) == (1, 2, True)


def test_pending_explaining_stops_when_its_time_budget_is_spent(cluster):
    for i in range(3):
        cluster.pod_handler.apply("ADDED", gpu_pod(f"more-{i}", ns="team-c", mem=40000))
    ticks = iter(range(100))  # each look at the clock: one more second of work
    doc = model.pending_document(cluster, NOW, "hami-scheduler", budget_s=1.5, timer=lambda: next(ticks))
    assert (len(doc["items"]), doc["total"], doc["truncated"]) == (2, 4, True)


async def test_pending_answer_is_reused_for_a_short_while(cluster):
    clock = [NOW]
    client = await _client(UiApi(cluster, "hami-scheduler", clock=lambda: clock[0]))
    try:
        first = await (await client.get("/api/v1/pending")).json()
        cluster.pod_handler.apply("ADDED", gpu_pod("later", ns="team-c", mem=40000))
        assert (await (await client.get("/api/v1/pending")).json())["total"] == first["total"]
        clock[0] += 5
        assert (await (await client.get("/api/v1/pending")).json())["total"] == first["total"] + 1
    finally:
        await client.close()


async def test_odd_queries_and_paths_get_a_4xx_never_a_500(cluster):
    client = await _client(UiApi(cluster, "hami-scheduler", clock=lambda: NOW))
    odd = [
        "?node=%00",
        "?node=" + "x" * 5000,
        "?model=%E2%80%AE",
        "?node=a&node=b",
        "?namespace=",
        "?%ff=1",
        "?node",
        "?vendor=NVIDIA&zzz=1",
        "?namespace=../../etc",
    ]
    try:
        for path in PATHS:
            for q in odd:
                resp = await client.get(path + q)
                assert resp.status in (200, 400), (path, q, resp.status)
                body = await resp.json()
                assert ("error" in body) == (resp.status == 400)
        for path in ("/api/v2/nodes", "/api/v1/nodes/extra", "/static/", "/static/%2e%2e%2fopenapi.yaml"):
            assert (await client.get(path)).status == 404, path
    finally:
        await client.close()


def test_the_openapi_document_is_well_formed():
    assert SPEC["openapi"].startswith("3.1") and SPEC["info"]["version"] == "v1"
    for name, schema in SPEC["components"]["schemas"].items():
        Draft202012Validator.check_schema(schema)  # raises SchemaError naming the problem
    refs = set(re.findall(r'\$ref": "#/components/(?:schemas|responses)/(\w+)', json.dumps(SPEC)))
    known = set(SPEC["components"]["schemas"]) | set(SPEC["components"]["responses"])
    assert "NodeList" in refs and refs <= known, refs - known
    served = {path for path in SPEC["paths"]}
    assert served == {*PATHS, "/api/v1/openapi.yaml", "/api/v1/history", "/api/v1/pods/{namespace}/{name}/events"}


async def test_a_query_parameter_given_twice_is_400_naming_it(cluster):
    """Found by make fuzz (UI read API): /api/v1/pods?node=gpu-1&node=npu-1 answered for one of the
    two nodes, silently; which one was aiohttp's choice."""
    client = await _client(UiApi(cluster, "hami-scheduler", clock=lambda: NOW))
    try:
        resp = await client.get("/api/v1/pods?node=gpu-1&node=npu-1")
        assert resp.status == 400
        body = await resp.json()
        assert body == {"error": "query parameter 'node' given 2 times (give it once)"}
        assert not list(validator_for("/api/v1/pods", "400").iter_errors(body))
        assert (await client.get("/api/v1/pods?node=gpu-1&namespace=team-a")).status == 200
    finally:
        await client.close()
