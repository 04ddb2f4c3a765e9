/* bf16 master weights with stochastic rounding (zn_adam_step_sr), every
 * SIMD path, every moment format:
 *  - each new p is one of the two bf16 neighbours bracketing the fp32
 *    result of the existing fp32 step (the AVX2 kernel, zn_adam_step /
 *    zn_adam_step_mom on the widened p and the same moments), and equal
 *    to it where that result is a bf16 value; the moments equal that
 *    step's bit for bit;
 *  - the rounding goes up as often as the fraction says: per fraction
 *    over many elements, and summed over a whole step, within a bound
 *    from the binomial standard deviation (derived below);
 *  - the same bits on every path, for 1, 2 and 3 threads, run to run, and
 *    with the index crossing 2^32 (the hash key changes there);
 *  - with the indices in runs (zn_adam_step_sr_spans: a rank's share of
 *    the model), each element rounds as a one-run step whose index0 gives
 *    it the same index, the moments are the one-run step's (8-bit blocks
 *    stepped whole across a run's edge), on every path and thread count;
 *    spans that do not tile the elements are refused;
 *  - NaN stays NaN, Inf stays Inf, a finite value never becomes Inf;
 *  - bad arguments are refused. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/optim.h"
#include "optim/optim-impl.h"
#include "zt.h"

static void *xmalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64))
        ZT_SETUP_FAIL("out of memory (%zu bytes)", bytes);
    return p;
}

static double unif(uint64_t seed, uint64_t i)
{
    return (double)(zn_splitmix64(zn_splitmix64(seed) ^ i) >> 11) * 0x1p-53;
}

static const zn_isa all_isas[] = { ZN_ISA_SCALAR, ZN_ISA_AVX2, ZN_ISA_AVX512 };

/* One data set: bf16 params, fp32 gradients over four decades, moments in
 * fp32 (converted to the format under test). */
typedef struct {
    size_t n;
    uint16_t *p;
    float *g, *m, *v;
} data;

static void make_data(data *d, size_t n, uint64_t seed)
{
    d->n = n;
    d->p = xmalloc(n * 2);
    d->g = xmalloc(n * 4);
    d->m = xmalloc(n * 4);
    d->v = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        double s = unif(seed, 4 * i) < 0.5 ? -1 : 1;
        d->p[i] = zn_f32_to_bf16((float)(s * (0.01 + unif(seed, 4 * i + 1))));
        double gm = pow(10.0, -4.0 * unif(seed, 4 * i + 2));
        d->g[i] = (float)((unif(seed, 4 * i + 3) - 0.5) * gm);
        d->m[i] = 0.1f * d->g[i];
        d->v[i] = 0.01f * d->g[i] * d->g[i];
    }
}

static void free_data(data *d)
{
    free(d->p);
    free(d->g);
    free(d->m);
    free(d->v);
}

/* Moments of fmt for n elements in the trainer's layout, from fp32 values. */
typedef struct {
    void *m, *v;
    zn_moments mv;
} moms;

static void make_moms(moms *o, zn_mom_fmt fmt, zn_q8_scheme scheme, const data *d)
{
    size_t bytes = zn_mom_layout_bytes(fmt, d->n);
    o->m = xmalloc(bytes);
    o->v = xmalloc(bytes);
    o->mv = zn_mom_layout_at(fmt, o->m, o->v, d->n, 0);
    o->mv.scheme = scheme;
    zn_moments src = zn_moments_of(ZN_MOM_F32, d->m, d->v, NULL, NULL, ZN_Q8_BNB);
    if (zn_mom_convert(&o->mv, &src, d->n))
        ZT_SETUP_FAIL("zn_mom_convert: %s", zn_last_error());
}

static void copy_moms(moms *dst, const moms *src, size_t n)
{
    size_t bytes = zn_mom_layout_bytes(src->mv.fmt, n);
    dst->m = xmalloc(bytes);
    dst->v = xmalloc(bytes);
    memcpy(dst->m, src->m, bytes);
    memcpy(dst->v, src->v, bytes);
    dst->mv = zn_mom_layout_at(src->mv.fmt, dst->m, dst->v, n, 0);
    dst->mv.scheme = src->mv.scheme;
}

