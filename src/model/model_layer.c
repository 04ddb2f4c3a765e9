/* One decoder layer's forward and backward: the attention over its q | k | v
 * (causal GEMMs in query blocks, the fused kernels, or the KV cache of a
 * decoding batch), the projections, the LoRA adapters and the MLP. */
#include <math.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "model/model-impl.h"
#include "util/hash-impl.h"
#include "util/try-impl.h"

/* ---- attention (one sequence at a time) ------------------------------------------- */

/* Every token's first key in layer `layer`: its window's (a sliding
 * window shorter than the batch's reach, on a layer that slides) or its
 * document's (packed documents), else NULL: plain causal attention from
 * key 0. */
static const int32_t *key_starts(const zn_model *m, int layer)
{
    if (m->win_on && zn_model_layer_slides(&m->d, layer))
        return m->kwin;
    return m->packed ? m->kstart : NULL;
}

/* Layer `layer`'s RoPE table and scores' scale: gemma3's and olmo3's
 * sliding layers rotate with their own base, and yarn scales the
 * full-attention layers' scores. */
static const float *layer_rope(const zn_model *m, int layer)
{
    return m->d.rope_local_theta > 0 && zn_model_layer_slides(&m->d, layer)
               ? m->inv_freq + m->hd / 2
               : m->inv_freq;
}

static float layer_scale(const zn_model *m, int layer)
{
    return zn_model_layer_slides(&m->d, layer) && m->d.rope_local_theta > 0 ? m->attn_scale
                                                                           : m->attn_scale_full;
}

/* Sequence b's first key per query, or NULL. */
static const int32_t *key_start(const zn_model *m, int layer, int64_t b)
{
    const int32_t *k = key_starts(m, layer);
    return k ? k + b * m->T : NULL;
}

/* The softmax's input from the raw scores SS ([nh][qn][kn]): scaled in the
 * softmax, or (soft-capping) capped into `into` (SS itself, or SC for a
 * backward that needs them) and taken as they are. Returns what to pass
 * the softmax and sets *scale to its scale. */
static const float *capped_scores(zn_model *m, zn_stream *s, int layer, int64_t n, float *into,
                                  float *scale, int *rc)
{
    *scale = layer_scale(m, layer);
    *rc = 0;
    if (m->attn_cap <= 0.0f)
        return m->SS;
    *scale = 1.0f;
    *rc = zn_dev_softcap_fwd(m->dev, s, m->SS, ZN_DTYPE_F32, into, ZN_DTYPE_F32, n,
                             layer_scale(m, layer), m->attn_cap);
    return into;
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
static int attn_probs(zn_model *m, zn_stream *s, int layer, const zn_m_layer_acts *a, int64_t b,
                      int64_t q0, int64_t qn)
{
    int64_t T = m->T, ld = m->qkv_ld, hd = m->hd, g = m->g, kn = q0 + qn;
    size_t e = m->esz;
    const void *qb = zn_m_at(a->qkv, b * T * ld, e);
    for (int64_t j = 0; j < m->nkv; j++)
        ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_TRANS, qn, kn, hd, 1.0f,
                                        zn_m_at(qb, q0 * ld + j * g * hd, e), m->dt, ld, hd,
                                        zn_m_at(qb, m->qd + j * hd, e), m->dt, ld, 0, 0.0f,
                                        m->SS + j * g * qn * kn, ZN_DTYPE_F32, kn, qn * kn, g));
    const int32_t *ks = key_start(m, layer, b);
    float scale;
    int rc;
    const float *S = capped_scores(m, s, layer, m->nh * qn * kn, m->SC, &scale, &rc);
    ZN_TRY(rc);
    return zn_dev_softmax_causal_fwd(m->dev, s, S, ZN_DTYPE_F32, m->P, m->dt, m->nh, qn, kn,
                                     q0, ks ? ks + q0 : NULL, scale);
}

/* The fused kernels take every sequence of the batch in one call; key
 * starts only when documents are packed. */
static int attn_fwd_fused(zn_model *m, zn_stream *s, int layer, const zn_m_layer_acts *a)
{
    return zn_dev_flash_attn_fwd(m->dev, s, a->qkv, m->dt, m->qkv_ld, m->B, m->T, m->nh, m->nkv,
                                 m->hd, key_starts(m, layer), layer_scale(m, layer), m->attn_cap,
                                 a->attn, m->qd, a->lse);
}

static int attn_bwd_fused(zn_model *m, zn_stream *s, int layer, const zn_m_layer_acts *a)
{
    return zn_dev_flash_attn_bwd(m->dev, s, a->qkv, m->dt, m->qkv_ld, m->B, m->T, m->nh, m->nkv,
                                 m->hd, key_starts(m, layer), layer_scale(m, layer), m->attn_cap,
                                 a->attn, m->d_attn, m->qd, a->lse, m->fdelta, m->dqkv,
                                 m->qkv_ld);
}

