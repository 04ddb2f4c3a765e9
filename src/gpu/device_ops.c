/* The generic device ops: copies, fills, GEMM, element-wise ops, casts,
 * dropout, the gradient norm's chunks and the optimizer, each checked (dtypes, sizes,
 * pointers inside the arena) and handed to the backend as an op
 * descriptor. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hwloc.h>

#include "gpu/gpu-impl.h"
#include "util/hash-impl.h"


/* ---- copies ------------------------------------------------------------*/
static int copy(zn_dev *d, zn_stream *s, void *dst, const void *src, size_t bytes,
                zn_copy_dir dir, const char *fn)
{
    if (bytes == 0)
        return 0;
    CHK(dst && src, "%s: NULL pointer", fn);
    zn_op op = { .kind = ZN_OPK_COPY,
                 .u.copy = { .dst = dst, .src = src, .bytes = bytes, .dir = dir } };
    /* the device side(s) only: a host side may lie anywhere */
    return submit_checked(d, s, fn, &op, DEV_PTRS(DEV_PTR_IF(dir != ZN_COPY_D2H, dst, bytes),
                                                  DEV_PTR_IF(dir != ZN_COPY_H2D, src, bytes)));
}

int zn_dev_copy_h2d(zn_dev *d, zn_stream *s, void *dst, const void *src, size_t bytes)
{
    return copy(d, s, dst, src, bytes, ZN_COPY_H2D, "copy_h2d");
}

int zn_dev_copy_d2h(zn_dev *d, zn_stream *s, void *dst, const void *src, size_t bytes)
{
    return copy(d, s, dst, src, bytes, ZN_COPY_D2H, "copy_d2h");
}

int zn_dev_copy_d2d(zn_dev *d, zn_stream *s, void *dst, const void *src, size_t bytes)
{
    return copy(d, s, dst, src, bytes, ZN_COPY_D2D, "copy_d2d");
}

int zn_dev_memset(zn_dev *d, zn_stream *s, void *dst, int value, size_t bytes)
{
    if (bytes == 0)
        return 0;
    zn_op op = { .kind = ZN_OPK_MEMSET,
                 .u.memset = { .dst = dst, .value = value, .bytes = bytes } };
    return submit_checked(d, s, "memset", &op, DEV_PTRS(DEV_PTR(dst, bytes)));
}

int zn_dev_fill(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t n, float value)
{
    CHK_DTYPES("fill", dt);
    ZN_TRY(check_count("fill", n));
    if (n == 0)
        return 0;
    zn_op op = { .kind = ZN_OPK_FILL, .u.fill = { .x = x, .dt = dt, .n = n, .value = value } };
    return submit_checked(d, s, "fill", &op, DEV_PTRS(DEV_PTR(x, nbytes(n, dt))));
}