static void free_moms(moms *o)
{
    free(o->m);
    free(o->v);
}

static int same_moms(const moms *a, const moms *b, size_t n)
{
    size_t bytes = zn_mom_layout_bytes(a->mv.fmt, n);
    return !memcmp(a->m, b->m, bytes) && !memcmp(a->v, b->v, bytes);
}

static zn_adam_params params(int wd_mode)
{
    zn_adam_params hp = zn_adam_params_default();
    hp.lr = 2e-3f;
    hp.step = 7;
    hp.weight_decay = wd_mode ? 0.1f : 0.0f;
    hp.adamw_mode = wd_mode == 2;
    hp.threads = 1;
    return hp;
}

/* magnitude truncation of x to bf16 (the lower neighbour toward zero) */
static uint16_t trunc16(float x)
{
    return (uint16_t)(zn_f32_bits(x) >> 16);
}

static const struct { zn_mom_fmt fmt; zn_q8_scheme scheme; const char *name; } formats[] = {
    { ZN_MOM_F32, ZN_Q8_BNB, "fp32" }, { ZN_MOM_BF16, ZN_Q8_BNB, "bf16" },
    { ZN_MOM_Q8, ZN_Q8_BNB, "int8 bnb" }, { ZN_MOM_Q8, ZN_Q8_TORCHAO, "int8 torchao" },
};

/* ---- the bracket, the moments, and unbiasedness over a whole step ------ */
static void check_bracket(void)
{
    const zn_optim_ops *ref = zn_optim_get_ops(ZN_ISA_AVX2);
    if (!ref) {
        printf("note: bracket check skipped: no AVX2 here for the fp32 reference step\n");
        return;
    }
    const size_t n = 100003;
    const uint64_t seed = 42, index0 = 1000;
    data d;
    make_data(&d, n, 7);
    float *pf = xmalloc(n * 4);
    uint16_t *p = xmalloc(n * 2);
    for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; fi++) {
        for (int wd = 0; wd < 3; wd++) {
            zn_adam_params hp = params(wd);
            moms base, rm;
            make_moms(&base, formats[fi].fmt, formats[fi].scheme, &d);
            copy_moms(&rm, &base, n);
            for (size_t i = 0; i < n; i++)
                pf[i] = zn_bf16_to_f32(d.p[i]);
            int rc = zn_adam_step_mom_with(ref, &hp, pf, &rm.mv, d.g, ZN_DTYPE_F32, 0.5f, NULL,
                                           ZN_DTYPE_BF16, n);
            ZT_CHECK_MSG(rc == 0, "reference step: %s", zn_last_error());
            for (size_t ii = 0; ii < 3; ii++) {
                const zn_optim_ops *ops = zn_optim_get_ops(all_isas[ii]);
                if (!ops)
                    continue;
                moms sm;
                copy_moms(&sm, &base, n);
                memcpy(p, d.p, n * 2);
                rc = zn_adam_step_sr_with(ops, &hp, p, &sm.mv, d.g, ZN_DTYPE_F32, 0.5f, seed,
                                          index0, n);
                size_t outside = 0, exact_moved = 0, ups = 0;
                /* sum of (up - fraction) and of fraction * (1 - fraction):
                 * the mean and variance of the count of rounds up */
                double dev = 0, var = 0;
                for (size_t i = 0; i < n; i++) {
                    uint16_t lo = trunc16(pf[i]);
                    uint32_t frac = zn_f32_bits(pf[i]) & 0xffffu;
                    if (frac == 0) {
                        exact_moved += p[i] != lo;
                        continue;
                    }
                    if (p[i] != lo && p[i] != (uint16_t)(lo + 1)) {
                        outside++;
                        continue;
                    }
                    double f = frac / 65536.0;
                    int up = p[i] != lo;
                    ups += (size_t)up;
                    dev += up - f;
                    var += f * (1 - f);
                }
                /* The count of rounds up is a sum of independent Bernoulli
                 * draws with p_i = fraction_i (if the hash's bits are
                 * uniform and independent), so its mean is sum p_i and its
                 * standard deviation sqrt(sum p_i (1 - p_i)) (~140 here).
                 * 5 sigma: a good source fails with probability 5.7e-7 per
                 * check (24 checks: 1.4e-5). A biased rounding (e.g. round
                 * to nearest, or truncation) misses it by ~n/4 = 25000. */
                double bound = 5 * sqrt(var);
                ZT_CHECK_MSG(rc == 0 && outside == 0 && exact_moved == 0 &&
                             fabs(dev) <= bound && same_moms(&sm, &rm, n),
                             "%s moments %s wd %d: rc %d, %zu outside the bracket, %zu exact "
                             "values moved, rounds up %zu: %+.1f from the mean (bound %.1f), "
                             "moments %s", ops->name, formats[fi].name, wd, rc, outside,
                             exact_moved, ups, dev, bound,
                             same_moms(&sm, &rm, n) ? "equal" : "DIFFER");
                free_moms(&sm);
            }
            free_moms(&base);
            free_moms(&rm);
        }
    }
    free(pf);
    free(p);
    free_data(&d);
}

