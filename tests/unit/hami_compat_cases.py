"""HAMi v2.10's behaviour, written down as data (issue 20): what its decoders accept and how they
read it, the bytes its encoders write, and the placements its scheduler makes.

Every case is a literal input and the literal output we give; ``hami`` is what HAMi v2.10 gives
when that differs (``SAME`` otherwise), and ``doc`` names the row of docs/compatibility.md that
says why. A decision case may carry ``knobs``: with those settings (HAMi's behaviour where we
offer it) our output must equal HAMi's. The expectations come from HAMi's Go types and rules
(reference/hami-control-plane.md §4-§5, Go's encoding/json and strconv), not from its code.

Used by tests/unit/test_hami_compat.py (each case is one test) and bench/hami_compat.py (counts).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from hami.core import (
    CodecError,
    CoreError,
    ContainerDevice,
    DeviceInfo,
    SchedulerConfig,
    admit_pod,
    decode_node_devices_json,
    decode_node_devices_legacy,
    decode_pod_devices,
    encode_node_devices_json,
    encode_node_devices_legacy,
    encode_pod_devices,
    rebuild,
    schedule_pod,
)
from hami.core.ledger import Ledger
from hami.core.quantity import QuantityError
from hami.core.codec import (
    MigAllocation,
    decode_mig_allocations,
    decode_pair_scores,
    encode_mig_allocations,
    encode_pair_scores,
)
from hami.core.types import MigProfile
from hami.vendors import build_vendors

SAME = "same as ours"


@dataclass(frozen=True)
class Refused:
    """The input is refused; our error message contains ``needle``."""

    needle: str = ""


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[Any], Any]  # what is exercised: input -> output (CodecError -> Refused)
    given: Any
    ours: Any
    hami: Any = SAME
    doc: str = ""  # docs/compatibility.md row id, required when hami differs
    knobs: Mapping[str, Any] = field(default_factory=dict)  # settings giving HAMi's output

    @property
    def agrees(self) -> bool:
        return self.hami is SAME


def outcome(case: Case, given: Any = None, **knobs: Any) -> Any:
    """Run ``case`` (a CodecError, or any core error, becomes ``Refused`` with the message)."""
    try:
        return case.run(case.given if given is None else given, **knobs)
    except (CodecError, CoreError) as exc:
        return Refused(str(exc))


def matches(got: Any, want: Any) -> bool:
    if isinstance(want, Refused):
        return isinstance(got, Refused) and want.needle in got.needle
    return got == want


# ------------------------------------------------------------------------------- decoders


def _json_reg(text: str) -> tuple[DeviceInfo, ...]:
    return decode_node_devices_json(text)


def _node_reg(text: str) -> tuple[str, ...]:
    """The device IDs the scheduler takes from a node carrying ``text`` as its NVIDIA registration."""
    from hami.core import node_devices_from_object

    node = {"metadata": {"name": "n", "annotations": {"hami.io/node-nvidia-register": text}}}
    return tuple(d.id for d in node_devices_from_object(node, SchedulerConfig(build_vendors()).vendors).devices)


def _legacy_reg(text: str) -> tuple[DeviceInfo, ...]:
    return decode_node_devices_legacy(text)


def _pod(text: str):
    return decode_pod_devices(text)


def _mig(text: str):
    return decode_mig_allocations(text)


def _pairs(text: str):
    return decode_pair_scores(text)


T4 = "NVIDIA-Tesla T4"
D0 = DeviceInfo(
    id="GPU-0", index=1, count=10, devmem=15360, devcore=100, type=T4, numa=1, mode="hami-core", health=True
)
P2 = MigProfile("1g.10gb", 9856, 13, 1, ((0, 2), (2, 2)))

REGISTRATION_JSON = [
    Case(
        "as HAMi's NVIDIA plugin writes it",
        _json_reg,
        '[{"id":"GPU-0","index":1,"count":10,"devmem":15360,"devcore":100,"type":"NVIDIA-Tesla T4","numa":1,'
        '"mode":"hami-core","health":true}]',
        (D0,),
    ),
    Case(
        "keys capitalised (one of HAMi's Ascend test registrations is written so)",
        _json_reg,
        '[{"ID":"GPU-0","Index":1,"Count":10,"Devmem":15360,"Devcore":100,"Type":"NVIDIA-Tesla T4","Numa":1,'
        '"Mode":"hami-core","Health":true}]',
        (D0,),
    ),
    Case(
        "keys in any case",
        _json_reg,
        '[{"iD":"GPU-0","INDEX":1,"cOuNt":10,"DEVMEM":15360,"devCore":100,"TYPE":"NVIDIA-Tesla T4","NUMA":1,'
        '"MODE":"hami-core","HEALTH":true}]',
        (D0,),
    ),
    Case(
        "a key spelt with KELVIN SIGN / LONG S folds to k / s, as in Go",
        _json_reg,
        '[{"id":"GPU-0","mode":"mig","health":true,"migProfiles":[{"name":"1g.10gb","memoryMB":9856,"core":13,'
        '"\u017fliceCount":1,"placements":[{"\u017ftart":0,"\u017fize":2},{"start":2,"size":2}]}]}]',
        (DeviceInfo(id="GPU-0", mode="mig", health=True, mig_profiles=(P2,)),),
    ),
    Case(
        "the same field twice: the last in the document wins",
        _json_reg,
        '[{"id":"GPU-x","ID":"GPU-0","count":1,"Count":10}]',
        (DeviceInfo(id="GPU-0", count=10),),
    ),
    Case(
        "null fields read as absent",
        _json_reg,
        '[{"id":"GPU-0","index":null,"count":null,"health":null,"mode":null,"migProfiles":null,"custominfo":null}]',
        (DeviceInfo(id="GPU-0"),),
    ),
    Case(
        "a null after a value leaves the value",
        _json_reg,
        '[{"id":"GPU-0","count":10,"count":null}]',
        (DeviceInfo(id="GPU-0", count=10),),
    ),
    Case(
        "a null after a list or object empties it (Go slice, map)",
        _json_reg,
        '[{"id":"GPU-0","custominfo":{"a":1},"CustomInfo":null,"migProfiles":[{"name":"a"}],"migprofiles":null}]',
        (DeviceInfo(id="GPU-0"),),
    ),
    Case(
        "placements null and [] mean the same",
        _json_reg,
        '[{"id":"GPU-0","migProfiles":[{"name":"a","placements":null},{"name":"b","placements":[]}]}]',
        (DeviceInfo(id="GPU-0", mig_profiles=(MigProfile("a", 0, 0, 0), MigProfile("b", 0, 0, 0))),),
    ),
    Case(
        "a null MIG profile or placement is the zero value",
        _json_reg,
        '[{"id":"GPU-0","migProfiles":[null,{"name":"a","placements":[null]}]}]',
        (DeviceInfo(id="GPU-0", mig_profiles=(MigProfile("", 0, 0, 0), MigProfile("a", 0, 0, 0, ((0, 0),)))),),
    ),
    Case("the whole value null: no devices", _json_reg, "null", ()),
    Case("an empty list: no devices", _json_reg, "[]", ()),
    Case(
        "escaped characters",
        _json_reg,
        '[{"id":"GPU-\\u0030","type":"NVIDIA-A\\u003cB\\u003e\\u0026\\"C\\""}]',
        (DeviceInfo(id="GPU-0", type='NVIDIA-A<B>&"C"'),),
    ),
    Case(
        "an escaped lone surrogate reads as U+FFFD",
        _json_reg,
        '[{"id":"GPU-0","type":"NVIDIA-\\ud800"}]',
        (DeviceInfo(id="GPU-0", type="NVIDIA-\ufffd"),),
    ),
    Case(
        "unknown keys are ignored",
        _json_reg,
        '[{"id":"GPU-0","vendorSpecific":{"a":[1,2]},"devicevendor":"x"}]',
        (DeviceInfo(id="GPU-0"),),
    ),
    Case(
        "custominfo is kept as an object (Ascend's NetworkID)",
        _json_reg,
        '[{"id":"npu-0","custominfo":{"NetworkID":3}}]',
        (DeviceInfo(id="npu-0", custominfo={"NetworkID": 3}),),
    ),
    Case("negative numa (int)", _json_reg, '[{"id":"GPU-0","numa":-1}]', (DeviceInfo(id="GPU-0", numa=-1),)),
    Case(
        "index at the top of uint64",
        _json_reg,
        '[{"id":"GPU-0","index":18446744073709551615}]',
        (DeviceInfo(id="GPU-0", index=2**64 - 1),),
    ),
    Case("count beyond int32", _json_reg, '[{"id":"GPU-0","count":2147483648}]', Refused("'count' must be in")),
    Case("negative index (uint)", _json_reg, '[{"id":"GPU-0","index":-1}]', Refused("'index' must be in")),
    Case("numa beyond int64", _json_reg, '[{"id":"GPU-0","numa":9223372036854775808}]', Refused("'numa'")),
    Case(
        "a number with a fraction or exponent where Go wants an integer",
        _json_reg,
        '[{"id":"GPU-0","count":1.0}]',
        Refused("'count' must be an integer"),
    ),
    Case("health as a string", _json_reg, '[{"id":"GPU-0","health":"true"}]', Refused("'health' must be a boolean")),
    Case(
        "sliceCount beyond uint32",
        _json_reg,
        '[{"id":"GPU-0","migProfiles":[{"sliceCount":4294967296}]}]',
        Refused("'sliceCount'"),
    ),
    Case("not a list", _json_reg, '{"id":"GPU-0"}', Refused("JSON array")),
    Case("text after the JSON value", _json_reg, "[]x", Refused("not valid JSON")),
    Case(
        "negative count",
        _json_reg,
        '[{"id":"GPU-0","count":-1}]',
        Refused("'count' must be in 0..2147483647"),
        hami=(DeviceInfo(id="GPU-0", count=-1),),
        doc="negative-capacity",
    ),
    Case(
        "negative MIG profile memory",
        _json_reg,
        '[{"id":"GPU-0","migProfiles":[{"name":"a","memoryMB":-1}]}]',
        Refused("'memoryMB'"),
        hami=(DeviceInfo(id="GPU-0", mig_profiles=(MigProfile("a", -1, 0, 0),)),),
        doc="negative-capacity",
    ),
    Case(
        "no id",
        _json_reg,
        '[{"count":10}]',
        Refused("'id' is missing"),
        hami=(DeviceInfo(id="", count=10),),
        doc="empty-id",
    ),
    Case(
        "a null device",
        _json_reg,
        "[null]",
        Refused("device[0]: must be a JSON object"),
        hami="one nil *DeviceInfo in the list",
        doc="null-device",
    ),
    Case(
        "the scheduler takes every registered device", _node_reg, '[{"id":"GPU-0"},{"ID":"GPU-1"}]', ("GPU-0", "GPU-1")
    ),
    Case(
        "the same device registered twice",
        _node_reg,
        '[{"id":"GPU-0","count":10},{"id":"GPU-0","count":10}]',
        Refused("registered twice"),
        hami=("GPU-0", "GPU-0"),
        doc="duplicate-id",
    ),
]

REGISTRATION_LEGACY = [
    Case(
        "9 fields as HAMi's EncodeNodeDevices writes them",
        _legacy_reg,
        "GPU-0,10,15360,100,NVIDIA-Tesla T4,1,true,1,hami-core:",
        (D0,),
    ),
    Case(
        "7 fields: index 0, mode hami-core",
        _legacy_reg,
        "DCU-0,4,16368,100,DCU-Z100,0,true:",
        (DeviceInfo(id="DCU-0", count=4, devmem=16368, devcore=100, type="DCU-Z100", mode="hami-core", health=True),),
    ),
    Case(
        "a '+' sign (strconv.ParseInt)",
        _legacy_reg,
        "DCU-0,+4,+16368,100,DCU-Z100,+0,true,+1,hami-core:",
        (
            DeviceInfo(
                id="DCU-0", index=1, count=4, devmem=16368, devcore=100, type="DCU-Z100", mode="hami-core", health=True
            ),
        ),
    ),
    Case(
        "Go bools: T, 0",
        _legacy_reg,
        "a,1,1,100,X,0,T:b,1,1,100,X,0,0:",
        (
            DeviceInfo(id="a", count=1, devmem=1, devcore=100, type="X", mode="hami-core", health=True),
            DeviceInfo(id="b", count=1, devmem=1, devcore=100, type="X", mode="hami-core", health=False),
        ),
    ),
    Case(
        "negative numa",
        _legacy_reg,
        "a,1,1,100,X,-1,true:",
        (DeviceInfo(id="a", count=1, devmem=1, devcore=100, type="X", numa=-1, mode="hami-core", health=True),),
    ),
    Case(
        "empty segments between devices are skipped",
        _legacy_reg,
        "::a,1,1,100,X,0,true::",
        (DeviceInfo(id="a", count=1, devmem=1, devcore=100, type="X", mode="hami-core", health=True),),
    ),
    Case("no ':' at all", _legacy_reg, "a,1,1,100,X,0,true", Refused("no ':'")),
    Case("8 fields", _legacy_reg, "a,1,1,100,X,0,true,0:", Refused("7 or 9")),
    Case("a segment without a comma", _legacy_reg, "a,1,1,100,X,0,true:junk:", Refused("7 or 9")),
    Case("count beyond int32", _legacy_reg, "a,2147483648,1,100,X,0,true:", Refused("'count' must be in")),
    Case("negative index", _legacy_reg, "a,1,1,100,X,0,true,-1,hami-core:", Refused("'index' must not be negative")),
    Case("a space before a number", _legacy_reg, "a, 1,1,100,X,0,true:", Refused("'count'")),
    Case("health that is not a Go bool", _legacy_reg, "a,1,1,100,X,0,yes:", Refused("'health'")),
    Case(
        "negative count",
        _legacy_reg,
        "a,-1,1,100,X,0,true:",
        Refused("'count' must not be negative"),
        hami=(DeviceInfo(id="a", count=-1, devmem=1, devcore=100, type="X", mode="hami-core", health=True),),
        doc="negative-capacity",
    ),
    Case(
        "empty id",
        _legacy_reg,
        ",1,1,100,X,0,true:",
        Refused("'id' is empty"),
        hami=(DeviceInfo(id="", count=1, devmem=1, devcore=100, type="X", mode="hami-core", health=True),),
        doc="empty-id",
    ),
]


def _cd(uuid: str, mem: int, cores: int, type_: str = "NVIDIA") -> ContainerDevice:
    return ContainerDevice(uuid, type_, mem, cores)


POD_ALLOCATION = [
    Case(
        "two containers on one GPU",
        _pod,
        "GPU-a,NVIDIA,3000,0:;GPU-a,NVIDIA,5000,0:;",
        ((_cd("GPU-a", 3000, 0),), (_cd("GPU-a", 5000, 0),)),
    ),
    Case(
        "a container without devices keeps its place", _pod, ";GPU-a,NVIDIA,2000,30:;", ((), (_cd("GPU-a", 2000, 30),))
    ),
    Case("no final ';'", _pod, "GPU-a,NVIDIA,1000,10:", ((_cd("GPU-a", 1000, 10),),)),
    Case("no final ':'", _pod, "GPU-a,NVIDIA,1000,10;", ((_cd("GPU-a", 1000, 10),),)),
    Case(
        "a piece without a comma is skipped (HAMi v2.10)",
        _pod,
        "GPU-a,NVIDIA,1000,10:junk:;",
        ((_cd("GPU-a", 1000, 10),),),
    ),
    Case("fields after the fourth are ignored", _pod, "GPU-a,NVIDIA,1000,10,extra:;", ((_cd("GPU-a", 1000, 10),),)),
    Case("a '+' sign", _pod, "GPU-a,NVIDIA,+1000,+10:;", ((_cd("GPU-a", 1000, 10),),)),
    Case("an empty UUID and type are read as written", _pod, ",,1000,10:;", ((_cd("", 1000, 10, ""),),)),
    Case(
        "empty containers only (HAMi adds one more empty entry after the last ';': same meaning)", _pod, ";;", ((), ())
    ),
    Case("fewer than four fields", _pod, "GPU-a,NVIDIA,1000:;", Refused("do not set nodeName")),
    Case("memory beyond int32", _pod, "GPU-a,NVIDIA,2147483648,10:;", Refused("'usedmem' must be in")),
    Case("memory not a number", _pod, "GPU-a,NVIDIA,1k,10:;", Refused("'usedmem'")),
    Case(
        "negative memory",
        _pod,
        "GPU-a,NVIDIA,-1000,10:;",
        Refused("'usedmem' must not be negative"),
        hami=((_cd("GPU-a", -1000, 10),),),
        doc="negative-usage",
    ),
]

MIG_ALLOCATIONS = [
    Case(
        "as HAMi's scheduler writes it",
        _mig,
        '[{"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-a","profile":"1g.10gb","placement":{"start":6,"size":2}}]',
        (MigAllocation(0, 1, "GPU-a", "1g.10gb", 6, 2),),
    ),
    Case(
        "keys in other cases, runtime identity filled in",
        _mig,
        '[{"ContainerIndex":1,"DEVICEINDEX":0,"GpuUuid":"GPU-a","Profile":"3g.20gb","Placement":{"Start":4,"Size":4},'
        '"MigUUID":"MIG-x","GPUInstanceID":0,"computeinstanceid":0}]',
        (MigAllocation(1, 0, "GPU-a", "3g.20gb", 4, 4, "MIG-x", 0, 0),),
    ),
    Case(
        "null runtime identity is absent",
        _mig,
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"7g.40gb","placement":{"start":0,"size":8},'
        '"migUUID":null,"gpuInstanceID":null,"computeInstanceID":null}]',
        (MigAllocation(0, 0, "GPU-a", "7g.40gb", 0, 8),),
    ),
    Case(
        "start beyond uint32",
        _mig,
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"p","placement":{"start":4294967296,"size":1}}]',
        Refused("'start'"),
    ),
    Case(
        "a placement of size 0 is incomplete",
        _mig,
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"p","placement":null}]',
        Refused("incomplete"),
    ),
    Case(
        "part of the runtime identity",
        _mig,
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"p","placement":{"start":0,"size":1},'
        '"migUUID":"MIG-x"}]',
        Refused("set together"),
    ),
    Case(
        "the same container and device twice",
        _mig,
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"a","profile":"p","placement":{"start":0,"size":1}},'
        '{"containerIndex":0,"deviceIndex":0,"gpuUUID":"a","profile":"p","placement":{"start":1,"size":1}}]',
        Refused("duplicate"),
    ),
]

PAIR_SCORES = [
    Case(
        "as HAMi's plugin writes it",
        _pairs,
        '[{"uuid":"GPU-a","score":{"GPU-b":200}},{"uuid":"GPU-b","score":{"GPU-a":200}}]',
        {"GPU-a": {"GPU-b": 200}, "GPU-b": {"GPU-a": 200}},
    ),
    Case(
        "keys in other cases, a score omitted (omitempty)",
        _pairs,
        '[{"UUID":"GPU-a","Score":{"GPU-b":100}},{"uuid":"GPU-b"}]',
        {"GPU-a": {"GPU-b": 100}, "GPU-b": {}},
    ),
    Case(
        "a score that is not an integer",
        _pairs,
        '[{"uuid":"GPU-a","score":{"GPU-b":"x"}}]',
        Refused("must be an integer"),
    ),
]

DECODERS = {
    "registration (JSON)": REGISTRATION_JSON,
    "registration (legacy colon)": REGISTRATION_LEGACY,
    "pod allocation": POD_ALLOCATION,
    "MIG allocations": MIG_ALLOCATIONS,
    "pair scores": PAIR_SCORES,
}


# ------------------------------------------------------------------------------- encoders


ENCODERS = {
    "encoders": [
        Case(
            "registration: HAMi's DeviceInfo field order, zero values left out",
            encode_node_devices_json,
            [DeviceInfo(id="GPU-0", count=10, devmem=15360, devcore=100, type=T4, mode="hami-core", health=True), D0],
            '[{"id":"GPU-0","count":10,"devmem":15360,"devcore":100,"type":"NVIDIA-Tesla T4","mode":"hami-core",'
            '"health":true},{"id":"GPU-0","index":1,"count":10,"devmem":15360,"devcore":100,"type":"NVIDIA-Tesla T4",'
            '"numa":1,"mode":"hami-core","health":true}]',
        ),
        Case(
            "registration: migProfiles before health; an empty placement list is null",
            encode_node_devices_json,
            [
                DeviceInfo(
                    id="GPU-a",
                    count=7,
                    devmem=40960,
                    devcore=100,
                    type="NVIDIA-A100",
                    mode="mig",
                    health=True,
                    mig_profiles=(P2, MigProfile("7g.40gb", 40192, 91, 7)),
                )
            ],
            '[{"id":"GPU-a","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100","mode":"mig","migProfiles":'
            '[{"name":"1g.10gb","memoryMB":9856,"core":13,"sliceCount":1,"placements":[{"start":0,"size":2},'
            '{"start":2,"size":2}]},{"name":"7g.40gb","memoryMB":40192,"core":91,"sliceCount":7,"placements":null}],'
            '"health":true}]',
        ),
        Case(
            "registration: HTML-safe escaping, U+2028/U+2029, control characters, non-ASCII kept",
            encode_node_devices_json,
            [DeviceInfo(id="GPU-0", type="A<B>&C\u2028\u2029\b\f\n\x01\x7f é")],
            '[{"id":"GPU-0","type":"A\\u003cB\\u003e\\u0026C\\u2028\\u2029\\b\\f\\n\\u0001\x7f é"}]',
        ),
        Case(
            "registration: an unhealthy device has no health key; custominfo is not written",
            encode_node_devices_json,
            [DeviceInfo(id="npu-0", count=1, custominfo={"NetworkID": 3})],
            '[{"id":"npu-0","count":1}]',
        ),
        Case("registration: no devices", encode_node_devices_json, [], "[]"),
        Case(
            "registration, legacy colon form (9 fields)",
            encode_node_devices_legacy,
            [D0],
            "GPU-0,10,15360,100,NVIDIA-Tesla T4,1,true,1,hami-core:",
        ),
        Case(
            "pod allocation: ';' after every container, empty ones kept",
            encode_pod_devices,
            ((_cd("GPU-a", 3000, 0),), (), (_cd("GPU-a", 1000, 30), _cd("GPU-b", 1000, 30))),
            "GPU-a,NVIDIA,3000,0:;;GPU-a,NVIDIA,1000,30:GPU-b,NVIDIA,1000,30:;",
        ),
        Case(
            "MIG allocations: scheduler's entries (no runtime identity)",
            encode_mig_allocations,
            [MigAllocation(0, 0, "GPU-a", "1g.10gb", 6, 2), MigAllocation(0, 1, "GPU-a", "1g.10gb", 4, 2)],
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.10gb","placement":{"start":6,"size":2}},'
            '{"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-a","profile":"1g.10gb","placement":{"start":4,"size":2}}]',
        ),
        Case(
            "MIG allocations: runtime identity, instance IDs 0 written (pointers)",
            encode_mig_allocations,
            [MigAllocation(1, 0, "GPU-a", "3g.20gb", 4, 4, "MIG-x", 0, 0)],
            '[{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"3g.20gb","placement":{"start":4,"size":4},'
            '"migUUID":"MIG-x","gpuInstanceID":0,"computeInstanceID":0}]',
        ),
        Case(
            "pair scores: map keys sorted, an empty score left out",
            encode_pair_scores,
            {"GPU-b": {"GPU-c": 60, "GPU-a": 200}, "GPU-z": {}},
            '[{"uuid":"GPU-b","score":{"GPU-a":200,"GPU-c":60}},{"uuid":"GPU-z"}]',
        ),
    ]
}


# ------------------------------------------------------------------------------- decisions

NOW = 1_700_000_000.0
REGISTER = "hami.io/node-nvidia-register"
ALLOCATED = "hami.io/vgpu-devices-allocated"


def gpu(
    i: int, numa: int = 0, mem: int = 16384, type_: str = T4, count: int = 10, node: str = "", health: bool = True
) -> dict:
    """One device as HAMi's NVIDIA plugin registers it (UUID ``GPU-<node><i>``)."""
    return {
        "id": f"GPU-{node}{i}",
        "index": i,
        "count": count,
        "devmem": mem,
        "devcore": 100,
        "type": type_,
        "numa": numa,
        "mode": "hami-core",
        "health": health,
    }


