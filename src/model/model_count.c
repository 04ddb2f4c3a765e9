/* Parameter counts of zn_model_dims: each block's own and frozen
 * parameters, LoRA's adapter shapes, the embedding / lm_head parts the
 * tiers move as units, and the LoRA helpers of a family. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "zinc/model.h"
#include "model/model-impl.h"

int zn_model_num_blocks(const zn_model_dims *d)
{
    return (int)d->n_layers + 2;
}

static uint64_t base_count(const zn_model_dims *d, int block)
{
    uint64_t h = (uint64_t)d->hidden, v = (uint64_t)d->vocab;
    uint64_t qd = (uint64_t)(d->n_heads * d->head_dim), kvd = (uint64_t)(d->n_kv_heads * d->head_dim);
    if (block < 0 || block > d->n_layers + 1)
        return 0;
    if (block == 0)
        return v * h;
    if (block == d->n_layers + 1)
        return h + (d->tie_embeddings ? 0 : v * h);
    uint64_t n = 2 * h;                           /* input + post-attention RMSNorm */
    if (d->post_norm == 2)
        n += 2 * h;                               /* pre- and post-feedforward */
    n += h * qd + 2 * h * kvd + qd * h;           /* q, k, v, o */
    if (d->qkv_bias)
        n += qd + 2 * kvd;
    if (d->o_bias)
        n += h;
    if (d->qk_norm == 1)
        n += 2 * (uint64_t)d->head_dim;           /* q_norm, k_norm: per head */
    else if (d->qk_norm == 2)
        n += qd + kvd;                            /* over the whole projections */
    if (zn_model_layer_moe(d, block - 1))         /* the router, each expert's three */
        n += (uint64_t)d->n_experts * (h + 3 * h * (uint64_t)d->moe_intermediate);
    else
        n += 3 * h * (uint64_t)d->intermediate;   /* gate, up, down */
    return n;
}

/* in and out features of LoRA target t */
static void lora_shape(const zn_model_dims *d, unsigned t, uint64_t *in, uint64_t *out)
{
    uint64_t h = (uint64_t)d->hidden, i = (uint64_t)d->intermediate;
    uint64_t qd = (uint64_t)(d->n_heads * d->head_dim), kvd = (uint64_t)(d->n_kv_heads * d->head_dim);
    *in = h;
    switch (t) {
    case ZN_LORA_Q: *out = qd; break;
    case ZN_LORA_K: case ZN_LORA_V: *out = kvd; break;
    case ZN_LORA_O: *in = qd; *out = h; break;
    case ZN_LORA_GATE: case ZN_LORA_UP: *out = i; break;
    case ZN_LORA_QKV: *out = qd + 2 * kvd; break;
    case ZN_LORA_GATE_UP: *out = 2 * i; break;
    default: *in = i; *out = h; break; /* down */
    }
}

uint64_t zn_model_block_param_count(const zn_model_dims *d, int block)
{
    uint64_t n = base_count(d, block);
    if (d->lora.r > 0 && block >= 1 && block <= d->n_layers)
        for (unsigned t = 1; t <= ZN_LORA_LAST; t <<= 1)
            if (d->lora.targets & t) {
                uint64_t in, out;
                lora_shape(d, t, &in, &out);
                n += (uint64_t)d->lora.r * (in + out);
            }
    return n;
}

uint64_t zn_model_block_frozen_count(const zn_model_dims *d, int block)
{
    return d->lora.r > 0 ? base_count(d, block) : 0;
}

/* Rows of the embedding / lm_head per part: as many as keep a part (the
 * head's first with the final norm) within one decoder layer's own
 * parameters, spread evenly over the parts; at most MAX_PARTS parts (only a
 * toy's layers are that small against its vocabulary: Qwen2.5-7B and 14B
 * take 3). */
#define MAX_PARTS 32
static int64_t part_rows(const zn_model_dims *d, int *nparts)
{
    int64_t V = d->vocab, H = d->hidden;
    int64_t most = (int64_t)(base_count(d, 1) / (uint64_t)H) - 1;
    if (most < 1 || V <= most) {
        *nparts = 1;
        return V;
    }
    int64_t k = (V + most - 1) / most;
    if (k > MAX_PARTS)
        k = MAX_PARTS;
    *nparts = (int)k;
    return (V + k - 1) / k;
}

