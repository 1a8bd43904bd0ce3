"""What ``Allocate`` decides, without I/O: which pod, which container, which env and mounts.

The adapter (``server``) reads the node and the pod from the API server, calls these
functions, then writes the results back. Everything here is deterministic: the cache file
name is derived from the pod UID and the container name, not drawn at random. The env and
mounts themselves are the libvgpu container contract (:mod:`hami.node.contract`), which the
DRA agent and ``hami exec`` use too; the host paths are :mod:`hami.node.layout`'s.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping, Sequence

from hami.core.codec import decode_pod_devices, encode_pod_devices
from hami.core.ledger import EntryLayout, asks_devices, entry_layout  # the one rule for the layouts HAMi wrote
from hami.core.errors import CodecError
from hami.core.names import BIND_PHASE, BIND_TIME, VGPU_MIG_ALLOCATIONS, VGPU_NODE
from hami.core.quantity import QuantityError, parse_int_quantity
from hami.kube.revision import newer_than
from hami.core.types import ContainerDevice, PodSingleDevice
from hami.kube.nodelock import NodeLock, owned_by, parse_node_lock  # noqa: F401 - shared with the scheduler
from hami.vendors.nvidia import NvidiaVendor

from hami.node import contract
from hami.node.layout import HookPaths, MountSpec
from hami.node.settings import NodeSettings

# Annotation keys (§4.3, §5.5, §5.8).
TO_ALLOCATE = NvidiaVendor.to_allocate_annotation
ALLOCATED = NvidiaVendor.allocated_annotation
NODE_LOCK = NvidiaVendor.lock_annotation
NVIDIA_TYPE = NvidiaVendor.request_type


class AllocationError(Exception):
    """Allocate cannot proceed; the message names the pod (when known) and the reason."""


@dataclass(frozen=True)
class ContainerView:
    name: str
    limits: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)  # literal values only


@dataclass(frozen=True)
class PodView:
    """The parts of a pod that Allocate needs. ``containers``: init containers, then regular
    (the first ``inits`` of them are the init containers)."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]
    containers: tuple[ContainerView, ...]
    node_name: str = ""
    phase: str = ""
    inits: int = 0

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_view_from_object(obj: Mapping[str, Any]) -> PodView:
    """A PodView from a pod as the API server sends it (JSON, camelCase)."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}

    def container(c: Mapping[str, Any]) -> ContainerView:
        limits = ((c.get("resources") or {}).get("limits")) or {}
        env = {e["name"]: e["value"] for e in c.get("env") or () if e.get("value") is not None}
        return ContainerView(c.get("name") or "", {k: str(v) for k, v in limits.items()}, env)

    return PodView(
        namespace=meta.get("namespace") or "",
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        annotations=dict(meta.get("annotations") or {}),
        containers=tuple(
            container(c) for c in list(spec.get("initContainers") or ()) + list(spec.get("containers") or ())
        ),
        node_name=spec.get("nodeName") or "",
        phase=(obj.get("status") or {}).get("phase") or "",
        inits=len(spec.get("initContainers") or ()),
    )


class PodCache:
    """This node's pods as a watch delivers them (a :class:`hami.kube.reflector.Reflector`
    handler), so Allocate can skip reading the pod the node lock names.

    A cached copy stands in for a fresh read only when it provably postdates the lock: it shows
    the pod bound here and still ``allocating``, and its resourceVersion is newer than the node's
    (read just before, holding the lock). The lock was written before the Binding, so such a copy
    includes the Binding and everything before it (the scheduler's decision); a pod deleted and
    re-created under the same name has all its older copies below the new lock's revision (every
    Bind writes a fresh lock value, even over one naming the same pod). A copy being deleted is
    never used.

    The plugin's own writes set a floor for that pod (a second container's Allocate must see the
    first one's patch): while the write is in flight nothing is used, afterwards only copies at or
    above the write's resourceVersion, so a late watch event or relist from before the write
    cannot stand in; a failed write leaves the pod to fresh reads.
    """

    def __init__(self) -> None:
        self._pods: dict[str, tuple[str, dict]] = {}  # "ns/name" -> (resourceVersion, object)
        self._floor: dict[str, str | None] = {}  # "ns/name" -> lowest usable resourceVersion (None: none)
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"

    def replace(self, items: list[dict], resource_version: str | None = None) -> None:
        self._pods = {self._key(o): ((o.get("metadata") or {}).get("resourceVersion") or "", o) for o in items}

    def apply(self, event_type: str, obj: dict) -> None:
        key, rv = self._key(obj), (obj.get("metadata") or {}).get("resourceVersion") or ""
        if event_type == "DELETED":
            self._pods.pop(key, None)
            self._floor.pop(key, None)
        elif key not in self._pods or newer_than(rv, self._pods[key][0]):
            self._pods[key] = (rv, obj)

    def writing(self, namespace: str, name: str) -> None:
        """The plugin is about to write this pod: no copy may stand in until :meth:`written`."""
        key = f"{namespace}/{name}"
        self._pods.pop(key, None)
        self._floor[key] = None

    def written(self, namespace: str, name: str, resource_version: str | None) -> None:
        """The write landed as ``resource_version``: copies from before it stay unusable."""
        key = f"{namespace}/{name}"
        if key in self._floor and resource_version:
            self._floor[key] = resource_version

    def by_uid(self, namespace: str, name: str, uid: str) -> PodView | None:
        """The copy of this pod, if it is the pod with ``uid`` (not one re-created under its
        name). Only what never changes in a pod may be read from it: its containers (the NRI
        hook's container order, ``injection.py``)."""
        entry = self._pods.get(f"{namespace}/{name}")
        if entry is None or not uid or (entry[1].get("metadata") or {}).get("uid") != uid:
            return None
        return pod_view_from_object(entry[1])

    def usable(self, namespace: str, name: str, node: str, node_rv: str) -> PodView | None:
        key = f"{namespace}/{name}"
        entry = self._pods.get(key)
        view = None
        floor = self._floor.get(key, "0")
        if (
            entry is not None
            and newer_than(entry[0], node_rv)
            and floor is not None
            and (entry[0] == floor or newer_than(entry[0], floor))
            and not (entry[1].get("metadata") or {}).get("deletionTimestamp")
        ):
            candidate = pod_view_from_object(entry[1])
            if candidate.node_name == node and candidate.annotations.get(BIND_PHASE) == "allocating":
                view = candidate
        if view is None:
            self.misses += 1
        else:
            self.hits += 1
        return view


def lock_owned_by(value: str | None, pod: PodView) -> bool:
    return owned_by(value, pod.namespace, pod.name)


def is_pending_candidate(pod: PodView, node: str) -> bool:
    """HAMi's fallback test (§5.9): Pending, bind-time set, phase allocating/success, vgpu-node=node."""
    a = pod.annotations
    return (
        pod.phase == "Pending"
        and bool(a.get(BIND_TIME))
        and a.get(BIND_PHASE) in ("allocating", "success")
        and a.get(VGPU_NODE) == node
        and bool(a.get(TO_ALLOCATE, "").strip(";"))
    )


def choose_pending(candidates: Sequence[PodView], node: str, finished: PodView | None = None) -> PodView:
    """The single pod mid-allocation on ``node``; refuses to guess between several. ``finished``:
    the pod the node lock names, whose allocation is over (the messages said "no node lock" when
    there was one, sending whoever read them after the wrong cause)."""
    pods = sorted((p for p in candidates if is_pending_candidate(p, node)), key=lambda p: p.ref)
    if finished is None:
        lock, retry = "no node lock,", ""
    else:
        phase = finished.annotations.get(BIND_PHASE)
        lock = f"a node lock naming pod {finished.ref}, whose allocation is over ({BIND_PHASE}={phase}),"
        retry = (
            f"; a second Allocate for {finished.ref} (a kubelet restarted during its first) is answered "
            "again only when this plugin saw the first answer lost"
        )
    if not pods:
        raise AllocationError(f"no pod is waiting for GPU allocation on node {node} ({lock} no candidate pod){retry}")
    if len(pods) > 1:
        names = ", ".join(p.ref for p in pods)
        raise AllocationError(
            f"node {node} has {lock} and {len(pods)} pods waiting for GPU allocation ({names}); "
            "refusing to guess which one the kubelet is admitting"
        )
    return pods[0]


#: the resource a container asks GPUs with, unless the node's config names another
GPU_RESOURCE = "nvidia.com/gpu"


def layout_of(pod: PodView, decoded: PodSingleDevice, resource: str = GPU_RESOURCE) -> EntryLayout:
    """Which container each entry of an allocation of ``decoded`` entries is for, by the scheduler's
    ledger's rule (:func:`hami.core.ledger.entry_layout`) with asking meaning what it means there
    and what is given an entry: a count of ``resource`` above 0 (:func:`hami.core.ledger.asks_devices`;
    the limits alone: the API server requires an extended resource's limit, and its request equals
    it). Read in today's order, an entry HAMi wrote before it counted init containers, or one of
    HAMi v2.10's list of the GPU containers' entries alone, went to another container than its own
    (an init container, a sidecar): refused there by the ask check (the pod failed at admission), or
    given the wrong container's cache directory and limits. (Asking meant ``resource`` named in
    the limits: an init container with ``nvidia.com/gpu: "0"`` took main's entry here while the
    ledger gave it to another container; found by review, 1 Dec.)"""
    return entry_layout(decoded, pod.inits, [asks_devices(c.limits, {}, resource) for c in pod.containers])


def allocated_layout(pod: PodView, resource: str = GPU_RESOURCE) -> EntryLayout:
    """:func:`layout_of` the pod's allocated annotation, which ``hami.io/vgpu-mig-allocations``'
    container indexes follow (they count its entries as the grant does); entries in order when
    the annotation is missing or malformed."""
    try:
        whole = decode_pod_devices(pod.annotations.get(ALLOCATED) or "")
    except CodecError:
        return EntryLayout()
    return layout_of(pod, whole, resource)


def layout_shift(pod: PodView, decoded: PodSingleDevice, resource: str = GPU_RESOURCE) -> int:
    """How many init containers an allocation of ``decoded`` entries skips: non-zero only for one
    HAMi wrote before it counted init containers (one entry per regular container); see
    :func:`layout_of` for the whole rule."""
    return layout_of(pod, decoded, resource).shift


def decoded_devices(pod: PodView, field: str, resource: str = GPU_RESOURCE) -> tuple[PodSingleDevice, int]:
    """The pod's ``field`` annotation decoded as written, and its :func:`layout_shift`."""
    decoded = _decoded(pod, field)
    return decoded, layout_shift(pod, decoded, resource)


def _decoded(pod: PodView, field: str) -> PodSingleDevice:
    raw = pod.annotations.get(field)
    if raw is None:
        raise AllocationError(f"pod {pod.ref}: annotation {field} is missing (was it placed by hami scheduler?)")
    try:
        decoded: PodSingleDevice = decode_pod_devices(raw)
    except CodecError as exc:
        raise AllocationError(f"pod {pod.ref}: annotation {field}={raw!r} is invalid: {exc}") from None
    if len(decoded) > len(pod.containers):
        raise AllocationError(
            f"pod {pod.ref}: annotation {field} has {len(decoded)} container entries "
            f"but the pod has {len(pod.containers)} containers"
        )
    return decoded


def pending_devices(pod: PodView, resource: str = GPU_RESOURCE) -> list[list[ContainerDevice]]:
    """Decode the pod's to-allocate annotation, one entry per container of the pod (empty entries
    included; each entry on its container by :func:`layout_of`)."""
    return pending_layout(pod, resource)[0]


def _blanked_from(remainder: PodSingleDevice, whole: PodSingleDevice) -> bool:
    """Whether ``remainder`` is ``whole`` with entries emptied in place (as HAMi's plugin and this
    one write back what is left of a layout they keep): each entry naming a device sits where
    ``whole`` has it."""
    return len(remainder) == len(whole) and all(
        all(d in whole[i] for d in ctr) for i, ctr in enumerate(remainder) if any(d.uuid for d in ctr)
    )


def pending_layout(pod: PodView, resource: str = GPU_RESOURCE) -> tuple[list[list[ContainerDevice]], int]:
    """:func:`pending_devices` and the :func:`layout_shift` to write the remainder back with
    (:func:`remainder`).

    The layout is told from the allocated annotation when the remainder is it with entries
    emptied in place (the scheduler writes both in one layout, and only to-allocate is emptied as
    containers are served): read from a remainder whose first entries are emptied, an old layout
    can look like today's, and HAMi v2.10's list of GPU containers' entries alone like anything.
    Such a list (:func:`hami.core.ledger.entry_layout`, shorter than the pod's containers) is
    written back one entry for each of the pod's containers (shift 0), which this reader then
    reads in today's order and HAMi's plugin, popping the first non-empty entry, pops in the same
    order."""
    decoded = _decoded(pod, TO_ALLOCATE)
    layout = layout_of(pod, decoded, resource)
    try:
        whole = decode_pod_devices(pod.annotations.get(ALLOCATED) or "")
    except CodecError:
        whole = ()
    if _blanked_from(decoded, whole):
        layout = layout_of(pod, whole, resource)
    pending = layout.place([list(c) for c in decoded], list)
    if layout.owners is not None:
        # written back one entry per container: longer than the list it came from, so never
        # taken for that list emptied in place
        pending += [[] for _ in range(len(pod.containers) - len(pending))]
    return pending, layout.shift


@dataclass(frozen=True)
class Grant:
    """One container's devices, chosen by popping the first non-empty annotation entry."""

    index: int
    container: ContainerView
    devices: tuple[ContainerDevice, ...]


def check_on_node(
    pod: PodView, field: str, container: str, devices: Sequence[ContainerDevice], gpus: Collection[str]
) -> None:
    """Refuse a grant naming a device that is not one of this node's GPUs (``gpus``: the UUIDs the
    plugin discovered and registers, which are all the scheduler places on). The UUID goes into
    ``NVIDIA_VISIBLE_DEVICES`` as written, so a forged annotation could otherwise name ``all``
    (every GPU, only the first one limited), ``void`` or another node's GPU. Defense in depth:
    the webhook and the chart's allocation guard keep such annotations out where they run.
    MIG mode grants name GPU UUIDs too (the instance is made from them, mig.py).

    HAMi's MIG grants before ``hami.io/vgpu-mig-allocations`` named the instance
    ``<GPU UUID>[<template>-<slot>]``, a slot of a whole-GPU geometry from HAMi's (deprecated)
    template list: no placement this plugin could make the instance at, so such a grant, left
    ``allocating`` by a switch from HAMi, is refused by name rather than as a GPU of another node."""
    for d in devices:
        if "[" in d.uuid and d.uuid.split("[", 1)[0] in gpus:
            raise AllocationError(
                f"pod {pod.ref}: annotation {field} gives container {container!r} {d.uuid!r}, HAMi's legacy MIG "
                f"instance name (<GPU UUID>[<template>-<slot>]; {field}={pod.annotations.get(field)!r}), written "
                f"before {VGPU_MIG_ALLOCATIONS}: this plugin makes MIG instances only from that annotation's "
                "placements; grant refused (delete the pod to have it placed again)"
            )
        if d.uuid not in gpus:
            raise AllocationError(
                f"pod {pod.ref}: annotation {field} gives container {container!r} the device {d.uuid!r}, "
                "which is not a GPU of this node; grant refused"
            )


def check_asked(pod: PodView, field: str, index: int, count: int, resource: str) -> None:
    """:class:`AllocationError` unless container ``index`` asks for exactly ``count`` of
    ``resource`` (no check without one): an entry of ``count`` GPUs in ``field`` on a container
    asking for another number, or none, was not written by a scheduler for that container."""
    if not resource:
        return
    asked = pod.containers[index].limits.get(resource)
    if asked is None or asked.strip() != str(count):
        raise AllocationError(
            f"pod {pod.ref}: container {pod.containers[index].name!r} has {count} GPU(s) in {field} but asks "
            f"for {resource}={asked if asked is not None else 'nothing'}; grant refused "
            "(the annotation was not written for this container)"
        )


def pop_next(
    pod: PodView, pending: list[list[ContainerDevice]], requested: int, *, gpus: Collection[str], resource: str = ""
) -> Grant:
    """Take (and blank) the first non-empty container entry; its size must equal ``requested``,
    the container must ask for that many of ``resource`` (when given: the kubelet calls Allocate
    only for a container that does, so an entry on any other container was not written by a
    scheduler for it) and each of its devices must be one of ``gpus`` (this node's GPU UUIDs,
    :func:`check_on_node`)."""
    for index, devs in enumerate(pending):
        nvidia = [d for d in devs if d.type.startswith(NVIDIA_TYPE)]
        if not granted(nvidia):
            continue  # (nothing, or UUID-less padding: a GPU-less container's, no grant)
        if len(nvidia) != requested:
            raise AllocationError(
                f"pod {pod.ref}: container {pod.containers[index].name!r} has {len(nvidia)} GPU(s) in "
                f"{TO_ALLOCATE} but the kubelet asked for {requested} (device number not matched)"
            )
        check_on_node(pod, TO_ALLOCATE, pod.containers[index].name, nvidia, gpus)
        check_asked(pod, TO_ALLOCATE, index, len(nvidia), resource)
        pending[index] = [d for d in devs if d not in nvidia]
        return Grant(index, pod.containers[index], tuple(nvidia))
    raise AllocationError(
        f"pod {pod.ref}: the kubelet asked for {requested} GPU(s) but {TO_ALLOCATE} has no container left to allocate"
    )


def remainder(pending: list[list[ContainerDevice]], shift: int = 0) -> str:
    """The annotation for what is left (``pending``: one entry per container, as
    :func:`pending_layout` reads it), in the layout it was read in (``shift``: :func:`layout_shift`),
    except HAMi v2.10's list of GPU containers' entries alone, written one entry per container
    (its shift is 0)."""
    return encode_pod_devices(pending[shift:])


def granted(devices: Sequence[ContainerDevice]) -> bool:
    """Whether an entry grants GPUs: it names one (a UUID). An entry of UUID-less padding
    (``,NVIDIA,0,0``) is a GPU-less container's, as :func:`hami.core.ledger.entry_layout` reads
    it; placed by that rule before the GPU container's entry, it was taken for the first grant
    (refused: ``''`` is not a GPU of this node) and kept the pod from completing (found by
    review, 1 Dec)."""
    return any(d.uuid and d.type.startswith(NVIDIA_TYPE) for d in devices)


def all_done(pending: list[list[ContainerDevice]]) -> bool:
    return not any(granted(devs) for devs in pending)


# ------------------------------------------------------------------------------- the response


@dataclass(frozen=True)
class ContainerResponse:
    envs: dict[str, str]
    mounts: tuple[MountSpec, ...]
    cache_dir: str  # host directory to (re)create before answering
    annotations: dict[str, str] = field(default_factory=dict)  # CDI devices (cdi-annotations), see hami.node.cdi
    cdi_devices: tuple[str, ...] = ()  # CDI devices (cdi-cri)
    grant: str = ""  # the grant file to write into cache_dir (hami.node.contract.grant_file)
    devices: tuple[DeviceNode, ...] = ()  # device specs (--pass-device-specs, DeviceSpecs)


# ------------------------------------------------------------------------------- device specs

#: the driver's control nodes: passed with every grant, each only where the host has it (as
#: NVIDIA's and HAMi's plugins do: nvidia-modeset and nvidia-uvm-tools are often absent)
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
#: where the driver says which nvidia-caps node grants access to a MIG GPU/compute instance
_CAP_MINOR = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.M)


