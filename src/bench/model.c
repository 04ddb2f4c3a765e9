/* zinc bench model's measuring half: times the decoder's blocks (one
 * layer's forward and backward with recompute, the head's chunked
 * cross-entropy) on the chosen device with parameters resident
 * (zn_model_probe_blocks), and the device's GEMM peak in the same run, and
 * turns both into TFLOP/s. Only one layer (plus the embedding and head) is
 * allocated: every layer has the same shapes, so a 14B model's layer can be
 * timed on a 24 GB GPU. */
#include <math.h>
#include <string.h>

#include "zinc/bench.h"
#include "zinc/device.h"
#include "zinc/model.h"

/* The GEMM ceiling on this device in this run: a square product in the
 * model's dtype (bf16 -> bf16 on CUDA, f32 on host), best of iters after a
 * warm-up; one element checked (0.01 * 0.02 * n), *wrong counting a miss.
 * No room for the three matrices leaves the peak 0. */
static void gemm_peak(zn_dev *dev, zn_event *ev[2], zn_dtype dt, int64_t S, int iters,
                      double *peak, uint64_t *wrong)
{
    void *gA = NULL, *gB = NULL, *gC = NULL;
    size_t es = zn_dtype_size(dt);
    *peak = 0;
    if (!zn_dev_alloc(dev, (size_t)(S * S) * es, "gemm A", &gA) &&
        !zn_dev_alloc(dev, (size_t)(S * S) * es, "gemm B", &gB) &&
        !zn_dev_alloc(dev, (size_t)(S * S) * es, "gemm C", &gC)) {
        zn_dev_fill(dev, NULL, gA, dt, S * S, 0.01f);
        zn_dev_fill(dev, NULL, gB, dt, S * S, 0.02f);
        for (int it = 0; it <= iters; it++) {
            float ms;
            zn_dev_event_record(dev, ev[0], NULL);
            int rc = zn_dev_gemm(dev, NULL, ZN_NOTRANS, ZN_TRANS, S, S, S, 1.0f, gA, dt, S, gB,
                                 dt, S, 0.0f, gC, dt, S);
            zn_dev_event_record(dev, ev[1], NULL);
            if (rc || (rc = zn_dev_stream_sync(dev, NULL)))
                break;
            zn_dev_event_elapsed_ms(dev, ev[0], ev[1], &ms);
            if (it > 0 && ms > 0)
                *peak = fmax(*peak, 2.0 * (double)S * S * S / (ms * 1e-3) / 1e12);
        }
        float c0 = 0;
        uint16_t hb;
        if (dt == ZN_DTYPE_F32) {
            zn_dev_copy_d2h(dev, NULL, &c0, gC, 4);
        } else {
            zn_dev_copy_d2h(dev, NULL, &hb, gC, 2);
        }
        zn_dev_stream_sync(dev, NULL);
        if (dt != ZN_DTYPE_F32) {
            uint32_t u = (uint32_t)hb << 16;
            memcpy(&c0, &u, 4);
        }
        if (fabs(c0 - 0.0002 * (double)S) > 0.02 * 0.0002 * (double)S)
            (*wrong)++;
    }
    zn_dev_sync(dev);
    zn_dev_free(dev, gA);
    zn_dev_free(dev, gB);
    zn_dev_free(dev, gC);
}

/* The table's rows from the best times (ms): forward alone is a third of
 * the model FLOPs; the backward with recompute runs a forward again plus
 * the two backward thirds. */
static void fill_rows(const zn_bench_model_config *c, const double best[3],
                      zn_bench_model_result *r)
{
    const zn_model_dims *d = &c->dims;
    double lf = zn_model_flops(d, 1, c->batch, c->seq);
    double hf = zn_model_flops(d, d->n_layers + 1, c->batch, c->seq);
    double L = (double)d->n_layers;
    zn_bench_model_row rows[4] = {
        { "layer fwd", best[0], lf / 3, lf / 3, 0 },
        { "layer bwd", best[1], lf * 2 / 3, c->checkpoint ? lf : lf * 2 / 3, 0 },
        { "head f+b", best[2], hf, hf * 4 / 3, 0 },
        { "model step", best[0] * L + best[1] * L + best[2], zn_model_flops(d, -1, c->batch, c->seq),
          (c->checkpoint ? lf * 4 / 3 : lf) * L + hf * 4 / 3, 0 },
    };
    for (int i = 0; i < 4; i++) {
        /* the FLOPs in, TFLOP/s out */
        rows[i].model_tflops = rows[i].model_tflops / (rows[i].ms * 1e-3) / 1e12;
        rows[i].hw_tflops = rows[i].hw_tflops / (rows[i].ms * 1e-3) / 1e12;
        rows[i].ratio = r->peak_tflops > 0 ? rows[i].hw_tflops / r->peak_tflops : 0.0;
        r->rows[i] = rows[i];
    }
}

int zn_bench_model_run(const zn_bench_model_config *c, zn_bench_model_result *out)
{
    memset(out, 0, sizeof *out);
    zn_dev *dev = NULL;
    zn_event *ev[2] = { 0 };
    int rc;
    if ((rc = zn_dev_create(&dev, &c->dev))) {
        zn_error_prefix(rc, "device");
        goto out;
    }
    zn_model_config mc = zn_model_config_default(dev);
    if (c->dtype >= 0)
        mc.dtype = (zn_dtype)c->dtype;
    zn_model_probe_opts po = { .batch = c->batch, .seq = c->seq, .dtype = mc.dtype,
                               .checkpoint = c->checkpoint, .attention = c->attention,
                               .iters = c->iters };
    zn_model_probe pr;
    if ((rc = zn_model_probe_blocks(dev, &c->dims, &po, &pr))) {
        zn_error_prefix(rc, "model");
        goto out;
    }
    for (int i = 0; i < 2; i++)
        if ((rc = zn_dev_event_create_timed(dev, &ev[i]))) {
            zn_error_prefix(rc, "events");
            goto out;
        }
    double best[3] = { pr.layer_fwd_s * 1e3, pr.layer_bwd_s * 1e3, pr.head_s * 1e3 };
    out->dtype = mc.dtype;
    out->fused = pr.fused;
    out->loss = pr.loss;
    out->want_loss = pr.want_loss;
    out->wrong = pr.wrong;
    out->tokens = c->batch * c->seq;
    zn_dev_get_info(dev, &out->dev);
    out->gemm_n = out->dev.kind == ZN_DEV_CUDA ? 8192 : 1024;
    gemm_peak(dev, ev, mc.dtype, out->gemm_n, c->iters, &out->peak_tflops, &out->wrong);
    fill_rows(c, best, out);
out:
    for (int i = 0; i < 2; i++)
        zn_dev_event_destroy(dev, ev[i]);
    if (dev)
        zn_dev_sync(dev);
    zn_dev_destroy(dev);
    return rc;
}
