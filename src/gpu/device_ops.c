/* The generic device ops: copies, fills, GEMM, element-wise ops, casts,
 * dropout, reductions and the optimizer, each checked (dtypes, sizes,
 * pointers inside the arena) and handed to the backend as an op
 * descriptor. */
#include <errno.h>
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
    if (dir == ZN_COPY_H2D || dir == ZN_COPY_D2D)
        CHK_PTR(fn, dst, bytes);
    if (dir == ZN_COPY_D2H || dir == ZN_COPY_D2D)
        CHK_PTR(fn, src, bytes);
    zn_op op = { .kind = ZN_OPK_COPY };
    op.u.copy.dst = dst;
    op.u.copy.src = src;
    op.u.copy.bytes = bytes;
    op.u.copy.dir = dir;
    return submit(d, s, &op);
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
    CHK_PTR("memset", dst, bytes);
    zn_op op = { .kind = ZN_OPK_MEMSET };
    op.u.memset.dst = dst;
    op.u.memset.value = value;
    op.u.memset.bytes = bytes;
    return submit(d, s, &op);
}

int zn_dev_fill(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t n, float value)
{
    CHK_DT("fill", dt);
    CHK(n >= 0, "fill: n = %lld", (long long)n);
    if (n == 0)
        return 0;
    CHK_PTR("fill", x, nbytes(n, dt));
    zn_op op = { .kind = ZN_OPK_FILL };
    op.u.fill.x = x;
    op.u.fill.dt = dt;
    op.u.fill.n = n;
    op.u.fill.value = value;
    return submit(d, s, &op);
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
    CHK_DT(fn, adt);
    CHK_DT(fn, bdt);
    CHK_DT(fn, cdt);
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
    CHK_PTR(fn, C, cspan + (uint64_t)(batch - 1) * (uint64_t)sc * zn_dtype_size(cdt));
    if (k > 0) {
        CHK_PTR(fn, A, span(arows, acols, lda, adt) +
                           (uint64_t)(batch - 1) * (uint64_t)sa * zn_dtype_size(adt));
        CHK_PTR(fn, B, span(brows, bcols, ldb, bdt) +
                           (uint64_t)(batch - 1) * (uint64_t)sb * zn_dtype_size(bdt));
    }
    zn_op op = { .kind = ZN_OPK_GEMM };
    op.u.gemm.ta = ta;
    op.u.gemm.tb = tb;
    op.u.gemm.m = m;
    op.u.gemm.n = n;
    op.u.gemm.k = k;
    op.u.gemm.lda = lda;
    op.u.gemm.ldb = ldb;
    op.u.gemm.ldc = ldc;
    op.u.gemm.sa = sa;
    op.u.gemm.sb = sb;
    op.u.gemm.sc = sc;
    op.u.gemm.batch = batch;
    op.u.gemm.alpha = alpha;
    op.u.gemm.beta = beta;
    op.u.gemm.A = A;
    op.u.gemm.B = B;
    op.u.gemm.C = C;
    op.u.gemm.adt = adt;
    op.u.gemm.bdt = bdt;
    op.u.gemm.cdt = cdt;
    return submit(d, s, &op);
}

int zn_dev_gemm(zn_dev *d, zn_stream *s, zn_trans ta, zn_trans tb, int64_t m, int64_t n,
                int64_t k, float alpha, const void *A, zn_dtype adt, int64_t lda,
                const void *B, zn_dtype bdt, int64_t ldb, float beta, void *C,
                zn_dtype cdt, int64_t ldc)
{
    return zn_dev_gemm_strided_batched(d, s, ta, tb, m, n, k, alpha, A, adt, lda, 0, B, bdt,
                                       ldb, 0, beta, C, cdt, ldc, 0, 1);
}

int zn_dev_swiglu_fwd(zn_dev *d, zn_stream *s, const void *gate, const void *up, void *out,
                      zn_dtype dt, int64_t n)
{
    const char *fn = "swiglu_fwd";
    CHK_DT(fn, dt);
    CHK(n >= 0, "%s: n = %lld", fn, (long long)n);
    if (n == 0)
        return 0;
    CHK_PTR(fn, gate, nbytes(n, dt));
    CHK_PTR(fn, up, nbytes(n, dt));
    CHK_PTR(fn, out, nbytes(n, dt));
    zn_op op = { .kind = ZN_OPK_SWIGLU_FWD };
    op.u.swiglu.gate = gate;
    op.u.swiglu.up = up;
    op.u.swiglu.out = out;
    op.u.swiglu.dt = dt;
    op.u.swiglu.n = n;
    return submit(d, s, &op);
}

