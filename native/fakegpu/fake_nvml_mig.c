/* Fake NVML: Multi-Instance GPU. Each product with MIG has a fixed geometry (profiles, their
 * instance counts, SMs, memory and the memory-slice placements they may take); GPU instances
 * and their compute instances live in the shared state file, so every process of one machine
 * (the device plugin, its restarted self, a monitor) sees the same instances. A GPU instance
 * holds at most one compute instance, of the full instance size (what the device plugins
 * create). MIG devices (nvmlDeviceGetMigDeviceHandleByIndex) are the GPU instances that have
 * their compute instance; their UUIDs change with every creation. */
#include "fake_nvml.h"

#include <stdio.h>
#include <string.h>

typedef fg_mig_profile mig_profile;
#define COMPUTE_SLICES FG_MIG_COMPUTE_SLICES

struct nvmlGpuInstance_st {
    int dev, id;
};
struct nvmlComputeInstance_st {
    int dev, gi;
};
static struct nvmlGpuInstance_st g_gi[FG_MAX_DEV][FG_MAX_GI + 1];
static struct nvmlComputeInstance_st g_ci[FG_MAX_DEV][FG_MAX_GI + 1];
static struct nvmlDevice_st g_migdev[FG_MAX_DEV][FG_MAX_GI + 1];

static const mig_profile *geometry(int dev)
{
    return fg_mig_geometry(fg_cfg()->dev[dev].mig_geometry);
}

/* The profile index with NVML profile id `id`, -1 if none. */
static int profile_by_id(const mig_profile *g, unsigned id)
{
    for (int i = 0; i < FG_MIG_PROFILES; i++)
        if (g[i].valid && g[i].id == id)
            return i;
    return -1;
}

static nvmlGpuInstance_t gi_handle(int dev, int id)
{
    g_gi[dev][id].dev = dev;
    g_gi[dev][id].id = id;
    return &g_gi[dev][id];
}

static nvmlComputeInstance_t ci_handle(int dev, int id)
{
    g_ci[dev][id].dev = dev;
    g_ci[dev][id].gi = id;
    return &g_ci[dev][id];
}

static nvmlDevice_t mig_handle(int dev, int id)
{
    g_migdev[dev][id].index = dev;
    g_migdev[dev][id].mig_gi = id;
    return &g_migdev[dev][id];
}

