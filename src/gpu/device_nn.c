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

/* ---- embedding -----------------------------------------------------------*/
static int check_emb_sizes(const char *fn, int64_t n_tokens, int64_t row0, int64_t vocab,
                           int64_t dim)
{
    CHK(n_tokens >= 0 && vocab > 0 && dim > 0 && row0 >= 0, "%s: bad sizes (tokens %lld "
        "rows %lld from %lld, dim %lld)", fn, (long long)n_tokens, (long long)vocab,
        (long long)row0, (long long)dim);
    return 0;
}

static int emb_fwd_op(zn_dev *d, zn_stream *s, const char *fn, const int32_t *ids,
                      int64_t n_tokens, const void *table, zn_dtype table_dt, int64_t row0,
                      int64_t vocab, int64_t dim, void *out, zn_dtype out_dt, int skip,
                      float scale)
{
    CHK_DTYPES(fn, table_dt, out_dt);
    ZN_TRY(check_emb_sizes(fn, n_tokens, row0, vocab, dim));
    if (n_tokens == 0)
        return 0;
    zn_op op = { .kind = ZN_OPK_EMB_FWD,
                 .u.emb = { .ids = ids, .n_tokens = n_tokens, .vocab = vocab, .dim = dim,
                            .row0 = row0, .skip = skip, .table = table, .table_dt = table_dt,
                            .out = out, .out_dt = out_dt, .scale = scale } };
    return submit_checked(d, s, fn, &op,
                          DEV_PTRS(DEV_PTR(ids, (uint64_t)n_tokens * 4),
                                   DEV_PTR(table, span(vocab, dim, dim, table_dt)),
                                   DEV_PTR(out, span(n_tokens, dim, dim, out_dt))));
}

static int emb_bwd_op(zn_dev *d, zn_stream *s, const char *fn, const int32_t *ids,
                      int64_t n_tokens, const void *dout, zn_dtype dout_dt, int64_t row0,
                      int64_t vocab, int64_t dim, float *dtable, float scale)
{
    CHK_DTYPES(fn, dout_dt);
    ZN_TRY(check_emb_sizes(fn, n_tokens, row0, vocab, dim));
    if (n_tokens == 0)
        return 0;
    zn_op op = { .kind = ZN_OPK_EMB_BWD,
                 .u.emb = { .ids = ids, .n_tokens = n_tokens, .vocab = vocab, .dim = dim,
                            .row0 = row0, .skip = 1, .dout = dout, .dout_dt = dout_dt,
                            .dtable = dtable, .scale = scale } };
    return submit_checked(d, s, fn, &op,
                          DEV_PTRS(DEV_PTR(ids, (uint64_t)n_tokens * 4),
                                   DEV_PTR(dout, span(n_tokens, dim, dim, dout_dt)),
                                   DEV_PTR(dtable, span(vocab, dim, dim, ZN_DTYPE_F32))));
}

int zn_dev_embedding_fwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                         const void *table, zn_dtype table_dt, int64_t vocab, int64_t dim,
                         void *out, zn_dtype out_dt)
{
    return emb_fwd_op(d, s, "embedding_fwd", ids, n_tokens, table, table_dt, 0, vocab, dim, out,
                      out_dt, 0, 1.0f);
}

int zn_dev_embedding_rows_fwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                              const void *table, zn_dtype table_dt, int64_t row0, int64_t rows,
                              int64_t dim, void *out, zn_dtype out_dt)
{
    return emb_fwd_op(d, s, "embedding_rows_fwd", ids, n_tokens, table, table_dt, row0, rows,
                      dim, out, out_dt, 1, 1.0f);
}

int zn_dev_embedding_bwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                         const void *dout, zn_dtype dout_dt, int64_t vocab, int64_t dim,
                         float *dtable)
{
    return emb_bwd_op(d, s, "embedding_bwd", ids, n_tokens, dout, dout_dt, 0, vocab, dim,
                      dtable, 1.0f);
}

