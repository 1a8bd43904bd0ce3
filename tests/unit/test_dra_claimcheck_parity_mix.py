"""The webhook's check of a ResourceClaim (or template) at creation and the agent's refusals at
prepare agree beyond a ``GpuConfig``'s own fields (:mod:`hami.dra.gpuconfig`).

Found by an adversarial review:

- an entry of ``gpu.hami.io`` naming only a request whose own selectors keep it off this
  driver's devices (``device.driver == "nic.example.com"``) was checked, and the claim refused,
  though the agent never reads it (it reads an entry only for its own results);
- a claim whose requests alone make prepare refuse it (admin access beside ordinary shares, a
  MIG device beside a GPU share, the share class beside the whole-GPU class, admin access to a
  MIG device) was admitted: its pod was scheduled, then stuck in ContainerCreating.

Each refusal is checked against :func:`hami.draplugin.prepare.plan` on the claim once allocated
(one result per request, in the requests' order, as kube-scheduler writes them).
"""

from __future__ import annotations

import itertools
import re

import pytest

from hami.dra.gpuconfig import class_configs, claim_spec_error
from hami.dra.model import (
    CONFIG_API_VERSION,
    CONFIG_KIND,
    DRIVER,
    MIG_CLASS,
    SHARE_CLASS,
    WHOLE_CLASS,
    MigDevice,
    SliceSettings,
)
from hami.draplugin.prepare import PrepareError, plan
from hami.node.nvml import PhysicalGPU
from hami.vendors import build_vendors
from hami.webhook.admission import AdmissionSettings, review

S = AdmissionSettings(build_vendors(), front_end="dra")
FULL_MIB = 15360
# GPU 1 is in MIG mode: its one MIG device is what the MIG class is given
GPUS = [
    PhysicalGPU(0, "GPU-0", "Tesla T4", FULL_MIB, "0000:01:00.0", 0),
    PhysicalGPU(1, "GPU-1", "A100-SXM4-40GB", 40960, "0000:02:00.0", 0),
]
MIG = MigDevice("gpu-1-mig-1g-5gb-0", "GPU-1", 1, "1g.5gb", 0, 1, 4864, 14, mig_uuid="MIG-1")
SETTINGS = SliceSettings(split_count=4)
OTHER = "nic.example.com"
PINNED = [{"cel": {"expression": f'device.driver == "{OTHER}"'}}]


def gpu_config(requests=None, **params) -> dict:
    entry: dict = {
        "opaque": {"driver": DRIVER, "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, **params}}
    }
    if requests is not None:
        entry["requests"] = requests
    return entry


def exactly(name: str, cls: str, **extra) -> dict:
    return {"name": name, "exactly": {"deviceClassName": cls, **extra}}


def answer(requests: list, config: list, kind: str = "ResourceClaim") -> dict:
    claim_spec = {"devices": {"requests": requests, "config": config}}
    obj = {"metadata": {"name": "c"}, "spec": claim_spec if kind == "ResourceClaim" else {"spec": claim_spec}}
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "operation": "CREATE",
            "namespace": "team",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "object": obj,
        },
    }
    return review(body, S)["response"]


def allocated(taken: list[tuple[str, str, bool]], config: list) -> dict:
    """The claim once allocated: ``(request or request/sub, class, admin access)`` per result,
    in order; each result of this driver's classes carries its class's configuration scoped to
    its request (as kube-scheduler records it), a result of another class is another driver's."""
    results, class_config = [], []
    for request, cls, admin in taken:
        if cls not in class_configs():
            results.append({"request": request, "driver": OTHER, "pool": "n1", "device": "nic-0"})
            continue
        class_config += [{**e, "requests": [request]} for e in class_configs()[cls]]
        if cls == MIG_CLASS:
            r = {"request": request, "driver": DRIVER, "pool": "n1", "device": MIG.name}
        else:
            memory = FULL_MIB if cls == WHOLE_CLASS else 1000
            r = {
                "request": request,
                "driver": DRIVER,
                "pool": "n1",
                "device": "gpu-0",
                "consumedCapacity": {"memory": f"{memory}Mi", "cores": "10", "shares": "1"},
            }
        if admin:
            r["adminAccess"] = True
        results.append(r)
    return {
        "metadata": {"namespace": "team", "name": "c", "uid": "u1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": results,
                    "config": class_config + [{"source": "FromClaim", **c} for c in config],
                }
            }
        },
    }


