"""One real Kubernetes node beside the fake ones: kubelet + containerd + runc + a CNI bridge.

:class:`RealNode` joins a running :class:`~hami_devkit.controlplane.KubeCluster` as a node that
really runs pods. Everything it owns lives under one work directory:

==========================  ===============================================================
``containerd/``             containerd's root and state, run privately (no system
                            containerd is touched); its socket is
                            ``/run/hami-real-node/containerd.sock``
                            (:attr:`RealNode.containerd_socket`: a socket path must be short)
``cdi/``                    the CDI specs containerd reads (:attr:`RealNode.cdi_dir`): a DRA
                            driver on the node writes its prepared devices there
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

Facts this rests on (``shared/reference/real-node.md``): containerd + Debian's runc + CNI
plugins run pods here (containerd 1.7, built from Go modules by ``scripts/install-kube.sh``, with
CDI on: Debian 12's 1.6 has no CDI, which the DRA front end needs); the kubelet at the pinned version needs ``failCgroupV1: false`` on this
hybrid cgroup v1 host; without ``CAP_SYS_RESOURCE`` sandboxes fail unless containerd's CRI
option ``restrict_oom_score_adj`` is on (so it is turned on only then); there is no registry,
so the pause image (containerd's ``sandbox_image``) and every test image are imported from OCI
archives (:meth:`RealNode.import_image`, archives from :mod:`hami_devkit.images`).

The host side (the lock, the bridge, cgroups, mounts, clean-up) is :mod:`hami_devkit.nodehost`;
the configuration documents are :mod:`hami_devkit.nodeconfig`.

Pods reach the API server at the ``kubernetes`` Service address through the node's kube-proxy
(:class:`~hami_devkit.kubeproxy.KubeProxy`, started and stopped with the node), so the control
plane must listen beyond loopback (``KubeCluster(apiserver_bind_address="0.0.0.0")``); the node
then drops connections to that port from anywhere but this machine and its pods
(:func:`~hami_devkit.nodehost.guard_api_server`).
The API server reaches the kubelet for ``kubectl logs``/``exec`` at the node's InternalIP
(:data:`NODE_IP`, the bridge's gateway address), over TLS with the cluster CA both ways; the kubelet authenticates to the API
server as ``system:node:<name>`` (group ``system:nodes``), bound to the ``system:node`` role.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hami_devkit.controlplane import KubeCluster
from hami_devkit.errors import RealNodeBusy, RealNodeError, RealNodeUnavailable
from hami_devkit.nodeconfig import cni_config, containerd_config, kubelet_config
from hami_devkit.nodehost import (
    API_SERVICE_IP,
    BRIDGE,
    CGROUP_FS,
    CGROUP_ROOT,
    CONTAINERD_SOCKET,
    DEVICE_PLUGINS_DIR,
    KUBELET_CHAINS,
    LOCK_PATH,
    NODE_IP,
    POD_SUBNET,
    RUN_DIR,
    MachineLock,
    alive,
    clean_host,
    kubelet_chains,
    links_of,
    make_bridge,
    make_cgroup_root,
    mounts_under,
    pod_cgroups,
    processes_mentioning,
    guard_api_server,
    shim_sockets,
)
from hami_devkit.process import Component, free_port, http_get

__all__ = [  # the node, and the host pieces callers and tests use through this module
    "RealNode",
    "RealNodeError",
    "RealNodeUnavailable",
    "RealNodeBusy",
    "MachineLock",
    "missing_requirements",
    "has_capability",
    "cni_bin_dir",
    "containerd_config",
    "cni_config",
    "kubelet_config",
    "clean_host",
    "mounts_under",
    "pod_cgroups",
    "links_of",
    "kubelet_chains",
    "shim_sockets",
    "processes_mentioning",
    "alive",
    "API_SERVICE_IP",
    "BRIDGE",
    "CGROUP_FS",
    "CGROUP_ROOT",
    "CONTAINERD_SOCKET",
    "DEVICE_PLUGINS_DIR",
    "KUBELET_CHAINS",
    "LOCK_PATH",
    "NODE_IP",
    "NODE_NAME",
    "POD_SUBNET",
    "RUN_DIR",
]

NODE_NAME = "hami-real-node"
CNI_BIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
CNI_PLUGINS = ("bridge", "host-local", "loopback")
HOST_PROGRAMS = ("runc", "ip", "iptables")
#: built by scripts/install-kube.sh (containerd 1.7, with CDI) and found with the Kubernetes binaries
RUNTIME_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
READY_TIMEOUT_S = 120.0
CAP_SYS_RESOURCE = 24
_TEMP_PREFIX = "hami-real-node-"
_MAX_SOCKET_PATH = 104
K8S_NAMESPACE = "k8s.io"  # containerd namespace of the CRI plugin


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
    for name in ("kubelet", *RUNTIME_BINARIES):
        if name not in binaries:
            missing.append(f"{name} (run scripts/install-kube.sh or `make kube`)")
    programs = [name for name in HOST_PROGRAMS if shutil.which(name) is None]
    if programs:
        missing.append(f"{', '.join(programs)} (run scripts/install-node.sh or `make node`)")
    if cni_bin_dir() is None:
        missing.append(
            f"CNI plugins {', '.join(CNI_PLUGINS)} in {' or '.join(map(str, CNI_BIN_DIRS))} "
            "(run scripts/install-node.sh)"
        )
    if not (CGROUP_FS / "memory").is_dir() and not (CGROUP_FS / "cgroup.controllers").exists():
        missing.append(f"cgroups mounted at {CGROUP_FS}")
    return missing


# ---------------------------------------------------------------------------------------------
# The node


@dataclass
class RealNode:
    """A kubelet + containerd node named ``name`` joined to ``cluster``; see the module docstring.

    ``images``: OCI archives (paths) imported into containerd before the kubelet starts; the
    pause image is always imported (``pause_image``: an :class:`hami_devkit.images.ImageArchive`;
    ``None``: built by :func:`hami_devkit.images.build_pause_image`).
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
    #: run kube-proxy (:class:`~hami_devkit.kubeproxy.KubeProxy`): Services, the ``kubernetes`` one
    #: included, work for the node's pods
    kube_proxy: bool = True
    ready_timeout: float = READY_TIMEOUT_S

    components: dict[str, Component] = field(default_factory=dict, init=False)
    proxy: Any = field(default=None, init=False)
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
    def cdi_dir(self) -> Path:
        """Where containerd reads CDI specs (``enable_cdi``): a DRA driver on this node writes here."""
        return self._dir("cdi")

    @property
    def nri_socket(self) -> Path:
        """containerd's NRI socket (NRI enabled, external plugins only): what the device plugin's
        ``--injection=nri`` dials on this node, in place of the host's ``/var/run/nri/nri.sock``."""
        return self._dir("nri", "nri.sock")

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
        return "\n".join(
            f"===== {name} ({c.log_path}) =====\n{c.log_tail(lines)}" for name, c in self.components.items()
        )

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
                self._timed(
                    "clean previous",
                    lambda: self._clean_previous(
                        Path(previous["workdir"]), previous.get("device_plugins_dir_existed", True)
                    ),
                )
            if self.workdir is None:
                self.workdir = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX))
            elif Path(self.workdir).exists():  # a given directory is emptied (after un-mounting)
                clean_host(Path(self.workdir))
                shutil.rmtree(self.workdir)
            self.workdir = Path(self.workdir)
            if len(str(self.kubelet_root / "pod-resources" / "12345678")) > _MAX_SOCKET_PATH:
                raise RealNodeError(
                    f"workdir {str(self.workdir)!r}: too long; the kubelet makes unix sockets "
                    f"under it whose paths must stay under {_MAX_SOCKET_PATH} bytes"
                )
            # whether the device-plugin directory was there before any real node: a dead
            # holder's record knows, else look now
            self._device_plugin_dir_existed = previous.get("device_plugins_dir_existed", DEVICE_PLUGINS_DIR.is_dir())
            self._lock.record(
                workdir=str(self.workdir), node=self.name, device_plugins_dir_existed=self._device_plugin_dir_existed
            )
            atexit.register(self.stop)
            for sub in ("containerd", "cdi", "cni/net.d", "cni/ipam", "kubelet", "pki", "config", "logs"):
                self._dir(*sub.split("/")).mkdir(parents=True, exist_ok=True)
            RUN_DIR.mkdir(parents=True, exist_ok=True)
            self._device_plugin_entries = (
                {p.name for p in DEVICE_PLUGINS_DIR.iterdir()} if DEVICE_PLUGINS_DIR.is_dir() else set()
            )
            pause = self._timed("pause image", self._pause_image)
            self._timed("bridge", make_bridge)
            if self.cluster.apiserver_bind_address != "127.0.0.1":
                self._timed("api server guard", lambda: guard_api_server(self.cluster.ports["kube-apiserver"]))
            self._timed("containerd", lambda: self._start_containerd(pause.ref))
            self._timed("images", lambda: [self.import_image(path) for path in [pause.path, *self.images]])
            self._timed("credentials", self._write_credentials)
            self._timed("kubelet", self._start_kubelet)
            self._timed("node Ready", self._wait_node_ready)
            if self.kube_proxy:
                from hami_devkit.kubeproxy import KubeProxy

                self.proxy = self._timed("kube-proxy", lambda: KubeProxy(self.cluster, self).start())
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
        proxy, self.proxy = self.proxy, None
        if proxy is not None:
            problems += attempt("stop kube-proxy", proxy.stop) or []
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
            problems += (
                attempt(
                    "clean host",
                    lambda: clean_host(
                        self.workdir,
                        device_plugin_entries=self._device_plugin_entries,
                        device_plugin_dir_existed=self._device_plugin_dir_existed,
                    ),
                )
                or []
            )
        attempt("delete Node", lambda: self.cluster.delete_node(self.name))
        attempt(
            "delete ClusterRoleBinding",
            lambda: self.cluster.api(
                "DELETE",
                f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{self._binding}",
                expect=(200, 202, 404),
            ),
        )
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
        from hami_devkit.images import build_pause_image

        return build_pause_image()

    def _start_containerd(self, sandbox_image: str) -> None:
        restrict = not has_capability(CAP_SYS_RESOURCE)
        config = self._dir("config", "containerd.toml")
        cni_bin = cni_bin_dir()
        assert cni_bin is not None
        config.write_text(
            containerd_config(
                self._dir("containerd"),
                socket=self.containerd_socket,
                sandbox_image=sandbox_image,
                cni_bin=cni_bin,
                restrict_oom_score_adj=restrict,
                cdi_dir=self.cdi_dir,
                nri_socket=self.nri_socket,
            )
        )
        (self._dir("cni", "net.d") / "10-hami-bridge.conflist").write_text(
            json.dumps(cni_config(self._dir("cni", "ipam")), indent=2)
        )
        binary = self._runtime_binary("containerd")
        # the shim is looked up on PATH: this containerd's own, not a system one of another version
        env = {**os.environ, "PATH": f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        component = self._launch("containerd", [str(binary), f"--config={config}", "--log-level=info"], env=env)
        self._wait(component, lambda: self.ctr("version", check=False).returncode == 0, "containerd answering")

    def ctr(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this node's containerd, in the CRI namespace ``k8s.io``."""
        result = subprocess.run(
            [str(self._runtime_binary("ctr")), f"--address={self.containerd_socket}", "-n", K8S_NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
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
        serving = self.cluster.issue_serving_pair(
            f"kubelet-{self.name}", hosts=(NODE_IP, "127.0.0.1", "localhost", self.name)
        )
        for name, data in (
            ("kubelet.crt", serving.cert_pem),
            ("kubelet.key", serving.key_pem),
            ("ca.crt", self.cluster.ca_pem),
        ):
            path = self._dir("pki", name)
            path.write_bytes(data)
            path.chmod(0o600)
        self.cluster.api(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": self._binding},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            },
            expect=(200, 201, 409),
        )

    def _start_kubelet(self) -> None:
        make_cgroup_root()
        self.kubelet_port, healthz = free_port(), free_port()
        config = self._dir("config", "kubelet.yaml")
        self.pod_logs_dir.mkdir(parents=True, exist_ok=True)
        config.write_text(
            yaml.safe_dump(
                kubelet_config(
                    address=NODE_IP,
                    port=self.kubelet_port,
                    healthz_port=healthz,
                    socket=self.containerd_socket,
                    ca=self._dir("pki", "ca.crt"),
                    cert=self._dir("pki", "kubelet.crt"),
                    key=self._dir("pki", "kubelet.key"),
                    pod_logs=self.pod_logs_dir,
                ),
                sort_keys=False,
            )
        )
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        assert self.cluster.binaries is not None
        component = self._launch(
            "kubelet",
            [
                str(self.cluster.binaries["kubelet"]),
                f"--config={config}",
                f"--kubeconfig={self._dir('config', 'kubelet.kubeconfig')}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={self._dir('pki')}",
                f"--hostname-override={self.name}",
                f"--node-ip={NODE_IP}",
                *([f"--node-labels={labels}"] if labels else []),
                "--v=2",
            ],
        )
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

    def _runtime_binary(self, name: str) -> Path:
        path = (self.cluster.binaries or {}).get(name)
        if path is None:
            raise RealNodeUnavailable([f"{name} (run scripts/install-kube.sh or `make kube`)"])
        return Path(path)

    def _launch(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Component:
        # dies with its parent like the control plane; what outlives a crash (containerd's shims,
        # the pods) is cleaned by the next holder of the lock, which finds the work directory
        component = Component(name, argv, self.log_path(name), env=env)
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
