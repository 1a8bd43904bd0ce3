"""Container images built on this machine, without a registry or a container daemon.

Every image is written as an OCI image archive (a tar of an OCI image layout) that
``ctr -n k8s.io images import`` accepts, and is named by its ``ref``:

- :func:`build_pause_image` -> ``localhost/hami/pause:3.10``: ``native/pause/pause.c`` compiled
  statically; the pod sandbox image (containerd's CRI ``sandbox_image`` on the real node).
- :func:`build_busybox_image` -> ``localhost/hami/busybox:latest``: Debian's ``busybox-static``,
  for smoke tests.
- :func:`build_kube_scheduler_image` -> ``registry.k8s.io/kube-scheduler:<version>``: the pinned
  binary from ``scripts/install-kube.sh``, under the name and tag the chart uses by default.
- :func:`build_hami_image` -> ``ghcr.io/hami-py/hami:<version>``: the product image, the root
  ``Containerfile`` run by buildah on a Debian base (``scripts/build-image.sh``), under the
  chart's default name.

The first three are small enough to assemble here directly (one layer, written by
:func:`write_oci_archive`); the product image has one recipe, the ``Containerfile``, that
users build with docker/podman and that the offline path runs with Debian's ``buildah``.

Outputs are cached under ``<cache>/images`` (``$HAMI_CACHE`` or ``~/.cache/hami``), one file
per image whose name carries a hash of everything that went into it, so a second call returns
at once and a changed input builds a new file. Clear with ``rm -rf <cache>/images``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hami_devkit.binaries import KUBE_VERSION, bin_dir, cache_dir

REPO_ROOT = Path(__file__).resolve().parents[3]
PAUSE_SOURCE = REPO_ROOT / "native" / "pause" / "pause.c"
PAUSE_REF = "localhost/hami/pause:3.10"
BUSYBOX_REF = "localhost/hami/busybox:latest"
BUSYBOX_BINARY = Path("/bin/busybox")
KUBE_SCHEDULER_REPOSITORY = "registry.k8s.io/kube-scheduler"
# Bump when the way archives are written changes, so cached files are rebuilt.
FORMAT_VERSION = "2"

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
ANNOTATION_REF = "org.opencontainers.image.ref.name"
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"


class ImageError(RuntimeError):
    """An image could not be built; the message says which step and why."""


class ImageUnavailable(ImageError):
    """This machine lacks what an image needs (root, a tool, an input): not a build failure."""


@dataclass(frozen=True)
class ImageArchive:
    """An OCI image archive on disk: ``ctr -n k8s.io images import <path>`` names it ``ref``."""

    path: Path
    ref: str


def images_dir() -> Path:
    return cache_dir() / "images"


# ---------------------------------------------------------------------------------------------
# Layers and archives


@dataclass
class Layer:
    """A root filesystem layer built in memory: files, directories and symlinks, owned by root
    unless told otherwise, with a fixed mtime so the same inputs give the same digest."""

    entries: dict[str, tarfile.TarInfo] = field(default_factory=dict)
    data: dict[str, bytes] = field(default_factory=dict)

    def _info(self, name: str, kind: bytes, mode: int, uid: int, gid: int) -> tarfile.TarInfo:
        name = name.strip("/")
        if not name or ".." in name.split("/"):
            raise ImageError(f"layer path {name!r} must be a relative path inside the image")
        parent = name.rpartition("/")[0]
        if parent and parent not in self.entries:
            self.directory(parent)
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.uid, info.gid, info.mtime = kind, mode, uid, gid, 0
        self.entries[name] = info
        return info

    def directory(self, name: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        self._info(name, tarfile.DIRTYPE, mode, uid, gid)

    def file(self, name: str, content: bytes, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
        info = self._info(name, tarfile.REGTYPE, mode, uid, gid)
        info.size = len(content)
        self.data[info.name] = content

    def symlink(self, name: str, target: str) -> None:
        info = self._info(name, tarfile.SYMTYPE, 0o777, 0, 0)
        info.linkname = target

    def tar(self) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(self.entries):
                info = self.entries[name]
                content = self.data.get(name)
                tar.addfile(info, io.BytesIO(content) if content is not None else None)
        return out.getvalue()


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def write_oci_archive(
    dest: Path, ref: str, layers: Iterable[bytes], config: dict[str, Any], labels: dict[str, str] | None = None
) -> ImageArchive:
    """Write an OCI image archive of ``layers`` (uncompressed tars, base first) to ``dest``.

    ``config`` is the image's runtime config (``Entrypoint``, ``Cmd``, ``User``, ``Env``,
    ``WorkingDir``, ...); ``labels`` are added to it. The manifest is annotated with ``ref``
    under both the OCI name and containerd's, so ``ctr images import`` names the image ``ref``.
    """
    blobs: dict[str, bytes] = {}
    layer_descs, diff_ids = [], []
    for tar in layers:
        compressed = gzip.compress(tar, compresslevel=6, mtime=0)
        blobs[_digest(compressed)] = compressed
        layer_descs.append({"mediaType": MEDIA_LAYER_GZIP, "digest": _digest(compressed), "size": len(compressed)})
        diff_ids.append(_digest(tar))
    runtime = dict(config)
    if labels:
        runtime["Labels"] = {**runtime.get("Labels", {}), **labels}
    image_config = {
        "architecture": _oci_arch(),
        "os": "linux",
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": f"hami_devkit.images (format {FORMAT_VERSION})"}],
    }
    config_blob = _canonical(image_config)
    blobs[_digest(config_blob)] = config_blob
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config_blob), "size": len(config_blob)},
        "layers": layer_descs,
    }
    manifest_blob = _canonical(manifest)
    blobs[_digest(manifest_blob)] = manifest_blob
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": _digest(manifest_blob),
                "size": len(manifest_blob),
                "annotations": {ANNOTATION_REF: ref, ANNOTATION_CONTAINERD_NAME: ref},
            }
        ],
    }
    files = {"oci-layout": _canonical({"imageLayoutVersion": "1.0.0"}), "index.json": _canonical(index)}
    for digest, blob in blobs.items():
        files["blobs/sha256/" + digest.removeprefix("sha256:")] = blob
    archive = Layer()
    for name, content in files.items():
        archive.file(name, content)
    _write_atomically(dest, archive.tar())
    return ImageArchive(path=dest, ref=ref)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _oci_arch() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _write_atomically(dest: Path, content: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_oci_archive(path: Path) -> dict[str, Any]:
    """The index, manifest and config of a single-image OCI archive (for checks and tests)."""
    with tarfile.open(path) as tar:

        def blob(name: str) -> Any:
            return json.loads(_member(tar, name).read())

        names = {m.name.removeprefix("./") for m in tar.getmembers()}
        index = blob("index.json")
        manifest = blob("blobs/sha256/" + index["manifests"][0]["digest"].removeprefix("sha256:"))
        config = blob("blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:"))
    return {"index": index, "manifest": manifest, "config": config, "names": names}


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    """A file of an image layout, stored as ``name`` or ``./name`` (buildah writes the latter)."""
    for candidate in (name, "./" + name):
        try:
            member = tar.extractfile(candidate)
        except KeyError:
            continue
        if member is not None:
            return member
    raise ImageError(f"{tar.name}: {name} is not a file in the archive")


def unpack_rootfs(archive: Path, dest: Path) -> None:
    """Apply the layers of ``archive`` in order into ``dest`` (whiteouts honoured), the way a
    runtime would, so a test can look inside or chroot into the image. ``dest`` becomes mode
    0755 first, as a runtime's root filesystem is (a temporary directory is 0700, which would
    keep a non-root user of the image out of its own ``/``)."""
    parts = read_oci_archive(archive)
    dest.chmod(0o755)
    with tarfile.open(archive) as outer:
        for desc in parts["manifest"]["layers"]:
            member = _member(outer, "blobs/sha256/" + desc["digest"].removeprefix("sha256:"))
            with tarfile.open(fileobj=member, mode="r|*") as layer:
                for entry in layer:
                    _apply(layer, entry, dest)


def _apply(layer: tarfile.TarFile, entry: tarfile.TarInfo, dest: Path) -> None:
    path = Path(entry.name)
    base = path.name
    if base.startswith(".wh."):
        parent = dest / path.parent
        if base == ".wh..wh..opq":
            for child in parent.iterdir() if parent.is_dir() else ():
                _remove(child)
        else:
            _remove(parent / base.removeprefix(".wh."))
        return
    target = dest / path
    if target.is_symlink() or (target.exists() and not (entry.isdir() and target.is_dir())):
        _remove(target)
    layer.extract(entry, dest, set_attrs=True, numeric_owner=True, filter="fully_trusted")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


# ---------------------------------------------------------------------------------------------
# Cache


def _inputs_hash(*parts: bytes | str) -> str:
    h = hashlib.sha256(FORMAT_VERSION.encode())
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()[:16]


def _cached(name: str, key: str, ref: str, build: Callable[[Path], ImageArchive], cache: Path | None) -> ImageArchive:
    dest = (cache or images_dir()) / f"{name}-{key}.oci.tar"
    if dest.is_file():
        return ImageArchive(path=dest, ref=ref)
    return build(dest)


def _run(cmd: list[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(cmd, capture_output=True, **kwargs)
    except FileNotFoundError as e:
        raise ImageUnavailable(f"{what}: {cmd[0]} is not installed") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or b"").decode(errors="replace")[-2000:]
        raise ImageError(f"{what}: {' '.join(cmd)} exited {proc.returncode}:\n{tail}")
    return proc


def _minimal_root(layer: Layer) -> None:
    """Directories and account files every image here has (root and nobody)."""
    for d in ("etc", "tmp", "proc", "sys", "dev"):
        layer.directory(d, mode=0o1777 if d == "tmp" else 0o755)
    layer.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
    layer.file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")


# ---------------------------------------------------------------------------------------------
# The images


def build_pause_image(cache: Path | None = None, cc: str = "cc") -> ImageArchive:
    """The pod sandbox image ``localhost/hami/pause:3.10``: ``/pause``, a static binary compiled
    from ``native/pause/pause.c``, run as nobody (65534) like the upstream pause image."""
    source = PAUSE_SOURCE.read_bytes()
    compiler = _run([cc, "--version"], "pause image").stdout
    flags = ["-Os", "-static", "-s", "-Wall", "-Wextra", "-Werror"]
    key = _inputs_hash(source, compiler, " ".join(flags))

    def build(dest: Path) -> ImageArchive:
        with tempfile.TemporaryDirectory() as tmp:
            binary = Path(tmp) / "pause"
            _run([cc, *flags, "-o", str(binary), str(PAUSE_SOURCE)], "compiling pause")
            layer = Layer()
            layer.file("pause", binary.read_bytes(), mode=0o755)
        config = {"Entrypoint": ["/pause"], "User": "65534:65534", "WorkingDir": "/"}
        return write_oci_archive(
            dest,
            PAUSE_REF,
            [layer.tar()],
            config,
            _labels("hami pause", "Holds a pod sandbox's namespaces; reaps children; exits 0 on SIGTERM"),
        )

    return _cached("pause", key, PAUSE_REF, build, cache)


def build_busybox_image(
    cache: Path | None = None,
    busybox: Path = BUSYBOX_BINARY,
    env: Iterable[str] = (),
    ref: str = BUSYBOX_REF,
) -> ImageArchive:
    """``localhost/hami/busybox:latest``: Debian's static busybox with a link per applet in
    ``/bin``; ``Cmd`` is ``sh``. For smoke tests of the real node. ``env`` (``KEY=value``) goes
    into the image's config after ``PATH`` (as a CUDA base image's ``ENV
    NVIDIA_VISIBLE_DEVICES=all``), under its own ``ref``."""
    if not busybox.is_file():
        raise ImageUnavailable(f"busybox image: {busybox} is missing (apt-get install busybox-static)")
    binary = busybox.read_bytes()
    env = list(env)
    key = _inputs_hash(binary, *env, ref)

    def build(dest: Path) -> ImageArchive:
        applets = _run([str(busybox), "--list"], "busybox image").stdout.decode().split()
        if "sh" not in applets:
            raise ImageError(f"busybox image: {busybox} has no sh applet")
        layer = Layer()
        _minimal_root(layer)
        layer.file("bin/busybox", binary, mode=0o755)
        for applet in applets:
            if applet != "busybox":
                layer.symlink(f"bin/{applet}", "busybox")
        config = {"Cmd": ["sh"], "Env": ["PATH=/bin", *env], "WorkingDir": "/"}
        return write_oci_archive(
            dest,
            ref,
            [layer.tar()],
            config,
            _labels("hami busybox", "Debian busybox-static, for smoke tests", licenses="GPL-2.0-only"),
        )

    return _cached("busybox", key, ref, build, cache)


def build_kube_scheduler_image(
    cache: Path | None = None, binary: Path | None = None, version: str = KUBE_VERSION
) -> ImageArchive:
    """``registry.k8s.io/kube-scheduler:<version>`` made of the pinned binary that
    ``scripts/install-kube.sh`` built, so the chart's default scheduler image is present on the
    node and ``imagePullPolicy: IfNotPresent`` never pulls. Entrypoint ``/usr/local/bin/kube-scheduler``
    (the chart passes its flags as ``command``), user nobody."""
    binary = binary or bin_dir() / "kube-scheduler"
    if not binary.is_file():
        raise ImageUnavailable(f"kube-scheduler image: {binary} is missing (run scripts/install-kube.sh)")
    ref = f"{KUBE_SCHEDULER_REPOSITORY}:{version}"
    content = binary.read_bytes()
    key = _inputs_hash(content, ref)

    def build(dest: Path) -> ImageArchive:
        layer = Layer()
        _minimal_root(layer)
        layer.file("usr/local/bin/kube-scheduler", content, mode=0o755)
        layer.symlink("kube-scheduler", "usr/local/bin/kube-scheduler")
        config = {
            "Entrypoint": ["/usr/local/bin/kube-scheduler"],
            "User": "65534:65534",
            "Env": ["PATH=/usr/local/bin"],
            "WorkingDir": "/",
        }
        return write_oci_archive(
            dest,
            ref,
            [layer.tar()],
            config,
            _labels(
                "kube-scheduler",
                f"kube-scheduler {version} built from source by scripts/install-kube.sh",
                version=version,
            ),
        )

    return _cached("kube-scheduler", key, ref, build, cache)


def _labels(title: str, description: str, version: str | None = None, licenses: str = "Apache-2.0") -> dict[str, str]:
    labels = {
        "org.opencontainers.image.title": title,
        "org.opencontainers.image.description": description,
        "org.opencontainers.image.licenses": licenses,
    }
    if version:
        labels["org.opencontainers.image.version"] = version
    return labels


def build_hami_image() -> ImageArchive:
    """The product image, built offline from the root ``Containerfile`` by
    ``scripts/build-image.sh`` (Debian base + buildah; needs root). Its ref is the chart's default
    image, ``ghcr.io/hami-py/hami:<version>``, so the chart's defaults find it once imported."""
    script = REPO_ROOT / "scripts" / "build-image.sh"
    if os.geteuid() != 0:
        raise ImageUnavailable("hami image: the offline build needs root (buildah, debootstrap)")
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        raise ImageUnavailable(
            f"hami image: {', '.join(missing)} not installed (apt-get install -y {' '.join(missing)})"
        )
    proc = _run([str(script)], "hami image")
    lines = proc.stdout.decode().split()
    if not lines or not Path(lines[-1]).is_file():
        raise ImageError(f"hami image: {script} printed no archive path (output: {proc.stdout[-500:]!r})")
    path = Path(lines[-1])
    ref = read_oci_archive(path)["index"]["manifests"][0]["annotations"][ANNOTATION_REF]
    return ImageArchive(path=path, ref=ref)


BUILDERS: dict[str, Callable[[], ImageArchive]] = {
    "pause": build_pause_image,
    "busybox": build_busybox_image,
    "kube-scheduler": build_kube_scheduler_image,
    "hami": build_hami_image,
}


def main(argv: list[str] | None = None) -> int:
    """``python -m hami_devkit.images [NAME...]``: build the named images (default: all) and print
    ``<ref> <archive>`` for each. An image this machine cannot build (no root, a missing tool or
    input) is reported as skipped; a build that fails makes the exit status 1."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hami_devkit.images", description=main.__doc__)
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"images to build: {', '.join(BUILDERS)} (default: all)"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BUILDERS]
    if unknown:
        parser.error(f"unknown image {unknown[0]!r}; choose from {', '.join(BUILDERS)}")
    failed = 0
    for name in args.names or list(BUILDERS):
        try:
            image = BUILDERS[name]()
        except ImageUnavailable as e:
            print(f"{name}: skipped: {e}", file=sys.stderr)
            continue
        except ImageError as e:
            print(f"{name}: {e}", file=sys.stderr)
            failed = 1
            continue
        print(image.ref, image.path)
    return failed


if __name__ == "__main__":
    sys.exit(main())
