"""The kubelet plugin of the DRA driver: the DRA v1 gRPC service and the registration service.

:class:`Driver` owns prepare and unprepare (the decisions come from :mod:`hami.draplugin.prepare`, what
must survive a restart from :mod:`hami.draplugin.checkpoint`); :class:`DRAService` and
:class:`RegistrationService` only translate between protobuf and the driver; :class:`PluginServer`
serves both on unix sockets.

Who may call: only the kubelet, which reaches the plugin through two unix sockets that it alone
dials: the registration socket in its ``plugins_registry`` directory and the DRA socket under its
``plugins`` directory. Both sockets are created mode 0600 (root only) in directories that only
root can write; there is no TCP listener. A claim is never trusted from the request: the plugin
reads it from the API server (with RBAC ``get`` on ``resourceclaims``) and checks its UID.

A failure of one claim is reported in that claim's ``error`` field (the kubelet retries); the
RPC itself never fails for a bad claim, and nothing is half-applied: the CDI file is written
before the checkpoint records the claim, and a checkpoint write failure removes the file again.
A claim prepared before is answered from the checkpoint when its allocation is still the one
prepared (the entry's fingerprint, :func:`hami.draplugin.prepare.fingerprint`) or the claim cannot
be read, its CDI file written again when it is missing or is not the recorded spec (truncated,
emptied, replaced), and its region directory and record when they are missing. The grant file in
a region directory that is there is never replaced (the claim's running containers bind-mount it,
and a rename over it unmounts it in them): kept when intact, rewritten in place when its text
differs, and the prepare refused when something else is at its name (:func:`_keep_grant`); so at
a first prepare too (no checkpoint entry: the checkpoint moved away) when the directory is there.
A region directory that is missing is made with its grant before it is at its name
(:func:`_claim_region`). A claim allocated again under its UID (the kubelet never unprepared the
old allocation) is released and prepared anew. Unprepare of a UID without an entry removes what a prepare that died before recording it
left under that UID.

Dynamic MIG devices are made in prepare and destroyed in unprepare by the extender path's
:class:`hami.node.mig.MigManager` and its own checkpoint (one entry per claim UID and
result), which makes each step restart safe: an instance made for a claim whose prepare did not
finish is reused when the kubelet retries (only for the same GPU, profile and placement: a claim
allocated again elsewhere under its UID gets new ones), an unprepare whose instance NVML refuses
to destroy (processes still on it) fails and keeps the claim's record, so that the kubelet tries
it again, and at start-up (:meth:`Driver.recover_mig`) the
interrupted creations are undone and the instances of claims this plugin's checkpoint does not
hold are destroyed.

A node reboot keeps what is on disk: the checkpoint, and the claims' shared regions under the
hook directory (``/usr/local/vgpu``), which still hold the process slots of containers that died
with the machine and, when the power went while a process held it, the region's lock. That lock
is a robust mutex, but only a process that exits hands it on (the kernel marks it owner-dead
then); one whose machine stopped never exits, so the first process of the claim's restarted
containers would wait on it for ever. At start-up (:meth:`Driver.reset_regions_after_boot`),
when the kernel's boot id differs from the one the agent recorded, the region directory of every
prepared claim is emptied before the kubelet can call, and libvgpu makes a fresh region at the
next attach. The claims stay prepared (same checkpoint entry, same CDI spec).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import stat
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

import grpc

from hami.core.codec import MigAllocation
from hami.node.mig import Entry, MigManager, PodRef
from hami.dra.model import DRIVER, GpuLike, MigDevice, SliceSettings
from hami.node.nvml import MigError
from hami.node.cdi import write_document
from hami.node.files import read_small, remove_tree, write_atomic
from hami.node.layout import GRANT_FILE, UnsafeDirectoryError, private_dir, write_grant

from .api import DRA_SERVICE, HEALTH_SERVICE, PLUGIN_TYPE, load
from .health import HealthFeed
from .checkpoint import Checkpoint, CheckpointError
from .metrics import DriverMetrics
from .prepare import (
    Options,
    Paths,
    Plan,
    PrepareError,
    cdi_spec,
    claim_grant,
    claim_record,
    fingerprint,
    for_kubelet,
    plan,
    response_devices,
    same_devices,
)

log = logging.getLogger(__name__)
dra_pb, dra_grpc = load("dra")
reg_pb, reg_grpc = load("registration")
health_pb, health_grpc = load("dra_health")
#: a stream sends the whole snapshot again at least this often, changed or not (the kubelet
#: counts a device whose health is not refreshed for a while as Unknown)
HEALTH_RESEND = 30.0

ClaimReader = Callable[[str, str], Awaitable[Mapping[str, Any]]]
#: a claim UID as the API server makes them (a UUID), or any name safe as one path component
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: the time calls in flight at a stop get to finish: a prepare may wait on the API server or make
#: MIG instances (the pod's termination grace is 30 s)
STOP_GRACE_S = 10.0
#: how often the plugin's sockets are checked (:meth:`PluginServer.check`)
WATCH_S = 1.0
#: a namespace (DNS label) and a claim name (DNS subdomain), as the API server allows them: they
#: go into the path of the API request, where "../" or "?" would make it another request
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
#: where the kernel says which boot this is (a new random UUID at every boot)
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_BOOT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def read_boot_id(path: str | Path = BOOT_ID) -> str:
    """This boot's id; "" when it cannot be read or is not a UUID (no reboot is then detected)."""
    try:
        text = read_small(path, limit=256).decode().strip()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("cannot read the boot id from %s: %s; a reboot will not be detected", path, exc)
        return ""
    return text if _BOOT.fullmatch(text) else ""


