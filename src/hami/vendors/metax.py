"""MetaX GPUs: whole cards (HAMi ``Metax-GPU``) and shared sGPUs (HAMi ``Metax-SGPU``).

Facts: §3.4, §4.1, §4.5, §5.6, §7.1 ``metax``, §8.2, §8.3.

MetaX GPU: ``metax-tech.com/gpu`` whole cards synthesised from node capacity (1 slot, 65536 MiB,
100 cores each, IDs ``<node>-metax-<i>`` as HAMi's ``GetNodeDevices`` spells them). The node score
reads the node annotations ``metax-tech.com/gpu.topology.losses`` (binpack: ``2000 - losses[n]``) and
``metax-tech.com/gpu.topology.scores`` (spread: ``2000 - scores[n]``), JSON maps from the number of
cards the pod takes on the node to a value. No node lock.

MetaX sGPU: devices from ``metax-tech.com/node-gpu-devices`` (MetaX's own JSON list). Memory
``metax-tech.com/vmemory`` is GiB when a plain number and bytes when it has a unit; ``vcore`` is a
percentage, default 100. Admission: ``metax-tech.com/sgpu-app-class`` must be ``online`` or
``offline`` and such a pod asks for exactly one sGPU; non-online pods get
``metax-tech.com/sgpu-qos-policy: best-effort`` by default, and the policy must be ``best-effort``,
``fixed-share`` or ``burst-share``. A device whose ``qosPolicy`` is set takes a share (``vcore``
below 100) only from pods of the same policy (``CardQosPolicyMismatch``); a request for the whole
sGPU (``vcore`` 100, the default) and an online pod skip the check, as in HAMi's
``checkDeviceQos``, and so does a share of an idle device (the plugin switches its policy). On a
device in use, the policy the placed pods' shares run under (recorded by the ledger per holder,
:meth:`MetaxSgpuVendor.holder_class`) overrides the registered one, as HAMi's ``AddResourceUsage``
does: a fixed-share pod placed on an sGPU registered best-effort (or with no policy) keeps
best-effort shares off it until it is gone. App
classes keep pods apart as HAMi's ``checkAppClass`` does: on a device in use, pods with an app class
(online, offline) and pods without one do not share, and an offline pod does not join an online
one (``CardAppClassMismatch``); the ledger records the app class of each pod holding a device
(:meth:`MetaxSgpuVendor.holder_class`). Online pods take no compute share. The node score is
policy-neutral: ``10000 x`` the average compute utilisation of the chosen sGPUs after placement
(binpack keeps the highest node score, spread the lowest). The decision annotations, read by
MetaX's device plugin at Allocate besides the HAMi allocation pair: ``metax-tech.com/gpu-devices-allocated``
(JSON, per container: uuid, compute, vRam of each sGPU, zeros left out as Go's ``omitempty``
leaves them) and ``metax-tech.com/predicate-time`` (unix nanoseconds, HAMi ``UnixNano``).

Our releases before this one spelled the MetaX GPU card IDs ``<node>-metax-gpu-<i>``:
:meth:`MetaxGpuVendor.read_allocation` reads such allocations with today's IDs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

from hami.config import MetaxConfig
from hami.core.codec import CAPACITY, INT64, go_json, go_loads, go_struct, int_field, shown
from hami.core.errors import CodecError, RequestError
from hami.core.health import HealthVerdict
from hami.core.names import NODE_LOCK
from hami.core.quantity import container_resources, parse_int_quantity
from hami.core.reasons import Reason
from hami.core.types import ContainerDeviceRequest, DeviceInfo, PodSingleDevice

from .base import BaseVendor, ResourceNames, Selection, lookup
from .common import (
    annotations_of,
    capacity,
    capacity_health,
    load_json,
    percent_request,
    present,
    set_both,
    synth_cards,
    where_of,
    whole_card_request,
)

LOSSES_ANNOTATION = "metax-tech.com/gpu.topology.losses"
SCORES_ANNOTATION = "metax-tech.com/gpu.topology.scores"
APP_CLASS_ANNOTATION = "metax-tech.com/sgpu-app-class"
QOS_ANNOTATION = "metax-tech.com/sgpu-qos-policy"
PREDICATE_TIME_ANNOTATION = "metax-tech.com/predicate-time"  # decision time, unix nanoseconds (HAMi UnixNano)
SGPU_ALLOCATED_ANNOTATION = "metax-tech.com/gpu-devices-allocated"  # the sGPU grants, as MetaX's plugin reads them
QOS_POLICIES = ("best-effort", "fixed-share", "burst-share")
APP_CLASSES = ("online", "offline")
CARD_MEMORY = 65536
GPU_ID_WORD = "metax"  # card IDs <node>-metax-<i> (HAMi GetNodeDevices)
#: the card IDs of our earlier releases, <node>-metax-gpu-<i> (a node's own name may contain anything)
_LEGACY_GPU_ID = re.compile(r"^(?P<node>.+)-metax-gpu-(?P<index>\d+)$")
EXCLUSIVE_CORES = 100  # a request for all of an sGPU's compute: HAMi skips the QoS check for it
#: the ledger's mark for the QoS policy a holder's share runs under (:meth:`MetaxSgpuVendor.holder_class`)
QOS_MARK = "qos:"


def unix_nanoseconds(seconds: float) -> int:
    """Unix seconds (a float) as integer nanoseconds, exact for whole seconds (what Go's
    ``time.Now().UnixNano()`` writes; the sub-second part is rounded to the microsecond, as
    far as a float holds it)."""
    whole = int(seconds)
    return whole * 1_000_000_000 + round((seconds - whole) * 1_000_000) * 1_000


class MetaxGpuVendor(BaseVendor):
    name = "Metax-GPU"
    request_type = "Metax-GPU"
    allocated_annotation = "hami.io/metax-gpu-devices-allocated"
    to_allocate_annotation = "hami.io/metax-gpu-devices-to-allocate"
    lock_annotation = None
    node_score_neutral = False

    def __init__(self, config: MetaxConfig | None = None) -> None:
        c = self.config = config or MetaxConfig()
        super().__init__(ResourceNames(count=c.resource_count_name))

    def check_health(self, node: Mapping[str, Any], now: Any, memo: Any) -> Any:
        return capacity_health(self, node)

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        cards = capacity(node, self.resources.count)
        if cards <= 0:
            return ()
        a = annotations_of(node)
        topo = {
            key: _count_map(a[ann], ann)
            for key, ann in (("losses", LOSSES_ANNOTATION), ("scores", SCORES_ANNOTATION))
            if a.get(ann)
        }
        return synth_cards(
            node,
            self.name,
            GPU_ID_WORD,
            cards,
            count=1,
            devmem=CARD_MEMORY,
            devcore=100,
            type_=self.name,
            custominfo=topo or None,
            source=self.resources.count,
        )

    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        return whole_card_request(self, container, where)

    def read_device_id(self, device_id: str) -> str:
        """``<node>-metax-gpu-<i>`` (our earlier releases' spelling, e.g. in a cordon list or a
        use/nouse annotation written then) is today's ``<node>-metax-<i>``."""
        m = _LEGACY_GPU_ID.match(device_id)
        return f"{m['node']}-{GPU_ID_WORD}-{m['index']}" if m else device_id

    def read_allocation(self, devices: PodSingleDevice, annotations: Mapping[str, str]) -> PodSingleDevice:
        """A placed pod's allocation in today's form: card IDs our earlier releases wrote
        (``<node>-metax-gpu-<i>``) become HAMi's (``<node>-metax-<i>``), so that those pods keep
        their cards after an upgrade; other grants are returned unchanged."""
        if not any(_LEGACY_GPU_ID.match(cd.uuid) for ctr in devices for cd in ctr):
            return devices
        out = []
        for ctr in devices:
            row = []
            for cd in ctr:
                m = _LEGACY_GPU_ID.match(cd.uuid)
                if m is not None:
                    cd = replace(cd, uuid=f"{m['node']}-{GPU_ID_WORD}-{m['index']}")
                row.append(cd)
            out.append(tuple(row))
        return tuple(out)

    def node_score(self, node: str, devices: PodSingleDevice, policy: str, view: Any = None) -> float:
        n = sum(len(ctr) for ctr in devices)
        mine = [d for d in (view.devices if view is not None else ()) if d.vendor == self.name]
        if not n or not mine or not mine[0].custominfo:
            return 0.0
        table = mine[0].custominfo.get("losses" if policy == "binpack" else "scores")
        if not table or n not in table:
            return 0.0
        return float(2000 - table[n])


