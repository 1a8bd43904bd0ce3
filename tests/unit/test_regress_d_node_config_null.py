"""Regression review of the config.json strictness: a ``null`` in the ``nodeconfig`` list.

Go's encoding/json decodes ``null`` into a struct element as the zero entry (no name, no error),
so HAMi's device plugin runs on with the other entries; the strict check refused the whole file
on every node ("expected an object with a 'name'"), stopping every node agent over a file that
HAMi takes and that this plugin took before."""

from __future__ import annotations

import json
import logging

from hami.cli import main
from hami.node.settings import NodeSettings, apply_node_config


def test_a_null_entry_applies_to_no_node_and_the_others_still_do(caplog):
    doc = {"nodeconfig": [None, {"name": "n1", "devicesplitcount": 4}]}
    with caplog.at_level(logging.WARNING, logger="hami.node.settings"):
        out = apply_node_config(NodeSettings(), doc, "n1", "config.json")
    assert out.device_split_count == 4
    assert [r.getMessage() for r in caplog.records] == ["config.json nodeconfig[0]: a null entry applies to no node"]


def test_the_plugin_starts_past_a_null_entry(capsys, tmp_path):
    """Up to NVML, which is not there: exit 3 once the settings passed (2 before the fix)."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", "devicememoryscaling": 1.5}, None]}))
    code = main(["device-plugin", "--node-name=n1", f"--nvml-library={tmp_path}/no-nvml.so", f"--node-config={cfg}"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "nodeconfig[1]" not in err


def test_an_entry_of_another_json_type_is_still_refused():
    """Go refuses a string or a number where an entry goes (the whole file): so does this."""
    for bad in ("n1", 3, [], True):
        try:
            apply_node_config(NodeSettings(), {"nodeconfig": [bad]}, "n1", "config.json")
        except ValueError as exc:
            assert "nodeconfig[0]: expected an object" in str(exc)
        else:
            raise AssertionError(f"{bad!r} was taken")
