/* TCP backend: host collectives for torchrun-style launches without MPI.
 * Rendezvous at rank 0 (MASTER_ADDR:MASTER_PORT), which keeps a control
 * socket to every rank (the failure protocol's channel); data moves around
 * a ring of sockets (rank r sends to r+1, receives from r-1): ring
 * reduce-scatter + all-gather for all-reduce, a pipelined chain for
 * broadcast. Every wait is a poll() with a deadline; sockets are
 * nonblocking; EINTR and partial transfers are handled everywhere. */
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

#define TCP_SEG_BYTES (4u << 20)   /* ring pipeline segment per chunk */
#define TCP_PROTO 1u

typedef struct zn_tcp {
    int left, right;        /* data sockets of the ring */
    int *ctl;               /* rank 0: ctl[r] for r >= 1; others: ctl[0] */
    uint8_t *ctl_gone;      /* BYE or EOF read on that channel */
    unsigned char *scratch; /* 2 segments */
    size_t scratch_len;
} zn_tcp;

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

static int poll_ms(uint64_t deadline, int cap_ms)
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
static int io_all(int fd, void *buf, size_t len, int wr, uint64_t deadline)
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
        int ms = poll_ms(deadline, 1000);
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
                pr = poll(&p, 1, poll_ms(deadline, 2000));
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

