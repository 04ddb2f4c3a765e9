/* `zinc bench cluster`: the cluster check that `zinc launch --check` runs
 * on every rank. Rank 0 prints each rank's place, a verified broadcast,
 * each ring link alone (its bandwidth against its NIC's speed and against
 * its peers, slow ones flagged by name) and the all-reduce's busbw
 * (nccl-tests' algbw x 2(n-1)/n) against the ring's ceiling measured in the
 * same run and the NICs' speed; the measuring is src/bench/'s. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/bench.h"
#include "zinc/comm.h"
#include "cli/cli.h"
#include "zn_build_config.h"

typedef struct {
    zn_bench_comm_config c;
    uint64_t link_bytes;
    int iters;
} opts;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: zinc launch --check [--hostfile F ...]   (or under mpirun / torchrun variables:)\n"
        "       zinc bench cluster [options]\n"
        "  --sizes LIST       all-reduce and broadcast sizes (default 1M,16M,128M; A..B doubles)\n"
        "  --link-bytes N     bytes each ring link carries alone (default 16M)\n"
        "  --iters N          timed iterations of each (default 5)\n"
        "  --device NAME      auto (default: the rank's GPU under NCCL, else host), host, cuda:K\n"
        "  --timeout S        seconds one collective may take (default 30)\n"
        "  --connect-timeout S  seconds the ranks have to meet (default 60)\n"
        "Exit status 1 when a collective or a link delivered wrong data or a rank failed;\n"
        "slow links are flagged in the table (exit 0).\n");
}

static int parse_list(const char *s, opts *o)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    o->c.n_sizes = 0;
    char *dots = strstr(buf, "..");
    if (dots) {
        *dots = 0;
        uint64_t a, b;
        if (zn_parse_size(buf, &a) || zn_parse_size(dots + 2, &b) || a < 4 || b < a)
            return -1;
        for (uint64_t x = a; x <= b && o->c.n_sizes < ZN_BENCH_COMM_MAX_SIZES; x *= 2)
            o->c.sizes[o->c.n_sizes++] = x;
        return 0;
    }
    for (char *t = strtok(buf, ","); t && o->c.n_sizes < ZN_BENCH_COMM_MAX_SIZES;
         t = strtok(NULL, ",")) {
        uint64_t x;
        if (zn_parse_size(t, &x) || x < 4)
            return -1;
        o->c.sizes[o->c.n_sizes++] = x;
    }
    /* ascending: the buffers are sized by the last */
    for (int i = 1; i < o->c.n_sizes; i++)
        if (o->c.sizes[i] < o->c.sizes[i - 1])
            return -1;
    return o->c.n_sizes ? 0 : -1;
}

