"""What NodePrepareResources decides, without I/O: a ResourceClaim's allocation on this node
turned into one CDI device carrying libvgpu's environment and mounts.

The kubelet names a claim (namespace, name, UID); the plugin reads the claim from the API server
and hands it to :func:`plan`, which keeps the results of this driver in this node's pool, maps
each to a GPU by device name, and reads what the allocation consumed (``consumedCapacity``,
set by kube-scheduler for a device with ``allowMultipleAllocations``). :func:`cdi_spec` then
writes the container edits from the libvgpu container contract (:mod:`hami.node.contract`), the
same functions the device plugin's Allocate calls:

- ``NVIDIA_VISIBLE_DEVICES``: the allocated GPUs' UUIDs, in the node's GPU index order;
- ``CUDA_DEVICE_MEMORY_LIMIT_<i>``: the consumed memory of the i-th GPU, in MiB (``<n>m``);
- ``CUDA_DEVICE_SM_LIMIT``: the consumed cores of the first GPU (percent, the whole part: a
  share that named no cores consumed a thousandth and gets 0, no core limit, as on the extender
  path), and, when the GPUs' shares differ, ``CUDA_DEVICE_SM_LIMIT_<i>``: the i-th GPU's
  (:func:`contract.device_limits`);
- ``CUDA_DEVICE_MEMORY_SHARED_CACHE``: the claim's shared-region file (on the host in
  ``<hook>/vgpu/claims/<claim UID>/``; ``claims/<claim UID>.json`` beside it names the claim for
  ``hami monitor``, see :meth:`Paths.claim_record`);
- ``CUDA_TASK_PRIORITY``: the ``priority`` of the claim's ``GpuConfig`` (below), when it has one;
- ``GPU_CORE_UTILIZATION_POLICY``: the node's policy when it sets one (as the device plugin's
  grant file takes it over the pod's), else the ``corePolicy`` of the claim's ``GpuConfig``
  (``force``; the webhook's translation writes it from the container's env, whose value the
  extender's grant file copies);
- every other variable libvgpu reads, set empty (:func:`contract.sealed_env`): the unindexed
  memory limit, ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` and ``CUDA_DEVICE_SM_LIMIT_<i>`` for each index
  libvgpu reads (16) that the grant does not set, ``CUDA_OVERSUBSCRIBE`` and
  ``GPU_CORE_UTILIZATION_POLICY`` unless the node or the claim sets them, ``CUDA_TASK_PRIORITY``
  without a configured priority,
  ``HAMI_PEER_REGIONS``, ``LIBVGPU_*`` and the compute-share controller's ``HAMI_*_MS``. The
  runtime applies a CDI spec's env by name over the container's (its ``env``, ``envFrom`` and
  image ``ENV``), and libvgpu reads an empty value as unset, so no setting of the pod's survives
  (a pod's ``CUDA_DEVICE_SM_LIMIT_0=100`` would win over the claim's unindexed share);
  ``LIBCUDA_LOG_LEVEL`` stays the pod's unless the node sets it;
- mounts of the host's driver directories given with ``--driver-mount`` (both classes), first,
  as the device plugin's Allocate gives them on nodes without the NVIDIA container runtime;
- mounts of ``libvgpu.so``, the claim's cache directory, the lock directory and
  ``/etc/ld.so.preload`` (which makes every process of the container load libvgpu). The preload
  is mounted whatever the containers' env says: the claim is prepared before any of its
  containers exists, so ``CUDA_DISABLE_CONTROL`` cannot be seen here (the contract's named
  ``preload`` parameter; the whole-GPU class is the DRA way to run without libvgpu).

One CDI device per claim (``gpu.hami.io/claim=<claim UID>``), listed on the first device of each
of the claim's requests (:func:`for_kubelet`: a container naming one request gets the whole
claim): libvgpu's per-GPU variables are numbered by the position of the GPU in the
container's visible list, so all GPUs of a claim must be described together (:func:`gpu_grants`).
That position is the GPU's rank in the node's index order (NVML's, which is PCI bus order, the
order in which NVML, and CUDA for GPUs of one model, enumerate the claim's GPUs inside the
container), not the order of the results; two results on one GPU (two requests of the claim
sharing it) are one visible GPU holding their sum. Every container that
references the claim shares its shared region, hence its memory budget, as processes of one
container do. A claim from the whole-GPU class (isolation ``none``) gets only
``NVIDIA_VISIBLE_DEVICES`` and must have consumed the whole memory.

A claim allocated with admin access (every result ``adminAccess: true``; Kubernetes allows the
request only in a namespace labelled ``resource.kubernetes.io/admin-access: "true"``) is a
monitoring or maintenance view of GPUs that other claims use: it is given the GPUs
(``NVIDIA_VISIBLE_DEVICES`` and the driver mounts) without libvgpu, without limits and without a
shared region, so nothing it does is counted against the GPUs' shares and ``hami monitor`` has no
region of it to report. A claim mixing admin and ordinary results is refused (one visible list
cannot be half limited): use one claim for each.

The allocation's opaque configuration for this driver (``apiVersion gpu.hami.io/v1alpha1``,
``kind GpuConfig``; the DeviceClass's entries, then the claim's) gives each request two optional
parameters, each from the last entry that names it (:func:`_gpu_config`): ``isolation``
(``hami-core``, the default, or ``none``), ``priority``, libvgpu's task priority (an integer in
:data:`hami.core.names.PRIORITY_RANGE`, 0 high, 1 low, as the extender's ``nvidia.com/priority``;
the webhook's translation writes it from that resource) and ``corePolicy`` (``default`` or
``force``, :data:`hami.dra.gpuconfig.CORE_POLICIES`). One claim is one CDI device, so its
requests must agree on all three. A priority or a ``force`` policy on a claim that runs without
libvgpu (isolation ``none``, admin access, MIG devices) is refused rather than dropped unseen, and
so is a parameter this
agent does not know (a misspelt one, or one a newer webhook writes): the claim would run without
it. Devices carry the attribute ``taskPriority`` (:data:`hami.dra.model.TASK_PRIORITY`), which
the webhook's claims with a priority select: an agent older than the field ignored it.

A MIG device (:func:`hami.dra.model.mig_devices`: a static instance, or a dynamic placement that
the plugin creates in prepare, :mod:`hami.draplugin.plugin`) is handed to the container by its MIG
device UUID in ``NVIDIA_VISIBLE_DEVICES``, without libvgpu (the instance is the isolation), with
the driver mounts. A claim mixing MIG devices and GPU shares is refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from hami.core.names import DRA_CDI_KIND
from hami.core.quantity import QuantityError, parse_int_quantity, parse_quantity
from hami.dra import gpuconfig
from hami.dra.model import (
    CORES,
    DRIVER,
    MEMORY,
    MIB,
    GpuLike,
    MigDevice,
    SliceSettings,
    gpu_device_name,
    memory_bytes,
    total_cores,
)
from hami.node import contract
from hami.node.cdi import mount_edit
from hami.node.contract import Options
from hami.node.layout import HookPaths

#: the lowest version whose rules the spec needs (a device name that starts with a digit, a claim
#: UID's): containerd 1.7.0-1.7.12 carry a CDI library (0.5.4) that refuses a "0.6.0" spec
CDI_VERSION = "0.5.0"
CDI_KIND = DRA_CDI_KIND
ISOLATIONS = gpuconfig.ISOLATIONS
#: the parameters of a ``GpuConfig`` (any other is refused, :func:`_gpu_config`)
GPU_CONFIG_FIELDS = gpuconfig.FIELDS


class PrepareError(Exception):
    """The claim cannot be prepared here; the message names the claim and the field at fault.
    ``reason`` is the metrics' label (:data:`hami.draplugin.metrics.PREPARE_REASONS`)."""

    def __init__(self, message: str, reason: str = "allocation") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Share:
    """One allocation result of this driver on this node."""

    request: str
    device: str
    uuid: str
    memory_mib: int
    cores: int
    share_id: str | None
    index: int  # the GPU's index on the node (NVML order)
    admin: bool = False  # an admin-access result: visible, not limited, not counted
    mig: MigDevice | None = None  # a MIG device; ``uuid`` is then its MIG device UUID ("" until made)


