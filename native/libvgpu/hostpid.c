/* The PID of this process as NVML reports it (the host PID), found from the kernel's own
 * records instead of by diffing NVML's process list around a context creation:
 *
 * 1. In the initial PID namespace (its inode number is fixed by the kernel,
 *    PROC_PID_INIT_INO = 0xEFFFFFFC) getpid() is the host PID.
 * 2. Otherwise /proc/self/status "NSpid:" lists our PID in every namespace from the one
 *    that mounted /proc down to ours; with more than one entry the first is the PID in an
 *    outer namespace (the host's when /proc comes from the host, e.g. `unshare --pid`
 *    without --mount-proc, or a host /proc bind mount).
 * 3. Otherwise (a container with its own /proc), or when NVML does not list the answer of
 *    1./2. (a driver in another namespace, or the fake GPU's FAKEGPU_HOSTPID_OFFSET), a
 *    signature probe: allocate a random number of 2 MiB pages straight from the driver
 *    (not charged to the container), and take the one NVML process whose used memory grew
 *    by exactly that much and shrank by it again on free. A concurrent context creation
 *    elsewhere cannot be mistaken for ours (HAMi's race), because it would have to match a
 *    random size twice. Needs a current context; tried up to three times. */
#include "vgpu.h"
#include "limiter.h"

#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INIT_PID_NS_INO 4026531836ULL /* 0xEFFFFFFC */

static int in_init_pid_ns(void)
{
    char buf[64];
    ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    unsigned long long ino = 0;
    return sscanf(buf, "pid:[%llu]", &ino) == 1 && ino == INIT_PID_NS_INO;
}

/* First NSpid entry when there are at least two, else 0. */
static int outer_nspid(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    int pid = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "NSpid:", 6))
            continue;
        char *end, *p = line + 6;
        long first = strtol(p, &end, 10);
        int more = 0;
        for (p = end; *p; p++)
            more |= *p >= '0' && *p <= '9';
        if (end != line + 6 && more && first > 0)
            pid = (int)first;
        break;
    }
    fclose(f);
    return pid;
}

int lim_host_pid(void)
{
    if (in_init_pid_ns())
        return (int)getpid();
    return outer_nspid();
}

HIDDEN extern __typeof__(&nvmlInit_v2) vgpu_real_nvmlInit_v2;

#define MAX_NVML_PROCS 256
#define PAGE (2ULL << 20)

typedef struct {
    unsigned pid;
    unsigned long long used;
} proc_mem;

static int list_procs(nvmlDevice_t dev, proc_mem *out)
{
    static __typeof__(&nvmlDeviceGetComputeRunningProcesses_v3) get;
    if (!get)
        get = vgpu_nvml_sym("nvmlDeviceGetComputeRunningProcesses_v3");
    nvmlProcessInfo_t info[MAX_NVML_PROCS];
    unsigned n = MAX_NVML_PROCS;
    if (!get || get(dev, &n, info) != NVML_SUCCESS)
        return -1;
    for (unsigned i = 0; i < n && i < MAX_NVML_PROCS; i++)
        out[i] = (proc_mem){info[i].pid, info[i].usedGpuMemory};
    return (int)(n < MAX_NVML_PROCS ? n : MAX_NVML_PROCS);
}

static long long used_of(const proc_mem *p, int n, unsigned pid)
{
    for (int i = 0; i < n; i++)
        if (p[i].pid == pid)
            return (long long)p[i].used;
    return -1;
}

static int grew_by(long long before, long long after, unsigned long long size)
{
    return before >= 0 && after >= before && (unsigned long long)(after - before) >= size &&
           (unsigned long long)(after - before) <= size + 2 * PAGE;
}

