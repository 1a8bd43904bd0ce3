"""Moore Threads GPUs (HAMi backend ``Mthreads``): cards from node capacity (§3.4, §4.1 b, §8.3).

* ``mthreads.com/sgpu-memory`` is in units of 512 MiB and must be one of 2, 4, 8, 16, 32, 64, 96;
  ``mthreads.com/sgpu-core`` counts cores, 16 per GPU. Both are per pod container and are divided
  by the GPU count to get per-GPU values.
* Admission: count must be > 0; a count n > 1 takes n whole GPUs (``sgpu-core = 16n``,
  ``sgpu-memory = 96n`` and the pod annotation ``mthreads.com/request-gpu-num = n``); a count of 1
  without memory takes a whole GPU.
* Cards: ``capacity(sgpu-core) / 16``, each ``capacity(sgpu-memory) * 512 / cards`` MiB, 100 slots.
* Single-card rule (HAMi ``customFilterRule``): a pod holds one GPU; the containers after the first
  one asking for a GPU each take that same GPU, so only single-GPU containers can follow it.
* Decision annotations: ``hami.io/mthreads-vgpu-devices-allocated``, ``mthreads.com/gpu-index``,
  ``mthreads.com/predicate-time`` (unix ns) and ``mthreads.com/predicate-node``. No node lock.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from hami.config import MthreadsConfig
from hami.core.errors import RequestError
from hami.core.reasons import Reason
from hami.core.types import PERCENT_UNSET, ContainerDeviceRequest, DeviceInfo, PodSingleDevice

from .base import BaseVendor, ResourceNames, lookup
from .common import capacity, non_negative, present, set_both, synth_cards, where_of

UNIT_MIB = 512
CORES_PER_GPU = 16
FULL_MEMORY_UNITS = 96
LEGAL_MEMORY = (2, 4, 8, 16, 32, 64, 96)
GPU_NUM_ANNOTATION = "mthreads.com/request-gpu-num"
GPU_INDEX_ANNOTATION = "mthreads.com/gpu-index"
PREDICATE_TIME_ANNOTATION = "mthreads.com/predicate-time"
PREDICATE_NODE_ANNOTATION = "mthreads.com/predicate-node"


class MthreadsVendor(BaseVendor):
    name = "Mthreads"
    request_type = "Mthreads"
    allocated_annotation = "hami.io/mthreads-vgpu-devices-allocated"
    to_allocate_annotation = None  # HAMi maps hami.io/mthreads-vgpu-devices-to-allocate but never writes it
    lock_annotation = None
    use_uuid_annotation = "mthreads.ai/use-gpuuuid"
    nouse_uuid_annotation = "mthreads.ai/nouse-gpuuuid"
    decision_annotations = (GPU_INDEX_ANNOTATION, PREDICATE_TIME_ANNOTATION, PREDICATE_NODE_ANNOTATION)
    chooses = True

    def __init__(self, config: MthreadsConfig | None = None) -> None:
        c = self.config = config or MthreadsConfig()
        super().__init__(
            ResourceNames(
                count=c.resource_count_name,
                memory=c.resource_memory_name,
                cores=c.resource_core_name,
                memory_factor=UNIT_MIB,
            )
        )

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        cards = capacity(node, self.resources.cores) // CORES_PER_GPU
        if cards <= 0:
            return ()
        mem = capacity(node, self.resources.memory) * UNIT_MIB // cards
        return synth_cards(
            node,
            self.name,
            "mthreads",
            cards,
            count=100,
            devmem=mem,
            devcore=CORES_PER_GPU,
            type_=self.name,
            source=f"{self.resources.cores} / {CORES_PER_GPU}",
        )

    def admit_container(self, container: dict, pod: Mapping[str, Any]) -> bool:
        r = self.resources
        if r.count not in present(container):
            return False
        where = where_of(container)
        res = lookup(container, where)
        n = res(r.count)
        if n <= 0:
            raise RequestError(f"{where}: {r.count} must be greater than 0, got {n}")
        if n > 1:
            set_both(container, r.cores, CORES_PER_GPU * n)
            set_both(container, r.memory, FULL_MEMORY_UNITS * n)
            pod.setdefault("metadata", {}).setdefault("annotations", {})[GPU_NUM_ANNOTATION] = str(n)  # type: ignore[union-attr]
            return True
        if r.memory not in present(container):
            set_both(container, r.memory, FULL_MEMORY_UNITS)
            set_both(container, r.cores, CORES_PER_GPU)
            return True
        mem = res(r.memory)
        if mem not in LEGAL_MEMORY:
            raise RequestError(
                f"{where}: {r.memory} must be one of {', '.join(map(str, LEGAL_MEMORY))} (units of 512 MiB), got {mem}"
            )
        return True

    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        r = self.resources
        res = lookup(container, where)
        n = res(r.count)
        if n == 0:
            return None
        mem, cores = res(r.memory), res(r.cores)
        non_negative(where, (r.count, n), (r.memory, mem), (r.cores, cores))
        mem = mem * UNIT_MIB // n
        return ContainerDeviceRequest(
            vendor=self.name,
            nums=n,
            type=self.request_type,
            memreq=mem,
            mem_percentage=PERCENT_UNSET if mem else 100,
            # as asked (HAMi caps at 100 only): more than a GPU's 16 cores does not fit, not 16
            coresreq=min(cores // n, 100),
        )

    def choose(
        self,
        devices: Sequence[DeviceInfo],
        request: ContainerDeviceRequest,
        candidates: Sequence[int],
        prior: Sequence[str],
    ) -> Sequence[int] | Reason:
        if prior:
            # HAMi's customFilterRule: a card fits only when every card the pod's earlier containers
            # hold is that card, so the pod holds one GPU: a later container asking several GPUs,
            # or any after one that holds several, does not fit (the plugin reads one gpu-index
            # list and one request-gpu-num for the whole pod)
            held = set(prior)
            same = [j for j in candidates if devices[j].id in held]
            if len(held) > 1 or request.nums > 1 or not same:
                return Reason.CARD_NOT_FOUND_CUSTOM_FILTER_RULE
            return same
        return list(candidates[: request.nums])

    def pod_annotations(
        self, devices: PodSingleDevice, *, node: str = "", now: float = 0.0, pod: Any = None, view: Any = None
    ) -> dict[str, str]:
        out = super().pod_annotations(devices, node=node, now=now, pod=pod, view=view)
        indexes = list(dict.fromkeys(cd.index for ctr in devices for cd in ctr))
        if indexes:
            out[GPU_INDEX_ANNOTATION] = ",".join(map(str, indexes))
            out[PREDICATE_TIME_ANNOTATION] = str(int(now * 1_000_000_000))
            out[PREDICATE_NODE_ANNOTATION] = node
        return out
