"""Node settings (device-config.yaml + config.json), kubelet IDs, registration annotation."""

import json
from datetime import datetime

import pytest

from hami.core.codec import decode_node_devices_json, encode_node_devices_json
from hami.deviceplugin.devices import DeviceState, physical_id, plugin_ids
from hami.node.nvml import PhysicalGPU, numa_node, sysfs_bus_id
from hami.node.settings import NodeConfigError, NodeSettings, load_settings
from hami.deviceplugin.register import HANDSHAKE, REGISTER, registration_patch

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_follow_the_chart_without_files(tmp_path):
    s = load_settings("n1", tmp_path / "missing.yaml", tmp_path / "missing.json")
    assert (s.device_split_count, s.device_memory_scaling, s.libcuda_log_level, s.socket_name) == (10, 1.0, "1", "nvidia-gpu.sock")


def test_node_entry_overrides_yaml(tmp_path):
    yml = write(tmp_path, "dc.yaml", "nvidia:\n  resourceCountName: example.com/vgpu\n  deviceSplitCount: 4\n  deviceMemoryScaling: 1.5\n")
    cfg = write(tmp_path, "config.json", json.dumps({"nodeconfig": [
        {"name": "other", "devicesplitcount": "bogus"},
        {"name": "n1", "devicesplitcount": 7, "operatingmode": "hami-core", "enablenumatopology": True,
         "filterdevices": {"uuid": [U0], "index": [3]}, "enablegetpreferredallocation": True},
    ]}))
    s = load_settings("n1", yml, cfg)
    assert s.resource_name == "example.com/vgpu" and s.socket_name == "nvidia-vgpu.sock"
    assert (s.device_split_count, s.device_memory_scaling, s.enable_numa_topology) == (7, 1.5, True)
    assert s.filter_uuids == {U0} and s.filter_indexes == {3} and s.enable_preferred_allocation


@pytest.mark.parametrize("entry, field", [
    ({"name": "n1", "devicesplitcount": 0}, "devicesplitcount"),
    ({"name": "n1", "operatingmode": "turbo"}, "operatingmode"),
    ({"name": "n1", "devicememoryscaling": -1}, "devicememoryscaling"),
])
def test_bad_node_entry_names_field_and_value(tmp_path, entry, field):
    cfg = write(tmp_path, "config.json", json.dumps({"nodeconfig": [entry]}))
    with pytest.raises(NodeConfigError, match=rf"nodeconfig\[0\] \(node 'n1'\): field '{field}'.*got"):
        load_settings("n1", None, cfg)


def test_bad_files(tmp_path):
    with pytest.raises(NodeConfigError, match="not valid"):
        load_settings("n1", None, write(tmp_path, "c.json", "{nope"))
    with pytest.raises(NodeConfigError, match="'nodeconfig' must be a list"):
        load_settings("n1", None, write(tmp_path, "d.json", '{"nodeconfig": 3}'))
    with pytest.raises(NodeConfigError, match="deviceSplitCount"):
        load_settings("n1", write(tmp_path, "dc.yaml", "nvidia:\n  deviceSplitCount: lots\n"), None)


def test_kubelet_ids_and_physical_ids():
    ids = plugin_ids(U0, 3)
    assert ids == [f"{U0}-0", f"{U0}-1", f"{U0}-2"]
    assert {physical_id(i) for i in ids} == {U0} and physical_id(U0) == U0 and physical_id(f"{U0}::2") == U0


def test_sysfs_numa(tmp_path):
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    d = tmp_path / "bus/pci/devices/0000:3b:00.0"
    d.mkdir(parents=True)
    (d / "numa_node").write_text("1\n")
    assert numa_node(tmp_path, "0000:3b:00.0") == 1
    (d / "numa_node").write_text("-1\n")
    assert numa_node(tmp_path, "0000:3b:00.0") == 0
    assert numa_node(tmp_path, "0000:00:00.0") == 0


