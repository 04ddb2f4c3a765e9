/* Launch environment (mpirun, srun, torchrun variables), the per-rank GPU
 * choice from the local rank, NUMA binding with hwloc, and the shard
 * arithmetic of flat buffers. */
#include <errno.h>
#include <hwloc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm-impl.h"

/* Reads an integer variable. Returns 0 absent, 1 present (in *out), or
 * ZN_ECONFIG naming the variable. */
static int env_int(const char *name, long lo, long hi, int *out)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return zn_set_error(ZN_ECONFIG, "environment variable %s=\"%s\": expected an integer "
                            "in [%ld, %ld]", name, s, lo, hi);
    *out = (int)v;
    return 1;
}

/* SLURM_STEP_TASKS_PER_NODE: "2(x3),1" = 2 tasks on each of 3 nodes, then
 * 1. Returns the count of node `node`, or 0 when it cannot be read. */
static int slurm_tasks_on_node(const char *s, int node)
{
    int idx = 0;
    while (s && *s) {
        char *end;
        long n = strtol(s, &end, 10);
        if (end == s || n <= 0)
            return 0;
        long rep = 1;
        s = end;
        if (!strncmp(s, "(x", 2)) {
            rep = strtol(s + 2, &end, 10);
            if (end == s + 2 || *end != ')' || rep <= 0)
                return 0;
            s = end + 1;
        }
        if (node < idx + rep)
            return (int)n;
        idx += (int)rep;
        if (*s == ',')
            s++;
        else if (*s)
            return 0;
    }
    return 0;
}

const char *zn_launcher_name(zn_launcher l)
{
    switch (l) {
    case ZN_LAUNCH_NONE: return "none";
    case ZN_LAUNCH_MPI: return "mpirun";
    case ZN_LAUNCH_SLURM: return "srun";
    case ZN_LAUNCH_TORCHRUN: return "torchrun";
    }
    return "?";
}

int zn_launch_detect(zn_launch_info *li)
{
    memset(li, 0, sizeof *li);
    li->world_size = 1;
    li->local_size = 1;
    int rc, have_rank, have_size;
    int rank = 0, size = 1, lrank = -1, lsize = -1;

    /* torchrun first: it may run inside an allocation that also sets SLURM_*. */
    if ((have_rank = env_int("RANK", 0, INT_MAX - 1, &rank)) < 0)
        return have_rank;
    if ((have_size = env_int("WORLD_SIZE", 1, INT_MAX, &size)) < 0)
        return have_size;
    if (have_rank && have_size) {
        li->launcher = ZN_LAUNCH_TORCHRUN;
        if ((rc = env_int("LOCAL_RANK", 0, INT_MAX - 1, &lrank)) < 0)
            return rc;
        if ((rc = env_int("LOCAL_WORLD_SIZE", 1, INT_MAX, &lsize)) < 0)
            return rc;
    } else if (have_rank != have_size) {
        return zn_set_error(ZN_ECONFIG, "environment: %s is set but %s is not (torchrun-style "
                            "launch needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)",
                            have_rank ? "RANK" : "WORLD_SIZE", have_rank ? "WORLD_SIZE" : "RANK");
    } else if ((rc = env_int("OMPI_COMM_WORLD_SIZE", 1, INT_MAX, &size)) != 0) {
        if (rc < 0)
            return rc;
        li->launcher = ZN_LAUNCH_MPI;
        if ((rc = env_int("OMPI_COMM_WORLD_RANK", 0, INT_MAX - 1, &rank)) <= 0)
            return rc < 0 ? rc : zn_set_error(ZN_ECONFIG, "environment: OMPI_COMM_WORLD_SIZE "
                                              "is set but OMPI_COMM_WORLD_RANK is not");
        if ((rc = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, INT_MAX - 1, &lrank)) < 0)
            return rc;
        if ((rc = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, INT_MAX, &lsize)) < 0)
            return rc;
    } else if ((rc = env_int("PMI_SIZE", 1, INT_MAX, &size)) != 0) {
        if (rc < 0)
            return rc;
        li->launcher = ZN_LAUNCH_MPI;
        if ((rc = env_int("PMI_RANK", 0, INT_MAX - 1, &rank)) <= 0)
            return rc < 0 ? rc : zn_set_error(ZN_ECONFIG, "environment: PMI_SIZE is set but "
                                              "PMI_RANK is not");
        if ((rc = env_int("MPI_LOCALRANKID", 0, INT_MAX - 1, &lrank)) < 0)
            return rc;
        if ((rc = env_int("MPI_LOCALNRANKS", 1, INT_MAX, &lsize)) < 0)
            return rc;
    } else if ((getenv("SLURM_STEP_ID") || getenv("SLURM_STEPID")) && getenv("SLURM_PROCID")) {
        /* Inside `srun`; the batch script itself has no step id. */
        li->launcher = ZN_LAUNCH_SLURM;
        if ((rc = env_int("SLURM_PROCID", 0, INT_MAX - 1, &rank)) < 0)
            return rc;
        if ((rc = env_int("SLURM_STEP_NUM_TASKS", 1, INT_MAX, &size)) == 0)
            rc = env_int("SLURM_NTASKS", 1, INT_MAX, &size);
        if (rc <= 0)
            return rc < 0 ? rc : zn_set_error(ZN_ECONFIG, "environment: srun step without "
                                              "SLURM_STEP_NUM_TASKS or SLURM_NTASKS");
        if ((rc = env_int("SLURM_LOCALID", 0, INT_MAX - 1, &lrank)) < 0)
            return rc;
        int node = 0;
        if ((rc = env_int("SLURM_NODEID", 0, INT_MAX - 1, &node)) < 0)
            return rc;
        int n = slurm_tasks_on_node(getenv("SLURM_STEP_TASKS_PER_NODE"), node);
        if (n > 0)
            lsize = n;
    } else {
        li->launcher = ZN_LAUNCH_NONE;
    }

    if (rank >= size)
        return zn_set_error(ZN_ECONFIG, "environment (%s): rank %d is not below the world "
                            "size %d", zn_launcher_name(li->launcher), rank, size);
    li->rank = rank;
    li->world_size = size;
    li->local_rank = lrank >= 0 ? lrank : (li->launcher == ZN_LAUNCH_NONE ? 0 : -1);
    if (li->local_rank < 0)
        li->local_rank = size == 1 ? 0 : rank;   /* unknown: assume one host */
    li->local_size = lsize > 0 ? lsize : (lrank >= 0 ? lrank + 1 : size);
    if (li->local_rank >= li->local_size)
        return zn_set_error(ZN_ECONFIG, "environment (%s): local rank %d is not below the "
                            "local size %d", zn_launcher_name(li->launcher), li->local_rank,
                            li->local_size);

    const char *addr = getenv("MASTER_ADDR");
    if (addr && *addr) {
        if (strlen(addr) >= sizeof li->master_addr)
            return zn_set_error(ZN_ECONFIG, "environment: MASTER_ADDR is longer than %zu "
                                "characters", sizeof li->master_addr - 1);
        snprintf(li->master_addr, sizeof li->master_addr, "%s", addr);
    }
    int port = 0;
    if ((rc = env_int("MASTER_PORT", 1, 65535, &port)) < 0)
        return rc;
    li->master_port = port;
    if (li->launcher == ZN_LAUNCH_TORCHRUN && size > 1 && (!li->master_addr[0] || !port))
        return zn_set_error(ZN_ECONFIG, "environment: RANK/WORLD_SIZE are set (world %d) but "
                            "%s is not; the TCP rendezvous needs MASTER_ADDR and MASTER_PORT",
                            size, !li->master_addr[0] ? "MASTER_ADDR" : "MASTER_PORT");
    return 0;
}

