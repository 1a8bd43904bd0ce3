"""``POST /webhook`` from a caller that is not the API server: anyone who reaches the port can
send an AdmissionReview (the API server does not authenticate itself to webhooks). What the body
names must not steer the scheduler's own API calls: names that go into URLs are checked, a dry
run writes nothing, the DRA front end's template creation is bounded, and a failed namespace
read is a denial (an AdmissionReview), never an HTTP 500/504."""

from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from hami.kube.client import KubeError
from hami.scheduler import server as S
from hami.scheduler.options import Options
from hami.scheduler.server import SchedulerService
from hami.webhook.admission import name_error
from hami.webhook.templates import TemplateBudget


class FakeKube:
    """The API server as the webhook sees it: namespaces to read, templates to create."""

    def __init__(self, namespaces=("ns", "t"), get_error=None, post_error=None, hang=False):
        self.namespaces = {
            n: {"metadata": {"name": n, "labels": {}}, "status": {"phase": "Active"}} for n in namespaces
        }
        self.templates: set[tuple[str, str]] = set()
        self.get_error, self.post_error, self.hang = get_error, post_error, hang
        self.calls: list[tuple[str, str]] = []

    async def get(self, path, **query):
        self.calls.append(("GET", path))
        if self.hang:
            await asyncio.sleep(3600)
        if self.get_error is not None:
            raise self.get_error
        prefix = "/api/v1/namespaces/"
        if path.startswith(prefix) and path[len(prefix) :] in self.namespaces:
            return self.namespaces[path[len(prefix) :]]
        raise KubeError("GET", path, 404, '{"message": "not found"}')

    async def request(self, method, path, query=(), body=None):
        self.calls.append((method, path))
        if method == "GET":
            return await self.get(path)
        if self.post_error is not None:
            raise self.post_error
        ns = path.split("/namespaces/")[1].split("/")[0]
        key = (ns, body["metadata"]["name"])
        if key in self.templates:
            raise KubeError(method, path, 409, '{"message": "already exists"}')
        self.templates.add(key)
        return body


def pod(gpumem=3000, env=(), name="p", pod_namespace=None):
    meta = {"name": name, **({"namespace": pod_namespace} if pod_namespace is not None else {})}
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": gpumem}
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "env": [dict(e) for e in env], "resources": {"limits": limits}}]},
    }


def review(namespace="ns", dry_run=None, **pod_args):
    req = {"uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"}, "object": pod(**pod_args)}
    if namespace is not None:
        req["namespace"] = namespace
    if dry_run is not None:
        req["dryRun"] = dry_run
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


DISABLE = ({"name": "CUDA_DISABLE_CONTROL", "value": "true"},)


async def post(svc, body):
    async with TestClient(TestServer(svc.app(extender=False))) as client:
        r = await client.post("/webhook", json=body)
        assert r.status == 200, await r.text()
        answer = await r.json()
        assert answer["kind"] == "AdmissionReview" and answer["response"]["uid"] == "u"
        return answer["response"]


def service(kube, front_end="dra"):
    svc = SchedulerService(Options(front_end=front_end), None)
    svc.kube = kube
    return svc


def patch_of(response):
    return json.loads(base64.b64decode(response["patch"]))


BAD_NAMESPACES = ["x/../../../../apis/foo", "..", "Kube-System", "a" * 64, "ns?watch=1", "ns%2f..", "-ns", "ns "]


@pytest.mark.parametrize("front_end, env", [("dra", ()), ("extender", DISABLE), ("dra", DISABLE)])
@pytest.mark.parametrize("ns", BAD_NAMESPACES)
async def test_a_namespace_that_is_not_a_dns_label_is_refused_before_any_api_call(ns, front_end, env):
    kube = FakeKube()
    response = await post(service(kube, front_end), review(ns, env=env))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "request.namespace" in response["status"]["message"]
    assert repr(ns[:63])[1:-1] in response["status"]["message"]
    assert kube.calls == []


async def test_the_pods_own_namespace_and_name_are_checked_too():
    kube = FakeKube()
    svc = service(kube)
    r = await post(svc, review(None, pod_namespace="../../apis"))
    assert r["allowed"] is False and r["status"]["code"] == 400
    assert "request.object.metadata.namespace" in r["status"]["message"]
    r = await post(svc, review("ns", pod_namespace="other"))
    assert r["allowed"] is False and r["status"]["code"] == 400
    assert "'other'" in r["status"]["message"] and "'ns'" in r["status"]["message"]
    r = await post(svc, review("ns", name="p/../../x"))
    assert r["allowed"] is False and r["status"]["code"] == 400
    assert "request.object.metadata.name" in r["status"]["message"] and "p/../../x" in r["status"]["message"]
    assert kube.calls == []
    # the same pod, well named, is admitted (and a generateName pod has no name yet)
    assert (await post(svc, review("ns", pod_namespace="ns")))["allowed"] is True
    assert (await post(svc, review("ns", name="")))["allowed"] is True


def test_name_error_reads_what_it_can_and_leaves_wrong_types_to_the_shape_check():
    assert name_error({"namespace": "ns"}, {"metadata": {"name": "a.b-c", "namespace": "ns"}}) is None
    assert name_error({"namespace": 5}, {"metadata": None}) is None  # the shape check names it
    assert name_error({}, "not a pod") is None
    assert "request.namespace" in (name_error({"namespace": "a" * 64}, {}) or "")
    assert "request.object.metadata.name" in (name_error({}, {"metadata": {"name": "a..b"}}) or "")
    assert "request.object.metadata.name" in (name_error({}, {"metadata": {"name": "a" * 254}}) or "")


