"""One real Kubernetes node beside the fake ones: kubelet + containerd + runc + a CNI bridge.

:class:`RealNode` joins a running :class:`~hami.dev.controlplane.KubeCluster` as a node that
really runs pods. Everything it owns lives under one work directory:

==========================  ===============================================================
``containerd/``             containerd's root and state, run privately (no system
                            containerd is touched); its socket is
                            ``/run/hami-real-node/containerd.sock``
                            (:attr:`RealNode.containerd_socket`: a socket path must be short)
``cni/``                    the bridge network's configuration and its IP allocations
``kubelet/``                the kubelet's ``--root-dir`` (:attr:`RealNode.kubelet_root`)
``pki/``, ``config/``       the node's certificates, kubeconfig and ``KubeletConfiguration``
``logs/``                   ``containerd.log`` and ``kubelet.log`` (:meth:`RealNode.log_path`);
                            container logs are in ``kubelet/pods-logs/`` (``podLogsDir``)
==========================  ===============================================================

Outside that directory, and removed by :meth:`RealNode.stop`: the bridge ``hami-cni0`` and
the pods' veths, the kubelet's (empty) iptables chains, the shims' sockets, the pods' cgroups under ``/sys/fs/cgroup/<controller>/hami-real-node`` (the
kubelet's ``cgroupRoot``), the pods' network namespaces (under containerd's state directory),
and the entries the kubelet writes in ``/var/lib/kubelet/device-plugins/`` (a path the kubelet
uses whatever ``--root-dir`` says; it is why only one real node may run per machine, which
:class:`MachineLock` enforces with ``flock`` on ``/run/hami-real-node.lock``).

Facts this rests on (``shared/reference/real-node.md``): Debian's containerd 1.6 + runc + CNI
plugins run pods here; the kubelet at the pinned version needs ``failCgroupV1: false`` on this
hybrid cgroup v1 host; without ``CAP_SYS_RESOURCE`` sandboxes fail unless containerd's CRI
option ``restrict_oom_score_adj`` is on (so it is turned on only then); there is no registry,
so the pause image (containerd's ``sandbox_image``) and every test image are imported from OCI
archives (:meth:`RealNode.import_image`, archives from :mod:`hami.dev.images`).

Pods reach the API server at the ``kubernetes`` Service address (:func:`route_api_service`).
The API server reaches the kubelet for ``kubectl logs``/``exec`` at the node's InternalIP
(:data:`NODE_IP`, the bridge's gateway address), over TLS with the cluster CA both ways; the kubelet authenticates to the API
server as ``system:node:<name>`` (group ``system:nodes``), bound to the ``system:node`` role.
"""

from __future__ import annotations

import atexit
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
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hami.dev.controlplane import KubeCluster
from hami.dev.errors import ClusterError
from hami.dev.process import Component, free_port, http_get

NODE_NAME = "hami-real-node"
LOCK_PATH = Path("/run/hami-real-node.lock")
#: containerd's socket: a unix socket path must stay under 104 bytes, which a work directory
#: under pytest's temporary tree does not; one real node per machine, so one fixed place
RUN_DIR = Path("/run/hami-real-node")
CONTAINERD_SOCKET = RUN_DIR / "containerd.sock"
BRIDGE = "hami-cni0"
POD_SUBNET = "10.88.64.0/24"
#: The node's address: the pod bridge's gateway, made before the kubelet starts. The kubelet
#: refuses a loopback node IP, and this kernel has no ``dummy`` links; the bridge, up with no
#: port yet, already answers on it locally (the API server calls the kubelet there).
NODE_IP = "10.88.64.1"
#: the ``kubernetes`` Service's ClusterIP (the first of the control plane's service range)
API_SERVICE_IP = "10.96.0.1"
CGROUP_ROOT = "hami-real-node"
CGROUP_FS = Path("/sys/fs/cgroup")
DEVICE_PLUGINS_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_DEVICE_PLUGIN_FILES = ("kubelet.sock", "kubelet_internal_checkpoint")
CNI_BIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
CNI_PLUGINS = ("bridge", "host-local", "loopback")
HOST_PROGRAMS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip", "iptables")
READY_TIMEOUT_S = 120.0
CAP_SYS_RESOURCE = 24
_TEMP_PREFIX = "hami-real-node-"
_MAX_SOCKET_PATH = 104
K8S_NAMESPACE = "k8s.io"  # containerd namespace of the CRI plugin