def _count_map(text: str, where: str) -> dict[int, int]:
    data = load_json(text, f"annotation {where}")
    if not isinstance(data, dict):
        raise CodecError(f"annotation {where}: must be a JSON object from card count to value")
    out = {}
    for k, v in data.items():
        # a card count in ASCII digits (str.isdigit takes "²", which int() refuses); a value within
        # Go's int64 (the node score subtracts it from 2000 as a float)
        if not _CARD_COUNT.fullmatch(str(k)) or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise CodecError(f"annotation {where}: entry {shown(k)}: {shown(v)} must map a card count to a number")
        if not INT64[0] <= v <= INT64[1]:
            raise CodecError(f"annotation {where}: entry {shown(k)}: {shown(v)} is out of range (int64)")
        out[int(k)] = int(v)
    return out


#: a topology map's key: a card count, in ASCII digits (no node has a million cards)
_CARD_COUNT = re.compile(r"[0-9]{1,6}")


@dataclass(frozen=True, slots=True)
class SgpuSelection(Selection):
    qos: str = "best-effort"
    app_class: str = ""


_PLAIN = re.compile(r"^\s*\d+\s*$")
_SGPU_FIELDS = (
    "uuid",
    "totalDevCount",
    "totalCompute",
    "totalVRam",
    "numa",
    "model",
    "healthy",
    "qosPolicy",
    "linkZone",
    "bdf",
)


