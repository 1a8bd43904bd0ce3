"""What the real node puts on the host, and how it is taken away again.

The real node (:mod:`hami_devkit.realnode`) touches the machine outside its work directory in
known places only, all named here: the pod bridge and its address, one nat chain, the cgroup
subtree ``hami-real-node`` in every hierarchy, containerd's socket directory, the kubelet's
device-plugin directory, and the machine-wide lock. :func:`clean_host` removes all of it
(and what the kubelet itself adds: its iptables chains, the shims' sockets, the mounts under
the work directory), and is safe to run again or after a crash. Each ``*_under``/``links_of``/
``kubelet_chains``/``pod_cgroups`` function says what is there now, which the tests use to
prove a teardown complete.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from hami_devkit.errors import RealNodeBusy, RealNodeError

LOCK_PATH = Path("/run/hami-real-node.lock")
#: containerd's socket: a unix socket path must stay under 104 bytes, which a work directory
#: under pytest's temporary tree does not; one real node per machine, so one fixed place
RUN_DIR = Path("/run/hami-real-node")
CONTAINERD_SOCKET = RUN_DIR / "containerd.sock"
#: the ``kubernetes`` Service address (the control plane's first service IP)
API_SERVICE_IP = "10.96.0.1"
BRIDGE = "hami-cni0"
POD_SUBNET = "10.88.64.0/24"
#: The node's address: the pod bridge's gateway, made before the kubelet starts. The kubelet
#: refuses a loopback node IP, and this kernel has no ``dummy`` links; the bridge, up with no
#: port yet, already answers on it locally (the API server calls the kubelet there).
NODE_IP = "10.88.64.1"
#: the ``kubernetes`` Service's ClusterIP (the first of the control plane's service range)
CGROUP_ROOT = "hami-real-node"
CGROUP_FS = Path("/sys/fs/cgroup")
DEVICE_PLUGINS_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_DEVICE_PLUGIN_FILES = ("kubelet.sock", "kubelet_internal_checkpoint")


# ---------------------------------------------------------------------------------------------
# The machine-wide lock


class MachineLock:
    """``flock`` on :data:`LOCK_PATH`: at most one real node per machine.

    The file records the holder (pid, work directory) so that the next holder can clean up
    what a holder that died left behind, and so that a refused caller learns who holds it.
    """

    def __init__(self, path: Path = LOCK_PATH) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, wait: float = 0.0) -> dict[str, Any]:
        """Take the lock, waiting up to ``wait`` seconds for a holder to finish, or raise
        :class:`RealNodeBusy`; returns what the previous holder recorded."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + wait
        while not self._try_lock(fd):
            if time.monotonic() >= deadline:
                holder = self._read(fd)
                os.close(fd)
                raise RealNodeBusy(
                    f"another real node runs on this machine (lock {self.path} held by pid "
                    f"{holder.get('pid', '?')}, work directory {holder.get('workdir', '?')}); "
                    "stop it first (`hami-dev cluster down`)"
                )
            time.sleep(0.5)
        self._fd = fd
        return self._read(fd)

    @staticmethod
    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            os.close(fd)
            raise
        return True

    def record(self, **holder: Any) -> None:
        assert self._fd is not None, "lock not held"
        data = json.dumps({"pid": os.getpid(), **holder}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self, keep_record: bool = False) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            if not keep_record:
                os.ftruncate(fd, 0)
            os.close(fd)  # closing drops the flock

    @property
    def held(self) -> bool:
        return self._fd is not None

    @staticmethod
    def _read(fd: int) -> dict[str, Any]:
        try:
            return json.loads(os.pread(fd, 65536, 0) or b"{}")
        except ValueError:
            return {}


# ---------------------------------------------------------------------------------------------
# Host clean-up (mounts, links, cgroups, leftover processes)


_MNT_DETACH = 2


