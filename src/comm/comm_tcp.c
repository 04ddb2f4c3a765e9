/* TCP backend: host collectives for torchrun-style launches without MPI.
 * This file holds its connections: socket helpers with deadlines, the
 * rendezvous at rank 0 (MASTER_ADDR:MASTER_PORT), which keeps a control
 * socket to every rank (the failure protocol's channel), the ring of data
 * sockets, goodbye and close; with ZINC_JOB_SECRET each connection first
 * passes the job-secret handshake (comm_tcp_auth.c). Every wait is a
 * poll() with a deadline; sockets are nonblocking; EINTR and partial
 * transfers are handled. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm-impl.h"

#define TCP_PROTO 1u

typedef struct {
    uint32_t magic, version;
    int32_t rank, world, data_port, pad;
} tcp_hello;

typedef struct {
    char host[64];          /* numeric address; "" = MASTER_ADDR */
    int32_t port, pad;
} tcp_entry;

typedef struct {
    uint32_t magic;
    int32_t rank;
} tcp_ring_hello;

int zn_comm_tcp_poll_ms(uint64_t deadline, int cap_ms)
{
    uint64_t now = zn_now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > (uint64_t)cap_ms ? cap_ms : (int)ms;
}

static void sleep_until_at_most(uint64_t deadline, long ns)
{
    uint64_t now = zn_now_ns();
    if (now >= deadline)
        return;
    if ((uint64_t)ns > deadline - now)
        ns = (long)(deadline - now);
    struct timespec ts = { ns / 1000000000L, ns % 1000000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -errno;
    return 0;
}

static void tune(int fd)
{
    int one = 1;
    /* Failures here only cost speed or liveness probes: not fatal. */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        zn_debug("comm/tcp: TCP_NODELAY: %s", strerror(errno));
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) < 0)
        zn_debug("comm/tcp: SO_KEEPALIVE: %s", strerror(errno));
}

/* Moves exactly len bytes by the deadline. Returns 0, ZN_ETIMEOUT,
 * -ECONNRESET (EOF), or -errno. */
int zn_comm_tcp_io_all(int fd, void *buf, size_t len, int wr, uint64_t deadline)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = wr ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                       : recv(fd, (char *)buf + done, len - done, MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0 && !wr)
            return -ECONNRESET;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -errno;
        int ms = zn_comm_tcp_poll_ms(deadline, 1000);
        if (ms == 0)
            return ZN_ETIMEOUT;
        struct pollfd p = { fd, (short)(wr ? POLLOUT : POLLIN), 0 };
        if (poll(&p, 1, ms) < 0 && errno != EINTR)
            return -errno;
    }
    return 0;
}

static int resolve(const char *host, int port, int passive, struct addrinfo **res)
{
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int e = getaddrinfo(host, ps, &hints, res);
    if (e)
        return zn_set_error(ZN_ECONFIG, "comm/tcp: cannot resolve \"%s\": %s", host,
                            gai_strerror(e));
    return 0;
}

/* Connects to host:port, retrying refused connections (the peer may not
 * listen yet) until the deadline. */
static int connect_retry(const char *host, int port, uint64_t deadline, const char *who,
                         int *out)
{
    struct addrinfo *res;
    int rc = resolve(host, port, 0, &res);
    if (rc)
        return rc;
    int last = ETIMEDOUT;
    long backoff = 20000000;
    for (int attempt = 0; zn_now_ns() < deadline && attempt < 100000; attempt++) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                            ai->ai_protocol);
            if (fd < 0) {
                last = errno;
                continue;
            }
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
                *out = fd;
                freeaddrinfo(res);
                return 0;
            }
            if (errno != EINPROGRESS) {
                last = errno;
                close(fd);
                continue;
            }
            struct pollfd p = { fd, POLLOUT, 0 };
            int pr;
            do
                pr = poll(&p, 1, zn_comm_tcp_poll_ms(deadline, 2000));
            while (pr < 0 && errno == EINTR);
            int err = 0;
            socklen_t el = sizeof err;
            if (pr > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0) {
                *out = fd;
                freeaddrinfo(res);
                return 0;
            }
            last = pr == 0 ? ETIMEDOUT : (err ? err : errno);
            close(fd);
        }
        sleep_until_at_most(deadline, backoff);
        if (backoff < 500000000)
            backoff *= 2;
    }
    freeaddrinfo(res);
    return zn_set_error(ZN_ETIMEOUT, "comm/tcp: connecting to %s at %s:%d: %s (gave up at the "
                        "deadline)", who, host, port, strerror(last));
}

