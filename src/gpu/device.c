/* The device interface's common half: creation by name, the backend's
 * info, streams and events, the PCIe link from sysfs. device_mem.c holds
 * the arena, pinned and NUMA-bound memory; device_ops.c and device_nn.c the
 * op descriptors handed to a backend through its vtable (host.c, cuda.c),
 * each after the same argument checks (gpu-impl.h). */
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

/* "auto" says once a process which backend it took: a run opens "auto"
 * for several purposes (the trainer, the cost model's calibration behind
 * the step-time prediction), each time with the same answer. Any thread
 * may be the first. */
static int auto_told;

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
            if (!__atomic_exchange_n(&auto_told, 1, __ATOMIC_ACQ_REL))
                zn_info("device auto: no usable GPU (%s); using the host backend",
                        zn_last_error());
            rc = start_backend(d, ZN_DEV_HOST, 0);
        }
#else
        if (!__atomic_exchange_n(&auto_told, 1, __ATOMIC_ACQ_REL))
            zn_info("device auto: zinc built without CUDA; using the host backend");
        rc = start_backend(d, ZN_DEV_HOST, 0);
#endif
    } else {
        rc = start_backend(d, kind, ordinal);
    }
    if (rc)
        goto fail;

    if ((rc = zn_dev_stream_create(d, "default", &d->default_stream)))
        goto fail;
    if (!d->cfg.defer_arena && (rc = zn_dev_arena_reserve(d, d->cfg.gpu_budget)))
        goto fail;
    *out = d;
    return 0;

fail:
    zn_dev_destroy(d);
    return rc;
}

int zn_dev_arena_reserve(zn_dev *d, uint64_t bytes)
{
    if (d->arena_base)
        return zn_set_error(ZN_EARG, "device %s: the arena is reserved already", d->info.name);
    int rc = d->ops->arena_reserve(d, bytes);
    if (rc)
        return rc;
    pthread_mutex_lock(&d->lock);
    rc = zn_arena_init(&d->arena, d->arena_base, d->arena_bytes);
    pthread_mutex_unlock(&d->lock);
    if (rc) {
        rc = zn_set_error(rc, "device: arena of %llu bytes: %s",
                          (unsigned long long)d->arena_bytes, zn_strerror(rc));
        d->ops->arena_release(d, d->arena_base, d->arena_bytes);
        d->arena_base = NULL;
        d->arena_bytes = 0;
        return rc;
    }
    char b1[32], b2[32], b3[32];
    zn_debug("device %s: %s, arena %s, %s outside it, pinned cap %s, NUMA node %d",
             d->ops->name, d->info.name, zn_format_size(d->arena.size, b1, sizeof b1),
             zn_format_size(d->outside_arena, b3, sizeof b3),
             d->cfg.cpu_budget ? zn_format_size(d->cfg.cpu_budget, b2, sizeof b2) : "none",
             d->info.numa_node);
    return 0;
}

uint64_t zn_dev_outside_arena(const zn_dev *d)
{
    return d ? d->outside_arena : 0;
}

