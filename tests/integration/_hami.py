"""Helpers for `hami scheduler` integration tests: a scheduler subprocess, GPU nodes, and a
stand-in for the node side of the bind handoff.

kwok nodes run no kubelet device plugin, so :class:`PluginStandIn` plays that part honestly
through the real API server, exactly as `hami device-plugin` does after the kubelet's
Allocate: it finds the pod named by the node lock (``hami.io/mutex.lock``), waits until the pod
is bound to that node, removes ``hami.io/vgpu-devices-to-allocate``, sets
``hami.io/bind-phase=success`` and releases the lock (owner- and resourceVersion-checked).
It reads the allocation only from annotations; it never talks to the scheduler. One gap
against a real node: a pod that was bound while its lock was not yet visible is served on its
next event only (a kubelet would retry Allocate).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from hami.core.codec import decode_pod_devices, encode_node_devices_json
from hami.core.names import BIND_PHASE, NODE_INJECTION
from hami.core.types import DeviceInfo
from hami_devkit.cluster import ApiError, ExtenderConfig, KubeCluster, die_with_parent, free_port
from hami.kube.revision import newer_than
from hami.kube import nodelock

ROOT = Path(__file__).resolve().parents[2]
REGISTER = "hami.io/node-nvidia-register"
ALLOCATED = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
MERGE = "application/merge-patch+json"


def gpu_uuid(node: str, i: int) -> str:
    return f"GPU-{zlib.crc32(node.encode()):08x}-0000-4000-8000-{i:012d}"


def gpu_devices(
    node: str, gpus: int = 8, mem: int = 16384, model: str = "NVIDIA-Tesla T4", split: int = 10, numa_split: int = 4
) -> list[DeviceInfo]:
    return [
        DeviceInfo(
            id=gpu_uuid(node, i),
            index=i,
            count=split,
            devmem=mem,
            devcore=100,
            type=model,
            numa=i // numa_split,
            mode="hami-core",
            health=True,
        )
        for i in range(gpus)
    ]


def make_gpu_node(
    cluster: KubeCluster,
    name: str,
    gpus: int = 8,
    labels: dict | None = None,
    injection: str | None = None,
    **kw: Any,
) -> list[DeviceInfo]:
    devices = gpu_devices(name, gpus, **kw)
    # what `hami device-plugin` registers (with its default --lock-release-delay, which
    # PluginStandIn mirrors): the devices, and that it leaves finished pods' locks to a swap;
    # ``injection="nri"``: what `hami device-plugin --injection=nri` adds once registered with
    # the runtime's NRI socket (NriStandIn plays that node side)
    annotations = {REGISTER: encode_node_devices_json(devices), nodelock.LOCK_HANDOFF: nodelock.HANDOFF_SWAP}
    if injection:
        annotations[NODE_INJECTION] = injection
    cluster.create_node(name, labels=labels, gpus=gpus, split_count=kw.get("split", 10), annotations=annotations)
    return devices


def gpu_pod(
    name: str,
    ns: str,
    *,
    gpus: int = 1,
    mem: int | None = None,
    cores: int | None = None,
    annotations: dict | None = None,
    node_selector: dict | None = None,
    extra: dict | None = None,
) -> dict:
    limits: dict[str, Any] = {"nvidia.com/gpu": gpus}
    if mem is not None:
        limits["nvidia.com/gpumem"] = mem
    if cores is not None:
        limits["nvidia.com/gpucores"] = cores
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
        "spec": {
            "schedulerName": "hami-scheduler",
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": node_selector or {},
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }
    for k, v in (extra or {}).items():
        pod["spec"][k] = v
    return pod


class KeepAliveApi:
    """JSON requests to the API server over one persistent TLS connection per thread (a real
    kubelet/device plugin keeps its connection; a handshake per call would dominate the CPU),
    with the components' bearer token (a device plugin uses its ServiceAccount token)."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPSConnection(
                "127.0.0.1", self.cluster.ports["kube-apiserver"], context=self.cluster.token_context(), timeout=60
            )
        return conn

    def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        expect: tuple[int, ...] = (200, 201, 202),
        accept: str = "application/json",
    ) -> Any:
        payload = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            conn = self._conn()
            try:
                conn.request(
                    method,
                    path,
                    body=payload,
                    headers={
                        "Content-Type": content_type,
                        "Accept": accept,
                        "Authorization": f"Bearer {self.cluster.component_token}",
                    },
                )
                resp = conn.getresponse()
                text = resp.read().decode(errors="replace")
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        if resp.status not in expect:
            raise ApiError(method, path, resp.status, text)
        return json.loads(text) if text else None