static int attn_fwd(zn_model *m, zn_stream *s, int layer, const zn_m_layer_acts *a)
{
    if (m->fused)
        return attn_fwd_fused(m, s, layer, a);
    int64_t T = m->T, ld = m->qkv_ld, hd = m->hd, g = m->g, QB = attn_rows(m);
    size_t e = m->esz;
    for (int64_t b = 0; b < m->B; b++)
        for (int64_t q0 = 0; q0 < T; q0 += QB) {
            int64_t qn = T - q0 < QB ? T - q0 : QB, kn = q0 + qn;
            ZN_TRY(attn_probs(m, s, layer, a, b, q0, qn));
            const void *vb = zn_m_at(a->qkv, b * T * ld + m->qd + m->kvd, e);
            void *ob = zn_m_at(a->attn, (b * T + q0) * m->qd, e);
            /* O_h = P_h V_j, the group's heads in one batch */
            for (int64_t j = 0; j < m->nkv; j++)
                ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, qn, hd, kn,
                                                1.0f, zn_m_at(m->P, j * g * qn * kn, e), m->dt, kn,
                                                qn * kn, zn_m_at(vb, j * hd, e), m->dt, ld, 0, 0.0f,
                                                zn_m_at(ob, j * g * hd, e), m->dt, m->qd, hd, g));
        }
    return 0;
}

/* Attention of the decoded tokens: each sequence's new keys and values join
 * its slot of the cache (kv: [slot][max_t][k | v]), then its queries meet
 * every cached key up to their own position (the causal mask with the
 * query offset at the cached length). */
static int attn_fwd_kv(zn_model *m, zn_stream *s, int layer, const zn_m_layer_acts *a,
                       void *kv)
{
    int64_t T = m->T, ld = m->qkv_ld, hd = m->hd, g = m->g, kvd = m->kvd, kld = 2 * kvd;
    int64_t QB = attn_rows(m);
    size_t e = m->esz;
    for (int64_t b = 0; b < m->B; b++) {
        int64_t p0 = m->kv_pos0[b];
        void *cb = zn_m_at(kv, m->kv_slot[b] * m->max_t * kld, e);
        const void *qb = zn_m_at(a->qkv, b * T * ld, e);
        ZN_TRY(zn_dev_copy_2d(m->dev, s, zn_m_at(qb, m->qd, e), m->dt, ld,
                              zn_m_at(cb, p0 * kld, e), m->dt, kld, T, kld));
        for (int64_t q0 = 0; q0 < T; q0 += QB) {
            int64_t qn = T - q0 < QB ? T - q0 : QB, kn = p0 + q0 + qn;
            for (int64_t j = 0; j < m->nkv; j++)
                ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_TRANS, qn, kn, hd,
                                                   1.0f, zn_m_at(qb, q0 * ld + j * g * hd, e),
                                                   m->dt, ld, hd, zn_m_at(cb, j * hd, e), m->dt,
                                                   kld, 0, 0.0f, m->SS + j * g * qn * kn,
                                                   ZN_DTYPE_F32, kn, qn * kn, g));
            const int32_t *ks = key_start(m, layer, b); /* the window's, over the cache */
            float scale;
            int rc;
            const float *S = capped_scores(m, s, layer, m->nh * qn * kn, m->SS, &scale, &rc);
            ZN_TRY(rc);
            ZN_TRY(zn_dev_softmax_causal_fwd(m->dev, s, S, ZN_DTYPE_F32, m->P, m->dt, m->nh,
                                             qn, kn, p0 + q0, ks ? ks + q0 : NULL, scale));
            void *ob = zn_m_at(a->attn, (b * T + q0) * m->qd, e);
            for (int64_t j = 0; j < m->nkv; j++)
                ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, qn, hd, kn,
                                                   1.0f, zn_m_at(m->P, j * g * qn * kn, e), m->dt,
                                                   kn, qn * kn, zn_m_at(cb, kvd + j * hd, e),
                                                   m->dt, kld, 0, 0.0f,
                                                   zn_m_at(ob, j * g * hd, e), m->dt, m->qd, hd,
                                                   g));
        }
    }
    return 0;
}

/* d_attn (= dL/d attention output) -> dqkv (q and k grads before RoPE's
 * backward). The query blocks run last to first: the last covers every
 * key, so its dK / dV products initialize them (beta 0) and the earlier,
 * shorter ones add. */
