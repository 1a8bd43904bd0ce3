"""A user-written ResourceClaim or ResourceClaimTemplate whose ``GpuConfig`` the node agent
refuses at prepare is refused by the webhook at creation, by the same rules
(:mod:`hami.dra.gpuconfig`, used by both).

Found by an adversarial review: the agent became strict about a ``GpuConfig`` (an unknown field,
a priority out of 0..1000 or not an integer, an isolation other than hami-core/none, a priority on
a class without libvgpu), but the webhook admitted such a claim (``allowed: True`` for
``priority: 5000``, ``priorty: 0``, ``isolation: off``, ``priority: "0"``, a priority on the
whole-GPU or MIG class): its pod was scheduled, then never started, with a kubelet event the user
had to dig for.
"""

from __future__ import annotations

import itertools

import pytest

from hami.dra.model import CONFIG_API_VERSION, CONFIG_KIND, DRIVER, MIG_CLASS, SHARE_CLASS, WHOLE_CLASS, SliceSettings
from hami.draplugin.prepare import PrepareError, plan
from hami.node.nvml import PhysicalGPU
from hami.vendors import build_vendors
from hami.webhook.admission import AdmissionSettings, decide, review

S = AdmissionSettings(build_vendors(), front_end="dra")
GPUS = [PhysicalGPU(0, "GPU-0", "Tesla T4", 15360, "0000:01:00.0", 0)]
SETTINGS = SliceSettings(split_count=4)