static int accept_until(int lfd, uint64_t deadline, int *out)
{
    for (int guard = 0; guard < 1000000; guard++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            *out = fd;
            return 0;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
            errno != ECONNABORTED)
            return -errno;
        int ms = poll_ms(deadline, 1000);
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

/* ---- control channel -------------------------------------------------------*/
static int ctl_fd(zn_comm *c, int r)
{
    zn_tcp *t = c->host;
    int idx = c->rank == 0 ? r : 0;
    if (idx < 0 || idx >= c->size || t->ctl[idx] < 0 || t->ctl_gone[idx])
        return -1;
    return t->ctl[idx];
}

static int tcp_ctl_send(zn_comm *c, int to, const zn_ctl_msg *m, uint64_t deadline)
{
    int fd = ctl_fd(c, to);
    if (fd < 0)
        return -ENOTCONN;
    return io_all(fd, (void *)m, sizeof *m, 1, deadline);
}

/* Reads the message waiting on channel idx (rank 0: idx = sender; others:
 * 0). 1 = message (BYE marks the channel gone), 2 = closed without BYE. */
static int ctl_read(zn_comm *c, int idx, zn_ctl_msg *m)
{
    zn_tcp *t = c->host;
    int rc = io_all(t->ctl[idx], m, sizeof *m, 0, zn_now_ns() + 2000000000ull);
    int from = c->rank == 0 ? idx : 0;
    if (rc || m->magic != ZN_CTL_MAGIC) {
        t->ctl_gone[idx] = 1;
        return c->departed[from] ? 0 : 2;
    }
    m->rank = from;
    m->text[sizeof m->text - 1] = 0;
    if (m->type == ZN_CTL_BYE)
        t->ctl_gone[idx] = 1;
    return 1;
}

static int tcp_ctl_recv(zn_comm *c, zn_ctl_msg *m, int *closed, uint64_t deadline)
{
    zn_tcp *t = c->host;
    struct pollfd *p = calloc((size_t)c->size, sizeof *p);
    int *who = calloc((size_t)c->size, sizeof *who);
    int rc = -ENOTCONN;
    if (!p || !who) {
        rc = -ENOMEM;
        goto out;
    }
    for (int guard = 0; guard < 100000; guard++) {
        int n = 0;
        for (int i = 0; i < c->size; i++)
            if (t->ctl[i] >= 0 && !t->ctl_gone[i]) {
                p[n].fd = t->ctl[i];
                p[n].events = POLLIN;
                p[n].revents = 0;
                who[n++] = i;
            }
        if (!n) {
            rc = -ENOTCONN;
            goto out;
        }
        int ms = poll_ms(deadline, 1000);
        if (ms == 0) {
            rc = 0;
            goto out;
        }
        int pr = poll(p, (nfds_t)n, ms);
        if (pr < 0 && errno != EINTR) {
            rc = -errno;
            goto out;
        }
        for (int k = 0; pr > 0 && k < n; k++) {
            if (!p[k].revents)
                continue;
            int r = ctl_read(c, who[k], m);
            if (r == 1) {
                rc = 1;
                goto out;
            }
            if (r == 2) {
                *closed = c->rank == 0 ? who[k] : 0;
                rc = 2;
                goto out;
            }
        }
    }
    rc = 0;
out:
    free(p);
    free(who);
    return rc;
}

/* A control channel became readable during a collective. Returns 0 to go
 * on (a BYE), or the failure status. */
static int ctl_event(zn_comm *c, const zn_comm_op *op, int idx)
{
    zn_ctl_msg m;
    int r = ctl_read(c, idx, &m);
    int from = c->rank == 0 ? idx : 0;
    if (r == 0)
        return 0;
    if (r == 2) {
        /* A rank died. Go on: if the collective needs it, the data sockets
         * fail at once and the verdict names it; if its part was already
         * sent (it died right after the collective), this one completes. */
        zn_comm_note_dead(c, from);
        return 0;
    }
    zn_comm_note_msg(c, from, &m);
    if (m.type == ZN_CTL_BYE)
        return 0;
    if (m.type == ZN_CTL_VERDICT)
        return zn_comm_fail(c, op, ZN_FAIL_REMOTE, 0, m.code ? m.code : ZN_ETIMEOUT, "%s",
                            m.text);
    return zn_comm_fail(c, op, ZN_FAIL_REMOTE, from, m.code ? m.code : ZN_ETIMEOUT,
                        "rank %d reported: %.300s", from, m.text);
}

/* ---- data movement ------------------------------------------------------------*/
/* Sends slen bytes to the right neighbour while receiving rlen bytes from
 * the left one, by the deadline; watches the control channels meanwhile. */
static int xfer(zn_comm *c, const zn_comm_op *op, const void *sbuf, size_t slen, void *rbuf,
                size_t rlen, uint64_t deadline)
{
    zn_tcp *t = c->host;
    int left = (c->rank + c->size - 1) % c->size, right = (c->rank + 1) % c->size;
    size_t so = 0, ro = 0;
    struct pollfd stackp[66];
    int stackw[66];
    struct pollfd *p = c->size + 2 <= 66 ? stackp : calloc((size_t)c->size + 2, sizeof *p);
    int *who = c->size + 2 <= 66 ? stackw : calloc((size_t)c->size + 2, sizeof *who);
    int rc = 0;
    uint64_t t0 = zn_now_ns();
    if (!p || !who) {
        rc = zn_set_error(-ENOMEM, "%s: out of memory", op->desc);
        goto out;
    }
    while (so < slen || ro < rlen) {
        int n = 0, is = -1, ir = -1;
        if (so < slen) {
            p[n] = (struct pollfd){ t->right, POLLOUT, 0 };
            is = n++;
        }
        if (ro < rlen) {
            p[n] = (struct pollfd){ t->left, POLLIN, 0 };
            ir = n++;
        }
        int nd = n;
        for (int i = 0; i < c->size; i++)
            if (t->ctl[i] >= 0 && !t->ctl_gone[i]) {
                p[n] = (struct pollfd){ t->ctl[i], POLLIN, 0 };
                who[n++] = i;
            }
        int ms = poll_ms(deadline, 1000);
        if (ms == 0) {
            double waited = (double)(zn_now_ns() - t0) / 1e9;
            if (ro < rlen)
                rc = zn_comm_fail(c, op, ZN_FAIL_TIMEOUT, left, ZN_ETIMEOUT,
                                  "waited %.1f s for data from rank %d (%zu of %zu bytes of "
                                  "this step arrived)", waited, left, ro, rlen);
            else
                rc = zn_comm_fail(c, op, ZN_FAIL_TIMEOUT, right, ZN_ETIMEOUT,
                                  "rank %d took no data for %.1f s (%zu of %zu bytes of this "
                                  "step sent)", right, waited, so, slen);
            goto out;
        }
        int pr = poll(p, (nfds_t)n, ms);
        if (pr < 0) {
            if (errno == EINTR)
                continue;
            rc = zn_comm_fail(c, op, ZN_FAIL_IO, -1, -errno, "poll: %s", strerror(errno));
            goto out;
        }
        if (pr == 0)
            continue;
        if (is >= 0 && p[is].revents) {
            ssize_t w = send(t->right, (const char *)sbuf + so, slen - so,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) {
                so += (size_t)w;
            } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                int e = errno;
                int closed = e == EPIPE || e == ECONNRESET;
                rc = zn_comm_fail(c, op, closed ? ZN_FAIL_CLOSED : ZN_FAIL_IO, right,
                                  closed ? -ECONNRESET : -e, "sending to rank %d: %s", right,
                                  strerror(e));
                goto out;
            }
        }
        if (ir >= 0 && p[ir].revents) {
            ssize_t r = recv(t->left, (char *)rbuf + ro, rlen - ro, MSG_DONTWAIT);
            if (r > 0) {
                ro += (size_t)r;
            } else if (r == 0) {
                rc = zn_comm_fail(c, op, ZN_FAIL_CLOSED, left, -ECONNRESET,
                                  "rank %d closed its connection (%zu of %zu bytes of this "
                                  "step arrived)", left, ro, rlen);
                goto out;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                int e = errno;
                int closed = e == ECONNRESET;
                rc = zn_comm_fail(c, op, closed ? ZN_FAIL_CLOSED : ZN_FAIL_IO, left,
                                  closed ? -ECONNRESET : -e, "receiving from rank %d: %s",
                                  left, strerror(e));
                goto out;
            }
        }
        for (int k = nd; k < n; k++)
            if (p[k].revents && (rc = ctl_event(c, op, who[k])))
                goto out;
    }
out:
    if (p != stackp)
        free(p);
    if (who != stackw)
        free(who);
    return rc;
}

