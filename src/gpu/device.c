/* The device interface's common half: creation by name, the arena and the
 * pinned-memory accounting, argument checks, and the op descriptors handed
 * to a backend through its vtable (host.c, cuda.c). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hwloc.h>

#include "gpu/gpu-impl.h"
#include "util/hash-impl.h"

zn_dev_config zn_dev_config_default(void)
{
    zn_dev_config c;
    memset(&c, 0, sizeof c);
    c.name = "auto";
    c.gpu_budget = 0;
    c.gpu_margin = 1ull << 30;
    c.cpu_budget = 0;
    c.numa_node = -1;
    c.host_blas_threads = 0;
    return c;
}

static int dt_ok(zn_dtype dt)
{
    return dt == ZN_DTYPE_F32 || dt == ZN_DTYPE_BF16;
}

static zn_stream *pick(zn_dev *d, zn_stream *s)
{
    return s ? s : d->default_stream;
}

/* ---- creation -------------------------------------------------------------*/
static int parse_name(const char *name, int *kind, int *ordinal)
{
    *ordinal = 0;
    if (!name || !*name || !strcmp(name, "auto")) {
        *kind = -1;
        return 0;
    }
    if (!strcmp(name, "host") || !strcmp(name, "cpu")) {
        *kind = ZN_DEV_HOST;
        return 0;
    }
    if (!strcmp(name, "cuda") || !strcmp(name, "gpu")) {
        *kind = ZN_DEV_CUDA;
        return 0;
    }
    if (!strncmp(name, "cuda:", 5) && name[5]) {
        char *end;
        long v = strtol(name + 5, &end, 10);
        if (*end == '\0' && v >= 0 && v < 1024) {
            *kind = ZN_DEV_CUDA;
            *ordinal = (int)v;
            return 0;
        }
    }
    return zn_set_error(ZN_ECONFIG, "device name '%s': expected \"auto\", \"host\", "
                        "\"cuda\" or \"cuda:N\"", name);
}

static int start_backend(zn_dev *d, int kind, int ordinal)
{
    if (kind == ZN_DEV_HOST)
        return zn_host_backend_create(d);
#if ZN_HAVE_CUDA
    return zn_cuda_backend_create(d, ordinal);
#else
    (void)ordinal;
    return zn_set_error(ZN_ENODEV, "device '%s': this zinc was built without CUDA "
                        "(meson -Dcuda=disabled or no toolkit found)", d->cfg.name);
#endif
}

int zn_dev_create(zn_dev **out, const zn_dev_config *cfg)
{
    zn_dev_config def = zn_dev_config_default();
    int kind = -1, ordinal = 0, rc;

    *out = NULL;
    if (!cfg)
        cfg = &def;
    if ((rc = parse_name(cfg->name, &kind, &ordinal)))
        return rc;

    zn_dev *d = calloc(1, sizeof *d);
    if (!d)
        return zn_set_error(-ENOMEM, "device: out of memory");
    d->cfg = *cfg;
    if (!d->cfg.name)
        d->cfg.name = "auto";
    d->host_locked = 1;
    pthread_mutex_init(&d->lock, NULL);

    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) == 0) {
        if (hwloc_topology_load(topo) == 0)
            d->topo = topo;
        else
            hwloc_topology_destroy(topo);
    }
    if (!d->topo)
        zn_warn("device: hwloc topology unavailable; pinned memory is not NUMA-bound");

    if (kind == -1) {
#if ZN_HAVE_CUDA
        rc = start_backend(d, ZN_DEV_CUDA, 0);
        if (rc == ZN_ENODEV) {
            /* A backend that fails to start leaves nothing behind. */
            zn_info("device auto: no usable GPU (%s); using the host backend", zn_last_error());
            rc = start_backend(d, ZN_DEV_HOST, 0);
        }
#else
        zn_info("device auto: zinc built without CUDA; using the host backend");
        rc = start_backend(d, ZN_DEV_HOST, 0);
#endif
    } else {
        rc = start_backend(d, kind, ordinal);
    }
    if (rc)
        goto fail;

    if ((rc = zn_arena_init(&d->arena, d->arena_base, d->arena_bytes))) {
        rc = zn_set_error(rc, "device: arena of %llu bytes: %s",
                          (unsigned long long)d->arena_bytes, zn_strerror(rc));
        goto fail;
    }
    if ((rc = zn_dev_stream_create(d, "default", &d->default_stream)))
        goto fail;
    *out = d;
    {
        char b1[32], b2[32];
        zn_debug("device %s: %s, arena %s, pinned cap %s, NUMA node %d", d->ops->name,
                 d->info.name, zn_format_size(d->arena.size, b1, sizeof b1),
                 d->cfg.cpu_budget ? zn_format_size(d->cfg.cpu_budget, b2, sizeof b2) : "none",
                 d->info.numa_node);
    }
    return 0;

fail:
    zn_dev_destroy(d);
    return rc;
}

void zn_dev_destroy(zn_dev *d)
{
    if (!d)
        return;
    /* Streams first: they drain, and their queued frees touch the arena. */
    for (;;) {
        pthread_mutex_lock(&d->lock);
        zn_stream *s = d->streams;
        pthread_mutex_unlock(&d->lock);
        if (!s)
            break;
        if (s != d->default_stream)
            zn_warn("device: stream '%s' still alive at destroy; draining it", s->name);
        if (s == d->default_stream)
            d->default_stream = NULL;
        zn_dev_stream_destroy(d, s);
    }
    if (d->ops) {
        while (d->n_host_bufs) {
            zn_host_buf *b = &d->host_bufs[d->n_host_bufs - 1];
            zn_warn("device: pinned buffer '%s' (%zu bytes) still held at destroy", b->what,
                    b->bytes);
            if (b->registered)
                zn_dev_host_unregister(d, b->p);
            else
                zn_dev_host_free(d, b->p);
        }
        if (d->arena.n_live)
            zn_warn("device: %llu allocations (%llu bytes) still live at destroy",
                    (unsigned long long)d->arena.n_live, (unsigned long long)d->arena.used);
        zn_arena_fini(&d->arena);
        if (d->arena_base && d->ops->arena_release)
            d->ops->arena_release(d, d->arena_base, d->arena_bytes);
        if (d->ops->destroy)
            d->ops->destroy(d);
    }
    free(d->host_bufs);
    if (d->topo)
        hwloc_topology_destroy((hwloc_topology_t)d->topo);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

void zn_dev_get_info(const zn_dev *d, zn_dev_info *out)
{
    *out = d->info;
}

zn_dev_kind zn_dev_get_kind(const zn_dev *d)
{
    return d->info.kind;
}

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

/* ---- streams and events ------------------------------------------------*/
int zn_dev_stream_create(zn_dev *d, const char *name, zn_stream **out)
{
    *out = NULL;
    zn_stream *s = calloc(1, sizeof *s);
    if (!s)
        return zn_set_error(-ENOMEM, "stream create: out of memory");
    s->dev = d;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "stream");
    int rc = d->ops->stream_create(d, s);
    if (rc) {
        free(s);
        return zn_error_prefix(rc, "stream '%s'", name ? name : "stream");
    }
    pthread_mutex_lock(&d->lock);
    s->next = d->streams;
    d->streams = s;
    pthread_mutex_unlock(&d->lock);
    *out = s;
    return 0;
}

