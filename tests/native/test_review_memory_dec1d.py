"""libvgpu's memory ledger, review of 1 Dec (memory hooks): mipmapped arrays asked for 0 levels,
records of destroyed objects cleaned up after the driver had already given their handle to
another thread, devices whose UUID the driver cannot give through cuDeviceGetUuid_v2, and CUDA
array sizes (layered / cubemap mipmaps, formats that set their own channels, block-compressed and
YUV formats). On the fake GPU; the interleavings are fixed by the fake's handle reuse and paused
destroy (docs/fakegpu.md), not by timing."""

from __future__ import annotations

import ast

import pytest

from .conftest import run_py

pytestmark = pytest.mark.native

MiB = 1 << 20

PRELUDE = """
import ctypes as C, os, threading, time, cuda_probe as c, pynvml as n
from region_layout import read_region
cu = c.cu
MiB = 1 << 20
def ledger_b(dev=0):  # the container's ledger, bytes
    r = read_region(os.environ["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    return sum(s["used"][dev]["total"] for s in r["slots"] if s["pid"])
n.nvmlInit(); nvh = n.nvmlDeviceGetHandleByIndex(0)
def held_b():  # what the (fake) driver says this process holds, bytes: libvgpu does not touch it
    return sum(p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(nvh))
def ledger(): return ledger_b() >> 20
def held(): return held_b() >> 20
class Desc3(C.Structure):  # CUDA_ARRAY3D_DESCRIPTOR (v2)
    _fields_ = [("w", C.c_size_t), ("h", C.c_size_t), ("d", C.c_size_t), ("fmt", C.c_int), ("ch", C.c_uint),
                ("flags", C.c_uint)]
FLOAT, LAYERED, CUBEMAP = 0x20, 1, 4
def array(w, h=0, d=0, fmt=FLOAT, ch=4, flags=0):
    a = C.c_void_p(); return cu.cuArray3DCreate_v2(C.byref(a), C.byref(Desc3(w, h, d, fmt, ch, flags))), a
def mipmap(w, h=0, d=0, levels=1, fmt=FLOAT, ch=4, flags=0):
    m = C.c_void_p()
    return cu.cuMipmappedArrayCreate(C.byref(m), C.byref(Desc3(w, h, d, fmt, ch, flags)), C.c_uint(levels)), m
class Loc(C.Structure): _fields_ = [("type", C.c_int), ("id", C.c_int)]
class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("htypes", C.c_int), ("loc", Loc), ("win", C.c_void_p), ("flags", C.c_uint64)]
def vmm_create(mib):
    h = C.c_uint64()
    rc = cu.cuMemCreate(C.byref(h), C.c_size_t(mib * MiB), C.byref(Prop(1, 0, Loc(1, 0), None, 0)), C.c_ulonglong(0))
    return rc, h.value
def map_at(h, mib):
    va = C.c_uint64()
    c.check(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(mib * MiB), C.c_size_t(0), C.c_uint64(0), C.c_ulonglong(0)))
    c.check(cu.cuMemMap(va, C.c_size_t(mib * MiB), C.c_size_t(0), C.c_uint64(h), C.c_ulonglong(0)), "map")
    return va.value
class PoolProps(C.Structure):
    _fields_ = [("atype", C.c_int), ("htypes", C.c_int), ("loc", Loc), ("win", C.c_void_p),
                ("maxsize", C.c_size_t), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 54)]
def mkpool():
    p = C.c_void_p(); c.check(cu.cuMemPoolCreate(C.byref(p), C.byref(PoolProps(1, 0, Loc(1, 0), None, 0, 0)))); return p
class AllocParams(C.Structure):
    _fields_ = [("props", PoolProps), ("access", C.c_void_p), ("naccess", C.c_size_t),
                ("bytesize", C.c_size_t), ("dptr", C.c_uint64)]
def graph_of(mib):  # a graph that allocates `mib` and frees it
    g, a, f = C.c_void_p(), C.c_void_p(), C.c_void_p()
    c.check(cu.cuGraphCreate(C.byref(g), 0))
    p = AllocParams(PoolProps(1, 0, Loc(1, 0)), None, 0, mib * MiB, 0)
    c.check(cu.cuGraphAddMemAllocNode(C.byref(a), g, None, 0, C.byref(p)), "alloc node")
    c.check(cu.cuGraphAddMemFreeNode(C.byref(f), g, (C.c_void_p * 1)(a), 1, C.c_uint64(p.dptr)), "free node")
    x = C.c_void_p(); c.check(cu.cuGraphInstantiateWithFlags(C.byref(x), g, C.c_ulonglong(0)), "instantiate")
    return x
def destroy_paused(fn, *args):
    # `fn(*args)` on a thread of its own; returns once the fake has freed the object and holds the
    # call before it returns to libvgpu (fakegpu_pause_next_free); resume() lets it return
    done = []
    cu.fakegpu_pause_next_free()
    t = threading.Thread(target=lambda: done.append(fn(*args)))
    t.start()
    while cu.fakegpu_paused_frees() == 0 and t.is_alive():
        time.sleep(0.001)
    def resume():
        cu.fakegpu_resume_free(); t.join(); return done[0]
    return resume
"""


