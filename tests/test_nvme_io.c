/* Round trips of seeded data through the engine in every mode (io_uring and
 * thread pool, O_DIRECT and buffered, forced by config and by
 * ZINC_AIO_FORCE, several rings, sequential batches, no registration):
 * sizes around the alignment and the block size, unaligned buffers, many
 * requests in flight, wait/poll/wait_all, registered buffers, partial reads,
 * and the bytes found in the file itself. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_nvme_common.h"

#define BS (64 * 1024)

typedef struct {
    const char *name;
    const char *env;       /* ZINC_AIO_FORCE value or NULL */
    int force_threads, force_buffered;
    int rings, qd, single_submit, overlap, register_buffers;
    int want_threads, want_direct; /* -1: whatever the machine gives */
} mode_t_;

static const size_t sizes[] = { 1, 100, 511, 512, 4095, 4096, 4097, BS - 1, BS, BS + 1,
                                200000, 1 << 20, 3 * BS + 123 };
static const size_t boffs[] = { 0, 1, 512, 4093 };
#define NS (sizeof sizes / sizeof sizes[0])
#define NB (sizeof boffs / sizeof boffs[0])

static void run_mode(const mode_t_ *m, const char *dir)
{
    if (m->env)
        setenv("ZINC_AIO_FORCE", m->env, 1);
    else
        unsetenv("ZINC_AIO_FORCE");
    zn_aio_config c = zn_aio_config_default();
    c.block_size = BS;
    c.queue_depth = m->qd;
    c.intra_op_parallelism = m->rings;
    c.single_submit = m->single_submit;
    c.overlap_events = m->overlap;
    c.register_buffers = m->register_buffers;
    c.force_threads = m->force_threads;
    c.force_buffered = m->force_buffered;
    zn_aio *a = NULL;
    int rc = zn_aio_create(&a, &c);
    if (rc)
        ZT_SETUP_FAIL("%s: zn_aio_create: %s", m->name, zn_last_error());
    printf("# %s: %s\n", m->name, zn_aio_backend_desc(a));
    if (m->want_threads >= 0)
        ZT_CHECK_MSG((zn_aio_get_backend(a) == ZN_AIO_BACKEND_THREADS) == m->want_threads,
                     "%s: backend %d", m->name, zn_aio_get_backend(a));
    if (m->env)
        ZT_CONTAINS(zn_aio_backend_desc(a), "ZINC_AIO_FORCE");
    zn_swap *s = tn_swap(a, dir, 48u << 20);
    zn_swap_stats ss;
    zn_swap_get_stats(s, &ss);
    if (m->want_direct >= 0)
        ZT_CHECK_MSG(ss.direct == m->want_direct, "%s: direct %d", m->name, ss.direct);

    /* 1. Every size x buffer offset, all writes in flight at once. */
    enum { N = NS * NB };
    zn_extent e[N];
    unsigned char *wb[N], *rb[N];
    zn_aio_handle h[N];
    for (size_t i = 0; i < N; i++) {
        size_t n = sizes[i / NB], bo = boffs[i % NB];
        char name[64];
        snprintf(name, sizeof name, "t%zu.%zu", i / NB, i % NB);
        ZT_EQ_INT(zn_swap_alloc(s, n, name, &e[i]), 0);
        wb[i] = tn_alloc(n + bo);
        rb[i] = tn_alloc(n + 4096 + 64);
        tn_fill(wb[i] + bo, n, 1000 + i, 0);
        ZT_EQ_INT(zn_aio_submit_write(a, &e[i], wb[i] + bo, n, &h[i]), 0);
    }
    ZT_EQ_INT(zn_aio_wait_all(a), 0);
    /* Handles released by wait_all are gone. */
    ZT_EQ_INT(zn_aio_wait(a, h[0]), -ENOENT);
    for (size_t i = 0; i < N; i++) {
        size_t n = sizes[i / NB];
        size_t ro = boffs[(i + 1) % NB]; /* a different misalignment for the read */
        memset(rb[i], 0xEE, n + 4096 + 64);
        ZT_EQ_INT(zn_aio_submit_read(a, &e[i], rb[i] + ro, n, &h[i]), 0);
    }
    size_t wrong = 0, guard = 0;
    for (size_t i = 0; i < N; i++) {
        size_t n = sizes[i / NB], ro = boffs[(i + 1) % NB];
        if (i % 2) {
            rc = zn_aio_wait(a, h[i]);
        } else {
            while ((rc = zn_aio_poll(a, h[i])) == -EINPROGRESS)
                usleep(100);
        }
        ZT_CHECK_MSG(rc == 0, "%s: read %zu: %s", m->name, i, zn_last_error());
        wrong += tn_wrong(rb[i] + ro, n, 1000 + i, 0);
        for (size_t k = 0; k < 64; k++)
            guard += rb[i][ro + n + k] != 0xEE; /* nothing written past the end */
    }
    ZT_CHECK_MSG(wrong == 0, "%s: %zu wrong bytes", m->name, wrong);
    ZT_CHECK_MSG(guard == 0, "%s: %zu bytes written past the caller's buffer", m->name, guard);

    /* 2. The bytes are in the file where the extent says (one path: file
     * offset == extent offset). */
    {
        size_t i = NB * 10 + 1; /* 200000 bytes */
        int fd = open(zn_swap_file_path(s, 0), O_RDONLY);
        unsigned char *tmp = tn_alloc(sizes[10]);
        ZT_CHECK(fd >= 0);
        if (fd >= 0) {
            ssize_t got = pread(fd, tmp, sizes[10], (off_t)e[i].offset);
            ZT_EQ_INT(got, (long long)sizes[10]);
            ZT_EQ_U64(tn_wrong(tmp, sizes[10], 1000 + i, 0), 0);
            /* O_DIRECT pads the tail to the alignment with zeros, never
             * with stale staging-buffer bytes. */
            size_t pad = ss.direct ? (ss.align - sizes[10] % ss.align) % ss.align : 0;
            if (pad) {
                got = pread(fd, tmp, pad, (off_t)(e[i].offset + sizes[10]));
                ZT_EQ_INT(got, (long long)pad);
                size_t nz = 0;
                for (size_t k = 0; k < pad; k++)
                    nz += tmp[k] != 0;
                ZT_CHECK_MSG(nz == 0, "%s: %zu non-zero padding bytes", m->name, nz);
            }
            close(fd);
        }
        free(tmp);
    }

    /* 3. Partial read, shorter rewrite, reads past the written length. */
    {
        size_t i = NB * 12; /* 3 blocks + 123 */
        unsigned char *p = rb[i];
        ZT_EQ_INT(zn_aio_submit_read(a, &e[i], p, BS + 7, &h[0]), 0);
        ZT_EQ_INT(zn_aio_wait(a, h[0]), 0);
        ZT_EQ_U64(tn_wrong(p, BS + 7, 1000 + i, 0), 0);
        tn_fill(wb[i], BS / 2, 77, 0);
        ZT_EQ_INT(zn_aio_submit_write(a, &e[i], wb[i], BS / 2, &h[0]), 0);
        ZT_EQ_INT(zn_aio_wait(a, h[0]), 0);
        ZT_EQ_INT(zn_aio_submit_read(a, &e[i], p, BS, &h[0]), -EINVAL);
        ZT_CONTAINS(zn_last_error(), "were written");
        ZT_EQ_INT(zn_aio_submit_read(a, &e[i], p, BS / 2, &h[0]), 0);
        ZT_EQ_INT(zn_aio_wait(a, h[0]), 0);
        ZT_EQ_U64(tn_wrong(p, BS / 2, 77, 0), 0);
        ZT_EQ_INT(zn_aio_submit_read(a, &e[i], p, 0, &h[0]), 0);
        ZT_EQ_INT(zn_aio_wait(a, h[0]), 0);
        ZT_EQ_INT(zn_aio_submit_write(a, &e[0], p, e[0].bytes + 1, &h[0]), -EINVAL);
    }

    /* 4. A registered, aligned buffer takes no bounce. */
    {
        size_t n = 4u << 20;
        unsigned char *big = tn_alloc(n), *back = tn_alloc(n);
        int id = zn_aio_register_buffer(a, big, n);
        ZT_CHECK_MSG(id >= 0, "%s: register: %s", m->name, zn_last_error());
        zn_extent be;
        ZT_EQ_INT(zn_swap_alloc(s, n, "big", &be), 0);
        tn_fill(big, n, 4242, 0);
        zn_aio_stats st0, st1;
        zn_aio_get_stats(a, &st0);
        ZT_EQ_INT(zn_aio_submit_write(a, &be, big, n, &h[0]), 0);
        ZT_EQ_INT(zn_aio_wait(a, h[0]), 0);
        memset(big, 0, n);
        ZT_EQ_INT(zn_aio_submit_read(a, &be, big, n, &h[0]), 0);
        ZT_EQ_INT(zn_aio_wait(a, h[0]), 0);
        zn_aio_get_stats(a, &st1);
        ZT_EQ_U64(tn_wrong(big, n, 4242, 0), 0);
        ZT_EQ_U64(st1.bounced - st0.bounced, 0);
        ZT_EQ_U64(st1.blocks - st0.blocks, 2 * n / BS);
        ZT_EQ_U64(st1.bytes_written - st0.bytes_written, n);
        if (id >= 0) {
            ZT_EQ_INT(zn_aio_unregister_buffer(a, id), 0);
            ZT_EQ_INT(zn_aio_unregister_buffer(a, id), -ENOENT);
        }
        /* Unregistered buffers work too. */
        ZT_EQ_INT(zn_aio_submit_read(a, &be, back, n, &h[0]), 0);
        ZT_EQ_INT(zn_aio_wait(a, h[0]), 0);
        ZT_EQ_U64(tn_wrong(back, n, 4242, 0), 0);
        ZT_EQ_INT(zn_swap_free(s, &be), 0);
        free(big);
        free(back);
    }

    for (size_t i = 0; i < N; i++) {
        ZT_EQ_INT(zn_swap_free(s, &e[i]), 0);
        free(wb[i]);
        free(rb[i]);
    }
    zn_swap_get_stats(s, &ss);
    ZT_EQ_U64(ss.used, 0);
    char path0[4096];
    snprintf(path0, sizeof path0, "%s", zn_swap_file_path(s, 0));
    zn_swap_destroy(s);
    ZT_CHECK_MSG(access(path0, F_OK) != 0, "%s: swap file %s left behind", m->name, path0);
    zn_aio_destroy(a);
    unsetenv("ZINC_AIO_FORCE");
}

int main(void)
{
    const char *dir = tn_tmpdir("io");
    zn_nvme_probe_info pi;
    if (zn_nvme_probe(dir, &pi))
        ZT_SETUP_FAIL("probe: %s", zn_last_error());
    int uring = pi.uring_ok, direct = pi.direct_ok;
    const mode_t_ modes[] = {
        { "default", NULL, 0, 0, 1, 8, 0, 1, 1, !uring, direct },
        { "threads", NULL, 1, 0, 1, 4, 0, 1, 1, 1, direct },
        { "buffered", NULL, 0, 1, 1, 8, 0, 1, 1, !uring, 0 },
        { "env threads,buffered", "threads,buffered", 0, 0, 1, 8, 0, 1, 1, 1, 0 },
        { "env threads", "threads", 0, 0, 1, 3, 0, 1, 1, 1, direct },
        { "2 rings qd3 single-submit unregistered", NULL, 0, 0, 2, 3, 1, 1, 0, !uring, direct },
        { "sequential batches", NULL, 0, 0, 1, 4, 0, 0, 1, !uring, direct },
        { "qd1", NULL, 0, 0, 1, 1, 0, 1, 1, !uring, direct },
    };
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        run_mode(&modes[i], dir);
    return zt_done();
}
