"""No HAMi configuration key is "accepted and ignored" (issue 16): each one either changes what a
component does, or the component refuses to start with one line naming the key and the value.
docs/configuration.md lists every key with the test that backs it; this file holds the tests of
the node-agent keys and of every refusal (through the real start-up paths: ``hami scheduler``'s
options and ``hami device-plugin``'s settings)."""

from __future__ import annotations

import argparse
import json

import pynvml
import pytest

from hami.cli import main
from hami.core.errors import ConfigError
from hami.core.types import ContainerDevice
from hami.node import nvml
from hami.deviceplugin.allocate import ContainerView, Grant, PodView, build_response
from hami.node.layout import HookPaths
from hami.deviceplugin.devices import DeviceState
from hami.node.nvml import PhysicalGPU
from hami.node.settings import load_settings
from hami.scheduler.options import add_arguments as scheduler_arguments, options_from_args

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"


def _settings(tmp_path, yaml_text: str = "", node_entry: dict | None = None):
    dc = tmp_path / "device-config.yaml"
    dc.write_text(yaml_text or "nvidia: {resourceCountName: nvidia.com/gpu}\n")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", **(node_entry or {})}]}))
    return load_settings("n1", dc, cfg)


def _response(settings, mem: int = 3000, cores: int = 30):
    pod = PodView("ns", "p", "uid-1", {}, (ContainerView("main"),))
    grant = Grant(
        0, ContainerView("main"), (ContainerDevice(uuid=U0, type="NVIDIA", usedmem=mem, index=0, usedcores=cores),)
    )
    return build_response(pod, grant, settings, HookPaths())


def _state(settings):
    return DeviceState([PhysicalGPU(0, U0, "Tesla T4", 15360, "0000:3b:00.0", 1)], settings)


# ---------------------------------------------------------------------------------------------
# keys that work on the node: each one's effect, from the file a user writes


@pytest.mark.parametrize(
    "yaml_text,node_entry,probe,expected",
    [
        ("nvidia: {deviceSplitCount: 4}\n", None, lambda s: len(_state(s).kubelet_devices()), 4),
        ("", {"devicesplitcount": 3}, lambda s: len(_state(s).kubelet_devices()), 3),
        ("nvidia: {deviceMemoryScaling: 2}\n", None, lambda s: _state(s).registration()[0].devmem, 30720),
        ("nvidia: {deviceMemoryScaling: 2}\n", None, lambda s: _response(s).envs.get("CUDA_OVERSUBSCRIBE"), "true"),
        ("", {"devicememoryscaling": 1.5}, lambda s: _state(s).registration()[0].devmem, 23040),
        ("nvidia: {deviceCoreScaling: 2}\n", None, lambda s: _state(s).registration()[0].devcore, 200),
        ("", {"devicecorescaling": 0.5}, lambda s: _state(s).registration()[0].devcore, 50),
        (
            "nvidia: {disableCoreLimit: true}\n",
            None,
            lambda s: _response(s).envs.get("GPU_CORE_UTILIZATION_POLICY"),
            "disable",
        ),
        (
            "nvidia: {gpuCorePolicy: force}\n",
            None,
            lambda s: _response(s).envs.get("GPU_CORE_UTILIZATION_POLICY"),
            "force",
        ),
        ("nvidia: {libCudaLogLevel: 4}\n", None, lambda s: _response(s).envs.get("LIBCUDA_LOG_LEVEL"), "4"),
        ("", {"libcudaloglevel": "3"}, lambda s: _response(s).envs.get("LIBCUDA_LOG_LEVEL"), "3"),
        ("nvidia: {enableNumaTopology: true}\n", None, lambda s: _state(s).kubelet_devices()[0][2], 1),
        ("", {"enablenumatopology": True}, lambda s: _state(s).kubelet_devices()[0][2], 1),
        ("nvidia: {resourceCountName: example.com/vgpu}\n", None, lambda s: s.socket_name, "nvidia-vgpu.sock"),
        ("nvidia: {resourcePriorityName: example.com/prio}\n", None, lambda s: s.priority_resource, "example.com/prio"),
        ("", {"operatingmode": "mig"}, lambda s: _state(s).registration()[0].mode, "mig"),
        ("", {"enablegetpreferredallocation": True}, lambda s: s.enable_preferred_allocation, True),
        (
            "",
            {"filterdevices": {"uuid": [U0], "index": [1]}},
            lambda s: (s.filter_uuids, s.filter_indexes),
            ({U0}, {1}),
        ),
    ],
)
def test_node_agent_key_takes_effect(tmp_path, yaml_text, node_entry, probe, expected):
    assert probe(_settings(tmp_path, yaml_text, node_entry)) == expected


