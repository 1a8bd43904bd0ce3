"""A MIG container's grant file names its MIG devices, in grant order (found by review, 1 Dec):
``build_response`` wrote ``HAMI_GRANT_DEVICES=`` (empty) for a MIG container, which libvgpu reads
as "every device the process sees is granted", so a pod's own ``NVIDIA_VISIBLE_DEVICES=all`` (an
``envFrom``, after Allocate's env) used every MIG instance of the node, and the limits of a
multi-instance container were numbered by CUDA's order. libvgpu's side:
tests/native/test_review_mig_grant_dec1d.py."""

from __future__ import annotations

from hami.core.types import ContainerDevice
from hami.deviceplugin import allocate as A
from hami.node.layout import GRANT_FILE, HookPaths
from hami.node.settings import NodeSettings

GPU0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
GPU1 = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
MIG_ON_GPU1 = "MIG-11111111-0000-4000-8000-000000000001"
MIG_ON_GPU0 = "MIG-00000000-0000-4000-8000-000000000003"
PATHS = HookPaths("/opt/h", "/tmp/vl")


def grant_values(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines())


def answer(mode: str, devices, mig=()):
    ctr = A.ContainerView("main", {"nvidia.com/gpu": str(len(devices))})
    pod = A.PodView("ns", "p", "uid-1", {}, (ctr,))
    grant = A.Grant(0, ctr, tuple(ContainerDevice(u, "NVIDIA", mib, 100) for u, mib in devices))
    return A.build_response(pod, grant, NodeSettings(operating_mode=mode), PATHS, list(mig))


def test_a_mig_containers_grant_names_its_instances_in_grant_order():
    """The review's grant: [GPU 1's 1g.10gb, GPU 0's 3g.40gb]. The grant file lists the two MIG
    devices in that order, entry i being CUDA_DEVICE_MEMORY_LIMIT_<i>'s, as the container's
    NVIDIA_VISIBLE_DEVICES does."""
    r = answer("mig", [(GPU1, 9856), (GPU0, 40320)], [MIG_ON_GPU1, MIG_ON_GPU0])
    grant = grant_values(r.grant)
    assert grant["HAMI_GRANT_DEVICES"] == f"{MIG_ON_GPU1},{MIG_ON_GPU0}" == r.envs["NVIDIA_VISIBLE_DEVICES"]
    assert (grant["CUDA_DEVICE_MEMORY_LIMIT_0"], grant["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("9856m", "40320m")
    assert grant["CUDA_DEVICE_MEMORY_LIMIT_2"] == ""  # no third device
    # the file is mounted where libvgpu reads it, read-only, with the preload
    mounts = {m.container_path: (m.host_path, m.read_only) for m in r.mounts}
    assert mounts[f"{PATHS.vgpu_dir}/{GRANT_FILE}"] == (f"{r.cache_dir}/{GRANT_FILE}", True)
    assert "/etc/ld.so.preload" in mounts


def test_the_grant_never_names_the_instances_gpus():
    """The GPUs the instances are cut from are not granted whole: libvgpu lets an instance's GPU
    through NVML only as that instance's parent (native test), never as a device of its own."""
    r = answer("mig", [(GPU0, 4864), (GPU0, 9856)], [MIG_ON_GPU0, MIG_ON_GPU1])
    listed = grant_values(r.grant)["HAMI_GRANT_DEVICES"].split(",")
    assert listed == [MIG_ON_GPU0, MIG_ON_GPU1] and GPU0 not in listed


def test_a_shared_gpus_grant_is_unchanged():
    r = answer("hami-core", [(GPU0, 3000), (GPU1, 5000)])
    assert grant_values(r.grant)["HAMI_GRANT_DEVICES"] == f"{GPU0},{GPU1}"
