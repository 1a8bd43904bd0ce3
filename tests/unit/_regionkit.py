"""Region files built with ctypes from the documented C structs (hami-core §4.2, control-plane §9.3).

The structs are declared here independently of ``hami.monitor.region``'s offset tables, so a
wrong offset there fails the tests instead of being copied into them.
"""

from __future__ import annotations

import ctypes as C
from dataclasses import dataclass, field

MAGIC = 19920718


class DevMemV1(C.Structure):
    _fields_ = [
        ("context_size", C.c_uint64),
        ("module_size", C.c_uint64),
        ("data_size", C.c_uint64),
        ("offset", C.c_uint64),
        ("total", C.c_uint64),
        ("unused", C.c_uint64 * 3),
    ]


class DevUtilV1(C.Structure):
    _fields_ = [("dec_util", C.c_uint64), ("enc_util", C.c_uint64), ("sm_util", C.c_uint64), ("unused", C.c_uint64 * 3)]


class SlotV1(C.Structure):
    _fields_ = [
        ("pid", C.c_int32),
        ("hostpid", C.c_int32),
        ("used", DevMemV1 * 16),
        ("monitorused", C.c_uint64 * 16),
        ("device_util", DevUtilV1 * 16),
        ("status", C.c_int32),
        ("seqlock", C.c_uint64),
        ("unused", C.c_uint64 * 2),
    ]


class RegionV1(C.Structure):
    _fields_ = [
        ("initialized_flag", C.c_int32),
        ("major_version", C.c_int32),
        ("minor_version", C.c_int32),
        ("sm_init_flag", C.c_int32),
        ("owner_pid", C.c_uint64),
        ("sem", C.c_ubyte * 32),
        ("device_num", C.c_uint64),
        ("uuids", (C.c_char * 96) * 16),
        ("limit", C.c_uint64 * 16),
        ("sm_limit", C.c_uint64 * 16),
        ("procs", SlotV1 * 1024),
        ("proc_num", C.c_int32),
        ("utilization_switch", C.c_int32),
        ("recent_kernel", C.c_int32),
        ("priority", C.c_int32),
        ("last_kernel_time", C.c_int64),
        ("unused", C.c_uint64 * 4),
    ]


class DevMemV0(C.Structure):
    _fields_ = [
        ("context_size", C.c_uint64),
        ("module_size", C.c_uint64),
        ("data_size", C.c_uint64),
        ("offset", C.c_uint64),
        ("total", C.c_uint64),
    ]


class DevUtilV0(C.Structure):
    _fields_ = [("dec_util", C.c_uint64), ("enc_util", C.c_uint64), ("sm_util", C.c_uint64)]


class SlotV0(C.Structure):
    _fields_ = [
        ("pid", C.c_int32),
        ("hostpid", C.c_int32),
        ("used", DevMemV0 * 16),
        ("monitorused", C.c_uint64 * 16),
        ("device_util", DevUtilV0 * 16),
        ("status", C.c_int32),
    ]


class RegionV0(C.Structure):
    _fields_ = [
        ("initialized_flag", C.c_int32),
        ("sm_init_flag", C.c_int32),
        ("owner_pid", C.c_uint32),
        ("sem", C.c_ubyte * 32),
        ("device_num", C.c_uint64),
        ("uuids", (C.c_char * 96) * 16),
        ("limit", C.c_uint64 * 16),
        ("sm_limit", C.c_uint64 * 16),
        ("procs", SlotV0 * 1024),
        ("proc_num", C.c_int32),
        ("utilization_switch", C.c_int32),
        ("recent_kernel", C.c_int32),
        ("priority", C.c_int32),
    ]


assert C.sizeof(RegionV1) == 2008952 and C.sizeof(SlotV1) == 1960
assert C.sizeof(RegionV0) == 1197896 and C.sizeof(SlotV0) == 1168


@dataclass
class Proc:
    pid: int
    hostpid: int = 0
    status: int = 1
    # per device: (context, module, data, total)
    used: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    sm_util: dict[int, int] = field(default_factory=dict)


def build(
    uuids=("GPU-a",),
    limits=(1 << 30,),
    sm_limits=(50,),
    procs=(),
    *,
    version="v1",
    priority=1,
    recent_kernel=0,
    utilization_switch=1,
    last_kernel_time=0,
    proc_num=None,
    magic=MAGIC,
    major=1,
    device_num=None,
) -> bytes:
    r = (RegionV1 if version == "v1" else RegionV0)()
    r.initialized_flag = magic
    if version == "v1":
        r.major_version, r.minor_version, r.last_kernel_time = major, 2, last_kernel_time
    r.device_num = len(uuids) if device_num is None else device_num
    for i, u in enumerate(uuids):
        r.uuids[i].value = u.encode() if isinstance(u, str) else u
        r.limit[i] = limits[i] if i < len(limits) else 0
        r.sm_limit[i] = sm_limits[i] if i < len(sm_limits) else 0
    for i, p in enumerate(procs):
        s = r.procs[i]
        s.pid, s.hostpid, s.status = p.pid, p.hostpid, p.status
        for d, (ctx, mod, data, total) in p.used.items():
            s.used[d].context_size, s.used[d].module_size, s.used[d].data_size, s.used[d].total = ctx, mod, data, total
        for d, util in p.sm_util.items():
            s.device_util[d].sm_util = util
    r.proc_num = len(procs) if proc_num is None else proc_num
    r.utilization_switch, r.recent_kernel, r.priority = utilization_switch, recent_kernel, priority
    data = bytes(r)
    return data + b"\0" if version == "v1" else data  # the library's file is one byte longer than the struct


def write(path, **kwargs) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(build(**kwargs))
    return str(path)
