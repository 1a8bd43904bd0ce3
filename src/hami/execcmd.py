"""`hami exec`: run one command under libvgpu with a memory limit (and a compute share),
without Kubernetes: `hami exec --gpumem 4G [--gpucores 30] [--devices 0,1] -- CMD ...`.

It finds libvgpu.so, sets the same environment the device plugin gives a container, from the
same libvgpu container contract (:mod:`hami.node.contract`: CUDA_DEVICE_MEMORY_LIMIT[_i],
CUDA_DEVICE_SM_LIMIT, CUDA_DEVICE_MEMORY_SHARED_CACHE, CUDA_VISIBLE_DEVICES, ...), prepends the
library to LD_PRELOAD (no container, so no /etc/ld.so.preload mount) and replaces itself with CMD.
What differs from a container is a named parameter of the contract: the limit also applies
unindexed (the process may see any device), the compute share is unset unless asked for.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hami.node import contract
from hami.node.layout import HookPaths

# Same grammar as libvgpu (native/libvgpu/config.c): bytes, k/m/g/t and Ki/Mi/Gi/Ti(B)
# binary, KB/MB/GB/TB decimal, fractions allowed with a suffix.
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "ki": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mi": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gi": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "ti": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([A-Za-z]*)\s*$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]+$")
INSTALLED_LIB = Path(HookPaths().library)


class ExecError(ValueError):
    """A bad option value; the message names the option and the value."""


def parse_size(text: str, option: str = "--gpumem") -> int:
    m = _SIZE.match(text or "")
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS or ("." in m.group(1) and unit in ("", "b")):
        raise ExecError(f"{option}: invalid size {text!r} (expected bytes or e.g. 4096m, 4g, 4Gi, 4GB)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ExecError(f"{option}: size must be positive, got {text!r}")
    return value


def parse_devices(text: str) -> list[str]:
    items = [d.strip() for d in text.split(",")]
    for d in items:
        if not (d.isdigit() or _UUID.match(d)):
            raise ExecError(f"--devices: invalid device {d!r} in {text!r} (expected indices or UUIDs, e.g. 0,1)")
    if len(items) != len(set(items)):
        raise ExecError(f"--devices: duplicate device in {text!r}")
    if len(items) > 16:
        raise ExecError(f"--devices: at most 16 devices, got {len(items)}")
    return items


def find_library(explicit: str | None) -> Path:
    candidates = [Path(explicit)] if explicit else []
    if not explicit:
        if os.environ.get("HAMI_LIBVGPU"):
            candidates.append(Path(os.environ["HAMI_LIBVGPU"]))
        candidates.append(Path(__file__).resolve().parents[2] / "native" / "build" / "libvgpu.so")
        candidates.append(INSTALLED_LIB)
    for c in candidates:
        if c.is_file():
            return c.resolve()
    looked = ", ".join(str(c) for c in candidates)
    raise ExecError(f"--lib: libvgpu.so not found (looked in {looked}); build it with `make -C native`")


@dataclass(frozen=True)
class Plan:
    env: dict[str, str]
    argv: list[str]


_PRIVATE_DIR_MODE = 0o700  # `<tmp>/hami-exec-<uid>`: this user's regions only
_SHARED_DIR_MODE = 0o1777  # `<tmp>/hami-exec` (--shared): root's, every user's, sticky
_PRIVATE_REGION_MODE = 0o600
_SHARED_REGION_MODE = 0o644  # peers only read it (HAMI_PEER_REGIONS maps it read-only)
_DIR_HINT = "set TMPDIR to a directory of your own or name a region with --cache FILE"
# Directories above the region directory are opened O_PATH: looked up and fstat'ed without read
# permission (a root-owned 0711 /home or /scratch); the region directory itself O_RDONLY (fchmod
# needs a real descriptor). Neither follows a symbolic link.
_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_REGION_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_REGION_TRIES = 100
_UID_MAP = "/proc/self/uid_map"
_OVERFLOW_UID = "/proc/sys/kernel/overflowuid"
_IDENTITY_UID_MAP = [b"0", b"0", b"4294967295"]
_DEFAULT_OVERFLOW_UID = 65534

# Threat model of the region directory (found by review, 1 Dec):
# * A caller that is not root (euid != 0) trusts the TMPDIR it runs with: only its own
#   `<tmp>/hami-exec-<uid>` is checked (a directory, not a link, owned by it, made 0700 through
#   its descriptor). Whoever controls a directory above it (its owner, or anyone when it is
#   writable without the sticky bit) could swap the region directory, but only for a task of
#   this caller, which chose that TMPDIR; refusing it would refuse a Kubernetes emptyDir /tmp
#   (root's, 0777, not sticky) or a user's own 0775 ~/tmp for nothing.
# * Root (euid 0) run with another user's TMPDIR (`sudo -E`) would put root's region where that
#   user can swap it, so for root every directory from `/` to `<tmp>` must be owned by root (or
#   the caller) and writable by no one else unless sticky; group-writable is fine when the group
#   is the caller's own primary group. Inside a user namespace whose uid map is not the identity
#   (rootless podman, bubblewrap, an unprivileged container bind-mounting the host's /tmp), host
#   root is unmapped and shows as the overflow uid (/proc/sys/kernel/overflowuid, 65534): that
#   uid counts as root there. It also stands for every other unmapped host user, which the
#   namespace cannot tell apart; whoever made the namespace chose what it mounts.


def _shared_hint(d: str) -> str:
    return (
        f"it must be made by root, mode 1777 (sticky): `install -d -m 1777 -o root -g root {d}`, "
        f"or at every boot with the systemd tmpfiles.d line `d {d} 1777 root root -`"
    )


def _tmp_source() -> str:
    tmpdir = os.environ.get("TMPDIR")
    return f"TMPDIR={tmpdir!r}" if tmpdir else "TMPDIR unset"


def _unmapped_uid() -> int | None:
    """The uid that unmapped users (host root among them) show as when this process is in a user
    namespace whose uid map is not the identity `0 0 4294967295`; None outside one (or when
    /proc cannot tell: then nothing is taken for root but uid 0)."""
    try:
        with open(_UID_MAP, "rb") as f:
            if f.read().split() == _IDENTITY_UID_MAP:
                return None
    except (OSError, ValueError):
        return None
    try:
        with open(_OVERFLOW_UID, "rb") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return _DEFAULT_OVERFLOW_UID


def _untrusted_why(at: str, st: os.stat_result, uid: int, gid: int, unmapped: int | None) -> str | None:
    """Why root must not use the directory `at` (fstat `st`) on its TMPDIR's path, or None."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, uid, unmapped):
        seen = f" (the user namespace's overflow uid {unmapped} counts as root)" if unmapped is not None else ""
        owners = "root" if uid == 0 else f"root or uid {uid}"
        return f"{at!r} is owned by uid {st.st_uid}, not by {owners}{seen}; {_DIR_HINT}"
    if mode & stat.S_ISVTX:
        return None
    if mode & 0o002:
        return (
            f"{at!r} is writable by every user without the sticky bit (mode {oct(mode)}); make it sticky "
            f"(`chmod +t {at}`, as /tmp is 1777), or {_DIR_HINT}"
        )
    if mode & 0o020 and st.st_gid != gid:
        return (
            f"{at!r} is writable by group gid {st.st_gid} (not gid {gid}, the caller's) without the sticky "
            f"bit (mode {oct(mode)}); make it sticky (`chmod +t {at}`) or not group-writable (`chmod g-w {at}`), "
            f"or {_DIR_HINT}"
        )
    return None


