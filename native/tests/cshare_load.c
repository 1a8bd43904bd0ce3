/* Saturating kernel load for the compute-share tests and benchmark (driver API only, so it
 * runs on the fake GPU and on a real one).
 *
 *   cshare_load KIND KERNEL_US SECONDS [DEPTH] [DEVICE] [LINGER_S]
 *
 * KIND: plain ptsz ex ex_ptsz coop coop_ptsz graph graph_ptsz; one launch costs KERNEL_US
 * of device time (a graph launch runs 4 nodes of KERNEL_US/4). The program keeps at most
 * DEPTH launches in flight (synchronizing the stream every DEPTH launches) and prints
 * "<wall-clock ms> <launches admitted so far>" every 10 ms, then "done <launches>", then
 * stays alive without launching for LINGER_S seconds (a task that has gone quiet).
 *
 *   cshare_load bench N          time N zero-length launches, print "ns_per_launch <x>" */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, CUstream, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, CUstream, void **);
typedef CUresult (*ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*graph_fn)(CUgraphExec, CUstream);

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "%s failed: %d\n", what, (int)r);
        exit(1);
    }
}

static double now_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *sym(const char *name)
{
    void *p = dlsym(RTLD_DEFAULT, name);
    if (!p) {
        fprintf(stderr, "missing %s\n", name);
        exit(1);
    }
    return p;
}

static CUfunction kernel(unsigned us)
{
    CUmodule m;
    CUfunction f;
    char name[64];
    snprintf(name, sizeof name, "k_%uus", us ? us : 1);
    check(cuModuleLoadData(&m, "fake-image"), "cuModuleLoadData");
    check(cuModuleGetFunction(&f, m, us ? name : "k_1ns"), "cuModuleGetFunction");
    return f;
}

static CUgraphExec make_graph(CUfunction f)
{
    CUgraph g;
    CUgraphExec e;
    CUgraphNode prev = NULL, node;
    check(cuGraphCreate(&g, 0), "cuGraphCreate");
    for (int i = 0; i < 4; i++) {
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.func = f;
        p.gridDimX = p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = p.blockDimY = p.blockDimZ = 1;
        check(cuGraphAddKernelNode_v2(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &p), "cuGraphAddKernelNode");
        prev = node;
    }
    check(cuGraphInstantiateWithFlags(&e, g, 0), "cuGraphInstantiateWithFlags");
    return e;
}

typedef struct {
    const char *kind;
    int pt;
    launch_fn plain;
    coop_fn coop;
    ex_fn ex;
    graph_fn graph;
    CUfunction f;
    CUgraphExec exec;
} launcher;

static void launch_once(launcher *l)
{
    const char *k = l->kind;
    if (!strncmp(k, "graph", 5)) {
        check(l->graph(l->exec, 0), "graph launch");
    } else if (!strncmp(k, "coop", 4)) {
        check(l->coop(l->f, 1, 1, 1, 1, 1, 1, 0, 0, NULL), "cooperative launch");
    } else if (!strncmp(k, "ex", 2)) {
        CUlaunchConfig c;
        memset(&c, 0, sizeof c);
        c.gridDimX = c.gridDimY = c.gridDimZ = 1;
        c.blockDimX = c.blockDimY = c.blockDimZ = 1;
        check(l->ex(&c, l->f, NULL, NULL), "cuLaunchKernelEx");
    } else {
        check(l->plain(l->f, 1, 1, 1, 1, 1, 1, 0, 0, NULL, NULL), "cuLaunchKernel");
    }
}

static void setup(launcher *l, const char *kind, unsigned kernel_us, int dev)
{
    CUcontext ctx;
    check(cuInit(0), "cuInit");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    int pt = strstr(kind, "_ptsz") != NULL || !strcmp(kind, "ptsz");
    l->kind = kind;
    l->pt = pt;
    l->plain = (launch_fn)sym(pt ? "cuLaunchKernel_ptsz" : "cuLaunchKernel");
    l->coop = (coop_fn)sym(pt ? "cuLaunchCooperativeKernel_ptsz" : "cuLaunchCooperativeKernel");
    l->ex = (ex_fn)sym(pt ? "cuLaunchKernelEx_ptsz" : "cuLaunchKernelEx");
    l->graph = (graph_fn)sym(pt ? "cuGraphLaunch_ptsz" : "cuGraphLaunch");
    int graph = !strncmp(kind, "graph", 5);
    l->f = kernel(graph ? kernel_us / 4 : kernel_us);
    l->exec = graph ? make_graph(l->f) : NULL;
}

static int bench(long n)
{
    launcher l;
    setup(&l, "plain", 0, 0);
    for (int i = 0; i < 1000; i++)
        launch_once(&l);
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s(CLOCK_MONOTONIC);
        for (long i = 0; i < n; i++)
            launch_once(&l);
        double per = (now_s(CLOCK_MONOTONIC) - t0) / (double)n * 1e9;
        best = per < best ? per : best;
        check(cuCtxSynchronize(), "cuCtxSynchronize");
    }
    printf("ns_per_launch %.1f\n", best);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "bench"))
        return bench(atol(argv[2]));
    if (argc < 4) {
        fprintf(stderr, "usage: %s KIND KERNEL_US SECONDS [DEPTH] [DEVICE] [LINGER_S]\n", argv[0]);
        return 2;
    }
    unsigned kernel_us = (unsigned)atoi(argv[2]);
    double seconds = atof(argv[3]);
    int depth = argc > 4 ? atoi(argv[4]) : 8, dev = argc > 5 ? atoi(argv[5]) : 0;
    double linger = argc > 6 ? atof(argv[6]) : 0;
    launcher l;
    setup(&l, argv[1], kernel_us, dev);
    setvbuf(stdout, NULL, _IOLBF, 0);
    double t0 = now_s(CLOCK_MONOTONIC), next = t0;
    long launches = 0;
    while (now_s(CLOCK_MONOTONIC) - t0 < seconds) {
        launch_once(&l);
        launches++;
        if (launches % depth == 0)
            check(l.pt ? cuStreamSynchronize(CU_STREAM_PER_THREAD) : cuCtxSynchronize(), "synchronize");
        double t = now_s(CLOCK_MONOTONIC);
        if (t >= next) {
            printf("%.3f %ld\n", now_s(CLOCK_REALTIME) * 1e3, launches);
            next = t + 0.01;
        }
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    printf("%.3f %ld\ndone %ld\n", now_s(CLOCK_REALTIME) * 1e3, launches, launches);
    if (linger > 0) {
        struct timespec ts = {(time_t)linger, (long)((linger - (double)(time_t)linger) * 1e9)};
        nanosleep(&ts, NULL);
    }
    return 0;
}
