/* Device memory (the arena) and host memory: NUMA-bound, pinned
 * (allocated or registered), each tier's bytes counted live and at peak. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hwloc.h>

#include "gpu/gpu-impl.h"
#include "util/hash-impl.h"


/* ---- NUMA-bound host memory (both backends) --------------------------------*/
int zn_gpu_numa_alloc(zn_dev *d, size_t bytes, void **out)
{
    static int warned;
    hwloc_topology_t t = (hwloc_topology_t)d->topo;
    void *p = NULL;

    *out = NULL;
    if (t && d->info.numa_node >= 0) {
        hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(t, (unsigned)d->info.numa_node);
        if (node) {
            p = hwloc_alloc_membind(t, bytes, node->nodeset, HWLOC_MEMBIND_BIND,
                                    HWLOC_MEMBIND_BYNODESET);
            if (!p)
                zn_warn_once(&warned, "pinned memory: binding to NUMA node %d failed (%s); "
                             "using unbound pages", d->info.numa_node, strerror(errno));
        }
    }
    if (!p && t)
        p = hwloc_alloc(t, bytes);
    if (!p)
        return zn_set_error(-ENOMEM, "pinned memory: cannot map %zu bytes", bytes);
    *out = p;
    return 0;
}

void zn_gpu_numa_free(zn_dev *d, void *p, size_t bytes)
{
    if (p && d->topo)
        hwloc_free((hwloc_topology_t)d->topo, p, bytes);
}

/* ---- device memory ------------------------------------------------------*/
int zn_dev_alloc(zn_dev *d, size_t bytes, const char *what, void **out)
{
    *out = NULL;
    if (bytes == 0)
        return zn_set_error(ZN_EARG, "device alloc '%s': zero bytes", what ? what : "?");
    if (!d->arena_base)
        return zn_set_error(ZN_EARG, "device alloc '%s' before the arena was reserved "
                            "(zn_dev_arena_reserve)", what ? what : "?");
    pthread_mutex_lock(&d->lock);
    void *p = zn_arena_alloc(&d->arena, bytes);
    if (!p) {
        char r[32], b[32], u[32], l[32];
        uint64_t largest = zn_arena_largest_free(&d->arena);
        zn_format_size(bytes, r, sizeof r);
        zn_format_size(d->arena.size, b, sizeof b);
        zn_format_size(d->arena.used, u, sizeof u);
        zn_format_size(largest, l, sizeof l);
        int rc = zn_set_error(ZN_EBUDGET, "device alloc '%s' of %zu bytes (%s) refused: "
                              "GPU budget %llu bytes (%s), in use %llu bytes (%s) in %llu "
                              "blocks, largest free block %llu bytes (%s)",
                              what ? what : "?", bytes, r, (unsigned long long)d->arena.size,
                              b, (unsigned long long)d->arena.used, u,
                              (unsigned long long)d->arena.n_live,
                              (unsigned long long)largest, l);
        pthread_mutex_unlock(&d->lock);
        return rc;
    }
    pthread_mutex_unlock(&d->lock);
    *out = p;
    return 0;
}

void zn_dev_free(zn_dev *d, void *p)
{
    if (!d || !p)
        return;
    pthread_mutex_lock(&d->lock);
    uint64_t n = zn_arena_free(&d->arena, p);
    pthread_mutex_unlock(&d->lock);
    if (!n)
        zn_error("device free: %p is not a live allocation of this device (ignored)", p);
}

typedef struct { zn_dev *d; void *p; } deferred_free;

static void free_cb(void *arg)
{
    deferred_free *f = arg;
    zn_dev_free(f->d, f->p);
    free(f);
}

int zn_dev_free_on(zn_dev *d, zn_stream *s, void *p)
{
    if (!p)
        return 0;
    deferred_free *f = malloc(sizeof *f);
    if (!f)
        return zn_set_error(-ENOMEM, "device free_on: out of memory");
    f->d = d;
    f->p = p;
    int rc = zn_dev_launch_host_fn(d, s, free_cb, f);
    if (rc)
        free(f);
    return rc;
}

void zn_dev_mem_stats(const zn_dev *d, zn_dev_mem *out)
{
    zn_dev *m = (zn_dev *)d;   /* the lock is not part of the logical state */
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&m->lock);
    out->budget = d->arena.size;
    out->used = d->arena.used;
    out->peak = d->arena.peak;
    out->largest_free = zn_arena_largest_free(&d->arena);
    out->n_allocs = d->arena.n_live;
    out->host_budget = d->cfg.cpu_budget;
    out->host_used = d->host_used;
    out->host_peak = d->host_peak;
    out->host_locked = d->host_locked;
    pthread_mutex_unlock(&m->lock);
}

