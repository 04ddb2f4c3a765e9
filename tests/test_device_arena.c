/* Host-only parts of the device layer: the arena allocator (alignment, best
 * fit, coalescing, no overlap under a random alloc/free storm), device
 * creation by name ("cuda" without a GPU is ZN_ENODEV with the CUDA error
 * text, "auto" falls back to host), pinned-memory accounting, and the
 * argument checks that refuse bad calls before anything is queued. */
#include <stdlib.h>

#include "zt.h"
#include "zinc/device.h"
#include "gpu/gpu-impl.h"
#include "zn_build_config.h"

static void test_arena(void)
{
    enum { SIZE = 1 << 20, N = 200 };
    static unsigned char mem[SIZE + 4096];
    zn_arena a;
    ZT_EQ_INT(zn_arena_init(&a, mem + 7, SIZE), 0);     /* misaligned base */
    ZT_CHECK(a.base % ZN_DEV_ALIGN == 0);
    ZT_CHECK(a.size <= SIZE && a.size >= SIZE - ZN_DEV_ALIGN);

    /* best fit: free a 4 KiB hole and a 1 KiB hole, a 1 KiB request takes
     * the 1 KiB hole */
    void *p[6];
    for (int i = 0; i < 6; i++)
        p[i] = zn_arena_alloc(&a, i % 2 ? 4096 : 1024);
    for (int i = 0; i < 6; i++)
        ZT_CHECK(p[i] && (uintptr_t)p[i] % ZN_DEV_ALIGN == 0);
    zn_arena_free(&a, p[1]);   /* 4096 hole */
    zn_arena_free(&a, p[4]);   /* 1024 hole */
    void *q = zn_arena_alloc(&a, 1000);
    ZT_CHECK_MSG(q == p[4], "best fit took %p, expected the 1 KiB hole %p", q, p[4]);
    ZT_EQ_U64(zn_arena_free(&a, q), 1024);              /* rounded to 256 */
    ZT_EQ_U64(zn_arena_free(&a, q), 0);                 /* double free is refused */
    for (int i = 0; i < 6; i++)
        if (i != 1 && i != 4)
            zn_arena_free(&a, p[i]);
    size_t blocks, fb;
    zn_arena_counts(&a, &blocks, &fb);
    ZT_CHECK_MSG(blocks == 1 && fb == 1, "after freeing all: %zu blocks, %zu free (coalescing)",
                 blocks, fb);
    ZT_EQ_U64(a.used, 0);
    ZT_EQ_U64(zn_arena_largest_free(&a), a.size);

    /* random storm: live blocks never overlap, used is their sum */
    void *live[N] = { 0 };
    uint64_t sz[N] = { 0 };
    uint32_t rng = 12345;
    int overlaps = 0, acct = 0;
    for (int it = 0; it < 20000; it++) {
        rng = rng * 1664525u + 1013904223u;
        int i = (int)((rng >> 8) % N);
        if (live[i]) {
            zn_arena_free(&a, live[i]);
            live[i] = NULL;
        } else {
            sz[i] = 1 + (rng >> 12) % 20000;
            live[i] = zn_arena_alloc(&a, sz[i]);
            if (live[i])
                memset(live[i], i, sz[i]);
        }
        if (it % 997 == 0) {
            uint64_t sum = 0;
            for (int x = 0; x < N; x++) {
                if (!live[x])
                    continue;
                sum += (sz[x] + ZN_DEV_ALIGN - 1) / ZN_DEV_ALIGN * ZN_DEV_ALIGN;
                for (int y = x + 1; y < N; y++)
                    if (live[y] && (char *)live[x] < (char *)live[y] + sz[y] &&
                        (char *)live[y] < (char *)live[x] + sz[x])
                        overlaps++;
                const unsigned char *b = live[x];
                if (b[0] != (unsigned char)x || b[sz[x] - 1] != (unsigned char)x)
                    overlaps++;
            }
            acct += sum != a.used;
        }
    }
    ZT_EQ_INT(overlaps, 0);
    ZT_EQ_INT(acct, 0);
    for (int i = 0; i < N; i++)
        if (live[i])
            zn_arena_free(&a, live[i]);
    zn_arena_counts(&a, &blocks, &fb);
    ZT_CHECK_MSG(blocks == 1 && fb == 1, "after the storm: %zu blocks, %zu free", blocks, fb);
    ZT_CHECK(a.peak > 0 && a.peak <= a.size);
    zn_arena_fini(&a);
}

static void test_names(void)
{
    zn_dev *d = NULL;
    zn_dev_config c = zn_dev_config_default();

    c.name = "tpu";
    ZT_EQ_INT(zn_dev_create(&d, &c), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "tpu");
    c.name = "cuda:x";
    ZT_EQ_INT(zn_dev_create(&d, &c), ZN_ECONFIG);
    ZT_CHECK(d == NULL);

    c.name = "cuda";
    c.gpu_budget = 8u << 20;
    int rc = zn_dev_create(&d, &c);
    int have_gpu = rc == 0;
    if (have_gpu) {
        printf("a GPU answers: %s\n", d->info.name);
        zn_dev_destroy(d);
    } else {
        ZT_EQ_INT(rc, ZN_ENODEV);
#if ZN_HAVE_CUDA
        ZT_CONTAINS(zn_last_error(), "cudaGetDeviceCount");   /* the CUDA error text */
#else
        ZT_CONTAINS(zn_last_error(), "without CUDA");
#endif
        printf("cuda: %s\n", zn_last_error());
    }
    c.name = "auto";
    ZT_EQ_INT(zn_dev_create(&d, &c), 0);
    if (d) {
        ZT_EQ_INT(zn_dev_get_kind(d), have_gpu ? ZN_DEV_CUDA : ZN_DEV_HOST);
        zn_dev_destroy(d);
    }
    c.name = NULL;   /* = auto */
    ZT_EQ_INT(zn_dev_create(&d, &c), 0);
    zn_dev_destroy(d);
    zn_dev_destroy(NULL);
}

