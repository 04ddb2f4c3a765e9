/* The failure protocol: turns a stuck or dead rank into one error on every
 * rank naming that rank and the operation. Rank 0 gathers the reports and
 * sends a verdict; the other ranks report and wait for it. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm-impl.h"

/* ---- failure state ------------------------------------------------------------*/
int zn_comm_check_broken(zn_comm *c)
{
    pthread_mutex_lock(&c->lock);
    int code = c->broken;
    char msg[sizeof c->broken_msg];
    if (code)
        memcpy(msg, c->broken_msg, sizeof msg);
    pthread_mutex_unlock(&c->lock);
    if (!code)
        return 0;
    return zn_set_error(code, "%s", msg);
}

void zn_comm_note_msg(zn_comm *c, int from, const zn_ctl_msg *m)
{
    if (from < 0 || from >= c->size || m->magic != ZN_CTL_MAGIC)
        return;
    if (m->type == ZN_CTL_REPORT && c->reports)
        c->reports[from] = *m;
    else if (m->type == ZN_CTL_BYE && c->departed)
        c->departed[from] = 1;
    else if (m->type == ZN_CTL_VERDICT && from == 0) {
        c->verdict = *m;
        c->verdict.text[sizeof c->verdict.text - 1] = 0;
        c->have_verdict = 1;
    }
}

void zn_comm_note_dead(zn_comm *c, int from)
{
    if (from >= 0 && from < c->size && c->dead)
        c->dead[from] = 1;
}

const char *zn_comm_peer_name(zn_comm *c, int r, char *buf, size_t len)
{
    const char *a = c->ops && c->ops->peer_addr ? c->ops->peer_addr(c, r) : NULL;
    if (a)
        snprintf(buf, len, "rank %d (%s)", r, a);
    else
        snprintf(buf, len, "rank %d", r);
    return buf;
}

/* "1 (10.0.0.2), 3 (10.0.0.4)": the ranks with their addresses where known */
static void list_ranks(zn_comm *c, char *buf, size_t len, const int *ranks, int n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && o + 90 < len; i++) {
        const char *a = c->ops->peer_addr ? c->ops->peer_addr(c, ranks[i]) : NULL;
        o += (size_t)snprintf(buf + o, len - o, "%s%d", i ? ", " : "", ranks[i]);
        if (a)
            o += (size_t)snprintf(buf + o, len - o, " (%s)", a);
    }
    if (n && o + 90 >= len)
        snprintf(buf + o, len - o, ", ...");
}

/* Rank 0: gathers the reports for grace_s and decides what happened. */
static int judge(zn_comm *c, const zn_comm_op *op, int kind, int peer, int code,
                 const char *local, char *text, size_t tlen)
{
    zn_ctl_msg self;
    memset(&self, 0, sizeof self);
    self.magic = ZN_CTL_MAGIC;
    self.type = ZN_CTL_REPORT;
    self.rank = 0;
    self.peer = peer;
    self.kind = kind;
    self.code = code;
    self.seq = op->seq;
    snprintf(self.text, sizeof self.text, "%.400s", local);
    c->reports[0] = self;

    uint64_t deadline = zn_now_ns() + (uint64_t)(c->grace_s * 1e9);
    for (int guard = 0; guard < 100000; guard++) {
        int have = 0, dead = 0;
        for (int r = 0; r < c->size; r++) {
            have += c->reports[r].type == ZN_CTL_REPORT || c->dead[r] || c->departed[r];
            dead += c->dead[r] && !c->departed[r];
        }
        /* A closed control channel is a certain death: no need to wait. */
        if (have == c->size || dead || zn_now_ns() >= deadline)
            break;
        zn_ctl_msg m;
        int closed = -1;
        int rc = c->ops->ctl_recv(c, &m, &closed, deadline);
        if (rc == 1)
            zn_comm_note_msg(c, m.rank, &m);
        else if (rc == 2)
            zn_comm_note_dead(c, closed);
        else
            break;
    }

    int *ranks = calloc((size_t)c->size, sizeof *ranks);
    char list[256];
    int n = 0, vcode = code;
    if (!ranks) {
        snprintf(text, tlen, "%s", local);
        return code;
    }
    for (int r = 0; r < c->size; r++)
        if (c->dead[r] && !c->departed[r])
            ranks[n++] = r;
    if (n) {
        list_ranks(c, list, sizeof list, ranks, n);
        snprintf(text, tlen, "rank%s %s died (connection closed without a goodbye; "
                 "noticed at once, not after ZINC_COMM_TIMEOUT %.0f s)", n > 1 ? "s" : "", list,
                 c->timeout_s);
        vcode = -ECONNRESET;
        goto decided;
    }
    for (int r = 0; r < c->size; r++) {
        const zn_ctl_msg *m = &c->reports[r];
        if (m->type == ZN_CTL_REPORT && m->kind == ZN_FAIL_CLOSED && m->peer >= 0 &&
            m->peer < c->size && c->reports[m->peer].type != ZN_CTL_REPORT) {
            char who[96];
            snprintf(text, tlen, "%s is gone: rank %d saw its connection close (%.200s)",
                     zn_comm_peer_name(c, m->peer, who, sizeof who), r, m->text);
            vcode = -ECONNRESET;
            goto decided;
        }
    }
    for (int r = 0; r < c->size; r++)
        if (c->reports[r].type != ZN_CTL_REPORT && !c->departed[r])
            ranks[n++] = r;
    if (n) {
        list_ranks(c, list, sizeof list, ranks, n);
        snprintf(text, tlen, "rank%s %s did not join or %s unreachable: no data and no "
                 "report within ZINC_COMM_TIMEOUT %.1f s + %.1f s grace (stuck outside the "
                 "collective, dead, or cut off by the network)", n > 1 ? "s" : "", list,
                 n > 1 ? "are" : "is", c->timeout_s, c->grace_s);
        vcode = ZN_ETIMEOUT;
        goto decided;
    }
    for (int r = 0; r < c->size; r++)
        if (c->departed[r])
            ranks[n++] = r;
    if (n) {
        list_ranks(c, list, sizeof list, ranks, n);
        snprintf(text, tlen, "rank%s %s left (destroyed the communicator) before the "
                 "collective finished", n > 1 ? "s" : "", list);
        vcode = -ECONNRESET;
        goto decided;
    }
    /* Everyone is in the collective and still it did not finish: the
     * transport between some pair failed. Quote the first real report. */
    for (int r = 0; r < c->size; r++) {
        const zn_ctl_msg *m = &c->reports[r];
        if (m->kind != ZN_FAIL_REMOTE) {
            snprintf(text, tlen, "every rank reported in, but the data stopped: rank %d: "
                     "%.300s", r, m->text);
            vcode = m->code ? m->code : ZN_ETIMEOUT;
            goto decided;
        }
    }
    snprintf(text, tlen, "%s", local);
decided:
    free(ranks);
    zn_ctl_msg v;
    memset(&v, 0, sizeof v);
    v.magic = ZN_CTL_MAGIC;
    v.type = ZN_CTL_VERDICT;
    v.rank = 0;
    v.code = vcode;
    v.seq = op->seq;
    snprintf(v.text, sizeof v.text, "%.470s", text);
    uint64_t send_deadline = zn_now_ns() + (uint64_t)(fmin(1.0, c->grace_s) * 1e9);
    for (int r = 1; r < c->size; r++)
        if (!c->dead[r] && !c->departed[r])
            (void)c->ops->ctl_send(c, r, &v, send_deadline);
    if (c->ops->ctl_flush)
        c->ops->ctl_flush(c, send_deadline);
    return vcode;
}