void zn_dev_reset_peak(zn_dev *d)
{
    pthread_mutex_lock(&d->lock);
    d->arena.peak = d->arena.used;
    d->host_peak = d->host_used;
    pthread_mutex_unlock(&d->lock);
}

/* ---- pinned host memory ---------------------------------------------------*/
/* Reserves `bytes` of the cpu budget and a slot in the table; the caller
 * fills the slot's pointer. Called with the lock held. */
static int host_reserve(zn_dev *d, size_t bytes, const char *what)
{
    if (d->cfg.cpu_budget && d->host_used + bytes > d->cfg.cpu_budget) {
        char r[32], b[32], u[32];
        return zn_set_error(ZN_EBUDGET, "pinned host alloc '%s' of %zu bytes (%s) refused: "
                            "CPU budget %llu bytes (%s), pinned in use %llu bytes (%s)",
                            what ? what : "?", bytes, zn_format_size(bytes, r, sizeof r),
                            (unsigned long long)d->cfg.cpu_budget,
                            zn_format_size(d->cfg.cpu_budget, b, sizeof b),
                            (unsigned long long)d->host_used,
                            zn_format_size(d->host_used, u, sizeof u));
    }
    if (d->n_host_bufs == d->cap_host_bufs) {
        size_t n = d->cap_host_bufs ? d->cap_host_bufs * 2 : 16;
        zn_host_buf *nb = realloc(d->host_bufs, n * sizeof *nb);
        if (!nb)
            return zn_set_error(-ENOMEM, "pinned host alloc: out of memory");
        d->host_bufs = nb;
        d->cap_host_bufs = n;
    }
    d->host_used += bytes;
    if (d->host_used > d->host_peak)
        d->host_peak = d->host_used;
    return 0;
}

static void host_record(zn_dev *d, void *p, size_t bytes, int registered, const char *what)
{
    zn_host_buf *b = &d->host_bufs[d->n_host_bufs++];
    b->p = p;
    b->bytes = bytes;
    b->registered = registered;
    snprintf(b->what, sizeof b->what, "%s", what ? what : "?");
}

static int host_common(zn_dev *d, void *p_in, size_t bytes, const char *what, void **out,
                       int registered)
{
    int locked = 1, rc;
    void *p = p_in;

    if (bytes == 0)
        return zn_set_error(ZN_EARG, "pinned host alloc '%s': zero bytes", what ? what : "?");
    pthread_mutex_lock(&d->lock);
    rc = host_reserve(d, bytes, what);
    pthread_mutex_unlock(&d->lock);
    if (rc)
        return rc;
    if (registered)
        rc = d->ops->host_register(d, p, bytes, &locked);
    else
        rc = d->ops->host_alloc(d, bytes, &p, &locked);
    pthread_mutex_lock(&d->lock);
    if (rc) {
        d->host_used -= bytes;
    } else {
        host_record(d, p, bytes, registered, what);
        if (!locked)
            d->host_locked = 0;
    }
    pthread_mutex_unlock(&d->lock);
    if (rc)
        return zn_error_prefix(rc, "pinned host %s '%s' (%zu bytes)",
                               registered ? "register" : "alloc", what ? what : "?", bytes);
    if (out)
        *out = p;
    return 0;
}

int zn_dev_host_alloc(zn_dev *d, size_t bytes, const char *what, void **out)
{
    *out = NULL;
    return host_common(d, NULL, bytes, what, out, 0);
}

int zn_dev_host_register(zn_dev *d, void *p, size_t bytes, const char *what)
{
    if (!p)
        return zn_set_error(ZN_EARG, "pinned host register '%s': NULL", what ? what : "?");
    return host_common(d, p, bytes, what, NULL, 1);
}

static void host_release(zn_dev *d, void *p, int registered)
{
    if (!d || !p)
        return;
    pthread_mutex_lock(&d->lock);
    size_t i;
    for (i = 0; i < d->n_host_bufs; i++)
        if (d->host_bufs[i].p == p && d->host_bufs[i].registered == registered)
            break;
    if (i == d->n_host_bufs) {
        pthread_mutex_unlock(&d->lock);
        zn_error("pinned host %s: %p is not a live %s buffer of this device (ignored)",
                 registered ? "unregister" : "free", p, registered ? "registered" : "pinned");
        return;
    }
    size_t bytes = d->host_bufs[i].bytes;
    d->host_bufs[i] = d->host_bufs[--d->n_host_bufs];
    d->host_used -= bytes;
    pthread_mutex_unlock(&d->lock);
    if (registered)
        d->ops->host_unregister(d, p, bytes);
    else
        d->ops->host_free(d, p, bytes);
}

void zn_dev_host_free(zn_dev *d, void *p)
{
    host_release(d, p, 0);
}

void zn_dev_host_unregister(zn_dev *d, void *p)
{
    host_release(d, p, 1);
}
