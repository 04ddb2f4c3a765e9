/* Topology with hwloc: NUMA nodes, cores, memory. Used by `zinc info`, by
 * the planner's "auto" CPU budget and for thread/NUMA binding. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include <hwloc.h>

#include "zinc/topo.h"
#include "util/cpu-impl.h"

static uint64_t meminfo_kib(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long v = 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            sscanf(line + kl + 1, "%llu", &v);
            break;
        }
    }
    fclose(f);
    return (uint64_t)v;
}

void zn_cpu_model(char *out, size_t len)
{
    snprintf(out, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ' || *c == '\t')
                    c++;
                c[strcspn(c, "\n")] = '\0';
                snprintf(out, len, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

int zn_topo_discover(zn_topo *t)
{
    memset(t, 0, sizeof *t);
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) < 0)
        return zn_set_error(-errno, "hwloc_topology_init: %s", strerror(errno));
    int rc = 0;
    if (hwloc_topology_load(topo) < 0) {
        rc = zn_set_error(-errno, "hwloc_topology_load: %s", strerror(errno));
        goto out;
    }
    unsigned v = hwloc_get_api_version();
    snprintf(t->hwloc_version, sizeof t->hwloc_version, "%u.%u.%u",
             v >> 16, (v >> 8) & 0xff, v & 0xff);
    t->packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    t->cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    t->pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    hwloc_obj_t root = hwloc_get_root_obj(topo);
    /* The kernel's MemTotal wins: on VMs with hot-plugged memory the NUMA
     * nodes' sysfs totals (what hwloc reads) can miss part of it. */
    t->mem_total = meminfo_kib("MemTotal") * 1024;
    if (root->total_memory > t->mem_total)
        t->mem_total = root->total_memory;
    t->mem_available = meminfo_kib("MemAvailable") * 1024;

    hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
    if (allowed && hwloc_get_cpubind(topo, allowed, HWLOC_CPUBIND_PROCESS) == 0)
        t->allowed_pus = hwloc_bitmap_weight(allowed);
    else
        t->allowed_pus = t->pus;
    hwloc_bitmap_free(allowed);

    int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    if (n > ZN_TOPO_MAX_NUMA)
        n = ZN_TOPO_MAX_NUMA;
    t->n_numa = n;
    for (int i = 0; i < n; i++) {
        hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
        zn_topo_numa *z = &t->numa[i];
        z->os_index = (int)node->os_index;
        z->memory = node->attr ? node->attr->numanode.local_memory : 0;
        z->cores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, node->cpuset, HWLOC_OBJ_CORE);
        z->pus = hwloc_get_nbobjs_inside_cpuset_by_type(topo, node->cpuset, HWLOC_OBJ_PU);
        hwloc_bitmap_list_snprintf(z->cpuset, sizeof z->cpuset, node->cpuset);
    }

    /* the last level of cache: every L3, or every L2 where there is none */
    static const hwloc_obj_type_t levels[] = { HWLOC_OBJ_L3CACHE, HWLOC_OBJ_L2CACHE };
    for (size_t l = 0; l < sizeof levels / sizeof levels[0] && !t->llc_bytes; l++) {
        int nc = hwloc_get_nbobjs_by_type(topo, levels[l]);
        for (int i = 0; i < nc; i++) {
            hwloc_obj_t o = hwloc_get_obj_by_type(topo, levels[l], (unsigned)i);
            if (o && o->attr)
                t->llc_bytes += o->attr->cache.size;
        }
    }

    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0)
        t->memlock_limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;

    zn_cpu_model(t->cpu_model, sizeof t->cpu_model);
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    t->sse42 = __builtin_cpu_supports("sse4.2");
    t->avx2 = __builtin_cpu_supports("avx2");
    t->fma = __builtin_cpu_supports("fma");
    t->avx512f = __builtin_cpu_supports("avx512f");
    t->avx512bw = __builtin_cpu_supports("avx512bw");
    t->f16c = zn_cpu_has_f16c();
#if __GNUC__ >= 12
    t->avx512_bf16 = __builtin_cpu_supports("avx512bf16");
#endif
#endif
out:
    hwloc_topology_destroy(topo);
    return rc;
}
