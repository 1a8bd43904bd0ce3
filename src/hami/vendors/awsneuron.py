"""AWS Neuron (Inferentia / Trainium; HAMi backend ``AWSNeuron``): devices from node capacity.

Facts: §3.4, §4.1, §8.2, §8.3. ``aws.amazon.com/neuron: n`` takes n whole devices;
``aws.amazon.com/neuroncore: k`` takes one core (k = 1) or k / coresPerDevice whole devices (k a
multiple of the cores per device, ``awsneuron.coresPerDevice``, default 2). Devices: ``capacity(
neuron)`` of them with ``capacity(neuroncore) / capacity(neuron)`` cores each, IDs
``<node>-awsneuron-<i>``; a device record has one slot per core and ``devcore`` = its cores.
Decision annotations: ``AWS_NEURON_IDS`` (device indexes, or core IDs ``index x cores + n`` for a
single core), ``NEURON_ALLOC_TIME`` (unix s), ``NEURON_ALLOCATED=false``, ``NEURON_RESOURCE_TYPE``
(``neuron`` | ``neuroncore``), ``aws.amazon.com/predicate-node``. No node lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from hami.config import AwsNeuronConfig
from hami.core.errors import RequestError
from hami.core.reasons import Reason
from hami.core.types import ContainerDevice, ContainerDeviceRequest, DeviceInfo, PodSingleDevice

from .base import BaseVendor, ResourceNames, lookup
from .common import capacity, present, synth_cards, where_of


@dataclass(frozen=True, slots=True)
class NeuronRequest(ContainerDeviceRequest):
    single_core: bool = False  # True: one NeuronCore; False: whole devices


class AwsNeuronVendor(BaseVendor):
    cores_unit = "NeuronCores"  # devcore = the device's cores
    name = "AWSNeuron"
    request_type = "AWSNeuron"
    allocated_annotation = "hami.io/aws-neuron-devices-allocated"
    to_allocate_annotation = None
    lock_annotation = None
    use_uuid_annotation = "aws.amazon.com/use-neuron-uuid"
    nouse_uuid_annotation = "aws.amazon.com/nouse-neuron-uuid"

    def __init__(self, config: AwsNeuronConfig | None = None) -> None:
        c = self.config = config or AwsNeuronConfig()
        super().__init__(ResourceNames(count=c.resource_count_name, cores=c.resource_core_name))

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        devices = capacity(node, self.resources.count)
        if devices <= 0:
            return ()
        cores = capacity(node, self.resources.cores) // devices or self.config.cores_per_device
        return synth_cards(node, self.name, "awsneuron", devices, count=cores, devmem=0, devcore=cores, type_=self.name)

    def _amounts(self, container: Mapping[str, Any], where: str) -> tuple[int, int]:
        r = self.resources
        res = lookup(container, where)
        devices, cores = res(r.count), res(r.cores)
        if devices < 0 or cores < 0:
            raise RequestError(f"{where}: {r.count} and {r.cores} must not be negative (got {devices}, {cores})")
        cpd = self.config.cores_per_device
        if cores > 1 and cores % cpd:
            raise RequestError(f"{where}: {r.cores} must be 1 or a multiple of {cpd} (cores per device), got {cores}")
        if devices and cores:
            raise RequestError(f"{where}: ask for {r.count} or {r.cores}, not both")
        return devices, cores

    def admit_container(self, container: dict, pod: Mapping[str, Any]) -> bool:
        r = self.resources
        if not present(container) & {r.count, r.cores}:
            return False
        self._amounts(container, where_of(container))
        return True

    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        devices, cores = self._amounts(container, where)
        if cores == 1:
            return NeuronRequest(vendor=self.name, nums=1, type=self.request_type, single_core=True)
        n = devices or cores // self.config.cores_per_device
        return NeuronRequest(vendor=self.name, nums=n, type=self.request_type) if n else None

    def capacity_check(self, device, used, usedmem, usedcores, request, mem, mutex, quota_fits):
        single = getattr(request, "single_core", False)
        if not single and used > 0:
            return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
        if device.count <= used or device.devcore - usedcores < 1:
            return Reason.CARD_TIME_SLICING_EXHAUSTED
        if not quota_fits():
            return Reason.RESOURCE_QUOTA_NOT_FIT
        return None

    def grant(self, device: DeviceInfo, request: ContainerDeviceRequest, mem: int) -> ContainerDevice:
        cores = 1 if getattr(request, "single_core", False) else device.devcore
        return ContainerDevice(uuid=device.id, type=self.request_type, usedmem=0, usedcores=cores, index=device.index)

    def pod_annotations(
        self, devices: PodSingleDevice, *, node: str = "", now: float = 0.0, pod: Any = None, view: Any = None
    ) -> dict[str, str]:
        out = super().pod_annotations(devices, node=node, now=now, pod=pod, view=view)
        grants = [cd for ctr in devices for cd in ctr]
        if not grants:
            return out
        pos = {d.id: i for i, d in enumerate(view.devices)} if view is not None else {}
        per_dev = {cd.uuid: view.devices[pos[cd.uuid]].devcore for cd in grants if cd.uuid in pos}
        single = any(cd.usedcores < per_dev.get(cd.uuid, cd.usedcores) for cd in grants)
        if single:
            taken: dict[str, int] = {}
            ids = []
            for cd in grants:
                base = view.usedcores[pos[cd.uuid]] + taken.get(cd.uuid, 0)
                taken[cd.uuid] = taken.get(cd.uuid, 0) + cd.usedcores
                ids.append(cd.index * per_dev[cd.uuid] + base)
        else:
            ids = list(dict.fromkeys(cd.index for cd in grants))
        out.update(
            {
                "AWS_NEURON_IDS": ",".join(map(str, ids)),
                "NEURON_ALLOC_TIME": str(int(now)),
                "NEURON_ALLOCATED": "false",
                "NEURON_RESOURCE_TYPE": "neuroncore" if single else "neuron",
                "aws.amazon.com/predicate-node": node,
            }
        )
        return out