def mounts_under(root: Path, mountinfo: str | None = None) -> list[Path]:
    """Mount points at or below ``root``, deepest first (the order to unmount them in)."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    prefix = str(root).rstrip("/")
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = fields[4].encode().decode("unicode_escape")  # \040 for spaces and the like
        if point == prefix or point.startswith(prefix + "/"):
            found.append(Path(point))
    return sorted(set(found), key=lambda p: (len(p.parts), str(p)), reverse=True)


def unmount_all(root: Path) -> list[Path]:
    """Lazily unmount everything at or below ``root``; returns what was unmounted."""
    libc = ctypes.CDLL(None, use_errno=True)
    done = []
    for _ in range(5):  # a mount may be stacked several times (or re-propagated)
        points = mounts_under(root)
        if not points:
            break
        for point in points:
            if libc.umount2(str(point).encode(), _MNT_DETACH) == 0:
                done.append(point)
    return done


def pod_cgroups(cgroup_root: str = CGROUP_ROOT) -> list[Path]:
    """The real node's cgroup directories in every hierarchy, deepest first."""
    found = []
    for hierarchy in _hierarchies():
        top = hierarchy / cgroup_root
        if top.is_dir():
            found.extend(Path(path) for path, _, _ in os.walk(top))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _hierarchies() -> list[Path]:
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS]  # pure cgroup v2
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink())


def make_cgroup_root(cgroup_root: str = CGROUP_ROOT) -> None:
    """Create the kubelet's ``cgroupRoot`` in every hierarchy (the kubelet requires it to exist);
    a new cpuset cgroup starts empty, so it gets its parent's CPUs and memory nodes."""
    for hierarchy in _hierarchies():
        top = hierarchy / cgroup_root
        top.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            mine, parent = top / name, hierarchy / name
            if mine.exists() and parent.exists() and not mine.read_text().strip():
                mine.write_text(parent.read_text())


def remove_cgroups(cgroup_root: str = CGROUP_ROOT) -> list[Path]:
    """Kill what is left in the node's cgroups, then remove them (deepest first); returns the
    directories that could not be removed."""
    for path in pod_cgroups(cgroup_root):
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
    left = []
    for path in pod_cgroups(cgroup_root):
        for attempt in range(50):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05 * (attempt + 1) ** 0.5)
        else:
            left.append(path)
    return left


def links_of(bridge: str = BRIDGE) -> list[str]:
    """The bridge itself (if present) and the interfaces enslaved to it."""
    result = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False)
    names = []
    for line in result.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 3:
            continue
        name = parts[1].strip().split("@")[0]
        if name == bridge or f" master {bridge} " in parts[2]:
            names.append(name)
    return names


