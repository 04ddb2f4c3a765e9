/* zinc bench pcie's measuring half: host<->device copy bandwidth through the
 * device layer (zn_dev_copy_h2d / _d2h on zinc streams), pinned and
 * pageable, each direction alone and both at once, over a range of sizes.
 * Each figure sits beside a ceiling measured in the same run (CUDA: a plain
 * cudaMemcpyAsync loop on 256 MiB pinned blocks; host backend: a plain
 * memcpy loop) and the PCIe link's theoretical peak (sysfs
 * current_link_speed/width). Every copy is verified: #wrong counts 8-byte
 * words that did not arrive intact. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/bench.h"
#include "zinc/device.h"
#include "gpu/gpu-impl.h"
#include "util/hash-impl.h"
#include "zn_build_config.h"

/* the data: a function of (seed, word index) */
static uint64_t pattern(uint64_t seed, uint64_t i)
{
    return zn_mix64(seed * ZN_GOLDEN64 + i);
}

static void fill(void *p, size_t bytes, uint64_t seed)
{
    uint64_t *w = p;
    for (size_t i = 0; i < bytes / 8; i++)
        w[i] = pattern(seed, i);
}

static uint64_t count_wrong(const void *p, size_t bytes, uint64_t seed)
{
    const uint64_t *w = p;
    uint64_t bad = 0;
    for (size_t i = 0; i < bytes / 8; i++)
        bad += w[i] != pattern(seed, i);
    return bad;
}

struct zn_bench_pcie {
    zn_bench_pcie_config cfg;   /* lo, hi and min_bytes resolved */
    zn_bench_pcie_info info;
    zn_dev *d;
    zn_stream *s[2];
    zn_event *ev[4];
    void *dev[2];          /* device buffers, one per direction */
    void *pin[2];          /* pinned host buffers */
    void *page[2];         /* pageable host buffers */
    void *check;           /* pageable scratch for verification */
};

zn_bench_pcie_config zn_bench_pcie_config_default(void)
{
    return (zn_bench_pcie_config){ .device = "auto", .lo = 64u << 10, .hi = 0, .min_bytes = 0 };
}

/* Times `iters` copies of `bytes` in one direction (dir 0 = H2D, 1 = D2H)
 * or both at once (dir 2), each direction on its own stream. */
static int timed(zn_bench_pcie *c, int dir, int pinned, size_t bytes, int iters, double *secs)
{
    int rc;
    void *h[2] = { pinned ? c->pin[0] : c->page[0], pinned ? c->pin[1] : c->page[1] };
    if ((rc = zn_dev_sync(c->d)))
        return rc;
    /* both streams start from one event so "both at once" starts together */
    if ((rc = zn_dev_event_record(c->d, c->ev[0], c->s[0])) ||
        (rc = zn_dev_stream_wait_event(c->d, c->s[1], c->ev[0])))
        return rc;
    for (int i = 0; i < iters; i++) {
        if (dir == 0 || dir == 2)
            if ((rc = zn_dev_copy_h2d(c->d, c->s[0], c->dev[0], h[0], bytes)))
                return rc;
        if (dir == 1 || dir == 2)
            if ((rc = zn_dev_copy_d2h(c->d, c->s[1], h[1], c->dev[1], bytes)))
                return rc;
    }
    if ((rc = zn_dev_event_record(c->d, c->ev[1], c->s[0])) ||
        (rc = zn_dev_event_record(c->d, c->ev[2], c->s[1])) ||
        (rc = zn_dev_event_sync(c->d, c->ev[1])) || (rc = zn_dev_event_sync(c->d, c->ev[2])))
        return rc;
    float m0 = 0, m1 = 0;
    if ((rc = zn_dev_event_elapsed_ms(c->d, c->ev[0], c->ev[1], &m0)) ||
        (rc = zn_dev_event_elapsed_ms(c->d, c->ev[0], c->ev[2], &m1)))
        return rc;
    float ms = dir == 0 ? m0 : dir == 1 ? m1 : (m0 > m1 ? m0 : m1);
    *secs = ms * 1e-3;
    return zn_dev_sync(c->d);
}

/* Checks what the last timed copies delivered: H2D data (seed 1) must be in
 * dev[0]; D2H data (seed 2, from dev[1]) must be in the host buffer. */
