"""NVIDIA backend (HAMi ``NVIDIA``): requests, admission defaults and the per-device rules.

Everything generic (fit loop, capacity rules, scoring, annotation grammar) lives in the core
and :class:`~hami.vendors.base.BaseVendor`; this module holds what is NVIDIA's own: resource
names and defaults from ``device-config.yaml`` (§3.3, §5.4), the type/mode/UUID annotations,
and dynamic MIG (§5.4 step 15, ``AddResourceUsage``, §6.6): on a GPU registered with mode
``mig`` each granted device is one MIG instance, the smallest allowed profile (by memory, then
slice count) with ``memoryMB >= request`` and a placement that overlaps no held one; ``1g.*``
and ``3g.*`` take the highest free start, other profiles the lowest. The container's memory and
cores become the profile's. Reservations go to ``hami.io/vgpu-mig-allocations``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any, Mapping, Sequence

from hami.config import NvidiaConfig
from hami.core.codec import MigAllocation, decode_mig_allocations, decode_pair_scores, encode_mig_allocations
from hami.core.errors import CodecError, RequestError
from hami.core.health import HealthMemo, HealthVerdict, nvidia_health
from hami.core import names
from hami.core.names import NODE_HANDSHAKE, NODE_LOCK, VGPU_MIG_ALLOCATIONS
from hami.core.quantity import container_resources
from hami.core.reasons import Reason
from hami.core.types import (
    PERCENT_UNSET,
    ContainerDevice,
    ContainerDeviceRequest,
    DeviceInfo,
    MigProfile,
    PodSingleDevice,
    Slice,
)

from .base import BaseVendor, ResourceNames, Selection, lookup
from .common import env_append, present, set_limit, set_runtime_class, where_of


MIG_ALLOCATIONS_ANNOTATION = VGPU_MIG_ALLOCATIONS
#: the family of the two decision annotations below (the webhook keeps users off it)
VGPU_DEVICES_PREFIX = "hami.io/vgpu-devices-"
MIG_MODE = "mig"
MAX_MIG_INSTANCES = 16  # MIG instances of one container on one GPU
#: distinct device types whose allowed MIG profiles are remembered (the memo is cleared past it)
_ALLOWED_MEMO_MAX = 256

Placement = tuple[int, int]  # (start, size) in memory-slice units


def _prefers_high(profile: str) -> bool:
    return profile.startswith(("1g.", "3g."))


def _overlaps(a: Placement, b: Placement) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def select_mig(
    profiles: Sequence[MigProfile], occupied: Sequence[Placement], mem: int
) -> tuple[MigProfile, Placement] | None:
    """The smallest profile by ``(memoryMB, sliceCount)`` (stable: registration order breaks ties)
    with ``memoryMB >= mem`` and a placement overlapping none of ``occupied``; ``1g.*``/``3g.*``
    try placements from the highest start, the others from the lowest. None when nothing fits."""
    for p in sorted(profiles, key=lambda p: (p.memory_mb, p.slice_count)):
        if p.memory_mb < mem:
            continue
        places = sorted(p.placements, key=lambda pl: -pl[0] if _prefers_high(p.name) else pl[0])
        for pl in places:
            if pl[1] > 0 and not any(_overlaps(pl, o) for o in occupied):
                return p, pl
    return None


class NvidiaVendor(BaseVendor):
    name = "NVIDIA"
    request_type = "NVIDIA"
    register_annotation = "hami.io/node-nvidia-register"
    register_format = "json"
    handshake_annotation = NODE_HANDSHAKE
    allocated_annotation = "hami.io/vgpu-devices-allocated"
    to_allocate_annotation = "hami.io/vgpu-devices-to-allocate"
    lock_annotation = NODE_LOCK
    use_type_annotation = "nvidia.com/use-gputype"
    nouse_type_annotation = "nvidia.com/nouse-gputype"
    use_uuid_annotation = "nvidia.com/use-gpuuuid"
    nouse_uuid_annotation = "nvidia.com/nouse-gpuuuid"
    mode_annotation = "nvidia.com/vgpu-mode"
    numa_bind_annotation = "nvidia.com/numa-bind"
    decision_annotations = (MIG_ALLOCATIONS_ANNOTATION,)
    score_annotation = "hami.io/node-nvidia-score"
    summary_prefilter = True
    type_contains_request = True  # HAMi: the registered type must contain "NVIDIA" (compatibility.md)

    def __init__(self, config: NvidiaConfig | None = None) -> None:
        self.config = config or NvidiaConfig()
        #: device type -> the profile names ``migProfileAllowlist`` allows on it (None: all). Keyed
        #: by the type alone (not the registered profiles, which may be large) and cleared past
        #: :data:`_ALLOWED_MEMO_MAX` types: re-registrations with changing types cannot grow it.
        self._allowed_memo: dict[str, frozenset[str] | None] = {}
        c = self.config
        super().__init__(
            ResourceNames(
                count=c.resource_count_name,
                memory=c.resource_memory_name,
                memory_percentage=c.resource_memory_percentage_name,
                cores=c.resource_core_name,
                priority=c.resource_priority_name,
                memory_factor=c.memory_factor,
            )
        )

    def check_health(self, node: Mapping[str, Any], now: datetime, memo: HealthMemo) -> HealthVerdict:
        """NVIDIA: liveness = allocatable ``nvidia.com/gpu`` > 0; refresh = registration changed."""
        generic = super().check_health(node, now, memo)
        meta = node.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(self.register_annotation, "")
        return nvidia_health(memo, meta.get("name", ""), self.allocatable(node), text, generic)

    def pair_scores(self, node: Mapping[str, Any]) -> dict[str, dict[str, int]]:
        """``hami.io/node-nvidia-score``: ``[{"uuid": "GPU-a", "score": {"GPU-b": 200}}, ...]``."""
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(self.score_annotation)
        return decode_pair_scores(text, self.score_annotation) if text else {}

    # ------------------------------------------------------------------ admission (§3.3)
    def admit_container(self, container: dict, pod: dict) -> bool:
        r = self.resources
        where = where_of(container)
        res = lookup(container, where)
        has = present(container)
        pct = res(r.memory_percentage) if r.memory_percentage in has else None
        if pct is not None and not 0 <= pct <= 100:
            raise RequestError(f"{where}: {r.memory_percentage} must be an integer in 0..100, got {pct}")
        for name in (r.count, r.memory, r.cores):
            if name in has and res(name) < 0:
                raise RequestError(f"{where}: {name} must not be negative, got {res(name)}")
        if r.count not in has and has & {r.cores, r.memory, r.memory_percentage}:
            if self.config.default_gpu_num > 0:
                set_limit(container, r.count, self.config.default_gpu_num)
                has.add(r.count)
        uses = r.count in has
        if uses and r.cores not in has:
            exclusive = pct == 100 or not r.memory or not has & {r.memory, r.memory_percentage}
            if exclusive:
                set_limit(container, r.cores, 100)
        if uses:
            # env entries are set, not appended: a reinvoked webhook (reinvocationPolicy IfNeeded)
            # sees its own output and must not add them twice
            if r.priority in container_resources(container)[0]:
                env_append(container, names.ENV_TASK_PRIORITY, str(res(r.priority)))
            if self.config.gpu_core_policy != "default":
                env_append(container, names.ENV_CORE_POLICY, self.config.gpu_core_policy)
            set_runtime_class(pod, self.config.runtime_class_name)
        if not uses and self.config.overwrite_env:
            env_append(container, names.ENV_VISIBLE_DEVICES, "none")
        return uses

    # ------------------------------------------------------------------ requests (§5.4)
    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        r = self.resources
        res = lookup(container, where)
        nums = res(r.count)
        if nums < 0:
            raise RequestError(f"{where}: {r.count} must not be negative, got {nums}")
        if nums == 0:
            return None
        mem = res(r.memory)
        if mem < 0:
            raise RequestError(f"{where}: {r.memory} must not be negative, got {mem}")
        mem *= r.memory_factor
        pct = res(r.memory_percentage) if r.memory_percentage in present(container) else PERCENT_UNSET
        if pct > 100 and pct != PERCENT_UNSET:
            raise RequestError(f"{where}: {r.memory_percentage} must be an integer in 0..100, got {pct}")
        if pct <= 0:
            pct = PERCENT_UNSET
        if pct == PERCENT_UNSET and mem == 0:
            if self.config.default_memory:
                mem = self.config.default_memory
            else:
                pct = 100
        cores = res(r.cores) if r.cores in present(container) else self.config.default_cores
        if cores < 0:
            raise RequestError(f"{where}: {r.cores} must not be negative, got {cores}")
        return ContainerDeviceRequest(
            vendor=self.name,
            nums=nums,
            type=self.request_type,
            memreq=mem,
            mem_percentage=pct,
            coresreq=min(cores, 100),
        )

    # ------------------------------------------------------------------ per-device rules
    def device_filter(self, device: DeviceInfo, request: ContainerDeviceRequest, sel: Selection) -> Reason | None:
        base = super().device_filter(device, request, sel)
        if base is Reason.CARD_TYPE_MISMATCH:
            return base
        if sel.modes is not None and (device.mode or "hami-core") not in sel.modes:
            return Reason.CARD_TYPE_MISMATCH
        if request.type != self.request_type:
            return Reason.CARD_TYPE_MISMATCH
        return base

    # ------------------------------------------------------------------ dynamic MIG (§5.4, §6.6)
    def allowed_profiles(self, device: DeviceInfo) -> tuple[MigProfile, ...]:
        """The device's registered profiles, narrowed by ``migProfileAllowlist``: the first entry with
        a model contained in the device type limits the profiles to its list (an entry without
        profiles allows all). No matching entry (or no allowlist): every registered profile."""
        memo = self._allowed_memo
        if device.type in memo:
            names = memo[device.type]
        else:
            names = None
            for entry in self.config.mig_profile_allowlist:
                if any(m and m in device.type for m in entry.models):
                    names = frozenset(entry.profiles) if entry.profiles else None
                    break
            if len(memo) >= _ALLOWED_MEMO_MAX:
                memo.clear()
            memo[device.type] = names
        if names is None:
            return device.mig_profiles
        return tuple(p for p in device.mig_profiles if p.name in names)

    def repeats(self, device: DeviceInfo, sel: Selection) -> bool:
        """A MIG-mode GPU can host several instances of one container (HAMi revisits it), unless the
        pod's ``nvidia.com/vgpu-mode`` excludes MIG."""
        return device.mode == MIG_MODE and (sel.modes is None or MIG_MODE in sel.modes)

    def custom_filter(
        self, device: DeviceInfo, request: ContainerDeviceRequest, mem: int, held: Sequence[Slice], repeat: int
    ) -> Reason | None:
        """MIG: after placing this container's ``repeat`` earlier picks, one more instance of
        ``mem`` MiB must still find a profile and a free placement (``CardMigTopologyInfeasible``)."""
        if device.mode != MIG_MODE:
            return None
        if repeat >= MAX_MIG_INSTANCES:  # no GPU has more (7 on an A100 or H100); the node writes
            return Reason.CARD_MIG_TOPOLOGY_INFEASIBLE  # its own profiles, and each pick replays the last
        profiles = self.allowed_profiles(device)
        occupied = [(s.start, s.size) for s in held]
        for _ in range(repeat + 1):
            got = select_mig(profiles, occupied, mem)
            if got is None:
                return Reason.CARD_MIG_TOPOLOGY_INFEASIBLE
            occupied.append(got[1])
        return None

    def mig_detail(self, device: DeviceInfo, mem: int, held: Sequence[Slice], count: int = 1) -> str:
        """Why ``CardMigTopologyInfeasible`` for a container's ``count`` instances of ``mem`` MiB
        among ``held``, in words: no allowed profile is big enough (a request to change), fewer
        than ``count`` fit beside the instances there though one does (too many: the container's
        own instances fill the GPU), or the big-enough ones have no placement clear of the
        instances there (fragmented: wait, or ask for less)."""
        profiles = self.allowed_profiles(device)
        narrowed = len(profiles) < len(device.mig_profiles)
        allow = " allowed by migProfileAllowlist" if narrowed else ""
        if not profiles:
            return f"no MIG profile{allow} on this GPU"
        big = sorted((p for p in profiles if p.memory_mb >= mem), key=lambda p: (p.memory_mb, p.slice_count))
        if not big:
            largest = max(profiles, key=lambda p: p.memory_mb)
            return f"too small: no MIG profile{allow} has {mem} MiB (the largest, {largest.name}, has {largest.memory_mb} MiB)"
        taken = ", ".join(f"{s.profile or '?'}@{s.start}" for s in sorted(held, key=lambda s: s.start)) or "none"
        occupied, fit = [(s.start, s.size) for s in held], 0
        while fit < count and (got := select_mig(profiles, occupied, mem)) is not None:
            occupied.append(got[1])
            fit += 1
        if 0 < fit < count:
            return (
                f"too many: {count} instances of {mem} MiB asked, {fit} fit{'' if fit > 1 else 's'} beside the "
                f"instances there ({taken})"
            )
        names = ", ".join(dict.fromkeys(p.name for p in big))
        return f"fragmented: {names} would hold {mem} MiB, but no placement of it is clear of the instances there ({taken})"

    def place(self, device: DeviceInfo, granted: ContainerDevice, held: Sequence[Slice]) -> ContainerDevice:
        if device.mode != MIG_MODE:
            return granted
        got = select_mig(self.allowed_profiles(device), [(s.start, s.size) for s in held], granted.usedmem)
        if got is None:  # custom_filter accepted this very pick, so this is a bug, not bad input
            raise ValueError(f"MIG placement vanished for {granted.usedmem} MiB on {device.id}")
        profile, (start, size) = got
        return replace(
            granted,
            usedmem=profile.memory_mb,
            usedcores=profile.core,
            slice=Slice(uuid=device.id, profile=profile.name, start=start, size=size),
        )

    def pod_annotations(
        self, devices: PodSingleDevice, *, node: str = "", now: float = 0.0, pod: Any = None, view: Any = None
    ) -> dict[str, str]:
        out = super().pod_annotations(devices, node=node, now=now, pod=pod, view=view)
        entries = [
            MigAllocation(
                container=ci,
                device=di,
                gpu_uuid=cd.uuid,
                profile=cd.slice.profile,
                start=cd.slice.start,
                size=cd.slice.size,
            )
            for ci, ctr in enumerate(devices)
            for di, cd in enumerate(ctr)
            if cd.slice is not None
        ]
        if entries:
            out[MIG_ALLOCATIONS_ANNOTATION] = encode_mig_allocations(entries)
        return out

    def read_slices(self, annotations: Mapping[str, str]) -> tuple[tuple[int, int, Slice], ...]:
        text = annotations.get(MIG_ALLOCATIONS_ANNOTATION)
        if not text:
            return ()
        try:
            return tuple((e.container, e.device, e.slice) for e in decode_mig_allocations(text))
        except CodecError as exc:
            raise CodecError(f"annotation {MIG_ALLOCATIONS_ANNOTATION}: {exc}") from None