/* ---- per fraction: the rounding kernels on values sharing one fraction ---- */
static void check_fractions(void)
{
    const size_t n = 1 << 16;
    static const uint32_t fracs[] = { 1, 0x0100, 0x4000, 0x8000, 0xa000, 0xc000, 0xffff };
    float *x = xmalloc(n * 4);
    uint16_t *out = xmalloc(n * 2);
    for (size_t ii = 0; ii < 3; ii++) {
        const zn_optim_ops *ops = zn_optim_get_ops(all_isas[ii]);
        if (!ops)
            continue;
        for (size_t fi = 0; fi < sizeof fracs / sizeof fracs[0]; fi++) {
            /* random normal bf16 values of both signs, all with the low
             * half fracs[fi] */
            for (size_t i = 0; i < n; i++) {
                uint32_t hi = 0x3000u + (uint32_t)(unif(fi, i) * 0x1e00) +
                              (unif(fi + 100, i) < 0.5 ? 0x8000u : 0u);
                x[i] = zn_bits_f32(hi << 16 | fracs[fi]);
            }
            uint32_t k1, k2;
            zn_sr_key(99, 3, 0, &k1, &k2);
            ops->sr_round(x, out, n, k1, k2, 12345);
            size_t ups = 0, outside = 0;
            for (size_t i = 0; i < n; i++) {
                uint16_t lo = trunc16(x[i]);
                outside += out[i] != lo && out[i] != (uint16_t)(lo + 1);
                ups += out[i] == (uint16_t)(lo + 1);
            }
            /* Binomial(n, q) with q = frac / 65536: mean n q, standard
             * deviation sqrt(n q (1 - q)); 5 sigma, as above, plus 1 for
             * q so small that sigma is below one count (frac 1: mean 1,
             * sigma 1). */
            double q = fracs[fi] / 65536.0, mean = n * q;
            double bound = 5 * sqrt(n * q * (1 - q)) + 1;
            ZT_CHECK_MSG(outside == 0 && fabs((double)ups - mean) <= bound,
                         "%s fraction %#x: %zu of %zu round up, expected %.1f +- %.1f; %zu "
                         "outside the bracket", ops->name, fracs[fi], ups, n, mean, bound,
                         outside);
        }
    }
    free(x);
    free(out);
}

