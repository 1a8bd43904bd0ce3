"""A real Kubernetes control plane on loopback, for tests and for developers.

:class:`KubeCluster` starts, in a temporary directory and on free ports of 127.0.0.1:

- ``etcd``;
- ``kube-apiserver`` (TLS with a fresh CA, an admin kubeconfig, service-account signing keys,
  RBAC, the ``MutatingAdmissionWebhook`` admission plugin, the admission-registration and
  coordination APIs);
- ``kube-controller-manager`` when its binary is installed (namespaces are cleaned up, service
  accounts and Deployments work, the node lifecycle controller lifts the ``not-ready`` taint of
  new nodes once kwok reports them Ready; node IPAM is off);
- two ``kube-scheduler`` processes: ``default-scheduler`` as in any cluster, and the one HAMi
  deploys, whose only profile is ``hami-scheduler`` and which calls the extender described by
  :class:`ExtenderConfig` (the extender list of a ``KubeSchedulerConfiguration`` applies to
  every profile of a process, so a single process would route ``default-scheduler`` pods with
  GPU requests through the extender too);
- ``kwok``, playing the kubelet of every node annotated ``kwok.x-k8s.io/node: fake``, with
  kwok's "fast" stages: pods bound to such a node become Running at once, deleted pods go away.

Binaries come from :func:`bin_dir` (``scripts/install-kube.sh`` puts them there). Every process
runs in its own process group, dies with its parent (``PR_SET_PDEATHSIG``) and is stopped by
:meth:`KubeCluster.stop`, which is also registered with :mod:`atexit`. Component logs are kept
in ``<workdir>/logs``; :meth:`KubeCluster.log_tails` returns their ends for a failure report.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hami.dev.pki import CertificateAuthority, KeyPair, service_account_keys

KUBE_VERSION = "v1.34.4"  # keep equal to KUBE_VERSION in scripts/install-kube.sh
HAMI_SCHEDULER_NAME = "hami-scheduler"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kwok")
OPTIONAL_BINARIES = ("kube-controller-manager", "kubectl", "helm")
DEFAULT_MANAGED_RESOURCES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpucores",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/priority",
)
DEFAULT_NODE_ALLOCATABLE = {"cpu": "32", "memory": "256Gi", "pods": "110"}
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
_DURATION = re.compile(r"^\d+(\.\d+)?(ms|s|m|h)$")


class ClusterError(RuntimeError):
    """The control plane could not be started, reached or stopped."""


class MissingBinaries(ClusterError):
    """Some required binaries are not installed; ``missing`` names them."""

    def __init__(self, missing: list[str], directory: Path) -> None:
        self.missing = missing
        self.directory = directory
        super().__init__(
            f"Kubernetes binaries not installed: {', '.join(missing)} (looked in {directory}); "
            "run scripts/install-kube.sh (or `make kube`) to build them"
        )


class ApiError(ClusterError):
    """The API server answered with an unexpected HTTP status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        try:
            message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            message = body
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


# ---------------------------------------------------------------------------------------------
# Locations


def cache_dir() -> Path:
    """``$HAMI_CACHE``, else ``~/.cache/hami``."""
    return Path(os.environ.get("HAMI_CACHE") or Path.home() / ".cache" / "hami")


def bin_dir() -> Path:
    """Where the pinned binaries live: ``$HAMI_KUBE_BIN``, else ``<cache>/kube/<version>/bin``."""
    override = os.environ.get("HAMI_KUBE_BIN")
    return Path(override) if override else cache_dir() / "kube" / KUBE_VERSION / "bin"


def find_binaries(directory: Path | None = None) -> dict[str, Path]:
    """Paths of the installed binaries; raises :class:`MissingBinaries` if a required one is absent."""
    directory = directory or bin_dir()
    found = {
        name: directory / name
        for name in REQUIRED_BINARIES + OPTIONAL_BINARIES
        if os.access(directory / name, os.X_OK)
    }
    missing = [name for name in REQUIRED_BINARIES if name not in found]
    if missing:
        raise MissingBinaries(missing, directory)
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Scheduler configuration


