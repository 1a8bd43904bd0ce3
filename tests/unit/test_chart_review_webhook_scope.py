"""The fail-closed admission webhook sees only pods asking for this release's resources (found by
a review of the chart): its matchConditions took any extended resource, so while the scheduler
was down every KubeVirt (devices.kubevirt.io/kvm), SR-IOV or RDMA pod of the cluster was refused
("failed calling webhook"), pods the webhook never changes. Rendered with the helm that `make
kube` installs; the CEL itself is run by a real API server in tests/integration/test_chart.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"


def _helm() -> str:
    found = sorted(Path.home().glob(".cache/hami/kube/*/bin/helm"))
    assert found, "helm is installed by `make kube` (the tests' install step)"
    return str(found[-1])


def render(*sets: str) -> dict:
    args = [_helm(), "template", "x", str(CHART), "--kube-version", "1.34.4"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}


def managed(docs: dict) -> set[str]:
    config = yaml.safe_load(docs[("ConfigMap", "x-hami-scheduler")]["data"]["config.yaml"])
    (extender,) = config["extenders"]
    return {r["name"] for r in extender["managedResources"]}


def names_matched(expression: str) -> list[set[str]]:
    """The resource-name lists the expression tests container resources against."""
    return [set(json.loads(m)) for m in re.findall(r"exists\(k, k in (\[[^\]]*\])\)", expression)]


def webhook_entry(docs: dict, name: str) -> dict:
    config = docs[("MutatingWebhookConfiguration", "x-hami-scheduler-webhook")]
    (entry,) = [w for w in config["webhooks"] if w["name"] == name]
    return entry


def test_only_pods_asking_for_the_releases_resources_reach_the_fail_closed_webhook():
    docs = render()
    entry = webhook_entry(docs, "vgpu.hami.io")
    assert entry["failurePolicy"] == "Fail"
    (condition,) = entry["matchConditions"]
    expression = condition["expression"]
    assert "contains('/')" not in expression  # any domain/name: KubeVirt's, SR-IOV's, Koordinator's
    lists = names_matched(expression)
    assert len(lists) == 4  # limits and requests of containers and of init containers
    assert all(names == managed(docs) for names in lists)
    assert "nvidia.com/gpumem" in lists[0]  # gpumem alone is defaulted to a GPU by the webhook
    for other in ("devices.kubevirt.io/kvm", "intel.com/sriov_netdevice", "kubernetes.io/batch-cpu"):
        assert all(other not in names for names in lists)
    assert "has(object.spec.resourceClaims)" in expression  # claims still reach it


def test_the_webhook_follows_the_enabled_vendors_names():
    docs = render("devices.vnpus.enabled=true", "devices.cambricon.enabled=true", "resourceName=example.com/vgpu")
    lists = names_matched(webhook_entry(docs, "vgpu.hami.io")["matchConditions"][0]["expression"])
    assert lists and all(names == managed(docs) for names in lists)
    assert {"huawei.com/Ascend910B3", "cambricon.com/vmlu", "example.com/vgpu"} <= lists[0]
    assert "nvidia.com/gpu" not in lists[0]


def test_overwrite_env_sends_the_other_pods_to_an_entry_that_fails_open():
    """A pod with another vendor's resource is now one that asks for no device of ours: with
    overwriteEnv it goes to the failing-open entry (NVIDIA_VISIBLE_DEVICES=none), as in HAMi."""
    docs = render("devices.nvidia.config.overwriteEnv=true")
    entry = webhook_entry(docs, "env.vgpu.hami.io")
    assert entry["failurePolicy"] == "Ignore"
    expression = entry["matchConditions"][0]["expression"]
    assert expression.startswith("!(")
    lists = names_matched(expression)
    assert lists and all(names == managed(docs) for names in lists)
