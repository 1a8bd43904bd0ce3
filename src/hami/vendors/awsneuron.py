"""AWS Neuron (Inferentia / Trainium; HAMi backend ``AWSNeuron``): devices from node capacity.

Facts: §3.4, §4.1, §8.2, §8.3. ``aws.amazon.com/neuron: n`` takes n whole devices;
``aws.amazon.com/neuroncore: k`` takes one core (k = 1) or k / coresPerDevice whole devices (k a
multiple of the cores per device, ``awsneuron.coresPerDevice``, default 2). Devices: ``capacity(
neuron)`` of them with ``cores = capacity(neuroncore) / capacity(neuron)`` cores each, IDs
``<node>-AWSNeuron-<i>`` (HAMi's ``GetNodeDevices``); a device record has one slot per core.

Cores are bitmasks, as in HAMi: bit n stands for NeuronCore n of the device. ``devcore`` is the
mask of the device's addressable cores (HAMi addresses at most 4: ``0b11`` on Inf2 / Trn1,
``0b1111`` on Inf1), and a grant's cores are the mask of the cores it holds: the whole mask for a
whole device, the lowest free bit for one core. Grants on one device never share a bit, so the
sum the ledger keeps per device is their union.

Several devices are taken as one contiguous run, as HAMi's ``graphSelect`` takes them (the
devices of an instance are linked in a ring on Inferentia, in a torus on Trainium): on a node
whose ``node.kubernetes.io/instance-type`` names an Inferentia (``inf``) any run of consecutive
indexes; on another instance type (Trainium) runs of 4, 8 or 16 starting at a multiple of their
size, other counts refused (``NumaNotFit``). A node without that label is not an Inferentia: the
Trainium rules (HAMi reads the missing label as an empty type).

Decision annotations: ``AWS_NEURON_IDS`` (device indexes for ``aws.amazon.com/neuron``; for
``aws.amazon.com/neuroncore`` the set bits of each grant as core IDs ``index x cores + n``),
``NEURON_ALLOC_TIME`` (unix ns), ``NEURON_ALLOCATED=false``, ``NEURON_RESOURCE_TYPE`` (the core
resource's name, ``aws.amazon.com/neuroncore``, when the IDs are cores; absent when they are
devices, as HAMi writes it), ``aws.amazon.com/predicate-node``. No node lock.

A namespace quota on the core resource counts the cores a grant's mask names (its set bits), both
for the pods placed (the ledger) and for the device a pod is fitted on (:meth:`AwsNeuronVendor.quota_cores`):
a whole device charges the cores the node's devices have, not ``coresPerDevice``.

Our releases before this one wrote IDs ``<node>-awsneuron-<i>`` and counted cores instead of
naming them (a whole device: its core count; one core: 1, the core named only in the
owner-editable ``AWS_NEURON_IDS``): :meth:`AwsNeuronVendor.read_allocation` reads such
allocations in today's form, a single core of unknown position closing its device to new cores
until it ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from hami.config import AwsNeuronConfig
from hami.core.errors import RequestError
from hami.core.reasons import Reason
from hami.core.types import ContainerDevice, ContainerDeviceRequest, DeviceInfo, PodSingleDevice

from .base import BaseVendor, ResourceNames, lookup
from .common import capacity, present, synth_cards, where_of

#: HAMi's ``maxCoresPerNeuronDevice``: the cores of one device a mask addresses.
MAX_ADDRESSABLE_CORES = 4
#: A core of the device, which one unknown (a single-core grant of our earlier releases): a bit
#: above every addressable core, so that it counts as one core and never as a real one.
UNKNOWN_CORE = 1 << MAX_ADDRESSABLE_CORES
#: Device IDs our earlier releases synthesised: ``<node>-awsneuron-<i>``.
_LEGACY_ID = re.compile(r"^(?P<node>.*)-awsneuron-(?P<index>\d+)$")
IDS_ANNOTATION = "AWS_NEURON_IDS"
ALLOC_TIME_ANNOTATION = "NEURON_ALLOC_TIME"
ALLOCATED_ANNOTATION = "NEURON_ALLOCATED"
RESOURCE_TYPE_ANNOTATION = "NEURON_RESOURCE_TYPE"
PREDICATE_NODE_ANNOTATION = "aws.amazon.com/predicate-node"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
#: device counts a Trainium instance takes, each as a run aligned on its size (HAMi ``graphSelect``)
TRAINIUM_RUNS = (4, 8, 16)


def core_mask(cores: int) -> int:
    """The mask of a device's addressable cores (its ``devcore``)."""
    return (1 << max(0, min(cores, MAX_ADDRESSABLE_CORES))) - 1