GPUS = [PhysicalGPU(0, U0, "Tesla T4", 15360, "0000:3b:00.0", 1),
        PhysicalGPU(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", "NVIDIA A100", 40960, "0000:5e:00.0", 0)]


async def test_registration_content_and_health():
    s = NodeSettings(device_split_count=4, device_memory_scaling=2.0, device_core_scaling=1.5, enable_numa_topology=True)
    state = DeviceState(GPUS, s)
    devs = decode_node_devices_json(encode_node_devices_json(state.registration()))
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.numa, d.mode, d.health) for d in devs] == [
        (U0, 0, 4, 30720, 150, "NVIDIA-Tesla T4", 1, "hami-core", True),
        (GPUS[1].uuid, 1, 4, 81920, 150, "NVIDIA A100", 0, "hami-core", True),
    ]
    assert len(state.kubelet_devices()) == 8 and state.kubelet_devices()[0] == (f"{U0}-0", True, 1)
    v = state.version
    await state.mark_unhealthy([U0, "GPU-unknown"])
    assert state.version == v + 1 and not state.healthy(U0)
    await state.mark_unhealthy([U0])  # no change, no wake-up
    assert state.version == v + 1
    assert all(not h for i, h, _ in state.kubelet_devices() if i.startswith(U0))


def test_registration_patch_only_when_changed():
    from hami.kube.nodelock import LOCK_HANDOFF

    state = DeviceState(GPUS, NodeSettings())
    now = datetime(2026, 1, 2, 3, 4, 5)
    first = registration_patch(state, {}, now)
    assert set(first) == {REGISTER, HANDSHAKE, LOCK_HANDOFF} and first[HANDSHAKE] == "Reported 2026-01-02 03:04:05"
    assert first[LOCK_HANDOFF] == "swap"
    written = {REGISTER: first[REGISTER], LOCK_HANDOFF: "swap"}
    assert registration_patch(state, {**written, HANDSHAKE: "Requesting_2026-01-02 03:04:00"}, now) is None
    stale = registration_patch(state, {**written, HANDSHAKE: "Deleted_2026-01-01 00:00:00"}, now)
    assert stale == {HANDSHAKE: "Reported 2026-01-02 03:04:05"}
    # --lock-release-delay=0: the declaration is withdrawn (and never written)
    assert registration_patch(state, {**written, HANDSHAKE: "Reported x"}, now, handoff=False) == {LOCK_HANDOFF: None}
    assert LOCK_HANDOFF not in registration_patch(state, {}, now, handoff=False)


def test_mps_operating_mode_is_refused_with_one_line_naming_the_key(tmp_path):
    """HAMi accepts ``operatingmode: mps`` and does nothing with it; we refuse to start instead."""
    cfg = write(tmp_path, "config.json", json.dumps({"nodeconfig": [{"name": "n1", "operatingmode": "mps"}]}))
    with pytest.raises(NodeConfigError) as err:
        load_settings("n1", None, cfg)
    message = str(err.value)
    assert "\n" not in message
    assert message == (f"config.json {cfg} nodeconfig[0] (node 'n1'): field 'operatingmode': 'mps' is not supported "
                       "(no MPS control daemon is run, so pods would get the whole GPU with no limit); use hami-core")
    # another node's MPS entry does not stop this node
    assert load_settings("n2", None, cfg).operating_mode == "hami-core"


def test_mig_settings_come_from_both_files(tmp_path):
    """nvidia.migProfileAllowlist (device-config.yaml) narrows the registered MIG profiles;
    migstrategy comes from config.json."""
    yaml = tmp_path / "device-config.yaml"
    yaml.write_text("nvidia:\n  migProfileAllowlist:\n    - models: [A100-SXM4-40GB]\n      profiles: [1g.5gb, 3g.20gb]\n"
                    "    - models: [H100]\n")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", "migstrategy": "mixed"}]}))
    s = load_settings("n1", yaml, cfg)
    assert s.mig_allowlist == ((("A100-SXM4-40GB",), ("1g.5gb", "3g.20gb")), (("H100",), ()))
    assert s.mig_strategy == "mixed"
    assert load_settings("n2", yaml, cfg).mig_strategy == "none"


def test_registration_patch_writes_the_scores_when_they_change():
    from hami.deviceplugin.register import SCORE

    now = datetime(2026, 1, 2, 3, 4, 5)
    state = DeviceState(GPUS, NodeSettings(), {GPUS[0].uuid: {GPUS[1].uuid: 250}, GPUS[1].uuid: {GPUS[0].uuid: 250}})
    first = registration_patch(state, {}, now)
    assert json.loads(first[SCORE]) == [{"uuid": GPUS[0].uuid, "score": {GPUS[1].uuid: 250}},
                                        {"uuid": GPUS[1].uuid, "score": {GPUS[0].uuid: 250}}]
    written = {k: v for k, v in first.items() if v is not None}
    assert registration_patch(state, written, now) is None
    assert SCORE not in (registration_patch(DeviceState(GPUS, NodeSettings()), {}, now) or {})
