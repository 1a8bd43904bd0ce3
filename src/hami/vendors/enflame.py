"""Enflame GCUs: DRS slices (HAMi backend ``Enflame``) and whole GCUs (HAMi backend ``GCU``).

Facts: §3.4, §4.1, §4.5, §7.1 ``enflame``, §8.2, §8.3.

DRS: the node annotation ``enflame.com/gcu-drs-capacity``, as Enflame's gcushare device plugin
writes it, is
``{"devices":[{"index":"0","minor":"0","capacity":6}],"profiles":{"1g.6gb":"0","3g.20gb":"1",...}}``:
``capacity`` slices per GCU, profiles named ``<slices>g.<memory>gb`` with their profile IDs. The
plugin writes ``index``, ``minor`` and the profile IDs as strings; JSON integers (the form our
earlier docs showed) are read too. An ``index`` that is absent, empty or not a number in
0..2147483647 is the device's position in the list, a ``minor`` of that kind is the index (as HAMi
reads them; a value that is not empty is logged as a warning naming the field and the value).
A ``capacity`` must be such a number (an integer or a string of digits).
A container asks for slices directly (``enflame.com/drs-gcu: n``) or for ``enflame.com/gcu-memory``
(GiB) plus ``enflame.com/gcu-core`` (percent of a GCU), which is mapped, per GCU, to the smallest
profile that covers both. One device per container. In our model a DRS GCU has ``count =
devcore = capacity`` (slices) and ``devmem = capacity x`` the memory of one slice; a grant records
the slices as cores. Device IDs: ``<node>-enflame-drs-<index>``. A namespace quota on
``limits.enflame.com/gcu-memory`` counts MiB, as HAMi charges a profile's memory (a pod asks in GiB;
HAMi's Enflame backend sets no memory factor, and namespaces moved from it keep their limits).

Whole GCU: ``enflame.com/gcu`` from node capacity, as HAMi's ``GetNodeDevices`` registers them:
IDs ``<node>-GCU-<i>``, one slot, ``devmem`` 100 and ``devcore`` 100 per card; a grant takes all of
it (``usedmem`` 100, ``usedcores`` 100). Our releases before this one wrote IDs
``<node>-enflame-gcu-<i>`` with ``usedmem`` 0: :meth:`EnflameGcuVendor.read_allocation` reads them
in today's form. Neither backend locks the node.

DRS decision annotations, read by Enflame's device plugin at Allocate (besides
``hami.io/enflame-vgpu-devices-allocated``), for the first GCU the pod holds:
``enflame.com/gcu-request-size`` (slices), ``enflame.com/gcu-assigned-id`` and
``enflame.com/gcu-assigned-index`` (both the GCU's index, as HAMi writes them),
``enflame.com/gcu-assigned`` (``false``; the plugin sets ``true``), ``enflame.com/gcu-assigned-minor``,
``enflame.com/gcu-assigned-time`` (unix ns) and ``assigned-containers`` (no prefix: the key the
plugin reads; a JSON map container name -> ``{"allocated":false,"request":<slices>,
"profileID":"<id>","profileName":"<name>"}``, profile ID and name left out when empty; the plugin
sets ``allocated`` and adds the DRS instance it creates).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

from hami.config import EnflameConfig
from hami.core.codec import CAPACITY, GoMap, go_json, go_loads, go_plain, go_struct, shown
from hami.core.errors import CodecError, RequestError
from hami.core.reasons import Reason
from hami.core.types import ContainerDevice, ContainerDeviceRequest, DeviceInfo, PodSingleDevice

from .base import BaseVendor, ResourceNames, lookup, slot_check
from .common import (
    annotations_of,
    capacity,
    ensure_field,
    node_name,
    present,
    synth_cards,
    where_of,
    whole_card_request,
)

log = logging.getLogger(__name__)

CAPACITY_ANNOTATION = "enflame.com/gcu-drs-capacity"
#: a DRS profile name, ``<slices>g.<GiB>gb`` (ASCII digits; matched whole)
_PROFILE = re.compile(r"([0-9]+)g\.([0-9]+)gb")
#: the most digits a profile name's slice count or GiB may have (the node refuses longer ones)
_PROFILE_DIGITS = 6
#: Whole-GCU device IDs our earlier releases synthesised: ``<node>-enflame-gcu-<i>``.
_LEGACY_GCU_ID = re.compile(r"^(?P<node>.*)-enflame-gcu-(?P<index>\d+)$")
#: What HAMi registers per whole GCU as ``devmem`` and grants as ``usedmem`` (not MiB: all of it).
GCU_WHOLE_MEMORY = 100
REQUEST_SIZE_ANNOTATION = "enflame.com/gcu-request-size"
ASSIGNED_ID_ANNOTATION = "enflame.com/gcu-assigned-id"
ASSIGNED_ANNOTATION = "enflame.com/gcu-assigned"
ASSIGNED_INDEX_ANNOTATION = "enflame.com/gcu-assigned-index"
ASSIGNED_MINOR_ANNOTATION = "enflame.com/gcu-assigned-minor"
ASSIGNED_TIME_ANNOTATION = "enflame.com/gcu-assigned-time"
#: the per-container record the gcushare device plugin reads at Allocate: no ``enflame.com/`` prefix
ASSIGNED_CONTAINERS_ANNOTATION = "assigned-containers"
#: an index, minor or capacity written as a string: ASCII digits (at most 10: the value is bounded
#: by :data:`CAPACITY` afterwards)
_DIGITS = re.compile(r"[0-9]{1,10}")


@dataclass(frozen=True, slots=True)
class DrsRequest(ContainerDeviceRequest):
    """A DRS request: ``slices`` directly, or ``mem_gib`` + ``core_pct`` mapped to a profile per GCU."""

    slices: int = 0
    mem_gib: int = 0
    core_pct: int = 0


def _profiles(device: DeviceInfo) -> list[tuple[int, int, str, Any]]:
    """(slices, GiB, name, id) sorted by slices then memory."""
    out = []
    for name, pid in ((device.custominfo or {}).get("profiles") or {}).items():
        m = _PROFILE.fullmatch(name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), name, pid))
    return sorted(out)


def _slice_mib(name: str, where: str) -> int:
    """MiB of one slice of profile ``name`` (0 for a name of another shape, which no request
    matches). CodecError for a ``<slices>g.<GiB>gb`` name with 0 slices or more than
    :data:`_PROFILE_DIGITS` digits in a number."""
    m = _PROFILE.fullmatch(name)
    if m is None:
        return 0
    if max(len(m.group(1)), len(m.group(2))) > _PROFILE_DIGITS or not int(m.group(1)):
        raise CodecError(
            f"{where}: profile name {shown(name)}: slices must be 1..{10**_PROFILE_DIGITS - 1} and GiB "
            f"0..{10**_PROFILE_DIGITS - 1}"
        )
    return int(m.group(2)) * 1024 // int(m.group(1))


def _drs_number(value: Any) -> int | None:
    """An index, minor or capacity as Enflame's plugin writes it (a string of ASCII digits, spaces
    around it ignored) or as a JSON integer, within :data:`CAPACITY`; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        n = int(value.strip())
    else:
        return None
    return n if CAPACITY[0] <= n <= CAPACITY[1] else None