class RealNodeError(ClusterError):
    """The real node could not be started, used or stopped."""


class RealNodeUnavailable(RealNodeError):
    """This machine cannot run a real node; ``missing`` names what it lacks, in one line."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        super().__init__("real node unavailable: " + "; ".join(missing))


class RealNodeBusy(RealNodeError):
    """Another real node holds the machine-wide lock."""


# ---------------------------------------------------------------------------------------------
# What the machine must have


def has_capability(number: int, status: str | None = None) -> bool:
    """Whether this process's effective capability set has capability ``number``."""
    if status is None:
        status = Path("/proc/self/status").read_text()
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> number & 1)
    return False


def cni_bin_dir() -> Path | None:
    """The directory holding the CNI plugins the bridge network needs (Debian: /usr/lib/cni)."""
    for directory in CNI_BIN_DIRS:
        if all(os.access(directory / plugin, os.X_OK) for plugin in CNI_PLUGINS):
            return directory
    return None


def missing_requirements(binaries: dict[str, Path]) -> list[str]:
    """What this machine lacks to run a real node, each with how to get it (empty: nothing)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the kubelet, containerd and runc need it)")
    if "kubelet" not in binaries:
        missing.append("kubelet (run scripts/install-kube.sh or `make kube`)")
    programs = [name for name in HOST_PROGRAMS if shutil.which(name) is None]
    if programs:
        missing.append(f"{', '.join(programs)} (run scripts/install-node.sh or `make node`)")
    if cni_bin_dir() is None:
        missing.append(f"CNI plugins {', '.join(CNI_PLUGINS)} in {' or '.join(map(str, CNI_BIN_DIRS))} "
                       "(run scripts/install-node.sh)")
    if not (CGROUP_FS / "memory").is_dir() and not (CGROUP_FS / "cgroup.controllers").exists():
        missing.append(f"cgroups mounted at {CGROUP_FS}")
    return missing


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
                    "stop it first (`hami dev cluster down`)")
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
# Configuration documents (pure)


def containerd_config(root: Path, *, socket: Path, sandbox_image: str, cni_bin: Path,
                      restrict_oom_score_adj: bool) -> str:
    """containerd's ``config.toml`` (version 2) for a private instance under ``root``, listening
    on ``socket`` (and ``<socket>.ttrpc``)."""
    def q(value: object) -> str:
        return json.dumps(str(value))  # a TOML basic string is a JSON string

    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    return "\n".join([
        "version = 2",
        f"root = {q(root / 'root')}",
        f"state = {q(root / 'state')}",
        # snapshotters that cannot work here (and would only log errors)
        'disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",'
        ' "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]',
        "[grpc]",
        f"  address = {q(socket)}",
        "[ttrpc]",
        '  address = ""',
        '[plugins."io.containerd.internal.v1.opt"]',
        f"  path = {q(root / 'opt')}",
        cri,
        f"  sandbox_image = {q(sandbox_image)}",
        f"  restrict_oom_score_adj = {'true' if restrict_oom_score_adj else 'false'}",
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "0"',
        "  enable_selinux = false",
        "  disable_apparmor = true",
        "  netns_mounts_under_state_dir = true",
        f'{cri[:-1]}.containerd]',
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f'{cri[:-1]}.containerd.runtimes.runc]',
        '  runtime_type = "io.containerd.runc.v2"',
        f'{cri[:-1]}.containerd.runtimes.runc.options]',
        "  SystemdCgroup = false",
        f'{cri[:-1]}.cni]',
        f"  bin_dir = {q(cni_bin)}",
        f"  conf_dir = {q(root.parent / 'cni' / 'net.d')}",
        "",
    ])


def cni_config(ipam_dir: Path, *, bridge: str = BRIDGE, subnet: str = POD_SUBNET) -> dict[str, Any]:
    """A bridge network with host-local addresses; no masquerading (nothing outside loopback is
    reachable anyway), so no iptables rules are left to clean up."""
    return {
        "cniVersion": "0.4.0",
        "name": "hami-real-node",
        "plugins": [{
            "type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(ipam_dir)},
        }],
    }


def kubelet_config(*, address: str, port: int, healthz_port: int, socket: Path, ca: Path, cert: Path, key: Path,
                   pod_logs: Path, cgroup_root: str = CGROUP_ROOT, max_pods: int = 110) -> dict[str, Any]:
    """The ``KubeletConfiguration`` of the real node (see the module docstring)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(cert),
        "tlsPrivateKeyFile": str(key),
        # who may call the kubelet: clients with a certificate of the cluster CA (the API
        # server), each request authorized by the API server (SubjectAccessReview)
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{cgroup_root}",
        "failSwapOn": False,
        "failCgroupV1": False,
        "podLogsDir": str(pod_logs),
        "imageGCHighThresholdPercent": 100,  # 100: image garbage collection off
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                         "imagefs.available": "1%"},
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "registerNode": True,
        "maxPods": max_pods,
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": "cluster.local",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "5s",
        "volumePluginDir": str(pod_logs.parent / "volume-plugins"),
    }


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


