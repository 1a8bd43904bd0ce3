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

Binaries come from :func:`hami_devkit.binaries.bin_dir` (``scripts/install-kube.sh`` puts them there). Every process
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
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hami_devkit import audit, kwok
from hami_devkit.binaries import KUBE_VERSION, MissingBinaries, bin_dir, find_binaries
from hami_devkit.errors import ApiError, ClusterError
from hami_devkit.kwok import node_manifest
from hami_devkit.pki import CertificateAuthority, KeyPair, service_account_keys
from hami_devkit.process import STOP_TIMEOUT_S, Component, free_port, http_get, insecure_context
from hami_devkit.schedconfig import DEFAULT_SCHEDULER, ExtenderConfig, SchedulerConfig

START_TIMEOUT_S = 90.0


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


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
    (:meth:`configure_hami_scheduler` changes it later); ``None``: no such process (the chart
    installed on a real node brings its own).
    ``apiserver_bind_address``: where kube-apiserver listens (clients always use 127.0.0.1);
    ``0.0.0.0`` lets the pods of a real node reach it at the node's address, through the
    ``kubernetes`` Service (:mod:`hami_devkit.kubeproxy`).
    ``controller_manager``: run kube-controller-manager (``None``: when it is installed).
    ``feature_gates``: ``--feature-gates`` of kube-apiserver, kube-scheduler and
    kube-controller-manager (e.g. the DRA gates that are off by default in v1.34).
    ``extra_args``: more flags per component (``{"kube-controller-manager": ["--kube-api-qps=500"]}``).
    ``audit``: kube-apiserver writes an audit log (:mod:`hami_devkit.audit`) to :attr:`audit_log`,
    one line per request naming its client (for benches that attribute requests).
    """

    workdir: Path | None = None
    hami_scheduler: SchedulerConfig | None = field(default_factory=SchedulerConfig)
    apiserver_bind_address: str = "127.0.0.1"
    controller_manager: bool | None = None
    feature_gates: dict[str, bool] = field(default_factory=dict)
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    audit: bool = False
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

    def restart(self, name: str, *, down_for: float = 0.0, kill: bool = True) -> float:
        """Stop the component ``name`` (SIGKILL of its process group when ``kill``, else SIGTERM
        first), keep it down for ``down_for`` seconds, start it again with the same arguments
        (same port, same data directory) and wait until the API server answers ``/readyz``
        again. Returns the seconds the API was unavailable from the stop until ready (for
        ``etcd`` and ``kube-apiserver``; other components: until the process runs). For chaos
        tests: kube-apiserver or etcd restarting under load."""
        with self._lock:
            component = self.components.get(name)
            if component is None:
                raise ClusterError(f"no component {name!r} (have: {', '.join(self.components)})")
            began = time.monotonic()
            if kill and component.process is not None and component.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(component.process.pid, signal.SIGKILL)
                component.process.wait(STOP_TIMEOUT_S)
            component.stop()
            time.sleep(down_for)
            component.start()
            if name in ("etcd", "kube-apiserver"):
                self._wait_ready(component, lambda: self._api_ok("/readyz"))
            return time.monotonic() - began

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
        if self.hami_scheduler is not None:
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
        raise ClusterError(f"{component.name} not ready after {self.start_timeout:.0f}s:\n{component.log_tail()}")

    def _bin(self, name: str) -> str:
        assert self.binaries is not None
        return str(self.binaries[name])

    def _write_pki(self) -> None:
        ca = CertificateAuthority()
        hosts = (
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.96.0.1",
        )
        files = {
            "ca": ca.pair,
            "apiserver": ca.issue("kube-apiserver", hosts=hosts),
            "admin": ca.issue("hami-admin", organization="system:masters", server=False, client=True),
            # the API server's identity towards kubelets (logs, exec, port-forward on a real node)
            "kubelet-client": ca.issue(
                "kube-apiserver-kubelet-client", organization="system:masters", server=False, client=True
            ),
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
        self.component_token = secrets.token_hex(24)
        tokens = self._paths.pki("tokens.csv")
        tokens.write_text(f'{self.component_token},hami-components,hami-components,"system:masters"\n')
        tokens.chmod(0o600)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.ports["etcd"] = client
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        etcd = self._launch(
            "etcd",
            [
                self._bin("etcd"),
                "--name=hami",
                f"--data-dir={self.workdir}/etcd",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=hami={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait_ready(etcd, lambda: '"health":"true"' in http_get(f"{url}/health")[1])

    def _start_apiserver(self) -> None:
        port = self.ports["kube-apiserver"] = free_port()
        pki = self._paths.pki
        apiserver = self._launch(
            "kube-apiserver",
            [
                self._bin("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                f"--bind-address={self.apiserver_bind_address}",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir}/pki",
                f"--tls-cert-file={pki('apiserver.crt')}",
                f"--tls-private-key-file={pki('apiserver.key')}",
                f"--client-ca-file={pki('ca.crt')}",
                f"--token-auth-file={pki('tokens.csv')}",
                # Filled in so that components reading extension-apiserver-authentication stay quiet.
                f"--requestheader-client-ca-file={pki('ca.crt')}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--service-account-key-file={pki('sa.crt')}",
                f"--service-account-signing-key-file={pki('sa.key')}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/16",
                # to kubelets (the real node's; kwok's fake ones are never called): the node's
                # InternalIP (127.0.0.1, its name does not resolve), TLS both ways with the cluster CA
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--kubelet-client-certificate={pki('kubelet-client.crt')}",
                f"--kubelet-client-key={pki('kubelet-client.key')}",
                f"--kubelet-certificate-authority={pki('ca.crt')}",
                "--authorization-mode=RBAC",
                "--enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
                "--runtime-config=admissionregistration.k8s.io/v1=true,coordination.k8s.io/v1=true",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",  # 127.0.0.1 is not a valid endpoint for the kubernetes Service
                "--profiling=false",
                *self._gate_flags(),
                *(audit.apiserver_flags(self._paths.config("audit-policy.yaml"), self.audit_log) if self.audit else ()),
                *self.extra_args.get("kube-apiserver", ()),
                "--v=1",
            ],
        )
        self._write_kubeconfig()
        self._wait_ready(apiserver, lambda: self._api_ok("/readyz"))

    @property
    def audit_log(self) -> Path:
        """Where kube-apiserver writes its audit log when ``audit`` is on."""
        assert self.workdir is not None
        return Path(self.workdir) / "logs" / "audit.log"

    def _write_kubeconfig(self) -> None:
        assert self._admin
        self.write_kubeconfig(
            self._paths.kubeconfig,
            user={"client-certificate-data": _b64(self._admin.cert_pem), "client-key-data": _b64(self._admin.key_pem)},
        )
        self.write_kubeconfig(self._paths.components_kubeconfig, user={"token": self.component_token})

    def write_kubeconfig(self, path: Path, *, user: dict[str, str] | None = None, pair: KeyPair | None = None) -> Path:
        """Write a kubeconfig for this cluster (trusting its CA, mode 0600) whose user is ``user``
        (a kubeconfig ``user`` mapping) or the client certificate ``pair``."""
        assert self._ca is not None, "cluster not started"
        if pair is not None:
            user = {"client-certificate-data": _b64(pair.cert_pem), "client-key-data": _b64(pair.key_pem)}
        if not user:
            raise ValueError("write_kubeconfig: give user= or pair=")
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "hami-dev",
                    "cluster": {"server": self.server, "certificate-authority-data": _b64(self._ca.pair.cert_pem)},
                }
            ],
            "users": [{"name": "hami-user", "user": user}],
            "contexts": [{"name": "hami-dev", "context": {"cluster": "hami-dev", "user": "hami-user"}}],
            "current-context": "hami-dev",
        }
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def _delegation_flags(self, name: str) -> list[str]:
        kubeconfig = self._paths.kubeconfig
        port = self.ports[name] = free_port()
        return [
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
        ]

    def _gate_flags(self) -> list[str]:
        if not self.feature_gates:
            return []
        gates = ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(self.feature_gates.items()))
        return [f"--feature-gates={gates}"]

    def _healthy(self, name: str) -> Callable[[], bool]:
        url = f"https://127.0.0.1:{self.ports[name]}/healthz"
        return lambda: http_get(url, insecure_context())[0] == 200

    def _launch_controller_manager(self) -> Callable[[], None]:
        pki = self._paths.pki
        component = self._launch(
            "kube-controller-manager",
            [
                self._bin("kube-controller-manager"),
                f"--kubeconfig={self._paths.kubeconfig}",
                *self._delegation_flags("kube-controller-manager"),
                "--leader-elect=false",
                f"--service-account-private-key-file={pki('sa.key')}",
                f"--root-ca-file={pki('ca.crt')}",
                f"--cluster-signing-cert-file={pki('ca.crt')}",
                f"--cluster-signing-key-file={pki('ca.key')}",
                "--use-service-account-credentials=false",
                "--controllers=*,-node-ipam-controller",
                *self._gate_flags(),
                *self.extra_args.get("kube-controller-manager", ()),
                "--v=1",
            ],
        )
        return lambda: self._wait_ready(component, self._healthy("kube-controller-manager"))

    def _launch_scheduler(self, name: str, config: SchedulerConfig) -> Callable[[], None]:
        config_path = self._paths.config(f"{name}.yaml")
        ca = self._ca.pair.cert_pem if self._ca else None
        config_path.write_text(yaml.safe_dump(config.document(self._paths.kubeconfig, ca), sort_keys=False))
        component = self._launch(
            name,
            [
                self._bin("kube-scheduler"),
                f"--config={config_path}",
                *self._delegation_flags(name),
                *self._gate_flags(),
                "--v=2",
            ],
        )
        return lambda: self._wait_ready(component, self._healthy(name))

    def _launch_kwok(self) -> Callable[[], None]:
        stages_dir = Path(self._bin("kwok")).parent.parent / "kwok-stages"
        config = kwok.write_config(stages_dir, self._paths.config("kwok.yaml"))
        port = self.ports["kwok"] = free_port()
        component = self._launch(
            "kwok", kwok.argv(self._bin("kwok"), kubeconfig=self._paths.kubeconfig, config=config, port=port)
        )
        return lambda: self._wait_ready(component, lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200)

    # -- the HAMi scheduler --------------------------------------------------------------------

    def configure_hami_scheduler(
        self, config: SchedulerConfig | None = None, *, extender: ExtenderConfig | None = None
    ) -> SchedulerConfig:
        """(Re)start the HAMi kube-scheduler with ``config`` (or the current one with ``extender``).

        Does nothing when the configuration is unchanged. Returns the previous configuration.
        """
        with self._lock:
            previous = self.hami_scheduler
            if previous is None and config is None:
                raise ClusterError("configure_hami_scheduler: this cluster runs no HAMi kube-scheduler; give a config")
            previous = previous or SchedulerConfig()
            wanted = config or SchedulerConfig(
                scheduler_name=previous.scheduler_name,
                extender=extender,
                leader_elect=previous.leader_elect,
                lease_name=previous.lease_name,
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

    def issue_server_cert(
        self, name: str = "test-server", hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    ) -> tuple[Path, Path]:
        """Write a serving certificate signed by the cluster CA; returns (cert path, key path)."""
        assert self._ca is not None, "cluster not started"
        pair = self._ca.issue(name, hosts=hosts)
        cert, key = self._paths.pki(f"{name}.crt"), self._paths.pki(f"{name}.key")
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        return cert, key

    def issue_client_cert(self, common_name: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate signed by the cluster CA: user ``common_name`` in ``groups``
        (one group: the certificate's organization; kube-apiserver reads each O as a group)."""
        assert self._ca is not None, "cluster not started"
        if len(groups) > 1:
            raise ValueError(f"issue_client_cert groups: at most one group is supported, got {list(groups)!r}")
        return self._ca.issue(common_name, organization=groups[0] if groups else None, server=False, client=True)

    def issue_serving_pair(self, name: str, hosts: tuple[str, ...]) -> KeyPair:
        """A serving certificate (and key) for ``hosts`` signed by the cluster CA, not written."""
        assert self._ca is not None, "cluster not started"
        return self._ca.issue(name, hosts=hosts)

    def server_ssl_context(
        self, name: str = "test-server", hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    ) -> ssl.SSLContext:
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
        return http_get(self.server + path, self._client_context())[0] == 200

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        expect: tuple[int, ...] = (200, 201, 202),
        content_type: str = "application/json",
        timeout: float = 30.0,
        as_user: str | None = None,
        as_groups: tuple[str, ...] = ("system:masters",),
    ) -> Any:
        """One request to the API server as admin (or, with ``as_user``, impersonating that user,
        by default in group ``system:masters`` so RBAC lets it through and only admission can say
        no; ``as_groups`` for others); returns the decoded JSON or raises :class:`ApiError`."""
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.ports["kube-apiserver"], context=self._client_context(), timeout=timeout
        )
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json", "Content-Type": content_type}
            if as_user:
                headers["Impersonate-User"] = as_user
            connection.putrequest(method, path)
            for key, value in headers.items():
                connection.putheader(key, value)
            for group in as_groups if as_user else ():
                connection.putheader("Impersonate-Group", group)  # one header per group
            if payload is not None:
                connection.putheader("Content-Length", str(len(payload)))
            connection.endheaders(payload)
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
        finally:
            connection.close()
        if response.status not in expect:
            raise ApiError(method, path, response.status, text)
        return json.loads(text) if text else None

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl (or the one on PATH) against this cluster."""
        binary = str((self.binaries or {}).get("kubectl") or shutil.which("kubectl") or "kubectl")
        result = subprocess.run(
            [binary, f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
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

    def create_node(
        self,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        allocatable: dict[str, str | int] | None = None,
        gpus: int = 0,
        split_count: int = 10,
        wait_ready: bool = True,
    ) -> dict[str, Any]:
        """Create a kwok-managed Node (see :func:`node_manifest`) and wait until it is Ready."""
        manifest = node_manifest(
            name, labels=labels, annotations=annotations, allocatable=allocatable, gpus=gpus, split_count=split_count
        )
        self.api("POST", "/api/v1/nodes", manifest)
        self.api(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {"status": manifest["status"]},
            content_type="application/merge-patch+json",
        )
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
        return self.api(
            "PATCH",
            f"/api/v1/nodes/{name}",
            {"spec": {"taints": kept or None}},
            content_type="application/merge-patch+json",
        )

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
            self.api(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"spec": {"taints": kept or None}},
                content_type="application/merge-patch+json",
            )
        return None

    def delete_node(self, name: str) -> None:
        self.api("DELETE", f"/api/v1/nodes/{name}", expect=(200, 202, 404))

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Create a namespace and its ``default`` service account (needed to admit pods)."""
        namespace = self.api(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}},
        )
        self.api(
            "POST",
            f"/api/v1/namespaces/{name}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
            expect=(200, 201, 409),
        )
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
