"""The pure parts of the test control plane: configuration documents, manifests, pins, errors."""

from __future__ import annotations

import base64
import os
import re
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from hami_devkit import cluster as kc
from hami_devkit.command import main
from hami_devkit.pki import CertificateAuthority

REPO = Path(__file__).resolve().parents[2]


def test_extender_document_has_hami_settings():
    doc = kc.ExtenderConfig(
        url_prefix="http://127.0.0.1:8888", http_timeout="5s", managed_resources=("nvidia.com/gpu", "example.com/npu")
    ).document()
    assert doc["urlPrefix"] == "http://127.0.0.1:8888"
    assert (doc["filterVerb"], doc["bindVerb"], doc["nodeCacheCapable"]) == ("filter", "bind", True)
    assert doc["httpTimeout"] == "5s" and doc["enableHTTPS"] is False and "tlsConfig" not in doc
    assert doc["managedResources"] == [
        {"name": "nvidia.com/gpu", "ignoredByScheduler": True},
        {"name": "example.com/npu", "ignoredByScheduler": True},
    ]


def test_default_managed_resources_are_the_nvidia_names():
    names = {r["name"] for r in kc.ExtenderConfig(url_prefix="http://x:1").document()["managedResources"]}
    assert names == {
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "nvidia.com/gpucores",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/priority",
    }


def test_https_extender_trusts_the_cluster_ca_unless_insecure():
    doc = kc.ExtenderConfig(url_prefix="https://127.0.0.1:9443").document(b"CA")
    assert doc["enableHTTPS"] is True and doc["tlsConfig"] == {"caData": base64.b64encode(b"CA").decode()}
    insecure = kc.ExtenderConfig(url_prefix="https://127.0.0.1:9443", tls_insecure=True).document(b"CA")
    assert insecure["tlsConfig"] == {"insecure": True}


@pytest.mark.parametrize(
    "field, value",
    [
        ("url_prefix", "127.0.0.1:80"),
        ("http_timeout", "30"),
        ("managed_resources", ("gpu",)),
        ("filter_verb", ""),
    ],
)
def test_bad_extender_settings_name_the_field_and_value(field, value):
    kwargs = {"url_prefix": "http://127.0.0.1:80", field: value}
    with pytest.raises(ValueError, match=re.escape(field)) as info:
        kc.ExtenderConfig(**kwargs)
    assert repr(value if field != "managed_resources" else list(value)) in str(info.value)


def test_scheduler_document_one_profile_and_leader_election():
    config = kc.SchedulerConfig(extender=kc.ExtenderConfig(url_prefix="http://127.0.0.1:1"), leader_elect=True)
    doc = config.document(Path("/k/admin.kubeconfig"))
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert doc["profiles"] == [{"schedulerName": "hami-scheduler"}]
    assert doc["leaderElection"] == {
        "leaderElect": True,
        "resourceName": "hami-scheduler",
        "resourceNamespace": "kube-system",
    }
    assert len(doc["extenders"]) == 1
    assert "extenders" not in kc.DEFAULT_SCHEDULER.document(Path("/k"))
    # as the chart: the client rate limit high enough that the API server is the limit
    assert doc["clientConnection"] == {"kubeconfig": "/k/admin.kubeconfig", "qps": 1000.0, "burst": 2000}
    assert kc.DEFAULT_SCHEDULER.document(Path("/k"))["clientConnection"]["qps"] == 1000.0
    fast = kc.SchedulerConfig(client_qps=500, client_burst=1000).document(Path("/k/admin.kubeconfig"))
    assert fast["clientConnection"] == {"kubeconfig": "/k/admin.kubeconfig", "qps": 500, "burst": 1000}
    own = kc.SchedulerConfig(client_qps=None, client_burst=None).document(Path("/k/admin.kubeconfig"))
    assert own["clientConnection"] == {"kubeconfig": "/k/admin.kubeconfig"}  # kube-scheduler's own defaults


def test_node_manifest_gpus_times_split_count_and_kwok_annotation():
    node = kc.node_manifest(
        "n1", labels={"gpu": "on"}, annotations={"a": "b"}, gpus=4, split_count=10, allocatable={"cpu": 8}
    )
    assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake", "a": "b"}
    assert node["metadata"]["labels"]["gpu"] == "on"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "n1"
    assert node["status"]["allocatable"] == {"cpu": "8", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "40"}
    assert "nvidia.com/gpu" not in kc.node_manifest("n2")["status"]["allocatable"]
    with pytest.raises(ValueError, match="split_count"):
        kc.node_manifest("n3", gpus=1, split_count=0)


def test_version_pin_matches_the_install_script():
    script = (REPO / "scripts" / "install-kube.sh").read_text()
    default = re.search(r"^KUBE_DEFAULT=(\S+)", script, re.M).group(1)
    assert os.environ.get("HAMI_KUBE_VERSION", default) == kc.KUBE_VERSION