/* ---- the same bits everywhere ---------------------------------------------- */
static void check_same_bits(void)
{
    const size_t n = 300007;   /* > 3 * 32768: three threads really split it */
    data d;
    make_data(&d, n, 11);
    uint16_t *want = xmalloc(n * 2), *p = xmalloc(n * 2);
    /* the index crosses 2^32 at element 1000: the key changes there */
    const uint64_t index0 = ((uint64_t)1 << 32) - 1000, seed = 5;
    for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; fi++) {
        zn_adam_params hp = params(2);
        moms base, first;
        make_moms(&base, formats[fi].fmt, formats[fi].scheme, &d);
        copy_moms(&first, &base, n);
        memcpy(want, d.p, n * 2);
        int rc = zn_adam_step_sr_with(zn_optim_get_ops(ZN_ISA_SCALAR), &hp, want, &first.mv,
                                      d.g, ZN_DTYPE_F32, 1.0f, seed, index0, n);
        ZT_CHECK_MSG(rc == 0, "scalar: %s", zn_last_error());
        for (size_t ii = 0; ii < 3; ii++) {
            const zn_optim_ops *ops = zn_optim_get_ops(all_isas[ii]);
            if (!ops) {
                printf("note: %s not on this CPU: its bits not compared\n",
                       zn_isa_name(all_isas[ii]));
                continue;
            }
            static const int tcount[] = { 1, 2, 3, 2 };
            for (int t = 0; t < 4; t++) {
                moms sm;
                copy_moms(&sm, &base, n);
                memcpy(p, d.p, n * 2);
                hp.threads = tcount[t];
                rc = zn_adam_step_sr_with(ops, &hp, p, &sm.mv, d.g, ZN_DTYPE_F32, 1.0f, seed,
                                          index0, n);
                ZT_CHECK_MSG(rc == 0 && !memcmp(p, want, n * 2) && same_moms(&sm, &first, n),
                             "%s moments %s, %d threads (run %d): differs from the scalar "
                             "path, 1 thread (rc %d)", ops->name, formats[fi].name,
                             tcount[t], t, rc);
                free_moms(&sm);
            }
            hp.threads = 1;
        }
        /* element by element, the public formula: the rounding of the fp32
         * step (the scalar FMA form) with zn_sr_bits of its global index */
        if (formats[fi].fmt == ZN_MOM_F32) {
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                float pf = zn_bf16_to_f32(d.p[i]), m = d.m[i], v = d.v[i];
                zn_adam_consts k;
                if (zn_adam_prepare(&hp, &pf, &m, &v, d.g, ZN_DTYPE_F32, 1.0f, NULL,
                                    ZN_DTYPE_BF16, 1, &k))
                    ZT_SETUP_FAIL("prepare: %s", zn_last_error());
                zn_adam_fma_scalar_kernel(&k, &pf, &m, &v, d.g + i, ZN_DTYPE_F32, NULL,
                                          ZN_DTYPE_BF16, 1);
                bad += want[i] != zn_f32_to_bf16_sr(pf, zn_sr_bits(seed, hp.step, index0 + i));
            }
            ZT_CHECK_MSG(bad == 0, "%zu elements differ from zn_f32_to_bf16_sr(fp32 step, "
                         "zn_sr_bits(seed, step, index))", bad);
        }
        free_moms(&base);
        free_moms(&first);
    }
    /* another step, another seed or another index: other bits */
    ZT_CHECK(zn_sr_bits(1, 1, 5) != zn_sr_bits(1, 2, 5) || zn_sr_bits(1, 1, 6) != zn_sr_bits(1, 2, 6));
    ZT_CHECK(zn_sr_bits(1, 1, 5) != zn_sr_bits(2, 1, 5) || zn_sr_bits(1, 1, 6) != zn_sr_bits(2, 1, 6));
    free(want);
    free(p);
    free_data(&d);
}

/* ---- the fused step against the pieces ------------------------------------
 * Each vector path's fused bf16-master steps (adam_sr for fp32 and bf16
 * moments, q8_sr_step for 8-bit ones under both schemes) against the same
 * path with them off (widen, the fp32 kernel, round or quantize, stochastic
 * rounding, block by block): the same bits for fp32, bf16
 * and fp16 gradients, no decay, L2 and decoupled decay, gradient scaling,
 * every tail length, runs of indices with one crossing 2^32, 1 and 3
 * threads, and NaN and infinite gradients. */
