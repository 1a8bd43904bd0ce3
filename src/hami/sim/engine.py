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
    node_devices_from_object,
    pod_key,
    schedule_pod,
)
from hami.core.requests import pod_name
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
    ledger = Ledger()
    warnings: list[str] = []
    for _, obj in flatten_objects(node_docs, source):
        name = (obj.get("metadata") or {}).get("name") or "?"
        if (obj.get("kind") or "Node") != "Node":
            warnings.append(f"{source}: skipping {obj.get('kind')} {name}: not a Node")
            continue
        try:
            nd = node_devices_from_object(obj, config.vendors)
        except CoreError as exc:
            warnings.append(f"skipping node {name}: {exc}")
            continue
        if not nd.devices:
            keys = ", ".join(v.register_annotation for v in config.vendors)
            warnings.append(f"skipping node {name}: no device registration annotation ({keys})")
            continue
        ledger.set_node(nd)
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
        key = pod_key(obj)
        if meta.get("deletionTimestamp"):
            ledger.remove_pod(key)
            if key in outcomes:
                outcomes[key].status = "deleted"
            else:
                warnings.append(f"{sources[1]}: pod {pod_name(obj)} deleted before it was created")
            continue
        outcomes.pop(key, None)
        outcomes[key] = _place(obj, ledger, config, now, sources[1])
        objects[f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"] = obj
    return SimResult(
        pods=list(outcomes.values()), devices=_devices(ledger), warnings=warnings, ledger=ledger, objects=objects
    )


def _place(pod: dict, ledger: Ledger, config: SchedulerConfig, now: float, source: str) -> PodOutcome:
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
