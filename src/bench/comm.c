/* zinc bench comm's measuring half: all-gather, reduce-scatter,
 * all-reduce and broadcast bandwidth of the communicator, with nccl-tests' definitions so
 * that the figures can be compared with theirs: size = the bytes of the
 * full buffer (all-reduce: each rank's buffer; all-gather: the gathered
 * output; reduce-scatter: the input), algbw = size / time, busbw = algbw *
 * 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter) or 1
 * (broadcast); time = the
 * slowest rank's mean. The ceiling beside it, measured in the same run: a
 * ring send/recv (every rank sends to its right neighbour and receives from
 * its left one at once) over the same transport, which is the link a ring
 * collective's busbw approaches. Every size is verified on seeded data
 * (#wrong). The cluster check's links (each ring link alone, verified at
 * its receiver) use the same buffers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/bench.h"
#include "zinc/comm.h"
#include "zinc/device.h"
#include "comm/comm-impl.h"

enum { OP_ALLGATHER = ZN_BENCH_ALLGATHER, OP_REDUCESCATTER = ZN_BENCH_REDUCESCATTER,
       OP_ALLREDUCE = ZN_BENCH_ALLREDUCE, OP_BROADCAST = ZN_BENCH_BROADCAST,
       N_OPS = ZN_BENCH_COMM_OPS };
static const char *op_names[N_OPS] = { "allgather", "reducescatter", "allreduce", "broadcast" };
#define BCAST_ROOT 0

typedef zn_bench_comm_config opts;

const char *zn_bench_comm_op_name(int op)
{
    return op >= 0 && op < N_OPS ? op_names[op] : NULL;
}

/* Seeded data: small integers, so that sums over ranks are exact. */
static float val(int rank, size_t i)
{
    return (float)((int)((i * 7 + (size_t)rank * 13 + 5) % 17) - 8);
}

static void fill(void *buf, zn_dtype dt, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == ZN_DTYPE_F32)
            ((float *)buf)[i] = val(rank, i);
        else
            ((uint16_t *)buf)[i] = zn_bf16_round(val(rank, i));
    }
}

static float get(const void *buf, zn_dtype dt, size_t i)
{
    return dt == ZN_DTYPE_F32 ? ((const float *)buf)[i]
                              : zn_bf16_widen(((const uint16_t *)buf)[i]);
}

static float sum_ref(int world, size_t i)
{
    float s = 0;
    for (int r = 0; r < world; r++)
        s += val(r, i);
    return s;
}

/* Buffers and the collective on host memory or on device memory. */
typedef struct {
    zn_comm *c;
    zn_dev *dev;
    zn_stream *s;
    void *send, *recv;         /* host or device */
    void *hsend, *hrecv;       /* host staging for fill/verify on a device */
    size_t send_bytes, recv_bytes;
} bufs;

static int run_op(bufs *b, int op, size_t count, zn_dtype dt)
{
    int rc;
    if (!b->dev) {
        switch (op) {
        case OP_ALLGATHER:
            return zn_comm_allgather(b->c, b->send, b->recv, count, dt);
        case OP_REDUCESCATTER:
            return zn_comm_reduce_scatter(b->c, b->send, b->recv, count, dt, ZN_REDUCE_SUM);
        case OP_BROADCAST:
            return zn_comm_broadcast(b->c, b->recv, count * zn_dtype_size(dt), BCAST_ROOT);
        default:
            return zn_comm_allreduce(b->c, b->send, b->recv, count, dt, ZN_REDUCE_SUM);
        }
    }
    switch (op) {
    case OP_ALLGATHER:
        rc = zn_comm_allgather_on(b->c, b->s, b->send, b->recv, count, dt);
        break;
    case OP_REDUCESCATTER:
        rc = zn_comm_reduce_scatter_on(b->c, b->s, b->send, b->recv, count, dt, ZN_REDUCE_SUM);
        break;
    case OP_BROADCAST:
        rc = zn_comm_broadcast_on(b->c, b->s, b->recv, count * zn_dtype_size(dt), BCAST_ROOT);
        break;
    default:
        rc = zn_comm_allreduce_on(b->c, b->s, b->send, b->recv, count, dt, ZN_REDUCE_SUM);
        break;
    }
    return rc ? rc : zn_comm_sync_on(b->c, b->s);
}

static int run_ring(bufs *b, size_t bytes)
{
    if (!b->dev)
        return zn_comm_ring_xfer(b->c, b->send, b->recv, bytes);
    int rc = zn_comm_ring_xfer_on(b->c, b->s, b->send, b->recv, bytes);
    return rc ? rc : zn_comm_sync_on(b->c, b->s);
}

