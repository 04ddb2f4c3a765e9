/* NCCL device part: GPU collectives on the CUDA stream under a zn_stream.
 * The host part shares NCCL's unique id (MPI or the TCP rendezvous). The
 * communicator is nonblocking (ncclConfig_t.blocking = 0) so that init, the
 * enqueue of a collective and zn_comm_sync_on can all keep a deadline; a
 * deadline that passes aborts the NCCL communicator (ncclCommAbort), which
 * is NCCL's way of unsticking kernels waiting for a peer. */
#include <cuda_runtime.h>
#include <errno.h>
/* nccl.h declares a few functions with () parameter lists. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm-impl.h"

typedef struct zn_nccl {
    ncclComm_t comm;
    int ordinal;
    int aborted;
    char last[96];            /* the last collective queued, for errors */
} zn_nccl;

static int nccl_err(zn_nccl *n, ncclResult_t r, const char *call)
{
    const char *last = n && n->comm ? ncclGetLastError(n->comm) : NULL;
    return zn_set_error(ZN_ENCCL, "%s: %s%s%s", call, ncclGetErrorString(r),
                        last && *last ? ": " : "", last && *last ? last : "");
}

static int cuda_err(cudaError_t e, const char *call)
{
    return zn_set_error(ZN_ECUDA, "%s: %s", call, cudaGetErrorString(e));
}

static void nap(void)
{
    struct timespec ts = { 0, 100000 };
    nanosleep(&ts, NULL);
}

/* Waits until the nonblocking communicator leaves ncclInProgress. */
static int wait_ready(zn_nccl *n, uint64_t deadline, const char *what)
{
    for (long guard = 0; guard < 100000000L; guard++) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &st);
        if (r != ncclSuccess)
            return nccl_err(n, r, "ncclCommGetAsyncError");
        if (st == ncclSuccess)
            return 0;
        if (st != ncclInProgress)
            return nccl_err(n, st, what);
        if (zn_now_ns() >= deadline)
            return zn_set_error(ZN_ETIMEOUT, "%s: NCCL still in progress at the deadline", what);
        nap();
    }
    return zn_set_error(ZN_ETIMEOUT, "%s: NCCL never finished", what);
}

static int set_device(zn_nccl *n)
{
    cudaError_t e = cudaSetDevice(n->ordinal);
    return e == cudaSuccess ? 0 : cuda_err(e, "cudaSetDevice");
}

/* Two ranks on one GPU (more ranks on a host than GPUs it shows them, each
 * taking cuda:LOCAL_RANK % GPUs): NCCL refuses that communicator with
 * "Duplicate GPU detected" and the GPU's bus number. Every rank learns
 * where the others are first and refuses in terms of the launch. */
static int check_gpu_per_rank(zn_comm *c, const zn_dev_info *info)
{
    /* a machine is its kernel's boot id (hosts may share a name; containers
     * on one machine share the id and, with it, the GPUs), as NCCL tells
     * hosts apart; the name is for the message */
    typedef struct { char host[64]; char boot[40]; char bus[32]; } ident;
    ident *all = calloc((size_t)c->size, sizeof *all);
    if (!all)
        return zn_set_error(-ENOMEM, "comm/nccl: out of memory");
    ident *me = &all[c->rank];
    if (gethostname(me->host, sizeof me->host - 1) != 0)
        snprintf(me->host, sizeof me->host, "?");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f || !fgets(me->boot, sizeof me->boot, f))
        snprintf(me->boot, sizeof me->boot, "%.39s", me->host);
    if (f)
        fclose(f);
    snprintf(me->bus, sizeof me->bus, "%s", info->pci_bus_id);
    int rc = 0;
    for (int r = 0; r < c->size && !rc; r++)
        rc = zn_comm_broadcast(c, &all[r], sizeof all[r], r);
    if (rc) {
        free(all);
        return zn_error_prefix(rc, "comm/nccl: sharing each rank's GPU");
    }
    for (int i = 0; i < c->size && !rc; i++)
        for (int j = i + 1; j < c->size && !rc; j++)
            if (all[i].bus[0] && !strcmp(all[i].boot, all[j].boot) &&
                !strcmp(all[i].bus, all[j].bus))
                rc = zn_set_error(ZN_ECONFIG, "comm/nccl: ranks %d and %d are both on the GPU "
                                  "at %s of host %s, and NCCL takes one GPU per rank: start "
                                  "at most as many ranks on a host as it has GPUs (this "
                                  "rank's host runs %d and shows it %d), give each rank its "
                                  "own CUDA_VISIBLE_DEVICES, or train on the host backend "
                                  "(train.device \"host\")", i, j, all[i].bus, all[i].host,
                                  c->li.local_size, zn_comm_cuda_device_count());
    free(all);
    return rc;
}

