/* The Llama-family decoder as blocks (embedding, layers, head) whose forward
 * and backward take their parameters as device pointers: the model owns only
 * a workspace for one layer at a time, the batch's ids/targets and the RoPE
 * table. All compute goes through the device interface (device.h), so the
 * same code runs on the host backend (fp32) and on CUDA (bf16 + fp32
 * accumulation). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "model/model-impl.h"
#include "util/hash-impl.h"
#include "util/try-impl.h"


/* Layer parameter slots, in the order of zn_model_block_param. */
enum {
    P_IN_NORM, P_WQ, P_WK, P_WV, P_WO, P_POST_NORM, P_WG, P_WU, P_WD,
    P_BQ, P_BK, P_BV, P_BO, P_NSLOTS
};

/* Activations of one layer (forward results needed by the backward). */
typedef struct {
    void *h1;      /* [N][H]   rmsnorm(x_in) */
    float *rstd1;  /* [N] */
    void *qkv;     /* [N][qkv_ld] q | k | v, q and k after RoPE */
    void *attn;    /* [N][qd]  attention output before o_proj */
    void *x_mid;   /* [N][H]   x_in + o_proj(attn) */
    void *h2;      /* [N][H]   rmsnorm(x_mid) */
    float *rstd2;  /* [N] */
    void *gate;    /* [N][I] */
    void *up;      /* [N][I] */
    void *act;     /* [N][I]   silu(gate) * up */
    float *lse;    /* fused attention: [B][nh][T] log-sum-exp of each query's scores */
} layer_acts;

struct zn_model {
    zn_dev *dev;
    zn_model_dims d;
    zn_model_config cfg;
    zn_dtype dt;
    size_t esz;
    int64_t H, qd, kvd, I, V, nh, nkv, hd, g, qkv_ld;
    int64_t max_n, max_t, chunk;
    int64_t qb;         /* attention query rows per block (attn_rows) */
    int fused;          /* fused attention (zn_dev_flash_attn_*), else GEMMs + softmax */

    void *mem;          /* the one arena block everything below lives in */
    uint64_t mem_bytes;
    int32_t *ids, *targets, *pos; /* pos: each token's position in its document */
    int32_t *kstart;              /* each token's document's first position */
    float *inv_freq;
    float *loss;        /* scalar */
    /* head */
    void *hN;
    float *rstdN, *lse, *row_loss, *run_max, *run_sum, *tgt, *logits, *dhN;
    void *dlogits;
    /* layer workspace */
    layer_acts w;
    float *SS, *dP;     /* [nh][T][T] fp32 scores; dP (may alias) */
    void *P, *dS;       /* [nh][T][T] probabilities / score grads (cfg.dtype) */
    float *dh, *dxm32;  /* [N][H] fp32 */
    void *dxm;          /* [N][H] cfg.dtype (aliases dxm32 for f32) */
    void *d_attn;       /* [N][qd] */
    void *dqkv;         /* [N][qkv_ld] */
    float *dkv32;       /* GQA, 16-bit: [T][2 kvd] one sequence's dK | dV summed in fp32 */
    float *fdelta;      /* fused attention backward: [B][nh][T] rowsum(dO * O) */
    void *lu, *ldu;     /* LoRA: [N][r] A x and its gradient (cfg.dtype) */
    void *lxd;          /* LoRA dropout: [N][max in] the dropped input (cfg.dtype) */
    float *ltmp;        /* LoRA dropout: [N][max in] du A before its mask (fp32) */
    float lscale;       /* LoRA scale */
    int drop_on;        /* training with lora.dropout > 0 (zn_model_set_dropout) */
    uint64_t drop_key;

    /* current batch */
    int64_t B, T, N, n_valid;
    int packed;         /* the batch packs documents: attention uses kstart */
    float loss_scale;
    int32_t *staging;   /* host: 4 x max_n */
    /* decoding (zn_model_set_decode): the batch's tokens follow cached ones */
    int decode;
    int64_t *kv_pos0;   /* host, per sequence: tokens already in its cache */
    int64_t *kv_slot;   /* host, per sequence: its slot of the KV cache */
};

/* ---- sizes ------------------------------------------------------------------ */

