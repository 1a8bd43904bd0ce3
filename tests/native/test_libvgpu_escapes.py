"""libvgpu against the fake GPU: the ways a process could get past its memory limit or its
compute share through a path the ledger did not see or misread (review 6): sizes that wrap the
check, contexts created without a check, pool allocations charged to the wrong device, VMM
memory kept alive by a mapping after cuMemRelease, and the deprecated launch calls."""

from __future__ import annotations

import time

import pytest

from .conftest import run_py
from .region_layout import read_region

pytestmark = pytest.mark.native

MiB = 1 << 20

# Shared by the probes: the container's ledger per device (MiB, summed over live slots).
PRELUDE = """
import ctypes as C, os, cuda_probe as c
from region_layout import read_region
cu = c.cu
def ledger(dev=0):
    r = read_region(os.environ["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    return sum(s["used"][dev]["total"] for s in r["slots"] if s["pid"]) >> 20
class Loc(C.Structure): _fields_ = [("type", C.c_int), ("id", C.c_int)]
class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("htypes", C.c_int), ("loc", Loc), ("win", C.c_void_p), ("flags", C.c_uint64)]
def vmm_create(size, dev=0):
    h = C.c_uint64()
    rc = cu.cuMemCreate(C.byref(h), C.c_size_t(size), C.byref(Prop(1, 0, Loc(1, dev), None, 0)), C.c_ulonglong(0))
    return rc, h
def reserve(size):
    va = C.c_uint64()
    c.check(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(size), C.c_size_t(0), C.c_uint64(0), C.c_ulonglong(0)))
    return va
class PoolProps(C.Structure):
    _fields_ = [("atype", C.c_int), ("htypes", C.c_int), ("loc", Loc), ("win", C.c_void_p),
                ("maxsize", C.c_size_t), ("usage", C.c_ushort), ("reserved", C.c_ubyte * 54)]
THRESHOLD, RESERVED = 4, 5
def keep(pool, n):
    c.check(cu.cuMemPoolSetAttribute(pool, THRESHOLD, C.byref(C.c_uint64(n))))
def reserved(pool):
    v = C.c_uint64(); c.check(cu.cuMemPoolGetAttribute(pool, RESERVED, C.byref(v))); return v.value >> 20
def mkpool(dev=0):
    p = C.c_void_p()
    c.check(cu.cuMemPoolCreate(C.byref(p), C.byref(PoolProps(1, 0, Loc(1, dev), None, 0, 0))))
    return p
def from_pool(pool, mib):
    d = C.c_uint64()
    return cu.cuMemAllocFromPoolAsync(C.byref(d), C.c_size_t(mib << 20), pool, None), d
"""


def test_sizes_near_2_64_are_refused_and_never_zero_the_charge(vgpu_env):
    """A size whose rounding or whose sum with the usage wraps 64 bits must not pass the check:
    it did, the driver failed the call, and the roll-back zeroed the process's whole charge."""
    out = run_py(
        PRELUDE
        + """
c.init()
rc, a = c.alloc(900 << 20)
p = C.c_uint64()
top = (1 << 64) - (4 << 20) + 1            # rounding to 2 MiB wraps
sum_wraps = (1 << 64) - (900 << 20)        # aligned; 900 MiB used + this wraps to 0
rcs = [cu.cuMemAllocManaged(C.byref(p), C.c_size_t(top), 1), cu.cuMemAllocManaged(C.byref(p), C.c_size_t(top), 0),
       cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(top)), cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(sum_wraps)),
       cu.cuMemAllocAsync(C.byref(p), C.c_size_t(top), None), cu.cuMemAllocAsync(C.byref(p), C.c_size_t(sum_wraps), None),
       vmm_create((1 << 64) - (2 << 20))[0], vmm_create(sum_wraps)[0]]
print(rc, rcs, ledger(), c.alloc(900 << 20)[0], ledger())
""",
        vgpu_env,
    ).stdout.strip()
    assert out == f"0 {[2] * 8} 900 2 900"


