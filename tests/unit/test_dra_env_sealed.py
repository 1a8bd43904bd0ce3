"""A claim's CDI env names every variable libvgpu reads, so none comes from the pod.

The runtime applies a CDI spec's env by name over the container's env (the pod's ``env``, its
``envFrom``, which no admission rule can read, and the image's ``ENV``): a libvgpu variable the
spec does not name keeps the pod's value. libvgpu prefers ``CUDA_DEVICE_SM_LIMIT_<i>`` to the
unindexed share the claim's spec used to give alone, so a pod's ``CUDA_DEVICE_SM_LIMIT_0=100``
lifted its compute share on a shared GPU. The names expected here are read from libvgpu's
source (native/libvgpu), not from the contract that writes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hami.dra.model import SliceSettings
from hami.draplugin.prepare import Paths, cdi_spec, plan
from hami.node import contract
from hami.node.contract import Options
from hami.node.nvml import PhysicalGPU

LIBVGPU = Path(__file__).resolve().parents[2] / "native" / "libvgpu"
GPUS = [
    PhysicalGPU(0, "GPU-0", "Tesla T4", 15360, "0000:3b:00.0", 0),
    PhysicalGPU(1, "GPU-1", "Tesla T4", 15360, "0000:5e:00.0", 0),
]
PATHS = Paths(hook_path="/usr/local")
#: libvgpu's log level changes no limit; a pod may choose it (the NRI hook and webhook allow it too)
#: libvgpu reads these but no grant depends on them: its log level, and the NRI marker, whose
#: only effect in libvgpu is refusing every device (``pending``)
NOT_SEALED = {"LIBCUDA_LOG_LEVEL", "HAMI_NRI_INJECTION"}


def libvgpu_reads() -> tuple[set[str], int]:
    """The variables libvgpu reads, as its C source spells them: ``getenv``/``env_size``/
    ``vgpu_env_int``/``env_bool`` of a literal, and the ``NAME_%d`` per-device names for every
    index below ``VGPU_MAX_DEV``."""
    max_dev = int(re.search(r"#define\s+VGPU_MAX_DEV\s+(\d+)", (LIBVGPU / "region.h").read_text()).group(1))
    found: set[str] = set()
    for src in sorted(LIBVGPU.glob("*.c")):
        text = src.read_text()
        found |= set(
            re.findall(r"\b(?:getenv|vgpu_getenv|env_size|vgpu_env_int|env_bool)\(\s*\"([A-Z][A-Z0-9_]*)\"", text)
        )
        found |= {f"{base}_{i}" for base in re.findall(r"\"([A-Z][A-Z0-9_]*)_%d\"", text) for i in range(max_dev)}
    return found, max_dev


def claim(results):
    return {
        "metadata": {"namespace": "team-a", "name": "mine", "uid": "u1"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def result(device="gpu-0", memory="1000Mi", cores="10", request="gpu"):
    return {
        "request": request,
        "driver": "gpu.hami.io",
        "pool": "n1",
        "device": device,
        "consumedCapacity": {"memory": memory, "cores": cores},
    }


def spec_env(results, opts=Options()) -> list[str]:
    return cdi_spec(plan(claim(results), "n1", GPUS, SliceSettings()), PATHS, opts)["devices"][0]["containerEdits"][
        "env"
    ]


def as_map(env: list[str]) -> dict[str, str]:
    out = dict(e.split("=", 1) for e in env)
    assert len(out) == len(env), f"a name given twice: {env}"
    return out


def apply_cdi(container: list[str], edits: list[str]) -> dict[str, str]:
    """CDI's env edit (container-device-interface ``ContainerEdits.Apply`` ->
    ``AddMultipleProcessEnv``): each ``NAME=value`` replaces the variable of that name, else is
    appended."""
    env = dict(e.split("=", 1) for e in container)
    env.update(e.split("=", 1) for e in edits)
    return env


def libvgpu_config(env: dict[str, str], max_dev: int) -> dict[str, object]:
    """What ``vgpu_config_load`` (native/libvgpu/config.c) makes of ``env``: an empty value is
    unset; ``_<i>`` wins over the unindexed value; a share of 0 (or none) is 100."""

    def get(name):
        v = env.get(name)
        return v if v else None

    sm_all = int(get("CUDA_DEVICE_SM_LIMIT") or 0)
    mem_all = get("CUDA_DEVICE_MEMORY_LIMIT") or "0"
    sm, mem = [], []
    for i in range(max_dev):
        s = int(get(f"CUDA_DEVICE_SM_LIMIT_{i}") or sm_all)
        sm.append(100 if s <= 0 else s)
        mem.append(get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}") or mem_all)
    policy = env.get("GPU_CORE_UTILIZATION_POLICY")
    return {
        "sm": sm,
        "memory": mem,
        "cache": get("CUDA_DEVICE_MEMORY_SHARED_CACHE") or "/tmp/cudevshr.cache",
        "oversubscribe": (env.get("CUDA_OVERSUBSCRIBE") or "").lower() in ("true", "1", "yes"),
        "priority": int(get("CUDA_TASK_PRIORITY") or 1),
        "policy": "default"
        if policy is None
        else {"force": "force", "disable": "disable"}.get(policy.lower(), "default"),
        "context_size": get("LIBVGPU_CONTEXT_SIZE"),
        "stall_ms": int(get("LIBVGPU_TEST_STALL_IN_LOCK_MS") or 0),
        "peers": get("HAMI_PEER_REGIONS"),
        "limiter": {k: v for k, v in env.items() if k.startswith("HAMI_") and k.endswith("_MS") and v},
    }


#: a pod's env (or envFrom, or image ENV) giving every libvgpu setting a value of its own
POD_ENV = [
    "CUDA_DEVICE_SM_LIMIT_0=100",
    "CUDA_DEVICE_SM_LIMIT_1=100",
    "CUDA_DEVICE_SM_LIMIT=100",
    "CUDA_DEVICE_MEMORY_LIMIT=64g",
    "CUDA_DEVICE_MEMORY_LIMIT_0=64g",
    "CUDA_DEVICE_MEMORY_LIMIT_1=64g",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/mine.cache",
    "CUDA_OVERSUBSCRIBE=true",
    "CUDA_TASK_PRIORITY=0",
    "GPU_CORE_UTILIZATION_POLICY=disable",
    "LIBVGPU_CONTEXT_SIZE=0",
    "LIBVGPU_TEST_STALL_IN_LOCK_MS=600000",
    "HAMI_PEER_REGIONS=/tmp",
    "HAMI_CONTENTION_HOLD_MS=0",
    "HAMI_LIMITER_WINDOW_MS=60000",
    "HAMI_LIMITER_SHARED_WINDOW_MS=600000",
    "HAMI_LIMITER_TICK_MS=1000",
    "HAMI_PRIORITY_QUIET_MS=60000",
    "NVIDIA_VISIBLE_DEVICES=all",
    "PATH=/usr/bin",
]


def test_the_source_scan_finds_what_libvgpu_is_known_to_read():
    """The scan below must see libvgpu's variables at all (a renamed helper would hide them)."""
    found, max_dev = libvgpu_reads()
    assert max_dev == contract.LIBVGPU_MAX_DEVICES == 16
    for name in (
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_DEVICE_SM_LIMIT_15",
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "HAMI_PEER_REGIONS",
        "LIBVGPU_CONTEXT_SIZE",
        "LIBVGPU_TEST_STALL_IN_LOCK_MS",
        "GPU_CORE_UTILIZATION_POLICY",
        "HAMI_LIMITER_TICK_MS",
        "CUDA_TASK_PRIORITY",
        "CUDA_OVERSUBSCRIBE",
    ):
        assert name in found


