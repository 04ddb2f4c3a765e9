/* The decoder's device ops: embedding, RMSNorm, RoPE, causal softmax, the
 * fused attention, cross-entropy in chunks; checked and handed to the
 * backend as op descriptors like the generic ops (device_ops.c). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hwloc.h>

#include "gpu/gpu-impl.h"
#include "util/hash-impl.h"

/* ---- kernels ------------------------------------------------------------*/
static int emb_fwd_op(zn_dev *d, zn_stream *s, const char *fn, const int32_t *ids,
                      int64_t n_tokens, const void *table, zn_dtype table_dt, int64_t row0,
                      int64_t vocab, int64_t dim, void *out, zn_dtype out_dt, int skip)
{
    CHK_DT(fn, table_dt);
    CHK_DT(fn, out_dt);
    CHK(n_tokens >= 0 && vocab > 0 && dim > 0 && row0 >= 0, "%s: bad sizes (tokens %lld "
        "rows %lld from %lld, dim %lld)", fn, (long long)n_tokens, (long long)vocab,
        (long long)row0, (long long)dim);
    if (n_tokens == 0)
        return 0;
    CHK_PTR(fn, ids, (uint64_t)n_tokens * 4);
    CHK_PTR(fn, table, span(vocab, dim, dim, table_dt));
    CHK_PTR(fn, out, span(n_tokens, dim, dim, out_dt));
    zn_op op = { .kind = ZN_OPK_EMB_FWD };
    op.u.emb.ids = ids;
    op.u.emb.n_tokens = n_tokens;
    op.u.emb.vocab = vocab;
    op.u.emb.dim = dim;
    op.u.emb.row0 = row0;
    op.u.emb.skip = skip;
    op.u.emb.table = table;
    op.u.emb.table_dt = table_dt;
    op.u.emb.out = out;
    op.u.emb.out_dt = out_dt;
    return submit(d, s, &op);
}

static int emb_bwd_op(zn_dev *d, zn_stream *s, const char *fn, const int32_t *ids,
                      int64_t n_tokens, const void *dout, zn_dtype dout_dt, int64_t row0,
                      int64_t vocab, int64_t dim, float *dtable)
{
    CHK_DT(fn, dout_dt);
    CHK(n_tokens >= 0 && vocab > 0 && dim > 0 && row0 >= 0, "%s: bad sizes (tokens %lld "
        "rows %lld from %lld, dim %lld)", fn, (long long)n_tokens, (long long)vocab,
        (long long)row0, (long long)dim);
    if (n_tokens == 0)
        return 0;
    CHK_PTR(fn, ids, (uint64_t)n_tokens * 4);
    CHK_PTR(fn, dout, span(n_tokens, dim, dim, dout_dt));
    CHK_PTR(fn, dtable, span(vocab, dim, dim, ZN_DTYPE_F32));
    zn_op op = { .kind = ZN_OPK_EMB_BWD };
    op.u.emb.ids = ids;
    op.u.emb.n_tokens = n_tokens;
    op.u.emb.vocab = vocab;
    op.u.emb.dim = dim;
    op.u.emb.row0 = row0;
    op.u.emb.skip = 1;
    op.u.emb.dout = dout;
    op.u.emb.dout_dt = dout_dt;
    op.u.emb.dtable = dtable;
    return submit(d, s, &op);
}

int zn_dev_embedding_fwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                         const void *table, zn_dtype table_dt, int64_t vocab, int64_t dim,
                         void *out, zn_dtype out_dt)
{
    return emb_fwd_op(d, s, "embedding_fwd", ids, n_tokens, table, table_dt, 0, vocab, dim, out,
                      out_dt, 0);
}

int zn_dev_embedding_rows_fwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                              const void *table, zn_dtype table_dt, int64_t row0, int64_t rows,
                              int64_t dim, void *out, zn_dtype out_dt)
{
    return emb_fwd_op(d, s, "embedding_rows_fwd", ids, n_tokens, table, table_dt, row0, rows,
                      dim, out, out_dt, 1);
}

int zn_dev_embedding_bwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                         const void *dout, zn_dtype dout_dt, int64_t vocab, int64_t dim,
                         float *dtable)
{
    return emb_bwd_op(d, s, "embedding_bwd", ids, n_tokens, dout, dout_dt, 0, vocab, dim,
                      dtable);
}

