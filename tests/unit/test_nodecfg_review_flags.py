"""``hami device-plugin`` flags whose bad values were taken: each now stops it with one line naming
the flag and the value (exit 2), before NVML is opened."""

from __future__ import annotations

import pytest

from hami.cli import main


def start(capsys, tmp_path, *extra: str) -> tuple[int, str]:
    cfg = tmp_path / "config.json"
    cfg.write_text('{"nodeconfig": []}')
    code = main(
        [
            "device-plugin",
            "--node-name=n1",
            f"--node-config={cfg}",
            f"--nvml-library={tmp_path}/no-nvml.so",
            *extra,
        ]
    )
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value, bounds",
    [
        # a loop that never waits: the node read (and written) as fast as the API server answers
        ("--register-interval", "0", "0.1 to 3600"),
        ("--register-interval", "-1", "0.1 to 3600"),
        # asyncio.sleep(nan) never returns: the node never registered again
        ("--register-interval", "nan", "0.1 to 3600"),
        ("--poll-interval", "0", "0.1 to 60"),
        ("--poll-interval", "inf", "0.1 to 60"),
    ],
)
def test_an_interval_that_never_waits_or_never_wakes_is_refused(capsys, tmp_path, flag, value, bounds):
    code, err = start(capsys, tmp_path, f"{flag}={value}")
    assert (code, err.strip()) == (
        2,
        f"hami device-plugin: {flag}: expected {bounds} seconds, got {float(value)!r}",
    )


def test_the_defaults_and_the_integration_tests_values_are_taken(capsys, tmp_path):
    for extra in ((), ("--register-interval=0.5", "--poll-interval=0.1")):
        code, err = start(capsys, tmp_path, *extra)
        assert code == 3 and "NVML" in err  # past the flags


@pytest.mark.parametrize("flag", ["--hook-path", "--lock-dir"])
def test_a_relative_host_directory_is_refused(capsys, tmp_path, flag):
    """It went into every GPU container's mounts, whose creation the runtime then failed."""
    with pytest.raises(SystemExit) as exc:
        start(capsys, tmp_path, f"{flag}=usr/local/vgpu")
    assert exc.value.code == 2
    assert f"argument {flag}: expected an absolute path, got 'usr/local/vgpu'" in capsys.readouterr().err


def test_a_relative_cdi_spec_dir_is_refused(capsys, tmp_path):
    """The spec went to the plugin's working directory, where no runtime looks."""
    code, err = start(capsys, tmp_path, "--device-list-strategy=cdi-cri", "--cdi-spec-dir=var/run/cdi")
    assert (code, err.strip()) == (
        2,
        "hami device-plugin: --cdi-spec-dir: expected an absolute directory, got 'var/run/cdi'",
    )


@pytest.mark.parametrize("text, on", [("T", True), ("t", True), ("F", False), ("f", False)])
def test_bool_flags_take_gos_t_and_f(monkeypatch, capsys, tmp_path, text, on):
    """HAMi's plugin reads PASS_DEVICE_SPECS / ENABLE_TOPOLOGY_SCORE with Go's strconv.ParseBool."""
    import argparse

    from hami.deviceplugin.command import add_arguments

    monkeypatch.setenv("ENABLE_TOPOLOGY_SCORE", text)
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args([]).topology_score is on
    assert p.parse_args([f"--pass-device-specs={text}"]).pass_device_specs is on


@pytest.mark.parametrize(
    "env_name, value, flag, choices",
    [
        # ran the node lock protocol, the operator believing the NRI hook served it
        ("HAMI_INJECTION", "NRI", "--injection", "allocate, nri"),
        ("HAMI_INJECTION", "bogus", "--injection", "allocate, nri"),
        # was refused as config.json's "migstrategy", a key the file did not have
        ("MIG_STRATEGY", "Mixed", "--mig-strategy", "none, single, mixed"),
    ],
)
def test_a_choice_from_the_env_is_checked_as_the_flags(monkeypatch, capsys, tmp_path, env_name, value, flag, choices):
    monkeypatch.setenv(env_name, value)
    code, err = start(capsys, tmp_path)
    assert (code, err.strip()) == (
        2,
        f"hami device-plugin: {flag} (env {env_name}): expected one of {choices}, got {value!r}",
    )