static int listen_on(const struct sockaddr *sa, socklen_t len, int reuse, int *out, int *port)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return zn_set_error(-errno, "comm/tcp: socket: %s", strerror(errno));
    int one = 1;
    if (reuse && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0) {
        int e = errno;
        close(fd);
        return zn_set_error(-e, "comm/tcp: SO_REUSEADDR: %s", strerror(e));
    }
    if (bind(fd, sa, len) < 0 || listen(fd, 128) < 0) {
        int e = errno;
        close(fd);
        return zn_set_error(-e, "comm/tcp: bind/listen: %s", strerror(e));
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        int e = errno;
        close(fd);
        return zn_set_error(-e, "comm/tcp: getsockname: %s", strerror(e));
    }
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
    *out = fd;
    return 0;
}

static void numeric_host(const struct sockaddr_storage *ss, socklen_t len, char *buf,
                         size_t blen);

/* Accepts one connection by the deadline; its numeric address in peer. */
static int accept_until(int lfd, uint64_t deadline, int *out, char *peer, size_t plen)
{
    for (int guard = 0; guard < 1000000; guard++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            numeric_host(&ss, sl, peer, plen);
            *out = fd;
            return 0;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
            errno != ECONNABORTED)
            return -errno;
        int ms = zn_comm_tcp_poll_ms(deadline, 1000);
        if (ms == 0)
            return ZN_ETIMEOUT;
        struct pollfd p = { lfd, POLLIN, 0 };
        if (poll(&p, 1, ms) < 0 && errno != EINTR)
            return -errno;
    }
    return ZN_ETIMEOUT;
}

static void numeric_host(const struct sockaddr_storage *ss, socklen_t len, char *buf,
                         size_t blen)
{
    if (getnameinfo((const struct sockaddr *)ss, len, buf, (socklen_t)blen, NULL, 0,
                    NI_NUMERICHOST))
        snprintf(buf, blen, "?");
}

/* ---- lifetime ---------------------------------------------------------------------*/
static void tcp_close_all(zn_tcp *t, int n, int how_shutdown)
{
    int *fds[2] = { &t->left, &t->right };
    for (int i = 0; i < 2; i++)
        if (*fds[i] >= 0) {
            if (how_shutdown)
                shutdown(*fds[i], SHUT_RDWR);
            else {
                close(*fds[i]);
                *fds[i] = -1;
            }
        }
    for (int i = 0; t->ctl && i < n; i++)
        if (t->ctl[i] >= 0) {
            if (how_shutdown)
                shutdown(t->ctl[i], SHUT_RDWR);
            else {
                close(t->ctl[i]);
                t->ctl[i] = -1;
            }
        }
}

static void tcp_destroy(zn_comm *c, int healthy)
{
    zn_tcp *t = c->host;
    if (!t)
        return;
    if (healthy && t->ctl) {
        /* Say goodbye so that the peers do not take the closing sockets for
         * a death. */
        zn_ctl_msg m;
        memset(&m, 0, sizeof m);
        m.magic = ZN_CTL_MAGIC;
        m.type = ZN_CTL_BYE;
        m.rank = c->rank;
        uint64_t dl = zn_now_ns() + 500000000ull;
        for (int r = 0; r < c->size; r++)
            if (r != c->rank && (c->rank == 0 || r == 0))
                (void)zn_comm_tcp_ctl_send(c, r, &m, dl);
    }
    tcp_close_all(t, c->size, 0);
    zn_comm_tcp_auth_clear(&t->auth);
    free(t->addr);
    free(t->ctl);
    free(t->ctl_gone);
    free(t->scratch);
    free(t);
    c->host = NULL;
}

static int tcp_abort(zn_comm *c, int code)
{
    (void)code;
    zn_tcp *t = c->host;
    if (t)
        tcp_close_all(t, c->size, 1);   /* shutdown: safe while the worker polls */
    return 0;
}

static const char *tcp_peer_addr(zn_comm *c, int r)
{
    zn_tcp *t = c->host;
    return t && t->addr && r >= 0 && r < c->size && t->addr[r][0] ? t->addr[r] : NULL;
}

