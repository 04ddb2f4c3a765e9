/* Machine topology for placement decisions and `zinc info`: NUMA nodes,
 * cores and memory (hwloc), the CPU's model and vector extensions. GPUs come
 * from the device layer (device.h), storage from the NVMe probe (nvme.h). */
#ifndef ZINC_TOPO_H
#define ZINC_TOPO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZN_TOPO_MAX_NUMA 64

typedef struct {
    int os_index;
    uint64_t memory;     /* bytes local to the node */
    int cores;           /* physical cores in the node */
    int pus;             /* hardware threads in the node */
    char cpuset[128];    /* list form, "0-15,32-47" */
} zn_topo_numa;

typedef struct {
    char cpu_model[128];
    int packages;
    int cores;           /* physical cores, whole machine */
    int pus;             /* hardware threads, whole machine */
    int allowed_pus;     /* threads this process may run on (cgroups, taskset) */
    uint64_t mem_total;  /* bytes */
    uint64_t mem_available; /* MemAvailable from /proc/meminfo */
    uint64_t memlock_limit; /* RLIMIT_MEMLOCK, UINT64_MAX = unlimited */
    int n_numa;
    zn_topo_numa numa[ZN_TOPO_MAX_NUMA];
    bool avx2, fma, avx512f, avx512bw, avx512_bf16, f16c, sse42;
    uint64_t llc_bytes;  /* the last-level caches (L3, else L2), summed over the
                            machine: a probe of memory bandwidth needs arrays
                            several times this, or it measures the cache */
    char hwloc_version[32];
} zn_topo;

/* The CPU's model name from /proc/cpuinfo ("unknown" when absent), for
 * benchmark headers. Cheap: no hwloc. */
ZN_API void zn_cpu_model(char *buf, size_t len);

/* Discovers the machine with hwloc. Returns 0, or a negative code with
 * zn_last_error() naming the hwloc call that failed. */
ZN_API int zn_topo_discover(zn_topo *t);

#ifdef __cplusplus
}
#endif
#endif
