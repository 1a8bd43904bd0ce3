"""Review of the task priority on the DRA path: init containers of several priorities, a new
webhook beside an agent that predates ``priority``, and a ``GpuConfig`` field the agent does not
know.

- Init containers asking different ``nvidia.com/priority`` values each ran at their own priority
  (no claim mixes two), but every one of them held a claim of its own for the pod's life, the
  app container's priority group included, and the webhook said nothing: 1 GPU asked, 3 claims
  held. The init containers of one priority now share a claim (joined to an app container of that
  priority), and a warning says that a claim per priority is held.
- An agent that predates ``priority`` read a ``GpuConfig`` leniently and ran a claim carrying one
  at libvgpu's default. Devices now publish ``taskPriority``; the webhook's claims with a priority
  select it, so such a pod waits for an upgraded node instead of running at the wrong priority.
- The agent dropped any unknown ``GpuConfig`` field (``priorty: 0``) the same way: it is now a
  PrepareError naming the field and its value.
"""

import pytest

from hami.core import SchedulerConfig
from hami.dra.cel import DeviceCel, compile_selector
from hami.dra.model import (
    CONFIG_API_VERSION,
    CONFIG_KIND,
    DRIVER,
    TASK_PRIORITY,
    WHOLE_CLASS,
    SliceSettings,
    resource_slice,
)
from hami.dra.translate import PRIORITY_SELECTOR
from hami.draplugin.prepare import PrepareError, plan
from hami.node.nvml import PhysicalGPU
from hami.sim.dra import simulate_dra
from hami.vendors import build_vendors
from hami.vendors.nvidia import NvidiaVendor
from hami.webhook.admission import AdmissionSettings, decide

NV = NvidiaVendor()
DRA = AdmissionSettings([NV], front_end="dra")
CFG = SchedulerConfig(build_vendors(), "binpack", "spread")
GPUS = [PhysicalGPU(i, f"GPU-{i}", "Tesla T4", 15360, f"0000:{i + 1:02x}:00.0", 0) for i in range(2)]


def ctr(name, priority=None, gpumem=1000):
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": gpumem}
    if priority is not None:
        limits["nvidia.com/priority"] = priority
    return {"name": name, "image": "x", "resources": {"limits": limits}}


def pod(*containers, init=(), name="p"):
    spec = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def claims_of(d):
    """container -> its claim's priority (None: no configuration, libvgpu's 1)."""
    by_template = {}
    for t in d.templates:
        config = t["spec"]["spec"]["devices"].get("config") or []
        by_template[t["metadata"]["name"]] = config[0]["opaque"]["parameters"]["priority"] if config else None
    by_claim = {c["name"]: by_template[c["resourceClaimTemplateName"]] for c in d.pod["spec"]["resourceClaims"]}
    spec = d.pod["spec"]
    return {
        c["name"]: [by_claim[r["name"]] for r in c["resources"]["claims"]]
        for c in [*spec.get("initContainers", []), *spec["containers"]]
    }


def test_init_containers_of_two_priorities_share_claims_by_priority_and_are_warned_of():
    d = decide(pod(ctr("app", 0), init=[ctr("a", 0), ctr("b", 1)]), DRA)
    assert d.allowed
    # each container at its own priority, as on the extender; 'a' shares the app's claim
    assert claims_of(d) == {"a": [0], "b": [1], "app": [0]}
    assert len(d.pod["spec"]["resourceClaims"]) == 2  # was 3: every init container held its own
    (note,) = d.warnings
    assert note == "hami: a claim per init priority, held for the pod's life: 'a'=0, 'b'=1"
    # no priority is libvgpu's 1: 'b' shares the claim of the app that asks for none
    d = decide(pod(ctr("app"), init=[ctr("a", 0), ctr("b")]), DRA)
    assert claims_of(d) == {"a": [0], "b": [None], "app": [None]}
    assert len(d.pod["spec"]["resourceClaims"]) == 2 and len(d.warnings) == 1


def test_the_init_priority_warning_stays_one_short_line_for_many_long_names():
    inits = [ctr(f"{'i' * 60}{k}", 1000 - k) for k in range(60)]
    d = decide(pod(ctr("a" * 63, 1000), init=inits), DRA)
    assert d.allowed
    (note,) = d.warnings
    assert len(note) < 120 and note.endswith("'=1000 and 59 more"), note


def test_one_init_priority_gets_no_new_warning():
    d = decide(pod(ctr("app", 0), init=[ctr("a", 0), ctr("b", 0)]), DRA)
    assert d.warnings == () and len(d.pod["spec"]["resourceClaims"]) == 1


