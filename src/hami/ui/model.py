"""The ``/api/v1`` documents, built from the scheduler's ledger and watch cache (pure: no I/O).

A *source* is anything with the attributes of :class:`hami.scheduler.state.ClusterState` that
are read here: ``ledger``, ``vendors``, ``config``, ``nodes`` (name -> Node), ``pods``
("ns/name" -> Pod) and ``quotas`` ("ns/name" -> ResourceQuota), and where it has one
``held_back_vendors(node)`` (the vendors whose devices there a running pod's unreadable grant
holds back). :class:`Snapshot` is a source
made of a ledger alone (``hami simulate``). Live usage comes as ``{node: NodeReading}`` from
:mod:`.live`; ``None`` means it is not configured.

DRA allocations (driver ``gpu.hami.io``) come from the source's optional ``claims`` ("ns/name" ->
:class:`hami.dra.claims.ClaimUsage`) and ``slices`` (name -> ResourceSlice): a GPU the DRA front
end publishes is listed with what its claims consume, and each allocated claim is an item of
``/api/v1/pods`` beside the extender's pods; every device and allocation says its ``frontEnd``.

Units: memory in MiB everywhere (the ledger's unit, after each vendor's memory factor); cores in
the unit the vendor gives (``coreUnit``: "percent" of one device for NVIDIA, "AI cores" for an
Ascend vNPU, ...). The shape of every document is ``openapi.yaml``; the contract test checks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
import time
from typing import Any, Callable, Collection, Iterable, Mapping

from hami.core import CoreError, Ledger, admit_pod, pod_key
from hami.core.explain import pending_verdict
from hami.core.nodefit import left_out as nodefit_left_out
from hami.core.names import BIND_PHASE
from hami.core.requests import ordered_containers, pod_request
from hami.core.types import ContainerDevice, DeviceInfo
from hami.dra.claims import ClaimUsage, slice_devices
from hami.dra.explain import DeviceUse, add_claims, gated_reason, scheduling_gates
from hami.dra.model import CORDON_TAINT_KEY, CORES, DRIVER, MEMORY, MIB, PROFILE, SHARES, UNHEALTHY_TAINT_KEY

from .live import NodeReading, Usage

API_VERSION = "v1"
MAX_PENDING = 50  # pending pods explained per /api/v1/pending answer (each runs the filter on every node)
PENDING_BUDGET_S = 0.5  # and no more explaining than this per answer: it runs on the scheduler's event loop
SECRET_HINTS = ("token", "secret", "password", "credential", "key")
#: why a device is ``CardCordoned`` on a node where a running pod's grant cannot be read (the
#: words of :data:`hami.scheduler.state.HELD_BACK`; the pod is not named: every tenant reads this)
HELD_BACK = "held back: a running pod's allocation on this node cannot be read"
#: what a pending pod's verdict does not check: kube-scheduler's own filters on the node's
#: cpu, memory and pod count (the cache holds only the pods with devices, not what every pod on
#: a node requests), so a pod whose devices fit may still be refused there (found by review, 1 Dec)
NOT_CHECKED = (
    "its devices fit now; kube-scheduler's own resource filters (cpu, memory, pod count) are not "
    "checked here: if it stays pending, its events say why (kubectl describe pod)"
)


class FilterError(ValueError):
    """A query parameter the API does not know, or a bad value; the message names it."""


@dataclass
class Snapshot:
    """A source without a live cluster: a ledger and the objects behind it (``hami simulate``)."""

    ledger: Ledger
    vendors: tuple
    config: Any = None
    nodes: dict = field(default_factory=dict)
    pods: dict = field(default_factory=dict)
    quotas: dict = field(default_factory=dict)


def _stamp(now: float) -> str:
    return datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def envelope(kind: str, now: float, items: list, **extra: Any) -> dict:
    return {"apiVersion": API_VERSION, "kind": kind, "generatedAt": _stamp(now), "items": items, **extra}


def _vendor_map(vendors: Iterable[Any]) -> dict[str, Any]:
    return {v.name: v for v in vendors}


def core_unit(vendor: Any, device: DeviceInfo) -> str:
    unit = getattr(vendor, "core_unit", None)
    return unit(device) if callable(unit) else "percent"


def _node_ready(node: Mapping[str, Any] | None) -> bool | None:
    if not node:
        return None
    for cond in (node.get("status") or {}).get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return None


def _usage_doc(usage: Usage | None, state: str) -> dict:
    if usage is None:
        return {"state": state, "memoryUsedMiB": None, "utilizationPercent": None}
    return {"state": state, "memoryUsedMiB": usage.memory_mib, "utilizationPercent": usage.utilization}


def _reading_state(reading: NodeReading | None, now: float) -> str:
    if reading is None or reading.scraped_at is None:
        return "unavailable"
    return "live" if reading.fresh(now) else "stale"


def _monitor_doc(reading: NodeReading | None, live_on: bool, now: float) -> dict:
    if not live_on:
        return {"state": "unavailable", "ageSeconds": None, "error": "live usage is not configured (--ui-monitor-url)"}
    age = None if reading is None or reading.scraped_at is None else round(max(now - reading.scraped_at, 0.0), 1)
    return {
        "state": _reading_state(reading, now),
        "ageSeconds": age,
        "error": reading.error if reading is not None else "not scraped yet",
    }


def _matches(value: str, wanted: str | None) -> bool:
    return wanted is None or value == wanted


def _check_params(params: Mapping[str, str], allowed: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for key, value in params.items():
        if key not in allowed:
            raise FilterError(f"unknown query parameter {key!r} (this endpoint takes {', '.join(allowed) or 'none'})")
        if len(value) > 253 or not value.isprintable():
            raise FilterError(f"query parameter {key}: not a Kubernetes name or model: {value[:60]!r}")
        out[key] = value
    return out


# ---------------------------------------------------------------------- the DRA front end
@dataclass
class DraView:
    """What the DRA front end publishes and what its claims consume, per GPU, for one answer."""

    uses: dict[tuple[str, str], DeviceUse]  # (node, device) -> capacity and use
    info: dict[tuple[str, str], dict]  # (node, device) -> uuid, index, model, numa
    claims: dict[str, ClaimUsage]
    taints: dict[tuple[str, str], list[Mapping[str, Any]]] = field(default_factory=dict)  # (node, device) -> taints
    mig: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (node, device) -> _mig_attrs

    @property
    def totals(self) -> dict[tuple[str, str], dict[str, int]]:
        return {k: u.total for k, u in self.uses.items()}

    def by_uuid(self) -> dict[str, DeviceUse]:
        return {u.uuid: u for u in self.uses.values() if u.uuid}


def dra_view(source: Any) -> DraView:
    """The source's DRA objects (none for a source without them, e.g. ``hami simulate``). The
    devices come parsed from the source (``dra_devices``, kept by the watch cache) when it has them."""
    info = getattr(source, "dra_devices", None)
    if info is None:
        info = slice_devices((getattr(source, "slices", None) or {}).values())
    claims = dict(getattr(source, "claims", None) or {})
    uses = {key: DeviceUse(key[0], key[1], d["uuid"], dict(d["total"]), {}) for key, d in info.items()}
    taints, mig = _slice_marks(source)
    return DraView(add_claims(uses, (claims[k] for k in sorted(claims))), info, claims, taints, mig)


def _mig_attrs(attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    """A MIG device's GPU and place on it (``parent``, ``profile``, ``start``, ``size``), None for
    a whole GPU."""

    def value(name: str, kind: type) -> Any:
        got = attrs.get(name)
        got = got.get("string" if kind is str else "int") if isinstance(got, Mapping) else None
        return got if isinstance(got, kind) and not isinstance(got, bool) else None

    profile, parent = value(PROFILE, str), value("parentUUID", str)
    if profile is None or not parent:
        return None
    return {
        "parent": parent,
        "profile": profile,
        "start": value("placementStart", int) or 0,
        "size": value("placementSize", int) or 0,
    }


def _slice_marks(
    source: Any,
) -> tuple[dict[tuple[str, str], list[Mapping[str, Any]]], dict[tuple[str, str], dict[str, Any]]]:
    """``(pool, device) -> taints`` of the driver's devices that carry any, and ``(pool, device)
    -> _mig_attrs`` of its MIG devices: the kubelet plugin marks an unhealthy GPU and a cordoned
    one with device taints, and publishes a MIG GPU as one device per instance (static) or per
    possible placement (dynamic), none of which the parsed devices keep (pool and device named
    as :func:`hami.dra.claims.slice_devices` names them)."""
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    mig: dict[tuple[str, str], dict[str, Any]] = {}
    for rs in (getattr(source, "slices", None) or {}).values():
        spec = rs.get("spec") if isinstance(rs, Mapping) else None
        if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER:
            continue
        pool_obj = spec.get("pool")
        pool = pool_obj.get("name") if isinstance(pool_obj, Mapping) else None
        if not isinstance(pool, str) or not pool:
            pool = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else ""
        devices = spec.get("devices")
        for d in devices if isinstance(devices, list) else ():
            if not isinstance(d, Mapping) or not isinstance(d.get("name"), str):
                continue
            taints = d.get("taints")
            if isinstance(taints, list) and taints:
                out[(pool, d["name"])] = [t for t in taints if isinstance(t, Mapping)]
            attrs = d.get("attributes")
            placed = _mig_attrs(attrs) if isinstance(attrs, Mapping) else None
            if placed is not None:
                mig[(pool, d["name"])] = placed
    return out, mig


def _mib(amount: int) -> int:
    return -(-amount // MIB)


def dra_device_doc(
    use: DeviceUse, info: Mapping[str, Any], usage: Usage | None, state: str, taints: Iterable[Mapping[str, Any]] = ()
) -> dict:
    """One GPU the DRA front end publishes; ``taints``: its device taints in the slice (the
    kubelet plugin's unhealthy mark is ``health`` false, its cordon mark ``cordoned``, as the
    extender's devices show them)."""
    keys = {t.get("key") for t in taints}
    return {
        "uuid": use.uuid,
        "index": info.get("index", -1),
        "vendor": "NVIDIA",
        "model": info.get("model") or "",
        "mode": "hami-core",
        "numa": info.get("numa") if isinstance(info.get("numa"), int) else 0,
        "health": UNHEALTHY_TAINT_KEY not in keys,
        "cordoned": CORDON_TAINT_KEY in keys,
        "slots": {"allocated": use.used[SHARES], "total": use.total[SHARES]},
        "memoryMiB": {"allocated": _mib(use.used[MEMORY]), "total": use.total[MEMORY] // MIB},
        "cores": {"allocated": use.used[CORES], "total": use.total[CORES], "unit": "percent"},
        "slices": [],
        "usage": _usage_doc(usage, state),
        "frontEnd": "dra",
        "claims": list(use.claims),
    }


def dra_mig_doc(
    members: list[tuple[DeviceUse, Mapping[str, Any], Mapping[str, Any], Iterable[Mapping[str, Any]]]],
    usage: Usage | None,
    state: str,
) -> dict:
    """One MIG GPU of the DRA front end, from its published MIG devices ``(use, info, mig, taints)``
    (:func:`_mig_attrs`): listed once, as the extender lists a MIG GPU (``mode`` mig, the
    instances in use as ``slices``), not as one device per instance or possible placement with
    no UUID. Totals: the largest profile's memory and cores (what one claim can have at most);
    ``slots``: instances allocated, of at most the existing instances (static MIG) or the most
    placements of one profile (dynamic: 7 on an A100)."""
    use0, info0, mig0, _ = members[0]
    taints = {t.get("key") for m in members for t in m[3]}
    static = any(info.get("uuid") for _, info, _, _ in members)
    per_profile: dict[str, int] = {}
    for _, _, mig, _ in members:
        per_profile[mig["profile"]] = per_profile.get(mig["profile"], 0) + 1
    held = sorted((m for m in members if m[0].claims), key=lambda m: (m[2]["start"], m[2]["size"]))
    return {
        "uuid": mig0["parent"],
        "index": info0.get("index", -1),
        "vendor": "NVIDIA",
        "model": info0.get("model") or "",
        "mode": "mig",
        "numa": info0.get("numa") if isinstance(info0.get("numa"), int) else 0,
        "health": UNHEALTHY_TAINT_KEY not in taints,
        "cordoned": CORDON_TAINT_KEY in taints,
        "slots": {"allocated": len(held), "total": len(members) if static else max(per_profile.values())},
        "memoryMiB": {
            "allocated": sum(_mib(m[0].used[MEMORY]) for m in members),
            "total": max(m[0].total[MEMORY] for m in members) // MIB,
        },
        "cores": {
            "allocated": sum(m[0].used[CORES] for m in members),
            "total": max(m[0].total[CORES] for m in members),
            "unit": "percent",
        },
        "slices": [{"profile": m[2]["profile"], "start": m[2]["start"], "size": m[2]["size"]} for m in held],
        "usage": _usage_doc(usage, state),
        "frontEnd": "dra",
        "claims": sorted(c for m in members for c in m[0].claims),
    }


# ---------------------------------------------------------------------- /api/v1/nodes
def device_doc(
    d: DeviceInfo,
    slots: int,
    mem: int,
    cores: int,
    vendor: Any,
    cordoned: bool,
    slices: Iterable[Any],
    usage: Usage | None,
    state: str,
) -> dict:
    return {
        "uuid": d.id,
        "index": d.index,
        "vendor": d.vendor,
        "model": d.type,
        "mode": d.mode or "hami-core",
        "numa": d.numa,
        "health": bool(d.health),
        "cordoned": cordoned,
        "slots": {"allocated": slots, "total": d.count},
        "memoryMiB": {"allocated": mem, "total": d.devmem},
        "cores": {"allocated": cores, "total": d.devcore, "unit": core_unit(vendor, d)},
        "slices": [{"profile": s.profile, "start": s.start, "size": s.size} for s in slices],
        "usage": _usage_doc(usage, state),
        "frontEnd": "extender",
    }


def nodes_document(
    source: Any, now: float, live: Mapping[str, NodeReading] | None = None, params: Mapping[str, str] | None = None
) -> dict:
    """``/api/v1/nodes``: every node with registered devices; ``node`` / ``model`` / ``vendor`` filter."""
    q = _check_params(params or {}, ("node", "model", "vendor"))
    ledger: Ledger = source.ledger
    vendors = _vendor_map(source.vendors)
    dra = dra_view(source)
    dra_by_uuid = dra.by_uuid()
    dra_nodes: dict[str, list[tuple[str, str]]] = {}
    for key in sorted(dra.uses):
        dra_nodes.setdefault(key[0], []).append(key)
    items = []
    for name in sorted(set(ledger.node_names()) | set(dra_nodes)):
        if not _matches(name, q.get("node")):
            continue
        reading = (live or {}).get(name)
        state = _reading_state(reading, now) if live is not None else "unavailable"
        devices = []
        seen: set[str] = set()
        # a MIG GPU's DRA instances held by claims, by the GPU's UUID: added to the extender's
        # document when the extender registers that GPU too (the metrics count them the same)
        mig_held: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
        for key in dra_nodes.get(name, ()):
            placed = dra.mig.get(key)
            if placed is not None and dra.uses[key].claims:
                mig_held.setdefault(placed["parent"], []).append((dra.uses[key], placed))
        if ledger.has_node(name):
            cordoned = ledger.node(name).cordoned
            slices = ledger.slices(name)
            for d, slots, mem, cores in ledger.device_usage(name):
                seen.add(d.id)
                if not _matches(d.type, q.get("model")) or not _matches(d.vendor, q.get("vendor")):
                    continue
                usage = reading.devices.get(d.id) if reading is not None else None
                doc = device_doc(
                    d, slots, mem, cores, vendors.get(d.vendor), d.id in cordoned, slices.get(d.id, ()), usage, state
                )
                claimed = dra_by_uuid.get(d.id)
                if claimed is not None and claimed.claims:  # one GPU published by both front ends
                    doc["slots"]["allocated"] += claimed.used[SHARES]
                    doc["memoryMiB"]["allocated"] += _mib(claimed.used[MEMORY])
                    doc["cores"]["allocated"] += claimed.used[CORES]
                    doc["claims"] = list(claimed.claims)
                held = sorted(mig_held.get(d.id, ()), key=lambda h: (h[1]["start"], h[1]["size"]))
                if held:  # a MIG GPU both front ends publish
                    doc["slots"]["allocated"] += len(held)
                    doc["memoryMiB"]["allocated"] += sum(_mib(u.used[MEMORY]) for u, _ in held)
                    doc["cores"]["allocated"] += sum(u.used[CORES] for u, _ in held)
                    doc["slices"] += [{k: m[k] for k in ("profile", "start", "size")} for _, m in held]
                    doc["claims"] = sorted({c for u, _ in held for c in u.claims})
                devices.append(doc)
        migs: dict[str, list] = {}  # parent UUID -> its MIG devices, listed as one GPU
        dra_docs: list[Any] = []  # device documents, and a MIG GPU's UUID where it goes
        for key in dra_nodes.get(name, ()):
            use, info, mig = dra.uses[key], dra.info.get(key, {}), dra.mig.get(key)
            uuid = use.uuid if mig is None else mig["parent"]
            if (
                uuid in seen
                or not _matches(info.get("model") or "", q.get("model"))
                or not _matches("NVIDIA", q.get("vendor"))
            ):
                continue
            usage = reading.devices.get(uuid) if reading is not None else None
            if mig is None:
                dra_docs.append(dra_device_doc(use, info, usage, state, dra.taints.get(key, ())))
                continue
            if uuid not in migs:
                migs[uuid] = []
                dra_docs.append(uuid)
            migs[uuid].append((use, info, mig, dra.taints.get(key, ())))
        for d in dra_docs:
            if isinstance(d, str):
                d = dra_mig_doc(migs[d], reading.devices.get(d) if reading is not None else None, state)
            devices.append(d)
        if not devices and (q.get("model") or q.get("vendor")):
            continue
        node = source.nodes.get(name)
        unschedulable = bool(((node or {}).get("spec") or {}).get("unschedulable"))
        items.append(
            {
                "name": name,
                "ready": _node_ready(node),
                "unschedulable": unschedulable,
                "monitor": _monitor_doc(reading, live is not None, now),
                "devices": devices,
            }
        )
    return envelope("NodeList", now, items)


# ---------------------------------------------------------------------- /api/v1/pods
def grant_doc(
    vendor_name: str,
    cd: ContainerDevice,
    devices: Mapping[str, DeviceInfo],
    vendor: Any,
    usage: Usage | None,
    state: str,
) -> dict:
    dev = devices.get(cd.uuid)
    unit = core_unit(vendor, dev) if dev is not None else "percent"
    out = {
        "vendor": vendor_name,
        "uuid": cd.uuid,
        "index": dev.index if dev is not None else None,
        "model": dev.type if dev is not None else cd.type,
        "memoryMiB": cd.usedmem,
        "cores": cd.usedcores,
        "coreUnit": unit,
        "usage": _usage_doc(usage, state),
    }
    if cd.slice is not None:
        out["slice"] = {"profile": cd.slice.profile, "start": cd.slice.start, "size": cd.slice.size}
    return out


def _container_names(pod: Mapping[str, Any] | None, count: int) -> list[tuple[str, str]]:
    if pod:
        named = [(c.get("name") or str(i), k.value) for i, (c, k) in enumerate(ordered_containers(pod))]
        if len(named) >= count:
            return named
    return [(str(i), "app") for i in range(count)]


def pods_document(
    source: Any, now: float, live: Mapping[str, NodeReading] | None = None, params: Mapping[str, str] | None = None
) -> dict:
    """``/api/v1/pods``: every pod holding devices, grants per container; ``namespace`` / ``node`` filter."""
    q = _check_params(params or {}, ("namespace", "node"))
    ledger: Ledger = source.ledger
    vendors = _vendor_map(source.vendors)
    items = []
    node_devices: dict[str, dict[str, DeviceInfo]] = {}  # per node, built once per answer
    for alloc in ledger.pods():
        if not _matches(alloc.namespace, q.get("namespace")) or not _matches(alloc.node, q.get("node")):
            continue
        pod = source.pods.get(f"{alloc.namespace}/{alloc.name}")
        if pod is not None and pod_key(pod) != alloc.key:
            pod = None  # a newer pod of the same name
        devices = node_devices.get(alloc.node)
        if devices is None:
            devices = node_devices[alloc.node] = (
                {d.id: d for d, *_ in ledger.device_usage(alloc.node)} if ledger.has_node(alloc.node) else {}
            )
        reading = (live or {}).get(alloc.node)
        state = _reading_state(reading, now) if live is not None else "unavailable"
        width = max((len(per) for per in alloc.devices.values()), default=0)
        containers = []
        for ci, (cname, kind) in enumerate(_container_names(pod, width)):
            grants = []
            for vname in sorted(alloc.devices):
                per = alloc.devices[vname]
                for cd in per[ci] if ci < len(per) else ():
                    usage = None
                    if reading:
                        # hami monitor names a MIG grant's series by its instance (MIG-...), once the
                        # device plugin made it; cd.uuid is its GPU's (found by review, 1 Dec: a MIG
                        # grant never showed live usage)
                        mig_uuid = cd.slice.mig_uuid if cd.slice is not None else ""
                        usage = (
                            reading.containers.get((alloc.namespace, alloc.name, cname, mig_uuid)) if mig_uuid else None
                        ) or reading.containers.get((alloc.namespace, alloc.name, cname, cd.uuid))
                    grants.append(grant_doc(vname, cd, devices, vendors.get(vname), usage, state))
            containers.append({"name": cname, "kind": kind, "grants": grants})
        meta = (pod or {}).get("metadata") or {}
        items.append(
            {
                "namespace": alloc.namespace,
                "name": alloc.name,
                "uid": meta.get("uid") or "",
                "node": alloc.node,
                "phase": ((pod or {}).get("status") or {}).get("phase") or "Unknown",
                "bindPhase": (meta.get("annotations") or {}).get(BIND_PHASE) or None,
                "reserved": ledger.is_reserved(alloc.key),
                "memoryMiB": alloc.memory(),
                "containers": containers,
                "frontEnd": "extender",
            }
        )
    dra = dra_view(source)
    totals = dra.totals
    for ref in sorted(dra.claims):
        claim = dra.claims[ref]
        if not _matches(claim.namespace, q.get("namespace")) or (
            q.get("node") is not None and q["node"] not in claim.nodes
        ):
            continue
        items.append(claim_doc(claim, source, dra, live, now, totals))
    return envelope("PodList", now, items)


def _claim_containers(pod: Mapping[str, Any] | None, claim: str) -> list[tuple[str, str]]:
    """``(container, kind)`` of the pod's containers that use the ResourceClaim named ``claim``."""
    if not pod:
        return []
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    names = {s.get("name") for s in status.get("resourceClaimStatuses") or () if s.get("resourceClaimName") == claim}
    names |= {c.get("name") for c in spec.get("resourceClaims") or () if c.get("resourceClaimName") == claim}
    out = []
    for c, kind in ordered_containers(pod):
        used = {(r or {}).get("name") for r in ((c.get("resources") or {}).get("claims") or ())}
        if used & names:
            out.append((c.get("name") or "", kind.value))
    return out


def claim_doc(
    claim: ClaimUsage,
    source: Any,
    dra: DraView,
    live: Mapping[str, NodeReading] | None,
    now: float,
    totals: Mapping[tuple[str, str], Mapping[str, int]] | None = None,
) -> dict:
    """One allocated DRA claim as an item of ``/api/v1/pods``: named after the (first) pod that
    reserves it, with a grant per GPU for each of that pod's containers using the claim."""
    pods = sorted(claim.pods, key=lambda c: c.name)
    first = pods[0] if pods else None
    pod = source.pods.get(f"{claim.namespace}/{first.name}") if first is not None else None
    if pod is not None and (pod.get("metadata") or {}).get("uid") != first.uid:
        pod = None  # a newer pod of the same name
    node = claim.nodes[0] if claim.nodes else ""
    reading = (live or {}).get(node)
    state = _reading_state(reading, now) if live is not None else "unavailable"
    containers = _claim_containers(pod, claim.name) or [("", "app")]
    docs = []
    for cname, kind in containers:
        grants = []
        for r in claim.results:
            use, info = dra.uses.get((r.pool, r.device)), dra.info.get((r.pool, r.device), {})
            got = r.resolved(use.total if use is not None else {})
            mig = dra.mig.get((r.pool, r.device))
            # a MIG instance is shown on its GPU (as the extender's grants and /nodes show it)
            uuid = mig["parent"] if mig is not None else info.get("uuid") or ""
            usage = None
            if reading is not None and first is not None:
                # hami monitor labels a claim's region with the one container using it, or with the
                # claim's name when several share it, and with the UUIDs of the claim's record: a
                # MIG instance's own (MIG-..., a static instance's ``uuid`` attribute), not its
                # GPU's (found by review, 1 Dec: a DRA MIG claim never showed live usage); the GPU's
                # is tried after it (a dynamic placement publishes no instance UUID)
                own = (info.get("uuid") or "") if mig is not None else ""
                for looked in dict.fromkeys(u for u in (own, uuid) if u):
                    usage = reading.containers.get(
                        (claim.namespace, first.name, cname, looked)
                    ) or reading.containers.get((claim.namespace, first.name, claim.name, looked))
                    if usage is not None:
                        break
            grant = {
                "vendor": "NVIDIA",
                "uuid": uuid,
                # null when unknown (slice_devices' -1, or no device): the page shows "#?"
                "index": info["index"] if isinstance(info.get("index"), int) and info["index"] >= 0 else None,
                "model": info.get("model") or "",
                "memoryMiB": _mib(got[MEMORY]),
                "cores": got[CORES],
                "coreUnit": "percent",
                "usage": _usage_doc(usage, state),
                "node": r.pool,
                "device": r.device,
                "request": r.request,
            }
            if mig is not None:
                grant["slice"] = {"profile": mig["profile"], "start": mig["start"], "size": mig["size"]}
            grants.append(grant)
        docs.append({"name": cname, "kind": kind, "grants": grants})
    mem, _ = claim.totals(dra.totals if totals is None else totals)
    return {
        "namespace": claim.namespace,
        "name": first.name if first else "",
        "uid": first.uid if first else "",
        "node": node,
        "phase": ((pod or {}).get("status") or {}).get("phase") or "Unknown",
        "bindPhase": None,
        "reserved": False,
        "memoryMiB": mem,
        "containers": docs,
        "frontEnd": "dra",
        "claim": {
            "namespace": claim.namespace,
            "name": claim.name,
            "uid": claim.uid,
            "reservedFor": [{"resource": c.resource, "name": c.name, "uid": c.uid} for c in claim.reserved_for],
        },
    }


def counted_grants(item: Mapping[str, Any]) -> list[dict]:
    """The grants of one ``/api/v1/pods`` item that hold devices, each once: what totals add up.

    A DRA claim's grants are repeated on every container that uses the claim (for display: each
    container's line names what it sees), but the claim holds them once; an extender pod's grants
    are each its own allocation. Found by review, 1 Dec: a pod with both containers on one claim
    of 3000 MiB was counted 6000 MiB in its history and in other tenants' shared-device totals."""
    grants = [g for c in item.get("containers", ()) for g in c.get("grants", ())]
    if item.get("frontEnd") != "dra":
        return grants
    seen: set[tuple[Any, Any, Any, Any]] = set()
    out = []
    for g in grants:
        key = (g.get("node"), g.get("device"), g.get("request"), g.get("uuid"))
        if key not in seen:
            seen.add(key)
            out.append(g)
    return out


# ---------------------------------------------------------------------- /api/v1/pending
def pending_pods(source: Any, scheduler_name: str) -> list[dict]:
    """Pods of this scheduler with no node and no allocation (a reservation counts as placed); a
    pod held by ``spec.schedulingGates`` is among them (:func:`explain_doc` says it is gated)."""
    out = []
    for ref in sorted(source.pods):
        pod = source.pods[ref]
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if spec.get("schedulerName") != scheduler_name or spec.get("nodeName"):
            continue
        if status.get("phase") not in (None, "Pending") or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if source.ledger.pod(pod_key(pod)) is not None:
            continue
        out.append(pod)
    return out


def _request_docs(req: Any) -> list[dict]:
    out = []
    for c in req.containers:
        for r in c.requests:
            out.append(
                {
                    "container": c.name,
                    "kind": c.kind.value,
                    "vendor": r.vendor,
                    "count": r.nums,
                    "memoryMiB": r.memreq or None,
                    "memoryPercent": None if r.memreq or r.mem_percentage > 100 else r.mem_percentage,
                    "cores": r.coresreq,
                }
            )
    return out


def explain_doc(pod: Mapping[str, Any], source: Any, now: float) -> dict:
    """One pending pod: its requests and every node's verdict, as ``hami explain`` prints them.

    ``fitsNow`` / ``wouldChoose`` answer for the devices (HAMi's extender, after kube-scheduler's
    node selector, affinity, taint and cordon filters); kube-scheduler's resource filters (cpu,
    memory, pod count) are not checked, and ``summary`` says so (:data:`NOT_CHECKED`). A
    ``CardCordoned`` on a node where the source's ``held_back_vendors(node)`` names the device's
    vendor says it is :data:`HELD_BACK`."""
    meta = pod.get("metadata") or {}
    base = {
        "namespace": meta.get("namespace") or "default",
        "name": meta.get("name") or "",
        "uid": meta.get("uid") or "",
        "createdAt": meta.get("creationTimestamp") or None,
    }
    gates = scheduling_gates(pod)
    if gates:
        # kube-scheduler sends no gated pod to Filter: no device verdict applies until the gates go
        # (found by review, 1 Dec: a Kueue-gated pod showed "fits now")
        try:
            admitted, _ = admit_pod(dict(pod), source.vendors)
            requests = _request_docs(pod_request(admitted, source.vendors))
        except (CoreError, ArithmeticError, LookupError, TypeError, ValueError):
            requests = []
        return {
            **base,
            "requests": requests,
            "fitsNow": False,
            "wouldChoose": None,
            "error": None,
            "summary": f"{gated_reason(gates)}: kube-scheduler does not schedule it until the gates are removed",
            "nodes": [],
        }
    # kube-scheduler offers the extender only the nodes its own filters pass (hami explain's rule)
    left_out, _ = nodefit_left_out(pod, source.nodes, source.ledger.node_names())
    offered = [n for n in source.ledger.node_names() if n not in left_out] if left_out else None
    try:
        verdict = pending_verdict(dict(pod), source.ledger, source.config, source.vendors, now, offered)
    except (CoreError, ArithmeticError, LookupError, TypeError, ValueError) as exc:
        return {
            **base,
            "requests": [],
            "fitsNow": None,
            "wouldChoose": None,
            "error": f"cannot read the pod's requests: {str(exc)[:500]}",
            "summary": "",
            "nodes": [],
        }
    vendors = _vendor_map(source.vendors)
    held_back = getattr(source, "held_back_vendors", None)
    nodes = []
    reasons = {}  # node -> its reason as shown (a held-back CardCordoned says so)
    for v in verdict.nodes:
        held = held_back(v.node) if held_back is not None else frozenset()
        reason = v.reason or None
        if reason and held and "CardCordoned" in reason:
            # no hami.io/device-cordon entry is behind it: a running pod's grant cannot be read
            reason = f"{reason} ({', '.join(sorted(held))} devices {HELD_BACK})"
        reasons[v.node] = reason
        devices = [
            {
                "uuid": dv.device.id,
                "index": dv.device.index,
                "model": dv.device.type,
                "health": bool(dv.device.health),
                "slots": {"allocated": dv.slots, "total": dv.device.count},
                "memoryMiB": {"allocated": dv.mem, "total": dv.device.devmem},
                "cores": {
                    "allocated": dv.cores,
                    "total": dv.device.devcore,
                    "unit": core_unit(vendors.get(dv.device.vendor), dv.device),
                },
                "reason": f"{dv.reason} ({HELD_BACK})"
                if dv.reason == "CardCordoned" and dv.device.vendor in held
                else dv.reason,
            }
            for dv in v.devices
        ]
        nodes.append(
            {
                "node": v.node,
                "fits": v.fits,
                "reason": reason,
                "leftOut": left_out.get(v.node),
                "container": v.container if v.container >= 0 else None,
                "devices": devices,
            }
        )
    summary = summarise(
        f"left out by kube-scheduler: {left_out[v.node]}" if v.node in left_out else reasons[v.node] or ""
        for v in verdict.nodes
        if not v.fits or v.node in left_out
    )
    if verdict.chosen is not None:
        # (no node named: a caller who may not list nodes gets the summary without wouldChoose)
        summary = f"{NOT_CHECKED}; {summary}" if summary else NOT_CHECKED
    return {
        **base,
        "requests": _request_docs(verdict.request),
        "fitsNow": verdict.chosen is not None,
        "wouldChoose": verdict.chosen,
        "error": None,
        "summary": summary,
        "nodes": nodes,
    }


def summarise(reasons: Iterable[str]) -> str:
    """``"3 nodes: 8/8 CardInsufficientMemory; 1 node: node unregistered"``, most frequent first."""
    counts: dict[str, int] = {}
    for r in reasons:
        counts[r] = counts.get(r, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return "; ".join(f"{n} node{'s' if n != 1 else ''}: {r}" for r, n in ranked)


def pending_document(
    source: Any,
    now: float,
    scheduler_name: str,
    params: Mapping[str, str] | None = None,
    budget_s: float | None = None,
    timer: Callable[[], float] = time.perf_counter,
    only: Collection[str] | None = None,
    explain: Callable[[Mapping[str, Any], Any, float], dict | None] | None = None,
) -> dict:
    """``/api/v1/pending``: pods waiting for devices and why, per node and per device (``namespace``
    filters; ``only``: the namespaces a caller may see, None = all). At most ``MAX_PENDING`` pods
    are explained, and no more once ``budget_s`` of work is spent (the first pod always is);
    ``truncated`` says when some were left out. ``explain``: how one pod is explained
    (:func:`explain_doc`; the UI passes one that reuses recent explanations across callers and
    answers None once its shared budget is spent)."""
    q = _check_params(params or {}, ("namespace",))
    pods = []
    for p in pending_pods(source, scheduler_name):
        ns = (p.get("metadata") or {}).get("namespace") or "default"
        if _matches(ns, q.get("namespace")) and (only is None or ns in only):
            pods.append(p)
    budget = PENDING_BUDGET_S if budget_s is None else budget_s
    began = timer()
    items = []
    for p in pods[:MAX_PENDING]:
        if items and timer() - began > budget:
            break
        doc = (explain or explain_doc)(p, source, now)
        if doc is None:  # the caller's budget says stop
            break
        items.append(doc)
    return envelope("PendingList", now, items, total=len(pods), truncated=len(items) < len(pods))


def simulated_pending(outcomes: Iterable[Any]) -> list[dict]:
    """Pending pods of a ``hami simulate`` run (its reasons are per node only)."""
    items = []
    for o in outcomes:
        if o.status != "pending":
            continue
        nodes = [
            {"node": n, "fits": False, "reason": r, "container": None, "devices": []}
            for n, r in sorted(o.reasons.items())
        ]
        items.append(
            {
                "namespace": o.namespace,
                "name": o.name,
                "uid": "",
                "createdAt": None,
                "requests": [],
                "fitsNow": False,
                "wouldChoose": None,
                "error": None,
                "summary": summarise(o.reasons.values()),
                "nodes": nodes,
            }
        )
    return items


# ---------------------------------------------------------------------- /api/v1/quotas
def quotas_document(source: Any, now: float, params: Mapping[str, str] | None = None) -> dict:
    """``/api/v1/quotas``: each ResourceQuota's device limits and what the namespace holds."""
    q = _check_params(params or {}, ("namespace",))
    ledger: Ledger = source.ledger
    items = []
    for ref in sorted(source.quotas):
        ns, name = ref.split("/", 1)
        if not _matches(ns, q.get("namespace")):
            continue
        limits = ledger.quota_limits(ns, name)
        if not limits:
            continue
        resources = []
        for v in source.vendors:
            mem_used, cores_used = ledger.namespace_usage(ns, v.name)
            for kind, resource, used, unit in (
                ("memory", v.resources.memory, mem_used, "MiB"),
                ("cores", v.resources.cores, cores_used, None),
            ):
                if resource and resource in limits:
                    resources.append(
                        {
                            "resource": f"limits.{resource}",
                            "vendor": v.name,
                            "kind": kind,
                            "unit": unit or getattr(v, "cores_unit", "percent"),
                            "limit": limits[resource],
                            "used": used,
                        }
                    )
        if resources:
            items.append({"namespace": ns, "name": name, "resources": resources})
    return envelope("QuotaList", now, items)