int zn_dev_swiglu_bwd(zn_dev *d, zn_stream *s, const void *gate, const void *up,
                      const void *dout, void *dgate, void *dup, zn_dtype dt, int64_t n)
{
    const char *fn = "swiglu_bwd";
    CHK_DT(fn, dt);
    CHK(n >= 0, "%s: n = %lld", fn, (long long)n);
    if (n == 0)
        return 0;
    CHK_PTR(fn, gate, nbytes(n, dt));
    CHK_PTR(fn, up, nbytes(n, dt));
    CHK_PTR(fn, dout, nbytes(n, dt));
    CHK_PTR(fn, dgate, nbytes(n, dt));
    CHK_PTR(fn, dup, nbytes(n, dt));
    CHK(dgate != dout && dup != dout && dgate != dup, "%s: dgate/dup may not alias dout "
        "or each other", fn);
    zn_op op = { .kind = ZN_OPK_SWIGLU_BWD };
    op.u.swiglu.gate = gate;
    op.u.swiglu.up = up;
    op.u.swiglu.dout = dout;
    op.u.swiglu.dgate = dgate;
    op.u.swiglu.dup = dup;
    op.u.swiglu.dt = dt;
    op.u.swiglu.n = n;
    return submit(d, s, &op);
}

static int ew(zn_dev *d, zn_stream *s, zn_op_kind kind, const char *fn, const void *a,
              const void *b, zn_dtype a_dt, void *y, zn_dtype y_dt, int64_t n, float alpha)
{
    CHK_DT(fn, a_dt);
    CHK_DT(fn, y_dt);
    CHK(n >= 0, "%s: n = %lld", fn, (long long)n);
    if (n == 0)
        return 0;
    if (a)
        CHK_PTR(fn, a, nbytes(n, a_dt));
    if (b)
        CHK_PTR(fn, b, nbytes(n, a_dt));
    CHK_PTR(fn, y, nbytes(n, y_dt));
    zn_op op = { .kind = kind };
    op.u.ew.a = a;
    op.u.ew.b = b;
    op.u.ew.a_dt = a_dt;
    op.u.ew.y = y;
    op.u.ew.y_dt = y_dt;
    op.u.ew.n = n;
    op.u.ew.alpha = alpha;
    return submit(d, s, &op);
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

int zn_dev_bias_add(zn_dev *d, zn_stream *s, void *y, zn_dtype y_dt, int64_t ld,
                    const void *bias, zn_dtype bias_dt, int64_t rows, int64_t cols)
{
    const char *fn = "bias_add";
    CHK_DT(fn, y_dt);
    CHK_DT(fn, bias_dt);
    CHK(rows >= 0 && cols > 0 && ld >= cols, "%s: bad sizes (rows %lld cols %lld ld %lld)",
        fn, (long long)rows, (long long)cols, (long long)ld);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, y, span(rows, cols, ld, y_dt));
    CHK_PTR(fn, bias, nbytes(cols, bias_dt));
    zn_op op = { .kind = ZN_OPK_BIAS_ADD };
    op.u.bias.y = y;
    op.u.bias.y_dt = y_dt;
    op.u.bias.ld = ld;
    op.u.bias.bias = bias;
    op.u.bias.bias_dt = bias_dt;
    op.u.bias.rows = rows;
    op.u.bias.cols = cols;
    return submit(d, s, &op);
}

int zn_dev_bias_grad(zn_dev *d, zn_stream *s, const void *dy, zn_dtype dy_dt, int64_t ld,
                     float *dbias, int64_t rows, int64_t cols)
{
    const char *fn = "bias_grad";
    CHK_DT(fn, dy_dt);
    CHK(rows >= 0 && cols > 0 && ld >= cols, "%s: bad sizes (rows %lld cols %lld ld %lld)",
        fn, (long long)rows, (long long)cols, (long long)ld);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, dy, span(rows, cols, ld, dy_dt));
    CHK_PTR(fn, dbias, (uint64_t)cols * 4);
    zn_op op = { .kind = ZN_OPK_BIAS_GRAD };
    op.u.bias.dy = dy;
    op.u.bias.y_dt = dy_dt;
    op.u.bias.ld = ld;
    op.u.bias.dbias = dbias;
    op.u.bias.rows = rows;
    op.u.bias.cols = cols;
    return submit(d, s, &op);
}

int zn_dev_cast(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, void *y, zn_dtype y_dt,
                int64_t n)
{
    const char *fn = "cast";
    CHK_DT(fn, x_dt);
    CHK_DT(fn, y_dt);
    CHK(n >= 0, "%s: n = %lld", fn, (long long)n);
    if (n == 0)
        return 0;
    CHK_PTR(fn, x, nbytes(n, x_dt));
    CHK_PTR(fn, y, nbytes(n, y_dt));
    zn_op op = { .kind = ZN_OPK_CAST };
    op.u.cast.x = x;
    op.u.cast.x_dt = x_dt;
    op.u.cast.y = y;
    op.u.cast.y_dt = y_dt;
    op.u.cast.n = n;
    return submit(d, s, &op);
}

