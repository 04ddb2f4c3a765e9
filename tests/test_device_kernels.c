/* Every Llama kernel of the device interface, on every backend present
 * (host always, CUDA when a GPU answers), in f32 and bf16: forward against
 * a double-precision reference written here, backward against central
 * finite differences of that reference. Outputs are pre-filled with a NaN
 * pattern so unwritten elements show; "+=" outputs start from a base value
 * that is subtracted afterwards. */
#include <float.h>
#include <stdbool.h>
#include <math.h>

#include "zt.h"
#include "zinc/device.h"
#include "zinc/optim.h"
#include "gpu/gpu-impl.h"

static zn_dev *D;
static zn_stream *S;
static const char *BK;

#define DEV_OK(call)                                                          \
    do {                                                                      \
        int rc_ = (call);                                                     \
        zt_checks++;                                                          \
        if (rc_)                                                              \
            ZT_FAIL_AT("[%s] %s -> %d: %s", BK, #call, rc_, zn_last_error()); \
    } while (0)

static double urand(uint64_t seed, uint64_t i)   /* [-1, 1) */
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* The value a device of type dt holds for x. */
static double q(double x, zn_dtype dt)
{
    float f = (float)x;
    return dt == ZN_DTYPE_F32 ? f : zn_bf16_widen(zn_bf16_round(f));
}

static double *rnd(uint64_t seed, size_t n, double scale, zn_dtype dt)
{
    double *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = q(scale * urand(seed, i), dt);
    return x;
}

static void *dev_up(const double *x, size_t n, zn_dtype dt)
{
    size_t es = zn_dtype_size(dt);
    void *h = malloc(n * es), *d = NULL;
    for (size_t i = 0; i < n; i++) {
        if (dt == ZN_DTYPE_F32)
            ((float *)h)[i] = (float)x[i];
        else
            ((uint16_t *)h)[i] = zn_bf16_round((float)x[i]);
    }
    DEV_OK(zn_dev_alloc(D, n * es + 4, "test", &d));
    DEV_OK(zn_dev_copy_h2d(D, S, d, h, n * es));
    DEV_OK(zn_dev_stream_sync(D, S));
    free(h);
    return d;
}

static void *dev_poison(size_t n, zn_dtype dt)
{
    void *d = NULL;
    DEV_OK(zn_dev_alloc(D, n * zn_dtype_size(dt) + 4, "out", &d));
    DEV_OK(zn_dev_memset(D, S, d, 0xff, n * zn_dtype_size(dt)));   /* NaN in both types */
    return d;
}

static int32_t *dev_i32(const int32_t *x, size_t n)
{
    void *d = NULL;
    DEV_OK(zn_dev_alloc(D, n * 4, "i32", &d));
    DEV_OK(zn_dev_copy_h2d(D, S, d, x, n * 4));
    DEV_OK(zn_dev_stream_sync(D, S));
    return d;
}

static double *dev_down(const void *d, size_t n, zn_dtype dt)
{
    size_t es = zn_dtype_size(dt);
    void *h = malloc(n * es);
    double *x = malloc(n * sizeof *x);
    DEV_OK(zn_dev_copy_d2h(D, S, h, d, n * es));
    DEV_OK(zn_dev_stream_sync(D, S));
    for (size_t i = 0; i < n; i++)
        x[i] = dt == ZN_DTYPE_F32 ? ((float *)h)[i] : zn_bf16_widen(((uint16_t *)h)[i]);
    free(h);
    return x;
}

/* max |got - ref| / max |ref|; NaN counts as infinitely wrong. */
static double relerr(const double *got, const double *ref, size_t n)
{
    double e = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - ref[i]);
        if (!(d <= e))
            e = isnan(d) ? INFINITY : d;
        if (fabs(ref[i]) > m)
            m = fabs(ref[i]);
    }
    return e / m;
}

static double tol_fwd(zn_dtype dt)
{
    return dt == ZN_DTYPE_F32 ? 1e-5 : 1e-2;
}

static double tol_bwd(zn_dtype dt)
{
    return dt == ZN_DTYPE_F32 ? 1e-4 : 3e-2;
}

#define CMP(what, dt, got, ref, n, tol)                                             \
    do {                                                                            \
        double e_ = relerr((got), (ref), (n));                                      \
        ZT_CHECK_MSG(e_ <= (tol), "[%s] %s (%s): rel err %.3g > %g", BK, what,      \
                     zn_dtype_name(dt), e_, (double)(tol));                         \
    } while (0)

/* Central differences of L(x) = sum_i y_i R_i for a double forward f. */
typedef void (*fwd_fn)(const double *x, double *y, const void *ctx);

static void fd_grad(fwd_fn f, const void *ctx, double *x, size_t nx, size_t ny, const double *R,
                    double *g)
{
    double *y = malloc(ny * sizeof *y);
    const double h = 1e-4;
    for (size_t i = 0; i < nx; i++) {
        double x0 = x[i], lp = 0, lm = 0;
        x[i] = x0 + h;
        f(x, y, ctx);
        for (size_t j = 0; j < ny; j++)
            lp += y[j] * R[j];
        x[i] = x0 - h;
        f(x, y, ctx);
        for (size_t j = 0; j < ny; j++)
            lm += y[j] * R[j];
        x[i] = x0;
        g[i] = (lp - lm) / (2 * h);
    }
    free(y);
}

static void dfree(void *p)
{
    zn_dev_free(D, p);
}

/* ---- embedding ----------------------------------------------------------*/
typedef struct { const int32_t *ids; int64_t nt, vocab, dim; } emb_ctx;

static void emb_ref(const double *table, double *out, const void *c)
{
    const emb_ctx *e = c;
    for (int64_t t = 0; t < e->nt; t++)
        for (int64_t j = 0; j < e->dim; j++)
            out[t * e->dim + j] = (e->ids[t] >= 0 && e->ids[t] < e->vocab)
                                      ? table[e->ids[t] * e->dim + j] : 0.0;
}

static void test_embedding(zn_dtype dt)
{
    static const int32_t ids[] = { 3, 0, 9, 3, -1, 12, 9, 3, 1 };   /* repeats, out of range */
    emb_ctx c = { ids, 9, 10, 37 };
    size_t nt = (size_t)(c.vocab * c.dim), no = (size_t)(c.nt * c.dim);
    double *table = rnd(1, nt, 1.0, dt), *R = rnd(2, no, 1.0, dt), *ref = malloc(no * 8);
    int32_t *dids = dev_i32(ids, 9);
    void *dtab = dev_up(table, nt, dt), *dout = dev_poison(no, dt);
    DEV_OK(zn_dev_embedding_fwd(D, S, dids, c.nt, dtab, dt, c.vocab, c.dim, dout, dt));
    double *got = dev_down(dout, no, dt);
    emb_ref(table, ref, &c);
    CMP("embedding_fwd", dt, got, ref, no, 0.0);
    /* backward: dtable starts at a base value, += the scatter. */
    double *base = rnd(3, nt, 1.0, ZN_DTYPE_F32), *g = malloc(nt * 8);
    void *dR = dev_up(R, no, dt), *dtg = dev_up(base, nt, ZN_DTYPE_F32);
    DEV_OK(zn_dev_embedding_bwd(D, S, dids, c.nt, dR, dt, c.vocab, c.dim, dtg));
    double *gg = dev_down(dtg, nt, ZN_DTYPE_F32);
    for (size_t i = 0; i < nt; i++)
        gg[i] -= base[i];
    fd_grad(emb_ref, &c, table, nt, no, R, g);
    CMP("embedding_bwd", dt, gg, g, nt, 1e-5);

    /* rows [3, 8) of the table (a vocabulary part): tokens with ids there
     * get their rows, every other out row keeps what it held; the scatter
     * adds into those five rows only */
    const int64_t r0 = 3, nr = 5;
    void *dpart = dev_up(table + r0 * c.dim, (size_t)(nr * c.dim), dt);
    double *held = rnd(4, no, 1.0, dt), *want = malloc(no * 8);
    void *dheld = dev_up(held, no, dt);
    DEV_OK(zn_dev_embedding_rows_fwd(D, S, dids, c.nt, dpart, dt, r0, nr, c.dim, dheld, dt));
    double *gotp = dev_down(dheld, no, dt);
    for (int64_t t = 0; t < c.nt; t++)
        for (int64_t j = 0; j < c.dim; j++)
            want[t * c.dim + j] = ids[t] >= r0 && ids[t] < r0 + nr
                                      ? table[ids[t] * c.dim + j] : held[t * c.dim + j];
    CMP("embedding_rows_fwd", dt, gotp, want, no, 0.0);
    void *dgp = dev_up(base + r0 * c.dim, (size_t)(nr * c.dim), ZN_DTYPE_F32);
    DEV_OK(zn_dev_embedding_rows_bwd(D, S, dids, c.nt, dR, dt, r0, nr, c.dim, dgp));
    double *ggp = dev_down(dgp, (size_t)(nr * c.dim), ZN_DTYPE_F32);
    for (int64_t i = 0; i < nr * c.dim; i++)
        ggp[i] -= base[r0 * c.dim + i];
    CMP("embedding_rows_bwd", dt, ggp, g + r0 * c.dim, (size_t)(nr * c.dim), 1e-5);
    /* the same rows times a scale (Gemma's sqrt(hidden)): out and the
     * scatter both scaled */
    const float sc = 7.5f;
    void *dsc = dev_up(held, no, dt); /* an id outside the table leaves its row */
    DEV_OK(zn_dev_embedding_scaled_fwd(D, S, dids, c.nt, dtab, dt, 0, c.vocab, c.dim, dsc, dt,
                                       sc));
    double *gsc = dev_down(dsc, no, dt), *wsc = malloc(no * 8);
    for (int64_t t = 0; t < c.nt; t++)
        for (int64_t j = 0; j < c.dim; j++)
            wsc[t * c.dim + j] = ids[t] >= 0 && ids[t] < c.vocab ? ref[t * c.dim + j] * sc
                                                                 : held[t * c.dim + j];
    CMP("embedding_scaled_fwd", dt, gsc, wsc, no, tol_fwd(dt));
    void *dgs = dev_up(base, nt, ZN_DTYPE_F32);
    DEV_OK(zn_dev_embedding_scaled_bwd(D, S, dids, c.nt, dR, dt, 0, c.vocab, c.dim, dgs, sc));
    double *ggs = dev_down(dgs, nt, ZN_DTYPE_F32);
    for (size_t i = 0; i < nt; i++)
        ggs[i] = (ggs[i] - base[i]) / sc;
    CMP("embedding_scaled_bwd", dt, ggs, g, nt, 1e-5);
    free(gsc), free(wsc), free(ggs);
    dfree(dsc), dfree(dgs);
    free(held), free(want), free(gotp), free(ggp);
    dfree(dpart), dfree(dheld), dfree(dgp);

    free(table), free(R), free(ref), free(got), free(base), free(g), free(gg);
    dfree(dids), dfree(dtab), dfree(dout), dfree(dR), dfree(dtg);
}

/* ---- RMSNorm --------------------------------------------------------------*/
typedef struct { int64_t rows, dim; double eps; const double *w, *x; int wrt_w; double off; } rms_ctx;

static void rms_ref_full(const double *x, const double *w, double *y, double *rstd,
                         const rms_ctx *c)
{
    for (int64_t r = 0; r < c->rows; r++) {
        double ss = 0;
        for (int64_t j = 0; j < c->dim; j++)
            ss += x[r * c->dim + j] * x[r * c->dim + j];
        double rs = 1.0 / sqrt(ss / (double)c->dim + c->eps);
        if (rstd)
            rstd[r] = rs;
        for (int64_t j = 0; j < c->dim; j++)
            y[r * c->dim + j] = (w[j] + c->off) * x[r * c->dim + j] * rs;
    }
}

