/* N processes race to allocate on one device under one shared limit.
 * usage: vgpu_race N CHUNK_MIB
 * Every child allocates CHUNK-sized blocks (CHUNK + 2 MiB x child index) until the first
 * OOM, reports its total through a pipe and keeps its memory until the parent has read
 * every report. Prints "sum=<bytes> max_chunk=<bytes>". */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    int n = atoi(argv[1]);
    unsigned long long chunk = strtoull(argv[2], NULL, 10) << 20;
    int go[2], rep[2], done[2];
    if (pipe(go) || pipe(rep) || pipe(done))
        return 2;
    for (int i = 0; i < n; i++) {
        if (fork() == 0) {
            close(go[1]);
            close(done[1]);
            CUcontext ctx;
            if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx))
                _exit(3);
            char c;
            if (read(go[0], &c, 1) < 0)
                _exit(4);
            unsigned long long total = 0, size = chunk + (unsigned long long)i * (2ULL << 20);
            CUdeviceptr p;
            while (cuMemAlloc(&p, size) == CUDA_SUCCESS)
                total += size;
            if (write(rep[1], &total, sizeof total) != sizeof total)
                _exit(5);
            if (read(done[0], &c, 1) < 0)
                _exit(6);
            _exit(0);
        }
    }
    close(go[0]);
    close(rep[1]);
    close(done[0]);
    usleep(200000);
    close(go[1]); /* start */
    unsigned long long sum = 0, t;
    for (int i = 0; i < n; i++) {
        if (read(rep[0], &t, sizeof t) != sizeof t) {
            printf("child report missing\n");
            return 1;
        }
        sum += t;
    }
    close(done[1]);
    int status, bad = 0;
    while (wait(&status) > 0)
        bad |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    printf("sum=%llu max_chunk=%llu bad=%d\n", sum, chunk + (unsigned long long)(n - 1) * (2ULL << 20), bad);
    return bad;
}
