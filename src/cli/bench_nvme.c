/* `zinc bench nvme`: zinc's I/O engine against fio on the same swap file,
 * block size and queue depth (io_uring, O_DIRECT), runs interleaved so that
 * the ratio is measured under the same conditions. Every zinc read is
 * checked against the seeded pattern that zinc wrote. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "cli/cli.h"
#include "zinc/topo.h"
#include "zinc/nvme.h"
#include "zinc/util.h"
#include "zn_build_config.h"

#define MAXL 16

typedef struct {
    const char *paths[ZN_SWAP_MAX_PATHS];
    int npaths;
    uint64_t size;
    uint64_t bs[MAXL];
    int nbs;
    int qd[MAXL];
    int nqd;
    int rw[2]; /* order of "write"(1) / "read"(0) */
    int nrw;
    int reps;
    int fio;
    int crc;
    int huge;
    const char *csv;
} opts_t;

typedef struct {
    double gbs, iops, p50_us, p99_us;
    int ok;
} result_t;

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The data is a function of (seed, offset): any block can be checked. */
static void fill(uint64_t *p, uint64_t n, uint64_t seed)
{
    for (uint64_t i = 0; i < n / 8; i++)
        p[i] = mix(seed ^ (i * 0xD6E8FEB86659FD93ull));
}

static uint64_t count_wrong(const uint64_t *p, uint64_t n, uint64_t seed)
{
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n / 8; i++) {
        uint64_t w = mix(seed ^ (i * 0xD6E8FEB86659FD93ull));
        if (p[i] != w) {
            const unsigned char *a = (const unsigned char *)&p[i], *b = (const unsigned char *)&w;
            for (int k = 0; k < 8; k++)
                bad += a[k] != b[k];
        }
    }
    return bad;
}

static int parse_list_u64(const char *s, uint64_t *out, int *n, const char *what)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n >= MAXL || zn_parse_size(t, &out[*n]) || !out[*n]) {
            fprintf(stderr, "zinc: error: --%s: bad value '%s'\n", what, t);
            return -1;
        }
        (*n)++;
    }
    return *n ? 0 : -1;
}

