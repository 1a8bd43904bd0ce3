/* Compute shares: a closed-loop launch-admission controller per device.
 *
 * Model. Every admitted launch (plain, Ex, cooperative, graph, and their _ptsz forms, all
 * through vgpu_launch_gate) costs this process some device time; the watcher thread
 * learns that cost per device, tau = achieved share x sample period / launches admitted
 * in the period, from NVML's per-process utilization samples of our own host PID. To hold
 * a target share L the gate then admits launches at the rate L / tau, paced by a GCRA
 * (a virtual-time token bucket that forgives oversleeping up to a small burst).
 * Because the rate comes from a fitted ratio rather than from integrating an error,
 * the loop has nothing to wind up and does not oscillate.
 *
 * Attribution. A real driver does not split a sample period between the processes that
 * shared it: each sample names one process (the one resident on the GPU when it was taken)
 * with the device's utilization over the period (seen on an H200, driver 580: two processes
 * at 30 % and 70 % show up as alternating samples of one PID each). A process is therefore
 * charged in proportion to how often it is sampled, which is right only on average. So tau
 * is a ratio of exponentially decayed sums (busy time over launches) in which a period whose
 * sample names another process counts as zero busy time for us; discarding those periods
 * (as the first version did) overcharged a process that shares the GPU by 1 / its chance of
 * being sampled: the 30 % of a 30/70 pair was held to 3.6 %. The window is short
 * (HAMI_LIMITER_WINDOW_MS, 1 s) while only this container is sampled and longer while others
 * are (HAMI_LIMITER_SHARED_WINDOW_MS, 10 s), so that enough of our samples fall in it.
 *
 * Container share. L is the container's limit (the region's sm_limit, shared by all its
 * processes). Each process aims at its current share plus an equal part of the
 * container's remaining error, pulled slowly towards an equal split, so the processes'
 * targets always add up to L. The shares are the decayed averages each process publishes
 * in its slot of the region (device_util[d].sm_util), not one sample's rows. A share not
 * refreshed for two windows is left out (its process is dead or stopped), and the watcher reaps
 * dead processes' slots once a second: a sibling killed by a signal keeps its slot's status 1
 * and its last share, and only registration, a refused allocation or a memory query reaped it,
 * so a survivor that only launched kernels was held to its half of the limit for ever (review,
 * 1 Dec: 20 % at a limit of 40). It reaps only when a split found such a share (a slot of status
 * 1 not refreshed): reaping every second whatever the slots held cost every process one pass
 * over all slots under the region lock each second (review, 1 Dec).
 *
 * Policies (GPU_CORE_UTILIZATION_POLICY): force = always capped; disable = never;
 * default = capped only while some process outside the container runs on the device
 * (seen in the same NVML samples; held 3 s after it goes quiet: a small user is sampled
 * rarely), i.e. work-conserving.
 *
 * Priority: a launch pauses while (a) a node monitor marks the region blocked
 * (recent_kernel < 0), its lease runs (limiter.h: ours grants one with every -1, renewed each
 * round, so a monitor that dies leaves nobody stalled; HAMi's grants none and its block holds
 * until lifted) and the launch's device has a compute limit (0 < sm_limit < 100: HAMi-core waits
 * on the block only in its rate limiter, which returns at once on any other device, so a
 * memory-only container is never paused; review, 1 Dec), or (b) the watcher saw a
 * higher-priority peer launch on one of our devices within HAMI_PRIORITY_QUIET_MS (priority.c).
 *
 * Clocks: polling, holds, launch-count snapshots and leases run on CLOCK_MONOTONIC. Only NVML's
 * sample stamps (and the launch stamps peers compare) are wall-clock: a sample is placed on the
 * monotonic axis by the current offset between the two, samples stamped ahead of the wall clock
 * are ignored, and the newest stamp seen is forgotten when the clock is set back far behind it.
 * On the wall clock, a clock set back froze control for the length of the step (review, 1 Dec).
 *
 * Fast path (limit not binding): one call through the gate pointer, two loads and a
 * branch when no limit is configured; plus the current device and one relaxed atomic
 * add while a limit exists but does not bind (to keep tau fresh). */
#include "vgpu.h"
#include "limiter.h"

#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

HIDDEN extern __typeof__(&nvmlInit_v2) vgpu_real_nvmlInit_v2;

enum { F_SETUP = 1, F_COUNT = 2, F_PUBLISH = 4, F_PAUSE = 8 };
#define SNAPS 512
#define MAX_SAMPLES 512
#define MAX_PIDS 64
#define ALPHA 0.25 /* pull towards an equal split inside a container */
#define MIN_LAUNCHES 4 /* decayed launches needed before tau is trusted */

typedef struct {
    uint64_t t_us, n;
} snap;

