/* Communicator tests. Without arguments: shard arithmetic, launch
 * environment parsing, reductions, the single-rank backend, and the TCP
 * backend with 2, 3 and 4 ranks forked on 127.0.0.1 (every op against a
 * serial reference, a stalled rank -> ZN_ETIMEOUT naming it, a dead rank ->
 * -ECONNRESET naming it, a rendezvous that never completes).
 * With `--worker MODE` it is one rank of such a run, configured from the
 * environment (RANK/WORLD_SIZE/... or mpirun's), which is how
 * test_comm_mpi.sh and test_comm_netns.sh use it:
 *   check   every collective on seeded data vs a serial reference
 *   stall   rank $ZT_STALL_RANK does not join; the others must fail in time
 *   die     rank $ZT_DIE_RANK exits mid-run; the others must fail fast
 *   loop    all-reduce until an error (the netns link cut), at most
 *           $ZT_LOOP_S seconds; prints READY after the first success. */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zinc/comm.h"
#include "zinc/device.h"
#include "comm/comm-impl.h"
#include "test_net.h"
#include "zn_build_config.h"
#if ZN_HAVE_MPI
#include <mpi.h>
#endif
#include "zt.h"

/* ---- data: a function of (seed, rank, index), small integers so that sums
 * over ranks are exact in fp32 and bf16 whatever the order ------------------*/
static float val(int seed, int rank, size_t i)
{
    return (float)((int)((i * 7 + (size_t)rank * 13 + (size_t)seed) % 17) - 8);
}

static void fill(void *buf, zn_dtype dt, size_t n, int seed, int rank, size_t base)
{
    for (size_t i = 0; i < n; i++) {
        float v = val(seed, rank, base + i);
        if (dt == ZN_DTYPE_F32)
            ((float *)buf)[i] = v;
        else
            ((uint16_t *)buf)[i] = zn_bf16_round(v);
    }
}

static float get(const void *buf, zn_dtype dt, size_t i)
{
    return dt == ZN_DTYPE_F32 ? ((const float *)buf)[i] : zn_bf16_widen(((const uint16_t *)buf)[i]);
}

static float ref(int seed, int world, size_t i, zn_reduce_op op)
{
    float acc = val(seed, 0, i);
    for (int r = 1; r < world; r++) {
        float v = val(seed, r, i);
        acc = op == ZN_REDUCE_SUM ? acc + v : (v > acc ? v : acc);
    }
    return acc;
}

/* Counts elements of buf[0..n) that differ from ref(seed, world, base+i). */
static size_t count_wrong(const void *buf, zn_dtype dt, size_t n, int seed, int world,
                          size_t base, zn_reduce_op op)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += get(buf, dt, i) != ref(seed, world, base + i, op);
    return bad;
}

/* ---- the collective suite: runs on every rank of any backend -------------------*/
static int suite_failures;

#define SCHECK(cond, ...)                                                    \
    do {                                                                     \
        zt_checks++;                                                         \
        if (!(cond)) {                                                       \
            suite_failures++;                                                \
            ZT_FAIL_AT(__VA_ARGS__);                                         \
        }                                                                    \
    } while (0)

