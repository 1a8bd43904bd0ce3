/* The shared region: create/attach, process slots, the cross-process lock, accounting.
 *
 * Lock: a robust, process-shared pthread mutex kept in the layout's last process slot
 * (vgpu_lock_slot in region.h; HAMi's monitor never reads that slot). Uncontended, taking and
 * releasing it is a few atomic instructions in user space and no system call; a waiter sleeps
 * in the kernel (futex). It excludes threads and processes alike. When its holder dies, even
 * by SIGKILL and even between "acquired" and "recorded", the kernel marks it owner-dead (the
 * robust-futex list glibc registers for every thread) and wakes a waiter, which gets
 * EOWNERDEAD, makes it consistent and reclaims the dead process's slot: no waiter can be
 * stuck behind a dead process and no PID liveness guess decides who holds it. It works for
 * any UID that can open the file (mode 0666). The lock is held across check-and-add, so
 * concurrent allocations never overshoot the limit together.
 *
 * Creating or attaching the file is serialised by an open-file-description (OFD) record lock
 * on the byte just past the struct (the file's padding byte): the mutex cannot guard its own
 * initialisation. That lock is taken once per process, at attach.
 *
 * Reboots: the file outlives the node's processes (a host directory). The lock slot records the
 * kernel's boot id at every attach; a process that finds another boot's id is attaching after a
 * reboot (or a power cut), so every process the file knows of is gone: the mutex may be locked by
 * a thread that no robust-futex notice will ever release (the container hung in cuInit), and the
 * slots' PIDs may now belong to unrelated live processes (their memory would be counted against
 * the limit). Both are reset then; the limits and the rest of the header are kept. */
#include "vgpu.h"
#include "limiter.h" /* check_boot: the monitor's lease */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

vgpu_region *vgpu_reg;
vgpu_slot *vgpu_my_slot;
static pthread_mutex_t *g_lock;
static int g_pid; /* getpid() is a system call in glibc >= 2.25: cached, refreshed after fork */
/* The region file, kept open (O_CLOEXEC) for the slot locks below, and this process's PID
 * namespace (the inode of /proc/self/ns/pid; 0 when unknown). */
static int g_region_fd = -1;
static uint32_t g_pidns;
static uint64_t g_last_kernel_sec;

static int reap_locked(void);

static int ofd_lock(int fd, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = VGPU_REGION_SIZE, .l_len = 1};
    int r;
    do
        r = fcntl(fd, type == F_UNLCK ? F_OFD_SETLK : F_OFD_SETLKW, &fl);
    while (r < 0 && errno == EINTR);
    return r;
}

static vgpu_lock_slot *lock_slot(vgpu_region *r)
{
    return (vgpu_lock_slot *)(void *)&r->procs[VGPU_LOCK_SLOT];
}

/* Called with the file lock held (or on a private region): make the robust mutex. */
static void lock_init(vgpu_region *r)
{
    vgpu_lock_slot *ls = lock_slot(r);
    memset(ls, 0, sizeof *ls);
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    int e = pthread_mutex_init(&ls->mu, &a);
    pthread_mutexattr_destroy(&a);
    if (e)
        LOG_ERROR("cannot initialise the region lock: %s", strerror(e));
    ls->version = 1;
    __atomic_store_n(&ls->magic, VGPU_LOCK_MAGIC, __ATOMIC_RELEASE);
}

static void __attribute__((noinline)) lock_failed(int e)
{
    if (e == EOWNERDEAD) {
        /* The holder died inside its critical section. What it protected is either its own
         * slot (reclaimed now: its process is gone) or proc_num/device_num, which are valid at
         * every step of their updates. */
        LOG_WARN("the previous holder of the region lock died holding it; recovering");
        pthread_mutex_consistent(g_lock);
        reap_locked();
    } else {
        LOG_ERROR("region lock failed: %s", strerror(e));
    }
}

/* How deep this thread is in the region lock (vgpu.h: reentrant within a thread). */
static __thread int g_lock_depth __attribute__((tls_model("initial-exec")));

void vgpu_region_lock(void)
{
    if (g_lock_depth++)
        return;
    int e = pthread_mutex_lock(g_lock);
    if (UNLIKELY(e))
        lock_failed(e);
    __atomic_store_n(&vgpu_reg->owner_pid, (uint64_t)g_pid, __ATOMIC_RELAXED);
}

