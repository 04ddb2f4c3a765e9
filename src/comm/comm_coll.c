/* The collectives: argument checks, issue order and requests (native MPI
 * requests or a worker thread for TCP), the blocking, nonblocking and
 * stream-ordered device entry points, the single-rank path, the operations'
 * descriptions and the element-wise reductions the host backends use. */
#include <errno.h>
#include <sched.h>
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

/* ---- descriptions ---------------------------------------------------------------*/
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
    case ZN_COP_LINK:
        snprintf(op->desc, sizeof op->desc, "link send/recv #%llu (%zu bytes from rank %d to "
                 "its right neighbour)", s, op->count, op->root);
        break;
    }
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
    case ZN_COP_LINK:
        if (op->count && op->send != op->recv)
            memmove(op->recv, op->send, op->count);
        break;
    case ZN_COP_BROADCAST:
    case ZN_COP_BARRIER:
        break;
    }
    return 0;
}

/* ---- requests ------------------------------------------------------------------*/
void *zn_comm_worker_main(void *arg)
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
    if (op->kind != ZN_COP_BROADCAST && op->kind != ZN_COP_BARRIER && op->kind != ZN_COP_RING &&
        op->kind != ZN_COP_LINK) {
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
    if ((op->kind == ZN_COP_BROADCAST || op->kind == ZN_COP_LINK) &&
        (op->root < 0 || op->root >= c->size))
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

int zn_comm_link_xfer(zn_comm *c, const void *send, void *recv, size_t bytes, int from)
{
    zn_comm_op o = mkop(ZN_COP_LINK, send, recv, bytes, ZN_DTYPE_F32, ZN_REDUCE_SUM, from);
    return issue_checked(c, &o, "zn_comm_link_xfer", NULL);
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
        size_t bytes = op->count * (op->kind == ZN_COP_BROADCAST || op->kind == ZN_COP_RING ||
                                    op->kind == ZN_COP_LINK ? 1 : zn_dtype_size(op->dt));
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

int zn_comm_link_xfer_on(zn_comm *c, zn_stream *s, const void *send, void *recv, size_t bytes,
                         int from)
{
    zn_comm_op o = mkop(ZN_COP_LINK, send, recv, bytes, ZN_DTYPE_F32, ZN_REDUCE_SUM, from);
    return enqueue_on(c, s, &o, "zn_comm_link_xfer_on");
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
