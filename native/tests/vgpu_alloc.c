/* usage: vgpu_alloc MIB... : allocates each size on device 0 and prints the CUresults,
 * preceded by the real UID (used to check that several UIDs share one region). */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx))
        return 3;
    printf("%d", (int)getuid());
    for (int i = 1; i < argc; i++) {
        CUdeviceptr p;
        printf(" %d", (int)cuMemAlloc(&p, strtoull(argv[i], NULL, 10) << 20));
    }
    printf("\n");
    return 0;
}
