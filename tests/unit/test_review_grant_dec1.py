"""A pod's GPU_CORE_UTILIZATION_POLICY and libvgpu's grant file (found by review, 1 Dec): a device
pod set the policy to 66,000 characters (admitted: only control characters were checked) and
``NVIDIA_VISIBLE_DEVICES=all`` through an envFrom; the device plugin copied the policy into the
grant file before ``HAMI_GRANT_DEVICES``, which then fell past the 64 KiB libvgpu reads, so libvgpu
checked no device: the container used every GPU, limited on device 0 only. Each layer is checked
here: the grant file's order and bound (hami.node.contract), the webhook's rule and the chart's
device-pod guard (its CEL run with the ``cel`` library; tests/integration/test_chart_guards.py
runs the guard on a real API server). libvgpu's own refusal: tests/native/test_review_grant_dec1.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import cel
import pytest
import yaml
from cel.stdlib import add_stdlib_to_context

from hami.node import contract
from hami.vendors import build_vendors
from hami.webhook.admission import AdmissionSettings, decide

POLICY = "GPU_CORE_UTILIZATION_POLICY"
LONG = "x" * 66000
NODE_ENV = {"CUDA_DEVICE_MEMORY_LIMIT_0": "256m", "CUDA_DEVICE_SM_LIMIT": "30", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/r"}
UUIDS = ["GPU-0", "GPU-1"]


# ---------------------------------------------------------------------------------------------
# the grant file


def test_the_grant_file_puts_what_the_node_decides_before_the_pod_specs_values():
    """The device list and the limits come first; the only values taken from the pod's spec last."""
    text = contract.grant_file(NODE_ENV, {POLICY: "force", "CUDA_TASK_PRIORITY": "1"}, UUIDS)
    names = [line.split("=", 1)[0] for line in text.splitlines()]
    assert names[0] == "HAMI_GRANT_DEVICES" and text.startswith("HAMI_GRANT_DEVICES=GPU-0,GPU-1\n")
    assert names[-2:] == ["CUDA_TASK_PRIORITY", POLICY] and text.endswith(f"{POLICY}=force\n")
    assert sorted(names) == sorted(contract.libvgpu_names())  # every name, once
    for name in NODE_ENV:
        assert names.index(name) < names.index("CUDA_TASK_PRIORITY")


@pytest.mark.parametrize("name", [POLICY, "CUDA_TASK_PRIORITY"])
def test_a_pod_specs_value_over_the_bound_is_refused_naming_it(name):
    """66,000 bytes of policy made the file longer than libvgpu reads; a pod's value is now
    refused over 256 bytes (Allocate fails, naming it), so the file stays a few KiB."""
    with pytest.raises(ValueError, match=rf"{name}='x{{32}}[.][.][.]' is 66000 bytes, longer than the 256"):
        contract.grant_file(NODE_ENV, {name: LONG}, UUIDS)
    with pytest.raises(ValueError, match="257 bytes"):
        contract.grant_file(NODE_ENV, {name: "é" + "x" * 255}, UUIDS)  # bytes, not characters
    text = contract.grant_file(NODE_ENV, {name: "x" * 256}, UUIDS)
    assert f"{name}={'x' * 256}\n" in text and len(text) < contract.GRANT_FILE_MAX < 65535
    # the node's own value is the one written: the pod's is not read then
    assert f"{name}=force\n" in contract.grant_file({**NODE_ENV, name: "force"}, {name: LONG}, UUIDS)


def test_a_pod_specs_value_with_a_control_character_is_refused():
    """A NUL byte ended libvgpu's reading of the file (what followed came from the environment)."""
    for value in ("force\0", "force\r", "de\tfault"):
        with pytest.raises(ValueError, match=f"{POLICY}=.* holds a line break or other control character"):
            contract.grant_file(NODE_ENV, {POLICY: value}, UUIDS)


# ---------------------------------------------------------------------------------------------
# the webhook

S = AdmissionSettings(build_vendors())
GPU = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}


def gpu_pod(env: list[dict], container: str = "main") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {"containers": [{"name": container, "image": "b", "resources": {"limits": dict(GPU)}, "env": env}]},
    }


