/* Fake libcuda.so.1: a CUDA driver API without a GPU, for tests.
 *
 * Devices come from the fake GPU configuration (fg.h). Device memory is bookkeeping only
 * (no backing store): every allocation is charged, rounded to the driver granularity, to
 * the calling process in the shared state file, so over-allocating the device fails with
 * CUDA_ERROR_OUT_OF_MEMORY across processes, and the fake NVML sees per-process usage.
 * Kernels "run" for a time derived from the kernel name and the grid; the device executes
 * one kernel at a time (across all processes), streams and events wait for completion.
 * Prototypes are checked against NVIDIA's cuda.h (all API versions declared). */
#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "../common/ptrmap.h"
#include "fg.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum { M_CTX = 0x43545831, M_STREAM, M_EVENT, M_MODULE, M_FUNC, M_GRAPH, M_EXEC, M_POOL, M_ARRAY,
       M_MIPMAP, M_VMM, M_NODE };
enum { K_DEVICE = 1, K_MANAGED, K_PITCH, K_ASYNC, K_HOST, K_HOSTREG, K_VMM_MAP, K_ARRAY, K_GRAPH };

struct CUctx_st {
    unsigned magic;
    int dev;       /* CUDA ordinal */
    int primary;
    int refcount;
    unsigned flags;
    unsigned long long busy_until;
    size_t limits[3];             /* set by cuCtxSetLimit: stack, printf FIFO, malloc heap (0: default) */
    unsigned long long limit_mem; /* device memory those take beyond the defaults */
    int host_pending;             /* host functions of its streams not yet returned (cuLaunchHostFunc) */
};

struct CUstream_st {
    unsigned magic;
    struct CUctx_st *ctx;
    unsigned flags;
    unsigned long long busy_until;
    struct CUgraph_st *capture;         /* the graph being captured (cuStreamBeginCapture) */
    unsigned long long capture_id;      /* that capture's id (cuStreamGetCaptureInfo), one per capture */
    struct CUgraphNode_st *capture_last; /* its last node: what the next captured one follows */
    int capture_invalid;                 /* the capture was invalidated (capture_invalidate) */
    int host_pending;                    /* its host functions not yet returned (cuLaunchHostFunc) */
};

/* Until every host function enqueued on a stream (or context) has returned. */
static void wait_host(const int *pending)
{
    while (__atomic_load_n(pending, __ATOMIC_ACQUIRE))
        usleep(500);
}

struct CUevent_st {
    unsigned magic;
    unsigned flags;
    unsigned long long time;
    int recorded;
};

struct CUmod_st {
    unsigned magic;
};

struct CUfunc_st {
    unsigned magic;
    unsigned long long ns_per_wave;
    char name[128];
    int bx, by, bz; /* cuFuncSetBlockShape, for the deprecated cuLaunch / cuLaunchGrid[Async] */
};

typedef struct {
    struct CUfunc_st *f;
    unsigned gx, gy, gz;
} fg_knode;

/* A graph node: a kernel, a memory allocation (its fixed address, size, device and pool
 * properties, as cuGraphMemAllocNodeGetParams returns them), a free of such an allocation, or a
 * child graph (moved into its parent: the only way one may hold memory nodes). */
struct CUgraphNode_st {
    unsigned magic;
    CUgraphNodeType type;
    fg_knode k;
    CUdeviceptr dptr;
    unsigned long long size;
    int dev;
    int reused; /* a free node whose address a later allocation took */
    CUmemPoolProps props;
    struct CUgraph_st *child;
};

struct CUgraph_st {
    unsigned magic;
    int n, cap;
    struct CUgraphNode_st **nodes;
    int has_exec; /* a graph with memory nodes has at most one executable graph at a time */
};

/* An allocation of an executable graph: mapped for the graph when it is launched or uploaded;
 * one not freed inside the graph stays live after the launch until cuMemFree[Async]. */
typedef struct {
    CUdeviceptr dptr;
    unsigned long long size;
    int dev;
    int freed_in_graph;
} fg_gmem;

struct CUgraphExec_st {
    unsigned magic;
    int n;
    fg_knode *nodes;
    int nmem;
    fg_gmem *mem;
    struct CUgraph_st *graph;
    unsigned long long flags;
    unsigned long long foot[FG_MAX_DEV]; /* device memory its allocations map: 2 MiB pages touched */
    int mapped;                          /* holds its pages in the device's graph pool */
    int live;                            /* allocations of its last launch not freed yet */
    unsigned long long upload_until;     /* its upload is queued on a stream until then (instantiate) */
    struct CUgraphExec_st *next;
};

struct CUmemPoolHandle_st {
    unsigned magic;
    int dev;
    unsigned long long reserved, used, reserved_high, used_high, threshold;
};

struct CUarray_st {
    unsigned magic;
    int dev;
    unsigned long long size;
};

struct CUmipmappedArray_st {
    unsigned magic;
    int dev;
    unsigned long long size;
};

typedef struct {
    unsigned magic;
    int dev;
    int refs; /* 1 for the handle + 1 per mapping */
    unsigned long long size;
} fg_vmm;

/* ---- process-local state ---- */
static int g_inited;
static int g_nvis;
static int g_vis[FG_MAX_DEV]; /* CUDA ordinal -> fake device index */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static ptrmap g_allocs; /* device pointer -> record (under g_mu) */
static unsigned long long g_next_va = 0x7f0000000000ULL;
static struct CUctx_st g_primary[FG_MAX_DEV];
static struct CUmemPoolHandle_st g_default_pool[FG_MAX_DEV];
static struct CUmemPoolHandle_st *g_cur_pool[FG_MAX_DEV];
static struct CUstream_st g_null_stream[FG_MAX_DEV];
static __thread struct CUstream_st t_pt_stream[FG_MAX_DEV];
/* The graph memory pool of each device (cuDeviceGetGraphMemAttribute): what graphs map (used)
 * and what the process holds for them (reserved, kept until cuDeviceGraphMemTrim). */
static struct {
    unsigned long long reserved, used, reserved_high, used_high;
} g_gpool[FG_MAX_DEV];
static struct CUgraphExec_st *g_execs; /* every executable graph (under g_mu) */
/* The pages of executable graphs destroyed while their upload was still queued: in use until the
 * stream reaches it (under g_mu; uploads_reap). */
typedef struct fg_upload_left {
    unsigned long long foot[FG_MAX_DEV], until;
    struct fg_upload_left *next;
} fg_upload_left;
static fg_upload_left *g_uploads_left;
static __thread struct CUctx_st *t_ctx[16];
static __thread int t_depth;

static const fg_dev_cfg *devcfg(int cuda_dev)
{
    return &fg_cfg()->dev[g_vis[cuda_dev]];
}

static int valid_dev(CUdevice d)
{
    return d >= 0 && d < g_nvis;
}

static struct CUctx_st *cur_ctx(void)
{
    return t_depth ? t_ctx[t_depth - 1] : NULL;
}

/* ---- handle values given out again, and a destroy paused after its free (tests) ----
 * With reuse_handles (FAKEGPU_REUSE_HANDLES=1) a destroyed context, array, mipmapped array, VMM
 * allocation, memory pool or executable graph gives its handle value to the next one of its kind
 * made (the last freed first), as a real driver may. fakegpu_pause_next_free() makes the next such
 * destroy, once the driver has freed the object, wait before it returns until
 * fakegpu_resume_free() (60 s at most): meanwhile a test makes another object, which takes the
 * freed value, and then sees what the destroy's caller (libvgpu) does once the driver returned. */
enum { R_CTX, R_ARRAY, R_MIPMAP, R_VMM, R_POOL, R_EXEC, R_KINDS };
#define R_KEEP 64
static struct {
    void *p[R_KEEP];
    int n;
} g_recycle[R_KINDS];
static pthread_mutex_t g_recycle_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_pause_cv = PTHREAD_COND_INITIALIZER;
static int g_pause_armed, g_paused, g_resumed;

static void *obj_new(int kind, size_t size)
{
    void *p = NULL;
    if (fg_cfg()->reuse_handles) {
        pthread_mutex_lock(&g_recycle_mu);
        if (g_recycle[kind].n)
            p = g_recycle[kind].p[--g_recycle[kind].n];
        pthread_mutex_unlock(&g_recycle_mu);
        if (p)
            memset(p, 0, size);
    }
    return p ? p : calloc(1, size);
}

static void obj_free(int kind, void *p)
{
    if (!p)
        return;
    if (fg_cfg()->reuse_handles) {
        pthread_mutex_lock(&g_recycle_mu);
        int kept = g_recycle[kind].n < R_KEEP;
        if (kept)
            g_recycle[kind].p[g_recycle[kind].n++] = p;
        pthread_mutex_unlock(&g_recycle_mu);
        if (kept)
            return;
    }
    free(p);
}

/* g_recycle_mu held: waits for fakegpu_resume_free (60 s at most). */
static void pause_here(const char *what)
{
    g_paused++;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    int r = 0;
    while (!g_resumed && r != ETIMEDOUT)
        r = pthread_cond_timedwait(&g_pause_cv, &g_recycle_mu, &until);
    if (!g_resumed)
        fprintf(stderr, "fakegpu: a paused %s was not resumed (fakegpu_resume_free) within 60 s\n", what);
    g_resumed = 0;
    g_paused--;
}

/* Called by a destroy once it freed its object: the armed pause, if any. */
static void after_free(void)
{
    pthread_mutex_lock(&g_recycle_mu);
    if (g_pause_armed) {
        g_pause_armed = 0;
        pause_here("destroy");
    }
    pthread_mutex_unlock(&g_recycle_mu);
}

/* A pause inside a call (tests): fakegpu_pause_next_call(name) makes the next call of `name` wait
 * at its pause point until fakegpu_resume_free() (60 s at most); fakegpu_paused_frees() counts it.
 * cuMemUnmap, cuMemRelease, cuMemPoolDestroy, cuArray3DCreate_v2, cuMemAllocAsync,
 * cuMemAllocFromPoolAsync and cuStreamEndCapture pause on entry, before they do anything,
 * cuMemCreate too as "cuMemCreate:entry" and the graph instantiations as
 * "cuGraphInstantiate:entry" (before they read the graph or their parameters); cuMemCreate (as
 * "cuMemCreate"), the context creates (as "cuCtxCreate") and the graph instantiations (as
 * "cuGraphInstantiate") once they have written the new handle, before they return; the
 * stream-ordered allocations (as "cuMemAllocAsync:made", "cuMemAllocFromPoolAsync:made") once they
 * have made the allocation or allocation node; cuMemPoolSetAttribute once it has read the value.
 * A test sees what another thread's calls do while the driver is still in the paused one, whether
 * it will fail (an unmap of a range that starts at an unmapped address) or succeed (a destroy, a
 * create). */
static char g_pause_call[64]; /* under g_recycle_mu */
static int g_pause_call_armed;

