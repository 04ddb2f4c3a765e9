/* `zinc bench nvme`: the flags and the table of zinc's I/O engine against
 * fio on the same swap file, block size and queue depth; the runs, their
 * verification and the figures are src/bench/nvme.c's. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "zinc/bench.h"
#include "zinc/nvme.h"
#include "zinc/util.h"
#include "zn_build_config.h"

#define MAXL 16

typedef struct {
    zn_bench_nvme_config c;
    uint64_t bs[MAXL];
    int nbs;
    int qd[MAXL];
    int nqd;
    const char *csv;
} opts_t;

static int parse_list_u64(const char *s, uint64_t *out, int *n, const char *what)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= MAXL || zn_parse_size(t, &out[*n]) || !out[*n]) {
            fprintf(stderr, "zinc: error: --%s: bad value '%s'\n", what, t);
            return -1;
        }
        (*n)++;
    }
    return *n ? 0 : -1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zinc bench nvme --path DIR [--paths DIR1,DIR2] [--size 1GiB] [--bs 1M]\n"
            "                       [--qd 16,32] [--rw write,read] [--reps 2] [--no-fio]\n"
            "                       [--no-crc] [--csv FILE]\n"
            "  --path/--paths  directories for the swap file(s); several = striping\n"
            "  --size          bytes moved per run (the swap file size)\n"
            "  --bs, --qd      lists: one row per block size x queue depth x direction\n"
            "  --reps          runs per row, zinc and fio interleaved; best of each shown\n"
            "  --no-fio        zinc only; --no-crc: engine without crc32c\n"
            "  --no-huge       zinc's buffer on 4 KiB pages (MADV_NOHUGEPAGE) instead of\n"
            "                  zn_aio_buffer_alloc's transparent huge pages\n"
            "  --csv           append one line per row to FILE (header when new)\n"
            "Writes run fio first, then zinc (so zinc's reads can verify zinc's data);\n"
            "reads alternate which goes first. GB = 1e9 bytes.\n");
}

static int parse(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->c = zn_bench_nvme_config_default();
    o->c.diag = stderr;
    o->bs[0] = 1 << 20;
    o->nbs = 1;
    o->qd[0] = 16;
    o->qd[1] = 32;
    o->nqd = 2;
    static char paths_buf[4096];
    static const struct option lo[] = {
        { "path", required_argument, 0, 'p' }, { "paths", required_argument, 0, 'P' },
        { "size", required_argument, 0, 's' }, { "bs", required_argument, 0, 'b' },
        { "qd", required_argument, 0, 'q' },   { "rw", required_argument, 0, 'r' },
        { "reps", required_argument, 0, 'n' }, { "no-fio", no_argument, 0, 'F' },
        { "no-crc", no_argument, 0, 'C' },     { "csv", required_argument, 0, 'o' },
        { "no-huge", no_argument, 0, 'H' },
        { "help", no_argument, 0, 'h' },       { 0, 0, 0, 0 },
    };
    optind = 1;
    int c;
    uint64_t tmp[MAXL];
    int n;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'p':
            o->c.paths[0] = optarg;
            o->c.npaths = 1;
            break;
        case 'P': {
            snprintf(paths_buf, sizeof paths_buf, "%s", optarg);
            o->c.npaths = 0;
            char *save = NULL;
            for (char *t = strtok_r(paths_buf, ",", &save); t && o->c.npaths < ZN_SWAP_MAX_PATHS;
                 t = strtok_r(NULL, ",", &save))
                o->c.paths[o->c.npaths++] = t;
            break;
        }
        case 's':
            if (zn_parse_size(optarg, &o->c.size) || o->c.size < (1 << 20)) {
                fprintf(stderr, "zinc: error: --size %s: need at least 1 MiB\n", optarg);
                return -1;
            }
            break;
        case 'b':
            if (parse_list_u64(optarg, o->bs, &o->nbs, "bs"))
                return -1;
            break;
        case 'q':
            if (parse_list_u64(optarg, tmp, &n, "qd"))
                return -1;
            for (int i = 0; i < n; i++)
                o->qd[i] = (int)tmp[i];
            o->nqd = n;
            break;
        case 'r': {
            char buf[64];
            snprintf(buf, sizeof buf, "%s", optarg);
            o->c.nrw = 0;
            char *save = NULL;
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o->c.nrw >= 2 || (strcmp(t, "read") && strcmp(t, "write"))) {
                    fprintf(stderr, "zinc: error: --rw: read and/or write, not '%s'\n", t);
                    return -1;
                }
                o->c.rw[o->c.nrw++] = !strcmp(t, "write");
            }
            break;
        }
        case 'n':
            o->c.reps = atoi(optarg);
            if (o->c.reps < 1 || o->c.reps > 100) {
                fprintf(stderr, "zinc: error: --reps %s\n", optarg);
                return -1;
            }
            break;
        case 'F':
            o->c.fio = 0;
            break;
        case 'C':
            o->c.crc = 0;
            break;
        case 'H':
            o->c.huge = 0;
            break;
        case 'o':
            o->csv = optarg;
            break;
        case 'h':
            usage(stdout);
            return 1;
        default:
            usage(stderr);
            return -1;
        }
    }
    if (!o->c.npaths) {
        fprintf(stderr, "zinc: error: --path DIR is required\n");
        usage(stderr);
        return -1;
    }
    /* Writes first, so that reads see data zinc wrote. */
    if (o->c.nrw == 2 && o->c.rw[0] == 0) {
        o->c.rw[0] = 1;
        o->c.rw[1] = 0;
    }
    return 0;
}