/* Common entry: a GPU handle with MIG geometry; its index in *dev. */
static nvmlReturn_t mig_gpu(nvmlDevice_t device, int *dev, const mig_profile **g)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    *dev = fgn_physical(device);
    if (*dev < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *g = geometry(*dev);
    return *g ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* Same, and MIG mode must be on (under no lock: the mode is one int). */
static nvmlReturn_t mig_enabled(nvmlDevice_t device, int *dev, const mig_profile **g)
{
    nvmlReturn_t r = mig_gpu(device, dev, g);
    if (r == NVML_SUCCESS && fg_st()->mig[*dev].mode != NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_NOT_SUPPORTED;
    return r;
}

/* A live GPU instance behind a handle (under fg_lock). */
static fg_gi *gi_of(nvmlGpuInstance_t gi)
{
    if (!gi || gi < &g_gi[0][0] || gi > &g_gi[FG_MAX_DEV - 1][FG_MAX_GI] || gi->id < 1 || gi->id > FG_MAX_GI)
        return NULL;
    fg_gi *s = &fg_st()->mig[gi->dev].gi[gi->id];
    return s->used ? s : NULL;
}

int fgn_is_mig(nvmlDevice_t d)
{
    return d && d >= &g_migdev[0][0] && d <= &g_migdev[FG_MAX_DEV - 1][FG_MAX_GI] && d->mig_gi > 0;
}

/* The live GPU instance of a MIG device handle (under fg_lock), NULL if gone. */
static fg_gi *mig_of(nvmlDevice_t d)
{
    if (!fgn_is_mig(d))
        return NULL;
    fg_gi *s = &fg_st()->mig[d->index].gi[d->mig_gi];
    return s->used && s->ci_used ? s : NULL;
}

static void format_mig_uuid(int dev, int id, unsigned long long gen, char *out, size_t len)
{
    fg_mig_uuid(fg_cfg()->dev[dev].uuid_bytes, id, gen, out, len);
}

nvmlReturn_t fgn_mig_uuid(nvmlDevice_t d, char *out, unsigned len)
{
    char buf[96];
    fg_lock();
    fg_gi *s = mig_of(d);
    if (s)
        format_mig_uuid(d->index, d->mig_gi, s->gen, buf, sizeof buf);
    fg_unlock();
    if (!s)
        return NVML_ERROR_NOT_FOUND;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(buf) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, buf, strlen(buf) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t fgn_mig_name(nvmlDevice_t d, char *out, unsigned len)
{
    char buf[160];
    fg_lock();
    fg_gi *s = mig_of(d);
    if (s)
        snprintf(buf, sizeof buf, "%s MIG %s", fg_cfg()->dev[d->index].name, geometry(d->index)[s->profile].name);
    fg_unlock();
    if (!s)
        return NVML_ERROR_NOT_FOUND;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(buf) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, buf, strlen(buf) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t fgn_mig_memory(nvmlDevice_t d, unsigned long long *total)
{
    fg_lock();
    fg_gi *s = mig_of(d);
    if (s)
        *total = geometry(d->index)[s->profile].mem_mib << 20;
    fg_unlock();
    return s ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

/* ---- mode ---- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *cur, unsigned int *pending)
{
    int dev;
    const mig_profile *g;
    nvmlReturn_t r = mig_gpu(device, &dev, &g);
    if (r != NVML_SUCCESS)
        return r;
    if (!cur || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cur = *pending = (unsigned)fg_st()->mig[dev].mode;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode, nvmlReturn_t *activation)
{
    int dev;
    const mig_profile *g;
    nvmlReturn_t r = mig_gpu(device, &dev, &g);
    if (r != NVML_SUCCESS)
        return r;
    if (!activation || (mode != NVML_DEVICE_MIG_ENABLE && mode != NVML_DEVICE_MIG_DISABLE))
        return NVML_ERROR_INVALID_ARGUMENT;
    fg_lock();
    fg_reap();
    fg_mig *m = &fg_st()->mig[dev];
    int busy = fg_dev_used(dev) > 0;
    for (int i = 1; i <= FG_MAX_GI; i++)
        busy |= m->gi[i].used;
    if ((unsigned)m->mode != mode && busy) {
        r = NVML_ERROR_IN_USE; /* GPU instances or processes on the GPU */
    } else {
        m->mode = (int32_t)mode;
        r = NVML_SUCCESS;
    }
    fg_unlock();
    *activation = r;
    return r;
}

/* ---- GPU instance profiles ---- */

static nvmlReturn_t profile_info(nvmlDevice_t device, unsigned profile, const mig_profile **out)
{
    int dev;
    const mig_profile *g;
    nvmlReturn_t r = mig_enabled(device, &dev, &g);
    if (r != NVML_SUCCESS)
        return r;
    if (profile >= FG_MIG_PROFILES)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g[profile].valid)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = &g[profile];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info)
{
    const mig_profile *p;
    nvmlReturn_t r = profile_info(device, profile, &p);
    if (r != NVML_SUCCESS)
        return r;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->id = p->id;
    info->isP2pSupported = 0;
    info->sliceCount = p->slices;
    info->instanceCount = p->instances;
    info->multiprocessorCount = p->sms;
    info->copyEngineCount = p->slices;
    info->memorySizeMB = p->mem_mib;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_v2_t *info)
{
    const mig_profile *p;
    nvmlReturn_t r = profile_info(device, profile, &p);
    if (r != NVML_SUCCESS)
        return r;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    snprintf(name, sizeof name, "MIG %s", p->name);
    if (info->version == nvmlGpuInstanceProfileInfo_v3) {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
        memset(v3, 0, sizeof *v3);
        v3->version = nvmlGpuInstanceProfileInfo_v3;
        v3->id = p->id;
        v3->sliceCount = p->slices;
        v3->instanceCount = p->instances;
        v3->multiprocessorCount = p->sms;
        v3->copyEngineCount = p->slices;
        v3->memorySizeMB = p->mem_mib;
        memcpy(v3->name, name, sizeof name);
        return NVML_SUCCESS;
    }
    if (info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memset(info, 0, sizeof *info);
    info->version = nvmlGpuInstanceProfileInfo_v2;
    info->id = p->id;
    info->sliceCount = p->slices;
    info->instanceCount = p->instances;
    info->multiprocessorCount = p->sms;
    info->copyEngineCount = p->slices;
    info->memorySizeMB = p->mem_mib;
    memcpy(info->name, name, sizeof name);
    return NVML_SUCCESS;
}

/* profile id -> (device, geometry, profile index), MIG enabled. */
static nvmlReturn_t by_profile_id(nvmlDevice_t device, unsigned id, int *dev, const mig_profile **g, int *idx)
{
    nvmlReturn_t r = mig_enabled(device, dev, g);
    if (r != NVML_SUCCESS)
        return r;
    *idx = profile_by_id(*g, id);
    return *idx < 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                                  nvmlGpuInstancePlacement_t *placements,
                                                                  unsigned int *count)
{
    int dev, idx;
    const mig_profile *g;
    nvmlReturn_t r = by_profile_id(device, profileId, &dev, &g, &idx);
    if (r != NVML_SUCCESS)
        return r;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    const mig_profile *p = &g[idx];
    if (!placements) {
        *count = p->nstarts;
        return NVML_SUCCESS;
    }
    if (*count < p->nstarts) {
        *count = p->nstarts;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < p->nstarts; i++) {
        placements[i].start = p->starts[i];
        placements[i].size = p->size;
    }
    *count = p->nstarts;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profileId,
                                                               nvmlGpuInstancePlacement_t *placements,
                                                               unsigned int *count)
{
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profileId, placements, count);
}

/* Under fg_lock: why an instance of profile `idx` cannot go at `start` now (SUCCESS: it can). */
static nvmlReturn_t check_room(int dev, const mig_profile *g, int idx, unsigned start)
{
    const mig_profile *p = &g[idx];
    fg_mig *m = &fg_st()->mig[dev];
    unsigned slices = p->slices, same = 0;
    for (int i = 1; i <= FG_MAX_GI; i++) {
        fg_gi *x = &m->gi[i];
        if (!x->used)
            continue;
        slices += g[x->profile].slices;
        same += g[x->profile].id == p->id;
        if (start < (unsigned)(x->start + x->size) && (unsigned)x->start < start + p->size)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    if (slices > COMPUTE_SLICES || same >= p->instances)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    return NVML_SUCCESS;
}

static int free_id(int dev)
{
    for (int i = 1; i <= FG_MAX_GI; i++)
        if (!fg_st()->mig[dev].gi[i].used)
            return i;
    return -1;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                              unsigned int *count)
{
    int dev, idx;
    const mig_profile *g;
    nvmlReturn_t r = by_profile_id(device, profileId, &dev, &g, &idx);
    if (r != NVML_SUCCESS)
        return r;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* greedy: how many more fit, placed lowest first */
    fg_lock();
    fg_mig saved = fg_st()->mig[dev];
    unsigned n = 0;
    for (unsigned i = 0; i < g[idx].nstarts; i++) {
        int id = free_id(dev);
        if (id < 0 || check_room(dev, g, idx, g[idx].starts[i]) != NVML_SUCCESS)
            continue;
        fg_gi *x = &fg_st()->mig[dev].gi[id];
        x->used = 1;
        x->profile = idx;
        x->start = (int32_t)g[idx].starts[i];
        x->size = (int32_t)g[idx].size;
        n++;
    }
    fg_st()->mig[dev] = saved;
    fg_unlock();
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_gi(int dev, const mig_profile *g, int idx, unsigned start, nvmlGpuInstance_t *out)
{
    fg_lock();
    nvmlReturn_t r = check_room(dev, g, idx, start);
    int id = free_id(dev);
    if (r == NVML_SUCCESS && id < 0)
        r = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (r == NVML_SUCCESS) {
        fg_gi *x = &fg_st()->mig[dev].gi[id];
        memset(x, 0, sizeof *x);
        x->used = 1;
        x->profile = idx;
        x->start = (int32_t)start;
        x->size = (int32_t)g[idx].size;
        x->gen = ++fg_st()->mig_gen;
        *out = gi_handle(dev, id);
    }
    fg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                             const nvmlGpuInstancePlacement_t *placement,
                                                             nvmlGpuInstance_t *gpuInstance)
{
    int dev, idx;
    const mig_profile *g;
    nvmlReturn_t r = by_profile_id(device, profileId, &dev, &g, &idx);
    if (r != NVML_SUCCESS)
        return r;
    if (!placement || !gpuInstance || placement->size != g[idx].size)
        return NVML_ERROR_INVALID_ARGUMENT;
    int ok = 0;
    for (unsigned i = 0; i < g[idx].nstarts; i++)
        ok |= g[idx].starts[i] == placement->start;
    if (!ok)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(dev, g, idx, placement->start, gpuInstance);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                                nvmlGpuInstance_t *gpuInstance)
{
    int dev, idx;
    const mig_profile *g;
    nvmlReturn_t r = by_profile_id(device, profileId, &dev, &g, &idx);
    if (r != NVML_SUCCESS)
        return r;
    if (!gpuInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g[idx].nstarts; i++)
        if (create_gi(dev, g, idx, g[idx].starts[i], gpuInstance) == NVML_SUCCESS)
            return NVML_SUCCESS;
    return NVML_ERROR_INSUFFICIENT_RESOURCES;
}

EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    fg_lock();
    fg_gi *x = gi_of(gpuInstance);
    nvmlReturn_t r = !x ? NVML_ERROR_INVALID_ARGUMENT : x->ci_used ? NVML_ERROR_IN_USE : NVML_SUCCESS;
    if (r == NVML_SUCCESS)
        memset(x, 0, sizeof *x);
    fg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                              nvmlGpuInstance_t *gpuInstances, unsigned int *count)
{
    int dev, idx;
    const mig_profile *g;
    nvmlReturn_t r = by_profile_id(device, profileId, &dev, &g, &idx);
    if (r != NVML_SUCCESS)
        return r;
    if (!count || !gpuInstances)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    fg_lock();
    for (int i = 1; i <= FG_MAX_GI; i++) {
        fg_gi *x = &fg_st()->mig[dev].gi[i];
        if (x->used && x->profile == idx)
            gpuInstances[n++] = gi_handle(dev, i);
    }
    fg_unlock();
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance)
{
    int dev;
    const mig_profile *g;
    nvmlReturn_t r = mig_enabled(device, &dev, &g);
    if (r != NVML_SUCCESS)
        return r;
    if (!gpuInstance || id < 1 || id > FG_MAX_GI)
        return NVML_ERROR_INVALID_ARGUMENT;
    fg_lock();
    int used = fg_st()->mig[dev].gi[id].used;
    fg_unlock();
    if (!used)
        return NVML_ERROR_NOT_FOUND;
    *gpuInstance = gi_handle(dev, (int)id);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    fg_lock();
    fg_gi *x = gi_of(gpuInstance);
    if (x) {
        info->device = fgn_handle(gpuInstance->dev);
        info->id = (unsigned)gpuInstance->id;
        info->profileId = geometry(gpuInstance->dev)[x->profile].id;
        info->placement.start = (unsigned)x->start;
        info->placement.size = (unsigned)x->size;
    }
    fg_unlock();
    return x ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

/* ---- compute instances: one per GPU instance, of the instance's full size ---- */

static const unsigned CI_PROFILE_OF_SLICES[8] = {
    [1] = NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, [2] = NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    [3] = NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, [4] = NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    [7] = NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
};

/* Under fg_lock: the GI behind the handle and its (only) CI profile; SUCCESS if `profile` is it. */
static nvmlReturn_t ci_profile(nvmlGpuInstance_t gpuInstance, unsigned profile, fg_gi **x, const mig_profile **p)
{
    *x = gi_of(gpuInstance);
    if (!*x)
        return NVML_ERROR_INVALID_ARGUMENT;
    *p = &geometry(gpuInstance->dev)[(*x)->profile];
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    return CI_PROFILE_OF_SLICES[(*p)->slices] == profile ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

static nvmlReturn_t ci_profile_info(nvmlGpuInstance_t gpuInstance, unsigned profile, unsigned eng,
                                    nvmlComputeInstanceProfileInfo_v2_t *info, int v2)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!info || eng != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (v2 && info->version != nvmlComputeInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    fg_gi *x;
    const mig_profile *p;
    fg_lock();
    nvmlReturn_t r = ci_profile(gpuInstance, profile, &x, &p);
    fg_unlock();
    if (r != NVML_SUCCESS)
        return r;
    nvmlComputeInstanceProfileInfo_t v1 = {0};
    v1.id = profile;
    v1.sliceCount = p->slices;
    v1.instanceCount = 1;
    v1.multiprocessorCount = p->sms;
    v1.sharedCopyEngineCount = p->slices;
    if (!v2) {
        memcpy(info, &v1, sizeof v1);
        return NVML_SUCCESS;
    }
    memset(info, 0, sizeof *info);
    info->version = nvmlComputeInstanceProfileInfo_v2;
    memcpy(&info->id, &v1, sizeof v1);
    snprintf(info->name, sizeof info->name, "MIG %uc.%s", p->slices, p->name);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                 unsigned int engProfile,
                                                                 nvmlComputeInstanceProfileInfo_t *info)
{
    return ci_profile_info(gpuInstance, profile, engProfile, (nvmlComputeInstanceProfileInfo_v2_t *)info, 0);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                  unsigned int engProfile,
                                                                  nvmlComputeInstanceProfileInfo_v2_t *info)
{
    return ci_profile_info(gpuInstance, profile, engProfile, info, 1);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance,
                                                                       unsigned int profileId, unsigned int *count)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    fg_gi *x;
    const mig_profile *p;
    fg_lock();
    nvmlReturn_t r = ci_profile(gpuInstance, profileId, &x, &p);
    if (r == NVML_SUCCESS)
        *count = x->ci_used ? 0 : 1;
    fg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                         nvmlComputeInstance_t *computeInstance)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!computeInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    fg_gi *x;
    const mig_profile *p;
    fg_lock();
    nvmlReturn_t r = ci_profile(gpuInstance, profileId, &x, &p);
    if (r == NVML_SUCCESS && x->ci_used)
        r = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (r == NVML_SUCCESS) {
        x->ci_used = 1;
        *computeInstance = ci_handle(gpuInstance->dev, gpuInstance->id);
    }
    fg_unlock();
    return r;
}

/* Under fg_lock: the GI of a live CI handle. */
static fg_gi *ci_of(nvmlComputeInstance_t ci)
{
    if (!ci || ci < &g_ci[0][0] || ci > &g_ci[FG_MAX_DEV - 1][FG_MAX_GI] || ci->gi < 1 || ci->gi > FG_MAX_GI)
        return NULL;
    fg_gi *x = &fg_st()->mig[ci->dev].gi[ci->gi];
    return x->used && x->ci_used ? x : NULL;
}

EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    fg_lock();
    fg_gi *x = ci_of(computeInstance);
    if (x)
        x->ci_used = 0;
    fg_unlock();
    return x ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                       nvmlComputeInstance_t *computeInstances, unsigned int *count)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!count || !computeInstances)
        return NVML_ERROR_INVALID_ARGUMENT;
    fg_gi *x;
    const mig_profile *p;
    fg_lock();
    nvmlReturn_t r = ci_profile(gpuInstance, profileId, &x, &p);
    if (r == NVML_SUCCESS) {
        *count = 0;
        if (x->ci_used)
            computeInstances[(*count)++] = ci_handle(gpuInstance->dev, gpuInstance->id);
    }
    fg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                          nvmlComputeInstance_t *computeInstance)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!computeInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    fg_lock();
    fg_gi *x = gi_of(gpuInstance);
    nvmlReturn_t r = !x ? NVML_ERROR_INVALID_ARGUMENT : (id != 0 || !x->ci_used) ? NVML_ERROR_NOT_FOUND : NVML_SUCCESS;
    if (r == NVML_SUCCESS)
        *computeInstance = ci_handle(gpuInstance->dev, gpuInstance->id);
    fg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    fg_lock();
    fg_gi *x = ci_of(computeInstance);
    if (x) {
        const mig_profile *p = &geometry(computeInstance->dev)[x->profile];
        info->device = fgn_handle(computeInstance->dev);
        info->gpuInstance = gi_handle(computeInstance->dev, computeInstance->gi);
        info->id = 0;
        info->profileId = CI_PROFILE_OF_SLICES[p->slices];
        info->placement.start = 0;
        info->placement.size = p->slices;
    }
    fg_unlock();
    return x ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}

