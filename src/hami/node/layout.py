"""The host layout libvgpu needs on a node, for every node program (device plugin, DRA agent).

What this module owns: where things live on the host (:class:`HookPaths`: the hook directory
``<hook>/vgpu`` with ``libvgpu.so`` and ``ld.so.preload``, the per-container region directories
``containers/<pod UID>_<container>``, the per-claim ones ``claims/<claim UID>`` with their
records, the lock directory, the host driver directories given with ``--driver-mount``), making
that layout at start (:func:`prepare_hook_dir`), and recreating a container's region directory
(:func:`reset_cache_dir`). ``<hook>`` is the same path on the host and in the container
(reference §6.4), so one setting moves the library, the preload entry and the regions together
(A13).

What it does not own: what a container is given from this layout (env and mounts: the libvgpu
container contract, :mod:`hami.node.contract`), and what ``hami monitor`` reads (it is told the
directories by its own flags).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from hami.core import names

from .files import remove_tree, write_atomic

log = logging.getLogger(__name__)

LIBRARY_NAME = "libvgpu.so"
#: the NRI pending marker and the grant file (hami.core.names: libvgpu finds them in its mount table)
PENDING_MARKER = names.PENDING_MARKER
GRANT_FILE = names.GRANT_FILE
#: the host's default hook path (HAMi's), and so where libvgpu and the containers' regions live
DEFAULT_HOOK_PATH = "/usr/local"
#: the host's default lock directory (mounted at the same path in the container)
DEFAULT_LOCK_DIR = "/tmp/vgpulock"
#: what may already be in a lock directory the agent did not make: what HAMi's libvgpu (HAMi-core)
#: leaves there (its flock file ``lock``, its host-PID broker's directory ``hostpid``). Ours makes
#: nothing there (its lock is in the region; the directory is mounted read-only)
LOCK_DIR_ENTRIES = {"lock": stat.S_ISREG, "hostpid": stat.S_ISDIR}
#: the directories holding the per-container and per-claim directories and the NRI files
PRIVATE_SUBDIRS = ("containers", "claims", "nri")


@dataclass(frozen=True)
class MountSpec:
    """One bind mount: ``host_path`` shown in the container at ``container_path``."""

    container_path: str
    host_path: str
    read_only: bool


def parse_driver_mount(text: str) -> MountSpec:
    """``HOST[:CONTAINER][:ro|rw]`` (``--driver-mount``): a host directory of the GPU driver that
    every GPU container gets, at ``CONTAINER`` (default: the same path), read-only unless ``rw``."""
    parts = text.split(":")
    mode = "ro"
    if len(parts) > 1 and parts[-1] in ("ro", "rw"):
        mode = parts.pop()
    if len(parts) > 2 or not parts[0]:
        raise ValueError(f"--driver-mount {text!r}: expected HOST[:CONTAINER][:ro|rw]")
    host, container = parts[0], parts[1] if len(parts) == 2 else parts[0]
    for what, path in (("host", host), ("container", container)):
        if not path.startswith("/"):
            raise ValueError(f"--driver-mount {text!r}: the {what} path {path!r} is not absolute")
    return MountSpec(container, host, mode == "ro")


@dataclass(frozen=True)
class HookPaths:
    """Where libvgpu lives. ``hook_path`` is the same on the host and in the container (§6.4).

    ``driver_mounts``: host driver directories added to every GPU container's mounts, for nodes
    whose container runtime does not inject the driver (no NVIDIA container runtime; e.g. a
    driver kept in ``/home/kubernetes/bin/nvidia`` and shown at ``/usr/local/nvidia``).
    """

    hook_path: str = DEFAULT_HOOK_PATH
    lock_dir: str = DEFAULT_LOCK_DIR
    driver_mounts: tuple[MountSpec, ...] = ()

    @property
    def vgpu_dir(self) -> str:
        return f"{self.hook_path.rstrip('/')}/vgpu"

    @property
    def library(self) -> str:
        return f"{self.vgpu_dir}/{LIBRARY_NAME}"

    @property
    def preload_file(self) -> str:
        return f"{self.vgpu_dir}/ld.so.preload"

    @property
    def pending_marker(self) -> str:
        """Where a container sees :data:`PENDING_MARKER` (beside the library)."""
        return f"{self.vgpu_dir}/{PENDING_MARKER}"

    @property
    def pending_marker_source(self) -> str:
        """The host file shown there: not beside the host's library, whose users it would stop."""
        return f"{self.vgpu_dir}/nri/{PENDING_MARKER}"

    def cache_dir(self, pod_uid: str, container: str) -> str:
        """A device-plugin container's region directory on the host."""
        return f"{self.vgpu_dir}/containers/{pod_uid}_{container}"

    def claim_dir(self, uid: str) -> str:
        """A DRA claim's region directory on the host (shared by the claim's containers)."""
        return f"{self.vgpu_dir}/claims/{uid}"

    def claim_record(self, uid: str) -> str:
        """``claims/<uid>.json``: which claim the region directory belongs to, for ``hami monitor``.
        Beside the directory, not in it: the container mounts the directory read-write, so only
        what is outside it can be trusted to name the claim."""
        return f"{self.vgpu_dir}/claims/{uid}.json"