/* ---- GEMM -----------------------------------------------------------------*/
int zn_dev_gemm_strided_batched(zn_dev *d, zn_stream *s, zn_trans ta, zn_trans tb,
                                int64_t m, int64_t n, int64_t k, float alpha,
                                const void *A, zn_dtype adt, int64_t lda, int64_t sa,
                                const void *B, zn_dtype bdt, int64_t ldb, int64_t sb,
                                float beta, void *C, zn_dtype cdt, int64_t ldc, int64_t sc,
                                int64_t batch)
{
    const char *fn = "gemm";
    const zn_stream *on = s ? s : d ? d->default_stream : NULL;
    CHK(!on || !on->copy_only, "gemm: stream '%s' is a copy stream "
        "(zn_dev_stream_create_copy): it has no cuBLAS handle", on->name);
    CHK_DTYPES(fn, adt, bdt, cdt);
    if (adt != bdt || (adt == ZN_DTYPE_F32 && cdt != ZN_DTYPE_F32))
        return zn_set_error(ZN_EUNSUPPORTED, "gemm: types A %s, B %s, C %s not supported "
                            "(f32,f32->f32; bf16,bf16->f32|bf16)", zn_dtype_name(adt),
                            zn_dtype_name(bdt), zn_dtype_name(cdt));
    CHK((ta == ZN_NOTRANS || ta == ZN_TRANS) && (tb == ZN_NOTRANS || tb == ZN_TRANS),
        "gemm: bad transpose flag");
    CHK(m >= 0 && n >= 0 && k >= 0 && batch >= 0, "gemm: negative size (m %lld n %lld "
        "k %lld batch %lld)", (long long)m, (long long)n, (long long)k, (long long)batch);
    CHK(sa >= 0 && sb >= 0 && sc >= 0, "gemm: negative stride");
    int64_t arows = ta ? k : m, acols = ta ? m : k;
    int64_t brows = tb ? n : k, bcols = tb ? k : n;
    CHK(lda >= (acols > 1 ? acols : 1), "gemm: lda %lld < %lld (A stored %lldx%lld, row-major)",
        (long long)lda, (long long)acols, (long long)arows, (long long)acols);
    CHK(ldb >= (bcols > 1 ? bcols : 1), "gemm: ldb %lld < %lld (B stored %lldx%lld, row-major)",
        (long long)ldb, (long long)bcols, (long long)brows, (long long)bcols);
    CHK(ldc >= (n > 1 ? n : 1), "gemm: ldc %lld < n %lld", (long long)ldc, (long long)n);
    if (m == 0 || n == 0 || batch == 0)
        return 0;
    uint64_t cspan = span(m, n, ldc, cdt);
    if (batch > 1) {
        /* disjoint: one after another, or side by side in the columns of
         * shared rows (heads of one attention output, [rows][heads x dim]) */
        CHK(sc * (int64_t)zn_dtype_size(cdt) >= (int64_t)cspan ||
                (sc >= n && (batch - 1) * sc + n <= ldc),
            "gemm: strideC %lld makes the %lld outputs overlap", (long long)sc,
            (long long)batch);
    }
    /* the batch's last matrix ends `stride` elements after its first */
    uint64_t last = (uint64_t)(batch - 1);
    uint64_t c_bytes = cspan + last * (uint64_t)sc * zn_dtype_size(cdt);
    uint64_t a_bytes = span(arows, acols, lda, adt) + last * (uint64_t)sa * zn_dtype_size(adt);
    uint64_t b_bytes = span(brows, bcols, ldb, bdt) + last * (uint64_t)sb * zn_dtype_size(bdt);
    zn_op op = { .kind = ZN_OPK_GEMM,
                 .u.gemm = { .ta = ta, .tb = tb, .m = m, .n = n, .k = k,
                             .lda = lda, .ldb = ldb, .ldc = ldc, .sa = sa, .sb = sb, .sc = sc,
                             .batch = batch, .alpha = alpha, .beta = beta,
                             .A = A, .B = B, .C = C, .adt = adt, .bdt = bdt, .cdt = cdt } };
    /* k == 0 reads neither A nor B: C = beta C */
    return submit_checked(d, s, fn, &op, DEV_PTRS(DEV_PTR(C, c_bytes),
                                                  DEV_PTR_IF(k > 0, A, a_bytes),
                                                  DEV_PTR_IF(k > 0, B, b_bytes)));
}

int zn_dev_gemm(zn_dev *d, zn_stream *s, zn_trans ta, zn_trans tb, int64_t m, int64_t n,
                int64_t k, float alpha, const void *A, zn_dtype adt, int64_t lda,
                const void *B, zn_dtype bdt, int64_t ldb, float beta, void *C,
                zn_dtype cdt, int64_t ldc)
{
    return zn_dev_gemm_strided_batched(d, s, ta, tb, m, n, k, alpha, A, adt, lda, 0, B, bdt,
                                       ldb, 0, beta, C, cdt, ldc, 0, 1);
}

/* ---- element-wise ops ------------------------------------------------------*/
/* SwiGLU, both directions: gate and up in; out (forward), or dout in and
 * dgate, dup out (backward); n elements of one dtype. */
static int swiglu(zn_dev *d, zn_stream *s, const zn_op *op)
{
    const int bwd = op->kind == ZN_OPK_SWIGLU_BWD;
    const char *fn = op->u.swiglu.act ? (bwd ? "geglu_bwd" : "geglu_fwd")
                                      : (bwd ? "swiglu_bwd" : "swiglu_fwd");
    const void *gate = op->u.swiglu.gate, *up = op->u.swiglu.up, *out = op->u.swiglu.out;
    const void *dout = op->u.swiglu.dout, *dgate = op->u.swiglu.dgate, *dup = op->u.swiglu.dup;
    const int64_t n = op->u.swiglu.n;
    CHK_DTYPES(fn, op->u.swiglu.dt);
    ZN_TRY(check_count(fn, n));
    if (n == 0)
        return 0;
    const uint64_t b = nbytes(n, op->u.swiglu.dt);
    ZN_TRY(check_ptrs(d, fn, DEV_PTRS(DEV_PTR(gate, b), DEV_PTR(up, b), DEV_PTR_IF(!bwd, out, b),
                                      DEV_PTR_IF(bwd, dout, b), DEV_PTR_IF(bwd, dgate, b),
                                      DEV_PTR_IF(bwd, dup, b))));
    CHK(!bwd || (dgate != dout && dup != dout && dgate != dup),
        "%s: dgate/dup may not alias dout or each other", fn);
    return submit(d, s, op);
}