static int attn_bwd(zn_model *m, zn_stream *s, int layer, const zn_m_layer_acts *a)
{
    if (m->fused)
        return attn_bwd_fused(m, s, layer, a);
    int64_t T = m->T, ld = m->qkv_ld, hd = m->hd, g = m->g, qd = m->qd, kvd = m->kvd;
    int64_t QB = attn_rows(m), nblk = (T + QB - 1) / QB;
    size_t e = m->esz;
    float scale = layer_scale(m, layer);
    const int cap = m->attn_cap > 0.0f;
    for (int64_t b = 0; b < m->B; b++) {
        const void *qb = zn_m_at(a->qkv, b * T * ld, e);
        void *dqb = zn_m_at(m->dqkv, b * T * ld, e);
        /* dK_j and dV_j sum over the group's heads (and the query blocks):
         * in fp32 (dkv32, [T][dK | dV]) when the buffers are 16-bit,
         * rounded once at the end */
        float *acc = m->dkv32;
        void *dk = acc ? (void *)acc : zn_m_at(dqb, qd, e);
        void *dv = acc ? (void *)(acc + kvd) : zn_m_at(dqb, qd + kvd, e);
        zn_dtype adt = acc ? ZN_DTYPE_F32 : m->dt;
        size_t ae = acc ? 4 : e;
        int64_t ald = acc ? 2 * kvd : ld;
        for (int64_t k = nblk - 1; k >= 0; k--) {
            int64_t q0 = k * QB, qn = T - q0 < QB ? T - q0 : QB, kn = q0 + qn;
            int first = k == nblk - 1;
            ZN_TRY(attn_probs(m, s, layer, a, b, q0, qn));
            const void *dob = zn_m_at(m->d_attn, (b * T + q0) * qd, e);
            const void *qblk = zn_m_at(qb, q0 * ld, e);
            /* dP_h = dO_h V_j^T */
            for (int64_t j = 0; j < m->nkv; j++)
                ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_TRANS, qn, kn, hd,
                                                1.0f, zn_m_at(dob, j * g * hd, e), m->dt, qd, hd,
                                                zn_m_at(qb, qd + kvd + j * hd, e), m->dt, ld, 0,
                                                0.0f, m->dP + j * g * qn * kn, ZN_DTYPE_F32, kn,
                                                qn * kn, g));
            /* dV_j (+)= sum over the group's heads of P_h^T dO_h */
            for (int64_t h = 0; h < m->nh; h++)
                ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, kn, hd, qn, 1.0f,
                                zn_m_at(m->P, h * qn * kn, e), m->dt, kn, zn_m_at(dob, h * hd, e),
                                m->dt, qd, first && h % g == 0 ? 0.0f : 1.0f,
                                zn_m_at(dv, (h / g) * hd, ae), adt, ald));
            const int32_t *ks = key_start(m, layer, b);
            if (!cap) {
                ZN_TRY(zn_dev_softmax_causal_bwd(m->dev, s, m->P, m->dt, m->dP, ZN_DTYPE_F32,
                                                 m->dS, m->dt, m->nh, qn, kn, q0,
                                                 ks ? ks + q0 : NULL, scale));
            } else { /* dC in fp32 over dP, then through the cap (SC) into dS */
                ZN_TRY(zn_dev_softmax_causal_bwd(m->dev, s, m->P, m->dt, m->dP, ZN_DTYPE_F32,
                                                 m->dP, ZN_DTYPE_F32, m->nh, qn, kn, q0,
                                                 ks ? ks + q0 : NULL, 1.0f));
                ZN_TRY(zn_dev_softcap_bwd(m->dev, s, m->SC, ZN_DTYPE_F32, m->dP, ZN_DTYPE_F32,
                                          m->dS, m->dt, m->nh * qn * kn, scale, m->attn_cap));
            }
            /* dQ_h = dS_h K_j, the group's heads in one batch */
            for (int64_t j = 0; j < m->nkv; j++)
                ZN_TRY(zn_dev_gemm_strided_batched(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, qn, hd, kn,
                                                1.0f, zn_m_at(m->dS, j * g * qn * kn, e), m->dt,
                                                kn, qn * kn, zn_m_at(qb, qd + j * hd, e), m->dt,
                                                ld, 0, 0.0f,
                                                zn_m_at(dqb, q0 * ld + j * g * hd, e), m->dt, ld,
                                                hd, g));
            /* dK_j (+)= sum over the group's heads of dS_h^T Q_h */
            for (int64_t h = 0; h < m->nh; h++)
                ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, kn, hd, qn, 1.0f,
                                zn_m_at(m->dS, h * qn * kn, e), m->dt, kn,
                                zn_m_at(qblk, h * hd, e), m->dt, ld,
                                first && h % g == 0 ? 0.0f : 1.0f,
                                zn_m_at(dk, (h / g) * hd, ae), adt, ald));
        }
        if (acc)
            ZN_TRY(zn_dev_copy_2d(m->dev, s, acc, ZN_DTYPE_F32, 2 * kvd, zn_m_at(dqb, qd, e),
                               m->dt, ld, T, 2 * kvd));
    }
    return 0;
}

/* ---- decoder layer ----------------------------------------------------------------- */

/* A slot's parameter (or its fp32 gradient, NULL when frozen): its own
 * tensor, or its row block of a fused one (phi3's qkv_proj, gate_up_proj). */
static void *slot_param(const zn_model *m, int layer, void *const *params, int slot)
{
    int f;
    int64_t at;
    if (zn_m_slot_part(&m->d, slot, &f, &at))
        return zn_m_at(params[zn_m_slot_index(&m->d, layer, f)], at, m->esz);
    return params[zn_m_slot_index(&m->d, layer, slot)];
}

