"""Huawei Ascend NPUs (HAMi backends ``Ascend910A`` ... ``Ascend310P``), one backend per chip.

Facts: reference §3.4 (admission), §4.5 (keys), §5.6 (NetworkID node score), §7.1 (``vnpus``),
§8.3 (templates, hami-core soft mode, 910C superPod pairs).

* Memory is snapped up to the smallest vNPU template (hard split); a request above every template
  but within ``memoryCapacity`` becomes the whole card (``memoryAllocatable``).
* Soft split: pod annotation ``huawei.com/vnpu-mode: hami-core`` takes memory raw and cores as a
  percentage; only on soft-split nodes, elsewhere ``ModeNotFit``. A node is soft-split when its
  ``hami-vnpu-core`` annotation says ``"true"`` (the Ascend device plugin writes ``"true"`` or
  ``"false"`` with every registration); ``vnpus.hamiVnpuCore`` decides only for a node without
  that annotation (HAMi: the node's annotation takes precedence over the global default).
* 910-series nodes whose devices all carry ``custominfo.NetworkID``: multi-NPU requests take the
  NetworkID groups with the most fitting devices first, and the node score rewards one-group picks.
  A NetworkID that is not a number or a string is dropped when the registration is read.
* 910C (``superPod: true``): whole modules only (NPUs ``2k`` and ``2k+1``), a request of 1 is
  admitted as 2.
* ``overwriteEnv``: a container that asks for no NPU of any configured chip gets
  ``ASCEND_VISIBLE_DEVICES=""`` (each chip's backend knows every chip's NPU resource).
* Decision annotations, read by the Ascend device plugin besides the allocation pair:
  ``huawei.com/<commonWord>`` (JSON list of the grants: UUID, and the vNPU template as ``temp``, or
  ``memory``/``core`` in soft mode) and ``predicate-time`` (unix seconds).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from hami.config import VnpuChip, VnpusConfig
from hami.core.codec import go_json
from hami.core.errors import RequestError
from hami.core.names import NODE_LOCK
from hami.core.reasons import Reason
from hami.core.types import PERCENT_UNSET, ContainerDeviceRequest, DeviceInfo, PodSingleDevice

from .base import BaseVendor, ResourceNames, Selection, lookup
from .common import (
    annotations_of,
    env_append,
    in_limits,
    name_after_chip,
    pod_annotation,
    present,
    set_both,
    set_runtime_class,
    where_of,
)

MODE_ANNOTATION = "huawei.com/vnpu-mode"
HAMI_CORE = "hami-core"
NODE_SOFT_ANNOTATION = "hami-vnpu-core"
PREDICATE_TIME = "predicate-time"
NETWORK_WEIGHT = 10
#: soft split: the container starts the hami-vnpu-core limiter shipped in the Ascend runtime image
LIMITER_START = ("sh", "-c", "RUST_LOG=info /hami-vnpu-core/limiter > /tmp/limiter_manager.log 2>&1 &")


class AscendVendor(BaseVendor):
    register_format = "json"
    lock_annotation = NODE_LOCK
    mode_annotation = MODE_ANNOTATION
    chooses = True
    #: node annotations read beside the registration (the scheduler re-reads a node when they change)
    node_annotations = (NODE_SOFT_ANNOTATION,)

    def core_unit(self, device: DeviceInfo) -> str:
        """AI cores of the chip (vNPU templates), or percent of the card in soft (hami-core) mode."""
        return "percent" if device.mode == HAMI_CORE else "AI cores"

    def __init__(self, chip: VnpuChip, soft_everywhere: bool = False) -> None:
        self.chip = chip
        self.soft_everywhere = soft_everywhere
        cw = chip.common_word
        name_after_chip(self, cw, f"hami.io/node-register-{cw}")
        self.runtime_annotation = f"huawei.com/{cw}"
        self.decision_annotations = (self.runtime_annotation, PREDICATE_TIME)
        self.node_score_neutral = not cw.startswith("Ascend910")
        self.templates = sorted(chip.templates, key=lambda t: t.memory)
        #: the NPU resource of every configured chip (:func:`make_ascend` sets them): a container
        #: asking for one of them gets its NPUs from that chip's backend, so ``overwriteEnv`` of the
        #: others must leave its ``ASCEND_VISIBLE_DEVICES`` alone
        self.npu_resources: frozenset[str] = frozenset({chip.resource_name})
        super().__init__(
            ResourceNames(
                count=chip.resource_name,
                memory=chip.resource_memory_name,
                cores=chip.resource_core_name,
                memory_factor=chip.memory_factor,
            )
        )

    # ------------------------------------------------------------------ templates
    def snap(self, mib: int) -> tuple[int, str]:
        """HAMi ``trimMemory``: (template memory, template name); whole card -> (allocatable, "");
        beyond ``memoryCapacity`` -> (0, "")."""
        for t in self.templates:
            if mib <= t.memory:
                return t.memory, t.name
        if mib <= self.chip.memory_capacity:
            return self.chip.memory_allocatable, ""
        return 0, ""

    # ------------------------------------------------------------------ registration
    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        devices = tuple(_checked_network_id(d) for d in super().node_devices(node))
        return tuple(replace(d, mode=HAMI_CORE) for d in devices) if self.node_is_soft(node) else devices

    def node_is_soft(self, node: Mapping[str, Any]) -> bool:
        """HAMi ``nodeSupportsHamiCore``: the node's ``hami-vnpu-core`` annotation when present,
        else the global ``vnpus.hamiVnpuCore``."""
        value = annotations_of(node).get(NODE_SOFT_ANNOTATION)
        if value is None:
            return self.soft_everywhere
        return value.lower() == "true"

    # ------------------------------------------------------------------ admission (§3.4)
    def admit_container(self, container: dict, pod: Mapping[str, Any]) -> bool:
        r, c = self.resources, self.chip
        where = where_of(container)
        if not in_limits(container, r.count):
            # only a container without NPUs (of any configured chip) is hidden from them: with two
            # chips, each backend saw "no NPU of mine" and blanked the other chip's container too
            if c.overwrite_env and not self.npu_resources & present(container):
                env_append(container, "ASCEND_VISIBLE_DEVICES", "")
            return False
        res = lookup(container, where)
        n = res(r.count)
        if n <= 0:
            raise RequestError(f"{where}: {r.count} must be a positive integer, got {n}")
        if c.super_pod and n == 1:
            n = 2
            limits = container["resources"]["limits"]
            limits[r.count] = 2
            requests = container["resources"].get("requests") or {}
            if r.count in requests:
                requests[r.count] = 2
        elif c.super_pod and n % 2:
            raise RequestError(f"{where}: {r.count} must be 1 or an even number on {self.name} (superPod), got {n}")
        soft = annotations_of(pod).get(MODE_ANNOTATION) == HAMI_CORE
        if r.cores and r.cores in present(container) and not soft:
            raise RequestError(f"{where}: {r.cores} needs the pod annotation {MODE_ANNOTATION}: {HAMI_CORE}")
        mem = c.memory_allocatable
        if r.memory and in_limits(container, r.memory):
            raw = res(r.memory)
            mem = raw if soft else self.snap(raw)[0]
            if mem <= 0:
                raise RequestError(
                    f"{where}: {r.memory} {raw} is invalid (largest {self.name} vNPU is "
                    f"{self.templates[-1].memory if self.templates else 0} MiB, card capacity "
                    f"{c.memory_capacity} MiB)"
                )
        if n > 1 and mem != c.memory_allocatable and c.super_pod:
            raise RequestError(
                f"{where}: {r.memory} {mem} asks for a vNPU, but {self.name} (superPod) is taken by whole "
                f"modules of 2 NPUs (a request of 1 is 2); leave {r.memory} out, or ask for whole NPUs"
            )
        if n > 1 and mem != c.memory_allocatable:
            raise RequestError(
                f"{where}: a vNPU ({r.memory} {mem}) cannot span {n} devices; ask for one device or whole cards"
            )
        if r.memory:
            set_both(container, r.memory, mem)
        if soft and r.cores and r.cores not in present(container):
            set_both(container, r.cores, 0)  # marks the soft split for the scheduler: memory stays raw
        if soft:
            lifecycle = container.setdefault("lifecycle", {})
            lifecycle.setdefault("postStart", {"exec": {"command": list(LIMITER_START)}})
        set_runtime_class(pod, c.runtime_class_name)  # type: ignore[arg-type]
        return True

    # ------------------------------------------------------------------ requests
    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        r = self.resources
        res = lookup(container, where)
        nums = res(r.count)
        if nums < 0:
            raise RequestError(f"{where}: {r.count} must not be negative, got {nums}")
        if nums == 0:
            return None
        mem = 0
        soft = bool(r.cores) and r.cores in present(container)
        if r.memory and r.memory in present(container):
            raw = res(r.memory) * r.memory_factor
            mem = raw if soft else self.snap(raw)[0]
            if mem <= 0:
                raise RequestError(
                    f"{where}: {r.memory} {raw} is larger than a {self.name} card ({self.chip.memory_capacity} MiB)"
                )
        cores = min(res(r.cores), 100) if soft else 0
        return ContainerDeviceRequest(
            vendor=self.name,
            nums=nums,
            type=self.request_type,
            memreq=mem,
            mem_percentage=PERCENT_UNSET if mem else 100,
            coresreq=cores,
        )

    # ------------------------------------------------------------------ fit hooks
    def device_filter(self, device: DeviceInfo, request: ContainerDeviceRequest, sel: Selection) -> Reason | None:
        bad = super().device_filter(device, request, sel)
        if bad is not None:
            return bad
        if sel.modes == HAMI_CORE and device.mode != HAMI_CORE:
            return Reason.MODE_NOT_FIT
        return None

    def capacity_check(self, device, used, usedmem, usedcores, request, mem, mutex, quota_fits):
        if device.mode == HAMI_CORE:  # soft split: cores are a percentage of the card
            device = replace(device, devcore=100)
        return super().capacity_check(device, used, usedmem, usedcores, request, mem, mutex, quota_fits)

    def choose(
        self,
        devices: Sequence[DeviceInfo],
        request: ContainerDeviceRequest,
        candidates: Sequence[int],
        prior: Sequence[str],
    ) -> Sequence[int] | Reason:
        n = request.nums
        if self.chip.super_pod and n > 1:
            return _whole_modules(devices, candidates, n)
        if n > 1 and self.name.startswith("Ascend910") and _all_have_network_id(devices, self.name):
            return _network_groups(devices, candidates, n)
        return list(candidates[:n])

    def node_score(self, node: str, devices: PodSingleDevice, policy: str, view: Any = None) -> float:
        if self.node_score_neutral or view is None:
            return 0.0
        by_id = {d.id: d for d in view.devices}
        score = 0.0
        for ctr in devices:
            if not ctr:
                continue
            ids = [_network_id(by_id.get(cd.uuid)) for cd in ctr]
            if any(i is None for i in ids):
                return 0.0
            score += max(ids.count(i) for i in set(ids)) / len(ids)
        return score * NETWORK_WEIGHT

    # ------------------------------------------------------------------ decision annotations
    def pod_annotations(
        self, devices: PodSingleDevice, *, node: str = "", now: float = 0.0, pod: Any = None, view: Any = None
    ) -> dict[str, str]:
        out = super().pod_annotations(devices, node=node, now=now, pod=pod, view=view)
        if not any(devices):
            return out
        soft = pod_annotation(pod, MODE_ANNOTATION) == HAMI_CORE
        info = []
        for ctr in devices:
            for cd in ctr:
                item: dict[str, Any] = {"UUID": cd.uuid}
                if soft:
                    item.update({k: v for k, v in (("memory", cd.usedmem), ("core", cd.usedcores)) if v})
                else:
                    temp = self.snap(cd.usedmem)[1]
                    if temp:
                        item["temp"] = temp
                info.append(item)
        out[PREDICATE_TIME] = str(int(now))
        out[self.runtime_annotation] = go_json(info)
        return out


def _valid_network_id(value: Any) -> bool:
    """A NetworkID the Ascend plugin writes: a JSON number (or a string). Anything else (a list, an
    object, a boolean) cannot name a group and reads as absent."""
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _checked_network_id(device: DeviceInfo) -> DeviceInfo:
    """``device`` with a ``custominfo.NetworkID`` that is not a number or a string left out (as if
    the plugin had not written one): the node's NPUs are then taken without NetworkID groups."""
    info = device.custominfo
    if not info or "NetworkID" not in info or _valid_network_id(info["NetworkID"]):
        return device
    rest = {k: v for k, v in info.items() if k != "NetworkID"}
    return replace(device, custominfo=rest or None)


