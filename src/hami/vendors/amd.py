"""AMD Instinct GPUs (HAMi backend ``AMD``): registration ``hami.io/node-amd-register`` (JSON).

Facts: §3.4, §4.5, §8.2, §8.3. ``amd.com/gpumem`` is MiB (omitted: the whole card's memory);
``amd.com/gpucores`` is a percentage 1..100 (checked at admission) turned, per GPU, into a count
of compute units ``max(1, floor(devcore x pct / 100))`` where the registration's ``devcore`` is the
GPU's total CUs. The allocation annotation records the CU count and the GPU's product name as
type. A request of 100 percent takes the GPU exclusively.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from hami.config import AmdConfig
from hami.core.errors import RequestError
from hami.core.names import NODE_LOCK
from hami.core.reasons import Reason
from hami.core.types import ContainerDevice, ContainerDeviceRequest, DeviceInfo

from .base import BaseVendor, ResourceNames, lookup
from .common import capacity_health, percent_request, present, where_of


def compute_units(device: DeviceInfo, pct: int) -> int:
    return max(1, device.devcore * pct // 100) if pct > 0 else 0


class AmdVendor(BaseVendor):
    cores_unit = "compute units"  # devcore = the GPU's CUs; grants record CUs
    admission_quota_cores = False  # the quota's unit (CUs) depends on the GPU: the scheduler checks it
    name = "AMD"
    request_type = "AMD"
    register_annotation = "hami.io/node-amd-register"
    register_format = "json"
    allocated_annotation = "hami.io/amd-devices-allocated"
    to_allocate_annotation = "hami.io/amd-devices-to-allocate"
    lock_annotation = NODE_LOCK
    use_type_annotation = "amd.com/use-gputype"
    nouse_type_annotation = "amd.com/nouse-gputype"
    use_uuid_annotation = "amd.com/use-gpu-uuid"
    nouse_uuid_annotation = "amd.com/nouse-gpu-uuid"

    def __init__(self, config: AmdConfig | None = None) -> None:
        c = self.config = config or AmdConfig()
        super().__init__(
            ResourceNames(count=c.resource_count_name, memory=c.resource_memory_name, cores=c.resource_core_name)
        )

    def check_health(self, node: Mapping[str, Any], now: Any, memo: Any) -> Any:
        return capacity_health(self, node)

    def admit_container(self, container: dict, pod: Mapping[str, Any]) -> bool:
        r = self.resources
        has = present(container)
        if r.cores in has:
            where = where_of(container)
            pct = lookup(container, where)(r.cores)
            if not 1 <= pct <= 100:
                raise RequestError(f"{where}: {r.cores} must be an integer in 1..100, got {pct}")
        return r.count in has

    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        return percent_request(self, container, where, default_cores=0)

    def capacity_check(self, device, used, usedmem, usedcores, request, mem, mutex, quota_fits):
        if request.coresreq >= 100 and used > 0:
            return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
        in_cus = replace(request, coresreq=compute_units(device, request.coresreq))
        return super().capacity_check(device, used, usedmem, usedcores, in_cus, mem, mutex, quota_fits)

    def quota_cores(self, device: DeviceInfo, request: ContainerDeviceRequest, usedcores: int) -> int:
        """Compute units, as the grant records them and the ledger counts the pod once placed: a
        namespace's ``limits.amd.com/gpucores`` is in CUs (HAMi's quota usage counts the same).
        Counted in percent here, a 50% pick on a 304-CU MI300X was checked as 50 but charged 152."""
        return compute_units(device, request.coresreq)

    def grant(self, device: DeviceInfo, request: ContainerDeviceRequest, mem: int) -> ContainerDevice:
        return ContainerDevice(
            uuid=device.id,
            type=device.type,
            usedmem=mem,
            usedcores=compute_units(device, request.coresreq),
            index=device.index,
        )
