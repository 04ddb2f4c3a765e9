/* The device interface on every backend present: host always, CUDA when a
 * GPU answers. Copies round-trip bit-exactly, events order streams (a
 * dropped wait makes the consumer read stale data and fails), the budget is
 * enforced with a message naming the numbers, GEMM and strided-batched GEMM
 * match a double-precision reference over transposes, types and odd sizes,
 * many streams with many ops in flight, and streams destroyed with work
 * queued drain cleanly. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "zt.h"
#include "zinc/device.h"
#include "gpu/gpu-impl.h"

static const char *g_bk;   /* backend under test, for messages */

#define DEV_OK(call)                                                          \
    do {                                                                      \
        int rc_ = (call);                                                     \
        zt_checks++;                                                          \
        if (rc_)                                                              \
            ZT_FAIL_AT("[%s] %s -> %d (%s): %s", g_bk, #call, rc_,            \
                       zn_strerror(rc_), zn_last_error());                    \
    } while (0)

/* Test data as a function of (seed, index). */
static uint32_t mix(uint64_t seed, uint64_t i)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)(z ^ (z >> 31));
}

static float urand(uint64_t seed, uint64_t i)   /* [-1, 1) */
{
    return (float)((mix(seed, i) >> 8) * (1.0 / 8388608.0) - 1.0);
}

static const uint32_t POISON = 0x7fc0dead;   /* a NaN with a payload */

static void msleep(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static void sleep_fn(void *arg)
{
    msleep((int)(intptr_t)arg);
}

/* A host function that holds its stream until the test opens the gate
 * (10 s at most, so that a bug fails instead of hanging). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
} gate;

static void gate_wait(void *arg)
{
    gate *g = arg;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    pthread_mutex_lock(&g->mu);
    while (!g->open)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* ---- copies --------------------------------------------------------------*/
static void test_round_trip(zn_dev *d)
{
    static const size_t sizes[] = { 1, 255, 4099, (1u << 20) + 7 };
    zn_stream *s;
    DEV_OK(zn_dev_stream_create(d, "copy", &s));
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        for (int pinned = 0; pinned < 2; pinned++) {
            unsigned char *src, *dst;
            if (pinned) {
                DEV_OK(zn_dev_host_alloc(d, n, "src", (void **)&src));
                DEV_OK(zn_dev_host_alloc(d, n, "dst", (void **)&dst));
            } else {
                src = malloc(n);
                dst = malloc(n);
            }
            void *a, *b;
            DEV_OK(zn_dev_alloc(d, n, "a", &a));
            DEV_OK(zn_dev_alloc(d, n, "b", &b));
            for (size_t i = 0; i < n; i++)
                src[i] = (unsigned char)mix(si * 2 + (size_t)pinned, i);
            memset(dst, 0xa5, n);
            DEV_OK(zn_dev_memset(d, s, b, 0x5a, n));
            DEV_OK(zn_dev_copy_h2d(d, s, a, src, n));
            DEV_OK(zn_dev_copy_d2d(d, s, b, a, n));
            DEV_OK(zn_dev_copy_d2h(d, s, dst, b, n));
            DEV_OK(zn_dev_stream_sync(d, s));
            ZT_CHECK_MSG(memcmp(src, dst, n) == 0, "[%s] round trip of %zu bytes (%s) differs",
                         g_bk, n, pinned ? "pinned" : "pageable");
            zn_dev_free(d, a);
            zn_dev_free(d, b);
            if (pinned) {
                zn_dev_host_free(d, src);
                zn_dev_host_free(d, dst);
            } else {
                free(src);
                free(dst);
            }
        }
    }
    /* memset and fill write exactly their range. */
    float *h = malloc(64 * sizeof *h);
    void *x;
    DEV_OK(zn_dev_alloc(d, 64 * sizeof(float), "x", &x));
    DEV_OK(zn_dev_fill(d, s, x, ZN_DTYPE_F32, 64, -2.5f));
    DEV_OK(zn_dev_fill(d, s, (float *)x + 10, ZN_DTYPE_F32, 5, 3.0f));
    DEV_OK(zn_dev_copy_d2h(d, s, h, x, 64 * sizeof(float)));
    DEV_OK(zn_dev_stream_sync(d, s));
    int bad = 0;
    for (int i = 0; i < 64; i++)
        bad += h[i] != ((i >= 10 && i < 15) ? 3.0f : -2.5f);
    ZT_CHECK_MSG(bad == 0, "[%s] fill: %d wrong elements", g_bk, bad);
    /* A pointer outside the arena is refused before anything runs. */
    ZT_EQ_INT(zn_dev_copy_h2d(d, s, h, h, 16), ZN_EARG);
    ZT_CONTAINS(zn_last_error(), "not inside the device arena");
    zn_dev_free(d, x);
    free(h);
    zn_dev_stream_destroy(d, s);
}

/* ---- events ---------------------------------------------------------------*/
/* A slow producer writes a buffer and records an event; a consumer waits on
 * the event and reads. Without the wait the consumer copies the old value. */
