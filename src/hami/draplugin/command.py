"""``hami dra``: the node agent of the DRA driver ``gpu.hami.io`` (or, with ``--dry-run``, what it
would publish). Parses flags and wires the parts: NVML discovery, the slice publisher, the kubelet
plugin, health, the sweep of claims the kubelet never unprepared, the metrics listener. See
docs/dra.md."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Awaitable, Callable

import orjson

from hami import malloc
from hami.config import read_device_config_file
from hami.core.errors import ConfigError
from hami.core.names import DEVICE_CORDON
from hami.dra.model import (
    GpuMig,
    SliceSettings,
    StaticInstance,
    cordoned_gpus,
    device_classes,
    gpu_device_name,
    mig_devices,
    mig_profiles_of,
    resource_slices,
    slice_name,
)
from hami.kube.reflector import Reflector
from hami.node import contract, flags, nvml
from hami.node.layout import UnsafeDirectoryError, prepare_hook_dir
from hami.node.nvml import NvmlUnavailable, XidWatcher, close_nvml, discover, ignored_xids, open_nvml
from hami.node.settings import NodeConfigError, NodeSettings, check_node_config, load_settings

from .names import NamesError, keep_names
from .prepare import Paths

log = logging.getLogger("hami.dra")
EXIT_CONFIG, EXIT_NVML = 2, 3
EXIT_PLUGIN_DIR = 4  # a kubelet plugin directory removed under the agent: restarted with fresh mounts
DEFAULT_SWEEP = "5m"
DEFAULT_SWEEP_GRACE = "1m"
REPUBLISH_RETRY_S = 1.0  # the first retry of a failed ResourceSlice republish; doubled up to the next
REPUBLISH_RETRY_MAX_S = 60.0
#: the least time between two republishes an application XID note asks for (13, 31, 43, 45: a
#: faulting kernel of a tenant's, as often as it likes); a fatal XID's mark is never held back
NOTE_REPUBLISH_S = 10.0


class Pacer:
    """``signal`` (from any thread) calls ``fire`` at once when it last did ``interval`` seconds
    ago or more, else once when that much time has passed: a burst of signals costs one call
    now and one at the end of the window, however many came (each call a ResourceSlice write
    that every slice watcher of the cluster reacts to; found by review)."""

    def __init__(self, interval: float, fire: Callable[[], None]) -> None:
        self.interval, self.fire, self._clock = interval, fire, time.monotonic
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._timer: Any = None

    def signal(self) -> None:
        with self._lock:
            wait = self._last + self.interval - self._clock()
            if wait <= 0:
                self._last = self._clock()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._late)
                self._timer.daemon = True
                self._timer.start()
                return
            else:
                return  # (the timer already set calls it at the window's end)
        self.fire()

    def _late(self) -> None:
        with self._lock:
            self._timer = None
            self._last = self._clock()
        self.fire()


class UsageError(ValueError):
    """A flag's value is wrong; the message names the flag and the value."""


