/* Fault injection, swept over every completion of a write-then-read
 * workload: the n-th completion returns -EIO, -ENOSPC or a short count.
 * An error fails exactly the request it hit, with a message naming the
 * tensor, the file and the offset; every other request completes with the
 * right data; a failed write is never taken as written; the engine stays
 * usable (the failed tensor is rewritten and read back). A short count is
 * resumed and nothing fails. Run on io_uring and on the thread pool. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "test_nvme_common.h"

#define BS (64 * 1024)
#define NT 6

static const size_t lens[NT] = { 3 * BS + 500, BS, 20000, 2 * BS, 7 * BS + 1, 4096 };
static const char *names[NT] = { "embed", "l0.q", "l0.norm", "l0.k", "l0.mlp", "lm_head.bias" };

typedef struct {
    zn_aio *a;
    zn_swap *s;
    zn_extent e[NT];
    unsigned char *buf[NT];
} rig_t;

/* Writes everything, then reads everything. Returns the number of failed
 * requests; *code, *msg get the failure; *wrong counts bad bytes among the
 * requests that succeeded. */
static int workload(rig_t *r, uint64_t seed, int *code, char *msg, size_t msgn, size_t *wrong,
                    int *failed_tensor, int *failed_write)
{
    zn_aio_handle h[NT];
    int fails = 0, wfail[NT] = { 0 };
    *wrong = 0;
    for (int i = 0; i < NT; i++) {
        tn_fill(r->buf[i], lens[i], seed + (uint64_t)i, 0);
        if (zn_aio_submit_write(r->a, &r->e[i], r->buf[i], lens[i], &h[i]))
            ZT_SETUP_FAIL("submit: %s", zn_last_error());
    }
    for (int i = 0; i < NT; i++) {
        int rc = zn_aio_wait(r->a, h[i]);
        if (rc) {
            fails++;
            wfail[i] = 1;
            *code = rc;
            *failed_tensor = i;
            *failed_write = 1;
            snprintf(msg, msgn, "%s", zn_last_error());
        }
    }
    for (int i = 0; i < NT; i++) {
        memset(r->buf[i], 0, lens[i]);
        h[i] = 0;
        int rc = zn_aio_submit_read(r->a, &r->e[i], r->buf[i], lens[i], &h[i]);
        if (wfail[i]) {
            /* no data lost silently: a failed write is not readable */
            ZT_EQ_INT(rc, -EINVAL);
            ZT_CONTAINS(zn_last_error(), "were written");
        } else if (rc) {
            ZT_SETUP_FAIL("submit read: %s", zn_last_error());
        }
    }
    for (int i = 0; i < NT; i++) {
        if (!h[i])
            continue;
        int rc = zn_aio_wait(r->a, h[i]);
        if (rc) {
            fails++;
            *code = rc;
            *failed_tensor = i;
            *failed_write = 0;
            snprintf(msg, msgn, "%s", zn_last_error());
        } else {
            *wrong += tn_wrong(r->buf[i], lens[i], seed + (uint64_t)i, 0);
        }
    }
    return fails;
}