#define ALIGN 256
static uint64_t al(uint64_t x)
{
    return (x + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
}

typedef struct {
    unsigned char *base; /* NULL: only count */
    uint64_t off;
} carver;

static void *carve(carver *c, uint64_t bytes)
{
    void *p = c->base ? c->base + c->off : NULL;
    c->off += al(bytes ? bytes : 1);
    return p;
}

static void carve_acts(carver *c, layer_acts *a, int64_t N, int64_t H, int64_t qkv_ld,
                       int64_t qd, int64_t I, size_t esz, int64_t n_lse)
{
    a->h1 = carve(c, (uint64_t)(N * H) * esz);
    a->rstd1 = carve(c, (uint64_t)N * 4);
    a->qkv = carve(c, (uint64_t)(N * qkv_ld) * esz);
    a->attn = carve(c, (uint64_t)(N * qd) * esz);
    a->x_mid = carve(c, (uint64_t)(N * H) * esz);
    a->h2 = carve(c, (uint64_t)(N * H) * esz);
    a->rstd2 = carve(c, (uint64_t)N * 4);
    a->gate = carve(c, (uint64_t)(N * I) * esz);
    a->up = carve(c, (uint64_t)(N * I) * esz);
    a->act = carve(c, (uint64_t)(N * I) * esz);
    a->lse = n_lse ? carve(c, (uint64_t)n_lse * 4) : NULL;
}

/* Floats of the fused attention's per-query statistics (lse, delta). */
static int64_t lse_floats(const zn_model *m)
{
    return m->fused ? m->max_n * m->nh : 0;
}

static int64_t default_chunk(int64_t V, int64_t N)
{
    int64_t c = ((int64_t)64 << 20) / (N > 0 ? N : 1); /* 256 MiB of fp32 logits */
    c = c / 64 * 64;
    if (c < 256)
        c = 256;
    return c >= V ? V : c;
}

/* The widest input of a LoRA target (what its dropout buffers hold per row). */
static int64_t lora_max_in(const zn_model_dims *d)
{
    int64_t in = 0, qd = d->n_heads * d->head_dim;
    if (d->lora.targets & (ZN_LORA_Q | ZN_LORA_K | ZN_LORA_V | ZN_LORA_GATE | ZN_LORA_UP))
        in = d->hidden;
    if ((d->lora.targets & ZN_LORA_O) && qd > in)
        in = qd;
    if ((d->lora.targets & ZN_LORA_DOWN) && d->intermediate > in)
        in = d->intermediate;
    return in;
}

/* Lays out (or, with base NULL, measures) everything of a model. */
static void layout(zn_model *m, unsigned char *base)
{
    carver c = { base, 0 };
    int64_t N = m->max_n, T = m->max_t, H = m->H;
    size_t esz = m->esz;
    int f32 = m->dt == ZN_DTYPE_F32;

    m->ids = carve(&c, (uint64_t)N * 4);
    m->targets = carve(&c, (uint64_t)N * 4);
    m->pos = carve(&c, (uint64_t)N * 4);
    m->kstart = carve(&c, (uint64_t)N * 4);
    m->inv_freq = carve(&c, (uint64_t)m->hd / 2 * 4);
    m->loss = carve(&c, 4);
    m->hN = carve(&c, (uint64_t)(N * H) * esz);
    m->rstdN = carve(&c, (uint64_t)N * 4);
    m->lse = carve(&c, (uint64_t)N * 4);
    m->row_loss = carve(&c, (uint64_t)N * 4);
    m->run_max = carve(&c, (uint64_t)N * 4);
    m->run_sum = carve(&c, (uint64_t)N * 4);
    m->tgt = carve(&c, (uint64_t)N * 4);
    m->dhN = carve(&c, (uint64_t)(N * H) * 4);
    m->logits = carve(&c, (uint64_t)(N * m->chunk) * 4);
    m->dlogits = f32 ? (void *)m->logits : carve(&c, (uint64_t)(N * m->chunk) * esz);

    carve_acts(&c, &m->w, N, H, m->qkv_ld, m->qd, m->I, esz, lse_floats(m));
    if (m->fused) {
        /* no score matrices: the kernels keep their tiles to themselves */
        m->SS = m->dP = NULL;
        m->P = m->dS = NULL;
        m->fdelta = carve(&c, (uint64_t)lse_floats(m) * 4);
    } else {
        uint64_t sq = (uint64_t)(m->nh * (m->qb < T ? m->qb : T) * T);
        m->SS = carve(&c, sq * 4);
        if (f32) {
            m->P = m->SS;
            m->dP = carve(&c, sq * 4);
            m->dS = m->dP;
        } else {
            m->P = carve(&c, sq * esz);
            m->dP = m->SS;
            m->dS = carve(&c, sq * esz);
        }
    }
    m->dh = carve(&c, (uint64_t)(N * H) * 4);
    m->dxm32 = carve(&c, (uint64_t)(N * H) * 4);
    m->dxm = f32 ? (void *)m->dxm32 : carve(&c, (uint64_t)(N * H) * esz);
    m->d_attn = carve(&c, (uint64_t)(N * m->qd) * esz);
    m->dqkv = carve(&c, (uint64_t)(N * m->qkv_ld) * esz);
    m->dkv32 = m->g > 1 && !f32 && !m->fused ? carve(&c, (uint64_t)(T * 2 * m->kvd) * 4)
                                             : NULL;
    if (m->d.lora.r > 0) {
        m->lu = carve(&c, (uint64_t)(N * m->d.lora.r) * esz);
        m->ldu = carve(&c, (uint64_t)(N * m->d.lora.r) * esz);
        if (m->d.lora.dropout > 0) {
            int64_t in = lora_max_in(&m->d);
            m->lxd = carve(&c, (uint64_t)(N * in) * esz);
            m->ltmp = carve(&c, (uint64_t)(N * in) * 4);
        }
    }
    m->mem_bytes = c.off;
}

static void set_shapes(zn_model *m, const zn_model_dims *d, const zn_model_config *cfg)
{
    m->d = *d;
    m->cfg = *cfg;
    m->dt = cfg->dtype;
    m->esz = zn_dtype_size(cfg->dtype);
    m->H = d->hidden;
    m->nh = d->n_heads;
    m->nkv = d->n_kv_heads;
    m->hd = d->head_dim;
    m->g = d->n_heads / d->n_kv_heads;
    m->qd = d->n_heads * d->head_dim;
    m->kvd = d->n_kv_heads * d->head_dim;
    m->qkv_ld = m->qd + 2 * m->kvd;
    m->I = d->intermediate;
    m->V = d->vocab;
    m->lscale = (float)zn_lora_scale(&d->lora);
    m->max_t = cfg->max_seq;
    m->max_n = cfg->max_batch * cfg->max_seq;
    m->chunk = cfg->xent_chunk > 0 ? (cfg->xent_chunk < d->vocab ? cfg->xent_chunk : d->vocab)
                                   : default_chunk(d->vocab, m->max_n);
    m->qb = cfg->attn_block > 0 ? cfg->attn_block : 512;
    m->fused = zn_model_attention_fused(d, cfg);
}

zn_model_config zn_model_config_default(const zn_dev *dev)
{
    zn_model_config c;
    memset(&c, 0, sizeof c);
    c.dtype = dev && zn_dev_get_kind(dev) == ZN_DEV_CUDA ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    c.max_batch = 1;
    c.max_seq = 512;
    c.checkpoint = 1;
    c.xent_chunk = 0;
    return c;
}

static int check_config(const zn_model_config *cfg)
{
    if (cfg->dtype != ZN_DTYPE_F32 && cfg->dtype != ZN_DTYPE_BF16)
        return zn_set_error(ZN_ECONFIG, "model: dtype %s (must be f32 or bf16)",
                            zn_dtype_name(cfg->dtype));
    if (cfg->max_batch <= 0 || cfg->max_seq <= 0 || cfg->max_batch > (1 << 20) ||
        cfg->max_seq > (1 << 20) || cfg->max_batch * cfg->max_seq > ((int64_t)1 << 28))
        return zn_set_error(ZN_ECONFIG, "model: max_batch %lld x max_seq %lld out of range",
                            (long long)cfg->max_batch, (long long)cfg->max_seq);
    if (cfg->xent_chunk < 0)
        return zn_set_error(ZN_ECONFIG, "model: xent_chunk must be >= 0");
    if (cfg->attn_block < 0)
        return zn_set_error(ZN_ECONFIG, "model: attn_block must be >= 0");
    if (cfg->attention != ZN_ATTN_AUTO && cfg->attention != ZN_ATTN_GEMM &&
        cfg->attention != ZN_ATTN_FUSED)
        return zn_set_error(ZN_ECONFIG, "model: attention %d (auto 0, gemm 1 or fused 2)",
                            cfg->attention);
    return 0;
}

int zn_model_attention_fused(const zn_model_dims *d, const zn_model_config *cfg)
{
    if (cfg->attention == ZN_ATTN_FUSED)
        return 1;
    return cfg->attention == ZN_ATTN_AUTO && cfg->dtype == ZN_DTYPE_BF16 &&
           d->head_dim <= ZN_FLASH_MAX_HEAD_DIM;
}

static int check_attention(const zn_model_dims *d, const zn_model_config *cfg)
{
    if (cfg->attention == ZN_ATTN_FUSED && d->head_dim > ZN_FLASH_MAX_HEAD_DIM)
        return zn_set_error(ZN_ECONFIG, "model: fused attention takes head_dim up to %d, this "
                            "model has %lld (use the GEMM attention: train.attention \"gemm\")",
                            ZN_FLASH_MAX_HEAD_DIM, (long long)d->head_dim);
    return 0;
}

int zn_model_config_check(const zn_model_dims *d, const zn_model_config *cfg)
{
    int rc = zn_model_dims_validate(d);
    if (!rc)
        rc = check_config(cfg);
    return rc ? rc : check_attention(d, cfg);
}

uint64_t zn_model_workspace_bytes(const zn_model_dims *d, const zn_model_config *cfg)
{
    zn_model m;
    memset(&m, 0, sizeof m);
    if (zn_model_config_check(d, cfg))
        return 0;
    set_shapes(&m, d, cfg);
    layout(&m, NULL);
    return m.mem_bytes;
}

int zn_model_create(zn_model **out, zn_dev *dev, const zn_model_dims *d,
                    const zn_model_config *cfg)
{
    int rc;
    *out = NULL;
    if ((rc = zn_model_config_check(d, cfg)))
        return rc;
    if (zn_model_attention_fused(d, cfg) && cfg->dtype != ZN_DTYPE_BF16 &&
        zn_dev_get_kind(dev) == ZN_DEV_CUDA)
        return zn_set_error(ZN_ECONFIG, "model: the fused attention runs on bf16 tensor cores "
                            "on CUDA; with dtype %s use the GEMM attention "
                            "(train.attention \"gemm\")",
                            zn_dtype_name(cfg->dtype));
    if (d->max_pos < cfg->max_seq)
        zn_warn("model: max_seq %lld is beyond max_position_embeddings %lld",
                (long long)cfg->max_seq, (long long)d->max_pos);
    zn_model *m = calloc(1, sizeof *m);
    if (!m)
        return zn_set_error(-ENOMEM, "out of memory");
    m->dev = dev;
    set_shapes(m, d, cfg);
    layout(m, NULL);
    m->staging = malloc((size_t)m->max_n * 4 * sizeof *m->staging);
    m->kv_pos0 = malloc((size_t)m->max_n * sizeof *m->kv_pos0);
    m->kv_slot = malloc((size_t)m->max_n * sizeof *m->kv_slot);
    if (!m->staging || !m->kv_pos0 || !m->kv_slot) {
        free(m->kv_pos0);
        free(m->kv_slot);
        free(m->staging);
        free(m);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    if ((rc = zn_dev_alloc(dev, m->mem_bytes, "model workspace", &m->mem))) {
        zn_model_destroy(m);
        return rc;
    }
    layout(m, m->mem);

    /* RoPE frequencies, once. */
    float *inv = malloc((size_t)m->hd / 2 * sizeof *inv);
    if (!inv) {
        zn_model_destroy(m);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    zn_rope_scaling sc = { d->rope_factor, d->rope_low_freq_factor, d->rope_high_freq_factor,
                           (double)d->rope_orig_max_pos };
    zn_rope_inv_freq(inv, m->hd, d->rope_theta, d->rope_type == ZN_ROPE_LLAMA3 ? &sc : NULL);
    rc = zn_dev_copy_h2d(dev, NULL, m->inv_freq, inv, (size_t)m->hd / 2 * 4);
    if (!rc)
        rc = zn_dev_stream_sync(dev, NULL);
    free(inv);
    if (rc) {
        zn_model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

void zn_model_destroy(zn_model *m)
{
    if (!m)
        return;
    if (m->mem)
        zn_dev_free(m->dev, m->mem);
    free(m->staging);
    free(m->kv_pos0);
    free(m->kv_slot);
    free(m);
}

const zn_model_dims *zn_model_get_dims(const zn_model *m)
{
    return &m->d;
}

const zn_model_config *zn_model_get_config(const zn_model *m)
{
    return &m->cfg;
}

zn_dev *zn_model_get_dev(const zn_model *m)
{
    return m->dev;
}

/* ---- parameter lists ---------------------------------------------------------- */

static int layer_slot_present(const zn_model_dims *d, int slot)
{
    if (slot >= P_BQ && slot <= P_BV)
        return d->qkv_bias;
    if (slot == P_BO)
        return d->o_bias;
    return slot >= 0 && slot < P_NSLOTS;
}

/* Index of `slot` in a layer's parameter array, or -1 when absent. */
static int slot_index(const zn_model_dims *d, int slot)
{
    if (!layer_slot_present(d, slot))
        return -1;
    int idx = 0;
    for (int s = 0; s < slot; s++)
        idx += layer_slot_present(d, s);
    return idx;
}

static int layer_base_nparams(const zn_model_dims *d)
{
    int n = 0;
    for (int s = 0; s < P_NSLOTS; s++)
        n += layer_slot_present(d, s);
    return n;
}

static int lora_nparams(const zn_model_dims *d)
{
    return d->lora.r > 0 ? 2 * __builtin_popcount(d->lora.targets & ZN_LORA_ALL) : 0;
}

/* Index of target t's lora_A in a layer's parameter array (lora_B follows),
 * -1 when t has no adapter. */
static int lora_index(const zn_model_dims *d, unsigned t)
{
    if (d->lora.r <= 0 || !(d->lora.targets & t))
        return -1;
    return layer_base_nparams(d) + 2 * __builtin_popcount(d->lora.targets & (t - 1));
}

int zn_model_block_nparams(const zn_model_dims *d, int block)
{
    if (block < 0 || block > d->n_layers + 1)
        return 0;
    if (block == 0)
        return 1;
    if (block == d->n_layers + 1)
        return 2;
    return layer_base_nparams(d) + lora_nparams(d);
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
    } else if (i >= layer_base_nparams(d)) {
        int k = (i - layer_base_nparams(d)) / 2, B = (i - layer_base_nparams(d)) % 2;
        unsigned t = 1;
        for (int seen = -1;; t <<= 1)
            if ((d->lora.targets & t) && ++seen == k)
                break;
        int64_t in = H, o = 0;
        switch (t) {
        case ZN_LORA_Q: o = qd; break;
        case ZN_LORA_K: case ZN_LORA_V: o = kvd; break;
        case ZN_LORA_O: in = qd; o = H; break;
        case ZN_LORA_GATE: case ZN_LORA_UP: o = I; break;
        default: in = I; o = H; break;
        }
        snprintf(out->name, sizeof out->name, "model.layers.%d.%s.%s.lora_%c.weight", block - 1,
                 t <= ZN_LORA_O ? "self_attn" : "mlp", zn_lora_target_name(t), B ? 'B' : 'A');
        out->ndim = 2;
        out->shape[0] = B ? o : d->lora.r;
        out->shape[1] = B ? d->lora.r : in;
        out->lora = B ? 2 : 1;
        out->target = t;
    } else {
        int slot = 0, k = -1;
        for (slot = 0; slot < P_NSLOTS; slot++)
            if (layer_slot_present(d, slot) && ++k == i)
                break;
        static const struct {
            const char *name;
            int ndim;
        } slots[P_NSLOTS] = {
            [P_IN_NORM] = { "input_layernorm.weight", 1 },
            [P_WQ] = { "self_attn.q_proj.weight", 2 },
            [P_WK] = { "self_attn.k_proj.weight", 2 },
            [P_WV] = { "self_attn.v_proj.weight", 2 },
            [P_WO] = { "self_attn.o_proj.weight", 2 },
            [P_POST_NORM] = { "post_attention_layernorm.weight", 1 },
            [P_WG] = { "mlp.gate_proj.weight", 2 },
            [P_WU] = { "mlp.up_proj.weight", 2 },
            [P_WD] = { "mlp.down_proj.weight", 2 },
            [P_BQ] = { "self_attn.q_proj.bias", 1 },
            [P_BK] = { "self_attn.k_proj.bias", 1 },
            [P_BV] = { "self_attn.v_proj.bias", 1 },
            [P_BO] = { "self_attn.o_proj.bias", 1 },
        };
        const int64_t shapes[P_NSLOTS][2] = {
            [P_IN_NORM] = { H, 0 },   [P_WQ] = { qd, H },  [P_WK] = { kvd, H },
            [P_WV] = { kvd, H },      [P_WO] = { H, qd },  [P_POST_NORM] = { H, 0 },
            [P_WG] = { I, H },        [P_WU] = { I, H },   [P_WD] = { H, I },
            [P_BQ] = { qd, 0 },       [P_BK] = { kvd, 0 }, [P_BV] = { kvd, 0 },
            [P_BO] = { H, 0 },
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
    double head = 6.0 * tokens * H * (double)d->vocab;
    if (block == 0)
        return 0;
    if (block > 0 && block <= d->n_layers)
        return layer;
    if (block == d->n_layers + 1)
        return head;
    return layer * (double)d->n_layers + head;
}

/* ---- batch ------------------------------------------------------------------------ */

int zn_model_set_batch(zn_model *m, zn_stream *s, int64_t batch, int64_t seq,
                       const int32_t *ids, const int32_t *targets, const int32_t *pos)
{
    if (batch <= 0 || seq <= 0 || seq > m->max_t || batch * seq > m->max_n)
        return zn_set_error(ZN_EARG, "model: batch %lld x seq %lld exceeds the configured %lld "
                                     "x %lld", (long long)batch, (long long)seq,
                            (long long)m->cfg.max_batch, (long long)m->max_t);
    int64_t N = batch * seq, valid = 0;
    for (int64_t i = 0; i < N; i++) {
        if (ids[i] < 0 || ids[i] >= m->V)
            return zn_set_error(ZN_EARG, "model: input id %d at [%lld][%lld] is outside the vocab "
                                         "(%lld)", ids[i], (long long)(i / seq),
                                (long long)(i % seq), (long long)m->V);
        if (targets && targets[i] >= m->V)
            return zn_set_error(ZN_EARG, "model: target %d at [%lld][%lld] is outside the vocab "
                                         "(%lld)", targets[i], (long long)(i / seq),
                                (long long)(i % seq), (long long)m->V);
        /* a document starts at position 0 and counts up by one */
        if (pos && (i % seq ? pos[i] != 0 && pos[i] != pos[i - 1] + 1 : pos[i] != 0))
            return zn_set_error(ZN_EARG, "model: position %d at [%lld][%lld] neither starts a "
                                         "document (0) nor follows %d", pos[i],
                                (long long)(i / seq), (long long)(i % seq),
                                i % seq ? pos[i - 1] : -1);
        valid += targets && targets[i] >= 0;
    }
    int32_t *h = m->staging;
    memcpy(h, ids, (size_t)N * 4);
    for (int64_t i = 0; i < N; i++) {
        int32_t t = (int32_t)(i % seq), p = pos ? pos[i] : t;
        h[N + i] = targets ? targets[i] : -1;
        h[2 * N + i] = p;
        h[3 * N + i] = t - p; /* the first key of the token's document */
    }
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->ids, h, (size_t)N * 4));
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->targets, h + N, (size_t)N * 4));
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->pos, h + 2 * N, (size_t)N * 4));
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->kstart, h + 3 * N, (size_t)N * 4));
    ZN_TRY(zn_dev_stream_sync(m->dev, s));
    m->B = batch;
    m->T = seq;
    m->N = N;
    m->decode = 0;
    m->n_valid = valid;
    m->loss_scale = valid ? 1.0f / (float)valid : 0.0f;
    /* one document per sequence needs no key starts: plain causal softmax */
    m->packed = 0;
    for (int64_t i = 0; pos && i < N && !m->packed; i++)
        m->packed = pos[i] != (int32_t)(i % seq);
    return 0;
}

