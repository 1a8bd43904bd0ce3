/* Fake GPU: configuration parsing and the cross-process state file. */
#define _GNU_SOURCE
#include "fg.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static fg_config g_cfg;
static pthread_once_t g_cfg_once = PTHREAD_ONCE_INIT;
static fg_state *g_st;
static pthread_once_t g_st_once = PTHREAD_ONCE_INIT;

static void die(const char *what, const char *value)
{
    fprintf(stderr, "fakegpu: invalid configuration: %s = '%s'\n", what, value ? value : "");
    exit(2);
}

unsigned long long fg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

void fg_sleep_until(unsigned long long t_ns)
{
    for (;;) {
        unsigned long long now = fg_now_ns();
        if (now >= t_ns)
            return;
        unsigned long long d = t_ns - now;
        struct timespec ts = {(time_t)(d / 1000000000ULL), (long)(d % 1000000000ULL)};
        nanosleep(&ts, NULL);
    }
}

int fg_pid_alive(int pid)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) == 0 || errno == EPERM) {
        char path[64], buf[256];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f)
            return 1;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *p = strrchr(buf, ')');
        return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
    }
    return 0;
}

/* Sizes: plain bytes, or a number (may be fractional) with K/M/G/T, Ki/Mi/Gi/Ti,
 * KiB.. (binary) or KB/MB/GB/TB (decimal). */
