"""Dynamic MIG on the node: the GPU/compute instances the scheduler chose, made real (§6.6).

What this module owns:

* :class:`Checkpoint` - a node-local JSON file recording every instance this plugin created or
  is creating, written atomically (:func:`hami.node.files.write_atomic`: temporary file, fsync,
  rename, fsync of the directory);
* :class:`MigManager` - the lifecycle: :meth:`~MigManager.prepare` creates (or reuses) the
  instances of one container, :meth:`~MigManager.recover` runs at start-up and
  :meth:`~MigManager.collect` destroys the instances of pods that are gone.

Restart safety. Before touching NVML for an instance the manager records the intent
(``state: creating``, with the placement); after each NVML step it records what exists. A
plugin killed between any two steps leaves an entry that says how far it got, and
:meth:`~MigManager.recover` undoes it on the next start: it destroys the compute instance and
the GPU instance at the recorded id, or, when the id was not recorded yet, the instance of that
profile at that placement that no other entry claims. Finished entries (``state: ready``) are
kept and reused when the kubelet retries the same Allocate, and only for an allocation of the
same GPU, profile and placement: an entry whose key now asks for another is destroyed first (or
the allocation refused while NVML will not destroy it). Instances nobody claims (not in the
checkpoint, not in a live pod's ``hami.io/vgpu-mig-allocations``) are destroyed at start-up, so
a lost checkpoint cannot make a placement look free while an old instance still holds it; the
ones a live pod's annotation names are adopted into the checkpoint instead. A GPU a live pod
holds through HAMi's legacy grant (``<GPU UUID>[<template>-<slot>]``, no instance named) keeps
every instance at start-up; the manager remembers it, and once no live pod holds it that way
:meth:`~MigManager.release_kept` destroys what nobody claims there, as the start would have.
An instance is claimed by one entry only, so two pods never share one, and a MIG device made
outside this plugin is never handed to a pod. An instance NVML refuses to destroy (processes on it) is
reported and kept, never stopping the rest: a recorded one is tried again by the next
:meth:`~MigManager.collect`.

Not here: which profile and placement a container gets (the scheduler, ``vendors/nvidia.py``),
the NVML calls (:class:`hami.node.nvml.MigNvml`, which the manager is given), the gRPC and
API-server I/O (``allocator.py``, ``agent.py``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

import pynvml

from hami.core.codec import MigAllocation
from hami.node.files import read_small, write_atomic
from hami.node.nvml import GpuProfile, MigError, MigNvml

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------- checkpoint


@dataclass(frozen=True)
class Entry:
    """One instance this plugin owns (or is creating) for one device of one container."""

    pod_uid: str
    pod: str  # "namespace/name", for messages
    container: int  # containerIndex of hami.io/vgpu-mig-allocations
    device: int  # deviceIndex
    gpu_uuid: str
    profile: str
    start: int
    size: int
    state: str = "creating"  # "creating" | "ready"
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_uuid: str = ""

    @property
    def key(self) -> str:
        return f"{self.pod_uid}/{self.container}/{self.device}"


#: the JSON types of an Entry's fields (None allowed where the field is optional)
_ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "pod_uid": (str,),
    "pod": (str,),
    "container": (int,),
    "device": (int,),
    "gpu_uuid": (str,),
    "profile": (str,),
    "start": (int,),
    "size": (int,),
    "state": (str,),
    "gpu_instance_id": (int, type(None)),
    "compute_instance_id": (int, type(None)),
    "mig_uuid": (str,),
}


def _typed(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and not isinstance(value, bool)


class Checkpoint:
    """``{"version": 1, "entries": [...]}`` in one file, replaced atomically on every change. An
    entry whose fields are not of their types is refused on load, as a file that is not JSON is."""

    VERSION = 1

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, Entry]:
        try:
            doc = json.loads(read_small(self.path))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise MigError(
                f"MIG checkpoint {self.path} is unreadable ({exc}); move it away to start afresh "
                "(instances nobody claims are then destroyed)"
            ) from None
        if not isinstance(doc, dict) or doc.get("version") != self.VERSION or not isinstance(doc.get("entries"), list):
            raise MigError(f'MIG checkpoint {self.path}: expected {{"version": 1, "entries": [...]}}')
        out = {}
        for i, raw in enumerate(doc["entries"]):
            try:
                e = Entry(**raw)
            except TypeError as exc:
                raise MigError(f"MIG checkpoint {self.path}: entry {i} is invalid ({exc})") from None
            wrong = [
                f"{f.name}={getattr(e, f.name)!r}"
                for f in fields(Entry)
                if not _typed(getattr(e, f.name), _ENTRY_TYPES[f.name])
            ]
            if wrong:
                raise MigError(f"MIG checkpoint {self.path}: entry {i} is invalid ({', '.join(wrong)})")
            out[e.key] = e
        return out

    def save(self, entries: Mapping[str, Entry]) -> None:
        data = json.dumps({"version": self.VERSION, "entries": [asdict(e) for e in entries.values()]}, indent=1)
        write_atomic(self.path, data)


# ------------------------------------------------------------------------------- manager


@dataclass(frozen=True)
class PodRef:
    uid: str
    namespace: str
    name: str


class MigManager:
    """Creates, reuses and destroys the node's MIG instances, with a checkpoint (module doc).

    ``after_step(name)`` is called after every step that changes NVML or the checkpoint
    (``intent``, ``gi-created``, ``gi-recorded``, ``ci-created``, ``ready``); tests use it to kill
    the process between steps. All methods are thread-safe (one lock)."""

    def __init__(
        self,
        nvml: MigNvml,
        checkpoint: Checkpoint,
        gpus: Iterable[str],
        after_step: Callable[[str], None] | None = None,
    ) -> None:
        self.nvml = nvml
        self.checkpoint = checkpoint
        self.gpus = list(gpus)
        self.after_step = after_step or (lambda step: None)
        self._lock = threading.Lock()
        self._profiles: dict[str, dict[str, GpuProfile]] = {}
        self.entries: dict[str, Entry] = {}
        self._seq = 0  # counts prepare calls; collect() spares entries made after its snapshot
        self._made: dict[str, int] = {}
        #: GPU UUID -> who held it: the GPUs recover() kept whole (``keep_gpus``), until release_kept()
        self._kept: dict[str, str] = {}

    def snapshot(self) -> int:
        """A mark for :meth:`collect`: entries prepared after it are never collected with it (their
        pod may be missing from a pod list read before they were made)."""
        with self._lock:
            return self._seq

    def _profile(self, gpu: str, name: str) -> GpuProfile:
        if gpu not in self._profiles:
            self._profiles[gpu] = {p.name: p for p in self.nvml.profiles(gpu)}
        p = self._profiles[gpu].get(name)
        if p is None:
            raise MigError(f"GPU {gpu} has no MIG profile {name!r} (it has {', '.join(sorted(self._profiles[gpu]))})")
        return p

    def _save(self, step: str) -> None:
        self.checkpoint.save(self.entries)
        self.after_step(step)

    # ------------------------------------------------------------------ start-up
    def recover(
        self,
        claims: Sequence[tuple[PodRef, MigAllocation]] = (),
        destroy_unclaimed: bool = True,
        keep_gpus: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Start-up: undo interrupted creations, adopt instances that live pods' annotations
        name (``claims``), destroy the instances nobody claims (unless ``destroy_unclaimed`` is
        False: the pods could not be read). ``keep_gpus``: GPU UUID -> who holds it (live pods
        with HAMi's legacy ``UUID[template-slot]`` grant, which names no instance this plugin can
        match): no unclaimed instance on such a GPU is destroyed, and the GPU is remembered
        (:attr:`kept`) until :meth:`release_kept` finds no such pod left. Returns what was done
        (lines)."""
        with self._lock:
            self._kept = {g: why for g, why in (keep_gpus or {}).items() if g in self.gpus} if destroy_unclaimed else {}
            for gpu in self.gpus:
                self.nvml.enable(gpu)
            self.entries = self.checkpoint.load()
            done = []
            for key, e in list(self.entries.items()):
                if e.state != "ready":
                    done.append(self._undo(e, "interrupted creation")[0])
                    del self.entries[key]
            self._adopt(claims, done)
            self.checkpoint.save(self.entries)
            if destroy_unclaimed:
                done += self._destroy_unclaimed(keep_gpus or {})
            return done

    def _undo(self, e: Entry, why: str) -> tuple[str, bool]:
        """Destroy what ``e`` made; returns a line saying what was done and whether nothing of it
        is left (False: NVML refused to destroy it)."""
        gi = e.gpu_instance_id
        if gi is None:  # killed before recording the id: the instance at that placement nobody claims
            owned = {x.gpu_instance_id for x in self.entries.values() if x.gpu_uuid == e.gpu_uuid and x.key != e.key}
            gi = next(
                (
                    i.gi
                    for i in self.nvml.instances(e.gpu_uuid)
                    if i.profile == e.profile and i.start == e.start and i.gi not in owned
                ),
                None,
            )
        if gi is not None and e.gpu_instance_id is not None and not self._is_its(e, gi):
            gi = None  # the instance is gone (a reboot, a GPU reset) and its id names another now
        failed = self._destroy(e.gpu_uuid, gi) if gi is not None else None
        line = (
            f"{why}: pod {e.pod} container {e.container} device {e.device}: {e.profile} at {e.start} on "
            f"{e.gpu_uuid}"
            + (
                " (nothing was created)"
                if gi is None
                else f" (GPU instance {gi} destroyed)"
                if failed is None
                else f" (cannot destroy GPU instance {gi}: {failed})"
            )
        )
        return line, failed is None

    def _destroy(self, gpu: str, gi: int) -> str | None:
        """Destroy GPU instance ``gi``; None when done, else why not. NVML refuses an instance
        that processes still use (``NVML_ERROR_IN_USE``): that one is reported, not raised, so it
        never stops the clean-up of the others or the plugin's start."""
        try:
            self.nvml.destroy(gpu, gi)
        except (MigError, pynvml.NVMLError) as exc:
            log.warning("GPU %s: cannot destroy GPU instance %d: %s", gpu, gi, exc)
            return str(exc) or type(exc).__name__
        return None

    def _adopt(self, claims: Sequence[tuple[PodRef, MigAllocation]], done: list[str]) -> None:
        for pod, a in claims:
            key = f"{pod.uid}/{a.container}/{a.device}"
            if key in self.entries or a.gpu_instance_id is None or a.gpu_uuid not in self.gpus:
                continue
            live = {i.gi: i for i in self.nvml.instances(a.gpu_uuid)}
            inst = live.get(a.gpu_instance_id)
            if inst is None or inst.profile != a.profile or inst.start != a.start or inst.ci is None:
                continue
            if any(x.gpu_uuid == a.gpu_uuid and x.gpu_instance_id == inst.gi for x in self.entries.values()):
                continue
            self.entries[key] = Entry(
                pod.uid,
                f"{pod.namespace}/{pod.name}",
                a.container,
                a.device,
                a.gpu_uuid,
                a.profile,
                a.start,
                a.size,
                "ready",
                inst.gi,
                inst.ci,
                inst.mig_uuid,
            )
            done.append(
                f"adopted GPU instance {inst.gi} ({a.profile} at {a.start}) on {a.gpu_uuid} for pod "
                f"{pod.namespace}/{pod.name} from its annotation"
            )

    def _destroy_unclaimed(self, keep_gpus: Mapping[str, str]) -> list[str]:
        done = []
        for gpu in self.gpus:
            owned = {e.gpu_instance_id for e in self.entries.values() if e.gpu_uuid == gpu}
            if gpu in keep_gpus:
                # HAMi's earlier releases named a pod's instance only as <GPU UUID>[<template>-<slot>]:
                # which instance is that pod's cannot be told, and one destroyed under an idle pod
                # (no process on it, so NVML does not refuse) leaves it no device (found by review, 1 Dec)
                kept = [f"{i.gi} ({i.profile} at {i.start})" for i in self.nvml.instances(gpu) if i.gi not in owned]
                done.append(
                    f"kept every MIG instance on {gpu} (unclaimed GPU instances: {', '.join(kept) or 'none'}): "
                    f"{keep_gpus[gpu]}; what nobody claims there is destroyed once no live pod holds it that way"
                )
                continue
            for inst in self.nvml.instances(gpu):
                if inst.gi not in owned:
                    failed = self._destroy(gpu, inst.gi)
                    done.append(
                        f"destroyed GPU instance {inst.gi} ({inst.profile} at {inst.start}) on {gpu}: claimed by no pod"
                        if failed is None
                        else f"kept GPU instance {inst.gi} ({inst.profile} at {inst.start}) on {gpu}: claimed by no "
                        f"pod but in use ({failed}); a pod placed over it will not start until it is removed"
                    )
        return done

    # ------------------------------------------------------------------ Allocate
    def prepare(self, pod: PodRef, allocations: Sequence[MigAllocation]) -> list[MigAllocation]:
        """Create or reuse one instance per entry; returns the entries with their runtime identity."""
        with self._lock:
            self._seq += 1
            for a in allocations:
                self._made[f"{pod.uid}/{a.container}/{a.device}"] = self._seq
            return [self._one(pod, a) for a in allocations]

    def _one(self, pod: PodRef, a: MigAllocation) -> MigAllocation:
        if a.gpu_uuid not in self.gpus:
            raise MigError(
                f"pod {pod.namespace}/{pod.name}: GPU {a.gpu_uuid} of its MIG allocation is not on this node"
            )
        profile = self._profile(a.gpu_uuid, a.profile)
        if (a.start, a.size) not in profile.placements:
            raise MigError(
                f"pod {pod.namespace}/{pod.name}: placement {a.start}+{a.size} is not one of profile "
                f"{a.profile}'s on {a.gpu_uuid} ({profile.placements})"
            )
        key = f"{pod.uid}/{a.container}/{a.device}"
        e = self.entries.get(key)
        same = e is not None and (e.gpu_uuid, e.profile, e.start, e.size) == (a.gpu_uuid, a.profile, a.start, a.size)
        if e is not None and same and e.state == "ready" and self._still_there(e):
            return self._runtime(a, e)
        if e is not None:  # a half-made or vanished instance of this very entry, or one made for
            # another allocation under the same key (a DRA claim allocated again elsewhere under its
            # UID, its old instance never destroyed): start over; the old one is never handed out
            # in place of what was allocated (found by review, 1 Dec)
            line, gone = self._undo(
                e, "redo" if same else f"allocated again as {a.profile} at {a.start} on {a.gpu_uuid}"
            )
            if not gone:  # still there: the entry keeps it (collected with its pod), no second one
                raise MigError(line)
            del self.entries[key]
            self.checkpoint.save(self.entries)
        self._check_free(pod, a)
        if self._unclaimed_at(a) is None:
            self._check_no_other(pod, a)
        e = Entry(pod.uid, f"{pod.namespace}/{pod.name}", a.container, a.device, a.gpu_uuid, a.profile, a.start, a.size)
        self.entries[key] = e
        self._save("intent")
        gi = self._unclaimed_at(a)
        if gi is None:
            try:
                gi = self.nvml.create_gi(a.gpu_uuid, profile, a.start)
            except MigError:
                # nothing was made (NVML creates a GPU instance whole or not at all): an intent left
                # behind would have the retry or the next start destroy whatever holds the placement
                del self.entries[key]
                self.checkpoint.save(self.entries)
                raise
        self.after_step("gi-created")
        e = self.entries[key] = replace(e, gpu_instance_id=gi)
        self._save("gi-recorded")
        inst = next((i for i in self.nvml.instances(a.gpu_uuid) if i.gi == gi), None)
        ci, mig = (
            (inst.ci, inst.mig_uuid)
            if inst is not None and inst.ci is not None
            else self.nvml.create_ci(a.gpu_uuid, gi, profile)
        )
        self.after_step("ci-created")
        e = self.entries[key] = replace(e, compute_instance_id=ci, mig_uuid=mig, state="ready")
        self._save("ready")
        log.info(
            "pod %s: %s at %d on %s is GPU instance %d, MIG device %s", e.pod, a.profile, a.start, a.gpu_uuid, gi, mig
        )
        return self._runtime(a, e)

    @staticmethod
    def _runtime(a: MigAllocation, e: Entry) -> MigAllocation:
        return replace(
            a, mig_uuid=e.mig_uuid, gpu_instance_id=e.gpu_instance_id, compute_instance_id=e.compute_instance_id
        )

    def _is_its(self, e: Entry, gi: int) -> bool:
        """GPU instance ``gi`` on ``e``'s GPU is still ``e``'s: same profile and placement (and MIG
        device, where both are known). Instances do not survive a reboot or a GPU reset, and NVML
        hands their ids out again: an id alone may name another claim's instance."""
        inst = next((i for i in self.nvml.instances(e.gpu_uuid) if i.gi == gi), None)
        return (
            inst is not None
            and inst.profile == e.profile
            and inst.start == e.start
            and (not e.mig_uuid or not inst.mig_uuid or inst.mig_uuid == e.mig_uuid)  # "" or None: unknown
        )

    def intact(self, pod_uid: str) -> bool:
        """Every instance recorded for ``pod_uid`` is made and still there (False: none recorded,
        or one vanished, as after a reboot, which dynamic instances do not survive)."""
        with self._lock:
            mine = [e for e in self.entries.values() if e.pod_uid == pod_uid]
            return bool(mine) and all(e.state == "ready" and self._still_there(e) for e in mine)

    def held(self, pod_uid: str) -> list[Entry]:
        """The entries still recorded for ``pod_uid`` (after a :meth:`collect`: the instances NVML
        refused to destroy)."""
        with self._lock:
            return [e for e in self.entries.values() if e.pod_uid == pod_uid]

    def _still_there(self, e: Entry) -> bool:
        return any(
            i.gi == e.gpu_instance_id
            and i.ci is not None
            and i.mig_uuid == e.mig_uuid
            and (i.profile, i.start) == (e.profile, e.start)
            for i in self.nvml.instances(e.gpu_uuid)
        )

    def _check_free(self, pod: PodRef, a: MigAllocation) -> None:
        for x in self.entries.values():
            if (
                x.gpu_uuid == a.gpu_uuid
                and x.pod_uid != pod.uid
                and x.start < a.start + a.size
                and a.start < x.start + x.size
            ):
                raise PlacementHeld(
                    x,
                    f"pod {pod.namespace}/{pod.name}: placement {a.start}+{a.size} on {a.gpu_uuid} "
                    f"is still held by pod {x.pod} ({x.profile} at {x.start})",
                )

    def _check_no_other(self, pod: PodRef, a: MigAllocation) -> None:
        """No instance that is not to be reused overlaps the placement: NVML would refuse to
        create over it with a bare "Insufficient Resources"; the pod is told which instance
        holds it instead. On a GPU kept whole at start-up (:attr:`kept`) an unclaimed one raises
        :class:`PlacementKept`: the pods holding that GPU may be gone, :meth:`release_kept` not run yet."""
        held = [i for i in self.nvml.instances(a.gpu_uuid) if i.start < a.start + a.size and a.start < i.start + i.size]
        if held:
            owners = {x.gpu_instance_id: x.pod for x in self.entries.values() if x.gpu_uuid == a.gpu_uuid}
            kept = self._kept.get(a.gpu_uuid)
            unclaimed = ", claimed by no pod: made outside hami?)" if kept is None else ", claimed by no pod)"
            what = ", ".join(
                f"GPU instance {i.gi} ({i.profile} at {i.start}"
                + (f", pod {owners[i.gi]})" if i.gi in owners else unclaimed)
                for i in held
            )
            message = (
                f"pod {pod.namespace}/{pod.name}: placement {a.start}+{a.size} of {a.profile} on {a.gpu_uuid} "
                f"overlaps {what}"
            )
            if kept is not None and any(i.gi not in owners for i in held):
                raise PlacementKept(f"{message}; every MIG instance on {a.gpu_uuid} was kept at start-up: {kept}")
            raise MigError(message)

    def _unclaimed_at(self, a: MigAllocation) -> int | None:
        """An instance of that profile at that placement that no entry claims, reused instead of
        created: a GPU instance without a compute instance (nothing runs on it; an earlier attempt
        of this entry), or the one the pod's own annotation names (its checkpoint entry was lost).
        A MIG device nobody here made for this pod (an administrator's, one kept at start-up
        because it was busy or the pods could not be listed) is never handed over: creating over
        it fails instead."""
        owned = {x.gpu_instance_id for x in self.entries.values() if x.gpu_uuid == a.gpu_uuid}
        return next(
            (
                i.gi
                for i in self.nvml.instances(a.gpu_uuid)
                if i.profile == a.profile
                and i.start == a.start
                and i.gi not in owned
                and (
                    i.ci is None
                    or (i.gi == a.gpu_instance_id and bool(i.mig_uuid) and (not a.mig_uuid or a.mig_uuid == i.mig_uuid))
                )
            ),
            None,
        )

    # ------------------------------------------------------------------ garbage collection
    def collect(self, live_pod_uids: set[str], upto: int | None = None) -> list[str]:
        """Destroy the instances of pods not in ``live_pod_uids`` (gone, or finished); with
        ``upto`` (a :meth:`snapshot` taken before the pod list was read) only those prepared
        before it."""
        with self._lock:
            done = []
            for key, e in list(self.entries.items()):
                if e.pod_uid in live_pod_uids or (upto is not None and self._made.get(key, 0) > upto):
                    continue
                mine = e.gpu_instance_id is not None and self._is_its(e, e.gpu_instance_id)
                if mine:
                    assert e.gpu_instance_id is not None
                    failed = self._destroy(e.gpu_uuid, e.gpu_instance_id)
                    if failed is not None:  # still there: the entry keeps it, the next round tries again
                        done.append(
                            f"pod {e.pod} is gone: cannot destroy GPU instance {e.gpu_instance_id} ({e.profile} at "
                            f"{e.start}) on {e.gpu_uuid} yet ({failed}); tried again next round"
                        )
                        continue
                self._made.pop(key, None)
                del self.entries[key]
                self.checkpoint.save(self.entries)
                done.append(
                    f"pod {e.pod} is gone: destroyed GPU instance {e.gpu_instance_id} ({e.profile} at "
                    f"{e.start}) on {e.gpu_uuid}"
                    if mine
                    else f"pod {e.pod} is gone: its {e.profile} at {e.start} on {e.gpu_uuid} was gone already"
                )
            return done

    @property
    def kept(self) -> dict[str, str]:
        """The GPUs kept whole at start-up (``keep_gpus`` of :meth:`recover`) and not released
        since: GPU UUID -> who held it. A copy, read without the lock: the event loop reads it, and
        must not wait for an Allocate's NVML calls."""
        return dict(self._kept)

    def release_kept(self, held: Collection[str], claims: Sequence[tuple[PodRef, MigAllocation]] = ()) -> list[str]:
        """The GPUs kept whole at start-up that no live pod holds through HAMi's legacy MIG grant
        any more (``held``: the GPUs live pods' legacy grants name now, from a pod list that was
        read; without one, do not call this): the instances nobody claims there are destroyed, as
        :meth:`recover` destroys them on any other GPU. Claimed are those of a checkpoint entry
        and those a live pod's ``hami.io/vgpu-mig-allocations`` names (``claims``, adopted into
        the checkpoint as at start-up, and never destroyed). The GPU is then no longer kept; while
        NVML refuses to destroy one (processes on it) it stays kept and is tried again next call.
        Without this the kept instances stayed until the plugin restarted, and every pod the
        scheduler placed over one failed its Allocate (found by review, 1 Dec). Returns what was
        done (lines; one per GPU released)."""
        with self._lock:
            done: list[str] = []
            for gpu in [g for g in self._kept if g not in held]:
                mine = [(p, a) for p, a in claims if a.gpu_uuid == gpu]
                adopted: list[str] = []
                self._adopt(mine, adopted)
                if adopted:
                    self.checkpoint.save(self.entries)
                    done += adopted
                named = {a.gpu_instance_id for _, a in mine if a.gpu_instance_id is not None}
                owned = {e.gpu_instance_id for e in self.entries.values() if e.gpu_uuid == gpu} | named
                destroyed, refused = [], []
                for inst in self.nvml.instances(gpu):
                    if inst.gi in owned:
                        continue
                    failed = self._destroy(gpu, inst.gi)
                    what = f"{inst.gi} ({inst.profile} at {inst.start})"
                    if failed is None:
                        destroyed.append(what)
                    else:
                        refused.append(f"{what}: {failed}")
                why = self._kept[gpu]
                gone = (
                    f"no live pod holds {gpu} through HAMi's legacy MIG grant any more (kept at start-up, {why}); "
                    f"destroyed the GPU instances there claimed by no pod: {', '.join(destroyed) or 'none'}"
                )
                if refused:
                    done.append(
                        f"{gone}; cannot destroy GPU instance(s) {', '.join(refused)} yet: {gpu} stays kept, tried "
                        "again next round"
                    )
                    continue
                del self._kept[gpu]
                done.append(gone)
            return done


class PlacementHeld(MigError):
    """The placement belongs to another pod's entry (which may be gone: collect, then retry)."""

    def __init__(self, holder: Entry, message: str) -> None:
        super().__init__(message)
        self.holder = holder


class PlacementKept(MigError):
    """The placement overlaps an unclaimed instance on a GPU kept whole at start-up, whose pods
    may be gone (:meth:`MigManager.release_kept` with a fresh pod list, then retry)."""