/* ---- MIG device handles ---- */

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMig)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!isMig || (!fgn_is_mig(device) && fgn_physical(device) < 0))
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMig = (unsigned)fgn_is_mig(device);
    return NVML_SUCCESS;
}

static nvmlReturn_t mig_ids(nvmlDevice_t device, unsigned *gi)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!fgn_is_mig(device))
        return fgn_physical(device) < 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    fg_lock();
    fg_gi *x = mig_of(device);
    fg_unlock();
    if (!x)
        return NVML_ERROR_NOT_FOUND;
    *gi = (unsigned)device->mig_gi;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    unsigned gi;
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = mig_ids(device, &gi);
    if (r == NVML_SUCCESS)
        *id = gi;
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    unsigned gi;
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = mig_ids(device, &gi);
    if (r == NVML_SUCCESS)
        *id = 0;
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    int dev;
    const mig_profile *g;
    nvmlReturn_t r = mig_gpu(device, &dev, &g);
    if (r == NVML_ERROR_NOT_SUPPORTED && count) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (r != NVML_SUCCESS)
        return r;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = COMPUTE_SLICES;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig)
{
    int dev;
    const mig_profile *g;
    nvmlReturn_t r = mig_enabled(device, &dev, &g);
    if (r != NVML_SUCCESS)
        return r;
    if (!mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    int found = -1;
    unsigned n = 0;
    fg_lock();
    for (int i = 1; i <= FG_MAX_GI && found < 0; i++) {
        fg_gi *x = &fg_st()->mig[dev].gi[i];
        if (x->used && x->ci_used && n++ == index)
            found = i;
    }
    fg_unlock();
    if (found < 0)
        return index < COMPUTE_SLICES ? NVML_ERROR_NOT_FOUND : NVML_ERROR_INVALID_ARGUMENT;
    *mig = mig_handle(dev, found);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    if (!fgn_inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || !fgn_is_mig(migDevice))
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = fgn_handle(migDevice->index);
    return NVML_SUCCESS;
}
