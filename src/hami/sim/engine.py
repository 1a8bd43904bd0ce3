"""The simulation: Kubernetes objects in, placement report out (no I/O here).

Pods go through the webhook's admission (:func:`hami.webhook.admission.decide`, whose denials
are the pod's outcome), the same admission defaults (:func:`hami.core.admit_pod`), the node
filters kube-scheduler runs before the extender (:mod:`hami.core.nodefit`) and the same
:func:`hami.core.schedule_pod` the extender uses.

The pods file is read as the state of a cluster followed by events (:func:`play_order`): a pod
that already carries ``hami.io/vgpu-node`` and allocation annotations holds them from the start
(its first document, whatever its place in the file), as does a terminating one
(``metadata.deletionTimestamp`` on its first document); a pod in phase Succeeded or Failed
holds nothing. Then the documents play in file order: a new pod is scheduled (one with only
``spec.nodeName`` is fitted on that node alone), a copy with
``metadata.deletionTimestamp`` of a pod given earlier deletes it (by namespace/name), a
ResourceQuota document sets namespace quota from that point on. A new pod with
``spec.schedulingGates`` (Kueue's, say) stays pending, holding nothing, with the reason
``*: scheduling gated (<names>)``: kube-scheduler does not schedule it while it is gated.

A pod left pending by its scheduling attempt is retried, as kube-scheduler retries its
unschedulable pods (:meth:`_Run.retry`): after deletions (in a row) that free something (GPUs, a
node's cpu, memory or pods, a cordon), the pods pending then are tried again in their arrival
order (the order the simulation schedules pods in: it does not read ``spec.priority``), before the
next document, and a pod that fits is placed there (``scheduled``, with :attr:`PodOutcome.note`
saying so); after the last document every pod still pending is tried once more, so its reasons
are those of the final ledger the report shows (until 1 Dec a pod kept the reasons of its first
attempt, next to a GPU the file had freed since: review). A retry does not admit the pod again:
the webhook and the API server's quota saw it once, at its creation, and a pod they refused
(``denied``) is never retried.

As in a cluster: a pod the file creates loses the uid its manifest gives (the API server gives
its own), and two pods holding grants under one uid stop the run (:class:`Uids`); a running pod's
allocation annotations are read as the scheduler's cache reads them (:mod:`hami.core.grants`: the
readable grants count, an unreadable vendor's devices on its node are cordoned while it runs);
the webhook's admission of a pod being created (:func:`created_by_file`: a dump's pending pod
exists already, and waits at Filter) gets the namespace quota room
(:meth:`hami.core.Ledger.quota_room`), then the API server's quota on extended resources
(:class:`ApiServerQuota`: ``requests.nvidia.com/gpu``, which counts a dump's pods from the start,
wherever the file lists them); and kube-scheduler's NodeResourcesFit on
cpu, memory and pods runs with its node filters (:class:`NodeResources`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import AbstractSet, Any, Container, Iterable, Mapping, Sequence

from sortedcontainers import SortedList

from hami.core import (
    CoreError,
    Ledger,
    PodAllocation,
    SchedulerConfig,
    admit_pod,
    pod_request,
    read_node_devices,
    schedule_pod,
)
from hami.core.grants import cordon_vendors, read_grants, running_on, unreadable_vendors
from hami.core.names import VGPU_NODE
from hami.core.quantity import QuantityError, parse_quantity
from hami.core.requests import ordered_containers, pod_name
from hami.core.shape import META, POD, QTY, QUOTA, MapOf, ShapeError, check
from hami.core.types import NodeDevices
from hami.dra.explain import gated_reason, scheduling_gates
from hami.webhook.admission import AdmissionSettings, decide

from hami.core.nodefit import (
    FILTERED_EFFECTS,
    NODE_FIELDS,
    POD_FIELDS,
    NodeFacts,
    NodeFitError,
    PodAsks,
    filter_nodes,
    node_facts,
    pod_asks,
)

DEFAULT_SCHEDULER = "hami-scheduler"  # the webhook's --scheduler-name default


class SimulationError(Exception):
    """Bad input that stops the run; the message is the one line to print."""


@dataclass
class PodOutcome:
    namespace: str
    name: str
    #: "scheduled" | "pending" | "no-devices" | "pre-placed" | "terminating" | "finished" | "denied" | "deleted"
    status: str
    node: str | None = None
    containers: list[dict] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    #: how a pod left pending at its creation came to be placed later (kube-scheduler's retry), or ""
    note: str = ""


@dataclass
class SimResult:
    pods: list[PodOutcome]
    devices: list[dict]
    warnings: list[str]
    ledger: Ledger | None = None  # the final ledger (the html report builds the UI's documents from it)
    objects: dict[str, dict] = field(default_factory=dict)  # "ns/name" -> the last Pod document of that name
    claims: list[dict] = field(default_factory=list)  # DRA front end: every claim, its node and results
    front_end: str = "extender"  # or "dra" (hami.sim.dra)


def flatten_objects(docs: Iterable[Any], source: str, where: str = "document") -> list[tuple[str, dict]]:
    """``(label, object)`` for every object of the documents (List kinds flattened); the label
    names the document (and list item) for error lines. Raises SimulationError."""
    out: list[tuple[str, dict]] = []
    for i, doc in enumerate(docs):
        label = f"{where} {i + 1}"
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise SimulationError(f"{source}: {label} is not a Kubernetes object (got {type(doc).__name__})")
        kind = doc.get("kind")
        if kind is not None and not isinstance(kind, str):
            raise SimulationError(f"{source}: {label}: kind must be a string, got {type(kind).__name__}")
        if kind == "List" or ("items" in doc and kind is None) or (kind or "").endswith("List"):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise SimulationError(f"{source}: {label}: items must be a list")
            out.extend(flatten_objects(items, source, f"{label} item"))
        else:
            try:
                check(doc, {"kind": str, "metadata": META}, "")
            except ShapeError as exc:
                raise SimulationError(f"{source}: {label}: {exc}") from None
            out.append((label, doc))
    return out


def check_document(obj: Mapping[str, Any], schema: Any, source: str, label: str) -> None:
    """:func:`hami.core.shape.check` of one object from :func:`flatten_objects`; a wrong field is
    a SimulationError naming the file, the document and the object."""
    try:
        check(obj, schema, "")
    except ShapeError as exc:
        raise SimulationError(f"{source}: {label} ({_describe(obj)}): {exc}") from None


def object_name(obj: Mapping[str, Any], source: str, label: str) -> str:
    """``metadata.name`` of a Node or Pod document: the API server has no object without one."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        hint = " (generateName is not expanded: give the object a name)" if meta.get("generateName") else ""
        raise SimulationError(f"{source}: {label} ({obj.get('kind') or 'object'}): metadata.name is missing{hint}")
    return str(name)


#: what to do instead of a second pod of one name (the hint of a duplicate pod's error)
RECREATE = " (to replace it, delete it first: a copy with metadata.deletionTimestamp set, then the new pod)"


def unknown_node(node: str, source: str) -> str:
    """The reason of a pod bound (``spec.nodeName``) to a node the simulation does not have."""
    return f"spec.nodeName is {node}, which is not a usable node of {source} (absent, or skipped: see the warnings)"


