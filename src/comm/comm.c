/* The communicator's common part: backend choice, argument checks, issue
 * order and requests (native MPI requests or a worker thread for TCP), the
 * stream-ordered device collectives, the single-rank backend, reductions,
 * and the failure protocol that turns a stuck or dead rank into one error
 * on every rank naming that rank and the operation. */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm-impl.h"

/* ---- reductions ------------------------------------------------------------*/
void zn_comm_reduce(void *out, const void *a, const void *b, size_t n, zn_dtype dt,
                    zn_reduce_op op)
{
    if (dt == ZN_DTYPE_F32) {
        float *o = out;
        const float *x = a, *y = b;
        if (op == ZN_REDUCE_SUM) {
            for (size_t i = 0; i < n; i++)
                o[i] = x[i] + y[i];
        } else {
            for (size_t i = 0; i < n; i++)
                o[i] = (x[i] != x[i] || x[i] > y[i]) ? x[i] : y[i];
        }
    } else {
        uint16_t *o = out;
        const uint16_t *x = a, *y = b;
        for (size_t i = 0; i < n; i++) {
            float p = zn_bf16_widen(x[i]), q = zn_bf16_widen(y[i]);
            if (op == ZN_REDUCE_SUM)
                o[i] = zn_bf16_round(p + q);
            else
                o[i] = (p != p || p > q) ? x[i] : y[i];
        }
    }
}

/* ---- configuration -----------------------------------------------------------*/
static double env_seconds(const char *name, double dflt)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v > 0) || !isfinite(v)) {
        zn_warn("%s=\"%s\" is not a positive number of seconds; using %.0f", name, s, dflt);
        return dflt;
    }
    return v;
}

zn_comm_config zn_comm_config_default(void)
{
    zn_comm_config c;
    memset(&c, 0, sizeof c);
    const char *b = getenv("ZINC_COMM_BACKEND");
    c.backend = b && *b ? b : "auto";
    c.timeout_s = env_seconds("ZINC_COMM_TIMEOUT", 300);
    c.connect_timeout_s = env_seconds("ZINC_COMM_CONNECT_TIMEOUT", 300);
    c.grace_s = 0;
    return c;
}

/* ---- descriptions and failure state -------------------------------------------*/
static const char *red_name(zn_reduce_op r)
{
    return r == ZN_REDUCE_SUM ? "sum" : r == ZN_REDUCE_MAX ? "max" : "?";
}

void zn_comm_describe(zn_comm_op *op)
{
    unsigned long long s = (unsigned long long)op->seq;
    switch (op->kind) {
    case ZN_COP_ALLREDUCE:
        snprintf(op->desc, sizeof op->desc, "allreduce #%llu (%zu x %s, %s)", s, op->count,
                 zn_dtype_name(op->dt), red_name(op->red));
        break;
    case ZN_COP_ALLGATHER:
        snprintf(op->desc, sizeof op->desc, "allgather #%llu (%zu x %s per rank)", s,
                 op->count, zn_dtype_name(op->dt));
        break;
    case ZN_COP_REDUCE_SCATTER:
        snprintf(op->desc, sizeof op->desc, "reduce-scatter #%llu (%zu x %s per rank, %s)", s,
                 op->count, zn_dtype_name(op->dt), red_name(op->red));
        break;
    case ZN_COP_BROADCAST:
        snprintf(op->desc, sizeof op->desc, "broadcast #%llu (%zu bytes from rank %d)", s,
                 op->count, op->root);
        break;
    case ZN_COP_BARRIER:
        snprintf(op->desc, sizeof op->desc, "barrier #%llu", s);
        break;
    case ZN_COP_RING:
        snprintf(op->desc, sizeof op->desc, "ring send/recv #%llu (%zu bytes)", s, op->count);
        break;
    }
}

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

