"""The images the real node runs: the product image built offline from the Containerfile, the
kube-scheduler image under the chart's default name, and every archive imported into (and run
by) a private containerd.

Needs root (buildah, chroot, containerd); the product image also needs debootstrap, buildah and
the package registries (Debian, PyPI). ``make images`` builds them ahead of the tests; here they
come from the cache (``<cache>/images``) when nothing changed. Each test that cannot run says why
in one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hami_devkit import images
from hami_devkit.binaries import KUBE_VERSION, bin_dir
from hami_devkit.images import ImageArchive, read_oci_archive, unpack_rootfs

REPO = Path(__file__).resolve().parents[2]
VALUES = yaml.safe_load((REPO / "charts/hami/values.yaml").read_text())
CHART = yaml.safe_load((REPO / "charts/hami/Chart.yaml").read_text())


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (buildah, chroot and containerd run as root)")


def _runtime_env() -> dict[str, str]:
    """The environment with the containerd 1.7 that scripts/install-kube.sh builds (containerd, its
    runc shim, ctr) first on PATH: the same runtime as the real node's, not a system package."""
    return {**os.environ, "PATH": f"{bin_dir()}:{os.environ.get('PATH', '')}"}


def _needs(*tools: str) -> None:
    path = _runtime_env()["PATH"]
    missing = [t for t in tools if shutil.which(t, path=path) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install -y {' '.join(missing)})")


@pytest.fixture(scope="module")
def hami_image() -> ImageArchive:
    _needs_root()
    _needs("buildah", "debootstrap")
    return images.build_hami_image()