int zn_model_set_decode(zn_model *m, zn_stream *s, int64_t batch, int64_t seq,
                        const int32_t *ids, const int64_t *pos0, const int64_t *slot)
{
    if (batch <= 0 || seq <= 0 || seq > m->max_t || batch * seq > m->max_n)
        return zn_set_error(ZN_EARG, "model: decoding %lld x %lld tokens exceeds the configured "
                            "%lld x %lld", (long long)batch, (long long)seq,
                            (long long)m->cfg.max_batch, (long long)m->max_t);
    if (m->fused)
        return zn_set_error(ZN_EARG, "model: decoding with a KV cache needs the GEMM attention "
                            "(zn_model_config.attention = ZN_ATTN_GEMM)");
    int64_t N = batch * seq;
    for (int64_t b = 0; b < batch; b++) {
        if (pos0[b] < 0 || pos0[b] + seq > m->max_t || (slot && slot[b] < 0))
            return zn_set_error(ZN_EARG, "model: sequence %lld: positions %lld..%lld are beyond "
                                "the configured %lld", (long long)b, (long long)pos0[b],
                                (long long)(pos0[b] + seq - 1), (long long)m->max_t);
        m->kv_pos0[b] = pos0[b];
        m->kv_slot[b] = slot ? slot[b] : b;
    }
    for (int64_t i = 0; i < N; i++)
        if (ids[i] < 0 || ids[i] >= m->V)
            return zn_set_error(ZN_EARG, "model: input id %d of sequence %lld is outside the "
                                "vocab (%lld)", ids[i], (long long)(i / seq), (long long)m->V);
    int32_t *h = m->staging;
    memcpy(h, ids, (size_t)N * 4);
    for (int64_t i = 0; i < N; i++) {
        h[N + i] = -1;
        h[2 * N + i] = (int32_t)(pos0[i / seq] + i % seq);
        h[3 * N + i] = 0;
    }
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->ids, h, (size_t)N * 4));
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->targets, h + N, (size_t)N * 4));
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->pos, h + 2 * N, (size_t)N * 4));
    ZN_TRY(zn_dev_stream_sync(m->dev, s));
    m->B = batch;
    m->T = seq;
    m->N = N;
    m->decode = 1;
    m->n_valid = 0;
    m->loss_scale = 0.0f;
    m->packed = 0;
    return 0;
}

