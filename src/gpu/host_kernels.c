/* The plain C reference of every device kernel, and the host backend's
 * implementation of them: one thread (the stream's worker), fp32 math with
 * double accumulation in reductions, bf16 as uint16. GEMM goes to OpenBLAS
 * (bf16 operands converted to fp32 tiles first). The CUDA kernels in
 * cuda_kernels.cu, cuda_nn.cu and cuda_flash.cu follow these line by line. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include <cblas.h>

#include "gpu/gpu-impl.h"
#include "util/hash-impl.h"

static inline float ldf(const void *p, zn_dtype dt, int64_t i)
{
    return dt == ZN_DTYPE_F32 ? ((const float *)p)[i] : zn_bf16_widen(((const uint16_t *)p)[i]);
}

static inline void stf(void *p, zn_dtype dt, int64_t i, float v)
{
    if (dt == ZN_DTYPE_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = zn_bf16_round(v);
}

static inline const char *cadv(const void *p, zn_dtype dt, int64_t n)
{
    return (const char *)p + n * (int64_t)zn_dtype_size(dt);
}

static inline char *adv(void *p, zn_dtype dt, int64_t n)
{
    return (char *)p + n * (int64_t)zn_dtype_size(dt);
}

/* ---- GEMM ----------------------------------------------------------------*/
static int grow(float **scratch, size_t *len, size_t need)
{
    if (*len >= need)
        return 0;
    float *p = realloc(*scratch, need * sizeof(float));
    if (!p)
        return zn_set_error(-ENOMEM, "host gemm: no memory for %zu bytes of fp32 tiles",
                            need * sizeof(float));
    *scratch = p;
    *len = need;
    return 0;
}

/* C[m x n] (row-major, ldc) = beta * C, with beta == 0 writing zeros (so that
 * NaN in an unread C does not survive, as BLAS promises). */
static void scale_c(void *C, zn_dtype cdt, int64_t m, int64_t n, int64_t ldc, float beta)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            int64_t o = i * ldc + j;
            stf(C, cdt, o, beta == 0.0f ? 0.0f : beta * ldf(C, cdt, o));
        }
}

enum { GEMM_MB = 256, GEMM_KB = 256 };

static int gemm_one(const zn_op *op, const void *A, const void *B, void *C, float **scratch,
                    size_t *slen)
{
    const int64_t m = op->u.gemm.m, n = op->u.gemm.n, k = op->u.gemm.k;
    const int64_t lda = op->u.gemm.lda, ldb = op->u.gemm.ldb, ldc = op->u.gemm.ldc;
    const int ta = op->u.gemm.ta == ZN_TRANS, tb = op->u.gemm.tb == ZN_TRANS;
    const float alpha = op->u.gemm.alpha, beta = op->u.gemm.beta;
    const zn_dtype adt = op->u.gemm.adt, cdt = op->u.gemm.cdt;

    if (k == 0 || alpha == 0.0f) {
        scale_c(C, cdt, m, n, ldc, beta);
        return 0;
    }
    if (adt == ZN_DTYPE_F32) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                    tb ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha,
                    A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
        return 0;
    }
    /* bf16 operands: gather op(A) and op(B) tiles as fp32, then sgemm into an
     * fp32 row block of C (C itself when it is fp32). */
    const int64_t mb = m < GEMM_MB ? m : GEMM_MB, kb = k < GEMM_KB ? k : GEMM_KB;
    const size_t need_a = (size_t)(mb * kb), need_b = (size_t)(kb * n);
    const size_t need_c = cdt == ZN_DTYPE_F32 ? 0 : (size_t)(mb * n);
    int rc = grow(scratch, slen, need_a + need_b + need_c);
    if (rc)
        return rc;
    float *At = *scratch, *Bt = At + need_a, *Cf = Bt + need_b;
    const uint16_t *a16 = A, *b16 = B;

    for (int64_t i0 = 0; i0 < m; i0 += mb) {
        const int64_t mr = m - i0 < mb ? m - i0 : mb;
        float *cb;
        int64_t ldcb;
        if (cdt == ZN_DTYPE_F32) {
            cb = (float *)C + i0 * ldc;
            ldcb = ldc;
            scale_c(cb, ZN_DTYPE_F32, mr, n, ldc, beta);
        } else {
            cb = Cf;
            ldcb = n;
            for (int64_t i = 0; i < mr; i++)
                for (int64_t j = 0; j < n; j++)
                    Cf[i * n + j] = beta == 0.0f ? 0.0f :
                        beta * zn_bf16_widen(((const uint16_t *)C)[(i0 + i) * ldc + j]);
        }
        for (int64_t p0 = 0; p0 < k; p0 += kb) {
            const int64_t kr = k - p0 < kb ? k - p0 : kb;
            for (int64_t i = 0; i < mr; i++)
                for (int64_t p = 0; p < kr; p++) {
                    int64_t r = i0 + i, c = p0 + p;
                    At[i * kr + p] = zn_bf16_widen(ta ? a16[c * lda + r] : a16[r * lda + c]);
                }
            for (int64_t p = 0; p < kr; p++)
                for (int64_t j = 0; j < n; j++) {
                    int64_t r = p0 + p;
                    Bt[p * n + j] = zn_bf16_widen(tb ? b16[j * ldb + r] : b16[r * ldb + j]);
                }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)mr, (blasint)n,
                        (blasint)kr, alpha, At, (blasint)kr, Bt, (blasint)n, 1.0f, cb,
                        (blasint)ldcb);
        }
        if (cdt != ZN_DTYPE_F32)
            for (int64_t i = 0; i < mr; i++)
                for (int64_t j = 0; j < n; j++)
                    ((uint16_t *)C)[(i0 + i) * ldc + j] = zn_bf16_round(Cf[i * n + j]);
    }
    return 0;
}