static int parse_opts(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    parse_list("1M,16M,128M", o);
    o->c.ops[ZN_BENCH_BROADCAST] = o->c.ops[ZN_BENCH_ALLREDUCE] = 1;
    o->c.dtype = ZN_DTYPE_F32;
    o->c.warmup = 1;
    o->c.timeout = 30;
    o->c.connect_timeout = 60;
    o->c.device = "auto";
    o->link_bytes = 16u << 20;
    o->iters = 5;
    static const struct option lo[] = {
        { "sizes", required_argument, NULL, 's' }, { "link-bytes", required_argument, NULL, 'l' },
        { "iters", required_argument, NULL, 'n' }, { "device", required_argument, NULL, 'd' },
        { "timeout", required_argument, NULL, 'T' },
        { "connect-timeout", required_argument, NULL, 'C' },
        { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        char *end;
        double d;
        long v;
        switch (ch) {
        case 's':
            if (parse_list(optarg, o)) {
                fprintf(stderr, "zinc: error: --sizes \"%s\": want ascending sizes of 4 bytes or "
                        "more (1M,16M) or A..B\n", optarg);
                return 2;
            }
            break;
        case 'l':
            if (zn_parse_size(optarg, &o->link_bytes) || o->link_bytes < 4) {
                fprintf(stderr, "zinc: error: --link-bytes \"%s\": want a size (16M)\n", optarg);
                return 2;
            }
            break;
        case 'n':
            v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > 10000) {
                fprintf(stderr, "zinc: error: --iters \"%s\": want 1 to 10000\n", optarg);
                return 2;
            }
            o->iters = (int)v;
            break;
        case 'd':
            o->c.device = strcmp(optarg, "none") ? optarg : NULL;
            break;
        case 'T':
        case 'C':
            d = strtod(optarg, &end);
            if (*end || !(d > 0)) {
                fprintf(stderr, "zinc: error: --%s \"%s\": want seconds above 0\n",
                        ch == 'T' ? "timeout" : "connect-timeout", optarg);
                return 2;
            }
            *(ch == 'T' ? &o->c.timeout : &o->c.connect_timeout) = d;
            break;
        default:
            return zn_cli_bench_usage_exit(ch, usage);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zinc: error: bench cluster: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    o->c.iters = o->iters;
    o->c.link_bytes = o->link_bytes;
    return -1;
}

/* "host:rank" as the table names a rank */
static const char *who(const zn_cluster_rank *r, char *buf, size_t n)
{
    snprintf(buf, n, "%s:%d", r->host, r->rank);
    return buf;
}

typedef struct {
    const zn_comm_info *info;
    double nic_gbs;     /* the slowest network link's NIC, 0 unknown, < 0 no network link */
    int header_done;
} printer;

static int print_row(void *ctx, const zn_bench_comm_row *r)
{
    printer *p = ctx;
    if (p->info->rank)
        return 0;
    int bc = r->op == ZN_BENCH_BROADCAST;
    char nic[32] = "unknown", ratio[32] = "-";
    if (p->nic_gbs > 0) {
        snprintf(nic, sizeof nic, "%.3f", p->nic_gbs);
        snprintf(ratio, sizeof ratio, "%.2f", r->busbw / p->nic_gbs);
    } else if (p->nic_gbs < 0) {
        snprintf(nic, sizeof nic, "-");
    }
    printf("  %-9s %10llu %9.1f %8.3f %8.3f %9.3f %8.2f %8s %7s %7llu%s\n",
           bc ? "broadcast" : "allreduce", (unsigned long long)r->used, r->t * 1e6, r->algbw,
           r->busbw, r->link, r->ratio, nic, ratio, (unsigned long long)r->wrong,
           r->wrong ? "  WRONG DATA" : "");
    fflush(stdout);
    return 0;
}

static void print_ranks(const zn_comm_info *info, const zn_cluster_rank *ranks, int n_hosts)
{
    printf("# zinc cluster check: %d rank%s on %d host%s; zinc %s; %s backend (%s), device "
           "part %s\n", info->size, info->size == 1 ? "" : "s", n_hosts, n_hosts == 1 ? "" : "s",
           ZN_VERSION, info->host_backend, info->version, info->dev_backend);
    printf("# %4s %-24s %-20s %6s %-24s %5s %-16s %s\n", "rank", "host", "hostname", "local",
           "device", "numa", "address", "nic toward rank+1");
    for (int r = 0; r < info->size; r++) {
        const zn_cluster_rank *x = &ranks[r];
        char loc[32], nic[64];
        snprintf(loc, sizeof loc, "%d/%d", x->local_rank, x->local_size);
        if (!*x->nic)
            snprintf(nic, sizeof nic, "unknown");
        else if (x->nic_mbps > 0)
            snprintf(nic, sizeof nic, "%s %d Mb/s", x->nic, x->nic_mbps);
        else
            snprintf(nic, sizeof nic, "%s (speed unknown)", x->nic);
        printf("  %4d %-24s %-20s %6s %-24s %5d %-16s %s\n", r, x->host, x->hostname, loc,
               x->device, x->numa, *x->addr ? x->addr : "-", nic);
    }
}

/* The links' table and verdicts; returns the wrong bytes, sets *nic_gbs. */
static uint64_t print_links(const zn_cluster_rank *ranks, const zn_bench_link_row *links,
                            const zn_cluster_link_verdict *v, const int *slow_host, int world,
                            int n_slow, double *nic_gbs)
{
    uint64_t wrong = 0;
    int nic_unknown = 0, any_net = 0;
    *nic_gbs = 0;
    printf("#\n# links: each rank alone sends %llu bytes to rank+1 (the ring's neighbours, "
           "the pairs the collectives use), the others idle; timed at the receiver, which "
           "checks every byte\n", (unsigned long long)links[0].bytes);
    printf("# ceiling: the sender's NIC speed (/sys/class/net/IF/speed), unknown where it "
           "says none; slow: < %.2f x the median of the other network links or < %.2f x "
           "the NIC\n", ZN_CLUSTER_SLOW_PEERS, ZN_CLUSTER_SLOW_NIC);
    printf("# %-22s    %-22s %-7s %9s %8s %8s %7s %8s %7s %s\n", "from", "to", "kind",
           "time(us)", "GB/s", "nic", "/nic", "peers", "/peers", "#wrong");
    for (int r = 0; r < world; r++) {
        const zn_bench_link_row *l = &links[r];
        char a[96], b[96], nic[32] = "unknown", rn[16] = "-", peers[32] = "-", rp[16] = "-";
        if (v[r].nic_gbs > 0) {
            snprintf(nic, sizeof nic, "%.3f", v[r].nic_gbs);
            snprintf(rn, sizeof rn, "%.2f", l->gbs / v[r].nic_gbs);
        }
        if (!v[r].network)
            snprintf(nic, sizeof nic, "-");
        if (v[r].peers_gbs > 0) {
            snprintf(peers, sizeof peers, "%.3f", v[r].peers_gbs);
            snprintf(rp, sizeof rp, "%.2f", l->gbs / v[r].peers_gbs);
        }
        printf("  %-22s -> %-22s %-7s %9.1f %8.3f %8s %7s %8s %7s %6llu%s%s\n",
               who(&ranks[l->from], a, sizeof a), who(&ranks[l->to], b, sizeof b),
               v[r].network ? "network" : "local", l->t * 1e6, l->gbs, nic, rn, peers, rp,
               (unsigned long long)l->wrong, v[r].slow ? "  SLOW" : "",
               l->wrong ? "  WRONG DATA" : "");
        wrong += (uint64_t)l->wrong;
        if (v[r].network) {
            any_net = 1;
            if (v[r].nic_gbs <= 0)
                nic_unknown = 1;
            else if (*nic_gbs == 0 || v[r].nic_gbs < *nic_gbs)
                *nic_gbs = v[r].nic_gbs;
        }
    }
    if (!any_net)
        *nic_gbs = -1;   /* no network link: no NIC in the path */
    else if (nic_unknown)
        *nic_gbs = 0;
    for (int r = 0; r < world; r++) {
        char a[96], b[96];
        if (v[r].slow)
            printf("# SLOW link %s -> %s: %.4f GB/s%s%.3f x the other network links' "
                   "median%s\n", who(&ranks[links[r].from], a, sizeof a),
                   who(&ranks[links[r].to], b, sizeof b), links[r].gbs,
                   v[r].peers_gbs > 0 ? ", " : " (", v[r].peers_gbs > 0 ? links[r].gbs /
                   v[r].peers_gbs : 0.0, v[r].nic_gbs > 0 ? "" : ")");
        if (links[r].wrong)
            printf("# WRONG DATA on link %s -> %s: %.0f bytes differ at the receiver\n",
                   who(&ranks[links[r].from], a, sizeof a), who(&ranks[links[r].to], b,
                   sizeof b), links[r].wrong);
    }
    for (int r = 0; r < world; r++) {
        int first = 1;
        for (int k = 0; k < r; k++)
            first &= strcmp(ranks[k].host, ranks[r].host) != 0;
        if (slow_host[r] && first)
            printf("# SLOW host %s: every network link in and out of it is slow\n",
                   ranks[r].host);
    }
    if (!n_slow && any_net)
        printf("# no slow link\n");
    return wrong;
}

static int fail_job(zn_comm *c, int rc, const char *what)
{
    zn_cli_fail(rc, what);
    fflush(stdout);
    if (c && zn_comm_size(c) > 1)
        zn_cli_end_job(zn_comm_abort(c, 1), 1);
    return 1;
}

int zn_cli_bench_cluster(int argc, char **argv)
{
    opts o;
    int code = parse_opts(argc, argv, &o);
    if (code >= 0)
        return code;
    zn_bench_comm *b = NULL;
    int rc = zn_bench_comm_create(&b, &o.c);
    if (rc)
        return zn_cli_fail(rc, "cluster check");
    zn_comm *c = zn_bench_comm_comm(b);
    zn_comm_info info;
    zn_bench_comm_get_info(b, &info);
    int world = info.size;
    zn_cluster_rank *ranks = calloc((size_t)world, sizeof *ranks);
    zn_bench_link_row *links = calloc((size_t)world, sizeof *links);
    zn_cluster_link_verdict *v = calloc((size_t)world, sizeof *v);
    int *slow_host = calloc((size_t)world, sizeof *slow_host);
    if (!ranks || !links || !v || !slow_host) {
        rc = fail_job(c, zn_set_error(-ENOMEM, "out of memory"), "cluster check");
        goto out;
    }
    if ((rc = zn_bench_cluster_ranks(b, ranks))) {
        rc = fail_job(c, rc, "cluster check");
        goto out;
    }
    int n_hosts = 0;
    for (int r = 0; r < world; r++) {
        int first = 1;
        for (int k = 0; k < r; k++)
            first &= strcmp(ranks[k].host, ranks[r].host) != 0;
        n_hosts += first;
    }
    if (info.rank == 0) {
        print_ranks(&info, ranks, n_hosts);
        fflush(stdout);
    }
    uint64_t wrong = 0;
    printer p = { &info, -1, 0 };
    if (world > 1) {
        if ((rc = zn_bench_comm_links(b, o.link_bytes, o.iters, links))) {
            rc = fail_job(c, rc, "cluster check: links");
            goto out;
        }
        int n_slow = zn_bench_cluster_judge(ranks, links, world, v, slow_host);
        if (info.rank == 0)
            wrong += print_links(ranks, links, v, slow_host, world, n_slow, &p.nic_gbs);
        else
            for (int r = 0; r < world; r++)
                wrong += (uint64_t)links[r].wrong;
    }
    if (info.rank == 0) {
        printf("#\n# collectives (%s, sum; broadcast from rank 0): busbw = algbw x %.3f "
               "(allreduce, 2(n-1)/n; broadcast x 1); ring = every rank sending to rank+1 at "
               "once (the ceiling a ring's busbw approaches), nic = the slowest network "
               "link's NIC\n", zn_dtype_name(o.c.dtype), 2.0 * (world - 1) / world);
        if (world == 1)
            printf("# world size 1: no link to measure; the collectives are copies (or "
                   "nothing, for the broadcast), their figures the memory's\n");
        printf("# %-9s %10s %9s %8s %8s %9s %8s %8s %7s %7s\n", "op", "size(B)", "time(us)",
               "algbw", "busbw", "ring", "bus/ring", "nic", "bus/nic", "#wrong");
        fflush(stdout);
    }
    uint64_t coll_wrong = 0;
    if ((rc = zn_bench_comm_run(b, print_row, &p, &coll_wrong))) {
        rc = fail_job(c, rc, "cluster check");
        goto out;
    }
    wrong += coll_wrong;
    if (info.rank == 0) {
        if (wrong)
            printf("# verdict: WRONG DATA (%llu elements or bytes); see the rows marked\n",
                   (unsigned long long)wrong);
        else
            printf("# verdict: every rank answered and every collective and link delivered "
                   "the right data\n");
        fflush(stdout);
    }
    rc = wrong ? 1 : 0;
out:
    free(ranks);
    free(links);
    free(v);
    free(slow_host);
    zn_bench_comm_destroy(b);
    return rc;
}
