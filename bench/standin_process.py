"""The node side's stand-in (tests/integration/_hami.py's ``NriStandIn``/``PluginStandIn``) in a
process of its own, for the e2e bench.

In the bench's own process the stand-in's watch thread parsed every pod event under the same
interpreter lock as the 16 threads creating the burst's pods, so the stand-in slowed the pods'
creation, which the GPU-less baseline (no stand-in) does not pay. On a real cluster the pods come
from another program and the node agents run on the GPU nodes. In its own process the stand-in
still watches the same API server and serves every pod (its API server load and its CPU on this
machine are still counted); only the shared lock is gone.
"""

from __future__ import annotations

import multiprocessing
import ssl
from typing import Any


class ApiAddress:
    """What the stand-ins use of a KubeCluster, picklable: the API server's port, its CA, the
    components' bearer token."""

    def __init__(self, cluster: Any) -> None:
        self.ports = {"kube-apiserver": cluster.ports["kube-apiserver"]}
        self.ca_pem: bytes = cluster.ca_pem
        self.component_token: str = cluster.component_token
        self._api: Any = None

    def __getstate__(self) -> dict:
        return {"ports": self.ports, "ca_pem": self.ca_pem, "component_token": self.component_token, "_api": None}

    def token_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())

    def api(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        if self._api is None:
            from tests.integration._hami import KeepAliveApi

            self._api = KeepAliveApi(self)
        return self._api(method, path, body, **kw)


def _child(address: ApiAddress, kind: str, nodes: set[str] | None, workers: int, conn: Any) -> None:
    from bench.bench_scheduler import timed_standin
    from tests.integration._hami import NriStandIn, PluginStandIn

    try:
        if kind == "nri":
            standin = timed_standin(NriStandIn)(address, nodes=nodes, workers=workers)
        else:
            standin = timed_standin(PluginStandIn)(address, workers=workers)
        with standin:
            conn.send(("ready", None))
            conn.recv()  # the run is over
        conn.send(("done", (standin.summary(), list(standin.errors))))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


class StandInProcess:
    """``with StandInProcess(cluster, "nri", nodes, workers) as s: ...; s.summary()``: the
    stand-in runs in a spawned process from ``__enter__`` (returns once it serves) to
    ``__exit__``; its summary and errors come back then."""

    def __init__(self, cluster: Any, kind: str, nodes: set[str] | None = None, workers: int = 8) -> None:
        if kind not in ("nri", "allocate"):
            raise ValueError(f"stand-in kind must be nri or allocate, not {kind!r}")
        self.address = ApiAddress(cluster)
        self.kind, self.nodes, self.workers = kind, nodes, workers
        self.errors: list[str] = []
        self._summary = "not run"
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_child, args=(self.address, kind, nodes, workers, child), daemon=True, name=f"standin-{kind}"
        )

    def _receive(self, expected: str, timeout: float) -> Any:
        if not self._conn.poll(timeout):
            raise TimeoutError(f"the {self.kind} stand-in process sent nothing in {timeout:.0f}s (wanted {expected})")
        what, payload = self._conn.recv()
        if what == "error":
            raise RuntimeError(f"the {self.kind} stand-in process failed: {payload}")
        if what != expected:
            raise RuntimeError(f"the {self.kind} stand-in process sent {what!r}, not {expected!r}")
        return payload

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def __enter__(self) -> StandInProcess:
        self._proc.start()
        try:
            self._receive("ready", 120)
        except BaseException:
            self._proc.kill()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._conn.send("stop")
            self._summary, self.errors = self._receive("done", 120)
        finally:
            self._proc.join(30)
            if self._proc.is_alive():
                self._proc.kill()

    def summary(self) -> str:
        errors = f"; {len(self.errors)} errors (first: {self.errors[0]})" if self.errors else "; 0 errors"
        return self._summary + errors
