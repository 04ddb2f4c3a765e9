/* A free TCP port on 127.0.0.1 for tests that start ranks (the kernel picks
 * it; a race with another process taking it first is possible but rare). */
#ifndef TEST_NET_H
#define TEST_NET_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "zt.h"

static int tnet_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) < 0)
        ZT_SETUP_FAIL("free port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

/* Starts n ranks of this test binary, `self args...` (args: NULL-ended,
 * after argv[0]), started as torchrun starts them (RANK, WORLD_SIZE, ...,
 * MASTER_ADDR 127.0.0.1 and a free MASTER_PORT), with ZINC_COMM_BACKEND
 * `backend`, OMP_NUM_THREADS 1, ZINC_LOG kept (warn by default), and the
 * variables of `extra` ("A=1 B=2", or NULL); each rank dies after alarm_s
 * seconds (a bound on a runaway rank). Their pids into pids[n]. */
static void tnet_spawn_ranks(int n, const char *backend, const char *extra, unsigned alarm_s,
                             const char *const *args, pid_t *pids)
{
    static char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0)
        ZT_SETUP_FAIL("readlink /proc/self/exe: %s", strerror(errno));
    self[sl] = 0;
    int port = tnet_free_port();
    for (int r = 0; r < n; r++) {
        char e[16][96];
        char *envp[17], ex[512];
        int k = 0;
        snprintf(e[k++], 96, "RANK=%d", r);
        snprintf(e[k++], 96, "WORLD_SIZE=%d", n);
        snprintf(e[k++], 96, "LOCAL_RANK=%d", r);
        snprintf(e[k++], 96, "LOCAL_WORLD_SIZE=%d", n);
        snprintf(e[k++], 96, "MASTER_ADDR=127.0.0.1");
        snprintf(e[k++], 96, "MASTER_PORT=%d", port);
        snprintf(e[k++], 96, "ZINC_COMM_BACKEND=%s", backend);
        snprintf(e[k++], 96, "ZINC_LOG=%s", getenv("ZINC_LOG") ? getenv("ZINC_LOG") : "warn");
        snprintf(e[k++], 96, "OMP_NUM_THREADS=1");
        int ne = k;
        for (int i = 0; i < ne; i++)
            envp[i] = e[i];
        snprintf(ex, sizeof ex, "%s", extra ? extra : "");
        for (char *tok = strtok(ex, " "); tok && ne < 16; tok = strtok(NULL, " "))
            envp[ne++] = tok;
        envp[ne] = NULL;
        char *argv[16] = { self };
        for (int a = 0; args[a] && a < 14; a++)
            argv[a + 1] = (char *)args[a];
        pids[r] = fork();
        if (pids[r] < 0)
            ZT_SETUP_FAIL("fork: %s", strerror(errno));
        if (pids[r] == 0) {
            alarm(alarm_s);
            execve(self, argv, envp);
            _exit(99);
        }
    }
}

#endif
