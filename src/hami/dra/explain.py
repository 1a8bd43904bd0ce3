"""What the GPUs of the DRA path hold and why a claim does not fit (pure; ``hami dra --explain``).

kube-scheduler places claims on this path, and says only "cannot allocate all claims". This
module reads the same objects it does (the driver's ResourceSlices and the allocated
ResourceClaims) and answers per GPU: how much memory, cores and shares are taken, by which claims,
and for a claim's request what it would consume there (the device's request policy applied:
defaults for what it does not ask, memory rounded up to whole MiB) and what is short. For a pod
not yet placed it then replays the allocator's search (:func:`hami.dra.fit.allocate_claims`) for
all of the pod's unallocated claims together, node by node (pool by pool): where they would go,
or which claim stops them, since claims that each fit alone may not fit together. A GPU that a
request's CEL selector (or its class's) rules out is named with that selector. Node
selectors, taints and CPU/memory fit stay kube-scheduler's business; this module explains the
GPUs.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .fit import CAPACITIES, DeviceUse, add_claims, shortfall, usage, wanted  # noqa: F401  (this module's API since it began)
from .fit import ClaimAsk, ClaimError, Request, allocate_claims, claim_spec_requests, device_why, show, why_not_claims
from .model import CORES, MEMORY, MIB, SHARES


def describe(
    uses: Mapping[tuple[str, str], DeviceUse], requests: Mapping[str, Any] | None = None, request: Request | None = None
) -> list[str]:
    """One line per GPU (pool order, then device): use, and with ``requests`` whether it fits
    (with ``request``, its selectors first: the one that is false or fails is named)."""
    lines = []
    for key in sorted(uses):
        d = uses[key]
        line = (
            f"{d.pool}/{d.device}: memory {d.used[MEMORY] // MIB}/{d.total[MEMORY] // MIB} MiB, "
            f"cores {show(d.used[CORES])}/{show(d.total[CORES])}, shares {d.used[SHARES]}/{d.total[SHARES]}"
        )
        if requests is not None:
            why = device_why(d, request) if request is not None else shortfall(d, requests)
            line += f" -> {'fits' if not why else why}"
        lines.append(line)
    return lines


def claim_requests(claim: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(request name, capacity requests) of the claim's requests (``exactly``) that are not yet allocated."""
    reqs = (((claim.get("spec") or {}).get("devices") or {}).get("requests")) or ()
    return [
        (r.get("name", ""), dict(((r.get("exactly") or {}).get("capacity") or {}).get("requests") or {}))
        for r in reqs
        if r.get("exactly")
    ]


def uses_dra(pod: Mapping[str, Any]) -> bool:
    """Whether the pod names ResourceClaims (its devices then come from DRA, not the extender)."""
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def scheduling_gates(pod: Mapping[str, Any]) -> list[str]:
    """The names of the pod's ``spec.schedulingGates`` (e.g. Kueue's ``kueue.x-k8s.io/admission``):
    while there is one, kube-scheduler keeps the pod out of scheduling (no Filter, no DRA
    allocation) until whoever set them removes them."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    return [str(g.get("name") if isinstance(g, Mapping) else g) for g in gates]


def gated_reason(gates: Sequence[str]) -> str:
    """The one reason given for a gated pod: ``scheduling gated (<names>)``."""
    return f"scheduling gated ({', '.join(gates)})"


def allocation_nodes(claim: Mapping[str, Any]) -> list[str]:
    """The nodes an allocated claim ties its pods to: the node names of its allocation's
    ``nodeSelector`` (its ``metadata.name`` fields), else the pools of its results (a pool is a
    node on this driver)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    names: list[str] = []
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or ():
        for e in term.get("matchFields") or ():
            if e.get("key") == "metadata.name" and e.get("operator") == "In":
                names += [str(v) for v in e.get("values") or () if str(v) not in names]
    if names:
        return names
    results = (allocation.get("devices") or {}).get("results") or ()
    return sorted({str(r.get("pool")) for r in results if r.get("pool")})


#: the reason of the event kube-controller-manager records on a pod when it cannot create a
#: claim from the pod's template (its message begins ``PodResourceClaim <entry>: ``)
CLAIM_CREATION_FAILED = "FailedResourceClaimCreation"


