/* Environment contract (same names and defaults as HAMi-core) and logging. */
#include "vgpu.h"

#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

vgpu_config vgpu_cfg = {.log_level = 2, .priority = 1, .context_size = -1};

void vgpu_log(int level, const char *fmt, ...)
{
    if (level > vgpu_cfg.log_level)
        return;
    static const char *names[] = {"ERROR", "ERROR", "WARN", "INFO", "DEBUG"};
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "[libvgpu %s pid=%d] ", names[level > 4 ? 4 : level], (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strlen(buf);
    if (len + 1 < sizeof buf)
        buf[len++] = '\n';
    ssize_t w = write(2, buf, len);
    (void)w;
}

/* Sizes: plain bytes ("1073741824", "0x40000000"), HAMi-core's one-letter binary suffixes
 * (k/m/g/t = 1024^n, any case), IEC suffixes (Ki/Mi/Gi/Ti, KiB/MiB/GiB/TiB = 1024^n) and SI
 * suffixes (KB/MB/GB/TB = 1000^n). A fractional number is allowed with a suffix ("1.5g").
 * Anything else is an error. */
int vgpu_parse_size(const char *s, uint64_t *out)
{
    if (!s)
        return -1;
    while (isspace((unsigned char)*s))
        s++;
    if (!*s || *s == '-' || *s == '+')
        return -1;
    char *end;
    errno = 0;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        unsigned long long v = strtoull(s, &end, 16);
        if (errno || *end || end == s + 2)
            return -1;
        *out = v;
        return 0;
    }
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || !(v < 1.8e19))
        return -1;
    static const struct { const char *suffix; double mul; } units[] = {
        {"", 1.0}, {"b", 1.0},
        {"k", 1024.0}, {"ki", 1024.0}, {"kib", 1024.0}, {"kb", 1e3},
        {"m", 1048576.0}, {"mi", 1048576.0}, {"mib", 1048576.0}, {"mb", 1e6},
        {"g", 1073741824.0}, {"gi", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
        {"t", 1099511627776.0}, {"ti", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix) == 0) {
            if (i < 2 && v != (double)(uint64_t)v)
                return -1; /* fractional bytes */
            double bytes = v * units[i].mul;
            /* a nonzero size that rounds to no byte ("1e-9g") would read as 0: no limit */
            if (!(bytes < 1.8e19) || (v > 0 && bytes < 1.0))
                return -1;
            *out = (uint64_t)bytes;
            return 0;
        }
    }
    return -1;
}

/* ---- where a setting comes from ----
 *
 * The device plugin writes the grant into a file (every variable libvgpu reads: the grant's
 * values, the rest empty) and mounts it read-only at <hook>/vgpu/GRANT_FILE: a mount point, which
 * a process in the container can neither rewrite nor replace nor remove, and which it cannot make
 * itself (no mount rights; the webhook refuses a pod's volume mounts there). libvgpu takes every
 * setting it names from it, so the container's environment (an envFrom the admission rules cannot
 * read, an image's ENV, a parent that changed it) changes no limit. Without that mount (HAMi's
 * device plugin, `hami exec`, a process outside a container) the environment is read as before. */
#define GRANT_FILE "hami-grant.env"
#define GRANT_MAX 512

static char *g_grant_names[GRANT_MAX], *g_grant_values[GRANT_MAX];
static int g_grant_count;

/* Whether the mount point (the fifth field) of one /proc/self/mountinfo line is named `name`;
 * copied (octal escapes kept) into out. */
static int mount_line(const char *line, const char *name, char *out, size_t len)
{
    for (int field = 0; field < 4; field++) {
        line = strchr(line, ' ');
        if (!line)
            return 0;
        line++;
    }
    const char *end = strchr(line, ' ');
    size_t n = end ? (size_t)(end - line) : strlen(line);
    size_t want = strlen(name);
    if (n < want + 1 || line[n - want - 1] != '/' || memcmp(line + n - want, name, want) != 0)
        return 0;
    if (out && len) {
        size_t k = n < len - 1 ? n : len - 1;
        memcpy(out, line, k);
        out[k] = 0;
    }
    return 1;
}

static struct vgpu_mounts g_mounts;

static void mount_lines(const char *line)
{
    g_mounts.grant += mount_line(line, GRANT_FILE, g_mounts.grant ? NULL : g_mounts.grant_path, sizeof g_mounts.grant_path);
    g_mounts.pending += mount_line(line, PENDING_MARKER, NULL, 0);
}