static void list_ranks(char *buf, size_t len, const int *ranks, int n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && o + 16 < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%d", i ? ", " : "", ranks[i]);
    if (n && o + 16 >= len)
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
        list_ranks(list, sizeof list, ranks, n);
        snprintf(text, tlen, "rank%s %s died (connection closed without a goodbye)",
                 n > 1 ? "s" : "", list);
        vcode = -ECONNRESET;
        goto decided;
    }
    for (int r = 0; r < c->size; r++) {
        const zn_ctl_msg *m = &c->reports[r];
        if (m->type == ZN_CTL_REPORT && m->kind == ZN_FAIL_CLOSED && m->peer >= 0 &&
            m->peer < c->size && c->reports[m->peer].type != ZN_CTL_REPORT) {
            snprintf(text, tlen, "rank %d is gone: rank %d saw its connection close (%.200s)",
                     m->peer, r, m->text);
            vcode = -ECONNRESET;
            goto decided;
        }
    }
    for (int r = 0; r < c->size; r++)
        if (c->reports[r].type != ZN_CTL_REPORT && !c->departed[r])
            ranks[n++] = r;
    if (n) {
        list_ranks(list, sizeof list, ranks, n);
        snprintf(text, tlen, "rank%s %s did not join or %s unreachable: no data and no "
                 "report within %.1f s + %.1f s grace (stuck outside the collective, dead, "
                 "or cut off by the network)", n > 1 ? "s" : "", list, n > 1 ? "are" : "is",
                 c->timeout_s, c->grace_s);
        vcode = ZN_ETIMEOUT;
        goto decided;
    }
    for (int r = 0; r < c->size; r++)
        if (c->departed[r])
            ranks[n++] = r;
    if (n) {
        list_ranks(list, sizeof list, ranks, n);
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
    if (c->dead[0]) {
        snprintf(text, tlen, "rank 0 died (its control connection closed without a goodbye); "
                 "here: %s", local);
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
        snprintf(text, tlen, "rank 0 died (its control connection closed without a goodbye); "
                 "here: %s", local);
    else
        snprintf(text, tlen, "%s; rank 0 sent no verdict within %.1f s (it may be stuck, dead "
                 "or unreachable)", local, wait_s);
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

/* ---- single rank -------------------------------------------------------------*/
static int single_run(zn_comm_op *op)
{
    size_t es = zn_dtype_size(op->dt);
    switch (op->kind) {
    case ZN_COP_ALLREDUCE:
    case ZN_COP_ALLGATHER:
    case ZN_COP_REDUCE_SCATTER:
        if (op->count && op->send != op->recv)
            memmove(op->recv, op->send, op->count * es);
        break;
    case ZN_COP_RING:
        if (op->count && op->send != op->recv)
            memmove(op->recv, op->send, op->count);
        break;
    case ZN_COP_BROADCAST:
    case ZN_COP_BARRIER:
        break;
    }
    return 0;
}

static const zn_comm_host_ops single_ops = {
    .name = "single",
};

/* ---- requests ------------------------------------------------------------------*/
static void *worker_main(void *arg)
{
    zn_comm *c = arg;
    /* the host backend's stand-in for NCCL: its collectives read and write
     * device buffers, as NCCL's kernels would */
    zn_dev_host_guard_allow(1);
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->q_head && !c->stop)
            pthread_cond_wait(&c->cv, &c->lock);
        if (!c->q_head)
            break;
        zn_comm_req *r = c->q_head;
        c->q_head = r->next;
        if (!c->q_head)
            c->q_tail = NULL;
        r->state = 1;
        int broken = c->broken;
        pthread_mutex_unlock(&c->lock);
        int rc;
        if (broken)
            rc = zn_comm_check_broken(c);
        else
            rc = c->ops->run(c, &r->op, zn_now_ns() + (uint64_t)(c->timeout_s * 1e9));
        if (rc)
            snprintf(r->msg, sizeof r->msg, "%s", zn_last_error());
        pthread_mutex_lock(&c->lock);
        r->rc = rc;
        r->state = 2;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

static int check_args(zn_comm *c, const zn_comm_op *op, const char *fn)
{
    if (!c)
        return zn_set_error(ZN_EARG, "%s: NULL communicator", fn);
    if (op->kind != ZN_COP_BROADCAST && op->kind != ZN_COP_BARRIER && op->kind != ZN_COP_RING) {
        if (op->dt != ZN_DTYPE_F32 && op->dt != ZN_DTYPE_BF16)
            return zn_set_error(ZN_EARG, "%s: element type %s is not supported (f32, bf16)",
                                fn, zn_dtype_name(op->dt));
        if (op->red != ZN_REDUCE_SUM && op->red != ZN_REDUCE_MAX)
            return zn_set_error(ZN_EARG, "%s: unknown reduction %d", fn, (int)op->red);
        size_t total;
        if (__builtin_mul_overflow(op->count, (size_t)c->size * zn_dtype_size(op->dt), &total))
            return zn_set_error(ZN_EARG, "%s: %zu elements x %d ranks overflow", fn, op->count,
                                c->size);
    }
    if (op->kind == ZN_COP_BROADCAST && (op->root < 0 || op->root >= c->size))
        return zn_set_error(ZN_EARG, "%s: root %d is not a rank of this world (size %d)", fn,
                            op->root, c->size);
    if (op->count && op->kind != ZN_COP_BARRIER && (!op->recv ||
        (op->kind != ZN_COP_BROADCAST && !op->send)))
        return zn_set_error(ZN_EARG, "%s: NULL buffer with count %zu", fn, op->count);
    return 0;
}

static int comm_issue(zn_comm *c, zn_comm_op *op, zn_comm_req **out)
{
    *out = NULL;
    int rc = zn_comm_check_broken(c);
    if (rc)
        return rc;
    zn_comm_req *r = calloc(1, sizeof *r);
    if (!r)
        return zn_set_error(-ENOMEM, "%s: out of memory for a request", op->desc);
    pthread_mutex_lock(&c->lock);
    op->seq = ++c->seq;
    pthread_mutex_unlock(&c->lock);
    zn_comm_describe(op);
    r->op = *op;
    if (c->size == 1) {
        r->rc = single_run(&r->op);
        r->state = 2;
    } else if (c->ops->start) {
        r->native = 1;
        r->deadline_ns = zn_now_ns() + (uint64_t)(c->timeout_s * 1e9);
        if ((rc = c->ops->start(c, r))) {
            free(r->tmp);
            free(r);
            return rc;
        }
        r->state = 1;
    } else {
        pthread_mutex_lock(&c->lock);
        if (c->q_tail)
            c->q_tail->next = r;
        else
            c->q_head = r;
        c->q_tail = r;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->lock);
    }
    *out = r;
    return 0;
}

int zn_comm_test(zn_comm *c, zn_comm_req *r)
{
    if (!c || !r)
        return zn_set_error(ZN_EARG, "zn_comm_test: NULL argument");
    if (r->native && r->state != 2) {
        int rc = c->ops->test(c, r);
        if (rc == 0 && zn_now_ns() >= r->deadline_ns)
            rc = zn_comm_fail(c, &r->op, ZN_FAIL_TIMEOUT, -1, ZN_ETIMEOUT,
                              "did not complete within %.1f s", c->timeout_s);
        if (rc == 0)
            return 0;
        r->rc = rc < 0 ? rc : 0;
        if (rc < 0)
            snprintf(r->msg, sizeof r->msg, "%s", zn_last_error());
        r->state = 2;
    }
    pthread_mutex_lock(&c->lock);
    int state = r->state, rc = r->rc;
    pthread_mutex_unlock(&c->lock);
    if (state != 2)
        return 0;
    if (rc)
        return zn_set_error(rc, "%s", r->msg);
    return 1;
}

int zn_comm_wait(zn_comm *c, zn_comm_req *r)
{
    if (!r)
        return 0;
    if (!c)
        return zn_set_error(ZN_EARG, "zn_comm_wait: NULL communicator");
    if (r->native) {
        /* Spin briefly (latency of small collectives), then back off so that
         * oversubscribed ranks leave the cores to the others. */
        uint64_t t0 = zn_now_ns();
        for (;;) {
            int rc = zn_comm_test(c, r);
            if (rc != 0)
                break;
            uint64_t el = zn_now_ns() - t0;
            if (el < 200000)
                continue;
            if (el < 5000000) {
                sched_yield();
                continue;
            }
            struct timespec ts = { 0, el < 100000000 ? 20000 : 200000 };
            nanosleep(&ts, NULL);
        }
    } else {
        pthread_mutex_lock(&c->lock);
        while (r->state != 2)
            pthread_cond_wait(&c->cv, &c->lock);
        pthread_mutex_unlock(&c->lock);
    }
    int rc = r->rc;
    if (rc)
        zn_set_error(rc, "%s", r->msg);
    free(r->tmp);
    free(r);
    return rc;
}

int zn_comm_run_op(zn_comm *c, zn_comm_op *op)
{
    zn_comm_req *r;
    int rc = comm_issue(c, op, &r);
    if (rc)
        return rc;
    return zn_comm_wait(c, r);
}

/* ---- public collectives ------------------------------------------------------------*/
static zn_comm_op mkop(zn_cop_kind k, const void *send, void *recv, size_t count, zn_dtype dt,
                       zn_reduce_op red, int root)
{
    zn_comm_op op;
    memset(&op, 0, sizeof op);
    op.kind = k;
    op.send = send;
    op.recv = recv;
    op.count = count;
    op.dt = dt;
    op.red = red;
    op.root = root;
    return op;
}

static int issue_checked(zn_comm *c, zn_comm_op *op, const char *fn, zn_comm_req **req)
{
    int rc = check_args(c, op, fn);
    if (rc)
        return rc;
    if (req)
        return comm_issue(c, op, req);
    return zn_comm_run_op(c, op);
}

int zn_comm_allreduce(zn_comm *c, const void *send, void *recv, size_t count, zn_dtype dt,
                      zn_reduce_op op)
{
    zn_comm_op o = mkop(ZN_COP_ALLREDUCE, send, recv, count, dt, op, 0);
    return issue_checked(c, &o, "zn_comm_allreduce", NULL);
}

int zn_comm_allgather(zn_comm *c, const void *send, void *recv, size_t count, zn_dtype dt)
{
    zn_comm_op o = mkop(ZN_COP_ALLGATHER, send, recv, count, dt, ZN_REDUCE_SUM, 0);
    return issue_checked(c, &o, "zn_comm_allgather", NULL);
}

int zn_comm_reduce_scatter(zn_comm *c, const void *send, void *recv, size_t count, zn_dtype dt,
                           zn_reduce_op op)
{
    zn_comm_op o = mkop(ZN_COP_REDUCE_SCATTER, send, recv, count, dt, op, 0);
    return issue_checked(c, &o, "zn_comm_reduce_scatter", NULL);
}

int zn_comm_broadcast(zn_comm *c, void *buf, size_t bytes, int root)
{
    zn_comm_op o = mkop(ZN_COP_BROADCAST, buf, buf, bytes, ZN_DTYPE_F32, ZN_REDUCE_SUM, root);
    return issue_checked(c, &o, "zn_comm_broadcast", NULL);
}

int zn_comm_barrier(zn_comm *c)
{
    zn_comm_op o = mkop(ZN_COP_BARRIER, NULL, NULL, 0, ZN_DTYPE_F32, ZN_REDUCE_SUM, 0);
    return issue_checked(c, &o, "zn_comm_barrier", NULL);
}

int zn_comm_ring_xfer(zn_comm *c, const void *send, void *recv, size_t bytes)
{
    zn_comm_op o = mkop(ZN_COP_RING, send, recv, bytes, ZN_DTYPE_F32, ZN_REDUCE_SUM, 0);
    return issue_checked(c, &o, "zn_comm_ring_xfer", NULL);
}

#define REQ_CHECK(fn)                                                                   \
    do {                                                                                \
        if (!req)                                                                       \
            return zn_set_error(ZN_EARG, "%s: NULL request pointer", fn);               \
        *req = NULL;                                                                    \
    } while (0)

int zn_comm_iallreduce(zn_comm *c, const void *send, void *recv, size_t count, zn_dtype dt,
                       zn_reduce_op op, zn_comm_req **req)
{
    REQ_CHECK("zn_comm_iallreduce");
    zn_comm_op o = mkop(ZN_COP_ALLREDUCE, send, recv, count, dt, op, 0);
    return issue_checked(c, &o, "zn_comm_iallreduce", req);
}

int zn_comm_iallgather(zn_comm *c, const void *send, void *recv, size_t count, zn_dtype dt,
                       zn_comm_req **req)
{
    REQ_CHECK("zn_comm_iallgather");
    zn_comm_op o = mkop(ZN_COP_ALLGATHER, send, recv, count, dt, ZN_REDUCE_SUM, 0);
    return issue_checked(c, &o, "zn_comm_iallgather", req);
}

int zn_comm_ireduce_scatter(zn_comm *c, const void *send, void *recv, size_t count,
                            zn_dtype dt, zn_reduce_op op, zn_comm_req **req)
{
    REQ_CHECK("zn_comm_ireduce_scatter");
    zn_comm_op o = mkop(ZN_COP_REDUCE_SCATTER, send, recv, count, dt, op, 0);
    return issue_checked(c, &o, "zn_comm_ireduce_scatter", req);
}

int zn_comm_ibroadcast(zn_comm *c, void *buf, size_t bytes, int root, zn_comm_req **req)
{
    REQ_CHECK("zn_comm_ibroadcast");
    zn_comm_op o = mkop(ZN_COP_BROADCAST, buf, buf, bytes, ZN_DTYPE_F32, ZN_REDUCE_SUM, root);
    return issue_checked(c, &o, "zn_comm_ibroadcast", req);
}

int zn_comm_ibarrier(zn_comm *c, zn_comm_req **req)
{
    REQ_CHECK("zn_comm_ibarrier");
    zn_comm_op o = mkop(ZN_COP_BARRIER, NULL, NULL, 0, ZN_DTYPE_F32, ZN_REDUCE_SUM, 0);
    return issue_checked(c, &o, "zn_comm_ibarrier", req);
}

/* ---- stream-ordered device collectives ---------------------------------------------*/
typedef struct {
    zn_comm *c;
    zn_comm_op op;
} stream_job;

/* Runs on the stream's worker thread (host device). A failure breaks the
 * communicator; zn_comm_sync_on reports it. */
static void stream_job_run(void *arg)
{
    stream_job *j = arg;
    zn_comm *c = j->c;
    /* NCCL's stand-in on the host backend, run as a device op on the
     * stream's own worker (zn_dev_host_stream_fn): device buffers are its
     * to use, and the callback thread stays free for host functions */
    if (!zn_comm_check_broken(c)) {
        int rc = zn_comm_run_op(c, &j->op);
        if (rc) {
            pthread_mutex_lock(&c->lock);
            if (!c->broken) {
                c->broken = rc;
                snprintf(c->broken_msg, sizeof c->broken_msg, "%s", zn_last_error());
            }
            pthread_mutex_unlock(&c->lock);
        }
    }
    free(j);
}

static int enqueue_on(zn_comm *c, zn_stream *s, zn_comm_op *op, const char *fn)
{
    int rc = check_args(c, op, fn);
    if (rc)
        return rc;
    if (!c->dev)
        return zn_set_error(ZN_EUNSUPPORTED, "%s: the communicator has no device "
                            "(zn_comm_config.dev)", fn);
    if ((rc = zn_comm_check_broken(c)))
        return rc;
    if (!s)
        s = c->stream;
#if ZN_HAVE_NCCL
    if (c->nccl)
        return zn_nccl_enqueue(c, s, op);
#endif
    if (c->size == 1) {
        size_t bytes = op->count * (op->kind == ZN_COP_BROADCAST || op->kind == ZN_COP_RING
                                        ? 1 : zn_dtype_size(op->dt));
        if (!bytes || op->send == op->recv || op->kind == ZN_COP_BROADCAST ||
            op->kind == ZN_COP_BARRIER)
            return 0;
        return zn_dev_copy_d2d(c->dev, s, op->recv, op->send, bytes);
    }
    if (zn_dev_get_kind(c->dev) != ZN_DEV_HOST)
        return zn_set_error(ZN_EUNSUPPORTED, "%s: collectives on a CUDA device need NCCL "
                            "(zinc was built without it, or backend is not nccl)", fn);
    stream_job *j = malloc(sizeof *j);
    if (!j)
        return zn_set_error(-ENOMEM, "%s: out of memory", fn);
    j->c = c;
    j->op = *op;
    if ((rc = zn_dev_host_stream_fn(c->dev, s, stream_job_run, j))) {
        free(j);
        return rc;
    }
    return 0;
}

int zn_comm_allreduce_on(zn_comm *c, zn_stream *s, const void *send, void *recv, size_t count,
                         zn_dtype dt, zn_reduce_op op)
{
    zn_comm_op o = mkop(ZN_COP_ALLREDUCE, send, recv, count, dt, op, 0);
    return enqueue_on(c, s, &o, "zn_comm_allreduce_on");
}

int zn_comm_allgather_on(zn_comm *c, zn_stream *s, const void *send, void *recv, size_t count,
                         zn_dtype dt)
{
    zn_comm_op o = mkop(ZN_COP_ALLGATHER, send, recv, count, dt, ZN_REDUCE_SUM, 0);
    return enqueue_on(c, s, &o, "zn_comm_allgather_on");
}

int zn_comm_reduce_scatter_on(zn_comm *c, zn_stream *s, const void *send, void *recv,
                              size_t count, zn_dtype dt, zn_reduce_op op)
{
    zn_comm_op o = mkop(ZN_COP_REDUCE_SCATTER, send, recv, count, dt, op, 0);
    return enqueue_on(c, s, &o, "zn_comm_reduce_scatter_on");
}

int zn_comm_broadcast_on(zn_comm *c, zn_stream *s, void *buf, size_t bytes, int root)
{
    zn_comm_op o = mkop(ZN_COP_BROADCAST, buf, buf, bytes, ZN_DTYPE_F32, ZN_REDUCE_SUM, root);
    return enqueue_on(c, s, &o, "zn_comm_broadcast_on");
}

int zn_comm_ring_xfer_on(zn_comm *c, zn_stream *s, const void *send, void *recv, size_t bytes)
{
    zn_comm_op o = mkop(ZN_COP_RING, send, recv, bytes, ZN_DTYPE_F32, ZN_REDUCE_SUM, 0);
    return enqueue_on(c, s, &o, "zn_comm_ring_xfer_on");
}

int zn_comm_sync_on(zn_comm *c, zn_stream *s)
{
    if (!c || !c->dev)
        return zn_set_error(ZN_EARG, "zn_comm_sync_on: %s", c ? "the communicator has no "
                            "device" : "NULL communicator");
    if (!s)
        s = c->stream;
#if ZN_HAVE_NCCL
    if (c->nccl) {
        int rc = zn_nccl_sync(c, s);
        if (rc)
            return rc;
    }
#endif
    int rc = zn_dev_stream_sync(c->dev, s);
    int broken = zn_comm_check_broken(c);
    return broken ? broken : rc;
}

zn_stream *zn_comm_stream(zn_comm *c)
{
    return c ? c->stream : NULL;
}

/* ---- creation ---------------------------------------------------------------------*/
int zn_comm_rank(const zn_comm *c)
{
    return c ? c->rank : 0;
}

int zn_comm_size(const zn_comm *c)
{
    return c ? c->size : 1;
}

void zn_comm_get_info(const zn_comm *c, zn_comm_info *out)
{
    memset(out, 0, sizeof *out);
    if (!c)
        return;
    out->rank = c->rank;
    out->size = c->size;
    out->local_rank = c->li.local_rank;
    out->local_size = c->li.local_size;
    out->launcher = c->li.launcher;
    snprintf(out->host_backend, sizeof out->host_backend, "%s", c->ops->name);
    snprintf(out->dev_backend, sizeof out->dev_backend, "%s", c->dev_backend);
    snprintf(out->version, sizeof out->version, "%s", c->version);
    out->timeout_s = c->timeout_s;
    out->nccl = c->nccl != NULL;
    pthread_mutex_lock((pthread_mutex_t *)&c->lock);
    out->n_ops = c->seq;
    pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
}

int zn_comm_create(zn_comm **out, const zn_comm_config *cfg_in)
{
    if (!out)
        return zn_set_error(ZN_EARG, "zn_comm_create: NULL output");
    *out = NULL;
    zn_comm_config cfg = cfg_in ? *cfg_in : zn_comm_config_default();
    const char *name = cfg.backend && *cfg.backend ? cfg.backend : "auto";
    if (!(cfg.timeout_s > 0) || !isfinite(cfg.timeout_s))
        return zn_set_error(ZN_ECONFIG, "comm: timeout %.3g s must be a positive number",
                            cfg.timeout_s);
    if (!(cfg.connect_timeout_s > 0) || !isfinite(cfg.connect_timeout_s))
        cfg.connect_timeout_s = 300;
    int want_nccl = !strcmp(name, "nccl");
    if (strcmp(name, "auto") && strcmp(name, "single") && strcmp(name, "mpi") &&
        strcmp(name, "tcp") && !want_nccl)
        return zn_set_error(ZN_ECONFIG, "comm: unknown backend \"%s\" (auto, single, mpi, "
                            "tcp, nccl)", name);

    zn_comm *c = calloc(1, sizeof *c);
    if (!c)
        return zn_set_error(-ENOMEM, "comm: out of memory");
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->ops = &single_ops;
    c->timeout_s = cfg.timeout_s;
    c->connect_timeout_s = cfg.connect_timeout_s;
    c->grace_s = cfg.grace_s > 0 ? cfg.grace_s
                 : fmin(5.0, fmax(0.5, cfg.timeout_s / 4));
    snprintf(c->dev_backend, sizeof c->dev_backend, "none");
    snprintf(c->version, sizeof c->version, "zinc %s", ZN_VERSION);
    int rc;
    if (cfg.launch)
        c->li = *cfg.launch;
    else if ((rc = zn_launch_detect(&c->li)))
        goto fail;
    if (c->li.world_size < 1 || c->li.rank < 0 || c->li.rank >= c->li.world_size) {
        rc = zn_set_error(ZN_ECONFIG, "comm: rank %d of world %d", c->li.rank,
                          c->li.world_size);
        goto fail;
    }
    c->rank = c->li.rank;
    c->size = c->li.world_size;

    if (c->size > 1) {
        /* Before the backend: its rendezvous already uses the failure protocol. */
        c->reports = calloc((size_t)c->size, sizeof *c->reports);
        c->dead = calloc((size_t)c->size, 1);
        c->departed = calloc((size_t)c->size, 1);
        if (!c->reports || !c->dead || !c->departed) {
            rc = zn_set_error(-ENOMEM, "comm: out of memory");
            goto fail;
        }
    }

    const char *host = name;
    if (!strcmp(name, "auto") || want_nccl) {
        int mpi_launch = c->li.launcher == ZN_LAUNCH_MPI || c->li.launcher == ZN_LAUNCH_SLURM;
        if (c->size == 1)
            host = "single";
        else if (mpi_launch && ZN_HAVE_MPI)
            host = "mpi";
        else if (c->li.master_addr[0] && c->li.master_port)
            host = "tcp";
        else if (mpi_launch) {
            rc = zn_set_error(ZN_EUNSUPPORTED, "comm: launched by %s with %d ranks, but zinc "
                              "is built without MPI; set MASTER_ADDR and MASTER_PORT to use "
                              "the TCP backend, or rebuild with -Dmpi=enabled",
                              zn_launcher_name(c->li.launcher), c->size);
            goto fail;
        } else {
            rc = zn_set_error(ZN_ECONFIG, "comm: world size %d without MASTER_ADDR/"
                              "MASTER_PORT", c->size);
            goto fail;
        }
    }
    if (!strcmp(host, "single")) {
        if (c->size != 1) {
            rc = zn_set_error(ZN_ECONFIG, "comm: backend \"single\" with world size %d",
                              c->size);
            goto fail;
        }
    } else if (!strcmp(host, "mpi")) {
#if ZN_HAVE_MPI
        if ((rc = zn_comm_mpi_create(c)))
            goto fail;
#else
        rc = zn_set_error(ZN_EUNSUPPORTED, "comm: backend \"mpi\": zinc is built without MPI");
        goto fail;
#endif
    } else {
        if ((rc = zn_comm_tcp_create(c)))
            goto fail;
    }
    if (c->size > 1) {
        if (!c->ops->start) {
            if ((rc = pthread_create(&c->worker, NULL, worker_main, c))) {
                rc = zn_set_error(-rc, "comm: pthread_create: %s", strerror(rc));
                goto fail;
            }
            c->worker_started = 1;
        }
    }

    c->want_nccl = want_nccl;
    if (cfg.dev) {
        if ((rc = zn_comm_attach_device(c, cfg.dev)))
            goto fail;
    } else if (want_nccl) {
        rc = zn_set_error(ZN_EUNSUPPORTED, "comm: backend \"nccl\" needs a device "
                          "(zn_comm_config.dev)");
        goto fail;
    }
    *out = c;
    return 0;
fail:
    zn_comm_destroy(c);
    return rc;
}

/* The device part: a dedicated stream on `dev`, NCCL when the device is CUDA
 * (collective: NCCL's init needs every rank). */
int zn_comm_attach_device(zn_comm *c, zn_dev *dev)
{
    if (!c || !dev)
        return zn_set_error(ZN_EARG, "zn_comm_attach_device: NULL %s", c ? "device" :
                            "communicator");
    if (c->dev)
        return zn_set_error(ZN_EARG, "zn_comm_attach_device: a device is attached already");
    int rc;
    c->dev = dev;
    if ((rc = zn_dev_stream_create(c->dev, "comm", &c->stream))) {
        c->dev = NULL;
        return rc;
    }
    zn_dev_kind kind = zn_dev_get_kind(c->dev);
    if (kind == ZN_DEV_CUDA && (c->want_nccl || c->size > 1) && ZN_HAVE_NCCL) {
#if ZN_HAVE_NCCL
        if ((rc = zn_nccl_init(c))) {
            zn_comm_detach_device(c);
            return rc;
        }
        snprintf(c->dev_backend, sizeof c->dev_backend, "nccl");
#endif
    } else if (c->want_nccl) {
        rc = zn_set_error(ZN_EUNSUPPORTED, "comm: backend \"nccl\" needs a CUDA device "
                          "and zinc built with NCCL (device is %s, NCCL %s)",
                          kind == ZN_DEV_CUDA ? "CUDA" : "host",
                          ZN_HAVE_NCCL ? "built" : "not built");
        zn_comm_detach_device(c);
        return rc;
    } else if (c->size == 1) {
        snprintf(c->dev_backend, sizeof c->dev_backend, "copy");
    } else if (kind == ZN_DEV_HOST) {
        snprintf(c->dev_backend, sizeof c->dev_backend, "host-fn");
    }
    return 0;
}

void zn_comm_detach_device(zn_comm *c)
{
    if (!c || !c->dev)
        return;
    if (c->stream) {
        (void)zn_dev_stream_sync(c->dev, c->stream);
        zn_dev_stream_destroy(c->dev, c->stream);
        c->stream = NULL;
    }
#if ZN_HAVE_NCCL
    if (c->nccl)
        zn_nccl_destroy(c, !c->broken);
    c->nccl = NULL;
#endif
    c->dev = NULL;
    snprintf(c->dev_backend, sizeof c->dev_backend, "none");
}

void zn_comm_destroy(zn_comm *c)
{
    if (!c)
        return;
    int healthy = !c->broken;
    zn_comm_detach_device(c);
    if (c->worker_started) {
        pthread_mutex_lock(&c->lock);
        c->stop = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->worker, NULL);
    }
    healthy = healthy && !c->broken;
    if (c->ops && c->ops->destroy)
        c->ops->destroy(c, healthy);
    free(c->reports);
    free(c->dead);
    free(c->departed);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void zn_comm_abort(zn_comm *c, int code)
{
    if (!c)
        return;
#if ZN_HAVE_NCCL
    if (c->nccl)
        zn_nccl_abort(c);
#endif
    if (c->ops && c->ops->abort)
        c->ops->abort(c, code);
}