@dataclass(frozen=True)
class GpuGrant:
    """What one GPU the container sees holds of the claim."""

    uuid: str
    memory_mib: int
    cores: int


@dataclass(frozen=True)
class Plan:
    namespace: str
    name: str
    uid: str
    pool: str
    isolation: str  # hami-core, none, admin (admin access: visible, no libvgpu), or mig
    shares: tuple[Share, ...]
    priority: int | None = None  # the configuration's task priority (hami-core only); None: libvgpu's
    core_policy: str | None = None  # the configuration's compute policy (force); None: libvgpu's default

    @property
    def cdi_device_id(self) -> str:
        return f"{CDI_KIND}={self.uid}"


@dataclass(frozen=True)
class Paths(HookPaths):
    """The host layout (:class:`hami.node.layout.HookPaths`, the same as the device plugin's:
    ``hook_path``, ``lock_dir``, ``driver_mounts``, the claim directories and records) plus where
    the claims' CDI specs go."""

    cdi_dir: str = "/var/run/cdi"

    def cdi_file(self, uid: str) -> str:
        return f"{self.cdi_dir.rstrip('/')}/{DRIVER}-{uid}.json"


def _get(obj: Any, *keys: str) -> Any:
    for k in keys:
        obj = obj.get(k) if isinstance(obj, Mapping) else None
    return obj