@dataclass(frozen=True)
class DeviceNode:
    """One DeviceSpec of a ContainerAllocateResponse: the kubelet has the runtime create
    ``container_path`` in the container from the host's ``host_path`` and allow it in the
    container's device cgroup."""

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class DeviceSpecs:
    """``--pass-device-specs``: HAMi's ``passDeviceSpecsEnabled``. Each grant also names its GPUs'
    device nodes (``/dev/nvidia<minor>``), the driver's control nodes and, for a MIG device, its
    ``nvidia-caps`` nodes, so a container gets them from the kubelet even where no NVIDIA
    container runtime reads ``NVIDIA_VISIBLE_DEVICES``.

    ``host_root``: the host root the nodes are under, as the kubelet sees it (HAMi's
    ``--dev-root``: ``host_path`` is ``<host_root>/dev/<node>``); ``view``: the same root as this
    plugin sees it (it may be mounted elsewhere in the plugin's container). A node is passed only
    if ``<view>/dev/<node>`` exists when Allocate answers: a spec naming a missing node makes the
    runtime fail the container. ``nodes``: device UUID -> its own nodes, relative to /dev (a GPU:
    ``nvidia<minor>``; a MIG device: its GPU's plus ``nvidia-caps/nvidia-cap<n>`` of its GPU and
    compute instance), fixed at start-up."""

    nodes: Mapping[str, tuple[str, ...]]
    host_root: str = "/"
    view: str = ""  # "" = host_root

    def specs(self, uuids: Iterable[str]) -> tuple[DeviceNode, ...]:
        """The specs of a grant of ``uuids`` (in grant order, control nodes last, no repeats): a
        UUID without known nodes adds none (its container still gets NVIDIA_VISIBLE_DEVICES)."""
        names: list[str] = []
        for uuid in uuids:
            names += [n for n in self.nodes.get(uuid, ()) if n not in names]
        names += CONTROL_NODES
        view = Path(self.view or self.host_root) / "dev"
        return tuple(
            DeviceNode(f"/dev/{n}", os.path.join(self.host_root, "dev", n)) for n in names if os.path.exists(view / n)
        )


