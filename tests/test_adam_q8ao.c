/* 8-bit Adam moments with torchao's scheme (ZN_Q8_TORCHAO, train.optim
 * adamw_torch_8bit) against torchao's AdamW8bit on the CPU
 * (tests/fixtures/optim8/adamw8bit-torchao.safetensors, made by
 * scripts/gen_optim8_fixtures.py: its comment lists how torchao differs
 * from bitsandbytes).
 *
 *  - The rounding table: at both ends of every 16-bit key and at random
 *    floats inside, and one ulp around every threshold, the table's code is
 *    torchao's decision written plainly (binary search, then x - map[lo] >=
 *    (map[lo + 1] - map[lo]) * 0.5 in float32).
 *  - The quantizer alone, every SIMD path, on torchao's probe blocks (exact
 *    midpoints, values one ulp around its thresholds, blocks below its
 *    1e-12 floor, a zero block, random ones): codes and scales bit for bit
 *    equal to torchao's. Same input, one division and one table per value:
 *    nothing may differ. bitsandbytes' scheme must differ there (else the
 *    probe tells nothing).
 *  - Three steps of one 4096-element parameter, each from torchao's state
 *    before it, every path, 1 and 2 threads:
 *      p within 2 ulps of torchao's p plus 1e-6 of the step: torchao rounds
 *        p twice at its magnitude (decay, then update: an ulp together),
 *        zinc once (half an ulp), and both compute the same float32 step in
 *        other orders (a few ulps of it). The bound is tight enough to see
 *        torchao's float32 bias corrections: with torch's double ones the
 *        first step misses it (checked, must happen).
 *      scales within 1e-6 relative (the largest |moment| of a block, a few
 *        ulps apart), the floor exactly;
 *      codes equal to torchao's except where its moment (replayed in eager
 *        float32) scaled by its scale lies within 8 ulps of a threshold:
 *        zinc's moment differs by ulps there, so either code is right; such
 *        differences are one code step and counted.
 *    In the blocks under the floor, bitsandbytes' scheme gives other codes
 *    (checked). AVX2 and AVX-512 give the same bits; threads never matter.
 *  - The bounds cover the reference's own noise: torchao's step run eagerly
 *    lands within them from its compiled step (the generator measured it:
 *    metadata noise_eager_vs_compiled). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/optim.h"
#include "zinc/safetensors.h"
#include "optim/optim-impl.h"
#include "zt.h"

#define FIX ZN_SOURCE_ROOT "/tests/fixtures/optim8/adamw8bit-torchao.safetensors"

static zn_st *st;

static void *xmalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64))
        ZT_SETUP_FAIL("out of memory (%zu bytes)", bytes);
    return p;
}

static void *load(const char *name, size_t *count, size_t elem)
{
    const zn_st_tensor *t = zn_st_find(st, name);
    if (!t)
        ZT_SETUP_FAIL("%s: no tensor %s", FIX, name);
    void *buf = xmalloc(t->nbytes);
    if (zn_st_read_raw(st, t, buf, t->nbytes))
        ZT_SETUP_FAIL("%s: %s: %s", FIX, name, zn_last_error());
    if (count)
        *count = t->nbytes / elem;
    return buf;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* torchao's quantize_8bit_with_qmap for one scaled value, as written there */
static int ao_code(const float *map, float y)
{
    int c = 0;
    for (int s = 128; s >= 1; s /= 2)
        if (y >= map[c + s > 255 ? 255 : c + s])
            c += s;
    int up = c + 1 > 255 ? 255 : c + 1;
    volatile float residual = y - map[c], half = (map[up] - map[c]) * 0.5f;
    return residual >= half ? up : c;
}

