"""Dynamic MIG on the node: the GPU/compute instances the scheduler chose, made real (§6.6).

What this module owns:

* :class:`MigNvml` - the NVML calls (profiles and placements of a GPU, its instances, create
  and destroy), nothing else;
* :class:`Checkpoint` - a node-local JSON file recording every instance this plugin created or
  is creating, written atomically (temporary file, fsync, rename, fsync of the directory);
* :class:`MigManager` - the lifecycle: :meth:`~MigManager.prepare` creates (or reuses) the
  instances of one container, :meth:`~MigManager.recover` runs at start-up and
  :meth:`~MigManager.collect` destroys the instances of pods that are gone.

Restart safety. Before touching NVML for an instance the manager records the intent
(``state: creating``, with the placement); after each NVML step it records what exists. A
plugin killed between any two steps leaves an entry that says how far it got, and
:meth:`~MigManager.recover` undoes it on the next start: it destroys the compute instance and
the GPU instance at the recorded id, or, when the id was not recorded yet, the instance of that
profile at that placement that no other entry claims. Finished entries (``state: ready``) are
kept and reused when the kubelet retries the same Allocate. Instances nobody claims (not in the
checkpoint, not in a live pod's ``hami.io/vgpu-mig-allocations``) are destroyed at start-up, so
a lost checkpoint cannot make a placement look free while an old instance still holds it; the
ones a live pod's annotation names are adopted into the checkpoint instead. An instance is
claimed by one entry only, so two pods never share one.

Not here: which profile and placement a container gets (the scheduler, ``vendors/nvidia.py``),
the gRPC and API-server I/O (``allocator.py``, ``agent.py``).
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import pynvml

from hami.core.codec import MigAllocation
from hami.core.types import MigProfile

log = logging.getLogger(__name__)

PROFILE_COUNT = pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT  # profile indices to ask about (unknown ones fail, skipped)
#: compute-instance profile covering a whole GPU instance of N compute slices
CI_PROFILE = {1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
              3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
              6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE, 7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
              8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE}


class MigError(RuntimeError):
    """A MIG instance cannot be made or found; the message names the GPU, profile and placement."""


@dataclass(frozen=True)
class GpuProfile:
    """One GPU-instance profile as NVML reports it."""

    name: str  # "1g.5gb"
    nvml_id: int
    slices: int
    instances: int
    sms: int
    memory_mb: int
    placements: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Instance:
    """A GPU instance on one GPU, with its compute instance and MIG device when they exist."""

    gi: int
    profile: str
    start: int
    size: int
    ci: int | None = None
    mig_uuid: str = ""


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _profile_name(raw: str) -> str:
    return raw[4:] if raw.startswith("MIG ") else raw


class MigNvml:
    """NVML's MIG API for one node (NVML already initialised)."""

    def handle(self, uuid: str):
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)

    def enable(self, uuid: str) -> None:
        """Turn MIG mode on (a no-op when it is on); refuses with a clear error when it cannot."""
        h = self.handle(uuid)
        try:
            current, _ = pynvml.nvmlDeviceGetMigMode(h)
        except pynvml.NVMLError_NotSupported:
            raise MigError(f"GPU {uuid} does not support MIG (operatingmode: mig needs A100/A30/H100-class GPUs)") from None
        if current == pynvml.NVML_DEVICE_MIG_ENABLE:
            return
        try:
            pynvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
        except pynvml.NVMLError as exc:
            raise MigError(f"GPU {uuid}: cannot enable MIG mode ({exc}); stop the processes using it") from None
        log.info("GPU %s: MIG mode enabled", uuid)

    def profiles(self, uuid: str) -> list[GpuProfile]:
        h = self.handle(uuid)
        out = []
        for index in range(PROFILE_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
            except pynvml.NVMLError:
                continue
            arr = (pynvml.c_nvmlGpuInstancePlacement_t * 8)()
            count = ctypes.c_uint(len(arr))
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(count))
            out.append(GpuProfile(
                name=_profile_name(_text(info.name)), nvml_id=int(info.id), slices=int(info.sliceCount),
                instances=int(info.instanceCount), sms=int(info.multiprocessorCount),
                memory_mb=int(info.memorySizeMB),
                placements=tuple((int(arr[i].start), int(arr[i].size)) for i in range(count.value)),
            ))
        return out

    def _mig_uuids(self, h) -> dict[int, str]:
        """GPU instance id -> MIG device UUID, for the instances that have a compute instance."""
        out = {}
        for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except pynvml.NVMLError:
                continue
            out[int(pynvml.nvmlDeviceGetGpuInstanceId(m))] = _text(pynvml.nvmlDeviceGetUUID(m))
        return out

    def instances(self, uuid: str) -> list[Instance]:
        h = self.handle(uuid)
        migs = self._mig_uuids(h)
        out = []
        for p in self.profiles(uuid):
            arr = (pynvml.c_nvmlGpuInstance_t * max(p.instances, 1))()
            count = ctypes.c_uint(len(arr))
            pynvml.nvmlDeviceGetGpuInstances(h, p.nvml_id, arr, ctypes.byref(count))
            for k in range(count.value):
                info = pynvml.nvmlGpuInstanceGetInfo(arr[k])
                gid = int(info.id)
                ci = self._ci_id(arr[k], p.slices)
                out.append(Instance(gid, p.name, int(info.placement.start), int(info.placement.size), ci,
                                    migs.get(gid, "") if ci is not None else ""))
        return sorted(out, key=lambda i: i.gi)

    @staticmethod
    def _ci_id(gi, slices: int) -> int | None:
        arr = (pynvml.c_nvmlComputeInstance_t * 8)()
        count = ctypes.c_uint(len(arr))
        try:
            pynvml.nvmlGpuInstanceGetComputeInstances(gi, CI_PROFILE[slices], arr, ctypes.byref(count))
        except pynvml.NVMLError:
            return None
        return int(pynvml.nvmlComputeInstanceGetInfo(arr[0]).id) if count.value else None

    def create_gi(self, uuid: str, profile: GpuProfile, start: int) -> int:
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, dict(profile.placements).get(start, 0)
        try:
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(self.handle(uuid), profile.nvml_id,
                                                                 ctypes.byref(placement))
        except pynvml.NVMLError as exc:
            raise MigError(f"GPU {uuid}: cannot create a {profile.name} instance at placement "
                           f"{start}+{placement.size}: {exc}") from None
        return int(pynvml.nvmlGpuInstanceGetInfo(gi).id)

    def create_ci(self, uuid: str, gi_id: int, profile: GpuProfile) -> tuple[int, str]:
        h = self.handle(uuid)
        gi = pynvml.nvmlDeviceGetGpuInstanceById(h, gi_id)
        try:
            ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, CI_PROFILE[profile.slices])
        except pynvml.NVMLError as exc:
            raise MigError(f"GPU {uuid}: cannot create the compute instance of GPU instance {gi_id}: {exc}") from None
        ci_id = int(pynvml.nvmlComputeInstanceGetInfo(ci).id)
        return ci_id, self._mig_uuids(h).get(gi_id, "")

    def destroy(self, uuid: str, gi_id: int) -> None:
        """Destroy GPU instance ``gi_id`` and its compute instances; gone already is fine."""
        h = self.handle(uuid)
        try:
            gi = pynvml.nvmlDeviceGetGpuInstanceById(h, gi_id)
        except pynvml.NVMLError_NotFound:
            return
        arr = (pynvml.c_nvmlComputeInstance_t * 8)()
        for profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            count = ctypes.c_uint(len(arr))
            try:
                pynvml.nvmlGpuInstanceGetComputeInstances(gi, profile, arr, ctypes.byref(count))
            except pynvml.NVMLError:
                continue
            for k in range(count.value):
                pynvml.nvmlComputeInstanceDestroy(arr[k])
        pynvml.nvmlGpuInstanceDestroy(gi)


