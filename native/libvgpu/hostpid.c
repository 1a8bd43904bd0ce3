/* The PID of this process as NVML reports it (the host PID), found from the kernel's own
 * records instead of by diffing NVML's process list around a context creation:
 *
 * 1. In the initial PID namespace (its inode number is fixed by the kernel,
 *    PROC_PID_INIT_INO = 0xEFFFFFFC) getpid() is the host PID.
 * 2. Otherwise /proc/self/status "NSpid:" lists our PID in every namespace from the one
 *    that mounted /proc down to ours; with more than one entry the first is the PID in an
 *    outer namespace (the host's when /proc comes from the host, e.g. `unshare --pid`
 *    without --mount-proc, or a host /proc bind mount).
 * 3. Otherwise the PID cannot be known from inside the container; a node agent may write
 *    it into our slot (hostpid), and the limiter uses whatever non-zero value it finds. */
#include "vgpu.h"
#include "limiter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INIT_PID_NS_INO 4026531836ULL /* 0xEFFFFFFC */

static int in_init_pid_ns(void)
{
    char buf[64];
    ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    unsigned long long ino = 0;
    return sscanf(buf, "pid:[%llu]", &ino) == 1 && ino == INIT_PID_NS_INO;
}

/* First NSpid entry when there are at least two, else 0. */
static int outer_nspid(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    int pid = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "NSpid:", 6))
            continue;
        char *end, *p = line + 6;
        long first = strtol(p, &end, 10);
        int more = 0;
        for (p = end; *p; p++)
            more |= *p >= '0' && *p <= '9';
        if (end != line + 6 && more && first > 0)
            pid = (int)first;
        break;
    }
    fclose(f);
    return pid;
}

int lim_host_pid(void)
{
    if (in_init_pid_ns())
        return (int)getpid();
    return outer_nspid();
}