int zn_dev_swiglu_fwd(zn_dev *d, zn_stream *s, const void *gate, const void *up, void *out,
                      zn_dtype dt, int64_t n)
{
    zn_op op = { .kind = ZN_OPK_SWIGLU_FWD,
                 .u.swiglu = { .gate = gate, .up = up, .out = out, .dt = dt, .n = n } };
    return swiglu(d, s, &op);
}

int zn_dev_swiglu_bwd(zn_dev *d, zn_stream *s, const void *gate, const void *up,
                      const void *dout, void *dgate, void *dup, zn_dtype dt, int64_t n)
{
    zn_op op = { .kind = ZN_OPK_SWIGLU_BWD,
                 .u.swiglu = { .gate = gate, .up = up, .dout = dout, .dgate = dgate,
                               .dup = dup, .dt = dt, .n = n } };
    return swiglu(d, s, &op);
}

int zn_dev_geglu_fwd(zn_dev *d, zn_stream *s, const void *gate, const void *up, void *out,
                     zn_dtype dt, int64_t n)
{
    zn_op op = { .kind = ZN_OPK_SWIGLU_FWD,
                 .u.swiglu = { .gate = gate, .up = up, .out = out, .dt = dt, .n = n, .act = 1 } };
    return swiglu(d, s, &op);
}

int zn_dev_geglu_bwd(zn_dev *d, zn_stream *s, const void *gate, const void *up,
                     const void *dout, void *dgate, void *dup, zn_dtype dt, int64_t n)
{
    zn_op op = { .kind = ZN_OPK_SWIGLU_BWD,
                 .u.swiglu = { .gate = gate, .up = up, .dout = dout, .dgate = dgate,
                               .dup = dup, .dt = dt, .n = n, .act = 1 } };
    return swiglu(d, s, &op);
}

/* add, axpy and scale: y = f(a, b, y) over n elements; a and b may be NULL. */
static int ew(zn_dev *d, zn_stream *s, zn_op_kind kind, const char *fn, const void *a,
              const void *b, zn_dtype a_dt, void *y, zn_dtype y_dt, int64_t n, float alpha)
{
    CHK_DTYPES(fn, a_dt, y_dt);
    ZN_TRY(check_count(fn, n));
    if (n == 0)
        return 0;
    zn_op op = { .kind = kind, .u.ew = { .a = a, .b = b, .a_dt = a_dt, .y = y, .y_dt = y_dt,
                                         .n = n, .alpha = alpha } };
    return submit_checked(d, s, fn, &op, DEV_PTRS(DEV_PTR_OPT(a, nbytes(n, a_dt)),
                                                  DEV_PTR_OPT(b, nbytes(n, a_dt)),
                                                  DEV_PTR(y, nbytes(n, y_dt))));
}

int zn_dev_add(zn_dev *d, zn_stream *s, const void *a, const void *b, void *y, zn_dtype dt,
               int64_t n)
{
    CHK(a && b, "add: NULL input");
    return ew(d, s, ZN_OPK_ADD, "add", a, b, dt, y, dt, n, 1.0f);
}

int zn_dev_add_inplace(zn_dev *d, zn_stream *s, void *y, zn_dtype y_dt, const void *x,
                       zn_dtype x_dt, int64_t n)
{
    CHK(x, "add_inplace: NULL input");
    return ew(d, s, ZN_OPK_AXPY, "add_inplace", x, NULL, x_dt, y, y_dt, n, 1.0f);
}

int zn_dev_scale(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t n, float alpha)
{
    return ew(d, s, ZN_OPK_SCALE, "scale", NULL, NULL, dt, x, dt, n, alpha);
}

int zn_dev_axpy(zn_dev *d, zn_stream *s, float alpha, const void *x, zn_dtype x_dt, void *y,
                zn_dtype y_dt, int64_t n)
{
    CHK(x, "axpy: NULL input");
    return ew(d, s, ZN_OPK_AXPY, "axpy", x, NULL, x_dt, y, y_dt, n, alpha);
}

