/* MPI backend: host collectives as MPI nonblocking collectives (so that a
 * deadline can be kept: MPI_Test polling, never a blocking MPI call inside
 * a collective), MPI_ERRORS_RETURN with MPI_Error_string in the messages,
 * bf16 as a 2-byte type with its own sum/max operations, and a duplicated
 * communicator for the failure protocol's control messages. Ending ranks
 * stuck inside MPI needs MPI_Abort: zn_comm_abort says so, the application
 * calls it. */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm-impl.h"

#define ZN_MPI_CTL_TAG 7301

typedef struct zn_mpi {
    MPI_Comm comm;           /* collectives */
    MPI_Comm ctl;            /* control messages */
    MPI_Datatype bf16;
    MPI_Op bf16_sum, bf16_max;
    int have_comm, have_ctl, have_type, have_ops;
    pthread_mutex_t lk;      /* one MPI call at a time (MPI_THREAD_SERIALIZED) */
    MPI_Request ctl_pending[64];  /* control sends in flight */
    zn_ctl_msg ctl_copies[64];    /* their buffers */
    int n_pending;
} zn_mpi;

static int mpi_inited_by_zinc;   /* zinc called MPI_Init_thread */
static int mpi_live_comms;
static pthread_mutex_t mpi_global = PTHREAD_MUTEX_INITIALIZER;

static int mpi_err(int e, const char *call)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(e, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", e);
    return zn_set_error(ZN_EMPI, "%s: %s", call, s);
}

#define MPI_TRY(call)                                   \
    do {                                                \
        int zn_e_ = (call);                             \
        if (zn_e_ != MPI_SUCCESS) {                     \
            rc = mpi_err(zn_e_, #call);                 \
            goto fail;                                  \
        }                                               \
    } while (0)

static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    zn_comm_reduce(inout, in, inout, (size_t)*len, ZN_DTYPE_BF16, ZN_REDUCE_SUM);
}

static void bf16_max_fn(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    zn_comm_reduce(inout, in, inout, (size_t)*len, ZN_DTYPE_BF16, ZN_REDUCE_MAX);
}

/* Requests live in zn_comm_req.impl. */
typedef struct {
    MPI_Request req[2];
    int n;
} mpi_reqs;

