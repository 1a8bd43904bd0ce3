"""``/filter`` and ``/bind`` (the kube-scheduler extender protocol, §5.1, §5.3, §5.8).

Filter takes the decision with the same core entry point as ``hami simulate``
(:func:`hami.core.schedule_pod`, after the same admission defaults), reserves it in the ledger
and answers. Where the decision is written depends on ``decision_write``: ``"binding"`` (the
default) keeps it in memory until Bind, whose Binding carries the allocation annotations (the
API server copies them onto the pod in the write that sets ``spec.nodeName``; a decision no Bind
comes for expires with its reservation); ``"filter"`` is HAMi's way, a pod patch in the
background, whose failure rolls the reservation back, and which Bind waits for.
Bind takes the node locks the pod's vendors declare (``hami.io/mutex.lock`` for most,
Cambricon's ``cambricon.com/dsmlu.lock``; :func:`hami.kube.nodelock.vendor_locks`) and creates
the Binding (which also sets ``bind-phase=allocating`` and ``bind-time``); a Bind with no
decision of this replica's for that node needs one recorded on the pod (else it fails and the
pod is filtered again); every failure releases the lock, except a Binding
error after which the pod turns out bound to the node (success) or cannot be read (kept); a
Binding the API server refused (4xx, the pod verifiably not bound there) also gives back the
decision's reservation. A Bind for a pod already bound (a repeated Bind) writes nothing: success
when bound to that node. On a node whose agent injects each container's grant at creation
(``hami.io/node-injection: nri``) a pod asking for NVIDIA GPUs only binds without any lock, and
Filter never counts that node busy for it (:func:`hami.kube.nodelock.lockless`); there the
Binding also completes the allocation (``bind-phase=success``, ``*-devices-to-allocate``
emptied: no device plugin step remains, so the pod takes no write after its Binding).
Requests and answers use the Go field names kube-scheduler sends (``Pod``,
``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``, ``PodName``, ``Node``, ``Error``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

from hami.core import CoreError, admit_pod, filter_pod, pod_request, rebuild, schedule_pod
from hami.core.codec import encode_pod_devices
from hami.core.names import BIND_PHASE, BIND_TIME
from hami.core.requests import ordered_containers
from hami.core.reasons import NodeFailure, Reason
from hami.core.refuse import MemoryCeilings
from hami.kube import nodelock
from hami.kube.client import KubeClient, KubeError, node_path, pod_path
from hami.kube.revision import newer_than

from .events import EventRecorder
from .options import DECISION_WRITES
from .retries import RetryAnswers, candidates_digest
from .state import VGPU_NODE, ClusterState

log = logging.getLogger(__name__)

#: codes no eviction can cure on their own (the GPU's model, UUID, health or cordon; a node
#: without a registration, or one the node selector leaves out); a refusal's ``final`` flag (fewer
#: devices than a container asks that it could ever use: type, UUID, health, memory in all, on one
#: NUMA node under numa-bind) says the same for the others
UNRESOLVABLE = frozenset(
    {
        Reason.CARD_TYPE_MISMATCH,
        Reason.CARD_UUID_MISMATCH,
        Reason.CARD_NOT_HEALTH,
        Reason.CARD_CORDONED,
        Reason.NODE_UNREGISTERED,
        Reason.NODE_LABEL_SELECTOR_MISMATCH,
    }
)


class NotPending(Exception):
    """A Filter for a pod that does not exist (by UID), is not ours or is not pending."""


class DecisionMissing(Exception):
    """Bind for a pod whose Filter decision is not recorded on it."""


class DecisionRefused(DecisionMissing):
    """decision_write "filter": the pod is no longer the pending pod the decision was taken for
    (bound meanwhile, being deleted, or re-created under its name), so its patch was not made."""


#: decision_write "filter": how many times a decision patch refused for a stale resourceVersion
#: (the pod changed since the copy it was built from) is made again on the pod read anew
DECISION_PATCH_TRIES = 3


@dataclass(frozen=True)
class _Decision:
    key: str  # the ledger key of the reservation
    node: str
    annotations: dict[str, str]
    made: float  # time.monotonic() of the Filter
    term: Any = None  # the leadership term it was taken in (Extender.term)
    allocation: Any = None  # the reservation itself (the ledger holds this very object until it ends)


def _refused(exc: BaseException) -> bool:
    """The API server answered the request with a refusal (4xx): nothing of it was applied."""
    return isinstance(exc, KubeError) and exc.status is not None and 400 <= exc.status < 500


class LeadershipLost(Exception):
    """The lease went elsewhere (or the caches were lost) while the Bind waited for a lock: the new
    leader does not know this replica's decision, so writing its Binding could book a share twice."""


class BindingUnverified(OSError):
    """The Binding failed and re-reading the pod failed too: it may be bound, so its locks stay.
    ``until``: the time.monotonic() past which the API server can no longer write it (None:
    unknown, :data:`CUT_BINDING_LIVES` from now)."""

    def __init__(self, message: str, until: float | None = None) -> None:
        super().__init__(message)
        self.until = until


class LeaseCut(Exception):
    """The Binding POST was still running where this replica's leadership ends (plus its margin):
    it is no longer waited for, and may still land (the Bind's locks stay)."""


class BindDeadline(Exception):
    """The Bind ran past its deadline (:attr:`Extender.bind_timeout`, below kube-scheduler's
    extender ``httpTimeout``): kube-scheduler has given up on it, so no Binding is posted."""


#: the longest server-side timeout a Binding POST asks for (``?timeout=``, whole seconds;
#: kube-apiserver caps the request's context at it, or at its own --request-timeout when lower).
#: Each POST asks for less when less is left of this replica's leadership or of the Bind's
#: deadline (:meth:`Extender._binding_timeout`)
BINDING_SERVER_TIMEOUT_S = 45
#: how long past the timeout it asked for a Binding that got no answer is still taken to be
#: possibly written (a write already handed to etcd when the request's context ended)
BINDING_LAND_SLACK = 15.0
#: the longest a Binding that got no clear answer may still be written by the API server (one
#: that asked for the longest timeout), whatever --request-timeout a cluster raised
CUT_BINDING_LIVES = BINDING_SERVER_TIMEOUT_S + BINDING_LAND_SLACK

#: the whole Bind's default deadline when the lock retry timeout is shorter: below kube-scheduler's
#: default extender ``httpTimeout`` (30 s, the chart's ``scheduler.extenderHTTPTimeout``)
BIND_TIMEOUT = 28.0


#: one row per distinct refusal: (reason text, reason codes, unresolvable, nodes in ``failed``'s order)
Rows = list[tuple[str, tuple[str, ...], bool, list[str]]]


def render_failures(failed: Mapping[str, NodeFailure]) -> Rows:
    """``failed`` grouped by refusal, each rendered once: a pending pod's nodes mostly refuse it
    alike (thousands of ``"8/8 CardInsufficientMemory"``), often as one shared object."""
    by_id: dict[int, tuple[NodeFailure, list[str]]] = {}
    for node, f in failed.items():
        got = by_id.get(id(f))
        if got is None:
            got = by_id[id(f)] = (f, [])
        got[1].append(node)
    rows: dict[tuple, tuple[str, tuple[str, ...], bool, list[str]]] = {}
    for f, nodes in by_id.values():
        key = (f.total, f.counts, f.bare, f.final)
        row = rows.get(key)
        if row is None:
            codes = f.codes()
            hopeless = f.final or (bool(codes) and set(codes) <= UNRESOLVABLE)
            rows[key] = (f.render(), tuple(c.value for c in codes), hopeless, nodes)
        else:
            row[3].extend(nodes)
    return list(rows.values())


