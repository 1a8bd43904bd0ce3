"""``hami monitor``: export every GPU container's usage on this node as Prometheus metrics.

Flags and environment follow HAMi's vGPUmonitor (reference §7.5): ``HOOK_PATH`` (regions under
``$HOOK_PATH/containers``, and the DRA front end's under ``$HOOK_PATH/claims``), ``NODE_NAME``, ``HAMI_RESYNC_INTERVAL``, ``KUBECONFIG``,
``--metrics-bind-address`` (``:9394``), ``--legacy-metrics``. A refresh loop (``--interval``)
keeps the pod map and removes the regions of pods gone from the node; the feedback loop runs
every ``--interval`` on a timer of its own, so a slow pod list or clean-up never delays it (its
writes renew the leases of the blocks it holds, :func:`hami.monitor.region.lease_for`); metrics
are read at scrape time. Exit codes: 2 bad flags, 3 NVML requested but unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Awaitable, Callable, Mapping

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app

from hami import malloc
from hami.config import flag_bool
from hami.node.layout import HookPaths

from .containers import GoneDirs, printable, remove, scan, scan_claims
from .exporter import MonitorCollector, PodRef, claim_owner, device_key, taken_devices
from .feedback import Reading, Writes, decide, release
from .kube import DEFAULT_PRIORITY, NVIDIA_COUNT, NVIDIA_RESOURCES, PRIORITY_RESOURCE
from .region import LEASE_MAX_S, LEASE_S, LEASE_SLACK_S, RegionError, lease_for, read_region, write_int32

log = logging.getLogger("hami.monitor")
EXIT_USAGE, EXIT_NVML = 2, 3
#: the longest the refresh loop waits for one feedback round (run in a thread of its own); a
#: round still running then is left to finish, and no other starts until it has
FEEDBACK_BOUND_S = 30.0
#: the same for the release at shutdown (which first waits for a round in flight): well within
#: the pod's termination grace period (30 s by default)
RELEASE_BOUND_S = 10.0
_feedback_busy = threading.Lock()
_sweep_busy = threading.Lock()  # the removal of gone pods' directories: one at a time, off the loop
_gone = GoneDirs()
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?$")


class UsageError(ValueError):
    pass


def parse_duration(text: str, flag: str) -> float:
    """Go-style ``5m``, ``30s``, ``1h30m`` or plain seconds -> seconds."""
    t = text.strip()
    try:
        return float(t)
    except ValueError:
        pass
    m = _DURATION.match(t)
    if not t or not m or not any(m.groups()):
        raise UsageError(f"{flag}: invalid duration {text!r} (use e.g. 30s, 5m, 1h)")
    h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mi * 60 + s


def parse_bind(text: str, flag: str = "--metrics-bind-address") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"{flag}: invalid address {text!r} (use host:port or :port)")
    return host.strip("[]") or "0.0.0.0", int(port)


def add_arguments(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--node-name", default=env("NODE_NAME", ""), help="this node (env NODE_NAME)")
    p.add_argument(
        "--hook-path",
        default=env("HOOK_PATH", HookPaths().vgpu_dir),
        help="regions are read from <hook-path>/containers (env HOOK_PATH)",
    )
    p.add_argument("--kubeconfig", default=env("KUBECONFIG"), help="kubeconfig; in-cluster config when unset")
    p.add_argument("--metrics-bind-address", default=":9394", help="where /metrics is served")
    p.add_argument(
        "--legacy-metrics",
        type=flag_bool,
        nargs="?",
        const=True,
        default=False,
        help="also export HAMi's pre-2.5 metric names (bare, or =true/=false as hami scheduler takes it)",
    )
    p.add_argument(
        "--resync-interval",
        default=env("HAMI_RESYNC_INTERVAL", "5m"),
        help="a pod's directory is removed once the pod has been missing from the node's pod list this long, "
        "as this monitor saw it (env HAMI_RESYNC_INTERVAL)",
    )
    p.add_argument("--interval", default="5s", help="refresh and feedback period")
    p.add_argument(
        "--nvml-library", default=env("HAMI_NVML_LIBRARY"), help="libnvidia-ml.so.1 to load (env HAMI_NVML_LIBRARY)"
    )
    p.add_argument("--no-nvml", action="store_true", help="no host GPU metrics (and no drift)")
    p.add_argument(
        "--standalone", action="store_true", help="no API server: label containers by pod UID, never remove directories"
    )
    p.add_argument("--no-feedback", action="store_true", help="do not write the utilisation switch into regions")
    p.add_argument(
        "--priority-blocking",
        action="store_true",
        help="also block low-priority containers whose library cannot expire a block (HAMi-core); "
        "hami's libvgpu is blocked by default, with a lease (see docs/metrics.md)",
    )
    p.add_argument(
        "--priority-resource",
        default=PRIORITY_RESOURCE,
        help="the resource whose limit is a container's priority (the device plugin's resourcePriorityName)",
    )
    p.add_argument(
        "--resource-names",
        default=",".join(sorted(NVIDIA_RESOURCES)),
        help="comma list of the resources a container asks NVIDIA GPUs with (the device plugin's resourceName, "
        "resourceMem, resourceMemPercentage, resourceCores): tell apart an allocation HAMi wrote without its "
        "init containers",
    )
    p.add_argument(
        "--resource-name",
        default=NVIDIA_COUNT,
        help="the resource of --resource-names that counts GPUs (the device plugin's resourceName): a container "
        "asks for GPUs when it is above 0 (added to --resource-names when missing)",
    )
    p.add_argument("--once", action="store_true", help="print the metrics once (text format) and exit")
    p.add_argument("-v", "--verbose", action="count", default=0)


def _check(args: argparse.Namespace) -> None:
    args.resources = frozenset(n.strip() for n in (args.resource_names or "").split(",") if n.strip())
    if not args.resources:
        raise UsageError(f"--resource-names: no resource name in {args.resource_names!r}")
    raw = getattr(args, "resource_name", NVIDIA_COUNT)
    args.count_resource = (raw or "").strip()
    if not args.count_resource:
        raise UsageError(f"--resource-name: no resource name in {raw!r}")
    if "," in args.count_resource or any(ch.isspace() for ch in args.count_resource):
        raise UsageError(f"--resource-name: one resource name expected, got {raw!r}")
    args.resources |= {args.count_resource}  # the count asks, whatever --resource-names lists
    args.resync_s = parse_duration(args.resync_interval, "--resync-interval")
    args.interval_s = parse_duration(args.interval, "--interval")
    if args.interval_s <= 0:
        raise UsageError(f"--interval: must be positive (got {args.interval!r})")
    args.lease_s = lease_for(args.interval_s)
    if not getattr(args, "no_feedback", False) and args.interval_s + LEASE_SLACK_S > args.lease_s:
        log.warning(
            "--interval %s: longer than a priority block's lease can cover (at most %gs, as libvgpu "
            "takes none further than 60 s ahead): a blocked container may run free for up to %gs of "
            "every round; use --interval %gs or less",
            args.interval,
            LEASE_MAX_S,
            args.interval_s + LEASE_SLACK_S - args.lease_s,
            LEASE_MAX_S - LEASE_SLACK_S,
        )
    args.bind = parse_bind(args.metrics_bind_address)
    args.containers_dir = str(Path(args.hook_path) / "containers")
    args.claims_dir = str(Path(args.hook_path) / "claims")  # the DRA front end's regions, one per claim
    if not args.standalone and not args.once and not args.node_name:
        raise UsageError("--node-name (or NODE_NAME) is required unless --standalone")


class PodMap:
    """The latest successful pod list for this node; thread-safe swap."""

    def __init__(self) -> None:
        self._pods: Mapping[str, PodRef] = {}
        self.ok = False

    def get(self) -> Mapping[str, PodRef]:
        return self._pods

    def set(self, pods: Mapping[str, PodRef]) -> None:
        self._pods, self.ok = dict(pods), True


def _host_reader(args: argparse.Namespace):
    if args.no_nvml:
        return None
    from hami.node.nvml import NvmlUnavailable, open_nvml, read_host

    try:
        open_nvml(args.nvml_library)
    except NvmlUnavailable as exc:
        if args.nvml_library:
            raise
        log.warning("%s; host GPU metrics are off", exc)
        return None
    lock = threading.Lock()

    def read():
        with lock:  # scrapes may overlap; NVML handles are not shared between them
            return read_host()

    return read


def build_collector(args: argparse.Namespace, pods: PodMap | None) -> MonitorCollector:
    return MonitorCollector(
        node=args.node_name,
        containers_dir=args.containers_dir,
        pods=None if pods is None else pods.get,
        host=_host_reader(args),
        legacy=args.legacy_metrics,
        claims_dir=args.claims_dir,
    )


def readings(
    containers_dir: str, claims_dir: str | None = None, pods: Mapping[str, PodRef] | None = None
) -> list[tuple[Reading, str]]:
    """Feedback inputs for every valid region (containers' and DRA claims'): ``(reading, layout)``.

    A region is its container's to write, so with a pod map (``pods``; None = standalone, nothing
    to check against) its GPUs and priority are not taken from it: a container's region counts
    only with a grant of its pod on this node (:class:`~.exporter.ContainerGrant`), its UUIDs
    only where granted ("" elsewhere) and its priority is the pod's. A claim's region counts only
    when a pod on the node uses the claim; its priority is the one its configuration set, as the
    driver's record of the claim says (libvgpu's default, 1, when none) and its UUIDs count only where the driver's record of the claim names them (a record
    from an older driver names none: then a GPU some grant on the node names, a container's or
    another claim's, is never the claim's: :func:`~.exporter.taken_devices`). Anything else is
    neither read into the decision nor written."""
    out: list[tuple[Reading, str]] = []
    claims = scan_claims(claims_dir) if claims_dir else []
    taken = taken_devices(pods, claims) if pods is not None else frozenset()
    for d in scan(containers_dir):
        if d.region is None:
            continue
        prio: int | None = None
        allowed: set[str] | None = None
        if pods is not None:
            pod = pods.get(d.pod_uid)
            grant = pod.grant(d.container) if pod is not None else None
            if grant is None:
                continue  # no pod on this node gave this container a GPU: nothing to trust
            prio, allowed = grant.priority, {device_key(u) for u in grant.uuids}
        _add(out, d.region, prio, lambda u, allowed=allowed: allowed is None or device_key(u) in allowed)
    for c in claims:
        if c.region is None:
            continue
        if pods is not None:
            if not c.namespace or claim_owner(c, pods) is None:
                continue
            # the priority the claim's configuration set, from the driver's record (the region's
            # own field is the container's to write)
            prio = DEFAULT_PRIORITY if c.priority is None else c.priority
            if c.devices is not None:  # the driver's record names the claim's GPUs
                given = {device_key(u) for u in c.devices}
                _add(out, c.region, prio, lambda u, given=given: device_key(u) in given)
            else:
                _add(out, c.region, prio, lambda u: device_key(u) not in taken)
        else:
            _add(out, c.region, None, lambda u: True)
    return out


def _add(out: list[tuple[Reading, str]], path: str, priority: int | None, allowed: Callable[[str], bool]) -> None:
    """Append the reading of ``path``: only its ``allowed`` UUIDs, ``priority`` unless None."""
    try:
        r = read_region(path)
    except RegionError:
        return  # already warned about by the exporter
    uuids = tuple(u if u and allowed(u) else "" for u in r.uuids)
    prio = r.priority if priority is None else priority
    # a compute limit on one of its counted devices: HAMi's condition to be active or blocked
    # (feedback module docstring). The region's field is the container's to write, as is its
    # recent_kernel: claiming a limit claims no more than launching does
    limited = any(u and 0 < limit < 100 for u, limit in zip(uuids, r.sm_limits))
    reading = Reading(path, uuids, prio, r.recent_kernel, r.utilization_switch, lease=r.priority_lease, limited=limited)
    out.append((reading, r.layout))


#: (region path, field) -> the error its last write failed with: a failure is warned about once
#: until the write succeeds again or fails otherwise (a region the container made read-only
#: failed every period, two warnings each 5 s for as long as the pod ran)
_write_failures: dict[tuple[str, str], str] = {}


def apply(writes: Mapping[str, Writes], layouts: Mapping[str, str], lease_s: float = LEASE_S) -> None:
    """Write ``writes``; a block is written with a lease of ``lease_s`` (:func:`write_int32`)."""
    for path, w in sorted(writes.items()):
        for field in ("recent_kernel", "utilization_switch"):
            value = getattr(w, field)
            if value is None:
                continue
            try:
                write_int32(path, field, value, layouts.get(path, "v1"), lease_s=lease_s)
            except (OSError, RegionError) as exc:
                said = printable(str(exc))
                if _write_failures.get((path, field)) != said:
                    # the path ends in a name the container may have chosen
                    log.warning(
                        "feedback: cannot write %s of %s: %s (said once until it changes)", field, printable(path), said
                    )
                _write_failures[(path, field)] = said
            else:
                if _write_failures.pop((path, field), None) is not None:
                    log.info("feedback: %s of %s written again", field, printable(path))
    for gone in [k for k in _write_failures if k[0] not in layouts]:  # regions no longer read
        del _write_failures[gone]


def feedback_once(
    containers_dir: str,
    blocking: bool,
    claims_dir: str | None = None,
    pods: Mapping[str, PodRef] | None = None,
    lease_s: float = LEASE_S,
) -> dict[str, Writes]:
    """One feedback period (:func:`readings` for what ``pods`` changes); blocks carry a lease of
    ``lease_s``. Blocking file I/O: the feedback loop runs it in a thread (:func:`_off_loop`)."""
    items = readings(containers_dir, claims_dir, pods)
    writes = decide([r for r, _ in items], blocking=blocking)
    apply(writes, {r.key: lay for r, lay in items}, lease_s)
    return writes


def release_all(containers_dir: str, claims_dir: str | None = None, pods: Mapping[str, PodRef] | None = None) -> None:
    items = readings(containers_dir, claims_dir, pods)
    apply(release([r for r, _ in items]), {r.key: lay for r, lay in items})


def sweep(containers_dir: str, live_uids: set[str], grace_s: float, now: float) -> list[str]:
    """Remove the directories of pods gone from the node for ``grace_s`` (:class:`GoneDirs`).
    A directory holds what the container wrote (any number of files): this runs in a thread."""
    return remove(_gone.due(scan(containers_dir), live_uids, now, grace_s))


async def _off_loop(fn, *args, bound: float, wait: bool = False, busy: threading.Lock = _feedback_busy) -> bool:
    """``fn(*args)`` in a daemon thread, one at a time (``busy``, the feedback's lock unless told), waiting up to
    ``bound`` seconds for it. With a round still running, nothing starts (``wait`` False: the
    next period tries again) or the thread first waits for that round, within the same bound
    (``wait`` True: the release at shutdown, which must not be skipped nor race a round's
    writes). False when ``fn`` did not run or did not finish in time (it is then left to finish:
    a daemon thread never holds up the loop nor the exit)."""
    if not wait and not busy.acquire(blocking=False):
        log.warning("%s: the previous round is still running; skipping this one", fn.__name__)
        return False
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    ran = False

    def work() -> None:
        nonlocal ran
        locked = True if not wait else busy.acquire(timeout=bound)
        try:
            if locked:
                fn(*args)
                ran = True
        except Exception:  # noqa: BLE001 - logged: a failing round must not end silently in its thread
            log.exception("feedback: %s failed", getattr(fn, "__name__", fn))
        finally:
            if locked:
                busy.release()
            try:
                loop.call_soon_threadsafe(done.set)
            except RuntimeError:  # the loop is gone (the monitor is exiting)
                pass

    threading.Thread(target=work, name="hami-monitor-feedback", daemon=True).start()
    try:
        await asyncio.wait_for(done.wait(), timeout=bound)
    except asyncio.TimeoutError:
        log.warning("feedback: %s has not finished after %gs; later rounds wait for it", fn.__name__, bound)
        return False
    return ran


async def _refresh(args: argparse.Namespace, pods: PodMap | None, stop: asyncio.Event) -> None:
    """Until ``stop``: the pod list and the clean-up every ``--interval``, and the feedback loop
    beside them on a timer of its own (:func:`_feedback_loop`). A failure of either ends both."""
    api = None
    if pods is not None:
        from .kube import api_client

        api = await api_client(args.kubeconfig)
    try:
        loops = [asyncio.ensure_future(_pods_loop(args, pods, api, stop))]
        if not args.no_feedback:
            loops.append(asyncio.ensure_future(_feedback_loop(args, pods, stop)))
        try:
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.wait(loops)
        for task in done:
            task.result()  # a failure other than the API's ends the monitor's loops as before
    finally:
        if api is not None:
            await api.close()


async def _pause(seconds: float, stop: asyncio.Event) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass


async def _pods_loop(args: argparse.Namespace, pods: PodMap | None, api, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await _unless_stopped(_refresh_once(args, pods, api, feedback=False), stop)
        await _pause(args.interval_s, stop)


async def _feedback_loop(args: argparse.Namespace, pods: PodMap | None, stop: asyncio.Event) -> None:
    """A feedback round every ``--interval``, whatever the pod list and the clean-up take: each
    round renews the leases of the blocks it holds, and the lease covers two periods
    (:func:`~hami.monitor.region.lease_for`). In the refresh round, after a pod list that may wait
    10 s and a clean-up that may wait 30 s, renewals came further apart than the fixed 15 s lease
    and blocked containers ran free between them (found by review, 1 Dec). Until the first pod
    list has come, it looks again every half second at most. A round that hangs (its thread
    bounded by FEEDBACK_BOUND_S) holds up the next ones, and the leases lapse: a monitor that
    cannot decide keeps nobody blocked."""
    while not stop.is_set():
        listed = pods is None or pods.ok
        if listed:
            await _unless_stopped(_feedback_round(args, pods), stop)
        await _pause(args.interval_s if listed else min(args.interval_s, 0.5), stop)


async def _unless_stopped(round_: Awaitable[None], stop: asyncio.Event) -> None:
    """Run one refresh round, cut short when ``stop`` is set meanwhile: a round waiting on the
    API server (up to kube.API_TIMEOUT_S) must not hold up the shutdown, whose release_all has
    to run within the pod's grace period. Its only waits are on the pod list, so a round cut
    short has removed and written nothing."""
    task = asyncio.ensure_future(round_)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if not task.cancelled():
        task.result()  # a failure other than the API's (handled in the round) ends the loop as before


async def _refresh_once(args: argparse.Namespace, pods: PodMap | None, api, feedback: bool = True) -> None:
    """One round of the pod list and the clean-up, then (``feedback``) one feedback round."""
    if pods is not None:
        from .kube import API_TIMEOUT_S, node_pods

        try:
            pods.set(
                await node_pods(
                    api,
                    args.node_name,
                    getattr(args, "priority_resource", PRIORITY_RESOURCE),
                    getattr(args, "resources", NVIDIA_RESOURCES),
                    getattr(args, "count_resource", NVIDIA_COUNT),
                )
            )
        except Exception as exc:  # API trouble (an error, no answer in time): keep the last map, remove nothing
            reason = f"no answer within {API_TIMEOUT_S:g}s" if isinstance(exc, asyncio.TimeoutError) else exc
            log.warning("cannot list the pods of node %s: %s", args.node_name, reason)
        else:
            live = set(pods.get())
            await _off_loop(
                sweep,
                args.containers_dir,
                live,
                args.resync_s,
                time.monotonic(),
                bound=FEEDBACK_BOUND_S,
                busy=_sweep_busy,
            )
    if feedback:
        await _feedback_round(args, pods)


async def _feedback_round(args: argparse.Namespace, pods: PodMap | None) -> None:
    if args.no_feedback:
        return
    if pods is not None and not pods.ok:
        return  # no pod list yet: no grant to check a region against
    await _off_loop(
        feedback_once,
        args.containers_dir,
        args.priority_blocking,
        args.claims_dir,
        None if pods is None else pods.get(),
        getattr(args, "lease_s", LEASE_S),
        bound=FEEDBACK_BOUND_S,
    )


async def serve_metrics(registry: CollectorRegistry, host: str, port: int, guard=None):
    """prometheus_client's exposition of ``registry`` (on any path, as its own server did) on
    :func:`hami.serve.start`'s listener: the connection cap and limits of every listener."""
    from hami import serve

    return await serve.start(serve.wsgi_application(make_wsgi_app(registry)), host, port, guard=guard, dual_stack=True)


async def _serve(args: argparse.Namespace) -> int:
    pods = None if args.standalone else PodMap()
    registry = CollectorRegistry()
    registry.register(build_collector(args, pods))
    runner = await serve_metrics(registry, *args.bind)
    log.info(
        "serving metrics on %s:%d/metrics (regions under %s)", args.bind[0], runner.addresses[0][1], args.containers_dir
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await _refresh(args, pods, stop)
    finally:
        await runner.cleanup()
        if not args.no_feedback:  # leave no container blocked or unthrottled behind us
            # every region, matched or not: release writes only the region's own safe values
            # (limiter on, not blocked), and a pod gone from the map may still be blocked by us
            await _off_loop(release_all, args.containers_dir, args.claims_dir, bound=RELEASE_BOUND_S, wait=True)
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose > 1 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        _check(args)
        if args.once:
            registry = CollectorRegistry()
            registry.register(build_collector(args, None))
            sys.stdout.write(generate_latest(registry).decode())
            return 0
        malloc.tune()  # weeks under churn: see hami.malloc
        return asyncio.run(_serve(args))
    except UsageError as exc:
        print(f"hami monitor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        from hami.node.nvml import NvmlUnavailable

        if isinstance(exc, NvmlUnavailable):
            print(f"hami monitor: {exc}", file=sys.stderr)
            return EXIT_NVML
        raise