@dataclass(frozen=True)
class Scenario:
    """Nodes (name -> registered devices), pods already placed (node, allocation annotation), and
    the pod to place: its containers' limits (init containers marked) and annotations."""

    nodes: Mapping[str, tuple[dict, ...]]
    containers: tuple[Mapping[str, Any], ...]
    annotations: Mapping[str, str] = field(default_factory=dict)
    placed: tuple[tuple[str, str], ...] = ()
    init: tuple[Mapping[str, Any], ...] = ()
    sidecars: tuple[Mapping[str, Any], ...] = ()


def _node(name: str, devices: tuple[dict, ...]) -> dict:
    cap = {"nvidia.com/gpu": str(10 * len(devices))}
    return {
        "metadata": {"name": name, "annotations": {REGISTER: json.dumps(list(devices))}},
        "status": {"capacity": cap, "allocatable": dict(cap)},
    }


def _ctr(name: str, limits: Mapping[str, Any], sidecar: bool = False) -> dict:
    c = {"name": name, "resources": {"limits": dict(limits)}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def place(s: Scenario, **knobs: Any) -> tuple[str, str] | str:
    """``(node, hami.io/vgpu-devices-allocated)`` of the decision, or the reasons when pending."""
    config = SchedulerConfig(build_vendors(), **knobs)
    placed = [
        {
            "metadata": {
                "name": f"old-{i}",
                "namespace": "bg",
                "uid": f"old-{i}",
                "annotations": {"hami.io/vgpu-node": n, ALLOCATED: a},
            },
            "spec": {"nodeName": n, "containers": [{"name": "c"}]},
        }
        for i, (n, a) in enumerate(s.placed)
    ]
    ledger, warnings = rebuild([_node(n, d) for n, d in s.nodes.items()], placed, config.vendors)
    assert not warnings, warnings
    spec: dict[str, Any] = {"containers": [_ctr(f"c{i}", c) for i, c in enumerate(s.containers)]}
    inits = [_ctr(f"s{i}", c, sidecar=True) for i, c in enumerate(s.sidecars)]
    inits += [_ctr(f"i{i}", c) for i, c in enumerate(s.init)]
    if inits:
        spec["initContainers"] = inits
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "p", "annotations": dict(s.annotations)},
        "spec": spec,
    }
    pod = admit_pod(copy.deepcopy(pod), config.vendors)[0]
    r = schedule_pod(pod, None, ledger, config, NOW)
    if r.node is None:
        return "; ".join(f"{n}: {why}" for n, why in r.reasons().items())
    return r.node, r.annotations[ALLOCATED]