def _probe(env, code: str) -> list:
    out = run_py(PRELUDE + code, env).stdout.strip().splitlines()
    return ast.literal_eval(out[-1])


# ---- finding 1: cuMipmappedArrayCreate with numMipmapLevels = 0 ----


def test_a_mipmapped_array_asked_for_0_levels_is_charged_as_the_one_level_the_driver_makes(vgpu_env):
    """Found by review, 1 Dec: numMipmapLevels = 0 was estimated at 0 bytes and passed through
    uncharged, though the driver clamps it to 1 level: a 16384 x 16384 float4 mipmapped array (4 GiB)
    under a 1 GiB limit was refused with 1 level and made with 0, as often as asked. Now 0 counts as 1
    level (refused over the limit, charged within it), and a count beyond 1 + log2(largest extent)
    is clamped as the driver clamps it."""
    row = _probe(
        vgpu_env,
        """
c.init()
row = [[mipmap(16384, 16384, levels=lv)[0] for lv in (1, 0)], ledger()]
rc, m = mipmap(2048, 2048, levels=0)  # 64 MiB
row += [rc, ledger(), held()]
c.check(cu.cuMipmappedArrayDestroy(m))
rc, m = mipmap(1024, 1024, levels=1000)  # clamped to 11 levels
row += [rc, ledger(), held()]
print(row)
""",
    )
    eleven = sum((1024 >> lv) ** 2 * 16 for lv in range(11))
    charged = -(-eleven // (2 * MiB)) * 2  # MiB, rounded up to 2 MiB like any large allocation
    assert row == [[2, 2], 0, 0, 64, 64, 0, charged, charged]


# ---- finding 2: records cleaned up after the driver freed the handle ----


def _reuse_env(vgpu_env):
    vgpu_env["FAKEGPU_REUSE_HANDLES"] = "1"
    return vgpu_env


def test_cumemrelease_leaves_the_record_of_an_allocation_given_the_freed_handle_alone(vgpu_env):
    """Found by review, 1 Dec: cuMemRelease dropped libvgpu's reference after the driver had freed
    the allocation; a cuMemCreate on another thread meanwhile was given the same handle value, and
    the late drop deleted that allocation's record and released its 512 MiB: held, uncharged (the
    reviewer's run held 2944 MiB under a 1 GiB limit, the ledger said 960)."""
    row = _probe(
        _reuse_env(vgpu_env),
        """
c.init()
rc1, h1 = vmm_create(64)
resume = destroy_paused(cu.cuMemRelease, C.c_uint64(h1))
rc2, h2 = vmm_create(512)
row = [rc1, rc2, h2 == h1, resume(), ledger(), held(), vmm_create(600)[0]]
print(row)
""",
    )
    assert row == [0, 0, True, 0, 512, 512, 2]


def test_cumemunmap_of_a_released_allocation_leaves_the_next_owner_of_its_handle_alone(vgpu_env):
    """Found by review, 1 Dec (the same race through cuMemUnmap): a released allocation still
    mapped is freed by its unmap; its reference was dropped after the driver call, when the handle
    could already be another cuMemCreate's."""
    row = _probe(
        _reuse_env(vgpu_env),
        """
c.init()
rc1, h1 = vmm_create(64)
va = map_at(h1, 64)
c.check(cu.cuMemRelease(C.c_uint64(h1)), "release")  # the mapping keeps it
resume = destroy_paused(cu.cuMemUnmap, C.c_uint64(va), C.c_size_t(64 * MiB))
rc2, h2 = vmm_create(512)
row = [rc1, rc2, h2 == h1, resume(), ledger(), held(), vmm_create(600)[0]]
print(row)
""",
    )
    assert row == [0, 0, True, 0, 512, 512, 2]


@pytest.mark.parametrize("kind", ["array", "mipmap"])
def test_an_array_destroy_leaves_the_record_of_the_array_given_the_freed_handle_alone(vgpu_env, kind):
    """Found by review, 1 Dec: cuArrayDestroy / cuMipmappedArrayDestroy untracked the handle after
    the driver freed it; an array made meanwhile on another thread with the same handle lost its
    record and its 512 MiB charge."""
    destroy = "cuArrayDestroy" if kind == "array" else "cuMipmappedArrayDestroy"
    row = _probe(
        _reuse_env(vgpu_env),
        f"""
c.init()
make = array if "{kind}" == "array" else mipmap
rc1, a1 = make(2048, 2048)          # 64 MiB
resume = destroy_paused(cu.{destroy}, a1)
rc2, a2 = make(8192, 4096)          # 512 MiB
row = [rc1, rc2, a2.value == a1.value, resume(), ledger(), held(), make(8192, 4800)[0]]
print(row)
""",
    )
    assert row == [0, 0, True, 0, 512, 512, 2]


def test_cuctxdestroy_leaves_the_allocations_of_the_context_given_the_freed_handle_alone(vgpu_env):
    """Found by review, 1 Dec: cuCtxDestroy dropped every allocation bound to the context after
    the driver destroyed it; a context created meanwhile on another thread got the same handle, and
    its 512 MiB allocation was dropped from the ledger with the old context's."""
    row = _probe(
        _reuse_env(vgpu_env),
        """
c.init()
ctx1 = C.c_void_p(); c.check(cu.cuCtxCreate_v2(C.byref(ctx1), 0, 0), "create")
rc, small = c.alloc(64 * MiB)
resume = destroy_paused(cu.cuCtxDestroy_v2, ctx1)
ctx2 = C.c_void_p(); c.check(cu.cuCtxCreate_v2(C.byref(ctx2), 0, 0), "create again")
rc2, big = c.alloc(512 * MiB)
row = [rc, rc2, ctx2.value == ctx1.value, resume(), ledger(), held(), c.alloc(600 * MiB)[0]]
print(row)
""",
    )
    assert row == [0, 0, True, 0, 512, 512, 2]


def test_cumempooldestroy_leaves_the_cache_charge_of_the_pool_given_the_freed_handle_alone(vgpu_env):
    """Found by review, 1 Dec: cuMemPoolDestroy deleted the pool's entry (and released its cache
    charge) after the driver destroyed it; a pool created meanwhile with the same handle, keeping
    512 MiB cached under a high release threshold, had that charge released: held, uncharged."""
    row = _probe(
        _reuse_env(vgpu_env),
        """
c.init()
p1 = mkpool()
resume = destroy_paused(cu.cuMemPoolDestroy, p1)
p2 = mkpool()
c.check(cu.cuMemPoolSetAttribute(p2, 4, C.byref(C.c_uint64(1 << 30))), "threshold")  # RELEASE_THRESHOLD
d = C.c_uint64()
c.check(cu.cuMemAllocFromPoolAsync(C.byref(d), C.c_size_t(512 * MiB), p2, None), "alloc")
c.check(cu.cuMemFreeAsync(d, None), "free")  # into the pool's cache: still the process's
row = [p2.value == p1.value, resume(), ledger(), held(), c.alloc(600 * MiB)[0]]
print(row)
""",
    )
    assert row == [True, 0, 512, 512, 2]


def test_cugraphexecdestroy_leaves_the_record_of_the_graph_given_the_freed_handle_alone(vgpu_env):
    """Found by review, 1 Dec: cuGraphExecDestroy forgot the executable graph after the driver
    destroyed it; a graph instantiated meanwhile with the same handle was forgotten instead, so its
    launch mapped 512 MiB of graph memory unchecked and uncharged."""
    row = _probe(
        _reuse_env(vgpu_env),
        """
c.init()
x1 = graph_of(64)
resume = destroy_paused(cu.cuGraphExecDestroy, x1)
x2 = graph_of(512)
row = [x2.value == x1.value, resume(), cu.cuGraphLaunch(x2, None), ledger(), held(), c.alloc(600 * MiB)[0]]
print(row)
""",
    )
    assert row == [True, 0, 0, 512, 512, 2]


def test_a_destroy_the_driver_refuses_keeps_what_it_took_out(vgpu_env):
    """The records now taken out before the driver call go back when the call fails: a refused
    cuCtxDestroy of the primary context keeps its 512 MiB allocation charged (freed later, it is
    given back), a refused cuMemPoolDestroy of the default pool keeps its 256 MiB cache charged (a
    trim gives it back)."""
    row = _probe(
        vgpu_env,
        """
ctx = c.init()
rc, big = c.alloc(512 * MiB)
row = [rc, cu.cuCtxDestroy_v2(ctx) != 0, ledger(), c.free(big), ledger()]
pool = C.c_void_p(); c.check(cu.cuDeviceGetDefaultMemPool(C.byref(pool), 0))
c.check(cu.cuMemPoolSetAttribute(pool, 4, C.byref(C.c_uint64(1 << 30))), "threshold")
d = C.c_uint64()
c.check(cu.cuMemAllocAsync(C.byref(d), C.c_size_t(256 * MiB), None), "alloc")
c.check(cu.cuMemFreeAsync(d, None), "free")
row += [ledger(), cu.cuMemPoolDestroy(pool) != 0, ledger(), held()]
c.check(cu.cuMemPoolTrimTo(pool, C.c_size_t(0)), "trim")
row += [ledger(), held()]
print(row)
""",
    )
    assert row == [0, True, 512, 0, 0, 256, True, 256, 256, 0, 0]


# ---- finding 3: devices whose UUID cuDeviceGetUuid_v2 cannot give ----


def test_a_driver_without_cudevicegetuuid_v2_still_gets_its_limit(vgpu_env):
    """Found by review, 1 Dec: on a driver older than CUDA 11.4 (no cuDeviceGetUuid_v2) every device
    mapped to no region device: nothing was limited, cuMemGetInfo showed the physical size and the
    grant was never checked. The UUID now comes from cuDeviceGetUuid there."""
    vgpu_env["FAKEGPU_UUID_API"] = "v1"
    row = _probe(
        vgpu_env,
        """
libc = C.CDLL("libc.so.6")  # its own dlsym (ctypes' attribute lookup cannot take a NULL symbol)
libc.dlsym.restype, libc.dlsym.argtypes = C.c_void_p, [C.c_void_p, C.c_char_p]
v2 = libc.dlsym(cu._handle, b"cuDeviceGetUuid_v2")
c.init()
fn, st = C.c_void_p(), C.c_int()
c.check(cu.cuGetProcAddress_v2(b"cuDeviceGetUuid", C.byref(fn), 12080, C.c_uint64(0), C.byref(st)), "gpa")
v1 = fn.value == libc.dlsym(cu._handle, b"cuDeviceGetUuid")  # the v1, at a version that would give the v2
f, t = c.mem_info()
print([v2, v1, t >> 20, c.alloc(600 * MiB)[0], c.alloc(600 * MiB)[0], ledger()])
""",
    )
    assert row == [None, True, 1024, 0, 2, 600]


def test_a_device_whose_uuid_cannot_be_read_is_refused_not_unlimited(vgpu_env):
    """Found by review, 1 Dec: a device whose UUID could not be read was skipped silently and ran
    unlimited. It now fails closed: an error naming the device, and CUDA reports no device."""
    vgpu_env["FAKEGPU_UUID_API"] = "none"
    p = run_py(
        """
import ctypes as C
cu = C.CDLL("libcuda.so.1")
ctx = C.c_void_p()
print(cu.cuInit(0), cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0))
""",
        vgpu_env,
    )
    assert p.stdout.split() == ["100", "100"]  # CUDA_ERROR_NO_DEVICE
    assert "the UUID of CUDA device 0 cannot be read (cuDeviceGetUuid returned 801)" in p.stderr


# ---- finding 4: array sizes ----


def _round(b: int) -> int:
    """Bytes charged for an allocation of b bytes (2 MiB steps from 2 MiB on, 512 B below)."""
    return -(-b // (2 * MiB)) * 2 * MiB if b >= 2 * MiB else -(-b // 512) * 512


def test_layered_and_cubemap_mipmaps_keep_every_layer_at_every_level(vgpu_env):
    """Found by review, 1 Dec: a layered or cubemap mipmapped array's Depth (its layer or face
    count) was halved per level like a 3D array's depth: 14-33 % under-charged (libvgpu and the fake
    alike). A 3D mipmapped array still halves its depth."""
    row = _probe(
        vgpu_env,
        """
c.init()
row = []
for args in [dict(w=1024, h=1024, d=6, levels=3, flags=CUBEMAP), dict(w=1024, h=1024, d=4, levels=2, flags=LAYERED),
             dict(w=4096, d=16, levels=3, flags=LAYERED), dict(w=256, h=256, d=256, levels=2, ch=1)]:
    before = (ledger_b(), held_b())
    rc, m = mipmap(**args)
    row.append([rc, ledger_b() - before[0], held_b() - before[1]])
print(row)
""",
    )
    cube = 6 * sum((1024 >> lv) ** 2 * 16 for lv in range(3))
    layered = 4 * sum((1024 >> lv) ** 2 * 16 for lv in range(2))
    layered_1d = 16 * sum((4096 >> lv) * 16 for lv in range(3))
    volume = sum((256 >> lv) ** 3 * 4 for lv in range(2))
    assert row == [[0, _round(b), _round(b)] for b in (cube, layered, layered_1d, volume)]


FORMATS = {  # CUarray_format value: bytes of a w x h plane (texels; BC in 4 x 4 blocks)
    "UNORM_INT8X4": (0xC2, lambda w, h: w * h * 4),
    "SNORM_INT16X2": (0xCA, lambda w, h: w * h * 4),
    "UNORM_INT16X4": (0xC5, lambda w, h: w * h * 8),
    "UNORM_INT_101010_2": (0x50, lambda w, h: w * h * 4),
    "BC1_UNORM": (0x91, lambda w, h: -(-w // 4) * -(-h // 4) * 8),
    "BC4_SNORM": (0x98, lambda w, h: -(-w // 4) * -(-h // 4) * 8),
    "BC7_UNORM": (0x9D, lambda w, h: -(-w // 4) * -(-h // 4) * 16),
    "NV12": (0xB0, lambda w, h: w * h + 2 * -(-w // 2) * -(-h // 2)),
    "P010": (0x9F, lambda w, h: 2 * (w * h + 2 * -(-w // 2) * -(-h // 2))),
    "NV16": (0xA2, lambda w, h: w * h + 2 * -(-w // 2) * h),
    "YUY2": (0xA5, lambda w, h: 4 * -(-w // 2) * h),
    "Y416": (0xB1, lambda w, h: w * h * 8),
    "Y444_PLANAR10": (0xB3, lambda w, h: w * h * 6),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_array_formats_are_charged_their_own_size(vgpu_env, name):
    """Found by review, 1 Dec: every format beyond the eight classic ones was charged 16 bytes per
    channel per texel (16x too much for UNORM_INT8X4, which a 1 GiB container then could not
    allocate 64 MiB of). Formats that set their channels, block-compressed and YUV formats are now
    charged what they take; the fake makes them with the same sizes."""
    fmt, size = FORMATS[name]
    row = _probe(
        vgpu_env,
        f"""
c.init()
row = []
for w, h in [(4096, 2048), (1026, 1030)]:
    before = (ledger_b(), held_b())
    rc, a = array(w, h, fmt={fmt}, ch=4)
    row.append([rc, ledger_b() - before[0], held_b() - before[1]])
print(row)
""",
    )
    assert row == [[0, _round(size(w, h)), _round(size(w, h))] for w, h in [(4096, 2048), (1026, 1030)]]


# ---- regression review of the above (1 Dec): a VMM reference dropped while the driver call ran ----

RACE = """
def on_thread(fn, *args):  # fn(*args) on a thread of its own; .result() joins and gives its return
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)))
    t.start()
    t.result = lambda: (t.join(), out[0])[1]
    return t
def call_paused(name, fn, *args):
    # fn(*args) on a thread of its own, held by the fake on entry to the driver's `name` (after
    # libvgpu's hook did its part before the call: fakegpu_pause_next_call); resume() lets it go on
    cu.fakegpu_pause_next_call(name.encode())
    t = on_thread(fn, *args)
    while cu.fakegpu_paused_frees() == 0 and t.is_alive():
        time.sleep(0.001)
    def resume():
        cu.fakegpu_resume_free(); return t.result()
    return resume
def reserve(mib):
    va = C.c_uint64()
    c.check(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(mib * MiB), C.c_size_t(0), C.c_uint64(0), C.c_ulonglong(0)))
    return va.value
def map_h(va, h, mib):
    c.check(cu.cuMemMap(C.c_uint64(va), C.c_size_t(mib * MiB), C.c_size_t(0), C.c_uint64(h), C.c_ulonglong(0)), "map")
def unmap(va, mib): return cu.cuMemUnmap(C.c_uint64(va), C.c_size_t(mib * MiB))
"""


def test_a_failing_cumemunmap_does_not_let_a_racing_cumemrelease_free_a_mapped_allocation(vgpu_env):
    """Found by the regression review, 1 Dec (scenario A): an allocation mapped once (two
    references); cuMemUnmap of a 128 MiB range starting at the unmapped half before the mapping
    (which the driver refuses, as a tenant can make it at will) took the mapping's reference before
    the driver call, and a cuMemRelease meanwhile on another thread saw the last reference, deleted
    the record and released the 64 MiB while the mapping held it (the reviewer's loop: ledger 0 with
    2560 MiB held under 1 GiB). The hooks now run as one from their record change to their settle:
    the release waits for the unmap, which puts its reference back."""
    row = _probe(
        vgpu_env,
        RACE
        + """
c.init()
rc, h = vmm_create(64)
va = reserve(128)
map_h(va + 64 * MiB, h, 64)
resume = call_paused("cuMemUnmap", unmap, va, 128)  # no mapping at va: the driver refuses it
other = on_thread(cu.cuMemRelease, C.c_uint64(h))
other.join(1.0)  # room for the release to run into the unmap in the driver (it waits for it now)
row = [rc, resume() != 0, other.result(), ledger(), held(), vmm_create(1000)[0]]
row += [unmap(va + 64 * MiB, 64), ledger(), held()]
print(row)
""",
    )
    assert row == [0, True, 0, 64, 64, 2, 0, 0, 0]


def test_a_retain_during_a_failing_cumemunmap_keeps_its_reference(vgpu_env):
    """Found by the regression review, 1 Dec (scenario B): a released allocation its mapping keeps
    (one reference); a refused cuMemUnmap took that reference and the record out, a
    cuMemRetainAllocationHandle meanwhile found no record to count on, the failed unmap put back a
    count of 1, and the retained handle's cuMemRelease then released the 64 MiB the mapping still
    held. The retain now waits for the unmap's settle, so the count is exact."""
    row = _probe(
        vgpu_env,
        RACE
        + """
c.init()
rc, h = vmm_create(64)
va = reserve(128)
map_h(va + 64 * MiB, h, 64)
c.check(cu.cuMemRelease(C.c_uint64(h)), "release")  # the mapping keeps it
resume = call_paused("cuMemUnmap", unmap, va, 128)  # refused, as above
h2 = C.c_uint64()
other = on_thread(cu.cuMemRetainAllocationHandle, C.byref(h2), C.c_void_p(va + 64 * MiB))
other.join(1.0)  # room for the retain to run while the unmap is in the driver (it waits for it now)
row = [rc, resume() != 0, other.result(), h2.value == h, cu.cuMemRelease(h2), ledger(), held(), vmm_create(1000)[0]]
row += [unmap(va + 64 * MiB, 64), ledger(), held()]
print(row)
""",
    )
    assert row == [0, True, 0, True, 0, 64, 64, 2, 0, 0, 0]


def test_a_pool_lookup_during_its_destroy_does_not_keep_the_destroyed_pool_current(vgpu_env):
    """Found by the regression review, 1 Dec (low): cuMemPoolDestroy forgot the device's current
    pool before the driver call; a cuMemAllocAsync meanwhile asked the driver, was answered the pool
    being destroyed and kept it as current for good. Later cuMemAllocAsync calls, served by the
    default pool (1 GiB release threshold), were counted against the destroyed one, whose cache
    nobody settles: 512 MiB kept by the default pool, uncharged. The destroy now forgets it again
    once the driver destroyed it."""
    row = _probe(
        vgpu_env,
        RACE
        + """
c.init()
dflt = C.c_void_p(); c.check(cu.cuDeviceGetDefaultMemPool(C.byref(dflt), 0))
c.check(cu.cuMemPoolSetAttribute(dflt, 4, C.byref(C.c_uint64(1 << 30))), "threshold")  # RELEASE_THRESHOLD
p = mkpool()
c.check(cu.cuDeviceSetMemPool(0, p), "set pool")
resume = call_paused("cuMemPoolDestroy", cu.cuMemPoolDestroy, p)
d = C.c_uint64()
c.check(cu.cuMemAllocAsync(C.byref(d), C.c_size_t(2 * MiB), None), "alloc")  # p is still current
c.check(cu.cuMemFreeAsync(d, None), "free")
row = [resume()]
c.check(cu.cuMemAllocAsync(C.byref(d), C.c_size_t(512 * MiB), None), "alloc 2")  # the default pool's
c.check(cu.cuMemFreeAsync(d, None), "free 2")  # kept by the default pool: still the process's
row += [ledger(), held(), c.alloc(600 * MiB)[0]]
print(row)
""",
    )
    assert row == [0, 512, 512, 2]


def test_a_mapping_of_a_guessed_handle_made_before_cumemcreate_recorded_it_is_counted(vgpu_env):
    """Found while fixing the review of 1 Dec: cuMemCreate recorded its handle only after the driver
    returned it, and a thread that had the handle before the record (then read from the caller's
    variable as the driver wrote it; now only by guessing the value, here the value the fake gives
    again) mapped it first: the map found no record and counted no reference, so the allocation's
    one cuMemRelease then released its 64 MiB while the mapping still held them. A map of a handle
    with no record waits for the creates in flight when it looked; the tenant's variable is not
    written before the record is in."""
    row = _probe(
        _reuse_env(vgpu_env),
        RACE
        + """
c.init()
rc, g = vmm_create(2)
c.check(cu.cuMemRelease(C.c_uint64(g)), "release")  # the fake gives g's value to the next create
h = C.c_uint64()
prop = Prop(1, 0, Loc(1, 0), None, 0)
resume = call_paused("cuMemCreate", cu.cuMemCreate, C.byref(h), C.c_size_t(64 * MiB), C.byref(prop), C.c_ulonglong(0))
unseen = h.value == 0  # the driver answered into libvgpu's own variable
va = reserve(64)
other = on_thread(cu.cuMemMap, C.c_uint64(va), C.c_size_t(64 * MiB), C.c_size_t(0), C.c_uint64(g),
                  C.c_ulonglong(0))
other.join(1.0)  # room for the map to run while the create is in the driver (it waits for the record)
row = [rc, unseen, resume(), h.value == g, other.result(), cu.cuMemRelease(h), ledger(), held(), vmm_create(1000)[0]]
row += [unmap(va, 64), ledger(), held()]
print(row)
""",
    )
    assert row == [0, True, 0, True, 0, 0, 64, 64, 2, 0, 0, 0]


def test_cumemcreate_records_the_handle_the_driver_made_not_what_the_callers_variable_holds(vgpu_env):
    """Found by review: cuMemCreate recorded `*handle` read back from the caller's variable after
    the driver call; a second thread of the tenant that wrote another handle's value there in
    between had the charge recorded under that handle (a 2 MiB allocation's record became 512 MiB)
    and the new allocation uncounted: releasing the 2 MiB one then freed 512 MiB of charge, and
    512 MiB stayed held with the ledger at 0 (past the limit, retryable). The driver now answers
    into libvgpu's own variable, copied to the caller's once recorded."""
    row = _probe(
        vgpu_env,
        RACE
        + """
c.init()
rc, small = vmm_create(2)
h = C.c_uint64()
prop = Prop(1, 0, Loc(1, 0), None, 0)
resume = call_paused("cuMemCreate", cu.cuMemCreate, C.byref(h), C.c_size_t(512 * MiB), C.byref(prop), C.c_ulonglong(0))
h.value = small  # the tenant's other thread, between the driver's answer and the hook's record
row = [rc, resume(), h.value not in (0, small), ledger(), held()]
row += [cu.cuMemRelease(C.c_uint64(small)), ledger(), held(), vmm_create(600)[0]]
row += [cu.cuMemRelease(h), ledger(), held()]
print(row)
""",
    )
    assert row == [0, 0, True, 514, 514, 0, 512, 512, 2, 0, 0, 0]


@pytest.mark.parametrize(
    "fn",
    [
        "cuMemAlloc_v2",
        "cuMemAllocManaged",
        "cuMemAllocPitch_v2",
        "cuArray3DCreate_v2",
        "cuMemAllocAsync",
        "cuMemRetainAllocationHandle",
    ],
)
def test_the_hooks_hand_the_caller_what_the_driver_answered(vgpu_env, fn):
    """With the driver answering into libvgpu's own variables, what the caller gets is still the
    driver's answer (recorded under it: freeing it gives the charge back)."""
    row = _probe(
        vgpu_env,
        RACE
        + f"""
c.init()
fn = {fn!r}
d, pitch = C.c_uint64(), C.c_size_t()
if fn == "cuMemAlloc_v2":
    rc = cu.cuMemAlloc_v2(C.byref(d), C.c_size_t(64 * MiB)); free = lambda: cu.cuMemFree_v2(d)
elif fn == "cuMemAllocManaged":
    rc = cu.cuMemAllocManaged(C.byref(d), C.c_size_t(64 * MiB), 1); free = lambda: cu.cuMemFree_v2(d)
elif fn == "cuMemAllocPitch_v2":
    rc = cu.cuMemAllocPitch_v2(C.byref(d), C.byref(pitch), C.c_size_t(8192), C.c_size_t(8192), 4)
    free = lambda: cu.cuMemFree_v2(d)
    rc = rc or (pitch.value < 8192)
elif fn == "cuArray3DCreate_v2":
    rc, d = array(4096, 4096); free = lambda: cu.cuArrayDestroy(d)
elif fn == "cuMemAllocAsync":
    rc = cu.cuMemAllocAsync(C.byref(d), C.c_size_t(64 * MiB), None)
    free = lambda: (cu.cuMemFreeAsync(d, None), cu.cuCtxSynchronize(), cu.cuDeviceGetDefaultMemPool(C.byref(C.c_void_p()), 0))[0]
else:
    rc, g = vmm_create(64); va = reserve(64); map_h(va, g, 64); c.check(cu.cuMemRelease(C.c_uint64(g)), "release")
    h = C.c_uint64(); rc = cu.cuMemRetainAllocationHandle(C.byref(h), C.c_void_p(va)) or (h.value != g)
    free = lambda: cu.cuMemRelease(h) or unmap(va, 64)
on = ledger() > 0
row = [rc, on, free(), ledger() if fn != "cuMemAllocAsync" else 0]
print(row)
""",
    )
    assert row == [0, True, 0, 0]


# ---- the rest of the read-backs (after the review of 1 Dec): what a hook judged is what the driver made ----


def test_an_array_descriptor_grown_while_the_driver_reads_it_is_charged_as_made(vgpu_env):
    """cuArray3DCreate_v2 estimated the charge from the caller's descriptor, then handed the driver
    the same memory to read again: a second thread of the tenant that grew it in between (1 x 1 to
    8192 x 8192 float4) made a 1 GiB array charged 2 MiB, past a 1 GiB limit. The hook reads the
    descriptor once and gives the driver its own copy."""
    row = _probe(
        vgpu_env,
        RACE
        + """
c.init()
a, ctx = C.c_void_p(), C.c_void_p()
c.check(cu.cuCtxGetCurrent(C.byref(ctx)), "current")
d = Desc3(1, 1, 0, FLOAT, 4, 0)
make = lambda: cu.cuCtxSetCurrent(ctx) or cu.cuArray3DCreate_v2(C.byref(a), C.byref(d))  # on its own thread
resume = call_paused("cuArray3DCreate_v2", make)
d.w, d.h = 8192, 8192
row = [resume(), ledger() == held(), held() < 64, c.alloc(1000 * MiB)[0]]
print(row)
""",
    )
    assert row == [0, True, True, 0]


def test_a_vmm_location_turned_to_the_device_while_the_driver_reads_it_is_charged(vgpu_env):
    """cuMemCreate judged the location from the caller's properties (a host location is not the
    container's device memory: passed through uncharged), then the driver read them again: turned to
    the device in between, a 512 MiB device allocation went uncharged. Judged and made from one
    copy, the driver gets the host location it was judged on (the fake refuses it)."""
    row = _probe(
        vgpu_env,
        RACE
        + """
c.init()
h = C.c_uint64()
prop = Prop(1, 0, Loc(2, 0), None, 0)  # CU_MEM_LOCATION_TYPE_HOST
resume = call_paused("cuMemCreate:entry", cu.cuMemCreate, C.byref(h), C.c_size_t(512 * MiB), C.byref(prop),
                     C.c_ulonglong(0))
prop.loc.type = 1  # DEVICE, as the driver reads it
row = [resume() != 0, ledger() == held(), c.alloc(600 * MiB)[0]]
print(row)
""",
    )
    assert row == [True, True, 0]


def test_cugraphinstantiate_remembers_the_graph_the_driver_made_not_what_the_callers_variable_holds(vgpu_env):
    """The instantiate hooks remembered the allocation nodes of `*exec` read back from the caller's
    variable: a second thread that wrote another executable graph there between the driver's answer
    and the read had the 512 MiB footprint remembered under that graph, and the real one launched
    mapping 512 MiB unchecked and uncharged."""
    row = _probe(
        vgpu_env,
        RACE
        + """
c.init()
x1 = graph_of(2)
g, a, f = C.c_void_p(), C.c_void_p(), C.c_void_p()
c.check(cu.cuGraphCreate(C.byref(g), 0))
p = AllocParams(PoolProps(1, 0, Loc(1, 0)), None, 0, 512 * MiB, 0)
c.check(cu.cuGraphAddMemAllocNode(C.byref(a), g, None, 0, C.byref(p)), "alloc node")
c.check(cu.cuGraphAddMemFreeNode(C.byref(f), g, (C.c_void_p * 1)(a), 1, C.c_uint64(p.dptr)), "free node")
x2 = C.c_void_p()
resume = call_paused("cuGraphInstantiate", cu.cuGraphInstantiateWithFlags, C.byref(x2), g, C.c_ulonglong(0))
seen = x2.value  # what the tenant's other thread can read of the driver's answer (nothing, now)
x2.value = x1.value  # and what it writes there then
row = [resume(), not seen, x2.value != x1.value]
made = seen or x2.value  # the graph the driver made
row += [cu.cuGraphLaunch(C.c_void_p(made), None), ledger() == held(), c.alloc(600 * MiB)[0]]
print(row)
""",
    )
    assert row == [0, True, True, 0, True, 2]


def test_cuctxcreate_records_the_context_the_driver_made_not_what_the_callers_variable_holds(vgpu_env, tmp_path):
    """cuCtxCreate recorded its footprint under `*pctx` read back from the caller's variable: a
    second thread that wrote an older context's handle there had the new context's charge recorded
    over the old one's and the new context unrecorded, so destroying both gave one footprint back
    and the other stayed charged for the life of the process."""
    cfg = tmp_path / "gpus.conf"
    cfg.write_text("context_mem=64Mi\ndevice name=Tesla T4,memory=16GB,sms=40\n")
    row = _probe(
        {**vgpu_env, "FAKEGPU_CONFIG": str(cfg)},
        RACE
        + """
c.init()
base = ledger_b()
c1, c2 = C.c_void_p(), C.c_void_p()
c.check(cu.cuCtxCreate_v2(C.byref(c1), 0, 0), "ctx")
one = ledger_b() - base
resume = call_paused("cuCtxCreate", cu.cuCtxCreate_v2, C.byref(c2), 0, 0)
seen = c2.value  # what the tenant's other thread can read of the driver's answer (nothing, now)
c2.value = c1.value  # and what it writes there then
row = [resume(), not seen, c2.value != c1.value, one > 0, ledger_b() - base == 2 * one]
made = seen or c2.value  # the context the driver made
row += [cu.cuCtxDestroy_v2(C.c_void_p(made)), cu.cuCtxDestroy_v2(c1), ledger_b() == base]
print(row)
""",
    )
    assert row == [0, True, True, True, True, 0, 0, True]
