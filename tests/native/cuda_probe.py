"""ctypes helpers used by probe processes (run with LD_LIBRARY_PATH pointing at the fake)."""

from __future__ import annotations

import ctypes as C

cu = C.CDLL("libcuda.so.1")
OOM = 2


def check(rc: int, what: str = "") -> None:
    if rc != 0:
        raise RuntimeError(f"{what} -> CUresult {rc}")


def init(dev: int = 0) -> C.c_void_p:
    check(cu.cuInit(0), "cuInit")
    ctx = C.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "retain")
    check(cu.cuCtxSetCurrent(ctx), "set current")
    return ctx


def alloc(size: int) -> tuple[int, int]:
    p = C.c_uint64()
    rc = cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(size))
    return rc, p.value


def free(ptr: int) -> int:
    return cu.cuMemFree_v2(C.c_uint64(ptr))


def mem_info() -> tuple[int, int]:
    f, t = C.c_size_t(), C.c_size_t()
    check(cu.cuMemGetInfo_v2(C.byref(f), C.byref(t)), "cuMemGetInfo_v2")
    return f.value, t.value


def function(name: bytes) -> C.c_void_p:
    mod, fn = C.c_void_p(), C.c_void_p()
    check(cu.cuModuleLoadData(C.byref(mod), b"fake-image"), "load")
    check(cu.cuModuleGetFunction(C.byref(fn), mod, name), "getfunction")
    return fn


def launch(fn: C.c_void_p, grid: int = 1, stream=None) -> int:
    return cu.cuLaunchKernel(fn, grid, 1, 1, 1, 1, 1, 0, stream, None, None)


def event() -> C.c_void_p:
    e = C.c_void_p()
    check(cu.cuEventCreate(C.byref(e), 0), "event")
    return e


def elapsed_ms(fn_between, stream=None) -> float:
    """Device-timeline milliseconds spent by the work `fn_between()` enqueues, measured
    with events (the fake driver's schedule, not the wall clock). A 300 ms kernel is queued
    first so that the start event and the work sit on the timeline behind it, not at 'now':
    had this process been descheduled longer than the lead (20 ms once, on a loaded 2-core
    machine), the gap would count as device time and the figure would be off."""
    lead = function(b"lead_300ms")
    check(launch(lead, stream=stream), "lead")
    a, b = event(), event()
    check(cu.cuEventRecord(a, stream), "record")
    fn_between()
    check(cu.cuEventRecord(b, stream), "record")
    check(cu.cuEventSynchronize(b), "sync")
    ms = C.c_float()
    check(cu.cuEventElapsedTime(C.byref(ms), a, b), "elapsed")
    return round(ms.value, 1)
