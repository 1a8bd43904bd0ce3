/* RTLD_NEXT probe, part A: defines which() and asks dlsym(RTLD_NEXT, "which"), which must
 * find part B's which() (the next object after A), even with libvgpu's dlsym preloaded. */
#define _GNU_SOURCE
#include <dlfcn.h>

const char *which(void) { return "A"; }

const char *next_which(void)
{
    const char *(*f)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "which");
    return f ? f() : "none";
}