static int fio_version(char *buf, size_t len)
{
    FILE *p = popen("fio --version 2>/dev/null", "r");
    if (!p)
        return -1;
    int ok = fgets(buf, (int)len, p) != NULL;
    int rc = pclose(p);
    if (!ok || rc != 0)
        return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

/* One fio run on the swap files. */
static result_t run_fio(const opts_t *o, zn_swap *s, int is_write, uint64_t bs, int qd)
{
    result_t r = { 0 };
    char files[8192] = "";
    for (int i = 0; i < o->npaths; i++) {
        size_t l = strlen(files);
        snprintf(files + l, sizeof files - l, "%s%s", i ? ":" : "", zn_swap_file_path(s, i));
    }
    char out[] = "/tmp/zinc-fio-XXXXXX";
    int fd = mkstemp(out);
    if (fd < 0)
        return r;
    close(fd);
    char cmd[12288];
    snprintf(cmd, sizeof cmd,
             "fio --name=zinc-bench --filename='%s' --rw=%s --bs=%" PRIu64 " --iodepth=%d "
             "--ioengine=io_uring --direct=1 --fixedbufs=1 --registerfiles=1 --size=%" PRIu64
             " --numjobs=1 --allow_file_create=0 --output-format=json --output='%s' "
             ">/dev/null 2>&1",
             files, is_write ? "write" : "read", bs, qd, o->size, out);
    int rc = system(cmd);
    json_error_t jerr;
    json_t *root = rc == 0 ? json_load_file(out, 0, &jerr) : NULL;
    unlink(out);
    if (!root) {
        fprintf(stderr, "zinc: warning: fio failed (%s)\n", rc ? "exit status" : jerr.text);
        return r;
    }
    json_t *job = json_array_get(json_object_get(root, "jobs"), 0);
    json_t *sec = json_object_get(job, is_write ? "write" : "read");
    json_t *bw = json_object_get(sec, "bw_bytes");
    if (bw) {
        r.gbs = json_number_value(bw) / 1e9;
        r.iops = json_number_value(json_object_get(sec, "iops"));
        json_t *pct = json_object_get(json_object_get(sec, "clat_ns"), "percentile");
        r.p50_us = json_number_value(json_object_get(pct, "50.000000")) / 1e3;
        r.p99_us = json_number_value(json_object_get(pct, "99.000000")) / 1e3;
        r.ok = 1;
    }
    json_decref(root);
    return r;
}

static result_t run_zinc(zn_aio *a, const zn_extent *e, void *buf, uint64_t size, int is_write,
                         uint64_t bs)
{
    result_t r = { 0 };
    zn_aio_handle h;
    zn_aio_reset_stats(a);
    double t0 = zn_now_s();
    int rc = is_write ? zn_aio_submit_write(a, e, buf, size, &h)
                      : zn_aio_submit_read(a, e, buf, size, &h);
    if (rc == 0)
        rc = zn_aio_wait(a, h);
    double dt = zn_now_s() - t0;
    if (rc) {
        fprintf(stderr, "zinc: error: %s: %s\n", is_write ? "write" : "read", zn_last_error());
        return r;
    }
    zn_aio_stats st;
    zn_aio_get_stats(a, &st);
    r.gbs = (double)size / dt / 1e9;
    r.iops = (double)(size / bs) / dt;
    r.p50_us = st.lat_p50_us;
    r.p99_us = st.lat_p99_us;
    r.ok = 1;
    return r;
}

/* zn_aio_buffer_alloc, or plain 4 KiB pages to show what they cost. */
static void *alloc_buf(uint64_t size, int huge)
{
    if (huge)
        return zn_aio_buffer_alloc(size);
    void *p = NULL;
    if (posix_memalign(&p, 1u << 21, size))
        return NULL;
    if (madvise(p, size, MADV_NOHUGEPAGE) < 0)
        fprintf(stderr, "zinc: warning: madvise(MADV_NOHUGEPAGE): %s\n", strerror(errno));
    return p;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zinc bench nvme --path DIR [--paths DIR1,DIR2] [--size 1GiB] [--bs 1M]\n"
            "                       [--qd 16,32] [--rw write,read] [--reps 2] [--no-fio]\n"
            "                       [--no-crc] [--csv FILE]\n"
            "  --path/--paths  directories for the swap file(s); several = striping\n"
            "  --size          bytes moved per run (the swap file size)\n"
            "  --bs, --qd      lists: one row per block size x queue depth x direction\n"
            "  --reps          runs per row, zinc and fio interleaved; best of each shown\n"
            "  --no-fio        zinc only; --no-crc: engine without crc32c\n"
            "  --no-huge       zinc's buffer on 4 KiB pages (MADV_NOHUGEPAGE) instead of\n"
            "                  zn_aio_buffer_alloc's transparent huge pages\n"
            "  --csv           append one line per row to FILE (header when new)\n"
            "Writes run fio first, then zinc (so zinc's reads can verify zinc's data);\n"
            "reads alternate which goes first. GB = 1e9 bytes.\n");
}

