"""The monitor's only API-server call: the pods bound to this node (uid -> namespace/name), with
what each container was given (its GPUs and priority), which the feedback loop trusts instead of
the container's own region."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from hami.core.codec import decode_mig_allocations, decode_pod_devices
from hami.core.errors import CodecError
from hami.core.ledger import EntryLayout, asks_devices, entry_layout, init_containers_may_run_again
from hami.core.names import DEFAULT_PRIORITY, VGPU_MIG_ALLOCATIONS
from hami.vendors.nvidia import NvidiaVendor

from .exporter import ContainerGrant, MigDevice, PodRef

MIG_ANNOTATION = VGPU_MIG_ALLOCATIONS
ALLOCATED = NvidiaVendor.allocated_annotation
#: what a container asks NVIDIA GPUs with, unless configured otherwise (the chart's resourceName,
#: resourceMem, resourceMemPercentage and resourceCores; ``--resource-names``)
NVIDIA_RESOURCES = NvidiaVendor().resources.asking
#: the one of them that counts GPUs (the chart's resourceName, ``--resource-name``): a container
#: asks when it is above 0 (:func:`_asks`)
NVIDIA_COUNT = NvidiaVendor().resources.count
#: the device plugin's default priority resource (device-config ``resourcePriorityName``)
PRIORITY_RESOURCE = "nvidia.com/priority"
#: phases of a pod that will never run again (a Job's pod stays in the API after it, until its
#: TTL or for ever): the scheduler has released its GPUs, so the monitor treats it as gone
FINISHED = ("Succeeded", "Failed")
#: the longest one pod-list request may take. kubernetes_asyncio's default is no time-out at all:
#: a connection the network black-holes (an API server failing over) would stop the refresh loop
#: for good, and with it the clean-up and the feedback that run in the same round. A few feedback
#: periods (``--interval``, 5 s) at most; a list that fails keeps the last pod map.
API_TIMEOUT_S = 10.0
#: node -> the resourceVersion of the last pod list of it (:func:`node_pods`)
_LISTED: dict[str, str] = {}
#: node -> lists since its last consistent one; every CONSISTENT_EVERY-th list is consistent again
#: (read from etcd): a watch cache that stopped advancing (one API server of several, its etcd
#: watch stalled) answers "not older than" with the same stale list for ever, and a pod that
#: started since never showed, so its containers' directories were removed as gone after the
#: grace (the regression review, 1 Dec). Once a minute at the default interval: far inside the
#: grace, and after it a stuck cache answers "too large" (asked for a newer version), which lists
#: consistently too.
_SINCE_CONSISTENT: dict[str, int] = {}
CONSISTENT_EVERY = 12


def mig_devices(
    annotations: dict[str, str] | None, containers: list[str], shift: int | EntryLayout = 0
) -> tuple[MigDevice, ...]:
    """The instances a pod's annotation names with their runtime identity (set by the device
    plugin once made); ``containers``: init containers, then regular (the annotation's order);
    ``shift``: the init containers an allocation HAMi wrote without them skips
    (:func:`layout_shift`), or the allocation's whole :func:`entry_layout` (a reservation's
    container index counts entries as its grant does). A malformed annotation yields none (the
    scheduler reports it)."""
    try:
        entries = decode_mig_allocations((annotations or {}).get(MIG_ANNOTATION, ""))
    except CodecError:
        return ()
    layout = shift if isinstance(shift, EntryLayout) else EntryLayout(shift=shift)
    return tuple(
        MigDevice(
            containers[i] if (i := layout.container(e.container)) < len(containers) else str(i),
            e.device,
            e.gpu_uuid,
            e.mig_uuid,
            e.profile,
            e.gpu_instance_id,
            e.compute_instance_id,
        )
        for e in entries
        if e.mig_uuid and e.gpu_instance_id is not None and e.compute_instance_id is not None
    )


def _priority(container: Any, resource: str) -> int:
    limits = (container.resources.limits if container.resources is not None else None) or {}
    try:
        return int(str(limits.get(resource, DEFAULT_PRIORITY)).strip())
    except ValueError:
        return DEFAULT_PRIORITY  # the device plugin would hand libvgpu a value atoi reads oddly; trust none


def count_resource(resources: frozenset[str], count: str | None = None) -> str:
    """The count resource (``--resource-name``, the device plugin's resourceName): ``count``, as
    configured. ``resources`` (``--resource-names``: the names a container asks NVIDIA GPUs with)
    tells it only for a caller that configured none: NVIDIA's default count (``nvidia.com/gpu``),
    or the one name of a set of one (the count is always among them). Before, it was guessed
    among ``resources``: with every name configured otherwise (the chart's resourceName,
    resourceMem, resourceMemPercentage and resourceCores all custom) none could be told, and
    naming any of them asked (found by review, 1 Dec)."""
    if count is not None:
        return count
    if NVIDIA_COUNT not in resources and len(resources) == 1:
        return next(iter(resources))
    return NVIDIA_COUNT


def _asks(c: Any, names: frozenset[str], count: str | None = None) -> bool:
    """Whether a V1Container asks for NVIDIA GPUs: its count (:func:`count_resource`, the
    configured ``count`` for the monitor) is above 0, the rule of the ledger and the device
    plugin, and what is given an entry (:func:`hami.core.ledger.asks_devices`). Before, naming any
    of ``names`` asked: an init container with ``nvidia.com/gpu: "0"`` or with
    ``nvidia.com/gpumem`` alone took the GPU container's entry (found by review, 1 Dec)."""
    res = getattr(c, "resources", None)
    limits, requests = getattr(res, "limits", None) or {}, getattr(res, "requests", None) or {}
    return asks_devices(limits, requests, count_resource(names, count))


def layout_shift(
    annotations: dict[str, str] | None,
    containers: Sequence[Any],
    inits: int,
    resources: frozenset[str],
    count: str | None = None,
) -> int:
    """How many init containers the pod's NVIDIA allocation skips: non-zero only for one HAMi wrote
    before it counted them (:func:`hami.core.ledger.init_offset`, asking: :func:`_asks`). 0 for a
    malformed annotation."""
    return allocation_layout(annotations, containers, inits, resources, count).shift


def allocation_layout(
    annotations: dict[str, str] | None,
    containers: Sequence[Any],
    inits: int,
    resources: frozenset[str],
    count: str | None = None,
) -> EntryLayout:
    """Which container each entry of the pod's NVIDIA allocation is for, by the scheduler's
    ledger's rule (:func:`hami.core.ledger.entry_layout`, asking: a count above 0, :func:`_asks`):
    HAMi's old layout without init containers, HAMi v2.10's
    entries of its GPU containers alone. Entries in order for a malformed annotation."""
    try:
        per_container = decode_pod_devices((annotations or {}).get(ALLOCATED, ""))
    except CodecError:
        return EntryLayout()
    return entry_layout(per_container, inits, [_asks(c, resources, count) for c in containers])


def container_grants(
    annotations: dict[str, str] | None,
    containers: Sequence[Any],
    priority_resource: str = PRIORITY_RESOURCE,
    inits: int = 0,
    resources: frozenset[str] = NVIDIA_RESOURCES,
    count: str | None = None,
) -> tuple[ContainerGrant, ...]:
    """Each container's grant (``containers``: init containers, then regular, the annotation's
    order; kubernetes_asyncio V1Container objects): the NVIDIA devices of
    ``hami.io/vgpu-devices-allocated`` plus the MIG instances (GPU and MIG UUIDs) of the MIG
    annotation, and the container's ``priority_resource`` limit. Containers given nothing have no
    grant; a malformed annotation gives none (the device plugin refused such a pod). ``inits``:
    how many of ``containers`` are init containers, to read an allocation HAMi wrote before it
    counted them past them, and HAMi v2.10's entries of its GPU containers alone on those
    containers, as the scheduler's ledger and the device plugin do (:func:`allocation_layout`:
    the GPU container's region was otherwise not exported, and the feedback loop skipped it or
    trusted another container's); ``resources``: the names a container asks NVIDIA GPUs with, and
    ``count`` the one of them that counts GPUs (``--resource-name``; :func:`count_resource`), above
    0 in the containers that ask, which tells those layouts apart."""
    try:
        per_container = decode_pod_devices((annotations or {}).get(ALLOCATED, ""))
        mig = decode_mig_allocations((annotations or {}).get(MIG_ANNOTATION, ""))
    except CodecError:
        return ()
    layout = allocation_layout(annotations, containers, inits, resources, count)
    if layout.moves:
        per_container = tuple(layout.place(per_container, tuple))
        mig = tuple(replace(e, container=layout.container(e.container)) for e in mig)
    out = []
    for i, c in enumerate(containers):
        devs = [d for d in (per_container[i] if i < len(per_container) else ()) if d.uuid]
        uuids = [d.uuid for d in devs]
        for e in mig:
            if e.container == i:
                uuids += [u for u in (e.gpu_uuid, e.mig_uuid) if u]
        if uuids:
            # the memory the grant names, exported as the limit (a MIG instance has none here: the
            # region's value stands for it)
            memory = tuple((d.uuid, d.usedmem) for d in devs)
            out.append(
                ContainerGrant(c.name, tuple(dict.fromkeys(uuids)), _priority(c, priority_resource), memory_mib=memory)
            )
    return tuple(out)


def pod_claims(pod: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``(ResourceClaim name, containers using it)`` for a pod (a kubernetes_asyncio V1Pod): the
    pod's claim entries resolve to claim names through ``status.resourceClaimStatuses`` (claims
    made from a template) or ``spec.resourceClaims[].resourceClaimName``."""
    spec, status = pod.spec, pod.status
    if spec is None:
        return ()
    actual = {e.name: e.resource_claim_name for e in (spec.resource_claims or ()) if e.resource_claim_name}
    for st in (status.resource_claim_statuses if status is not None else None) or ():
        if st.resource_claim_name:
            actual[st.name] = st.resource_claim_name
    users: dict[str, list[str]] = {}
    for c in list(spec.init_containers or []) + list(spec.containers or []):
        for ref in (c.resources.claims if c.resources is not None else None) or ():
            claim = actual.get(ref.name)
            if claim and c.name not in users.setdefault(claim, []):
                users[claim].append(c.name)
    return tuple((claim, tuple(names)) for claim, names in sorted(users.items()))


def finished_init_containers(pod: Any) -> frozenset[str]:
    """The pod's init containers that ran to their end and will not run again while the pod
    lives: terminated with exit code 0 (one that failed is run again, unless the pod fails with
    it), and not sidecars (``restartPolicy: Always``, which the kubelet restarts). None in a pod
    whose init containers the kubelet may run again
    (:func:`hami.core.ledger.init_containers_may_run_again`: the scheduler keeps their grants)."""
    spec, status = pod.spec, pod.status
    if spec is None or init_containers_may_run_again(_restart_view(spec)):
        return frozenset()
    sidecars = (
        {c.name for c in (spec.init_containers or []) if getattr(c, "restart_policy", None) == "Always"}
        if spec
        else set()
    )
    done = set()
    for cs in (status.init_container_statuses if status is not None else None) or ():
        state = cs.state
        ended = state.terminated if state is not None else None
        if ended is not None and getattr(ended, "exit_code", None) == 0 and cs.name not in sidecars:
            done.add(cs.name)
    return frozenset(done)


def _restart_view(spec: Any) -> dict:
    """The fields of a pod spec (a client model) :func:`init_containers_may_run_again` reads."""

    def ctr(c: Any) -> dict:
        return {"restartPolicy": c.restart_policy, "restartPolicyRules": c.restart_policy_rules}

    return {
        "restartPolicy": spec.restart_policy,
        "initContainers": [ctr(c) for c in spec.init_containers or ()],
        "containers": [ctr(c) for c in spec.containers or ()],
    }


async def api_client(kubeconfig: str | None) -> Any:
    from kubernetes_asyncio import client, config

    if kubeconfig:
        return await config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


async def node_pods(
    api: Any,
    node: str,
    priority_resource: str = PRIORITY_RESOURCE,
    resources: frozenset[str] = NVIDIA_RESOURCES,
    count: str | None = None,
) -> dict[str, PodRef]:
    """Every pod with ``spec.nodeName == node`` that can still run, by UID: a pod in a
    :data:`FINISHED` phase is left out, so its series go and its directories are swept (a process
    killed with it leaves its slot behind, which showed as memory in use for as long as the pod
    object lived). Raises ApiException on failure, asyncio.TimeoutError when a page is not in
    within :data:`API_TIMEOUT_S`.

    The first list of a node is a consistent one (paged); each later one asks for pods not older
    than the last list (``resourceVersion``, ``resourceVersionMatch=NotOlderThan``, no ``limit``),
    which the API server answers from its watch cache (by its node index). A consistent list
    with a limit is read from etcd up to Kubernetes v1.31, a scan of every pod of the cluster for
    the node's few: every GPU node every 5 s was ~20 such scans a second with 100 nodes, and the
    API server's fairness answered other clients 429 (found by review, 1 Dec). A list never goes
    back behind one already taken, so a pod seen once is not missed by a later round. Answered 410
    or "too large" (an etcd restore put the store behind that version), it is asked again at once,
    consistently. ``resources`` and ``count``: as :func:`container_grants` reads them."""
    since = _LISTED.get(node)
    rounds = _SINCE_CONSISTENT.get(node, 0) + 1
    if rounds >= CONSISTENT_EVERY:
        since = None
    _SINCE_CONSISTENT[node] = 0 if since is None else rounds
    try:
        out, version = await _list_node_pods(api, node, since, priority_resource, resources, count)
    except Exception as exc:
        if since is None or getattr(exc, "status", None) not in (410, 504):
            raise
        _LISTED.pop(node, None)
        out, version = await _list_node_pods(api, node, None, priority_resource, resources, count)
    if version:
        _LISTED[node] = version
    else:
        _LISTED.pop(node, None)
    return out


async def _list_node_pods(
    api: Any,
    node: str,
    since: str | None,
    priority_resource: str,
    resources: frozenset[str],
    count: str | None = None,
) -> tuple[dict[str, PodRef], str | None]:
    """The node's pods (as :func:`node_pods`) and the list's resourceVersion: not older than
    ``since``, one answer from the watch cache; ``since`` None: a consistent list, paged."""
    from kubernetes_asyncio import client

    core = client.CoreV1Api(api)
    out: dict[str, PodRef] = {}
    token = None
    while True:
        kwargs: dict[str, Any] = {"field_selector": f"spec.nodeName={node}", "_request_timeout": API_TIMEOUT_S}
        if token:
            kwargs.update(limit=500, _continue=token)  # (a next page: its token holds the version)
        elif since is None:
            kwargs["limit"] = 500
        else:
            # the watch cache answers a list with a version only without a limit (before v1.33)
            kwargs.update(resource_version=since, resource_version_match="NotOlderThan")
        page = await core.list_pod_for_all_namespaces(**kwargs)
        for pod in page.items:
            meta = pod.metadata
            if pod.status is not None and pod.status.phase in FINISHED:
                continue
            if meta.uid:
                spec = pod.spec
                containers = list(spec.init_containers or []) + list(spec.containers or []) if spec else []
                names = [c.name for c in containers]
                inits = len(spec.init_containers or []) if spec else 0
                out[meta.uid] = PodRef(
                    meta.namespace or "",
                    meta.name or "",
                    meta.uid,
                    mig_devices(
                        meta.annotations,
                        names,
                        allocation_layout(meta.annotations, containers, inits, resources, count),
                    ),
                    pod_claims(pod),
                    container_grants(
                        meta.annotations,
                        containers,
                        priority_resource,
                        inits,
                        resources,
                        count,
                    ),
                    finished_init_containers(pod),
                )
        token = page.metadata._continue if page.metadata else None
        if not token:
            return out, (page.metadata.resource_version if page.metadata else None)
