/* The extent allocator under random alloc/free against a shadow map (no
 * overlap, alignment, stripe rules, coalescing back to one range), its
 * fragmentation and exhaustion errors, and the same through a real swap
 * space (messages name the tensor and the sizes). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "nvme/nvme-impl.h"
#include "test_nvme_common.h"

#define UNIT 4096ull
#define STRIPE (64 * 1024ull)
#define NSTRIPES 256ull
#define CAP (NSTRIPES * STRIPE)

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

typedef struct {
    uint64_t off, got;
} live_t;

static void check_free_list(const zn_extalloc *x)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < x->nfree; i++) {
        sum += x->free[i].len;
        if (i) {
            /* sorted, disjoint and coalesced: a gap between any two */
            ZT_CHECK_MSG(x->free[i - 1].start + x->free[i - 1].len < x->free[i].start,
                         "free ranges %zu and %zu touch or overlap", i - 1, i);
        }
    }
    ZT_EQ_U64(sum + x->used, x->capacity);
}

static void random_ops(void)
{
    zn_extalloc x;
    ZT_EQ_INT(zn_extalloc_init(&x, CAP, UNIT, STRIPE), 0);
    static unsigned char owner[CAP / UNIT]; /* 0 free, else slot + 1 (mod 255) */
    live_t live[600];
    int nlive = 0, fails = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        int do_alloc = nlive == 0 || (nlive < 600 && rnd() % 100 < 55);
        if (do_alloc) {
            /* sizes: tiny, around a stripe, several stripes */
            uint64_t r = rnd() % 10, bytes;
            if (r < 4)
                bytes = 1 + rnd() % (STRIPE - 1);
            else if (r < 8)
                bytes = STRIPE - 2 * UNIT + rnd() % (4 * UNIT);
            else
                bytes = 1 + rnd() % (6 * STRIPE);
            uint64_t off, got;
            int rc = zn_extalloc_alloc(&x, bytes, &off, &got);
            if (rc == -ENOSPC) {
                fails++;
                continue;
            }
            if (rc) {
                ZT_FAIL_AT("alloc rc %d", rc);
                break;
            }
            if (got < bytes || got % UNIT || off % UNIT || off + got > CAP)
                bad++;
            if (got >= STRIPE && off % STRIPE)
                bad++; /* big extents start on a stripe */
            if (got < STRIPE && off / STRIPE != (off + got - 1) / STRIPE)
                bad++; /* small ones never cross one */
            for (uint64_t u = off / UNIT; u < (off + got) / UNIT; u++) {
                if (owner[u])
                    bad++;
                owner[u] = 1;
            }
            live[nlive++] = (live_t){ off, got };
        } else {
            int i = (int)(rnd() % (uint64_t)nlive);
            ZT_EQ_INT(zn_extalloc_free(&x, live[i].off, live[i].got), 0);
            for (uint64_t u = live[i].off / UNIT; u < (live[i].off + live[i].got) / UNIT; u++)
                owner[u] = 0;
            live[i] = live[--nlive];
        }
        if (it % 1000 == 0)
            check_free_list(&x);
    }
    ZT_CHECK_MSG(bad == 0, "%d placement violations", bad);
    ZT_CHECK_MSG(fails > 0, "the workload never ran out of space; it should have (%d)", fails);
    /* Double free and freeing free space are refused. */
    if (nlive) {
        ZT_EQ_INT(zn_extalloc_free(&x, live[0].off, live[0].got), 0);
        ZT_EQ_INT(zn_extalloc_free(&x, live[0].off, live[0].got), -EINVAL);
        live[0] = live[--nlive];
    }
    while (nlive) {
        ZT_EQ_INT(zn_extalloc_free(&x, live[nlive - 1].off, live[nlive - 1].got), 0);
        nlive--;
    }
    ZT_EQ_U64(x.nfree, 1);
    ZT_EQ_U64(x.free[0].start, 0);
    ZT_EQ_U64(x.free[0].len, CAP);
    ZT_EQ_U64(x.used, 0);
    ZT_CHECK(x.peak > CAP / 2);
    zn_extalloc_fini(&x);
}