static void check_fused(void)
{
    static const size_t sizes[] = { 1, 7, 15, 16, 17, 255, 257, 4099, 70001 };
    for (size_t ii = 1; ii < 3; ii++) {
        const zn_optim_ops *ops = zn_optim_get_ops(all_isas[ii]);
        if (!ops || (!ops->adam_sr && !ops->q8_sr_step))
            continue;
        zn_optim_ops pieces = *ops;
        pieces.adam_sr = NULL;
        pieces.q8_sr_step = NULL;
        int bad = 0, runs = 0;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            size_t n = sizes[si];
            data d;
            make_data(&d, n, 17 + si);
            d.g[n / 2] = NAN;
            d.g[n / 3] = -INFINITY;
            uint16_t *g16 = xmalloc(n * 2), *p[2];
            /* three runs: the second crosses 2^32, the third lies below; their
             * edges mostly inside 8-bit blocks (which run the pieces) */
            zn_sr_span sp[3] = { { 0, n / 3, 77 },
                                 { n / 3, n / 3, ((uint64_t)1 << 32) - n / 5 - 1 },
                                 { 2 * (n / 3), n - 2 * (n / 3), 3 } };
            size_t ns = 0;
            zn_sr_span use[3];
            for (int k = 0; k < 3; k++)
                if (sp[k].n)
                    use[ns++] = sp[k];
            for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; fi++) {
                for (int var = 0; var < 6; var++) {
                    zn_dtype gt = var % 3 == 0 ? ZN_DTYPE_F32 : var % 3 == 1 ? ZN_DTYPE_BF16
                                                                             : ZN_DTYPE_F16;
                    for (size_t i = 0; i < n; i++)
                        g16[i] = gt == ZN_DTYPE_BF16 ? zn_f32_to_bf16(d.g[i])
                                                     : zn_f16_round(d.g[i]);
                    const void *g = gt == ZN_DTYPE_F32 ? (const void *)d.g : (const void *)g16;
                    zn_adam_params hp = params(var % 3);
                    hp.threads = 1 + 2 * (var / 3);
                    moms base, sm[2];
                    make_moms(&base, formats[fi].fmt, formats[fi].scheme, &d);
                    for (int k = 0; k < 2; k++) {
                        copy_moms(&sm[k], &base, n);
                        p[k] = xmalloc(n * 2);
                        memcpy(p[k], d.p, n * 2);
                        int rc = zn_adam_step_sr_spans_with(k ? &pieces : ops, &hp, p[k],
                                                            &sm[k].mv, g, gt, 0.5f, 11, use, ns,
                                                            n);
                        ZT_CHECK_MSG(rc == 0, "step: %s", zn_last_error());
                    }
                    runs++;
                    if (memcmp(p[0], p[1], n * 2) || !same_moms(&sm[0], &sm[1], n)) {
                        if (bad++ < 3)
                            fprintf(stderr, "%s fused bf16-master step, %s moments: n %zu "
                                    "variant %d differs from the pieces\n", ops->name,
                                    formats[fi].name, n, var);
                    }
                    for (int k = 0; k < 2; k++) {
                        free_moms(&sm[k]);
                        free(p[k]);
                    }
                    free_moms(&base);
                }
            }
            free(g16);
            free_data(&d);
        }
        ZT_CHECK_MSG(bad == 0, "%s: %d of %d fused bf16-master runs differ from the pieces",
                     ops->name, bad, runs);
    }
}

