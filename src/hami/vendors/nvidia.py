"""NVIDIA backend (HAMi ``NVIDIA``): requests, admission defaults and the per-device rules.

Everything generic (fit loop, capacity rules, scoring, annotation grammar) lives in the core
and :class:`~hami.vendors.base.BaseVendor`; this module holds what is NVIDIA's own: resource
names and defaults from ``device-config.yaml`` (§3.3, §5.4), the type/mode/UUID annotations.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

from hami.config import NvidiaConfig
from hami.core.codec import decode_pair_scores
from hami.core.errors import RequestError
from hami.core.health import HealthMemo, HealthVerdict, nvidia_health
from hami.core.quantity import container_resources
from hami.core.reasons import Reason
from hami.core.types import PERCENT_UNSET, ContainerDeviceRequest, DeviceInfo

from .base import BaseVendor, ResourceNames, Selection, _lookup


def _env_append(container: dict, name: str, value: str) -> None:
    env = container.setdefault("env", [])
    env.append({"name": name, "value": value})


class NvidiaVendor(BaseVendor):
    name = "NVIDIA"
    request_type = "NVIDIA"
    config_section = "nvidia"
    register_annotation = "hami.io/node-nvidia-register"
    register_format = "json"
    handshake_annotation = "hami.io/node-handshake"
    allocated_annotation = "hami.io/vgpu-devices-allocated"
    to_allocate_annotation = "hami.io/vgpu-devices-to-allocate"
    lock_annotation = "hami.io/mutex.lock"
    use_type_annotation = "nvidia.com/use-gputype"
    nouse_type_annotation = "nvidia.com/nouse-gputype"
    use_uuid_annotation = "nvidia.com/use-gpuuuid"
    nouse_uuid_annotation = "nvidia.com/nouse-gpuuuid"
    mode_annotation = "nvidia.com/vgpu-mode"
    numa_bind_annotation = "nvidia.com/numa-bind"
    score_annotation = "hami.io/node-nvidia-score"
    summary_prefilter = True

    def __init__(self, config: NvidiaConfig | None = None) -> None:
        self.config = config or NvidiaConfig()
        c = self.config
        super().__init__(
            ResourceNames(
                count=c.resource_count_name, memory=c.resource_memory_name,
                memory_percentage=c.resource_memory_percentage_name, cores=c.resource_core_name,
                priority=c.resource_priority_name, memory_factor=c.memory_factor,
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
        res = _lookup(container, f"container {container.get('name', '?')!r}")
        present = _present(container)
        where = f"container {container.get('name', '?')!r}"
        pct = res(r.memory_percentage) if r.memory_percentage in present else None
        if pct is not None and not 0 <= pct <= 100:
            raise RequestError(f"{where}: {r.memory_percentage} must be an integer in 0..100, got {pct}")
        for name in (r.count, r.memory, r.cores):
            if name in present and res(name) < 0:
                raise RequestError(f"{where}: {name} must not be negative, got {res(name)}")
        if r.priority in container_resources(container)[0]:
            _env_append(container, "CUDA_TASK_PRIORITY", str(res(r.priority)))
        if self.config.gpu_core_policy != "default":
            _env_append(container, "GPU_CORE_UTILIZATION_POLICY", self.config.gpu_core_policy)
        limits = container.setdefault("resources", {}).setdefault("limits", {})
        if r.count not in present and present & {r.cores, r.memory, r.memory_percentage}:
            if self.config.default_gpu_num > 0:
                limits[r.count] = self.config.default_gpu_num
                present.add(r.count)
        uses = r.count in present
        if uses and r.cores not in present:
            exclusive = pct == 100 or not r.memory or not present & {r.memory, r.memory_percentage}
            if exclusive:
                limits[r.cores] = 100
        if uses and self.config.runtime_class_name:
            spec = pod.setdefault("spec", {})
            if not spec.get("runtimeClassName"):
                spec["runtimeClassName"] = self.config.runtime_class_name
        if not uses and self.config.overwrite_env:
            _env_append(container, "NVIDIA_VISIBLE_DEVICES", "none")
        return uses

    # ------------------------------------------------------------------ requests (§5.4)
    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        r = self.resources
        res = _lookup(container, where)
        nums = res(r.count)
        if nums < 0:
            raise RequestError(f"{where}: {r.count} must not be negative, got {nums}")
        if nums == 0:
            return None
        mem = res(r.memory)
        if mem < 0:
            raise RequestError(f"{where}: {r.memory} must not be negative, got {mem}")
        mem *= r.memory_factor
        pct = res(r.memory_percentage) if r.memory_percentage in _present(container) else PERCENT_UNSET
        if pct > 100 and pct != PERCENT_UNSET:
            raise RequestError(f"{where}: {r.memory_percentage} must be an integer in 0..100, got {pct}")
        if pct <= 0:
            pct = PERCENT_UNSET
        if pct == PERCENT_UNSET and mem == 0:
            if self.config.default_memory:
                mem = self.config.default_memory
            else:
                pct = 100
        cores = res(r.cores) if r.cores in _present(container) else self.config.default_cores
        if cores < 0:
            raise RequestError(f"{where}: {r.cores} must not be negative, got {cores}")
        return ContainerDeviceRequest(
            vendor=self.name, nums=nums, type=self.request_type, memreq=mem,
            mem_percentage=pct, coresreq=min(cores, 100),
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
        if base is not None:
            return base
        if device.mode == "mig":
            # MIG profile placement is not implemented: never place on a MIG-mode GPU.
            return Reason.CARD_MIG_TOPOLOGY_INFEASIBLE
        return None


def _present(container: Mapping[str, Any]) -> set[str]:
    res = container.get("resources") or {}
    return set(res.get("limits") or {}) | set(res.get("requests") or {})
