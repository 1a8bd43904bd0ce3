/* libvgpu: CUDA driver hooks, initialization, the hook table and cuGetProcAddress. */
#include "vgpu.h"

#include "../common/ptrmap.h"
#include "limiter.h"

#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

HIDDEN extern __thread int vgpu_in_init;
vgpu_launch_gate_fn vgpu_launch_gate;
int vgpu_inited;
int vgpu_refused;

/* ---- hooked CUDA functions: name, cuGetProcAddress base, since, per-thread ---- */
#define CUDA_HOOKS(X)                                                                              \
    X(cuInit, "cuInit", 2000, 0)                                                                   \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                                              \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)                                           \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0)                               \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0)                             \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0)                         \
    X(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, 0)                                 \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0)                             \
    X(cuCtxCreate, "cuCtxCreate", 2000, 0)                                                         \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0)                                                      \
    X(cuCtxCreate_v3, "cuCtxCreate", 11040, 0)                                                     \
    X(cuCtxCreate_v4, "cuCtxCreate", 12050, 0)                                                     \
    X(cuCtxDestroy, "cuCtxDestroy", 2000, 0)                                                       \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                                                    \
    X(cuCtxSetLimit, "cuCtxSetLimit", 3010, 0)                                                     \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                                                        \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0)                                             \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)                                              \
    X(cuMemFree_v2, "cuMemFree", 3020, 0)                                                          \
    X(cuArrayCreate, "cuArrayCreate", 2000, 0)                                                     \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 0)                                                  \
    X(cuArray3DCreate, "cuArray3DCreate", 2000, 0)                                                 \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0)                                              \
    X(cuArrayDestroy, "cuArrayDestroy", 2000, 0)                                                   \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0)                                   \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0)                                 \
    X(cuMemCreate, "cuMemCreate", 10020, 0)                                                        \
    X(cuMemRelease, "cuMemRelease", 10020, 0)                                                      \
    X(cuMemMap, "cuMemMap", 10020, 0)                                                              \
    X(cuMemUnmap, "cuMemUnmap", 10020, 0)                                                          \
    X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 11000, 0)                        \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0)                                                \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1)                                           \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0)                                \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1)                           \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0)                                                  \
    X(cuMemPoolCreate, "cuMemPoolCreate", 11020, 0)                                                \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, 0)                            \
    X(cuDeviceGetMemPool, "cuDeviceGetMemPool", 11020, 0)                                          \
    X(cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020, 0)                                                \
    X(cuDeviceSetMemPool, "cuDeviceSetMemPool", 11020, 0)                                          \
    X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 11020, 0)                                    \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, 0)                                              \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1)                                             \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                                                    \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)                                            \
    X(cuLaunchKernel, "cuLaunchKernel", 4000, 0)                                                   \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1)                                              \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0)                                              \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)                                         \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0)                             \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1)                        \
    X(cuLaunchCooperativeKernelMultiDevice, "cuLaunchCooperativeKernelMultiDevice", 9000, 0)       \
    X(cuLaunch, "cuLaunch", 2000, 0)                                                               \
    X(cuLaunchGrid, "cuLaunchGrid", 2000, 0)                                                       \
    X(cuLaunchGridAsync, "cuLaunchGridAsync", 2000, 0)                                             \
    X(cuGraphLaunch, "cuGraphLaunch", 10000, 0)                                                    \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)                                               \
    X(cuGraphInstantiate, "cuGraphInstantiate", 10000, 0)                                          \
    X(cuGraphInstantiate_v2, "cuGraphInstantiate", 11000, 0)                                       \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040, 0)                        \
    X(cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", 12000, 0)                      \
    X(cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams", 12000, 1)                 \
    X(cuGraphUpload, "cuGraphUpload", 11010, 0)                                                    \
    X(cuGraphUpload_ptsz, "cuGraphUpload", 11010, 1)                                               \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", 10000, 0)                                          \
    X(cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", 11040, 0)                                      \
    X(cuStreamEndCapture, "cuStreamEndCapture", 10000, 0)                                          \
    X(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 10000, 1)

/* Real functions used internally without being hooked. */
#define CUDA_PLAIN(X)                                                                              \
    X(cuCtxGetDevice) X(cuCtxGetCurrent) X(cuDeviceGetCount) X(cuDeviceGetUuid_v2) X(cuDeviceGetUuid)  \
    X(cuCtxGetLimit)                                                                                   \
    X(cuDeviceGetAttribute) X(cuStreamGetCtx) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2)            \
    X(cuMemPoolGetAttribute) X(cuStreamIsCapturing) X(cuStreamSynchronize) X(cuPointerGetAttribute)    \
    X(cuGraphGetNodes)                                                                                 \
    X(cuGraphNodeGetType) X(cuGraphMemAllocNodeGetParams) X(cuGraphChildGraphNodeGetGraph)             \
    X(cuDeviceGetGraphMemAttribute)

#define NVML_HOOKS(X)                                                                              \
    X(nvmlInit, "nvmlInit", 0, 0)                                                                  \
    X(nvmlInit_v2, "nvmlInit_v2", 0, 0)                                                            \
    X(nvmlInitWithFlags, "nvmlInitWithFlags", 0, 0)                                                \
    X(nvmlDeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo", 0, 0)                                    \
    X(nvmlDeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2", 0, 0)

#define DECL_REAL(name, ...) static __typeof__(&name) r_##name;
CUDA_HOOKS(DECL_REAL)
#define DECL_PLAIN(name) static __typeof__(&name) p_##name;
CUDA_PLAIN(DECL_PLAIN)
#define DECL_NVML_REAL(name, ...) HIDDEN __typeof__(&name) vgpu_real_##name;
NVML_HOOKS(DECL_NVML_REAL)

#define ENTRY(name, base, since, pt) {#name, base, since, pt, (void *)name, (void **)&r_##name},
#define NVML_ENTRY(name, base, since, pt) {#name, base, since, pt, (void *)name, (void **)&vgpu_real_##name},
const vgpu_hook vgpu_hooks[] = {CUDA_HOOKS(ENTRY) NVML_HOOKS(NVML_ENTRY)};
const int vgpu_nhooks = (int)(sizeof vgpu_hooks / sizeof vgpu_hooks[0]);

const vgpu_hook *vgpu_hook_by_name(const char *name)
{
    for (int i = 0; i < vgpu_nhooks; i++)
        if (!strcmp(vgpu_hooks[i].name, name))
            return &vgpu_hooks[i];
    return NULL;
}

/* ---- process-local tracking ---- */
enum { T_DATA = 1, T_ARRAY, T_VMM, T_CTX, T_ASYNC, T_LIMIT, T_LIMIT_BASE };
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static ptrmap g_ptrs;    /* device pointer -> charged bytes */
static ptrmap g_handles; /* arrays, VMM handles, created contexts */
static ptrmap g_pools;   /* memory pool -> where it allocates (pool_dev), its cached memory charged (pool_settle) */
static ptrmap g_pool_keep; /* memory pool -> its release threshold (size), once read or set */
static CUmemoryPool g_cur_pool[VGPU_MAX_DEV]; /* CUDA device -> its current pool (cuMemAllocAsync's) */
static ptrmap g_maps;    /* VMM mapping address -> its handle (aux) and size */
static ptrmap g_limits;  /* context limit records (limit_key): charge (T_LIMIT), first value (T_LIMIT_BASE) */
/* cuCtxSetLimit against context teardown (destroy, reset, last release): a limit is charged to a
 * context that still exists, and a teardown drops every record of its context */
static pthread_mutex_t g_limit_mu = PTHREAD_MUTEX_INITIALIZER;
/* a pool's settle (the driver's figures read, then applied) as one: an older reading applied
 * after a newer one left the wrong charge until the pool's next call */
static pthread_mutex_t g_settle_mu = PTHREAD_MUTEX_INITIALIZER;
/* CUDA graph memory: orders its maps, trims and settles (graph_map) */
static pthread_mutex_t g_graph_mu = PTHREAD_MUTEX_INITIALIZER;
/* Stream capture against the stream-ordered allocations: read-held by cuMemAllocAsync and
 * cuMemAllocFromPoolAsync (+ _ptsz) from their look at the stream's capture through the driver
 * call, write-held by cuStreamEndCapture (+ _ptsz) around the driver call (capture_hold). The
 * default kind, which lets a reader in while a writer waits: a reader never waits for a reader. */
static pthread_rwlock_t g_capture_rw = PTHREAD_RWLOCK_INITIALIZER;
/* VMM hooks but cuMemCreate, each from its record change through the driver call to its settle
 * (cuMemCreate: the creates in flight, g_vmm_creates, numbered by g_vmm_started, both under g_mu,
 * and g_vmm_cv, with g_mu, signalled once one recorded) */
static pthread_mutex_t g_vmm_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_vmm_cv = PTHREAD_COND_INITIALIZER;
typedef struct vmm_create_fl {
    uint64_t ticket;
    struct vmm_create_fl *next;
} vmm_create_fl;
static vmm_create_fl *g_vmm_creates;
static uint64_t g_vmm_started;
static int g_cuda2reg[VGPU_MAX_DEV];
static int g_ndev = -1;
static int g_primary_refs[VGPU_MAX_DEV];
static CUcontext g_primary_ctx[VGPU_MAX_DEV];
static uint64_t g_ctx_size[VGPU_MAX_DEV];
static uint64_t g_primary_charged[VGPU_MAX_DEV]; /* under g_mu: what the retained primary context holds */
static int g_ctx_measured[VGPU_MAX_DEV];
static void *g_nvml;

static void track_aux(ptrmap *m, uint64_t key, uint64_t bytes, int dev, int kind, uint64_t aux)
{
    pthread_mutex_lock(&g_mu);
    ptrmap_put(m, key, (ptrmap_val){.size = bytes, .aux = aux, .dev = dev, .kind = kind});
    pthread_mutex_unlock(&g_mu);
}

/* Context-bound allocations remember their context: the driver frees them with it. */
static void track(ptrmap *m, uint64_t key, uint64_t bytes, int dev, int kind)
{
    CUcontext ctx = NULL;
    if ((kind == T_DATA || kind == T_ARRAY) && p_cuCtxGetCurrent)
        p_cuCtxGetCurrent(&ctx);
    track_aux(m, key, bytes, dev, kind, (uint64_t)(uintptr_t)ctx);
}

static int untrack(ptrmap *m, uint64_t key, ptrmap_val *out)
{
    pthread_mutex_lock(&g_mu);
    int found = ptrmap_del(m, key, out);
    pthread_mutex_unlock(&g_mu);
    return found;
}

/* Destroys and frees: the record of what the driver is about to free comes out of the ledger's
 * maps *before* the driver call, and goes back if the call fails; its charge is released only once
 * the call succeeded. Taken out after the call (as these hooks once did), the handle was already
 * free: another thread's create could be given the same value in between, and the late clean-up
 * then overwrote or deleted that thread's record and released its charge (memory held, uncharged;
 * found by review, 1 Dec). cuMemFree_v2 always worked this way. */

/* untrack, for a record of `kind` only. */
static int untrack_kind(ptrmap *m, uint64_t key, int kind, ptrmap_val *out)
{
    pthread_mutex_lock(&g_mu);
    ptrmap_val *v = ptrmap_get(m, key);
    int found = v && v->kind == kind && ptrmap_del(m, key, out);
    pthread_mutex_unlock(&g_mu);
    return found;
}

/* A record taken out before a driver call that then failed: back in. */
static void put_back(ptrmap *m, uint64_t key, const ptrmap_val *v)
{
    pthread_mutex_lock(&g_mu);
    ptrmap_put(m, key, *v);
    pthread_mutex_unlock(&g_mu);
}

/* Sizes are rounded and multiplied with saturation: a result that would wrap 64 bits becomes
 * UINT64_MAX, which vgpu_reserve refuses (above VGPU_MAX_CHARGE) with CUDA_ERROR_OUT_OF_MEMORY
 * before the driver is called -- what the driver itself answers for a size no device has. A
 * wrapped size used to pass the check as a small one; the driver then failed the call and the
 * roll-back released the huge figure, zeroing the process's whole charge. */
#define ROUND_MAX (UINT64_MAX - (2ULL << 20))

static uint64_t round_to(uint64_t size, uint64_t a)
{
    return size > ROUND_MAX ? UINT64_MAX : (size + a - 1) / a * a;
}

static uint64_t round_alloc(uint64_t size)
{
    return round_to(size, size >= (2ULL << 20) ? (2ULL << 20) : 512);
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* ---- initialization ---- */

void *vgpu_nvml_sym(const char *name)
{
    if (!g_nvml)
        return NULL;
    return vgpu_real_dlsym_fn(g_nvml, name);
}

static void graph_after_fork(void);

static void after_fork_child(void)
{
    pthread_mutex_init(&g_mu, NULL);
    pthread_mutex_init(&g_limit_mu, NULL); /* a thread of the parent may have held it */
    pthread_mutex_init(&g_settle_mu, NULL);
    pthread_mutex_init(&g_graph_mu, NULL);
    pthread_rwlock_init(&g_capture_rw, NULL);
    pthread_mutex_init(&g_vmm_mu, NULL);
    pthread_cond_init(&g_vmm_cv, NULL);
    g_vmm_creates = NULL; /* a create of another thread never records here */
    free(g_limits.slots);
    memset(&g_limits, 0, sizeof g_limits);
    free(g_ptrs.slots);
    free(g_handles.slots);
    free(g_pools.slots);
    free(g_pool_keep.slots);
    memset(&g_pool_keep, 0, sizeof g_pool_keep);
    memset(g_cur_pool, 0, sizeof g_cur_pool);
    free(g_maps.slots);
    memset(&g_maps, 0, sizeof g_maps);
    memset(&g_ptrs, 0, sizeof g_ptrs);
    memset(&g_handles, 0, sizeof g_handles);
    memset(&g_pools, 0, sizeof g_pools);
    memset(g_primary_refs, 0, sizeof g_primary_refs);
    graph_after_fork();
    vgpu_region_after_fork();
}

/* The device plugin's NRI mode (docs/nri.md): Allocate gives every GPU container this library
 * preloaded, a file mounted at <hook>/vgpu/PENDING_MARKER and HAMI_NRI_INJECTION=pending; the NRI
 * hook, when the runtime creates the container, sets the grant and `done`, and removes that mount.
 * Either still there means the hook never served this container (it was away): whatever GPUs the
 * container sees (an image's own NVIDIA_VISIBLE_DEVICES=all) are not its grant, so CUDA and NVML
 * report none. The mount is what a pod cannot undo (an envFrom can replace the variable): it is
 * looked up in the process's mount table, by the name of its mount point, not beside the path the
 * library was loaded under (a pod's LD_PRELOAD could name a copy elsewhere) nor as a plain file (a
 * pod could create one in a directory it may write, a shared DRA claim's). */

static const char *grant_missing(void)
{
    const char *marker = getenv("HAMI_NRI_INJECTION");
    if (marker && !strcmp(marker, "pending"))
        return "HAMI_NRI_INJECTION=pending";
    if (vgpu_mounts()->pending)
        return "<hook>/vgpu/" PENDING_MARKER " is mounted";
    return NULL;
}

static void init_once(void)
{
    vgpu_in_init = 1;
    const char *missing = grant_missing();
    if (missing) {
        LOG_ERROR("no GPU: this container's grant was never applied (%s: it was created while the node's "
                  "hami NRI hook was away); it gets its GPUs when it is created again", missing);
        vgpu_refused = 1;
        __atomic_store_n(&vgpu_inited, 1, __ATOMIC_RELEASE);
        vgpu_in_init = 0;
        return;
    }
    vgpu_config_load();
    LOG_INFO("initializing (cache %s)", vgpu_cfg.cache_path);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NODELETE);
    g_nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NODELETE);
    if (!cuda)
        LOG_INFO("libcuda.so.1 not loadable: %s", dlerror());
    if (vgpu_region_open() != 0) {
        LOG_ERROR("no shared region; aborting");
        _exit(78);
    }
    for (int i = 0; cuda && i < vgpu_nhooks; i++)
        if (vgpu_hooks[i].name[0] == 'c')
            *vgpu_hooks[i].real = vgpu_real_dlsym_fn(cuda, vgpu_hooks[i].name);
    for (int i = 0; g_nvml && i < vgpu_nhooks; i++)
        if (vgpu_hooks[i].name[0] == 'n')
            *vgpu_hooks[i].real = vgpu_real_dlsym_fn(g_nvml, vgpu_hooks[i].name);
#define RESOLVE_PLAIN(name) p_##name = cuda ? (__typeof__(p_##name))vgpu_real_dlsym_fn(cuda, #name) : NULL;
    CUDA_PLAIN(RESOLVE_PLAIN)
    pthread_atfork(NULL, NULL, after_fork_child);
    __atomic_store_n(&vgpu_inited, 1, __ATOMIC_RELEASE);
    vgpu_in_init = 0;
}