@pytest.mark.parametrize("value", [LONG, "x" * 257, "é" * 129])
def test_the_webhook_refuses_a_policy_longer_than_the_grant_file_takes(value):
    """Over 256 bytes (what the grant file takes of a pod's value): the message names the
    container, the variable, the value (shortened) and its size."""
    d = decide(gpu_pod([{"name": POLICY, "value": value}], "trainer"), S, {})
    assert not d.allowed, d
    shown = repr(value) if len(value) <= 80 else f"'{value[:80]}...'"
    size = len(value.encode())
    assert f"container 'trainer': env {POLICY}={shown} is {size} bytes, longer than the 256" in d.message, d.message
    assert len(d.message) < 300


@pytest.mark.parametrize("value", ["default", "DEFAULT", "force", "Force", "FORCE", "", "enable", "on", "x" * 256])
def test_the_webhook_admits_any_policy_the_grant_file_takes(value):
    """HAMi's manifests keep working: an unknown policy (``enable``, ``on``) is read as the default
    by libvgpu and HAMi-core, as before (a regression review of the first version, which admitted
    only default, force and disable, 1 Dec)."""
    assert decide(gpu_pod([{"name": POLICY, "value": value}]), S, {}).allowed
    # disable is the isolation opt-out: allowed where the namespace carries the label
    assert decide(gpu_pod([{"name": POLICY, "value": "DISABLE"}]), S, {S.disable_control_label: "true"}).allowed


def test_the_webhook_cannot_read_a_policy_from_value_from():
    """valueFrom is read as the opt-out (namespace label) and never copied into the grant file."""
    env = [{"name": POLICY, "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
    assert not decide(gpu_pod(env), S, {}).allowed
    assert decide(gpu_pod(env), S, {S.disable_control_label: "true"}).allowed


# ---------------------------------------------------------------------------------------------
# the chart's device-pod guard

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"


def _helm() -> str:
    found = sorted(Path.home().glob(".cache/hami/kube/*/bin/helm"))
    assert found, "helm is installed by `make kube` (the tests' install step)"
    return str(found[-1])


@pytest.fixture(scope="module")
def guard() -> dict:
    args = [_helm(), "template", "x", str(CHART), "--kube-version", "1.37.0"]
    out = subprocess.run([*args, "-s", "templates/scheduler/device-pod-guard.yaml"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "ValidatingAdmissionPolicy"]
    return next(d for d in docs if d["metadata"]["name"] == "x-hami-device-pod-guard")


def refusals(vap: dict, pod: dict) -> list[str]:
    """The messages of the validations ``vap`` fails for the pod's CREATE ([] when admitted)."""
    values: dict[str, Any] = {}

    def run(expression: str) -> Any:
        ctx = cel.Context()
        add_stdlib_to_context(ctx)
        ctx.add_variable("request", {"operation": "CREATE"})
        ctx.add_variable("object", pod)
        ctx.add_variable("oldObject", None)
        ctx.add_variable("namespaceObject", {"metadata": {"name": "team", "labels": {}}})
        ctx.add_variable("variables", dict(values))
        return cel.evaluate(expression, ctx)

    spec = vap["spec"]
    assert all(run(c["expression"]) for c in spec["matchConditions"])
    for v in spec["variables"]:
        values[v["name"]] = run(v["expression"])
    return [run(v["messageExpression"]) for v in spec["validations"] if run(v["expression"]) is not True]


def guarded_pod(value: str) -> dict:
    pod = gpu_pod([{"name": POLICY, "value": value}], "trainer")
    pod["spec"]["schedulerName"] = "hami-scheduler"
    pod["spec"]["initContainers"] = [{"name": "setup", "image": "b", "env": [{"name": POLICY, "value": value}]}]
    return pod


@pytest.mark.parametrize("value", [LONG, "x" * 257, "default\n", "force\r"])
def test_the_guard_refuses_a_policy_the_grant_file_cannot_take(guard, value):
    """A pod that skips the webhook (its hami.io/webhook: ignore label) meets the same rule."""
    (message,) = refusals(guard, guarded_pod(value))
    shown = value[:32] + "..." if len(value) > 32 else value
    shown = (
        shown.replace("\n", "\\n").replace("\r", "\\r")
        + "'"
        + (f" ({len(value)} characters)" if len(value) > 32 else "")
    )
    assert f"container 'trainer' sets {POLICY}='{shown}, 'setup' sets {POLICY}='{shown}: longer than 256" in message
    assert "\n" not in message and len(message) < 500  # the API server drops a message with a line break


@pytest.mark.parametrize("value", ["default", "DEFAULT", "force", "Force", "", "enable", "x" * 256])
def test_the_guard_admits_any_policy_the_grant_file_takes(guard, value):
    assert refusals(guard, guarded_pod(value)) == []
