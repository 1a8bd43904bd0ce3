"""Day-2 behaviour of the Helm chart: what `helm upgrade` and a node drain do to the pods it makes.

Rendered with ``helm template`` only (no cluster):

- the device plugin's and the DRA agent's pod templates carry a checksum of every chart ConfigMap
  they read at start-up (device-config.yaml, the node ``config.json``), so a changed one rolls them;
  the checksums cover the data alone, so a change of metadata (``global.annotations``) rolls nothing;
- the scheduler Deployment never runs two schedulers without a Lease (``Recreate`` without leader
  election), rolls a follower in first with it, and probes with HAMi's 5 s timeout;
- a device-plugin ``updateStrategy`` with a surge is refused: two plugins on one node fight over
  the kubelet socket;
- a PodDisruptionBudget keeps one scheduler replica through a drain when there is more than one.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml


from .test_chart import CHART, KUBE_VERSION

pytestmark = pytest.mark.integration

DRA = ("frontEnd=dra", "dra.enabled=true", "devicePlugin.enabled=false")


def _template(helm_bin, *sets: str, values: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    args = [a for s in sets for a in ("--set", s)] + (["-f", values] if values else [])
    return helm_bin("template", "hami", str(CHART), "--kube-version", KUBE_VERSION, *args, check=check)


def _render(helm_bin, *sets: str, values: str | None = None) -> dict[tuple[str, str], dict]:
    out = _template(helm_bin, *sets, values=values).stdout
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}


def _node_config(tmp_path: Path, split: int) -> str:
    """A values file with the node config.json (--set would split its JSON at the commas)."""
    config = json.dumps({"nodeconfig": [{"name": "n1", "devicesplitcount": split}]})
    path = tmp_path / f"node-config-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump({"devicePlugin": {"nodeConfiguration": {"config": config}}}))
    return str(path)


def _pod_annotations(docs: dict, kind: str, name: str) -> dict[str, str]:
    return docs[(kind, name)]["spec"]["template"]["metadata"].get("annotations") or {}


def _scheduler(docs: dict) -> dict:
    return docs[("Deployment", "hami-scheduler")]


def _extender(docs: dict) -> dict:
    containers = _scheduler(docs)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "vgpu-scheduler-extender")


def test_a_changed_node_config_rolls_the_device_plugin(helm_bin, tmp_path):
    one = _render(helm_bin, values=_node_config(tmp_path, 4))
    two = _render(helm_bin, values=_node_config(tmp_path, 8))
    # the ConfigMap itself changed, so the pod template must
    assert one[("ConfigMap", "hami-device-plugin")]["data"] != two[("ConfigMap", "hami-device-plugin")]["data"]
    before = _pod_annotations(one, "DaemonSet", "hami-device-plugin")
    after = _pod_annotations(two, "DaemonSet", "hami-device-plugin")
    assert before != after
    assert before["checksum/node-config"] != after["checksum/node-config"]
    assert before["checksum/device-config"] == after["checksum/device-config"]
    # the same values give the same checksum: an upgrade that changes nothing rolls nothing
    assert (
        _pod_annotations(_render(helm_bin, values=_node_config(tmp_path, 4)), "DaemonSet", "hami-device-plugin")
        == before
    )


def test_a_changed_device_or_node_config_rolls_the_dra_agent(helm_bin, tmp_path):
    base = _pod_annotations(_render(helm_bin, *DRA), "DaemonSet", "hami-dra")
    assert {"checksum/device-config", "checksum/node-config"} <= set(base)
    # devices.* feed device-config.yaml, which the agent reads (--config-file)
    device = _pod_annotations(_render(helm_bin, *DRA, "devices.nvidia.gpuCorePolicy=force"), "DaemonSet", "hami-dra")
    assert device["checksum/device-config"] != base["checksum/device-config"]
    assert device["checksum/node-config"] == base["checksum/node-config"]
    # so does devicePlugin.deviceSplitCount, though the device plugin is off
    split = _pod_annotations(_render(helm_bin, *DRA, "devicePlugin.deviceSplitCount=4"), "DaemonSet", "hami-dra")
    assert split["checksum/device-config"] != base["checksum/device-config"]
    # and the node config.json (--node-config)
    node = _pod_annotations(_render(helm_bin, *DRA, values=_node_config(tmp_path, 4)), "DaemonSet", "hami-dra")
    assert node["checksum/node-config"] != base["checksum/node-config"]
    assert node["checksum/device-config"] == base["checksum/device-config"]


CHECKSUMS = (
    ("DaemonSet", "hami-device-plugin", (), ("checksum/device-config", "checksum/node-config")),
    ("DaemonSet", "hami-dra", DRA, ("checksum/device-config", "checksum/node-config")),
    ("Deployment", "hami-scheduler", (), ("checksum/config", "checksum/device-config")),
)


@pytest.mark.parametrize(("kind", "name", "sets", "keys"), CHECKSUMS, ids=[c[1] for c in CHECKSUMS])
def test_only_a_configmaps_data_rolls_its_readers(helm_bin, tmp_path, kind, name, sets, keys):
    """The checksums cover what the programs read (the data), not the ConfigMaps' metadata: a
    changed global.annotations (on every object, the ConfigMaps included) restarts nothing."""
    base = _render(helm_bin, *sets)
    tagged = _render(helm_bin, *sets, "global.annotations.team=gpu")
    maps = [k for k in base if k[0] == "ConfigMap"]
    assert maps and all(tagged[k]["metadata"]["annotations"]["team"] == "gpu" for k in maps)  # metadata did change
    assert {k: _pod_annotations(base, kind, name)[k] for k in keys} == {
        k: _pod_annotations(tagged, kind, name)[k] for k in keys
    }
    # ...and the data still does: each checksum follows its own file
    files = _render(helm_bin, *sets, "devices.nvidia.gpuCorePolicy=force", values=_node_config(tmp_path, 4))
    kube = _render(helm_bin, *sets, "scheduler.kubeScheduler.clientConnection.qps=500")  # kube-scheduler's config
    for key in keys:
        moved = kube if key == "checksum/config" else files
        assert _pod_annotations(moved, kind, name)[key] != _pod_annotations(base, kind, name)[key], key


def test_an_external_node_config_is_not_rendered_so_its_checksum_is_constant(helm_bin, tmp_path):
    """The chart cannot see a ConfigMap of nodeConfiguration.externalConfigName (documented: restart
    the DaemonSet yourself); the plugin mounts it, and the chart's own one is left out."""
    docs = _render(helm_bin, "devicePlugin.nodeConfiguration.externalConfigName=mine", values=_node_config(tmp_path, 4))
    assert ("ConfigMap", "hami-device-plugin") not in docs
    volumes = docs[("DaemonSet", "hami-device-plugin")]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "node-config", "configMap": {"name": "mine"}} in volumes
    other = _render(
        helm_bin, "devicePlugin.nodeConfiguration.externalConfigName=mine", values=_node_config(tmp_path, 8)
    )
    assert _pod_annotations(docs, "DaemonSet", "hami-device-plugin") == _pod_annotations(
        other, "DaemonSet", "hami-device-plugin"
    )