/* Rank > 0: reports to rank 0 and waits for its verdict. */
static int follow(zn_comm *c, const zn_comm_op *op, int kind, int peer, int code,
                  const char *local, char *text, size_t tlen)
{
    if (kind == ZN_FAIL_REMOTE && c->have_verdict) {
        snprintf(text, tlen, "%s", c->verdict.text);
        return c->verdict.code ? c->verdict.code : code;
    }
    char who0[80];
    zn_comm_peer_name(c, 0, who0, sizeof who0);
    if (c->dead[0]) {
        snprintf(text, tlen, "%s died (its control connection closed without a goodbye); "
                 "here: %.400s", who0, local);
        return -ECONNRESET;
    }
    zn_ctl_msg m;
    memset(&m, 0, sizeof m);
    m.magic = ZN_CTL_MAGIC;
    m.type = ZN_CTL_REPORT;
    m.rank = c->rank;
    m.peer = peer;
    m.kind = kind;
    m.code = code;
    m.seq = op->seq;
    snprintf(m.text, sizeof m.text, "%.400s", local);
    double wait_s = 2 * c->grace_s + 0.5;
    uint64_t deadline = zn_now_ns() + (uint64_t)(wait_s * 1e9);
    int rc = c->ops->ctl_send(c, 0, &m, deadline);
    if (c->ops->ctl_flush)
        c->ops->ctl_flush(c, zn_now_ns() + 1000000000ull);
    for (int guard = 0; rc == 0 && !c->have_verdict && guard < 100000; guard++) {
        zn_ctl_msg in;
        int closed = -1;
        int r = c->ops->ctl_recv(c, &in, &closed, deadline);
        if (r == 1) {
            zn_comm_note_msg(c, in.rank, &in);
            if (in.type == ZN_CTL_BYE)
                break;
        } else {
            if (r == 2)
                zn_comm_note_dead(c, closed);
            break;
        }
    }
    if (c->have_verdict) {
        snprintf(text, tlen, "%s", c->verdict.text);
        return c->verdict.code ? c->verdict.code : code;
    }
    if (c->dead[0])
        snprintf(text, tlen, "%s died (its control connection closed without a goodbye); "
                 "here: %.400s", who0, local);
    else
        snprintf(text, tlen, "%.400s; %s sent no verdict within %.1f s (it may be stuck, "
                 "dead or unreachable)", local, who0, wait_s);
    return code;
}

int zn_comm_fail(zn_comm *c, const zn_comm_op *op, int kind, int peer, int code,
                 const char *fmt, ...)
{
    char local[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(local, sizeof local, fmt, ap);
    va_end(ap);
    if (zn_comm_check_broken(c))
        return zn_comm_check_broken(c);

    char text[600];
    int vcode = code;
    if (c->size == 1 || !c->ops->ctl_send || !c->reports)
        snprintf(text, sizeof text, "%s", local);
    else if (c->rank == 0)
        vcode = judge(c, op, kind, peer, code, local, text, sizeof text);
    else
        vcode = follow(c, op, kind, peer, code, local, text, sizeof text);
    if (!vcode)
        vcode = code ? code : ZN_EINTERNAL;

    pthread_mutex_lock(&c->lock);
    if (!c->broken) {
        c->broken = vcode;
        snprintf(c->broken_msg, sizeof c->broken_msg, "%s on rank %d/%d: %s", op->desc,
                 c->rank, c->size, text);
    }
    pthread_mutex_unlock(&c->lock);
    zn_error("comm: %s on rank %d/%d: %s", op->desc, c->rank, c->size, text);
    return zn_comm_check_broken(c);
}