int zn_dev_cast(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, void *y, zn_dtype y_dt,
                int64_t n)
{
    const char *fn = "cast";
    CHK_DTYPES(fn, x_dt, y_dt);
    ZN_TRY(check_count(fn, n));
    if (n == 0)
        return 0;
    zn_op op = { .kind = ZN_OPK_CAST,
                 .u.cast = { .x = x, .x_dt = x_dt, .y = y, .y_dt = y_dt, .n = n } };
    return submit_checked(d, s, fn, &op,
                          DEV_PTRS(DEV_PTR(x, nbytes(n, x_dt)), DEV_PTR(y, nbytes(n, y_dt))));
}

/* ---- row-wise ops: a rows x cols matrix with leading dimension(s) ----------*/
static int check_bias_sizes(const char *fn, int64_t rows, int64_t cols, int64_t ld)
{
    CHK(rows >= 0 && cols > 0 && ld >= cols, "%s: bad sizes (rows %lld cols %lld ld %lld)",
        fn, (long long)rows, (long long)cols, (long long)ld);
    return 0;
}

int zn_dev_bias_add(zn_dev *d, zn_stream *s, void *y, zn_dtype y_dt, int64_t ld,
                    const void *bias, zn_dtype bias_dt, int64_t rows, int64_t cols)
{
    const char *fn = "bias_add";
    CHK_DTYPES(fn, y_dt, bias_dt);
    ZN_TRY(check_bias_sizes(fn, rows, cols, ld));
    if (rows == 0)
        return 0;
    zn_op op = { .kind = ZN_OPK_BIAS_ADD,
                 .u.bias = { .y = y, .y_dt = y_dt, .ld = ld, .bias = bias, .bias_dt = bias_dt,
                             .rows = rows, .cols = cols } };
    return submit_checked(d, s, fn, &op, DEV_PTRS(DEV_PTR(y, span(rows, cols, ld, y_dt)),
                                                  DEV_PTR(bias, nbytes(cols, bias_dt))));
}

int zn_dev_bias_grad(zn_dev *d, zn_stream *s, const void *dy, zn_dtype dy_dt, int64_t ld,
                     float *dbias, int64_t rows, int64_t cols)
{
    const char *fn = "bias_grad";
    CHK_DTYPES(fn, dy_dt);
    ZN_TRY(check_bias_sizes(fn, rows, cols, ld));
    if (rows == 0)
        return 0;
    zn_op op = { .kind = ZN_OPK_BIAS_GRAD,
                 .u.bias = { .dy = dy, .y_dt = dy_dt, .ld = ld, .dbias = dbias, .rows = rows,
                             .cols = cols } };
    return submit_checked(d, s, fn, &op, DEV_PTRS(DEV_PTR(dy, span(rows, cols, ld, dy_dt)),
                                                  DEV_PTR(dbias, (uint64_t)cols * 4)));
}

int zn_dev_dropout(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, int64_t ldx, void *y,
                   zn_dtype y_dt, int64_t ldy, int64_t rows, int64_t cols, double p,
                   uint64_t key, int accumulate)
{
    const char *fn = "dropout";
    CHK_DTYPES(fn, x_dt, y_dt);
    CHK(rows >= 0 && cols > 0 && ldx >= cols && ldy >= cols,
        "%s: bad sizes (rows %lld cols %lld ldx %lld ldy %lld)", fn, (long long)rows,
        (long long)cols, (long long)ldx, (long long)ldy);
    CHK(p >= 0.0 && p < 1.0, "%s: p = %g is outside [0, 1)", fn, p);
    if (rows == 0)
        return 0;
    zn_op op = { .kind = ZN_OPK_DROPOUT,
                 .u.drop = { .x = x, .x_dt = x_dt, .y = y, .y_dt = y_dt, .ldx = ldx,
                             .ldy = ldy, .rows = rows, .cols = cols, .key = key,
                             .thresh = zn_drop_threshold(p),
                             .scale = (float)(1.0 / (1.0 - p)),
                             .accumulate = accumulate != 0 } };
    return submit_checked(d, s, fn, &op, DEV_PTRS(DEV_PTR(x, span(rows, cols, ldx, x_dt)),
                                                  DEV_PTR(y, span(rows, cols, ldy, y_dt))));
}

int zn_dev_copy_2d(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, int64_t ldx, void *y,
                   zn_dtype y_dt, int64_t ldy, int64_t rows, int64_t cols)
{
    /* the dropout op with p = 0 keeps every element and scales by 1 */
    return zn_dev_dropout(d, s, x, x_dt, ldx, y, y_dt, ldy, rows, cols, 0.0, 0, 0);
}