void zn_dev_stream_destroy(zn_dev *d, zn_stream *s)
{
    if (!s || (s == d->default_stream))
        return;
    pthread_mutex_lock(&d->lock);
    for (zn_stream **pp = &d->streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    pthread_mutex_unlock(&d->lock);
    d->ops->stream_destroy(d, s);
    free(s);
}

int zn_dev_stream_sync(zn_dev *d, zn_stream *s)
{
    s = pick(d, s);
    int rc = d->ops->stream_sync(d, s);
    return rc ? zn_error_prefix(rc, "stream '%s'", s->name) : 0;
}

int zn_dev_sync(zn_dev *d)
{
    /* Snapshot the list: streams are not destroyed while we sync them
     * (destroying a stream while another thread syncs the device is a
     * caller bug, as with CUDA). */
    zn_stream *list[256];
    size_t n = 0;
    int first = 0;
    pthread_mutex_lock(&d->lock);
    for (zn_stream *s = d->streams; s && n < 256; s = s->next)
        list[n++] = s;
    pthread_mutex_unlock(&d->lock);
    for (size_t i = 0; i < n; i++) {
        int rc = zn_dev_stream_sync(d, list[i]);
        if (rc && !first)
            first = rc;
    }
    return first;
}

int zn_dev_launch_host_fn(zn_dev *d, zn_stream *s, void (*fn)(void *arg), void *arg)
{
    if (!fn)
        return zn_set_error(ZN_EARG, "launch_host_fn: NULL function");
    zn_op op = { .kind = ZN_OPK_HOST_FN };
    op.u.host_fn.fn = fn;
    op.u.host_fn.arg = arg;
    return d->ops->submit(d, pick(d, s), &op);
}

int zn_dev_event_create(zn_dev *d, zn_event **out)
{
    *out = NULL;
    zn_event *e = calloc(1, sizeof *e);
    if (!e)
        return zn_set_error(-ENOMEM, "event create: out of memory");
    e->dev = d;
    int rc = d->ops->event_create(d, e);
    if (rc) {
        free(e);
        return rc;
    }
    *out = e;
    return 0;
}

void zn_dev_event_destroy(zn_dev *d, zn_event *e)
{
    if (!e)
        return;
    d->ops->event_destroy(d, e);
    free(e);
}

int zn_dev_event_record(zn_dev *d, zn_event *e, zn_stream *s)
{
    if (!e)
        return zn_set_error(ZN_EARG, "event record: NULL event");
    return d->ops->event_record(d, e, pick(d, s));
}

int zn_dev_stream_wait_event(zn_dev *d, zn_stream *s, zn_event *e)
{
    if (!e)
        return zn_set_error(ZN_EARG, "stream wait event: NULL event");
    return d->ops->stream_wait_event(d, pick(d, s), e);
}

int zn_dev_event_sync(zn_dev *d, zn_event *e)
{
    if (!e)
        return zn_set_error(ZN_EARG, "event sync: NULL event");
    return d->ops->event_sync(d, e);
}

int zn_dev_event_query(zn_dev *d, zn_event *e)
{
    if (!e)
        return zn_set_error(ZN_EARG, "event query: NULL event");
    return d->ops->event_query(d, e);
}

int zn_dev_event_elapsed_ms(zn_dev *d, zn_event *a, zn_event *b, float *ms)
{
    if (!a || !b || !ms)
        return zn_set_error(ZN_EARG, "event elapsed: NULL argument");
    return d->ops->event_elapsed_ms(d, a, b, ms);
}

/* ---- argument checks ------------------------------------------------------*/
/* Device pointers must lie in the arena: a host pointer handed to a kernel
 * is caught here on both backends instead of faulting on the GPU. */
static int in_arena(zn_dev *d, const void *p, uint64_t bytes)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)d->arena_base;
    return p && a >= b && bytes <= d->arena_bytes && a - b <= d->arena_bytes - bytes;
}

#define CHK(cond, ...)                                                         \
    do {                                                                       \
        if (!(cond))                                                           \
            return zn_set_error(ZN_EARG, __VA_ARGS__);                         \
    } while (0)

#define CHK_DT(fn, dt)                                                         \
    do {                                                                       \
        if (!dt_ok(dt))                                                        \
            return zn_set_error(ZN_EUNSUPPORTED, "%s: dtype %s (%d) not supported " \
                                "(f32 and bf16 only)", fn, zn_dtype_name(dt), (int)(dt)); \
    } while (0)

#define CHK_PTR(fn, p, bytes)                                                  \
    do {                                                                       \
        if (!in_arena(d, (p), (bytes)))                                        \
            return zn_set_error(ZN_EARG, "%s: %s (%p, %llu bytes) is not inside the " \
                                "device arena", fn, #p, (const void *)(p),     \
                                (unsigned long long)(bytes));                  \
    } while (0)

/* Bytes spanned by a rows x cols matrix with leading dimension ld. */
static uint64_t span(int64_t rows, int64_t cols, int64_t ld, zn_dtype dt)
{
    if (rows <= 0 || cols <= 0)
        return 0;
    return ((uint64_t)(rows - 1) * (uint64_t)ld + (uint64_t)cols) * zn_dtype_size(dt);
}

static uint64_t nbytes(int64_t n, zn_dtype dt)
{
    return n > 0 ? (uint64_t)n * zn_dtype_size(dt) : 0;
}

static int submit(zn_dev *d, zn_stream *s, const zn_op *op)
{
    return d->ops->submit(d, pick(d, s), op);
}

/* ---- copies ------------------------------------------------------------*/
static int copy(zn_dev *d, zn_stream *s, void *dst, const void *src, size_t bytes,
                zn_copy_dir dir, const char *fn)
{
    if (bytes == 0)
        return 0;
    CHK(dst && src, "%s: NULL pointer", fn);
    if (dir == ZN_COPY_H2D || dir == ZN_COPY_D2D)
        CHK_PTR(fn, dst, bytes);
    if (dir == ZN_COPY_D2H || dir == ZN_COPY_D2D)
        CHK_PTR(fn, src, bytes);
    zn_op op = { .kind = ZN_OPK_COPY };
    op.u.copy.dst = dst;
    op.u.copy.src = src;
    op.u.copy.bytes = bytes;
    op.u.copy.dir = dir;
    return submit(d, s, &op);
}

int zn_dev_copy_h2d(zn_dev *d, zn_stream *s, void *dst, const void *src, size_t bytes)
{
    return copy(d, s, dst, src, bytes, ZN_COPY_H2D, "copy_h2d");
}

int zn_dev_copy_d2h(zn_dev *d, zn_stream *s, void *dst, const void *src, size_t bytes)
{
    return copy(d, s, dst, src, bytes, ZN_COPY_D2H, "copy_d2h");
}

int zn_dev_copy_d2d(zn_dev *d, zn_stream *s, void *dst, const void *src, size_t bytes)
{
    return copy(d, s, dst, src, bytes, ZN_COPY_D2D, "copy_d2d");
}

int zn_dev_memset(zn_dev *d, zn_stream *s, void *dst, int value, size_t bytes)
{
    if (bytes == 0)
        return 0;
    CHK_PTR("memset", dst, bytes);
    zn_op op = { .kind = ZN_OPK_MEMSET };
    op.u.memset.dst = dst;
    op.u.memset.value = value;
    op.u.memset.bytes = bytes;
    return submit(d, s, &op);
}

