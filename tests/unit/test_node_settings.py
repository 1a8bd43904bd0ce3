"""Node settings (hami.node.settings: device-config.yaml's nvidia section + this node's config.json
entry) and the sysfs side of discovery (hami.node.nvml); moved from test_deviceplugin_config.py
with the code."""

import json

import pytest

from hami.node.nvml import numa_node, sysfs_bus_id
from hami.node.settings import NodeConfigError, load_settings

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_follow_the_chart_without_files(tmp_path):
    s = load_settings("n1", tmp_path / "missing.yaml", tmp_path / "missing.json")
    assert (s.device_split_count, s.device_memory_scaling, s.libcuda_log_level, s.socket_name) == (
        10,
        1.0,
        "1",
        "nvidia-gpu.sock",
    )


def test_node_entry_overrides_yaml(tmp_path):
    yml = write(
        tmp_path,
        "dc.yaml",
        "nvidia:\n  resourceCountName: example.com/vgpu\n  deviceSplitCount: 4\n  deviceMemoryScaling: 1.5\n",
    )
    cfg = write(
        tmp_path,
        "config.json",
        json.dumps(
            {
                "nodeconfig": [
                    {"name": "other", "devicesplitcount": "bogus"},
                    {
                        "name": "n1",
                        "devicesplitcount": 7,
                        "operatingmode": "hami-core",
                        "enablenumatopology": True,
                        "filterdevices": {"uuid": [U0], "index": [3]},
                        "enablegetpreferredallocation": True,
                    },
                ]
            }
        ),
    )
    s = load_settings("n1", yml, cfg)
    assert s.resource_name == "example.com/vgpu" and s.socket_name == "nvidia-vgpu.sock"
    assert (s.device_split_count, s.device_memory_scaling, s.enable_numa_topology) == (7, 1.5, True)
    assert s.filter_uuids == {U0} and s.filter_indexes == {3} and s.enable_preferred_allocation


@pytest.mark.parametrize(
    "entry, field",
    [
        ({"name": "n1", "devicesplitcount": 0}, "devicesplitcount"),
        ({"name": "n1", "operatingmode": "turbo"}, "operatingmode"),
        ({"name": "n1", "devicememoryscaling": -1}, "devicememoryscaling"),
        # unbounded, 1e308 made the registration infinity: an OverflowError at every start
        ({"name": "n1", "devicememoryscaling": 1e308}, "devicememoryscaling"),
        ({"name": "n1", "devicecorescaling": 1001}, "devicecorescaling"),
    ],
)
def test_bad_node_entry_names_field_and_value(tmp_path, entry, field):
    cfg = write(tmp_path, "config.json", json.dumps({"nodeconfig": [entry]}))
    with pytest.raises(NodeConfigError, match=rf"nodeconfig\[0\] \(node 'n1'\): field '{field}'.*got"):
        load_settings("n1", None, cfg)


def test_node_entry_keys_are_read_in_any_case_as_hamis_go_decoder_reads_them(tmp_path):
    """HAMi's device plugin decodes config.json with Go's encoding/json, which matches keys in any
    case: a file written with camel-case keys configures the node there, and did nothing here."""
    cfg = write(
        tmp_path,
        "config.json",
        json.dumps(
            {
                "NodeConfig": [
                    {
                        "Name": "n1",
                        "deviceSplitCount": 4,
                        "deviceMemoryScaling": 2,
                        "libCudaLogLevel": 3,
                        "FilterDevices": {"UUID": [U0]},
                    }
                ]
            }
        ),
    )
    s = load_settings("n1", tmp_path / "missing.yaml", cfg)
    assert (s.device_split_count, s.device_memory_scaling, s.libcuda_log_level) == (4, 2.0, "3")
    assert s.filter_uuids == {U0}


def test_of_two_spellings_of_one_key_the_later_wins(tmp_path):
    doc = '{"nodeconfig": [{"name": "n1", "devicesplitcount": 3, "DeviceSplitCount": 5}]}'
    assert load_settings("n1", tmp_path / "missing.yaml", write(tmp_path, "c.json", doc)).device_split_count == 5
    doc = '{"nodeconfig": [{"name": "n1", "DeviceSplitCount": 5, "devicesplitcount": 3}]}'
    assert load_settings("n1", tmp_path / "missing.yaml", write(tmp_path, "c.json", doc)).device_split_count == 3


def test_bad_files(tmp_path):
    with pytest.raises(NodeConfigError, match="not valid"):
        load_settings("n1", None, write(tmp_path, "c.json", "{nope"))
    with pytest.raises(NodeConfigError, match="'nodeconfig' must be a list"):
        load_settings("n1", None, write(tmp_path, "d.json", '{"nodeconfig": 3}'))
    with pytest.raises(NodeConfigError, match="deviceSplitCount"):
        load_settings("n1", write(tmp_path, "dc.yaml", "nvidia:\n  deviceSplitCount: lots\n"), None)


def test_sysfs_numa(tmp_path):
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    d = tmp_path / "bus/pci/devices/0000:3b:00.0"
    d.mkdir(parents=True)
    (d / "numa_node").write_text("1\n")
    assert numa_node(tmp_path, "0000:3b:00.0") == 1
    (d / "numa_node").write_text("-1\n")
    assert numa_node(tmp_path, "0000:3b:00.0") == 0
    assert numa_node(tmp_path, "0000:00:00.0") == 0


def test_mps_operating_mode_is_refused_with_one_line_naming_the_key(tmp_path):
    """HAMi accepts ``operatingmode: mps`` and does nothing with it; we refuse to start instead."""
    cfg = write(tmp_path, "config.json", json.dumps({"nodeconfig": [{"name": "n1", "operatingmode": "mps"}]}))
    with pytest.raises(NodeConfigError) as err:
        load_settings("n1", None, cfg)
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        f"config.json {cfg} nodeconfig[0] (node 'n1'): field 'operatingmode': 'mps' is not supported "
        "(no MPS control daemon is run, so pods would get the whole GPU with no limit); use hami-core"
    )
    # another node's MPS entry does not stop this node
    assert load_settings("n2", None, cfg).operating_mode == "hami-core"


def test_mig_settings_come_from_both_files(tmp_path):
    """nvidia.migProfileAllowlist (device-config.yaml) narrows the registered MIG profiles;
    migstrategy comes from config.json."""
    yaml = tmp_path / "device-config.yaml"
    yaml.write_text(
        "nvidia:\n  migProfileAllowlist:\n    - models: [A100-SXM4-40GB]\n      profiles: [1g.5gb, 3g.20gb]\n"
        "    - models: [H100]\n"
    )
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", "migstrategy": "mixed"}]}))
    s = load_settings("n1", yaml, cfg)
    assert s.mig_allowlist == ((("A100-SXM4-40GB",), ("1g.5gb", "3g.20gb")), (("H100",), ()))
    assert s.mig_strategy == "mixed"
    assert load_settings("n2", yaml, cfg).mig_strategy == "none"