uint64_t zn_model_kv_bytes(const zn_model *m, int64_t slots)
{
    return (uint64_t)(slots * m->max_t * 2 * m->kvd) * m->esz;
}

int64_t zn_model_batch_tokens(const zn_model *m)
{
    return m->n_valid;
}

void zn_model_set_loss_scale(zn_model *m, float scale)
{
    m->loss_scale = scale;
}

void zn_model_set_dropout(zn_model *m, int training, uint64_t key)
{
    m->drop_on = training && m->d.lora.r > 0 && m->d.lora.dropout > 0;
    m->drop_key = key;
}

uint64_t zn_model_act_bytes(const zn_model *m)
{
    return (uint64_t)(m->max_n * m->H) * m->esz;
}

uint64_t zn_model_layer_saved_bytes(const zn_model *m)
{
    carver c = { NULL, 0 };
    layer_acts a;
    carve_acts(&c, &a, m->max_n, m->H, m->qkv_ld, m->qd, m->I, m->esz, lse_floats(m));
    return c.off;
}

static int need_batch(const zn_model *m)
{
    if (!m->N)
        return zn_set_error(ZN_EARG, "model: no batch set (zn_model_set_batch)");
    return 0;
}

/* Byte offset helper for typed device pointers. */
static void *at(const void *p, int64_t elems, size_t esz)
{
    return (unsigned char *)p + elems * (int64_t)esz;
}

/* ---- embedding ---------------------------------------------------------------------- */

int zn_model_embed_fwd(zn_model *m, zn_stream *s, void *const *params, void *x_out)
{
    ZN_TRY(need_batch(m));
    return zn_dev_embedding_fwd(m->dev, s, m->ids, m->N, params[0], m->dt, m->V, m->H, x_out,
                                m->dt);
}

int zn_model_embed_bwd(zn_model *m, zn_stream *s, void *const *params, const void *dx,
                       float *const *grads)
{
    (void)params;
    ZN_TRY(need_batch(m));
    if (!grads[0])
        return 0; /* frozen */
    return zn_dev_embedding_bwd(m->dev, s, m->ids, m->N, dx, m->dt, m->V, m->H, grads[0]);
}

/* Part `part` of block `block`, checked. */
static int part_of(const zn_model *m, int block, int part, zn_model_part_info *pi)
{
    int np = zn_model_block_parts(&m->d, block);
    if (part < 0 || part >= np)
        return zn_set_error(ZN_EARG, "model: block %d has no part %d (it has %d)", block, part,
                            np);
    int first = 0;
    for (int b = 0; b < block; b++)
        first += zn_model_block_parts(&m->d, b);
    return zn_model_part(&m->d, first + part, pi);
}

int zn_model_embed_fwd_part(zn_model *m, zn_stream *s, int part, const void *table, void *x_out)
{
    zn_model_part_info pi;
    ZN_TRY(need_batch(m));
    ZN_TRY(part_of(m, 0, part, &pi));
    if (pi.nparts == 1)
        return zn_dev_embedding_fwd(m->dev, s, m->ids, m->N, table, m->dt, m->V, m->H, x_out,
                                    m->dt);
    return zn_dev_embedding_rows_fwd(m->dev, s, m->ids, m->N, table, m->dt, pi.row0, pi.rows,
                                     m->H, x_out, m->dt);
}

int zn_model_embed_bwd_part(zn_model *m, zn_stream *s, int part, const void *dx, float *dtable)
{
    zn_model_part_info pi;
    ZN_TRY(need_batch(m));
    ZN_TRY(part_of(m, 0, part, &pi));
    if (!dtable)
        return 0; /* frozen */
    return zn_dev_embedding_rows_bwd(m->dev, s, m->ids, m->N, dx, m->dt, pi.row0, pi.rows, m->H,
                                     dtable);
}

/* ---- attention (one sequence at a time) ------------------------------------------- */

/* Sequence b's first key per query (block-diagonal attention over packed
 * documents), or NULL when each sequence is one document. */
static const int32_t *key_start(const zn_model *m, int64_t b)
{
    return m->packed ? m->kstart + b * m->T : NULL;
}

/* Causal attention in query blocks: block [q0, q0 + qn) of a sequence
 * attends to keys [0, q0 + qn) only (a later key is masked for all of its
 * queries), so the masked upper triangle is computed only within the
 * diagonal blocks (T=2048 in blocks of 512: 62.5% of the full T x T) and
 * the score buffers hold heads x qb x T, not heads x T x T. Heads sharing a
 * kv head go into one strided-batched GEMM where their outputs are
 * separate (QK^T, PV, dO V^T, dS K); dK and dV sum over a group's heads. */

/* Query rows per block. */
static int64_t attn_rows(const zn_model *m)
{
    int64_t qb = m->qb;
    return qb < m->T ? qb : m->T;
}

/* Scores and probabilities of queries [q0, q0 + qn) of sequence b against
 * keys [0, q0 + qn), into m->SS / m->P as [nh][qn][kn]. */
static int attn_probs(zn_model *m, zn_stream *s, const layer_acts *a, int64_t b, int64_t q0,
                      int64_t qn)
{
    int64_t T = m->T, ld = m->qkv_ld, hd = m->hd, g = m->g, kn = q0 + qn;
    size_t e = m->esz;
    const void *qb = at(a->qkv, b * T * ld, e);
    for (int64_t j = 0; j < m->nkv; j++)
        ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_TRANS, qn, kn, hd, 1.0f,
                                        at(qb, q0 * ld + j * g * hd, e), m->dt, ld, hd,
                                        at(qb, m->qd + j * hd, e), m->dt, ld, 0, 0.0f,
                                        m->SS + j * g * qn * kn, ZN_DTYPE_F32, kn, qn * kn, g));
    const int32_t *ks = key_start(m, b);
    return zn_dev_softmax_causal_fwd(m->dev, s, m->SS, ZN_DTYPE_F32, m->P, m->dt, m->nh, qn, kn,
                                     q0, ks ? ks + q0 : NULL, 1.0f / sqrtf((float)hd));
}

/* The fused kernels take every sequence of the batch in one call; key
 * starts only when documents are packed. */