int zn_dev_fill(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t n, float value)
{
    CHK_DT("fill", dt);
    CHK(n >= 0, "fill: n = %lld", (long long)n);
    if (n == 0)
        return 0;
    CHK_PTR("fill", x, nbytes(n, dt));
    zn_op op = { .kind = ZN_OPK_FILL };
    op.u.fill.x = x;
    op.u.fill.dt = dt;
    op.u.fill.n = n;
    op.u.fill.value = value;
    return submit(d, s, &op);
}

/* ---- GEMM -----------------------------------------------------------------*/
int zn_dev_gemm_strided_batched(zn_dev *d, zn_stream *s, zn_trans ta, zn_trans tb,
                                int64_t m, int64_t n, int64_t k, float alpha,
                                const void *A, zn_dtype adt, int64_t lda, int64_t sa,
                                const void *B, zn_dtype bdt, int64_t ldb, int64_t sb,
                                float beta, void *C, zn_dtype cdt, int64_t ldc, int64_t sc,
                                int64_t batch)
{
    const char *fn = "gemm";
    CHK_DT(fn, adt);
    CHK_DT(fn, bdt);
    CHK_DT(fn, cdt);
    if (adt != bdt || (adt == ZN_DTYPE_F32 && cdt != ZN_DTYPE_F32))
        return zn_set_error(ZN_EUNSUPPORTED, "gemm: types A %s, B %s, C %s not supported "
                            "(f32,f32->f32; bf16,bf16->f32|bf16)", zn_dtype_name(adt),
                            zn_dtype_name(bdt), zn_dtype_name(cdt));
    CHK((ta == ZN_NOTRANS || ta == ZN_TRANS) && (tb == ZN_NOTRANS || tb == ZN_TRANS),
        "gemm: bad transpose flag");
    CHK(m >= 0 && n >= 0 && k >= 0 && batch >= 0, "gemm: negative size (m %lld n %lld "
        "k %lld batch %lld)", (long long)m, (long long)n, (long long)k, (long long)batch);
    CHK(sa >= 0 && sb >= 0 && sc >= 0, "gemm: negative stride");
    int64_t arows = ta ? k : m, acols = ta ? m : k;
    int64_t brows = tb ? n : k, bcols = tb ? k : n;
    CHK(lda >= (acols > 1 ? acols : 1), "gemm: lda %lld < %lld (A stored %lldx%lld, row-major)",
        (long long)lda, (long long)acols, (long long)arows, (long long)acols);
    CHK(ldb >= (bcols > 1 ? bcols : 1), "gemm: ldb %lld < %lld (B stored %lldx%lld, row-major)",
        (long long)ldb, (long long)bcols, (long long)brows, (long long)bcols);
    CHK(ldc >= (n > 1 ? n : 1), "gemm: ldc %lld < n %lld", (long long)ldc, (long long)n);
    if (m == 0 || n == 0 || batch == 0)
        return 0;
    uint64_t cspan = span(m, n, ldc, cdt);
    if (batch > 1) {
        /* disjoint: one after another, or side by side in the columns of
         * shared rows (heads of one attention output, [rows][heads x dim]) */
        CHK(sc * (int64_t)zn_dtype_size(cdt) >= (int64_t)cspan ||
                (sc >= n && (batch - 1) * sc + n <= ldc),
            "gemm: strideC %lld makes the %lld outputs overlap", (long long)sc,
            (long long)batch);
    }
    CHK_PTR(fn, C, cspan + (uint64_t)(batch - 1) * (uint64_t)sc * zn_dtype_size(cdt));
    if (k > 0) {
        CHK_PTR(fn, A, span(arows, acols, lda, adt) +
                           (uint64_t)(batch - 1) * (uint64_t)sa * zn_dtype_size(adt));
        CHK_PTR(fn, B, span(brows, bcols, ldb, bdt) +
                           (uint64_t)(batch - 1) * (uint64_t)sb * zn_dtype_size(bdt));
    }
    zn_op op = { .kind = ZN_OPK_GEMM };
    op.u.gemm.ta = ta;
    op.u.gemm.tb = tb;
    op.u.gemm.m = m;
    op.u.gemm.n = n;
    op.u.gemm.k = k;
    op.u.gemm.lda = lda;
    op.u.gemm.ldb = ldb;
    op.u.gemm.ldc = ldc;
    op.u.gemm.sa = sa;
    op.u.gemm.sb = sb;
    op.u.gemm.sc = sc;
    op.u.gemm.batch = batch;
    op.u.gemm.alpha = alpha;
    op.u.gemm.beta = beta;
    op.u.gemm.A = A;
    op.u.gemm.B = B;
    op.u.gemm.C = C;
    op.u.gemm.adt = adt;
    op.u.gemm.bdt = bdt;
    op.u.gemm.cdt = cdt;
    return submit(d, s, &op);
}

int zn_dev_gemm(zn_dev *d, zn_stream *s, zn_trans ta, zn_trans tb, int64_t m, int64_t n,
                int64_t k, float alpha, const void *A, zn_dtype adt, int64_t lda,
                const void *B, zn_dtype bdt, int64_t ldb, float beta, void *C,
                zn_dtype cdt, int64_t ldc)
{
    return zn_dev_gemm_strided_batched(d, s, ta, tb, m, n, k, alpha, A, adt, lda, 0, B, bdt,
                                       ldb, 0, beta, C, cdt, ldc, 0, 1);
}

/* ---- kernels ------------------------------------------------------------*/
static int emb_fwd_op(zn_dev *d, zn_stream *s, const char *fn, const int32_t *ids,
                      int64_t n_tokens, const void *table, zn_dtype table_dt, int64_t row0,
                      int64_t vocab, int64_t dim, void *out, zn_dtype out_dt, int skip)
{
    CHK_DT(fn, table_dt);
    CHK_DT(fn, out_dt);
    CHK(n_tokens >= 0 && vocab > 0 && dim > 0 && row0 >= 0, "%s: bad sizes (tokens %lld "
        "rows %lld from %lld, dim %lld)", fn, (long long)n_tokens, (long long)vocab,
        (long long)row0, (long long)dim);
    if (n_tokens == 0)
        return 0;
    CHK_PTR(fn, ids, (uint64_t)n_tokens * 4);
    CHK_PTR(fn, table, span(vocab, dim, dim, table_dt));
    CHK_PTR(fn, out, span(n_tokens, dim, dim, out_dt));
    zn_op op = { .kind = ZN_OPK_EMB_FWD };
    op.u.emb.ids = ids;
    op.u.emb.n_tokens = n_tokens;
    op.u.emb.vocab = vocab;
    op.u.emb.dim = dim;
    op.u.emb.row0 = row0;
    op.u.emb.skip = skip;
    op.u.emb.table = table;
    op.u.emb.table_dt = table_dt;
    op.u.emb.out = out;
    op.u.emb.out_dt = out_dt;
    return submit(d, s, &op);
}

static int emb_bwd_op(zn_dev *d, zn_stream *s, const char *fn, const int32_t *ids,
                      int64_t n_tokens, const void *dout, zn_dtype dout_dt, int64_t row0,
                      int64_t vocab, int64_t dim, float *dtable)
{
    CHK_DT(fn, dout_dt);
    CHK(n_tokens >= 0 && vocab > 0 && dim > 0 && row0 >= 0, "%s: bad sizes (tokens %lld "
        "rows %lld from %lld, dim %lld)", fn, (long long)n_tokens, (long long)vocab,
        (long long)row0, (long long)dim);
    if (n_tokens == 0)
        return 0;
    CHK_PTR(fn, ids, (uint64_t)n_tokens * 4);
    CHK_PTR(fn, dout, span(n_tokens, dim, dim, dout_dt));
    CHK_PTR(fn, dtable, span(vocab, dim, dim, ZN_DTYPE_F32));
    zn_op op = { .kind = ZN_OPK_EMB_BWD };
    op.u.emb.ids = ids;
    op.u.emb.n_tokens = n_tokens;
    op.u.emb.vocab = vocab;
    op.u.emb.dim = dim;
    op.u.emb.row0 = row0;
    op.u.emb.skip = 1;
    op.u.emb.dout = dout;
    op.u.emb.dout_dt = dout_dt;
    op.u.emb.dtable = dtable;
    return submit(d, s, &op);
}