static void pause_point(const char *name)
{
    if (!__atomic_load_n(&g_pause_call_armed, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&g_recycle_mu);
    if (g_pause_call_armed && !strcmp(g_pause_call, name)) {
        __atomic_store_n(&g_pause_call_armed, 0, __ATOMIC_RELEASE);
        pause_here(name);
    }
    pthread_mutex_unlock(&g_recycle_mu);
}

EXPORT void fakegpu_pause_next_call(const char *name)
{
    pthread_mutex_lock(&g_recycle_mu);
    snprintf(g_pause_call, sizeof g_pause_call, "%s", name ? name : "");
    __atomic_store_n(&g_pause_call_armed, g_pause_call[0] != 0, __ATOMIC_RELEASE);
    g_resumed = 0;
    pthread_mutex_unlock(&g_recycle_mu);
}

/* A failure on demand (tests): fakegpu_fail_next_call(name, err) makes the next call of `name`
 * return `err` without doing anything. The graph walk's calls take it (cuGraphGetNodes,
 * cuGraphNodeGetType, cuGraphMemAllocNodeGetParams, cuGraphChildGraphNodeGetGraph): a test sees
 * what a caller does with a node it cannot read. */
static char g_fail_call[64]; /* under g_recycle_mu */
static int g_fail_call_armed;
static CUresult g_fail_err;

/* The armed failure of `name`, if it is armed now (disarmed by taking it), else CUDA_SUCCESS. */
static CUresult fail_point(const char *name)
{
    if (!__atomic_load_n(&g_fail_call_armed, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_recycle_mu);
    if (g_fail_call_armed && !strcmp(g_fail_call, name)) {
        __atomic_store_n(&g_fail_call_armed, 0, __ATOMIC_RELEASE);
        r = g_fail_err;
    }
    pthread_mutex_unlock(&g_recycle_mu);
    return r;
}

EXPORT void fakegpu_fail_next_call(const char *name, int err)
{
    pthread_mutex_lock(&g_recycle_mu);
    snprintf(g_fail_call, sizeof g_fail_call, "%s", name ? name : "");
    g_fail_err = (CUresult)err;
    __atomic_store_n(&g_fail_call_armed, g_fail_call[0] != 0 && err != 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_recycle_mu);
}

EXPORT void fakegpu_pause_next_free(void)
{
    pthread_mutex_lock(&g_recycle_mu);
    g_pause_armed = 1;
    g_resumed = 0;
    pthread_mutex_unlock(&g_recycle_mu);
}

/* How many destroys wait in their pause now. */
EXPORT int fakegpu_paused_frees(void)
{
    pthread_mutex_lock(&g_recycle_mu);
    int n = g_paused;
    pthread_mutex_unlock(&g_recycle_mu);
    return n;
}

EXPORT void fakegpu_resume_free(void)
{
    pthread_mutex_lock(&g_recycle_mu);
    g_resumed = 1;
    pthread_cond_broadcast(&g_pause_cv);
    pthread_mutex_unlock(&g_recycle_mu);
}

#define NEED_INIT()                                                                                \
    do {                                                                                           \
        if (!__atomic_load_n(&g_inited, __ATOMIC_ACQUIRE))                                         \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    } while (0)

#define NEED_CTX(c)                                                                                \
    NEED_INIT();                                                                                   \
    struct CUctx_st *c = cur_ctx();                                                                \
    if (!c || c->magic != M_CTX)                                                                   \
        return CUDA_ERROR_INVALID_CONTEXT;

/* Charge (delta > 0) or release (delta < 0) device memory of this process. */
static CUresult charge(int cuda_dev, long long delta, int ctx_delta)
{
    int dev = g_vis[cuda_dev];
    unsigned long long cap = fg_cfg()->dev[dev].memory;
    CUresult r = CUDA_SUCCESS;
    fg_lock();
    fg_proc *p = fg_self_slot(1);
    if (!p) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (delta > 0) {
        unsigned long long used = fg_dev_used(dev);
        if (used + (unsigned long long)delta > cap) {
            fg_reap();
            used = fg_dev_used(dev);
        }
        if (used + (unsigned long long)delta > cap)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            p->used[dev] += (unsigned long long)delta;
    } else {
        unsigned long long d = (unsigned long long)(-delta);
        p->used[dev] = p->used[dev] > d ? p->used[dev] - d : 0;
    }
    if (r == CUDA_SUCCESS && p) {
        if (ctx_delta > 0 || p->contexts[dev] > 0)
            p->contexts[dev] += (unsigned long long)(long long)ctx_delta;
    }
    fg_unlock();
    return r;
}

static unsigned long long new_va(unsigned long long size)
{
    unsigned long long a = size >= FG_LARGE_ALIGN ? FG_LARGE_ALIGN : FG_SMALL_ALIGN;
    unsigned long long r = fg_round_alloc(size ? size : 1);
    pthread_mutex_lock(&g_mu);
    g_next_va = (g_next_va + a - 1) / a * a;
    unsigned long long p = g_next_va;
    g_next_va += r + a; /* guard gap */
    pthread_mutex_unlock(&g_mu);
    return p;
}

static CUresult alloc_dev(CUdeviceptr *dptr, unsigned long long size, int kind, int cuda_dev,
                          unsigned long long aux, unsigned long long charged)
{
    CUresult r = charged ? charge(cuda_dev, (long long)charged, 0) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
        return r;
    unsigned long long p = new_va(size);
    ptrmap_val v = {.size = charged, .aux = aux, .owner = (uint64_t)(uintptr_t)cur_ctx(), .dev = cuda_dev,
                    .kind = kind};
    pthread_mutex_lock(&g_mu);
    ptrmap_put(&g_allocs, p, v);
    pthread_mutex_unlock(&g_mu);
    *dptr = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

/* ---- init, version, errors ---- */

static void parse_visible(void)
{
    const fg_config *c = fg_cfg();
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    g_nvis = 0;
    if (!v) {
        for (int i = 0; i < c->nvis; i++)
            g_vis[g_nvis++] = c->vis[i];
        return;
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", v);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t && g_nvis < FG_MAX_DEV; t = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*t))
            t++;
        int found = -1;
        if (!strncmp(t, "GPU-", 4)) {
            for (int i = 0; i < c->nvis; i++)
                if (!strncmp(c->dev[c->vis[i]].uuid, t, strlen(t)))
                    found = c->vis[i];
        } else {
            char *end;
            long n = strtol(t, &end, 10);
            if (end != t && !*end && n >= 0 && n < c->nvis)
                found = c->vis[n];
        }
        if (found < 0)
            break; /* like the real driver: an invalid entry ends the list */
        g_vis[g_nvis++] = found;
    }
}

EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (!g_inited) {
        fg_cfg();
        fg_st();
        parse_visible();
        for (int i = 0; i < g_nvis; i++) {
            g_primary[i] = (struct CUctx_st){.magic = M_CTX, .dev = i, .primary = 1};
            g_default_pool[i] = (struct CUmemPoolHandle_st){.magic = M_POOL, .dev = i};
            g_cur_pool[i] = &g_default_pool[i];
            g_null_stream[i] = (struct CUstream_st){.magic = M_STREAM, .ctx = &g_primary[i]};
        }
        __atomic_store_n(&g_inited, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_mu);
    return g_nvis ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

EXPORT CUresult cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 12040;
    return CUDA_SUCCESS;
}

static const struct { CUresult code; const char *name, *text; } g_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
     "too many blocks in cooperative launch"},
};

EXPORT CUresult cuGetErrorString(CUresult e, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == e) {
            *s = g_errors[i].text;
            return CUDA_SUCCESS;
        }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult e, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == e) {
            *s = g_errors[i].name;
            return CUDA_SUCCESS;
        }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
    (void)id;
    if (table)
        *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- devices ---- */

EXPORT CUresult cuDeviceGetCount(int *count)
{
    NEED_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_nvis;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    NEED_INIT();
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    NEED_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", devcfg(dev)->name);
    return CUDA_SUCCESS;
}

static CUresult uuid_v2(CUuuid *uuid, CUdevice dev)
{
    NEED_INIT();
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    memcpy(uuid->bytes, devcfg(dev)->uuid_bytes, 16);
    return CUDA_SUCCESS;
}

/* FAKEGPU_UUID_API=v1 plays a driver older than CUDA 11.4, which has no cuDeviceGetUuid_v2: dlsym
 * finds none (the export is an indirect function whose resolver answers NULL) and
 * cuGetProcAddress("cuDeviceGetUuid") gives the v1 at every version. =none also makes the v1 fail
 * (CUDA_ERROR_NOT_SUPPORTED): a device whose UUID cannot be read at all. Read from the environment
 * when the symbol is looked up (dlsym, or a program's first call): not from the configuration, which
 * the resolver may run too early for. */
static int uuid_v2_hidden(void)
{
    const char *v = getenv("FAKEGPU_UUID_API");
    return v && (!strcmp(v, "v1") || !strcmp(v, "none"));
}

static __typeof__(&cuDeviceGetUuid_v2) resolve_uuid_v2(void)
{
    return uuid_v2_hidden() ? NULL : uuid_v2;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) __attribute__((ifunc("resolve_uuid_v2")));

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    NEED_INIT();
    if (fg_cfg()->uuid_api == 0)
        return CUDA_ERROR_NOT_SUPPORTED;
    return uuid_v2(uuid, dev);
}

EXPORT CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev)
{
    NEED_INIT();
    if (!bus || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    const fg_dev_cfg *d = devcfg(dev);
    snprintf(bus, (size_t)len, "%04X:%02X:%02X.0", d->domain, d->bus, d->device);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *bus)
{
    NEED_INIT();
    if (!dev || !bus)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned dom = 0, b, d, f;
    if (sscanf(bus, "%x:%x:%x.%x", &dom, &b, &d, &f) != 4 &&
        (dom = 0, sscanf(bus, "%x:%x.%x", &b, &d, &f) != 3))
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < g_nvis; i++) {
        const fg_dev_cfg *c = devcfg(i);
        if (c->domain == dom && c->bus == b && c->device == d) {
            *dev = i;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    NEED_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = devcfg(dev)->memory;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t b;
    CUresult r = cuDeviceTotalMem_v2(&b, dev);
    if (r == CUDA_SUCCESS)
        *bytes = b > 0xffffffffULL ? 0xffffffffU : (unsigned)b;
    return r;
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    NEED_INIT();
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    const fg_dev_cfg *d = devcfg(dev);
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = d->sms; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *pi = (int)FG_BLOCKS_PER_SM * 2; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = d->cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = d->cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = (int)d->bus; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *pi = (int)d->device; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *pi = (int)d->domain; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        *pi = 1;
        break;
    default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    NEED_INIT();
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev) || !valid_dev(peer))
        return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer;
    return CUDA_SUCCESS;
}

/* ---- contexts ---- */

/* The driver frees a context's allocations (device, managed, pitched, arrays) with it. */
static void drop_ctx_allocs(struct CUctx_st *c)
{
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_allocs.cap; i++) {
        ptrmap_slot *s = &g_allocs.slots[i];
        int k = s->val.kind;
        if (s->key > PTRMAP_TOMB && s->val.owner == (uint64_t)(uintptr_t)c &&
            (k == K_DEVICE || k == K_MANAGED || k == K_PITCH || k == K_ARRAY)) {
            charge(s->val.dev, -(long long)s->val.size, 0);
            if (k == K_ARRAY) {
                struct CUarray_st *a = (struct CUarray_st *)(uintptr_t)s->key;
                int kind = a->magic == M_MIPMAP ? R_MIPMAP : R_ARRAY;
                a->magic = 0;
                obj_free(kind, a);
            }
            ptrmap_del(&g_allocs, s->key, NULL);
        }
    }
    pthread_mutex_unlock(&g_mu);
}