static int attn_fwd_fused(zn_model *m, zn_stream *s, const layer_acts *a)
{
    return zn_dev_flash_attn_fwd(m->dev, s, a->qkv, m->dt, m->qkv_ld, m->B, m->T, m->nh, m->nkv,
                                 m->hd, m->packed ? m->kstart : NULL, 1.0f / sqrtf((float)m->hd),
                                 a->attn, m->qd, a->lse);
}

static int attn_bwd_fused(zn_model *m, zn_stream *s, const layer_acts *a)
{
    return zn_dev_flash_attn_bwd(m->dev, s, a->qkv, m->dt, m->qkv_ld, m->B, m->T, m->nh, m->nkv,
                                 m->hd, m->packed ? m->kstart : NULL, 1.0f / sqrtf((float)m->hd),
                                 a->attn, m->d_attn, m->qd, a->lse, m->fdelta, m->dqkv,
                                 m->qkv_ld);
}

static int attn_fwd(zn_model *m, zn_stream *s, const layer_acts *a)
{
    if (m->fused)
        return attn_fwd_fused(m, s, a);
    int64_t T = m->T, ld = m->qkv_ld, hd = m->hd, g = m->g, QB = attn_rows(m);
    size_t e = m->esz;
    for (int64_t b = 0; b < m->B; b++)
        for (int64_t q0 = 0; q0 < T; q0 += QB) {
            int64_t qn = T - q0 < QB ? T - q0 : QB, kn = q0 + qn;
            ZN_TRY(attn_probs(m, s, a, b, q0, qn));
            const void *vb = at(a->qkv, b * T * ld + m->qd + m->kvd, e);
            void *ob = at(a->attn, (b * T + q0) * m->qd, e);
            /* O_h = P_h V_j, the group's heads in one batch */
            for (int64_t j = 0; j < m->nkv; j++)
                ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, qn, hd, kn,
                                                1.0f, at(m->P, j * g * qn * kn, e), m->dt, kn,
                                                qn * kn, at(vb, j * hd, e), m->dt, ld, 0, 0.0f,
                                                at(ob, j * g * hd, e), m->dt, m->qd, hd, g));
        }
    return 0;
}

/* Attention of the decoded tokens: each sequence's new keys and values join
 * its slot of the cache (kv: [slot][max_t][k | v]), then its queries meet
 * every cached key up to their own position (the causal mask with the
 * query offset at the cached length). */
static int attn_fwd_kv(zn_model *m, zn_stream *s, const layer_acts *a, void *kv)
{
    int64_t T = m->T, ld = m->qkv_ld, hd = m->hd, g = m->g, kvd = m->kvd, kld = 2 * kvd;
    int64_t QB = attn_rows(m);
    size_t e = m->esz;
    for (int64_t b = 0; b < m->B; b++) {
        int64_t p0 = m->kv_pos0[b];
        void *cb = at(kv, m->kv_slot[b] * m->max_t * kld, e);
        const void *qb = at(a->qkv, b * T * ld, e);
        ZN_TRY(zn_dev_copy_2d(m->dev, s, at(qb, m->qd, e), m->dt, ld, at(cb, p0 * kld, e), m->dt,
                              kld, T, kld));
        for (int64_t q0 = 0; q0 < T; q0 += QB) {
            int64_t qn = T - q0 < QB ? T - q0 : QB, kn = p0 + q0 + qn;
            for (int64_t j = 0; j < m->nkv; j++)
                ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_TRANS, qn, kn, hd,
                                                   1.0f, at(qb, q0 * ld + j * g * hd, e), m->dt,
                                                   ld, hd, at(cb, j * hd, e), m->dt, kld, 0,
                                                   0.0f, m->SS + j * g * qn * kn, ZN_DTYPE_F32,
                                                   kn, qn * kn, g));
            ZN_TRY(zn_dev_softmax_causal_fwd(m->dev, s, m->SS, ZN_DTYPE_F32, m->P, m->dt, m->nh,
                                             qn, kn, p0 + q0, NULL,
                                             1.0f / sqrtf((float)hd)));
            void *ob = at(a->attn, (b * T + q0) * m->qd, e);
            for (int64_t j = 0; j < m->nkv; j++)
                ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, qn, hd, kn,
                                                   1.0f, at(m->P, j * g * qn * kn, e), m->dt, kn,
                                                   qn * kn, at(cb, kvd + j * hd, e), m->dt, kld,
                                                   0, 0.0f, at(ob, j * g * hd, e), m->dt, m->qd,
                                                   hd, g));
        }
    }
    return 0;
}

/* d_attn (= dL/d attention output) -> dqkv (q and k grads before RoPE's
 * backward). The query blocks run last to first: the last covers every
 * key, so its dK / dV products initialize them (beta 0) and the earlier,
 * shorter ones add. */
static int attn_bwd(zn_model *m, zn_stream *s, const layer_acts *a)
{
    if (m->fused)
        return attn_bwd_fused(m, s, a);
    int64_t T = m->T, ld = m->qkv_ld, hd = m->hd, g = m->g, qd = m->qd, kvd = m->kvd;
    int64_t QB = attn_rows(m), nblk = (T + QB - 1) / QB;
    size_t e = m->esz;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t b = 0; b < m->B; b++) {
        const void *qb = at(a->qkv, b * T * ld, e);
        void *dqb = at(m->dqkv, b * T * ld, e);
        /* dK_j and dV_j sum over the group's heads (and the query blocks):
         * in fp32 (dkv32, [T][dK | dV]) when the buffers are 16-bit,
         * rounded once at the end */
        float *acc = m->dkv32;
        void *dk = acc ? (void *)acc : at(dqb, qd, e);
        void *dv = acc ? (void *)(acc + kvd) : at(dqb, qd + kvd, e);
        zn_dtype adt = acc ? ZN_DTYPE_F32 : m->dt;
        size_t ae = acc ? 4 : e;
        int64_t ald = acc ? 2 * kvd : ld;
        for (int64_t k = nblk - 1; k >= 0; k--) {
            int64_t q0 = k * QB, qn = T - q0 < QB ? T - q0 : QB, kn = q0 + qn;
            int first = k == nblk - 1;
            ZN_TRY(attn_probs(m, s, a, b, q0, qn));
            const void *dob = at(m->d_attn, (b * T + q0) * qd, e);
            const void *qblk = at(qb, q0 * ld, e);
            /* dP_h = dO_h V_j^T */
            for (int64_t j = 0; j < m->nkv; j++)
                ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_TRANS, qn, kn, hd, 1.0f,
                                                at(dob, j * g * hd, e), m->dt, qd, hd,
                                                at(qb, qd + kvd + j * hd, e), m->dt, ld, 0, 0.0f,
                                                m->dP + j * g * qn * kn, ZN_DTYPE_F32, kn,
                                                qn * kn, g));
            /* dV_j (+)= sum over the group's heads of P_h^T dO_h */
            for (int64_t h = 0; h < m->nh; h++)
                ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, kn, hd, qn, 1.0f,
                                at(m->P, h * qn * kn, e), m->dt, kn, at(dob, h * hd, e), m->dt,
                                qd, first && h % g == 0 ? 0.0f : 1.0f,
                                at(dv, (h / g) * hd, ae), adt, ald));
            const int32_t *ks = key_start(m, b);
            ZN_TRY(zn_dev_softmax_causal_bwd(m->dev, s, m->P, m->dt, m->dP, ZN_DTYPE_F32, m->dS,
                                          m->dt, m->nh, qn, kn, q0, ks ? ks + q0 : NULL, scale));
            /* dQ_h = dS_h K_j, the group's heads in one batch */
            for (int64_t j = 0; j < m->nkv; j++)
                ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, qn, hd, kn,
                                                1.0f, at(m->dS, j * g * qn * kn, e), m->dt, kn,
                                                qn * kn, at(qb, qd + j * hd, e), m->dt, ld, 0,
                                                0.0f, at(dqb, q0 * ld + j * g * hd, e), m->dt,
                                                ld, hd, g));
            /* dK_j (+)= sum over the group's heads of dS_h^T Q_h */
            for (int64_t h = 0; h < m->nh; h++)
                ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, kn, hd, qn, 1.0f,
                                at(m->dS, h * qn * kn, e), m->dt, kn, at(qblk, h * hd, e), m->dt,
                                ld, first && h % g == 0 ? 0.0f : 1.0f,
                                at(dk, (h / g) * hd, ae), adt, ald));
        }
        if (acc)
            ZN_TRY(zn_dev_copy_2d(m->dev, s, acc, ZN_DTYPE_F32, 2 * kvd, at(dqb, qd, e), m->dt, ld,
                               T, 2 * kvd));
    }
    return 0;
}