int zn_dev_embedding_fwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                         const void *table, zn_dtype table_dt, int64_t vocab, int64_t dim,
                         void *out, zn_dtype out_dt)
{
    return emb_fwd_op(d, s, "embedding_fwd", ids, n_tokens, table, table_dt, 0, vocab, dim, out,
                      out_dt, 0);
}

int zn_dev_embedding_rows_fwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                              const void *table, zn_dtype table_dt, int64_t row0, int64_t rows,
                              int64_t dim, void *out, zn_dtype out_dt)
{
    return emb_fwd_op(d, s, "embedding_rows_fwd", ids, n_tokens, table, table_dt, row0, rows,
                      dim, out, out_dt, 1);
}

int zn_dev_embedding_bwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                         const void *dout, zn_dtype dout_dt, int64_t vocab, int64_t dim,
                         float *dtable)
{
    return emb_bwd_op(d, s, "embedding_bwd", ids, n_tokens, dout, dout_dt, 0, vocab, dim,
                      dtable);
}

int zn_dev_embedding_rows_bwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                              const void *dout, zn_dtype dout_dt, int64_t row0, int64_t rows,
                              int64_t dim, float *dtable)
{
    return emb_bwd_op(d, s, "embedding_rows_bwd", ids, n_tokens, dout, dout_dt, row0, rows, dim,
                      dtable);
}

int zn_dev_rmsnorm_fwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, const void *w,
                       zn_dtype w_dt, void *y, zn_dtype y_dt, float *rstd, int64_t rows,
                       int64_t dim, float eps)
{
    const char *fn = "rmsnorm_fwd";
    CHK_DT(fn, x_dt);
    CHK_DT(fn, w_dt);
    CHK_DT(fn, y_dt);
    CHK(rows >= 0 && dim > 0, "%s: bad sizes (rows %lld dim %lld)", fn, (long long)rows,
        (long long)dim);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, x, span(rows, dim, dim, x_dt));
    CHK_PTR(fn, w, nbytes(dim, w_dt));
    CHK_PTR(fn, y, span(rows, dim, dim, y_dt));
    if (rstd)
        CHK_PTR(fn, rstd, (uint64_t)rows * 4);
    zn_op op = { .kind = ZN_OPK_RMS_FWD };
    op.u.rms_fwd.x = x;
    op.u.rms_fwd.x_dt = x_dt;
    op.u.rms_fwd.w = w;
    op.u.rms_fwd.w_dt = w_dt;
    op.u.rms_fwd.y = y;
    op.u.rms_fwd.y_dt = y_dt;
    op.u.rms_fwd.rstd = rstd;
    op.u.rms_fwd.rows = rows;
    op.u.rms_fwd.dim = dim;
    op.u.rms_fwd.eps = eps;
    return submit(d, s, &op);
}

int zn_dev_rmsnorm_bwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, const void *w,
                       zn_dtype w_dt, const float *rstd, const void *dy, zn_dtype dy_dt,
                       void *dx, zn_dtype dx_dt, float *dw, int64_t rows, int64_t dim)
{
    const char *fn = "rmsnorm_bwd";
    CHK_DT(fn, x_dt);
    CHK_DT(fn, w_dt);
    CHK_DT(fn, dy_dt);
    CHK_DT(fn, dx_dt);
    CHK(rows >= 0 && dim > 0, "%s: bad sizes (rows %lld dim %lld)", fn, (long long)rows,
        (long long)dim);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, x, span(rows, dim, dim, x_dt));
    CHK_PTR(fn, w, nbytes(dim, w_dt));
    CHK_PTR(fn, rstd, (uint64_t)rows * 4);
    CHK_PTR(fn, dy, span(rows, dim, dim, dy_dt));
    CHK_PTR(fn, dx, span(rows, dim, dim, dx_dt));
    if (dw)
        CHK_PTR(fn, dw, (uint64_t)dim * 4);
    zn_op op = { .kind = ZN_OPK_RMS_BWD };
    op.u.rms_bwd.x = x;
    op.u.rms_bwd.x_dt = x_dt;
    op.u.rms_bwd.w = w;
    op.u.rms_bwd.w_dt = w_dt;
    op.u.rms_bwd.rstd = rstd;
    op.u.rms_bwd.dy = dy;
    op.u.rms_bwd.dy_dt = dy_dt;
    op.u.rms_bwd.dx = dx;
    op.u.rms_bwd.dx_dt = dx_dt;
    op.u.rms_bwd.dw = dw;
    op.u.rms_bwd.rows = rows;
    op.u.rms_bwd.dim = dim;
    return submit(d, s, &op);
}

static int rope(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t tokens,
                int64_t n_heads, int64_t head_dim, int64_t ld, const int32_t *pos,
                const float *inv_freq, int inverse)
{
    const char *fn = inverse ? "rope_bwd" : "rope_fwd";
    CHK_DT(fn, dt);
    CHK(tokens >= 0 && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
        "%s: bad sizes (tokens %lld heads %lld head_dim %lld; head_dim must be even)", fn,
        (long long)tokens, (long long)n_heads, (long long)head_dim);
    CHK(ld >= n_heads * head_dim, "%s: ld %lld < n_heads*head_dim %lld", fn, (long long)ld,
        (long long)(n_heads * head_dim));
    if (tokens == 0)
        return 0;
    CHK_PTR(fn, x, span(tokens, n_heads * head_dim, ld, dt));
    CHK_PTR(fn, pos, (uint64_t)tokens * 4);
    CHK_PTR(fn, inv_freq, (uint64_t)(head_dim / 2) * 4);
    zn_op op = { .kind = ZN_OPK_ROPE };
    op.u.rope.x = x;
    op.u.rope.dt = dt;
    op.u.rope.tokens = tokens;
    op.u.rope.n_heads = n_heads;
    op.u.rope.head_dim = head_dim;
    op.u.rope.ld = ld;
    op.u.rope.pos = pos;
    op.u.rope.inv_freq = inv_freq;
    op.u.rope.inverse = inverse;
    return submit(d, s, &op);
}

int zn_dev_rope_fwd(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t tokens,
                    int64_t n_heads, int64_t head_dim, int64_t ld, const int32_t *pos,
                    const float *inv_freq)
{
    return rope(d, s, x, dt, tokens, n_heads, head_dim, ld, pos, inv_freq, 0);
}

int zn_dev_rope_bwd(zn_dev *d, zn_stream *s, void *dx, zn_dtype dt, int64_t tokens,
                    int64_t n_heads, int64_t head_dim, int64_t ld, const int32_t *pos,
                    const float *inv_freq)
{
    return rope(d, s, dx, dt, tokens, n_heads, head_dim, ld, pos, inv_freq, 1);
}