def test_without_leader_election_the_scheduler_is_recreated_never_two_at_once(helm_bin):
    docs = _render(helm_bin, "scheduler.leaderElect=false", "scheduler.replicas=3")
    spec = _scheduler(docs)["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize("replicas", [1, 3])
def test_with_leader_election_a_follower_is_rolled_in_before_an_old_scheduler_stops(helm_bin, replicas):
    docs = _render(helm_bin, "scheduler.leaderElect=true", f"scheduler.replicas={replicas}")
    spec = _scheduler(docs)["spec"]
    assert spec["replicas"] == replicas
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def test_the_scheduler_probes_wait_five_seconds(helm_bin):
    extender = _extender(_render(helm_bin))
    assert extender["readinessProbe"]["timeoutSeconds"] == 5
    assert extender["livenessProbe"]["timeoutSeconds"] == 5
    # no liveness probe when it is switched off; readiness stays
    off = _extender(_render(helm_bin, "scheduler.livenessProbe=false"))
    assert "livenessProbe" not in off and off["readinessProbe"]["timeoutSeconds"] == 5


@pytest.mark.parametrize("surge", ["1", "10%"])
def test_a_device_plugin_surge_is_refused(helm_bin, surge):
    result = _template(helm_bin, f"devicePlugin.updateStrategy.rollingUpdate.maxSurge={surge}", check=False)
    assert result.returncode != 0
    assert (
        f"devicePlugin.updateStrategy.rollingUpdate.maxSurge={surge} is not supported: a surge pod would be a "
        "second device plugin on the node"
    ) in result.stderr, result.stderr


@pytest.mark.parametrize("surge", ["0", "0%"])
def test_a_device_plugin_without_surge_renders(helm_bin, surge):
    docs = _render(helm_bin, f"devicePlugin.updateStrategy.rollingUpdate.maxSurge={surge}")
    strategy = docs[("DaemonSet", "hami-device-plugin")]["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert str(strategy["rollingUpdate"]["maxSurge"]) == surge
    assert strategy["rollingUpdate"]["maxUnavailable"] == 1


def test_the_default_device_plugin_strategy_has_no_surge(helm_bin):
    strategy = _render(helm_bin)[("DaemonSet", "hami-device-plugin")]["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}


def test_a_drain_keeps_one_of_several_elected_schedulers(helm_bin):
    docs = _render(
        helm_bin, "scheduler.leaderElect=true", "scheduler.replicas=2", "global.annotations.example\\.com/owner=a"
    )
    pdb = docs[("PodDisruptionBudget", "hami-scheduler")]
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["metadata"]["namespace"] == "default"
    assert pdb["metadata"]["annotations"] == {"example.com/owner": "a"}
    assert pdb["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert pdb["spec"] == {
        "minAvailable": 1,
        "unhealthyPodEvictionPolicy": "AlwaysAllow",  # a replica never Ready does not hold a drain up
        "selector": {"matchLabels": _scheduler(docs)["spec"]["selector"]["matchLabels"]},
    }
    # it selects the scheduler pods and nothing else the chart runs
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= _scheduler(docs)["spec"]["template"]["metadata"]["labels"].items()
    )
    plugin = docs[("DaemonSet", "hami-device-plugin")]["spec"]["template"]["metadata"]["labels"]
    assert not pdb["spec"]["selector"]["matchLabels"].items() <= plugin.items()


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("scheduler.leaderElect=true", "scheduler.replicas=1"),
        ("scheduler.leaderElect=false", "scheduler.replicas=3"),
    ],
    ids=["defaults", "one-replica", "no-leader-election"],
)
def test_no_disruption_budget_for_a_single_scheduler(helm_bin, sets):
    """One replica (or one forced by leaderElect=false): a budget of one would block every drain of
    its node."""
    assert not [k for k in _render(helm_bin, *sets) if k[0] == "PodDisruptionBudget"]


