"""Render a :class:`~hami.sim.engine.SimResult` as JSON or as a table for a person.

The table goes to a terminal: what the input files give of text (node names, device types and
ids from a node's registration, pod and container names, reasons quoting them) is shown with its
control and bidirectional-formatting characters escaped (:func:`terminal_safe`), so a node's
registration cannot move the cursor, recolour or retitle the terminal, or reorder what it shows.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, Mapping

from .engine import SimResult


#: Unicode's bidirectional formatting characters (they reorder the text shown around them), and
#: the line and paragraph separators
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: Any) -> str:
    """``text`` with C0 and C1 control characters (escape, bell, carriage return, CSI ...) and
    bidirectional formatting characters written as ``\\xNN`` / ``\\uNNNN``; other text as it is."""
    return _UNSAFE.sub(_escape, str(text))


def to_json(result: SimResult) -> str:
    pods = [
        {
            "namespace": p.namespace,
            "name": p.name,
            "node": p.node,
            "status": p.status,
            "containers": p.containers,
            "reasons": p.reasons,
        }
        for p in result.pods
    ]
    doc: dict[str, Any] = {"pods": pods, "devices": result.devices, "warnings": result.warnings}
    if result.front_end != "extender":
        doc = {"frontEnd": result.front_end, **doc, "claims": result.claims}
    return json.dumps(doc, indent=2)


def _bar(used: int, total: int, width: int = 10) -> str:
    filled = 0 if total <= 0 else min(width, round(width * used / total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}G"


#: a device id is shown by its first characters ("GPU-7d1c55e0"), more where two devices share them
SHORT_ID = 12


def _short_ids(uuids: set[str]) -> dict[str, str]:
    """Each id cut to :data:`SHORT_ID` characters, or to as many as tell it from every other id
    shown: vendors number a board's chips under one prefix (``NPU-7f3c0a1e-0002``, ``-0003``),
    which a fixed cut showed as one device granted twice."""
    # the longest prefix an id shares with any other is the one it shares with a neighbour in
    # sorted order: one pass, where comparing every pair took a minute for a large cluster's
    # 16000 GPUs
    ordered = sorted(uuids)
    shared = [0] * len(ordered)
    for i in range(1, len(ordered)):
        a, b = ordered[i - 1], ordered[i]
        n = 0
        while n < len(a) and n < len(b) and a[n] == b[n]:
            n += 1
        shared[i - 1] = max(shared[i - 1], n)
        shared[i] = max(shared[i], n)
    return {u: u[: max(SHORT_ID, n + 1)] for u, n in zip(ordered, shared)}


def _grant(d: dict, short: Mapping[str, str]) -> str:
    mig = f" MIG {d['mig']['profile']}@{d['mig']['start']}" if "mig" in d else ""
    where = f"{d['device'].rpartition('/')[2]} " if "device" in d else ""  # DRA: the slice device (gpu-0)
    return terminal_safe(f"{where}{short.get(d['uuid'], d['uuid'])} {d['usedmem']}MiB {d['usedcores']}%{mig}")


def _names(names: list[str], shown: int = 3) -> str:
    """``a, b, c and 7 more``: a long list of nodes or pods kept to one readable line."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def to_table(result: SimResult) -> str:
    safe = terminal_safe
    # columns as wide as their longest value (cloud node names run to 40 characters and more)
    node_w = max([14] + [len(safe(d["node"])) for d in result.devices] + [len(safe(p.node or "")) for p in result.pods])
    pod_w = max([34] + [len(safe(f"{p.namespace}/{p.name}")) for p in result.pods])
    status_w = max([10] + [len(p.status) for p in result.pods])  # "terminating" is 11
    lines: list[str] = []
    lines.append("DEVICES")
    lines.append(f"  {'NODE':<{node_w}} {'IDX':>3} {'TYPE':<24} {'TASKS':>6}  {'MEMORY':<28} {'CORES':<22} NOTE")
    for d in result.devices:
        note = "unhealthy" if not d["health"] else "cordoned" if d["cordoned"] else ""
        mem = f"{_bar(d['usedmem'], d['totalmem'])} {_gib(d['usedmem'])}/{_gib(d['totalmem'])}"
        cores = f"{_bar(d['usedcores'], d['totalcore'])} {d['usedcores']}/{d['totalcore']}"
        lines.append(
            f"  {safe(d['node']):<{node_w}} {d['index']:>3} {safe(d['type'])[:24]:<24} "
            f"{str(d['used']) + '/' + str(d['count']):>6}  {mem:<28} {cores:<22} {note}".rstrip()
        )
    lines.append("")
    lines.append("PODS")
    lines.append(f"  {'POD':<{pod_w}} {'STATUS':<{status_w}} {'NODE':<{node_w}} DEVICES")
    short = _short_ids({d["uuid"] for p in result.pods for c in p.containers for d in c["devices"]})
    for p in result.pods:
        devs = "; ".join(
            f"{safe(c['name'])}: " + ", ".join(_grant(d, short) for d in c["devices"])
            for c in p.containers
            if c["devices"]
        )
        lines.append(
            f"  {safe(f'{p.namespace}/{p.name}'):<{pod_w}} {p.status:<{status_w}} {safe(p.node or '-'):<{node_w}} "
            f"{devs}".rstrip()
        )
    lines.append("")
    lines.extend(safe(line) for line in _summary(result))
    return "\n".join(lines)


