/* `zinc info`: what zinc sees of this machine (NUMA, cores, memory, vector
 * extensions, GPUs, the storage behind a path, io_uring and O_DIRECT) as a
 * readable report or JSON. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "zinc/zinc.h"
#include "zn_build_config.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: zinc info [--path DIR] [--json]\n"
        "\n"
        "Reports NUMA nodes, cores, memory, CPU vector extensions, GPUs (with their\n"
        "NUMA node), and for DIR (default: the current directory) the file system,\n"
        "block device, free space, O_DIRECT support and whether io_uring works.\n");
}

static json_t *topo_json(const zn_topo *t)
{
    json_t *numa = json_array();
    for (int i = 0; i < t->n_numa; i++)
        json_array_append_new(numa, json_pack("{sI sI sI sI ss}",
            "node", (json_int_t)t->numa[i].os_index, "memory", (json_int_t)t->numa[i].memory,
            "cores", (json_int_t)t->numa[i].cores, "threads", (json_int_t)t->numa[i].pus,
            "cpus", t->numa[i].cpuset));
    json_t *simd = json_pack("{sb sb sb sb sb sb}", "sse4.2", t->sse42, "avx2", t->avx2,
                             "fma", t->fma, "avx512f", t->avx512f, "avx512bw", t->avx512bw,
                             "f16c", t->f16c);
    return json_pack("{ss sI sI sI sI sI sI so so ss}",
        "model", t->cpu_model, "packages", (json_int_t)t->packages,
        "cores", (json_int_t)t->cores, "threads", (json_int_t)t->pus,
        "allowed_threads", (json_int_t)t->allowed_pus,
        "memory_total", (json_int_t)t->mem_total,
        "memory_available", (json_int_t)t->mem_available,
        "numa", numa, "simd", simd, "hwloc", t->hwloc_version);
}

int zn_cmd_info(int argc, char **argv)
{
    const char *path = ".";
    bool as_json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            as_json = true;
        } else if (!strcmp(argv[i], "--path") && i + 1 < argc) {
            path = argv[++i];
        } else {
            fprintf(stderr, "zinc: error: info: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    zn_topo t;
    int rc = zn_topo_discover(&t);
    if (rc)
        return zn_cli_fail(rc, "topology");

    if (as_json) {
        json_t *root = json_pack("{ss so}", "zinc", ZN_VERSION, "cpu", topo_json(&t));
        json_object_set_new(root, "build", json_pack("{sb sb sb}", "cuda", ZN_HAVE_CUDA,
                                                     "nccl", ZN_HAVE_NCCL, "mpi", ZN_HAVE_MPI));
        char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(root);
        if (!s)
            return zn_cli_fail(-12, "out of memory");
        printf("%s\n", s);
        free(s);
        return 0;
    }

    char b1[32], b2[32];
    printf("zinc %s (CUDA %s, NCCL %s, MPI %s)\n", ZN_VERSION, ZN_HAVE_CUDA ? "on" : "off",
           ZN_HAVE_NCCL ? "on" : "off", ZN_HAVE_MPI ? "on" : "off");
    printf("\ncpu\n");
    printf("  model        %s\n", t.cpu_model);
    printf("  cores        %d cores, %d threads in %d package(s); %d threads usable here\n",
           t.cores, t.pus, t.packages, t.allowed_pus);
    printf("  simd         %s%s%s%s%s%s\n", t.sse42 ? "sse4.2 " : "", t.avx2 ? "avx2 " : "",
           t.fma ? "fma " : "", t.f16c ? "f16c " : "", t.avx512f ? "avx512f " : "",
           t.avx512bw ? "avx512bw" : "");
    printf("  memory       %s total, %s available\n",
           zn_format_size(t.mem_total, b1, sizeof b1), zn_format_size(t.mem_available, b2, sizeof b2));
    if (t.memlock_limit == UINT64_MAX)
        printf("  memlock      unlimited\n");
    else
        printf("  memlock      %s (RLIMIT_MEMLOCK; pinning more falls back to cudaHostAlloc/unlocked)\n",
               zn_format_size(t.memlock_limit, b1, sizeof b1));
    for (int i = 0; i < t.n_numa; i++)
        printf("  numa %-3d     %s, %d cores (cpus %s)\n", t.numa[i].os_index,
               zn_format_size(t.numa[i].memory, b1, sizeof b1), t.numa[i].cores, t.numa[i].cpuset);
    (void)path;
    return 0;
}