@pytest.fixture(scope="module")
def hami_root(hami_image: ImageArchive, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hami-rootfs")
    unpack_rootfs(hami_image.path, root)
    return root


def _chroot(root: Path, *argv: str, user: str = "65532:65532") -> subprocess.CompletedProcess[str]:
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    return subprocess.run(
        [chroot, f"--userspec={user}", str(root), *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/opt/hami/venv/bin:/usr/bin:/bin", "HOME": "/"},
    )


def _chart_image(section: dict) -> str:
    image = section["image"]
    return f"{image['registry']}/{image['repository']}:{image['tag'] or CHART['appVersion']}"


def test_hami_image_is_named_as_the_chart_default(hami_image: ImageArchive) -> None:
    assert hami_image.ref == _chart_image(VALUES["scheduler"]["extender"])
    assert hami_image.ref == _chart_image(VALUES["devicePlugin"])
    assert hami_image.ref == _chart_image(VALUES["devicePlugin"]["monitor"])


def test_hami_image_config_is_non_root_with_labels_and_entrypoint(hami_image: ImageArchive) -> None:
    parts = read_oci_archive(hami_image.path)
    config = parts["config"]["config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["hami"]
    assert config["Cmd"] == ["--help"]
    assert any(e.startswith("PATH=/opt/hami/venv/bin:") for e in config["Env"])
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "hami"
    assert labels["org.opencontainers.image.version"] == CHART["appVersion"]
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert len(labels["org.opencontainers.image.revision"]) == 40
    # the Debian base, then /opt/hami and HAMi's library path /k8s-vgpu (two links) from the build
    # stage: no compilers or build files on top
    assert len(parts["manifest"]["layers"]) == 3


def test_hami_runs_as_non_root_inside_the_image(hami_root: Path) -> None:
    _needs("chroot")
    out = _chroot(hami_root, "hami", "--help")
    assert out.returncode == 0, out.stderr
    for command in ("scheduler", "device-plugin", "monitor"):
        assert command in out.stdout
    # the gRPC stubs were generated in the build and grpc's native library loads
    probe = _chroot(
        hami_root, "python3", "-c", "from hami.deviceplugin.api import load; pb2, _ = load(); print(pb2.Empty.__name__)"
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "Empty"


def test_libvgpu_is_where_the_chart_copies_it_from(hami_root: Path) -> None:
    path = VALUES["devicePlugin"]["libvgpuPath"]
    assert path == "/opt/hami/libvgpu.so"
    lib = hami_root / path.lstrip("/")
    assert lib.read_bytes()[:4] == b"\x7fELF"
    assert b"libvgpu.so" in lib.read_bytes()  # its soname
    # the device plugin's init container: `sh -c "cp -f <libvgpuPath> /hook/..."`, as root
    (hami_root / "hook").mkdir(exist_ok=True)
    out = _chroot(
        hami_root,
        "sh",
        "-c",
        f"cp -f {path} /hook/libvgpu.so.new && mv -f /hook/libvgpu.so.new /hook/libvgpu.so",
        user="0:0",
    )
    assert out.returncode == 0, out.stderr
    assert (hami_root / "hook/libvgpu.so").read_bytes() == lib.read_bytes()


@pytest.mark.parametrize("version", ["v2.6.0", "v2.10.0"])  # the koord chart's default, the one our docs set
def test_the_image_serves_as_hamis_for_koordinators_hami_daemon(hami_root: Path, version: str) -> None:
    """Koordinator's hami-daemon chart runs HAMi's image as `sh -c "cp -f
    /k8s-vgpu/lib/nvidia/libvgpu.so.<libvgpuSoVersion> /usr/local/vgpu/libvgpu.so && vGPUmonitor
    -v=4"` (docs/integrations.md): the library is at HAMi's path under the chart's default version
    name (v2.6.0: without it the default install's `cp` failed and its pod restarted for ever) and
    the monitor answers to HAMi's command name and klog flag, serving on HAMi's port."""
    _needs("chroot")
    (hami_root / "usr/local/vgpu").mkdir(parents=True, exist_ok=True)
    (hami_root / "usr/local/vgpu/libvgpu.so").unlink(missing_ok=True)
    out = _chroot(
        hami_root,
        "sh",
        "-c",
        f"cp -f /k8s-vgpu/lib/nvidia/libvgpu.so.{version} /usr/local/vgpu/libvgpu.so && vGPUmonitor -v=4 --help",
        user="0:0",
    )
    assert out.returncode == 0, out.stderr
    assert "--metrics-bind-address" in out.stdout  # default :9394 (tests/unit/test_hami_compat.py)
    lib = (hami_root / "opt/hami/libvgpu.so").read_bytes()
    assert (hami_root / "usr/local/vgpu/libvgpu.so").read_bytes() == lib
    for name in ("libvgpu.so", f"libvgpu.so.{version}"):
        assert os.readlink(hami_root / "k8s-vgpu/lib/nvidia" / name) == "/opt/hami/libvgpu.so"


def test_no_build_tools_or_pip_in_the_image(hami_root: Path) -> None:
    assert not (hami_root / "usr/bin/gcc").exists()
    assert not (hami_root / "opt/build").exists()
    assert not list((hami_root / "opt/hami/venv").glob("lib/python3*/site-packages/pip"))
    assert not (hami_root / "etc/pip.conf").exists()  # the build's trust settings stay out


@pytest.fixture(scope="module")
def kube_scheduler_image() -> ImageArchive:
    binary = bin_dir() / "kube-scheduler"
    if not binary.is_file():
        pytest.skip(f"{binary} is missing (run scripts/install-kube.sh)")
    return images.build_kube_scheduler_image()


def test_kube_scheduler_image_has_the_chart_default_name_and_the_pinned_binary(
    kube_scheduler_image: ImageArchive, tmp_path: Path
) -> None:
    sched = VALUES["scheduler"]["kubeScheduler"]["image"]
    assert sched["tag"] == "" and sched["pullPolicy"] == "IfNotPresent"
    assert kube_scheduler_image.ref == f"{sched['registry']}/{sched['repository']}:{KUBE_VERSION}"
    unpack_rootfs(kube_scheduler_image.path, tmp_path)
    out = subprocess.run(
        [tmp_path / "usr/local/bin/kube-scheduler", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"Kubernetes {KUBE_VERSION}"


# --- a private containerd ------------------------------------------------------------------


class Containerd:
    """containerd on its own root, state and socket under a temporary directory (CRI off), so it
    never meets the real node's containerd."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.address = str(base / "c.sock")
        config = base / "config.toml"
        config.write_text(
            "version = 2\n"
            f'root = "{base}/root"\nstate = "{base}/state"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self.address}"\n'
            f'[ttrpc]\n  address = "{self.address}.ttrpc"\n'
        )
        self.log = (base / "containerd.log").open("wb")
        self.env = _runtime_env()
        self.proc = subprocess.Popen(
            ["containerd", "--config", str(config)], stdout=self.log, stderr=subprocess.STDOUT, env=self.env
        )
        deadline = time.monotonic() + 60
        while self.ctr("version").returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"private containerd did not start: {(base / 'containerd.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def ctr(self, *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", self.address, "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            env=self.env,
            **kwargs,
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    _needs_root()
    _needs("containerd", "ctr", "runc")
    base = Path(f"/tmp/hami-img-ctd-{uuid.uuid4().hex[:8]}")  # short: the socket path limit
    base.mkdir()
    daemon = Containerd(base)
    try:
        yield daemon
    finally:
        for task in daemon.ctr("tasks", "ls", "-q").stdout.split():
            daemon.ctr("tasks", "kill", "-s", "SIGKILL", task)
        for cid in daemon.ctr("containers", "ls", "-q").stdout.split():
            daemon.ctr("tasks", "delete", "-f", cid)
            daemon.ctr("containers", "delete", cid)
        daemon.stop()
        subprocess.run(["umount", "-R", str(base / "state")], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _import(containerd: Containerd, image: ImageArchive) -> None:
    out = containerd.ctr("images", "import", str(image.path))
    assert out.returncode == 0, out.stderr
    listed = containerd.ctr("images", "ls", "-q").stdout.split()
    assert image.ref in listed


def _run(containerd: Containerd, ref: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return containerd.ctr("run", "--rm", ref, f"hami-img-{uuid.uuid4().hex[:8]}", *argv)


def test_pause_image_imports_runs_and_stops_with_sigterm(containerd: Containerd) -> None:
    _needs("cc")
    image = images.build_pause_image()
    _import(containerd, image)
    cid = f"hami-img-pause-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        ["ctr", "--address", containerd.address, "-n", "k8s.io", "run", "--rm", image.ref, cid],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=containerd.env,
    )
    try:
        deadline = time.monotonic() + 60
        while "RUNNING" not in containerd.ctr("tasks", "ls").stdout.split(cid)[-1].split("\n")[0]:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "pause never reached RUNNING"
            time.sleep(0.2)
        assert containerd.ctr("tasks", "kill", "-s", "SIGTERM", cid).returncode == 0
        assert proc.wait(timeout=60) == 0  # ctr run exits with the task's status
    finally:
        if proc.poll() is None:
            containerd.ctr("tasks", "kill", "-s", "SIGKILL", cid)
            proc.wait()


def test_busybox_image_imports_and_runs(containerd: Containerd) -> None:
    if not images.BUSYBOX_BINARY.is_file():
        pytest.skip(f"{images.BUSYBOX_BINARY} is missing (apt-get install busybox-static)")
    image = images.build_busybox_image()
    _import(containerd, image)
    out = _run(containerd, image.ref, "sh", "-c", "echo ok $((6*7))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok 42"


def test_kube_scheduler_image_imports_and_runs(containerd: Containerd, kube_scheduler_image: ImageArchive) -> None:
    _import(containerd, kube_scheduler_image)
    out = _run(containerd, kube_scheduler_image.ref, "kube-scheduler", "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"Kubernetes {KUBE_VERSION}"


def test_hami_image_imports_and_runs_as_non_root(containerd: Containerd, hami_image: ImageArchive) -> None:
    _import(containerd, hami_image)
    out = _run(
        containerd,
        hami_image.ref,
        "sh",
        "-c",
        "id -u; hami --help >/dev/null && echo help-ok; test -r /opt/hami/libvgpu.so && echo lib-ok",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["65532", "help-ok", "lib-ok"]
