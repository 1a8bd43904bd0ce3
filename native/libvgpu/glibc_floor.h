/* libvgpu is loaded into every process of a container (LD_PRELOAD, /etc/ld.so.preload), whatever
 * the image's C library. Built against glibc >= 2.34 it asked for that glibc's new symbol versions
 * (pthread and dl functions moved into libc in 2.34, stat/fstat became functions in 2.33), and on
 * an older image (Ubuntu 20.04, Debian 11, RHEL 8: glibc 2.28-2.31) every process of the container
 * then failed to start ("version `GLIBC_2.34' not found"). So each of them is bound to its first
 * version, which every glibc since has kept (as a compatibility symbol); the library links
 * libpthread and libdl by name (they hold these symbols before 2.34, and are empty stubs after),
 * and stat/fstat are made with system calls (vgpu_stat, vgpu_fstat). tests/native checks that no
 * symbol version above GLIBC_2.17 is required. Included in every libvgpu source (Makefile). */
#ifndef VGPU_GLIBC_FLOOR_H
#define VGPU_GLIBC_FLOOR_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* first: the sources' own headers need it too (F_OFD_SETLK, dlvsym) */
#endif

#if defined(__x86_64__)
#define VGPU_GLIBC_BASE "GLIBC_2.2.5"
#define VGPU_GLIBC_ROBUST "GLIBC_2.12"
#elif defined(__aarch64__)
#define VGPU_GLIBC_BASE "GLIBC_2.17"
#define VGPU_GLIBC_ROBUST "GLIBC_2.17"
#endif

#ifdef VGPU_GLIBC_BASE
__asm__(".symver pthread_create,pthread_create@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_once,pthread_once@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_mutexattr_init,pthread_mutexattr_init@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_mutexattr_destroy,pthread_mutexattr_destroy@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_mutexattr_setpshared,pthread_mutexattr_setpshared@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_mutexattr_setrobust,pthread_mutexattr_setrobust@" VGPU_GLIBC_ROBUST);
__asm__(".symver pthread_mutex_consistent,pthread_mutex_consistent@" VGPU_GLIBC_ROBUST);
__asm__(".symver sem_init,sem_init@" VGPU_GLIBC_BASE);
__asm__(".symver dlopen,dlopen@" VGPU_GLIBC_BASE);
__asm__(".symver dlerror,dlerror@" VGPU_GLIBC_BASE);
__asm__(".symver dlvsym,dlvsym@" VGPU_GLIBC_BASE);
__asm__(".symver dlclose,dlclose@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_rwlock_init,pthread_rwlock_init@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_rwlock_rdlock,pthread_rwlock_rdlock@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_rwlock_tryrdlock,pthread_rwlock_tryrdlock@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_rwlock_wrlock,pthread_rwlock_wrlock@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_rwlock_trywrlock,pthread_rwlock_trywrlock@" VGPU_GLIBC_BASE);
__asm__(".symver pthread_rwlock_unlock,pthread_rwlock_unlock@" VGPU_GLIBC_BASE);
/* dlsym is not bound here: libvgpu defines its own (dlsym.c) and reaches glibc's by dlvsym */
#endif

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* stat(2) / fstat(2) without glibc's 2.33 wrappers (the kernel's struct stat is glibc's on
 * x86_64 and aarch64). */
static inline int vgpu_stat(const char *path, struct stat *st)
{
    return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
}

static inline int vgpu_fstat(int fd, struct stat *st)
{
    return (int)syscall(SYS_fstat, fd, st);
}

#endif
