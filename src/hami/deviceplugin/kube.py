"""The plugin's few API-server calls (kubernetes_asyncio), translated to plain data.

Writes are JSON merge patches. Node-annotation writes that must not race (lock release)
carry ``metadata.resourceVersion`` and are retried on conflict (§13 pitfall 6).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Awaitable, Callable, Mapping, TypeVar

import aiohttp

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from hami.kube import nodelock
from hami.kube.client import KubeClient, skip_env_lookups
from hami.kube.reflector import Reflector

from .allocate import ContainerView, PodCache, PodView

T = TypeVar("T")
#: the longest one API request of the plugin may take (the pod watch has its own bounds:
#: hami.kube.reflector). kubernetes_asyncio's default is no time-out at all, so a connection the
#: network black-holes (an API server failing over behind its load balancer) would hang the call
#: for good, and with it Allocate, which the kubelet calls without a deadline.
API_TIMEOUT_S = 30.0
#: how long Allocate's writes ride out an unreachable API server (a kube-apiserver restart takes
#: seconds); past it the error goes back and the pod is failed as before. Each attempt is cut
#: off at the budget's end, so a write that gets no answer also ends with it.
TRANSIENT_BUDGET_S = 15.0
#: the least time a retried write's last attempt is given when the budget is nearly spent
MIN_ATTEMPT_S = 1.0
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


def transient(exc: BaseException) -> bool:
    """An error worth retrying an idempotent write for: no connection, a reset, a timeout, or
    an API server saying it is busy or starting."""
    if isinstance(exc, ApiException):
        return exc.status in TRANSIENT_STATUS
    return isinstance(exc, (aiohttp.ClientConnectionError, ConnectionError, asyncio.TimeoutError))


def describe(exc: BaseException) -> str:
    """One line for a failed API call (a time-out's own text is empty)."""
    if isinstance(exc, ApiException):
        return f"API server answered {exc.status} {exc.reason}"
    if isinstance(exc, asyncio.TimeoutError):
        return f"no answer from the API server in time ({exc})" if str(exc) else "no answer from the API server in time"
    return str(exc) or type(exc).__name__


async def retry_transient(
    call: Callable[[], Awaitable[T]], what: str, budget: float | None = None, delay: float = 0.2
) -> T:
    """``await call()``, again after a transient failure, until ``budget`` seconds
    (:data:`TRANSIENT_BUDGET_S`) have passed; an attempt still unanswered then is cut off (given
    at least :data:`MIN_ATTEMPT_S`), so the whole takes at most about ``budget``.
    Only for reads and idempotent writes (a merge patch of fixed values, a compare-and-remove). Found by
    tests/integration/test_chaos.py: a kube-apiserver restart during Allocate failed the pod."""
    deadline = time.monotonic() + (TRANSIENT_BUDGET_S if budget is None else budget)
    while True:
        try:
            return await asyncio.wait_for(call(), max(deadline - time.monotonic(), MIN_ATTEMPT_S))
        except Exception as exc:  # noqa: BLE001 - anything not transient is raised as it was
            if not transient(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("%s: %s; retrying in %.1fs", what, describe(exc), delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


log = logging.getLogger(__name__)
MERGE = "application/merge-patch+json"
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


async def api_client(kubeconfig: str | None) -> client.ApiClient:
    """A client from ``kubeconfig`` when given, else the in-cluster service account."""
    if kubeconfig:
        return skip_env_lookups(await config.new_client_from_config(config_file=kubeconfig))
    config.load_incluster_config()
    return skip_env_lookups(client.ApiClient())


def _limits(ctr: Any) -> dict[str, str]:
    res = ctr.resources
    return {k: str(v) for k, v in ((res.limits or {}) if res else {}).items()}


def _env(ctr: Any) -> dict[str, str]:
    return {e.name: e.value for e in (ctr.env or []) if e.value is not None}


def pod_view(pod: Any) -> PodView:
    spec = pod.spec
    ctrs = list(spec.init_containers or []) + list(spec.containers or [])
    return PodView(
        namespace=pod.metadata.namespace,
        name=pod.metadata.name,
        uid=pod.metadata.uid or "",
        annotations=dict(pod.metadata.annotations or {}),
        containers=tuple(ContainerView(c.name, _limits(c), _env(c)) for c in ctrs),
        node_name=spec.node_name or "",
        phase=(pod.status.phase if pod.status else "") or "",
        inits=len(spec.init_containers or ()),
    )


class Kube:
    """Node- and pod-level operations the device plugin needs."""

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.node_name = node_name
        self.pods = PodCache()

    def pod_reflector(self) -> Reflector:
        """The watch that fills :attr:`pods`: this node's pods only, as the kubelet watches them."""
        return Reflector(
            KubeClient(self.api, timeout=API_TIMEOUT_S),
            "/api/v1/pods",
            self.pods,
            name=f"pods on {self.node_name}",
            field_selector=f"spec.nodeName={self.node_name}",
        )

    async def lock_owner(self, namespace: str, name: str, node_rv: str) -> tuple[PodView | None, bool]:
        """The pod the node lock names, from the watch cache when the copy there provably
        postdates the lock (see :class:`PodCache`), else read. Returns (pod, from the cache)."""
        cached = self.pods.usable(namespace, name, self.node_name, node_rv)
        if cached is not None:
            return cached, True
        return await self.get_pod(namespace, name), False

    async def close(self) -> None:
        await self.api.close()

    async def node(self) -> Any:
        return await self.core.read_node(self.node_name, _request_timeout=API_TIMEOUT_S)

    async def node_annotations(self) -> tuple[dict[str, str], str]:
        """This node's annotations and resourceVersion, read as metadata only
        (PartialObjectMetadata): a node's status (images, conditions, ...) can be tens of KB
        that every Allocate would otherwise fetch and decode. A transient failure (429 from
        API Priority and Fairness, a restarting API server) is retried, as the writes are: one
        lost read failed the pod for good (the kubelet's UnexpectedAdmissionError)."""
        return await retry_transient(self._node_annotations, f"node {self.node_name}: annotations not read")

    async def _node_annotations(self) -> tuple[dict[str, str], str]:
        resp = await self.api.call_api(
            f"/api/v1/nodes/{self.node_name}",
            "GET",
            header_params={"Accept": METADATA_ONLY},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=API_TIMEOUT_S,
        )
        try:
            data = await resp.read()
        finally:
            resp.release()
        if resp.status != 200:
            raise ApiException(status=resp.status, reason=data.decode(errors="replace")[:300])
        meta = json.loads(data).get("metadata") or {}
        return dict(meta.get("annotations") or {}), meta.get("resourceVersion") or ""

    async def patch_node_annotations(
        self, values: Mapping[str, str | None], resource_version: str | None = None
    ) -> None:
        meta: dict[str, Any] = {"annotations": dict(values)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        await self.core.patch_node(
            self.node_name, {"metadata": meta}, _content_type=MERGE, _request_timeout=API_TIMEOUT_S
        )

    async def node_event(self, type_: str, reason: str, message: str) -> None:
        """An Event about this node (namespace ``default``, as node events are)."""
        import uuid as uuidlib
        from datetime import datetime, timezone

        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.core.create_namespaced_event(
            "default",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{self.node_name}.{uuidlib.uuid4().hex[:16]}", "namespace": "default"},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
                "reason": reason,
                "message": message,
                "type": type_,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "source": {"component": "hami-device-plugin", "host": self.node_name},
            },
            _request_timeout=API_TIMEOUT_S,
        )

    async def get_pod(self, namespace: str, name: str) -> PodView | None:
        """The pod (None when it does not exist); transient failures retried (see :meth:`node_annotations`)."""
        try:
            return pod_view(
                await retry_transient(
                    lambda: self.core.read_namespaced_pod(name, namespace, _request_timeout=API_TIMEOUT_S),
                    f"pod {namespace}/{name}: not read",
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def pods_on_node(self) -> list[PodView]:
        pods = await retry_transient(
            lambda: self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node_name}", _request_timeout=API_TIMEOUT_S
            ),
            f"node {self.node_name}: its pods not listed",
        )
        return [pod_view(p) for p in pods.items]

    async def patch_pod_annotations(
        self, pod: PodView, values: Mapping[str, str | None], labels: Mapping[str, str] | None = None
    ) -> None:
        body: dict[str, Any] = {"metadata": {"annotations": dict(values)}}
        if pod.uid:
            # a precondition (as the kubelet's own status patches carry): the API server refuses
            # the write (422: metadata.uid is immutable) when the name now belongs to a pod re-created since it was read,
            # which it would otherwise mark allocated or failed with the first pod's grant
            body["metadata"]["uid"] = pod.uid
        if labels:
            body["metadata"]["labels"] = dict(labels)
        self.pods.writing(pod.namespace, pod.name)  # the next Allocate of this pod must see this write
        written = await retry_transient(
            lambda: self.core.patch_namespaced_pod(
                pod.name, pod.namespace, body, _content_type=MERGE, _request_timeout=API_TIMEOUT_S
            ),
            f"pod {pod.namespace}/{pod.name}: annotations not written",
        )
        self.pods.written(
            pod.namespace, pod.name, getattr(getattr(written, "metadata", None), "resource_version", None)
        )

    async def release_held_lock(self, value: str, key: str = nodelock.NODE_LOCK) -> None:
        """Remove the lock ``key`` only while it still holds ``value`` (the value Allocate read):
        one atomic call, no read first. When the lock changed meanwhile (the scheduler already
        took it over for the next pod, which it does as soon as this pod's bind-phase is final),
        nothing is written and that is not an error."""
        try:
            await retry_transient(
                lambda: self.core.patch_node(
                    self.node_name,
                    nodelock.swap_patch(key, value, None),
                    _content_type="application/json-patch+json",
                    _request_timeout=API_TIMEOUT_S,
                ),
                f"node {self.node_name}: lock not released",
            )
        except ApiException as exc:
            if not nodelock.lost_swap(exc):
                raise

    async def release_lock(self, pod: PodView | None, attempts: int = 5) -> bool:
        """Remove the node lock if ``pod`` holds it (any lock when ``pod`` is None).

        Returns True when the lock is gone afterwards (or belonged to another pod and is left).
        """

        async def write(values: Mapping[str, str | None], rv: str) -> None:
            await self.patch_node_annotations(values, rv)

        owner = (pod.namespace, pod.name) if pod is not None else None
        return await nodelock.release(self.node_annotations, write, owner, attempts)