typedef struct {
    /* shared with the launch path */
    uint64_t launches;   /* admitted launches, cumulative */
    int64_t tat_ns;      /* GCRA theoretical arrival time, CLOCK_MONOTONIC */
    int64_t interval_ns; /* pacing interval; 0 = not binding */
    int used;            /* this process launched on the device */
    /* watcher only */
    nvmlDevice_t nvml;
    int nvml_state; /* 0 unknown, 1 ok, -1 unavailable */
    unsigned long long last_seen_us, prev_stamp_us, period_us; /* NVML's stamps: wall clock */
    uint64_t next_poll_us; /* no new NVML sample expected before this (monotonic) */
    uint64_t counted_since_us; /* launch counts are complete from this monotonic time on (0 = not counting) */
    double tau; /* seconds of device time per launch */
    double ew_busy, ew_launches; /* decayed sums while counting: our busy s, our launches */
    double ew_ubusy, ew_utime; /* decayed sums of every sample: our busy s, observed s */
    int have_tau;
    uint64_t others_until_ms; /* monotonic */
    int binding;
    snap snaps[SNAPS]; /* monotonic */
    unsigned snap_n;
} lim_dev;

static lim_dev g_dev[VGPU_MAX_DEV];
static unsigned g_flags = F_SETUP;
static pthread_mutex_t g_setup_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_started;
static unsigned g_tick_ms = 10;
static unsigned g_quiet_ms = 200;
static unsigned g_hold_ms = 3000;
static unsigned g_window_ms = 1000;
static unsigned g_shared_window_ms = 10000;
static uint64_t g_last_publish_ms[VGPU_MAX_DEV];
static unsigned g_pause_mask; /* region devices paused by a higher-priority peer */
static int g_single_dev = -1; /* region index when CUDA shows this process one device */
static int g_warned_pid;
static int g_watch; /* a device has a limit and the policy is not `disable` */
static uint64_t g_next_reap_ms; /* monotonic */
static int g_reap_due; /* a split left out a stale share of a slot still marked running */
static int g_stale_said; /* the expired block was logged */

/* NVML samples stamped more than this ahead of the wall clock were taken before it was set back;
 * the newest stamp seen is forgotten when the clock goes back further behind it than this */
#define STEP_US 1000000ULL
#define REAP_MS 1000 /* the watcher reaps dead processes' slots at most this often (with a limit) */

_Static_assert(sizeof(vgpu_lock_slot) <= LIM_LEASE_OFFSET, "the lease lies past the lock's fields");
_Static_assert(LIM_LEASE_OFFSET + sizeof(lim_lease) <= __builtin_offsetof(vgpu_slot, status),
               "the lease lies before the lock slot's status (kept 0)");
_Static_assert(LIM_LEASE_OFFSET % 8 == 0, "lease alignment");

/* ---------- small helpers ---------- */

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000ULL;
}

static uint64_t mono_us(void)
{
    return (uint64_t)mono_ns() / 1000ULL;
}