/* ---- indices in runs (zn_adam_step_sr_spans) ------------------------------ */
static void check_spans(void)
{
    const size_t n = 70001;
    data d;
    make_data(&d, n, 13);
    /* runs of 1 element to 30000, most not on an 8-bit block's edge, their
     * indices apart (other ranks' shares between them), one crossing 2^32
     * (the key changes inside it) and one below the first (the runs need
     * not rise) */
    static const uint64_t lens[] = { 1, 7, 300, 255, 1000, 257, 30000, 3, 511, 12000 };
    zn_sr_span sp[64];
    size_t ns = 0;
    uint64_t index = 5000;
    for (size_t off = 0; off < n; ns++) {
        uint64_t len = lens[ns % (sizeof lens / sizeof lens[0])];
        if (len > n - off)
            len = n - off;
        if (ns == 6)
            index = ((uint64_t)1 << 32) - 12345;
        if (ns == 8)
            index = 17;
        sp[ns] = (zn_sr_span){ off, len, index };
        index += len + 128 * (ns + 1);
        off += len;
    }
    uint16_t *want = xmalloc(n * 2), *one = xmalloc(n * 2), *p = xmalloc(n * 2);
    const uint64_t seed = 9;
    for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; fi++) {
        zn_adam_params hp = params(2);
        moms base, first;
        make_moms(&base, formats[fi].fmt, formats[fi].scheme, &d);
        copy_moms(&first, &base, n);
        /* each run's elements as a one-run step with the index0 that gives
         * them their run's indices (the fp32 values do not depend on the
         * index; only their rounding does) */
        for (size_t k = 0; k < ns; k++) {
            moms sm;
            copy_moms(&sm, &base, n);
            memcpy(one, d.p, n * 2);
            int rc = zn_adam_step_sr_with(zn_optim_get_ops(ZN_ISA_SCALAR), &hp, one, &sm.mv,
                                          d.g, ZN_DTYPE_F32, 1.0f, seed, sp[k].index - sp[k].off,
                                          n);
            ZT_CHECK_MSG(rc == 0, "one-run step: %s", zn_last_error());
            memcpy(want + sp[k].off, one + sp[k].off, sp[k].n * 2);
            if (k == 0) {
                free_moms(&first);
                first = sm;
            } else {
                ZT_CHECK_MSG(same_moms(&sm, &first, n), "the moments depend on index0");
                free_moms(&sm);
            }
        }
        for (size_t ii = 0; ii < 3; ii++) {
            const zn_optim_ops *ops = zn_optim_get_ops(all_isas[ii]);
            if (!ops)
                continue;
            static const int tcount[] = { 1, 3 };
            for (int t = 0; t < 2; t++) {
                moms sm;
                copy_moms(&sm, &base, n);
                memcpy(p, d.p, n * 2);
                hp.threads = tcount[t];
                int rc = zn_adam_step_sr_spans_with(ops, &hp, p, &sm.mv, d.g, ZN_DTYPE_F32, 1.0f,
                                                    seed, sp, ns, n);
                size_t bad = 0;
                for (size_t i = 0; i < n; i++)
                    bad += p[i] != want[i];
                ZT_CHECK_MSG(rc == 0 && bad == 0 && same_moms(&sm, &first, n),
                             "%s moments %s, %d threads, %zu runs: rc %d, %zu elements not "
                             "rounded as their run's index says%s", ops->name,
                             formats[fi].name, tcount[t], ns, rc, bad,
                             same_moms(&sm, &first, n) ? "" : ", moments differ");
                free_moms(&sm);
            }
            hp.threads = 1;
        }
        free_moms(&base);
        free_moms(&first);
    }
    /* spans that do not tile [0, n): refused, p untouched */
    zn_adam_params hp = params(0);
    float m[4] = { 0 }, v[4] = { 0 }, g[4] = { 1, 1, 1, 1 };
    zn_moments mv = zn_moments_of(ZN_MOM_F32, m, v, NULL, NULL, ZN_Q8_BNB);
    uint16_t q[4] = { 0x3f80, 0x3f80, 0x3f80, 0x3f80 };
    static const zn_sr_span bad[][2] = {
        { { 0, 2, 0 }, { 3, 1, 9 } },   /* a gap */
        { { 0, 2, 0 }, { 1, 3, 9 } },   /* an overlap */
        { { 0, 4, 0 }, { 4, 0, 9 } },   /* an empty run */
        { { 1, 3, 0 }, { 4, 0, 9 } },   /* not from 0 */
        { { 0, 2, 0 }, { 2, 1, 9 } },   /* short of n */
        { { 0, 2, 0 }, { 2, 3, 9 } },   /* past n */
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++)
        ZT_EQ_INT(zn_adam_step_sr_spans(&hp, q, &mv, g, ZN_DTYPE_F32, 1.0f, 1, bad[b], 2, 4),
                  -EINVAL);
    ZT_EQ_INT(zn_adam_step_sr_spans(&hp, q, &mv, g, ZN_DTYPE_F32, 1.0f, 1, NULL, 0, 4), -EINVAL);
    for (int i = 0; i < 4; i++)
        ZT_EQ_INT(q[i], 0x3f80);
    free(want);
    free(one);
    free(p);
    free_data(&d);
}