/* ---- decoder layer ----------------------------------------------------------------- */

#define PRM(slot) params[slot_index(&m->d, (slot))]
#define GRD(slot) grads[slot_index(&m->d, (slot))]

/* y[N][out] = x[N][in] W[out][in]^T (+ beta y). */
static int linear(zn_model *m, zn_stream *s, const void *x, int64_t ldx, const void *W,
                  int64_t out, int64_t in, float beta, void *y, zn_dtype ydt, int64_t ldy)
{
    return zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, m->N, out, in, 1.0f, x, m->dt, ldx, W,
                       m->dt, in, beta, y, ydt, ldy);
}

/* dW[out][in] += dy[N][out]^T x[N][in] */
static int linear_dw(zn_model *m, zn_stream *s, const void *dy, int64_t lddy, const void *x,
                     int64_t ldx, int64_t out, int64_t in, float *dW)
{
    if (!dW)
        return 0; /* frozen: the weight gradient is never formed */
    return zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, out, in, m->N, 1.0f, dy, m->dt, lddy, x,
                       m->dt, ldx, 1.0f, dW, ZN_DTYPE_F32, in);
}

/* dx[N][in] (+)= dy[N][out] W[out][in] */
static int linear_dx(zn_model *m, zn_stream *s, const void *dy, int64_t lddy, const void *W,
                     int64_t out, int64_t in, float beta, void *dx, zn_dtype dxdt, int64_t lddx)
{
    return zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, m->N, in, out, 1.0f, dy, m->dt, lddy, W,
                       m->dt, in, beta, dx, dxdt, lddx);
}

/* ---- LoRA: y += scale B dropout(A x) on target t (nothing when t has no adapter) ----
 * Dropout (training only) draws the mask of (layer, target) from the
 * micro-batch's key; the backward pass draws it again. */
static uint64_t lora_key(const zn_model *m, int layer, unsigned t)
{
    uint64_t k = (uint64_t)layer * 7 + (uint64_t)__builtin_ctz(t) + 1;
    return zn_mix64(m->drop_key + k * ZN_GOLDEN64);
}

/* The adapter's input: x, or its dropped copy in lxd (then ld = in). */
static int lora_input(zn_model *m, zn_stream *s, int layer, unsigned t, const void **x,
                      int64_t *ldx, int64_t in)
{
    if (!m->drop_on)
        return 0;
    ZN_TRY(zn_dev_dropout(m->dev, s, *x, m->dt, *ldx, m->lxd, m->dt, in, m->N, in,
                       m->d.lora.dropout, lora_key(m, layer, t), 0));
    *x = m->lxd;
    *ldx = in;
    return 0;
}

static int lora_fwd(zn_model *m, zn_stream *s, void *const *params, int layer, unsigned t,
                    const void *x, int64_t ldx, int64_t in, int64_t out, void *y, int64_t ldy)
{
    int i = lora_index(&m->d, t);
    if (i < 0)
        return 0;
    int64_t r = m->d.lora.r;
    ZN_TRY(lora_input(m, s, layer, t, &x, &ldx, in));
    ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, m->N, r, in, 1.0f, x, m->dt, ldx, params[i],
                    m->dt, in, 0.0f, m->lu, m->dt, r));
    return zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, m->N, out, r, m->lscale, m->lu, m->dt, r,
                       params[i + 1], m->dt, r, 1.0f, y, m->dt, ldy);
}

/* The adapter's weight gradients from its input x and dy: u = A x again,
 * dB += scale dy^T u, du = scale dy B (kept in ldu for lora_bwd_x),
 * dA += du^T x. Runs before the input x's buffer is reused. */
static int lora_bwd_w(zn_model *m, zn_stream *s, void *const *params, float *const *grads,
                      int layer, unsigned t, const void *x, int64_t ldx, int64_t in, int64_t out,
                      const void *dy, int64_t lddy)
{
    int i = lora_index(&m->d, t);
    if (i < 0)
        return 0;
    int64_t r = m->d.lora.r, N = m->N;
    zn_dtype dt = m->dt;
    ZN_TRY(lora_input(m, s, layer, t, &x, &ldx, in));
    ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, N, r, in, 1.0f, x, dt, ldx, params[i], dt,
                    in, 0.0f, m->lu, dt, r));
    if (grads[i + 1])
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, out, r, N, m->lscale, dy, dt, lddy,
                        m->lu, dt, r, 1.0f, grads[i + 1], ZN_DTYPE_F32, r));
    ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, N, r, out, m->lscale, dy, dt, lddy,
                    params[i + 1], dt, r, 0.0f, m->ldu, dt, r));
    if (grads[i])
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, r, in, N, 1.0f, m->ldu, dt, r, x, dt,
                        ldx, 1.0f, grads[i], ZN_DTYPE_F32, in));
    return 0;
}

/* dx += dropout'(du A), after the base projection wrote its part of dx. */
static int lora_bwd_x(zn_model *m, zn_stream *s, void *const *params, int layer, unsigned t,
                      int64_t in, void *dx, zn_dtype dxdt, int64_t lddx)
{
    int i = lora_index(&m->d, t);
    if (i < 0)
        return 0;
    int64_t r = m->d.lora.r;
    if (!m->drop_on)
        return zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, m->N, in, r, 1.0f, m->ldu, m->dt, r,
                           params[i], m->dt, in, 1.0f, dx, dxdt, lddx);
    ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, m->N, in, r, 1.0f, m->ldu, m->dt, r,
                    params[i], m->dt, in, 0.0f, m->ltmp, ZN_DTYPE_F32, in));
    return zn_dev_dropout(m->dev, s, m->ltmp, ZN_DTYPE_F32, in, dx, dxdt, lddx, m->N, in,
                          m->d.lora.dropout, lora_key(m, layer, t), 1);
}

/* Forward up to (not including) the down projection. */
static int layer_fwd_core(zn_model *m, zn_stream *s, int layer, void *const *params,
                          const void *x_in, const layer_acts *a, void *kv)
{
    int64_t N = m->N, H = m->H, qd = m->qd, kvd = m->kvd, ld = m->qkv_ld, I = m->I;
    zn_dtype dt = m->dt;
    size_t e = m->esz;
    float eps = (float)m->d.rms_eps;

    ZN_TRY(zn_dev_rmsnorm_fwd(m->dev, s, x_in, dt, PRM(P_IN_NORM), dt, a->h1, dt, a->rstd1, N, H,
                           eps));
    ZN_TRY(linear(m, s, a->h1, H, PRM(P_WQ), qd, H, 0.0f, a->qkv, dt, ld));
    ZN_TRY(linear(m, s, a->h1, H, PRM(P_WK), kvd, H, 0.0f, at(a->qkv, qd, e), dt, ld));
    ZN_TRY(linear(m, s, a->h1, H, PRM(P_WV), kvd, H, 0.0f, at(a->qkv, qd + kvd, e), dt, ld));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_Q, a->h1, H, H, qd, a->qkv, ld));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_K, a->h1, H, H, kvd, at(a->qkv, qd, e), ld));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_V, a->h1, H, H, kvd, at(a->qkv, qd + kvd, e), ld));
    if (m->d.qkv_bias) {
        ZN_TRY(zn_dev_bias_add(m->dev, s, a->qkv, dt, ld, PRM(P_BQ), dt, N, qd));
        ZN_TRY(zn_dev_bias_add(m->dev, s, at(a->qkv, qd, e), dt, ld, PRM(P_BK), dt, N, kvd));
        ZN_TRY(zn_dev_bias_add(m->dev, s, at(a->qkv, qd + kvd, e), dt, ld, PRM(P_BV), dt, N, kvd));
    }
    ZN_TRY(zn_dev_rope_fwd(m->dev, s, a->qkv, dt, N, m->nh, m->hd, ld, m->pos, m->inv_freq));
    ZN_TRY(zn_dev_rope_fwd(m->dev, s, at(a->qkv, qd, e), dt, N, m->nkv, m->hd, ld, m->pos,
                        m->inv_freq));
    ZN_TRY(kv ? attn_fwd_kv(m, s, a, kv) : attn_fwd(m, s, a));
    /* x_mid = x_in + attn Wo^T (+ bo) */
    ZN_TRY(zn_dev_copy_d2d(m->dev, s, a->x_mid, x_in, (size_t)(N * H) * e));
    ZN_TRY(linear(m, s, a->attn, qd, PRM(P_WO), H, qd, 1.0f, a->x_mid, dt, H));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_O, a->attn, qd, qd, H, a->x_mid, H));
    if (m->d.o_bias)
        ZN_TRY(zn_dev_bias_add(m->dev, s, a->x_mid, dt, H, PRM(P_BO), dt, N, H));
    ZN_TRY(zn_dev_rmsnorm_fwd(m->dev, s, a->x_mid, dt, PRM(P_POST_NORM), dt, a->h2, dt, a->rstd2, N,
                           H, eps));
    ZN_TRY(linear(m, s, a->h2, H, PRM(P_WG), I, H, 0.0f, a->gate, dt, I));
    ZN_TRY(linear(m, s, a->h2, H, PRM(P_WU), I, H, 0.0f, a->up, dt, I));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_GATE, a->h2, H, H, I, a->gate, I));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_UP, a->h2, H, H, I, a->up, I));
    return zn_dev_swiglu_fwd(m->dev, s, a->gate, a->up, a->act, dt, N * I);
}