static float *slot_grad(const zn_model *m, int layer, float *const *grads, int slot)
{
    int f;
    int64_t at;
    if (zn_m_slot_part(&m->d, slot, &f, &at)) {
        float *g = grads[zn_m_slot_index(&m->d, layer, f)];
        return g ? g + at : NULL;
    }
    return grads[zn_m_slot_index(&m->d, layer, slot)];
}

#define PRM(slot) slot_param(m, layer, params, (slot))
#define GRD(slot) slot_grad(m, layer, grads, (slot))

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

/* u = A x into lu (the input dropped where training drops it; x and ldx
 * then name the dropped copy): the forward's, and again the backward's. */
static int lora_u(zn_model *m, zn_stream *s, const void *A, int layer, unsigned t,
                  const void **x, int64_t *ldx, int64_t in)
{
    ZN_TRY(lora_input(m, s, layer, t, x, ldx, in));
    return zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, m->N, m->d.lora.r, in, 1.0f, *x, m->dt,
                       *ldx, A, m->dt, in, 0.0f, m->lu, m->dt, m->d.lora.r);
}

static int lora_fwd(zn_model *m, zn_stream *s, void *const *params, int layer, unsigned t,
                    const void *x, int64_t ldx, int64_t in, int64_t out, void *y, int64_t ldy)
{
    int i = zn_m_lora_index(&m->d, layer, t);
    if (i < 0)
        return 0;
    int64_t r = m->d.lora.r;
    ZN_TRY(lora_u(m, s, params[i], layer, t, &x, &ldx, in));
    return zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, m->N, out, r, m->lscale, m->lu, m->dt, r,
                       params[i + 1], m->dt, r, 1.0f, y, m->dt, ldy);
}

/* gate_up_proj's adapter (phi3): one u = A x, its B's first `out` rows add
 * into y0 (gate), the next into y1 (up), zinc's two buffers. */
static int lora_fwd_pair(zn_model *m, zn_stream *s, void *const *params, int layer, unsigned t,
                         const void *x, int64_t ldx, int64_t in, int64_t out, void *y0,
                         void *y1, int64_t ldy)
{
    int i = zn_m_lora_index(&m->d, layer, t);
    if (i < 0)
        return 0;
    int64_t r = m->d.lora.r;
    ZN_TRY(lora_fwd(m, s, params, layer, t, x, ldx, in, out, y0, ldy)); /* u, then y0 */
    return zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, m->N, out, r, m->lscale, m->lu, m->dt, r,
                       zn_m_at(params[i + 1], out * r, m->esz), m->dt, r, 1.0f, y1, m->dt, ldy);
}

/* The adapter's weight gradients from its input x and dy: u = A x again,
 * dB += scale dy^T u, du = scale dy B (kept in ldu for lora_bwd_x),
 * dA += du^T x. Runs before the input x's buffer is reused. dy may come in
 * `parts` buffers of `out` columns each, B's rows in the same blocks
 * (gate_up_proj's adapter: gate's and up's): dB's blocks and du summed. */
static int lora_bwd_w_parts(zn_model *m, zn_stream *s, void *const *params,
                            float *const *grads, int layer, unsigned t, const void *x,
                            int64_t ldx, int64_t in, int64_t out, const void *const *dys,
                            int parts, int64_t lddy)
{
    int i = zn_m_lora_index(&m->d, layer, t);
    if (i < 0)
        return 0;
    int64_t r = m->d.lora.r, N = m->N;
    zn_dtype dt = m->dt;
    ZN_TRY(lora_u(m, s, params[i], layer, t, &x, &ldx, in));
    for (int h = 0; h < parts; h++) {
        if (grads[i + 1])
            ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, out, r, N, m->lscale, dys[h], dt,
                            lddy, m->lu, dt, r, 1.0f, grads[i + 1] + h * out * r, ZN_DTYPE_F32,
                            r));
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, N, r, out, m->lscale, dys[h], dt,
                        lddy, zn_m_at(params[i + 1], h * out * r, m->esz), dt, r,
                        h ? 1.0f : 0.0f, m->ldu, dt, r));
    }
    if (grads[i])
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, r, in, N, 1.0f, m->ldu, dt, r, x, dt,
                        ldx, 1.0f, grads[i], ZN_DTYPE_F32, in));
    return 0;
}

static int lora_bwd_w(zn_model *m, zn_stream *s, void *const *params, float *const *grads,
                      int layer, unsigned t, const void *x, int64_t ldx, int64_t in, int64_t out,
                      const void *dy, int64_t lddy)
{
    return lora_bwd_w_parts(m, s, params, grads, layer, t, x, ldx, in, out, &dy, 1, lddy);
}

static int lora_bwd_w_pair(zn_model *m, zn_stream *s, void *const *params, float *const *grads,
                           int layer, unsigned t, const void *x, int64_t ldx, int64_t in,
                           int64_t out, const void *dy0, const void *dy1, int64_t lddy)
{
    const void *dys[2] = { dy0, dy1 };
    return lora_bwd_w_parts(m, s, params, grads, layer, t, x, ldx, in, out, dys, 2, lddy);
}