class SchedulerProcess:
    """`python -m hami scheduler` against the test cluster, over HTTPS with a cluster-trusted cert."""

    def __init__(
        self,
        cluster: KubeCluster,
        *extra: str,
        port: int | None = None,
        tls: bool = True,
        loopback: bool = False,
        profile: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.profile = profile  # a path: run under cProfile, the stats written there at exit (benchmarks)
        self.port = port or free_port()
        # loopback: also --extender-bind (plain HTTP), which extender() then points kube-scheduler at
        self.loopback_port = free_port() if loopback else None
        self.extra = extra
        self.tls = tls
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(cluster.workdir) / "logs" / f"hami-extender-{self.port}.log"
        if tls:
            self.cert, self.key = cluster.issue_server_cert(f"hami-extender-{self.port}")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self, wait_ready: bool = True) -> "SchedulerProcess":
        argv = [
            sys.executable,
            *(["-m", "cProfile", "-o", self.profile] if self.profile else []),
            "-m",
            "hami",
            "scheduler",
            f"--kubeconfig={self.cluster.components_kubeconfig}",
            f"--http_bind=127.0.0.1:{self.port}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            "--resync-interval=1s",
            "--node-lock-retry-timeout=20s",
            # no Service routes here: stop() need not wait out the draining delay (a test sets it)
            *([] if any(a.startswith("--shutdown-delay") for a in self.extra) else ["--shutdown-delay=0"]),
            *self.extra,
        ]
        if self.tls:
            argv += [f"--cert_file={self.cert}", f"--key_file={self.key}"]
        if self.loopback_port:
            argv.append(f"--extender-bind=127.0.0.1:{self.loopback_port}")
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        env.pop("POD_NAME", None)
        env.pop("POD_NAMESPACE", None)
        self.log = open(self.log_path, "ab")
        if threading.current_thread() is threading.main_thread():
            argv = die_with_parent(argv)  # no scheduler outlives a killed test session
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        if wait_ready:
            self.wait_ready()
        return self

    def get(self, path: str) -> int:
        return self.answer(path)[0]

    def answer(self, path: str) -> tuple[int, str]:
        """(status, body) of a GET; (0, "") when nothing answers."""
        import ssl
        import urllib.error
        import urllib.request

        ctx = ssl.create_default_context(cadata=self.cluster.ca_pem.decode()) if self.tls else None
        try:
            with urllib.request.urlopen(self.url + path, context=ctx, timeout=2) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError:
            return 0, ""

    def wait_ready(self, timeout: float = 30.0) -> None:
        self.cluster.wait_for(lambda: self.get("/readyz") == 200 or self._died(), "hami scheduler ready", timeout)
        assert self.proc.poll() is None, f"hami scheduler exited: {self.logs()[-3000:]}"

    def _died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        if getattr(self, "log", None):
            self.log.close()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def extender(self, **kw: Any) -> ExtenderConfig:
        url = f"http://127.0.0.1:{self.loopback_port}" if self.loopback_port else self.url
        return ExtenderConfig(url_prefix=url, **kw)


