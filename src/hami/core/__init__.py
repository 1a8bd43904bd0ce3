"""The pure allocation core: no I/O, no clock reads, no globals.

Public API (import from here):

* types: :class:`DeviceInfo`, :class:`NodeDevices`, :class:`ContainerDeviceRequest`,
  :class:`ContainerRequest`, :class:`PodRequest`, :class:`ContainerDevice`,
  :class:`PodAllocation`, :class:`DeviceUse`, ``PERCENT_UNSET``
* codec: ``decode_node_devices_json``/``encode_node_devices_json``, legacy colon codec,
  ``encode_pod_devices``/``decode_pod_devices`` (``hami.io/vgpu-devices-allocated``)
* requests: ``admit_pod`` (webhook defaults), ``pod_request``
* reasons: :class:`Reason`, :class:`NodeFailure`
* ledger: :class:`Ledger` (set_node/remove_node, add_pod/reserve/remove_pod, set_quota),
  ``node_devices_from_object``, ``allocation_from_pod``, ``rebuild``
* scheduling: :class:`SchedulerConfig`, ``filter_pod`` (pure decision), ``schedule_pod``
  (drop old reservation + decide + reserve), :class:`FilterResult`
* explaining (import from :mod:`.explain`): ``pending_verdict``, every node's verdict for a
  pending pod
"""

from .codec import (
    decode_node_devices_json,
    decode_node_devices_legacy,
    decode_pod_devices,
    encode_node_devices_json,
    encode_node_devices_legacy,
    encode_pod_devices,
)
from .errors import CodecError, ConfigError, CoreError, RequestError
from .reasons import NodeFailure, Reason, parse_reason
from .ledger import (
    Ledger,
    allocation_from_pod,
    make_allocation,
    node_devices_from_object,
    read_node_devices,
    pod_key,
    quota_admission_check,
    rebuild,
)
from .requests import admit_pod, pod_request
from .schedule import FilterResult, SchedulerConfig, filter_pod, schedule_pod
from .usage import collapse
from .types import (
    PERCENT_UNSET,
    ContainerDevice,
    ContainerDeviceRequest,
    ContainerKind,
    ContainerRequest,
    DeviceInfo,
    DeviceUse,
    NodeDevices,
    PodAllocation,
    PodRequest,
)

__all__ = [
    "PERCENT_UNSET",
    "CodecError",
    "ConfigError",
    "ContainerDevice",
    "ContainerDeviceRequest",
    "ContainerKind",
    "ContainerRequest",
    "CoreError",
    "DeviceInfo",
    "DeviceUse",
    "FilterResult",
    "Ledger",
    "NodeDevices",
    "NodeFailure",
    "PodAllocation",
    "PodRequest",
    "Reason",
    "RequestError",
    "SchedulerConfig",
    "admit_pod",
    "allocation_from_pod",
    "collapse",
    "decode_node_devices_json",
    "decode_node_devices_legacy",
    "decode_pod_devices",
    "encode_node_devices_json",
    "encode_node_devices_legacy",
    "encode_pod_devices",
    "filter_pod",
    "make_allocation",
    "node_devices_from_object",
    "read_node_devices",
    "parse_reason",
    "pod_key",
    "pod_request",
    "quota_admission_check",
    "rebuild",
    "schedule_pod",
]
