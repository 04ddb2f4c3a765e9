/* The fused CPU Adam/AdamW step against a double-precision reference:
 * 10 steps on seeded data for every SIMD path this CPU has, every gradient
 * and copy dtype, bias correction on/off, no / L2 / decoupled weight decay,
 * sizes 1 .. 1000003, unaligned arrays; bit-identical results across thread
 * counts and repeated runs; the 16-bit copy bit-exact, special values too. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/optim.h"
#include "optim/optim-impl.h"
#include "zt.h"

#define STEPS 10
#define TOL 1e-6
#define GUARD 40          /* poisoned elements after each array */
#define POISON_F 0x7fbadbadu
#define POISON_H 0x7dadu

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* uniform in [0, 1), a function of (seed, stream, i) */
static double unif(uint64_t seed, uint64_t stream, uint64_t i)
{
    return (double)(mix(mix(seed * 1000003u + stream) ^ i) >> 11) * 0x1p-53;
}

static double sgn(uint64_t seed, uint64_t i)
{
    return (mix(seed ^ (i * 7919u)) & 1) ? 1.0 : -1.0;
}

/* Data sets. Coherent: p, m and every gradient of element i share one sign
 * and stay away from zero, so no value crosses zero in 10 steps and the
 * plain elementwise relative error is meaningful. Mixed: independent signs
 * and magnitudes; values cross zero, so its error is measured against the
 * largest reference value of the array (normwise). */
enum { DATA_COHERENT, DATA_MIXED };

typedef struct {
    size_t n;
    int data, zero_state;
    zn_dtype gt;
    float *p0, *m0, *v0;          /* initial state */
    float *gval[STEPS];           /* gradient values (exact in gt) */
    void *graw[STEPS];            /* the same in gt's layout */
} dataset;

static void *xmalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64))
        ZT_SETUP_FAIL("out of memory (%zu bytes)", bytes);
    return p;
}

static float rnd_dtype(float x, zn_dtype t)
{
    if (t == ZN_DTYPE_BF16)
        return zn_bf16_to_f32(zn_f32_to_bf16(x));
    if (t == ZN_DTYPE_F16)
        return zn_f16_to_f32(zn_f32_to_f16(x));
    return x;
}

static void make_dataset(dataset *d, size_t n, int data, int zero_state, zn_dtype gt,
                         uint64_t seed)
{
    memset(d, 0, sizeof *d);
    d->n = n;
    d->data = data;
    d->zero_state = zero_state;
    d->gt = gt;
    d->p0 = xmalloc(n * 4);
    d->m0 = xmalloc(n * 4);
    d->v0 = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        double s = sgn(seed, i);
        if (data == DATA_COHERENT) {
            d->p0[i] = (float)(s * (0.5 + unif(seed, 1, i)));
            d->m0[i] = zero_state ? 0.0f : (float)(s * (0.01 + 0.1 * unif(seed, 2, i)));
        } else {
            d->p0[i] = (float)(2.0 * unif(seed, 1, i) - 1.0);
            d->m0[i] = zero_state ? 0.0f : (float)(0.2 * unif(seed, 2, i) - 0.1);
        }
        d->v0[i] = zero_state ? 0.0f : (float)(1e-4 + 0.01 * unif(seed, 3, i));
    }
    for (int t = 0; t < STEPS; t++) {
        d->gval[t] = xmalloc(n * 4);
        d->graw[t] = xmalloc(n * zn_dtype_size(gt));
        for (size_t i = 0; i < n; i++) {
            double u = unif(seed, 10 + (uint64_t)t, i);
            double x = data == DATA_COHERENT ? sgn(seed, i) * (0.05 + u) : 2.0 * u - 1.0;
            float f = rnd_dtype((float)x, gt);
            d->gval[t][i] = f;
            if (gt == ZN_DTYPE_F32)
                ((float *)d->graw[t])[i] = f;
            else if (gt == ZN_DTYPE_BF16)
                ((uint16_t *)d->graw[t])[i] = zn_f32_to_bf16(f);
            else
                ((uint16_t *)d->graw[t])[i] = zn_f32_to_f16(f);
        }
    }
}