/* Fills the send buffer of op (and copies it to the device). A broadcast
 * is in place: the root's receive buffer holds the data, every other
 * rank's a poison (all bits set: NaN in f32 and bf16) that shows an
 * element the broadcast did not write. */
static int stage_send(bufs *b, int op, size_t n_send, zn_dtype dt, int rank)
{
    int bcast = op == OP_BROADCAST;
    void *h = bcast ? (b->dev ? b->hrecv : b->recv) : (b->dev ? b->hsend : b->send);
    if (bcast && rank != BCAST_ROOT)
        memset(h, 0xff, n_send * zn_dtype_size(dt));
    else
        fill(h, dt, n_send, rank);
    if (!b->dev)
        return 0;
    int rc = zn_dev_copy_h2d(b->dev, b->s, bcast ? b->recv : b->send, h,
                             n_send * zn_dtype_size(dt));
    return rc ? rc : zn_dev_stream_sync(b->dev, b->s);
}

/* *wrong: the wrong elements of op's output (after the caller ran it),
 * summed over ranks by the caller. */
static int count_wrong(bufs *b, int op, size_t count, zn_dtype dt, int rank, int world,
                       uint64_t *wrong)
{
    size_t n_out = op == OP_ALLGATHER ? count * (size_t)world : count;
    size_t es = zn_dtype_size(dt);
    const void *out = b->recv;
    if (b->dev) {
        int rc = zn_dev_copy_d2h(b->dev, b->s, b->hrecv, b->recv, n_out * es);
        if (!rc)
            rc = zn_dev_stream_sync(b->dev, b->s);
        if (rc)
            return rc;
        out = b->hrecv;
    }
    uint64_t bad = 0;
    for (size_t i = 0; i < n_out; i++) {
        float want;
        if (op == OP_ALLGATHER)
            want = val((int)(i / count), i % count);
        else if (op == OP_REDUCESCATTER)
            want = sum_ref(world, (size_t)rank * count + i);
        else if (op == OP_BROADCAST)
            want = val(BCAST_ROOT, i);
        else
            want = sum_ref(world, i);
        bad += get(out, dt, i) != want;
    }
    *wrong = bad;
    return 0;
}
/* The launch environment into *li, the device of o->device (NULL: host
 * buffers) and the communicator over them. Returns 0 or a negative code,
 * its message prefixed with the stage. */
static int open_comm(const opts *o, zn_launch_info *li, zn_dev **dev_out, zn_comm **c_out)
{
    int rc = zn_launch_detect(li);
    if (rc)
        return zn_error_prefix(rc, "launch environment");
    zn_dev *dev = NULL;
    if (o->device) {
        zn_dev_config dc = zn_dev_config_default();
        char name[32];
        if (!strcmp(o->device, "auto")) {
            if ((rc = zn_launch_device_name(li, name, sizeof name)))
                return zn_error_prefix(rc, "device");
            dc.name = name;
        } else {
            dc.name = o->device;
        }
        uint64_t big = o->sizes[o->n_sizes - 1] > o->link_bytes ? o->sizes[o->n_sizes - 1]
                                                                  : o->link_bytes;
        uint64_t need = 3 * big + (64u << 20);
        dc.gpu_budget = need;
        if ((rc = zn_dev_create(&dev, &dc)))
            return zn_error_prefix(rc, "creating the device");
    }
    zn_comm_config cfg = zn_comm_config_default();
    cfg.timeout_s = o->timeout;
    if (o->connect_timeout > 0)
        cfg.connect_timeout_s = o->connect_timeout;
    cfg.launch = li;
    cfg.dev = dev;
    zn_comm *c = NULL;
    if ((rc = zn_comm_create(&c, &cfg))) {
        zn_error_prefix(rc, "creating the communicator");
        zn_dev_destroy(dev);
        return rc;
    }
    *dev_out = dev;
    *c_out = c;
    return 0;
}

/* The send and receive buffers for sizes up to max_size, on the device
 * with host staging, or on the host first-touched. Returns 0 or a
 * negative code. */
static void free_bufs(bufs *b);

