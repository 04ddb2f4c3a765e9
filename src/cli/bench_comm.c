/* `zinc bench comm`: the flags and the table of all-gather, reduce-scatter
 * and all-reduce bandwidth with nccl-tests' definitions (size, algbw =
 * size / time, busbw = algbw * 2(n-1)/n or (n-1)/n) beside the ring
 * send/recv of the same run; the collectives, their verification and the
 * figures are src/bench/comm.c's. Run it under mpirun / srun / torchrun
 * variables; rank 0 prints. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zinc/bench.h"
#include "zinc/comm.h"
#include "zinc/device.h"
#include "zinc/topo.h"
#include "cli/cli.h"
#include "zn_build_config.h"

typedef struct {
    zn_bench_comm_config c;
    const char *csv;
} opts;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: [mpirun -np N | torchrun-style env] zinc bench comm [options]\n"
        "  --sizes A..B     sizes from A to B doubling (default 1M..1G); or a list 4K,1M\n"
        "  --ops LIST       allgather,reducescatter,allreduce,broadcast (default the\n"
        "                   first three; broadcast: from rank 0, busbw = algbw)\n"
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
    o->c.n_sizes = 0;
    if (dots) {
        *dots = 0;
        uint64_t a, b;
        if (zn_parse_size(buf, &a) || zn_parse_size(dots + 2, &b) || a == 0 || b < a)
            return -1;
        for (uint64_t x = a; x <= b && o->c.n_sizes < 64; x *= 2)
            o->c.sizes[o->c.n_sizes++] = x;
        return 0;
    }
    for (char *tok = strtok(buf, ","); tok && o->c.n_sizes < 64; tok = strtok(NULL, ",")) {
        uint64_t x;
        if (zn_parse_size(tok, &x) || x == 0)
            return -1;
        o->c.sizes[o->c.n_sizes++] = x;
    }
    return o->c.n_sizes ? 0 : -1;
}

static int parse_ops(const char *s, opts *o)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    memset(o->c.ops, 0, sizeof o->c.ops);
    int any = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int k = -1;
        for (int i = 0; i < ZN_BENCH_COMM_OPS; i++)
            if (!strcmp(tok, zn_bench_comm_op_name(i)))
                k = i;
        if (k < 0)
            return -1;
        o->c.ops[k] = 1;
        any = 1;
    }
    return any ? 0 : -1;
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
    o->c.ops[ZN_BENCH_ALLGATHER] = o->c.ops[ZN_BENCH_REDUCESCATTER] =
        o->c.ops[ZN_BENCH_ALLREDUCE] = 1;   /* broadcast when asked */
    o->c.dtype = ZN_DTYPE_F32;
    o->c.iters = 0;
    o->c.warmup = 2;
    o->c.timeout = 120;
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
                        "allreduce, broadcast\n", optarg);
                return 2;
            }
            break;
        case 't':
            if (!strcmp(optarg, "f32"))
                o->c.dtype = ZN_DTYPE_F32;
            else if (!strcmp(optarg, "bf16"))
                o->c.dtype = ZN_DTYPE_BF16;
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
                o->c.iters = (int)v;
            else
                o->c.warmup = (int)v;
            break;
        }
        case 'T':
            o->c.timeout = strtod(optarg, &end);
            if (*end || !(o->c.timeout > 0)) {
                fprintf(stderr, "zinc: error: --timeout \"%s\"\n", optarg);
                return 2;
            }
            break;
        case 'c':
            o->csv = optarg;
            break;
        case 'd':
            o->c.device = optarg;
            break;
        default:
            return zn_cli_bench_usage_exit(ch, usage);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zinc: error: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return -1;
}

/* Rank 0's '#' lines before the table: the machine, the world, the path,
 * the definitions, the column heads. *topo: the machine, for the CSV. */
static void print_header(const opts *o, const zn_comm_info *info, int dev, zn_topo *topo)
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
                              "thread)") : "", zn_dtype_name(o->c.dtype));
    printf("# factor: allreduce 2(n-1)/n = %.3f, allgather and reducescatter (n-1)/n = "
           "%.3f, broadcast 1\n", 2.0 * (world - 1) / world, (double)(world - 1) / world);
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

typedef struct {
    const opts *o;
    const zn_comm_info *info;
    int dev;
    const zn_topo *topo;
    FILE *csv;
} printer;

static int print_row(void *ctx, const zn_bench_comm_row *r)
{
    const printer *p = ctx;
    const zn_comm_info *info = p->info;
    const char *op = zn_bench_comm_op_name(r->op);
    if (info->rank != 0)
        return 0;
    printf("  %10llu %11zu %6s %-13s %10.1f %8.3f %8.3f %8.3f %8.3f %8llu\n",
           (unsigned long long)r->used, r->count, zn_dtype_name(p->o->c.dtype), op,
           r->t * 1e6, r->algbw, r->busbw, r->link, r->ratio, (unsigned long long)r->wrong);
    fflush(stdout);
    if (p->csv)
        fprintf(p->csv, "\"%s\",%d,%s,%s,%s,%s,%s,%llu,%zu,%.1f,%.4f,%.4f,%.4f,%.4f,"
                "%llu\n", p->topo->cpu_model, info->size, info->host_backend,
                info->dev_backend, p->dev ? "device" : "host", zn_dtype_name(p->o->c.dtype), op,
                (unsigned long long)r->used, r->count, r->t * 1e6, r->algbw, r->busbw, r->link,
                r->ratio, (unsigned long long)r->wrong);
    return 0;
}

int zn_cli_bench_comm(int argc, char **argv)
{
    opts o;
    int code = parse_opts(argc, argv, &o);
    if (code >= 0)
        return code;

    zn_bench_comm *b = NULL;
    int rc = zn_bench_comm_create(&b, &o.c);
    if (rc)
        return zn_cli_fail(rc, NULL);
    zn_comm *c = zn_bench_comm_comm(b);
    zn_comm_info info;
    zn_bench_comm_get_info(b, &info);
    int dev = zn_bench_comm_on_device(b);

    printer p = { &o, &info, dev, NULL, NULL };
    zn_topo topo;
    memset(&topo, 0, sizeof topo);
    p.topo = &topo;
    if (info.rank == 0) {
        print_header(&o, &info, dev, &topo);
        if (o.csv && (rc = open_csv(o.csv, &p.csv)))
            return bench_fail(c, rc, "--csv");
    }
    uint64_t total_wrong = 0;
    if ((rc = zn_bench_comm_run(b, print_row, &p, &total_wrong)))
        return bench_fail(c, rc, NULL);
    if (info.rank == 0) {
        printf("# total #wrong: %llu\n", (unsigned long long)total_wrong);
        if (p.csv && fclose(p.csv) != 0)
            fprintf(stderr, "zinc: error: writing %s: %s\n", o.csv, strerror(errno));
    }
    zn_bench_comm_destroy(b);
    return total_wrong ? 1 : 0;
}
