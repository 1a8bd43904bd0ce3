/* Fake libnvidia-ml.so.1: answers NVML queries from the fake GPU configuration and the
 * shared state written by the fake libcuda.so.1 (memory per process, kernel busy time,
 * injected XID events). Declarations come from NVIDIA's nvml.h. */
#include "fake_nvml.h" /* nvml.h, fg.h */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct nvmlEventSet_st {
    unsigned long long mask[FG_MAX_DEV];
    unsigned long long last_seq;
};

static struct nvmlDevice_st g_dev[FG_MAX_DEV];
static int g_init_count;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static int inited(void)
{
    return __atomic_load_n(&g_init_count, __ATOMIC_ACQUIRE) > 0;
}

int fgn_inited(void) { return inited(); }

int fgn_physical(nvmlDevice_t d)
{
    if (!d || d < g_dev || d >= g_dev + fg_cfg()->count)
        return -1;
    return d->index;
}

nvmlDevice_t fgn_handle(int physical) { return &g_dev[physical]; }

/* The device's index among those this process sees (-1: not visible). */
static int visible_slot(int physical)
{
    const fg_config *c = fg_cfg();
    for (int i = 0; i < c->nvis; i++)
        if (c->vis[i] == physical)
            return i;
    return -1;
}

static const fg_dev_cfg *dev_of(nvmlDevice_t d)
{
    if (!d || d < g_dev || d >= g_dev + fg_cfg()->count)
        return NULL;
    return &fg_cfg()->dev[d->index];
}