static void sleep_ns(int64_t ns)
{
    if (ns <= 0)
        return;
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void slot_state(unsigned bit, int on)
{
    vgpu_slot *s = vgpu_slot_mine();
    if (!s)
        return;
    if (on)
        __atomic_fetch_or(&s->unused[LIM_SLOT_STATE], (uint64_t)bit, __ATOMIC_RELAXED);
    else
        __atomic_fetch_and(&s->unused[LIM_SLOT_STATE], ~(uint64_t)bit, __ATOMIC_RELAXED);
}

static int limit_of(int d)
{
    uint64_t l = vgpu_reg->sm_limit[d];
    return l == 0 || l >= 100 ? 100 : (int)l;
}

static lim_lease *lease(void)
{
    return (lim_lease *)(void *)((char *)&vgpu_reg->procs[VGPU_LOCK_SLOT] + LIM_LEASE_OFFSET);
}

/* A share published by another process (stamp: LIM_UTIL_STAMP_MS) still counts: refreshed within
 * two averaging windows (at least 1 s: the real NVML's period is ~1/6 s), or by a libvgpu that
 * keeps no stamp (0). A stale one (its process dead or stopped; the caller saw its slot marked
 * running) asks the watcher to reap the slots (reap_siblings). */
static int share_fresh(uint64_t stamp_ms, uint64_t now_ms)
{
    uint64_t stale = 2ULL * g_window_ms > 1000 ? 2ULL * g_window_ms : 1000;
    if (!stamp_ms || stamp_ms + stale >= now_ms)
        return 1;
    if (!__atomic_load_n(&g_reap_due, __ATOMIC_RELAXED))
        __atomic_store_n(&g_reap_due, 1, __ATOMIC_RELAXED);
    return 0;
}

/* Whether device d's compute limit can bind: 0 < sm_limit < 100 (limit_of maps 0 to 100). Only
 * there does a node monitor's block hold, as in HAMi-core, where the block is waited on inside the
 * rate limiter alone, which returns at once when the device's sm_limit is 0 or >= 100. d < 0 (the
 * launch's device unknown): any device with a limit. */
static int limit_binds(int d)
{
    if (d >= 0)
        return d < VGPU_MAX_DEV && limit_of(d) < 100;
    for (int i = 0; i < VGPU_MAX_DEV; i++)
        if (limit_of(i) < 100)
            return 1;
    return 0;
}

/* ---------- launch path ---------- */

/* GCRA: each launch takes the next slot `iv` after the previous one; a slot that lies in
 * the past by more than the burst tolerance is moved up to now - burst, so an oversleep
 * is made up for without allowing long bursts after idle periods. */
static void pace(lim_dev *D, int64_t iv)
{
    int64_t burst = iv * 2 > 5000000 ? iv * 2 : 5000000;
    int64_t now = mono_ns();
    int64_t tat = __atomic_load_n(&D->tat_ns, __ATOMIC_RELAXED), start;
    do
        start = tat > now - burst ? tat : now - burst;
    while (!__atomic_compare_exchange_n(&D->tat_ns, &tat, start + iv, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    if (start > now) {
        slot_state(LIM_STATE_THROTTLED, 1);
        sleep_ns(start - now);
    }
}

/* Whether the node monitor's block (recent_kernel < 0) holds on device d (-1: unknown): only where
 * the compute limit binds (limit_binds), then while its lease runs, or with no expiry when it
 * grants none (HAMi's monitor). A lease further ahead than LIM_LEASE_MAX_MS is no lease of this
 * clock (another time namespace, or garbage): ignored, as an expired one is. Before 1 Dec every
 * launch waited, so a memory-only container (no gpucores) was paused by a block HAMi-core never
 * honours there (review, 1 Dec). */
static int monitor_blocked(int d)
{
    if (__atomic_load_n(&vgpu_reg->recent_kernel, __ATOMIC_RELAXED) >= 0 || !limit_binds(d))
        return 0;
    uint64_t until = __atomic_load_n(&lease()->until_ms, __ATOMIC_ACQUIRE);
    if (!until)
        return 1;
    uint64_t now = lim_mono_ms();
    if (now < until && until - now <= LIM_LEASE_MAX_MS) {
        if (__atomic_load_n(&g_stale_said, __ATOMIC_RELAXED))
            __atomic_store_n(&g_stale_said, 0, __ATOMIC_RELAXED);
        return 1;
    }
    if (!__atomic_load_n(&g_stale_said, __ATOMIC_RELAXED) &&
        !__atomic_exchange_n(&g_stale_said, 1, __ATOMIC_RELAXED))
        LOG_WARN("recent_kernel = -1 ignored: the monitor's lease on it %s",
                 now < until ? "is too far ahead" : "ran out");
    return 0;
}

/* Paused on device d (-1 = unknown: any paused device counts). */
static int paused_on(int d)
{
    if (monitor_blocked(d))
        return 1;
    if (!(__atomic_load_n(&g_flags, __ATOMIC_ACQUIRE) & F_PAUSE))
        return 0;
    unsigned mask = __atomic_load_n(&g_pause_mask, __ATOMIC_ACQUIRE);
    return d < 0 ? mask != 0 : (mask >> d) & 1;
}

static void wait_priority(int d)
{
    if (!paused_on(d))
        return;
    slot_state(LIM_STATE_PAUSED, 1);
    LOG_DEBUG("paused: a higher-priority task is using the GPU");
    while (paused_on(d))
        sleep_ns(1000000);
    slot_state(LIM_STATE_PAUSED, 0);
}

static int launch_dev(void)
{
    return g_single_dev >= 0 ? g_single_dev : vgpu_current_dev();
}

static void setup(void);

static CUresult gate_slow(const vgpu_launch_info *info, unsigned f)
{
    (void)info;
    if (UNLIKELY(f & F_SETUP)) {
        setup();
        f = __atomic_load_n(&g_flags, __ATOMIC_ACQUIRE);
    }
    int d = (f & (F_PUBLISH | F_PAUSE | F_COUNT)) ? launch_dev() : -1;
    if (d >= VGPU_MAX_DEV)
        d = -1;
    vgpu_slot *mine = vgpu_slot_mine(); /* read once: NULL once the exit handler ran (region.c) */
    if ((f & F_PUBLISH) && d >= 0 && mine) {
        uint64_t ms = lim_wall_ms();
        if (ms != __atomic_load_n(&g_last_publish_ms[d], __ATOMIC_RELAXED)) {
            __atomic_store_n(&g_last_publish_ms[d], ms, __ATOMIC_RELAXED);
            __atomic_store_n(&mine->used[d].unused[LIM_DEV_LAST_LAUNCH_MS], ms, __ATOMIC_RELEASE);
            __atomic_store_n(&mine->unused[LIM_SLOT_LAST_LAUNCH_MS], ms, __ATOMIC_RELEASE);
        }
    }
    if (f & F_PAUSE)
        wait_priority(d);
    if (f & F_COUNT) {
        if (d < 0)
            return CUDA_SUCCESS;
        lim_dev *D = &g_dev[d];
        if (UNLIKELY(!__atomic_load_n(&D->used, __ATOMIC_RELAXED)))
            __atomic_store_n(&D->used, 1, __ATOMIC_RELAXED);
        int64_t iv = __atomic_load_n(&D->interval_ns, __ATOMIC_RELAXED);
        if (iv > 0)
            pace(D, iv);
        __atomic_fetch_add(&D->launches, 1, __ATOMIC_RELAXED);
    }
    return CUDA_SUCCESS;
}

static CUresult gate(const vgpu_launch_info *info)
{
    /* a monitor's block holds only where the launch's device has a limit (monitor_blocked): with
     * none anywhere, not even the device is asked for */
    if (UNLIKELY(__atomic_load_n(&vgpu_reg->recent_kernel, __ATOMIC_RELAXED) < 0) && limit_binds(-1)) {
        int d = launch_dev();
        wait_priority(d < VGPU_MAX_DEV ? d : -1);
    }
    unsigned f = __atomic_load_n(&g_flags, __ATOMIC_ACQUIRE);
    if (LIKELY(f == 0))
        return CUDA_SUCCESS;
    return gate_slow(info, f);
}

/* ---------- the controller (watcher thread) ---------- */

static void snapshot(lim_dev *D, uint64_t t_us)
{
    snap *s = &D->snaps[D->snap_n % SNAPS];
    s->t_us = t_us;
    s->n = __atomic_load_n(&D->launches, __ATOMIC_RELAXED);
    D->snap_n++;
}

/* Admitted launches up to monotonic time t (interpolated between snapshots); -1 if unknown. */
static double launches_at(const lim_dev *D, uint64_t t)
{
    unsigned have = D->snap_n < SNAPS ? D->snap_n : SNAPS;
    const snap *later = NULL;
    for (unsigned k = 0; k < have; k++) {
        const snap *s = &D->snaps[(D->snap_n - 1 - k) % SNAPS];
        if (s->t_us <= t) {
            if (!later || later->t_us == s->t_us)
                return (double)s->n;
            double w = (double)(t - s->t_us) / (double)(later->t_us - s->t_us);
            return (double)s->n + w * (later->n >= s->n ? (double)(later->n - s->n) : 0.0);
        }
        later = s;
    }
    return -1;
}

typedef struct {
    unsigned pid;
    double sum;
    int n;
} pid_util;

static int container_pid(unsigned pid)
{
    int n = __atomic_load_n(&vgpu_reg->proc_num, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n && i < VGPU_PROC_SLOTS; i++) {
        const vgpu_slot *s = &vgpu_reg->procs[i];
        if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) &&
            (unsigned)__atomic_load_n(&s->hostpid, __ATOMIC_ACQUIRE) == pid)
            return 1;
    }
    return 0;
}

/* The averaged shares the container's other live processes published for device d (and still
 * refresh: share_fresh). */
static void container_shares(int d, double *u_cont, int *n_act, uint64_t now_ms)
{
    int n = __atomic_load_n(&vgpu_reg->proc_num, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n && i < VGPU_PROC_SLOTS; i++) {
        const vgpu_slot *s = &vgpu_reg->procs[i];
        if (s == vgpu_my_slot || !__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) ||
            !__atomic_load_n(&s->status, __ATOMIC_ACQUIRE)) /* free, or its process exiting */
            continue;
        if (!share_fresh(__atomic_load_n(&s->device_util[d].unused[LIM_UTIL_STAMP_MS], __ATOMIC_RELAXED), now_ms))
            continue; /* dead (not reaped yet) or stopped */
        uint64_t u = __atomic_load_n(&s->device_util[d].sm_util, __ATOMIC_RELAXED);
        *u_cont += (double)u;
        *n_act += u >= 1;
    }
}

