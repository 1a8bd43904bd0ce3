"""Wire formats, byte-compatible with HAMi (§4.2, §5.5).

* Node registration, JSON form (``hami.io/node-nvidia-register``): a JSON array of device
  objects with Go ``omitempty`` semantics (a missing ``health`` is false, a missing ``index`` 0).
* Node registration, legacy colon form (Hygon, Iluvatar): ``id,count,devmem,devcore,type,numa,
  health[,index,mode]:`` per device, every device terminated by ``:``.
* Pod allocation (``hami.io/vgpu-devices-allocated``): ``UUID,TYPE,MEM,CORES:`` per device,
  ``;`` after every container (init containers first), empty containers kept.
* MIG reservations (``hami.io/vgpu-mig-allocations``): a JSON array of ``{containerIndex,
  deviceIndex, gpuUUID, profile, placement:{start,size}[, migUUID, gpuInstanceID,
  computeInstanceID]}``, indexes into the allocation annotation above.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from .errors import CodecError
from .types import ContainerDevice, DeviceInfo, MigProfile, PodSingleDevice, Slice

_INT64 = (-(2**63), 2**63 - 1)
_UNSIGNED = re.compile(r"[0-9]{1,19}")
_SIGNED = re.compile(r"-?[0-9]{1,19}")
_GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_GO_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


# --------------------------------------------------------------------- node registration: JSON


def _int_field(obj: dict, key: str, where: str) -> int:
    value = obj.get(key, 0)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CodecError(f"{where}: field {key!r} must be an integer, got {_short(value)}")
    if not _INT64[0] <= value <= _INT64[1]:
        raise CodecError(f"{where}: field {key!r} is out of range (beyond int64)")
    return value


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else f"a {value.bit_length()}-bit number"
    return text if len(text) <= 80 else text[:76] + "...'"


def _str_field(obj: dict, key: str, where: str) -> str:
    value = obj.get(key, "")
    if not isinstance(value, str):
        raise CodecError(f"{where}: field {key!r} must be a string, got {_short(value)}")
    return value


def _mig_profiles(raw: Any, where: str) -> tuple[MigProfile, ...]:
    if raw in (None, []):
        return ()
    if not isinstance(raw, list):
        raise CodecError(f"{where}: field 'migProfiles' must be a list, got {raw!r}")
    out = []
    for i, p in enumerate(raw):
        w = f"{where} migProfiles[{i}]"
        if not isinstance(p, dict):
            raise CodecError(f"{w}: must be an object, got {p!r}")
        places = tuple(
            (_int_field(pl, "start", w), _int_field(pl, "size", w)) for pl in p.get("placements") or ()
        )
        out.append(
            MigProfile(
                name=_str_field(p, "name", w),
                memory_mb=_int_field(p, "memoryMB", w),
                core=_int_field(p, "core", w),
                slice_count=_int_field(p, "sliceCount", w),
                placements=places,
            )
        )
    return tuple(out)


def _device_from_json(obj: Any, i: int, vendor: str) -> DeviceInfo:
    where = f"device[{i}]"
    if not isinstance(obj, dict):
        raise CodecError(f"{where}: must be a JSON object, got {obj!r}")
    health = obj.get("health", False)
    if not isinstance(health, bool):
        raise CodecError(f"{where}: field 'health' must be a boolean, got {health!r}")
    custom = obj.get("custominfo")
    if custom is not None and not isinstance(custom, dict):
        raise CodecError(f"{where}: field 'custominfo' must be an object, got {custom!r}")
    dev = DeviceInfo(
        id=_str_field(obj, "id", where),
        index=_int_field(obj, "index", where),
        count=_int_field(obj, "count", where),
        devmem=_int_field(obj, "devmem", where),
        devcore=_int_field(obj, "devcore", where),
        type=_str_field(obj, "type", where),
        numa=_int_field(obj, "numa", where),
        mode=_str_field(obj, "mode", where),
        health=health,
        vendor=vendor,
        mig_profiles=_mig_profiles(obj.get("migProfiles"), where),
        custominfo=custom or None,
    )
    if not dev.id:
        raise CodecError(f"{where}: field 'id' is missing or empty")
    for key in ("count", "devmem", "devcore", "index"):
        if getattr(dev, key) < 0:
            raise CodecError(f"{where} ({dev.id}): field {key!r} must be >= 0, got {getattr(dev, key)}")
    return dev


def decode_node_devices_json(text: str, vendor: str = "") -> tuple[DeviceInfo, ...]:
    """Parse a JSON registration annotation. Raises :class:`CodecError` naming the device/field."""
    data = _json_array(text, "a JSON array of devices")
    return tuple(_device_from_json(obj, i, vendor) for i, obj in enumerate(data))


def _json_array(text: str, what: str) -> list:
    """``text`` parsed as a JSON array (``null`` reads as empty). CodecError when it is not one."""
    data = json_loads(text, "")
    if data is None:
        return []
    if not isinstance(data, list):
        raise CodecError(f"must be {what}, got {type(data).__name__}")
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_loads(text: Any, prefix: str = "") -> Any:
    """``json.loads`` with every failure as CodecError: not text, bad syntax, NaN/Infinity,
    integers of thousands of digits, nesting deeper than the interpreter's stack."""
    if not isinstance(text, str):
        raise CodecError(f"{prefix}must be a string, got {type(text).__name__}")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise CodecError(f"{prefix}not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, NaN, the int digit limit
        raise CodecError(f"{prefix}not valid JSON ({str(exc)[:120]})") from None


def go_json(obj: Any) -> str:
    """``json.Marshal`` output: compact, non-ASCII kept, ``<>&`` HTML-escaped as Go does."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _device_to_json(d: DeviceInfo) -> dict:
    obj: dict[str, Any] = {}
    for key, value in (
        ("id", d.id), ("index", d.index), ("count", d.count), ("devmem", d.devmem),
        ("devcore", d.devcore), ("type", d.type), ("numa", d.numa), ("mode", d.mode),
        ("health", d.health),
    ):
        if value:  # Go omitempty: zero values are left out
            obj[key] = value
    if d.mig_profiles:
        obj["migProfiles"] = [
            {
                "name": p.name, "memoryMB": p.memory_mb, "core": p.core, "sliceCount": p.slice_count,
                "placements": [{"start": s, "size": z} for s, z in p.placements],
            }
            for p in d.mig_profiles
        ]
    if d.custominfo:
        obj["custominfo"] = dict(d.custominfo)
    return obj


def encode_node_devices_json(devices: Iterable[DeviceInfo]) -> str:
    """The registration annotation value a device plugin writes (HAMi ``MarshalNodeDevices``)."""
    return go_json([_device_to_json(d) for d in devices])


def decode_pair_scores(text: str, where: str = "pair scores") -> dict[str, dict[str, int]]:
    """Topology annotation (``hami.io/node-nvidia-score``) -> ``{uuid: {uuid: score}}``."""
    data = json_loads(text, f"annotation {where}: ")
    if not isinstance(data, list):
        raise CodecError(f"annotation {where}: must be a JSON array, got {type(data).__name__}")
    out: dict[str, dict[str, int]] = {}
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("uuid"), str) or not isinstance(item.get("score", {}), dict):
            raise CodecError(f"annotation {where}: entry {i} must be {{\"uuid\": str, \"score\": {{uuid: int}}}}")
        scores = item.get("score") or {}
        bad = [k for k, v in scores.items() if isinstance(v, bool) or not isinstance(v, int) or not _INT64[0] <= v <= _INT64[1]]
        if bad:
            raise CodecError(f"annotation {where}: entry {i} ({item['uuid']}): score for {bad[0]!r} must be an integer")
        out[item["uuid"]] = dict(scores)
    return out


def encode_pair_scores(scores: Mapping[str, Mapping[str, int]]) -> str:
    return go_json([{"uuid": u, "score": dict(s)} for u, s in scores.items()])


# --------------------------------------------------------------- node registration: legacy colon


def _go_parse_bool(text: str, where: str) -> bool:
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise CodecError(f"{where}: field 'health' must be a boolean, got {text!r}")


def _go_int(text: str, where: str, name: str, signed: bool = False) -> int:
    """A decimal integer field: ASCII digits only (no sign, spaces, ``_`` or other scripts'
    digits, which Python's ``int`` would take), ``-`` only where ``signed``, within int64."""
    if (_SIGNED if signed else _UNSIGNED).fullmatch(text) and _INT64[0] <= int(text) <= _INT64[1]:
        return int(text)
    what = "an integer" if signed else "a non-negative integer"
    raise CodecError(f"{where}: field {name!r} must be {what}, got {_short(text)}")


def decode_node_devices_legacy(text: str, vendor: str = "") -> tuple[DeviceInfo, ...]:
    """Parse the colon form (7 or 9 comma-separated fields per device)."""
    if ":" not in text:
        raise CodecError(f"legacy device list {text!r} has no ':' separator")
    out = []
    for i, chunk in enumerate(p for p in text.split(":") if p):
        where = f"device[{i}]"
        f = chunk.split(",")
        if len(f) not in (7, 9):
            raise CodecError(f"{where}: expected 7 or 9 comma-separated fields, got {len(f)} in {_short(chunk)}")
        if not f[0]:
            raise CodecError(f"{where}: field 'id' is empty")
        out.append(
            DeviceInfo(
                id=f[0],
                count=_go_int(f[1], where, "count"),
                devmem=_go_int(f[2], where, "devmem"),
                devcore=_go_int(f[3], where, "devcore"),
                type=f[4],
                numa=_go_int(f[5], where, "numa", signed=True),
                health=_go_parse_bool(f[6], where),
                index=_go_int(f[7], where, "index") if len(f) == 9 else 0,
                mode=f[8] if len(f) == 9 else "hami-core",
                vendor=vendor,
            )
        )
    return tuple(out)


def encode_node_devices_legacy(devices: Iterable[DeviceInfo]) -> str:
    """HAMi ``EncodeNodeDevices`` (9-field form)."""
    return "".join(
        f"{d.id},{d.count},{d.devmem},{d.devcore},{d.type},{d.numa},{'true' if d.health else 'false'},"
        f"{d.index},{d.mode}:"
        for d in devices
    )


# ------------------------------------------------------------------------ pod allocation strings


def encode_container_devices(devices: Sequence[ContainerDevice]) -> str:
    return "".join(f"{d.uuid},{d.type},{d.usedmem},{d.usedcores}:" for d in devices)


def encode_pod_devices(per_container: PodSingleDevice | Sequence[Sequence[ContainerDevice]]) -> str:
    """HAMi ``EncodePodSingleDevice``: one ``;``-terminated entry per container."""
    return "".join(encode_container_devices(c) + ";" for c in per_container)


def decode_container_devices(text: str, where: str = "container") -> tuple[ContainerDevice, ...]:
    out = []
    for piece in text.split(":"):
        if not piece:
            continue
        f = piece.split(",")
        if len(f) < 4:
            raise CodecError(
                f"{where}: device entry {piece!r} has {len(f)} fields, expected UUID,TYPE,MEM,CORES "
                "(do not set nodeName on pods that request devices)"
            )
        out.append(
            ContainerDevice(
                uuid=f[0], type=f[1],
                usedmem=_go_int(f[2], where, "usedmem"), usedcores=_go_int(f[3], where, "usedcores"),
            )
        )
    return tuple(out)


def decode_pod_devices(text: str) -> PodSingleDevice:
    """Inverse of :func:`encode_pod_devices`; empty container entries are kept (index alignment).

    ``decode_pod_devices(encode_pod_devices(x)) == x`` and, for every well-formed value ``s``,
    ``encode_pod_devices(decode_pod_devices(s)) == s``.
    """
    if not text:
        return ()
    body = text[:-1] if text.endswith(";") else text
    return tuple(decode_container_devices(seg, f"container[{i}]") for i, seg in enumerate(body.split(";")))


# --------------------------------------------------------------------- MIG reservations (§6.6)


@dataclass(frozen=True, slots=True)
class MigAllocation:
    """One entry of ``hami.io/vgpu-mig-allocations``: the slice reserved for device ``device`` of
    container ``container`` (annotation order), plus the runtime identity the device plugin adds."""

    container: int
    device: int
    gpu_uuid: str
    profile: str
    start: int
    size: int
    mig_uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def slice(self) -> Slice:
        return Slice(uuid=self.gpu_uuid, profile=self.profile, start=self.start, size=self.size, mig_uuid=self.mig_uuid,
                     gpu_instance_id=self.gpu_instance_id, compute_instance_id=self.compute_instance_id)


def encode_mig_allocations(entries: Iterable[MigAllocation]) -> str:
    """Go ``json.Marshal`` of HAMi's ``[]MigAllocation`` (runtime fields omitted when empty/nil)."""
    out = []
    for e in entries:
        obj: dict[str, Any] = {
            "containerIndex": e.container, "deviceIndex": e.device, "gpuUUID": e.gpu_uuid,
            "profile": e.profile, "placement": {"start": e.start, "size": e.size},
        }
        if e.mig_uuid:
            obj["migUUID"] = e.mig_uuid
        if e.gpu_instance_id is not None:
            obj["gpuInstanceID"] = e.gpu_instance_id
        if e.compute_instance_id is not None:
            obj["computeInstanceID"] = e.compute_instance_id
        out.append(obj)
    return go_json(out)


def _opt_uint(obj: dict, key: str, where: str) -> int | None:
    if obj.get(key) is None:
        return None
    value = _int_field(obj, key, where)
    if value < 0:
        raise CodecError(f"{where}: field {key!r} must be >= 0, got {value}")
    return value


def decode_mig_allocations(text: str) -> tuple[MigAllocation, ...]:
    """Parse ``hami.io/vgpu-mig-allocations`` with HAMi's checks: every entry complete (indexes
    >= 0, a GPU UUID, a profile, a placement of size > 0), the three runtime fields all present or
    all absent, ``(containerIndex, deviceIndex)`` unique. Raises :class:`CodecError`."""
    if not text:
        return ()
    data = _json_array(text, "a JSON array")
    out: list[MigAllocation] = []
    seen: set[tuple[int, int]] = set()
    for i, obj in enumerate(data):
        where = f"entry {i}"
        if not isinstance(obj, dict):
            raise CodecError(f"{where}: must be a JSON object, got {obj!r}")
        place = obj.get("placement") or {}
        if not isinstance(place, dict):
            raise CodecError(f"{where}: field 'placement' must be an object, got {place!r}")
        e = MigAllocation(
            container=_int_field(obj, "containerIndex", where), device=_int_field(obj, "deviceIndex", where),
            gpu_uuid=_str_field(obj, "gpuUUID", where), profile=_str_field(obj, "profile", where),
            start=_int_field(place, "start", where), size=_int_field(place, "size", where),
            mig_uuid=_str_field(obj, "migUUID", where), gpu_instance_id=_opt_uint(obj, "gpuInstanceID", where),
            compute_instance_id=_opt_uint(obj, "computeInstanceID", where),
        )
        if e.container < 0 or e.device < 0 or not e.gpu_uuid or not e.profile or e.size <= 0 or e.start < 0:
            raise CodecError(f"{where}: incomplete MIG allocation (containerIndex, deviceIndex >= 0, gpuUUID, "
                             f"profile and a placement with size > 0 are required), got {obj!r}")
        runtime = (bool(e.mig_uuid), e.gpu_instance_id is not None, e.compute_instance_id is not None)
        if any(runtime) and not all(runtime):
            raise CodecError(f"{where}: migUUID, gpuInstanceID and computeInstanceID must be set together")
        if (e.container, e.device) in seen:
            raise CodecError(f"{where}: duplicate entry for containerIndex {e.container} deviceIndex {e.device}")
        seen.add((e.container, e.device))
        out.append(e)
    return tuple(out)
