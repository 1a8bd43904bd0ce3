"""config.json's filterdevices lists given as JSON null (found by a regression review of the node
agents' config.json strictness, which reads the file as Go's decoder does): Go reads null into a
slice as an empty one, so HAMi's plugin filters nothing; here the entry was refused ("Input should
be a valid list") and the node's plugin stopped."""

from __future__ import annotations

import pytest

from hami.node.settings import NodeConfigError, NodeSettings, apply_node_config


@pytest.mark.parametrize(
    "filterdevices, uuids, indexes",
    [
        ({"uuid": None, "index": [1]}, set(), {1}),
        ({"uuid": ["GPU-a"], "index": None}, {"GPU-a"}, set()),
        ({"UUID": None, "Index": None}, set(), set()),
    ],
)
def test_a_null_list_filters_nothing(filterdevices, uuids, indexes):
    doc = {"nodeconfig": [{"name": "n1", "devicesplitcount": 4, "filterdevices": filterdevices}]}
    out = apply_node_config(NodeSettings(), doc, "n1", "config.json")
    assert (out.filter_uuids, out.filter_indexes, out.device_split_count) == (uuids, indexes, 4)


def test_a_list_of_the_wrong_type_is_still_refused():
    doc = {"nodeconfig": [{"name": "n1", "filterdevices": {"uuid": "GPU-a"}}]}
    with pytest.raises(NodeConfigError, match="filterdevices.uuid"):
        apply_node_config(NodeSettings(), doc, "n1", "config.json")