int fg_parse_size(const char *s, unsigned long long *out)
{
    char *end;
    if (!s || !*s)
        return -1;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    static const struct { const char *suf; double mul; } tab[] = {
        {"", 1}, {"B", 1},
        {"K", 1024.0}, {"Ki", 1024.0}, {"KiB", 1024.0}, {"KB", 1e3},
        {"M", 1048576.0}, {"Mi", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},
        {"G", 1073741824.0}, {"Gi", 1073741824.0}, {"GiB", 1073741824.0}, {"GB", 1e9},
        {"T", 1099511627776.0}, {"Ti", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        if (strcasecmp(end, tab[i].suf) == 0) {
            *out = (unsigned long long)(v * tab[i].mul);
            return 0;
        }
    }
    return -1;
}

static int parse_uuid(const char *s, unsigned char out[16])
{
    if (strncmp(s, "GPU-", 4) != 0)
        return -1;
    s += 4;
    int n = 0;
    for (; *s && n < 32; s++) {
        if (*s == '-')
            continue;
        if (!isxdigit((unsigned char)*s))
            return -1;
        char c = (char)tolower((unsigned char)*s);
        int v = isdigit((unsigned char)c) ? c - '0' : c - 'a' + 10;
        if (n % 2 == 0)
            out[n / 2] = (unsigned char)(v << 4);
        else
            out[n / 2] |= (unsigned char)v;
        n++;
    }
    return (n == 32 && *s == 0) ? 0 : -1;
}

static void set_default_dev(fg_config *c, int i, int count)
{
    fg_dev_cfg *d = &c->dev[i];
    const char *name = getenv("FAKEGPU_NAME");
    snprintf(d->name, sizeof d->name, "%s", name && *name ? name : "NVIDIA H100 80GB HBM3");
    snprintf(d->uuid, sizeof d->uuid, "GPU-f00dfeed-0000-4000-8000-%012d", i);
    d->memory = 80ULL << 30;
    d->sms = 132;
    d->domain = 0;
    d->bus = 0x18 + 0x10 * (unsigned)i;
    d->device = 0;
    d->numa = (count > 1 && i >= (count + 1) / 2) ? 1 : 0;
    d->cc_major = 9;
    d->cc_minor = 0;
    d->pci_device_id = 0x233010de;
    memset(d->nvlinks, 0, sizeof d->nvlinks);
    d->nvswitch_links = 0;
    d->pcie_switch = -1;
    d->host_bridge = -1;
    d->board = -1;
    d->mig_geometry = FG_MIG_AUTO;
    d->mig_on = 0;
}

static int parse_int(const char *val, long lo, long hi, int *out)
{
    char *end;
    long v = strtol(val, &end, 10);
    if (end == val || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* "1x4+2x2": 4 links to device 1, 2 links to device 2 */
static int parse_nvlinks(const char *val, int *links)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", val);
    memset(links, 0, sizeof(int) * FG_MAX_DEV);
    char *save = NULL;
    for (char *t = strtok_r(buf, "+", &save); t; t = strtok_r(NULL, "+", &save)) {
        int peer, n;
        char x;
        if (sscanf(t, "%d%c%d", &peer, &x, &n) != 3 || x != 'x' || peer < 0 || peer >= FG_MAX_DEV || n < 1 ||
            n > FG_NVLINK_MAX)
            return -1;
        links[peer] += n;
    }
    return 0;
}

static void apply_dev_key(fg_dev_cfg *d, const char *key, const char *val)
{
    char what[64];
    snprintf(what, sizeof what, "device key '%s'", key);
    char *end;
    if (!strcmp(key, "name")) {
        snprintf(d->name, sizeof d->name, "%s", val);
    } else if (!strcmp(key, "uuid")) {
        unsigned char b[16];
        if (parse_uuid(val, b))
            die(what, val);
        snprintf(d->uuid, sizeof d->uuid, "%s", val);
    } else if (!strcmp(key, "memory") || !strcmp(key, "mem")) {
        if (fg_parse_size(val, &d->memory) || d->memory == 0)
            die(what, val);
    } else if (!strcmp(key, "sms")) {
        long v = strtol(val, &end, 10);
        if (*end || v <= 0 || v > 100000)
            die(what, val);
        d->sms = (int)v;
    } else if (!strcmp(key, "numa")) {
        long v = strtol(val, &end, 10);
        if (*end || v < -1 || v > 1024)
            die(what, val);
        d->numa = (int)v;
    } else if (!strcmp(key, "pci")) {
        unsigned dom = 0, bus, dev, fn;
        if (sscanf(val, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4 &&
            (dom = 0, sscanf(val, "%x:%x.%x", &bus, &dev, &fn) != 3))
            die(what, val);
        d->domain = dom;
        d->bus = bus;
        d->device = dev;
    } else if (!strcmp(key, "cc")) {
        if (sscanf(val, "%d.%d", &d->cc_major, &d->cc_minor) != 2)
            die(what, val);
    } else if (!strcmp(key, "nvlink")) {
        if (parse_nvlinks(val, d->nvlinks))
            die(what, val);
    } else if (!strcmp(key, "nvswitch")) {
        if (parse_int(val, 0, FG_NVLINK_MAX, &d->nvswitch_links))
            die(what, val);
    } else if (!strcmp(key, "pcie_switch")) {
        if (parse_int(val, -1, 1 << 20, &d->pcie_switch))
            die(what, val);
    } else if (!strcmp(key, "host_bridge")) {
        if (parse_int(val, -1, 1 << 20, &d->host_bridge))
            die(what, val);
    } else if (!strcmp(key, "board")) {
        if (parse_int(val, -1, 1 << 20, &d->board))
            die(what, val);
    } else if (!strcmp(key, "mig")) {
        if (!strcmp(val, "auto"))
            d->mig_geometry = FG_MIG_AUTO;
        else if (!strcmp(val, "none"))
            d->mig_geometry = FG_MIG_NONE;
        else if (!strcmp(val, "a100-40gb"))
            d->mig_geometry = FG_MIG_A100_40GB;
        else if (!strcmp(val, "h100-80gb"))
            d->mig_geometry = FG_MIG_H100_80GB;
        else
            die(what, val);
    } else if (!strcmp(key, "mig_mode")) {
        if (parse_int(val, 0, 1, &d->mig_on))
            die(what, val);
    } else if (!strcmp(key, "pci_device_id")) {
        unsigned long v = strtoul(val, &end, 0);
        if (*end)
            die(what, val);
        d->pci_device_id = (unsigned)v;
    } else {
        die("unknown device key", key);
    }
}

/* spec: "key=value,key=value" */
static void parse_dev_spec(fg_dev_cfg *d, const char *spec)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*kv))
            kv++;
        if (!*kv)
            continue;
        char *eq = strchr(kv, '=');
        if (!eq)
            die("device spec entry (want key=value)", kv);
        *eq = 0;
        char *v = eq + 1, *e = v + strlen(v);
        while (e > v && isspace((unsigned char)e[-1]))
            *--e = 0;
        apply_dev_key(d, kv, v);
    }
}

