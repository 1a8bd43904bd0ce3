/* The exported dlsym: serves libvgpu's hooks for the CUDA/NVML names it hooks, whatever
 * handle the caller passed (ctypes, pynvml and libcudart look driver symbols up through
 * dlsym on a library handle, which would otherwise bypass LD_PRELOAD). Every other lookup
 * goes to glibc's dlsym by a tail jump, so glibc sees the original caller's return address
 * and dlsym(RTLD_NEXT, ...) keeps meaning "next after the caller", not "next after us". */
#include "vgpu.h"

#include <dlfcn.h>
#include <string.h>

HIDDEN void *vgpu_real_dlsym_ptr;
HIDDEN void *vgpu_dlsym_lookup(void *handle, const char *name);
HIDDEN __thread int vgpu_in_init;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void find_real_dlsym(void)
{
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !vgpu_real_dlsym_ptr; i++)
        vgpu_real_dlsym_ptr = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

void *vgpu_real_dlsym_fn(void *handle, const char *name)
{
    pthread_once(&g_once, find_real_dlsym);
    void *(*real)(void *, const char *) = (void *(*)(void *, const char *))vgpu_real_dlsym_ptr;
    return real ? real(handle, name) : NULL;
}

void *vgpu_dlsym_lookup(void *handle, const char *name)
{
    pthread_once(&g_once, find_real_dlsym);
    if (!name || vgpu_in_init)
        return NULL;
    if (!((name[0] == 'c' && name[1] == 'u') || !strncmp(name, "nvml", 4)))
        return NULL;
    const vgpu_hook *h = vgpu_hook_by_name(name);
    if (!h)
        return NULL;
    /* A library handle answers only for the names it has: an older driver without a newer entry
     * point (or libm, asked for a CUDA name) says NULL, as it would without libvgpu, so the
     * caller takes its fallback rather than a hook with no driver function behind it.
     * RTLD_DEFAULT and RTLD_NEXT find libvgpu's own export first, so they keep the hook. */
    if (handle != RTLD_DEFAULT && handle != RTLD_NEXT && !vgpu_real_dlsym_fn(handle, name))
        return NULL;
    return h->hook;
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,@function\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  pushq %rdi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  pushq %rsi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  subq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  call vgpu_dlsym_lookup\n"
        "  addq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rsi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rdi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  testq %rax, %rax\n"
        "  jz 1f\n"
        "  ret\n"
        "1:\n"
        "  jmp *vgpu_real_dlsym_ptr(%rip)\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
/* Portable fallback: correct for every handle except RTLD_NEXT, which then resolves
 * relative to libvgpu rather than the caller. */
EXPORT void *dlsym(void *handle, const char *name)
{
    void *h = vgpu_dlsym_lookup(handle, name);
    return h ? h : vgpu_real_dlsym_fn(handle, name);
}
#endif