def test_defaults_leave_those_effects_off(tmp_path):
    s = _settings(tmp_path)
    envs = _response(s).envs
    assert "CUDA_OVERSUBSCRIBE" not in envs and "GPU_CORE_UTILIZATION_POLICY" not in envs
    assert len(_state(s).kubelet_devices()) == 10 and _state(s).kubelet_devices()[0][2] is None


# ---------------------------------------------------------------------------------------------
# preConfiguredDeviceMemory: GPUs whose NVML cannot report memory (unified memory, e.g. GB10)


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def _nvml(monkeypatch, supported: dict[int, int | None]) -> None:
    """NVML with one GPU per entry: total memory in MiB, or None for NVML_ERROR_NOT_SUPPORTED."""

    class _Mem:
        def __init__(self, mib: int) -> None:
            self.total = mib * 1024 * 1024

    class _Pci:
        busId = b"00000000:3B:00.0"

    def memory(handle):
        mib = supported[handle.index]
        if mib is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _Mem(mib)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(supported))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", _Handle)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: f"GPU-{h.index:08d}-0000-0000-0000-000000000000")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPciInfo", lambda h: _Pci())
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: b"NVIDIA GB10")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigMode", lambda h: (0, 0))


@pytest.mark.parametrize(
    "yaml_text,node_entry",
    [
        ("nvidia: {preConfiguredDeviceMemory: 98304}\n", None),
        ("", {"preconfigureddevicememory": 98304}),
    ],
)
def test_preconfigured_device_memory_stands_in_when_nvml_cannot_report_memory(
    tmp_path, monkeypatch, yaml_text, node_entry
):
    _nvml(monkeypatch, {0: None, 1: 16384})
    settings = _settings(tmp_path, yaml_text, node_entry)
    gpus = nvml.discover(settings, tmp_path)
    assert [(g.index, g.memory_mib) for g in gpus] == [(0, 98304), (1, 16384)]  # NVML's figure wins where it has one
    reg = DeviceState(gpus, settings).registration()
    assert [d.devmem for d in reg] == [98304, 16384]


def test_without_preconfigured_device_memory_such_a_gpu_is_skipped(tmp_path, monkeypatch, caplog):
    _nvml(monkeypatch, {0: None, 1: 16384})
    gpus = nvml.discover(_settings(tmp_path), tmp_path)
    assert [g.index for g in gpus] == [1]
    assert "NVML cannot report memory and preconfigureddevicememory is unset; skipped" in caplog.text


# ---------------------------------------------------------------------------------------------
# refused at start-up: one line naming the key and the value


def _plugin_start(capsys, tmp_path, yaml_text: str = "", node_entry: dict | None = None) -> tuple[int, str]:
    dc = tmp_path / "device-config.yaml"
    dc.write_text(yaml_text or "nvidia: {resourceCountName: nvidia.com/gpu}\n")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", **(node_entry or {})}]}))
    code = main(
        [
            "device-plugin",
            "--node-name",
            "n1",
            "--config-file",
            str(dc),
            "--node-config",
            str(cfg),
            "--nvml-library",
            str(tmp_path / "no-nvml.so"),
        ]
    )
    return code, capsys.readouterr().err


def _scheduler_start(tmp_path, yaml_text: str) -> str:
    dc = tmp_path / "device-config.yaml"
    dc.write_text(yaml_text)
    parser = argparse.ArgumentParser()
    scheduler_arguments(parser)
    with pytest.raises(ConfigError) as err:
        options_from_args(parser.parse_args([f"--device-config-file={dc}"]))
    return str(err.value)