int zn_dev_dropout(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, int64_t ldx, void *y,
                   zn_dtype y_dt, int64_t ldy, int64_t rows, int64_t cols, double p,
                   uint64_t key, int accumulate)
{
    const char *fn = "dropout";
    CHK_DT(fn, x_dt);
    CHK_DT(fn, y_dt);
    CHK(rows >= 0 && cols > 0 && ldx >= cols && ldy >= cols,
        "%s: bad sizes (rows %lld cols %lld ldx %lld ldy %lld)", fn, (long long)rows,
        (long long)cols, (long long)ldx, (long long)ldy);
    CHK(p >= 0.0 && p < 1.0, "%s: p = %g is outside [0, 1)", fn, p);
    if (rows == 0)
        return 0;
    CHK_PTR(fn, x, span(rows, cols, ldx, x_dt));
    CHK_PTR(fn, y, span(rows, cols, ldy, y_dt));
    zn_op op = { .kind = ZN_OPK_DROPOUT };
    op.u.drop.x = x;
    op.u.drop.x_dt = x_dt;
    op.u.drop.y = y;
    op.u.drop.y_dt = y_dt;
    op.u.drop.ldx = ldx;
    op.u.drop.ldy = ldy;
    op.u.drop.rows = rows;
    op.u.drop.cols = cols;
    op.u.drop.key = key;
    op.u.drop.thresh = zn_drop_threshold(p);
    op.u.drop.scale = (float)(1.0 / (1.0 - p));
    op.u.drop.accumulate = accumulate != 0;
    return submit(d, s, &op);
}

int zn_dev_copy_2d(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, int64_t ldx, void *y,
                   zn_dtype y_dt, int64_t ldy, int64_t rows, int64_t cols)
{
    /* the dropout op with p = 0 keeps every element and scales by 1 */
    return zn_dev_dropout(d, s, x, x_dt, ldx, y, y_dt, ldy, rows, cols, 0.0, 0, 0);
}

/* ---- the optimizer -------------------------------------------------------------*/
int zn_dev_adam(zn_dev *d, zn_stream *s, const zn_adam_params *hp, float *p, float *m,
                float *v, const float *g, float g_scale, void *c, zn_dtype c_dt, int64_t n)
{
    CHK(n >= 0, "adam: n = %lld", (long long)n);
    CHK(!c || c_dt == ZN_DTYPE_BF16, "adam: the 16-bit copy must be bf16 on a device, not %s",
        zn_dtype_name(c_dt));
    zn_adam_consts k;
    /* the CPU step's checks and constants: one set for both backends */
    int rc = zn_adam_prepare(hp, p, m, v, g, ZN_DTYPE_F32, g_scale, c, c_dt, (size_t)n, &k);
    if (rc)
        return rc;
    if (n == 0)
        return 0;
    uint64_t b = nbytes(n, ZN_DTYPE_F32);
    CHK_PTR("adam", p, b);
    CHK_PTR("adam", m, b);
    CHK_PTR("adam", v, b);
    CHK_PTR("adam", g, b);
    if (c)
        CHK_PTR("adam", c, nbytes(n, c_dt));
    zn_op op = { .kind = ZN_OPK_ADAM };
    op.u.adam.p = p;
    op.u.adam.m = m;
    op.u.adam.v = v;
    op.u.adam.g = g;
    op.u.adam.c = c;
    op.u.adam.c_dt = c_dt;
    op.u.adam.n = n;
    op.u.adam.hp = *hp;
    op.u.adam.g_scale = g_scale;
    op.u.adam.b1 = k.b1;
    op.u.adam.omb1 = k.omb1;
    op.u.adam.b2 = k.b2;
    op.u.adam.omb2 = k.omb2;
    op.u.adam.step = k.step_size;
    op.u.adam.eps = k.eps;
    op.u.adam.l2 = k.l2;
    op.u.adam.decay = k.decay;
    op.u.adam.use_l2 = k.use_l2;
    op.u.adam.use_decay = k.use_decay;
    return submit(d, s, &op);
}

int zn_dev_norm_sq_chunks(zn_dev *d, zn_stream *s, const float *x, int64_t n, double *out)
{
    CHK(n >= 0, "norm_sq_chunks: n = %lld", (long long)n);
    if (n == 0)
        return 0;
    int64_t nc = (n + (int64_t)ZN_GRAD_NORM_CHUNK - 1) / (int64_t)ZN_GRAD_NORM_CHUNK;
    CHK_PTR("norm_sq_chunks", x, nbytes(n, ZN_DTYPE_F32));
    CHK_PTR("norm_sq_chunks", out, (uint64_t)nc * 8);
    zn_op op = { .kind = ZN_OPK_NORM_CHUNKS };
    op.u.normc.x = x;
    op.u.normc.n = n;
    op.u.normc.out = out;
    return submit(d, s, &op);
}