def _number_or(fields: Mapping[str, Any], key: str, default: int, where: str, what: str) -> int:
    """Field ``key`` of a DRS device as a number (:func:`_drs_number`), else ``default`` (HAMi: an
    index that does not parse is the position, a minor left empty is the index); a value that is
    present but not such a number is logged, naming the field and the value."""
    value = fields.get(key)
    n = _drs_number(value)
    if n is not None:
        return n
    if value is not None and not (isinstance(value, str) and not value.strip()):
        log.warning(
            "%s: field %r must be a number in %d..%d (an integer or a string of digits), got %s: using %s, %d",
            where,
            key,
            CAPACITY[0],
            CAPACITY[1],
            shown(value),
            what,
            default,
        )
    return default


def _profile_ids(raw: Any, where: str) -> dict[str, str]:
    """The registration's ``profiles``, name -> profile ID as a string (the plugin writes strings;
    a JSON integer is read as its digits). An ID of another kind is left out with a warning naming
    the profile and the value."""
    if not isinstance(raw, dict):
        raise CodecError(f"{where}: 'profiles' must map profile names to IDs, got {shown(raw)}")
    out = {}
    for name, pid in raw.items():
        if isinstance(pid, str):
            out[name] = pid
        elif isinstance(pid, int) and not isinstance(pid, bool):
            out[name] = str(pid)
        else:
            log.warning(
                "%s: profiles[%s]: the profile ID must be a string, got %s: profile left out",
                where,
                shown(name),
                shown(pid),
            )
    return out