static void apply_global(fg_config *c, const char *key, const char *val)
{
    char *end;
    if (!strcmp(key, "context_mem")) {
        if (fg_parse_size(val, &c->ctx_mem))
            die("context_mem", val);
    } else if (!strcmp(key, "kernel_ns")) {
        if (fg_parse_size(val, &c->kernel_ns))
            die("kernel_ns", val);
    } else if (!strcmp(key, "time_scale")) {
        c->time_scale = strtod(val, &end);
        if (*end || c->time_scale < 0)
            die("time_scale", val);
    } else if (!strcmp(key, "hostpid_offset")) {
        c->hostpid_offset = (int)strtol(val, &end, 10);
        if (*end)
            die("hostpid_offset", val);
    } else if (!strcmp(key, "context_delay_ms")) {
        long v = strtol(val, &end, 10);
        if (*end || v < 0 || v > 600000)
            die("context_delay_ms", val);
        c->context_delay_ms = (unsigned)v;
    } else if (!strcmp(key, "sample_period_us")) {
        long v = strtol(val, &end, 10);
        if (*end || v < 1000 || v > 10000000)
            die("sample_period_us", val);
        c->sample_period_us = (unsigned)v;
    } else if (!strcmp(key, "util_attribution")) {
        if (!strcmp(val, "split"))
            c->util_resident = 0;
        else if (!strcmp(val, "resident"))
            c->util_resident = 1;
        else
            die("util_attribution (split or resident)", val);
    } else if (!strcmp(key, "reuse_handles")) {
        if (strcmp(val, "0") && strcmp(val, "1"))
            die("reuse_handles (0 or 1)", val);
        c->reuse_handles = val[0] == '1';
    } else if (!strcmp(key, "visible_devices_env")) {
        if (!*val || strlen(val) >= sizeof c->visible_env)
            die("visible_devices_env", val);
        snprintf(c->visible_env, sizeof c->visible_env, "%s", val);
    } else if (!strcmp(key, "state_dir")) {
        if (val[0] != '/' || strlen(val) >= sizeof c->state_dir)
            die("state_dir", val);
        snprintf(c->state_dir, sizeof c->state_dir, "%s", val);
    } else {
        die("unknown config key", key);
    }
}

static void add_devices(fg_config *c, char *text, const char *sep)
{
    char *save = NULL;
    for (char *spec = strtok_r(text, sep, &save); spec; spec = strtok_r(NULL, sep, &save)) {
        while (isspace((unsigned char)*spec))
            spec++;
        if (!*spec || *spec == '#')
            continue;
        if (c->count >= FG_MAX_DEV)
            die("device count (max 16)", spec);
        set_default_dev(c, c->count, FG_MAX_DEV);
        parse_dev_spec(&c->dev[c->count], spec);
        c->count++;
    }
}

static void load_config_file(fg_config *c, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        die("FAKEGPU_CONFIG (cannot open)", path);
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (!*p || *p == '#')
            continue;
        if (!strncmp(p, "device ", 7) || !strncmp(p, "device\t", 7)) {
            add_devices(c, p + 7, "\n");
        } else {
            char *eq = strchr(p, '=');
            if (!eq)
                die("FAKEGPU_CONFIG line", p);
            *eq = 0;
            apply_global(c, p, eq + 1);
        }
    }
    fclose(f);
}

/* A "driver" installed as a directory (libcuda.so.1, libnvidia-ml.so.1, fakegpu.conf) carries
 * its configuration with it: every process that loads the library from there, in any mount
 * namespace the directory is mounted into, reads the same fakegpu.conf. */
static int config_beside_library(char *path, size_t size)
{
    Dl_info info;
    if (!dladdr((void *)&config_beside_library, &info) || !info.dli_fname)
        return 0;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash)
        return 0;
    snprintf(path, size, "%.*s/fakegpu.conf", (int)(slash - info.dli_fname), info.dli_fname);
    return access(path, R_OK) == 0;
}

/* A MIG device named in the visible-devices variable: the GPU instance with that UUID in the
 * machine's state file (read directly: the state is not mapped yet while the configuration is
 * being read). The process then sees that GPU as the MIG device: its UUID, "<name> MIG <profile>",
 * the profile's memory and SMs. Returns the physical index; an unknown UUID stops the process. */