static void test_host_device(void)
{
    zn_dev *d = NULL;
    zn_dev_config c = zn_dev_config_default();
    c.name = "host";
    c.gpu_budget = 3u << 20;
    c.cpu_budget = 256u << 10;
    ZT_EQ_INT(zn_dev_create(&d, &c), 0);
    if (!d)
        return;
    zn_dev_info in;
    zn_dev_get_info(d, &in);
    ZT_EQ_INT(in.kind, ZN_DEV_HOST);
    ZT_CONTAINS(in.name, "host");
    zn_dev_mem m;
    zn_dev_mem_stats(d, &m);
    ZT_EQ_U64(m.budget, 3u << 20);

    /* Fragmentation: the message names the largest free block. */
    void *a, *b, *x;
    ZT_EQ_INT(zn_dev_alloc(d, 1u << 20, "a", &a), 0);
    ZT_EQ_INT(zn_dev_alloc(d, 1u << 20, "b", &b), 0);
    ZT_EQ_INT(zn_dev_alloc(d, 1u << 20, "c", &x), 0);
    zn_dev_free(d, a);
    zn_dev_free(d, x);
    ZT_EQ_INT(zn_dev_alloc(d, 2u << 20, "big", &x), ZN_EBUDGET);
    ZT_CONTAINS(zn_last_error(), "largest free block 1048576");
    zn_dev_free(d, b);
    ZT_EQ_INT(zn_dev_alloc(d, 3u << 20, "all", &x), 0);   /* coalesced again */
    zn_dev_free(d, x);
    ZT_EQ_INT(zn_dev_alloc(d, 0, "zero", &x), ZN_EARG);

    /* Pinned memory: alloc and register both count. */
    void *h;
    char *mine = aligned_alloc(4096, 128u << 10);
    ZT_EQ_INT(zn_dev_host_alloc(d, 100u << 10, "h", &h), 0);
    ZT_EQ_INT(zn_dev_host_register(d, mine, 128u << 10, "mine"), 0);
    zn_dev_mem_stats(d, &m);
    ZT_EQ_U64(m.host_used, 228u << 10);
    ZT_EQ_INT(zn_dev_host_register(d, mine, 128u << 10, "again"), ZN_EBUDGET);
    printf("pinned memory page-locked: %s\n", m.host_locked ? "yes" : "no (mlock refused)");
    zn_dev_host_unregister(d, mine);
    zn_dev_host_free(d, h);
    zn_dev_mem_stats(d, &m);
    ZT_EQ_U64(m.host_used, 0);
    ZT_EQ_U64(m.host_peak, 228u << 10);
    zn_dev_reset_peak(d);
    zn_dev_mem_stats(d, &m);
    ZT_EQ_U64(m.host_peak, 0);
    free(mine);

    /* Refused before anything is queued. */
    void *dv;
    ZT_EQ_INT(zn_dev_alloc(d, 4096, "v", &dv), 0);
    ZT_EQ_INT(zn_dev_fill(d, NULL, dv, ZN_DTYPE_F16, 4, 0.0f), ZN_EUNSUPPORTED);
    float on_stack[4];
    ZT_EQ_INT(zn_dev_fill(d, NULL, on_stack, ZN_DTYPE_F32, 4, 0.0f), ZN_EARG);  /* host ptr */
    ZT_CONTAINS(zn_last_error(), "not inside the device arena");
    ZT_EQ_INT(zn_dev_fill(d, NULL, dv, ZN_DTYPE_F32, 1 << 20, 0.0f), ZN_EARG);  /* past the end */
    ZT_CONTAINS(zn_last_error(), "not inside the device arena");
    ZT_EQ_INT(zn_dev_rope_fwd(d, NULL, dv, ZN_DTYPE_F32, 1, 1, 3, 3, dv, dv), ZN_EARG);
    ZT_EQ_INT(zn_dev_swiglu_bwd(d, NULL, dv, dv, dv, dv, (char *)dv + 64, ZN_DTYPE_F32, 4),
              ZN_EARG);
    ZT_EQ_INT(zn_dev_stream_sync(d, NULL), 0);
    zn_dev_free(d, dv);
    zn_dev_free(d, (char *)dv + 256);   /* not an allocation: logged and ignored */
    zn_dev_mem_stats(d, &m);
    ZT_EQ_U64(m.used, 0);
    zn_dev_destroy(d);
}

int main(void)
{
    zn_log_set_level(ZN_LOG_OFF);   /* the ignored-free error is expected */
    test_arena();
    test_names();
    test_host_device();
    return zt_done();
}