static void test_event_order(zn_dev *d)
{
    enum { N = 4096, ROUNDS = 3 };
    zn_stream *prod, *cons;
    zn_event *ev;
    DEV_OK(zn_dev_stream_create(d, "producer", &prod));
    DEV_OK(zn_dev_stream_create(d, "consumer", &cons));
    DEV_OK(zn_dev_event_create(d, &ev));
    float *h = malloc(N * sizeof *h);
    void *x;
    DEV_OK(zn_dev_alloc(d, N * sizeof(float), "x", &x));
    DEV_OK(zn_dev_fill(d, prod, x, ZN_DTYPE_F32, N, 0.0f));
    DEV_OK(zn_dev_stream_sync(d, prod));
    for (int r = 1; r <= ROUNDS; r++) {
        memset(h, 0xff, N * sizeof *h);
        DEV_OK(zn_dev_launch_host_fn(d, prod, sleep_fn, (void *)(intptr_t)60));
        DEV_OK(zn_dev_fill(d, prod, x, ZN_DTYPE_F32, N, (float)r));
        DEV_OK(zn_dev_event_record(d, ev, prod));
        DEV_OK(zn_dev_stream_wait_event(d, cons, ev));
        DEV_OK(zn_dev_copy_d2h(d, cons, h, x, N * sizeof(float)));
        DEV_OK(zn_dev_stream_sync(d, cons));
        int bad = 0;
        for (int i = 0; i < N; i++)
            bad += h[i] != (float)r;
        ZT_CHECK_MSG(bad == 0, "[%s] round %d: consumer read %d stale elements (h[0] = %g): "
                     "the stream-wait-event did not hold it", g_bk, r, bad, (double)h[0]);
        DEV_OK(zn_dev_stream_sync(d, prod));
    }
    /* query / sync / elapsed. */
    zn_event *e0, *e1;
    DEV_OK(zn_dev_event_create_timed(d, &e0));
    DEV_OK(zn_dev_event_create_timed(d, &e1));
    ZT_EQ_INT(zn_dev_event_query(d, e0), 1);           /* never recorded */
    float ms = 0;
    ZT_CHECK(zn_dev_event_elapsed_ms(d, e0, e1, &ms) != 0);
    /* an ordering-only event keeps no time: refused, as CUDA refuses an
     * event made with cudaEventDisableTiming */
    DEV_OK(zn_dev_event_record(d, ev, prod));
    DEV_OK(zn_dev_event_sync(d, ev));
    DEV_OK(zn_dev_event_record(d, e0, prod));
    DEV_OK(zn_dev_event_sync(d, e0));
    ZT_EQ_INT(zn_dev_event_elapsed_ms(d, ev, e0, &ms), ZN_EARG);
    ZT_CONTAINS(zn_last_error(), "without timing");
    gate g = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };
    DEV_OK(zn_dev_launch_host_fn(d, prod, gate_wait, &g));
    DEV_OK(zn_dev_event_record(d, e0, prod));
    DEV_OK(zn_dev_launch_host_fn(d, prod, sleep_fn, (void *)(intptr_t)40));
    DEV_OK(zn_dev_event_record(d, e1, prod));
    ZT_EQ_INT(zn_dev_event_query(d, e0), 0);           /* held by the gate */
    ZT_EQ_INT(zn_dev_event_query(d, e1), 0);
    gate_open(&g);
    DEV_OK(zn_dev_event_sync(d, e1));
    ZT_EQ_INT(zn_dev_event_query(d, e1), 1);
    DEV_OK(zn_dev_event_elapsed_ms(d, e0, e1, &ms));
    ZT_CHECK_MSG(ms >= 39.0f && ms < 10000.0f, "[%s] elapsed %.3f ms around a 40 ms sleep",
                 g_bk, (double)ms);
    /* Destroying an event that a stream still waits on is allowed. */
    zn_event *e2;
    DEV_OK(zn_dev_event_create(d, &e2));
    DEV_OK(zn_dev_launch_host_fn(d, prod, sleep_fn, (void *)(intptr_t)20));
    DEV_OK(zn_dev_event_record(d, e2, prod));
    DEV_OK(zn_dev_stream_wait_event(d, cons, e2));
    zn_dev_event_destroy(d, e2);
    DEV_OK(zn_dev_stream_sync(d, cons));
    zn_dev_event_destroy(d, e0);
    zn_dev_event_destroy(d, e1);
    zn_dev_event_destroy(d, ev);
    zn_dev_free(d, x);
    free(h);
    zn_dev_stream_destroy(d, prod);
    zn_dev_stream_destroy(d, cons);
}

