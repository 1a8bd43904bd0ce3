"""What one caller may see of an ``/api/v1`` answer, once :mod:`.auth` said where it may look.

Pure: a built document and the caller's scope in, a narrowed document out (no I/O). ``visible``
is None for "every namespace", else the set of namespaces the caller may ``list pods`` in.

- pods: items of other namespaces are removed; for each device a visible item holds a grant
  on, the grants of the removed items on the same device are added up into one anonymous line
  of ``othersOnSharedDevices`` (how many other pods, their memory and cores: a DRA claim's
  grants once, not once per container using it), never their names, namespaces or containers.
  The work is the caller's own items: the document is cut up by namespace once, when it is
  built (:func:`pods_index`).
- pending: per-node verdicts (node names, other pods' allocations on each device) are shown
  only to a caller that may ``list nodes``; without it a pending pod keeps its requests and
  summary.
- nodes: the DRA claims listed on a device are kept only for visible namespaces.
- quotas: filtered on the caller's namespaces for ``list resourcequotas``.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import model


def _shown(ns: str, visible: set[str] | None) -> bool:
    return visible is None or ns in visible


def _grant_key(item: dict, grant: dict) -> tuple[str, str]:
    return (grant.get("node") or item.get("node") or "", grant.get("uuid") or "")


@dataclass(frozen=True)
class PodsIndex:
    """A pods document cut up for scoping, made once when the (shared) document is built, so
    that one caller's scope costs its own items, not the cluster's (found by review, 1 Dec: a
    tenant of one namespace walked all 8000 items and their grants on every request, 15-23 ms
    on the scheduler's loop).

    - ``by_namespace``: namespace -> its items as ``(position in the document, item, the device
      keys its grants hold)``;
    - ``devices``: device key ``(node, uuid)`` -> namespace -> ``[pods, memory MiB, cores]`` of
      that namespace's items on it, each claim's grant counted once (:func:`model.counted_grants`);
    - ``nodes``: every node an item is on (its own or one of its grants'): a ``?node=`` naming
      none of them has no item."""

    by_namespace: dict[str, list[tuple[int, dict, frozenset[tuple[str, str]]]]]
    devices: dict[tuple[str, str], dict[str, list[int]]]
    nodes: frozenset[str]


def pods_index(doc: dict) -> PodsIndex:
    """:class:`PodsIndex` of a pods document (one walk over its items and grants)."""
    by_namespace: dict[str, list[tuple[int, dict, frozenset[tuple[str, str]]]]] = {}
    devices: dict[tuple[str, str], dict[str, list[int]]] = {}
    nodes: set[str] = set()
    for pos, item in enumerate(doc["items"]):
        ns = item["namespace"]
        keys: set[tuple[str, str]] = set()
        if item.get("node"):
            nodes.add(item["node"])
        for c in item["containers"]:
            for g in c["grants"]:
                key = _grant_key(item, g)
                nodes.add(key[0])
                keys.add(key)
        by_namespace.setdefault(ns, []).append((pos, item, frozenset(keys)))
        holds: set[tuple[str, str]] = set()
        for g in model.counted_grants(item):
            key = _grant_key(item, g)
            if not key[1]:
                continue
            t = devices.setdefault(key, {}).setdefault(ns, [0, 0, 0])
            t[1] += int(g.get("memoryMiB") or 0)
            t[2] += int(g.get("cores") or 0)
            if key not in holds:
                holds.add(key)
                t[0] += 1
    nodes.discard("")
    return PodsIndex(by_namespace, devices, frozenset(nodes))


def pods(doc: dict, visible: set[str] | None, index: PodsIndex | None = None) -> dict:
    """The pods answer narrowed to ``visible``, with anonymous totals for the rest (above);
    ``index``: the document's :func:`pods_index` (made here when not given)."""
    if visible is None:
        return {**doc, "othersOnSharedDevices": []}
    if index is None:
        index = pods_index(doc)
    mine = sorted(
        (entry for ns in visible for entry in index.by_namespace.get(ns, ())),
        key=lambda entry: entry[0],
    )
    used = {key for _, _, keys in mine for key in keys if key[1]}
    others = []
    for key in sorted(used):
        pods_, mem, cores = 0, 0, 0
        for ns, (n, m, c) in index.devices.get(key, {}).items():
            if ns not in visible:
                pods_, mem, cores = pods_ + n, mem + m, cores + c
        if pods_:
            others.append({"node": key[0], "uuid": key[1], "pods": pods_, "memoryMiB": mem, "cores": cores})
    return {**doc, "items": [item for _, item, _ in mine], "othersOnSharedDevices": others}


def pending_items(items: list[dict], may_list_nodes: bool) -> list[dict]:
    """Pending pods as a caller without ``list nodes`` sees them: no per-node verdicts."""
    if may_list_nodes:
        return items
    return [{**i, "nodes": [], "wouldChoose": None} for i in items]


def nodes(doc: dict, visible: set[str] | None) -> dict:
    """The nodes answer with each device's DRA claims (``namespace/name``) narrowed to ``visible``."""
    if visible is None:
        return doc
    items = []
    for node in doc["items"]:
        devices = []
        for d in node["devices"]:
            if "claims" in d:
                d = {**d, "claims": [c for c in d["claims"] if _shown(c.split("/", 1)[0], visible)]}
            devices.append(d)
        items.append({**node, "devices": devices})
    return {**doc, "items": items}


def by_namespace(doc: dict, visible: set[str] | None) -> dict:
    """Items (each with a ``namespace``) of ``visible`` namespaces only."""
    if visible is None:
        return doc
    return {**doc, "items": [i for i in doc["items"] if _shown(i["namespace"], visible)]}