static int run_gemm(const zn_op *op, float **scratch, size_t *slen)
{
    for (int64_t b = 0; b < op->u.gemm.batch; b++) {
        int rc = gemm_one(op, cadv(op->u.gemm.A, op->u.gemm.adt, b * op->u.gemm.sa),
                          cadv(op->u.gemm.B, op->u.gemm.bdt, b * op->u.gemm.sb),
                          adv(op->u.gemm.C, op->u.gemm.cdt, b * op->u.gemm.sc), scratch, slen);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- Llama kernels -----------------------------------------------------*/
static void emb_fwd(const zn_op *op)
{
    const int64_t dim = op->u.emb.dim;
    for (int64_t t = 0; t < op->u.emb.n_tokens; t++) {
        int64_t id = (int64_t)op->u.emb.ids[t] - op->u.emb.row0;
        int ok = id >= 0 && id < op->u.emb.vocab;
        if (!ok && op->u.emb.skip)
            continue; /* another part's row */
        const float sc = op->u.emb.scale;
        for (int64_t j = 0; j < dim; j++) {
            float v = ok ? ldf(op->u.emb.table, op->u.emb.table_dt, id * dim + j) : 0.0f;
            stf(op->u.emb.out, op->u.emb.out_dt, t * dim + j, sc != 1.0f ? v * sc : v);
        }
    }
}

static void emb_bwd(const zn_op *op)
{
    const int64_t dim = op->u.emb.dim;
    for (int64_t t = 0; t < op->u.emb.n_tokens; t++) {
        int64_t id = (int64_t)op->u.emb.ids[t] - op->u.emb.row0;
        if (id < 0 || id >= op->u.emb.vocab)
            continue;
        float *row = op->u.emb.dtable + id * dim;
        const float sc = op->u.emb.scale;
        for (int64_t j = 0; j < dim; j++) {
            float g = ldf(op->u.emb.dout, op->u.emb.dout_dt, t * dim + j);
            row[j] += sc != 1.0f ? g * sc : g;
        }
    }
}

/* Group g of the rows x heads groups: its first element at g / heads rows
 * of ld and g % heads groups of dim in (the plain norm: heads 1, ld dim). */
static inline int64_t rms_at(int64_t g, int64_t heads, int64_t ld, int64_t dim)
{
    return g / heads * ld + g % heads * dim;
}

static void rms_fwd(const zn_op *op)
{
    const int64_t dim = op->u.rms_fwd.dim, heads = op->u.rms_fwd.heads;
    const zn_dtype xt = op->u.rms_fwd.x_dt;
    for (int64_t r = 0; r < op->u.rms_fwd.rows * heads; r++) {
        const int64_t ox = rms_at(r, heads, op->u.rms_fwd.ldx, dim);
        const int64_t oy = rms_at(r, heads, op->u.rms_fwd.ldy, dim);
        double ss = 0;
        for (int64_t j = 0; j < dim; j++) {
            double v = ldf(op->u.rms_fwd.x, xt, ox + j);
            ss += v * v;
        }
        float rs = 1.0f / sqrtf((float)(ss / (double)dim) + op->u.rms_fwd.eps);
        /* Read the whole row's x before y overwrites it (y may alias x). */
        for (int64_t j = 0; j < dim; j++) {
            float x = ldf(op->u.rms_fwd.x, xt, ox + j);
            float w = ldf(op->u.rms_fwd.w, op->u.rms_fwd.w_dt, j);
            if (op->u.rms_fwd.w_off != 0.0f)
                w += op->u.rms_fwd.w_off;
            stf(op->u.rms_fwd.y, op->u.rms_fwd.y_dt, oy + j, w * (x * rs));
        }
        if (op->u.rms_fwd.rstd)
            op->u.rms_fwd.rstd[r] = rs;
    }
}

static void rms_bwd(const zn_op *op)
{
    const int64_t dim = op->u.rms_bwd.dim, heads = op->u.rms_bwd.heads;
    const int64_t groups = op->u.rms_bwd.rows * heads;
    const zn_dtype xt = op->u.rms_bwd.x_dt, wt = op->u.rms_bwd.w_dt, dyt = op->u.rms_bwd.dy_dt;
    for (int64_t r = 0; r < groups; r++) {
        const int64_t ox = rms_at(r, heads, op->u.rms_bwd.ldx, dim);
        const int64_t od = rms_at(r, heads, op->u.rms_bwd.ldd, dim);
        const float rs = op->u.rms_bwd.rstd[r];
        const float off = op->u.rms_bwd.w_off;
        double dot = 0;
        for (int64_t j = 0; j < dim; j++) {
            float w = ldf(op->u.rms_bwd.w, wt, j);
            if (off != 0.0f)
                w += off;
            dot += (double)w * ldf(op->u.rms_bwd.dy, dyt, od + j) *
                   ldf(op->u.rms_bwd.x, xt, ox + j);
        }
        const float c = (float)(dot / (double)dim) * rs * rs;
        for (int64_t j = 0; j < dim; j++) {
            float x = ldf(op->u.rms_bwd.x, xt, ox + j);
            float dy = ldf(op->u.rms_bwd.dy, dyt, od + j);
            float w = ldf(op->u.rms_bwd.w, wt, j);
            if (off != 0.0f)
                w += off;
            stf(op->u.rms_bwd.dx, op->u.rms_bwd.dx_dt, od + j, rs * (w * dy - x * c));
        }
    }
}

/* dw[j] += sum over the groups of dy*x*rstd in group order; runs before
 * rms_bwd because dx may alias dy. */
static void rms_bwd_dw(const zn_op *op)
{
    const int64_t dim = op->u.rms_bwd.dim, heads = op->u.rms_bwd.heads;
    const int64_t groups = op->u.rms_bwd.rows * heads;
    for (int64_t j = 0; j < dim; j++) {
        double acc = 0;
        for (int64_t r = 0; r < groups; r++)
            acc += (double)ldf(op->u.rms_bwd.dy, op->u.rms_bwd.dy_dt,
                               rms_at(r, heads, op->u.rms_bwd.ldd, dim) + j) *
                   ldf(op->u.rms_bwd.x, op->u.rms_bwd.x_dt,
                       rms_at(r, heads, op->u.rms_bwd.ldx, dim) + j) * op->u.rms_bwd.rstd[r];
        op->u.rms_bwd.dw[j] += (float)acc;
    }
}

static void rope(const zn_op *op)
{
    const int64_t hd = op->u.rope.head_dim, half = hd / 2;
    const zn_dtype dt = op->u.rope.dt;
    const float sign = op->u.rope.inverse ? -1.0f : 1.0f;
    for (int64_t t = 0; t < op->u.rope.tokens; t++) {
        const float p = (float)op->u.rope.pos[t];
        for (int64_t h = 0; h < op->u.rope.n_heads; h++) {
            int64_t base = t * op->u.rope.ld + h * hd;
            for (int64_t i = 0; i < half; i++) {
                float a = p * op->u.rope.inv_freq[i];
                float c = cosf(a), s = sign * sinf(a);
                float x1 = ldf(op->u.rope.x, dt, base + i);
                float x2 = ldf(op->u.rope.x, dt, base + i + half);
                stf(op->u.rope.x, dt, base + i, x1 * c - x2 * s);
                stf(op->u.rope.x, dt, base + i + half, x2 * c + x1 * s);
            }
        }
    }
}

/* Row r's valid keys [*lo, lim): causal, and from its document's first
 * position on when key_start is given (a bad start is clamped to keep at
 * least the diagonal). */
static void softmax_keys(const zn_op *op, int64_t r, int64_t *lo, int64_t *lim)
{
    int64_t hi = op->u.softmax.q_offset + r + 1;
    if (hi > op->u.softmax.cols)
        hi = op->u.softmax.cols;
    int64_t l = op->u.softmax.key_start ? op->u.softmax.key_start[r] : 0;
    *lo = l < 0 ? 0 : l >= hi ? hi - 1 : l;
    *lim = hi;
}

static void softmax_fwd(const zn_op *op)
{
    const int64_t rows = op->u.softmax.rows, cols = op->u.softmax.cols;
    const float scale = op->u.softmax.scale;
    const zn_dtype st = op->u.softmax.S_dt, pt = op->u.softmax.P_dt;
    for (int64_t b = 0; b < op->u.softmax.batch; b++)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t o = (b * rows + r) * cols;
            int64_t lo, lim;
            softmax_keys(op, r, &lo, &lim);
            float mx = -INFINITY;
            for (int64_t j = lo; j < lim; j++) {
                float v = scale * ldf(op->u.softmax.S, st, o + j);
                mx = v > mx ? v : mx;
            }
            double sum = 0;
            for (int64_t j = lo; j < lim; j++)
                sum += expf(scale * ldf(op->u.softmax.S, st, o + j) - mx);
            const float inv = (float)(1.0 / sum);
            for (int64_t j = 0; j < cols; j++)
                stf(op->u.softmax.P, pt, o + j,
                    j >= lo && j < lim ? expf(scale * ldf(op->u.softmax.S, st, o + j) - mx) * inv
                                       : 0.0f);
        }
}

static void softmax_bwd(const zn_op *op)
{
    const int64_t rows = op->u.softmax.rows, cols = op->u.softmax.cols;
    const float scale = op->u.softmax.scale;
    const zn_dtype pt = op->u.softmax.Pin_dt, dpt = op->u.softmax.dP_dt;
    for (int64_t b = 0; b < op->u.softmax.batch; b++)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t o = (b * rows + r) * cols;
            int64_t lo, lim;
            softmax_keys(op, r, &lo, &lim);
            double dot = 0;
            for (int64_t j = lo; j < lim; j++)
                dot += (double)ldf(op->u.softmax.Pin, pt, o + j) *
                       ldf(op->u.softmax.dP, dpt, o + j);
            const float fd = (float)dot;
            for (int64_t j = 0; j < cols; j++) {
                float v = 0.0f;
                if (j >= lo && j < lim)
                    v = scale * ldf(op->u.softmax.Pin, pt, o + j) *
                        (ldf(op->u.softmax.dP, dpt, o + j) - fd);
                stf(op->u.softmax.P, op->u.softmax.P_dt, o + j, v);
            }
        }
}

