/* libvgpu: NVML hooks. Only initialization and the memory queries are hooked; every other
 * NVML function resolves straight to the real library. */
#include "vgpu.h"

#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <string.h>

#define NVML_REAL(name) HIDDEN extern __typeof__(&name) vgpu_real_##name;
NVML_REAL(nvmlInit)
NVML_REAL(nvmlInit_v2)
NVML_REAL(nvmlInitWithFlags)
NVML_REAL(nvmlDeviceGetMemoryInfo)
NVML_REAL(nvmlDeviceGetMemoryInfo_v2)

__thread int vgpu_nvml_internal __attribute__((tls_model("initial-exec")));

/* Register the devices NVML sees (by UUID) so NVML-only processes map onto the region; 0 when
 * one of them is not the grant's (vgpu_device_granted). */
static int register_devices(void)
{
    __typeof__(&nvmlDeviceGetCount_v2) count = vgpu_nvml_sym("nvmlDeviceGetCount_v2");
    __typeof__(&nvmlDeviceGetHandleByIndex_v2) by_index = vgpu_nvml_sym("nvmlDeviceGetHandleByIndex_v2");
    __typeof__(&nvmlDeviceGetUUID) get_uuid = vgpu_nvml_sym("nvmlDeviceGetUUID");
    unsigned n = 0;
    if (!count || !by_index || !get_uuid || count(&n) != NVML_SUCCESS)
        return 1;
    int ok = 1;
    for (unsigned i = 0; i < n && i < VGPU_MAX_DEV; i++) {
        nvmlDevice_t d;
        char uuid[VGPU_UUID_LEN];
        if (by_index(i, &d) == NVML_SUCCESS && get_uuid(d, uuid, sizeof uuid) == NVML_SUCCESS) {
            if (!vgpu_device_granted(uuid)) {
                vgpu_log(0, "no GPU: the process sees %s, which its grant does not name (NVIDIA_VISIBLE_DEVICES set "
                            "by the pod?); NVML refuses to start", uuid);
                ok = 0;
                continue;
            }
            vgpu_region_dev_for_uuid(uuid, 1);
        }
    }
    return ok;
}

/* An application's NVML init: the real one (whose own calls into its exported names pass through
 * our hooks untouched), then the registration of what it sees. */
#define APP_INIT(real_call)                                                                        \
    do {                                                                                           \
        vgpu_nvml_internal++;                                                                      \
        nvmlReturn_t r_ = (real_call);                                                             \
        if (r_ == NVML_SUCCESS && !register_devices())                                             \
            r_ = NVML_ERROR_NO_PERMISSION;                                                         \
        vgpu_nvml_internal--;                                                                      \
        return r_;                                                                                 \
    } while (0)

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    if (vgpu_nvml_internal && vgpu_real_nvmlInit_v2)
        return vgpu_real_nvmlInit_v2();
    vgpu_init();
    if (vgpu_refused)
        return NVML_ERROR_NO_PERMISSION;
    if (!vgpu_real_nvmlInit_v2)
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    APP_INIT(vgpu_real_nvmlInit_v2());
}

EXPORT nvmlReturn_t nvmlInit(void)
{
    if (vgpu_nvml_internal && vgpu_real_nvmlInit)
        return vgpu_real_nvmlInit();
    vgpu_init();
    if (vgpu_refused)
        return NVML_ERROR_NO_PERMISSION;
    if (!vgpu_real_nvmlInit)
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    APP_INIT(vgpu_real_nvmlInit());
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    if (vgpu_nvml_internal && vgpu_real_nvmlInitWithFlags)
        return vgpu_real_nvmlInitWithFlags(flags);
    vgpu_init();
    if (vgpu_refused)
        return NVML_ERROR_NO_PERMISSION;
    if (!vgpu_real_nvmlInitWithFlags)
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    APP_INIT(vgpu_real_nvmlInitWithFlags(flags));
}

int vgpu_nvml_dev(void *device)
{
    __typeof__(&nvmlDeviceGetUUID) get_uuid = vgpu_nvml_sym("nvmlDeviceGetUUID");
    char uuid[VGPU_UUID_LEN];
    if (!get_uuid || get_uuid((nvmlDevice_t)device, uuid, sizeof uuid) != NVML_SUCCESS)
        return -1;
    return vgpu_region_dev_for_uuid(uuid, 0);
}

/* total = min(limit, physical), used = the container's ledger, free = total - used (>= 0). */
static int virtualize(nvmlDevice_t device, unsigned long long *total, unsigned long long *used,
                      unsigned long long *free_b)
{
    int reg = vgpu_nvml_dev(device);
    if (reg < 0 || !vgpu_reg->limit[reg])
        return 0;
    unsigned long long lim = vgpu_reg->limit[reg], u = vgpu_region_used_reaped(reg);
    unsigned long long t = lim < *total ? lim : *total;
    *total = t;
    *used = u;
    *free_b = u < t ? t - u : 0;
    return 1;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m)
{
    vgpu_init();
    if (!vgpu_real_nvmlDeviceGetMemoryInfo)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = vgpu_real_nvmlDeviceGetMemoryInfo(device, m);
    if (r == NVML_SUCCESS && !vgpu_nvml_internal)
        virtualize(device, &m->total, &m->used, &m->free);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m)
{
    vgpu_init();
    if (!vgpu_real_nvmlDeviceGetMemoryInfo_v2)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = vgpu_real_nvmlDeviceGetMemoryInfo_v2(device, m);
    if (r == NVML_SUCCESS && !vgpu_nvml_internal && virtualize(device, &m->total, &m->used, &m->free))
        m->reserved = 0;
    return r;
}