static int mig_visible(fg_config *c, const char *token)
{
    char dir[512], path[600];
    const char *d = getenv("FAKEGPU_STATE_DIR");
    if (d && *d)
        snprintf(dir, sizeof dir, "%s", d);
    else if (c->state_dir[0])
        snprintf(dir, sizeof dir, "%s", c->state_dir);
    else
        snprintf(dir, sizeof dir, "/tmp/fakegpu-%u", (unsigned)getuid());
    snprintf(path, sizeof path, "%s/state", dir);
    int found = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && sb.st_size == (off_t)sizeof(fg_state)) {
        const fg_state *s = mmap(NULL, sizeof(fg_state), PROT_READ, MAP_SHARED, fd, 0);
        if (s != MAP_FAILED) {
            for (int i = 0; i < c->count && found < 0 && s->magic == FG_MAGIC && s->version == FG_VERSION; i++) {
                fg_dev_cfg *dv = &c->dev[i];
                parse_uuid(dv->uuid, dv->uuid_bytes);
                const fg_mig_profile *g = fg_mig_geometry(dv->mig_geometry == FG_MIG_AUTO ? FG_MIG_NONE : dv->mig_geometry);
                for (int id = 1; g && id <= FG_MAX_GI && found < 0; id++) {
                    const fg_gi *x = &s->mig[i].gi[id];
                    char uuid[96];
                    if (!x->used || !x->ci_used || x->profile < 0 || x->profile >= FG_MIG_PROFILES)
                        continue;
                    fg_mig_uuid(dv->uuid_bytes, id, x->gen, uuid, sizeof uuid);
                    if (strcmp(uuid, token))
                        continue;
                    const fg_mig_profile *p = &g[x->profile];
                    char name[sizeof dv->name];
                    snprintf(name, sizeof name, "%.60s MIG %s", dv->name, p->name);
                    memcpy(dv->name, name, sizeof name);
                    snprintf(dv->uuid, sizeof dv->uuid, "%s", uuid);
                    char as_gpu[100];
                    snprintf(as_gpu, sizeof as_gpu, "GPU-%s", uuid + 4);
                    parse_uuid(as_gpu, dv->uuid_bytes);
                    dv->memory = p->mem_mib << 20;
                    dv->sms = (int)p->sms;
                    found = i;
                }
            }
            munmap((void *)s, sizeof(fg_state));
        }
    }
    if (fd >= 0)
        close(fd);
    if (found < 0)
        die(c->visible_env, token); /* the runtime would refuse to start the container */
    return found;
}

/* What a container runtime does with the GPUs it was told to give a container (the NVIDIA
 * runtime reads NVIDIA_VISIBLE_DEVICES): with visible_devices_env=<VAR> in the configuration, a
 * process whose VAR lists devices (UUIDs or indices, comma-separated) sees only those, in CUDA
 * and in NVML, numbered from 0; "all" or an unset VAR: every device; "void"/"none"/"": none. */
static void runtime_visible(fg_config *c)
{
    c->nvis = 0;
    const char *v = c->visible_env[0] ? getenv(c->visible_env) : NULL;
    if (!v || !strcmp(v, "all")) {
        for (int i = 0; i < c->count; i++)
            c->vis[c->nvis++] = i;
        return;
    }
    if (!strcmp(v, "void") || !strcmp(v, "none"))
        return;
    char *copy = strdup(v), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strncmp(t, "MIG-", 4)) {
            int dev = mig_visible(c, t);
            for (int i = 0; i < c->nvis; i++)
                if (c->vis[i] == dev)
                    die("two MIG devices of one GPU in one process (not modelled)", t);
            if (c->nvis < FG_MAX_DEV)
                c->vis[c->nvis++] = dev;
            continue;
        }
        int found = -1;
        for (int i = 0; i < c->count; i++)
            if (!strcmp(c->dev[i].uuid, t))
                found = i;
        if (found < 0) {
            char *end;
            long n = strtol(t, &end, 10);
            if (end != t && !*end && n >= 0 && n < c->count)
                found = (int)n;
        }
        if (found < 0)
            die(c->visible_env, t); /* the runtime would refuse to start the container */
        if (c->nvis < FG_MAX_DEV)
            c->vis[c->nvis++] = found;
    }
    free(copy);
}

