/* Compute shares (CUDA_DEVICE_SM_LIMIT) and task priority (CUDA_TASK_PRIORITY).
 *
 * limiter.c plugs into libvgpu's launch gate (vgpu_launch_gate, called on every launch
 * path) and runs one watcher thread per process that closes the loop on NVML's
 * per-process utilization samples; priority.c decides, from peer regions, whether a
 * higher-priority task is active on one of our devices; hostpid.c finds this process's
 * PID as NVML reports it. See docs/compute-shares.md. */
#ifndef VGPU_LIMITER_H
#define VGPU_LIMITER_H

#include <stdint.h>

/* Slot fields of the v1 region that HAMi leaves unused and we give a meaning to
 * (the HAMi monitor ignores them, so the layout stays compatible):
 *   procs[i].unused[0]  wall-clock ms of this process's latest kernel launch (any device)
 *   procs[i].unused[1]  compute-share state of this process (bit 0: throttled,
 *                       bit 1: paused by priority), for `hami` tools and tests
 *   procs[i].used[d].unused[0]  wall-clock ms of its latest launch on device d
 *   procs[i].used[d].unused[1]  its fitted device time per launch on device d, in ns */
#define LIM_SLOT_LAST_LAUNCH_MS 0
#define LIM_DEV_LAST_LAUNCH_MS 0
#define LIM_DEV_TAU_NS 1
#define LIM_SLOT_STATE 1
#define LIM_STATE_THROTTLED 1u
#define LIM_STATE_PAUSED 2u
/*   procs[i].device_util[d].unused[0]  CLOCK_MONOTONIC ms at which device_util[d].sm_util (and
 *                       used[d].unused[1]) were last published: a share not refreshed for two
 *                       averaging windows is left out of the container's split (its process is
 *                       dead or stopped; 0 = written by an older libvgpu: counted) */
#define LIM_UTIL_STAMP_MS 0

/* Priority lease: a monitor's block (recent_kernel = -1) that expires. 16 bytes of the region's
 * last process slot, procs[VGPU_LOCK_SLOT], which holds the region lock and which no process
 * takes (region.h: HAMi's monitor reads procs[0..proc_num) only, proc_num <= VGPU_PROC_SLOTS),
 * well past the lock's own fields (vgpu_lock_slot) and before the slot's status (kept 0):
 *   magic     LIM_LEASE_MAGIC, written by libvgpu at its first launch: this region's library
 *             honours a block only while its lease runs (the monitor then blocks by default)
 *   until_ms  written by the monitor before each -1: CLOCK_MONOTONIC ms until which the block
 *             holds; 0 = a monitor that grants no lease (HAMi's): the block holds until lifted.
 *             A lease more than LIM_LEASE_MAX_MS ahead is not one (another clock): ignored.
 *             Cleared, with a -1, by the first process attaching after a reboot (region.c
 *             check_boot: the clock restarted).
 * Either way a block holds only for launches on a device with a compute limit (0 < sm_limit <
 * 100), as in HAMi-core (limiter.c: monitor_blocked).
 * File offsets: 2,008,824 (magic) and 2,008,832 (until_ms); src/hami/monitor/region.py. */
#define LIM_LEASE_OFFSET 1888 /* within procs[VGPU_LOCK_SLOT] */
#define LIM_LEASE_MAGIC 0x4c655031u /* "1PeL" */
#define LIM_LEASE_MAX_MS 60000ULL
typedef struct {
    uint32_t magic;
    uint32_t reserved;
    uint64_t until_ms;
} lim_lease;

/* hostpid.c: this process's PID in the initial (host) PID namespace, or 0 if it cannot be
 * known from inside (then a node agent must write it into the slot). */
int lim_host_pid(void);
/* The host PID as NVML reports it for device `reg_dev` (region index of the current
 * context): lim_host_pid() if NVML lists it, else the memory-signature probe; 0 if unknown. */
int lim_resolve_host_pid(int reg_dev);
/* The same, from a context-creation hook: makes the device's primary context current
 * for the probe and restores the caller's current context. */
int lim_resolve_host_pid_on(int cuda_dev, int reg_dev);
/* NVML's figure for one host process on a region device (-1: not listed or not available) */
long long lim_process_used(int reg_dev, int host_pid);

/* priority.c */
uint64_t lim_wall_ms(void); /* CLOCK_REALTIME_COARSE: the launch stamps peers compare */
uint64_t lim_mono_ms(void); /* CLOCK_MONOTONIC_COARSE: holds, schedules, leases */
/* Refresh the peer list (every 100 ms of `mono_ms`) and return the mask of our region devices
 * on which a task of higher priority (numerically lower CUDA_TASK_PRIORITY) launched a kernel
 * in the last `quiet_ms` of `wall_ms` (a stamp more than `quiet_ms` ahead of it, written before
 * the clock was set back, is stale), restricted to the devices this process launches on (all
 * shared devices before its first launch). Called from the watcher thread only. */
unsigned lim_peer_blocks(int my_priority, uint64_t wall_ms, uint64_t mono_ms, uint64_t quiet_ms);
/* Whether a peer-region directory is configured (HAMI_PEER_REGIONS). */
int lim_peers_configured(void);

#endif
