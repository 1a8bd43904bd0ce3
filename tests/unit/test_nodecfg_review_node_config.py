"""``--node-config`` (config.json) at start-up: a named file that is not there, a file whose shape
or entry names apply to no node, and values JSON typed otherwise than HAMi's Go decoder takes
them. Each stops ``hami device-plugin`` with one line naming the flag or the field and the value
(exit 2), before NVML is opened."""

from __future__ import annotations

import json
import logging

import pytest

from hami.cli import main
from hami.node import settings as node_settings
from hami.node.settings import NodeConfigError, load_settings


def start(capsys, tmp_path, *extra: str) -> tuple[int, str]:
    """``hami device-plugin`` up to NVML, which is not there (exit 3 once the settings passed)."""
    code = main(["device-plugin", "--node-name=n1", f"--nvml-library={tmp_path}/no-nvml.so", *extra])
    return code, capsys.readouterr().err


def with_config(capsys, tmp_path, doc) -> tuple[int, str]:
    cfg = tmp_path / "config.json"
    cfg.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return start(capsys, tmp_path, f"--node-config={cfg}")


# ---------------------------------------------------------------------------------------------
# a missing file


def test_a_named_node_config_that_is_not_there_stops_the_plugin(capsys, tmp_path):
    """It ran on the defaults before, with no word: every per-node setting silently lost."""
    code, err = start(capsys, tmp_path, f"--node-config={tmp_path}/nope.json")
    assert (code, err.strip()) == (2, f"hami device-plugin: --node-config: no such file '{tmp_path}/nope.json'")


def test_hamis_path_may_be_absent_and_the_plugin_says_so(capsys, tmp_path, caplog, monkeypatch):
    """The chart mounts a ConfigMap at /config: an externalConfigName one may have no config.json
    key, and HAMi's plugin then runs on the defaults. Here too, with a warning naming the path."""
    absent = str(tmp_path / "config" / "config.json")
    monkeypatch.setattr(node_settings, "DEFAULT_NODE_CONFIG", absent, raising=False)
    caplog.set_level(logging.WARNING, logger="hami.node.settings")
    code, err = start(capsys, tmp_path, f"--node-config={absent}")
    assert code == 3 and "NVML" in err  # past the settings
    assert [r.getMessage() for r in caplog.records if absent in r.getMessage()], caplog.text


def test_the_default_of_the_flag_is_hamis_path():
    from hami.deviceplugin.command import add_arguments
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args([]).node_config == "/config/config.json" == node_settings.DEFAULT_NODE_CONFIG


# ---------------------------------------------------------------------------------------------
# a file that applies to no node


@pytest.mark.parametrize(
    "doc, message",
    [
        # the top level: not the object HAMi reads (said "got None" before)
        ([], 'expected a JSON object {"nodeconfig": [...]}, got a list: []'),
        # a misspelled key: every node on its defaults (accepted before, with no word)
        ({"nodeconfigs": [{"name": "n1", "devicesplitcount": 4}]}, "no 'nodeconfig' list (keys found: 'nodeconfigs')"),
        # an entry that is not an object (Go's decoder refuses the whole file)
        ({"nodeconfig": ["n1"]}, "nodeconfig[0]: expected an object with a 'name', got 'n1'"),
    ],
)
def test_a_file_whose_shape_applies_to_no_node_is_refused(capsys, tmp_path, doc, message):
    code, err = with_config(capsys, tmp_path, doc)
    assert code == 2 and err.startswith(f"hami device-plugin: config.json {tmp_path}/config.json") and message in err, (
        err
    )
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"devicesplitcount": 4}, "nodeconfig[1]: field 'name' is missing"),
        ({"name": 5}, "nodeconfig[1]: field 'name': 5 is not a Kubernetes node name"),
        ({"name": "GPU_Node-1"}, "field 'name': 'GPU_Node-1' is not a Kubernetes node name"),
        ({"name": "n1 "}, "field 'name': 'n1 ' is not a Kubernetes node name"),
    ],
)
def test_an_entry_no_node_can_match_is_a_warning_and_the_others_still_apply(tmp_path, caplog, entry, message):
    """Skipped before with no word. Not a refusal: every node's plugin reads every entry, and one
    dead entry must not stop the plugin on all nodes (HAMi's skips it)."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", "devicesplitcount": 4}, entry]}))
    caplog.set_level(logging.WARNING, logger="hami.node.settings")
    assert load_settings("n1", None, cfg).device_split_count == 4
    assert [r.getMessage() for r in caplog.records if message in r.getMessage()], caplog.text


@pytest.mark.parametrize("doc", [{}, {"nodeconfig": None}, {"NodeConfig": []}])
def test_no_entries_leave_the_defaults_as_in_hami(tmp_path, doc):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(doc))
    assert load_settings("n1", None, cfg).device_split_count == 10


def test_another_nodes_entry_is_checked_for_its_name_only(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n2", "devicesplitcount": "bogus"}, {"name": "n1"}]}))
    assert load_settings("n1", None, cfg).device_split_count == 10


# ---------------------------------------------------------------------------------------------
# values typed otherwise than HAMi's Go decoder takes them


@pytest.mark.parametrize(
    "entry, field, value",
    [
        ({"devicesplitcount": True}, "devicesplitcount", "True"),  # was a split count of 1
        ({"devicesplitcount": "4"}, "devicesplitcount", "'4'"),
        ({"devicesplitcount": 2.0}, "devicesplitcount", "2.0"),
        ({"devicememoryscaling": True}, "devicememoryscaling", "True"),  # was a scaling of 1.0
        ({"enablenumatopology": "no"}, "enablenumatopology", "'no'"),  # was false
        ({"enablegetpreferredallocation": 1}, "enablegetpreferredallocation", "1"),
        ({"filterdevices": {"index": ["0"]}}, "filterdevices.index.0", "'0'"),  # was GPU 0 left out
        ({"preconfigureddevicememory": "81920"}, "preconfigureddevicememory", "'81920'"),
    ],
)
def test_a_value_of_another_json_type_is_refused_naming_the_field_and_value(tmp_path, entry, field, value):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", **entry}]}))
    with pytest.raises(NodeConfigError, match=r"nodeconfig\[0\] \(node 'n1'\): field '(.+)'") as exc:
        load_settings("n1", None, cfg)
    assert f"field '{field}'" in str(exc.value) and f"(got {value})" in str(exc.value)


def test_json_numbers_and_booleans_still_work(tmp_path):
    cfg = tmp_path / "config.json"
    entry = {"name": "n1", "devicesplitcount": 4, "devicememoryscaling": 2, "enablenumatopology": True}
    cfg.write_text(json.dumps({"nodeconfig": [{**entry, "filterdevices": {"index": [1]}, "libcudaloglevel": "3"}]}))
    s = load_settings("n1", None, cfg)
    assert (s.device_split_count, s.device_memory_scaling, s.enable_numa_topology) == (4, 2.0, True)
    assert (s.filter_indexes, s.libcuda_log_level) == ({1}, "3")