uint64_t zn_dev_stream_outside_bytes(int cc_major, int copy_only)
{
    uint64_t scratch = (uint64_t)ZN_CUDA_SCRATCH * sizeof(float);
    if (copy_only)
        return scratch;
    return (uint64_t)ZN_CUBLAS_HANDLE_BYTES(cc_major) + (uint64_t)ZN_CUBLAS_WORKSPACE(cc_major) +
           scratch;
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
        if (d->arena_base)
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

/* ---- streams and events ------------------------------------------------*/
static int stream_create(zn_dev *d, const char *name, int copy_only, zn_stream **out)
{
    *out = NULL;
    zn_stream *s = calloc(1, sizeof *s);
    if (!s)
        return zn_set_error(-ENOMEM, "stream create: out of memory");
    s->dev = d;
    s->copy_only = copy_only;
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

int zn_dev_stream_create(zn_dev *d, const char *name, zn_stream **out)
{
    return stream_create(d, name, 0, out);
}

int zn_dev_stream_create_copy(zn_dev *d, const char *name, zn_stream **out)
{
    return stream_create(d, name, 1, out);
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

/* A wait inside a host function stalls every stream (see
 * zn_dev_launch_host_fn): refused, naming the wait. */
static int no_wait_in_host_fn(const char *what)
{
    return zn_tls_in_host_fn ? zn_set_error(ZN_EINTERNAL, "%s inside a device host function: "
                                            "host functions may only signal", what) : 0;
}

int zn_dev_stream_sync(zn_dev *d, zn_stream *s)
{
    int hr = no_wait_in_host_fn("stream sync");
    if (hr)
        return hr;
    s = pick(d, s);
    int rc = d->ops->stream_sync(d, s);
    return rc ? zn_error_prefix(rc, "stream '%s'", s->name) : 0;
}

int zn_dev_sync(zn_dev *d)
{
    int hr = no_wait_in_host_fn("device sync");
    if (hr)
        return hr;
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

const char *zn_dev_kernel_archs(void)
{
    return ZN_GPU_ARCH;
}

int zn_dev_arch_covered(int major, int minor)
{
    const char *s = ZN_GPU_ARCH;
    int want = major * 10 + minor, best = 0;
    while (*s) {
        int ma = 0, mi = 0, n = 0;
        if (sscanf(s, "%d.%d%n", &ma, &mi, &n) != 2)
            break;
        s += n;
        int ptx = !strncmp(s, "+PTX", 4);
        if (ptx)
            s += 4;
        int a = ma * 10 + mi;
        if (a == want)
            return 2;
        /* PTX runs on the same or a later major architecture family */
        if (ptx && a < want)
            best = 1;
        while (*s == ' ' || *s == ',' || *s == ';')
            s++;
    }
    return best;
}

__thread int zn_tls_in_host_fn;

int zn_dev_in_host_fn(void)
{
    return zn_tls_in_host_fn;
}

int zn_dev_stream_wait_value(zn_dev *d, zn_stream *s, const uint32_t *flag, uint32_t value)
{
    if (!flag || ((uintptr_t)flag & 3))
        return zn_set_error(ZN_EARG, "stream_wait_value: flag %p is NULL or not 4-byte aligned",
                            (const void *)flag);
    zn_op op = { .kind = ZN_OPK_WAIT_VALUE };
    op.u.wait.flag = flag;
    op.u.wait.value = value;
    return d->ops->submit(d, pick(d, s), &op);
}

int zn_dev_host_stream_fn(zn_dev *d, zn_stream *s, void (*fn)(void *arg), void *arg)
{
    if (!fn)
        return zn_set_error(ZN_EARG, "host_stream_fn: NULL function");
    if (zn_dev_get_kind(d) != ZN_DEV_HOST)
        return zn_set_error(ZN_EUNSUPPORTED, "host_stream_fn: only the host backend runs host "
                            "code as a device op");
    zn_op op = { .kind = ZN_OPK_STREAM_FN };
    op.u.host_fn.fn = fn;
    op.u.host_fn.arg = arg;
    return d->ops->submit(d, pick(d, s), &op);
}

static int event_create(zn_dev *d, zn_event **out, int timed)
{
    *out = NULL;
    zn_event *e = calloc(1, sizeof *e);
    if (!e)
        return zn_set_error(-ENOMEM, "event create: out of memory");
    e->dev = d;
    e->timed = timed;
    int rc = d->ops->event_create(d, e);
    if (rc) {
        free(e);
        return rc;
    }
    *out = e;
    return 0;
}

int zn_dev_event_create(zn_dev *d, zn_event **out)
{
    return event_create(d, out, 0);
}

int zn_dev_event_create_timed(zn_dev *d, zn_event **out)
{
    return event_create(d, out, 1);
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
    int hr = no_wait_in_host_fn("event sync");
    if (hr)
        return hr;
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
    if (!a->timed || !b->timed)
        return zn_set_error(ZN_EARG, "event elapsed: an event made without timing "
                            "(zn_dev_event_create_timed makes one that records it)");
    return d->ops->event_elapsed_ms(d, a, b, ms);
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