static void free_dataset(dataset *d)
{
    free(d->p0);
    free(d->m0);
    free(d->v0);
    for (int t = 0; t < STEPS; t++) {
        free(d->gval[t]);
        free(d->graw[t]);
    }
}

/* The double-precision reference: the formula of optim.h, written afresh. */
static void reference(const dataset *d, const zn_adam_params *hp0, float g_scale, double *p,
                      double *m, double *v)
{
    size_t n = d->n;
    for (size_t i = 0; i < n; i++) {
        p[i] = d->p0[i];
        m[i] = d->m0[i];
        v[i] = d->v0[i];
    }
    for (int t = 0; t < STEPS; t++) {
        double b1 = hp0->beta1, b2 = hp0->beta2, lr = hp0->lr, wd = hp0->weight_decay;
        double eps = hp0->eps;
        long long step = hp0->step + t;
        double bc1 = hp0->bias_correction ? 1 - pow(b1, (double)step) : 1;
        double bc2 = hp0->bias_correction ? 1 - pow(b2, (double)step) : 1;
        for (size_t i = 0; i < n; i++) {
            double g = (double)d->gval[t][i] * (double)g_scale;
            if (wd != 0 && !hp0->adamw_mode)
                g += wd * p[i];
            m[i] = b1 * m[i] + (1 - b1) * g;
            v[i] = b2 * v[i] + (1 - b2) * g * g;
            if (wd != 0 && hp0->adamw_mode)
                p[i] -= lr * wd * p[i];
            p[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
        }
    }
}

/* Error of x against the reference: elementwise relative for coherent
 * data, normwise (against max |ref|) for mixed data. */
static double max_err(const float *x, const double *ref, size_t n, int data)
{
    double scale = 0, worst = 0;
    if (data == DATA_MIXED)
        for (size_t i = 0; i < n; i++)
            scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double den = data == DATA_MIXED ? scale : fabs(ref[i]);
        double e = fabs((double)x[i] - ref[i]) / (den > 0 ? den : 1);
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

typedef struct {
    float *p, *m, *v;
    void *g;
    uint16_t *c;
    void *blk[5];
} run_bufs;

/* Arrays at odd offsets from 64-byte alignment when `unaligned`, each with
 * GUARD poisoned elements after the end. */
static void bufs_alloc(run_bufs *b, size_t n, zn_dtype gt, int unaligned)
{
    size_t off = unaligned ? 1 : 0;
    size_t gs = zn_dtype_size(gt);
    for (int i = 0; i < 5; i++)
        b->blk[i] = xmalloc((n + GUARD + 8) * 4);
    b->p = (float *)b->blk[0] + off;
    b->m = (float *)b->blk[1] + 3 * off;
    b->v = (float *)b->blk[2] + 5 * off;
    b->g = (char *)b->blk[3] + 7 * off * gs;
    b->c = (uint16_t *)b->blk[4] + 3 * off;
}

static void bufs_free(run_bufs *b)
{
    for (int i = 0; i < 5; i++)
        free(b->blk[i]);
}

static void poison(run_bufs *b, size_t n)
{
    uint32_t pf = POISON_F;
    for (size_t i = n; i < n + GUARD; i++) {
        memcpy(&b->p[i], &pf, 4);
        memcpy(&b->m[i], &pf, 4);
        memcpy(&b->v[i], &pf, 4);
    }
    for (size_t i = 0; i < n + GUARD; i++)
        b->c[i] = POISON_H;
}

static int guards_intact(const run_bufs *b, size_t n, int copy)
{
    for (size_t i = n; i < n + GUARD; i++) {
        if (zn_f32_bits(b->p[i]) != POISON_F || zn_f32_bits(b->m[i]) != POISON_F ||
            zn_f32_bits(b->v[i]) != POISON_F)
            return 0;
        if (copy && b->c[i] != POISON_H)
            return 0;
    }
    return 1;
}

/* Runs STEPS steps of `kern` on d into b. Returns the first error code. */
static int run_steps(zn_adam_kernel_fn kern, const dataset *d, run_bufs *b,
                     const zn_adam_params *hp0, float g_scale, zn_dtype ct, int copy)
{
    size_t n = d->n, gs = zn_dtype_size(d->gt);
    memcpy(b->p, d->p0, n * 4);
    memcpy(b->m, d->m0, n * 4);
    memcpy(b->v, d->v0, n * 4);
    poison(b, n);
    for (int t = 0; t < STEPS; t++) {
        zn_adam_params hp = *hp0;
        hp.step = hp0->step + t;
        memcpy(b->g, d->graw[t], n * gs);
        int rc = kern ? zn_adam_step_with(kern, &hp, b->p, b->m, b->v, b->g, d->gt, g_scale,
                                          copy ? b->c : NULL, ct, n)
                      : zn_adam_step(&hp, b->p, b->m, b->v, b->g, d->gt, g_scale,
                                     copy ? b->c : NULL, ct, n);
        if (rc)
            return rc;
    }
    return 0;
}

static size_t copy_mismatches(const run_bufs *b, size_t n, zn_dtype ct)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t want = ct == ZN_DTYPE_BF16 ? zn_f32_to_bf16(b->p[i]) : zn_f32_to_f16(b->p[i]);
        bad += b->c[i] != want;
    }
    return bad;
}