def _pem(secret: dict, key: str) -> bytes:
    import base64

    return base64.b64decode(secret["data"][key])


def test_the_webhook_reaches_every_synced_replica_and_the_certificate_names_its_service(helm_bin):
    """The API server calls the webhook through its own Service, which selects every scheduler
    replica (readiness: caches synced), so a rolling update or failover never leaves it without
    an endpoint; the scheduler's Service (metrics, UI) still selects the leader alone."""
    from cryptography import x509

    docs = _render(helm_bin, "scheduler.replicas=2")
    (hook,) = docs[("MutatingWebhookConfiguration", "hami-scheduler-webhook")]["webhooks"]
    assert hook["clientConfig"]["service"]["name"] == "hami-scheduler-webhook"
    webhook_svc, main_svc = docs[("Service", "hami-scheduler-webhook")], docs[("Service", "hami-scheduler")]
    assert "hami.io/scheduler-role" not in webhook_svc["spec"]["selector"]
    assert main_svc["spec"]["selector"] == {**webhook_svc["spec"]["selector"], "hami.io/scheduler-role": "leader"}
    port = webhook_svc["spec"]["ports"][0]
    assert (port["port"], port["targetPort"]) == (hook["clientConfig"]["service"]["port"], "http")
    # the certificate the replicas serve names both Services, and says so on its Secret
    secret = docs[("Secret", "hami-scheduler-tls")]
    cert = x509.load_pem_x509_certificate(_pem(secret, "tls.crt"))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert {"hami-scheduler-webhook.default.svc", "hami-scheduler.default.svc"} <= set(names)
    assert json.loads(secret["metadata"]["annotations"]["hami.io/tls-names"])["dns"] == names
    # a fresh install trusts its one CA
    import base64

    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == _pem(secret, "ca.crt")
    # rendered without the cluster (helm template, GitOps) every render makes a new certificate:
    # no checksum of it, or the scheduler would restart on every sync
    assert "checksum/tls" not in _pod_annotations(docs, "Deployment", "hami-scheduler")
    # cert-manager's certificate names it too; with customURL there is no Service to call
    managed = _render(helm_bin, "scheduler.certManager.enabled=true")
    assert (
        "hami-scheduler-webhook.default.svc" in managed[("Certificate", "hami-scheduler-serving")]["spec"]["dnsNames"]
    )
    custom = _render(
        helm_bin,
        "scheduler.admissionWebhook.customURL.enabled=true",
        "scheduler.admissionWebhook.customURL.host=h.example",
    )
    assert ("Service", "hami-scheduler-webhook") not in custom