static int nvml_handle_unguarded(int d, lim_dev *D)
{
    if (D->nvml_state)
        return D->nvml_state > 0;
    __typeof__(&nvmlDeviceGetHandleByUUID) by_uuid = vgpu_nvml_sym("nvmlDeviceGetHandleByUUID");
    D->nvml_state = -1;
    char uuid[VGPU_UUID_LEN + 1];
    vgpu_region_uuid(d, uuid);
    if (vgpu_real_nvmlInit_v2 && vgpu_real_nvmlInit_v2() == NVML_SUCCESS && by_uuid &&
        by_uuid(uuid, &D->nvml) == NVML_SUCCESS)
        D->nvml_state = 1;
    else
        LOG_WARN("device %d: NVML utilization unavailable; compute share not enforced", d);
    return D->nvml_state > 0;
}

/* nvml_handle, with libvgpu's own NVML calls marked internal (vgpu.h: vgpu_nvml_internal). */
static int nvml_handle(int d, lim_dev *D)
{
    vgpu_nvml_internal++;
    int r = nvml_handle_unguarded(d, D);
    vgpu_nvml_internal--;
    return r;
}

/* Per-PID mean smUtil over the new samples up to wall time `upto` (later ones were stamped before
 * the clock was set back); returns rows, fills the newest stamp. */
