"""The HTTP(S) server and the service that ties watches, leadership and handlers together.

Routes: ``POST /filter``, ``POST /bind``, ``POST /webhook``, ``GET /healthz`` (alive),
``GET /readyz`` (200 only once every watch has listed and, with leader election, while
leader).

Who may call what (docs/security.md): the ``--http_bind`` port (the one the Service exposes)
serves ``/webhook`` and the health checks to anyone; ``/filter`` and ``/bind`` are only for
kube-scheduler. With ``--extender-bind`` they are served on that loopback listener only (404 on
the ``--http_bind`` port); with ``--extender-client-ca`` the ``--http_bind`` port serves them to
a caller whose TLS client certificate that CA signed (403 without one; a certificate from any
other CA fails the handshake); with neither, ``--http_bind`` is a loopback address (checked by
the options).

A body that is not a JSON object (bad syntax, NaN/Infinity, nested deeper than
``MAX_DEPTH``, larger than ``MAX_BODY``: 413, slower than ``hami.serve.BODY_TIMEOUT``: 408) gets a 4xx
with one line; a JSON object with fields of the wrong type gets the protocol's answer: the
extender's ``Error`` field (HTTP 200, as kube-scheduler expects) or a denied AdmissionReview
(``status.code`` 400).

Slow clients cannot hold the server: both listeners are started by :func:`hami.serve.start`
(connection cap, request head and body deadlines, header limits, TLS certificate reload; the
rules are written there).

Webhook reviews cannot take the event loop from the health checks, Filter and Bind
(:class:`ReviewGate`): each review's work (parsing its body, the rules) runs one at a time and
gives the loop back after it; a body over ``WEBHOOK_HEAVY_BODY`` has a lane of its own, which
takes at most half the loop, with at most ``WEBHOOK_HEAVY_WAITING`` waiting; beyond them, 429 at
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from hami.core.shape import FAST_BUDGET, MAX_NODES, NODE, POD, ListOf, ShapeError, check, check_tree
from hami.kube.client import KubeClient, KubeError, encode_json
from hami.kube.reflector import Reflector
from hami.serve import ConnectionGuard, application, client_verified, read_body, start
from hami.webhook.admission import (
    AdmissionSettings,
    deny_answer,
    deny_review,
    is_claim_create,
    is_dry_run,
    is_pod_create,
    name_error,
    request_namespace,
    review_with_templates,
    uses_disable_control,
)
from hami.webhook.templates import SEEN_TTL_S, KnownTemplates, TemplateBudget

from .events import EventRecorder
from .extender import Extender
from .leader import LEASE_MARGIN, Leadership
from .metrics import SchedulerMetrics, snapshot_of
from .options import Options
from .state import ClusterState, handshake_value

log = logging.getLogger(__name__)
MAX_BODY = 4 << 20
MAX_DEPTH = 64  # JSON nesting (a Pod nests about 12 deep)
#: values in an AdmissionReview (object and oldObject): a pod the API server stores is at most
#: 1.5 MiB (etcd's request limit), tens of thousands of values unless written to attack
WEBHOOK_MAX_VALUES = FAST_BUDGET
FILTER_ARGS = {
    "Pod": POD,
    "pod": POD,
    "NodeNames": ListOf(str),
    "nodenames": ListOf(str),
    "Nodes": {"items": ListOf(NODE)},
    "nodes": {"items": ListOf(NODE)},
}
BIND_ARGS = {k: str for k in ("PodName", "podName", "PodNamespace", "podNamespace", "PodUID", "podUID", "Node", "node")}
MALFORMED_REGISTRATION = "MalformedRegistration"
#: a running pod's allocation annotation of some vendor cannot be read (ClusterState.unreadable)
UNREADABLE_GRANT = "UnreadableAllocation"
DRA_API = "/apis/resource.k8s.io/v1"  # Node event: its registration cannot be read
# the webhook's API calls, each bounded so that a namespace read and a template create fit well
# inside the webhook configuration's timeoutSeconds (10): the API server gets our denial, not its
# own timeout
NAMESPACE_READ_TIMEOUT = 4.0
TEMPLATE_POST_TIMEOUT = 4.0
#: a webhook body over this many bytes is a heavy review (:class:`ReviewGate`). Loop time grows
#: with the body: about 0.1-0.25 ms per KiB for real pods, 0.4-1.4 for bodies written to cost
#: (dense env entries, empty lists); a large real pod (4 containers of 60 env entries) is 24 KB,
#: and annotations, the usual bulk, are at most 256 KiB in all. A forged 1.8 MB review took 0.65 s
WEBHOOK_HEAVY_BODY = 256 << 10
#: heavy requests that may wait for their lane beside the one under review: with the slowest
#: review (200,000 values, about 0.8 s) and the lane's rest after each, the last is answered in
#: about 8 s, within the webhook's timeoutSeconds (10); the next gets 429 at once
WEBHOOK_HEAVY_WAITING = 4
#: seconds of loop light reviews may use back to back before they yield it (:class:`ReviewGate`)
WEBHOOK_LIGHT_SLICE = 0.005
#: seconds between two log lines about heavy reviews refused (a flood would write one per request)
WEBHOOK_REFUSAL_LOG_S = 60.0


class SchedulerService:
    """Everything ``hami scheduler`` runs. ``kube=None`` gives a cache-only service (benchmarks)."""

    def __init__(self, opts: Options, kube: KubeClient | None) -> None:
        self.opts = opts
        self.kube = kube
        self.state = ClusterState(opts.scheduler_config(), opts.scheduler_name, opts.node_selector)
        self.events = EventRecorder(
            kube,
            opts.scheduler_name,
            success=opts.success_events,
            success_rate=opts.success_event_rate,
            success_burst=opts.success_event_burst,
        )
        self.state.on_malformed = lambda node, message: self.events.record(
            node, MALFORMED_REGISTRATION, f"devices not scheduled: {message}", "Warning", involved="Node"
        )
        self.leader = Leadership(
            kube,
            opts.leader_elect,
            opts.lease_name,
            opts.lease_namespace,
            opts.identity,
            opts.pod_name,
            opts.pod_namespace,
            campaign=opts.leader_campaign,
        )
        self.metrics = SchedulerMetrics(lambda: snapshot_of(self.state), legacy=opts.legacy_metrics)
        # a running pod whose grant cannot be read: its node's devices of that vendor are held back
        self.state.on_unreadable_pod = lambda pod, message: self.events.record(
            pod, UNREADABLE_GRANT, message, "Warning"
        )
        self.metrics.count(
            "hami_scheduler_unreadable_allocations",
            "Running pods with an allocation annotation that cannot be read (their node's devices of "
            "that vendor take no new pod)",
            lambda: len(self.state.unreadable),
        )
        self.reflectors: list[Reflector] = []
        if kube is not None:
            self.reflectors = [
                Reflector(
                    kube, "/api/v1/nodes", _Touching(self.state.node_handler, self.metrics, "nodes"), name="nodes"
                ),
                Reflector(kube, "/api/v1/pods", _Touching(self.state.pod_handler, self.metrics, "pods"), name="pods"),
                Reflector(
                    kube,
                    "/api/v1/resourcequotas",
                    _Touching(self.state.quota_handler, self.metrics, "resourcequotas"),
                    name="resourcequotas",
                ),
                # the DRA front end's allocations (both front ends: quotas and the UI count them);
                # absent before Kubernetes v1.34 (resource.k8s.io/v1) or without the chart's RBAC
                Reflector(
                    kube,
                    f"{DRA_API}/resourceclaims",
                    _Touching(self.state.claim_handler, self.metrics, "resourceclaims"),
                    name="resourceclaims",
                    optional="DRA claims (driver gpu.hami.io) are not counted in quotas nor shown in the UI",
                ),
                Reflector(
                    kube,
                    f"{DRA_API}/resourceslices",
                    _Touching(self.state.slice_handler, self.metrics, "resourceslices"),
                    name="resourceslices",
                    optional="the UI does not show the GPUs the DRA front end publishes",
                ),
            ]
        self.extender = Extender(
            self.state,
            kube,
            self.events,
            is_ready=self.ready,
            lock_timeout=opts.node_lock_timeout,
            lock_retry_timeout=opts.node_lock_retry_timeout,
            decision_write=opts.decision_write,
            bind_timeout=opts.bind_timeout,
            lease_left=lambda: self.leader.time_left() + LEASE_MARGIN,
            term=lambda: self.leader.term,
        )
        self.leader.on_deposed.append(self.extender.drop_decisions)
        self.extender.acquire_lock = _timed_lock(self.extender.acquire_lock, self.metrics)
        self.admission = AdmissionSettings(
            self.state.vendors,
            opts.scheduler_name,
            opts.force_overwrite_default_scheduler,
            opts.disable_control_label,
            front_end=opts.front_end,
            hook_path=opts.gpu_hook_path,
        )
        # the DRA front end's templates created (or found) a moment ago: no POST per admission
        self.known_templates = KnownTemplates()
        # templates seen to exist lately (they need no creation budget) and the budget itself
        self.seen_templates = KnownTemplates(ttl=SEEN_TTL_S)
        self.template_budget = TemplateBudget()
        self._template_posts: dict[tuple[str, str], asyncio.Future[str]] = {}
        # how much of the event loop webhook reviews take (health checks, Filter and Bind share it)
        self.webhook_gate = ReviewGate()
        if self.reflectors:
            # a new term places pods only from a pod cache listed since it began (a follower's
            # watch may have missed the old leader's last Bindings unseen); before the resync
            self.leader.catch_up = self.catch_up
        self.leader.on_elected.append(self.resync)
        self.tasks: list[asyncio.Task] = []
        # set on SIGTERM, for --shutdown-delay: every answer then closes its connection, so the
        # API server's and kube-scheduler's pooled connections to this terminating pod drain while
        # it still serves, and their next calls open new ones, which the Service routes elsewhere
        self.draining = False
        self.binds_in_flight = 0  # /bind requests being answered (hand_over waits for them)

    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    def ready(self) -> bool:
        return self.synced() and self.leader.is_leader and self.leader.caught_up

    async def catch_up(self) -> None:
        """A new lease term (:attr:`Leadership.catch_up`): the pod cache lists again."""
        for r in self.reflectors:
            if r.name == "pods":
                await r.relist()

    # ------------------------------------------------------------------ leader pass
    async def resync(self) -> None:
        """Leader pass: node health re-check, handshake writes, stale lock release."""
        if not self.ready() or self.kube is None:
            return
        self.state.recheck_nodes()
        now = time.time()
        for name, node in list(self.state.nodes.items()):
            annotations = (node.get("metadata") or {}).get("annotations") or {}
            updates = {}
            for v in self.state.vendors:
                key = v.handshake_annotation
                if key and v.register_annotation in annotations and "Requesting" not in annotations.get(key, ""):
                    updates[key] = handshake_value(now)
            if updates:
                try:
                    self.state.put_node(
                        await self.kube.merge_patch(f"/api/v1/nodes/{name}", {"metadata": {"annotations": updates}})
                    )
                except KubeError as exc:
                    log.warning("node %s: handshake not written: %s", name, exc)
        await self.extender.sweep_locks()

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.opts.resync_interval)
            # in memory only, on every replica, before anything that can fail: a decision no Bind
            # came for gives its reservation back
            self.extender.expire_decisions()
            try:
                await self.resync()
                if not self.leader.is_leader:
                    await self.follower_pass()
            except Exception:  # noqa: BLE001 - the loop must survive one bad pass
                log.exception("leader pass failed")

    async def follower_pass(self) -> None:
        """What a replica that does not lead still does each resync: a lock value a failed Bind of
        ours left (the API server went away, and the Lease with it) names a pod still pending:
        live to every other replica until its expiry, so ours to remove, exactly it, leader or not
        (the leader's sweep does it too); so is one kept for a Binding that got no answer, once
        it can no longer land (review, 1 Dec: a lease lost meanwhile left it to its 5 min expiry,
        the node taking no GPU pod)."""
        if self.extender.kube is None:
            return
        await self.extender.release_owed()
        await self.extender.settle_unverified()

    async def _first_pass(self) -> None:
        await asyncio.gather(*(r.synced.wait() for r in self.reflectors))
        log.info(
            "caches synced: %d nodes with devices, %d pods holding devices, %d DRA claims (gpu.hami.io)",
            len(self.state.ledger.node_names()),
            len(self.state.ledger.pods()),
            len(self.state.claims),
        )
        await self.resync()

    def start_background(self) -> None:
        spawn = asyncio.get_running_loop().create_task
        self.tasks += [spawn(r.run()) for r in self.reflectors]
        if self.kube is not None:
            self.tasks += [
                spawn(self.events.run()),
                spawn(self.leader.run()),
                spawn(self._first_pass()),
                spawn(self._resync_loop()),
            ]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.tasks.clear()

    # ------------------------------------------------------------------ HTTP
    def app(self, webhook: bool = True, extender: bool = True, client_cert: bool = False) -> web.Application:
        """The routes. ``webhook=False``: the plain-HTTP loopback listener (extender only);
        ``extender=False``: no /filter or /bind (404), the https port beside a loopback listener;
        ``client_cert``: /filter and /bind answer 403 unless the TLS peer presented a verified
        client certificate (the listener's context must request one, :class:`hami.serve.CertReloader`)."""
        app = application(max_body=MAX_BODY)
        app.middlewares.append(self._drain)
        routes = [web.get("/healthz", self._healthz), web.get("/readyz", self._readyz)]
        if extender:
            guard = _client_cert_required if client_cert else (lambda handler: handler)
            routes += [web.post("/filter", guard(self._filter)), web.post("/bind", guard(self._bind))]
        if webhook:
            routes.append(web.post("/webhook", self._webhook))
        app.add_routes(routes)
        return app

    @web.middleware
    async def _drain(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """While draining (``self.draining``), answer with ``Connection: close``."""
        response = await handler(request)
        if self.draining:
            response.force_close()
        return response

    async def _json(self, request: web.Request, max_values: int = MAX_NODES) -> Any:
        return await read_json_object(request, max_values)

    async def _filter(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        began = time.perf_counter()
        try:
            check(body, FILTER_ARGS, "ExtenderArgs")
        except ShapeError as exc:
            answer = {"NodeNames": None, "FailedNodes": {}, "Error": str(exc)}
        else:
            if self.leader.stopping:
                answer = {"NodeNames": None, "FailedNodes": {}, "Error": _STOPPING}
            else:
                answer = await self.extender.filter(body)
        self.metrics.observe_filter(time.perf_counter() - began, *filter_outcome(answer))
        return self._extender_answer(answer)

    async def _bind(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        began = time.perf_counter()
        self.binds_in_flight += 1
        try:
            check(body, BIND_ARGS, "ExtenderBindingArgs")
        except ShapeError as exc:
            answer = {"Error": str(exc)}
        else:
            if self.leader.stopping:
                answer = {"Error": _STOPPING}
            elif self.extender.kube is None:  # a cache-only service (benchmarks) has nothing to bind with
                answer = {"Error": "this scheduler has no API server client: it cannot bind"}
            else:
                answer = await self.extender.bind(body)
        finally:
            self.binds_in_flight -= 1
        self.metrics.observe_bind(time.perf_counter() - began, "error" if answer.get("Error") else "bound")
        return self._extender_answer(answer)

    def _extender_answer(self, answer: Any) -> web.Response:
        """An answer to kube-scheduler. One that failed here because this replica does not lead
        closes its connection: with kube-scheduler in a pod of its own (calling through the
        Service), a kept-alive connection stays on the pod it first reached, and would keep
        landing on this follower after the leader's label moved."""
        response = _json_answer(answer)
        if answer.get("Error") and not self.leader.is_leader:
            response.force_close()
        return response

    async def hand_over(self, timeout: float) -> None:
        """Campaigning, at a stop (SIGTERM): lead no more from now on (Filter and Bind answer at
        once that this replica is stopping; a Bind that has not posted its Binding gives up), let
        the Binds already answering end (at most ``timeout``), then give the Lease up, so that a
        follower leads within a poll and the Service's leader label moves to it while this pod
        still serves the webhook through its shutdown delay. Following, kube-scheduler beside us
        hands over, and this does nothing."""
        if not (self.opts.leader_elect and self.opts.leader_campaign):
            return
        self.leader.stop_leading()
        deadline = time.monotonic() + timeout
        while self.binds_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.binds_in_flight:
            log.warning("%d Binds still running after %gs; giving the Lease up anyway", self.binds_in_flight, timeout)
        if self.extender.binding_may_land():
            # a Binding still in flight, or cut unanswered, may still be written: the next leader
            # must wait the lease duration (as after a crash), not place pods at once from a
            # ledger without it
            log.warning("a Binding of this replica may still land: the Lease is left to expire")
            await self.leader.release(give_up=False)
            return
        await self.leader.release()

    async def _webhook(self, request: web.Request) -> web.Response:
        """Anyone who reaches the port may call this (the API server does not authenticate itself
        to webhooks): names from the body reach an API URL only once checked (:func:`name_error`,
        a 400 denial otherwise), a dry run writes nothing, and templates are created only in a
        namespace that exists, within :class:`~hami.webhook.templates.TemplateBudget`. A body of
        more than ``WEBHOOK_MAX_VALUES`` values is refused (400) after the quick pass alone: no
        pod or claim the API server stores comes near it, and one of 4 MiB of empty lists (1.3
        million values) held this event loop, Filter and Bind with it, about 7 s (found by review).
        The parse and the rules run in turns of :attr:`webhook_gate` (:class:`ReviewGate`), never
        while an API call is awaited: 24 callers posting 1.8 MB reviews held the loop so that
        every /healthz probe timed out (found by review, 1 Dec)."""
        raw = await read_body(request)
        size = len(raw)
        with self.webhook_gate.admitted(size):
            async with self.webhook_gate.turn(size):
                body = await self._json(request, WEBHOOK_MAX_VALUES)  # (the body read above, kept)
                req = body.get("request") if isinstance(body.get("request"), dict) else {}
                pod = req.get("object") if isinstance(req.get("object"), dict) else {}
                claim = is_claim_create(req) and bool(pod)
                if (is_pod_create(req) or claim) and (bad := name_error(req, pod)) is not None:
                    return _json_answer(deny_review(body, bad, 400))  # before the name reaches any URL or record
                ns = request_namespace(req, pod)
                read_labels = self.kube is not None and is_pod_create(req) and bool(uses_disable_control(pod))
                reviewed = None if read_labels else self._review(body, req, pod, claim, ns, None)
            namespace: dict | None = None  # the namespace object, once read
            if reviewed is None:
                # the namespace is read between two turns: an API call holds no lane
                read = await self._read_namespace(ns)
                if isinstance(read, Denial):
                    return _json_answer(deny_review(body, read, read.code))
                namespace = read
                async with self.webhook_gate.turn(size):
                    reviewed = self._review(
                        body, req, pod, claim, ns, (namespace.get("metadata") or {}).get("labels") or {}
                    )
        answer, templates = reviewed
        # a dry run (kubectl --dry-run=server) persists nothing: the patch names the templates a
        # real create would make (content-named), none is written
        if templates and not is_dry_run(req):
            refused = await self._create_templates(ns, templates, namespace)
            if refused:
                answer = deny_answer(answer, refused, getattr(refused, "code", 500))
        return _json_answer(answer)

    def _review(
        self, body: dict, req: dict, pod: Any, claim: bool, ns: str, labels: Any
    ) -> tuple[dict, tuple[dict, ...]]:
        """The rules (read_json_object walked the whole body, depth, size, NaN: the pod's tree is
        not walked again). No await in here: a claim's quota check and its count are one step."""
        if claim:
            self.state.expire_admitted(time.monotonic())
        answer, templates = review_with_templates(
            body,
            self.admission,
            labels,
            self.state.claim_room if claim else self.state.pod_room,
            tree_checked=True,
            gpu_room=self.state.gpu_count_room,
        )
        if claim and (answer.get("response") or {}).get("allowed") and not is_dry_run(req):
            # counted now, before any other admission runs (no await since the check): claims
            # created at the same moment cannot pass the quota together
            meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
            self.state.admit_claim(
                {**pod, "metadata": {**meta, "namespace": ns}}, time.monotonic(), self.admission.vendors
            )
        return answer, templates

    async def _read_namespace(self, ns: str) -> dict | Denial:
        """The namespace object (``ns`` was checked by :func:`name_error`), or why it cannot be
        read: every failure (API error, connection, timeout) is a denial naming the read."""
        assert self.kube is not None
        what = f"cannot read namespace {ns!r}"
        try:
            obj = await asyncio.wait_for(self.kube.get(f"/api/v1/namespaces/{ns}"), NAMESPACE_READ_TIMEOUT)
        except KubeError as exc:
            if exc.status == 404:
                return Denial(f"namespace {ns!r} not found", 404)
            log.warning("namespace %s unreadable: %s", ns, exc)
            return Denial(f"{what}: {exc}", 500)
        except (asyncio.TimeoutError, OSError, aiohttp.ClientError) as exc:
            reason = _transport_failure(exc, NAMESPACE_READ_TIMEOUT)
            log.warning("namespace %s unreadable: %s", ns, reason)
            return Denial(f"{what}: {reason}", 500)
        if not isinstance(obj, dict):
            return Denial(f"{what}: the API server answered {type(obj).__name__}, not an object", 500)
        return obj

    async def _create_templates(self, namespace: str, templates: tuple[dict, ...], ns_obj: dict | None = None) -> str:
        """Create the DRA front end's ResourceClaimTemplates (content-named: one that exists is the
        same); '' when all exist, else why not (a :class:`Denial`; the pod is then denied,
        nothing half-applied). A template created or found moments ago is not sent again
        (:mod:`hami.webhook.templates`); admissions that need the same unknown template at once
        share one POST. Before any POST the namespace must exist and not be terminating
        (``ns_obj``: already read for this admission)."""
        if self.kube is None:
            return "the webhook has no API server client: it cannot create ResourceClaimTemplates"
        checked = False
        for t in templates:
            name = t["metadata"]["name"]
            if self.known_templates.known(namespace, name, time.monotonic()):
                continue
            if not checked:
                if ns_obj is None:
                    read = await self._read_namespace(namespace)
                    if isinstance(read, Denial):
                        return read
                    ns_obj = read
                if ((ns_obj or {}).get("status") or {}).get("phase") == "Terminating":
                    return Denial(
                        f"namespace {namespace!r} is terminating: no ResourceClaimTemplate is created in it", 403
                    )
                checked = True
            key = (namespace, name)
            pending = self._template_posts.get(key)
            if pending is None:
                pending = asyncio.ensure_future(self._post_template(namespace, t))
                self._template_posts[key] = pending
                pending.add_done_callback(lambda _f, key=key: self._template_posts.pop(key, None))
            failure = await asyncio.shield(pending)
            if failure:
                return failure
        return ""

    async def _post_template(self, namespace: str, template: dict) -> str:
        assert self.kube is not None
        name = template["metadata"]["name"]
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
        body = {**template, "metadata": {**template["metadata"], "namespace": namespace}}
        # a template seen to exist lately costs no budget (a 409, or its re-creation if deleted)
        free = self.seen_templates.known(namespace, name, time.monotonic())
        if not free and not self.template_budget.take(namespace, time.monotonic()):
            log.warning("ResourceClaimTemplate %s/%s: over the creation budget", namespace, name)
            return Denial(
                f"cannot create ResourceClaimTemplate {namespace}/{name}: too many new ResourceClaimTemplates "
                f"lately in namespace {namespace!r} or in all (at most {self.template_budget.burst:g} at once, "
                f"then one every {1 / self.template_budget.per_s:g} s); retry later",
                429,
            )
        try:
            await asyncio.wait_for(
                self.kube.request("POST", path, [("fieldValidation", "Strict")], body), TEMPLATE_POST_TIMEOUT
            )
        except KubeError as exc:
            if not free:  # the API server answered: nothing was created
                self.template_budget.give_back(namespace, time.monotonic())
            if exc.status != 409:
                log.warning("ResourceClaimTemplate %s/%s: %s", namespace, name, exc)
                return Denial(f"cannot create ResourceClaimTemplate {namespace}/{name}: {exc}", 500)
        except (asyncio.TimeoutError, OSError, aiohttp.ClientError) as exc:
            # no answer: it may have been created, so the token is not given back
            reason = _transport_failure(exc, TEMPLATE_POST_TIMEOUT)
            log.warning("ResourceClaimTemplate %s/%s: %s", namespace, name, reason)
            return Denial(f"cannot create ResourceClaimTemplate {namespace}/{name}: {reason}", 500)
        now = time.monotonic()
        self.known_templates.exists(namespace, name, now)
        self.seen_templates.exists(namespace, name, now)
        return ""

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        """200 once the watches have listed, leader or not; the body says which. Readiness does
        not follow leadership: a follower that is never Ready stalls a rolling update (the new pod
        waits for the lease the old one keeps) and ``helm install --wait`` with two replicas. The
        Service reaches the leader through its ``hami.io/scheduler-role`` label instead."""
        if not self.synced():
            return web.Response(status=503, text="caches not synced")
        if not self.leader.is_leader:
            return web.Response(text=f"ok: follower ({self.opts.identity} does not hold the lease)")
        if not self.leader.caught_up:  # (for a moment after an election: Filter and Bind wait)
            return web.Response(text="ok: leader, catching up with the API server before it places pods")
        return web.Response(text="ok" if not self.opts.leader_elect else "ok: leader")


class ReviewGate:
    """How much of the event loop webhook reviews take. ``/webhook`` answers anyone, and a
    review's work (its body parsed, the rules) runs on the loop that also answers ``/healthz``,
    ``/readyz``, Filter and Bind: 24 callers posting forged 1.8 MB reviews (0.65 s of loop each)
    made every probe time out, so readiness and then liveness failed (found by review, 1 Dec).

    Each review takes a :meth:`turn` in its lane, one at a time; light reviews yield the loop
    once they used ``WEBHOOK_LIGHT_SLICE`` of it back to back, a heavy one after each, so what
    came in meanwhile (probes, Filter, Bind) runs between them. A body over
    ``heavy_body`` bytes goes in the heavy lane, which rests after each review as long as it took
    (heavy reviews take at most half the loop) and admits (:meth:`admitted`) at most ``waiting``
    requests beside the one under review; the next gets HTTP 429 at once, its body not parsed.
    The light lane refuses nothing: a burst of real pods waits its turn."""

    def __init__(self, heavy_body: int = WEBHOOK_HEAVY_BODY, waiting: int = WEBHOOK_HEAVY_WAITING) -> None:
        self.heavy_body, self.waiting = heavy_body, waiting
        self.heavy_admitted = 0  # heavy requests under review, waiting for their turn, or between turns
        self.refused = 0  # heavy requests answered 429, since the start
        self._lanes = (asyncio.Lock(), asyncio.Lock())  # light, heavy
        self._logged_at = -WEBHOOK_REFUSAL_LOG_S
        self._logged_count = 0
        self._light_used = 0.0  # seconds of loop light reviews used since they last yielded

    def heavy(self, size: int) -> bool:
        return size > self.heavy_body

    @contextlib.contextmanager
    def admitted(self, size: int) -> Iterator[None]:
        """Hold a heavy request's place from its arrival to its answer's last review step (a
        light one needs none); HTTP 429 when ``waiting`` are already there beside one under review."""
        if not self.heavy(size):
            yield
            return
        if self.heavy_admitted > self.waiting:
            self.refused += 1
            self._log_refusal()
            raise web.HTTPTooManyRequests(
                text=f"AdmissionReview body of {size} bytes refused: over {self.heavy_body} bytes, it waits "
                f"for a heavy review turn, and {self.heavy_admitted} are already under review or waiting "
                f"(at most {self.waiting} wait); retry\n",
                headers={"Retry-After": "1"},
            )
        self.heavy_admitted += 1
        try:
            yield
        finally:
            self.heavy_admitted -= 1

    @contextlib.asynccontextmanager
    async def turn(self, size: int) -> Any:
        """One review's work, alone in its lane (put no await in it that waits on the network).
        After it the loop is yielded; a heavy lane then rests as long as the review took, so that
        what came in meanwhile is answered before the next heavy review starts (one yield is not
        enough: a request needs a loop pass to be read and another to be answered), and heavy
        reviews take at most half the loop whatever their number."""
        heavy = self.heavy(size)
        took = 0.0
        async with self._lanes[heavy]:
            began = time.perf_counter()
            try:
                yield
            finally:
                took = time.perf_counter() - began
                if heavy:
                    await asyncio.sleep(took)
        if not heavy:
            # light reviews run back to back until they used WEBHOOK_LIGHT_SLICE of the loop, then
            # yield, the lane let go first: yielding after each, the lane held, a review took two
            # loop passes at least, and 500 ordinary reviews beside 20 ms of other loop work
            # waited 11 s at the median, past the webhook's timeout (regression review, 1 Dec)
            self._light_used += took
            if self._light_used >= WEBHOOK_LIGHT_SLICE:
                self._light_used = 0.0
                await asyncio.sleep(0)

    def _log_refusal(self) -> None:
        now = time.monotonic()
        if now - self._logged_at >= WEBHOOK_REFUSAL_LOG_S:
            log.warning(
                "webhook: %d AdmissionReviews over %d bytes refused (429) since the last such line: "
                "%d heavy reviews under way or waiting is the most (a flood of large bodies?)",
                self.refused - self._logged_count,
                self.heavy_body,
                self.waiting + 1,
            )
            self._logged_at, self._logged_count = now, self.refused


class Denial(str):
    """Why the webhook denies a pod, with the AdmissionReview status code to answer."""

    code: int

    def __new__(cls, message: str, code: int = 500) -> "Denial":
        self = super().__new__(cls, message)
        self.code = code
        return self


def _transport_failure(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return f"no answer from the API server within {timeout:g} s"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


async def read_json_object(request: web.Request, max_values: int = MAX_NODES) -> dict:
    """The request body as a JSON object of at most ``max_values`` values, or an HTTP 4xx with
    one line saying why."""
    raw = await read_body(request)
    try:
        body = orjson.loads(raw)  # the fast path; what it refuses is read again below, for the reason
    except orjson.JSONDecodeError:
        body = _slow_json(raw)
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text=f"request body must be a JSON object, got {type(body).__name__}")
    try:
        check_tree(body, "request body", max_depth=MAX_DEPTH, max_nodes=max_values)
    except ShapeError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    return body


_STOPPING = "this hami scheduler replica is stopping and leads no more; the next leader places the pod"


def _json_answer(answer: Any) -> web.Response:
    """The answer as JSON (a lone surrogate a request carried, e.g. a uid an AdmissionReview
    answer repeats, is escaped: :func:`~hami.kube.client.encode_json`)."""
    return web.Response(body=encode_json(answer), content_type="application/json")


def _slow_json(raw: bytes) -> Any:
    """``json`` on a body orjson refused: the error worded for the caller (NaN, nesting, bad
    bytes), or the value where only orjson refuses it (e.g. a lone surrogate escape)."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise web.HTTPBadRequest(text=f"request body is nested more than {MAX_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise web.HTTPBadRequest(text=f"request body is not JSON: {str(exc)[:200]}") from None


def filter_outcome(answer: dict) -> tuple[str, list[str]]:
    """``(outcome, reason codes)`` of an extender Filter answer, for the metrics."""
    if answer.get("Error"):
        return "error", []
    if answer.get("NodeNames") or (answer.get("Nodes") or {}).get("items"):
        return "scheduled", []
    texts = list((answer.get("FailedNodes") or {}).values()) + list(
        (answer.get("FailedAndUnresolvableNodes") or {}).values()
    )
    return "unschedulable", sorted({code for t in texts for code in reason_codes(t)})


def reason_codes(text: str) -> list[str]:
    """Codes in a HAMi reason string: ``"1/8 CardInsufficientMemory, 7/8 CardTypeMismatch"``; a
    node-level reason is printed bare (``NodeInsufficientDevice``, ``node unregistered``)."""
    out = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        head, _, rest = item.partition(" ")
        out.append(rest if "/" in head and head.replace("/", "").isdigit() and rest else item)
    return out


class _Touching:
    """A reflector handler that also records when its watch last delivered something."""

    def __init__(self, handler: Any, metrics: SchedulerMetrics, resource: str) -> None:
        self.handler, self.metrics, self.resource = handler, metrics, resource

    def replace(self, items: list[dict], resource_version: str | None = None) -> None:
        self.metrics.cache_touched(self.resource)
        self.handler.replace(items, resource_version)

    def apply(self, event_type: str, obj: dict) -> None:
        self.metrics.cache_touched(self.resource)
        self.handler.apply(event_type, obj)


def _client_cert_required(handler: Any) -> Any:
    async def guarded(request: web.Request) -> web.StreamResponse:
        if not client_verified(request):
            raise web.HTTPForbidden(
                text=f"{request.path} is only for kube-scheduler: present a client certificate "
                f"signed by the scheduler's --extender-client-ca\n"
            )
        return await handler(request)

    return guarded


def _timed_lock(acquire: Any, metrics: SchedulerMetrics) -> Any:
    async def timed(node: str, ns: str, name: str, *spec: Any) -> str:
        began = time.perf_counter()
        try:
            value = await acquire(node, ns, name, *spec)
        except BaseException:
            metrics.observe_lock_wait(time.perf_counter() - began, "timeout")
            raise
        metrics.observe_lock_wait(time.perf_counter() - began, "acquired")
        return value

    return timed


async def serve(
    service: SchedulerService,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    webhook: bool = True,
    extender: bool = True,
    client_cert: bool = False,
    guard: ConnectionGuard | None = None,
) -> web.AppRunner:
    return await start(
        service.app(webhook, extender, client_cert), host, port, ssl_context=ssl_context, guard=guard, backlog=1024
    )
