"""Biren GPUs (HAMi backend ``Biren``): whole devices, JSON registration (§4.5, §8.2, §8.3).

``birentech.com/gpu: n`` takes n whole GPUs. Registration ``hami.io/node-biren-register`` (devcore
forced to 100), handshake ``hami.io/node-handshake-biren``; selection ``birentech.com/use-biren`` /
``nouse-biren`` (type) and ``birentech.com/use-gpuuuid`` / ``nouse-gpuuuid``. Allocation keys:
``hami.io/Biren-devices-allocated`` / ``-to-allocate``.
"""

from __future__ import annotations

from hami.config import BirenConfig
from hami.core.names import node_handshake

from .base import ResourceNames
from .common import WholeDeviceVendor


class BirenVendor(WholeDeviceVendor):
    name = "Biren"
    request_type = "Biren"
    register_annotation = "hami.io/node-biren-register"
    handshake_annotation = node_handshake("biren")
    allocated_annotation = "hami.io/Biren-devices-allocated"
    to_allocate_annotation = "hami.io/Biren-devices-to-allocate"
    use_type_annotation = "birentech.com/use-biren"
    nouse_type_annotation = "birentech.com/nouse-biren"
    use_uuid_annotation = "birentech.com/use-gpuuuid"
    nouse_uuid_annotation = "birentech.com/nouse-gpuuuid"

    def __init__(self, config: BirenConfig | None = None) -> None:
        self.config = config or BirenConfig()
        super().__init__(ResourceNames(count=self.config.resource_count_name))
