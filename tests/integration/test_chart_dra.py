"""The chart's DRA front end (`frontEnd: dra`, `dra.enabled`): rendered objects, least privilege,
the DeviceClasses equal to the driver's own, and a server-side dry run on the real API server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from hami.dra.model import device_classes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "hami"
DRA = ["--set", "dra.enabled=true", "--set", "frontEnd=dra", "--set", "dra.extendedResourceName=nvidia.com/gpu"]


@pytest.fixture(scope="module")
def helm(kube_cluster, tmp_path_factory):
    home = tmp_path_factory.mktemp("helm-dra")
    env = {
        **os.environ,
        **kube_cluster.env(),
        "HELM_CACHE_HOME": str(home / "c"),
        "HELM_CONFIG_HOME": str(home / "f"),
        "HELM_DATA_HOME": str(home / "d"),
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(kube_cluster.binaries["helm"]), *args], env=env, text=True, capture_output=True, timeout=120
        )
        if check and out.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
        return out

    return run


def render(helm, *values: str, ns: str = "gpu") -> list[dict]:
    out = helm("template", "hami", str(CHART), "--namespace", ns, "--kube-version", "1.34.4", *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def scheduler_args(docs: list[dict]) -> list[str]:
    dep = next(d for d in docs if d["kind"] == "Deployment")
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["command"][:2] == ["hami", "scheduler"])[
        "command"
    ]


def rules(docs: list[dict], name: str) -> list[dict]:
    return next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name)["rules"]


def test_defaults_keep_the_extender_and_render_nothing_of_dra(helm):
    docs = render(helm)
    assert "--front-end=extender" in scheduler_args(docs)
    assert not [d for d in docs if d["kind"] == "DeviceClass" or d["metadata"]["name"] == "hami-dra"]
    assert not [r for r in rules(docs, "hami-scheduler") if "resourceclaimtemplates" in r["resources"]]
    # on either front end the scheduler watches DRA claims and slices (quotas, UI), and only watches
    dra_rules = [r for r in rules(docs, "hami-scheduler") if r["apiGroups"] == ["resource.k8s.io"]]
    assert dra_rules == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims", "resourceslices"],
            "verbs": ["list", "watch"],  # watched only, never read by name
        }
    ]


def test_dra_values_render_the_agent_its_privileges_and_the_drivers_own_classes(helm):
    docs = render(helm, *DRA)
    assert "--front-end=dra" in scheduler_args(docs)
    assert [r for r in rules(docs, "hami-scheduler") if r["apiGroups"] == ["resource.k8s.io"]] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims", "resourceslices"],
            "verbs": ["list", "watch"],  # watched only, never read by name
        },
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": ["create"]},
    ]
    assert rules(docs, "hami-dra") == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["get", "list", "watch", "create", "patch", "delete"],
        },
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    ]  # no pods: the monitor has an identity of its own (test_chart_dra_monitor.py)
    classes = [d for d in docs if d["kind"] == "DeviceClass"]
    for d in classes:
        d["metadata"].pop("labels")
    assert classes == device_classes("nvidia.com/gpu")
    ds = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "hami-dra")["spec"]["template"][
        "spec"
    ]
    (c,) = ds["containers"]  # hami monitor runs in a DaemonSet of its own (test_chart_dra_monitor.py)
    assert c["command"][:2] == ["hami", "dra"] and "--kubelet-dir=/var/lib/kubelet" in c["command"]
    mon_ds = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "hami-dra-monitor")
    (mon,) = mon_ds["spec"]["template"]["spec"]["containers"]
    # hami monitor of the claims' regions: HOOK_PATH is the directory the CDI specs mount into
    # containers, <gpuHookPath>/vgpu (its claims/ holds one region per claim)
    assert mon["command"][:2] == ["hami", "monitor"] and mon["ports"] == [{"name": "metrics", "containerPort": 9394}]
    hook = next(e["value"] for e in mon["env"] if e["name"] == "HOOK_PATH")
    # only claims/: libvgpu.so and the preload file beside it go into every GPU container
    assert {m["name"]: m["mountPath"] for m in mon["volumeMounts"]} == {"claims": f"{hook}/claims"}
    assert next(v for v in ds["volumes"] if v["name"] == "hook")["hostPath"]["path"] == hook
    mon_volumes = mon_ds["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in mon_volumes if v["name"] == "claims")["hostPath"]["path"] == f"{hook}/claims"
    assert mon["securityContext"]["capabilities"] == {"drop": ["ALL"]} and not mon["securityContext"].get("privileged")
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "hami-dra-monitor")
    # headless, selecting the agent's pods and the monitor's
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= pod_labels(docs, "hami-dra").items()
    assert svc["spec"]["selector"].items() <= pod_labels(docs, "hami-dra-monitor").items()
    off = render(helm, *DRA, "--set", "dra.monitor.enabled=false")
    assert not [d for d in off if d["metadata"]["name"] == "hami-dra-monitor" and d["kind"] != "Service"]
    assert [
        x["name"]
        for x in next(d for d in off if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "hami-dra")["spec"][
            "template"
        ]["spec"]["containers"]
    ] == ["dra"]
    assert rules(off, "hami-dra") == rules(docs, "hami-dra")
    # the Service stays for the agent's own metrics (dra.metrics), without the monitor's port
    [svc_off] = [d for d in off if d["kind"] == "Service" and d["metadata"]["name"] == "hami-dra-monitor"]
    assert [p["name"] for p in svc_off["spec"]["ports"]] == ["agent-metrics"]
    sc = c["securityContext"]
    assert (
        sc["allowPrivilegeEscalation"] is False
        and sc["capabilities"] == {"drop": ["ALL"], "add": ["DAC_OVERRIDE", "FOWNER"]}  # removes claims' trees
        and not sc.get("privileged")
    )
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["plugins-registry"] == "/var/lib/kubelet/plugins_registry"
    assert mounts["plugins"] == "/var/lib/kubelet/plugins/gpu.hami.io" and mounts["cdi"] == "/var/run/cdi"
    text = (CHART / "templates" / "dra" / "rbac.yaml").read_text().splitlines()
    for i, line in enumerate(text):
        if line.strip().startswith("- apiGroups:"):
            assert text[i - 1].strip().startswith("#"), f"rule without a comment: line {i + 1}"


def test_the_dra_agent_alone_has_every_volume_it_mounts_and_the_driver_mounts(helm):
    docs = render(
        helm,
        *DRA,
        "--set",
        "devicePlugin.enabled=false",
        "--set",
        "devicePlugin.driverMounts[0].hostPath=/opt/drv",
        "--set",
        "devicePlugin.driverMounts[0].containerPath=/usr/local/nvidia",
    )
    assert not [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "hami-device-plugin"]
    ds = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "hami-dra")["spec"]["template"][
        "spec"
    ]
    config_maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    wanted = {v["configMap"]["name"] for v in ds["volumes"] if "configMap" in v}
    assert wanted and wanted <= config_maps, (wanted, config_maps)  # the node config.json too
    (agent,) = ds["containers"]
    assert "--driver-mount=/opt/drv:/usr/local/nvidia:ro" in agent["command"]
    mon_ds = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "hami-dra-monitor")
    mon_pod = mon_ds["spec"]["template"]["spec"]
    (mon,) = mon_pod["containers"]
    for pod, c in ((ds, agent), (mon_pod, mon)):  # NVML for both, each pod with its own volume
        driver = next(v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/opt/drv")
        assert {"name": driver["name"], "mountPath": "/usr/local/nvidia", "readOnly": True} in c["volumeMounts"]


def pod_labels(docs: list[dict], name: str) -> dict:
    ds = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == name)
    return {k: v for k, v in ds["spec"]["template"]["metadata"]["labels"].items() if k.startswith("app.kubernetes.io/")}


def test_an_unknown_front_end_is_refused_by_name(helm):
    out = helm("template", "hami", str(CHART), "--kube-version", "1.34.4", "--set", "frontEnd=both", check=False)
    assert out.returncode != 0 and 'frontEnd: expected extender or dra, got "both"' in out.stderr


def test_dra_objects_pass_server_side_dry_run(kube_cluster, helm, kube_namespace):
    docs = render(helm, *DRA, ns=kube_namespace)
    result = kube_cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(docs)


def test_the_agent_may_write_only_its_own_nodes_slice(kube_cluster, helm, kube_namespace):
    import uuid

    from hami.node.nvml import PhysicalGPU
    from hami.dra.model import SliceSettings, resource_slice, slice_name
    from tests.integration.test_chart import _bearer, _pod_token

    ns, release = kube_namespace, f"d{uuid.uuid4().hex[:6]}"
    agent_sa = f"{release}-hami-dra"
    out = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--kube-version",
        "1.34.4",
        *DRA,
        "--show-only",
        "templates/dra/rbac.yaml",
        "--show-only",
        "templates/dra/slice-guard.yaml",
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole"} <= {d["kind"] for d in docs}
    manifest = yaml.safe_dump_all(docs)
    mine, other = f"{release}-a", f"{release}-b"
    gpus = [PhysicalGPU(0, "GPU-00000000-0000-4000-8000-000000000000", "Tesla T4", 15360, "0000:01:00.0", 0)]

    def apply(token: str, node: str, body: dict | None = None, *, dry_run: bool = False) -> tuple[int, dict]:
        body = body or resource_slice(node, gpus, SliceSettings())
        query = "fieldManager=hami-dra" + ("&dryRun=All" if dry_run else "")
        return _bearer(
            kube_cluster,
            token,
            "PATCH",
            f"/apis/resource.k8s.io/v1/resourceslices/{body['metadata']['name']}?{query}",
            body,
            content_type="application/apply-patch+yaml",
        )

    kube_cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        for n in (mine, other):
            kube_cluster.create_node(n)
        pod = kube_cluster.api(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "agent"},
                "spec": {
                    "nodeName": mine,
                    "serviceAccountName": agent_sa,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "busybox"}],
                },
            },
        )
        token = _pod_token(kube_cluster, ns, agent_sa, pod)
        # the probe is a dry run: before the policy is in force it would otherwise write the slice
        kube_cluster.wait_for(
            lambda: apply(token, other, dry_run=True)[0] in (403, 422),
            "the DRA slice guard in force",
            timeout=60,
            interval=0.5,
        )
        status, body = apply(token, other)
        assert f"on node {mine} may write only the gpu.hami.io ResourceSlice of {mine}" in body["message"], body
        status, body = apply(token, mine)
        assert status in (200, 201), body
        assert body["spec"]["nodeName"] == mine
        # its own slice's name with another node inside is refused too
        forged = resource_slice(other, gpus, SliceSettings())
        forged["metadata"]["name"] = slice_name(mine)
        assert apply(token, mine, forged)[0] in (403, 422)
        # found by review, 1 Dec: and the other node's slice name with its own node inside (taken
        # first, that name would be the other node's agent's no more: a slice's nodeName is immutable)
        squat = resource_slice(mine, gpus, SliceSettings())
        squat["metadata"]["name"] = slice_name(other)
        status, body = apply(token, mine, squat)
        assert (
            status in (403, 422)
            and f"may write only the gpu.hami.io ResourceSlice of {mine}, not {slice_name(other)}" in body["message"]
        ), body
        # its own node's further slices (MIG: <node>-gpu.hami.io-1, ...) are its to write
        part = resource_slice(mine, gpus, SliceSettings())
        part["metadata"]["name"] = slice_name(mine, 1)
        status, body = apply(token, mine, part)
        assert status in (200, 201), body
        assert body["metadata"]["name"] == slice_name(mine, 1) and body["spec"]["nodeName"] == mine
        # a token not bound to a pod names no node: nothing
        unbound = _pod_token(kube_cluster, ns, agent_sa, None)
        status, body = apply(unbound, mine)
        assert status in (403, 422) and "no node-name claim" in body["message"], body
        # nothing was written for the other node
        kube_cluster.api("GET", f"/apis/resource.k8s.io/v1/resourceslices/{slice_name(other)}", expect=(404,))
    finally:
        kube_cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=manifest, check=False)
        for name in (slice_name(mine), slice_name(mine, 1), slice_name(other)):
            kube_cluster.api("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{name}", expect=(200, 404))
        for n in (mine, other):
            kube_cluster.delete_node(n)


def test_the_agents_metrics_port_is_open_by_default_and_a_value_turns_it_off(helm):
    """`dra.metrics`: the agent serves its hami_dra_* families on a named container port, the
    headless Service and the ServiceMonitor carry it; `dra.sweepInterval` reaches the agent."""

    def agent(docs):
        ds = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "hami-dra")
        return next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "dra")

    def service(docs):
        return next((d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "hami-dra-monitor"), None)

    docs = render(helm, *DRA, "--set", "prometheus.enabled=true")
    c = agent(docs)
    assert "--metrics-bind-address=:9396" in c["command"]
    assert not any(a.startswith("--sweep-interval") for a in c["command"])  # the agent's own default
    assert c["ports"] == [{"name": "agent-metrics", "containerPort": 9396}]
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service(docs)["spec"]["ports"]}
    assert ports == {"monitor": (9394, "metrics"), "agent-metrics": (9396, "agent-metrics")}
    sm = next(d for d in docs if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == "hami-dra-monitor")
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["monitor", "agent-metrics"]

    docs = render(
        helm, *DRA, "--set", "dra.metrics.port=9500", "--set", "dra.sweepInterval=30s", "--set", "dra.sweepGrace=2m"
    )
    c = agent(docs)
    assert "--metrics-bind-address=:9500" in c["command"] and "--sweep-interval=30s" in c["command"]
    assert "--sweep-grace=2m" in c["command"]
    assert "--unhealthy-taint=NoSchedule" in c["command"]  # the default
    assert not any(a.startswith("--health-recovery") for a in c["command"])
    c = agent(render(helm, *DRA, "--set", "dra.unhealthyTaint=NoExecute", "--set", "dra.healthRecovery=10m"))
    assert "--unhealthy-taint=NoExecute" in c["command"] and "--health-recovery=10m" in c["command"]
    assert {p["name"]: p["port"] for p in service(docs)["spec"]["ports"]}["agent-metrics"] == 9500

    off = render(helm, *DRA, "--set", "dra.metrics.enabled=false", "--set", "prometheus.enabled=true")
    c = agent(off)
    assert not any(a.startswith("--metrics-bind-address") for a in c["command"]) and "ports" not in c
    assert [p["name"] for p in service(off)["spec"]["ports"]] == ["monitor"]
    # the monitor off too: nothing to scrape, no Service, no ServiceMonitor
    none = render(
        helm,
        *DRA,
        "--set",
        "dra.metrics.enabled=false",
        "--set",
        "dra.monitor.enabled=false",
        "--set",
        "prometheus.enabled=true",
    )
    assert service(none) is None
    assert not [d for d in none if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == "hami-dra-monitor"]
    # only the agent's metrics: the Service carries its port alone
    alone = render(helm, *DRA, "--set", "dra.monitor.enabled=false")
    assert [p["name"] for p in service(alone)["spec"]["ports"]] == ["agent-metrics"]