class LeaseHolder:
    """Plays the kube-scheduler that `hami scheduler --leader-elect` follows: holds the Lease
    ``namespace/name`` for ``<identity>_<uuid>`` and renews it every 2 s (kube-scheduler's retry
    period) while the ``with`` block runs; :meth:`give` hands it to another identity, as the
    kube-scheduler of another replica takes it over."""

    def __init__(self, cluster: KubeCluster, namespace: str, name: str, identity: str) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.identity = identity
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self._stop, self._writing = threading.Event(), threading.Lock()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name},
            "spec": {
                "holderIdentity": f"{self.identity}_{os.urandom(4).hex()}",
                "leaseDurationSeconds": 15,
                "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
            },
        }
        try:
            version = self.cluster.api("GET", self.path)["metadata"]["resourceVersion"]
            self.cluster.api("PUT", self.path, {**body, "metadata": {**body["metadata"], "resourceVersion": version}})
        except ApiError:
            self.cluster.api("POST", f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases", body)

    def give(self, identity: str) -> None:
        with self._writing:
            self.identity = identity
            self._write()

    def _renew(self) -> None:
        while not self._stop.wait(2.0):
            with self._writing, contextlib.suppress(Exception):
                self._write()

    def __enter__(self) -> "LeaseHolder":
        self.give(self.identity)
        self._thread = threading.Thread(target=self._renew, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
BOUND = "spec.nodeName%21%3D"  # fieldSelector spec.nodeName!= (URL-encoded)


class PluginStandIn:
    """Plays the device plugin's side of the handoff for kwok nodes (see the module docstring).

    It watches pods (what the kubelet would do before calling Allocate): a pod bound to a node
    with ``bind-phase=allocating`` is served when the node's lock names it. Pods are served
    concurrently (one lock per node serialises each node anyway).
    """

    def __init__(
        self, cluster: KubeCluster, nodes: set[str] | None = None, workers: int = 8, release_delay: float = 1.0
    ) -> None:
        self.cluster = cluster
        self.nodes = nodes
        # as `hami device-plugin --lock-release-delay` (allocator.py): a served pod's lock is left for
        # the scheduler to swap over (the node says hami.io/node-lock-handoff=swap, make_gpu_node),
        # and removed after this delay only if it still has the value read; 0 = removed at once
        self.release_delay = release_delay
        self._deferred: dict[str, tuple[float, str, int]] = {}  # node -> (due, lock value, serve number)
        self._serves = 0  # numbers the serves: a slower, earlier serve never overrides a later one's entry
        self._deferred_wake = threading.Condition()
        self._timer = threading.Thread(target=self._release_deferred, daemon=True)
        self.allocated: list[tuple[str, str, str]] = []  # (node, ns/name, allocated annotation)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(workers)
        self._busy: set[str] = set()
        self._served: set[str] = set()  # uids of the pods allocated here
        self._pods: dict[str, dict] = {}  # "ns/name" -> newest bound copy seen (the plugin's PodCache)
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._conn: http.client.HTTPSConnection | None = None
        self.api = KeepAliveApi(cluster)

    def __enter__(self) -> "PluginStandIn":
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._deferred_wake:
            self._deferred_wake.notify()
        self._timer.join(10)
        for node, (_, value, _) in list(self._deferred.items()):  # as the plugin's flush at shutdown
            with contextlib.suppress(ApiError, OSError):
                self._release(node, value)
        self._deferred.clear()

    def kill(self) -> None:
        """As the plugin's process dying: no flush of the delayed lock removals, and every API call
        still in flight on a worker fails from now on (nothing more is written)."""

        def dead(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionResetError("the plugin stand-in was killed")

        self.api = dead  # type: ignore[assignment]
        self._stop.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._deferred_wake:
            self._deferred.clear()
            self._deferred_wake.notify()
        self._timer.join(10)

    def _release_deferred(self) -> None:
        """One thread for every node's delayed lock removal (the plugin's _release_later)."""
        while not self._stop.is_set():
            with self._deferred_wake:
                now = time.monotonic()
                due = [(n, v) for n, (t, v, _) in self._deferred.items() if t <= now]
                for n, _ in due:
                    del self._deferred[n]
                if not due:
                    nxt = min((t for t, _, _ in self._deferred.values()), default=now + 1.0)
                    self._deferred_wake.wait(max(0.0, min(nxt - now, 1.0)))
                    continue
            for node, value in due:
                try:
                    self._release(node, value)
                except (ApiError, OSError) as exc:
                    self.errors.append(f"deferred release on {node}: {exc}")

    def _run(self) -> None:
        rv = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    # only bound pods, as a kubelet watches only its node's: no event for creations
                    # and decision patches (less work for the API server under a benchmark too)
                    listed = self.cluster.api("GET", f"/api/v1/pods?fieldSelector={BOUND}")
                    for p in listed["items"]:
                        self._offer(p)
                    rv = listed["metadata"]["resourceVersion"]
                rv = self._watch(rv)
            except (ApiError, OSError, ValueError, http.client.HTTPException) as exc:
                if self._stop.is_set():
                    return
                self.errors.append(str(exc))
                rv = None
                self._stop.wait(0.2)

    def _watch(self, rv: str) -> str | None:
        ctx = self.cluster.token_context()
        self._conn = conn = http.client.HTTPSConnection(
            "127.0.0.1", self.cluster.ports["kube-apiserver"], context=ctx, timeout=120
        )
        try:
            conn.request(
                "GET",
                f"/api/v1/pods?watch=true&allowWatchBookmarks=true&timeoutSeconds=60&resourceVersion={rv}"
                f"&fieldSelector={BOUND}",
                headers={"Authorization": f"Bearer {self.cluster.component_token}"},
            )
            resp = conn.getresponse()
            if resp.status != 200:
                return None
            while not self._stop.is_set():
                line = resp.readline()
                if not line:
                    return rv
                event = orjson.loads(line)
                if event.get("type") == "ERROR":
                    return None
                obj = event.get("object") or {}
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if event.get("type") in ("ADDED", "MODIFIED"):
                    self._offer(obj)
                elif event.get("type") == "DELETED":
                    meta = obj.get("metadata") or {}
                    with self._mutex:
                        self._pods.pop(f"{meta.get('namespace')}/{meta.get('name')}", None)
            return rv
        finally:
            conn.close()

    def _offer(self, pod: dict) -> None:
        self._remember(pod)
        node = (pod.get("spec") or {}).get("nodeName")
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        if not node or not self._due(ann) or (self.nodes is not None and node not in self.nodes):
            return
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        with self._mutex:
            if key in self._busy or pod["metadata"].get("uid") in self._served:
                return  # (the kubelet calls Allocate once per pod: a later event of it is no new call)
            self._busy.add(key)
        self._dispatch(node, pod, key)

    def _dispatch(self, node: str, pod: dict, key: str) -> None:
        """Serve the pod on a worker (the plugin serves pods concurrently)."""
        self._pool.submit(self._serve_safely, node, pod, key)

    def _due(self, annotations: dict) -> bool:
        """A bound pod (of one of our nodes) this stand-in serves once."""
        return annotations.get(BIND_PHASE) == "allocating"

    def _remember(self, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        with self._mutex:
            old = self._pods.get(key)
            if old is None or newer_than(meta.get("resourceVersion"), old["metadata"].get("resourceVersion")):
                self._pods[key] = pod

    def _lock_owner(self, node: dict, namespace: str, name: str) -> dict:
        """The pod the lock names: the watched copy when it provably postdates the lock (newer
        than the node, bound here, allocating: the plugin's rule, PodCache.usable), else read."""
        with self._mutex:
            copy = self._pods.get(f"{namespace}/{name}")
        if (
            copy is not None
            and newer_than(copy["metadata"].get("resourceVersion"), node["metadata"].get("resourceVersion"))
            and copy["spec"].get("nodeName") == node["metadata"]["name"]
            and (copy["metadata"].get("annotations") or {}).get("hami.io/bind-phase") == "allocating"
        ):
            return copy
        return self._call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        """``self.api`` retried through transient failures (connection refused or reset, 5xx) for
        up to 15 s, as the plugin's pod and lock writes are (deviceplugin/kube.py: transient);
        a killed stand-in stops retrying at once."""
        deadline = time.monotonic() + 15.0
        while True:
            try:
                return self.api(*args, **kwargs)
            except (OSError, http.client.HTTPException) as exc:
                error: Exception = exc
            except ApiError as exc:
                if exc.status not in (429, 500, 502, 503, 504):
                    raise
                error = exc
            if self._stop.is_set() or time.monotonic() > deadline:
                raise error
            self._stop.wait(0.3)

    def _serve_safely(self, node: str, pod: dict, key: str) -> None:
        try:
            # metadata only, as the plugin reads it (src/hami/deviceplugin/kube.py: node_annotations)
            self._serve(self._call("GET", f"/api/v1/nodes/{node}", accept=METADATA_ONLY))
        except (ApiError, OSError, KeyError, ValueError) as exc:
            self.errors.append(f"{key}: {exc}")
        finally:
            with self._mutex:
                self._busy.discard(key)

    def _serve(self, node: dict) -> None:
        """One Allocate on ``node`` (a Node object): the pod its lock names, if bound here.
        Subclasses for other vendors override this (tests/integration/test_vendor_ascend.py)."""
        name = node["metadata"]["name"]
        raw = (node["metadata"].get("annotations") or {}).get(nodelock.NODE_LOCK)
        with self._deferred_wake:
            self._serves += 1
            serve = self._serves
            if name in self._deferred and self._deferred[name][1] != raw:
                del self._deferred[name]  # swapped over by the scheduler: nothing to remove
        lock = nodelock.parse_node_lock(raw)
        if lock is None:
            return
        try:
            pod = self._lock_owner(node, lock.namespace, lock.name)
        except ApiError as exc:
            if exc.status == 404:
                return  # the scheduler reclaims locks of vanished pods
            raise
        if pod["spec"].get("nodeName") != name:
            return  # not bound yet: the kubelet would not call Allocate before that
        ann = pod["metadata"].get("annotations") or {}
        if ann.get("hami.io/bind-phase") == "success":
            if not self.release_delay:
                self._release(name, raw)
            return  # a lock left for the handoff: its delayed removal (or the scheduler's swap) deals with it
        decode_pod_devices(ann[ALLOCATED])  # a real plugin fails on a malformed annotation
        # our plugin's order (src/hami/deviceplugin/allocator.py): the pod is identified, so the
        # lock goes back first and the success write overlaps with the next Bind on this node
        with self._mutex:
            self._served.add(pod["metadata"].get("uid"))
        if not self.release_delay:
            self._release(name, raw)
        with self._mutex:
            self._pods.pop(f"{lock.namespace}/{lock.name}", None)  # as PodCache.forget on the plugin's own write
        self._call(
            "PATCH",
            f"/api/v1/namespaces/{lock.namespace}/pods/{lock.name}",
            {
                "metadata": {
                    "annotations": {TO_ALLOCATE: None, "hami.io/bind-phase": "success"},
                    "labels": {"hami.io/vgpu-node": name},
                }
            },
            content_type=MERGE,
        )
        if self.release_delay:
            with self._deferred_wake:
                if name not in self._deferred or self._deferred[name][2] < serve:
                    self._deferred[name] = (time.monotonic() + self.release_delay, raw, serve)
                self._deferred_wake.notify()
        self.allocated.append((name, f"{lock.namespace}/{lock.name}", ann[ALLOCATED]))

    def _release(self, node: str, value: str) -> None:
        """The plugin's release (src/hami/deviceplugin/kube.py): remove the lock only while it still
        holds ``value``, in one atomic JSON patch; a changed lock (already taken over) is left."""
        self._call(
            "PATCH",
            f"/api/v1/nodes/{node}",
            nodelock.swap_patch(nodelock.NODE_LOCK, value, None),
            content_type="application/json-patch+json",
            expect=(200, 409, 422),
        )


class NriStandIn(PluginStandIn):
    """Plays the node side of the lockless bind path (docs/scheduler.md; `hami device-plugin
    --injection=nri`) for kwok nodes: on entering it writes ``hami.io/node-injection: nri`` on
    its nodes (what the plugin does once registered with containerd's NRI socket); then each pod
    bound to one of them is served once as the NRI CreateContainer hook serves it: the grant is
    read from the pod's own ``hami.io/vgpu-devices-allocated`` (no lock, no node read); a pod
    whose Binding said ``bind-phase=allocating`` is marked ``success`` (hami scheduler's Binding
    says ``success`` already: no write). It never reads or writes a node lock. A bound pod
    without a readable grant is an error (the real agent refuses the container)."""

    def __init__(self, cluster: KubeCluster, nodes: set[str], workers: int = 8) -> None:
        super().__init__(cluster, nodes=set(nodes), workers=workers, release_delay=0)

    def __enter__(self) -> "NriStandIn":
        for name in sorted(self.nodes or ()):
            self._call(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"metadata": {"annotations": {NODE_INJECTION: nodelock.INJECTION_NRI}}},
                content_type=MERGE,
            )
        super().__enter__()
        return self

    def _due(self, annotations: dict) -> bool:
        return BIND_PHASE in annotations  # bound by hami scheduler, whichever phase its Binding wrote

    def _dispatch(self, node: str, pod: dict, key: str) -> None:
        """A pod whose Binding said success needs no API call: served at once, on the watch's
        thread (a hand-off to a worker per pod cost the machine more than the serve itself)."""
        if ((pod.get("metadata") or {}).get("annotations") or {}).get(BIND_PHASE) == "success":
            self._serve_safely(node, pod, key)
        else:
            super()._dispatch(node, pod, key)

    def _serve_safely(self, node: str, pod: dict, key: str) -> None:
        try:
            self._serve_pod(node, pod)
        except (ApiError, OSError, KeyError, ValueError) as exc:
            self.errors.append(f"{key}: {exc}")
        finally:
            with self._mutex:
                self._busy.discard(key)

    def _serve_pod(self, node: str, pod: dict) -> None:
        meta = pod["metadata"]
        ann = meta.get("annotations") or {}
        if ALLOCATED not in ann:
            raise KeyError(f"pod {meta['namespace']}/{meta['name']} on {node} carries no {ALLOCATED}")
        decode_pod_devices(ann[ALLOCATED])  # the real agent fails the container on a malformed grant
        with self._mutex:
            self._served.add(meta.get("uid"))
        if ann.get(BIND_PHASE) != "success":
            self._call(
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"metadata": {"annotations": {BIND_PHASE: "success"}}},
                content_type=MERGE,
            )
        self.allocated.append((node, f"{meta['namespace']}/{meta['name']}", ann[ALLOCATED]))


class NodeLockWatch:
    """Records every node event under ``label_selector`` that shows one of ``keys`` (the node
    locks): a watch from the nodes' current resourceVersion, in a thread, until ``stop()``."""

    def __init__(self, cluster: KubeCluster, label_selector: str, keys: tuple[str, ...] = (nodelock.NODE_LOCK,)):
        self.cluster, self.selector, self.keys = cluster, label_selector, keys
        self.seen: list[tuple[str, str, str]] = []  # (node, key, value)
        self.events = 0
        self._probes: set[str | None] = set()
        self._stop = threading.Event()
        self._conn: http.client.HTTPSConnection | None = None
        listed = cluster.api("GET", f"/api/v1/nodes?labelSelector={label_selector}")
        self._record(listed["items"])
        self._rv = listed["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "NodeLockWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)

    def nodes_locked(self) -> set[str]:
        return {n for n, _, _ in self.seen}

    def check_live(self, node: str) -> None:
        """Write a probe annotation on ``node`` and wait until this watch has seen it: every node
        write before it has been seen too (a watch delivers in order), so ``seen`` is complete."""
        token = f"{time.monotonic_ns()}"
        self.cluster.api(
            "PATCH",
            f"/api/v1/nodes/{node}",
            {"metadata": {"annotations": {"hami.io/test-watch-probe": token}}},
            content_type=MERGE,
        )
        self.cluster.wait_for(lambda: token in self._probes, f"the node watch seeing the probe on {node}", 30, 0.1)

    def _record(self, items: list[dict]) -> None:
        for obj in items:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            self._probes.add(ann.get("hami.io/test-watch-probe"))
            for key in self.keys:
                if key in ann:
                    self.seen.append((obj["metadata"]["name"], key, ann[key]))

    def _run(self) -> None:
        while not self._stop.is_set():
            ctx = self.cluster.token_context()
            self._conn = conn = http.client.HTTPSConnection(
                "127.0.0.1", self.cluster.ports["kube-apiserver"], context=ctx, timeout=120
            )
            try:
                conn.request(
                    "GET",
                    f"/api/v1/nodes?watch=true&allowWatchBookmarks=true&timeoutSeconds=60"
                    f"&resourceVersion={self._rv}&labelSelector={self.selector}",
                    headers={"Authorization": f"Bearer {self.cluster.component_token}"},
                )
                resp = conn.getresponse()
                while not self._stop.is_set():
                    line = resp.readline()
                    if not line:
                        break
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":  # (e.g. 410 Gone) list again, then watch from there
                        listed = self.cluster.api("GET", f"/api/v1/nodes?labelSelector={self.selector}")
                        self._record(listed["items"])
                        self._rv = listed["metadata"]["resourceVersion"]
                        break
                    self._rv = (obj.get("metadata") or {}).get("resourceVersion") or self._rv
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self.events += 1
                        self._record([obj])
            except (ApiError, OSError, ValueError, http.client.HTTPException):
                if self._stop.is_set():
                    return
                self._stop.wait(0.2)
            finally:
                conn.close()


WEBHOOK_CONFIGS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def register_webhook(cluster: KubeCluster, url: str, name: str, label: str, claims: bool = False) -> None:
    """Send pod CREATEs in namespaces labelled ``<label>: on`` to our webhook at ``<url>/webhook``
    (and, with ``claims``, ResourceClaim CREATEs, as the chart does with ``dra.enabled``)."""
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "*"}]
    if claims:
        rules.append(
            {
                "apiGroups": ["resource.k8s.io"],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["resourceclaims"],
                "scope": "Namespaced",
            }
        )
    cluster.api(
        "POST",
        WEBHOOK_CONFIGS,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "vgpu.hami.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "NoneOnDryRun",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "reinvocationPolicy": "Never",
                    "clientConfig": {"url": f"{url}/webhook", "caBundle": cluster.ca_bundle},
                    "rules": rules,
                    "namespaceSelector": {"matchLabels": {label: "on"}},
                }
            ],
        },
    )