static void suite(zn_comm *c, zn_dev *dev)
{
    int rank = zn_comm_rank(c), n = zn_comm_size(c);
    const size_t counts[] = { 0, 1, 7, 1000, (size_t)(3u << 20) / 2 + 5 };
    const zn_dtype dts[] = { ZN_DTYPE_F32, ZN_DTYPE_BF16 };
    const zn_reduce_op ops[] = { ZN_REDUCE_SUM, ZN_REDUCE_MAX };
    size_t maxc = counts[sizeof counts / sizeof counts[0] - 1];
    unsigned char *a = malloc(maxc * 4 * (size_t)n + 64), *b = malloc(maxc * 4 * (size_t)n + 64);
    if (!a || !b)
        ZT_SETUP_FAIL("out of memory");
    int seed = 11;
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        size_t cnt = counts[ci];
        for (int di = 0; di < 2; di++) {
            zn_dtype dt = dts[di];
            size_t es = zn_dtype_size(dt);
            for (int oi = 0; oi < 2; oi++) {
                zn_reduce_op op = ops[oi];
                seed++;
                /* all-reduce, out of place */
                fill(a, dt, cnt, seed, rank, 0);
                memset(b, 0xff, cnt * es + 1);
                int rc = zn_comm_allreduce(c, a, b, cnt, dt, op);
                SCHECK(rc == 0, "allreduce %zu %s: %s", cnt, zn_dtype_name(dt), zn_last_error());
                size_t bad = count_wrong(b, dt, cnt, seed, n, 0, op);
                SCHECK(bad == 0, "allreduce %zu x %s op %d: %zu wrong", cnt, zn_dtype_name(dt),
                       op, bad);
                SCHECK(b[cnt * es] == 0xff, "allreduce wrote past the end");
                /* in place */
                seed++;
                fill(a, dt, cnt, seed, rank, 0);
                rc = zn_comm_allreduce(c, a, a, cnt, dt, op);
                SCHECK(rc == 0 && count_wrong(a, dt, cnt, seed, n, 0, op) == 0,
                       "allreduce in place %zu x %s: rc %d", cnt, zn_dtype_name(dt), rc);

                /* reduce-scatter: send has n*cnt elements, element j is
                 * val(seed, rank, j); rank r gets ref at r*cnt + i */
                seed++;
                fill(a, dt, cnt * (size_t)n, seed, rank, 0);
                memset(b, 0xff, cnt * es + 1);
                rc = zn_comm_reduce_scatter(c, a, b, cnt, dt, op);
                bad = count_wrong(b, dt, cnt, seed, n, (size_t)rank * cnt, op);
                SCHECK(rc == 0 && bad == 0, "reduce-scatter %zu x %s op %d: rc %d, %zu wrong",
                       cnt, zn_dtype_name(dt), op, rc, bad);
                SCHECK(b[cnt * es] == 0xff, "reduce-scatter wrote past the end");
                /* in place: recv = send + rank*cnt */
                rc = zn_comm_reduce_scatter(c, a, a + (size_t)rank * cnt * es, cnt, dt, op);
                SCHECK(rc == 0, "reduce-scatter in place: %s", zn_last_error());
                fill(b, dt, cnt * (size_t)n, seed, rank, 0);   /* reference input again */
                (void)b;
                bad = count_wrong(a + (size_t)rank * cnt * es, dt, cnt, seed, n,
                                  (size_t)rank * cnt, op);
                SCHECK(bad == 0, "reduce-scatter in place %zu x %s: %zu wrong", cnt,
                       zn_dtype_name(dt), bad);
            }
            /* all-gather: rank r contributes val(seed, r, i); slot r must
             * hold exactly that */
            seed++;
            fill(a, dt, cnt, seed, rank, 0);
            memset(b, 0xff, cnt * es * (size_t)n + 1);
            int rc = zn_comm_allgather(c, a, b, cnt, dt);
            size_t bad = 0;
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < cnt; i++)
                    bad += get(b + (size_t)r * cnt * es, dt, i) != val(seed, r, i);
            SCHECK(rc == 0 && bad == 0, "allgather %zu x %s: rc %d, %zu wrong", cnt,
                   zn_dtype_name(dt), rc, bad);
            SCHECK(b[cnt * es * (size_t)n] == 0xff, "allgather wrote past the end");
            /* in place */
            memset(b, 0, cnt * es * (size_t)n);
            fill(b + (size_t)rank * cnt * es, dt, cnt, seed, rank, 0);
            rc = zn_comm_allgather(c, b + (size_t)rank * cnt * es, b, cnt, dt);
            bad = 0;
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < cnt; i++)
                    bad += get(b + (size_t)r * cnt * es, dt, i) != val(seed, r, i);
            SCHECK(rc == 0 && bad == 0, "allgather in place %zu x %s: %zu wrong", cnt,
                   zn_dtype_name(dt), bad);
        }
        /* broadcast from every root */
        for (int root = 0; root < n; root++) {
            size_t bytes = cnt * 2 + (size_t)root;
            for (size_t i = 0; i < bytes; i++)
                a[i] = rank == root ? (unsigned char)(i * 31 + (size_t)root) : 0;
            int rc = zn_comm_broadcast(c, a, bytes, root);
            size_t bad = 0;
            for (size_t i = 0; i < bytes; i++)
                bad += a[i] != (unsigned char)(i * 31 + (size_t)root);
            SCHECK(rc == 0 && bad == 0, "broadcast %zu bytes from %d: rc %d, %zu wrong", bytes,
                   root, rc, bad);
        }
    }
    SCHECK(zn_comm_barrier(c) == 0, "barrier: %s", zn_last_error());

    /* Random floats: all ranks must get the same bits, within fp32
     * reduction-order tolerance of the serial sum (|err| <= n * 2^-23 *
     * sum |x|). */
    {
        size_t cnt = 100003;
        float *x = (float *)a, *y = (float *)b;
        uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)rank;
        for (size_t i = 0; i < cnt; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
        }
        int rc = zn_comm_allreduce(c, x, y, cnt, ZN_DTYPE_F32, ZN_REDUCE_SUM);
        SCHECK(rc == 0, "random allreduce: %s", zn_last_error());
        double maxerr = 0;
        float *all = malloc(cnt * 4 * (size_t)n);
        if (!all)
            ZT_SETUP_FAIL("out of memory");
        rc = zn_comm_allgather(c, x, all, cnt, ZN_DTYPE_F32);
        SCHECK(rc == 0, "random allgather: %s", zn_last_error());
        for (size_t i = 0; i < cnt; i++) {
            double r = 0, absum = 0;
            for (int q = 0; q < n; q++) {
                r += all[(size_t)q * cnt + i];
                absum += fabs(all[(size_t)q * cnt + i]);
            }
            double e = fabs(y[i] - r) / (absum * n * 1.2e-7 + 1e-30);
            if (e > maxerr)
                maxerr = e;
        }
        SCHECK(maxerr <= 1.0, "random allreduce error %.3g x the fp32 bound", maxerr);
        /* same bits on every rank: gather rank 0's result via broadcast */
        memcpy(all, y, cnt * 4);
        rc = zn_comm_broadcast(c, all, cnt * 4, 0);
        SCHECK(rc == 0 && memcmp(all, y, cnt * 4) == 0, "allreduce results differ between "
               "ranks (rc %d)", rc);
        free(all);
    }

    /* Asynchronous: three requests in flight, then test/wait. */
    {
        size_t cnt = 50001;
        unsigned char *g = malloc(cnt * 4 * (size_t)n), *rs = malloc(cnt * 4),
                      *ar = malloc(cnt * 4), *src = malloc(cnt * 4 * (size_t)n);
        if (!g || !rs || !ar || !src)
            ZT_SETUP_FAIL("out of memory");
        fill(a, ZN_DTYPE_F32, cnt, 101, rank, 0);
        fill(src, ZN_DTYPE_BF16, cnt * (size_t)n, 102, rank, 0);
        fill(ar, ZN_DTYPE_F32, cnt, 103, rank, 0);
        zn_comm_req *r1 = NULL, *r2 = NULL, *r3 = NULL, *r4 = NULL;
        int rc1 = zn_comm_iallgather(c, a, g, cnt, ZN_DTYPE_F32, &r1);
        int rc2 = zn_comm_ireduce_scatter(c, src, rs, cnt, ZN_DTYPE_BF16, ZN_REDUCE_SUM, &r2);
        int rc3 = zn_comm_iallreduce(c, ar, ar, cnt, ZN_DTYPE_F32, ZN_REDUCE_MAX, &r3);
        int rc4 = zn_comm_ibarrier(c, &r4);
        SCHECK(!rc1 && !rc2 && !rc3 && !rc4 && r1 && r2 && r3 && r4, "issuing requests: %s",
               zn_last_error());
        int t = 0;
        double tt = zn_now_s();
        while ((t = zn_comm_test(c, r1)) == 0 && zn_now_s() - tt < 60) {
            struct timespec ts = { 0, 100000 };
            nanosleep(&ts, NULL);
        }
        SCHECK(t == 1, "zn_comm_test on the allgather: %d (%s)", t, zn_last_error());
        SCHECK(zn_comm_wait(c, r1) == 0 && zn_comm_wait(c, r2) == 0 &&
               zn_comm_wait(c, r3) == 0 && zn_comm_wait(c, r4) == 0, "wait: %s",
               zn_last_error());
        size_t bad = 0;
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < cnt; i++)
                bad += get(g + (size_t)r * cnt * 4, ZN_DTYPE_F32, i) != val(101, r, i);
        bad += count_wrong(rs, ZN_DTYPE_BF16, cnt, 102, n, (size_t)rank * cnt, ZN_REDUCE_SUM);
        bad += count_wrong(ar, ZN_DTYPE_F32, cnt, 103, n, 0, ZN_REDUCE_MAX);
        SCHECK(bad == 0, "asynchronous collectives: %zu wrong", bad);
        free(g);
        free(rs);
        free(ar);
        free(src);
    }

    /* Stream-ordered device collectives (host device): upload, all-gather
     * and reduce-scatter on the comm stream, download, compare. */
    if (dev) {
        size_t cnt = 40000;
        zn_stream *s = zn_comm_stream(c);
        void *dsend = NULL, *drecv = NULL;
        SCHECK(s != NULL, "no comm stream");
        int rc = zn_dev_alloc(dev, cnt * 4 * (size_t)n, "send", &dsend);
        rc = rc ? rc : zn_dev_alloc(dev, cnt * 4 * (size_t)n, "recv", &drecv);
        SCHECK(rc == 0, "dev alloc: %s", zn_last_error());
        fill(a, ZN_DTYPE_BF16, cnt, 201, rank, 0);
        fill(b, ZN_DTYPE_F32, cnt * (size_t)n, 202, rank, 0);
        unsigned char *h1 = malloc(cnt * 2 * (size_t)n), *h2 = malloc(cnt * 4);
        if (!h1 || !h2)
            ZT_SETUP_FAIL("out of memory");
        rc = zn_dev_copy_h2d(dev, s, dsend, a, cnt * 2);
        rc = rc ? rc : zn_comm_allgather_on(c, s, dsend, drecv, cnt, ZN_DTYPE_BF16);
        rc = rc ? rc : zn_dev_copy_d2h(dev, s, h1, drecv, cnt * 2 * (size_t)n);
        rc = rc ? rc : zn_dev_copy_h2d(dev, s, dsend, b, cnt * 4 * (size_t)n);
        rc = rc ? rc : zn_comm_reduce_scatter_on(c, s, dsend, drecv, cnt, ZN_DTYPE_F32,
                                                 ZN_REDUCE_SUM);
        rc = rc ? rc : zn_dev_copy_d2h(dev, s, h2, drecv, cnt * 4);
        rc = rc ? rc : zn_comm_sync_on(c, s);
        SCHECK(rc == 0, "stream collectives: %s", zn_last_error());
        size_t bad = 0;
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < cnt; i++)
                bad += get(h1 + (size_t)r * cnt * 2, ZN_DTYPE_BF16, i) != val(201, r, i);
        bad += count_wrong(h2, ZN_DTYPE_F32, cnt, 202, n, (size_t)rank * cnt, ZN_REDUCE_SUM);
        SCHECK(bad == 0, "stream collectives: %zu wrong", bad);
        zn_dev_free(dev, dsend);
        zn_dev_free(dev, drecv);
        free(h1);
        free(h2);
    }
    free(a);
    free(b);
}

