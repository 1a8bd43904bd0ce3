"""Fake GPU boards for topology tests (FAKEGPU_DEVICES strings, docs/fakegpu.md "Topology")."""

from __future__ import annotations


def uuid(i: int) -> str:
    return f"GPU-f00dfeed-0000-4000-8000-{i:012d}"


def _join(specs: list[str]) -> str:
    return ";".join(specs)


def hgx_nvswitch() -> str:
    """8x H100 SXM on NVSwitch (18 links each); PCIe switches pair GPUs 0-1, 2-3, 4-5, 6-7; NUMA 0: 0-3, 1: 4-7."""
    return _join(
        [
            f"name=NVIDIA H100 80GB HBM3,memory=80Gi,pci=0000:{0x18 + 0x10 * i:02x}:00.0,nvswitch=18,"
            f"pcie_switch={i // 2},numa={i // 4}"
            for i in range(8)
        ]
    )


def partial_nvlink() -> str:
    """4x V100: NVLink pairs 0-1 and 2-3 (2 links each), one link 0-2, none for 1-3, 0-3, 1-2;
    PCIe switches: 0-1 on switch 0, 2-3 on switch 1, all on one host bridge (NUMA 0)."""
    links = {0: "1x2+2x1", 1: "0x2", 2: "3x2+0x1", 3: "2x2"}
    return _join(
        [
            f"name=Tesla V100-SXM2-32GB,memory=32Gi,pci=0000:{0x18 + 0x10 * i:02x}:00.0,nvlink={links[i]},"
            f"pcie_switch={i // 2},host_bridge=0,numa=0"
            for i in range(4)
        ]
    )


def pcie_only() -> str:
    """4x L4, no NVLink: 0-1 behind one PCIe switch, 2 on the same host bridge without a switch,
    3 on the other CPU."""
    extra = {
        0: "pcie_switch=0,host_bridge=0,numa=0",
        1: "pcie_switch=0,host_bridge=0,numa=0",
        2: "host_bridge=0,numa=0",
        3: "host_bridge=1,numa=1",
    }
    return _join([f"name=NVIDIA L4,memory=24Gi,pci=0000:{0x18 + 0x10 * i:02x}:00.0,{extra[i]}" for i in range(4)])


def asymmetric() -> str:
    """2 GPUs whose NVLink counts disagree (GPU 0 says 2 links, GPU 1 says 1)."""
    return _join(
        ["name=Tesla V100-SXM2-32GB,memory=32Gi,nvlink=1x2", "name=Tesla V100-SXM2-32GB,memory=32Gi,nvlink=0x1"]
    )