static const zn_isa all_isas[] = { ZN_ISA_SCALAR, ZN_ISA_AVX2, ZN_ISA_AVX512 };
static const zn_dtype gtypes[] = { ZN_DTYPE_F32, ZN_DTYPE_BF16, ZN_DTYPE_F16 };
/* copy: 0 none, else the dtype */
static const struct { int on; zn_dtype t; } ctypes[] = {
    { 0, ZN_DTYPE_BF16 }, { 1, ZN_DTYPE_BF16 }, { 1, ZN_DTYPE_F16 } };
static const char *wd_names[] = { "no wd", "L2 wd", "decoupled wd" };

static double worst_seen[4];

/* The whole matrix for one size. */
static void check_size(size_t n, int full, uint64_t seed)
{
    for (int data = DATA_COHERENT; data <= DATA_MIXED; data++) {
        if (!full && data == DATA_MIXED)
            continue;
        for (size_t gi = 0; gi < 3; gi++) {
            for (int bc = 0; bc <= 1; bc++) {
                dataset d;
                make_dataset(&d, n, data, bc /* zero state with bias correction */,
                             gtypes[gi], seed + (uint64_t)n * 31 + gi * 7 + (uint64_t)bc);
                double *rp = xmalloc(n * 8), *rm = xmalloc(n * 8), *rv = xmalloc(n * 8);
                for (int wd = 0; wd < 3; wd++) {
                    /* the big size: two of the six (bc, wd) pairs */
                    if (!full && !((bc == 1 && wd == 2) || (bc == 0 && wd == 1)))
                        continue;
                    zn_adam_params hp = zn_adam_params_default();
                    hp.lr = 1e-3f;
                    hp.weight_decay = wd ? 0.1f : 0.0f;
                    hp.adamw_mode = wd == 2;
                    hp.bias_correction = bc;
                    hp.step = bc ? 1 : 100;
                    const float gsc = 0.75f;
                    reference(&d, &hp, gsc, rp, rm, rv);
                    for (size_t ii = 0; ii < 3; ii++) {
                        const zn_optim_ops *ops = zn_optim_get_ops(all_isas[ii]);
                        if (!ops)
                            continue;
                        for (size_t ci = 0; ci < 3; ci++) {
                            run_bufs b;
                            int unaligned = !full ? (int)((ci + gi) & 1) : 1;
                            bufs_alloc(&b, n, d.gt, unaligned);
                            int rc = run_steps(ops->adam, &d, &b, &hp, gsc, ctypes[ci].t,
                                               ctypes[ci].on);
                            double ep = max_err(b.p, rp, n, data);
                            double em = max_err(b.m, rm, n, data);
                            double ev = max_err(b.v, rv, n, data);
                            double e = fmax(ep, fmax(em, ev));
                            if (e > worst_seen[all_isas[ii]])
                                worst_seen[all_isas[ii]] = e;
                            size_t badc = ctypes[ci].on ? copy_mismatches(&b, n, ctypes[ci].t)
                                                        : 0;
                            ZT_CHECK_MSG(rc == 0 && e <= TOL && badc == 0 &&
                                         guards_intact(&b, n, ctypes[ci].on),
                                         "%s n=%zu %s g=%s copy=%s bc=%d %s %s: rc %d, "
                                         "max err p %.3g m %.3g v %.3g, %zu bad copies, "
                                         "guards %s", ops->name, n,
                                         data ? "mixed" : "coherent",
                                         zn_dtype_name(d.gt),
                                         ctypes[ci].on ? zn_dtype_name(ctypes[ci].t) : "none",
                                         bc, wd_names[wd], unaligned ? "unaligned" : "aligned",
                                         rc, ep, em, ev, badc,
                                         guards_intact(&b, n, ctypes[ci].on) ? "ok" : "HIT");
                            bufs_free(&b);
                        }
                    }
                }
                free(rp);
                free(rm);
                free(rv);
                free_dataset(&d);
            }
        }
    }
}