/* One row: the table's line and, with --csv, the file's. */
static void print_row(const opts_t *o, const zn_bench_nvme_info *in, FILE *csv, uint64_t bs,
                      int qd, const zn_bench_nvme_row *r)
{
    const zn_bench_nvme_figures *z = &r->zinc, *f = &r->fio;
    char fg[16] = "-", fp[16] = "-", rt[16] = "-";
    if (f->ok) {
        snprintf(fg, sizeof fg, "%.3f", f->gbs);
        snprintf(fp, sizeof fp, "%.0f", f->p99_us);
        snprintf(rt, sizeof rt, "%.3f", r->ratio);
    }
    char bsz[32];
    zn_format_size(bs, bsz, sizeof bsz);
    printf("  %-5s %7s %4d %9.3f %9.0f %9.0f %9.0f | %9s %9s | %7s %7" PRIu64 "\n",
           r->is_write ? "write" : "read", bsz, qd, z->gbs, z->iops, z->p50_us, z->p99_us, fg,
           fp, rt, r->wrong);
    if (!csv)
        return;
    char paths[4096] = "";
    for (int k = 0; k < o->c.npaths; k++) {
        size_t l = strlen(paths);
        snprintf(paths + l, sizeof paths - l, "%s%s", k ? ";" : "", o->c.paths[k]);
    }
    const zn_nvme_probe_info *pi = &in->probe;
    fprintf(csv, "\"%s\",%s,%s,%s,\"%s\",%" PRIu64 ",%s,%" PRIu64 ",%d,%d,%d,%.4f,%.0f,"
            "%.1f,%.1f,%.4f,%.1f,%.1f,%.4f,%" PRIu64 "\n",
            in->cpu, in->kernel, pi->fstype, pi->device[0] ? pi->device : "?", paths,
            o->c.size, r->is_write ? "write" : "read", bs, qd, o->c.crc, o->c.huge, z->gbs,
            z->iops, z->p50_us, z->p99_us, f->ok ? f->gbs : 0, f->p50_us, f->p99_us, r->ratio,
            r->wrong);
}