int zn_dev_embedding_rows_bwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                              const void *dout, zn_dtype dout_dt, int64_t row0, int64_t rows,
                              int64_t dim, float *dtable)
{
    return emb_bwd_op(d, s, "embedding_rows_bwd", ids, n_tokens, dout, dout_dt, row0, rows, dim,
                      dtable, 1.0f);
}

int zn_dev_embedding_scaled_fwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                                const void *table, zn_dtype table_dt, int64_t row0, int64_t rows,
                                int64_t dim, void *out, zn_dtype out_dt, float scale)
{
    return emb_fwd_op(d, s, "embedding_scaled_fwd", ids, n_tokens, table, table_dt, row0, rows,
                      dim, out, out_dt, 1, scale);
}

int zn_dev_embedding_scaled_bwd(zn_dev *d, zn_stream *s, const int32_t *ids, int64_t n_tokens,
                                const void *dout, zn_dtype dout_dt, int64_t row0, int64_t rows,
                                int64_t dim, float *dtable, float scale)
{
    return emb_bwd_op(d, s, "embedding_scaled_bwd", ids, n_tokens, dout, dout_dt, row0, rows, dim,
                      dtable, scale);
}

/* ---- RMSNorm, RoPE ---------------------------------------------------------*/
static int check_rms_sizes(const char *fn, int64_t rows, int64_t dim)
{
    CHK(rows >= 0 && dim > 0, "%s: bad sizes (rows %lld dim %lld)", fn, (long long)rows,
        (long long)dim);
    return 0;
}

static int rms_fwd(zn_dev *d, zn_stream *s, const char *fn, const void *x, zn_dtype x_dt,
                   int64_t ldx, const void *w, zn_dtype w_dt, void *y, zn_dtype y_dt,
                   int64_t ldy, float *rstd, int64_t rows, int64_t heads, int64_t dim, float eps,
                   float w_off)
{
    CHK_DTYPES(fn, x_dt, w_dt, y_dt);
    ZN_TRY(check_rms_sizes(fn, rows, dim));
    CHK(heads > 0 && ldx >= heads * dim && ldy >= heads * dim, "%s: bad layout (heads %lld "
        "of %lld, ldx %lld, ldy %lld)", fn, (long long)heads, (long long)dim, (long long)ldx,
        (long long)ldy);
    if (rows == 0)
        return 0;
    zn_op op = { .kind = ZN_OPK_RMS_FWD,
                 .u.rms_fwd = { .x = x, .x_dt = x_dt, .w = w, .w_dt = w_dt, .y = y,
                                .y_dt = y_dt, .rstd = rstd, .rows = rows, .dim = dim,
                                .eps = eps, .heads = heads, .ldx = ldx, .ldy = ldy,
                                .w_off = w_off } };
    int64_t width = heads * dim;
    return submit_checked(d, s, fn, &op,
                          DEV_PTRS(DEV_PTR(x, span(rows, width, ldx, x_dt)),
                                   DEV_PTR(w, nbytes(dim, w_dt)),
                                   DEV_PTR(y, span(rows, width, ldy, y_dt)),
                                   DEV_PTR_OPT(rstd, (uint64_t)(rows * heads) * 4)));
}

