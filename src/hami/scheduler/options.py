"""Scheduler flags (HAMi's names, reference §7.3) and their validation.

Every bad value stops the start with one line naming the flag (or the device-config.yaml key)
and the value; see :func:`options_from_args`.
"""

from __future__ import annotations

import argparse
import os
import posixpath
import re
import socket
import ssl
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hami.config import DeviceConfig, default_device_config, flag_bool as _bool, read_device_config_file
from hami.core import SchedulerConfig
from hami.core.errors import ConfigError, CoreError
from hami.core.names import ALLOW_DISABLE_CONTROL, VGPU_NODE
from hami.kube.client import POOL
from hami.vendors import build_vendors

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|h|m|s))+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
DISABLE_CONTROL_LABEL = ALLOW_DISABLE_CONTROL


def parse_duration(text: str, flag: str) -> float:
    """Go-style duration (``5m``, ``28s``, ``1m30s``, ``250ms``) -> seconds; ``0`` is allowed."""
    value = str(text).strip()
    if value == "0":
        return 0.0
    if not _DURATION.match(value):
        raise ConfigError(f"{flag}: expected a duration like 5m, 28s or 250ms, got {text!r}")
    return sum(float(n) * _UNIT[u] for n, u in _PART.findall(value))


def parse_selector(text: str, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in (text or "").split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{flag}: expected k=v[,k=v...], got {text!r}")
        out[key.strip()] = value.strip()
    return out


def _absolute(text: str, flag: str) -> str:
    """An absolute path, cleaned (``/usr/local/`` -> ``/usr/local``)."""
    if not str(text).startswith("/"):
        raise ConfigError(f"{flag}: expected an absolute path, got {text!r}")
    return posixpath.normpath(str(text))


LOOPBACK = frozenset({"127.0.0.1", "::1", "[::1]", "localhost"})
DECISION_WRITES = ("binding", "filter")
EVENT_LOOPS = ("uvloop", "asyncio")


def parse_bind(text: str, flag: str = "--http_bind") -> tuple[str, int]:
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{flag}: expected host:port, got {text!r}")
    return host or "0.0.0.0", int(port)


@dataclass(frozen=True)
class Options:
    host: str = "127.0.0.1"
    port: int = 8080
    cert_file: str = ""
    key_file: str = ""
    scheduler_name: str = "hami-scheduler"
    node_policy: str = "binpack"
    gpu_policy: str = "spread"
    score_with_request: bool = True  # False: HAMi v2.10's request-free scores (docs/compatibility.md)
    node_selector: dict[str, str] = field(default_factory=dict)
    node_lock_timeout: float = 300.0
    node_lock_retry_timeout: float = 28.0
    bind_timeout: float | None = None  # the whole Bind (None: the lock retry timeout, at least 28 s)
    force_overwrite_default_scheduler: bool = True
    leader_elect: bool = False
    leader_campaign: bool = False  # --leader-elect-mode=campaign
    lease_name: str = "hami-scheduler"
    lease_namespace: str = "kube-system"
    identity: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    kubeconfig: str | None = None
    kube_timeout: float = 30.0
    kube_connections: int = POOL  # to the API server at once
    resync_interval: float = 15.0
    cert_reload_interval: float = 1.0
    disable_control_label: str = DISABLE_CONTROL_LABEL
    gpu_hook_path: str = "/usr/local"
    front_end: str = "extender"  # "dra": the webhook turns NVIDIA requests into ResourceClaims
    success_events: bool = True
    success_event_rate: float = 10.0  # success events a second on average; 0 = every one (HAMi's)
    success_event_burst: int = 50  # success events at once
    event_loop: str = "uvloop"  # "uvloop" | "asyncio" (the standard library's)
    shutdown_delay: float = 15.0  # seconds of serving after SIGTERM, while endpoints drop the pod
    gc_interval: float = 600.0  # seconds between full collections (hami.gcpolicy); 0 = Python's own
    decision_write: str = "binding"  # "binding" | "filter" (HAMi's: a pod patch from Filter)
    device_config: DeviceConfig = field(default_factory=default_device_config)
    metrics_host: str = ""
    metrics_port: int | None = None  # None = no metrics endpoint
    legacy_metrics: bool = False
    extender_host: str = ""
    extender_port: int | None = None  # None = no plain-HTTP loopback listener
    # CA bundle whose client certificates may call /filter and /bind on the https port
    # (--extender-client-ca); "" = the https port serves them to nobody (--extender-bind given) or,
    # on a loopback --http_bind only, to any local caller
    extender_client_ca: str = ""
    # the read-only web UI and /api/v1 (--ui-bind); None = not served
    ui_host: str = ""
    ui_port: int | None = None
    ui_monitor_url: str = ""  # node monitors' /metrics template ({node}, {node_ip}); "" = no live usage
    ui_prometheus_url: str = ""  # the history's source (Prometheus HTTP API base URL); "" = the in-process ring
    ui_auth: str = "token"  # token: bearer tokens + RBAC (TokenReview, SubjectAccessReview); none: loopback only
    ui_token_audiences: tuple[str, ...] = ()  # the TokenReview's audiences; () = the API server's default
    ui_path_prefix: str = ""  # the page and /api/v1 under this path ("/hami"), for a proxy that keeps it
    ui_frame_ancestors: str = "'none'"  # the page's CSP frame-ancestors: who may embed it
    # the UI listener's TLS certificate and key (PEM, reloaded when they change); "" = plain HTTP,
    # only on a loopback --ui-bind or with --ui-plain-http
    ui_cert_file: str = ""
    ui_key_file: str = ""

    @property
    def tls(self) -> bool:
        return bool(self.cert_file and self.key_file)

    @property
    def extender_on_main(self) -> bool:
        """Whether the --http_bind port serves /filter and /bind (never with --extender-bind)."""
        return self.extender_port is None

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            build_vendors(self.device_config),
            self.node_policy,
            self.gpu_policy,
            request_in_scores=self.score_with_request,
        )


