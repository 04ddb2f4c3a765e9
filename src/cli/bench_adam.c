/* `zinc bench adam`: the flags and the table of the fused CPU Adam step
 * against its read-modify-write roofline and the STREAM triad, every SIMD
 * path, moment format (--states) and master (--master bf16_sr); the
 * passes, their verification and the figures are src/bench/adam.c's. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zinc/bench.h"
#include "zinc/optim.h"
#include "cli/cli.h"
#include "zinc/topo.h"
#include "zn_build_config.h"

typedef struct {
    zn_bench_adam_config c;
    const char *csv;
} opts;

static int parse_dtype(const char *s, int allow_none, int *on, zn_dtype *t)
{
    *on = 1;
    if (!strcmp(s, "fp32") || !strcmp(s, "f32"))
        *t = ZN_DTYPE_F32;
    else if (!strcmp(s, "bf16"))
        *t = ZN_DTYPE_BF16;
    else if (!strcmp(s, "fp16") || !strcmp(s, "f16"))
        *t = ZN_DTYPE_F16;
    else if (allow_none && !strcmp(s, "none"))
        *on = 0, *t = ZN_DTYPE_BF16;
    else
        return -1;
    return 0;
}

/* "fp32,int8", "all": one bit per zn_mom_fmt; fp32 always (the others
 * are compared with it). */
static int parse_states(const char *s, unsigned *out)
{
    unsigned f = 1u << ZN_MOM_F32;
    if (!strcmp(s, "all")) {
        *out = f | 1u << ZN_MOM_BF16 | 1u << ZN_MOM_Q8;
        return 0;
    }
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "fp32"))
            f |= 1u << ZN_MOM_F32;
        else if (!strcmp(t, "bf16"))
            f |= 1u << ZN_MOM_BF16;
        else if (!strcmp(t, "int8"))
            f |= 1u << ZN_MOM_Q8;
        else
            return -1;
    }
    *out = f;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zinc bench adam [--params N] [--threads N] [--grad fp32|bf16|fp16]\n"
            "                       [--copy none|bf16|fp16] [--iters K] [--csv FILE]\n"
            "                       [--nt-copy 0|1] [--states fp32,bf16,int8|all]\n"
            "                       [--master fp32|bf16_sr|all]\n"
            "  --params   parameters per step (size syntax: 256M = 2^28), default 256M\n"
            "  --threads  OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
            "  --grad     gradient dtype (default fp32); --copy: 16-bit copy (default none)\n"
            "  --iters    timed passes per row, interleaved across rows (default 5)\n"
            "  --csv      append one line per row to FILE (header when new)\n"
            "  --nt-copy  0: ordinary stores for the copy (default 1: streaming when aligned)\n"
            "  --states   Adam moment formats to time besides fp32: bf16, int8 (8-bit\n"
            "             blockwise, bitsandbytes' scheme); each with its own roofline\n"
            "  --master   bf16_sr (or all): also time bf16 master weights rounded\n"
            "             stochastically (train.master_weights bf16_sr), per --states\n"
            "             format, against their own roofline and the fp32-master step\n"
            "             (default fp32: those rows alone); --copy does not apply to them\n"
            "Rows: rmw (Adam's memory pattern, no arithmetic: the roofline), triad\n"
            "(STREAM, same memory), adam <path> for each SIMD path of this CPU (* the\n"
            "one ZINC_SIMD/auto picks), plain (scalar loop built without vector code).\n"
            "With --master bf16_sr: rmw sr, adam sr <path> (sr: the bf16 master).\n"
            "On a CPU with AVX-512 VBMI, int8 rows time avx512vbmi (byte-permute lookups,\n"
            "the default; ZINC_SIMD_VBMI=0 turns it off) and avx512 (gathers) both.\n");
}

/* ---- the command ------------------------------------------------------------ */

/* Parses the command line into *o. Returns -1 to go on, or the exit code
 * to return at once: 0 after --help, 2 on bad usage. */
