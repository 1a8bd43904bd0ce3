/* A process whose own exit handler frees device memory after libvgpu's (registered later, so run
 * earlier) has released its slot; between the two it waits for another process to start. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static CUdeviceptr g_late;
static const char *g_dir;

static void wait_for(const char *name)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    while (stat(path, &st) != 0)
        usleep(10000);
}

static void touch(const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    fclose(fopen(path, "w"));
}

static void late_free(void)
{
    touch("exiting");
    wait_for("go");
    printf("late free %d\n", (int)cuMemFree_v2(g_late));
    fflush(stdout);
}

int main(int argc, char **argv)
{
    CUcontext ctx;
    if (argc < 3)
        return 2;
    g_dir = argv[1];
    atexit(late_free); /* before libvgpu's own handler: it runs after it */
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx))
        return 3;
    printf("alloc %d\n", (int)cuMemAlloc_v2(&g_late, (size_t)atoll(argv[2]) << 20));
    fflush(stdout);
    return 0;
}
