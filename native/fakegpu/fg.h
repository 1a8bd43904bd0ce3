/* Shared internals of the fake GPU (fake libcuda.so.1 and fake libnvidia-ml.so.1).
 *
 * Both libraries read the same device configuration (environment or config file) and
 * share one state file per "machine" (FAKEGPU_STATE_DIR): per-process device memory,
 * kernel busy intervals (for NVML utilization samples) and injected XID events.
 * Everything here is hidden (not exported) from the shared objects. */
#ifndef FAKEGPU_FG_H
#define FAKEGPU_FG_H

#include <pthread.h>
#include <stdint.h>

#define FG_MAX_DEV 16
#define FG_MAX_PROC 512
#define FG_RING 4096
#define FG_MAX_XID 256
#define FG_MAGIC 0x46414b45u /* "FAKE" */
#define FG_VERSION 3u
#define FG_BLOCKS_PER_SM 16ULL
#define FG_SMALL_ALIGN 512ULL
#define FG_LARGE_ALIGN (2ULL << 20)

#define FG_HIDDEN __attribute__((visibility("hidden")))

typedef struct {
    char name[96];
    char uuid[96];      /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
    unsigned char uuid_bytes[16];
    char pci[32];       /* "00000000:18:00.0" (NVML form, 8-digit domain) */
    unsigned domain, bus, device;
    unsigned pci_device_id; /* e.g. 0x233010de */
    unsigned long long memory;
    int sms;
    int numa;
    int cc_major, cc_minor;
    /* interconnect (fake_nvml_topo.c) */
    int nvlinks[FG_MAX_DEV]; /* direct NVLinks to each other device (config order) */
    int nvswitch_links;      /* NVLinks into the NVSwitch fabric */
    int pcie_switch;         /* PCIe switch id, -1: none */
    int host_bridge;         /* host bridge id, -1: one per NUMA node */
    int board;               /* multi-GPU board id, -1: none */
    /* MIG (fake_nvml_mig.c) */
    int mig_geometry;        /* FG_MIG_* */
    int mig_on;              /* MIG mode of a fresh machine */
} fg_dev_cfg;

#define FG_MIG_NONE 0
#define FG_MIG_A100_40GB 1
#define FG_MIG_H100_80GB 2
#define FG_MIG_AUTO (-1)
#define FG_MAX_GI 8 /* GPU instance ids 1..8 */
#define FG_NVLINK_MAX 18 /* NVML_NVLINK_MAX_LINKS */

typedef struct {
    int count;
    fg_dev_cfg dev[FG_MAX_DEV];
    unsigned long long ctx_mem;     /* device memory charged per context */
    unsigned long long kernel_ns;   /* default kernel time per wave */
    double time_scale;              /* multiplies every kernel duration */
    int hostpid_offset;             /* NVML reports getpid()+offset */
    unsigned context_delay_ms;      /* a primary context takes this long to make, once charged (tests) */
    unsigned sample_period_us;      /* NVML utilization sample period */
    int util_resident;              /* 1: each sample names only the process resident at its instant (the real driver) */
    char state_dir[256];            /* "" = $FAKEGPU_STATE_DIR or /tmp/fakegpu-<uid> */
    char visible_env[64];           /* "" = every device; else the variable naming this process's devices */
    int nvis;                       /* the devices this process may see (physical indices) */
    int vis[FG_MAX_DEV];
    int reuse_handles;              /* 1: a freed handle's value is given to the next one of its kind (tests) */
    int uuid_api;                   /* FAKEGPU_UUID_API: 2 = v2 (default), 1 = v1 only, 0 = none readable */
} fg_config;

typedef struct {
    int32_t pid;   /* the PID NVML reports (host PID, or a synthetic one); 0 = free */
    int32_t live;  /* 1: the owner holds a POSIX lock on byte <slot> of <state_dir>/live */
    unsigned long long pidns; /* inode of the owner's PID namespace */
    int32_t nspid; /* the owner's getpid() in that namespace */
    int32_t pad;
    unsigned long long start; /* the owner's start time (/proc/self/stat field 22) */
    unsigned long long used[FG_MAX_DEV];
    unsigned long long contexts[FG_MAX_DEV];
} fg_proc;