void vgpu_region_unlock(void)
{
    if (--g_lock_depth)
        return;
    __atomic_store_n(&vgpu_reg->owner_pid, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(g_lock);
}

static int pid_alive(int pid)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1; /* EPERM etc.: assume alive */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return 1;
    if (p[2] == 'Z' || p[2] == 'X')
        return 0;
    /* A process in exit (PF_EXITING in the flags field, set when exit starts and before the
     * kernel releases its robust locks) counts as dead: a waiter woken by the death of the lock's
     * holder must be able to reclaim the holder's slot before it has become a zombie. */
    unsigned flags = 0;
    if (sscanf(p + 3, " %*d %*d %*d %*d %*d %u", &flags) == 1 && (flags & 0x4u /* PF_EXITING */))
        return 0;
    return 1;
}

/* A region can be shared by processes of several PID namespaces (a DRA claim's containers, or
 * pods sharing a claim): a PID means nothing outside its namespace (kill(pid, 0) there answers
 * for another process, or none). So each process holds an OFD lock on a byte of the file past
 * the region, one per slot (VGPU_REGION_SIZE + 1 + index; the kernel drops it when the process,
 * or the last process sharing its open file, is gone), and marks its slot with its namespace
 * (the slot's padding, which HAMi's monitor does not read; 0: no lock taken, judged by PID as
 * before). A slot of another namespace is dead when nothing holds its byte. */
static uint32_t pid_namespace(void)
{
    char link[64];
    ssize_t n = readlink("/proc/self/ns/pid", link, sizeof link - 1); /* "pid:[4026531836]" */
    unsigned long ino = 0;
    if (n > 0) {
        link[n] = 0;
        if (sscanf(link, "pid:[%lu]", &ino) != 1)
            ino = 0;
    }
    return (uint32_t)ino;
}

static int slot_lock(const vgpu_slot *s, int cmd, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)VGPU_REGION_SIZE + 1 + (s - vgpu_reg->procs), .l_len = 1};
    if (g_region_fd < 0 || fcntl(g_region_fd, cmd, &fl) != 0)
        return -1;
    return fl.l_type;
}

/* Slot `s`'s byte: 1 held by another open file (its process lives), 0 free, -1 unknown (no region
 * file, or a file system without OFD locks). Our own open file's lock is not reported. */
static int slot_byte(const vgpu_slot *s)
{
    int t = slot_lock(s, F_OFD_GETLK, F_WRLCK);
    return t < 0 ? -1 : t != F_UNLCK;
}

/* Whether the process that took (marked) slot `s` still holds its byte; cannot tell: alive. */
static int slot_held(const vgpu_slot *s)
{
    return slot_byte(s) != 0;
}

/* Takes slot `s`'s byte for this process: 1 taken, 0 held by another process (the slot is not
 * ours to take: its process lives, whatever its PID or the slot's state say), -1 no lock can be
 * taken here (no region file or namespace known, or the file system refuses OFD locks). */
static int slot_take(const vgpu_slot *s)
{
    if (!g_pidns || g_region_fd < 0)
        return -1;
    if (slot_lock(s, F_OFD_SETLK, F_WRLCK) >= 0)
        return 1;
    return errno == EAGAIN || errno == EACCES ? 0 : -1;
}

