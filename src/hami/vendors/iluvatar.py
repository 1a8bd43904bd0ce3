"""Iluvatar CoreX GPUs, one HAMi backend per chip (``MR-V100``, ``MR-V50``, ``BI-V150``, ``BI-V100``).

Facts: §3.4, §4.2, §4.5, §7.1 ``iluvatars``, §8.3. Registration ``hami.io/node-<chip>-register`` in
the legacy colon form; memory (``iluvatar.ai/<chip>.vMem``) in units of 256 MiB; cores
(``iluvatar.ai/<chip>.vCore``) a percentage, default 0. Admission: a request of more than one GPU
takes whole GPUs (``vCore = 100 x count``) and every container holding the chip gets
``SOL_CONTINER_NAME=<container name>`` (HAMi's spelling, which the Iluvatar plugin reads).
"""

from __future__ import annotations

from typing import Any, Mapping

from hami.config import IluvatarChip
from hami.core.names import NODE_ANNOTATION_PREFIX
from hami.core.types import ContainerDeviceRequest

from .base import BaseVendor, ResourceNames, lookup
from .common import env_append, name_after_chip, percent_request, present, set_limit, where_of

UNIT_MIB = 256
CONTAINER_ENV = "SOL_CONTINER_NAME"


class IluvatarVendor(BaseVendor):
    register_format = "legacy"
    summary_prefilter = True  # generic capacity rules: the summary checks are safe

    def __init__(self, chip: IluvatarChip) -> None:
        self.chip = chip
        cw = chip.common_word
        name_after_chip(self, cw, f"{NODE_ANNOTATION_PREFIX}{cw}-register")
        super().__init__(
            ResourceNames(
                count=chip.resource_count_name,
                memory=chip.resource_memory_name,
                cores=chip.resource_core_name,
                memory_factor=UNIT_MIB,
            )
        )

    def admit_container(self, container: dict, pod: Mapping[str, Any]) -> bool:
        r = self.resources
        if r.count not in present(container):
            return False
        n = lookup(container, where_of(container))(r.count)
        if n > 1 and r.cores:
            set_limit(container, r.cores, 100 * n)
        env_append(container, CONTAINER_ENV, str(container.get("name", "")))
        return True

    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        return percent_request(self, container, where, default_cores=0)


def make_iluvatars(chips: list[IluvatarChip]) -> tuple[IluvatarVendor, ...]:
    return tuple(IluvatarVendor(c) for c in chips)