def _decide(s: Scenario, **knobs: Any):
    return place(s, **knobs)


TWO = {"n": (gpu(0, numa=0), gpu(1, numa=1))}
ONE_GPU = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}
POLICY = "hami.io/gpu-scheduler-policy"
NUMA_BIND = "nvidia.com/numa-bind"

DECISIONS = {
    "decisions": [
        Case(
            "GPU policy numa: the highest NUMA node first",
            _decide,
            Scenario(TWO, (ONE_GPU,), {POLICY: "numa"}),
            ("n", "GPU-1,NVIDIA,1000,0:;"),
        ),
        Case(
            "chain binpack,numa: equal scores, the highest NUMA node",
            _decide,
            Scenario(TWO, (ONE_GPU,), {POLICY: "binpack,numa"}),
            ("n", "GPU-1,NVIDIA,1000,0:;"),
        ),
        Case(
            "chain numa,spread: NUMA before score",
            _decide,
            Scenario(TWO, (ONE_GPU,), {POLICY: "numa,spread"}, placed=(("n", "GPU-1,NVIDIA,8000,0:;"),)),
            ("n", "GPU-1,NVIDIA,1000,0:;"),
        ),
        Case(
            "numa-bind with spread: the highest NUMA node",
            _decide,
            Scenario(TWO, (ONE_GPU,), {NUMA_BIND: "true"}),
            ("n", "GPU-1,NVIDIA,1000,0:;"),
        ),
        Case(
            "numa-bind with binpack: the lowest NUMA node (HAMi's single-policy order)",
            _decide,
            Scenario(TWO, (ONE_GPU,), {NUMA_BIND: "true", POLICY: "binpack"}),
            ("n", "GPU-0,NVIDIA,1000,0:;"),
        ),
        Case(
            "numa-bind, two GPUs: both from one NUMA node",
            _decide,
            Scenario(
                {"n": (gpu(0, 0), gpu(1, 1), gpu(2, 0), gpu(3, 1))},
                ({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000},),
                {NUMA_BIND: "true"},
            ),
            ("n", "GPU-1,NVIDIA,1000,0:GPU-3,NVIDIA,1000,0:;"),
            hami=("n", "GPU-3,NVIDIA,1000,0:GPU-1,NVIDIA,1000,0:;"),
            doc="ties",
        ),
        Case(
            "spread, equal scores: the highest NUMA node",
            _decide,
            Scenario(TWO, (ONE_GPU,)),
            ("n", "GPU-1,NVIDIA,1000,0:;"),
        ),
        Case(
            "binpack, equal scores: the highest NUMA node",
            _decide,
            Scenario(TWO, (ONE_GPU,), {POLICY: "binpack"}),
            ("n", "GPU-1,NVIDIA,1000,0:;"),
        ),
        Case(
            "binpack: the fuller GPU",
            _decide,
            Scenario(TWO, (ONE_GPU,), {POLICY: "binpack"}, placed=(("n", "GPU-0,NVIDIA,4000,0:;"),)),
            ("n", "GPU-0,NVIDIA,1000,0:;"),
        ),
        Case(
            "spread: the emptier GPU",
            _decide,
            Scenario(TWO, (ONE_GPU,), placed=(("n", "GPU-1,NVIDIA,4000,0:;"),)),
            ("n", "GPU-0,NVIDIA,1000,0:;"),
        ),
        Case(
            "mutex: only idle GPUs, the highest NUMA node first",
            _decide,
            Scenario(
                {"n": (gpu(0, 0), gpu(1, 1), gpu(2, 1))},
                (ONE_GPU,),
                {POLICY: "mutex"},
                placed=(("n", "GPU-2,NVIDIA,100,0:;"),),
            ),
            ("n", "GPU-1,NVIDIA,1000,0:;"),
        ),
        Case(
            "mutex, every GPU in use",
            _decide,
            Scenario({"n": (gpu(0),)}, (ONE_GPU,), {POLICY: "mutex"}, placed=(("n", "GPU-0,NVIDIA,100,0:;"),)),
            "n: 1/1 ExclusiveDeviceAllocateConflict",
        ),
        Case(
            "a type without 'NVIDIA' is not a candidate",
            _decide,
            Scenario({"n": (gpu(0, numa=0), gpu(1, numa=1, type_="Tesla T4"))}, (ONE_GPU,)),
            ("n", "GPU-0,NVIDIA,1000,0:;"),
        ),
        Case(
            "only devices without 'NVIDIA' in their type",
            _decide,
            Scenario({"n": (gpu(0, type_="Tesla T4"),)}, (ONE_GPU,)),
            "n: NodeInsufficientDevice",
        ),
        Case(
            "the type check ignores case",
            _decide,
            Scenario({"n": (gpu(0, type_="nvidia-t4"),)}, (ONE_GPU,)),
            ("n", "GPU-0,NVIDIA,1000,0:;"),
        ),
        Case(
            "a 100-core request on a GPU in use",
            _decide,
            Scenario(
                {"n": (gpu(0),)},
                ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 100},),
                placed=(("n", "GPU-0,NVIDIA,100,0:;"),),
            ),
            "n: 1/1 ExclusiveDeviceAllocateConflict",
        ),
        Case(
            "use-gputype: a case-insensitive substring of the model",
            _decide,
            Scenario(
                {"n": (gpu(0, numa=0, type_="NVIDIA-A100-SXM4-40GB"), gpu(1, numa=1))},
                (ONE_GPU,),
                {"nvidia.com/use-gputype": "a100"},
            ),
            ("n", "GPU-0,NVIDIA,1000,0:;"),
        ),
        Case(
            "nouse-gpuuuid: exact UUIDs left out",
            _decide,
            Scenario(TWO, (ONE_GPU,), {"nvidia.com/nouse-gpuuuid": "GPU-1"}),
            ("n", "GPU-0,NVIDIA,1000,0:;"),
        ),
        Case(
            "gpumem-percentage: a share of the GPU's memory",
            _decide,
            Scenario(TWO, ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50},)),
            ("n", "GPU-1,NVIDIA,8192,0:;"),
        ),
        Case(
            "nvidia.com/gpu alone: the whole memory and 100 cores",
            _decide,
            Scenario(TWO, ({"nvidia.com/gpu": 1},)),
            ("n", "GPU-1,NVIDIA,16384,100:;"),
        ),
        Case(
            "every slot of the GPU taken",
            _decide,
            Scenario({"n": (gpu(0, count=1),)}, (ONE_GPU,), placed=(("n", "GPU-0,NVIDIA,100,0:;"),)),
            "n: 1/1 CardTimeSlicingExhausted",
        ),
        Case("an unhealthy GPU", _decide, Scenario({"n": (gpu(0, health=False),)}, (ONE_GPU,)), "n: 1/1 CardNotHealth"),
        Case(
            "more GPUs than the node has",
            _decide,
            Scenario(TWO, ({"nvidia.com/gpu": 3, "nvidia.com/gpumem": 100},)),
            "n: NodeInsufficientDevice",
        ),
        Case(
            "more memory than any GPU has",
            _decide,
            Scenario(TWO, ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000},)),
            "n: 2/2 CardInsufficientMemory",
        ),
        Case(
            "init containers: the peak, not the sum",
            _decide,
            Scenario(
                {"n": (gpu(0),)},
                ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000},),
                init=({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 12000},),
            ),
            ("n", "GPU-0,NVIDIA,12000,0:;GPU-0,NVIDIA,8000,0:;"),
        ),
        Case(
            "full tie (same score, same NUMA node): the lowest index",
            _decide,
            Scenario({"n": (gpu(0), gpu(1))}, (ONE_GPU,)),
            ("n", "GPU-0,NVIDIA,1000,0:;"),
            hami=("n", "GPU-1,NVIDIA,1000,0:;"),
            doc="ties",
        ),
        Case(
            "full tie in a chain: the lowest index",
            _decide,
            Scenario({"n": (gpu(0), gpu(1))}, (ONE_GPU,), {POLICY: "binpack,numa"}),
            ("n", "GPU-0,NVIDIA,1000,0:;"),
            hami=("n", "GPU-1,NVIDIA,1000,0:;"),
            doc="ties",
        ),
        Case(
            "two equal nodes: the first by name",
            _decide,
            Scenario({"b": (gpu(0, node="b"),), "a": (gpu(0, node="a"),)}, (ONE_GPU,)),
            ("a", "GPU-a0,NVIDIA,1000,0:;"),
            hami="a or b, whichever scoring goroutine finished last",
            doc="node-ties",
        ),
        Case(
            "device-scoring-weights without all three keys refuses the pod",
            _decide,
            Scenario(TWO, (ONE_GPU,), {"hami.io/device-scoring-weights": "slot=1"}),
            Refused("must set all of slot, core and memory"),
        ),
        Case(
            "an unknown GPU policy refuses the pod, naming the annotation",
            _decide,
            Scenario(TWO, (ONE_GPU,), {POLICY: "binpak"}),
            Refused("hami.io/gpu-scheduler-policy: unknown GPU policy"),
            hami=("n", "GPU-1,NVIDIA,1000,0:;"),
            doc="bad-policy",
        ),
        Case(
            "an unknown node policy refuses the pod, naming the annotation",
            _decide,
            Scenario(TWO, (ONE_GPU,), {"hami.io/node-scheduler-policy": "fastest"}),
            Refused("hami.io/node-scheduler-policy: unknown node policy"),
            hami=("n", "GPU-1,NVIDIA,1000,0:;"),
            doc="bad-policy",
        ),
        Case(
            "GPU score counts the request: binpack takes the GPU the request fills most",
            _decide,
            Scenario(
                {"n": (gpu(0, numa=0, mem=16384), gpu(1, numa=1, mem=32768))},
                ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000},),
                {POLICY: "binpack"},
            ),
            ("n", "GPU-0,NVIDIA,8000,0:;"),
            hami=("n", "GPU-1,NVIDIA,8000,0:;"),
            doc="request-in-scores",
            knobs={"request_in_scores": False},
        ),
        Case(
            "node score counts the request: binpack takes the node the pod fills most",
            _decide,
            Scenario(
                {
                    "a": (gpu(0, node="a"),),
                    "b": (gpu(0, node="b"), gpu(1, node="b"), gpu(2, node="b"), gpu(3, numa=1, node="b")),
                },
                ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000},),
                placed=(
                    ("a", "GPU-a0,NVIDIA,6000,0:;"),
                    ("b", "GPU-b0,NVIDIA,16384,0:;"),
                    ("b", "GPU-b1,NVIDIA,16384,0:;"),
                ),
            ),
            ("a", "GPU-a0,NVIDIA,8000,0:;"),
            hami=("b", "GPU-b3,NVIDIA,8000,0:;"),
            doc="request-in-scores",
            knobs={"request_in_scores": False},
        ),
        Case(
            "a native sidecar runs beside the app: both count",
            _decide,
            Scenario(
                {"n": (gpu(0),)},
                ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000},),
                sidecars=({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000},),
                placed=(("n", "GPU-0,NVIDIA,4000,0:;"),),
            ),
            "n: 1/1 CardInsufficientMemory",
            hami=("n", "GPU-0,NVIDIA,8000,0:;GPU-0,NVIDIA,8000,0:;"),
            doc="sidecars",
        ),
    ]
}


