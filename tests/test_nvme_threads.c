/* Several threads submit to one engine at once, each with its own tensors,
 * and wait on their own handles; every byte must come back, on io_uring and
 * on the thread pool. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>

#include "test_nvme_common.h"

#define BS (64 * 1024)
#define NTHREADS 4
#define NTENS 24
#define ROUNDS 3

typedef struct {
    zn_aio *a;
    zn_swap *s;
    int id;
    size_t wrong, failed;
} job_t;

static void *worker(void *arg)
{
    job_t *j = arg;
    zn_extent e[NTENS];
    unsigned char *buf[NTENS];
    size_t len[NTENS];
    zn_aio_handle h[NTENS];
    uint64_t x = 1234567 + (uint64_t)j->id * 7919;
    for (int i = 0; i < NTENS; i++) {
        x = x * 6364136223846793005ull + 1;
        len[i] = 1 + (size_t)((x >> 33) % (5 * BS));
        char name[32];
        snprintf(name, sizeof name, "th%d.t%d", j->id, i);
        if (zn_swap_alloc(j->s, len[i], name, &e[i])) {
            j->failed++;
            return NULL;
        }
        buf[i] = malloc(len[i] + 1);
    }
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < NTENS; i++) {
            tn_fill(buf[i] + (i & 1), len[i], (uint64_t)j->id << 32 | (uint64_t)(r * 100 + i), 0);
            if (zn_aio_submit_write(j->a, &e[i], buf[i] + (i & 1), len[i], &h[i]))
                j->failed++;
        }
        for (int i = 0; i < NTENS; i++)
            j->failed += zn_aio_wait(j->a, h[i]) != 0;
        for (int i = 0; i < NTENS; i++) {
            memset(buf[i], 0, len[i] + 1);
            if (zn_aio_submit_read(j->a, &e[i], buf[i], len[i], &h[i]))
                j->failed++;
        }
        for (int i = 0; i < NTENS; i++) {
            j->failed += zn_aio_wait(j->a, h[i]) != 0;
            j->wrong += tn_wrong(buf[i], len[i], (uint64_t)j->id << 32 | (uint64_t)(r * 100 + i), 0);
        }
    }
    for (int i = 0; i < NTENS; i++) {
        j->failed += zn_swap_free(j->s, &e[i]) != 0;
        free(buf[i]);
    }
    return NULL;
}

typedef struct {
    zn_aio *a;
    zn_aio_handle h;
    int rc;
} waiter_t;

static void *waiter(void *arg)
{
    waiter_t *w = arg;
    w->rc = zn_aio_wait(w->a, w->h);
    return NULL;
}

/* wait_all while another thread is blocked in zn_aio_wait on one of the
 * requests (the trainer's NVMe queue threads do that): the waiter gets the
 * request's status and releases it itself; wait_all must not free it under
 * the waiter. A waiter that comes after wait_all finds the handle released
 * (-ENOENT, as documented). */
static void wait_all_beside_a_waiter(zn_aio *a, zn_swap *s)
{
    /* many requests ahead of the waited one, so that it is still running
     * when wait_all comes */
    enum { NW = 32, LEN = 1 << 20, ROUNDS_W = 6 };
    unsigned char *buf = tn_alloc(LEN);
    tn_fill(buf, LEN, 77, 0);
    zn_extent e[NW];
    for (int i = 0; i < NW; i++)
        ZT_EQ_INT(zn_swap_alloc(s, LEN, "waited", &e[i]), 0);
    int before = 0;
    for (int r = 0; r < ROUNDS_W; r++) {
        waiter_t w = { a, 0, 1 };
        zn_aio_handle h;
        for (int i = 0; i < NW - 1; i++)
            ZT_EQ_INT(zn_aio_submit_write(a, &e[i], buf, LEN, &h), 0);
        ZT_EQ_INT(zn_aio_submit_write(a, &e[NW - 1], buf, LEN, &w.h), 0);
        pthread_t t;
        if (pthread_create(&t, NULL, waiter, &w))
            ZT_SETUP_FAIL("pthread_create");
        usleep(2000);
        ZT_EQ_INT(zn_aio_wait_all(a), 0);
        pthread_join(t, NULL);
        ZT_CHECK_MSG(w.rc == 0 || w.rc == -ENOENT, "round %d: the waiter got %d", r, w.rc);
        before += w.rc == 0;
    }
    printf("# wait_all beside a waiter: %d of %d waiters were inside zn_aio_wait first\n",
           before, ROUNDS_W);
    for (int i = 0; i < NW; i++)
        zn_swap_free(s, &e[i]);
    free(buf);
}

static void run(int force_threads, const char *dir)
{
    zn_aio_config c = zn_aio_config_default();
    c.block_size = BS;
    c.queue_depth = 6;
    c.force_threads = force_threads;
    zn_aio *a;
    if (zn_aio_create(&a, &c))
        ZT_SETUP_FAIL("zn_aio_create: %s", zn_last_error());
    printf("# %s\n", zn_aio_backend_desc(a));
    zn_swap *s = tn_swap(a, dir, 64u << 20);
    pthread_t th[NTHREADS];
    job_t jobs[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        jobs[i] = (job_t){ a, s, i, 0, 0 };
        if (pthread_create(&th[i], NULL, worker, &jobs[i]))
            ZT_SETUP_FAIL("pthread_create");
    }
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(th[i], NULL);
        ZT_CHECK_MSG(jobs[i].failed == 0, "thread %d: %zu failed calls (%s)", i, jobs[i].failed,
                     zn_last_error());
        ZT_CHECK_MSG(jobs[i].wrong == 0, "thread %d: %zu wrong bytes", i, jobs[i].wrong);
    }
    zn_aio_stats st;
    zn_aio_get_stats(a, &st);
    ZT_EQ_U64(st.writes, NTHREADS * NTENS * ROUNDS);
    ZT_EQ_U64(st.reads, NTHREADS * NTENS * ROUNDS);
    ZT_EQ_U64(st.errors, 0);
    wait_all_beside_a_waiter(a, s);
    zn_swap_stats ss;
    zn_swap_get_stats(s, &ss);
    ZT_EQ_U64(ss.used, 0);
    zn_swap_destroy(s);
    zn_aio_destroy(a);
}

int main(void)
{
    const char *dir = tn_tmpdir("threads");
    run(0, dir);
    run(1, dir);
    return zt_done();
}