static size_t chunk_off(size_t count, int n, int i)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    return (size_t)i * base + ((size_t)i < rem ? (size_t)i : rem);
}

static size_t chunk_len(size_t count, int n, int i)
{
    return count / (size_t)n + ((size_t)i < count % (size_t)n);
}

/* Ring reduce-scatter: chunk i of `send` (offsets from chunk_off) summed
 * over ranks; the result for chunk `rank` goes to `out`. Pipelined in
 * segments; scratch holds a partial (P) and an incoming segment (R).
 * Chunk c's sum is built in the order c+1, c+2, ..., c (mod n) on every
 * rank: one rank computes it, so all ranks get the same bits. */
static int ring_reduce_scatter(zn_comm *c, const zn_comm_op *op, const unsigned char *send,
                               size_t count, unsigned char *out, uint64_t deadline)
{
    zn_tcp *t = c->host;
    int n = c->size, r = c->rank;
    size_t es = zn_dtype_size(op->dt);
    size_t seg = TCP_SEG_BYTES / es;
    unsigned char *P = t->scratch, *R = t->scratch + TCP_SEG_BYTES;
    size_t maxlen = chunk_len(count, n, 0);
    size_t nseg = maxlen ? (maxlen + seg - 1) / seg : 0;
    for (size_t k = 0; k < nseg; k++) {
        for (int s = 0; s < n - 1; s++) {
            int cs = ((r - s - 1) % n + n) % n, cr = ((r - s - 2) % n + n) % n;
            size_t ls = chunk_len(count, n, cs), lr = chunk_len(count, n, cr);
            size_t a = k * seg;
            size_t sl = ls > a ? (ls - a < seg ? ls - a : seg) : 0;
            size_t rl = lr > a ? (lr - a < seg ? lr - a : seg) : 0;
            const unsigned char *sp = s == 0 ? send + (chunk_off(count, n, cs) + a) * es : P;
            int rc = xfer(c, op, sp, sl * es, R, rl * es, deadline);
            if (rc)
                return rc;
            const unsigned char *mine = send + (chunk_off(count, n, cr) + a) * es;
            unsigned char *dst = s == n - 2 ? out + a * es : P;
            zn_comm_reduce(dst, R, mine, rl, op->dt, op->red);
        }
    }
    return 0;
}

/* Ring all-gather of chunks laid out by (off, len) in buf, which already
 * holds this rank's chunk. */