/* ---- worker mode ----------------------------------------------------------------*/
static double env_d(const char *k, double d)
{
    const char *s = getenv(k);
    return s && *s ? atof(s) : d;
}

static int worker(const char *mode)
{
    zn_comm_config cfg = zn_comm_config_default();
    zn_dev *dev = NULL;
    zn_comm *c = NULL;
    if (!strcmp(mode, "check")) {
        zn_dev_config dc = zn_dev_config_default();
        dc.name = "host";
        dc.gpu_budget = 64u << 20;
        if (zn_dev_create(&dev, &dc))
            ZT_SETUP_FAIL("host device: %s", zn_last_error());
        cfg.dev = dev;
    }
    double t0 = zn_now_s();
    int rc = zn_comm_create(&c, &cfg);
    if (rc) {
        fprintf(stderr, "worker: zn_comm_create: %s\n", zn_last_error());
        return 1;
    }
    zn_comm_info info;
    zn_comm_get_info(c, &info);
    int rank = info.rank, n = info.size;
    int ret = 0;
    if (!strcmp(mode, "check")) {
        suite(c, dev);
        printf("rank %d/%d (%s, device part %s, %s): %d checks, %d failed\n", rank, n,
               info.host_backend, info.dev_backend, info.version, zt_checks, suite_failures);
        ret = suite_failures ? 1 : 0;
    } else if (!strcmp(mode, "stall") || !strcmp(mode, "die")) {
        int stall = !strcmp(mode, "stall");
        int who = (int)env_d(stall ? "ZT_STALL_RANK" : "ZT_DIE_RANK", 1);
        float x[64], y[64];
        for (int i = 0; i < 64; i++)
            x[i] = (float)rank;
        if (!stall) {
            for (int k = 0; k < 2 && !rc; k++)
                rc = zn_comm_allreduce(c, x, y, 64, ZN_DTYPE_F32, ZN_REDUCE_SUM);
            if (rc) {
                fprintf(stderr, "rank %d: warm-up failed: %s\n", rank, zn_last_error());
                return 1;
            }
            if (rank == who)
                _exit(0);   /* dies: no goodbye, sockets closed by the kernel */
        } else if (rank == who) {
            struct timespec ts = { (time_t)env_d("ZT_STALL_S", 10), 0 };
            nanosleep(&ts, NULL);
            _exit(0);
        }
        t0 = zn_now_s();
        rc = zn_comm_allreduce(c, x, y, 64, ZN_DTYPE_F32, ZN_REDUCE_SUM);
        double el = zn_now_s() - t0;
        const char *msg = zn_last_error();
        char want[32];
        snprintf(want, sizeof want, "rank %d ", who);
        double limit = stall ? info.timeout_s * 1.6 + 4.0 : info.timeout_s / 2;
        int want_rc = stall ? ZN_ETIMEOUT : -ECONNRESET;
        /* The verdict of rank 0 (not just this rank's own view, which may
         * blame a neighbour) must reach every rank; without rank 0, the
         * local view must say that rank 0 did not answer. */
        const char *verdict = !stall ? "died" : who != 0 ? "did not join" : "sent no verdict";
        int ok = rc == want_rc && strstr(msg, want) && strstr(msg, "allreduce #") &&
                 strstr(msg, verdict) && el <= limit;
        printf("%s rank %d: rc %d (%s) after %.2f s (limit %.1f): %s\n", ok ? "PASS" : "FAIL",
               rank, rc, zn_strerror(rc), el, limit, msg);
        fflush(stdout);
        ret = ok ? 0 : 1;
        if (!strcmp(info.host_backend, "mpi")) {
            /* The CLI's path: let the other rank print, then end the job:
             * the library says MPI must end it, the application does. */
            struct timespec ts = { 1, 0 };
            nanosleep(&ts, NULL);
            if (zn_comm_abort(c, 3) != 1) {
                printf("FAIL rank %d: zn_comm_abort did not ask for MPI_Abort\n", rank);
                return 1;
            }
#if ZN_HAVE_MPI
            MPI_Abort(MPI_COMM_WORLD, 3);
#endif
        }
    } else if (!strcmp(mode, "loop")) {
        size_t cnt = 64 * 1024;
        float *x = calloc(cnt, 4), *y = calloc(cnt, 4);
        double limit = env_d("ZT_LOOP_S", 60);
        long it = 0;
        if (!x || !y)
            return 99;
        rc = 0;
        for (; zn_now_s() - t0 < limit && !rc; it++) {
            x[it % cnt] = (float)rank;
            rc = zn_comm_allreduce(c, x, y, cnt, ZN_DTYPE_F32, ZN_REDUCE_SUM);
            if (it == 0 && !rc) {
                printf("READY rank %d\n", rank);
                fflush(stdout);
            }
            if (!rc) {
                struct timespec ts = { 0, 20000000 };
                nanosleep(&ts, NULL);
            }
        }
        free(x);
        free(y);
        if (rc) {
            printf("ERROR rank %d after %ld iterations, %.1f s since the start: rc %d (%s): %s\n",
                   rank, it, zn_now_s() - t0, rc, zn_strerror(rc), zn_last_error());
            ret = 3;
        } else {
            printf("NOERROR rank %d: %ld iterations in %.1f s\n", rank, it, zn_now_s() - t0);
            ret = 0;
        }
        fflush(stdout);
    } else {
        fprintf(stderr, "worker: unknown mode %s\n", mode);
        ret = 99;
    }
    zn_comm_destroy(c);
    zn_dev_destroy(dev);
    return ret;
}