def test_missing_binaries_are_named(tmp_path):
    (tmp_path / "etcd").write_text("#!/bin/sh\n")
    (tmp_path / "etcd").chmod(0o755)
    with pytest.raises(kc.MissingBinaries) as info:
        kc.find_binaries(tmp_path)
    assert info.value.missing == ["kube-apiserver", "kube-scheduler", "kwok"]
    assert "install-kube.sh" in str(info.value)


def test_bin_dir_follows_the_cache_variables(monkeypatch, tmp_path):
    monkeypatch.delenv("HAMI_KUBE_BIN", raising=False)
    monkeypatch.setenv("HAMI_CACHE", str(tmp_path))
    assert kc.bin_dir() == tmp_path / "kube" / kc.KUBE_VERSION / "bin"
    monkeypatch.setenv("HAMI_KUBE_BIN", "/opt/kube")
    assert kc.bin_dir() == Path("/opt/kube")


def test_issued_certificate_is_trusted_by_the_ca(tmp_path):
    ca = CertificateAuthority()
    pair = ca.issue("webhook", hosts=("127.0.0.1", "localhost"))
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.pair.cert_pem))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    (tmp_path / "c.pem").write_bytes(pair.cert_pem)
    (tmp_path / "k.pem").write_bytes(pair.key_pem)
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")


def test_dev_cluster_env_without_a_running_cluster(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HAMI_CACHE", str(tmp_path))
    assert main(["cluster", "env"]) == 1
    assert "hami-dev cluster up" in capsys.readouterr().err
    assert main(["cluster", "status"]) == 3
    assert main(["cluster", "down"]) == 0


def test_python_m_hami_devkit_is_the_hami_dev_command(tmp_path):
    """``python -m hami_devkit`` runs the ``hami-dev`` command line (what the tests and the
    background supervisor use, so they work without the console script installed)."""
    env = {**os.environ, "HAMI_CACHE": str(tmp_path)}
    status = subprocess.run(
        [sys.executable, "-m", "hami_devkit", "cluster", "status"], env=env, capture_output=True, text=True, timeout=60
    )
    assert (status.returncode, status.stdout.strip()) == (3, "not running"), status.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "hami_devkit", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert usage.returncode == 0 and usage.stdout.startswith("usage: hami-dev ")


def test_dev_cluster_up_names_missing_binaries(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HAMI_CACHE", str(tmp_path))
    monkeypatch.setenv("HAMI_KUBE_BIN", str(tmp_path / "nothing"))
    assert main(["cluster", "up"]) == 2
    assert "kube-apiserver" in capsys.readouterr().err


def test_dev_cluster_up_rejects_a_bad_extender_url(monkeypatch, tmp_path, capsys):
    for name in kc.REQUIRED_BINARIES:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("HAMI_CACHE", str(tmp_path))
    monkeypatch.setenv("HAMI_KUBE_BIN", str(tmp_path))
    assert main(["cluster", "up", "--extender-url", "localhost:80"]) == 2
    assert "url_prefix" in capsys.readouterr().err


def _fake_binaries(directory):
    for name in kc.REQUIRED_BINARIES:
        (directory / name).write_text("#!/bin/sh\n")
        (directory / name).chmod(0o755)


def test_dev_cluster_up_real_node_names_what_is_missing(monkeypatch, tmp_path, capsys):
    _fake_binaries(tmp_path)  # no kubelet among them
    monkeypatch.setenv("HAMI_CACHE", str(tmp_path))
    monkeypatch.setenv("HAMI_KUBE_BIN", str(tmp_path))
    assert main(["cluster", "up", "--real-node"]) == 2
    err = capsys.readouterr().err
    assert "real node unavailable:" in err and "kubelet (run scripts/install-kube.sh" in err
    assert not (tmp_path / "dev-cluster" / "state.json").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--image", "x.tar"], "--image: only with --real-node"),
        (["--real-node", "--wait-for-real-node", "-1"], "--wait-for-real-node: must be >= 0, got -1.0"),
        (["--real-node", "--image", "/nonexistent/x.tar"], "--image: no such archive: /nonexistent/x.tar"),
    ],
)
def test_dev_cluster_up_checks_image_archives(monkeypatch, tmp_path, capsys, argv, message):
    _fake_binaries(tmp_path)
    monkeypatch.setenv("HAMI_CACHE", str(tmp_path))
    monkeypatch.setenv("HAMI_KUBE_BIN", str(tmp_path))
    assert main(["cluster", "up", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cluster_help_lists_only_the_actions_a_person_runs(capsys):
    # "serve ==SUPPRESS==" was a line of it (argparse before 3.12); serve still parses
    with pytest.raises(SystemExit):
        main(["cluster", "--help"])
    out = capsys.readouterr().out
    assert "SUPPRESS" not in out and "serve" not in out and "status" in out
    from hami_devkit.command import add_arguments
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["cluster", "serve", "--options", "x"]).action == "serve"