def delete_webhook(cluster: KubeCluster, name: str) -> None:
    cluster.api("DELETE", f"{WEBHOOK_CONFIGS}/{name}", expect=(200, 202, 404))


def label_namespace(cluster: KubeCluster, ns: str, label: str) -> None:
    """``<label>: on`` on the namespace, so that :func:`register_webhook`'s webhook sees its pods."""
    cluster.api("PATCH", f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {label: "on"}}}, content_type=MERGE)


def wait_webhook_routes(
    cluster: KubeCluster, ns: str, pod: dict, scheduler: str = "hami-scheduler", timeout: float = 30.0
) -> None:
    """Wait until the webhook routes ``pod`` in ``ns`` to ``scheduler`` (dry-run creates).

    A webhook configuration, and the namespace label its selector reads, reach the API
    server's admission caches a moment after they are written: a pod created at once may be
    admitted unmutated, keep ``default-scheduler`` and never reach our scheduler.
    """
    path = f"/api/v1/namespaces/{ns}/pods?dryRun=All"
    cluster.wait_for(
        lambda: cluster.api("POST", path, pod)["spec"].get("schedulerName") == scheduler,
        f"the webhook routing pods of {ns} to {scheduler}",
        timeout,
        interval=0.2,
    )


def pods(cluster: KubeCluster, ns: str) -> list[dict]:
    return cluster.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"]