static const zn_comm_host_ops tcp_ops = {
    .name = "tcp",
    .peer_addr = tcp_peer_addr,
    .destroy = tcp_destroy,
    .run = zn_comm_tcp_run,
    .abort = tcp_abort,
    .ctl_send = zn_comm_tcp_ctl_send,
    .ctl_recv = zn_comm_tcp_ctl_recv,
};

/* ---- rendezvous ---------------------------------------------------------------------*/
static int rendezvous_master(zn_comm *c, zn_tcp *t, uint64_t deadline, int *data_lfd,
                             tcp_entry *table)
{
    const char *maddr = c->li.master_addr;
    struct addrinfo *res = NULL;
    int lfd = -1, rc, port;
    if ((rc = resolve(maddr, c->li.master_port, 0, &res)))
        return rc;
    struct sockaddr_storage any;
    socklen_t alen;
    memset(&any, 0, sizeof any);
    if (res->ai_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&any;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        alen = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&any;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        alen = sizeof *a;
    }
    freeaddrinfo(res);
    if ((rc = listen_on((struct sockaddr *)&any, alen, 0, data_lfd, &port)))
        return zn_error_prefix(rc, "data listener");
    table[0].port = port;
    if (any.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&any)->sin6_port = htons((uint16_t)c->li.master_port);
    else
        ((struct sockaddr_in *)&any)->sin_port = htons((uint16_t)c->li.master_port);
    if ((rc = listen_on((struct sockaddr *)&any, alen, 1, &lfd, &port)))
        return zn_error_prefix(rc, "rank 0 cannot listen on MASTER_PORT %d",
                               c->li.master_port);
    int joined = 1;
    for (int guard = 0; joined < c->size && guard < 100000; guard++) {
        int fd, arank = -1;
        char peer_host[64];
        rc = accept_until(lfd, deadline, &fd, peer_host, sizeof peer_host);
        if (rc == ZN_ETIMEOUT) {
            char missing[256];
            size_t o = 0;
            missing[0] = 0;
            for (int r = 1; r < c->size && o + 12 < sizeof missing; r++)
                if (t->ctl[r] < 0)
                    o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%d",
                                          o ? ", " : "", r);
            rc = zn_set_error(ZN_ETIMEOUT, "comm/tcp: rendezvous on port %d: %d of %d ranks "
                              "did not connect within %.1f s (missing: %s)",
                              c->li.master_port, c->size - joined, c->size,
                              c->connect_timeout_s, missing);
            goto out;
        }
        if (rc) {
            rc = zn_set_error(rc, "comm/tcp: accept: %s", strerror(-rc));
            goto out;
        }
        if (t->auth.on) {
            char why[256];
            if (zn_comm_tcp_auth_accept(&t->auth, fd, ZN_TCP_CH_RENDEZVOUS, 0, c->size, -1,
                                        deadline, &arank, why, sizeof why)) {
                zn_warn("comm/tcp: refused a connection from %s to MASTER_PORT %d: %s",
                        peer_host, c->li.master_port, why);
                close(fd);
                continue;
            }
        }
        tcp_hello h;
        uint64_t hd = zn_now_ns() + 5000000000ull;
        if (zn_comm_tcp_io_all(fd, &h, sizeof h, 0, hd < deadline ? hd : deadline) ||
            h.magic != ZN_CTL_MAGIC || h.version != TCP_PROTO) {
            zn_warn("comm/tcp: dropped a connection from %s to MASTER_PORT %d that is not a "
                    "zinc rank", peer_host, c->li.master_port);
            close(fd);
            continue;
        }
        if (t->auth.on && h.rank != arank) {
            zn_warn("comm/tcp: refused a connection from %s to MASTER_PORT %d: it proved rank "
                    "%d but says RANK=%d", peer_host, c->li.master_port, arank, h.rank);
            close(fd);
            continue;
        }
        if (h.world != c->size || h.rank <= 0 || h.rank >= c->size || t->ctl[h.rank] >= 0) {
            close(fd);
            rc = zn_set_error(ZN_ECONFIG, "comm/tcp: a process says RANK=%d WORLD_SIZE=%d, "
                              "but rank 0 has WORLD_SIZE=%d%s", h.rank, h.world, c->size,
                              h.rank > 0 && h.rank < c->size && t->ctl[h.rank] >= 0
                                  ? " and that rank has already joined" : "");
            goto out;
        }
        struct sockaddr_storage peer;
        socklen_t pl = sizeof peer;
        if (getpeername(fd, (struct sockaddr *)&peer, &pl) < 0) {
            rc = zn_set_error(-errno, "comm/tcp: getpeername: %s", strerror(errno));
            close(fd);
            goto out;
        }
        numeric_host(&peer, pl, table[h.rank].host, sizeof table[h.rank].host);
        table[h.rank].port = h.data_port;
        t->ctl[h.rank] = fd;
        joined++;
    }
    for (int r = 1; r < c->size; r++)
        if ((rc = zn_comm_tcp_io_all(t->ctl[r], table, sizeof *table * (size_t)c->size, 1, deadline))) {
            rc = zn_set_error(rc, "comm/tcp: sending the address table to rank %d: %s", r,
                              zn_strerror(rc));
            goto out;
        }
    rc = 0;
