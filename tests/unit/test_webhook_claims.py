"""The webhook's check of ResourceClaims against the namespace GPU quota (DRA driver gpu.hami.io).

Found by an adversarial review (29 Nov): a pod naming a claim of its own asks for no extended
resource, so the pod's quota check never saw it, and kube-scheduler allocates a claim without
looking at the quota: a namespace with `limits.nvidia.com/gpumem: 1000` held a 140000 MiB claim.
"""

from __future__ import annotations

import pytest

from hami.core.fit import QuotaRoom
from hami.dra.claims import ClaimAsk, claim_ask, class_sizes
from hami.vendors import build_vendors
from hami.webhook.admission import AdmissionSettings, review

S = AdmissionSettings(build_vendors())


def claim(*requests: dict, name: str = "mine") -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": list(requests)}},
    }


def exactly(cls: str = "gpu.hami.io", count: int | None = None, memory: str | None = None, cores=None, **extra):
    sub: dict = {"deviceClassName": cls, **extra}
    if count is not None:
        sub["count"] = count
    reqs = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    if reqs:
        sub["capacity"] = {"requests": reqs}
    return {"name": "gpu", "exactly": sub}


def answer(obj: dict, room, operation: str = "CREATE") -> dict:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "operation": operation,
            "namespace": "team",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "object": obj,
        },
    }
    return review(body, S, quota_room=room)["response"]


def room(mem=None, cores=None):
    return lambda ns, vendors: QuotaRoom({"NVIDIA": (mem, cores)}) if ns == "team" else None


@pytest.mark.parametrize(
    "spec, want",
    [
        (exactly(memory="140000Mi", cores="10"), ClaimAsk(140000, 10)),
        (exactly(count=2, memory="3000Mi", cores=30), ClaimAsk(6000, 60)),
        (exactly(memory="1Gi"), ClaimAsk(1024, 0)),  # no cores: the slice's default (defaultCores, 0)
        (exactly(memory="1500000000"), ClaimAsk(1431, 0)),  # bytes, rounded up to MiB
        # no memory amount and no device published: no size to count (sizeless names it)
        (exactly("whole-gpu.hami.io", count=2), ClaimAsk(0, 200, None, "spec.devices.requests[gpu].exactly")),
        (exactly("mig.gpu.hami.io"), ClaimAsk(0, 0, None, "spec.devices.requests[gpu].exactly")),
        (exactly(allocationMode="All"), ClaimAsk(0, 0, "spec.devices.requests[gpu].exactly.allocationMode=All")),
        (exactly(memory="1Gi", adminAccess=True), None),
        (exactly("example.com/fpga", memory="1Gi"), None),
        (
            {
                "name": "either",
                "firstAvailable": [
                    {
                        "name": "big",
                        "deviceClassName": "gpu.hami.io",
                        "capacity": {"requests": {"memory": "8Gi", "cores": "20"}},
                    },
                    {
                        "name": "two",
                        "deviceClassName": "gpu.hami.io",
                        "count": 2,
                        "capacity": {"requests": {"memory": "1Gi", "cores": "30"}},
                    },
                ],
            },
            ClaimAsk(8192, 60),  # each amount at its largest alternative
        ),
    ],
)
def test_what_a_claim_asks(spec, want):
    assert claim_ask(claim(spec)) == want


SIZES = {"gpu.hami.io": 81559, "whole-gpu.hami.io": 81559, "mig.gpu.hami.io": 40192}


@pytest.mark.parametrize(
    "spec, want",
    [
        (exactly("whole-gpu.hami.io", count=2), ClaimAsk(2 * 81559, 200)),
        (exactly(count=3), ClaimAsk(3 * 81559, 0)),  # a share without an amount takes all the memory
        (exactly(count=3, memory="1Gi"), ClaimAsk(3 * 1024, 0)),  # an amount is counted as asked
        (exactly("mig.gpu.hami.io", count=2), ClaimAsk(2 * 40192, 0)),
    ],
)
def test_a_request_without_a_memory_amount_counts_the_largest_published_device(spec, want):
    assert claim_ask(claim(spec), sizes=SIZES) == want


def test_class_sizes_are_the_largest_gpu_and_the_largest_mig_instance():
    gib = 1024 * 1024 * 1024
    devices = [
        {"parent": "", "total": {"memory": 80 * gib}},
        {"parent": "", "total": {"memory": 16 * gib + 1}},  # rounded up to whole MiB
        {"parent": "GPU-1", "total": {"memory": 10 * gib}},
    ]
    assert class_sizes(devices) == {"gpu.hami.io": 81920, "whole-gpu.hami.io": 81920, "mig.gpu.hami.io": 10240}
    assert class_sizes(devices[1:2]) == {"gpu.hami.io": 16385, "whole-gpu.hami.io": 16385}
    assert class_sizes([]) == {}


def sized_room(mem=None, cores=None, sizes=SIZES):
    return lambda ns, vendors: QuotaRoom({"NVIDIA": (mem, cores)}, claim_sizes=sizes) if ns == "team" else None


def test_a_claim_of_whole_devices_is_held_to_the_memory_quota_before_allocation():
    """Found by review (30 Nov): a claim without a memory amount counted 0 MiB until allocated,
    and nothing refused it after admission: under a memory quota alone, `count: 8` was admitted
    and allocated eight whole cards' memory."""
    resp = answer(claim(exactly("whole-gpu.hami.io", count=8)), sized_room(mem=100000))
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    assert resp["status"]["message"] == (
        "ResourceClaim team/mine: exceeding resource quota: nvidia.com/gpumem requests 652472, "
        "namespace team has 100000 left"
    )
    assert answer(claim(exactly("whole-gpu.hami.io", count=1)), sized_room(mem=100000))["allowed"] is True
    assert answer(claim(exactly(count=2)), sized_room(mem=100000))["allowed"] is False