static void rms_ref(const double *in, double *y, const void *cv)
{
    const rms_ctx *c = cv;
    if (c->wrt_w)
        rms_ref_full(c->x, in, y, NULL, c);
    else
        rms_ref_full(in, c->w, y, NULL, c);
}

static void test_rmsnorm(zn_dtype dt)
{
    rms_ctx c = { 5, 300, 1e-5, NULL, NULL, 0, 0.0 };
    size_t n = (size_t)(c.rows * c.dim);
    double *x = rnd(10, n, 2.0, dt), *w = rnd(11, (size_t)c.dim, 1.0, dt);
    double *R = rnd(12, n, 1.0, dt), *y = malloc(n * 8), *rstd = malloc(5 * 8);
    c.w = w;
    c.x = x;
    rms_ref_full(x, w, y, rstd, &c);
    void *dx = dev_up(x, n, dt), *dw = dev_up(w, (size_t)c.dim, dt), *dy = dev_poison(n, dt);
    float *drs = dev_poison(5, ZN_DTYPE_F32);
    DEV_OK(zn_dev_rmsnorm_fwd(D, S, dx, dt, dw, dt, dy, dt, drs, c.rows, c.dim, (float)c.eps));
    double *gy = dev_down(dy, n, dt), *grs = dev_down(drs, 5, ZN_DTYPE_F32);
    CMP("rmsnorm_fwd y", dt, gy, y, n, tol_fwd(dt));
    CMP("rmsnorm_fwd rstd", dt, grs, rstd, 5, 1e-5);
    /* backward: dx overwrites, dw += */
    double *gx = malloc(n * 8), *gw = malloc((size_t)c.dim * 8);
    fd_grad(rms_ref, &c, x, n, n, R, gx);
    c.wrt_w = 1;
    fd_grad(rms_ref, &c, w, (size_t)c.dim, n, R, gw);
    double *base = rnd(13, (size_t)c.dim, 1.0, ZN_DTYPE_F32);
    void *dR = dev_up(R, n, dt), *ddx = dev_poison(n, dt);
    float *ddw = dev_up(base, (size_t)c.dim, ZN_DTYPE_F32);
    DEV_OK(zn_dev_rmsnorm_bwd(D, S, dx, dt, dw, dt, drs, dR, dt, ddx, dt, ddw, c.rows, c.dim));
    double *hdx = dev_down(ddx, n, dt), *hdw = dev_down(ddw, (size_t)c.dim, ZN_DTYPE_F32);
    for (int64_t j = 0; j < c.dim; j++)
        hdw[j] -= base[j];
    CMP("rmsnorm_bwd dx", dt, hdx, gx, n, tol_bwd(dt));
    CMP("rmsnorm_bwd dw", dt, hdw, gw, (size_t)c.dim, tol_bwd(dt));
    /* dx may alias dy: same result in place. */
    DEV_OK(zn_dev_rmsnorm_bwd(D, S, dx, dt, dw, dt, drs, dR, dt, dR, dt, NULL, c.rows, c.dim));
    double *hin = dev_down(dR, n, dt);
    CMP("rmsnorm_bwd dx in place", dt, hin, hdx, n, 0.0);
    free(x), free(w), free(R), free(y), free(rstd), free(gy), free(grs), free(gx), free(gw);
    free(base), free(hdx), free(hdw), free(hin);
    dfree(dx), dfree(dw), dfree(dy), dfree(drs), dfree(dR), dfree(ddx), dfree(ddw);
}

/* The first w of each of `rows` rows of ld into out (rows of w); 1 when
 * every element after them in each row still holds 7 (untouched). */
static int gather_rows(const double *in, int64_t rows, int64_t ld, int64_t w, double *out)
{
    int pad_ok = 1;
    for (int64_t t = 0; t < rows; t++)
        for (int64_t j = 0; j < ld; j++) {
            if (j < w)
                out[t * w + j] = in[t * ld + j];
            else
                pad_ok &= in[t * ld + j] == 7.0;
        }
    return pad_ok;
}

/* The per-head norm (Qwen3's q/k norm) on groups inside padded rows: the
 * same arithmetic as the plain norm on the groups gathered, the padding
 * between and after the groups untouched, dx in place over dy. */
static void test_rmsnorm_heads(zn_dtype dt, float off)
{
    const int64_t T = 4, nh = 3, hd = 64, ldx = nh * hd + 16, ldd = nh * hd + 40;
    rms_ctx c = { T * nh, hd, 1e-6, NULL, NULL, 0, off };
    size_t n = (size_t)(T * nh * hd), nx = (size_t)(T * ldx), nd = (size_t)(T * ldd);
    double *x = rnd(20, n, 2.0, dt), *w = rnd(21, (size_t)hd, 1.0, dt), *R = rnd(22, n, 1.0, dt);
    double *y = malloc(n * 8), *rstd = malloc((size_t)(T * nh) * 8);
    c.w = w;
    c.x = x;
    rms_ref_full(x, w, y, rstd, &c);
    /* strided copies: every element outside the groups holds 7 */
    double *xs = malloc(nx * 8), *Rs = malloc(nd * 8), *pad = malloc(nd * 8);
    for (size_t i = 0; i < nx; i++)
        xs[i] = 7.0;
    for (size_t i = 0; i < nd; i++)
        Rs[i] = pad[i] = 7.0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < nh * hd; j++) {
            xs[t * ldx + j] = x[t * nh * hd + j];
            Rs[t * ldd + j] = R[t * nh * hd + j];
        }
    void *dx = dev_up(xs, nx, dt), *dw = dev_up(w, (size_t)hd, dt), *dy = dev_up(pad, nd, dt);
    float *drs = dev_poison((size_t)(T * nh), ZN_DTYPE_F32);
    DEV_OK(zn_dev_rmsnorm_heads_fwd(D, S, dx, dt, ldx, dw, dt, dy, dt, ldd, drs, T, nh, hd,
                                    (float)c.eps, off));
    double *gy = dev_down(dy, nd, dt), *grs = dev_down(drs, (size_t)(T * nh), ZN_DTYPE_F32);
    double *gyc = malloc(n * 8);
    ZT_CHECK(gather_rows(gy, T, ldd, nh * hd, gyc));
    CMP("rmsnorm_heads_fwd y", dt, gyc, y, n, tol_fwd(dt));
    CMP("rmsnorm_heads_fwd rstd", dt, grs, rstd, (size_t)(T * nh), 1e-5);
    double *gx = malloc(n * 8), *gw = malloc((size_t)hd * 8);
    fd_grad(rms_ref, &c, x, n, n, R, gx);
    c.wrt_w = 1;
    fd_grad(rms_ref, &c, w, (size_t)hd, n, R, gw);
    double *base = rnd(23, (size_t)hd, 1.0, ZN_DTYPE_F32);
    void *dR = dev_up(Rs, nd, dt);
    float *ddw = dev_up(base, (size_t)hd, ZN_DTYPE_F32);
    DEV_OK(zn_dev_rmsnorm_heads_bwd(D, S, dx, dt, ldx, dw, dt, drs, dR, dt, dR, dt, ldd, ddw, T,
                                    nh, hd, off));
    double *hd_ = dev_down(dR, nd, dt), *hdw = dev_down(ddw, (size_t)hd, ZN_DTYPE_F32);
    double *hdx = malloc(n * 8);
    ZT_CHECK(gather_rows(hd_, T, ldd, nh * hd, hdx));
    for (int64_t j = 0; j < hd; j++)
        hdw[j] -= base[j];
    CMP("rmsnorm_heads_bwd dx", dt, hdx, gx, n, tol_bwd(dt));
    CMP("rmsnorm_heads_bwd dw", dt, hdw, gw, (size_t)hd, tol_bwd(dt));
    free(x), free(w), free(R), free(y), free(rstd), free(xs), free(Rs), free(pad), free(gy);
    free(grs), free(gyc), free(gx), free(gw), free(base), free(hd_), free(hdw), free(hdx);
    dfree(dx), dfree(dw), dfree(dy), dfree(drs), dfree(dR), dfree(ddw);
}

/* ---- RoPE --------------------------------------------------------------------*/
typedef struct { int64_t tokens, heads, hd, ld; const int32_t *pos; const float *inv; } rope_ctx;

static void rope_ref(const double *x, double *y, const void *cv)
{
    const rope_ctx *c = cv;
    int64_t half = c->hd / 2;
    memcpy(y, x, (size_t)(c->tokens * c->ld) * sizeof *y);
    for (int64_t t = 0; t < c->tokens; t++)
        for (int64_t h = 0; h < c->heads; h++)
            for (int64_t i = 0; i < half; i++) {
                double a = (double)((float)c->pos[t] * c->inv[i]);  /* fp32 angle, as HF */
                int64_t b = t * c->ld + h * c->hd;
                double x1 = x[b + i], x2 = x[b + i + half];
                y[b + i] = x1 * cos(a) - x2 * sin(a);
                y[b + i + half] = x2 * cos(a) + x1 * sin(a);
            }
}

static void test_rope(zn_dtype dt)
{
    static const int32_t pos[] = { 0, 1, 5, 17, 100, 3 };
    float inv[8];
    zn_rope_scaling sc = { 8.0, 1.0, 4.0, 64.0 };
    zn_rope_inv_freq(inv, 16, 10000.0, &sc);
    rope_ctx c = { 6, 3, 16, 3 * 16 + 5, pos, inv };   /* rows padded by 5 */
    size_t n = (size_t)(c.tokens * c.ld);
    double *x = rnd(20, n, 1.0, dt), *y = malloc(n * 8), *R = rnd(21, n, 1.0, dt);
    for (int64_t t = 0; t < c.tokens; t++)       /* the padding must stay as it is */
        for (int64_t j = c.heads * c.hd; j < c.ld; j++)
            R[t * c.ld + j] = x[t * c.ld + j] = 0.625;
    rope_ref(x, y, &c);
    void *dx = dev_up(x, n, dt), *dinv = NULL;
    int32_t *dpos = dev_i32(pos, 6);
    DEV_OK(zn_dev_alloc(D, sizeof inv, "inv", &dinv));
    DEV_OK(zn_dev_copy_h2d(D, S, dinv, inv, sizeof inv));
    DEV_OK(zn_dev_rope_fwd(D, S, dx, dt, c.tokens, c.heads, c.hd, c.ld, dpos, dinv));
    double *got = dev_down(dx, n, dt);
    CMP("rope_fwd", dt, got, y, n, tol_fwd(dt));
    double *g = malloc(n * 8);
    fd_grad(rope_ref, &c, x, n, n, R, g);
    for (int64_t t = 0; t < c.tokens; t++)    /* d(padding) = R there: untouched */
        for (int64_t j = c.heads * c.hd; j < c.ld; j++)
            g[t * c.ld + j] = 0.625;
    void *dR = dev_up(R, n, dt);
    DEV_OK(zn_dev_rope_bwd(D, S, dR, dt, c.tokens, c.heads, c.hd, c.ld, dpos, dinv));
    double *gb = dev_down(dR, n, dt);
    CMP("rope_bwd", dt, gb, g, n, tol_bwd(dt));
    free(x), free(y), free(R), free(got), free(g), free(gb);
    dfree(dx), dfree(dinv), dfree(dpos), dfree(dR);
}