def _whole_number(least: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least`` (``why``: the reason, in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected at least {least}{why}, got {value}")
        return value

    return parse


_connections = _whole_number(8, " (the watches hold 5)")
_event_burst = _whole_number(1)


def _event_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of events a second, got {text!r}") from None
    if not value >= 0 or value == float("inf"):  # NaN fails the comparison
        raise argparse.ArgumentTypeError(f"expected 0 (not paced) or a positive finite number, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--http_bind", default="127.0.0.1:8080", help="listen address host:port (default %(default)s)")
    a("--cert_file", default="", help="TLS certificate (PEM); reloaded when the file changes")
    a("--key_file", default="", help="TLS private key (PEM); reloaded when the file changes")
    a("--scheduler-name", default="hami-scheduler", help="scheduler name set on GPU pods (default %(default)s)")
    a("--node-scheduler-policy", default="binpack", help="binpack | spread (default %(default)s)")
    a("--gpu-scheduler-policy", default="spread", help="binpack | spread | ... (default %(default)s)")
    a(
        "--score-with-request",
        type=_bool,
        nargs="?",
        const=True,
        default=True,
        help="node and GPU scores count the pod's own request (default %(default)s); false = HAMi v2.10's "
        "scores, from usage before the pod (docs/compatibility.md)",
    )
    a(
        "--extender-bind",
        default="",
        help="also serve /filter and /bind over plain HTTP here, loopback addresses only, for a kube-scheduler "
        "in the same pod: no TLS handshake per call (kube-scheduler keeps only 2 idle extender "
        "connections, so most Binds would open a new one); empty = off (default)",
    )
    a(
        "--extender-client-ca",
        default="",
        help="CA bundle (PEM): the --http_bind port serves /filter and /bind only to callers presenting a client "
        "certificate signed by it (mTLS; give kube-scheduler a client certificate in its extender tlsConfig). "
        "/webhook and the health checks need none. Not used with --extender-bind, where the --http_bind "
        "port serves no /filter or /bind at all; without either, --http_bind must be a loopback address",
    )
    a(
        "--metrics-bind-address",
        default=":9395",
        help="where GET /metrics is served; empty = not served (default %(default)s)",
    )
    a("--node-label-selector", default="", help="only nodes with these labels, k=v[,k=v]")
    a("--kube-qps", type=float, default=0, help="HAMi's client rate limit: only 0 (no limit) is accepted")
    a("--kube-burst", type=int, default=0, help="HAMi's client burst: only 0 (no limit) is accepted")
    a("--kube-timeout", default="30s", help="API request timeout (default %(default)s)")
    a(
        "--kube-connections",
        type=_connections,
        default=POOL,
        help="connections to the API server at once, watches included (HTTP/1.1: one request in flight on "
        "each; more wait for one); each new one costs a TLS handshake (default %(default)s)",
    )
    a(
        "--profiling",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="HAMi's pprof routes: only false is accepted (no pprof in Python)",
    )
    a(
        "--node-lock-timeout",
        default=os.environ.get("HAMI_NODELOCK_EXPIRE", "5m"),
        help="node lock expiry (default $HAMI_NODELOCK_EXPIRE or 5m; the flag wins)",
    )
    a(
        "--node-lock-retry-timeout",
        default="28s",
        help="how long Bind waits for a busy node lock (every pod, not only pod groups; 0 = fail at once)",
    )
    a(
        "--bind-timeout",
        default=None,
        help="the most one Bind may take, lock wait included; keep it below kube-scheduler's extender "
        "httpTimeout (30s by default; the chart sets it 2s below), past which kube-scheduler has given up "
        "and no Binding may be posted (default: --node-lock-retry-timeout, at least 28s)",
    )
    a(
        "--force-overwrite-default-scheduler",
        type=_bool,
        nargs="?",
        const=True,
        default=True,
        help="webhook also takes pods aimed at default-scheduler (default true)",
    )
    a(
        "--leader-elect",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="follow the kube-scheduler Lease; only the leader filters and binds",
    )
    a(
        "--leader-elect-mode",
        choices=("follow", "campaign"),
        default="follow",
        help="(hami-py) follow: lead while the kube-scheduler in this pod holds the Lease (HAMi's way); "
        "campaign: campaign for the Lease itself, for an extender whose kube-scheduler runs in a pod of "
        "its own (default %(default)s)",
    )
    a("--leader-elect-resource-name", default="hami-scheduler", help="Lease name (default %(default)s)")
    a("--leader-elect-resource-namespace", default="", help="Lease namespace (default $POD_NAMESPACE or kube-system)")
    a(
        "--leader-elect-identity",
        default="",
        help="leader when the Lease holderIdentity is this, or this and '_<uuid>' as kube-scheduler writes it "
        "(default: the hostname, as kube-scheduler's identity is <hostname>_<uuid>; in a pod that is the pod "
        "name, unless the pod sets hostNetwork or spec.hostname)",
    )
    a(
        "--legacy-metrics",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="also export HAMi's old metric names (docs/metrics.md)",
    )
    a("--device-config-file", default="", help="device-config.yaml (default: NVIDIA with chart defaults)")
    a("--debug", type=_bool, nargs="?", const=True, default=False, help="verbose logging")
    a("-v", "--v", dest="verbosity", type=int, default=0, help="log verbosity (klog style)")
    a("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, ~/.kube/config or in-cluster)")
    a(
        "--resync-interval",
        default="15s",
        help="leader pass: handshakes, stale locks, node health (default %(default)s)",
    )
    a(
        "--success-events",
        type=_bool,
        nargs="?",
        const=True,
        default=True,
        help="record FilteringSucceed/BindingSucceed events (default true; failures are always recorded)",
    )
    a(
        "--success-event-rate",
        type=_event_rate,
        default=10.0,
        help="success events written a second on average, beyond --success-event-burst at once; 0 writes "
        "every one, as HAMi does (default %(default)s; Warnings are never paced)",
    )
    a(
        "--success-event-burst",
        type=_event_burst,
        default=50,
        help="success events that may be written at once before --success-event-rate applies (default %(default)s)",
    )
    a(
        "--event-loop",
        default="uvloop",
        choices=EVENT_LOOPS,
        help="the event loop every request, watch and write runs on: 'uvloop' (default; libuv: the "
        "transports, TLS and timers in C, 6.8 -> 4.8 ms CPU per scheduled pod in bench/bench_scheduler.py) "
        "or 'asyncio' (the standard library's)",
    )
    a(
        "--shutdown-delay",
        default="15s",
        help="after SIGTERM keep serving this long before closing the listeners: the pod has left the "
        "Services' endpoints, but kube-proxy and the API server see that a moment later, and an admission "
        "call routed here meanwhile would be refused (a GPU pod refused during every upgrade); meanwhile "
        "every answer closes its connection (Connection: close), so callers' pooled connections move to "
        "the other endpoints; keep it below the pod's terminationGracePeriodSeconds (30 by default); "
        "SIGINT or a second signal skips it; 0 = close at once (default %(default)s)",
    )
    a(
        "--gc-interval",
        default="10m",
        help="Python's garbage collector: young collections every 50,000 allocations, and a full one "
        "(then freezing what survived) only this often, not whenever the cache has grown a quarter: "
        "full collections walk every cached pod and stalled scheduling up to 150 ms at a time in "
        "bench/bench_scheduler.py (hami.gcpolicy); 0 = the interpreter's own collector (default %(default)s)",
    )
    a(
        "--decision-write",
        default="binding",
        choices=DECISION_WRITES,
        help="where a Filter decision is written to the pod: 'binding' (default) sends the allocation "
        "annotations on the Binding itself, one pod write less per pod, and the device plugin labels "
        f"the pod {VGPU_NODE}; 'filter' patches the pod from Filter as HAMi does (annotations and "
        "label before the Bind; use it with HAMi's own device plugin and vGPU monitor)",
    )
    a(
        "--ui-bind",
        default="",
        help="serve the read-only web UI and its JSON API (/api/v1, docs/ui.md) here, host:port, never on the "
        "--http_bind port; HTTPS (--ui-cert-file) unless it is a loopback address or --ui-plain-http; empty = off "
        "(default). Who may read what: --ui-auth (docs/security.md)",
    )
    a(
        "--ui-auth",
        default="token",
        choices=("token", "none"),
        help="who may read /api/v1: 'token' (default) asks every request for a Kubernetes bearer token, checked "
        "with a TokenReview, and shows what its user may list (SubjectAccessReview); 'none' shows everything to "
        "whoever connects and is refused unless --ui-bind is a loopback address (kubectl port-forward only)",
    )
    a(
        "--ui-token-audiences",
        default="",
        help="with --ui-auth token: the audiences the UI's TokenReviews ask for, comma-separated (a token "
        "made for none of them is refused, e.g. `kubectl create token NAME --audience hami-ui`); empty = the "
        "API server's own audience (default)",
    )
    a(
        "--ui-monitor-url",
        default="",
        help="where the UI reads live usage: each node monitor's /metrics, a template with {node_ip} (the Node's "
        "InternalIP) and {node}, e.g. http://{node_ip}:9394/metrics; empty = allocations only (default)",
    )
    a(
        "--ui-prometheus-url",
        default="",
        help="where the UI's history comes from: a Prometheus that scrapes the scheduler's and the node monitors' "
        "metrics, its HTTP API base URL (e.g. http://prometheus.monitoring:9090); empty = the scheduler's "
        "in-process ring (default), which is also the fallback when Prometheus does not answer",
    )
    a(
        "--ui-cert-file",
        default="",
        help="the UI listener's TLS certificate (PEM; reloaded when the file changes), with --ui-key-file; "
        "required on a non-loopback --ui-bind unless --ui-plain-http",
    )
    a("--ui-key-file", default="", help="the private key of --ui-cert-file (PEM)")
    a(
        "--ui-plain-http",
        action="store_true",
        help="serve the UI over plain HTTP on a non-loopback --ui-bind (TLS ends in front of it: a proxy or a "
        "service mesh); bearer tokens then cross that hop in the clear",
    )
    a(
        "--ui-path-prefix",
        default="",
        help="serve the page and /api/v1 under this path, e.g. /hami, for a reverse proxy that passes the "
        "prefix on; a proxy that strips it needs nothing (every URL of the page is relative); empty = / (default)",
    )
    a(
        "--ui-frame-ancestors",
        default="'none'",
        help="who may show the page in a frame: the Content-Security-Policy frame-ancestors sources, e.g. "
        "\"'self' https://portal.example.com\"; default 'none' (no embedding)",
    )
    a(
        "--front-end",
        default="extender",
        choices=("extender", "dra"),
        help="extender: GPU pods are routed to --scheduler-name (the extender places them); dra: the webhook turns "
        "nvidia.com/gpu+gpumem+gpucores into ResourceClaims of the gpu.hami.io DRA driver and kube-scheduler "
        "places them (docs/dra.md) (default %(default)s)",
    )
    a(
        "--disable-control-label",
        default=DISABLE_CONTROL_LABEL,
        help='namespace label (value "true") that allows CUDA_DISABLE_CONTROL in pods (default %(default)s)',
    )
    a(
        "--gpu-hook-path",
        default="/usr/local",
        help="the nodes' hook path (the chart's global.gpuHookPath): GPU containers get libvgpu under "
        "<path>/vgpu, where the webhook refuses a pod's own volume mounts (default %(default)s)",
    )


def _check_ca_bundle(path: str, flag: str) -> None:
    """The file holds at least one PEM certificate OpenSSL accepts as a trust anchor."""
    if not Path(path).is_file():
        raise ConfigError(f"{flag}: no such file {path!r}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(f"{flag}: {path!r} is not a PEM CA bundle: {exc}") from None
    if not context.cert_store_stats().get("x509"):
        raise ConfigError(f"{flag}: {path!r} holds no certificate")


def options_from_args(args: argparse.Namespace) -> Options:
    """Validate the parsed flags and read device-config.yaml. Raises ConfigError naming the key.

    One check per concern, in this order: unsupported HAMi flags, TLS files, the device config,
    the extender's listener (who may call /filter and /bind), the UI's listener."""
    host, port = parse_bind(args.http_bind)
    _refuse_unsupported(args)
    if (
        args.leader_elect
        and args.leader_elect_mode == "campaign"
        and args.leader_elect_resource_name == args.scheduler_name
    ):
        # kube-scheduler campaigns for the Lease named after its profile: sharing it, the two would
        # take it from each other
        raise ConfigError(
            f"--leader-elect-resource-name={args.leader_elect_resource_name}: with --leader-elect-mode=campaign the "
            "extender needs a Lease of its own, not kube-scheduler's (named after the scheduler, "
            f"--scheduler-name); e.g. {args.scheduler_name}-extender"
        )
    _check_tls_files(args)
    device_config = _device_config(args.device_config_file)
    pod_name = os.environ.get("POD_NAME", "")
    pod_namespace = os.environ.get("POD_NAMESPACE", "")
    metrics_host, metrics_port = ("", None)
    if args.metrics_bind_address:
        metrics_host, metrics_port = parse_bind(args.metrics_bind_address, "--metrics-bind-address")
    extender_host, extender_port = _extender_listener(args, host)
    client_ca = args.extender_client_ca
    ui_host, ui_port = _ui_listener(args, (port, extender_port, metrics_port))
    opts = Options(
        host=host,
        port=port,
        cert_file=args.cert_file,
        key_file=args.key_file,
        scheduler_name=args.scheduler_name,
        node_policy=args.node_scheduler_policy,
        gpu_policy=args.gpu_scheduler_policy,
        score_with_request=args.score_with_request,
        node_selector=parse_selector(args.node_label_selector, "--node-label-selector"),
        node_lock_timeout=parse_duration(args.node_lock_timeout, "--node-lock-timeout"),
        node_lock_retry_timeout=parse_duration(args.node_lock_retry_timeout, "--node-lock-retry-timeout"),
        bind_timeout=None if args.bind_timeout is None else parse_duration(args.bind_timeout, "--bind-timeout"),
        force_overwrite_default_scheduler=args.force_overwrite_default_scheduler,
        leader_elect=args.leader_elect,
        leader_campaign=args.leader_elect_mode == "campaign",
        lease_name=args.leader_elect_resource_name,
        lease_namespace=args.leader_elect_resource_namespace or pod_namespace or "kube-system",
        # kube-scheduler's identity is os.Hostname() + "_<uuid>": the pod's name only without
        # hostNetwork or spec.hostname, where $POD_NAME never matched
        identity=args.leader_elect_identity or socket.gethostname(),
        pod_name=pod_name,
        pod_namespace=pod_namespace,
        kubeconfig=args.kubeconfig,
        kube_timeout=parse_duration(args.kube_timeout, "--kube-timeout") or 30.0,
        kube_connections=args.kube_connections,
        resync_interval=parse_duration(args.resync_interval, "--resync-interval") or 15.0,
        disable_control_label=args.disable_control_label,
        gpu_hook_path=_absolute(args.gpu_hook_path, "--gpu-hook-path"),
        device_config=device_config,
        front_end=args.front_end,
        success_events=args.success_events,
        success_event_rate=args.success_event_rate,
        success_event_burst=args.success_event_burst,
        event_loop=args.event_loop,
        gc_interval=parse_duration(args.gc_interval, "--gc-interval"),
        shutdown_delay=parse_duration(args.shutdown_delay, "--shutdown-delay"),
        decision_write=args.decision_write,
        metrics_host=metrics_host,
        metrics_port=metrics_port,
        legacy_metrics=args.legacy_metrics,
        extender_host=extender_host,
        extender_port=extender_port,
        extender_client_ca=client_ca,
        ui_host=ui_host,
        ui_port=ui_port,
        ui_monitor_url=args.ui_monitor_url,
        ui_prometheus_url=args.ui_prometheus_url,
        ui_auth=args.ui_auth,
        ui_token_audiences=_audiences(args.ui_token_audiences),
        ui_cert_file=args.ui_cert_file,
        ui_key_file=args.ui_key_file,
        ui_path_prefix=ui_path_prefix(args.ui_path_prefix),
        ui_frame_ancestors=ui_frame_ancestors(args.ui_frame_ancestors),
    )
    if opts.node_lock_timeout <= 0:
        raise ConfigError(f"--node-lock-timeout: must be positive, got {args.node_lock_timeout!r}")
    if opts.bind_timeout is not None and opts.bind_timeout <= 0:
        raise ConfigError(f"--bind-timeout: must be positive, got {args.bind_timeout!r}")
    try:
        opts.scheduler_config()  # validates the policies (the message names the flag)
    except CoreError as exc:
        raise ConfigError(str(exc)) from None
    return opts


def _refuse_unsupported(args: argparse.Namespace) -> None:
    for flag, value, off in (
        ("--kube-qps", args.kube_qps, 0),
        ("--kube-burst", args.kube_burst, 0),
        ("--profiling", args.profiling, False),
    ):
        if value != off:
            raise ConfigError(
                f"{flag}: {value!r} is not supported (the API client is not rate-limited and there are "
                f"no pprof routes here); leave it unset"
            )


def _check_tls_files(args: argparse.Namespace) -> None:
    if bool(args.cert_file) != bool(args.key_file):
        raise ConfigError(f"--cert_file and --key_file go together (got {args.cert_file!r} and {args.key_file!r})")
    for flag, path in (("--cert_file", args.cert_file), ("--key_file", args.key_file)):
        if path and not Path(path).is_file():
            raise ConfigError(f"{flag}: no such file {path!r}")


def _audiences(text: str) -> tuple[str, ...]:
    """``--ui-token-audiences``: names without spaces, commas between; empty = none."""
    out = tuple(a.strip() for a in text.split(",") if a.strip())
    for a in out:
        if any(c.isspace() for c in a) or len(a) > 253:
            raise ConfigError(
                f"--ui-token-audiences: {a[:60]!r} is not an audience (no spaces, at most 253 characters)"
            )
    return out


def _device_config(file: str | None):
    if not file:
        return default_device_config()
    return read_device_config_file(file, "--device-config-file")


def _extender_listener(args: argparse.Namespace, host: str) -> tuple[str, int | None]:
    """Where /filter and /bind answer, and the rule that they never answer an unauthenticated
    caller: loopback (--extender-bind), client certificates (--extender-client-ca), or a loopback
    --http_bind."""
    extender_host, extender_port = ("", None)
    if args.extender_bind:
        extender_host, extender_port = parse_bind(args.extender_bind, "--extender-bind")
        if extender_host not in LOOPBACK:
            raise ConfigError(
                f"--extender-bind: {args.extender_bind!r} is not a loopback address "
                f"({', '.join(sorted(LOOPBACK))}); this listener has no TLS"
            )
        extender_host = extender_host.strip("[]")
    client_ca = args.extender_client_ca
    if client_ca:
        if extender_port is not None:
            raise ConfigError(
                f"--extender-client-ca: not used with --extender-bind {args.extender_bind!r} (the "
                f"--http_bind port then serves no /filter or /bind); give one of the two"
            )
        if not (args.cert_file and args.key_file):
            raise ConfigError(
                f"--extender-client-ca: {client_ca!r} needs --cert_file and --key_file (client "
                f"certificates are checked in the TLS handshake)"
            )
        _check_ca_bundle(client_ca, "--extender-client-ca")
    elif extender_port is None and host not in LOOPBACK:
        raise ConfigError(
            f"--http_bind: {args.http_bind!r} is not a loopback address and /filter and /bind would "
            f"answer anyone who reaches it; give --extender-bind (kube-scheduler in the same pod "
            f"calls the extender on loopback; the default of the chart) or --extender-client-ca "
            f"(kube-scheduler presents a client certificate)"
        )
    return extender_host, extender_port


_PREFIX = re.compile(r"(/[A-Za-z0-9._~-]+)+")
_SOURCE = re.compile(r"'self'|[a-z][a-z0-9+.-]*:|([a-z][a-z0-9+.-]*://)?(\*\.)?[A-Za-z0-9.-]+(:(\d+|\*))?(/[^\s;,']*)?")


def ui_path_prefix(value: str) -> str:
    """``--ui-path-prefix``: "" or ``/seg[/seg...]`` (a trailing ``/`` dropped); no ``.``/``..``
    segment, no query, nothing a URL would have to escape."""
    prefix = value.rstrip("/")
    if not prefix:
        return ""
    if not _PREFIX.fullmatch(prefix) or any(seg in (".", "..") for seg in prefix.split("/")):
        raise ConfigError(
            f"--ui-path-prefix: expected a path such as /hami or /tools/gpus (letters, digits, '.', '_', '~', '-' "
            f"between slashes), got {value[:80]!r}"
        )
    return prefix


def ui_frame_ancestors(value: str) -> str:
    """``--ui-frame-ancestors``: CSP frame-ancestors sources, one directive's value only: a ``;``,
    ``,`` or control character would end the directive or start another, and is refused."""
    text = value.strip()
    bad = next((c for c in value if c in ";," or ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ConfigError(
            f"--ui-frame-ancestors: {value[:80]!r} contains {bad!r}; give the frame-ancestors sources only, "
            f"separated by spaces (e.g. \"'self' https://portal.example.com\")"
        )
    sources = text.split()
    if sources == ["'none'"]:
        return "'none'"
    wrong = [s for s in sources if not _SOURCE.fullmatch(s)]
    if not sources or "'none'" in sources or wrong:
        raise ConfigError(
            f"--ui-frame-ancestors: {value[:80]!r}: expected 'none' alone, or sources such as 'self', https:, "
            f"https://portal.example.com, *.example.com" + (f" (not a source: {wrong[0]!r})" if wrong else "")
        )
    return " ".join(sources)


def _ui_tls(args: argparse.Namespace, ui_host: str) -> None:
    """HTTPS unless the UI is on loopback (kubectl port-forward: the tunnel is the API server's TLS)
    or --ui-plain-http says TLS ends in front of it."""
    cert, key = args.ui_cert_file, args.ui_key_file
    if bool(cert) != bool(key):
        raise ConfigError(f"--ui-cert-file and --ui-key-file go together (got {cert!r} and {key!r})")
    for flag, path in (("--ui-cert-file", cert), ("--ui-key-file", key)):
        if path and not Path(path).is_file():
            raise ConfigError(f"{flag}: no such file {path!r}")
    if cert and args.ui_plain_http:
        raise ConfigError("--ui-plain-http: given with --ui-cert-file; choose one (HTTPS, or plain HTTP behind TLS)")
    if cert:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"--ui-cert-file/--ui-key-file: {cert!r} and {key!r} are not a usable pair: {exc}"
            ) from None
    elif ui_host not in LOOPBACK and not args.ui_plain_http:
        raise ConfigError(
            f"--ui-bind: {args.ui_bind!r} is not a loopback address, so the UI (which receives bearer tokens) "
            f"needs HTTPS: give --ui-cert-file and --ui-key-file, or --ui-plain-http when TLS ends in front of it"
        )


def _ui_listener(args: argparse.Namespace, taken: tuple[int | None, ...]) -> tuple[str, int | None]:
    ui_host, ui_port = ("", None)
    if args.ui_bind:
        ui_host, ui_port = parse_bind(args.ui_bind, "--ui-bind")
        ui_host = ui_host.strip("[]")
        if ui_port in taken:
            raise ConfigError(
                f"--ui-bind: {args.ui_bind!r} is the port of another listener of the scheduler; "
                f"the UI has a port of its own"
            )
        if args.ui_auth == "none" and ui_host not in LOOPBACK:
            raise ConfigError(
                f"--ui-auth: 'none' shows every namespace to whoever connects, so it is only allowed on a "
                f"loopback --ui-bind ({', '.join(sorted(LOOPBACK))}; reached with kubectl port-forward), "
                f"not on {args.ui_bind!r}; use --ui-auth=token"
            )
    if args.ui_monitor_url:
        if not args.ui_bind:
            raise ConfigError(f"--ui-monitor-url: {args.ui_monitor_url!r} is only used with --ui-bind")
        if not args.ui_monitor_url.startswith(("http://", "https://")) or "{" in args.ui_monitor_url.replace(
            "{node_ip}", ""
        ).replace("{node}", ""):
            raise ConfigError(
                f"--ui-monitor-url: expected an http(s) URL with {{node_ip}} or {{node}}, got {args.ui_monitor_url!r}"
            )
    if args.ui_prometheus_url:
        if not args.ui_bind:
            raise ConfigError(f"--ui-prometheus-url: {args.ui_prometheus_url!r} is only used with --ui-bind")
        parsed = urllib.parse.urlsplit(args.ui_prometheus_url)
        try:
            port_ok = parsed.port is None or parsed.port > 0
        except ValueError:
            port_ok = False
        if (
            not port_ok
            or parsed.scheme not in ("http", "https")
            or not parsed.hostname
            or parsed.query
            or parsed.fragment
            or parsed.username is not None
            or any(c.isspace() for c in args.ui_prometheus_url)
        ):
            raise ConfigError(
                f"--ui-prometheus-url: expected an http(s) URL of Prometheus' HTTP API base with no query, "
                f"fragment or user name, e.g. http://prometheus.monitoring:9090, got {args.ui_prometheus_url!r}"
            )
    for flag, value, default in (
        ("--ui-path-prefix", args.ui_path_prefix, ""),
        ("--ui-frame-ancestors", args.ui_frame_ancestors, "'none'"),
        ("--ui-cert-file", args.ui_cert_file, ""),
        ("--ui-key-file", args.ui_key_file, ""),
        ("--ui-plain-http", args.ui_plain_http, False),
        ("--ui-token-audiences", args.ui_token_audiences, ""),
    ):
        if value != default and not args.ui_bind:
            raise ConfigError(f"{flag}: {str(value)[:80]!r} is only used with --ui-bind")
    if args.ui_token_audiences and args.ui_auth != "token":
        raise ConfigError(
            f"--ui-token-audiences: {args.ui_token_audiences[:80]!r} is only used with --ui-auth=token (tokens are checked)"
        )
    if args.ui_bind:
        _ui_tls(args, ui_host)
    return ui_host, ui_port