def test_without_a_published_device_a_claim_without_an_amount_is_refused_only_under_a_memory_quota():
    resp = answer(claim(exactly("whole-gpu.hami.io")), sized_room(mem=100000, sizes={}))
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    assert resp["status"]["message"].startswith(
        "ResourceClaim team/mine: spec.devices.requests[gpu].exactly asks for a whole device's memory and no "
        "device of its class is published yet"
    )
    assert answer(claim(exactly("whole-gpu.hami.io")), sized_room(cores=100, sizes={}))["allowed"] is True
    assert answer(claim(exactly("whole-gpu.hami.io")), None)["allowed"] is True
    # a MIG size unknown while GPUs are known: still refused
    only_gpus = {"gpu.hami.io": 81559, "whole-gpu.hami.io": 81559}
    assert answer(claim(exactly("mig.gpu.hami.io")), sized_room(mem=100000, sizes=only_gpus))["allowed"] is False


def test_two_requests_add_up():
    assert claim_ask(
        claim(exactly(memory="1Gi", cores=10), {**exactly(memory="2Gi", cores=5), "name": "b"})
    ) == ClaimAsk(3072, 15)


def test_a_claim_over_the_quota_is_refused_naming_the_claim_and_the_room():
    resp = answer(claim(exactly(memory="140000Mi", cores="100")), room(mem=1000))
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    msg = resp["status"]["message"]
    assert (
        msg
        == "ResourceClaim team/mine: exceeding resource quota: nvidia.com/gpumem requests 140000, namespace team has 1000 left"
    )
    resp = answer(claim(exactly(memory="500Mi", cores="100")), room(mem=1000, cores=50))
    assert (
        not resp["allowed"]
        and "nvidia.com/gpucores requests 100, namespace team has 50 left" in resp["status"]["message"]
    )


def test_a_claim_within_the_quota_or_without_one_is_allowed_unchanged():
    for r in (room(mem=1000, cores=20), room(), None, lambda ns, vendors: None):
        resp = answer(claim(exactly(memory="1000Mi", cores="20")), r)
        assert resp["allowed"] is True and "patch" not in resp
    # another driver's claim is not ours to count
    assert answer(claim(exactly("example.com/fpga", memory="1Ti")), room(mem=1))["allowed"] is True


def test_an_unbounded_request_is_refused_only_under_a_quota():
    spec = exactly(allocationMode="All")
    resp = answer(claim(spec), room(cores=100))
    assert not resp["allowed"] and "allocationMode=All cannot be counted" in resp["status"]["message"]
    assert answer(claim(spec), None)["allowed"] is True


def test_a_bad_amount_is_a_400_naming_the_field():
    resp = answer(claim(exactly(memory="lots")), room(mem=1000))
    assert not resp["allowed"] and resp["status"]["code"] == 400
    assert "spec.devices.requests[gpu].exactly.capacity.requests.memory" in resp["status"]["message"]


def test_only_creation_is_checked():
    assert answer(claim(exactly(memory="140000Mi")), room(mem=1), operation="UPDATE")["allowed"] is True


async def test_claims_created_at_the_same_moment_cannot_pass_the_quota_together():
    """Each of three claims fits the room alone; admitted back to back (before any watch event),
    the third is refused: an admitted claim counts at once. A dry run counts nothing."""
    from aiohttp.test_utils import TestClient, TestServer

    from hami.scheduler.options import Options
    from hami.scheduler.server import SchedulerService

    svc = SchedulerService(Options(), None)
    svc.state.quota_handler.replace(
        [{"metadata": {"name": "q", "namespace": "team"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "8000"}}}]
    )

    def review_body(name: str, dry: bool = False) -> dict:
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"u-{name}",
                "operation": "CREATE",
                "namespace": "team",
                "dryRun": dry,
                "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
                "object": claim(exactly(memory="3000Mi"), name=name),
            },
        }

    async with TestClient(TestServer(svc.app())) as client:

        async def allowed(name: str, dry: bool = False) -> tuple[bool, str]:
            r = await client.post("/webhook", json=review_body(name, dry))
            response = (await r.json())["response"]
            return response["allowed"], (response.get("status") or {}).get("message", "")

        assert await allowed("dry", dry=True) == (True, "")
        assert await allowed("one") == (True, "")
        assert await allowed("two") == (True, "")
        ok, message = await allowed("three")
        assert not ok and "exceeding resource quota: nvidia.com/gpumem requests 3000, namespace team has 2000 left" in (
            message
        )


async def test_a_claim_review_naming_a_namespace_or_claim_no_api_server_could_is_refused_naming_it():
    """The names of a claim review are checked before anything is recorded for them (anyone who
    reaches the port can send one)."""
    from aiohttp.test_utils import TestClient, TestServer

    from hami.scheduler.options import Options
    from hami.scheduler.server import SchedulerService

    svc = SchedulerService(Options(), None)
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "operation": "CREATE",
            "namespace": "Not_A_Namespace",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "object": claim(exactly(memory="3000Mi")),
        },
    }
    async with TestClient(TestServer(svc.app())) as client:
        response = (await (await client.post("/webhook", json=body)).json())["response"]
        assert not response["allowed"] and "request.namespace" in response["status"]["message"]
        body["request"]["namespace"] = "team"
        body["request"]["object"] = claim(exactly(memory="3000Mi"), name="Bad_Name")
        response = (await (await client.post("/webhook", json=body)).json())["response"]
        assert not response["allowed"] and "is not a ResourceClaim name" in response["status"]["message"]
    assert not svc.state._admitted