/* Same bits for 1, 2 and 3 threads and for a repeated run, per path. */
static void check_threads(void)
{
    const size_t n = 300007;   /* > 3 * 32768: three threads really split it */
    for (size_t ii = 0; ii < 3; ii++) {
        const zn_optim_ops *ops = zn_optim_get_ops(all_isas[ii]);
        if (!ops)
            continue;
        for (size_t gi = 0; gi < 3; gi++) {
            dataset d;
            make_dataset(&d, n, DATA_MIXED, 0, gtypes[gi], 99 + gi);
            zn_adam_params hp = zn_adam_params_default();
            hp.weight_decay = 0.01f;
            run_bufs ref, b;
            bufs_alloc(&ref, n, d.gt, 1);
            bufs_alloc(&b, n, d.gt, 1);
            hp.threads = 1;
            int rc = run_steps(ops->adam, &d, &ref, &hp, 1.0f, ZN_DTYPE_BF16, 1);
            const int tcount[] = { 2, 3, 2, 1 };
            for (int k = 0; k < 4; k++) {
                hp.threads = tcount[k];
                rc |= run_steps(ops->adam, &d, &b, &hp, 1.0f, ZN_DTYPE_BF16, 1);
                ZT_CHECK_MSG(rc == 0 && !memcmp(b.p, ref.p, n * 4) &&
                             !memcmp(b.m, ref.m, n * 4) && !memcmp(b.v, ref.v, n * 4) &&
                             !memcmp(b.c, ref.c, n * 2),
                             "%s g=%s: %d threads (run %d) differ from 1 thread (rc %d)",
                             ops->name, zn_dtype_name(d.gt), tcount[k], k, rc);
            }
            bufs_free(&ref);
            bufs_free(&b);
            free_dataset(&d);
        }
    }
}

