/* GQA in 16-bit: the gradients of K and V sum over the heads of a group.
 * They are summed in fp32 and rounded once (Qwen2.5-7B has 7 query heads
 * per KV head: as many bf16 roundings otherwise). A decoder layer with 16
 * query heads on 1 KV head runs in bf16 and, from the same (bf16) weights
 * and inputs, in fp32 on the host backend, and the bf16 weight gradients
 * of k_proj and v_proj are compared with the fp32 ones (relative L2).
 * Measured (seeded, deterministic): q_proj 6.29e-3 (no group sum, for
 * scale), k_proj 6.08e-3, v_proj 3.82e-3 with the fp32 sum; a bf16 running
 * sum (the code before) gave k_proj 6.28e-3 and v_proj 5.87e-3. The weight
 * gradient sums over the tokens, which averages much of the rounding away,
 * so the bound on v_proj (4.8e-3) sits between the two; k_proj's error is
 * dominated by the bf16 softmax gradient and gets the loose bound. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "zt.h"

enum { B = 2, T = 64 };

static double rel_l2(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

int main(void)
{
    zn_dev_config dc = zn_dev_config_default();
    dc.name = "host";
    dc.gpu_budget = 256u << 20;
    zn_dev *dev;
    if (zn_dev_create(&dev, &dc))
        ZT_SETUP_FAIL("host device: %s", zn_last_error());
    zn_model_dims d;
    zn_model_dims_default(&d);
    d.hidden = 128;
    d.n_layers = 1;
    d.n_heads = 16;
    d.n_kv_heads = 1;
    d.head_dim = 8;
    d.intermediate = 256;
    d.vocab = 96;
    ZT_EQ_INT(zn_model_dims_validate(&d), 0);
    zn_model *m[2] = { NULL, NULL };
    zn_model_state *st[2] = { NULL, NULL };
    zn_dtype dts[2] = { ZN_DTYPE_BF16, ZN_DTYPE_F32 };
    for (int k = 0; k < 2; k++) {
        zn_model_config mc = zn_model_config_default(dev);
        mc.dtype = dts[k];
        mc.max_batch = B;
        mc.max_seq = T;
        ZT_EQ_INT(zn_model_create(&m[k], dev, &d, &mc), 0);
        ZT_EQ_INT(zn_model_state_create(&st[k], m[k], 1), 0);
    }
    /* bf16 weights; the fp32 model gets them widened */
    ZT_EQ_INT(zn_model_state_init_random(st[0], 7), 0);
    for (int b = 0; b < zn_model_num_blocks(&d); b++)
        for (int i = 0; i < zn_model_block_nparams(&d, b); i++) {
            zn_param_info pi;
            zn_model_block_param(&d, b, i, &pi);
            if (pi.owner_block < 0)
                ZT_EQ_INT(zn_dev_cast(dev, NULL, zn_model_state_params(st[0], b)[i],
                                      ZN_DTYPE_BF16, zn_model_state_params(st[1], b)[i],
                                      ZN_DTYPE_F32, pi.numel), 0);
        }
    int32_t ids[B * T], tg[B * T];
    uint64_t r = 99;
    for (int i = 0; i < B * T; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((r >> 33) % (uint64_t)d.vocab);
        tg[i] = (int32_t)((r >> 17) % (uint64_t)d.vocab);
    }
    for (int k = 0; k < 2; k++) {
        float loss;
        ZT_EQ_INT(zn_model_set_batch(m[k], NULL, B, T, ids, tg, NULL), 0);
        ZT_EQ_INT(zn_model_state_forward_backward(st[k], NULL, &loss), 0);
    }
    ZT_EQ_INT(zn_dev_stream_sync(dev, NULL), 0);
    const char *want[] = { "q_proj", "k_proj", "v_proj" };
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < zn_model_block_nparams(&d, 1); i++) {
            zn_param_info pi;
            zn_model_block_param(&d, 1, i, &pi);
            if (!strstr(pi.name, want[w]) || !strstr(pi.name, "weight"))
                continue;
            /* device buffers: read through copies (ZINC_DEVICE_GUARD) */
            float *g16 = malloc((size_t)pi.numel * 4), *g32 = malloc((size_t)pi.numel * 4);
            ZT_EQ_INT(zn_dev_copy_d2h(dev, NULL, g16, zn_model_state_grads(st[0], 1)[i],
                                      (size_t)pi.numel * 4), 0);
            ZT_EQ_INT(zn_dev_copy_d2h(dev, NULL, g32, zn_model_state_grads(st[1], 1)[i],
                                      (size_t)pi.numel * 4), 0);
            ZT_EQ_INT(zn_dev_stream_sync(dev, NULL), 0);
            double e = rel_l2(g16, g32, pi.numel);
            free(g16), free(g32);
            printf("%-40s bf16 vs fp32 gradient: rel L2 %.2e\n", pi.name, e);
            double bound = w == 2 ? 4.8e-3 : 1.2e-2;
            ZT_CHECK_MSG(e <= bound, "%s: bf16 gradient off the fp32 one by %.2e > %.1e (the "
                         "group's heads summed in bf16?)", pi.name, e, bound);
        }
    for (int k = 0; k < 2; k++) {
        zn_model_state_destroy(st[k]);
        zn_model_destroy(m[k]);
    }
    zn_dev_destroy(dev);
    return zt_done();
}
