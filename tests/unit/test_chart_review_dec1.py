"""Chart findings of the 1 Dec review, checked on the rendered manifests (the helm `make kube`
installs; the policies themselves run on a real API server in tests/integration)."""

from __future__ import annotations

from .test_chart_review_webhook_scope import render


def _dra_pods(docs: dict) -> list[dict]:
    return [d["spec"]["template"]["spec"] for (kind, name), d in docs.items() if kind == "DaemonSet" and "-dra" in name]


def test_the_dra_agent_stays_off_the_device_plugins_nodes():
    """`dra.enabled=true` alone put the DRA agent on every node, the device plugin's GPU nodes too:
    both published the same GPUs and each front end handed them out without seeing the other's
    grants (docs/dra.md: a GPU must be published by one front end only)."""
    docs = render("dra.enabled=true")
    pods = _dra_pods(docs)
    assert len(pods) == 2  # the agent and its monitor
    for spec in pods:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["on"]}]}]
    # each label of the plugin's selector is a term of its own (a node lacking any one is not the plugin's)
    two = render("dra.enabled=true", "devicePlugin.nvidiaNodeSelector.pool=gpu")
    terms = _dra_pods(two)[0]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert sorted(t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]) == ["gpu", "pool"]
    # without the device plugin, the agent goes where dra.nodeSelector says, nothing more
    alone = render("dra.enabled=true", "devicePlugin.enabled=false")
    assert all("affinity" not in spec for spec in _dra_pods(alone))


def test_the_namespace_label_guard_covers_the_subresources_that_keep_labels():
    """namespaces/status and namespaces/finalize writes keep the request's metadata.labels: an
    identity with only those set hami.io/webhook=ignore on a namespace (shown on a real API server
    by the review, and in tests/integration/test_chart_guards.py)."""
    docs = render()
    policy = docs[("ValidatingAdmissionPolicy", "x-hami-namespace-label-guard")]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["namespaces", "namespaces/status", "namespaces/finalize"]


def test_a_webhook_every_pod_reaches_fails_open():
    """devicePodsOnly=false sent every pod of the cluster to a webhook rendered with Fail: while
    the scheduler was down no pod could be created, CoreDNS and CNI included (HAMi#160)."""
    webhook = "x-hami-scheduler-webhook"
    scoped = docs_webhook(render())
    everything = docs_webhook(render("scheduler.admissionWebhook.devicePodsOnly=false"))
    assert scoped["failurePolicy"] == "Fail" and everything["failurePolicy"] == "Ignore", webhook


def docs_webhook(docs: dict) -> dict:
    (config,) = [d for (kind, _), d in docs.items() if kind == "MutatingWebhookConfiguration"]
    return next(w for w in config["webhooks"] if w["name"] == "vgpu.hami.io")


def test_the_dra_agent_and_the_device_plugin_without_a_selector_stop_the_render():
    """Found by review, 1 Dec (second round): with `devicePlugin.nvidiaNodeSelector=null` (the
    only way to clear it) the keep-off affinity was not rendered at all, and `dra.enabled=true`
    ran both agents on every node, publishing the same GPUs. The render now fails naming both
    values; without the device plugin the DRA agent alone is still rendered."""
    import subprocess

    from .test_chart_review_webhook_scope import CHART, _helm

    args = [_helm(), "template", "x", str(CHART), "--kube-version", "1.34.4", "--set", "dra.enabled=true"]
    out = subprocess.run(args + ["--set", "devicePlugin.nvidiaNodeSelector=null"], capture_output=True, text=True)
    assert out.returncode != 0
    assert "devicePlugin.nvidiaNodeSelector" in out.stderr and "devicePlugin.enabled=false" in out.stderr
    alone = render("dra.enabled=true", "devicePlugin.enabled=false", "devicePlugin.nvidiaNodeSelector=null")
    assert len(_dra_pods(alone)) == 2
