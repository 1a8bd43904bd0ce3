/* The v1 shared region: the per-container file HAMi's vGPU monitor reads.
 * Layout (x86-64, glibc; sem_t = 32 bytes) is an ABI: every offset is asserted below and
 * checked again from Python by tests/native/test_region_layout.py. */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#include <pthread.h>
#include <stdint.h>

#define VGPU_MAX_DEV 16
#define VGPU_MAX_PROC 1024
/* Slots a process may take: procs[0..VGPU_PROC_SLOTS). The last slot of the layout holds the
 * region lock instead (vgpu_lock_slot below), so proc_num never exceeds this. */
#define VGPU_PROC_SLOTS (VGPU_MAX_PROC - 1)
#define VGPU_LOCK_SLOT VGPU_PROC_SLOTS
#define VGPU_MAGIC 19920718
#define VGPU_MAJOR 1
#define VGPU_MINOR 2
#define VGPU_UUID_LEN 96

typedef struct {
    uint64_t context_size;
    uint64_t module_size;
    uint64_t data_size;
    uint64_t offset;
    uint64_t total; /* what enforcement sums */
    uint64_t unused[3];
} vgpu_devmem; /* 64 bytes */

typedef struct {
    uint64_t dec_util;
    uint64_t enc_util;
    uint64_t sm_util;
    uint64_t unused[3];
} vgpu_devutil; /* 48 bytes */

typedef struct {
    int32_t pid;      /* container-namespace PID; 0 = free slot */
    int32_t hostpid;  /* host PID (from NVML), 0 = unknown */
    vgpu_devmem used[VGPU_MAX_DEV];
    uint64_t monitorused[VGPU_MAX_DEV];
    vgpu_devutil device_util[VGPU_MAX_DEV];
    int32_t status;   /* 1 running, 2 suspended, 0 exited */
    int32_t pad0;
    uint64_t seqlock; /* odd while the owner updates used[] */
    uint64_t unused[2];
} vgpu_slot; /* 1960 bytes */

typedef struct {
    int32_t initialized_flag; /* VGPU_MAGIC once initialized */
    uint32_t major_version;
    uint32_t minor_version;
    int32_t sm_init_flag;
    uint64_t owner_pid;       /* PID holding the region lock (informational) */
    unsigned char sem[32];    /* sem_t in HAMi-core; initialised, unused by us */
    uint64_t device_num;
    char uuids[VGPU_MAX_DEV][VGPU_UUID_LEN];
    uint64_t limit[VGPU_MAX_DEV];    /* bytes, 0 = unlimited */
    uint64_t sm_limit[VGPU_MAX_DEV]; /* percent */
    vgpu_slot procs[VGPU_MAX_PROC];
    int32_t proc_num;           /* slots in use are procs[0..proc_num) */
    int32_t utilization_switch; /* 1 = compute limiter on (host monitor writes) */
    int32_t recent_kernel;
    int32_t priority;
    uint64_t last_kernel_time;  /* Unix seconds of the latest launch */
    unsigned char sem_postinit[32];
} vgpu_region;

/* procs[VGPU_LOCK_SLOT] seen as the lock's home. HAMi's monitor sums procs[0..proc_num) and
 * proc_num stays <= VGPU_PROC_SLOTS, so it never reads this slot; pid and status stay 0 for
 * readers that scan every slot. `mu` is a robust, process-shared pthread mutex (40 bytes, too
 * big for the 32-byte `sem` of the header), aligned to a 64-byte boundary of the file. */
typedef struct {
    int32_t pid;     /* always 0 */
    int32_t hostpid; /* always 0 */
    uint32_t magic;  /* VGPU_LOCK_MAGIC once `mu` is initialised */
    uint32_t version;
    unsigned char pad0[24];
    pthread_mutex_t mu;
    char boot_id[40]; /* the kernel's boot id when the last process attached ("" = unknown) */
} vgpu_lock_slot;
#define VGPU_LOCK_MAGIC 0x4c6b5631u /* "1VkL" */
#define VGPU_LOCK_OFFSET 2006976    /* absolute file offset of `mu` */

#define VGPU_REGION_SIZE 2008952
_Static_assert(sizeof(vgpu_devmem) == 64, "devmem");
_Static_assert(sizeof(vgpu_devutil) == 48, "devutil");
_Static_assert(sizeof(vgpu_slot) == 1960, "slot size");
_Static_assert(__builtin_offsetof(vgpu_slot, used) == 8, "slot.used");
_Static_assert(__builtin_offsetof(vgpu_slot, monitorused) == 1032, "slot.monitorused");
_Static_assert(__builtin_offsetof(vgpu_slot, device_util) == 1160, "slot.device_util");
_Static_assert(__builtin_offsetof(vgpu_slot, status) == 1928, "slot.status");
_Static_assert(__builtin_offsetof(vgpu_slot, seqlock) == 1936, "slot.seqlock");
_Static_assert(__builtin_offsetof(vgpu_region, owner_pid) == 16, "owner_pid");
_Static_assert(__builtin_offsetof(vgpu_region, sem) == 24, "sem");
_Static_assert(__builtin_offsetof(vgpu_region, device_num) == 56, "device_num");
_Static_assert(__builtin_offsetof(vgpu_region, uuids) == 64, "uuids");
_Static_assert(__builtin_offsetof(vgpu_region, limit) == 1600, "limit");
_Static_assert(__builtin_offsetof(vgpu_region, sm_limit) == 1728, "sm_limit");
_Static_assert(__builtin_offsetof(vgpu_region, procs) == 1856, "procs");
_Static_assert(__builtin_offsetof(vgpu_region, proc_num) == 2008896, "proc_num");
_Static_assert(__builtin_offsetof(vgpu_region, utilization_switch) == 2008900, "utilization_switch");
_Static_assert(__builtin_offsetof(vgpu_region, recent_kernel) == 2008904, "recent_kernel");
_Static_assert(__builtin_offsetof(vgpu_region, priority) == 2008908, "priority");
_Static_assert(__builtin_offsetof(vgpu_region, last_kernel_time) == 2008912, "last_kernel_time");
_Static_assert(__builtin_offsetof(vgpu_region, sem_postinit) == 2008920, "sem_postinit");
_Static_assert(sizeof(vgpu_region) == VGPU_REGION_SIZE, "region size");
_Static_assert(sizeof(pthread_mutex_t) == 40, "pthread_mutex_t (x86-64 glibc)");
_Static_assert(sizeof(vgpu_lock_slot) <= 1928, "lock slot stays clear of the slot's status field");
_Static_assert(__builtin_offsetof(vgpu_region, procs) + VGPU_LOCK_SLOT * sizeof(vgpu_slot) +
               __builtin_offsetof(vgpu_lock_slot, mu) == VGPU_LOCK_OFFSET, "lock offset");
_Static_assert(VGPU_LOCK_OFFSET % 64 == 0, "lock alignment");

enum { VGPU_MEM_CONTEXT = 0, VGPU_MEM_MODULE = 1, VGPU_MEM_DATA = 2 };

#endif