/* dx += dropout'(du A), after the base projection wrote its part of dx. */
static int lora_bwd_x(zn_model *m, zn_stream *s, void *const *params, int layer, unsigned t,
                      int64_t in, void *dx, zn_dtype dxdt, int64_t lddx)
{
    int i = zn_m_lora_index(&m->d, layer, t);
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

/* The q/k norm's groups: per head over head_dim (qwen3), or one over the
 * whole projection (olmo2). */
typedef struct {
    int64_t qh, qdim, kh, kdim;
} qk_norm_shape;

static qk_norm_shape qk_shape(const zn_model *m)
{
    if (m->d.qk_norm == 2)
        return (qk_norm_shape){ 1, m->qd, 1, m->kvd };
    return (qk_norm_shape){ m->nh, m->hd, m->nkv, m->hd };
}

/* Where a post-norm's input (o_proj's or down_proj's output) and its rstd
 * live: with no pre-norms (olmo2) in the pre-norms' h1 / h2, beside them
 * (gemma2) in o_pre / d_pre. */
static void *post_in(const zn_model *m, const zn_m_layer_acts *a, int mlp, float **rstd)
{
    if (m->d.post_norm == 2) {
        *rstd = mlp ? a->rstd4 : a->rstd3;
        return mlp ? a->d_pre : a->o_pre;
    }
    *rstd = mlp ? a->rstd2 : a->rstd1;
    return mlp ? a->h2 : a->h1;
}

/* The MLP's input norm: post_attention_layernorm in the pre-norm families,
 * gemma2's pre_feedforward_layernorm. */
static int mlp_norm_slot(const zn_model *m)
{
    return m->d.post_norm == 2 ? ZN_M_P_PRE_FF_NORM : ZN_M_P_POST_NORM;
}

/* post-norm: d = act Wd^T (+ LoRA) into post_in's buffer, its norm's rstd
 * beside it, the norm written to y (x_out, or a scratch when only d and its
 * rstd are wanted). */
static int down_post(zn_model *m, zn_stream *s, void *const *params, int layer,
                     const zn_m_layer_acts *a, void *y)
{
    float *rs;
    void *d = post_in(m, a, 1, &rs);
    ZN_TRY(linear(m, s, a->act, m->I, PRM(ZN_M_P_WD), m->H, m->I, 0.0f, d, m->dt, m->H));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_DOWN, a->act, m->I, m->I, m->H, d, m->H));
    return zn_m_rms_fwd(m, s, d, m->dt, PRM(ZN_M_P_FF_NORM), m->dt, y, m->dt, rs, m->N, m->H,
                        (float)m->d.rms_eps);
}