static void env_global(fg_config *c, const char *env, const char *key)
{
    const char *v = getenv(env);
    if (v && *v)
        apply_global(c, key, v);
}

static void cfg_init(void)
{
    fg_config *c = &g_cfg;
    memset(c, 0, sizeof *c);
    c->kernel_ns = 10000;
    c->time_scale = 1.0;
    c->sample_period_us = 166667;
    const char *path = getenv("FAKEGPU_CONFIG");
    char beside[600];
    if (path && *path) {
        load_config_file(c, path);
    } else if (config_beside_library(beside, sizeof beside)) {
        load_config_file(c, beside);
    }
    const char *devs = getenv("FAKEGPU_DEVICES");
    if (devs && *devs) {
        char *copy = strdup(devs);
        c->count = 0;
        add_devices(c, copy, ";\n");
        free(copy);
    }
    if (c->count == 0) {
        const char *n = getenv("FAKEGPU_COUNT");
        char *end = NULL;
        long count = n && *n ? strtol(n, &end, 10) : 2;
        if ((end && *end) || count < 0 || count > FG_MAX_DEV)
            die("FAKEGPU_COUNT", n);
        c->count = (int)count;
        const char *mem = getenv("FAKEGPU_MEMORY");
        const char *sms = getenv("FAKEGPU_SMS");
        for (int i = 0; i < c->count; i++) {
            set_default_dev(c, i, c->count);
            if (mem && *mem)
                apply_dev_key(&c->dev[i], "memory", mem);
            if (sms && *sms)
                apply_dev_key(&c->dev[i], "sms", sms);
        }
    }
    /* Re-derive NUMA defaults for the actual count, fill derived fields. */
    for (int i = 0; i < c->count; i++) {
        fg_dev_cfg *d = &c->dev[i];
        parse_uuid(d->uuid, d->uuid_bytes);
        snprintf(d->pci, sizeof d->pci, "%08X:%02X:%02X.0", d->domain, d->bus, d->device);
        if (d->mig_geometry == FG_MIG_AUTO)
            d->mig_geometry = strstr(d->name, "A100") && strstr(d->name, "40GB") ? FG_MIG_A100_40GB
                              : strstr(d->name, "H100") && strstr(d->name, "80GB") ? FG_MIG_H100_80GB
                                                                                   : FG_MIG_NONE;
        if (d->mig_on && d->mig_geometry == FG_MIG_NONE)
            die("device key 'mig_mode' (this model has no MIG geometry; set mig=a100-40gb or h100-80gb)", d->name);
        int total = d->nvswitch_links;
        for (int j = 0; j < FG_MAX_DEV; j++) {
            if (d->nvlinks[j] && (j >= c->count || j == i))
                die("device key 'nvlink' (no such peer device)", d->uuid);
            total += d->nvlinks[j];
        }
        if (total > FG_NVLINK_MAX)
            die("device key 'nvlink'/'nvswitch' (more than 18 links in all)", d->uuid);
    }
    runtime_visible(c);
    env_global(c, "FAKEGPU_CONTEXT_MEM", "context_mem");
    env_global(c, "FAKEGPU_KERNEL_NS", "kernel_ns");
    env_global(c, "FAKEGPU_TIME_SCALE", "time_scale");
    env_global(c, "FAKEGPU_HOSTPID_OFFSET", "hostpid_offset");
    env_global(c, "FAKEGPU_CONTEXT_DELAY_MS", "context_delay_ms");
    env_global(c, "FAKEGPU_SAMPLE_PERIOD_US", "sample_period_us");
    env_global(c, "FAKEGPU_UTIL_ATTRIBUTION", "util_attribution");
    env_global(c, "FAKEGPU_REUSE_HANDLES", "reuse_handles");
    /* environment only: fake_cuda.c's export of cuDeviceGetUuid_v2 is decided from it when the symbol
     * is looked up, before (and without) this configuration */
    const char *uuid_api = getenv("FAKEGPU_UUID_API");
    c->uuid_api = 2;
    if (uuid_api && *uuid_api) {
        if (!strcmp(uuid_api, "v1"))
            c->uuid_api = 1;
        else if (!strcmp(uuid_api, "none"))
            c->uuid_api = 0;
        else if (strcmp(uuid_api, "v2"))
            die("FAKEGPU_UUID_API (v2, v1 or none)", uuid_api);
    }
}