static int read_samples_unguarded(lim_dev *D, pid_util *rows, unsigned long long *newest, unsigned long long upto)
{
    static __typeof__(&nvmlDeviceGetProcessUtilization) get;
    if (!get)
        get = vgpu_nvml_sym("nvmlDeviceGetProcessUtilization");
    nvmlProcessUtilizationSample_t buf[MAX_SAMPLES];
    unsigned n = MAX_SAMPLES;
    if (!get || get(D->nvml, buf, &n, D->last_seen_us) != NVML_SUCCESS)
        return -1;
    int rows_n = 0;
    *newest = 0;
    for (unsigned i = 0; i < n && i < MAX_SAMPLES; i++) {
        if (buf[i].timeStamp <= D->last_seen_us || buf[i].timeStamp > upto)
            continue;
        if (buf[i].timeStamp > *newest)
            *newest = buf[i].timeStamp;
        int j = 0;
        while (j < rows_n && rows[j].pid != buf[i].pid)
            j++;
        if (j == rows_n) {
            if (rows_n == MAX_PIDS)
                continue;
            rows[rows_n++] = (pid_util){buf[i].pid, 0, 0};
        }
        rows[j].sum += buf[i].smUtil;
        rows[j].n++;
    }
    return *newest ? rows_n : -1;
}

/* read_samples, with libvgpu's own NVML calls marked internal (vgpu.h: vgpu_nvml_internal). */
static int read_samples(lim_dev *D, pid_util *rows, unsigned long long *newest, unsigned long long upto)
{
    vgpu_nvml_internal++;
    int r = read_samples_unguarded(D, rows, newest, upto);
    vgpu_nvml_internal--;
    return r;
}

/* A process joining a container whose other processes are already held starts from their
 * mean cost per launch instead of running unpaced until its own first fit. */
static int seed_tau(int d, lim_dev *D)
{
    double sum = 0;
    uint64_t now_ms = lim_mono_ms();
    int n = 0, procs = __atomic_load_n(&vgpu_reg->proc_num, __ATOMIC_ACQUIRE);
    for (int i = 0; i < procs && i < VGPU_PROC_SLOTS; i++) {
        const vgpu_slot *s = &vgpu_reg->procs[i];
        uint64_t t = __atomic_load_n(&s->used[d].unused[LIM_DEV_TAU_NS], __ATOMIC_RELAXED);
        if (s != vgpu_my_slot && __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&s->status, __ATOMIC_ACQUIRE) && t &&
            share_fresh(__atomic_load_n(&s->device_util[d].unused[LIM_UTIL_STAMP_MS], __ATOMIC_RELAXED), now_ms))
            sum += (double)t / 1e9, n++;
    }
    if (!n)
        return 0;
    D->tau = sum / n;
    D->have_tau = 1;
    LOG_INFO("device %d: starting from the container's cost per launch, %.0f us", d, D->tau * 1e6);
    return n;
}

/* Force policy, a process joining a container whose other processes are already held: start
 * paced at an equal split from their cost per launch, and announce that share at once so that
 * the others make room before our own averages exist. */
static void set_interval(int d, lim_dev *D, int64_t iv);

static void seed_pacing(int d, lim_dev *D)
{
    int peers = seed_tau(d, D);
    if (!peers)
        return;
    double share = limit_of(d) / (double)(peers + 1);
    set_interval(d, D, (int64_t)(D->tau / (share / 100.0) * 1e9));
    vgpu_slot *mine = vgpu_slot_mine();
    if (mine) {
        __atomic_store_n(&mine->device_util[d].sm_util, (uint64_t)share, __ATOMIC_RELAXED);
        __atomic_store_n(&mine->device_util[d].unused[LIM_UTIL_STAMP_MS], lim_mono_ms(), __ATOMIC_RELAXED);
    }
}

