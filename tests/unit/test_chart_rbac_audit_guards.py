"""The node agents' guard policies, audited against what the agents write (found by a least-privilege
review of the chart's identities).

- templates/dra/slice-guard.yaml checked a slice's node, pool and driver but not its name: the DRA
  agent of node A could create a slice named after node B's (``B-gpu.hami.io``, content of its own
  node), and B's agent could then publish nothing there (a slice's nodeName is immutable, so its
  server-side apply is refused): B's GPUs gone from the cluster. The agent writes only the names
  :func:`hami.dra.model.slice_name` gives its node.
- templates/device-plugin/node-guard.yaml kept the device plugin to its own node's annotations
  ``hami.io/...`` on the Node, but on that node's pods let it change any annotation (Multus'
  ``k8s.v1.cni.cncf.io/networks``, read when the sandbox is made, after Allocate): the plugin
  writes only ``hami.io/`` ones there (src/hami/deviceplugin/allocator.py, injection.py).

The policies are rendered with helm and their variables, match conditions and validations run
here with the ``cel`` library (the one hami.dra.cel uses); a real API server runs them in
tests/integration/test_chart_dra.py and test_chart_guards.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import cel
import pytest
import yaml

from hami.core import names
from hami.deviceplugin.allocator import MIG_ALLOCATIONS_ANNOTATION
from hami.dra.model import slice_name

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"
NS = "gpu"
PLUGIN = f"system:serviceaccount:{NS}:x-hami-device-plugin"
AGENT = f"system:serviceaccount:{NS}:x-hami-dra"


def _helm() -> str:
    found = sorted(Path.home().glob(".cache/hami/kube/*/bin/helm"))
    assert found, "helm is installed by `make kube` (the tests' install step)"
    return str(found[-1])


def policy(template: str, *sets: str) -> dict:
    args = [_helm(), "template", "x", str(CHART), "--namespace", NS, "--kube-version", "1.34.4", "-s", template]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (vap,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "ValidatingAdmissionPolicy"]
    return vap


def admit(vap: dict, request: dict, obj: Any, old: Any) -> list[str]:
    """The validations ``vap`` fails for this request ([] when it is admitted or not matched)."""
    spec = vap["spec"]
    values: dict[str, Any] = {}

    def run(expression: str) -> Any:
        ctx = cel.Context()
        ctx.add_variable("request", request)
        ctx.add_variable("object", obj)
        ctx.add_variable("oldObject", old)
        ctx.add_variable("variables", dict(values))
        return cel.evaluate(expression, ctx)

    if not all(run(c["expression"]) for c in spec.get("matchConditions") or ()):
        return []
    for v in spec.get("variables") or ():
        values[v["name"]] = run(v["expression"])
    return [v["expression"] for v in spec["validations"] if run(v["expression"]) is not True]


def request(user: str, node: str, resource: str, name: str, operation: str = "UPDATE", namespace: str = "") -> dict:
    return {
        "operation": operation,
        "name": name,
        "namespace": namespace,
        "resource": {"group": "", "version": "v1", "resource": resource},
        "userInfo": {"username": user, "groups": [], "extra": {"authentication.kubernetes.io/node-name": [node]}},
    }


# ---------------------------------------------------------------------------------------------
# the DRA agent's slices


def a_slice(name: str, node: str) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"driver": names.DRA_DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1}},
    }


@pytest.fixture(scope="module")
def slice_guard() -> dict:
    return policy("templates/dra/slice-guard.yaml", "dra.enabled=true", "devicePlugin.enabled=false")


def test_the_agent_writes_its_own_nodes_slices_under_every_name_it_uses(slice_guard):
    node = "gpu-1"
    # the first slice, and the further parts a MIG layout publishes (and deletes)
    for part in (0, 1, 2, 12):
        name = slice_name(node, part)
        created = admit(slice_guard, request(AGENT, node, "resourceslices", name, "CREATE"), a_slice(name, node), None)
        assert created == [], (name, created)
        updated = admit(
            slice_guard, request(AGENT, node, "resourceslices", name), a_slice(name, node), a_slice(name, node)
        )
        assert updated == [], (name, updated)
        deleted = admit(slice_guard, request(AGENT, node, "resourceslices", name, "DELETE"), None, a_slice(name, node))
        assert deleted == [], (name, deleted)


@pytest.mark.parametrize(
    "name",
    [
        slice_name("gpu-2"),  # another node's slice name, taken first
        slice_name("gpu-2", 1),
        "gpu-1-gpu.hami.io-0",  # no part 0 spelt so
        "gpu-1-gpu.hami.io-x",
        "gpu-1-gpu.hami.io-1-gpu.hami.io",  # the slice of a node named gpu-1-gpu.hami.io-1
        "anything",
    ],
)
def test_the_agent_may_not_take_a_slice_name_that_is_not_its_nodes(slice_guard, name):
    node = "gpu-1"
    refused = admit(slice_guard, request(AGENT, node, "resourceslices", name, "CREATE"), a_slice(name, node), None)
    assert refused, f"{name}: created by the agent of {node}"


def test_a_slice_of_another_node_is_still_refused(slice_guard):
    name = slice_name("gpu-1")
    assert admit(slice_guard, request(AGENT, "gpu-1", "resourceslices", name, "CREATE"), a_slice(name, "gpu-2"), None)


# ---------------------------------------------------------------------------------------------
# the device plugin's pods and node


def a_pod(annotations: dict[str, str], labels: dict[str, str] | None = None, node: str = "gpu-1") -> dict:
    return {
        "metadata": {"name": "p", "namespace": "team", "annotations": annotations, "labels": labels or {}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
    }


@pytest.fixture(scope="module")
def node_guard() -> dict:
    return policy("templates/device-plugin/node-guard.yaml")


def test_the_plugin_writes_what_allocate_writes_on_its_nodes_pods(node_guard):
    before = a_pod({"team/owner": "a", names.BIND_PHASE: "allocating", "hami.io/vgpu-devices-to-allocate": "x;"})
    after = a_pod(
        {
            "team/owner": "a",
            names.BIND_PHASE: "success",
            "hami.io/vgpu-devices-to-allocate": ";",
            MIG_ALLOCATIONS_ANNOTATION: "{}",
        },
        {names.VGPU_NODE: "gpu-1"},
    )
    assert admit(node_guard, request(PLUGIN, "gpu-1", "pods", "p", namespace="team"), after, before) == []


@pytest.mark.parametrize(
    "key, value",
    [
        ("k8s.v1.cni.cncf.io/networks", "team/other-tenants-net"),  # added
        ("team/owner", "b"),  # changed
        ("team/owner", None),  # removed
    ],
)
def test_the_plugin_may_not_change_other_annotations_of_its_nodes_pods(node_guard, key, value):
    before = a_pod({"team/owner": "a"})
    changed = {**before["metadata"]["annotations"], key: value}
    after = a_pod({k: v for k, v in changed.items() if v is not None})
    assert admit(node_guard, request(PLUGIN, "gpu-1", "pods", "p", namespace="team"), after, before)


def test_the_plugin_still_may_not_touch_pods_of_another_node(node_guard):
    before = a_pod({}, node="gpu-2")
    after = a_pod({names.BIND_PHASE: "success"}, node="gpu-2")
    assert admit(node_guard, request(PLUGIN, "gpu-1", "pods", "p", namespace="team"), after, before)


def test_the_plugin_writes_its_node_registration_and_nothing_else_there(node_guard):
    def node(annotations: dict[str, str]) -> dict:
        return {"metadata": {"name": "gpu-1", "annotations": annotations}, "spec": {}}

    base = {"flannel.alpha.coreos.com/public-ip": "10.0.0.1"}
    ours = node({**base, "hami.io/node-nvidia-register": "[]", names.NODE_HANDSHAKE: "Reported now"})
    assert admit(node_guard, request(PLUGIN, "gpu-1", "nodes", "gpu-1"), ours, node(base)) == []
    redirected = node({"flannel.alpha.coreos.com/public-ip": "203.0.113.9"})
    assert admit(node_guard, request(PLUGIN, "gpu-1", "nodes", "gpu-1"), redirected, node(base))


# ---------------------------------------------------------------------------------------------
# the operator's GPU cordon: hami.io/ by name, written by neither agent (found by review: both
# node guards let their identity add, change or remove it, taking GPUs out of service or back in)

SCHEDULER = f"system:serviceaccount:{NS}:x-hami-scheduler"


@pytest.fixture(scope="module")
def scheduler_node_guard() -> dict:
    return policy("templates/scheduler/node-guard.yaml")


@pytest.mark.parametrize("before, after", [(None, "GPU-a"), ("GPU-a", "GPU-a,GPU-b"), ("GPU-a", None)])
@pytest.mark.parametrize("who", ["plugin", "scheduler"])
def test_neither_agent_may_change_the_operators_gpu_cordon(node_guard, scheduler_node_guard, who, before, after):
    def node(cordon: str | None) -> dict:
        annotations = {"hami.io/node-nvidia-register": "[]"}
        if cordon is not None:
            annotations[names.DEVICE_CORDON] = cordon
        return {"metadata": {"name": "gpu-1", "annotations": annotations}, "spec": {}}

    guard, user = (node_guard, PLUGIN) if who == "plugin" else (scheduler_node_guard, SCHEDULER)
    req = request(user, "gpu-1", "nodes", "gpu-1")
    assert admit(guard, req, node(after), node(before))
    # what the agent does write there still passes, the cordon left as it was
    ours = node(before)
    ours["metadata"]["annotations"][names.NODE_LOCK] = "2025-01-01T00:00:00Z,ns,p"
    assert admit(guard, req, ours, node(before)) == []