/* ---- in-process tests -----------------------------------------------------------*/
static void test_shard(void)
{
    zn_shard s;
    ZT_EQ_INT(zn_comm_shard(10, 3, 0, 1, &s), 0);
    ZT_EQ_U64(s.padded, 12);
    ZT_EQ_U64(s.shard, 4);
    ZT_EQ_U64(s.offset, 0);
    ZT_EQ_U64(s.len, 4);
    ZT_EQ_INT(zn_comm_shard(10, 3, 2, 1, &s), 0);
    ZT_EQ_U64(s.offset, 8);
    ZT_EQ_U64(s.len, 2);
    ZT_EQ_INT(zn_comm_shard(10, 4, 3, 4, &s), 0);
    ZT_EQ_U64(s.padded, 16);
    ZT_EQ_U64(s.shard, 4);
    ZT_EQ_U64(s.offset, 12);
    ZT_EQ_U64(s.len, 0);
    ZT_EQ_INT(zn_comm_shard(0, 2, 1, 0, &s), 0);
    ZT_EQ_U64(s.padded, 0);
    ZT_EQ_U64(s.len, 0);
    ZT_EQ_INT(zn_comm_shard(10, 0, 0, 1, &s), ZN_EARG);
    ZT_EQ_INT(zn_comm_shard(10, 2, 2, 1, &s), ZN_EARG);
    ZT_EQ_INT(zn_comm_shard(10, 2, -1, 1, &s), ZN_EARG);
    ZT_EQ_INT(zn_comm_shard(SIZE_MAX - 3, 8, 0, 1, &s), ZN_EARG);
    /* Invariants over a sweep. */
    size_t bad = 0;
    for (size_t n = 0; n < 300; n += 7)
        for (int w = 1; w <= 9; w++)
            for (size_t al = 1; al <= 64; al *= 4) {
                size_t total = 0, expect_off = 0;
                for (int r = 0; r < w; r++) {
                    if (zn_comm_shard(n, w, r, al, &s)) {
                        bad++;
                        continue;
                    }
                    bad += s.padded % ((size_t)w * al) != 0 || s.padded < n ||
                           s.padded >= n + (size_t)w * al || s.shard * (size_t)w != s.padded ||
                           s.offset != expect_off || s.len > s.shard || s.shard % al != 0;
                    total += s.len;
                    expect_off += s.shard;
                }
                bad += total != n;
            }
    ZT_EQ_U64(bad, 0);
}