void vgpu_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    if (LIKELY(__atomic_load_n(&vgpu_inited, __ATOMIC_ACQUIRE)))
        return;
    if (vgpu_in_init)
        return;
    pthread_once(&once, init_once);
}

static void uuid_string(const CUuuid *u, char *out, size_t len)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

/* Set by devmap_build when CUDA shows the process a device its grant does not name
 * (vgpu_device_granted): a pod's own NVIDIA_VISIBLE_DEVICES (an envFrom, which no admission rule
 * reads) could have the runtime show it other GPUs of the node. cuInit then refuses. Also set for a
 * device whose UUID cannot be read: it could be any GPU, and it would map to no device of the region
 * (no limit, no grant check, cuMemGetInfo the physical size), so it is refused rather than unlimited. */
static int g_cuda_ungranted;

/* The UUID of CUDA device `i`: cuDeviceGetUuid_v2 (CUDA 11.4 on: a MIG device's own UUID), else,
 * on an older driver that lacks it, cuDeviceGetUuid (the same for a GPU; such drivers predate the
 * MIG UUIDs of the v2). A v2 that fails is not retried with the v1, which names a MIG device's
 * parent GPU. `*via` names the function asked. */
static CUresult device_uuid(int i, CUuuid *u, const char **via)
{
    *via = p_cuDeviceGetUuid_v2 ? "cuDeviceGetUuid_v2" : "cuDeviceGetUuid";
    if (p_cuDeviceGetUuid_v2)
        return p_cuDeviceGetUuid_v2(u, i);
    return p_cuDeviceGetUuid ? p_cuDeviceGetUuid(u, i) : CUDA_ERROR_NOT_FOUND;
}

/* CUDA ordinal -> region index, by UUID (built once after cuInit succeeded), and whether every
 * device is one the grant names, from the same walk. */
static void devmap_build(void)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    int n = 0;
    if (g_ndev < 0 && p_cuDeviceGetCount && p_cuDeviceGetCount(&n) == CUDA_SUCCESS) {
        for (int i = 0; i < n; i++) {
            CUuuid u;
            char s[VGPU_UUID_LEN];
            const char *via;
            if (i < VGPU_MAX_DEV)
                g_cuda2reg[i] = -1;
            CUresult ur = device_uuid(i, &u, &via);
            if (ur != CUDA_SUCCESS) {
                if (!p_cuDeviceGetUuid_v2 && !p_cuDeviceGetUuid)
                    LOG_ERROR("no GPU: the UUID of CUDA device %d cannot be read (the driver has neither "
                              "cuDeviceGetUuid_v2 nor cuDeviceGetUuid), so its limit and grant cannot be applied; "
                              "CUDA reports no device", i);
                else
                    LOG_ERROR("no GPU: the UUID of CUDA device %d cannot be read (%s returned %d), so its limit and "
                              "grant cannot be applied; CUDA reports no device", i, via, (int)ur);
                __atomic_store_n(&g_cuda_ungranted, 1, __ATOMIC_RELEASE);
                continue;
            }
            uuid_string(&u, s, sizeof s);
            if (!vgpu_device_granted(s)) {
                LOG_ERROR("no GPU: the process sees %s, which its grant does not name (NVIDIA_VISIBLE_DEVICES set by the "
                          "pod?); CUDA reports no device", s);
                __atomic_store_n(&g_cuda_ungranted, 1, __ATOMIC_RELEASE);
            } else if (i < VGPU_MAX_DEV) {
                g_cuda2reg[i] = vgpu_region_dev_for_uuid(s, 1);
            }
        }
        __atomic_store_n(&g_ndev, n < VGPU_MAX_DEV ? n : VGPU_MAX_DEV, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&mu);
}

int vgpu_cuda_dev(int ordinal)
{
    if (UNLIKELY(__atomic_load_n(&g_ndev, __ATOMIC_ACQUIRE) < 0))
        devmap_build();
    return ordinal >= 0 && ordinal < g_ndev ? g_cuda2reg[ordinal] : -1;
}

int vgpu_current_dev(void)
{
    CUdevice d;
    if (!p_cuCtxGetDevice || p_cuCtxGetDevice(&d) != CUDA_SUCCESS)
        return -1;
    return vgpu_cuda_dev(d);
}

#define READY_OR(realfn, err)                                                                      \
    do {                                                                                           \
        if (UNLIKELY(!realfn)) {                                                                   \
            vgpu_init();                                                                           \
            if (!realfn)                                                                           \
                return err;                                                                        \
        }                                                                                          \
    } while (0)

EXPORT CUresult cuInit(unsigned int flags)
{
    if (UNLIKELY(!r_cuInit)) {
        vgpu_init();
        if (vgpu_refused)
            return CUDA_ERROR_NO_DEVICE;
        if (!r_cuInit)
            return CUDA_ERROR_NOT_INITIALIZED;
    }
    CUresult r = r_cuInit(flags);
    if (r == CUDA_SUCCESS) {
        vgpu_cuda_dev(0); /* the device map, and the check of every device against the grant */
        if (__atomic_load_n(&g_cuda_ungranted, __ATOMIC_ACQUIRE)) {
            vgpu_refused = 1; /* no context either: a program that goes on after cuInit failed */
            return CUDA_ERROR_NO_DEVICE;
        }
    }
    return r;
}

/* ---- contexts: charge the measured per-context footprint ---- */

typedef struct {
    nvmlDevice_t dev;
    unsigned long long used;
    unsigned pids[64];
    unsigned npids;
} nvml_snap;

static int nvml_ready(void)
{
    static int state; /* 0 unknown, 1 ok, -1 unavailable */
    if (state == 0) {
        __typeof__(&nvmlInit_v2) init = vgpu_real_nvmlInit_v2;
        state = init && init() == NVML_SUCCESS ? 1 : -1;
    }
    return state == 1;
}

static void nvml_snapshot_unguarded(int reg, nvml_snap *s)
{
    memset(s, 0, sizeof *s);
    if (reg < 0 || !nvml_ready())
        return;
    __typeof__(&nvmlDeviceGetHandleByUUID) by_uuid = vgpu_nvml_sym("nvmlDeviceGetHandleByUUID");
    __typeof__(&nvmlDeviceGetComputeRunningProcesses_v3) procs =
        vgpu_nvml_sym("nvmlDeviceGetComputeRunningProcesses_v3");
    char uuid[VGPU_UUID_LEN + 1];
    vgpu_region_uuid(reg, uuid);
    if (!by_uuid || by_uuid(uuid, &s->dev) != NVML_SUCCESS) {
        s->dev = NULL;
        return;
    }
    nvmlMemory_t m;
    if (vgpu_real_nvmlDeviceGetMemoryInfo && vgpu_real_nvmlDeviceGetMemoryInfo(s->dev, &m) == NVML_SUCCESS)
        s->used = m.used;
    nvmlProcessInfo_t info[64];
    unsigned n = 64;
    if (procs && procs(s->dev, &n, info) == NVML_SUCCESS)
        for (unsigned i = 0; i < n && i < 64; i++)
            s->pids[s->npids++] = info[i].pid;
}

/* nvml_snapshot, with libvgpu's own NVML calls marked internal (vgpu.h: vgpu_nvml_internal). */
static void nvml_snapshot(int reg, nvml_snap *s)
{
    vgpu_nvml_internal++;
    nvml_snapshot_unguarded(reg, s);
    vgpu_nvml_internal--;
}

/* Create a context through `create` and charge its footprint to device `cuda_dev`.
 * The first context of the process on a device is measured (NVML used before/after,
 * under the region lock so the container's own processes do not disturb the figure) and
 * the host PID is learnt from the NVML process list difference. */
static CUresult with_context_charge(int cuda_dev, CUresult (*create)(void *), void *arg)
{
    if (UNLIKELY(vgpu_refused)) /* cuInit found a device the grant does not name */
        return CUDA_ERROR_NO_DEVICE;
    int reg = vgpu_cuda_dev(cuda_dev);
    if (reg < 0)
        return create(arg);
    int measure = !__atomic_load_n(&g_ctx_measured[reg], __ATOMIC_ACQUIRE);
    nvml_snap before, after;
    if (measure) {
        vgpu_region_lock();
        /* another thread of this process may have measured while this one waited for the lock:
         * measured again, the figure would hold that thread's context and allocations too */
        measure = !__atomic_load_n(&g_ctx_measured[reg], __ATOMIC_ACQUIRE);
        if (measure)
            nvml_snapshot(reg, &before);
        else
            vgpu_region_unlock();
    }
    CUresult r = create(arg);
    if (measure) {
        if (r == CUDA_SUCCESS) {
            nvml_snapshot(reg, &after);
            uint64_t size = after.used > before.used ? after.used - before.used : 0;
            /* not guessed from this list's difference (racy across containers) */
            vgpu_slot *mine = vgpu_slot_mine();
            int hp = mine ? (int)__atomic_load_n(&mine->hostpid, __ATOMIC_ACQUIRE) : 0;
            if (mine && !hp) {
                hp = lim_resolve_host_pid_on(cuda_dev, reg);
                if (hp)
                    __atomic_store_n(&mine->hostpid, hp, __ATOMIC_RELEASE);
            }
            /* The device's used memory moves with every process on it: another container's
             * context made (or memory freed) between the two snapshots skews the difference, to 0
             * at worst (the context then charged nothing). This process's own figure, once its
             * host PID is known, holds only its new context (the first of the process here). */
            long long own = lim_process_used(reg, hp);
            if (own > 0)
                size = (uint64_t)own;
            if (size > (4ULL << 30))
                size = 0;
            g_ctx_size[reg] = vgpu_cfg.context_size >= 0 ? (uint64_t)vgpu_cfg.context_size : size;
            __atomic_store_n(&g_ctx_measured[reg], 1, __ATOMIC_RELEASE);
            LOG_INFO("device %d: context footprint %llu bytes", reg, (unsigned long long)g_ctx_size[reg]);
        }
        vgpu_region_unlock();
    }
    return r;
}

/* Records bound to a context (its allocations, arrays and limit charges), taken out of the maps
 * before the driver frees them with the context (context_take), then released or put back
 * (context_settle). */
typedef struct {
    ptrmap *m;
    uint64_t key;
    ptrmap_val v;
} taken_rec;

typedef struct {
    taken_rec *r;
    size_t n, cap;
} taken_list;

static void context_take(CUcontext ctx, taken_list *out)
{
    if (!ctx)
        return;
    ptrmap *maps[3] = {&g_ptrs, &g_handles, &g_limits};
    pthread_mutex_lock(&g_mu);
    for (int m = 0; m < 3; m++)
        for (size_t i = 0; i < maps[m]->cap; i++) {
            ptrmap_slot *s = &maps[m]->slots[i];
            if (s->key > PTRMAP_TOMB &&
                (s->val.kind == T_DATA || s->val.kind == T_ARRAY || s->val.kind == T_LIMIT ||
                 s->val.kind == T_LIMIT_BASE) &&
                s->val.aux == (uint64_t)(uintptr_t)ctx) {
                if (out->n == out->cap) {
                    size_t ncap = out->cap ? out->cap * 2 : 16;
                    taken_rec *nr = realloc(out->r, ncap * sizeof *nr);
                    if (!nr) /* left in: charged still, never released (an over-count, not an escape) */
                        continue;
                    out->r = nr;
                    out->cap = ncap;
                }
                out->r[out->n++] = (taken_rec){maps[m], s->key, s->val};
                ptrmap_del(maps[m], s->key, NULL);
            }
        }
    pthread_mutex_unlock(&g_mu);
}

/* freed: the driver freed them (their charges go); else they are put back. */
static void context_settle(taken_list *l, int freed)
{
    for (size_t i = 0; i < l->n; i++) {
        taken_rec *t = &l->r[i];
        if (!freed)
            put_back(t->m, t->key, &t->v);
        else if (t->v.kind != T_LIMIT_BASE)
            vgpu_release(t->v.dev, t->v.size, t->v.kind == T_LIMIT ? VGPU_MEM_CONTEXT : VGPU_MEM_DATA);
    }
    free(l->r);
    memset(l, 0, sizeof *l);
}

/* Return what the driver freed with context `ctx` (its last release). */
static void drop_context_allocs(CUcontext ctx)
{
    taken_list l = {0};
    context_take(ctx, &l);
    context_settle(&l, 1);
}

/* The primary context is charged once while retained, without a limit check (a process cannot
 * run anything without it; its footprint is what the driver takes anyway). Every created context
 * is reserved under the limit (ctx_create). */
static void primary_ref(int cuda_dev, int delta, CUcontext ctx)
{
    int reg = vgpu_cuda_dev(cuda_dev);
    if (reg < 0)
        return;
    pthread_mutex_lock(&g_mu);
    int before = g_primary_refs[reg];
    g_primary_refs[reg] = before + delta < 0 ? 0 : before + delta;
    int after = g_primary_refs[reg];
    if (ctx)
        g_primary_ctx[reg] = ctx;
    CUcontext primary = g_primary_ctx[reg];
    /* what is released is what was charged: the footprint may be measured anew meanwhile */
    uint64_t charge = 0, release = 0;
    if (before == 0 && after > 0)
        charge = g_primary_charged[reg] = g_ctx_size[reg];
    if (before > 0 && after == 0) {
        release = g_primary_charged[reg];
        g_primary_charged[reg] = 0;
    }
    pthread_mutex_unlock(&g_mu);
    if (before == 0 && after > 0)
        vgpu_charge(reg, charge, VGPU_MEM_CONTEXT);
    if (before > 0 && after == 0) {
        vgpu_release(reg, release, VGPU_MEM_CONTEXT);
        drop_context_allocs(primary);
    }
}

typedef struct {
    CUcontext *pctx;
    CUdevice dev;
} retain_args;

static CUresult do_retain(void *a)
{
    retain_args *x = a;
    return r_cuDevicePrimaryCtxRetain(x->pctx, x->dev);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    READY_OR(r_cuDevicePrimaryCtxRetain, CUDA_ERROR_NOT_INITIALIZED);
    CUcontext got = NULL; /* the driver answers here, not in the tenant's memory (cuMemCreate) */
    retain_args a = {pctx ? &got : NULL, dev};
    CUresult r = with_context_charge(dev, do_retain, &a);
    if (r == CUDA_SUCCESS) {
        primary_ref(dev, 1, got);
        if (pctx)
            *pctx = got;
    }
    return r;
}

static CUresult primary_release(CUdevice dev, __typeof__(&cuDevicePrimaryCtxRelease_v2) real)
{
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_limit_mu);
    CUresult r = real(dev);
    if (r == CUDA_SUCCESS)
        primary_ref(dev, -1, NULL);
    pthread_mutex_unlock(&g_limit_mu);
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    vgpu_init();
    return primary_release(dev, r_cuDevicePrimaryCtxRelease_v2);
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    vgpu_init();
    return primary_release(dev, r_cuDevicePrimaryCtxRelease);
}

static void graph_after_reset(CUdevice dev);

/* cudaDeviceReset: the driver frees every allocation of the primary context. */
static CUresult primary_reset(CUdevice dev, __typeof__(&cuDevicePrimaryCtxReset_v2) real)
{
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_limit_mu);
    int reg = vgpu_cuda_dev(dev);
    CUcontext primary = NULL;
    if (reg >= 0) {
        pthread_mutex_lock(&g_mu);
        primary = g_primary_ctx[reg];
        pthread_mutex_unlock(&g_mu);
    }
    taken_list l = {0};
    context_take(primary, &l); /* before the driver frees them (put_back) */
    CUresult r = real(dev);
    context_settle(&l, r == CUDA_SUCCESS);
    if (r == CUDA_SUCCESS && reg >= 0)
        graph_after_reset(dev);
    pthread_mutex_unlock(&g_limit_mu);
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    vgpu_init();
    return primary_reset(dev, r_cuDevicePrimaryCtxReset_v2);
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    vgpu_init();
    return primary_reset(dev, r_cuDevicePrimaryCtxReset);
}

typedef struct {
    int version; /* 1..4: cuCtxCreate, _v2, _v3, _v4 */
    CUcontext *pctx;
    unsigned flags;
    CUdevice dev;
    void *p1;
    int n;
} create_args;

static CUresult do_create(void *a)
{
    create_args *x = a;
    switch (x->version) {
    case 1: return r_cuCtxCreate(x->pctx, x->flags, x->dev);
    case 2: return r_cuCtxCreate_v2(x->pctx, x->flags, x->dev);
    case 3: return r_cuCtxCreate_v3(x->pctx, x->p1, x->n, x->flags, x->dev);
    default: return r_cuCtxCreate_v4(x->pctx, x->p1, x->flags, x->dev);
    }
}

/* A created context's footprint is reserved under the limit before the driver creates it
 * (CUDA_ERROR_OUT_OF_MEMORY when it does not fit; returned if the create fails). The first
 * context of the process on a device has no known footprint yet: it is measured as it is
 * created, then reserved; if it does not fit it is destroyed again and the call fails. The
 * charge is remembered with the context and returned by cuCtxDestroy. */