/* zn_rope_inv_freq against HF's formulas written out in double. */
static void test_inv_freq(void)
{
    const int64_t hd = 128;
    const double theta = 500000.0;
    zn_rope_scaling sc = { 8.0, 1.0, 4.0, 8192.0 };
    float got[64], plain[64];
    zn_rope_inv_freq(plain, hd, theta, NULL);
    zn_rope_inv_freq(got, hd, theta, &sc);
    double worst = 0, worstp = 0;
    const double pi = 3.14159265358979323846;
    for (int64_t i = 0; i < hd / 2; i++) {
        double f = pow(theta, -(double)(2 * i) / (double)hd);
        double wl = 2 * pi / f, lo = 8192.0 / 1.0, hi = 8192.0 / 4.0, v;
        if (wl < hi)
            v = f;
        else if (wl > lo)
            v = f / 8.0;
        else {
            double s = (8192.0 / wl - 1.0) / (4.0 - 1.0);
            v = (1 - s) * f / 8.0 + s * f;
        }
        worstp = fmax(worstp, fabs(plain[i] - f) / f);
        worst = fmax(worst, fabs(got[i] - v) / v);
    }
    ZT_CHECK_MSG(worstp < 1e-5 && worst < 1e-5, "rope inv_freq: rel err %.3g plain, %.3g llama3",
                 worstp, worst);
}

/* ---- causal softmax ----------------------------------------------------------*/
typedef struct { int64_t batch, rows, cols, qoff; double scale; const int32_t *ks; } sm_ctx;

static void sm_ref(const double *s, double *p, const void *cv)
{
    const sm_ctx *c = cv;
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t r = 0; r < c->rows; r++) {
            const double *x = s + (b * c->rows + r) * c->cols;
            double *y = p + (b * c->rows + r) * c->cols;
            int64_t lim = c->qoff + r + 1 < c->cols ? c->qoff + r + 1 : c->cols;
            int64_t lo = c->ks ? c->ks[r] : 0;   /* first key of row r's document */
            double mx = -INFINITY, sum = 0;
            for (int64_t j = lo; j < lim; j++)
                mx = fmax(mx, c->scale * x[j]);
            for (int64_t j = lo; j < lim; j++)
                sum += exp(c->scale * x[j] - mx);
            for (int64_t j = 0; j < c->cols; j++)
                y[j] = j >= lo && j < lim ? exp(c->scale * x[j] - mx) / sum : 0.0;
        }
}

static void test_softmax(zn_dtype dt)
{
    /* packed documents: rows 0-2 one document, 3-7 a second, 8 a third of
     * one token (only its diagonal), 9-10 a fourth; and with a q_offset */
    static const int32_t docs[] = { 0, 0, 0, 3, 3, 3, 3, 3, 8, 9, 9 };
    static const int32_t docs_off[] = { 0, 4, 4, 6 };
    static const sm_ctx cases[] = {
        { 2, 5, 7, 2, 0.3, NULL },  { 3, 6, 6, 0, 0.125, NULL }, { 1, 3, 300, 297, 0.7, NULL },
        { 2, 11, 11, 0, 0.4, docs }, { 3, 4, 9, 5, 0.25, docs_off },
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const sm_ctx *c = &cases[k];
        size_t n = (size_t)(c->batch * c->rows * c->cols);
        double *s = rnd(30 + k, n, 3.0, dt), *p = malloc(n * 8), *R = rnd(40 + k, n, 1.0, dt);
        sm_ref(s, p, c);
        void *ds = dev_up(s, n, dt), *dp = dev_poison(n, dt);
        int32_t *dks = c->ks ? dev_i32(c->ks, (size_t)c->rows) : NULL;
        DEV_OK(zn_dev_softmax_causal_fwd(D, S, ds, dt, dp, dt, c->batch, c->rows, c->cols,
                                         c->qoff, dks, (float)c->scale));
        double *got = dev_down(dp, n, dt);
        CMP("softmax_causal_fwd", dt, got, p, n, tol_fwd(dt));
        double *g = malloc(n * 8);
        fd_grad(sm_ref, c, s, n, n, R, g);
        void *dR = dev_up(R, n, dt);
        /* dS may alias dP: done in place on R */
        DEV_OK(zn_dev_softmax_causal_bwd(D, S, dp, dt, dR, dt, dR, dt, c->batch, c->rows,
                                         c->cols, c->qoff, dks, (float)c->scale));
        double *gb = dev_down(dR, n, dt);
        CMP("softmax_causal_bwd", dt, gb, g, n, tol_bwd(dt));
        /* in place forward (P aliases S) */
        DEV_OK(zn_dev_softmax_causal_fwd(D, S, ds, dt, ds, dt, c->batch, c->rows, c->cols,
                                         c->qoff, dks, (float)c->scale));
        double *gi = dev_down(ds, n, dt);
        CMP("softmax_causal_fwd in place", dt, gi, got, n, 0.0);
        free(s), free(p), free(R), free(got), free(g), free(gb), free(gi);
        dfree(ds), dfree(dp), dfree(dR);
        if (dks)
            dfree(dks);
    }
}

/* ---- SwiGLU -------------------------------------------------------------------*/
typedef struct { int64_t n; const double *other; int wrt_up, gelu; } sw_ctx;

static void sw_ref(const double *in, double *y, const void *cv)
{
    const sw_ctx *c = cv;
    for (int64_t i = 0; i < c->n; i++) {
        double g = c->wrt_up ? c->other[i] : in[i], u = c->wrt_up ? in[i] : c->other[i];
        /* GeGLU's gate: the tanh GELU as transformers' gelu_pytorch_tanh */
        double a = c->gelu ? 0.5 * g * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (g + 0.044715 * g * g * g)))
                           : g / (1 + exp(-g));
        y[i] = a * u;
    }
}

/* SwiGLU (gelu 0) and GeGLU (gelu 1) against their float64 forms. */
static void test_swiglu(zn_dtype dt, int gelu)
{
    const int64_t n = 301;
    const char *fw = gelu ? "geglu_fwd" : "swiglu_fwd";
    double *g = rnd(50, n, 4.0, dt), *u = rnd(51, n, 2.0, dt), *R = rnd(52, n, 1.0, dt);
    double *y = malloc(n * 8), *gg = malloc(n * 8), *gu = malloc(n * 8);
    sw_ctx c = { n, u, 0, gelu };
    sw_ref(g, y, &c);
    void *dg = dev_up(g, n, dt), *du = dev_up(u, n, dt), *dout = dev_poison(n, dt);
    DEV_OK(gelu ? zn_dev_geglu_fwd(D, S, dg, du, dout, dt, n)
                : zn_dev_swiglu_fwd(D, S, dg, du, dout, dt, n));
    double *got = dev_down(dout, n, dt);
    CMP(fw, dt, got, y, n, tol_fwd(dt));
    fd_grad(sw_ref, &c, g, n, n, R, gg);
    sw_ctx cu = { n, g, 1, gelu };
    fd_grad(sw_ref, &cu, u, n, n, R, gu);
    void *dR = dev_up(R, n, dt), *ddg = dev_poison(n, dt), *ddu = dev_poison(n, dt);
    DEV_OK(gelu ? zn_dev_geglu_bwd(D, S, dg, du, dR, ddg, ddu, dt, n)
                : zn_dev_swiglu_bwd(D, S, dg, du, dR, ddg, ddu, dt, n));
    double *hg = dev_down(ddg, n, dt), *hu = dev_down(ddu, n, dt);
    CMP(gelu ? "geglu_bwd dgate" : "swiglu_bwd dgate", dt, hg, gg, n, tol_bwd(dt));
    CMP(gelu ? "geglu_bwd dup" : "swiglu_bwd dup", dt, hu, gu, n, tol_bwd(dt));
    free(g), free(u), free(R), free(y), free(gg), free(gu), free(got), free(hg), free(hu);
    dfree(dg), dfree(du), dfree(dout), dfree(dR), dfree(ddg), dfree(ddu);
}

/* ---- dropout ------------------------------------------------------------------*/
/* The mask as device.h documents it, written out again here. */
static int keep_ref(uint64_t key, uint64_t i, double p)
{
    uint64_t z = key + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (z >> 40) >= (uint64_t)llround(p * 16777216.0);
}

static void test_dropout(zn_dtype dt)
{
    const int64_t rows = 67, cols = 53, ldx = 60, ldy = 57, nx = rows * ldx, ny = rows * ldy;
    const double p = 0.3;
    const uint64_t key = 0x1234567890ABCDEFull;
    const float sc = (float)(1.0 / (1.0 - p));
    double *x = rnd(70, (size_t)nx, 2.0, dt), *y0 = rnd(71, (size_t)ny, 1.0, ZN_DTYPE_F32);
    void *dx = dev_up(x, (size_t)nx, dt), *dy = dev_up(y0, (size_t)ny, dt);
    void *dacc = dev_up(y0, (size_t)ny, ZN_DTYPE_F32);
    DEV_OK(zn_dev_dropout(D, S, dx, dt, ldx, dy, dt, ldy, rows, cols, p, key, 0));
    /* the backward's use: an fp32 accumulator += the same mask of x */
    DEV_OK(zn_dev_dropout(D, S, dx, dt, ldx, dacc, ZN_DTYPE_F32, ldy, rows, cols, p, key, 1));
    double *got = dev_down(dy, (size_t)ny, dt), *acc = dev_down(dacc, (size_t)ny, ZN_DTYPE_F32);
    int64_t kept = 0, bad = 0, bad_acc = 0, touched = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ldy; c++) {
            int64_t yi = r * ldy + c;
            if (c >= cols) { /* the ld padding is not written */
                touched += got[yi] != q(y0[yi], dt) || acc[yi] != q(y0[yi], ZN_DTYPE_F32);
                continue;
            }
            int k = keep_ref(key, (uint64_t)(r * cols + c), p);
            kept += k;
            float v = k ? (float)x[r * ldx + c] * sc : 0.0f;
            bad += got[yi] != q(v, dt);
            bad_acc += acc[yi] != (double)((float)y0[yi] + v);
        }
    ZT_CHECK_MSG(!bad && !bad_acc && !touched, "[%s] dropout (%s): %lld values and %lld "
                 "accumulated values differ from x * mask / (1 - p); %lld padding values "
                 "written", BK, zn_dtype_name(dt), (long long)bad, (long long)bad_acc,
                 (long long)touched);
    /* the kept share is 1 - p: within 5 standard deviations of the binomial */
    double n = (double)(rows * cols), sd = sqrt(n * p * (1 - p));
    ZT_CHECK_MSG(fabs((double)kept - n * (1 - p)) <= 5 * sd, "[%s] dropout keeps %lld of %.0f "
                 "(expected %.0f +- %.0f)", BK, (long long)kept, n, n * (1 - p), sd);
    /* another key draws another mask: overlap of two independent masks */
    DEV_OK(zn_dev_dropout(D, S, dx, dt, ldx, dy, dt, ldy, rows, cols, p, key + 1, 0));
    double *g2 = dev_down(dy, (size_t)ny, dt);
    int64_t both = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            both += got[r * ldy + c] != 0 && g2[r * ldy + c] != 0 && x[r * ldx + c] != 0;
    double eb = n * (1 - p) * (1 - p), sb = sqrt(n * (1 - p) * (1 - p) * (1 - (1 - p) * (1 - p)));
    ZT_CHECK_MSG(fabs((double)both - eb) <= 5 * sb, "[%s] dropout: keys k and k+1 keep %lld "
                 "in common (independent masks: %.0f +- %.0f)", BK, (long long)both, eb, sb);
    /* p = 0 copies; p outside [0, 1) is refused */
    DEV_OK(zn_dev_dropout(D, S, dx, dt, ldx, dy, dt, ldy, rows, cols, 0.0, key, 0));
    free(g2);
    g2 = dev_down(dy, (size_t)ny, dt);
    for (int64_t r = 0, c; r < rows; r++)
        for (c = 0; c < cols; c++)
            bad += g2[r * ldy + c] != x[r * ldx + c];
    ZT_CHECK_MSG(!bad, "[%s] dropout p = 0 is not a copy", BK);
    ZT_CHECK(zn_dev_dropout(D, S, dx, dt, ldx, dy, dt, ldy, rows, cols, 1.0, key, 0) ==
             ZN_EARG);
    free(x), free(y0), free(got), free(acc), free(g2);
    dfree(dx), dfree(dy), dfree(dacc);
}

