/* Each block's parameters as a function of the dimensions alone: how many,
 * their Hugging Face names and shapes, where a layer slot or a LoRA adapter
 * sits in a layer's array, and the FLOPs a block's forward and backward take. */
#include <stdio.h>
#include <string.h>

#include "zinc/model.h"
#include "model/model-impl.h"

/* ---- parameter lists ---------------------------------------------------------- */

static int is_mlp_slot(int slot)
{
    return slot == ZN_M_P_WG || slot == ZN_M_P_WU || slot == ZN_M_P_WD;
}

static int layer_slot_present(const zn_model_dims *d, int layer, int slot)
{
    if (is_mlp_slot(slot) && d->n_experts > 0)
        return !zn_model_layer_moe(d, layer);
    if (slot >= ZN_M_P_BQ && slot <= ZN_M_P_BV)
        return d->qkv_bias;
    if (slot == ZN_M_P_BO)
        return d->o_bias;
    if (slot == ZN_M_P_QN || slot == ZN_M_P_KN)
        return d->qk_norm != 0;
    if (slot == ZN_M_P_WQKV || slot == ZN_M_P_WGU)
        return d->fused_proj;
    if (slot == ZN_M_P_IN_NORM)
        return d->post_norm != 1;
    if (slot == ZN_M_P_FF_NORM)
        return d->post_norm != 0;
    if (slot == ZN_M_P_PRE_FF_NORM)
        return d->post_norm == 2;
    if (slot == ZN_M_P_WQ || slot == ZN_M_P_WK || slot == ZN_M_P_WV || slot == ZN_M_P_WG ||
        slot == ZN_M_P_WU)
        return !d->fused_proj;
    return slot >= 0 && slot < ZN_M_P_NSLOTS;
}

/* With experts (qwen3_moe) a layer's tensors are the slots every layer has
 * (the attention and the norms, in slot order), then its MLP: a dense
 * layer's gate, up and down, or a sparse one's router and experts; the
 * other families' follow the slot order. The slot at base index i, or -1
 * for a router or expert tensor. */
static int common_slots(const zn_model_dims *d)
{
    int n = 0;
    for (int s = 0; s < ZN_M_P_NSLOTS; s++)
        n += !is_mlp_slot(s) && layer_slot_present(d, 0, s);
    return n;
}

static int slot_at(const zn_model_dims *d, int layer, int i)
{
    int k = -1;
    if (d->n_experts <= 0) {
        for (int s = 0; s < ZN_M_P_NSLOTS; s++)
            if (layer_slot_present(d, layer, s) && ++k == i)
                return s;
        return -1;
    }
    int nc = common_slots(d);
    if (i >= nc)
        return zn_model_layer_moe(d, layer) ? -1 : ZN_M_P_WG + (i - nc);
    for (int s = 0; s < ZN_M_P_NSLOTS; s++)
        if (!is_mlp_slot(s) && layer_slot_present(d, layer, s) && ++k == i)
            return s;
    return -1;
}

/* Index of `slot` in layer `layer`'s parameter array, or -1 when absent. */
int zn_m_slot_index(const zn_model_dims *d, int layer, int slot)
{
    if (!layer_slot_present(d, layer, slot))
        return -1;
    int idx = 0;
    if (d->n_experts > 0 && is_mlp_slot(slot))
        return common_slots(d) + (slot - ZN_M_P_WG);
    for (int s = 0; s < slot; s++)
        idx += layer_slot_present(d, layer, s) && !(d->n_experts > 0 && is_mlp_slot(s));
    return idx;
}

int zn_m_moe_index(const zn_model_dims *d, int layer)
{
    return zn_model_layer_moe(d, layer) ? common_slots(d) : -1;
}

int zn_m_slot_part(const zn_model_dims *d, int slot, int *fused, int64_t *elem)
{
    if (!d->fused_proj)
        return 0;
    int64_t H = d->hidden, qd = d->n_heads * d->head_dim, kvd = d->n_kv_heads * d->head_dim;
    switch (slot) {
    case ZN_M_P_WQ: *fused = ZN_M_P_WQKV, *elem = 0; return 1;
    case ZN_M_P_WK: *fused = ZN_M_P_WQKV, *elem = qd * H; return 1;
    case ZN_M_P_WV: *fused = ZN_M_P_WQKV, *elem = (qd + kvd) * H; return 1;
    case ZN_M_P_WG: *fused = ZN_M_P_WGU, *elem = 0; return 1;
    case ZN_M_P_WU: *fused = ZN_M_P_WGU, *elem = d->intermediate * H; return 1;
    default: return 0;
    }
}

static int layer_base_nparams(const zn_model_dims *d, int layer)
{
    if (d->n_experts > 0)
        return common_slots(d) + (zn_model_layer_moe(d, layer) ? 1 + 3 * (int)d->n_experts : 3);
    int n = 0;
    for (int s = 0; s < ZN_M_P_NSLOTS; s++)
        n += layer_slot_present(d, layer, s);
    return n;
}