/* Forward up to (not including) the down projection. */
static int layer_fwd_core(zn_model *m, zn_stream *s, int layer, void *const *params,
                          const void *x_in, const zn_m_layer_acts *a, void *kv)
{
    int64_t N = m->N, H = m->H, qd = m->qd, kvd = m->kvd, ld = m->qkv_ld, I = m->I;
    zn_dtype dt = m->dt;
    size_t e = m->esz;
    float eps = (float)m->d.rms_eps;

    /* post-norms alone (olmo2): the projections read x_in itself, and h1 /
     * h2 hold what o_proj and down_proj make before their norms; beside
     * pre-norms (gemma2) o_pre / d_pre hold them */
    const int pre = m->d.post_norm != 1, post = m->d.post_norm != 0;
    const void *xa = pre ? a->h1 : x_in;
    if (pre)
        ZN_TRY(zn_m_rms_fwd(m, s, x_in, dt, PRM(ZN_M_P_IN_NORM), dt, a->h1, dt,
                                  a->rstd1, N, H, eps));
    /* q and k go to qkv, or with a q/k norm to qk_pre ([N][qd + kvd]), which
     * the backward needs, the norm writing them into qkv */
    void *q = a->qkv, *k = zn_m_at(a->qkv, qd, e);
    int64_t qk_ld = ld;
    if (m->d.qk_norm) {
        q = a->qk_pre;
        k = zn_m_at(a->qk_pre, qd, e);
        qk_ld = qd + kvd;
    }
    ZN_TRY(linear(m, s, xa, H, PRM(ZN_M_P_WQ), qd, H, 0.0f, q, dt, qk_ld));
    ZN_TRY(linear(m, s, xa, H, PRM(ZN_M_P_WK), kvd, H, 0.0f, k, dt, qk_ld));
    ZN_TRY(linear(m, s, xa, H, PRM(ZN_M_P_WV), kvd, H, 0.0f, zn_m_at(a->qkv, qd + kvd, e), dt,
                  ld));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_Q, xa, H, H, qd, q, qk_ld));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_K, xa, H, H, kvd, k, qk_ld));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_V, xa, H, H, kvd,
                    zn_m_at(a->qkv, qd + kvd, e), ld));
    /* phi3's qkv_proj adapter: B's rows are q | k | v, qkv's columns */
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_QKV, xa, H, H, ld, a->qkv, ld));
    if (m->d.qkv_bias) {
        ZN_TRY(zn_dev_bias_add(m->dev, s, q, dt, qk_ld, PRM(ZN_M_P_BQ), dt, N, qd));
        ZN_TRY(zn_dev_bias_add(m->dev, s, k, dt, qk_ld, PRM(ZN_M_P_BK), dt, N, kvd));
        ZN_TRY(zn_dev_bias_add(m->dev, s, zn_m_at(a->qkv, qd + kvd, e), dt, ld, PRM(ZN_M_P_BV), dt,
                               N, kvd));
    }
    if (m->d.qk_norm) {
        qk_norm_shape g = qk_shape(m);
        ZN_TRY(zn_dev_rmsnorm_heads_fwd(m->dev, s, q, dt, qk_ld, PRM(ZN_M_P_QN), dt, a->qkv, dt,
                                        ld, a->qk_rstd, N, g.qh, g.qdim, eps, m->woff));
        ZN_TRY(zn_dev_rmsnorm_heads_fwd(m->dev, s, k, dt, qk_ld, PRM(ZN_M_P_KN), dt,
                                        zn_m_at(a->qkv, qd, e), dt, ld,
                                        a->qk_rstd + m->max_n * m->nh, N, g.kh, g.kdim, eps, m->woff));
    }
    const float *rope = layer_rope(m, layer);
    ZN_TRY(zn_dev_rope_fwd(m->dev, s, a->qkv, dt, N, m->nh, m->hd, ld, m->pos, rope));
    ZN_TRY(zn_dev_rope_fwd(m->dev, s, zn_m_at(a->qkv, qd, e), dt, N, m->nkv, m->hd, ld, m->pos,
                           rope));
    ZN_TRY(kv ? attn_fwd_kv(m, s, layer, a, kv) : attn_fwd(m, s, layer, a));
    /* x_mid = x_in + attn Wo^T (+ bo); post-norm: x_in + norm(attn Wo^T (+ bo)) */
    float *ro = NULL;
    void *o = post ? post_in(m, a, 0, &ro) : a->x_mid;
    if (!post)
        ZN_TRY(zn_dev_copy_d2d(m->dev, s, a->x_mid, x_in, (size_t)(N * H) * e));
    ZN_TRY(linear(m, s, a->attn, qd, PRM(ZN_M_P_WO), H, qd, post ? 0.0f : 1.0f, o, dt, H));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_O, a->attn, qd, qd, H, o, H));
    if (m->d.o_bias)
        ZN_TRY(zn_dev_bias_add(m->dev, s, o, dt, H, PRM(ZN_M_P_BO), dt, N, H));
    if (post) {
        ZN_TRY(zn_m_rms_fwd(m, s, o, dt, PRM(ZN_M_P_POST_NORM), dt, a->x_mid, dt, ro, N, H,
                            eps));
        ZN_TRY(zn_dev_add_inplace(m->dev, s, a->x_mid, dt, x_in, dt, N * H));
    }
    if (pre)
        ZN_TRY(zn_m_rms_fwd(m, s, a->x_mid, dt, PRM(mlp_norm_slot(m)), dt, a->h2, dt, a->rstd2,
                            N, H, eps));
    const void *xm = pre ? a->h2 : a->x_mid; /* the MLP's input */
    if (zn_model_layer_moe(&m->d, layer))
        return 0; /* the experts run in layer_fwd and in the backward (model_moe.c) */
    ZN_TRY(linear(m, s, xm, H, PRM(ZN_M_P_WG), I, H, 0.0f, a->gate, dt, I));
    ZN_TRY(linear(m, s, xm, H, PRM(ZN_M_P_WU), I, H, 0.0f, a->up, dt, I));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_GATE, xm, H, H, I, a->gate, I));
    ZN_TRY(lora_fwd(m, s, params, layer, ZN_LORA_UP, xm, H, H, I, a->up, I));
    ZN_TRY(lora_fwd_pair(m, s, params, layer, ZN_LORA_GATE_UP, xm, H, H, I, a->gate, a->up, I));
    return zn_m_glu_fwd(m, s, a->gate, a->up, a->act, dt, N * I);
}