def _gpu_config(config: Sequence[Any], request: str, where: str) -> tuple[str, int | None, str | None]:
    """``(isolation, priority, corePolicy)`` for ``request`` from the class and claim
    configuration (:func:`hami.dra.gpuconfig.resolve_all`, the rules the webhook checks at a
    claim's creation too). ``priority`` None: not set; ``corePolicy`` None: libvgpu's default."""
    try:
        return gpuconfig.resolve_all(config, request, where)
    except gpuconfig.GpuConfigError as exc:
        raise PrepareError(str(exc)) from None


def _consumed(result: Mapping[str, Any], name: str, where: str, whole_part: bool = False) -> int | None:
    """A consumed amount (None when not recorded). ``whole_part``: a fraction is allowed and its
    whole part taken (cores: a share that named none consumed a thousandth of a core,
    :data:`hami.dra.model.IDLE_CORES`, and gets no core limit, as on the extender path)."""
    consumed = result.get("consumedCapacity") or {}
    if not isinstance(consumed, Mapping):
        raise PrepareError(f"{where}.consumedCapacity={consumed!r:.60}: must be an object of quantities")
    raw = consumed.get(name)
    if raw is None:
        return None
    try:
        if whole_part:
            value = parse_quantity(raw, f"{where}.consumedCapacity.{name}")
            return value.numerator // value.denominator
        return parse_int_quantity(raw, f"{where}.consumedCapacity.{name}")
    except QuantityError as exc:
        raise PrepareError(str(exc)) from None


def _check_range(where: str, name: str, value: int, low: int, high: int) -> None:
    """An amount the device could not have given (no allocator writes it) is refused, never
    turned into a limit: a negative or zero memory limit means none to libvgpu."""
    if not low <= value <= high:
        raise PrepareError(f"{where}.consumedCapacity.{name}={value}: outside the GPU's {low}..{high}")


