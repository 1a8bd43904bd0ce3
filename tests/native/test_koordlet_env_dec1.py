"""Under Koordinator, koordlet sets only the unnumbered CUDA_DEVICE_MEMORY_LIMIT /
CUDA_DEVICE_SM_LIMIT and the pod controls the rest of its env (found by review, 1 Dec): a pod's
own CUDA_DEVICE_MEMORY_LIMIT_0=0 or =80g lifted its 20 GiB limit (a numbered value won, and 0 was
no limit). From the environment (no grant file) a numbered 0 now falls back to the unnumbered
value (as HAMi-core) and a numbered value can only lower a set unnumbered one."""

from __future__ import annotations

import pytest

from .conftest import run_py
from .region_layout import read_region
from .test_koordcompat_libvgpu import LIMIT, gate_region, koordlet_env

pytestmark = pytest.mark.native

GiB = 1 << 30
PROBE = """
import cuda_probe as c
c.init(0)
print(c.mem_info()[1], c.alloc(30 << 30)[0])
"""


@pytest.mark.parametrize("numbered", ["0", "80g", str(80 * GiB)])
def test_a_koordlet_pod_cannot_lift_its_memory_limit_with_a_numbered_one(fake_env, tmp_path, numbered):
    """koordlet's 20 GiB, plus the pod's CUDA_DEVICE_MEMORY_LIMIT_0: still 20 GiB, 30 GiB refused."""
    region = gate_region(tmp_path)
    env = {**fake_env, **koordlet_env(region=region), "CUDA_DEVICE_MEMORY_LIMIT_0": numbered}
    p = run_py(PROBE, env)
    total, rc = (int(x) for x in p.stdout.split())
    assert (total, rc) == (20 * GiB, 2), p  # 2: CUDA_ERROR_OUT_OF_MEMORY
    assert read_region(region)["limit"][0] == 20 * GiB


def test_a_numbered_limit_below_koordlets_still_lowers_it(fake_env, tmp_path):
    """A pod may hold itself to less (the min of the two)."""
    env = {**fake_env, **koordlet_env(region=gate_region(tmp_path)), "CUDA_DEVICE_MEMORY_LIMIT_0": "4g"}
    total, rc = (int(x) for x in run_py(PROBE, env).stdout.split())
    assert (total, rc) == (4 * GiB, 2)


@pytest.mark.parametrize("numbered", ["0", "100"])
def test_a_koordlet_pod_cannot_lift_its_compute_share_with_a_numbered_one(fake_env, tmp_path, numbered):
    """koordlet's gpu-core 30, plus the pod's CUDA_DEVICE_SM_LIMIT_0: the region still holds 30."""
    region = gate_region(tmp_path)
    env = {**fake_env, **koordlet_env(region=region), "CUDA_DEVICE_SM_LIMIT_0": numbered}
    run_py(PROBE, env)
    assert read_region(region)["sm_limit"][0] == LIMIT


def test_hamis_device_plugin_settings_are_read_as_before(fake_env, tmp_path):
    """HAMi's device plugin sets the numbered memory limit only (unnumbered unset): it is the limit."""
    region = tmp_path / "6b0d3a52-7c1e-4f0e-9a55-3c2f7e9d1a40.cache"
    env = {**koordlet_env(region=region), "CUDA_DEVICE_MEMORY_LIMIT_0": "8g"}
    del env["CUDA_DEVICE_MEMORY_LIMIT"]
    total, rc = (int(x) for x in run_py(PROBE, {**fake_env, **env}).stdout.split())
    assert (total, rc) == (8 * GiB, 2)
    assert read_region(region)["limit"][0] == 8 * GiB
