"""The webhook on the DRA front end: same admission rules, claims instead of the extender."""

import base64
import json

import pytest

from hami.webhook.admission import AdmissionSettings, deny_answer, review_with_templates
from hami.vendors.nvidia import NvidiaVendor

DRA = AdmissionSettings([NvidiaVendor()], front_end="dra")
EXT = AdmissionSettings([NvidiaVendor()])


def body(limits, annotations=None):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}]},
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "operation": "CREATE", "namespace": "ns", "kind": {"kind": "Pod"}, "object": pod},
    }


def patched(answer, original):
    import copy

    doc = copy.deepcopy(original)
    for op in json.loads(base64.b64decode(answer["response"]["patch"])):
        keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
        target = doc
        for k in keys[:-1]:
            target = target[int(k)] if isinstance(target, list) else target[k]
        last = keys[-1]
        if op["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        else:
            target[int(last) if isinstance(target, list) else last] = op["value"]
    return doc


def test_dra_front_end_patches_the_pod_to_a_claim_and_returns_the_template():
    b = body({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30})
    answer, templates = review_with_templates(b, DRA)
    assert answer["response"]["allowed"] is True
    [t] = templates
    assert t["metadata"]["namespace"] == "ns"
    pod = patched(answer, b["request"]["object"])
    assert pod["spec"]["resourceClaims"] == [{"name": "hami-gpu-0", "resourceClaimTemplateName": t["metadata"]["name"]}]
    assert pod["spec"]["containers"][0]["resources"] == {"claims": [{"name": "hami-gpu-0"}]}
    assert "schedulerName" not in pod["spec"]  # kube-scheduler itself places claims


def test_extender_front_end_is_unchanged():
    b = body({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000})
    answer, templates = review_with_templates(b, EXT)
    pod = patched(answer, b["request"]["object"])
    assert templates == () and pod["spec"]["schedulerName"] == "hami-scheduler" and "resourceClaims" not in pod["spec"]


def test_dra_front_end_keeps_the_security_rules_and_names_what_it_cannot_express():
    forged, t = review_with_templates(body({"nvidia.com/gpu": 1}, {"hami.io/vgpu-node": "n1"}), DRA)
    assert forged["response"]["allowed"] is True and len(t) == 1  # the key removed, the pod translated
    ops = json.loads(base64.b64decode(forged["response"]["patch"]))
    assert {"op": "remove", "path": "/metadata/annotations/hami.io~1vgpu-node"} in ops
    assert "hami.io/vgpu-node" in forged["response"]["warnings"][0]
    pct, t = review_with_templates(body({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 40}), DRA)
    assert pct["response"]["allowed"] is False and t == ()
    assert pct["response"]["status"]["code"] == 400
    assert "nvidia.com/gpumem-percentage=40" in pct["response"]["status"]["message"]


def test_a_pod_without_gpus_needs_no_template():
    answer, templates = review_with_templates(body({"cpu": "1"}), DRA)
    assert answer["response"]["allowed"] is True and templates == () and "patch" not in answer["response"]


def test_deny_answer_keeps_the_uid():
    answer, _ = review_with_templates(body({"nvidia.com/gpu": 1}), DRA)
    denied = deny_answer(answer, "cannot create ResourceClaimTemplate ns/x: HTTP 403")
    assert denied["response"] == {
        "uid": "u1",
        "allowed": False,
        "status": {
            "code": 500,
            "message": "cannot create ResourceClaimTemplate ns/x: HTTP 403",
            "reason": "InternalError",
        },
    }


def test_unknown_front_end_is_refused_by_name():
    with pytest.raises(ValueError, match="front_end.*'both'"):
        AdmissionSettings([NvidiaVendor()], front_end="both")


class _Kube:
    """Stands in for the API client of the webhook's server: records creates, answers with ``status``."""

    def __init__(self, statuses):
        self.statuses = list(statuses)
        self.calls = []

    async def request(self, method, path, query=(), body=None):
        from hami.kube.client import KubeError

        self.calls.append((method, path, list(query), body["metadata"]["name"]))
        status = self.statuses.pop(0)
        if status >= 300:
            raise KubeError(method, path, status, '{"message": "nope"}')
        return body

    async def get(self, path, **query):  # the namespace read before a create: it exists
        return {"metadata": {"name": path.rsplit("/", 1)[-1]}, "status": {"phase": "Active"}}


def _service(kube):
    """A SchedulerService stand-in with what its template creation reads."""
    from functools import partial
    from types import SimpleNamespace

    from hami.scheduler.server import SchedulerService
    from hami.webhook.templates import KnownTemplates, TemplateBudget

    me = SimpleNamespace(
        kube=kube,
        known_templates=KnownTemplates(),
        seen_templates=KnownTemplates(),
        template_budget=TemplateBudget(),
        _template_posts={},
    )
    me._post_template = partial(SchedulerService._post_template, me)
    me._read_namespace = partial(SchedulerService._read_namespace, me)
    me.create = partial(SchedulerService._create_templates, me)
    return me


async def _create(statuses, kube_present=True):
    _, templates = review_with_templates(body({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}), DRA)
    kube = _Kube(statuses) if kube_present else None
    return await _service(kube).create("ns", templates), kube, templates


async def test_a_template_created_or_found_is_not_posted_again_at_the_next_admission():
    _, templates = review_with_templates(body({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}), DRA)
    for first in (201, 409):
        kube = _Kube([first])
        me = _service(kube)
        assert await me.create("ns", templates) == ""
        assert await me.create("ns", templates) == ""
        assert len(kube.calls) == 1  # the second admission sent nothing
        kube.statuses = [409]
        assert await me.create("other-ns", templates) == ""  # another namespace: its own template
        assert [c[1] for c in kube.calls][-1].endswith("/namespaces/other-ns/resourceclaimtemplates")


async def test_a_failed_create_is_not_remembered_and_the_next_admission_tries_again():
    _, templates = review_with_templates(body({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}), DRA)
    kube = _Kube([403, 201])
    me = _service(kube)
    assert "403" in await me.create("ns", templates)
    assert await me.create("ns", templates) == ""
    assert len(kube.calls) == 2


async def test_admissions_needing_the_same_template_at_once_share_one_post():
    import asyncio

    _, templates = review_with_templates(body({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}), DRA)
    gate = asyncio.Event()

    class Slow(_Kube):
        async def request(self, *a, **kw):
            await gate.wait()
            return await super().request(*a, **kw)

    kube = Slow([201])
    me = _service(kube)
    waiting = [asyncio.ensure_future(me.create("ns", templates)) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*waiting) == [""] * 5
    assert len(kube.calls) == 1 and me._template_posts == {}


@pytest.mark.parametrize(
    "limits, annotations",
    [
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}, None),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 40}, None),
        ({"nvidia.com/gpu": 1}, {"hami.io/vgpu-node": "n1"}),
        ({"nvidia.com/gpu": ["1"]}, None),  # a wrong type: denied naming the field either way
    ],
)
def test_a_body_whose_tree_the_server_checked_gets_the_same_answer(limits, annotations):
    b = body(limits, annotations)
    assert review_with_templates(b, DRA, tree_checked=True) == review_with_templates(b, DRA)
    if limits.get("nvidia.com/gpu") == ["1"]:
        answer, _ = review_with_templates(b, DRA, tree_checked=True)
        assert answer["response"]["allowed"] is False
        assert "request.object.spec.containers[0].resources.limits" in answer["response"]["status"]["message"]