def agent(taken: list[tuple[str, str, bool]], config: list) -> str:
    """What the agent says of the allocated claim ("" when it prepares it)."""
    try:
        plan(allocated(taken, config), "n1", GPUS, SETTINGS, {MIG.name: MIG})
    except PrepareError as exc:
        return str(exc)
    return ""


def words(message: str) -> str:
    """A refusal's rule, without where it was found: the webhook names requests where the agent
    names results, each in parentheses or before the last ": "."""
    return re.sub(r" \([^()]*\)", "", message).rsplit(": ", 1)[-1]


# ------------------------------------------------------------------ entries the agent never reads


def test_an_entry_naming_only_a_request_kept_off_this_drivers_devices_is_not_checked():
    """Before: refused ("configuration parameter 'speed'=10 is not a GpuConfig field ...") though
    the agent, preparing the gpu request's result, never reads the entry."""
    requests = [exactly("gpu", SHARE_CLASS), exactly("nic", OTHER, selectors=PINNED)]
    config = [gpu_config(["nic"], speed=10)]
    for kind in ("ResourceClaim", "ResourceClaimTemplate"):
        assert answer(requests, config, kind)["allowed"] is True
    assert agent([("gpu", SHARE_CLASS, False), ("nic", OTHER, False)], config) == ""
    # the same, pinned by excluding this driver, or as the first operand of &&
    for expression in (f'device.driver != "{DRIVER}"', f"device.driver == '{OTHER}' && device.attributes[\"x\"].y"):
        pinned = exactly("nic", OTHER, selectors=[{"cel": {"expression": expression}}])
        assert claim_spec_error({"devices": {"requests": [requests[0], pinned], "config": config}}) == ""
    # nothing of the claim reaches this driver: an entry naming no request is not read either
    assert claim_spec_error({"devices": {"requests": [requests[1]], "config": [gpu_config(speed=10)]}}) == ""