/* Host backend: two streams really run at once (each waits for the other
 * at a rendezvous run as a device op on its worker; serial execution would
 * time out), but their host functions run as CUDA runs them: one callback
 * thread, in order, so two host functions can never meet. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, ok, timeout_ms;
    pthread_t who[2];
} rendezvous;

static void meet(void *arg)
{
    rendezvous *r = arg;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += (long)r->timeout_ms * 1000000L;
    dl.tv_sec += dl.tv_nsec / 1000000000L;
    dl.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&r->mu);
    if (r->arrived < 2)
        r->who[r->arrived] = pthread_self();
    r->arrived++;
    pthread_cond_broadcast(&r->cv);
    while (r->arrived < 2)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) == ETIMEDOUT)
            break;
    if (r->arrived >= 2)
        r->ok++;
    pthread_mutex_unlock(&r->mu);
}

static void test_overlap(zn_dev *d)
{
    rendezvous r = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 5000, { 0 } };
    zn_stream *a, *b;
    DEV_OK(zn_dev_stream_create(d, "a", &a));
    DEV_OK(zn_dev_stream_create(d, "b", &b));
    DEV_OK(zn_dev_host_stream_fn(d, a, meet, &r));
    DEV_OK(zn_dev_host_stream_fn(d, b, meet, &r));
    DEV_OK(zn_dev_stream_sync(d, a));
    DEV_OK(zn_dev_stream_sync(d, b));
    ZT_CHECK_MSG(r.ok == 2, "[%s] streams did not run concurrently (%d of 2 met)", g_bk, r.ok);
    /* host functions: one thread, one at a time (the first gives up after
     * 300 ms, then the second finds it gone) */
    rendezvous h = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 300, { 0 } };
    DEV_OK(zn_dev_launch_host_fn(d, a, meet, &h));
    DEV_OK(zn_dev_launch_host_fn(d, b, meet, &h));
    DEV_OK(zn_dev_stream_sync(d, a));
    DEV_OK(zn_dev_stream_sync(d, b));
    ZT_CHECK_MSG(h.arrived == 2 && pthread_equal(h.who[0], h.who[1]),
                 "[%s] two host functions ran on two threads (CUDA runs them on one)", g_bk);
    ZT_CHECK_MSG(h.ok == 1, "[%s] two host functions ran at once (%d met)", g_bk, h.ok);
    zn_dev_stream_destroy(d, a);
    zn_dev_stream_destroy(d, b);
}

/* A host function that tries to wait: refused (it would stall every stream
 * behind the one callback thread). */
static void try_wait(void *arg)
{
    void **p = arg;
    *(int *)p[2] = zn_dev_event_sync(p[0], p[1]);
    *((int *)p[2] + 1) = zn_dev_in_host_fn();
}

/* Every backend: a stream waits on a flag in pinned memory in stream order
 * (zn_dev_stream_wait_value) while another stream, host functions
 * included, goes on; the flag's release lets the first one finish. */
static void test_wait_value(zn_dev *d)
{
    zn_stream *a, *b;
    uint32_t *flag = NULL;
    float *x = NULL, *y = NULL;
    float *h = malloc(1024 * sizeof *h), *hb = malloc(1024 * sizeof *hb);
    DEV_OK(zn_dev_stream_create(d, "waits", &a));
    DEV_OK(zn_dev_stream_create(d, "goes on", &b));
    DEV_OK(zn_dev_host_alloc(d, 64, "flag", (void **)&flag));
    DEV_OK(zn_dev_alloc(d, 1024 * sizeof(float), "x", (void **)&x));
    DEV_OK(zn_dev_alloc(d, 1024 * sizeof(float), "y", (void **)&y));
    if (!flag || !x || !y || !h || !hb)
        return;
    __atomic_store_n(flag, 0xfffffffeu, __ATOMIC_RELEASE);   /* it wraps on the way */
    for (int i = 0; i < 1024; i++)
        h[i] = (float)i;
    zn_event *done_a, *done_b;
    DEV_OK(zn_dev_event_create(d, &done_a));
    DEV_OK(zn_dev_event_create(d, &done_b));
    DEV_OK(zn_dev_stream_wait_value(d, a, flag, 1u));          /* until 0xfffffffe + 3 */
    DEV_OK(zn_dev_copy_h2d(d, a, x, h, 1024 * sizeof(float)));
    DEV_OK(zn_dev_event_record(d, done_a, a));
    /* the other stream: a host function and a copy, done while a waits */
    int res[2] = { -1, -1 };
    void *args[3] = { d, done_a, res };
    DEV_OK(zn_dev_launch_host_fn(d, b, try_wait, args));
    DEV_OK(zn_dev_fill(d, b, y, ZN_DTYPE_F32, 1024, 3.0f));
    DEV_OK(zn_dev_event_record(d, done_b, b));
    DEV_OK(zn_dev_stream_sync(d, b));
    ZT_CHECK_MSG(zn_dev_event_query(d, done_a) == 0,
                 "[%s] the waiting stream ran past its flag", g_bk);
    ZT_CHECK_MSG(res[0] == ZN_EINTERNAL && res[1] == 1,
                 "[%s] a host function's event sync returned %d (in host fn: %d), not "
                 "ZN_EINTERNAL", g_bk, res[0], res[1]);
    ZT_CHECK_MSG(!zn_dev_in_host_fn(), "[%s] the main thread says it runs a host function", g_bk);
    __atomic_store_n(flag, 0xffffffffu, __ATOMIC_RELEASE);    /* not yet */
    struct timespec ts = { 0, 20 * 1000000L };
    nanosleep(&ts, NULL);
    ZT_CHECK_MSG(zn_dev_event_query(d, done_a) == 0, "[%s] the stream passed its flag early",
                 g_bk);
    __atomic_store_n(flag, 1u, __ATOMIC_RELEASE);               /* wrapped: reached */
    DEV_OK(zn_dev_stream_sync(d, a));
    DEV_OK(zn_dev_copy_d2h(d, a, hb, x, 1024 * sizeof(float)));
    DEV_OK(zn_dev_stream_sync(d, a));
    int bad = 0;
    for (int i = 0; i < 1024; i++)
        bad += hb[i] != (float)i;
    ZT_CHECK_MSG(bad == 0, "[%s] the copy after the wait: %d wrong", g_bk, bad);
    ZT_EQ_INT(zn_dev_stream_wait_value(d, a, NULL, 1), ZN_EARG);
    ZT_EQ_INT(zn_dev_stream_wait_value(d, a, (const uint32_t *)((char *)flag + 1), 1), ZN_EARG);
    zn_dev_event_destroy(d, done_a);
    zn_dev_event_destroy(d, done_b);
    zn_dev_free(d, x);
    zn_dev_free(d, y);
    zn_dev_host_free(d, flag);
    zn_dev_stream_destroy(d, a);
    zn_dev_stream_destroy(d, b);
    free(h);
    free(hb);
}