static void slot_clear(vgpu_slot *s)
{
    __atomic_store_n(&s->status, 0, __ATOMIC_RELAXED);
    for (int d = 0; d < VGPU_MAX_DEV; d++) {
        memset(&s->used[d], 0, sizeof s->used[d]);
        s->monitorused[d] = 0;
        memset(&s->device_util[d], 0, sizeof s->device_util[d]);
    }
    s->hostpid = 0;
    /* the namespace mark too: a writer that keeps no mark (HAMi-core, or an older libvgpu during
     * an upgrade) reusing this slot would otherwise be judged by a lock byte it never takes */
    __atomic_store_n(&s->pad0, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
}

/* Whether the process that took slot `s` is gone. A slot whose owner took its byte lock is
 * judged by that lock: in the owner's own namespace too, where its PID alone can mislead -- a
 * process that exec()'d keeps its PID but not its driver memory (the region's file, close-on-exec,
 * drops the lock), and a dead process's PID handed to another process (or thread) would keep its
 * memory counted for as long as that one lives. The PID is asked first there: a process in exit
 * is dead before the kernel drops its locks (pid_alive). */
static int slot_dead(const vgpu_slot *s, int pid, uint32_t ns)
{
    if (ns && ns != g_pidns)
        return !slot_held(s);
    if (!ns) /* unmarked: by its PID, unless its byte is held (a live process of whatever namespace) */
        return slot_byte(s) != 1 && !pid_alive(pid);
    /* ours, marked: by its byte alone, which the process holds until its last thread is gone and
     * its files (the driver's included) are closed; its PID reads dead (zombie leader, PF_EXITING)
     * while other threads still hold its GPU memory (regression review, 1 Dec). The PID only when
     * the byte cannot be read. */
    int byte = slot_byte(s);
    return byte == 0 || (byte < 0 && !pid_alive(pid));
}

/* Under the lock: free the slots of dead processes (their driver memory died with them).
 * Live slots never move, so no process's cached slot pointer goes stale. */
/* Slots the last reap_locked() left because their process is on its way out: its PID reads
 * dead (SIGKILLed, or its last thread exiting) while its byte is still held, i.e. its files, the
 * driver's with them, are not closed yet. Its memory is given back within moments: an allocation
 * refused meanwhile waits for it (vgpu_reserve) rather than failing. */
static int g_exiting;
/* When this process first saw each slot's process exiting (its PID): one whose main thread
 * exited while other threads run on reads so for as long as it lives, and is waited for only
 * during its first 2 s, not on every refusal (regression review, 1 Dec). */
static struct {
    int pid;
    long long since_ms;
} g_exit_seen[VGPU_PROC_SLOTS];

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int reap_locked(void)
{
    int reaped = 0;
    int n = __atomic_load_n(&vgpu_reg->proc_num, __ATOMIC_ACQUIRE);
    n = n < 0 ? 0 : n > VGPU_PROC_SLOTS ? VGPU_PROC_SLOTS : n;
    g_exiting = 0;
    for (int i = 0; i < n; i++) {
        vgpu_slot *s = &vgpu_reg->procs[i];
        int pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
        uint32_t ns = (uint32_t)__atomic_load_n(&s->pad0, __ATOMIC_ACQUIRE);
        if (!pid || s == vgpu_my_slot)
            continue;
        if (slot_dead(s, pid, ns)) {
            LOG_INFO("reclaiming slot %d of dead process %d", i, pid);
            slot_clear(s);
            reaped++;
        } else if (ns && ns == g_pidns && !pid_alive(pid)) { /* (slot_dead: its byte is held) */
            long long now = now_ms();
            if (g_exit_seen[i].pid != pid) {
                g_exit_seen[i].pid = pid;
                g_exit_seen[i].since_ms = now;
            }
            if (now - g_exit_seen[i].since_ms < 2000)
                g_exiting++;
        }
    }
    while (n > 0 && __atomic_load_n(&vgpu_reg->procs[n - 1].pid, __ATOMIC_ACQUIRE) == 0 &&
           &vgpu_reg->procs[n - 1] != vgpu_my_slot)
        n--;
    __atomic_store_n(&vgpu_reg->proc_num, n, __ATOMIC_RELEASE);
    return reaped;
}

/* A slot is taken with its byte: one whose byte another process holds is skipped, whatever it
 * looks like -- a free slot whose process is still exiting (its memory not yet given back by the
 * driver), or a slot of our PID that is another namespace's process. Taken without its byte
 * (mark 0), a slot was judged by its PID alone everywhere: in another namespace, a process with
 * the same PID (PID 1 of every container) took it over as "its stale slot" and wiped its charge. */
static vgpu_slot *register_locked(void)
{
    int pid = g_pid, n = __atomic_load_n(&vgpu_reg->proc_num, __ATOMIC_ACQUIRE);
    n = n < 0 ? 0 : n > VGPU_PROC_SLOTS ? VGPU_PROC_SLOTS : n; /* never the lock's slot */
    vgpu_slot *slot = NULL;
    int locked = -1;
    for (int i = 0; i < n && !slot; i++) {
        vgpu_slot *s = &vgpu_reg->procs[i];
        uint32_t ns = (uint32_t)__atomic_load_n(&s->pad0, __ATOMIC_ACQUIRE);
        /* a stale slot of a previous process with our PID (in our namespace, or unmarked) */
        if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) == pid && (!ns || ns == g_pidns) &&
            (locked = slot_take(s)) != 0)
            slot = s;
    }
    for (int i = 0; i < VGPU_PROC_SLOTS && !slot; i++) {
        vgpu_slot *s = &vgpu_reg->procs[i];
        if (i < n && __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) != 0)
            continue;
        if ((locked = slot_take(s)) == 0) {
            LOG_INFO("slot %d is free but its process still holds it (exiting); skipped", i);
            continue;
        }
        slot = s;
        if (i >= n)
            __atomic_store_n(&vgpu_reg->proc_num, i + 1, __ATOMIC_RELEASE);
    }
    if (!slot)
        return NULL;
    slot_clear(slot);
    __atomic_store_n(&slot->pad0, locked > 0 ? (int32_t)g_pidns : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->status, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->pid, pid, __ATOMIC_RELEASE);
    return slot;
}

