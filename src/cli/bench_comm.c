/* `zinc bench comm`: all-gather, reduce-scatter and all-reduce bandwidth of
 * the communicator, with nccl-tests' definitions so that the figures can be
 * compared with theirs: size = the bytes of the full buffer (all-reduce: each
 * rank's buffer; all-gather: the gathered output; reduce-scatter: the
 * input), algbw = size / time, busbw = algbw * 2(n-1)/n (all-reduce) or
 * (n-1)/n (all-gather, reduce-scatter); time = the slowest rank's mean.
 * The ceiling beside it, measured in the same run: a ring send/recv (every
 * rank sends to its right neighbour and receives from its left one at once)
 * over the same transport, which is the link a ring collective's busbw
 * approaches. Every size is verified on seeded data (#wrong). Run it under
 * mpirun / srun / torchrun variables; rank 0 prints. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zinc/comm.h"
#include "zinc/device.h"
#include "zinc/topo.h"
#include "comm/comm-impl.h"
#include "cli/cli.h"
#include "zn_build_config.h"

enum { OP_ALLGATHER = 0, OP_REDUCESCATTER, OP_ALLREDUCE, N_OPS };
static const char *op_names[N_OPS] = { "allgather", "reducescatter", "allreduce" };

typedef struct {
    uint64_t sizes[64];
    int n_sizes;
    int ops[N_OPS];
    zn_dtype dt;
    int iters, warmup;
    const char *csv;
    const char *device;
    double timeout;
} opts;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: [mpirun -np N | torchrun-style env] zinc bench comm [options]\n"
        "  --sizes A..B     sizes from A to B doubling (default 1M..1G); or a list 4K,1M\n"
        "  --ops LIST       allgather,reducescatter,allreduce (default all three)\n"
        "  --dtype T        f32 (default) or bf16\n"
        "  --iters N        timed iterations per size (default: 20, fewer for big sizes)\n"
        "  --warmup N       untimed iterations first (default 2)\n"
        "  --device NAME    collectives on device buffers of NAME (cuda:K with NCCL,\n"
        "                   host = the host device's stream path); default host buffers\n"
        "  --timeout S      collective timeout in seconds (default 120)\n"
        "  --csv FILE       also write the rows as CSV (rank 0)\n"
        "size = nccl-tests' size (all-reduce: per-rank buffer; all-gather: output;\n"
        "reduce-scatter: input); busbw = algbw x 2(n-1)/n (all-reduce), (n-1)/n (others).\n");
}

static int parse_sizes(const char *s, opts *o)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    char *dots = strstr(buf, "..");
    o->n_sizes = 0;
    if (dots) {
        *dots = 0;
        uint64_t a, b;
        if (zn_parse_size(buf, &a) || zn_parse_size(dots + 2, &b) || a == 0 || b < a)
            return -1;
        for (uint64_t x = a; x <= b && o->n_sizes < 64; x *= 2)
            o->sizes[o->n_sizes++] = x;
        return 0;
    }
    for (char *tok = strtok(buf, ","); tok && o->n_sizes < 64; tok = strtok(NULL, ",")) {
        uint64_t x;
        if (zn_parse_size(tok, &x) || x == 0)
            return -1;
        o->sizes[o->n_sizes++] = x;
    }
    return o->n_sizes ? 0 : -1;
}

static int parse_ops(const char *s, opts *o)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    memset(o->ops, 0, sizeof o->ops);
    int any = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int k = -1;
        for (int i = 0; i < N_OPS; i++)
            if (!strcmp(tok, op_names[i]))
                k = i;
        if (k < 0)
            return -1;
        o->ops[k] = 1;
        any = 1;
    }
    return any ? 0 : -1;
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

/* Fills the send buffer of op; returns the number of wrong elements of the
 * output (after the caller ran the op), summed over ranks by the caller. */
static int stage_send(bufs *b, size_t n_send, zn_dtype dt, int rank)
{
    fill(b->dev ? b->hsend : b->send, dt, n_send, rank);
    if (!b->dev)
        return 0;
    int rc = zn_dev_copy_h2d(b->dev, b->s, b->send, b->hsend, n_send * zn_dtype_size(dt));
    return rc ? rc : zn_dev_stream_sync(b->dev, b->s);
}

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
        else
            want = sum_ref(world, i);
        bad += get(out, dt, i) != want;
    }
    *wrong = bad;
    return 0;
}