def test_created_contexts_are_checked_against_the_limit_on_every_entry_point(vgpu_env):
    """cuCtxCreate (v1, by name, dlsym or cuGetProcAddress at 2000) and _v2 reserve the context
    footprint under the limit before the driver creates it; destroy gives it back."""
    vgpu_env["FAKEGPU_CONTEXT_MEM"] = "300m"
    out = run_py(
        PRELUDE
        + """
c.init()                                   # primary context: 300 MiB, measured
row = [ledger()]
ctxs = []
def create(fn):
    x = C.c_void_p(); rc = fn(C.byref(x), 0, 0)
    if rc == 0: ctxs.append(x)
    return rc
v1 = cu.cuCtxCreate
fn, st = C.c_void_p(), C.c_int()
c.check(cu.cuGetProcAddress_v2(b"cuCtxCreate", C.byref(fn), 2000, C.c_uint64(0), C.byref(st)))
gpa_v1 = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.c_uint, C.c_int)(fn.value)
row.append([create(v1), create(gpa_v1), create(v1), create(cu.cuCtxCreate_v2), ledger()])
c.check(cu.cuCtxDestroy(ctxs.pop())); row.append(ledger())
row.append([create(cu.cuCtxCreate_v2), create(cu.cuCtxCreate_v2), ledger()])
c.check(cu.cuCtxDestroy_v2(ctxs.pop())); row.append([ledger(), create(gpa_v1), ledger()])
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "[300, [0, 0, 2, 2, 900], 600, [0, 2, 900], [600, 0, 900]]"


def test_a_first_created_context_over_the_limit_is_destroyed(vgpu_env):
    """The first context of a process on a device is measured as it is created; if the
    footprint does not fit the limit the context is destroyed and the call fails."""
    vgpu_env["FAKEGPU_CONTEXT_MEM"] = "300m"
    vgpu_env["CUDA_DEVICE_MEMORY_LIMIT"] = "256m"
    out = run_py(
        PRELUDE
        + """
import pynvml as n
c.check(cu.cuInit(0))
x = C.c_void_p()
rc = cu.cuCtxCreate_v2(C.byref(x), 0, 0)
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
print(rc, ledger(), n.nvmlDeviceGetMemoryInfo(h).used >> 20)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "2 0 0"


def test_pool_allocations_are_charged_to_the_pools_device(vgpu_env):
    """cuMemAllocFromPoolAsync allocates on the pool's device, whatever the current context."""
    out = run_py(
        PRELUDE
        + """
ctx1 = c.init(1)
ctx0 = c.init(0)
dflt, cur = C.c_void_p(), C.c_void_p()
c.check(cu.cuDeviceGetDefaultMemPool(C.byref(dflt), 1))
c.check(cu.cuDeviceGetMemPool(C.byref(cur), 1))
made = mkpool(1)
d = C.c_uint64()
rcs = [cu.cuMemAllocFromPoolAsync(C.byref(d), C.c_size_t(400 << 20), pool, None) for pool in (dflt, cur, made)]
row = [rcs, ledger(0), ledger(1)]
c.check(cu.cuCtxSetCurrent(ctx1))
row += [c.alloc(400 << 20)[0], c.alloc(200 << 20)[0], ledger(1)]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "[[0, 0, 2], 0, 800, 2, 0, 1000]"


def test_what_a_pool_keeps_above_its_live_allocations_is_charged(vgpu_env):
    """A pool with a release threshold keeps what its allocations freed: a process filled its
    limit from such a pool, freed into it (charged 0), and allocated its limit again with
    cuMemAlloc, holding twice its limit. The cache is now charged, reusable by the pool's own
    allocations, and given back by a trim, a lowered threshold or the pool's destruction; with the
    default threshold (0) nothing is charged beyond the live allocations."""
    out = run_py(
        PRELUDE
        + """
ctx0 = c.init(0)
pool = mkpool()
keep(pool, 2**64 - 1)
rc, d = from_pool(pool, 800)
row = [rc, ledger()]
row += [cu.cuMemFreeAsync(d, None), ledger()]          # the pool keeps it: still charged
row.append(c.alloc(800 << 20)[0])                      # was 0: 1600 MiB held under a 1 GiB limit
rc, d = from_pool(pool, 700)                           # served from the cache: fits
row += [rc, ledger(), cu.cuMemFreeAsync(d, None), ledger()]
c.check(cu.cuMemPoolTrimTo(pool, C.c_size_t(0)))
row.append(ledger())
rc, big = c.alloc(800 << 20)
row += [rc, ledger(), c.free(big)]
rc, d = from_pool(pool, 500)
row += [rc, cu.cuMemFreeAsync(d, None), ledger()]
keep(pool, 0)                                          # a lowered threshold gives the cache back
row.append(ledger())
rc, d = from_pool(pool, 300)                           # from the 500 the pool still reserves
keep(pool, 2**64 - 1)
row += [rc, cu.cuMemFreeAsync(d, None), ledger(), cu.cuMemPoolDestroy(pool), ledger()]
d = C.c_uint64()                                       # the default pool, default threshold
row += [cu.cuMemAllocAsync(C.byref(d), C.c_size_t(800 << 20), None), cu.cuMemFreeAsync(d, None), ledger()]
rc, big = c.alloc(800 << 20)
row += [rc, ledger(), c.free(big)]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == (
        "[0, 800, 0, 800, 2, 0, 800, 0, 800, 0, 0, 800, 0, 0, 0, 500, 0, 0, 0, 500, 0, 0, 0, 0, 0, 0, 800, 0]"
    )


def test_a_pool_allocation_freed_with_cumemfree_leaves_its_cache_charged(vgpu_env):
    """cuMemFree of stream-ordered memory is legal: it returned the allocation's charge but not the
    pool's count of live bytes, so the pool's cache (800 MiB it kept) was never charged and a
    second 800 MiB fitted under the 1 GiB limit (1600 MiB held; review of 1d0b0e5)."""
    out = run_py(
        PRELUDE
        + """
ctx = c.init(0)
pool = mkpool(); keep(pool, 2**64 - 1)
rc, d = from_pool(pool, 800)
row = [rc, cu.cuMemFree_v2(d), ledger(), reserved(pool), c.alloc(800 << 20)[0]]
c.check(cu.cuMemPoolTrimTo(pool, C.c_size_t(0)))
row += [ledger(), c.alloc(800 << 20)[0]]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "[0, 0, 800, 800, 2, 0, 0]"


def test_the_threshold_bounds_what_a_pool_keeps_in_all(vgpu_env):
    """The release threshold bounds the pool's whole reservation, live allocations included: with
    500 MiB live under a 300 MiB threshold, a freed 300 MiB is given back at the next
    synchronization. It was charged as kept (min(cache, threshold)), and a correct program's
    cuMemAlloc of 300 MiB failed at 800 of 1024 MiB."""
    out = run_py(
        PRELUDE
        + """
ctx = c.init(0)
pool = C.c_void_p(); c.check(cu.cuDeviceGetDefaultMemPool(C.byref(pool), 0))
keep(pool, 300 << 20)
live, tmp = C.c_uint64(), C.c_uint64()
row = [cu.cuMemAllocAsync(C.byref(live), C.c_size_t(500 << 20), None), cu.cuMemAllocAsync(C.byref(tmp), C.c_size_t(300 << 20), None)]
row += [cu.cuMemFreeAsync(tmp, None), cu.cuStreamSynchronize(None), ledger(), c.alloc(300 << 20)[0], ledger()]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "[0, 0, 0, 0, 500, 0, 800]"


def test_an_allocation_served_by_the_cache_leaves_no_room_for_another_thread(vgpu_env):
    """An allocation from a pool's cache gave the cache's charge back before reserving its own: a
    cuMemAlloc waiting in the region lock took that room, and both succeeded (1600 MiB under
    1 GiB). The charge now moves from the cache to the allocation without the ledger moving."""
    env = {**vgpu_env, "LIBVGPU_TEST_STALL_IN_LOCK_MS": "400"}
    out = run_py(
        PRELUDE
        + """
import threading, time
ctx = c.init(0)
pool = mkpool(); keep(pool, 2**64 - 1)
rc, d = from_pool(pool, 800)
c.check(cu.cuMemFreeAsync(d, None))
res = {}
def other():
    c.check(cu.cuCtxSetCurrent(ctx))
    res["b"] = c.alloc(800 << 20)[0]
t = threading.Thread(target=other); t.start()
time.sleep(0.15)
rc2, d2 = from_pool(pool, 800)
t.join()
print(sorted([res["b"], rc2]), ledger())
""",
        env,
    ).stdout.strip()
    assert out == "[0, 2] 800"


def test_a_destroyed_current_pool_is_forgotten(vgpu_env):
    """A pool made current (cuDeviceSetMemPool) and destroyed: the driver makes the default pool
    current again, but libvgpu kept the destroyed handle as the device's current pool, so the
    default pool's cache (PyTorch's backend keeps everything) went uncharged and a second 800 MiB
    fitted under the 1 GiB limit (review of 1268f8b)."""
    out = run_py(
        PRELUDE
        + """
ctx = c.init(0)
p = mkpool(); keep(p, 2**64 - 1)
c.check(cu.cuDeviceSetMemPool(0, p))
d = C.c_uint64()
row = [cu.cuMemAllocAsync(C.byref(d), C.c_size_t(300 << 20), None), cu.cuMemFreeAsync(d, None), ledger()]
row += [cu.cuMemPoolDestroy(p), ledger()]
dp = C.c_void_p(); c.check(cu.cuDeviceGetDefaultMemPool(C.byref(dp), 0))
keep(dp, 2**64 - 1)
row += [cu.cuMemAllocAsync(C.byref(d), C.c_size_t(800 << 20), None), cu.cuMemFreeAsync(d, None), ledger()]
row += [c.alloc(800 << 20)[0], ledger()]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "[0, 0, 300, 0, 0, 0, 0, 800, 2, 800]"


def test_async_allocations_are_charged_to_the_streams_device(vgpu_env):
    """cuMemAllocAsync allocates from the pool current to the stream's device: a stream made on
    device 1 charges device 1 while device 0's context is current (it charged device 0, so device
    1 could be filled past its limit); the default streams follow the current context."""
    out = run_py(
        PRELUDE
        + """
ctx1 = c.init(1)
s1 = C.c_void_p()
c.check(cu.cuStreamCreate(C.byref(s1), 0))
ctx0 = c.init(0)
d = C.c_uint64()
row = [cu.cuMemAllocAsync(C.byref(d), C.c_size_t(600 << 20), s1), ledger(0), ledger(1)]
row += [cu.cuMemAllocAsync(C.byref(d), C.c_size_t(600 << 20), s1), ledger(1)]   # device 1 is full
row += [cu.cuMemAllocAsync_ptsz(C.byref(d), C.c_size_t(600 << 20), s1), ledger(1)]
row += [cu.cuMemAllocAsync(C.byref(d), C.c_size_t(300 << 20), None), ledger(0), ledger(1)]
cur = C.c_void_p(); c.check(cu.cuCtxGetCurrent(C.byref(cur)))
row.append(cur.value == ctx0.value)                 # the current context is left as it was
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "[0, 0, 600, 2, 600, 2, 600, 0, 300, 600, True]"


def test_vmm_memory_is_charged_until_unmapped_and_released(vgpu_env):
    """The driver keeps a cuMemCreate allocation while a mapping or a handle reference is left
    (cuMemRelease alone does not free a mapped allocation); so does the ledger."""
    out = run_py(
        PRELUDE
        + """
c.init()
row = []
vas = []
for i in range(3):                          # create, map, release: still mapped, still charged
    rc, h = vmm_create(512 << 20)
    if rc == 0:
        va = reserve(512 << 20)
        c.check(cu.cuMemMap(va, C.c_size_t(512 << 20), C.c_size_t(0), h, C.c_ulonglong(0)))
        c.check(cu.cuMemRelease(h))
        vas.append(va)
    row.append((rc, ledger()))
c.check(cu.cuMemUnmap(vas.pop(), C.c_size_t(512 << 20))); row.append(ledger())
# a handle retained from a mapping keeps the allocation alive after the unmap
h2 = C.c_uint64()
c.check(cu.cuMemRetainAllocationHandle(C.byref(h2), C.c_void_p(vas[0].value)))
c.check(cu.cuMemUnmap(vas[0], C.c_size_t(512 << 20))); row.append(ledger())
row.append(vmm_create(1024 << 20)[0])
c.check(cu.cuMemRelease(h2)); row.append(ledger())
# two mappings of one handle: freed after the handle and both mappings are gone
rc, h = vmm_create(512 << 20)
va1, va2 = reserve(512 << 20), reserve(512 << 20)
for va in (va1, va2):
    c.check(cu.cuMemMap(va, C.c_size_t(512 << 20), C.c_size_t(0), h, C.c_ulonglong(0)))
c.check(cu.cuMemRelease(h)); c.check(cu.cuMemUnmap(va1, C.c_size_t(512 << 20))); row.append(ledger())
c.check(cu.cuMemUnmap(va2, C.c_size_t(512 << 20))); row.append(ledger())
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "[(0, 512), (0, 1024), (2, 1024), 512, 512, 2, 0, 512, 0]"


@pytest.mark.parametrize("call", ["cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync"])
def test_deprecated_launch_calls_pass_the_launch_gate(vgpu_env, tmp_path, call):
    """cuLaunch, cuLaunchGrid and cuLaunchGridAsync (still exported by libcuda 12) go through the
    same launch hook as cuLaunchKernel (compute share gate, last_kernel_time)."""
    args = {"cuLaunch": "", "cuLaunchGrid": ", 2, 1", "cuLaunchGridAsync": ", 2, 1, None"}[call]
    run_py(
        f"""
import cuda_probe as c
c.init(); fn = c.function(b"k_1us")
c.check(c.cu.cuFuncSetBlockShape(fn, 1, 1, 1), "block shape")
c.check(c.cu.{call}(fn{args}), "{call}")
c.check(c.cu.cuCtxSynchronize())
""",
        vgpu_env,
    )
    r = read_region(tmp_path / "vgpu.cache")
    assert abs(r["last_kernel_time"] - time.time()) < 5


def test_context_limits_are_device_memory_charged_under_the_limit(vgpu_env):
    """cuCtxSetLimit's malloc heap, printf FIFO and per-thread stack (times every thread the
    device holds at once) are device memory the driver keeps for the context: a raise is charged
    under the limit before the driver sets it (a raise past the limit is refused and not set), a
    lower value gives the charge back, and the context takes the rest with it."""
    vgpu_env["FAKEGPU_CONTEXT_MEM"] = "100m"
    out = run_py(
        PRELUDE
        + """
STACK, FIFO, HEAP = 0, 1, 2
c.init()
base = ledger()
def get(which):
    v = C.c_size_t(); c.check(cu.cuCtxGetLimit(C.byref(v), which)); return v.value
sms, per = C.c_int(), C.c_int()
c.check(cu.cuDeviceGetAttribute(C.byref(sms), 16, 0)); c.check(cu.cuDeviceGetAttribute(C.byref(per), 39, 0))
threads = sms.value * per.value
row = [base, cu.cuCtxSetLimit(HEAP, C.c_size_t(300 << 20)), ledger() - base]   # 8 -> 300 MiB: +292
row += [cu.cuCtxSetLimit(HEAP, C.c_size_t(2 << 30)), get(HEAP) >> 20, ledger() - base]  # past 1 GiB
row += [cu.cuCtxSetLimit(FIFO, C.c_size_t(101 << 20)), ledger() - base]        # 1 -> 101 MiB: +100
stack = 1024 + (200 << 20) // threads                                           # about 200 MiB more
row += [cu.cuCtxSetLimit(STACK, C.c_size_t(stack)), (ledger() - base - 392) == ((stack - 1024) * threads) >> 20]
row += [cu.cuCtxSetLimit(STACK, C.c_size_t(1 << 20)), get(STACK) == stack]      # 1 MiB stacks: terabytes
row += [cu.cuCtxSetLimit(HEAP, C.c_size_t(8 << 20)), cu.cuCtxSetLimit(STACK, C.c_size_t(1024)), ledger() - base]
row += [cu.cuCtxSetLimit(HEAP, C.c_size_t(600 << 20)), ledger() - base]
c.check(cu.cuDevicePrimaryCtxRelease_v2(0))
row.append(ledger())
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    # refused raises leave the limit where it was; lowering returns exactly what was charged
    assert out == str([100, 0, 292, 2, 300, 292, 0, 392, 0, True, 2, True, 0, 0, 100, 0, 692, 0]), out


def test_a_limit_lowered_below_its_first_value_and_raised_again_charges_nothing(vgpu_env):
    """The value a context's limit had when first seen is inside the context footprint: going
    below it gives nothing back and coming back to it charges nothing (it charged the way back up
    each time, so a limit cycled to its default kept eating the container's memory)."""
    vgpu_env["FAKEGPU_CONTEXT_MEM"] = "100m"
    out = run_py(
        PRELUDE
        + """
STACK, FIFO, HEAP = 0, 1, 2
c.init()
base = ledger()
row = []
for _ in range(3):
    row += [cu.cuCtxSetLimit(STACK, C.c_size_t(16)), cu.cuCtxSetLimit(STACK, C.c_size_t(1024)), ledger() - base]
row += [cu.cuCtxSetLimit(HEAP, C.c_size_t(1 << 20)), cu.cuCtxSetLimit(HEAP, C.c_size_t(8 << 20)), ledger() - base]
row += [cu.cuCtxSetLimit(HEAP, C.c_size_t(108 << 20)), ledger() - base]
print(row)
""",
        vgpu_env,
    ).stdout.strip()
    assert out == str([0, 0, 0] * 3 + [0, 0, 0] + [0, 100])


def test_a_limit_set_while_another_thread_resets_the_context_stays_in_step_with_the_driver(vgpu_env):
    """cudaDeviceReset on one thread while another raises a limit (held inside its reservation):
    the reset drops the context's limit records, so the two are ordered; the ledger must end
    equal to what the driver holds (it kept 292 MiB the driver had let go, or missed 300 it held)."""
    vgpu_env.update(FAKEGPU_CONTEXT_MEM="100m", LIBVGPU_TEST_STALL_IN_LOCK_MS="1000")
    out = run_py(
        PRELUDE
        + """
import threading, time, pynvml as n
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
def driver():
    return sum(p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(h)) >> 20
HEAP = 2
ctx = c.init()
c.check(cu.cuCtxSetLimit(HEAP, C.c_size_t(300 << 20)))
res = []
def setter():
    c.check(cu.cuCtxSetCurrent(ctx))
    res.append(cu.cuCtxSetLimit(HEAP, C.c_size_t(600 << 20)))
t = threading.Thread(target=setter); t.start()
time.sleep(0.3)
c.check(cu.cuDevicePrimaryCtxReset_v2(0))
t.join()
print(res[0], ledger() == driver(), ledger(), driver())
""",
        vgpu_env,
    ).stdout.strip()
    rc, same = out.split()[:2]
    assert (rc, same) == ("0", "True"), out


def test_a_child_forked_while_a_limit_is_being_set_can_set_limits(vgpu_env):
    """fork() while another thread is inside cuCtxSetLimit: the child's copy of the lock that
    orders limit calls is reset with the rest of the process-local state (the child hung in its
    first cuCtxSetLimit)."""
    vgpu_env["LIBVGPU_TEST_STALL_IN_LOCK_MS"] = "1000"
    out = run_py(
        PRELUDE
        + """
import threading, time, signal
HEAP = 2
ctx = c.init()
def setter():
    c.check(cu.cuCtxSetCurrent(ctx))
    cu.cuCtxSetLimit(HEAP, C.c_size_t(300 << 20))
t = threading.Thread(target=setter); t.start()
time.sleep(0.3)
pid = os.fork()
if pid == 0:
    cu.cuCtxSetLimit(HEAP, C.c_size_t(16 << 20))   # any answer will do; it must come
    os._exit(0)
t.join()
for _ in range(300):
    done, _status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child exited"); break
    time.sleep(0.1)
else:
    os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0); print("child blocked")
""",
        vgpu_env,
    ).stdout.strip()
    assert out == "child exited"


def test_arrays_made_through_the_pre_3_2_entry_points_are_charged(vgpu_env):
    """cuArrayCreate and cuArray3DCreate (32-bit sizes), which the driver still exports and a
    program reaches by name (dlsym, or cuGetProcAddress below 3020): they went to the driver
    unseen, so 600 MiB arrays filled the 1 GiB limit twice over."""
    out = run_py(
        PRELUDE
        + """
class Desc(C.Structure): _fields_ = [("w", C.c_uint), ("h", C.c_uint), ("fmt", C.c_int), ("ch", C.c_uint)]
class Desc3(C.Structure):
    _fields_ = [("w", C.c_uint), ("h", C.c_uint), ("d", C.c_uint), ("fmt", C.c_int), ("ch", C.c_uint), ("flags", C.c_uint)]
c.init()
FLOAT = 0x20
a2, a3 = C.c_void_p(), C.c_void_p()
p = C.c_void_p(); st = C.c_int()
c.check(cu.cuGetProcAddress_v2(b"cuArray3DCreate", C.byref(p), 3000, C.c_uint64(0), C.byref(st)))
create3d = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p)(p.value)
rc2 = cu.cuArrayCreate(C.byref(a2), C.byref(Desc(40960, 3840, FLOAT, 1)))          # 600 MiB
print(rc2, ledger(), create3d(C.byref(a3), C.byref(Desc3(4096, 4096, 10, FLOAT, 1, 0))), ledger())
print(cu.cuArrayDestroy(a2), ledger(), create3d(C.byref(a3), C.byref(Desc3(4096, 4096, 10, FLOAT, 1, 0))), ledger())
""",
        vgpu_env,
    ).stdout.splitlines()
    assert out == ["0 600 2 600", "0 0 0 640"]
