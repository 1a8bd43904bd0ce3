"""The simulation: Kubernetes objects in, placement report out (no I/O here).

Pods go through the same admission defaults (:func:`hami.core.admit_pod`) and the same
:func:`hami.core.schedule_pod` the extender uses. A pod document with
``metadata.deletionTimestamp`` deletes that pod; a pod that already carries
``hami.io/vgpu-node`` and allocation annotations is taken as already placed, one with only
``spec.nodeName`` is fitted on that node alone; a ResourceQuota
document sets namespace quota from that point on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from hami.core import (
    CoreError,
    Ledger,
    SchedulerConfig,
    admit_pod,
    allocation_from_pod,
    read_node_devices,
    pod_key,
    schedule_pod,
)
from hami.core.quantity import QuantityError, parse_quantity
from hami.core.requests import ordered_containers, pod_name
from hami.core.shape import META, POD, QUOTA, ShapeError, check


class SimulationError(Exception):
    """Bad input that stops the run; the message is the one line to print."""


@dataclass
class PodOutcome:
    namespace: str
    name: str
    status: str  # "scheduled" | "pending" | "no-devices" | "pre-placed" | "deleted"
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


def load_nodes(node_docs: Iterable[Any], config: SchedulerConfig, source: str = "nodes") -> tuple[Ledger, list[str]]:
    ledger = Ledger(config.vendors)
    warnings: list[str] = []
    names = Names(source)
    for label, obj in flatten_objects(node_docs, source):
        if (obj.get("kind") or "Node") != "Node":
            warnings.append(
                f"{source}: skipping {obj.get('kind')} {(obj.get('metadata') or {}).get('name')}: not a Node"
            )
            continue
        name = object_name(obj, source, label)
        names.add(name, obj, label)
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
            keys = ", ".join(v.register_annotation for v in config.vendors)
            warnings.append(f"skipping node {name}: no device registration annotation ({keys})")
            continue
        ledger.set_node(nd)
    if not names.seen:
        raise SimulationError(f"{source}: no Node object in the file (kubectl get nodes -o yaml > {source})")
    if not ledger.node_names():
        first = f": {warnings[0]}" if warnings else ""
        raise SimulationError(f"{source}: no usable node (every Node lacks a valid registration annotation){first}")
    return ledger, warnings


def simulate(
    node_docs: Iterable[Any],
    pod_docs: Iterable[Any],
    config: SchedulerConfig,
    now: float = 0.0,
    sources: tuple[str, str] = ("nodes", "pods"),
) -> SimResult:
    ledger, warnings = load_nodes(node_docs, config, sources[0])
    outcomes: dict[str, PodOutcome] = {}
    objects: dict[str, dict] = {}
    live = Names(sources[1])
    for label, obj in flatten_objects(pod_docs, sources[1]):
        kind = obj.get("kind") or "Pod"
        meta = obj.get("metadata") or {}
        if kind == "ResourceQuota":
            check_document(obj, QUOTA, sources[1], label)
            try:
                ledger.set_quota(
                    meta.get("namespace") or "default",
                    meta.get("name") or "",
                    (obj.get("spec") or {}).get("hard") or {},
                    config.vendors,
                )
            except CoreError as exc:
                raise SimulationError(f"{sources[1]}: {exc}") from None
            continue
        if kind != "Pod":
            warnings.append(f"{sources[1]}: skipping {kind} {meta.get('name')}: not a Pod")
            continue
        check_document(obj, POD, sources[1], label)
        object_name(obj, sources[1], label)
        key = pod_key(obj)
        if meta.get("deletionTimestamp"):
            live.remove(pod_name(obj))
            ledger.remove_pod(key)
            if key in outcomes:
                outcomes[key].status = "deleted"
            else:
                warnings.append(f"{sources[1]}: pod {pod_name(obj)} deleted before it was created")
            continue
        live.add(pod_name(obj), obj, label, RECREATE)
        check_pod_resources(obj, config.vendors, sources[1], label, warnings)
        outcomes.pop(key, None)
        outcomes[key] = _place(obj, ledger, config, now, sources)
        objects[f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"] = obj
    return SimResult(
        pods=list(outcomes.values()), devices=_devices(ledger), warnings=warnings, ledger=ledger, objects=objects
    )


def _place(pod: dict, ledger: Ledger, config: SchedulerConfig, now: float, sources: tuple[str, str]) -> PodOutcome:
    source = sources[1]
    meta = pod.get("metadata") or {}
    out = PodOutcome(namespace=meta.get("namespace") or "default", name=meta.get("name") or "", status="pending")
    try:
        existing = allocation_from_pod(pod, config.vendors)
        if existing is not None:
            ledger.add_pod(existing)
            out.status, out.node = "pre-placed", existing.node
            out.containers = _containers(pod, existing.devices)
            return out
        admitted, _ = admit_pod(pod, config.vendors)
        bound = (pod.get("spec") or {}).get("nodeName")  # already bound: only that node is a candidate
        result = schedule_pod(admitted, [bound] if bound else None, ledger, config, now)
    except CoreError as exc:
        raise SimulationError(f"{source}: {exc}") from None
    if not result.needs_devices:
        out.status = "no-devices"
        out.containers = _containers(admitted, {})
    elif result.node is None:
        out.reasons = result.reasons()
        if bound and bound not in ledger.node_names():
            out.reasons = {bound: unknown_node(bound, sources[0])}
        out.containers = _containers(admitted, {})
    else:
        out.status, out.node = "scheduled", result.node
        out.containers = _containers(admitted, result.allocation.devices)
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
