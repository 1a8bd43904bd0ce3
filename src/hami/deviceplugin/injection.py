"""``--injection=nri``: each container gets its grant when the runtime creates it (the NRI hook,
:class:`Injector`), and Allocate answers without a pod or the node lock (:class:`NriAllocator`).

Why: with ``--injection=allocate`` (HAMi's protocol), Allocate cannot tell which pod it serves,
so every Bind on the node holds the node lock until Allocate has run. At container creation the
runtime names the pod, so there the grant can be read from the pod's annotations; a node whose
plugin says ``hami.io/node-injection: nri`` is bound without the lock (docs/nri.md).

The flow for one GPU container:

1. the kubelet calls Allocate; :class:`NriAllocator` answers the same for every pod:
   :func:`hami.node.contract.deferred_grant` (``HAMI_NRI_INJECTION=pending``);
2. the runtime calls the NRI hook's CreateContainer with the sandbox (the pod's uid, namespace,
   name and annotations) and the container (its name and env): a container without the marker
   is not ours (no adjustment); for one with it, :func:`container_grant` takes its entry of
   ``hami.io/vgpu-devices-allocated`` (init containers, then regular ones, from the pod spec),
   :func:`hami.deviceplugin.allocate.build_response` makes the env and mounts Allocate gives
   today, and :func:`adjustment` carries them as NRI's ``ContainerAdjustment``;
3. the first ``hami.io/vgpu-devices-allocated`` served for a pod uid is recorded
   (:class:`GrantRecords`, on the host): the pod's later containers (restarts, a new sandbox,
   after an agent restart) are served from it, whatever the annotation says by then;
4. nothing is written back: hami scheduler's Binding of a pod on this node already set
   ``bind-phase: success`` and emptied ``vgpu-devices-to-allocate`` (no device plugin step
   remains; the grant is read from ``vgpu-devices-allocated``, or the record, at every
   creation). A pod bound
   with ``bind-phase: allocating`` (a scheduler from before that, or another one) gets that end
   state written once its last GPU container is created (in the background, riding out API
   server restarts: the runtime waits at most a couple of seconds for the hook's answer).

A container with the marker whose grant cannot be found is refused: its creation fails with a
message naming the pod and the container, the kubelet retries it. So is one whose grant names a
device that is not a GPU of this node, or a pod whose ``hami.io/vgpu-node`` names another node
(:func:`container_grant`), and a pod's first container (no grant record yet) when the pod's
grant names a GPU that turned unhealthy since it was placed, as Allocate refuses it in the lock
mode (:meth:`Injector._check_health`).

Not here: the NRI wire protocol (:mod:`hami.node.nri`) and the registration loop (agent.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Collection, Iterable, Mapping, Sequence

from hami.core.codec import decode_pod_devices
from hami.core.errors import CodecError
from hami.core.names import grant_env
from hami.node import contract
from hami.node.layout import HookPaths, MountSpec, reset_cache_dir, write_grant
from hami.node.nri import load
from hami.node.nri.plugin import Refusal
from hami.node.settings import NodeSettings

from . import allocate as A
from .kube import Kube

log = logging.getLogger(__name__)
_, pb = load()
#: NRI's ContainerState values of a container that exists and may run: created, paused, running
LIVE = frozenset({1, 2, 3})
#: NRI's removal marker: a mount whose destination starts with it removes the mount there
REMOVE = "-"


class NriAllocator:
    """Allocate with ``--injection=nri``: the deferred grant, whatever the pod (no read, no lock).
    The grant names no GPU of its own (:func:`hami.node.contract.deferred_grant`) and preloads
    libvgpu (:func:`hami.node.contract.deferred_mounts`): a container created while the hook is
    away sees what its image says, and libvgpu gives it no device (docs/nri.md, "When something
    fails")."""

    def __init__(self, paths: HookPaths) -> None:
        self.mounts = contract.deferred_mounts(paths)

    async def allocate(self, requests: Sequence[int]) -> list[A.ContainerResponse]:
        return [A.ContainerResponse(contract.deferred_grant(), self.mounts, "") for _ in requests]

    async def find_pod(self, allocating: bool = False) -> tuple[A.PodView | None, str | None]:
        return None, None  # GetPreferredAllocation: the kubelet's plain order

    async def flush(self) -> None:
        return None

    async def reclaim_finished_lock(self) -> bool:
        return False


def _overridden(raw: Sequence[str], given: Mapping[str, str]) -> tuple[str, str] | None:
    """``(name, value)`` of a name the adjustment sets (``given``) that the container's env holds
    more than once with a last value that differs: containerd's NRI would put that value back."""
    seen: dict[str, list[str]] = {}
    for entry in raw:
        key, sep, value = entry.partition("=")
        if sep and key in given:
            seen.setdefault(key, []).append(value)
    return next(((k, vs[-1]) for k, vs in seen.items() if len(vs) > 1 and vs[-1] != given[k]), None)


def env_map(env: Sequence[str]) -> dict[str, str]:
    """An OCI env list (``KEY=value``) as a dict; the last value of a key wins, as in execve."""
    return dict(e.split("=", 1) for e in env if "=" in e)


def gpu_entries(pod: A.PodView, annotations: Mapping[str, str], resource: str = "") -> list[list]:
    """Each container's NVIDIA devices from ``hami.io/vgpu-devices-allocated`` (one entry per
    container, init containers first; missing trailing entries are empty; HAMi's old layout
    without init containers read past them, and HAMi v2.10's list of its GPU containers' entries
    alone given to them in order, :func:`hami.deviceplugin.allocate.layout_of`)."""
    raw = annotations.get(A.ALLOCATED)
    if raw is None:
        raise Refusal(f"pod {pod.ref}: annotation {A.ALLOCATED} is missing (was it placed by hami scheduler?)")
    try:
        decoded = decode_pod_devices(raw)
    except CodecError as exc:
        raise Refusal(f"pod {pod.ref}: annotation {A.ALLOCATED}={raw!r} is invalid: {exc}") from None
    if len(decoded) > len(pod.containers):
        raise Refusal(
            f"pod {pod.ref}: annotation {A.ALLOCATED} has {len(decoded)} container entries "
            f"but the pod has {len(pod.containers)} containers"
        )
    # (one HAMi wrote before it counted init containers starts at the first regular container;
    # HAMi v2.10's entries of its GPU containers alone go to the containers asking, in order)
    layout = A.layout_of(pod, decoded, resource or A.GPU_RESOURCE)
    entries = layout.place([[d for d in devs if d.type.startswith(A.NVIDIA_TYPE)] for devs in decoded], list)
    return entries + [[] for _ in range(len(pod.containers) - len(entries))]


def container_grant(
    pod: A.PodView, annotations: Mapping[str, str], name: str, *, gpus: Collection[str], node: str, resource: str = ""
) -> A.Grant:
    """The grant of container ``name``. The container is the pod spec's, as in the lock mode:
    ``CUDA_DISABLE_CONTROL`` is read from the spec's env (which the webhook sees), never from the
    env the runtime composed, where an image's own env could switch isolation off.

    Refused (defense in depth behind the webhook and the allocation guard, docs/security.md):
    a pod whose ``hami.io/vgpu-node`` (the scheduler writes it with every decision) names another
    node than ``node``, and a grant naming a device that is not one of ``gpus`` (this node's GPU
    UUIDs: ``all``, ``void``, another node's GPU), and a container whose spec does not ask for as
    many of ``resource`` (when given) as its entry has GPUs: the injection marker is an env
    variable, which any pod can set on itself."""
    placed = annotations.get(A.VGPU_NODE)
    if placed is not None and placed != node:
        raise Refusal(
            f"pod {pod.ref}: container {name!r}: {A.VGPU_NODE}={placed!r}, the grant in {A.ALLOCATED} "
            f"is not for this node ({node})"
        )
    index = next((i for i, c in enumerate(pod.containers) if c.name == name), None)
    if index is None:
        raise Refusal(f"pod {pod.ref}: container {name!r} is not in the pod's spec")
    devices = gpu_entries(pod, annotations, resource)[index]
    if not devices:
        raise Refusal(
            f"pod {pod.ref}: container {name!r} was given GPUs by the kubelet but has no entry in {A.ALLOCATED}"
        )
    try:
        A.check_on_node(pod, A.ALLOCATED, name, devices, gpus)
        A.check_asked(pod, A.ALLOCATED, index, len(devices), resource)
    except A.AllocationError as exc:
        raise Refusal(str(exc)) from None
    return A.Grant(index, pod.containers[index], tuple(devices))


def last_gpu_container(entries: Sequence[Sequence]) -> int:
    """The index of the pod's last container with GPUs (-1: none)."""
    return max((i for i, devs in enumerate(entries) if devs), default=-1)


#: libvgpu settings the webhook writes into the pod spec (from the priority resource, the
#: node-wide compute policy) and the admission rules check there
SPEC_ENV = (contract.TASK_PRIORITY, contract.CORE_POLICY)


def adjustment(
    response: A.ContainerResponse,
    env: Mapping[str, str] | None = None,
    spec_env: Mapping[str, str] | None = None,
    deferred: Sequence[MountSpec] = (),
):
    """Allocate's answer for one container as NRI's ``ContainerAdjustment``: the env (over the
    deferred grant's), bind mounts, the marker set to done.

    ``env`` (the env the runtime composed) is read for libvgpu settings the grant does not give:
    a variable only a grant sets (:func:`hami.core.names.grant_env`) is set empty, which libvgpu
    reads as unset, and ``CUDA_TASK_PRIORITY`` / ``GPU_CORE_UTILIZATION_POLICY`` keep only the
    pod spec's literal value (``spec_env``, which the admission rules checked), else are set
    empty: a pod's ``envFrom`` or its image could otherwise give libvgpu settings of their own
    (``CUDA_DEVICE_SM_LIMIT_0=100`` over the grant's unindexed share). Set empty, not removed:
    containerd 1.7's NRI (v0.8) drops a plugin's env removals. A value the adjustment sets
    replaces the container's as long as the name occurs once in the container's env (the image's
    and the kubelet's entries are not merged): :meth:`Injector.create_container` refuses a
    container where a second entry would win.

    ``deferred``: Allocate's mounts (:func:`hami.node.contract.deferred_mounts`); one whose
    destination the response does not mount is removed (``/etc/ld.so.preload`` for a container
    that switched isolation off), the others are replaced by the response's."""
    adjust = pb.ContainerAdjustment()
    given = {**response.envs, contract.NRI_INJECTION: contract.NRI_DONE}
    spec_env = spec_env or {}
    for key in sorted(env or ()):
        if key in given:
            continue
        if key in SPEC_ENV:
            given[key] = spec_env.get(key, "")
        elif grant_env(key):
            given[key] = ""
    for key, value in given.items():
        adjust.env.add(key=key, value=value)
    for m in response.mounts:
        adjust.mounts.add(
            destination=m.container_path,
            source=m.host_path,
            type="bind",
            options=["rbind", "rprivate", "ro" if m.read_only else "rw"],
        )
    mounted = {m.container_path for m in response.mounts}
    for m in deferred:
        if m.container_path not in mounted:
            adjust.mounts.add(destination=REMOVE + m.container_path)
    return adjust


def grant_records_dir(paths: HookPaths) -> str:
    """Where :class:`GrantRecords` keeps the hook's records (one file per pod uid)."""
    return f"{paths.vgpu_dir}/nri/grants"


#: a pod uid that can name a record file (the API server's are UUIDs, static pods' hex hashes)
RECORD_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")


class GrantRecords:
    """The ``hami.io/vgpu-devices-allocated`` the hook first served for each pod uid, and the
    sandbox it last served it in: one small JSON file per pod in ``directory`` (host-only, under
    ``<hook>/vgpu/nri``), so the grant a pod's containers get stays the one it was bound with
    through container restarts, a new sandbox and agent restarts. The annotation is the
    scheduler's and never changes after the bind; a copy that differs later was rewritten by
    someone else (a cluster without the allocation guard, a tool restoring pods), and a restarted
    container must not get GPUs its pod was never counted for.

    A record goes when the runtime removes the sandbox it was last served in (an older sandbox of
    the same pod, removed after its replacement started, leaves it), and at each synchronization
    for the pods the runtime no longer has. A uid that is no safe file name, or a failed write,
    is kept in memory only (bounded by ``remember``)."""

    def __init__(self, directory: str, remember: int = 4096) -> None:
        self.directory = directory
        self.remember = remember
        self._memory: OrderedDict[str, tuple[str, str]] = OrderedDict()  # uid -> (allocated, sandbox id)

    def _path(self, uid: str) -> Path | None:
        return Path(self.directory, uid) if RECORD_UID.fullmatch(uid) else None

    def _keep(self, uid: str, record: tuple[str, str]) -> None:
        self._memory[uid] = record
        self._memory.move_to_end(uid)
        while len(self._memory) > self.remember:
            self._memory.popitem(last=False)

    def get(self, uid: str) -> tuple[str, str] | None:
        """(allocated, sandbox id) of the pod's first grant, None when it has none."""
        if uid in self._memory:
            return self._memory[uid]
        path = self._path(uid)
        if path is None:
            return None
        try:
            data = json.loads(path.read_text())
            record = (str(data["allocated"]), str(data.get("sandbox", "")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # unreadable: the annotation serves, as for a pod never served (and is recorded again)
            log.error("NRI grant record %s unreadable (%s); ignored", path, exc)
            return None
        self._keep(uid, record)
        return record

    def put(self, uid: str, allocated: str, sandbox: str) -> None:
        self._keep(uid, (allocated, sandbox))
        path = self._path(uid)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{uid}.tmp")
            with open(tmp, "w") as f:
                f.write(json.dumps({"allocated": allocated, "sandbox": sandbox}))
                f.flush()
                os.fsync(f.fileno())  # (unsynced, a power loss could leave the renamed file empty)
            os.replace(tmp, path)  # whole or not at all: a crash mid-write leaves the old record
        except OSError as exc:
            log.error("NRI grant record %s not written (%s); kept in memory only", path, exc)

    def drop(self, uid: str, sandbox: str | None = None) -> None:
        """Forget the pod's record (only if it was last served in ``sandbox``, when given)."""
        record = self.get(uid)
        if record is None or (sandbox is not None and record[1] != sandbox):
            return
        self._memory.pop(uid, None)
        path = self._path(uid)
        if path is not None:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.error("NRI grant record %s not removed: %s", path, exc)

    def keep_only(self, uids: Collection[str]) -> int:
        """Forget every pod but ``uids`` (the runtime's pods); returns how many were forgotten."""
        gone = {uid for uid in self._memory if uid not in uids}
        try:
            names = os.listdir(self.directory)
            gone |= {name for name in names if RECORD_UID.fullmatch(name) and name not in uids}
            for name in names:  # a write a crash cut short
                if name.startswith(".") and name.endswith(".tmp") and RECORD_UID.fullmatch(name[1:-4]):
                    Path(self.directory, name).unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("NRI grant records in %s not listed: %s", self.directory, exc)
        for uid in gone:
            self.drop(uid)
        return len(gone)


class Injector:
    """The NRI hook (``hami.node.nri.plugin.ContainerHook``) of the device plugin."""

    def __init__(
        self,
        kube: Kube,
        settings: NodeSettings,
        paths: HookPaths,
        remember: int = 4096,
        *,
        gpus: Iterable[str],
        healthy: Callable[[str], bool] | None = None,
    ) -> None:
        self.kube = kube
        #: this node's GPU UUIDs (the discovered devices): a grant naming anything else is refused
        self.gpus = frozenset(gpus)
        #: a GPU's health (the agent's DeviceState): a pod's first grant naming an unhealthy GPU
        #: is refused (None: every GPU counts as healthy)
        self.healthy: Callable[[str], bool] = healthy or (lambda uuid: True)
        self.settings = settings
        self.paths = paths
        self.remember = remember
        self._done: OrderedDict[str, None] = OrderedDict()  # pod uids marked success (bounded)
        self._writes: set[asyncio.Task] = set()
        self.injected = 0
        self.records = GrantRecords(grant_records_dir(paths), remember)

    async def _pod(self, sandbox) -> A.PodView:
        """The pod of the sandbox: the watch's copy when its uid matches (a pod's containers never
        change) and the sandbox carries the grant, else read; refused when gone or replaced by a
        pod of the same name."""
        if A.ALLOCATED in sandbox.annotations:
            cached = self.kube.pods.by_uid(sandbox.namespace, sandbox.name, sandbox.uid)
            if cached is not None:
                return cached
        pod = await self.kube.get_pod(sandbox.namespace, sandbox.name)
        if pod is None or pod.uid != sandbox.uid:
            raise Refusal(f"pod {sandbox.namespace}/{sandbox.name} (uid {sandbox.uid}) is not on the API server")
        return pod

    async def create_container(self, sandbox, container):
        env = env_map(container.env)
        marker = env.get(contract.NRI_INJECTION)
        if marker is None:
            return None  # no GPU from this plugin
        ref = f"{sandbox.namespace}/{sandbox.name}"
        # Allocate wrote pending and void, and the runtime composes the env afresh for every
        # creation, so another value is the pod's own (an envFrom no admission rule reads). The
        # pod's value follows Allocate's in the list, and containerd's NRI puts it back over the
        # adjustment's: the container would keep the GPUs of the pod's choosing, unlimited.
        if marker != contract.NRI_PENDING:
            raise Refusal(
                f"pod {ref}: container {container.name!r}: {contract.NRI_INJECTION}={marker!r} comes from the pod's "
                "env (only the device plugin sets it): refused, the container would bypass its grant"
            )
        try:
            pod = await self._pod(sandbox)
        except Refusal:
            raise
        except Exception as exc:  # noqa: BLE001 - any API failure refuses the container; the kubelet retries
            raise Refusal(f"pod {ref}: container {container.name!r}: cannot read the pod: {exc}") from None
        # the sandbox carries the annotations the kubelet saw (the scheduler's decision); the
        # API server's copy stands in for a runtime that does not pass them
        annotations = dict(sandbox.annotations) if A.ALLOCATED in sandbox.annotations else dict(pod.annotations)
        record = self.records.get(pod.uid)
        if record is not None and record[0] != annotations.get(A.ALLOCATED):
            log.warning(
                "pod %s: %s is %r now, not the %r its first container was given: the first grant stays",
                pod.ref,
                A.ALLOCATED,
                annotations.get(A.ALLOCATED),
                record[0],
            )
            annotations[A.ALLOCATED] = record[0]
        grant = container_grant(
            pod,
            annotations,
            container.name,
            gpus=self.gpus,
            node=self.kube.node_name,
            resource=self.settings.resource_name,
        )
        try:
            response = A.build_response(pod, grant, self.settings, self.paths)
        except A.AllocationError as exc:
            raise Refusal(f"{exc} (container {container.name!r})") from None
        adjust = adjustment(response, env, grant.container.env, contract.deferred_mounts(self.paths))
        # containerd puts the image's env and the kubelet's in one list without merging names, and
        # its NRI (1.7) gives a name that occurs twice the LAST of those values back over the
        # adjustment's: a container whose image and pod (envFrom) both set one of the names the
        # grant sets would keep the pod's value. Refused: it would bypass its grant.
        overridden = _overridden(container.env, {e.key: e.value for e in adjust.env})
        if overridden:
            name, value = overridden
            raise Refusal(
                f"pod {ref}: container {container.name!r}: {name} is set more than once in its env (its image and "
                f"the pod's env), and the runtime would keep {value!r} over the grant's: refused, the container would "
                "bypass its grant"
            )
        entries = gpu_entries(pod, annotations, self.settings.resource_name)
        if record is None:
            self._check_health(pod, entries)
        if record is None or record[1] != sandbox.id:
            self.records.put(pod.uid, annotations[A.ALLOCATED], sandbox.id)
        if response.cache_dir:
            reset_cache_dir(response.cache_dir)
            write_grant(response.cache_dir, response.grant)
        self.injected += 1
        log.info(
            "pod %s: container %s given %s by NRI",
            pod.ref,
            container.name,
            ",".join(d.uuid for d in grant.devices),
        )
        if (
            grant.index == last_gpu_container(entries)
            and pod.uid not in self._done
            and annotations.get(A.BIND_PHASE) != "success"  # the Binding completed it (hami scheduler)
            and pod.annotations.get(A.BIND_PHASE) != "success"
        ):
            self._spawn(self._mark_success(pod, entries))
        return adjust

    def _check_health(self, pod: A.PodView, entries: Sequence[Sequence]) -> None:
        """A pod's first creation (no grant record yet): refused when its grant names a GPU
        that turned unhealthy (a fatal XID) since the scheduler placed it, as Allocate refuses
        it in the lock mode, where the kubelet asks at the pod's admission (here the first
        container is created after image pulls and init containers: minutes later). A pod
        already served (a restart, its next containers) keeps its grant, as the kubelet's stored
        answer keeps it in the lock mode. Found by review, 1 Dec."""
        sick = [
            (pod.containers[i].name, d.uuid)
            for i, devs in enumerate(entries)
            for d in devs
            if d.uuid in self.gpus and not self.healthy(d.uuid)
        ]
        if sick:
            named = ", ".join(f"{uuid} (container {name!r})" for name, uuid in sick)
            raise Refusal(
                f"pod {pod.ref}: its grant in {A.ALLOCATED} names GPU(s) {named}, unhealthy on node "
                f"{self.kube.node_name} since the pod was placed (a fatal XID): refused; the pod must be "
                "recreated to be placed on healthy GPUs"
            )

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _mark_success(self, pod: A.PodView, entries: list[list]) -> None:
        patch = {A.BIND_PHASE: "success", A.TO_ALLOCATE: A.remainder([[] for _ in entries])}
        try:
            await self.kube.patch_pod_annotations(pod, patch, labels={A.VGPU_NODE: self.kube.node_name})
        except Exception as exc:  # noqa: BLE001 - logged; the container runs with its grant either way
            log.error("pod %s: %s=success not written: %s", pod.ref, A.BIND_PHASE, exc)
            return
        self._done[pod.uid] = None
        while len(self._done) > self.remember:
            self._done.popitem(last=False)

    async def synchronized(self, pods: Sequence, containers: Sequence) -> list[tuple[str, str]]:
        """Containers the runtime made while no hook was registered still carry the pending
        marker (no GPU): evict them, so the kubelet creates them again, this time with their
        grant. The grant records of pods the runtime no longer has are forgotten."""
        forgotten = self.records.keep_only({p.uid for p in pods})
        if forgotten:
            log.info("NRI: forgot the grants of %d pod(s) the runtime no longer has", forgotten)
        return [
            (c.id, "hami: created while the NRI plugin was not registered (no GPU grant); evicted to be created again")
            for c in containers
            if c.state in LIVE and self.unserved(c)
        ]

    async def pod_removed(self, sandbox) -> None:
        """The runtime removed a pod sandbox: its pod's grant record goes, unless a newer sandbox
        of the pod was served since."""
        self.records.drop(sandbox.uid, sandbox.id)

    def unserved(self, container) -> bool:
        """Whether ``container`` carries Allocate's markers still: the variable ``pending``, or the
        marker mount (:func:`hami.node.contract.deferred_mounts`), which a pod's ``envFrom``
        setting the variable to ``done`` does not remove."""
        if env_map(container.env).get(contract.NRI_INJECTION) == contract.NRI_PENDING:
            return True
        return any(m.destination == self.paths.pending_marker for m in container.mounts)

    async def drain(self) -> None:
        """Wait for the success writes in flight (shutdown, tests)."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)
