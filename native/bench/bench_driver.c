/* Micro-benchmark driver for bench/bench_libvgpu.py: the cost of cuLaunchKernel, of a
 * cuMemAlloc_v2/cuMemFree_v2 pair, of cuMemGetInfo_v2 and of nvmlDeviceGetMemoryInfo, as
 * seen by the application. Run it against the fake driver alone and with
 * LD_PRELOAD=libvgpu.so; the difference is what the library adds.
 *
 *   bench_driver [OP [N [ROUNDS]]]     OP: all (default), launch, alloc, meminfo, nvml
 *
 * Against the fake driver the kernel is its "empty_1ns"; with BENCH_PTX=1 (a real GPU, see
 * tests/gpu/gpu_check.py) it is an empty kernel from the PTX below, JIT-compiled by the driver.
 *
 * Prints "<op>_ns=<best of ROUNDS>" (wall) and "cpu_<op>_ns=<best>" (the thread's CPU time, user +
 * kernel: not inflated by time spent descheduled on a loaded machine) for each op run
 * (4N launches, N pairs, N queries).
 * Each op's loop is a function of its own (op_launch, op_alloc_free, op_meminfo, op_nvml) so
 * that `valgrind --tool=callgrind
 * --toggle-collect=op_alloc_free` counts exactly the loop's instructions, and each loop is
 * bracketed by close(-1001 - k) / close(-2001 - k) so that an strace log can be cut to it. */
#include <cuda.h>
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static CUfunction g_fn;
static const char EMPTY_PTX[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                                ".visible .entry empty()\n{\n\tret;\n}\n";
static nvmlDevice_t g_nvdev;

static double clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Each loop twice: op_X (measured) and warm_X (the warm-up, so that callgrind's
 * --toggle-collect=op_X does not count first-use costs). */
#define LOOP(name, ...)                                                                            \
    __attribute__((noinline)) static int op_##name(long n) { for (long i = 0; i < n; i++) { __VA_ARGS__ } return 0; } \
    __attribute__((noinline)) static int warm_##name(long n) { for (long i = 0; i < n; i++) { __VA_ARGS__ } return 0; }

LOOP(launch, if (cuLaunchKernel(g_fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) return 2;)
LOOP(alloc_free, CUdeviceptr p; if (cuMemAlloc(&p, 1 << 20) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS) return 3;)
LOOP(meminfo, size_t f, t; if (cuMemGetInfo(&f, &t) != CUDA_SUCCESS) return 4;)
LOOP(nvml, nvmlMemory_t m; if (nvmlDeviceGetMemoryInfo(g_nvdev, &m) != NVML_SUCCESS) return 5;)

static const struct {
    const char *name, *key;
    int (*fn)(long), (*warm)(long);
    long scale; /* iterations relative to N (alloc pairs are slower than launches) */
} OPS[] = {
    {"launch", "launch_ns", op_launch, warm_launch, 4},
    {"alloc", "alloc_free_ns", op_alloc_free, warm_alloc_free, 1},
    {"meminfo", "meminfo_ns", op_meminfo, warm_meminfo, 1},
    {"nvml", "nvml_meminfo_ns", op_nvml, warm_nvml, 1},
};

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "all";
    long n = argc > 2 ? atol(argv[2]) : 50000;
    int rounds = argc > 3 ? atoi(argv[3]) : 3;
    CUcontext ctx;
    CUmodule mod;
    const char *ptx = getenv("BENCH_PTX");
    int real = ptx && *ptx && strcmp(ptx, "0");
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuModuleLoadData(&mod, real ? (const void *)EMPTY_PTX : "x") ||
        cuModuleGetFunction(&g_fn, mod, real ? "empty" : "empty_1ns") ||
        nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(0, &g_nvdev)) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    int found = 0;
    for (size_t k = 0; k < sizeof OPS / sizeof OPS[0]; k++) {
        if (strcmp(which, "all") && strcmp(which, OPS[k].name))
            continue;
        found = 1;
        long iters = n * OPS[k].scale;
        if (OPS[k].warm(16)) /* lazy binding, first-use paths */
            return 2;
        cuCtxSynchronize();
        double best = 1e18, best_cpu = 1e18;
        for (int r = 0; r < rounds; r++) {
            close(-1001 - (int)k);
            double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID), t0 = clock_ns(CLOCK_MONOTONIC);
            int rc = OPS[k].fn(iters);
            double t1 = clock_ns(CLOCK_MONOTONIC), c1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
            close(-2001 - (int)k);
            if (rc)
                return rc;
            cuCtxSynchronize();
            if ((t1 - t0) / iters < best)
                best = (t1 - t0) / iters;
            if ((c1 - c0) / iters < best_cpu)
                best_cpu = (c1 - c0) / iters;
        }
        printf("%s=%.1f cpu_%s=%.1f ", OPS[k].key, best, OPS[k].key, best_cpu);
    }
    printf("\n");
    return found ? 0 : 2;
}