/* ---- add / axpy / scale / cast ----------------------------------------------*/
static void test_elementwise(zn_dtype dt)
{
    const int64_t n = 1000;
    double *a = rnd(60, n, 1.0, dt), *b = rnd(61, n, 1.0, dt), *ref = malloc(n * 8);
    double *yf = rnd(62, n, 1.0, ZN_DTYPE_F32);
    void *da = dev_up(a, n, dt), *db = dev_up(b, n, dt), *dy = dev_poison(n, dt);
    DEV_OK(zn_dev_add(D, S, da, db, dy, dt, n));
    double *got = dev_down(dy, n, dt);
    for (int64_t i = 0; i < n; i++)
        ref[i] = a[i] + b[i];
    CMP("add", dt, got, ref, n, tol_fwd(dt));
    free(got);
    /* f32 accumulator += x (type dt), then axpy and scale on it */
    void *dacc = dev_up(yf, n, ZN_DTYPE_F32);
    DEV_OK(zn_dev_add_inplace(D, S, dacc, ZN_DTYPE_F32, da, dt, n));
    DEV_OK(zn_dev_axpy(D, S, -0.5f, db, dt, dacc, ZN_DTYPE_F32, n));
    DEV_OK(zn_dev_scale(D, S, dacc, ZN_DTYPE_F32, n, 3.0f));
    got = dev_down(dacc, n, ZN_DTYPE_F32);
    for (int64_t i = 0; i < n; i++)
        ref[i] = 3.0 * (yf[i] + a[i] - 0.5 * b[i]);
    CMP("add_inplace/axpy/scale", dt, got, ref, n, 1e-6);
    free(got);
    /* scale in type dt */
    DEV_OK(zn_dev_scale(D, S, da, dt, n, -2.0f));
    got = dev_down(da, n, dt);
    for (int64_t i = 0; i < n; i++)
        ref[i] = -2.0 * a[i];
    CMP("scale", dt, got, ref, n, 0.0);
    free(a), free(b), free(ref), free(yf), free(got);
    dfree(da), dfree(db), dfree(dy), dfree(dacc);
}

static void test_cast(void)
{
    static const float vals[] = { 1.0f, 1.00390625f /* tie -> even */, 1.01171875f /* tie -> up */,
                                  -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, FLT_MAX, -3.14159f,
                                  65504.0f, 1.0f + 1e-7f };
    const int n = (int)(sizeof vals / sizeof vals[0]);
    void *dx, *dy, *dz;
    uint16_t hy[16];
    float hz[16];
    DEV_OK(zn_dev_alloc(D, sizeof vals, "x", &dx));
    DEV_OK(zn_dev_alloc(D, 64, "y", &dy));
    DEV_OK(zn_dev_alloc(D, sizeof vals, "z", &dz));
    DEV_OK(zn_dev_copy_h2d(D, S, dx, vals, sizeof vals));
    DEV_OK(zn_dev_cast(D, S, dx, ZN_DTYPE_F32, dy, ZN_DTYPE_BF16, n));
    DEV_OK(zn_dev_cast(D, S, dy, ZN_DTYPE_BF16, dz, ZN_DTYPE_F32, n));
    DEV_OK(zn_dev_copy_d2h(D, S, hy, dy, (size_t)n * 2));
    DEV_OK(zn_dev_copy_d2h(D, S, hz, dz, (size_t)n * 4));
    DEV_OK(zn_dev_stream_sync(D, S));
    /* Expected bits, worked out by hand from round-to-nearest-even. */
    /* 1e-40 = 0x000116c2 rounds to 0x0001; FLT_MAX rounds up to inf; the
     * NaN (index 6) is checked for NaN-ness only. */
    static const uint16_t want[] = { 0x3f80, 0x3f80, 0x3f82, 0x8000, 0x7f80, 0xff80, 0,
                                     0x0001, 0x7f80, 0xc049, 0x4780, 0x3f80 };
    for (int i = 0; i < n; i++) {
        uint16_t w = want[i];
        if (i == 6) {
            ZT_CHECK_MSG((hy[i] & 0x7f80) == 0x7f80 && (hy[i] & 0x7f),
                         "[%s] cast NaN -> bf16 gave 0x%04x", BK, hy[i]);
            ZT_CHECK_MSG(isnan(hz[i]), "[%s] cast NaN back to f32 gave %g", BK, (double)hz[i]);
            continue;
        }
        ZT_CHECK_MSG(hy[i] == w, "[%s] cast %.9g -> bf16: 0x%04x, expected 0x%04x", BK,
                     (double)vals[i], hy[i], w);
        ZT_CHECK_MSG(hz[i] == zn_bf16_widen(hy[i]), "[%s] cast bf16 0x%04x -> f32: %g", BK,
                     hy[i], (double)hz[i]);
    }
    dfree(dx), dfree(dy), dfree(dz);
}

/* ---- bias ---------------------------------------------------------------------*/
typedef struct { int64_t rows, cols, ld; const double *y0; } bias_ctx;

static void bias_ref(const double *bias, double *y, const void *cv)
{
    const bias_ctx *c = cv;
    for (int64_t r = 0; r < c->rows; r++)
        for (int64_t j = 0; j < c->ld; j++)
            y[r * c->ld + j] = c->y0[r * c->ld + j] + (j < c->cols ? bias[j] : 0.0);
}

static void test_bias(zn_dtype dt)
{
    bias_ctx c = { 70, 33, 40, NULL };
    size_t n = (size_t)(c.rows * c.ld);
    double *y0 = rnd(70, n, 1.0, dt), *bias = rnd(71, 33, 1.0, dt), *R = rnd(72, n, 1.0, dt);
    double *ref = malloc(n * 8), *g = malloc(33 * 8), *base = rnd(73, 33, 1.0, ZN_DTYPE_F32);
    c.y0 = y0;
    bias_ref(bias, ref, &c);
    void *dyy = dev_up(y0, n, dt), *db = dev_up(bias, 33, dt);
    DEV_OK(zn_dev_bias_add(D, S, dyy, dt, c.ld, db, dt, c.rows, c.cols));
    double *got = dev_down(dyy, n, dt);
    CMP("bias_add", dt, got, ref, n, tol_fwd(dt));
    fd_grad(bias_ref, &c, bias, 33, n, R, g);
    void *dR = dev_up(R, n, dt);
    float *ddb = dev_up(base, 33, ZN_DTYPE_F32);
    DEV_OK(zn_dev_bias_grad(D, S, dR, dt, c.ld, ddb, c.rows, c.cols));
    double *gb = dev_down(ddb, 33, ZN_DTYPE_F32);
    for (int j = 0; j < 33; j++)
        gb[j] -= base[j];
    /* the padding columns of R must not count: FD saw them with zero weight */
    CMP("bias_grad", dt, gb, g, 33, 1e-5);
    free(y0), free(bias), free(R), free(ref), free(g), free(base), free(got), free(gb);
    dfree(dyy), dfree(db), dfree(dR), dfree(ddb);
}

/* ---- cross-entropy over vocabulary chunks ------------------------------------*/
typedef struct { int64_t rows, vocab; const int32_t *tg; double gs, cap; } xe_ctx;

/* y[0] = grad_scale * sum of per-row losses (a scalar), y[1 + r] = loss r;
 * cap > 0: of the logits soft-capped, cap tanh(x / cap) (Gemma 2) */
static void xe_ref(const double *lg, double *y, const void *cv)
{
    const xe_ctx *c = cv;
    double *capped = malloc((size_t)c->vocab * sizeof *capped);
    y[0] = 0;
    for (int64_t r = 0; r < c->rows; r++) {
        const double *x = lg + r * c->vocab;
        if (c->cap > 0) {
            for (int64_t j = 0; j < c->vocab; j++)
                capped[j] = c->cap * tanh(x[j] / c->cap);
            x = capped;
        }
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < c->vocab; j++)
            mx = fmax(mx, x[j]);
        for (int64_t j = 0; j < c->vocab; j++)
            s += exp(x[j] - mx);
        double loss = c->tg[r] < 0 ? 0.0 : mx + log(s) - x[c->tg[r]];
        y[1 + r] = loss;
        y[0] += c->gs * loss;
    }
    free(capped);
}

/* cap > 0: the forward over the logits capped by zn_dev_softcap_fwd, the
 * backward from the raw ones through the cap (the head's Gemma 2 path) */
static void test_xent(zn_dtype dt, double cap)
{
    static const int32_t tg[] = { 3, 17, -100, 49, 0, 33 };
    static const int64_t chunk[][2] = { { 0, 16 }, { 16, 16 }, { 32, 16 }, { 48, 2 } };
    xe_ctx c = { 6, 50, tg, 1.0 / 5.0, cap };
    size_t n = (size_t)(c.rows * c.vocab);
    double *lg = rnd(80, n, 4.0, dt), *ref = malloc((size_t)(c.rows + 1) * 8);
    xe_ref(lg, ref, &c);
    /* capped: into fp32, as the head caps its fp32 logits */
    void *dl = dev_up(lg, n, dt), *dc = dl;
    zn_dtype fdt = cap > 0 ? ZN_DTYPE_F32 : dt;
    if (cap > 0) {
        dc = dev_poison(n, fdt);
        DEV_OK(zn_dev_softcap_fwd(D, S, dl, dt, dc, fdt, (int64_t)n, 1.0f, (float)cap));
    }
    int32_t *dtg = dev_i32(tg, 6);
    float *m = dev_poison(6, ZN_DTYPE_F32), *s = dev_poison(6, ZN_DTYPE_F32);
    float *t = dev_poison(6, ZN_DTYPE_F32), *lse = dev_poison(6, ZN_DTYPE_F32);
    float *loss = dev_poison(6, ZN_DTYPE_F32), *tot = dev_poison(1, ZN_DTYPE_F32);
    for (int k = 0; k < 4; k++)
        DEV_OK(zn_dev_xent_fwd_chunk(D, S, (char *)dc + chunk[k][0] * (int64_t)zn_dtype_size(fdt),
                                     fdt, c.rows, chunk[k][1], c.vocab, chunk[k][0], dtg, m, s, t,
                                     k == 0));
    DEV_OK(zn_dev_xent_finish(D, S, m, s, t, dtg, c.rows, lse, loss));
    DEV_OK(zn_dev_sum(D, S, loss, ZN_DTYPE_F32, c.rows, tot, 0));
    double *gl = dev_down(loss, 6, ZN_DTYPE_F32), *gt = dev_down(tot, 1, ZN_DTYPE_F32);
    CMP(cap > 0 ? "xent loss per row, capped" : "xent loss per row", dt, gl, ref + 1, 6, 1e-5);
    double want = ref[0] / c.gs;
    CMP(cap > 0 ? "xent loss sum, capped" : "xent loss sum", dt, gt, &want, 1, 1e-5);
    /* backward: chunk by chunk into a separate buffer, the last chunk in place */
    double *R = calloc((size_t)c.rows + 1, 8), *g = malloc(n * 8);
    R[0] = 1.0;
    fd_grad(xe_ref, &c, lg, n, (size_t)c.rows + 1, R, g);
    void *dd = dev_poison(n, dt);
    for (int k = 0; k < 4; k++) {
        size_t off = (size_t)chunk[k][0] * zn_dtype_size(dt);
        void *dst = k == 3 ? (char *)dl + off : (char *)dd + off;
        DEV_OK(zn_dev_xent_bwd_chunk(D, S, (char *)dl + off, dt, c.rows, chunk[k][1], c.vocab,
                                     chunk[k][0], dtg, lse, (float)c.gs, (float)cap, dst, dt,
                                     c.vocab));
    }
    double *gd = dev_down(dd, n, dt), *gin = dev_down(dl, n, dt);
    for (int64_t r = 0; r < c.rows; r++)     /* the in-place chunk came back in dl */
        for (int64_t j = 48; j < 50; j++)
            gd[r * c.vocab + j] = gin[r * c.vocab + j];
    CMP(cap > 0 ? "xent_bwd_chunk, capped" : "xent_bwd_chunk", dt, gd, g, n, tol_bwd(dt));
    free(lg), free(ref), free(gl), free(gt), free(R), free(g), free(gd), free(gin);
    dfree(dl), dfree(dtg), dfree(m), dfree(s), dfree(t), dfree(lse), dfree(loss), dfree(tot);
    dfree(dd);
    if (dc != dl)
        dfree(dc);
}

