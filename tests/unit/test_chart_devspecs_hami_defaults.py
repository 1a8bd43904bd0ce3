"""charts/hami with HAMi's own devicePlugin defaults (``passDeviceSpecsEnabled: true``,
``nvidiaDriverRoot: "auto"``, as HAMi's charts/hami/values.yaml ships them), rendered with ``helm
template``: both install, the first passes ``--pass-device-specs`` and mounts the host's device
directory read-only into the plugin; a driver root other than ``auto`` or ``/`` still stops the
install, pointing at driverMounts. Skipped when helm is not installed (``make kube``)."""

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

#: the devicePlugin keys of HAMi's values.yaml this is about, written as HAMi writes them
HAMI_DEFAULTS = """
devicePlugin:
  migStrategy: "none"
  passDeviceSpecsEnabled: true
  deviceListStrategy: "envvar"
  nvidiaHookPath: null
  nvidiaDriverRoot: "auto"
  gdrcopyEnabled: null
  gdsEnabled: null
  mofedEnabled: null
"""


def render(tmp_path: Path, values: str = HAMI_DEFAULTS, *sets: str) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "values.yaml"
    f.write_text(values)
    args = [str(HELM), "template", "t", str(CHART), "--kube-version", "v1.33.0", "-f", str(f)]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def plugin_pod(result: subprocess.CompletedProcess[str]) -> tuple[dict, dict]:
    assert result.returncode == 0, result.stderr
    (ds,) = [
        d
        for d in yaml.safe_load_all(result.stdout)
        if d and d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("device-plugin")
    ]
    spec = ds["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == "device-plugin"]
    return spec, c


def test_hamis_defaults_install_and_pass_device_specs(tmp_path):
    spec, c = plugin_pod(render(tmp_path))
    assert "--pass-device-specs" in c["command"]
    assert "--dev-root=/" in c["command"]
    assert "--dev-root-ctr-path=/var/run/hami/dev-root" in c["command"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "dev-root"]
    assert volume["hostPath"] == {"path": "/dev", "type": "Directory"}
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "dev-root"]
    assert mount == {"name": "dev-root", "mountPath": "/var/run/hami/dev-root/dev", "readOnly": True}


def test_a_dev_root_of_its_own_is_mounted_and_named(tmp_path):
    spec, c = plugin_pod(render(tmp_path, HAMI_DEFAULTS, "devicePlugin.devRoot=/run/nvidia/driver"))
    assert "--dev-root=/run/nvidia/driver" in c["command"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "dev-root"]
    assert volume["hostPath"]["path"] == "/run/nvidia/driver/dev"


@pytest.mark.parametrize("setting", ["devicePlugin.passDeviceSpecsEnabled=false", None])
def test_without_device_specs_nothing_is_passed_or_mounted(tmp_path, setting):
    result = render(tmp_path, HAMI_DEFAULTS, setting) if setting else render(tmp_path, "{}\n")
    spec, c = plugin_pod(result)
    assert not [a for a in c["command"] if a.startswith(("--pass-device-specs", "--dev-root"))]
    assert "dev-root" not in [v["name"] for v in spec["volumes"]]


@pytest.mark.parametrize("root", ["/", "auto", ""])
def test_the_driver_roots_that_mean_the_runtimes_driver_are_accepted(tmp_path, root):
    plugin_pod(render(tmp_path, "{}\n", f"devicePlugin.nvidiaDriverRoot={root}"))


def test_any_other_driver_root_stops_the_install_pointing_at_driver_mounts(tmp_path):
    result = render(tmp_path, HAMI_DEFAULTS, "devicePlugin.nvidiaDriverRoot=/run/nvidia/driver")
    assert result.returncode != 0
    assert (
        "devicePlugin.nvidiaDriverRoot=/run/nvidia/driver is not supported by this chart: use devicePlugin.driverMounts"
        in result.stderr
    )


def test_device_specs_with_the_nri_injection_stop_the_install(tmp_path):
    result = render(tmp_path, HAMI_DEFAULTS, "devicePlugin.injection=nri")
    assert result.returncode != 0
    assert "cannot go with devicePlugin.injection=nri" in result.stderr


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
def test_device_specs_go_with_a_cdi_strategy_as_in_nvidias_plugin(tmp_path, strategy):
    # refused before; the plugin answers both (CDI's edits replace a device at the same path)
    _, c = plugin_pod(render(tmp_path, HAMI_DEFAULTS, f"devicePlugin.deviceListStrategy={strategy}"))
    assert "--pass-device-specs" in c["command"] and any(strategy in a for a in c["command"]), c["command"]