int zn_dev_embedding_rows_bwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                              const void *dout, zn_dtype dout_dt, int64_t row0, int64_t rows,
                              int64_t dim, float *dtable)
{
    return emb_bwd_op(d, s, "embedding_rows_bwd", ids, n_tokens, dout, dout_dt, row0, rows, dim,
                      dtable);
}

int zn_dev_rmsnorm_fwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, const void *w,
                       zn_dtype w_dt, void *y, zn_dtype y_dt, float *rstd, int64_t rows,
                       int64_t dim, float eps)
{
    const char *fn = "rmsnorm_fwd";
    CHK_DT(fn, x_dt);
    CHK_DT(fn, w_dt);
    CHK_DT(fn, y_dt);
    CHK(rows >= 0 && dim > 0, "%s: bad sizes (rows %lld dim %lld)", fn, (long long)rows,
        (long long)dim);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, x, span(rows, dim, dim, x_dt));
    CHK_PTR(fn, w, nbytes(dim, w_dt));
    CHK_PTR(fn, y, span(rows, dim, dim, y_dt));
    if (rstd)
        CHK_PTR(fn, rstd, (uint64_t)rows * 4);
    zn_op op = { .kind = ZN_OPK_RMS_FWD };
    op.u.rms_fwd.x = x;
    op.u.rms_fwd.x_dt = x_dt;
    op.u.rms_fwd.w = w;
    op.u.rms_fwd.w_dt = w_dt;
    op.u.rms_fwd.y = y;
    op.u.rms_fwd.y_dt = y_dt;
    op.u.rms_fwd.rstd = rstd;
    op.u.rms_fwd.rows = rows;
    op.u.rms_fwd.dim = dim;
    op.u.rms_fwd.eps = eps;
    return submit(d, s, &op);
}

int zn_dev_rmsnorm_bwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, const void *w,
                       zn_dtype w_dt, const float *rstd, const void *dy, zn_dtype dy_dt,
                       void *dx, zn_dtype dx_dt, float *dw, int64_t rows, int64_t dim)
{
    const char *fn = "rmsnorm_bwd";
    CHK_DT(fn, x_dt);
    CHK_DT(fn, w_dt);
    CHK_DT(fn, dy_dt);
    CHK_DT(fn, dx_dt);
    CHK(rows >= 0 && dim > 0, "%s: bad sizes (rows %lld dim %lld)", fn, (long long)rows,
        (long long)dim);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, x, span(rows, dim, dim, x_dt));
    CHK_PTR(fn, w, nbytes(dim, w_dt));
    CHK_PTR(fn, rstd, (uint64_t)rows * 4);
    CHK_PTR(fn, dy, span(rows, dim, dim, dy_dt));
    CHK_PTR(fn, dx, span(rows, dim, dim, dx_dt));
    if (dw)
        CHK_PTR(fn, dw, (uint64_t)dim * 4);
    zn_op op = { .kind = ZN_OPK_RMS_BWD };
    op.u.rms_bwd.x = x;
    op.u.rms_bwd.x_dt = x_dt;
    op.u.rms_bwd.w = w;
    op.u.rms_bwd.w_dt = w_dt;
    op.u.rms_bwd.rstd = rstd;
    op.u.rms_bwd.dy = dy;
    op.u.rms_bwd.dy_dt = dy_dt;
    op.u.rms_bwd.dx = dx;
    op.u.rms_bwd.dx_dt = dx_dt;
    op.u.rms_bwd.dw = dw;
    op.u.rms_bwd.rows = rows;
    op.u.rms_bwd.dim = dim;
    return submit(d, s, &op);
}

static int rope(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t tokens,
                int64_t n_heads, int64_t head_dim, int64_t ld, const int32_t *pos,
                const float *inv_freq, int inverse)
{
    const char *fn = inverse ? "rope_bwd" : "rope_fwd";
    CHK_DT(fn, dt);
    CHK(tokens >= 0 && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
        "%s: bad sizes (tokens %lld heads %lld head_dim %lld; head_dim must be even)", fn,
        (long long)tokens, (long long)n_heads, (long long)head_dim);
    CHK(ld >= n_heads * head_dim, "%s: ld %lld < n_heads*head_dim %lld", fn, (long long)ld,
        (long long)(n_heads * head_dim));
    if (tokens == 0)
        return 0;
    CHK_PTR(fn, x, span(tokens, n_heads * head_dim, ld, dt));
    CHK_PTR(fn, pos, (uint64_t)tokens * 4);
    CHK_PTR(fn, inv_freq, (uint64_t)(head_dim / 2) * 4);
    zn_op op = { .kind = ZN_OPK_ROPE };
    op.u.rope.x = x;
    op.u.rope.dt = dt;
    op.u.rope.tokens = tokens;
    op.u.rope.n_heads = n_heads;
    op.u.rope.head_dim = head_dim;
    op.u.rope.ld = ld;
    op.u.rope.pos = pos;
    op.u.rope.inv_freq = inv_freq;
    op.u.rope.inverse = inverse;
    return submit(d, s, &op);
}