/* ---- soft-capping ---------------------------------------------------------------*/
typedef struct { int64_t n; double scale, cap; } sc_ctx;

static void sc_ref(const double *x, double *y, const void *cv)
{
    const sc_ctx *c = cv;
    for (int64_t i = 0; i < c->n; i++)
        y[i] = c->cap * tanh(x[i] * c->scale / c->cap);
}

/* y = cap tanh(scale x / cap) against float64, out of place and in place;
 * the backward from the forward's y against the finite differences, f32
 * gradients into dt and in place over dy */
static void test_softcap(zn_dtype dt)
{
    sc_ctx c = { 301, 0.25, 1.5 };
    double *x = rnd(56, (size_t)c.n, 12.0, dt), *R = rnd(57, (size_t)c.n, 1.0, ZN_DTYPE_F32);
    double *y = malloc((size_t)c.n * 8), *g = malloc((size_t)c.n * 8);
    sc_ref(x, y, &c);
    void *dx = dev_up(x, (size_t)c.n, dt), *dy = dev_poison((size_t)c.n, dt);
    DEV_OK(zn_dev_softcap_fwd(D, S, dx, dt, dy, dt, c.n, (float)c.scale, (float)c.cap));
    double *got = dev_down(dy, (size_t)c.n, dt);
    CMP("softcap_fwd", dt, got, y, (size_t)c.n, tol_fwd(dt));
    fd_grad(sc_ref, &c, x, (size_t)c.n, (size_t)c.n, R, g);
    float *dR = dev_up(R, (size_t)c.n, ZN_DTYPE_F32);
    void *dg = dev_poison((size_t)c.n, dt);
    DEV_OK(zn_dev_softcap_bwd(D, S, dy, dt, dR, ZN_DTYPE_F32, dg, dt, c.n, (float)c.scale,
                              (float)c.cap));
    double *gg = dev_down(dg, (size_t)c.n, dt);
    CMP("softcap_bwd", dt, gg, g, (size_t)c.n, tol_bwd(dt));
    DEV_OK(zn_dev_softcap_bwd(D, S, dy, dt, dR, ZN_DTYPE_F32, dR, ZN_DTYPE_F32, c.n,
                              (float)c.scale, (float)c.cap));
    double *gi = dev_down(dR, (size_t)c.n, ZN_DTYPE_F32);
    CMP("softcap_bwd in place", dt, gi, g, (size_t)c.n, tol_bwd(dt));
    DEV_OK(zn_dev_softcap_fwd(D, S, dx, dt, dx, dt, c.n, (float)c.scale, (float)c.cap));
    double *gx = dev_down(dx, (size_t)c.n, dt);
    CMP("softcap_fwd in place", dt, gx, got, (size_t)c.n, 0.0);
    zt_checks++;
    ZT_CHECK_MSG(zn_dev_softcap_fwd(D, S, dx, dt, dy, dt, c.n, 1.0f, 0.0f) == ZN_EARG,
                 "[%s] softcap_fwd with cap 0 accepted", BK);
    free(x), free(R), free(y), free(g), free(got), free(gg), free(gi), free(gx);
    dfree(dx), dfree(dy), dfree(dR), dfree(dg);
}

/* ---- mixture-of-experts rows ----------------------------------------------------*/
/* gather (weighted and not), scatter-add into an fp32 base with a row
 * repeated (each element must sum its rows in order), row dots, against
 * float64; a row index list out of order, an empty list a no-op */
static void test_rows(zn_dtype dt)
{
    const int64_t rows = 37, dim = 70, n = 23;
    int32_t idx[23];
    for (int64_t r = 0; r < n; r++)
        idx[r] = (int32_t)((r * 11 + 5) % rows);
    idx[7] = idx[3]; /* scatter: one token twice */
    double *x = rnd(61, (size_t)(rows * dim), 2.0, dt), *xr = rnd(62, (size_t)(n * dim), 2.0, dt);
    double *w = rnd(63, (size_t)n, 1.0, ZN_DTYPE_F32), *base = rnd(64, (size_t)(rows * dim), 1.0,
                                                                   ZN_DTYPE_F32);
    double *yg = malloc((size_t)(n * dim) * 8), *yw = malloc((size_t)(n * dim) * 8);
    double *ys = malloc((size_t)(rows * dim) * 8), *yd = malloc((size_t)n * 8);
    memcpy(ys, base, (size_t)(rows * dim) * 8);
    for (int64_t r = 0; r < n; r++) {
        double acc = 0;
        for (int64_t c = 0; c < dim; c++) {
            yg[r * dim + c] = x[idx[r] * dim + c];
            yw[r * dim + c] = w[r] * x[idx[r] * dim + c];
            ys[idx[r] * dim + c] += w[r] * xr[r * dim + c];
            acc += x[idx[r] * dim + c] * xr[r * dim + c];
        }
        yd[r] = acc;
    }
    void *dx = dev_up(x, (size_t)(rows * dim), dt), *dxr = dev_up(xr, (size_t)(n * dim), dt);
    float *dw = dev_up(w, (size_t)n, ZN_DTYPE_F32);
    float *dbase = dev_up(base, (size_t)(rows * dim), ZN_DTYPE_F32);
    int32_t *di = dev_i32(idx, (size_t)n);
    void *dy = dev_poison((size_t)(n * dim), dt);
    float *dd = dev_poison((size_t)n, ZN_DTYPE_F32);
    DEV_OK(zn_dev_rows_gather(D, S, di, n, NULL, dx, dt, rows, dim, dy, dt));
    double *g1 = dev_down(dy, (size_t)(n * dim), dt);
    CMP("rows_gather", dt, g1, yg, (size_t)(n * dim), 0.0);
    DEV_OK(zn_dev_rows_gather(D, S, di, n, dw, dx, dt, rows, dim, dy, dt));
    double *g2 = dev_down(dy, (size_t)(n * dim), dt);
    CMP("rows_gather weighted", dt, g2, yw, (size_t)(n * dim), tol_fwd(dt));
    DEV_OK(zn_dev_rows_scatter_add(D, S, di, n, dw, dxr, dt, rows, dim, dbase));
    double *g3 = dev_down(dbase, (size_t)(rows * dim), ZN_DTYPE_F32);
    CMP("rows_scatter_add", dt, g3, ys, (size_t)(rows * dim), 1e-6);
    DEV_OK(zn_dev_rows_dot(D, S, di, n, dx, dt, rows, dxr, dt, dim, dd));
    double *g4 = dev_down(dd, (size_t)n, ZN_DTYPE_F32);
    CMP("rows_dot", dt, g4, yd, (size_t)n, 1e-5);
    DEV_OK(zn_dev_rows_scatter_add(D, S, di, 0, dw, dxr, dt, rows, dim, dbase));
    double *g5 = dev_down(dbase, (size_t)(rows * dim), ZN_DTYPE_F32);
    CMP("rows_scatter_add of no rows", dt, g5, g3, (size_t)(rows * dim), 0.0);
    zt_checks++;
    ZT_CHECK_MSG(zn_dev_rows_gather(D, S, di, n, NULL, dx, dt, 0, dim, dy, dt) == ZN_EARG,
                 "[%s] rows_gather from 0 rows accepted", BK);
    free(x), free(xr), free(w), free(base), free(yg), free(yw), free(ys), free(yd);
    free(g1), free(g2), free(g3), free(g4), free(g5);
    dfree(dx), dfree(dxr), dfree(dw), dfree(dbase), dfree(di), dfree(dy), dfree(dd);
}

/* ---- reductions ---------------------------------------------------------------*/
static void test_reduce(zn_dtype dt)
{
    const int64_t n = 100003;
    double *x = rnd(90, n, 1.0, dt), ss = 0, su = 0;
    for (int64_t i = 0; i < n; i++)
        ss += x[i] * x[i], su += x[i];
    void *dx = dev_up(x, n, dt);
    float *o = dev_poison(3, ZN_DTYPE_F32);
    DEV_OK(zn_dev_sumsq(D, S, dx, dt, n, o, 0));
    DEV_OK(zn_dev_sum(D, S, dx, dt, n, o + 1, 0));
    DEV_OK(zn_dev_fill(D, S, o + 2, ZN_DTYPE_F32, 1, 10.0f));
    DEV_OK(zn_dev_sumsq(D, S, dx, dt, n, o + 2, 1));
    DEV_OK(zn_dev_sumsq(D, S, dx, dt, 1000, o + 2, 1));
    double *h = dev_down(o, 3, ZN_DTYPE_F32);
    double ss1000 = 0;
    for (int64_t i = 0; i < 1000; i++)
        ss1000 += x[i] * x[i];
    double want[3] = { ss, su, 10.0 + ss + ss1000 };
    CMP("sumsq", dt, &h[0], &want[0], 1, 1e-5);
    ZT_CHECK_MSG(fabs(h[1] - su) <= 1e-5 * sqrt(ss), "[%s] sum (%s): %.9g vs %.9g", BK,
                 zn_dtype_name(dt), h[1], su);
    CMP("sumsq accumulate", dt, &h[2], &want[2], 1, 1e-5);
    free(x), free(h);
    dfree(dx), dfree(o);
}

/* ---- the optimizer ----------------------------------------------------------------
 * The device step against the CPU's zn_adam_step, bit for bit (the CUDA
 * kernel follows the FMA paths; the scalar path is the one exception), and
 * the chunked sums of squares against zn_grad_norm_sq. */
static float *host_f32(uint64_t seed, size_t n, double scale)
{
    float *x = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * urand(seed, i));
    return x;
}

static void *dev_raw(const void *h, size_t bytes)
{
    void *d = NULL;
    DEV_OK(zn_dev_alloc(D, bytes + 4, "raw", &d));
    DEV_OK(zn_dev_copy_h2d(D, S, d, h, bytes));
    DEV_OK(zn_dev_stream_sync(D, S));
    return d;
}