@dataclass(frozen=True)
class ExtenderConfig:
    """One ``extenders`` entry of a ``KubeSchedulerConfiguration`` (HAMi's values by default).

    ``url_prefix`` is ``http://`` or ``https://host:port[/path]``; with ``https`` the scheduler
    trusts ``ca_pem`` if given, else the cluster CA, unless ``tls_insecure`` is set.
    """

    url_prefix: str
    filter_verb: str = "filter"
    bind_verb: str | None = "bind"
    prioritize_verb: str | None = None
    node_cache_capable: bool = True
    managed_resources: tuple[str, ...] = DEFAULT_MANAGED_RESOURCES
    ignored_by_scheduler: bool = True
    http_timeout: str = "30s"
    weight: int = 1
    ignorable: bool = False
    tls_insecure: bool = False
    ca_pem: bytes | None = None

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s]+", self.url_prefix):
            raise ValueError(f"extender url_prefix: expected http(s)://host:port, got {self.url_prefix!r}")
        if not _DURATION.match(self.http_timeout):
            raise ValueError(f"extender http_timeout: expected a duration like '30s', got {self.http_timeout!r}")
        if not self.filter_verb:
            raise ValueError(f"extender filter_verb: must not be empty, got {self.filter_verb!r}")
        bad = [name for name in self.managed_resources if not name or "/" not in name]
        if bad:
            raise ValueError(f"extender managed_resources: expected domain/name, got {bad!r}")

    @property
    def https(self) -> bool:
        return self.url_prefix.startswith("https://")

    def document(self, cluster_ca_pem: bytes | None = None) -> dict[str, Any]:
        """The ``extenders`` list entry, as kube-scheduler reads it."""
        doc: dict[str, Any] = {
            "urlPrefix": self.url_prefix,
            "filterVerb": self.filter_verb,
            "nodeCacheCapable": self.node_cache_capable,
            "weight": self.weight,
            "httpTimeout": self.http_timeout,
            "enableHTTPS": self.https,
            "ignorable": self.ignorable,
            "managedResources": [
                {"name": name, "ignoredByScheduler": self.ignored_by_scheduler}
                for name in self.managed_resources
            ],
        }
        if self.bind_verb:
            doc["bindVerb"] = self.bind_verb
        if self.prioritize_verb:
            doc["prioritizeVerb"] = self.prioritize_verb
        if self.https:
            ca = self.ca_pem or cluster_ca_pem
            doc["tlsConfig"] = (
                {"insecure": True} if self.tls_insecure or not ca else {"caData": base64.b64encode(ca).decode()}
            )
        return doc


@dataclass(frozen=True)
class SchedulerConfig:
    """How the HAMi kube-scheduler process runs: its profile name, extender, leader election."""

    scheduler_name: str = HAMI_SCHEDULER_NAME
    extender: ExtenderConfig | None = None
    leader_elect: bool = False
    lease_name: str = HAMI_SCHEDULER_NAME
    lease_namespace: str = "kube-system"
    #: ``clientConnection.qps``/``burst``; None keeps kube-scheduler's defaults (50/100), which
    #: cap its own API calls (one Binding per pod without an extender binder) at ~50 pods/s.
    client_qps: float | None = None
    client_burst: int | None = None

    def document(self, kubeconfig: Path, cluster_ca_pem: bytes | None = None) -> dict[str, Any]:
        """The ``KubeSchedulerConfiguration`` for this process."""
        connection: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
        if self.client_qps is not None:
            connection["qps"] = self.client_qps
        if self.client_burst is not None:
            connection["burst"] = self.client_burst
        doc: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": connection,
            "leaderElection": {
                "leaderElect": self.leader_elect,
                "resourceName": self.lease_name,
                "resourceNamespace": self.lease_namespace,
            },
            "profiles": [{"schedulerName": self.scheduler_name}],
        }
        if self.extender:
            doc["extenders"] = [self.extender.document(cluster_ca_pem)]
        return doc


DEFAULT_SCHEDULER = SchedulerConfig(scheduler_name="default-scheduler", lease_name="kube-scheduler")


def node_manifest(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    allocatable: dict[str, str | int] | None = None,
    gpus: int = 0,
    split_count: int = 10,
) -> dict[str, Any]:
    """A Node that kwok manages; ``nvidia.com/gpu`` = ``gpus × split_count`` when ``gpus`` > 0."""
    if gpus < 0 or split_count < 1:
        raise ValueError(f"node {name}: gpus must be >= 0 and split_count >= 1, got {gpus} and {split_count}")
    resources = {**DEFAULT_NODE_ALLOCATABLE, **(allocatable or {})}
    if gpus:
        resources["nvidia.com/gpu"] = gpus * split_count
    resources = {key: str(value) for key, value in resources.items()}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
            "annotations": {KWOK_ANNOTATION: "fake", **(annotations or {})},
        },
        "spec": {},
        "status": {"allocatable": resources, "capacity": dict(resources)},
    }


