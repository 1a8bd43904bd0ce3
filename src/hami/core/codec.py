"""Wire formats, byte-compatible with HAMi v2.10 (§4.2, §5.5, §6.6).

* Node registration, JSON form (``hami.io/node-nvidia-register``): a JSON array of device
  objects read as Go's ``encoding/json`` reads HAMi's ``DeviceInfo`` (keys matched exactly, else
  case-insensitively; ``null`` = absent; a missing ``health`` is false, a missing ``index`` 0) and
  written as ``json.Marshal`` writes it (struct field order, ``omitempty``, HTML-safe escaping).
* Node registration, legacy colon form (Hygon, Iluvatar): ``id,count,devmem,devcore,type,numa,
  health[,index,mode]:`` per device, every device terminated by ``:``.
* Pod allocation (``hami.io/vgpu-devices-allocated``): ``UUID,TYPE,MEM,CORES:`` per device,
  ``;`` after every container (init containers first), empty containers kept.
* MIG reservations (``hami.io/vgpu-mig-allocations``): a JSON array of ``{containerIndex,
  deviceIndex, gpuUUID, profile, placement:{start,size}[, migUUID, gpuInstanceID,
  computeInstanceID]}``, indexes into the allocation annotation above.

The rule for every field (what is accepted, what is refused and why) is in docs/core-api.md,
"Wire formats, field by field"; where a rule differs from HAMi's, docs/compatibility.md says so.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from .errors import CodecError
from .types import ContainerDevice, DeviceInfo, MigProfile, PodSingleDevice, Slice

# Go integer ranges of the fields HAMi declares (int32, uint32, int = int64, uint = uint64)
INT32 = (-(2**31), 2**31 - 1)
UINT32 = (0, 2**32 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT64 = (0, 2**64 - 1)
#: Go ``strconv.ParseInt(s, 10, n)``: an optional sign, then ASCII digits (no spaces, no ``_``)
_GO_DECIMAL = re.compile(r"[+-]?[0-9]+")
_GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_GO_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


# ------------------------------------------------------------------ Go encoding/json, decoding


class GoObject(dict):
    """A JSON object read by :func:`go_loads`: a dict (a repeated key keeps its last value, as
    in a Go map) that also keeps every ``(key, value)`` pair in document order, which Go's struct
    decoding walks (see :func:`go_struct`)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs


def _go_string(text: str) -> str:
    """Go decodes an escaped lone surrogate (``"\\ud800"``) as U+FFFD; Python keeps it (and could
    then not write it back as UTF-8)."""
    return _LONE_SURROGATE.sub("\ufffd", text) if _LONE_SURROGATE.search(text) else text


def _go_pairs(pairs: list[tuple[str, Any]]) -> GoObject:
    return GoObject([(_go_string(k), _go_string(v) if isinstance(v, str) else v) for k, v in pairs])


def go_loads(text: Any, prefix: str = "") -> Any:
    """Parse JSON as Go's ``json.Unmarshal`` sees it: objects become :class:`GoObject`, lone
    surrogates U+FFFD. Every failure is a CodecError (see :func:`json_loads`)."""
    return _loads(text, prefix, _go_pairs)


#: Go's key folding (``bytes.EqualFold`` on struct field names): ASCII case, plus the two
#: non-ASCII letters whose simple case folding lands on ASCII: KELVIN SIGN -> k, LONG S -> s.
_FOLD = {**{c: c + 32 for c in range(ord("A"), ord("Z") + 1)}, 0x212A: ord("k"), 0x017F: ord("s")}


def go_fold(key: str) -> str:
    return key.translate(_FOLD)


def go_struct(obj: Mapping[str, Any], fields: Sequence[str], nillable: Sequence[str] = ()) -> dict[str, Any]:
    """The values Go would store in a struct whose JSON field names are ``fields``.

    Each key goes to the field of that exact name, else to the field equal to it ignoring case;
    other keys are ignored; when several keys reach one field the last in the document wins. A
    ``null`` leaves a field as it was, except a ``nillable`` one (a Go slice, map or pointer),
    which it empties. Missing fields are absent from the result."""
    exact = set(fields)
    folded = {go_fold(f): f for f in fields}
    out: dict[str, Any] = {}
    for key, value in getattr(obj, "pairs", None) or obj.items():
        name = key if key in exact else folded.get(go_fold(key))
        if name is None:
            continue
        if value is not None:
            out[name] = value
        elif name in nillable:
            out.pop(name, None)
    return out