out:
    if (lfd >= 0)
        close(lfd);
    return rc;
}

static int rendezvous_worker(zn_comm *c, zn_tcp *t, uint64_t deadline, int *data_lfd,
                             tcp_entry *table)
{
    int rc, fd, port;
    char who[96];
    snprintf(who, sizeof who, "rank 0 (MASTER_ADDR)");
    if ((rc = connect_retry(c->li.master_addr, c->li.master_port, deadline, who, &fd)))
        return rc;
    t->ctl[0] = fd;
    snprintf(who, sizeof who, "rank 0 at %.64s:%d", c->li.master_addr, c->li.master_port);
    if (t->auth.on && (rc = zn_comm_tcp_auth_connect(&t->auth, fd, ZN_TCP_CH_RENDEZVOUS,
                                                    c->rank, c->size, 0, deadline, who)))
        return rc;
    struct sockaddr_storage me;
    socklen_t ml = sizeof me;
    if (getsockname(fd, (struct sockaddr *)&me, &ml) < 0)
        return zn_set_error(-errno, "comm/tcp: getsockname: %s", strerror(errno));
    if (me.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&me)->sin6_port = 0;
    else
        ((struct sockaddr_in *)&me)->sin_port = 0;
    if ((rc = listen_on((struct sockaddr *)&me, ml, 0, data_lfd, &port)))
        return zn_error_prefix(rc, "data listener");
    tcp_hello h = { ZN_CTL_MAGIC, TCP_PROTO, c->rank, c->size, port, 0 };
    if ((rc = zn_comm_tcp_io_all(fd, &h, sizeof h, 1, deadline)))
        return zn_set_error(rc, "comm/tcp: sending hello to rank 0: %s", zn_strerror(rc));
    if ((rc = zn_comm_tcp_io_all(fd, table, sizeof *table * (size_t)c->size, 0, deadline)))
        return zn_set_error(rc, "comm/tcp: waiting for rank 0's address table: %s%s",
                            zn_strerror(rc), rc == -ECONNRESET ? " (rank 0 closed the "
                            "connection: see its error)" : "");
    return 0;
}

/* ---- the ring ------------------------------------------------------------------------*/
static int ring_connect_right(zn_comm *c, zn_tcp *t, const tcp_entry *table, uint64_t deadline)
{
    int right = (c->rank + 1) % c->size, rc;
    const char *rhost = t->addr[right];
    char who[96];
    snprintf(who, sizeof who, "rank %d", right);
    if ((rc = connect_retry(rhost, table[right].port, deadline, who, &t->right)))
        return rc;
    snprintf(who, sizeof who, "rank %d at %s:%d", right, rhost, table[right].port);
    if (t->auth.on && (rc = zn_comm_tcp_auth_connect(&t->auth, t->right, ZN_TCP_CH_RING,
                                                    c->rank, c->size, right, deadline, who)))
        return rc;
    tcp_ring_hello rh = { ZN_CTL_MAGIC, c->rank };
    if ((rc = zn_comm_tcp_io_all(t->right, &rh, sizeof rh, 1, deadline)))
        return zn_set_error(rc, "comm/tcp: hello to rank %d: %s", right, zn_strerror(rc));
    return 0;
}

