/* `zinc bench <what>`: dispatches to the benchmark drivers (their flags and
 * tables here in src/cli/bench_*.c, their measuring in src/bench/). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "zinc/util.h"

static const zn_cli_cmd benches[] = {
    { "adam", zn_cli_bench_adam, "fused CPU Adam step vs the read-modify-write roofline" },
    { "nvme", zn_cli_bench_nvme, "NVMe engine vs fio on the same file, block size and queue depth" },
    { "pcie", zn_cli_bench_pcie, "host<->GPU copy bandwidth vs a plain cudaMemcpyAsync loop and the PCIe link" },
    { "model", zn_cli_bench_model, "decoder layer/head forward+backward TFLOP/s vs the GEMM peak" },
    { "comm", zn_cli_bench_comm, "all-gather / reduce-scatter / all-reduce algbw and busbw (nccl-tests definitions)" },
    { "cluster", zn_cli_bench_cluster, "the cluster check (zinc launch --check): ranks, broadcast, each link, all-reduce busbw vs the link" },
    { "train", zn_cli_bench_train, "training steps: step time vs the busiest resource (overlap)" },
    { "generate", zn_cli_bench_generate, "prefill/decode tokens/s per batch vs the link and compute ceilings of a step" },
    { "load", zn_cli_bench_load, "loading an HF folder's weights vs a plain sequential read of it" },
    { NULL, NULL, NULL },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: zinc bench <what> [args]\n\nbenchmarks:\n");
    for (size_t i = 0; benches[i].name; i++)
        fprintf(f, "  %-8s %s\n", benches[i].name, benches[i].summary);
}

int zn_cmd_bench(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; benches[i].name; i++)
        if (!strcmp(argv[1], benches[i].name))
            return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "zinc: error: unknown benchmark '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

FILE *zn_cli_bench_csv_open(const char *path, const char *header)
{
    int fresh = access(path, F_OK) != 0;
    FILE *f = fopen(path, "a");
    if (!f) {
        int e = errno;
        zn_set_error(-e, "--csv %s: %s", path, strerror(e));
        errno = e;
        return NULL;
    }
    if (fresh)
        fprintf(f, "%s\n", header);
    return f;
}

int zn_cli_bench_usage_exit(int c, void (*print_usage)(FILE *f))
{
    print_usage(c == 'h' ? stdout : stderr);
    return c == 'h' ? 0 : 2;
}