static int mpi_start(zn_comm *c, zn_comm_req *r)
{
    zn_mpi *m = c->host;
    zn_comm_op *op = &r->op;
    mpi_reqs *q = (mpi_reqs *)r->impl;
    int rc = 0;
    if (op->count > INT_MAX)
        return zn_set_error(ZN_EUNSUPPORTED, "%s: MPI counts are int; %zu elements is over "
                            "INT_MAX (split the buffer)", op->desc, op->count);
    int n = (int)op->count;
    MPI_Datatype ty = op->dt == ZN_DTYPE_BF16 ? m->bf16 : MPI_FLOAT;
    MPI_Op mop = op->dt == ZN_DTYPE_BF16 ? (op->red == ZN_REDUCE_SUM ? m->bf16_sum
                                                                     : m->bf16_max)
                                         : (op->red == ZN_REDUCE_SUM ? MPI_SUM : MPI_MAX);
    size_t es = zn_dtype_size(op->dt);
    pthread_mutex_lock(&m->lk);
    q->n = 1;
    switch (op->kind) {
    case ZN_COP_ALLREDUCE:
        MPI_TRY(MPI_Iallreduce(op->send == op->recv ? MPI_IN_PLACE : op->send, op->recv, n, ty,
                               mop, m->comm, &q->req[0]));
        break;
    case ZN_COP_ALLGATHER: {
        const void *s = op->send == (char *)op->recv + (size_t)c->rank * op->count * es
                            ? MPI_IN_PLACE : op->send;
        MPI_TRY(MPI_Iallgather(s, n, ty, op->recv, n, ty, m->comm, &q->req[0]));
        break;
    }
    case ZN_COP_REDUCE_SCATTER: {
        /* MPI's in-place form reads the input from recv; ours has recv
         * inside send: use a temporary and copy at completion. */
        void *dst = op->recv;
        const char *lo = op->send, *hi = lo + op->count * (size_t)c->size * es;
        if ((const char *)op->recv < hi && (const char *)op->recv + op->count * es > lo) {
            if (!(r->tmp = malloc(op->count ? op->count * es : 1))) {
                rc = zn_set_error(-ENOMEM, "%s: out of memory", op->desc);
                goto fail;
            }
            dst = r->tmp;
        }
        MPI_TRY(MPI_Ireduce_scatter_block(op->send, dst, n, ty, mop, m->comm, &q->req[0]));
        break;
    }
    case ZN_COP_BROADCAST:
        MPI_TRY(MPI_Ibcast(op->recv, n, MPI_BYTE, op->root, m->comm, &q->req[0]));
        break;
    case ZN_COP_BARRIER:
        MPI_TRY(MPI_Ibarrier(m->comm, &q->req[0]));
        break;
    case ZN_COP_RING: {
        int left = (c->rank + c->size - 1) % c->size, right = (c->rank + 1) % c->size;
        MPI_TRY(MPI_Irecv(op->recv, n, MPI_BYTE, left, 1, m->comm, &q->req[0]));
        MPI_TRY(MPI_Isend(op->send, n, MPI_BYTE, right, 1, m->comm, &q->req[1]));
        q->n = 2;
        break;
    }
    case ZN_COP_LINK: {
        int to = (op->root + 1) % c->size;
        q->n = 0;   /* the ranks outside the link: nothing to wait for */
        if (c->rank == to)
            MPI_TRY(MPI_Irecv(op->recv, n, MPI_BYTE, op->root, 2, m->comm, &q->req[q->n++]));
        if (c->rank == op->root)
            MPI_TRY(MPI_Isend(op->send, n, MPI_BYTE, to, 2, m->comm, &q->req[q->n++]));
        break;
    }
    }
    pthread_mutex_unlock(&m->lk);
    return 0;
fail:
    pthread_mutex_unlock(&m->lk);
    return zn_error_prefix(rc, "%s", op->desc);
}

/* Checks the control communicator for a report (rank 0) or a verdict.
 * Returns 1 and the message, or 0. Caller holds m->lk. */