static int parse_opts(int argc, char **argv, opts *o)
{
    o->c = zn_bench_adam_config_default();
    o->csv = NULL;
    static const struct option lo[] = {
        { "params", required_argument, 0, 'n' }, { "threads", required_argument, 0, 't' },
        { "grad", required_argument, 0, 'g' },   { "copy", required_argument, 0, 'c' },
        { "iters", required_argument, 0, 'i' },  { "csv", required_argument, 0, 'o' },
        { "nt-copy", required_argument, 0, 'N' }, { "help", no_argument, 0, 'h' },
        { "states", required_argument, 0, 's' }, { "master", required_argument, 0, 'm' },
        { 0, 0, 0, 0 },
    };
    optind = 1;
    int ch, on;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        uint64_t u;
        char *end;
        switch (ch) {
        case 'n':
            if (zn_parse_size(optarg, &u) || u == 0 || u > ((uint64_t)1 << 36)) {
                fprintf(stderr, "zinc: error: --params wants a count from 1 to 64G, not '%s'\n",
                        optarg);
                return 2;
            }
            o->c.params = (size_t)u;
            break;
        case 't':
            o->c.threads = (int)strtol(optarg, &end, 10);
            if (*end || o->c.threads < 1 || o->c.threads > 4096) {
                fprintf(stderr, "zinc: error: --threads wants a count >= 1, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'g':
            if (parse_dtype(optarg, 0, &on, &o->c.grad)) {
                fprintf(stderr, "zinc: error: --grad wants fp32, bf16 or fp16\n");
                return 2;
            }
            break;
        case 'c':
            if (parse_dtype(optarg, 1, &o->c.copy, &o->c.copy_dtype) || o->c.copy_dtype == ZN_DTYPE_F32) {
                fprintf(stderr, "zinc: error: --copy wants none, bf16 or fp16\n");
                return 2;
            }
            break;
        case 'i':
            o->c.iters = (int)strtol(optarg, &end, 10);
            if (*end || o->c.iters < 1 || o->c.iters > ZN_BENCH_ADAM_MAX_ITERS) {
                fprintf(stderr, "zinc: error: --iters wants 1..%d\n", ZN_BENCH_ADAM_MAX_ITERS);
                return 2;
            }
            break;
        case 'o':
            o->csv = optarg;
            break;
        case 'N':
            o->c.nt_copy = strcmp(optarg, "0") != 0;
            break;
        case 's':
            if (parse_states(optarg, &o->c.states)) {
                fprintf(stderr, "zinc: error: --states wants a comma list of fp32, bf16, int8 "
                        "(or all), not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'm':
            /* the fp32-master rows always run: the sr rows are compared
             * with them, as --states keeps fp32 */
            if (!strcmp(optarg, "fp32")) {
                o->c.master_sr = 0;
            } else if (!strcmp(optarg, "bf16_sr") || !strcmp(optarg, "all")) {
                o->c.master_sr = 1;
            } else {
                fprintf(stderr, "zinc: error: --master wants fp32, bf16_sr or all, not '%s'\n",
                        optarg);
                return 2;
            }
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

/* The '#' lines before the timing: the machine, the build, the options,
 * the bytes each row moves and how #wrong is counted. */
static void print_header(const opts *op, const zn_bench_adam_info *in, const char *model)
{
    const zn_bench_adam_config *o = &op->c;
    char sz[32];
    size_t gs = zn_dtype_size(o->grad);
    double bytes_pp = zn_bench_adam_bytes_per_param(o, ZN_MOM_F32, 0);
    zn_format_size(in->slab_bytes, sz, sizeof sz);
    printf("# zinc bench adam: fused CPU Adam/AdamW step vs the read-modify-write roofline\n");
    printf("# machine: %s, %ld CPUs online; SIMD paths here:", model,
           sysconf(_SC_NPROCESSORS_ONLN));
    for (int i = 0; i < in->n_isas; i++)
        printf(" %s%s", zn_isa_name(in->isas[i]), zn_adam_isa_available(in->isas[i]) ? "" : "(no)");
    printf("; the step uses %s (%s)", zn_adam_isa_name(), zn_adam_isa_reason());
    if (in->vbmi)
        printf("; AVX-512 VBMI: 8-bit pieces %s", in->vbmi_on
               ? "by byte permutes (ZINC_SIMD_VBMI=0 turns them off)" : "off (ZINC_SIMD_VBMI=0)");
    printf("\n# zinc %s, gcc %s, OpenMP %d, %d threads, THP %s\n", ZN_VERSION, __VERSION__,
           _OPENMP, o->threads, in->thp);
    printf("# %zu params, grad %s, copy %s%s, %d interleaved passes per row (best and mean "
           "shown), memory %s\n", o->params, zn_dtype_name(o->grad),
           o->copy ? zn_dtype_name(o->copy_dtype) : "none",
           o->copy ? (in->nt_copy ? " (streaming stores)" : " (ordinary stores)") : "",
           o->iters, sz);
    printf("# one mmap'd slab (THP advised), arrays staggered by 2 MiB + 4 KiB, first-touched "
           "with the kernel's threads and split; ceilings run on %s\n", in->ceiling_path);
    printf("# bytes per param: read p 4 + g %zu + m 4 + v 4, write p 4 + m 4 + v 4%s = %.0f "
           "(rmw moves the same; triad: 12 per element over the same memory)\n", gs,
           o->copy ? " + copy 2" : "", bytes_pp);
    if (o->states & (1u << ZN_MOM_BF16))
        printf("# bf16 moments: m and v 2 bytes each way: %.0f bytes per param (rmw bf16 moves "
               "the same)\n", zn_bench_adam_bytes_per_param(o, ZN_MOM_BF16, 0));
    if (o->states & (1u << ZN_MOM_Q8))
        printf("# int8 moments: m and v 1 byte each way + 2 absmax of 4 bytes each way per %d "
               "params: %.4g bytes per param (rmw int8 moves the same)\n", ZN_Q8_BLOCK,
               zn_bench_adam_bytes_per_param(o, ZN_MOM_Q8, 0));
    if (o->master_sr) {
        printf("# bf16 master (sr rows, zn_adam_step_sr): read p 2 + g %zu + m, v, write p 2 + "
               "m, v, no 16-bit copy (the bf16 master is the working copy: --copy does not "
               "apply to them):", gs);
        for (int f = ZN_MOM_F32; f <= ZN_MOM_Q8; f++)
            if (((o->states | 1u << ZN_MOM_F32) >> f) & 1)
                printf("%s %s moments %.4g", f == ZN_MOM_F32 ? "" : ",",
                       zn_mom_fmt_name((zn_mom_fmt)f),
                       zn_bench_adam_bytes_per_param(o, (zn_mom_fmt)f, 1));
        printf(" bytes per param (rmw sr of each moves the same)\n");
        printf("# sr rounding: 16 random bits per element from zn_sr_bits(seed %#llx, step, "
               "index): seed fixed, step each pass's Adam step (counted over all rows), index "
               "the element's (index0 0)\n", (unsigned long long)ZN_BENCH_ADAM_SR_SEED);
    }
    printf("# AdamW lr 1e-3 betas 0.9/0.999 eps 1e-8 wd 0.01, bias correction; #wrong: of %d "
           "sampled elements per pass vs one double step from their values before it (bf16 and "
           "int8 moments: p as fp32; m, v the format's rounding of the double result), plus "
           "every copy element at the end\n",
           ZN_BENCH_ADAM_SAMPLES);
    if (o->master_sr)
        printf("# #wrong of sr rows: p must be one of the two bf16 neighbours of some value "
               "within %g (relative) of the double result, the fp32 kernel's bound; m, v as "
               "above\n", ZN_BENCH_ADAM_TOL);
    fflush(stdout);
}

/* The table (and with --csv a line per row in FILE) and the notes under
 * it; *wrong_total the sum of #wrong. Returns 0, or -errno when FILE does
 * not open. */
static int print_table(const opts *op, const zn_bench_adam *b, const zn_bench_adam_info *in,
                       const char *model, uint64_t *wrong_total)
{
    const zn_bench_adam_config *o = &op->c;
    int nrows = zn_bench_adam_num_rows(b);
    /* the label column: 22 wide, wider for longer names (sr rows) */
    int lw = 22;
    for (int r = 0; r < nrows; r++) {
        zn_bench_adam_row w;
        zn_bench_adam_get_row(b, r, &w);
        int len = (int)strlen(w.name) + (w.is_auto ? 2 : 0);
        lw = len > lw ? len : lw;
    }
    printf("#\n# %-*s %10s %8s %10s %7s %7s %8s %9s %9s %7s\n", lw, "row", "Mparam/s", "GB/s",
           "roof GB/s", "ratio", "med", "x fp32", "best ms", "mean ms", "#wrong");
    FILE *csv = NULL;
    if (op->csv && !(csv = zn_cli_bench_csv_open(op->csv, "unix_time,cpu,threads,params,grad,"
                                                "copy,nt_copy,states,row,auto,mparams_s,gbs,"
                                                "roof_gbs,ratio,median_ratio,vs_fp32,best_ms,"
                                                "mean_ms,wrong")))
        return -errno;
    *wrong_total = 0;
    for (int r = 0; r < nrows; r++) {
        zn_bench_adam_row w;
        zn_bench_adam_get_row(b, r, &w);
        char label[40];
        snprintf(label, sizeof label, "%s%s", w.name, w.is_auto ? " *" : "");
        printf("  %-*s %10.1f %8.2f %10.2f %7.3f %7.3f %8.3f %9.1f %9.1f %7llu\n", lw, label,
               w.mparams_s, w.gbs, w.roof_gbs, w.ratio, w.median_ratio, w.vs_fp32, w.best_ms,
               w.mean_ms, (unsigned long long)w.wrong);
        if (csv)
            fprintf(csv, "%lld,\"%s\",%d,%zu,%s,%s,%d,%s,%s,%d,%.1f,%.3f,%.3f,%.4f,%.4f,%.4f,"
                    "%.2f,%.2f,%llu\n", (long long)time(NULL), model, o->threads, o->params,
                    zn_dtype_name(o->grad), o->copy ? zn_dtype_name(o->copy_dtype) : "none",
                    in->nt_copy, zn_mom_fmt_name(w.fmt), w.name, w.is_auto, w.mparams_s,
                    w.gbs, w.roof_gbs, w.ratio, w.median_ratio, w.vs_fp32, w.best_ms,
                    w.mean_ms, (unsigned long long)w.wrong);
        *wrong_total += w.wrong;
    }
    printf("# ratio: best GB/s over the best GB/s of the roofline of the row's own bytes; med: "
           "median over passes of the ratio within one pass; x fp32: params/s over the fp32 "
           "row of the same path\n# triad's Mparam/s: the params/s its bandwidth would carry at "
           "%.0f bytes each\n", zn_bench_adam_bytes_per_param(o, ZN_MOM_F32, 0));
    if (o->master_sr)
        printf("# sr rows: ratio over rmw sr of their moment format; x fp32: params/s over the "
               "fp32-master row of the same path and moment format (rmw sr: over rmw of its "
               "format)\n");
    if (csv && fclose(csv) != 0)
        fprintf(stderr, "zinc: error: writing %s: %s\n", op->csv, strerror(errno));
    return 0;
}

int zn_cli_bench_adam(int argc, char **argv)
{
    opts o;
    int code = parse_opts(argc, argv, &o);
    if (code >= 0)
        return code;

    zn_bench_adam *b = NULL;
    int rc = zn_bench_adam_create(&b, &o.c);
    if (rc < 0)
        return zn_cli_fail(rc, "bench adam");
    zn_bench_adam_info in;
    zn_bench_adam_get_info(b, &in);
    char model[256];
    zn_cpu_model(model, sizeof model);
    print_header(&o, &in, model);

    zn_bench_adam_result res;
    if ((rc = zn_bench_adam_run(b, &res)) < 0) {
        zn_bench_adam_destroy(b);
        return zn_cli_fail(rc, "bench adam");
    }
    printf("# (fill/first touch %.2f s; %d Adam steps taken; copy check: %llu of %zu wrong)\n",
           res.fill_s, res.steps, (unsigned long long)res.copy_wrong, res.copy_elems);
    uint64_t wrong_total = 0;
    rc = print_table(&o, b, &in, model, &wrong_total);
    zn_bench_adam_destroy(b);
    if (rc < 0)
        return zn_cli_fail(rc, NULL);
    if (wrong_total) {
        fprintf(stderr, "zinc: error: bench adam: %llu wrong results\n",
                (unsigned long long)wrong_total);
        return 1;
    }
    return 0;
}