static void set_interval(int d, lim_dev *D, int64_t iv)
{
    int64_t old = __atomic_exchange_n(&D->interval_ns, iv, __ATOMIC_RELAXED);
    if ((old > 0) != (iv > 0)) {
        LOG_INFO("device %d: compute share %s (limit %d%%)", d, iv > 0 ? "enforced" : "not binding",
                 limit_of(d));
        if (iv > 0) /* start pacing from now, not from a stale slot */
            __atomic_store_n(&D->tat_ns, mono_ns(), __ATOMIC_RELAXED);
    }
}

/* now_ms, now_us: monotonic; wall: the wall clock read with now_us (NVML's sample stamps) */
static void control(int d, lim_dev *D, uint64_t now_ms, uint64_t now_us, uint64_t wall)
{
    if (now_us < D->next_poll_us || !nvml_handle(d, D))
        return;
    if (D->last_seen_us && wall + STEP_US < D->last_seen_us) {
        /* set back: every new sample would look older than the newest one seen */
        LOG_INFO("device %d: the wall clock went back %.1f s; reading utilization samples afresh", d,
                 (double)(D->last_seen_us - wall) / 1e6);
        D->last_seen_us = D->prev_stamp_us = 0;
    }
    pid_util rows[MAX_PIDS];
    unsigned long long newest;
    int n = read_samples(D, rows, &newest, wall + STEP_US);
    /* the next sample is due one period after this one; nothing new: look again a
     * quarter period later (20 ms before the period is known) */
    uint64_t quarter = D->period_us ? D->period_us / 4 : 20000;
    if (n < 0) {
        D->next_poll_us = now_us + quarter;
        return;
    }
    if (D->period_us && newest + D->period_us > wall) {
        uint64_t wait = newest + D->period_us - wall;
        D->next_poll_us = now_us + (wait < D->period_us ? wait : D->period_us);
    }
    /* the newest sample's end on the monotonic axis of the snapshots */
    uint64_t off = wall > now_us ? wall - now_us : 0;
    uint64_t newest_mono = newest > off ? newest - off : 0;
    vgpu_slot *mine = vgpu_slot_mine(); /* NULL once the exit handler ran */
    unsigned me = mine ? (unsigned)__atomic_load_n(&mine->hostpid, __ATOMIC_ACQUIRE) : 0;
    if (!me && !g_warned_pid++)
        LOG_WARN("host PID unknown: compute share not enforced for this process");
    double u_me = 0, u_other = 0;
    for (int i = 0; i < n; i++) {
        double u = rows[i].sum / rows[i].n;
        if (me && rows[i].pid == me)
            u_me = u;
        else if (!container_pid(rows[i].pid))
            u_other += u;
    }
    if (D->prev_stamp_us && newest > D->prev_stamp_us) {
        unsigned long long gap = newest - D->prev_stamp_us;
        D->period_us = !D->period_us || gap < D->period_us ? gap : D->period_us;
    }
    D->prev_stamp_us = newest;
    D->last_seen_us = newest;
    if (u_other >= 1)
        D->others_until_ms = now_ms + g_hold_ms;
    if (u_me >= 1 && !__atomic_load_n(&D->used, __ATOMIC_RELAXED))
        __atomic_store_n(&D->used, 1, __ATOMIC_RELAXED);
    if (!D->period_us)
        return;
    /* decayed sums over a window of about HAMI_LIMITER_WINDOW_MS (longer while others are
     * sampled: each of our samples is then rarer); 1 - p/w stands in for exp(-p/w) */
    double p_s = (double)D->period_us / 1e6;
    double w_s = (double)(now_ms < D->others_until_ms ? g_shared_window_ms : g_window_ms) / 1e3;
    double keep = p_s >= w_s ? 0 : 1 - p_s / w_s;
    /* the share used to split the container's limit follows faster (an eighth of the window):
     * its noise moves the split between our processes, never the container's total */
    double keep_u = p_s >= w_s / 8 ? 0 : 1 - p_s / (w_s / 8);
    double busy = u_me / 100.0 * p_s;
    D->ew_ubusy = D->ew_ubusy * keep_u + busy;
    D->ew_utime = D->ew_utime * keep_u + p_s;
    double u_avg = D->ew_ubusy / D->ew_utime * 100.0;
    if (mine) { /* our share, averaged: read by the container's other processes and the monitor */
        __atomic_store_n(&mine->device_util[d].sm_util, (uint64_t)(u_avg + 0.5), __ATOMIC_RELAXED);
        __atomic_store_n(&mine->device_util[d].unused[LIM_UTIL_STAMP_MS], now_ms, __ATOMIC_RELAXED);
    }
    if (D->counted_since_us && newest_mono >= D->counted_since_us + D->period_us) {
        double a = launches_at(D, newest_mono - D->period_us), b = launches_at(D, newest_mono);
        if (a >= 0 && b >= 0) {
            /* a period whose sample named someone else is zero busy time for us, not unknown */
            D->ew_busy = D->ew_busy * keep + busy;
            D->ew_launches = D->ew_launches * keep + (b - a);
        }
        if (D->ew_launches >= MIN_LAUNCHES && D->ew_busy > 0) {
            D->tau = D->ew_busy / D->ew_launches;
            D->have_tau = 1;
        }
    }
    double u_cont = 0;
    int n_act = 1;
    container_shares(d, &u_cont, &n_act, now_ms);
    int policy = vgpu_cfg.core_policy, L = limit_of(d);
    int binding = L < 100 && (policy == 1 || (policy == 0 && now_ms < D->others_until_ms));
    if (binding != D->binding)
        slot_state(LIM_STATE_THROTTLED, binding);
    D->binding = binding;
    if (binding && !D->have_tau)
        seed_tau(d, D);
    if (!binding || !D->have_tau) {
        set_interval(d, D, 0);
        return;
    }
    double total = u_avg + u_cont;
    double target = u_avg + (L - total) * (1 - ALPHA) / n_act + ALPHA * ((double)L / n_act - u_avg);
    if (target > L)
        target = L;
    if (target < 0.5)
        target = 0.5;
    double iv = D->tau / (target / 100.0) * 1e9;
    set_interval(d, D, (int64_t)(iv < 1 ? 1 : iv));
    if (mine) /* lets a process joining the container start from our cost */
        __atomic_store_n(&mine->used[d].unused[LIM_DEV_TAU_NS], (uint64_t)(D->tau * 1e9), __ATOMIC_RELAXED);
    LOG_DEBUG("device %d: me %.0f%% (avg %.1f%%) container %.0f%% others %.0f%% tau %.0fus target %.1f%%", d, u_me,
              u_avg, total, u_other, D->tau * 1e6, target);
}