static int lora_nparams(const zn_model_dims *d)
{
    return d->lora.r > 0 ? 2 * __builtin_popcount(d->lora.targets & ZN_LORA_ANY) : 0;
}

/* Index of target t's lora_A in a layer's parameter array (lora_B follows),
 * -1 when t has no adapter. */
int zn_m_lora_index(const zn_model_dims *d, int layer, unsigned t)
{
    if (d->lora.r <= 0 || !(d->lora.targets & t))
        return -1;
    return layer_base_nparams(d, layer) + 2 * __builtin_popcount(d->lora.targets & (t - 1));
}

int zn_model_block_nparams(const zn_model_dims *d, int block)
{
    if (block < 0 || block > d->n_layers + 1)
        return 0;
    if (block == 0)
        return 1;
    if (block == d->n_layers + 1)
        return 2;
    return layer_base_nparams(d, block - 1) + lora_nparams(d);
}

int zn_model_block_param(const zn_model_dims *d, int block, int i, zn_param_info *out)
{
    memset(out, 0, sizeof *out);
    out->owner_block = -1;
    if (i < 0 || i >= zn_model_block_nparams(d, block))
        return zn_set_error(ZN_EARG, "model: block %d has no parameter %d", block, i);
    int64_t H = d->hidden, qd = d->n_heads * d->head_dim, kvd = d->n_kv_heads * d->head_dim;
    int64_t I = d->intermediate;
    if (block == 0 || (block == d->n_layers + 1 && i == 1)) {
        int tied = block != 0 && d->tie_embeddings;
        snprintf(out->name, sizeof out->name, "%s",
                 block == 0 || tied ? "model.embed_tokens.weight" : "lm_head.weight");
        out->ndim = 2;
        out->shape[0] = d->vocab;
        out->shape[1] = H;
        out->owner_block = tied ? 0 : -1;
    } else if (block == d->n_layers + 1) {
        snprintf(out->name, sizeof out->name, "model.norm.weight");
        out->ndim = 1;
        out->shape[0] = H;
    } else if (i >= layer_base_nparams(d, block - 1)) {
        int nb = layer_base_nparams(d, block - 1);
        int k = (i - nb) / 2, B = (i - nb) % 2;
        unsigned t = 1;
        for (int seen = -1;; t <<= 1)
            if ((d->lora.targets & t) && ++seen == k)
                break;
        int64_t in = H, o = 0;
        switch (t) {
        case ZN_LORA_Q: o = qd; break;
        case ZN_LORA_K: case ZN_LORA_V: o = kvd; break;
        case ZN_LORA_O: in = qd; o = H; break;
        case ZN_LORA_QKV: o = qd + 2 * kvd; break;
        case ZN_LORA_GATE_UP: o = 2 * I; break;
        case ZN_LORA_GATE: case ZN_LORA_UP: o = I; break;
        default: in = I; o = H; break;
        }
        snprintf(out->name, sizeof out->name, "model.layers.%d.%s.%s.lora_%c.weight", block - 1,
                 t <= ZN_LORA_O || t == ZN_LORA_QKV ? "self_attn" : "mlp",
                 zn_lora_target_name(t), B ? 'B' : 'A');
        out->ndim = 2;
        out->shape[0] = B ? o : d->lora.r;
        out->shape[1] = B ? d->lora.r : in;
        out->lora = B ? 2 : 1;
        out->target = t;
    } else if (slot_at(d, block - 1, i) < 0) { /* the router, or an expert's projection */
        int j = i - common_slots(d);
        int64_t Im = d->moe_intermediate;
        /* the published checkpoints' names: Mixtral's block_sparse_moe with
         * w1 (gate), w3 (up), w2 (down), Qwen3-MoE's mlp with the MLP's */
        const int mix = d->arch == ZN_ARCH_MIXTRAL;
        const char *blk = mix ? "block_sparse_moe" : "mlp";
        if (j == 0) {
            snprintf(out->name, sizeof out->name, "model.layers.%d.%s.gate.weight", block - 1,
                     blk);
            out->shape[0] = d->n_experts;
            out->shape[1] = H;
        } else {
            static const char *const proj[2][3] = { { "gate_proj", "up_proj", "down_proj" },
                                                    { "w1", "w3", "w2" } };
            int w = (j - 1) % 3;
            snprintf(out->name, sizeof out->name, "model.layers.%d.%s.experts.%d.%s.weight",
                     block - 1, blk, (j - 1) / 3, proj[mix][w]);
            out->shape[0] = w == 2 ? H : Im;
            out->shape[1] = w == 2 ? Im : H;
        }
        out->ndim = 2;
    } else {
        int slot = slot_at(d, block - 1, i);
        static const struct {
            const char *name;
            int ndim;
        } slots[ZN_M_P_NSLOTS] = {
            [ZN_M_P_IN_NORM] = { "input_layernorm.weight", 1 },
            [ZN_M_P_WQ] = { "self_attn.q_proj.weight", 2 },
            [ZN_M_P_WK] = { "self_attn.k_proj.weight", 2 },
            [ZN_M_P_WV] = { "self_attn.v_proj.weight", 2 },
            [ZN_M_P_WO] = { "self_attn.o_proj.weight", 2 },
            [ZN_M_P_POST_NORM] = { "post_attention_layernorm.weight", 1 },
            [ZN_M_P_WG] = { "mlp.gate_proj.weight", 2 },
            [ZN_M_P_WU] = { "mlp.up_proj.weight", 2 },
            [ZN_M_P_WD] = { "mlp.down_proj.weight", 2 },
            [ZN_M_P_BQ] = { "self_attn.q_proj.bias", 1 },
            [ZN_M_P_BK] = { "self_attn.k_proj.bias", 1 },
            [ZN_M_P_BV] = { "self_attn.v_proj.bias", 1 },
            [ZN_M_P_BO] = { "self_attn.o_proj.bias", 1 },
            [ZN_M_P_QN] = { "self_attn.q_norm.weight", 1 },
            [ZN_M_P_KN] = { "self_attn.k_norm.weight", 1 },
            [ZN_M_P_WQKV] = { "self_attn.qkv_proj.weight", 2 },
            [ZN_M_P_WGU] = { "mlp.gate_up_proj.weight", 2 },
            [ZN_M_P_FF_NORM] = { "post_feedforward_layernorm.weight", 1 },
            [ZN_M_P_PRE_FF_NORM] = { "pre_feedforward_layernorm.weight", 1 },
        };
        const int64_t shapes[ZN_M_P_NSLOTS][2] = {
            [ZN_M_P_IN_NORM] = { H, 0 }, [ZN_M_P_WQ] = { qd, H },  [ZN_M_P_WK] = { kvd, H },
            [ZN_M_P_WV] = { kvd, H },    [ZN_M_P_WO] = { H, qd },  [ZN_M_P_POST_NORM] = { H, 0 },
            [ZN_M_P_WG] = { I, H },      [ZN_M_P_WU] = { I, H },   [ZN_M_P_WD] = { H, I },
            [ZN_M_P_BQ] = { qd, 0 },     [ZN_M_P_BK] = { kvd, 0 }, [ZN_M_P_BV] = { kvd, 0 },
            [ZN_M_P_BO] = { H, 0 },
            [ZN_M_P_QN] = { d->qk_norm == 2 ? qd : d->head_dim, 0 },
            [ZN_M_P_KN] = { d->qk_norm == 2 ? kvd : d->head_dim, 0 },
            [ZN_M_P_WQKV] = { qd + 2 * kvd, H }, [ZN_M_P_WGU] = { 2 * I, H },
            [ZN_M_P_FF_NORM] = { H, 0 }, [ZN_M_P_PRE_FF_NORM] = { H, 0 },
        };
        snprintf(out->name, sizeof out->name, "model.layers.%d.%s", block - 1, slots[slot].name);
        out->ndim = slots[slot].ndim;
        out->shape[0] = shapes[slot][0];
        out->shape[1] = shapes[slot][1];
    }
    out->numel = out->shape[0] * (out->ndim == 2 ? out->shape[1] : 1);
    return 0;
}