def test_the_contracts_list_is_every_variable_libvgpu_reads():
    found, _ = libvgpu_reads()
    assert set(contract.libvgpu_names()) == found - NOT_SEALED
    assert "HAMI_NRI_INJECTION" not in contract.libvgpu_names()  # the NRI hook's marker: left as the pod has it


@pytest.mark.parametrize(
    "results",
    [
        [result()],  # one GPU
        [result(), result(device="gpu-1", memory="2000Mi", cores="10")],  # two GPUs, equal shares
        [result(), result(device="gpu-1", memory="2000Mi", cores="40")],  # two GPUs, shares differ
    ],
    ids=["1-gpu", "2-gpu-equal", "2-gpu-unequal"],
)
def test_the_cdi_env_of_a_claim_names_every_variable_libvgpu_reads(results):
    found, _ = libvgpu_reads()
    env = as_map(spec_env(results))
    missing = sorted(found - NOT_SEALED - set(env))
    assert not missing, f"libvgpu reads {missing} and the claim's CDI spec leaves them to the pod"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(f"GPU-{i}" for i in range(len(results)))
    assert "HAMI_NRI_INJECTION" not in env  # an empty marker would make the device plugin's NRI hook refuse


def test_names_the_grant_does_not_give_are_set_empty_and_the_grant_is_kept():
    env = as_map(spec_env([result(), result(device="gpu-1", memory="2000Mi", cores="40")]))
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("1000m", "2000m")
    assert (env["CUDA_DEVICE_SM_LIMIT"], env["CUDA_DEVICE_SM_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_1"]) == (
        "40",  # the largest share: an indexed one may only lower it (contract.device_limits)
        "10",
        "40",
    )
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith("/usr/local/vgpu/")
    for name in (
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_MEMORY_LIMIT_2",
        "CUDA_DEVICE_MEMORY_LIMIT_15",
        "CUDA_DEVICE_SM_LIMIT_2",
        "CUDA_DEVICE_SM_LIMIT_15",
        "CUDA_OVERSUBSCRIBE",
        "CUDA_TASK_PRIORITY",
        "GPU_CORE_UTILIZATION_POLICY",
        "LIBVGPU_CONTEXT_SIZE",
        "LIBVGPU_TEST_STALL_IN_LOCK_MS",
        "HAMI_PEER_REGIONS",
        *contract.LIMITER_TUNING,
    ):
        assert env[name] == "", name
    assert "LIBCUDA_LOG_LEVEL" not in env  # the pod's choice unless the node sets one


