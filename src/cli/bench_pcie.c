/* `zinc bench pcie`: host<->device copy bandwidth through the device layer
 * (zn_dev_copy_h2d / _d2h on zinc streams): pinned and pageable, each
 * direction alone and both at once, over a range of sizes. Each figure sits
 * beside a ceiling measured in the same run (CUDA: a plain cudaMemcpyAsync
 * loop on 256 MiB pinned blocks; host backend: a plain memcpy loop) and the
 * PCIe link's theoretical peak (sysfs current_link_speed/width). Every copy
 * is verified: #wrong counts 8-byte words that did not arrive intact. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/topo.h"
#include "gpu/gpu-impl.h"
#include "cli/cli.h"
#include "zn_build_config.h"

typedef struct {
    const char *device;
    uint64_t lo, hi;
    int sizes_given;
    const char *csv;
    double min_bytes;      /* bytes moved per measurement at least */
} opts;

static uint64_t pattern(uint64_t seed, uint64_t i)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
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

typedef struct {
    zn_dev *d;
    zn_stream *s[2];
    zn_event *ev[4];
    void *dev[2];          /* device buffers, one per direction */
    void *pin[2];          /* pinned host buffers */
    void *page[2];         /* pageable host buffers */
    void *check;           /* pageable scratch for verification */
} ctx;

/* Times `iters` copies of `bytes` in one direction (dir 0 = H2D, 1 = D2H)
 * or both at once (dir 2), each direction on its own stream. */
static int timed(ctx *c, int dir, int pinned, size_t bytes, int iters, double *secs)
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
static int verify(ctx *c, int dir, int pinned, size_t bytes, uint64_t *wrong)
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

static void usage(FILE *f)
{
    fprintf(f, "usage: zinc bench pcie [--device auto|host|cuda[:N]] [--sizes LO..HI] "
               "[--csv FILE]\n"
               "  --sizes    range of copy sizes, x4 steps (default 64K..1G on CUDA, "
               "64K..64M on host)\n"
               "  --bytes    bytes moved per measurement at least (default 1G on CUDA, "
               "256M on host)\n"
               "  --csv      append one line per row to FILE (header when new)\n");
}

static int parse_range(const char *s, uint64_t *lo, uint64_t *hi)
{
    char buf[64];
    const char *dots = strstr(s, "..");
    if (!dots || (size_t)(dots - s) >= sizeof buf)
        return zn_set_error(ZN_EARG, "--sizes '%s': expected LO..HI, e.g. 64K..1G", s);
    memcpy(buf, s, (size_t)(dots - s));
    buf[dots - s] = '\0';
    int rc = zn_parse_size(buf, lo);
    if (!rc)
        rc = zn_parse_size(dots + 2, hi);
    if (rc)
        return zn_set_error(ZN_EARG, "--sizes '%s': %s", s, zn_last_error());
    if (*lo < 8 || *hi < *lo)
        return zn_set_error(ZN_EARG, "--sizes '%s': need 8 <= LO <= HI", s);
    return 0;
}