static void test_optimizer(void)
{
    const size_t n = 70001;
    bool scalar = zn_adam_get_isa() == ZN_ISA_SCALAR;
    for (int mode = 0; mode < 3; mode++) {
        zn_adam_params hp = zn_adam_params_default();
        hp.lr = 3e-3f;
        hp.step = 7;
        hp.weight_decay = mode ? 0.1f : 0.0f;
        hp.threads = 1; /* one thread: ThreadSanitizer cannot see libgomp's fork */
        hp.adamw_mode = mode != 2;
        float gs = mode == 1 ? 0.25f : 1.0f;
        float *p = host_f32(100, n, 1.0), *g = host_f32(101, n, 0.5);
        float *m = host_f32(102, n, 0.01), *v = host_f32(103, n, 0.0);
        for (size_t i = 0; i < n; i++)
            v[i] = v[i] * v[i] * 1e-4f + 1e-9f;
        float *dp = dev_raw(p, n * 4), *dm = dev_raw(m, n * 4), *dv = dev_raw(v, n * 4);
        float *dg = dev_raw(g, n * 4);
        uint16_t *dc = dev_poison(n, ZN_DTYPE_BF16);
        uint16_t *c = malloc(n * 2), *cd = malloc(n * 2);
        /* two steps: the second reads the device's own m and v */
        for (int it = 0; it < 2; it++, hp.step++) {
            ZT_CHECK(zn_adam_step(&hp, p, m, v, g, ZN_DTYPE_F32, gs, c, ZN_DTYPE_BF16, n) == 0);
            DEV_OK(zn_dev_adam(D, S, &hp, dp, dm, dv, dg, gs, dc, ZN_DTYPE_BF16, (int64_t)n));
        }
        float *hp32 = malloc(n * 4), *hm = malloc(n * 4), *hv = malloc(n * 4);
        DEV_OK(zn_dev_copy_d2h(D, S, hp32, dp, n * 4));
        DEV_OK(zn_dev_copy_d2h(D, S, hm, dm, n * 4));
        DEV_OK(zn_dev_copy_d2h(D, S, hv, dv, n * 4));
        DEV_OK(zn_dev_copy_d2h(D, S, cd, dc, n * 2));
        DEV_OK(zn_dev_stream_sync(D, S));
        size_t diff = 0;
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            diff += memcmp(&hp32[i], &p[i], 4) || memcmp(&hm[i], &m[i], 4) ||
                    memcmp(&hv[i], &v[i], 4) || cd[i] != c[i];
            double e = fabs((double)hp32[i] - p[i]) / (fabs(p[i]) + 1e-30);
            worst = e > worst ? e : worst;
        }
        if (scalar)
            ZT_CHECK_MSG(worst < 1e-6, "[%s] adam mode %d: rel err %.3g vs the scalar path", BK,
                         mode, worst);
        else
            ZT_CHECK_MSG(diff == 0, "[%s] adam mode %d: %zu of %zu elements differ from "
                         "zn_adam_step (%s path; worst rel %.3g)", BK, mode, diff, n,
                         zn_adam_isa_name(), worst);
        /* a bad hyperparameter is refused, as the CPU step refuses it */
        zn_adam_params bad = hp;
        bad.beta1 = 1.0f;
        ZT_CHECK(zn_dev_adam(D, S, &bad, dp, dm, dv, dg, gs, NULL, ZN_DTYPE_BF16, 8) != 0);
        ZT_CHECK(zn_dev_adam(D, S, &hp, p, dm, dv, dg, gs, NULL, ZN_DTYPE_BF16, 8) != 0);
        free(p), free(g), free(m), free(v), free(c), free(cd), free(hp32), free(hm), free(hv);
        dfree(dp), dfree(dm), dfree(dv), dfree(dg), dfree(dc);
    }

    /* sums of squares by chunk: lengths around the chunk size, and a NaN */
    const size_t C = ZN_GRAD_NORM_CHUNK;
    const size_t lens[] = { 1, 17, C - 1, C, C + 1, 5 * C + 333 };
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
        size_t len = lens[t], nc = (len + C - 1) / C;
        float *x = host_f32(200 + t, len, 3.0);
        if (t == 5)
            x[2 * C + 5] = NAN;
        float *dx = dev_raw(x, len * 4);
        double *dout = NULL, *out = malloc(nc * 8);
        DEV_OK(zn_dev_alloc(D, nc * 8, "chunks", (void **)&dout));
        DEV_OK(zn_dev_norm_sq_chunks(D, S, dx, (int64_t)len, dout));
        DEV_OK(zn_dev_copy_d2h(D, S, out, dout, nc * 8));
        DEV_OK(zn_dev_stream_sync(D, S));
        zn_grad_span sp = { x, len, ZN_DTYPE_F32 };
        double want = 0, got = zn_grad_norm_combine(out, nc);
        int nf = 0;
        ZT_CHECK(zn_grad_norm_sq(&sp, 1, 1, &want, &nf) == 0);
        if (t == 5)
            ZT_CHECK_MSG(isnan(got) && nf, "[%s] norm chunks: a NaN gave %g", BK, got);
        else
            ZT_CHECK_MSG(memcmp(&got, &want, 8) == 0 && want > 0,
                         "[%s] norm chunks of %zu: %.17g vs zn_grad_norm_sq %.17g", BK, len,
                         got, want);
        free(x), free(out);
        dfree(dx), dfree(dout);
    }
}

/* ---- fused attention ---------------------------------------------------*/
typedef struct {
    int64_t B, T, nh, nkv, hd, ld, ldo, ldd;
    const int32_t *ks; /* [B*T] or NULL */
    double cap;        /* the scaled scores soft-capped (0: not) */
    double scale;      /* 0: 1 / sqrt(hd) */
} fl_ctx;

static double fl_scale(const fl_ctx *c)
{
    return c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->hd);
}

static int64_t fl_lo_ref(const fl_ctx *c, int64_t b, int64_t t)
{
    int64_t k = c->ks ? c->ks[b * c->T + t] : 0;
    return k < 0 ? 0 : k > t ? t : k;
}

/* Exact attention in double: out [B*T][ldo], lse [B][nh][T]; with dout,
 * the analytic backward into dqkv [B*T][ldd] (dK, dV summed over a group). */
static void fl_ref(const fl_ctx *c, const double *x, double *out, double *lse,
                   const double *dout, double *dx)
{
    int64_t T = c->T, hd = c->hd, g = c->nh / c->nkv, qd = c->nh * hd, kvd = c->nkv * hd;
    double sc = fl_scale(c);
    double *P = malloc((size_t)(T * T) * sizeof *P), *dP = malloc((size_t)(T * T) * sizeof *dP);
    double *G = malloc((size_t)(T * T) * sizeof *G); /* d capped / d scaled */
    if (dx)
        for (int64_t i = 0; i < c->B * T * c->ldd; i++)
            dx[i] = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->nh; h++) {
            int64_t j = h / g;
            const double *X = x + b * T * c->ld;
            for (int64_t t = 0; t < T; t++) {
                int64_t lo = fl_lo_ref(c, b, t);
                double mx = -INFINITY, sum = 0;
                for (int64_t u = lo; u <= t; u++) {
                    double d = 0;
                    for (int64_t e = 0; e < hd; e++)
                        d += X[t * c->ld + h * hd + e] * X[u * c->ld + qd + j * hd + e];
                    d *= sc;
                    G[t * T + u] = 1;
                    if (c->cap > 0) {
                        double th = tanh(d / c->cap);
                        d = c->cap * th;
                        G[t * T + u] = 1 - th * th;
                    }
                    P[t * T + u] = d;
                    mx = fmax(mx, d);
                }
                for (int64_t u = lo; u <= t; u++)
                    sum += exp(P[t * T + u] - mx);
                for (int64_t u = 0; u < T; u++)
                    P[t * T + u] = u >= lo && u <= t ? exp(P[t * T + u] - mx) / sum : 0;
                lse[(b * c->nh + h) * T + t] = mx + log(sum);
                for (int64_t e = 0; e < hd; e++) {
                    double o = 0;
                    for (int64_t u = lo; u <= t; u++)
                        o += P[t * T + u] * X[u * c->ld + qd + kvd + j * hd + e];
                    out[(b * T + t) * c->ldo + h * hd + e] = o;
                }
            }
            if (!dx)
                continue;
            const double *dO = dout + b * T * c->ldo;
            double *dX = dx + b * T * c->ldd;
            for (int64_t t = 0; t < T; t++) {
                double rs = 0;
                for (int64_t u = 0; u < T; u++) {
                    double d = 0;
                    for (int64_t e = 0; e < hd; e++)
                        d += dO[t * c->ldo + h * hd + e] * X[u * c->ld + qd + kvd + j * hd + e];
                    dP[t * T + u] = d;
                    rs += P[t * T + u] * d;
                }
                for (int64_t u = 0; u < T; u++)
                    dP[t * T + u] = P[t * T + u] * (dP[t * T + u] - rs) * sc * G[t * T + u];
            }
            for (int64_t t = 0; t < T; t++)
                for (int64_t u = 0; u < T; u++) {
                    double p = P[t * T + u], ds = dP[t * T + u];
                    if (p == 0 && ds == 0)
                        continue;
                    for (int64_t e = 0; e < hd; e++) {
                        dX[t * c->ldd + h * hd + e] += ds * X[u * c->ld + qd + j * hd + e];
                        dX[u * c->ldd + qd + j * hd + e] += ds * X[t * c->ld + h * hd + e];
                        dX[u * c->ldd + qd + kvd + j * hd + e] += p * dO[t * c->ldo + h * hd + e];
                    }
                }
        }
    free(P);
    free(dP);
    free(G);
}

/* The reference's forward as a function of qkv, for a finite-difference
 * check of its own backward. */
static void fl_ref_fwd(const double *x, double *y, const void *cv)
{
    const fl_ctx *c = cv;
    double *lse = malloc((size_t)(c->B * c->nh * c->T) * sizeof *lse);
    fl_ref(c, x, y, lse, NULL, NULL);
    free(lse);
}

static void test_flash_case(zn_dtype dt, fl_ctx c, uint64_t seed)
{
    int64_t N = c.B * c.T, qd = c.nh * c.hd, st = c.B * c.nh * c.T;
    size_t nx = (size_t)(N * c.ld), no = (size_t)(N * c.ldo), nd = (size_t)(N * c.ldd);
    double *x = rnd(seed, nx, 1.5, dt), *dout = rnd(seed + 1, no, 1.0, dt);
    double *out = calloc(no, sizeof *out), *lse = malloc((size_t)st * sizeof *lse);
    double *dx = malloc(nd * sizeof *dx);
    fl_ref(&c, x, out, lse, dout, dx);
    void *dX = dev_up(x, nx, dt), *dO = dev_up(dout, no, dt);
    void *dOut = dev_poison(no, dt), *dDx = dev_poison(nd, dt);
    float *dL = dev_poison((size_t)st, ZN_DTYPE_F32), *dD = dev_poison((size_t)st, ZN_DTYPE_F32);
    int32_t *dks = c.ks ? dev_i32(c.ks, (size_t)N) : NULL;
    float sc = c.scale > 0 ? (float)c.scale : 1.0f / sqrtf((float)c.hd);
    DEV_OK(zn_dev_flash_attn_fwd(D, S, dX, dt, c.ld, c.B, c.T, c.nh, c.nkv, c.hd, dks, sc,
                                 (float)c.cap, dOut, c.ldo, dL));
    double *got = dev_down(dOut, no, dt), *gl = dev_down(dL, (size_t)st, ZN_DTYPE_F32);
    /* only the written columns: the gaps of ldo > qd stay NaN */
    for (int64_t i = 0; i < N; i++)
        for (int64_t e = qd; e < c.ldo; e++)
            got[i * c.ldo + e] = out[i * c.ldo + e];
    CMP("flash_attn_fwd out", dt, got, out, no, tol_fwd(dt));
    CMP("flash_attn_fwd lse", dt, gl, lse, (size_t)st, tol_fwd(dt));
    /* the backward takes the forward's own out and lse */
    DEV_OK(zn_dev_flash_attn_bwd(D, S, dX, dt, c.ld, c.B, c.T, c.nh, c.nkv, c.hd, dks, sc,
                                 (float)c.cap, dOut, dO, c.ldo, dL, dD, dDx, c.ldd));
    double *gd = dev_down(dDx, nd, dt);
    int64_t cols = (c.nh + 2 * c.nkv) * c.hd;
    for (int64_t i = 0; i < N; i++)
        for (int64_t e = cols; e < c.ldd; e++)
            gd[i * c.ldd + e] = dx[i * c.ldd + e];
    CMP("flash_attn_bwd dqkv", dt, gd, dx, nd, tol_bwd(dt));
    free(got);
    free(gl);
    free(gd);
    free(x);
    free(dout);
    free(out);
    free(lse);
    free(dx);
    dfree(dX);
    dfree(dO);
    dfree(dOut);
    dfree(dDx);
    dfree(dL);
    dfree(dD);
    if (dks)
        dfree(dks);
}

