"""A HAMi user's values.yaml on this chart (found by a review of the chart): every key of HAMi's
charts/hami/values.yaml (v2.10, both its older layout, vendor names at the top level and the NVIDIA
figures under devicePlugin, and its newer one, everything under devices.<vendor>) either does what
it does in HAMi's chart or stops the install with one line naming it; none is rendered as if
absent. Before, ``scheduler.overwriteEnv=true`` rendered ``overwriteEnv: false``, and
``scheduler.networkPolicy.enabled``, ``selinux.enabled``, ``global.managedNodeSelectorEnable``,
``devicePlugin.hostNetwork``, ``scheduler.kubeQPS``, ``devices.iluvatar.enabled``,
``devices.nvidia.deviceSplitCount``, ``mluResourceName`` (and more below) changed nothing.
Rendered with the helm that `make kube` installs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from hami_devkit.binaries import bin_dir

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"
HELM = bin_dir() / "helm"

pytestmark = pytest.mark.skipif(not HELM.is_file(), reason=f"helm not installed in {HELM.parent} (make kube)")


def render(tmp_path: Path, values: dict | str) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "values.yaml"
    f.write_text(values if isinstance(values, str) else yaml.safe_dump(values))
    args = [str(HELM), "template", "t", str(CHART), "--kube-version", "1.34.4", "-f", str(f)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def docs(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(result.stdout) if d}


def values_with(key: str, value, more: dict) -> dict:
    """``more`` with ``key`` (dotted) set to ``value``, merged below the top level too."""
    out = yaml.safe_load(yaml.safe_dump(more))
    node = out
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


def device_config(d: dict) -> dict:
    return yaml.safe_load(d[("ConfigMap", "t-hami-scheduler-device")]["data"]["device-config.yaml"])


def managed(d: dict) -> set[str]:
    (extender,) = yaml.safe_load(d[("ConfigMap", "t-hami-scheduler")]["data"]["config.yaml"])["extenders"]
    return {r["name"] for r in extender["managedResources"]}


def pod(d: dict, kind: str, name: str) -> dict:
    return d[(kind, name)]["spec"]["template"]["spec"]


def extender_args(d: dict) -> list[str]:
    (c,) = [c for c in pod(d, "Deployment", "t-hami-scheduler")["containers"] if c["name"] != "kube-scheduler"]
    return c["command"]


def pull_secrets(spec: dict) -> list[str]:
    return [s["name"] for s in spec.get("imagePullSecrets", [])]


# (HAMi's key, a value a HAMi user sets, more values of the same file, what this chart must render)
HONOURED = [
    (
        "scheduler.overwriteEnv",
        "true",
        {},
        lambda d: (
            device_config(d)["nvidia"]["overwriteEnv"] is True
            and any(
                w["name"] == "env.vgpu.hami.io"
                for w in d[("MutatingWebhookConfiguration", "t-hami-scheduler-webhook")]["webhooks"]
            )
        ),
    ),
    (
        "global.managedNodeSelectorEnable",
        True,
        {"scheduler": {"nodeLabelSelector": {"gpu": "on"}}},
        lambda d: "--node-label-selector=gpu=on,usage=gpu" in extender_args(d),
    ),
    ("scheduler.kubeTimeout", "17", {}, lambda d: "--kube-timeout=17s" in extender_args(d)),
    ("scheduler.kubeQPS", "100", {}, lambda d: not any("kube-qps" in a for a in extender_args(d))),
    (
        "devicePlugin.hostNetwork",
        True,
        {},
        lambda d: (
            pod(d, "DaemonSet", "t-hami-device-plugin")["hostNetwork"] is True
            and pod(d, "DaemonSet", "t-hami-device-plugin")["dnsPolicy"] == "ClusterFirstWithHostNet"
        ),
    ),
    (
        "devicePlugin.image.pullSecrets",
        ["regcred"],
        {},
        lambda d: (
            "regcred" in pull_secrets(pod(d, "DaemonSet", "t-hami-device-plugin"))
            and "regcred" in pull_secrets(pod(d, "DaemonSet", "t-hami-vgpu-monitor"))
        ),
    ),
    (
        "scheduler.kubeScheduler.image.pullSecrets",
        [{"name": "mirror"}],
        {},
        lambda d: "mirror" in pull_secrets(pod(d, "Deployment", "t-hami-scheduler")),
    ),
    (
        "scheduler.podDisruptionBudget",
        {"maxUnavailable": 1},
        {"scheduler": {"replicas": 2}},
        lambda d: (
            d[("PodDisruptionBudget", "t-hami-scheduler")]["spec"].get("maxUnavailable") == 1
            and "minAvailable" not in d[("PodDisruptionBudget", "t-hami-scheduler")]["spec"]
        ),
    ),
    (
        "mluResourceName",
        "cambricon.com/mlu-x",
        {"devices": {"cambricon": {"enabled": True}}},
        lambda d: (
            device_config(d)["cambricon"]["resourceCountName"] == "cambricon.com/mlu-x"
            and "cambricon.com/mlu-x" in managed(d)
            and "cambricon.com/vmlu" not in managed(d)
        ),
    ),
    (
        "hcuResourceName",
        "hygon.com/hcunum",  # HAMi's chart's name (its code's default is dcunum, as ours)
        {"devices": {"hygon": {"enabled": True}}},
        lambda d: "hygon.com/hcunum" in managed(d),
    ),
    (
        "resourceMem",
        "example.com/vmem",
        {},
        lambda d: (
            "--resource-names=example.com/vmem,nvidia.com/gpu,nvidia.com/gpucores,nvidia.com/gpumem-percentage"
            in pod(d, "DaemonSet", "t-hami-vgpu-monitor")["containers"][0]["command"]
            and not any(
                a.startswith("--resource-name=")
                for a in pod(d, "DaemonSet", "t-hami-vgpu-monitor")["containers"][0]["command"]
            )
        ),
    ),
    (
        "resourceName",  # the monitor's count resource (found by review, 1 Dec)
        "example.com/vgpu",
        {},
        lambda d: (
            device_config(d)["nvidia"]["resourceCountName"] == "example.com/vgpu"
            and "--resource-name=example.com/vgpu"
            in pod(d, "DaemonSet", "t-hami-vgpu-monitor")["containers"][0]["command"]
        ),
    ),
    ("devices.nvidia.deviceSplitCount", 4, {}, lambda d: device_config(d)["nvidia"]["deviceSplitCount"] == 4),
    (
        "devices.kunlun.resourceVCountName",
        "kunlunxin.com/vxpu-x",
        {"devices": {"kunlun": {"enabled": True}}},
        lambda d: "kunlunxin.com/vxpu-x" in managed(d),
    ),
]


@pytest.mark.parametrize("key, value, more, check", HONOURED, ids=[row[0] for row in HONOURED])
def test_hamis_keys_this_chart_has_a_meaning_for_are_honoured(tmp_path, key, value, more, check):
    assert check(docs(render(tmp_path, values_with(key, value, more))))


# (HAMi's key, a value its chart acts on that this one cannot, more values of the same file)
REFUSED = [
    ("scheduler.networkPolicy.enabled", True, {}),
    ("selinux.enabled", True, {}),
    ("platform.openshift", True, {}),
    ("podSecurityPolicy.enabled", True, {}),
    ("mockDevicePlugin.enabled", True, {}),
    ("scheduler.admissionWebhook.manageNamespaceSelector", False, {}),
    ("scheduler.service.monitorTargetPort", "http-metrics", {}),
    ("scheduler.extenderPort", 9555, {}),
    ("scheduler.kubeQPS", "2", {}),
    ("scheduler.kubeBurst", 4, {}),
    ("scheduler.kubeTimeout", "0", {}),
    ("devicePlugin.hostPIDBroker.enabled", True, {}),
    ("devicePlugin.numaRefit.enabled", True, {}),
    ("devicePlugin.reportNodeCapacity", True, {}),
    ("devicePlugin.vgpuCache.gracePeriod", "1m", {}),
    ("devicePlugin.monitor.securityContext", {"privileged": True}, {}),
    ("devices.iluvatar.enabled", True, {}),
    ("devices.remotegpu.enabled", True, {}),
    ("devices.nvidia.runtimeClassName", "nvidia", {}),
    ("devices.nvidia.deviceSplitCount", 0, {}),
    ("metaxsGPUTopologyAware", "true", {}),
    ("mluResourceName", "cambricon.com/mlu-x", {}),  # cambricon is not enabled
    ("devices.hygon.resourceCountName", "hygon.com/x", {}),  # nor hygon
    ("devices.amd.customresources", ["amd.com/other"], {}),
    ("devices.kunlun.customresources", ["kunlunxin.com/other"], {"devices": {"kunlun": {"enabled": True}}}),
]


@pytest.mark.parametrize("key, value, more", REFUSED, ids=[row[0] for row in REFUSED])
def test_hamis_keys_this_chart_cannot_honour_stop_the_install_naming_them(tmp_path, key, value, more):
    result = render(tmp_path, values_with(key, value, more))
    assert result.returncode != 0
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("Error:")]
    assert key in line, line


#: HAMi's values.yaml as its chart ships it (the keys this review is about, at their defaults), in
#: its older layout and in its newer one: both install, and change nothing of this chart's defaults
HAMI_OLDER = """
global: {managedNodeSelectorEnable: false, managedNodeSelector: {usage: gpu}, imagePullSecrets: []}
platform: {openshift: false}
openshift: {securityContextConstraints: {create: true, name: hami-device-plugin}}
selinux: {enabled: false, type: container_file_t, level: s0}
podSecurityPolicy: {enabled: false}
mluResourceName: cambricon.com/vmlu
hcuResourceName: hygon.com/hcunum
hcuResourceMem: hygon.com/hcumem
metaxResourceName: metax-tech.com/sgpu
metaxsGPUTopologyAware: "false"
kunlunResourceName: kunlunxin.com/xpu
scheduler:
  overwriteEnv: "false"
  kubeQPS: ""
  kubeBurst: ""
  kubeTimeout: ""
  podDisruptionBudget: {minAvailable: 1}
  kubeScheduler: {image: {pullSecrets: []}}
  extender: {image: {pullSecrets: []}}
  admissionWebhook: {manageNamespaceSelector: true, whitelistNamespaces: null}
  patch: {enabled: true, runAsUser: 2000}
  service: {monitorTargetPort: metrics}
  networkPolicy: {enabled: false}