static CUresult ctx_create(create_args *a, void *real)
{
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    int reg = vgpu_cuda_dev(a->dev);
    if (reg < 0 || !a->pctx)
        return with_context_charge(a->dev, do_create, a);
    /* the driver answers into `made`, recorded before it is copied to the caller's (cuMemCreate) */
    CUcontext *caller = a->pctx, made = NULL;
    a->pctx = &made;
    int known = vgpu_cfg.context_size >= 0 || __atomic_load_n(&g_ctx_measured[reg], __ATOMIC_ACQUIRE);
    uint64_t size = vgpu_cfg.context_size >= 0 ? (uint64_t)vgpu_cfg.context_size : g_ctx_size[reg];
    if (known && vgpu_reserve(reg, size, VGPU_MEM_CONTEXT) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = with_context_charge(a->dev, do_create, a);
    if (r != CUDA_SUCCESS) {
        if (known)
            vgpu_release(reg, size, VGPU_MEM_CONTEXT);
        return r;
    }
    if (!known) {
        size = g_ctx_size[reg];
        if (vgpu_reserve(reg, size, VGPU_MEM_CONTEXT) != 0) {
            if (r_cuCtxDestroy_v2 ? r_cuCtxDestroy_v2(made) : r_cuCtxDestroy(made))
                LOG_WARN("device %d: could not destroy a context over the limit", reg);
            *caller = NULL;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    track(&g_handles, (uint64_t)(uintptr_t)made, size, reg, T_CTX);
    *caller = made;
    return r;
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    vgpu_init();
    create_args a = {1, pctx, flags, dev, NULL, 0};
    return ctx_create(&a, (void *)r_cuCtxCreate);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    vgpu_init();
    create_args a = {2, pctx, flags, dev, NULL, 0};
    return ctx_create(&a, (void *)r_cuCtxCreate_v2);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice dev)
{
    vgpu_init();
    create_args a = {3, pctx, flags, dev, p, n};
    return ctx_create(&a, (void *)r_cuCtxCreate_v3);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags, CUdevice dev)
{
    vgpu_init();
    create_args a = {4, pctx, flags, dev, p, 0};
    return ctx_create(&a, (void *)r_cuCtxCreate_v4);
}

static CUresult ctx_destroy(CUcontext ctx, __typeof__(&cuCtxDestroy_v2) real)
{
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_limit_mu);
    ptrmap_val v;
    int found = ctx && untrack_kind(&g_handles, (uint64_t)(uintptr_t)ctx, T_CTX, &v);
    taken_list l = {0};
    context_take(ctx, &l); /* before the driver frees the context (put_back) */
    CUresult r = real(ctx);
    if (found && r == CUDA_SUCCESS)
        vgpu_release(v.dev, v.size, VGPU_MEM_CONTEXT);
    else if (found)
        put_back(&g_handles, (uint64_t)(uintptr_t)ctx, &v);
    context_settle(&l, r == CUDA_SUCCESS);
    pthread_mutex_unlock(&g_limit_mu);
    return r;
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    vgpu_init();
    return ctx_destroy(ctx, r_cuCtxDestroy_v2);
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    vgpu_init();
    return ctx_destroy(ctx, r_cuCtxDestroy);
}

/* ---- context limits ----
 * cuCtxSetLimit sizes device memory the driver keeps for a context: the device-side malloc heap,
 * the printf FIFO, and a stack for every thread the device can hold at once (SMs x threads per
 * SM). A raise would otherwise be memory no hook sees (a 64 KiB stack on a 132-SM device is
 * 17 GiB). Per context and limit, the first value seen is the base (inside the measured context
 * footprint) and the charge is always cost(max(value, base)) - cost(base): reserved under the
 * limit before the driver is called (CUDA_ERROR_OUT_OF_MEMORY, nothing set, when it does not fit),
 * settled on the value the driver then reports, given back as the limit comes down and with the
 * context (drop_context_allocs). g_limit_mu orders these calls with each other and with teardown.
 * Not charged: CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH and _PENDING_LAUNCH_COUNT (device-runtime buffers
 * whose size per unit the driver does not tell), and the stack the driver grows by itself for a
 * kernel that needs more (docs/libvgpu.md). */
static uint64_t limit_cost(CUlimit limit, uint64_t value, CUdevice dev)
{
    if (limit == CU_LIMIT_MALLOC_HEAP_SIZE || limit == CU_LIMIT_PRINTF_FIFO_SIZE)
        return value;
    if (limit != CU_LIMIT_STACK_SIZE)
        return 0;
    int sms = 0, per_sm = 0;
    if (!p_cuDeviceGetAttribute ||
        p_cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
        p_cuDeviceGetAttribute(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) != CUDA_SUCCESS)
        sms = per_sm = 0;
    /* unknown: the largest current devices (256 SMs x 2048 threads) */
    return mul_sat(value, (uint64_t)(sms > 0 ? sms : 256) * (uint64_t)(per_sm > 0 ? per_sm : 2048));
}

static uint64_t limit_key(CUcontext ctx, CUlimit limit, int base)
{
    return ((uint64_t)(uintptr_t)ctx << 4) | (base ? 8u : 0u) | ((uint64_t)limit & 7u);
}

/* The record `key` of g_limits (its size), 0 when there is none; *found says which. */
static uint64_t limit_record(uint64_t key, int *found)
{
    pthread_mutex_lock(&g_mu);
    ptrmap_val *v = ptrmap_get(&g_limits, key);
    uint64_t size = v ? v->size : 0;
    pthread_mutex_unlock(&g_mu);
    if (found)
        *found = v != NULL;
    return size;
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    READY_OR(r_cuCtxSetLimit, CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx = NULL;
    CUdevice dev = 0;
    size_t now = 0;
    int reg = -1;
    pthread_mutex_lock(&g_limit_mu);
    if (p_cuCtxGetCurrent && p_cuCtxGetDevice && p_cuCtxGetLimit && p_cuCtxGetCurrent(&ctx) == CUDA_SUCCESS &&
        ctx && p_cuCtxGetDevice(&dev) == CUDA_SUCCESS && p_cuCtxGetLimit(&now, limit) == CUDA_SUCCESS &&
        limit_cost(limit, 1, dev) > 0)
        reg = vgpu_cuda_dev(dev);
    if (reg < 0) {
        pthread_mutex_unlock(&g_limit_mu);
        return r_cuCtxSetLimit(limit, value);
    }
    uint64_t ckey = limit_key(ctx, limit, 0), bkey = limit_key(ctx, limit, 1);
    int known = 0;
    uint64_t base = limit_record(bkey, &known);
    if (!known) {
        base = now;
        track_aux(&g_limits, bkey, base, reg, T_LIMIT_BASE, (uint64_t)(uintptr_t)ctx);
    }
    uint64_t held = limit_record(ckey, NULL);
    uint64_t floor_cost = limit_cost(limit, base, dev);
    uint64_t want = limit_cost(limit, value > base ? value : base, dev) - floor_cost;
    if (want > held && vgpu_reserve(reg, want - held, VGPU_MEM_CONTEXT) != 0) {
        pthread_mutex_unlock(&g_limit_mu);
        LOG_WARN("cuCtxSetLimit(%d, %zu) refused: %llu more bytes of device memory are over the limit", (int)limit,
                 value, (unsigned long long)(want - held));
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t reserved = want > held ? want : held; /* charged while the driver runs */
    CUresult r = r_cuCtxSetLimit(limit, value);
    uint64_t settled = held;
    size_t after = 0;
    if (r == CUDA_SUCCESS)
        settled = p_cuCtxGetLimit(&after, limit) == CUDA_SUCCESS
                      ? limit_cost(limit, after > base ? after : base, dev) - floor_cost
                      : want;
    if (settled < reserved)
        vgpu_release(reg, reserved - settled, VGPU_MEM_CONTEXT);
    else if (settled > reserved)
        vgpu_charge(reg, settled - reserved, VGPU_MEM_CONTEXT); /* the driver rounded up: it holds it */
    untrack(&g_limits, ckey, NULL);
    if (settled)
        track_aux(&g_limits, ckey, settled, reg, T_LIMIT, (uint64_t)(uintptr_t)ctx);
    pthread_mutex_unlock(&g_limit_mu);
    return r;
}

/* ---- allocations ---- */

/* Reserve `bytes` on region device `reg`, run the driver call, roll back on failure. */
#define CHARGED_CALL(reg, bytes, call)                                                             \
    ({                                                                                             \
        CUresult _r;                                                                               \
        if (vgpu_reserve((reg), (bytes), VGPU_MEM_DATA) != 0) {                                    \
            _r = CUDA_ERROR_OUT_OF_MEMORY;                                                         \
        } else {                                                                                   \
            _r = (call);                                                                           \
            if (_r != CUDA_SUCCESS)                                                                \
                vgpu_release((reg), (bytes), VGPU_MEM_DATA);                                       \
        }                                                                                          \
        _r;                                                                                        \
    })

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    READY_OR(r_cuMemAlloc_v2, CUDA_ERROR_NOT_INITIALIZED);
    int reg = vgpu_current_dev();
    if (reg < 0 || !dptr || !size)
        return r_cuMemAlloc_v2(dptr, size);
    uint64_t bytes = round_alloc(size);
    CUdeviceptr d = 0; /* the driver answers here, not in the tenant's memory (cuMemCreate) */
    CUresult r = CHARGED_CALL(reg, bytes, r_cuMemAlloc_v2(&d, size));
    if (r == CUDA_SUCCESS) {
        track(&g_ptrs, d, bytes, reg, T_DATA);
        *dptr = d;
    }
    return r;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    READY_OR(r_cuMemAllocManaged, CUDA_ERROR_NOT_INITIALIZED);
    int reg = vgpu_current_dev();
    if (reg < 0 || !dptr || !size || vgpu_cfg.oversubscribe)
        return r_cuMemAllocManaged(dptr, size, flags);
    uint64_t bytes = round_alloc(size);
    CUdeviceptr d = 0;
    CUresult r = CHARGED_CALL(reg, bytes, r_cuMemAllocManaged(&d, size, flags));
    if (r == CUDA_SUCCESS) {
        track(&g_ptrs, d, bytes, reg, T_DATA);
        *dptr = d;
    }
    return r;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int elem)
{
    READY_OR(r_cuMemAllocPitch_v2, CUDA_ERROR_NOT_INITIALIZED);
    int reg = vgpu_current_dev();
    if (reg < 0 || !dptr || !pitch || !w || !h)
        return r_cuMemAllocPitch_v2(dptr, pitch, w, h, elem);
    /* Reserve the estimate (width rounded to 512 B), then settle on the driver's pitch. */
    uint64_t est = round_alloc(mul_sat(round_to(w, 512), h));
    CUdeviceptr d = 0;
    size_t pt = 0; /* the pitch too: read back from the tenant, it could be made small */
    CUresult r = CHARGED_CALL(reg, est, r_cuMemAllocPitch_v2(&d, &pt, w, h, elem));
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t real = round_alloc(mul_sat(pt, h));
    if (real > est && vgpu_reserve(reg, real - est, VGPU_MEM_DATA) != 0) {
        r_cuMemFree_v2(d);
        vgpu_release(reg, est, VGPU_MEM_DATA);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (real < est)
        vgpu_release(reg, est - real, VGPU_MEM_DATA);
    track(&g_ptrs, d, real, reg, T_DATA);
    *dptr = d;
    *pitch = pt;
    return CUDA_SUCCESS;
}

static uint64_t pool_freed(CUmemoryPool pool, uint64_t bytes, int reg);
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    READY_OR(r_cuMemFree_v2, CUDA_ERROR_NOT_INITIALIZED);
    ptrmap_val v;
    int found = dptr && untrack(&g_ptrs, dptr, &v);
    CUresult r = r_cuMemFree_v2(dptr);
    if (found) {
        if (r == CUDA_SUCCESS)
            vgpu_release(v.dev, v.size, VGPU_MEM_DATA);
        else
            track_aux(&g_ptrs, dptr, v.size, v.dev, (int)v.kind, v.aux);
        if (r == CUDA_SUCCESS && v.kind == T_ASYNC && v.aux)
            pool_freed((CUmemoryPool)(uintptr_t)v.aux, v.size, v.dev);
    }
    return r;
}

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

/* Bytes of one w x h plane (h >= 1) of a CUDA array in format `f`:
 *  - formats that take a channel count: 1, 2 or 4 bytes per channel, times NumChannels;
 *  - formats whose channels the format sets (normalized integers UNORM/SNORM_INTnXc, packed RGB and
 *    YUV): their texel size, whatever NumChannels says;
 *  - block-compressed ones (BC1-BC7): Width and Height count texels, stored in 4 x 4 blocks of 8
 *    bytes (BC1, BC4) or 16 (BC2, BC3, BC5, BC6H, BC7);
 *  - planar and semi-planar YUV: a full luma plane plus chroma planes subsampled 2 x 2 (4:2:0: NV12,
 *    P010, P016) or 2 x 1 (4:2:2: NV16, P210, P216), 1 byte a sample for 8-bit formats, 2 for
 *    10- and 16-bit ones; packed 4:2:2 (YUY2, Y210, Y216) keeps 4 samples per 2 texels.
 * A format this list does not know (a newer driver's) is charged 16 bytes a channel: more than any
 * texel here takes, so it is never under-counted. */
static uint64_t plane_bytes(uint64_t w, uint64_t h, CUarray_format f, unsigned ch)
{
    uint64_t px = mul_sat(w, h), cw = ceil_div(w, 2), blocks = mul_sat(ceil_div(w, 4), ceil_div(h, 4));
    uint64_t c420 = mul_sat(mul_sat(cw, ceil_div(h, 2)), 2), c422 = mul_sat(mul_sat(cw, h), 2);
    uint64_t per; /* bytes per channel, for the formats that take a channel count */
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
    case CU_AD_FORMAT_SNORM_INT16X1: return mul_sat(px, 2);
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
    case CU_AD_FORMAT_UNORM_INT_101010_2:
    case CU_AD_FORMAT_AYUV:
    case CU_AD_FORMAT_Y410: return mul_sat(px, 4);
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
    case CU_AD_FORMAT_Y416: return mul_sat(px, 8);
    case CU_AD_FORMAT_Y444_PLANAR8:
    case CU_AD_FORMAT_YUV444_8bit_SemiPlanar: return mul_sat(px, 3);
    case CU_AD_FORMAT_Y444_PLANAR10:
    case CU_AD_FORMAT_YUV444_16bit_SemiPlanar: return mul_sat(px, 6);
    case CU_AD_FORMAT_BC1_UNORM:
    case CU_AD_FORMAT_BC1_UNORM_SRGB:
    case CU_AD_FORMAT_BC4_UNORM:
    case CU_AD_FORMAT_BC4_SNORM: return mul_sat(blocks, 8);
    case CU_AD_FORMAT_BC2_UNORM:
    case CU_AD_FORMAT_BC2_UNORM_SRGB:
    case CU_AD_FORMAT_BC3_UNORM:
    case CU_AD_FORMAT_BC3_UNORM_SRGB:
    case CU_AD_FORMAT_BC5_UNORM:
    case CU_AD_FORMAT_BC5_SNORM:
    case CU_AD_FORMAT_BC6H_UF16:
    case CU_AD_FORMAT_BC6H_SF16:
    case CU_AD_FORMAT_BC7_UNORM:
    case CU_AD_FORMAT_BC7_UNORM_SRGB: return mul_sat(blocks, 16);
    case CU_AD_FORMAT_NV12: return add_sat(px, c420);
    case CU_AD_FORMAT_P010:
    case CU_AD_FORMAT_P016: return mul_sat(add_sat(px, c420), 2);
    case CU_AD_FORMAT_NV16: return add_sat(px, c422);
    case CU_AD_FORMAT_P210:
    case CU_AD_FORMAT_P216: return mul_sat(add_sat(px, c422), 2);
    case CU_AD_FORMAT_YUY2: return mul_sat(mul_sat(cw, h), 4);
    case CU_AD_FORMAT_Y210:
    case CU_AD_FORMAT_Y216: return mul_sat(mul_sat(cw, h), 8);
    default: per = 16; break;
    }
    return mul_sat(mul_sat(px, per), ch ? ch : 1);
}

/* Bytes of a w x h x d CUDA array (h or d 0: that dimension absent; d also counts layers). */
static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch)
{
    return mul_sat(plane_bytes(w, h ? h : 1, f, ch), d ? d : 1);
}

/* A mipmapped array: the driver clamps the level count to [1, 1 + floor(log2(max(Width, Height,
 * Depth)))] (0 asks for one level, as 1 does). Each level halves Width and Height (at least 1; a
 * 1D array stays 0 high) and, in a 3D array, Depth; in a layered or cubemap array (CUDA_ARRAY3D_
 * LAYERED / _CUBEMAP) Depth counts layers (faces), all of which every level has. */
static uint64_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels)
{
    size_t top = d->Width > d->Height ? d->Width : d->Height;
    if (d->Depth > top)
        top = d->Depth;
    unsigned most = 1;
    while (most < 64 && (top >> most))
        most++;
    levels = levels < 1 ? 1 : levels > most ? most : levels;
    int layered = (d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    uint64_t est = 0;
    for (unsigned l = 0; l < levels; l++) {
        size_t w = d->Width >> l, h = d->Height >> l, z = layered ? d->Depth : d->Depth >> l;
        est = add_sat(est, array_bytes(w ? w : 1, d->Height ? (h ? h : 1) : 0, d->Depth ? (z ? z : 1) : 0,
                                       d->Format, d->NumChannels));
    }
    return est;
}

typedef struct {
    CUarray *arr;
    const void *desc;
    unsigned levels;
    CUmipmappedArray *mip;
} array_args;

/* The driver writes the new array into a local (a->arr or a->mip pointed at it), recorded before
 * it is copied to the caller's `*handle`: read back from the tenant's memory, another thread of it
 * could have put another array's handle there first (charged under the wrong record). */
static CUresult array_charged(uint64_t est, void **handle, CUresult (*call)(void *), array_args *a)
{
    void *got = NULL;
    if (a->mip)
        a->mip = (CUmipmappedArray *)&got;
    else
        a->arr = (CUarray *)&got;
    int reg = vgpu_current_dev();
    CUresult r;
    if (reg < 0 || !est) {
        r = call(a);
    } else {
        uint64_t bytes = round_alloc(est);
        r = CHARGED_CALL(reg, bytes, call(a));
        if (r == CUDA_SUCCESS)
            track(&g_handles, (uint64_t)(uintptr_t)got, bytes, reg, T_ARRAY);
    }
    if (r == CUDA_SUCCESS)
        *handle = got;
    return r;
}

static CUresult do_array(void *a)
{
    array_args *x = a;
    return r_cuArrayCreate_v2(x->arr, x->desc);
}

static CUresult do_array3d(void *a)
{
    array_args *x = a;
    return r_cuArray3DCreate_v2(x->arr, x->desc);
}

static CUresult do_array_v1(void *a)
{
    array_args *x = a;
    return r_cuArrayCreate(x->arr, x->desc);
}

static CUresult do_array3d_v1(void *a)
{
    array_args *x = a;
    return r_cuArray3DCreate(x->arr, x->desc);
}

static CUresult do_mipmap(void *a)
{
    array_args *x = a;
    return r_cuMipmappedArrayCreate(x->mip, x->desc, x->levels);
}

EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *d)
{
    READY_OR(r_cuArrayCreate_v2, CUDA_ERROR_NOT_INITIALIZED);
    if (!arr || !d)
        return r_cuArrayCreate_v2(arr, d);
    CUDA_ARRAY_DESCRIPTOR dd = *d; /* read once: estimated and created from the same figures */
    array_args a = {arr, &dd, 0, NULL};
    return array_charged(array_bytes(dd.Width, dd.Height, 1, dd.Format, dd.NumChannels), (void **)arr,
                         do_array, &a);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    READY_OR(r_cuArray3DCreate_v2, CUDA_ERROR_NOT_INITIALIZED);
    if (!arr || !d)
        return r_cuArray3DCreate_v2(arr, d);
    CUDA_ARRAY3D_DESCRIPTOR dd = *d; /* read once: estimated and created from the same figures */
    array_args a = {arr, &dd, 0, NULL};
    return array_charged(array_bytes(dd.Width, dd.Height, dd.Depth, dd.Format, dd.NumChannels),
                         (void **)arr, do_array3d, &a);
}

