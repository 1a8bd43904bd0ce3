"""The names Koordinator's hami-daemon chart copies libvgpu.so by, against what the
Containerfile links at HAMi's library path.

The chart (koordinator-sh/charts, hami-daemon) runs the HAMi image as
``cp -f /k8s-vgpu/lib/nvidia/libvgpu.so.<daemon.hamiCore.libvgpuSoVersion> /usr/local/vgpu/libvgpu.so
&& vGPUmonitor -v=4``; its default ``libvgpuSoVersion`` is ``v2.6.0`` (chart 0.1.0's
values.yaml, and the table of Koordinator's "GPU share with HAMi" guide). Installed with its
defaults and our image, the chart's ``cp`` must find the library. The built image's layout is
checked by tests/integration/test_images.py (the chart's command in the image, both names)."""

from __future__ import annotations

import re
from pathlib import Path

from hami_devkit.koordinator import LIBVGPU_SO_VERSION

CONTAINERFILE = Path(__file__).resolve().parents[2] / "Containerfile"

#: the chart's default ``daemon.hamiCore.libvgpuSoVersion``
KOORD_CHART_DEFAULT = "v2.6.0"


def linked_names() -> dict[str, str]:
    """``libvgpu.so*`` names the Containerfile links under /k8s-vgpu/lib/nvidia, to their target."""
    text = CONTAINERFILE.read_text()
    return dict(
        (name, target) for target, name in re.findall(r"ln -s (\S+) /k8s-vgpu/lib/nvidia/(libvgpu\.so\S*)", text)
    )


def test_the_image_links_the_chart_default_name() -> None:
    names = linked_names()
    assert f"libvgpu.so.{KOORD_CHART_DEFAULT}" in names, names


def test_every_name_is_a_link_to_the_one_library() -> None:
    names = linked_names()
    # HAMi's plain name, the version our docs and the Koordinator test set, the chart's default
    for version in ("", f".{LIBVGPU_SO_VERSION}", f".{KOORD_CHART_DEFAULT}"):
        assert names.get(f"libvgpu.so{version}") == "/opt/hami/libvgpu.so", names
    assert set(names.values()) == {"/opt/hami/libvgpu.so"}, names
