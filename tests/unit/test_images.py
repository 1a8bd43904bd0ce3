"""hami_devkit.images: OCI archives written without a daemon, the pause and busybox images.

These need no root: the archives are read back with tarfile, and the static binaries inside
are run straight from the unpacked root filesystem. Importing into containerd and the product
image are in tests/integration/test_images.py.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from hami_devkit import images
from hami_devkit.images import ImageError, Layer, read_oci_archive, unpack_rootfs, write_oci_archive


def _blob(archive: Path, digest: str) -> bytes:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
        assert member is not None
        return member.read()


def _layer(*entries: tuple[str, bytes | None]) -> bytes:
    layer = Layer()
    for name, content in entries:
        if content is None:
            layer.directory(name)
        else:
            layer.file(name, content)
    return layer.tar()


def test_archive_has_layout_index_manifest_config_and_layers_with_matching_digests(tmp_path: Path) -> None:
    base = _layer(("etc/motd", b"hello\n"))
    top = _layer(("app/run", b"#!/bin/sh\n"))
    archive = write_oci_archive(
        tmp_path / "a.tar", "example.test/x:1", [base, top], {"Entrypoint": ["/app/run"], "User": "1000"}, {"k": "v"}
    )
    assert archive.ref == "example.test/x:1"
    parts = read_oci_archive(archive.path)
    assert "oci-layout" in parts["names"]
    desc = parts["index"]["manifests"][0]
    assert desc["annotations"] == {
        "org.opencontainers.image.ref.name": "example.test/x:1",
        "io.containerd.image.name": "example.test/x:1",
    }
    manifest_blob = _blob(archive.path, desc["digest"])
    assert "sha256:" + hashlib.sha256(manifest_blob).hexdigest() == desc["digest"]
    assert desc["size"] == len(manifest_blob)
    config = parts["config"]
    assert config["config"] == {"Entrypoint": ["/app/run"], "User": "1000", "Labels": {"k": "v"}}
    assert config["os"] == "linux"
    # diff_ids are digests of the uncompressed layers; the manifest lists the gzip blobs in order
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(t).hexdigest() for t in (base, top)]
    for desc, tar in zip(parts["manifest"]["layers"], (base, top), strict=True):
        blob = _blob(archive.path, desc["digest"])
        assert desc["size"] == len(blob)
        assert gzip.decompress(blob) == tar


def test_same_inputs_give_the_same_bytes(tmp_path: Path) -> None:
    layer = _layer(("a", b"1"), ("d", None))
    one = write_oci_archive(tmp_path / "1.tar", "r:1", [layer], {"Cmd": ["a"]})
    two = write_oci_archive(tmp_path / "2.tar", "r:1", [layer], {"Cmd": ["a"]})
    assert one.path.read_bytes() == two.path.read_bytes()


def test_layer_entries_are_root_owned_with_parents_and_fixed_mtime() -> None:
    layer = Layer()
    layer.file("usr/local/bin/tool", b"x", mode=0o755)
    layer.symlink("tool", "usr/local/bin/tool")
    with tarfile.open(fileobj=io.BytesIO(layer.tar())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members) == ["tool", "usr", "usr/local", "usr/local/bin", "usr/local/bin/tool"]
    assert all(m.uid == 0 and m.gid == 0 and m.mtime == 0 for m in members.values())
    assert members["usr/local/bin/tool"].mode == 0o755
    assert members["tool"].issym() and members["tool"].linkname == "usr/local/bin/tool"


@pytest.mark.parametrize("name", ["", "/", "../etc/passwd", "a/../../b"])
def test_layer_refuses_paths_outside_the_image(name: str) -> None:
    with pytest.raises(ImageError, match="layer path"):
        Layer().file(name, b"x")


def test_unpack_applies_layers_in_order_with_whiteouts(tmp_path: Path) -> None:
    base = _layer(("keep", b"1"), ("gone", b"2"), ("dir/old", b"3"), ("over", b"old"))
    top = _layer((".wh.gone", b""), ("dir/.wh..wh..opq", b""), ("dir/new", b"4"), ("over", b"new"))
    archive = write_oci_archive(tmp_path / "a.tar", "r:1", [base, top], {})
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    unpack_rootfs(archive.path, root)
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == ["dir/new", "keep", "over"]
    assert (root / "over").read_bytes() == b"new"
    assert root.stat().st_mode & 0o777 == 0o755  # a non-root user of the image can enter /


def test_cached_archive_is_reused_and_a_changed_input_builds_a_new_one(tmp_path: Path) -> None:
    busybox = _needs_busybox()
    copy = tmp_path / "busybox"
    shutil.copy(busybox, copy)
    first = images.build_busybox_image(cache=tmp_path / "c", busybox=copy)
    stamp = first.path.stat().st_mtime_ns
    again = images.build_busybox_image(cache=tmp_path / "c", busybox=copy)
    assert again == first and again.path.stat().st_mtime_ns == stamp
    with copy.open("ab") as f:
        f.write(b"\0")
    changed = images.build_busybox_image(cache=tmp_path / "c", busybox=copy)
    assert changed.path != first.path and changed.path.is_file()


# --- pause ---------------------------------------------------------------------------------


def _needs_cc() -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the pause image")
    probe = subprocess.run(
        ["cc", "-static", "-x", "c", "-o", os.devnull, "-"], input=b"int main(void){return 0;}", capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip("cc cannot link statically (install libc6-dev)")


@pytest.fixture(scope="module")
def pause_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[images.ImageArchive, Path]:
    _needs_cc()
    tmp = tmp_path_factory.mktemp("pause")
    archive = images.build_pause_image(cache=tmp / "cache")
    root = tmp / "root"
    root.mkdir()
    unpack_rootfs(archive.path, root)
    return archive, root


def test_pause_image_runs_a_static_pause_as_nobody(pause_root: tuple[images.ImageArchive, Path]) -> None:
    archive, root = pause_root
    assert archive.ref == images.PAUSE_REF == "localhost/hami/pause:3.10"
    config = read_oci_archive(archive.path)["config"]["config"]
    assert config["Entrypoint"] == ["/pause"]
    assert config["User"] == "65534:65534"
    assert [p.name for p in root.iterdir()] == ["pause"]
    binary = (root / "pause").read_bytes()
    assert binary[:4] == b"\x7fELF"
    assert _program_headers(binary) and 3 not in _program_headers(binary)  # no PT_INTERP: static
    version = subprocess.run([root / "pause", "-v"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == "hami-pause 3.10"


def _program_headers(elf: bytes) -> list[int]:
    """p_type of every program header of a 64-bit little-endian ELF file."""
    assert elf[4] == 2 and elf[5] == 1, "expected ELF64 little-endian"
    phoff = int.from_bytes(elf[0x20:0x28], "little")
    size = int.from_bytes(elf[0x36:0x38], "little")
    count = int.from_bytes(elf[0x38:0x3A], "little")
    return [int.from_bytes(elf[phoff + i * size : phoff + i * size + 4], "little") for i in range(count)]


def test_pause_refuses_unknown_arguments(pause_root: tuple[images.ImageArchive, Path]) -> None:
    proc = subprocess.run([pause_root[1] / "pause", "--bogus"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "--bogus" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_pause_sleeps_until_sigterm_or_sigint_then_exits_0(
    pause_root: tuple[images.ImageArchive, Path], sig: signal.Signals
) -> None:
    proc = subprocess.Popen([pause_root[1] / "pause"], stderr=subprocess.DEVNULL)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.3)  # still sleeping
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid:
            found.append((int(entry.name), fields[0]))
    return found


def test_pause_reaps_children_that_exit(pause_root: tuple[images.ImageArchive, Path]) -> None:
    # sh starts a short sleep and then becomes pause (exec): the sleep is pause's child, and
    # would stay a zombie if pause did not wait for it.
    proc = subprocess.Popen(["sh", "-c", f"sleep 0.2 & exec {pause_root[1] / 'pause'}"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        seen_child = False
        while time.monotonic() < deadline:
            kids = _children(proc.pid)
            seen_child = seen_child or bool(kids)
            if seen_child and not kids:
                break
            time.sleep(0.05)
        assert seen_child, "the sleep child never appeared under pause"
        assert _children(proc.pid) == [], "pause left its exited child unreaped"
        assert proc.poll() is None
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


# --- busybox -------------------------------------------------------------------------------


def _needs_busybox() -> Path:
    if not images.BUSYBOX_BINARY.is_file():
        pytest.skip(f"{images.BUSYBOX_BINARY} is missing (apt-get install busybox-static)")
    return images.BUSYBOX_BINARY


def test_busybox_image_has_a_shell_and_applets(tmp_path: Path) -> None:
    _needs_busybox()
    archive = images.build_busybox_image(cache=tmp_path / "cache")
    assert archive.ref == "localhost/hami/busybox:latest"
    config = read_oci_archive(archive.path)["config"]["config"]
    assert config["Cmd"] == ["sh"]
    assert config["Env"] == ["PATH=/bin"]
    root = tmp_path / "root"
    root.mkdir()
    unpack_rootfs(archive.path, root)
    assert (root / "bin" / "sh").readlink() == Path("busybox")
    out = subprocess.run(
        [root / "bin" / "sh", "-c", "echo $((6*7)); ls /"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": str(root / "bin")},
    )
    assert out.stdout.splitlines()[0] == "42"
    assert "nobody:x:65534" in (root / "etc" / "passwd").read_text()


def test_missing_busybox_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="busybox-static"):
        images.build_busybox_image(cache=tmp_path, busybox=tmp_path / "none")


def test_missing_kube_scheduler_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="install-kube.sh"):
        images.build_kube_scheduler_image(cache=tmp_path, binary=tmp_path / "none")


def test_kube_scheduler_image_is_named_as_the_chart_default(tmp_path: Path) -> None:
    fake = tmp_path / "kube-scheduler"
    fake.write_bytes(b"\x7fELF not really")
    archive = images.build_kube_scheduler_image(cache=tmp_path / "c", binary=fake, version="v1.2.3")
    assert archive.ref == "registry.k8s.io/kube-scheduler:v1.2.3"
    parts = read_oci_archive(archive.path)
    config = parts["config"]["config"]
    assert config["Entrypoint"] == ["/usr/local/bin/kube-scheduler"]
    assert "PATH=/usr/local/bin" in config["Env"]  # the chart's command is plain `kube-scheduler`
    assert config["Labels"]["org.opencontainers.image.version"] == "v1.2.3"
    root = tmp_path / "root"
    root.mkdir()
    unpack_rootfs(archive.path, root)
    assert (root / "usr/local/bin/kube-scheduler").read_bytes() == fake.read_bytes()
    assert os.access(root / "usr/local/bin/kube-scheduler", os.X_OK)


def test_main_rejects_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        images.main(["nope"])
    assert "unknown image 'nope'" in capsys.readouterr().err


def test_index_json_is_plain_json(tmp_path: Path) -> None:
    archive = write_oci_archive(tmp_path / "a.tar", "r:1", [_layer(("a", b"1"))], {})
    with tarfile.open(archive.path) as tar:
        member = tar.extractfile("oci-layout")
        assert member is not None
        assert json.loads(member.read()) == {"imageLayoutVersion": "1.0.0"}


def test_reading_a_tar_that_is_no_image_names_the_missing_file(tmp_path: Path) -> None:
    plain = tmp_path / "plain.tar"
    plain.write_bytes(_layer(("hello", b"x")))
    with pytest.raises(ImageError, match="index.json is not a file in the archive"):
        read_oci_archive(plain)
