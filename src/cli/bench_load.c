/* `zinc bench load`: the flags and the table of the trainer's weight load
 * of an HF model folder against a plain one-thread sequential read of the
 * same files in the same run, each pass from a cold page cache and every
 * tensor verified; the passes and the figures are src/bench/load.c's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "zinc/bench.h"
#include "zinc/util.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: zinc bench load --model DIR [--repeat N] [--csv FILE] [--warm]\n"
        "\n"
        "Reads the weights of an HF model folder the way `zinc train` loads them\n"
        "(parallel preads, widened to fp32, block by block in 8M-element chunks) and\n"
        "compares GB/s with a plain one-thread sequential read of the same files in\n"
        "the same run. Each pass starts with the files dropped from the page cache\n"
        "(--warm: not dropped). Every tensor is verified (crc32c) in every pass.\n"
        "scripts/make_bench_model.py writes a folder of any shape.\n");
}

typedef struct {
    const char *dir;
    int warm;
    FILE *csv;
} printer;

static int print_round(void *ctx, const zn_bench_load_round *r)
{
    const printer *p = ctx;
    printf("  %5d  %-6s %14llu %10.3f %9.3f %8s %7d\n", r->round, "plain",
           (unsigned long long)r->plain_bytes, r->plain_s, r->plain_gbs, "1.000", 0);
    printf("  %5d  %-6s %14llu %10.3f %9.3f %8.3f %7llu\n", r->round, "zinc",
           (unsigned long long)r->zinc_bytes, r->zinc_s, r->zinc_gbs, r->ratio,
           (unsigned long long)r->wrong);
    if (p->csv)
        fprintf(p->csv, "%s,%d,%d,%llu,%.6f,%.6f,%.6f,%.6f,%.4f,%llu\n", p->dir, p->warm,
                r->round, (unsigned long long)r->zinc_bytes, r->plain_s, r->plain_gbs,
                r->zinc_s, r->zinc_gbs, r->ratio, (unsigned long long)r->wrong);
    return 0;
}

int zn_cli_bench_load(int argc, char **argv)
{
    const char *dir = NULL, *csv = NULL;
    int repeat = 3, warm = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--csv") && i + 1 < argc) {
            csv = argv[++i];
        } else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
            char *end;
            long r = strtol(argv[++i], &end, 10);
            if (*end || r < 1 || r > 100) {
                fprintf(stderr, "zinc: error: --repeat %s: expected 1..100\n", argv[i]);
                return 2;
            }
            repeat = (int)r;
        } else if (!strcmp(argv[i], "--warm")) {
            warm = 1;
        } else {
            fprintf(stderr, "zinc: error: bench load: unknown option or missing value '%s'\n",
                    argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    zn_bench_load *b = NULL;
    FILE *cf = NULL;
    int ret = 1, rc;
    if ((rc = zn_bench_load_create(&b, dir))) {
        zn_cli_fail(rc, "bench load");
        goto out;
    }
    zn_bench_load_info in;
    zn_bench_load_get_info(b, &in);
    if (csv && !(cf = fopen(csv, "a"))) {
        fprintf(stderr, "zinc: error: --csv %s: %s\n", csv, strerror(errno));
        goto out;
    }
    printf("# zinc bench load: %s\n", in.summary);
    printf("#   %.3f GB of tensor data in %d file(s); %s; %d OpenMP threads\n",
           (double)in.data_bytes / 1e9, in.shards,
           warm ? "page cache kept (--warm)" : "page cache dropped before each pass",
           in.threads);
    printf("#   plain: one thread, sequential %zu MiB preads of every file; zinc: the\n"
           "#   trainer's init_params over every block (what zn_train_create runs)\n",
           in.plain_chunk >> 20);
    printf("# %5s  %-6s %14s %10s %9s %8s %7s\n", "round", "path", "bytes", "seconds", "GB/s",
           "ratio", "#wrong");
    printer p = { dir, warm, cf };
    zn_bench_load_result res;
    if ((rc = zn_bench_load_run(b, repeat, warm, print_round, &p, &res))) {
        zn_cli_fail(rc, "bench load");
        goto out;
    }
    printf("# zinc / plain: mean %.3f, best %.3f over %d rounds; %llu tensors wrong\n",
           res.mean_ratio, res.best_ratio, repeat, (unsigned long long)res.wrong);
    ret = res.wrong ? 1 : 0;
    if (res.wrong)
        fprintf(stderr, "zinc: error: bench load: %llu tensors read wrong\n",
                (unsigned long long)res.wrong);
out:
    if (cf)
        fclose(cf);
    zn_bench_load_destroy(b);
    return ret;
}
