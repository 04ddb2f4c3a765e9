/* `zinc info`: what zinc sees of this machine (NUMA, cores, memory, vector
 * extensions, GPUs, the storage behind a path, io_uring and O_DIRECT) as a
 * readable report or JSON. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "zinc/zinc.h"
#include "zinc/device.h"
#include "zinc/nvme.h"
#include "zinc/optim.h"
#include "zinc/topo.h"
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
    return json_pack("{ss sI sI sI sI sI sI sI so so ss}",
        "model", t->cpu_model, "packages", (json_int_t)t->packages,
        "cores", (json_int_t)t->cores, "threads", (json_int_t)t->pus,
        "allowed_threads", (json_int_t)t->allowed_pus,
        "last_level_cache", (json_int_t)t->llc_bytes,
        "memory_total", (json_int_t)t->mem_total,
        "memory_available", (json_int_t)t->mem_available,
        "numa", numa, "simd", simd, "hwloc", t->hwloc_version);
}

/* The CPU's numeric paths: the Adam kernel auto chose and why, the BLAS. */
static void paths_json(json_t *cpu)
{
    json_object_set_new(cpu, "adam_path", json_string(zn_adam_isa_name()));
    json_object_set_new(cpu, "adam_path_reason", json_string(zn_adam_isa_reason()));
    json_object_set_new(cpu, "blas", json_string(zn_dev_host_blas()));
}

#define MAX_GPUS 16

/* Lists CUDA GPUs by opening each with a tiny arena; returns how many, and
 * the reason when there are none. */
static int list_gpus(zn_dev_info *out, int max, char *why, size_t wlen)
{
    int n = 0;
    why[0] = '\0';
    for (int i = 0; i < max; i++) {
        char name[16];
        snprintf(name, sizeof name, "cuda:%d", i);
        zn_dev_config dc = zn_dev_config_default();
        dc.name = name;
        dc.gpu_budget = 1 << 20;
        zn_dev *d = NULL;
        int rc = zn_dev_create(&d, &dc);
        if (rc) {
            if (i == 0)
                snprintf(why, wlen, "%s", *zn_last_error() ? zn_last_error() : zn_strerror(rc));
            break;
        }
        zn_dev_get_info(d, &out[n++]);
        zn_dev_destroy(d);
    }
    return n;
}

static json_t *gpu_json(const zn_dev_info *g)
{
    return json_pack("{ss ss sI sI sI si si si si si sf}", "name", g->name,
                     "pci_bus_id", g->pci_bus_id, "numa_node", (json_int_t)g->numa_node,
                     "memory_total", (json_int_t)g->total_mem, "memory_free", (json_int_t)g->free_mem,
                     "cc_major", g->cc_major, "cc_minor", g->cc_minor, "sms", g->sm_count,
                     "pcie_gen", g->pcie_gen, "pcie_width", g->pcie_width,
                     "pcie_peak_gbs", g->pcie_peak_gbs);
}

static json_t *storage_json(const char *path, const zn_nvme_probe_info *p)
{
    return json_pack("{ss ss ss ss ss si sI sI si ss si ss sb si ss si}",
                     "path", path, "fstype", p->fstype, "device", p->device,
                     "partition", p->partition, "model", p->model,
                     "rotational", p->rotational, "free", (json_int_t)p->free_bytes,
                     "total", (json_int_t)p->total_bytes, "o_direct", p->direct_ok,
                     "o_direct_reason", p->direct_reason, "logical_block", (int)p->logical_block,
                     "io_uring_reason", p->uring_reason, "io_uring", p->uring_ok,
                     "io_uring_disabled_sysctl", p->uring_disabled_sysctl,
                     "backend", p->backend_reason, "buffered", p->buffered);
}