def config(requests=None, driver=DRIVER, api=CONFIG_API_VERSION, **params) -> dict:
    entry: dict = {"opaque": {"driver": driver, "parameters": {"apiVersion": api, "kind": CONFIG_KIND, **params}}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def exactly(name="gpu", cls=SHARE_CLASS, **extra) -> dict:
    return {"name": name, "exactly": {"deviceClassName": cls, **extra}}


def spec(*configs, requests=None) -> dict:
    return {"devices": {"requests": requests or [exactly()], "config": list(configs)}}


def review_body(obj: dict, kind: str = "ResourceClaim") -> dict:
    """The API server's AdmissionReview of creating ``obj`` (a claim or template) in ``team``."""
    return {
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


def answer(obj_spec: dict, kind: str = "ResourceClaim") -> dict:
    obj = {"metadata": {"name": "c"}, "spec": obj_spec if kind == "ResourceClaim" else {"spec": obj_spec}}
    return review(review_body(obj, kind), S)["response"]


BAD = [
    ({"priority": 5000}, "configuration priority=5000 must be an integer in 0..1000 (0 high, 1 low)"),
    ({"priority": -1}, "configuration priority=-1 must be an integer in 0..1000"),
    ({"priority": "0"}, "configuration priority='0' must be an integer"),
    ({"priority": 1.0}, "configuration priority=1.0 must be an integer"),
    ({"priority": True}, "configuration priority=True must be an integer"),
    ({"priorty": 0}, "configuration parameter 'priorty'=0 is not a GpuConfig field"),
    ({"isolation": "off"}, "configuration isolation='off' is not one of hami-core, none"),
]


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
@pytest.mark.parametrize("params, message", BAD)
def test_a_config_the_agent_refuses_is_refused_at_creation_naming_the_field_and_value(kind, params, message):
    got = answer(spec(config(requests=["gpu"], **params)), kind)
    assert got["allowed"] is False and got["status"]["code"] == 400 and got["status"]["reason"] == "BadRequest"
    where = "spec.devices.config[0]" if kind == "ResourceClaim" else "spec.spec.devices.config[0]"
    assert got["status"]["message"].startswith(f"{kind} team/c: {where}.opaque.parameters: "), got
    assert message in got["status"]["message"]


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
@pytest.mark.parametrize(
    "request_, without",
    [
        (exactly(cls=WHOLE_CLASS), "isolation none"),
        (exactly(cls=MIG_CLASS), "a MIG device"),
        (exactly(adminAccess=True), "admin access"),
    ],
)
def test_a_priority_where_no_libvgpu_runs_is_refused_at_creation(kind, request_, without):
    got = answer(spec(config(priority=0), requests=[request_]), kind)
    assert got["allowed"] is False and got["status"]["code"] == 400
    assert (
        f"request 'gpu': configuration priority=0 needs libvgpu (isolation hami-core), and {without} runs "
        "without it; remove the priority"
    ) in got["status"]["message"]


def test_another_drivers_config_is_not_looked_at():
    other = config(driver="gpu.example.com", api="example.com/v9", priority="high", anything={"x": 1})
    assert answer(spec(other, config(priority=0)))["allowed"] is True


@pytest.mark.parametrize(
    "obj_spec",
    [
        spec(config(priority=0)),
        spec(config(isolation="hami-core", priority=1000)),
        spec(config(priority=None)),  # null is absent, as at prepare
        spec(),  # no configuration at all
        # the claim's isolation wins over the whole-GPU class's: libvgpu runs, so the priority is honoured
        spec(config(isolation="hami-core", priority=0), requests=[exactly(cls=WHOLE_CLASS)]),
        # firstAvailable: the priority names only the share subrequest
        spec(
            config(requests=["gpu/share"], priority=0),
            requests=[
                {
                    "name": "gpu",
                    "firstAvailable": [
                        {"name": "share", "deviceClassName": SHARE_CLASS},
                        {"name": "whole", "deviceClassName": WHOLE_CLASS},
                    ],
                }
            ],
        ),
        # a class of the administrator's: its configuration is not known here, so only the entry is checked
        spec(config(priority=0), requests=[exactly(cls="my-gpus.example.com")]),
    ],
)
def test_what_the_agent_takes_is_admitted(obj_spec):
    assert answer(obj_spec)["allowed"] is True
    assert answer(obj_spec, "ResourceClaimTemplate")["allowed"] is True


def test_a_priority_on_a_first_available_alternative_without_libvgpu_is_refused():
    alternatives = [
        {"name": "share", "deviceClassName": SHARE_CLASS},
        {"name": "whole", "deviceClassName": WHOLE_CLASS},
    ]
    got = answer(spec(config(requests=["gpu"], priority=0), requests=[{"name": "gpu", "firstAvailable": alternatives}]))
    assert got["allowed"] is False
    assert "request 'gpu/whole': configuration priority=0 needs libvgpu" in got["status"]["message"]


def test_requests_at_two_priorities_are_refused_only_when_certain():
    two = [exactly("a"), exactly("b")]
    got = answer(spec(config(requests=["a"], priority=0), requests=two))
    assert got["allowed"] is False
    assert (
        "requests mix priority 0 and 1 (one CDI device, one CUDA_TASK_PRIORITY per claim)" in got["status"]["message"]
    )
    # both at one priority, explicitly or by default
    assert answer(spec(config(priority=0), requests=two))["allowed"] is True
    assert answer(spec(config(requests=["a"], priority=1), requests=two))["allowed"] is True
    # which subrequest is taken decides: the agent may well take it
    maybe = [
        exactly("a"),
        {
            "name": "b",
            "firstAvailable": [
                {"name": "x", "deviceClassName": SHARE_CLASS},
                {"name": "y", "deviceClassName": SHARE_CLASS},
            ],
        },
    ]
    assert answer(spec(config(requests=["a", "b/x"], priority=0), requests=maybe))["allowed"] is True


def test_a_translated_pods_templates_pass_the_template_check():
    """The webhook's own templates (a pod's nvidia.com/priority in a GpuConfig) are admitted when
    the chart sends ResourceClaimTemplates to the webhook."""
    pod = {
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/priority": 0}},
                }
            ]
        },
    }
    d = decide(pod, S)
    assert d.allowed and d.templates
    for t in d.templates:
        assert answer(t["spec"]["spec"], "ResourceClaimTemplate")["allowed"] is True


# ---------------------------------------------------------------- one rule, two places


def _allocated(cls: str, claim_config: list[dict], admin: bool = False) -> dict:
    """The claim as the agent reads it once kube-scheduler allocated it from ``cls``."""
    class_config = [{"source": "FromClass", **c} for c in (config(isolation="none"),) if cls == WHOLE_CLASS]
    class_config += [{"source": "FromClass", **config(isolation="hami-core")}] if cls == SHARE_CLASS else []
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "n1",
        "device": "gpu-0",
        "consumedCapacity": {"memory": str(15360 * 1024 * 1024), "cores": "10", "shares": "1"},
    }
    if admin:
        result["adminAccess"] = True
    return {
        "metadata": {"namespace": "team", "name": "c", "uid": "u1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [result],
                    "config": class_config + [{"source": "FromClaim", **c} for c in claim_config],
                }
            }
        },
    }


