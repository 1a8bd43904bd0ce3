"""Every vendor backend through the Helm chart (issue 16, item 1).

- Rendering: the kube-scheduler configuration's ``managedResources`` is exactly the list of
  resource names our vendors read (``hami.vendors.managed_resource_names``) for the device-config
  the chart writes, per vendor alone, all together, renamed through values, and from a
  ``device-config.content`` of the user's; vendors' plugin identities join the allocation guard,
  which keeps exactly the enabled vendors' decision annotations (``BaseVendor.decision_annotations``).
- Install: the chart with all thirteen backends enabled (one resource renamed), its own
  kube-scheduler configuration and webhook run for real (processes, as in test_chart.py), one
  node per vendor carrying that vendor's registration, and one example pod per vendor that names
  no scheduler and no node: each is routed by the webhook, placed on its vendor's node by the
  extender and bound with the annotations HAMi's device plugins read, compared byte for byte.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from hami.config import load_device_config
from hami_devkit.cluster import free_port
from hami.vendors import VENDORS, build_vendors, managed_resource_names

from .test_chart import CHART, KUBE_VERSION, _extender_argv, _Procs, guarded_decision_keys

pytestmark = pytest.mark.integration

SECTIONS = tuple(section for section, _ in VENDORS)


def _values_file(tmp_path: Path, values: dict) -> list[str]:
    path = tmp_path / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(values))
    return ["-f", str(path)]


def _render(helm_bin, *args: str) -> dict[tuple[str, str], dict]:
    out = helm_bin("template", "hami", str(CHART), "--namespace", "gpu", "--kube-version", KUBE_VERSION, *args).stdout
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}


def _managed(docs: dict) -> list[dict]:
    return yaml.safe_load(docs[("ConfigMap", "hami-scheduler")]["data"]["config.yaml"])["extenders"][0][
        "managedResources"
    ]


def _device_config(docs: dict) -> str:
    return docs[("ConfigMap", "hami-scheduler-device")]["data"]["device-config.yaml"]


def _only(*sections: str, **configs: object) -> dict:
    devices: dict = {s: {"enabled": s in sections} for s in SECTIONS}
    for s, cfg in configs.items():
        devices[s]["config"] = cfg
    return {"devices": devices}


RENAMES = {
    "cambricon": {"resourceMemoryName": "cambricon.com/mlu-mem"},
    "hygon": {"resourceCountName": "hygon.com/dcu", "resourceCoreName": ""},  # "" = no core resource
    "metax": {"resourceVCountName": "metax-tech.com/vgpu"},
    "enflame": {"resourceNameGCU": "enflame.com/whole-gcu"},
    "kunlun": {"resourceVMemoryName": "kunlunxin.com/vmem"},
    "awsneuron": {"resourceCoreName": "aws.amazon.com/core"},
    "vastai": {"resourceCountName": "vastaitech.com/card"},
    "iluvatars": [
        {
            "chipName": "BI-V150",
            "commonWord": "BI-V150",
            "resourceCountName": "iluvatar.ai/v150",
            "resourceMemoryName": "iluvatar.ai/v150-mem",
        }
    ],
    "vnpus": {
        "configs": [
            {
                "commonWord": "Ascend910B3",
                "resourceName": "huawei.com/npu",
                "resourceMemoryName": "huawei.com/npu-mem",
                "memoryAllocatable": 65536,
                "memoryCapacity": 65536,
            }
        ]
    },
}

RENDER_CASES = {
    "defaults": {},
    **{f"only-{s}": _only(s) for s in SECTIONS},
    "all": _only(*SECTIONS),
    "all-renamed": {**_only(*SECTIONS, **RENAMES), "resourceMem": "nvidia.com/gpu-memory"},
    "content": {
        "device-config": {
            "content": yaml.safe_dump(
                {
                    "kunlun": {"resourceVCountName": "kunlunxin.com/vxpu2"},
                    "vnpus": {},
                    "nvidia": None,
                    "iluvatars": [],
                    "biren": {"resourceCountName": "birentech.com/br"},
                }
            )
        }
    },
}


@pytest.mark.parametrize("values", list(RENDER_CASES.values()), ids=list(RENDER_CASES))
def test_managed_resources_are_every_name_of_every_enabled_vendor(helm_bin, tmp_path, values):
    docs = _render(helm_bin, *_values_file(tmp_path, values))
    config = load_device_config(_device_config(docs))
    expected = managed_resource_names(build_vendors(config))
    managed = _managed(docs)
    assert [m["name"] for m in managed] == list(expected)
    assert all(m["ignoredByScheduler"] is True for m in managed)


@pytest.mark.parametrize("values", list(RENDER_CASES.values()), ids=list(RENDER_CASES))
def test_the_allocation_guard_keeps_every_decision_annotation_of_every_enabled_vendor(helm_bin, tmp_path, values):
    """The chart spells the vendors' decision keys once more ("hami.decisionAnnotationKeys"): they
    must be those our vendors write for the device-config the chart renders, no more, no fewer
    (NVIDIA's hami.io/vgpu-mig-allocations is in the guard's fixed list)."""
    docs = _render(helm_bin, *_values_file(tmp_path, values))
    config = load_device_config(_device_config(docs))
    expected = {k for v in build_vendors(config) for k in v.decision_annotations} - {"hami.io/vgpu-mig-allocations"}
    policy = docs[("ValidatingAdmissionPolicy", "hami-allocation-guard")]
    assert guarded_decision_keys(policy) == sorted(expected)


def test_renamed_resources_replace_the_defaults(helm_bin, tmp_path):
    names = [m["name"] for m in _managed(_render(helm_bin, *_values_file(tmp_path, RENDER_CASES["all-renamed"])))]
    for renamed in (
        "cambricon.com/mlu-mem",
        "hygon.com/dcu",
        "metax-tech.com/vgpu",
        "enflame.com/whole-gcu",
        "kunlunxin.com/vmem",
        "aws.amazon.com/core",
        "vastaitech.com/card",
        "iluvatar.ai/v150",
        "huawei.com/npu",
        "huawei.com/npu-mem",
        "nvidia.com/gpu-memory",
    ):
        assert renamed in names
    for default in (
        "cambricon.com/mlu.smlu.vmemory",
        "hygon.com/dcunum",
        "hygon.com/dcucores",
        "metax-tech.com/sgpu",
        "enflame.com/gcu",
        "huawei.com/Ascend910B3",
        "iluvatar.ai/BI-V100-vgpu",
        "nvidia.com/gpumem",
    ):
        assert default not in names


def test_nvidia_config_keys_override_the_generated_ones(helm_bin, tmp_path):
    values = {
        "devices": {
            "nvidia": {
                "config": {
                    "deviceSplitCount": 4,
                    "migProfileAllowlist": [{"models": ["A100"], "profiles": ["1g.10gb"]}],
                }
            }
        },
        "devicePlugin": {"deviceSplitCount": 7},
    }
    config = load_device_config(_device_config(_render(helm_bin, *_values_file(tmp_path, values))))
    assert config.nvidia.device_split_count == 4  # devices.nvidia.config wins over devicePlugin.deviceSplitCount
    assert config.nvidia.mig_profile_allowlist[0].profiles == ["1g.10gb"]
    assert config.nvidia.resource_count_name == "nvidia.com/gpu"


def test_a_chart_with_no_vendor_is_refused(helm_bin, tmp_path):
    result = helm_bin(
        "template", "hami", str(CHART), "--kube-version", KUBE_VERSION, *_values_file(tmp_path, _only()), check=False
    )
    assert result.returncode != 0
    assert "device-config.yaml enables no vendor: set devices.<vendor>.enabled" in result.stderr


def test_vendor_plugin_identities_are_trusted_only_when_the_vendor_is_enabled(helm_bin, tmp_path):
    user = "system:serviceaccount:kube-system:hami-ascend-device-plugin"
    values = {
        "devices": {
            "vnpus": {"enabled": True, "devicePluginUsers": [user]},
            "mthreads": {"enabled": False, "devicePluginUsers": ["system:serviceaccount:x:mt"]},
        }
    }
    docs = _render(helm_bin, *_values_file(tmp_path, values))
    trusted = docs[("ValidatingAdmissionPolicy", "hami-allocation-guard")]["spec"]["variables"][0]["expression"]
    assert user in trusted and "system:serviceaccount:x:mt" not in trusted
    assert "system:serviceaccount:gpu:hami-device-plugin" in trusted


# ---------------------------------------------------------------------------------------------
# defaults a HAMi user expects, and HAMi values this chart refuses instead of ignoring


def test_node_monitor_metrics_are_node_port_31992_by_default(helm_bin):
    svc = _render(helm_bin)[("Service", "hami-device-plugin-monitor")]["spec"]
    assert svc["type"] == "NodePort"
    assert svc["ports"] == [{"name": "monitor", "port": 9394, "targetPort": "metrics", "nodePort": 31992}]
    ds = _render(helm_bin)[("DaemonSet", "hami-vgpu-monitor")]["spec"]["template"]["spec"]
    monitor = next(c for c in ds["containers"] if c["name"] == "vgpu-monitor")
    assert {"name": "metrics", "containerPort": 9394} in [
        {k: p[k] for k in ("name", "containerPort")} for p in monitor["ports"]
    ]


def _toolkit_pod(helm_bin, *args: str) -> dict:
    return _render(helm_bin, *args)[("DaemonSet", "hami-device-plugin")]["spec"]["template"]["spec"]


def test_gpu_operator_toolkit_wait_is_off_by_default(helm_bin):
    pod = _toolkit_pod(helm_bin)
    assert [c["name"] for c in pod["initContainers"]] == ["install-libvgpu"]
    assert "toolkit-validations" not in {v["name"] for v in pod["volumes"]}


def test_gpu_operator_toolkit_wait_holds_the_plugin_until_toolkit_ready(helm_bin, tmp_path):
    pod = _toolkit_pod(
        helm_bin,
        "--set",
        "devicePlugin.gpuOperatorToolkitReady.enabled=true",
        "--set",
        "devicePlugin.gpuOperatorToolkitReady.hostPath=/run/nvidia/validations-x",
    )
    first = pod["initContainers"][0]
    assert first["name"] == "toolkit-validation"  # before anything else of the plugin's pod
    assert first["volumeMounts"] == [
        {"name": "toolkit-validations", "mountPath": "/run/nvidia/validations", "readOnly": True}
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["toolkit-validations"]["hostPath"] == {
        "path": "/run/nvidia/validations-x",
        "type": "DirectoryOrCreate",
    }
    # the container's script, run as written against a directory standing in for the mount
    assert first["command"][:2] == ["sh", "-c"]
    script = first["command"][2].replace("/run/nvidia/validations", str(tmp_path))
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == f"Waiting for {tmp_path}/toolkit-ready..."
        assert proc.poll() is None  # still waiting
        (tmp_path / "toolkit-ready").write_text("")
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read().strip().splitlines()[-1] == "toolkit ready"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(
    "setting,message",
    [
        (
            "devicePlugin.gdsEnabled=true",
            "devicePlugin.gdsEnabled=true is not supported by this chart: GPUDirect Storage",
        ),
        ("devicePlugin.gdrcopyEnabled=true", "devicePlugin.gdrcopyEnabled=true is not supported"),
        ("devicePlugin.mofedEnabled=true", "devicePlugin.mofedEnabled=true is not supported"),
        (
            "devicePlugin.nvidiaDriverRoot=/run/nvidia/driver",
            "devicePlugin.nvidiaDriverRoot=/run/nvidia/driver is not supported by this chart: use devicePlugin.driverMounts",
        ),
        ("devicePlugin.nvidiaHookPath=/usr/bin", "devicePlugin.nvidiaHookPath=/usr/bin is not supported"),
        ("devicePlugin.runtimeType=containerd", "devicePlugin.runtimeType=containerd is not supported"),
        (
            "devicePlugin.libPath=/opt/vgpu",
            "devicePlugin.libPath=/opt/vgpu is not supported: libvgpu lives in "
            "<global.gpuHookPath>/vgpu (/usr/local/vgpu here); set global.gpuHookPath instead",
        ),
        (
            "devicePlugin.monitor.ctrPath=/data/regions/containers",
            "devicePlugin.monitor.ctrPath=/data/regions/containers is not supported: the device plugin writes the "
            "regions to <global.gpuHookPath>/vgpu/containers (/usr/local/vgpu/containers here)",
        ),
        (
            "devicePlugin.monitorctrPath=/data/containers",
            "devicePlugin.monitorctrPath=/data/containers is not supported: the device plugin writes the regions",
        ),
        ("devices.ascend.enabled=true", "devices.ascend.enabled=true is HAMi's name: set devices.vnpus.enabled=true"),
        (
            "devicePlugin.deviceListStrategy=cdi",
            "devicePlugin.deviceListStrategy=cdi is not supported: expected envvar, cdi-annotations or cdi-cri",
        ),
    ],
)
def test_hami_values_this_chart_does_not_implement_stop_the_install(helm_bin, setting, message):
    result = helm_bin("template", "hami", str(CHART), "--kube-version", KUBE_VERSION, "--set", setting, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_vendor_switches_beside_a_device_config_content_are_refused(helm_bin, tmp_path):
    values = {
        "device-config": {"content": "nvidia: {resourceCountName: nvidia.com/gpu}\n"},
        "devices": {"cambricon": {"enabled": True}},
    }
    result = helm_bin(
        "template", "hami", str(CHART), "--kube-version", KUBE_VERSION, *_values_file(tmp_path, values), check=False
    )
    assert result.returncode != 0
    assert (
        "devices.cambricon.enabled=true has no effect with device-config.content set: put the cambricon section "
        "in that content"
    ) in result.stderr


@pytest.mark.parametrize("strategy", ["envvar", "cdi-annotations", "cdi-cri"])
def test_device_list_strategy_reaches_the_plugin(helm_bin, strategy):
    pod = _toolkit_pod(helm_bin, "--set", f"devicePlugin.deviceListStrategy={strategy}")
    plugin = next(c for c in pod["containers"] if c["name"] == "device-plugin")
    assert f"--device-list-strategy={strategy}" in plugin["command"]
    cdi = strategy != "envvar"
    assert ("--cdi-spec-dir=/var/run/cdi" in plugin["command"]) == cdi
    assert ({"name": "cdi-specs", "mountPath": "/var/run/cdi"} in plugin["volumeMounts"]) == cdi
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert ("cdi-specs" in volumes) == cdi
    if cdi:
        assert volumes["cdi-specs"]["hostPath"] == {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}


# ---------------------------------------------------------------------------------------------
# one install, thirteen backends, one example pod each


@dataclass(frozen=True)
class VendorCase:
    """A node as that vendor's device plugin registers it, and a pod as its docs show it.
    ``{node}`` in strings is the node's name. ``expected``: the pod's annotations after Bind,
    byte for byte (keys in ``TIMES`` are checked to be numbers)."""

    annotations: dict[str, str]
    allocatable: dict[str, int]
    limits: dict[str, int]
    expected: dict[str, str]
    pod_annotations: dict[str, str] = field(default_factory=dict)


def _j(value: object) -> str:
    return json.dumps(value)


TIMES = {
    "hami.io/vgpu-time",
    "hami.io/bind-time",
    "predicate-time",
    "metax-tech.com/predicate-time",
    "mthreads.com/predicate-time",
    "enflame.com/gcu-assigned-time",
    "NEURON_ALLOC_TIME",
}
_NPUS = [
    {
        "id": "{node}-npu-%d" % i,
        "index": i,
        "count": 4,
        "devmem": 65536,
        "devcore": 20,
        "type": "Ascend910B3",
        "health": True,
        "custominfo": {"NetworkID": 1},
    }
    for i in range(2)
]
_SGPU = {
    "uuid": "sgpu-0",
    "bdf": "0000:0a:00.0",
    "model": "MXC500",
    "totalDevCount": 16,
    "totalCompute": 100,
    "totalVRam": 65536,
    "availableDevCount": 16,
    "availableCompute": 100,
    "availableVRam": 65536,
    "numa": 0,
    "healthy": True,
    "linkZone": 1,
}
_DRS = {
    "devices": [{"index": 0, "minor": 10, "capacity": 6}],
    "profiles": {"1g.8gb": 11, "2g.16gb": 12, "3g.24gb": 13, "6g.48gb": 16},
}


def _pair(key: str, value: str) -> dict[str, str]:
    return {f"hami.io/{key}-devices-allocated": value, f"hami.io/{key}-devices-to-allocate": value}


CASES: dict[str, VendorCase] = {
    "nvidia": VendorCase(
        {
            "hami.io/node-nvidia-register": _j(
                [
                    {
                        "id": "GPU-{node}-0",
                        "index": 0,
                        "count": 10,
                        "devmem": 16384,
                        "devcore": 100,
                        "type": "NVIDIA-Tesla T4",
                        "numa": 0,
                        "mode": "hami-core",
                        "health": True,
                    }
                ]
            )
        },
        {},
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30},
        _pair("vgpu", "GPU-{node}-0,NVIDIA,3000,30:;"),
    ),
    "vnpus": VendorCase(
        {"hami.io/node-register-Ascend910B3": _j(_NPUS)},
        {"huawei.com/Ascend910B3": 2},
        {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 12000},
        {
            **_pair("Ascend910B3", "{node}-npu-0,Ascend910B3,16384,0:;"),
            "huawei.com/Ascend910B3": '[{"UUID":"{node}-npu-0","temp":"vir05_1c_16g"}]',
        },
    ),
    "cambricon": VendorCase(
        {},
        {"cambricon.com/mlu.smlu.vcore": 400, "cambricon.com/mlu.smlu.vmemory": 1536, "cambricon.com/vmlu": 400},
        {"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 4, "cambricon.com/mlu.smlu.vcore": 10},
        {
            **_pair("cambricon-mlu", "{node}-cambricon-mlu-0,MLU,1024,10:;"),
            "CAMBRICON_DSMLU_PROFILE": "0_10_4",
            "CAMBRICON_DSMLU_ASSIGNED": "false",
            "CAMBRICON_DSMLU_ASSIGHED": "false",
        },
    ),
    # renamed in this install: hygon.resourceMemoryName = hygon.com/dcu-memory
    "hygon": VendorCase(
        {
            "hami.io/node-dcu-register": "DCU-{node}-a,4,16368,100,DCU-Z100,0,true:DCU-{node}-b,4,16368,100,DCU-Z100,1,true,1,hami-core:"
        },
        {},
        {"hygon.com/dcunum": 1, "hygon.com/dcu-memory": 4000, "hygon.com/dcucores": 20},
        _pair("dcu", "DCU-{node}-b,DCU,4000,20:;"),
    ),  # equal scores: NUMA 1 before NUMA 0, as HAMi
    "iluvatars": VendorCase(
        {"hami.io/node-BI-V100-register": "ilu-{node}-0,16,32768,100,BI-V100,0,true,0,hami-core:"},
        {},
        {"iluvatar.ai/BI-V100-vgpu": 1, "iluvatar.ai/BI-V100.vMem": 16, "iluvatar.ai/BI-V100.vCore": 50},
        _pair("BI-V100", "ilu-{node}-0,BI-V100,4096,50:;"),
    ),
    "metax": VendorCase(
        {"metax-tech.com/node-gpu-devices": _j([{**_SGPU, "uuid": "sgpu-{node}"}])},
        {},
        {"metax-tech.com/sgpu": 1, "metax-tech.com/vmemory": 4, "metax-tech.com/vcore": 30},
        {
            **_pair("metax-sgpu", "sgpu-{node},Metax-SGPU,4096,30:;"),
            "metax-tech.com/gpu-devices-allocated": '[[{"uuid":"sgpu-{node}","compute":30,"vRam":4096}]]',
            "metax-tech.com/predicate-time": "",
            "metax-tech.com/sgpu-qos-policy": "best-effort",
        },
    ),  # webhook default
    "mthreads": VendorCase(
        {},
        {"mthreads.com/sgpu-core": 32, "mthreads.com/sgpu-memory": 192, "mthreads.com/vgpu": 200},
        {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 8, "mthreads.com/sgpu-core": 4},
        {
            "hami.io/mthreads-vgpu-devices-allocated": "{node}-mthreads-0,Mthreads,4096,4:;",
            "mthreads.com/gpu-index": "0",
            "mthreads.com/predicate-time": "",
            "mthreads.com/predicate-node": "{node}",
        },
    ),
    "enflame": VendorCase(
        {"enflame.com/gcu-drs-capacity": _j(_DRS)},
        {},
        {"enflame.com/drs-gcu": 2},
        {
            "hami.io/enflame-vgpu-devices-allocated": "{node}-enflame-drs-0,Enflame,16384,2:;",
            "enflame.com/gcu-request-size": "2",
            "enflame.com/gcu-assigned-id": "0",
            "enflame.com/gcu-assigned": "false",
            "enflame.com/gcu-assigned-index": "0",
            "enflame.com/gcu-assigned-minor": "10",
            "enflame.com/gcu-assigned-time": "",
            "assigned-containers": '{"main":{"allocated":false,"request":2,"profileID":"12","profileName":"2g.16gb"}}',
        },
    ),
    "kunlun": VendorCase(
        {},
        {"kunlunxin.com/xpu": 8},
        {"kunlunxin.com/xpu": 2},
        {
            "hami.io/kunlun-allocated": "{node}-kunlun-0,kunlun,98304,100:{node}-kunlun-1,kunlun,98304,100:;",
            "BAIDU_COM_DEVICE_IDX": "0,1",
        },
    ),
    "amd": VendorCase(
        {
            "hami.io/node-amd-register": _j(
                [
                    {
                        "id": "amd-{node}-0",
                        "index": 0,
                        "count": 10,
                        "devmem": 196608,
                        "devcore": 304,
                        "type": "AMD Instinct MI300X",
                        "health": True,
                    }
                ]
            )
        },
        {},
        {"amd.com/gpu": 1, "amd.com/gpumem": 8192, "amd.com/gpucores": 25},
        _pair("amd", "amd-{node}-0,AMD Instinct MI300X,8192,76:;"),
    ),
    "awsneuron": VendorCase(
        {},
        {"aws.amazon.com/neuron": 2, "aws.amazon.com/neuroncore": 4},
        {"aws.amazon.com/neuroncore": 1},
        {
            "hami.io/aws-neuron-devices-allocated": "{node}-AWSNeuron-0,AWSNeuron,0,1:;",
            "AWS_NEURON_IDS": "0",
            "NEURON_ALLOC_TIME": "",
            "NEURON_ALLOCATED": "false",
            "NEURON_RESOURCE_TYPE": "aws.amazon.com/neuroncore",
            "aws.amazon.com/predicate-node": "{node}",
        },
    ),
    "vastai": VendorCase(
        {
            "hami.io/node-va-register": _j(
                [
                    {
                        "id": "{node}-va-0",
                        "index": 0,
                        "count": 4,
                        "devmem": 32768,
                        "devcore": 7,
                        "type": "VA1-V",
                        "health": True,
                    }
                ]
            )
        },
        {},
        {"vastaitech.com/va": 1},
        _pair("Vastai", "{node}-va-0,Vastai,32768,0:;"),
    ),
    "biren": VendorCase(
        {
            "hami.io/node-biren-register": _j(
                [
                    {
                        "id": "{node}-br-0",
                        "index": 0,
                        "count": 4,
                        "devmem": 32768,
                        "devcore": 7,
                        "type": "BR104",
                        "health": True,
                    }
                ]
            )
        },
        {},
        {"birentech.com/gpu": 1},
        _pair("Biren", "{node}-br-0,Biren,32768,0:;"),
    ),
}


def test_every_backend_has_an_install_case():
    assert set(CASES) == set(SECTIONS) and len(SECTIONS) == 13


def _fill(value: str, node: str) -> str:
    return value.replace("{node}", node)


def _bound(kube_cluster, ns: str, name: str) -> dict | None:
    pod = kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    return pod if pod["spec"].get("nodeName") else None


def _install_values(release: str, port: int, metrics_port: int, loopback: int) -> dict:
    """All thirteen backends (Hygon's memory resource renamed); the webhook sees this test's pods only."""
    values = _only(*SECTIONS, hygon={"resourceMemoryName": "hygon.com/dcu-memory"})
    values.update(
        {
            "schedulerName": f"hami-{release}",
            "scheduler": {
                "service": {"httpTargetPort": port},
                "extender": {"loopbackPort": loopback},
                "metricsBindAddress": f":{metrics_port}",
                "allocationGuard": {"enabled": False},
                "admissionWebhook": {
                    "customURL": {"enabled": True, "port": port},
                    "objectSelector": {
                        "matchExpressions": [{"key": "hami-vendor-test", "operator": "In", "values": [release]}]
                    },
                },
            },
            "devicePlugin": {"nvidiaNodeSelector": {"hami-vendor-test": "none"}},
        }
    )
    return values


def _start_chart_scheduler(
    kube_cluster, ns: str, full: str, tmp_path: Path, procs: _Procs, ports: tuple[int, int, int]
) -> dict:
    """The installed Deployment's two containers as processes (kwok runs no containers): `hami
    scheduler` with its chart arguments, certificate and device-config.yaml, kube-scheduler with the
    chart's configuration. Returns that configuration once the extender is ready."""
    import ssl

    port, metrics_port, loopback = ports
    secret = kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/secrets/{full}-scheduler-tls")
    files: dict[str, Path] = {}
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
        files[f"/tls/{key}"] = tmp_path / key
    device_cm = kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/configmaps/{full}-scheduler-device")
    (tmp_path / "device-config.yaml").write_text(device_cm["data"]["device-config.yaml"])
    files["/device-config.yaml"] = tmp_path / "device-config.yaml"
    config = yaml.safe_load(
        kube_cluster.api("GET", f"/api/v1/namespaces/{ns}/configmaps/{full}-scheduler")["data"]["config.yaml"]
    )
    (tmp_path / "kube-scheduler.yaml").write_text(
        yaml.safe_dump({**config, "clientConnection": {"kubeconfig": str(kube_cluster.kubeconfig)}})
    )
    deploy = kube_cluster.api("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{full}-scheduler")
    ext = procs.start(
        "hami-scheduler",
        _extender_argv(deploy, files, kube_cluster.kubeconfig, port, metrics_port, loopback),
        env={"PYTHONPATH": str(Path(CHART).parents[1] / "src"), "POD_NAME": "", "POD_NAMESPACE": ns},
    )
    procs.start(
        "kube-scheduler",
        [
            str(kube_cluster.binaries["kube-scheduler"]),
            f"--config={tmp_path / 'kube-scheduler.yaml'}",
            f"--authentication-kubeconfig={kube_cluster.kubeconfig}",
            f"--authorization-kubeconfig={kube_cluster.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
        ],
    )
    ca = ssl.create_default_context(cadata=base64.b64decode(secret["data"]["ca.crt"]).decode())

    def ready() -> bool:
        assert ext.poll() is None, procs.logs()
        try:
            return urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ca, timeout=2).status == 200
        except OSError:
            return False

    kube_cluster.wait_for(ready, "hami scheduler (chart arguments, 13 vendors) ready", timeout=60)
    return config


def _example_pod(section: str, case: VendorCase, release: str) -> dict:
    """No schedulerName, no node: the chart's webhook and scheduler must route and place it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": section,
            "labels": {"hami-vendor-test": release},
            "annotations": dict(case.pod_annotations),
        },
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"hami-vendor-test": release},
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {k: str(v) for k, v in case.limits.items()}},
                }
            ],
        },
    }


def _assert_bound_as_hami(bound: dict, section: str, case: VendorCase, node: str) -> None:
    assert bound["spec"]["nodeName"] == node, section
    ann = dict(bound["metadata"]["annotations"])
    for key in TIMES & set(ann):
        assert ann.pop(key).isdigit(), (section, key)
    expected = {k: _fill(v, node) for k, v in case.expected.items() if k not in TIMES}
    expected.update({"hami.io/vgpu-node": node, "hami.io/bind-phase": "allocating"})
    assert ann == expected, section
    assert TIMES & set(case.expected) <= set(bound["metadata"]["annotations"]), section


def test_one_install_schedules_every_vendors_example_pod_through_the_chart(
    kube_cluster, helm_bin, kube_namespace, tmp_path
):
    ns, release = kube_namespace, f"v{uuid.uuid4().hex[:6]}"
    ports = (free_port(), free_port(), free_port())
    helm_bin(
        "install",
        release,
        str(CHART),
        "--namespace",
        ns,
        *_values_file(tmp_path, _install_values(release, *ports)),
        extra_env=kube_cluster.env(),
    )
    procs = _Procs(tmp_path)
    nodes = {section: f"{release}-{section}" for section in CASES}
    try:
        config = _start_chart_scheduler(kube_cluster, ns, f"{release}-hami", tmp_path, procs, ports)
        managed = {m["name"] for m in config["extenders"][0]["managedResources"]}
        for case in CASES.values():  # every example pod's resources go to the extender
            assert set(case.limits) <= managed, set(case.limits) - managed
        for section, case in CASES.items():
            kube_cluster.create_node(
                nodes[section],
                labels={"hami-vendor-test": release},
                annotations={k: _fill(v, nodes[section]) for k, v in case.annotations.items()},
                allocatable=dict(case.allocatable),
            )
        for section, case in CASES.items():
            created = kube_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", _example_pod(section, case, release))
            assert created["spec"]["schedulerName"] == f"hami-{release}", f"{section}: the webhook did not route it"
        for section, case in CASES.items():
            bound = kube_cluster.wait_for(lambda: _bound(kube_cluster, ns, section), f"{section} pod bound", timeout=90)
            _assert_bound_as_hami(bound, section, case, nodes[section])
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop()
        for node in nodes.values():
            kube_cluster.delete_node(node)
        helm_bin("uninstall", release, "--namespace", ns, extra_env=kube_cluster.env(), check=False)


def test_mig_strategy_value_reaches_the_plugin_and_node_events_are_allowed_in_default_only(helm_bin):
    def plugin_args(*args: str) -> list[str]:
        pod = _render(helm_bin, *args)[("DaemonSet", "hami-device-plugin")]["spec"]["template"]["spec"]
        return next(c for c in pod["containers"] if c["name"] == "device-plugin")["command"]

    assert not [a for a in plugin_args() if a.startswith("--mig-strategy")]  # config.json decides
    assert "--mig-strategy=mixed" in plugin_args("--set", "devicePlugin.migStrategy=mixed")
    docs = _render(helm_bin)
    role = docs[("Role", "hami-device-plugin-node-events")]
    assert role["metadata"]["namespace"] == "default"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    binding = docs[("RoleBinding", "hami-device-plugin-node-events")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hami-device-plugin", "namespace": "gpu"}]


@pytest.mark.parametrize(
    "settings",
    [
        ("devicePlugin.monitor.ctrPath=/usr/local/vgpu/containers",),
        ("devicePlugin.monitorctrPath=/usr/local/vgpu/containers/",),
        ("global.gpuHookPath=/opt/hook", "devicePlugin.monitor.ctrPath=/opt/hook/vgpu/containers"),
    ],
)
def test_a_region_path_where_the_plugin_writes_them_is_accepted(helm_bin, settings):
    args = [a for s in settings for a in ("--set", s)]
    result = helm_bin("template", "hami", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert result.returncode == 0, result.stderr
    hook = next((s.split("=", 1)[1] for s in settings if s.startswith("global.gpuHookPath=")), "/usr/local")
    daemonsets = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in yaml.safe_load_all(result.stdout)
        if d and d["kind"] == "DaemonSet"
    }
    pod = daemonsets["hami-vgpu-monitor"]  # the monitor's own DaemonSet
    (monitor,) = [c for c in pod["containers"] if c["command"][:2] == ["hami", "monitor"]]
    # the monitor reads <HOOK_PATH>/containers, mounted from the host directory the plugin writes
    assert {e["name"]: e.get("value") for e in monitor["env"]}["HOOK_PATH"] == f"{hook}/vgpu"
    volume = next(v for v in pod["volumes"] if v["name"] == "containers")
    assert volume["hostPath"]["path"] == f"{hook}/vgpu/containers"
    plugin_hook = next(v for v in daemonsets["hami-device-plugin"]["volumes"] if v["name"] == "hook")
    assert f"{plugin_hook['hostPath']['path']}/containers" == volume["hostPath"]["path"]
    assert any(
        m["name"] == "containers" and m["mountPath"] == f"{hook}/vgpu/containers" for m in monitor["volumeMounts"]
    )


@pytest.mark.parametrize("host,field", [("webhook.example.com", "dnsNames"), ("10.0.0.7", "ipAddresses")])
def test_cert_manager_names_the_custom_webhook_host(helm_bin, host, field):
    """With customURL the API server calls https://<host>:<port>/webhook, so the serving
    certificate must name that host whoever makes it (the chart itself, or cert-manager)."""
    sets = ["scheduler.certManager.enabled=true", "scheduler.admissionWebhook.customURL.enabled=true"]
    sets.append(f"scheduler.admissionWebhook.customURL.host={host}")
    args = [a for s in sets for a in ("--set", s)]
    result = helm_bin("template", "hami", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert result.returncode == 0, result.stderr
    (serving,) = [
        d
        for d in yaml.safe_load_all(result.stdout)
        if d and d["kind"] == "Certificate" and d["metadata"]["name"].endswith("-serving")
    ]
    assert host in serving["spec"][field]
    other = "ipAddresses" if field == "dnsNames" else "dnsNames"
    assert host not in serving["spec"][other]
    assert "127.0.0.1" in serving["spec"]["ipAddresses"]
    assert "hami-scheduler.default.svc" in serving["spec"]["dnsNames"]


@pytest.mark.parametrize(
    "extra",
    [
        (
            "scheduler.certManager.enabled=true",
            "prometheus.enabled=true",
            "grafana.dashboard.enabled=true",
            "scheduler.ui.enabled=true",
            "devicePlugin.createRuntimeClass=true",
            "scheduler.service.annotations.own=kept",
            "scheduler.service.annotations.example\\.com/owner=service-wins",
        ),
        ("frontEnd=dra", "dra.enabled=true", "devicePlugin.enabled=false", "prometheus.enabled=true"),
    ],
)
def test_global_annotations_are_on_every_object_under_its_own(helm_bin, extra):
    """HAMi's ``global.annotations``: on every object the chart makes; an object's own annotations
    (a Service's, cert-manager's CA injection) are kept and win on the same key. Without it, no
    object gets an empty ``annotations``."""
    sets = ["global.annotations.example\\.com/owner=team-a", *extra]
    args = [a for s in sets for a in ("--set", s)]
    result = helm_bin("template", "hami", str(CHART), "--kube-version", KUBE_VERSION, *args, check=False)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert len(docs) > 10
    owners = {(d["kind"], d["metadata"]["name"]): (d["metadata"].get("annotations") or {}) for d in docs}
    scheduler_service = owners.pop(("Service", "hami-scheduler"))
    assert all(a.get("example.com/owner") == "team-a" for a in owners.values()), owners
    if "frontEnd=dra" not in extra:
        assert scheduler_service == {"own": "kept", "example.com/owner": "service-wins"}
        webhook = owners[("MutatingWebhookConfiguration", "hami-scheduler-webhook")]
        assert webhook["cert-manager.io/inject-ca-from"] == "default/hami-scheduler-serving"
    plain_args = [a for s in extra if "owner" not in s for a in ("--set", s)]
    plain = helm_bin("template", "hami", str(CHART), "--kube-version", KUBE_VERSION, *plain_args, check=False)
    assert plain.returncode == 0, plain.stderr
    for d in (d for d in yaml.safe_load_all(plain.stdout) if d):
        assert "example.com/owner" not in (d["metadata"].get("annotations") or {})
        assert "annotations" not in d["metadata"] or d["metadata"]["annotations"], d["metadata"]