static int verify(zn_bench_pcie *c, int dir, int pinned, size_t bytes, uint64_t *wrong)
{
    int rc;
    *wrong = 0;
    if (dir == 0 || dir == 2) {
        memset(c->check, 0, bytes);
        if ((rc = zn_dev_copy_d2h(c->d, c->s[0], c->check, c->dev[0], bytes)) ||
            (rc = zn_dev_stream_sync(c->d, c->s[0])))
            return rc;
        *wrong += count_wrong(c->check, bytes, 1);
    }
    if (dir == 1 || dir == 2)
        *wrong += count_wrong(pinned ? c->pin[1] : c->page[1], bytes, 2);
    return 0;
}

static double plain_memcpy_gbs(size_t block, int iters)
{
    char *a = malloc(block), *b = malloc(block);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, block);
    memset(b, 2, block);   /* first touch outside the timing */
    double t0 = zn_now_s();
    for (int i = 0; i < iters; i++)
        memcpy(i % 2 ? a : b, i % 2 ? b : a, block);
    double t = zn_now_s() - t0;
    free(a);
    free(b);
    return t > 0 ? (double)block * iters / t / 1e9 : 0;
}

/* The device, sized for the largest copy (a probe first: a host device
 * needs no more than its buffers, and the default sizes depend on it). */
static int open_device(zn_bench_pcie *c)
{
    zn_dev_config cfg = zn_dev_config_default();
    cfg.name = c->cfg.device;
    zn_dev *probe = NULL;
    cfg.gpu_budget = 64u << 20;
    int rc = zn_dev_create(&probe, &cfg);
    if (rc)
        return rc;
    int is_cuda = zn_dev_get_kind(probe) == ZN_DEV_CUDA;
    zn_dev_destroy(probe);
    if (!c->cfg.hi)
        c->cfg.hi = is_cuda ? 1u << 30 : 64u << 20;
    if (c->cfg.min_bytes <= 0)
        c->cfg.min_bytes = is_cuda ? 1e9 * 1.073741824 : 256.0 * 1048576;
    cfg.gpu_budget = 2 * c->cfg.hi + (16u << 20);
    cfg.name = is_cuda ? c->cfg.device : "host";
    c->info.is_cuda = is_cuda;
    return zn_dev_create(&c->d, &cfg);
}

/* Streams, events and buffers, filled and first-touched. */
static int setup(zn_bench_pcie *c)
{
    const size_t maxb = (size_t)c->cfg.hi;
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++)
        rc = zn_dev_stream_create_copy(c->d, i ? "d2h" : "h2d", &c->s[i]);
    for (int i = 0; i < 4 && !rc; i++)
        rc = zn_dev_event_create_timed(c->d, &c->ev[i]);
    for (int i = 0; i < 2 && !rc; i++) {
        rc = zn_dev_alloc(c->d, maxb, i ? "d2h source" : "h2d target", &c->dev[i]);
        if (!rc)
            rc = zn_dev_host_alloc(c->d, maxb, "pinned", &c->pin[i]);
        if (!rc && !(c->page[i] = malloc(maxb)))
            rc = zn_set_error(-ENOMEM, "pageable buffer of %zu bytes", maxb);
    }
    if (!rc && !(c->check = malloc(maxb)))
        rc = zn_set_error(-ENOMEM, "check buffer of %zu bytes", maxb);
    if (rc)
        return rc;
    fill(c->pin[0], maxb, 1);
    fill(c->page[0], maxb, 1);
    /* the D2H source holds seed-2 data */
    fill(c->check, maxb, 2);
    /* touch every page of the target too (the host arena commits on first
     * touch), so no timed copy pays for page faults */
    if ((rc = zn_dev_memset(c->d, c->s[0], c->dev[0], 0, maxb)) ||
        (rc = zn_dev_copy_h2d(c->d, c->s[1], c->dev[1], c->check, maxb)) ||
        (rc = zn_dev_stream_sync(c->d, c->s[0])) || (rc = zn_dev_stream_sync(c->d, c->s[1])))
        return rc;
    memset(c->pin[1], 0, maxb);
    memset(c->page[1], 0, maxb);
    return 0;
}

/* Ceilings, measured in this run. */
static int ceilings(zn_bench_pcie *c)
{
    const size_t ceil_block = 256u << 20;
    zn_bench_pcie_info *in = &c->info;
#if ZN_HAVE_CUDA
    if (in->is_cuda) {
        int it = (int)(c->cfg.min_bytes / (double)ceil_block) + 1;
        int rc;
        if ((rc = zn_cuda_plain_copy_gbs(c->d, 0, ceil_block, it, &in->ceil_h2d)) ||
            (rc = zn_cuda_plain_copy_gbs(c->d, 1, ceil_block, it, &in->ceil_d2h)))
            return rc;
        in->ceiling = "plain cudaMemcpyAsync loop, 256 MiB pinned blocks, one stream";
        return 0;
    }
#endif
    in->ceil_h2d = in->ceil_d2h = plain_memcpy_gbs(ceil_block / 4, 8);
    in->ceiling = "plain memcpy loop, 64 MiB blocks, one thread";
    return 0;
}