static int ctl_probe_locked(zn_mpi *m, zn_ctl_msg *msg, int *from)
{
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, ZN_MPI_CTL_TAG, m->ctl, &flag, &st) != MPI_SUCCESS || !flag)
        return 0;
    if (MPI_Recv(msg, (int)sizeof *msg, MPI_BYTE, st.MPI_SOURCE, ZN_MPI_CTL_TAG, m->ctl,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return 0;
    msg->rank = st.MPI_SOURCE;
    msg->text[sizeof msg->text - 1] = 0;
    *from = st.MPI_SOURCE;
    return 1;
}

static int mpi_test(zn_comm *c, zn_comm_req *r)
{
    zn_mpi *m = c->host;
    mpi_reqs *q = (mpi_reqs *)r->impl;
    int flag = 0, from = -1, got;
    zn_ctl_msg msg;
    pthread_mutex_lock(&m->lk);
    int e = MPI_Testall(q->n, q->req, &flag, MPI_STATUSES_IGNORE);
    got = !flag && e == MPI_SUCCESS ? ctl_probe_locked(m, &msg, &from) : 0;
    pthread_mutex_unlock(&m->lk);
    if (e != MPI_SUCCESS) {
        int rc = mpi_err(e, "MPI_Testall");
        return zn_comm_fail(c, &r->op, ZN_FAIL_IO, -1, rc, "%s", zn_last_error());
    }
    if (flag) {
        if (r->tmp) {
            memcpy(r->op.recv, r->tmp, r->op.count * zn_dtype_size(r->op.dt));
            free(r->tmp);
            r->tmp = NULL;
        }
        return 1;
    }
    if (got) {
        zn_comm_note_msg(c, from, &msg);
        if (msg.type == ZN_CTL_VERDICT)
            return zn_comm_fail(c, &r->op, ZN_FAIL_REMOTE, 0, msg.code, "%s", msg.text);
        if (msg.type == ZN_CTL_REPORT)
            return zn_comm_fail(c, &r->op, ZN_FAIL_REMOTE, from, msg.code,
                                "rank %d reported: %.300s", from, msg.text);
    }
    return 0;
}

/* Control sends are only posted here; mpi_ctl_flush completes them all at
 * once, so that a stuck rank that never receives does not delay the others. */
static int mpi_ctl_send(zn_comm *c, int to, const zn_ctl_msg *msg, uint64_t deadline)
{
    (void)deadline;
    zn_mpi *m = c->host;
    pthread_mutex_lock(&m->lk);
    if (m->n_pending == (int)(sizeof m->ctl_pending / sizeof m->ctl_pending[0])) {
        pthread_mutex_unlock(&m->lk);
        return zn_set_error(ZN_EMPI, "comm/mpi: too many control messages in flight");
    }
    /* The message buffer must live until completion: keep a copy. */
    zn_ctl_msg *cp = &m->ctl_copies[m->n_pending];
    *cp = *msg;
    int e = MPI_Isend(cp, (int)sizeof *cp, MPI_BYTE, to, ZN_MPI_CTL_TAG, m->ctl,
                      &m->ctl_pending[m->n_pending]);
    if (e == MPI_SUCCESS)
        m->n_pending++;
    pthread_mutex_unlock(&m->lk);
    return e == MPI_SUCCESS ? 0 : mpi_err(e, "MPI_Isend (control)");
}

static void mpi_ctl_flush(zn_comm *c, uint64_t deadline)
{
    zn_mpi *m = c->host;
    for (int guard = 0; guard < 10000000; guard++) {
        int flag = 0;
        pthread_mutex_lock(&m->lk);
        int e = m->n_pending ? MPI_Testall(m->n_pending, m->ctl_pending, &flag,
                                           MPI_STATUSES_IGNORE) : MPI_SUCCESS;
        if (!m->n_pending || (e == MPI_SUCCESS && flag))
            m->n_pending = 0, flag = 1;
        pthread_mutex_unlock(&m->lk);
        if (flag || e != MPI_SUCCESS || zn_now_ns() >= deadline)
            return;   /* what is left stays pending: the communicator is broken */
        struct timespec ts = { 0, 100000 };
        nanosleep(&ts, NULL);
    }
}

static int mpi_ctl_recv(zn_comm *c, zn_ctl_msg *msg, int *closed, uint64_t deadline)
{
    (void)closed;   /* MPI shows no closed channels: a dead rank ends the job */
    zn_mpi *m = c->host;
    for (int guard = 0; guard < 10000000; guard++) {
        int from = -1;
        pthread_mutex_lock(&m->lk);
        int got = ctl_probe_locked(m, msg, &from);
        pthread_mutex_unlock(&m->lk);
        if (got)
            return 1;
        if (zn_now_ns() >= deadline)
            return 0;
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
    }
    return 0;
}

static int mpi_abort(zn_comm *c, int code)
{
    (void)c;
    (void)code;
    /* Ranks stuck inside MPI can only be ended by MPI_Abort, which ends
     * this process too: the application calls it (zn_comm_abort returns 1),
     * the library never ends the process. */
    return 1;
}

static void mpi_destroy(zn_comm *c, int healthy)
{
    zn_mpi *m = c->host;
    if (!m)
        return;
    /* After a failure, collectives may still be pending: freeing or
     * finalising could block forever, so leave MPI as it is. */
    if (healthy) {
        if (m->have_ops) {
            MPI_Op_free(&m->bf16_sum);
            MPI_Op_free(&m->bf16_max);
        }
        if (m->have_type)
            MPI_Type_free(&m->bf16);
        if (m->have_ctl)
            MPI_Comm_free(&m->ctl);
        if (m->have_comm)
            MPI_Comm_free(&m->comm);
    }
    pthread_mutex_lock(&mpi_global);
    mpi_live_comms--;
    if (healthy && mpi_live_comms == 0 && mpi_inited_by_zinc) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin && MPI_Finalize() != MPI_SUCCESS)
            zn_warn("comm/mpi: MPI_Finalize failed");
    }
    pthread_mutex_unlock(&mpi_global);
    pthread_mutex_destroy(&m->lk);
    free(m);
    c->host = NULL;
}

