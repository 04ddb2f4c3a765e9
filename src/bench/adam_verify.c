/* zinc bench adam: the verification of every timed pass. Before a pass the
 * sampled elements are kept; after it, one Adam step in double from them
 * must land within TOL of what the pass wrote. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/optim.h"
#include "bench/bench-adam-impl.h"
#include "util/hash-impl.h"

/* ---- verification: each pass's sampled elements against a double step ---- */

/* Before every pass the sampled elements' p, m, v are kept; after it, one
 * Adam step in double from those values must land within TOL of what the
 * pass wrote (the roofline must leave them unchanged). Checking each pass
 * from its own start keeps one path's error out of the rows after it. */

void zn_ba_sample_init(sample *s, const opts *o)
{
    for (size_t k = 0; k < NSAMPLE; k++) {
        /* both ends, each thread's split points, then spread at random */
        size_t i = k < 2 ? (k ? o->n - 1 : 0) : (size_t)(zn_splitmix64(k * 7 + 3) % o->n);
        if (k >= 2 && k < 2 + 2 * (size_t)o->threads) {
            size_t lo, hi;
            zn_optim_range(o->n, o->threads, (int)(k - 2) / 2, &lo, &hi);
            i = (k & 1) ? (hi > lo ? hi - 1 : lo) : lo;
            if (i >= o->n)
                i = o->n - 1;
        }
        s->idx[k] = i;
    }
}

/* element i's moments in format f, as fp32 (dequantized, widened) */
static void moment_at(const arrays *a, zn_mom_fmt f, size_t i, float *m, float *v)
{
    if (f == ZN_MOM_F32) {
        *m = a->m[i];
        *v = a->v[i];
    } else if (f == ZN_MOM_BF16) {
        *m = zn_bf16_to_f32(a->mh[i]);
        *v = zn_bf16_to_f32(a->vh[i]);
    } else {
        *m = zn_q8_map(1)[a->mq[i]] * a->am[i / ZN_Q8_BLOCK];
        *v = zn_q8_map(0)[a->vq[i]] * a->av[i / ZN_Q8_BLOCK];
    }
}

/* element i's parameter: the fp32 master, or the bf16 one (sr) widened */
static float param_at(const arrays *a, int sr, size_t i)
{
    return sr ? zn_bf16_to_f32(a->ps[i]) : a->p[i];
}

void zn_ba_sample_snap(sample *s, const arrays *a, zn_mom_fmt f, int sr)
{
    for (size_t k = 0; k < NSAMPLE; k++) {
        size_t i = s->idx[k];
        s->before[k][0] = param_at(a, sr, i);
        moment_at(a, f, i, &s->before[k][1], &s->before[k][2]);
    }
}

/* Whether the stored moment x (format f; for 8-bit, code c of a block with
 * the given absmax) is the format's rounding of the exact value want: bf16
 * within half an ulp (2^-9 relative, allowed 2^-8 for the fp32 step's own
 * error), 8-bit the map entry nearest to want / absmax (within 1e-6 of a
 * midpoint either side is right). */
static int stored_ok(zn_mom_fmt f, int is_signed, float x, int c, float absmax, double want)
{
    if (f == ZN_MOM_BF16)
        return fabs(x - want) <= 0x1p-8 * fabs(want) + 1e-38;
    if (absmax == 0)
        return want == 0;
    const zn_q8_table *t = zn_q8_table_get(ZN_Q8_BNB, is_signed);
    double y = want / absmax, tol = 1e-6;
    if (fabs(y) > 1 + tol)
        return 0;   /* the absmax is below this element's moment */
    double below = c > 0 ? t->mid[c - 1] : -2.0, above = c < 255 ? t->mid[c] : 2.0;
    return y >= below - tol && y <= above + tol;
}

/* The bf16 values next to x on the real line: *below <= x <= *above, both
 * x when it is a bf16 value. On the magnitude's bits: truncation goes
 * toward zero, one more unit away from it. */
static void bf16_bracket(float x, float *below, float *above)
{
    uint32_t u = zn_f32_bits(x), t = u & 0xffff0000u;
    float toward = zn_bits_f32(t), away = zn_bits_f32(t + 0x10000u);
    if (t == u)
        *below = *above = x;
    else if (x > 0)
        *below = toward, *above = away;
    else
        *below = away, *above = toward;
}

/* Whether the bf16 master's new value y (widened) is the stochastic
 * rounding of some fp32 result within [lo, hi]: one of the two bf16
 * neighbours of such a value, so any bf16 value from the one below lo
 * to the one above hi (both taken outward to fp32 first). */