static int ring_allgather(zn_comm *c, const zn_comm_op *op, unsigned char *buf, size_t count,
                          size_t es, int even, uint64_t deadline)
{
    int n = c->size, r = c->rank;
    for (int s = 0; s < n - 1; s++) {
        int cs = ((r - s) % n + n) % n, cr = ((r - s - 1) % n + n) % n;
        size_t os = even ? (size_t)cs * count : chunk_off(count, n, cs);
        size_t ls = even ? count : chunk_len(count, n, cs);
        size_t orr = even ? (size_t)cr * count : chunk_off(count, n, cr);
        size_t lr = even ? count : chunk_len(count, n, cr);
        int rc = xfer(c, op, buf + os * es, ls * es, buf + orr * es, lr * es, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

static int ring_broadcast(zn_comm *c, const zn_comm_op *op, unsigned char *buf, size_t bytes,
                          int root, uint64_t deadline)
{
    int n = c->size;
    int pos = (c->rank - root + n) % n;
    size_t seg = TCP_SEG_BYTES;
    long nseg = bytes ? (long)((bytes + seg - 1) / seg) : 0;
    /* Position p receives segment j at step j + p - 1 and forwards it at
     * step j + p, so consecutive ranks overlap. */
    for (long step = 0; step < nseg + n - 2 && nseg; step++) {
        long rj = pos > 0 ? step - (pos - 1) : -1;
        long sj = pos < n - 1 ? step - pos : -1;
        size_t rl = 0, sl = 0;
        unsigned char *rp = NULL, *sp = NULL;
        if (rj >= 0 && rj < nseg) {
            rp = buf + (size_t)rj * seg;
            rl = bytes - (size_t)rj * seg < seg ? bytes - (size_t)rj * seg : seg;
        }
        if (sj >= 0 && sj < nseg) {
            sp = buf + (size_t)sj * seg;
            sl = bytes - (size_t)sj * seg < seg ? bytes - (size_t)sj * seg : seg;
        }
        if (!rl && !sl)
            continue;
        int rc = xfer(c, op, sp, sl, rp, rl, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

static int tcp_run_op(zn_comm *c, zn_comm_op *op, uint64_t deadline);

/* After a failure the ring is shut down, so that the neighbours fail at
 * once instead of at their deadline, and theirs in turn (a rank whose
 * neighbour died or whose rank 0 died must not wait for the timeout). */
static int tcp_run(zn_comm *c, zn_comm_op *op, uint64_t deadline)
{
    int rc = tcp_run_op(c, op, deadline);
    zn_tcp *t = c->host;
    if (rc) {
        if (t->left >= 0)
            shutdown(t->left, SHUT_RDWR);
        if (t->right >= 0)
            shutdown(t->right, SHUT_RDWR);
    }
    return rc;
}

static int tcp_run_op(zn_comm *c, zn_comm_op *op, uint64_t deadline)
{
    size_t es = zn_dtype_size(op->dt);
    unsigned char *recv = op->recv;
    const unsigned char *send = op->send;
    switch (op->kind) {
    case ZN_COP_ALLREDUCE: {
        /* Reduce-scatter into recv's own chunk, then all-gather in place.
         * In place (send == recv) works: the chunk of this rank is read
         * only at the step that writes it. */
        size_t off = chunk_off(op->count, c->size, c->rank);
        int rc = ring_reduce_scatter(c, op, send, op->count, recv + off * es, deadline);
        if (rc)
            return rc;
        return ring_allgather(c, op, recv, op->count, es, 0, deadline);
    }
    case ZN_COP_REDUCE_SCATTER:
        return ring_reduce_scatter(c, op, send, op->count * (size_t)c->size, recv, deadline);
    case ZN_COP_ALLGATHER: {
        unsigned char *mine = recv + (size_t)c->rank * op->count * es;
        if (mine != send && op->count)
            memmove(mine, send, op->count * es);
        return ring_allgather(c, op, recv, op->count, es, 1, deadline);
    }
    case ZN_COP_BROADCAST:
        return ring_broadcast(c, op, recv, op->count, op->root, deadline);
    case ZN_COP_BARRIER: {
        /* All-gather of one byte: a rank leaves after hearing (through the
         * ring) from every other rank. */
        unsigned char *b = calloc((size_t)c->size, 1);
        if (!b)
            return zn_set_error(-ENOMEM, "%s: out of memory", op->desc);
        b[c->rank] = 1;
        int rc = ring_allgather(c, op, b, 1, 1, 1, deadline);
        free(b);
        return rc;
    }
    case ZN_COP_RING:
        return xfer(c, op, send, op->count, recv, op->count, deadline);
    }
    return zn_set_error(ZN_EINTERNAL, "comm/tcp: unknown op %d", (int)op->kind);
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
                (void)tcp_ctl_send(c, r, &m, dl);
    }
    tcp_close_all(t, c->size, 0);
    free(t->ctl);
    free(t->ctl_gone);
    free(t->scratch);
    free(t);
    c->host = NULL;
}

static void tcp_abort(zn_comm *c, int code)
{
    (void)code;
    zn_tcp *t = c->host;
    if (t)
        tcp_close_all(t, c->size, 1);   /* shutdown: safe while the worker polls */
}

static const zn_comm_host_ops tcp_ops = {
    .name = "tcp",
    .destroy = tcp_destroy,
    .run = tcp_run,
    .abort = tcp_abort,
    .ctl_send = tcp_ctl_send,
    .ctl_recv = tcp_ctl_recv,
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
        int fd;
        rc = accept_until(lfd, deadline, &fd);
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
        tcp_hello h;
        uint64_t hd = zn_now_ns() + 5000000000ull;
        if (io_all(fd, &h, sizeof h, 0, hd < deadline ? hd : deadline) ||
            h.magic != ZN_CTL_MAGIC || h.version != TCP_PROTO) {
            zn_warn("comm/tcp: dropped a connection to MASTER_PORT %d that is not a zinc rank",
                    c->li.master_port);
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
        if ((rc = io_all(t->ctl[r], table, sizeof *table * (size_t)c->size, 1, deadline))) {
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
    char who[64];
    snprintf(who, sizeof who, "rank 0 (MASTER_ADDR)");
    if ((rc = connect_retry(c->li.master_addr, c->li.master_port, deadline, who, &fd)))
        return rc;
    t->ctl[0] = fd;
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
    if ((rc = io_all(fd, &h, sizeof h, 1, deadline)))
        return zn_set_error(rc, "comm/tcp: sending hello to rank 0: %s", zn_strerror(rc));
    if ((rc = io_all(fd, table, sizeof *table * (size_t)c->size, 0, deadline)))
        return zn_set_error(rc, "comm/tcp: waiting for rank 0's address table: %s%s",
                            zn_strerror(rc), rc == -ECONNRESET ? " (rank 0 closed the "
                            "connection: see its error)" : "");
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
    t->scratch = malloc(2 * (size_t)TCP_SEG_BYTES);
    if (!table || !t->ctl || !t->ctl_gone || !t->scratch) {
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

    int right = (c->rank + 1) % c->size, left = (c->rank + c->size - 1) % c->size;
    const char *rhost = table[right].host[0] && right != 0 ? table[right].host
                                                           : c->li.master_addr;
    char who[32];
    snprintf(who, sizeof who, "rank %d", right);
    if ((rc = connect_retry(rhost, table[right].port, deadline, who, &t->right)))
        goto out;
    tcp_ring_hello rh = { ZN_CTL_MAGIC, c->rank };
    if ((rc = io_all(t->right, &rh, sizeof rh, 1, deadline))) {
        rc = zn_set_error(rc, "comm/tcp: hello to rank %d: %s", right, zn_strerror(rc));
        goto out;
    }
    for (int guard = 0; t->left < 0 && guard < 1000; guard++) {
        int fd;
        if ((rc = accept_until(data_lfd, deadline, &fd))) {
            rc = zn_set_error(rc, "comm/tcp: waiting for rank %d to connect: %s", left,
                              zn_strerror(rc));
            goto out;
        }
        tcp_ring_hello in;
        if (io_all(fd, &in, sizeof in, 0, deadline) || in.magic != ZN_CTL_MAGIC ||
            in.rank != left) {
            close(fd);
            continue;
        }
        t->left = fd;
    }
    if (t->left < 0) {
        rc = zn_set_error(ZN_ETIMEOUT, "comm/tcp: rank %d never connected", left);
        goto out;
    }
    tune(t->left);
    tune(t->right);
    if ((rc = set_nonblock(t->left)) || (rc = set_nonblock(t->right)))
        goto out;

    /* Everyone connected: confirm with a barrier over the ring. */
    zn_comm_op op;
    memset(&op, 0, sizeof op);
    op.kind = ZN_COP_BARRIER;
    snprintf(op.desc, sizeof op.desc, "rendezvous barrier");
    rc = tcp_run(c, &op, deadline);
out:
    if (data_lfd >= 0)
        close(data_lfd);
    free(table);
    return rc;
}