int zn_dev_rope_fwd(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t tokens,
                    int64_t n_heads, int64_t head_dim, int64_t ld, const int32_t *pos,
                    const float *inv_freq)
{
    return rope(d, s, x, dt, tokens, n_heads, head_dim, ld, pos, inv_freq, 0);
}

int zn_dev_rope_bwd(zn_dev *d, zn_stream *s, void *dx, zn_dtype dt, int64_t tokens,
                    int64_t n_heads, int64_t head_dim, int64_t ld, const int32_t *pos,
                    const float *inv_freq)
{
    return rope(d, s, dx, dt, tokens, n_heads, head_dim, ld, pos, inv_freq, 1);
}

void zn_rope_inv_freq(float *inv_freq, int64_t head_dim, double theta,
                      const zn_rope_scaling *sc)
{
    const double pi = 3.14159265358979323846;
    for (int64_t i = 0; i < head_dim / 2; i++) {
        /* HF: 1 / theta ** (arange(0, dim, 2).float() / dim), in fp32. */
        float e = (float)(2 * i) / (float)head_dim;
        float f = 1.0f / powf((float)theta, e);
        if (sc && sc->factor > 0) {
            double lo_wl = sc->original_max_position / sc->low_freq_factor;
            double hi_wl = sc->original_max_position / sc->high_freq_factor;
            double wl = 2 * pi / f;
            double v = f;
            if (wl > lo_wl) {
                v = f / sc->factor;
            } else if (wl >= hi_wl) {   /* medium band: smooth interpolation */
                double sm = (sc->original_max_position / wl - sc->low_freq_factor) /
                            (sc->high_freq_factor - sc->low_freq_factor);
                v = (1 - sm) * f / sc->factor + sm * f;
            }
            f = (float)v;
        }
        inv_freq[i] = f;
    }
}

static int softmax(zn_dev *d, zn_stream *s, const void *S, zn_dtype S_dt, const void *dP,
                   zn_dtype dP_dt, void *out, zn_dtype out_dt, int64_t batch, int64_t rows,
                   int64_t cols, int64_t q_offset, const int32_t *key_start, float scale,
                   int bwd)
{
    const char *fn = bwd ? "softmax_causal_bwd" : "softmax_causal_fwd";
    CHK_DT(fn, S_dt);
    CHK_DT(fn, out_dt);
    if (bwd)
        CHK_DT(fn, dP_dt);
    CHK(batch >= 0 && rows >= 0 && cols > 0 && q_offset >= 0,
        "%s: bad sizes (batch %lld rows %lld cols %lld q_offset %lld)", fn, (long long)batch,
        (long long)rows, (long long)cols, (long long)q_offset);
    if (batch == 0 || rows == 0)
        return 0;
    CHK_PTR(fn, S, span(batch * rows, cols, cols, S_dt));
    CHK_PTR(fn, out, span(batch * rows, cols, cols, out_dt));
    if (bwd)
        CHK_PTR(fn, dP, span(batch * rows, cols, cols, dP_dt));
    if (key_start)
        CHK_PTR(fn, key_start, (uint64_t)rows * 4);
    zn_op op = { .kind = bwd ? ZN_OPK_SOFTMAX_BWD : ZN_OPK_SOFTMAX_FWD };
    if (bwd) {
        op.u.softmax.Pin = S;
        op.u.softmax.Pin_dt = S_dt;
        op.u.softmax.dP = dP;
        op.u.softmax.dP_dt = dP_dt;
    } else {
        op.u.softmax.S = S;
        op.u.softmax.S_dt = S_dt;
    }
    op.u.softmax.P = out;
    op.u.softmax.P_dt = out_dt;
    op.u.softmax.batch = batch;
    op.u.softmax.rows = rows;
    op.u.softmax.cols = cols;
    op.u.softmax.q_offset = q_offset;
    op.u.softmax.key_start = key_start;
    op.u.softmax.scale = scale;
    return submit(d, s, &op);
}