/* The two SIMD paths follow the same operation order: same bits. */
static void check_simd_agree(void)
{
    const zn_optim_ops *a = zn_optim_get_ops(ZN_ISA_AVX2), *b = zn_optim_get_ops(ZN_ISA_AVX512);
    if (!a || !b) {
        printf("note: AVX2 vs AVX-512 bit-identity not checked: %s missing on this CPU\n",
               !a ? "AVX2" : "AVX-512");
        return;
    }
    const size_t n = 100003;
    for (size_t gi = 0; gi < 3; gi++) {
        for (size_t ci = 1; ci < 3; ci++) {
            dataset d;
            make_dataset(&d, n, DATA_MIXED, 0, gtypes[gi], 5 + gi);
            zn_adam_params hp = zn_adam_params_default();
            hp.weight_decay = 0.05f;
            hp.adamw_mode = (int)(ci & 1);
            run_bufs x, y;
            bufs_alloc(&x, n, d.gt, 1);
            bufs_alloc(&y, n, d.gt, 0);
            int rc = run_steps(a->adam, &d, &x, &hp, 0.5f, ctypes[ci].t, 1);
            rc |= run_steps(b->adam, &d, &y, &hp, 0.5f, ctypes[ci].t, 1);
            ZT_CHECK_MSG(rc == 0 && !memcmp(x.p, y.p, n * 4) && !memcmp(x.m, y.m, n * 4) &&
                         !memcmp(x.v, y.v, n * 4) && !memcmp(x.c, y.c, n * 2),
                         "avx2 and avx512 differ: g=%s copy=%s", zn_dtype_name(d.gt),
                         zn_dtype_name(ctypes[ci].t));
            bufs_free(&x);
            bufs_free(&y);
            free_dataset(&d);
        }
    }
}

/* lr = 0 leaves p as it is (a NaN only gets quiet): the kernel's copy of
 * ties, subnormals, Inf, NaN and the overflow edges must equal the scalar
 * rounding, which tests/test_half.c checks exhaustively. */
static void check_special_copies(void)
{
    static const uint32_t edges[] = {
        0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00007fff, 0x00008000,
        0x00008001, 0x00018000, 0x007fffff, 0x00800000, 0x3f808000, 0x3f818000,
        0x3f808001, 0x3f807fff, 0xbf808000, 0x7f7f7fff, 0x7f7f8000, 0x7f7fffff,
        0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001,
        0xff800001, 0x7fbfffff, 0x7fc0ffff, 0x477fe000, 0x477fefff, 0x477ff000,
        0x477ff001, 0x33000000, 0x33000001, 0x337fffff, 0x33800000, 0x33c00000,
        0x38800000, 0x387fffff, 0x387fc000, 0x38000000, 0x3f800fff, 0x3f801000,
        0x3f801001, 0x3f803000, 0x3f802fff, 0xc7800000, 0x477fffff,
    };
    static const uint32_t lows16[] = { 0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff };
    static const uint32_t lows13[] = { 0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff };
    /* every bf16 value with tie / near-tie low halves, every f16 rounding
     * position (19 high bits) with tie / near-tie low bits, the edges, and
     * the whole f16-subnormal exponent range at a stride */
    size_t n = 65536 * 6 + 524288 * 6 + sizeof edges / 4 + (size_t)(0x38800000 - 0x33000000) / 61 + 1;
    uint32_t *in = xmalloc(n * 4);
    size_t k = 0;
    for (uint32_t hi = 0; hi < 65536; hi++)
        for (size_t j = 0; j < 6; j++)
            in[k++] = hi << 16 | lows16[j];
    for (uint32_t hi = 0; hi < 524288; hi++)
        for (size_t j = 0; j < 6; j++)
            in[k++] = hi << 13 | lows13[j];
    for (size_t j = 0; j < sizeof edges / 4; j++)
        in[k++] = edges[j];
    for (uint32_t u = 0x33000000; u < 0x38800000 && k < n; u += 61)
        in[k++] = u;
    n = k;

    for (size_t ii = 0; ii < 3; ii++) {
        const zn_optim_ops *ops = zn_optim_get_ops(all_isas[ii]);
        if (!ops)
            continue;
        for (size_t ci = 1; ci < 3; ci++) {
            for (int aligned = 0; aligned <= 1; aligned++) {
                run_bufs b;
                bufs_alloc(&b, n, ZN_DTYPE_F32, !aligned);
                memcpy(b.p, in, n * 4);
                memset(b.m, 0, n * 4);
                memset(b.v, 0, n * 4);
                memset(b.g, 0, n * 4);
                poison(&b, n);
                zn_adam_params hp = zn_adam_params_default();
                hp.lr = 0;
                hp.eps = 1;
                hp.bias_correction = 0;
                int rc = zn_adam_step_with(ops->adam, &hp, b.p, b.m, b.v, b.g, ZN_DTYPE_F32,
                                           1.0f, b.c, ctypes[ci].t, n);
                size_t moved = 0, badc = 0;
                for (size_t i = 0; i < n; i++) {
                    uint32_t u = zn_f32_bits(b.p[i]);
                    int nan_in = (in[i] & 0x7fffffff) > 0x7f800000;
                    if (nan_in ? (u != (in[i] | 0x00400000u)) : (u != in[i]))
                        moved++;
                    uint16_t want = ctypes[ci].t == ZN_DTYPE_BF16 ? zn_f32_to_bf16(b.p[i])
                                                                  : zn_f32_to_f16(b.p[i]);
                    /* the copy of the *input*: a quieted NaN rounds the same */
                    uint16_t want_in = ctypes[ci].t == ZN_DTYPE_BF16
                                           ? zn_f32_to_bf16(zn_bits_f32(in[i]))
                                           : zn_f32_to_f16(zn_bits_f32(in[i]));
                    if (b.c[i] != want || b.c[i] != want_in) {
                        if (badc < 5)
                            fprintf(stderr, "  %s %s: 0x%08x -> 0x%04x, want 0x%04x\n",
                                    ops->name, zn_dtype_name(ctypes[ci].t), (unsigned)in[i],
                                    (unsigned)b.c[i], (unsigned)want_in);
                        badc++;
                    }
                }
                ZT_CHECK_MSG(rc == 0 && moved == 0 && badc == 0 && guards_intact(&b, n, 1),
                             "%s copy %s %s: rc %d, %zu params changed, %zu copies differ "
                             "from the scalar rounding", ops->name,
                             zn_dtype_name(ctypes[ci].t), aligned ? "aligned" : "unaligned",
                             rc, moved, badc);
                bufs_free(&b);
            }
        }
    }
    free(in);
}