def _open_tmp(tmp: str) -> int:
    """An O_PATH descriptor of the temporary directory `tmp` (absolute, links resolved). For root
    (see the threat model above) it is opened one component at a time from `/` without following
    a link, each directory checked on the way (:func:`_untrusted_why`): its owner or, when not
    sticky, anyone who can write to it can rename an entry, so an untrusted one could swap root's
    region directory for theirs between its check and the region's creation (root run with
    another user's TMPDIR, `sudo -E`). Refused, not replaced by /tmp: the caller asked for that
    TMPDIR, and a silent fallback would hide the problem. Another caller's TMPDIR is opened as
    it is (found by review, 1 Dec)."""
    if os.geteuid() != 0:
        try:
            return os.open(tmp, _PATH_FLAGS)
        except OSError as exc:
            raise ExecError(
                f"temporary directory {tmp!r} ({_tmp_source()}): cannot open it: {exc.strerror} ({_DIR_HINT})"
            ) from exc
    uid, gid, unmapped = os.getuid(), os.getgid(), _unmapped_uid()
    at = "/"
    fd = -1
    try:
        for part in [""] + [p for p in tmp.split("/") if p]:
            if part:
                at = os.path.join(at, part)  # named before it is opened: an error names this one
                nfd = os.open(part, _PATH_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nfd
            else:
                fd = os.open("/", _PATH_FLAGS)
            why = _untrusted_why(at, os.fstat(fd), uid, gid, unmapped)
            if why is not None:
                raise ExecError(
                    f"temporary directory {tmp!r} ({_tmp_source()}): {why} (refused for root: another user "
                    f"could swap the region directory in it)"
                )
    except OSError as exc:
        if fd >= 0:
            os.close(fd)
        raise ExecError(
            f"temporary directory {tmp!r} ({_tmp_source()}): cannot open {at!r}: {exc.strerror} ({_DIR_HINT})"
        ) from exc
    except ExecError:
        os.close(fd)
        raise
    return fd


def _exec_dir(shared: bool = False) -> tuple[Path, int]:
    """The directory of a fresh region and an open descriptor of it: `<tmp>/hami-exec-<uid>`
    (this user's, 0700), or with --shared the machine-wide `<tmp>/hami-exec` (root's, sticky,
    1777), where tasks of every user see each other's priority. `<tmp>` is opened by
    :func:`_open_tmp` (checked from `/` for root); the directory is looked up and checked through
    its descriptor, without following a symbolic link: a directory owned by this user (the shared
    one: by root, mode 1777). Another local user who made it first could otherwise swap the names
    in it, and a shared directory made by a user (as `hami exec` did before) is theirs: only root
    makes it (found by review, 1 Dec)."""
    uid = os.getuid()
    try:
        tmp = os.path.realpath(tempfile.gettempdir())
    except OSError as exc:
        raise ExecError(f"temporary directory ({_tmp_source()}): {exc.strerror or exc} ({_DIR_HINT})") from exc
    name = "hami-exec" if shared else f"hami-exec-{uid}"
    d = os.path.join(tmp, name)
    label = "--shared: directory" if shared else "region directory"
    owner = 0 if shared else uid
    want = _SHARED_DIR_MODE if shared else _PRIVATE_DIR_MODE
    hint = _shared_hint(d) if shared else _DIR_HINT
    pfd = _open_tmp(tmp)
    fd = -1
    try:
        if uid == owner:  # only root makes the shared one
            try:
                os.mkdir(name, want, dir_fd=pfd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise ExecError(f"{label} {d!r}: cannot create: {exc.strerror} ({hint})") from exc
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError as exc:
            raise ExecError(f"{label} {d!r}: does not exist; {hint}") from exc
        except OSError as exc:
            raise ExecError(f"{label} {d!r}: {exc.strerror} ({hint})") from exc
        if stat.S_ISLNK(st.st_mode):
            raise ExecError(f"{label} {d!r}: is a symbolic link, refused ({hint})")
        if not stat.S_ISDIR(st.st_mode):
            raise ExecError(f"{label} {d!r}: not a directory (mode {oct(st.st_mode)}), refused ({hint})")
        if st.st_uid != owner:
            whose = "root" if shared else f"uid {uid}"
            fix = f"remove it; {hint}" if shared else hint
            raise ExecError(f"{label} {d!r}: owned by uid {st.st_uid}, not by {whose}, refused ({fix})")
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=pfd)
            fst = os.fstat(fd)
        except OSError as exc:
            raise ExecError(f"{label} {d!r}: cannot open: {exc.strerror} ({hint})") from exc
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise ExecError(f"{label} {d!r}: replaced while being checked, refused ({hint})")
        if fst.st_uid == uid:  # ours: set its mode (mkdir's was less the umask), through the descriptor
            try:
                os.fchmod(fd, want)
                fst = os.fstat(fd)
            except OSError as exc:
                raise ExecError(f"{label} {d!r}: cannot set its mode: {exc.strerror} ({hint})") from exc
        mode = stat.S_IMODE(fst.st_mode)
        if shared and mode != _SHARED_DIR_MODE:
            raise ExecError(f"{label} {d!r}: mode {oct(mode)}, not 0o1777, refused ({hint})")
        if not shared and mode & 0o022 and not mode & stat.S_ISVTX:
            raise ExecError(
                f"{label} {d!r}: writable by others without the sticky bit (mode {oct(mode)}), refused ({hint})"
            )
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    finally:
        os.close(pfd)
    return Path(d), fd


def _region_name() -> str:
    return f"hami-exec-{secrets.token_hex(8)}.cache"


def _new_region(directory: Path, dir_fd: int, mode: int) -> Path:
    """A new empty region file in the checked `directory` (open as `dir_fd`): created relative
    to the descriptor, O_CREAT|O_EXCL|O_NOFOLLOW under a random name (a name another user made
    first, file or link, is never reused: another name is tried), given `mode` through its
    descriptor (a name can be a symbolic link by the time a chmod by name runs), and still the
    file at its path afterwards (found by review, 1 Dec). Every failure is one ExecError line
    naming the path and the error.

    libvgpu gets a path, not the descriptor. For root that is safe: every directory of `<tmp>` is
    owned by root (or the caller) and writable by no other user (bar the caller's primary group)
    unless sticky, so no other user can rename an entry on the path; the per-user directory is the caller's, 0700, and in the shared
    one (root's, sticky) only the file's owner (or root) can rename or remove the file. For
    another caller, a directory above `<tmp>` it does not control can only hurt its own task
    (the threat model above)."""
    fd = -1
    name = ""
    for _ in range(_REGION_TRIES):
        name = _region_name()
        try:
            fd = os.open(name, _REGION_FLAGS, mode, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise ExecError(
                f"region directory {str(directory)!r}: cannot create a region file: {exc.strerror}"
            ) from exc
    if fd < 0:
        raise ExecError(f"region directory {str(directory)!r}: no free region file name in {_REGION_TRIES} tries")
    path = directory / name
    try:
        try:
            os.fchmod(fd, mode)
            st = os.fstat(fd)
        except OSError as exc:
            _remove_quietly(name, dir_fd)
            raise ExecError(f"region file {str(path)!r}: cannot set its mode {oct(mode)}: {exc.strerror}") from exc
        try:
            at_path = os.lstat(path)
        except OSError:
            at_path = None
        if at_path is None or (at_path.st_dev, at_path.st_ino) != (st.st_dev, st.st_ino):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise ExecError(
                    f"region file {str(path)!r}: replaced after it was created, and cannot be removed: "
                    f"{exc.strerror}, refused"
                ) from exc
            raise ExecError(
                f"region file {str(path)!r}: replaced after it was created (the path no longer names it), refused"
            )
    finally:
        os.close(fd)
    return path


def _remove_quietly(name: str, dir_fd: int) -> None:
    """Remove the region file just made (a failure is already being reported)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def build_plan(args: argparse.Namespace, environ: dict[str, str]) -> Plan:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ExecError("CMD: missing command to run (usage: hami exec --gpumem 4G -- CMD ...)")
    limit = parse_size(args.gpumem)
    if args.gpucores is not None and not 0 < args.gpucores <= 100:
        raise ExecError(f"--gpucores: expected a percentage in 1..100, got {args.gpucores}")
    lib = find_library(args.lib)
    env = dict(environ)
    devices = parse_devices(args.devices) if args.devices else []
    if devices:
        env.update(contract.cuda_visible_devices(devices))
    shared = bool(getattr(args, "shared", False))
    if args.cache:
        if shared:
            raise ExecError(
                f"--shared: not with --cache {args.cache!r} (the region is that file, its peers its directory)"
            )
        cache = Path(args.cache)
        if not cache.parent.is_dir():
            raise ExecError(f"--cache: directory {str(cache.parent)!r} does not exist")
    else:
        directory, dir_fd = _exec_dir(shared)
        try:
            cache = _new_region(directory, dir_fd, _SHARED_REGION_MODE if shared else _PRIVATE_REGION_MODE)
        finally:
            os.close(dir_fd)
    # flags not given leave their variable unset (libvgpu's default)
    limits = contract.Limits(
        memory=(str(limit),) * len(devices),
        cores=args.gpucores,
        region=str(cache),
        priority=args.priority,
        all_devices_memory=str(limit),
    )
    opts = contract.Options(
        libcuda_log_level="" if args.log_level is None else str(args.log_level), core_policy=args.core_policy
    )
    env.update(contract.limit_env(limits, opts))
    # Regions in the same directory are peers: a low-priority task pauses while a
    # higher-priority one launches on a shared GPU (docs/compute-shares.md).
    env.setdefault(contract.PEER_REGIONS, str(cache.parent))
    env[contract.LD_PRELOAD] = contract.ld_preload(str(lib), env.get(contract.LD_PRELOAD, ""))
    return Plan(env=env, argv=command)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpumem", required=True, help="memory limit per device, e.g. 4G, 4096m, 4Gi, 4GB")
    parser.add_argument("--gpucores", type=int, default=None, help="compute share in percent (1..100)")
    parser.add_argument(
        "--priority",
        type=int,
        choices=(0, 1),
        default=None,
        help="task priority (CUDA_TASK_PRIORITY): 0 high, 1 low (default); a low-priority "
        "task pauses while a high-priority one launches kernels on a shared GPU",
    )
    parser.add_argument(
        "--core-policy",
        choices=("default", "force", "disable"),
        default=None,
        help="GPU_CORE_UTILIZATION_POLICY: default (capped only when the GPU is shared), "
        "force (always capped), disable (never)",
    )
    parser.add_argument("--devices", default=None, help="devices to expose, e.g. 0,1 (sets CUDA_VISIBLE_DEVICES)")
    parser.add_argument(
        "--cache",
        default=None,
        help="shared region file (default: a new file, mode 0600, in <tmp>/hami-exec-<uid>); "
        "reuse one path to share a limit between several commands",
    )
    parser.add_argument(
        "--shared",
        action="store_true",
        help="put the new region in the machine-wide <tmp>/hami-exec (readable by every user) instead of "
        "<tmp>/hami-exec-<uid>, so that tasks of other users see its priority and it sees theirs; the "
        "directory must be root's, mode 1777 (install -d -m 1777 -o root -g root /tmp/hami-exec): only "
        "root's hami exec makes it",
    )
    parser.add_argument(
        "--lib",
        default=None,
        help="path to libvgpu.so (default: $HAMI_LIBVGPU, native/build of this checkout, /usr/local/vgpu/libvgpu.so)",
    )
    parser.add_argument(
        "--log-level", type=int, choices=range(0, 5), default=None, help="LIBCUDA_LOG_LEVEL for the library (0..4)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the environment and command, do not run")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


_SHOWN = (
    contract.CUDA_VISIBLE_DEVICES,
    contract.MEMORY_LIMIT,
    contract.SM_LIMIT,
    contract.SHARED_CACHE,
    contract.LOG_LEVEL,
    contract.LD_PRELOAD,
    contract.TASK_PRIORITY,
    contract.CORE_POLICY,
    contract.PEER_REGIONS,
)


def run(args: argparse.Namespace) -> int:
    try:
        plan = build_plan(args, dict(os.environ))
    except ExecError as exc:
        print(f"hami exec: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        if not args.cache:
            Path(plan.env[contract.SHARED_CACHE]).unlink(missing_ok=True)
        for key in sorted(plan.env):
            if key.startswith(_SHOWN):
                print(f"{key}={plan.env[key]}")
        print("exec " + " ".join(plan.argv))
        return 0
    if shutil.which(plan.argv[0], path=plan.env.get("PATH")) is None and "/" not in plan.argv[0]:
        print(f"hami exec: CMD: command not found: {plan.argv[0]!r}", file=sys.stderr)
        if not args.cache:
            Path(plan.env[contract.SHARED_CACHE]).unlink(missing_ok=True)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(plan.argv[0], plan.argv, plan.env)
    except OSError as exc:
        print(f"hami exec: CMD: cannot run {plan.argv[0]!r}: {exc.strerror}", file=sys.stderr)
        return 126
    return 0  # not reached