static void init_header(vgpu_region *r)
{
    memset(r, 0, sizeof *r);
    r->major_version = VGPU_MAJOR;
    r->minor_version = VGPU_MINOR;
    for (int i = 0; i < VGPU_MAX_DEV; i++) {
        r->limit[i] = vgpu_cfg.limit[i];
        r->sm_limit[i] = vgpu_cfg.sm_limit[i];
    }
    /* The grant numbers its limits by its device list's order (HAMI_GRANT_DEVICES): the devices
     * take those indices from the start, whatever CUDA ordinal the first process sees them at
     * (a first process with CUDA_VISIBLE_DEVICES=1 would otherwise give GPU 1 the limit of 0).
     * A MIG grant lists its MIG device UUIDs ("MIG-<bytes>"), which CUDA's "GPU-<bytes>" and
     * NVML's MIG handles match (same_device): CUDA's ordinals follow the GPUs' order, not the
     * grant's, and NVML meets the instances' GPUs first (review, 1 Dec: with no list, a grant of
     * [GPU 1's 1g, GPU 0's 3g] gave the 3g instance the 1g's limit). */
    const char *list = vgpu_getenv("HAMI_GRANT_DEVICES");
    int n = 0;
    for (const char *p = list; p && *p && n < VGPU_MAX_DEV;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0 && len < VGPU_UUID_LEN) {
            memcpy(r->uuids[n], p, len);
            r->uuids[n][len] = 0;
            n++;
        }
        if (!end)
            break;
        p = end + 1;
    }
    r->device_num = (uint64_t)n;
    sem_init((sem_t *)(void *)r->sem, 1, 1);
    sem_init((sem_t *)(void *)r->sem_postinit, 1, 1);
    r->utilization_switch = 1;
    r->recent_kernel = 2;
    r->priority = vgpu_cfg.priority;
    lock_init(r);
    __atomic_store_n(&r->initialized_flag, VGPU_MAGIC, __ATOMIC_RELEASE);
}

static void check_header(vgpu_region *r)
{
    if (r->major_version != VGPU_MAJOR)
        LOG_WARN("shared region %s has version %u.%u, expected %d.%d", vgpu_cfg.cache_path,
                 r->major_version, r->minor_version, VGPU_MAJOR, VGPU_MINOR);
    for (int i = 0; i < VGPU_MAX_DEV; i++)
        if (r->limit[i] != vgpu_cfg.limit[i])
            LOG_WARN("limit inconsistency on device %d: region has %llu, environment says %llu; the "
                     "region (first process) wins", i, (unsigned long long)r->limit[i],
                     (unsigned long long)vgpu_cfg.limit[i]);
}

/* At exit the slot is kept, charge, PID and byte lock included: the process holds its driver
 * memory until the kernel closes its files, after every exit handler (one registered before this
 * one -- static destructors, a caching allocator emptying itself -- may run for long, and still
 * frees or allocates through the slot). Cleared at exit, the slot let another process be granted
 * that memory meanwhile; its byte, still held, made the next process that took the slot unable to
 * lock it. The reaper frees the slot once the process is gone (its PID, or its byte dropped).
 * Only its status becomes 0 ("exited"): hami's monitor (src/hami/monitor/region.py) and the
 * compute-share and priority readers skip such a slot, and nothing more is published into it
 * (vgpu_slot_mine). */
int vgpu_exiting;

static void on_exit_release(void)
{
    vgpu_slot *s = vgpu_my_slot;
    if (s && __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) == getpid()) {
        __atomic_store_n(&vgpu_exiting, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&s->status, 0, __ATOMIC_RELEASE);
    }
}

static int map_fallback(void)
{
    void *p = mmap(NULL, sizeof(vgpu_region), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    vgpu_reg = p;
    init_header(vgpu_reg);
    return 0;
}

/* This boot's id (36 characters) into out; "" if it cannot be read. */
static void read_boot_id(char out[40])
{
    out[0] = 0;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, out, 39);
    close(fd);
    if (n < 36) {
        out[0] = 0;
        return;
    }
    out[36] = 0;
}

/* Under the attach lock, before the mutex is used: a region from another boot (see the top)
 * gets a fresh lock and empty slots, and no node monitor's block: a -1 (recent_kernel) and its
 * lease were written by the monitor of the last boot, and the lease's end is a CLOCK_MONOTONIC
 * time of that boot (the clock restarts at boot: one that now lies within LIM_LEASE_MAX_MS held
 * the block on, a lease-less -1 held it until a monitor lifted it; review, 1 Dec). This boot's
 * id is recorded. */