static int rms_bwd(zn_dev *d, zn_stream *s, const char *fn, const void *x, zn_dtype x_dt,
                   int64_t ldx, const void *w, zn_dtype w_dt, const float *rstd, const void *dy,
                   zn_dtype dy_dt, void *dx, zn_dtype dx_dt, int64_t ldd, float *dw,
                   int64_t rows, int64_t heads, int64_t dim, float w_off)
{
    CHK_DTYPES(fn, x_dt, w_dt, dy_dt, dx_dt);
    ZN_TRY(check_rms_sizes(fn, rows, dim));
    CHK(heads > 0 && ldx >= heads * dim && ldd >= heads * dim, "%s: bad layout (heads %lld "
        "of %lld, ldx %lld, ldd %lld)", fn, (long long)heads, (long long)dim, (long long)ldx,
        (long long)ldd);
    if (rows == 0)
        return 0;
    zn_op op = { .kind = ZN_OPK_RMS_BWD,
                 .u.rms_bwd = { .x = x, .x_dt = x_dt, .w = w, .w_dt = w_dt, .rstd = rstd,
                                .dy = dy, .dy_dt = dy_dt, .dx = dx, .dx_dt = dx_dt, .dw = dw,
                                .rows = rows, .dim = dim, .heads = heads, .ldx = ldx,
                                .ldd = ldd, .w_off = w_off } };
    int64_t width = heads * dim;
    return submit_checked(d, s, fn, &op,
                          DEV_PTRS(DEV_PTR(x, span(rows, width, ldx, x_dt)),
                                   DEV_PTR(w, nbytes(dim, w_dt)),
                                   DEV_PTR(rstd, (uint64_t)(rows * heads) * 4),
                                   DEV_PTR(dy, span(rows, width, ldd, dy_dt)),
                                   DEV_PTR(dx, span(rows, width, ldd, dx_dt)),
                                   DEV_PTR_OPT(dw, (uint64_t)dim * 4)));
}

int zn_dev_rmsnorm_fwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, const void *w,
                       zn_dtype w_dt, void *y, zn_dtype y_dt, float *rstd, int64_t rows,
                       int64_t dim, float eps)
{
    return rms_fwd(d, s, "rmsnorm_fwd", x, x_dt, dim, w, w_dt, y, y_dt, dim, rstd, rows, 1, dim,
                   eps, 0.0f);
}

int zn_dev_rmsnorm_bwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, const void *w,
                       zn_dtype w_dt, const float *rstd, const void *dy, zn_dtype dy_dt,
                       void *dx, zn_dtype dx_dt, float *dw, int64_t rows, int64_t dim)
{
    return rms_bwd(d, s, "rmsnorm_bwd", x, x_dt, dim, w, w_dt, rstd, dy, dy_dt, dx, dx_dt, dim,
                   dw, rows, 1, dim, 0.0f);
}

int zn_dev_rmsnorm_heads_fwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt,
                             int64_t ldx, const void *w, zn_dtype w_dt, void *y, zn_dtype y_dt,
                             int64_t ldy, float *rstd, int64_t tokens, int64_t heads,
                             int64_t head_dim, float eps, float w_off)
{
    CHK(isfinite(w_off), "rmsnorm_heads_fwd: w_off %g", (double)w_off);
    return rms_fwd(d, s, "rmsnorm_heads_fwd", x, x_dt, ldx, w, w_dt, y, y_dt, ldy, rstd, tokens,
                   heads, head_dim, eps, w_off);
}

int zn_dev_rmsnorm_heads_bwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt,
                             int64_t ldx, const void *w, zn_dtype w_dt, const float *rstd,
                             const void *dy, zn_dtype dy_dt, void *dx, zn_dtype dx_dt,
                             int64_t ldd, float *dw, int64_t tokens, int64_t heads,
                             int64_t head_dim, float w_off)
{
    CHK(isfinite(w_off), "rmsnorm_heads_bwd: w_off %g", (double)w_off);
    return rms_bwd(d, s, "rmsnorm_heads_bwd", x, x_dt, ldx, w, w_dt, rstd, dy, dy_dt, dx, dx_dt,
                   ldd, dw, tokens, heads, head_dim, w_off);
}