/* ---- the optimizer -------------------------------------------------------------*/
/* The fp32 blocks of 8-bit moments (zn_moments.f32, read on the host;
 * f32_dev, its copy the kernel reads): the bytes of their runs' copy and
 * of the slots they name in m_f32 and v_f32. */
static int f32_spans(const zn_moments *mv, const char *fn, uint64_t *runs_b, uint64_t *slot_b)
{
    *runs_b = *slot_b = 0;
    if (!mv->n_f32)
        return 0;
    if (!mv->f32_dev)
        return zn_set_error(-EINVAL, "%s: fp32 blocks without their runs in device memory "
                            "(zn_moments.f32_dev)", fn);
    uint64_t top = 0;
    for (size_t r = 0; r < mv->n_f32; r++)
        top = mv->f32[r].slot + mv->f32[r].n > top ? mv->f32[r].slot + mv->f32[r].n : top;
    *runs_b = (uint64_t)mv->n_f32 * sizeof *mv->f32;
    *slot_b = top * ZN_Q8_BLOCK * 4;
    return 0;
}

int zn_dev_adam(zn_dev *d, zn_stream *s, const zn_adam_params *hp, float *p, float *m,
                float *v, const float *g, float g_scale, void *c, zn_dtype c_dt, int64_t n)
{
    ZN_TRY(check_count("adam", n));
    CHK(!c || c_dt == ZN_DTYPE_BF16, "adam: the 16-bit copy must be bf16 on a device, not %s",
        zn_dtype_name(c_dt));
    zn_adam_consts k;
    /* the CPU step's checks and constants: one set for both backends */
    ZN_TRY(zn_adam_prepare(hp, p, m, v, g, ZN_DTYPE_F32, g_scale, c, c_dt, (size_t)n, &k));
    if (n == 0)
        return 0;
    uint64_t b = nbytes(n, ZN_DTYPE_F32);
    zn_op op = { .kind = ZN_OPK_ADAM,
                 .u.adam = { .p = p, .m = m, .v = v, .g = g, .c = c, .c_dt = c_dt, .n = n,
                             .hp = *hp, .g_scale = g_scale, .b1 = k.b1, .omb1 = k.omb1,
                             .b2 = k.b2, .omb2 = k.omb2, .step = k.step_size, .eps = k.eps,
                             .l2 = k.l2, .decay = k.decay, .use_l2 = k.use_l2,
                             .use_decay = k.use_decay } };
    return submit_checked(d, s, "adam", &op,
                          DEV_PTRS(DEV_PTR(p, b), DEV_PTR(m, b), DEV_PTR(v, b), DEV_PTR(g, b),
                                   DEV_PTR_OPT(c, nbytes(n, c_dt))));
}

int zn_dev_adam_mom(zn_dev *d, zn_stream *s, const zn_adam_params *hp, float *p,
                    const zn_moments *mv, const float *g, float g_scale, void *c, zn_dtype c_dt,
                    int64_t n)
{
    ZN_TRY(check_count("adam_mom", n));
    CHK(mv, "adam_mom: NULL moments");
    if (mv->fmt == ZN_MOM_F32)
        return zn_dev_adam(d, s, hp, p, mv->m, mv->v, g, g_scale, c, c_dt, n);
    CHK(!c || c_dt == ZN_DTYPE_BF16, "adam_mom: the 16-bit copy must be bf16 on a device, not %s",
        zn_dtype_name(c_dt));
    zn_adam_consts k;
    ZN_TRY(zn_adam_prepare_mom(hp, p, mv, g, ZN_DTYPE_F32, g_scale, c, c_dt, (size_t)n, &k));
    if (n == 0)
        return 0;
    uint64_t b = nbytes(n, ZN_DTYPE_F32);
    uint64_t eb = mv->fmt == ZN_MOM_Q8 ? (uint64_t)n : (uint64_t)n * 2;
    uint64_t ab = mv->fmt == ZN_MOM_Q8 ? zn_q8_blocks((size_t)n) * 4 : 0, rb, sb;
    ZN_TRY(f32_spans(mv, "adam_mom", &rb, &sb));
    zn_op op = { .kind = ZN_OPK_ADAM_MOM,
                 .u.adam = { .p = p, .g = g, .c = c, .c_dt = c_dt, .n = n, .hp = *hp,
                             .g_scale = g_scale, .b1 = k.b1, .omb1 = k.omb1, .b2 = k.b2,
                             .omb2 = k.omb2, .step = k.step_size, .eps = k.eps, .l2 = k.l2,
                             .decay = k.decay, .use_l2 = k.use_l2, .use_decay = k.use_decay,
                             .mv = *mv } };
    return submit_checked(d, s, "adam_mom", &op,
                          DEV_PTRS(DEV_PTR(p, b), DEV_PTR(mv->m, eb), DEV_PTR(mv->v, eb),
                                   DEV_PTR(g, b), DEV_PTR_OPT(c, nbytes(n, c_dt)),
                                   DEV_PTR_OPT(mv->m_absmax, ab), DEV_PTR_OPT(mv->v_absmax, ab),
                                   DEV_PTR_OPT(mv->f32_dev, rb), DEV_PTR_OPT(mv->m_f32, sb),
                                   DEV_PTR_OPT(mv->v_f32, sb)));
}

