"""The libvgpu container contract (hami.node.contract): one set of functions behind the device
plugin's Allocate, the DRA agent's prepare and `hami exec`, and the two places where the paths
used to differ (docs/node.md, "One container contract")."""

from __future__ import annotations

import argparse
import uuid

import pytest

from hami import execcmd
from hami.core.types import ContainerDevice
from hami.deviceplugin import allocate as A
from hami.dra.model import DRIVER, SliceSettings
from hami.draplugin.prepare import Paths, cdi_spec, plan
from hami.node import contract
from hami.node.layout import HookPaths, MountSpec, parse_driver_mount
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
DRIVER_MOUNTS = (parse_driver_mount("/opt/drv:/usr/local/nvidia"), parse_driver_mount("/var/run/state:rw"))


def dp_response(env=None, paths=None, settings=None, limits=None):
    ctr = A.ContainerView("main", limits=limits or {}, env=env or {})
    pod = A.PodView("ns", "p", "uid-p", {}, (ctr,))
    grant = A.Grant(0, ctr, (ContainerDevice(uuid=U0, type="NVIDIA", usedmem=3000, index=0, usedcores=30),))
    return A.build_response(pod, grant, settings or NodeSettings(), paths or HookPaths("/usr/local", "/tmp/vl"))


def dra_edits(paths, isolation="hami-core"):
    gpus = [PhysicalGPU(0, U0, "Tesla T4", 15360, "0000:3b:00.0", 0)]
    config = [
        {
            "source": "FromClass",
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuConfig", "isolation": isolation},
            },
        }
    ]
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "node-a",
        "device": "gpu-0",
        "shareID": "s-1",
        "consumedCapacity": {"memory": "3000Mi" if isolation == "hami-core" else str(15360 << 20), "cores": "30"},
    }
    claim = {
        "metadata": {"namespace": "ns", "name": "c1", "uid": "uid-c"},
        "status": {"allocation": {"devices": {"results": [result], "config": config}}},
    }
    p = plan(claim, "node-a", gpus, SliceSettings())
    return cdi_spec(p, paths, contract.Options())["devices"][0]["containerEdits"]


def exec_env(tmp_path, *argv):
    lib = tmp_path / "libvgpu.so"
    lib.write_bytes(b"")
    p = argparse.ArgumentParser()
    execcmd.add_arguments(p)
    args = p.parse_args([*argv, "--lib", str(lib), "--cache", str(tmp_path / "r.cache"), "--", "true"])
    return execcmd.build_plan(args, {"PATH": "/usr/bin"}).env


# ----------------------------------------------------------------------- unification 1: mount order


def test_driver_mounts_come_first_on_both_front_ends():
    """Before the contract the DRA path put the driver mounts last; now both put them first, so
    a driver directory mounted over a parent of <hook>/vgpu cannot hide libvgpu's mounts."""
    dp = [m.container_path for m in dp_response(paths=HookPaths("/usr/local", "/tmp/vl", DRIVER_MOUNTS)).mounts]
    dra = [m["containerPath"] for m in dra_edits(Paths(hook_path="/usr/local", driver_mounts=DRIVER_MOUNTS))["mounts"]]
    libvgpu = [
        "/usr/local/vgpu/libvgpu.so",
        "/usr/local/vgpu",
        "/tmp/vgpulock",
        "/usr/local/vgpu/hami-grant.env",
        "/etc/ld.so.preload",
    ]
    assert dp == dra == ["/usr/local/nvidia", "/var/run/state", *libvgpu]


def test_without_isolation_only_the_driver_mounts_remain_on_both_front_ends():
    dp = dp_response(
        paths=HookPaths("/usr/local", "/tmp/vl", DRIVER_MOUNTS), settings=NodeSettings(operating_mode="mps")
    )
    dra = dra_edits(Paths(hook_path="/usr/local", driver_mounts=DRIVER_MOUNTS), isolation="none")
    assert (
        [m.container_path for m in dp.mounts]
        == [m["containerPath"] for m in dra["mounts"]]
        == ["/usr/local/nvidia", "/var/run/state"]
    )
    assert contract.container_mounts(HookPaths(), None) == ()


# ----------------------------------------------------------------------- unification 2: the preload


@pytest.mark.parametrize(
    "value,mounted",
    [
        *((v, False) for v in ("true", "TRUE", "True", "1", "t", "T")),  # Go's strconv.ParseBool, as HAMi
        *((v, True) for v in ("false", "", None, "tRuE", "yes", "0")),
    ],
)
def test_disable_control_is_one_rule(value, mounted):
    env = {} if value is None else {"CUDA_DISABLE_CONTROL": value}
    assert contract.preload_wanted(env) is mounted
    got = [m.container_path for m in dp_response(env=env).mounts]
    assert ("/etc/ld.so.preload" in got) is mounted


def test_the_preload_is_a_named_parameter_and_the_dra_path_always_mounts_it():
    """A claim is prepared before any container that uses it exists: no container env can switch
    the preload off there (the whole-GPU class is the way to run without libvgpu)."""
    paths = HookPaths("/usr/local", "/tmp/vl")
    on = contract.container_mounts(paths, "/r", preload=True)
    off = contract.container_mounts(paths, "/r", preload=False)
    assert on[-1] == MountSpec("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload", True)
    assert off == on[:-1]
    assert contract.container_mounts(paths, "/r") == on  # the default keeps isolation on
    dra = [m["containerPath"] for m in dra_edits(Paths(hook_path="/usr/local"))["mounts"]]
    assert "/etc/ld.so.preload" in dra


