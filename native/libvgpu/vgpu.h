/* libvgpu internals shared by its source files (all hidden). */
#ifndef VGPU_VGPU_H
#define VGPU_VGPU_H

#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>

#include "region.h"

#define HIDDEN __attribute__((visibility("hidden")))
#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- configuration (environment, HAMi-core contract) ---- */
typedef struct {
    uint64_t limit[VGPU_MAX_DEV];    /* CUDA_DEVICE_MEMORY_LIMIT[_i], bytes, 0 = none */
    uint64_t sm_limit[VGPU_MAX_DEV]; /* CUDA_DEVICE_SM_LIMIT[_i], percent (100 = none) */
    char cache_path[4096];           /* CUDA_DEVICE_MEMORY_SHARED_CACHE */
    int oversubscribe;               /* CUDA_OVERSUBSCRIBE */
    int log_level;                   /* LIBCUDA_LOG_LEVEL */
    int priority;                    /* CUDA_TASK_PRIORITY */
    int core_policy;                 /* GPU_CORE_UTILIZATION_POLICY: 0 default, 1 force, 2 disable */
    int core_policy_implied;         /* force without the variable: koordlet's settings (config.c) */
    long long context_size;          /* LIBVGPU_CONTEXT_SIZE, -1 = measure */
    unsigned test_stall_ms;          /* LIBVGPU_TEST_STALL_IN_LOCK_MS (tests only) */
} vgpu_config;

HIDDEN extern vgpu_config vgpu_cfg;
HIDDEN void vgpu_config_load(void);            /* exits with a clear message on bad input */
HIDDEN int vgpu_parse_size(const char *s, uint64_t *out);

HIDDEN void vgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
HIDDEN long vgpu_env_int(const char *name, long dflt, long lo, long hi, const char *unit);
/* A setting: the grant file's value when the device plugin mounted one (GRANT_FILE), else the
 * environment's. */
HIDDEN const char *vgpu_getenv(const char *name);
/* The mounts of libvgpu's own that this process has, from one scan of /proc/self/mountinfo (the
 * first call's): how many mount points are named GRANT_FILE (the grant, config.c; the path of the
 * first in grant_path) and PENDING_MARKER (the NRI hook never served this container,
 * cuda_hooks.c). */
#define PENDING_MARKER "grant-pending"
struct vgpu_mounts {
    int grant, pending;
    char grant_path[4096];
};
HIDDEN const struct vgpu_mounts *vgpu_mounts(void);
/* Whether a device the process sees (its UUID) is one its grant names (HAMI_GRANT_DEVICES, the
 * grant file's; every device when there is no list). A MIG device matches its grant entry by the
 * bytes after the GPU-/MIG- prefix; during NVML's registration (vgpu_nvml_internal raised) a GPU
 * is granted too when one of its MIG devices is (NVML lists a MIG device's GPU first). */
HIDDEN int vgpu_device_granted(const char *uuid);
/* Whether the grant's device list names `uuid` itself (same matching, no GPU for its MIG
 * devices): 1 named, 0 not named, -1 no list. */
HIDDEN int vgpu_grant_names(const char *uuid);
#define LOG_ERROR(...) vgpu_log(0, __VA_ARGS__)
#define LOG_WARN(...) vgpu_log(2, __VA_ARGS__)
#define LOG_INFO(...) vgpu_log(3, __VA_ARGS__)
#define LOG_DEBUG(...) vgpu_log(4, __VA_ARGS__)

/* ---- the shared region ---- */
HIDDEN extern vgpu_region *vgpu_reg;
HIDDEN extern vgpu_slot *vgpu_my_slot;
/* 1 once the exit handler ran (region.c): the slot keeps the process's charge until it is gone,
 * but nothing more is published into it */
HIDDEN extern int vgpu_exiting;
/* this process's slot for what it publishes (host PID, launch times, compute shares), read once:
 * NULL before it has one and once the exit handler ran (which may happen while another thread
 * runs), so a caller keeps this copy rather than reading the global again. Charges go through
 * vgpu_my_slot itself, through the exit handlers too. */
static inline vgpu_slot *vgpu_slot_mine(void)
{
    if (__atomic_load_n(&vgpu_exiting, __ATOMIC_ACQUIRE))
        return NULL;
    return __atomic_load_n(&vgpu_my_slot, __ATOMIC_ACQUIRE);
}
HIDDEN int vgpu_region_open(void);        /* create or attach, register this process */
HIDDEN void vgpu_region_lock(void);
HIDDEN void vgpu_region_unlock(void);
HIDDEN uint64_t vgpu_region_used(int dev); /* sum over live slots */
HIDDEN uint64_t vgpu_region_used_reaped(int dev); /* same, after reclaiming dead slots */
/* The largest single charge: 2^62 bytes (4 EiB), more than any device has. vgpu_reserve refuses
 * above it, so one charge cannot wrap a slot's 64-bit sums (the hooks saturate sizes that would
 * wrap while rounded or multiplied, which lands here). */