# ---------------------------------------------------------------------------------------------
# Processes

# Runs as the child's first program (a fresh interpreter, so no state inherited from a
# threaded parent): PR_SET_PDEATHSIG (1) = SIGKILL, give up if the parent is already gone,
# then exec the real program (the setting survives execve).
_TRAMPOLINE = (
    "import ctypes,os,sys;"
    "ctypes.CDLL(None,use_errno=True).prctl(1,9);"
    "os.getppid()==int(sys.argv[1]) or os._exit(1);"
    "os.execv(sys.argv[2],sys.argv[2:])"
)


def die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` wrapped so that the process is SIGKILLed when the calling *thread* ends.

    The setting is made after exec, in a fresh interpreter: setting it from a ``preexec_fn``
    (Python code between fork and exec) can crash or hang the child when the parent has other
    threads, which a test session always has. Linux only; elsewhere ``argv`` is returned as is.
    """
    if not sys.platform.startswith("linux") or not argv:
        return list(argv)
    program = shutil.which(argv[0]) or argv[0]
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(os.getpid()), program, *argv[1:]]


@dataclass
class Component:
    """One control-plane process and its log file."""

    name: str
    argv: list[str]
    log_path: Path
    die_with_parent: bool = True
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # PR_SET_PDEATHSIG fires when the *thread* that started the child ends: only use it from
        # the main thread (a worker thread of asyncio.to_thread would take the process with it).
        wrap = self.die_with_parent and threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                die_with_parent(self.argv) if wrap else self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the process group, then SIGKILL it if it is still there after ``timeout``."""
        process, self.process = self.process, None
        if process is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
            if process.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(wait)
        # Whatever it forked in its group goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _get(url: str, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        return 0, str(exc)


def _insecure_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


# ---------------------------------------------------------------------------------------------
# The cluster


@dataclass
class _Paths:
    root: Path

    def __post_init__(self) -> None:
        for sub in ("pki", "logs", "config", "etcd"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def pki(self, name: str) -> Path:
        return self.root / "pki" / name

    def log(self, component: str) -> Path:
        return self.root / "logs" / f"{component}.log"

    def config(self, name: str) -> Path:
        return self.root / "config" / name

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def components_kubeconfig(self) -> Path:
        return self.root / "components.kubeconfig"


@dataclass
class KubeCluster:
    """A control plane on 127.0.0.1 (see the module docstring); use as a context manager.

    ``workdir``: where certificates, configs, etcd data and logs go (a new temporary directory
    if ``None``; a temporary one is removed by :meth:`stop` unless ``keep_workdir``).
    ``hami_scheduler``: the initial configuration of the HAMi kube-scheduler process
    (:meth:`configure_hami_scheduler` changes it later).
    ``controller_manager``: run kube-controller-manager (``None``: when it is installed).
    """

    workdir: Path | None = None
    hami_scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    controller_manager: bool | None = None
    binaries: dict[str, Path] | None = None
    keep_workdir: bool = False
    start_timeout: float = START_TIMEOUT_S
    die_with_parent: bool = True

    components: dict[str, Component] = field(default_factory=dict, init=False)
    timings: dict[str, float] = field(default_factory=dict, init=False)
    startup_seconds: float = field(default=0.0, init=False)
    ports: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._temporary = self.workdir is None
        self._lock = threading.RLock()
        self._ca: CertificateAuthority | None = None
        self._admin: KeyPair | None = None
        self.component_token = ""  # bearer token of hami's components (components_kubeconfig)
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> KubeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> KubeCluster:
        """Start every component and wait until each is ready; on failure stop all and raise."""
        self.binaries = self.binaries or find_binaries()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="hami-kube-"))
        self.workdir = Path(self.workdir)
        self._paths = _Paths(self.workdir)
        atexit.register(self.stop)
        began = time.monotonic()
        try:
            self._timed("pki", self._write_pki)
            self._timed("etcd", self._start_etcd)
            self._timed("kube-apiserver", self._start_apiserver)
            self._start_after_apiserver()
        except BaseException:
            self.stop(keep_logs=True)
            raise
        self.startup_seconds = time.monotonic() - began
        self._started = True
        return self

    def stop(self, keep_logs: bool = False) -> None:
        """Stop every component (newest first); remove a temporary workdir unless logs are kept."""
        with self._lock:
            for component in reversed(list(self.components.values())):
                component.stop()
            self.components.clear()
            atexit.unregister(self.stop)
            if self._temporary and not (keep_logs or self.keep_workdir) and self.workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _timed(self, name: str, step: Callable[[], None]) -> None:
        began = time.monotonic()
        step()
        self.timings[name] = time.monotonic() - began

    def _start_after_apiserver(self) -> None:
        """Scheduler(s), controller manager and kwok start together; then wait for each."""
        waits: list[tuple[str, Callable[[], None]]] = []
        if self._want_controller_manager():
            waits.append(("kube-controller-manager", self._launch_controller_manager()))
        waits.append(("default-scheduler", self._launch_scheduler("default-scheduler", DEFAULT_SCHEDULER)))
        waits.append(("hami-scheduler", self._launch_scheduler("hami-scheduler", self.hami_scheduler)))
        waits.append(("kwok", self._launch_kwok()))
        began = time.monotonic()
        for name, wait in waits:
            wait()
            self.timings[name] = time.monotonic() - began

    def _want_controller_manager(self) -> bool:
        installed = "kube-controller-manager" in (self.binaries or {})
        if self.controller_manager and not installed:
            raise MissingBinaries(["kube-controller-manager"], bin_dir())
        return installed if self.controller_manager is None else self.controller_manager

    # -- components ----------------------------------------------------------------------------

    def _launch(self, name: str, argv: list[str]) -> Component:
        component = Component(name, argv, self._paths.log(name), die_with_parent=self.die_with_parent)
        self.components[name] = component
        component.start()
        return component

    def _wait_ready(self, component: Component, probe: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.start_timeout
        delay = 0.05
        while time.monotonic() < deadline:
            if not component.alive():
                raise ClusterError(f"{component.name} exited during start-up:\n{component.log_tail()}")
            if probe():
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        raise ClusterError(
            f"{component.name} not ready after {self.start_timeout:.0f}s:\n{component.log_tail()}"
        )

    def _bin(self, name: str) -> str:
        assert self.binaries is not None
        return str(self.binaries[name])

    def _write_pki(self) -> None:
        ca = CertificateAuthority()
        hosts = ("127.0.0.1", "localhost", "kubernetes", "kubernetes.default",
                 "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "10.96.0.1")
        files = {
            "ca": ca.pair,
            "apiserver": ca.issue("kube-apiserver", hosts=hosts),
            "admin": ca.issue("hami-admin", organization="system:masters", server=False, client=True),
            "sa": service_account_keys(),
        }
        for name, pair in files.items():
            self._paths.pki(f"{name}.crt").write_bytes(pair.cert_pem)
            key = self._paths.pki(f"{name}.key")
            key.write_bytes(pair.key_pem)
            key.chmod(0o600)
        self._ca, self._admin = ca, files["admin"]
        # hami's own components authenticate with a bearer token, as they do in a cluster (their
        # ServiceAccount token, checked through the API server's token cache), not with a client
        # certificate whose signature the API server would verify on every request
        import secrets

        self.component_token = secrets.token_hex(24)
        tokens = self._paths.pki("tokens.csv")
        tokens.write_text(f'{self.component_token},hami-components,hami-components,"system:masters"\n')
        tokens.chmod(0o600)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.ports["etcd"] = client
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        etcd = self._launch("etcd", [
            self._bin("etcd"), "--name=hami", f"--data-dir={self.workdir}/etcd",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=hami={peer_url}", "--unsafe-no-fsync", "--log-level=warn",
        ])
        self._wait_ready(etcd, lambda: '"health":"true"' in _get(f"{url}/health")[1])

    def _start_apiserver(self) -> None:
        port = self.ports["kube-apiserver"] = free_port()
        pki = self._paths.pki
        apiserver = self._launch("kube-apiserver", [
            self._bin("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.workdir}/pki",
            f"--tls-cert-file={pki('apiserver.crt')}", f"--tls-private-key-file={pki('apiserver.key')}",
            f"--client-ca-file={pki('ca.crt')}",
            f"--token-auth-file={pki('tokens.csv')}",
            # Filled in so that components reading extension-apiserver-authentication stay quiet.
            f"--requestheader-client-ca-file={pki('ca.crt')}", "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--service-account-key-file={pki('sa.crt')}",
            f"--service-account-signing-key-file={pki('sa.key')}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=RBAC",
            "--enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
            "--runtime-config=admissionregistration.k8s.io/v1=true,coordination.k8s.io/v1=true",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",  # 127.0.0.1 is not a valid endpoint for the kubernetes Service
            "--profiling=false",
            "--v=1",
        ])
        self._write_kubeconfig()
        self._wait_ready(apiserver, lambda: self._api_ok("/readyz"))

    def _write_kubeconfig(self) -> None:
        assert self._ca and self._admin
        b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "hami-dev", "cluster": {
                "server": self.server, "certificate-authority-data": b64(self._ca.pair.cert_pem)}}],
            "users": [{"name": "hami-admin", "user": {
                "client-certificate-data": b64(self._admin.cert_pem),
                "client-key-data": b64(self._admin.key_pem)}}],
            "contexts": [{"name": "hami-dev", "context": {"cluster": "hami-dev", "user": "hami-admin"}}],
            "current-context": "hami-dev",
        }
        self._paths.kubeconfig.write_text(yaml.safe_dump(doc))
        self._paths.kubeconfig.chmod(0o600)
        doc["users"] = [{"name": "hami-admin", "user": {"token": self.component_token}}]
        self._paths.components_kubeconfig.write_text(yaml.safe_dump(doc))
        self._paths.components_kubeconfig.chmod(0o600)

    def _delegation_flags(self, name: str) -> list[str]:
        kubeconfig = self._paths.kubeconfig
        port = self.ports[name] = free_port()
        return [
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
        ]

    def _healthy(self, name: str) -> Callable[[], bool]:
        url = f"https://127.0.0.1:{self.ports[name]}/healthz"
        return lambda: _get(url, _insecure_context())[0] == 200

    def _launch_controller_manager(self) -> Callable[[], None]:
        pki = self._paths.pki
        component = self._launch("kube-controller-manager", [
            self._bin("kube-controller-manager"),
            f"--kubeconfig={self._paths.kubeconfig}", *self._delegation_flags("kube-controller-manager"),
            "--leader-elect=false",
            f"--service-account-private-key-file={pki('sa.key')}", f"--root-ca-file={pki('ca.crt')}",
            f"--cluster-signing-cert-file={pki('ca.crt')}", f"--cluster-signing-key-file={pki('ca.key')}",
            "--use-service-account-credentials=false",
            "--controllers=*,-node-ipam-controller",
            "--v=1",
        ])
        return lambda: self._wait_ready(component, self._healthy("kube-controller-manager"))

    def _launch_scheduler(self, name: str, config: SchedulerConfig) -> Callable[[], None]:
        config_path = self._paths.config(f"{name}.yaml")
        ca = self._ca.pair.cert_pem if self._ca else None
        config_path.write_text(yaml.safe_dump(config.document(self._paths.kubeconfig, ca), sort_keys=False))
        component = self._launch(name, [
            self._bin("kube-scheduler"), f"--config={config_path}", *self._delegation_flags(name), "--v=2",
        ])
        return lambda: self._wait_ready(component, self._healthy(name))

    def _launch_kwok(self) -> Callable[[], None]:
        stages_dir = Path(self._bin("kwok")).parent.parent / "kwok-stages"
        stages = sorted(stages_dir.glob("*.yaml"))
        if not stages:
            raise MissingBinaries(["kwok-stages/*.yaml"], stages_dir)
        config = self._paths.config("kwok.yaml")
        config.write_text("\n---\n".join(path.read_text() for path in stages))
        port = self.ports["kwok"] = free_port()
        component = self._launch("kwok", [
            self._bin("kwok"), f"--kubeconfig={self._paths.kubeconfig}", f"--config={config}",
            "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            "--node-ip=127.0.0.1", f"--node-port={port}", f"--server-address=127.0.0.1:{port}",
            "--cidr=10.244.0.0/16", "--node-lease-duration-seconds=40",
        ])
        return lambda: self._wait_ready(component, lambda: _get(f"http://127.0.0.1:{port}/healthz")[0] == 200)

    # -- the HAMi scheduler --------------------------------------------------------------------

    def configure_hami_scheduler(
        self, config: SchedulerConfig | None = None, *, extender: ExtenderConfig | None = None
    ) -> SchedulerConfig:
        """(Re)start the HAMi kube-scheduler with ``config`` (or the current one with ``extender``).

        Does nothing when the configuration is unchanged. Returns the previous configuration.
        """
        with self._lock:
            previous = self.hami_scheduler
            wanted = config or SchedulerConfig(
                scheduler_name=previous.scheduler_name, extender=extender,
                leader_elect=previous.leader_elect, lease_name=previous.lease_name,
                lease_namespace=previous.lease_namespace,
            )
            if wanted == previous and "hami-scheduler" in self.components:
                return previous
            old = self.components.pop("hami-scheduler", None)
            if old:
                old.stop()
            self.hami_scheduler = wanted
            began = time.monotonic()
            self._launch_scheduler("hami-scheduler", wanted)()
            self.timings["hami-scheduler restart"] = time.monotonic() - began
            return previous

    # -- access --------------------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (user in group ``system:masters``)."""
        return self._paths.kubeconfig

    @property
    def components_kubeconfig(self) -> Path:
        """A kubeconfig for hami's own components: user ``hami-components`` (group
        ``system:masters``) with a bearer token, as a ServiceAccount token would be used."""
        return self._paths.components_kubeconfig

    def token_context(self) -> ssl.SSLContext:
        """TLS to the API server without a client certificate (send ``Authorization: Bearer
        <component_token>``; a client certificate would be checked first and win)."""
        return ssl.create_default_context(cadata=self.ca_pem.decode())

    @property
    def ca_pem(self) -> bytes:
        assert self._ca is not None, "cluster not started"
        return self._ca.pair.cert_pem

    @property
    def ca_bundle(self) -> str:
        """The CA certificate, base64-encoded, as webhook ``clientConfig.caBundle`` wants it."""
        return base64.b64encode(self.ca_pem).decode()

    def env(self) -> dict[str, str]:
        """``KUBECONFIG`` and a ``PATH`` that starts with the pinned binaries (kubectl, helm)."""
        assert self.binaries is not None
        directory = str(next(iter(self.binaries.values())).parent)
        return {"KUBECONFIG": str(self.kubeconfig), "PATH": f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"}

    def issue_server_cert(self, name: str = "test-server", hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> tuple[Path, Path]:
        """Write a serving certificate signed by the cluster CA; returns (cert path, key path)."""
        assert self._ca is not None, "cluster not started"
        pair = self._ca.issue(name, hosts=hosts)
        cert, key = self._paths.pki(f"{name}.crt"), self._paths.pki(f"{name}.key")
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        return cert, key

    def server_ssl_context(self, name: str = "test-server", hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> ssl.SSLContext:
        """An SSL context for a test HTTPS server (webhook, extender) the cluster trusts."""
        cert, key = self.issue_server_cert(name, hosts)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        return context

    def _client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        context.load_cert_chain(self._paths.pki("admin.crt"), self._paths.pki("admin.key"))
        return context

    def _api_ok(self, path: str) -> bool:
        return _get(self.server + path, self._client_context())[0] == 200

    def api(self, method: str, path: str, body: Any = None, *, expect: tuple[int, ...] = (200, 201, 202),
            content_type: str = "application/json", timeout: float = 30.0, as_user: str | None = None) -> Any:
        """One request to the API server as admin (or, with ``as_user``, impersonating that user,
        still in group ``system:masters`` so RBAC lets it through and only admission can say no);
        returns the decoded JSON or raises :class:`ApiError`."""
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.ports["kube-apiserver"], context=self._client_context(), timeout=timeout
        )
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json", "Content-Type": content_type}
            if as_user:
                headers.update({"Impersonate-User": as_user, "Impersonate-Group": "system:masters"})
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
        finally:
            connection.close()
        if response.status not in expect:
            raise ApiError(method, path, response.status, text)
        return json.loads(text) if text else None

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl (or the one on PATH) against this cluster."""
        binary = str((self.binaries or {}).get("kubectl") or shutil.which("kubectl") or "kubectl")
        result = subprocess.run(
            [binary, f"--kubeconfig={self.kubeconfig}", *args], input=input, text=True,
            capture_output=True, timeout=timeout, check=False,
        )
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def wait_for(self, probe: Callable[[], Any], what: str, timeout: float = 30.0, interval: float = 0.1) -> Any:
        """Poll ``probe`` until it returns something truthy (returned); raise ``TimeoutError`` naming ``what``."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = probe()
            except ApiError as exc:
                value, last_error = None, exc
            if value:
                return value
            time.sleep(interval)
        detail = f" (last error: {last_error})" if last_error else ""
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")

    # -- nodes and namespaces -------------------------------------------------------------------

    def create_node(self, name: str, *, labels: dict[str, str] | None = None,
                    annotations: dict[str, str] | None = None, allocatable: dict[str, str | int] | None = None,
                    gpus: int = 0, split_count: int = 10, wait_ready: bool = True) -> dict[str, Any]:
        """Create a kwok-managed Node (see :func:`node_manifest`) and wait until it is Ready."""
        manifest = node_manifest(name, labels=labels, annotations=annotations, allocatable=allocatable,
                                 gpus=gpus, split_count=split_count)
        self.api("POST", "/api/v1/nodes", manifest)
        self.api("PATCH", f"/api/v1/nodes/{name}/status", {"status": manifest["status"]},
                 content_type="application/merge-patch+json")
        if wait_ready:
            self.wait_for(lambda: self._ready_node(name), f"node {name} Ready")
            return self._untaint_not_ready(name)
        return self.api("GET", f"/api/v1/nodes/{name}")

    def _untaint_not_ready(self, name: str) -> dict[str, Any]:
        """Drop the ``node.kubernetes.io/not-ready`` taint that admission puts on new nodes: the
        node-lifecycle controller, which would remove it once the node is Ready, is off here."""
        node = self.api("GET", f"/api/v1/nodes/{name}")
        taints = node.get("spec", {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != "node.kubernetes.io/not-ready"]
        if kept == taints:
            return node
        return self.api("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": kept or None}},
                        content_type="application/merge-patch+json")

    def _ready_node(self, name: str) -> dict[str, Any] | None:
        """The node once Ready and free of the ``not-ready`` taint that admission puts on new nodes.

        The node lifecycle controller lifts that taint; without a controller manager, we do.
        """
        node = self.api("GET", f"/api/v1/nodes/{name}")
        conditions = node.get("status", {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return None
        taints = node["spec"].get("taints") or []
        kept = [t for t in taints if t.get("key") != "node.kubernetes.io/not-ready"]
        if len(kept) == len(taints):
            return node
        if "kube-controller-manager" not in self.components:
            self.api("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": kept or None}},
                     content_type="application/merge-patch+json")
        return None

    def delete_node(self, name: str) -> None:
        self.api("DELETE", f"/api/v1/nodes/{name}", expect=(200, 202, 404))

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Create a namespace and its ``default`` service account (needed to admit pods)."""
        namespace = self.api("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}})
        self.api("POST", f"/api/v1/namespaces/{name}/serviceaccounts",
                 {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
                 expect=(200, 201, 409))
        return namespace

    def delete_namespace(self, name: str) -> None:
        self.api("DELETE", f"/api/v1/namespaces/{name}", expect=(200, 202, 404))

    # -- logs ----------------------------------------------------------------------------------

    def log_path(self, component: str) -> Path:
        return self._paths.log(component)

    def logs(self, component: str) -> str:
        """The whole log of one component (``etcd``, ``kube-apiserver``, ``hami-scheduler``, ...)."""
        path = self._paths.log(component)
        return path.read_text(errors="replace") if path.exists() else ""

    def log_tails(self, lines: int = 40) -> str:
        """The last ``lines`` of every component's log, each under a header."""
        parts = []
        for path in sorted((self._paths.root / "logs").glob("*.log")):
            tail = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            parts.append(f"===== {path.stem} ({path}) =====\n{tail}")
        return "\n".join(parts)

    def describe_startup(self) -> str:
        parts = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in self.timings.items())
        return f"Kubernetes {KUBE_VERSION} control plane started in {self.startup_seconds:.1f}s ({parts})"


@contextlib.contextmanager
def running_cluster(**kwargs: Any) -> Iterator[KubeCluster]:
    """``with running_cluster() as cluster:`` — start a :class:`KubeCluster`, always stop it."""
    cluster = KubeCluster(**kwargs)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