/* ---- soft-capping (Gemma 2): y = cap tanh(scale x / cap) ------------------
 * (scale x) / cap in fp32, as transformers divides the scaled scores; the
 * backward from the forward's y. */
static inline float softcapf(float x, float scale, float cap)
{
    return cap * tanhf(x * scale / cap);
}

static void softcap_op(const zn_op *op)
{
    const float scale = op->u.softcap.scale, cap = op->u.softcap.cap;
    const zn_dtype xt = op->u.softcap.x_dt, yt = op->u.softcap.y_dt;
    for (int64_t i = 0; i < op->u.softcap.n; i++) {
        float x = ldf(op->u.softcap.x, xt, i);
        if (op->kind == ZN_OPK_SOFTCAP_FWD) {
            stf(op->u.softcap.y, yt, i, softcapf(x, scale, cap));
        } else {
            float t = x / cap;
            stf(op->u.softcap.y, yt, i,
                scale * ldf(op->u.softcap.dy, op->u.softcap.dy_dt, i) * (1.0f - t * t));
        }
    }
}

/* ---- fused attention (the C reference of k_flash_*) ---------------------
 * Per sequence, per kv head: K and V widened to fp32 once; per head of the
 * group, query tiles of FL_BQ rows meet key tiles of FL_BC keys through
 * OpenBLAS, with the running maximum m and sum l of the online softmax.
 * Rounding points as on the GPU: probabilities (forward, and the dV
 * product) and score gradients meet the second product rounded to dt; the
 * row sums, dS and all accumulators stay fp32. The CUDA kernels take keys
 * 32 at a time (the forward's rescaling falls elsewhere: rounding-level
 * differences only). */