static int bench_fail(zn_comm *c, int rc, const char *what)
{
    zn_cli_fail(rc, what);
    if (c && zn_comm_size(c) > 1) {
        fflush(stdout);
        /* A failed collective leaves the other ranks waiting: end the job
         * (MPI: MPI_Abort; TCP: the peers see the sockets close). */
        zn_cli_end_job(zn_comm_abort(c, 1), 1);
    }
    return 1;
}

/* Parses the command line into *o. Returns -1 to go on, or the exit code
 * to return at once: 0 after --help, 2 on bad usage. */
static int parse_opts(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    parse_sizes("1M..1G", o);
    for (int i = 0; i < N_OPS; i++)
        o->ops[i] = 1;
    o->dt = ZN_DTYPE_F32;
    o->iters = 0;
    o->warmup = 2;
    o->timeout = 120;
    static const struct option lo[] = {
        { "sizes", required_argument, NULL, 's' }, { "ops", required_argument, NULL, 'o' },
        { "dtype", required_argument, NULL, 't' }, { "iters", required_argument, NULL, 'n' },
        { "warmup", required_argument, NULL, 'w' }, { "csv", required_argument, NULL, 'c' },
        { "device", required_argument, NULL, 'd' }, { "timeout", required_argument, NULL, 'T' },
        { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        char *end;
        switch (ch) {
        case 's':
            if (parse_sizes(optarg, o)) {
                fprintf(stderr, "zinc: error: --sizes \"%s\": want A..B or a list (4K,1M)\n",
                        optarg);
                return 2;
            }
            break;
        case 'o':
            if (parse_ops(optarg, o)) {
                fprintf(stderr, "zinc: error: --ops \"%s\": allgather, reducescatter, "
                        "allreduce\n", optarg);
                return 2;
            }
            break;
        case 't':
            if (!strcmp(optarg, "f32"))
                o->dt = ZN_DTYPE_F32;
            else if (!strcmp(optarg, "bf16"))
                o->dt = ZN_DTYPE_BF16;
            else {
                fprintf(stderr, "zinc: error: --dtype \"%s\": f32 or bf16\n", optarg);
                return 2;
            }
            break;
        case 'n':
        case 'w': {
            long v = strtol(optarg, &end, 10);
            if (*end || v < (ch == 'n' ? 1 : 0) || v > 100000) {
                fprintf(stderr, "zinc: error: --%s \"%s\"\n", ch == 'n' ? "iters" : "warmup",
                        optarg);
                return 2;
            }
            if (ch == 'n')
                o->iters = (int)v;
            else
                o->warmup = (int)v;
            break;
        }
        case 'T':
            o->timeout = strtod(optarg, &end);
            if (*end || !(o->timeout > 0)) {
                fprintf(stderr, "zinc: error: --timeout \"%s\"\n", optarg);
                return 2;
            }
            break;
        case 'c':
            o->csv = optarg;
            break;
        case 'd':
            o->device = optarg;
            break;
        default:
            return zn_bench_usage_exit(ch, usage);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zinc: error: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return -1;
}

/* The launch environment into *li, the device of --device (NULL: host
 * buffers) and the communicator over them. Returns 0, or the exit code
 * after the error is printed. */
static int open_comm(const opts *o, zn_launch_info *li, zn_dev **dev_out, zn_comm **c_out)
{
    int rc = zn_launch_detect(li);
    if (rc)
        return zn_cli_fail(rc, "launch environment");
    zn_dev *dev = NULL;
    if (o->device) {
        zn_dev_config dc = zn_dev_config_default();
        char name[32];
        if (!strcmp(o->device, "auto")) {
            if ((rc = zn_launch_device_name(li, name, sizeof name)))
                return zn_cli_fail(rc, "device");
            dc.name = name;
        } else {
            dc.name = o->device;
        }
        uint64_t need = 3 * o->sizes[o->n_sizes - 1] + (64u << 20);
        dc.gpu_budget = need;
        if ((rc = zn_dev_create(&dev, &dc)))
            return zn_cli_fail(rc, "creating the device");
    }
    zn_comm_config cfg = zn_comm_config_default();
    cfg.timeout_s = o->timeout;
    cfg.launch = li;
    cfg.dev = dev;
    zn_comm *c = NULL;
    if ((rc = zn_comm_create(&c, &cfg))) {
        zn_dev_destroy(dev);
        return zn_cli_fail(rc, "creating the communicator");
    }
    *dev_out = dev;
    *c_out = c;
    return 0;
}

/* Rank 0's '#' lines before the table: the machine, the world, the path,
 * the definitions, the column heads. *topo: the machine, for the CSV. */
static void print_header(const opts *o, const zn_comm_info *info, const zn_dev *dev,
                         zn_topo *topo)
{
    int world = info->size;
    if (zn_topo_discover(topo))
        snprintf(topo->cpu_model, sizeof topo->cpu_model, "unknown CPU");
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    printf("# zinc bench comm: collective bandwidth, nccl-tests definitions (algbw = size "
           "/ time, busbw = algbw x factor)\n");
    printf("# machine: %s (rank 0), %s, %d cores / %d threads, %d NUMA node%s\n", host,
           topo->cpu_model, topo->cores, topo->pus, topo->n_numa, topo->n_numa == 1 ? "" : "s");
    printf("# zinc %s; world %d (%s launch, %d rank%s on this host); host backend %s, "
           "device part %s; %s\n", ZN_VERSION, world, zn_launcher_name(info->launcher),
           info->local_size, info->local_size == 1 ? "" : "s", info->host_backend,
           info->dev_backend, info->version);
    printf("# path: %s buffers%s; dtype %s; sum; time = slowest rank's mean over the timed "
           "iterations\n", dev ? "device" : "host",
           dev ? (info->nccl ? " (NCCL on the stream)" : " (collective on the stream's "
                              "thread)") : "", zn_dtype_name(o->dt));
    printf("# factor: allreduce 2(n-1)/n = %.3f, allgather and reducescatter (n-1)/n = "
           "%.3f\n", 2.0 * (world - 1) / world, (double)(world - 1) / world);
    printf("# link: ring send/recv of min(size, 64 MiB) in the same run (each rank sends "
           "to its right neighbour while it receives from its left one): the ceiling "
           "a ring collective's busbw approaches; bus/link = busbw / link\n");
    if (world == 1)
        printf("# world size 1: the collectives are copies (single backend), busbw is 0 "
               "by definition; algbw is the copy speed and link the memcpy speed\n");
    printf("# shared machines are noisy: compare ratios measured in one run\n#\n");
    printf("# %10s %11s %6s %-13s %10s %8s %8s %8s %8s %8s\n", "size(B)", "count", "type",
           "op", "time(us)", "algbw", "busbw", "link", "bus/link", "#wrong");
    printf("# %10s %11s %6s %-13s %10s %8s %8s %8s %8s %8s\n", "", "(elements)", "", "",
           "", "(GB/s)", "(GB/s)", "(GB/s)", "", "");
}

/* --csv FILE, new, with its header line (rank 0). Returns 0 or -errno. */
static int open_csv(const char *path, FILE **out)
{
    FILE *csv = fopen(path, "w");
    if (!csv)
        return zn_set_error(-errno, "opening %s: %s", path, strerror(errno));
    fprintf(csv, "cpu,world,host_backend,dev_backend,path,dtype,op,size_bytes,count,"
            "time_us,algbw_gbs,busbw_gbs,link_gbs,bus_over_link,wrong\n");
    *out = csv;
    return 0;
}

/* The send and receive buffers for sizes up to max_size, on the device
 * with host staging, or on the host first-touched. Returns 0 or a
 * negative code. */
static int alloc_bufs(bufs *b, zn_comm *c, zn_dev *dev, uint64_t max_size)
{
    int rc;
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
        rc = run_op(b, op, count, o->dt);
    uint64_t wrong1 = 0;
    if (!rc)
        rc = count_wrong(b, op, count, o->dt, rank, world, &wrong1);
    if (!rc)
        rc = zn_comm_barrier(b->c);
    double t0 = zn_now_s();
    for (int it = 0; it < iters && !rc; it++)
        rc = run_op(b, op, count, o->dt);
    float mean = (float)((zn_now_s() - t0) / iters);
    uint64_t wrong2 = 0;
    if (!rc)
        rc = count_wrong(b, op, count, o->dt, rank, world, &wrong2);
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

/* what rank 0 prints of one collective at one size */
typedef struct {
    int op;
    uint64_t used;               /* nccl-tests' size in bytes */
    size_t count;                /* elements of that size */
    float t;                     /* seconds */
    double algbw, busbw, link, ratio;
    float wrong;
} op_row;

static void print_row(const opts *o, const zn_comm_info *info, const zn_dev *dev,
                      const zn_topo *topo, FILE *csv, const op_row *r)
{
    printf("  %10llu %11zu %6s %-13s %10.1f %8.3f %8.3f %8.3f %8.3f %8llu\n",
           (unsigned long long)r->used, r->count, zn_dtype_name(o->dt), op_names[r->op],
           r->t * 1e6, r->algbw, r->busbw, r->link, r->ratio, (unsigned long long)r->wrong);
    fflush(stdout);
    if (csv)
        fprintf(csv, "\"%s\",%d,%s,%s,%s,%s,%s,%llu,%zu,%.1f,%.4f,%.4f,%.4f,%.4f,"
                "%llu\n", topo->cpu_model, info->size, info->host_backend, info->dev_backend,
                dev ? "device" : "host", zn_dtype_name(o->dt), op_names[r->op],
                (unsigned long long)r->used, r->count, r->t * 1e6, r->algbw, r->busbw, r->link,
                r->ratio, (unsigned long long)r->wrong);
}

int zn_bench_comm(int argc, char **argv)
{
    opts o;
    int code = parse_opts(argc, argv, &o);
    if (code >= 0)
        return code;

    zn_launch_info li;
    zn_dev *dev = NULL;
    zn_comm *c = NULL;
    if ((code = open_comm(&o, &li, &dev, &c)))
        return code;
    zn_comm_info info;
    zn_comm_get_info(c, &info);
    int rank = info.rank, world = info.size, rc;
    size_t es = zn_dtype_size(o.dt);

    FILE *csv = NULL;
    zn_topo topo;
    memset(&topo, 0, sizeof topo);
    if (rank == 0) {
        print_header(&o, &info, dev, &topo);
        if (o.csv && (rc = open_csv(o.csv, &csv)))
            return bench_fail(c, rc, "--csv");
    }

    bufs b;
    if ((rc = alloc_bufs(&b, c, dev, o.sizes[o.n_sizes - 1])))
        return bench_fail(c, rc, "allocating buffers");

    uint64_t total_wrong = 0;
    for (int si = 0; si < o.n_sizes; si++) {
        uint64_t size = o.sizes[si];
        int iters = o.iters ? o.iters
                            : (int)(size >= (256u << 20) ? 3 : size >= (32u << 20) ? 8 : 20);
        /* Ceiling for this size: the ring send/recv. */
        size_t lbytes = size < (64u << 20) ? size : (64u << 20);
        double link = 0;
        if ((rc = time_link(&b, &o, iters, lbytes, &link)))
            return bench_fail(c, rc, "ring send/recv");
        for (int op = 0; op < N_OPS; op++) {
            if (!o.ops[op])
                continue;
            size_t count, n_send;
            op_row r = { .op = op, .link = link };
            if (op == OP_ALLREDUCE) {
                count = size / es;
                n_send = count;
                r.used = count * es;
            } else {
                count = size / es / (size_t)world;   /* per rank */
                n_send = op == OP_ALLGATHER ? count : count * (size_t)world;
                r.used = count * (size_t)world * es;
            }
            if (!count)
                continue;
            if ((rc = stage_send(&b, n_send, o.dt, rank)))
                return bench_fail(c, rc, "staging data");
            if ((rc = time_op(&b, &o, op, count, iters, rank, world, &r.t, &r.wrong)))
                return bench_fail(c, rc, op_names[op]);
            r.count = op == OP_ALLREDUCE ? count : count * world;
            r.algbw = r.t > 0 ? (double)r.used / r.t / 1e9 : 0;
            double factor = op == OP_ALLREDUCE ? 2.0 * (world - 1) / world
                                               : (double)(world - 1) / world;
            r.busbw = r.algbw * factor;
            r.ratio = link > 0 ? r.busbw / link : 0;
            total_wrong += (uint64_t)r.wrong;
            if (rank == 0)
                print_row(&o, &info, dev, &topo, csv, &r);
        }
    }
    if (rank == 0) {
        printf("# total #wrong: %llu\n", (unsigned long long)total_wrong);
        if (csv && fclose(csv) != 0)
            fprintf(stderr, "zinc: error: writing %s: %s\n", o.csv, strerror(errno));
    }
    free_bufs(&b);
    zn_comm_destroy(c);
    zn_dev_destroy(dev);
    return total_wrong ? 1 : 0;
}