static void push_ctx(struct CUctx_st *c)
{
    if (t_depth < 16)
        t_ctx[t_depth++] = c;
    else
        t_ctx[15] = c;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUctx_st *c = &g_primary[dev];
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (c->refcount == 0)
        r = charge(dev, (long long)fg_cfg()->ctx_mem, 1);
    int made = r == CUDA_SUCCESS && c->refcount == 0;
    if (r == CUDA_SUCCESS)
        c->refcount++;
    pthread_mutex_unlock(&g_mu);
    if (made && fg_cfg()->context_delay_ms) {
        struct timespec ts = {fg_cfg()->context_delay_ms / 1000, (long)(fg_cfg()->context_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (r == CUDA_SUCCESS)
        *pctx = c;
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    NEED_INIT();
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUctx_st *c = &g_primary[dev];
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (c->refcount == 0)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (--c->refcount == 0) {
        charge(dev, -(long long)(fg_cfg()->ctx_mem + c->limit_mem), -1);
        c->limit_mem = 0;
        memset(c->limits, 0, sizeof c->limits);
    }
    int gone = r == CUDA_SUCCESS && c->refcount == 0;
    pthread_mutex_unlock(&g_mu);
    if (gone)
        drop_ctx_allocs(c);
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    NEED_INIT();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *flags = g_primary[dev].flags;
    *active = g_primary[dev].refcount > 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    NEED_INIT();
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    g_primary[dev].flags = flags;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    NEED_INIT();
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    drop_ctx_allocs(&g_primary[dev]);
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c = &g_primary[dev];
    if (c->limit_mem)
        charge(dev, -(long long)c->limit_mem, 0);
    c->limit_mem = 0;
    memset(c->limits, 0, sizeof c->limits);
    /* The reset frees the device's graph memory too (modelled so: every graph's pages unmapped,
     * its live allocations gone, the pool's whole reservation back); a graph launched again maps
     * its pages afresh. */
    for (struct CUgraphExec_st *x = g_execs; x; x = x->next)
        if (x->mapped && x->foot[dev]) {
            x->mapped = 0;
            x->live = 0;
        }
    unsigned long long rel = g_gpool[dev].reserved;
    g_gpool[dev].reserved = g_gpool[dev].used = 0;
    pthread_mutex_unlock(&g_mu);
    if (rel)
        charge(dev, -(long long)rel, 0);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUctx_st *c = obj_new(R_CTX, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = charge(dev, (long long)fg_cfg()->ctx_mem, 1);
    if (r != CUDA_SUCCESS) {
        obj_free(R_CTX, c);
        return r;
    }
    *c = (struct CUctx_st){.magic = M_CTX, .dev = dev, .flags = flags, .refcount = 1};
    push_ctx(c);
    *pctx = c;
    pause_point("cuCtxCreate");
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags,
                               CUdevice dev)
{
    (void)p;
    (void)n;
    return ctx_create(pctx, flags, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags, CUdevice dev)
{
    (void)p;
    return ctx_create(pctx, flags, dev);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    NEED_INIT();
    if (!ctx || ctx->magic != M_CTX || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = 0; i < t_depth; i++)
        if (t_ctx[i] == ctx) {
            memmove(&t_ctx[i], &t_ctx[i + 1], sizeof t_ctx[0] * (size_t)(t_depth - i - 1));
            t_depth--;
            i--;
        }
    charge(ctx->dev, -(long long)(fg_cfg()->ctx_mem + ctx->limit_mem), -1);
    drop_ctx_allocs(ctx);
    ctx->magic = 0;
    obj_free(R_CTX, ctx);
    after_free();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = cur_ctx();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    NEED_INIT();
    if (ctx && ctx->magic != M_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx) {
        if (t_depth)
            t_depth--;
        return CUDA_SUCCESS;
    }
    if (t_depth)
        t_ctx[t_depth - 1] = ctx;
    else
        push_ctx(ctx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    NEED_INIT();
    if (!ctx || ctx->magic != M_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    push_ctx(ctx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    NEED_INIT();
    if (!t_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = t_ctx[--t_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    NEED_CTX(c);
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    *dev = c->dev;
    return CUDA_SUCCESS;
}

/* Context limits (cuCtxSetLimit): the device-side malloc heap (default 8 MiB), the printf FIFO
 * (1 MiB) and the per-thread stack (1 KiB), kept in device memory: a stack for every thread the
 * device can hold at once (SMs x 2048). What a raise above the defaults takes is charged to the
 * process like an allocation (CUDA_ERROR_OUT_OF_MEMORY when the device has no room) and
 * released with the context; the defaults are inside the context footprint. */
static const size_t LIMIT_DEFAULT[3] = {1024, 1 << 20, 8 << 20};

static unsigned long long limit_cost(const struct CUctx_st *c, int which, size_t value)
{
    size_t base = LIMIT_DEFAULT[which];
    unsigned long long extra = value > base ? (unsigned long long)(value - base) : 0;
    if (which == CU_LIMIT_STACK_SIZE)
        extra *= (unsigned long long)devcfg(c->dev)->sms * 2048ULL;
    return extra;
}

EXPORT CUresult cuCtxGetLimit(size_t *value, CUlimit limit)
{
    NEED_CTX(c);
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned)limit <= CU_LIMIT_MALLOC_HEAP_SIZE) {
        *value = c->limits[limit] ? c->limits[limit] : LIMIT_DEFAULT[limit];
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_UNSUPPORTED_LIMIT;
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    NEED_CTX(c);
    if ((unsigned)limit > CU_LIMIT_MALLOC_HEAP_SIZE)
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    pthread_mutex_lock(&g_mu);
    size_t was = c->limits[limit] ? c->limits[limit] : LIMIT_DEFAULT[limit];
    unsigned long long before = limit_cost(c, (int)limit, was), after = limit_cost(c, (int)limit, value);
    CUresult r = CUDA_SUCCESS;
    if (after > before)
        r = charge(c->dev, (long long)(after - before), 0);
    else if (after < before)
        charge(c->dev, -(long long)(before - after), 0);
    if (r == CUDA_SUCCESS) {
        c->limits[limit] = value;
        c->limit_mem = c->limit_mem + after - before;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    NEED_CTX(c);
    fg_sleep_until(__atomic_load_n(&c->busy_until, __ATOMIC_ACQUIRE));
    wait_host(&c->host_pending);
    return CUDA_SUCCESS;
}

/* ---- memory ---- */

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    NEED_CTX(c);
    if (!free_b || !total)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = g_vis[c->dev];
    unsigned long long cap = fg_cfg()->dev[dev].memory;
    fg_lock();
    fg_reap();
    unsigned long long used = fg_dev_used(dev);
    fg_unlock();
    *total = cap;
    *free_b = used > cap ? 0 : cap - used;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total)
{
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free_b = f > 0xffffffffULL ? 0xffffffffU : (unsigned)f;
        *total = t > 0xffffffffULL ? 0xffffffffU : (unsigned)t;
    }
    return r;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    NEED_CTX(c);
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_dev(dptr, size, K_DEVICE, c->dev, 0, fg_round_alloc(size));
}

EXPORT CUresult cuMemAlloc(unsigned int *dptr, unsigned int size)
{
    (void)dptr;
    (void)size;
    return CUDA_ERROR_NOT_SUPPORTED; /* 32-bit pointers cannot hold our addresses */
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    NEED_CTX(c);
    if (!dptr || size == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_dev(dptr, size, K_MANAGED, c->dev, 0, fg_round_alloc(size));
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int elem)
{
    NEED_CTX(c);
    if (!dptr || !pitch || !width || !height || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + 511) / 512 * 512;
    CUresult r = alloc_dev(dptr, p * height, K_PITCH, c->dev, 0, fg_round_alloc(p * height));
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

static CUresult free_dev(CUdeviceptr dptr, int want_async)
{
    ptrmap_val v = {0};
    pthread_mutex_lock(&g_mu);
    ptrmap_val *pv = ptrmap_get(&g_allocs, dptr);
    int ok = pv && pv->kind != K_HOST && pv->kind != K_HOSTREG && pv->kind != K_VMM_MAP && pv->kind != K_ARRAY;
    if (ok)
        ptrmap_del(&g_allocs, dptr, &v);
    pthread_mutex_unlock(&g_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    if (v.kind == K_GRAPH) { /* back to its graph: the pages stay mapped for it (graph_trim) */
        struct CUgraphExec_st *x = (struct CUgraphExec_st *)(uintptr_t)v.aux;
        pthread_mutex_lock(&g_mu);
        if (x && x->live > 0)
            x->live--;
        pthread_mutex_unlock(&g_mu);
        return CUDA_SUCCESS;
    }
    if (v.kind == K_ASYNC) {
        struct CUmemPoolHandle_st *pool = (struct CUmemPoolHandle_st *)(uintptr_t)v.aux;
        pthread_mutex_lock(&g_mu);
        pool->used -= v.size;
        /* the threshold bounds what the pool keeps reserved in all, live allocations included
         * (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD; the driver releases at the next synchronization) */
        unsigned long long keep = pool->used > pool->threshold ? pool->used : pool->threshold;
        long long rel = pool->reserved > keep ? (long long)(pool->reserved - keep) : 0;
        rel = rel / (long long)FG_LARGE_ALIGN * (long long)FG_LARGE_ALIGN;
        pool->reserved -= (unsigned long long)rel;
        pthread_mutex_unlock(&g_mu);
        if (rel)
            charge(v.dev, -rel, 0);
        return CUDA_SUCCESS;
    }
    (void)want_async;
    if (v.size)
        charge(v.dev, -(long long)v.size, 0);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    NEED_INIT();
    if (!dptr)
        return CUDA_SUCCESS;
    return free_dev(dptr, 0);
}

EXPORT CUresult cuMemFree(unsigned int dptr) { return cuMemFree_v2(dptr); }

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    ptrmap_val *v = ptrmap_get(&g_allocs, dptr);
    ptrmap_val copy = v ? *v : (ptrmap_val){0};
    pthread_mutex_unlock(&g_mu);
    if (!v)
        return CUDA_ERROR_NOT_FOUND;
    if (base)
        *base = dptr;
    if (size)
        *size = copy.size;
    return CUDA_SUCCESS;
}

static CUresult host_alloc(void **pp, size_t size, int kind)
{
    NEED_CTX(c);
    if (!pp || !size)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = NULL;
    if (posix_memalign(&p, 4096, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_mu);
    ptrmap_put(&g_allocs, (uint64_t)(uintptr_t)p, (ptrmap_val){.size = size, .dev = c->dev, .kind = kind});
    pthread_mutex_unlock(&g_mu);
    *pp = p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size) { return host_alloc(pp, size, K_HOST); }

EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    (void)flags;
    return host_alloc(pp, size, K_HOST);
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    NEED_INIT();
    ptrmap_val v = {0};
    pthread_mutex_lock(&g_mu);
    ptrmap_val *pv = ptrmap_get(&g_allocs, (uint64_t)(uintptr_t)p);
    int ok = pv && pv->kind == K_HOST;
    if (ok)
        ptrmap_del(&g_allocs, (uint64_t)(uintptr_t)p, &v);
    pthread_mutex_unlock(&g_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    free(p);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
    NEED_CTX(c);
    (void)flags;
    if (!p || !size)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    ptrmap_put(&g_allocs, (uint64_t)(uintptr_t)p, (ptrmap_val){.size = size, .dev = c->dev, .kind = K_HOSTREG});
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    ptrmap_val *pv = ptrmap_get(&g_allocs, (uint64_t)(uintptr_t)p);
    int ok = pv && pv->kind == K_HOSTREG;
    if (ok)
        ptrmap_del(&g_allocs, (uint64_t)(uintptr_t)p, NULL);
    pthread_mutex_unlock(&g_mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags)
{
    NEED_INIT();
    if (!dptr || flags)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

/* Copies and sets move no data (device memory has no backing store); they validate
 * arguments and, for async variants, order behind the stream. */
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    NEED_CTX(c);
    (void)n;
    return dst && src ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    NEED_CTX(c);
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    memset(dst, 0, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    NEED_CTX(c);
    (void)n;
    return dst && src ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n)
{
    NEED_CTX(c);
    (void)v;
    (void)n;
    return dst ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n)
{
    NEED_CTX(c);
    (void)v;
    (void)n;
    return dst ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
    NEED_INIT();
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    ptrmap_val *v = ptrmap_get(&g_allocs, ptr);
    ptrmap_val copy = v ? *v : (ptrmap_val){0};
    pthread_mutex_unlock(&g_mu);
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = copy.dev; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: /* the pool a stream-ordered allocation came from */
        *(CUmemoryPool *)data = copy.kind == K_ASYNC ? (CUmemoryPool)(uintptr_t)copy.aux : NULL;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned *)data = copy.kind == K_MANAGED; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = (copy.kind == K_HOST || copy.kind == K_HOSTREG) ? CU_MEMORYTYPE_HOST
                                                                             : CU_MEMORYTYPE_DEVICE;
        break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

/* ---- arrays ---- */

static unsigned long long ceil_div(unsigned long long a, unsigned long long b)
{
    return a / b + (a % b != 0);
}

/* Bytes of one w x h plane (h >= 1) of a CUDA array in format f: the ones that take a channel
 * count (1, 2 or 4 channels of 1, 2 or 4 bytes), those whose channels the format itself sets
 * (normalized integers, packed RGB and YUV), block-compressed ones (4 x 4 texel blocks of 8 or 16
 * bytes) and planar or semi-planar YUV (a luma plane and chroma planes subsampled 2 x 2 for 4:2:0,
 * 2 x 1 for 4:2:2). 0: a format or channel count the fake does not take. */
static unsigned long long plane_bytes(unsigned long long w, unsigned long long h, CUarray_format f, unsigned ch)
{
    unsigned long long px = w * h, cw = ceil_div(w, 2), ch420 = cw * ceil_div(h, 2) * 2, ch422 = cw * h * 2;
    unsigned long long per = 0; /* bytes per channel (formats with a channel count) */
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: per = 1; break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: per = 2; break;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: per = 4; break;
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1: return px;
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1: return px * 2;
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
    case CU_AD_FORMAT_UNORM_INT_101010_2:
    case CU_AD_FORMAT_AYUV:
    case CU_AD_FORMAT_Y410: return px * 4;
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
    case CU_AD_FORMAT_Y416: return px * 8;
    case CU_AD_FORMAT_Y444_PLANAR8:
    case CU_AD_FORMAT_YUV444_8bit_SemiPlanar: return px * 3;
    case CU_AD_FORMAT_Y444_PLANAR10:
    case CU_AD_FORMAT_YUV444_16bit_SemiPlanar: return px * 6;
    case CU_AD_FORMAT_BC1_UNORM:
    case CU_AD_FORMAT_BC1_UNORM_SRGB:
    case CU_AD_FORMAT_BC4_UNORM:
    case CU_AD_FORMAT_BC4_SNORM: return ceil_div(w, 4) * ceil_div(h, 4) * 8;
    case CU_AD_FORMAT_BC2_UNORM:
    case CU_AD_FORMAT_BC2_UNORM_SRGB:
    case CU_AD_FORMAT_BC3_UNORM:
    case CU_AD_FORMAT_BC3_UNORM_SRGB:
    case CU_AD_FORMAT_BC5_UNORM:
    case CU_AD_FORMAT_BC5_SNORM:
    case CU_AD_FORMAT_BC6H_UF16:
    case CU_AD_FORMAT_BC6H_SF16:
    case CU_AD_FORMAT_BC7_UNORM:
    case CU_AD_FORMAT_BC7_UNORM_SRGB: return ceil_div(w, 4) * ceil_div(h, 4) * 16;
    case CU_AD_FORMAT_NV12: return px + ch420;
    case CU_AD_FORMAT_P010:
    case CU_AD_FORMAT_P016: return (px + ch420) * 2;
    case CU_AD_FORMAT_NV16: return px + ch422;
    case CU_AD_FORMAT_P210:
    case CU_AD_FORMAT_P216: return (px + ch422) * 2;
    case CU_AD_FORMAT_YUY2: return cw * h * 4; /* Y0 U Y1 V: 4 bytes per 2 texels */
    case CU_AD_FORMAT_Y210:
    case CU_AD_FORMAT_Y216: return cw * h * 8;
    default: return 0;
    }
    return ch == 1 || ch == 2 || ch == 4 ? px * per * ch : 0;
}

/* Bytes of a w x h x d CUDA array (0 for h or d: that dimension absent; d also counts layers). */
static unsigned long long array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch)
{
    if (!w)
        return 0;
    return plane_bytes(w, h ? h : 1, f, ch) * (d ? d : 1);
}

static CUresult array_new(int kind_magic, unsigned long long bytes, void **out)
{
    NEED_CTX(c);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long charged = fg_round_alloc(bytes);
    CUresult r = charge(c->dev, (long long)charged, 0);
    if (r != CUDA_SUCCESS)
        return r;
    struct CUarray_st *a = obj_new(kind_magic == M_MIPMAP ? R_MIPMAP : R_ARRAY, sizeof *a);
    *a = (struct CUarray_st){.magic = (unsigned)kind_magic, .dev = c->dev, .size = charged};
    pthread_mutex_lock(&g_mu);
    ptrmap_put(&g_allocs, (uint64_t)(uintptr_t)a,
               (ptrmap_val){.size = charged, .owner = (uint64_t)(uintptr_t)c, .dev = c->dev, .kind = K_ARRAY});
    pthread_mutex_unlock(&g_mu);
    *out = a;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!arr || !d)
        return CUDA_ERROR_INVALID_VALUE;
    return array_new(M_ARRAY, array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), (void **)arr);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    pause_point("cuArray3DCreate_v2");
    if (!arr || !d)
        return CUDA_ERROR_INVALID_VALUE;
    return array_new(M_ARRAY, array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels),
                     (void **)arr);
}

/* The CUDA 2.x/3.0 entry points (32-bit sizes), still exported by the driver for old binaries:
 * the same arrays. */
EXPORT CUresult cuArrayCreate(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    if (!arr || !d)
        return CUDA_ERROR_INVALID_VALUE;
    return array_new(M_ARRAY, array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), (void **)arr);
}

EXPORT CUresult cuArray3DCreate(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    if (!arr || !d)
        return CUDA_ERROR_INVALID_VALUE;
    return array_new(M_ARRAY, array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels),
                     (void **)arr);
}

static CUresult array_free(void *h, unsigned magic)
{
    NEED_INIT();
    struct CUarray_st *a = h;
    if (!a || a->magic != magic)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_mu);
    ptrmap_del(&g_allocs, (uint64_t)(uintptr_t)a, NULL);
    pthread_mutex_unlock(&g_mu);
    charge(a->dev, -(long long)a->size, 0);
    a->magic = 0;
    obj_free(magic == M_MIPMAP ? R_MIPMAP : R_ARRAY, a);
    after_free();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuArrayDestroy(CUarray arr) { return array_free(arr, M_ARRAY); }

/* The driver clamps the level count to [1, 1 + floor(log2(max(Width, Height, Depth)))] (0 asks for
 * one level). Each level halves Width and Height (at least 1; a 1D array stays 0 high) and, in a 3D
 * array, Depth; in a layered or cubemap array Depth counts layers (faces) and every level has them all. */
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned int levels)
{
    if (!arr || !d || !d->Width)
        return CUDA_ERROR_INVALID_VALUE;
    size_t top = d->Width > d->Height ? d->Width : d->Height;
    if (d->Depth > top)
        top = d->Depth;
    unsigned most = 1;
    while (most < 64 && (top >> most))
        most++;
    if (levels == 0)
        levels = 1;
    if (levels > most)
        levels = most;
    int layers = (d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    unsigned long long total = 0;
    for (unsigned l = 0; l < levels; l++) {
        size_t w = d->Width >> l, h = d->Height >> l, z = layers ? d->Depth : d->Depth >> l;
        unsigned long long b = array_bytes(w ? w : 1, d->Height ? (h ? h : 1) : 0, d->Depth ? (z ? z : 1) : 0,
                                           d->Format, d->NumChannels);
        if (!b)
            return CUDA_ERROR_INVALID_VALUE;
        total += b;
    }
    return array_new(M_MIPMAP, total, (void **)arr);
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr) { return array_free(arr, M_MIPMAP); }

/* ---- stream-ordered allocation and pools ---- */

static struct CUstream_st *stream_of(CUstream s, int per_thread)
{
    struct CUctx_st *c = cur_ctx();
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        if (!c)
            return NULL;
        if (per_thread || s == CU_STREAM_PER_THREAD) {
            struct CUstream_st *t = &t_pt_stream[c->dev];
            t->magic = M_STREAM;
            t->ctx = c;
            return t;
        }
        g_null_stream[c->dev].ctx = c;
        return &g_null_stream[c->dev];
    }
    return s->magic == M_STREAM ? s : NULL;
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, struct CUmemPoolHandle_st *pool)
{
    if (!dptr || !size)
        return CUDA_ERROR_INVALID_VALUE;
    if (!pool || pool->magic != M_POOL)
        return CUDA_ERROR_INVALID_HANDLE;
    unsigned long long need = fg_round_alloc(size) < FG_LARGE_ALIGN ? (size + 511) / 512 * 512
                                                                    : fg_round_alloc(size);
    pthread_mutex_lock(&g_mu);
    unsigned long long cached = pool->reserved - pool->used, grow = 0;
    if (cached < need)
        grow = (need - cached + FG_LARGE_ALIGN - 1) / FG_LARGE_ALIGN * FG_LARGE_ALIGN;
    CUresult r = grow ? charge(pool->dev, (long long)grow, 0) : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
        pool->reserved += grow;
        pool->used += need;
        if (pool->reserved > pool->reserved_high)
            pool->reserved_high = pool->reserved;
        if (pool->used > pool->used_high)
            pool->used_high = pool->used;
    }
    pthread_mutex_unlock(&g_mu);
    if (r != CUDA_SUCCESS)
        return r;
    unsigned long long p = new_va(size);
    pthread_mutex_lock(&g_mu);
    ptrmap_put(&g_allocs, p,
               (ptrmap_val){.size = need, .aux = (uint64_t)(uintptr_t)pool, .dev = pool->dev, .kind = K_ASYNC});
    pthread_mutex_unlock(&g_mu);
    *dptr = p;
    return CUDA_SUCCESS;
}

static CUresult capture_alloc(struct CUstream_st *st, CUdeviceptr *dptr, size_t size, int dev);
static CUresult capture_free(struct CUstream_st *st, CUdeviceptr dptr);

static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUstream s, int pt)
{
    NEED_CTX(c);
    pause_point("cuMemAllocAsync");
    struct CUstream_st *st = stream_of(s, pt);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    (void)c;
    CUresult r;
    if (st->capture) /* an allocation node: memory only when the graph runs */
        r = capture_alloc(st, dptr, size, st->ctx->dev);
    else
        r = pool_alloc(dptr, size, g_cur_pool[st->ctx->dev]); /* the pool current to the stream's device */
    pause_point("cuMemAllocAsync:made");
    return r;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { return alloc_async(d, n, s, 0); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { return alloc_async(d, n, s, 1); }

static CUresult from_pool(CUdeviceptr *d, size_t n, CUmemoryPool pool, CUstream s, int pt)
{
    NEED_CTX(c);
    pause_point("cuMemAllocFromPoolAsync");
    struct CUstream_st *st = stream_of(s, pt);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r;
    if (st->capture)
        r = !pool || pool->magic != M_POOL ? CUDA_ERROR_INVALID_HANDLE : capture_alloc(st, d, n, pool->dev);
    else
        r = pool_alloc(d, n, pool);
    pause_point("cuMemAllocFromPoolAsync:made");
    return r;
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    return from_pool(d, n, p, s, 0);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    return from_pool(d, n, p, s, 1);
}

static CUresult free_async(CUdeviceptr d, CUstream s, int pt)
{
    NEED_CTX(c);
    struct CUstream_st *st = stream_of(s, pt);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (st->capture) /* a free node, of an allocation of the captured graph only */
        return capture_free(st, d);
    return free_dev(d, 1);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s) { return free_async(d, s, 0); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s) { return free_async(d, s, 1); }

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    NEED_INIT();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = &g_default_pool[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    NEED_INIT();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = g_cur_pool[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    NEED_INIT();
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!pool || pool->magic != M_POOL || pool->dev != dev)
        return CUDA_ERROR_INVALID_VALUE;
    g_cur_pool[dev] = pool;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    NEED_INIT();
    if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !valid_dev(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmemPoolHandle_st *p = obj_new(R_POOL, sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->magic = M_POOL;
    p->dev = props->location.id;
    *pool = p;
    return CUDA_SUCCESS;
}

static void pool_trim(struct CUmemPoolHandle_st *p, unsigned long long keep)
{
    pthread_mutex_lock(&g_mu);
    unsigned long long floor_ = p->used > keep ? p->used : keep;
    unsigned long long rel = p->reserved > floor_ ? p->reserved - floor_ : 0;
    rel = rel / FG_LARGE_ALIGN * FG_LARGE_ALIGN;
    p->reserved -= rel;
    pthread_mutex_unlock(&g_mu);
    if (rel)
        charge(p->dev, -(long long)rel, 0);
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    NEED_INIT();
    pause_point("cuMemPoolDestroy");
    if (!pool || pool->magic != M_POOL || pool == &g_default_pool[pool->dev])
        return CUDA_ERROR_INVALID_VALUE;
    /* Outstanding allocations are freed with the pool (as the driver does at destroy). */
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_allocs.cap; i++) {
        ptrmap_slot *s = &g_allocs.slots[i];
        if (s->key > PTRMAP_TOMB && s->val.kind == K_ASYNC && s->val.aux == (uint64_t)(uintptr_t)pool) {
            pool->used -= s->val.size;
            ptrmap_del(&g_allocs, s->key, NULL);
        }
    }
    if (g_cur_pool[pool->dev] == pool)
        g_cur_pool[pool->dev] = &g_default_pool[pool->dev];
    pthread_mutex_unlock(&g_mu);
    pool_trim(pool, 0);
    if (pool->reserved)
        charge(pool->dev, -(long long)pool->reserved, 0);
    pool->magic = 0;
    obj_free(R_POOL, pool);
    after_free();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    NEED_INIT();
    if (!pool || pool->magic != M_POOL)
        return CUDA_ERROR_INVALID_VALUE;
    pool_trim(pool, keep);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    NEED_INIT();
    if (!pool || pool->magic != M_POOL || !value)
        return CUDA_ERROR_INVALID_VALUE;
    cuuint64_t *v = value;
    pthread_mutex_lock(&g_mu);
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *v = pool->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *v = pool->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *v = pool->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *v = pool->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *v = pool->used_high; break;
    default: *(int *)value = 1; break;
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    NEED_INIT();
    if (!pool || pool->magic != M_POOL || !value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        pool->threshold = *(cuuint64_t *)value;
    else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
        pool->reserved_high = pool->reserved;
    else if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        pool->used_high = pool->used;
    pthread_mutex_unlock(&g_mu);
    pause_point("cuMemPoolSetAttribute");
    return CUDA_SUCCESS;
}

/* ---- virtual memory management ---- */

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option)
{
    NEED_INIT();
    (void)option;
    if (!g || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    *g = FG_LARGE_ALIGN;
    return CUDA_SUCCESS;
}

/* Drops a reference; returns 1 when that freed the allocation. */
static int vmm_unref(fg_vmm *h)
{
    pthread_mutex_lock(&g_mu);
    int left = --h->refs;
    pthread_mutex_unlock(&g_mu);
    if (left == 0) {
        charge(h->dev, -(long long)h->size, 0);
        h->magic = 0;
        obj_free(R_VMM, h);
    }
    return left == 0;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    NEED_INIT();
    pause_point("cuMemCreate:entry");
    if (!handle || !prop || flags || !size || size % FG_LARGE_ALIGN ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(prop->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = charge(prop->location.id, (long long)size, 0);
    if (r != CUDA_SUCCESS)
        return r;
    fg_vmm *h = obj_new(R_VMM, sizeof *h);
    *h = (fg_vmm){.magic = M_VMM, .dev = prop->location.id, .refs = 1, .size = size};
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    pause_point("cuMemCreate");
    return CUDA_SUCCESS;
}

static fg_vmm *vmm_of(CUmemGenericAllocationHandle handle)
{
    fg_vmm *h = (fg_vmm *)(uintptr_t)handle;
    return h && h->magic == M_VMM ? h : NULL;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    NEED_INIT();
    pause_point("cuMemRelease");
    fg_vmm *h = vmm_of(handle);
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    if (vmm_unref(h))
        after_free();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags)
{
    NEED_INIT();
    (void)align;
    (void)addr;
    if (!ptr || !size || size % FG_LARGE_ALIGN || flags)
        return CUDA_ERROR_INVALID_VALUE;
    *ptr = new_va(size);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags)
{
    NEED_INIT();
    fg_vmm *h = vmm_of(handle);
    if (!h || !ptr || !size || flags || offset + size > h->size)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    int busy = ptrmap_get(&g_allocs, ptr) != NULL;
    if (!busy) {
        h->refs++;
        ptrmap_put(&g_allocs, ptr,
                   (ptrmap_val){.size = size, .aux = (uint64_t)(uintptr_t)h, .dev = h->dev, .kind = K_VMM_MAP});
    }
    pthread_mutex_unlock(&g_mu);
    return busy ? CUDA_ERROR_ALREADY_MAPPED : CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    pause_point("cuMemUnmap");
    (void)size;
    ptrmap_val v = {0};
    pthread_mutex_lock(&g_mu);
    ptrmap_val *pv = ptrmap_get(&g_allocs, ptr);
    int ok = pv && pv->kind == K_VMM_MAP;
    if (ok)
        ptrmap_del(&g_allocs, ptr, &v);
    pthread_mutex_unlock(&g_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    if (vmm_unref((fg_vmm *)(uintptr_t)v.aux))
        after_free();
    return CUDA_SUCCESS;
}

/* The handle of the allocation mapped at any address of a mapping, with one more reference
 * (released by cuMemRelease), as the driver does. */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    NEED_INIT();
    uint64_t a = (uint64_t)(uintptr_t)addr;
    fg_vmm *h = NULL;
    if (!handle || !a)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_allocs.cap && !h; i++) {
        ptrmap_slot *s = &g_allocs.slots[i];
        if (s->key > PTRMAP_TOMB && s->val.kind == K_VMM_MAP && a >= s->key && a - s->key < s->val.size)
            h = (fg_vmm *)(uintptr_t)s->val.aux;
    }
    if (h)
        h->refs++;
    pthread_mutex_unlock(&g_mu);
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    NEED_INIT();
    return ptr && size && desc && count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemExportToShareableHandle(void *sh, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType type, unsigned long long flags)
{
    (void)sh;
    (void)handle;
    (void)type;
    (void)flags;
    return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *sh,
                                               CUmemAllocationHandleType type)
{
    (void)handle;
    (void)sh;
    (void)type;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- modules, kernels, streams, events ---- */

EXPORT CUresult cuModuleLoadData(CUmodule *mod, const void *image)
{
    NEED_CTX(c);
    if (!mod || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmod_st *m = calloc(1, sizeof *m);
    m->magic = M_MODULE;
    *mod = m;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleLoad(CUmodule *mod, const char *fname)
{
    return cuModuleLoadData(mod, fname);
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n, CUjit_option *o,
                                   void **v)
{
    (void)n;
    (void)o;
    (void)v;
    return cuModuleLoadData(mod, image);
}

EXPORT CUresult cuModuleUnload(CUmodule mod)
{
    NEED_INIT();
    if (!mod || mod->magic != M_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    mod->magic = 0;
    free(mod);
    return CUDA_SUCCESS;
}

/* Kernel time per wave from the name: a trailing "_<number><unit>" with unit ns/us/ms/s
 * ("busy_2000us"); otherwise FAKEGPU_KERNEL_NS. */
static unsigned long long name_ns(const char *name)
{
    const char *u = strrchr(name, '_');
    if (u) {
        char *end;
        double v = strtod(u + 1, &end);
        static const struct { const char *s; double mul; } units[] = {
            {"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}};
        if (end != u + 1)
            for (size_t i = 0; i < 4; i++)
                if (!strcmp(end, units[i].s))
                    return (unsigned long long)(v * units[i].mul);
    }
    return fg_cfg()->kernel_ns;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name)
{
    NEED_INIT();
    if (!f || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mod || mod->magic != M_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUfunc_st *fn = calloc(1, sizeof *fn);
    fn->magic = M_FUNC;
    fn->ns_per_wave = name_ns(name);
    snprintf(fn->name, sizeof fn->name, "%s", name);
    *f = fn;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    NEED_CTX(c);
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = calloc(1, sizeof *st);
    *st = (struct CUstream_st){.magic = M_STREAM, .ctx = c, .flags = flags};
    *s = st;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx)
{
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = stream_of(s, 0);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    *pctx = st->ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int prio)
{
    (void)prio;
    return cuStreamCreate(s, flags);
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    NEED_INIT();
    if (!s || s->magic != M_STREAM || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    wait_host(&s->host_pending); /* its host functions still refer to it */
    s->magic = 0;
    free(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy(CUstream s) { return cuStreamDestroy_v2(s); }

static CUresult capture_invalidate(struct CUstream_st *st);

static CUresult stream_sync(CUstream s, int pt)
{
    NEED_INIT();
    struct CUstream_st *st = stream_of(s, pt);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    if (st->capture)
        return capture_invalidate(st);
    fg_sleep_until(__atomic_load_n(&st->busy_until, __ATOMIC_ACQUIRE));
    wait_host(&st->host_pending);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_sync(s, 0); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_sync(s, 1); }

static CUresult stream_query(CUstream s, int pt)
{
    NEED_INIT();
    struct CUstream_st *st = stream_of(s, pt);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    if (st->capture)
        return capture_invalidate(st);
    return fg_now_ns() >= __atomic_load_n(&st->busy_until, __ATOMIC_ACQUIRE) &&
                   !__atomic_load_n(&st->host_pending, __ATOMIC_ACQUIRE)
               ? CUDA_SUCCESS
               : CUDA_ERROR_NOT_READY;
}

/* Host functions (cuLaunchHostFunc): `fn` runs on a thread of its own once the work queued on
 * the stream before it is done (the stream's busy_until when it is enqueued). Until it has
 * returned, the stream and its context are not idle: cuStreamQuery answers NOT_READY and
 * cuStreamSynchronize, cuCtxSynchronize and cuStreamDestroy wait for it. Work queued after it is
 * not held behind it (it takes no device time). Not during a capture (no host nodes):
 * CUDA_ERROR_NOT_SUPPORTED. */
typedef struct {
    CUhostFn fn;
    void *data;
    unsigned long long at;
    int *stream_pending, *ctx_pending;
} host_call;

static void *host_call_run(void *arg)
{
    host_call *h = arg;
    fg_sleep_until(h->at);
    h->fn(h->data);
    __atomic_sub_fetch(h->stream_pending, 1, __ATOMIC_RELEASE);
    __atomic_sub_fetch(h->ctx_pending, 1, __ATOMIC_RELEASE);
    free(h);
    return NULL;
}

static CUresult launch_host_func(CUstream s, CUhostFn fn, void *data, int pt)
{
    NEED_CTX(c);
    (void)c;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = stream_of(s, pt);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    if (st->capture)
        return CUDA_ERROR_NOT_SUPPORTED;
    host_call *h = malloc(sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *h = (host_call){fn, data, __atomic_load_n(&st->busy_until, __ATOMIC_ACQUIRE), &st->host_pending,
                     &st->ctx->host_pending};
    __atomic_add_fetch(h->stream_pending, 1, __ATOMIC_ACQ_REL);
    __atomic_add_fetch(h->ctx_pending, 1, __ATOMIC_ACQ_REL);
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&t, &a, host_call_run, h);
    pthread_attr_destroy(&a);
    if (e) {
        __atomic_sub_fetch(h->stream_pending, 1, __ATOMIC_RELEASE);
        __atomic_sub_fetch(h->ctx_pending, 1, __ATOMIC_RELEASE);
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data) { return launch_host_func(s, fn, data, 0); }
EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data) { return launch_host_func(s, fn, data, 1); }

EXPORT CUresult cuStreamQuery(CUstream s) { return stream_query(s, 0); }
EXPORT CUresult cuStreamQuery_ptsz(CUstream s) { return stream_query(s, 1); }

EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    NEED_CTX(c);
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *ev = calloc(1, sizeof *ev);
    *ev = (struct CUevent_st){.magic = M_EVENT, .flags = flags};
    *e = ev;
    return CUDA_SUCCESS;
}

static CUresult event_record(CUevent e, CUstream s, int pt)
{
    NEED_INIT();
    if (!e || e->magic != M_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUstream_st *st = stream_of(s, pt);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    unsigned long long now = fg_now_ns(), b = __atomic_load_n(&st->busy_until, __ATOMIC_ACQUIRE);
    e->time = b > now ? b : now;
    e->recorded = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record(e, s, 1); }

EXPORT CUresult cuEventSynchronize(CUevent e)
{
    NEED_INIT();
    if (!e || e->magic != M_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    fg_sleep_until(e->time);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(CUevent e)
{
    NEED_INIT();
    if (!e || e->magic != M_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    return fg_now_ns() >= e->time ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    NEED_INIT();
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b || a->magic != M_EVENT || b->magic != M_EVENT || !a->recorded || !b->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    if (fg_now_ns() < b->time || fg_now_ns() < a->time)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)b->time - (double)a->time) / 1e6);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }

EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    NEED_INIT();
    if (!e || e->magic != M_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    e->magic = 0;
    free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

/* Schedule `n` kernels back to back on `st`: the device runs one kernel at a time across
 * all processes; each kernel's interval is recorded for NVML utilization. */
static CUresult run_kernels(struct CUstream_st *st, const fg_knode *k, int n)
{
    struct CUctx_st *c = st->ctx ? st->ctx : cur_ctx();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    int dev = g_vis[c->dev];
    const fg_config *cfg = fg_cfg();
    unsigned long long per_wave_blocks = (unsigned long long)cfg->dev[dev].sms * FG_BLOCKS_PER_SM;
    unsigned long long now = fg_now_ns(), end = 0;
    fg_state *S = fg_st();
    fg_lock();
    fg_proc *self = fg_self_slot(1);
    int self_id = self ? self->pid : (int)getpid();
    unsigned long long t = __atomic_load_n(&st->busy_until, __ATOMIC_ACQUIRE);
    if (t < now)
        t = now;
    if (t < S->dev_busy_until[dev])
        t = S->dev_busy_until[dev];
    for (int i = 0; i < n; i++) {
        unsigned long long blocks = (unsigned long long)k[i].gx * k[i].gy * k[i].gz;
        unsigned long long waves = (blocks + per_wave_blocks - 1) / per_wave_blocks;
        unsigned long long dur = (unsigned long long)((double)(k[i].f->ns_per_wave * waves) * cfg->time_scale);
        if (dur == 0)
            dur = 1;
        fg_record_busy(dev, self_id, t, t + dur);
        t += dur;
    }
    end = t;
    S->dev_busy_until[dev] = end;
    fg_unlock();
    __atomic_store_n(&st->busy_until, end, __ATOMIC_RELEASE);
    if (__atomic_load_n(&c->busy_until, __ATOMIC_ACQUIRE) < end)
        __atomic_store_n(&c->busy_until, end, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, CUstream s, int pt, int cooperative)
{
    NEED_CTX(c);
    if (!f || f->magic != M_FUNC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *st = stream_of(s, pt);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    if (cooperative) {
        unsigned long long max = (unsigned long long)devcfg(c->dev)->sms * FG_BLOCKS_PER_SM;
        if ((unsigned long long)gx * gy * gz > max)
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    fg_knode k = {f, gx, gy, gz};
    if (st->capture && st->capture_invalid)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (st->capture) {
        CUgraphNode node;
        CUDA_KERNEL_NODE_PARAMS p = {.func = f, .gridDimX = gx, .gridDimY = gy, .gridDimZ = gz};
        CUresult r = cuGraphAddKernelNode_v2(&node, st->capture, st->capture_last ? (CUgraphNode *)&st->capture_last : NULL,
                                             st->capture_last ? 1 : 0, &p);
        if (r == CUDA_SUCCESS)
            st->capture_last = node;
        return r;
    }
    return run_kernels(st, &k, 1);
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                               void **extra)
{
    (void)shm;
    (void)params;
    (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz, s, 0, 0);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                                    void **extra)
{
    (void)shm;
    (void)params;
    (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz, s, 1, 0);
}

static CUresult launch_ex(const CUlaunchConfig *cfg, CUfunction f, int pt)
{
    if (!cfg)
        return CUDA_ERROR_INVALID_VALUE;
    int coop = 0;
    for (unsigned i = 0; i < cfg->numAttrs; i++)
        if (cfg->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && cfg->attrs[i].value.cooperative)
            coop = 1;
    return launch(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY,
                  cfg->blockDimZ, cfg->hStream, pt, coop);
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    (void)params;
    (void)extra;
    return launch_ex(cfg, f, 0);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    (void)params;
    (void)extra;
    return launch_ex(cfg, f, 1);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                          CUstream s, void **params)
{
    (void)shm;
    (void)params;
    return launch(f, gx, gy, gz, bx, by, bz, s, 0, 1);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                               unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                               CUstream s, void **params)
{
    (void)shm;
    (void)params;
    return launch(f, gx, gy, gz, bx, by, bz, s, 1, 1);
}

/* The deprecated multi-device cooperative launch (still exported by libcuda 12): each entry is a
 * cooperative launch on its own stream, of a device no other entry names. */
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned n, unsigned flags)
{
    (void)flags;
    NEED_INIT();
    if (!list || !n)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        CUstream s = list[i].hStream;
        if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || s->magic != M_STREAM)
            return CUDA_ERROR_INVALID_HANDLE;
        for (unsigned j = 0; j < i; j++)
            if (list[j].hStream->ctx->dev == s->ctx->dev)
                return CUDA_ERROR_INVALID_DEVICE;
    }
    for (unsigned i = 0; i < n; i++) {
        const CUDA_LAUNCH_PARAMS *p = &list[i];
        CUresult r = launch(p->function, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY,
                            p->blockDimZ, p->hStream, 0, 1);
        if (r != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}

/* The deprecated launches (still exported by libcuda 12): the block shape comes from
 * cuFuncSetBlockShape (unset: CUDA_ERROR_INVALID_VALUE); cuLaunch runs one block. */
EXPORT CUresult cuFuncSetBlockShape(CUfunction f, int x, int y, int z)
{
    NEED_INIT();
    if (!f || f->magic != M_FUNC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (x <= 0 || y <= 0 || z <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    f->bx = x;
    f->by = y;
    f->bz = z;
    return CUDA_SUCCESS;
}

static CUresult launch_grid(CUfunction f, int gw, int gh, CUstream s)
{
    if (!f || f->magic != M_FUNC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (gw <= 0 || gh <= 0 || f->bx <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, (unsigned)gw, (unsigned)gh, 1, (unsigned)f->bx, (unsigned)f->by, (unsigned)f->bz, s, 0, 0);
}

EXPORT CUresult cuLaunch(CUfunction f) { return launch_grid(f, 1, 1, NULL); }
EXPORT CUresult cuLaunchGrid(CUfunction f, int gw, int gh) { return launch_grid(f, gw, gh, NULL); }
EXPORT CUresult cuLaunchGridAsync(CUfunction f, int gw, int gh, CUstream s) { return launch_grid(f, gw, gh, s); }

/* ---- graphs: kernel nodes (run back to back), memory nodes, child graphs, stream capture ----
 *
 * Memory nodes follow the driver's graph memory model: an allocation node gets a fixed address
 * when it is added (an allocation that follows the free of an earlier one of at least its size
 * takes that one's address, as the driver reuses addresses of allocations whose lifetimes do not
 * overlap); its memory comes from the device's graph pool when the executable graph is launched
 * or uploaded (CUDA_ERROR_OUT_OF_MEMORY, nothing run, when the device has no room). The graph
 * then keeps its pages mapped between launches; cuDeviceGraphMemTrim gives back the pool's pages
 * that no graph holds, and unmaps idle graphs (no allocation of theirs still live). */

static struct CUgraphNode_st *new_node(CUgraph g, CUgraphNodeType type)
{
    if (g->n == g->cap) {
        int ncap = g->cap ? g->cap * 2 : 8;
        struct CUgraphNode_st **nn = realloc(g->nodes, sizeof *nn * (size_t)ncap);
        if (!nn)
            return NULL;
        g->nodes = nn;
        g->cap = ncap;
    }
    struct CUgraphNode_st *node = calloc(1, sizeof *node);
    if (!node)
        return NULL;
    node->magic = M_NODE;
    node->type = type;
    g->nodes[g->n++] = node;
    return node;
}

static int valid_graph(CUgraph g)
{
    return g && g->magic == M_GRAPH;
}

EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
    NEED_INIT();
    if (!g || flags)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *gr = calloc(1, sizeof *gr);
    gr->magic = M_GRAPH;
    *g = gr;
    return CUDA_SUCCESS;
}

static CUresult add_knode(CUgraphNode *node, CUgraph g, CUfunction f, unsigned gx, unsigned gy, unsigned gz)
{
    NEED_INIT();
    if (!node || !valid_graph(g) || !f || f->magic != M_FUNC || !gx || !gy || !gz)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = new_node(g, CU_GRAPH_NODE_TYPE_KERNEL);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    n->k = (fg_knode){f, gx, gy, gz};
    *node = n;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                        const CUDA_KERNEL_NODE_PARAMS *p)
{
    (void)deps;
    (void)n;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return add_knode(node, g, p->func, p->gridDimX, p->gridDimY, p->gridDimZ);
}

EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                     const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    (void)deps;
    (void)n;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return add_knode(node, g, p->func, p->gridDimX, p->gridDimY, p->gridDimZ);
}

static unsigned long long gmem_round(unsigned long long size)
{
    return (size + FG_LARGE_ALIGN - 1) / FG_LARGE_ALIGN * FG_LARGE_ALIGN;
}

static CUresult add_alloc_node(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                               const CUmemPoolProps *props, size_t size, CUdeviceptr *dptr)
{
    NEED_INIT();
    if (!node || !valid_graph(g) || !props || !dptr || !size || g->has_exec ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_dev(props->location.id) ||
        props->handleTypes != CU_MEM_HANDLE_TYPE_NONE)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr at = 0;
    for (size_t i = 0; deps && i < ndeps && !at; i++) {
        struct CUgraphNode_st *d = deps[i];
        if (d && d->magic == M_NODE && d->type == CU_GRAPH_NODE_TYPE_MEM_FREE && !d->reused && d->dev == props->location.id &&
            d->size >= size) {
            at = d->dptr;
            d->reused = 1;
        }
    }
    struct CUgraphNode_st *n = new_node(g, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* its own pages: a large allocation is 2 MiB aligned; a small one starts a page of its own */
    n->dptr = at ? at : (CUdeviceptr)new_va(gmem_round(size));
    n->size = size;
    n->dev = props->location.id;
    n->props = *props;
    *dptr = n->dptr;
    *node = n;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                       CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return add_alloc_node(node, g, deps, n, &p->poolProps, p->bytesize, &p->dptr);
}

/* The alloc node of `dptr` in `g` (and the graphs moved into it), or NULL. */
static struct CUgraphNode_st *alloc_node_of(CUgraph g, CUdeviceptr dptr)
{
    struct CUgraphNode_st *found = NULL;
    for (int i = 0; i < g->n; i++) {
        struct CUgraphNode_st *x = g->nodes[i];
        if (x->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && x->dptr == dptr)
            found = x; /* the latest: an address may be taken again after a free */
        else if (x->type == CU_GRAPH_NODE_TYPE_GRAPH && x->child) {
            struct CUgraphNode_st *c = alloc_node_of(x->child, dptr);
            if (c)
                found = c;
        }
    }
    return found;
}

EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n, CUdeviceptr dptr)
{
    NEED_INIT();
    (void)deps;
    (void)n;
    if (!node || !valid_graph(g) || g->has_exec)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *a = alloc_node_of(g, dptr);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE; /* only an allocation of this graph (simplified) */
    struct CUgraphNode_st *f = new_node(g, CU_GRAPH_NODE_TYPE_MEM_FREE);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    f->dptr = dptr;
    f->dev = a->dev;
    f->size = a->size;
    *node = f;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *out)
{
    NEED_INIT();
    CUresult fail = fail_point("cuGraphMemAllocNodeGetParams");
    if (fail)
        return fail;
    if (!node || node->magic != M_NODE || node->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC || !out)
        return CUDA_ERROR_INVALID_VALUE;
    memset(out, 0, sizeof *out);
    out->poolProps = node->props;
    out->bytesize = node->size;
    out->dptr = node->dptr;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr *out)
{
    NEED_INIT();
    if (!node || node->magic != M_NODE || node->type != CU_GRAPH_NODE_TYPE_MEM_FREE || !out)
        return CUDA_ERROR_INVALID_VALUE;
    *out = node->dptr;
    return CUDA_SUCCESS;
}

static void graph_free(struct CUgraph_st *g);

/* cuGraphAddNode (CUDA 12.2): kernel, memory and child graph nodes. A child graph with memory
 * nodes must be moved into its parent (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE); a cloned one may
 * hold none. */
EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n, CUgraphNodeParams *p)
{
    NEED_INIT();
    if (!p || !node || !valid_graph(g))
        return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        return add_knode(node, g, p->kernel.func, p->kernel.gridDimX, p->kernel.gridDimY, p->kernel.gridDimZ);
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
        return add_alloc_node(node, g, deps, n, &p->alloc.poolProps, p->alloc.bytesize, &p->alloc.dptr);
    case CU_GRAPH_NODE_TYPE_MEM_FREE: return cuGraphAddMemFreeNode(node, g, deps, n, p->free.dptr);
    case CU_GRAPH_NODE_TYPE_GRAPH: {
        struct CUgraph_st *c = p->graph.graph;
        if (!valid_graph(c) || c == g || p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE)
            return CUDA_ERROR_NOT_SUPPORTED; /* clones are not modelled */
        struct CUgraphNode_st *x = new_node(g, CU_GRAPH_NODE_TYPE_GRAPH);
        if (!x)
            return CUDA_ERROR_OUT_OF_MEMORY;
        x->child = c;
        *node = x;
        return CUDA_SUCCESS;
    }
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
}

EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges,
                                  size_t n, CUgraphNodeParams *p)
{
    (void)edges;
    return cuGraphAddNode(node, g, deps, n, p);
}

EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *out)
{
    NEED_INIT();
    CUresult fail = fail_point("cuGraphChildGraphNodeGetGraph");
    if (fail)
        return fail;
    if (!node || node->magic != M_NODE || node->type != CU_GRAPH_NODE_TYPE_GRAPH || !out)
        return CUDA_ERROR_INVALID_VALUE;
    *out = node->child;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *num)
{
    NEED_INIT();
    CUresult fail = fail_point("cuGraphGetNodes");
    if (fail)
        return fail;
    if (!valid_graph(g) || !num)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes)
        for (size_t i = 0; i < *num && i < (size_t)g->n; i++)
            nodes[i] = g->nodes[i];
    *num = (size_t)g->n;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type)
{
    NEED_INIT();
    CUresult fail = fail_point("cuGraphNodeGetType");
    if (fail)
        return fail;
    if (!node || node->magic != M_NODE || !type)
        return CUDA_ERROR_INVALID_VALUE;
    *type = node->type;
    return CUDA_SUCCESS;
}

/* Flatten `g` (child graphs inlined) into the executable graph's kernels and allocations. */
static int flatten(struct CUgraphExec_st *x, struct CUgraph_st *g)
{
    for (int i = 0; i < g->n; i++) {
        struct CUgraphNode_st *n = g->nodes[i];
        if (n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
            fg_knode *k = realloc(x->nodes, sizeof *k * (size_t)(x->n + 1));
            if (!k)
                return -1;
            x->nodes = k;
            x->nodes[x->n++] = n->k;
        } else if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            fg_gmem *m = realloc(x->mem, sizeof *m * (size_t)(x->nmem + 1));
            if (!m)
                return -1;
            x->mem = m;
            x->mem[x->nmem++] = (fg_gmem){n->dptr, n->size, n->dev, 0};
        } else if (n->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
            for (int j = x->nmem - 1; j >= 0; j--)
                if (x->mem[j].dptr == n->dptr && !x->mem[j].freed_in_graph) {
                    x->mem[j].freed_in_graph = 1;
                    break;
                }
        } else if (n->type == CU_GRAPH_NODE_TYPE_GRAPH && n->child && flatten(x, n->child) != 0) {
            return -1;
        }
    }
    return 0;
}

static int cmp_gmem(const void *a, const void *b)
{
    const fg_gmem *x = a, *y = b;
    return x->dev != y->dev ? x->dev - y->dev : (x->dptr > y->dptr) - (x->dptr < y->dptr);
}

/* What the graph maps per device: the 2 MiB pages its allocations' address ranges touch. */
static void footprint(struct CUgraphExec_st *x)
{
    fg_gmem *m = malloc(sizeof *m * (size_t)(x->nmem ? x->nmem : 1));
    if (!m)
        return;
    memcpy(m, x->mem, sizeof *m * (size_t)x->nmem);
    qsort(m, (size_t)x->nmem, sizeof *m, cmp_gmem);
    unsigned long long end = 0;
    int dev = -1;
    for (int i = 0; i < x->nmem; i++) {
        unsigned long long lo = m[i].dptr / FG_LARGE_ALIGN * FG_LARGE_ALIGN, hi = gmem_round(m[i].dptr + m[i].size);
        if (m[i].dev != dev)
            end = 0;
        dev = m[i].dev;
        if (lo < end)
            lo = end;
        if (hi > lo)
            x->foot[dev] += hi - lo;
        if (hi > end)
            end = hi;
    }
    free(m);
}

static CUresult instantiate(CUgraphExec *e, CUgraph g, unsigned long long flags, CUstream upload, int pt);

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    return instantiate(e, g, flags, NULL, 0);
}

/* The pre-11.4 signature: still exported (cuGraphInstantiate, _v2), reached by name. */
EXPORT CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    (void)err;
    if (log && n)
        log[0] = 0;
    return instantiate(e, g, 0, NULL, 0);
}

EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    return cuGraphInstantiate(e, g, err, log, n);
}

static CUresult with_params(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p, int pt)
{
    pause_point("cuGraphInstantiate:entry"); /* before it reads *p (taken here, not again in instantiate) */
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = instantiate(e, g, p->flags, p->hUploadStream, pt);
    p->hErrNode_out = NULL;
    p->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return r;
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    return with_params(e, g, p, 0);
}

EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    return with_params(e, g, p, 1);
}

/* Map the executable graph's pages in the graph pools (once, until a trim unmaps it). */
static CUresult graph_map(struct CUgraphExec_st *x)
{
    pthread_mutex_lock(&g_mu);
    if (x->mapped) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_SUCCESS;
    }
    int done = 0;
    CUresult r = CUDA_SUCCESS;
    for (; done < g_nvis && r == CUDA_SUCCESS; done++) {
        unsigned long long need = x->foot[done], have = g_gpool[done].reserved - g_gpool[done].used;
        if (need > have && (r = charge(done, (long long)(need - have), 0)) == CUDA_SUCCESS)
            g_gpool[done].reserved += need - have;
        if (r == CUDA_SUCCESS)
            g_gpool[done].used += need;
    }
    if (r != CUDA_SUCCESS) /* what was mapped on the devices before stays reserved (a trim frees it) */
        for (int d = 0; d < done - 1; d++)
            g_gpool[d].used -= x->foot[d];
    for (int d = 0; r == CUDA_SUCCESS && d < g_nvis; d++) {
        if (g_gpool[d].used > g_gpool[d].used_high)
            g_gpool[d].used_high = g_gpool[d].used;
        if (g_gpool[d].reserved > g_gpool[d].reserved_high)
            g_gpool[d].reserved_high = g_gpool[d].reserved;
    }
    x->mapped = r == CUDA_SUCCESS;
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* An instantiation that uploads (CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) maps the graph's pages at
 * once (or fails), and queues the upload on its stream: until the stream reaches it (the work
 * queued there before it done), the pages are in use: cuDeviceGraphMemTrim leaves them, and a
 * cuGraphExecDestroy meanwhile gives them back to the pool only then (uploads_reap). */
static CUresult instantiate(CUgraphExec *e, CUgraph g, unsigned long long flags, CUstream upload, int pt)
{
    NEED_INIT();
    pause_point("cuGraphInstantiate:entry"); /* before it reads the graph */
    if (!e || !valid_graph(g))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *x = obj_new(R_EXEC, sizeof *x);
    if (!x || flatten(x, g) != 0) {
        if (x) {
            free(x->nodes);
            free(x->mem);
        }
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (x->nmem && g->has_exec) { /* one executable graph at a time for a graph with memory nodes */
        free(x->nodes);
        free(x->mem);
        free(x);
        return CUDA_ERROR_INVALID_VALUE;
    }
    x->magic = M_EXEC;
    x->flags = flags;
    x->graph = g;
    footprint(x);
    if ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) && graph_map(x) != CUDA_SUCCESS) {
        free(x->nodes);
        free(x->mem);
        free(x);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct CUstream_st *us = flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD ? stream_of(upload, pt) : NULL;
    unsigned long long now = fg_now_ns(), queued = us ? __atomic_load_n(&us->busy_until, __ATOMIC_ACQUIRE) : 0;
    x->upload_until = queued > now ? queued : 0;
    pthread_mutex_lock(&g_mu);
    if (x->nmem)
        g->has_exec = 1;
    x->next = g_execs;
    g_execs = x;
    pthread_mutex_unlock(&g_mu);
    *e = x;
    pause_point("cuGraphInstantiate");
    return CUDA_SUCCESS;
}

static CUresult graph_upload(CUgraphExec e, CUstream s, int pt)
{
    NEED_CTX(c);
    if (!e || e->magic != M_EXEC || !stream_of(s, pt))
        return CUDA_ERROR_INVALID_VALUE;
    return graph_map(e);
}

EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s) { return graph_upload(e, s, 0); }
EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s) { return graph_upload(e, s, 1); }

static CUresult graph_launch(CUgraphExec e, CUstream s, int pt)
{
    NEED_CTX(c);
    if (!e || e->magic != M_EXEC)
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUstream_st *st = stream_of(s, pt);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    if (e->live) { /* allocations of the last launch still out */
        if (!(e->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH))
            return CUDA_ERROR_INVALID_VALUE;
        for (int i = 0; i < e->nmem; i++)
            if (!e->mem[i].freed_in_graph)
                free_dev(e->mem[i].dptr, 1);
    }
    CUresult r = graph_map(e);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < e->nmem; i++)
        if (!e->mem[i].freed_in_graph) {
            ptrmap_put(&g_allocs, e->mem[i].dptr,
                       (ptrmap_val){.size = e->mem[i].size, .aux = (uint64_t)(uintptr_t)e, .dev = e->mem[i].dev,
                                    .kind = K_GRAPH});
            e->live++;
        }
    pthread_mutex_unlock(&g_mu);
    return e->n ? run_kernels(st, e->nodes, e->n) : CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) { return graph_launch(e, s, 0); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return graph_launch(e, s, 1); }

/* An executable graph's pages go back to the pool (still reserved); its live allocations stay
 * valid (freed with cuMemFree[Async], which finds no graph then). */
EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
    NEED_INIT();
    if (!e || e->magic != M_EXEC)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_mu);
    for (struct CUgraphExec_st **p = &g_execs; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    fg_upload_left *left = e->mapped && fg_now_ns() < e->upload_until ? malloc(sizeof *left) : NULL;
    if (left) { /* its upload still queued: its pages stay in use until the stream reaches it */
        memcpy(left->foot, e->foot, sizeof left->foot);
        left->until = e->upload_until;
        left->next = g_uploads_left;
        g_uploads_left = left;
    } else if (e->mapped) {
        for (int d = 0; d < g_nvis; d++)
            g_gpool[d].used -= e->foot[d];
    }
    for (int i = 0; i < e->nmem; i++) {
        ptrmap_val *v = ptrmap_get(&g_allocs, e->mem[i].dptr);
        if (v && v->kind == K_GRAPH && v->aux == (uint64_t)(uintptr_t)e)
            v->aux = 0;
    }
    if (e->nmem && e->graph && e->graph->magic == M_GRAPH)
        e->graph->has_exec = 0;
    pthread_mutex_unlock(&g_mu);
    e->magic = 0;
    free(e->nodes);
    free(e->mem);
    obj_free(R_EXEC, e);
    after_free();
    return CUDA_SUCCESS;
}

static void graph_free(struct CUgraph_st *g)
{
    for (int i = 0; i < g->n; i++) {
        if (g->nodes[i]->child)
            graph_free(g->nodes[i]->child);
        g->nodes[i]->magic = 0;
        free(g->nodes[i]);
    }
    g->magic = 0;
    free(g->nodes);
    free(g);
}

EXPORT CUresult cuGraphDestroy(CUgraph g)
{
    NEED_INIT();
    if (!valid_graph(g))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    for (struct CUgraphExec_st *x = g_execs; x; x = x->next)
        if (x->graph == g)
            x->graph = NULL;
    pthread_mutex_unlock(&g_mu);
    graph_free(g);
    return CUDA_SUCCESS;
}

/* The pages of destroyed executable graphs whose queued upload the stream has reached go back to
 * the pool (g_mu held). */
static void uploads_reap(void)
{
    unsigned long long now = fg_now_ns();
    for (fg_upload_left **p = &g_uploads_left; *p;) {
        fg_upload_left *l = *p;
        if (now < l->until) {
            p = &l->next;
            continue;
        }
        for (int d = 0; d < g_nvis; d++)
            g_gpool[d].used -= l->foot[d];
        *p = l->next;
        free(l);
    }
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    NEED_INIT();
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    uploads_reap();
    unsigned long long now = fg_now_ns();
    for (struct CUgraphExec_st *x = g_execs; x; x = x->next)
        if (x->mapped && !x->live && x->foot[dev] && now >= x->upload_until) { /* idle: its pages can go */
            g_gpool[dev].used -= x->foot[dev];
            x->mapped = 0;
        }
    unsigned long long rel = g_gpool[dev].reserved - g_gpool[dev].used;
    g_gpool[dev].reserved -= rel;
    pthread_mutex_unlock(&g_mu);
    if (rel)
        charge(dev, -(long long)rel, 0);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value)
{
    NEED_INIT();
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    cuuint64_t *v = value;
    pthread_mutex_lock(&g_mu);
    uploads_reap();
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *v = g_gpool[dev].used; break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *v = g_gpool[dev].used_high; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *v = g_gpool[dev].reserved; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *v = g_gpool[dev].reserved_high; break;
    default: pthread_mutex_unlock(&g_mu); return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value)
{
    NEED_INIT();
    if (!valid_dev(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!value || *(cuuint64_t *)value) /* a high watermark can only be reset to zero */
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
        g_gpool[dev].used_high = g_gpool[dev].used;
    else if (attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
        g_gpool[dev].reserved_high = g_gpool[dev].reserved;
    pthread_mutex_unlock(&g_mu);
    return attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH || attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH ? CUDA_SUCCESS
                                                                                                : CUDA_ERROR_INVALID_VALUE;
}

/* Stream capture (created streams only): kernels, stream-ordered allocations and their frees on
 * a capturing stream become nodes of its graph, one after the other; nothing runs or allocates.
 * cuStreamSynchronize or cuStreamQuery of a capturing stream, which capture forbids, fails with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture: its status is then
 * CU_STREAM_CAPTURE_STATUS_INVALIDATED (cuStreamGetCaptureInfo gives no id, graph or
 * dependencies: only an active capture's are valid), what is queued on the stream fails with
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (nothing allocated or run), and cuStreamEndCapture ends it
 * with that error and a NULL graph. */
static CUresult capture_invalidate(struct CUstream_st *st)
{
    st->capture_invalid = 1;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

static CUresult begin_capture(CUstream s, int pt)
{
    NEED_CTX(c);
    struct CUstream_st *st = stream_of(s, pt);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    if (st == &g_null_stream[c->dev] || st == &t_pt_stream[c->dev])
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (st->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    CUgraph g;
    CUresult r = cuGraphCreate(&g, 0);
    if (r == CUDA_SUCCESS) {
        static unsigned long long ids;
        st->capture = g;
        st->capture_id = __atomic_add_fetch(&ids, 1, __ATOMIC_RELAXED);
        st->capture_last = NULL;
        st->capture_invalid = 0;
    }
    return r;
}

EXPORT CUresult cuStreamBeginCapture(CUstream s) { return begin_capture(s, 0); }
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s) { return begin_capture(s, 1); }
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
    (void)mode;
    return begin_capture(s, 0);
}
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
    (void)mode;
    return begin_capture(s, 1);
}

static CUresult end_capture(CUstream s, CUgraph *g, int pt)
{
    NEED_INIT();
    pause_point("cuStreamEndCapture"); /* before it reads the stream's capture */
    struct CUstream_st *st = stream_of(s, pt);
    if (!st || !g)
        return CUDA_ERROR_INVALID_VALUE;
    if (!st->capture)
        return CUDA_ERROR_ILLEGAL_STATE;
    int invalid = st->capture_invalid;
    CUgraph got = st->capture;
    st->capture = NULL;
    st->capture_last = NULL;
    st->capture_invalid = 0;
    if (invalid) {
        cuGraphDestroy(got);
        *g = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *g = got;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { return end_capture(s, g, 0); }
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { return end_capture(s, g, 1); }

static CUresult is_capturing(CUstream s, CUstreamCaptureStatus *out, int pt)
{
    NEED_INIT();
    struct CUstream_st *st = stream_of(s, pt);
    if (!st || !out)
        return CUDA_ERROR_INVALID_VALUE;
    *out = !st->capture            ? CU_STREAM_CAPTURE_STATUS_NONE
           : st->capture_invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                 : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *out) { return is_capturing(s, out, 0); }
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *out) { return is_capturing(s, out, 1); }

/* The capture's status and id (unique per capture in the process; left as it was unless the capture
 * is active, as the driver gives valid data then only). The _v2 form's graph and dependencies are
 * the graph being captured and its last node (NULL and 0 unless active). */
static CUresult capture_info(CUstream s, CUstreamCaptureStatus *out, cuuint64_t *id, CUgraph *g,
                             const CUgraphNode **deps, size_t *ndeps, int pt)
{
    NEED_INIT();
    struct CUstream_st *st = stream_of(s, pt);
    if (!st || !out)
        return CUDA_ERROR_INVALID_VALUE;
    int active = st->capture && !st->capture_invalid;
    *out = !st->capture ? CU_STREAM_CAPTURE_STATUS_NONE
           : active     ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                        : CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    if (active && id)
        *id = st->capture_id;
    if (g)
        *g = active ? st->capture : NULL;
    if (deps)
        *deps = active && st->capture_last ? &st->capture_last : NULL;
    if (ndeps)
        *ndeps = active && st->capture_last ? 1 : 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *out, cuuint64_t *id)
{
    return capture_info(s, out, id, NULL, NULL, NULL, 0);
}
EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream s, CUstreamCaptureStatus *out, cuuint64_t *id)
{
    return capture_info(s, out, id, NULL, NULL, NULL, 1);
}
EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *out, cuuint64_t *id, CUgraph *g,
                                          const CUgraphNode **deps, size_t *ndeps)
{
    return capture_info(s, out, id, g, deps, ndeps, 0);
}

static CUresult capture_alloc(struct CUstream_st *st, CUdeviceptr *dptr, size_t size, int dev)
{
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev}};
    if (st->capture_invalid)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    CUgraphNode node, last = st->capture_last;
    CUresult r = add_alloc_node(&node, st->capture, last ? &last : NULL, last ? 1 : 0, &props, size, dptr);
    if (r == CUDA_SUCCESS)
        st->capture_last = node;
    return r;
}

static CUresult capture_free(struct CUstream_st *st, CUdeviceptr dptr)
{
    if (st->capture_invalid)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    CUgraphNode node, last = st->capture_last;
    CUresult r = cuGraphAddMemFreeNode(&node, st->capture, last ? &last : NULL, last ? 1 : 0, dptr);
    if (r == CUDA_SUCCESS)
        st->capture_last = node;
    return r;
}

/* ---- cuGetProcAddress ---- */

typedef struct {
    const char *base;
    int since;      /* first CUDA version that returns this variant */
    int per_thread; /* 1 = _ptsz/_ptds variant */
    void *fn;
} proc_entry;

#define E(base, since, fn) {base, since, 0, (void *)fn}
#define PT(base, since, fn) {base, since, 1, (void *)fn}
static const proc_entry g_procs[] = {
    E("cuInit", 2000, cuInit), E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    E("cuGetErrorString", 6000, cuGetErrorString), E("cuGetErrorName", 6000, cuGetErrorName),
    E("cuGetExportTable", 3000, cuGetExportTable),
    E("cuDeviceGetCount", 2000, cuDeviceGetCount), E("cuDeviceGet", 2000, cuDeviceGet),
    E("cuDeviceGetName", 2000, cuDeviceGetName), E("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    E("cuDeviceGetUuid", 11040, uuid_v2), E("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId),
    E("cuDeviceGetByPCIBusId", 4010, cuDeviceGetByPCIBusId),
    E("cuDeviceTotalMem", 2000, cuDeviceTotalMem), E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    E("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    E("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    E("cuDevicePrimaryCtxSetFlags", 7000, cuDevicePrimaryCtxSetFlags),
    E("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2),
    E("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    E("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    E("cuCtxCreate", 2000, cuCtxCreate), E("cuCtxCreate", 3020, cuCtxCreate_v2),
    E("cuCtxCreate", 11040, cuCtxCreate_v3), E("cuCtxCreate", 12050, cuCtxCreate_v4),
    E("cuCtxDestroy", 2000, cuCtxDestroy), E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    E("cuCtxGetCurrent", 4000, cuCtxGetCurrent), E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2), E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    E("cuCtxGetDevice", 2000, cuCtxGetDevice), E("cuCtxGetLimit", 3010, cuCtxGetLimit),
    E("cuCtxSetLimit", 3010, cuCtxSetLimit), E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    E("cuMemGetInfo", 2000, cuMemGetInfo), E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    E("cuMemAlloc", 2000, cuMemAlloc), E("cuMemAlloc", 3020, cuMemAlloc_v2),
    E("cuMemFree", 2000, cuMemFree), E("cuMemFree", 3020, cuMemFree_v2),
    E("cuMemAllocManaged", 6000, cuMemAllocManaged), E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    E("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    E("cuMemAllocHost", 3020, cuMemAllocHost_v2), E("cuMemHostAlloc", 2020, cuMemHostAlloc),
    E("cuMemFreeHost", 2000, cuMemFreeHost), E("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    E("cuMemHostUnregister", 4000, cuMemHostUnregister),
    E("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    E("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2), E("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    E("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2), E("cuMemsetD8", 3020, cuMemsetD8_v2),
    E("cuMemsetD32", 3020, cuMemsetD32_v2), E("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    E("cuArrayCreate", 2000, cuArrayCreate), E("cuArrayCreate", 3020, cuArrayCreate_v2),
    E("cuArray3DCreate", 2000, cuArray3DCreate), E("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    E("cuArrayDestroy", 2000, cuArrayDestroy), E("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    E("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    E("cuMemAllocAsync", 11020, cuMemAllocAsync), PT("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    E("cuMemFreeAsync", 11020, cuMemFreeAsync), PT("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    E("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    PT("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
    E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    E("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool), E("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
    E("cuMemPoolCreate", 11020, cuMemPoolCreate), E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    E("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo), E("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    E("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    E("cuMemCreate", 10020, cuMemCreate), E("cuMemRelease", 10020, cuMemRelease),
    E("cuMemAddressReserve", 10020, cuMemAddressReserve), E("cuMemAddressFree", 10020, cuMemAddressFree),
    E("cuMemMap", 10020, cuMemMap), E("cuMemUnmap", 10020, cuMemUnmap),
    E("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
    E("cuMemSetAccess", 10020, cuMemSetAccess),
    E("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    E("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    E("cuModuleLoad", 2000, cuModuleLoad), E("cuModuleLoadData", 2000, cuModuleLoadData),
    E("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx), E("cuModuleUnload", 2000, cuModuleUnload),
    E("cuModuleGetFunction", 2000, cuModuleGetFunction),
    E("cuLaunchKernel", 4000, cuLaunchKernel), PT("cuLaunchKernel", 7000, cuLaunchKernel_ptsz),
    E("cuFuncSetBlockShape", 2000, cuFuncSetBlockShape), E("cuLaunch", 2000, cuLaunch),
    E("cuLaunchGrid", 2000, cuLaunchGrid), E("cuLaunchGridAsync", 2000, cuLaunchGridAsync),
    E("cuLaunchKernelEx", 11060, cuLaunchKernelEx), PT("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz),
    E("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    E("cuLaunchCooperativeKernelMultiDevice", 9000, cuLaunchCooperativeKernelMultiDevice),
    E("cuLaunchHostFunc", 10000, cuLaunchHostFunc), PT("cuLaunchHostFunc", 10000, cuLaunchHostFunc_ptsz),
    PT("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel_ptsz),
    E("cuStreamCreate", 2000, cuStreamCreate), E("cuStreamGetCtx", 9020, cuStreamGetCtx), E("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    E("cuStreamSynchronize", 2000, cuStreamSynchronize), PT("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz),
    E("cuStreamQuery", 2000, cuStreamQuery), PT("cuStreamQuery", 7000, cuStreamQuery_ptsz),
    E("cuEventCreate", 2000, cuEventCreate), E("cuEventRecord", 2000, cuEventRecord),
    PT("cuEventRecord", 7000, cuEventRecord_ptsz), E("cuEventSynchronize", 2000, cuEventSynchronize),
    E("cuEventQuery", 2000, cuEventQuery), E("cuEventElapsedTime", 2000, cuEventElapsedTime),
    E("cuEventElapsedTime", 12080, cuEventElapsedTime_v2), E("cuEventDestroy", 4000, cuEventDestroy_v2),
    E("cuGraphCreate", 10000, cuGraphCreate), E("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
    E("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
    E("cuGraphInstantiate", 10000, cuGraphInstantiate), E("cuGraphInstantiate", 11000, cuGraphInstantiate_v2),
    E("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    E("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams),
    PT("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams_ptsz),
    E("cuGraphUpload", 11010, cuGraphUpload), PT("cuGraphUpload", 11010, cuGraphUpload_ptsz),
    E("cuGraphLaunch", 10000, cuGraphLaunch), PT("cuGraphLaunch", 10000, cuGraphLaunch_ptsz),
    E("cuGraphExecDestroy", 10000, cuGraphExecDestroy), E("cuGraphDestroy", 10000, cuGraphDestroy),
    E("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode), E("cuGraphAddMemFreeNode", 11040, cuGraphAddMemFreeNode),
    E("cuGraphMemAllocNodeGetParams", 11040, cuGraphMemAllocNodeGetParams),
    E("cuGraphMemFreeNodeGetParams", 11040, cuGraphMemFreeNodeGetParams),
    E("cuGraphAddNode", 12020, cuGraphAddNode), E("cuGraphAddNode", 12030, cuGraphAddNode_v2),
    E("cuGraphChildGraphNodeGetGraph", 10000, cuGraphChildGraphNodeGetGraph),
    E("cuGraphGetNodes", 10000, cuGraphGetNodes), E("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
    E("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
    E("cuDeviceGetGraphMemAttribute", 11040, cuDeviceGetGraphMemAttribute),
    E("cuDeviceSetGraphMemAttribute", 11040, cuDeviceSetGraphMemAttribute),
    E("cuStreamBeginCapture", 10000, cuStreamBeginCapture), PT("cuStreamBeginCapture", 10000, cuStreamBeginCapture_ptsz),
    E("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    PT("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2_ptsz),
    E("cuStreamEndCapture", 10000, cuStreamEndCapture), PT("cuStreamEndCapture", 10000, cuStreamEndCapture_ptsz),
    E("cuStreamIsCapturing", 10000, cuStreamIsCapturing), PT("cuStreamIsCapturing", 10000, cuStreamIsCapturing_ptsz),
    E("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo),
    PT("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo_ptsz),
    E("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2),
    E("cuGetProcAddress", 11030, cuGetProcAddress), E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

/* Highest variant of `sym` with since <= version; per-thread variants when asked for and
 * present. Returns the status the _v2 API reports. */
static CUdriverProcAddressQueryResult find_proc(const char *sym, int version, cuuint64_t flags, void **out)
{
    int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, any = 0;
    int has_pt = 0;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++)
        if (!strcmp(g_procs[i].base, sym) && g_procs[i].per_thread)
            has_pt = 1;
    int pt = want_pt && has_pt;
    const proc_entry *best = NULL;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const proc_entry *e = &g_procs[i];
        if (strcmp(e->base, sym) || e->per_thread != pt || (e->fn == (void *)uuid_v2 && uuid_v2_hidden()))
            continue;
        any = 1;
        if (e->since <= version && (!best || e->since > best->since))
            best = e;
    }
    *out = best ? best->fn : NULL;
    if (best)
        return CU_GET_PROC_ADDRESS_SUCCESS;
    return any ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    CUdriverProcAddressQueryResult st = find_proc(symbol, version, flags, pfn);
    if (status)
        *status = st;
    return st == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
