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


def claim_env() -> dict[str, str]:
    gpus = [PhysicalGPU(i, G[i], "NVIDIA H100 80GB HBM3", 81920, f"0000:{0x18 + 0x10 * i:02x}:00.0", 0) for i in (0, 1)]
    results = [
        {
            "request": "b",
            "driver": DRIVER,
            "pool": "n1",
            "device": "gpu-1",
            "consumedCapacity": {"memory": "2Gi", "cores": "60"},
        },
        {
            "request": "a",
            "driver": DRIVER,
            "pool": "n1",
            "device": "gpu-0",
            "consumedCapacity": {"memory": "1Gi", "cores": "30"},
        },
    ]
    claim = {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u1"},
        "status": {"allocation": {"devices": {"results": results, "config": []}}},
    }
    spec = cdi_spec(plan(claim, "n1", gpus, SliceSettings()), Paths(hook_path="/usr/local"), Options())
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    return {k: v for k, v in env.items() if k.startswith((MEMORY_LIMIT, SM_LIMIT))}


def test_a_two_gpu_claim_is_limited_per_gpu(fake_env, tmp_path):
    limits = claim_env()
    assert limits == {
        f"{MEMORY_LIMIT}_0": "1024m",
        f"{MEMORY_LIMIT}_1": "2048m",
        SM_LIMIT: "30",
        f"{SM_LIMIT}_0": "30",
        f"{SM_LIMIT}_1": "60",
    }
    cache = tmp_path / "claim.cache"
    fake_env.update(
        limits,
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