static void run(int force_threads, const char *dir)
{
    rig_t r;
    zn_aio_config c = zn_aio_config_default();
    c.block_size = BS;
    c.queue_depth = 4;
    c.force_threads = force_threads;
    c.threads = 3;
    if (zn_aio_create(&r.a, &c))
        ZT_SETUP_FAIL("zn_aio_create: %s", zn_last_error());
    printf("# %s\n", zn_aio_backend_desc(r.a));
    r.s = tn_swap(r.a, dir, 8u << 20);
    for (int i = 0; i < NT; i++) {
        if (zn_swap_alloc(r.s, lens[i], names[i], &r.e[i]))
            ZT_SETUP_FAIL("alloc: %s", zn_last_error());
        r.buf[i] = tn_alloc(lens[i]);
    }
    int code = 0, ft = -1, fw = 0;
    char msg[1024];
    size_t wrong;
    /* A clean run counts the completions. */
    zn_aio_reset_stats(r.a);
    ZT_EQ_INT(workload(&r, 1, &code, msg, sizeof msg, &wrong, &ft, &fw), 0);
    ZT_EQ_U64(wrong, 0);
    zn_aio_stats st;
    zn_aio_get_stats(r.a, &st);
    uint64_t total = st.blocks;
    ZT_CHECK(total >= 2 * NT);

    static const int kinds[] = { -EIO, -ENOSPC, 1 /* short count */ };
    for (size_t k = 0; k < 3; k++) {
        int bad_msgs = 0, bad_counts = 0, bad_codes = 0;
        size_t bad_bytes = 0;
        for (uint64_t n = 1; n <= total; n++) {
            int res = kinds[k] > 0 ? 4096 * 3 + 5 : kinds[k];
            zn_aio_inject_fault(r.a, n, res);
            zn_aio_reset_stats(r.a);
            code = 0;
            ft = -1;
            int fails = workload(&r, 100 * n + k, &code, msg, sizeof msg, &wrong, &ft, &fw);
            zn_aio_inject_fault(r.a, 0, 0);
            bad_bytes += wrong;
            zn_aio_get_stats(r.a, &st);
            if (kinds[k] > 0) {
                bad_counts += fails != 0;
                if (st.resubmits < 1)
                    bad_counts++;
                continue;
            }
            if (fails != 1) {
                bad_counts++;
                continue;
            }
            bad_codes += code != kinds[k];
            if (!strstr(msg, names[ft]) || !strstr(msg, zn_swap_file_path(r.s, 0)) ||
                !strstr(msg, "at offset") || !strstr(msg, fw ? "writing" : "reading"))
                bad_msgs++;
            if (bad_msgs == 1 && n == 1)
                printf("# message: %s\n", msg);
            /* Usable afterwards: the failed tensor is rewritten and read. */
            zn_aio_handle h;
            tn_fill(r.buf[ft], lens[ft], 7, 0);
            int rc1 = zn_aio_submit_write(r.a, &r.e[ft], r.buf[ft], lens[ft], &h);
            int rc2 = rc1 ? rc1 : zn_aio_wait(r.a, h);
            memset(r.buf[ft], 0, lens[ft]);
            int rc3 = zn_aio_submit_read(r.a, &r.e[ft], r.buf[ft], lens[ft], &h);
            int rc4 = rc3 ? rc3 : zn_aio_wait(r.a, h);
            bad_counts += rc1 || rc2 || rc3 || rc4;
            bad_bytes += tn_wrong(r.buf[ft], lens[ft], 7, 0);
        }
        ZT_CHECK_MSG(bad_counts == 0, "kind %d: %d runs with the wrong number of failures",
                     kinds[k], bad_counts);
        ZT_CHECK_MSG(bad_codes == 0, "kind %d: %d runs with the wrong code", kinds[k], bad_codes);
        ZT_CHECK_MSG(bad_msgs == 0, "kind %d: %d messages without tensor/file/offset (last: %s)",
                     kinds[k], bad_msgs, msg);
        ZT_CHECK_MSG(bad_bytes == 0, "kind %d: %zu wrong bytes in requests that succeeded",
                     kinds[k], bad_bytes);
        printf("# kind %d: swept %llu completions\n", kinds[k], (unsigned long long)total);
    }

    /* A hook sees every completion and can fail one file offset. */
    zn_aio_destroy(NULL);
    for (int i = 0; i < NT; i++)
        free(r.buf[i]);
    zn_swap_destroy(r.s);
    zn_aio_destroy(r.a);
}

static uint64_t hook_off;
static int hook_calls;
static int hook(void *user, const zn_aio_fault_site *s)
{
    (void)user;
    __atomic_add_fetch(&hook_calls, 1, __ATOMIC_RELAXED);
    if (!s->is_write && s->offset == hook_off)
        return -EIO;
    return s->res;
}

static void run_hook(const char *dir)
{
    zn_aio_config c = zn_aio_config_default();
    c.block_size = BS;
    c.fault_hook = hook;
    zn_aio *a;
    if (zn_aio_create(&a, &c))
        ZT_SETUP_FAIL("zn_aio_create: %s", zn_last_error());
    zn_swap *s = tn_swap(a, dir, 4u << 20);
    zn_extent e;
    size_t n = 4 * BS;
    ZT_EQ_INT(zn_swap_alloc(s, n, "hooked", &e), 0);
    unsigned char *buf = tn_alloc(n);
    tn_fill(buf, n, 3, 0);
    hook_off = e.offset + 2 * BS;
    zn_aio_handle h;
    ZT_EQ_INT(zn_aio_submit_write(a, &e, buf, n, &h), 0);
    ZT_EQ_INT(zn_aio_wait(a, h), 0);
    ZT_EQ_INT(zn_aio_submit_read(a, &e, buf, n, &h), 0);
    ZT_EQ_INT(zn_aio_wait(a, h), -EIO);
    char want[64];
    snprintf(want, sizeof want, "at offset %llu", (unsigned long long)hook_off);
    ZT_CONTAINS(zn_last_error(), want);
    ZT_CONTAINS(zn_last_error(), "hooked");
    ZT_CHECK(hook_calls >= 5);
    free(buf);
    zn_swap_destroy(s);
    zn_aio_destroy(a);
}

int main(void)
{
    const char *dir = tn_tmpdir("fault");
    run(0, dir);
    run(1, dir);
    run_hook(dir);
    return zt_done();
}
