"""``hami explain POD``: why a pod is (or would be) pending, per node and per device.

It reads the live cluster (nodes, pods, ResourceQuotas, DRA ResourceClaims and ResourceSlices
where the API serves them, the pod's events), rebuilds the ledger the way the scheduler does
(:class:`hami.scheduler.state.ClusterState`, with the scheduler's ``--node-label-selector``),
and prints where a bound pod is placed, or else, after removing the pod's own reservation (a
decision Filter recorded whose Bind has not happened), the core's verdicts
(:func:`hami.core.explain.pending_verdict`: the same filter on every node, each node gets its
verdict). Read-only: it patches nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, Mapping

from hami.config import load_device_config
from hami.core import CoreError, SchedulerConfig, pod_key
from hami.core.errors import ConfigError
from hami.core.explain import pending_verdict
from hami.core.names import BIND_PHASE
from hami.core.nodefit import left_out as nodefit_left_out
from hami.core.requests import pod_request
from hami.vendors import build_vendors

from .options import parse_selector
from .state import HANDSHAKE_TIMEOUT_S, HELD_BACK, ClusterState, vendor_alive

DRA_API = "/apis/resource.k8s.io/v1"

#: nodes printed one by one, device by device (``--nodes``); the rest are only counted per reason
NODES_SHOWN = 20
#: reasons listed with their node counts (the most frequent first); the rest are counted together
REASONS_SHOWN = 20
#: names listed per kind of node whose devices are ignored
NAMES_SHOWN = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pod", help="POD or NAMESPACE/POD")
    parser.add_argument(
        "-n", "--namespace", default="default", help="namespace when POD has none (default %(default)s)"
    )
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--device-config-file", default="", help="the scheduler's device-config.yaml")
    parser.add_argument("--node-scheduler-policy", default="binpack")
    parser.add_argument("--gpu-scheduler-policy", default="spread")
    parser.add_argument(
        "--score-with-request",
        choices=("true", "false"),
        default="true",
        help="as the scheduler's flag of that name (default %(default)s)",
    )
    parser.add_argument("--scheduler-name", default="hami-scheduler")
    parser.add_argument(
        "--node-label-selector",
        default="",
        help="as the scheduler's flag of that name: only nodes with these labels, k=v[,k=v]",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=NODES_SHOWN,
        help="nodes printed one by one, GPU by GPU; the others are counted per reason (0: every node; "
        "default %(default)s)",
    )


def render(
    pod: dict,
    state: ClusterState,
    events: list[dict],
    now: float,
    dra: tuple[list[dict], list[dict]] | None = None,
    limit: int = NODES_SHOWN,
) -> str:
    """``dra``: the ResourceSlices and ResourceClaims, read when the pod names ResourceClaims;
    ``limit``: the nodes printed one by one (0: every node)."""
    from hami.dra.explain import explain_pod, gated_reason, scheduling_gates, uses_dra

    meta = pod["metadata"]
    ref = f"{meta['namespace']}/{meta['name']}"
    lines = [
        f"Pod {ref}: phase {pod.get('status', {}).get('phase', '?')}, "
        f"node {pod.get('spec', {}).get('nodeName') or '-'}, scheduler {pod.get('spec', {}).get('schedulerName')}"
    ]
    gates = [] if (pod.get("spec") or {}).get("nodeName") else scheduling_gates(pod)
    if gates:
        # kube-scheduler keeps a gated pod out of its queue: no Filter (nor DRA allocation) sees it
        # until the gates are removed, whatever the devices say (found by review, 1 Dec)
        lines.append(
            f"It is {gated_reason(gates)}: kube-scheduler does not schedule it (no Filter, no DRA allocation) "
            "until the gates are removed (e.g. Kueue removes its gate on admitting the workload)."
        )
        return "\n".join(lines)
    if uses_dra(pod):
        lines.append(
            "It uses DRA ResourceClaims: kube-scheduler's DRA allocator places them, not hami-scheduler "
            f"(the same as `hami dra --explain {ref}`):"
        )
        if dra is None:
            lines.append("  (the ResourceSlices and ResourceClaims could not be read)")
        else:
            lines += [f"  {line}" for line in explain_pod(pod, *dra, events=events)]
        if not pod_request(pod, state.vendors).has_devices:
            return "\n".join(lines)
        lines.append("It also asks for devices through the extender:")
    ledger = state.ledger
    held = ledger.pod(pod_key(pod))
    bound = (pod.get("spec") or {}).get("nodeName")
    phase = meta.get("annotations", {}).get(BIND_PHASE, "-")
    if bound:
        lines.append(f"It is placed on node {bound} (bind-phase {phase}):")
        for u in held.usage if held else ():
            lines.append(f"  {u.vendor} {u.uuid}: {u.mem} MiB, {u.cores} cores, {u.slots} slot(s)")
        return "\n".join(lines)
    if held is not None:
        # a decision (or reservation) that no Bind completed: the next Filter drops it and decides
        # again, so the pod is explained as that Filter sees the cluster
        lines.append(
            f"It carries a decision for node {held.node} (bind-phase {phase}) but is not bound: "
            "the next Filter drops that decision and decides again, as below."
        )
    ledger.remove_pod(pod_key(pod))
    # kube-scheduler offers the extender only the nodes its own filters pass: the others are
    # never chosen, whatever their devices say
    left_out, unread = nodefit_left_out(pod, state.nodes, state.ledger.node_names())
    offered = [n for n in ledger.node_names() if n not in left_out]
    verdict = pending_verdict(pod, ledger, state.config, state.vendors, now, offered if left_out else None)
    req = verdict.request
    for c in req.containers:
        asks = "; ".join(f"{r.vendor} x{r.nums} mem={_memory(r)} cores={r.coresreq}" for r in c.requests)
        lines.append(f"  container {c.name} ({c.kind.value}): {asks or 'no device'}")
    if not req.has_devices:
        lines.append("It requests no device: hami scheduler passes it through.")
        return "\n".join(lines)
    if unread:
        lines.append(f"  (kube-scheduler's node filters are not applied: {unread})")
    if verdict.chosen:
        # the devices only: kube-scheduler's NodeResourcesFit (cpu, memory, pods) needs every pod
        # on the node, and the scheduler's cache holds the pods with devices only (found by
        # review, 1 Dec: a pod asking 64 CPUs of an 8-CPU node was said to fit)
        lines.append(
            f"It fits now: the scheduler would choose node {verdict.chosen} for its devices (kube-scheduler "
            "retries pending pods). kube-scheduler's own resource filters (cpu, memory, pod count) are not "
            f"checked here: if it stays pending, its events say why (kubectl describe pod -n {meta['namespace']} "
            f"{meta['name']})."
        )
    elif left_out:
        lines.append(
            f"It fits on none of the {len(offered)} nodes with devices kube-scheduler offers it "
            f"({len(left_out)} more are left out by kube-scheduler's node selector, affinity, taint and cordon filters):"
        )
    else:
        lines.append(f"It fits on none of the {len(ledger.node_names())} nodes with devices:")
    elsewhere = [v.node for v in verdict.nodes if v.fits and v.node in left_out]
    if not verdict.chosen and elsewhere:
        lines.append(
            f"Its devices would fit on {len(elsewhere)} node(s) kube-scheduler leaves out: "
            f"{', '.join(elsewhere[:NAMES_SHOWN])}{' ...' if len(elsewhere) > NAMES_SHOWN else ''} "
            "(check the pod's nodeSelector, node affinity and tolerations, and the nodes' taints and cordon)"
        )
    lines += _by_reason(verdict.nodes, left_out)
    shown = _shown(verdict, left_out, limit)
    ignored = _ignored(state, now)
    for v in shown:
        outside = f"left out by kube-scheduler: {left_out[v.node]}; its devices: " if v.node in left_out else ""
        note = f" [{ignored[v.node]}]" if v.node in ignored else ""
        if v.fits:
            lines.append(f"  node {v.node}: {outside}fit{'' if outside else 's'}{note}")
            continue
        where = f" (container #{v.container})" if v.container >= 0 else ""
        lines.append(f"  node {v.node}: {outside}{v.reason}{where}{': ' + v.detail if v.detail else ''}{note}")
        held_back = state.held_back_vendors(v.node)
        for dv in v.devices:
            d, reason = dv.device, _device_reason(dv.reason, dv.device.vendor in held_back)
            own = (
                f" (this pod's earlier containers: {dv.pod_slots} slot(s), {dv.pod_mem} MiB, {dv.pod_cores} cores)"
                if dv.pod_slots or dv.pod_mem or dv.pod_cores
                else ""
            )
            lines.append(
                f"    gpu {d.index} {d.id} {d.type}: slots {dv.slots}/{d.count}, mem {dv.mem}/{d.devmem} MiB, "
                f"cores {dv.cores}/{d.devcore}, numa {d.numa}{'' if d.health else ', UNHEALTHY'}{own} -> {reason}"
                + (f": {dv.detail}" if dv.detail else "")
            )
    if len(shown) < len(verdict.nodes):
        lines.append(
            f"  ... {len(verdict.nodes) - len(shown)} more nodes not shown (counted above; --nodes 0 shows every node)"
        )
    lines += _ignored_lines(state, ignored)
    recent = [
        e for e in _own(events, pod) if e.get("reason") in ("FilteringFailed", "FailedScheduling", "BindingFailed")
    ]
    if recent:
        lines.append("Recent events:")
        lines += [f"  {e.get('reason')}: {e.get('message')}" for e in recent[-5:]]
    return "\n".join(lines)


def _device_reason(reason: str, held_back: bool) -> str:
    """A device's reason code as printed: ``AllocatedCardsInsufficientRequest`` says the device
    itself is usable; a ``CardCordoned`` device whose vendor a running pod's unreadable grant holds
    back on its node says so (``held_back``: no ``hami.io/device-cordon`` entry is behind it)."""
    if reason == "AllocatedCardsInsufficientRequest":
        return "usable, but the node has too few usable cards (AllocatedCardsInsufficientRequest)"
    if reason == "CardCordoned" and held_back:
        return f"CardCordoned ({HELD_BACK})"
    return reason


def _ignored_lines(state: ClusterState, ignored: Mapping[str, str]) -> list[str]:
    """The nodes without devices in the ledger, by why: a registration that cannot be read, a
    device plugin that stopped answering, none registered, or outside ``--node-label-selector``
    (at most :data:`NAMES_SHOWN` names each, and how many more)."""
    lines: list[str] = []
    missing = set(state.nodes) - set(state.ledger.node_names())
    unregistered = sorted(missing - state.unselected)
    groups: dict[str, list[str]] = {}
    for name in unregistered:
        why = ignored.get(name)
        label = (
            "nodes without registered devices (ignored)"
            if why is None
            else "nodes whose device registration cannot be read (their devices are ignored)"
            if name in state.registration_errors
            else "nodes whose device plugin stopped answering (their devices are ignored)"
        )
        groups.setdefault(label, []).append(f"{name} ({why})" if why else name)
    groups["nodes outside --node-label-selector (NodeLabelSelectorMismatch)"] = sorted(missing & state.unselected)
    for label, names in groups.items():
        if names:
            more = len(names) - NAMES_SHOWN
            lines.append(f"  {label}: {', '.join(names[:NAMES_SHOWN])}" + (f" ... and {more} more" if more > 0 else ""))
    return lines


def _by_reason(nodes: Any, left_out: Mapping[str, str]) -> list[str]:
    """How many nodes give each answer, the most frequent first (so the counts add up to every
    node with devices): "fits", HAMi's reason string, or kube-scheduler's for a node it leaves out."""
    counts: dict[str, int] = {}
    for v in nodes:
        key = f"left out by kube-scheduler: {left_out[v.node]}" if v.node in left_out else "fit" if v.fits else v.reason
        counts[key] = counts.get(key, 0) + 1
    if len(counts) < 2 and len(nodes) < 2:
        return []  # one node: its own line says it
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    out = [f"  {n} node{'s' if n != 1 else ''}: {reason}" for reason, n in ranked[:REASONS_SHOWN]]
    rest = ranked[REASONS_SHOWN:]
    if rest:
        out.append(f"  {sum(n for _, n in rest)} nodes: {len(rest)} other reasons")
    return out


def _shown(verdict: Any, left_out: Mapping[str, str], limit: int) -> list[Any]:
    """The nodes printed one by one: the chosen node, then the others that fit, then those the
    extender refuses, then those kube-scheduler leaves out (each in name order); ``limit`` of
    them (0: every node)."""

    def order(v: Any) -> int:
        if v.node == verdict.chosen:
            return 0
        return 3 if v.node in left_out else 1 if v.fits else 2

    ranked = sorted(verdict.nodes, key=lambda v: (order(v), v.node))
    return ranked if limit <= 0 else ranked[:limit]


def _ignored(state: ClusterState, now: float) -> dict[str, str]:
    """Node -> why some of its devices are left out of the ledger: a vendor's registration that
    cannot be read (the error), or a device plugin that stopped answering the handshake; or held
    back: a running pod's allocation that cannot be read (:class:`~.state.UnreadableGrant`)."""
    out: dict[str, str] = {}
    for name, node in state.nodes.items():
        whys = [f"{vendor or 'node'}: {message}" for vendor, message in state.registration_errors.get(name, {}).items()]
        annotations = ((node.get("metadata") or {}).get("annotations")) or {}
        for v in state.vendors:
            if v.register_annotation in annotations and not vendor_alive(node, v, now):
                value = annotations.get(v.handshake_annotation or "", "")
                whys.append(
                    f"{v.name}: handshake {v.handshake_annotation} {value} is older than "
                    f"{HANDSHAKE_TIMEOUT_S:.0f} s and the node advertises no {v.resources.count}"
                )
        for g in state.unreadable.values():
            if g.node == name:  # (its vendors' devices there are cordoned: say by whom, not a bare CardCordoned)
                whys.append(
                    f"{', '.join(sorted(g.errors))} devices held back: running pod {g.pod}'s allocation "
                    f"cannot be read ({'; '.join(g.errors.values())[:300]})"
                )
        if whys:
            out[name] = "; ".join(whys)
    return out