/* ---- FLOPs ---------------------------------------------------------------------- */

double zn_model_flops(const zn_model_dims *d, int block, int64_t batch, int64_t seq)
{
    double tokens = (double)batch * (double)seq;
    double H = (double)d->hidden, qd = (double)(d->n_heads * d->head_dim);
    double kvd = (double)(d->n_kv_heads * d->head_dim), I = (double)d->intermediate;
    double layer = 6.0 * tokens * (H * qd * 2 + H * kvd * 2 + 3 * H * I) +
                   /* QK^T and PV: 2 x 2 x T^2 x qd per sequence forward, half
                    * masked (causal); backward twice the forward. */
                   3.0 * 2.0 * (double)batch * (double)seq * (double)seq * qd;
    /* a sparse layer: the router and each token's top_k experts instead of
     * the dense MLP (the rows routed, not every expert over every token) */
    double sparse = layer - 6.0 * tokens * 3 * H * I +
                    6.0 * tokens * (H * (double)d->n_experts +
                                    (double)d->top_k * 3 * H * (double)d->moe_intermediate);
    double head = 6.0 * tokens * H * (double)d->vocab;
    if (block == 0)
        return 0;
    if (block > 0 && block <= d->n_layers)
        return zn_model_layer_moe(d, block - 1) ? sparse : layer;
    if (block == d->n_layers + 1)
        return head;
    double all = head;
    for (int64_t l = 0; l < d->n_layers; l++)
        all += zn_model_layer_moe(d, l) ? sparse : layer;
    return all;
}