static int parse(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->size = 1ull << 30;
    o->bs[0] = 1 << 20;
    o->nbs = 1;
    o->qd[0] = 16;
    o->qd[1] = 32;
    o->nqd = 2;
    o->rw[0] = 1;
    o->rw[1] = 0;
    o->nrw = 2;
    o->reps = 2;
    o->fio = 1;
    o->crc = 1;
    o->huge = 1;
    static char paths_buf[4096];
    static const struct option lo[] = {
        { "path", required_argument, 0, 'p' }, { "paths", required_argument, 0, 'P' },
        { "size", required_argument, 0, 's' }, { "bs", required_argument, 0, 'b' },
        { "qd", required_argument, 0, 'q' },   { "rw", required_argument, 0, 'r' },
        { "reps", required_argument, 0, 'n' }, { "no-fio", no_argument, 0, 'F' },
        { "no-crc", no_argument, 0, 'C' },     { "csv", required_argument, 0, 'o' },
        { "no-huge", no_argument, 0, 'H' },
        { "help", no_argument, 0, 'h' },       { 0, 0, 0, 0 },
    };
    optind = 1;
    int c;
    uint64_t tmp[MAXL];
    int n;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'p':
            o->paths[0] = optarg;
            o->npaths = 1;
            break;
        case 'P': {
            snprintf(paths_buf, sizeof paths_buf, "%s", optarg);
            o->npaths = 0;
            char *save = NULL;
            for (char *t = strtok_r(paths_buf, ",", &save); t && o->npaths < ZN_SWAP_MAX_PATHS;
                 t = strtok_r(NULL, ",", &save))
                o->paths[o->npaths++] = t;
            break;
        }
        case 's':
            if (zn_parse_size(optarg, &o->size) || o->size < (1 << 20)) {
                fprintf(stderr, "zinc: error: --size %s: need at least 1 MiB\n", optarg);
                return -1;
            }
            break;
        case 'b':
            if (parse_list_u64(optarg, o->bs, &o->nbs, "bs"))
                return -1;
            break;
        case 'q':
            if (parse_list_u64(optarg, tmp, &n, "qd"))
                return -1;
            for (int i = 0; i < n; i++)
                o->qd[i] = (int)tmp[i];
            o->nqd = n;
            break;
        case 'r': {
            char buf[64];
            snprintf(buf, sizeof buf, "%s", optarg);
            o->nrw = 0;
            char *save = NULL;
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o->nrw >= 2 || (strcmp(t, "read") && strcmp(t, "write"))) {
                    fprintf(stderr, "zinc: error: --rw: read and/or write, not '%s'\n", t);
                    return -1;
                }
                o->rw[o->nrw++] = !strcmp(t, "write");
            }
            break;
        }
        case 'n':
            o->reps = atoi(optarg);
            if (o->reps < 1 || o->reps > 100) {
                fprintf(stderr, "zinc: error: --reps %s\n", optarg);
                return -1;
            }
            break;
        case 'F':
            o->fio = 0;
            break;
        case 'C':
            o->crc = 0;
            break;
        case 'H':
            o->huge = 0;
            break;
        case 'o':
            o->csv = optarg;
            break;
        case 'h':
            usage(stdout);
            return 1;
        default:
            usage(stderr);
            return -1;
        }
    }
    if (!o->npaths) {
        fprintf(stderr, "zinc: error: --path DIR is required\n");
        usage(stderr);
        return -1;
    }
    /* Writes first, so that reads see data zinc wrote. */
    if (o->nrw == 2 && o->rw[0] == 0) {
        o->rw[0] = 1;
        o->rw[1] = 0;
    }
    return 0;
}

static void best(result_t *b, result_t r)
{
    if (r.ok && (!b->ok || r.gbs > b->gbs))
        *b = r;
}