def _own(events: list[dict], pod: Mapping[str, Any]) -> list[dict]:
    """The events about this pod: the field selector matches a name, so an earlier pod of the
    same name (a StatefulSet's, recreated) and other kinds of objects of that name are dropped."""
    uid = (pod.get("metadata") or {}).get("uid")
    out = []
    for e in events:
        involved = e.get("involvedObject") or e.get("regarding") or {}
        if involved.get("kind", "Pod") != "Pod" or uid and involved.get("uid", uid) != uid:
            continue
        out.append(e)
    return out


def _memory(r: Any) -> str:
    """A request's memory per device: MiB, or a percentage of each device's memory ("-": none)."""
    if r.memreq:
        return f"{r.memreq}MiB"
    return f"{r.mem_percentage}%" if 0 < r.mem_percentage <= 100 else "-"


async def read_cluster(kube: Any, state: ClusterState, pod: Mapping[str, Any]) -> tuple[list[dict], list[dict]] | None:
    """Fill ``state`` from the cluster as the scheduler's watches do: nodes, pods, ResourceQuotas,
    and the DRA ResourceSlices and ResourceClaims (the claims count against quotas; either is
    left out where the API does not serve it or this identity may not read it, 404 or 403, as
    the scheduler's optional watches are). Returns ``(slices, claims)`` for a pod that names
    ResourceClaims (None when they could not be read)."""
    from hami.dra.explain import uses_dra
    from hami.kube.client import KubeError

    state.node_handler.replace((await kube.get("/api/v1/nodes"))["items"])
    state.pod_handler.replace((await kube.get("/api/v1/pods"))["items"])
    state.quota_handler.replace((await kube.get("/api/v1/resourcequotas"))["items"])
    dra = uses_dra(pod)
    got: dict[str, list[dict] | None] = {}
    for kind in ("resourceslices", "resourceclaims"):
        try:
            got[kind] = (await kube.get(f"{DRA_API}/{kind}"))["items"]
        except KubeError as exc:
            got[kind] = None
            if dra or exc.status not in (403, 404):
                print(f"hami explain: reading {kind}: {exc}", file=sys.stderr)
    slices, claims = got["resourceslices"], got["resourceclaims"]
    if slices is not None:
        state.slice_handler.replace(slices)
    if claims is not None:
        state.claim_handler.replace(claims)
    return (slices, claims) if dra and slices is not None and claims is not None else None