/* ---- many streams, many ops in flight -------------------------------------*/
static void test_many_streams(zn_dev *d)
{
    enum { S = 8, ROUNDS = 400, N = 256, DEEP = 3000 };
    zn_stream *st[S];
    zn_event *ev[S];
    void *acc, *one;
    for (int i = 0; i < S; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "ring%d", i);
        DEV_OK(zn_dev_stream_create(d, nm, &st[i]));
        DEV_OK(zn_dev_event_create(d, &ev[i]));
    }
    DEV_OK(zn_dev_alloc(d, N * sizeof(float), "acc", &acc));
    DEV_OK(zn_dev_alloc(d, N * sizeof(float), "one", &one));
    DEV_OK(zn_dev_fill(d, st[0], acc, ZN_DTYPE_F32, N, 0.0f));
    DEV_OK(zn_dev_fill(d, st[0], one, ZN_DTYPE_F32, N, 1.0f));
    DEV_OK(zn_dev_event_record(d, ev[0], st[0]));
    /* A token passes round the ring: each stream waits for the previous
     * one, adds 1, records. Every add must see the one before it. */
    for (int r = 1; r <= ROUNDS; r++) {
        int i = r % S, p = (r - 1) % S;
        DEV_OK(zn_dev_stream_wait_event(d, st[i], ev[p]));
        DEV_OK(zn_dev_axpy(d, st[i], 1.0f, one, ZN_DTYPE_F32, acc, ZN_DTYPE_F32, N));
        DEV_OK(zn_dev_event_record(d, ev[i], st[i]));
    }
    /* More ops on one stream than its queue holds, none synchronised. */
    void *deep;
    DEV_OK(zn_dev_alloc(d, 64 * sizeof(float), "deep", &deep));
    DEV_OK(zn_dev_fill(d, st[1], deep, ZN_DTYPE_F32, 64, 0.0f));
    for (int i = 0; i < DEEP; i++)
        DEV_OK(zn_dev_axpy(d, st[1], 1.0f, one, ZN_DTYPE_F32, deep, ZN_DTYPE_F32, 64));
    float *h = malloc(N * sizeof *h), *hd = malloc(64 * sizeof *hd);
    int last = ROUNDS % S;
    DEV_OK(zn_dev_event_sync(d, ev[last]));
    DEV_OK(zn_dev_copy_d2h(d, st[last], h, acc, N * sizeof(float)));
    DEV_OK(zn_dev_copy_d2h(d, st[1], hd, deep, 64 * sizeof(float)));
    DEV_OK(zn_dev_sync(d));
    int bad = 0, badd = 0;
    for (int i = 0; i < N; i++)
        bad += h[i] != (float)ROUNDS;
    for (int i = 0; i < 64; i++)
        badd += hd[i] != (float)DEEP;
    ZT_CHECK_MSG(bad == 0, "[%s] ring of %d streams: acc[0] = %g, expected %d (%d wrong)",
                 g_bk, S, (double)h[0], ROUNDS, bad);
    ZT_CHECK_MSG(badd == 0, "[%s] %d queued ops: deep[0] = %g", g_bk, DEEP, (double)hd[0]);
    for (int i = 0; i < S; i++) {
        zn_dev_event_destroy(d, ev[i]);
        zn_dev_stream_destroy(d, st[i]);
    }
    zn_dev_free(d, acc);
    zn_dev_free(d, one);
    zn_dev_free(d, deep);
    free(h);
    free(hd);
}