def test_operatingmode_mps_stops_the_plugin_before_nvml(capsys, tmp_path):
    code, err = _plugin_start(capsys, tmp_path, node_entry={"operatingmode": "mps"})
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "field 'operatingmode': 'mps' is not supported" in lines[0]
    assert "NVML" not in err  # refused on the configuration, not on the missing driver


@pytest.mark.parametrize(
    "yaml_text,key,value",
    [
        ("metax: {sgpuTopologyAware: true}\n", "metax.sgpuTopologyAware", "True"),
        ("enflame: {resourceNameVGCU: example.com/vgcu}\n", "enflame.resourceNameVGCU", "'example.com/vgcu'"),
        (
            "enflame: {resourceNameVGCUPercentage: example.com/pct}\n",
            "enflame.resourceNameVGCUPercentage",
            "'example.com/pct'",
        ),
    ],
)
def test_unimplemented_vendor_keys_stop_the_scheduler_and_the_plugin(capsys, tmp_path, yaml_text, key, value):
    message = _scheduler_start(tmp_path, yaml_text)
    assert f"{key}: " in message and f"(got {value})" in message and "\n" not in message
    code, err = _plugin_start(capsys, tmp_path, yaml_text)
    assert code == 2 and f"{key}: " in err and len(err.strip().splitlines()) == 1


def test_hamis_stock_values_of_those_keys_are_accepted(tmp_path):
    """HAMi's own device-config.yaml carries the legacy vGCU names and sgpuTopologyAware: false."""
    dc = tmp_path / "device-config.yaml"
    dc.write_text(
        "enflame: {resourceNameVGCU: enflame.com/vgcu, resourceNameVGCUPercentage: enflame.com/vgcu-percentage}\n"
        "metax: {sgpuTopologyAware: false}\n"
    )
    parser = argparse.ArgumentParser()
    scheduler_arguments(parser)
    options_from_args(parser.parse_args([f"--device-config-file={dc}"]))


@pytest.mark.parametrize("flag", ["--gds-enabled", "--nvidia-driver-root=/", "--device-id-strategy=index"])
def test_hami_plugin_flags_we_do_not_have_are_refused_by_name(capsys, flag):
    with pytest.raises(SystemExit) as exc:
        main(["device-plugin", "--node-name", "n1", flag])
    assert exc.value.code == 2
    assert flag.split("=")[0] in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# the webhook routes a vendor's pods exactly when that vendor's section is in device-config.yaml


@pytest.mark.parametrize(
    "sections,routed",
    [
        ({"nvidia": {"resourceCountName": "nvidia.com/gpu"}}, False),
        ({"nvidia": {"resourceCountName": "nvidia.com/gpu"}, "cambricon": {}}, True),
        ({"cambricon": {"resourceCountName": "cambricon.com/mlu-renamed"}}, False),  # renamed: the old name is not ours
    ],
)
def test_webhook_routing_follows_the_enabled_vendors(sections, routed):
    from hami.config import device_config_from_dict
    from hami.vendors import build_vendors
    from hami.webhook.admission import AdmissionSettings, decide

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team"},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {"cambricon.com/vmlu": "1"}}}]},
    }
    decision = decide(pod, AdmissionSettings(build_vendors(device_config_from_dict(sections))))
    assert decision.allowed
    assert ((decision.pod or {}).get("spec", {}).get("schedulerName") == "hami-scheduler") == routed


@pytest.mark.parametrize("flag,shown", [("--kube-qps=5", "5.0"), ("--kube-burst=10", "10"), ("--profiling", "True")])
def test_scheduler_flags_of_hami_it_cannot_honour_are_refused(tmp_path, flag, shown):
    parser = argparse.ArgumentParser()
    scheduler_arguments(parser)
    with pytest.raises(ConfigError) as err:
        options_from_args(parser.parse_args([flag]))
    assert str(err.value).startswith(f"{flag.split('=')[0]}: {shown} is not supported")
    options_from_args(parser.parse_args(["--kube-qps=0", "--kube-burst=0", "--profiling=false"]))  # defaults pass
