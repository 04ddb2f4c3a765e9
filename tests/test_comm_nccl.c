/* The NCCL device part with one GPU (world size 1, backend "nccl"): every
 * collective on device buffers on the comm stream, ordered against another
 * stream with an event, checked against the expected bytes; skipped (77)
 * without NCCL or without a GPU. Multi-GPU runs use `zinc bench comm
 * --device auto` under mpirun/torchrun, which verifies its data too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/comm.h"
#include "zinc/device.h"
#include "comm/comm-impl.h"
#include "zn_build_config.h"
#include "zt.h"

int main(void)
{
#if !ZN_HAVE_NCCL
    ZT_SKIP("zinc is built without NCCL");
#else
    zn_dev_config dc = zn_dev_config_default();
    dc.name = "cuda:0";
    dc.gpu_budget = 256u << 20;
    zn_dev *dev = NULL;
    int rc = zn_dev_create(&dev, &dc);
    if (rc == ZN_ENODEV)
        ZT_SKIP("no GPU: %s", zn_last_error());
    if (rc)
        ZT_SETUP_FAIL("cuda device: %s", zn_last_error());
    zn_launch_info li;
    memset(&li, 0, sizeof li);
    li.world_size = li.local_size = 1;
    zn_comm_config cfg = zn_comm_config_default();
    cfg.backend = "nccl";
    cfg.launch = &li;
    cfg.dev = dev;
    cfg.timeout_s = 60;
    zn_comm *c = NULL;
    rc = zn_comm_create(&c, &cfg);
    ZT_EQ_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "%s\n", zn_last_error());
        zn_dev_destroy(dev);
        return zt_done();
    }
    zn_comm_info info;
    zn_comm_get_info(c, &info);
    ZT_EQ_STR(info.dev_backend, "nccl");
    ZT_EQ_INT(info.nccl, 1);
    printf("%s\n", info.version);

    const size_t n = 1000003;
    float *h = malloc(n * 4), *back = malloc(n * 4);
    uint16_t *hb = malloc(n * 2), *backb = malloc(n * 2);
    if (!h || !back || !hb || !backb)
        ZT_SETUP_FAIL("out of memory");
    for (size_t i = 0; i < n; i++) {
        h[i] = (float)((int)(i % 17) - 8);
        hb[i] = zn_bf16_round(h[i]);
    }
    void *d1 = NULL, *d2 = NULL;
    if (zn_dev_alloc(dev, n * 4, "a", &d1) || zn_dev_alloc(dev, n * 4, "b", &d2))
        ZT_SETUP_FAIL("alloc: %s", zn_last_error());
    zn_stream *compute = NULL, *cs = zn_comm_stream(c);
    zn_event *ev = NULL;
    if (zn_dev_stream_create(dev, "compute", &compute) || zn_dev_event_create(dev, &ev))
        ZT_SETUP_FAIL("stream/event: %s", zn_last_error());

    /* Upload on the compute stream; the comm stream waits on an event. */
    const char *names[] = { "allreduce", "allgather", "reduce-scatter", "broadcast" };
    for (int op = 0; op < 4; op++) {
        for (int bf = 0; bf < 2; bf++) {
            zn_dtype dt = bf ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
            size_t es = zn_dtype_size(dt);
            rc = zn_dev_copy_h2d(dev, compute, d1, bf ? (void *)hb : (void *)h, n * es);
            rc = rc ? rc : zn_dev_memset(dev, compute, d2, 0xff, n * es);
            rc = rc ? rc : zn_dev_event_record(dev, ev, compute);
            rc = rc ? rc : zn_dev_stream_wait_event(dev, cs, ev);
            if (!rc) {
                switch (op) {
                case 0: rc = zn_comm_allreduce_on(c, NULL, d1, d2, n, dt, ZN_REDUCE_SUM); break;
                case 1: rc = zn_comm_allgather_on(c, NULL, d1, d2, n, dt); break;
                case 2: rc = zn_comm_reduce_scatter_on(c, NULL, d1, d2, n, dt, ZN_REDUCE_MAX);
                        break;
                default:
                    rc = zn_dev_copy_d2d(dev, cs, d2, d1, n * es);
                    rc = rc ? rc : zn_comm_broadcast_on(c, NULL, d2, n * es, 0);
                    break;
                }
            }
            rc = rc ? rc : zn_dev_copy_d2h(dev, cs, bf ? (void *)backb : (void *)back, d2,
                                           n * es);
            rc = rc ? rc : zn_comm_sync_on(c, NULL);
            ZT_CHECK_MSG(rc == 0, "%s %s: %s", names[op], zn_dtype_name(dt), zn_last_error());
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += bf ? backb[i] != hb[i] : back[i] != h[i];
            ZT_CHECK_MSG(bad == 0, "%s %s: %zu of %zu wrong", names[op], zn_dtype_name(dt), bad,
                         n);
        }
    }
    /* Host buffers go through the host part (single). */
    float x[4] = { 1, 2, 3, 4 }, y[4];
    ZT_EQ_INT(zn_comm_allreduce(c, x, y, 4, ZN_DTYPE_F32, ZN_REDUCE_SUM), 0);
    ZT_CHECK(y[3] == 4);

    zn_dev_event_destroy(dev, ev);
    zn_dev_stream_destroy(dev, compute);
    zn_dev_free(dev, d1);
    zn_dev_free(dev, d2);
    zn_comm_destroy(c);
    zn_dev_destroy(dev);
    free(h);
    free(back);
    free(hb);
    free(backb);
    return zt_done();
#endif
}
