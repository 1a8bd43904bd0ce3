"""Our libvgpu under the environment other schedulers inject for HAMi-core (issue 20, item 5).

Koordinator (koordlet's GPU hook, pods labelled ``koordinator.sh/gpu-isolation-provider:
HAMi-core``) and Volcano (Project-HAMi/volcano-vgpu-device-plugin) do not use our device
plugin: they set HAMi-core's variables and preload the library from ``/usr/local/vgpu`` by
themselves. Each test runs the probe in a private mount namespace laid out as those
integrations lay out the container (the library at ``/usr/local/vgpu/libvgpu.so``, their ``/tmp``
mounts, ``/etc/ld.so.preload`` for Volcano), with exactly their variables and no others of
HAMi-core's, against the fake driver, and checks that the limits hold: the memory total seen
through CUDA and NVML, an allocation past the limit refused, and the shared region recording the
limits where the integration (and the monitor) expect it.

Root is needed for the mount namespace (the tests are skipped without it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .region_layout import read_region

GiB, MiB = 1 << 30, 1 << 20
SRC = Path(__file__).resolve().parents[2] / "src"
HOOK = "/usr/local/vgpu"  # where both integrations put libvgpu.so in the container

# koordlet (pkg/koordlet/runtimehooks/hooks/gpu): memory in bytes, a bare number; cores; the
# preload through LD_PRELOAD; no shared-cache variable, so the region is /tmp/cudevshr.cache
KOORDINATOR_ENV = {
    "NVIDIA_VISIBLE_DEVICES": "0",
    "CUDA_DEVICE_MEMORY_LIMIT": str(2 * GiB),
    "CUDA_DEVICE_SM_LIMIT": "30",
    "LD_PRELOAD": f"{HOOK}/libvgpu.so",
}
# volcano-vgpu-device-plugin Allocate: per-device limits in MiB with an "m", the cores of the
# first device, the region under /tmp/vgpu (a host directory per container); the preload comes
# from /etc/ld.so.preload, mounted from <HOOK_PATH>/ld.so.preload
VOLCANO_CACHE = "/tmp/vgpu/6b0d3a52-7c1e-4f0e-9a55-3c2f7e9d1a40.cache"
VOLCANO_ENV = {
    "NVIDIA_VISIBLE_DEVICES": "GPU-00000000-0000-0000-0000-000000000000",
    "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
    "CUDA_DEVICE_SM_LIMIT": "25",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": VOLCANO_CACHE,
}

PROBE = """
import cuda_probe as c, pynvml as n
c.init(0)
total = c.mem_info()[1]
n.nvmlInit()
nvml_total = n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0)).total
rc_fit, _ = c.alloc({fit})
rc_over, _ = c.alloc({over})
print(total, nvml_total, rc_fit, rc_over)
"""


def _namespace_available() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _namespace_available(), reason="needs root and unshare -m")


def _integration_env(fake_env: dict[str, str], injected: dict[str, str]) -> dict[str, str]:
    """The fake machine's variables (driver path, state dir, probe path) plus exactly ``injected``."""
    env = {k: v for k, v in fake_env.items() if not k.startswith(("CUDA_", "LD_PRELOAD", "GPU_CORE"))}
    env["FAKEGPU_STATE_DIR"] = "/tmp/fakegpu-machine"  # inside the container's /tmp
    env.update(injected)
    return env


def _writable(path: str, scratch) -> str:
    """Shell steps making ``path`` writable inside the namespace only: an overlay whose upper
    layer is a tmpfs at ``scratch`` (the host's ``path`` is never written)."""
    return (
        f"mkdir -p '{scratch}'; mount -t tmpfs none '{scratch}'; mkdir '{scratch}/u' '{scratch}/w'; "
        f"mount -t overlay overlay -o lowerdir={path},upperdir='{scratch}/u',workdir='{scratch}/w' {path}; "
    )


def _tmp_replaced_by(container_tmp, env: dict[str, str]) -> str:
    """Shell steps putting ``container_tmp`` at /tmp, as the container's own /tmp, while what
    this process needs from the host's /tmp stays where it is: the checkout (the library, the
    fake driver, the probe) and the interpreter's environment may live there (a CI checkout
    under /tmp). Those host paths are reached again through a bind of the host's /tmp kept under
    the namespace's private /usr/local (already an overlay on a tmpfs)."""
    needed = {
        str(Path(__file__).resolve().parents[2]),
        sys.prefix,
        sys.executable,
        *(p for k in ("LD_LIBRARY_PATH", "PYTHONPATH") for p in env.get(k, "").split(":") if p),
    }
    under_tmp = sorted({os.path.realpath(p) for p in needed if os.path.realpath(p).startswith("/tmp/")})
    steps = "mkdir -p /usr/local/.host-tmp; mount --rbind /tmp /usr/local/.host-tmp; " if under_tmp else ""
    steps += f"mount --rbind '{container_tmp}' /tmp; "
    for path in under_tmp:
        inside = "/usr/local/.host-tmp/" + path[len("/tmp/") :]
        kind = "-d" if os.path.isdir(path) else "-f"
        make = f"mkdir -p '{path}'" if kind == "-d" else f"mkdir -p '{os.path.dirname(path)}'; touch '{path}'"
        steps += f"if [ ! -e '{path}' ]; then {make}; fi; mount --rbind '{inside}' '{path}'; "
    return steps


