"""hami.safeyaml reads every YAML the product takes (device-config.yaml, hami simulate's files):
an explicit tag PyYAML's constructors cannot read was a KeyError or IndexError traceback (a
scheduler with such a device-config.yaml died with one, not with a line naming the file)."""

from __future__ import annotations

import pytest

from hami import safeyaml
from hami.config import ConfigError, load_device_config


@pytest.mark.parametrize("text", ["a: !!bool maybe", 'a: !!int ""', "a: !!int"])
def test_a_tag_pyyaml_cannot_construct_is_a_yaml_error(text):
    with pytest.raises(safeyaml.YamlInputError, match=r"^f\.yaml: not valid YAML"):
        safeyaml.load_all(text, "f.yaml")


def test_a_device_config_with_such_a_tag_is_a_config_error_naming_the_file():
    with pytest.raises(ConfigError, match="device-config.yaml"):
        load_device_config("nvidia:\n  deviceSplitCount: !!bool maybe\n", "device-config.yaml")