static void check_api(void)
{
    float p[4] = { 1, 2, 3, 4 }, m[4] = { 0 }, v[4] = { 0 }, g[4] = { 1, 1, 1, 1 };
    zn_adam_params hp = zn_adam_params_default();
    ZT_EQ_INT(zn_adam_step(&hp, p, m, v, g, ZN_DTYPE_F32, 1, NULL, ZN_DTYPE_F32, 0), 0);
    ZT_EQ_INT(zn_adam_step(&hp, NULL, m, v, g, ZN_DTYPE_F32, 1, NULL, ZN_DTYPE_F32, 4),
              -EINVAL);
    ZT_CONTAINS(zn_last_error(), "param");
    ZT_EQ_INT(zn_adam_step(&hp, p, m, v, g, (zn_dtype)7, 1, NULL, ZN_DTYPE_F32, 4), -EINVAL);
    ZT_EQ_INT(zn_adam_step(&hp, p, m, v, g, ZN_DTYPE_F32, 1, p, ZN_DTYPE_F32, 4), -EINVAL);
    ZT_EQ_INT(zn_adam_step(&hp, p, m, v, g, ZN_DTYPE_F32, NAN, NULL, ZN_DTYPE_F32, 4), -EINVAL);
    hp.step = 0;
    ZT_EQ_INT(zn_adam_step(&hp, p, m, v, g, ZN_DTYPE_F32, 1, NULL, ZN_DTYPE_F32, 4), -EINVAL);
    ZT_CONTAINS(zn_last_error(), "step 0");
    hp.bias_correction = 0;   /* step 0 is fine without bias correction */
    ZT_EQ_INT(zn_adam_step(&hp, p, m, v, g, ZN_DTYPE_F32, 1, NULL, ZN_DTYPE_F32, 4), 0);
    hp = zn_adam_params_default();
    hp.beta2 = 1.0f;
    ZT_EQ_INT(zn_adam_step(&hp, p, m, v, g, ZN_DTYPE_F32, 1, NULL, ZN_DTYPE_F32, 4), -EINVAL);
    hp = zn_adam_params_default();
    hp.eps = -1e-8f;
    ZT_EQ_INT(zn_adam_step(&hp, p, m, v, g, ZN_DTYPE_F32, 1, NULL, ZN_DTYPE_F32, 4), -EINVAL);

    ZT_EQ_INT(zn_adam_set_isa((zn_isa)9), -EINVAL);
    ZT_EQ_INT(zn_adam_set_isa(ZN_ISA_SCALAR), 0);
    ZT_EQ_INT(zn_adam_get_isa(), ZN_ISA_SCALAR);
    ZT_EQ_STR(zn_adam_isa_name(), "scalar");
    for (size_t i = 1; i < 3; i++) {
        int avail = zn_adam_isa_available(all_isas[i]);
        int rc = zn_adam_set_isa(all_isas[i]);
        ZT_EQ_INT(rc, avail ? 0 : ZN_EUNSUPPORTED);
        ZT_EQ_STR(zn_adam_isa_name(), avail ? zn_isa_name(all_isas[i]) : "scalar");
        ZT_EQ_INT(zn_adam_set_isa(ZN_ISA_SCALAR), 0);
    }
    ZT_EQ_INT(zn_adam_set_isa(ZN_ISA_AUTO), 0);
    ZT_CHECK(zn_adam_get_isa() != ZN_ISA_AUTO);
    ZT_EQ_INT(zn_adam_isa_available(ZN_ISA_SCALAR), 1);
    ZT_EQ_STR(zn_isa_name(ZN_ISA_AVX512), "avx512");

    /* the public entry follows the chosen path: same bits as that kernel */
    for (size_t ii = 0; ii < 3; ii++) {
        if (!zn_adam_isa_available(all_isas[ii]))
            continue;
        dataset d;
        make_dataset(&d, 5003, DATA_MIXED, 0, ZN_DTYPE_BF16, 11);
        run_bufs x, y;
        bufs_alloc(&x, d.n, d.gt, 1);
        bufs_alloc(&y, d.n, d.gt, 1);
        hp = zn_adam_params_default();
        ZT_EQ_INT(zn_adam_set_isa(all_isas[ii]), 0);
        int rc = run_steps(NULL, &d, &x, &hp, 1, ZN_DTYPE_BF16, 1);
        rc |= run_steps(zn_optim_get_ops(all_isas[ii])->adam, &d, &y, &hp, 1, ZN_DTYPE_BF16,
                        1);
        ZT_CHECK_MSG(rc == 0 && !memcmp(x.p, y.p, d.n * 4) && !memcmp(x.c, y.c, d.n * 2),
                     "zn_adam_step under %s differs from its kernel", zn_isa_name(all_isas[ii]));
        bufs_free(&x);
        bufs_free(&y);
        free_dataset(&d);
    }
    ZT_EQ_INT(zn_adam_set_isa(ZN_ISA_AUTO), 0);
}

int main(void)
{
    printf("paths: ");
    for (size_t i = 0; i < 3; i++) {
        if (zn_adam_isa_available(all_isas[i]))
            printf("%s ", zn_isa_name(all_isas[i]));
        else
            printf("(%s: skipped, not supported by this CPU) ", zn_isa_name(all_isas[i]));
    }
    printf("; auto picks %s\n", zn_adam_isa_name());

    check_api();
    static const size_t sizes[] = { 1, 7, 15, 16, 17, 33, 1000 };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        check_size(sizes[i], 1, 1234);
    check_size(1000003, 0, 77);
    for (size_t i = 0; i < 3; i++)
        if (zn_adam_isa_available(all_isas[i]))
            printf("%-7s worst error vs double reference: %.3g (limit %.0e)\n",
                   zn_isa_name(all_isas[i]), worst_seen[all_isas[i]], TOL);
    check_threads();
    check_simd_agree();
    check_special_copies();
    return zt_done();
}