class UnsafeDirectoryError(OSError):
    """A directory of the layout is not what the agent may change the mode of or use: a link, not
    a directory, another user's, or (the lock directory) holding what no libvgpu put there. The
    message names the path and why; the node program must not start."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(path: str, what: str) -> int:
    """``path`` opened as a directory, never through a link in its place."""
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):  # (Linux says ENOTDIR for a link)
            raise
        try:
            link = stat.S_ISLNK(os.lstat(path).st_mode)
        except OSError:
            link = False
        kind = "a symbolic link" if link else "not a directory"
        raise UnsafeDirectoryError(exc.errno, f"{what} {path!r}: {kind}: refused (remove it)") from None


def _check_owner(fd: int, path: str, what: str) -> os.stat_result:
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        raise UnsafeDirectoryError(
            errno.EPERM,
            f"{what} {path!r}: owned by uid {info.st_uid}, not by uid {os.geteuid()} (the node agent, root): "
            "refused (another user made it; remove it)",
        )
    return info


def private_dir(path: str, what: str = "hook directory (--hook-path)") -> None:
    """Make ``path`` (created if missing) a directory only the agent (root) may enter: mode 0700,
    set through a descriptor opened without following a link. A container's root keeps MKNOD,
    FOWNER and FSETID by default and can put a setuid-root file or a device node of mode 0666 in
    its region directory: below a 0755 parent every local user of the node reached it (found by
    review, 1 Dec). Containers reach their own directory through their bind mount, which the
    parent's mode does not affect. Raises :class:`UnsafeDirectoryError` naming ``what``, the
    path and why when it is a link, not a directory or another user's."""
    try:
        Path(path).mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    fd = _open_dir(path, what)
    try:
        info = _check_owner(fd, path, what)
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def prepare_lock_dir(path: str) -> None:
    """Make sure the lock directory ``path`` (``--lock-dir``) is one the node's containers may be
    shown: created if missing (mode 0755, root's), else checked, never made writable.

    Nothing of this product writes in it (libvgpu's lock is in the region; containers mount the
    directory read-only), so its mode is left as it is. It was made 01777 once: through ``chmod``
    by name, which followed a link (a local user's ``/tmp/vgpulock -> /etc`` had the host's
    ``/etc`` made 1777), and then, through a descriptor, still for a link the kubelet's hostPath
    volume had resolved (an empty root-owned ``/usr/local/sbin`` made world-writable: root for any
    local user); and refusing to start over entries in it stopped the node's agent for a file any
    user could put in a 1777 directory (regression review, 1 Dec). Checked here, without following
    a link: a directory, owned by the agent's user (root); entries other than what HAMi's libvgpu
    leaves there (:data:`LOCK_DIR_ENTRIES`) are logged, as a sign that the path resolved elsewhere
    (docs/node.md: set ``lockPath`` to a path under a root-owned parent). Raises
    :class:`UnsafeDirectoryError` naming the path and why."""
    what = "lock directory (--lock-dir)"
    made = False
    os.makedirs(os.path.dirname(path.rstrip("/")) or "/", exist_ok=True)
    try:
        os.mkdir(path, 0o755)
        made = True
    except FileExistsError:
        pass
    fd = _open_dir(path, what)
    try:
        _check_owner(fd, path, what)
        if made:
            os.fchmod(fd, 0o755)  # (whatever the umask)
            return
        strays = []
        with os.scandir(fd) as entries:
            for entry in entries:
                kind = LOCK_DIR_ENTRIES.get(entry.name)
                if kind is None or not kind(entry.stat(follow_symlinks=False).st_mode):
                    strays.append(entry.name)
        if strays:
            shown = ", ".join(repr(n) for n in sorted(strays)[:5]) + (" ..." if len(strays) > 5 else "")
            log.warning(
                "%s %r holds %d entr%s no libvgpu makes (%s): is it a link's target, another directory of the "
                "host? Every GPU container is shown it (read-only); set --lock-dir (chart: devicePlugin.lockPath) "
                "to a directory under a root-owned parent",
                what,
                path,
                len(strays),
                "y" if len(strays) == 1 else "ies",
                shown,
            )
    finally:
        os.close(fd)