static void clear_launch_env(void)
{
    const char *vars[] = { "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                           "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                           "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_SIZE", "PMI_RANK",
                           "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_STEP_ID",
                           "SLURM_STEPID", "SLURM_PROCID", "SLURM_NTASKS",
                           "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID",
                           "SLURM_STEP_TASKS_PER_NODE" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

static void test_launch(void)
{
    zn_launch_info li;
    clear_launch_env();
    ZT_EQ_INT(zn_launch_detect(&li), 0);
    ZT_EQ_INT(li.launcher, ZN_LAUNCH_NONE);
    ZT_EQ_INT(li.world_size, 1);
    ZT_EQ_INT(li.rank, 0);

    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);   /* torchrun variables win */
    ZT_EQ_INT(zn_launch_detect(&li), 0);
    ZT_EQ_INT(li.launcher, ZN_LAUNCH_TORCHRUN);
    ZT_EQ_INT(li.rank, 3);
    ZT_EQ_INT(li.world_size, 8);
    ZT_EQ_INT(li.local_rank, 1);
    ZT_EQ_INT(li.local_size, 2);
    ZT_EQ_STR(li.master_addr, "10.1.2.3");
    ZT_EQ_INT(li.master_port, 29500);
    setenv("RANK", "8", 1);
    ZT_EQ_INT(zn_launch_detect(&li), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "rank 8");
    setenv("RANK", "x1", 1);
    ZT_EQ_INT(zn_launch_detect(&li), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "RANK");
    setenv("RANK", "1", 1);
    setenv("MASTER_PORT", "70000", 1);
    ZT_EQ_INT(zn_launch_detect(&li), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "MASTER_PORT");
    unsetenv("MASTER_PORT");
    ZT_EQ_INT(zn_launch_detect(&li), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "MASTER_PORT");
    unsetenv("WORLD_SIZE");
    ZT_EQ_INT(zn_launch_detect(&li), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "WORLD_SIZE");

    clear_launch_env();
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
    ZT_EQ_INT(zn_launch_detect(&li), 0);
    ZT_EQ_INT(li.launcher, ZN_LAUNCH_MPI);
    ZT_EQ_INT(li.rank, 2);
    ZT_EQ_INT(li.world_size, 3);
    ZT_EQ_INT(li.local_rank, 0);
    ZT_EQ_INT(li.local_size, 1);

    clear_launch_env();
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_PROCID", "6", 1);
    setenv("SLURM_NTASKS", "7", 1);
    setenv("SLURM_LOCALID", "0", 1);
    setenv("SLURM_NODEID", "3", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3),1", 1);
    ZT_EQ_INT(zn_launch_detect(&li), 0);
    ZT_EQ_INT(li.launcher, ZN_LAUNCH_SLURM);
    ZT_EQ_INT(li.rank, 6);
    ZT_EQ_INT(li.world_size, 7);
    ZT_EQ_INT(li.local_size, 1);
    setenv("SLURM_NODEID", "1", 1);
    ZT_EQ_INT(zn_launch_detect(&li), 0);
    ZT_EQ_INT(li.local_size, 2);
    /* the batch script (no step id) is not a launch */
    unsetenv("SLURM_STEP_ID");
    ZT_EQ_INT(zn_launch_detect(&li), 0);
    ZT_EQ_INT(li.launcher, ZN_LAUNCH_NONE);
    clear_launch_env();

    char name[32];
    li.local_rank = 1;
    li.local_size = 2;
    ZT_EQ_INT(zn_launch_device_name(&li, name, sizeof name), 0);
    ZT_CHECK(!strcmp(name, "host") || !strncmp(name, "cuda:", 5));
    ZT_EQ_INT(zn_launch_device_name(&li, name, 4), ZN_EARG);
    int node = -5;
    ZT_EQ_INT(zn_launch_bind_numa(&li, -1, &node), 0);
    ZT_CHECK(node >= 0);
    ZT_EQ_INT(zn_launch_bind_numa(&li, 4095, &node), ZN_EARG);
}

static void test_reduce(void)
{
    float a[4] = { 1, -2, NAN, 3 }, b[4] = { 2, -3, 1, NAN }, o[4];
    zn_comm_reduce(o, a, b, 4, ZN_DTYPE_F32, ZN_REDUCE_MAX);
    ZT_CHECK(o[0] == 2 && o[1] == -2 && isnan(o[2]) && isnan(o[3]));
    zn_comm_reduce(o, a, b, 2, ZN_DTYPE_F32, ZN_REDUCE_SUM);
    ZT_CHECK(o[0] == 3 && o[1] == -5);
    /* bf16: 1 + 2^-8 is not representable (8 bits of mantissa): rounds to
     * even, i.e. back to 1; 1 + 3*2^-8 rounds up to 1 + 2^-6... exactly as
     * fp32 -> bf16 of the fp32 sum. */
    uint16_t x[3] = { zn_bf16_round(1.0f), zn_bf16_round(1.0f), zn_bf16_round(256.0f) };
    uint16_t y[3] = { zn_bf16_round(0.00390625f), zn_bf16_round(0.01171875f), zn_bf16_round(1.0f) };
    uint16_t z[3];
    zn_comm_reduce(z, x, y, 3, ZN_DTYPE_BF16, ZN_REDUCE_SUM);
    ZT_CHECK(zn_bf16_widen(z[0]) == 1.0f);
    ZT_CHECK(zn_bf16_widen(z[1]) == 1.015625f);
    ZT_CHECK(zn_bf16_widen(z[2]) == 256.0f);
    zn_comm_reduce(z, x, y, 3, ZN_DTYPE_BF16, ZN_REDUCE_MAX);
    ZT_CHECK(zn_bf16_widen(z[0]) == 1.0f && zn_bf16_widen(z[2]) == 256.0f);
}

static void test_single(void)
{
    zn_launch_info li;
    memset(&li, 0, sizeof li);
    li.world_size = li.local_size = 1;
    zn_comm_config cfg = zn_comm_config_default();
    cfg.backend = "auto";
    cfg.launch = &li;
    cfg.timeout_s = 5;
    zn_dev_config dc = zn_dev_config_default();
    dc.name = "host";
    dc.gpu_budget = 64u << 20;
    zn_dev *dev = NULL;
    if (zn_dev_create(&dev, &dc))
        ZT_SETUP_FAIL("host device: %s", zn_last_error());
    cfg.dev = dev;
    zn_comm *c = NULL;
    ZT_EQ_INT(zn_comm_create(&c, &cfg), 0);
    if (!c)
        return;
    zn_comm_info info;
    zn_comm_get_info(c, &info);
    ZT_EQ_STR(info.host_backend, "single");
    ZT_EQ_STR(info.dev_backend, "copy");
    ZT_EQ_INT(info.size, 1);
    suite(c, dev);
    ZT_EQ_INT(zn_comm_allreduce(c, NULL, NULL, 4, ZN_DTYPE_F32, ZN_REDUCE_SUM), ZN_EARG);
    ZT_EQ_INT(zn_comm_allreduce(c, "", (void *)"", 4, ZN_DTYPE_F16, ZN_REDUCE_SUM), ZN_EARG);
    ZT_EQ_INT(zn_comm_broadcast(c, (void *)"", 1, 1), ZN_EARG);
    zn_comm_get_info(c, &info);
    ZT_CHECK(info.n_ops > 100);
    zn_comm_destroy(c);

    cfg.backend = "single";
    li.world_size = 2;
    ZT_EQ_INT(zn_comm_create(&c, &cfg), ZN_ECONFIG);
    ZT_CHECK(c == NULL);
    cfg.backend = "bogus";
    ZT_EQ_INT(zn_comm_create(&c, &cfg), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "bogus");
    cfg.backend = "nccl";
    li.world_size = 1;
    ZT_EQ_INT(zn_comm_create(&c, &cfg), ZN_EUNSUPPORTED);   /* host device: no NCCL */
    cfg.backend = "auto";
    cfg.timeout_s = -1;
    ZT_EQ_INT(zn_comm_create(&c, &cfg), ZN_ECONFIG);
    zn_dev_destroy(dev);
}

/* ---- forked TCP ranks --------------------------------------------------------------*/

/* Starts n ranks of `self --worker mode` with the TCP environment, waits at
 * most wait_s for all but rank `skip_wait` (-1: all), kills what is left.
 * exit codes in st[]. Returns the number of ranks that had to be killed. */
static int run_ranks(int n, const char *mode, const char *extra_env, double wait_s,
                     int skip_wait, int *st)
{
    pid_t pids[8];
    const char *args[] = { "--worker", mode, NULL };
    tnet_spawn_ranks(n, "tcp", extra_env, 120, args, pids);
    int killed = 0;
    uint64_t deadline = zn_now_ns() + (uint64_t)(wait_s * 1e9);
    for (int r = 0; r < n; r++)
        st[r] = -1;
    for (;;) {
        int left = 0;
        for (int r = 0; r < n; r++) {
            if (st[r] != -1)
                continue;
            int ws;
            pid_t p = waitpid(pids[r], &ws, WNOHANG);
            if (p == pids[r])
                st[r] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
            else if (r != skip_wait)
                left++;
        }
        if (!left || zn_now_ns() >= deadline)
            break;
        struct timespec ts = { 0, 20000000 };
        nanosleep(&ts, NULL);
    }
    for (int r = 0; r < n; r++)
        if (st[r] == -1) {
            if (r != skip_wait)
                killed++;
            kill(pids[r], SIGKILL);
            int ws;
            waitpid(pids[r], &ws, 0);
            st[r] = 128 + SIGKILL;
        }
    return killed;
}

static void test_tcp(void)
{
    int st[8];
    for (int n = 2; n <= 4; n++) {
        int killed = run_ranks(n, "check", NULL, 90, -1, st);
        ZT_EQ_INT(killed, 0);
        for (int r = 0; r < n; r++)
            ZT_CHECK_MSG(st[r] == 0, "tcp check, %d ranks: rank %d exited %d", n, r, st[r]);
    }
    /* A rank that never joins: the others fail with ZN_ETIMEOUT naming it. */
    int killed = run_ranks(3, "stall", "ZINC_COMM_TIMEOUT=1.5 ZT_STALL_RANK=1 ZT_STALL_S=30",
                           30, 1, st);
    ZT_EQ_INT(killed, 0);
    ZT_CHECK_MSG(st[0] == 0 && st[2] == 0, "stall: ranks 0 and 2 exited %d and %d", st[0],
                 st[2]);
    /* The stuck rank is rank 0 (the judge): the others still fail in time. */
    killed = run_ranks(3, "stall", "ZINC_COMM_TIMEOUT=1.5 ZT_STALL_RANK=0 ZT_STALL_S=30", 30,
                       0, st);
    ZT_EQ_INT(killed, 0);
    ZT_CHECK_MSG(st[1] == 0 && st[2] == 0, "stall of rank 0: ranks 1 and 2 exited %d and %d",
                 st[1], st[2]);
    /* A rank that dies: the others fail fast (well before the timeout). */
    killed = run_ranks(3, "die", "ZINC_COMM_TIMEOUT=30 ZT_DIE_RANK=2", 30, -1, st);
    ZT_EQ_INT(killed, 0);
    ZT_CHECK_MSG(st[0] == 0 && st[1] == 0, "die: ranks 0 and 1 exited %d and %d", st[0], st[1]);
    killed = run_ranks(4, "die", "ZINC_COMM_TIMEOUT=30 ZT_DIE_RANK=0", 30, -1, st);
    ZT_EQ_INT(killed, 0);
    ZT_CHECK_MSG(st[1] == 0 && st[2] == 0 && st[3] == 0, "death of rank 0: exits %d %d %d",
                 st[1], st[2], st[3]);
}

static void test_rendezvous_timeout(void)
{
    zn_launch_info li;
    memset(&li, 0, sizeof li);
    li.launcher = ZN_LAUNCH_TORCHRUN;
    li.world_size = 2;
    li.local_size = 2;
    snprintf(li.master_addr, sizeof li.master_addr, "127.0.0.1");
    li.master_port = tnet_free_port();
    zn_comm_config cfg = zn_comm_config_default();
    cfg.backend = "tcp";
    cfg.launch = &li;
    cfg.connect_timeout_s = 0.5;
    zn_comm *c = NULL;
    double t0 = zn_now_s();
    ZT_EQ_INT(zn_comm_create(&c, &cfg), ZN_ETIMEOUT);
    ZT_CONTAINS(zn_last_error(), "missing: 1");
    ZT_CHECK(zn_now_s() - t0 < 3);
    li.rank = 1;   /* a rank whose master never comes */
    t0 = zn_now_s();
    ZT_EQ_INT(zn_comm_create(&c, &cfg), ZN_ETIMEOUT);
    ZT_CONTAINS(zn_last_error(), "rank 0");
    ZT_CHECK(zn_now_s() - t0 < 3);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "--worker"))
        return worker(argv[2]);
    test_shard();
    test_launch();
    test_reduce();
    test_rendezvous_timeout();
    test_tcp();
    test_single();
    return zt_done();
}