/* ---- shutdown with queued work ----------------------------------------------*/
static void set_flag(void *arg)
{
    __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
}

static void test_shutdown(zn_dev *d)
{
    zn_stream *s;
    int flag = 0;
    void *x, *one;
    DEV_OK(zn_dev_alloc(d, 1024 * sizeof(float), "x", &x));
    DEV_OK(zn_dev_alloc(d, 1024 * sizeof(float), "one", &one));
    DEV_OK(zn_dev_stream_create(d, "doomed", &s));
    DEV_OK(zn_dev_fill(d, s, one, ZN_DTYPE_F32, 1024, 1.0f));
    DEV_OK(zn_dev_fill(d, s, x, ZN_DTYPE_F32, 1024, 0.0f));
    DEV_OK(zn_dev_launch_host_fn(d, s, sleep_fn, (void *)(intptr_t)30));
    for (int i = 0; i < 1500; i++)
        DEV_OK(zn_dev_axpy(d, s, 1.0f, one, ZN_DTYPE_F32, x, ZN_DTYPE_F32, 1024));
    DEV_OK(zn_dev_free_on(d, s, one));          /* stream-ordered free */
    DEV_OK(zn_dev_launch_host_fn(d, s, set_flag, &flag));
    zn_dev_stream_destroy(d, s);                /* must drain, not drop */
    ZT_CHECK_MSG(__atomic_load_n(&flag, __ATOMIC_ACQUIRE) == 1,
                 "[%s] stream destroyed before its queued work ran", g_bk);
    float h[4];
    DEV_OK(zn_dev_copy_d2h(d, NULL, h, x, sizeof h));
    DEV_OK(zn_dev_stream_sync(d, NULL));
    ZT_CHECK_MSG(h[0] == 1500.0f && h[3] == 1500.0f, "[%s] after drain x = %g", g_bk,
                 (double)h[0]);
    zn_dev_mem m;
    zn_dev_mem_stats(d, &m);
    ZT_EQ_U64(m.n_allocs, 1);                    /* `one` went back at its point */
    zn_dev_free(d, x);
}

/* ---- budget -----------------------------------------------------------------*/
static void test_budget(const char *name)
{
    zn_dev_config c = zn_dev_config_default();
    zn_dev *d;
    c.name = name;
    c.gpu_budget = 4u << 20;
    c.cpu_budget = 1u << 20;
    DEV_OK(zn_dev_create(&d, &c));
    if (!d)
        return;
    void *a = NULL, *b = NULL, *h = NULL, *h2 = NULL;
    DEV_OK(zn_dev_alloc(d, 3u << 20, "first", &a));
    ZT_EQ_INT(zn_dev_alloc(d, 2u << 20, "layer 7 w_up", &b), ZN_EBUDGET);
    const char *msg = zn_last_error();
    ZT_CONTAINS(msg, "layer 7 w_up");
    ZT_CONTAINS(msg, "2097152");      /* request */
    ZT_CONTAINS(msg, "4194304");      /* budget */
    ZT_CONTAINS(msg, "3145728");      /* in use */
    ZT_CHECK(b == NULL);
    zn_dev_mem m;
    zn_dev_mem_stats(d, &m);
    ZT_EQ_U64(m.budget, 4u << 20);
    ZT_EQ_U64(m.used, 3u << 20);
    ZT_EQ_U64(m.peak, 3u << 20);
    zn_dev_free(d, a);
    DEV_OK(zn_dev_alloc(d, 4u << 20, "all of it", &b));
    zn_dev_free(d, b);
    zn_dev_mem_stats(d, &m);
    ZT_EQ_U64(m.used, 0);
    ZT_EQ_U64(m.peak, 4u << 20);
    /* Pinned memory against the cpu budget. */
    DEV_OK(zn_dev_host_alloc(d, 768u << 10, "bounce", &h));
    ZT_EQ_INT(zn_dev_host_alloc(d, 512u << 10, "staging", &h2), ZN_EBUDGET);
    ZT_CONTAINS(zn_last_error(), "staging");
    ZT_CONTAINS(zn_last_error(), "1048576");
    ZT_CONTAINS(zn_last_error(), "786432");
    zn_dev_mem_stats(d, &m);
    ZT_EQ_U64(m.host_used, 768u << 10);
    ZT_EQ_U64(m.host_peak, 768u << 10);
    zn_dev_host_free(d, h);
    zn_dev_mem_stats(d, &m);
    ZT_EQ_U64(m.host_used, 0);
    zn_dev_destroy(d);
}

/* ---- GEMM ------------------------------------------------------------------*/
static void bf16_round(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = zn_bf16_widen(zn_bf16_round(x[i]));
}

static void *to_dt(const float *x, size_t n, zn_dtype dt)
{
    if (dt == ZN_DTYPE_F32) {
        float *y = malloc(n * 4);
        memcpy(y, x, n * 4);
        return y;
    }
    uint16_t *y = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        y[i] = zn_bf16_round(x[i]);
    return y;
}