static void check_table(void)
{
    for (int s = 0; s < 2; s++) {
        float *ref = load(s ? "map_signed" : "map_unsigned", NULL, 4);
        ZT_CHECK_MSG(!memcmp(ref, zn_q8_map(s), 256 * 4), "%s map differs from torchao's",
                     s ? "signed" : "unsigned");
        free(ref);
        const zn_q8_table *t = zn_q8_table_get(ZN_Q8_TORCHAO, s);
        ZT_CHECK_MSG(t != NULL, "table: %s", zn_last_error());
        if (!t)
            continue;
        int bad = 0;
        for (uint32_t key = 0; key < 65536; key++)
            for (int r = 0; r < 6; r++) {
                uint32_t low = r == 0 ? 0 : r == 1 ? 0xffffu : (uint32_t)mix(key * 8 + r) & 0xffffu;
                float y = zn_bits_f32(key << 16 | low);
                if (isnan(y) || fabsf(y) > 1.0f)
                    continue;
                bad += zn_q8_code(t, y) != ao_code(t->map, y);
            }
        for (int i = 0; i < 255; i++) {
            float y = nextafterf(t->mid[i], -2.0f);
            for (int j = 0; j < 3; j++, y = nextafterf(y, 2.0f))
                bad += zn_q8_code(t, y) != ao_code(t->map, y);
        }
        ZT_CHECK_MSG(bad == 0, "%s torchao table: %d probes off torchao's rounding",
                     s ? "signed" : "unsigned", bad);
    }
}

/* ---- the quantizer alone ------------------------------------------------- */

static void check_probe(const zn_optim_ops *const *ops, int nops)
{
    size_t n, nb;
    float *x = load("q.x", &n, 4), *ms = load("q.m_scale", &nb, 4);
    float *vs = load("q.v_scale", NULL, 4);
    uint8_t *mc = load("q.m_codes", NULL, 1), *vc = load("q.v_codes", NULL, 1);
    float *ax = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++)
        ax[i] = fabsf(x[i]);
    uint8_t q[ZN_Q8_BLOCK];
    for (int o = 0; o < nops; o++) {
        int codes = 0, scales = 0, bnb_differ = 0;
        for (int s = 0; s < 2; s++) {
            const zn_q8_table *t = zn_q8_table_get(ZN_Q8_TORCHAO, s);
            const zn_q8_table *tb = zn_q8_table_get(ZN_Q8_BNB, s);
            const float *in = s ? x : ax, *rs = s ? ms : vs;
            const uint8_t *rc = s ? mc : vc;
            for (size_t b = 0; b < nb; b++) {
                memset(q, 0xa5, sizeof q);
                float sc = ops[o]->q8_quant(in + b * ZN_Q8_BLOCK, t, q, ZN_Q8_BLOCK);
                scales += memcmp(&sc, &rs[b], 4) != 0;
                for (int i = 0; i < ZN_Q8_BLOCK; i++)
                    codes += q[i] != rc[b * ZN_Q8_BLOCK + i];
                ops[o]->q8_quant(in + b * ZN_Q8_BLOCK, tb, q, ZN_Q8_BLOCK);
                for (int i = 0; i < ZN_Q8_BLOCK; i++)
                    bnb_differ += q[i] != rc[b * ZN_Q8_BLOCK + i];
            }
        }
        ZT_CHECK_MSG(codes == 0 && scales == 0, "%s probe: %d codes and %d scales differ from "
                     "torchao's", ops[o]->name, codes, scales);
        ZT_CHECK_MSG(bnb_differ > 0, "%s probe: bitsandbytes' scheme gives torchao's codes: the "
                     "probe does not tell them apart", ops[o]->name);
        printf("# %s probe: %zu blocks x 2 equal torchao's bit for bit; bitsandbytes' scheme "
               "differs in %d codes\n", ops[o]->name, nb, bnb_differ);
    }
    free(x); free(ms); free(vs); free(mc); free(vc); free(ax);
}

/* ---- steps ---------------------------------------------------------------- */

typedef struct {
    size_t n, nb;
    int steps;
    float lr, eps, wd;
    double b1, b2;
} fixmeta;

static fixmeta fm;

