/*
 * pause: the process that holds a pod sandbox's namespaces open.
 *
 * Debian ships no pause image, so the real test node uses this one (see
 * devkit/src/hami_devkit/images.py, which builds it statically and packs it as an OCI image).
 *
 * It sleeps until told to stop, reaps every child that is re-parented to it (it is PID 1
 * of the pod's PID namespace when the namespace is shared), and exits 0 on SIGTERM or
 * SIGINT. `pause -v` prints the version and exits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAUSE_VERSION "hami-pause 3.10"

static void stop(int sig)
{
    (void)sig;
    _exit(0);
}

static void reap(int sig)
{
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int on(int sig, void (*handler)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = sig == SIGCHLD ? SA_NOCLDSTOP | SA_RESTART : SA_RESTART;
    return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts(PAUSE_VERSION);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "pause: unknown argument %s (only -v is accepted)\n", argv[1]);
        return 2;
    }
    if (getpid() != 1)
        fprintf(stderr, "pause: not PID 1; children re-parented elsewhere are not reaped here\n");
    if (on(SIGINT, stop) || on(SIGTERM, stop) || on(SIGCHLD, reap)) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;)
        pause();
}
