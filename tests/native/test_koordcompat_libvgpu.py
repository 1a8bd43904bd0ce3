"""Our libvgpu under exactly the settings Koordinator's koordlet injects for a pod labelled
``koordinator.sh/gpu-isolation-provider: HAMi-core`` (its GPUEnvInject hook,
pkg/koordlet/runtimehooks/hooks/gpu in Koordinator v1.7.0), against the fake GPU.

koordlet sets ``CUDA_DEVICE_MEMORY_LIMIT`` (the first GPU's grant in bytes, a bare number),
``CUDA_DEVICE_SM_LIMIT`` (``gpu-core``), ``NVIDIA_VISIBLE_DEVICES`` (GPU minors) and
``LD_PRELOAD``; with its ``HamiCoreVGPUMonitor`` gate also
``CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/<pod UID>_<container>.cache``. No grant file,
no indexed limit, no policy.

Compute: HAMi-core holds such a pod to ``gpu-core`` at all times (no node agent clears its
region's utilization switch), so libvgpu takes the ``force`` policy for koordlet's settings;
our device plugin's settings keep the work-conserving default. Memory: one limit, for every GPU
the container sees, each GPU counted on its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT, run_py
from .cshare import LIB, LOAD, Trace, base_env

pytestmark = pytest.mark.native

GiB, MiB = 1 << 30, 1 << 20
LIMIT = 30  # gpu-core
TOL = 5.0  # as tests/native/test_compute_share.py: never more than limit + TOL
LOW = 0.25  # held, not starved
UNTHROTTLED = 15.0  # "clearly not held": more than limit + 15 points
POD_UID = "0f5c8a1e-3b7d-4c2a-9e61-5d4b2a7c8f90"


def koordlet_env(*, region: Path | None, gpus: int = 1, memory: int = 20 * GiB) -> dict[str, str]:
    """koordlet's variables for a pod granted ``gpus`` GPUs (minors 0..) with ``memory`` bytes
    and ``LIMIT`` cores each; ``region``: the path the HamiCoreVGPUMonitor gate names, or None
    (the gate off: no region variable)."""
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus)),
        "CUDA_DEVICE_MEMORY_LIMIT": str(memory),
        "CUDA_DEVICE_SM_LIMIT": str(LIMIT),
        "LD_PRELOAD": str(LIB),
    }
    if region is not None:
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(region)
    return env


def gate_region(tmp_path: Path) -> Path:
    return tmp_path / f"{POD_UID}_main.cache"


@pytest.fixture
def env(native_build):
    return base_env(native_build / "fakegpu")


def run_load(env: dict[str, str], machine: Path, injected: dict[str, str], seconds: float = 2.5, private_tmp=False):
    """Run the compute load (1 ms kernels) alone on a fresh fake machine with ``injected`` over
    the fake driver's environment; returns (trace, stderr). ``private_tmp``: in a mount namespace
    with a tmpfs of its own at /tmp (the region then lands in its own /tmp/cudevshr.cache, as in a
    container; the fake machine is kept there too)."""
    e = {**env, **injected, "FAKEGPU_STATE_DIR": str(machine), "LIBCUDA_LOG_LEVEL": "3"}
    argv = [str(LOAD), "plain", "1000", str(seconds), "32", "0", "0"]
    if private_tmp:
        e["FAKEGPU_STATE_DIR"] = "/tmp/fakegpu-machine"
        # the checkout may itself be under /tmp (a CI clone): it is opened before the tmpfs hides
        # it and bound back at its path through that descriptor (no canonicalising: the path
        # would then name the new, empty directory)
        script = (
            'exec 3<"$HAMI_ROOT" && mount -t tmpfs none /tmp && mkdir -p "$HAMI_ROOT" && '
            'mount --no-canonicalize --bind /proc/self/fd/3 "$HAMI_ROOT" && exec 3<&- && exec "$@"'
        )
        e["HAMI_ROOT"] = str(ROOT)
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"]
        argv += [str(LOAD), "plain", "1000", str(seconds), "32", "0", "0"]
    proc = subprocess.run(argv, env=e, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr}"
    return Trace.parse(proc.stdout), proc.stderr


def steady(trace: Trace) -> float:
    return trace.share(trace.start + 500, trace.end - 50)


def _namespace_available() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


def test_koordlet_pod_alone_is_held_to_its_gpu_core(env, tmp_path):
    """With the HamiCoreVGPUMonitor gate (the set-up docs/integrations.md gives): alone on the
    GPU, the pod still gets its 30 %, as under HAMi-core. Before: 98 %."""
    trace, err = run_load(env, tmp_path / "m", koordlet_env(region=gate_region(tmp_path)))
    achieved = steady(trace)
    print(f"koordlet settings, alone: {achieved:.1f}% (gpu-core {LIMIT})")
    assert LOW * LIMIT <= achieved <= LIMIT + TOL, achieved
    assert "policy force (koordlet's HAMi-core settings)" in err, err


@pytest.mark.skipif(not _namespace_available(), reason="needs root and unshare -m")
def test_koordlet_pod_without_the_monitor_gate_is_held_too(env, tmp_path):
    """Without the gate koordlet names no region: the container's own /tmp/cudevshr.cache."""
    trace, err = run_load(env, tmp_path / "m", koordlet_env(region=None), private_tmp=True)
    achieved = steady(trace)
    print(f"koordlet settings without the monitor gate, alone: {achieved:.1f}% (gpu-core {LIMIT})")
    assert LOW * LIMIT <= achieved <= LIMIT + TOL, achieved