def test_a_webhook_service_name_over_63_characters_is_refused_naming_it(helm_bin):
    long = "a" * 51  # + "-scheduler-webhook": 69 characters
    result = _template(helm_bin, f"fullnameOverride={long}", check=False)
    assert result.returncode != 0
    assert f'"{long}-scheduler-webhook" is 69 characters' in result.stderr and "fullnameOverride" in result.stderr
    # with customURL there is no such Service; the monitor's (-device-plugin-monitor) is refused the same way
    result = _template(
        helm_bin, f"fullnameOverride={long}", "scheduler.admissionWebhook.customURL.enabled=true", check=False
    )
    assert result.returncode != 0 and f'"{long}-device-plugin-monitor" is 73 characters' in result.stderr
    _template(
        helm_bin,
        f"fullnameOverride={long}",
        "scheduler.admissionWebhook.customURL.enabled=true",
        "devicePlugin.enabled=false",
    )


@pytest.mark.parametrize("timeout,bind", [(None, "28s"), ("45", "43s")])
def test_the_bind_deadline_stays_below_kube_schedulers_http_timeout(helm_bin, timeout, bind):
    docs = _render(helm_bin, *([f"scheduler.extenderHTTPTimeout={timeout}"] if timeout else []))
    assert f"--bind-timeout={bind}" in _extender(docs)["command"]
    config = yaml.safe_load(docs[("ConfigMap", "hami-scheduler")]["data"]["config.yaml"])
    assert config["extenders"][0]["httpTimeout"] == f"{timeout or 30}s"


def test_an_http_timeout_too_short_for_a_bind_is_refused(helm_bin):
    result = _template(helm_bin, "scheduler.extenderHTTPTimeout=3", check=False)
    assert result.returncode != 0
    assert "scheduler.extenderHTTPTimeout: 3 is too short" in result.stderr, result.stderr