int zn_dev_adam_sr(zn_dev *d, zn_stream *s, const zn_adam_params *hp, uint16_t *p,
                   const zn_moments *mv, const float *g, float g_scale, uint64_t seed,
                   const zn_sr_span *spans, int64_t n_spans, int64_t n)
{
    ZN_TRY(check_count("adam_sr", n));
    CHK(mv, "adam_sr: NULL moments");
    CHK(n == 0 || (spans && n_spans > 0 && n_spans <= n),
        "adam_sr: %" PRId64 " spans of indices for %" PRId64 " elements", n_spans, n);
    zn_adam_consts k;
    /* zn_adam_step_sr's checks (p stands for the fp32 array in the NULL
     * test) and constants */
    ZN_TRY(zn_adam_prepare_mom(hp, (float *)(void *)p, mv, g, ZN_DTYPE_F32, g_scale, NULL,
                               ZN_DTYPE_BF16, (size_t)n, &k));
    if (n == 0)
        return 0;
    uint64_t eb = mv->fmt == ZN_MOM_F32 ? (uint64_t)n * 4
                  : mv->fmt == ZN_MOM_BF16 ? (uint64_t)n * 2 : (uint64_t)n;
    uint64_t ab = mv->fmt == ZN_MOM_Q8 ? zn_q8_blocks((size_t)n) * 4 : 0, rb, sb;
    ZN_TRY(f32_spans(mv, "adam_sr", &rb, &sb));
    zn_op op = { .kind = ZN_OPK_ADAM_SR,
                 .u.adam = { .p16 = p, .g = g, .n = n, .hp = *hp, .g_scale = g_scale,
                             .b1 = k.b1, .omb1 = k.omb1, .b2 = k.b2, .omb2 = k.omb2,
                             .step = k.step_size, .eps = k.eps, .l2 = k.l2, .decay = k.decay,
                             .use_l2 = k.use_l2, .use_decay = k.use_decay, .mv = *mv,
                             .sr_seed = seed, .sr_spans = spans, .sr_nspans = n_spans } };
    return submit_checked(d, s, "adam_sr", &op,
                          DEV_PTRS(DEV_PTR(p, (uint64_t)n * 2), DEV_PTR(mv->m, eb),
                                   DEV_PTR(mv->v, eb), DEV_PTR(g, (uint64_t)n * 4),
                                   DEV_PTR(spans, (uint64_t)n_spans * sizeof *spans),
                                   DEV_PTR_OPT(mv->m_absmax, ab), DEV_PTR_OPT(mv->v_absmax, ab),
                                   DEV_PTR_OPT(mv->f32_dev, rb), DEV_PTR_OPT(mv->m_f32, sb),
                                   DEV_PTR_OPT(mv->v_f32, sb)));
}

int zn_dev_norm_sq_chunks(zn_dev *d, zn_stream *s, const float *x, int64_t n, double *out)
{
    ZN_TRY(check_count("norm_sq_chunks", n));
    if (n == 0)
        return 0;
    int64_t nc = (n + (int64_t)ZN_GRAD_NORM_CHUNK - 1) / (int64_t)ZN_GRAD_NORM_CHUNK;
    zn_op op = { .kind = ZN_OPK_NORM_CHUNKS, .u.normc = { .x = x, .n = n, .out = out } };
    return submit_checked(d, s, "norm_sq_chunks", &op,
                          DEV_PTRS(DEV_PTR(x, nbytes(n, ZN_DTYPE_F32)),
                                   DEV_PTR(out, (uint64_t)nc * 8)));
}