def failed_maps(failed: Mapping[str, NodeFailure], rows: Rows | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """``(FailedNodes, FailedAndUnresolvableNodes)``: a node whose every refusal code is in
    :data:`UNRESOLVABLE` (type/UUID mismatches, unhealthy or cordoned GPUs, no registration, left
    out by the node selector), too few devices and too little memory on every device the pod
    could use (a ``final`` refusal) cannot be resolved by preemption, so kube-scheduler should
    not try. ``rows``: ``render_failures(failed)`` when at hand."""
    resolvable: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    for text, _, hopeless, nodes in render_failures(failed) if rows is None else rows:
        (unresolvable if hopeless else resolvable).update(dict.fromkeys(nodes, text))
    return resolvable, unresolvable


def failure_summary(failed: Mapping[str, NodeFailure], rows: Rows | None = None) -> list[str]:
    """One line per reason: ``"3 nodes CardInsufficientMemory(n1,n2,n3)"`` (HAMi's event text)."""
    by_reason: dict[str, list[str]] = {}
    for _, codes, _, nodes in render_failures(failed) if rows is None else rows:
        for code in codes:
            by_reason.setdefault(code, []).extend(nodes)
    return [f"{len(nodes)} nodes {code}({','.join(sorted(nodes))})" for code, nodes in sorted(by_reason.items())]


def _error(message: str) -> dict:
    return {"NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


class Extender:
    def __init__(
        self,
        state: ClusterState,
        kube: KubeClient | None,
        events: EventRecorder,
        *,
        is_ready: Callable[[], bool] = lambda: True,
        ready_changed: Callable[[], asyncio.Event] | None = None,
        lock_timeout: float = 300.0,
        lock_retry_timeout: float = 28.0,
        ready_wait: float = 10.0,
        handoff_grace: float = 1.0,
        clock=time.time,
        record: bool = True,
        decision_write: str = "binding",
        decision_ttl: float = 300.0,
        busy_wait: float = 10.0,
        bind_timeout: float | None = None,
        lease_left: Callable[[], float] = lambda: math.inf,
        term: Callable[[], Any] = lambda: None,
    ) -> None:
        self.state = state
        # the leadership term being led (hami.scheduler.leader.Leadership.term): a decision is
        # bound only in the term it was taken in
        self.term = term
        # seconds a write may still land as this replica's (its leadership's deadline, plus part
        # of the margin before another replica can take over): the Binding POST is cut there
        self.lease_left = lease_left
        self.kube = kube
        self.events = events
        self.is_ready = is_ready
        self.ready_changed = ready_changed
        self.lock_timeout = lock_timeout
        self.lock_retry_timeout = lock_retry_timeout
        self.ready_wait = ready_wait
        # one deadline for the whole Bind, from its request on: kube-scheduler stops waiting at
        # its extender httpTimeout (aiohttp does not cancel a handler whose client went away), and
        # a Binding posted after that books a pod kube-scheduler has already put back in its
        # queue. Default: the lock retry timeout (which the docs keep below httpTimeout), at least
        # BIND_TIMEOUT (a retry timeout of 0 means "do not wait for a busy lock", not "no time").
        self.bind_timeout = max(lock_retry_timeout, BIND_TIMEOUT) if bind_timeout is None else bind_timeout
        # how long a Bind waits for the device plugin's own release of a lock whose owner has
        # finished (bind-phase success/failed) before taking it over with a compare-and-swap
        self.handoff_grace = handoff_grace
        self.clock = clock
        self.record = record  # False: decisions stay in the ledger only (benchmarks, no API server)
        self._node_locks: dict[str, asyncio.Lock] = {}
        self._recording: dict[str, asyncio.Task] = {}  # "ns/name" -> decision patch in flight
        # decision_write "binding": a Filter decision is written by the Binding (the API server
        # copies a Binding's annotations onto the pod in the write that sets spec.nodeName); until
        # then it lives here and as a reservation in the ledger. "filter": HAMi's pod patch.
        if decision_write not in DECISION_WRITES:
            raise ValueError(f"decision_write: expected one of {DECISION_WRITES}, got {decision_write!r}")
        self.decision_write = decision_write
        self.decision_ttl = decision_ttl  # an unbound decision older than this is dropped
        self._decisions: dict[str, _Decision] = {}  # "ns/name" -> decision waiting for its Bind
        # "ns/name" -> (node, time.monotonic() of the Filter): pods placed by this replica whose
        # allocation has not finished (no Bind yet, Bind under way, or bound and waiting for the
        # device plugin); their nodes' locks are, or are about to be, taken (busy_nodes)
        self._in_flight: dict[str, tuple[str, float]] = {}
        # how long a Filter waits, when every node that fits is busy, for one to be free (below
        # kube-scheduler's extender timeout; then it answers the least busy one)
        self.busy_wait = busy_wait
        # binds in flight on a node from which it counts as busy: one is fine (a Bind waits for one
        # handoff at most, and pods arriving one after the other keep binpack's order), more queue
        self.queue_depth = 2
        self._ceilings = MemoryCeilings()  # marks refusals no eviction cures
        # unschedulable answers, given again to kube-scheduler's retries while nothing they read
        # has changed (hami.scheduler.retries)
        self.retries = RetryAnswers()
        self._finished_seen: set[tuple[str, str, str]] = set()  # (node, key, value) a sweep left for the plugin
        # lock values a failed Bind wrote and could not remove (the API server was unreachable):
        # removed by the next sweep, exactly that value (a retried Bind writes a new one)
        self._owed_releases: set[tuple[str, str, str]] = set()  # (node, key, value)
        # time.monotonic() until which a Binding POST that got no clear answer (cut where the lease
        # ended, timed out, reset) may still be written by the API server
        self._lands_until = 0.0
        self._posting = 0  # Binding POSTs in flight
        # Binds under way (until None), and Bindings that got no clear answer and may still be
        # written (until: time.monotonic() past which they cannot): (ns/name, pod uid) -> (node,
        # until). A Filter of such a pod is refused: it replaced the reservation, and the late
        # Binding then took a share given to another pod (found by review, 1 Dec). Keyed by uid
        # too: a late Bind of a deleted pod of the same name neither reads nor replaces the entry
        self._binding: dict[tuple[str, str], tuple[str, float | None]] = {}
        # the locks such a Binding keeps: (node, key, value) -> (namespace, name, until); the
        # sweep removes each (that value only) once ``until`` passed and the pod is not bound there
        self._may_land: dict[tuple[str, str, str], tuple[str, str, float]] = {}
        # vendor name -> its declared lock (checked once here: a bad lock_format fails at start)
        self._vendor_locks = {v.name: nodelock.vendor_lock(v) for v in state.vendors}
        self._lock_specs = list({s.key: s for s in self._vendor_locks.values() if s is not None}.values())
        self.stats = {
            "filter": 0,
            "filter_refused": 0,
            "bind": 0,
            "lock_waits": 0,
            "lock_reclaims": 0,
            "lock_handoffs": 0,
            "bind_lockless": 0,
            "filter_retry_answered": 0,
        }

    async def _wait_ready(self, until: float | None = None) -> bool:
        deadline = time.monotonic() + self.ready_wait
        if until is not None:
            deadline = min(deadline, until)
        while not self.is_ready():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(0.1, left))
        return True

    # ------------------------------------------------------------------ filter
    async def filter(self, args: Mapping[str, Any]) -> dict:
        pod = args.get("Pod") or args.get("pod")
        if not isinstance(pod, dict) or not (pod.get("metadata") or {}).get("name"):
            return _error("ExtenderArgs.Pod is missing or has no metadata.name")
        names = args.get("NodeNames", args.get("nodenames"))
        nodes = args.get("Nodes", args.get("nodes"))
        if names is None and nodes:
            return self._simulate(pod, (nodes or {}).get("items") or [])
        if not await self._wait_ready():
            return _error(
                "hami scheduler is not ready (caches not synced or catching up after an election, or this replica is not the leader)"
            )
        term = self.term()
        self.stats["filter"] += 1
        try:
            pod = await self.pending_pod(pod)
        except NotPending as exc:
            self.stats["filter_refused"] += 1
            log.info("Filter refused, nothing reserved: %s", exc)
            return _error(f"{exc}; nothing is reserved")
        ref = f"{(pod['metadata'].get('namespace') or 'default')}/{pod['metadata']['name']}"
        if (why := self._binding_open(ref, pod["metadata"].get("uid") or "")) is not None:
            self.stats["filter_refused"] += 1
            return _error(f"pod {ref}: {why}; its reservation stands, nothing new is decided")
        self._decisions.pop(ref, None)  # a re-filter replaces the decision (schedule_pod drops its reservation)
        self._in_flight.pop(ref, None)
        uid, rv = pod["metadata"]["uid"], pod["metadata"].get("resourceVersion")
        digest = candidates_digest(names or [])
        if rv is not None:
            again = self.retries.get(uid, self._answer_version(rv, digest))
            if again is not None:
                self.stats["filter_retry_answered"] += 1
                return self._unschedulable(pod, *again)
        try:
            admitted, _ = admit_pod(pod, self.state.vendors)
            wanted = self._wanted(admitted)
            result = await self._decide(admitted, names or [], wanted)
        except CoreError as exc:
            self.events.record(pod, "FilteringFailed", str(exc), "Warning")
            return _error(str(exc))
        except NotPending as exc:
            self.stats["filter_refused"] += 1
            return _error(f"{exc}; nothing is reserved")
        if not result.needs_devices:
            return {"NodeNames": list(names or []), "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        refusals = result.failed
        if result.node is None:  # kube-scheduler may try preemption: say where it cannot help
            refusals = self._ceilings.mark(refusals, result.pod, self.state.ledger, self.state.vendors)
            rows = render_failures(refusals)
            lines = failure_summary(refusals, rows) or ["no candidate node"]
            if rv is not None:  # the ledger as this answer read it (nothing awaited since)
                self.retries.put(uid, self._answer_version(rv, digest), rows, lines)
            return self._unschedulable(pod, rows, lines)
        if not self.is_ready() or self.term() != term:
            # the Lease moved while this Filter read the pod or waited for a busy node: the Bind
            # goes to the next leader, which never saw this decision, so none is kept here
            self.state.restore_pod(result.allocation.key, *ref.split("/", 1))
            return _error("this hami scheduler replica lost the lease while the Filter ran; nothing is reserved")
        self.retries.forget(uid)
        rows = render_failures(refusals)
        failed, unresolvable = failed_maps(refusals, rows)
        if not self._lockless(result.node, wanted):  # a lockless bind never queues: not in flight
            self._in_flight[ref] = (result.node, time.monotonic())
        if self.record:
            if self.decision_write == "filter":
                self._start_recording(pod, result)
            else:
                self._decisions[ref] = _Decision(
                    result.allocation.key,
                    result.node,
                    dict(result.annotations),
                    time.monotonic(),
                    term,
                    result.allocation,
                )
        self.events.record(pod, "FilteringSucceed", lambda: _fit_message(result, len(set(names or ()))))
        return {
            "NodeNames": [result.node],
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }

    def _binding_open(self, ref: str, uid: str) -> str | None:
        """Why the pod ``ref`` (of ``uid``) may not be decided again now: a Bind of it is under
        way, or its Binding got no clear answer and the API server may still write it (until its
        request timeout, :data:`CUT_BINDING_LIVES`); None when neither."""
        entry = self._binding.get((ref, uid))
        if entry is None:
            return None
        node, until = entry
        if until is None:
            return f"a Bind of it to node {node} is under way"
        left = until - time.monotonic()
        if left <= 0:
            del self._binding[(ref, uid)]
            return None
        return (
            f"its Binding to node {node} got no clear answer and the API server may still write it "
            f"(for {left:.0f}s more)"
        )

    def _answer_version(self, rv: Any, digest: tuple[int, int]) -> tuple[Any, ...]:
        """What an unschedulable answer read (:mod:`hami.scheduler.retries`): the pod's version,
        the ledger's, the node selector's (the nodes it leaves out) and the candidates'."""
        return (rv, self.state.ledger.generation(), self.state.unselected_generation, *digest)

    def _unschedulable(self, pod: Mapping[str, Any], rows: Rows, lines: Sequence[str]) -> dict:
        """The answer for a pod that fits nowhere: each node's refusal, those no preemption
        cures apart, and one ``FilteringFailed`` event line per reason (a repeat raises the
        count of the event already written, :class:`~hami.scheduler.events.EventRecorder`)."""
        failed, unresolvable = failed_maps({}, rows)
        for line in lines:
            self.events.record(pod, "FilteringFailed", line, "Warning")
        return {"NodeNames": [], "FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}

    async def _decide(self, pod: dict, names: list[str], wanted: frozenset[str] = frozenset()) -> Any:
        """``schedule_pod`` with the busy nodes last (``queue_depth`` or more binds in flight there);
        when the only nodes that fit are busy, wait
        (up to ``busy_wait``) for an allocation in flight to finish and decide again: a Bind sent
        to a busy node waits for every bind ahead of it on that node, and past kube-scheduler's
        timeout it fails (a ``FailedScheduling`` event for a pod that fits). kube-scheduler
        filters one pod at a time, so this also keeps it from running far ahead of the binds.
        A node where this pod binds without the lock (``wanted``: its vendors; :meth:`_lockless`)
        is never busy for it: its Bind waits for nobody."""
        meta = pod["metadata"]
        ns, name, uid = meta.get("namespace") or "default", meta["name"], meta.get("uid")
        deadline = time.monotonic() + self.busy_wait
        while True:
            busy = {
                n: c for n, c in self.busy_nodes().items() if c >= self.queue_depth and not self._lockless(n, wanted)
            }
            result = schedule_pod(
                pod,
                names,
                self.state.ledger,
                self.state.config,
                self.clock(),
                busy=busy,
                outside=self.state.unselected,
            )
            left = deadline - time.monotonic()
            if result.node is None or result.node not in busy or left <= 0:
                return result
            await self.state.pod_finished(min(left, 1.0))
            cached = self.state.pod(ns, name)
            if cached is None or (cached.get("metadata") or {}).get("uid") != uid:
                self.state.ledger.remove_pod(result.allocation.key)
                raise NotPending(f"pod {ns}/{name} went away while its Filter waited for a node")

    def busy_nodes(self) -> dict[str, int]:
        """Nodes a Bind would have to wait on now, with how many binds are in flight there: the
        nodes of this replica's placed pods whose allocation has not finished (Filter decided,
        Bind under way, or bound and not yet marked by the device plugin), and the nodes whose
        lock names a pod the cache does not show finished. Filter offers them only when no other
        node fits (each of those binds holds the node lock until the plugin marks its pod, so a
        pod sent there waits for all of them, and past the retry timeout its Bind fails). Pods
        seen finished or gone, and entries older than the lock timeout, are dropped here."""
        now = time.monotonic()
        busy: dict[str, int] = {}
        for ref, (node, since) in list(self._in_flight.items()):
            ns, name = ref.split("/", 1)
            pod = self.state.pod(ns, name)
            if pod is None or nodelock.finished(pod) or now - since > self.lock_timeout:
                del self._in_flight[ref]
                continue
            busy[node] = busy.get(node, 0) + 1
        for node in self.state.locked_nodes:
            if node in busy:
                continue
            annotations = ((self.state.nodes.get(node) or {}).get("metadata") or {}).get("annotations") or {}
            for spec in self._lock_specs:
                holder = spec.holder(annotations.get(spec.key))
                owner = self.state.pod(holder.namespace, holder.name) if holder is not None else None
                if owner is not None and not nodelock.finished(owner):
                    busy[node] = 1
        return busy

    async def pending_pod(self, sent: Mapping[str, Any]) -> dict:
        """The API server's copy of the pod a Filter names, which must exist with the UID sent,
        name this scheduler and be pending (no ``spec.nodeName``, not being deleted, not
        finished); raises NotPending otherwise. The watch cache answers when it holds that UID,
        else one GET (a pod newer than the watch, or one the cache does not keep). The decision
        is taken on this copy, not on what the request says: a Filter can reserve capacity
        only for a real pod, as its own spec asks, one reservation per pod (keyed by UID)."""
        meta = sent.get("metadata") or {}
        ns, name, uid = meta.get("namespace") or "default", meta["name"], meta.get("uid")
        if not uid or not isinstance(uid, str):
            raise NotPending(f"ExtenderArgs.Pod {ns}/{name} has no metadata.uid")
        pod = self.state.pod(ns, name)
        if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
            try:
                pod = await self._get_pod(ns, name)
            except (KubeError, OSError, asyncio.TimeoutError) as exc:
                raise NotPending(f"pod {ns}/{name} cannot be read to check that it exists: {exc}") from exc
            if pod is None:
                raise NotPending(f"pod {ns}/{name} (UID {uid}) does not exist")
            real = (pod.get("metadata") or {}).get("uid")
            if real != uid:
                raise NotPending(f"pod {ns}/{name} has UID {real}, not {uid}")
            if self.state.was_deleted(uid):
                # its deletion came through the watch while the GET was answered: a reservation
                # now would be dropped by nothing but a Bind or the decision's expiry
                raise NotPending(f"pod {ns}/{name} (UID {uid}) was deleted")
            self.state.put_pod(pod)
        spec = pod.get("spec") or {}
        if spec.get("schedulerName") != self.state.scheduler_name:
            raise NotPending(
                f"pod {ns}/{name} is for scheduler {spec.get('schedulerName')!r}, not {self.state.scheduler_name!r}"
            )
        if spec.get("nodeName"):
            raise NotPending(f"pod {ns}/{name} is already bound to node {spec['nodeName']}")
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            raise NotPending(f"pod {ns}/{name} is being deleted")
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            raise NotPending(f"pod {ns}/{name} has finished ({phase})")
        return pod

    # The decision patch runs in the background: Filter answers as soon as the decision is
    # reserved in the ledger (kube-scheduler calls Filter for one pod at a time, so an API round
    # trip here would cap throughput at 1/RTT). Bind waits for the patch and fails when it
    # failed; a failed patch rolls the reservation back. Patches for one pod are chained, so a
    # re-filter's patch always lands after the previous one.
    def _start_recording(self, pod: Mapping[str, Any], result: Any) -> None:
        meta = pod["metadata"]
        ref = f"{meta.get('namespace') or 'default'}/{meta['name']}"
        previous = self._recording.get(ref)
        task = asyncio.get_running_loop().create_task(self._record(pod, result, previous))
        self._recording[ref] = task

        def done(t: asyncio.Task, ref: str = ref) -> None:
            if self._recording.get(ref) is t:
                del self._recording[ref]
            if not t.cancelled():
                t.exception()  # retrieved here; Bind reports it

        task.add_done_callback(done)

    async def _record(self, pod: Mapping[str, Any], result: Any, previous: asyncio.Task | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        meta = pod["metadata"]
        ns = meta.get("namespace") or "default"
        try:
            await self._record_decision(meta, result.annotations, result.node)
        except (KubeError, OSError, asyncio.TimeoutError, DecisionRefused) as exc:
            key = result.allocation.key
            if self.state.ledger.is_reserved(key) and self.state.ledger.pod(key) == result.allocation:
                self.state.restore_pod(key, ns, meta["name"])
            ref = f"{ns}/{meta['name']}"
            if self._recording.get(ref) is asyncio.current_task():
                # no Bind will take a lock for this decision: its node is not busy for it (a
                # later Filter of the pod has its own recording task and its own entry)
                self._in_flight.pop(ref, None)
            msg = f"cannot record the decision on pod {ns}/{meta['name']}: {exc}"
            log.warning("%s; reservation rolled back", msg)
            self.events.record(pod, "FilteringFailed", msg, "Warning")
            raise

    async def decision_recorded(self, namespace: str, name: str) -> None:
        """Wait for the pod's pending decision patch, if any; raises what the patch raised."""
        task = self._recording.get(f"{namespace}/{name}")
        if task is not None:
            await asyncio.shield(task)

    async def _record_decision(self, meta: Mapping[str, Any], annotations: Mapping[str, str], node: str) -> None:
        """Patch the decision onto the pod, only while it is the pending pod it was taken for: the
        patch names the resourceVersion of the copy checked (the cache's, when newer than the one
        Filter read: an earlier patch of this pod), so the API server refuses it (409) on a pod
        changed since; the pod is then read again (the cache learns it) and, still pending, patched
        at that version. A cache that lagged a Binding (a late one, a new leader's watch) let
        Filter decide again for a bound pod: written, its grant named another node's GPUs while
        it ran on the first, whose share the ledger then counted free."""
        ns, name, uid = meta.get("namespace") or "default", meta["name"], meta.get("uid")
        term = self.term()
        pod: Mapping[str, Any] = {"metadata": meta}
        cached = self.state.pod(ns, name)
        if cached is not None and (cached.get("metadata") or {}).get("uid") == uid:
            if newer_than((cached.get("metadata") or {}).get("resourceVersion"), meta.get("resourceVersion")):
                pod = cached
        for _ in range(DECISION_PATCH_TRIES):
            self._still_pending(pod, ns, name, uid)
            rv = (pod.get("metadata") or {}).get("resourceVersion")
            body: dict[str, Any] = {"annotations": dict(annotations), "labels": {VGPU_NODE: node}}
            if rv:
                body["resourceVersion"] = rv
            try:
                patched = await self.kube.merge_patch(pod_path(ns, name), {"metadata": body})
            except KubeError as exc:
                if exc.status != 409 or not rv:
                    raise
                fresh = await self._get_pod(ns, name)
                if fresh is None:
                    raise DecisionRefused(f"pod {ns}/{name} was deleted; its decision is not written") from exc
                if (fresh.get("metadata") or {}).get("uid") == uid:
                    self.state.put_pod(fresh)  # (what the cache lagged, e.g. the Binding)
                if not self.is_ready() or self.term() != term:
                    # the next leader may have written its own decision since: ours must not replace it
                    raise DecisionRefused(
                        f"this replica lost the lease; the decision for {ns}/{name} is not written"
                    ) from exc
                pod = fresh
                continue
            self.state.put_pod(patched)
            return
        self._still_pending(pod, ns, name, uid)
        raise KubeError(
            "PATCH", pod_path(ns, name), 409, f"the pod changed under {DECISION_PATCH_TRIES} decision patches in a row"
        )

    @staticmethod
    def _still_pending(pod: Mapping[str, Any], ns: str, name: str, uid: Any) -> None:
        """Raise DecisionRefused unless ``pod`` is the pending pod ``uid`` a decision was taken for."""
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if meta.get("uid") != uid:
            raise DecisionRefused(
                f"pod {ns}/{name} is now UID {meta.get('uid')}, not {uid}; its decision is not written"
            )
        if spec.get("nodeName"):
            raise DecisionRefused(
                f"pod {ns}/{name} is already bound to node {spec['nodeName']}; the decision is not written"
            )
        if meta.get("deletionTimestamp"):
            raise DecisionRefused(f"pod {ns}/{name} is being deleted; its decision is not written")

    def _simulate(self, pod: dict, nodes: list) -> dict:
        """``Nodes`` given (nodeCacheCapable false / Cluster Autoscaler): read-only, zero usage (§5.11)."""
        try:
            ledger, _ = rebuild(nodes, [], self.state.vendors)
            admitted, _ = admit_pod(pod, self.state.vendors)
            result = filter_pod(admitted, None, ledger, self.state.config, self.clock())
        except CoreError as exc:
            return {"Nodes": None, "FailedNodes": {}, "Error": str(exc)}
        by_name = {(n.get("metadata") or {}).get("name"): n for n in nodes}
        if not result.needs_devices:
            return {"Nodes": {"items": nodes}, "FailedNodes": {}, "Error": ""}
        failed, unresolvable = failed_maps(result.failed)
        chosen = [by_name[result.node]] if result.node else []
        return {
            "Nodes": {"items": chosen},
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }

    # ------------------------------------------------------------------ bind
    async def bind(self, args: Mapping[str, Any]) -> dict:
        ns = args.get("PodNamespace") or args.get("podNamespace") or "default"
        name = args.get("PodName") or args.get("podName") or ""
        uid = args.get("PodUID") or args.get("podUID") or ""
        node = args.get("Node") or args.get("node") or ""
        if not name or not node:
            return {"Error": f"ExtenderBindingArgs needs PodName and Node (got {name!r}, {node!r})"}
        deadline = time.monotonic() + self.bind_timeout  # kube-scheduler's clock started before ours
        if not await self._wait_ready(deadline):
            return {
                "Error": "hami scheduler is not ready (caches not synced or catching up after an election, or this replica is not the leader)"
            }
        self.stats["bind"] += 1
        try:
            pod = self.state.pod(ns, name) or await self._within(
                deadline, f"reading pod {ns}/{name}", self._get_pod, ns, name
            )
        except (KubeError, OSError, asyncio.TimeoutError, BindDeadline) as exc:
            msg = f"binding pod {ns}/{name} to node {node} failed: pod {ns}/{name} cannot be read: {exc}"
            # nothing taken, nothing dropped: kube-scheduler retries the pod
            about = {"metadata": {"name": name, "namespace": ns, **({"uid": uid} if uid else {})}}
            self.events.record(about, "BindingFailed", msg, "Warning")
            return {"Error": msg}
        if pod is None:
            self._forget_missing(ns, name, uid)
            return {"Error": f"pod {ns}/{name} not found"}
        meta, bound_to = pod.get("metadata") or {}, (pod.get("spec") or {}).get("nodeName")
        if bound_to and (not uid or meta.get("uid") == uid):
            # A Bind repeated after one that landed: the lock is not written again (that replaced
            # the value of a lock the device plugin was allocating under, so its release by value
            # missed and the lock stayed), nor a second Binding posted.
            if bound_to != node:
                return {"Error": f"pod {ns}/{name} is already bound to node {bound_to}, not {node}"}
            log.info("pod %s/%s: already bound to node %s; nothing to do", ns, name, node)
            return {"Error": ""}
        ref, pod_uid = f"{ns}/{name}", uid or str(meta.get("uid") or "")
        if (why := self._binding_open(ref, pod_uid)) is not None:
            return {"Error": f"binding pod {ref} to node {node} refused: {why}"}
        key = (ref, pod_uid)
        mine = self._binding[key] = (node, None)
        try:
            answer, may_land = await self._bind(pod, ns, name, uid, node, deadline)
        finally:
            if self._binding.get(key) is mine:
                del self._binding[key]
        if may_land is not None:
            self._binding[key] = (node, may_land)
        return answer

    async def _bind(
        self, pod: dict, ns: str, name: str, uid: str, node: str, deadline: float
    ) -> tuple[dict, float | None]:
        """The Bind proper: its answer, and when its Binding got no clear answer, the
        time.monotonic() until which the API server may still write it (else None)."""
        taken: list[tuple[nodelock.LockSpec, str]] = []
        decision = None
        posted = False  # the Binding was sent (an error after it may be the API server's refusal)
        may_land: float | None = None
        try:
            decision = self._take_decision(ns, name, node, uid)
            if decision is None:
                # (the decision patch itself goes on: decision_recorded shields it)
                await self._within(deadline, "waiting for the decision patch", self.decision_recorded, ns, name)
                if self._requests_devices(pod):
                    await self._within(deadline, "checking the decision", self._check_decision, ns, name, node)
            wanted = self._wanted(pod)
            done: dict[str, str] = {}
            if self._lockless(node, wanted):
                self.stats["bind_lockless"] += 1
                done = self._allocation_done(pod, wanted)
            else:
                for spec in nodelock.vendor_locks(self.state.vendors, wanted):
                    # (positional: server.py wraps acquire_lock, passing positional arguments on)
                    taken.append((spec, await self.acquire_lock(node, ns, name, spec, deadline)))
            self._check_still_leading(decision)
            self._check_still_reserved(decision, node)
            if time.monotonic() >= deadline:  # each step above has its own API timeout
                raise BindDeadline(self._past_deadline("before its Binding was posted"))
            posted = True
            # bind-phase and bind-time (and, with decision_write "binding", the whole decision)
            # ride on the Binding: the API server copies a Binding's annotations onto the pod in
            # the same write that sets spec.nodeName (HAMi patches the pod first: a write more per
            # pod, and a window where a bound pod has no bind-phase).
            annotations = {**(decision.annotations if decision else {}), **done}
            await self._post_binding(ns, name, uid, node, annotations, deadline)
        except (
            KubeError,
            nodelock.LockContention,
            DecisionMissing,
            LeadershipLost,
            BindDeadline,
            OSError,
            asyncio.TimeoutError,
        ) as exc:
            if isinstance(exc, BindingUnverified):
                # it may be bound: the locks stay until the Binding can no longer land, and no
                # Filter decides the pod again meanwhile (a retried Bind re-takes its own lock)
                may_land = exc.until if exc.until is not None else time.monotonic() + CUT_BINDING_LIVES
                for spec, value in taken:
                    self._may_land[(node, spec.key, value)] = (ns, name, may_land)
                taken = []
            if not isinstance(exc, BindingUnverified):
                self._in_flight.pop(f"{ns}/{name}", None)  # no lock of its own held any more
            if decision is not None and posted and _refused(exc):
                # the API server answered no (and the pod is verifiably not bound here): nothing
                # of this decision is real, its reservation goes at once
                self._drop_reservation(f"{ns}/{name}", decision)
            elif decision is not None and decision.term != self.term() and not isinstance(exc, BindingUnverified):
                # the term ended during the Bind (LeadershipLost): nothing will bind it now
                self._drop_reservation(f"{ns}/{name}", decision)
            elif decision is not None:
                # still reserved: kube-scheduler filters the pod again (which replaces it), else
                # it expires like any decision no Bind came for
                self._decisions.setdefault(f"{ns}/{name}", decision)
            for spec, value in reversed(taken):
                await self._release_quietly(node, ns, name, spec, value)
            msg = f"binding pod {ns}/{name} to node {node} failed: {exc}"
            if isinstance(exc, nodelock.LockContention):  # the holder for the log only (not events)
                log.info("%s (the lock holds %r)", msg, exc.value)
            self.events.record(pod, "BindingFailed", msg, "Warning")
            return {"Error": msg}, may_land
        self.events.record(pod, "BindingSucceed", f"Successfully binding node [{node}] to {ns}/{name}")
        return {"Error": ""}, None

    def _check_still_leading(self, decision: "_Decision | None") -> None:
        """Raise LeadershipLost unless this replica still leads in the term ``decision`` was taken
        in: a lock wait can outlast the lease (a rolling update's handover), and a replica led
        again under a new term while it waited (for a node lock, the decision patch) may find the
        decision's shares given out by another replica meanwhile."""
        if not self.is_ready():
            raise LeadershipLost("this replica lost the lease while the Bind waited; the new leader places the pod")
        if decision is not None and decision.term != self.term():
            raise LeadershipLost("the lease term this pod was decided in ended while the Bind waited; filter it again")

    def _check_still_reserved(self, decision: "_Decision | None", node: str) -> None:
        """Raise DecisionMissing when ``decision``'s reservation on ``node`` is gone from the
        ledger while the Bind waited (dropped by an expiry or a relist): posting it would place
        the pod on shares that may be another pod's now."""
        if decision is None:
            return
        held = self.state.ledger.pod(decision.key)
        if (
            held is None
            or held.node != node
            or not self.state.ledger.is_reserved(decision.key)
            or (decision.allocation is not None and held is not decision.allocation)
        ):
            raise DecisionMissing(f"the reservation on node {node} was dropped while the Bind waited; filter it again")

    def _past_deadline(self, when: str) -> str:
        return (
            f"the Bind's deadline ({self.bind_timeout:g}s, below kube-scheduler's extender httpTimeout) "
            f"passed {when}; kube-scheduler has given up on it"
        )

    async def _within(self, deadline: float, what: str, step: Callable[..., Any], *a: Any) -> Any:
        """``await step(*a)``, cut at ``deadline`` (BindDeadline). Only for steps a cancel leaves
        nothing half done by: reads, and waits that shield what they wait for."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise BindDeadline(self._past_deadline(f"before {what}"))
        try:
            return await asyncio.wait_for(step(*a), left)
        except asyncio.TimeoutError as exc:
            if time.monotonic() < deadline:
                raise  # the step's own timeout (an API request's)
            raise BindDeadline(self._past_deadline(f"while {what}")) from exc

    def _forget_missing(self, ns: str, name: str, uid: str) -> None:
        """A Bind for a pod that does not exist: give back this replica's own unwritten decision
        for that ns/name, when the UID sent (if any) is the decision's. Nothing else is dropped:
        the UID comes from the request, and the ledger entries of real pods follow the watch."""
        ref = f"{ns}/{name}"
        decision = self._decisions.get(ref)
        if decision is None or (uid and decision.key != uid):
            return
        del self._decisions[ref]
        self._in_flight.pop(ref, None)
        if self.state.ledger.is_reserved(decision.key):
            self.state.restore_pod(decision.key, ns, name)
            log.info("pod %s: gone before its Bind: reservation on %s dropped", ref, decision.node)

    def _drop_reservation(self, ref: str, decision: _Decision) -> None:
        """Give back the reservation of ``decision`` (its Binding was refused), unless a newer
        Filter of the pod replaced it meanwhile (that one stays)."""
        if ref in self._decisions:
            return  # a re-filter while the Binding was in flight: its decision and reservation stand
        held = self.state.ledger.pod(decision.key)
        if held is not None and held.node == decision.node and self.state.ledger.is_reserved(decision.key):
            ns, name = ref.split("/", 1)
            self.state.restore_pod(decision.key, ns, name)
            log.info("pod %s: Binding to %s refused: reservation dropped", ref, decision.node)

    def _take_decision(self, ns: str, name: str, node: str, uid: str = "") -> "_Decision | None":
        """This replica's unwritten decision for the pod, when it is for ``node`` and still
        reserved in the ledger (else None: the decision must then be on the pod already). With
        the Bind's ``uid``, only that pod's: a late Bind of a deleted pod took the decision of
        the pod created again under its name, and its refusal dropped that reservation."""
        ref = f"{ns}/{name}"
        decision = self._decisions.get(ref)
        if decision is None or decision.node != node or (uid and decision.key != uid):
            return None  # (kept: it expires with its reservation unless a re-filter replaces it)
        del self._decisions[ref]
        held = self.state.ledger.pod(decision.key)
        if held is None or held.node != node or not self.state.ledger.is_reserved(decision.key):
            return None
        if decision.term != self.term():
            # an earlier term's (on_deposed did not run: a caller without Leadership): another
            # replica may have placed pods on its shares meanwhile
            self.state.restore_pod(decision.key, ns, name)
            return None
        return decision

    def drop_decisions(self) -> int:
        """This replica's term ended (:attr:`hami.scheduler.leader.Leadership.on_deposed`): its
        unwritten decisions will never be bound (kube-scheduler beside it exited with the Lease;
        otherwise the next Bind goes to the new leader), so their reservations go now rather than
        at their expiry (a follower's ledger feeds its webhook's quota check, and one elected again
        must not count shares for Binds that never come), and nodes stop counting busy for them.
        A Bind already under way took its decision out first. Returns how many were dropped."""
        dropped, self._decisions = self._decisions, {}
        self._in_flight.clear()  # (locks actually held still make their nodes busy: busy_nodes)
        for ref, decision in dropped.items():
            if self.state.ledger.is_reserved(decision.key):
                ns, name = ref.split("/", 1)
                self.state.restore_pod(decision.key, ns, name)
        if dropped:
            log.info("leadership term ended: %d unbound Filter decisions and their reservations dropped", len(dropped))
        return len(dropped)

    def expire_decisions(self, now: float | None = None) -> int:
        """Drop decisions no Bind came for within ``decision_ttl`` (kube-scheduler gave up on
        the pod, or the pod was deleted before Filter saw it), with their reservations: the
        ledger goes back to what the cached pod says. Returns how many were dropped."""
        now = time.monotonic() if now is None else now
        old = [ref for ref, d in self._decisions.items() if now - d.made > self.decision_ttl]
        for ref in old:
            decision = self._decisions.pop(ref)
            self._in_flight.pop(ref, None)
            if self.state.ledger.is_reserved(decision.key):
                ns, name = ref.split("/", 1)
                log.info(
                    "pod %s: no Bind within %.0fs of its Filter decision (node %s): reservation dropped",
                    ref,
                    self.decision_ttl,
                    decision.node,
                )
                self.state.restore_pod(decision.key, ns, name)
        return len(old)

    async def _post_binding(
        self,
        ns: str,
        name: str,
        uid: str,
        node: str,
        decision: Mapping[str, str] | None = None,
        deadline: float | None = None,
    ) -> None:
        """Create the Binding. When the POST fails (timeout, reset connection, a 409 because an
        earlier try did bind) the pod is read again: bound to ``node`` counts as success;
        raises the error when it is verifiably not bound there, BindingUnverified when the
        read fails too. The POST gets what is left of ``deadline`` (the Bind's); the read after
        it is not cut (it tells whether the locks may go, and posts nothing). The API server is
        asked to give the write up where this replica's leadership ends (:meth:`_binding_timeout`)."""
        asked = self._binding_timeout(deadline, time.monotonic())

        def lands_until() -> float:
            # past this, a Binding unanswered cannot land: the API server counts ``asked`` from
            # when the request reached it, at the latest now (not from when it was queued here:
            # a wait for a pooled connection ate the slack; regression review, 1 Dec)
            return time.monotonic() + asked + BINDING_LAND_SLACK

        self._posting += 1
        try:
            await self._posted_by(
                deadline,
                self.kube.post(
                    f"{pod_path(ns, name)}/binding?timeout={asked}s",
                    {
                        "apiVersion": "v1",
                        "kind": "Binding",
                        "metadata": {
                            "name": name,
                            "namespace": ns,
                            **({"uid": uid} if uid else {}),
                            "annotations": {
                                BIND_PHASE: "allocating",
                                **(decision or {}),
                                BIND_TIME: str(int(self.clock())),
                            },
                        },
                        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                    },
                ),
            )
        except LeaseCut as exc:
            # no read can tell: the API server may still write the Binding it received
            until = lands_until()
            self._may_still_land(until)
            raise BindingUnverified(str(exc), until) from exc
        except (KubeError, OSError, asyncio.TimeoutError, BindDeadline) as exc:
            until = lands_until()  # taken when the POST ended (the read after it posts nothing)
            try:
                pod = await self._get_pod(ns, name)
            except (KubeError, OSError, asyncio.TimeoutError) as again:
                if not _refused(exc):
                    self._may_still_land(until)
                raise BindingUnverified(f"{exc}; cannot tell whether it is bound: {again}", until) from exc
            meta = (pod or {}).get("metadata") or {}
            if pod is None or (uid and meta.get("uid") != uid) or (pod.get("spec") or {}).get("nodeName") != node:
                if pod is None or (uid and meta.get("uid") != uid) or _refused(exc):
                    raise  # refused, or its pod is gone: it will never be written
                # no answer (cut, timed out, a 5xx): the API server may write the Binding after
                # this read (found by review, 1 Dec: the locks released here were taken by the
                # next pod, and the late Binding left this one allocating under that pod's lock)
                self._may_still_land(until)
                raise BindingUnverified(
                    f"{exc}; the pod is not bound yet, but the API server may still write the Binding", until
                ) from exc
            log.info("pod %s/%s: the Binding answered %s, but the pod is bound to %s: success", ns, name, exc, node)
            self.state.put_pod(pod)
        finally:
            self._posting -= 1

    def _binding_timeout(self, deadline: float | None, now: float) -> int:
        """The ``?timeout=`` (whole seconds) a Binding POST sent at ``now`` asks for: at most
        :data:`BINDING_SERVER_TIMEOUT_S`, what is left of this replica's leadership
        (:attr:`lease_left`) and of the Bind's ``deadline``; at least 1 (0 is "no timeout").
        Found by review (1 Dec): a fixed 45 s let the API server write a Binding long after another
        replica, 15 s after the last renewal, had taken the Lease and given its share out again."""
        left = min(float(BINDING_SERVER_TIMEOUT_S), self.lease_left())
        if deadline is not None:
            left = min(left, deadline - now)
        return max(1, math.floor(left))

    def _may_still_land(self, until: float) -> None:
        self._lands_until = max(self._lands_until, until)

    def binding_may_land(self) -> bool:
        """A Binding POST is in flight, or one that got no clear answer (cut where this replica's
        leadership ended, timed out, reset) may still be written by the API server: while so, the
        Lease must not be given up early (the next leader would place pods from a ledger without
        it at once, not a lease duration later)."""
        return self._posting > 0 or time.monotonic() < self._lands_until

    async def _posted_by(self, deadline: float | None, post: Any) -> None:
        """Await the Binding POST ``post``, cut at ``deadline`` (BindDeadline: it may have landed)
        or where this replica's leadership ends (:attr:`lease_left`, read again as the POST runs,
        so renewals extend it; LeaseCut): a Binding sent just before the leader's deadline on a
        slow API server must not be waited for past it, since another replica, which never saw
        this decision, may then place pods on the same shares."""
        task = asyncio.ensure_future(post)
        lease_end = time.monotonic() + self.lease_left()
        try:
            while True:
                now = time.monotonic()
                if self.is_ready():  # still leading: a renewal since moves the end on
                    lease_end = max(lease_end, now + self.lease_left())
                end = lease_end if deadline is None else min(deadline, lease_end)
                if end <= now:
                    if deadline is not None and deadline <= now:
                        raise BindDeadline(self._past_deadline("while its Binding was in flight"))
                    raise LeaseCut("this replica's leadership ended while its Binding was in flight: it may still land")
                done, _ = await asyncio.wait({task}, timeout=min(end - now, 1.0))
                if done:
                    task.result()
                    return
        finally:
            if not task.done():
                task.cancel()

    def _allocation_done(self, pod: Mapping[str, Any], wanted: frozenset[str]) -> dict[str, str]:
        """What a lockless Bind (:meth:`_lockless`) writes beside the decision: on such a node no
        device plugin step remains (the node's agent gives each container its grant from
        ``*-devices-allocated`` at creation, as often as the container is created), so the
        allocation is complete with the Binding: ``bind-phase: success`` and every asked vendor's
        ``*-devices-to-allocate`` emptied (one empty entry per container, init ones included),
        the end state the agent wrote before in a pod write of its own."""
        empty = encode_pod_devices([() for _ in ordered_containers(pod)])
        keys = {v.to_allocate_annotation for v in self.state.vendors if v.name in wanted and v.to_allocate_annotation}
        return {BIND_PHASE: "success", **{key: empty for key in sorted(keys)}}

    def _requests_devices(self, pod: Mapping[str, Any]) -> bool:
        try:
            return pod_request(pod, self.state.vendors).has_devices
        except CoreError:
            return False

    async def _check_decision(self, ns: str, name: str, node: str) -> None:
        """The pod must carry our decision for ``node`` (e.g. a Filter answered by a replica that
        died before its patch landed): otherwise the device plugin would find nothing to allocate."""
        pod = self.state.pod(ns, name)
        if ((pod or {}).get("metadata", {}).get("annotations") or {}).get(VGPU_NODE) == node:
            return
        pod = await self._get_pod(ns, name)
        placed = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(VGPU_NODE)
        if placed != node:
            raise DecisionMissing(
                f"pod {ns}/{name} carries no decision for node {node} "
                f"({VGPU_NODE}={placed!r}); it will be filtered again"
            )

    def _wanted(self, pod: Mapping[str, Any]) -> frozenset[str]:
        """The vendors whose devices the pod asks for (empty when it asks for none or cannot be read)."""
        try:
            req = pod_request(pod, self.state.vendors)
        except CoreError:
            return frozenset()
        # every container counts (HAMi: regular ones only): the device plugin finds the pod
        # through the lock, whichever container asks first
        return frozenset(r.vendor for c in req.containers for r in c.requests)

    def _lockless(self, node: str | None, wanted: frozenset[str]) -> bool:
        """A Bind of a pod asking for ``wanted`` on ``node`` takes no lock: the node's agent gives
        each container its grant at creation (``hami.io/node-injection: nri``, as the cache shows
        the node) and the pod asks for nothing else (docs/scheduler.md, Bind)."""
        return node is not None and nodelock.lockless(self.state.nodes.get(node), wanted)

    async def _get_pod(self, ns: str, name: str) -> dict | None:
        if self.kube is None:  # a cache-only service (benchmarks): the cache is all there is
            return None
        try:
            return await self.kube.get(pod_path(ns, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def _owner(self, value: str, spec: nodelock.LockSpec = nodelock.HAMI_LOCK, fresh: bool = False) -> Any:
        lock = spec.holder(value)
        if lock is None:
            return None
        pod = None if fresh else self.state.pod(lock.namespace, lock.name)
        if pod is None:
            pod = await self._get_pod(lock.namespace, lock.name)
            if pod is not None:
                self.state.put_pod(pod)
        return nodelock.MISSING if pod is None else pod

    async def _stale_reason(
        self, value: str, node: str, spec: nodelock.LockSpec, swap: Mapping[str, Any] | None = None
    ) -> str | None:
        """Why the lock ``value`` on ``node`` may be taken over (None: live). A cached owner that
        looks placed or bound elsewhere is read again first: the cache may lag (a pod bound
        here and still ``allocating`` must keep its lock, the device plugin finds it by it)."""
        now = datetime.fromtimestamp(self.clock(), timezone.utc)
        expiry = spec.expiry(self.lock_timeout)
        holder = spec.holder(value)
        cached = self.state.pod(holder.namespace, holder.name) if holder is not None else None
        owner = await self._owner(value, spec)
        if isinstance(owner, Mapping) and self.state.lock_predates(node, spec.key, value, owner):
            # a StatefulSet's pod deleted while it held the lock and re-created at once: the new
            # pod, pending, only shares the name (it blocked the node until the lock's expiry)
            return "the lock was held by a deleted pod of the same name (re-created since)"
        why = nodelock.stale_reason(value, node, now, expiry, owner)
        if why is None or cached is None:
            return why  # live, or just read from the API server
        if nodelock.finished(owner):
            # Final once seen, except with a swap at once (no grace for the cache to catch up):
            # the lock names no UID, so a cached finished copy may be an earlier pod of the same
            # name while the lock is its successor's, still allocating. A copy newer than the node
            # copy showing the lock was written after the lock (a predecessor's last write
            # precedes its successor's creation, and so the lock): it is the holder's.
            again = swap is not None and not newer_than(
                (owner.get("metadata") or {}).get("resourceVersion"),
                (swap.get("metadata") or {}).get("resourceVersion"),
            )
        else:
            # placed or bound elsewhere by the cache's word: true only if the owner's state says so
            again = nodelock.stale_reason(value, node, now, expiry, None) is None
        if not again:
            return why
        return nodelock.stale_reason(value, node, now, expiry, await self._owner(value, spec, fresh=True))

    async def _node(self, name: str, fresh: bool) -> dict:
        node = None if fresh else self.state.nodes.get(name)
        if node is None:
            node = await self.kube.get(node_path(name))
            self.state.put_node(node)
        return node

    @contextlib.asynccontextmanager
    async def _guard(self, guard: asyncio.Lock, node: str, until: float | None) -> AsyncIterator[None]:
        """Hold ``guard`` (this replica's Binds on one node lock, one at a time); the wait for it
        ends at ``until`` (the Bind's deadline: BindDeadline) when given."""
        if until is None:
            await guard.acquire()
        else:
            try:
                await asyncio.wait_for(guard.acquire(), max(until - time.monotonic(), 0.0))
            except asyncio.TimeoutError as exc:
                raise BindDeadline(self._past_deadline(f"while queued for node {node}'s lock")) from exc
        try:
            yield
        finally:
            guard.release()

    async def acquire_lock(
        self,
        node: str,
        ns: str,
        name: str,
        spec: nodelock.LockSpec = nodelock.HAMI_LOCK,
        until: float | None = None,
    ) -> str:
        """Take the lock ``spec`` (default ``hami.io/mutex.lock``) on ``node`` for ``ns/name``;
        waits (up to the retry timeout) while another live holder has it; reclaims a stale one
        at once. Returns the value held (what :meth:`release_lock` needs for a bare-time lock).
        ``until``: the Bind's deadline (time.monotonic()): every wait ends there too, and past it
        no lock is written (BindDeadline)."""
        deadline = time.monotonic() + self.lock_retry_timeout
        if until is not None:
            deadline = min(deadline, until)
        guard = self._node_locks.setdefault(f"{node}\0{spec.key}", asyncio.Lock())
        async with self._guard(guard, node, until):
            fresh = False
            handoff: float | None = None  # when this Bind first saw the owner finished
            refused: tuple[str, KubeError] | None = None  # the node version a lock write was refused at
            while True:
                obj = await self._node(node, fresh)
                meta = obj.get("metadata") or {}
                if refused is not None and refused[0] and meta.get("resourceVersion") == refused[0]:
                    # refused (409/422) though the node had not changed: no lost race but a write
                    # the API server will never take (e.g. annotations over 256 KiB); said, not retried
                    raise refused[1]
                refused = None
                value = (meta.get("annotations") or {}).get(spec.key)
                holder = spec.holder(value)
                if holder is not None and (holder.namespace, holder.name) == (ns, name):
                    # Ours by name (a retried Bind), or a deleted pod's that a new pod of the same
                    # name inherits: either way a fresh value is written over it, so the lock's
                    # revision postdates anything the old pod ever was (the device plugin relies
                    # on that to trust its watch, PodCache).
                    why = "the lock names this pod already; written anew"
                elif value:
                    swap = (meta.get("annotations") or {}).get(nodelock.LOCK_HANDOFF) == nodelock.HANDOFF_SWAP
                    why = await self._stale_reason(value, node, spec, obj if swap else None)
                    if why is not None and why.startswith(nodelock.OWNER_FINISHED) and not swap:
                        # This node's plugin releases the lock right after it marks the pod (HAMi's
                        # do): wait for that write (one lock write of ours after it) instead of
                        # racing it (a lost race costs a rejected swap, a read and a write). A plugin
                        # that never releases costs one grace period, then the lock is swapped over.
                        # A plugin that declares hami.io/node-lock-handoff=swap (ours) leaves the
                        # lock to us: it is swapped over at once.
                        now = time.monotonic()
                        handoff = now if handoff is None else handoff
                        wait = min(handoff + self.handoff_grace, deadline) - now
                        if wait > 0:
                            await self.state.node_changed(node, wait)
                            fresh = False
                            continue
                    if why is None:
                        if not self.is_ready():  # stepped down meanwhile: the next leader places it
                            raise LeadershipLost("this replica leads no more; the new leader places the pod")
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise nodelock.LockContention(node, value)
                        self.stats["lock_waits"] += 1
                        await self.state.node_changed(node, min(left, 1.0))
                        fresh = time.monotonic() >= deadline
                        continue
                    # routine when the owner just finished (we woke on its bind-phase before the
                    # plugin's own release came back); anything else is worth a line at info
                    handed_on = why.startswith(nodelock.OWNER_FINISHED)
                    log.log(
                        logging.DEBUG if handed_on else logging.INFO,
                        "node %s: taking over lock %r: %s",
                        node,
                        value,
                        why,
                    )
                    self.stats["lock_handoffs" if handed_on else "lock_reclaims"] += 1
                if until is not None and time.monotonic() >= until:
                    raise BindDeadline(self._past_deadline(f"before node {node}'s lock was written"))
                stamp = datetime.fromtimestamp(self.clock(), timezone.utc)
                mine = spec.value(stamp, ns, name)
                if mine == value:  # the same second: the write would change nothing (no new revision)
                    if time.monotonic() >= deadline:
                        self._owed_releases.discard((node, spec.key, value))  # held: not owed
                        return value
                    await asyncio.sleep(0.25)
                    continue
                try:
                    if value:  # take over exactly the value judged stale, whatever else changed
                        written = await self.kube.json_patch(
                            node_path(node), nodelock.swap_patch(spec.key, value, mine)
                        )
                    else:
                        written = await self.kube.merge_patch(
                            node_path(node),
                            {
                                "metadata": {
                                    "annotations": {spec.key: mine},
                                    "resourceVersion": meta.get("resourceVersion"),
                                }
                            },
                        )
                    self.state.put_node(written)
                    self._owed_releases.discard((node, spec.key, mine))
                    return mine
                except KubeError as exc:
                    if not nodelock.lost_swap(exc):
                        self._owe_unanswered(node, spec.key, mine, exc)
                        raise
                    if time.monotonic() >= deadline:
                        raise nodelock.LockContention(node, value or "") from exc
                    fresh, refused = True, (str(meta.get("resourceVersion") or ""), exc)
                except (OSError, asyncio.TimeoutError) as exc:
                    self._owe_unanswered(node, spec.key, mine, exc)
                    raise

    def _owe_unanswered(self, node: str, key: str, value: str, exc: BaseException) -> None:
        """A lock write that got no answer (connection lost, timeout, 5xx) may have been applied:
        the value is owed to the lock sweep, which removes exactly it if the node holds it (found
        by tests/integration/test_chaos.py: a lock written as kube-apiserver went down named a pod
        never bound, and no stale-lock rule may take a pending pod's lock). A refusal (4xx) was
        not applied and owes nothing."""
        if not _refused(exc):
            self._owed_releases.add((node, key, value))

    async def remove_lock(self, node: str, key: str, value: str) -> bool:
        """Remove lock ``key`` from ``node`` only while it still holds ``value`` (one
        compare-and-remove). False when it had changed: someone else's now, left alone."""
        try:
            self.state.put_node(await self.kube.json_patch(node_path(node), nodelock.swap_patch(key, value, None)))
            return True
        except KubeError as exc:
            if not nodelock.lost_swap(exc):
                raise
            return False

    async def _release_quietly(
        self, node: str, ns: str, name: str, spec: nodelock.LockSpec = nodelock.HAMI_LOCK, value: str | None = None
    ) -> None:
        """Give back the lock value this Bind wrote (a changed lock is not ours any more)."""
        if not value:
            return
        try:
            await self.remove_lock(node, spec.key, value)
        except (KubeError, OSError, asyncio.TimeoutError) as exc:
            # Found by the chaos test (tests/integration/test_chaos.py): the API server dying
            # between the lock and the Binding left a lock naming a pending pod, which no rule
            # of stale_reason may take (it could be a live Bind of another replica), blocking
            # the node until the lock's expiry. The value is ours: the sweep removes it.
            self._owed_releases.add((node, spec.key, value))
            log.error(
                "node %s: cannot release the lock %s of %s/%s now (%s); the next lock sweep will",
                node,
                spec.key,
                ns,
                name,
                exc,
            )

    async def release_owed(self) -> int:
        """Remove the lock values failed Binds could not remove (see :meth:`_release_quietly`);
        each only while the node still holds exactly it. Returns how many were removed."""
        removed = 0
        for node, key, value in sorted(self._owed_releases):
            try:
                if await self.remove_lock(node, key, value):
                    removed += 1
                    log.info("node %s: released lock %s=%r left by a failed Bind", node, key, value)
            except KubeError as exc:
                if exc.status != 404:  # a deleted node has no lock to give back
                    log.warning("node %s: lock %s=%r still not released: %s", node, key, value, exc)
                    continue
            except (OSError, asyncio.TimeoutError) as exc:
                log.warning("node %s: lock %s=%r still not released: %s", node, key, value, exc)
                continue
            self._owed_releases.discard((node, key, value))
        return removed

    async def settle_unverified(self, now: float | None = None) -> int:
        """Locks kept for Bindings that got no clear answer (:attr:`_may_land`), once the API
        server can no longer write them: removed (that value only) when the pod is not bound to
        the lock's node; left to the device plugin, as any bound pod's, when it is. Returns how
        many were removed."""
        now = time.monotonic() if now is None else now
        for key in [k for k, (_, until) in self._binding.items() if until is not None and until <= now]:
            del self._binding[key]
        removed = 0
        for (node, key, value), (ns, name, until) in sorted(self._may_land.items()):
            if until > now:
                continue
            try:
                pod = await self._get_pod(ns, name)
                if pod is None or (pod.get("spec") or {}).get("nodeName") != node:
                    if await self.remove_lock(node, key, value):
                        removed += 1
                        log.info("node %s: released lock %s=%r of a Binding that was not written", node, key, value)
            except KubeError as exc:
                if exc.status != 404:
                    log.warning("node %s: lock %s=%r still not settled: %s", node, key, value, exc)
                    continue
            except (OSError, asyncio.TimeoutError) as exc:
                log.warning("node %s: lock %s=%r still not settled: %s", node, key, value, exc)
                continue
            del self._may_land[(node, key, value)]
        return removed

    async def sweep_locks(self) -> int:
        """Release every lock whose owner can no longer use it (leader pass). Returns how many.

        A lock whose owner merely finished its allocation is the plugin's to release (and a
        waiting Bind's to take over): the sweep leaves it alone unless the very same value was
        already seen finished on the previous pass, so it never races a live handoff."""
        released = await self.release_owed() + await self.settle_unverified()
        specs = {s.key: s for s in self._vendor_locks.values() if s is not None}
        seen, self._finished_seen = self._finished_seen, set()
        for name, spec in [(n, s) for n in list(self.state.nodes) for s in specs.values()]:
            if await self._sweep_one(name, spec, seen):
                released += 1
        return released

    async def _sweep_one(self, name: str, spec: nodelock.LockSpec, seen: set[tuple[str, str, str]]) -> bool:
        """Release ``spec``'s lock on node ``name`` when its holder can no longer use it."""
        obj = self.state.nodes.get(name) or {}
        value = ((obj.get("metadata") or {}).get("annotations") or {}).get(spec.key)
        if not value:
            return False
        why = await self._stale_reason(value, name, spec)
        if why is None:
            return False
        if why.startswith(nodelock.OWNER_FINISHED) and (name, spec.key, value) not in seen:
            self._finished_seen.add((name, spec.key, value))
            return False

        try:
            # release only the very lock judged stale, never a newer one
            if await self.remove_lock(name, spec.key, value):
                log.info("node %s: released stale lock %s=%r: %s", name, spec.key, value, why)
                return True
        except (KubeError, OSError, asyncio.TimeoutError) as exc:
            log.warning("node %s: cannot release stale lock %s: %s", name, spec.key, exc)
        return False


def _fit_message(result: Any, offered: int | None = None) -> str:
    """HAMi's ``FilteringSucceed`` text: the node chosen, how many refused, each fitting node's
    score. The search stops at the first node that fits in rank order, so ``failed`` and
    ``scores`` hold only the nodes it examined: when that is fewer than the ``offered`` candidates,
    the text says how many of them were examined (found by review, 1 Dec: 5 nodes that all fit
    read "0 nodes not fit, 1 nodes fit"); when every one was, it is HAMi's text word for word."""
    fits = ",".join(f"{n}:{s:.2f}" for n, s in sorted(result.scores.items()))
    examined = len(result.failed) + len(result.scores)
    counts = f"{len(result.failed)} nodes not fit, {len(result.scores)} nodes fit({fits})"
    if offered is not None and examined < offered:
        counts = f"{examined} of {offered} nodes examined: {counts}"
    return f"find fit node({result.node}), {counts}"
