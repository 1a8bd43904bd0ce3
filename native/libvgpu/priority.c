/* Task priority without a node agent: peer regions.
 *
 * HAMI_PEER_REGIONS names a directory holding other tasks' shared regions (`*.cache`
 * directly in it or one level down, the layout of HAMi's containers directory, which is
 * also what `hami exec` uses). The watcher thread maps them read-only and looks, for
 * every peer with a numerically lower `priority`, on which devices (by UUID) one of its
 * processes launched a kernel recently (slot field used[d].unused[LIM_DEV_LAST_LAUNCH_MS],
 * written by the launch gate). Only those of our devices pause. Nothing is written into
 * peers' regions, so a crashed task can never leave another one blocked.
 *
 * With a host monitor the same decision arrives through our own region instead
 * (recent_kernel = -1), which the launch gate also honours on the devices that have a compute
 * limit (as HAMi-core does): while the monitor's lease runs, or with no expiry when the monitor
 * grants none (HAMi's; limiter.h, limiter.c). Peers pause this task on any shared device,
 * limited or not: both sides of a peer group chose priority (HAMI_PEER_REGIONS). */
#include "vgpu.h"
#include "limiter.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_PEERS 64

typedef struct {
    dev_t dev;
    ino_t ino;
    const vgpu_region *r;
    int seen; /* generation of the last scan that found it */
} peer;

static peer g_peers[MAX_PEERS];
static int g_npeers;
static int g_gen;
static uint64_t g_next_scan_ms;

uint64_t lim_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000ULL + (uint64_t)ts.tv_nsec / 1000000ULL;
}

uint64_t lim_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000ULL + (uint64_t)ts.tv_nsec / 1000000ULL;
}

int lim_peers_configured(void)
{
    const char *d = vgpu_getenv("HAMI_PEER_REGIONS");
    return d && *d;
}

static int is_self(const struct stat *st)
{
    struct stat me;
    return vgpu_stat(vgpu_cfg.cache_path, &me) == 0 && me.st_dev == st->st_dev && me.st_ino == st->st_ino;
}

static int live_slots(const vgpu_region *r)
{
    int n = __atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE), live = 0;
    for (int i = 0; i < n && i < VGPU_PROC_SLOTS; i++)
        live += __atomic_load_n(&r->procs[i].pid, __ATOMIC_ACQUIRE) != 0 &&
                __atomic_load_n(&r->procs[i].status, __ATOMIC_ACQUIRE) != 0; /* not exiting */
    return live;
}

static void consider(const char *path)
{
    struct stat st;
    if (vgpu_stat(path, &st) || !S_ISREG(st.st_mode) || st.st_size != VGPU_REGION_SIZE + 1 || is_self(&st))
        return;
    for (int i = 0; i < g_npeers; i++)
        if (g_peers[i].dev == st.st_dev && g_peers[i].ino == st.st_ino) {
            g_peers[i].seen = g_gen;
            return;
        }
    if (g_npeers == MAX_PEERS)
        return;
    /* the file is the one stat() described, a regular file reached without a symbolic link (the
     * directories are the containers': a link could name any file this process can read) */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat now;
    if (vgpu_fstat(fd, &now) || !S_ISREG(now.st_mode) || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
        close(fd);
        return;
    }
    void *p = mmap(NULL, sizeof(vgpu_region), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return;
    const vgpu_region *r = p;
    if (__atomic_load_n(&r->initialized_flag, __ATOMIC_ACQUIRE) != VGPU_MAGIC || !live_slots(r)) {
        munmap(p, sizeof(vgpu_region)); /* not started yet, or every process has exited */
        return;
    }
    g_peers[g_npeers++] = (peer){st.st_dev, st.st_ino, r, g_gen};
    LOG_INFO("priority: watching peer region %s", path);
}

static int ends_with_cache(const char *name)
{
    size_t n = strlen(name);
    return n > 6 && !strcmp(name + n - 6, ".cache");
}

static void scan_dir(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (ends_with_cache(e->d_name))
            consider(path);
        else if (depth > 0 && (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN))
            scan_dir(path, depth - 1);
    }
    closedir(d);
}

static void rescan(void)
{
    g_gen++;
    scan_dir(vgpu_getenv("HAMI_PEER_REGIONS"), 1);
    for (int i = 0; i < g_npeers;) { /* drop regions whose files are gone */
        if (g_peers[i].seen != g_gen) {
            munmap((void *)g_peers[i].r, sizeof(vgpu_region));
            g_peers[i] = g_peers[--g_npeers];
        } else {
            i++;
        }
    }
}

/* Our region index of `uuid`, -1 if we do not have that device. */
static int my_index(const char *uuid)
{
    int mine = (int)__atomic_load_n(&vgpu_reg->device_num, __ATOMIC_ACQUIRE);
    for (int i = 0; i < mine && i < VGPU_MAX_DEV; i++)
        if (uuid[0] && !strncmp(vgpu_reg->uuids[i], uuid, VGPU_UUID_LEN))
            return i;
    return -1;
}

/* Whether a live process of `r` launched on its device `j` within quiet_ms. The stamps are
 * wall-clock (every peer reads them against its own clock): one more than quiet_ms ahead of ours
 * was written before the clock was set back and says nothing about now. Taken as recent, it paused
 * this task until the clock caught up with it, for as long as the step (review, 1 Dec). */
static int active_on(const vgpu_region *r, int j, uint64_t now_ms, uint64_t quiet_ms)
{
    int n = __atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n && i < VGPU_PROC_SLOTS; i++) {
        const vgpu_slot *s = &r->procs[i];
        if (!__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) || !__atomic_load_n(&s->status, __ATOMIC_ACQUIRE))
            continue; /* free, or its process exiting */
        uint64_t t = __atomic_load_n(&s->used[j].unused[LIM_DEV_LAST_LAUNCH_MS], __ATOMIC_ACQUIRE);
        if (t && t + quiet_ms >= now_ms && t <= now_ms + quiet_ms)
            return 1;
    }
    return 0;
}

/* Devices this process has launched on (mask of region indices); 0 before the first launch. */
static unsigned my_devices(void)
{
    unsigned mask = 0;
    vgpu_slot *mine = vgpu_slot_mine();
    for (int d = 0; mine && d < VGPU_MAX_DEV; d++)
        if (__atomic_load_n(&mine->used[d].unused[LIM_DEV_LAST_LAUNCH_MS], __ATOMIC_RELAXED))
            mask |= 1u << d;
    return mask;
}

unsigned lim_peer_blocks(int my_priority, uint64_t wall_ms, uint64_t mono_ms, uint64_t quiet_ms)
{
    if (!lim_peers_configured())
        return 0;
    if (mono_ms >= g_next_scan_ms) {
        rescan();
        g_next_scan_ms = mono_ms + 100;
    }
    unsigned mask = 0;
    for (int p = 0; p < g_npeers; p++) {
        const vgpu_region *r = g_peers[p].r;
        if (__atomic_load_n(&r->initialized_flag, __ATOMIC_ACQUIRE) != VGPU_MAGIC || r->priority >= my_priority)
            continue;
        int theirs = (int)__atomic_load_n(&r->device_num, __ATOMIC_ACQUIRE);
        for (int j = 0; j < theirs && j < VGPU_MAX_DEV; j++) {
            int i = my_index(r->uuids[j]);
            if (i >= 0 && active_on(r, j, wall_ms, quiet_ms))
                mask |= 1u << i;
        }
    }
    unsigned used = my_devices();
    return used ? mask & used : mask;
}
