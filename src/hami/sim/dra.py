"""The simulation on the DRA front end (``hami simulate --front-end dra``; pure, no I/O).

Nodes become the ResourceSlices the node agent would publish (:func:`hami.dra.model.device` per
registered NVIDIA GPU: memory = the registered ``devmem``, cores = ``devcore``, shares = the split
count ``count``; unhealthy and MIG-mode GPUs left out), or are given as ResourceSlice documents of
the driver. Each pod goes through the webhook's admission on the DRA front end
(:func:`hami.webhook.admission.decide` with ``front_end="dra"``, which calls
:func:`hami.dra.translate.translate`), and its claims are allocated the way kube-scheduler's
allocator does (:func:`hami.dra.fit.allocate_claims`: all unallocated claims of a pod on one node
in one search, devices in slice order, distinct devices within a request, CEL selectors
(:mod:`hami.dra.cel`), backtracking into earlier claims; the first placement found wins). A
selector that fails on a device leaves the pod pending, as kube-scheduler's error does. Nodes
given as Node documents are filtered first as kube-scheduler filters them (cordon, taints, node
affinity: :mod:`hami.core.nodefit`); one known by its ResourceSlice alone is not. Among the nodes
where every claim fits, the node is picked by the default ``NodeResourcesFit`` score (least
requested CPU and memory, with kube-scheduler's defaults of 100m / 200Mi for a container that
requests none); ties, which kube-scheduler breaks at random, go to the node that comes first in
the input.

Pods may also name their own claims: ResourceClaim and ResourceClaimTemplate documents in the pods
file (before the pod) are read as kube-controller-manager and kube-scheduler would (a claim from a
template is named ``<pod>-<entry>``; a ResourceClaim shared by several pods is allocated once and
keeps its pods on its node; one that already has ``status.allocation`` counts as allocated).

Namespace quotas apply as on the live DRA front end (docs/dra.md, "Seeing and accounting DRA
allocations"): ResourceQuota documents from their place on, claims counting from their creation
(what they hold once allocated, what they ask before) and every live extender grant from the
start, the webhook's pod check given that room (for a pod being created:
:func:`hami.sim.engine.created_by_file`), and the claim check
(:func:`hami.webhook.admission.decide_claim`) on each claim made from a template.
kube-scheduler's NodeResourcesFit (cpu, memory, pods) filters the nodes given as Node documents
with ``status.allocatable`` (:class:`hami.sim.engine.NodeResources`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Mapping, Sequence

from hami.core import (
    CoreError,
    Ledger,
    SchedulerConfig,
    read_node_devices,
    pod_key,
    pod_request,
)
from hami.core.fit import QuotaRoom
from hami.core.grants import read_grants, running_on
from hami.core.quantity import QuantityError, parse_quantity
from hami.core.requests import ordered_containers, pod_name
from hami.core.shape import POD, QUOTA
from hami.core.types import ContainerDevice, ContainerKind, DeviceInfo, NodeDevices, PodAllocation
from hami.core.names import DRA_SHARE_CLASS, VGPU_NODE
from hami.core.usage import collapse
from hami.dra import fit
from hami.dra.claims import ClaimError, claim_ask, class_sizes, gpu_index, slice_devices
from hami.dra.explain import gated_reason, scheduling_gates
from hami.dra.model import (
    CORDON_TAINT_KEY,
    CORES,
    DRIVER,
    MEMORY,
    MIB,
    SHARES,
    SliceSettings,
    cordon_taint,
    cordoned_gpus,
    cores_policy,
    device,
    resource_slice,
)

from .engine import (
    DEFAULT_SCHEDULER,
    RECREATE,
    Names,
    NodeResources,
    PodOutcome,
    SimResult,
    SimulationError,
    Uids,
    bound_node,
    check_document,
    created_by_file,
    check_pod_resources,
    file_uids,
    finished,
    flatten_objects,
    node_allocatable,
    object_name,
    pod_ref,
    pod_resources,
)
from hami.core.nodefit import NODE_FIELDS, POD_FIELDS, NodeFacts, NodeFitError, filter_nodes, node_facts, pod_asks

DEFAULT_CPU_MILLI = 100  # kube-scheduler's non-zero default request (scoring only)
DEFAULT_MEMORY = 200 * MIB


@dataclass(frozen=True)
class DraOptions:
    """What the node agent would be started with (``hami dra --default-cores / --min-memory``)."""

    default_cores: int = 0
    min_memory_mib: int = 1
    device_class: str = DRA_SHARE_CLASS  # the webhook's --dra-device-class
    scheduler_name: str = DEFAULT_SCHEDULER  # the webhook's --scheduler-name

    def __post_init__(self) -> None:
        if isinstance(self.default_cores, bool) or not isinstance(self.default_cores, int) or self.default_cores < 0:
            raise ValueError(f"--default-cores must be an integer >= 0, got {self.default_cores!r}")
        if isinstance(self.min_memory_mib, bool) or not isinstance(self.min_memory_mib, int) or self.min_memory_mib < 1:
            raise ValueError(f"--min-memory must be an integer >= 1 (MiB), got {self.min_memory_mib!r}")


@dataclass
class _Node:
    name: str
    devices: list[fit.DeviceUse]
    cpu_milli: int = 0  # allocatable; 0 = unknown
    memory: int = 0
    requested: list[int] = field(default_factory=lambda: [0, 0])
    filters: NodeFacts | None = None  # its Node's labels, taints, cordon (None: known by its slices alone)

    def score(self, pod: tuple[int, int]) -> int:
        parts = []
        for have, used, add in ((self.cpu_milli, self.requested[0], pod[0]), (self.memory, self.requested[1], pod[1])):
            parts.append(0 if have <= 0 or used + add > have else (have - used - add) * 100 // have)
        return sum(parts) // 2


@dataclass
class _Claim:
    namespace: str
    name: str
    requests: list[fit.Request]
    constraints: list[dict]
    picks: list[fit.Pick] | None = None  # allocated: the picks; None: not yet
    node: str | None = None
    users: set[str] = field(default_factory=set)  # pod keys
    from_template: bool = False
    spec: Mapping[str, Any] = field(default_factory=dict)  # its spec (what it asks of a quota)
    #: kube-scheduler's special claim for a pod's extended resources (KEP-5004): its devices are
    #: the pod's ``nvidia.com/gpu``, already counted on the pod (no GPU count of its own)
    extended: bool = False

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def _gpu_device(d: Any, opts: DraOptions) -> dict:
    """The slice device the node agent would publish for a registered GPU."""

    class _Gpu:  # the GpuLike the model reads
        index, uuid, model, memory_mib, numa = d.index, d.id, d.type or "unknown", d.devmem, d.numa

    s = SliceSettings(split_count=d.count, default_cores=opts.default_cores, min_memory_mib=opts.min_memory_mib)
    out = device(_Gpu, s)
    # devcore is already 100 x deviceCoreScaling
    out["capacity"][CORES] = {"value": str(d.devcore), "requestPolicy": cores_policy(d.devcore, opts.default_cores)}
    return out


def _cordon(slice_doc: dict, cordoned: frozenset[str]) -> dict:
    """``slice_doc`` with the cordon taint on the devices of the GPUs in ``cordoned`` (UUIDs, the
    Node's ``hami.io/device-cordon``), as the node agent publishes them."""
    if not cordoned:
        return slice_doc
    devices = []
    for d in (slice_doc.get("spec") or {}).get("devices") or ():
        attrs = d.get("attributes") or {}
        uuid = (attrs.get("parentUUID") or attrs.get("uuid") or {}).get("string")  # a MIG device: its GPU's
        taints = list(d.get("taints") or ())
        if uuid in cordoned and not any((t or {}).get("key") == CORDON_TAINT_KEY for t in taints):
            d = {**d, "taints": [*taints, cordon_taint()]}
        devices.append(d)
    return {**slice_doc, "spec": {**slice_doc["spec"], "devices": devices}}


def cordoned(d: fit.DeviceUse) -> bool:
    """Whether the device carries the cordon taint (its GPU is in its Node's ``hami.io/device-cordon``)."""
    return any(isinstance(t, Mapping) and t.get("key") == CORDON_TAINT_KEY for t in (d.doc or {}).get("taints") or ())


def _node_slice(obj: Mapping[str, Any], config: SchedulerConfig, opts: DraOptions, warnings: list[str]) -> dict | None:
    name = (obj.get("metadata") or {}).get("name") or "?"
    try:
        nd, dropped = read_node_devices(obj, config.vendors)
    except CoreError as exc:
        warnings.append(f"skipping node {name}: {exc}")
        return None
    if dropped and not nd.devices:
        warnings.append(f"skipping node {name}: {'; '.join(dropped.values())}")
        return None
    for vendor, why in dropped.items():
        warnings.append(f"skipping the {vendor} devices of node {name}: {why}")
    devices, other = [], 0
    for d in nd.devices:
        if d.vendor != "NVIDIA":
            other += 1
        elif not d.health:
            warnings.append(f"node {name}: {d.id} is unhealthy: left out of the slice")
        elif d.sliced:
            warnings.append(f"node {name}: {d.id} is in MIG mode: the DRA front end publishes no MIG instances")
        else:
            try:
                devices.append(_gpu_device(d, opts))
            except ValueError as exc:
                warnings.append(f"node {name}: {d.id} left out: {exc}")
    if other:
        warnings.append(f"node {name}: {other} non-NVIDIA device(s) are not published by the DRA driver")
    if not devices:
        return None
    out = resource_slice(name, [], SliceSettings())
    out["spec"]["devices"] = devices
    return out


@dataclass
class _Cluster:
    """What the nodes file gives the DRA front end."""

    nodes: dict[str, _Node]
    warnings: list[str]
    allocatable: dict[str, dict[str, int]]  # Node -> its status.allocatable's cpu, memory, pods
    sizes: dict[str, int]  # device class -> the MiB of its largest device (a claim's quota ask)


def load_nodes(node_docs: Iterable[Any], config: SchedulerConfig, opts: DraOptions, source: str = "nodes") -> _Cluster:
    """Nodes (registration annotations) and ResourceSlice documents -> each node's devices."""
    warnings: list[str] = []
    slices: list[tuple[dict, bool]] = []  # (slice, made from a Node's registration)
    facts: dict[str, tuple[int, int]] = {}
    allocatable: dict[str, dict[str, int]] = {}
    filters: dict[str, NodeFacts] = {}
    cordons: dict[str, frozenset[str]] = {}  # node -> its hami.io/device-cordon
    names = Names(source)
    for label, obj in flatten_objects(node_docs, source):
        kind = obj.get("kind") or "Node"
        name = (obj.get("metadata") or {}).get("name") or "?"
        if kind == "ResourceSlice":
            check_document(obj, fit.SLICE, source, label)
            spec = obj.get("spec") or {}
            if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER:
                warnings.append(f"{source}: skipping ResourceSlice {name}: driver is not {DRIVER}")
                continue
            if not spec.get("nodeName") or not isinstance(spec.get("devices") or [], list):
                raise SimulationError(f"{source}: ResourceSlice {name}: spec.nodeName and spec.devices are needed")
            slices.append((obj, False))
        elif kind == "Node":
            name = object_name(obj, source, label)
            names.add(name, obj, label)
            check_document(obj, NODE_FIELDS, source, label)
            filters[name] = node_facts(obj)
            allocatable[name] = node_allocatable(obj, source, label)
            facts[name] = (allocatable[name].get("cpu", 0), allocatable[name].get("memory", 0))
            cordons[name] = cordoned_gpus(obj)
            made = _node_slice(obj, config, opts, warnings)
            if made is not None:
                slices.append((made, True))
        else:
            warnings.append(f"{source}: skipping {kind} {name}: not a Node or ResourceSlice")
    given = {s["spec"]["nodeName"] for s, made in slices if not made}
    nodes: dict[str, _Node] = {}
    seen: set[tuple[str, str]] = set()
    used: list[dict] = []  # the slices read, for their pools' shared counters (KEP-4815)
    for s, made in slices:
        node = s["spec"]["nodeName"]
        if node in given and made:
            warnings.append(
                f"{source}: node {node}: its ResourceSlice is given, the registration annotation is not used"
            )
            continue
        pool = ((s["spec"].get("pool") or {}).get("name")) or node
        s = _cordon({**s, "spec": {**s["spec"], "pool": {"name": pool}}}, cordons.get(node, frozenset()))
        n = nodes.setdefault(node, _Node(node, [], *facts.get(node, (0, 0)), filters=filters.get(node)))
        used.append(s)
        for d in fit.devices_of([s]).values():
            if d.key in seen:
                warnings.append(f"{source}: device {d.pool}/{d.device} is published twice: the first one is used")
                continue
            seen.add(d.key)
            n.devices.append(d)
    books = fit.pool_counters(used)  # a device and the counters it consumes may be in two slices of its pool
    for n in nodes.values():
        for d in n.devices:
            if d.consumes:
                d.counters = books.setdefault(d.pool, fit.Counters())
    if not nodes:
        first = f": {warnings[0]}" if warnings else ""
        raise SimulationError(
            f"{source}: no node with a gpu.hami.io GPU (a Node needs an NVIDIA registration "
            f"annotation, or give ResourceSlices of {DRIVER}){first}"
        )
    return _Cluster(nodes, warnings, allocatable, class_sizes(slice_devices(used).values()))


def _pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU millicores, memory bytes) as kube-scheduler's scoring counts them (non-zero defaults)."""
    cpu = mem = 0
    for c in (pod.get("spec") or {}).get("containers") or ():
        res = (c.get("resources") or {}) if isinstance(c, Mapping) else {}
        req = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for key, scale, default in (("cpu", 1000, DEFAULT_CPU_MILLI), ("memory", 1, DEFAULT_MEMORY)):
            try:
                value = int(parse_quantity(req[key], key) * scale) if key in req else 0
            except QuantityError:
                value = 0
            if key == "cpu":
                cpu += value or default
            else:
                mem += value or default
    return cpu, mem