void zn_rope_inv_freq(float *inv_freq, int64_t head_dim, double theta,
                      const zn_rope_scaling *sc)
{
    const double pi = 3.14159265358979323846;
    for (int64_t i = 0; i < head_dim / 2; i++) {
        /* HF: 1 / theta ** (arange(0, dim, 2).float() / dim), in fp32. */
        float e = (float)(2 * i) / (float)head_dim;
        float f = 1.0f / powf((float)theta, e);
        if (sc && sc->factor > 0) {
            double lo_wl = sc->original_max_position / sc->low_freq_factor;
            double hi_wl = sc->original_max_position / sc->high_freq_factor;
            double wl = 2 * pi / f;
            double v = f;
            if (wl > lo_wl) {
                v = f / sc->factor;
            } else if (wl >= hi_wl) {   /* medium band: smooth interpolation */
                double sm = (sc->original_max_position / wl - sc->low_freq_factor) /
                            (sc->high_freq_factor - sc->low_freq_factor);
                v = (1 - sm) * f / sc->factor + sm * f;
            }
            f = (float)v;
        }
        inv_freq[i] = f;
    }
}

static int softmax(zn_dev *d, zn_stream *s, const void *S, zn_dtype S_dt, const void *dP,
                   zn_dtype dP_dt, void *out, zn_dtype out_dt, int64_t batch, int64_t rows,
                   int64_t cols, int64_t q_offset, const int32_t *key_start, float scale,
                   int bwd)
{
    const char *fn = bwd ? "softmax_causal_bwd" : "softmax_causal_fwd";
    CHK_DT(fn, S_dt);
    CHK_DT(fn, out_dt);
    if (bwd)
        CHK_DT(fn, dP_dt);
    CHK(batch >= 0 && rows >= 0 && cols > 0 && q_offset >= 0,
        "%s: bad sizes (batch %lld rows %lld cols %lld q_offset %lld)", fn, (long long)batch,
        (long long)rows, (long long)cols, (long long)q_offset);
    if (batch == 0 || rows == 0)
        return 0;
    CHK_PTR(fn, S, span(batch * rows, cols, cols, S_dt));
    CHK_PTR(fn, out, span(batch * rows, cols, cols, out_dt));
    if (bwd)
        CHK_PTR(fn, dP, span(batch * rows, cols, cols, dP_dt));
    if (key_start)
        CHK_PTR(fn, key_start, (uint64_t)rows * 4);
    zn_op op = { .kind = bwd ? ZN_OPK_SOFTMAX_BWD : ZN_OPK_SOFTMAX_FWD };
    if (bwd) {
        op.u.softmax.Pin = S;
        op.u.softmax.Pin_dt = S_dt;
        op.u.softmax.dP = dP;
        op.u.softmax.dP_dt = dP_dt;
    } else {
        op.u.softmax.S = S;
        op.u.softmax.S_dt = S_dt;
    }
    op.u.softmax.P = out;
    op.u.softmax.P_dt = out_dt;
    op.u.softmax.batch = batch;
    op.u.softmax.rows = rows;
    op.u.softmax.cols = cols;
    op.u.softmax.q_offset = q_offset;
    op.u.softmax.key_start = key_start;
    op.u.softmax.scale = scale;
    return submit(d, s, &op);
}

int zn_dev_softmax_causal_fwd(zn_dev *d, zn_stream *s, const void *S, zn_dtype S_dt, void *P,
                              zn_dtype P_dt, int64_t batch, int64_t rows, int64_t cols,
                              int64_t q_offset, const int32_t *key_start, float scale)
{
    return softmax(d, s, S, S_dt, NULL, ZN_DTYPE_F32, P, P_dt, batch, rows, cols, q_offset,
                   key_start, scale, 0);
}

int zn_dev_softmax_causal_bwd(zn_dev *d, zn_stream *s, const void *P, zn_dtype P_dt,
                              const void *dP, zn_dtype dP_dt, void *dS, zn_dtype dS_dt,
                              int64_t batch, int64_t rows, int64_t cols, int64_t q_offset,
                              const int32_t *key_start, float scale)
{
    return softmax(d, s, P, P_dt, dP, dP_dt, dS, dS_dt, batch, rows, cols, q_offset, key_start,
                   scale, 1);
}