static float from_dt(const void *p, zn_dtype dt, size_t i)
{
    return dt == ZN_DTYPE_F32 ? ((const float *)p)[i] : zn_bf16_widen(((const uint16_t *)p)[i]);
}

typedef struct {
    int ta, tb;
    int64_t m, n, k, pad, batch;
    int stride_b0;     /* strideB = 0 (GQA-style sharing) */
    float alpha, beta;
} gemm_case;

static double gemm_run(zn_dev *d, zn_stream *s, const gemm_case *gc, zn_dtype abt, zn_dtype cdt,
                       int *poison_bad)
{
    const int64_t m = gc->m, n = gc->n, k = gc->k, pad = gc->pad, bt = gc->batch;
    const int64_t arows = gc->ta ? k : m, acols = gc->ta ? m : k;
    const int64_t brows = gc->tb ? n : k, bcols = gc->tb ? k : n;
    const int64_t lda = acols + pad, ldb = bcols + pad, ldc = n + pad;
    const int64_t sa = arows * lda + 3, sb = gc->stride_b0 ? 0 : brows * ldb + 5,
                  sc = m * ldc + 2;
    const size_t na = (size_t)(sa * bt), nb = (size_t)(gc->stride_b0 ? brows * ldb : sb * bt),
                 nc = (size_t)(sc * bt);
    float *A = calloc(na, 4), *B = calloc(nb, 4), *C = calloc(nc, 4);
    for (size_t i = 0; i < na; i++)
        A[i] = urand(1, i);
    for (size_t i = 0; i < nb; i++)
        B[i] = urand(2, i);
    for (size_t i = 0; i < nc; i++)
        C[i] = urand(3, i);
    if (abt == ZN_DTYPE_BF16)
        bf16_round(A, na), bf16_round(B, nb);
    if (cdt == ZN_DTYPE_BF16)
        bf16_round(C, nc);
    if (gc->beta == 0.0f)   /* C must not be read: poison it */
        for (size_t i = 0; i < nc; i++)
            memcpy(&C[i], &POISON, 4);
    void *hA = to_dt(A, na, abt), *hB = to_dt(B, nb, abt), *hC = to_dt(C, nc, cdt);
    if (cdt == ZN_DTYPE_BF16 && gc->beta == 0.0f)
        for (size_t i = 0; i < nc; i++)
            ((uint16_t *)hC)[i] = 0x7fad;
    size_t esa = zn_dtype_size(abt), esc = zn_dtype_size(cdt);
    void *dA, *dB, *dC;
    DEV_OK(zn_dev_alloc(d, na * esa, "A", &dA));
    DEV_OK(zn_dev_alloc(d, nb * esa, "B", &dB));
    DEV_OK(zn_dev_alloc(d, nc * esc, "C", &dC));
    DEV_OK(zn_dev_copy_h2d(d, s, dA, hA, na * esa));
    DEV_OK(zn_dev_copy_h2d(d, s, dB, hB, nb * esa));
    DEV_OK(zn_dev_copy_h2d(d, s, dC, hC, nc * esc));
    void *out = malloc(nc * esc);
    if (bt == 1 && !gc->stride_b0)
        DEV_OK(zn_dev_gemm(d, s, gc->ta, gc->tb, m, n, k, gc->alpha, dA, abt, lda, dB, abt, ldb,
                           gc->beta, dC, cdt, ldc));
    else
        DEV_OK(zn_dev_gemm_strided_batched(d, s, gc->ta, gc->tb, m, n, k, gc->alpha, dA, abt,
                                           lda, sa, dB, abt, ldb, sb, gc->beta, dC, cdt, ldc,
                                           sc, bt));
    DEV_OK(zn_dev_copy_d2h(d, s, out, dC, nc * esc));
    DEV_OK(zn_dev_stream_sync(d, s));

    double maxerr = 0, maxref = 1e-30;
    int pb = 0;
    for (int64_t b = 0; b < bt; b++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < ldc; j++) {
                size_t co = (size_t)(b * sc + i * ldc + j);
                if (j >= n) {   /* padding: must be untouched */
                    pb += memcmp((char *)out + co * esc, (char *)hC + co * esc, esc) != 0;
                    continue;
                }
                double acc = 0;
                for (int64_t p = 0; p < k; p++) {
                    double av = A[b * sa + (gc->ta ? p * lda + i : i * lda + p)];
                    double bv = B[b * sb + (gc->tb ? j * ldb + p : p * ldb + j)];
                    acc += av * bv;
                }
                double ref = gc->alpha * acc + (gc->beta != 0.0f ? gc->beta * (double)C[co] : 0.0);
                double got = from_dt(out, cdt, co);
                double e = fabs(got - ref);
                if (!(e <= maxerr))   /* catches NaN */
                    maxerr = isnan(e) ? INFINITY : e;
                if (fabs(ref) > maxref)
                    maxref = fabs(ref);
            }
    /* rows between batches (stride gap) untouched as well */
    for (int64_t b = 0; b < bt; b++)
        for (int64_t g = m * ldc; g < sc; g++) {
            size_t co = (size_t)(b * sc + g);
            pb += memcmp((char *)out + co * esc, (char *)hC + co * esc, esc) != 0;
        }
    *poison_bad = pb;
    zn_dev_free(d, dA);
    zn_dev_free(d, dB);
    zn_dev_free(d, dC);
    free(A), free(B), free(C), free(hA), free(hB), free(hC), free(out);
    return maxerr / maxref;
}