enum { FL_BQ = 64, FL_BC = 64 };

static inline float rnd_dt(float v, zn_dtype dt)
{
    return dt == ZN_DTYPE_F32 ? v : zn_bf16_widen(zn_bf16_round(v));
}

/* Query t's first key: key_start clamped to [0, t]. */
static inline int64_t fl_lo(const int32_t *ks, int64_t t)
{
    int64_t k = ks ? ks[t] : 0;
    return k < 0 ? 0 : k > t ? t : k;
}

/* Columns [c0, c0 + hd) of T rows (leading dimension ld) into fp32 [T][hd]. */
static void fl_widen(const void *x, zn_dtype dt, int64_t ld, int64_t c0, int64_t T, int64_t hd,
                     float *y)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < hd; c++)
            y[t * hd + c] = ldf(x, dt, t * ld + c0 + c);
}

static void fl_store(const float *y, int64_t T, int64_t hd, void *x, zn_dtype dt, int64_t ld,
                     int64_t c0)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < hd; c++)
            stf(x, dt, t * ld + c0 + c, y[t * hd + c]);
}

/* The first key tile query rows [q0, q0 + qn) can see. */
static int64_t fl_first_tile(const int32_t *ks, int64_t q0, int64_t qn)
{
    int64_t lo = q0;
    for (int64_t r = 0; r < qn; r++) {
        int64_t l = fl_lo(ks, q0 + r);
        lo = l < lo ? l : lo;
    }
    return lo / FL_BC * FL_BC;
}

static int flash_fwd(const zn_op *op, float **scratch, size_t *len)
{
    const zn_dtype dt = op->u.flash.dt;
    const int64_t T = op->u.flash.seq, nh = op->u.flash.nh, nkv = op->u.flash.nkv;
    const int64_t hd = op->u.flash.hd, g = nh / nkv, ld = op->u.flash.ld, ldo = op->u.flash.ldo;
    const float scale = op->u.flash.scale, cap = op->u.flash.softcap;
    if (grow(scratch, len, (size_t)(3 * T * hd + FL_BQ * FL_BC + FL_BQ * hd + 2 * FL_BQ)))
        return -ENOMEM;
    float *K = *scratch, *V = K + T * hd, *Q = V + T * hd, *S = Q + T * hd;
    float *O = S + FL_BQ * FL_BC, *m = O + FL_BQ * hd, *l = m + FL_BQ;
    for (int64_t b = 0; b < op->u.flash.batch; b++) {
        const void *x = cadv(op->u.flash.qkv, dt, b * T * ld);
        void *out = adv(op->u.flash.out, dt, b * T * ldo);
        const int32_t *ks = op->u.flash.key_start ? op->u.flash.key_start + b * T : NULL;
        for (int64_t j = 0; j < nkv; j++) {
            fl_widen(x, dt, ld, nh * hd + j * hd, T, hd, K);
            fl_widen(x, dt, ld, (nh + nkv) * hd + j * hd, T, hd, V);
            for (int64_t h = j * g; h < (j + 1) * g; h++) {
                float *lse = op->u.flash.lse + (b * nh + h) * T;
                fl_widen(x, dt, ld, h * hd, T, hd, Q);
                for (int64_t q0 = 0; q0 < T; q0 += FL_BQ) {
                    int64_t qn = T - q0 < FL_BQ ? T - q0 : FL_BQ, kend = q0 + qn;
                    for (int64_t r = 0; r < qn; r++) {
                        m[r] = -INFINITY;
                        l[r] = 0.0f;
                    }
                    memset(O, 0, (size_t)(qn * hd) * sizeof(float));
                    for (int64_t k0 = fl_first_tile(ks, q0, qn); k0 < kend; k0 += FL_BC) {
                        int64_t kn = kend - k0 < FL_BC ? kend - k0 : FL_BC;
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)qn, (int)kn,
                                    (int)hd, scale, Q + q0 * hd, (int)hd, K + k0 * hd, (int)hd,
                                    0.0f, S, FL_BC);
                        for (int64_t r = 0; r < qn; r++) {
                            int64_t t = q0 + r, lo = fl_lo(ks, t);
                            float *sr = S + r * FL_BC, mx = -INFINITY;
                            for (int64_t u = 0; u < kn; u++) {
                                int64_t k = k0 + u;
                                if (k < lo || k > t)
                                    sr[u] = -INFINITY;
                                else if (cap > 0.0f)
                                    sr[u] = softcapf(sr[u], 1.0f, cap);
                                mx = sr[u] > mx ? sr[u] : mx;
                            }
                            float mn = mx > m[r] ? mx : m[r];
                            float alpha = 1.0f, sum = 0.0f;
                            if (mn == -INFINITY) {
                                for (int64_t u = 0; u < kn; u++)
                                    sr[u] = 0.0f;
                            } else {
                                alpha = expf(m[r] - mn);
                                for (int64_t u = 0; u < kn; u++) {
                                    float p = sr[u] == -INFINITY ? 0.0f : expf(sr[u] - mn);
                                    sum += p;
                                    sr[u] = rnd_dt(p, dt);
                                }
                            }
                            l[r] = l[r] * alpha + sum;
                            m[r] = mn;
                            for (int64_t c = 0; c < hd; c++)
                                O[r * hd + c] *= alpha;
                        }
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)qn, (int)hd,
                                    (int)kn, 1.0f, S, FL_BC, V + k0 * hd, (int)hd, 1.0f, O,
                                    (int)hd);
                    }
                    for (int64_t r = 0; r < qn; r++) {
                        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
                        for (int64_t c = 0; c < hd; c++)
                            stf(out, dt, (q0 + r) * ldo + h * hd + c, O[r * hd + c] * inv);
                        lse[q0 + r] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
                    }
                }
            }
        }
    }
    return 0;
}