/* The pre-3.2 entry points (32-bit sizes): still exported by the driver and reached by name
 * (dlsym, or cuGetProcAddress below version 3020); they make the same arrays. */
EXPORT CUresult cuArrayCreate(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    READY_OR(r_cuArrayCreate, CUDA_ERROR_NOT_INITIALIZED);
    if (!arr || !d)
        return r_cuArrayCreate(arr, d);
    CUDA_ARRAY_DESCRIPTOR_v1 dd = *d; /* read once: estimated and created from the same figures */
    array_args a = {arr, &dd, 0, NULL};
    return array_charged(array_bytes(dd.Width, dd.Height, 1, dd.Format, dd.NumChannels), (void **)arr,
                         do_array_v1, &a);
}

EXPORT CUresult cuArray3DCreate(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    READY_OR(r_cuArray3DCreate, CUDA_ERROR_NOT_INITIALIZED);
    if (!arr || !d)
        return r_cuArray3DCreate(arr, d);
    CUDA_ARRAY3D_DESCRIPTOR_v1 dd = *d; /* read once: estimated and created from the same figures */
    array_args a = {arr, &dd, 0, NULL};
    return array_charged(array_bytes(dd.Width, dd.Height, dd.Depth, dd.Format, dd.NumChannels),
                         (void **)arr, do_array3d_v1, &a);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *mip, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned int levels)
{
    READY_OR(r_cuMipmappedArrayCreate, CUDA_ERROR_NOT_INITIALIZED);
    if (!mip || !d)
        return r_cuMipmappedArrayCreate(mip, d, levels);
    CUDA_ARRAY3D_DESCRIPTOR dd = *d; /* read once: estimated and created from the same figures */
    if (!dd.Width)
        return r_cuMipmappedArrayCreate(mip, &dd, levels);
    array_args a = {NULL, &dd, levels, mip};
    return array_charged(mipmap_bytes(&dd, levels), (void **)mip, do_mipmap, &a);
}

/* After the driver's destroy of an array whose record was taken out before (`found`). */
static CUresult array_freed(uint64_t key, int found, const ptrmap_val *v, CUresult r)
{
    if (found && r == CUDA_SUCCESS)
        vgpu_release(v->dev, v->size, VGPU_MEM_DATA);
    else if (found)
        put_back(&g_handles, key, v);
    return r;
}

EXPORT CUresult cuArrayDestroy(CUarray arr)
{
    READY_OR(r_cuArrayDestroy, CUDA_ERROR_NOT_INITIALIZED);
    uint64_t key = (uint64_t)(uintptr_t)arr;
    ptrmap_val v;
    int found = untrack_kind(&g_handles, key, T_ARRAY, &v);
    return array_freed(key, found, &v, r_cuArrayDestroy(arr));
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray mip)
{
    READY_OR(r_cuMipmappedArrayDestroy, CUDA_ERROR_NOT_INITIALIZED);
    uint64_t key = (uint64_t)(uintptr_t)mip;
    ptrmap_val v;
    int found = untrack_kind(&g_handles, key, T_ARRAY, &v);
    return array_freed(key, found, &v, r_cuMipmappedArrayDestroy(mip));
}

/* VMM (NCCL, PyTorch expandable segments): physical memory is charged at cuMemCreate and
 * released when the driver frees it: when the allocation's last reference is gone. Like the
 * driver, each allocation counts references: cuMemCreate 1, each cuMemMap +1, each cuMemUnmap
 * of a mapping -1, cuMemRetainAllocationHandle +1, cuMemRelease -1 (the count is the record's
 * aux). cuMemRelease of a mapped allocation frees nothing until it is unmapped. A reference is
 * dropped before the driver call that drops it (vmm_unref_take), and given back if the call fails
 * (vmm_unref_undo): once the driver freed the allocation its handle value may be another's.
 *
 * g_vmm_mu makes each of cuMemRelease, cuMemUnmap, cuMemMap and cuMemRetainAllocationHandle one
 * step, from its change to the records through the driver call to its settle (charge released, or
 * records put back). A dropped reference was once visible while the driver call ran: a cuMemUnmap
 * the driver was about to refuse (a range that starts at an unmapped address, or a partial unmap:
 * a tenant's choice) had taken a mapping's reference, and a cuMemRelease racing it saw the last
 * one, deleted the record and released the whole charge while the mapping still held the memory;
 * a retain in that window found no record to count on, and the failed unmap then put back too few
 * (2560 MiB held under a 1 GiB limit; found by review, 1 Dec). Under the lock nothing else changes
 * an existing VMM record (context teardown takes no T_VMM record; cuMemCreate only adds the record
 * of a handle the driver just made, never one that is live), so a failed call's put-back restores
 * exactly what it took. None of these is a hot path (set-up, growth of an expandable segment,
 * tear-down).
 *
 * cuMemCreate stays outside g_vmm_mu (a create is not held up by another thread's unmap, and the
 * driver may give it the value of a handle a release under the lock has just freed: that release
 * took its record out before its call and only releases the old charge after). The driver writes
 * the new handle into a local of the hook, which records it before it copies it to the caller's
 * variable: the tenant cannot learn the handle from us before its record is in. (Read back from
 * the caller's variable, as it once was, a second thread of the tenant could overwrite it between
 * the driver's store and the read: the charge was recorded under another handle, e.g. a 2 MiB
 * one recorded as 1 GiB; found by review.)
 *
 * What is left is a handle the tenant guesses (the driver's values can be predictable) and maps
 * while its create is still between the driver's answer and the record: the map, finding no
 * record, would count no reference, and the create's one cuMemRelease would then release the
 * charge the mapping still holds. Only cuMemMap waits for that (vmm_rec_map): a map whose handle
 * has no record waits for the creates that were in flight when it looked (each create has a
 * ticket; later ones cannot have made a handle the driver already accepted), so it neither
 * starves behind a stream of creates nor waits at all when the record is there (the usual case:
 * a handle made through this library is recorded before the tenant has it). It waits holding
 * g_vmm_mu: let go, another hook could release the just-recorded handle before the map counted
 * its reference. A map only reaches that wait with a handle that has no record (a guessed one, or
 * one not made through cuMemCreate, e.g. imported), so the other VMM calls are held up only by
 * such a map, and only for the creates then in flight. cuMemRelease and
 * cuMemRetainAllocationHandle do not wait any more (the wait of 4390055, which every VMM hook did
 * holding g_vmm_mu while any create was in flight, is gone): a release that finds no record
 * releases no charge (an over-count of the guesser's own, never an escape), and a retain's handle
 * comes from a mapping, which cuMemMap counted only once the record was in.
 *
 * Lock order: g_vmm_mu is taken first, by these hooks only, and is never taken with another of
 * this library's locks held; under it they take g_mu and the region lock (vgpu_reserve /
 * vgpu_release), briefly, and call the driver; vmm_rec_map may wait on g_vmm_cv, which a cuMemCreate
 * signals holding only g_mu (never g_vmm_mu). The driver call cannot come back into a hook that
 * takes g_vmm_mu: libcuda's cuMemRelease, cuMemMap, cuMemUnmap and cuMemRetainAllocationHandle call
 * no exported CUDA entry point (the driver's internal calls do not go through its dynamic symbols,
 * which are what LD_PRELOAD and our cuGetProcAddress table replace), and the fake driver is linked
 * -Bsymbolic and calls only its own static functions from them. */

/* g_mu held. The record of `handle`, if it has one. */
static ptrmap_val *vmm_rec(CUmemGenericAllocationHandle handle)
{
    ptrmap_val *p = ptrmap_get(&g_handles, handle);
    return p && p->kind == T_VMM ? p : NULL;
}

/* g_mu held: whether a create numbered `ticket` or lower is in flight. */
static int vmm_creates_before(uint64_t ticket)
{
    for (vmm_create_fl *c = g_vmm_creates; c; c = c->next)
        if (c->ticket <= ticket)
            return 1;
    return 0;
}

/* g_mu and g_vmm_mu held, cuMemMap only (see above). vmm_rec; with no record, waits for the
 * creates in flight now (g_mu given up meanwhile), one of which may have made this handle. */
static ptrmap_val *vmm_rec_map(CUmemGenericAllocationHandle handle)
{
    uint64_t seen = g_vmm_started;
    ptrmap_val *p;
    while (!(p = vmm_rec(handle)) && vmm_creates_before(seen))
        pthread_cond_wait(&g_vmm_cv, &g_mu);
    return p;
}

/* g_mu held. Returns 0: no record; 1: a reference came off; 2: that was the last, the record is
 * out (in *out: its charge to release once the driver freed the allocation). */
static int vmm_unref_take(CUmemGenericAllocationHandle handle, ptrmap_val *out)
{
    ptrmap_val *p = ptrmap_get(&g_handles, handle);
    if (!p || p->kind != T_VMM)
        return 0;
    if (p->aux > 1) {
        p->aux--;
        return 1;
    }
    return ptrmap_del(&g_handles, handle, out) ? 2 : 0;
}

/* g_mu and g_vmm_mu held: the driver call failed, the reference taken by vmm_unref_take goes
 * back. Exact: g_vmm_mu kept every other change off the record since it was taken. */
static void vmm_unref_undo(CUmemGenericAllocationHandle handle, int taken, const ptrmap_val *v)
{
    if (taken == 2) {
        ptrmap_put(&g_handles, handle, *v); /* as it was taken: count 1 */
    } else if (taken == 1) {
        ptrmap_val *p = ptrmap_get(&g_handles, handle);
        if (p && p->kind == T_VMM)
            p->aux++;
    }
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    READY_OR(r_cuMemCreate, CUDA_ERROR_NOT_INITIALIZED);
    if (!handle || !prop || !size)
        return r_cuMemCreate(handle, size, prop, flags);
    /* read once: the driver makes what was judged (a second thread of the tenant could turn a
     * host location into a device one, or one device into another, between the two reads) */
    CUmemAllocationProp pr = *prop;
    if (pr.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return r_cuMemCreate(handle, size, &pr, flags);
    int reg = vgpu_cuda_dev(pr.location.id);
    if (reg < 0)
        return r_cuMemCreate(handle, size, &pr, flags);
    uint64_t bytes = round_to(size, 2ULL << 20);
    vmm_create_fl me;
    pthread_mutex_lock(&g_mu);
    me.ticket = ++g_vmm_started; /* before the driver can make the handle (vmm_rec_map) */
    me.next = g_vmm_creates;
    g_vmm_creates = &me;
    pthread_mutex_unlock(&g_mu);
    CUmemGenericAllocationHandle h = 0; /* the driver answers here, not in the tenant's memory */
    CUresult r = CHARGED_CALL(reg, bytes, r_cuMemCreate(&h, size, &pr, flags));
    pthread_mutex_lock(&g_mu);
    if (r == CUDA_SUCCESS)
        ptrmap_put(&g_handles, h, (ptrmap_val){.size = bytes, .aux = 1, .dev = reg, .kind = T_VMM});
    for (vmm_create_fl **c = &g_vmm_creates; *c; c = &(*c)->next)
        if (*c == &me) {
            *c = me.next;
            break;
        }
    pthread_cond_broadcast(&g_vmm_cv);
    pthread_mutex_unlock(&g_mu);
    if (r == CUDA_SUCCESS)
        *handle = h; /* only now, recorded: the tenant's threads may read or write it at will */
    return r;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    READY_OR(r_cuMemRelease, CUDA_ERROR_NOT_INITIALIZED);
    ptrmap_val v;
    pthread_mutex_lock(&g_vmm_mu);
    pthread_mutex_lock(&g_mu);
    int taken = vmm_rec(handle) ? vmm_unref_take(handle, &v) : 0;
    pthread_mutex_unlock(&g_mu);
    CUresult r = r_cuMemRelease(handle);
    if (r == CUDA_SUCCESS && taken == 2) {
        vgpu_release(v.dev, v.size, VGPU_MEM_DATA);
    } else if (r != CUDA_SUCCESS && taken) {
        pthread_mutex_lock(&g_mu);
        vmm_unref_undo(handle, taken, &v);
        pthread_mutex_unlock(&g_mu);
    }
    pthread_mutex_unlock(&g_vmm_mu);
    return r;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    READY_OR(r_cuMemRetainAllocationHandle, CUDA_ERROR_NOT_INITIALIZED);
    if (!handle)
        return r_cuMemRetainAllocationHandle(handle, addr);
    CUmemGenericAllocationHandle h = 0; /* answered here: the tenant's variable is not read back */
    pthread_mutex_lock(&g_vmm_mu); /* not between another hook's take and its settle */
    CUresult r = r_cuMemRetainAllocationHandle(&h, addr);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        ptrmap_val *p = vmm_rec(h);
        if (p)
            p->aux++;
        pthread_mutex_unlock(&g_mu);
    }
    pthread_mutex_unlock(&g_vmm_mu);
    if (r == CUDA_SUCCESS)
        *handle = h;
    return r;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags)
{
    READY_OR(r_cuMemMap, CUDA_ERROR_NOT_INITIALIZED);
    pthread_mutex_lock(&g_vmm_mu);
    CUresult r = r_cuMemMap(ptr, size, offset, handle, flags);
    if (r == CUDA_SUCCESS && ptr) {
        pthread_mutex_lock(&g_mu);
        ptrmap_val *p = vmm_rec_map(handle);
        if (p) {
            p->aux++;
            ptrmap_put(&g_maps, ptr, (ptrmap_val){.size = size, .aux = handle, .dev = p->dev, .kind = T_VMM});
        }
        pthread_mutex_unlock(&g_mu);
    }
    pthread_mutex_unlock(&g_vmm_mu);
    return r;
}

