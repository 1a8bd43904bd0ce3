"""A small CUDA-driver probe, run inside GPU containers on the real node (from a ConfigMap, by
the hami image's Python): what the container's driver (the fake, under libvgpu) reports.

``python gpu_probe.py [ALLOC_MIB ...] [--hold]``: prints one JSON line, then with ``--hold``
keeps its allocations and sleeps (so the monitor sees its usage), else exits 0. Fields:
``cuda_total_mib``/``cuda_free_mib`` (cuMemGetInfo), ``nvml_total_mib`` (nvmlDeviceGetMemoryInfo
of device 0), ``allocs`` (the CUresult of cuMemAlloc for each size, in order), ``env`` (what
Allocate gave the container), ``dev_nodes`` (its ``/dev/nvidia*``: ``char`` for a character device).
"""

import ctypes as C
import json
import os
import stat
import sys
import time

MiB = 1 << 20


class NvmlMemory(C.Structure):
    _fields_ = [("total", C.c_ulonglong), ("free", C.c_ulonglong), ("used", C.c_ulonglong)]


def main(argv: list[str]) -> int:
    hold = "--hold" in argv
    sizes = [int(a) for a in argv if a != "--hold"]
    cu = C.CDLL("libcuda.so.1")
    out: dict = {"pid": os.getpid()}
    out["cuInit"] = cu.cuInit(0)
    dev, ctx = C.c_int(), C.c_void_p()
    out["cuDeviceGet"] = cu.cuDeviceGet(C.byref(dev), 0)
    out["ctx"] = cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev)
    cu.cuCtxSetCurrent(ctx)
    free, total = C.c_size_t(), C.c_size_t()
    out["cuMemGetInfo"] = cu.cuMemGetInfo_v2(C.byref(free), C.byref(total))
    out["cuda_total_mib"], out["cuda_free_mib"] = total.value // MiB, free.value // MiB
    nvml = C.CDLL("libnvidia-ml.so.1")
    handle, memory = C.c_void_p(), NvmlMemory()
    out["nvmlInit"] = nvml.nvmlInit_v2()
    nvml.nvmlDeviceGetHandleByIndex_v2(0, C.byref(handle))
    out["nvmlDeviceGetMemoryInfo"] = nvml.nvmlDeviceGetMemoryInfo(handle, C.byref(memory))
    out["nvml_total_mib"] = memory.total // MiB
    kept = []
    out["allocs"] = []
    for size in sizes:
        ptr = C.c_ulonglong()
        rc = cu.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(size * MiB))
        out["allocs"].append(rc)
        if rc == 0:
            kept.append(ptr)
    out["env"] = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("CUDA_DEVICE", "CUDA_TASK", "NVIDIA_VISIBLE", "GPU_CORE", "HAMI_"))
    }
    # the NVIDIA device nodes the container was given (name -> "char" for a character device)
    out["dev_nodes"] = {
        n: "char" if stat.S_ISCHR(os.stat(f"/dev/{n}").st_mode) else "other"
        for n in sorted(os.listdir("/dev"))
        if n.startswith("nvidia")
    }
    print(json.dumps(out, sort_keys=True), flush=True)
    while hold:
        time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