static int rope(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t tokens,
                int64_t n_heads, int64_t head_dim, int64_t ld, const int32_t *pos,
                const float *inv_freq, int inverse)
{
    const char *fn = inverse ? "rope_bwd" : "rope_fwd";
    CHK_DTYPES(fn, dt);
    CHK(tokens >= 0 && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
        "%s: bad sizes (tokens %lld heads %lld head_dim %lld; head_dim must be even)", fn,
        (long long)tokens, (long long)n_heads, (long long)head_dim);
    CHK(ld >= n_heads * head_dim, "%s: ld %lld < n_heads*head_dim %lld", fn, (long long)ld,
        (long long)(n_heads * head_dim));
    if (tokens == 0)
        return 0;
    zn_op op = { .kind = ZN_OPK_ROPE,
                 .u.rope = { .x = x, .dt = dt, .tokens = tokens, .n_heads = n_heads,
                             .head_dim = head_dim, .ld = ld, .pos = pos, .inv_freq = inv_freq,
                             .inverse = inverse } };
    return submit_checked(d, s, fn, &op,
                          DEV_PTRS(DEV_PTR(x, span(tokens, n_heads * head_dim, ld, dt)),
                                   DEV_PTR(pos, (uint64_t)tokens * 4),
                                   DEV_PTR(inv_freq, (uint64_t)(head_dim / 2) * 4)));
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

/* ---- the GEMM attention's causal softmax ---------------------------------*/
/* S: the scores (forward) or the forward's P (backward), whose gradient dP
 * only the backward reads; out: P or dS. */
static int softmax(zn_dev *d, zn_stream *s, const void *S, zn_dtype S_dt, const void *dP,
                   zn_dtype dP_dt, void *out, zn_dtype out_dt, int64_t batch, int64_t rows,
                   int64_t cols, int64_t q_offset, const int32_t *key_start, float scale,
                   int bwd)
{
    const char *fn = bwd ? "softmax_causal_bwd" : "softmax_causal_fwd";
    CHK_DTYPES(fn, S_dt, out_dt, bwd ? dP_dt : ZN_DTYPE_F32);
    CHK(batch >= 0 && rows >= 0 && cols > 0 && q_offset >= 0,
        "%s: bad sizes (batch %lld rows %lld cols %lld q_offset %lld)", fn, (long long)batch,
        (long long)rows, (long long)cols, (long long)q_offset);
    if (batch == 0 || rows == 0)
        return 0;
    zn_op op = { .kind = bwd ? ZN_OPK_SOFTMAX_BWD : ZN_OPK_SOFTMAX_FWD,
                 .u.softmax = { .P = out, .P_dt = out_dt, .batch = batch, .rows = rows,
                                .cols = cols, .q_offset = q_offset, .key_start = key_start,
                                .scale = scale } };
    if (bwd) {
        op.u.softmax.Pin = S;
        op.u.softmax.Pin_dt = S_dt;
        op.u.softmax.dP = dP;
        op.u.softmax.dP_dt = dP_dt;
    } else {
        op.u.softmax.S = S;
        op.u.softmax.S_dt = S_dt;
    }
    return submit_checked(d, s, fn, &op,
                          DEV_PTRS(DEV_PTR(S, span(batch * rows, cols, cols, S_dt)),
                                   DEV_PTR(out, span(batch * rows, cols, cols, out_dt)),
                                   DEV_PTR_IF(bwd, dP, span(batch * rows, cols, cols, dP_dt)),
                                   DEV_PTR_OPT(key_start, (uint64_t)rows * 4)));
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

/* The fused attention, both directions: qkv, key_start in; out, lse out
 * (forward), or out, dout, lse in, delta and dqkv out (backward). */
static int flash(zn_dev *d, zn_stream *s, const zn_op *op)
{
    const int bwd = op->kind == ZN_OPK_FLASH_BWD;
    const char *fn = bwd ? "flash_attn_bwd" : "flash_attn_fwd";
    zn_dtype dt = op->u.flash.dt;
    int64_t ld = op->u.flash.ld, B = op->u.flash.batch, T = op->u.flash.seq;
    int64_t nh = op->u.flash.nh, nkv = op->u.flash.nkv, hd = op->u.flash.hd;
    int64_t ldo = op->u.flash.ldo, ldd = op->u.flash.ldd;
    CHK_DTYPES(fn, dt);
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
    CHK(op->u.flash.softcap >= 0 && isfinite(op->u.flash.softcap), "%s: softcap %g", fn,
        (double)op->u.flash.softcap);
    int64_t N = B * T;
    if (N == 0)
        return 0;
    if (bwd)
        CHK(ldd >= cols, "%s: ldd %lld below the rows' %lld columns", fn, (long long)ldd,
            (long long)cols);
    /* named as the builders' parameters, for the messages */
    const void *qkv = op->u.flash.qkv, *out = op->u.flash.out, *dout = op->u.flash.dout;
    const void *dqkv = op->u.flash.dqkv, *lse = op->u.flash.lse, *delta = op->u.flash.delta;
    const int32_t *key_start = op->u.flash.key_start;
    uint64_t qkv_b = span(N, cols, ld, dt), o_b = span(N, nh * hd, ldo, dt);
    uint64_t st_b = (uint64_t)(B * nh * T) * 4, d_b = bwd ? span(N, cols, ldd, dt) : 0;
    ZN_TRY(check_ptrs(d, fn, DEV_PTRS(DEV_PTR(qkv, qkv_b), DEV_PTR(lse, st_b),
                                      DEV_PTR_OPT(key_start, (uint64_t)N * 4),
                                      DEV_PTR(out, o_b), DEV_PTR_IF(bwd, dout, o_b),
                                      DEV_PTR_IF(bwd, delta, st_b),
                                      DEV_PTR_IF(bwd, dqkv, d_b))));
    if (!bwd)
        CHK(!overlap(out, o_b, qkv, qkv_b), "%s: out overlaps qkv", fn);
    else
        CHK(!overlap(dqkv, d_b, qkv, qkv_b) && !overlap(dqkv, d_b, out, o_b) &&
                !overlap(dqkv, d_b, dout, o_b),
            "%s: dqkv overlaps qkv, out or dout", fn);
    return submit(d, s, op);
}

/* The fields both directions share. */
static zn_op flash_op(zn_op_kind kind, const void *qkv, zn_dtype dt, int64_t ld, int64_t batch,
                      int64_t seq, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                      const int32_t *key_start, float scale, float softcap)
{
    return (zn_op){ .kind = kind,
                    .u.flash = { .qkv = qkv, .dt = dt, .ld = ld, .batch = batch, .seq = seq,
                                 .nh = n_heads, .nkv = n_kv_heads, .hd = head_dim,
                                 .key_start = key_start, .scale = scale,
                                 .softcap = softcap } };
}

int zn_dev_flash_attn_fwd(zn_dev *d, zn_stream *s, const void *qkv, zn_dtype dt, int64_t ld,
                          int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv_heads,
                          int64_t head_dim, const int32_t *key_start, float scale,
                          float softcap, void *out, int64_t ldo, float *lse)
{
    zn_op op = flash_op(ZN_OPK_FLASH_FWD, qkv, dt, ld, batch, seq, n_heads, n_kv_heads,
                        head_dim, key_start, scale, softcap);
    op.u.flash.out = out;
    op.u.flash.ldo = ldo;
    op.u.flash.lse = lse;
    return flash(d, s, &op);
}

int zn_dev_flash_attn_bwd(zn_dev *d, zn_stream *s, const void *qkv, zn_dtype dt, int64_t ld,
                          int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv_heads,
                          int64_t head_dim, const int32_t *key_start, float scale,
                          float softcap, const void *out, const void *dout, int64_t ldo,
                          const float *lse, float *delta, void *dqkv, int64_t ldd)
{
    zn_op op = flash_op(ZN_OPK_FLASH_BWD, qkv, dt, ld, batch, seq, n_heads, n_kv_heads,
                        head_dim, key_start, scale, softcap);
    op.u.flash.out = (void *)out;
    op.u.flash.dout = dout;
    op.u.flash.ldo = ldo;
    op.u.flash.lse = (float *)lse;
    op.u.flash.delta = delta;
    op.u.flash.dqkv = dqkv;
    op.u.flash.ldd = ldd;
    return flash(d, s, &op);
}

/* ---- cross-entropy in vocabulary chunks ----------------------------------*/
int zn_dev_xent_fwd_chunk(zn_dev *d, zn_stream *s, const void *logits, zn_dtype dt,
                          int64_t rows, int64_t cols, int64_t ld, int64_t v0,
                          const int32_t *targets, float *run_max, float *run_sum, float *tgt,
                          int first)
{
    const char *fn = "xent_fwd_chunk";
    CHK_DTYPES(fn, dt);
    CHK(rows >= 0 && cols > 0 && ld >= cols && v0 >= 0,
        "%s: bad sizes (rows %lld cols %lld ld %lld v0 %lld)", fn, (long long)rows,
        (long long)cols, (long long)ld, (long long)v0);
    if (rows == 0)
        return 0;
    uint64_t per_row = (uint64_t)rows * 4;
    zn_op op = { .kind = ZN_OPK_XENT_FWD,
                 .u.xent = { .logits = logits, .dt = dt, .rows = rows, .cols = cols, .ld = ld,
                             .v0 = v0, .targets = targets, .run_max = run_max,
                             .run_sum = run_sum, .tgt = tgt, .first = first != 0 } };
    return submit_checked(d, s, fn, &op,
                          DEV_PTRS(DEV_PTR(logits, span(rows, cols, ld, dt)),
                                   DEV_PTR(targets, per_row), DEV_PTR(run_max, per_row),
                                   DEV_PTR(run_sum, per_row), DEV_PTR(tgt, per_row)));
}

int zn_dev_xent_finish(zn_dev *d, zn_stream *s, const float *run_max, const float *run_sum,
                       const float *tgt, const int32_t *targets, int64_t rows, float *lse,
                       float *loss)
{
    const char *fn = "xent_finish";
    CHK(rows >= 0, "%s: rows = %lld", fn, (long long)rows);
    if (rows == 0)
        return 0;
    uint64_t per_row = (uint64_t)rows * 4;
    zn_op op = { .kind = ZN_OPK_XENT_FINISH,
                 .u.xent = { .cmax = run_max, .csum = run_sum, .ctgt = tgt, .targets = targets,
                             .rows = rows, .lse_out = lse, .loss = loss } };
    return submit_checked(d, s, fn, &op,
                          DEV_PTRS(DEV_PTR(run_max, per_row), DEV_PTR(run_sum, per_row),
                                   DEV_PTR(tgt, per_row), DEV_PTR(targets, per_row),
                                   DEV_PTR(lse, per_row), DEV_PTR_OPT(loss, per_row)));
}

int zn_dev_xent_bwd_chunk(zn_dev *d, zn_stream *s, const void *logits, zn_dtype dt,
                          int64_t rows, int64_t cols, int64_t ld, int64_t v0,
                          const int32_t *targets, const float *lse, float grad_scale,
                          float softcap, void *dlogits, zn_dtype dlogits_dt, int64_t ld_d)
{
    const char *fn = "xent_bwd_chunk";
    CHK_DTYPES(fn, dt, dlogits_dt);
    CHK(softcap >= 0 && isfinite(softcap), "%s: softcap %g", fn, (double)softcap);
    CHK(rows >= 0 && cols > 0 && ld >= cols && ld_d >= cols && v0 >= 0,
        "%s: bad sizes (rows %lld cols %lld ld %lld ld_d %lld v0 %lld)", fn, (long long)rows,
        (long long)cols, (long long)ld, (long long)ld_d, (long long)v0);
    if (rows == 0)
        return 0;
    CHK(dlogits != logits || (dlogits_dt == dt && ld_d == ld),
        "%s: in place needs the same dtype and ld", fn);
    zn_op op = { .kind = ZN_OPK_XENT_BWD,
                 .u.xent = { .logits = logits, .dt = dt, .rows = rows, .cols = cols, .ld = ld,
                             .v0 = v0, .targets = targets, .lse = lse,
                             .grad_scale = grad_scale, .dlogits = dlogits, .d_dt = dlogits_dt,
                             .ld_d = ld_d, .softcap = softcap } };
    return submit_checked(d, s, fn, &op,
                          DEV_PTRS(DEV_PTR(logits, span(rows, cols, ld, dt)),
                                   DEV_PTR(dlogits, span(rows, cols, ld_d, dlogits_dt)),
                                   DEV_PTR(targets, (uint64_t)rows * 4),
                                   DEV_PTR(lse, (uint64_t)rows * 4)));
}

/* ---- soft-capping --------------------------------------------------------*/
/* Both directions: x (the forward's input, or its output y) and, backward,
 * dy in; y (or dx) out. */
static int softcap(zn_dev *d, zn_stream *s, const zn_op *op)
{
    const int bwd = op->kind == ZN_OPK_SOFTCAP_BWD;
    const char *fn = bwd ? "softcap_bwd" : "softcap_fwd";
    const void *x = op->u.softcap.x, *dy = op->u.softcap.dy, *y = op->u.softcap.y;
    const int64_t n = op->u.softcap.n;
    CHK_DTYPES(fn, op->u.softcap.x_dt, op->u.softcap.y_dt, bwd ? op->u.softcap.dy_dt
                                                                : ZN_DTYPE_F32);
    ZN_TRY(check_count(fn, n));
    CHK(op->u.softcap.cap > 0 && isfinite(op->u.softcap.cap) && isfinite(op->u.softcap.scale),
        "%s: cap %g, scale %g", fn, (double)op->u.softcap.cap, (double)op->u.softcap.scale);
    if (n == 0)
        return 0;
    const void *src = bwd ? dy : x; /* what y may alias, elementwise */
    zn_dtype src_dt = bwd ? op->u.softcap.dy_dt : op->u.softcap.x_dt;
    CHK(y != src || src_dt == op->u.softcap.y_dt, "%s: in place needs one dtype", fn);
    return submit_checked(d, s, fn, op,
                          DEV_PTRS(DEV_PTR(x, nbytes(n, op->u.softcap.x_dt)),
                                   DEV_PTR_IF(bwd, dy, nbytes(n, op->u.softcap.dy_dt)),
                                   DEV_PTR(y, nbytes(n, op->u.softcap.y_dt))));
}

int zn_dev_softcap_fwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, void *y,
                       zn_dtype y_dt, int64_t n, float scale, float cap)
{
    zn_op op = { .kind = ZN_OPK_SOFTCAP_FWD,
                 .u.softcap = { .x = x, .x_dt = x_dt, .y = y, .y_dt = y_dt, .n = n,
                                .scale = scale, .cap = cap } };
    return softcap(d, s, &op);
}

int zn_dev_softcap_bwd(zn_dev *d, zn_stream *s, const void *y, zn_dtype y_dt, const void *dy,
                       zn_dtype dy_dt, void *dx, zn_dtype dx_dt, int64_t n, float scale,
                       float cap)
{
    zn_op op = { .kind = ZN_OPK_SOFTCAP_BWD,
                 .u.softcap = { .x = y, .x_dt = y_dt, .dy = dy, .dy_dt = dy_dt, .y = dx,
                                .y_dt = dx_dt, .n = n, .scale = scale, .cap = cap } };
    return softcap(d, s, &op);
}

/* ---- mixture-of-experts rows ----------------------------------------------*/
static int rows_op(zn_dev *d, zn_stream *s, const char *fn, zn_op *op)
{
    const int64_t n = op->u.rows.n, dim = op->u.rows.dim, rows = op->u.rows.rows;
    CHK(n >= 0 && dim > 0 && rows > 0 && rows <= INT32_MAX, "%s: bad sizes (%lld rows of %lld "
        "from %lld)", fn, (long long)n, (long long)dim, (long long)rows);
    if (n == 0)
        return 0;
    const int mode = op->u.rows.mode;
    CHK_DTYPES(fn, op->u.rows.x_dt, mode == 0 ? op->u.rows.y_dt : ZN_DTYPE_F32,
               mode == 2 ? op->u.rows.a_dt : ZN_DTYPE_F32);
    uint64_t xb = mode == 0 ? span(rows, dim, dim, op->u.rows.x_dt)
                            : span(n, dim, dim, op->u.rows.x_dt);
    return submit_checked(d, s, fn, op,
                          DEV_PTRS(DEV_PTR(op->u.rows.idx, (uint64_t)n * 4),
                                   DEV_PTR_OPT(op->u.rows.w, (uint64_t)n * 4),
                                   DEV_PTR(op->u.rows.x, xb),
                                   DEV_PTR_IF(mode == 0, op->u.rows.y,
                                              span(n, dim, dim, op->u.rows.y_dt)),
                                   DEV_PTR_IF(mode == 1, op->u.rows.y32,
                                              span(rows, dim, dim, ZN_DTYPE_F32)),
                                   DEV_PTR_IF(mode == 2, op->u.rows.a,
                                              span(rows, dim, dim, op->u.rows.a_dt)),
                                   DEV_PTR_IF(mode == 2, op->u.rows.out, (uint64_t)n * 4)));
}

int zn_dev_rows_gather(zn_dev *d, zn_stream *s, const int32_t *idx, int64_t n, const float *w,
                       const void *x, zn_dtype x_dt, int64_t rows, int64_t dim, void *y,
                       zn_dtype y_dt)
{
    zn_op op = { .kind = ZN_OPK_ROWS,
                 .u.rows = { .mode = 0, .idx = idx, .n = n, .dim = dim, .rows = rows, .w = w,
                             .x = x, .x_dt = x_dt, .y = y, .y_dt = y_dt } };
    return rows_op(d, s, "rows_gather", &op);
}

int zn_dev_rows_scatter_add(zn_dev *d, zn_stream *s, const int32_t *idx, int64_t n,
                            const float *w, const void *x, zn_dtype x_dt, int64_t rows,
                            int64_t dim, float *y)
{
    zn_op op = { .kind = ZN_OPK_ROWS,
                 .u.rows = { .mode = 1, .idx = idx, .n = n, .dim = dim, .rows = rows, .w = w,
                             .x = x, .x_dt = x_dt, .y32 = y } };
    return rows_op(d, s, "rows_scatter_add", &op);
}

int zn_dev_rows_dot(zn_dev *d, zn_stream *s, const int32_t *idx, int64_t n, const void *a,
                    zn_dtype a_dt, int64_t rows, const void *x, zn_dtype x_dt, int64_t dim,
                    float *out)
{
    zn_op op = { .kind = ZN_OPK_ROWS,
                 .u.rows = { .mode = 2, .idx = idx, .n = n, .dim = dim, .rows = rows, .x = x,
                             .x_dt = x_dt, .a = a, .a_dt = a_dt, .out = out } };
    return rows_op(d, s, "rows_dot", &op);
}

/* ---- reductions ------------------------------------------------------------*/
static int reduce(zn_dev *d, zn_stream *s, const void *x, zn_dtype dt, int64_t n, float *out,
                  int accumulate, int square)
{
    const char *fn = square ? "sumsq" : "sum";
    CHK_DTYPES(fn, dt);
    ZN_TRY(check_count(fn, n));
    /* n == 0 still runs: out = 0, or out unchanged when accumulating */
    zn_op op = { .kind = ZN_OPK_REDUCE,
                 .u.reduce = { .x = x, .dt = dt, .n = n, .out = out,
                               .accumulate = accumulate != 0, .square = square } };
    return submit_checked(d, s, fn, &op,
                          DEV_PTRS(DEV_PTR(out, 4), DEV_PTR_IF(n > 0, x, nbytes(n, dt))));
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