int zn_dev_softmax_causal_fwd(zn_dev *d, zn_stream *s, const void *S, zn_dtype S_dt, void *P,
                              zn_dtype P_dt, int64_t batch, int64_t rows, int64_t cols,
                              int64_t q_offset, const int32_t *key_start, float scale)
{
    return softmax(d, s, S, S_dt, NULL, ZN_DTYPE_F32, P, P_dt, batch, rows, cols, q_offset,
                   key_start, scale, 0);
}

int zn_dev_softmax_causal_bwd(zn_dev *d, zn_stream *s, const void *P, zn_dtype P_dt,
                              const void *dP, zn_dtype dP_dt, void *dS, zn_dtype dS_dt,
                              int64_t batch, int64_t rows, int64_t cols, int64_t q_offset,
                              const int32_t *key_start, float scale)
{
    return softmax(d, s, P, P_dt, dP, dP_dt, dS, dS_dt, batch, rows, cols, q_offset, key_start,
                   scale, 1);
}

/* ---- fused attention -----------------------------------------------------*/
static int overlap(const void *a, uint64_t an, const void *b, uint64_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

static int flash(zn_dev *d, zn_stream *s, zn_op *op, int bwd)
{
    const char *fn = bwd ? "flash_attn_bwd" : "flash_attn_fwd";
    zn_dtype dt = op->u.flash.dt;
    int64_t ld = op->u.flash.ld, B = op->u.flash.batch, T = op->u.flash.seq;
    int64_t nh = op->u.flash.nh, nkv = op->u.flash.nkv, hd = op->u.flash.hd;
    int64_t ldo = op->u.flash.ldo;
    CHK_DT(fn, dt);
    if (zn_dev_get_kind(d) == ZN_DEV_CUDA && dt != ZN_DTYPE_BF16)
        return zn_set_error(ZN_EUNSUPPORTED, "%s: dtype %s on CUDA (the fused attention runs "
                            "on bf16 tensor cores; use the GEMM attention for f32)", fn,
                            zn_dtype_name(dt));
    CHK(B >= 0 && T >= 0 && nh > 0 && nkv > 0 && nh % nkv == 0,
        "%s: bad sizes (batch %lld seq %lld heads %lld kv heads %lld)", fn, (long long)B,
        (long long)T, (long long)nh, (long long)nkv);
    CHK(hd > 0 && hd <= ZN_FLASH_MAX_HEAD_DIM && hd % 2 == 0,
        "%s: head_dim %lld (fused attention takes even head dims up to %d)", fn,
        (long long)hd, ZN_FLASH_MAX_HEAD_DIM);
    int64_t cols = (nh + 2 * nkv) * hd;
    CHK(ld >= cols && ldo >= nh * hd,
        "%s: leading dimensions %lld / %lld below the rows' %lld / %lld columns", fn,
        (long long)ld, (long long)ldo, (long long)cols, (long long)(nh * hd));
    CHK(isfinite(op->u.flash.scale), "%s: scale %g", fn, (double)op->u.flash.scale);
    int64_t N = B * T;
    if (N == 0)
        return 0;
    uint64_t qkv_b = span(N, cols, ld, dt), o_b = span(N, nh * hd, ldo, dt);
    uint64_t st_b = (uint64_t)(B * nh * T) * 4;
    CHK_PTR(fn, op->u.flash.qkv, qkv_b);
    CHK_PTR(fn, op->u.flash.lse, st_b);
    if (op->u.flash.key_start)
        CHK_PTR(fn, op->u.flash.key_start, (uint64_t)N * 4);
    if (!bwd) {
        CHK_PTR(fn, op->u.flash.out, o_b);
        CHK(!overlap(op->u.flash.out, o_b, op->u.flash.qkv, qkv_b),
            "%s: out overlaps qkv", fn);
    } else {
        int64_t ldd = op->u.flash.ldd;
        CHK(ldd >= cols, "%s: ldd %lld below the rows' %lld columns", fn, (long long)ldd,
            (long long)cols);
        uint64_t d_b = span(N, cols, ldd, dt);
        CHK_PTR(fn, op->u.flash.out, o_b);
        CHK_PTR(fn, op->u.flash.dout, o_b);
        CHK_PTR(fn, op->u.flash.delta, st_b);
        CHK_PTR(fn, op->u.flash.dqkv, d_b);
        CHK(!overlap(op->u.flash.dqkv, d_b, op->u.flash.qkv, qkv_b) &&
                !overlap(op->u.flash.dqkv, d_b, op->u.flash.out, o_b) &&
                !overlap(op->u.flash.dqkv, d_b, op->u.flash.dout, o_b),
            "%s: dqkv overlaps qkv, out or dout", fn);
    }
    op->kind = bwd ? ZN_OPK_FLASH_BWD : ZN_OPK_FLASH_FWD;
    return submit(d, s, op);
}

/* The fields both directions share. */
static zn_op flash_op(const void *qkv, zn_dtype dt, int64_t ld, int64_t batch, int64_t seq,
                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                      const int32_t *key_start, float scale)
{
    zn_op op = { .kind = ZN_OPK_FLASH_FWD };
    op.u.flash.qkv = qkv;
    op.u.flash.dt = dt;
    op.u.flash.ld = ld;
    op.u.flash.batch = batch;
    op.u.flash.seq = seq;
    op.u.flash.nh = n_heads;
    op.u.flash.nkv = n_kv_heads;
    op.u.flash.hd = head_dim;
    op.u.flash.key_start = key_start;
    op.u.flash.scale = scale;
    return op;
}

int zn_dev_flash_attn_fwd(zn_dev *d, zn_stream *s, const void *qkv, zn_dtype dt, int64_t ld,
                          int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv_heads,
                          int64_t head_dim, const int32_t *key_start, float scale, void *out,
                          int64_t ldo, float *lse)
{
    zn_op op = flash_op(qkv, dt, ld, batch, seq, n_heads, n_kv_heads, head_dim, key_start, scale);
    op.u.flash.out = out;
    op.u.flash.ldo = ldo;
    op.u.flash.lse = lse;
    return flash(d, s, &op, 0);
}

int zn_dev_flash_attn_bwd(zn_dev *d, zn_stream *s, const void *qkv, zn_dtype dt, int64_t ld,
                          int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv_heads,
                          int64_t head_dim, const int32_t *key_start, float scale,
                          const void *out, const void *dout, int64_t ldo, const float *lse,
                          float *delta, void *dqkv, int64_t ldd)
{
    zn_op op = flash_op(qkv, dt, ld, batch, seq, n_heads, n_kv_heads, head_dim, key_start, scale);
    op.u.flash.out = (void *)out;
    op.u.flash.dout = dout;
    op.u.flash.ldo = ldo;
    op.u.flash.lse = (float *)lse;
    op.u.flash.delta = delta;
    op.u.flash.dqkv = dqkv;
    op.u.flash.ldd = ldd;
    return flash(d, s, &op, 1);
}

int zn_dev_xent_fwd_chunk(zn_dev *d, zn_stream *s, const void *logits, zn_dtype dt,
                          int64_t rows, int64_t cols, int64_t ld, int64_t v0,
                          const int32_t *targets, float *run_max, float *run_sum, float *tgt,
                          int first)
{
    const char *fn = "xent_fwd_chunk";
    CHK_DT(fn, dt);
    CHK(rows >= 0 && cols > 0 && ld >= cols && v0 >= 0,
        "%s: bad sizes (rows %lld cols %lld ld %lld v0 %lld)", fn, (long long)rows,
        (long long)cols, (long long)ld, (long long)v0);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, logits, span(rows, cols, ld, dt));
    CHK_PTR(fn, targets, (uint64_t)rows * 4);
    CHK_PTR(fn, run_max, (uint64_t)rows * 4);
    CHK_PTR(fn, run_sum, (uint64_t)rows * 4);
    CHK_PTR(fn, tgt, (uint64_t)rows * 4);
    zn_op op = { .kind = ZN_OPK_XENT_FWD };
    op.u.xent.logits = logits;
    op.u.xent.dt = dt;
    op.u.xent.rows = rows;
    op.u.xent.cols = cols;
    op.u.xent.ld = ld;
    op.u.xent.v0 = v0;
    op.u.xent.targets = targets;
    op.u.xent.run_max = run_max;
    op.u.xent.run_sum = run_sum;
    op.u.xent.tgt = tgt;
    op.u.xent.first = first != 0;
    return submit(d, s, &op);
}

