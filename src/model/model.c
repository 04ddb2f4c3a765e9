/* The Llama-family decoder as blocks (embedding, layers, head) whose forward
 * and backward take their parameters as device pointers: the model owns only
 * a workspace for one layer at a time, the batch's ids/targets and the RoPE
 * table. All compute goes through the device interface (device.h), so the
 * same code runs on the host backend (fp32) and on CUDA (bf16 + fp32
 * accumulation). Here: the config, the workspace's layout and the batch
 * (training or decoding); the blocks run in model_layer.c and model_head.c,
 * their parameters are named in model_params.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "model/model-impl.h"
#include "util/try-impl.h"

/* ---- sizes ------------------------------------------------------------------ */

#define ALIGN 256
static uint64_t al(uint64_t x)
{
    return (x + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
}

static void *carve(zn_m_carver *c, uint64_t bytes)
{
    void *p = c->base ? c->base + c->off : NULL;
    c->off += al(bytes ? bytes : 1);
    return p;
}

void zn_m_carve_acts(zn_m_carver *c, zn_m_layer_acts *a, const zn_model *m)
{
    int64_t N = m->max_n, H = m->H, qkv_ld = m->qkv_ld, qd = m->qd, I = m->I;
    int64_t n_lse = zn_m_lse_floats(m);
    size_t esz = m->esz;
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
    a->qk_pre = a->qk_rstd = NULL;
    if (m->d.qk_norm) {
        a->qk_pre = carve(c, (uint64_t)(N * (qd + m->kvd)) * esz);
        a->qk_rstd = carve(c, (uint64_t)(N * (m->nh + m->nkv)) * 4);
    }
    a->o_pre = a->d_pre = NULL;
    a->rstd3 = a->rstd4 = NULL;
    if (m->d.post_norm == 2) {
        a->o_pre = carve(c, (uint64_t)(N * H) * esz);
        a->rstd3 = carve(c, (uint64_t)N * 4);
        a->d_pre = carve(c, (uint64_t)(N * H) * esz);
        a->rstd4 = carve(c, (uint64_t)N * 4);
    }
}

/* Floats of the fused attention's per-query statistics (lse, delta). */
int64_t zn_m_lse_floats(const zn_model *m)
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
    if (d->lora.targets & (ZN_LORA_Q | ZN_LORA_K | ZN_LORA_V | ZN_LORA_GATE | ZN_LORA_UP |
                           ZN_LORA_QKV | ZN_LORA_GATE_UP))
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
    zn_m_carver c = { base, 0 };
    int64_t N = m->max_n, T = m->max_t, H = m->H;
    size_t esz = m->esz;
    int f32 = m->dt == ZN_DTYPE_F32;

    m->ids = carve(&c, (uint64_t)N * 4);
    m->targets = carve(&c, (uint64_t)N * 4);
    m->pos = carve(&c, (uint64_t)N * 4);
    m->kstart = carve(&c, (uint64_t)N * 4);
    m->bwd_ids = m->d.has_pad ? carve(&c, (uint64_t)N * 4) : NULL;
    m->kwin = m->d.sliding_window > 0 ? carve(&c, (uint64_t)N * 4) : NULL;
    m->inv_freq = carve(&c, (uint64_t)m->hd * 4); /* two tables */
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

    zn_m_carve_acts(&c, &m->w, m);
    if (m->fused) {
        /* no score matrices: the kernels keep their tiles to themselves */
        m->SS = m->dP = m->SC = NULL;
        m->P = m->dS = NULL;
        m->fdelta = carve(&c, (uint64_t)zn_m_lse_floats(m) * 4);
    } else {
        uint64_t sq = (uint64_t)(m->nh * (m->qb < T ? m->qb : T) * T);
        m->SS = carve(&c, sq * 4);
        m->SC = m->d.attn_softcap > 0 ? carve(&c, sq * 4) : NULL;
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
    if (m->d.n_experts > 0) {
        int64_t E = m->d.n_experts, R = N * m->d.top_k, Im = m->d.moe_intermediate;
        m->moe_log = carve(&c, (uint64_t)(N * E) * esz);
        m->moe_idx = carve(&c, (uint64_t)R * 4);
        m->moe_w = carve(&c, (uint64_t)R * 4);
        m->moe_dw = carve(&c, (uint64_t)R * 4);
        m->moe_xg = carve(&c, (uint64_t)(R * H) * esz);
        m->moe_eo = carve(&c, (uint64_t)(R * H) * esz);
        m->moe_g = carve(&c, (uint64_t)(R * Im) * esz);
        m->moe_u = carve(&c, (uint64_t)(R * Im) * esz);
        m->moe_a = carve(&c, (uint64_t)(R * Im) * esz);
        m->moe_acc = carve(&c, (uint64_t)(N * H) * 4);
        m->moe_dxg = carve(&c, (uint64_t)(R * H) * 4);
    }
    m->mem_bytes = c.off;
}

/* The host side of the routing (model_moe.c), one layer's at a time. */
static void moe_host_free(zn_m_moe_host *h)
{
    free(h->raw);
    free(h->p);
    free(h->sel);
    free(h->val);
    free(h->vsum);
    free(h->wt);
    free(h->slot);
    free(h->off);
    free(h->idx);
    free(h->w);
    free(h->dw);
    free(h->dp);
    free(h->dv);
    free(h->q);
    memset(h, 0, sizeof *h);
}

static void aux_reset(zn_model *m)
{
    if (m->aux_cnt)
        memset(m->aux_cnt, 0, (size_t)m->d.n_experts * sizeof *m->aux_cnt);
    if (m->aux_psum)
        memset(m->aux_psum, 0, (size_t)m->d.n_experts * sizeof *m->aux_psum);
    m->aux_rows = 0;
}

static int moe_host_alloc(zn_model *m)
{
    zn_m_moe_host *h = &m->moe;
    if (m->d.n_experts <= 0)
        return 0;
    size_t N = (size_t)m->max_n, E = (size_t)m->d.n_experts, K = (size_t)m->d.top_k;
    h->raw = malloc(N * E * 4);
    h->p = malloc(N * E * sizeof *h->p);
    h->sel = malloc(N * K * sizeof *h->sel);
    h->val = malloc(N * K * sizeof *h->val);
    h->vsum = malloc(N * sizeof *h->vsum);
    h->wt = malloc(N * K * sizeof *h->wt);
    h->slot = malloc(N * K * sizeof *h->slot);
    h->off = malloc((E + 1) * sizeof *h->off);
    h->idx = malloc(N * K * sizeof *h->idx);
    h->w = malloc(N * K * sizeof *h->w);
    h->dw = malloc(N * K * sizeof *h->dw);
    h->dp = malloc(E * sizeof *h->dp);
    h->dv = malloc(K * sizeof *h->dv);
    h->q = malloc(E * sizeof *h->q);
    if (m->d.router_logits) {
        m->aux_cnt = calloc(E, sizeof *m->aux_cnt);
        m->aux_psum = calloc(E, sizeof *m->aux_psum);
    }
    if (!h->raw || !h->p || !h->sel || !h->val || !h->vsum || !h->wt || !h->slot || !h->off ||
        !h->idx || !h->w || !h->dw || !h->dp || !h->dv || !h->q ||
        (m->d.router_logits && (!m->aux_cnt || !m->aux_psum))) {
        moe_host_free(h);
        return zn_set_error(-ENOMEM, "model: out of memory for the routing of %zu tokens over "
                            "%zu experts", N, E);
    }
    return 0;
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
    m->woff = d->gemma_norm ? 1.0f : 0.0f;
    /* transformers: query_pre_attn_scalar**-0.5 in Python's float64 */
    m->attn_scale = d->attn_scalar > 0 ? (float)pow(d->attn_scalar, -0.5)
                                       : 1.0f / sqrtf((float)d->head_dim);
    m->attn_scale_full = m->attn_scale;
    m->attn_cap = (float)d->attn_softcap;
    m->final_cap = (float)d->final_softcap;
    /* transformers multiplies by sqrt(hidden) cast to the weights' type */
    m->emb_scale = 1.0f;
    if (d->embed_scaled) {
        float sc = sqrtf((float)d->hidden);
        m->emb_scale = cfg->dtype == ZN_DTYPE_BF16 ? zn_bf16_widen(zn_bf16_round(sc)) : sc;
    }
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
           d->head_dim <= ZN_FLASH_MAX_HEAD_DIM && cfg->max_seq > ZN_ATTN_AUTO_FUSED_SEQ;
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
    if (!rc)
        rc = zn_model_check_window(d, cfg->max_seq);
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
    m->staging = malloc((size_t)m->max_n * 6 * sizeof *m->staging);
    m->kv_pos0 = malloc((size_t)m->max_n * sizeof *m->kv_pos0);
    m->kv_slot = malloc((size_t)m->max_n * sizeof *m->kv_slot);
    if (!m->staging || !m->kv_pos0 || !m->kv_slot) {
        free(m->kv_pos0);
        free(m->kv_slot);
        free(m->staging);
        free(m);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    if ((rc = moe_host_alloc(m)) ||
        (rc = zn_dev_alloc(dev, m->mem_bytes, "model workspace", &m->mem))) {
        zn_model_destroy(m);
        return rc;
    }
    layout(m, m->mem);

    /* RoPE frequencies, once: the full-attention layers' table (every
     * layer's but gemma3's and olmo3's sliding ones) and the sliding
     * layers' (the same where they have none of their own); yarn's score
     * factor on the full-attention layers */
    float *inv = malloc((size_t)m->hd * sizeof *inv);
    if (!inv) {
        zn_model_destroy(m);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    int64_t full = -1, slide = -1;
    for (int64_t l = 0; l < d->n_layers; l++)
        *(zn_model_layer_slides(d, l) ? &slide : &full) = l;
    double fac = 1.0, unused;
    rc = zn_model_rope_table(d, full >= 0 ? full : 0, inv, &fac);
    if (!rc)
        rc = zn_model_rope_table(d, slide >= 0 ? slide : 0, inv + m->hd / 2, &unused);
    m->attn_scale_full = (float)(m->attn_scale * fac);
    if (!rc)
        rc = zn_dev_copy_h2d(dev, NULL, m->inv_freq, inv, (size_t)m->hd * 4);
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
    moe_host_free(&m->moe);
    free(m->aux_cnt);
    free(m->aux_psum);
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
        h[4 * N + i] = m->d.has_pad && ids[i] == m->d.pad_id ? -1 : ids[i];
        /* the window keeps keys (t - W, t]: transformers' sliding mask */
        int64_t w0 = (int64_t)t - m->d.sliding_window + 1;
        h[5 * N + i] = w0 > t - p ? (int32_t)w0 : t - p;
    }
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->ids, h, (size_t)N * 4));
    if (m->bwd_ids)
        ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->bwd_ids, h + 4 * N, (size_t)N * 4));
    m->win_on = m->kwin && seq > m->d.sliding_window;
    if (m->win_on)
        ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->kwin, h + 5 * N, (size_t)N * 4));
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->targets, h + N, (size_t)N * 4));
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->pos, h + 2 * N, (size_t)N * 4));
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->kstart, h + 3 * N, (size_t)N * 4));
    ZN_TRY(zn_dev_stream_sync(m->dev, s));
    m->B = batch;
    m->T = seq;
    m->N = N;
    m->decode = 0;
    aux_reset(m); /* a new batch: its own load-balancing statistics */
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
    m->win_on = 0;
    for (int64_t i = 0; i < N; i++) {
        h[N + i] = -1;
        h[2 * N + i] = (int32_t)(pos0[i / seq] + i % seq);
        h[3 * N + i] = 0;
        /* the window's first key among the cache's (absolute positions) */
        int64_t w0 = (int64_t)h[2 * N + i] - m->d.sliding_window + 1;
        h[5 * N + i] = w0 > 0 ? (int32_t)w0 : 0;
        m->win_on |= m->kwin && w0 > 0;
    }
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->ids, h, (size_t)N * 4));
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->targets, h + N, (size_t)N * 4));
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->pos, h + 2 * N, (size_t)N * 4));
    if (m->win_on)
        ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->kwin, h + 5 * N, (size_t)N * 4));
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
    zn_m_carver c = { NULL, 0 };
    zn_m_layer_acts a;
    zn_m_carve_acts(&c, &a, m);
    return c.off;
}

int zn_m_need_batch(const zn_model *m)
{
    if (!m->N)
        return zn_set_error(ZN_EARG, "model: no batch set (zn_model_set_batch)");
    return 0;
}