static float ulp(float x)
{
    x = fabsf(x);
    return nextafterf(x, INFINITY) - x;
}

typedef struct {
    float *p;
    uint8_t *mq, *vq;
    float *ms, *vs;
} ao_state;

/* torchao's state before step k: zeros, or what step k - 1 left */
static void state_before(int k, ao_state *s)
{
    char nm[64];
    size_t n = fm.n, nb = fm.nb;
    s->p = xmalloc(n * 4);
    s->mq = xmalloc(n);
    s->vq = xmalloc(n);
    s->ms = xmalloc(nb * 4);
    s->vs = xmalloc(nb * 4);
    if (k == 1) {
        float *p0 = load("p0", NULL, 4);
        memcpy(s->p, p0, n * 4);
        free(p0);
        memset(s->mq, 0, n);
        memset(s->vq, 0, n);
        memset(s->ms, 0, nb * 4);
        memset(s->vs, 0, nb * 4);
        return;
    }
#define CP(field, name, bytes)                                 \
    do {                                                       \
        snprintf(nm, sizeof nm, "s%d." name, k - 1);           \
        void *t = load(nm, NULL, 1);                           \
        memcpy(s->field, t, bytes);                            \
        free(t);                                               \
    } while (0)
    CP(p, "p", n * 4);
    CP(mq, "m_codes", n);
    CP(vq, "v_codes", n);
    CP(ms, "m_scale", nb * 4);
    CP(vs, "v_scale", nb * 4);
#undef CP
}

static void state_free(ao_state *s)
{
    free(s->p); free(s->mq); free(s->vq); free(s->ms); free(s->vs);
}

static int step(const zn_optim_ops *ops, ao_state *s, const float *g, int k, int threads,
                zn_q8_scheme scheme)
{
    zn_adam_params hp = zn_adam_params_default();
    hp.lr = fm.lr;
    hp.beta1 = fm.b1;
    hp.beta2 = fm.b2;
    hp.eps = fm.eps;
    hp.weight_decay = fm.wd;
    hp.adamw_mode = 1;
    hp.step = k;
    hp.threads = threads;
    zn_moments mv = zn_moments_of(ZN_MOM_Q8, s->mq, s->vq, s->ms, s->vs, scheme);
    int rc = zn_adam_step_mom_with(ops, &hp, s->p, &mv, g, ZN_DTYPE_F32, 1.0f, NULL,
                                   ZN_DTYPE_BF16, fm.n);
    ZT_CHECK_MSG(rc == 0, "step: %s", zn_last_error());
    return rc;
}

static int near_threshold(const float *mid, float y, int a, int b)
{
    float m = mid[a < b ? a : b];
    return fabsf(y - m) <= 8.0f * ulp(m);
}

/* p against torchao's: elements outside the bound, and the worst ratio */
static size_t p_outside(const float *p, const float *rp, const float *p_in, double *worst)
{
    size_t out = 0;
    *worst = 0;
    for (size_t i = 0; i < fm.n; i++) {
        double allow = 2.0 * ulp(rp[i]) + 1e-6 * fabs((double)rp[i] - p_in[i]);
        double e = fabs((double)p[i] - rp[i]) / allow;
        *worst = e > *worst ? e : *worst;
        out += e > 1.0;
    }
    return out;
}