static int probe(nvmlDevice_t dev)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    __typeof__(&cuMemAlloc_v2) alloc = cuda ? vgpu_real_dlsym_fn(cuda, "cuMemAlloc_v2") : NULL;
    __typeof__(&cuMemFree_v2) release = cuda ? vgpu_real_dlsym_fn(cuda, "cuMemFree_v2") : NULL;
    if (!alloc || !release)
        return 0;
    unsigned seed = (unsigned)getpid() ^ (unsigned)(uintptr_t)&seed;
    for (int attempt = 0; attempt < 3; attempt++) {
        proc_mem a[MAX_NVML_PROCS], b[MAX_NVML_PROCS], c[MAX_NVML_PROCS];
        unsigned long long size = (3 + rand_r(&seed) % 29) * PAGE;
        CUdeviceptr ptr;
        int na = list_procs(dev, a);
        if (na < 0 || alloc(&ptr, size) != CUDA_SUCCESS)
            return 0;
        int nb = list_procs(dev, b);
        release(ptr);
        int nc = list_procs(dev, c);
        int found = 0, matches = 0;
        for (int i = 0; i < nb; i++) {
            long long x = used_of(a, na, b[i].pid), z = used_of(c, nc, b[i].pid);
            if (grew_by(x < 0 ? 0 : x, (long long)b[i].used, size) && grew_by(z, (long long)b[i].used, size))
                found = (int)b[i].pid, matches++;
        }
        if (matches == 1)
            return found;
    }
    return 0;
}

/* With the primary context of CUDA device `cuda_dev` made current for the probe. */
int lim_resolve_host_pid_on(int cuda_dev, int reg_dev)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!cuda)
        return 0;
    __typeof__(&cuDevicePrimaryCtxRetain) retain = vgpu_real_dlsym_fn(cuda, "cuDevicePrimaryCtxRetain");
    __typeof__(&cuDevicePrimaryCtxRelease_v2) rel = vgpu_real_dlsym_fn(cuda, "cuDevicePrimaryCtxRelease_v2");
    __typeof__(&cuCtxPushCurrent_v2) push = vgpu_real_dlsym_fn(cuda, "cuCtxPushCurrent_v2");
    __typeof__(&cuCtxPopCurrent_v2) pop = vgpu_real_dlsym_fn(cuda, "cuCtxPopCurrent_v2");
    CUcontext ctx, old;
    if (!retain || !rel || !push || !pop || retain(&ctx, cuda_dev) != CUDA_SUCCESS)
        return 0;
    int pid = 0;
    if (push(ctx) == CUDA_SUCCESS) {
        pid = lim_resolve_host_pid(reg_dev);
        pop(&old);
    }
    rel(cuda_dev);
    return pid;
}

/* NVML's handle for region device `reg_dev` (by its UUID); 0 when there is none. */
static int device_of(int reg_dev, nvmlDevice_t *dev)
{
    __typeof__(&nvmlDeviceGetHandleByUUID) by_uuid = vgpu_nvml_sym("nvmlDeviceGetHandleByUUID");
    char uuid[VGPU_UUID_LEN + 1];
    vgpu_region_uuid(reg_dev, uuid);
    return reg_dev >= 0 && by_uuid && by_uuid(uuid, dev) == NVML_SUCCESS;
}

int lim_resolve_host_pid_unguarded(int reg_dev)
{
    int pid = lim_host_pid();
    nvmlDevice_t dev;
    if (reg_dev < 0 || !vgpu_real_nvmlInit_v2 || vgpu_real_nvmlInit_v2() != NVML_SUCCESS || !device_of(reg_dev, &dev))
        return pid;
    proc_mem now[MAX_NVML_PROCS];
    int n = list_procs(dev, now);
    if (pid && n >= 0 && used_of(now, n, (unsigned)pid) >= 0)
        return pid; /* NVML agrees */
    int found = probe(dev);
    LOG_INFO("host pid: namespace says %d, NVML does not list it; memory probe found %d", pid, found);
    return found ? found : pid;
}

/* Device memory NVML says host process `host_pid` holds on region device `reg_dev`, or -1 when
 * NVML does not list it or cannot tell (NVML_VALUE_NOT_AVAILABLE, e.g. on some MIG setups). */
long long lim_process_used(int reg_dev, int host_pid)
{
    nvmlDevice_t dev;
    if (host_pid <= 0 || !device_of(reg_dev, &dev))
        return -1;
    proc_mem now[MAX_NVML_PROCS];
    vgpu_nvml_internal++;
    int n = list_procs(dev, now);
    vgpu_nvml_internal--;
    long long used = n >= 0 ? used_of(now, n, (unsigned)host_pid) : -1;
    return used; /* NVML_VALUE_NOT_AVAILABLE (all ones) reads as -1 here too */
}

/* lim_resolve_host_pid, with libvgpu's own NVML calls marked internal (vgpu.h: vgpu_nvml_internal). */
int lim_resolve_host_pid(int reg_dev)
{
    vgpu_nvml_internal++;
    int r = lim_resolve_host_pid_unguarded(reg_dev);
    vgpu_nvml_internal--;
    return r;
}
