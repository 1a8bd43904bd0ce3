"""libvgpu takes the grant file whole or refuses to run (found by review, 1 Dec): it read at most
65,535 bytes of it without saying so, and a setting cut off (``HAMI_GRANT_DEVICES``, written last
after a pod's 66,000-byte ``GPU_CORE_UTILIZATION_POLICY``) was read from the environment instead:
no list, no device check, every GPU the container saw (a pod's ``NVIDIA_VISIBLE_DEVICES=all``)."""

from __future__ import annotations

import pytest

from hami.node import contract

from .conftest import run_py
from .test_libvgpu import run_with_mount

pytestmark = pytest.mark.native

# CUDA's answer to cuInit
PROBE = """
import ctypes as C
print(C.CDLL("libcuda.so.1").cuInit(0))
"""
NODE = "CUDA_DEVICE_MEMORY_LIMIT=\nCUDA_DEVICE_MEMORY_LIMIT_0=256m\nCUDA_DEVICE_SM_LIMIT=30\n"
#: a GPU the fake node does not have: a grant that names it gives the process no device
DEVICES = "HAMI_GRANT_DEVICES=GPU-not-on-this-node\n"
NO_DEVICE = ["100"]  # CUDA_ERROR_NO_DEVICE


@pytest.fixture
def mounted(vgpu_env, tmp_path):
    """Runs PROBE with the given grant text mounted at ``<hook>/vgpu/hami-grant.env``."""
    hook = tmp_path / "hook" / "vgpu"
    hook.mkdir(parents=True)
    (hook / "hami-grant.env").write_text("")
    del vgpu_env["CUDA_DEVICE_MEMORY_LIMIT"]

    def run(text: bytes):
        (tmp_path / "grant").write_bytes(text)
        return run_with_mount(PROBE, vgpu_env, tmp_path / "grant", hook / "hami-grant.env")

    assert run_py(PROBE, vgpu_env).stdout.split() == ["0"]  # the fake node's GPUs, no grant
    return run


def test_a_grant_that_names_the_devices_gives_none_it_does_not_name(mounted):
    """The control: a whole grant naming a GPU the process does not see leaves it no device."""
    p = mounted((NODE + DEVICES).encode())
    assert p.returncode == 0 and p.stdout.split() == NO_DEVICE, p


def test_a_grant_larger_than_libvgpu_reads_is_refused(mounted):
    """The review's scenario: the device list after a 66,000-byte policy (the old order of the
    grant file) fell past the 64 KiB libvgpu reads; the process then saw every GPU."""
    p = mounted((NODE + "GPU_CORE_UTILIZATION_POLICY=" + "x" * 66000 + "\n" + DEVICES).encode())
    assert p.returncode == 78, p
    assert "hami-grant.env" in p.stderr and "bytes) is larger than the 65535 bytes" in p.stderr, p.stderr
    # one that just fits is read whole
    pad = 65535 - len(NODE + DEVICES) - len("GPU_CORE_UTILIZATION_POLICY=\n")
    p = mounted((NODE + "GPU_CORE_UTILIZATION_POLICY=" + "x" * pad + "\n" + DEVICES).encode())
    assert p.returncode == 0 and p.stdout.split() == NO_DEVICE, p


def test_a_grant_cut_short_within_its_last_line_is_refused(mounted):
    """``HAMI_GRANT_DEV``: the last line lost its ``=`` and value (a file written in part); that
    name was then read from the environment, where the pod has none: no device check."""
    p = mounted((NODE + DEVICES[:14]).encode())
    assert p.returncode == 78, p
    assert "hami-grant.env" in p.stderr and "does not end with a line break" in p.stderr, p.stderr


def test_a_grant_holding_a_nul_byte_is_refused(mounted):
    """A NUL in a value ended libvgpu's reading of the file there: what came after it (the device
    list) was read from the environment."""
    p = mounted((NODE + "GPU_CORE_UTILIZATION_POLICY=force\0\n" + DEVICES).encode())
    assert p.returncode == 78 and "holds a NUL byte" in p.stderr, p


def test_a_grant_naming_more_settings_than_libvgpu_keeps_is_refused(mounted):
    """libvgpu keeps 512 settings; those after (the device list) were read from the environment."""
    p = mounted((NODE + "".join(f"UNUSED_{i}=\n" for i in range(600)) + DEVICES).encode())
    assert p.returncode == 78 and "names more than 512 settings" in p.stderr, p


def test_the_device_plugins_grant_keeps_the_device_list_within_reach(mounted):
    """The device plugin's grant file (hami.node.contract.grant_file): the device list first, a
    pod's own value last and bounded, so a long policy is refused before any file is written."""
    env = {"CUDA_DEVICE_MEMORY_LIMIT_0": "256m", "CUDA_DEVICE_SM_LIMIT": "30"}
    text = contract.grant_file(env, {"GPU_CORE_UTILIZATION_POLICY": "force"}, ["GPU-not-on-this-node"])
    assert text.startswith(DEVICES)
    p = mounted(text.encode())
    assert p.returncode == 0 and p.stdout.split() == NO_DEVICE, p
    with pytest.raises(ValueError, match="GPU_CORE_UTILIZATION_POLICY='x+[.][.][.]' is 66000 bytes"):
        contract.grant_file(env, {"GPU_CORE_UTILIZATION_POLICY": "x" * 66000}, ["GPU-not-on-this-node"])