class Driver:
    """Prepare/unprepare claims for this node's GPUs. ``read_claim(namespace, name)`` returns the
    claim as the API server has it (raises on a failed read). Every prepare and unprepare is counted
    in ``metrics`` (by default a registry of its own), which also reads the checkpoint's counts."""

    def __init__(
        self,
        node: str,
        gpus: Sequence[GpuLike],
        settings: SliceSettings,
        checkpoint: Checkpoint,
        read_claim: ClaimReader,
        paths: Paths = Paths(),
        options: Options = Options(),
        metrics: DriverMetrics | None = None,
        migs: Mapping[str, MigDevice] | None = None,
        mig: MigManager | None = None,
    ) -> None:
        self.node, self.gpus, self.settings = node, tuple(gpus), settings
        self.migs = dict(migs or {})  # the node's MIG devices by name (hami.dra.model.mig_devices)
        self.mig = mig  # makes and destroys dynamic MIG instances (None: no dynamic MIG here)
        self.checkpoint, self.read_claim, self.paths, self.options = checkpoint, read_claim, paths, options
        # one lock per claim UID while a call uses it (UID -> lock, calls holding or awaiting it)
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        # UID -> the count of the last prepare that answered it (the sweep's check, :meth:`mark`)
        self._answered: dict[str, int] = {}
        self._answers = 0
        self.metrics = metrics if metrics is not None else DriverMetrics()
        self.metrics.track(lambda: checkpoint.counts()[0], lambda: checkpoint.counts()[1])

    @contextlib.asynccontextmanager
    async def _lock(self, uid: str) -> AsyncIterator[None]:
        """Hold claim ``uid``'s lock; the table keeps it only while some call holds or awaits it."""
        lock, users = self._locks.get(uid, (asyncio.Lock(), 0))
        self._locks[uid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[uid]
            if users > 1:
                self._locks[uid] = (lock, users - 1)
            else:
                del self._locks[uid]

    def mark(self, uid: str) -> int:
        """Which prepare answered claim ``uid`` last (0: none since the start); :meth:`release`
        with ``unless_answered_since`` keeps a claim that a later prepare answered."""
        return self._answered.get(uid, 0)

    def _answered_now(self, uid: str) -> None:
        self._answers += 1
        self._answered[uid] = self._answers

    async def prepare(self, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        """The kubelet's Device entries for the claim; raises PrepareError/CheckpointError/OSError."""
        start, ok, reason = time.monotonic(), False, "other"
        try:
            devices = await self._prepare(namespace, name, uid)
            ok = True
            return devices
        except BaseException as exc:
            reason = error_reason(exc)
            raise
        finally:
            self.metrics.observe_prepare(time.monotonic() - start, ok, reason)

    async def _prepare(self, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        if not uid:
            raise PrepareError(f"claim {namespace}/{name}: uid is empty", "invalid_uid")
        if not _UID.fullmatch(uid):  # it names files and a directory: "..", "a/b" must not reach them
            raise PrepareError(f"claim {namespace}/{name}: uid {uid[:80]!r} is not a Kubernetes UID", "invalid_uid")
        if not _NAMESPACE.fullmatch(namespace) or not _NAME.fullmatch(name):
            raise PrepareError(
                f"claim {namespace[:80]!r}/{name[:260]!r} ({uid}): not a Kubernetes namespace and ResourceClaim name",
                "invalid_uid",
            )
        async with self._lock(uid):
            done = self.checkpoint.get(uid)
            try:
                claim = await self.read_claim(namespace, name)
            except Exception as exc:  # a 404, a 403, a timeout: the kubelet retries
                if done is not None and await self._instances_intact(done, uid):  # cannot tell whether it
                    # was allocated again: as recorded
                    log.info("claim %s/%s (%s): cannot read it (%s); answered as prepared", namespace, name, uid, exc)
                    return self._restore(done, uid)
                raise PrepareError(
                    f"ResourceClaim {namespace}/{name}: cannot read it from the API server: {_error(exc)}", "api"
                ) from exc
            meta = claim.get("metadata") if isinstance(claim, Mapping) else None
            got = meta.get("uid") if isinstance(meta, Mapping) else None
            if done is not None:
                stored = done.get("allocation")
                same = got != uid or (  # (another claim by its name now: the sweep's business)
                    stored == fingerprint(claim, self.node)
                    if isinstance(stored, str)
                    else same_devices(done["devices"], claim, self.node)  # an entry from before fingerprints
                )
                if same and await self._instances_intact(done, uid):
                    return self._restore(done, uid)
                if same:  # its dynamic MIG instances did not survive a reboot: made again
                    why = "its MIG instances are gone (a reboot, a GPU reset?)"
                else:  # deallocated and allocated again under its UID, the kubelet never unprepared:
                    # the old allocation's share is free in the scheduler's books, so it is not kept
                    why = "allocated again since it was prepared"
                log.info("claim %s/%s (%s): %s; prepared anew", namespace, name, uid, why)
                await self._release(done, namespace, name, uid, why)
            if got != uid:
                raise PrepareError(
                    f"ResourceClaim {namespace}/{name}: the API server has uid {got!r}, the kubelet "
                    f"asked for {uid!r} (the claim was deleted and re-created)",
                    "recreated",
                )
            p = plan(claim, self.node, self.gpus, self.settings, self.migs)
            made = False
            if any(s.mig is not None and s.mig.dynamic for s in p.shares):
                p = await self._make_mig(p, uid, namespace, name)
                made = True
            try:
                spec = cdi_spec(p, self.paths, self.options)
            except BaseException:
                if made:
                    await self._destroy_mig(uid)
                raise
            cdi = Path(self.paths.cdi_file(uid))
            devices = response_devices(p)
            stamp = fingerprint(claim, self.node)
            made_dir = False
            try:
                if p.isolation == "hami-core":
                    who = f"{namespace}/{name} ({uid})"
                    _private_claims_dir(Path(self.paths.claim_dir(uid)).parent, who)
                    # a directory already there (the checkpoint moved away or lost, dra.stateDir
                    # changed, a prepare that died before recording) may be a running pod's, its
                    # grant mounted: kept, the grant checked in place (regression review, 1 Dec)
                    made_dir = _claim_region(self.paths.claim_dir(uid), claim_grant(spec), who)
                    write_atomic(self.paths.claim_record(uid), json.dumps(claim_record(namespace, name, uid, spec)))
                write_document(spec, cdi)
                self.checkpoint.put(
                    uid,
                    {
                        "namespace": namespace,
                        "name": name,
                        "devices": devices,
                        "cdi_file": str(cdi),
                        "cdi_spec": spec,
                        "claim_dir": self.paths.claim_dir(uid),
                        "allocation": stamp,
                        **({"mig": True} if made else {}),
                    },
                )
            except BaseException:  # nothing half-applied: no record says these files exist
                _remove(cdi)
                if made_dir:  # (one that was there is left: removing it would unmount it in its pods)
                    _remove(Path(self.paths.claim_record(uid)))
                    _remove_tree(Path(self.paths.claim_dir(uid)))
                if made:
                    await self._destroy_mig(uid)
                raise
            self._answered_now(uid)
            log.info(
                "prepared claim %s/%s (%s): %s",
                namespace,
                name,
                uid,
                ", ".join(f"{s.device} {s.memory_mib}MiB {s.cores}%" for s in p.shares),
            )
            return devices

    async def unprepare(self, namespace: str, name: str, uid: str) -> None:
        start, ok, reason = time.monotonic(), False, "other"
        try:
            await self.release(namespace, name, uid)
            ok = True
        except BaseException as exc:
            reason = error_reason(exc)
            raise
        finally:
            self.metrics.observe_unprepare(time.monotonic() - start, ok, reason)

    def _restore(self, done: Mapping[str, Any], uid: str) -> list[dict[str, Any]]:
        """The recorded answer for a claim prepared before, with its files made again where they
        went missing: the region directory and its record (an unprepare that removed them, then
        failed to write the checkpoint, leaves the entry) and the CDI file (gone, as ``/var/run``
        is a tmpfs and the node rebooted, or damaged). All idempotent. The grant file of a region
        directory that is there is checked, never replaced: the claim's running containers mount
        it (:func:`_keep_grant`; a tampered one fails the prepare)."""
        directory = str(done.get("claim_dir") or self.paths.claim_dir(uid))
        edits = [d.get("containerEdits") for d in done["cdi_spec"].get("devices") or () if isinstance(d, Mapping)]
        mounts = [m for e in edits if isinstance(e, Mapping) for m in e.get("mounts") or () if isinstance(m, Mapping)]
        if any(m.get("hostPath") == directory for m in mounts):  # a region: isolation hami-core
            claim = f"{done.get('namespace') or ''}/{done.get('name') or ''} ({uid})"
            grant = os.path.join(directory, GRANT_FILE)
            _private_claims_dir(Path(directory).parent, claim)
            # missing (removed by an unprepare whose checkpoint write failed): nothing of it is
            # mounted anywhere, made as the first prepare makes it. There: the claim's running
            # containers mount the grant file read-only, and renaming a new file over it unmounted
            # it in each of them (found by review, 1 Dec): kept, never replaced; but a spec from
            # before the grant mount mounts no grant: written again, no link or FIFO the containers
            # put at the name followed (found by review, 1 Dec)
            mounted = any(m.get("hostPath") == grant for m in mounts)
            _claim_region(directory, claim_grant(done["cdi_spec"]), claim, mounted)
            self._write_record(done, uid)
        cdi = Path(done["cdi_file"])
        if _read_json(cdi) != done["cdi_spec"]:
            write_document(done["cdi_spec"], cdi)
        self._answered_now(uid)
        return for_kubelet(done["devices"])  # an entry of an older agent: its names made as the kubelet matches them

    def _write_record(self, done: Mapping[str, Any], uid: str) -> bool:
        """Write the monitor's record of a prepared claim where it differs from what this agent
        writes (True when written)."""
        ref = claim_record(done.get("namespace") or "", done.get("name") or "", uid, done["cdi_spec"])
        record = Path(self.paths.claim_record(uid))
        if _read_json(record) == ref:
            return False
        write_atomic(record, json.dumps(ref))
        return True

    def refresh_records(self) -> list[str]:
        """Start-up, before serving: the monitor's record of every prepared claim with a region
        written as this agent writes it. A record an older agent wrote names no GPUs, and the
        monitor then keeps the claim's usage off every GPU another grant names (the region is the
        container's to write), so a claim sharing its GPU with a newer claim went unseen until
        it was prepared again. What was done, as lines."""
        done = []
        for uid in self.checkpoint.uids():
            entry = self.checkpoint.get(uid)
            if entry is None or not _UID.fullmatch(uid):
                continue
            record = Path(self.paths.claim_record(uid))
            if not record.exists():
                continue  # no region (isolation other than hami-core), or released meanwhile
            try:
                if self._write_record(entry, uid):
                    done.append(f"claim {uid}: monitor record written again")
            except (OSError, AttributeError, KeyError, TypeError, ValueError) as exc:
                done.append(f"claim {uid}: cannot write its monitor record again: {exc}")
        return done

    async def release(
        self, namespace: str, name: str, uid: str, why: str = "", unless_answered_since: int | None = None
    ) -> bool:
        """Remove what was prepared for ``uid`` (CDI spec, region directory, checkpoint entry);
        False when nothing was. Unprepare, and the sweep (``why`` says why, for the log; it passes
        ``unless_answered_since``, a :meth:`mark` taken before it read the claim, and a claim a
        prepare answered since is kept). Without an entry, the files a prepare that died before
        recording it may have left are removed all the same (a UID that is one path component only)."""
        async with self._lock(uid):
            entry = self.checkpoint.get(uid)
            if entry is None:
                if _UID.fullmatch(uid):
                    self._remove_files(Path(self.paths.cdi_file(uid)), Path(self.paths.claim_dir(uid)), uid)
                    # a prepare cut short (the kubelet's deadline) may have made instances it never recorded
                    await self._destroy_mig(uid, namespace, name, strict=True)
                return False
            if unless_answered_since is not None and self.mark(uid) != unless_answered_since:
                log.info("claim %s/%s (%s) was prepared again meanwhile; kept", namespace, name, uid)
                return False
            await self._release(entry, namespace, name, uid, why)
        return True

    async def _release(self, entry: Mapping[str, Any], namespace: str, name: str, uid: str, why: str) -> None:
        """Remove ``entry``'s files, dynamic MIG instances and the entry itself (under the UID's lock)."""
        # in a thread: a container may have left millions of files there, and every other claim's
        # prepare, the health stream and the socket watch run on this loop (found by review); a
        # call cancelled meanwhile keeps the claim's lock until the removal is over (a prepare
        # of the claim again must not have its new files removed under it)
        await _off_loop(
            self._remove_files, Path(entry["cdi_file"]), Path(entry.get("claim_dir") or self.paths.claim_dir(uid)), uid
        )
        if entry.get("mig"):  # the instances first: a failure leaves the record for a retry
            await self._destroy_mig(uid, namespace, name, strict=True)
        self.checkpoint.remove(uid)
        self._answered.pop(uid, None)
        log.info("unprepared claim %s/%s (%s)%s", namespace, name, uid, f": {why}" if why else "")

    def _remove_files(self, cdi: Path, directory: Path, uid: str) -> None:
        """The CDI file, the region directory (:func:`_discard_region`: taken from its name at
        once, then removed), what a prepare left of its making (:func:`_claim_region`) and its
        record; what is already gone is no error. Raises OSError when the region directory cannot
        be taken from its name: the unprepare fails and the claim stays prepared, its directory
        whole, for the kubelet's retry."""
        cdi.unlink(missing_ok=True)
        _discard_region(directory)
        _remove_remains(str(directory))
        Path(self.paths.claim_record(uid)).unlink(missing_ok=True)

    def sweep_remains(self) -> list[str]:
        """Start-up, before serving: remove what makings and removals of region directories left
        in ``claims/`` (:func:`_claim_region`, :func:`_discard_region`; the agent was stopped
        meanwhile). What was done, as lines."""
        parent = os.path.dirname(self.paths.claim_dir("x"))
        try:
            with os.scandir(parent) as entries:
                left = [e.path for e in entries if _REMAINS.fullmatch(e.name)]
        except FileNotFoundError:
            return []
        except OSError as exc:
            return [f"cannot look for what region directories left in {parent}: {exc}"]
        for path in left:
            _remove_tree(Path(path))
        return [f"removed {len(left)} unfinished or discarded region directories in {parent}"] if left else []

    async def _make_mig(self, p: Plan, uid: str, namespace: str, name: str) -> Plan:
        """Create (or reuse, on a retry) the claim's dynamic MIG instances; the plan with their UUIDs."""
        if self.mig is None:
            raise PrepareError(f"claim {namespace}/{name}: dynamic MIG devices, but dynamic MIG is off on this node")
        wanted = [
            (i, s.mig) for i, s in enumerate(p.shares) if s.mig is not None and s.mig.dynamic
        ]  # device position = result position: one checkpoint entry each
        allocations = [MigAllocation(0, i, m.gpu_uuid, m.profile, m.start, m.size) for i, m in wanted if m is not None]
        try:
            made = await _off_loop(self.mig.prepare, PodRef(uid, namespace, name), allocations)
        except MigError as exc:
            await self._destroy_mig(uid)  # what this claim got before the failure
            raise PrepareError(f"claim {namespace}/{name}: {exc}", "allocation") from None
        uuids = {a.device: a.mig_uuid for a in made}
        return replace(p, shares=tuple(replace(s, uuid=uuids[i]) if i in uuids else s for i, s in enumerate(p.shares)))

    async def _instances_intact(self, entry: Mapping[str, Any], uid: str) -> bool:
        """A claim prepared with dynamic MIG instances still has them (True without any): they do
        not survive a reboot or a GPU reset, and the recorded answer would name dead devices.
        In a thread: the manager's lock is held while another claim's instances are made."""
        if not entry.get("mig"):
            return True
        return self.mig is not None and await _off_loop(self.mig.intact, uid)

    async def _destroy_mig(self, uid: str, namespace: str = "", name: str = "", strict: bool = False) -> list[str]:
        """Destroy the dynamic MIG instances made for claim ``uid`` (none: nothing to do). In a
        thread, the snapshot too: it waits on the manager's lock, which another claim's creation
        holds for seconds, and on the event loop that stalled every call of the plugin.

        With ``strict`` (unprepare), an instance NVML refuses to destroy (``NVML_ERROR_IN_USE``:
        processes on it) raises :class:`PrepareError` naming it: the caller keeps the claim's
        record and the kubelet retries the unprepare. Before, the manager kept the instance's
        entry, the unprepare answered success and removed the record, nothing tried again, and a
        prepare of the same claim UID allocated elsewhere was handed the old instance (found by
        review, 1 Dec)."""
        if self.mig is None:
            return []
        mig = self.mig

        def collect() -> tuple[list[str], list[Entry]]:
            snap = mig.snapshot()  # instances other claims make from now on are spared
            others = {e.pod_uid for e in list(mig.entries.values())} - {uid}
            done = mig.collect(others, snap)
            return done, mig.held(uid)

        done, left = await _off_loop(collect)
        for line in done:
            log.info("claim %s: %s", uid, line.replace("is gone", "is unprepared"))
        if strict and left:
            # the manager's lines: "pod <ref> is gone: cannot destroy GPU instance N (...) yet (<NVML error>); ..."
            why = [line.split(": ", 1)[-1].split("; tried again")[0] for line in done if "cannot destroy" in line]
            held = ", ".join(
                f"GPU instance {e.gpu_instance_id} ({e.profile} at {e.start}) on {e.gpu_uuid}" for e in left
            )
            raise PrepareError(
                f"claim {namespace}/{name} ({uid}): unprepare not finished, {'; '.join(why) or f'{held} still held'}; "
                "the claim stays prepared and the kubelet tries its unprepare again",
                "allocation",
            )
        return done

    def reset_regions_after_boot(self, record: str | Path, boot_id: str) -> list[str]:
        """Start-up, before serving: when ``record`` names another boot than ``boot_id`` (the node
        rebooted since), empty the region directory of every prepared claim (see the module
        docstring), then record ``boot_id``. Nothing is emptied when the record is missing or not
        a boot id (no sign of a reboot: an agent upgraded under running containers must not pull
        their regions away) or when ``boot_id`` is "". What was done, as lines."""
        if not _BOOT.fullmatch(boot_id):
            return []
        record = Path(record)
        try:
            previous = read_small(record, limit=256).decode().strip()
        except FileNotFoundError:
            previous = ""
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("boot record %s unreadable (%s); written again, no region reset", record, exc)
            previous = ""
        done = []
        if _BOOT.fullmatch(previous) and previous != boot_id:
            for uid in self.checkpoint.uids():
                if not _UID.fullmatch(uid):
                    continue
                directory = Path(self.paths.claim_dir(uid))
                try:
                    entries = list(directory.iterdir()) if directory.is_dir() and not directory.is_symlink() else []
                    # the grant file stays: the claim's containers mount it (prepare wrote it)
                    entries = [e for e in entries if e.name != GRANT_FILE]
                    for item in entries:
                        remove_tree(item)  # (a link is unlinked, never followed)
                except OSError as exc:
                    done.append(f"claim {uid}: cannot reset its shared region after the reboot: {exc}")
                    continue
                if entries:
                    done.append(f"claim {uid}: shared region reset after the reboot ({len(entries)} files removed)")
        if previous != boot_id:
            try:
                write_atomic(record, boot_id + "\n", mode=0o600)
            except OSError as exc:  # the next start may reset the regions again: they are all fresh then
                log.warning("cannot record the boot id: %s", exc)
        return done

    def recover_mig(self) -> list[str]:
        """Start-up, before serving: undo interrupted creations, destroy unclaimed instances, then
        the instances of claims the checkpoint does not hold (prepared but never recorded, or
        unprepared but not destroyed). What was done, as lines."""
        if self.mig is None:
            return []
        done = self.mig.recover()
        done += self.mig.collect(set(self.checkpoint.uids()))
        return done


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a thread: the MIG manager's calls wait on its lock while another claim's
    instances are made (seconds on a GPU), which on the event loop held up every call of the
    plugin, the kubelet's registration and the health stream. A caller cancelled meanwhile (the
    kubelet's deadline, the stop) still waits for the thread before the cancellation goes on: the
    claim's lock (:meth:`Driver._lock`) is not let go while the claim's MIG work still runs."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        while not work.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait((work,))
        failed = None if work.cancelled() else work.exception()  # retrieved: the cancellation is the answer
        if failed is not None:
            log.warning("MIG work finished after its call was cancelled: %s", _error(failed))
        raise


def _remove_tree(directory: Path) -> None:
    """Remove a claim's region directory without following a link: a link in it is removed, not
    what it points to, and a link in its place is unlinked (:func:`hami.node.files.remove_tree`,
    however deep the container nested it). Failures are logged."""
    try:
        remove_tree(directory)
    except OSError as exc:
        log.warning("cannot remove %s: %s", directory, exc)


#: the mode of a claim's grant file (:func:`hami.node.layout.write_grant`)
GRANT_MODE = 0o644


def _private_claims_dir(path: Path, claim: str) -> None:
    """Make ``claims/`` (the parent of the claims' region directories) if missing, and set it
    root's alone (mode 0700; it was 0755). A claim's directory is its containers' to write as any
    UID, root included (a setuid file, a device node); a host user reaching it through ``claims/``
    could run or open what a tenant planted (found by review, 1 Dec). The containers reach their
    own directory through their bind mount, whatever the modes above it, and every node agent
    runs as root. Done by :func:`hami.node.layout.private_dir`; raises :class:`PrepareError`
    naming the claim, the path and why when it is a link, not a directory or another user's."""
    try:
        private_dir(str(path), "the claims' directory")
    except UnsafeDirectoryError as exc:
        raise PrepareError(f"claim {claim}: {exc.strerror}", "io") from None


def _is_dir(path: str, claim: str) -> bool:
    """Whether the claim's region directory is there (False: missing). Raises
    :class:`PrepareError` for anything else at its name (only root writes ``claims/``)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        raise PrepareError(f"claim {claim}: its region directory {path} is {_kind(info)}", "io")
    return True


#: the names a claim's region directory is made under (``claims/.<uid>.tmp-<16 hex digits>``)
#: and taken aside to by an unprepare (``.gone-``): dot names, which no claim UID has and
#: ``hami monitor`` passes over
_MAKING, _GONE = ".tmp-", ".gone-"
_REMAINS = re.compile(r"\..+\.(?:tmp|gone)-[0-9a-f]{16}")


def _beside(directory: str, kind: str) -> str:
    """A new name beside ``directory`` for its making or its removal (``kind``)."""
    parent, name = os.path.split(directory.rstrip("/"))
    return os.path.join(parent, f".{name}{kind}{os.urandom(8).hex()}")


def _remove_remains(directory: str) -> None:
    """Remove what a making (:func:`_claim_region`) or a removal (:func:`_discard_region`) of
    ``directory`` left beside it: the agent died meanwhile, or the removal failed part-way. Best
    effort: a leftover is root's alone, in ``claims/`` (mode 0700), and named as no claim;
    failures are logged."""
    parent, name = os.path.split(directory.rstrip("/"))
    names = re.compile(re.escape(f".{name}") + r"\.(?:tmp|gone)-[0-9a-f]{16}")  # (not another UID's)
    try:
        with os.scandir(parent) as entries:
            left = [e.path for e in entries if names.fullmatch(e.name)]
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("cannot look for unfinished region directories in %s: %s", parent, exc)
        return
    for path in left:
        _remove_tree(Path(path))


def _discard_region(directory: Path) -> None:
    """Take a claim's region directory from its name at once (renamed aside, ``.<uid>.gone-<hex>``
    in ``claims/``), then remove it (:func:`_remove_tree`, failures logged, the rest left for
    :meth:`Driver.sweep_remains`). Removed in place before, a removal that failed part-way (EBUSY,
    EIO deep in a container's tree) had already unlinked the grant file, and the claim's next
    prepare found a directory without its grant and refused it as tampered (regression review, 1
    Dec). Raises OSError when it cannot be renamed (the directory is left whole)."""
    aside = _beside(str(directory), _GONE)
    try:
        os.rename(directory, aside)
    except FileNotFoundError:
        return
    _remove_tree(Path(aside))


def _claim_region(directory: str, text: str, claim: str, mounted: bool = True) -> bool:
    """The claim's region directory ``directory`` with its grant file ``text``; True when it was
    made here (nothing was at its name), False when it was there.

    Missing: made whole before it is at its name, under a name of its own beside it
    (``claims/.<uid>.tmp-<random>``, root's alone as ``claims/`` is 0700) with the grant written
    in it (:func:`hami.node.layout.write_grant`), made world-writable (any UID of the claim's
    containers creates the region in it), then renamed to ``directory``. Made in place before, a
    failed grant write (ENOSPC) or an agent killed between the two left the directory without its
    grant, and every retry was refused as a grant missing from a directory that may be mounted
    (regression review, 1 Dec). A failed making is removed; what a killed agent left is removed at
    the next making of the directory, its unprepare (:func:`_remove_remains`) or the agent's next start
    (:meth:`Driver.sweep_remains`).

    There: ``mounted`` (the claim's containers bind-mount the grant file, as the CDI spec of this
    agent says) checks it in place (:func:`_keep_grant`: kept, rewritten in place, or the prepare
    refused), else it is written again (:func:`~hami.node.layout.write_grant`, which follows no
    link at its name). Anything but a directory at the name raises :class:`PrepareError`
    (:func:`_is_dir`)."""
    if _is_dir(directory, claim):
        if mounted:
            _keep_grant(os.path.join(directory, GRANT_FILE), text, claim)
        else:
            write_grant(directory, text)
        return False
    _remove_remains(directory)
    making = _beside(directory, _MAKING)
    os.mkdir(making, 0o700)
    try:
        write_grant(making, text)
        os.chmod(making, 0o777)  # (by name: claims/ is root's alone, and the directory shown to no one yet)
        os.rename(making, directory)  # (no one but this agent, under the claim's lock, makes the name)
    except BaseException:
        _remove_tree(Path(making))
        raise
    return True


def _kind(info: os.stat_result) -> str:
    mode = info.st_mode
    for test, what in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return what
    return f"a file of type {stat.S_IFMT(mode):#o}"


def _grant_fault(info: os.stat_result) -> str:
    """What makes this file not one the agent wrote as a grant ("" when nothing does)."""
    if not stat.S_ISREG(info.st_mode):
        return _kind(info)
    if info.st_uid != os.geteuid():
        return f"a regular file owned by UID {info.st_uid}, not the agent's {os.geteuid()}"
    if info.st_nlink != 1:
        return f"a regular file with {info.st_nlink} links, not 1"
    return ""


def _keep_grant(grant: str, text: str, claim: str) -> None:
    """Check a prepared claim's grant file in place, without replacing it: the claim's running
    containers bind-mount it read-only at ``<hook>/vgpu/hami-grant.env``, and a file renamed over
    (or unlinked at) a name that is a mount point in another mount namespace unmounts it there
    (Linux 3.18 and later); the same at a first prepare that finds the directory there (the
    checkpoint moved away or lost: regression review, 1 Dec). A repeat prepare (every kubelet restart, then the next sandbox of any
    pod using the claim, which its tenant can start) renamed a new grant over it: the running
    containers lost the mount, libvgpu read their env instead, and the directory (theirs to
    write) let them put a grant or a link of their choice at the name for the next container's
    mount (found by review, 1 Dec).

    - the agent's file (a regular file of the agent's UID with one link), the grant as recorded,
      mode 0644: left as it is (same inode, nothing written);
    - the agent's file with other text (an agent that writes the grant differently, or a change
      written into it) or another mode: rewritten in place through the checked descriptor, the
      same inode (the containers' mounts stay and show the recorded grant); logged as an error;
    - anything else (missing, a symbolic link, a FIFO, a device, another owner, several links):
      nothing of it is opened or followed, and the prepare fails with :class:`PrepareError`
      naming the claim, the path and what is there, logged as an error. While the file is mounted
      in a container no process there can remove or replace it, so something unmounted it first
      (an agent before this fix, a host process), and the claim's running containers may have no
      grant mount left: made again, a link planted there after this prepare and before the next
      container's mount would still reach that mount. The pods using the claim must go (the
      kubelet then unprepares it and its directory is removed), or an admin removes the claim's
      directory once none runs.

    The name is resolved once with ``O_PATH | O_NOFOLLOW`` (which opens neither a device nor a
    FIFO, and gives a link itself), checked with ``fstat``, and only a regular file is opened,
    through ``/proc/self/fd`` (the same inode whatever is renamed over the name meanwhile)."""

    def refuse(what: str) -> PrepareError:
        message = (
            f"claim {claim}: grant file {grant} is {what}, not the grant file the agent wrote; the "
            "claim's region directory was changed behind the agent and its running containers may "
            "have lost the grant's read-only mount: not prepared again (delete the pods using the "
            "claim so that the kubelet unprepares it, or remove its region directory once none runs)"
        )
        log.error("%s", message)
        return PrepareError(message, "io")

    data = text.encode()
    try:
        ref = os.open(grant, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise refuse("missing") from None
    try:
        info = os.fstat(ref)
        fault = _grant_fault(info)
        if fault:
            raise refuse(fault)
        fd = os.open(f"/proc/self/fd/{ref}", os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(ref)
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
            raise refuse("replaced while being opened")
        fault = _grant_fault(now)
        if fault:
            raise refuse(fault)
        same = now.st_size == len(data) and os.pread(fd, len(data) + 1, 0) == data
        mode = stat.S_IMODE(now.st_mode)
        if same and mode == GRANT_MODE:
            return
        log.error(
            "claim %s: grant file %s is not the recorded grant (%d bytes, mode %#o; recorded: %d bytes, mode "
            "%#o); rewritten in place, its containers' mounts kept",
            claim,
            grant,
            now.st_size,
            mode,
            len(data),
            GRANT_MODE,
        )
        if mode != GRANT_MODE:
            os.fchmod(fd, GRANT_MODE)
        if not same:
            # emptied first, then one write (a grant is a few hundred bytes, one page): a process
            # starting meanwhile reads an empty grant, which libvgpu refuses, or the new one, never
            # old lines mixed with new ones
            os.ftruncate(fd, 0)
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], written)
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(*files: Path) -> None:
    """Remove what a failed prepare wrote, each on its own (one that cannot be removed, or a path
    that cannot exist, does not keep the others)."""
    for f in files:
        try:
            f.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot remove %s after a failed prepare: %s", f, exc)


def error_reason(exc: BaseException) -> str:
    """The metrics' label for a failed prepare or unprepare (:mod:`hami.draplugin.metrics`)."""
    if isinstance(exc, PrepareError):
        return exc.reason
    if isinstance(exc, CheckpointError):
        return "checkpoint"
    if isinstance(exc, OSError):
        return "io"
    return "other"


def _read_json(path: Path) -> Any:
    """The JSON document in ``path``; None when it cannot be read or parsed (or is a directory)."""
    try:
        return json.loads(read_small(path))
    except (OSError, ValueError):
        return None


def _error(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _once(claims: Sequence[Any]) -> list[Any]:
    """The request's claims, a UID named twice handled once (its first entry; the answer is
    keyed by UID, so a second would add its devices again)."""
    seen: set[str] = set()
    out = []
    for c in claims:
        if c.uid not in seen:
            seen.add(c.uid)
            out.append(c)
    return out


class DRAService(dra_grpc.DRAPluginServicer):
    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    async def NodePrepareResources(self, request, context):  # noqa: N802 - gRPC name
        out = dra_pb.NodePrepareResourcesResponse()
        for c in _once(request.claims):
            try:
                devices = await self.driver.prepare(c.namespace, c.name, c.uid)
                out.claims[c.uid].devices.extend(dra_pb.Device(**d) for d in devices)
            except Exception as exc:  # every failure is this claim's, reported to the kubelet
                log.warning("prepare of claim %s/%s (%s) failed: %s", c.namespace, c.name, c.uid, exc)
                out.claims[c.uid].error = _error(exc)
        return out

    async def NodeUnprepareResources(self, request, context):  # noqa: N802
        out = dra_pb.NodeUnprepareResourcesResponse()
        for c in _once(request.claims):
            try:
                await self.driver.unprepare(c.namespace, c.name, c.uid)
                out.claims[c.uid].CopyFrom(dra_pb.NodeUnprepareResourceResponse())
            except Exception as exc:
                log.warning("unprepare of claim %s/%s (%s) failed: %s", c.namespace, c.name, c.uid, exc)
                out.claims[c.uid].error = _error(exc)
        return out


class HealthService(health_grpc.DRAResourceHealthServicer):
    """KEP-4680 (``v1alpha1.DRAResourceHealth``): streams every device's health to the kubelet,
    which shows it in the status of the pods holding the device (``kubectl describe pod``:
    ``allocatedResourcesStatus``). A snapshot at once, then on every change and at least every
    :data:`HEALTH_RESEND` seconds, until the kubelet closes the stream."""

    def __init__(self, feed: HealthFeed, resend: float = HEALTH_RESEND) -> None:
        self.feed, self.resend = feed, resend
        #: set when the server stops: open streams end (the kubelet dials again), rather than
        #: hold the stop for the grace that prepares in flight get and then be cut
        self.closing = asyncio.Event()

    def response(self):
        return health_pb.NodeWatchResourcesResponse(
            devices=[
                health_pb.DeviceHealth(
                    device=health_pb.DeviceIdentifier(pool_name=pool, device_name=name),
                    health=health_pb.HEALTHY if healthy else health_pb.UNHEALTHY,
                    last_updated_time=stamp,
                )
                for pool, name, healthy, stamp in self.feed.snapshot()
            ]
        )

    async def NodeWatchResources(self, request, context):  # noqa: N802 - gRPC name
        seen = self.feed.version
        while not self.closing.is_set():
            yield self.response()
            seen = await self._next(seen)

    async def _next(self, seen: int) -> int:
        """The feed's next version (or the resend), unless the server stops first."""
        waiting = asyncio.ensure_future(self.feed.wait(seen, self.resend))
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait((waiting, closing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
            closing.cancel()
        return waiting.result() if waiting.done() and not waiting.cancelled() else seen


class RegistrationService(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: str, services: Sequence[str] = (DRA_SERVICE,)) -> None:
        self.endpoint = endpoint
        self.services = list(services)  # the kubelet picks the health service from these too
        self.status: tuple[bool, str] | None = None
        self.registered = asyncio.Event()

    async def GetInfo(self, request, context):  # noqa: N802
        return reg_pb.PluginInfo(
            type=PLUGIN_TYPE, name=DRIVER, endpoint=self.endpoint, supported_versions=self.services
        )

    async def NotifyRegistrationStatus(self, request, context):  # noqa: N802
        self.status = (request.plugin_registered, request.error)
        if request.plugin_registered:
            log.info("registered with the kubelet as %s (%s)", DRIVER, self.endpoint)
            self.registered.set()
        else:
            log.error("the kubelet refused the registration of %s: %s", DRIVER, request.error)
        return reg_pb.RegistrationStatusResponse()


def socket_paths(kubelet_dir: str | Path) -> tuple[Path, Path]:
    """(registration socket, DRA socket) under the kubelet's root directory."""
    root = Path(kubelet_dir)
    return root / "plugins_registry" / f"{DRIVER}-reg.sock", root / "plugins" / DRIVER / "dra.sock"


_BINDS = itertools.count()  # a number for each hidden socket name (PluginServer._bind)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what is at ``path`` now (None: nothing): tells the socket this server
    bound from one another process bound there since."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


class PluginDirectoryGone(RuntimeError):
    """A socket's directory was removed under the agent while the agent still sees it: the chart
    mounts the kubelet's plugin directories as hostPath volumes, and a container keeps the
    directory its mount was made from after the host removed it (and maybe made a new one at the
    path), where nothing can be created and nothing the kubelet sees. Only a restart of the
    container, with mounts made afresh, serves the plugin again."""


def _removed(directory: Path) -> bool:
    """``directory`` resolves to a directory that was removed (no link left to it): a mount of
    it, or an open handle, keeps it. A path that names nothing is not (it can be made again)."""
    try:
        st = os.stat(directory)
    except OSError:
        return False
    return st.st_nlink == 0


class PluginServer:
    """Serves registration on ``registration_socket`` and DRA on ``dra_socket`` (mode 0600).

    :meth:`watch` (:meth:`check` every second) serves a socket again when it is gone: the kubelet
    finds the plugin by its registration socket, and one removed under a running agent (a
    kubelet restart that cleaned its plugin directories, someone's clean-up) left the agent
    serving a file nobody could dial, never registered again until it restarted. A socket
    another process bound at the path since (the next agent of a DaemonSet update with
    ``maxSurge``) is left to it, and the stop removes only the sockets this server bound: the
    stop of the agent being replaced removed the new agent's, which left the node without its
    DRA plugin. A socket's directory removed while this process still sees it (a hostPath
    mount of it: the host removed the directory, and maybe made it again) raises
    :class:`PluginDirectoryGone` out of :meth:`check` and :meth:`watch`: the agent was serving,
    for ever, sockets in a directory the kubelet could no longer see. Calls in flight at a stop
    get :data:`STOP_GRACE_S` to finish."""

    def __init__(
        self,
        driver: Driver,
        registration_socket: str | Path,
        dra_socket: str | Path,
        health: HealthFeed | None = None,
    ) -> None:
        self.driver = driver
        self.health = health  # serve KEP-4680's health stream beside the DRA service
        self.registration_socket, self.dra_socket = Path(registration_socket), Path(dra_socket)
        self.registration = RegistrationService(
            str(self.dra_socket), (DRA_SERVICE, HEALTH_SERVICE) if health is not None else (DRA_SERVICE,)
        )
        # socket path -> (its server, the identity of the socket it bound, its health service)
        self._servers: dict[Path, tuple[grpc.aio.Server, tuple[int, int] | None, HealthService | None]] = {}
        self._retiring: set[asyncio.Task] = set()  # servers of sockets served again, finishing their calls
        self._unserved: set[Path] = set()  # sockets whose last check failed or found another's (logged once)

    def _server(self, path: Path) -> tuple[grpc.aio.Server, HealthService | None]:
        server, health = grpc.aio.server(), None
        if path == self.dra_socket:
            dra_grpc.add_DRAPluginServicer_to_server(DRAService(self.driver), server)
            if self.health is not None:
                health = HealthService(self.health)
                health_grpc.add_DRAResourceHealthServicer_to_server(health, server)
        else:
            reg_grpc.add_RegistrationServicer_to_server(self.registration, server)
        return server, health

    async def _bind(self, path: Path, replace: bool = False) -> None:
        """Serve ``path`` with a new server (raises RuntimeError/OSError when it cannot bind).
        gRPC unlinks a unix socket's path when it binds it and again when its server stops,
        whatever is there then: bound at that path, the stop of one server (this agent's
        replaced one, or the agent a DaemonSet update replaces) removed the socket of the next.
        So the server binds a hidden name of its own (the kubelet ignores names starting with
        a dot) and the socket is then moved to ``path``: over what is there with ``replace`` (the
        start), else only where nothing is (a link fails on an existing name)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        hidden = path.with_name(f".{path.name}.{os.getpid()}.{next(_BINDS)}")
        server, health = self._server(path)
        try:
            server.add_insecure_port(f"unix://{hidden}")
            await server.start()
            os.chmod(hidden, 0o600)
            if replace:
                os.replace(hidden, path)
            else:
                os.link(hidden, path)
                hidden.unlink()
        except BaseException:
            hidden.unlink(missing_ok=True)
            await server.stop(None)
            raise
        self._servers[path] = (server, _identity(path), health)

    async def start(self) -> None:
        # the DRA socket first: the kubelet dials the endpoint as soon as registration answers
        for path in (self.dra_socket, self.registration_socket):
            await self._bind(path, replace=True)

    async def check(self) -> None:
        """One watch step: serve again each socket that is gone (the DRA socket first, as at the
        start). A bind that fails (the directory gone and not to be made) is tried again at the
        next step; a directory removed while this process still sees it raises
        :class:`PluginDirectoryGone` (nothing it binds there can reach the kubelet)."""
        for path in (self.dra_socket, self.registration_socket):
            if _removed(path.parent):
                raise PluginDirectoryGone(
                    f"{path.parent} was removed under the agent (on the host, maybe made again since): "
                    f"this container still sees the removed directory, and {path.name} bound there is "
                    "invisible to the kubelet; exiting so that the container restarts with fresh mounts"
                )
            current = self._servers.get(path)
            now = _identity(path)
            if current is not None and now == current[1]:
                self._unserved.discard(path)
                continue
            if now is not None:  # another process's socket (the next agent's): its to serve
                if path not in self._unserved:
                    log.warning("%s was bound by another process; left to it", path)
                    self._unserved.add(path)
                continue
            if current is not None and path not in self._unserved:
                log.warning("socket %s is gone (kubelet restart?); serving it again", path)
            try:
                await self._bind(path)
            except (RuntimeError, OSError) as exc:
                if path not in self._unserved:
                    log.error("cannot serve %s (%s); trying again every %gs", path, exc, WATCH_S)
                self._unserved.add(path)
                continue
            self._unserved.discard(path)
            if path == self.registration_socket:
                log.info("serving %s again; the kubelet registers the plugin anew", path)
            if current is not None:  # its calls in flight (on connections made before) finish
                task = asyncio.get_running_loop().create_task(self._retire(*current[::2]))
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)

    @staticmethod
    async def _retire(server: grpc.aio.Server, health: HealthService | None, grace: float = STOP_GRACE_S) -> None:
        if health is not None:
            health.closing.set()
        await server.stop(grace)

    async def watch(self, poll: float = WATCH_S) -> None:
        """:meth:`check` every ``poll`` seconds until cancelled or a socket's directory is gone
        for good (:class:`PluginDirectoryGone`, raised: the agent must restart)."""
        while True:
            await asyncio.sleep(poll)
            try:
                await self.check()
            except PluginDirectoryGone:
                raise
            except Exception:  # noqa: BLE001 - the watch must outlive whatever went wrong once
                log.exception("checking the plugin sockets failed; trying again in %gs", poll)

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stop serving: registration first (the kubelet learns the plugin is going), calls in
        flight given ``grace`` seconds, health streams ended; the sockets removed when they are
        still the ones this server bound."""
        bound = {
            path: self._servers.pop(path)
            for path in (self.registration_socket, self.dra_socket)
            if path in self._servers
        }
        await asyncio.gather(
            *(self._retire(server, health, grace) for server, _, health in bound.values()), *list(self._retiring)
        )
        for path, (_, identity, _) in bound.items():
            if identity is not None and _identity(path) == identity:
                path.unlink(missing_ok=True)