const fg_config *fg_cfg(void)
{
    pthread_once(&g_cfg_once, cfg_init);
    return &g_cfg;
}

static void init_mutex(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

static fg_state *map_anonymous(void)
{
    void *p = mmap(NULL, sizeof(fg_state), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("fakegpu: mmap");
        exit(2);
    }
    fg_state *s = p;
    init_mutex(&s->lock);
    for (int i = 0; i < fg_cfg()->count; i++)
        s->mig[i].mode = fg_cfg()->dev[i].mig_on;
    s->magic = FG_MAGIC;
    s->version = FG_VERSION;
    return s;
}

/* $FAKEGPU_STATE_DIR, else state_dir of the configuration, else /tmp/fakegpu-<uid>. */
static void state_dir(char *dir, size_t size)
{
    const char *d = getenv("FAKEGPU_STATE_DIR");
    if (d && *d)
        snprintf(dir, size, "%s", d);
    else if (fg_cfg()->state_dir[0])
        snprintf(dir, size, "%s", fg_cfg()->state_dir);
    else
        snprintf(dir, size, "/tmp/fakegpu-%u", (unsigned)getuid());
}

static void st_init(void)
{
    char dir[512], path[600];
    state_dir(dir, sizeof dir);
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/state", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        fprintf(stderr, "fakegpu: cannot open state file %s: %s (state is process-local)\n", path,
                strerror(errno));
        g_st = map_anonymous();
        return;
    }
    fchmod(fd, 0666);
    flock(fd, LOCK_EX);
    struct stat sb;
    fstat(fd, &sb);
    int fresh = sb.st_size != (off_t)sizeof(fg_state);
    if (fresh && ftruncate(fd, 0) == 0 && ftruncate(fd, sizeof(fg_state)) != 0) {
        perror("fakegpu: ftruncate");
        exit(2);
    }
    void *p = mmap(NULL, sizeof(fg_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        perror("fakegpu: mmap state");
        exit(2);
    }
    fg_state *s = p;
    if (fresh || s->magic != FG_MAGIC || s->version != FG_VERSION) {
        memset(s, 0, sizeof *s);
        init_mutex(&s->lock);
        for (int i = 0; i < fg_cfg()->count; i++)
            s->mig[i].mode = fg_cfg()->dev[i].mig_on;
        s->version = FG_VERSION;
        __atomic_store_n(&s->magic, FG_MAGIC, __ATOMIC_RELEASE);
    }
    flock(fd, LOCK_UN);
    close(fd);
    g_st = s;
}

fg_state *fg_st(void)
{
    pthread_once(&g_st_once, st_init);
    return g_st;
}

void fg_lock(void)
{
    fg_state *s = fg_st();
    int r = pthread_mutex_lock(&s->lock);
    if (r == EOWNERDEAD)
        pthread_mutex_consistent(&s->lock);
}

void fg_unlock(void)
{
    pthread_mutex_unlock(&fg_st()->lock);
}

/* Process identity across PID namespaces.
 *
 * Containers on one node share the fake GPU through the state file, and each container's
 * first process is PID 1 in its own namespace: getpid() alone would merge them. A slot is
 * therefore keyed by (PID namespace inode, PID in it), and carries the PID that NVML
 * reports, as a real driver reports host PIDs:
 *  - in the initial PID namespace, getpid() (it is the host PID);
 *  - else, when /proc/self/status "NSpid:" lists more than one PID, the first (the PID in
 *    the namespace that mounted /proc: the host's when /proc is the host's);
 *  - else a synthetic PID, unique on this state file, above the kernel's largest pid_max
 *    (4194304) so that it can never be taken for a real host process.
 * Liveness cannot use kill() across namespaces, so the owner of slot i holds a POSIX write
 * lock on byte i of <state_dir>/live: the kernel drops it when the process exits (or is
 * killed), in any namespace, and F_GETLK sees it from any other process that opens the
 * file. The file descriptor is never closed (closing any descriptor of a file drops the
 * process's POSIX locks on it). Without a state file (process-local state) it falls back to
 * kill(). */