static int check_layer(const zn_model *m, int layer)
{
    ZN_TRY(need_batch(m));
    if (layer < 0 || layer >= m->d.n_layers)
        return zn_set_error(ZN_EARG, "model: layer %d of %lld", layer, (long long)m->d.n_layers);
    return 0;
}

/* The layer's forward, with `saved` (training without checkpoints) or `kv`
 * (decoding) or neither. */
static int layer_fwd(zn_model *m, zn_stream *s, int layer, void *const *params,
                     const void *x_in, void *x_out, void *saved, void *kv)
{
    ZN_TRY(check_layer(m, layer));
    if (x_in == x_out)
        return zn_set_error(ZN_EARG, "model: layer %d: x_out must not alias x_in", layer);
    layer_acts a = m->w;
    if (saved) {
        carver c = { saved, 0 };
        carve_acts(&c, &a, m->max_n, m->H, m->qkv_ld, m->qd, m->I, m->esz, lse_floats(m));
    }
    ZN_TRY(layer_fwd_core(m, s, layer, params, x_in, &a, kv));
    /* x_out = x_mid + act Wd^T */
    ZN_TRY(zn_dev_copy_d2d(m->dev, s, x_out, a.x_mid, (size_t)(m->N * m->H) * m->esz));
    ZN_TRY(linear(m, s, a.act, m->I, PRM(P_WD), m->H, m->I, 1.0f, x_out, m->dt, m->H));
    return lora_fwd(m, s, params, layer, ZN_LORA_DOWN, a.act, m->I, m->I, m->H, x_out, m->H);
}

int zn_model_layer_fwd(zn_model *m, zn_stream *s, int layer, void *const *params,
                       const void *x_in, void *x_out, void *saved)
{
    if (m->decode)
        return zn_set_error(ZN_EARG, "model: the batch is a decoding step (zn_model_set_decode): "
                            "use zn_model_layer_fwd_kv");
    return layer_fwd(m, s, layer, params, x_in, x_out, saved, NULL);
}

int zn_model_layer_fwd_kv(zn_model *m, zn_stream *s, int layer, void *const *params,
                          const void *x_in, void *x_out, void *kv)
{
    if (!m->decode || !kv)
        return zn_set_error(ZN_EARG, "model: layer %d: a KV-cache forward needs a decoding "
                            "batch (zn_model_set_decode) and the layer's cache", layer);
    return layer_fwd(m, s, layer, params, x_in, x_out, NULL, kv);
}

int zn_model_layer_bwd(zn_model *m, zn_stream *s, int layer, void *const *params,
                       const void *x_in, const void *saved, const void *dy, void *dx,
                       float *const *grads)
{
    ZN_TRY(check_layer(m, layer));
    if (m->decode)
        return zn_set_error(ZN_EARG, "model: a decoding batch has no backward");
    int64_t N = m->N, H = m->H, qd = m->qd, kvd = m->kvd, ld = m->qkv_ld, I = m->I;
    zn_dtype dt = m->dt;
    size_t e = m->esz;
    const layer_acts *w = &m->w;
    layer_acts a = m->w;
    if (saved) {
        carver c = { (unsigned char *)saved, 0 };
        carve_acts(&c, &a, m->max_n, H, ld, qd, I, e, lse_floats(m));
    } else {
        ZN_TRY(layer_fwd_core(m, s, layer, params, x_in, &a, NULL)); /* activation checkpointing */
    }

    /* MLP: out = act Wd^T */
    ZN_TRY(linear_dw(m, s, dy, H, a.act, I, H, I, GRD(P_WD)));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_DOWN, a.act, I, I, H, dy, H));
    ZN_TRY(linear_dx(m, s, dy, H, PRM(P_WD), H, I, 0.0f, w->act, dt, I));       /* d_act */
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_DOWN, I, w->act, dt, I));
    ZN_TRY(zn_dev_swiglu_bwd(m->dev, s, a.gate, a.up, w->act, w->gate, w->up, dt, N * I));
    ZN_TRY(linear_dw(m, s, w->gate, I, a.h2, H, I, H, GRD(P_WG)));
    ZN_TRY(linear_dw(m, s, w->up, I, a.h2, H, I, H, GRD(P_WU)));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_GATE, a.h2, H, H, I, w->gate, I));
    ZN_TRY(linear_dx(m, s, w->gate, I, PRM(P_WG), I, H, 0.0f, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_GATE, H, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_UP, a.h2, H, H, I, w->up, I));
    ZN_TRY(linear_dx(m, s, w->up, I, PRM(P_WU), I, H, 1.0f, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_UP, H, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(zn_dev_rmsnorm_bwd(m->dev, s, a.x_mid, dt, PRM(P_POST_NORM), dt, a.rstd2, m->dh,
                           ZN_DTYPE_F32, m->dxm32, ZN_DTYPE_F32, GRD(P_POST_NORM), N, H));
    ZN_TRY(zn_dev_add_inplace(m->dev, s, m->dxm32, ZN_DTYPE_F32, dy, dt, N * H)); /* residual */
    if (dt != ZN_DTYPE_F32)
        ZN_TRY(zn_dev_cast(m->dev, s, m->dxm32, ZN_DTYPE_F32, m->dxm, dt, N * H));

    /* attention output projection */
    ZN_TRY(linear_dw(m, s, m->dxm, H, a.attn, qd, H, qd, GRD(P_WO)));
    if (m->d.o_bias && GRD(P_BO))
        ZN_TRY(zn_dev_bias_grad(m->dev, s, m->dxm, dt, H, GRD(P_BO), N, H));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_O, a.attn, qd, qd, H, m->dxm, H));
    ZN_TRY(linear_dx(m, s, m->dxm, H, PRM(P_WO), H, qd, 0.0f, m->d_attn, dt, qd));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_O, qd, m->d_attn, dt, qd));
    ZN_TRY(attn_bwd(m, s, &a));
    ZN_TRY(zn_dev_rope_bwd(m->dev, s, m->dqkv, dt, N, m->nh, m->hd, ld, m->pos, m->inv_freq));
    ZN_TRY(zn_dev_rope_bwd(m->dev, s, at(m->dqkv, qd, e), dt, N, m->nkv, m->hd, ld, m->pos,
                        m->inv_freq));
    if (m->d.qkv_bias && GRD(P_BQ)) {
        ZN_TRY(zn_dev_bias_grad(m->dev, s, m->dqkv, dt, ld, GRD(P_BQ), N, qd));
        ZN_TRY(zn_dev_bias_grad(m->dev, s, at(m->dqkv, qd, e), dt, ld, GRD(P_BK), N, kvd));
        ZN_TRY(zn_dev_bias_grad(m->dev, s, at(m->dqkv, qd + kvd, e), dt, ld, GRD(P_BV), N, kvd));
    }
    ZN_TRY(linear_dw(m, s, m->dqkv, ld, a.h1, H, qd, H, GRD(P_WQ)));
    ZN_TRY(linear_dw(m, s, at(m->dqkv, qd, e), ld, a.h1, H, kvd, H, GRD(P_WK)));
    ZN_TRY(linear_dw(m, s, at(m->dqkv, qd + kvd, e), ld, a.h1, H, kvd, H, GRD(P_WV)));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_Q, a.h1, H, H, qd, m->dqkv, ld));
    ZN_TRY(linear_dx(m, s, m->dqkv, ld, PRM(P_WQ), qd, H, 0.0f, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_Q, H, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_K, a.h1, H, H, kvd, at(m->dqkv, qd, e), ld));
    ZN_TRY(linear_dx(m, s, at(m->dqkv, qd, e), ld, PRM(P_WK), kvd, H, 1.0f, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_K, H, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_V, a.h1, H, H, kvd, at(m->dqkv, qd + kvd, e),
                   ld));
    ZN_TRY(linear_dx(m, s, at(m->dqkv, qd + kvd, e), ld, PRM(P_WV), kvd, H, 1.0f, m->dh,
                  ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_V, H, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(zn_dev_rmsnorm_bwd(m->dev, s, x_in, dt, PRM(P_IN_NORM), dt, a.rstd1, m->dh, ZN_DTYPE_F32,
                           m->dh, ZN_DTYPE_F32, GRD(P_IN_NORM), N, H));
    ZN_TRY(zn_dev_add_inplace(m->dev, s, m->dxm32, ZN_DTYPE_F32, m->dh, ZN_DTYPE_F32, N * H));
    return zn_dev_cast(m->dev, s, m->dxm32, ZN_DTYPE_F32, dx, dt, N * H);
}

/* ---- head ------------------------------------------------------------------------ */

/* The head over lm_head rows [r0, r0 + nr) (W: those rows). `first`: the
 * part that normalizes x_in and starts the running log-sum-exp; `last`:
 * the one that turns it into the loss. */
static int head_fwd_rows(zn_model *m, zn_stream *s, const void *norm_w, const void *W,
                         const void *x_in, int64_t r0, int64_t nr, int first, int last)
{
    ZN_TRY(need_batch(m));
    int64_t N = m->N, H = m->H, C = m->chunk;
    if (first)
        ZN_TRY(zn_dev_rmsnorm_fwd(m->dev, s, x_in, m->dt, norm_w, m->dt, m->hN, m->dt, m->rstdN, N,
                               H, (float)m->d.rms_eps));
    for (int64_t v0 = r0; v0 < r0 + nr; v0 += C) {
        int64_t c = r0 + nr - v0 < C ? r0 + nr - v0 : C;
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, N, c, H, 1.0f, m->hN, m->dt, H,
                        at(W, (v0 - r0) * H, m->esz), m->dt, H, 0.0f, m->logits, ZN_DTYPE_F32,
                        c));
        ZN_TRY(zn_dev_xent_fwd_chunk(m->dev, s, m->logits, ZN_DTYPE_F32, N, c, c, v0, m->targets,
                                  m->run_max, m->run_sum, m->tgt, first && v0 == r0));
    }
    if (!last)
        return 0;
    ZN_TRY(zn_dev_xent_finish(m->dev, s, m->run_max, m->run_sum, m->tgt, m->targets, N, m->lse,
                           m->row_loss));
    ZN_TRY(zn_dev_sum(m->dev, s, m->row_loss, ZN_DTYPE_F32, N, m->loss, 0));
    return zn_dev_scale(m->dev, s, m->loss, ZN_DTYPE_F32, 1, m->loss_scale);
}