def gpu_node(minor: int) -> str:
    """A GPU's device node, relative to /dev."""
    return f"nvidia{minor}"


def mig_cap_nodes(proc_root: str | os.PathLike, minor: int, gi: int, ci: int) -> tuple[str, ...]:
    """The ``nvidia-caps`` nodes (relative to /dev) that give access to GPU instance ``gi`` and its
    compute instance ``ci`` on GPU ``/dev/nvidia<minor>``, as the driver lists them under
    ``<proc>/driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access``; () when the
    driver does not say (an older driver, or one whose /proc is not visible here)."""
    base = Path(proc_root) / "driver/nvidia/capabilities" / f"gpu{minor}" / "mig" / f"gi{gi}"
    out = []
    for access in (base / "access", base / f"ci{ci}" / "access"):
        try:
            found = _CAP_MINOR.search(access.read_text())
        except OSError:
            return ()
        if found is None:
            return ()
        out.append(f"nvidia-caps/nvidia-cap{found.group(1)}")
    return tuple(out)


def _priority(pod: Any, ctr: Any, resource: str) -> int | None:
    """The container's priority limit as the number libvgpu reads (None: not asked). The API
    server keeps a quantity in its canonical form, so a pod's ``1000`` comes back ``1k``, which
    libvgpu refuses to start with."""
    raw = ctr.limits.get(resource)
    if raw is None:
        return None
    try:
        return parse_int_quantity(raw, f"container {ctr.name!r} limits.{resource}")
    except QuantityError as exc:
        raise AllocationError(f"pod {pod.ref}: {exc}") from None


