"""What discovery reads from sysfs for the DRA slice's standard attributes: the kernel's NUMA
node of a GPU and the PCIe root complex above it, from a tree built the way the kernel lays
out /sys (``bus/pci/devices/<bdf>`` links into ``devices/pci<domain>:<bus>/...``)."""

from __future__ import annotations

import os

import pytest

from hami.node.nvml import numa_node, pcie_root, sysfs_numa

BDF = "0000:3b:00.0"


def link_device(root, bdf=BDF, path=f"pci0000:3a/0000:3a:00.0/{BDF}", numa=None, relative=True):
    """``devices/<path>`` as a directory and ``bus/pci/devices/<bdf>`` linking to it."""
    target = root / "devices" / path
    target.mkdir(parents=True)
    if numa is not None:
        (target / "numa_node").write_text(f"{numa}\n")
    bus = root / "bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, bus) if relative else target, bus / bdf)


@pytest.mark.parametrize("relative", [True, False])
def test_pcie_root_is_the_first_directory_below_devices(tmp_path, relative):
    link_device(tmp_path, relative=relative)
    assert pcie_root(tmp_path, BDF) == "pci0000:3a"


def test_pcie_root_of_a_gpu_right_below_its_root_port(tmp_path):
    """As an H200 VM showed it (driver 580.159.04): /sys/bus/pci/devices/0000:00:06.0 ->
    ../../../devices/pci0000:00/0000:00:06.0, numa_node -1 (no affinity)."""
    link_device(tmp_path, bdf="0000:00:06.0", path="pci0000:00/0000:00:06.0", numa=-1)
    assert pcie_root(tmp_path, "0000:00:06.0") == "pci0000:00"
    assert sysfs_numa(tmp_path, "0000:00:06.0") is None


def test_pcie_root_is_the_root_complex_also_behind_switches(tmp_path):
    link_device(tmp_path, path=f"pci0001:80/0001:80:01.0/0001:81:00.0/0001:82:08.0/{BDF}")
    assert pcie_root(tmp_path, BDF) == "pci0001:80"


@pytest.mark.parametrize(
    "make",
    [
        lambda root: None,  # no such device
        lambda root: (root / "bus/pci/devices" / BDF).mkdir(parents=True),  # a directory, not a link
        lambda root: link_device(root, path=f"platform/soc/{BDF}"),  # not under a PCI root
        lambda root: link_device(root, path="pci0000:3a/0000:3a:00.0/0000:99:00.0"),  # another device
        lambda root: link_device(root, path=BDF),  # directly below devices: no root
    ],
)
def test_pcie_root_is_unknown_rather_than_guessed(tmp_path, make):
    make(tmp_path)
    assert pcie_root(tmp_path, BDF) is None


@pytest.mark.parametrize("text,want,registration", [("1", 1, 1), ("0", 0, 0), ("-1", None, 0), ("x", None, 0)])
def test_sysfs_numa_is_the_kernels_value_or_unknown(tmp_path, text, want, registration):
    link_device(tmp_path, numa=text)
    assert sysfs_numa(tmp_path, BDF) == want
    assert numa_node(tmp_path, BDF) == registration  # the registration's rule: unknown is node 0


def test_sysfs_numa_of_a_missing_device_is_unknown(tmp_path):
    assert sysfs_numa(tmp_path, BDF) is None and numa_node(tmp_path, BDF) == 0