static void mounts_scan(void)
{
    int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[16384];
    size_t have = 0;
    int skipping = 0; /* skipping: the rest of a line longer than the buffer */
    for (;;) {
        ssize_t n = read(fd, buf + have, sizeof buf - 1 - have);
        if (n <= 0) {
            buf[have] = 0;
            if (have && !skipping)
                mount_lines(buf);
            break;
        }
        have += (size_t)n;
        buf[have] = 0;
        char *start = buf, *nl;
        while ((nl = memchr(start, '\n', (size_t)(buf + have - start)))) {
            *nl = 0;
            if (!skipping)
                mount_lines(start);
            skipping = 0;
            start = nl + 1;
        }
        have -= (size_t)(start - buf);
        memmove(buf, start, have);
        if (have == sizeof buf - 1) {
            have = 0; /* a line longer than the buffer: no mount of ours, skipped to its end */
            skipping = 1;
        }
    }
    close(fd);
}

const struct vgpu_mounts *vgpu_mounts(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, mounts_scan);
    return &g_mounts;
}

static void grant_load(void)
{
    const char *path = vgpu_mounts()->grant_path;
    int mounts = vgpu_mounts()->grant;
    if (!mounts)
        return;
    /* the device plugin mounts one; another (a pod's own volume, an image's VOLUME, a termination
     * message path of that name) could be read first: refuse to choose */
    if (mounts > 1) {
        vgpu_log(0, "%d mounts are named %s (the device plugin makes one); refusing to run", mounts, GRANT_FILE);
        _exit(78);
    }
    if (strchr(path, '\\')) {
        vgpu_log(0, "the grant's mount point %s has an escaped character; refusing to run", path);
        _exit(78);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        vgpu_log(0, "cannot read the grant %s (%s); refusing to run without it", path, strerror(errno));
        _exit(78);
    }
    /* the whole file or nothing: a file that does not fit, holds a NUL byte, ends in a line
     * without its newline (cut short) or names more settings than GRANT_MAX lost what came after
     * the cut, and a name it lost would be read from the environment (HAMI_GRANT_DEVICES missing:
     * every device the process sees is its grant's). Review, 1 Dec: a pod's 66,000-byte
     * GPU_CORE_UTILIZATION_POLICY pushed the device list past the buffer. */
    static char text[65536];
    size_t have = 0;
    ssize_t n = 0;
    while (have < sizeof text - 1 && (n = read(fd, text + have, sizeof text - 1 - have)) > 0)
        have += (size_t)n;
    if (n > 0) { /* the buffer is full: is there more? */
        char more;
        n = read(fd, &more, 1);
        if (n > 0) {
            long long size = (long long)lseek(fd, 0, SEEK_END); /* not fstat: glibc 2.33's symbol */
            close(fd);
            vgpu_log(0, "the grant %s (%lld bytes) is larger than the %zu bytes libvgpu reads of it; refusing "
                     "to run without all of it", path, size, sizeof text - 1);
            _exit(78);
        }
    }
    close(fd);
    if (n < 0) {
        vgpu_log(0, "cannot read the grant %s (%s); refusing to run without it", path, strerror(errno));
        _exit(78);
    }
    text[have] = 0;
    if (memchr(text, 0, have)) {
        vgpu_log(0, "the grant %s (%zu bytes) holds a NUL byte; refusing to run without all of it", path, have);
        _exit(78);
    }
    if (have && text[have - 1] != '\n') {
        vgpu_log(0, "the grant %s (%zu bytes) does not end with a line break (cut short?); refusing to run "
                 "without all of it", path, have);
        _exit(78);
    }
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        char *eq = strchr(line, '=');
        if (!eq || eq == line || line[0] == '#')
            continue;
        if (g_grant_count == GRANT_MAX) {
            vgpu_log(0, "the grant %s (%zu bytes) names more than %d settings; refusing to run without all of them",
                     path, have, GRANT_MAX);
            _exit(78);
        }
        *eq = 0;
        g_grant_names[g_grant_count] = line;
        g_grant_values[g_grant_count] = eq + 1;
        g_grant_count++;
    }
    if (!g_grant_count) {
        vgpu_log(0, "the grant %s names no setting; refusing to run without it", path);
        _exit(78);
    }
}

const char *vgpu_getenv(const char *name)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, grant_load);
    for (int i = 0; i < g_grant_count; i++)
        if (!strcmp(g_grant_names[i], name))
            return g_grant_values[i];
    return getenv(name);
}

/* Whether two device UUIDs name one device: a MIG device is "MIG-<bytes>" to NVML and in the
 * grant, "GPU-<the same bytes>" to CUDA (cuDeviceGetUuid_v2, which libvgpu writes as a GPU's), so
 * the kind prefix is not compared when both have one (as region.c's same_device); any letter case. */
static int uuid_kind(const char *s, size_t len)
{
    return len > 4 && (!strncasecmp(s, "GPU-", 4) || !strncasecmp(s, "MIG-", 4));
}

