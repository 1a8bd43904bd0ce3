"""The vendor protocol: what differs between accelerator backends, and nothing else.

The core owns ONE generic fit loop (``hami.core.fit``), scoring, the ledger and the wire
formats. A vendor module only supplies data (resource names, annotation keys) and a few hooks.
Most vendors subclass :class:`BaseVendor`, set class attributes and override one or two hooks.

How to add a vendor (e.g. Hygon DCU)
------------------------------------
1. Add its config section model to ``hami/config.py`` (HAMi key names, §7.1) if it has knobs.
2. Create ``hami/vendors/hygon.py`` with ``class HygonVendor(BaseVendor)`` setting:
   ``name`` (HAMi CommonWord / backend key: ``"DCU"``), ``request_type`` (type string written in
   the allocation annotation), ``resources`` (a
   :class:`ResourceNames` built from the config in ``__init__``), ``register_annotation``
   (``hami.io/node-dcu-register``), ``register_format`` (``"json"`` or ``"legacy"``),
   ``handshake_annotation``, ``allocated_annotation``/``to_allocate_annotation`` (§8.2),
   ``lock_annotation``, and the pod selection keys (``use_type_annotation`` ...).
   Then override only what really differs:
   * ``admit_container`` - webhook defaults/validation for one container (mutates a copy);
   * ``container_request`` - container resources -> :class:`ContainerDeviceRequest` (units!);
   * ``device_filter`` - static per-device checks (type/mode/uuid) returning a ``Reason``;
   * ``resolve_memory`` / ``capacity_check`` - when capacity rules differ from NVIDIA's;
   * ``node_devices`` - when devices come from ``status.capacity`` instead of an annotation;
   * ``grant`` - what one chosen device records (type string, cores in the vendor's unit);
   * ``custom_filter`` / ``place`` / ``repeats`` - sub-device slices (NVIDIA MIG): whether one more
     slice fits next to those held, which slice a chosen device gets, and whether one device may
     serve several of a container's ``nums``;
   * ``choose`` (with ``chooses = True``) - pick ``nums`` devices among ALL fitting candidates
     (topology groups, module pairs, one-card-per-pod rules) instead of the first ``nums``;
   * ``node_score`` (with ``node_score_neutral = False``) - a vendor term added to the node score;
   * ``pod_annotations`` - extra annotations the device plugin needs (gets node, now, pod); list
     their keys in ``decision_annotations`` (spelled once, as module constants both use): the
     webhook strips them from a pod that carries them at creation and the chart's allocation
     guard lets only hami's identities write them (the chart repeats them per device-config
     section in ``hami.decisionAnnotationKeys``, charts/hami/templates/_vendors.tpl; a test keeps
     the two equal).
3. Add one entry to ``hami.vendors.VENDORS`` (section name -> class). Nothing registers itself
   at import time; ``build_vendors(config)`` instantiates the vendors whose section is set.
4. Add table-driven tests in ``tests/unit/test_vendor_<name>.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, ClassVar, Mapping, Sequence

from hami.core.codec import decode_node_devices_json, decode_node_devices_legacy, encode_pod_devices
from hami.core.errors import CodecError, CoreError, RequestError
from hami.core.health import HealthMemo, HealthVerdict, handshake_health
from hami.core.names import NODE_LOCK
from hami.core.quantity import go_true
from hami.core.quantity import container_resources, parse_int_quantity
from hami.core.reasons import Reason
from hami.core.types import (
    PERCENT_UNSET,
    ContainerDevice,
    ContainerDeviceRequest,
    DeviceInfo,
    PodSingleDevice,
    Slice,
)


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """Extended-resource names of one vendor (HAMi ``ResourceNames``). Empty = not supported."""

    count: str
    memory: str = ""
    memory_percentage: str = ""
    cores: str = ""
    priority: str = ""
    memory_factor: int = 1  # quota limits and requests are multiplied by it
    #: A further factor for quota limits only (``limits.<memory>`` of a ResourceQuota), for a vendor
    #: that converts its memory request itself (MetaX sGPU, Enflame DRS: a pod asks in GiB, the
    #: request and the usage are MiB, so ``memory_factor`` stays 1 and the quota's GiB count 1024).
    quota_memory_factor: int = 1

    @property
    def quota_unit(self) -> int:
        """MiB one unit of a namespace quota's ``limits.<memory>`` counts."""
        return self.memory_factor * self.quota_memory_factor

    @property
    def asking(self) -> frozenset[str]:
        """The names a container asks for devices with (count, memory, memory percentage, cores;
        not priority): a container with one of them in its limits or requests wants this vendor."""
        return frozenset(n for n in (self.count, self.memory, self.memory_percentage, self.cores) if n)