typedef struct {
    int32_t pid;
    int32_t pad;
    unsigned long long start_ns, end_ns; /* CLOCK_REALTIME ns */
} fg_busy;

typedef struct {
    unsigned long long seq; /* 1-based, monotonically increasing */
    int32_t dev;
    int32_t pad;
    unsigned long long xid;
} fg_xid;

/* One GPU instance (and its single, full-size compute instance) in the shared state. */
typedef struct {
    int32_t used;
    int32_t profile;    /* NVML_GPU_INSTANCE_PROFILE_* index */
    int32_t start, size;
    int32_t ci_used;    /* compute instance 0 exists */
    int32_t pad;
    unsigned long long gen; /* creation number: part of the MIG UUID */
} fg_gi;

typedef struct {
    int32_t mode; /* NVML_DEVICE_MIG_ENABLE / DISABLE */
    int32_t pad;
    fg_gi gi[FG_MAX_GI + 1]; /* indexed by GPU instance id; [0] unused */
} fg_mig;

typedef struct {
    uint32_t magic, version;
    pthread_mutex_t lock; /* process-shared, robust */
    fg_proc procs[FG_MAX_PROC];
    unsigned long long dev_busy_until[FG_MAX_DEV];
    unsigned long long busy_count[FG_MAX_DEV];
    fg_busy busy[FG_MAX_DEV][FG_RING];
    unsigned long long xid_seq;
    fg_xid xids[FG_MAX_XID];
    unsigned long long mig_gen;
    fg_mig mig[FG_MAX_DEV];
} fg_state;

/* MIG geometry of a product (fg_mig.c): profiles indexed by NVML_GPU_INSTANCE_PROFILE_*. */
#define FG_MIG_PROFILES 17 /* NVML_GPU_INSTANCE_PROFILE_COUNT */
#define FG_MIG_COMPUTE_SLICES 7
typedef struct {
    int valid;
    unsigned id;         /* NVML profile id (what Create*, GetGpuInstances take) */
    const char *name;    /* "1g.5gb" */
    unsigned instances;  /* instanceCount */
    unsigned slices;     /* compute slices */
    unsigned sms;
    unsigned long long mem_mib;
    unsigned size;       /* memory slices of each placement */
    unsigned nstarts;
    unsigned starts[8];
} fg_mig_profile;

FG_HIDDEN const fg_mig_profile *fg_mig_geometry(int geometry); /* NULL: no MIG */
/* "MIG-…" of GPU instance `id` (creation number `gen`) on a device with these UUID bytes. */
FG_HIDDEN void fg_mig_uuid(const unsigned char gpu_uuid[16], int id, unsigned long long gen, char *out, unsigned long len);

FG_HIDDEN const fg_config *fg_cfg(void);      /* parsed once; exits on bad config */
FG_HIDDEN fg_state *fg_st(void);              /* mapped once */
FG_HIDDEN void fg_lock(void);
FG_HIDDEN void fg_unlock(void);
FG_HIDDEN unsigned long long fg_now_ns(void);
FG_HIDDEN void fg_sleep_until(unsigned long long t_ns);
FG_HIDDEN int fg_pid_alive(int pid);
/* Under fg_lock: this process's slot (created if create != 0), NULL if none/full. */
FG_HIDDEN fg_proc *fg_self_slot(int create);
/* Under fg_lock: drop records of dead processes (their memory is released). */
FG_HIDDEN void fg_reap(void);
FG_HIDDEN unsigned long long fg_dev_used(int dev); /* under fg_lock */
FG_HIDDEN int fg_parse_size(const char *s, unsigned long long *out);
/* Under fg_lock: record a busy interval of `pid` on `dev`. */
FG_HIDDEN void fg_record_busy(int dev, int pid, unsigned long long start, unsigned long long end);
FG_HIDDEN void fg_inject_xid_locked(int dev, unsigned long long xid);
FG_HIDDEN void fg_poll_xid_file(void);
FG_HIDDEN unsigned long long fg_round_alloc(unsigned long long size);

#endif