def test_a_koordlet_pod_may_ask_for_the_work_conserving_policy(env, tmp_path):
    injected = {**koordlet_env(region=gate_region(tmp_path)), "GPU_CORE_UTILIZATION_POLICY": "default"}
    trace, err = run_load(env, tmp_path / "m", injected)
    achieved = steady(trace)
    print(f"koordlet settings with policy default, alone: {achieved:.1f}%")
    assert achieved > LIMIT + UNTHROTTLED, achieved
    assert "policy default," in err, err


def test_device_plugin_settings_keep_the_work_conserving_default(env, tmp_path):
    """Our device plugin's (and HAMi's, Volcano's) settings without a grant file: indexed
    memory limits and a region of its own naming; alone on the GPU, not held."""
    injected = {
        "NVIDIA_VISIBLE_DEVICES": "GPU-f00dfeed-0000-4000-8000-000000000000",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "20480m",
        "CUDA_DEVICE_SM_LIMIT": str(LIMIT),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp_path / "6b0d3a52-7c1e-4f0e-9a55-3c2f7e9d1a40.cache"),
        "LD_PRELOAD": str(LIB),
    }
    trace, err = run_load(env, tmp_path / "m", injected)
    achieved = steady(trace)
    print(f"device plugin settings, alone: {achieved:.1f}% (gpu-core {LIMIT})")
    assert achieved > LIMIT + UNTHROTTLED, achieved
    assert "policy default," in err, err


@pytest.mark.parametrize(
    "name, settings",
    [
        # `hami exec --gpumem 1G` without --devices: the unindexed limit, its own region name
        ("hami exec", {"CUDA_DEVICE_MEMORY_LIMIT": "1073741824", "REGION": "hami-exec-k2j4.cache"}),
        # the device plugin with an unindexed limit too (a grant's all-devices memory)
        ("indexed", {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "CUDA_DEVICE_MEMORY_LIMIT_1": "1g", "REGION": "a.cache"}),
        # a region that only looks like koordlet's
        ("not a UID", {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "REGION": f"{POD_UID[:-1]}x_main.cache"}),
        ("not a container", {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "REGION": f"{POD_UID}_Main.cache"}),
        ("not a cache", {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "REGION": f"{POD_UID}_main.region"}),
        # no memory limit: not koordlet's (it always sets one)
        ("compute only", {"REGION": f"{POD_UID}_main.cache"}),
        # koordlet's shape, the policy named
        ("disable named", {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "GPU_CORE_UTILIZATION_POLICY": "disable"}),
    ],
)
def test_only_koordlets_settings_imply_the_force_policy(env, tmp_path, name, settings):
    settings = dict(settings)
    region = tmp_path / settings.pop("REGION", f"{POD_UID}_main.cache")
    injected = {
        "CUDA_DEVICE_SM_LIMIT": str(LIMIT),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(region),
        "LD_PRELOAD": str(LIB),
        **settings,
    }
    _, err = run_load(env, tmp_path / "m", injected, seconds=0.2)
    assert "koordlet's HAMi-core settings" not in err, (name, err)
    want = "policy disable," if "GPU_CORE_UTILIZATION_POLICY" in settings else "policy default,"
    assert want in err, (name, err)


PROBE = """
import cuda_probe as c, pynvml as n
n.nvmlInit()
for dev in (0, 1):
    c.init(dev)
    total = c.mem_info()[1]
    nvml_total = n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(dev)).total
    rc_fit, _ = c.alloc({fit})
    rc_over, _ = c.alloc({over})
    print(dev, total, nvml_total, rc_fit, rc_over)
"""


def test_two_gpu_koordlet_pod_has_the_limit_on_each_gpu(fake_env, tmp_path):
    """koordlet's one CUDA_DEVICE_MEMORY_LIMIT for a two-GPU grant: each GPU shows the limit,
    takes 1.5 GiB of it (the other GPU's 1.5 GiB not counted) and refuses 1 GiB more."""
    env = {k: v for k, v in fake_env.items() if not k.startswith(("CUDA_", "LD_PRELOAD", "GPU_CORE"))}
    env.update(koordlet_env(region=gate_region(tmp_path), gpus=2, memory=2 * GiB))
    out = run_py(PROBE.format(fit=1536 * MiB, over=GiB), env).stdout.split("\n")
    rows = [line.split() for line in out if line.strip()]
    assert [r[0] for r in rows] == ["0", "1"], out
    for dev, total, nvml_total, rc_fit, rc_over in rows:
        assert int(total) == 2 * GiB and int(nvml_total) == 2 * GiB, (dev, out)
        assert rc_fit == "0", (dev, out)
        assert rc_over == "2", (dev, out)  # CUDA_ERROR_OUT_OF_MEMORY