class _State:
    def __init__(
        self,
        nodes: dict[str, _Node],
        config: SchedulerConfig,
        opts: DraOptions,
        sizes: Mapping[str, int] | None = None,
        source: str = "pods",
    ) -> None:
        from hami.webhook.admission import AdmissionSettings

        self.nodes, self.config, self.opts = nodes, config, opts
        self.warnings: list[str] = []
        self.admission = AdmissionSettings(
            config.vendors, scheduler_name=opts.scheduler_name, front_end="dra", dra_device_class=opts.device_class
        )
        #: namespace quotas and what counts against them, as in the scheduler's ledger: claims (what
        #: each holds once allocated, what it asks before) and pods' extender grants
        self.quota = Ledger(config.vendors)
        #: the ResourceQuota documents as given ("ns/name" -> document) and the devices each claim
        #: holds or asks ("ns/name" -> count): the GPU count quota's room (:meth:`gpu_room`)
        self.quota_docs: dict[str, Mapping[str, Any]] = {}
        self.claim_counts: dict[str, int] = {}
        self.sizes = dict(sizes or {})  # device class -> the MiB a claim without a memory amount counts
        self.made: dict[str, list[str]] = {}  # pod key -> the claims made for it from templates
        self.resources = NodeResources({})  # kube-scheduler's NodeResourcesFit (cpu, memory, pods)
        self.uids = Uids(source)
        #: namespace/name -> "namespace/name on node": said in one warning at the end (keyed, so
        #: that a pod deleted or given again later in the file is not counted, or not twice)
        self.extender_held: dict[str, str] = {}
        #: namespace/name -> the key of the extender grant its first document holds, counted in the
        #: quota from the start (:func:`_grants_from_the_start`) until the loop reaches that document
        self.early: dict[str, str] = {}
        self.by_key = {d.key: d for n in nodes.values() for d in n.devices}
        self.templates: dict[tuple[str, str], dict] = {}
        self.claims: dict[tuple[str, str], _Claim] = {}
        self.pods: dict[str, tuple[list[_Claim], str | None, tuple[int, int]]] = {}  # key -> claims, node, requests

    # -------------------------------------------------------------- claims and templates
    def add_template(self, obj: Mapping[str, Any], source: str) -> None:
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace") or "default", meta.get("name") or ""
        spec = ((obj.get("spec") or {}).get("spec")) or {}
        try:
            fit.claim_spec_requests(spec, f"ResourceClaimTemplate {ns}/{name} spec.spec")
        except fit.ClaimError as exc:
            raise SimulationError(f"{source}: {exc}") from None
        self.templates[(ns, name)] = spec

    def add_claim(self, obj: Mapping[str, Any], source: str) -> None:
        from hami.webhook.admission import extended_resource_claim

        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace") or "default", meta.get("name") or ""
        claim = self._claim(ns, name, obj.get("spec") or {}, f"ResourceClaim {ns}/{name} spec", source)
        claim.extended = extended_resource_claim(obj)
        results = fit.allocation_results(obj)
        if results:
            picks = []
            for r in results:
                dev = self.by_key.get((r.get("pool", ""), r.get("device", "")))
                if dev is None:
                    raise SimulationError(
                        f"{source}: ResourceClaim {ns}/{name}: status.allocation names "
                        f"{r.get('pool')}/{r.get('device')}, which no node publishes"
                    )
                consumed = r.get("consumedCapacity") or {}
                picks.append(
                    fit.Pick(
                        r.get("request", ""),
                        dev,
                        {k: fit.amount(consumed[k], k) if k in consumed else dev.total[k] for k in fit.CAPACITIES},
                    )
                )
            fit.commit(picks, claim.ref)
            claim.picks, claim.node = picks, self._node_of(picks[0].device)
        self.claims[(ns, name)] = claim
        self._count(claim, source)

    def _claim(self, ns: str, name: str, spec: Mapping[str, Any], where: str, source: str) -> _Claim:
        try:
            requests, constraints = fit.claim_spec_requests(spec, where)
        except fit.ClaimError as exc:
            raise SimulationError(f"{source}: {exc}") from None
        return _Claim(ns, name, requests, constraints, spec=spec)

    # -------------------------------------------------------------- namespace quotas
    def room(self, namespace: str, vendors: Sequence[Any]) -> QuotaRoom | None:
        """The quota room the webhook sees (``ClusterState.pod_room``): what the namespace's quotas
        leave after the claims and extender grants counted so far, with the claim sizes."""
        room = self.quota.quota_room(namespace, vendors)
        return None if room is None else replace(room, claim_sizes=self.sizes)

    def gpu_room(self, namespace: str) -> int | None:
        """The GPUs ``namespace`` may still be given under its quotas' GPU count limits (the
        configured count resource, ``nvidia.com/gpu`` unless renamed), as the scheduler's state
        gives the webhook (``ClusterState.gpu_count_room``)."""
        from hami.webhook.admission import gpu_count_room

        nvidia = self.admission.nvidia
        resource = (nvidia.resources.count if nvidia is not None else "") or "nvidia.com/gpu"
        prefix = namespace + "/"
        held = sum(n for ref, n in self.claim_counts.items() if ref.startswith(prefix))
        docs = [d for ref, d in self.quota_docs.items() if ref.startswith(prefix)]
        return gpu_count_room(docs, namespace, resource, held)

    def _count(self, claim: _Claim, source: str) -> None:
        """A claim counts against its namespace's quota as the scheduler counts it: what it holds
        once allocated (memory rounded up to MiB; admin-access results count nothing), what it
        asks until then (:func:`hami.dra.claims.claim_ask`)."""
        self.claim_counts.pop(claim.ref, None)
        if claim.picks is not None:
            held = [p for p in claim.picks if not p.admin]
            if held and not claim.extended:
                self.claim_counts[claim.ref] = len(held)
            mem = sum(-(-p.consumed[MEMORY] // MIB) for p in held)
            cores = sum(fit.whole(p.consumed[CORES]) for p in held)
        else:
            try:
                ask = claim_ask({"spec": claim.spec}, sizes=self.sizes)
                from hami.webhook.admission import claim_devices

                devices, _ = claim_devices({"spec": claim.spec})
            except (ClaimError, CoreError) as exc:
                raise SimulationError(f"{source}: ResourceClaim {claim.ref}: {exc}") from None
            if devices and not claim.extended:
                self.claim_counts[claim.ref] = devices
            if ask is None or ask.unbounded:
                self.quota.remove_claim(claim.ref)
                return
            mem, cores = ask.memory_mib, ask.cores
        self.quota.set_claim(claim.ref, claim.namespace, "NVIDIA", int(mem), int(cores))

    def _make(self, out: PodOutcome, key: str, claims: Mapping[str, _Claim], source: str) -> bool:
        """kube-controller-manager makes the pod's claims from their templates, each one through
        the webhook's claim check (its namespace's quota: :func:`hami.webhook.admission.decide_claim`);
        False, with the reason in ``out``, when the check refuses one (the pod waits for it)."""
        from hami.webhook.admission import decide_claim

        made = self.made.setdefault(key, [])
        for c in claims.values():
            if not c.from_template or c.ref in made:
                continue
            claim = {"kind": "ResourceClaim", "metadata": {"namespace": c.namespace, "name": c.name}, "spec": c.spec}
            decision = decide_claim(claim, self.admission, self.room, gpu_room=self.gpu_room)
            if not decision.allowed:
                out.reasons = {"*": f"creating its claim {c.ref} failed: the webhook refused it: {decision.message}"}
                return False
            made.append(c.ref)
            self._count(c, source)
        return True

    def _node_of(self, dev: fit.DeviceUse) -> str:
        return next(n.name for n in self.nodes.values() if any(d is dev for d in n.devices))

    # -------------------------------------------------------------- pods
    def delete(self, key: str, source: str = "pods") -> bool:
        for ref in self.made.pop(key, ()):  # the claims made from templates go with their pod
            self.quota.remove_claim(ref)
            self.claim_counts.pop(ref, None)
        self.quota.remove_pod(key)  # (an extender grant)
        self.uids.release(key)
        held = self.pods.pop(key, None)
        if held is None:
            return False
        claims, node, req = held
        if node is not None:
            n = self.nodes[node]
            n.requested = [n.requested[0] - req[0], n.requested[1] - req[1]]
        for c in claims:
            c.users.discard(key)
            if not c.users and c.picks is not None:
                fit.release(c.picks, c.ref)  # the claim controller deallocates a claim no pod uses
                c.picks, c.node = None, None
                if not c.from_template:  # it stays, asking again
                    self._count(c, source)
            if c.from_template:
                self.claims.pop((c.namespace, c.name), None)
        return True

    def place(
        self, pod: dict, source: str, label: str = "", requests: Mapping[str, int] | None = None
    ) -> tuple[PodOutcome, dict]:
        """One pod: admission as the webhook does it, then its claims placed (or why not).
        ``requests``: its cpu and memory (kube-scheduler's NodeResourcesFit)."""
        meta = pod.get("metadata") or {}
        out = PodOutcome(namespace=meta.get("namespace") or "default", name=meta.get("name") or "", status="pending")
        admitted = self._admit(pod, out, source, label)
        if admitted is None:
            return out, pod
        refs = (admitted.get("spec") or {}).get("resourceClaims") or []
        vendors = pod_request(admitted, self.config.vendors).vendors()
        others = [v for v in vendors if v != "NVIDIA"]
        if others:
            out.reasons = {
                "*": f"{', '.join(sorted(others))} devices are placed by the extender, not on the DRA "
                "front end (simulate with --front-end extender)"
            }
            return out, admitted
        if "NVIDIA" in vendors:  # the webhook's scheduler-name gate let it through untranslated
            name = (admitted.get("spec") or {}).get("schedulerName")
            out.reasons = {
                "*": f"its NVIDIA requests were not turned into claims: the webhook leaves pods of "
                f"scheduler {name!r} alone, and on the DRA path no node advertises them as "
                "extended resources (KEP-5004's mapping aside)"
            }
            return out, admitted
        if not refs:
            out.status = "no-devices"
            out.containers = [
                {"name": c.get("name") or str(i), "devices": []}
                for i, (c, _) in enumerate(ordered_containers(admitted))
            ]
            return out, admitted
        claims = self._pod_claims(out, refs, source)
        if claims is None:
            return out, admitted
        key = pod_key(admitted)
        if not self._make(out, key, claims, source):
            return out, admitted
        node, picks = self._choose(out, admitted, claims, requests)
        if node is None:
            return out, admitted
        for c in claims.values():
            if c.picks is None:
                c.picks, c.node = picks[c.ref], node
                fit.commit(c.picks, c.ref)
                self._count(c, source)
            c.users.add(key)
            if c.from_template:
                self.claims[(c.namespace, c.name)] = c
        req = _pod_requests(admitted)
        n = self.nodes[node]
        n.requested = [n.requested[0] + req[0], n.requested[1] + req[1]]
        self.pods[key] = (list(claims.values()), node, req)
        out.status, out.node, out.reasons = "scheduled", node, {}
        out.containers = _containers(admitted, claims)
        return out, admitted

    def _admit(self, pod: dict, out: PodOutcome, source: str, label: str = "") -> dict | None:
        """The webhook's decision on the DRA front end: the mutated pod (its templates recorded),
        or None with ``out`` saying why (already placed by the extender, or denied)."""
        from hami.webhook.admission import decide

        ns = out.namespace
        existing, errors = read_grants(pod, self.config.vendors)
        if errors:  # read as the scheduler's cache reads it (hami.core.grants)
            self.warnings.append(
                f"{source}: {'; '.join(errors.values())}; on the DRA front end no extender grant, readable or "
                "not, counts on the GPUs (kube-scheduler's allocator does not see it): "
                f"{'its readable grants count against its namespace quota only' if existing else 'it holds nothing here'}"
            )
            if existing is None:
                out.status = "pre-placed"
                out.node = ((pod.get("metadata") or {}).get("annotations") or {}).get(VGPU_NODE) or bound_node(pod)
                return None
        if existing is not None:  # placed by the extender before: running, unseen by kube-scheduler's allocator
            out.status, out.node = "pre-placed", existing.node
            self.extender_held[f"{ns}/{out.name}"] = f"{ns}/{out.name} on {existing.node}"
            if self.early.pop(f"{ns}/{out.name}", None) is None:  # (a first document's counts from the start)
                self.uids.hold(existing.key, pod, label)
                self.quota.add_pod(existing)  # its grant counts against its namespace's quota, as in the scheduler
            return None
        # the quota is the webhook's check of a pod being created: a pod the cluster has already
        # (a dump's pending pod) passed it then; its claims' own check still applies (_make)
        new = created_by_file(pod)
        decision = decide(
            pod, self.admission, quota_room=self.room if new else None, gpu_room=self.gpu_room if new else None
        )
        if not decision.allowed:
            out.status, out.reasons = "denied", {"webhook": decision.message}
            return None
        for t in decision.templates:  # the API server validates what the webhook creates
            try:
                fit.claim_spec_requests(t["spec"]["spec"], f"ResourceClaimTemplate {t['metadata']['name']} spec.spec")
            except fit.ClaimError as exc:
                out.status, out.reasons = "denied", {"webhook": f"creating the claim template failed: {exc}"}
                return None
        admitted = decision.pod or pod
        for t in decision.templates:
            self.templates[(ns, t["metadata"]["name"])] = t["spec"]["spec"]
        return admitted

    def _pod_claims(self, out: PodOutcome, refs: list, source: str) -> dict[str, _Claim] | None:
        """The pod's claims by entry name (a claim from a template made now), or None with ``out``
        saying which claim or template is missing."""
        ns, claims = out.namespace, {}
        for ref in refs:
            entry = ref.get("name") or ""
            if ref.get("resourceClaimName"):
                c = self.claims.get((ns, ref["resourceClaimName"]))
                if c is None:
                    out.reasons = {
                        "*": f"ResourceClaim {ns}/{ref['resourceClaimName']} not found "
                        "(put it in the pods file before the pod)"
                    }
                    return None
            else:
                tname = ref.get("resourceClaimTemplateName") or ""
                spec = self.templates.get((ns, tname))
                if spec is None:
                    out.reasons = {
                        "*": f"ResourceClaimTemplate {ns}/{tname} not found (put it in the pods file before the pod)"
                    }
                    return None
                c = self._claim(
                    ns, f"{out.name}-{entry}", spec, f"ResourceClaimTemplate {ns}/{tname} spec.spec", source
                )
                c.from_template = True
            claims[entry] = c
        return claims

    def _choose(
        self, out: PodOutcome, pod: dict, claims: dict[str, _Claim], requests: Mapping[str, int] | None = None
    ) -> tuple[str | None, dict]:
        """The node for the pod and the picks of its unallocated claims there; (None, {}) with the
        reasons per node in ``out`` when no node takes them all. A gated pod (``spec.schedulingGates``)
        is none of kube-scheduler's business yet: pending, nothing allocated. Nodes are filtered
        as kube-scheduler filters them first (its node filters; NodeResourcesFit for a pod not
        bound already)."""
        if gates := scheduling_gates(pod):
            out.reasons = {"*": gated_reason(gates)}
            return None, {}
        candidates = list(self.nodes)
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound:
            candidates = [n for n in candidates if n == bound]
        for c in claims.values():
            if c.node is not None:
                candidates = [n for n in candidates if n == c.node]
        if not candidates:
            held = sorted({c.node for c in claims.values() if c.node})
            why = [f"bound to node {bound}"] if bound else []
            why += [f"its claims are allocated on {', '.join(held)}"] if held else []
            out.reasons = {
                "*": f"no candidate node: {' and '.join(why)}, which publishes no gpu.hami.io GPU"
                if len(why) == 1
                else f"no candidate node: {' and '.join(why)}"
            }
            return None, {}
        fits: dict[str, dict[str, list[fit.Pick]]] = {}
        failed = []  # nodes where a selector failed: kube-scheduler's Filter returns an error there
        # kube-scheduler's node filters (cordon, taints, node affinity) run before the DRA plugin's;
        # a node known by its ResourceSlice alone is not filtered (its labels and taints are not given)
        known = [f for f in (self.nodes[n].filters for n in candidates) if f is not None]
        refused = filter_nodes(pod_asks(pod), known)
        if not bound:
            among = set(candidates)
            more = self.resources.refusals(requests, refused)
            refused.update((n, why) for n, why in more.items() if n in among)
        for name in candidates:
            if name in refused:
                out.reasons[name] = refused[name]
                continue
            got = self._try(self.nodes[name], list({id(c): c for c in claims.values() if c.picks is None}.values()))
            if isinstance(got, tuple):
                out.reasons[name], _ = got
                failed.append(name)
            elif isinstance(got, str):
                out.reasons[name] = got
            else:
                fits[name] = got
        if failed:
            # an error from one node's Filter aborts the pod's scheduling attempt on every node
            # (the scheduler retries it later, with the same result while nothing changes)
            for name in fits:
                out.reasons[name] = (
                    f"the claims fit, but kube-scheduler stops scheduling the pod on the CEL runtime error on {failed[0]}"
                )
            return None, {}
        if not fits:
            return None, {}
        req = _pod_requests(pod)
        node = max(fits, key=lambda n: (self.nodes[n].score(req), -candidates.index(n)))
        return node, fits[node]

    def _try(self, node: _Node, claims: list[_Claim]) -> dict[str, list[fit.Pick]] | str | tuple[str, bool]:
        """Allocate the pod's unallocated claims on one node in one search (:func:`hami.dra.fit.
        allocate_claims`: a later claim that does not fit sends it back into the earlier ones);
        nothing is committed. The picks per claim, or why not (naming the claim), or ``(why,
        True)`` when a CEL selector failed on a device the search reached."""
        asks = [fit.ClaimAsk(c.name, c.requests, c.constraints) for c in claims]
        found = fit.allocate_claims(node.devices, asks)
        if found.error:
            return fit.why_not_claims(node.devices, asks, found), True
        if found.picks is None:
            return fit.why_not_claims(node.devices, asks, found)
        return {c.ref: picks for c, picks in zip(claims, found.picks)}

    def claim_rows(self) -> list[dict]:
        rows = []
        for c in self.claims.values():
            rows.append(
                {
                    "namespace": c.namespace,
                    "name": c.name,
                    "node": c.node,
                    "pods": sorted(c.users),
                    "results": [p.result() for p in c.picks or ()],
                }
            )
        return rows

    def device_rows(self) -> list[dict]:
        rows = []
        for n in self.nodes.values():
            for d in n.devices:
                rows.append(
                    {
                        "node": n.name,
                        "device": d.device,
                        "uuid": d.uuid,
                        "index": _index(d),
                        "type": str(d.attributes.get(f"{DRIVER}/type") or ""),
                        "used": d.used[SHARES],
                        "count": d.total[SHARES],
                        "usedmem": -(-d.used[MEMORY] // MIB),
                        "totalmem": d.total[MEMORY] // MIB,
                        "usedcores": fit.whole(d.used[CORES]),
                        "totalcore": fit.whole(d.total[CORES]),
                        "health": True,
                        "cordoned": cordoned(d),
                        "claims": list(d.claims),
                    }
                )
        return rows


def to_ledger(state: _State, objects: Mapping[str, dict]) -> Ledger:
    """The DRA state seen through the core's ledger, for the web UI's page (``-o html``): each
    slice device as a registered GPU (slots = shares), each placed pod's claims as its grants.
    Every container's grant counts (a claim is held for the pod's life, init containers' too) and
    a ResourceClaim shared by several pods counts once, on its first pod, as on the device."""
    ledger = Ledger()
    for n in state.nodes.values():
        devs = tuple(
            DeviceInfo(
                id=d.uuid or f"{d.pool}/{d.device}",
                index=_index(d),
                count=d.total[SHARES],
                devmem=d.total[MEMORY] // MIB,
                devcore=fit.whole(d.total[CORES]),
                type=_type(d),
                mode="hami-core",
                health=True,
                vendor="NVIDIA",
                numa=_int_attr(d, "numa"),
            )
            for d in n.devices
        )
        gone = frozenset(d.uuid or f"{d.pool}/{d.device}" for d in n.devices if cordoned(d))
        ledger.set_node(NodeDevices(n.name, devs, cordoned=gone))
    counted: set[str] = set()
    for key, (claims, node, _) in state.pods.items():
        pod = objects.get(key)
        if pod is None or node is None:
            continue
        by_entry = {ref.get("name"): c for ref, c in zip((pod.get("spec") or {}).get("resourceClaims") or (), claims)}
        per = []
        for c, _ in ordered_containers(pod):
            grants = []
            for ref in (c.get("resources") or {}).get("claims") or ():
                claim = by_entry.get(ref.get("name"))
                if claim is None or claim.ref in counted:
                    continue
                counted.add(claim.ref)
                grants += [
                    ContainerDevice(
                        p.device.uuid or f"{p.device.pool}/{p.device.device}",
                        "NVIDIA",
                        -(-p.consumed[MEMORY] // MIB),
                        fit.whole(p.consumed[CORES]),
                        _index(p.device),
                    )
                    for p in claim.picks or ()
                ]
            per.append(tuple(grants))
        devices = {"NVIDIA": tuple(per)}
        kinds = tuple(ContainerKind.APP for _ in per)
        meta = pod.get("metadata") or {}
        ledger.add_pod(
            PodAllocation(
                key=key,
                namespace=meta.get("namespace") or "default",
                name=meta.get("name") or "",
                node=node,
                devices=devices,
                kinds=kinds,
                usage=collapse(devices, kinds),
            )
        )
    return ledger


def _int_attr(d: fit.DeviceUse, name: str) -> int:
    value = d.attributes.get(f"{DRIVER}/{name}")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _index(d: fit.DeviceUse) -> int:
    """As the scheduler's metrics and the UI number it (:func:`hami.dra.claims.gpu_index`)."""
    return gpu_index(d.device, d.attributes.get(f"{DRIVER}/index"))


def _type(d: fit.DeviceUse) -> str:
    return str(d.attributes.get(f"{DRIVER}/type") or "")


def _containers(pod: Mapping[str, Any], claims: Mapping[str, _Claim]) -> list[dict]:
    out = []
    for i, (c, _) in enumerate(ordered_containers(pod)):
        devs = []
        for ref in (c.get("resources") or {}).get("claims") or ():
            claim = claims.get(ref.get("name") or "")
            for p in (claim.picks or ()) if claim else ():
                if ref.get("request") and ref["request"] not in (p.request, p.request.partition("/")[0]):
                    continue
                devs.append(
                    {
                        "uuid": p.device.uuid,
                        "type": str(p.device.attributes.get(f"{DRIVER}/type") or ""),
                        "usedmem": -(-p.consumed[MEMORY] // MIB),
                        "usedcores": fit.whole(p.consumed[CORES]),
                        "device": f"{p.device.pool}/{p.device.device}",
                        "claim": claim.ref,
                    }
                )
        out.append({"name": c.get("name") or str(i), "devices": devs})
    return out


def _settled(pod: Mapping[str, Any]) -> PodOutcome:
    """A pod in phase Succeeded or Failed (``finished``: it holds nothing) or one being deleted
    that the file did not give before (``terminating``: its claims, given as ResourceClaims,
    stay allocated; it is not placed anew)."""
    meta = pod.get("metadata") or {}
    return PodOutcome(
        namespace=meta.get("namespace") or "default",
        name=meta.get("name") or "",
        status="finished" if finished(pod) else "terminating",
        node=None if finished(pod) else bound_node(pod),
        containers=[
            {"name": c.get("name") or str(i), "devices": []} for i, (c, _) in enumerate(ordered_containers(pod))
        ],
    )


def _first_pods(objects: Iterable[tuple[str, dict]], source: str) -> Iterator[tuple[str, dict, str]]:
    """Each pod's first document (label, document, pod ref) among ``objects``, the ones that can be
    read: one that cannot is skipped here (the run stops on it in its place)."""
    seen: set[str] = set()
    for label, obj in objects:
        if (obj.get("kind") or "Pod") != "Pod":
            continue
        ref = pod_ref(obj)
        if ref in seen:
            continue
        seen.add(ref)
        try:
            check_document(obj, POD, source, label)
        except SimulationError:
            continue
        yield label, obj, ref


def _grants_from_the_start(objects: Iterable[tuple[str, dict]], state: _State, source: str) -> None:
    """The extender grants the pods' first documents hold (not finished; terminating ones too)
    count against their namespaces' quotas from the start, wherever the file lists them, as in the
    scheduler's ledger, which counts every live grant (a dump is sorted by name: a new pod listed
    before a running one must not take the running one's room). Their uids are held from the start
    too."""
    for label, obj, ref in _first_pods(objects, source):
        if finished(obj):
            continue
        existing, _ = read_grants(obj, state.config.vendors)
        if existing is None:
            continue
        state.uids.hold(existing.key, obj, label)
        state.quota.add_pod(existing)
        state.early[ref] = existing.key


def _bound_from_the_start(objects: Iterable[tuple[str, dict]], resources: NodeResources, source: str) -> None:
    """The pods bound to a node (``spec.nodeName``, not finished) by their first document: on that
    node for kube-scheduler's NodeResourcesFit from the start, wherever the file lists them."""
    for label, obj, ref in _first_pods(objects, source):
        try:
            node = running_on(obj)
            if node is not None:
                resources.hold(ref, node, pod_resources(obj, source, label))
        except SimulationError:
            continue


def simulate_dra(
    node_docs: Iterable[Any],
    pod_docs: Iterable[Any],
    config: SchedulerConfig,
    opts: DraOptions = DraOptions(),
    sources: tuple[str, str] = ("nodes", "pods"),
) -> SimResult:
    cluster = load_nodes(node_docs, config, opts, sources[0])
    warnings = cluster.warnings
    state = _State(cluster.nodes, config, opts, cluster.sizes, sources[1])
    state.warnings = warnings
    outcomes: dict[str, PodOutcome] = {}  # namespace/name -> outcome
    objects: dict[str, dict] = {}
    live = Names(sources[1])
    seen: set[str] = set()  # pods given so far (a deletionTimestamp copy of one deletes it)
    keys: dict[str, str] = {}  # namespace/name -> the key of the pod in the state
    given = flatten_objects(pod_docs, sources[1])
    state.uids = Uids(sources[1], file_uids(given))
    state.resources = NodeResources(cluster.allocatable)
    _bound_from_the_start(given, state.resources, sources[1])
    _grants_from_the_start(given, state, sources[1])
    for index, (label, obj) in enumerate(given):
        kind = obj.get("kind") or "Pod"
        meta = obj.get("metadata") or {}
        if kind in ("ResourceClaimTemplate", "ResourceClaim", "Pod"):
            check_document(
                obj,
                {"ResourceClaimTemplate": fit.CLAIM_TEMPLATE, "ResourceClaim": fit.CLAIM, "Pod": fit.POD_CLAIMS}[kind],
                sources[1],
                label,
            )
        if kind == "ResourceClaimTemplate":
            state.add_template(obj, sources[1])
            continue
        if kind == "ResourceClaim":
            state.add_claim(obj, sources[1])
            continue
        if kind == "ResourceQuota":  # applies from here on, to pods and to the claims made for them
            check_document(obj, QUOTA, sources[1], label)
            hard = (obj.get("spec") or {}).get("hard") or {}
            try:
                state.quota.set_quota(meta.get("namespace") or "default", meta.get("name") or "", hard, config.vendors)
            except CoreError as exc:
                raise SimulationError(f"{sources[1]}: {exc}") from None
            ns_name = f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
            state.quota_docs[ns_name] = {**obj, "metadata": {**meta, "namespace": meta.get("namespace") or "default"}}
            continue
        if kind != "Pod":
            warnings.append(
                f"{sources[1]}: skipping {kind} {meta.get('name')}: not a Pod, ResourceClaim or ResourceClaimTemplate"
            )
            continue
        check_document(obj, POD, sources[1], label)
        check_document(obj, POD_FIELDS, sources[1], label)
        object_name(obj, sources[1], label)
        ref = pod_ref(obj)
        if meta.get("deletionTimestamp") and ref in seen:  # a pod given earlier is deleted here
            live.remove(pod_name(obj))
            state.delete(keys.pop(ref, ""), sources[1])
            state.extender_held.pop(ref, None)
            state.resources.release(ref)
            if ref in outcomes:
                outcomes[ref].status = "deleted"
            continue
        seen.add(ref)
        live.add(pod_name(obj), obj, label, RECREATE)
        check_pod_resources(obj, config.vendors, sources[1], label, warnings)
        try:
            pod_asks(obj)  # what the API server refuses in its node affinity or tolerations
        except NodeFitError as exc:
            raise SimulationError(f"{sources[1]}: {label} (Pod {ref}): {exc}") from None
        requests = pod_resources(obj, sources[1], label)
        state.delete(keys.pop(ref, ""), sources[1])
        state.extender_held.pop(ref, None)
        state.resources.hold(ref, running_on(obj), requests)  # (a pod bound already: on its node)
        outcomes.pop(ref, None)
        admitted = obj
        if finished(obj) or meta.get("deletionTimestamp"):  # holds nothing here / is not placed anew
            outcomes[ref] = _settled(obj)
            if ref in state.early:  # a terminating pod's extender grant: in the quota until it is deleted
                keys[ref] = state.early.pop(ref)
        else:
            existing, errors = read_grants(obj, config.vendors)
            if existing is None and not errors:  # created by the file: the API server gives it its own uid
                obj = state.uids.fresh(obj, index)
            try:
                outcomes[ref], admitted = state.place(obj, sources[1], label, requests)
            except CoreError as exc:
                raise SimulationError(f"{sources[1]}: {exc}") from None
            keys[ref] = pod_key(admitted)
            if outcomes[ref].status == "scheduled" and not bound_node(obj):
                state.resources.hold(ref, outcomes[ref].node, requests)
        objects[ref] = admitted
    if state.extender_held:  # one line, not one a running pod (a cluster dump has thousands)
        held, n = list(state.extender_held.values()), len(state.extender_held)
        shown = ", ".join(held[:3]) + (f" and {n - 3} more" if n > 3 else "")
        them, their = ("them", "their namespaces' quotas") if n > 1 else ("it", "its namespace's quota")
        warnings.append(
            f"{n} pod{'s' if n > 1 else ''} hold{'' if n > 1 else 's'} an extender allocation ({shown}): "
            f"the DRA path does not count {them} on the GPUs, only in {their} "
            "(docs/dra.md, Migrating from the extender)"
        )
    return SimResult(
        pods=list(outcomes.values()),
        devices=state.device_rows(),
        warnings=warnings,
        ledger=to_ledger(state, {pod_key(o): o for o in objects.values()}),
        objects=objects,
        claims=state.claim_rows(),
        front_end="dra",
    )