class MetaxSgpuVendor(BaseVendor):
    name = "Metax-SGPU"
    request_type = "Metax-SGPU"
    register_annotation = "metax-tech.com/node-gpu-devices"
    allocated_annotation = "hami.io/metax-sgpu-devices-allocated"
    to_allocate_annotation = "hami.io/metax-sgpu-devices-to-allocate"
    lock_annotation = NODE_LOCK
    use_uuid_annotation = "metax-tech.com/use-gpuuuid"
    nouse_uuid_annotation = "metax-tech.com/nouse-gpuuuid"
    decision_annotations = (SGPU_ALLOCATED_ANNOTATION, PREDICATE_TIME_ANNOTATION)
    node_score_neutral = False

    def __init__(self, config: MetaxConfig | None = None) -> None:
        c = self.config = config or MetaxConfig()
        super().__init__(
            ResourceNames(
                count=c.resource_vcount_name,
                memory=c.resource_vmemory_name,
                cores=c.resource_vcore_name,
                quota_memory_factor=1024,  # vmemory is GiB in a pod (a plain number) and a quota; usage is MiB
            )
        )

    # ------------------------------------------------------------------ registration
    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        text = annotations_of(node).get(self.register_annotation)
        if not text:
            return ()
        where = f"annotation {self.register_annotation}"
        data = go_loads(text, f"{where}: ")
        if not isinstance(data, list):
            raise CodecError(f"{where}: must be a JSON array of devices")
        return tuple(self._device(obj, i, where) for i, obj in enumerate(data))

    def _device(self, raw: Any, i: int, where: str) -> DeviceInfo:
        # keys matched as Go's encoding/json matches them (exact, else case-insensitive; null = absent)
        obj = go_struct(raw, _SGPU_FIELDS) if isinstance(raw, dict) else None
        if obj is None or not isinstance(obj.get("uuid"), str) or not obj["uuid"]:
            raise CodecError(f"{where}: device[{i}] must be an object with a non-empty 'uuid'")
        # count, compute and memory within HAMi's int32 (as every registration's): the scores divide
        # by them as floats; numa non-negative within Go's int
        w = f"{where}: device[{i}] ({obj['uuid']})"
        ints = {key: int_field(obj, key, w, CAPACITY) for key in ("totalDevCount", "totalCompute", "totalVRam")}
        ints["numa"] = int_field(obj, "numa", w, (0, INT64[1]))
        return DeviceInfo(
            id=obj["uuid"],
            index=i,
            count=ints["totalDevCount"],
            devmem=ints["totalVRam"],
            devcore=ints["totalCompute"],
            type=str(obj.get("model") or self.name),
            numa=ints["numa"],
            health=obj.get("healthy") is True,
            vendor=self.name,
            custominfo={k: obj[k] for k in ("qosPolicy", "linkZone", "bdf") if obj.get(k) not in (None, "")} or None,
        )

    def check_health(self, node: Mapping[str, Any], now: Any, memo: Any) -> Any:
        """HAMi: healthy when the annotation parses to at least one device (§4.4)."""
        try:
            return HealthVerdict(bool(self.node_devices(node)), True)
        except CodecError:
            return HealthVerdict(False, True)

    # ------------------------------------------------------------------ admission
    def admit_container(self, container: dict, pod: Mapping[str, Any]) -> bool:
        r = self.resources
        if r.count not in present(container):
            return False
        where = where_of(container)
        annotations = pod.setdefault("metadata", {}).setdefault("annotations", {})  # type: ignore[union-attr]
        app = annotations.get(APP_CLASS_ANNOTATION)
        if app is not None:
            if app not in APP_CLASSES:
                raise RequestError(f"annotation {APP_CLASS_ANNOTATION}: must be online or offline, got {app!r}")
            n = lookup(container, where)(r.count)
            if n != 1:
                raise RequestError(f"{where}: {r.count} must be 1 for a pod with {APP_CLASS_ANNOTATION}, got {n}")
        if app == "online":
            if r.cores:
                set_both(container, r.cores, 0)
            return True
        qos = annotations.setdefault(QOS_ANNOTATION, "best-effort")
        if qos not in QOS_POLICIES:
            raise RequestError(f"annotation {QOS_ANNOTATION}: must be one of {', '.join(QOS_POLICIES)}, got {qos!r}")
        return True

    # ------------------------------------------------------------------ requests
    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        return percent_request(self, container, where, default_cores=100, memory=self._memory)

    def _memory(self, container: Mapping[str, Any], where: str) -> int:
        """vmemory: a plain number is GiB; a quantity with a unit is bytes (-> MiB)."""
        name = self.resources.memory
        limits, requests = container_resources(container)
        raw = limits.get(name, requests.get(name))
        if raw is None:
            return 0
        if isinstance(raw, int) or (isinstance(raw, str) and _PLAIN.match(raw)):
            return parse_int_quantity(raw, f"{where} {name}") * 1024
        return parse_int_quantity(raw, f"{where} {name}") // (1024 * 1024)

    # ------------------------------------------------------------------ fit hooks
    def selection(self, annotations: Mapping[str, str]) -> SgpuSelection:
        base = super().selection(annotations)
        return SgpuSelection(
            use_uuids=base.use_uuids,
            nouse_uuids=base.nouse_uuids,
            qos=annotations.get(QOS_ANNOTATION) or "best-effort",
            app_class=annotations.get(APP_CLASS_ANNOTATION) or "",
        )

    def holder_class(self, annotations: Mapping[str, str], devices: PodSingleDevice = ()) -> tuple[str, ...]:
        """What the ledger records on the sGPUs the pod holds for :meth:`usage_filter`: its app
        class (``metax-tech.com/sgpu-app-class``), and ``qos:<policy>`` (:data:`QOS_MARK`) for a
        pod that is not online, runs a share (a grant below ``vcore`` 100) and names one of
        :data:`QOS_POLICIES` (HAMi's ``AddResourceUsage`` sets the device's policy to its
        holder's; an exclusive grant sets none)."""
        app = annotations.get(APP_CLASS_ANNOTATION) or ""
        marks = [app] if app and not app.startswith(QOS_MARK) else []  # an edited app class forges no policy
        qos = annotations.get(QOS_ANNOTATION) or ""
        shares = any(cd.usedcores != EXCLUSIVE_CORES for ctr in devices for cd in ctr)
        if app != "online" and qos in QOS_POLICIES and shares:
            marks.append(QOS_MARK + qos)
        return tuple(marks)

    def usage_filter(
        self,
        device: DeviceInfo,
        request: ContainerDeviceRequest,
        sel: Selection,
        used: int,
        holders: Mapping[str, int],
    ) -> Reason | None:
        """HAMi's ``checkAppClass``, then its ``checkDeviceQos`` for pods that are not online.

        App class (on a device in use only; ``holders``: the app classes of the placed pods
        holding it): a device held by an online or offline pod takes only online / offline
        pods, a device held by none of them only pods without an app class, and an offline pod
        never joins an online one (the device suspends offline work while online work runs);
        else ``CardAppClassMismatch``. As in HAMi, the pod's own earlier containers make the
        device in use but add no app class.

        QoS: an idle device takes any policy (the plugin switches it), and so does a request
        for the whole sGPU (``vcore`` 100; on a device in use the capacity rules then refuse
        it); a share of a device in use needs the policy of the shares running on it (the
        holders' ``qos:`` marks; all of them) equal to the pod's, or, when no holder marks one,
        the device's registered ``qosPolicy`` unset or equal to the pod's."""
        if used == 0 or not isinstance(sel, SgpuSelection):
            return None
        online, offline = holders.get("online", 0) > 0, holders.get("offline", 0) > 0
        if (online or offline) != (sel.app_class in APP_CLASSES) or (online and sel.app_class == "offline"):
            return Reason.CARD_APP_CLASS_MISMATCH
        if sel.app_class == "online" or request.coresreq == EXCLUSIVE_CORES:
            return None
        running = {k[len(QOS_MARK) :] for k, n in holders.items() if k.startswith(QOS_MARK) and n > 0}
        if running:  # the policy the holders' shares run under overrides the registration's
            return None if running == {sel.qos} else Reason.CARD_QOS_POLICY_MISMATCH
        policy = (device.custominfo or {}).get("qosPolicy")
        if policy and policy != sel.qos:
            return Reason.CARD_QOS_POLICY_MISMATCH
        return None

    def node_score(self, node: str, devices: PodSingleDevice, policy: str, view: Any = None) -> float:
        if view is None:
            return 0.0
        pos = {d.id: i for i, d in enumerate(view.devices)}
        added: dict[str, int] = {}
        for ctr in devices:
            for cd in ctr:
                added[cd.uuid] = added.get(cd.uuid, 0) + cd.usedcores
        utils = [
            (view.usedcores[pos[u]] + c) / view.devices[pos[u]].devcore
            for u, c in added.items()
            if u in pos and view.devices[pos[u]].devcore
        ]
        return 10000.0 * sum(utils) / len(utils) if utils else 0.0

    # ------------------------------------------------------------------ decision annotations
    def pod_annotations(
        self, devices: PodSingleDevice, *, node: str = "", now: float = 0.0, pod: Any = None, view: Any = None
    ) -> dict[str, str]:
        out = super().pod_annotations(devices, node=node, now=now, pod=pod, view=view)
        if any(devices):
            out[SGPU_ALLOCATED_ANNOTATION] = go_json([[_sgpu_grant(cd) for cd in ctr] for ctr in devices])
            out[PREDICATE_TIME_ANNOTATION] = str(unix_nanoseconds(now))
        return out


def _sgpu_grant(cd: Any) -> dict[str, Any]:
    """One sGPU grant as HAMi's ``ContainerMetaxSDevice`` marshals it: ``compute`` and ``vRam`` are
    ``omitempty``, so an online pod's grant (compute 0) has no ``compute`` key."""
    out: dict[str, Any] = {"uuid": cd.uuid}
    if cd.usedcores:
        out["compute"] = cd.usedcores
    if cd.usedmem:
        out["vRam"] = cd.usedmem
    return out


def make_metax(config: MetaxConfig) -> tuple[BaseVendor, ...]:
    return (MetaxGpuVendor(config), MetaxSgpuVendor(config))