async def _main(args: argparse.Namespace) -> int:
    from hami.kube.client import KubeClient, KubeError

    ns, _, name = args.pod.rpartition("/")
    ns = ns or args.namespace
    device_config = None
    if args.device_config_file:
        with open(args.device_config_file) as fh:
            device_config = load_device_config(fh.read(), args.device_config_file)
    selector = parse_selector(getattr(args, "node_label_selector", ""), "--node-label-selector")
    config = SchedulerConfig(
        build_vendors(device_config),
        args.node_scheduler_policy,
        args.gpu_scheduler_policy,
        request_in_scores=getattr(args, "score_with_request", "true") == "true",
    )
    kube = await KubeClient.connect(args.kubeconfig)
    try:
        try:
            pod = await kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        except KubeError as exc:
            print(f"hami explain: pod {ns}/{name}: {exc}", file=sys.stderr)
            return 1
        state = ClusterState(config, args.scheduler_name, selector)
        try:
            dra = await read_cluster(kube, state, pod)
            evs = (
                await kube.request(
                    "GET", f"/api/v1/namespaces/{ns}/events", [("fieldSelector", f"involvedObject.name={name}")]
                )
            )["items"]
        except KubeError as exc:
            # it rebuilds the scheduler's view: every node, pod and quota of the cluster
            print(
                f"hami explain: {exc} (it needs list on nodes, pods and resourcequotas "
                "in all namespaces, and on the pod's events)",
                file=sys.stderr,
            )
            return 1
        evs.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        import time

        print(render(pod, state, evs, time.time(), dra, max(getattr(args, "nodes", NODES_SHOWN), 0)))
        return 0
    finally:
        await kube.close()


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except (CoreError, ConfigError, OSError) as exc:
        print(f"hami explain: {exc}", file=sys.stderr)
        return 1