def go_plain(value: Any) -> Any:
    """A :func:`go_loads` value with every :class:`GoObject` turned into a plain dict."""
    if isinstance(value, dict):
        return {k: go_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [go_plain(v) for v in value]
    return value


def int_field(obj: Mapping[str, Any], key: str, where: str, bounds: tuple[int, int] = INT64) -> int:
    """A Go integer field: a JSON integer literal (``1``, not ``1.0`` or ``1e0``, which Go refuses
    too) within ``bounds``; absent or null reads 0. CodecError naming ``key`` and the value."""
    value = obj.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise CodecError(f"{where}: field {key!r} must be an integer, got {shown(value)}")
    lo, hi = bounds
    if not lo <= value <= hi:
        raise CodecError(f"{where}: field {key!r} must be in {lo}..{hi}, got {shown(value)}")
    return value


def shown(value: Any) -> str:
    """``value`` for an error message: its repr, at most 80 characters (a huge integer by its size)."""
    text = (
        repr(value) if not isinstance(value, int) or value.bit_length() < 200 else f"a {value.bit_length()}-bit number"
    )
    return text if len(text) <= 80 else text[:76] + "...'"


def _str_field(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise CodecError(f"{where}: field {key!r} must be a string, got {shown(value)}")
    return value


def _list_field(obj: Mapping[str, Any], key: str, where: str) -> list:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise CodecError(f"{where}: field {key!r} must be a list, got {shown(value)}")
    return value


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    """An element that Go decodes into a struct: an object, or null (the zero value)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CodecError(f"{where}: must be a JSON object, got {shown(value)}")
    return value


# --------------------------------------------------------------------- node registration: JSON

_DEVICE_FIELDS = (
    "id",
    "index",
    "count",
    "devmem",
    "devcore",
    "type",
    "numa",
    "mode",
    "migProfiles",
    "migtemplate",
    "health",
    "devicevendor",
    "custominfo",
)
_PROFILE_FIELDS = ("name", "memoryMB", "core", "sliceCount", "placements")
_PLACEMENT_FIELDS = ("start", "size")
#: A device's count, memory and cores in any vendor's registration: int32 in HAMi; a negative
#: capacity is refused here (compatibility.md). Scores divide by sums of them as floats: an
#: unbounded value would overflow every score of the node.
CAPACITY = (0, INT32[1])


def _mig_profiles(raw: list, where: str) -> tuple[MigProfile, ...]:
    out = []
    for i, p in enumerate(raw):
        w = f"{where} migProfiles[{i}]"
        f = go_struct(_obj(p, w), _PROFILE_FIELDS, nillable=("placements",))
        places = []
        for j, pl in enumerate(_list_field(f, "placements", w)):
            g = go_struct(_obj(pl, f"{w} placements[{j}]"), _PLACEMENT_FIELDS)
            places.append((int_field(g, "start", w, UINT32), int_field(g, "size", w, UINT32)))
        out.append(
            MigProfile(
                name=_str_field(f, "name", w),
                memory_mb=int_field(f, "memoryMB", w, CAPACITY),
                core=int_field(f, "core", w, CAPACITY),
                slice_count=int_field(f, "sliceCount", w, UINT32),
                placements=tuple(places),
            )
        )
    return tuple(out)


def _device_from_json(obj: Any, i: int, vendor: str) -> DeviceInfo:
    where = f"device[{i}]"
    if not isinstance(obj, dict):
        raise CodecError(f"{where}: must be a JSON object, got {shown(obj)}")
    f = go_struct(obj, _DEVICE_FIELDS, nillable=("migProfiles", "migtemplate", "custominfo"))
    health = f.get("health", False)
    if not isinstance(health, bool):
        raise CodecError(f"{where}: field 'health' must be a boolean, got {shown(health)}")
    custom = f.get("custominfo")
    if custom is not None and not isinstance(custom, dict):
        raise CodecError(f"{where}: field 'custominfo' must be an object, got {shown(custom)}")
    _str_field(f, "devicevendor", where)  # set by the scheduler, not transported; type-checked as Go does
    _list_field(f, "migtemplate", where)  # deprecated in HAMi; ignored
    dev_id = _str_field(f, "id", where)
    if not dev_id:
        raise CodecError(f"{where}: field 'id' is missing or empty")
    w = f"{where} ({dev_id})"
    return DeviceInfo(
        id=dev_id,
        index=int_field(f, "index", w, UINT64),
        count=int_field(f, "count", w, CAPACITY),
        devmem=int_field(f, "devmem", w, CAPACITY),
        devcore=int_field(f, "devcore", w, CAPACITY),
        type=_str_field(f, "type", w),
        numa=int_field(f, "numa", w, INT64),
        mode=_str_field(f, "mode", w),
        health=health,
        vendor=vendor,
        mig_profiles=_mig_profiles(_list_field(f, "migProfiles", w), w),
        custominfo=go_plain(custom) or None,
    )


def decode_node_devices_json(text: str, vendor: str = "") -> tuple[DeviceInfo, ...]:
    """Parse a JSON registration annotation. Raises :class:`CodecError` naming the device/field."""
    data = _json_array(text, "a JSON array of devices")
    return tuple(_device_from_json(obj, i, vendor) for i, obj in enumerate(data))


def _json_array(text: str, what: str) -> list:
    """``text`` parsed as a JSON array (``null`` reads as empty). CodecError when it is not one."""
    data = go_loads(text, "")
    if data is None:
        return []
    if not isinstance(data, list):
        raise CodecError(f"must be {what}, got {type(data).__name__}")
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: Any, prefix: str, hook: Any) -> Any:
    if not isinstance(text, str):
        raise CodecError(f"{prefix}must be a string, got {type(text).__name__}")
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=hook)
    except RecursionError:
        raise CodecError(f"{prefix}not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, NaN, the int digit limit
        raise CodecError(f"{prefix}not valid JSON ({str(exc)[:120]})") from None


def json_loads(text: Any, prefix: str = "") -> Any:
    """``json.loads`` with every failure as CodecError: not text, bad syntax, NaN/Infinity,
    integers of thousands of digits, nesting deeper than the interpreter's stack."""
    return _loads(text, prefix, None)


# ------------------------------------------------------------------ Go encoding/json, encoding

_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_GO_ESCAPE_RE = re.compile("[<>&\u2028\u2029]")


def go_json(obj: Any) -> str:
    """``json.Marshal`` output: compact, non-ASCII kept, HTML-safe (``<>&`` and U+2028/U+2029
    escaped as ``\\u003c``...), an invalid string (a lone surrogate) written as U+FFFD. A plain
    dict is a Go struct (written in insertion order: build it in the struct's field order); a
    :class:`GoMap` is a Go map (written with its keys sorted)."""
    text = json.dumps(_sorted_maps(obj), separators=(",", ":"), ensure_ascii=False)
    text = _GO_ESCAPE_RE.sub(lambda m: _GO_ESCAPES[m.group(0)], text)
    return _go_string(text)


class GoMap(dict):
    """A dict that :func:`go_json` writes as Go writes a map: keys in sorted order."""


def _sorted_maps(obj: Any) -> Any:
    if isinstance(obj, dict):
        keys = sorted(obj) if isinstance(obj, GoMap) else obj
        return {k: _sorted_maps(obj[k]) for k in keys}
    if isinstance(obj, (list, tuple)):
        return [_sorted_maps(v) for v in obj]
    return obj


def _profile_to_json(p: MigProfile) -> dict:
    # no omitempty on MigProfile; an empty placement list is a nil slice in HAMi's plugin: null
    return dict(
        name=p.name,
        memoryMB=p.memory_mb,
        core=p.core,
        sliceCount=p.slice_count,
        placements=[dict(start=s, size=z) for s, z in p.placements] or None,
    )


def _device_to_json(d: DeviceInfo) -> dict:
    """HAMi ``MarshalNodeDevices``: ``DeviceInfo`` field order, every field ``omitempty``;
    ``custominfo`` and ``devicevendor`` are not written."""
    obj: dict[str, Any] = {}
    for key, value in (
        ("id", d.id),
        ("index", d.index),
        ("count", d.count),
        ("devmem", d.devmem),
        ("devcore", d.devcore),
        ("type", d.type),
        ("numa", d.numa),
        ("mode", d.mode),
        ("migProfiles", [_profile_to_json(p) for p in d.mig_profiles]),
        ("health", d.health),
    ):
        if value:  # Go omitempty: zero values and empty lists are left out
            obj[key] = value
    return obj


def encode_node_devices_json(devices: Iterable[DeviceInfo]) -> str:
    """The registration annotation value a device plugin writes (HAMi ``MarshalNodeDevices``)."""
    return go_json([_device_to_json(d) for d in devices])


def decode_pair_scores(text: str, where: str = "pair scores") -> dict[str, dict[str, int]]:
    """Topology annotation (``hami.io/node-nvidia-score``) -> ``{uuid: {uuid: score}}``; keys
    ``uuid``/``score`` matched as Go matches them, ``null`` = absent, scores Go ``int``."""
    data = go_loads(text, f"annotation {where}: ")
    if data is None:
        return {}
    if not isinstance(data, list):
        raise CodecError(f"annotation {where}: must be a JSON array, got {type(data).__name__}")
    out: dict[str, dict[str, int]] = {}
    for i, item in enumerate(data):
        f = go_struct(_obj(item, f"annotation {where}: entry {i}"), ("uuid", "score"), nillable=("score",))
        uuid = _str_field(f, "uuid", f"annotation {where}: entry {i}")
        scores = f.get("score") or {}
        if not isinstance(scores, dict):
            raise CodecError(f"annotation {where}: entry {i} ({uuid}): field 'score' must be an object of uuid: int")
        bad = [
            k
            for k, v in scores.items()
            if isinstance(v, bool) or not isinstance(v, int) or not INT64[0] <= v <= INT64[1]
        ]
        if bad:
            raise CodecError(f"annotation {where}: entry {i} ({uuid}): score for {bad[0]!r} must be an integer")
        out[uuid] = dict(scores)
    return out


def encode_pair_scores(scores: Mapping[str, Mapping[str, int]]) -> str:
    """HAMi's ``DevicePairScores`` as ``json.Marshal`` writes them: ``uuid`` and ``score`` are
    ``omitempty``, the score map's keys sorted."""
    out = []
    for u, s in scores.items():
        obj: dict[str, Any] = {}
        if u:
            obj["uuid"] = u
        if s:
            obj["score"] = GoMap(s)
        out.append(obj)
    return go_json(out)


# --------------------------------------------------------------- node registration: legacy colon


def _go_parse_bool(text: str, where: str) -> bool:
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise CodecError(f"{where}: field 'health' must be a boolean, got {text!r}")


def _go_int(text: str, where: str, name: str, bounds: tuple[int, int] = INT64, non_negative: bool = True) -> int:
    """Go ``strconv.ParseInt(text, 10, bits)``: an optional ``+``/``-``, then ASCII digits (no
    spaces, ``_`` or other scripts' digits, which Python's ``int`` would take), within ``bounds``;
    negative values refused where ``non_negative``."""
    if _GO_DECIMAL.fullmatch(text):
        lo, hi = bounds
        if len(text.lstrip("+-").lstrip("0")) <= 20:  # leading zeros are fine; more digits are out of range
            value = int(text)
        else:
            value = lo - 1 if text.startswith("-") else hi + 1
        if non_negative and value < 0:
            raise CodecError(f"{where}: field {name!r} must not be negative, got {shown(text)}")
        if lo <= value <= hi:
            return value
        raise CodecError(
            f"{where}: field {name!r} must be in {max(lo, 0) if non_negative else lo}..{hi}, got {shown(text)}"
        )
    what = "a non-negative integer" if non_negative else "an integer"
    raise CodecError(f"{where}: field {name!r} must be {what}, got {shown(text)}")


def decode_node_devices_legacy(text: str, vendor: str = "") -> tuple[DeviceInfo, ...]:
    """Parse the colon form (7 or 9 comma-separated fields per device)."""
    if ":" not in text:
        raise CodecError(f"legacy device list {shown(text)} has no ':' separator")
    out = []
    for i, chunk in enumerate(p for p in text.split(":") if p):
        where = f"device[{i}]"
        f = chunk.split(",")
        if len(f) not in (7, 9):
            raise CodecError(f"{where}: expected 7 or 9 comma-separated fields, got {len(f)} in {shown(chunk)}")
        if not f[0]:
            raise CodecError(f"{where}: field 'id' is empty")
        out.append(
            DeviceInfo(
                id=f[0],
                count=_go_int(f[1], where, "count", INT32),
                devmem=_go_int(f[2], where, "devmem", INT32),
                devcore=_go_int(f[3], where, "devcore", INT32),
                type=f[4],
                numa=_go_int(f[5], where, "numa", INT64, non_negative=False),
                health=_go_parse_bool(f[6], where),
                index=_go_int(f[7], where, "index", INT64) if len(f) == 9 else 0,
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
    """One container's devices. As HAMi v2.10: empty pieces and pieces without a comma are
    skipped, fields after the fourth are ignored; fewer than four fields is an error."""
    out = []
    for piece in text.split(":"):
        if "," not in piece:
            continue
        f = piece.split(",")
        if len(f) < 4:
            raise CodecError(
                f"{where}: device entry {shown(piece)} has {len(f)} fields, expected UUID,TYPE,MEM,CORES "
                "(do not set nodeName on pods that request devices)"
            )
        out.append(
            ContainerDevice(
                uuid=f[0],
                type=f[1],
                usedmem=_go_int(f[2], where, "usedmem", INT32),
                usedcores=_go_int(f[3], where, "usedcores", INT32),
            )
        )
    return tuple(out)


@functools.lru_cache(maxsize=8192)
def decode_pod_devices(text: str) -> PodSingleDevice:
    """Inverse of :func:`encode_pod_devices`; empty container entries are kept (index alignment).

    Cached by text: a watched pod's allocation comes back unchanged on each of its later events
    (bound, running, status updates), and the result is immutable (tuples of frozen records).
    A malformed text raises every time (exceptions are not cached).

    The final ``;`` is optional (HAMi reads the empty text after it as one more empty container,
    which no container index reaches). ``decode_pod_devices(encode_pod_devices(x)) == x`` and,
    for every value ``s`` HAMi writes, ``encode_pod_devices(decode_pod_devices(s)) == s``.
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
        return Slice(
            uuid=self.gpu_uuid,
            profile=self.profile,
            start=self.start,
            size=self.size,
            mig_uuid=self.mig_uuid,
            gpu_instance_id=self.gpu_instance_id,
            compute_instance_id=self.compute_instance_id,
        )


def encode_mig_allocations(entries: Iterable[MigAllocation]) -> str:
    """Go ``json.Marshal`` of HAMi's ``[]MigAllocation`` (runtime fields omitted when empty/nil)."""
    out = []
    for e in entries:
        obj = dict(
            containerIndex=e.container,
            deviceIndex=e.device,
            gpuUUID=e.gpu_uuid,
            profile=e.profile,
            placement=dict(start=e.start, size=e.size),
        )
        if e.mig_uuid:
            obj["migUUID"] = e.mig_uuid
        if e.gpu_instance_id is not None:
            obj["gpuInstanceID"] = e.gpu_instance_id
        if e.compute_instance_id is not None:
            obj["computeInstanceID"] = e.compute_instance_id
        out.append(obj)
    return go_json(out)


_MIG_FIELDS = (
    "containerIndex",
    "deviceIndex",
    "gpuUUID",
    "profile",
    "placement",
    "migUUID",
    "gpuInstanceID",
    "computeInstanceID",
)


def _opt_uint32(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    """A Go ``*uint32``: absent or null is nil."""
    return None if obj.get(key) is None else int_field(obj, key, where, UINT32)


def decode_mig_allocations(text: str) -> tuple[MigAllocation, ...]:
    """Parse ``hami.io/vgpu-mig-allocations`` with HAMi's checks: every entry complete (indexes
    >= 0, a GPU UUID, a profile, a placement of size > 0), the three runtime fields all present or
    all absent, ``(containerIndex, deviceIndex)`` unique. Keys are matched as Go matches them.
    Raises :class:`CodecError`."""
    if not text:
        return ()
    data = _json_array(text, "a JSON array")
    out: list[MigAllocation] = []
    seen: set[tuple[int, int]] = set()
    for i, raw in enumerate(data):
        where = f"entry {i}"
        obj = go_struct(_obj(raw, where), _MIG_FIELDS, nillable=("gpuInstanceID", "computeInstanceID"))
        place = go_struct(_obj(obj.get("placement"), f"{where}: field 'placement'"), _PLACEMENT_FIELDS)
        e = MigAllocation(
            container=int_field(obj, "containerIndex", where),
            device=int_field(obj, "deviceIndex", where),
            gpu_uuid=_str_field(obj, "gpuUUID", where),
            profile=_str_field(obj, "profile", where),
            start=int_field(place, "start", where, UINT32),
            size=int_field(place, "size", where, UINT32),
            mig_uuid=_str_field(obj, "migUUID", where),
            gpu_instance_id=_opt_uint32(obj, "gpuInstanceID", where),
            compute_instance_id=_opt_uint32(obj, "computeInstanceID", where),
        )
        if e.container < 0 or e.device < 0 or not e.gpu_uuid or not e.profile or e.size <= 0:
            raise CodecError(
                f"{where}: incomplete MIG allocation (containerIndex, deviceIndex >= 0, gpuUUID, "
                f"profile and a placement with size > 0 are required), got {shown(go_plain(raw))}"
            )
        runtime = (bool(e.mig_uuid), e.gpu_instance_id is not None, e.compute_instance_id is not None)
        if any(runtime) and not all(runtime):
            raise CodecError(f"{where}: migUUID, gpuInstanceID and computeInstanceID must be set together")
        if (e.container, e.device) in seen:
            raise CodecError(f"{where}: duplicate entry for containerIndex {e.container} deviceIndex {e.device}")
        seen.add((e.container, e.device))
        out.append(e)
    return tuple(out)