static int same_uuid(const char *a, size_t alen, const char *b, size_t blen)
{
    if (uuid_kind(a, alen) && uuid_kind(b, blen)) {
        a += 4, alen -= 4;
        b += 4, blen -= 4;
    }
    return alen == blen && strncasecmp(a, b, alen) == 0;
}

int vgpu_grant_names(const char *uuid)
{
    const char *list = vgpu_getenv("HAMI_GRANT_DEVICES");
    if (!list || !*list)
        return -1;
    size_t n = strlen(uuid);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (same_uuid(p, len, uuid, n))
            return 1;
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}

/* Whether `uuid` is a GPU with a MIG device the grant names, as NVML shows it. In a MIG container
 * NVML lists the instance's GPU (nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex: its GPU UUID),
 * and the instance under it (nvmlDeviceGetMigDeviceHandleByIndex: its MIG UUID); a GPU none of
 * whose MIG devices is granted (another GPU of the node, shown by a pod's own
 * NVIDIA_VISIBLE_DEVICES=all) is not. Review, 1 Dec: a MIG grant named no device, and libvgpu
 * then took every device the process saw as granted. */
static int parent_of_granted(const char *uuid)
{
    __typeof__(&nvmlDeviceGetHandleByUUID) by_uuid = vgpu_nvml_sym("nvmlDeviceGetHandleByUUID");
    __typeof__(&nvmlDeviceGetMaxMigDeviceCount) max_mig = vgpu_nvml_sym("nvmlDeviceGetMaxMigDeviceCount");
    __typeof__(&nvmlDeviceGetMigDeviceHandleByIndex) mig_at = vgpu_nvml_sym("nvmlDeviceGetMigDeviceHandleByIndex");
    __typeof__(&nvmlDeviceGetUUID) get_uuid = vgpu_nvml_sym("nvmlDeviceGetUUID");
    nvmlDevice_t gpu;
    unsigned count = 0;
    if (!by_uuid || !max_mig || !mig_at || !get_uuid || by_uuid(uuid, &gpu) != NVML_SUCCESS ||
        max_mig(gpu, &count) != NVML_SUCCESS)
        return 0;
    for (unsigned i = 0; i < count && i < 64; i++) {
        nvmlDevice_t mig;
        char name[VGPU_UUID_LEN];
        if (mig_at(gpu, i, &mig) == NVML_SUCCESS && get_uuid(mig, name, sizeof name) == NVML_SUCCESS &&
            vgpu_grant_names(name) == 1)
            return 1;
    }
    return 0;
}

int vgpu_device_granted(const char *uuid)
{
    int named = vgpu_grant_names(uuid);
    if (named < 0)
        return 1; /* no list: every device the process sees is its grant's (HAMi-core's contract) */
    if (named)
        return 1;
    /* NVML's registration (nvml_hooks.c, with vgpu_nvml_internal raised) meets a MIG device's GPU
     * first; CUDA shows a MIG device itself (never a GPU in MIG mode whole): only an exact name there */
    return vgpu_nvml_internal > 0 && parent_of_granted(uuid);
}

static void bad(const char *name, const char *value, const char *expect)
{
    vgpu_log(0, "invalid %s='%s' (expected %s); refusing to run with a setting it cannot honour",
             name, value, expect);
    _exit(78);
}

static uint64_t env_size(const char *name, uint64_t dflt)
{
    const char *v = vgpu_getenv(name);
    uint64_t out;
    if (!v || !*v)
        return dflt;
    if (vgpu_parse_size(v, &out))
        bad(name, v, "bytes or a size such as 4096m, 4g, 4Gi, 4GB");
    return out;
}

/* An integer setting in [lo, hi]; anything else stops the process (exit 78) naming the setting.
 * `unit` (e.g. "milliseconds") only shapes the message; NULL for a plain number. */
HIDDEN long vgpu_env_int(const char *name, long dflt, long lo, long hi, const char *unit)
{
    const char *v = vgpu_getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || *end || n < lo || n > hi) {
        char expect[96];
        snprintf(expect, sizeof expect, "an integer%s%s in [%ld, %ld]", unit ? " number of " : "",
                 unit ? unit : "", lo, hi);
        bad(name, v, expect);
    }
    return n;
}

static int env_bool(const char *name)
{
    const char *v = vgpu_getenv(name);
    return v && (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes"));
}

/* Whether a region path's file name is koordlet's, `<pod UID>_<container>.cache`: a UID as the
 * API server writes it (8-4-4-4-12 hex digits), then a container name (a DNS label). */
static int koordlet_region_name(const char *path)
{
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    for (int i = 0; i < 36; i++) {
        int dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? name[i] != '-' : !isxdigit((unsigned char)name[i]))
            return 0;
    }
    if (name[36] != '_')
        return 0;
    const char *ctr = name + 37, *end = strrchr(ctr, '.');
    if (!end || end == ctr || end - ctr > 63 || strcmp(end, ".cache"))
        return 0;
    for (const char *p = ctr; p < end; p++)
        if (!islower((unsigned char)*p) && !isdigit((unsigned char)*p) && *p != '-')
            return 0;
    return 1;
}