static int flash_bwd(const zn_op *op, float **scratch, size_t *len)
{
    const zn_dtype dt = op->u.flash.dt;
    const int64_t T = op->u.flash.seq, nh = op->u.flash.nh, nkv = op->u.flash.nkv;
    const int64_t hd = op->u.flash.hd, g = nh / nkv, ld = op->u.flash.ld;
    const int64_t ldo = op->u.flash.ldo, ldd = op->u.flash.ldd;
    const float scale = op->u.flash.scale, cap = op->u.flash.softcap;
    const size_t th = (size_t)(T * hd);
    if (grow(scratch, len, 7 * th + 4 * FL_BQ * FL_BC))
        return -ENOMEM;
    float *K = *scratch, *V = K + th, *Q = V + th, *dO = Q + th, *dQ = dO + th, *dK = dQ + th;
    float *dV = dK + th, *P = dV + th, *Pb = P + FL_BQ * FL_BC, *dS = Pb + FL_BQ * FL_BC;
    float *G = dS + FL_BQ * FL_BC; /* softcap: each score's 1 - tanh^2 */
    for (int64_t b = 0; b < op->u.flash.batch; b++) {
        const void *x = cadv(op->u.flash.qkv, dt, b * T * ld);
        const void *o = cadv(op->u.flash.out, dt, b * T * ldo);
        const void *dout = cadv(op->u.flash.dout, dt, b * T * ldo);
        void *dx = adv(op->u.flash.dqkv, dt, b * T * ldd);
        const int32_t *ks = op->u.flash.key_start ? op->u.flash.key_start + b * T : NULL;
        for (int64_t j = 0; j < nkv; j++) {
            fl_widen(x, dt, ld, nh * hd + j * hd, T, hd, K);
            fl_widen(x, dt, ld, (nh + nkv) * hd + j * hd, T, hd, V);
            memset(dK, 0, th * sizeof(float));
            memset(dV, 0, th * sizeof(float));
            for (int64_t h = j * g; h < (j + 1) * g; h++) {
                const float *lse = op->u.flash.lse + (b * nh + h) * T;
                float *D = op->u.flash.delta + (b * nh + h) * T;
                fl_widen(x, dt, ld, h * hd, T, hd, Q);
                fl_widen(dout, dt, ldo, h * hd, T, hd, dO);
                for (int64_t t = 0; t < T; t++) {
                    float sum = 0.0f;
                    for (int64_t c = 0; c < hd; c++)
                        sum += dO[t * hd + c] * ldf(o, dt, t * ldo + h * hd + c);
                    D[t] = sum;
                }
                memset(dQ, 0, th * sizeof(float));
                for (int64_t q0 = 0; q0 < T; q0 += FL_BQ) {
                    int64_t qn = T - q0 < FL_BQ ? T - q0 : FL_BQ, kend = q0 + qn;
                    for (int64_t k0 = fl_first_tile(ks, q0, qn); k0 < kend; k0 += FL_BC) {
                        int64_t kn = kend - k0 < FL_BC ? kend - k0 : FL_BC;
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)qn, (int)kn,
                                    (int)hd, scale, Q + q0 * hd, (int)hd, K + k0 * hd, (int)hd,
                                    0.0f, P, FL_BC);
                        for (int64_t r = 0; r < qn; r++) {
                            int64_t t = q0 + r, lo = fl_lo(ks, t);
                            for (int64_t u = 0; u < kn; u++) {
                                int64_t k = k0 + u;
                                float sc = P[r * FL_BC + u];
                                if (cap > 0.0f) {
                                    float c = softcapf(sc, 1.0f, cap), tc = c / cap;
                                    G[r * FL_BC + u] = 1.0f - tc * tc;
                                    sc = c;
                                }
                                float p = k < lo || k > t ? 0.0f : expf(sc - lse[t]);
                                P[r * FL_BC + u] = p;
                                Pb[r * FL_BC + u] = rnd_dt(p, dt);
                            }
                        }
                        /* dV += P^T dO */
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kn, (int)hd,
                                    (int)qn, 1.0f, Pb, FL_BC, dO + q0 * hd, (int)hd, 1.0f,
                                    dV + k0 * hd, (int)hd);
                        /* dP = dO V^T, then dS = scale P (dP - D) */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)qn, (int)kn,
                                    (int)hd, 1.0f, dO + q0 * hd, (int)hd, V + k0 * hd, (int)hd,
                                    0.0f, dS, FL_BC);
                        for (int64_t r = 0; r < qn; r++)
                            for (int64_t u = 0; u < kn; u++) {
                                float *e = dS + r * FL_BC + u;
                                float v = P[r * FL_BC + u] * (*e - D[q0 + r]) * scale;
                                *e = rnd_dt(cap > 0.0f ? v * G[r * FL_BC + u] : v, dt);
                            }
                        /* dQ += dS K; dK += dS^T Q */
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)qn, (int)hd,
                                    (int)kn, 1.0f, dS, FL_BC, K + k0 * hd, (int)hd, 1.0f,
                                    dQ + q0 * hd, (int)hd);
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kn, (int)hd,
                                    (int)qn, 1.0f, dS, FL_BC, Q + q0 * hd, (int)hd, 1.0f,
                                    dK + k0 * hd, (int)hd);
                    }
                }
                fl_store(dQ, T, hd, dx, dt, ldd, h * hd);
            }
            fl_store(dK, T, hd, dx, dt, ldd, nh * hd + j * hd);
            fl_store(dV, T, hd, dx, dt, ldd, (nh + nkv) * hd + j * hd);
        }
    }
    return 0;
}