/* The mappings in [ptr, ptr + size), taken out of g_maps with their references (vmm_unref_take)
 * before cuMemUnmap calls the driver; then released (unmap_settle), or put back if it failed. */
typedef struct {
    uint64_t addr;
    ptrmap_val map;
    int taken;
    ptrmap_val rec;
} unmap_rec;

/* g_mu held. Adds mapping `addr` (already out of g_maps) to the list; 0 when the list cannot grow. */
static int unmap_add(unmap_rec **l, size_t *n, size_t *cap, uint64_t addr, const ptrmap_val *map)
{
    if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 8;
        unmap_rec *nl = realloc(*l, ncap * sizeof *nl);
        if (!nl)
            return 0;
        *l = nl;
        *cap = ncap;
    }
    unmap_rec *u = &(*l)[(*n)++];
    u->addr = addr;
    u->map = *map;
    u->taken = vmm_unref_take(map->aux, &u->rec);
    return 1;
}

/* g_vmm_mu held. The range is walked mapping by mapping (the usual case: one mapping, or adjacent
 * ones); a gap falls back to a scan. A mapping the list cannot hold stays in (its reference then
 * never drops: an over-count, not an escape). */
static size_t unmap_take(uint64_t ptr, uint64_t size, unmap_rec **out)
{
    uint64_t end = ptr + size < ptr ? UINT64_MAX : ptr + size, cur = ptr;
    unmap_rec *l = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&g_mu);
    ptrmap_val *pv;
    while (cur < end && (pv = ptrmap_get(&g_maps, cur))) {
        ptrmap_val v = *pv;
        if (!unmap_add(&l, &n, &cap, cur, &v))
            break;
        ptrmap_del(&g_maps, cur, NULL);
        cur = v.size && cur + v.size > cur ? cur + v.size : end;
    }
    for (size_t i = 0; cur < end && i < g_maps.cap; i++) {
        ptrmap_slot *s = &g_maps.slots[i];
        if (s->key > PTRMAP_TOMB && s->key >= cur && s->key < end) {
            if (!unmap_add(&l, &n, &cap, s->key, &s->val))
                break;
            ptrmap_del(&g_maps, s->key, NULL);
        }
    }
    pthread_mutex_unlock(&g_mu);
    *out = l;
    return n;
}

/* g_vmm_mu held. */
static void unmap_settle(unmap_rec *l, size_t n, int unmapped)
{
    if (!unmapped) {
        pthread_mutex_lock(&g_mu);
        for (size_t i = n; i-- > 0;) { /* in reverse: two mappings of one handle restore its count */
            ptrmap_put(&g_maps, l[i].addr, l[i].map);
            vmm_unref_undo(l[i].map.aux, l[i].taken, &l[i].rec);
        }
        pthread_mutex_unlock(&g_mu);
    } else {
        for (size_t i = 0; i < n; i++)
            if (l[i].taken == 2)
                vgpu_release(l[i].rec.dev, l[i].rec.size, VGPU_MEM_DATA);
    }
    free(l);
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    READY_OR(r_cuMemUnmap, CUDA_ERROR_NOT_INITIALIZED);
    unmap_rec *l = NULL;
    pthread_mutex_lock(&g_vmm_mu);
    size_t n = ptr ? unmap_take(ptr, size, &l) : 0;
    CUresult r = r_cuMemUnmap(ptr, size);
    unmap_settle(l, n, r == CUDA_SUCCESS);
    pthread_mutex_unlock(&g_vmm_mu);
    return r;
}

/* Memory pools: cuMemAllocFromPoolAsync allocates on the pool's location, whatever the current
 * context. A pool's location is learnt where a pool handle comes from: cuMemPoolCreate
 * (props->location) and cuDeviceGetDefaultMemPool / cuDeviceGetMemPool (the device asked
 * about). A pool in host memory (location HOST / HOST_NUMA) holds no device memory. */
#define POOL_HOST (-2) /* also: a device libvgpu does not map (not charged, as elsewhere) */

/* A g_pools entry (made if missing; NULL only if the map cannot grow). g_mu held. */
static ptrmap_val *pool_entry(CUmemoryPool pool)
{
    uint64_t key = (uint64_t)(uintptr_t)pool;
    ptrmap_val *v = ptrmap_get(&g_pools, key);
    if (!v) {
        ptrmap_put(&g_pools, key, (ptrmap_val){.dev = -1});
        v = ptrmap_get(&g_pools, key);
    }
    return v;
}

static void pool_note(CUmemoryPool pool, int where)
{
    if (!pool)
        return;
    pthread_mutex_lock(&g_mu);
    ptrmap_val *v = pool_entry(pool);
    if (v)
        v->dev = where;
    pthread_mutex_unlock(&g_mu);
}

/* A pool keeps memory its allocations freed: across a synchronization, up to its release
 * threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 0 by default) reserved in all, live allocations
 * included. That memory is the process's as much as a live allocation is: uncharged, a pool with a
 * high threshold (PyTorch's and TensorFlow's async allocators set it to the maximum) let a process
 * fill its limit, free into the pool, and allocate its limit again elsewhere. So each pool's cache
 * -- what the driver reserves for it above its live allocations, at most threshold - live -- is
 * charged without a check (the driver already holds it) and settled after every call that moves
 * it: an allocation from the pool, a free into it (cuMemFreeAsync or cuMemFree), a trim, a
 * threshold change; the pool's destruction gives it back. The live allocations are counted here,
 * not read from the driver (its figure may lag a stream-ordered free). An allocation from the
 * pool first moves up to its size from the cache's charge to its own, without the ledger moving
 * (so no other thread takes that room meanwhile): a full container can reuse what its pool
 * keeps. Allocations made while a stream is captured come from the graph's pool (graph_map).
 * The threshold is remembered once read or set, so with the default threshold the hot path makes
 * no driver call of its own, and nothing is charged beyond the live allocations.
 *
 * g_pools entry fields: dev = where the pool allocates (pool_dev), owner = bytes of its live
 * allocations, size = its cache charged, aux = the region device that charge is on. */
static void pool_live(CUmemoryPool pool, uint64_t add, uint64_t sub)
{
    pthread_mutex_lock(&g_mu);
    ptrmap_val *v = pool_entry(pool);
    if (v)
        v->owner = add_sat(v->owner > sub ? v->owner - sub : 0, add);
    pthread_mutex_unlock(&g_mu);
}

/* An allocation of `bytes` on region device `reg` about to be made from `pool`: up to `bytes` of
 * its cache's charge moves to the allocation (the ledger does not move: nobody can take the room
 * in between); returns what moved, to reserve only the rest. */
static uint64_t pool_take(CUmemoryPool pool, uint64_t bytes, int reg, int *keeps)
{
    pthread_mutex_lock(&g_mu);
    ptrmap_val *v = ptrmap_get(&g_pools, (uint64_t)(uintptr_t)pool);
    ptrmap_val *k = ptrmap_get(&g_pool_keep, (uint64_t)(uintptr_t)pool);
    *keeps = !k || k->size || (v && v->size); /* unknown: as if it kept (pool_settle reads it) */
    uint64_t moved = v && (int)v->aux == reg ? (bytes < v->size ? bytes : v->size) : 0;
    if (moved)
        v->size -= moved;
    pthread_mutex_unlock(&g_mu);
    return moved;
}

static void pool_untake(CUmemoryPool pool, uint64_t moved, int reg)
{
    pthread_mutex_lock(&g_mu);
    ptrmap_val *v = ptrmap_get(&g_pools, (uint64_t)(uintptr_t)pool);
    if (v && (int)v->aux == reg)
        v->size += moved;
    else /* the pool went (destroyed) or its charge moved: nothing holds the memory any more */
        vgpu_release(reg, moved, VGPU_MEM_DATA);
    pthread_mutex_unlock(&g_mu);
}

static void pool_threshold(CUmemoryPool pool, uint64_t keep)
{
    pthread_mutex_lock(&g_mu);
    ptrmap_put(&g_pool_keep, (uint64_t)(uintptr_t)pool, (ptrmap_val){.size = keep});
    pthread_mutex_unlock(&g_mu);
}

static uint64_t pool_settle_locked(CUmemoryPool pool, int reg);

/* Charge `pool`'s cache on region device `reg` as the driver reserves it now; returns by how much
 * that charge grew on `reg`. */
static uint64_t pool_settle(CUmemoryPool pool, int reg)
{
    if (!pool || reg < 0)
        return 0;
    pthread_mutex_lock(&g_settle_mu);
    uint64_t grew = pool_settle_locked(pool, reg);
    pthread_mutex_unlock(&g_settle_mu);
    return grew;
}
static uint64_t pool_settle_locked(CUmemoryPool pool, int reg)
{
    cuuint64_t keep = 0, reserved = 0;
    uint64_t grew = 0;
    if (!pool || reg < 0 || !p_cuMemPoolGetAttribute)
        return 0;
    /* The threshold is known once read (0 by default; only cuMemPoolSetAttribute, hooked, changes
     * it): a pool that keeps nothing and is charged nothing needs no driver call. */
    pthread_mutex_lock(&g_mu);
    ptrmap_val *e = pool_entry(pool), *k = ptrmap_get(&g_pool_keep, (uint64_t)(uintptr_t)pool);
    uint64_t charged = e ? e->size : 0;
    int known = k != NULL;
    keep = k ? k->size : 0;
    pthread_mutex_unlock(&g_mu);
    if (!known) {
        if (p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep) != CUDA_SUCCESS)
            return 0;
        pool_threshold(pool, keep);
    }
    if (!keep && !charged)
        return 0;
    if (keep && p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS)
        return 0;
    pthread_mutex_lock(&g_mu); /* the ledger is moved under it */
    ptrmap_val *v = pool_entry(pool);
    if (v) {
        uint64_t cached = reserved > v->owner ? reserved - v->owner : 0;
        uint64_t room = keep > v->owner ? keep - v->owner : 0; /* what a sync leaves above the live ones */
        uint64_t want = cached < room ? cached : room, old = v->size;
        int old_reg = (int)v->aux;
        v->size = want;
        v->aux = (uint64_t)reg;
        if (old && (old_reg != reg || want < old))
            vgpu_release(old_reg, old_reg == reg ? old - want : old, VGPU_MEM_DATA);
        if (want && (old_reg != reg || want > old)) {
            grew = old_reg == reg ? want - old : want;
            vgpu_charge(reg, grew, VGPU_MEM_DATA);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return grew;
}

/* Region device of `pool`, POOL_HOST, or -1 for a pool whose making we did not see (charged to
 * the current context's device, as before pools were mapped). */
static int pool_dev(CUmemoryPool pool)
{
    int where = -1;
    pthread_mutex_lock(&g_mu);
    ptrmap_val *v = pool ? ptrmap_get(&g_pools, (uint64_t)(uintptr_t)pool) : NULL;
    if (v)
        where = v->dev;
    pthread_mutex_unlock(&g_mu);
    if (where < 0)
        return where;
    int reg = vgpu_cuda_dev(where);
    return reg >= 0 ? reg : POOL_HOST;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    READY_OR(r_cuMemPoolCreate, CUDA_ERROR_NOT_INITIALIZED);
    if (!props)
        return r_cuMemPoolCreate(pool, props);
    CUmemPoolProps pp = *props; /* read once: the pool noted is the pool made (cuMemCreate) */
    CUmemoryPool got = NULL; /* the driver answers here, noted before the caller has it */
    CUresult r = r_cuMemPoolCreate(pool ? &got : NULL, &pp);
    if (r == CUDA_SUCCESS && pool)
        pool_note(got, pp.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? pp.location.id : POOL_HOST);
    if (r == CUDA_SUCCESS && pool)
        *pool = got;
    return r;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    READY_OR(r_cuDeviceGetDefaultMemPool, CUDA_ERROR_NOT_INITIALIZED);
    CUmemoryPool got = NULL; /* the driver answers here, noted before the caller has it */
    CUresult r = r_cuDeviceGetDefaultMemPool(pool ? &got : NULL, dev);
    if (r == CUDA_SUCCESS && pool) {
        pool_note(got, dev);
        *pool = got;
    }
    return r;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    READY_OR(r_cuDeviceGetMemPool, CUDA_ERROR_NOT_INITIALIZED);
    CUmemoryPool got = NULL; /* the driver answers here, noted before the caller has it */
    CUresult r = r_cuDeviceGetMemPool(pool ? &got : NULL, dev);
    if (r == CUDA_SUCCESS && pool) {
        pool_note(got, dev);
        *pool = got;
    }
    return r;
}

/* Whether `s` is in a capture (cuStreamBeginCapture): a stream-ordered allocation there allocates
 * nothing; it records an allocation node, whose memory the graph pool maps when the graph runs
 * (charged then: graph_map). An invalidated capture (a call that capture forbids, made meanwhile)
 * counts too: the driver makes no allocation on its stream, and it lasts until cuStreamEndCapture. */
static int capturing(CUstream s, int pt)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (pt && s == NULL)
        s = CU_STREAM_PER_THREAD;
    return p_cuStreamIsCapturing && p_cuStreamIsCapturing(s, &st) == CUDA_SUCCESS &&
           st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Stream capture against the stream-ordered allocations (g_capture_rw). A captured allocation
 * passes through uncharged, so the capture the hook saw must still be there when the driver
 * decides what to make: a capture ended in between by another thread (cuStreamEndCapture, which
 * relaxed mode allows) had the driver make a real allocation, held uncharged. Looking again after
 * the call (1 Dec) could not repair it: between the driver's return and that look a thread could
 * begin a global-mode capture, which forbids the synchronous free the repair fell back to, and the
 * allocation was handed over charged past the limit; and an invalidated capture gives no id to
 * compare, so a captured node was charged as real (found by the regression review, 1 Dec). So no
 * capture ends while an allocation is between its look and the driver's return: the allocation
 * holds g_capture_rw for reading over both, cuStreamEndCapture for writing over its driver call.
 * Capturing at the look, the driver records a node (or fails), whatever another thread does; not
 * capturing, the allocation is reserved under the limit before the driver makes it, and a capture
 * begun meanwhile only has a node's address charged as a real allocation (the tenant's own
 * over-charge, until that address is freed). Every cuMemAllocAsync pays an uncontended read lock,
 * beside g_mu and the region lock it takes anyway: skipping it until a capture begins would need a
 * hook on every way to begin one. Lock order: g_capture_rw before g_mu, g_settle_mu and the region
 * lock, which are taken under it (pool_take, vgpu_reserve) and never held when it is taken; the
 * driver's cuStreamEndCapture and allocations call no hook. */
static void capture_hold(CUstream s)
{
    if (pthread_rwlock_tryrdlock(&g_capture_rw) == 0)
        return;
    LOG_DEBUG("a stream-ordered allocation on stream %p waits for a cuStreamEndCapture in the driver", (void *)s);
    pthread_rwlock_rdlock(&g_capture_rw);
}

static CUresult end_capture(CUstream s, CUgraph *g, __typeof__(&cuStreamEndCapture) real)
{
    if (pthread_rwlock_trywrlock(&g_capture_rw) != 0) {
        LOG_DEBUG("cuStreamEndCapture of stream %p waits for the stream-ordered allocations in the driver",
                  (void *)s);
        pthread_rwlock_wrlock(&g_capture_rw);
    }
    CUresult r = real(s, g);
    pthread_rwlock_unlock(&g_capture_rw);
    return r;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
    READY_OR(r_cuStreamEndCapture, CUDA_ERROR_NOT_INITIALIZED);
    return end_capture(s, g, r_cuStreamEndCapture);
}

EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
    READY_OR(r_cuStreamEndCapture_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    return end_capture(s, g, r_cuStreamEndCapture_ptsz);
}

/* Stream-ordered allocations are charged per allocation, at the requested size, on the device
 * of the pool they come from (-1 = the current context's: cuMemAllocAsync). Captured ones are
 * not: charged at capture, a captured allocation freed in the same capture gave its charge back
 * before the graph ever ran, and every launch then held that memory uncharged. */
typedef struct {
    CUdeviceptr *dptr;
    size_t size;
    CUmemoryPool pool;
    CUstream s;
    int pt;
} async_args;