def plan(
    claim: Mapping[str, Any],
    node: str,
    gpus: Sequence[GpuLike],
    settings: SliceSettings,
    migs: Mapping[str, MigDevice] | None = None,
) -> Plan:
    """This node's part of ``claim``'s allocation. Raises :class:`PrepareError` when the claim is
    not allocated, names a device this node does not have, was allocated to another node only, or
    consumed an amount outside the GPU's capacity (memory 1 MiB .. the GPU's, cores 0 .. its total)."""
    meta = _get(claim, "metadata") if isinstance(_get(claim, "metadata"), Mapping) else {}
    ref = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    allocation = _get(claim, "status", "allocation")
    if not isinstance(allocation, Mapping):
        raise PrepareError(f"{ref}: status.allocation is not set (the claim is not allocated)")
    results = _get(allocation, "devices", "results") or []
    config = _get(allocation, "devices", "config") or []
    migs = migs or {}
    by_name = {gpu_device_name(g): g for g in gpus if not any(m.gpu_uuid == g.uuid for m in migs.values())}
    shares: list[Share] = []
    isolation = None
    priority: int | None = None
    priorities: set[int] = set()  # as libvgpu runs them (unset: its default)
    policies: set[str | None] = set()  # the compute policies (None: libvgpu's default)
    admins: set[bool] = set()
    for i, r in enumerate(results):
        if not isinstance(r, Mapping) or r.get("driver") != DRIVER or r.get("pool") != node:
            continue
        where = f"{ref}: status.allocation.devices.results[{i}]"
        admin = r.get("adminAccess")
        if admin is not None and not isinstance(admin, bool):
            raise PrepareError(f"{where}.adminAccess={admin!r:.40}: must be true or false")
        admins.add(bool(admin))
        if len(admins) > 1:
            raise PrepareError(
                f"{ref}: results mix admin access and ordinary shares ({where}.adminAccess={bool(admin)}); "
                "use one claim for each"
            )
        request = r.get("request") or ""
        if not isinstance(request, str):
            raise PrepareError(f"{where}.request={request!r:.60}: must be the name of one of the claim's requests")
        iso, prio, pol = _gpu_config(config, request, f"{ref}: request {request!r}")
        if prio is not None:
            priority = prio
        priorities.add(gpuconfig.runs_at(prio))
        if len(priorities) > 1:
            raise PrepareError(f"{ref}: {gpuconfig.mixed(sorted(priorities))}")
        policies.add(pol)
        if len(policies) > 1:
            raise PrepareError(f"{ref}: {gpuconfig.mixed_policies(sorted(policies, key=str))}")
        m = migs.get(r["device"]) if isinstance(r.get("device"), str) else None
        # a priority and a policy are libvgpu's (CUDA_TASK_PRIORITY, GPU_CORE_UTILIZATION_POLICY):
        # refused where none runs, not dropped unseen
        without = gpuconfig.without_libvgpu(m is not None, bool(admin), iso)
        if prio is not None and without:
            raise PrepareError(f"{ref}: {gpuconfig.unhonoured(request, prio, without)}")
        if pol is not None and without:
            raise PrepareError(f"{ref}: {gpuconfig.unforced(request, pol, without)}")
        if m is not None:
            if admin:
                raise PrepareError(f"{where}: a MIG device cannot be given with admin access")
            if isolation is not None and isolation != "mig":
                raise PrepareError(f"{ref}: results mix MIG devices and GPU shares; use one claim for each")
            isolation = "mig"
            shares.append(Share(request, m.name, m.mig_uuid, m.memory_mb, m.core, None, m.gpu_index, mig=m))
            continue
        gpu = by_name.get(r["device"]) if isinstance(r.get("device"), str) else None
        if gpu is None:
            raise PrepareError(
                f"{where}.device={r.get('device')!r}: node {node} has no such GPU "
                f"(it has {', '.join(sorted([*by_name, *migs])) or 'none'})"
            )
        iso = "admin" if admin else iso
        if isolation is not None and iso != isolation:
            raise PrepareError(f"{ref}: requests mix isolation {isolation!r} and {iso!r}; use one class per claim")
        isolation = iso
        full = memory_bytes(gpu, settings)
        mem = _consumed(r, MEMORY, where)
        mem = full if mem is None else mem
        if iso == "none" and mem != full:
            raise PrepareError(
                f"{where}: the whole-GPU class must not ask for part of the memory (consumed {mem} of {full} bytes)"
            )
        cores = _consumed(r, CORES, where, whole_part=True)
        cores = settings.default_cores if cores is None else cores
        if not admin:  # an admin view is given no limit, so what it names is only recorded
            _check_range(where, MEMORY, mem, MIB, full)  # below 1 MiB the limit would read "0m": no limit at all
            _check_range(where, CORES, cores, 0, total_cores(settings))
        share_id = r.get("shareID")
        shares.append(
            Share(
                request=request,
                device=gpu_device_name(gpu),
                uuid=gpu.uuid,
                memory_mib=mem // MIB,
                cores=cores,
                share_id=share_id if isinstance(share_id, str) and share_id else None,
                index=gpu.index,
                admin=bool(admin),
            )
        )
    if not shares:
        raise PrepareError(f"{ref}: no device of driver {DRIVER} on node {node} in its allocation")
    return Plan(
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        str(meta.get("uid") or ""),
        node,
        isolation or "hami-core",
        tuple(shares),
        priority,
        next(iter(policies), None),
    )


def node_results(claim: Any, node: str) -> list[Mapping[str, Any]]:
    """The results of this driver in ``node``'s pool of ``claim``'s allocation (none when the
    claim is not allocated, or allocated elsewhere), in their order; :func:`plan` reads these."""
    results = _get(claim, "status", "allocation", "devices", "results")
    return [
        r
        for r in (results if isinstance(results, list) else [])
        if isinstance(r, Mapping) and r.get("driver") == DRIVER and r.get("pool") == node
    ]


