"""The flags node programs share (hami.node.flags): one definition, the same names, defaults and
checks in `hami device-plugin` and `hami dra`."""

from __future__ import annotations

import argparse

import pytest

from hami.deviceplugin import command as dp_command
from hami.draplugin import command as dra_command
from hami.node import flags
from hami.node.layout import MountSpec

SHARED = (
    "node_name",
    "kubeconfig",
    "config_file",
    "node_config",
    "hook_path",
    "lock_dir",
    "driver_mount",
    "sysfs_root",
    "nvml_library",
)


def parse(add, argv):
    p = argparse.ArgumentParser()
    add(p)
    return p.parse_args(argv)


def test_both_programs_take_the_shared_flags_with_the_same_defaults(monkeypatch):
    for var in ("NODE_NAME", "KUBECONFIG", "CONFIG_FILE", "HOOK_PATH", "HAMI_NVML_LIBRARY"):
        monkeypatch.delenv(var, raising=False)
    dp, dra, alone = (
        vars(parse(add, [])) for add in (dp_command.add_arguments, dra_command.add_arguments, flags.add_node_flags)
    )
    assert (
        {k: dp[k] for k in SHARED}
        == {k: dra[k] for k in SHARED}
        == {k: alone[k] for k in SHARED}
        == {
            "node_name": "",
            "kubeconfig": None,
            "config_file": None,
            "node_config": "/config/config.json",
            "hook_path": "/usr/local",
            "lock_dir": "/tmp/vgpulock",
            "driver_mount": [],
            "sysfs_root": "/sys",
            "nvml_library": None,
        }
    )


def test_environment_defaults(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "n1")
    monkeypatch.setenv("HOOK_PATH", "/opt/hook")
    monkeypatch.setenv("HAMI_NVML_LIBRARY", "/x/libnvidia-ml.so.1")
    got = parse(flags.add_node_flags, [])
    assert (got.node_name, got.hook_path, got.nvml_library) == ("n1", "/opt/hook", "/x/libnvidia-ml.so.1")


def test_driver_mounts_parse_the_same_everywhere():
    argv = ["--driver-mount", "/opt/drv:/usr/local/nvidia", "--driver-mount", "/state:rw"]
    want = [MountSpec("/usr/local/nvidia", "/opt/drv", True), MountSpec("/state", "/state", False)]
    assert (
        parse(dp_command.add_arguments, argv).driver_mount
        == parse(dra_command.add_arguments, argv).driver_mount
        == want
    )


def test_a_bad_driver_mount_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        parse(flags.add_node_flags, ["--driver-mount", "relative"])
    assert "--driver-mount 'relative'" in capsys.readouterr().err


@pytest.mark.parametrize("text,value", [("true", True), ("On", True), ("1", True), ("no", False), ("0", False)])
def test_bool_flag(text, value):
    assert flags.bool_flag(text) is value


def test_bool_flag_rejects():
    with pytest.raises(argparse.ArgumentTypeError, match="expected true or false, got 'maybe'"):
        flags.bool_flag("maybe")