static int sr_ok(float y, double lo, double hi)
{
    float flo = (float)lo, fhi = (float)hi, below, above, above_lo, below_hi;
    if ((double)flo > lo)
        flo = nextafterf(flo, -INFINITY);
    if ((double)fhi < hi)
        fhi = nextafterf(fhi, INFINITY);
    bf16_bracket(flo, &below, &above_lo);
    bf16_bracket(fhi, &below_hi, &above);
    return y >= below && y <= above;
}

uint64_t zn_ba_sample_unchanged(const sample *s, const arrays *a, zn_mom_fmt f, int sr)
{
    uint64_t bad = 0;
    for (size_t k = 0; k < NSAMPLE; k++) {
        size_t i = s->idx[k];
        float m, v, p = param_at(a, sr, i);
        moment_at(a, f, i, &m, &v);
        bad += memcmp(&s->before[k][0], &p, 4) || memcmp(&s->before[k][1], &m, 4) ||
               memcmp(&s->before[k][2], &v, 4);
    }
    return bad;
}

/* Counts sampled elements whose p, m or v is off the double step by more
 * than TOL (relative to the larger of the value before and after: p moves
 * by about lr a step and may pass near zero), or whose copy is not the
 * rounding of p. A bf16 master (sr) is stepped by the same fp32 kernel,
 * so its fp32 result lies within TOL of the double one; what is stored
 * is either bf16 neighbour of that result (sr_ok). */
uint64_t zn_ba_sample_step(const sample *s, const opts *o, const arrays *a,
                            const zn_adam_params *hp, float g_scale, zn_mom_fmt f, int sr)
{
    double b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, wd = hp->weight_decay, eps = hp->eps;
    double bc1 = hp->bias_correction ? 1 - pow(b1, (double)hp->step) : 1;
    double bc2 = hp->bias_correction ? 1 - pow(b2, (double)hp->step) : 1;
    uint64_t bad = 0;
    for (size_t k = 0; k < NSAMPLE; k++) {
        size_t i = s->idx[k];
        double p0 = s->before[k][0], m0 = s->before[k][1], v0 = s->before[k][2];
        double g = (double)zn_ba_grad_value(i, o->gt) * g_scale;
        if (wd != 0 && !hp->adamw_mode)
            g += wd * p0;
        double m = b1 * m0 + (1 - b1) * g;
        double v = b2 * v0 + (1 - b2) * g * g;
        double dec = wd != 0 && hp->adamw_mode ? lr * wd * p0 : 0;
        double p = p0 - (lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps) + dec);
        double tol_p = TOL * fmax(fabs(p0), fabs(p));
        int ok = sr ? sr_ok(param_at(a, 1, i), p - tol_p, p + tol_p)
                    : fabs(a->p[i] - p) <= tol_p;
        if (f == ZN_MOM_F32) {
            double em = fabs(a->m[i] - m) / fmax(fabs(m0), fabs(m));
            double ev = fabs(a->v[i] - v) / fmax(fabs(v0), fabs(v));
            ok = ok && em <= TOL && ev <= TOL;
        } else {
            float mx, vx;
            moment_at(a, f, i, &mx, &vx);
            size_t b = i / ZN_Q8_BLOCK;
            ok = ok &&
                 stored_ok(f, 1, mx, a->mq ? a->mq[i] : 0, a->am ? a->am[b] : 0, m) &&
                 stored_ok(f, 0, vx, a->vq ? a->vq[i] : 0, a->av ? a->av[b] : 0, v);
        }
        if (ok && a->c && !sr) {
            uint16_t want = o->ct == ZN_DTYPE_BF16 ? zn_f32_to_bf16(a->p[i])
                                                    : zn_f32_to_f16(a->p[i]);
            ok = a->c[i] == want;
        }
        bad += !ok;
    }
    return bad;
}

/* After the last step: every copy element is the rounding of its p. */
uint64_t zn_ba_full_copy_check(const opts *o, const arrays *a)
{
    uint64_t bad = 0;
    if (!a->c)
        return 0;
#pragma omp parallel for num_threads(o->threads) schedule(static) reduction(+ : bad)
    for (size_t i = 0; i < o->n; i++) {
        uint16_t want = o->ct == ZN_DTYPE_BF16 ? zn_f32_to_bf16(a->p[i]) : zn_f32_to_f16(a->p[i]);
        bad += a->c[i] != want || !isfinite(a->p[i]);
    }
    return bad;
}