static void test_flash(zn_dtype dt)
{
    if (zn_dev_get_kind(D) == ZN_DEV_CUDA && dt == ZN_DTYPE_F32) {
        /* tensor cores take 16-bit inputs: f32 is refused, by name */
        void *x = dev_poison(64, dt), *o = dev_poison(64, dt);
        float *l = dev_poison(8, ZN_DTYPE_F32);
        zt_checks++;
        int rc = zn_dev_flash_attn_fwd(D, S, x, dt, 12, 1, 2, 2, 1, 4, NULL, 0.5f, 0.0f, o, 8, l);
        ZT_CHECK_MSG(rc == ZN_EUNSUPPORTED, "[%s] f32 fused attention on CUDA: rc %d", BK, rc);
        dfree(x);
        dfree(o);
        dfree(l);
        return;
    }
    /* the reference's backward against its forward's finite differences */
    for (int capped = 0; capped < 2 && dt == ZN_DTYPE_F32; capped++) {
        int32_t ks5[5] = { 0, 0, 2, 2, 2 };
        fl_ctx c = { 1, 5, 2, 1, 4, 16, 8, 16, ks5, capped ? 0.4 : 0.0, capped ? 0.3 : 0.0 };
        size_t nx = 5 * 16, no = 5 * 8;
        double *x = rnd(91, nx, 1.0, dt), *R = rnd(92, no, 1.0, dt);
        double *y = calloc(no, sizeof *y), *lse = malloc(10 * sizeof *lse);
        double *an = malloc(nx * sizeof *an), *fd = malloc(nx * sizeof *fd);
        fl_ref(&c, x, y, lse, R, an);
        fd_grad(fl_ref_fwd, &c, x, nx, no, R, fd);
        CMP("flash reference backward vs finite differences", dt, an, fd, nx, 1e-6);
        free(x);
        free(R);
        free(y);
        free(lse);
        free(an);
        free(fd);
    }
    /* several tiles, GQA (2 heads per kv head) */
    fl_ctx a = { 2, 70, 4, 2, 8, 64, 32, 64, NULL, 0.0, 0.0 };
    test_flash_case(dt, a, 11);
    /* head_dim 24 (not a multiple of 16), packed documents [0,40) [40,41)
     * [41,100) [100,130) (the last starts past a tile: tiles before it are
     * skipped), wide leading dimensions */
    int32_t *ks = malloc(130 * sizeof *ks);
    for (int t = 0; t < 130; t++)
        ks[t] = t < 40 ? 0 : t == 40 ? 40 : t < 100 ? 41 : 100;
    fl_ctx b = { 1, 130, 2, 1, 24, 4 * 24 + 5, 2 * 24 + 3, 4 * 24 + 2, ks, 0.0, 0.0 };
    test_flash_case(dt, b, 23);
    free(ks);
    /* no GQA, a short sequence, head_dim 6 */
    fl_ctx c3 = { 3, 9, 3, 3, 6, 54, 18, 54, NULL, 0.0, 0.0 };
    test_flash_case(dt, c3, 37);
    /* the shapes that train: head_dim 128 (Llama, Qwen2.5 7B/14B; the
     * kernels' largest shared-memory footprint) with 4 heads per kv head,
     * and head_dim 64 (Qwen2.5-0.5B) */
    fl_ctx c4 = { 1, 200, 4, 1, 128, 6 * 128, 4 * 128, 6 * 128, NULL, 0.0, 0.0 };
    test_flash_case(dt, c4, 41);
    fl_ctx c5 = { 2, 100, 2, 2, 64, 6 * 64, 2 * 64, 6 * 64, NULL, 0.0, 0.0 };
    test_flash_case(dt, c5, 43);
    /* Gemma 2's soft-capping (a cap the scores reach, another scale) over
     * b's packed documents, and with GQA over several tiles */
    ks = malloc(130 * sizeof *ks);
    for (int t = 0; t < 130; t++)
        ks[t] = t < 40 ? 0 : t == 40 ? 40 : t < 100 ? 41 : 100;
    b.ks = ks;
    b.cap = 1.0;
    b.scale = 0.3;
    test_flash_case(dt, b, 29);
    free(ks);
    a.cap = 0.8;
    test_flash_case(dt, a, 31);
}

/* The step with compressed moments (zn_dev_adam_mom) against the CPU's
 * zn_adam_step_mom: bf16 moments and 8-bit ones of both schemes, three
 * steps from the zero state (the later ones read the device's own codes
 * and scales), a length that ends inside a block, AdamW with decay and
 * Adam with L2, a gradient scale. Bit for bit, as the fp32 step: the same
 * FMA order and the same rounding rules (on the scalar CPU path, which has
 * no FMA, the parameters within 1e-6 relative and the codes within one
 * step of the map). */
static void test_optimizer_mom(void)
{
    const size_t n = 70001, nb = zn_q8_blocks(n);
    bool scalar = zn_adam_get_isa() == ZN_ISA_SCALAR;
    const struct { zn_mom_fmt fmt; zn_q8_scheme scheme; const char *name; } cases[] = {
        { ZN_MOM_BF16, ZN_Q8_BNB, "bf16" },
        { ZN_MOM_Q8, ZN_Q8_BNB, "int8 bitsandbytes" },
        { ZN_MOM_Q8, ZN_Q8_TORCHAO, "int8 torchao" },
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        zn_mom_fmt fmt = cases[t].fmt;
        size_t eb = fmt == ZN_MOM_Q8 ? 1 : 2;
        zn_adam_params hp = zn_adam_params_default();
        hp.lr = 3e-3f;
        hp.step = 1;
        hp.weight_decay = 0.1f;
        hp.threads = 1;
        hp.adamw_mode = t != 1;
        float gs = t == 2 ? 0.5f : 1.0f;
        float *p = host_f32(300 + t, n, 1.0), *g = host_f32(310 + t, n, 0.5);
        uint8_t *m = calloc(n, eb), *v = calloc(n, eb);
        float *am = calloc(nb, 4), *av = calloc(nb, 4);
        float *dp = dev_raw(p, n * 4), *dg = dev_raw(g, n * 4);
        void *dm = dev_raw(m, n * eb), *dv = dev_raw(v, n * eb);
        float *dam = dev_raw(am, nb * 4), *dav = dev_raw(av, nb * 4);
        uint16_t *dc = dev_poison(n, ZN_DTYPE_BF16);
        uint16_t *c = malloc(n * 2), *cd = malloc(n * 2);
        zn_moments hm = zn_moments_of(fmt, m, v, am, av, cases[t].scheme);
        zn_moments dmv = zn_moments_of(fmt, dm, dv, dam, dav, cases[t].scheme);
        for (int it = 0; it < 3; it++, hp.step++) {
            for (size_t i = 0; i < n; i += 97)   /* another gradient each step */
                g[i] = -g[i];
            DEV_OK(zn_dev_copy_h2d(D, S, dg, g, n * 4));
            DEV_OK(zn_dev_stream_sync(D, S));   /* g changes again next step */
            ZT_CHECK(zn_adam_step_mom(&hp, p, &hm, g, ZN_DTYPE_F32, gs, c, ZN_DTYPE_BF16, n) == 0);
            DEV_OK(zn_dev_adam_mom(D, S, &hp, dp, &dmv, dg, gs, dc, ZN_DTYPE_BF16, (int64_t)n));
        }
        float *gp = malloc(n * 4), *gam = malloc(nb * 4), *gav = malloc(nb * 4);
        uint8_t *gm = malloc(n * eb), *gv = malloc(n * eb);
        DEV_OK(zn_dev_copy_d2h(D, S, gp, dp, n * 4));
        DEV_OK(zn_dev_copy_d2h(D, S, gm, dm, n * eb));
        DEV_OK(zn_dev_copy_d2h(D, S, gv, dv, n * eb));
        DEV_OK(zn_dev_copy_d2h(D, S, gam, dam, nb * 4));
        DEV_OK(zn_dev_copy_d2h(D, S, gav, dav, nb * 4));
        DEV_OK(zn_dev_copy_d2h(D, S, cd, dc, n * 2));
        DEV_OK(zn_dev_stream_sync(D, S));
        size_t diff = 0, far = 0;
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            bool same = !memcmp(&gp[i], &p[i], 4) && !memcmp(gm + i * eb, m + i * eb, eb) &&
                        !memcmp(gv + i * eb, v + i * eb, eb) && cd[i] == c[i];
            diff += !same;
            if (fmt == ZN_MOM_Q8)
                far += abs((int)gm[i] - (int)m[i]) > 1 || abs((int)gv[i] - (int)v[i]) > 1;
            double e = fabs((double)gp[i] - p[i]) / (fabs(p[i]) + 1e-30);
            worst = e > worst ? e : worst;
        }
        if (fmt == ZN_MOM_Q8)
            diff += (size_t)(memcmp(gam, am, nb * 4) != 0) + (size_t)(memcmp(gav, av, nb * 4) != 0);
        if (scalar)
            ZT_CHECK_MSG(worst < 1e-6 && far == 0, "[%s] adam %s: rel err %.3g, %zu codes more "
                         "than a step off the scalar path", BK, cases[t].name, worst, far);
        else
            ZT_CHECK_MSG(diff == 0, "[%s] adam %s moments: %zu of %zu elements (or the scales) "
                         "differ from zn_adam_step_mom (%s path; worst rel %.3g)", BK,
                         cases[t].name, diff, n, zn_adam_isa_name(), worst);
        /* int8 moments without their scales are refused, as on the CPU */
        zn_moments noabs = dmv;
        noabs.m_absmax = NULL;
        if (fmt == ZN_MOM_Q8)
            ZT_CHECK(zn_dev_adam_mom(D, S, &hp, dp, &noabs, dg, gs, NULL, ZN_DTYPE_BF16, 8) != 0);
        free(p), free(g), free(m), free(v), free(am), free(av), free(c), free(cd);
        free(gp), free(gam), free(gav), free(gm), free(gv);
        dfree(dp), dfree(dg), dfree(dm), dfree(dv), dfree(dam), dfree(dav), dfree(dc);
    }
}

/* The bf16 master's step (zn_dev_adam_sr) against the CPU's
 * zn_adam_step_sr_spans: fp32, bf16 and 8-bit moments, three steps, the
 * elements' indices in three spans (the second jumps to just under 2^32
 * and crosses it; the third jumps back, inside an 8-bit block), AdamW and
 * Adam with L2, a gradient scale. Bit for bit on every CPU path: the
 * CPU's scalar step of a bf16 master follows the FMA order too. */