static const zn_comm_host_ops mpi_ops = {
    .name = "mpi",
    .destroy = mpi_destroy,
    .start = mpi_start,
    .test = mpi_test,
    .abort = mpi_abort,
    .ctl_send = mpi_ctl_send,
    .ctl_recv = mpi_ctl_recv,
    .ctl_flush = mpi_ctl_flush,
};

int zn_comm_mpi_create(zn_comm *c)
{
    int rc = 0, inited = 0, fin = 0, provided = 0;
    zn_mpi *m = calloc(1, sizeof *m);
    if (!m)
        return zn_set_error(-ENOMEM, "comm/mpi: out of memory");
    pthread_mutex_init(&m->lk, NULL);
    pthread_mutex_lock(&mpi_global);
    mpi_live_comms++;
    c->host = m;
    c->ops = &mpi_ops;
    MPI_TRY(MPI_Finalized(&fin));
    if (fin) {
        rc = zn_set_error(ZN_EMPI, "comm/mpi: MPI was already finalised in this process (by "
                          "an earlier zn_comm_destroy); MPI can be initialised once");
        goto fail;
    }
    MPI_TRY(MPI_Initialized(&inited));
    if (!inited) {
        MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided));
        mpi_inited_by_zinc = 1;
    } else {
        MPI_TRY(MPI_Query_thread(&provided));
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        static int warned;
        zn_warn_once(&warned, "comm/mpi: MPI provides thread level %d (< SERIALIZED); "
                     "collectives issued from stream threads are not safe", provided);
    }
    MPI_TRY(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &m->comm));
    m->have_comm = 1;
    MPI_TRY(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN));
    MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &m->ctl));
    m->have_ctl = 1;
    MPI_TRY(MPI_Comm_set_errhandler(m->ctl, MPI_ERRORS_RETURN));
    MPI_TRY(MPI_Type_contiguous(2, MPI_BYTE, &m->bf16));
    MPI_TRY(MPI_Type_commit(&m->bf16));
    m->have_type = 1;
    MPI_TRY(MPI_Op_create(bf16_sum_fn, 1, &m->bf16_sum));
    if (MPI_Op_create(bf16_max_fn, 1, &m->bf16_max) != MPI_SUCCESS) {
        MPI_Op_free(&m->bf16_sum);
        rc = zn_set_error(ZN_EMPI, "comm/mpi: MPI_Op_create failed");
        goto fail;
    }
    m->have_ops = 1;
    int rank, size;
    MPI_TRY(MPI_Comm_rank(m->comm, &rank));
    MPI_TRY(MPI_Comm_size(m->comm, &size));
    if (c->li.launcher != ZN_LAUNCH_NONE && (rank != c->li.rank || size != c->size)) {
        rc = zn_set_error(ZN_ECONFIG, "comm/mpi: MPI says rank %d of %d, the %s environment "
                          "says rank %d of %d", rank, size, zn_launcher_name(c->li.launcher),
                          c->li.rank, c->size);
        goto fail;
    }
    c->rank = rank;
    c->size = size;
    c->li.rank = rank;
    c->li.world_size = size;
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int vl = 0;
    if (MPI_Get_library_version(v, &vl) == MPI_SUCCESS) {
        v[strcspn(v, ",\n")] = 0;
        snprintf(c->version, sizeof c->version, "%.90s", v);
    }
    pthread_mutex_unlock(&mpi_global);
    return 0;
fail:
    pthread_mutex_unlock(&mpi_global);
    return zn_error_prefix(rc, "comm/mpi");
}
