"""The node agent: gRPC server + kubelet registration + registration annotation + XID watcher,
plus, per configuration, dynamic MIG (recovery at start, clean-up loop; mig.py), one more
gRPC server per static MIG resource (static_mig.py), and with ``injection="nri"`` the NRI plugin
that gives each container its grant at creation (injection.py; Allocate then answers without a
pod or the node lock, and the node says ``hami.io/node-injection: nri`` while that plugin is
registered).

``NodeAgent`` is what ``hami device-plugin`` runs; tests run it in-process against the fake
NVML, a kubelet stand-in and the real API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from hami.core.codec import MigAllocation
from hami.core.names import NODE_INJECTION
from hami.kube.nodelock import LOCK_HANDOFF

from hami.node import contract
from hami.node.cdi import CdiConfig
from hami.node.layout import HookPaths, prepare_hook_dir
from hami.node.nri import DEFAULT_SOCKET as NRI_SOCKET
from hami.node.nri.plugin import NriPlugin
from hami.node.nvml import IGNORED_XIDS, MigError, PhysicalGPU, XidWatcher
from hami.node.settings import NodeSettings

from .allocate import DeviceSpecs
from .allocator import Allocator, mig_holders
from .allocator import legacy_mig_grants as legacy_mig_grants  # its home before (tests import it here)
from .devices import DeviceState
from .injection import RECORD_UID, Injector, NriAllocator, grant_records_dir
from .kube import Kube
from hami.node.mig import MigManager, PodRef
from .register import KEEP, Registrar
from .server import PluginServer
from .static_mig import StaticMigResource, StaticMigService

log = logging.getLogger(__name__)
#: how long a starting plugin keeps the node's hami.io/node-injection while its NRI hook registers
NRI_START_GRACE_S = 15.0

#: how long the allocate mode's start-up check of NRI grant records may read the node's pods
NRI_RECORDS_READ_S = 10.0

# the shutdown writes (node lock release, node declarations withdrawn) together, at most: well
# inside the 30 s a pod is given between SIGTERM and the kill
SHUTDOWN_WRITES_S = 20.0


class NodeAgent:
    def __init__(
        self,
        kube: Kube,
        settings: NodeSettings,
        gpus: list[PhysicalGPU],
        plugin_dir: str | Path,
        paths: HookPaths,
        register_interval: float = 30.0,
        poll: float = 1.0,
        legacy_handshake: str = "auto",
        ignored_xids: frozenset[int] | None = IGNORED_XIDS,
        xid_wait_ms: int = 1000,
        pod_watch: bool = True,
        lock_release_delay: float = 1.0,
        cdi: CdiConfig | None = None,
        scores: dict[str, dict[str, int]] | None = None,
        mig: MigManager | None = None,
        mig_interval: float = 5.0,
        static_mig: list[StaticMigResource] | None = None,
        asymmetric: tuple = (),
        injection: str = "allocate",
        nri_socket: str = NRI_SOCKET,
        nri_index: str = "50",
        device_specs: DeviceSpecs | None = None,
    ) -> None:
        self.asymmetric = tuple(asymmetric)  # GPU pairs whose NVLink counts disagree (topology.py)
        self.kube = kube
        self.mig = mig
        self.mig_interval = mig_interval
        self.pod_watch = pod_watch
        self.state = DeviceState(gpus, settings, scores)
        self.paths = paths
        self.allocator: Allocator | NriAllocator = Allocator(
            kube,
            settings,
            paths,
            release_delay=lock_release_delay,
            cdi=cdi,
            mig=mig,
            gpus=self.state.uuids,
            healthy=self.state.healthy,
            device_specs=device_specs,
        )
        self.registrar = Registrar(
            kube,
            self.state,
            interval=register_interval,
            handoff=lock_release_delay > 0,
            legacy_handshake=legacy_handshake,
        )
        #: --injection=nri: the runtime's NRI hook gives containers their grants (injection.py)
        self.nri: NriPlugin | None = None
        if injection == "nri":
            self.allocator = NriAllocator(paths)
            # (the devices' health too: a GPU with a fatal XID is refused at a pod's first creation,
            # as Allocate refuses it in the lock mode)
            self.injector = Injector(kube, settings, paths, gpus=self.state.uuids, healthy=self.state.healthy)
            self.nri = NriPlugin(self.injector, socket=nri_socket, index=nri_index, on_ready=self._injection_ready)
            # A plugin restarting (an upgrade, a crash) finds the node saying nri from its
            # predecessor; withdrawing it at start and writing it again a second later, once the
            # hook has registered, had the scheduler bind with the node lock in between (the
            # real-node kill-mid-burst test). It is kept for NRI_START_GRACE_S, or until the hook
            # says how it is; a hook that has not registered by then has the node withdraw it.
            self.registrar.injection = KEEP
        self.server = PluginServer(plugin_dir, self.state, self.allocator, poll=poll)
        #: migstrategy mixed: one more plugin server per nvidia.com/mig-<profile> resource
        self.static_mig = list(static_mig or ())
        self.mig_servers = [
            PluginServer(plugin_dir, r, None, poll=poll, service=StaticMigService(r, paths.driver_mounts, device_specs))
            for r in self.static_mig
        ]
        self.ignored_xids = ignored_xids
        self.xid_wait_ms = xid_wait_ms
        self._tasks: list[asyncio.Task] = []
        self._grace: asyncio.Task | None = None  # the NRI hook's grace (_injection_grace)
        self._watcher: XidWatcher | None = None

    def _start_watcher(self) -> None:
        if self.ignored_xids is None:
            log.warning("health checks disabled by DP_DISABLE_HEALTHCHECKS")
            return
        loop = asyncio.get_running_loop()

        mig = self.static_mig

        async def mark(uuids: list[str]) -> None:
            await self.state.mark_unhealthy(uuids)
            for r in mig:  # migstrategy mixed: the instances on a faulty GPU in MIG mode
                await r.mark_unhealthy(uuids)

        def report(uuids: list[str]) -> None:
            asyncio.run_coroutine_threadsafe(mark(uuids), loop)

        watched = list(dict.fromkeys([*self.state.uuids, *(g for r in mig for g in r.gpu_uuids)]))
        self._watcher = XidWatcher(watched, report, self.ignored_xids, self.xid_wait_ms)
        self._watcher.start()

    async def _recover_mig(self) -> None:
        """Before the kubelet can call Allocate: undo what a killed predecessor left half made,
        adopt instances live pods name, destroy the rest (mig.py). A GPU that a live pod holds
        through HAMi's legacy MIG grant (``<GPU UUID>[<template>-<slot>]`` in
        ``hami.io/vgpu-devices-allocated``, written before ``hami.io/vgpu-mig-allocations``) keeps
        every instance on it: which one is the pod's cannot be told. The manager remembers those
        GPUs; the clean-up loop (``Allocator.collect_mig``) destroys what nobody claims there once
        no live pod holds them that way."""
        assert self.mig is not None
        claims: list[tuple[PodRef, MigAllocation]] = []
        legacy: dict[str, list[str]] = {}  # GPU UUID -> "pod ns/name (its grant)"
        known = True
        try:
            claims, legacy = mig_holders(await self.kube.pods_on_node(), self.mig.gpus)
        except Exception as exc:  # noqa: BLE001 - without the pods, keep every instance that exists
            log.error("MIG recovery: cannot list this node's pods (%s); instances nobody claims are kept", exc)
            known = False
        keep = {
            gpu: f"held through HAMi's legacy MIG grant (<GPU UUID>[<template>-<slot>]) by {', '.join(holders)}"
            for gpu, holders in legacy.items()
        }
        for line in await asyncio.to_thread(self.mig.recover, claims, known, keep):
            log.info("MIG recovery: %s", line)

    async def _collect_mig(self) -> None:
        while True:
            await asyncio.sleep(self.mig_interval)
            try:
                await self.allocator.collect_mig()
            except MigError as exc:
                log.error("MIG clean-up failed: %s", exc)
            except Exception as exc:  # noqa: BLE001 - API errors: next round
                log.error("MIG clean-up: %s; retrying in %.0fs", exc, self.mig_interval)

    async def _warn_asymmetric(self) -> None:
        """HAMi's Node Warning event ``AsymmetricGPUP2PLink`` (once per start; best effort: the
        plugin's ServiceAccount needs ``create`` on events)."""
        pairs = ", ".join(f"{a}/{b}" for a, b in self.asymmetric)
        try:
            await self.kube.node_event(
                "Warning",
                "AsymmetricGPUP2PLink",
                f"GPU pairs report different NVLink counts to each other and score 0 for the "
                f"topology-aware policy: {pairs}",
            )
        except Exception as exc:  # noqa: BLE001 - the log line says the same
            log.warning("cannot record the AsymmetricGPUP2PLink event (%s)", exc)

    async def _injection_grace(self) -> None:
        """End a grace (the plugin's start, a hook session that ended): a hook still not
        registered has the node withdraw ``nri``."""
        await asyncio.sleep(NRI_START_GRACE_S)
        if self.registrar.injection == KEEP:
            log.warning("node %s: the NRI hook has not registered in %.0f s", self.kube.node_name, NRI_START_GRACE_S)
            self.registrar.injection = None
            await self._sync_injection()

    def _start_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
        self._grace = asyncio.get_running_loop().create_task(self._injection_grace(), name="hami-nri-grace")

    async def _injection_ready(self, ready: bool) -> None:
        """The NRI hook registered and synchronized: the node says ``nri``. Its session ended (a
        containerd restart, this plugin stopping): the node keeps what it says for
        NRI_START_GRACE_S, and says nothing once that passes with no hook. The lock a scheduler
        takes on a node without ``nri`` is no use to this plugin's Allocate, and withdrawing the
        annotation for the second until the hook was back had the scheduler bind with the lock
        (the real-node kill and reboot tests)."""
        if ready:
            if self._grace is not None:
                self._grace.cancel()
                self._grace = None
            self.registrar.injection = "nri"
        else:
            # KEEP writes nothing of hami.io/node-injection: no API server round trip (the
            # registration loop writes the rest); the grace's end writes what it must
            self.registrar.injection = KEEP
            self._start_grace()
            return
        await self._sync_injection()

    async def _sync_injection(self) -> None:
        try:
            await self.registrar.sync_once()
        except Exception as exc:  # noqa: BLE001 - the registration loop writes it on its next round
            log.error("node %s: %s not updated: %s", self.kube.node_name, NODE_INJECTION, exc)

    async def _warn_nri_grants(self) -> None:
        """``--injection=allocate`` on a node that ran ``nri``: the pods the NRI hook served
        (its grant records) hold the kubelet's stored Allocate answer of that mode, the
        ``pending`` marker; restarted, their containers get no GPU, no hook serving them now.
        Said once at start, naming them: they must be recreated (docs/nri.md). Found by review,
        1 Dec."""
        directory = grant_records_dir(self.paths)
        try:
            uids = sorted(n for n in os.listdir(directory) if RECORD_UID.fullmatch(n))
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("NRI grant records in %s not listed (%s): not checked", directory, exc)
            return
        if not uids:
            return
        try:
            async with asyncio.timeout(NRI_RECORDS_READ_S):
                live = {p.uid: p.ref for p in await self.kube.pods_on_node() if p.phase not in ("Succeeded", "Failed")}
            named = [f"{live[u]} (uid {u})" for u in uids if u in live]
        except Exception as exc:  # noqa: BLE001 - the uids name them then
            log.warning(
                "node %s: its pods not listed (%s); NRI grant records named by pod uid", self.kube.node_name, exc
            )
            named = [f"uid {u}" for u in uids]
        if not named:  # records of pods gone (the hook forgets them at its next synchronization)
            log.info("NRI grant records in %s name no pod of this node any more", directory)
            return
        log.warning(
            "node %s: --injection is allocate, but %d pod(s) were admitted while it was nri (grant records in %s): "
            "%s. The kubelet keeps the nri mode's Allocate answer for them (%s=%s): a container of theirs that "
            "restarts gets no GPU now that no NRI hook serves it. Recreate these pods (docs/nri.md, switching back)",
            self.kube.node_name,
            len(named),
            directory,
            ", ".join(named),
            contract.NRI_INJECTION,
            contract.NRI_PENDING,
        )

    async def start(self) -> None:
        prepare_hook_dir(self.paths)
        if self.nri is None:
            await self._warn_nri_grants()
        if self.mig is not None:
            await self._recover_mig()
        try:  # the node says what it has before the kubelet is told; the loop retries on error
            await self.registrar.sync_once()
        except Exception as exc:  # noqa: BLE001 - logged, retried by Registrar.run
            log.error("first registration write failed: %s", exc)
        if self.asymmetric:
            await self._warn_asymmetric()
        try:  # a lock a killed predecessor left for the handoff (the scheduler would reclaim it too)
            await self.allocator.reclaim_finished_lock()
        except Exception as exc:  # noqa: BLE001 - logged; the scheduler reclaims a finished owner's lock
            log.error("node lock check at start-up failed: %s", exc)
        self._start_watcher()
        self._tasks = [
            asyncio.create_task(self.registrar.run(), name="hami-registrar"),
            asyncio.create_task(self.server.run(), name="hami-grpc"),
            *(asyncio.create_task(s.run(), name=f"hami-grpc-{s.settings.resource_name}") for s in self.mig_servers),
        ]
        if self.mig is not None:
            self._tasks.append(asyncio.create_task(self._collect_mig(), name="hami-mig-collect"))
        if self.nri is not None:
            self._tasks.append(asyncio.create_task(self.nri.run(), name="hami-nri"))
            self._start_grace()
        if self.pod_watch:  # this node's pods, so Allocate can often skip reading the pod (allocate.py PodCache)
            self._tasks.append(asyncio.create_task(self.kube.pod_reflector().run(), name="hami-pod-watch"))

    @property
    def tasks(self) -> list[asyncio.Task]:
        """The running background tasks (registration loop, gRPC server); empty before start."""
        return list(self._tasks)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._grace is not None:  # the hook's session ended with the NRI task: no grace left to run
            self._grace.cancel()
            self._grace = None
        # a plugin that replaces this one (HAMi's, which releases the lock itself) must not find the
        # scheduler swapping over its locks: that declaration goes. hami.io/node-injection stays: the
        # next plugin keeps it while its hook registers, or withdraws it (its grace, or its first
        # write in lock mode); withdrawn here, the scheduler bound with the lock in the gap
        withdraw = {LOCK_HANDOFF: None} if self.registrar.handoff else {}

        async def release() -> None:
            try:
                await self.allocator.flush()  # a node lock left for the handoff goes now
            except Exception as exc:  # noqa: BLE001 - shutting down; the scheduler reclaims finished owners' locks
                log.error("node lock not released at shutdown: %s", exc)

        async def unmark() -> None:
            if self.nri is not None:
                await self.injector.drain()  # the grants' success writes in flight first
            if not withdraw:
                return
            try:
                await self.kube.patch_node_annotations(withdraw)
            except Exception as exc:  # noqa: BLE001 - shutting down; logged
                log.error("node %s: %s not withdrawn at shutdown: %s", self.kube.node_name, ", ".join(withdraw), exc)

        # side by side and bounded as a whole: one after the other, each retried for its own budget,
        # they outlasted the pod's 30 s grace with the API server unreachable, and the kill cut them
        try:
            async with asyncio.timeout(SHUTDOWN_WRITES_S):
                await asyncio.gather(release(), unmark())
        except TimeoutError:
            log.error(
                "node %s: shutdown writes not done within %gs (API server unreachable?): %s left as they were",
                self.kube.node_name,
                SHUTDOWN_WRITES_S,
                ", ".join(["the node lock", *withdraw]),
            )
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.stop)
            self._watcher = None