static int check_layer(const zn_model *m, int layer)
{
    ZN_TRY(zn_m_need_batch(m));
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
    zn_m_layer_acts a = m->w;
    if (saved) {
        zn_m_carver c = { saved, 0 };
        zn_m_carve_acts(&c, &a, m);
    }
    ZN_TRY(layer_fwd_core(m, s, layer, params, x_in, &a, kv));
    if (m->d.post_norm) { /* x_out = x_mid + norm(act Wd^T) */
        ZN_TRY(down_post(m, s, params, layer, &a, x_out));
        return zn_dev_add_inplace(m->dev, s, x_out, m->dt, a.x_mid, m->dt, m->N * m->H);
    }
    /* x_out = x_mid + act Wd^T, or + the experts' weighted sum */
    ZN_TRY(zn_dev_copy_d2d(m->dev, s, x_out, a.x_mid, (size_t)(m->N * m->H) * m->esz));
    if (zn_model_layer_moe(&m->d, layer))
        return zn_m_moe_fwd(m, s, layer, params, a.h2, x_out);
    ZN_TRY(linear(m, s, a.act, m->I, PRM(ZN_M_P_WD), m->H, m->I, 1.0f, x_out, m->dt, m->H));
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
    const zn_m_layer_acts *w = &m->w;
    zn_m_layer_acts a = m->w;
    if (saved) {
        zn_m_carver c = { (unsigned char *)saved, 0 };
        zn_m_carve_acts(&c, &a, m);
    } else {
        ZN_TRY(layer_fwd_core(m, s, layer, params, x_in, &a, NULL)); /* activation checkpointing */
    }

    const int pre = m->d.post_norm != 1, post = m->d.post_norm != 0;
    const void *xa = pre ? a.h1 : x_in;  /* the attention's input */
    const void *xm = pre ? a.h2 : a.x_mid; /* the MLP's */
    /* post-norm: through the MLP's output norm first (its input and rstd
     * recomputed when not saved), d(down's output) in dxm */
    const void *dyd = dy;
    if (post) {
        if (!saved)
            ZN_TRY(down_post(m, s, params, layer, &a, m->dxm));
        float *rd;
        const void *dpre = post_in(m, &a, 1, &rd);
        ZN_TRY(zn_m_rms_bwd(m, s, dpre, dt, PRM(ZN_M_P_FF_NORM), dt, rd, dy, dt, m->dxm, dt,
                            GRD(ZN_M_P_FF_NORM), N, H));
        dyd = m->dxm;
    }

    if (zn_model_layer_moe(&m->d, layer)) {
        ZN_TRY(zn_m_moe_bwd(m, s, layer, params, grads, xm, dyd, m->dh));
        goto mlp_done;
    }
    /* MLP: out = act Wd^T */
    ZN_TRY(linear_dw(m, s, dyd, H, a.act, I, H, I, GRD(ZN_M_P_WD)));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_DOWN, a.act, I, I, H, dyd, H));
    ZN_TRY(linear_dx(m, s, dyd, H, PRM(ZN_M_P_WD), H, I, 0.0f, w->act, dt, I));       /* d_act */
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_DOWN, I, w->act, dt, I));
    ZN_TRY(zn_m_glu_bwd(m, s, a.gate, a.up, w->act, w->gate, w->up, dt, N * I));
    ZN_TRY(linear_dw(m, s, w->gate, I, xm, H, I, H, GRD(ZN_M_P_WG)));
    ZN_TRY(linear_dw(m, s, w->up, I, xm, H, I, H, GRD(ZN_M_P_WU)));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_GATE, xm, H, H, I, w->gate, I));
    ZN_TRY(linear_dx(m, s, w->gate, I, PRM(ZN_M_P_WG), I, H, 0.0f, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_GATE, H, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_UP, xm, H, H, I, w->up, I));
    ZN_TRY(linear_dx(m, s, w->up, I, PRM(ZN_M_P_WU), I, H, 1.0f, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_UP, H, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_w_pair(m, s, params, grads, layer, ZN_LORA_GATE_UP, xm, H, H, I, w->gate,
                           w->up, I));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_GATE_UP, H, m->dh, ZN_DTYPE_F32, H));