static void check_boot(vgpu_region *r, const char *path)
{
    char now[40];
    read_boot_id(now);
    if (!now[0])
        return;
    vgpu_lock_slot *ls = lock_slot(r);
    if (ls->boot_id[0] && strncmp(ls->boot_id, now, sizeof ls->boot_id) != 0) {
        int n = __atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE), stale = 0;
        for (int i = 0; i < n && i < VGPU_PROC_SLOTS; i++)
            if (__atomic_load_n(&r->procs[i].pid, __ATOMIC_ACQUIRE)) {
                stale++;
                slot_clear(&r->procs[i]);
            }
        __atomic_store_n(&r->proc_num, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&r->owner_pid, 0, __ATOMIC_RELAXED);
        lock_init(r);
        lim_lease *lease = (lim_lease *)(void *)((char *)lock_slot(r) + LIM_LEASE_OFFSET);
        int blocked = __atomic_load_n(&r->recent_kernel, __ATOMIC_RELAXED) < 0;
        if (blocked)
            __atomic_store_n(&r->recent_kernel, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&lease->until_ms, 0, __ATOMIC_RELEASE);
        LOG_INFO("shared region %s: written before the node's last boot; lock and %d slot(s) reset%s", path, stale,
                 blocked ? ", the monitor's block lifted" : "");
    }
    memcpy(ls->boot_id, now, sizeof ls->boot_id);
}

/* The region's directory is the container's, writable by every UID in it (mode 0777: any of them
 * may be the first to create the file), and the processes that open the file may be root. So
 * whatever is at the path is only used when it is a regular file of its own: a symbolic link (to
 * a root-owned file: truncated and overwritten below, or created 0666 where the link points) is
 * not followed (O_NOFOLLOW), a hard link (st_nlink > 1: another name of some other file) is not
 * used, nor anything that is not a regular file (a FIFO or a device: O_NONBLOCK and O_NOCTTY keep
 * the open itself harmless). All of it is checked on the descriptor, before the file is sized or
 * mapped. An existing file is opened without O_CREAT, and a missing one created with O_EXCL (then
 * made 0666 through the descriptor: no process-wide umask change): an O_CREAT open of another
 * UID's existing file fails under fs.protected_regular when the directory is sticky.
 * Returns the descriptor, or -1 with the reason logged. */
/* A new region file at `path`, already mode 0666 when it appears there: made unnamed in its
 * directory (O_TMPFILE), its mode set, then linked at `path` (linkat fails on anything already
 * there, a symbolic link included, and follows nothing). Created 0600 and then made 0666 at the
 * path, another UID opening it in between was refused and ran on a private region, and one
 * whose creator died in between never shared it (regression review, 1 Dec). A file system
 * without O_TMPFILE: created at the path with O_EXCL and mode 0666 (less the umask, then set
 * through the descriptor). Returns the descriptor, -1 with errno (EEXIST: someone else's now). */