static int ring_accept_left(zn_comm *c, zn_tcp *t, int data_lfd, uint64_t deadline)
{
    int left = (c->rank + c->size - 1) % c->size, rc;
    for (int guard = 0; t->left < 0 && guard < 1000; guard++) {
        int fd, arank;
        char peer_host[64], why[256];
        if ((rc = accept_until(data_lfd, deadline, &fd, peer_host, sizeof peer_host)))
            return zn_set_error(rc, "comm/tcp: waiting for rank %d (%s) to connect: %s", left,
                                t->addr[left], zn_strerror(rc));
        if (t->auth.on && zn_comm_tcp_auth_accept(&t->auth, fd, ZN_TCP_CH_RING, c->rank, c->size,
                                                  left, deadline, &arank, why, sizeof why)) {
            zn_warn("comm/tcp: refused a connection from %s to rank %d's ring port: %s",
                    peer_host, c->rank, why);
            close(fd);
            continue;
        }
        tcp_ring_hello in;
        if (zn_comm_tcp_io_all(fd, &in, sizeof in, 0, deadline) || in.magic != ZN_CTL_MAGIC ||
            in.rank != left) {
            close(fd);
            continue;
        }
        t->left = fd;
    }
    if (t->left < 0)
        return zn_set_error(ZN_ETIMEOUT, "comm/tcp: rank %d (%s) never connected", left,
                            t->addr[left]);
    return 0;
}

int zn_comm_tcp_create(zn_comm *c)
{
    zn_tcp *t = calloc(1, sizeof *t);
    if (!t)
        return zn_set_error(-ENOMEM, "comm/tcp: out of memory");
    t->left = t->right = -1;
    c->host = t;
    c->ops = &tcp_ops;
    snprintf(c->version, sizeof c->version, "zinc tcp ring (protocol %u)", TCP_PROTO);
    if (c->size == 1)
        return 0;
    if (!c->li.master_addr[0] || !c->li.master_port)
        return zn_set_error(ZN_ECONFIG, "comm/tcp: world size %d needs MASTER_ADDR and "
                            "MASTER_PORT", c->size);
    int rc, data_lfd = -1;
    tcp_entry *table = calloc((size_t)c->size, sizeof *table);
    t->ctl = malloc(sizeof *t->ctl * (size_t)c->size);
    t->ctl_gone = calloc((size_t)c->size, 1);
    t->scratch = malloc(2 * (size_t)ZN_TCP_SEG_BYTES);
    t->addr = calloc((size_t)c->size, sizeof *t->addr);
    if ((rc = zn_comm_tcp_auth_init(&t->auth)))
        goto out;
    if (!table || !t->ctl || !t->ctl_gone || !t->scratch || !t->addr) {
        rc = zn_set_error(-ENOMEM, "comm/tcp: out of memory");
        goto out;
    }
    for (int i = 0; i < c->size; i++)
        t->ctl[i] = -1;
    uint64_t deadline = zn_now_ns() + (uint64_t)(c->connect_timeout_s * 1e9);
    rc = c->rank == 0 ? rendezvous_master(c, t, deadline, &data_lfd, table)
                      : rendezvous_worker(c, t, deadline, &data_lfd, table);
    if (rc)
        goto out;

    for (int r = 0; r < c->size; r++)
        snprintf(t->addr[r], sizeof t->addr[r], "%.63s",
                 table[r].host[0] && r != 0 ? table[r].host : c->li.master_addr);
    /* Without the secret: connect right (the hello only fills a socket
     * buffer), then accept left. With it every connection is a
     * handshake that needs both ends at once, and the same order would
     * wait around the ring forever; odd ranks connect first and even
     * ones accept first, so some pair always completes (rank 0 and an
     * odd-sized ring's last rank are both even: the last waits for its
     * left neighbour, which is odd and connects first). */
    int accept_first = t->auth.on && c->rank % 2 == 0;
    if (accept_first && (rc = ring_accept_left(c, t, data_lfd, deadline)))
        goto out;
    if ((rc = ring_connect_right(c, t, table, deadline)))
        goto out;
    if (!accept_first && (rc = ring_accept_left(c, t, data_lfd, deadline)))
        goto out;
    tune(t->left);
    tune(t->right);
    if ((rc = set_nonblock(t->left)) || (rc = set_nonblock(t->right)))
        goto out;

    /* Everyone connected: confirm with a barrier over the ring. */
    zn_comm_op op;
    memset(&op, 0, sizeof op);
    op.kind = ZN_COP_BARRIER;
    snprintf(op.desc, sizeof op.desc, "rendezvous barrier");
    rc = zn_comm_tcp_run(c, &op, deadline);
out:
    if (data_lfd >= 0)
        close(data_lfd);
    free(table);
    return rc;
}