static inline float sigm(float g)
{
    return 1.0f / (1.0f + expf(-g));
}

/* tanh GELU (transformers' gelu_pytorch_tanh) and its derivative, fp32 */
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
static inline float gelu_tanh(float g)
{
    return 0.5f * g * (1.0f + tanhf(GELU_K * (g + 0.044715f * g * g * g)));
}

static inline float gelu_tanh_grad(float g)
{
    float t = tanhf(GELU_K * (g + 0.044715f * g * g * g));
    return 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * 0.044715f * g * g);
}

static void swiglu_fwd(const zn_op *op)
{
    const zn_dtype dt = op->u.swiglu.dt;
    const int gelu = op->u.swiglu.act == 1;
    for (int64_t i = 0; i < op->u.swiglu.n; i++) {
        float g = ldf(op->u.swiglu.gate, dt, i), u = ldf(op->u.swiglu.up, dt, i);
        stf(op->u.swiglu.out, dt, i, gelu ? gelu_tanh(g) * u : g * sigm(g) * u);
    }
}

static void swiglu_bwd(const zn_op *op)
{
    const zn_dtype dt = op->u.swiglu.dt;
    for (int64_t i = 0; i < op->u.swiglu.n; i++) {
        float g = ldf(op->u.swiglu.gate, dt, i), u = ldf(op->u.swiglu.up, dt, i);
        float d = ldf(op->u.swiglu.dout, dt, i);
        if (op->u.swiglu.act == 1) {
            stf(op->u.swiglu.dgate, dt, i, d * u * gelu_tanh_grad(g));
            stf(op->u.swiglu.dup, dt, i, d * gelu_tanh(g));
            continue;
        }
        float sg = sigm(g);
        stf(op->u.swiglu.dgate, dt, i, d * u * sg * (1.0f + g * (1.0f - sg)));
        stf(op->u.swiglu.dup, dt, i, d * g * sg);
    }
}

static void dropout(const zn_op *op)
{
    const int64_t rows = op->u.drop.rows, cols = op->u.drop.cols;
    const zn_dtype xt = op->u.drop.x_dt, yt = op->u.drop.y_dt;
    const uint32_t thr = op->u.drop.thresh;
    const float sc = op->u.drop.scale;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const int64_t xi = r * op->u.drop.ldx + c, yi = r * op->u.drop.ldy + c;
            float v = thr == 0 || zn_draw24(op->u.drop.key, (uint64_t)(r * cols + c)) >= thr
                          ? ldf(op->u.drop.x, xt, xi) * sc
                          : 0.0f;
            if (op->u.drop.accumulate)
                v = ldf(op->u.drop.y, yt, yi) + v;
            stf(op->u.drop.y, yt, yi, v);
        }
}

static void ew_op(const zn_op *op)
{
    const int64_t n = op->u.ew.n;
    const zn_dtype at = op->u.ew.a_dt, yt = op->u.ew.y_dt;
    switch (op->kind) {
    case ZN_OPK_ADD:
        for (int64_t i = 0; i < n; i++)
            stf(op->u.ew.y, yt, i, ldf(op->u.ew.a, at, i) + ldf(op->u.ew.b, at, i));
        break;
    case ZN_OPK_AXPY:
        for (int64_t i = 0; i < n; i++)
            stf(op->u.ew.y, yt, i, ldf(op->u.ew.y, yt, i) + op->u.ew.alpha * ldf(op->u.ew.a, at, i));
        break;
    default: /* ZN_OPK_SCALE */
        for (int64_t i = 0; i < n; i++)
            stf(op->u.ew.y, yt, i, op->u.ew.alpha * ldf(op->u.ew.y, yt, i));
        break;
    }
}

