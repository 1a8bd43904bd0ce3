"""A MIG container's grant names its MIG devices, and libvgpu holds the container to them (found
by review, 1 Dec): the device plugin wrote ``HAMI_GRANT_DEVICES=`` (empty) for a MIG container,
which libvgpu reads as "every device the process sees is granted". A tenant's ``envFrom`` setting
``NVIDIA_VISIBLE_DEVICES`` (it comes after Allocate's env) then had the runtime show it other
MIG instances, which it used with no limit; and a container of two instances had its limits
numbered by CUDA's order, not the grant's.

Each check runs what ``build_response`` answers for a MIG container: its grant file mounted
read-only where libvgpu finds it, on the fake driver's MIG model (``visible_devices_env``: a
process sees the MIG devices its ``NVIDIA_VISIBLE_DEVICES`` names, or every GPU whole for
``all``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hami.core.types import ContainerDevice
from hami.deviceplugin import allocate as A
from hami.node.layout import HookPaths
from hami.node.settings import NodeSettings

from .conftest import BUILD, FAKE, FAKE_NVML, ROOT
from .test_libvgpu import run_with_mount
from .region_layout import read_region
from .test_mig import A100, H100, make_instances

pytestmark = pytest.mark.native

NO_DEVICE, NO_PERMISSION = "100", "4"  # CUDA_ERROR_NO_DEVICE, NVML_ERROR_NO_PERMISSION

# NVML's init (first with NVML_FIRST=1: a failed cuInit refuses NVML too), cuInit, then each
# CUDA device's total memory in MiB (a context on it), then NVML's init (when not first)
PROBE = """
import ctypes as C, os
cu = C.CDLL("libcuda.so.1"); nvml = C.CDLL("libnvidia-ml.so.1")
first = os.environ.get("NVML_FIRST") == "1"
out = [nvml.nvmlInit_v2()] if first else []
out.append(cu.cuInit(0))
n = C.c_int(0)
cu.cuDeviceGetCount(C.byref(n))
for i in range(n.value if out[-1] == 0 else 0):
    ctx, free, total = C.c_void_p(), C.c_size_t(), C.c_size_t()
    cu.cuDevicePrimaryCtxRetain(C.byref(ctx), i); cu.cuCtxSetCurrent(ctx)
    cu.cuMemGetInfo_v2(C.byref(free), C.byref(total))
    out.append(total.value >> 20)
if not first:
    out.append(nvml.nvmlInit_v2())