devicePlugin:
  gpuOperatorToolkitReady: {securityContext: {privileged: true, runAsUser: 0}}
  monitor: {securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL], add: [SYS_ADMIN]}}}
  numaRefit: {enabled: false, tlsInsecure: true}
  hostPIDBroker: {enabled: false}
  hostNetwork: false
mockDevicePlugin: {enabled: false}
devices:
  amd: {customresources: [amd.com/gpu, amd.com/gpumem, amd.com/gpucores]}
  awsneuron: {customresources: [aws.amazon.com/neuron, aws.amazon.com/neuroncore]}
  kunlun: {enabled: true, customresources: [kunlunxin.com/xpu, kunlunxin.com/vxpu, kunlunxin.com/vxpu-memory]}
  mthreads: {enabled: true, customresources: [mthreads.com/vgpu], memoryPerCard: [96]}
  ascend: {enabled: false, hamiVnpuCore: false, customresources: [huawei.com/Ascend910A]}
  iluvatar: {enabled: false, customresources: [iluvatar.ai/BI-V100-vgpu]}
"""

HAMI_NEWER = """
scheduler: {extenderPort: 9444, profilingBindAddress: "127.0.0.1:6060"}
devicePlugin: {vgpuCache: {gracePeriod: 5m}, reportNodeCapacity: false}
devices:
  metax: {resourceVCountName: metax-tech.com/sgpu, sgpuTopologyAware: false}
  hygon: {memoryFactor: 1, resourceCountName: hygon.com/hcunum}
  nvidia:
    resourceCountName: nvidia.com/gpu
    deviceSplitCount: 10
    deviceMemoryScaling: 1
    runtimeClassName: ""
    createRuntimeClass: false
    migProfileAllowlist: [{models: [A30], profiles: [1g.6gb]}]
  remotegpu: {enabled: false, defaultPort: 14833}
"""


@pytest.mark.parametrize("layout", [HAMI_OLDER, HAMI_NEWER], ids=["older", "newer"])
def test_hamis_own_defaults_install(tmp_path, layout):
    d = docs(render(tmp_path, layout))
    assert device_config(d)["nvidia"]["overwriteEnv"] is False
    assert "hostNetwork" not in pod(d, "DaemonSet", "t-hami-device-plugin")
    assert not any(a.startswith(("--node-label-selector", "--kube-")) for a in extender_args(d))