PARAMS = [
    {},
    {"priority": 0},
    {"priority": 1000},
    {"priority": 1001},
    {"priority": "1"},
    {"isolation": "none"},
    {"isolation": "hami-core"},
    {"isolation": "None"},
    {"isolation": "none", "priority": 3},
    {"isolation": "hami-core", "priority": 3},
    {"prio": 1},
]


@pytest.mark.parametrize(
    "cls, admin, first, second",
    [
        (c, a, f, s)
        for c, a in ((SHARE_CLASS, False), (WHOLE_CLASS, False), (SHARE_CLASS, True))
        for f, s in itertools.product(PARAMS, PARAMS[:6])
    ],
)
def test_the_webhook_refuses_exactly_what_the_agent_refuses(cls, admin, first, second):
    """Version skew: a claim the webhook refuses is one every agent of this version refuses at
    prepare, with the same words, and one it admits is one such an agent prepares."""
    entries = [config(requests=["gpu"], **first), config(**second)]
    extra = {"adminAccess": True} if admin else {}
    got = answer(spec(*entries, requests=[exactly(cls=cls, **extra)]))
    try:
        plan(_allocated(cls, entries, admin), "n1", GPUS, SETTINGS)
        agent = ""
    except PrepareError as exc:
        agent = str(exc)
    assert got["allowed"] is (agent == ""), (got, agent)
    if agent:
        # the webhook speaks for the agents where the agent speaks for itself
        said = got["status"]["message"].replace("a node agent of this version knows", "this agent knows")
        assert agent.partition("configuration")[2] == said.partition("configuration")[2]


def test_a_huge_body_is_refused_before_the_requests_by_entries_walk():
    """Anyone reaching the port may send a claim; the check is requests x entries (3000 of each,
    a 280 kB body, took 19 s of the event loop while it ran before the bound)."""
    many = [exactly(f"r{i}") for i in range(3000)]
    got = answer(spec(*[{"opaque": {"driver": "x"}}] * 3000, requests=many))
    assert got["allowed"] is False
    assert got["status"]["message"] == (
        "ResourceClaim team/c: spec.devices.requests: 3000 entries, more than the API server takes"
    )
    # the API server's own limits pass
    assert answer(spec(*[config(priority=0)] * 32, requests=[exactly(f"r{i}") for i in range(32)]))["allowed"]


@pytest.mark.parametrize("junk", [5, "x", None, {"a": 1}, [1, None, {"name": 3}]])
def test_a_body_of_the_wrong_shape_is_not_a_crash(junk):
    ours = {"devices": {"requests": [exactly()], "config": [{"opaque": {"driver": DRIVER, "parameters": junk}}]}}
    got = answer(ours)  # not a GpuConfig: the agent refuses it
    assert got["allowed"] is False and "configuration parameters must be" in got["status"]["message"]
    for obj_spec in (
        {"devices": {"requests": junk, "config": junk}},
        {"devices": {"requests": [{"name": "gpu", "firstAvailable": junk}, {"exactly": junk}]}},
        {"devices": junk},
        junk,
    ):
        assert answer(obj_spec)["uid"] == "u1"  # an answer, not an exception


def test_a_priority_that_does_not_select_an_agent_honouring_it_is_warned_of():
    """An agent that predates ``priority`` ignored it: a hand-written claim that does not select
    ``taskPriority`` may run at the default priority on such a node. Admitted (every agent of this
    version honours it), with a warning naming the request; the webhook's own claims select it."""
    got = answer(spec(config(priority=0)))
    assert got["allowed"] is True
    assert got["warnings"] == ["hami: priority without a taskPriority selector (older agents ignore it): gpu"]
    assert all(len(w) < 120 for w in got["warnings"])
    selected = exactly(selectors=[{"cel": {"expression": '"taskPriority" in device.attributes["gpu.hami.io"]'}}])
    assert "warnings" not in answer(spec(config(priority=0), requests=[selected]))
    assert "warnings" not in answer(spec())  # no priority, nothing to honour
    pod = {
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/priority": 0}}}]
        },
    }
    [t] = decide(pod, S).templates
    assert "warnings" not in answer(t["spec"]["spec"], "ResourceClaimTemplate")
