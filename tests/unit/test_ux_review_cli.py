"""Start-up failures every engineer meets in the first hour end in one line naming what to fix.

Before, a metrics port already taken (``hami monitor``, ``hami scheduler``, ``hami dra``: all
listeners open through hami.serve.start) and a missing kubeconfig or in-cluster account
(``hami explain``, ``hami scheduler``) ended in a 40-line traceback; ``--kubeconfig`` naming a
missing file said "Invalid kube-config file. Expected key current-context".
"""

import socket

import pytest

from hami import serve
from hami.cli import main


@pytest.fixture
def taken_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


async def test_a_taken_port_is_a_listen_error_naming_the_address(taken_port):
    with pytest.raises(serve.ListenError) as err:
        await serve.start(serve.application(), "127.0.0.1", taken_port)
    assert isinstance(err.value, OSError)  # callers that catch OSError still do
    assert f"127.0.0.1:{taken_port}" in str(err.value) and "in use" in str(err.value)


def test_a_taken_metrics_port_is_one_line(taken_port, tmp_path, capsys):
    code = main(
        ["monitor", "--standalone", "--hook-path", str(tmp_path), "--metrics-bind-address", f"127.0.0.1:{taken_port}"]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err
    assert f"hami monitor: cannot listen on 127.0.0.1:{taken_port}" in err


def test_a_missing_kubeconfig_file_is_named(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    code = main(["explain", "default/p", "--kubeconfig", str(missing)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"--kubeconfig: no such file '{missing}'" in err


def test_a_missing_kubeconfig_is_one_line_in_a_real_process(tmp_path):
    # the client library's own "Config not found: <path>" warning came first (pytest's logging
    # handlers hide it in-process, so a process of its own)
    import subprocess
    import sys

    missing = tmp_path / "nope.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "hami", "explain", "default/p", "--kubeconfig", str(missing)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"hami explain: --kubeconfig: no such file '{missing}'"]


def test_no_credentials_at_all_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    code = main(["explain", "default/p"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.startswith("hami explain: cannot load Kubernetes credentials:"), err
    assert "--kubeconfig" in err


def test_simulate_names_a_misspelt_config_key(tmp_path, capsys):
    cfg = tmp_path / "dc.yaml"
    cfg.write_text("nvidia:\n  defaultMemroy: 1000\n")
    assert main(["simulate", "--config", str(cfg)]) == 0
    err = capsys.readouterr().err
    assert (
        f"hami simulate: warning: {cfg}: nvidia.defaultMemroy: not a key hami reads, ignored "
        "(did you mean defaultMemory?)" in err
    )