def _network_id(device: DeviceInfo | None) -> Any:
    if device is None or not device.custominfo:
        return None
    value = device.custominfo.get("NetworkID")
    return value if _valid_network_id(value) else None


def _all_have_network_id(devices: Sequence[DeviceInfo], vendor: str) -> bool:
    mine = [d for d in devices if d.vendor == vendor]
    return bool(mine) and all(_network_id(d) is not None for d in mine)


def _network_groups(devices: Sequence[DeviceInfo], candidates: Sequence[int], n: int) -> list[int]:
    """Largest NetworkID groups first (ties: the group whose best device ranks first)."""
    groups: dict[Any, list[int]] = {}
    for j in candidates:
        groups.setdefault(_network_id(devices[j]), []).append(j)
    ordered = sorted(groups.values(), key=lambda g: -len(g))  # stable: rank order breaks ties
    return [j for g in ordered for j in g][:n]


def _whole_modules(devices: Sequence[DeviceInfo], candidates: Sequence[int], n: int) -> list[int] | Reason:
    """910C: NPUs ``2k`` and ``2k+1`` form one module; only complete modules are taken."""
    if n % 2:
        return Reason.CARD_NOT_FOUND_CUSTOM_FILTER_RULE
    modules: dict[int, list[int]] = {}
    for j in candidates:
        modules.setdefault(devices[j].index // 2, []).append(j)
    picked: list[int] = []
    for members in modules.values():
        if len(members) == 2 and len(picked) < n:
            picked.extend(sorted(members, key=lambda j: devices[j].index))
    return picked[:n] if len(picked) >= n else Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST


def make_ascend(config: VnpusConfig) -> tuple[AscendVendor, ...]:
    """``vnpus:`` section -> one backend per configured chip (the chart's chips when none is listed)."""
    vendors = tuple(AscendVendor(chip, config.hami_vnpu_core) for chip in config.chips())
    npus = frozenset(v.resources.count for v in vendors)
    for v in vendors:
        v.npu_resources = npus
    return vendors