def guard_api_server(api_port: int, *, bridge: str = BRIDGE) -> None:
    """Let only this machine and the real node's pods reach the API server's port.

    With a real node the API server listens on every address (pods reach it at the node's
    address, through kube-proxy's rules for the ``kubernetes`` Service): a filter chain
    ``HAMI-APISERVER``, jumped to from INPUT for that port, accepts connections arriving on
    ``lo`` (this machine, host-network pods) and on the pod bridge, and drops the rest, so the
    development API server is not reachable from other machines. Removed by
    :func:`remove_kubelet_chains` and with the node.
    """
    chain = "HAMI-APISERVER"
    rules = [
        ["-N", chain],
        ["-A", chain, "-i", "lo", "-j", "RETURN"],
        ["-A", chain, "-i", bridge, "-j", "RETURN"],
        ["-A", chain, "-j", "DROP"],
        ["-I", "INPUT", "-p", "tcp", "--dport", str(api_port), "-j", chain],
    ]
    for rule in rules:
        result = subprocess.run(["iptables", "-w", "-t", "filter", *rule], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RealNodeError(f"iptables -t filter {' '.join(rule)} failed: {result.stderr.strip()}")


def make_bridge(bridge: str = BRIDGE, address: str = NODE_IP, prefix: int = 24) -> None:
    """Create the pod bridge with the node's address (the CNI bridge plugin adopts it)."""
    for argv in (
        ["ip", "link", "add", "name", bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{address}/{prefix}", "dev", bridge],
        ["ip", "link", "set", bridge, "up"],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RealNodeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")


def remove_links(bridge: str = BRIDGE) -> None:
    for name in sorted(links_of(bridge), key=lambda n: n == bridge):  # veths first, the bridge last
        subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)


def shim_sockets(workdir: Path) -> list[Path]:
    """The sockets of containerd's shims for this node's tasks (they live in containerd's
    fixed ``/run/containerd/s/``; each task's bundle records its shim's address)."""
    found = []
    for address in (workdir / "containerd" / "state" / "io.containerd.runtime.v2.task").glob("*/*/address"):
        with contextlib.suppress(OSError):
            text = address.read_text().strip()
            if text.startswith("unix://"):
                found.append(Path(text[len("unix://") :]))
    return found


#: chains the kubelet makes: two empty ones to detect a flush of the tables, and
#: ``KUBE-FIREWALL`` (drops outside packets to 127.0.0.0/8) jumped to from INPUT and OUTPUT;
#: removed with the node (one kubelet per machine: they are ours); and ours, ``HAMI-APISERVER``
#: (see :func:`guard_api_server`; ``HAMI-REAL-NODE`` is what earlier versions made)
KUBELET_CHAINS = ("KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-FIREWALL", "HAMI-APISERVER", "HAMI-REAL-NODE")


def remove_kubelet_chains() -> None:
    for program in ("iptables", "ip6tables"):
        if shutil.which(program) is None:
            continue
        for table in ("mangle", "nat", "filter"):
            rules = subprocess.run(
                [program, "-w", "-t", table, "-S"], capture_output=True, text=True, check=False
            ).stdout.splitlines()
            for rule in rules:  # the jumps into our chains first, then the chains
                words = shlex.split(rule)
                if (
                    words[:1] == ["-A"]
                    and len(words) > 3
                    and words[-1] in KUBELET_CHAINS
                    and words[-2] == "-j"
                    and words[1] not in KUBELET_CHAINS
                ):
                    subprocess.run([program, "-w", "-t", table, "-D", *words[1:]], capture_output=True, check=False)
            for chain in KUBELET_CHAINS:
                subprocess.run([program, "-w", "-t", table, "-F", chain], capture_output=True, check=False)
                subprocess.run([program, "-w", "-t", table, "-X", chain], capture_output=True, check=False)


def kubelet_chains() -> list[str]:
    """``program/table/chain`` of the kubelet's chains present now."""
    present = []
    for program in ("iptables", "ip6tables"):
        if shutil.which(program) is None:
            continue
        for table in ("mangle", "nat", "filter"):
            listing = subprocess.run(
                [program, "-w", "-t", table, "-S"], capture_output=True, text=True, check=False
            ).stdout.split()
            present += [f"{program}/{table}/{chain}" for chain in KUBELET_CHAINS if chain in listing]
    return present


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def processes_mentioning(text: str) -> list[int]:
    """Pids (not this one) whose command line contains ``text``: with the work directory, our
    kubelet and containerd; with the containerd socket, its shims (``-address <socket>``)."""
    pids = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
    return pids


def clean_host(
    workdir: Path, *, device_plugin_entries: set[str] | None = None, device_plugin_dir_existed: bool = True
) -> list[str]:
    """Remove everything a real node with work directory ``workdir`` may have left on the host.

    Safe to call more than once and after a crash. ``device_plugin_entries``: the names that
    were in :data:`DEVICE_PLUGINS_DIR` before the node started (others are removed, and the
    kubelet's own files always; ``None``: only the kubelet's own files); the directory and ``/var/lib/kubelet`` go too when
    they did not exist before and are empty. Returns what it could not clean.
    """
    problems: list[str] = []
    killed = []
    for needle in (str(workdir) + "/", str(CONTAINERD_SOCKET)):  # kubelet, containerd; shims
        for pid in processes_mentioning(needle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    for _ in range(100):  # SIGKILL is delivered asynchronously
        if not [pid for pid in killed if alive(pid)]:
            break
        time.sleep(0.05)
    for socket in shim_sockets(workdir):
        with contextlib.suppress(FileNotFoundError):
            socket.unlink()
    left_cgroups = remove_cgroups()
    unmount_all(workdir)
    remove_links()
    remove_kubelet_chains()
    if left_cgroups:
        problems.append(f"cgroups not removed: {', '.join(map(str, left_cgroups[:5]))}")
    if mounts_under(workdir):
        problems.append(f"mounts left under {workdir}: {', '.join(map(str, mounts_under(workdir)[:5]))}")
    if links_of():
        problems.append(f"links left: {', '.join(links_of())}")
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    if DEVICE_PLUGINS_DIR.is_dir():
        for entry in DEVICE_PLUGINS_DIR.iterdir():
            # the kubelet's own files are ours whatever was there before (one kubelet at a time)
            ours = entry.name in KUBELET_DEVICE_PLUGIN_FILES or (
                device_plugin_entries is not None and entry.name not in device_plugin_entries
            )
            if ours:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
        if not device_plugin_dir_existed:
            for directory in (DEVICE_PLUGINS_DIR, DEVICE_PLUGINS_DIR.parent):
                with contextlib.suppress(OSError):
                    directory.rmdir()
    return problems
