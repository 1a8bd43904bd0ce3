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
uint64_t lim_wall_ms(void);
/* Refresh the peer list (every 100 ms) and return the mask of our region devices on which
 * a task of higher priority (numerically lower CUDA_TASK_PRIORITY) launched a kernel in the
 * last `quiet_ms`, restricted to the devices this process launches on (all shared devices
 * before its first launch). Called from the watcher thread only. */
unsigned lim_peer_blocks(int my_priority, uint64_t now_ms, uint64_t quiet_ms);
/* Whether a peer-region directory is configured (HAMI_PEER_REGIONS). */
int lim_peers_configured(void);

#endif