def _summary(result: SimResult) -> list[str]:
    devs = result.devices
    used = sum(1 for d in devs if d["used"] > 0)
    mem = sum(d["usedmem"] for d in devs)
    total_mem = sum(d["totalmem"] for d in devs)
    cores = sum(d["usedcores"] for d in devs)
    total_cores = sum(d["totalcore"] for d in devs)
    counts = Counter(p.status for p in result.pods)
    out = [
        "SUMMARY",
        f"  GPUs in use:      {used}/{len(devs)}",
        f"  memory allocated: {_gib(mem)} of {_gib(total_mem)} ({100 * mem / total_mem if total_mem else 0:.0f}%)",
        f"  cores allocated:  {cores} of {total_cores} ({100 * cores / total_cores if total_cores else 0:.0f}%)",
        "  pods:             " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"),
    ]
    # pods with the same reasons share one block, nodes with the same reason one line (the JSON
    # output keeps every pod and node): a thousand pending pods on sixty nodes stay readable
    blocks: dict[tuple, list[str]] = {}
    for p in [p for p in result.pods if p.status == "pending"] + [p for p in result.pods if p.status == "denied"]:
        blocks.setdefault((p.status, tuple(p.reasons.items())), []).append(f"{p.namespace}/{p.name}")
    for (status, reasons), pods in blocks.items():
        out.append(f"  {status} {_names(pods)}:")
        by_reason: dict[str, list[str]] = {}
        for node, reason in reasons:
            by_reason.setdefault(reason, []).append(node)
        for reason, nodes in by_reason.items():
            out.append(f"    {_names(nodes)}: {reason}")
    if blocks:
        out.append("  (what each reason means and what to change: docs/reasons.md)")
    return out


def to_html(result: SimResult, config: Any, title: str = "hami simulate", now: float = 0.0) -> str:
    """The web UI's page for this run, self-contained (docs/ui.md): the UI's own documents, built
    from the simulation's final ledger; pending pods carry the simulation's per-node reasons."""
    from hami.ui import model
    from hami.ui.page import snapshot_page

    source = model.Snapshot(ledger=result.ledger, vendors=tuple(config.vendors), config=config, pods=result.objects)
    status = {(p.namespace, p.name): p.status for p in result.pods}
    pods = model.pods_document(source, now)
    for item in pods["items"]:
        item["phase"] = status.get((item["namespace"], item["name"]), "scheduled")
        item["reserved"] = False  # a simulated decision is final (nothing patches a pod here)
    pending = model.simulated_pending(result.pods)
    return snapshot_page(
        {
            "title": title,
            "nodes": model.nodes_document(source, now),
            "pods": pods,
            "pending": model.envelope("PendingList", now, pending, total=len(pending), truncated=False),
            "quotas": model.envelope("QuotaList", now, []),
        }
    )