static void bias_add(const zn_op *op)
{
    for (int64_t r = 0; r < op->u.bias.rows; r++)
        for (int64_t c = 0; c < op->u.bias.cols; c++) {
            int64_t o = r * op->u.bias.ld + c;
            stf(op->u.bias.y, op->u.bias.y_dt, o,
                ldf(op->u.bias.y, op->u.bias.y_dt, o) + ldf(op->u.bias.bias, op->u.bias.bias_dt, c));
        }
}

static void bias_grad(const zn_op *op)
{
    for (int64_t c = 0; c < op->u.bias.cols; c++) {
        double acc = 0;
        for (int64_t r = 0; r < op->u.bias.rows; r++)
            acc += ldf(op->u.bias.dy, op->u.bias.y_dt, r * op->u.bias.ld + c);
        op->u.bias.dbias[c] += (float)acc;
    }
}

static void xent_fwd(const zn_op *op)
{
    const int64_t cols = op->u.xent.cols, ld = op->u.xent.ld, v0 = op->u.xent.v0;
    const zn_dtype dt = op->u.xent.dt;
    for (int64_t r = 0; r < op->u.xent.rows; r++) {
        float m = op->u.xent.first ? -INFINITY : op->u.xent.run_max[r];
        float s = op->u.xent.first ? 0.0f : op->u.xent.run_sum[r];
        float cm = -INFINITY;
        for (int64_t j = 0; j < cols; j++) {
            float v = ldf(op->u.xent.logits, dt, r * ld + j);
            cm = v > cm ? v : cm;
        }
        const float nm = cm > m ? cm : m;
        double cs = 0;
        for (int64_t j = 0; j < cols; j++)
            cs += expf(ldf(op->u.xent.logits, dt, r * ld + j) - nm);
        s = (m == -INFINITY ? 0.0f : s * expf(m - nm)) + (float)cs;
        op->u.xent.run_max[r] = nm;
        op->u.xent.run_sum[r] = s;
        int64_t t = op->u.xent.targets[r];
        if (op->u.xent.first)
            op->u.xent.tgt[r] = 0.0f;
        if (t >= v0 && t < v0 + cols)
            op->u.xent.tgt[r] = ldf(op->u.xent.logits, dt, r * ld + (t - v0));
    }
}

static void xent_finish(const zn_op *op)
{
    for (int64_t r = 0; r < op->u.xent.rows; r++) {
        float lse = op->u.xent.cmax[r] + logf(op->u.xent.csum[r]);
        op->u.xent.lse_out[r] = lse;
        if (op->u.xent.loss)
            op->u.xent.loss[r] = op->u.xent.targets[r] < 0 ? 0.0f : lse - op->u.xent.ctgt[r];
    }
}

static void xent_bwd(const zn_op *op)
{
    const int64_t cols = op->u.xent.cols, v0 = op->u.xent.v0;
    const zn_dtype dt = op->u.xent.dt, ddt = op->u.xent.d_dt;
    const float gs = op->u.xent.grad_scale, cap = op->u.xent.softcap;
    for (int64_t r = 0; r < op->u.xent.rows; r++) {
        const int64_t t = op->u.xent.targets[r];
        const float lse = op->u.xent.lse[r];
        for (int64_t j = 0; j < cols; j++) {
            float g = 0.0f;
            if (t >= 0 && cap > 0.0f) { /* through c = cap tanh(x / cap) */
                float c = softcapf(ldf(op->u.xent.logits, dt, r * op->u.xent.ld + j), 1.0f, cap);
                float tc = c / cap;
                g = gs * (expf(c - lse) - (v0 + j == t ? 1.0f : 0.0f)) * (1.0f - tc * tc);
            } else if (t >= 0) {
                float p = expf(ldf(op->u.xent.logits, dt, r * op->u.xent.ld + j) - lse);
                g = gs * (p - (v0 + j == t ? 1.0f : 0.0f));
            }
            stf(op->u.xent.dlogits, ddt, r * op->u.xent.ld_d + j, g);
        }
    }
}

static void reduce(const zn_op *op)
{
    double acc = 0;
    for (int64_t i = 0; i < op->u.reduce.n; i++) {
        double v = ldf(op->u.reduce.x, op->u.reduce.dt, i);
        acc += op->u.reduce.square ? v * v : v;
    }
    if (op->u.reduce.accumulate)
        acc += *op->u.reduce.out;
    *op->u.reduce.out = (float)acc;
}

/* The CPU's own optimizer is the device step's reference: same formula,
 * same bits (zn_dev_adam). */
static int adam(const zn_op *op)
{
    return zn_adam_step(&op->u.adam.hp, op->u.adam.p, op->u.adam.m, op->u.adam.v, op->u.adam.g,
                        ZN_DTYPE_F32, op->u.adam.g_scale, op->u.adam.c, op->u.adam.c_dt,
                        (size_t)op->u.adam.n);
}

/* The CPU's step with compressed moments is the device step's reference
 * (zn_dev_adam_mom) in the same way. */
static int adam_mom(const zn_op *op)
{
    return zn_adam_step_mom(&op->u.adam.hp, op->u.adam.p, &op->u.adam.mv, op->u.adam.g,
                            ZN_DTYPE_F32, op->u.adam.g_scale, op->u.adam.c, op->u.adam.c_dt,
                            (size_t)op->u.adam.n);
}