def prepare_hook_dir(paths: HookPaths) -> None:
    """Create the private directories (:data:`PRIVATE_SUBDIRS`, mode 0700) and the lock dir
    (:func:`prepare_lock_dir`), and write ld.so.preload naming *this* library path.

    The preload file's content follows ``hook_path`` so one setting moves the library end to
    end (A13). A read-only host path is reported, not fatal: Allocate will fail per pod. A
    directory refused as unsafe (:class:`UnsafeDirectoryError`: a link, another user's, a lock
    directory holding what no libvgpu made) is raised: the program must not start on it. The
    preload file is written in place, not replaced: running containers bind-mount it by inode.
    """
    try:
        for sub in PRIVATE_SUBDIRS:
            private_dir(f"{paths.vgpu_dir}/{sub}")
        prepare_lock_dir(paths.lock_dir)
        remove_trash(str(Path(paths.vgpu_dir, "containers")))
        preload = Path(paths.preload_file)
        wanted = paths.library + "\n"
        if not preload.exists() or preload.read_text() != wanted:
            preload.write_text(wanted)
        marker = Path(paths.pending_marker_source)
        if not marker.exists():
            marker.write_text("this container's GPU grant was never applied (the node's hami NRI hook was away)\n")
    except UnsafeDirectoryError:
        raise
    except OSError as exc:
        log.error("cannot prepare hook directory %s: %s", paths.vgpu_dir, exc)
    if not Path(paths.library).exists():
        log.warning("%s does not exist yet; containers will start without libvgpu", paths.library)


#: what a replaced region directory is renamed to, beside the others (no ``_``: neither hami's
#: monitor nor HAMi's reads it as a container's), until a background thread removes it
TRASH_PREFIX = ".trash-"


def reset_cache_dir(path: str) -> None:
    """Recreate a container's cache dir, empty and world-writable (any UID in the container).

    The old directory is renamed aside (``<containers>/.trash-<random>``) and a new one made, in
    constant time; the old one is removed by a background thread. Emptied in place before (found
    by review, 1 Dec): another container of the pod holding the directory open could keep
    planting entries, the removal failed and the directory was reused, with a link of its choice
    where the grant file is then written as root; and a directory of 50,000 files held the node
    agent's event loop past containerd's NRI deadline. Raises OSError when the directory cannot
    be replaced (the container must not start with what is left in it)."""
    parent, name = os.path.split(path)
    trash = os.path.join(parent, f"{TRASH_PREFIX}{os.urandom(8).hex()}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        trash = ""
    private_dir(parent)  # 0700, made again so if gone (os.makedirs below would make it 0755)
    os.makedirs(path, exist_ok=False)  # (not exist_ok: something made it meanwhile is not ours)
    os.chmod(path, 0o777)
    if trash:
        threading.Thread(target=_remove_quietly, args=(trash,), name=f"remove {name}", daemon=True).start()


def remove_trash(containers_dir: str) -> None:
    """Remove what :func:`reset_cache_dir` renamed aside and no thread removed (the agent
    restarted first), in a background thread."""
    try:
        left = [e.path for e in os.scandir(containers_dir) if e.name.startswith(TRASH_PREFIX)]
    except OSError:
        return
    if left:
        threading.Thread(target=lambda: [_remove_quietly(p) for p in left], name="remove trash", daemon=True).start()


def _remove_quietly(path: str) -> None:
    try:
        remove_tree(path)
    except OSError as exc:  # left for the next start's remove_trash
        log.warning("cannot remove %s: %s", path, exc)


def write_grant(cache_dir: str, text: str) -> None:
    """The grant file (:data:`GRANT_FILE`) in a container's region directory, readable by any UID
    (the container mounts it read-only over the same name). Written to a new file in the
    directory *above* (``containers/``, ``claims/``: the node agent's alone, the same file
    system) and renamed over the name, which replaces whatever is there (a link included) and
    follows nothing. The region directory is the containers' to write: writing through a link
    they planted at the name overwrote a file of the host as root (found by review, 1 Dec), and a
    temporary file made in it could be swapped for a link before the rename, which then put the
    link at the grant's name for the next container's mount to resolve (regression review)."""
    target = Path(cache_dir, GRANT_FILE)
    write_atomic(target, text, 0o644, tmp_dir=target.parent.parent)