static void test_gemm(zn_dev *d)
{
    static const int64_t shapes[][3] = {
        { 1, 1, 1 }, { 7, 5, 3 }, { 33, 17, 65 }, { 19, 130, 300 }, { 300, 9, 41 }, { 5, 6, 0 },
    };
    static const zn_dtype types[][2] = {
        { ZN_DTYPE_F32, ZN_DTYPE_F32 }, { ZN_DTYPE_BF16, ZN_DTYPE_F32 },
        { ZN_DTYPE_BF16, ZN_DTYPE_BF16 },
    };
    zn_stream *s;
    DEV_OK(zn_dev_stream_create(d, "gemm", &s));
    int cases = 0;
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int t = 0; t < 4; t++)
                for (int bi = 0; bi < 2; bi++) {
                    gemm_case gc = { t & 1, t >> 1, shapes[si][0], shapes[si][1], shapes[si][2],
                                     (int64_t)(si % 3) * 3, 1, 0, 0.75f, bi ? 0.5f : 0.0f };
                    int pb = 0;
                    double e = gemm_run(d, s, &gc, types[ti][0], types[ti][1], &pb);
                    double tol = types[ti][0] == ZN_DTYPE_F32 ? 1e-5 : 1e-2;
                    cases++;
                    ZT_CHECK_MSG(e <= tol && pb == 0, "[%s] gemm %s,%s->%s ta=%d tb=%d m=%lld "
                                 "n=%lld k=%lld beta=%g: rel err %.3g (tol %g), %d padding "
                                 "elements changed", g_bk, zn_dtype_name(types[ti][0]),
                                 zn_dtype_name(types[ti][0]), zn_dtype_name(types[ti][1]),
                                 gc.ta, gc.tb, (long long)gc.m, (long long)gc.n,
                                 (long long)gc.k, (double)gc.beta, e, tol, pb);
                }
    /* Strided batched, including B shared by all (stride 0). */
    for (size_t ti = 0; ti < 3; ti++)
        for (int t = 0; t < 4; t++)
            for (int b0 = 0; b0 < 2; b0++) {
                gemm_case gc = { t & 1, t >> 1, 13, 11, 24, 2, 4, b0, 1.0f, b0 ? 0.0f : -1.0f };
                int pb = 0;
                double e = gemm_run(d, s, &gc, types[ti][0], types[ti][1], &pb);
                double tol = types[ti][0] == ZN_DTYPE_F32 ? 1e-5 : 1e-2;
                cases++;
                ZT_CHECK_MSG(e <= tol && pb == 0, "[%s] batched gemm %s->%s ta=%d tb=%d "
                             "strideB=%s: rel err %.3g, %d gap elements changed", g_bk,
                             zn_dtype_name(types[ti][0]), zn_dtype_name(types[ti][1]), gc.ta,
                             gc.tb, b0 ? "0" : "full", e, pb);
            }
    printf("[%s] %d gemm cases\n", g_bk, cases);
    /* Refused combinations and bad leading dimensions. */
    void *x;
    DEV_OK(zn_dev_alloc(d, 4096, "x", &x));
    ZT_EQ_INT(zn_dev_gemm(d, s, ZN_NOTRANS, ZN_NOTRANS, 4, 4, 4, 1, x, ZN_DTYPE_F32, 4, x,
                          ZN_DTYPE_F32, 4, 0, x, ZN_DTYPE_BF16, 4), ZN_EUNSUPPORTED);
    ZT_EQ_INT(zn_dev_gemm(d, s, ZN_NOTRANS, ZN_NOTRANS, 4, 4, 8, 1, x, ZN_DTYPE_F32, 4, x,
                          ZN_DTYPE_F32, 4, 0, x, ZN_DTYPE_F32, 4), ZN_EARG);
    ZT_CONTAINS(zn_last_error(), "lda 4 < 8");
    /* A copy stream (no cuBLAS on CUDA) runs copies and kernels and
     * refuses a GEMM by name, here as on a GPU. */
    zn_stream *cs;
    DEV_OK(zn_dev_stream_create_copy(d, "copies", &cs));
    float h[16], back[16];
    for (int i = 0; i < 16; i++)
        h[i] = (float)i;
    DEV_OK(zn_dev_copy_h2d(d, cs, x, h, sizeof h));
    DEV_OK(zn_dev_fill(d, cs, (float *)x + 8, ZN_DTYPE_F32, 8, -1.0f));
    DEV_OK(zn_dev_copy_d2h(d, cs, back, x, sizeof back));
    DEV_OK(zn_dev_stream_sync(d, cs));
    int bad = 0;
    for (int i = 0; i < 16; i++)
        bad += back[i] != (i < 8 ? (float)i : -1.0f);
    ZT_CHECK_MSG(bad == 0, "[%s] copy stream: %d wrong elements", g_bk, bad);
    ZT_EQ_INT(zn_dev_gemm(d, cs, ZN_NOTRANS, ZN_NOTRANS, 2, 2, 2, 1, x, ZN_DTYPE_F32, 2, x,
                          ZN_DTYPE_F32, 2, 0, (float *)x + 8, ZN_DTYPE_F32, 2), ZN_EARG);
    ZT_CONTAINS(zn_last_error(), "stream 'copies' is a copy stream");
    zn_dev_stream_destroy(d, cs);
    zn_dev_free(d, x);
    zn_dev_stream_destroy(d, s);
}