static void fragmentation(void)
{
    zn_extalloc x;
    ZT_EQ_INT(zn_extalloc_init(&x, 8 * STRIPE, UNIT, STRIPE), 0);
    uint64_t off[8], got;
    for (int i = 0; i < 8; i++)
        ZT_EQ_INT(zn_extalloc_alloc(&x, STRIPE, &off[i], &got), 0);
    uint64_t o2;
    ZT_EQ_INT(zn_extalloc_alloc(&x, 1, &o2, &got), -ENOSPC);
    /* Free every other stripe: half is free, but no two stripes in a row. */
    for (int i = 0; i < 8; i += 2)
        ZT_EQ_INT(zn_extalloc_free(&x, off[i], STRIPE), 0);
    ZT_EQ_U64(zn_extalloc_largest(&x), STRIPE);
    ZT_EQ_INT(zn_extalloc_alloc(&x, 2 * STRIPE, &o2, &got), -ENOSPC);
    /* Free a neighbour: the holes coalesce and two stripes fit. */
    ZT_EQ_INT(zn_extalloc_free(&x, off[1], STRIPE), 0);
    ZT_EQ_U64(zn_extalloc_largest(&x), 3 * STRIPE);
    ZT_EQ_INT(zn_extalloc_alloc(&x, 2 * STRIPE, &o2, &got), 0);
    ZT_EQ_U64(o2 % STRIPE, 0);
    /* Best fit: a small request goes into the smallest hole (stripe 4 or
     * 6, one stripe each), not the leftover of the big one. */
    uint64_t o3;
    ZT_EQ_INT(zn_extalloc_alloc(&x, UNIT, &o3, &got), 0);
    ZT_CHECK_MSG(o3 == off[4] || o3 == off[6] || o3 == o2 + 2 * STRIPE,
                 "small extent at %llu", (unsigned long long)o3);
    zn_extalloc_fini(&x);
}

static void through_swap(void)
{
    const char *dir = tn_tmpdir("alloc");
    zn_aio_config c = zn_aio_config_default();
    c.block_size = STRIPE;
    zn_aio *a;
    if (zn_aio_create(&a, &c))
        ZT_SETUP_FAIL("zn_aio_create: %s", zn_last_error());
    zn_swap *s = tn_swap(a, dir, 16 * STRIPE);
    zn_swap_stats st;
    zn_swap_get_stats(s, &st);
    ZT_EQ_U64(st.capacity, 16 * STRIPE);
    zn_extent e[4];
    ZT_EQ_INT(zn_swap_alloc(s, 5 * STRIPE, "layers.0.mlp.w1", &e[0]), 0);
    ZT_EQ_INT(zn_swap_alloc(s, 5 * STRIPE, "layers.0.mlp.w2", &e[1]), 0);
    ZT_EQ_INT(zn_swap_alloc(s, 5 * STRIPE, "layers.0.mlp.w3", &e[2]), 0);
    int rc = zn_swap_alloc(s, 2 * STRIPE, "layers.1.attn.q_proj.exp_avg", &e[3]);
    ZT_EQ_INT(rc, -ENOSPC);
    ZT_CONTAINS(zn_last_error(), "layers.1.attn.q_proj.exp_avg");
    ZT_CONTAINS(zn_last_error(), "131072 bytes");   /* asked */
    ZT_CONTAINS(zn_last_error(), "65536 bytes");    /* free */
    ZT_CONTAINS(zn_last_error(), dir);
    zn_swap_get_stats(s, &st);
    ZT_EQ_U64(st.used, 15 * STRIPE);
    ZT_EQ_U64(st.extents, 3);
    /* Free, double free, stale extent. */
    ZT_EQ_INT(zn_swap_free(s, &e[1]), 0);
    ZT_EQ_INT(zn_swap_free(s, &e[1]), -EINVAL);
    char buf[16] = { 0 };
    zn_aio_handle h;
    ZT_EQ_INT(zn_aio_submit_write(a, &e[1], buf, sizeof buf, &h), -EINVAL);
    ZT_CONTAINS(zn_last_error(), "not live");
    ZT_EQ_INT(zn_swap_alloc(s, 2 * STRIPE, "layers.1.attn.q_proj.exp_avg", &e[3]), 0);
    zn_swap_get_stats(s, &st);
    ZT_EQ_U64(st.peak_used, 15 * STRIPE);
    ZT_EQ_INT(zn_swap_alloc(s, 0, "empty", &e[1]), -EINVAL);
    zn_swap_destroy(s);
    zn_aio_destroy(a);
}

int main(void)
{
    random_ops();
    fragmentation();
    through_swap();
    return zt_done();
}