static CUresult async_charged(CUdeviceptr *dptr, size_t size, int where, CUmemoryPool pool, CUstream s, int pt,
                              CUresult (*call)(void *), async_args *arg)
{
    if (where == POOL_HOST)
        return call(arg);
    int reg = where >= 0 ? where : vgpu_current_dev();
    if (reg < 0 || !dptr || !size)
        return call(arg);
    CUdeviceptr got = 0; /* the driver answers here, copied to *dptr once recorded (cuMemCreate) */
    arg->dptr = &got;
    uint64_t bytes = round_alloc(size);
    int keeps = 0;
    capture_hold(s); /* no capture ends from the look to the driver's return */
    if (capturing(s, pt)) {
        CUresult r = call(arg);
        pthread_rwlock_unlock(&g_capture_rw);
        if (r == CUDA_SUCCESS)
            *dptr = got; /* an allocation node of the capture: the graph's (graph_map) */
        return r;
    }
    uint64_t moved = pool ? pool_take(pool, bytes, reg, &keeps) : 0;
    CUresult r = CHARGED_CALL(reg, bytes - moved, call(arg));
    pthread_rwlock_unlock(&g_capture_rw);
    if (r != CUDA_SUCCESS && moved)
        pool_untake(pool, moved, reg);
    CUmemoryPool real = NULL;
    if (r == CUDA_SUCCESS && keeps && pool && p_cuPointerGetAttribute &&
        p_cuPointerGetAttribute(&real, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, got) == CUDA_SUCCESS && real &&
        real != pool) { /* another pool served it (the device's pool changed meanwhile) */
        if (moved) {
            pool_untake(pool, moved, reg); /* that cache still holds its memory */
            vgpu_charge(reg, moved, VGPU_MEM_DATA);
        }
        pool_settle(pool, reg);
        pool = real;
    }
    if (r == CUDA_SUCCESS) {
        track_aux(&g_ptrs, got, bytes, reg, T_ASYNC, (uint64_t)(uintptr_t)pool);
        *dptr = got; /* recorded first (see cuMemCreate) */
        if (pool)
            pool_live(pool, bytes, 0);
    }
    if (keeps)
        pool_settle(pool, reg);
    return r;
}

static CUresult do_async(void *a)
{
    async_args *x = a;
    return x->pt ? r_cuMemAllocAsync_ptsz(x->dptr, x->size, x->s) : r_cuMemAllocAsync(x->dptr, x->size, x->s);
}

static CUresult do_pool(void *a)
{
    async_args *x = a;
    return x->pt ? r_cuMemAllocFromPoolAsync_ptsz(x->dptr, x->size, x->pool, x->s)
                 : r_cuMemAllocFromPoolAsync(x->dptr, x->size, x->pool, x->s);
}

/* Region device of stream `s`: cuMemAllocAsync allocates from the pool current to the stream's
 * device, which need not be the current context's. The default streams follow the current
 * context; another stream's context is asked for its device (pushed, read, popped). The CUDA
 * ordinal goes to *cuda_dev (-1: unknown, and -1 is returned: the current context's device). */
static int stream_dev(CUstream s, CUdevice *cuda_dev)
{
    *cuda_dev = -1;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || !p_cuStreamGetCtx ||
        !p_cuCtxPushCurrent_v2 || !p_cuCtxPopCurrent_v2) { /* the current context's device */
        if (!p_cuCtxGetDevice || p_cuCtxGetDevice(cuda_dev) != CUDA_SUCCESS) {
            *cuda_dev = -1;
            return -1;
        }
        return vgpu_cuda_dev(*cuda_dev);
    }
    CUcontext ctx = NULL, popped = NULL;
    CUdevice dev;
    if (p_cuStreamGetCtx(s, &ctx) != CUDA_SUCCESS || !ctx || p_cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS)
        return -1;
    CUresult r = p_cuCtxGetDevice(&dev);
    p_cuCtxPopCurrent_v2(&popped);
    if (r != CUDA_SUCCESS)
        return -1;
    *cuda_dev = dev;
    return vgpu_cuda_dev(dev);
}

/* Pools destroyed so far (cuMemPoolDestroy, once the driver did): a current_pool lookup that
 * raced a destroy does not keep its answer. */
static unsigned g_pool_gone;

