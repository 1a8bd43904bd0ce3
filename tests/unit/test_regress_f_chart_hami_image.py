"""HAMi's values.yaml copied whole (found by a regression review of the chart's HAMi values): its
image keys name HAMi's own image (docker.io/projecthami/hami:v2.10.0) for the scheduler, the
device plugin and the monitor, which this chart rendered as given; that image has no `hami`
command, so `helm install` succeeded and every pod crash-looped. The install stops naming the key.
Rendered with the helm that `make kube` installs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from hami_devkit.binaries import bin_dir

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"
HELM = bin_dir() / "helm"

pytestmark = pytest.mark.skipif(not HELM.is_file(), reason=f"helm not installed in {HELM.parent} (make kube)")

HAMI_IMAGE = {"registry": "docker.io", "repository": "projecthami/hami", "tag": "", "pullSecrets": []}


def render(tmp_path: Path, values: dict) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    args = [str(HELM), "template", "t", str(CHART), "--kube-version", "1.34.4", "-f", str(f)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    "values, key",
    [
        (
            {
                "global": {"imageTag": "v2.10.0"},
                "scheduler": {"extender": {"image": HAMI_IMAGE}},
                "devicePlugin": {"image": HAMI_IMAGE, "monitor": {"image": HAMI_IMAGE}},
            },
            "scheduler.extender.image.repository",
        ),
        ({"devicePlugin": {"image": HAMI_IMAGE}}, "devicePlugin.image.repository"),
        (
            {"devicePlugin": {"monitor": {"image": {**HAMI_IMAGE, "repository": "mirror.example/projecthami/hami"}}}},
            "devicePlugin.monitor.image.repository",
        ),
    ],
    ids=["hami-file", "device-plugin", "mirrored-monitor"],
)
def test_hamis_image_stops_the_install_naming_the_key(tmp_path, values, key):
    result = render(tmp_path, values)
    assert result.returncode != 0
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("Error:")]
    assert f"{key}=" in line and "HAMi's image" in line, line


def test_another_repository_is_rendered_as_given(tmp_path):
    image = {"registry": "mirror.example", "repository": "platform/hami-py", "tag": "0.1.0"}
    result = render(tmp_path, {"devicePlugin": {"image": image}})
    assert result.returncode == 0, result.stderr
    assert "image: mirror.example/platform/hami-py:0.1.0" in result.stdout