/* ---- the edges: NaN, Inf, the largest finite values, zeros, subnormals ---- */
static void check_edges(void)
{
    static const uint32_t edges[] = {
        0x00000000, 0x80000000, 0x00000001, 0x8000ffff, 0x007fffff, 0x00800000,
        0x7f7f0000, 0x7f7f0001, 0x7f7f8000, 0x7f7fffff, 0xff7fffff, 0xff7f8000,
        0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001,
        0x7fbfffff, 0x3f80ffff, 0xbf80ffff, 0x3f7fffff,
    };
    const size_t reps = 64, ne = sizeof edges / sizeof edges[0], n = reps * ne;
    float *x = xmalloc(n * 4);
    uint16_t *out = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++)
        x[i] = zn_bits_f32(edges[i % ne]);
    for (size_t ii = 0; ii < 3; ii++) {
        const zn_optim_ops *ops = zn_optim_get_ops(all_isas[ii]);
        if (!ops)
            continue;
        uint32_t k1, k2;
        zn_sr_key(3, 1, 0, &k1, &k2);
        ops->sr_round(x, out, n, k1, k2, 0);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t u = zn_f32_bits(x[i]), a = u & 0x7fffffffu;
            uint16_t o = out[i];
            int ok;
            if (a > 0x7f800000u)          /* NaN: NaN, quiet, top bits and sign kept */
                ok = o == (uint16_t)((u >> 16) | 0x40u);
            else if (a == 0x7f800000u)    /* Inf stays */
                ok = o == (uint16_t)(u >> 16);
            else                          /* finite: a neighbour, never Inf */
                ok = (o & 0x7fffu) < 0x7f80u &&
                     (o == trunc16(x[i]) || o == (uint16_t)(trunc16(x[i]) + 1));
            ok = ok && o == zn_f32_to_bf16_sr(x[i], zn_sr_hash(k1, k2, (uint32_t)i));
            if (!ok && bad++ < 5)
                printf("%s: %#010x -> %#06x\n", ops->name, u, o);
        }
        ZT_CHECK_MSG(bad == 0, "%s: %zu edge values broke the rules", ops->name, bad);
    }
    /* the largest finite magnitude with any fraction saturates: over 64
     * draws of 0x7f7fffff (fraction 65535/65536) some would go up */
    ZT_EQ_INT(zn_f32_to_bf16_sr(zn_bits_f32(0x7f7fffffu), 0xffff), 0x7f7f);
    ZT_EQ_INT(zn_f32_to_bf16_sr(zn_bits_f32(0xff7fffffu), 0xffff), 0xff7f);
    ZT_EQ_INT(zn_f32_to_bf16_sr(zn_bits_f32(0x3f80ffffu), 0x0001), 0x3f81);
    ZT_EQ_INT(zn_f32_to_bf16_sr(zn_bits_f32(0x3f80ffffu), 0x0000), 0x3f80);
    ZT_EQ_INT(zn_f32_to_bf16_sr(zn_bits_f32(0xbf808000u), 0x8000), 0xbf81);
    free(x);
    free(out);
}

static void check_bad_input(void)
{
    zn_adam_params hp = zn_adam_params_default();
    float g = 0, m = 0, v = 0;
    zn_moments mv = zn_moments_of(ZN_MOM_F32, &m, &v, NULL, NULL, ZN_Q8_BNB);
    uint16_t p = 0x3f80;
    ZT_EQ_INT(zn_adam_step_sr(&hp, NULL, &mv, &g, ZN_DTYPE_F32, 1.0f, 0, 0, 1), -EINVAL);
    ZT_EQ_INT(zn_adam_step_sr(&hp, &p, NULL, &g, ZN_DTYPE_F32, 1.0f, 0, 0, 1), -EINVAL);
    zn_moments q8 = zn_moments_of(ZN_MOM_Q8, &m, &v, NULL, NULL, ZN_Q8_BNB);
    ZT_EQ_INT(zn_adam_step_sr(&hp, &p, &q8, &g, ZN_DTYPE_F32, 1.0f, 0, 0, 1), -EINVAL);
    hp.step = 0;
    ZT_EQ_INT(zn_adam_step_sr(&hp, &p, &mv, &g, ZN_DTYPE_F32, 1.0f, 0, 0, 1), -EINVAL);
    hp.step = 1;
    ZT_EQ_INT(zn_adam_step_sr(&hp, &p, &mv, &g, ZN_DTYPE_F32, 1.0f, 0, 0, 0), 0);
    ZT_EQ_INT(p, 0x3f80);
}

int main(void)
{
    check_bracket();
    check_fractions();
    check_same_bits();
    check_fused();
    check_spans();
    check_edges();
    check_bad_input();
    return zt_done();
}
