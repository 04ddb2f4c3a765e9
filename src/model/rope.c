/* Each layer's RoPE frequencies: one table for most families; for gemma3
 * and olmo3 the sliding layers' unscaled one beside the full-attention
 * layers' scaled one. Linear and YaRN scaling follow transformers'
 * modeling_rope_utils (_compute_linear_scaling_rope_parameters,
 * _compute_yarn_parameters), in fp32 where it computes in fp32. */
#include <math.h>

#include "zinc/device.h"
#include "zinc/model.h"

/* YaRN's frequencies: each dimension blends the extrapolated (unscaled)
 * and the interpolated (/ factor) frequency by a ramp between the
 * dimensions where beta_fast and beta_slow rotations fit into the
 * original context; truncated to whole dimensions (transformers' default
 * truncate true). */
static void yarn(const zn_model_dims *d, float *inv)
{
    const double pi = 3.14159265358979323846;
    int64_t dim = d->head_dim, half = dim / 2;
    double base = d->rope_theta, orig = (double)d->rope_orig_max_pos;
    double lo = dim * log(orig / (d->rope_beta_fast * 2 * pi)) / (2 * log(base));
    double hi = dim * log(orig / (d->rope_beta_slow * 2 * pi)) / (2 * log(base));
    lo = floor(lo);
    hi = ceil(hi);
    if (lo < 0)
        lo = 0;
    if (hi > (double)(dim - 1))
        hi = (double)(dim - 1);
    if (lo == hi)
        hi += 0.001; /* transformers: prevent the singularity */
    float fac = (float)d->rope_factor, flo = (float)lo, span = (float)(hi - lo);
    for (int64_t i = 0; i < half; i++) {
        float pos = powf((float)base, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pos, inter = 1.0f / (fac * pos);
        float ramp = ((float)i - flo) / span;
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float ef = 1.0f - ramp; /* the extrapolation's share */
        inv[i] = inter * (1.0f - ef) + extra * ef;
    }
}

int zn_model_rope_table(const zn_model_dims *d, int64_t layer, float *inv_freq,
                        double *score_factor)
{
    if (layer < 0 || layer >= d->n_layers)
        return zn_set_error(ZN_EARG, "model: rope table of layer %lld of %lld",
                            (long long)layer, (long long)d->n_layers);
    *score_factor = 1.0;
    if (d->rope_local_theta > 0 && zn_model_layer_slides(d, layer)) {
        zn_rope_inv_freq(inv_freq, d->head_dim, d->rope_local_theta, NULL);
        return 0;
    }
    switch (d->rope_type) {
    case ZN_ROPE_LLAMA3: {
        zn_rope_scaling sc = { d->rope_factor, d->rope_low_freq_factor, d->rope_high_freq_factor,
                               (double)d->rope_orig_max_pos };
        zn_rope_inv_freq(inv_freq, d->head_dim, d->rope_theta, &sc);
        break;
    }
    case ZN_ROPE_LINEAR:
        zn_rope_inv_freq(inv_freq, d->head_dim, d->rope_theta, NULL);
        for (int64_t i = 0; i < d->head_dim / 2; i++)
            inv_freq[i] /= (float)d->rope_factor;
        break;
    case ZN_ROPE_YARN:
        yarn(d, inv_freq);
        *score_factor = d->rope_attn_factor * d->rope_attn_factor;
        break;
    default:
        zn_rope_inv_freq(inv_freq, d->head_dim, d->rope_theta, NULL);
        break;
    }
    return 0;
}
