"""What one caller may see of an ``/api/v1`` answer, once :mod:`.auth` said where it may look.

Pure: a built document and the caller's scope in, a narrowed document out (no I/O). ``visible``
is None for "every namespace", else the set of namespaces the caller may ``list pods`` in.

- pods: items of other namespaces are removed; for each device a visible item holds a grant
  on, the grants of the removed items on the same device are added up into one anonymous line
  of ``othersOnSharedDevices`` (how many other pods, their memory and cores), never their
  names, namespaces or containers.
- pending: per-node verdicts (node names, other pods' allocations on each device) are shown
  only to a caller that may ``list nodes``; without it a pending pod keeps its requests and
  summary.
- nodes: the DRA claims listed on a device are kept only for visible namespaces.
- quotas: filtered on the caller's namespaces for ``list resourcequotas``.
"""

from __future__ import annotations

from typing import Any


def _shown(ns: str, visible: set[str] | None) -> bool:
    return visible is None or ns in visible


def _grant_key(item: dict, grant: dict) -> tuple[str, str]:
    return (grant.get("node") or item.get("node") or "", grant.get("uuid") or "")


def pods(doc: dict, visible: set[str] | None) -> dict:
    """The pods answer narrowed to ``visible``, with anonymous totals for the rest (above)."""
    if visible is None:
        return {**doc, "othersOnSharedDevices": []}
    kept: list[dict] = []
    hidden: list[dict] = []
    for item in doc["items"]:
        (kept if _shown(item["namespace"], visible) else hidden).append(item)
    used = {_grant_key(i, g) for i in kept for c in i["containers"] for g in c["grants"]}
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for item in hidden:
        holders: set[tuple[str, str]] = set()
        for c in item["containers"]:
            for g in c["grants"]:
                key = _grant_key(item, g)
                if key not in used or not key[1]:
                    continue
                t = totals.setdefault(key, {"node": key[0], "uuid": key[1], "pods": 0, "memoryMiB": 0, "cores": 0})
                t["memoryMiB"] += int(g.get("memoryMiB") or 0)
                t["cores"] += int(g.get("cores") or 0)
                if key not in holders:
                    holders.add(key)
                    t["pods"] += 1
    return {**doc, "items": kept, "othersOnSharedDevices": [totals[k] for k in sorted(totals)]}


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