def parse_bind(text: str, flag: str = "--metrics-bind-address") -> tuple[str, int] | None:
    """``host:port`` or ``:port`` (every address); "" is None (no listener)."""
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f'{flag}: invalid address {text!r} (use host:port or :port, or "" for none)')
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_interval(text: str, flag: str = "--sweep-interval") -> float:
    """``30s``, ``5m``, ``1h``, ``1h30m`` or plain seconds; 0 turns it off."""
    t = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", t)
    if not t or not m or not any(m.groups()):
        raise UsageError(f"{flag}: invalid duration {text!r} (use e.g. 30s, 5m, 1h; 0 turns it off)")
    h, mi, sec = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mi * 60 + sec


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_node_flags(p)
    p.add_argument(
        "--mig-strategy",
        default=os.environ.get("MIG_STRATEGY"),
        choices=("none", "mixed"),
        help="static MIG: 'mixed' publishes the MIG instances that exist on GPUs in MIG mode as devices "
        "(class mig.gpu.hami.io; env MIG_STRATEGY; overrides config.json migstrategy; default none)",
    )
    p.add_argument(
        "--kubelet-dir",
        default="/var/lib/kubelet",
        help="the kubelet's root: plugins_registry/ and plugins/ are under it (default %(default)s)",
    )
    p.add_argument("--state-dir", default="/var/lib/hami-dra", help="where the checkpoint lives (default %(default)s)")
    p.add_argument("--cdi-dir", default="/var/run/cdi", help="where CDI specs are written (default %(default)s)")
    p.add_argument(
        "--default-cores", type=int, default=0, help="cores a share takes when it asks for none (HAMi's defaultCores)"
    )
    p.add_argument(
        "--min-memory", type=int, default=1, metavar="MIB", help="the smallest memory share, MiB (default 1)"
    )
    p.add_argument("--apply-classes", action="store_true", help="also create or update the DeviceClasses")
    p.add_argument(
        "--extended-resource-name",
        default="",
        help="with --apply-classes: map this extended resource (e.g. nvidia.com/gpu) to the share class (KEP-5004)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the ResourceSlice and DeviceClasses, then exit")
    p.add_argument(
        "--explain",
        metavar="NAMESPACE/POD",
        default="",
        help="print what each gpu.hami.io GPU holds and, for the pod's unallocated claims, why they do not "
        "fit there; reads the cluster (--kubeconfig), needs no node, NVML or --node-name",
    )
    p.add_argument(
        "--metrics-bind-address",
        default="",
        help="serve the agent's prepare/unprepare/sweep metrics on host:port or :port, e.g. :9396 "
        "(default: no listener)",
    )
    p.add_argument(
        "--sweep-interval",
        default=DEFAULT_SWEEP,
        help="how often prepared claims are checked against the API server and the gone ones "
        "unprepared (e.g. 30s, 5m; 0 turns it off; default %(default)s)",
    )
    p.add_argument(
        "--sweep-grace",
        default=DEFAULT_SWEEP_GRACE,
        help="a claim the API server no longer has is unprepared by a later sweep that finds it still "
        "gone at least this long after the first (the kubelet's chance first; 0: at once; default %(default)s)",
    )
    p.add_argument(
        "--unhealthy-taint",
        default="NoSchedule",
        choices=("NoSchedule", "NoExecute", "none"),
        help="the device taint of a GPU a fatal XID marked unhealthy: NoSchedule keeps new claims off it, "
        "NoExecute also evicts the pods using it, none leaves the GPU out of the slice (default %(default)s)",
    )
    p.add_argument(
        "--health-recovery",
        default="0",
        help="a GPU marked unhealthy is healthy again (its taint removed) once this long has passed "
        "since its last fatal XID and NVML still answers for it, e.g. 10m; a non-fatal XID's "
        "informational taint goes this long after the GPU's last one; 0: only when the node reboots "
        "(marks outlive a restart of the agent: <state-dir>/health.json) (default %(default)s)",
    )
    p.add_argument("-v", "--verbose", action="count", default=0)


def slice_settings(
    settings: NodeSettings,
    args: argparse.Namespace,
    driver_version: str = "",
    mig_capable: frozenset[str] = frozenset(),
) -> SliceSettings:
    return SliceSettings(
        split_count=settings.device_split_count,
        memory_scaling=settings.device_memory_scaling,
        core_scaling=settings.device_core_scaling,
        default_cores=args.default_cores,
        min_memory_mib=args.min_memory,
        driver_version=driver_version,
        mig_capable=mig_capable,
    )


def _nvml_answers(uuid: str) -> bool:
    """The health probe: NVML still finds the GPU and answers about it."""
    try:
        nvml.minor_number(uuid)
    except Exception as exc:  # NVMLError of any kind: not back
        log.info("GPU %s: NVML does not answer (%s)", uuid, exc)
        return False
    return True


def _nvml_facts(uuids: list[str]) -> tuple[str, frozenset[str]]:
    return nvml.driver_version(), nvml.mig_capable(uuids)