/* An arena reserved after the streams (defer_arena, as the trainer makes
 * its device): nothing is allocated before it, the streams made first work
 * on it, a second reserve is refused; on CUDA the streams' cuBLAS
 * workspaces and scratch show as memory outside the arena. */
static void test_deferred_arena(const char *name)
{
    zn_dev_config c = zn_dev_config_default();
    zn_dev *d;
    c.name = name;
    c.gpu_budget = 4u << 20;
    c.defer_arena = 1;
    DEV_OK(zn_dev_create(&d, &c));
    if (!d)
        return;
    zn_stream *s[3];
    for (int i = 0; i < 3; i++)
        DEV_OK(zn_dev_stream_create(d, "early", &s[i]));
    void *a = NULL;
    ZT_EQ_INT(zn_dev_alloc(d, 1u << 20, "too early", &a), ZN_EARG);
    ZT_CONTAINS(zn_last_error(), "before the arena was reserved");
    DEV_OK(zn_dev_arena_reserve(d, 4u << 20));
    ZT_EQ_INT(zn_dev_arena_reserve(d, 4u << 20), ZN_EARG);
    zn_dev_mem m;
    zn_dev_mem_stats(d, &m);
    ZT_EQ_U64(m.budget, 4u << 20);
    uint64_t out = zn_dev_outside_arena(d);
    if (d->info.kind == ZN_DEV_HOST)
        ZT_EQ_U64(out, 0);
    else   /* the three streams' workspaces and scratch, at least */
        ZT_CHECK_MSG(out >= 3 * (uint64_t)(ZN_CUBLAS_WORKSPACE(d->info.cc_major)),
                     "[%s] %llu bytes outside the arena after 3 streams", name,
                     (unsigned long long)out);
    float h[256], back[256];
    for (int i = 0; i < 256; i++)
        h[i] = (float)i;
    DEV_OK(zn_dev_alloc(d, sizeof h, "x", &a));
    DEV_OK(zn_dev_copy_h2d(d, s[2], a, h, sizeof h));
    DEV_OK(zn_dev_copy_d2h(d, s[2], back, a, sizeof h));
    DEV_OK(zn_dev_stream_sync(d, s[2]));
    ZT_CHECK(memcmp(h, back, sizeof h) == 0);
    zn_dev_free(d, a);
    for (int i = 0; i < 3; i++)
        zn_dev_stream_destroy(d, s[i]);
    zn_dev_destroy(d);
}

static int run_backend(const char *name)
{
    zn_dev_config c = zn_dev_config_default();
    zn_dev *d;
    c.name = name;
    c.gpu_budget = 256u << 20;
    int rc = zn_dev_create(&d, &c);
    if (rc == ZN_ENODEV) {
        printf("SKIP [%s]: %s\n", name, zn_last_error());
        return 0;
    }
    g_bk = name;
    DEV_OK(rc);
    if (rc)
        return 1;
    test_round_trip(d);
    test_event_order(d);
    if (d->info.kind == ZN_DEV_HOST)
        test_overlap(d);
    else
        ZT_EQ_INT(zn_dev_host_stream_fn(d, NULL, try_wait, NULL), ZN_EUNSUPPORTED);
    test_wait_value(d);
    test_many_streams(d);
    test_shutdown(d);
    test_gemm(d);
    zn_dev_mem m;
    zn_dev_mem_stats(d, &m);
    ZT_CHECK_MSG(m.n_allocs == 0 && m.used == 0 && m.host_used == 0,
                 "[%s] leaked: %llu allocs, %llu bytes, %llu pinned", name,
                 (unsigned long long)m.n_allocs, (unsigned long long)m.used,
                 (unsigned long long)m.host_used);
    zn_dev_destroy(d);
    test_budget(name);
    test_deferred_arena(name);
    printf("[%s] done\n", name);
    return 1;
}

int main(void)
{
    int ran = 0;
    ran += run_backend("host");
    ran += run_backend("cuda");
    if (!ran)
        ZT_SKIP("no backend could be created");
    return zt_done();
}