static void print_header(const opts_t *o, const zn_bench_nvme_info *in)
{
    const zn_nvme_probe_info *pi = &in->probe;
    printf("# zinc bench nvme: zinc's engine vs fio, same file, block size and queue depth\n");
    printf("# machine: %s, %ld CPUs online; kernel %s; zinc %s; %s\n", in->cpu,
           sysconf(_SC_NPROCESSORS_ONLN), in->kernel, ZN_VERSION,
           in->have_fio ? in->fio_version : o->c.fio ? "fio not found" : "fio skipped (--no-fio)");
    for (int i = 0; i < o->c.npaths; i++)
        printf("# path %d: %s\n", i, o->c.paths[i]);
    printf("# storage: %s on %s%s%s%s (rotational %d, block %u, %s); free %.1f GB\n", pi->fstype,
           pi->device[0] ? pi->device : "?", pi->partition[0] ? "/" : "", pi->partition,
           pi->model[0] ? " " : "", pi->rotational, pi->logical_block, pi->backend_reason,
           (double)pi->free_bytes / 1e9);
    printf("# %.2f GB per run, %d rep(s) per row interleaved with fio, best shown; crc32c %s; "
           "zinc buffer on %s; latency = per block, submit to completion (fio: clat)\n",
           (double)o->c.size / 1e9, o->c.reps, o->c.crc ? "on" : "off",
           o->c.huge ? "transparent huge pages" : "4 KiB pages");
    printf("# fio: ioengine=io_uring direct=1 fixedbufs registerfiles numjobs=1; #wrong: bytes "
           "that differ from the seeded pattern in zinc's reads (write rows: the read after)\n");
}

int zn_cli_bench_nvme(int argc, char **argv)
{
    opts_t o;
    int prc = parse(argc, argv, &o);
    if (prc)
        return prc > 0 ? 0 : 2;
    zn_bench_nvme_info in;
    int rc = zn_bench_nvme_prepare(&o.c, &in);
    if (rc)
        return zn_cli_fail(rc, NULL);
    print_header(&o, &in);
    o.c.fio = in.have_fio;   /* the points run fio only when it is here */

    FILE *csv = NULL;
    if (o.csv && !(csv = zn_cli_bench_csv_open(o.csv, "cpu,kernel,fs,device,paths,size,rw,bs,"
                                               "qd,crc,huge,zinc_gbs,zinc_iops,zinc_p50_us,"
                                               "zinc_p99_us,fio_gbs,fio_p50_us,fio_p99_us,"
                                               "ratio,wrong")))
        return zn_cli_fail(-errno, NULL);
    int failed = 0;
    uint64_t total_wrong = 0;
    for (int bi = 0; bi < o.nbs; bi++)
        for (int qi = 0; qi < o.nqd; qi++) {
            uint64_t bs = o.bs[bi];
            int qd = o.qd[qi];
            zn_bench_nvme_point *p = NULL;
            zn_bench_nvme_result res;
            if ((rc = zn_bench_nvme_point_open(&p, &o.c, bs, qd))) {
                zn_cli_fail(rc, NULL);
                failed = 1;
                continue;
            }
            if (bi == 0 && qi == 0)
                printf("# engine: %s\n#\n# %-5s %7s %4s %9s %9s %9s %9s | %9s %9s | %7s %7s\n",
                       zn_bench_nvme_point_engine(p), "rw", "bs", "qd", "GB/s", "IOPS",
                       "p50 us", "p99 us", "fio GB/s", "fio p99", "zn/fio", "#wrong");
            /* a failed prefill said why on stderr and gave no rows */
            rc = zn_bench_nvme_point_run(p, &res);
            failed |= res.failed;
            for (int i = 0; !rc && i < res.nrows; i++) {
                print_row(&o, &in, csv, bs, qd, &res.rows[i]);
                total_wrong += res.rows[i].wrong;
            }
            if (!rc)
                fflush(stdout);
            zn_bench_nvme_point_close(p);
        }
    if (csv && fclose(csv) != 0) {
        fprintf(stderr, "zinc: error: writing %s: %s\n", o.csv, strerror(errno));
        failed = 1;
    }
    printf("# zn/fio: zinc GB/s / fio GB/s on the same file in the same run (target >= 0.95)\n");
    if (total_wrong) {
        fprintf(stderr, "zinc: error: %" PRIu64 " bytes read back wrong\n", total_wrong);
        return 1;
    }
    return failed;
}