/* Backward over rows [r0, r0 + nr): `last` (the part the backward meets
 * first) starts dL/d(normed x); `first` ends with the norm's backward. */
static int head_bwd_rows(zn_model *m, zn_stream *s, const void *norm_w, const void *W,
                         const void *x_in, void *dx, float *dnorm, float *dW, int64_t r0,
                         int64_t nr, int first, int last)
{
    ZN_TRY(need_batch(m));
    int64_t N = m->N, H = m->H, C = m->chunk;
    for (int64_t v0 = r0; v0 < r0 + nr; v0 += C) {
        int64_t c = r0 + nr - v0 < C ? r0 + nr - v0 : C;
        const void *Wc = at(W, (v0 - r0) * H, m->esz);
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, N, c, H, 1.0f, m->hN, m->dt, H, Wc,
                        m->dt, H, 0.0f, m->logits, ZN_DTYPE_F32, c));
        ZN_TRY(zn_dev_xent_bwd_chunk(m->dev, s, m->logits, ZN_DTYPE_F32, N, c, c, v0, m->targets,
                                  m->lse, m->loss_scale, m->dlogits, m->dt, c));
        /* dW[v0:v0+c] += dlogits^T hN;  dhN (+)= dlogits W[v0:v0+c] */
        if (dW)
            ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, c, H, N, 1.0f, m->dlogits, m->dt,
                            c, m->hN, m->dt, H, 1.0f, dW + (v0 - r0) * H, ZN_DTYPE_F32, H));
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, N, H, c, 1.0f, m->dlogits, m->dt, c,
                        Wc, m->dt, H, last && v0 == r0 ? 0.0f : 1.0f, m->dhN, ZN_DTYPE_F32, H));
    }
    if (!first)
        return 0;
    return zn_dev_rmsnorm_bwd(m->dev, s, x_in, m->dt, norm_w, m->dt, m->rstdN, m->dhN,
                              ZN_DTYPE_F32, dx, m->dt, dnorm, N, H);
}

int zn_model_head_fwd(zn_model *m, zn_stream *s, void *const *params, const void *x_in)
{
    return head_fwd_rows(m, s, params[0], params[1], x_in, 0, m->V, 1, 1);
}

int zn_model_head_bwd(zn_model *m, zn_stream *s, void *const *params, const void *x_in, void *dx,
                      float *const *grads)
{
    return head_bwd_rows(m, s, params[0], params[1], x_in, dx, grads[0], grads[1], 0, m->V, 1,
                         1);
}

/* The head's row parts: its own, or with tied embeddings the embedding's
 * (whose parts the head reads as its lm_head). */
static int head_part(const zn_model *m, int part, zn_model_part_info *pi)
{
    return part_of(m, m->d.tie_embeddings ? 0 : (int)m->d.n_layers + 1, part, pi);
}

int zn_model_head_fwd_part(zn_model *m, zn_stream *s, int part, const void *norm_w,
                           const void *W, const void *x_in)
{
    zn_model_part_info pi;
    ZN_TRY(head_part(m, part, &pi));
    if (!part && !norm_w)
        return zn_set_error(ZN_EARG, "model: the head's part 0 needs the final norm's weight");
    return head_fwd_rows(m, s, norm_w, W, x_in, pi.row0, pi.rows, part == 0,
                         part == pi.nparts - 1);
}

int zn_model_head_bwd_part(zn_model *m, zn_stream *s, int part, const void *norm_w,
                           const void *W, const void *x_in, void *dx, float *dnorm, float *dW)
{
    zn_model_part_info pi;
    ZN_TRY(head_part(m, part, &pi));
    if (!part && (!norm_w || !dx))
        return zn_set_error(ZN_EARG, "model: the head's part 0 backward needs the final norm's "
                            "weight and dx");
    return head_bwd_rows(m, s, norm_w, W, x_in, dx, dnorm, dW, pi.row0, pi.rows, part == 0,
                         part == pi.nparts - 1);
}

int zn_model_head_logits(zn_model *m, zn_stream *s, void *const *params, const void *x_in,
                         int64_t row0, int64_t nrows, float *out)
{
    ZN_TRY(need_batch(m));
    if (row0 < 0 || nrows <= 0 || row0 + nrows > m->N)
        return zn_set_error(ZN_EARG, "model: logits rows [%lld, +%lld) outside the batch (%lld)",
                            (long long)row0, (long long)nrows, (long long)m->N);
    int64_t H = m->H;
    ZN_TRY(zn_dev_rmsnorm_fwd(m->dev, s, at(x_in, row0 * H, m->esz), m->dt, params[0], m->dt,
                           m->hN, m->dt, m->rstdN, nrows, H, (float)m->d.rms_eps));
    return zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, nrows, m->V, H, 1.0f, m->hN, m->dt, H,
                       params[1], m->dt, H, 0.0f, out, ZN_DTYPE_F32, m->V);
}

int zn_model_read_loss(zn_model *m, zn_stream *s, float *loss)
{
    ZN_TRY(zn_dev_copy_d2h(m->dev, s, loss, m->loss, 4));
    return zn_dev_stream_sync(m->dev, s);
}
