/* zinc bench nvme's measuring half: zinc's I/O engine against fio on the
 * same swap file, block size and queue depth (io_uring, O_DIRECT), runs
 * interleaved so that the ratio is measured under the same conditions.
 * Every zinc read is checked against the seeded pattern that zinc wrote. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "zinc/bench.h"
#include "zinc/nvme.h"
#include "zinc/topo.h"
#include "zinc/util.h"
#include "util/hash-impl.h"

typedef zn_bench_nvme_figures result_t;

/* The data is a function of (seed, offset): any block can be checked. */
static void fill(uint64_t *p, uint64_t n, uint64_t seed)
{
    for (uint64_t i = 0; i < n / 8; i++)
        p[i] = zn_splitmix64(seed ^ (i * 0xD6E8FEB86659FD93ull));
}

static uint64_t count_wrong(const uint64_t *p, uint64_t n, uint64_t seed)
{
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n / 8; i++) {
        uint64_t w = zn_splitmix64(seed ^ (i * 0xD6E8FEB86659FD93ull));
        if (p[i] != w) {
            const unsigned char *a = (const unsigned char *)&p[i], *b = (const unsigned char *)&w;
            for (int k = 0; k < 8; k++)
                bad += a[k] != b[k];
        }
    }
    return bad;
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

zn_bench_nvme_config zn_bench_nvme_config_default(void)
{
    return (zn_bench_nvme_config){ .size = 1ull << 30, .rw = { 1, 0 }, .nrw = 2, .reps = 2,
                                   .fio = 1, .crc = 1, .huge = 1 };
}

int zn_bench_nvme_prepare(const zn_bench_nvme_config *o, zn_bench_nvme_info *out)
{
    memset(out, 0, sizeof *out);
    zn_cpu_model(out->cpu, sizeof out->cpu);
    out->have_fio = o->fio && fio_version(out->fio_version, sizeof out->fio_version) == 0;
    struct utsname un;
    if (uname(&un) == 0)
        snprintf(out->kernel, sizeof out->kernel, "%s", un.release);
    if (zn_nvme_probe(o->paths[0], &out->probe))
        return zn_error_prefix(ZN_EARG, "probing --path");

    /* what killed runs left there goes first, as in zinc train */
    for (int i = 0; i < o->npaths; i++) {
        uint64_t stale_bytes;
        int stale;
        if (zn_swap_clean_stale(o->paths[i], "zinc-bench", &stale_bytes, &stale))
            zn_warn("swap: looking for dead runs' files in %s: %s", o->paths[i], zn_last_error());
    }
    return 0;
}

struct zn_bench_nvme_point {
    const zn_bench_nvme_config *o;
    uint64_t bs;
    int qd;
    zn_aio *a;
    zn_swap *s;
    zn_extent e;
    void *buf;
};

