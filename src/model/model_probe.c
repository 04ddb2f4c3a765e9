/* Timing the decoder's blocks on a device: one layer (every layer has the
 * same shapes) plus the embedding and the head, parameters resident. `zinc
 * bench model` prints it against the GEMM peak; the cost model (zinc/cost.h)
 * takes the compute of a step from it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "zinc/util.h"

int zn_model_probe_blocks(zn_dev *dev, const zn_model_dims *d, const zn_model_probe_opts *o,
                          zn_model_probe *out)
{
    memset(out, 0, sizeof *out);
    if (o->batch < 1 || o->seq < 1 || o->iters < 1)
        return zn_set_error(ZN_EARG, "model probe: batch %lld, seq %lld, iters %d",
                            (long long)o->batch, (long long)o->seq, o->iters);
    zn_model *m = NULL;
    zn_model_state *st = NULL;
    void *x0 = NULL, *x1 = NULL, *dbuf = NULL, *saved = NULL;
    float *sq = NULL;
    int32_t *ids = NULL;
    zn_event *ev[4] = { 0 };
    zn_model_config mc = zn_model_config_default(dev);
    mc.dtype = o->dtype;
    mc.max_batch = o->batch;
    mc.max_seq = o->seq;
    mc.checkpoint = o->checkpoint;
    mc.attention = o->attention;
    zn_model_dims one = *d;
    one.n_layers = 1;
    int rc = zn_model_create(&m, dev, &one, &mc);
    if (!rc)
        rc = zn_model_state_create(&st, m, 1);
    if (!rc)
        rc = zn_model_state_init_random(st, 1);
    uint64_t ab = m ? zn_model_act_bytes(m) : 0;
    if (!rc)
        rc = zn_dev_alloc(dev, ab, "probe x0", &x0);
    if (!rc)
        rc = zn_dev_alloc(dev, ab, "probe x1", &x1);
    if (!rc)
        rc = zn_dev_alloc(dev, ab, "probe dx", &dbuf);
    if (!rc && !o->checkpoint)
        rc = zn_dev_alloc(dev, zn_model_layer_saved_bytes(m), "probe saved", &saved);
    if (!rc)
        rc = zn_dev_alloc(dev, 16, "probe sumsq", (void **)&sq);
    for (int i = 0; i < 4 && !rc; i++)
        rc = zn_dev_event_create_timed(dev, &ev[i]);
    int64_t N = o->batch * o->seq;
    if (!rc && !(ids = malloc((size_t)N * 2 * sizeof *ids)))
        rc = zn_set_error(-12, "model probe: out of memory");
    if (!rc) {
        uint64_t r = 88172645463325252ull;
        for (int64_t i = 0; i < 2 * N; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            ids[i] = (int32_t)(r % (uint64_t)d->vocab);
        }
        rc = zn_model_set_batch(m, NULL, o->batch, o->seq, ids, ids + N, NULL);
    }
    if (rc)
        goto out;

    void *const *pe = zn_model_state_params(st, 0), *const *pl = zn_model_state_params(st, 1),
                *const *ph = zn_model_state_params(st, 2);
    float *const *gl = zn_model_state_grads(st, 1), *const *gh = zn_model_state_grads(st, 2);
    double best[3] = { 1e30, 1e30, 1e30 };
    for (int it = 0; it <= o->iters && !rc; it++) {
        rc = zn_model_embed_fwd(m, NULL, pe, x0);
        if (!rc) rc = zn_dev_event_record(dev, ev[0], NULL);
        if (!rc) rc = zn_model_layer_fwd(m, NULL, 0, pl, x0, x1, saved);
        if (!rc) rc = zn_dev_event_record(dev, ev[1], NULL);
        if (!rc) rc = zn_model_head_fwd(m, NULL, ph, x1);
        if (!rc) rc = zn_model_head_bwd(m, NULL, ph, x1, dbuf, gh);
        if (!rc) rc = zn_dev_event_record(dev, ev[2], NULL);
        if (!rc) rc = zn_model_layer_bwd(m, NULL, 0, pl, x0, saved, dbuf, dbuf, gl);
        if (!rc) rc = zn_dev_event_record(dev, ev[3], NULL);
        if (!rc) rc = zn_dev_stream_sync(dev, NULL);
        if (rc)
            break;
        if (it == 0) {
            zn_model_read_loss(m, NULL, &out->loss);
            continue;  /* warm-up */
        }
        float ms[3] = { 0, 0, 0 };
        zn_dev_event_elapsed_ms(dev, ev[0], ev[1], &ms[0]);
        zn_dev_event_elapsed_ms(dev, ev[2], ev[3], &ms[1]);
        zn_dev_event_elapsed_ms(dev, ev[1], ev[2], &ms[2]);
        for (int k = 0; k < 3; k++)
            best[k] = fmin(best[k], ms[k] * 1e-3);
    }
    if (rc)
        goto out;
    out->layer_fwd_s = best[0];
    out->layer_bwd_s = best[1];
    out->head_s = best[2];
    out->fused = zn_model_attention_fused(d, &mc);

    /* the loss of a 0.02-init model: logits ~ N(0, s2), s2 = 0.02^2 x hidden
     * (unit-RMS normed input), so E[logsumexp] ~ ln(vocab) + s2 / 2 */
    double s2 = 0.0004 * (double)d->hidden;
    out->want_loss = (float)(log((double)d->vocab) + s2 / 2);
    if (!(fabs(out->loss - out->want_loss) < 0.05 + 0.1 * s2))
        out->wrong++;
    float h[4];
    for (int i = 0; i < zn_model_block_nparams(&one, 1); i++) {
        zn_param_info pi;
        zn_model_block_param(&one, 1, i, &pi);
        zn_dev_sumsq(dev, NULL, gl[i], ZN_DTYPE_F32, pi.numel, sq, 0);
        zn_dev_copy_d2h(dev, NULL, h, sq, 4);
        zn_dev_stream_sync(dev, NULL);
        if (!isfinite(h[0]) || (h[0] == 0 && !strstr(pi.name, "bias")))
            out->wrong++;
    }
    zn_dev_sumsq(dev, NULL, x1, mc.dtype, N * d->hidden, sq, 0);
    zn_dev_copy_d2h(dev, NULL, h, sq, 4);
    rc = zn_dev_stream_sync(dev, NULL);
    if (!isfinite(h[0]) || h[0] == 0)
        out->wrong++;
out:
    free(ids);
    for (int i = 0; i < 4; i++)
        zn_dev_event_destroy(dev, ev[i]);
    zn_dev_sync(dev);
    zn_dev_free(dev, x0);
    zn_dev_free(dev, x1);
    zn_dev_free(dev, dbuf);
    zn_dev_free(dev, saved);
    zn_dev_free(dev, sq);
    zn_model_state_destroy(st);
    zn_model_destroy(m);
    return rc;
}
