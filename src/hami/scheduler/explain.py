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
from hami.core.requests import pod_request
from hami.vendors import build_vendors

from .options import parse_selector
from .state import ClusterState

DRA_API = "/apis/resource.k8s.io/v1"


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


def render(
    pod: dict, state: ClusterState, events: list[dict], now: float, dra: tuple[list[dict], list[dict]] | None = None
) -> str:
    """``dra``: the ResourceSlices and ResourceClaims, read when the pod names ResourceClaims."""
    from hami.dra.explain import explain_pod, uses_dra

    meta = pod["metadata"]
    ref = f"{meta['namespace']}/{meta['name']}"
    lines = [
        f"Pod {ref}: phase {pod.get('status', {}).get('phase', '?')}, "
        f"node {pod.get('spec', {}).get('nodeName') or '-'}, scheduler {pod.get('spec', {}).get('schedulerName')}"
    ]
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
    verdict = pending_verdict(pod, ledger, state.config, state.vendors, now)
    req = verdict.request
    for c in req.containers:
        asks = "; ".join(f"{r.vendor} x{r.nums} mem={_memory(r)} cores={r.coresreq}" for r in c.requests)
        lines.append(f"  container {c.name} ({c.kind.value}): {asks or 'no device'}")
    if not req.has_devices:
        lines.append("It requests no device: hami scheduler passes it through.")
        return "\n".join(lines)
    if verdict.chosen:
        lines.append(
            f"It fits now: the scheduler would choose node {verdict.chosen} (kube-scheduler retries pending pods)."
        )
    else:
        lines.append(f"It fits on none of the {len(ledger.node_names())} nodes with devices:")
    for v in verdict.nodes:
        if v.fits:
            lines.append(f"  node {v.node}: fits")
            continue
        where = f" (container #{v.container})" if v.container >= 0 else ""
        lines.append(f"  node {v.node}: {v.reason}{where}{': ' + v.detail if v.detail else ''}")
        for dv in v.devices:
            d, reason = dv.device, dv.reason
            if reason == "AllocatedCardsInsufficientRequest":
                reason = "usable, but the node has too few usable cards (AllocatedCardsInsufficientRequest)"
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
    missing = set(state.nodes) - set(ledger.node_names())
    for label, names in (
        ("nodes without registered devices (ignored)", sorted(missing - state.unselected)),
        ("nodes outside --node-label-selector (NodeLabelSelectorMismatch)", sorted(missing & state.unselected)),
    ):
        if names:
            lines.append(f"  {label}: {', '.join(names[:20])}" + (" ..." if len(names) > 20 else ""))
    recent = [e for e in events if e.get("reason") in ("FilteringFailed", "FailedScheduling", "BindingFailed")][-5:]
    if recent:
        lines.append("Recent events:")
        lines += [f"  {e.get('reason')}: {e.get('message')}" for e in recent]
    return "\n".join(lines)


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
        dra = await read_cluster(kube, state, pod)
        evs = (
            await kube.request(
                "GET", f"/api/v1/namespaces/{ns}/events", [("fieldSelector", f"involvedObject.name={name}")]
            )
        )["items"]
        evs.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        import time

        print(render(pod, state, evs, time.time(), dra))
        return 0
    finally:
        await kube.close()


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except (CoreError, ConfigError, OSError) as exc:
        print(f"hami explain: {exc}", file=sys.stderr)
        return 1