/* ---- fused attention -----------------------------------------------------*/
static int overlap(const void *a, uint64_t an, const void *b, uint64_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

static int flash(zn_dev *d, zn_stream *s, zn_op *op, int bwd)
{
    const char *fn = bwd ? "flash_attn_bwd" : "flash_attn_fwd";
    zn_dtype dt = op->u.flash.dt;
    int64_t ld = op->u.flash.ld, B = op->u.flash.batch, T = op->u.flash.seq;
    int64_t nh = op->u.flash.nh, nkv = op->u.flash.nkv, hd = op->u.flash.hd;
    int64_t ldo = op->u.flash.ldo;
    CHK_DT(fn, dt);
    if (zn_dev_get_kind(d) == ZN_DEV_CUDA && dt != ZN_DTYPE_BF16)
        return zn_set_error(ZN_EUNSUPPORTED, "%s: dtype %s on CUDA (the fused attention runs "
                            "on bf16 tensor cores; use the GEMM attention for f32)", fn,
                            zn_dtype_name(dt));
    CHK(B >= 0 && T >= 0 && nh > 0 && nkv > 0 && nh % nkv == 0,
        "%s: bad sizes (batch %lld seq %lld heads %lld kv heads %lld)", fn, (long long)B,
        (long long)T, (long long)nh, (long long)nkv);
    CHK(hd > 0 && hd <= ZN_FLASH_MAX_HEAD_DIM && hd % 2 == 0,
        "%s: head_dim %lld (fused attention takes even head dims up to %d)", fn,
        (long long)hd, ZN_FLASH_MAX_HEAD_DIM);
    int64_t cols = (nh + 2 * nkv) * hd;
    CHK(ld >= cols && ldo >= nh * hd,
        "%s: leading dimensions %lld / %lld below the rows' %lld / %lld columns", fn,
        (long long)ld, (long long)ldo, (long long)cols, (long long)(nh * hd));
    CHK(isfinite(op->u.flash.scale), "%s: scale %g", fn, (double)op->u.flash.scale);
    int64_t N = B * T;
    if (N == 0)
        return 0;
    uint64_t qkv_b = span(N, cols, ld, dt), o_b = span(N, nh * hd, ldo, dt);
    uint64_t st_b = (uint64_t)(B * nh * T) * 4;
    CHK_PTR(fn, op->u.flash.qkv, qkv_b);
    CHK_PTR(fn, op->u.flash.lse, st_b);
    if (op->u.flash.key_start)
        CHK_PTR(fn, op->u.flash.key_start, (uint64_t)N * 4);
    if (!bwd) {
        CHK_PTR(fn, op->u.flash.out, o_b);
        CHK(!overlap(op->u.flash.out, o_b, op->u.flash.qkv, qkv_b),
            "%s: out overlaps qkv", fn);
    } else {
        int64_t ldd = op->u.flash.ldd;
        CHK(ldd >= cols, "%s: ldd %lld below the rows' %lld columns", fn, (long long)ldd,
            (long long)cols);
        uint64_t d_b = span(N, cols, ldd, dt);
        CHK_PTR(fn, op->u.flash.out, o_b);
        CHK_PTR(fn, op->u.flash.dout, o_b);
        CHK_PTR(fn, op->u.flash.delta, st_b);
        CHK_PTR(fn, op->u.flash.dqkv, d_b);
        CHK(!overlap(op->u.flash.dqkv, d_b, op->u.flash.qkv, qkv_b) &&
                !overlap(op->u.flash.dqkv, d_b, op->u.flash.out, o_b) &&
                !overlap(op->u.flash.dqkv, d_b, op->u.flash.dout, o_b),
            "%s: dqkv overlaps qkv, out or dout", fn);
    }
    op->kind = bwd ? ZN_OPK_FLASH_BWD : ZN_OPK_FLASH_FWD;
    return submit(d, s, op);
}

/* The fields both directions share. */
static zn_op flash_op(const void *qkv, zn_dtype dt, int64_t ld, int64_t batch, int64_t seq,
                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                      const int32_t *key_start, float scale)
{
    zn_op op = { .kind = ZN_OPK_FLASH_FWD };
    op.u.flash.qkv = qkv;
    op.u.flash.dt = dt;
    op.u.flash.ld = ld;
    op.u.flash.batch = batch;
    op.u.flash.seq = seq;
    op.u.flash.nh = n_heads;
    op.u.flash.nkv = n_kv_heads;
    op.u.flash.hd = head_dim;
    op.u.flash.key_start = key_start;
    op.u.flash.scale = scale;
    return op;
}

int zn_dev_flash_attn_fwd(zn_dev *d, zn_stream *s, const void *qkv, zn_dtype dt, int64_t ld,
                          int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv_heads,
                          int64_t head_dim, const int32_t *key_start, float scale, void *out,
                          int64_t ldo, float *lse)
{
    zn_op op = flash_op(qkv, dt, ld, batch, seq, n_heads, n_kv_heads, head_dim, key_start, scale);
    op.u.flash.out = out;
    op.u.flash.ldo = ldo;
    op.u.flash.lse = lse;
    return flash(d, s, &op, 0);
}

int zn_dev_flash_attn_bwd(zn_dev *d, zn_stream *s, const void *qkv, zn_dtype dt, int64_t ld,
                          int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv_heads,
                          int64_t head_dim, const int32_t *key_start, float scale,
                          const void *out, const void *dout, int64_t ldo, const float *lse,
                          float *delta, void *dqkv, int64_t ldd)
{
    zn_op op = flash_op(qkv, dt, ld, batch, seq, n_heads, n_kv_heads, head_dim, key_start, scale);
    op.u.flash.out = (void *)out;
    op.u.flash.dout = dout;
    op.u.flash.ldo = ldo;
    op.u.flash.lse = (float *)lse;
    op.u.flash.delta = delta;
    op.u.flash.dqkv = dqkv;
    op.u.flash.ldd = ldd;
    return flash(d, s, &op, 1);
}

int zn_dev_swiglu_fwd(zn_dev *d, zn_stream *s, const void *gate, const void *up, void *out,
                      zn_dtype dt, int64_t n)
{
    const char *fn = "swiglu_fwd";
    CHK_DT(fn, dt);
    CHK(n >= 0, "%s: n = %lld", fn, (long long)n);
    if (n == 0)
        return 0;
    CHK_PTR(fn, gate, nbytes(n, dt));
    CHK_PTR(fn, up, nbytes(n, dt));
    CHK_PTR(fn, out, nbytes(n, dt));
    zn_op op = { .kind = ZN_OPK_SWIGLU_FWD };
    op.u.swiglu.gate = gate;
    op.u.swiglu.up = up;
    op.u.swiglu.out = out;
    op.u.swiglu.dt = dt;
    op.u.swiglu.n = n;
    return submit(d, s, &op);
}

int zn_dev_swiglu_bwd(zn_dev *d, zn_stream *s, const void *gate, const void *up,
                      const void *dout, void *dgate, void *dup, zn_dtype dt, int64_t n)
{
    const char *fn = "swiglu_bwd";
    CHK_DT(fn, dt);
    CHK(n >= 0, "%s: n = %lld", fn, (long long)n);
    if (n == 0)
        return 0;
    CHK_PTR(fn, gate, nbytes(n, dt));
    CHK_PTR(fn, up, nbytes(n, dt));
    CHK_PTR(fn, dout, nbytes(n, dt));
    CHK_PTR(fn, dgate, nbytes(n, dt));
    CHK_PTR(fn, dup, nbytes(n, dt));
    CHK(dgate != dout && dup != dout && dgate != dup, "%s: dgate/dup may not alias dout "
        "or each other", fn);
    zn_op op = { .kind = ZN_OPK_SWIGLU_BWD };
    op.u.swiglu.gate = gate;
    op.u.swiglu.up = up;
    op.u.swiglu.dout = dout;
    op.u.swiglu.dgate = dgate;
    op.u.swiglu.dup = dup;
    op.u.swiglu.dt = dt;
    op.u.swiglu.n = n;
    return submit(d, s, &op);
}

static int ew(zn_dev *d, zn_stream *s, zn_op_kind kind, const char *fn, const void *a,
              const void *b, zn_dtype a_dt, void *y, zn_dtype y_dt, int64_t n, float alpha)
{
    CHK_DT(fn, a_dt);
    CHK_DT(fn, y_dt);
    CHK(n >= 0, "%s: n = %lld", fn, (long long)n);
    if (n == 0)
        return 0;
    if (a)
        CHK_PTR(fn, a, nbytes(n, a_dt));
    if (b)
        CHK_PTR(fn, b, nbytes(n, a_dt));
    CHK_PTR(fn, y, nbytes(n, y_dt));
    zn_op op = { .kind = kind };
    op.u.ew.a = a;
    op.u.ew.b = b;
    op.u.ew.a_dt = a_dt;
    op.u.ew.y = y;
    op.u.ew.y_dt = y_dt;
    op.u.ew.n = n;
    op.u.ew.alpha = alpha;
    return submit(d, s, &op);
}

int zn_dev_add(zn_dev *d, zn_stream *s, const void *a, const void *b, void *y, zn_dtype dt,
               int64_t n)
{
    CHK(a && b, "add: NULL input");
    return ew(d, s, ZN_OPK_ADD, "add", a, b, dt, y, dt, n, 1.0f);
}

int zn_dev_add_inplace(zn_dev *d, zn_stream *s, void *y, zn_dtype y_dt, const void *x,
                       zn_dtype x_dt, int64_t n)
{
    CHK(x, "add_inplace: NULL input");
    return ew(d, s, ZN_OPK_AXPY, "add_inplace", x, NULL, x_dt, y, y_dt, n, 1.0f);
}

int zn_dev_scale(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t n, float alpha)
{
    return ew(d, s, ZN_OPK_SCALE, "scale", NULL, NULL, dt, x, dt, n, alpha);
}

int zn_dev_axpy(zn_dev *d, zn_stream *s, float alpha, const void *x, zn_dtype x_dt, void *y,
                zn_dtype y_dt, int64_t n)
{
    CHK(x, "axpy: NULL input");
    return ew(d, s, ZN_OPK_AXPY, "axpy", x, NULL, x_dt, y, y_dt, n, alpha);
}

int zn_dev_bias_add(zn_dev *d, zn_stream *s, void *y, zn_dtype y_dt, int64_t ld,
                    const void *bias, zn_dtype bias_dt, int64_t rows, int64_t cols)
{
    const char *fn = "bias_add";
    CHK_DT(fn, y_dt);
    CHK_DT(fn, bias_dt);
    CHK(rows >= 0 && cols > 0 && ld >= cols, "%s: bad sizes (rows %lld cols %lld ld %lld)",
        fn, (long long)rows, (long long)cols, (long long)ld);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, y, span(rows, cols, ld, y_dt));
    CHK_PTR(fn, bias, nbytes(cols, bias_dt));
    zn_op op = { .kind = ZN_OPK_BIAS_ADD };
    op.u.bias.y = y;
    op.u.bias.y_dt = y_dt;
    op.u.bias.ld = ld;
    op.u.bias.bias = bias;
    op.u.bias.bias_dt = bias_dt;
    op.u.bias.rows = rows;
    op.u.bias.cols = cols;
    return submit(d, s, &op);
}