def _quota(hard: Mapping[str, str]) -> dict[str, int]:
    """The limits a ResourceQuota's ``spec.hard`` sets for GPU pods (memory in MiB), as the
    scheduler reads them; an unreadable value is left out (the others still apply)."""
    ledger = Ledger()
    try:
        ledger.set_quota("team", "q", hard, build_vendors())
    except QuantityError:
        pass
    return ledger.quota_limits("team", "q") or {}


def _mig_quota(limit_mib: int) -> int | None:
    """MiB the namespace is charged when a pod asking two 10000 MiB picks is placed on an
    A100-40GB in MIG mode under ``limits.nvidia.com/gpumem: limit_mib`` (None: refused). Each
    pick takes a 3g.20gb instance (19968 MiB); HAMi checks the request (20000) only."""
    from hami.core import NodeDevices, schedule_pod

    from ._corekit import CONFIG, ctr, mig_gpu, pod

    led = Ledger(CONFIG.vendors)
    led.set_node(NodeDevices("m", (mig_gpu("m", 0),)))
    led.set_quota("a", "q", {"limits.nvidia.com/gpumem": str(limit_mib)}, CONFIG.vendors)
    r = schedule_pod(pod("x", [ctr("c", gpu=2, mem=10000, cores=10)], ns="a"), None, led, CONFIG, 0)
    return None if r.node is None else led.namespace_usage("a", "NVIDIA")[0]