static void publish_flags(int pause, int count)
{
    unsigned f = __atomic_load_n(&g_flags, __ATOMIC_RELAXED) & ~(unsigned)(F_PAUSE | F_COUNT);
    __atomic_store_n(&g_flags, f | (pause ? F_PAUSE : 0) | (count ? F_COUNT : 0), __ATOMIC_RELEASE);
}

/* Dead processes' slots (a sibling killed by a signal keeps status 1 and its last share) are
 * reclaimed under the region lock, at most once a second, while this process has a limit to split
 * with others, and only once a split found a stale share of a slot marked running (g_reap_due):
 * a reap is a pass over every slot under the lock (reap_locked), which each process made every
 * second whatever the slots held (review, 1 Dec). A stopped process's share is stale too: its
 * slot is looked at again at most once a second while it stays so. */
static void reap_siblings(uint64_t now_ms)
{
    if (!__atomic_load_n(&g_reap_due, __ATOMIC_RELAXED) || now_ms < g_next_reap_ms)
        return;
    g_next_reap_ms = now_ms + REAP_MS;
    __atomic_store_n(&g_reap_due, 0, __ATOMIC_RELAXED);
    if (vgpu_slot_mine() && __atomic_load_n(&vgpu_reg->proc_num, __ATOMIC_ACQUIRE) > 1)
        (void)vgpu_region_used_reaped(0);
}

static void *watcher(void *arg)
{
    (void)arg;
    int prio = vgpu_reg->priority;
    unsigned paused = 0;
    for (;;) {
        uint64_t now_us = mono_us(), wall = wall_us(), now_ms = now_us / 1000;
        if (g_watch)
            reap_siblings(now_ms);
        int counting = (__atomic_load_n(&g_flags, __ATOMIC_RELAXED) & F_COUNT) != 0, need = 0;
        int ndev = (int)__atomic_load_n(&vgpu_reg->device_num, __ATOMIC_ACQUIRE);
        for (int d = 0; g_watch && d < ndev && d < VGPU_MAX_DEV; d++) {
            lim_dev *D = &g_dev[d];
            if (limit_of(d) >= 100)
                continue;
            if (!counting)
                D->counted_since_us = 0, D->ew_busy = D->ew_launches = 0;
            else if (!D->counted_since_us)
                D->counted_since_us = now_us;
            if (counting && __atomic_load_n(&D->used, __ATOMIC_RELAXED)) {
                snapshot(D, now_us);
                if (!D->have_tau && vgpu_cfg.core_policy == 1)
                    seed_pacing(d, D);
            }
            control(d, D, now_ms, now_us, wall);
            /* count launches while capped, or while others use the GPU (about to be) */
            need |= vgpu_cfg.core_policy == 1 || now_ms < D->others_until_ms;
        }
        unsigned block = lim_peer_blocks(prio, wall / 1000, now_ms, g_quiet_ms);
        if (block != paused)
            LOG_INFO("launches paused by a higher-priority task on devices 0x%x", block);
        paused = block;
        __atomic_store_n(&g_pause_mask, block, __ATOMIC_RELEASE);
        publish_flags(block != 0, need);
        sleep_ns((int64_t)g_tick_ms * 1000000LL);
    }
    return NULL;
}