/* `pool` is no longer any device's current pool in g_cur_pool. */
static void pool_forget(CUmemoryPool pool)
{
    for (int i = 0; i < VGPU_MAX_DEV; i++) {
        CUmemoryPool expected = pool;
        __atomic_compare_exchange_n(&g_cur_pool[i], &expected, NULL, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
}

/* The pool cuMemAllocAsync on a stream of CUDA device `cuda_dev` allocates from: the device's
 * current pool (cuDeviceSetMemPool), or NULL if the driver cannot say. */
static CUmemoryPool current_pool(CUdevice cuda_dev)
{
    if (cuda_dev < 0)
        return NULL;
    CUmemoryPool pool = cuda_dev < VGPU_MAX_DEV ? __atomic_load_n(&g_cur_pool[cuda_dev], __ATOMIC_ACQUIRE) : NULL;
    if (pool)
        return pool; /* kept by the cuDeviceSetMemPool hook */
    unsigned gen = __atomic_load_n(&g_pool_gone, __ATOMIC_SEQ_CST);
    if (!r_cuDeviceGetMemPool || r_cuDeviceGetMemPool(&pool, cuda_dev) != CUDA_SUCCESS)
        return NULL;
    if (cuda_dev < VGPU_MAX_DEV) {
        __atomic_store_n(&g_cur_pool[cuda_dev], pool, __ATOMIC_SEQ_CST);
        /* a pool destroyed meanwhile may be what the driver answered: not kept (pool_forget) */
        if (__atomic_load_n(&g_pool_gone, __ATOMIC_SEQ_CST) != gen) {
            CUmemoryPool expected = pool;
            __atomic_compare_exchange_n(&g_cur_pool[cuda_dev], &expected, NULL, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST);
        }
    }
    return pool;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    READY_OR(r_cuDeviceSetMemPool, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = r_cuDeviceSetMemPool(dev, pool);
    if (r == CUDA_SUCCESS && dev >= 0 && dev < VGPU_MAX_DEV)
        __atomic_store_n(&g_cur_pool[dev], pool, __ATOMIC_RELEASE);
    return r;
}

static CUresult alloc_async(CUdeviceptr *d, size_t n, CUstream s, int pt)
{
    CUdevice cuda_dev;
    int where = stream_dev(s, &cuda_dev);
    async_args a = {d, n, NULL, s, pt};
    CUmemoryPool pool = current_pool(cuda_dev);
    pool_note(pool, cuda_dev);
    return async_charged(d, n, where, pool, s, pt, do_async, &a);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s)
{
    READY_OR(r_cuMemAllocAsync, CUDA_ERROR_NOT_INITIALIZED);
    return alloc_async(d, n, s, 0);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s)
{
    READY_OR(r_cuMemAllocAsync_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    return alloc_async(d, n, s, 1);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    READY_OR(r_cuMemAllocFromPoolAsync, CUDA_ERROR_NOT_INITIALIZED);
    async_args a = {d, n, p, s, 0};
    return async_charged(d, n, pool_dev(p), p, s, 0, do_pool, &a);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    READY_OR(r_cuMemAllocFromPoolAsync_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    async_args a = {d, n, p, s, 1};
    return async_charged(d, n, pool_dev(p), p, s, 1, do_pool, &a);
}

/* Region device a pool's cache is charged on: its location, else the current context's. */
static int pool_reg(CUmemoryPool pool)
{
    int where = pool_dev(pool);
    return where == POOL_HOST ? -1 : where >= 0 ? where : vgpu_current_dev();
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    READY_OR(r_cuMemPoolTrimTo, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = r_cuMemPoolTrimTo(pool, keep);
    if (r == CUDA_SUCCESS)
        pool_settle(pool, pool_reg(pool));
    return r;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    READY_OR(r_cuMemPoolSetAttribute, CUDA_ERROR_NOT_INITIALIZED);
    if (attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD || !value)
        return r_cuMemPoolSetAttribute(pool, attr, value);
    /* Read once, and the driver gets the copy: read back from the tenant's memory after the call,
     * a second thread that wrote 0 there meanwhile had the pool remembered as keeping nothing while
     * the driver kept up to UINT64_MAX, so its cache was never charged (found by review, 1 Dec). */
    cuuint64_t keep = *(cuuint64_t *)value;
    CUresult r = r_cuMemPoolSetAttribute(pool, attr, &keep);
    if (r == CUDA_SUCCESS) {
        pool_threshold(pool, keep);
        pool_settle(pool, pool_reg(pool));
    }
    return r;
}

/* A destroyed pool gives its cache back (allocations still out stay valid until freed). */
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    READY_OR(r_cuMemPoolDestroy, CUDA_ERROR_NOT_INITIALIZED);
    if (!pool)
        return r_cuMemPoolDestroy(pool);
    uint64_t key = (uint64_t)(uintptr_t)pool;
    ptrmap_val v = {0}, k = {0};
    pthread_mutex_lock(&g_mu); /* out before the driver frees the pool (put_back) */
    int had = ptrmap_del(&g_pools, key, &v), had_keep = ptrmap_del(&g_pool_keep, key, &k);
    pthread_mutex_unlock(&g_mu);
    /* the driver makes the default pool current again where this one was (a failed destroy only
     * costs the next cuMemAllocAsync a lookup). Forgotten again once it is destroyed: a lookup
     * (current_pool) that asked the driver while the destroy ran could have been answered this
     * pool and kept it (found by review, 1 Dec); such a lookup either stored before this second
     * clear, or sees g_pool_gone changed after its store and drops it itself. */
    pool_forget(pool);
    CUresult r = r_cuMemPoolDestroy(pool);
    if (r == CUDA_SUCCESS) {
        __atomic_fetch_add(&g_pool_gone, 1, __ATOMIC_SEQ_CST);
        pool_forget(pool);
        if (had && v.size)
            vgpu_release((int)v.aux, v.size, VGPU_MEM_DATA);
    } else {
        if (had)
            put_back(&g_pools, key, &v);
        if (had_keep)
            put_back(&g_pool_keep, key, &k);
    }
    return r;
}

/* Returns by how much the pool's cache charge grew on `reg` (what it keeps of the freed bytes). */
static uint64_t pool_freed(CUmemoryPool pool, uint64_t bytes, int reg)
{
    pthread_mutex_lock(&g_mu);
    ptrmap_val *v = pool_entry(pool), *k = ptrmap_get(&g_pool_keep, (uint64_t)(uintptr_t)pool);
    if (v)
        v->owner = v->owner > bytes ? v->owner - bytes : 0;
    int keeps = !k || k->size || (v && v->size);
    pthread_mutex_unlock(&g_mu);
    return keeps ? pool_settle(pool, reg) : 0; /* what the pool keeps of it */
}

/* A stream-ordered free gives its charge back when it is queued, not when the stream reaches it:
 * the driver hands memory freed on a stream straight to the next allocation on that stream, and
 * a threshold-0 pool keeps it until the next synchronization, so the common loop (allocate, launch,
 * free, allocate again on one busy stream) holds one allocation's memory. Deferring the release to
 * the stream's progress (a host function behind the free) counted every pending free and refused
 * that loop under the limit (tried 1 Dec, found by a regression review, reverted). The gap it
 * closed stays documented (docs/libvgpu.md "Not counted"): until the stream reaches the free,
 * another stream's allocation may be granted memory still in use. */
static CUresult free_async(CUdeviceptr d, CUstream s, __typeof__(&cuMemFreeAsync) real)
{
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    ptrmap_val v;
    int found = d && untrack(&g_ptrs, d, &v);
    CUresult r = real(d, s);
    if (found) {
        if (r == CUDA_SUCCESS)
            vgpu_release(v.dev, v.size, VGPU_MEM_DATA);
        else
            track_aux(&g_ptrs, d, v.size, v.dev, (int)v.kind, v.aux);
        if (r == CUDA_SUCCESS && v.kind == T_ASYNC && v.aux)
            pool_freed((CUmemoryPool)(uintptr_t)v.aux, v.size, v.dev);
    }
    return r;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s)
{
    vgpu_init();
    return free_async(d, s, r_cuMemFreeAsync);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s)
{
    vgpu_init();
    return free_async(d, s, r_cuMemFreeAsync_ptsz);
}

/* ---- memory queries: total = limit, used = the container's ledger ---- */

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    READY_OR(r_cuMemGetInfo_v2, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = r_cuMemGetInfo_v2(free_b, total);
    int reg = vgpu_current_dev();
    if (r != CUDA_SUCCESS || reg < 0 || !vgpu_reg->limit[reg])
        return r;
    uint64_t lim = vgpu_reg->limit[reg], used = vgpu_region_used_reaped(reg);
    uint64_t t = lim < *total ? lim : *total;
    uint64_t f = used < t ? t - used : 0;
    *total = t;
    *free_b = f < *free_b ? f : *free_b;
    return r;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    READY_OR(r_cuDeviceTotalMem_v2, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = r_cuDeviceTotalMem_v2(bytes, dev);
    int reg = vgpu_cuda_dev(dev);
    if (r == CUDA_SUCCESS && reg >= 0 && vgpu_reg->limit[reg] && vgpu_reg->limit[reg] < *bytes)
        *bytes = vgpu_reg->limit[reg];
    return r;
}

/* ---- CUDA graph memory (cuGraphAddMemAllocNode, cuGraphAddNode, stream capture) ----
 * A graph's allocation nodes take no memory when they are added: each gets a fixed address, and
 * the device's graph memory pool maps pages behind those addresses when the executable graph is
 * uploaded or first launched (or instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD). The graph
 * keeps them between launches, and the pool keeps what graphs gave back until
 * cuDeviceGraphMemTrim. None of it passes an allocation hook, so:
 *  - at instantiation the graph's nodes (child graphs too) are walked once for their allocation
 *    nodes: the graph's footprint on a device is the 2 MiB pages their address ranges touch (the
 *    driver gives allocations whose lifetimes do not overlap the same addresses, so this is their
 *    peak, not their sum). A graph whose footprint alone is over the limit is refused there with
 *    CUDA_ERROR_OUT_OF_MEMORY;
 *  - an upload or launch that maps the graph (its first, or its first since a trim) reserves its
 *    footprint, less what the pool holds unused (reserved - used, the driver's figures), under the
 *    limit before the driver is called (CUDA_ERROR_OUT_OF_MEMORY, nothing run, when it does not
 *    fit); then the pool's reservation (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) is charged as the
 *    driver reports it, the reservation turned into that charge without the ledger moving;
 *  - a trim and the destruction of an executable graph settle that charge again.
 * Launches of graphs without allocation nodes (all of them, in most programs) pay one load of a
 * counter; a graph already mapped, a lookup. */
#define GRAPH_PAGE (2ULL << 20)

typedef struct {
    uint64_t foot[VGPU_MAX_DEV];   /* per CUDA ordinal */
    unsigned mapped[VGPU_MAX_DEV]; /* trim epoch + 1 when mapped in it; 0: not mapped */
} graph_mem;

static ptrmap g_gexecs;  /* executable graph with allocation nodes -> its graph_mem (aux), under g_graph_mu */
static int g_gexec_n;    /* how many there are (0: the launch hooks skip all of this) */
static unsigned g_trim_epoch[VGPU_MAX_DEV];     /* cuDeviceGraphMemTrim calls per CUDA ordinal */
static uint64_t g_graph_charged[VGPU_MAX_DEV];  /* the graph pool's reservation charged, per CUDA ordinal */

/* The child of a fork() starts with none of its parent's graphs or graph-pool charge: kept, its
 * first settle released the parent's charge from the child's own slot (the records themselves
 * are the parent's, left allocated). */
static void graph_after_fork(void)
{
    free(g_gexecs.slots);
    memset(&g_gexecs, 0, sizeof g_gexecs);
    g_gexec_n = 0;
    memset(g_trim_epoch, 0, sizeof g_trim_epoch);
    memset(g_graph_charged, 0, sizeof g_graph_charged);
}

typedef struct {
    uint64_t lo, hi;
    int dev;
} graph_range;

typedef struct {
    graph_range *r;
    size_t n, cap;
} graph_ranges;

/* At most this many nodes are walked for one graph (child graphs' included): a bound no real graph
 * comes near, that ends a walk whatever the driver answers. */
#define GRAPH_WALK_MAX (1u << 24)

/* The nodes of `g` into a malloc'd *out (NULL when it has none), their count into *n; on failure
 * *why says what failed. */
static CUresult graph_nodes(CUgraph g, CUgraphNode **out, size_t *n, char *why, size_t whylen)
{
    *out = NULL;
    *n = 0;
    size_t cap = 0;
    CUresult r = p_cuGraphGetNodes(g, NULL, &cap);
    for (int tries = 0; r == CUDA_SUCCESS && cap && tries < 8; tries++) {
        free(*out);
        *out = malloc(cap * sizeof **out);
        if (!*out) {
            snprintf(why, whylen, "out of host memory for the %zu nodes of graph %p", cap, (void *)g);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        size_t got = cap;
        r = p_cuGraphGetNodes(g, *out, &got);
        if (r == CUDA_SUCCESS && got <= cap) { /* else it grew meanwhile: again, with room for all */
            *n = got;
            return CUDA_SUCCESS;
        }
        cap = got;
    }
    free(*out);
    *out = NULL;
    if (r != CUDA_SUCCESS)
        snprintf(why, whylen, "cuGraphGetNodes returned %d for graph %p", (int)r, (void *)g);
    else if (cap) /* it grew at every look */
        snprintf(why, whylen, "graph %p kept growing while its nodes were listed (%zu nodes)", (void *)g, cap);
    return r != CUDA_SUCCESS ? r : cap ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

/* Collect the address ranges (widened to whole pages) of `g`'s allocation nodes, child graphs'
 * included, however deep: a walk that stopped at some depth (it stopped below 32) left a deeper
 * allocation node out, a graph of nothing else had footprint 0, and its launches mapped the memory
 * unchecked and uncharged (found by review, 1 Dec). It walks with a list of graphs to visit, not by
 * recursion (no stack to run out of). Returns CUDA_SUCCESS, or, where a node cannot be read (or the
 * bound is reached), an error and in *why what failed: what the graph maps is then unknown, and the
 * caller refuses it rather than leave a part out. */
static CUresult graph_collect(CUgraph g, graph_ranges *out, char *why, size_t whylen)
{
    if (!p_cuGraphGetNodes || !p_cuGraphNodeGetType)
        return CUDA_SUCCESS; /* a driver without graphs */
    CUgraph *todo = malloc(sizeof *todo);
    size_t ntodo = 0, captodo = 1, walked = 0;
    CUresult r = todo ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (todo)
        todo[ntodo++] = g;
    else
        snprintf(why, whylen, "out of host memory");
    while (r == CUDA_SUCCESS && ntodo) {
        CUgraph cur = todo[--ntodo];
        CUgraphNode *nodes;
        size_t n;
        if ((r = graph_nodes(cur, &nodes, &n, why, whylen)) != CUDA_SUCCESS)
            break;
        if (n > GRAPH_WALK_MAX - walked) {
            r = CUDA_ERROR_NOT_SUPPORTED;
            snprintf(why, whylen, "more than %u nodes (graph %p holds %zu more)", GRAPH_WALK_MAX, (void *)cur, n);
        }
        walked += n;
        for (size_t i = 0; r == CUDA_SUCCESS && i < n; i++) {
            CUgraphNodeType type;
            if ((r = p_cuGraphNodeGetType(nodes[i], &type)) != CUDA_SUCCESS) {
                snprintf(why, whylen, "cuGraphNodeGetType returned %d for node %p", (int)r, (void *)nodes[i]);
                break;
            }
            if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && p_cuGraphMemAllocNodeGetParams) {
                CUDA_MEM_ALLOC_NODE_PARAMS prm;
                memset(&prm, 0, sizeof prm);
                if ((r = p_cuGraphMemAllocNodeGetParams(nodes[i], &prm)) != CUDA_SUCCESS) {
                    snprintf(why, whylen, "cuGraphMemAllocNodeGetParams returned %d for allocation node %p", (int)r,
                             (void *)nodes[i]);
                    break;
                }
                if (!prm.bytesize || prm.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
                    continue;
                if (out->n == out->cap) {
                    size_t ncap = out->cap ? out->cap * 2 : 16;
                    graph_range *nr = realloc(out->r, ncap * sizeof *nr);
                    if (!nr) {
                        r = CUDA_ERROR_OUT_OF_MEMORY;
                        snprintf(why, whylen, "out of host memory");
                        break;
                    }
                    out->r = nr;
                    out->cap = ncap;
                }
                uint64_t lo = prm.dptr / GRAPH_PAGE * GRAPH_PAGE;
                uint64_t hi = round_to(add_sat(prm.dptr, prm.bytesize), GRAPH_PAGE);
                out->r[out->n++] = (graph_range){lo, hi, prm.poolProps.location.id};
            } else if (type == CU_GRAPH_NODE_TYPE_GRAPH && p_cuGraphChildGraphNodeGetGraph) {
                CUgraph child = NULL; /* moved into this one: the only way a child holds memory nodes */
                if ((r = p_cuGraphChildGraphNodeGetGraph(nodes[i], &child)) != CUDA_SUCCESS) {
                    snprintf(why, whylen, "cuGraphChildGraphNodeGetGraph returned %d for node %p", (int)r,
                             (void *)nodes[i]);
                    break;
                }
                if (!child)
                    continue;
                if (ntodo == captodo) {
                    CUgraph *nt = realloc(todo, captodo * 2 * sizeof *nt);
                    if (!nt) {
                        r = CUDA_ERROR_OUT_OF_MEMORY;
                        snprintf(why, whylen, "out of host memory");
                        break;
                    }
                    todo = nt;
                    captodo *= 2;
                }
                todo[ntodo++] = child;
            }
        }
        free(nodes);
    }
    free(todo);
    return r;
}

static int range_cmp(const void *a, const void *b)
{
    const graph_range *x = a, *y = b;
    if (x->dev != y->dev)
        return x->dev < y->dev ? -1 : 1;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* `g`'s footprint per CUDA device: the union of its allocations' pages; *any: whether it has any.
 * Fails as graph_collect does (*why says why). */
static CUresult graph_footprint(CUgraph g, graph_mem *m, int *any, char *why, size_t whylen)
{
    memset(m, 0, sizeof *m);
    *any = 0;
    graph_ranges rs = {0};
    CUresult r = g ? graph_collect(g, &rs, why, whylen) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS) {
        free(rs.r);
        return r;
    }
    qsort(rs.r, rs.n, sizeof *rs.r, range_cmp);
    int dev = -1;
    uint64_t end = 0;
    for (size_t i = 0; i < rs.n; i++) {
        graph_range *x = &rs.r[i];
        if (x->dev < 0 || x->dev >= VGPU_MAX_DEV)
            continue;
        if (x->dev != dev)
            end = 0;
        dev = x->dev;
        uint64_t lo = x->lo > end ? x->lo : end;
        if (x->hi > lo) {
            m->foot[dev] = add_sat(m->foot[dev], x->hi - lo);
            *any = 1;
        }
        if (x->hi > end)
            end = x->hi;
    }
    free(rs.r);
    return CUDA_SUCCESS;
}

/* Charge CUDA device `d`'s graph pool as the driver reserves it now; `held` bytes reserved for
 * this on its region device turn into that charge (g_graph_mu held). */
static void graph_settle(int d, uint64_t held)
{
    int reg = vgpu_cuda_dev(d);
    cuuint64_t now = 0;
    if (reg < 0)
        return;
    if (!p_cuDeviceGetGraphMemAttribute ||
        p_cuDeviceGetGraphMemAttribute(d, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &now) != CUDA_SUCCESS) {
        g_graph_charged[d] = add_sat(g_graph_charged[d], held); /* unknown: what was reserved stays */
        return;
    }
    uint64_t was = add_sat(g_graph_charged[d], held); /* on the ledger now */
    if (now > was)
        vgpu_charge(reg, now - was, VGPU_MEM_DATA); /* the driver holds it: no check */
    else if (now < was)
        vgpu_release(reg, was - now, VGPU_MEM_DATA);
    g_graph_charged[d] = now;
}

/* After a reset of CUDA device `dev`'s primary context: the graph pool's charge follows what the
 * driver still reserves (a reset frees the graphs' memory with the context's), and every graph
 * counts as unmapped there, so a launch maps, checks and charges it again. */
static void graph_after_reset(CUdevice dev)
{
    if (dev < 0 || dev >= VGPU_MAX_DEV)
        return;
    pthread_mutex_lock(&g_graph_mu);
    g_trim_epoch[dev]++;
    if (g_graph_charged[dev])
        graph_settle(dev, 0);
    pthread_mutex_unlock(&g_graph_mu);
}

/* Run `call` (an upload, launch, or instantiation that uploads) that maps the graph of `m` where
 * it is not mapped, under the limit; marks it mapped. g_graph_mu held. */
static CUresult graph_map(graph_mem *m, CUresult (*call)(void *), void *arg)
{
    uint64_t held[VGPU_MAX_DEV] = {0};
    int touched[VGPU_MAX_DEV] = {0};
    for (int d = 0; d < VGPU_MAX_DEV; d++) {
        int reg = m->foot[d] && m->mapped[d] != g_trim_epoch[d] + 1 ? vgpu_cuda_dev(d) : -1;
        if (reg < 0)
            continue;
        cuuint64_t reserved = 0, used = 0;
        if (p_cuDeviceGetGraphMemAttribute &&
            (p_cuDeviceGetGraphMemAttribute(d, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS ||
             p_cuDeviceGetGraphMemAttribute(d, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) != CUDA_SUCCESS))
            reserved = used = 0;
        uint64_t spare = reserved > used ? reserved - used : 0; /* the pool's pages no graph holds */
        uint64_t need = m->foot[d] > spare ? m->foot[d] - spare : 0;
        if (need && vgpu_reserve(reg, need, VGPU_MEM_DATA) != 0) {
            for (int e = 0; e < d; e++)
                if (held[e])
                    vgpu_release(vgpu_cuda_dev(e), held[e], VGPU_MEM_DATA);
            LOG_WARN("CUDA graph refused: its allocation nodes need %llu more bytes of device memory on device %d, "
                     "over the limit", (unsigned long long)need, reg);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        held[d] = need;
        touched[d] = 1;
    }
    CUresult r = call(arg);
    for (int d = 0; d < VGPU_MAX_DEV; d++)
        if (touched[d]) {
            graph_settle(d, held[d]);
            if (r == CUDA_SUCCESS)
                m->mapped[d] = g_trim_epoch[d] + 1;
        }
    return r;
}

/* An upload or launch of `exec`: through graph_map when it has allocation nodes not mapped now. */
static CUresult graph_run(CUgraphExec exec, CUresult (*call)(void *), void *arg)
{
    pthread_mutex_lock(&g_graph_mu);
    ptrmap_val *v = ptrmap_get(&g_gexecs, (uint64_t)(uintptr_t)exec);
    graph_mem *m = v ? (graph_mem *)(uintptr_t)v->aux : NULL;
    int mapped = 1;
    for (int d = 0; m && d < VGPU_MAX_DEV; d++)
        if (m->foot[d] && m->mapped[d] != g_trim_epoch[d] + 1)
            mapped = 0;
    if (mapped) { /* nothing to map: other launches need not wait for this one */
        pthread_mutex_unlock(&g_graph_mu);
        return call(arg);
    }
    CUresult r = graph_map(m, call, arg);
    pthread_mutex_unlock(&g_graph_mu);
    return r;
}

typedef struct {
    CUgraphExec *exec;
    CUgraph g;
    int version; /* 1: cuGraphInstantiate, 2: _v2, 3: WithFlags, 4: WithParams, 5: its _ptsz */
    CUgraphNode *err;
    char *log;
    size_t len;
    unsigned long long flags;
    CUDA_GRAPH_INSTANTIATE_PARAMS *params;
} inst_args;

static CUresult do_instantiate(void *a)
{
    inst_args *x = a;
    switch (x->version) {
    case 1: return r_cuGraphInstantiate(x->exec, x->g, x->err, x->log, x->len);
    case 2: return r_cuGraphInstantiate_v2(x->exec, x->g, x->err, x->log, x->len);
    case 3: return r_cuGraphInstantiateWithFlags(x->exec, x->g, x->flags);
    case 4: return r_cuGraphInstantiateWithParams(x->exec, x->g, x->params);
    default: return r_cuGraphInstantiateWithParams_ptsz(x->exec, x->g, x->params);
    }
}

/* Whether a footprint is over a device's limit on its own (said in the log, `when` saying more). */
static int graph_over(const graph_mem *m, const char *when)
{
    for (int d = 0; d < VGPU_MAX_DEV; d++) {
        int reg = m->foot[d] ? vgpu_cuda_dev(d) : -1;
        if (reg >= 0 && vgpu_reg->limit[reg] && m->foot[d] > vgpu_reg->limit[reg]) {
            LOG_WARN("CUDA graph refused: its allocation nodes need %llu bytes of device memory on device %d, over "
                     "its limit of %llu%s", (unsigned long long)m->foot[d], reg,
                     (unsigned long long)vgpu_reg->limit[reg], when);
            return 1;
        }
    }
    return 0;
}

/* Undo an instantiation refused after the driver made it (g_graph_mu held): the executable graph
 * is destroyed; where it was uploaded with pages never checked under the limit (`unchecked`), the
 * device's graph pool is trimmed, so the pool does not keep them, and settled. The upload is
 * ordered on its stream (`upload`: the parameters' hUploadStream), behind whatever the tenant
 * queued there; trimmed while it was still queued, its pages were in use, the trim left them, and
 * they stayed reserved and charged past the limit (found by the regression review, 1 Dec; reasoned
 * from the driver's documented ordering, not seen on a GPU). That stream is synchronized first
 * (under g_graph_mu, as the rest: a tenant stalling its own upload stream stalls its own graph
 * launches meanwhile, nobody else's). */
static void graph_unmake(CUgraphExec made, const int *unchecked, CUstream upload)
{
    int trims = 0;
    for (int d = 0; unchecked && d < VGPU_MAX_DEV; d++)
        trims |= unchecked[d];
    CUresult w = trims && p_cuStreamSynchronize ? p_cuStreamSynchronize(upload) : CUDA_SUCCESS;
    if (w != CUDA_SUCCESS)
        LOG_WARN("the upload stream %p of a refused CUDA graph could not be synchronized (cuStreamSynchronize "
                 "returned %d): what a queued upload maps stays charged until a trim gives it back",
                 (void *)upload, (int)w);
    ptrmap_val old;
    if (ptrmap_del(&g_gexecs, (uint64_t)(uintptr_t)made, &old)) { /* a stale record of a reused handle */
        free((void *)(uintptr_t)old.aux);
        __atomic_fetch_sub(&g_gexec_n, 1, __ATOMIC_RELAXED);
    }
    r_cuGraphExecDestroy(made);
    for (int d = 0; unchecked && d < VGPU_MAX_DEV; d++)
        if (unchecked[d]) {
            if (r_cuDeviceGraphMemTrim && r_cuDeviceGraphMemTrim(d) == CUDA_SUCCESS)
                g_trim_epoch[d]++; /* as cuDeviceGraphMemTrim: the graphs it unmapped are checked again */
            graph_settle(d, 0);
        }
}

/* Instantiate `a->g`: refused when its footprint alone is over a device's limit; mapped under
 * the limit when the instantiation uploads it; remembered for its launches. The driver answers
 * into a local, remembered before it is copied to the caller's variable (cuMemCreate): read back
 * from the tenant's memory, another thread could have put another graph's handle there, and the
 * real one would launch with its allocation nodes unknown, uncharged.
 * The graph is walked before the driver call (to refuse or map it) and again once the driver made
 * it: a second thread adding an allocation node meanwhile (a graph is not thread-safe, but nothing
 * stops a tenant) had the executable graph remembered with the smaller footprint, or with none (its
 * launches then mapped the added memory unchecked, uncharged; found by review, 1 Dec). The larger
 * of the two is remembered; over the limit, the executable graph is destroyed and refused. An
 * instantiation that uploaded pages nobody checked (the added ones) is settled at once, and refused,
 * its pool trimmed, when that leaves the device over its limit. A graph whose nodes cannot be read
 * (graph_collect) is refused: what it maps is unknown. */
static CUresult graph_instantiate(inst_args *a, int upload)
{
    graph_mem m, after;
    CUgraphExec *caller = a->exec, made = NULL;
    char why[192] = "";
    int any = 0, more = 0;
    if (!caller)
        return do_instantiate(a);
    a->exec = &made;
    CUresult r = graph_footprint(a->g, &m, &any, why, sizeof why);
    if (r != CUDA_SUCCESS) {
        LOG_WARN("CUDA graph refused: its allocation nodes cannot be counted (%s)", why);
        return r;
    }
    if (graph_over(&m, ""))
        return CUDA_ERROR_OUT_OF_MEMORY;
    int locked = any; /* through the driver call only for allocation nodes: else launches would wait for nothing */
    if (locked)
        pthread_mutex_lock(&g_graph_mu);
    r = any && upload ? graph_map(&m, do_instantiate, a) : do_instantiate(a);
    if (r != CUDA_SUCCESS || !made) {
        if (locked)
            pthread_mutex_unlock(&g_graph_mu);
        if (r == CUDA_SUCCESS)
            *caller = made;
        return r;
    }
    CUresult w = graph_footprint(a->g, &after, &more, why, sizeof why); /* again: what the driver made */
    int grown[VGPU_MAX_DEV] = {0}, grew = 0;
    for (int d = 0; w == CUDA_SUCCESS && d < VGPU_MAX_DEV; d++)
        if (after.foot[d] > m.foot[d]) {
            m.foot[d] = after.foot[d];
            grown[d] = grew = 1;
        }
    if (!locked && (more || __atomic_load_n(&g_gexec_n, __ATOMIC_RELAXED))) {
        pthread_mutex_lock(&g_graph_mu);
        locked = 1;
    }
    int past = 0; /* an upload of unchecked pages left a device over its limit */
    if (upload && grew)
        for (int d = 0; d < VGPU_MAX_DEV; d++) {
            int reg = grown[d] ? vgpu_cuda_dev(d) : -1;
            if (reg < 0)
                continue;
            graph_settle(d, 0); /* the driver mapped them: charged as it reserves now */
            m.mapped[d] = g_trim_epoch[d] + 1;
            if (vgpu_reg->limit[reg] && vgpu_region_used_reaped(reg) > vgpu_reg->limit[reg]) {
                LOG_WARN("CUDA graph refused: allocation nodes added to it while it was instantiated were uploaded "
                         "with it, %llu bytes on device %d in all, over the limit of %llu",
                         (unsigned long long)m.foot[d], reg, (unsigned long long)vgpu_reg->limit[reg]);
                past = 1;
            }
        }
    graph_mem *keep = NULL;
    CUresult refuse = CUDA_SUCCESS;
    if (w != CUDA_SUCCESS) {
        LOG_WARN("CUDA graph refused: its allocation nodes cannot be counted once instantiated (%s)", why);
        refuse = w;
        if (upload) /* what it uploaded is unknown: every device's graph pool is trimmed and settled */
            for (int d = 0; d < VGPU_MAX_DEV; d++)
                grown[d] = vgpu_cuda_dev(d) >= 0;
    } else if (past || graph_over(&m, " (allocation nodes were added to it while it was instantiated)")) {
        refuse = CUDA_ERROR_OUT_OF_MEMORY;
    } else if ((any || more) && !(keep = malloc(sizeof *keep))) {
        LOG_WARN("CUDA graph refused: out of host memory to remember its allocation nodes");
        refuse = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (refuse != CUDA_SUCCESS) {
        if (!locked)
            pthread_mutex_lock(&g_graph_mu);
        CUstream us = a->params ? a->params->hUploadStream : NULL;
        if (!us && a->version == 5) /* cuGraphInstantiateWithParams_ptsz: the per-thread default stream */
            us = CU_STREAM_PER_THREAD;
        graph_unmake(made, upload ? grown : NULL, us);
        pthread_mutex_unlock(&g_graph_mu);
        return refuse;
    }
    ptrmap_val old; /* a handle of an executable graph gone with its context, given out again */
    if (locked && ptrmap_del(&g_gexecs, (uint64_t)(uintptr_t)made, &old)) {
        free((void *)(uintptr_t)old.aux);
        __atomic_fetch_sub(&g_gexec_n, 1, __ATOMIC_RELAXED);
    }
    if (keep) {
        *keep = m;
        if (ptrmap_put(&g_gexecs, (uint64_t)(uintptr_t)made, (ptrmap_val){.aux = (uint64_t)(uintptr_t)keep}) == 0)
            __atomic_fetch_add(&g_gexec_n, 1, __ATOMIC_RELAXED);
        else
            free(keep);
    }
    if (locked)
        pthread_mutex_unlock(&g_graph_mu);
    *caller = made;
    return CUDA_SUCCESS;
}

/* The pre-11.4 signature (error node and log): still exported, reached by name or through
 * cuGetProcAddress below 12000. */
EXPORT CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph g, CUgraphNode *err, char *log, size_t len)
{
    READY_OR(r_cuGraphInstantiate, CUDA_ERROR_NOT_INITIALIZED);
    inst_args a = {exec, g, 1, err, log, len, 0, NULL};
    return graph_instantiate(&a, 0);
}

EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph g, CUgraphNode *err, char *log, size_t len)
{
    READY_OR(r_cuGraphInstantiate_v2, CUDA_ERROR_NOT_INITIALIZED);
    inst_args a = {exec, g, 2, err, log, len, 0, NULL};
    return graph_instantiate(&a, 0);
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph g, unsigned long long flags)
{
    READY_OR(r_cuGraphInstantiateWithFlags, CUDA_ERROR_NOT_INITIALIZED);
    inst_args a = {exec, g, 3, NULL, NULL, 0, flags, NULL};
    return graph_instantiate(&a, 0);
}

/* The parameters are read once: whether the instantiation uploads is judged on a copy, and the
 * driver gets that copy (its answers, hErrNode_out and result_out, are copied back). Judged on the
 * tenant's memory and read there again by the driver, a second thread turning the upload flag
 * off in between had graph_map reserve, the driver map nothing, the reservation settled away and
 * the graph marked mapped, so every launch then mapped its memory unchecked and uncharged; turned
 * on, the driver uploaded what nothing had checked (found by review, 1 Dec). */
static CUresult instantiate_with_params(CUgraphExec *exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p, int version)
{
    if (!p) {
        inst_args a = {exec, g, version, NULL, NULL, 0, 0, NULL};
        return graph_instantiate(&a, 0);
    }
    CUDA_GRAPH_INSTANTIATE_PARAMS pp = *p;
    inst_args a = {exec, g, version, NULL, NULL, 0, 0, &pp};
    CUresult r = graph_instantiate(&a, (pp.flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0);
    p->hErrNode_out = pp.hErrNode_out;
    p->result_out = pp.result_out;
    return r;
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    READY_OR(r_cuGraphInstantiateWithParams, CUDA_ERROR_NOT_INITIALIZED);
    return instantiate_with_params(exec, g, p, 4);
}

EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    READY_OR(r_cuGraphInstantiateWithParams_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    return instantiate_with_params(exec, g, p, 5);
}

typedef struct {
    CUgraphExec exec;
    CUstream s;
    int op; /* 0 launch, 1 launch_ptsz, 2 upload, 3 upload_ptsz */
} run_args;

static CUresult do_graph(void *a)
{
    run_args *x = a;
    switch (x->op) {
    case 0: return r_cuGraphLaunch(x->exec, x->s);
    case 1: return r_cuGraphLaunch_ptsz(x->exec, x->s);
    case 2: return r_cuGraphUpload(x->exec, x->s);
    default: return r_cuGraphUpload_ptsz(x->exec, x->s);
    }
}

EXPORT CUresult cuGraphUpload(CUgraphExec exec, CUstream s)
{
    READY_OR(r_cuGraphUpload, CUDA_ERROR_NOT_INITIALIZED);
    if (LIKELY(!__atomic_load_n(&g_gexec_n, __ATOMIC_RELAXED)))
        return r_cuGraphUpload(exec, s);
    run_args a = {exec, s, 2};
    return graph_run(exec, do_graph, &a);
}

EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec exec, CUstream s)
{
    READY_OR(r_cuGraphUpload_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    if (LIKELY(!__atomic_load_n(&g_gexec_n, __ATOMIC_RELAXED)))
        return r_cuGraphUpload_ptsz(exec, s);
    run_args a = {exec, s, 3};
    return graph_run(exec, do_graph, &a);
}

/* Its pages go back to the pool (still reserved, still charged until a trim). */
EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    READY_OR(r_cuGraphExecDestroy, CUDA_ERROR_NOT_INITIALIZED);
    if (!__atomic_load_n(&g_gexec_n, __ATOMIC_RELAXED))
        return r_cuGraphExecDestroy(exec);
    uint64_t key = (uint64_t)(uintptr_t)exec;
    ptrmap_val v;
    pthread_mutex_lock(&g_graph_mu); /* out before the driver frees the handle (back if it fails) */
    int found = ptrmap_del(&g_gexecs, key, &v);
    if (found)
        __atomic_fetch_sub(&g_gexec_n, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_graph_mu);
    CUresult r = r_cuGraphExecDestroy(exec);
    if (!found)
        return r;
    graph_mem *m = (graph_mem *)(uintptr_t)v.aux;
    pthread_mutex_lock(&g_graph_mu);
    if (r == CUDA_SUCCESS) {
        for (int d = 0; d < VGPU_MAX_DEV; d++)
            if (m->foot[d])
                graph_settle(d, 0);
        free(m);
    } else if (ptrmap_put(&g_gexecs, key, v) == 0) {
        __atomic_fetch_add(&g_gexec_n, 1, __ATOMIC_RELAXED);
    } else {
        free(m);
    }
    pthread_mutex_unlock(&g_graph_mu);
    return r;
}

/* The pool gives back what no graph holds; graphs idle then are unmapped too, so each one's next
 * upload or launch is checked again (a new epoch). */
EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    READY_OR(r_cuDeviceGraphMemTrim, CUDA_ERROR_NOT_INITIALIZED);
    pthread_mutex_lock(&g_graph_mu);
    CUresult r = r_cuDeviceGraphMemTrim(dev);
    if (r == CUDA_SUCCESS && dev >= 0 && dev < VGPU_MAX_DEV) {
        g_trim_epoch[dev]++;
        graph_settle(dev, 0);
    }
    pthread_mutex_unlock(&g_graph_mu);
    return r;
}

/* ---- launches: the fast path. No lock, no syscall; the compute-share gate is a single
 * predictable branch while no limiter is installed. ---- */

#define GATE(kind_, gx, gy, gz, s, pt)                                                             \
    if (UNLIKELY(vgpu_launch_gate != NULL)) {                                                      \
        vgpu_launch_info _i = {kind_, gx, gy, gz, s, pt};                                          \
        CUresult _g = vgpu_launch_gate(&_i);                                                       \
        if (_g != CUDA_SUCCESS)                                                                    \
            return _g;                                                                             \
    }                                                                                              \
    vgpu_note_kernel();

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                               void **extra)
{
    READY_OR(r_cuLaunchKernel, CUDA_ERROR_NOT_INITIALIZED);
    GATE(VGPU_LAUNCH_KERNEL, gx, gy, gz, s, 0);
    return r_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                                    void **extra)
{
    READY_OR(r_cuLaunchKernel_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    GATE(VGPU_LAUNCH_KERNEL, gx, gy, gz, s, 1);
    return r_cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    READY_OR(r_cuLaunchKernelEx, CUDA_ERROR_NOT_INITIALIZED);
    if (c) {
        GATE(VGPU_LAUNCH_EX, c->gridDimX, c->gridDimY, c->gridDimZ, c->hStream, 0);
    }
    return r_cuLaunchKernelEx(c, f, params, extra);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    READY_OR(r_cuLaunchKernelEx_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    if (c) {
        GATE(VGPU_LAUNCH_EX, c->gridDimX, c->gridDimY, c->gridDimZ, c->hStream, 1);
    }
    return r_cuLaunchKernelEx_ptsz(c, f, params, extra);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                          CUstream s, void **params)
{
    READY_OR(r_cuLaunchCooperativeKernel, CUDA_ERROR_NOT_INITIALIZED);
    GATE(VGPU_LAUNCH_COOPERATIVE, gx, gy, gz, s, 0);
    return r_cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shm, s, params);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                               unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                               CUstream s, void **params)
{
    READY_OR(r_cuLaunchCooperativeKernel_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    GATE(VGPU_LAUNCH_COOPERATIVE, gx, gy, gz, s, 1);
    return r_cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shm, s, params);
}

/* The deprecated multi-device cooperative launch (libcuda 12 still exports it): one kernel on each
 * listed device, each on a stream of that device's context. Unhooked, it launched past the
 * compute-share and priority gate (found by review, 1 Dec). The gate runs once per device, with
 * that device's context current (the limiter takes the launch's device from the current context),
 * then the real call launches them all: a gate that refuses leaves nothing launched. */
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned n, unsigned flags)
{
    READY_OR(r_cuLaunchCooperativeKernelMultiDevice, CUDA_ERROR_NOT_INITIALIZED);
    if (UNLIKELY(vgpu_launch_gate != NULL) && list) {
        CUdevice gated[64];
        unsigned ngated = 0;
        for (unsigned i = 0; i < n; i++) {
            const CUDA_LAUNCH_PARAMS *p = &list[i];
            CUcontext ctx = NULL, popped = NULL;
            CUdevice dev = -1;
            int pushed = p->hStream && p_cuStreamGetCtx && p_cuCtxPushCurrent_v2 && p_cuCtxPopCurrent_v2 &&
                         p_cuStreamGetCtx(p->hStream, &ctx) == CUDA_SUCCESS && ctx &&
                         p_cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
            if (p_cuCtxGetDevice && p_cuCtxGetDevice(&dev) != CUDA_SUCCESS)
                dev = -1;
            int seen = 0;
            for (unsigned k = 0; k < ngated && !seen; k++)
                seen = gated[k] == dev;
            CUresult g = CUDA_SUCCESS;
            if (!seen) {
                if (ngated < sizeof gated / sizeof gated[0])
                    gated[ngated++] = dev;
                vgpu_launch_info info = {VGPU_LAUNCH_COOPERATIVE, p->gridDimX, p->gridDimY, p->gridDimZ, p->hStream, 0};
                g = vgpu_launch_gate(&info);
            }
            if (pushed)
                p_cuCtxPopCurrent_v2(&popped);
            if (g != CUDA_SUCCESS)
                return g;
        }
    }
    vgpu_note_kernel();
    return r_cuLaunchCooperativeKernelMultiDevice(list, n, flags);
}

/* The deprecated launches (block shape from cuFuncSetBlockShape), still exported by libcuda 12:
 * the same gate. cuLaunch runs a 1 x 1 grid; both synchronous ones use the legacy stream. */
EXPORT CUresult cuLaunch(CUfunction f)
{
    READY_OR(r_cuLaunch, CUDA_ERROR_NOT_INITIALIZED);
    GATE(VGPU_LAUNCH_KERNEL, 1, 1, 1, NULL, 0);
    return r_cuLaunch(f);
}

EXPORT CUresult cuLaunchGrid(CUfunction f, int gw, int gh)
{
    READY_OR(r_cuLaunchGrid, CUDA_ERROR_NOT_INITIALIZED);
    GATE(VGPU_LAUNCH_KERNEL, gw > 0 ? (unsigned)gw : 0, gh > 0 ? (unsigned)gh : 0, 1, NULL, 0);
    return r_cuLaunchGrid(f, gw, gh);
}

EXPORT CUresult cuLaunchGridAsync(CUfunction f, int gw, int gh, CUstream s)
{
    READY_OR(r_cuLaunchGridAsync, CUDA_ERROR_NOT_INITIALIZED);
    GATE(VGPU_LAUNCH_KERNEL, gw > 0 ? (unsigned)gw : 0, gh > 0 ? (unsigned)gh : 0, 1, s, 0);
    return r_cuLaunchGridAsync(f, gw, gh, s);
}

/* A graph with allocation nodes maps its memory at its first launch (graph_run). */
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
    READY_OR(r_cuGraphLaunch, CUDA_ERROR_NOT_INITIALIZED);
    GATE(VGPU_LAUNCH_GRAPH, 0, 0, 0, s, 0);
    if (UNLIKELY(__atomic_load_n(&g_gexec_n, __ATOMIC_RELAXED))) {
        run_args a = {g, s, 0};
        return graph_run(g, do_graph, &a);
    }
    return r_cuGraphLaunch(g, s);
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
    READY_OR(r_cuGraphLaunch_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    GATE(VGPU_LAUNCH_GRAPH, 0, 0, 0, s, 1);
    if (UNLIKELY(__atomic_load_n(&g_gexec_n, __ATOMIC_RELAXED))) {
        run_args a = {g, s, 1};
        return graph_run(g, do_graph, &a);
    }
    return r_cuGraphLaunch_ptsz(g, s);
}

/* ---- cuGetProcAddress: ask the real driver (which honours cudaVersion and the
 * per-thread-default-stream flag), then swap the function it chose for our hook of the
 * same variant. If the driver returns an address we cannot match, fall back to picking
 * our variant by name, version and flag. ---- */

static void *to_hook(const char *sym, void *fn, int version, cuuint64_t flags)
{
    for (int i = 0; i < vgpu_nhooks; i++)
        if (vgpu_hooks[i].name[0] == 'c' && *vgpu_hooks[i].real == fn)
            return vgpu_hooks[i].hook;
    /* from 12.0 "cuGraphInstantiate" is the three-argument one (cuda.h's alias), not _v2 */
    if (!strcmp(sym, "cuGraphInstantiate") && version >= 12000)
        sym = "cuGraphInstantiateWithFlags";
    int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, has_pt = 0;
    for (int i = 0; i < vgpu_nhooks; i++)
        if (!strcmp(vgpu_hooks[i].base, sym) && vgpu_hooks[i].per_thread && *vgpu_hooks[i].real)
            has_pt = 1;
    const vgpu_hook *best = NULL;
    for (int i = 0; i < vgpu_nhooks; i++) {
        const vgpu_hook *h = &vgpu_hooks[i];
        if (h->name[0] != 'c' || strcmp(h->base, sym) || h->per_thread != (want_pt && has_pt) ||
            !*h->real || h->since > version)
            continue;
        if (!best || h->since > best->since)
            best = h;
    }
    return best ? best->hook : fn;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    READY_OR(r_cuGetProcAddress_v2, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = r_cuGetProcAddress_v2(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn)
        *pfn = to_hook(symbol, *pfn, version, flags);
    return r;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    READY_OR(r_cuGetProcAddress, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = r_cuGetProcAddress(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn)
        *pfn = to_hook(symbol, *pfn, version, flags);
    return r;
}
