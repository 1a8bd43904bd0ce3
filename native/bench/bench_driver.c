/* Micro-benchmark driver for bench/bench_libvgpu.py: the cost of cuLaunchKernel and of a
 * cuMemAlloc_v2/cuMemFree_v2 pair, as seen by the application. Run it once against the
 * fake driver alone and once with LD_PRELOAD=libvgpu.so; the difference is what the
 * library adds. Prints "launch_ns=<best of R> alloc_free_ns=<best of R>". */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long n_launch = argc > 1 ? atol(argv[1]) : 200000, n_alloc = argc > 2 ? atol(argv[2]) : 100000;
    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuModuleLoadData(&mod, "x") || cuModuleGetFunction(&fn, mod, "empty_1ns")) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    double best_launch = 1e18, best_alloc = 1e18;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ns();
        for (long i = 0; i < n_launch; i++)
            if (cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS)
                return 2;
        double t1 = now_ns();
        cuCtxSynchronize();
        double t2 = now_ns();
        for (long i = 0; i < n_alloc; i++) {
            CUdeviceptr p;
            if (cuMemAlloc(&p, 1 << 20) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS)
                return 3;
        }
        double t3 = now_ns();
        if ((t1 - t0) / n_launch < best_launch)
            best_launch = (t1 - t0) / n_launch;
        if ((t3 - t2) / n_alloc < best_alloc)
            best_alloc = (t3 - t2) / n_alloc;
    }
    printf("launch_ns=%.1f alloc_free_ns=%.1f\n", best_launch, best_alloc);
    return 0;
}