def _run_in_container(native_build, env: dict[str, str], container_tmp, mounts: str, code: str, late: str = ""):
    """Run ``code`` with python in a private mount namespace: the shell ``mounts`` steps (host
    paths still visible), ``container_tmp`` (with what was mounted inside it) as /tmp, our
    libvgpu.so at /usr/local/vgpu/libvgpu.so, then the ``late`` steps."""
    lib = native_build / "libvgpu.so"
    scratch = container_tmp.parent / "usr-local-overlay"
    script = (
        f"set -e; {mounts}{_writable('/usr/local', scratch)}"
        f"mkdir -p {HOOK}; cp '{lib}' {HOOK}/libvgpu.so; "
        f"{_tmp_replaced_by(container_tmp, env)}"
        f"mkdir -p /tmp/vgpulock; {late}"
        'exec "$0" -c "$1"'
    )
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, sys.executable, code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout.split()


@pytest.fixture
def container_tmp(tmp_path):
    d = tmp_path / "container-tmp"
    d.mkdir()
    return d


def test_koordinator_env_limits_memory_and_records_the_region(native_build, fake_env, container_tmp):
    env = _integration_env(fake_env, KOORDINATOR_ENV)
    assert {k for k in env if k.startswith("CUDA_")} == {"CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT"}
    out = _run_in_container(native_build, env, container_tmp, "", PROBE.format(fit=1536 * MiB, over=1024 * MiB))
    assert [int(x) for x in out] == [2 * GiB, 2 * GiB, 0, 2]  # 2 = CUDA_ERROR_OUT_OF_MEMORY
    region = read_region(container_tmp / "cudevshr.cache")  # HAMi-core's default region path
    assert region["limit"][0] == 2 * GiB and region["sm_limit"][0] == 30


def test_volcano_env_with_ld_so_preload_limits_memory(native_build, fake_env, container_tmp, tmp_path):
    host_dir = tmp_path / "host-tmp-vgpu" / "containers" / "pod-uid_main"  # /tmp/vgpu/containers/<uid>_<ctr>
    host_dir.mkdir(parents=True)
    env = _integration_env(fake_env, VOLCANO_ENV)
    assert "LD_PRELOAD" not in env
    # /etc gets an overlay (the host's /etc is not touched) for the preload file the plugin mounts
    mounts = (
        _writable("/etc", tmp_path / "etc-overlay")
        + f"mkdir -p '{container_tmp}/vgpu'; mount --bind '{host_dir}' '{container_tmp}/vgpu'; "
    )
    out = _run_in_container(
        native_build,
        env,
        container_tmp,
        mounts,
        PROBE.format(fit=900 * MiB, over=200 * MiB),
        late=f"echo {HOOK}/libvgpu.so > /etc/ld.so.preload; ",
    )
    assert [int(x) for x in out] == [1000 * MiB, 1000 * MiB, 0, 2]
    region = read_region(host_dir / os.path.basename(VOLCANO_CACHE))  # on the host, where a monitor reads it
    assert region["limit"][0] == 1000 * MiB and region["sm_limit"][0] == 25
    assert not os.path.exists("/etc/ld.so.preload") or "libvgpu" not in open("/etc/ld.so.preload").read()
    # our monitor pointed where this plugin keeps the regions (HOOK_PATH=/tmp/vgpu on the host)
    mon = subprocess.run(
        [
            sys.executable,
            "-m",
            "hami",
            "monitor",
            "--once",
            "--no-nvml",
            "--standalone",
            "--node-name",
            "n1",
            "--hook-path",
            str(tmp_path / "host-tmp-vgpu"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert mon.returncode == 0, mon.stderr
    assert 'hami_monitor_regions{node="n1",state="ok",zone="vGPU"} 1.0' in mon.stdout, mon.stdout
    limits = [
        float(line.rsplit(" ", 1)[1])
        for line in mon.stdout.splitlines()
        if line.startswith("hami_vgpu_memory_limit_bytes{")
        and 'container="main"' in line
        and 'vdevice_index="0"' in line
    ]
    assert limits == [1000 * MiB]


def test_without_the_preload_nothing_is_limited(native_build, fake_env, container_tmp):
    """The control: the same variables without the preload leave the whole device visible, so the
    limits above come from the library and not from the fake driver."""
    env = _integration_env(fake_env, {k: v for k, v in KOORDINATOR_ENV.items() if k != "LD_PRELOAD"})
    out = _run_in_container(native_build, env, container_tmp, "", PROBE.format(fit=1536 * MiB, over=1024 * MiB))
    assert int(out[0]) == 80 * GiB and out[2:] == ["0", "0"]