class EnflameDrsVendor(BaseVendor):
    cores_unit = "slices"  # devcore = count = DRS slices of the GCU
    name = "Enflame"
    request_type = "Enflame"
    register_annotation = CAPACITY_ANNOTATION
    allocated_annotation = "hami.io/enflame-vgpu-devices-allocated"
    to_allocate_annotation = None
    lock_annotation = None
    use_uuid_annotation = "enflame.com/use-gpuuuid"
    nouse_uuid_annotation = "enflame.com/nouse-gpuuuid"
    decision_annotations = (
        REQUEST_SIZE_ANNOTATION,
        ASSIGNED_ID_ANNOTATION,
        ASSIGNED_ANNOTATION,
        ASSIGNED_INDEX_ANNOTATION,
        ASSIGNED_MINOR_ANNOTATION,
        ASSIGNED_TIME_ANNOTATION,
        ASSIGNED_CONTAINERS_ANNOTATION,
    )

    def __init__(self, config: EnflameConfig | None = None) -> None:
        c = self.config = config or EnflameConfig()
        super().__init__(
            ResourceNames(
                count=c.resource_name_drs_gcu,
                memory=c.resource_name_gcu_memory,
                cores=c.resource_name_gcu_core,
            )
        )

    # ------------------------------------------------------------------ registration
    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        text = annotations_of(node).get(CAPACITY_ANNOTATION)
        if not text:
            return ()
        where = f"annotation {CAPACITY_ANNOTATION}"
        raw = go_loads(text, f"{where}: ")  # keys matched as Go matches them (exact, else case-insensitive)
        data = go_struct(raw, ("devices", "profiles")) if isinstance(raw, dict) else None
        if data is None or not isinstance(data.get("devices"), list):
            raise CodecError(f"{where}: must be an object with a 'devices' list")
        profiles = _profile_ids(go_plain(data.get("profiles") or {}), where)
        per_slice = max((_slice_mib(name, where) for name in profiles), default=0)
        out = []
        for i, d in enumerate(data["devices"]):
            f = go_struct(d, ("index", "minor", "capacity")) if isinstance(d, dict) else None
            w = f"{where}: devices[{i}]"
            if f is None:
                raise CodecError(f"{w} must be an object with index, minor and capacity; got {shown(d)}")
            slices = _drs_number(f.get("capacity"))
            if slices is None:
                # within HAMi's int32 (as every registration's count, memory and cores): scores divide by them
                raise CodecError(
                    f"{w}: field 'capacity' must be in {CAPACITY[0]}..{CAPACITY[1]}, got {shown(f.get('capacity'))} "
                    "(a number of slices: an integer or a string of digits)"
                )
            index = _number_or(f, "index", i, w, "its position in the list")
            minor = _number_or(f, "minor", index, w, "its index")
            devmem = slices * per_slice
            if devmem > CAPACITY[1]:
                raise CodecError(
                    f"{w}: field 'capacity' {slices} x {per_slice} MiB per slice is {devmem} MiB, more than {CAPACITY[1]}"
                )
            out.append(
                DeviceInfo(
                    id=f"{node_name(node)}-enflame-drs-{index}",
                    index=index,
                    count=slices,
                    devmem=devmem,
                    devcore=slices,
                    type=self.name,
                    health=True,
                    vendor=self.name,
                    custominfo={"minor": minor, "profiles": dict(profiles)},
                )
            )
        return tuple(out)

    # ------------------------------------------------------------------ admission (§3.4)
    def admit_container(self, container: dict, pod: Mapping[str, Any]) -> bool:
        r = self.resources
        has = present(container)
        if not has & {r.count, r.memory, r.cores}:
            return False
        where = where_of(container)
        res = lookup(container, where)
        if r.count in has:
            if res(r.count) <= 0:
                raise RequestError(f"{where}: {r.count} must be greater than 0, got {res(r.count)}")
        elif not (res(r.memory) > 0 and 0 < res(r.cores) <= 100):
            raise RequestError(
                f"{where}: give {r.count} > 0, or {r.memory} > 0 with {r.cores} in 1..100 "
                f"(got {r.memory}={res(r.memory)}, {r.cores}={res(r.cores)})"
            )
        res_map = ensure_field(container, "resources", {})
        requests = ensure_field(res_map, "requests", {})
        for name, value in (res_map.get("limits") or {}).items():
            if name in (r.count, r.memory, r.cores):
                requests[name] = value
        return True

    # ------------------------------------------------------------------ requests
    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        r = self.resources
        res = lookup(container, where)
        slices, mem, core = res(r.count), res(r.memory), res(r.cores)
        if not (slices or mem or core):
            return None
        if min(slices, mem, core) < 0:
            raise RequestError(f"{where}: {r.count}, {r.memory} and {r.cores} must not be negative")
        return DrsRequest(vendor=self.name, nums=1, type=self.request_type, slices=slices, mem_gib=mem, core_pct=core)

    def slices_for(self, device: DeviceInfo, request: ContainerDeviceRequest) -> tuple[int, str, Any] | None:
        """(slices, profile name, profile id) this request takes on ``device``; None = no profile fits."""
        profiles = _profiles(device)
        slices = getattr(request, "slices", 0)
        if slices:
            match = [p for p in profiles if p[0] == slices]
            if match:
                return slices, match[0][2], match[0][3]
            return (slices, "", None) if not profiles else None
        mem_gib, core_pct = getattr(request, "mem_gib", 0), getattr(request, "core_pct", 0)
        for s, gib, name, pid in profiles:  # smallest profile covering memory and the core share
            if gib >= mem_gib and s * 100 >= core_pct * max(device.devcore, 1):
                return s, name, pid
        return None

    def resolve_memory(self, device: DeviceInfo, request: ContainerDeviceRequest) -> int:
        got = self.slices_for(device, request)
        return got[0] * (device.devmem // device.devcore) if got and device.devcore else 0

    def capacity_check(self, device, used, usedmem, usedcores, request, mem, mutex, quota_fits):
        got = self.slices_for(device, request)
        if got is None:
            return Reason.CARD_NOT_FOUND_CUSTOM_FILTER_RULE
        bad = slot_check(device, used, mutex, quota_fits)
        if bad is None and device.devcore - usedcores < got[0]:
            return Reason.CARD_INSUFFICIENT_CORE
        return bad

    def grant(self, device: DeviceInfo, request: ContainerDeviceRequest, mem: int) -> ContainerDevice:
        got = self.slices_for(device, request)
        return ContainerDevice(
            uuid=device.id, type=self.request_type, usedmem=mem, usedcores=got[0] if got else 0, index=device.index
        )

    # ------------------------------------------------------------------ decision annotations
    def pod_annotations(
        self, devices: PodSingleDevice, *, node: str = "", now: float = 0.0, pod: Any = None, view: Any = None
    ) -> dict[str, str]:
        out = super().pod_annotations(devices, node=node, now=now, pod=pod, view=view)
        by_id = {d.id: d for d in (view.devices if view is not None else ())}
        ctrs = list(pod.containers) if pod is not None else [None] * len(devices)
        assigned = GoMap()  # a Go map: written with its keys (the container names) sorted
        first = None
        for i, (c, ctr) in enumerate(zip(ctrs, devices)):
            if not ctr:
                continue
            cd = ctr[0]  # one GCU per container
            dev = by_id.get(cd.uuid)
            name, pid = self._granted_profile(dev, c.for_vendor(self.name) if c is not None else None, cd.usedcores)
            entry: dict[str, Any] = {"allocated": False, "request": max(cd.usedcores, 1)}
            if pid:  # Go's omitempty
                entry["profileID"] = pid
            if name:
                entry["profileName"] = name
            assigned[c.name if c is not None else f"container-{i}"] = entry
            if first is None:
                first = (cd, dev)
        if first is None:
            return out
        cd, dev = first
        minor = (dev.custominfo or {}).get("minor", cd.index) if dev else cd.index
        out.update(
            {
                REQUEST_SIZE_ANNOTATION: str(max(cd.usedcores, 1)),
                ASSIGNED_ID_ANNOTATION: str(cd.index),  # HAMi writes the GCU's index here too
                ASSIGNED_ANNOTATION: "false",
                ASSIGNED_INDEX_ANNOTATION: str(cd.index),
                ASSIGNED_MINOR_ANNOTATION: str(minor),
                ASSIGNED_TIME_ANNOTATION: str(int(now * 1_000_000_000)),
                ASSIGNED_CONTAINERS_ANNOTATION: go_json(assigned),
            }
        )
        return out

    def _granted_profile(
        self, device: DeviceInfo | None, request: ContainerDeviceRequest | None, slices: int
    ) -> tuple[str, str]:
        """(profile name, profile ID) of the grant of ``slices`` on ``device``: the profile the
        container's request maps to there, else the first profile of that many slices; ("", "")
        when the device has none."""
        if device is None:
            return "", ""
        got = self.slices_for(device, request) if request is not None else None
        if got is not None and got[0] == slices and got[1]:
            return got[1], str(got[2] if got[2] is not None else "")
        match = [p for p in _profiles(device) if p[0] == slices]
        return (match[0][2], str(match[0][3])) if match else ("", "")


class EnflameGcuVendor(BaseVendor):
    name = "GCU"
    request_type = "GCU"
    allocated_annotation = "hami.io/enflame-gcu-devices-allocated"
    to_allocate_annotation = "hami.io/enflame-gcu-devices-to-allocate"
    lock_annotation = None

    def __init__(self, config: EnflameConfig | None = None) -> None:
        c = self.config = config or EnflameConfig()
        super().__init__(ResourceNames(count=c.resource_name_gcu))

    def node_devices(self, node: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
        cards = capacity(node, self.resources.count)
        return (
            synth_cards(
                node,
                self.name,
                self.name,
                cards,
                count=1,
                devmem=GCU_WHOLE_MEMORY,
                devcore=100,
                type_=self.name,
                source=self.resources.count,
            )
            if cards > 0
            else ()
        )

    def container_request(self, container: Mapping[str, Any], where: str) -> ContainerDeviceRequest | None:
        return whole_card_request(self, container, where)  # 100% of the memory: usedmem 100

    def read_device_id(self, device_id: str) -> str:
        """``<node>-enflame-gcu-<i>`` (our earlier releases' spelling, e.g. in a cordon list or a
        use/nouse annotation written then) is today's ``<node>-GCU-<i>``."""
        m = _LEGACY_GCU_ID.match(device_id)
        return f"{m['node']}-{self.name}-{m['index']}" if m else device_id

    def read_allocation(self, devices: PodSingleDevice, annotations: Mapping[str, str]) -> PodSingleDevice:
        """A placed pod's allocation in today's form: grants our earlier releases wrote (IDs
        ``<node>-enflame-gcu-<i>``, ``usedmem`` 0) get HAMi's ID and ``usedmem`` 100; others are
        returned unchanged."""
        if not any(_LEGACY_GCU_ID.match(cd.uuid) for ctr in devices for cd in ctr):
            return devices
        out = []
        for ctr in devices:
            row = []
            for cd in ctr:
                m = _LEGACY_GCU_ID.match(cd.uuid)
                if m is not None:
                    cd = replace(cd, uuid=f"{m['node']}-{self.name}-{m['index']}", usedmem=GCU_WHOLE_MEMORY)
                row.append(cd)
            out.append(tuple(row))
        return tuple(out)


def make_enflame(config: EnflameConfig) -> tuple[BaseVendor, ...]:
    return (EnflameDrsVendor(config), EnflameGcuVendor(config))