#define CHECK_DEV(d, cfgvar)                                                                       \
    if (!inited())                                                                                 \
        return NVML_ERROR_UNINITIALIZED;                                                           \
    const fg_dev_cfg *cfgvar = dev_of(d);                                                          \
    if (!cfgvar)                                                                                   \
        return NVML_ERROR_INVALID_ARGUMENT;

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    const fg_config *c = fg_cfg();
    fg_st();
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < c->count; i++)
        g_dev[i].index = i;
    g_init_count++;
    pthread_mutex_unlock(&g_mu);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t r = NVML_SUCCESS;
    if (g_init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else
        g_init_count--;
    pthread_mutex_unlock(&g_mu);
    return r;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return copy_str(version, length, "550.54.15");
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return copy_str(version, length, "12.550.54.15");
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = 12040;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)fg_cfg()->nvis;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)fg_cfg()->nvis)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_dev[fg_cfg()->vis[index]];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < fg_cfg()->count; i++) {
        if (!strcmp(fg_cfg()->dev[i].uuid, uuid) && visible_slot(i) >= 0) {
            *device = &g_dev[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device)
{
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned dom = 0, bus, dev, fn;
    if (sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4 &&
        (dom = 0, sscanf(bus_id, "%x:%x.%x", &bus, &dev, &fn) != 3))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < fg_cfg()->count; i++) {
        const fg_dev_cfg *d = &fg_cfg()->dev[i];
        if (d->domain == dom && d->bus == bus && d->device == dev && visible_slot(i) >= 0) {
            *device = &g_dev[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    CHECK_DEV(device, d);
    (void)d;
    if (!index || visible_slot(device->index) < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)visible_slot(device->index);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    CHECK_DEV(device, d);
    (void)d;
    if (!minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minor = (unsigned)device->index; /* /dev/nvidia<minor>: the physical device */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    if (inited() && fgn_is_mig(device))
        return fgn_mig_uuid(device, uuid, length);
    CHECK_DEV(device, d);
    return copy_str(uuid, length, d->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    if (inited() && fgn_is_mig(device))
        return fgn_mig_name(device, name, length);
    CHECK_DEV(device, d);
    return copy_str(name, length, d->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    CHECK_DEV(device, d);
    char buf[32];
    snprintf(buf, sizeof buf, "FAKE%010d", device->index);
    return copy_str(serial, length, buf);
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    CHECK_DEV(device, d);
    if (!arch)
        return NVML_ERROR_INVALID_ARGUMENT;
    *arch = d->cc_major >= 9 ? NVML_DEVICE_ARCH_HOPPER : NVML_DEVICE_ARCH_AMPERE;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    CHECK_DEV(device, d);
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = d->cc_major;
    *minor = d->cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    CHECK_DEV(device, d);
    if (!node)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->numa < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned)d->numa;
    return NVML_SUCCESS;
}

void fgn_fill_pci(const fg_dev_cfg *d, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof *pci);
    pci->domain = d->domain;
    pci->bus = d->bus;
    pci->device = d->device;
    pci->pciDeviceId = d->pci_device_id;
    pci->pciSubSystemId = 0x16c110de;
    snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, d->domain, d->bus, d->device);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, d->domain,
             d->bus, d->device);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    CHECK_DEV(device, d);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    fgn_fill_pci(d, pci);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *a)
{
    CHECK_DEV(device, d);
    if (!a)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(a, 0, sizeof *a);
    a->multiprocessorCount = (unsigned)d->sms;
    a->memorySizeMB = d->memory >> 20;
    return NVML_SUCCESS;
}


EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t s,
                                             unsigned int *temp)
{
    CHECK_DEV(device, d);
    (void)d;
    if (!temp || s != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 40;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *mw)
{
    CHECK_DEV(device, d);
    (void)d;
    if (!mw)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mw = 100000;
    return NVML_SUCCESS;
}

/* ECC: the aggregate counters of an ECC-capable board, per device (index + 1 corrected errors,
 * none uncorrected), so that a reader can tell devices apart; volatile counters read 0. */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                                nvmlEccCounterType_t counter, unsigned long long *count)
{
    CHECK_DEV(device, cfg);
    (void)cfg;
    if (!count || (type != NVML_MEMORY_ERROR_TYPE_CORRECTED && type != NVML_MEMORY_ERROR_TYPE_UNCORRECTED) ||
        (counter != NVML_VOLATILE_ECC && counter != NVML_AGGREGATE_ECC))
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = counter == NVML_AGGREGATE_ECC && type == NVML_MEMORY_ERROR_TYPE_CORRECTED ? (unsigned long long)device->index + 1 : 0;
    return NVML_SUCCESS;
}

static void mem_used(int dev, unsigned long long *used)
{
    fg_lock();
    fg_reap();
    *used = fg_dev_used(dev);
    fg_unlock();
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m)
{
    if (inited() && fgn_is_mig(device) && m) {
        unsigned long long total;
        nvmlReturn_t r = fgn_mig_memory(device, &total);
        if (r == NVML_SUCCESS) {
            m->total = total;
            m->used = 0;
            m->free = total;
        }
        return r;
    }
    CHECK_DEV(device, d);
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long used;
    mem_used(device->index, &used);
    m->total = d->memory;
    m->used = used;
    m->free = used > d->memory ? 0 : d->memory - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m)
{
    CHECK_DEV(device, d);
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long used;
    mem_used(device->index, &used);
    m->total = d->memory;
    m->reserved = 0;
    m->used = used;
    m->free = used > d->memory ? 0 : d->memory - used;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned pid;
    unsigned long long used;
} proc_row;

/* Live processes holding memory or a context on `dev`, reported with host PIDs. */
static unsigned list_procs(int dev, proc_row *rows, unsigned cap)
{
    fg_state *s = fg_st();
    unsigned n = 0;
    fg_lock();
    fg_reap();
    for (int i = 0; i < FG_MAX_PROC && n < cap; i++) {
        fg_proc *p = &s->procs[i];
        if (p->pid && (p->used[dev] || p->contexts[dev])) {
            rows[n].pid = (unsigned)(p->pid + fg_cfg()->hostpid_offset);
            rows[n].used = p->used[dev];
            n++;
        }
    }
    fg_unlock();
    return n;
}

#define RUNNING_PROCS(fn, type, extra)                                                             \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *count, type *infos)                  \
    {                                                                                              \
        CHECK_DEV(device, d);                                                                      \
        (void)d;                                                                                   \
        if (!count)                                                                                \
            return NVML_ERROR_INVALID_ARGUMENT;                                                    \
        proc_row rows[FG_MAX_PROC];                                                                \
        unsigned n = list_procs(device->index, rows, FG_MAX_PROC);                                 \
        if (*count < n || (!infos && n)) {                                                         \
            *count = n;                                                                            \
            return NVML_ERROR_INSUFFICIENT_SIZE;                                                   \
        }                                                                                          \
        for (unsigned i = 0; i < n; i++) {                                                         \
            memset(&infos[i], 0, sizeof infos[i]);                                                 \
            infos[i].pid = rows[i].pid;                                                            \
            infos[i].usedGpuMemory = rows[i].used;                                                 \
            extra;                                                                                 \
        }                                                                                          \
        *count = n;                                                                                \
        return NVML_SUCCESS;                                                                       \
    }

RUNNING_PROCS(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, (void)0)
RUNNING_PROCS(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t,
              infos[i].gpuInstanceId = 0xFFFFFFFFu; infos[i].computeInstanceId = 0xFFFFFFFFu)
RUNNING_PROCS(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t,
              infos[i].gpuInstanceId = 0xFFFFFFFFu; infos[i].computeInstanceId = 0xFFFFFFFFu)

#define NO_PROCS(fn, type)                                                                         \
    EXPORT nvmlReturn_t fn(nvmlDevice_t device, unsigned int *count, type *infos)                  \
    {                                                                                              \
        CHECK_DEV(device, d);                                                                      \
        (void)d;                                                                                   \
        (void)infos;                                                                               \
        if (!count)                                                                                \
            return NVML_ERROR_INVALID_ARGUMENT;                                                    \
        *count = 0;                                                                                \
        return NVML_SUCCESS;                                                                       \
    }

NO_PROCS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
NO_PROCS(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t)

typedef struct {
    int pid;
    unsigned long long busy;
} busy_row;

/* Busy ns per PID on `dev` within [t0, t1); returns number of rows. */
static unsigned busy_in(int dev, unsigned long long t0, unsigned long long t1, busy_row *rows,
                        unsigned cap, unsigned long long *union_busy)
{
    fg_state *s = fg_st();
    unsigned n = 0;
    unsigned long long total = 0;
    fg_lock();
    unsigned long long cnt = s->busy_count[dev];
    unsigned long long lo = cnt > FG_RING ? cnt - FG_RING : 0;
    for (unsigned long long k = cnt; k > lo; k--) {
        fg_busy *b = &s->busy[dev][(k - 1) % FG_RING];
        if (b->end_ns <= t0 && b->start_ns <= t0)
            continue;
        unsigned long long a = b->start_ns > t0 ? b->start_ns : t0;
        unsigned long long z = b->end_ns < t1 ? b->end_ns : t1;
        if (z <= a)
            continue;
        total += z - a;
        unsigned j = 0;
        while (j < n && rows[j].pid != b->pid)
            j++;
        if (j == n) {
            if (n == cap)
                continue;
            rows[n].pid = b->pid;
            rows[n].busy = 0;
            n++;
        }
        rows[j].busy += z - a;
    }
    fg_unlock();
    if (union_busy)
        *union_busy = total;
    return n;
}

static unsigned pct(unsigned long long busy, unsigned long long period)
{
    unsigned long long p = period ? busy * 100 / period : 0;
    return p > 100 ? 100 : (unsigned)p;
}

/* The PID whose kernel ran at instant t on dev, else the one whose kernel ended last before
 * it within [t0, t); 0 if none. */
static int resident_at(int dev, unsigned long long t0, unsigned long long t)
{
    fg_state *s = fg_st();
    int pid = 0;
    unsigned long long last_end = 0;
    fg_lock();
    unsigned long long cnt = s->busy_count[dev];
    unsigned long long lo = cnt > FG_RING ? cnt - FG_RING : 0;
    for (unsigned long long k = cnt; k > lo; k--) {
        fg_busy *b = &s->busy[dev][(k - 1) % FG_RING];
        if (b->start_ns <= t && b->end_ns > t) {
            pid = b->pid;
            break;
        }
        if (b->end_ns <= t && b->end_ns > t0 && b->end_ns > last_end)
            last_end = b->end_ns, pid = b->pid;
    }
    fg_unlock();
    return pid;
}

/* The samples of the last complete sample period (if newer than last_seen): one per process
 * with its own busy time (util_attribution split, the default), or, as a real driver does
 * (util_attribution resident), one row naming the process resident on the device at the end
 * of the period with the device's utilization over the whole period. */
static nvmlReturn_t util_samples(int dev, unsigned long long last_seen_us, busy_row *rows,
                                 unsigned *n, unsigned long long *stamp_us, unsigned long long *period)
{
    unsigned long long p = (unsigned long long)fg_cfg()->sample_period_us * 1000ULL;
    unsigned long long now = fg_now_ns();
    unsigned long long end = now / p * p, total;
    *period = p;
    *stamp_us = end / 1000ULL;
    *n = 0;
    if (*stamp_us <= last_seen_us)
        return NVML_ERROR_NOT_FOUND;
    *n = busy_in(dev, end - p, end, rows, FG_MAX_PROC, &total);
    if (*n && fg_cfg()->util_resident) {
        int pid = resident_at(dev, end - p, end - 1);
        if (!pid)
            pid = rows[0].pid;
        rows[0].pid = pid;
        rows[0].busy = total;
        *n = 1;
    }
    return *n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                    nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count,
                                                    unsigned long long last_seen)
{
    CHECK_DEV(device, d);
    (void)d;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    busy_row rows[FG_MAX_PROC];
    unsigned n;
    unsigned long long stamp, period;
    nvmlReturn_t r = util_samples(device->index, last_seen, rows, &n, &stamp, &period);
    if (r != NVML_SUCCESS)
        return r;
    if (!samples || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        memset(&samples[i], 0, sizeof samples[i]);
        samples[i].pid = (unsigned)(rows[i].pid + fg_cfg()->hostpid_offset);
        samples[i].timeStamp = stamp;
        samples[i].smUtil = pct(rows[i].busy, period);
        samples[i].memUtil = samples[i].smUtil / 2;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
                                                          nvmlProcessesUtilizationInfo_t *info)
{
    CHECK_DEV(device, d);
    (void)d;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlProcessesUtilizationInfo_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    busy_row rows[FG_MAX_PROC];
    unsigned n;
    unsigned long long stamp, period;
    nvmlReturn_t r = util_samples(device->index, info->lastSeenTimeStamp, rows, &n, &stamp, &period);
    if (r != NVML_SUCCESS)
        return r;
    if (!info->procUtilArray || info->processSamplesCount < n) {
        info->processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        nvmlProcessUtilizationInfo_v1_t *u = &info->procUtilArray[i];
        memset(u, 0, sizeof *u);
        u->pid = (unsigned)(rows[i].pid + fg_cfg()->hostpid_offset);
        u->timeStamp = stamp;
        u->smUtil = pct(rows[i].busy, period);
        u->memUtil = u->smUtil / 2;
    }
    info->processSamplesCount = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u)
{
    CHECK_DEV(device, d);
    (void)d;
    if (!u)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long p = (unsigned long long)fg_cfg()->sample_period_us * 1000ULL;
    unsigned long long end = fg_now_ns() / p * p, total;
    busy_row rows[FG_MAX_PROC];
    busy_in(device->index, end - p, end, rows, FG_MAX_PROC, &total);
    u->gpu = pct(total, p);
    u->memory = u->gpu / 2;
    return NVML_SUCCESS;
}

/* ---- events ---- */

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (!s)
        return NVML_ERROR_MEMORY;
    /* A pending xid file is not consumed here: its events go to this set too. */
    fg_lock();
    s->last_seq = fg_st()->xid_seq;
    fg_unlock();
    *set = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types)
{
    CHECK_DEV(device, d);
    (void)d;
    if (!types)
        return NVML_ERROR_INVALID_ARGUMENT;
    *types = nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError |
             nvmlEventTypeDoubleBitEccError;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                             nvmlEventSet_t set)
{
    CHECK_DEV(device, d);
    (void)d;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long supported = nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError |
                                   nvmlEventTypeDoubleBitEccError;
    if (types & ~supported)
        return NVML_ERROR_NOT_SUPPORTED;
    set->mask[device->index] |= types;
    return NVML_SUCCESS;
}

static int next_event(nvmlEventSet_t set, nvmlEventData_t *data)
{
    fg_state *s = fg_st();
    int found = 0;
    fg_lock();
    unsigned long long top = s->xid_seq;
    if (top - set->last_seq > FG_MAX_XID)
        set->last_seq = top - FG_MAX_XID;
    while (!found && set->last_seq < top) {
        fg_xid *x = &s->xids[(set->last_seq + 1) % FG_MAX_XID];
        set->last_seq++;
        if (x->dev >= 0 && x->dev < fg_cfg()->count &&
            (set->mask[x->dev] & nvmlEventTypeXidCriticalError)) {
            memset(data, 0, sizeof *data);
            data->device = &g_dev[x->dev];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = x->xid;
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            found = 1;
        }
    }
    fg_unlock();
    return found;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (!inited())
        return NVML_ERROR_UNINITIALIZED;
    if (!set || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long deadline = fg_now_ns() + (unsigned long long)timeoutms * 1000000ULL;
    for (;;) {
        fg_poll_xid_file();
        if (next_event(set, data))
            return NVML_SUCCESS;
        unsigned long long now = fg_now_ns();
        if (now >= deadline)
            return NVML_ERROR_TIMEOUT;
        unsigned long long step = deadline - now < 10000000ULL ? deadline - now : 10000000ULL;
        fg_sleep_until(now + step);
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}

/* Test hook (not an NVML API): queue an XID event for device `index`. */
EXPORT int fakegpu_inject_xid(unsigned int index, unsigned long long xid)
{
    if (index >= (unsigned)fg_cfg()->count)
        return -1;
    fg_lock();
    fg_inject_xid_locked((int)index, xid);
    fg_unlock();
    return 0;
}
