/* TCP backend, the collectives: data moves around a ring of sockets (rank r
 * sends to r+1, receives from r-1): ring reduce-scatter + all-gather for
 * all-reduce, a pipelined chain for broadcast; the control channels are
 * watched meanwhile and carry the failure protocol's messages. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "comm/comm-impl.h"

/* ---- control channel -------------------------------------------------------*/
static int ctl_fd(zn_comm *c, int r)
{
    zn_tcp *t = c->host;
    int idx = c->rank == 0 ? r : 0;
    if (idx < 0 || idx >= c->size || t->ctl[idx] < 0 || t->ctl_gone[idx])
        return -1;
    return t->ctl[idx];
}

int zn_comm_tcp_ctl_send(zn_comm *c, int to, const zn_ctl_msg *m, uint64_t deadline)
{
    int fd = ctl_fd(c, to);
    if (fd < 0)
        return -ENOTCONN;
    return zn_comm_tcp_io_all(fd, (void *)m, sizeof *m, 1, deadline);
}

/* Reads the message waiting on channel idx (rank 0: idx = sender; others:
 * 0). 1 = message (BYE marks the channel gone), 2 = closed without BYE. */
static int ctl_read(zn_comm *c, int idx, zn_ctl_msg *m)
{
    zn_tcp *t = c->host;
    int rc = zn_comm_tcp_io_all(t->ctl[idx], m, sizeof *m, 0, zn_now_ns() + 2000000000ull);
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

int zn_comm_tcp_ctl_recv(zn_comm *c, zn_ctl_msg *m, int *closed, uint64_t deadline)
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
        int ms = zn_comm_tcp_poll_ms(deadline, 1000);
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
    char who[96];
    return zn_comm_fail(c, op, ZN_FAIL_REMOTE, from, m.code ? m.code : ZN_ETIMEOUT,
                        "%s reported: %.300s", zn_comm_peer_name(c, from, who, sizeof who),
                        m.text);
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
    char lname[96], rname[96];
    zn_comm_peer_name(c, left, lname, sizeof lname);
    zn_comm_peer_name(c, right, rname, sizeof rname);
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
        int ms = zn_comm_tcp_poll_ms(deadline, 1000);
        if (ms == 0) {
            double waited = (double)(zn_now_ns() - t0) / 1e9;
            if (ro < rlen)
                rc = zn_comm_fail(c, op, ZN_FAIL_TIMEOUT, left, ZN_ETIMEOUT,
                                  "waited %.1f s (ZINC_COMM_TIMEOUT) for data from %s (%zu of "
                                  "%zu bytes of this step arrived)", waited, lname, ro, rlen);
            else
                rc = zn_comm_fail(c, op, ZN_FAIL_TIMEOUT, right, ZN_ETIMEOUT,
                                  "%s took no data for %.1f s (ZINC_COMM_TIMEOUT; %zu of %zu "
                                  "bytes of this step sent)", rname, waited, so, slen);
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
                                  closed ? -ECONNRESET : -e, "sending to %s: %s", rname,
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
                                  "%s closed its connection (%zu of %zu bytes of this "
                                  "step arrived)", lname, ro, rlen);
                goto out;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                int e = errno;
                int closed = e == ECONNRESET;
                rc = zn_comm_fail(c, op, closed ? ZN_FAIL_CLOSED : ZN_FAIL_IO, left,
                                  closed ? -ECONNRESET : -e, "receiving from %s: %s",
                                  lname, strerror(e));
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
    size_t seg = ZN_TCP_SEG_BYTES / es;
    unsigned char *P = t->scratch, *R = t->scratch + ZN_TCP_SEG_BYTES;
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
    size_t seg = ZN_TCP_SEG_BYTES;
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
int zn_comm_tcp_run(zn_comm *c, zn_comm_op *op, uint64_t deadline)
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
    case ZN_COP_LINK: {
        /* the sender's right socket is the receiver's left one */
        int to = (op->root + 1) % c->size;
        return xfer(c, op, send, c->rank == op->root ? op->count : 0, recv,
                    c->rank == to ? op->count : 0, deadline);
    }
    }
    return zn_set_error(ZN_EINTERNAL, "comm/tcp: unknown op %d", (int)op->kind);
}