def test_a_claim_with_a_priority_selects_only_devices_whose_agent_honours_it():
    d = decide(pod(ctr("c", 0)), DRA)
    [t] = d.templates
    exactly = t["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert {"cel": {"expression": PRIORITY_SELECTOR}} in exactly["selectors"]
    # a pod without a priority asks nothing of the agent: its template is the one it had
    [plain] = decide(pod(ctr("c")), DRA).templates
    assert "selectors" not in plain["spec"]["spec"]["devices"]["requests"][0]["exactly"]

    new = resource_slice("n1", GPUS, SliceSettings(split_count=4))
    assert all(dev["attributes"][TASK_PRIORITY] == {"bool": True} for dev in new["spec"]["devices"])
    old = resource_slice("n1", GPUS, SliceSettings(split_count=4))
    for dev in old["spec"]["devices"]:  # as an agent that predates the field publishes them
        del dev["attributes"][TASK_PRIORITY]
    # an absent attribute is "no", not a CEL error (which would stop kube-scheduler's allocation)
    program = compile_selector(PRIORITY_SELECTOR)
    assert DeviceCel(DRIVER, old["spec"]["devices"][0]).matches(program) is False
    assert DeviceCel(DRIVER, new["spec"]["devices"][0]).matches(program) is True

    pods = [pod(ctr("c", 0), name="urgent"), pod(ctr("c"), name="plain")]
    on_old = simulate_dra([old], pods, CFG)
    assert {p.name: p.status for p in on_old.pods} == {"urgent": "pending", "plain": "scheduled"}
    on_new = simulate_dra([new], pods, CFG)
    assert {p.name: p.status for p in on_new.pods} == {"urgent": "scheduled", "plain": "scheduled"}


def _claim(**params):
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": "n1",
                            "device": "gpu-0",
                            "consumedCapacity": {"memory": "3000Mi", "cores": "10", "shares": "1"},
                        }
                    ],
                    "config": [
                        {
                            "source": "FromClaim",
                            "requests": ["gpu"],
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, **params},
                            },
                        }
                    ],
                }
            }
        },
    }


@pytest.mark.parametrize(
    "params, named",
    [
        ({"priorty": 0}, "'priorty'=0"),  # misspelt: it ran at the default priority
        ({"priority": 0, "memoryOversubscribe": True}, "'memoryOversubscribe'=True"),  # a future field
        ({"isolation": "hami-core", "x" * 200: "y" * 200}, "'" + "x" * 40 + "'="),  # cut, one line
    ],
)
def test_a_gpuconfig_field_the_agent_does_not_know_fails_prepare_naming_it(params, named):
    with pytest.raises(PrepareError) as exc:
        plan(_claim(**params), "n1", GPUS, SliceSettings(split_count=4))
    message = str(exc.value)
    assert message.startswith("ResourceClaim ns/c: request 'gpu': configuration parameter ")
    assert named in message and "upgrade the agent" in message and len(message) < 300, message


def test_the_known_fields_are_still_taken():
    p = plan(_claim(isolation="hami-core", priority=3), "n1", GPUS, SliceSettings(split_count=4))
    assert p.priority == 3 and p.isolation == "hami-core"


def test_on_the_whole_gpu_class_a_priority_is_left_out_with_a_warning_not_a_pod_that_never_starts():
    whole = AdmissionSettings([NV], front_end="dra", dra_device_class=WHOLE_CLASS)
    d = decide(pod(ctr("c", 0)), whole)
    assert d.allowed
    (note,) = d.warnings
    assert note == "hami: priority ignored, class whole-gpu.hami.io has no libvgpu: 'c'=0"
    [t] = d.templates
    devices = t["spec"]["spec"]["devices"]
    # before: the claim carried the priority, and the plugin refused it at every prepare
    # ("configuration priority=0 needs libvgpu ... isolation none runs without it")
    assert "config" not in devices and "selectors" not in devices["requests"][0]["exactly"]
    assert t == decide(pod(ctr("c")), whole).templates[0]  # the template a pod without one gets
    limits = d.pod["spec"]["containers"][0]["resources"].get("limits") or {}
    assert "nvidia.com/priority" not in limits
    # a value the webhook refuses is still refused on that class
    assert not decide(pod(ctr("c", 1001)), whole).allowed


def test_the_whole_gpu_class_warning_stays_short_for_many_long_names():
    whole = AdmissionSettings([NV], front_end="dra", dra_device_class=WHOLE_CLASS)
    d = decide(pod(*[ctr(f"{'c' * 60}{k}", 1000) for k in range(60)]), whole)
    (note,) = d.warnings
    assert len(note) < 120 and note.endswith("and 59 more"), note
