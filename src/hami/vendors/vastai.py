"""Vastai accelerators (HAMi backend ``Vastai``): whole devices, JSON registration (§4.5, §8.2, §8.3).

``vastaitech.com/va: n`` takes n whole devices. Registration ``hami.io/node-va-register`` (devcore
forced to 100), handshake ``hami.io/node-handshake-va``; selection ``vastaitech.com/use-va`` /
``nouse-va`` (type) and ``vastaitech.com/use-gpuuuid`` / ``nouse-gpuuuid``. Allocation keys keep
HAMi's capital V: ``hami.io/Vastai-devices-allocated`` / ``-to-allocate``.
"""

from __future__ import annotations

from hami.config import VastaiConfig
from hami.core.names import node_handshake

from .base import ResourceNames
from .common import WholeDeviceVendor


class VastaiVendor(WholeDeviceVendor):
    name = "Vastai"
    request_type = "Vastai"
    register_annotation = "hami.io/node-va-register"
    handshake_annotation = node_handshake("va")
    allocated_annotation = "hami.io/Vastai-devices-allocated"
    to_allocate_annotation = "hami.io/Vastai-devices-to-allocate"
    use_type_annotation = "vastaitech.com/use-va"
    nouse_type_annotation = "vastaitech.com/nouse-va"
    use_uuid_annotation = "vastaitech.com/use-gpuuuid"
    nouse_uuid_annotation = "vastaitech.com/nouse-gpuuuid"

    def __init__(self, config: VastaiConfig | None = None) -> None:
        self.config = config or VastaiConfig()
        super().__init__(ResourceNames(count=self.config.resource_count_name))
