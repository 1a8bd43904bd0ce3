"""The pure allocation core: no I/O, no clock reads, no globals.

Public API (import from here):

* types: :class:`DeviceInfo`, :class:`NodeDevices`, :class:`ContainerDeviceRequest`,
  :class:`ContainerRequest`, :class:`PodRequest`, :class:`ContainerDevice`,
  :class:`PodAllocation`, :class:`DeviceUse`, ``PERCENT_UNSET``
* codec: ``decode_node_devices_json``/``encode_node_devices_json``, legacy colon codec,
  ``encode_pod_devices``/``decode_pod_devices`` (``hami.io/vgpu-devices-allocated``)
* requests: ``admit_pod`` (webhook defaults), ``pod_request``
* reasons: :class:`Reason`, :class:`NodeFailure`
* ledger, scheduling entry point: see ``hami.core.ledger`` and ``hami.core.schedule``
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
from .requests import admit_pod, pod_request
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
