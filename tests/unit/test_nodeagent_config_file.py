"""``--config-file`` of the node programs: a file named but missing, unreadable or invalid is
refused with one line naming the flag and the path (exit 2, as the scheduler refuses its
``--device-config-file``), never replaced by the defaults."""

from __future__ import annotations

import os

import pytest

from hami import cli
from hami.config import read_device_config_file
from hami.core.errors import ConfigError


class NvmlReached(Exception):
    """The command went past its configuration (the next step opens NVML)."""


@pytest.fixture
def no_nvml(monkeypatch):
    import hami.deviceplugin.command as dp
    import hami.draplugin.command as dra

    def reached(*_a, **_k):
        raise NvmlReached()

    monkeypatch.setattr(dp, "open_nvml", reached)
    monkeypatch.setattr(dra, "open_nvml", reached)


def _run(command: str, path: str, tmp_path) -> int:
    node_config = tmp_path / "node-config.json"  # (a named --node-config that is missing is refused too)
    node_config.write_text('{"nodeconfig": []}')
    return cli.main(
        [command, "--dry-run", "--node-name", "n1", "--config-file", path, "--node-config", str(node_config)]
    )


@pytest.mark.parametrize("command", ["device-plugin", "dra"])
def test_a_missing_config_file_is_refused_naming_the_flag_and_the_path(command, tmp_path, capsys, no_nvml):
    missing = str(tmp_path / "device-config.yaml")
    assert _run(command, missing, tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"hami {command}: --config-file: no such file {missing!r}"]


@pytest.mark.parametrize("command", ["device-plugin", "dra"])
def test_a_named_node_config_that_is_missing_is_refused_by_both_agents(command, tmp_path, capsys, no_nvml):
    # the DRA agent ran on the defaults before, every per-node setting lost without a word
    config = tmp_path / "device-config.yaml"
    config.write_text("nvidia:\n  deviceSplitCount: 10\n")
    missing = str(tmp_path / "nope.json")
    code = cli.main([command, "--dry-run", "--node-name", "n1", "--config-file", str(config), "--node-config", missing])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"hami {command}: --node-config: no such file {missing!r}"]


@pytest.mark.parametrize("command", ["device-plugin", "dra"])
@pytest.mark.parametrize(
    "content, says",
    [
        (b"\xff\xfe\x00", "is not UTF-8 text"),
        (b"nvidia: [\n", "not valid YAML"),
        (b"nvidia:\n  deviceSplitCount: x\n", "deviceSplitCount"),
    ],
)
def test_an_invalid_config_file_is_refused_naming_the_flag(command, content, says, tmp_path, capsys, no_nvml):
    path = tmp_path / "device-config.yaml"
    path.write_bytes(content)
    assert _run(command, str(path), tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"hami {command}: --config-file: ") and str(path) in err[0] and says in err[0]


@pytest.mark.parametrize("command", ["device-plugin", "dra"])
def test_a_directory_as_config_file_is_one_line_not_a_traceback(command, tmp_path, capsys, no_nvml):
    assert _run(command, str(tmp_path), tmp_path) == 2
    assert capsys.readouterr().err.strip() == f"hami {command}: --config-file: {str(tmp_path)!r} is a directory"


@pytest.mark.parametrize("command", ["device-plugin", "dra"])
def test_a_valid_config_file_goes_on_to_the_gpus(command, tmp_path, no_nvml):
    path = tmp_path / "device-config.yaml"
    path.write_text("nvidia:\n  deviceSplitCount: 5\n")
    with pytest.raises(NvmlReached):
        _run(command, str(path), tmp_path)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"^--config-file: .* is not a regular file$"):
        read_device_config_file(str(fifo), "--config-file")


def test_an_unreadable_file_names_the_reason(tmp_path, monkeypatch):
    path = tmp_path / "device-config.yaml"
    path.write_text("nvidia: {}\n")

    def denied(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(ConfigError) as info:
        read_device_config_file(str(path), "--config-file")
    assert str(info.value) == f"--config-file: cannot read {str(path)!r} (Permission denied)"


def test_the_file_read_is_the_device_config(tmp_path):
    path = tmp_path / "device-config.yaml"
    path.write_text("nvidia:\n  deviceSplitCount: 5\n")
    assert read_device_config_file(str(path), "--config-file").nvidia.device_split_count == 5


def test_the_scheduler_reads_its_device_config_file_the_same_way(tmp_path):
    """A non-UTF-8 --device-config-file was a UnicodeDecodeError traceback (exit 1) in the
    scheduler: one reader for every command, one line naming the flag."""
    import argparse

    from hami.scheduler.options import add_arguments, options_from_args

    bad = tmp_path / "device-config.yaml"
    bad.write_bytes(b"nvidia:\n  resourceCountName: \xff\xfe\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ConfigError, match=r"--device-config-file: '.*device-config.yaml' is not UTF-8 text"):
        options_from_args(parser.parse_args(["--device-config-file", str(bad)]))