int zn_dev_bias_grad(zn_dev *d, zn_stream *s, const void *dy, zn_dtype dy_dt, int64_t ld,
                     float *dbias, int64_t rows, int64_t cols)
{
    const char *fn = "bias_grad";
    CHK_DT(fn, dy_dt);
    CHK(rows >= 0 && cols > 0 && ld >= cols, "%s: bad sizes (rows %lld cols %lld ld %lld)",
        fn, (long long)rows, (long long)cols, (long long)ld);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, dy, span(rows, cols, ld, dy_dt));
    CHK_PTR(fn, dbias, (uint64_t)cols * 4);
    zn_op op = { .kind = ZN_OPK_BIAS_GRAD };
    op.u.bias.dy = dy;
    op.u.bias.y_dt = dy_dt;
    op.u.bias.ld = ld;
    op.u.bias.dbias = dbias;
    op.u.bias.rows = rows;
    op.u.bias.cols = cols;
    return submit(d, s, &op);
}

int zn_dev_cast(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, void *y, zn_dtype y_dt,
                int64_t n)
{
    const char *fn = "cast";
    CHK_DT(fn, x_dt);
    CHK_DT(fn, y_dt);
    CHK(n >= 0, "%s: n = %lld", fn, (long long)n);
    if (n == 0)
        return 0;
    CHK_PTR(fn, x, nbytes(n, x_dt));
    CHK_PTR(fn, y, nbytes(n, y_dt));
    zn_op op = { .kind = ZN_OPK_CAST };
    op.u.cast.x = x;
    op.u.cast.x_dt = x_dt;
    op.u.cast.y = y;
    op.u.cast.y_dt = y_dt;
    op.u.cast.n = n;
    return submit(d, s, &op);
}

int zn_dev_dropout(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, int64_t ldx, void *y,
                   zn_dtype y_dt, int64_t ldy, int64_t rows, int64_t cols, double p,
                   uint64_t key, int accumulate)
{
    const char *fn = "dropout";
    CHK_DT(fn, x_dt);
    CHK_DT(fn, y_dt);
    CHK(rows >= 0 && cols > 0 && ldx >= cols && ldy >= cols,
        "%s: bad sizes (rows %lld cols %lld ldx %lld ldy %lld)", fn, (long long)rows,
        (long long)cols, (long long)ldx, (long long)ldy);
    CHK(p >= 0.0 && p < 1.0, "%s: p = %g is outside [0, 1)", fn, p);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, x, span(rows, cols, ldx, x_dt));
    CHK_PTR(fn, y, span(rows, cols, ldy, y_dt));
    zn_op op = { .kind = ZN_OPK_DROPOUT };
    op.u.drop.x = x;
    op.u.drop.x_dt = x_dt;
    op.u.drop.y = y;
    op.u.drop.y_dt = y_dt;
    op.u.drop.ldx = ldx;
    op.u.drop.ldy = ldy;
    op.u.drop.rows = rows;
    op.u.drop.cols = cols;
    op.u.drop.key = key;
    op.u.drop.thresh = zn_drop_threshold(p);
    op.u.drop.scale = (float)(1.0 / (1.0 - p));
    op.u.drop.accumulate = accumulate != 0;
    return submit(d, s, &op);
}

int zn_dev_copy_2d(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, int64_t ldx, void *y,
                   zn_dtype y_dt, int64_t ldy, int64_t rows, int64_t cols)
{
    /* the dropout op with p = 0 keeps every element and scales by 1 */
    return zn_dev_dropout(d, s, x, x_dt, ldx, y, y_dt, ldy, rows, cols, 0.0, 0, 0);
}

int zn_dev_xent_fwd_chunk(zn_dev *d, zn_stream *s, const void *logits, zn_dtype dt,
                          int64_t rows, int64_t cols, int64_t ld, int64_t v0,
                          const int32_t *targets, float *run_max, float *run_sum, float *tgt,
                          int first)
{
    const char *fn = "xent_fwd_chunk";
    CHK_DT(fn, dt);
    CHK(rows >= 0 && cols > 0 && ld >= cols && v0 >= 0,
        "%s: bad sizes (rows %lld cols %lld ld %lld v0 %lld)", fn, (long long)rows,
        (long long)cols, (long long)ld, (long long)v0);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, logits, span(rows, cols, ld, dt));
    CHK_PTR(fn, targets, (uint64_t)rows * 4);
    CHK_PTR(fn, run_max, (uint64_t)rows * 4);
    CHK_PTR(fn, run_sum, (uint64_t)rows * 4);
    CHK_PTR(fn, tgt, (uint64_t)rows * 4);
    zn_op op = { .kind = ZN_OPK_XENT_FWD };
    op.u.xent.logits = logits;
    op.u.xent.dt = dt;
    op.u.xent.rows = rows;
    op.u.xent.cols = cols;
    op.u.xent.ld = ld;
    op.u.xent.v0 = v0;
    op.u.xent.targets = targets;
    op.u.xent.run_max = run_max;
    op.u.xent.run_sum = run_sum;
    op.u.xent.tgt = tgt;
    op.u.xent.first = first != 0;
    return submit(d, s, &op);
}

int zn_dev_xent_finish(zn_dev *d, zn_stream *s, const float *run_max, const float *run_sum,
                       const float *tgt, const int32_t *targets, int64_t rows, float *lse,
                       float *loss)
{
    const char *fn = "xent_finish";
    CHK(rows >= 0, "%s: rows = %lld", fn, (long long)rows);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, run_max, (uint64_t)rows * 4);
    CHK_PTR(fn, run_sum, (uint64_t)rows * 4);
    CHK_PTR(fn, tgt, (uint64_t)rows * 4);
    CHK_PTR(fn, targets, (uint64_t)rows * 4);
    CHK_PTR(fn, lse, (uint64_t)rows * 4);
    if (loss)
        CHK_PTR(fn, loss, (uint64_t)rows * 4);
    zn_op op = { .kind = ZN_OPK_XENT_FINISH };
    op.u.xent.cmax = run_max;
    op.u.xent.csum = run_sum;
    op.u.xent.ctgt = tgt;
    op.u.xent.targets = targets;
    op.u.xent.rows = rows;
    op.u.xent.lse_out = lse;
    op.u.xent.loss = loss;
    return submit(d, s, &op);
}