class Names:
    """Objects seen so far, by name: a second Node (or a second live Pod) of the same name is
    refused, as the API server refuses to create it (AlreadyExists)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.seen: dict[str, str] = {}  # name -> the label of the document that holds it

    def add(self, name: str, obj: Mapping[str, Any], label: str, hint: str = "") -> None:
        if name in self.seen:
            raise SimulationError(
                f"{self.source}: {label} ({_describe(obj)}): {(obj.get('kind') or 'object').lower()} {name} "
                f"is already given in {self.seen[name]}{hint}"
            )
        self.seen[name] = label

    def remove(self, name: str) -> None:
        self.seen.pop(name, None)


class Uids:
    """The pods' uids. The API server gives every pod it creates a uid of its own, whatever
    ``metadata.uid`` the manifest carries (a pod copied with ``kubectl get -o yaml`` and renamed
    keeps the original's), and the scheduler keys its grants by uid: a pod the file creates (one
    the simulation schedules) is rid of the uid its manifest gives (:meth:`fresh`), and a pod the
    file gives as holding a grant already keeps its own, which no other live pod may share
    (:meth:`hold`)."""

    def __init__(self, source: str, taken: Iterable[str] = ()) -> None:
        self.source = source
        self.taken = set(taken)  # every uid of the file, and those given out
        self.live: dict[str, tuple[str, str]] = {}  # ledger key -> (label, description) of its holder

    def fresh(self, obj: dict, index: int) -> dict:
        """``obj`` without the uid its manifest carries (a shallow copy; ``obj`` is not changed):
        it is then known by its namespace/name, which no other live pod has, or, should a pod of
        the file have that for its uid, by a uid no pod of the file has."""
        meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "uid"}
        if pod_ref(obj) in self.taken:
            uid = f"simulated-{index + 1}"
            while uid in self.taken:
                uid += "-x"
            self.taken.add(uid)
            meta["uid"] = uid
        return {**obj, "metadata": meta}

    def hold(self, key: str, obj: Mapping[str, Any], label: str) -> None:
        """Pod ``obj`` (document ``label``) holds a grant under ``key`` from now on; a live pod
        already holding one under the same key is a SimulationError naming both documents."""
        other = self.live.get(key)
        if other is not None:
            uid = (obj.get("metadata") or {}).get("uid")
            what = f"metadata.uid {uid!r}" if uid else f"its key {key!r}"
            raise SimulationError(
                f"{self.source}: {label} ({_describe(obj)}): {what} is also that of {other[1]} "
                f"({other[0]}), which holds its grant already: no two live pods share a uid, and the "
                "scheduler counts grants by uid (a copy of a running pod keeps the original's uid, node "
                "and grant: to simulate it as a new pod, remove metadata.uid, spec.nodeName and its "
                "hami.io annotations)"
            )
        self.live[key] = (label, _describe(obj))

    def release(self, key: str | None) -> None:
        if key is not None:
            self.live.pop(key, None)


def file_uids(objects: Iterable[tuple[str, Mapping[str, Any]]]) -> set[str]:
    """The ``metadata.uid`` of every object of the pods file (fresh uids avoid them)."""
    return {u for _, o in objects if isinstance(u := (o.get("metadata") or {}).get("uid"), str) and u}


# ---------------------------------------------------------------------- the API server's quota admission


def quota_released_at(pod: Mapping[str, Any], source: str, label: str) -> float | None:
    """When the API server's quota stops charging ``pod`` (seconds since the epoch), or None: a pod
    being deleted that is still there past ``metadata.deletionTimestamp`` plus
    ``metadata.deletionGracePeriodSeconds`` (stuck Terminating on a lost node) is no longer
    counted, as Kubernetes' quota evaluator (QuotaV1Pod) leaves it out; without both fields it is
    counted until it goes. (Until 1 Dec such a pod took its namespace's GPU count: review.)"""
    meta = pod.get("metadata") or {}
    stamp, grace = meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")
    if not stamp or grace is None:
        return None
    where = f"{source}: {label} ({_describe(pod)})"
    if isinstance(grace, bool) or not isinstance(grace, int):
        raise SimulationError(f"{where}: metadata.deletionGracePeriodSeconds must be an integer, got {grace!r}")
    when = None
    if isinstance(stamp, str):
        try:
            when = datetime.fromisoformat(stamp)
        except ValueError:
            pass
    if when is None or when.tzinfo is None:
        raise SimulationError(
            f"{where}: metadata.deletionTimestamp must be an RFC 3339 time (2026-01-01T00:00:00Z), got {stamp!r}"
        )
    return when.timestamp() + grace


class ApiServerQuota:
    """The API server's own ResourceQuota admission, on the extended resources a quota caps with a
    ``requests.<name>`` key (``requests.nvidia.com/gpu: 4``: the namespace's GPU count): a pod
    being created whose requests would take its namespace past such a limit is refused before it
    exists, ``exceeded quota: NAME, requested: ..., used: ..., limited: ...``, as the API server
    refuses it (its HAMi quota, ``limits.nvidia.com/gpumem`` and the like, is the webhook's and the
    ledger's: :meth:`hami.core.Ledger.quota_room`). A namespace uses what its live pods request
    (every pod the file gives or creates, not finished, not refused, until the file deletes it; a
    dump's pods from the start, wherever the file lists them, as they exist before any pod the file
    creates), as the quota controller counts them: not a pod being deleted past its grace period
    (:func:`quota_released_at`); a quota's ``status.used`` is not read. A scoped quota
    (``spec.scopes``, ``spec.scopeSelector``) is left out: its scopes are not modelled. Until 1 Dec
    the extender simulation left these limits out (the DRA one counted them): a namespace with a
    GPU count quota of 1 had a second 1-GPU pod placed where the cluster refuses it (review)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.hard: dict[str, dict[str, dict[str, int]]] = {}  # namespace -> quota name -> resource -> limit
        self.pods: dict[str, dict[str, Mapping[str, Any]]] = {}  # namespace -> pod ref -> the pod counted
        self.amounts: dict[str, dict[str, int]] = {}  # pod ref -> resource -> what it requests
        self.used: dict[str, dict[str, int]] = {}  # namespace -> resource -> what its pods request
        self.where: dict[str, str] = {}  # pod ref -> its namespace, while counted

    @staticmethod
    def capped(obj: Mapping[str, Any]) -> dict[str, Any]:
        """The extended resources (a domain-qualified name outside kubernetes.io) an unscoped
        ResourceQuota caps with ``requests.<name>``, and their limits as given."""
        spec = obj.get("spec") or {}
        if spec.get("scopes") or ((spec.get("scopeSelector") or {}).get("matchExpressions")):
            return {}
        out = {}
        for key, value in (spec.get("hard") or {}).items():
            name = key.removeprefix("requests.")
            if name != key and "/" in name and not name.split("/", 1)[0].endswith("kubernetes.io"):
                out[name] = value
        return out

    def set_quota(self, obj: Mapping[str, Any], label: str) -> None:
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
        limits: dict[str, int] = {}
        for resource, value in self.capped(obj).items():
            try:
                limits[resource] = math.floor(parse_quantity(value, f"spec.hard.requests.{resource}"))
            except QuantityError as exc:
                raise SimulationError(f"{self.source}: {label} ({_describe(obj)}): {exc}") from None
        quotas = self.hard.setdefault(namespace, {})
        quotas.pop(name, None)
        if limits:
            quotas[name] = limits
        used = self.used.setdefault(namespace, {})
        for resource in limits.keys() - used.keys():  # counted from here on, from the pods there now
            used[resource] = 0
            for ref, pod in self.pods.get(namespace, {}).items():
                n = pod_resources(pod, self.source, ref, (resource,))[resource]
                self.amounts.setdefault(ref, {})[resource] = n
                used[resource] += n

    def refusal(self, pod: Mapping[str, Any], label: str) -> str | None:
        """Why the API server refuses to create ``pod`` under its namespace's quotas, or None."""
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        quotas = self.hard.get(namespace)
        if not quotas:
            return None
        used = self.used.get(namespace, {})
        asks = pod_resources(pod, self.source, label, sorted(used))
        for name in sorted(quotas):
            limits = quotas[name]
            over = sorted(r for r, h in limits.items() if asks.get(r, 0) > 0 and used.get(r, 0) + asks[r] > h)
            if over:
                key = [f"requests.{r}" for r in over]
                return (
                    f"exceeded quota: {name}, "
                    f"requested: {','.join(f'{k}={asks[r]}' for k, r in zip(key, over))}, "
                    f"used: {','.join(f'{k}={used.get(r, 0)}' for k, r in zip(key, over))}, "
                    f"limited: {','.join(f'{k}={limits[r]}' for k, r in zip(key, over))}"
                )
        return None

    def count(self, ref: str, pod: Mapping[str, Any], label: str) -> None:
        """``pod`` exists (its namespace's quotas count what it requests) until :meth:`uncount`."""
        self.uncount(ref)
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        self.pods.setdefault(namespace, {})[ref] = pod
        self.where[ref] = namespace
        used = self.used.get(namespace)
        if used:
            amounts = self.amounts[ref] = pod_resources(pod, self.source, label, sorted(used))
            for resource, n in amounts.items():
                used[resource] += n

    def uncount(self, ref: str) -> None:
        namespace = self.where.pop(ref, None)
        if namespace is None:
            return
        self.pods[namespace].pop(ref, None)
        used = self.used.get(namespace, {})
        for resource, n in self.amounts.pop(ref, {}).items():
            used[resource] -= n


# ---------------------------------------------------------------------- kube-scheduler's NodeResourcesFit

#: the node resources kube-scheduler's NodeResourcesFit filter checks here (device resources are
#: HAMi's: the extender answers for them, and kube-scheduler ignores them)
FIT_RESOURCES = ("cpu", "memory", "pods")
ALLOCATABLE = {"status": {"allocatable": MapOf(QTY)}}
OVERHEAD = {"spec": {"overhead": MapOf(QTY)}}


def _amount(value: Any, resource: str, where: str) -> int:
    """A cpu (millicores), memory (bytes) or pods quantity, rounded up as Kubernetes rounds it."""
    exact = parse_quantity(value, where)
    if exact < 0:
        raise QuantityError(f"{where}: {value!r} is negative")
    return math.ceil(exact * 1000) if resource == "cpu" else math.ceil(exact)


def node_allocatable(obj: Mapping[str, Any], source: str, label: str) -> dict[str, int]:
    """What a Node's ``status.allocatable`` gives of :data:`FIT_RESOURCES` (cpu in millicores,
    memory in bytes); a resource it does not give is not checked."""
    check_document(obj, ALLOCATABLE, source, label)
    given = (obj.get("status") or {}).get("allocatable") or {}
    out = {}
    for r in FIT_RESOURCES:
        if r in given:
            try:
                out[r] = _amount(given[r], r, f"status.allocatable.{r}")
            except QuantityError as exc:
                raise SimulationError(f"{source}: {label} ({_describe(obj)}): {exc}") from None
    return out


def pod_resources(
    pod: Mapping[str, Any], source: str, label: str, names: Iterable[str] = ("cpu", "memory")
) -> dict[str, int]:
    """What kube-scheduler counts a pod as requesting of a node (``cpu`` in millicores, ``memory``
    in bytes; or of the resources ``names``, e.g. an extended resource the API server's quota
    counts), as Kubernetes adds it up: a container's request, or its limit when it gives none
    (the API server's default); the regular containers and sidecars (init containers with
    ``restartPolicy: Always``) together, or a classic init container with the sidecars started
    before it when that is more; plus ``spec.overhead``."""
    check_document(pod, OVERHEAD, source, label)
    spec = pod.get("spec") or {}

    def ask(c: Mapping[str, Any], r: str, where: str) -> int:
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        value = requests[r] if r in requests else limits.get(r)
        field = "requests" if r in requests else "limits"
        if value is None:
            return 0
        try:
            return _amount(value, r, f"{where}.resources.{field}.{r}")
        except QuantityError as exc:
            raise SimulationError(f"{source}: {label} ({_describe(pod)}): {exc}") from None

    out = {}
    for r in names:
        total = sum(ask(c, r, f"spec.containers[{i}]") for i, c in enumerate(spec.get("containers") or ()))
        sidecars = peak = 0
        for i, c in enumerate(spec.get("initContainers") or ()):
            n = ask(c, r, f"spec.initContainers[{i}]")
            if c.get("restartPolicy") == "Always":
                total += n
                sidecars += n
                peak = max(peak, sidecars)
            else:
                peak = max(peak, n + sidecars)
        overhead = (spec.get("overhead") or {}).get(r)
        if overhead is not None:
            try:
                total_overhead = _amount(overhead, r, f"spec.overhead.{r}")
            except QuantityError as exc:
                raise SimulationError(f"{source}: {label} ({_describe(pod)}): {exc}") from None
        else:
            total_overhead = 0
        out[r] = max(total, peak) + total_overhead
    return out


def _cpu(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _bytes(n: int) -> str:
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


class NodeResources:
    """kube-scheduler's ``NodeResourcesFit`` filter on cpu, memory and pods: what a node's
    ``status.allocatable`` gives, less what the pods bound to it request (pods the file binds by
    ``spec.nodeName`` and have not finished, and pods the simulation places). A node whose
    allocatable is not given is not checked; a resource it does not give is not checked. What is
    left of each resource is kept sorted, so that a pod's refusals cost what they name, not a
    visit to every node (a 1000-node cluster and 10,000 pods)."""

    def __init__(self, allocatable: Mapping[str, Mapping[str, int]]) -> None:
        self.allocatable = {n: dict(a) for n, a in allocatable.items() if a}
        self.held: dict[str, tuple[str, Mapping[str, int]]] = {}  # pod ref -> (node, its requests)
        self.used: dict[str, dict[str, int]] = {n: dict.fromkeys(FIT_RESOURCES, 0) for n in self.allocatable}
        self.changes = 0  # how many times what is left changed
        #: resource -> (what is left, node) of the nodes that give it, in order
        self.left: dict[str, SortedList] = {
            r: SortedList((a[r], n) for n, a in self.allocatable.items() if r in a) for r in FIT_RESOURCES
        }

    def _add(self, node: str, requests: Mapping[str, int], sign: int) -> None:
        have, used = self.allocatable[node], self.used[node]
        self.changes += 1
        for r in FIT_RESOURCES:
            n = 1 if r == "pods" else requests.get(r, 0)
            if not n:
                continue
            if r in have:
                self.left[r].remove((have[r] - used[r], node))
                self.left[r].add((have[r] - used[r] - sign * n, node))
            used[r] += sign * n

    def hold(self, ref: str, node: str | None, requests: Mapping[str, int] | None) -> None:
        """Pod ``ref`` is on ``node`` from now on (replacing where it was)."""
        self.release(ref)
        if node is None or requests is None or node not in self.allocatable:
            return
        self.held[ref] = (node, requests)
        self._add(node, requests, +1)

    def release(self, ref: str) -> None:
        node, requests = self.held.pop(ref, (None, None))
        if node is not None and requests is not None:
            self._add(node, requests, -1)

    def short(self, requests: Mapping[str, int] | None, skip: Container[str] = ()) -> dict[str, list[str]]:
        """node -> the resources it has too little left of for the pod (kube-scheduler's order:
        pods, cpu, memory), for the nodes but those in ``skip``."""
        if requests is None:
            return {}
        out: dict[str, list[str]] = {}
        for r in FIT_RESOURCES:
            want = 1 if r == "pods" else requests.get(r, 0)
            if want <= 0:
                continue
            index = self.left[r]
            for _, node in index[: index.bisect_left((want, ""))]:  # less left than it wants
                if node not in skip:
                    out.setdefault(node, []).append(r)
        return out

    def reasons(self, short: Mapping[str, Sequence[str]], requests: Mapping[str, int]) -> dict[str, str]:
        """:meth:`short` in kube-scheduler's words (``Too many pods``, ``Insufficient cpu``,
        ``Insufficient memory``), with the amounts."""
        out = {}
        for node, resources in short.items():
            have, used = self.allocatable[node], self.used[node]
            why = []
            for r in resources:
                if r == "pods":
                    why.append(f"Too many pods ({used['pods']} of {have['pods']} allocatable on the node)")
                    continue
                shown = _cpu if r == "cpu" else _bytes
                why.append(
                    f"Insufficient {r} (the pod requests {shown(requests[r])}; the node has {shown(have[r])} "
                    f"allocatable, {shown(used[r])} requested by its pods)"
                )
            out[node] = ", ".join(why)
        return out

    def refusals(self, requests: Mapping[str, int] | None, skip: Container[str] = ()) -> dict[str, str]:
        """node -> kube-scheduler's reason, for the nodes (but those in ``skip``) the pod does not fit."""
        return {} if requests is None else self.reasons(self.short(requests, skip), requests)


def _extended(resource: str) -> bool:
    """Kubernetes' non-overcommitable resources: a domain-qualified name outside kubernetes.io."""
    return "/" in resource and "kubernetes.io/" not in resource


def check_pod_resources(
    pod: Mapping[str, Any], vendors: Iterable[Any], source: str, label: str, warnings: list[str]
) -> None:
    """What the API server refuses in a pod's extended resources (a request without a limit, or
    one that differs from its limit: both a SimulationError with the API server's words), and a
    warning for a device-memory quantity with a unit suffix (HAMi reads ``gpumem: 8Gi`` as the
    plain number 8589934592, which no GPU has)."""
    memory = {v.resources.memory: v.resources.memory_factor for v in vendors if v.resources.memory}
    for i, (c, _) in enumerate(ordered_containers(pod)):
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        where = f"{source}: {label} ({_describe(pod)}): container {c.get('name') or i!r}"
        for key, value in requests.items():
            if not _extended(key):
                continue
            if key not in limits:
                raise SimulationError(
                    f"{where}: requests.{key}: {value}: limits.{key} is missing (Kubernetes: "
                    "Limit must be set for non overcommitable resources; set the limit alone)"
                )
            try:
                same = parse_quantity(value, key) == parse_quantity(limits[key], key)
            except QuantityError:
                continue  # the admission names the bad quantity
            if not same:
                raise SimulationError(
                    f"{where}: requests.{key}: {value}: must be equal to {key} limit of {limits[key]} "
                    "(Kubernetes refuses the pod; set the limit alone)"
                )
        for key in sorted(set(memory) & (set(limits) | set(requests))):
            value = limits.get(key, requests.get(key))
            if not isinstance(value, str) or value.strip().rstrip("KMGTPEikm") == value.strip():
                continue
            try:
                number = parse_quantity(value, key)
            except QuantityError:
                continue  # the admission names the bad quantity
            if number.denominator != 1:
                continue  # the admission refuses a fraction
            mib = number / 2**20
            hint = f"; {value} is {mib} MiB" if memory[key] == 1 and mib >= 1 and mib.denominator == 1 else ""
            warnings.append(
                f"{where}: {key}: {value} is the plain number {number} to HAMi, which reads this resource "
                f"as a count of {'MiB' if memory[key] == 1 else 'its memory unit'}, not bytes{hint}"
            )


def _names(names: Sequence[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _describe(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else meta.get("name") or "?"
    return f"{obj.get('kind') or 'object'} {name}"


def _device(d: Any) -> dict:
    out = {"uuid": d.uuid, "type": d.type, "usedmem": d.usedmem, "usedcores": d.usedcores}
    if d.slice is not None:  # a MIG instance: its profile and placement
        out["mig"] = {"profile": d.slice.profile, "start": d.slice.start, "size": d.slice.size}
    return out


def _containers(pod: Mapping[str, Any], devices: Mapping[str, Any]) -> list[dict]:
    from hami.core.requests import ordered_containers

    out = []
    for ci, (c, _) in enumerate(ordered_containers(pod)):
        devs: list[dict] = []
        for vendor in sorted(devices):
            per = devices[vendor]
            if ci < len(per):
                devs.extend(_device(d) for d in per[ci])
        out.append({"name": c.get("name") or str(ci), "devices": devs})
    return out


def load_nodes(
    node_docs: Iterable[Any], config: SchedulerConfig, source: str = "nodes"
) -> tuple[Ledger, list[str], dict[str, NodeFacts], dict[str, dict[str, int]]]:
    """The nodes file -> ``(ledger of the usable nodes, warnings, what kube-scheduler's node
    filters read of each Node, what its status.allocatable gives of cpu, memory and pods)``."""
    ledger = Ledger(config.vendors)
    warnings: list[str] = []
    facts: dict[str, NodeFacts] = {}
    allocatable: dict[str, dict[str, int]] = {}
    names = Names(source)
    kinds: set[str] = set()  # of the objects that are not Nodes
    bare: list[str] = []  # Nodes without any registration annotation
    for label, obj in flatten_objects(node_docs, source):
        if (obj.get("kind") or "Node") != "Node":
            kinds.add(str(obj.get("kind")))
            warnings.append(
                f"{source}: skipping {obj.get('kind')} {(obj.get('metadata') or {}).get('name')}: not a Node"
            )
            continue
        name = object_name(obj, source, label)
        names.add(name, obj, label)
        check_document(obj, NODE_FIELDS, source, label)
        facts[name] = node_facts(obj)
        allocatable[name] = node_allocatable(obj, source, label)
        try:
            nd, dropped = read_node_devices(obj, config.vendors)
        except CoreError as exc:
            warnings.append(f"skipping node {name}: {exc}")
            continue
        if dropped and not nd.devices:
            warnings.append(f"skipping node {name}: {'; '.join(dropped.values())}")
            continue
        for vendor, why in dropped.items():  # as the scheduler: only that vendor's devices leave
            warnings.append(f"skipping the {vendor} devices of node {name}: {why}")
        if not nd.devices:
            bare.append(name)
            continue
        ledger.set_node(nd)
    if bare:  # a cluster's CPU nodes: one line for all of them, not one per node
        keys = ", ".join(v.register_annotation for v in config.vendors)
        which = f"node {bare[0]}" if len(bare) == 1 else f"{len(bare)} nodes ({_names(bare)})"
        warnings.append(f"skipping {which}: no device registration annotation ({keys})")
    if not names.seen:
        if kinds:  # the hint below would have the user overwrite a pods file with the nodes
            hint = " (did you swap --nodes and --pods?)" if "Pod" in kinds else ""
            raise SimulationError(f"{source}: no Node object in the file, only {', '.join(sorted(kinds))}{hint}")
        raise SimulationError(f"{source}: no Node object in the file (kubectl get nodes -o yaml > {source})")
    if not ledger.node_names():
        first = f": {warnings[0]}" if warnings else ""
        raise SimulationError(f"{source}: no usable node (every Node lacks a valid registration annotation){first}")
    return ledger, warnings, facts, allocatable


# ---------------------------------------------------------------------- the pods file


FINISHED = ("Succeeded", "Failed")  # phases of a pod that holds nothing any more


def pod_ref(pod: Mapping[str, Any]) -> str:
    """``namespace/name``: what names a pod in the file (its ``uid``, when given, keys the ledger)."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in FINISHED


def bound_node(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


def created_by_file(pod: Mapping[str, Any]) -> bool:
    """Whether the file creates the pod (no ``status``, no ``metadata.creationTimestamp``: a
    manifest), as opposed to a pod the cluster has already (a dump's, say ``kubectl get pods -o
    yaml``'s, which carries both). Only a pod being created goes through the webhook's namespace
    quota check; one that exists passed it at its creation, and a pending one waits at the
    scheduler's Filter (``ResourceQuotaNotFit``), as in the cluster."""
    return not pod.get("status") and not (pod.get("metadata") or {}).get("creationTimestamp")


@dataclass
class PodDoc:
    """One Pod document of the pods file, read once (shape, name, what it holds, what it asks)."""

    index: int  # position among the file's objects: the order of the output
    label: str
    obj: dict
    ref: str
    delete: bool  # metadata.deletionTimestamp on a pod the file gave earlier: it is deleted here
    first: bool  # the first document of its namespace/name
    allocation: PodAllocation | None = None  # what its allocation annotations say it holds (the readable ones)
    unreadable: str = ""  # why (some of) its allocation annotations cannot be read
    blind: frozenset[str] = frozenset()  # the vendors whose grant cannot be read (their devices on its node cordoned)
    asks: PodAsks | None = None  # what it asks of a node (kube-scheduler's filters)
    resources: dict[str, int] | None = None  # what it requests of a node's cpu and memory (NodeResourcesFit)
    released_at: float | None = None  # when the API server's quota stops charging it (quota_released_at)

    @property
    def terminating(self) -> bool:
        return not self.delete and bool((self.obj.get("metadata") or {}).get("deletionTimestamp"))

    @property
    def held(self) -> bool:
        """Placed before the file's events: it holds what its annotations say (what of them can be
        read; a grant that cannot be read cordons its vendor's devices on its node), or it is
        terminating."""
        if finished(self.obj):
            return False
        return self.allocation is not None or self.terminating or bool(self.unreadable and bound_node(self.obj))


def play_order(docs: Sequence[PodDoc | None]) -> list[int]:
    """The order the documents are played in (positions into ``docs``; None = not a pod).

    The first document of each pod that was placed before the file's events (it holds an
    allocation, or it is terminating) comes first, then everything else in file order: a dump
    (``kubectl get pods -A -o yaml``, sorted by name) has each pod once, and a pending pod listed
    before a running one does not take the running one's GPUs; deletions and later copies of a
    pod keep their place in the sequence. A pod bound by ``spec.nodeName`` alone (no allocation:
    the live scheduler counts it as holding nothing) keeps its place too, so a ResourceQuota
    the file gives before it applies to it."""
    held = [i for i, d in enumerate(docs) if d is not None and d.first and d.held]
    early = set(held)
    return held + [i for i in range(len(docs)) if i not in early]


def _read_pods(
    objects: list[tuple[str, dict]], config: SchedulerConfig, source: str, warnings: list[str]
) -> list[PodDoc | None]:
    """Check every document of the pods file in file order (what the API server refuses stops
    the run there; the warnings come in file order); None for the objects that are not pods."""
    seen: set[str] = set()
    out: list[PodDoc | None] = []
    for i, (label, obj) in enumerate(objects):
        kind = obj.get("kind") or "Pod"
        if kind == "ResourceQuota":
            check_document(obj, QUOTA, source, label)
        elif kind != "Pod":
            warnings.append(f"{source}: skipping {kind} {(obj.get('metadata') or {}).get('name')}: not a Pod")
        if kind != "Pod":
            out.append(None)
            continue
        check_document(obj, POD, source, label)
        check_document(obj, POD_FIELDS, source, label)
        object_name(obj, source, label)
        ref = pod_ref(obj)
        doc = PodDoc(
            i,
            label,
            obj,
            ref,
            bool((obj.get("metadata") or {}).get("deletionTimestamp")) and ref in seen,
            ref not in seen,
        )
        seen.add(ref)
        out.append(doc)
        if doc.delete:
            continue
        check_pod_resources(obj, config.vendors, source, label, warnings)
        try:
            doc.asks = pod_asks(obj)
        except NodeFitError as exc:
            raise SimulationError(f"{source}: {label} ({_describe(obj)}): {exc}") from None
        doc.resources = pod_resources(obj, source, label)
        doc.released_at = quota_released_at(obj, source, label)
        doc.allocation, errors = read_grants(obj, config.vendors)
        if errors:
            doc.unreadable = "; ".join(errors.values())
            warnings.append(f"{source}: {label}: {doc.unreadable}; {unreadable_effect(obj, doc.allocation, errors)}")
            if running_on(obj):
                doc.blind = frozenset(unreadable_vendors(doc.allocation, errors))
    return out


def unreadable_effect(pod: Mapping[str, Any], alloc: PodAllocation | None, errors: Mapping[str, str]) -> str:
    """What an allocation annotation that cannot be read does, as the scheduler's cache does it
    (:mod:`hami.core.grants`): the readable grants count; while the pod runs, the devices of a
    vendor whose grant cannot be read take no new pod on its node."""
    node = running_on(pod)
    blind = sorted(unreadable_vendors(alloc, errors)) if node is not None else []
    unbound = " (it is not bound to a node)" if node is None else ""
    if alloc is None and not blind:
        return f"the pod is counted as holding nothing, as the scheduler counts it{unbound}"
    if not blind:
        return f"its readable grants count and the others are left out, as the scheduler counts them{unbound}"
    return (
        f"{'its readable grants count, and ' if alloc is not None else ''}the {', '.join(blind)} devices of "
        f"node {node}, which it runs on, take no new pod while it runs (cordoned: CardCordoned), as the "
        "scheduler counts them"
    )


def simulate(
    node_docs: Iterable[Any],
    pod_docs: Iterable[Any],
    config: SchedulerConfig,
    now: float = 0.0,
    sources: tuple[str, str] = ("nodes", "pods"),
    scheduler_name: str = DEFAULT_SCHEDULER,
) -> SimResult:
    ledger, warnings, facts, allocatable = load_nodes(node_docs, config, sources[0])
    objects = flatten_objects(pod_docs, sources[1])
    run = _Run(ledger, facts, config, now, sources, warnings, scheduler_name)
    run.resources = NodeResources(allocatable)
    run.uids = Uids(sources[1], file_uids(objects))
    docs = _read_pods(objects, config, sources[1], warnings)
    for doc in docs:
        if doc is None or doc.delete:
            continue
        if doc.allocation is None:  # created by the file's events: the API server gives it its own uid
            doc.obj = run.uids.fresh(doc.obj, doc.index)
        if doc.first:  # bound before the file's events: on its node for kube-scheduler from the start
            run.resources.hold(doc.ref, running_on(doc.obj), doc.resources)
        if doc.first and not created_by_file(doc.obj) and run.charged(doc, "pending"):
            # a dump's pod exists before any pod the file creates: the API server's quota counts it
            # from the start, wherever the file lists it (until 1 Dec, from its place: review)
            run.api_quota.count(doc.ref, doc.obj, doc.label)
    for i in play_order(docs):
        doc = docs[i]
        if doc is None or not doc.delete:
            run.requeue()  # the deletions just before free room: the pending pods are tried again
        if doc is None:
            run.other(objects[i][1], objects[i][0])
        elif doc.delete:
            run.delete(doc)
        else:
            run.add(doc)
    run.requeue()
    # kube-scheduler goes on retrying its unschedulable pods (a pod the extender refused, on any
    # cluster event; every pod, at the latest after its periodic flush): the pods still pending are
    # tried against the cluster as the file leaves it, so their reasons are those of the final ledger
    run.retry(f"pending until the end of {sources[1]}, placed when kube-scheduler retried it")
    return run.result()


class _Run:
    """One simulation on the extender front end: the ledger and the outcomes so far."""

    def __init__(
        self,
        ledger: Ledger,
        facts: Mapping[str, NodeFacts],
        config: SchedulerConfig,
        now: float,
        sources: tuple[str, str],
        warnings: list[str],
        scheduler_name: str,
    ) -> None:
        self.ledger, self.config, self.now, self.sources, self.warnings = ledger, config, now, sources, warnings
        #: the API server's clock for its quota (a pod deleted past its grace period is not charged):
        #: ``now``, or the wall clock where it is 0 (the default, a fixed time for the annotations)
        self.clock = now or time.time()
        self.facts = [facts[n] for n in ledger.node_names()]
        # the nodes a pod asking nothing of labels may still be refused by (cordoned or tainted)
        self.guarded = [f for f in self.facts if f.unschedulable or any(t.effect in FILTERED_EFFECTS for t in f.taints)]
        self.admission = AdmissionSettings(config.vendors, scheduler_name=scheduler_name, front_end="extender")
        self.outcomes: dict[str, tuple[int, PodOutcome]] = {}  # ref -> (document position, outcome)
        self.keys: dict[str, str] = {}  # ref -> the ledger key of the live pod holding devices
        self.objects: dict[str, dict] = {}
        self.live = Names(sources[1])
        self.placed: dict[str, list[str]] = {}  # namespace -> the pods the simulation placed so far
        self.resources = NodeResources({})  # kube-scheduler's NodeResourcesFit (cpu, memory, pods)
        self.uids = Uids(sources[1])
        #: ref -> (node, vendors) of a running pod whose grant of those vendors cannot be read: their
        #: devices on that node are cordoned while it runs (hami.core.grants), as in the scheduler
        self.blind: dict[str, tuple[str, frozenset[str]]] = {}
        self.registered: dict[str, NodeDevices] = {}  # node -> its devices before such cordons
        self.api_quota = ApiServerQuota(sources[1])  # the API server's quota on extended resources
        self.created: dict[str, dict] = {}  # ref -> a pod being created as the webhook admitted it
        #: ref -> (its document, the pod as admitted) of each pod pending after a scheduling attempt,
        #: in arrival order: kube-scheduler's unschedulable pods, tried again by :meth:`retry`
        #: (what the attempt read: :meth:`state`, when it was tried on every node)
        self.waiting: dict[str, tuple[PodDoc, dict, tuple[int, int]]] = {}
        self.widened: set[str] = set()  # namespaces whose quota room may have grown since the last retry
        self.deleted: list[tuple[str, str]] = []  # (label, ref) of the deletions that free something, not retried yet
        self.freed: set[str] = set()  # the nodes where they freed something
        self.position = {n: i for i, n in enumerate(ledger.node_names())}  # the ledger's node order

    def result(self) -> SimResult:
        pods = [o for _, o in sorted(self.outcomes.values(), key=lambda pair: pair[0])]
        return SimResult(
            pods=pods, devices=_devices(self.ledger), warnings=self.warnings, ledger=self.ledger, objects=self.objects
        )

    # -------------------------------------------------------------- events
    def other(self, obj: dict, label: str = "") -> None:
        """A document that is not a pod: a ResourceQuota applies from here on (others were
        skipped with a warning when the file was read)."""
        meta = obj.get("metadata") or {}
        if obj.get("kind") != "ResourceQuota":
            return
        namespace = meta.get("namespace") or "default"
        self.api_quota.set_quota(obj, label)
        hard = (obj.get("spec") or {}).get("hard") or {}
        limited = {f"limits.{r}" for v in self.config.vendors for r in (v.resources.memory, v.resources.cores) if r}
        if (before := self.placed.get(namespace)) and limited & set(hard):
            # kubectl get pods,resourcequotas lists the quotas last: said, or it is silently not applied
            self.warnings.append(
                f"{self.sources[1]}: {label} ({_describe(obj)}): comes after pods of namespace {namespace} "
                f"placed without it ({_names(before)}): a quota applies from its place in the file on; to "
                "apply it to every pending pod, list the quotas first (kubectl get resourcequotas,pods -A -o yaml)"
            )
        self.widened.add(namespace)
        try:
            self.ledger.set_quota(
                namespace,
                meta.get("name") or "",
                hard,
                self.config.vendors,
            )
        except CoreError as exc:
            raise SimulationError(f"{self.sources[1]}: {exc}") from None

    def delete(self, doc: PodDoc) -> None:
        """The pod of this namespace/name goes, and its devices with it (whatever its uid); if it
        held anything (GPUs, a node's cpu, memory or pods, a cordon), the pods pending now are
        tried again once the deletions in a row that it is part of are done (:meth:`requeue`), as
        kube-scheduler requeues its unschedulable pods when an assigned pod is deleted."""
        self.live.remove(pod_name(doc.obj))
        self.waiting.pop(doc.ref, None)
        freed: set[str] = set()  # the nodes it held something on
        key = self.keys.pop(doc.ref, None)
        if key is not None:
            alloc = self.ledger.remove_pod(key)
            if alloc is not None:
                freed.add(alloc.node)
            self.uids.release(key)
        if doc.ref in self.resources.held:
            freed.add(self.resources.held[doc.ref][0])
        self.resources.release(doc.ref)
        self.api_quota.uncount(doc.ref)
        gone = self.blind.pop(doc.ref, None)
        if gone is not None:
            freed.add(gone[0])
            self._recordon(gone[0])
        if doc.ref in self.outcomes:
            self.outcomes[doc.ref][1].status = "deleted"
        if key is not None:  # its grant leaves its namespace's quota room too, on every node
            self.widened.add((doc.obj.get("metadata") or {}).get("namespace") or "default")
        if freed or key is not None:
            self.deleted.append((doc.label, doc.ref))
            self.freed |= freed

    def requeue(self) -> None:
        """The retry (:meth:`retry`) that the deletions since the last other event make, on the
        nodes they freed: called before each document that is not a deletion, and at the end."""
        if not self.deleted:
            return
        (label, ref), n = self.deleted[0], len(self.deleted)
        more = f" and {n - 1} more pod{'s' if n > 2 else ''} up to {self.deleted[-1][0]}" if n > 1 else ""
        note = f"pending until {self.sources[1]}: {label} deleted {ref}{more}, then placed on kube-scheduler's retry"
        freed, self.freed, self.deleted = self.freed, set(), []
        self.retry(note, freed)

    def retry(self, note: str, freed: AbstractSet[str] | None = None) -> None:
        """kube-scheduler's retry of its unschedulable pods: each pod pending after its scheduling
        attempt (:attr:`waiting`) is tried again, in arrival order, against the ledger as it is
        now; one that fits is placed (``note`` says how). Nothing is admitted again (the webhook
        and the API server's quota saw the pod at its creation: the quota counts it already, as a
        pending pod).

        With ``freed`` (after deletions: the nodes where they held something) a pod is tried on
        those nodes only, unless its namespace's quota room grew since the last retry
        (:attr:`widened`): the other nodes have only filled since its last attempt (deletions
        always retry), where it did not fit; one that still does not fit keeps its outcome
        until the last retry (``freed`` None, after the file's last document), which tries every
        pod on every node and gives the reasons of that attempt (not a pod whose last attempt read
        the same state, :meth:`state`: a dump's pending pods, tried after the pods holding GPUs).
        Until a retry places a pod, a pod asking exactly what one that did not fit asked (same
        namespace, labels, annotations and spec) does not fit either: it gets that pod's reasons
        without a second attempt (a cluster's pending pods are mostly replicas)."""
        widened, self.widened = self.quota_room_grew(), set()
        failed: dict[tuple[str, bool], dict[str, str]] = {}  # (pod's shape, tried everywhere) -> reasons
        for ref, (doc, admitted, state) in list(self.waiting.items()):
            if freed is None and state == self.state():  # its reasons are those of this very state
                continue
            index, before = self.outcomes[ref]
            only = None if freed is None or before.namespace in widened else freed
            shape = (_shape(admitted), only is None)
            out = PodOutcome(namespace=before.namespace, name=before.name, status="pending")
            if shape in failed:
                reasons = failed[shape]
            else:
                try:
                    self._attempt(doc, out, admitted, only)
                except CoreError as exc:
                    raise SimulationError(f"{self.sources[1]}: {exc}") from None
                if out.status != "pending":
                    del self.waiting[ref]
                    out.note = note
                    self.outcomes[ref] = (index, out)
                    failed.clear()  # (the reasons on its node change with it)
                    continue
                reasons = failed[shape] = out.reasons
            if only is None:  # tried on every node: the reasons of this attempt
                self.outcomes[ref] = (index, _stuck(out, admitted, dict(reasons)))

    def quota_room_grew(self) -> set[str]:
        """The namespaces whose quota room may have grown since the last retry (a grant deleted,
        a ResourceQuota given): a retry tries their pods on every node."""
        return {ns for ns in self.widened if self.ledger.quota_room(ns, self.config.vendors) is not None}

    def add(self, doc: PodDoc) -> None:
        self.live.add(pod_name(doc.obj), doc.obj, doc.label, RECREATE)
        if not finished(doc.obj) and running_on(doc.obj):
            self.resources.hold(doc.ref, running_on(doc.obj), doc.resources)
        self.outcomes.pop(doc.ref, None)
        self.waiting.pop(doc.ref, None)
        outcome = self._place(doc)
        self.outcomes[doc.ref] = (doc.index, outcome)
        self.objects[doc.ref] = doc.obj
        created = self.created.pop(doc.ref, doc.obj)
        if self.charged(doc, outcome.status):
            self.api_quota.count(doc.ref, created, doc.label)  # (replacing what counted it before)
        else:
            self.api_quota.uncount(doc.ref)

    def charged(self, doc: PodDoc, status: str) -> bool:
        """Whether the API server's quota counts the pod of ``doc`` (outcome ``status``), as
        Kubernetes' QuotaV1Pod: not a pod never created (denied) or finished (phase Succeeded or
        Failed), nor one still there past its deletion's grace period (:func:`quota_released_at`)."""
        if status in ("denied", "finished") or finished(doc.obj):
            return False
        return doc.released_at is None or self.clock <= doc.released_at

    # -------------------------------------------------------------- one pod
    def _place(self, doc: PodDoc) -> PodOutcome:
        pod = doc.obj
        meta = pod.get("metadata") or {}
        out = PodOutcome(namespace=meta.get("namespace") or "default", name=meta.get("name") or "", status="pending")
        if finished(pod):  # Succeeded or Failed: holds nothing, is not scheduled again
            out.status, out.containers = "finished", _containers(pod, {})
            return out
        if doc.allocation is not None:
            self._hold(doc, doc.allocation)
            self._cordon(doc)
            out.status, out.node = ("terminating" if doc.terminating else "pre-placed"), doc.allocation.node
            out.containers = _containers(pod, doc.allocation.devices)
            return out
        if doc.terminating or (doc.unreadable and bound_node(pod)):  # placed already: not scheduled anew
            self._cordon(doc)
            out.status = "terminating" if doc.terminating else "pre-placed"
            out.node, out.containers = bound_node(pod), _containers(pod, {})
            return out
        try:
            if bound_node(pod):
                if created_by_file(pod) and (why := self.api_quota.refusal(pod, doc.label)):
                    return self._refused(out, pod, {"apiserver": why})
                return self._attempt(doc, out, admit_pod(pod, self.config.vendors)[0])
            return self._schedule(doc, out)
        except CoreError as exc:
            raise SimulationError(f"{self.sources[1]}: {exc}") from None

    def _hold(self, doc: PodDoc, alloc: PodAllocation) -> None:
        """A pod placed before: counted as its annotations say (as the scheduler counts it), with
        a warning for what no scheduler could have given (an unknown node or GPU, a GPU over its
        capacity). It keeps its uid, which no other live pod holding a grant may have."""
        self.uids.hold(alloc.key, doc.obj, doc.label)
        self.ledger.add_pod(alloc)
        self.keys[doc.ref] = alloc.key
        for problem in placement_problems(self.ledger, alloc, self.config.vendors, self.sources[0]):
            self.warnings.append(f"{self.sources[1]}: {doc.label} ({_describe(doc.obj)}): {problem}")

    def _cordon(self, doc: PodDoc) -> None:
        """A running pod whose grant of some vendor cannot be read: that vendor's devices on its
        node take no new pod while it runs (:func:`hami.core.grants.cordon_vendors`)."""
        node = running_on(doc.obj)
        if doc.blind and node is not None:
            self.blind[doc.ref] = (node, doc.blind)
            self._recordon(node)

    def _recordon(self, node: str) -> None:
        if not self.ledger.has_node(node):
            return
        registered = self.registered.setdefault(node, self.ledger.node(node))
        vendors = frozenset(v for n, vs in self.blind.values() if n == node for v in vs)
        self.ledger.set_node(cordon_vendors(registered, vendors))

    def _attempt(
        self, doc: PodDoc, out: PodOutcome, admitted: dict, only: AbstractSet[str] | None = None
    ) -> PodOutcome:
        """One scheduling attempt of an admitted pod (its first, or a :meth:`retry`, on the nodes
        ``only`` where given): a pod bound by ``spec.nodeName`` is fitted on that node, another
        goes through kube-scheduler's node filters and HAMi's Filter. Left pending by what the
        cluster holds, it waits in :attr:`waiting` for the next retry (not one whose Filter fails
        on the pod itself)."""
        bound = bound_node(doc.obj)
        if bound:
            if only is None or bound in only:
                self._fit_bound(admitted, bound, out)
        else:
            self._fit(doc, out, admitted, only)
        # ("*": the Filter failed on the pod itself; a retry on some nodes leaves its entry as it was)
        if out.status == "pending" and "*" not in out.reasons and only is None:
            self.waiting[doc.ref] = (doc, admitted, self.state())
        return out

    def state(self) -> tuple[int, int]:
        """A number for what a scheduling attempt reads that changes (the ledger's generation,
        NodeResourcesFit's changes): equal, an attempt gives the same answer."""
        return self.ledger.generation(), self.resources.changes

    def _fit_bound(self, admitted: dict, bound: str, out: PodOutcome) -> PodOutcome:
        """A pod bound by ``spec.nodeName`` without an allocation: fitted on that node alone."""
        try:
            result = schedule_pod(admitted, [bound], self.ledger, self.config, self.now)
        except CoreError as exc:  # the scheduler's Filter fails on the pod (e.g. a bad policy annotation)
            return _stuck(out, admitted, {"*": str(exc)})
        if not self.ledger.has_node(bound) and result.needs_devices and result.node is None:
            return _stuck(out, admitted, {bound: unknown_node(bound, self.sources[0])})
        return self._outcome(out, admitted, result, {})

    def _refused(self, out: PodOutcome, pod: Mapping[str, Any], reasons: dict[str, str]) -> PodOutcome:
        """A pod refused at its creation (by the webhook, or the API server's quota): ``denied``."""
        admit_pod(pod, self.config.vendors)  # a request the admission cannot read stops the run
        out.status, out.reasons = "denied", reasons
        out.containers = _containers(pod, {})
        return out

    def _schedule(self, doc: PodDoc, out: PodOutcome) -> PodOutcome:
        """A new pod: the webhook's admission, kube-scheduler's node filters, HAMi's Filter."""
        pod = doc.obj
        # the namespace quota at admission only for a pod being created (a dumped one: Filter's)
        room = self.ledger.quota_room if created_by_file(pod) else None
        decision = decide(pod, self.admission, quota_room=room)
        if not decision.allowed:
            return self._refused(out, pod, {"webhook": decision.message})
        if created_by_file(pod):  # then the API server's own quota admission, on what the webhook made of it
            made = decision.pod or pod
            if why := self.api_quota.refusal(made, doc.label):
                return self._refused(out, pod, {"apiserver": why})
            self.created[doc.ref] = made
        admitted, _ = admit_pod(pod, self.config.vendors)
        gates = scheduling_gates(pod)
        if gates:  # kube-scheduler keeps it out of scheduling until the gates go: it holds nothing
            return _stuck(out, admitted, {"*": gated_reason(gates)})
        try:
            if not pod_request(admitted, self.config.vendors).has_devices:
                out.status, out.containers = "no-devices", _containers(admitted, {})
                return out
        except CoreError as exc:
            return _stuck(out, admitted, {"*": str(exc)})
        scheduler = ((decision.pod or pod).get("spec") or {}).get("schedulerName")
        if scheduler != self.admission.scheduler_name:
            return _stuck(out, admitted, {"*": other_scheduler(scheduler, self.admission.scheduler_name)})
        return self._attempt(doc, out, admitted)

    def _fit(self, doc: PodDoc, out: PodOutcome, admitted: dict, only: AbstractSet[str] | None = None) -> PodOutcome:
        """kube-scheduler's node filters and NodeResourcesFit, then HAMi's Filter on the nodes left
        (of the nodes ``only``, where given: then a pod that fits none of them is left as it was)."""
        refused = self._filter(doc.asks)
        # NodeResourcesFit, on the usable nodes the filters above left (its words are written only
        # for a pod left pending: a filling cluster refuses hundreds of nodes to every pod)
        short = {n: r for n, r in self.resources.short(doc.resources, refused).items() if self.ledger.has_node(n)}
        left_out = refused.keys() | short.keys() if short else refused.keys()
        if only is not None:  # a retry on the nodes a deletion freed
            candidates: list[str] | None = sorted(
                (n for n in only if n in self.position and n not in left_out), key=self.position.__getitem__
            )
            if not candidates:
                return out
        else:
            candidates = None if not left_out else [n for n in self.ledger.node_names() if n not in left_out]
        if candidates == []:
            return _stuck(out, admitted, {**refused, **self.resources.reasons(short, doc.resources or {})})
        try:
            result = schedule_pod(admitted, candidates, self.ledger, self.config, self.now)
        except CoreError as exc:  # the scheduler's Filter fails on the pod (e.g. a bad policy annotation)
            return _stuck(out, admitted, {"*": str(exc)})
        if short and result.node is None:
            refused.update(self.resources.reasons(short, doc.resources or {}))
        self._outcome(out, admitted, result, refused)
        if out.status == "scheduled":
            self.resources.hold(doc.ref, out.node, doc.resources)
        return out

    def _filter(self, asks: PodAsks | None) -> dict[str, str]:
        """kube-scheduler's refusals of the usable nodes (node -> reason) for a pod asking ``asks``."""
        if asks is None:
            return {}
        return filter_nodes(asks, self.facts if asks.anything else self.guarded)

    def _outcome(self, out: PodOutcome, admitted: dict, result: Any, refused: Mapping[str, str]) -> PodOutcome:
        if not result.needs_devices:
            out.status, out.containers = "no-devices", _containers(admitted, {})
        elif result.node is None:
            _stuck(out, admitted, dict(sorted({**refused, **result.reasons()}.items())))
        else:
            out.status, out.node = "scheduled", result.node
            self.placed.setdefault(out.namespace, []).append(out.name)
            out.containers = _containers(admitted, result.allocation.devices)
            self.keys[pod_ref(admitted)] = result.allocation.key
        return out


def _shape(pod: Mapping[str, Any]) -> str:
    """What the scheduler's answer for an admitted pod depends on: its namespace, labels,
    annotations and spec (not its name or uid)."""
    meta = pod.get("metadata") or {}
    what = [meta.get("namespace") or "default", meta.get("labels"), meta.get("annotations"), pod.get("spec")]
    return json.dumps(what, sort_keys=True, default=str)


def _stuck(out: PodOutcome, pod: Mapping[str, Any], reasons: dict[str, str]) -> PodOutcome:
    """``out`` as a pending pod with ``reasons`` (node, or ``*`` for every node -> why)."""
    out.status, out.reasons, out.containers = "pending", reasons, _containers(pod, {})
    return out


def other_scheduler(name: Any, ours: str) -> str:
    """The reason of a device pod for another scheduler (the webhook leaves it alone)."""
    return (
        f"spec.schedulerName is {name!r}: the webhook leaves the pod alone and HAMi's scheduler ({ours}) "
        "does not place it (its own scheduler does, unseen by HAMi's accounting)"
    )


def placement_problems(ledger: Ledger, alloc: PodAllocation, vendors: Iterable[Any], nodes_source: str) -> list[str]:
    """What no scheduler could have given, in an allocation read from a pod's annotations (the
    ledger already counting it): a node that is not a usable node, a GPU its node does not
    register, a GPU now over its slots, memory or cores."""
    if not ledger.has_node(alloc.node):
        return [
            f"{VGPU_NODE} is {alloc.node}, which is not a usable node of {nodes_source}: its grants count "
            "against its namespace's quota only, as the scheduler counts them"
        ]
    ids = {d.id for d in ledger.node(alloc.node).devices}
    out = [
        f"its grant names {uuid}, which node {alloc.node} does not register: that grant counts against no GPU"
        for uuid in sorted({u.uuid for u in alloc.usage} - ids)
    ]
    masks = {v.name for v in vendors if getattr(v, "cores_are_masks", False)}
    mine = {u.uuid for u in alloc.usage}
    for d, used, usedmem, usedcores in ledger.device_usage(alloc.node):
        if d.id not in mine:
            continue
        over = [f"slots {used}/{d.count}"] if used > d.count else []
        over += [f"memory {usedmem}/{d.devmem} MiB"] if usedmem > d.devmem else []
        over += [f"cores {usedcores}/{d.devcore}"] if usedcores > d.devcore and d.vendor not in masks else []
        if over:
            out.append(
                f"{d.id} on node {alloc.node} is over its capacity with this pod ({', '.join(over)}); "
                "the scheduler counts the grant as written"
            )
    return out


def _devices(ledger: Ledger) -> list[dict]:
    rows = []
    for node in ledger.node_names():
        for d, used, usedmem, usedcores in ledger.device_usage(node):
            rows.append(
                {
                    "node": node,
                    "uuid": d.id,
                    "index": d.index,
                    "type": d.type,
                    "used": used,
                    "count": d.count,
                    "usedmem": usedmem,
                    "totalmem": d.devmem,
                    "usedcores": usedcores,
                    "totalcore": d.devcore,
                    "health": d.health,
                    "cordoned": d.id in ledger.node(node).cordoned,
                }
            )
    return rows