int zn_nccl_init(zn_comm *c)
{
    zn_nccl *n = calloc(1, sizeof *n);
    if (!n)
        return zn_set_error(-ENOMEM, "comm/nccl: out of memory");
    c->nccl = n;
    zn_dev_info info;
    zn_dev_get_info(c->dev, &info);
    n->ordinal = info.ordinal;
    int rc = set_device(n);
    if (rc)
        return zn_error_prefix(rc, "comm/nccl");
    if ((rc = check_gpu_per_rank(c, &info)))
        return rc;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess)
            return nccl_err(NULL, r, "comm/nccl: ncclGetUniqueId");
    }
    /* The bootstrap: rank 0's id reaches every rank through the host part. */
    if ((rc = zn_comm_broadcast(c, &id, sizeof id, 0)))
        return zn_error_prefix(rc, "comm/nccl: sharing the unique id");
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, c->size, id, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        return nccl_err(n, r, "comm/nccl: ncclCommInitRankConfig");
    uint64_t deadline = zn_now_ns() + (uint64_t)(c->connect_timeout_s * 1e9);
    if ((rc = wait_ready(n, deadline, "ncclCommInitRankConfig"))) {
        ncclCommAbort(n->comm);
        n->comm = NULL;
        return zn_error_prefix(rc, "comm/nccl: rank %d/%d", c->rank, c->size);
    }
    int v = 0;
    if (ncclGetVersion(&v) == ncclSuccess) {
        char host[96];
        snprintf(host, sizeof host, "%s", c->version);
        snprintf(c->version, sizeof c->version, "NCCL %d.%d.%d + %.60s", v / 10000,
                 (v / 100) % 100, v % 100, host);
    }
    return 0;
}

void zn_nccl_abort(zn_comm *c)
{
    zn_nccl *n = c->nccl;
    if (n && n->comm && !n->aborted) {
        ncclCommAbort(n->comm);
        n->aborted = 1;
    }
}

void zn_nccl_destroy(zn_comm *c, int healthy)
{
    zn_nccl *n = c->nccl;
    if (!n)
        return;
    if (n->comm && !n->aborted) {
        int done = 0;
        if (healthy && set_device(n) == 0) {
            ncclResult_t r = ncclCommFinalize(n->comm);
            if ((r == ncclSuccess || r == ncclInProgress) &&
                wait_ready(n, zn_now_ns() + (uint64_t)(c->timeout_s * 1e9),
                           "ncclCommFinalize") == 0)
                done = (ncclCommDestroy(n->comm), 1);
        }
        if (!done)
            ncclCommAbort(n->comm);
    }
    free(n);
    c->nccl = NULL;
}

static void *native_stream(zn_comm *c, zn_stream *s)
{
    if (!s || zn_dev_get_kind(c->dev) != ZN_DEV_CUDA)
        return NULL;
    return zn_cuda_stream_native ? zn_cuda_stream_native(s) : NULL;
}