#define INIT_PID_NS_INO 4026531836ULL /* PROC_PID_INIT_INO */
#define SYNTH_PID_BASE 4194304

static int g_live_fd = -1;
static pthread_once_t g_live_once = PTHREAD_ONCE_INIT;
static fg_proc *g_self;     /* cached slot of this process; reset in a forked child */
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

static void forget_self(void) { g_self = NULL; }
static void atfork_init(void) { pthread_atfork(NULL, NULL, forget_self); }

static void live_init(void)
{
    char dir[512], path[600];
    state_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/live", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd >= 0)
        fchmod(fd, 0666);
    g_live_fd = fd;
}

static unsigned long long my_pidns(void)
{
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (unsigned long long)sb.st_ino : 0;
}

/* The outer PID from NSpid when /proc shows more than one level, else 0. */
/* Start time of this process in clock ticks since boot: with the namespace and the PID it
 * tells this process from an earlier one that had the same PID. */
static unsigned long long my_start(void)
{
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return 0;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long long v = 0;
    /* after ") ": field 3 (state) .. field 22 (starttime) */
    for (int field = 3; p && field <= 22; field++) {
        p = strchr(p + 1, ' ');
        if (p && field == 22)
            v = strtoull(p + 1, NULL, 10);
    }
    return v;
}

static int outer_pid(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    int first = 0, n = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "NSpid:", 6))
            continue;
        char *p = line + 6, *end;
        for (;;) {
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            if (n++ == 0)
                first = (int)v;
            p = end;
        }
        break;
    }
    fclose(f);
    return n > 1 ? first : 0;
}

static int lock_byte(int cmd, short type, int slot, struct flock *out)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = slot, .l_len = 1};
    int r = fcntl(g_live_fd, cmd, &fl);
    if (out)
        *out = fl;
    return r;
}

/* Whether slot i's owner lives; (ns, me, start) identify the calling process. */
static int slot_alive(int i, unsigned long long ns, int me, unsigned long long start)
{
    fg_proc *p = &fg_st()->procs[i];
    if (!p->pid)
        return 0;
    if (p == g_self || (p->pidns == ns && p->nspid == me && p->start == start))
        return 1; /* this process (its own lock is invisible to it through F_GETLK) */
    if (p->live && g_live_fd >= 0) {
        struct flock fl;
        if (lock_byte(F_GETLK, F_WRLCK, i, &fl) != 0)
            return 1; /* cannot tell: keep it */
        return fl.l_type != F_UNLCK;
    }
    return p->pidns == ns ? fg_pid_alive(p->nspid) : 1;
}

static int synthetic_pid(void)
{
    fg_state *s = fg_st();
    for (int cand = SYNTH_PID_BASE;; cand++) {
        int taken = 0;
        for (int i = 0; i < FG_MAX_PROC && !taken; i++)
            taken = s->procs[i].pid == cand;
        if (!taken)
            return cand;
    }
}

fg_proc *fg_self_slot(int create)
{
    if (g_self)
        return g_self;
    pthread_once(&g_atfork_once, atfork_init);
    fg_state *s = fg_st();
    pthread_once(&g_live_once, live_init);
    unsigned long long ns = my_pidns(), start = my_start();
    int me = (int)getpid(), free_i = -1;
    for (int i = 0; i < FG_MAX_PROC; i++) {
        fg_proc *p = &s->procs[i];
        if (p->pid && p->pidns == ns && p->nspid == me) {
            if (p->start == start) {
                /* this process's slot, made by this copy or by the other library's */
                if (p->live && g_live_fd >= 0)
                    lock_byte(F_SETLK, F_WRLCK, i, NULL); /* a no-op if already ours */
                g_self = p;
                return p;
            }
            memset(p, 0, sizeof *p); /* a dead process's slot (its PID reused) */
        }
        if (free_i < 0 && !p->pid)
            free_i = i;
    }
    if (!create)
        return NULL;
    if (free_i < 0) {
        fg_reap();
        for (int i = 0; i < FG_MAX_PROC && free_i < 0; i++)
            if (!s->procs[i].pid)
                free_i = i;
        if (free_i < 0)
            return NULL;
    }
    pthread_once(&g_live_once, live_init);
    fg_proc *p = &s->procs[free_i];
    memset(p, 0, sizeof *p);
    p->pidns = ns;
    p->nspid = me;
    p->start = start;
    if (ns == INIT_PID_NS_INO || ns == 0)
        p->pid = me;
    else {
        int outer = outer_pid();
        p->pid = outer > 0 ? outer : synthetic_pid();
    }
    p->live = g_live_fd >= 0 && lock_byte(F_SETLK, F_WRLCK, free_i, NULL) == 0;
    g_self = p;
    return p;
}