@dataclass(frozen=True, slots=True)
class Selection:
    """A pod's device-selection annotations for one vendor, parsed once per pod."""

    use_types: tuple[str, ...] = ()  # lowercased, substring match against the model
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    modes: str | None = None  # raw mode annotation, e.g. "hami-core" or "mig,hami-core"
    numa_bind: bool = False


def _split_list(value: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (value or "").split(",") if p.strip())


#: The most distinct entries a pod's use/nouse type annotation may list. Every device the fit
#: visits is matched against each entry (and a tenant writes the list): a few models is the use.
MAX_TYPE_ENTRIES = 64


def _type_list(annotations: Mapping[str, str], key: str | None) -> tuple[str, ...]:
    """A use/nouse type annotation: its entries lowercased, duplicates dropped (first kept).
    RequestError naming the annotation past :data:`MAX_TYPE_ENTRIES` distinct entries."""
    if not key:
        return ()
    types = tuple(dict.fromkeys(t.lower() for t in _split_list(annotations.get(key))))
    if len(types) > MAX_TYPE_ENTRIES:
        raise RequestError(f"annotation {key}: {len(types)} distinct device types listed, more than {MAX_TYPE_ENTRIES}")
    return types


class BaseVendor:
    """Defaults shared by the HAMi backends that use the NVIDIA-style skeleton."""

    # ---- identity and wire names (class attributes; override in subclasses)
    name: ClassVar[str] = ""  # backend key (HAMi CommonWord), e.g. "NVIDIA"
    request_type: ClassVar[str] = ""  # TYPE written in allocation annotations
    register_annotation: ClassVar[str] = ""
    register_format: ClassVar[str] = "json"  # "json" | "legacy"
    handshake_annotation: ClassVar[str | None] = None
    allocated_annotation: ClassVar[str] = ""
    to_allocate_annotation: ClassVar[str | None] = None
    lock_annotation: ClassVar[str | None] = NODE_LOCK
    use_type_annotation: ClassVar[str | None] = None
    nouse_type_annotation: ClassVar[str | None] = None
    use_uuid_annotation: ClassVar[str | None] = None
    nouse_uuid_annotation: ClassVar[str | None] = None
    mode_annotation: ClassVar[str | None] = None
    numa_bind_annotation: ClassVar[str | None] = None
    #: Every key :meth:`pod_annotations` writes besides ``allocated_annotation`` and
    #: ``to_allocate_annotation`` (the vendor's device plugin reads them at Allocate, so they carry
    #: the decision as much as the allocation pair does): internal, like that pair.
    decision_annotations: ClassVar[tuple[str, ...]] = ()
    #: True when ``node_score`` always returns 0, which lets the core rank nodes from summaries.
    node_score_neutral: ClassVar[bool] = True
    #: True when :meth:`capacity_check` is at least as strict as the generic NVIDIA rules (free slot,
    #: free memory >= memreq, free cores >= cores, 100 cores needs an idle 100-core device) in the
    #: request's own units and :meth:`type_admits` is the type rule: the core may then skip whole
    #: nodes from their summaries. Leave False when units or rules differ.
    summary_prefilter: ClassVar[bool] = False
    #: True: the fit loop collects every fitting device and calls :meth:`choose`.
    chooses: ClassVar[bool] = False
    #: Node lock value: ``"owner"`` = ``<RFC3339>,<ns>,<pod>`` (hami.io/mutex.lock), ``"time"`` = bare RFC3339.
    lock_format: ClassVar[str] = "owner"
    #: Lock expiry in seconds; None = the scheduler's ``--node-lock-timeout``.
    lock_expiry_seconds: ClassVar[float | None] = None
    #: True: only devices whose registered type contains the request type (case-insensitively) are
    #: candidates, as in HAMi's generic fit (an NVIDIA device must say "NVIDIA" in its type).
    type_contains_request: ClassVar[bool] = False

    #: What a device's ``devcore`` and a grant's cores count, for people (the UI, docs): "percent" of
    #: one device for most vendors; see :meth:`core_unit` for vendors whose unit depends on the device.
    cores_unit: ClassVar[str] = "percent"
    #: Whether the webhook checks a namespace's cores quota with the pod's requested cores: False
    #: for a vendor whose quota counts a unit only the chosen device gives (AMD's compute units);
    #: the scheduler's fit checks it then, pick by pick.
    admission_quota_cores: ClassVar[bool] = True

    def core_unit(self, device: DeviceInfo) -> str:
        """The unit of ``device.devcore`` and of the cores granted on it (display only)."""
        return self.cores_unit

    resources: ResourceNames

    def __init__(self, resources: ResourceNames) -> None:
        self.resources = resources

    # ------------------------------------------------------------------ node registration
    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        """Devices this vendor registered on ``node`` (a Node dict). ``()`` when none.

        Raises :class:`CodecError` (message names the annotation) when the value is malformed.
        """
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        text = annotations.get(self.register_annotation)
        if not text:
            return ()
        try:
            return decode_registration(text, self.register_format, self.name)
        except CodecError as exc:
            raise CodecError(f"annotation {self.register_annotation}: {exc}") from None

    def check_health(self, node: Mapping[str, Any], now: datetime, memo: HealthMemo) -> HealthVerdict:
        """Registration-loop liveness (§4.4). Default: the generic handshake, or always healthy
        (re-read every pass) for vendors without a handshake annotation."""
        if not self.handshake_annotation:
            return HealthVerdict(True, True)
        meta = node.get("metadata") or {}
        value = (meta.get("annotations") or {}).get(self.handshake_annotation)
        return handshake_health(value, self.allocatable(node), now)

    def allocatable(self, node: Mapping[str, Any]) -> int:
        """``status.allocatable[<count resource>]`` as an int (0 when absent or unparsable)."""
        raw = ((node.get("status") or {}).get("allocatable") or {}).get(self.resources.count, 0)
        try:
            return parse_int_quantity(raw, "allocatable")
        except CoreError:
            return 0

    def pair_scores(self, node: Mapping[str, Any]) -> dict[str, dict[str, int]]:
        """Device-to-device link scores for the topology-aware policy; ``{}`` when not published."""
        return {}

    # ------------------------------------------------------------------ admission (webhook)
    def admit_container(self, container: dict, pod: Mapping[str, Any]) -> bool:
        """Apply admission defaults/validation to ``container`` IN PLACE (callers pass a copy).

        Returns whether the container uses this vendor. Raises ``RequestError`` on bad values.
        """
        limits, requests = container_resources(container)
        return self.resources.count in limits or self.resources.count in requests

    # ------------------------------------------------------------------ requests
    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        """Translate one (admitted) container into a request; ``None`` when it asks for nothing."""
        res = lookup(container, where)
        nums = res(self.resources.count)
        if not nums:
            return None
        mem = res(self.resources.memory) * self.resources.memory_factor
        return ContainerDeviceRequest(
            vendor=self.name,
            nums=nums,
            type=self.request_type,
            memreq=mem,
            mem_percentage=PERCENT_UNSET if mem else 100,
            coresreq=min(res(self.resources.cores), 100),
        )

    # ------------------------------------------------------------------ fit hooks
    def serves(self, device: DeviceInfo, request: ContainerDeviceRequest) -> bool:
        """Whether ``device`` is a candidate for ``request`` at all (not one counted in the reasons:
        HAMi leaves such devices out of the list it fits on)."""
        return not self.type_contains_request or request.type.lower() in device.type.lower()

    def selection(self, annotations: Mapping[str, str]) -> Selection:
        get = annotations.get
        return Selection(
            use_types=_type_list(annotations, self.use_type_annotation),
            nouse_types=_type_list(annotations, self.nouse_type_annotation),
            use_uuids=frozenset(map(self.read_device_id, _split_list(get(self.use_uuid_annotation or "")))),
            nouse_uuids=frozenset(map(self.read_device_id, _split_list(get(self.nouse_uuid_annotation or "")))),
            modes=get(self.mode_annotation) if self.mode_annotation else None,
            numa_bind=go_true(get(self.numa_bind_annotation or "")),  # as HAMi's assertNuma (ParseBool)
        )

    def device_filter(self, device: DeviceInfo, request: ContainerDeviceRequest, sel: Selection) -> Reason | None:
        """Static checks that do not depend on usage (type, mode, UUID lists)."""
        if not self.type_admits(device.type, sel):
            return Reason.CARD_TYPE_MISMATCH
        if sel.use_uuids and device.id not in sel.use_uuids:
            return Reason.CARD_UUID_MISMATCH
        if device.id in sel.nouse_uuids:
            return Reason.CARD_UUID_MISMATCH
        return None

    def type_admits(self, model: str, sel: Selection) -> bool:
        """Whether the pod's type selection accepts a device model. The core also uses it to skip
        whole nodes (from the set of models in the node summary), so it must depend only on
        ``model`` and ``sel``."""
        model = model.lower()
        if sel.use_types and not any(t in model for t in sel.use_types):
            return False
        return not any(t in model for t in sel.nouse_types)

    def resolve_memory(self, device: DeviceInfo, request: ContainerDeviceRequest) -> int:
        """MiB this request takes on ``device`` (absolute, or a percentage of its memory)."""
        if request.memreq > 0:
            return request.memreq
        if request.mem_percentage != PERCENT_UNSET:
            return device.devmem * request.mem_percentage // 100
        return 0

    def capacity_check(
        self,
        device: DeviceInfo,
        used: int,
        usedmem: int,
        usedcores: int,
        request: ContainerDeviceRequest,
        mem: int,
        mutex: bool,
        quota_fits: Callable[[], bool],
    ) -> Reason | None:
        """HAMi's NVIDIA capacity rules (§5.4 steps 6-14), in HAMi's order.

        ``quota_fits()`` tells whether taking this device keeps the namespace within quota.
        """
        bad = slot_check(device, used, mutex, quota_fits)
        if bad is not None:
            return bad
        if device.devmem - usedmem < mem:
            return Reason.CARD_INSUFFICIENT_MEMORY
        cores = request.coresreq
        if device.devcore - usedcores < cores:
            return Reason.CARD_INSUFFICIENT_CORE
        if device.devcore == 100 and cores == 100 and used > 0:
            return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
        if device.devcore != 0 and usedcores == device.devcore and cores == 0:
            return Reason.CARD_COMPUTE_UNITS_EXHAUSTED
        return None

    def custom_filter(
        self, device: DeviceInfo, request: ContainerDeviceRequest, mem: int, held: Sequence[Slice], repeat: int
    ) -> Reason | None:
        """HAMi's ``CustomFilterRule`` (§5.4 step 15), after every capacity rule passed. ``held``: the
        slices already taken on ``device`` (this pod's earlier containers included); ``repeat``: how
        many picks of ``mem`` this container already made on ``device``. None = fits."""
        return None

    def usage_filter(
        self,
        device: DeviceInfo,
        request: ContainerDeviceRequest,
        sel: Selection,
        used: int,
        holders: Mapping[str, int],
    ) -> Reason | None:
        """A selection rule that depends on whether the device is in use (``used``: the grants
        it holds, this pod's earlier containers included) and by whom (``holders``: the
        :meth:`holder_class` of each placed pod holding it -> how many such pods), checked after
        :meth:`device_filter` (MetaX sGPU's QoS policy binds only a device in use; its app
        classes keep pods apart). Default: None."""
        return None

    def holder_class(self, annotations: Mapping[str, str], devices: PodSingleDevice = ()) -> str | tuple[str, ...]:
        """The class (or classes) a pod's annotations and ``devices`` (its grants of this vendor)
        put it in on this vendor's devices, which the ledger records per device for
        :meth:`usage_filter` (MetaX sGPU: its app class, and the QoS policy its shares run
        under). Default: "" (none; nothing is recorded)."""
        return ""

    def repeats(self, device: DeviceInfo, sel: Selection) -> bool:
        """True when ``device`` may serve more than one of a container's ``nums`` (the fit loop then
        visits it again, with the earlier picks counted). Also lifts ``NodeInsufficientDevice``."""
        return False

    def grant(self, device: DeviceInfo, request: ContainerDeviceRequest, mem: int) -> ContainerDevice:
        """The record of one chosen device (serialised in the allocation annotation)."""
        return ContainerDevice(
            uuid=device.id, type=request.type, usedmem=mem, usedcores=request.coresreq, index=device.index
        )

    def grant_on(
        self, device: DeviceInfo, request: ContainerDeviceRequest, mem: int, usedcores: int
    ) -> ContainerDevice:
        """:meth:`grant`, given the cores the device already holds (the ledger's figure plus this
        container's earlier picks of it): for a vendor whose grant names which cores it takes
        (AWS Neuron's core masks). Default: :meth:`grant`."""
        return self.grant(device, request, mem)

    def quota_cores(self, device: DeviceInfo, request: ContainerDeviceRequest, usedcores: int) -> int:
        """The cores one pick of ``request`` on ``device`` (which holds ``usedcores``) counts
        when the fit checks a namespace quota, in the unit of the grants (the pod's earlier picks
        count their grants' cores). Default: ``request.coresreq`` (HAMi's ask); a vendor whose
        grant's cores depend on the device says so (AWS Neuron: the mask :meth:`grant_on` records)."""
        return request.coresreq

    def place(self, device: DeviceInfo, granted: ContainerDevice, held: Sequence[Slice]) -> ContainerDevice:
        """HAMi's ``AddResourceUsage`` side effects for one granted device, given the slices already
        held on it: the default changes nothing; a slicing vendor returns the record with its
        :class:`Slice` (and the slice's own memory and cores)."""
        return granted

    def read_device_id(self, device_id: str) -> str:
        """A device ID a person or an earlier release of ours wrote (a cordon list, a use/nouse
        annotation) in today's spelling, for a vendor whose IDs changed. Default: as is."""
        return device_id

    def read_allocation(self, devices: PodSingleDevice, annotations: Mapping[str, str]) -> PodSingleDevice:
        """A placed pod's decoded allocation (``allocated_annotation``) in today's form, given all
        the pod's annotations: where an earlier release of ours wrote other device IDs or units, the
        vendor maps them here, so those pods keep counting against the right device. Default: as is."""
        return devices

    def read_slices(self, annotations: Mapping[str, str]) -> tuple[tuple[int, int, Slice], ...]:
        """Slices recorded on a placed pod, as ``(container index, device index, slice)``; ``()`` when
        the vendor has none. Raises :class:`CodecError` (naming the annotation) when malformed."""
        return ()

    def choose(
        self,
        devices: Sequence[DeviceInfo],
        request: ContainerDeviceRequest,
        candidates: Sequence[int],
        prior: Sequence[str],
    ) -> Sequence[int] | Reason:
        """Pick ``request.nums`` of ``candidates`` (positions in ``devices``, best-ranked first, all of
        which passed every check). ``prior``: UUIDs of this vendor already granted to earlier containers
        of the pod. Return the chosen positions, or the :class:`Reason` counted against every candidate.
        Only called when ``chooses`` is True and there are at least ``nums`` candidates."""
        return list(candidates[: request.nums])

    def node_score(self, node: str, devices: PodSingleDevice, policy: str, view: Any = None) -> float:
        """Vendor-specific node score added to the generic one (0 for neutral vendors).

        ``view`` (non-neutral vendors only): the node's :class:`~hami.core.fit.NodeView` BEFORE this
        pod's allocation (devices with their custominfo, and usage)."""
        return 0.0

    # ------------------------------------------------------------------ decision annotations
    def pod_annotations(
        self, devices: PodSingleDevice, *, node: str = "", now: float = 0.0, pod: Any = None, view: Any = None
    ) -> dict[str, str]:
        """Annotations recording this vendor's decision on the pod (§5.5).

        ``node``: the chosen node; ``now``: unix seconds of the decision; ``pod``: the
        :class:`~hami.core.types.PodRequest` (container names, the pod's annotations); ``view``: the
        node's :class:`~hami.core.fit.NodeView` before this pod (device custominfo, usage)."""
        value = encode_pod_devices(devices)
        out = {self.allocated_annotation: value}
        if self.to_allocate_annotation:
            out[self.to_allocate_annotation] = value
        return out


