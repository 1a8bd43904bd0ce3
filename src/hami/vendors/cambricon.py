"""Cambricon MLU (HAMi backend ``MLU``): cards synthesised from node capacity (§4.1 b, §8.3).

* ``cambricon.com/mlu.smlu.vmemory`` is in units of 256 MiB; ``cambricon.com/mlu.smlu.vcore`` is a
  percentage of one card, default 100 (a plain ``cambricon.com/vmlu: 1`` takes a whole card).
* Cards: ``capacity(vcore) / 100`` of them, each with ``capacity(vmemory)*256*100/capacity(vcore)``
  MiB, 100 slots and 100 cores; IDs ``<node>-cambricon-mlu-<i>``.
* Decision annotations: the HAMi allocation pair plus ``CAMBRICON_DSMLU_PROFILE =
  "<index>_<cores>_<memory/256>"`` (first container holding an MLU) and the "not yet assigned"
  mark ``"false"`` under both spellings: ``CAMBRICON_DSMLU_ASSIGNED`` (HAMi's today) and
  ``CAMBRICON_DSMLU_ASSIGHED`` (Cambricon's device plugin, and HAMi before it fixed the typo: the
  plugin in dynamic-smlu mode looks for its pending pod by that key, sets it ``"true"`` and frees
  the node lock). Node lock: ``cambricon.com/dsmlu.lock`` (bare RFC3339
  time, expires after 2 minutes).
"""

from __future__ import annotations

from typing import Any, Mapping

from hami.config import CambriconConfig
from hami.core.types import ContainerDeviceRequest, DeviceInfo, PodSingleDevice

from .base import BaseVendor, ResourceNames
from .common import capacity, percent_request, synth_cards

UNIT_MIB = 256
PROFILE_ANNOTATION = "CAMBRICON_DSMLU_PROFILE"
ASSIGNED_ANNOTATION = "CAMBRICON_DSMLU_ASSIGNED"
#: the key Cambricon's own device plugin reads (its spelling; HAMi wrote it so until it fixed the typo)
PLUGIN_ASSIGNED_ANNOTATION = "CAMBRICON_DSMLU_ASSIGHED"


class CambriconVendor(BaseVendor):
    name = "MLU"
    request_type = "MLU"
    allocated_annotation = "hami.io/cambricon-mlu-devices-allocated"
    to_allocate_annotation = "hami.io/cambricon-mlu-devices-to-allocate"
    lock_annotation = "cambricon.com/dsmlu.lock"
    lock_format = "time"
    lock_expiry_seconds = 120.0
    use_type_annotation = "cambricon.com/use-mlutype"
    nouse_type_annotation = "cambricon.com/nouse-mlutype"
    use_uuid_annotation = "cambricon.com/use-gpuuuid"
    nouse_uuid_annotation = "cambricon.com/nouse-gpuuuid"
    decision_annotations = (PROFILE_ANNOTATION, ASSIGNED_ANNOTATION, PLUGIN_ASSIGNED_ANNOTATION)
    summary_prefilter = True  # generic capacity rules: the summary checks are safe

    def __init__(self, config: CambriconConfig | None = None) -> None:
        c = self.config = config or CambriconConfig()
        super().__init__(
            ResourceNames(
                count=c.resource_count_name,
                memory=c.resource_memory_name,
                cores=c.resource_core_name,
                memory_factor=UNIT_MIB,
            )
        )

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        vcore = capacity(node, self.resources.cores)
        vmem = capacity(node, self.resources.memory)
        cards = vcore // 100
        if cards <= 0:
            return ()
        return synth_cards(
            node,
            self.name,
            "cambricon-mlu",
            cards,
            count=100,
            devmem=vmem * UNIT_MIB * 100 // vcore,
            devcore=100,
            type_=self.name,
            source=f"{self.resources.cores} / 100",
        )

    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        return percent_request(self, container, where, default_cores=100)

    def pod_annotations(
        self, devices: PodSingleDevice, *, node: str = "", now: float = 0.0, pod: Any = None, view: Any = None
    ) -> dict[str, str]:
        out = super().pod_annotations(devices, node=node, now=now, pod=pod, view=view)
        first = next((ctr[0] for ctr in devices if ctr), None)
        if first is not None:
            out[PROFILE_ANNOTATION] = f"{first.index}_{first.usedcores}_{first.usedmem // UNIT_MIB}"
            out[ASSIGNED_ANNOTATION] = "false"
            out[PLUGIN_ASSIGNED_ANNOTATION] = "false"
        return out