void fg_reap(void)
{
    fg_state *s = fg_st();
    pthread_once(&g_live_once, live_init);
    unsigned long long ns = my_pidns(), start = my_start();
    int me = (int)getpid();
    for (int i = 0; i < FG_MAX_PROC; i++)
        if (s->procs[i].pid && !slot_alive(i, ns, me, start))
            memset(&s->procs[i], 0, sizeof s->procs[i]);
}

unsigned long long fg_dev_used(int dev)
{
    fg_state *s = fg_st();
    unsigned long long sum = 0;
    for (int i = 0; i < FG_MAX_PROC; i++)
        if (s->procs[i].pid)
            sum += s->procs[i].used[dev];
    return sum;
}

void fg_record_busy(int dev, int pid, unsigned long long start, unsigned long long end)
{
    fg_state *s = fg_st();
    unsigned long long n = s->busy_count[dev];
    if (n) {
        fg_busy *last = &s->busy[dev][(n - 1) % FG_RING];
        if (last->pid == pid && last->end_ns == start) {
            last->end_ns = end;
            return;
        }
    }
    fg_busy *b = &s->busy[dev][n % FG_RING];
    b->pid = pid;
    b->start_ns = start;
    b->end_ns = end;
    s->busy_count[dev] = n + 1;
}

void fg_inject_xid_locked(int dev, unsigned long long xid)
{
    fg_state *s = fg_st();
    unsigned long long seq = ++s->xid_seq;
    fg_xid *x = &s->xids[seq % FG_MAX_XID];
    x->seq = seq;
    x->dev = dev;
    x->xid = xid;
}

/* Whether the xid file is ready to consume: not empty and ending with a newline. A writer
 * (`echo "1 79" > xid`, Python's open().write()) creates the file empty, then writes: taking
 * it in between would lose the lines. */
static int xid_file_complete(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    char last = 0;
    int ok = fstat(fd, &st) == 0 && st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) == 1 && last == '\n';
    close(fd);
    return ok;
}

/* "$FAKEGPU_STATE_DIR/xid" holds lines "<device index or UUID> <xid>"; each line becomes
 * one event, then the file is removed (rename first so a concurrent writer is not lost). */
void fg_poll_xid_file(void)
{
    char dir[512], path[600], tmp[640];
    state_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/xid", dir);
    snprintf(tmp, sizeof tmp, "%s/xid.%d.reading", dir, (int)getpid());
    if (!xid_file_complete(path) || rename(path, tmp) != 0)
        return;
    FILE *f = fopen(tmp, "r");
    if (!f)
        return;
    const fg_config *c = fg_cfg();
    char who[128];
    unsigned long long xid;
    fg_lock();
    while (fscanf(f, "%127s %llu", who, &xid) == 2) {
        int dev = -1;
        for (int i = 0; i < c->count; i++)
            if (!strcmp(who, c->dev[i].uuid))
                dev = i;
        if (dev < 0) {
            char *end;
            long v = strtol(who, &end, 10);
            if (!*end && v >= 0 && v < c->count)
                dev = (int)v;
        }
        if (dev >= 0)
            fg_inject_xid_locked(dev, xid);
        else
            fprintf(stderr, "fakegpu: xid file: unknown device '%s'\n", who);
    }
    fg_unlock();
    fclose(f);
    unlink(tmp);
}

unsigned long long fg_round_alloc(unsigned long long size)
{
    unsigned long long a = size >= FG_LARGE_ALIGN ? FG_LARGE_ALIGN : FG_SMALL_ALIGN;
    return (size + a - 1) / a * a;
}