def route_api_service(api_port: int, *, service_ip: str = API_SERVICE_IP, bridge: str = BRIDGE) -> None:
    """Make the ``kubernetes`` Service address (``service_ip``:443) lead to the API server on
    127.0.0.1:``api_port``, from pods on the bridge and from host-network pods: what kube-proxy
    would do, for the one address in-cluster clients use (``KUBERNETES_SERVICE_HOST``).

    A nat chain ``HAMI-REAL-NODE`` with one DNAT rule, jumped to from PREROUTING (pods) and
    OUTPUT (host network); ``route_localnet`` on the bridge lets a DNAT to 127.0.0.1 and its
    replies cross it. Removed by :func:`remove_kubelet_chains` and with the bridge.
    """
    chain = "HAMI-REAL-NODE"
    rules = [
        ["-N", chain],
        ["-A", chain, "-d", f"{service_ip}/32", "-p", "tcp", "--dport", "443",
         "-j", "DNAT", "--to-destination", f"127.0.0.1:{api_port}"],
        ["-A", "PREROUTING", "-i", bridge, "-j", chain],
        ["-A", "OUTPUT", "-d", f"{service_ip}/32", "-j", chain],
    ]
    for rule in rules:
        result = subprocess.run(["iptables", "-w", "-t", "nat", *rule], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RealNodeError(f"iptables -t nat {' '.join(rule)} failed: {result.stderr.strip()}")
    Path(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet").write_text("1")


def make_bridge(bridge: str = BRIDGE, address: str = NODE_IP, prefix: int = 24) -> None:
    """Create the pod bridge with the node's address (the CNI bridge plugin adopts it)."""
    for argv in (["ip", "link", "add", "name", bridge, "type", "bridge"],
                 ["ip", "addr", "add", f"{address}/{prefix}", "dev", bridge],
                 ["ip", "link", "set", bridge, "up"]):
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
                found.append(Path(text[len("unix://"):]))
    return found


#: chains the kubelet makes: two empty ones to detect a flush of the tables, and
#: ``KUBE-FIREWALL`` (drops outside packets to 127.0.0.0/8) jumped to from INPUT and OUTPUT;
#: removed with the node (one kubelet per machine: they are ours); and ours, ``HAMI-REAL-NODE``
#: (see :func:`route_api_service`)
KUBELET_CHAINS = ("KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-FIREWALL", "HAMI-REAL-NODE")


def remove_kubelet_chains() -> None:
    for program in ("iptables", "ip6tables"):
        if shutil.which(program) is None:
            continue
        for table in ("mangle", "nat", "filter"):
            rules = subprocess.run([program, "-w", "-t", table, "-S"], capture_output=True, text=True,
                                   check=False).stdout.splitlines()
            for rule in rules:  # the jumps into our chains first, then the chains
                words = shlex.split(rule)
                if words[:1] == ["-A"] and len(words) > 3 and words[-1] in KUBELET_CHAINS and words[-2] == "-j" \
                        and words[1] not in KUBELET_CHAINS:
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
            listing = subprocess.run([program, "-w", "-t", table, "-S"], capture_output=True, text=True,
                                     check=False).stdout.split()
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


def clean_host(workdir: Path, *, device_plugin_entries: set[str] | None = None,
               device_plugin_dir_existed: bool = True) -> list[str]:
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
                device_plugin_entries is not None and entry.name not in device_plugin_entries)
            if ours:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
        if not device_plugin_dir_existed:
            for directory in (DEVICE_PLUGINS_DIR, DEVICE_PLUGINS_DIR.parent):
                with contextlib.suppress(OSError):
                    directory.rmdir()
    return problems


# ---------------------------------------------------------------------------------------------
# The node


@dataclass
class RealNode:
    """A kubelet + containerd node named ``name`` joined to ``cluster``; see the module docstring.

    ``images``: OCI archives (paths) imported into containerd before the kubelet starts; the
    pause image is always imported (``pause_image``: an :class:`hami.dev.images.ImageArchive`;
    ``None``: built by :func:`hami.dev.images.build_pause_image`).
    ``workdir``: where everything goes (a new temporary directory if ``None``, removed by
    :meth:`stop` unless ``keep_workdir``; a given one is emptied first and kept).
    """

    cluster: KubeCluster
    name: str = NODE_NAME
    labels: dict[str, str] = field(default_factory=lambda: {"gpu": "on"})
    workdir: Path | None = None
    pause_image: Any = None
    images: list[Path] = field(default_factory=list)
    keep_workdir: bool = False
    lock_path: Path = LOCK_PATH
    #: seconds to wait for another real node on this machine to go away before giving up
    lock_wait: float = 0.0
    #: route the ``kubernetes`` Service address to the API server (:func:`route_api_service`),
    #: so pods using the in-cluster configuration reach it
    api_service: bool = True
    ready_timeout: float = READY_TIMEOUT_S

    components: dict[str, Component] = field(default_factory=dict, init=False)
    timings: dict[str, float] = field(default_factory=dict, init=False)
    startup_seconds: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._temporary = self.workdir is None
        self._lock = MachineLock(self.lock_path)
        self._device_plugin_entries: set[str] | None = None
        self._device_plugin_dir_existed = True
        self.kubelet_port = 0
        self.problems: list[str] = []  # what the last stop() could not clean

    # -- locations -----------------------------------------------------------------------------

    def _dir(self, *parts: str) -> Path:
        assert self.workdir is not None, "real node not started"
        return Path(self.workdir, *parts)

    @property
    def containerd_socket(self) -> Path:
        """containerd's socket (``ctr --address <it> -n k8s.io ...``)."""
        return CONTAINERD_SOCKET

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's ``--root-dir`` (pods' volumes; not the device-plugin directory, which the
        kubelet keeps at :data:`DEVICE_PLUGINS_DIR` whatever this says)."""
        return self._dir("kubelet")

    @property
    def pod_logs_dir(self) -> Path:
        """Container logs: ``<namespace>_<pod>_<uid>/<container>/<restart>.log``."""
        return self._dir("kubelet", "pods-logs")

    @property
    def device_plugins_dir(self) -> Path:
        return DEVICE_PLUGINS_DIR

    def log_path(self, component: str) -> Path:
        """``containerd`` or ``kubelet``'s log file."""
        return self._dir("logs", f"{component}.log")

    def log_tails(self, lines: int = 40) -> str:
        return "\n".join(f"===== {name} ({c.log_path}) =====\n{c.log_tail(lines)}"
                         for name, c in self.components.items())

    def describe_startup(self) -> str:
        parts = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in self.timings.items())
        return f"real node {self.name} Ready in {self.startup_seconds:.1f}s ({parts})"

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> RealNode:
        """Bring the node up and wait until it is Ready; on any failure clean up and raise.

        Raises :class:`RealNodeUnavailable` (naming what is missing) before touching anything,
        and :class:`RealNodeBusy` when another real node holds the machine.
        """
        if self._lock.held:
            raise RealNodeError(f"real node {self.name} already started")
        binaries = self.cluster.binaries or {}
        missing = missing_requirements(binaries)
        if missing:
            raise RealNodeUnavailable(missing)
        previous = self._lock.acquire(self.lock_wait)
        began = time.monotonic()
        try:
            if previous.get("workdir"):  # a holder that died: clear what it left
                self._timed("clean previous", lambda: self._clean_previous(
                    Path(previous["workdir"]), previous.get("device_plugins_dir_existed", True)))
            if self.workdir is None:
                self.workdir = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX))
            elif Path(self.workdir).exists():  # a given directory is emptied (after un-mounting)
                clean_host(Path(self.workdir))
                shutil.rmtree(self.workdir)
            self.workdir = Path(self.workdir)
            if len(str(self.kubelet_root / "pod-resources" / "12345678")) > _MAX_SOCKET_PATH:
                raise RealNodeError(f"workdir {str(self.workdir)!r}: too long; the kubelet makes unix sockets "
                                    f"under it whose paths must stay under {_MAX_SOCKET_PATH} bytes")
            # whether the device-plugin directory was there before any real node: a dead
            # holder's record knows, else look now
            self._device_plugin_dir_existed = previous.get("device_plugins_dir_existed", DEVICE_PLUGINS_DIR.is_dir())
            self._lock.record(workdir=str(self.workdir), node=self.name,
                              device_plugins_dir_existed=self._device_plugin_dir_existed)
            atexit.register(self.stop)
            for sub in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "pki", "config", "logs"):
                self._dir(*sub.split("/")).mkdir(parents=True, exist_ok=True)
            RUN_DIR.mkdir(parents=True, exist_ok=True)
            self._device_plugin_entries = (
                {p.name for p in DEVICE_PLUGINS_DIR.iterdir()} if DEVICE_PLUGINS_DIR.is_dir() else set())
            pause = self._timed("pause image", self._pause_image)
            self._timed("bridge", make_bridge)
            if self.api_service:
                self._timed("api service", lambda: route_api_service(self.cluster.ports["kube-apiserver"]))
            self._timed("containerd", lambda: self._start_containerd(pause.ref))
            self._timed("images", lambda: [self.import_image(path) for path in [pause.path, *self.images]])
            self._timed("credentials", self._write_credentials)
            self._timed("kubelet", self._start_kubelet)
            self._timed("node Ready", self._wait_node_ready)
        except BaseException:
            self.stop(keep_workdir=True)
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self, keep_workdir: bool = False) -> list[str]:
        """Stop the kubelet, every pod, containerd; remove what the node put on the host (see the
        module docstring) and its Node object; release the lock. Returns what it could not clean
        (also kept in :attr:`problems`)."""
        if not self._lock.held:
            return self.problems
        atexit.unregister(self.stop)
        problems: list[str] = []

        def attempt(what: str, step: Callable[[], Any]) -> Any:
            try:
                return step()
            except Exception as exc:  # every step is tried; what failed is reported
                problems.append(f"{what}: {exc}")
                return None

        sockets = shim_sockets(self.workdir) if self.workdir else []  # gone with the tasks' bundles
        kubelet = self.components.pop("kubelet", None)
        if kubelet:
            attempt("stop kubelet", kubelet.stop)
        containerd = self.components.pop("containerd", None)
        if containerd:
            if containerd.alive():
                attempt("remove pods", self._remove_pods)
            attempt("stop containerd", containerd.stop)
        for socket in sockets:
            with contextlib.suppress(FileNotFoundError):
                socket.unlink()
        if self.workdir:
            problems += attempt("clean host", lambda: clean_host(
                self.workdir, device_plugin_entries=self._device_plugin_entries,
                device_plugin_dir_existed=self._device_plugin_dir_existed)) or []
        attempt("delete Node", lambda: self.cluster.delete_node(self.name))
        attempt("delete ClusterRoleBinding", lambda: self.cluster.api(
            "DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{self._binding}",
            expect=(200, 202, 404)))
        host_clean = not [p for p in problems if not p.startswith("delete ")]
        if self._temporary and self.workdir and not (keep_workdir or self.keep_workdir) and host_clean:
            shutil.rmtree(self.workdir, ignore_errors=True)
        # a node that could not clean the host leaves its record, so the next holder cleans it
        self._lock.release(keep_record=not host_clean)
        self.problems = problems
        return problems

    @staticmethod
    def _clean_previous(workdir: Path, device_plugins_dir_existed: bool) -> None:
        problems = clean_host(workdir, device_plugin_dir_existed=device_plugins_dir_existed)
        if problems:
            raise RealNodeError(f"could not clean what the previous real node left: {'; '.join(problems)}")
        if workdir.parent == Path(tempfile.gettempdir()) and workdir.name.startswith(_TEMP_PREFIX):
            shutil.rmtree(workdir, ignore_errors=True)

    def _timed(self, name: str, step: Callable[[], Any]) -> Any:
        began = time.monotonic()
        result = step()
        self.timings[name] = time.monotonic() - began
        return result

    # -- containerd ----------------------------------------------------------------------------

    def _pause_image(self) -> Any:
        if self.pause_image is not None:
            return self.pause_image
        from hami.dev.images import build_pause_image

        return build_pause_image()

    def _start_containerd(self, sandbox_image: str) -> None:
        restrict = not has_capability(CAP_SYS_RESOURCE)
        config = self._dir("config", "containerd.toml")
        cni_bin = cni_bin_dir()
        assert cni_bin is not None
        config.write_text(containerd_config(self._dir("containerd"), socket=self.containerd_socket,
                                            sandbox_image=sandbox_image,
                                            cni_bin=cni_bin, restrict_oom_score_adj=restrict))
        (self._dir("cni", "net.d") / "10-hami-bridge.conflist").write_text(
            json.dumps(cni_config(self._dir("cni", "ipam")), indent=2))
        component = self._launch("containerd", ["containerd", f"--config={config}", "--log-level=info"])
        self._wait(component, lambda: self.ctr("version", check=False).returncode == 0, "containerd answering")

    def ctr(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this node's containerd, in the CRI namespace ``k8s.io``."""
        result = subprocess.run(["ctr", f"--address={self.containerd_socket}", "-n", K8S_NAMESPACE, *args],
                                capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def import_image(self, archive: Path | str) -> str:
        """Import an OCI image archive into the node's containerd (pods may then use it with
        ``imagePullPolicy: IfNotPresent`` or ``Never``); returns ``ctr``'s output."""
        path = Path(getattr(archive, "path", archive))
        if not path.is_file():
            raise RealNodeError(f"import_image: archive {path} does not exist")
        return self.ctr("images", "import", str(path)).stdout

    def image_refs(self) -> list[str]:
        """The image names containerd knows in the CRI namespace."""
        return [line for line in self.ctr("images", "list", "-q").stdout.splitlines() if line]

    def _remove_pods(self) -> None:
        """Kill every task and remove every container, so the shims unmount their rootfs."""
        tasks = self.ctr("tasks", "list", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "-a", "-s", "SIGKILL", task, check=False, timeout=15)
        for task in tasks:
            for _ in range(20):
                if self.ctr("tasks", "delete", "-f", task, check=False, timeout=15).returncode == 0:
                    break
                time.sleep(0.1)
        containers = self.ctr("containers", "list", "-q", check=False).stdout.split()
        if containers:
            self.ctr("containers", "delete", *containers, check=False, timeout=30)

    # -- kubelet -------------------------------------------------------------------------------

    @property
    def _binding(self) -> str:
        return f"hami-real-node:{self.name}"

    def _write_credentials(self) -> None:
        """The node's client certificate (``system:node:<name>`` in ``system:nodes``), bound to
        the ``system:node`` role, its kubeconfig, and its serving certificate."""
        user = f"system:node:{self.name}"
        pair = self.cluster.issue_client_cert(user, groups=("system:nodes",))
        self.cluster.write_kubeconfig(self._dir("config", "kubelet.kubeconfig"), pair=pair)
        serving = self.cluster.issue_serving_pair(f"kubelet-{self.name}", hosts=(NODE_IP, "127.0.0.1", "localhost", self.name))
        for name, data in (("kubelet.crt", serving.cert_pem), ("kubelet.key", serving.key_pem),
                           ("ca.crt", self.cluster.ca_pem)):
            path = self._dir("pki", name)
            path.write_bytes(data)
            path.chmod(0o600)
        self.cluster.api("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": self._binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }, expect=(200, 201, 409))

    def _start_kubelet(self) -> None:
        make_cgroup_root()
        self.kubelet_port, healthz = free_port(), free_port()
        config = self._dir("config", "kubelet.yaml")
        self.pod_logs_dir.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump(kubelet_config(
            address=NODE_IP, port=self.kubelet_port, healthz_port=healthz, socket=self.containerd_socket,
            ca=self._dir("pki", "ca.crt"), cert=self._dir("pki", "kubelet.crt"), key=self._dir("pki", "kubelet.key"),
            pod_logs=self.pod_logs_dir), sort_keys=False))
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        assert self.cluster.binaries is not None
        component = self._launch("kubelet", [
            str(self.cluster.binaries["kubelet"]), f"--config={config}",
            f"--kubeconfig={self._dir('config', 'kubelet.kubeconfig')}",
            f"--root-dir={self.kubelet_root}", f"--cert-dir={self._dir('pki')}",
            f"--hostname-override={self.name}", f"--node-ip={NODE_IP}",
            *([f"--node-labels={labels}"] if labels else []), "--v=2",
        ])
        self._wait(component, lambda: http_get(f"http://127.0.0.1:{healthz}/healthz")[0] == 200, "kubelet healthz")

    def _wait_node_ready(self) -> None:
        kubelet = self.components["kubelet"]

        def ready() -> bool:
            if not kubelet.alive():
                raise RealNodeError(f"kubelet exited:\n{kubelet.log_tail()}")
            return bool(self.cluster._ready_node(self.name))

        try:
            self.cluster.wait_for(ready, f"node {self.name} Ready", timeout=self.ready_timeout, interval=0.2)
        except TimeoutError as exc:
            raise RealNodeError(f"{exc}\n{self.log_tails()}") from None

    # -- processes -----------------------------------------------------------------------------

    def _launch(self, name: str, argv: list[str]) -> Component:
        # dies with its parent like the control plane; what outlives a crash (containerd's shims,
        # the pods) is cleaned by the next holder of the lock, which finds the work directory
        component = Component(name, argv, self.log_path(name))
        self.components[name] = component
        component.start()
        return component

    def _wait(self, component: Component, probe: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while time.monotonic() < deadline:
            if not component.alive():
                raise RealNodeError(f"{component.name} exited during start-up:\n{component.log_tail()}")
            if probe():
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        raise RealNodeError(f"{what}: not after {timeout:.0f}s:\n{component.log_tail()}")
