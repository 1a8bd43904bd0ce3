"""The chart as a platform team installs and upgrades it (found by a review of the chart): names
the API server would refuse fail the render by name, the toggles that cannot work together say
so, kube-scheduler outside the chart gets a working extender, cert-manager's CA outlives
kube-scheduler's one read of it. Rendered with the helm that `make kube` installs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"


def _helm() -> str:
    found = sorted(Path.home().glob(".cache/hami/kube/*/bin/helm"))
    assert found, "helm is installed by `make kube` (the tests' install step)"
    return str(found[-1])


def template(*args: str, release: str = "x", version: str = "1.34.4", ok: bool = True):
    out = subprocess.run(
        [_helm(), "template", release, str(CHART), "--kube-version", version, *args], capture_output=True, text=True
    )
    if not ok:
        return out
    assert out.returncode == 0, out.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}


def sets(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


def test_a_service_name_over_63_characters_fails_the_render_naming_it():
    out = template(release="gpu-sharing-production-cluster-east1-a", ok=False)
    assert out.returncode != 0
    assert '"gpu-sharing-production-cluster-east1-a-hami-device-plugin-monitor" is 65 characters' in out.stderr


def test_a_cluster_older_than_the_chart_supports_is_refused():
    out = template(version="1.20.0", ok=False)
    assert out.returncode != 0 and "kubeVersion: >=1.25.0-0" in out.stderr


@pytest.mark.parametrize(
    "args, version, message",
    [
        (sets("dra.enabled=true"), "1.33.0", "dra.enabled: the DRA driver needs resource.k8s.io/v1"),
        (sets("frontEnd=dra"), "1.35.0", "frontEnd: dra turns GPU pods into claims"),
    ],
)
def test_dra_toggles_that_cannot_work_say_so(args, version, message):
    out = template(*args, version=version, ok=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_without_the_charts_kube_scheduler_the_extender_is_reachable_and_leads():
    """kubeScheduler.enabled false (the cluster's own scheduler calls the extender): the extender
    followed a Lease nobody took and listened on its pod's loopback only, so every Filter was
    refused 'not the leader' and GPU pods stayed Pending."""
    docs = template(*sets("scheduler.kubeScheduler.enabled=false"))
    (extender,) = docs[("Deployment", "x-hami-scheduler")]["spec"]["template"]["spec"]["containers"]
    args = extender["command"]
    assert "--leader-elect-mode=campaign" in args and "--extender-client-ca=/extender-client-ca/ca.crt" in args
    assert not [a for a in args if a.startswith("--extender-bind=")]
    assert ("Lease", "hami-scheduler-extender") in docs  # <schedulerName>-extender
    assert ("Secret", "x-hami-scheduler-extender-client") in docs
    config = yaml.safe_load(docs[("ConfigMap", "x-hami-scheduler")]["data"]["config.yaml"])
    (entry,) = config["extenders"]
    assert entry["urlPrefix"].startswith("https://x-hami-scheduler.default.svc") and entry["enableHTTPS"]


def test_cert_managers_ca_lives_as_long_as_a_helm_made_one_and_common_names_fit():
    """kube-scheduler reads the extender's CA file once: a serving CA renewed with a new key at
    cert-manager's default (90 days) stopped /filter and /bind; a CommonName over 64 characters
    is refused by cert-manager (release names from 31 characters)."""
    release = "gpu-sharing-production-east-1ab"
    docs = template(
        *sets("scheduler.certManager.enabled=true", "scheduler.extender.loopbackPort=0"), release=release, ok=True
    )
    ca = docs[("Certificate", f"{release}-hami-scheduler-ca")]["spec"]
    assert ca["duration"] == "87600h" and ca["privateKey"]["rotationPolicy"] == "Never"
    names = [
        d["spec"]["commonName"] for (kind, _), d in docs.items() if kind == "Certificate" and "commonName" in d["spec"]
    ]
    assert names and all(len(n) <= 64 for n in names), names


def test_a_privileged_device_plugin_does_not_also_forbid_escalation():
    docs = template(*sets("devicePlugin.securityContext.privileged=true"))
    spec = docs[("DaemonSet", "x-hami-device-plugin")]["spec"]["template"]["spec"]
    (plugin,) = [c for c in spec["containers"] if c["securityContext"].get("privileged")]
    assert "allowPrivilegeEscalation" not in plugin["securityContext"]  # the API server refuses both


def test_the_priority_class_and_the_monitors_node_port_may_be_left_to_the_cluster():
    docs = template(*sets("global.priorityClassName=", "devicePlugin.service.httpPort=0"))
    pods = [d["spec"]["template"]["spec"] for d in docs.values() if d["kind"] in ("Deployment", "DaemonSet")]
    assert pods and not [p for p in pods if "priorityClassName" in p]
    (port,) = docs[("Service", "x-hami-device-plugin-monitor")]["spec"]["ports"]
    assert "nodePort" not in port
    default = template()
    (port,) = default[("Service", "x-hami-device-plugin-monitor")]["spec"]["ports"]
    assert port["nodePort"] == 31992  # HAMi's


def test_a_release_upgraded_with_reused_values_keeps_its_priority_class():
    """--reuse-values takes the old release's values, which have no global.priorityClassName:
    the pods kept the class they always had (null deletes the key, as reusing old values does)."""
    docs = template(*sets("global.priorityClassName=null"))
    pods = [d["spec"]["template"]["spec"] for d in docs.values() if d["kind"] in ("Deployment", "DaemonSet")]
    assert pods and {p.get("priorityClassName") for p in pods} == {"system-node-critical"}


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "devicePlugin.deviceSplitCount=2000",
            "devicePlugin.deviceSplitCount: expected 1 to 1024 tasks per GPU, got 2000",
        ),
        ("devicePlugin.deviceSplitCount=0", "devicePlugin.deviceSplitCount: expected 1 to 1024"),
        ("devicePlugin.deviceCoreScaling=0", "devicePlugin.deviceCoreScaling: expected a number above 0"),
        ("devicePlugin.deviceMemoryScaling=5000", "devicePlugin.deviceMemoryScaling: expected a number above 0"),
    ],
)
def test_node_figures_the_scheduler_would_refuse_fail_the_install(setting, message):
    """The scheduler refuses them at start (hami.config); the install failed nothing, the pods did."""
    out = template(*sets(setting), ok=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_node_figures_at_their_bounds_install():
    template(*sets("devicePlugin.deviceSplitCount=1024", "devicePlugin.deviceMemoryScaling=1000"))