static void check_step(int k, const zn_optim_ops *ops, int threads, ao_state *out)
{
    char nm[64];
#define L(s, e) (snprintf(nm, sizeof nm, "s%d." s, k), load(nm, NULL, e))
    float *g = L("g", 4), *rp = L("p", 4), *rms = L("m_scale", 4), *rvs = L("v_scale", 4);
    uint8_t *rmq = L("m_codes", 1), *rvq = L("v_codes", 1);
    float *mf = L("m_f32", 4), *vf = L("v_f32", 4);
#undef L
    ao_state s;
    state_before(k, &s);
    float *p_in = xmalloc(fm.n * 4);
    memcpy(p_in, s.p, fm.n * 4);
    step(ops, &s, g, k, threads, ZN_Q8_TORCHAO);

    double worst_p, worst_s = 0;
    size_t outside = p_outside(s.p, rp, p_in, &worst_p);
    int floor_exact = 1;
    for (size_t b = 0; b < fm.nb; b++) {
        double e1 = fabs((double)s.ms[b] - rms[b]) / (1e-6 * rms[b]);
        double e2 = fabs((double)s.vs[b] - rvs[b]) / (1e-6 * rvs[b]);
        worst_s = e1 > worst_s ? e1 : worst_s;
        worst_s = e2 > worst_s ? e2 : worst_s;
        if (rms[b] == 1e-12f || rvs[b] == 1e-12f)
            floor_exact &= (rms[b] != 1e-12f || s.ms[b] == 1e-12f) &&
                           (rvs[b] != 1e-12f || s.vs[b] == 1e-12f);
    }
    ZT_CHECK_MSG(outside == 0, "%s step %d: %zu params outside 2 ulps + 1e-6 of the step from "
                 "torchao's (worst %.3g of the bound)", ops->name, k, outside, worst_p);
    ZT_CHECK_MSG(worst_s <= 1.0, "%s step %d: a scale %.3g of the bound off torchao's",
                 ops->name, k, worst_s);
    ZT_CHECK_MSG(floor_exact, "%s step %d: a block on torchao's 1e-12 floor is not", ops->name, k);

    int ties = 0, off = 0, equal = 0;
    for (int sg = 0; sg < 2; sg++) {
        const zn_q8_table *t = zn_q8_table_get(ZN_Q8_TORCHAO, sg);
        const uint8_t *z = sg ? s.mq : s.vq, *ref = sg ? rmq : rvq;
        const float *x = sg ? mf : vf, *rs = sg ? rms : rvs;
        for (size_t i = 0; i < fm.n; i++) {
            if (z[i] == ref[i]) {
                equal++;
                continue;
            }
            float y = x[i] / rs[i / ZN_Q8_BLOCK];
            if (abs((int)z[i] - (int)ref[i]) == 1 && near_threshold(t->mid, y, z[i], ref[i]))
                ties++;
            else
                off++;
        }
    }
    ZT_CHECK_MSG(off == 0, "%s step %d: %d codes differ from torchao's away from its "
                 "thresholds", ops->name, k, off);
    ZT_CHECK_MSG(ties <= 20, "%s step %d: %d codes at near-thresholds", ops->name, k, ties);

    /* the schemes differ where it matters: torch's double bias corrections
     * miss the bound at the first step; bitsandbytes' quantizer gives other
     * codes in the blocks under the floor (0: m and v, 1: v) */
    ao_state b;
    state_before(k, &b);
    step(ops, &b, g, k, threads, ZN_Q8_BNB);
    double wb;
    size_t outside_bnb = p_outside(b.p, rp, p_in, &wb);
    if (k == 1)
        ZT_CHECK_MSG(outside_bnb > 0, "%s step 1: double bias corrections also stay within the "
                     "bound: it cannot tell them from torchao's", ops->name);
    int floor_differ = 0;
    for (size_t i = 0; i < 2 * ZN_Q8_BLOCK; i++)
        floor_differ += (i < ZN_Q8_BLOCK && b.mq[i] != rmq[i]) + (b.vq[i] != rvq[i]);
    ZT_CHECK_MSG(floor_differ > 0, "%s step %d: bitsandbytes' scheme gives torchao's codes "
                 "under the floor", ops->name, k);
    if (threads == 1)
        printf("# %s step %d: %d of %zu codes equal torchao's, %d at near-thresholds; worst p "
               "%.3g, scale %.3g of the bound; with bitsandbytes' scheme %zu params outside, "
               "%d codes differ under the floor\n", ops->name, k, equal, 2 * fm.n, ties, worst_p,
               worst_s, outside_bnb, floor_differ);
    state_free(&b);
    *out = s;
    free(g); free(rp); free(rms); free(rvs); free(rmq); free(rvq); free(mf); free(vf);
    free(p_in);
}