async def test_a_dry_run_writes_no_template_but_answers_with_the_name_a_real_create_uses():
    kube = FakeKube()
    svc = service(kube)
    dry = await post(svc, review(dry_run=True))
    assert dry["allowed"] is True
    assert kube.calls == [] and kube.templates == set()
    real = await post(svc, review())
    assert real["allowed"] is True and patch_of(real) == patch_of(dry)
    [(ns, name)] = kube.templates
    assert ns == "ns" and name in json.dumps(patch_of(dry))


async def test_a_dry_run_flag_of_the_wrong_type_is_a_bad_request():
    kube = FakeKube()
    r = await post(service(kube), review(dry_run="true"))
    assert r["allowed"] is False and r["status"]["code"] == 400 and "dryRun" in r["status"]["message"]
    assert kube.calls == []


async def test_no_template_is_created_in_a_namespace_that_does_not_exist_or_is_terminating():
    kube = FakeKube()
    svc = service(kube)
    r = await post(svc, review("ghost"))
    assert r["allowed"] is False and "namespace 'ghost'" in r["status"]["message"]
    assert r["status"]["code"] == 404
    kube.namespaces["ns"]["status"]["phase"] = "Terminating"
    r = await post(svc, review("ns"))
    assert r["allowed"] is False and "terminating" in r["status"]["message"]
    assert kube.templates == set()
    assert all(method == "GET" for method, _ in kube.calls)


async def test_template_creation_per_namespace_is_bounded_and_a_known_shape_still_passes():
    kube = FakeKube()
    svc = service(kube)
    svc.template_budget = TemplateBudget(burst=3, per_s=1e-9, total_burst=100, total_per_s=1e-9)
    answers = [await post(svc, review(gpumem=1000 + i)) for i in range(6)]
    assert [a["allowed"] for a in answers] == [True] * 3 + [False] * 3
    assert answers[-1]["status"]["code"] == 429
    assert "ResourceClaimTemplates" in answers[-1]["status"]["message"]
    assert len(kube.templates) == 3
    # a shape whose template was created before still passes, with no budget left
    svc.known_templates = type(svc.known_templates)()  # its short-lived cache has expired
    assert (await post(svc, review(gpumem=1000)))["allowed"] is True
    # other namespaces have budgets of their own
    assert (await post(svc, review("t", gpumem=5000)))["allowed"] is True


async def test_the_total_over_all_namespaces_is_bounded_too():
    kube = FakeKube(namespaces=[f"n{i}" for i in range(5)])
    svc = service(kube)
    svc.template_budget = TemplateBudget(burst=10, per_s=1e-9, total_burst=2, total_per_s=1e-9)
    answers = [await post(svc, review(f"n{i}")) for i in range(5)]
    assert [a["allowed"] for a in answers] == [True, True, False, False, False]
    assert len(kube.templates) == 2


def test_the_budget_refills_and_gives_back_what_created_nothing():
    b = TemplateBudget(burst=2, per_s=0.5, total_burst=100, total_per_s=100)
    assert b.take("ns", 0.0) and b.take("ns", 0.0) and not b.take("ns", 0.0)
    b.give_back("ns", 0.0)  # a 409: nothing was created
    assert b.take("ns", 0.0) and not b.take("ns", 0.0)
    assert b.take("ns", 2.0) and not b.take("ns", 2.0)  # one token every 2 s
    assert b.take("other", 2.0)
    with pytest.raises(ValueError):
        TemplateBudget(burst=0)


def test_the_budget_remembers_a_bounded_number_of_namespaces():
    b = TemplateBudget(burst=1, per_s=1e-9, total_burst=10**6, total_per_s=1, max_namespaces=4)
    for i in range(100):
        b.take(f"n{i}", float(i))
    assert len(b) <= 4


@pytest.mark.parametrize(
    "error",
    [
        OSError("connection reset by peer"),
        asyncio.TimeoutError(),
        aiohttp.ClientConnectionError("refused"),
        KubeError("GET", "/api/v1/namespaces/t", 500, '{"message": "etcd"}'),
    ],
    ids=["oserror", "timeout", "clienterror", "kubeerror"],
)
@pytest.mark.parametrize("front_end, env", [("extender", DISABLE), ("dra", ())])
async def test_a_failed_namespace_read_is_a_denial_naming_it(error, front_end, env):
    kube = FakeKube(get_error=error)
    r = await post(service(kube, front_end), review("t", env=env))
    assert r["allowed"] is False
    assert "namespace 't'" in r["status"]["message"] and "cannot read" in r["status"]["message"]
    assert kube.templates == set()


async def test_a_namespace_read_that_hangs_is_cut_short(monkeypatch):
    monkeypatch.setattr(S, "NAMESPACE_READ_TIMEOUT", 0.05)
    kube = FakeKube(hang=True)
    r = await asyncio.wait_for(post(service(kube, "extender"), review("t", env=DISABLE)), 5)
    assert r["allowed"] is False and "namespace 't'" in r["status"]["message"]
    assert "0.05" in r["status"]["message"]


def test_the_namespace_read_is_bounded_well_under_the_webhooks_timeout():
    assert S.NAMESPACE_READ_TIMEOUT + S.TEMPLATE_POST_TIMEOUT < 10  # the chart's timeoutSeconds


@pytest.mark.parametrize("error", [OSError("reset"), aiohttp.ClientConnectionError("refused"), asyncio.TimeoutError()])
async def test_a_template_post_that_fails_in_transport_is_a_denial_not_a_500(error):
    kube = FakeKube(post_error=error)
    svc = service(kube)
    r = await post(svc, review())
    assert r["allowed"] is False and "ResourceClaimTemplate ns/" in r["status"]["message"]
    assert r["status"]["code"] == 500 and kube.templates == set()