static void after_fork_child(void)
{
    memset(g_dev, 0, sizeof g_dev);
    pthread_mutex_init(&g_setup_mu, NULL);
    g_started = 0;
    memset(g_last_publish_ms, 0, sizeof g_last_publish_ms);
    g_pause_mask = 0;
    g_single_dev = -1;
    g_watch = 0;
    g_next_reap_ms = 0;
    g_reap_due = 0;
    g_stale_said = 0;
    __atomic_store_n(&g_flags, F_SETUP, __ATOMIC_RELEASE);
}

static void setup(void)
{
    pthread_mutex_lock(&g_setup_mu);
    if (g_started) {
        pthread_mutex_unlock(&g_setup_mu);
        return;
    }
    g_started = 1;
    g_tick_ms = (unsigned)vgpu_env_int("HAMI_LIMITER_TICK_MS", 10, 1, 1000, "milliseconds");
    g_quiet_ms = (unsigned)vgpu_env_int("HAMI_PRIORITY_QUIET_MS", 200, 10, 60000, "milliseconds");
    g_hold_ms = (unsigned)vgpu_env_int("HAMI_CONTENTION_HOLD_MS", 3000, 0, 60000, "milliseconds");
    g_window_ms = (unsigned)vgpu_env_int("HAMI_LIMITER_WINDOW_MS", 1000, 100, 60000, "milliseconds");
    g_shared_window_ms =
        (unsigned)vgpu_env_int("HAMI_LIMITER_SHARED_WINDOW_MS", 10000, 100, 600000, "milliseconds");
    /* this region's library expires a monitor's block: the monitor may block it by default */
    if (__atomic_load_n(&lease()->magic, __ATOMIC_RELAXED) != LIM_LEASE_MAGIC)
        __atomic_store_n(&lease()->magic, LIM_LEASE_MAGIC, __ATOMIC_RELEASE);
    vgpu_slot *mine = vgpu_slot_mine();
    int pid = mine ? __atomic_load_n(&mine->hostpid, __ATOMIC_ACQUIRE) : 0;
    if (!pid) /* not found at context creation (or written by a node agent) */
        pid = lim_resolve_host_pid(vgpu_current_dev());
    if (pid && mine)
        __atomic_store_n(&mine->hostpid, pid, __ATOMIC_RELEASE);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    __typeof__(&cuDeviceGetCount) count = cuda ? vgpu_real_dlsym_fn(cuda, "cuDeviceGetCount") : NULL;
    int ndev = 0;
    if (count && count(&ndev) == CUDA_SUCCESS && ndev == 1)
        g_single_dev = vgpu_cuda_dev(0);
    int any = 0;
    for (int d = 0; d < VGPU_MAX_DEV; d++)
        any |= limit_of(d) < 100;
    unsigned f = 0;
    g_watch = any && vgpu_cfg.core_policy != 2 && vgpu_my_slot;
    if (g_watch && vgpu_cfg.core_policy == 1) {
        f |= F_COUNT;
        /* paced from the first launch when the container's other processes are held already
         * (else the launches before the watcher's first tick go through unpaced) */
        int ndev = (int)__atomic_load_n(&vgpu_reg->device_num, __ATOMIC_ACQUIRE);
        for (int d = 0; d < ndev && d < VGPU_MAX_DEV; d++)
            if (limit_of(d) < 100)
                seed_pacing(d, &g_dev[d]);
    }
    if (lim_peers_configured() && vgpu_my_slot)
        f |= F_PUBLISH;
    LOG_INFO("compute share: %s, policy %s%s, priority %d, host pid %d%s", any ? "limited" : "no limit",
             vgpu_cfg.core_policy == 1 ? "force" : vgpu_cfg.core_policy == 2 ? "disable" : "default",
             vgpu_cfg.core_policy_implied ? " (koordlet's HAMi-core settings)" : "", vgpu_reg->priority, pid,
             f & F_PUBLISH ? ", peers watched" : "");
    __atomic_store_n(&g_flags, f, __ATOMIC_RELEASE);
    if (g_watch || f) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, watcher, NULL) != 0) {
            LOG_ERROR("cannot start the compute-share watcher: %s", strerror(errno));
            g_watch = 0;
            __atomic_store_n(&g_flags, 0, __ATOMIC_RELEASE);
        }
        pthread_attr_destroy(&a);
    }
    pthread_mutex_unlock(&g_setup_mu);
}

__attribute__((constructor)) static void limiter_install(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
    vgpu_launch_gate = gate;
}
