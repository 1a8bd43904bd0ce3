"""``hami explain POD``: why a pod is (or would be) pending, per node and per device.

It reads the live cluster (nodes, pods, ResourceQuotas, the pod's events), rebuilds the ledger
the way the scheduler does (:class:`hami.scheduler.state.ClusterState`), removes the pod's own
allocation, and prints the core's verdicts (:func:`hami.core.explain.pending_verdict`: the same
filter on every node, each node gets its verdict). Read-only: it patches nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from hami.config import load_device_config
from hami.core import CoreError, SchedulerConfig, pod_key
from hami.core.errors import ConfigError
from hami.core.explain import pending_verdict
from hami.core.names import BIND_PHASE
from hami.core.requests import pod_request
from hami.vendors import build_vendors

from .state import ClusterState


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
            lines += [f"  {line}" for line in explain_pod(pod, *dra)]
        if not pod_request(pod, state.vendors).has_devices:
            return "\n".join(lines)
        lines.append("It also asks for devices through the extender:")
    ledger = state.ledger
    held = ledger.pod(pod_key(pod))
    if (pod.get("spec") or {}).get("nodeName") or held is not None:
        lines.append(
            f"It is placed on node {(held.node if held else None) or pod['spec'].get('nodeName')}"
            f" (bind-phase {meta.get('annotations', {}).get(BIND_PHASE, '-')}):"
        )
        for u in held.usage if held else ():
            lines.append(f"  {u.vendor} {u.uuid}: {u.mem} MiB, {u.cores} cores, {u.slots} slot(s)")
        return "\n".join(lines)
    ledger.remove_pod(pod_key(pod))
    verdict = pending_verdict(pod, ledger, state.config, state.vendors, now)
    req = verdict.request
    for c in req.containers:
        asks = (
            "; ".join(
                f"{r.vendor} x{r.nums} mem={r.memreq or (str(r.mem_percentage) + '%')}MiB cores={r.coresreq}"
                for r in c.requests
            )
            or "no device"
        )
        lines.append(f"  container {c.name} ({c.kind.value}): {asks}")
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
        lines.append(f"  node {v.node}: {v.reason}{where}")
        for dv in v.devices:
            d, reason = dv.device, dv.reason
            if reason == "AllocatedCardsInsufficientRequest":
                reason = "usable, but the node has too few usable cards (AllocatedCardsInsufficientRequest)"
            lines.append(
                f"    gpu {d.index} {d.id} {d.type}: slots {dv.slots}/{d.count}, mem {dv.mem}/{d.devmem} MiB, "
                f"cores {dv.cores}/{d.devcore}, numa {d.numa}{'' if d.health else ', UNHEALTHY'} -> {reason}"
            )
    missing = sorted(set(state.nodes) - set(ledger.node_names()))
    if missing:
        lines.append(
            f"  nodes without registered devices (ignored): {', '.join(missing[:20])}"
            + (" ..." if len(missing) > 20 else "")
        )
    recent = [e for e in events if e.get("reason") in ("FilteringFailed", "FailedScheduling", "BindingFailed")][-5:]
    if recent:
        lines.append("Recent events:")
        lines += [f"  {e.get('reason')}: {e.get('message')}" for e in recent]
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> int:
    from hami.kube.client import KubeClient, KubeError

    ns, _, name = args.pod.rpartition("/")
    ns = ns or args.namespace
    device_config = None
    if args.device_config_file:
        with open(args.device_config_file) as fh:
            device_config = load_device_config(fh.read(), args.device_config_file)
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
        state = ClusterState(config, args.scheduler_name)
        nodes = await kube.get("/api/v1/nodes")
        state.node_handler.replace(nodes["items"])
        state.pod_handler.replace((await kube.get("/api/v1/pods"))["items"])
        state.quota_handler.replace((await kube.get("/api/v1/resourcequotas"))["items"])
        evs = (
            await kube.request(
                "GET", f"/api/v1/namespaces/{ns}/events", [("fieldSelector", f"involvedObject.name={name}")]
            )
        )["items"]
        evs.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        dra = None
        from hami.dra.explain import uses_dra

        if uses_dra(pod):
            try:
                api = "/apis/resource.k8s.io/v1"
                dra = (
                    (await kube.get(f"{api}/resourceslices"))["items"],
                    (await kube.get(f"{api}/resourceclaims"))["items"],
                )
            except KubeError as exc:
                print(f"hami explain: reading ResourceSlices/ResourceClaims: {exc}", file=sys.stderr)
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