int zn_nccl_enqueue(zn_comm *c, zn_stream *s, zn_comm_op *op)
{
    zn_nccl *n = c->nccl;
    cudaStream_t cs = native_stream(c, s);
    if (!cs)
        return zn_set_error(ZN_EUNSUPPORTED, "comm/nccl: the device layer does not expose the "
                            "CUDA stream of \"%s\" (zn_cuda_stream_native)", "stream");
    int rc = set_device(n);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->lock);
    op->seq = ++c->seq;
    pthread_mutex_unlock(&c->lock);
    zn_comm_describe(op);
    snprintf(n->last, sizeof n->last, "%s", op->desc);
    ncclDataType_t ty = op->dt == ZN_DTYPE_BF16 ? ncclBfloat16 : ncclFloat32;
    ncclRedOp_t red = op->red == ZN_REDUCE_MAX ? ncclMax : ncclSum;
    int left = (c->rank + c->size - 1) % c->size, right = (c->rank + 1) % c->size;
    ncclResult_t r = ncclSuccess;
    switch (op->kind) {
    case ZN_COP_ALLREDUCE:
        r = ncclAllReduce(op->send, op->recv, op->count, ty, red, n->comm, cs);
        break;
    case ZN_COP_ALLGATHER:
        r = ncclAllGather(op->send, op->recv, op->count, ty, n->comm, cs);
        break;
    case ZN_COP_REDUCE_SCATTER:
        r = ncclReduceScatter(op->send, op->recv, op->count, ty, red, n->comm, cs);
        break;
    case ZN_COP_BROADCAST:
        r = ncclBroadcast(op->recv, op->recv, op->count, ncclInt8, op->root, n->comm, cs);
        break;
    case ZN_COP_BARRIER:
        return 0;
    case ZN_COP_RING:
        r = ncclGroupStart();
        if (r == ncclSuccess || r == ncclInProgress)
            r = ncclSend(op->send, op->count, ncclInt8, right, n->comm, cs);
        if (r == ncclSuccess || r == ncclInProgress)
            r = ncclRecv(op->recv, op->count, ncclInt8, left, n->comm, cs);
        {
            ncclResult_t e = ncclGroupEnd();
            if (r == ncclSuccess || r == ncclInProgress)
                r = e;
        }
        break;
    case ZN_COP_LINK:
        /* NCCL's send/recv involve the two ranks alone */
        if (c->rank == op->root)
            r = ncclSend(op->send, op->count, ncclInt8, right, n->comm, cs);
        else if (c->rank == (op->root + 1) % c->size)
            r = ncclRecv(op->recv, op->count, ncclInt8, left, n->comm, cs);
        break;
    }
    if (r == ncclInProgress)
        rc = wait_ready(n, zn_now_ns() + (uint64_t)(c->timeout_s * 1e9), op->desc);
    else if (r != ncclSuccess)
        rc = nccl_err(n, r, op->desc);
    if (rc)
        return zn_comm_fail(c, op, rc == ZN_ETIMEOUT ? ZN_FAIL_TIMEOUT : ZN_FAIL_IO, -1, rc,
                            "%s", zn_last_error());
    return 0;
}

int zn_nccl_sync(zn_comm *c, zn_stream *s)
{
    zn_nccl *n = c->nccl;
    cudaStream_t cs = native_stream(c, s);
    if (!cs)
        return zn_set_error(ZN_EUNSUPPORTED, "comm/nccl: the device layer does not expose its "
                            "CUDA streams (zn_cuda_stream_native)");
    int rc = set_device(n);
    if (rc)
        return rc;
    zn_comm_op op;
    memset(&op, 0, sizeof op);
    snprintf(op.desc, sizeof op.desc, "%s", n->last[0] ? n->last : "NCCL collective");
    uint64_t deadline = zn_now_ns() + (uint64_t)(c->timeout_s * 1e9);
    for (long guard = 0; guard < 100000000L; guard++) {
        cudaError_t e = cudaStreamQuery(cs);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return zn_comm_fail(c, &op, ZN_FAIL_IO, -1, ZN_ECUDA, "cudaStreamQuery: %s",
                                cudaGetErrorString(e));
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(n->comm, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress) {
            rc = zn_comm_fail(c, &op, ZN_FAIL_IO, -1, ZN_ENCCL, "NCCL: %s (%s)",
                              ncclGetErrorString(st), ncclGetLastError(n->comm));
            zn_nccl_abort(c);
            return rc;
        }
        if (zn_now_ns() >= deadline) {
            rc = zn_comm_fail(c, &op, ZN_FAIL_TIMEOUT, -1, ZN_ETIMEOUT,
                              "the NCCL stream did not finish within %.1f s", c->timeout_s);
            zn_nccl_abort(c);
            return rc;
        }
        nap();
    }
    return zn_set_error(ZN_ETIMEOUT, "comm/nccl: sync loop bound reached");
}