def set_bits(mask: int) -> list[int]:
    """Positions of the set bits of ``mask``, lowest first."""
    return [n for n in range(mask.bit_length()) if mask >> n & 1]


@dataclass(frozen=True, slots=True)
class NeuronRequest(ContainerDeviceRequest):
    single_core: bool = False  # True: one NeuronCore; False: whole devices
    by_core: bool = False  # asked through the core resource (AWS_NEURON_IDS lists cores)


class AwsNeuronVendor(BaseVendor):
    cores_unit = "NeuronCores"  # devcore = mask of the device's cores, a grant = mask of its cores
    cores_are_masks = True  # a namespace quota counts a grant's set bits (the ledger)
    name = "AWSNeuron"
    request_type = "AWSNeuron"
    allocated_annotation = "hami.io/aws-neuron-devices-allocated"
    to_allocate_annotation = None
    lock_annotation = None
    use_uuid_annotation = "aws.amazon.com/use-neuron-uuid"
    nouse_uuid_annotation = "aws.amazon.com/nouse-neuron-uuid"
    decision_annotations = (
        IDS_ANNOTATION,
        ALLOC_TIME_ANNOTATION,
        ALLOCATED_ANNOTATION,
        RESOURCE_TYPE_ANNOTATION,
        PREDICATE_NODE_ANNOTATION,
    )

    chooses = True  # several devices: a contiguous run (choose)

    def __init__(self, config: AwsNeuronConfig | None = None) -> None:
        c = self.config = config or AwsNeuronConfig()
        super().__init__(ResourceNames(count=c.resource_count_name, cores=c.resource_core_name))

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        devices = capacity(node, self.resources.count)
        if devices <= 0:
            return ()
        cores = capacity(node, self.resources.cores) // devices or self.config.cores_per_device
        kind = ((node.get("metadata") or {}).get("labels") or {}).get(INSTANCE_TYPE_LABEL)
        return synth_cards(
            node,
            self.name,
            self.name,
            devices,
            count=cores,
            devmem=0,
            devcore=core_mask(cores),
            type_=self.name,
            custominfo={"instanceType": kind} if isinstance(kind, str) and kind else None,
            source=self.resources.count,
        )

    def choose(
        self,
        devices: Sequence[DeviceInfo],
        request: ContainerDeviceRequest,
        candidates: Sequence[int],
        prior: Sequence[str],
    ) -> Sequence[int] | Reason:
        """One device: the best-ranked. Several: the first contiguous run of free devices (the
        Neuron runtime links them in a ring or torus, and the device plugin hands out what
        ``AWS_NEURON_IDS`` names)."""
        n = request.nums
        if n == 1:
            return list(candidates[:1])
        at = {devices[j].index: j for j in candidates}
        kind = str((devices[candidates[0]].custominfo or {}).get("instanceType") or "") if candidates else ""
        if "inf" not in kind.lower():  # (no label: an empty type, not an Inferentia, as in HAMi)
            if n not in TRAINIUM_RUNS:
                return Reason.NUMA_NOT_FIT
            starts: Sequence[int] = range(0, max(at) + 1, n)
        else:
            starts = sorted(at)
        for s in starts:
            if all(s + k in at for k in range(n)):
                return [at[s + k] for k in range(n)]
        return Reason.NUMA_NOT_FIT

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
        # coresreq: the cores each pick asks (HAMi's Coresreq): a whole device, the configured cores
        # per device; a namespace quota on the core resource is charged the cores the grant takes
        # on the device chosen (quota_cores), which may have more
        if cores == 1:
            return NeuronRequest(
                vendor=self.name, nums=1, type=self.request_type, coresreq=1, single_core=True, by_core=True
            )
        n = devices or cores // self.config.cores_per_device
        if not n:
            return None
        per = self.config.cores_per_device
        return NeuronRequest(vendor=self.name, nums=n, type=self.request_type, coresreq=per, by_core=not devices)

    def capacity_check(self, device, used, usedmem, usedcores, request, mem, mutex, quota_fits):
        single = getattr(request, "single_core", False)
        if not single and used > 0:
            return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
        if device.count <= used or not device.devcore & ~usedcores or usedcores & ~device.devcore:
            # (a bit outside the device's cores: a grant whose core is unknown, or masks that
            # overlap; which cores are free cannot be told, so none is handed out)
            return Reason.CARD_TIME_SLICING_EXHAUSTED
        if not quota_fits():
            return Reason.RESOURCE_QUOTA_NOT_FIT
        return None

    def grant_on(
        self, device: DeviceInfo, request: ContainerDeviceRequest, mem: int, usedcores: int
    ) -> ContainerDevice:
        mask = device.devcore  # a whole device: every core (capacity_check found none in use)
        if getattr(request, "single_core", False):
            free = device.devcore & ~usedcores
            mask = free & -free  # the lowest free core (HAMi's allocateCoreMask for one core)
        return ContainerDevice(uuid=device.id, type=self.request_type, usedmem=0, usedcores=mask, index=device.index)

    def grant(self, device: DeviceInfo, request: ContainerDeviceRequest, mem: int) -> ContainerDevice:
        return self.grant_on(device, request, mem, 0)

    def quota_cores(self, device: DeviceInfo, request: ContainerDeviceRequest, usedcores: int) -> int:
        """The mask the grant on ``device`` records (:meth:`grant_on`): a namespace quota counts
        its set bits, the cores the grant takes on that device (a whole device: every core it
        has, 4 on an Inf1 node whatever ``awsneuron.coresPerDevice`` says), as the ledger counts
        the pod once placed."""
        return self.grant_on(device, request, 0, usedcores).usedcores

    def read_device_id(self, device_id: str) -> str:
        """``<node>-awsneuron-<i>`` (our earlier releases' spelling, e.g. in a cordon list or a
        use/nouse annotation written then) is today's ``<node>-AWSNeuron-<i>``."""
        m = _LEGACY_ID.match(device_id)
        return f"{m['node']}-{self.name}-{m['index']}" if m else device_id

    def read_allocation(self, devices: PodSingleDevice, annotations: Mapping[str, str]) -> PodSingleDevice:
        """A placed pod's allocation in today's form: grants our earlier releases wrote (IDs
        ``<node>-awsneuron-<i>``, cores counted) get HAMi's ID and a core mask. A whole device
        recorded its core count c: mask ``core_mask(c)``. One core recorded 1; which core it was
        is only in ``AWS_NEURON_IDS``, which the pod's owner may edit (no guard covers it), so it
        is not trusted: the grant holds :data:`UNKNOWN_CORE`, a bit above every addressable core,
        and the device takes no other core until that pod ends (``capacity_check``). Other grants
        are returned unchanged."""
        if not any(_LEGACY_ID.match(cd.uuid) for ctr in devices for cd in ctr):
            return devices
        out = []
        for ctr in devices:
            row = []
            for cd in ctr:
                m = _LEGACY_ID.match(cd.uuid)
                if m is not None:
                    mask = UNKNOWN_CORE if cd.usedcores == 1 else core_mask(cd.usedcores)
                    cd = replace(cd, uuid=f"{m['node']}-{self.name}-{m['index']}", usedcores=mask)
                row.append(cd)
            out.append(tuple(row))
        return tuple(out)

    def pod_annotations(
        self, devices: PodSingleDevice, *, node: str = "", now: float = 0.0, pod: Any = None, view: Any = None
    ) -> dict[str, str]:
        out = super().pod_annotations(devices, node=node, now=now, pod=pod, view=view)
        if not any(devices):
            return out
        cores_of = {d.id: d.count for d in view.devices} if view is not None else {}
        containers = pod.containers if pod is not None else ()
        ids: list[int] = []
        by_core = False  # HAMi writes the resource type only when the IDs are cores
        for ci, ctr in enumerate(devices):
            req = containers[ci].for_vendor(self.name) if ci < len(containers) else None
            whole = req is not None and not getattr(req, "by_core", True)
            for cd in ctr:
                if whole:
                    ids.append(cd.index)
                    continue
                by_core = True
                stride = cores_of.get(cd.uuid) or cd.usedcores.bit_length()
                ids.extend(cd.index * stride + n for n in set_bits(cd.usedcores))
        out.update(
            {
                IDS_ANNOTATION: ",".join(map(str, ids)),
                ALLOC_TIME_ANNOTATION: str(int(now * 1_000_000_000)),
                ALLOCATED_ANNOTATION: "false",
                PREDICATE_NODE_ANNOTATION: node,
            }
        )
        if by_core:
            out[RESOURCE_TYPE_ANNOTATION] = self.resources.cores
        return out
