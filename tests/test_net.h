/* A free TCP port on 127.0.0.1 for tests that start ranks (the kernel picks
 * it; a race with another process taking it first is possible but rare). */
#ifndef TEST_NET_H
#define TEST_NET_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
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

#endif
