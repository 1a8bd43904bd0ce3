"""charts/hami ``devicePlugin.injection`` rendered with ``helm template`` (no cluster needed):
allocate by default with no NRI mount; nri passes the flag and mounts the directory of the
runtime's NRI socket (not the socket file: a restarted runtime makes a new one); bad values stop
the install with the value named. Skipped when helm is not installed (``make kube``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from hami_devkit.binaries import bin_dir

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "hami"
HELM = bin_dir() / "helm"

pytestmark = pytest.mark.skipif(not HELM.is_file(), reason=f"helm not installed in {HELM.parent} (make kube)")


def render(*sets: str) -> subprocess.CompletedProcess[str]:
    args = [str(HELM), "template", "t", str(CHART), "--kube-version", "v1.33.0"]  # NRI needs the guard (1.30+)
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def plugin_pod(*sets: str) -> dict:
    result = render(*sets)
    assert result.returncode == 0, result.stderr
    (ds,) = [
        d
        for d in yaml.safe_load_all(result.stdout)
        if d and d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("device-plugin")
    ]
    return ds["spec"]["template"]["spec"]


def plugin_container(spec: dict) -> dict:
    (c,) = [c for c in spec["containers"] if c["name"] == "device-plugin"]
    return c


def test_allocate_is_the_default_and_mounts_no_nri_socket():
    spec = plugin_pod()
    assert "--injection=allocate" in plugin_container(spec)["command"]
    assert not [a for a in plugin_container(spec)["command"] if a.startswith("--nri-socket")]
    assert "nri" not in [v["name"] for v in spec["volumes"]]


def test_nri_mounts_the_sockets_directory_and_points_the_plugin_at_it():
    spec = plugin_pod("devicePlugin.injection=nri", "devicePlugin.nriSocket=/run/containerd/nri/nri.sock")
    command = plugin_container(spec)["command"]
    assert "--injection=nri" in command
    assert "--nri-socket=/var/run/nri-host/nri.sock" in command
    (volume,) = [v for v in spec["volumes"] if v["name"] == "nri"]
    # `Directory`: on a runtime with NRI off (no such directory) the plugin does not start, so the
    # node offers no GPU whose pods would get no grant (docs/nri.md)
    assert volume["hostPath"] == {"path": "/run/containerd/nri", "type": "Directory"}
    (mount,) = [m for m in plugin_container(spec)["volumeMounts"] if m["name"] == "nri"]
    assert mount["mountPath"] == "/var/run/nri-host"


def test_the_default_socket_is_the_runtimes_default():
    spec = plugin_pod("devicePlugin.injection=nri")
    (volume,) = [v for v in spec["volumes"] if v["name"] == "nri"]
    assert volume["hostPath"]["path"] == "/var/run/nri"


@pytest.mark.parametrize(
    "sets, message",
    [
        (("devicePlugin.injection=lockless",), 'devicePlugin.injection must be allocate or nri, got "lockless"'),
        (
            ("devicePlugin.injection=nri", "devicePlugin.nriSocket=nri.sock"),
            'devicePlugin.nriSocket must be an absolute host path with injection nri, got "nri.sock"',
        ),
    ],
)
def test_bad_values_stop_the_install_naming_the_value(sets, message):
    result = render(*sets)
    assert result.returncode != 0 and message in result.stderr