static int alloc_bufs(bufs *b, zn_comm *c, zn_dev *dev, uint64_t max_size)
{
    int rc;
    if (b->send && b->send_bytes >= max_size + 4096)
        return 0;   /* made by an earlier call, big enough */
    free_bufs(b);
    memset(b, 0, sizeof *b);
    b->c = c;
    b->dev = dev;
    b->s = dev ? zn_comm_stream(c) : NULL;
    b->send_bytes = b->recv_bytes = max_size + 4096;
    if (dev) {
        rc = zn_dev_alloc(dev, b->send_bytes, "bench send", &b->send);
        if (!rc)
            rc = zn_dev_alloc(dev, b->recv_bytes, "bench recv", &b->recv);
        b->hsend = malloc(b->send_bytes);
        b->hrecv = malloc(b->recv_bytes);
        if (!rc && (!b->hsend || !b->hrecv))
            rc = zn_set_error(-ENOMEM, "bench: host staging of %llu bytes",
                              (unsigned long long)b->send_bytes);
    } else {
        b->send = malloc(b->send_bytes);
        b->recv = malloc(b->recv_bytes);
        rc = b->send && b->recv ? 0 : zn_set_error(-ENOMEM, "bench: two buffers of %llu bytes",
                                                   (unsigned long long)b->send_bytes);
    }
    if (rc)
        return rc;
    /* First touch outside the timing. */
    if (!dev) {
        memset(b->send, 0, b->send_bytes);
        memset(b->recv, 0, b->recv_bytes);
    }
    return 0;
}

static void free_bufs(bufs *b)
{
    if (b->dev) {
        zn_dev_free(b->dev, b->send);
        zn_dev_free(b->dev, b->recv);
        free(b->hsend);
        free(b->hrecv);
    } else {
        free(b->send);
        free(b->recv);
    }
}

/* The ceiling for one size: the ring send/recv of lbytes, the slowest
 * rank's mean into *link (GB/s). Returns 0 or a negative code. */
static int time_link(bufs *b, const opts *o, int iters, size_t lbytes, double *link)
{
    int rc = 0;
    for (int w = 0; w < o->warmup && !rc; w++)
        rc = run_ring(b, lbytes);
    if (!rc)
        rc = zn_comm_barrier(b->c);
    double t0 = zn_now_s();
    for (int it = 0; it < iters && !rc; it++)
        rc = run_ring(b, lbytes);
    float t = (float)((zn_now_s() - t0) / iters);
    if (!rc)
        rc = zn_comm_allreduce(b->c, &t, &t, 1, ZN_DTYPE_F32, ZN_REDUCE_MAX);
    if (rc)
        return rc;
    *link = t > 0 ? (double)lbytes / t / 1e9 : 0;
    return 0;
}

/* Collective op on count elements (per rank for all-gather and
 * reduce-scatter), its send buffer staged: the warm-up, the output checked,
 * the timed iterations, the output checked again. *t: the slowest rank's
 * mean seconds; *wrong: wrong elements summed over ranks and both checks.
 * Returns 0 or a negative code. */
static int time_op(bufs *b, const opts *o, int op, size_t count, int iters, int rank,
                   int world, float *t, float *wrong)
{
    int rc = 0;
    for (int w = 0; w < o->warmup + 1 && !rc; w++)
        rc = run_op(b, op, count, o->dtype);
    uint64_t wrong1 = 0;
    if (!rc)
        rc = count_wrong(b, op, count, o->dtype, rank, world, &wrong1);
    if (!rc)
        rc = zn_comm_barrier(b->c);
    double t0 = zn_now_s();
    for (int it = 0; it < iters && !rc; it++)
        rc = run_op(b, op, count, o->dtype);
    float mean = (float)((zn_now_s() - t0) / iters);
    uint64_t wrong2 = 0;
    if (!rc)
        rc = count_wrong(b, op, count, o->dtype, rank, world, &wrong2);
    /* max time over ranks; #wrong summed (float is exact to 2^24) */
    float stats[2] = { mean, 0 }, wr = (float)(wrong1 + wrong2);
    if (!rc)
        rc = zn_comm_allreduce(b->c, stats, stats, 1, ZN_DTYPE_F32, ZN_REDUCE_MAX);
    if (!rc)
        rc = zn_comm_allreduce(b->c, &wr, &wr, 1, ZN_DTYPE_F32, ZN_REDUCE_SUM);
    if (rc)
        return rc;
    *t = stats[0];
    *wrong = wr;
    return 0;
}

struct zn_bench_comm {
    opts o;
    zn_launch_info li;
    zn_dev *dev;
    zn_comm *c;
    bufs b;
};