/* Whether the settings are the ones Koordinator's koordlet injects for a HAMi-core pod (its
 * GPUEnvInject hook): no grant file, CUDA_DEVICE_MEMORY_LIMIT unindexed only (the first GPU's
 * grant in bytes, for every GPU), and no region path, or the one its HamiCoreVGPUMonitor gate
 * names. Every device plugin (ours, HAMi's, Volcano's) and our DRA agent write indexed limits;
 * `hami exec` names its region `hami-exec-*.cache` or as its user says. */
static int koordlet_settings(void)
{
    if (vgpu_mounts()->grant)
        return 0;
    const char *all = vgpu_getenv("CUDA_DEVICE_MEMORY_LIMIT");
    if (!all || !*all)
        return 0;
    for (int i = 0; i < VGPU_MAX_DEV; i++) {
        char name[64];
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
        const char *v = vgpu_getenv(name);
        if (v && *v)
            return 0;
    }
    const char *region = vgpu_getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    return !region || !*region || koordlet_region_name(region);
}

void vgpu_config_load(void)
{
    vgpu_config *c = &vgpu_cfg;
    c->log_level = (int)vgpu_env_int("LIBCUDA_LOG_LEVEL", 2, 0, 5, NULL);
    uint64_t all = env_size("CUDA_DEVICE_MEMORY_LIMIT", 0);
    long sm_all = vgpu_env_int("CUDA_DEVICE_SM_LIMIT", 0, 0, 100000, NULL);
    /* From the environment (no grant file), a numbered limit of 0 (or empty) is the unnumbered
     * one (as HAMi-core reads it) and a numbered limit can only lower a set unnumbered one:
     * under Koordinator koordlet sets the unnumbered variables only and the pod the rest of its
     * env, so a CUDA_DEVICE_MEMORY_LIMIT_0=0 or =80g lifted its 20 GiB (review, 1 Dec). HAMi's
     * device plugin sets the numbered ones only: read as they are. The grant file is the device
     * plugin's whole grant: read as it is. */
    int from_env = !vgpu_mounts()->grant;
    for (int i = 0; i < VGPU_MAX_DEV; i++) {
        char name[64];
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
        if (from_env) {
            uint64_t one = env_size(name, 0);
            c->limit[i] = !one ? all : all && all < one ? all : one;
        } else {
            c->limit[i] = env_size(name, all);
        }
        snprintf(name, sizeof name, "CUDA_DEVICE_SM_LIMIT_%d", i);
        long sm;
        if (from_env) {
            long one = vgpu_env_int(name, 0, 0, 100000, NULL);
            sm = !one ? sm_all : sm_all > 0 && sm_all < one ? sm_all : one;
        } else {
            sm = vgpu_env_int(name, sm_all, 0, 100000, NULL);
        }
        c->sm_limit[i] = sm <= 0 ? 100 : (uint64_t)sm;
    }
    const char *path = vgpu_getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    snprintf(c->cache_path, sizeof c->cache_path, "%s", path && *path ? path : "/tmp/cudevshr.cache");
    c->oversubscribe = env_bool("CUDA_OVERSUBSCRIBE");
    c->priority = (int)vgpu_env_int("CUDA_TASK_PRIORITY", 1, -1000, 1000, NULL);
    const char *pol = vgpu_getenv("GPU_CORE_UTILIZATION_POLICY");
    c->core_policy = !pol ? 0 : !strcasecmp(pol, "force") ? 1 : !strcasecmp(pol, "disable") ? 2 : 0;
    /* HAMi-core, which koordlet's settings are written for, holds such a pod to `gpu-core` even
     * alone on its GPU (its region's utilization switch starts on; koordlet runs nothing that
     * clears it): so do we, unless the pod names a policy (`default`: the work-conserving one). */
    if ((!pol || !*pol) && koordlet_settings()) {
        c->core_policy = 1;
        c->core_policy_implied = 1;
    }
    const char *cs = vgpu_getenv("LIBVGPU_CONTEXT_SIZE");
    uint64_t csv;
    if (cs && *cs) {
        if (vgpu_parse_size(cs, &csv))
            bad("LIBVGPU_CONTEXT_SIZE", cs, "bytes or a size such as 300m");
        c->context_size = (long long)csv;
    }
    c->test_stall_ms = (unsigned)vgpu_env_int("LIBVGPU_TEST_STALL_IN_LOCK_MS", 0, 0, 600000, NULL);
}