def mig_layout(settings: NodeSettings, gpus: list) -> dict[str, GpuMig]:
    """The node's GPUs in MIG mode, as the extender path reads them: ``operatingmode: mig``
    (dynamic: the profiles discovery registered, allowlist applied) or ``migstrategy: mixed``
    (static: the instances that exist on GPUs in MIG mode). Raises ValueError naming the key
    when both are set, as the device plugin refuses it."""
    if settings.operating_mode == "mig" and settings.mig_strategy == "mixed":
        raise ValueError(
            "migstrategy 'mixed' cannot be combined with operatingmode 'mig' (dynamic MIG makes and "
            "destroys the instances itself); use one of them"
        )
    if settings.operating_mode == "mig":
        return {g.uuid: GpuMig(True, mig_profiles_of(g.mig_profiles)) for g in gpus if g.mig_profiles}
    if settings.mig_strategy != "mixed":
        return {}
    out = {}
    mig = nvml.MigNvml()
    for g in gpus:
        if not nvml.mig_enabled(g.uuid):
            continue
        profiles = {
            p.name: p for p in nvml.registered_profiles(mig.profiles(g.uuid), g.model, ((("",), ()),))
        }  # every profile (an allowlist entry without profiles keeps all): the cores of each
        instances = tuple(
            StaticInstance(
                i.gi,
                i.profile,
                i.start,
                i.size,
                i.mig_uuid,
                profiles[i.profile].memory_mb if i.profile in profiles else 0,
                profiles[i.profile].core if i.profile in profiles else 0,
            )
            for i in mig.instances(g.uuid)
            if i.mig_uuid
        )
        out[g.uuid] = GpuMig(False, instances=instances)
    return out


def _prepare_node(driver, paths: Paths, boot_id_file: Path, boot_id: str) -> bool:
    """Start-up work before the kubelet can call (no prepare races it): MIG left half done, the
    regions of a previous boot, and the host files every claim's CDI spec mounts (ld.so.preload
    naming libvgpu and the lock directory, as the device plugin prepares them: a DRA-only node has
    no device plugin). False, logged, when a mount source cannot exist."""
    for line in driver.recover_mig():
        log.info("MIG at start-up: %s", line)
    for line in driver.reset_regions_after_boot(boot_id_file, boot_id):
        log.info("start-up: %s", line)
    for line in driver.refresh_records():
        log.info("start-up: %s", line)
    for line in driver.sweep_remains():
        log.info("start-up: %s", line)
    try:
        prepare_hook_dir(paths)
    except UnsafeDirectoryError as exc:  # a host directory planted to be followed (node/layout.py)
        log.error("refusing to start: %s", exc)
        return False
    missing = [p for p in (paths.preload_file, paths.lock_dir) if not os.path.exists(p)]
    if missing:  # every claim's container would fail to start on the missing mount source
        log.error("cannot serve claims: %s missing (is %s writable?)", ", ".join(missing), paths.vgpu_dir)
        return False
    return True


async def republish_on_change(
    stop: asyncio.Event, changed: asyncio.Event, book: Any, feed: Any, publish: Callable[[], Awaitable[None]]
) -> None:
    """Publish the node's ResourceSlice again whenever ``changed`` is set (a health mark, an XID
    note, the slice deleted under us) or ``book`` heals or forgets a GPU, until ``stop``. A publish
    that fails (an API error, no answer) is tried again after 1 s, doubling up to 60 s, whatever
    else happens meanwhile: a GPU just marked unhealthy must not stay published as healthy."""
    retry: float | None = None  # seconds until a failed publish is tried again
    while not stop.is_set():
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(changed.wait())]
        due = book.due()
        timeout = retry if due is None else due if retry is None else min(due, retry)
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        if stop.is_set():
            return
        # off the loop: the probe asks NVML about a GPU that just failed (a call that can stall)
        # and a change is written to health.json with an fsync
        healed, forgotten = await asyncio.to_thread(lambda: (book.recover(), book.forget()))
        if healed or forgotten:  # GPUs healthy again, or XIDs old enough: their taints go
            changed.set()
        if not changed.is_set() and retry is None:
            continue
        changed.clear()
        await feed.changed()  # the kubelet's health stream (KEP-4680) first: no API call
        try:
            await publish()
        except Exception as exc:  # noqa: BLE001 - logged, and tried again: never dropped
            retry = min(2 * retry, REPUBLISH_RETRY_MAX_S) if retry else REPUBLISH_RETRY_S
            log.error("republishing the ResourceSlice failed (trying again in %gs): %s", retry, exc)
        else:
            retry = None


