"""Regression review of the webhook's GpuConfig check on ResourceClaims and templates
(:mod:`hami.dra.gpuconfig`, :func:`hami.webhook.admission.review_with_templates`).

Anyone who reaches the webhook's port can send an AdmissionReview (the API server does not
authenticate itself to webhooks), so a body the API server would never send must be answered,
never an exception (a 500 and a traceback), and must not hold the scheduler's event loop:

* the check resolved every subrequest over every configuration entry up to bounds "far above the
  API server's" (256 requests x 64 subrequests x 256 entries): such a body (1.6 MB) held the loop
  34 s, in which the extender answered no Filter or Bind;
* a selector whose ``cel`` is not an object, and a claim or template whose ``metadata`` is not an
  object, raised AttributeError.
"""

from __future__ import annotations

import pytest

from hami.dra import gpuconfig
from hami.dra.model import CONFIG_API_VERSION, CONFIG_KIND, DRIVER, SHARE_CLASS
from hami.vendors import build_vendors
from hami.webhook.admission import AdmissionSettings, review_with_templates

from .test_dra_claimcheck_admission import review_body

S = AdmissionSettings(build_vendors(), front_end="dra")
PRIORITY = {
    "opaque": {"driver": DRIVER, "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "priority": 0}}
}


def request(name: str, subs: int = 0, **extra) -> dict:
    if subs:
        return {
            "name": name,
            "firstAvailable": [{"name": f"s{j}", "deviceClassName": SHARE_CLASS} for j in range(subs)],
        }
    return {"name": name, "exactly": {"deviceClassName": SHARE_CLASS, **extra}}


def answer(obj: dict, kind: str = "ResourceClaim") -> dict:
    return review_with_templates(review_body(obj, kind), S, None, lambda ns, vendors: None)[0]["response"]


@pytest.mark.parametrize(
    "requests, configs, what, n",
    [
        ([request(f"r{i}") for i in range(33)], 1, "requests", 33),
        ([request("gpu", subs=9)], 1, "requests[].firstAvailable", 9),
        ([request("gpu")], 33, "config", 33),
    ],
)
def test_a_body_beyond_the_api_servers_limits_is_refused_without_the_walk(monkeypatch, requests, configs, what, n):
    walked = []
    real = gpuconfig.resolve
    monkeypatch.setattr(gpuconfig, "resolve", lambda *a, **k: walked.append(a[1]) or real(*a, **k))
    got = gpuconfig.claim_spec_error({"devices": {"requests": requests, "config": [PRIORITY] * configs}})
    assert got == f"spec.devices.{what}: {n} entries, more than the API server takes"
    assert walked == []  # refused before any request was resolved


def test_the_api_servers_own_limits_are_checked():
    # 32 requests of 8 subrequests, 32 entries: what a real claim may hold is walked and admitted
    spec = {"devices": {"requests": [request(f"r{i}", subs=8) for i in range(32)], "config": [PRIORITY] * 32}}
    assert gpuconfig.claim_spec_error(spec) == ""
    got = answer({"metadata": {"name": "c"}, "spec": spec})
    assert got["allowed"] is True and got["warnings"]  # the priority selects no taskPriority: warned


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
@pytest.mark.parametrize("cel", ["x", True, 5, ["expression"]])
def test_a_selector_that_is_not_an_object_is_answered(kind, cel):
    spec = {"devices": {"requests": [request("gpu", selectors=[{"cel": cel}])], "config": [PRIORITY]}}
    got = answer({"metadata": {"name": "c"}, "spec": spec if kind == "ResourceClaim" else {"spec": spec}}, kind)
    # names no taskPriority: admitted with the warning, as a selector that does not name it
    assert got["allowed"] is True
    assert got["warnings"] == ["hami: priority without a taskPriority selector (older agents ignore it): gpu"]


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
@pytest.mark.parametrize("meta", [[1], "x", 5])
def test_metadata_that_is_not_an_object_is_answered(kind, meta):
    bad = {**PRIORITY["opaque"]["parameters"], "priority": 5000}
    spec = {"devices": {"requests": [request("gpu")], "config": [{"opaque": {"driver": DRIVER, "parameters": bad}}]}}
    got = answer({"metadata": meta, "spec": spec if kind == "ResourceClaim" else {"spec": spec}}, kind)
    assert got["allowed"] is False
    assert got["status"]["message"].startswith(f"{kind} team/: ")
    assert "configuration priority=5000 must be an integer in 0..1000" in got["status"]["message"]