def build_response(
    pod: PodView,
    grant: Grant,
    settings: NodeSettings,
    paths: HookPaths,
    mig_devices: Sequence[str] = (),
    device_specs: DeviceSpecs | None = None,
) -> ContainerResponse:
    """Env and mounts for one container (§6.4 tables), from the libvgpu container contract
    (:mod:`hami.node.contract`); ``CUDA_DISABLE_CONTROL=true`` in the container's env leaves
    ``/etc/ld.so.preload`` out, as in HAMi.

    MIG mode: ``mig_devices`` are the MIG device UUIDs made for this container (mig.py), one per
    granted device; the container sees those instead of the GPUs, and libvgpu still limits it
    to the profile's memory (the instance's SMs are all its own: no compute limit). The grant
    file names them (``HAMI_GRANT_DEVICES``, in grant order), so libvgpu gives no device to a
    process that sees another and numbers the limits by the grant, not by CUDA's order.

    ``device_specs`` (``--pass-device-specs``): the granted GPUs' device nodes go into the
    response too (in MIG mode the GPUs' own nodes: an instance made at Allocate has no
    ``nvidia-caps`` node known at start-up, the NVIDIA runtime adds those)."""
    devs = grant.devices
    nodes = device_specs.specs(d.uuid for d in devs) if device_specs is not None else ()
    ctr = grant.container
    mig = settings.operating_mode == "mig"
    if mig and len(mig_devices) != len(devs):
        raise AllocationError(
            f"pod {pod.ref}: container {ctr.name!r} has {len(devs)} MIG device(s) granted but "
            f"{len(mig_devices)} instance(s) were made"
        )
    envs = contract.visible_devices(list(mig_devices) if mig else [d.uuid for d in devs])
    if settings.operating_mode not in ("hami-core", "mig"):
        return ContainerResponse(envs, contract.container_mounts(paths, None), "", devices=nodes)
    cache_dir = paths.cache_dir(pod.uid, ctr.name)
    limits = contract.Limits(
        memory=tuple(contract.mib(d.usedmem) for d in devs),
        cores=100 if mig else devs[0].usedcores,
        region=contract.container_region(paths, pod.uid, ctr.name),
        priority=_priority(pod, ctr, settings.priority_resource),
    )
    envs.update(contract.limit_env(limits, contract.options(settings)))
    mounts = contract.container_mounts(paths, cache_dir, preload=contract.preload_wanted(ctr.env), grant=True)
    # what the container may see, in grant order (CUDA_DEVICE_MEMORY_LIMIT_<i> is entry i's): the
    # GPUs, or in MIG mode the instances. Left empty for MIG before (review, 1 Dec), libvgpu took
    # every device as granted: a pod's own NVIDIA_VISIBLE_DEVICES=all (an envFrom) used every
    # instance of the node, and a multi-instance grant's limits went by CUDA's order, not the grant's
    granted = list(mig_devices) if mig else [d.uuid for d in devs]
    return ContainerResponse(envs, mounts, cache_dir, grant=contract.grant_file(envs, ctr.env, granted), devices=nodes)
