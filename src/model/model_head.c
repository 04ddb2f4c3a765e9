/* The blocks at either end: the embedding (whole or in row parts) and the
 * head (final norm, lm_head and the chunked cross-entropy, whole or in row
 * parts), the logits of a few rows for generation and the loss. */
#include "zinc/device.h"
#include "zinc/model.h"
#include "model/model-impl.h"
#include "util/try-impl.h"

/* ---- embedding ---------------------------------------------------------------------- */

int zn_model_embed_fwd(zn_model *m, zn_stream *s, void *const *params, void *x_out)
{
    ZN_TRY(zn_m_need_batch(m));
    if (m->emb_scale != 1.0f)
        return zn_dev_embedding_scaled_fwd(m->dev, s, m->ids, m->N, params[0], m->dt, 0, m->V,
                                           m->H, x_out, m->dt, m->emb_scale);
    return zn_dev_embedding_fwd(m->dev, s, m->ids, m->N, params[0], m->dt, m->V, m->H, x_out,
                                m->dt);
}

int zn_model_embed_bwd(zn_model *m, zn_stream *s, void *const *params, const void *dx,
                       float *const *grads)
{
    (void)params;
    ZN_TRY(zn_m_need_batch(m));
    if (!grads[0])
        return 0; /* frozen */
    const int32_t *ids = m->bwd_ids ? m->bwd_ids : m->ids;
    if (m->emb_scale != 1.0f)
        return zn_dev_embedding_scaled_bwd(m->dev, s, ids, m->N, dx, m->dt, 0, m->V, m->H,
                                           grads[0], m->emb_scale);
    return zn_dev_embedding_bwd(m->dev, s, ids, m->N, dx, m->dt, m->V, m->H, grads[0]);
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
    ZN_TRY(zn_m_need_batch(m));
    ZN_TRY(part_of(m, 0, part, &pi));
    if (m->emb_scale != 1.0f)
        return zn_dev_embedding_scaled_fwd(m->dev, s, m->ids, m->N, table, m->dt, pi.row0,
                                           pi.rows, m->H, x_out, m->dt, m->emb_scale);
    if (pi.nparts == 1)
        return zn_dev_embedding_fwd(m->dev, s, m->ids, m->N, table, m->dt, m->V, m->H, x_out,
                                    m->dt);
    return zn_dev_embedding_rows_fwd(m->dev, s, m->ids, m->N, table, m->dt, pi.row0, pi.rows,
                                     m->H, x_out, m->dt);
}

int zn_model_embed_bwd_part(zn_model *m, zn_stream *s, int part, const void *dx, float *dtable)
{
    zn_model_part_info pi;
    ZN_TRY(zn_m_need_batch(m));
    ZN_TRY(part_of(m, 0, part, &pi));
    if (!dtable)
        return 0; /* frozen */
    const int32_t *ids = m->bwd_ids ? m->bwd_ids : m->ids;
    if (m->emb_scale != 1.0f)
        return zn_dev_embedding_scaled_bwd(m->dev, s, ids, m->N, dx, m->dt, pi.row0, pi.rows,
                                           m->H, dtable, m->emb_scale);
    return zn_dev_embedding_rows_bwd(m->dev, s, ids, m->N, dx, m->dt, pi.row0, pi.rows, m->H,
                                     dtable);
}

/* ---- head ------------------------------------------------------------------------ */

/* The head over lm_head rows [r0, r0 + nr) (W: those rows). `first`: the
 * part that normalizes x_in and starts the running log-sum-exp; `last`:
 * the one that turns it into the loss. */
static int head_fwd_rows(zn_model *m, zn_stream *s, const void *norm_w, const void *W,
                         const void *x_in, int64_t r0, int64_t nr, int first, int last)
{
    ZN_TRY(zn_m_need_batch(m));
    int64_t N = m->N, H = m->H, C = m->chunk;
    if (first)
        ZN_TRY(zn_m_rms_fwd(m, s, x_in, m->dt, norm_w, m->dt, m->hN, m->dt, m->rstdN, N,
                               H, (float)m->d.rms_eps));
    for (int64_t v0 = r0; v0 < r0 + nr; v0 += C) {
        int64_t c = r0 + nr - v0 < C ? r0 + nr - v0 : C;
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, N, c, H, 1.0f, m->hN, m->dt, H,
                        zn_m_at(W, (v0 - r0) * H, m->esz), m->dt, H, 0.0f, m->logits, ZN_DTYPE_F32,
                        c));
        if (m->final_cap > 0.0f) /* Gemma 2: cap tanh(logit / cap), in place */
            ZN_TRY(zn_dev_softcap_fwd(m->dev, s, m->logits, ZN_DTYPE_F32, m->logits,
                                      ZN_DTYPE_F32, N * c, 1.0f, m->final_cap));
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
    ZN_TRY(zn_m_need_batch(m));
    int64_t N = m->N, H = m->H, C = m->chunk;
    for (int64_t v0 = r0; v0 < r0 + nr; v0 += C) {
        int64_t c = r0 + nr - v0 < C ? r0 + nr - v0 : C;
        const void *Wc = zn_m_at(W, (v0 - r0) * H, m->esz);
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, N, c, H, 1.0f, m->hN, m->dt, H, Wc,
                        m->dt, H, 0.0f, m->logits, ZN_DTYPE_F32, c));
        ZN_TRY(zn_dev_xent_bwd_chunk(m->dev, s, m->logits, ZN_DTYPE_F32, N, c, c, v0, m->targets,
                                  m->lse, m->loss_scale, m->final_cap, m->dlogits, m->dt, c));
        /* dW[v0:v0+c] += dlogits^T hN;  dhN (+)= dlogits W[v0:v0+c] */
        if (dW)
            ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, c, H, N, 1.0f, m->dlogits, m->dt,
                            c, m->hN, m->dt, H, 1.0f, dW + (v0 - r0) * H, ZN_DTYPE_F32, H));
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, N, H, c, 1.0f, m->dlogits, m->dt, c,
                        Wc, m->dt, H, last && v0 == r0 ? 0.0f : 1.0f, m->dhN, ZN_DTYPE_F32, H));
    }
    if (!first)
        return 0;
    return zn_m_rms_bwd(m, s, x_in, m->dt, norm_w, m->dt, m->rstdN, m->dhN,
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
    ZN_TRY(zn_m_need_batch(m));
    if (row0 < 0 || nrows <= 0 || row0 + nrows > m->N)
        return zn_set_error(ZN_EARG, "model: logits rows [%lld, +%lld) outside the batch (%lld)",
                            (long long)row0, (long long)nrows, (long long)m->N);
    int64_t H = m->H;
    ZN_TRY(zn_m_rms_fwd(m, s, zn_m_at(x_in, row0 * H, m->esz), m->dt, params[0], m->dt,
                           m->hN, m->dt, m->rstdN, nrows, H, (float)m->d.rms_eps));
    ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, nrows, m->V, H, 1.0f, m->hN, m->dt, H,
                       params[1], m->dt, H, 0.0f, out, ZN_DTYPE_F32, m->V));
    if (m->final_cap <= 0.0f)
        return 0;
    return zn_dev_softcap_fwd(m->dev, s, out, ZN_DTYPE_F32, out, ZN_DTYPE_F32, nrows * m->V, 1.0f,
                              m->final_cap);
}

int zn_model_read_loss(zn_model *m, zn_stream *s, float *loss)
{
    ZN_TRY(zn_dev_copy_d2h(m->dev, s, loss, m->loss, 4));
    return zn_dev_stream_sync(m->dev, s);
}