def fingerprint(claim: Any, node: str) -> str:
    """A digest of what :func:`plan` reads of ``claim``'s allocation for ``node``: each of this
    node's results (request, device, consumed capacity, shareID, admin access) and the allocation's
    configuration for this driver. Two allocations with one fingerprint are prepared alike; what
    the allocation does not decide (``reservedFor``, device status) is not in it."""
    config = _get(claim, "status", "allocation", "devices", "config")
    mine = {
        "results": [
            {k: r.get(k) for k in ("request", "device", "consumedCapacity", "shareID", "adminAccess")}
            for r in node_results(claim, node)
        ],
        "config": [
            c
            for c in (config if isinstance(config, list) else [])
            if isinstance(c, Mapping) and _get(c, "opaque", "driver") == DRIVER
        ],
    }
    try:
        text = json.dumps(mine, sort_keys=True, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):  # not what an API server sends (keys not strings): still one digest
        text = repr(mine)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def same_devices(devices: Sequence[Mapping[str, Any]], claim: Any, node: str) -> bool:
    """Whether the kubelet's Device entries recorded for a claim (:func:`response_devices`) name
    the results ``claim`` has on ``node`` now: the same requests, devices and shareIDs, in order.
    What an entry recorded before :func:`fingerprint` was kept can be checked on (the consumed
    amounts and the configuration were not recorded)."""

    def key(request: Any, device: Any, share: Any) -> tuple[str, str, str]:
        return str(request or ""), str(device or ""), share if isinstance(share, str) else ""

    now = [
        key(base_request(str(r.get("request") or "")), r.get("device"), r.get("shareID"))
        for r in node_results(claim, node)
    ]
    then = []
    for d in devices:
        names = d.get("request_names") if isinstance(d, Mapping) else None
        if isinstance(d, Mapping):
            then.append(
                key(
                    base_request(str(names[0])) if isinstance(names, list) and names else "",
                    d.get("device_name"),
                    d.get("share_id"),
                )
            )
    return now == then


def gpu_grants(p: Plan) -> tuple[GpuGrant, ...]:
    """One entry per GPU of the claim, in the node's index order (the container's order, module
    doc), each with its own memory and cores; results on the same GPU add up."""
    merged: dict[int, GpuGrant] = {}
    for s in p.shares:
        held = merged.get(s.index)
        merged[s.index] = (
            GpuGrant(s.uuid, s.memory_mib, s.cores)
            if held is None
            else GpuGrant(s.uuid, held.memory_mib + s.memory_mib, held.cores + s.cores)
        )
    return tuple(merged[i] for i in sorted(merged))


def container_edits(p: Plan, paths: Paths, opts: Options) -> dict[str, Any]:
    """The claim's container edits: the libvgpu container contract (hami-core isolation), or the
    GPUs and the driver mounts only (isolation ``none``, and admin access)."""
    if p.isolation == "mig":  # the instances are the isolation: their UUIDs and the driver mounts
        missing = [s.device for s in p.shares if not s.uuid]
        if missing:
            raise PrepareError(f"claim {p.namespace}/{p.name}: MIG device(s) {', '.join(missing)} not made yet")
        mig_env = contract.visible_devices([s.uuid for s in p.shares])
        mig_mounts = [mount_edit(m) for m in contract.container_mounts(paths, None, preload=False)]
        out: dict[str, Any] = {"env": [f"{k}={v}" for k, v in mig_env.items()]}
        if mig_mounts:
            out["mounts"] = mig_mounts
        return out
    grants = gpu_grants(p)
    env = contract.visible_devices([g.uuid for g in grants])
    region_dir = None
    if p.isolation == "hami-core":
        limits = contract.device_limits(
            [g.memory_mib for g in grants],
            [g.cores for g in grants],
            contract.claim_region(paths, p.uid),
            p.priority,  # CUDA_TASK_PRIORITY; unset: sealed empty below, libvgpu's default
        )
        # the claim's compute policy unless the node sets one (the device plugin's grant file
        # takes the node's over the pod's); sealed: every other variable libvgpu reads set
        # empty (module doc), so none comes from the pod
        if p.core_policy and not opts.core_policy:
            opts = replace(opts, core_policy=p.core_policy)
        env.update(contract.sealed_env(contract.limit_env(limits, opts)))
        env[contract.GRANT_DEVICES] = ",".join(g.uuid for g in grants)  # libvgpu: no other GPU
        region_dir = paths.claim_dir(p.uid)
    # no region (isolation none, admin access): the driver mounts only, no libvgpu, no preload;
    # preload=True: no container's env is known when a claim is prepared (module doc)
    # the grant file too (written by the agent from this env, claim_grant): libvgpu takes its
    # settings from it, and a pod's own mount of that name then makes two, which libvgpu refuses
    mounts = [mount_edit(m) for m in contract.container_mounts(paths, region_dir, preload=True, grant=True)]
    edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in env.items()]}
    if mounts:
        edits["mounts"] = mounts
    return edits