int zn_bench_comm_create(zn_bench_comm **out, const zn_bench_comm_config *cfg)
{
    *out = NULL;
    if (cfg->n_sizes < 1 || cfg->n_sizes > ZN_BENCH_COMM_MAX_SIZES || cfg->iters < 0 ||
        cfg->warmup < 0)
        return zn_set_error(ZN_EARG, "%d sizes, %d iterations, %d warm-up", cfg->n_sizes,
                            cfg->iters, cfg->warmup);
    zn_bench_comm *bc = calloc(1, sizeof *bc);
    if (!bc)
        return zn_set_error(-ENOMEM, "out of memory");
    bc->o = *cfg;
    int rc = open_comm(&bc->o, &bc->li, &bc->dev, &bc->c);
    if (rc) {
        free(bc);
        return rc;
    }
    *out = bc;
    return 0;
}

void zn_bench_comm_get_info(const zn_bench_comm *bc, zn_comm_info *out)
{
    zn_comm_get_info(bc->c, out);
}

zn_comm *zn_bench_comm_comm(const zn_bench_comm *bc)
{
    return bc ? bc->c : NULL;
}

int zn_bench_comm_on_device(const zn_bench_comm *bc)
{
    return bc->dev != NULL;
}

/* One op at one size: its send buffer staged, timed, verified, its row. */
static int measure(zn_bench_comm *bc, int op, uint64_t size, int iters, double link,
                   zn_bench_comm_row *r, int *skip)
{
    const opts *o = &bc->o;
    int rank = zn_comm_rank(bc->c), world = zn_comm_size(bc->c), rc;
    size_t es = zn_dtype_size(o->dtype);
    size_t count, n_send;
    *r = (zn_bench_comm_row){ .op = op, .link = link };
    if (op == OP_ALLREDUCE || op == OP_BROADCAST) {
        count = size / es;
        n_send = count;
        r->used = count * es;
    } else {
        count = size / es / (size_t)world;   /* per rank */
        n_send = op == OP_ALLGATHER ? count : count * (size_t)world;
        r->used = count * (size_t)world * es;
    }
    *skip = !count;
    if (!count)
        return 0;
    if ((rc = stage_send(&bc->b, op, n_send, o->dtype, rank)))
        return zn_error_prefix(rc, "staging data");
    if ((rc = time_op(&bc->b, o, op, count, iters, rank, world, &r->t, &r->wrong)))
        return zn_error_prefix(rc, "%s", op_names[op]);
    r->count = op == OP_ALLREDUCE || op == OP_BROADCAST ? count : count * world;
    r->algbw = r->t > 0 ? (double)r->used / r->t / 1e9 : 0;
    double factor = op == OP_ALLREDUCE ? 2.0 * (world - 1) / world
                    : op == OP_BROADCAST ? 1.0 : (double)(world - 1) / world;
    r->busbw = r->algbw * factor;
    r->ratio = link > 0 ? r->busbw / link : 0;
    return 0;
}

int zn_bench_comm_run(zn_bench_comm *bc, zn_bench_comm_row_fn fn, void *ctx,
                      uint64_t *total_wrong)
{
    const opts *o = &bc->o;
    int rc;
    *total_wrong = 0;
    if ((rc = alloc_bufs(&bc->b, bc->c, bc->dev, o->sizes[o->n_sizes - 1])))
        return zn_error_prefix(rc, "allocating buffers");
    for (int si = 0; si < o->n_sizes; si++) {
        uint64_t size = o->sizes[si];
        int iters = o->iters ? o->iters
                             : (int)(size >= (256u << 20) ? 3 : size >= (32u << 20) ? 8 : 20);
        /* Ceiling for this size: the ring send/recv. */
        size_t lbytes = size < (64u << 20) ? size : (64u << 20);
        double link = 0;
        if ((rc = time_link(&bc->b, o, iters, lbytes, &link)))
            return zn_error_prefix(rc, "ring send/recv");
        for (int op = 0; op < N_OPS; op++) {
            if (!o->ops[op])
                continue;
            zn_bench_comm_row r;
            int skip;
            if ((rc = measure(bc, op, size, iters, link, &r, &skip)))
                return rc;
            if (skip)
                continue;
            *total_wrong += (uint64_t)r.wrong;
            if (fn && (rc = fn(ctx, &r)))
                return rc;
        }
    }
    return 0;
}

/* One link's timed transfers, its receiver's mean seconds in *t and its
 * wrong bytes in *wrong (the receiver's; 0 elsewhere). */
