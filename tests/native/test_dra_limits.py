"""The libvgpu variables the DRA kubelet plugin writes for a claim of two GPUs, consumed
differently, are what libvgpu enforces on each GPU: each its own memory limit (what CUDA
reports and refuses past) and its own compute share (in the region the compute limiter reads)."""

from __future__ import annotations

import pytest

from hami.dra.model import DRIVER, SliceSettings
from hami.draplugin.prepare import Options, Paths, cdi_spec, plan
from hami.node.contract import MEMORY_LIMIT, SM_LIMIT
from hami.node.nvml import PhysicalGPU

from .conftest import BUILD, run_py
from .region_layout import read_region

pytestmark = pytest.mark.native
MiB = 1 << 20
G = [f"GPU-f00dfeed-0000-4000-8000-{i:012d}" for i in range(2)]  # the fake's default UUIDs


def claim_env(shares=((1, "2Gi", "60"), (0, "1Gi", "30"))) -> dict[str, str]:
    """The env of the CDI spec of a claim of ``(gpu index, memory, cores)`` results (gpu-1 first:
    not the node's order), but the GPUs and the region file (the test's own)."""
    gpus = [PhysicalGPU(i, G[i], "NVIDIA H100 80GB HBM3", 81920, f"0000:{0x18 + 0x10 * i:02x}:00.0", 0) for i in (0, 1)]
    results = [
        {
            "request": f"r{n}",
            "driver": DRIVER,
            "pool": "n1",
            "device": f"gpu-{gpu}",
            "consumedCapacity": {"memory": memory, "cores": cores},
        }
        for n, (gpu, memory, cores) in enumerate(shares)
    ]
    claim = {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u1"},
        "status": {"allocation": {"devices": {"results": results, "config": []}}},
    }
    spec = cdi_spec(plan(claim, "n1", gpus, SliceSettings()), Paths(hook_path="/usr/local"), Options())
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    del env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    return env


def test_a_two_gpu_claim_is_limited_per_gpu(fake_env, tmp_path):
    env = claim_env()
    limits = {k: v for k, v in env.items() if k.startswith((MEMORY_LIMIT, SM_LIMIT)) and v}
    assert limits == {
        f"{MEMORY_LIMIT}_0": "1024m",
        f"{MEMORY_LIMIT}_1": "2048m",
        SM_LIMIT: "60",  # the largest share: an indexed one only lowers it (contract.device_limits)
        f"{SM_LIMIT}_0": "30",
        f"{SM_LIMIT}_1": "60",
    }
    cache = tmp_path / "claim.cache"
    fake_env.update(
        env,  # the limits, and every other libvgpu variable set empty (read as unset)
        FAKEGPU_COUNT="2",
        LD_PRELOAD=str(BUILD / "libvgpu.so"),
        CUDA_DEVICE_MEMORY_SHARED_CACHE=str(cache),
        LIBCUDA_LOG_LEVEL="0",
    )
    out = run_py(
        """
import cuda_probe as c
for dev in (0, 1):
    c.init(dev)
    free, total = c.mem_info()
    over = c.alloc(total + (64 << 20))[0]
    print(dev, total, over)
""",
        fake_env,
    ).stdout.split("\n")
    rows = [tuple(int(x) for x in line.split()) for line in out if line.strip()]
    assert rows == [(0, 1024 * MiB, 2), (1, 2048 * MiB, 2)]  # each GPU its own limit; past it: out of memory
    r = read_region(cache)
    assert r["uuids"][:2] == G
    assert r["limit"][:2] == [1024 * MiB, 2048 * MiB] and r["sm_limit"][:2] == [30, 60]


@pytest.mark.parametrize(
    "shares,want_sm,want_mib",
    [
        (((0, "1Gi", "30"),), [30], [1024]),  # one GPU: the claim's share is the unindexed one alone
        (((0, "1Gi", "30"), (1, "2Gi", "30")), [30, 30], [1024, 2048]),
        (((1, "1Gi", "30"), (0, "2Gi", "60")), [60, 30], [2048, 1024]),
    ],
    ids=["1-gpu", "2-gpu-equal", "2-gpu-unequal"],
)
def test_the_pods_own_libvgpu_env_does_not_survive_the_claims_edits(fake_env, tmp_path, shares, want_sm, want_mib):
    """A pod's env (or envFrom, or image ENV) with libvgpu settings of its own, the claim's CDI env
    applied over it by name as the runtime does: libvgpu enforces the claim's limits."""
    n = len(shares)
    pod = {
        **{f"{SM_LIMIT}_{i}": "100" for i in range(2)},
        **{f"{MEMORY_LIMIT}_{i}": "64g" for i in range(2)},
        MEMORY_LIMIT: "64g",
        "GPU_CORE_UTILIZATION_POLICY": "disable",
        "LIBVGPU_CONTEXT_SIZE": "0",
    }
    cache = tmp_path / "claim.cache"
    fake_env.update(pod)
    fake_env.update(claim_env(shares))
    fake_env.update(
        FAKEGPU_COUNT=str(n),
        LD_PRELOAD=str(BUILD / "libvgpu.so"),
        CUDA_DEVICE_MEMORY_SHARED_CACHE=str(cache),
        LIBCUDA_LOG_LEVEL="0",
    )
    out = run_py(
        f"""
import cuda_probe as c
for dev in range({n}):
    c.init(dev)
    print(c.mem_info()[1])
""",
        fake_env,
    ).stdout.split()
    assert [int(x) for x in out] == [m * MiB for m in want_mib]
    r = read_region(cache)
    assert r["sm_limit"][:n] == want_sm and r["limit"][:n] == [m * MiB for m in want_mib]
