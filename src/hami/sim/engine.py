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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from hami.core import (
    CoreError,
    Ledger,
    PodAllocation,
    SchedulerConfig,
    admit_pod,
    allocation_from_pod,
    pod_request,
    read_node_devices,
    schedule_pod,
)
from hami.core.names import VGPU_NODE
from hami.core.quantity import QuantityError, parse_quantity
from hami.core.requests import ordered_containers, pod_name
from hami.core.shape import META, POD, QUOTA, ShapeError, check
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


def check_document(obj: dict, schema: Any, source: str, label: str) -> None:
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
        devs = []
        for vendor in sorted(devices):
            per = devices[vendor]
            if ci < len(per):
                devs.extend(_device(d) for d in per[ci])
        out.append({"name": c.get("name") or str(ci), "devices": devs})
    return out


def load_nodes(
    node_docs: Iterable[Any], config: SchedulerConfig, source: str = "nodes"
) -> tuple[Ledger, list[str], dict[str, NodeFacts]]:
    """The nodes file -> ``(ledger of the usable nodes, warnings, what kube-scheduler's node
    filters read of each Node)``."""
    ledger = Ledger(config.vendors)
    warnings: list[str] = []
    facts: dict[str, NodeFacts] = {}
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
    return ledger, warnings, facts


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


@dataclass
class PodDoc:
    """One Pod document of the pods file, read once (shape, name, what it holds, what it asks)."""

    index: int  # position among the file's objects: the order of the output
    label: str
    obj: dict
    ref: str
    delete: bool  # metadata.deletionTimestamp on a pod the file gave earlier: it is deleted here
    first: bool  # the first document of its namespace/name
    allocation: PodAllocation | None = None  # what its allocation annotations say it holds
    unreadable: str = ""  # why its allocation annotation cannot be read (it then holds nothing)
    asks: PodAsks | None = None  # what it asks of a node (kube-scheduler's filters)

    @property
    def terminating(self) -> bool:
        return not self.delete and bool((self.obj.get("metadata") or {}).get("deletionTimestamp"))

    @property
    def held(self) -> bool:
        """Placed before the file's events: it holds what its annotations say (nothing when they
        cannot be read and it is bound), or it is terminating."""
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
        try:
            doc.allocation = allocation_from_pod(obj, config.vendors)
        except CoreError as exc:
            doc.unreadable = str(exc)
            warnings.append(
                f"{source}: {label}: {exc}; the pod is counted as holding nothing, as the scheduler counts it"
            )
    return out