QUOTAS = {
    "quotas": [
        Case(
            "whole limits of the memory and cores resources",
            _quota,
            {"limits.nvidia.com/gpumem": "20000", "limits.nvidia.com/gpucores": "150", "limits.cpu": "4"},
            {"nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 150},
        ),
        Case(
            "a quantity with a suffix is read as Kubernetes reads it",
            _quota,
            {"limits.nvidia.com/gpumem": "20k"},
            {"nvidia.com/gpumem": 20000},
        ),
        Case(
            "a fractional limit counts as its whole part",
            _quota,
            {"limits.nvidia.com/gpumem": "7.5", "limits.nvidia.com/gpucores": "1500m"},
            {"nvidia.com/gpumem": 7, "nvidia.com/gpucores": 1},
            hami={},
            doc="quota-fraction",
        ),
        Case(
            "a MIG placement is checked with the profile's memory, which the namespace is charged",
            _mig_quota,
            20000,
            None,
            hami=39936,
            doc="mig-quota",
        ),
    ]
}


def _held_after_init(restart_policy: str) -> int:
    """MiB a bound pod holds on its GPU once its 8000 MiB init container finished (exit 0), its
    app container asking 1000, under ``restart_policy``."""
    from hami.core.ledger import allocation_from_pod

    pod = {
        "metadata": {
            "name": "p",
            "namespace": "team",
            "uid": "u1",
            "annotations": {
                "hami.io/vgpu-node": "n",
                "hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,8000,10:;GPU-1,NVIDIA,1000,10:;",
            },
        },
        "spec": {
            "nodeName": "n",
            "restartPolicy": restart_policy,
            "initContainers": [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {
            "phase": "Running",
            "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
        },
    }
    alloc = allocation_from_pod(pod, build_vendors())
    assert alloc is not None
    return alloc.usage[0].mem


ACCOUNTING = {
    "accounting": [
        Case(
            "a finished init container of a pod that may run it again keeps its grant",
            _held_after_init,
            "Always",
            8000,
            hami=1000,
            doc="init-rerun",
        ),
        Case("a finished init container that cannot run again gives it back", _held_after_init, "Never", 1000),
    ]
}


ALL = {**DECODERS, **ENCODERS, **DECISIONS, **QUOTAS, **ACCOUNTING}
CODEC_GROUPS = (*DECODERS, *ENCODERS)
DECISION_GROUPS = (*DECISIONS, *QUOTAS, *ACCOUNTING)


def counts(groups: tuple[str, ...]) -> tuple[int, int, int]:
    """``(checked, agreeing, documented-different)`` over the named groups."""
    cases = [c for g in groups for c in ALL[g]]
    return len(cases), sum(c.agrees for c in cases), sum(bool(c.doc) for c in cases if not c.agrees)