int zn_launch_device_name(const zn_launch_info *li, char *name, size_t len)
{
    if (!li || !name || len < 16)
        return zn_set_error(ZN_EARG, "zn_launch_device_name: NULL argument or buffer under "
                            "16 bytes");
    int n = 0;
#if ZN_HAVE_CUDA
    n = zn_comm_cuda_device_count();
#endif
    if (n <= 0) {
        snprintf(name, len, "host");
        return 0;
    }
    int k = li->local_rank % n;
    if (li->local_size > n) {
        static int warned;
        zn_warn_once(&warned, "%d ranks on this host share %d GPU%s (local rank %d -> cuda:%d)",
                     li->local_size, n, n == 1 ? "" : "s", li->local_rank, k);
    }
    snprintf(name, len, "cuda:%d", k);
    return 0;
}

int zn_launch_bind_numa(const zn_launch_info *li, int node, int *bound)
{
    hwloc_topology_t topo;
    int rc = 0;
    if (hwloc_topology_init(&topo) < 0)
        return zn_set_error(-errno, "hwloc_topology_init: %s", strerror(errno));
    if (hwloc_topology_load(topo) < 0) {
        rc = zn_set_error(-errno, "hwloc_topology_load: %s", strerror(errno));
        goto out;
    }
    int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    if (n <= 0) {
        rc = zn_set_error(ZN_EARG, "hwloc: the machine shows no NUMA node");
        goto out;
    }
    hwloc_obj_t obj;
    if (node < 0) {
        int lr = li ? li->local_rank : 0;
        obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)(lr % n));
    } else {
        obj = hwloc_get_numanode_obj_by_os_index(topo, (unsigned)node);
    }
    if (!obj) {
        rc = zn_set_error(ZN_EARG, "NUMA node %d does not exist (the machine has %d)", node, n);
        goto out;
    }
    if (hwloc_set_cpubind(topo, obj->cpuset, HWLOC_CPUBIND_PROCESS) < 0) {
        rc = zn_set_error(-errno, "hwloc_set_cpubind(NUMA node %u): %s", obj->os_index,
                          strerror(errno));
        goto out;
    }
    if (hwloc_set_membind(topo, obj->nodeset, HWLOC_MEMBIND_BIND,
                          HWLOC_MEMBIND_PROCESS | HWLOC_MEMBIND_BYNODESET) < 0) {
        static int warned;
        zn_warn_once(&warned, "hwloc_set_membind(NUMA node %u) refused: %s; memory is not "
                     "bound", obj->os_index, strerror(errno));
    }
    if (bound)
        *bound = (int)obj->os_index;
out:
    hwloc_topology_destroy(topo);
    return rc;
}

int zn_comm_shard(size_t n, int world, int rank, size_t align, zn_shard *out)
{
    if (!out || world < 1 || rank < 0 || rank >= world)
        return zn_set_error(ZN_EARG, "zn_comm_shard: world %d, rank %d (need 0 <= rank < "
                            "world)", world, rank);
    if (align == 0)
        align = 1;
    size_t unit;
    if (__builtin_mul_overflow((size_t)world, align, &unit))
        return zn_set_error(ZN_EARG, "zn_comm_shard: world %d x align %zu overflows", world,
                            align);
    size_t padded = n % unit ? n + (unit - n % unit) : n;
    if (padded < n)
        return zn_set_error(ZN_EARG, "zn_comm_shard: %zu elements padded to a multiple of "
                            "%zu overflow", n, unit);
    out->padded = padded;
    out->shard = padded / (size_t)world;
    out->offset = out->shard * (size_t)rank;
    out->len = n > out->offset ? (n - out->offset < out->shard ? n - out->offset : out->shard)
                               : 0;
    return 0;
}