/* and the bf16 master's (zn_dev_adam_sr) */
static int adam_sr(const zn_op *op)
{
    return zn_adam_step_sr_spans(&op->u.adam.hp, op->u.adam.p16, &op->u.adam.mv, op->u.adam.g,
                                 ZN_DTYPE_F32, op->u.adam.g_scale, op->u.adam.sr_seed,
                                 op->u.adam.sr_spans, (size_t)op->u.adam.sr_nspans,
                                 (size_t)op->u.adam.n);
}

static void norm_chunks(const zn_op *op)
{
    const int64_t C = (int64_t)ZN_GRAD_NORM_CHUNK, n = op->u.normc.n;
    const int64_t nc = (n + C - 1) / C;
    for (int64_t c = 0; c < nc; c++) {
        int64_t len = n - c * C < C ? n - c * C : C;
        op->u.normc.out[c] = zn_grad_norm_chunk(op->u.normc.x + c * C, (size_t)len);
    }
}

/* The mixture-of-experts rows (the C reference of k_rows_*). */
static void rows_op(const zn_op *op)
{
    const int64_t n = op->u.rows.n, dim = op->u.rows.dim;
    const float *w = op->u.rows.w;
    for (int64_t r = 0; r < n; r++) {
        const int64_t t = op->u.rows.idx[r];
        const float wr = w ? w[r] : 1.0f;
        if (op->u.rows.mode == 0) {
            for (int64_t c = 0; c < dim; c++)
                stf(op->u.rows.y, op->u.rows.y_dt, r * dim + c,
                    wr * ldf(op->u.rows.x, op->u.rows.x_dt, t * dim + c));
        } else if (op->u.rows.mode == 1) {
            float *y = op->u.rows.y32 + t * dim;
            for (int64_t c = 0; c < dim; c++)
                y[c] += wr * ldf(op->u.rows.x, op->u.rows.x_dt, r * dim + c);
        } else {
            float acc = 0.0f;
            for (int64_t c = 0; c < dim; c++)
                acc += ldf(op->u.rows.a, op->u.rows.a_dt, t * dim + c) *
                       ldf(op->u.rows.x, op->u.rows.x_dt, r * dim + c);
            op->u.rows.out[r] = acc;
        }
    }
}

int zn_host_run_op(const zn_op *op, float **scratch, size_t *scratch_len)
{
    switch (op->kind) {
    case ZN_OPK_MEMSET:
        memset(op->u.memset.dst, op->u.memset.value, op->u.memset.bytes);
        return 0;
    case ZN_OPK_FILL:
        for (int64_t i = 0; i < op->u.fill.n; i++)
            stf(op->u.fill.x, op->u.fill.dt, i, op->u.fill.value);
        return 0;
    case ZN_OPK_GEMM:
        return run_gemm(op, scratch, scratch_len);
    case ZN_OPK_EMB_FWD: emb_fwd(op); return 0;
    case ZN_OPK_EMB_BWD: emb_bwd(op); return 0;
    case ZN_OPK_RMS_FWD: rms_fwd(op); return 0;
    case ZN_OPK_RMS_BWD:
        if (op->u.rms_bwd.dw)
            rms_bwd_dw(op);
        rms_bwd(op);
        return 0;
    case ZN_OPK_ROPE: rope(op); return 0;
    case ZN_OPK_SOFTMAX_FWD: softmax_fwd(op); return 0;
    case ZN_OPK_SOFTMAX_BWD: softmax_bwd(op); return 0;
    case ZN_OPK_SWIGLU_FWD: swiglu_fwd(op); return 0;
    case ZN_OPK_SWIGLU_BWD: swiglu_bwd(op); return 0;
    case ZN_OPK_ADD:
    case ZN_OPK_AXPY:
    case ZN_OPK_SCALE: ew_op(op); return 0;
    case ZN_OPK_BIAS_ADD: bias_add(op); return 0;
    case ZN_OPK_BIAS_GRAD: bias_grad(op); return 0;
    case ZN_OPK_CAST: /* the CPU's array conversion: same rounding, threaded */
        return zn_convert(op->u.cast.y, op->u.cast.y_dt, op->u.cast.x, op->u.cast.x_dt,
                          (size_t)op->u.cast.n);
    case ZN_OPK_XENT_FWD: xent_fwd(op); return 0;
    case ZN_OPK_XENT_FINISH: xent_finish(op); return 0;
    case ZN_OPK_XENT_BWD: xent_bwd(op); return 0;
    case ZN_OPK_REDUCE: reduce(op); return 0;
    case ZN_OPK_DROPOUT: dropout(op); return 0;
    case ZN_OPK_ADAM: return adam(op);
    case ZN_OPK_ADAM_MOM: return adam_mom(op);
    case ZN_OPK_ADAM_SR: return adam_sr(op);
    case ZN_OPK_NORM_CHUNKS: norm_chunks(op); return 0;
    case ZN_OPK_FLASH_FWD: return flash_fwd(op, scratch, scratch_len);
    case ZN_OPK_FLASH_BWD: return flash_bwd(op, scratch, scratch_len);
    case ZN_OPK_SOFTCAP_FWD:
    case ZN_OPK_SOFTCAP_BWD: softcap_op(op); return 0;
    case ZN_OPK_ROWS: rows_op(op); return 0;
    default:
        return zn_set_error(ZN_EINTERNAL, "host kernels: op kind %d is not a kernel",
                            (int)op->kind);
    }
}