print(*out)
"""


@pytest.fixture
def node(native_build, tmp_path):
    """A fake machine with an A100 and an H100 in MIG mode, a 3g instance on the A100 and a 1g
    on the H100; ``run(grant, visible)`` runs PROBE in a container of that grant whose
    ``NVIDIA_VISIBLE_DEVICES`` is ``visible``."""
    cfg = tmp_path / "fakegpu.conf"
    cfg.write_text(
        f"state_dir={tmp_path / 'fg'}\nvisible_devices_env=NVIDIA_VISIBLE_DEVICES\n"
        "device name=NVIDIA A100-SXM4-40GB,memory=40Gi,mig_mode=1\n"
        "device name=NVIDIA H100 80GB HBM3,memory=80Gi,mig_mode=1\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FAKEGPU_", "CUDA_", "LD_PRELOAD", "NVIDIA_", "HAMI_", "LIBCUDA_"))
    }
    env.update(
        FAKEGPU_CONFIG=str(cfg),
        LD_LIBRARY_PATH=str(FAKE),
        FAKE_NVML=str(FAKE_NVML),
        PYTHONPATH=f"{Path(__file__).parent}:{ROOT / 'src'}",
    )
    a, b = make_instances(env, [[A100, "3g.20gb", 4], [H100, "1g.10gb", 6]])
    paths = HookPaths(str(tmp_path / "hook"))
    vgpu = Path(paths.vgpu_dir)
    vgpu.mkdir(parents=True)
    (vgpu / "hami-grant.env").write_text("")  # the mount point
    count = iter(range(100))

    def run(grant: list[tuple[str, str, int]], visible: str, nvml_first: bool = False):
        """``grant``: (GPU, MIG device, MiB) per granted device, in grant order."""
        ctr = A.ContainerView(f"c{next(count)}")  # a region of its own
        pod = A.PodView("ns", "p", "uid-1", {}, (ctr,))
        devices = tuple(ContainerDevice(gpu, "NVIDIA", mib, 100) for gpu, _, mib in grant)
        r = A.build_response(
            pod, A.Grant(0, ctr, devices), NodeSettings(operating_mode="mig"), paths, [m for _, m, _ in grant]
        )
        text = tmp_path / f"{ctr.name}.grant"
        text.write_text(r.grant)
        ctr_env = {**env, **r.envs, "LD_PRELOAD": str(BUILD / "libvgpu.so"), "LIBCUDA_LOG_LEVEL": "0"}
        ctr_env["NVIDIA_VISIBLE_DEVICES"] = visible  # the pod's own value, which comes last
        ctr_env["NVML_FIRST"] = "1" if nvml_first else ""
        p = run_with_mount(PROBE, ctr_env, text, vgpu / "hami-grant.env")
        assert p.returncode == 0, p
        return p.stdout.split(), p.stderr, read_region(r.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"])

    return a, b, run


def test_a_mig_container_that_sees_an_instance_it_was_not_granted_gets_no_device(node):
    """The review's scenario: a pod granted the A100's instance sets NVIDIA_VISIBLE_DEVICES (an
    envFrom) to also show the H100's, another tenant's: CUDA and NVML give it no device. Before,
    it used both, the second with no limit."""
    a, b, run = node
    out, err, region = run([(A100, a, 3000)], a)  # the control: its own instance, limited
    assert out == ["0", "3000", "0"], err
    out, err, region = run([(A100, a, 3000)], f"{a},{b}")
    assert out == [NO_DEVICE, NO_PERMISSION], err
    assert f"the process sees GPU-{b[4:]}, which its grant does not name" in err, err  # CUDA's name of it
    out, err, region = run([(A100, a, 3000)], f"{a},{b}", nvml_first=True)
    assert out == [NO_PERMISSION, NO_DEVICE], err
    assert f"the process sees {b}, which its grant does not name" in err, err  # NVML's


def test_all_gpus_shown_whole_are_refused_and_nvml_lets_through_only_a_granted_instances_gpu(node):
    """``NVIDIA_VISIBLE_DEVICES=all``: the process sees the GPUs themselves. CUDA runs on no GPU a
    grant of MIG devices names (CUDA never shows a GPU in MIG mode whole: it would be the whole
    GPU); NVML, which in a MIG container lists each instance's GPU, accepts a GPU only when one
    of its MIG devices is granted."""
    a, b, run = node
    out, err, region = run([(A100, a, 3000)], "all", nvml_first=True)
    assert out == [NO_PERMISSION, NO_DEVICE], err
    nvml = [line for line in err.splitlines() if "NVML refuses" in line]
    assert len(nvml) == 1 and f"sees {H100}," in nvml[0], err  # the H100 has no granted instance
    out, err, region = run([(A100, a, 3000), (H100, b, 2000)], "all", nvml_first=True)
    assert out == ["0", NO_DEVICE], err  # both GPUs hold a granted instance: NVML starts
    assert "NVML refuses" not in err and f"sees {A100}, which its grant does not name" in err, err  # CUDA
    # the GPUs NVML let through take no index of the region: its devices are the grant's
    assert (region["device_num"], region["uuids"][:3]) == (2, [a, b, ""]), region["uuids"]


def test_a_multi_instance_containers_limits_follow_the_grant_not_cudas_order(node):
    """The review's second scenario: grant [the H100's 1g with 2000 MiB, the A100's 3g with 5000
    MiB]; CUDA numbers the devices in its own order (the A100 first), not the grant's, and so does
    NVML. Each instance keeps its own limit, whichever of CUDA and NVML comes first. Before, region
    indices went by first use: CUDA ordinal 0, the A100's 3g, got LIMIT_0, the 1g's 2000 MiB."""
    a, b, run = node
    out, err, region = run([(H100, b, 2000), (A100, a, 5000)], f"{a},{b}")  # the runtime's order
    assert out == ["0", "5000", "2000", "0"], err
    out, err, region = run([(H100, b, 2000), (A100, a, 5000)], f"{a},{b}", nvml_first=True)  # NVML's order first
    assert out == ["0", "0", "5000", "2000"], err
    assert (region["device_num"], region["uuids"][:2]) == (2, [b, a]), region["uuids"]