static int create_region(const char *path, int flags)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (slash && n == 0)
        n = 1; /* the root directory */
    if (n < sizeof dir) {
        memcpy(dir, slash ? path : ".", slash ? n : 1);
        dir[slash ? n : 1] = 0;
        int fd = open(dir, (flags & ~(O_NOFOLLOW | O_NONBLOCK | O_NOCTTY)) | O_TMPFILE, 0600);
        if (fd >= 0) {
            char self[64];
            snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
            if (fchmod(fd, 0666) == 0 && linkat(AT_FDCWD, self, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0)
                return fd;
            int err = errno;
            close(fd);
            if (err != ENOENT && err != EPERM && err != EACCES) { /* no /proc: the fallback */
                errno = err;
                return -1;
            }
        } else if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
            return -1;
        }
    }
    int fd = open(path, flags | O_CREAT | O_EXCL, 0666);
    if (fd >= 0 && fchmod(fd, 0666) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

static int open_region(const char *path, int create)
{
    const int flags = O_RDWR | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC;
    int fd = open(path, flags);
    if (fd < 0 && errno == ENOENT && create) {
        fd = create_region(path, flags);
        if (fd < 0 && errno == EEXIST) /* another process created it meanwhile */
            fd = open(path, flags);
    }
    if (fd < 0) {
        if (errno == ELOOP)
            LOG_ERROR("shared region %s is a symbolic link: not followed; limits apply to this process only",
                      path);
        else
            LOG_ERROR("cannot open shared region %s: %s; limits apply to this process only", path,
                      strerror(errno));
        return -1;
    }
    struct stat st = {0};
    const char *bad = NULL;
    if (vgpu_fstat(fd, &st) != 0)
        bad = strerror(errno);
    else if (!S_ISREG(st.st_mode))
        bad = "not a regular file";
    else if (st.st_nlink != 1)
        bad = st.st_nlink ? "a file with other names (hard links)" : "removed while being opened";
    if (bad) {
        LOG_ERROR("shared region %s: %s (mode 0%o, %lu links): not used; limits apply to this process only",
                  path, bad, (unsigned)st.st_mode, (unsigned long)st.st_nlink);
        close(fd);
        return -1;
    }
    /* O_NONBLOCK only guarded the open; record locks below wait (F_OFD_SETLKW) either way */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

/* Open, size, map and (if new) initialise the region file under the file lock; NULL if it
 * cannot be used (logged). */
static vgpu_region *attach_file(const char *path)
{
    int fd = open_region(path, 1);
    if (fd < 0)
        return NULL;
    vgpu_region *r = NULL;
    ofd_lock(fd, F_WRLCK);
    struct stat st;
    vgpu_fstat(fd, &st);
    if (st.st_size != 0 && st.st_size != VGPU_REGION_SIZE + 1)
        LOG_WARN("shared region %s has size %lld, expected %d; reinitializing", path,
                 (long long)st.st_size, VGPU_REGION_SIZE + 1);
    int fresh = st.st_size != VGPU_REGION_SIZE + 1;
    void *p = MAP_FAILED;
    if (fresh && (ftruncate(fd, 0) || ftruncate(fd, VGPU_REGION_SIZE + 1)))
        LOG_ERROR("cannot size shared region %s: %s; limits apply to this process only", path, strerror(errno));
    else if ((p = mmap(NULL, sizeof(vgpu_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        LOG_ERROR("cannot map shared region %s: %s; limits apply to this process only", path, strerror(errno));
    else
        r = p;
    if (r && __atomic_load_n(&r->initialized_flag, __ATOMIC_ACQUIRE) != VGPU_MAGIC) {
        init_header(r);
    } else if (r) {
        check_header(r);
        if (__atomic_load_n(&lock_slot(r)->magic, __ATOMIC_ACQUIRE) != VGPU_LOCK_MAGIC) {
            /* a region written by a libvgpu without this lock (or by HAMi-core) */
            if (__atomic_load_n(&r->proc_num, __ATOMIC_ACQUIRE) > VGPU_PROC_SLOTS)
                LOG_WARN("shared region %s: slot %d was in use; it now holds the region lock", path,
                         VGPU_LOCK_SLOT);
            lock_init(r);
        }
    }
    if (r)
        check_boot(r, path);
    ofd_lock(fd, F_UNLCK);
    if (r)
        g_region_fd = fd; /* the mapping stays; the file stays open for the slot locks */
    else
        close(fd);
    return r;
}

int vgpu_region_open(void)
{
    const char *path = vgpu_cfg.cache_path;
    g_pid = (int)getpid();
    g_pidns = pid_namespace();
    vgpu_reg = attach_file(path);
    if (!vgpu_reg && map_fallback())
        return -1;
    g_lock = &lock_slot(vgpu_reg)->mu;
    vgpu_region_lock();
    reap_locked();
    vgpu_my_slot = register_locked();
    vgpu_region_unlock();
    if (!vgpu_my_slot)
        LOG_ERROR("no free process slot in %s (%d in use)", path, VGPU_PROC_SLOTS);
    atexit(on_exit_release);
    LOG_INFO("attached shared region %s", path);
    return 0;
}

/* A new open file description of the file `fd` has open (the mapped region), for a forked
 * child's slot lock: through /proc/self/fd (that very file, whatever the path names now), else
 * the path again under open_region's rules; either must be the same file. -1 if neither is
 * (the child's slot then carries no lock: judged by its PID, as a writer without locks). */
static int reopen_region(int fd, const char *path)
{
    struct stat want, got;
    if (vgpu_fstat(fd, &want) != 0)
        return -1;
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    int nfd = open(self, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (nfd < 0)
        nfd = open_region(path, 0);
    if (nfd >= 0 && (vgpu_fstat(nfd, &got) != 0 || got.st_dev != want.st_dev || got.st_ino != want.st_ino)) {
        LOG_WARN("shared region %s was replaced; this process's slot is judged by its PID", path);
        close(nfd);
        nfd = -1;
    }
    return nfd;
}

/* Child after fork: own slot (the parent's allocations stay the parent's). The lock lives in
 * shared memory: a parent's thread that held it at fork releases it in the parent. */
void vgpu_region_after_fork(void)
{
    g_pid = (int)getpid();
    if (!vgpu_reg)
        return;
    g_pidns = pid_namespace();
    if (g_region_fd >= 0) {
        /* the parent's open file (and its slot lock) is the parent's: this child locks its own
         * slot through an open file of its own, of the very file mapped (reopen_region) */
        int fd = reopen_region(g_region_fd, vgpu_cfg.cache_path);
        close(g_region_fd);
        g_region_fd = fd;
    }
    __atomic_store_n(&vgpu_exiting, 0, __ATOMIC_RELEASE);
    vgpu_my_slot = NULL;
    vgpu_region_lock();
    vgpu_my_slot = register_locked();
    vgpu_region_unlock();
}

uint64_t vgpu_region_used(int dev)
{
    uint64_t sum = 0;
    int n = __atomic_load_n(&vgpu_reg->proc_num, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n && i < VGPU_PROC_SLOTS; i++) {
        vgpu_slot *s = &vgpu_reg->procs[i];
        if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE))
            sum += __atomic_load_n(&s->used[dev].total, __ATOMIC_ACQUIRE);
    }
    return sum;
}

uint64_t vgpu_region_used_reaped(int dev)
{
    vgpu_region_lock();
    reap_locked();
    uint64_t used = vgpu_region_used(dev);
    vgpu_region_unlock();
    return used;
}

static void slot_add(int dev, uint64_t bytes, int type, int sign)
{
    vgpu_slot *s = vgpu_my_slot;
    if (!s)
        return;
    uint64_t *field = type == VGPU_MEM_CONTEXT ? &s->used[dev].context_size
                      : type == VGPU_MEM_MODULE ? &s->used[dev].module_size
                                                : &s->used[dev].data_size;
    uint64_t short_of[2] = {0, 0}; /* what a release found charged, when less than its size */
    __atomic_add_fetch(&s->seqlock, 1, __ATOMIC_ACQ_REL);
    if (sign > 0) {
        __atomic_add_fetch(field, bytes, __ATOMIC_RELAXED);
        __atomic_add_fetch(&s->used[dev].total, bytes, __ATOMIC_RELEASE);
    } else {
        uint64_t *fs[2] = {field, &s->used[dev].total};
        for (int k = 0; k < 2; k++) {
            /* Clamped at 0 rather than wrapping to ~16 EiB; but a release larger than what is
             * charged means the ledger lost track of something: said (below, once the slot is
             * consistent again: readers spin while the seqlock is odd), not hidden. */
            uint64_t cur = __atomic_load_n(fs[k], __ATOMIC_RELAXED), next;
            do
                next = cur > bytes ? cur - bytes : 0;
            while (!__atomic_compare_exchange_n(fs[k], &cur, next, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
            if (UNLIKELY(cur < bytes))
                short_of[k] = cur + 1; /* +1: a charge of 0 is still a shortfall */
        }
    }
    __atomic_add_fetch(&s->seqlock, 1, __ATOMIC_ACQ_REL);
    static const char *const kinds[] = {"data memory", "context memory", "module memory"};
    for (int k = 0; k < 2; k++)
        if (UNLIKELY(short_of[k]))
            LOG_ERROR("device %d: releasing %llu bytes of %s, only %llu charged; clamped to 0 (a "
                      "ledger bug: please report)", dev, (unsigned long long)bytes,
                      k ? "the total" : kinds[type == VGPU_MEM_CONTEXT ? 1 : type == VGPU_MEM_MODULE ? 2 : 0],
                      (unsigned long long)(short_of[k] - 1));
}

int vgpu_reserve(int dev, uint64_t bytes, int type)
{
    if (dev < 0 || dev >= VGPU_MAX_DEV)
        return 0;
    uint64_t limit = vgpu_reg->limit[dev];
    if (UNLIKELY(bytes > VGPU_MAX_CHARGE)) {
        /* No device has this much memory; charged, it would wrap the slot's sums (even on a
         * device without a limit, where the monitor still reads them). */
        LOG_WARN("device %d: out of memory: %llu bytes requested", dev, (unsigned long long)bytes);
        return -1;
    }
    if (limit == 0) {
        slot_add(dev, bytes, type, 1);
        return 0;
    }
    vgpu_region_lock();
    if (UNLIKELY(!vgpu_my_slot)) {
        /* every slot was taken when this process registered: one may have freed since. Without
         * one nothing could be charged, and the limit would not hold: refused. */
        reap_locked();
        vgpu_my_slot = register_locked();
        if (!vgpu_my_slot) {
            vgpu_region_unlock();
            LOG_WARN("device %d: out of memory: no free process slot in the shared region (%d in use) to "
                     "charge %llu bytes to", dev, VGPU_PROC_SLOTS, (unsigned long long)bytes);
            return -1;
        }
    }
    if (UNLIKELY(vgpu_cfg.test_stall_ms)) {
        struct timespec ts = {vgpu_cfg.test_stall_ms / 1000, (long)(vgpu_cfg.test_stall_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    /* Never `used + bytes <= limit`: with bytes near 2^64 the sum wraps and the check passes. */
    uint64_t used = vgpu_region_used(dev);
    if (!(bytes <= limit && used <= limit - bytes) && reap_locked())
        used = vgpu_region_used(dev);
    int ok = bytes <= limit && used <= limit - bytes;
    /* a process that is exiting still holds its memory until its files close (its byte): wait for
     * it, a bounded while, with the lock given up between looks, rather than refuse at once */
    for (int look = 0; !ok && bytes <= limit && g_exiting && look < 200; look++) {
        vgpu_region_unlock();
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
        vgpu_region_lock();
        reap_locked();
        used = vgpu_region_used(dev);
        ok = used <= limit - bytes;
    }
    if (ok)
        slot_add(dev, bytes, type, 1);
    vgpu_region_unlock();
    if (!ok)
        LOG_WARN("device %d: out of memory: %llu used + %llu requested > limit %llu", dev,
                 (unsigned long long)used, (unsigned long long)bytes, (unsigned long long)limit);
    return ok ? 0 : -1;
}

void vgpu_charge(int dev, uint64_t bytes, int type)
{
    if (dev < 0 || dev >= VGPU_MAX_DEV || !bytes)
        return;
    slot_add(dev, bytes, type, 1);
}

void vgpu_release(int dev, uint64_t bytes, int type)
{
    if (dev < 0 || dev >= VGPU_MAX_DEV || !bytes)
        return;
    slot_add(dev, bytes, type, -1);
}

/* One device, named by CUDA ("GPU-" + its UUID bytes) or by NVML: a MIG device's NVML name (and
 * the grant's) is "MIG-" + the same bytes, so the 4-character prefix is not compared when both
 * have one; any letter case, as the grant's list is compared (config.c). */
static int same_device(const char *a, const char *b)
{
    /* a: the region's (any bytes: never read past its VGPU_UUID_LEN) */
    if (strnlen(a, VGPU_UUID_LEN) > 4 && strnlen(b, VGPU_UUID_LEN) > 4 && a[3] == '-' && b[3] == '-')
        return !strncasecmp(a + 4, b + 4, VGPU_UUID_LEN - 4);
    return !strncasecmp(a, b, VGPU_UUID_LEN);
}

/* The region's device count, bounded: the file is the container's to write (a negative or huge
 * count must not index outside uuids[]). */
static int device_count(const vgpu_region *r)
{
    uint64_t d = __atomic_load_n(&r->device_num, __ATOMIC_ACQUIRE);
    return d > VGPU_MAX_DEV ? VGPU_MAX_DEV : (int)d;
}

void vgpu_region_uuid(int dev, char out[VGPU_UUID_LEN + 1])
{
    out[0] = 0;
    if (vgpu_reg && dev >= 0 && dev < VGPU_MAX_DEV) {
        memcpy(out, (const char *)vgpu_reg->uuids[dev], VGPU_UUID_LEN);
        out[VGPU_UUID_LEN] = 0;
    }
}

int vgpu_region_dev_for_uuid(const char *uuid, int add)
{
    int found = -1;
    /* A grant with a device list takes its indices from that list (init_header): no other device
     * gets one (a MIG device's GPU, which NVML lists and vgpu_device_granted lets through, would
     * take the next index and that index's limit). */
    if (add && vgpu_grant_names(uuid) == 0)
        add = 0;
    vgpu_region_lock();
    int n = device_count(vgpu_reg);
    for (int i = 0; i < n && i < VGPU_MAX_DEV && found < 0; i++)
        if (same_device(vgpu_reg->uuids[i], uuid))
            found = i;
    if (found < 0 && add && n < VGPU_MAX_DEV) {
        snprintf(vgpu_reg->uuids[n], VGPU_UUID_LEN, "%s", uuid);
        vgpu_reg->device_num = (uint64_t)(n + 1);
        found = n;
    }
    vgpu_region_unlock();
    return found;
}

void vgpu_note_kernel(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    uint64_t now = (uint64_t)ts.tv_sec;
    if (LIKELY(now == __atomic_load_n(&g_last_kernel_sec, __ATOMIC_RELAXED)))
        return;
    __atomic_store_n(&g_last_kernel_sec, now, __ATOMIC_RELAXED);
    __atomic_store_n(&vgpu_reg->last_kernel_time, now, __ATOMIC_RELAXED);
    if (__atomic_load_n(&vgpu_reg->recent_kernel, __ATOMIC_RELAXED) >= 0)
        __atomic_store_n(&vgpu_reg->recent_kernel, 2, __ATOMIC_RELAXED);
}