mlp_done:
    if (!pre)
        ZN_TRY(zn_dev_copy_d2d(m->dev, s, m->dxm32, m->dh, (size_t)(N * H) * 4));
    else
        ZN_TRY(zn_m_rms_bwd(m, s, a.x_mid, dt, PRM(mlp_norm_slot(m)), dt, a.rstd2,
                                  m->dh, ZN_DTYPE_F32, m->dxm32, ZN_DTYPE_F32,
                                  GRD(mlp_norm_slot(m)), N, H));
    ZN_TRY(zn_dev_add_inplace(m->dev, s, m->dxm32, ZN_DTYPE_F32, dy, dt, N * H)); /* residual */
    if (dt != ZN_DTYPE_F32)
        ZN_TRY(zn_dev_cast(m->dev, s, m->dxm32, ZN_DTYPE_F32, m->dxm, dt, N * H));

    /* attention output projection; post-norm: through its norm first, into
     * the workspace's h2 (free by now) */
    const void *dov = m->dxm;
    if (post) {
        float *ro;
        const void *opre = post_in(m, &a, 0, &ro);
        ZN_TRY(zn_m_rms_bwd(m, s, opre, dt, PRM(ZN_M_P_POST_NORM), dt, ro, m->dxm, dt, w->h2, dt,
                            GRD(ZN_M_P_POST_NORM), N, H));
        dov = w->h2;
    }
    ZN_TRY(linear_dw(m, s, dov, H, a.attn, qd, H, qd, GRD(ZN_M_P_WO)));
    if (m->d.o_bias && GRD(ZN_M_P_BO))
        ZN_TRY(zn_dev_bias_grad(m->dev, s, dov, dt, H, GRD(ZN_M_P_BO), N, H));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_O, a.attn, qd, qd, H, dov, H));
    ZN_TRY(linear_dx(m, s, dov, H, PRM(ZN_M_P_WO), H, qd, 0.0f, m->d_attn, dt, qd));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_O, qd, m->d_attn, dt, qd));
    ZN_TRY(attn_bwd(m, s, layer, &a));
    const float *rope = layer_rope(m, layer);
    ZN_TRY(zn_dev_rope_bwd(m->dev, s, m->dqkv, dt, N, m->nh, m->hd, ld, m->pos, rope));
    ZN_TRY(zn_dev_rope_bwd(m->dev, s, zn_m_at(m->dqkv, qd, e), dt, N, m->nkv, m->hd, ld, m->pos,
                           rope));
    if (m->d.qk_norm) { /* dqkv's q and k: through their norms, in place */
        qk_norm_shape g = qk_shape(m);
        ZN_TRY(zn_dev_rmsnorm_heads_bwd(m->dev, s, a.qk_pre, dt, qd + kvd, PRM(ZN_M_P_QN), dt,
                                        a.qk_rstd, m->dqkv, dt, m->dqkv, dt, ld, GRD(ZN_M_P_QN),
                                        N, g.qh, g.qdim, m->woff));
        ZN_TRY(zn_dev_rmsnorm_heads_bwd(m->dev, s, zn_m_at(a.qk_pre, qd, e), dt, qd + kvd,
                                        PRM(ZN_M_P_KN), dt, a.qk_rstd + m->max_n * m->nh,
                                        zn_m_at(m->dqkv, qd, e), dt, zn_m_at(m->dqkv, qd, e), dt,
                                        ld, GRD(ZN_M_P_KN), N, g.kh, g.kdim, m->woff));
    }
    if (m->d.qkv_bias && GRD(ZN_M_P_BQ)) {
        ZN_TRY(zn_dev_bias_grad(m->dev, s, m->dqkv, dt, ld, GRD(ZN_M_P_BQ), N, qd));
        ZN_TRY(zn_dev_bias_grad(m->dev, s, zn_m_at(m->dqkv, qd, e), dt, ld, GRD(ZN_M_P_BK), N,
                                kvd));
        ZN_TRY(zn_dev_bias_grad(m->dev, s, zn_m_at(m->dqkv, qd + kvd, e), dt, ld, GRD(ZN_M_P_BV),
                                N, kvd));
    }
    ZN_TRY(linear_dw(m, s, m->dqkv, ld, xa, H, qd, H, GRD(ZN_M_P_WQ)));
    ZN_TRY(linear_dw(m, s, zn_m_at(m->dqkv, qd, e), ld, xa, H, kvd, H, GRD(ZN_M_P_WK)));
    ZN_TRY(linear_dw(m, s, zn_m_at(m->dqkv, qd + kvd, e), ld, xa, H, kvd, H, GRD(ZN_M_P_WV)));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_Q, xa, H, H, qd, m->dqkv, ld));
    ZN_TRY(linear_dx(m, s, m->dqkv, ld, PRM(ZN_M_P_WQ), qd, H, 0.0f, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_Q, H, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_K, xa, H, H, kvd,
                      zn_m_at(m->dqkv, qd, e), ld));
    ZN_TRY(linear_dx(m, s, zn_m_at(m->dqkv, qd, e), ld, PRM(ZN_M_P_WK), kvd, H, 1.0f, m->dh,
                     ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_K, H, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_V, xa, H, H, kvd,
                      zn_m_at(m->dqkv, qd + kvd, e), ld));
    ZN_TRY(linear_dx(m, s, zn_m_at(m->dqkv, qd + kvd, e), ld, PRM(ZN_M_P_WV), kvd, H, 1.0f, m->dh,
                  ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_V, H, m->dh, ZN_DTYPE_F32, H));
    ZN_TRY(lora_bwd_w(m, s, params, grads, layer, ZN_LORA_QKV, xa, H, H, ld, m->dqkv, ld));
    ZN_TRY(lora_bwd_x(m, s, params, layer, ZN_LORA_QKV, H, m->dh, ZN_DTYPE_F32, H));
    if (pre)
        ZN_TRY(zn_m_rms_bwd(m, s, x_in, dt, PRM(ZN_M_P_IN_NORM), dt, a.rstd1, m->dh,
                                  ZN_DTYPE_F32, m->dh, ZN_DTYPE_F32, GRD(ZN_M_P_IN_NORM), N, H));
    ZN_TRY(zn_dev_add_inplace(m->dev, s, m->dxm32, ZN_DTYPE_F32, m->dh, ZN_DTYPE_F32, N * H));
    return zn_dev_cast(m->dev, s, m->dxm32, ZN_DTYPE_F32, dx, dt, N * H);
}