/* One fio run on the swap files. */
static result_t run_fio(const zn_bench_nvme_point *p, int is_write)
{
    const zn_bench_nvme_config *o = p->o;
    result_t r = { 0 };
    char files[8192] = "";
    for (int i = 0; i < o->npaths; i++) {
        size_t l = strlen(files);
        snprintf(files + l, sizeof files - l, "%s%s", i ? ":" : "", zn_swap_file_path(p->s, i));
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
             files, is_write ? "write" : "read", p->bs, p->qd, o->size, out);
    int rc = system(cmd);
    json_error_t jerr;
    json_t *root = rc == 0 ? json_load_file(out, 0, &jerr) : NULL;
    unlink(out);
    if (!root) {
        if (o->diag)
            fprintf(o->diag, "zinc: warning: fio failed (%s)\n", rc ? "exit status" : jerr.text);
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

static result_t run_zinc(const zn_bench_nvme_point *p, int is_write)
{
    result_t r = { 0 };
    uint64_t size = p->o->size;
    zn_aio_handle h;
    zn_aio_reset_stats(p->a);
    double t0 = zn_now_s();
    int rc = is_write ? zn_aio_submit_write(p->a, &p->e, p->buf, size, &h)
                      : zn_aio_submit_read(p->a, &p->e, p->buf, size, &h);
    if (rc == 0)
        rc = zn_aio_wait(p->a, h);
    double dt = zn_now_s() - t0;
    if (rc) {
        if (p->o->diag)
            fprintf(p->o->diag, "zinc: error: %s: %s\n", is_write ? "write" : "read",
                    zn_last_error());
        return r;
    }
    zn_aio_stats st;
    zn_aio_get_stats(p->a, &st);
    r.gbs = (double)size / dt / 1e9;
    r.iops = (double)(size / p->bs) / dt;
    r.p50_us = st.lat_p50_us;
    r.p99_us = st.lat_p99_us;
    r.ok = 1;
    return r;
}

/* zn_aio_buffer_alloc, or plain 4 KiB pages to show what they cost. */
static void *alloc_buf(uint64_t size, int huge, FILE *diag)
{
    if (huge)
        return zn_aio_buffer_alloc(size);
    void *p = NULL;
    if (posix_memalign(&p, 1u << 21, size))
        return NULL;
    if (madvise(p, size, MADV_NOHUGEPAGE) < 0 && diag)
        fprintf(diag, "zinc: warning: madvise(MADV_NOHUGEPAGE): %s\n", strerror(errno));
    return p;
}

static void best(result_t *b, result_t r)
{
    if (r.ok && (!b->ok || r.gbs > b->gbs))
        *b = r;
}

int zn_bench_nvme_point_open(zn_bench_nvme_point **out, const zn_bench_nvme_config *o,
                             uint64_t bs, int qd)
{
    *out = NULL;
    zn_bench_nvme_point *p = calloc(1, sizeof *p);
    if (!p)
        return zn_set_error(-ENOMEM, "out of memory");
    p->o = o;
    p->bs = bs;
    p->qd = qd;
    zn_aio_config c = zn_aio_config_default();
    c.block_size = bs;
    c.queue_depth = qd;
    c.crc = o->crc;
    c.collect_latency = 1;
    int rc = zn_aio_create(&p->a, &c);
    if (rc) {
        zn_error_prefix(rc, "creating the engine");
        goto fail;
    }
    zn_swap_config sc = zn_swap_config_default();
    sc.npaths = o->npaths;
    for (int i = 0; i < o->npaths; i++)
        sc.paths[i] = o->paths[i];
    sc.bytes = o->size;
    sc.file_prefix = "zinc-bench";
    sc.run_dir = 1;  /* a killed bench's files: removed by the next zinc run */
    if ((rc = zn_swap_create(&p->s, p->a, &sc))) {
        zn_error_prefix(rc, "creating the swap file");
        goto fail;
    }
    if ((rc = zn_swap_alloc(p->s, o->size, "bench", &p->e)) ||
        (rc = (p->buf = alloc_buf(o->size, o->huge, o->diag)) ? 0 : -ENOMEM)) {
        zn_error_prefix(rc, "allocating");
        goto fail;
    }
    *out = p;
    return 0;
fail:
    zn_bench_nvme_point_close(p);
    return rc;
}

const char *zn_bench_nvme_point_engine(const zn_bench_nvme_point *p)
{
    return zn_aio_backend_desc(p->a);
}

int zn_bench_nvme_point_run(zn_bench_nvme_point *p, zn_bench_nvme_result *out)
{
    const zn_bench_nvme_config *o = p->o;
    memset(out, 0, sizeof *out);
    if (zn_aio_register_buffer(p->a, p->buf, o->size) < 0 && o->diag)
        fprintf(o->diag, "zinc: warning: %s\n", zn_last_error());
    uint64_t seed = 0x5EEDull + p->bs * 131 + (uint64_t)p->qd;
    fill(p->buf, o->size, seed);
    /* Prefill (untimed): both tools then find written extents. */
    if (!run_zinc(p, 1).ok) {
        out->failed = 1;
        return zn_set_error(-EIO, "the prefill failed");
    }
    result_t zb[2] = { { 0 } }, fb[2] = { { 0 } };
    uint64_t wrong[2] = { 0, 0 };
    int have_read = 0;
    for (int i = 0; i < o->nrw; i++)
        have_read |= o->rw[i] == 0;
    for (int r = 0; r < o->reps; r++)
        for (int i = 0; i < o->nrw; i++) {
            int w = o->rw[i];
            if (w) {
                if (o->fio)
                    best(&fb[w], run_fio(p, 1));
                result_t z = run_zinc(p, 1);
                out->failed |= !z.ok;
                best(&zb[w], z);
                if (!have_read) {
                    /* Check what was written with an untimed read. */
                    memset(p->buf, 0xA5, o->size);
                    out->failed |= !run_zinc(p, 0).ok;
                    wrong[w] += count_wrong(p->buf, o->size, seed);
                    fill(p->buf, o->size, seed);
                }
            } else {
                memset(p->buf, 0xA5, o->size);
                result_t z = { 0 };
                if (r % 2 == 0 && o->fio)
                    best(&fb[w], run_fio(p, 0));
                z = run_zinc(p, 0);
                if (r % 2 == 1 && o->fio)
                    best(&fb[w], run_fio(p, 0));
                out->failed |= !z.ok;
                best(&zb[w], z);
                uint64_t bad = count_wrong(p->buf, o->size, seed);
                wrong[0] += bad;
                if (o->nrw == 2)
                    wrong[1] += bad;
                if (bad)
                    fill(p->buf, o->size, seed);
            }
        }
    for (int i = 0; i < o->nrw; i++) {
        int w = o->rw[i];
        zn_bench_nvme_row *row = &out->rows[out->nrows++];
        row->is_write = w;
        row->zinc = zb[w];
        row->fio = fb[w];
        row->ratio = fb[w].ok && fb[w].gbs > 0 ? zb[w].gbs / fb[w].gbs : 0;
        row->wrong = wrong[w];
    }
    return 0;
}

void zn_bench_nvme_point_close(zn_bench_nvme_point *p)
{
    if (!p)
        return;
    zn_swap_destroy(p->s);
    zn_aio_destroy(p->a);
    zn_aio_buffer_free(p->buf);
    free(p);
}