def registered_profiles(profiles: Sequence[GpuProfile], model: str,
                        allowlist: Sequence[tuple[Sequence[str], Sequence[str]]]) -> tuple[MigProfile, ...]:
    """The ``migProfiles`` of the registration: NVML's profiles, narrowed by the first allowlist
    entry whose model is contained in ``model`` (an entry without profiles keeps all); with no
    entry, the plain profiles (no ``+me``-style variants). ``core`` = ceil(SMs x 100 / the
    largest profile's SMs)."""
    full = max((p.sms for p in profiles), default=0) or 1
    keep: Callable[[GpuProfile], bool] = lambda p: "+" not in p.name and "-" not in p.name  # noqa: E731
    for models, names in allowlist:
        if any(m and m in model for m in models):
            keep = (lambda p: p.name in names) if names else (lambda p: True)  # noqa: E731
            break
    return tuple(
        MigProfile(p.name, p.memory_mb, math.ceil(p.sms * 100 / full), p.slices, p.placements)
        for p in sorted(profiles, key=lambda p: (p.memory_mb, p.slices, p.name)) if keep(p)
    )


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


class Checkpoint:
    """``{"version": 1, "entries": [...]}`` in one file, replaced atomically on every change."""

    VERSION = 1

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, Entry]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise MigError(f"MIG checkpoint {self.path} is unreadable ({exc}); move it away to start afresh "
                           "(instances nobody claims are then destroyed)") from None
        if not isinstance(doc, dict) or doc.get("version") != self.VERSION or not isinstance(doc.get("entries"), list):
            raise MigError(f"MIG checkpoint {self.path}: expected {{\"version\": 1, \"entries\": [...]}}")
        out = {}
        for i, raw in enumerate(doc["entries"]):
            try:
                e = Entry(**raw)
            except TypeError as exc:
                raise MigError(f"MIG checkpoint {self.path}: entry {i} is invalid ({exc})") from None
            out[e.key] = e
        return out

    def save(self, entries: Mapping[str, Entry]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = json.dumps({"version": self.VERSION, "entries": [asdict(e) for e in entries.values()]}, indent=1)
        with open(tmp, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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

    def __init__(self, nvml: MigNvml, checkpoint: Checkpoint, gpus: Iterable[str],
                 after_step: Callable[[str], None] | None = None) -> None:
        self.nvml = nvml
        self.checkpoint = checkpoint
        self.gpus = list(gpus)
        self.after_step = after_step or (lambda step: None)
        self._lock = threading.Lock()
        self._profiles: dict[str, dict[str, GpuProfile]] = {}
        self.entries: dict[str, Entry] = {}
        self._seq = 0  # counts prepare calls; collect() spares entries made after its snapshot
        self._made: dict[str, int] = {}

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
    def recover(self, claims: Sequence[tuple[PodRef, MigAllocation]] = (), destroy_unclaimed: bool = True) -> list[str]:
        """Start-up: undo interrupted creations, adopt instances that live pods' annotations
        name (``claims``), destroy the instances nobody claims (unless ``destroy_unclaimed`` is
        False: the pods could not be read). Returns what was done (lines)."""
        with self._lock:
            for gpu in self.gpus:
                self.nvml.enable(gpu)
            self.entries = self.checkpoint.load()
            done = []
            for key, e in list(self.entries.items()):
                if e.state != "ready":
                    done.append(self._undo(e, "interrupted creation"))
                    del self.entries[key]
            self._adopt(claims, done)
            self.checkpoint.save(self.entries)
            if destroy_unclaimed:
                done += self._destroy_unclaimed()
            return done

    def _undo(self, e: Entry, why: str) -> str:
        gi = e.gpu_instance_id
        if gi is None:  # killed before recording the id: the instance at that placement nobody claims
            owned = {x.gpu_instance_id for x in self.entries.values() if x.gpu_uuid == e.gpu_uuid and x.key != e.key}
            gi = next((i.gi for i in self.nvml.instances(e.gpu_uuid)
                       if i.profile == e.profile and i.start == e.start and i.gi not in owned), None)
        if gi is not None:
            self.nvml.destroy(e.gpu_uuid, gi)
        return f"{why}: pod {e.pod} container {e.container} device {e.device}: {e.profile} at {e.start} on " \
               f"{e.gpu_uuid}" + (f" (GPU instance {gi} destroyed)" if gi is not None else " (nothing was created)")

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
            self.entries[key] = Entry(pod.uid, f"{pod.namespace}/{pod.name}", a.container, a.device, a.gpu_uuid,
                                      a.profile, a.start, a.size, "ready", inst.gi, inst.ci, inst.mig_uuid)
            done.append(f"adopted GPU instance {inst.gi} ({a.profile} at {a.start}) on {a.gpu_uuid} for pod "
                        f"{pod.namespace}/{pod.name} from its annotation")

    def _destroy_unclaimed(self) -> list[str]:
        done = []
        for gpu in self.gpus:
            owned = {e.gpu_instance_id for e in self.entries.values() if e.gpu_uuid == gpu}
            for inst in self.nvml.instances(gpu):
                if inst.gi not in owned:
                    self.nvml.destroy(gpu, inst.gi)
                    done.append(f"destroyed GPU instance {inst.gi} ({inst.profile} at {inst.start}) on {gpu}: "
                                "claimed by no pod")
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
            raise MigError(f"pod {pod.namespace}/{pod.name}: GPU {a.gpu_uuid} of its MIG allocation is not on this node")
        profile = self._profile(a.gpu_uuid, a.profile)
        if (a.start, a.size) not in profile.placements:
            raise MigError(f"pod {pod.namespace}/{pod.name}: placement {a.start}+{a.size} is not one of profile "
                           f"{a.profile}'s on {a.gpu_uuid} ({profile.placements})")
        key = f"{pod.uid}/{a.container}/{a.device}"
        e = self.entries.get(key)
        if e is not None and e.state == "ready" and self._still_there(e):
            return self._runtime(a, e)
        if e is not None:  # a half-made or vanished instance of this very entry: start over
            self._undo(e, "redo")
            del self.entries[key]
        self._check_free(pod, a)
        e = Entry(pod.uid, f"{pod.namespace}/{pod.name}", a.container, a.device, a.gpu_uuid, a.profile, a.start, a.size)
        self.entries[key] = e
        self._save("intent")
        gi = self._unclaimed_at(a) or self.nvml.create_gi(a.gpu_uuid, profile, a.start)
        self.after_step("gi-created")
        e = self.entries[key] = replace(e, gpu_instance_id=gi)
        self._save("gi-recorded")
        inst = next((i for i in self.nvml.instances(a.gpu_uuid) if i.gi == gi), None)
        ci, mig = (inst.ci, inst.mig_uuid) if inst is not None and inst.ci is not None else \
            self.nvml.create_ci(a.gpu_uuid, gi, profile)
        self.after_step("ci-created")
        e = self.entries[key] = replace(e, compute_instance_id=ci, mig_uuid=mig, state="ready")
        self._save("ready")
        log.info("pod %s: %s at %d on %s is GPU instance %d, MIG device %s", e.pod, a.profile, a.start, a.gpu_uuid, gi, mig)
        return self._runtime(a, e)

    @staticmethod
    def _runtime(a: MigAllocation, e: Entry) -> MigAllocation:
        return replace(a, mig_uuid=e.mig_uuid, gpu_instance_id=e.gpu_instance_id, compute_instance_id=e.compute_instance_id)

    def _still_there(self, e: Entry) -> bool:
        return any(i.gi == e.gpu_instance_id and i.ci is not None and i.mig_uuid == e.mig_uuid
                   for i in self.nvml.instances(e.gpu_uuid))

    def _check_free(self, pod: PodRef, a: MigAllocation) -> None:
        for x in self.entries.values():
            if x.gpu_uuid == a.gpu_uuid and x.pod_uid != pod.uid and x.start < a.start + a.size and a.start < x.start + x.size:
                raise PlacementHeld(x, f"pod {pod.namespace}/{pod.name}: placement {a.start}+{a.size} on {a.gpu_uuid} "
                                       f"is still held by pod {x.pod} ({x.profile} at {x.start})")

    def _unclaimed_at(self, a: MigAllocation) -> int | None:
        """An instance of that profile at that placement that no entry claims (left by an earlier
        attempt of this entry): reused instead of created."""
        owned = {x.gpu_instance_id for x in self.entries.values() if x.gpu_uuid == a.gpu_uuid}
        return next((i.gi for i in self.nvml.instances(a.gpu_uuid)
                     if i.profile == a.profile and i.start == a.start and i.gi not in owned), None)

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
                self._made.pop(key, None)
                if e.gpu_instance_id is not None:
                    self.nvml.destroy(e.gpu_uuid, e.gpu_instance_id)
                del self.entries[key]
                self.checkpoint.save(self.entries)
                done.append(f"pod {e.pod} is gone: destroyed GPU instance {e.gpu_instance_id} ({e.profile} at "
                            f"{e.start}) on {e.gpu_uuid}")
            return done


class PlacementHeld(MigError):
    """The placement belongs to another pod's entry (which may be gone: collect, then retry)."""

    def __init__(self, holder: Entry, message: str) -> None:
        super().__init__(message)
        self.holder = holder
