"""Hygon DCU (HAMi backend ``DCU``): legacy colon registration, generic fit (§4.2, §8.2, §8.3).

``hygon.com/dcumem`` is MiB (times ``memoryFactor``), ``hygon.com/dcucores`` a percentage with
default 100; registration ``hami.io/node-dcu-register`` in the old ``id,count,devmem,devcore,
type,numa,health[,index,mode]:`` form; handshake ``hami.io/node-handshake-dcu``.
"""

from __future__ import annotations

from typing import Any, Mapping

from hami.config import HygonConfig
from hami.core.names import node_handshake
from hami.core.types import ContainerDeviceRequest

from .base import BaseVendor, ResourceNames
from .common import percent_request


class HygonVendor(BaseVendor):
    name = "DCU"
    request_type = "DCU"
    register_annotation = "hami.io/node-dcu-register"
    register_format = "legacy"
    handshake_annotation = node_handshake("dcu")
    allocated_annotation = "hami.io/dcu-devices-allocated"
    to_allocate_annotation = "hami.io/dcu-devices-to-allocate"
    use_type_annotation = "hygon.com/use-dcutype"
    nouse_type_annotation = "hygon.com/nouse-dcutype"
    use_uuid_annotation = "hygon.com/use-gpuuuid"
    nouse_uuid_annotation = "hygon.com/nouse-gpuuuid"
    summary_prefilter = True  # generic capacity rules: the summary checks are safe

    def __init__(self, config: HygonConfig | None = None) -> None:
        c = self.config = config or HygonConfig()
        super().__init__(
            ResourceNames(
                count=c.resource_count_name,
                memory=c.resource_memory_name,
                cores=c.resource_core_name,
                memory_factor=c.memory_factor,
            )
        )

    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        return percent_request(self, container, where, default_cores=100)