async def _serve(
    args: argparse.Namespace,
    settings: NodeSettings,
    gpus: list,
    s: SliceSettings,
    mig: dict[str, GpuMig] | None = None,
) -> int:
    from hami.kube.client import KubeClient, until_answered

    from .checkpoint import Checkpoint, CheckpointError, HealthRecord
    from .health import HealthBook, HealthFeed
    from .metrics import DriverMetrics
    from .plugin import Driver, PluginServer, read_boot_id, socket_paths
    from .publisher import GarbledAnswer, apply_device_classes, publish_slice
    from .sweep import sweep_loop

    mig = mig or {}

    try:  # before anything is published: a damaged record is left as it is, for someone to look at
        checkpoint = Checkpoint(Path(args.state_dir) / "checkpoint.json")
    except CheckpointError as exc:
        print(f"hami dra: refusing to start: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    kube = await KubeClient.connect(args.kubeconfig)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    book = HealthBook(args.health_recovery_seconds, _nvml_answers)
    # the GPUs marked unhealthy before a restart stay so (published tainted from the first
    # publish on) until they recover by the same rule as at run time; a reboot resets them
    record, boot = HealthRecord(Path(args.state_dir) / "health.json"), read_boot_id()
    book.restore(*record.load(boot))
    book.saved = lambda marks, notes: record.save(boot, marks, notes)
    # what this cluster keeps of a slice: once it refused the XID taints (before 1.35) or dropped
    # device taints (the feature off), later publishes leave them out from the start. Whether it
    # keeps device taints is not known at a start ("taints" None): a slice with taints is tried
    # as a dry run first, so that a cluster dropping them never stores an unhealthy or cordoned
    # GPU untainted, not even for the moment between a start's first publish and its fallback
    # (found by review, 1 Dec)
    kept: dict[str, Any] = {
        "taint": None if args.unhealthy_taint == "none" else args.unhealthy_taint,
        "notes": True,
        "taints": None,
    }
    changed = asyncio.Event()
    cordons = CordonKeeper(args.node_name, changed)

    def fell_back(what: str) -> None:
        if what == "taints":
            kept["taint"] = None
            kept["taints"] = False
        kept["notes"] = False

    def taints_kept() -> None:  # a publish showed it: no dry run from now on
        kept["taints"] = True

    async def publish() -> None:
        notes = book.notes() if kept["notes"] else None
        await publish_slice(
            kube,
            args.node_name,
            gpus,
            s,
            book.unhealthy(),
            cordons.uid,  # the Node's UID as last seen (a Node made again has another)
            kept["taint"],
            mig,
            notes,
            fell_back,
            cordons.cordoned,
            kept["taints"],
            taints_kept,
        )

    async def first_publish() -> bool:
        if args.apply_classes:
            await apply_device_classes(kube, args.extended_resource_name or None)
        try:
            node = await kube.get(f"/api/v1/nodes/{args.node_name}")
        except orjson.JSONDecodeError as exc:  # a proxy's page while the server restarts: waited out
            raise GarbledAnswer(f"Node {args.node_name}: the answer is not JSON ({exc})") from None
        if not isinstance(node, dict) or not isinstance(node.get("metadata"), dict):
            raise GarbledAnswer(f"Node {args.node_name}: the answer is no Node")
        cordons.read(node)
        changed.clear()  # the first publish below has the cordons read
        await publish()
        return True

    try:
        # an API server not there yet (a control plane restarting with the nodes) is waited for,
        # and said so, rather than a traceback and the kubelet's crash-loop back-off, which kept
        # the agent away minutes after the server was back; the kubelet plugin is not registered
        # meanwhile, so no claim is prepared on a node whose slice is not published
        if not await until_answered(kube, first_publish, f"Node {args.node_name} and its ResourceSlice", stop, log):
            return 0  # stopped while waiting

        async def read_claim(namespace: str, name: str) -> dict:
            return await kube.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")

        paths = Paths(
            hook_path=args.hook_path,
            lock_dir=args.lock_dir,
            driver_mounts=tuple(args.driver_mount),
            cdi_dir=args.cdi_dir,
        )
        driver = Driver(
            args.node_name,
            gpus,
            s,
            checkpoint,
            read_claim,
            paths,
            contract.options(settings),
            DriverMetrics(),
            mig_devices(gpus, mig),
            _mig_manager(args, mig),
        )
        if not _prepare_node(driver, paths, Path(args.state_dir) / "boot_id", boot):
            return EXIT_CONFIG
        metrics_runner = None
        if args.bind is not None:
            try:
                metrics_runner = await driver.metrics.serve(*args.bind)
                log.info("serving metrics on %s:%d/metrics", args.bind[0], metrics_runner.addresses[0][1])
            except OSError as exc:  # the plugin matters more than its metrics: go on without them
                log.error("cannot serve metrics on %s:%d: %s; going on without metrics", *args.bind, exc)
        feed = HealthFeed(
            book,
            [(args.node_name, gpu_device_name(g), g.uuid) for g in gpus if g.uuid not in mig]
            + [(args.node_name, m.name, m.gpu_uuid) for m in driver.migs.values()],
        )
        server = PluginServer(driver, *socket_paths(args.kubelet_dir), health=feed)
        await server.start()
        # a socket removed under the agent (a kubelet restart cleaning its directories) is served
        # again: the kubelet registers the plugin by its registration socket only
        sockets = asyncio.create_task(watch_sockets(server, stop))
        sweeper = (
            asyncio.create_task(sweep_loop(driver, kube, args.sweep_seconds, stop, args.sweep_grace_seconds))
            if args.sweep_seconds > 0
            else None
        )

        watcher = health_watcher([g.uuid for g in gpus], book, lambda: loop.call_soon_threadsafe(changed.set))
        if watcher:
            watcher.start()
        # the kubelet deletes every ResourceSlice of its node when it starts (and a driver's slices
        # when its plugin stays away): watch ours and publish it again when it is gone
        guard = asyncio.create_task(
            Reflector(
                kube,
                "/apis/resource.k8s.io/v1/resourceslices",
                SliceKeeper(slice_name(args.node_name), changed),
                name="own ResourceSlice",
                field_selector=f"metadata.name={slice_name(args.node_name)}",
            ).run()
        )
        # the operator's cordon (hami.io/device-cordon) on the node's GPUs: watch the Node by name
        # and publish again when the list changes (a 403, RBAC without list/watch on nodes, is
        # logged once: the cordons read at start-up then stay until a restart)
        node_watch = asyncio.create_task(
            Reflector(
                kube,
                "/api/v1/nodes",
                cordons,
                name="own Node",
                field_selector=f"metadata.name={args.node_name}",
                optional=f"changes of {DEVICE_CORDON} are seen only at the agent's start",
            ).run()
        )
        try:
            await republish_on_change(stop, changed, book, feed, publish)
        finally:
            sockets.cancel()
            node_watch.cancel()
            guard.cancel()
            if sweeper:
                sweeper.cancel()
            if watcher:
                watcher.stop()
            await server.stop()
            if metrics_runner is not None:
                await metrics_runner.cleanup()
    finally:
        await kube.close()
    return sockets.result() if sockets.done() and not sockets.cancelled() else 0


async def watch_sockets(server: Any, stop: asyncio.Event) -> int:
    """The plugin server's watch of its sockets (:meth:`PluginServer.watch`) until cancelled. It
    ends by itself only when a plugin directory was removed under the container's mount, where
    nothing served reaches the kubelet any more: logged, ``stop`` set, and the exit status
    :data:`EXIT_PLUGIN_DIR` returned (the kubelet restarts the container with fresh mounts)."""
    from .plugin import PluginDirectoryGone

    try:
        await server.watch()
    except PluginDirectoryGone as exc:
        log.error("%s", exc)
        stop.set()
        return EXIT_PLUGIN_DIR
    return 0


def health_watcher(uuids: list[str], book: Any, changed: Callable[[], None]) -> XidWatcher | None:
    """The agent's XID watcher over ``uuids``, reporting to ``book`` (a HealthBook) and calling
    ``changed`` (from the watcher's thread) after each report; None when DP_DISABLE_HEALTHCHECKS
    turns health checks off. NVML failing marks every GPU, but as a passing mark: kept out of
    health.json, which would otherwise hold every GPU tainted across restarts, until the node
    reboots, for a failure of the watcher itself."""
    ignored = ignored_xids()
    if ignored is None:
        return None

    def on_unhealthy(uuids: list[str]) -> None:
        book.mark(uuids)
        changed()

    def on_failure(uuids: list[str]) -> None:
        book.mark(uuids, lasting=False)
        changed()

    notes = Pacer(NOTE_REPUBLISH_S, changed)

    def on_minor(uuid: str, xid: int) -> None:  # an informational taint, published at a pace
        book.note(uuid, xid)
        notes.signal()

    return XidWatcher(uuids, on_unhealthy, ignored, on_minor=on_minor, on_failure=on_failure)


def _mig_manager(args: argparse.Namespace, mig: dict[str, GpuMig]):
    """The extender path's MIG manager for the GPUs in dynamic MIG mode (None: there are none)."""
    dynamic = [uuid for uuid, m in mig.items() if m.dynamic]
    if not dynamic:
        return None
    from hami.node.mig import Checkpoint as MigCheckpoint, MigManager

    return MigManager(nvml.MigNvml(), MigCheckpoint(Path(args.state_dir) / "mig-checkpoint.json"), dynamic)


class SliceKeeper:
    """Reflector handler for the agent's own slice: sets ``changed`` (publish again) when the
    slice is gone from a list or deleted."""

    def __init__(self, name: str, changed: asyncio.Event) -> None:
        self.name = name
        self.changed = changed

    def replace(self, items: list[dict], resource_version: str | None = None) -> None:
        if not any((i.get("metadata") or {}).get("name") == self.name for i in items):
            log.warning("ResourceSlice %s is missing; publishing it again", self.name)
            self.changed.set()

    def apply(self, event_type: str, obj: dict) -> None:
        if event_type == "DELETED" and (obj.get("metadata") or {}).get("name") == self.name:
            log.warning(
                "ResourceSlice %s was deleted (the kubelet wipes its node's slices when it starts); "
                "publishing it again",
                self.name,
            )
            self.changed.set()


class CordonKeeper:
    """Reflector handler for the agent's own Node: keeps the GPU UUIDs its ``hami.io/device-cordon``
    annotation lists (:func:`hami.dra.model.cordoned_gpus`) and the Node's UID (the owner of the
    node's ResourceSlices), and sets ``changed`` (publish again) when either changes. A list
    without the Node (an API that may not be read: the reflector's optional resource) keeps what
    is known.

    The UID: the agent read it once at its start, so a Node deleted and made again (a new UID)
    under a running agent had its slice published with the old Node as owner, which the garbage
    collector deletes, the agent republishes, and so on for as long as the agent ran (found by
    review, 1 Dec)."""

    def __init__(self, node: str, changed: asyncio.Event) -> None:
        self.node = node
        self.changed = changed
        self.cordoned: frozenset[str] = frozenset()
        self.uid = ""

    def read(self, obj: dict) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("name") != self.node:
            return
        uid = meta.get("uid")
        if isinstance(uid, str) and uid and uid != self.uid:
            if self.uid:
                log.warning(
                    "Node %s was made again (uid %s, was %s); its ResourceSlice follows it", self.node, uid, self.uid
                )
            self.uid = uid
            self.changed.set()
        now = cordoned_gpus(obj)
        if now != self.cordoned:
            log.info("Node %s: cordoned GPUs (%s) now %s", self.node, DEVICE_CORDON, ", ".join(sorted(now)) or "none")
            self.cordoned = now
            self.changed.set()

    def replace(self, items: list[dict], resource_version: str | None = None) -> None:
        for item in items:
            self.read(item)

    def apply(self, event_type: str, obj: dict) -> None:
        if event_type in ("ADDED", "MODIFIED"):
            self.read(obj)


async def _explain(args: argparse.Namespace) -> int:
    from hami.kube.client import KubeClient, KubeError

    from hami.dra.explain import explain_pod

    namespace, _, name = args.explain.partition("/")
    if not namespace or not name:
        print(f"hami dra: --explain: expected NAMESPACE/POD, got {args.explain!r}", file=sys.stderr)
        return EXIT_CONFIG
    kube = await KubeClient.connect(args.kubeconfig)
    api = "/apis/resource.k8s.io/v1"
    try:
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        slices = (await kube.get(f"{api}/resourceslices"))["items"]
        claims = (await kube.get(f"{api}/resourceclaims"))["items"]
        try:  # why a claim could not be created (the webhook's quota refusal): optional
            events = (
                await kube.request(
                    "GET",
                    f"/api/v1/namespaces/{namespace}/events",
                    [("fieldSelector", f"involvedObject.name={name},involvedObject.kind=Pod")],
                )
            )["items"]
        except KubeError as exc:
            log.debug("--explain: the pod's events could not be read: %s", exc)
            events = []
    except KubeError as exc:
        print(f"hami dra: --explain {args.explain}: {exc}", file=sys.stderr)
        return 1
    finally:
        await kube.close()
    print("\n".join(explain_pod(pod, slices, claims, events)))
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose > 1 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.explain:
        return asyncio.run(_explain(args))
    if not args.node_name:
        print("hami dra: --node-name (or env NODE_NAME) is required", file=sys.stderr)
        return EXIT_CONFIG
    try:
        args.bind = parse_bind(args.metrics_bind_address)
        args.sweep_seconds = parse_interval(args.sweep_interval)
        args.sweep_grace_seconds = parse_interval(args.sweep_grace, "--sweep-grace")
        args.health_recovery_seconds = parse_interval(args.health_recovery, "--health-recovery")
    except UsageError as exc:
        print(f"hami dra: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if args.config_file:  # named but missing is refused, as the scheduler refuses it
            read_device_config_file(args.config_file, "--config-file", warn=lambda _: None)
        check_node_config(args.node_config)  # named but missing: refused, as the device plugin does
        settings = load_settings(args.node_name, args.config_file, args.node_config)
    except (ConfigError, NodeConfigError) as exc:
        print(f"hami dra: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.mig_strategy:
        settings = replace(settings, mig_strategy=args.mig_strategy)
    try:
        open_nvml(args.nvml_library)
    except NvmlUnavailable as exc:
        print(f"hami dra: refusing to start: {exc}", file=sys.stderr)
        return EXIT_NVML
    try:
        gpus = discover(settings, args.sysfs_root)
        try:  # each GPU's device names, kept per UUID across restarts (hami.draplugin.names)
            gpus = keep_names(gpus, args.state_dir, write=not args.dry_run)
        except NamesError as exc:
            print(f"hami dra: refusing to start: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        try:
            s = slice_settings(settings, args, *_nvml_facts([g.uuid for g in gpus]))
            mig = mig_layout(settings, gpus)
            if args.dry_run:
                slices = resource_slices(args.node_name, gpus, s, mig=mig)
                print(
                    json.dumps(
                        {
                            "resourceSlice": slices[0],
                            **({"resourceSlices": slices} if len(slices) > 1 else {}),
                            "deviceClasses": device_classes(args.extended_resource_name or None),
                        },
                        indent=2,
                    )
                )
                return 0
        except ValueError as exc:
            print(f"hami dra: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        malloc.tune()  # weeks under churn: see hami.malloc
        return asyncio.run(_serve(args, settings, gpus, s, mig))
    finally:
        close_nvml()
