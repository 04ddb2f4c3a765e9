/* `zinc bench pcie`: the flags and the table of host<->device copy
 * bandwidth, pinned and pageable, each direction alone and both at once,
 * beside the plain copy loop's ceiling of the same run and the PCIe link's
 * peak; the copies, their verification and the figures are
 * src/bench/pcie.c's. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/bench.h"
#include "zinc/device.h"
#include "zinc/topo.h"
#include "cli/cli.h"

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

typedef struct {
    const zn_bench_pcie_info *in;
    FILE *csv;
} printer;

static int print_row(void *ctx, const zn_bench_pcie_row *r)
{
    const printer *p = ctx;
    char pct[16];
    if (r->link_pct >= 0)
        snprintf(pct, sizeof pct, "%.1f", r->link_pct);
    else
        snprintf(pct, sizeof pct, "n/a");
    printf("  %10zu %-9s %-5s %6d %9.2f %9.2f %7.3f %9.2f %7s %7llu\n", r->bytes,
           r->pinned ? "pinned" : "pageable", r->dir, r->iters, r->gbs, r->ceil_gbs, r->ratio,
           r->link_gbs, pct, (unsigned long long)r->wrong);
    if (p->csv)
        fprintf(p->csv, "\"%s\",%s,%zu,%s,%s,%d,%.3f,%.3f,%.4f,%.3f,%llu\n", p->in->dev.name,
                p->in->is_cuda ? "pcie" : "host-memcpy", r->bytes,
                r->pinned ? "pinned" : "pageable", r->dir, r->iters, r->gbs, r->ceil_gbs,
                r->ratio, r->link_gbs, (unsigned long long)r->wrong);
    fflush(stdout);
    return 0;
}

static void print_header(const zn_bench_pcie_info *in)
{
    zn_topo t;
    memset(&t, 0, sizeof t);
    if (zn_topo_discover(&t))
        snprintf(t.cpu_model, sizeof t.cpu_model, "unknown CPU");
    printf("# zinc bench pcie: host<->device copies through zn_dev_copy_h2d/_d2h, one zinc "
           "stream per direction, timed with zinc events\n");
    printf("# machine: %s, %d cores / %d threads, %.1f GiB RAM\n", t.cpu_model, t.cores, t.pus,
           (double)t.mem_total / 1073741824.0);
    if (in->is_cuda) {
        printf("# device: %s (cuda:%d, %s, cc %d.%d), %s; pinned memory on NUMA node %d\n",
               in->dev.name, in->dev.ordinal, in->dev.pci_bus_id, in->dev.cc_major,
               in->dev.cc_minor, in->dev.driver, in->dev.numa_node);
        if (in->dev.pcie_peak_gbs > 0)
            printf("# link: PCIe gen%d x%d, theoretical %.2f GB/s per direction "
                   "(sysfs current_link_speed/width)\n", in->dev.pcie_gen, in->dev.pcie_width,
                   in->dev.pcie_peak_gbs);
        else
            printf("# link: PCIe generation/width unknown (sysfs unreadable)\n");
    } else {
        printf("# device: %s -- NO GPU: these are memcpy figures between host buffers and "
               "the host arena, done by the streams' worker threads; not PCIe\n", in->dev.name);
        printf("# link: none (host memory bandwidth)\n");
    }
    printf("# pinned buffers: %s\n", in->host_locked ? "page-locked" :
           "NOT page-locked (mlock refused): pageable");
    printf("# ceiling (same run): %s: H2D %.2f GB/s, D2H %.2f GB/s; 'both' is compared with "
           "their sum\n", in->ceiling, in->ceil_h2d, in->ceil_d2h);
    printf("# GB/s = 1e9 bytes/s; #wrong = 8-byte words not delivered intact\n#\n");
    printf("# %10s %-9s %-5s %6s %9s %9s %7s %9s %7s %7s\n", "bytes", "memory", "dir", "iters",
           "GB/s", "ceil GB/s", "ratio", "link GB/s", "%link", "#wrong");
}

int zn_cli_bench_pcie(int argc, char **argv)
{
    zn_bench_pcie_config o = zn_bench_pcie_config_default();
    const char *csv_path = NULL;
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
            break;
        case 'o': csv_path = optarg; break;
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

    zn_bench_pcie *b = NULL;
    if ((rc = zn_bench_pcie_create(&b, &o)))
        return zn_cli_fail(rc, "bench pcie");
    zn_bench_pcie_info in;
    zn_bench_pcie_get_info(b, &in);
    print_header(&in);

    printer p = { &in, NULL };
    if (csv_path && !(p.csv = zn_cli_bench_csv_open(csv_path, "device,link,bytes,memory,dir,"
                                                    "iters,gbs,ceiling_gbs,ratio,"
                                                    "link_peak_gbs,wrong"))) {
        rc = -errno;
        zn_cli_fail(rc, "bench pcie");
        goto out;
    }
    uint64_t total_wrong = 0;
    if ((rc = zn_bench_pcie_run(b, print_row, &p, &total_wrong))) {
        zn_cli_fail(rc, "bench pcie");
        if (p.csv)
            fclose(p.csv);
        goto out;
    }
    printf("# total #wrong: %llu\n", (unsigned long long)total_wrong);
    if (p.csv && fclose(p.csv) != 0) {
        rc = zn_set_error(-errno, "writing %s: %s", csv_path, strerror(errno));
        zn_cli_fail(rc, "bench pcie");
    }
    if (!rc && total_wrong)
        rc = ZN_ECORRUPT;
out:
    zn_bench_pcie_destroy(b);
    return rc ? 1 : 0;
}