# ----------------------------------------------------------------------- one env table


def test_every_front_end_writes_the_same_names_in_the_same_order():
    opts = contract.Options(memory_oversubscribe=True, libcuda_log_level="1", core_policy="force")
    env = contract.limit_env(contract.Limits(("3000m", "4000m"), 30, "/r.cache", priority=0), opts)
    assert list(env) == [
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "CUDA_DEVICE_MEMORY_LIMIT_1",
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "CUDA_OVERSUBSCRIBE",
        "LIBCUDA_LOG_LEVEL",
        "CUDA_TASK_PRIORITY",
        "GPU_CORE_UTILIZATION_POLICY",
    ]
    assert env["CUDA_TASK_PRIORITY"] == "0" and env["CUDA_DEVICE_SM_LIMIT"] == "30"
    dp = dp_response(
        settings=NodeSettings(device_memory_scaling=2, libcuda_log_level="1", gpu_core_policy="force"),
        limits={"nvidia.com/priority": "0"},
    ).envs
    assert [k for k in dp if k != "NVIDIA_VISIBLE_DEVICES"] == [k for k in env if k != "CUDA_DEVICE_MEMORY_LIMIT_1"]


def test_device_limits_give_each_device_its_own_share_only_when_they_differ():
    env = contract.limit_env(contract.device_limits([3000, 5000], [30, 60], "/r.cache"), contract.Options())
    assert list(env) == [
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "CUDA_DEVICE_MEMORY_LIMIT_1",
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_DEVICE_SM_LIMIT_0",
        "CUDA_DEVICE_SM_LIMIT_1",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    ]
    # the unindexed share is the largest: libvgpu reading the environment lets an indexed share only
    # lower it (a Koordinator tenant's CUDA_DEVICE_SM_LIMIT_0=100 lifted koordlet's 30; review, 1 Dec)
    assert [env[k] for k in list(env)[:5]] == ["3000m", "5000m", "60", "30", "60"]
    # a device without a share (0: no cap) makes the unindexed one 0 too: an indexed 0 reads as it
    uncapped = contract.limit_env(contract.device_limits([3000, 5000], [0, 60], "/r.cache"), contract.Options())
    assert [uncapped[k] for k in list(uncapped)[2:5]] == ["0", "0", "60"]
    same = contract.limit_env(contract.device_limits([3000, 5000], [30, 30], "/r.cache"), contract.Options())
    assert same == contract.limit_env(contract.Limits(("3000m", "5000m"), 30, "/r.cache"), contract.Options())


@pytest.mark.parametrize("memory,cores", [([], []), ([3000], [30, 60]), ([3000, 5000], [30])])
def test_device_limits_refuse_lists_that_do_not_pair_up(memory, cores):
    with pytest.raises(ValueError, match="one memory and one core share per device"):
        contract.device_limits(memory, cores, "/r.cache")


def test_node_settings_give_the_same_options_to_both_front_ends():
    assert contract.options(NodeSettings()) == contract.Options()
    assert contract.options(NodeSettings(disable_core_limit=True, gpu_core_policy="force")).core_policy == "disable"
    assert contract.options(
        NodeSettings(gpu_core_policy="force", device_memory_scaling=1.5, libcuda_log_level="3")
    ) == contract.Options(memory_oversubscribe=True, libcuda_log_level="3", core_policy="force")


def test_hami_exec_differs_only_by_named_parameters(tmp_path):
    env = exec_env(tmp_path, "--gpumem", "1G")
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == str(1 << 30)  # all_devices_memory: no device list
    assert "CUDA_DEVICE_SM_LIMIT" not in env and "CUDA_DEVICE_MEMORY_LIMIT_0" not in env  # cores=None
    env = exec_env(tmp_path, "--gpumem", "1G", "--gpucores", "20", "--devices", "0")
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == (str(1 << 30), "20")


def test_region_files_keep_their_names():
    """A region file name is a contract with running containers and hami monitor: the same pod
    and container (or claim) name the same file as before the contract existed."""
    paths = HookPaths("/usr/local")
    assert (
        contract.container_region(paths, "uid-p", "main")
        == f"/usr/local/vgpu/{uuid.uuid5(uuid.NAMESPACE_URL, 'hami:uid-p/main')}.cache"
    )
    assert (
        contract.claim_region(paths, "uid-c")
        == f"/usr/local/vgpu/{uuid.uuid5(uuid.NAMESPACE_URL, 'hami-dra:uid-c')}.cache"
    )


def test_ld_preload_puts_the_library_first_once():
    assert (
        contract.ld_preload("/l/libvgpu.so", "/a/libfoo.so:/old/libvgpu.so::/b/libbar.so")
        == "/l/libvgpu.so:/a/libfoo.so:/b/libbar.so"
    )
    assert contract.ld_preload("/l/libvgpu.so") == "/l/libvgpu.so"