int zn_bench_nvme(int argc, char **argv)
{
    opts_t o;
    int prc = parse(argc, argv, &o);
    if (prc)
        return prc > 0 ? 0 : 2;
    char model[256], fiov[64] = "";
    zn_cpu_model(model, sizeof model);
    int have_fio = o.fio && fio_version(fiov, sizeof fiov) == 0;
    struct utsname un;
    uname(&un);
    zn_nvme_probe_info pi;
    if (zn_nvme_probe(o.paths[0], &pi))
        return zn_cli_fail(ZN_EARG, "probing --path");

    /* what killed runs left there goes first, as in zinc train */
    for (int i = 0; i < o.npaths; i++) {
        uint64_t stale_bytes;
        int stale;
        if (zn_swap_clean_stale(o.paths[i], "zinc-bench", &stale_bytes, &stale))
            zn_warn("swap: looking for dead runs' files in %s: %s", o.paths[i], zn_last_error());
    }

    printf("# zinc bench nvme: zinc's engine vs fio, same file, block size and queue depth\n");
    printf("# machine: %s, %ld CPUs online; kernel %s; zinc %s; %s\n", model,
           sysconf(_SC_NPROCESSORS_ONLN), un.release, ZN_VERSION,
           have_fio ? fiov : o.fio ? "fio not found" : "fio skipped (--no-fio)");
    for (int i = 0; i < o.npaths; i++)
        printf("# path %d: %s\n", i, o.paths[i]);
    printf("# storage: %s on %s%s%s%s (rotational %d, block %u, %s); free %.1f GB\n", pi.fstype,
           pi.device[0] ? pi.device : "?", pi.partition[0] ? "/" : "", pi.partition,
           pi.model[0] ? " " : "", pi.rotational, pi.logical_block, pi.backend_reason,
           (double)pi.free_bytes / 1e9);
    printf("# %.2f GB per run, %d rep(s) per row interleaved with fio, best shown; crc32c %s; "
           "zinc buffer on %s; latency = per block, submit to completion (fio: clat)\n",
           (double)o.size / 1e9, o.reps, o.crc ? "on" : "off",
           o.huge ? "transparent huge pages" : "4 KiB pages");
    printf("# fio: ioengine=io_uring direct=1 fixedbufs registerfiles numjobs=1; #wrong: bytes "
           "that differ from the seeded pattern in zinc's reads (write rows: the read after)\n");

    FILE *csv = NULL;
    if (o.csv && !(csv = zn_bench_csv_open(o.csv, "cpu,kernel,fs,device,paths,size,rw,bs,qd,"
                                           "crc,huge,zinc_gbs,zinc_iops,zinc_p50_us,"
                                           "zinc_p99_us,fio_gbs,fio_p50_us,fio_p99_us,ratio,"
                                           "wrong")))
        return zn_cli_fail(-errno, NULL);
    int failed = 0;
    uint64_t total_wrong = 0;
    for (int bi = 0; bi < o.nbs; bi++)
        for (int qi = 0; qi < o.nqd; qi++) {
            uint64_t bs = o.bs[bi];
            int qd = o.qd[qi];
            zn_aio_config c = zn_aio_config_default();
            c.block_size = bs;
            c.queue_depth = qd;
            c.crc = o.crc;
            c.collect_latency = 1;
            zn_aio *a = NULL;
            zn_swap *s = NULL;
            void *buf = NULL;
            int rc = zn_aio_create(&a, &c);
            if (rc) {
                zn_cli_fail(rc, "creating the engine");
                failed = 1;
                goto next;
            }
            zn_swap_config sc = zn_swap_config_default();
            sc.npaths = o.npaths;
            for (int i = 0; i < o.npaths; i++)
                sc.paths[i] = o.paths[i];
            sc.bytes = o.size;
            sc.file_prefix = "zinc-bench";
            sc.run_dir = 1;  /* a killed bench's files: removed by the next zinc run */
            if ((rc = zn_swap_create(&s, a, &sc))) {
                zn_cli_fail(rc, "creating the swap file");
                failed = 1;
                goto next;
            }
            zn_extent e;
            if ((rc = zn_swap_alloc(s, o.size, "bench", &e)) ||
                (rc = (buf = alloc_buf(o.size, o.huge)) ? 0 : -ENOMEM)) {
                zn_cli_fail(rc, "allocating");
                failed = 1;
                goto next;
            }
            if (bi == 0 && qi == 0)
                printf("# engine: %s\n#\n# %-5s %7s %4s %9s %9s %9s %9s | %9s %9s | %7s %7s\n",
                       zn_aio_backend_desc(a), "rw", "bs", "qd", "GB/s", "IOPS", "p50 us",
                       "p99 us", "fio GB/s", "fio p99", "zn/fio", "#wrong");
            if (zn_aio_register_buffer(a, buf, o.size) < 0)
                fprintf(stderr, "zinc: warning: %s\n", zn_last_error());
            uint64_t seed = 0x5EEDull + bs * 131 + (uint64_t)qd;
            fill(buf, o.size, seed);
            /* Prefill (untimed): both tools then find written extents. */
            result_t pre = run_zinc(a, &e, buf, o.size, 1, bs);
            if (!pre.ok) {
                failed = 1;
                goto next;
            }
            result_t zb[2] = { { 0 } }, fb[2] = { { 0 } };
            uint64_t wrong[2] = { 0, 0 };
            int have_read = 0;
            for (int i = 0; i < o.nrw; i++)
                have_read |= o.rw[i] == 0;
            for (int r = 0; r < o.reps; r++)
                for (int i = 0; i < o.nrw; i++) {
                    int w = o.rw[i];
                    if (w) {
                        if (have_fio)
                            best(&fb[w], run_fio(&o, s, 1, bs, qd));
                        result_t z = run_zinc(a, &e, buf, o.size, 1, bs);
                        failed |= !z.ok;
                        best(&zb[w], z);
                        if (!have_read) {
                            /* Check what was written with an untimed read. */
                            memset(buf, 0xA5, o.size);
                            failed |= !run_zinc(a, &e, buf, o.size, 0, bs).ok;
                            wrong[w] += count_wrong(buf, o.size, seed);
                            fill(buf, o.size, seed);
                        }
                    } else {
                        memset(buf, 0xA5, o.size);
                        result_t z = { 0 };
                        if (r % 2 == 0 && have_fio)
                            best(&fb[w], run_fio(&o, s, 0, bs, qd));
                        z = run_zinc(a, &e, buf, o.size, 0, bs);
                        if (r % 2 == 1 && have_fio)
                            best(&fb[w], run_fio(&o, s, 0, bs, qd));
                        failed |= !z.ok;
                        best(&zb[w], z);
                        uint64_t bad = count_wrong(buf, o.size, seed);
                        wrong[0] += bad;
                        if (o.nrw == 2)
                            wrong[1] += bad;
                        if (bad)
                            fill(buf, o.size, seed);
                    }
                }
            for (int i = 0; i < o.nrw; i++) {
                int w = o.rw[i];
                double ratio = fb[w].ok && fb[w].gbs > 0 ? zb[w].gbs / fb[w].gbs : 0;
                char fg[16] = "-", fp[16] = "-", rt[16] = "-";
                if (fb[w].ok) {
                    snprintf(fg, sizeof fg, "%.3f", fb[w].gbs);
                    snprintf(fp, sizeof fp, "%.0f", fb[w].p99_us);
                    snprintf(rt, sizeof rt, "%.3f", ratio);
                }
                char bsz[32];
                zn_format_size(bs, bsz, sizeof bsz);
                printf("  %-5s %7s %4d %9.3f %9.0f %9.0f %9.0f | %9s %9s | %7s %7" PRIu64 "\n",
                       w ? "write" : "read", bsz, qd, zb[w].gbs, zb[w].iops, zb[w].p50_us,
                       zb[w].p99_us, fg, fp, rt, wrong[w]);
                total_wrong += wrong[w];
                if (csv) {
                    char paths[4096] = "";
                    for (int k = 0; k < o.npaths; k++) {
                        size_t l = strlen(paths);
                        snprintf(paths + l, sizeof paths - l, "%s%s", k ? ";" : "", o.paths[k]);
                    }
                    fprintf(csv, "\"%s\",%s,%s,%s,\"%s\",%" PRIu64 ",%s,%" PRIu64 ",%d,%d,%d,%.4f,%.0f,"
                            "%.1f,%.1f,%.4f,%.1f,%.1f,%.4f,%" PRIu64 "\n",
                            model, un.release, pi.fstype, pi.device[0] ? pi.device : "?", paths,
                            o.size, w ? "write" : "read", bs, qd, o.crc, o.huge, zb[w].gbs,
                            zb[w].iops,
                            zb[w].p50_us, zb[w].p99_us, fb[w].ok ? fb[w].gbs : 0,
                            fb[w].p50_us, fb[w].p99_us, ratio, wrong[w]);
                }
            }
            fflush(stdout);
        next:
            zn_swap_destroy(s);
            zn_aio_destroy(a);
            zn_aio_buffer_free(buf);
        }
    if (csv && fclose(csv) != 0) {
        fprintf(stderr, "zinc: error: writing %s: %s\n", o.csv, strerror(errno));
        failed = 1;
    }
    printf("# zn/fio: zinc GB/s / fio GB/s on the same file in the same run (target >= 0.95)\n");
    if (total_wrong) {
        fprintf(stderr, "zinc: error: %" PRIu64 " bytes read back wrong\n", total_wrong);
        return 1;
    }
    return failed;
}
