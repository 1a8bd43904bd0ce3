"""`hami monitor` reading regions written by the real libvgpu on the fake GPU.

Two `hami exec` processes share one container region (as two processes of one container do);
the monitor, pointed at the fake NVML, must export their summed usage, the limit, the host GPU
usage and a zero drift; a corrupt region beside it is skipped with a warning.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import BUILD, FAKE

pytestmark = pytest.mark.native

MiB = 1 << 20
UID = "5e1f0c4a-7d2b-4b8e-9f61-0123456789ab"
PROBE = (
    "import sys, cuda_probe as c; c.init(); rc, _ = c.alloc(int(sys.argv[1])); "
    "print('ready' if rc == 0 else f'alloc failed {rc}', flush=True); sys.stdin.readline()"
)


def _exec_argv(cache, size: int) -> list[str]:
    cmd = [sys.executable, "-c", PROBE, str(size)]
    if importlib.util.find_spec("hami.execcmd") is None:  # pragma: no cover - until `hami exec` lands
        pytest.skip("hami exec is not in this build")
    return [
        sys.executable,
        "-m",
        "hami",
        "exec",
        "--gpumem",
        "1G",
        "--cache",
        str(cache),
        "--lib",
        str(BUILD / "libvgpu.so"),
        "--log-level",
        "0",
        "--",
        *cmd,
    ]


def _scrape(env, hook) -> tuple[dict, str]:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami",
            "monitor",
            "--once",
            "--standalone",
            "--hook-path",
            str(hook),
            "--nvml-library",
            str(FAKE / "libnvidia-ml.so.1"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return {f.name: f.samples for f in text_string_to_metric_families(p.stdout)}, p.stderr


def _one(samples, **labels):
    got = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(got) == 1, (labels, samples)
    return got[0]


def test_regions_of_two_hami_exec_processes_are_exported(fake_env, tmp_path):
    hook = tmp_path / "hook"
    ctr = hook / "containers" / f"{UID}_main"
    ctr.mkdir(parents=True)
    cache = ctr / "region.cache"
    bad = hook / "containers" / f"{UID}_broken"
    bad.mkdir()
    (bad / "region.cache").write_bytes(b"\x01" * 4096)
    procs = []
    try:
        for size in (100 * MiB, 60 * MiB):
            p = subprocess.Popen(
                _exec_argv(cache, size),
                env=fake_env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            procs.append(p)
            line = p.stdout.readline().strip()
            assert line == "ready", (line, p.stderr.read() if p.poll() is not None else "")
        got, stderr = _scrape(fake_env, hook)
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.write("\n")
                p.stdin.flush()
            p.wait(timeout=30)
    uuid0 = "GPU-f00dfeed-0000-4000-8000-000000000000"
    # standalone (no pod list, no grant): the region's UUID is not exported (the container writes it)
    ctr_labels = dict(pod=UID, container="main", vdevice_index="0", device_uuid="")
    assert _one(got["hami_vgpu_memory_used_bytes"], **ctr_labels) == 160 * MiB
    assert _one(got["hami_container_device_memory_bytes"], **ctr_labels) == 160 * MiB
    assert _one(got["hami_vgpu_memory_limit_bytes"], **ctr_labels) == 1 << 30
    assert _one(got["hami_vgpu_memory_buffer_bytes"], **ctr_labels) == 160 * MiB
    assert _one(got["hami_host_gpu_memory_used_bytes"], device_uuid=uuid0, device_index="0") == 160 * MiB
    assert _one(got["hami_host_gpu_memory_used_bytes"], device_index="1") == 0
    # HAMi's host families of Aug 2026 (PR #2732), from NVML: the fake's 40 C and 100 W; its ECC
    # counters (aggregate corrected = index + 1) as a counter with error_type
    assert _one(got["hami_host_gpu_temperature_celsius"], device_uuid=uuid0) == 40
    assert _one(got["hami_host_gpu_power_usage_watts"], device_index="1") == 100.0
    assert _one(got["hami_host_gpu_ecc_errors"], device_index="1", error_type="corrected") == 2
    assert _one(got["hami_host_gpu_ecc_errors"], device_index="0", error_type="uncorrected") == 0
    assert _one(got["hami_vgpu_memory_drift_bytes"], **ctr_labels) == 0
    assert (
        _one(got["hami_monitor_regions"], state="invalid") == 1 and _one(got["hami_monitor_regions"], state="ok") == 1
    )
    assert "broken" in stderr and "bad magic" in stderr