int zn_bench_pcie_create(zn_bench_pcie **out, const zn_bench_pcie_config *cfg)
{
    *out = NULL;
    zn_bench_pcie *c = calloc(1, sizeof *c);
    if (!c)
        return zn_set_error(-ENOMEM, "out of memory");
    c->cfg = *cfg;
    int rc;
    if ((rc = open_device(c))) {
        zn_error_prefix(rc, "device");
        goto fail;
    }
    zn_dev_get_info(c->d, &c->info.dev);
    if ((rc = setup(c))) {
        zn_error_prefix(rc, "setup");
        goto fail;
    }
    if ((rc = ceilings(c))) {
        zn_error_prefix(rc, "plain cudaMemcpyAsync loop");
        goto fail;
    }
    zn_dev_mem mem;
    zn_dev_mem_stats(c->d, &mem);
    c->info.host_locked = mem.host_locked;
    c->info.lo = c->cfg.lo;
    c->info.hi = c->cfg.hi;
    *out = c;
    return 0;
fail:
    zn_bench_pcie_destroy(c);
    return rc;
}

void zn_bench_pcie_get_info(const zn_bench_pcie *b, zn_bench_pcie_info *out)
{
    *out = b->info;
}

/* One size, memory and direction: timed, verified, its figures. */
static int measure(zn_bench_pcie *c, size_t bytes, int pinned, int dir, zn_bench_pcie_row *r)
{
    static const char *dirs[] = { "h2d", "d2h", "both" };
    const zn_bench_pcie_info *in = &c->info;
    int iters = (int)(c->cfg.min_bytes / (double)bytes);
    if (iters < 3)
        iters = 3;
    if (iters > 2000)
        iters = 2000;
    double secs = 0;
    uint64_t wrong = 0;
    if (dir == 1 || dir == 2)
        memset(pinned ? c->pin[1] : c->page[1], 0, bytes);
    int rc;
    if ((rc = timed(c, dir, pinned, bytes, iters, &secs)) ||
        (rc = verify(c, dir, pinned, bytes, &wrong)))
        return rc;
    double moved = (double)bytes * iters * (dir == 2 ? 2 : 1);
    memset(r, 0, sizeof *r);
    r->bytes = bytes;
    r->pinned = pinned;
    r->dir = dirs[dir];
    r->iters = iters;
    r->gbs = secs > 0 ? moved / secs / 1e9 : 0;
    r->ceil_gbs = dir == 0 ? in->ceil_h2d : dir == 1 ? in->ceil_d2h : in->ceil_h2d + in->ceil_d2h;
    r->ratio = r->ceil_gbs > 0 ? r->gbs / r->ceil_gbs : 0;
    r->link_gbs = in->is_cuda ? in->dev.pcie_peak_gbs * (dir == 2 ? 2 : 1) : 0;
    r->link_pct = r->link_gbs > 0 ? 100 * r->gbs / r->link_gbs : -1;
    r->wrong = wrong;
    return 0;
}

int zn_bench_pcie_run(zn_bench_pcie *c, zn_bench_pcie_row_fn fn, void *ctx, uint64_t *total_wrong)
{
    *total_wrong = 0;
    for (uint64_t b = c->cfg.lo; b <= c->cfg.hi; b *= 4) {
        size_t bytes = (size_t)b & ~(size_t)7;
        for (int pinned = 1; pinned >= 0; pinned--)
            for (int dir = 0; dir < 3; dir++) {
                zn_bench_pcie_row r;
                int rc = measure(c, bytes, pinned, dir, &r);
                if (rc)
                    return rc;
                *total_wrong += r.wrong;
                if (fn && (rc = fn(ctx, &r)))
                    return rc;
            }
        if (b > UINT64_MAX / 4)
            break;
    }
    return 0;
}

void zn_bench_pcie_destroy(zn_bench_pcie *c)
{
    if (!c)
        return;
    for (int i = 0; i < 2 && c->d; i++) {
        zn_dev_free(c->d, c->dev[i]);
        zn_dev_host_free(c->d, c->pin[i]);
        free(c->page[i]);
    }
    free(c->check);
    for (int i = 0; i < 4 && c->d; i++)
        zn_dev_event_destroy(c->d, c->ev[i]);
    for (int i = 0; i < 2 && c->d; i++)
        zn_dev_stream_destroy(c->d, c->s[i]);
    zn_dev_destroy(c->d);
    free(c);
}