def creation_refusals(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The pod's ``resourceClaims`` entry -> the message of the latest event saying its claim could
    not be created (a quota refusal by the webhook, a template that does not exist, ...)."""
    uid = (pod.get("metadata") or {}).get("uid")
    out: dict[str, str] = {}
    for e in sorted(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or "")):
        involved = e.get("involvedObject") or {}
        if e.get("reason") != CLAIM_CREATION_FAILED or (uid and involved.get("uid") not in (None, uid)):
            continue
        message = str(e.get("message") or e.get("note") or "")
        entry, sep, rest = message.partition(": ")
        if sep and entry.startswith("PodResourceClaim "):
            out[entry.removeprefix("PodResourceClaim ")] = rest
    return out


def explain_pod(
    pod: Mapping[str, Any],
    slices: list[Mapping[str, Any]],
    claims: list[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]] = (),
) -> list[str]:
    """The lines of ``hami dra --explain``: every GPU's use, then each claim of the pod: where it is
    allocated, or GPU by GPU what its requests would consume and what is short. ``events``: the
    pod's events; a claim that kube-controller-manager could not create (its
    ``FailedResourceClaimCreation``, e.g. the webhook refusing it for the namespace quota) is
    named with the refusal instead of "not created yet"."""
    meta = pod.get("metadata") or {}
    namespace, name = meta.get("namespace") or "default", meta.get("name") or "?"
    uses = usage(slices, claims)
    by_name = {
        (c.get("metadata") or {}).get("name"): c
        for c in claims
        if (c.get("metadata") or {}).get("namespace") == namespace
    }
    statuses = {
        s.get("name"): s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
    }
    node = (pod.get("spec") or {}).get("nodeName")
    lines = [f"pod {namespace}/{name}: node {node or '(none)'}"]
    lines += describe(uses) if uses else ["no gpu.hami.io GPU is published"]
    pending: dict[str, Mapping[str, Any]] = {}  # the unallocated claims, in the pod's order
    tied: dict[str, list[str]] = {}  # allocated claim -> the nodes it ties the pod to
    missing = False
    refused = creation_refusals(pod, events)
    for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
        claim_name = statuses.get(ref.get("name")) or ref.get("resourceClaimName")
        claim = by_name.get(claim_name or "")
        if claim is None:
            why = refused.get(str(ref.get("name")))
            lines.append(
                f"claim {ref.get('name')}: not created: kube-controller-manager's last attempt failed: {why}"
                if why
                else f"claim {ref.get('name')}: not created yet (kube-controller-manager makes it from its template; "
                "a refused creation shows as a FailedResourceClaimCreation event on the pod)"
            )
            missing = True
            continue
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        if results:
            where = ", ".join(f"{r.get('pool')}/{r.get('device')}" for r in results)
            lines.append(f"claim {claim_name}: allocated on {where}")
            tied[claim_name or ""] = allocation_nodes(claim)
            continue
        pending[claim_name or ""] = claim
        try:  # the requests as the allocator reads them (their selectors compiled)
            parsed = {r.name: r for r in claim_spec_requests(claim.get("spec") or {}, f"claim {claim_name} spec")[0]}
        except ClaimError as exc:
            lines.append(f"claim {claim_name}: {exc}")
            parsed = {}
        for request, caps in claim_requests(claim):
            asked = ", ".join(f"{k} {v}" for k, v in sorted(caps.items())) or "the defaults"
            lines.append(f"claim {claim_name} request {request} ({asked}), GPU by GPU:")
            lines += [f"  {line}" for line in describe(uses, caps, parsed.get(request))]
    gates = scheduling_gates(pod)
    if gates and not node:
        lines.append(
            f"the pod is {gated_reason(gates)}: kube-scheduler neither schedules it nor allocates its claims "
            "until the gates are removed"
        )
        return lines
    if not node and tied:
        lines += _tie(tied)
    if pending and uses and not node and not missing:
        lines += _search(pending, uses, tied)
    return lines


def _common_nodes(tied: Mapping[str, Sequence[str]]) -> set[str] | None:
    """The nodes every allocated claim of the pod allows (None: the pod has none)."""
    common: set[str] | None = None
    for nodes in tied.values():
        common = set(nodes) if common is None else common & set(nodes)
    return common


def _tie(tied: Mapping[str, Sequence[str]]) -> list[str]:
    """What the pod's allocated claims say of its node: kube-scheduler's DRA filter keeps a pod
    on the node(s) of its allocated claims, and no node fits when they name different nodes."""
    common = _common_nodes(tied)
    if common:
        return []
    where = ", ".join(f"claim {name} on {'/'.join(nodes) or '(no node)'}" for name, nodes in tied.items())
    return [
        f"no node fits: the pod's allocated claims are on different nodes ({where}); kube-scheduler needs one node for all of them"
    ]


def _search(
    pending: Mapping[str, Mapping[str, Any]],
    uses: Mapping[tuple[str, str], DeviceUse],
    tied: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """The allocator's search for the pod's unallocated claims together, pool by pool (a pool is
    a node on this driver); ``tied``: the pod's allocated claims -> their nodes (the pod can go
    only where all of them are, as kube-scheduler's DRA filter decides: the other pools are not
    searched, and say which claim ties the pod elsewhere)."""
    common = _common_nodes(tied or {})
    asks = []
    for name, claim in pending.items():
        try:
            requests, constraints = claim_spec_requests(claim.get("spec") or {}, f"claim {name} spec")
        except ClaimError as exc:
            return [f"kube-scheduler's search is not replayed: {exc}"]
        asks.append(ClaimAsk(name, requests, constraints))
    pools: dict[str, list[DeviceUse]] = {}
    for d in uses.values():  # slice order: the order the allocator tries devices in
        pools.setdefault(d.pool, []).append(d)
    lines = ["the pod's unallocated claims together, as kube-scheduler's allocator searches them, pool by pool:"]
    for pool, devices in pools.items():
        if common is not None and pool not in common:
            if not common:
                lines.append(f"  {pool}: not searched: the pod's allocated claims are on different nodes")
            else:
                ties = ", ".join(f"claim {c}" for c, nodes in (tied or {}).items() if pool not in nodes)
                lines.append(f"  {pool}: not searched: the pod is tied to node {'/'.join(sorted(common))} by {ties}")
            continue
        found = allocate_claims(devices, asks)
        if found.picks is None:
            lines.append(f"  {pool}: {why_not_claims(devices, asks, found)}")
        else:
            where = ", ".join(
                f"{a.name} on {'+'.join(p.device.device for p in picks)}" for a, picks in zip(asks, found.picks)
            )
            lines.append(f"  {pool}: fits ({where})")
    for node in sorted((common or set()) - set(pools)):
        lines.append(
            f"  {node}: the pod is tied to this node by its allocated claims, and it publishes no gpu.hami.io GPU"
        )
    return lines