int zn_cmd_info(int argc, char **argv)
{
    const char *path = ".";
    bool as_json = false;
    char families[160];
    zn_model_families(families, sizeof families);
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

    zn_dev_info gpus[MAX_GPUS];
    char gpu_why[512];
    int ngpu = list_gpus(gpus, MAX_GPUS, gpu_why, sizeof gpu_why);
    zn_nvme_probe_info probe;
    int prc = zn_nvme_probe(path, &probe);
    char probe_err[512] = "";
    if (prc)
        snprintf(probe_err, sizeof probe_err, "%s", zn_last_error());

    if (as_json) {
        json_t *cpu = topo_json(&t);
        paths_json(cpu);
        json_t *root = json_pack("{ss so}", "zinc", ZN_VERSION, "cpu", cpu);
        json_t *ga = json_array();
        for (int i = 0; i < ngpu; i++)
            json_array_append_new(ga, gpu_json(&gpus[i]));
        json_object_set_new(root, "gpus", ga);
        if (!ngpu)
            json_object_set_new(root, "gpu_absent_reason", json_string(gpu_why));
        if (prc)
            json_object_set_new(root, "storage", json_pack("{ss ss}", "path", path, "error", probe_err));
        else
            json_object_set_new(root, "storage", storage_json(path, &probe));
        json_object_set_new(root, "build", json_pack("{sb sb sb}", "cuda", ZN_HAVE_CUDA,
                                                     "nccl", ZN_HAVE_NCCL, "mpi", ZN_HAVE_MPI));
        json_object_set_new(root, "model_families", json_string(families));
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
    printf("  models       %s (HF model_type)\n", families);
    printf("\ncpu\n");
    printf("  model        %s\n", t.cpu_model);
    printf("  cores        %d cores, %d threads in %d package(s); %d threads usable here\n",
           t.cores, t.pus, t.packages, t.allowed_pus);
    printf("  simd         %s%s%s%s%s%s\n", t.sse42 ? "sse4.2 " : "", t.avx2 ? "avx2 " : "",
           t.fma ? "fma " : "", t.f16c ? "f16c " : "", t.avx512f ? "avx512f " : "",
           t.avx512bw ? "avx512bw" : "");
    printf("  cache        %s of last-level cache (the cost model's memory probes span four times it)\n",
           t.llc_bytes ? zn_format_size(t.llc_bytes, b1, sizeof b1) : "unknown");
    printf("  adam         %s (%s)\n", zn_adam_isa_name(), zn_adam_isa_reason());
    printf("  blas         %s (host backend; OPENBLAS_CORETYPE forces another family)\n",
           zn_dev_host_blas());
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

    printf("\ngpu\n");
    if (ZN_HAVE_CUDA)
        printf("  kernels      built for %s (meson -Dgpu_arch)\n", zn_dev_kernel_archs());
    if (!ngpu)
        printf("  none         %s\n"
               "               (zinc uses the host backend: a capped arena in RAM stands in for HBM)\n",
               gpu_why);
    for (int i = 0; i < ngpu; i++) {
        const zn_dev_info *g = &gpus[i];
        printf("  cuda:%d       %s, %s (%s free), cc %d.%d, %d SMs\n", i, g->name,
               zn_format_size(g->total_mem, b1, sizeof b1), zn_format_size(g->free_mem, b2, sizeof b2),
               g->cc_major, g->cc_minor, g->sm_count);
        printf("               PCI %s, NUMA node %d, PCIe gen %d x%d (%.1f GB/s per direction)\n",
               g->pci_bus_id, g->numa_node, g->pcie_gen, g->pcie_width, g->pcie_peak_gbs);
        int cov = zn_dev_arch_covered(g->cc_major, g->cc_minor);
        if (cov == 1)
            printf("               kernels: PTX of an older architecture, compiled by the driver "
                   "at first use (rebuild with -Dgpu_arch='... %d.%d' for its own)\n",
                   g->cc_major, g->cc_minor);
        else if (!cov)
            printf("  warning      this build has no kernels for cc %d.%d: rebuild with "
                   "-Dgpu_arch='%d.%d' (it has %s)\n", g->cc_major, g->cc_minor, g->cc_major,
                   g->cc_minor, zn_dev_kernel_archs());
    }

    printf("\nstorage (%s)\n", path);
    if (prc) {
        printf("  error        %s\n", probe_err);
        return 0;
    }
    printf("  filesystem   %s on %s%s%s%s%s\n", probe.fstype, probe.device[0] ? probe.device : "?",
           probe.partition[0] ? " (" : "", probe.partition, probe.partition[0] ? ")" : "",
           probe.rotational == 1 ? ", rotational" : probe.rotational == 0 ? ", non-rotational" : "");
    if (probe.model[0])
        printf("  model        %s\n", probe.model);
    printf("  space        %s free of %s\n", zn_format_size(probe.free_bytes, b1, sizeof b1),
           zn_format_size(probe.total_bytes, b2, sizeof b2));
    printf("  O_DIRECT     %s%s%s (block %u)\n", probe.direct_ok ? "yes" : "no",
           probe.direct_reason[0] ? ": " : "", probe.direct_reason, probe.logical_block);
    printf("  io_uring     %s%s%s\n", probe.uring_ok ? "yes" : "no",
           probe.uring_reason[0] ? ": " : "", probe.uring_reason);
    printf("  zinc uses    %s\n", probe.backend_reason);
    return 0;
}