int zn_dev_xent_finish(zn_dev *d, zn_stream *s, const float *run_max, const float *run_sum,
                       const float *tgt, const int32_t *targets, int64_t rows, float *lse,
                       float *loss)
{
    const char *fn = "xent_finish";
    CHK(rows >= 0, "%s: rows = %lld", fn, (long long)rows);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, run_max, (uint64_t)rows * 4);
    CHK_PTR(fn, run_sum, (uint64_t)rows * 4);
    CHK_PTR(fn, tgt, (uint64_t)rows * 4);
    CHK_PTR(fn, targets, (uint64_t)rows * 4);
    CHK_PTR(fn, lse, (uint64_t)rows * 4);
    if (loss)
        CHK_PTR(fn, loss, (uint64_t)rows * 4);
    zn_op op = { .kind = ZN_OPK_XENT_FINISH };
    op.u.xent.cmax = run_max;
    op.u.xent.csum = run_sum;
    op.u.xent.ctgt = tgt;
    op.u.xent.targets = targets;
    op.u.xent.rows = rows;
    op.u.xent.lse_out = lse;
    op.u.xent.loss = loss;
    return submit(d, s, &op);
}

int zn_dev_xent_bwd_chunk(zn_dev *d, zn_stream *s, const void *logits, zn_dtype dt,
                          int64_t rows, int64_t cols, int64_t ld, int64_t v0,
                          const int32_t *targets, const float *lse, float grad_scale,
                          void *dlogits, zn_dtype dlogits_dt, int64_t ld_d)
{
    const char *fn = "xent_bwd_chunk";
    CHK_DT(fn, dt);
    CHK_DT(fn, dlogits_dt);
    CHK(rows >= 0 && cols > 0 && ld >= cols && ld_d >= cols && v0 >= 0,
        "%s: bad sizes (rows %lld cols %lld ld %lld ld_d %lld v0 %lld)", fn, (long long)rows,
        (long long)cols, (long long)ld, (long long)ld_d, (long long)v0);
    if (rows == 0)
        return 0;
    CHK(dlogits != logits || (dlogits_dt == dt && ld_d == ld),
        "%s: in place needs the same dtype and ld", fn);
    CHK_PTR(fn, logits, span(rows, cols, ld, dt));
    CHK_PTR(fn, dlogits, span(rows, cols, ld_d, dlogits_dt));
    CHK_PTR(fn, targets, (uint64_t)rows * 4);
    CHK_PTR(fn, lse, (uint64_t)rows * 4);
    zn_op op = { .kind = ZN_OPK_XENT_BWD };
    op.u.xent.logits = logits;
    op.u.xent.dt = dt;
    op.u.xent.rows = rows;
    op.u.xent.cols = cols;
    op.u.xent.ld = ld;
    op.u.xent.v0 = v0;
    op.u.xent.targets = targets;
    op.u.xent.lse = lse;
    op.u.xent.grad_scale = grad_scale;
    op.u.xent.dlogits = dlogits;
    op.u.xent.d_dt = dlogits_dt;
    op.u.xent.ld_d = ld_d;
    return submit(d, s, &op);
}

static int reduce(zn_dev *d, zn_stream *s, const void *x, zn_dtype dt, int64_t n, float *out,
                  int accumulate, int square)
{
    const char *fn = square ? "sumsq" : "sum";
    CHK_DT(fn, dt);
    CHK(n >= 0, "%s: n = %lld", fn, (long long)n);
    CHK_PTR(fn, out, 4);
    if (n > 0)
        CHK_PTR(fn, x, nbytes(n, dt));
    zn_op op = { .kind = ZN_OPK_REDUCE };
    op.u.reduce.x = x;
    op.u.reduce.dt = dt;
    op.u.reduce.n = n;
    op.u.reduce.out = out;
    op.u.reduce.accumulate = accumulate != 0;
    op.u.reduce.square = square;
    return submit(d, s, &op);
}

int zn_dev_sumsq(zn_dev *d, zn_stream *s, const void *x, zn_dtype dt, int64_t n, float *out,
                 int accumulate)
{
    return reduce(d, s, x, dt, n, out, accumulate, 1);
}

int zn_dev_sum(zn_dev *d, zn_stream *s, const void *x, zn_dtype dt, int64_t n, float *out,
               int accumulate)
{
    return reduce(d, s, x, dt, n, out, accumulate, 0);
}