int zn_model_block_parts(const zn_model_dims *d, int block)
{
    if (block < 0 || block > d->n_layers + 1)
        return 0;
    if (block > 0 && block <= d->n_layers)
        return 1;
    if (block == d->n_layers + 1 && d->tie_embeddings)
        return 1;
    int k;
    part_rows(d, &k);
    return k;
}

int zn_model_num_parts(const zn_model_dims *d)
{
    return zn_model_block_parts(d, 0) + (int)d->n_layers + zn_model_block_parts(d, (int)d->n_layers + 1);
}

int zn_model_part(const zn_model_dims *d, int index, zn_model_part_info *out)
{
    memset(out, 0, sizeof *out);
    int e = zn_model_block_parts(d, 0), L = (int)d->n_layers;
    int h = zn_model_block_parts(d, L + 1);
    if (index < 0 || index >= e + L + h)
        return zn_set_error(ZN_EARG, "model: no part %d (the model has %d)", index, e + L + h);
    int k;
    int64_t rows = part_rows(d, &k), H = d->hidden, V = d->vocab;
    if (index >= e && index < e + L) {
        out->block = index - e + 1;
        out->nparts = 1;
        out->n = zn_model_block_param_count(d, out->block);
        return 0;
    }
    int head = index >= e + L;
    out->block = head ? L + 1 : 0;
    out->part = head ? index - e - L : index;
    out->nparts = head ? h : e;
    out->row0 = (int64_t)out->part * rows;
    out->rows = V - out->row0 < rows ? V - out->row0 : rows;
    if (head && d->tie_embeddings) {
        out->rows = V; /* the resident table's view: only the norm is the head's own */
        out->n = (uint64_t)H;
        return 0;
    }
    uint64_t lead = head ? (uint64_t)H : 0; /* the final norm, in the head's part 0 */
    out->first = out->part ? lead + (uint64_t)(out->row0 * H) : 0;
    out->n = (uint64_t)(out->rows * H) + (out->part ? 0 : lead);
    return 0;
}

uint64_t zn_model_trainable_count(const zn_model_dims *d)
{
    uint64_t n = 0;
    for (int b = 0; b < zn_model_num_blocks(d); b++)
        n += zn_model_block_param_count(d, b) - zn_model_block_frozen_count(d, b);
    return n;
}

void zn_lora_fit_family(zn_model_dims *d)
{
    unsigned split = ZN_LORA_Q | ZN_LORA_K | ZN_LORA_V | ZN_LORA_GATE | ZN_LORA_UP;
    if (d->fused_proj && (d->lora.targets & ZN_LORA_ALL) == ZN_LORA_ALL)
        d->lora.targets = (d->lora.targets & ~split) | ZN_LORA_QKV | ZN_LORA_GATE_UP;
    /* qwen3_moe: PEFT's all-linear finds the attention's nn.Linear layers
     * (transformers 5 keeps the experts as 3-D parameters and the router
     * as its own module); the dense layers' MLPs (mlp_only_layers) it would
     * would adapt too are not built for adapters: with every layer sparse
     * all-linear is the attention, with a dense one zn_model_dims_validate
     * refuses its MLP targets */
    int dense = 0;
    for (int64_t l = 0; l < d->n_layers; l++)
        dense |= !zn_model_layer_moe(d, l);
    if (d->n_experts > 0 && !dense && (d->lora.targets & ZN_LORA_ALL) == ZN_LORA_ALL)
        d->lora.targets &= ~(unsigned)(ZN_LORA_GATE | ZN_LORA_UP | ZN_LORA_DOWN);
}

const char *zn_lora_target_name(unsigned t)
{
    switch (t) {
    case ZN_LORA_Q: return "q_proj";
    case ZN_LORA_K: return "k_proj";
    case ZN_LORA_V: return "v_proj";
    case ZN_LORA_O: return "o_proj";
    case ZN_LORA_GATE: return "gate_proj";
    case ZN_LORA_UP: return "up_proj";
    case ZN_LORA_DOWN: return "down_proj";
    case ZN_LORA_QKV: return "qkv_proj";
    case ZN_LORA_GATE_UP: return "gate_up_proj";
    default: return NULL;
    }
}

double zn_lora_scale(const zn_lora *l)
{
    if (l->r <= 0)
        return 0;
    return l->rslora ? l->alpha / sqrt((double)l->r) : l->alpha / (double)l->r;
}

uint64_t zn_model_param_count(const zn_model_dims *d)
{
    uint64_t n = 0;
    for (int b = 0; b < zn_model_num_blocks(d); b++)
        n += zn_model_block_param_count(d, b);
    return n;
}