def test_the_nodes_options_are_given_not_blanked():
    env = as_map(spec_env([result()], Options(memory_oversubscribe=True, libcuda_log_level="3", core_policy="force")))
    assert (env["CUDA_OVERSUBSCRIBE"], env["LIBCUDA_LOG_LEVEL"], env["GPU_CORE_UTILIZATION_POLICY"]) == (
        "true",
        "3",
        "force",
    )


@pytest.mark.parametrize(
    "results,shares",
    [
        ([result()], [10]),
        ([result(), result(device="gpu-1", memory="2000Mi", cores="10")], [10, 10]),
        ([result(), result(device="gpu-1", memory="2000Mi", cores="40")], [10, 40]),
    ],
    ids=["1-gpu", "2-gpu-equal", "2-gpu-unequal"],
)
def test_a_pods_own_libvgpu_env_does_not_survive_the_claims_cdi_edits(results, shares):
    """The review's repro: ``CUDA_DEVICE_SM_LIMIT_0=100`` in the container's env, the CDI edits
    applied over it by name: libvgpu must read the claim's share, and nothing else of the pod's."""
    _, max_dev = libvgpu_reads()
    env = apply_cdi(POD_ENV, spec_env(results))
    got = libvgpu_config(env, max_dev)
    n = len(shares)
    assert got["sm"][:n] == shares
    assert got["memory"][:n] == [f"{1000 * (i + 1)}m" for i in range(n)]
    assert got["memory"][n:] == ["0"] * (max_dev - n)  # no limit of the pod's on an index beyond the claim's
    assert got["cache"].startswith("/usr/local/vgpu/")
    assert not got["oversubscribe"] and got["priority"] == 1 and got["policy"] == "default"
    assert got["context_size"] is None and got["stall_ms"] == 0 and got["peers"] is None
    assert got["limiter"] == {}  # the controller's defaults
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(f"GPU-{i}" for i in range(n))
    assert env["PATH"] == "/usr/bin"  # what is not libvgpu's stays the pod's


def test_the_whole_gpu_class_is_unchanged():
    """No libvgpu in the container (no preload): only the GPUs."""
    config = [
        {
            "source": "FromClass",
            "opaque": {
                "driver": "gpu.hami.io",
                "parameters": {"apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuConfig", "isolation": "none"},
            },
        }
    ]
    c = claim([{**result(memory=None, cores=None), "consumedCapacity": {}}])
    c["status"]["allocation"]["devices"]["config"] = config
    edits = cdi_spec(plan(c, "n1", GPUS, SliceSettings()), PATHS, Options())["devices"][0]["containerEdits"]
    assert edits == {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-0"]}


def test_the_device_plugin_and_hami_exec_env_is_not_sealed():
    """Only the DRA agent seals: :func:`contract.limit_env` (Allocate, ``hami exec``) is as it was."""
    env = contract.limit_env(contract.device_limits([1000], [10], "/r.cache"), Options())
    assert env == {
        "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
        "CUDA_DEVICE_SM_LIMIT": "10",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/r.cache",
    }
    sealed = contract.sealed_env(env)
    assert list(sealed)[: len(env)] == list(env) and all(sealed[k] == v for k, v in env.items())
    assert all(v == "" for k, v in sealed.items() if k not in env)
