/* Every allocation API is counted and limited by libvgpu. Run under
 * LD_PRELOAD=libvgpu.so with CUDA_DEVICE_MEMORY_LIMIT=64m against the fake GPU.
 * For each API: 48 MiB succeeds, 32 MiB more fails with CUDA_ERROR_OUT_OF_MEMORY without
 * the driver allocating anything, the container view shows 48 MiB used, freeing returns
 * it, and 60 MiB then fits. Prints "ok <api>" or "FAIL <api>: why"; exit 1 on failure. */
#include <cuda.h>
#include <nvml.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MiB (1ULL << 20)

typedef struct {
    CUdeviceptr ptr;
    CUarray arr;
    CUmipmappedArray mip;
    CUmemGenericAllocationHandle vmm;
} handle;

static CUmemoryPool g_pool;

static CUresult a_alloc(size_t n, handle *h) { return cuMemAlloc(&h->ptr, n); }
static CUresult f_alloc(handle *h) { return cuMemFree(h->ptr); }
static CUresult a_managed(size_t n, handle *h) { return cuMemAllocManaged(&h->ptr, n, CU_MEM_ATTACH_GLOBAL); }
static CUresult a_pitch(size_t n, handle *h)
{
    size_t pitch;
    return cuMemAllocPitch(&h->ptr, &pitch, 1 << 20, n >> 20, 4);
}
static CUresult a_array(size_t n, handle *h)
{
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 1024, .Height = n / 4096, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    return cuArrayCreate(&h->arr, &d);
}
static CUresult f_array(handle *h) { return cuArrayDestroy(h->arr); }
static CUresult a_array3d(size_t n, handle *h)
{
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 1024, .Height = 1024, .Depth = n / (4 << 20),
                                 .Format = CU_AD_FORMAT_UNSIGNED_INT32, .NumChannels = 1};
    return cuArray3DCreate(&h->arr, &d);
}
static CUresult a_mipmap(size_t n, handle *h)
{
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 1024, .Height = n / 4096, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    return cuMipmappedArrayCreate(&h->mip, &d, 1);
}
static CUresult f_mipmap(handle *h) { return cuMipmappedArrayDestroy(h->mip); }
static CUresult a_vmm(size_t n, handle *h)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return cuMemCreate(&h->vmm, n, &p, 0);
}
static CUresult f_vmm(handle *h) { return cuMemRelease(h->vmm); }
static CUresult a_async(size_t n, handle *h) { return cuMemAllocAsync(&h->ptr, n, NULL); }
static CUresult f_async(handle *h) { return cuMemFreeAsync(h->ptr, NULL); }
static CUresult a_pool(size_t n, handle *h) { return cuMemAllocFromPoolAsync(&h->ptr, n, g_pool, NULL); }

static const struct {
    const char *name;
    CUresult (*alloc)(size_t, handle *);
    CUresult (*release)(handle *);
} apis[] = {
    {"cuMemAlloc_v2", a_alloc, f_alloc},       {"cuMemAllocManaged", a_managed, f_alloc},
    {"cuMemAllocPitch_v2", a_pitch, f_alloc},  {"cuArrayCreate_v2", a_array, f_array},
    {"cuArray3DCreate_v2", a_array3d, f_array}, {"cuMipmappedArrayCreate", a_mipmap, f_mipmap},
    {"cuMemCreate", a_vmm, f_vmm},             {"cuMemAllocAsync", a_async, f_async},
    {"cuMemAllocFromPoolAsync", a_pool, f_async},
};

static unsigned long long view_used(void)
{
    size_t f, t;
    cuMemGetInfo(&f, &t);
    return t - f;
}

static unsigned long long driver_used(nvmlDevice_t d)
{
    nvmlProcessInfo_t p[64];
    unsigned n = 64;
    if (nvmlDeviceGetComputeRunningProcesses(d, &n, p) != NVML_SUCCESS)
        return ~0ULL;
    for (unsigned i = 0; i < n; i++)
        if ((int)p[i].pid == getpid())
            return p[i].usedGpuMemory;
    return 0;
}

int main(void)
{
    CUcontext ctx;
    CUdevice dev;
    nvmlDevice_t nd;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
        cuDeviceGetDefaultMemPool(&g_pool, dev) || nvmlInit() || nvmlDeviceGetHandleByIndex(0, &nd)) {
        printf("FAIL setup\n");
        return 1;
    }
    int failed = 0;
    for (size_t i = 0; i < sizeof apis / sizeof apis[0]; i++) {
        handle a, b, c;
        char why[160] = "";
        unsigned long long base = view_used(), drv = driver_used(nd);
        CUresult r1 = apis[i].alloc(48 * MiB, &a);
        unsigned long long drv1 = driver_used(nd);
        CUresult r2 = apis[i].alloc(32 * MiB, &b);
        unsigned long long used = view_used() - base, drv2 = driver_used(nd);
        CUresult r3 = r1 ? r1 : apis[i].release(&a);
        unsigned long long after = view_used() - base;
        CUresult r4 = apis[i].alloc(60 * MiB, &c);
        CUresult r5 = r4 ? r4 : apis[i].release(&c);
        if (r1 != CUDA_SUCCESS)
            snprintf(why, sizeof why, "48 MiB failed with %d", r1);
        else if (r2 != CUDA_ERROR_OUT_OF_MEMORY)
            snprintf(why, sizeof why, "32 MiB more returned %d, want 2", r2);
        else if (drv2 != drv1)
            snprintf(why, sizeof why, "driver allocated on the refused call (%llu -> %llu)", drv1, drv2);
        else if (used != 48 * MiB)
            snprintf(why, sizeof why, "container view shows %llu bytes used, want %llu", used, 48 * MiB);
        else if (r3 || after != 0)
            snprintf(why, sizeof why, "release returned %d, %llu bytes still charged", r3, after);
        else if (r4 || r5)
            snprintf(why, sizeof why, "60 MiB after release: %d/%d", r4, r5);
        else if (driver_used(nd) != drv)
            snprintf(why, sizeof why, "driver usage %llu after all frees, want %llu", driver_used(nd), drv);
        if (*why) {
            printf("FAIL %s: %s\n", apis[i].name, why);
            failed = 1;
        } else {
            printf("ok %s\n", apis[i].name);
        }
    }
    /* Unknown pointers are forwarded to the driver and never touch the ledger. */
    unsigned long long before = view_used();
    CUresult r = cuMemFree((CUdeviceptr)0x1234);
    printf("%s unknown-free %d\n", r == CUDA_ERROR_INVALID_VALUE && view_used() == before ? "ok" : "FAIL", r);
    CUdeviceptr p;
    cuMemAlloc(&p, MiB);
    CUresult d1 = cuMemFree(p), d2 = cuMemFree(p);
    printf("%s double-free %d %d\n", !d1 && d2 == CUDA_ERROR_INVALID_VALUE && view_used() == before ? "ok" : "FAIL",
           d1, d2);
    return failed;
}