#define VGPU_MAX_CHARGE (1ULL << 62)
/* Check-and-add under the region lock: 0 on success, -1 when over the limit (or when `bytes`
 * is above VGPU_MAX_CHARGE). */
HIDDEN int vgpu_reserve(int dev, uint64_t bytes, int type);
HIDDEN void vgpu_release(int dev, uint64_t bytes, int type);
HIDDEN void vgpu_charge(int dev, uint64_t bytes, int type); /* add without a limit check */
HIDDEN int vgpu_region_dev_for_uuid(const char *uuid, int add); /* -1 if unknown/full */
/* Region device `dev`'s UUID, NUL-terminated whatever the region holds ("" if none). */
HIDDEN void vgpu_region_uuid(int dev, char out[VGPU_UUID_LEN + 1]);
/* The region lock is reentrant within a thread: the real libnvidia-ml.so.1 calls its own exported
 * names (nvmlInit_v2 -> nvmlInitWithFlags), which resolve to our hooks, so a hook can run inside a
 * section of ours that already holds the lock (a context's first measurement). */

/* Calls libvgpu makes into the real NVML for itself (context measurement, host PID, utilization)
 * run with this counter raised: a hook the real library re-enters then passes straight through,
 * neither virtualized nor registering devices, so libvgpu reads the physical figures it asked for. */
HIDDEN extern __thread int vgpu_nvml_internal __attribute__((tls_model("initial-exec")));
HIDDEN void vgpu_region_after_fork(void);
HIDDEN void vgpu_note_kernel(void);        /* launch bookkeeping (last_kernel_time) */

/* ---- real driver / NVML ---- */
HIDDEN void *vgpu_real_dlsym_fn(void *handle, const char *name);
HIDDEN void vgpu_init(void);               /* idempotent, cheap after the first call */
HIDDEN extern int vgpu_inited;
/* 1 when the container's grant was never applied (HAMI_NRI_INJECTION=pending): no device */
HIDDEN extern int vgpu_refused;
HIDDEN void *vgpu_nvml_sym(const char *name); /* real NVML function or NULL */
HIDDEN int vgpu_cuda_dev(int cuda_ordinal); /* region index, -1 if unknown */
HIDDEN int vgpu_current_dev(void);          /* region index of the current context */
HIDDEN int vgpu_nvml_dev(void *nvml_device); /* region index for an NVML handle */

/* Hook table: every exported CUDA/NVML function, its real counterpart, and the data
 * cuGetProcAddress needs to pick the variant. */
typedef struct {
    const char *name;
    const char *base;  /* cuGetProcAddress name */
    int since;         /* first CUDA version that returns this variant */
    int per_thread;
    void *hook;
    void **real;
} vgpu_hook;

HIDDEN extern const vgpu_hook vgpu_hooks[];
HIDDEN extern const int vgpu_nhooks;
HIDDEN const vgpu_hook *vgpu_hook_by_name(const char *name);

/* ---- compute-share hook point (issue 7 plugs its limiter in here) ----
 * Called on every kernel launch path (cuLaunchKernel[_ptsz], cuLaunchKernelEx[_ptsz],
 * cuLaunchCooperativeKernel[_ptsz], cuGraphLaunch[_ptsz], the deprecated
 * cuLaunchCooperativeKernelMultiDevice (once per device, that device's context current), and the
 * deprecated cuLaunch, cuLaunchGrid, cuLaunchGridAsync as VGPU_LAUNCH_KERNEL) before the real
 * launch, only when non-NULL. A non-CUDA_SUCCESS return is returned to the caller without
 * launching. */
typedef enum { VGPU_LAUNCH_KERNEL, VGPU_LAUNCH_EX, VGPU_LAUNCH_COOPERATIVE, VGPU_LAUNCH_GRAPH } vgpu_launch_kind;
typedef struct {
    vgpu_launch_kind kind;
    unsigned grid_x, grid_y, grid_z; /* 0 for graph launches */
    CUstream stream;
    int per_thread;
} vgpu_launch_info;
typedef CUresult (*vgpu_launch_gate_fn)(const vgpu_launch_info *info);
HIDDEN extern vgpu_launch_gate_fn vgpu_launch_gate;

#endif