def spec_env(spec: Mapping[str, Any]) -> dict[str, str]:
    """The env a claim's CDI spec sets, over all its devices (a later entry of a name wins)."""
    env: dict[str, str] = {}
    for device in spec.get("devices") or ():
        for entry in ((device or {}).get("containerEdits") or {}).get("env") or ():
            key, _, value = str(entry).partition("=")
            env[key] = value
    return env


def claim_grant(spec: Mapping[str, Any]) -> str:
    """The grant file's text for a claim's CDI spec (:func:`hami.node.contract.grant_file` of its
    env): what the agent writes into the claim's region directory, which the spec mounts."""
    env = spec_env(spec)
    # the claim's GPUs, in the order its limits are numbered: libvgpu gives the region's device
    # indices in this order (and refuses a device the process sees that is not one of them)
    devices = [u for u in env.get(contract.VISIBLE_DEVICES, "").split(",") if u]
    return contract.grant_file(env, {}, devices)


def claim_record(namespace: str, name: str, uid: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """``claims/<uid>.json`` for ``hami monitor``: who the claim is, the GPUs it was given (the
    UUIDs of its spec's ``NVIDIA_VISIBLE_DEVICES``) and, when its configuration set one, its task
    priority (its spec's ``CUDA_TASK_PRIORITY``). The file lies outside what the container can
    write, so the monitor counts a claim's region on these GPUs only, and can trust this priority
    where the region's own field is the container's to write."""
    env = spec_env(spec)
    devices = [u for u in env.get(contract.VISIBLE_DEVICES, "").split(",") if u]
    record: dict[str, Any] = {"namespace": namespace, "name": name, "uid": uid, "devices": devices}
    priority = env.get(contract.TASK_PRIORITY, "")
    if (
        priority.isascii() and priority.isdigit()
    ):  # absent from a record when unset, so records of other claims are unchanged
        record["priority"] = int(priority)
    return record


def cdi_spec(p: Plan, paths: Paths, opts: Options) -> dict[str, Any]:
    """The claim's CDI spec (one device named after the claim UID)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": p.uid, "containerEdits": container_edits(p, paths, opts)}],
    }


def base_request(name: str) -> str:
    """The claim's request a result belongs to: ``gpu`` for a ``firstAvailable`` subrequest's
    ``gpu/big``, which is how a container names it (``resources.claims[].request``)."""
    return name.split("/", 1)[0]


def response_devices(p: Plan) -> list[dict[str, Any]]:
    """The kubelet's Device entries: one per result (:func:`for_kubelet`)."""
    out = []
    for s in p.shares:
        d: dict[str, Any] = {
            "request_names": [s.request],
            "pool_name": p.pool,
            "device_name": s.device,
            "cdi_device_ids": [p.cdi_device_id],
        }
        if s.share_id:
            d["share_id"] = s.share_id
        out.append(d)
    return for_kubelet(out)


def for_kubelet(devices: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Device entries as the kubelet matches them to containers. It gives a container that names
    one request of the claim the CDI devices of the entries whose ``request_names`` contain that
    name, as the container wrote it: a request, never ``request/subrequest`` (so the names are cut
    to their request, as Kubernetes' own kubelet plugin helper does), and the claim's one CDI
    device goes on the first entry of each request, not of the claim, or a container naming the
    second request got no GPU at all. It then sees all of the claim's GPUs (module doc: a claim's
    GPUs are described together). Also applied to what the checkpoint recorded before (full
    names, the CDI device on the first entry only)."""
    ids: list[str] = []
    for d in devices:
        ids += [i for i in d.get("cdi_device_ids") or () if isinstance(i, str) and i not in ids]
    out, seen = [], set()
    for d in devices:
        names = [base_request(str(n)) for n in d.get("request_names") or ()]
        first = [n for n in names if n not in seen]
        seen.update(names)
        out.append({**d, "request_names": names, "cdi_device_ids": list(ids) if first or not names else []})
    return out