static int time_one_link(bufs *b, const opts *o, int from, size_t bytes, int iters, int rank,
                         int world, float *t, float *wrong)
{
    int to = (from + 1) % world, rc = 0;
    *t = 0;
    *wrong = 0;
    if (rank == to) {
        /* the poison: whatever the transfer leaves unwritten shows */
        memset(b->dev ? b->hrecv : b->recv, 0xa5, bytes);
        if (b->dev && (rc = zn_dev_copy_h2d(b->dev, b->s, b->recv, b->hrecv, bytes)) == 0)
            rc = zn_dev_stream_sync(b->dev, b->s);
    }
    for (int w = 0; w < o->warmup + 1 && !rc; w++)
        rc = b->dev ? zn_comm_link_xfer_on(b->c, b->s, b->send, b->recv, bytes, from)
                    : zn_comm_link_xfer(b->c, b->send, b->recv, bytes, from);
    if (!rc && b->dev)
        rc = zn_comm_sync_on(b->c, b->s);
    if (!rc)
        rc = zn_comm_barrier(b->c);
    double t0 = zn_now_s();
    for (int it = 0; it < iters && !rc; it++) {
        rc = b->dev ? zn_comm_link_xfer_on(b->c, b->s, b->send, b->recv, bytes, from)
                    : zn_comm_link_xfer(b->c, b->send, b->recv, bytes, from);
        if (!rc && b->dev)
            rc = zn_comm_sync_on(b->c, b->s);
    }
    double mean = (zn_now_s() - t0) / iters;
    if (rc || rank != to)
        return rc;
    const unsigned char *got = b->recv;
    if (b->dev) {
        if ((rc = zn_dev_copy_d2h(b->dev, b->s, b->hrecv, b->recv, bytes)) ||
            (rc = zn_dev_stream_sync(b->dev, b->s)))
            return rc;
        got = b->hrecv;
    }
    /* the sender's seeded f32 elements (its rank, the offset), byte by byte */
    uint64_t bad = 0;
    for (size_t i = 0; i < bytes / 4; i++) {
        float want = val(from, i);
        bad += memcmp(got + 4 * i, &want, 4) != 0;
    }
    *t = (float)mean;
    *wrong = (float)bad * 4;
    return 0;
}

int zn_bench_comm_links(zn_bench_comm *bc, uint64_t bytes, int iters, zn_bench_link_row *rows)
{
    const opts *o = &bc->o;
    int rank = zn_comm_rank(bc->c), world = zn_comm_size(bc->c), rc;
    bytes &= ~(uint64_t)3;
    if (bytes < 4 || bytes > o->link_bytes || iters < 1)
        return zn_set_error(ZN_EARG, "links: %llu bytes (4 .. link_bytes %llu), %d iterations",
                            (unsigned long long)bytes, (unsigned long long)o->link_bytes, iters);
    uint64_t big = o->sizes[o->n_sizes - 1] > o->link_bytes ? o->sizes[o->n_sizes - 1]
                                                              : o->link_bytes;
    if ((rc = alloc_bufs(&bc->b, bc->c, bc->dev, big)))
        return zn_error_prefix(rc, "allocating buffers");
    if ((rc = stage_send(&bc->b, OP_ALLREDUCE, bytes / 4, ZN_DTYPE_F32, rank)))
        return zn_error_prefix(rc, "staging data");
    float *acc = calloc(2 * (size_t)world, sizeof *acc);
    if (!acc)
        return zn_set_error(-ENOMEM, "links: out of memory");
    for (int from = 0; from < world && !rc; from++) {
        float t, wrong;
        rc = time_one_link(&bc->b, o, from, bytes, iters, rank, world, &t, &wrong);
        if (rc) {
            zn_error_prefix(rc, "link %d -> %d", from, (from + 1) % world);
            break;
        }
        acc[2 * from] += t;
        acc[2 * from + 1] += wrong;
    }
    /* every receiver's figures to every rank (one non-zero term each) */
    if (!rc)
        rc = zn_comm_allreduce(bc->c, acc, acc, 2 * (size_t)world, ZN_DTYPE_F32,
                               ZN_REDUCE_SUM);
    for (int from = 0; from < world && !rc; from++) {
        zn_bench_link_row *r = &rows[from];
        r->from = from;
        r->to = (from + 1) % world;
        r->bytes = bytes;
        r->t = acc[2 * from];
        r->wrong = acc[2 * from + 1];
        r->gbs = r->t > 0 ? (double)bytes / r->t / 1e9 : 0;
    }
    free(acc);
    return rc;
}

zn_dev *zn_bench_comm_device(const zn_bench_comm *bc)
{
    return bc ? bc->dev : NULL;
}

void zn_bench_comm_destroy(zn_bench_comm *bc)
{
    if (!bc)
        return;
    free_bufs(&bc->b);
    zn_comm_destroy(bc->c);
    zn_dev_destroy(bc->dev);
    free(bc);
}