static void test_optimizer_sr(void)
{
    const size_t n = 70001, nb = zn_q8_blocks(n);
    const uint64_t seed = 0x5eedf00dull;
    const zn_sr_span spans[3] = { { 0, 1000, 7 }, { 1000, 60000, ((uint64_t)1 << 32) - 40000 },
                                  { 61000, n - 61000, 123456 } };
    const zn_mom_fmt fmts[] = { ZN_MOM_F32, ZN_MOM_BF16, ZN_MOM_Q8 };
    for (size_t t = 0; t < sizeof fmts / sizeof fmts[0]; t++) {
        zn_mom_fmt fmt = fmts[t];
        size_t eb = fmt == ZN_MOM_F32 ? 4 : fmt == ZN_MOM_BF16 ? 2 : 1;
        zn_adam_params hp = zn_adam_params_default();
        hp.lr = 3e-3f;
        hp.step = 1;
        hp.weight_decay = 0.1f;
        hp.threads = 1;
        hp.adamw_mode = t != 1;
        float gs = t == 2 ? 0.5f : 1.0f;
        float *pf = host_f32(320 + t, n, 1.0), *g = host_f32(330 + t, n, 0.5);
        uint16_t *p = malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            p[i] = zn_f32_to_bf16(pf[i]);
        uint8_t *m = calloc(n, eb), *v = calloc(n, eb);
        float *am = calloc(nb, 4), *av = calloc(nb, 4);
        uint16_t *dp = dev_raw(p, n * 2);
        float *dg = dev_raw(g, n * 4);
        void *dm = dev_raw(m, n * eb), *dv = dev_raw(v, n * eb);
        float *dam = dev_raw(am, nb * 4), *dav = dev_raw(av, nb * 4);
        zn_moments hm = zn_moments_of(fmt, m, v, am, av, ZN_Q8_BNB);
        zn_moments dmv = zn_moments_of(fmt, dm, dv, dam, dav, ZN_Q8_BNB);
        zn_sr_span *ds = dev_raw(spans, sizeof spans);
        for (int it = 0; it < 3; it++, hp.step++) {
            for (size_t i = 0; i < n; i += 97)
                g[i] = -g[i];
            DEV_OK(zn_dev_copy_h2d(D, S, dg, g, n * 4));
            DEV_OK(zn_dev_stream_sync(D, S));
            ZT_CHECK(zn_adam_step_sr_spans(&hp, p, &hm, g, ZN_DTYPE_F32, gs, seed, spans, 3,
                                           n) == 0);
            DEV_OK(zn_dev_adam_sr(D, S, &hp, dp, &dmv, dg, gs, seed, ds, 3, (int64_t)n));
        }
        uint16_t *gp = malloc(n * 2);
        uint8_t *gm = malloc(n * eb), *gv = malloc(n * eb);
        float *gam = malloc(nb * 4), *gav = malloc(nb * 4);
        DEV_OK(zn_dev_copy_d2h(D, S, gp, dp, n * 2));
        DEV_OK(zn_dev_copy_d2h(D, S, gm, dm, n * eb));
        DEV_OK(zn_dev_copy_d2h(D, S, gv, dv, n * eb));
        DEV_OK(zn_dev_copy_d2h(D, S, gam, dam, nb * 4));
        DEV_OK(zn_dev_copy_d2h(D, S, gav, dav, nb * 4));
        DEV_OK(zn_dev_stream_sync(D, S));
        size_t diff = 0;
        for (size_t i = 0; i < n; i++)
            diff += gp[i] != p[i] || memcmp(gm + i * eb, m + i * eb, eb) ||
                    memcmp(gv + i * eb, v + i * eb, eb);
        if (fmt == ZN_MOM_Q8)
            diff += (size_t)(memcmp(gam, am, nb * 4) != 0) + (size_t)(memcmp(gav, av, nb * 4) != 0);
        ZT_CHECK_MSG(diff == 0, "[%s] adam (bf16 master, %s moments): %zu of %zu elements (or "
                     "the scales) differ from zn_adam_step_sr (%s path)", BK,
                     zn_mom_fmt_name(fmt), diff, n, zn_adam_isa_name());
        /* a call without its indices is refused */
        ZT_CHECK(zn_dev_adam_sr(D, S, &hp, dp, &dmv, dg, gs, seed, NULL, 0, 8) != 0);
        free(pf), free(p), free(g), free(m), free(v), free(am), free(av);
        free(gp), free(gm), free(gv), free(gam), free(gav);
        dfree(dp), dfree(dg), dfree(dm), dfree(dv), dfree(dam), dfree(dav), dfree(ds);
    }
}

/* 8-bit moments with fp32 blocks (zn_moments.f32, a tensor too small to
 * quantize; the kernel reads f32_dev) through zn_dev_adam_mom and
 * zn_dev_adam_sr, against the CPU's steps: three runs (one the last,
 * partial block), the call's blocks numbered from 5 in them (f32_base),
 * three steps; p, codes, absmax and the fp32 blocks' moments bit for bit;
 * runs without their device copy are refused. */
static void test_optimizer_f32_runs(void)
{
    const size_t n = 70001, nb = zn_q8_blocks(n), slots = 8;
    const zn_q8_f32_run runs[3] = { { 8, 2, 0 }, { 105, 5, 2 }, { 5 + nb - 1, 1, 7 } };
    for (int sr = 0; sr < 2; sr++) {
        zn_adam_params hp = zn_adam_params_default();
        hp.lr = 3e-3f;
        hp.step = 1;
        hp.weight_decay = 0.1f;
        hp.threads = 1;
        float *pf = host_f32(340 + sr, n, 1.0), *g = host_f32(350 + sr, n, 0.5);
        uint16_t *ph = malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            ph[i] = zn_f32_to_bf16(pf[i]);
        size_t pb = sr ? 2 : 4;
        void *p = sr ? (void *)ph : (void *)pf;
        uint8_t *m = calloc(n, 1), *v = calloc(n, 1);
        float *am = calloc(nb, 4), *av = calloc(nb, 4);
        float *mf = calloc(slots * ZN_Q8_BLOCK, 4), *vf = calloc(slots * ZN_Q8_BLOCK, 4);
        void *dp = dev_raw(p, n * pb);
        float *dg = dev_raw(g, n * 4);
        uint8_t *dm = dev_raw(m, n), *dv = dev_raw(v, n);
        float *dam = dev_raw(am, nb * 4), *dav = dev_raw(av, nb * 4);
        float *dmf = dev_raw(mf, slots * ZN_Q8_BLOCK * 4), *dvf = dev_raw(vf, slots * ZN_Q8_BLOCK * 4);
        zn_q8_f32_run *druns = dev_raw(runs, sizeof runs);
        const zn_sr_span span = { 0, n, 0 };
        zn_sr_span *dspan = dev_raw(&span, sizeof span);
        zn_moments hm = zn_moments_of(ZN_MOM_Q8, m, v, am, av, ZN_Q8_BNB);
        hm.f32 = runs, hm.n_f32 = 3, hm.f32_base = 5, hm.m_f32 = mf, hm.v_f32 = vf;
        zn_moments dmv = zn_moments_of(ZN_MOM_Q8, dm, dv, dam, dav, ZN_Q8_BNB);
        dmv.f32 = runs, dmv.n_f32 = 3, dmv.f32_base = 5, dmv.m_f32 = dmf, dmv.v_f32 = dvf;
        dmv.f32_dev = druns;
        for (int it = 0; it < 3; it++, hp.step++) {
            for (size_t i = 0; i < n; i += 89)
                g[i] = -g[i];
            DEV_OK(zn_dev_copy_h2d(D, S, dg, g, n * 4));
            DEV_OK(zn_dev_stream_sync(D, S));
            if (sr) {
                ZT_CHECK(zn_adam_step_sr_spans(&hp, ph, &hm, g, ZN_DTYPE_F32, 1.0f, 9, &span, 1,
                                               n) == 0);
                DEV_OK(zn_dev_adam_sr(D, S, &hp, dp, &dmv, dg, 1.0f, 9, dspan, 1, (int64_t)n));
            } else {
                ZT_CHECK(zn_adam_step_mom(&hp, pf, &hm, g, ZN_DTYPE_F32, 1.0f, NULL,
                                          ZN_DTYPE_BF16, n) == 0);
                DEV_OK(zn_dev_adam_mom(D, S, &hp, dp, &dmv, dg, 1.0f, NULL, ZN_DTYPE_BF16,
                                       (int64_t)n));
            }
        }
        char *gp = malloc(n * pb);
        uint8_t *gm = malloc(n), *gv = malloc(n);
        float *gam = malloc(nb * 4), *gav = malloc(nb * 4);
        float *gmf = malloc(slots * ZN_Q8_BLOCK * 4), *gvf = malloc(slots * ZN_Q8_BLOCK * 4);
        DEV_OK(zn_dev_copy_d2h(D, S, gp, dp, n * pb));
        DEV_OK(zn_dev_copy_d2h(D, S, gm, dm, n));
        DEV_OK(zn_dev_copy_d2h(D, S, gv, dv, n));
        DEV_OK(zn_dev_copy_d2h(D, S, gam, dam, nb * 4));
        DEV_OK(zn_dev_copy_d2h(D, S, gav, dav, nb * 4));
        DEV_OK(zn_dev_copy_d2h(D, S, gmf, dmf, slots * ZN_Q8_BLOCK * 4));
        DEV_OK(zn_dev_copy_d2h(D, S, gvf, dvf, slots * ZN_Q8_BLOCK * 4));
        DEV_OK(zn_dev_stream_sync(D, S));
        bool scalar = zn_adam_get_isa() == ZN_ISA_SCALAR && !sr;
        int same = !memcmp(gp, p, n * pb) && !memcmp(gm, m, n) && !memcmp(gv, v, n) &&
                   !memcmp(gam, am, nb * 4) && !memcmp(gav, av, nb * 4) &&
                   !memcmp(gmf, mf, slots * ZN_Q8_BLOCK * 4) &&
                   !memcmp(gvf, vf, slots * ZN_Q8_BLOCK * 4);
        /* (the CPU's scalar fp32-master step has no FMA: test_optimizer_mom's
         * bounds cover it; here the bits are checked on the FMA paths) */
        ZT_CHECK_MSG(same || scalar, "[%s] adam (%s master) with fp32 blocks: the device's "
                     "state differs from the CPU's (%s path)", BK, sr ? "bf16" : "fp32",
                     zn_adam_isa_name());
        zn_moments bad = dmv;
        bad.f32_dev = NULL;
        ZT_CHECK(zn_dev_adam_mom(D, S, &hp, (float *)dp, &bad, dg, 1.0f, NULL, ZN_DTYPE_BF16,
                                 8) != 0);
        free(pf), free(g), free(ph), free(m), free(v), free(am), free(av), free(mf), free(vf);
        free(gp), free(gm), free(gv), free(gam), free(gav), free(gmf), free(gvf);
        dfree(dp), dfree(dg), dfree(dm), dfree(dv), dfree(dam), dfree(dav), dfree(dmf);
        dfree(dvf), dfree(druns), dfree(dspan);
    }
}

static int run_backend(const char *name)
{
    zn_dev_config c = zn_dev_config_default();
    c.name = name;
    c.gpu_budget = 64u << 20;
    int rc = zn_dev_create(&D, &c);
    if (rc == ZN_ENODEV) {
        printf("SKIP [%s]: %s\n", name, zn_last_error());
        return 0;
    }
    BK = name;
    DEV_OK(rc);
    if (rc)
        return 1;
    DEV_OK(zn_dev_stream_create(D, "kernels", &S));
    for (int k = 0; k < 2; k++) {
        zn_dtype dt = k ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
        test_embedding(dt);
        test_rmsnorm(dt);
        test_rmsnorm_heads(dt, 0.0f);
        test_rmsnorm_heads(dt, 1.0f); /* Gemma's (1 + w) */
        test_rope(dt);
        test_softmax(dt);
        test_swiglu(dt, 0);
        test_swiglu(dt, 1);
        test_dropout(dt);
        test_elementwise(dt);
        test_bias(dt);
        test_xent(dt, 0.0);
        test_xent(dt, 3.0); /* Gemma 2's final_logit_softcapping */
        test_reduce(dt);
        test_flash(dt);
        test_softcap(dt);
        test_rows(dt);
    }
    test_cast();
    test_optimizer();
    test_optimizer_mom();
    test_optimizer_sr();
    test_optimizer_f32_runs();
    zn_dev_mem m;
    zn_dev_mem_stats(D, &m);
    ZT_CHECK_MSG(m.n_allocs == 0, "[%s] test leaked %llu device buffers", name,
                 (unsigned long long)m.n_allocs);
    zn_dev_stream_destroy(D, S);
    zn_dev_destroy(D);
    printf("[%s] kernels done\n", name);
    return 1;
}

int main(void)
{
    int ran = 0;
    test_inv_freq();
    ran += run_backend("host");
    ran += run_backend("cuda");
    if (!ran)
        ZT_SKIP("no backend could be created");
    return zt_done();
}