def events(cluster: KubeCluster, ns: str, reason: str | None = None) -> list[dict]:
    items = cluster.api("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if reason is None or e.get("reason") == reason]


def device_usage(all_pods: list[dict]) -> dict[str, list[int]]:
    """uuid -> [slots, mem, cores] summed from the pods' allocation annotations (the test's own
    accounting, independent of the scheduler's memory)."""
    use: dict[str, list[int]] = {}
    for p in all_pods:
        text = (p["metadata"].get("annotations") or {}).get(ALLOCATED)
        if not text or p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for ctr in decode_pod_devices(text):
            for d in ctr:
                u = use.setdefault(d.uuid, [0, 0, 0])
                u[0] += 1
                u[1] += d.usedmem
                u[2] += d.usedcores
    return use


def wait_pods(cluster: KubeCluster, ns: str, probe, what: str, timeout: float = 120.0):
    return cluster.wait_for(lambda: probe(pods(cluster, ns)), what, timeout, interval=0.5)


def placed(p: dict) -> bool:
    return bool(p["spec"].get("nodeName")) and ALLOCATED in (p["metadata"].get("annotations") or {})


def wait_all_allocated(
    cluster: KubeCluster, ns: str, count: int, timeout: float, what: str | None = None
) -> list[dict]:
    """Wait until ``ns`` holds exactly ``count`` pods, each :func:`placed` and allocated on its node
    (``hami.io/bind-phase=success``, the device plugin's word); return them."""

    def probe() -> list[dict] | None:
        ps = pods(cluster, ns)
        done = len(ps) == count and all(
            placed(p) and p["metadata"]["annotations"].get(BIND_PHASE) == "success" for p in ps
        )
        return ps if done else None

    return cluster.wait_for(probe, what or f"{count} pods placed and allocated", timeout, interval=2.0)


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)[:4000]


def post_json_text(cluster: KubeCluster, path: str, text: str) -> None:
    """POST JSON text to the API server as it is: objects json and orjson will not write (a lone
    surrogate, 1100 levels of nesting) are stored by the real API server all the same."""
    conn = http.client.HTTPSConnection(
        "127.0.0.1", cluster.ports["kube-apiserver"], context=cluster._client_context(), timeout=30
    )
    try:
        conn.request("POST", path, text.encode(), {"Content-Type": "application/json", "Accept": "application/json"})
        answer = conn.getresponse()
        assert answer.status == 201, (answer.status, answer.read()[:300])
        answer.read()
    finally:
        conn.close()


def claim_json(name: str, parameters: str) -> str:
    """A ResourceClaim of another driver as JSON text, its opaque parameters ``parameters`` (JSON
    text, put in as it is)."""
    shell = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "r", "exactly": {"deviceClassName": "other.example.com"}}],
                "config": [{"opaque": {"driver": "x.example.com", "parameters": "PARAMS"}}],
            }
        },
    }
    return json.dumps(shell).replace('"PARAMS"', parameters)