@pytest.mark.parametrize(
    "nic, names",
    [
        # a class not known here may be an administrator's selecting this driver's devices
        (exactly("nic", OTHER), ["nic"]),
        # a selector that does not keep it off them (|| and ?: are not read as conjunctions)
        (exactly("nic", OTHER, selectors=[{"cel": {"expression": f'device.driver == "{OTHER}" || true'}}]), ["nic"]),
        (exactly("nic", OTHER, selectors=[{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]), ["nic"]),
        (
            exactly("nic", OTHER, selectors=[{"cel": {"expression": f'device.driver == "{OTHER}" ? false : true'}}]),
            ["nic"],
        ),
        # the entry also names a request of this driver, or every request
        (exactly("nic", OTHER, selectors=PINNED), ["nic", "gpu"]),
        (exactly("nic", OTHER, selectors=PINNED), None),
        # a request of this driver's class is read whatever its selectors say
        (exactly("nic", SHARE_CLASS, selectors=PINNED), ["nic"]),
    ],
)
def test_an_entry_the_agent_may_read_is_still_checked(nic, names):
    config = [gpu_config(names, speed=10)]
    got = answer([exactly("gpu", SHARE_CLASS), nic], config)
    assert got["allowed"] is False
    assert "configuration parameter 'speed'=10 is not a GpuConfig field" in got["status"]["message"]
    # the agent refuses it once a request it names is given this driver's device
    taken = [("gpu", SHARE_CLASS, False), ("nic", SHARE_CLASS, False)]
    assert "configuration parameter 'speed'=10 is not a GpuConfig field this agent knows" in agent(taken, config)


# ------------------------------------------------------------------ results that mix

KINDS = [(c, admin) for admin in (False, True) for c in (SHARE_CLASS, WHOLE_CLASS, MIG_CLASS)]


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
@pytest.mark.parametrize("first, second", list(itertools.product(KINDS, KINDS)))
def test_requests_that_decide_a_mix_are_refused_as_the_agent_refuses_them(kind, first, second):
    """Every pair of this driver's classes, with and without admin access, in both orders: the
    webhook refuses exactly what the agent refuses, with the agent's words (before: every pair
    was admitted, 29 of the 36 then refused at prepare)."""
    (c1, a1), (c2, a2) = first, second
    requests = [exactly("a", c1, **({"adminAccess": True} if a1 else {}))]
    requests.append(exactly("b", c2, **({"adminAccess": True} if a2 else {})))
    got = answer(requests, [], kind)
    said = agent([("a", c1, a1), ("b", c2, a2)], [])
    assert got["allowed"] is (said == ""), (got, said)
    if said:
        assert got["status"]["code"] == 400
        assert words(got["status"]["message"]) == words(said), (got["status"]["message"], said)


def test_the_mix_refusals_name_the_requests_and_say_what_to_do():
    def refusal(*requests) -> str:
        return claim_spec_error({"devices": {"requests": list(requests)}})

    assert refusal(exactly("train", SHARE_CLASS), exactly("infer", MIG_CLASS)) == (
        "results mix MIG devices and GPU shares (requests 'train' and 'infer'); use one claim for each"
    )
    assert refusal(exactly("watch", SHARE_CLASS, adminAccess=True), exactly("work", SHARE_CLASS)) == (
        "results mix admin access and ordinary shares (requests 'watch' and 'work'); use one claim for each"
    )
    assert refusal(exactly("a", SHARE_CLASS), exactly("b", WHOLE_CLASS)) == (
        "requests mix isolation 'hami-core' and 'none' (requests 'a' and 'b'); use one class per claim"
    )
    assert refusal(exactly("m", MIG_CLASS, adminAccess=True)) == (
        "request 'm': a MIG device cannot be given with admin access"
    )
    assert agent([("m", MIG_CLASS, True)], []).endswith("a MIG device cannot be given with admin access")


def test_the_claims_configuration_decides_the_isolation_as_at_prepare():
    """A whole-GPU request given isolation hami-core by the claim runs with libvgpu, as a share:
    no mix. Isolation none on a share request makes one."""
    requests = [exactly("a", SHARE_CLASS), exactly("b", WHOLE_CLASS)]
    same = [gpu_config(["b"], isolation="hami-core")]
    assert answer(requests, same)["allowed"] is True
    assert agent([("a", SHARE_CLASS, False), ("b", WHOLE_CLASS, False)], same) == ""
    both_none = [gpu_config(["a"], isolation="none")]
    assert answer(requests, both_none)["allowed"] is True
    taken = [("a", SHARE_CLASS, False), ("b", WHOLE_CLASS, False)]
    # the share request then must have consumed the whole GPU, as the whole class's does
    alloc = allocated(taken, both_none)
    alloc["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"] = f"{FULL_MIB}Mi"
    assert plan(alloc, "n1", GPUS, SETTINGS).isolation == "none"
    split = [gpu_config(["b"], isolation="hami-core"), gpu_config(["a"], isolation="none")]
    got = answer(requests, split)
    assert got["allowed"] is False and "requests mix isolation 'none' and 'hami-core'" in got["status"]["message"]


def test_a_mix_that_depends_on_the_allocation_is_left_to_prepare():
    """firstAvailable: which subrequest kube-scheduler takes decides; a class not known here may
    be another driver's (no result of this driver at all)."""
    either = {
        "name": "b",
        "firstAvailable": [
            {"name": "share", "deviceClassName": SHARE_CLASS},
            {"name": "mig", "deviceClassName": MIG_CLASS},
        ],
    }
    assert answer([exactly("a", SHARE_CLASS), either], [])["allowed"] is True
    assert agent([("a", SHARE_CLASS, False), ("b/share", SHARE_CLASS, False)], []) == ""
    assert "results mix MIG devices and GPU shares" in agent(
        [("a", SHARE_CLASS, False), ("b/mig", MIG_CLASS, False)], []
    )
    # every subrequest of one kind: decided
    migs = {
        **either,
        "firstAvailable": [{"name": "x", "deviceClassName": MIG_CLASS}, {"name": "y", "deviceClassName": MIG_CLASS}],
    }
    got = answer([exactly("a", SHARE_CLASS), migs], [])
    assert got["allowed"] is False and "results mix MIG devices and GPU shares" in got["status"]["message"]
    # admin access on another driver's request beside a share: nothing of this driver is mixed
    assert answer([exactly("a", SHARE_CLASS), exactly("nic", OTHER, adminAccess=True)], [])["allowed"] is True
    assert agent([("a", SHARE_CLASS, False), ("nic", OTHER, True)], []) == ""