static int same_state(const ao_state *a, const ao_state *b)
{
    return !memcmp(a->p, b->p, fm.n * 4) && !memcmp(a->mq, b->mq, fm.n) &&
           !memcmp(a->vq, b->vq, fm.n) && !memcmp(a->ms, b->ms, fm.nb * 4) &&
           !memcmp(a->vs, b->vs, fm.nb * 4);
}

int main(void)
{
    if (zn_st_open(&st, FIX))
        ZT_SETUP_FAIL("%s: %s", FIX, zn_last_error());
    const char *meta = zn_st_metadata(st, "zinc");
    double lr = 0, b1 = 0, b2 = 0, eps = 0, wd = 0;
    if (!meta || !strstr(meta, "\"n\"") ||
        sscanf(strstr(meta, "\"n\""), "\"n\": %zu, \"steps\": %d", &fm.n, &fm.steps) != 2 ||
        sscanf(strstr(meta, "\"lr\""), "\"lr\": %lf, \"beta1\": %lf, \"beta2\": %lf, \"eps\": "
               "%lf, \"weight_decay\": %lf", &lr, &b1, &b2, &eps, &wd) != 5 ||
        fm.n % ZN_Q8_BLOCK)
        ZT_SETUP_FAIL("%s: metadata unreadable", FIX);
    fm.nb = fm.n / ZN_Q8_BLOCK;
    double noise_p = -1, noise_s = -1;
    const char *nz = strstr(meta, "\"noise_eager_vs_compiled\"");
    if (!nz || sscanf(nz, "\"noise_eager_vs_compiled\": {\"p_vs_bound\": %lf, \"scale_rel\": %lf",
                      &noise_p, &noise_s) != 2)
        ZT_SETUP_FAIL("%s: no noise_eager_vs_compiled in the metadata", FIX);
    ZT_CHECK_MSG(noise_p <= 1.0 && noise_s <= 1e-6, "torchao's own eager and compiled steps are "
                 "%.3g of the p bound and %.3g relative in scale apart: the bounds are too tight",
                 noise_p, noise_s);
    printf("# torchao eager vs compiled: p %.3g of the bound, scales %.3g relative\n", noise_p,
           noise_s);
    fm.lr = (float)lr;
    fm.b1 = b1;
    fm.b2 = b2;
    fm.eps = (float)eps;
    fm.wd = (float)wd;

    check_table();
    /* every path this CPU has, AVX-512 with and without its VBMI pieces */
    const zn_optim_ops *ops[4];
    int nops = 0;
    const zn_optim_ops *paths[] = { zn_optim_get_ops(ZN_ISA_AVX2), zn_optim_get_ops_novbmi(),
                                    zn_optim_get_ops_vbmi(), zn_optim_get_ops(ZN_ISA_SCALAR) };
    for (int i = 0; i < 4; i++)
        if (paths[i])
            ops[nops++] = paths[i];
    check_probe(ops, nops);
    for (int k = 1; k <= fm.steps; k++) {
        ao_state first = { 0 };
        for (int o = 0; o < nops; o++)
            for (int th = 1; th <= 2; th++) {
                ao_state s;
                check_step(k, ops[o], th, &s);
                /* the vector paths share one operation order; the scalar
                 * path has no FMA and is its own reference */
                if (!first.p && ops[o]->isa != ZN_ISA_SCALAR) {
                    first = s;
                    continue;
                }
                if (ops[o]->isa != ZN_ISA_SCALAR)
                    ZT_CHECK_MSG(same_state(&s, &first), "step %d: %s with %d threads differs "
                                 "from %s with 1", k, ops[o]->name, th, ops[0]->name);
                state_free(&s);
            }
        if (first.p)
            state_free(&first);
    }
    zn_st_close(st);
    return zt_done();
}