int zn_bench_pcie(int argc, char **argv)
{
    opts o = { "auto", 64u << 10, 1u << 30, 0, NULL, 0 };
    static const struct option lopts[] = {
        { "device", required_argument, 0, 'd' }, { "sizes", required_argument, 0, 's' },
        { "csv", required_argument, 0, 'o' },    { "bytes", required_argument, 0, 'b' },
        { "help", no_argument, 0, 'h' },         { 0, 0, 0, 0 },
    };
    int opt, rc;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "d:s:o:b:h", lopts, NULL)) != -1) {
        switch (opt) {
        case 'd': o.device = optarg; break;
        case 's':
            if ((rc = parse_range(optarg, &o.lo, &o.hi)))
                return zn_cli_fail(rc, "bench pcie");
            o.sizes_given = 1;
            break;
        case 'o': o.csv = optarg; break;
        case 'b': {
            uint64_t b;
            if ((rc = zn_parse_size(optarg, &b)))
                return zn_cli_fail(rc, "bench pcie --bytes");
            o.min_bytes = (double)b;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }

    /* The device first (a host device needs no more than its buffers). */
    zn_dev_config cfg = zn_dev_config_default();
    cfg.name = o.device;
    zn_dev *probe = NULL;
    cfg.gpu_budget = 64u << 20;
    if ((rc = zn_dev_create(&probe, &cfg)))
        return zn_cli_fail(rc, "bench pcie: device");
    int is_cuda = zn_dev_get_kind(probe) == ZN_DEV_CUDA;
    zn_dev_destroy(probe);
    if (!o.sizes_given && !is_cuda)
        o.hi = 64u << 20;
    if (o.min_bytes <= 0)
        o.min_bytes = is_cuda ? 1e9 * 1.073741824 : 256.0 * 1048576;
    const size_t maxb = (size_t)o.hi;
    const size_t ceil_block = 256u << 20;
    cfg.gpu_budget = 2 * (uint64_t)maxb + (16u << 20);
    cfg.name = is_cuda ? o.device : "host";

    ctx c;
    memset(&c, 0, sizeof c);
    if ((rc = zn_dev_create(&c.d, &cfg)))
        return zn_cli_fail(rc, "bench pcie: device");
    zn_dev_info in;
    zn_dev_get_info(c.d, &in);
    for (int i = 0; i < 2 && !rc; i++)
        rc = zn_dev_stream_create_copy(c.d, i ? "d2h" : "h2d", &c.s[i]);
    for (int i = 0; i < 4 && !rc; i++)
        rc = zn_dev_event_create_timed(c.d, &c.ev[i]);
    for (int i = 0; i < 2 && !rc; i++) {
        rc = zn_dev_alloc(c.d, maxb, i ? "d2h source" : "h2d target", &c.dev[i]);
        if (!rc)
            rc = zn_dev_host_alloc(c.d, maxb, "pinned", &c.pin[i]);
        if (!rc && !(c.page[i] = malloc(maxb)))
            rc = zn_set_error(-ENOMEM, "pageable buffer of %zu bytes", maxb);
    }
    if (!rc && !(c.check = malloc(maxb)))
        rc = zn_set_error(-ENOMEM, "check buffer of %zu bytes", maxb);
    if (rc) {
        zn_cli_fail(rc, "bench pcie: setup");
        goto out;
    }
    fill(c.pin[0], maxb, 1);
    fill(c.page[0], maxb, 1);
    /* the D2H source holds seed-2 data */
    fill(c.check, maxb, 2);
    /* touch every page of the target too (the host arena commits on first
     * touch), so no timed copy pays for page faults */
    if ((rc = zn_dev_memset(c.d, c.s[0], c.dev[0], 0, maxb)) ||
        (rc = zn_dev_copy_h2d(c.d, c.s[1], c.dev[1], c.check, maxb)) ||
        (rc = zn_dev_stream_sync(c.d, c.s[0])) ||
        (rc = zn_dev_stream_sync(c.d, c.s[1]))) {
        zn_cli_fail(rc, "bench pcie: setup");
        goto out;
    }
    memset(c.pin[1], 0, maxb);
    memset(c.page[1], 0, maxb);

    /* Ceilings, measured in this run. */
    double ceil_h2d = 0, ceil_d2h = 0;
    const char *ceil_what;
#if ZN_HAVE_CUDA
    if (is_cuda) {
        int it = (int)(o.min_bytes / (double)ceil_block) + 1;
        if ((rc = zn_cuda_plain_copy_gbs(c.d, 0, ceil_block, it, &ceil_h2d)) ||
            (rc = zn_cuda_plain_copy_gbs(c.d, 1, ceil_block, it, &ceil_d2h))) {
            zn_cli_fail(rc, "bench pcie: plain cudaMemcpyAsync loop");
            goto out;
        }
        ceil_what = "plain cudaMemcpyAsync loop, 256 MiB pinned blocks, one stream";
    } else
#endif
    {
        double g = plain_memcpy_gbs(ceil_block / 4, 8);
        ceil_h2d = ceil_d2h = g;
        ceil_what = "plain memcpy loop, 64 MiB blocks, one thread";
    }

    zn_topo t;
    memset(&t, 0, sizeof t);
    if (zn_topo_discover(&t))
        snprintf(t.cpu_model, sizeof t.cpu_model, "unknown CPU");
    zn_dev_mem mem;
    zn_dev_mem_stats(c.d, &mem);
    printf("# zinc bench pcie: host<->device copies through zn_dev_copy_h2d/_d2h, one zinc "
           "stream per direction, timed with zinc events\n");
    printf("# machine: %s, %d cores / %d threads, %.1f GiB RAM\n", t.cpu_model, t.cores, t.pus,
           (double)t.mem_total / 1073741824.0);
    if (is_cuda) {
        printf("# device: %s (cuda:%d, %s, cc %d.%d), %s; pinned memory on NUMA node %d\n",
               in.name, in.ordinal, in.pci_bus_id, in.cc_major, in.cc_minor, in.driver,
               in.numa_node);
        if (in.pcie_peak_gbs > 0)
            printf("# link: PCIe gen%d x%d, theoretical %.2f GB/s per direction "
                   "(sysfs current_link_speed/width)\n", in.pcie_gen, in.pcie_width,
                   in.pcie_peak_gbs);
        else
            printf("# link: PCIe generation/width unknown (sysfs unreadable)\n");
    } else {
        printf("# device: %s -- NO GPU: these are memcpy figures between host buffers and "
               "the host arena, done by the streams' worker threads; not PCIe\n", in.name);
        printf("# link: none (host memory bandwidth)\n");
    }
    printf("# pinned buffers: %s\n", mem.host_locked ? "page-locked" :
           "NOT page-locked (mlock refused): pageable");
    printf("# ceiling (same run): %s: H2D %.2f GB/s, D2H %.2f GB/s; 'both' is compared with "
           "their sum\n", ceil_what, ceil_h2d, ceil_d2h);
    printf("# GB/s = 1e9 bytes/s; #wrong = 8-byte words not delivered intact\n#\n");
    printf("# %10s %-9s %-5s %6s %9s %9s %7s %9s %7s %7s\n", "bytes", "memory", "dir", "iters",
           "GB/s", "ceil GB/s", "ratio", "link GB/s", "%link", "#wrong");

    FILE *csv = NULL;
    if (o.csv && !(csv = zn_bench_csv_open(o.csv, "device,link,bytes,memory,dir,iters,gbs,"
                                           "ceiling_gbs,ratio,link_peak_gbs,wrong"))) {
        rc = -errno;
        zn_cli_fail(rc, "bench pcie");
        goto out;
    }
    static const char *dirs[] = { "h2d", "d2h", "both" };
    uint64_t total_wrong = 0;
    for (uint64_t b = o.lo; b <= o.hi; b *= 4) {
        size_t bytes = (size_t)b & ~(size_t)7;
        int iters = (int)(o.min_bytes / (double)bytes);
        if (iters < 3)
            iters = 3;
        if (iters > 2000)
            iters = 2000;
        for (int pinned = 1; pinned >= 0; pinned--)
            for (int dir = 0; dir < 3; dir++) {
                double secs = 0;
                uint64_t wrong = 0;
                if (dir == 1 || dir == 2)
                    memset(pinned ? c.pin[1] : c.page[1], 0, bytes);
                if ((rc = timed(&c, dir, pinned, bytes, iters, &secs)) ||
                    (rc = verify(&c, dir, pinned, bytes, &wrong))) {
                    zn_cli_fail(rc, "bench pcie");
                    if (csv)
                        fclose(csv);
                    goto out;
                }
                total_wrong += wrong;
                double moved = (double)bytes * iters * (dir == 2 ? 2 : 1);
                double gbs = secs > 0 ? moved / secs / 1e9 : 0;
                double ceil = dir == 0 ? ceil_h2d : dir == 1 ? ceil_d2h : ceil_h2d + ceil_d2h;
                double link = is_cuda ? in.pcie_peak_gbs * (dir == 2 ? 2 : 1) : 0;
                char pct[16];
                if (link > 0)
                    snprintf(pct, sizeof pct, "%.1f", 100 * gbs / link);
                else
                    snprintf(pct, sizeof pct, "n/a");
                printf("  %10zu %-9s %-5s %6d %9.2f %9.2f %7.3f %9.2f %7s %7llu\n", bytes,
                       pinned ? "pinned" : "pageable", dirs[dir], iters, gbs, ceil,
                       ceil > 0 ? gbs / ceil : 0, link, pct, (unsigned long long)wrong);
                if (csv)
                    fprintf(csv, "\"%s\",%s,%zu,%s,%s,%d,%.3f,%.3f,%.4f,%.3f,%llu\n", in.name,
                            is_cuda ? "pcie" : "host-memcpy", bytes,
                            pinned ? "pinned" : "pageable", dirs[dir], iters, gbs, ceil,
                            ceil > 0 ? gbs / ceil : 0, link, (unsigned long long)wrong);
                fflush(stdout);
            }
        if (b > UINT64_MAX / 4)
            break;
    }
    printf("# total #wrong: %llu\n", (unsigned long long)total_wrong);
    if (csv && fclose(csv) != 0) {
        rc = zn_set_error(-errno, "writing %s: %s", o.csv, strerror(errno));
        zn_cli_fail(rc, "bench pcie");
    }
    if (!rc && total_wrong)
        rc = ZN_ECORRUPT;

out:
    for (int i = 0; i < 2; i++) {
        zn_dev_free(c.d, c.dev[i]);
        zn_dev_host_free(c.d, c.pin[i]);
        free(c.page[i]);
    }
    free(c.check);
    for (int i = 0; i < 4; i++)
        zn_dev_event_destroy(c.d, c.ev[i]);
    for (int i = 0; i < 2; i++)
        zn_dev_stream_destroy(c.d, c.s[i]);
    zn_dev_destroy(c.d);
    return rc ? 1 : 0;
}