def simulate(
    node_docs: Iterable[Any],
    pod_docs: Iterable[Any],
    config: SchedulerConfig,
    now: float = 0.0,
    sources: tuple[str, str] = ("nodes", "pods"),
    scheduler_name: str = DEFAULT_SCHEDULER,
) -> SimResult:
    ledger, warnings, facts = load_nodes(node_docs, config, sources[0])
    run = _Run(ledger, facts, config, now, sources, warnings, scheduler_name)
    objects = flatten_objects(pod_docs, sources[1])
    docs = _read_pods(objects, config, sources[1], warnings)
    for i in play_order(docs):
        doc = docs[i]
        if doc is None:
            run.other(objects[i][1], objects[i][0])
        elif doc.delete:
            run.delete(doc)
        else:
            run.add(doc)
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
        self.facts = [facts[n] for n in ledger.node_names()]
        # the nodes a pod asking nothing of labels may still be refused by (cordoned or tainted)
        self.guarded = [f for f in self.facts if f.unschedulable or any(t.effect in FILTERED_EFFECTS for t in f.taints)]
        self.admission = AdmissionSettings(config.vendors, scheduler_name=scheduler_name, front_end="extender")
        self.outcomes: dict[str, tuple[int, PodOutcome]] = {}  # ref -> (document position, outcome)
        self.keys: dict[str, str] = {}  # ref -> the ledger key of the live pod holding devices
        self.objects: dict[str, dict] = {}
        self.live = Names(sources[1])
        self.placed: dict[str, list[str]] = {}  # namespace -> the pods the simulation placed so far

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
        hard = (obj.get("spec") or {}).get("hard") or {}
        limited = {f"limits.{r}" for v in self.config.vendors for r in (v.resources.memory, v.resources.cores) if r}
        if (before := self.placed.get(namespace)) and limited & set(hard):
            # kubectl get pods,resourcequotas lists the quotas last: said, or it is silently not applied
            self.warnings.append(
                f"{self.sources[1]}: {label} ({_describe(obj)}): comes after pods of namespace {namespace} "
                f"placed without it ({_names(before)}): a quota applies from its place in the file on; to "
                "apply it to every pending pod, list the quotas first (kubectl get resourcequotas,pods -A -o yaml)"
            )
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
        """The pod of this namespace/name goes, and its devices with it (whatever its uid)."""
        self.live.remove(pod_name(doc.obj))
        key = self.keys.pop(doc.ref, None)
        if key is not None:
            self.ledger.remove_pod(key)
        if doc.ref in self.outcomes:
            self.outcomes[doc.ref][1].status = "deleted"

    def add(self, doc: PodDoc) -> None:
        self.live.add(pod_name(doc.obj), doc.obj, doc.label, RECREATE)
        self.outcomes.pop(doc.ref, None)
        self.outcomes[doc.ref] = (doc.index, self._place(doc))
        self.objects[doc.ref] = doc.obj

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
            out.status, out.node = ("terminating" if doc.terminating else "pre-placed"), doc.allocation.node
            out.containers = _containers(pod, doc.allocation.devices)
            return out
        if doc.terminating or (doc.unreadable and bound_node(pod)):  # placed already: not scheduled anew
            out.status = "terminating" if doc.terminating else "pre-placed"
            out.node, out.containers = bound_node(pod), _containers(pod, {})
            return out
        try:
            if bound_node(pod):
                return self._fit_bound(pod, out)
            return self._schedule(doc, out)
        except CoreError as exc:
            raise SimulationError(f"{self.sources[1]}: {exc}") from None

    def _hold(self, doc: PodDoc, alloc: PodAllocation) -> None:
        """A pod placed before: counted as its annotations say (as the scheduler counts it), with
        a warning for what no scheduler could have given (an unknown node or GPU, a GPU over its
        capacity)."""
        self.ledger.add_pod(alloc)
        self.keys[doc.ref] = alloc.key
        for problem in placement_problems(self.ledger, alloc, self.config.vendors, self.sources[0]):
            self.warnings.append(f"{self.sources[1]}: {doc.label} ({_describe(doc.obj)}): {problem}")

    def _fit_bound(self, pod: dict, out: PodOutcome) -> PodOutcome:
        """A pod bound by ``spec.nodeName`` without an allocation: fitted on that node alone."""
        admitted, _ = admit_pod(pod, self.config.vendors)
        bound = bound_node(pod)
        try:
            result = schedule_pod(admitted, [bound] if bound else None, self.ledger, self.config, self.now)
        except CoreError as exc:  # the scheduler's Filter fails on the pod (e.g. a bad policy annotation)
            return _stuck(out, admitted, {"*": str(exc)})
        if bound and not self.ledger.has_node(bound) and result.needs_devices and result.node is None:
            return _stuck(out, admitted, {bound: unknown_node(bound, self.sources[0])})
        return self._outcome(out, admitted, result, {})

    def _schedule(self, doc: PodDoc, out: PodOutcome) -> PodOutcome:
        """A new pod: the webhook's admission, kube-scheduler's node filters, HAMi's Filter."""
        pod = doc.obj
        decision = decide(pod, self.admission)
        if not decision.allowed:
            admit_pod(pod, self.config.vendors)  # a request the admission cannot read stops the run
            out.status, out.reasons = "denied", {"webhook": decision.message}
            out.containers = _containers(pod, {})
            return out
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
        refused = self._filter(doc.asks)
        candidates = None if not refused else [n for n in self.ledger.node_names() if n not in refused]
        if candidates == []:
            return _stuck(out, admitted, refused)
        try:
            result = schedule_pod(admitted, candidates, self.ledger, self.config, self.now)
        except CoreError as exc:  # the scheduler's Filter fails on the pod (e.g. a bad policy annotation)
            return _stuck(out, admitted, {"*": str(exc)})
        return self._outcome(out, admitted, result, refused)

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