int zn_dev_xent_bwd_chunk(zn_dev *d, zn_stream *s, const void *logits, zn_dtype dt,
                          int64_t rows, int64_t cols, int64_t ld, int64_t v0,
                          const int32_t *targets, const float *lse, float grad_scale,
                          void *dlogits, zn_dtype dlogits_dt, int64_t ld_d)
{
    const char *fn = "xent_bwd_chunk";
    CHK_DT(fn, dt);
    CHK_DT(fn, dlogits_dt);
    CHK(rows >= 0 && cols > 0 && ld >= cols && ld_d >= cols && v0 >= 0,
        "%s: bad sizes (rows %lld cols %lld ld %lld ld_d %lld v0 %lld)", fn, (long long)rows,
        (long long)cols, (long long)ld, (long long)ld_d, (long long)v0);
    if (rows == 0)
        return 0;
    CHK(dlogits != logits || (dlogits_dt == dt && ld_d == ld),
        "%s: in place needs the same dtype and ld", fn);
    CHK_PTR(fn, logits, span(rows, cols, ld, dt));
    CHK_PTR(fn, dlogits, span(rows, cols, ld_d, dlogits_dt));
    CHK_PTR(fn, targets, (uint64_t)rows * 4);
    CHK_PTR(fn, lse, (uint64_t)rows * 4);
    zn_op op = { .kind = ZN_OPK_XENT_BWD };
    op.u.xent.logits = logits;
    op.u.xent.dt = dt;
    op.u.xent.rows = rows;
    op.u.xent.cols = cols;
    op.u.xent.ld = ld;
    op.u.xent.v0 = v0;
    op.u.xent.targets = targets;
    op.u.xent.lse = lse;
    op.u.xent.grad_scale = grad_scale;
    op.u.xent.dlogits = dlogits;
    op.u.xent.d_dt = dlogits_dt;
    op.u.xent.ld_d = ld_d;
    return submit(d, s, &op);
}

static int reduce(zn_dev *d, zn_stream *s, const void *x, zn_dtype dt, int64_t n, float *out,
                  int accumulate, int square)
{
    const char *fn = square ? "sumsq" : "sum";
    CHK_DT(fn, dt);
    CHK(n >= 0, "%s: n = %lld", fn, (long long)n);
    CHK_PTR(fn, out, 4);
    if (n > 0)
        CHK_PTR(fn, x, nbytes(n, dt));
    zn_op op = { .kind = ZN_OPK_REDUCE };
    op.u.reduce.x = x;
    op.u.reduce.dt = dt;
    op.u.reduce.n = n;
    op.u.reduce.out = out;
    op.u.reduce.accumulate = accumulate != 0;
    op.u.reduce.square = square;
    return submit(d, s, &op);
}

int zn_dev_sumsq(zn_dev *d, zn_stream *s, const void *x, zn_dtype dt, int64_t n, float *out,
                 int accumulate)
{
    return reduce(d, s, x, dt, n, out, accumulate, 1);
}

int zn_dev_sum(zn_dev *d, zn_stream *s, const void *x, zn_dtype dt, int64_t n, float *out,
               int accumulate)
{
    return reduce(d, s, x, dt, n, out, accumulate, 0);
}

/* ---- the optimizer -------------------------------------------------------------*/
int zn_dev_adam(zn_dev *d, zn_stream *s, const zn_adam_params *hp, float *p, float *m,
                float *v, const float *g, float g_scale, void *c, zn_dtype c_dt, int64_t n)
{
    CHK(n >= 0, "adam: n = %lld", (long long)n);
    CHK(!c || c_dt == ZN_DTYPE_BF16, "adam: the 16-bit copy must be bf16 on a device, not %s",
        zn_dtype_name(c_dt));
    zn_adam_consts k;
    /* the CPU step's checks and constants: one set for both backends */
    int rc = zn_adam_prepare(hp, p, m, v, g, ZN_DTYPE_F32, g_scale, c, c_dt, (size_t)n, &k);
    if (rc)
        return rc;
    if (n == 0)
        return 0;
    uint64_t b = nbytes(n, ZN_DTYPE_F32);
    CHK_PTR("adam", p, b);
    CHK_PTR("adam", m, b);
    CHK_PTR("adam", v, b);
    CHK_PTR("adam", g, b);
    if (c)
        CHK_PTR("adam", c, nbytes(n, c_dt));
    zn_op op = { .kind = ZN_OPK_ADAM };
    op.u.adam.p = p;
    op.u.adam.m = m;
    op.u.adam.v = v;
    op.u.adam.g = g;
    op.u.adam.c = c;
    op.u.adam.c_dt = c_dt;
    op.u.adam.n = n;
    op.u.adam.hp = *hp;
    op.u.adam.g_scale = g_scale;
    op.u.adam.b1 = k.b1;
    op.u.adam.omb1 = k.omb1;
    op.u.adam.b2 = k.b2;
    op.u.adam.omb2 = k.omb2;
    op.u.adam.step = k.step_size;
    op.u.adam.eps = k.eps;
    op.u.adam.l2 = k.l2;
    op.u.adam.decay = k.decay;
    op.u.adam.use_l2 = k.use_l2;
    op.u.adam.use_decay = k.use_decay;
    return submit(d, s, &op);
}

int zn_dev_norm_sq_chunks(zn_dev *d, zn_stream *s, const float *x, int64_t n, double *out)
{
    CHK(n >= 0, "norm_sq_chunks: n = %lld", (long long)n);
    if (n == 0)
        return 0;
    int64_t nc = (n + (int64_t)ZN_GRAD_NORM_CHUNK - 1) / (int64_t)ZN_GRAD_NORM_CHUNK;
    CHK_PTR("norm_sq_chunks", x, nbytes(n, ZN_DTYPE_F32));
    CHK_PTR("norm_sq_chunks", out, (uint64_t)nc * 8);
    zn_op op = { .kind = ZN_OPK_NORM_CHUNKS };
    op.u.normc.x = x;
    op.u.normc.n = n;
    op.u.normc.out = out;
    return submit(d, s, &op);
}

/* ---- PCI helpers (sysfs) ----------------------------------------------------*/
static int read_sysfs(const char *bus_id, const char *file, char *buf, size_t len)
{
    char path[256], id[64];
    size_t i;
    for (i = 0; bus_id[i] && i + 1 < sizeof id; i++)
        id[i] = (char)((bus_id[i] >= 'A' && bus_id[i] <= 'F') ? bus_id[i] + 32 : bus_id[i]);
    id[i] = '\0';
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/%s", id, file);
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    if (!fgets(buf, (int)len, f)) {
        fclose(f);
        return -EIO;
    }
    fclose(f);
    return 0;
}

int zn_gpu_pcie_link(const char *bus_id, int *gen, int *width, double *peak_gbs)
{
    char sp[64], wd[64];
    int rc;
    *gen = *width = 0;
    *peak_gbs = 0;
    if ((rc = read_sysfs(bus_id, "current_link_speed", sp, sizeof sp)) ||
        (rc = read_sysfs(bus_id, "current_link_width", wd, sizeof wd)))
        return rc;
    double gts = strtod(sp, NULL);
    int w = atoi(wd);
    if (gts <= 0 || w <= 0)
        return -EINVAL;
    /* Per-lane rates of PCIe generations 1..6 (GT/s) and their encodings:
     * 8b/10b up to gen 2, 128b/130b for gens 3-5 (PCI-SIG base specs). Gen 6
     * (FLIT, PAM4) is counted at 242/256. */
    static const double rate[] = { 2.5, 5.0, 8.0, 16.0, 32.0, 64.0 };
    int g = 0;
    for (int i = 0; i < 6; i++)
        if (gts > rate[i] * 0.9)
            g = i + 1;
    double enc = g <= 2 ? 0.8 : g <= 5 ? 128.0 / 130.0 : 242.0 / 256.0;
    *gen = g;
    *width = w;
    *peak_gbs = gts * w * enc / 8.0;
    return 0;
}

int zn_gpu_pci_numa_node(const char *bus_id)
{
    char buf[32];
    if (read_sysfs(bus_id, "numa_node", buf, sizeof buf))
        return -1;
    int n = atoi(buf);
    return n >= 0 ? n : -1;
}