def slot_check(device: DeviceInfo, used: int, mutex: bool, quota_fits: Callable[[], bool]) -> Reason | None:
    """The first capacity rules, common to every vendor: a free slot, no exclusive conflict, quota."""
    if device.count <= used:
        return Reason.CARD_TIME_SLICING_EXHAUSTED
    if mutex and used > 0:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if not quota_fits():
        return Reason.RESOURCE_QUOTA_NOT_FIT
    return None


def decode_registration(text: str, fmt: str, vendor: str) -> tuple[DeviceInfo, ...]:
    """A registration value in ``fmt`` ("json" or "legacy"). A JSON-format vendor also accepts
    the legacy colon form (older plugins, HAMi's protocol doc): JSON values start with ``[``."""
    if fmt == "legacy" or not text.lstrip().startswith(("[", "{", "null")):
        try:
            return decode_node_devices_legacy(text, vendor)
        except CodecError as exc:
            if fmt == "legacy":
                raise
            raise CodecError(f"neither a JSON device list nor the legacy colon form ({exc})") from None
    return decode_node_devices_json(text, vendor)


def lookup(container: Mapping[str, Any], where: str):
    """``res(name)`` -> int from limits, else requests (HAMi: limits first); 0 when absent."""
    limits, requests = container_resources(container)

    def res(name: str) -> int:
        if not name:
            return 0
        if name in limits:
            return parse_int_quantity(limits[name], f"{where} limits.{name}")
        if name in requests:
            return parse_int_quantity(requests[name], f"{where} requests.{name}")
        return 0

    return res
