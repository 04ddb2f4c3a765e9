/* Adam with compressed moments (zn_adam_step_mom).
 *
 * 8-bit blockwise, against bitsandbytes 0.50's AdamW8bit on the CPU
 * (tests/fixtures/optim8, scripts/gen_optim8_fixtures.py): four steps of one
 * 10317-element parameter (40 whole blocks and a partial one) with
 * gradients spanning six decades in every block. For each step, each SIMD
 * path gets bitsandbytes' inputs (p, g, codes, absmax) and must give:
 *  - p within 1e-6 of bitsandbytes' p, relative to |p| plus the step taken:
 *    both compute the same fp32 formula in different orders (a few ulps of
 *    the step) and round once at p's magnitude (half an ulp of p);
 *  - absmax within 1e-6 relative: the largest |moment| of a block, which
 *    both compute in fp32 from the same values (a few ulps);
 *  - codes equal to the nearest map entry of bitsandbytes' unquantized
 *    moment (the fixture's *_nearest), except where that moment lies
 *    within 8 ulps of a midpoint: zinc's fp32 moment differs from
 *    bitsandbytes' by a few ulps, so there either code is right. Every
 *    such difference must be one code step, and they are counted.
 *  - codes equal to bitsandbytes' own codes except where its 65536-bin
 *    table gives another entry than the nearest (the fixture computed
 *    where: *_nearest != bitsandbytes' codes) and at the near-ties above.
 * Also: the maps are bitsandbytes' to the bit; the rounding table gives
 * the nearest entry everywhere it is probed; every path gives the same
 * bits as every thread count; bf16 moments against a double reference
 * (p within 1e-6 as test_adam; m and v the bf16 rounding of the double
 * result except within 2^-20 of a rounding boundary, where the fp32
 * intermediate may round the other way); format conversions; bad input. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/optim.h"
#include "zinc/safetensors.h"
#include "optim/optim-impl.h"
#include "zt.h"

#define FIX ZN_SOURCE_ROOT "/tests/fixtures/optim8/adamw8bit.safetensors"

static void *xmalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64))
        ZT_SETUP_FAIL("out of memory (%zu bytes)", bytes);
    return p;
}

static void *load(zn_st *st, const char *name, size_t *bytes)
{
    const zn_st_tensor *t = zn_st_find(st, name);
    if (!t)
        ZT_SETUP_FAIL("%s: no tensor %s", FIX, name);
    void *buf = xmalloc(t->nbytes);
    if (zn_st_read_raw(st, t, buf, t->nbytes))
        ZT_SETUP_FAIL("%s: %s: %s", FIX, name, zn_last_error());
    if (bytes)
        *bytes = t->nbytes;
    return buf;
}

/* ---- the maps and the rounding table ------------------------------------- */

static int code_def(const float *mid, float y)
{
    int c = 0;
    while (c < 255 && mid[c] < y)
        c++;
    return c;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Probes of a code function against the definition: every key's two ends
 * and random floats inside, and both sides of every midpoint. Returns the
 * count off; *probes counts them. */
static int probe_codes(const zn_q8_table *t, uint8_t (*code)(const zn_q8_table *, float),
                       int *probes)
{
    int bad = 0;
    for (uint32_t key = 0; key < 65536; key++) {
        for (int r = 0; r < 6; r++) {
            uint32_t low = r == 0 ? 0 : r == 1 ? 0xffffu : (uint32_t)mix(key * 8 + r) & 0xffffu;
            float y = zn_bits_f32(key << 16 | low);
            if (isnan(y) || fabsf(y) > 1.0f)
                continue;
            (*probes)++;
            bad += code(t, y) != code_def(t->mid, y);
        }
    }
    for (int i = 0; i < 255; i++) {
        float m = t->mid[i];
        float ys[3] = { nextafterf(m, -2.0f), m, nextafterf(m, 2.0f) };
        for (int j = 0; j < 3; j++, (*probes)++)
            bad += code(t, ys[j]) != code_def(t->mid, ys[j]);
    }
    return bad;
}

/* The linear estimate where it decides, the search where it does not:
 * what the VBMI path computes. */
static uint8_t code_lin_or_tree(const zn_q8_table *t, float y)
{
    uint8_t c;
    return zn_q8_code_lin(t, y, &c) ? c : zn_q8_code_tree(t, y);
}

/* The linear estimate (zn_q8_code_lin): built and checked for every
 * built-in table, right wherever it decides, and deciding nearly
 * everywhere. It leaves U - floor(U) < 2 eps = 2^-11 to the search, so
 * over uniform y about 2^-11 of them would go there if U's fraction were
 * uniform; it is uniform within each code's region only near the
 * midpoints, and most regions are far wider than that margin (the build
 * measured 0.003-0.006% of all floats in [-1, 1] left to the search, and
 * checked all 2^31 of them against the definition, 2026-11-28). The bound
 * below is 2^-11 itself: a table whose estimate were off by a fraction of a
 * code would leave far more, or be refused. */
static void check_lin(const zn_q8_table *t, const char *name)
{
    ZT_CHECK_MSG(t->lin_ok, "%s: the linear estimate was refused by its own check", name);
    if (!t->lin_ok)
        return;
    int probes = 0;
    int bad = probe_codes(t, code_lin_or_tree, &probes);
    ZT_CHECK_MSG(bad == 0, "%s: linear estimate: %d of %d probes off the definition", name, bad,
                 probes);
    int undecided = 0, wrong = 0, n = 1 << 20;
    for (int i = 0; i < n; i++) {
        float y = (float)((double)(mix((uint64_t)i) >> 11) * 0x1p-52 - 1.0);
        uint8_t c;
        if (!zn_q8_code_lin(t, y, &c))
            undecided++;
        else
            wrong += c != code_def(t->mid, y);
    }
    ZT_CHECK_MSG(wrong == 0, "%s: linear estimate: %d of %d uniform y wrong", name, wrong, n);
    ZT_CHECK_MSG(undecided <= n / 2048, "%s: linear estimate left %d of %d uniform y to the "
                 "search (at most 2^-11 expected)", name, undecided, n);
    /* NaN and the infinities go to the search (U is NaN) */
    uint8_t c;
    float odd[] = { NAN, -NAN, INFINITY, -INFINITY };
    for (int i = 0; i < 4; i++)
        ZT_CHECK_MSG(!zn_q8_code_lin(t, odd[i], &c) ||
                         c == code_def(t->mid, odd[i] > 0 ? 1.0f : -1.0f),
                     "%s: linear estimate decided %g as %d", name, (double)odd[i], c);
}

/* The cell table's code (what the gathering paths compute) against the
 * definition, both schemes and maps: the probes above, the values under the
 * smallest cell (zeros, denormals) and NaN. */
static void check_cells(void)
{
    for (int sc = ZN_Q8_BNB; sc <= ZN_Q8_TORCHAO; sc++) {
        for (int s = 0; s < 2; s++) {
            const zn_q8_table *t = zn_q8_table_get((zn_q8_scheme)sc, s);
            ZT_CHECK_MSG(t != NULL, "table: %s", zn_last_error());
            if (!t)
                continue;
            int probes = 0;
            int bad = probe_codes(t, zn_q8_code_cell, &probes);
            float lo = zn_bits_f32(t->cell_lo);
            float special[] = { 0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-126f, -0x1p-126f,
                                lo, -lo, nextafterf(lo, 0.0f), -nextafterf(lo, 0.0f),
                                nextafterf(lo, 2.0f), -nextafterf(lo, 2.0f), 1.0f, -1.0f };
            for (size_t j = 0; j < sizeof special / sizeof special[0]; j++, probes++)
                bad += zn_q8_code_cell(t, special[j]) != code_def(t->mid, special[j]);
            bad += zn_q8_code_cell(t, NAN) != zn_q8_code(t, NAN);
            ZT_CHECK_MSG(bad == 0, "%s %s cell table: %d of %d probes off the definition",
                         sc == ZN_Q8_BNB ? "bitsandbytes" : "torchao",
                         s ? "signed" : "unsigned", bad, probes);
            /* the VBMI path's search (zn_q8_code_tree), the same probes */
            probes = 0;
            bad = probe_codes(t, zn_q8_code_tree, &probes);
            for (size_t j = 0; j < sizeof special / sizeof special[0]; j++, probes++)
                bad += zn_q8_code_tree(t, special[j]) != code_def(t->mid, special[j]);
            bad += zn_q8_code_tree(t, NAN) != zn_q8_code(t, NAN);
            ZT_CHECK_MSG(t->vbmi_ok, "%s %s map: a midpoint at +-0, the VBMI search refused",
                         sc == ZN_Q8_BNB ? "bitsandbytes" : "torchao", s ? "signed" : "unsigned");
            ZT_CHECK_MSG(bad == 0, "%s %s search tree: %d of %d probes off the definition",
                         sc == ZN_Q8_BNB ? "bitsandbytes" : "torchao",
                         s ? "signed" : "unsigned", bad, probes);
            char name[64];
            snprintf(name, sizeof name, "%s %s map", sc == ZN_Q8_BNB ? "bitsandbytes" : "torchao",
                     s ? "signed" : "unsigned");
            check_lin(t, name);
        }
    }
}

static void check_maps(zn_st *st)
{
    for (int s = 0; s < 2; s++) {
        float *ref = load(st, s ? "map_signed" : "map_unsigned", NULL);
        ZT_CHECK_MSG(!memcmp(ref, zn_q8_map(s), 256 * 4), "%s map differs from bitsandbytes'",
                     s ? "signed" : "unsigned");
        free(ref);
        const zn_q8_table *t = zn_q8_table_get(ZN_Q8_BNB, s);
        ZT_CHECK_MSG(t != NULL, "table: %s", zn_last_error());
        if (!t)
            continue;
        int probes = 0;
        int bad = probe_codes(t, zn_q8_code, &probes);
        ZT_CHECK_MSG(bad == 0, "%s table: %d probes off the nearest entry", s ? "signed" : "unsigned",
                     bad);
    }
    check_cells();
}

/* ---- one step against bitsandbytes --------------------------------------- */

typedef struct {
    size_t n, nb;
    float lr, eps, wd;
    double b1, b2;
} fixmeta;

static int nearly_tie(const float *mid, float y, int a, int b)
{
    /* the midpoint between codes a and b (b = a +- 1) within 8 ulps of y */
    float m = mid[a < b ? a : b];
    return fabsf(y - m) <= 8.0f * (nextafterf(fabsf(m), 2.0f) - fabsf(m));
}

static void check_bnb_step(zn_st *st, const fixmeta *fm, int k, const zn_optim_ops *ops,
                           int threads)
{
    char nm[64];
#define L(s) (snprintf(nm, sizeof nm, "s%d." s, k), load(st, nm, NULL))
    float *p = L("p"), *g = L("g");
    uint8_t *mq = L("m_codes"), *vq = L("v_codes");
    float *am = L("m_absmax"), *av = L("v_absmax");
    float *rp = L("out.p"), *ram = L("out.m_absmax"), *rav = L("out.v_absmax");
    uint8_t *rmq = L("out.m_codes"), *rvq = L("out.v_codes");
    uint8_t *nmq = L("out.m_nearest"), *nvq = L("out.v_nearest");
    float *mf = L("out.m_f32"), *vf = L("out.v_f32");
#undef L
    size_t n = fm->n;
    float *p0 = xmalloc(n * 4);
    memcpy(p0, p, n * 4);
    zn_adam_params hp = zn_adam_params_default();
    hp.lr = fm->lr;
    hp.beta1 = fm->b1;
    hp.beta2 = fm->b2;
    hp.eps = fm->eps;
    hp.weight_decay = fm->wd;
    hp.adamw_mode = 1;
    hp.step = k;
    hp.threads = threads;
    zn_moments mv = zn_moments_of(ZN_MOM_Q8, mq, vq, am, av, ZN_Q8_BNB);
    int rc = zn_adam_step_mom_with(ops, &hp, p, &mv, g, ZN_DTYPE_F32, 1.0f, NULL, ZN_DTYPE_BF16, n);
    ZT_CHECK_MSG(rc == 0, "step: %s", zn_last_error());

    double worst_p = 0, worst_a = 0;
    for (size_t i = 0; i < n; i++) {
        double allow = 1e-6 * (fabs(rp[i]) + fabs((double)rp[i] - p0[i]));
        double e = fabs((double)p[i] - rp[i]) / allow;
        worst_p = e > worst_p ? e : worst_p;
    }
    for (size_t b = 0; b < fm->nb; b++) {
        double e1 = fabs((double)am[b] - ram[b]) / (1e-6 * ram[b] + 1e-38);
        double e2 = fabs((double)av[b] - rav[b]) / (1e-6 * rav[b] + 1e-38);
        worst_a = e1 > worst_a ? e1 : worst_a;
        worst_a = e2 > worst_a ? e2 : worst_a;
    }
    ZT_CHECK_MSG(worst_p <= 1.0, "%s step %d: p off bitsandbytes' by %.3g of the bound",
                 ops->name, k, worst_p);
    ZT_CHECK_MSG(worst_a <= 1.0, "%s step %d: absmax off bitsandbytes' by %.3g of the bound",
                 ops->name, k, worst_a);

    const zn_q8_table *ts = zn_q8_table_get(ZN_Q8_BNB, 1), *tu = zn_q8_table_get(ZN_Q8_BNB, 0);
    int ties = 0, off = 0, table_only = 0, agree_bnb = 0, other = 0;
    for (int s = 0; s < 2; s++) {
        const uint8_t *z = s ? vq : mq, *near = s ? nvq : nmq, *bnb = s ? rvq : rmq;
        const float *x = s ? vf : mf, *ref_abs = s ? rav : ram;
        const zn_q8_table *t = s ? tu : ts;
        for (size_t i = 0; i < n; i++) {
            float a = ref_abs[i / ZN_Q8_BLOCK];
            float y = a == 0.0f ? 0.0f : x[i] * (1.0f / a);
            y = y < -1.0f ? -1.0f : y > 1.0f ? 1.0f : y;
            if (z[i] != near[i]) {
                if (abs((int)z[i] - (int)near[i]) == 1 && nearly_tie(t->mid, y, z[i], near[i]))
                    ties++;
                else
                    off++;
            }
            if (z[i] == bnb[i])
                agree_bnb++;
            else if (near[i] != bnb[i])
                table_only++;   /* bitsandbytes' table, not the nearest entry */
            else if (!(abs((int)z[i] - (int)near[i]) == 1 &&
                       nearly_tie(t->mid, y, z[i], near[i])))
                other++;
        }
    }
    ZT_CHECK_MSG(off == 0, "%s step %d: %d codes are not the nearest map entry (and not at a "
                 "tie)", ops->name, k, off);
    ZT_CHECK_MSG(other == 0, "%s step %d: %d codes differ from bitsandbytes' outside its "
                 "table's bins and the ties", ops->name, k, other);
    /* near-ties are rare: a few per 20634 codes would already be many */
    ZT_CHECK_MSG(ties <= 20, "%s step %d: %d codes at near-ties", ops->name, k, ties);
    if (threads == 1)
        printf("# %s step %d: %d of %zu codes equal bitsandbytes', %d differ where its table "
               "misses the nearest entry, %d at near-ties; worst p %.3g, absmax %.3g of the "
               "bound\n", ops->name, k, agree_bnb, 2 * n, table_only, ties, worst_p, worst_a);
    free(p); free(g); free(mq); free(vq); free(am); free(av); free(rp); free(ram); free(rav);
    free(rmq); free(rvq); free(nmq); free(nvq); free(mf); free(vf); free(p0);
}

/* ---- several tensors: fp32 states for the small ones ---------------------- */

#define FIX_T ZN_SOURCE_ROOT "/tests/fixtures/optim8/adamw8bit-tensors.safetensors"

/* bitsandbytes' AdamW8bit over five parameters with its default
 * min_8bit_size (4096): the 3584-, 512- and 1101-element ones keep fp32
 * states, which zinc keeps as fp32 blocks (zn_moments.f32, the fixture's
 * f32_runs); the others are 8-bit, each from its own first element. Per
 * step, from bitsandbytes' inputs:
 *  - p within test_adam's bound, 1e-6 of |p| plus the step taken, the
 *    step's part scaled by m's cancellation ((|beta1 m| + |(1 - beta1)
 *    g|) / |m'|, at least 1): where the two terms of the new m nearly
 *    cancel, both sides' m carry the rounding of the terms, which is that
 *    many times m's own ulp (one element of this fixture has m' = -4.1e-9
 *    from terms of 3.6e-7);
 *  - the fp32 moments within 1e-6 of the terms that make them (|beta1 m|
 *    + |(1 - beta1) g|, |beta2 v| + |(1 - beta2) g^2|): the same fp32
 *    formula, each operation rounding to half an ulp of those terms, in
 *    another order (zinc's FMA);
 *  - the 8-bit tensors' absmax and codes by check_bnb_step's rules
 *    (within 1e-6; the nearest entry of bitsandbytes' unquantized moment
 *    but at near-ties; bitsandbytes' own codes but where its table misses
 *    the nearest entry);
 *  - the fp32 blocks' codes and absmax untouched. */
static void check_bnb_tensors(zn_st *st, const zn_optim_ops *ops, int threads)
{
    const char *meta = zn_st_metadata(st, "zinc");
    size_t n = 0;
    int steps = 0, slots = 0;
    unsigned long long r[3][3];
    double lr, b1, b2, eps, wd;
    const char *fr = meta ? strstr(meta, "\"f32_runs\"") : NULL;
    if (!meta || sscanf(meta, "{\"n\": %zu, \"steps\": %d", &n, &steps) != 2 ||
        sscanf(strstr(meta, "\"lr\""), "\"lr\": %lf, \"beta1\": %lf, \"beta2\": %lf, \"eps\": "
               "%lf, \"weight_decay\": %lf", &lr, &b1, &b2, &eps, &wd) != 5 || !fr ||
        sscanf(fr, "\"f32_runs\": [[%llu, %llu, %llu], [%llu, %llu, %llu], [%llu, %llu, "
               "%llu]], \"f32_slots\": %d", &r[0][0], &r[0][1], &r[0][2], &r[1][0], &r[1][1],
               &r[1][2], &r[2][0], &r[2][1], &r[2][2], &slots) != 10)
        ZT_SETUP_FAIL("%s: metadata unreadable", FIX_T);
    zn_q8_f32_run runs[3];
    for (int i = 0; i < 3; i++)
        runs[i] = (zn_q8_f32_run){ r[i][0], r[i][1], r[i][2] };
    size_t nb = zn_q8_blocks(n), ns = (size_t)slots * ZN_Q8_BLOCK;
    const zn_q8_table *ts = zn_q8_table_get(ZN_Q8_BNB, 1), *tu = zn_q8_table_get(ZN_Q8_BNB, 0);
    for (int k = 1; k <= steps; k++) {
        char nm[64];
#define L(s) (snprintf(nm, sizeof nm, "s%d." s, k), load(st, nm, NULL))
        float *p = L("p"), *g = L("g"), *rp = L("out.p");
        uint8_t *q[2] = { L("m_codes"), L("v_codes") }, *rq[2] = { L("out.m_codes"),
                                                                    L("out.v_codes") };
        uint8_t *near[2] = { L("out.m_nearest"), L("out.v_nearest") };
        float *a[2] = { L("m_absmax"), L("v_absmax") }, *ra[2] = { L("out.m_absmax"),
                                                                   L("out.v_absmax") };
        float *f[2] = { L("m_f32"), L("v_f32") }, *rf[2] = { L("out.m_f32"), L("out.v_f32") };
        float *pre[2] = { L("out.m_pre"), L("out.v_pre") };
#undef L
        float *p0 = xmalloc(n * 4), *f0[2] = { xmalloc(ns * 4), xmalloc(ns * 4) };
        uint8_t *q0[2] = { xmalloc(n), xmalloc(n) };
        float *a0[2] = { xmalloc(nb * 4), xmalloc(nb * 4) };
        memcpy(p0, p, n * 4);
        for (int j = 0; j < 2; j++) {
            memcpy(f0[j], f[j], ns * 4);
            memcpy(q0[j], q[j], n);
            memcpy(a0[j], a[j], nb * 4);
        }
        zn_adam_params hp = zn_adam_params_default();
        hp.lr = (float)lr;
        hp.beta1 = b1;
        hp.beta2 = b2;
        hp.eps = (float)eps;
        hp.weight_decay = (float)wd;
        hp.adamw_mode = 1;
        hp.step = k;
        hp.threads = threads;
        zn_moments mv = zn_moments_of(ZN_MOM_Q8, q[0], q[1], a[0], a[1], ZN_Q8_BNB);
        mv.f32 = runs;
        mv.n_f32 = 3;
        mv.m_f32 = f[0];
        mv.v_f32 = f[1];
        int rc = zn_adam_step_mom_with(ops, &hp, p, &mv, g, ZN_DTYPE_F32, 1.0f, NULL,
                                       ZN_DTYPE_BF16, n);
        ZT_CHECK_MSG(rc == 0, "tensors step: %s", zn_last_error());
        double worst_p = 0, worst_f = 0, worst_a = 0;
        /* the step carries m's error: where beta1 m and (1 - beta1) g
         * cancel, m's relative error (and the step's) grows by their sum
         * over |m| */
        const float *map_s = zn_q8_map(1);
        for (size_t i = 0; i < n; i++) {
            size_t bl = i / ZN_Q8_BLOCK;
            int64_t sl = -1;
            for (int ru = 0; ru < 3; ru++)
                if (bl >= runs[ru].block && bl < runs[ru].block + runs[ru].n)
                    sl = (int64_t)((runs[ru].slot + bl - runs[ru].block) * ZN_Q8_BLOCK +
                                   i % ZN_Q8_BLOCK);
            double m_in = sl >= 0 ? f0[0][sl] : (double)map_s[q0[0][i]] * a0[0][bl];
            double m_out = sl >= 0 ? rf[0][sl] : pre[0][i];
            double cancel = (b1 * fabs(m_in) + (1 - b1) * fabs(g[i])) / (fabs(m_out) + 1e-38);
            cancel = cancel > 1.0 ? cancel : 1.0;
            double allow = 1e-6 * (fabs(rp[i]) + fabs((double)rp[i] - p0[i]) * cancel);
            double e = fabs((double)p[i] - rp[i]) / allow;
            worst_p = e > worst_p ? e : worst_p;
        }
        int untouched = 1, off = 0, other = 0, ties = 0, table_only = 0, f32_codes = 0;
        for (int j = 0; j < 2; j++) {
            double b = j ? b2 : b1;
            for (int ru = 0; ru < 3; ru++)
                for (size_t e = 0; e < runs[ru].n * ZN_Q8_BLOCK; e++) {
                    size_t s = runs[ru].slot * ZN_Q8_BLOCK + e;
                    size_t i = runs[ru].block * ZN_Q8_BLOCK + e;
                    if (i >= n)
                        break;
                    double gt = j ? (1 - b) * (double)g[i] * g[i] : (1 - b) * fabs(g[i]);
                    double allow = 1e-6 * (b * fabs(f0[j][s]) + gt) + 1e-38;
                    double d = fabs((double)f[j][s] - rf[j][s]) / allow;
                    worst_f = d > worst_f ? d : worst_f;
                    untouched &= q[j][i] == q0[j][i];
                    f32_codes++;
                }
            const uint8_t *z = q[j];
            const zn_q8_table *t = j ? tu : ts;
            for (size_t bl = 0; bl < nb; bl++) {
                int is_f32 = 0;
                for (int ru = 0; ru < 3; ru++)
                    is_f32 |= bl >= runs[ru].block && bl < runs[ru].block + runs[ru].n;
                if (is_f32) {
                    untouched &= a[j][bl] == a0[j][bl];
                    continue;
                }
                double e = fabs((double)a[j][bl] - ra[j][bl]) / (1e-6 * ra[j][bl] + 1e-38);
                worst_a = e > worst_a ? e : worst_a;
                for (size_t i = bl * ZN_Q8_BLOCK; i < n && i < (bl + 1) * ZN_Q8_BLOCK; i++) {
                    float am = ra[j][bl];
                    float y = am == 0.0f ? 0.0f : pre[j][i] * (1.0f / am);
                    y = y < -1.0f ? -1.0f : y > 1.0f ? 1.0f : y;
                    int tie = abs((int)z[i] - (int)near[j][i]) == 1 &&
                              nearly_tie(t->mid, y, z[i], near[j][i]);
                    if (z[i] != near[j][i])
                        tie ? ties++ : off++;
                    if (z[i] != rq[j][i] && near[j][i] != rq[j][i])
                        table_only++;
                    else if (z[i] != rq[j][i] && !tie)
                        other++;
                }
            }
        }
        ZT_CHECK_MSG(worst_p <= 1.0, "%s tensors step %d: p off bitsandbytes' by %.3g of the "
                     "bound", ops->name, k, worst_p);
        ZT_CHECK_MSG(worst_f <= 1.0, "%s tensors step %d: the fp32 tensors' moments off "
                     "bitsandbytes' by %.3g of the bound", ops->name, k, worst_f);
        ZT_CHECK_MSG(worst_a <= 1.0, "%s tensors step %d: absmax off bitsandbytes' by %.3g of "
                     "the bound", ops->name, k, worst_a);
        ZT_CHECK_MSG(off == 0 && other == 0, "%s tensors step %d: %d codes not the nearest "
                     "entry, %d differ from bitsandbytes' outside its table's bins and the "
                     "ties", ops->name, k, off, other);
        ZT_CHECK_MSG(ties <= 20, "%s tensors step %d: %d codes at near-ties", ops->name, k, ties);
        ZT_CHECK_MSG(untouched, "%s tensors step %d: an fp32 block's codes or absmax changed",
                     ops->name, k);
        if (threads == 1)
            printf("# %s tensors step %d: %d fp32 moments (worst %.3g of the bound), p worst "
                   "%.3g, absmax %.3g; %d codes differ where bitsandbytes' table misses the "
                   "nearest entry, %d at near-ties\n", ops->name, k, f32_codes, worst_f,
                   worst_p, worst_a, table_only, ties);
        free(p), free(g), free(rp), free(p0);
        for (int j = 0; j < 2; j++) {
            free(q[j]), free(rq[j]), free(near[j]), free(a[j]), free(ra[j]), free(f[j]);
            free(rf[j]), free(pre[j]), free(f0[j]), free(q0[j]), free(a0[j]);
        }
    }
}

/* fp32 blocks in a flat 8-bit state (zn_moments.f32), without a
 * reference: a run's blocks step exactly as zn_adam_step's fp32 moments
 * on the same path, the others exactly as a state without runs; any
 * thread count gives the same bits; the bf16 master's step
 * (zn_adam_step_sr) takes them too; conversions keep them exactly; bad
 * runs are refused. */
static void check_f32_runs(const zn_optim_ops *ops)
{
    const size_t n = 40 * ZN_Q8_BLOCK + 77, nb = zn_q8_blocks(n);
    /* blocks 3-5 and the last, partial one; the state's block numbering
     * starts at 7 (f32_base) */
    const zn_q8_f32_run runs[2] = { { 10, 3, 1 }, { 7 + nb - 1, 1, 0 } };
    float *p[3], *g = xmalloc(n * 4), *mf[3], *vf[3], *fm = xmalloc(n * 4), *fv = xmalloc(n * 4);
    uint8_t *mq[3], *vq[3];
    float *am[3], *av[3];
    for (size_t i = 0; i < n; i++)
        g[i] = (float)(((double)(mix(77 + i) >> 11) * 0x1p-53 - 0.5) * pow(10.0, -(double)(i % 6)));
    for (int r = 0; r < 3; r++) {
        p[r] = xmalloc(n * 4);
        mq[r] = xmalloc(n), vq[r] = xmalloc(n);
        am[r] = xmalloc(nb * 4), av[r] = xmalloc(nb * 4);
        mf[r] = xmalloc(4 * ZN_Q8_BLOCK * 4), vf[r] = xmalloc(4 * ZN_Q8_BLOCK * 4);
        for (size_t i = 0; i < n; i++)
            p[r][i] = (float)((double)(mix(5 + i) >> 11) * 0x1p-53 - 0.5);
        memset(mq[r], 0, n), memset(vq[r], 0, n);
        memset(am[r], 0, nb * 4), memset(av[r], 0, nb * 4);
        memset(mf[r], 0, 4 * ZN_Q8_BLOCK * 4), memset(vf[r], 0, 4 * ZN_Q8_BLOCK * 4);
    }
    memset(fm, 0, n * 4), memset(fv, 0, n * 4);
    zn_adam_params hp = zn_adam_params_default();
    hp.lr = 1e-3f;
    hp.weight_decay = 0.01f;
    float *pf = xmalloc(n * 4);
    memcpy(pf, p[0], n * 4);
    for (hp.step = 1; hp.step <= 3; hp.step++) {
        /* r 0: with the runs, 1 thread; r 1: 3 threads; r 2: no runs */
        for (int r = 0; r < 3; r++) {
            zn_moments mv = zn_moments_of(ZN_MOM_Q8, mq[r], vq[r], am[r], av[r], ZN_Q8_BNB);
            if (r < 2) {
                mv.f32 = runs, mv.n_f32 = 2, mv.f32_base = 7;
                mv.m_f32 = mf[r], mv.v_f32 = vf[r];
            }
            hp.threads = r == 1 ? 3 : 1;
            ZT_CHECK(zn_adam_step_mom_with(ops, &hp, p[r], &mv, g, ZN_DTYPE_F32, 1.0f, NULL,
                                           ZN_DTYPE_BF16, n) == 0);
        }
        hp.threads = 1;
        ZT_CHECK(zn_adam_step_with(ops->adam, &hp, pf, fm, fv, g, ZN_DTYPE_F32, 1.0f, NULL,
                                   ZN_DTYPE_BF16, n) == 0);
    }
    ZT_CHECK_MSG(!memcmp(p[0], p[1], n * 4) && !memcmp(mq[0], mq[1], n) &&
                 !memcmp(am[0], am[1], nb * 4) && !memcmp(mf[0], mf[1], 4 * ZN_Q8_BLOCK * 4) &&
                 !memcmp(vf[0], vf[1], 4 * ZN_Q8_BLOCK * 4),
                 "%s: fp32 blocks: 3 threads differ from 1", ops->name);
    size_t bad_f = 0, bad_q = 0;
    for (size_t b = 0; b < nb; b++) {
        int64_t sl = b >= 3 && b < 6 ? (int64_t)(b - 2) : b == nb - 1 ? 0 : -1;
        for (size_t i = b * ZN_Q8_BLOCK; i < n && i < (b + 1) * ZN_Q8_BLOCK; i++) {
            size_t e = i % ZN_Q8_BLOCK;
            if (sl >= 0)
                bad_f += memcmp(&p[0][i], &pf[i], 4) ||
                         memcmp(&mf[0][sl * ZN_Q8_BLOCK + e], &fm[i], 4) ||
                         memcmp(&vf[0][sl * ZN_Q8_BLOCK + e], &fv[i], 4) || mq[0][i] != 0;
            else
                bad_q += memcmp(&p[0][i], &p[2][i], 4) || mq[0][i] != mq[2][i] ||
                         vq[0][i] != vq[2][i];
        }
        if (sl < 0)
            bad_q += am[0][b] != am[2][b] || av[0][b] != av[2][b];
        else
            bad_f += am[0][b] != 0.0f;
    }
    ZT_CHECK_MSG(bad_f == 0, "%s: %zu elements of fp32 blocks are not the fp32 step's (or their "
                 "codes were written)", ops->name, bad_f);
    ZT_CHECK_MSG(bad_q == 0, "%s: %zu elements of 8-bit blocks differ from a state without "
                 "fp32 blocks", ops->name, bad_q);

    /* the bf16 master steps them too: its fp32 blocks' moments are the
     * fp32-moment bf16-master step's */
    uint16_t *h[2];
    float *hm = xmalloc(n * 4), *hv = xmalloc(n * 4);
    memset(hm, 0, n * 4), memset(hv, 0, n * 4);
    for (int r = 0; r < 2; r++) {
        h[r] = xmalloc(n * 2);
        for (size_t i = 0; i < n; i++)
            h[r][i] = zn_f32_to_bf16(p[2][i]);
    }
    memset(mf[2], 0, 4 * ZN_Q8_BLOCK * 4), memset(vf[2], 0, 4 * ZN_Q8_BLOCK * 4);
    memset(mq[2], 0, n), memset(vq[2], 0, n), memset(am[2], 0, nb * 4), memset(av[2], 0, nb * 4);
    hp.step = 1;
    zn_moments q = zn_moments_of(ZN_MOM_Q8, mq[2], vq[2], am[2], av[2], ZN_Q8_BNB);
    q.f32 = runs, q.n_f32 = 2, q.f32_base = 7, q.m_f32 = mf[2], q.v_f32 = vf[2];
    zn_moments f = zn_moments_of(ZN_MOM_F32, hm, hv, NULL, NULL, ZN_Q8_BNB);
    ZT_CHECK(zn_adam_step_sr_with(ops, &hp, h[0], &q, g, ZN_DTYPE_F32, 1.0f, 9, 0, n) == 0);
    ZT_CHECK(zn_adam_step_sr_with(ops, &hp, h[1], &f, g, ZN_DTYPE_F32, 1.0f, 9, 0, n) == 0);
    size_t bad_sr = 0;
    for (size_t i = 3 * ZN_Q8_BLOCK; i < 6 * ZN_Q8_BLOCK; i++)
        bad_sr += h[0][i] != h[1][i] ||
                  memcmp(&mf[2][(i / ZN_Q8_BLOCK - 2) * ZN_Q8_BLOCK + i % ZN_Q8_BLOCK], &hm[i], 4);
    ZT_CHECK_MSG(bad_sr == 0, "%s: bf16 master: %zu elements of fp32 blocks are not the fp32 "
                 "moments' step", ops->name, bad_sr);

    /* conversions: 8-bit with fp32 blocks -> fp32 -> the same, exactly in
     * the fp32 blocks; 8-bit -> 8-bit as stored */
    zn_moments src = zn_moments_of(ZN_MOM_Q8, mq[0], vq[0], am[0], av[0], ZN_Q8_BNB);
    src.f32 = runs, src.n_f32 = 2, src.f32_base = 7, src.m_f32 = mf[0], src.v_f32 = vf[0];
    zn_moments mid = zn_moments_of(ZN_MOM_F32, fm, fv, NULL, NULL, ZN_Q8_BNB);
    zn_moments back = zn_moments_of(ZN_MOM_Q8, mq[1], vq[1], am[1], av[1], ZN_Q8_BNB);
    back.f32 = runs, back.n_f32 = 2, back.f32_base = 7, back.m_f32 = mf[1], back.v_f32 = vf[1];
    memset(mf[1], 0, 4 * ZN_Q8_BLOCK * 4);
    ZT_CHECK(zn_mom_convert(&mid, &src, n) == 0);
    ZT_CHECK(zn_mom_convert(&back, &mid, n) == 0);
    ZT_CHECK_MSG(!memcmp(mf[0], mf[1], 4 * ZN_Q8_BLOCK * 4) &&
                 !memcmp(vf[0], vf[1], 4 * ZN_Q8_BLOCK * 4),
                 "fp32 blocks changed through an fp32 conversion");
    memset(mq[1], 0xaa, n);
    zn_moments plain = zn_moments_of(ZN_MOM_Q8, mq[1], vq[1], am[1], av[1], ZN_Q8_BNB);
    ZT_CHECK(zn_mom_convert(&plain, &src, n) == 0);
    size_t kept = 0;
    for (size_t i = 0; i < 3 * ZN_Q8_BLOCK; i++)
        kept += mq[1][i] == mq[0][i];
    ZT_CHECK_MSG(kept == 3 * ZN_Q8_BLOCK, "8-bit to 8-bit with fp32 blocks: %zu of %d codes "
                 "kept", kept, 3 * ZN_Q8_BLOCK);

    /* refused: overlapping or unordered runs, runs without arrays, runs
     * in bf16 moments */
    zn_q8_f32_run over[2] = { { 0, 3, 0 }, { 2, 1, 3 } };
    zn_moments bad = src;
    bad.f32 = over;
    ZT_CHECK(zn_adam_step_mom_with(ops, &hp, p[0], &bad, g, ZN_DTYPE_F32, 1.0f, NULL,
                                   ZN_DTYPE_BF16, n) == -EINVAL);
    ZT_CHECK(strstr(zn_last_error(), "overlap") != NULL);
    bad = src;
    bad.m_f32 = NULL;
    ZT_CHECK(zn_adam_step_mom_with(ops, &hp, p[0], &bad, g, ZN_DTYPE_F32, 1.0f, NULL,
                                   ZN_DTYPE_BF16, n) == -EINVAL);
    bad = src;
    bad.fmt = ZN_MOM_BF16;
    ZT_CHECK(zn_adam_step_mom_with(ops, &hp, p[0], &bad, g, ZN_DTYPE_F32, 1.0f, NULL,
                                   ZN_DTYPE_BF16, n) == -EINVAL);
    for (int r = 0; r < 3; r++) {
        free(p[r]), free(mq[r]), free(vq[r]), free(am[r]), free(av[r]), free(mf[r]);
        free(vf[r]);
    }
    free(h[0]), free(h[1]), free(hm), free(hv);
    free(g), free(fm), free(fv), free(pf);
}

/* ---- bit-identity across threads, paths and the copy ---------------------- */

typedef struct {
    float *p;
    void *m, *v;
    float *am, *av;
    uint16_t *c;
} state;

static void state_init(state *s, zn_mom_fmt f, size_t n, uint64_t seed)
{
    size_t mb = f == ZN_MOM_Q8 ? 1 : 2, nb = zn_q8_blocks(n);
    s->p = xmalloc(n * 4);
    s->m = xmalloc(n * mb);
    s->v = xmalloc(n * mb);
    s->am = xmalloc(nb * 4);
    s->av = xmalloc(nb * 4);
    s->c = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++)
        s->p[i] = (float)((double)(mix(seed + i) >> 11) * 0x1p-53 - 0.5);
    memset(s->m, 0, n * mb);
    memset(s->v, 0, n * mb);
    memset(s->am, 0, nb * 4);
    memset(s->av, 0, nb * 4);
}

static void state_free(state *s)
{
    free(s->p); free(s->m); free(s->v); free(s->am); free(s->av); free(s->c);
}

static int state_same(const state *a, const state *b, zn_mom_fmt f, size_t n)
{
    size_t mb = f == ZN_MOM_Q8 ? 1 : 2, nb = zn_q8_blocks(n);
    return !memcmp(a->p, b->p, n * 4) && !memcmp(a->m, b->m, n * mb) &&
           !memcmp(a->v, b->v, n * mb) && !memcmp(a->c, b->c, n * 2) &&
           (f != ZN_MOM_Q8 || (!memcmp(a->am, b->am, nb * 4) && !memcmp(a->av, b->av, nb * 4)));
}

static void run_steps_as(const zn_optim_ops *ops, state *s, zn_mom_fmt f, size_t n,
                         int threads, zn_dtype gt, int adamw, zn_dtype ct);

static void run_steps(const zn_optim_ops *ops, state *s, zn_mom_fmt f, size_t n, int threads,
                      zn_dtype gt)
{
    run_steps_as(ops, s, f, n, threads, gt, 1, ZN_DTYPE_BF16);
}

/* 5 steps with gradients of type gt (f32, bf16 or f16), AdamW or Adam
 * with L2 (adamw 0), a copy of type ct */
static void run_steps_as(const zn_optim_ops *ops, state *s, zn_mom_fmt f, size_t n,
                         int threads, zn_dtype gt, int adamw, zn_dtype ct)
{
    void *g = xmalloc(n * 4);
    for (int k = 1; k <= 5; k++) {
        for (size_t i = 0; i < n; i++) {
            double mag = pow(10.0, -6.0 * (double)(mix(k * 7919u + i) >> 11) * 0x1p-53);
            float x = (float)(mag * ((double)(mix(k * 31u + i * 3) >> 11) * 0x1p-53 - 0.5));
            if (gt == ZN_DTYPE_F32)
                ((float *)g)[i] = x;
            else if (gt == ZN_DTYPE_BF16)
                ((uint16_t *)g)[i] = zn_f32_to_bf16(x);
            else
                ((uint16_t *)g)[i] = zn_f16_round(x);
        }
        zn_adam_params hp = zn_adam_params_default();
        hp.step = k;
        hp.weight_decay = 0.01f;
        hp.adamw_mode = adamw;
        hp.threads = threads;
        zn_moments mv = zn_moments_of(f, s->m, s->v, s->am, s->av, ZN_Q8_BNB);
        int rc = zn_adam_step_mom_with(ops, &hp, s->p, &mv, g, gt, 0.5f, s->c, ct, n);
        ZT_CHECK_MSG(rc == 0, "step: %s", zn_last_error());
    }
    free(g);
}

static void check_identity(const zn_optim_ops *const *ops, int nops)
{
    static const size_t sizes[] = { 1, 9, 255, 256, 257, 4097, 100003 };
    for (int f = ZN_MOM_BF16; f <= ZN_MOM_Q8; f++) {
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            size_t n = sizes[si];
            zn_dtype gt = si & 1 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
            state ref;
            state_init(&ref, f, n, n);
            run_steps(ops[0], &ref, f, n, 1, gt);
            for (int o = 0; o < nops; o++) {
                state one;
                state_init(&one, f, n, n);
                run_steps(ops[o], &one, f, n, 1, gt);
                /* the vector paths share one operation order; the scalar
                 * path has no FMA and is its own reference */
                if (ops[o]->isa != ZN_ISA_SCALAR && ops[0]->isa != ZN_ISA_SCALAR)
                    ZT_CHECK_MSG(state_same(&one, &ref, f, n), "%s moments, n %zu: %s differs "
                                 "from %s", zn_mom_fmt_name(f), n, ops[o]->name, ops[0]->name);
                for (int th = 2; th <= 3; th++) {
                    state s;
                    state_init(&s, f, n, n);
                    run_steps(ops[o], &s, f, n, th, gt);
                    ZT_CHECK_MSG(state_same(&s, &one, f, n), "%s moments, n %zu: %s with %d "
                                 "threads differs from 1 thread", zn_mom_fmt_name(f), n,
                                 ops[o]->name, th);
                    state_free(&s);
                }
                state_free(&one);
            }
            state_free(&ref);
        }
    }
}

/* The kernels' other variants (fp16 gradients and copy, Adam with L2) on
 * every vector path, whose int8 steps must agree bit for bit: the VBMI
 * path fuses a block into one pass with its own copy of the Adam formula. */
static void check_identity_variants(const zn_optim_ops *const *ops, int nops)
{
    static const size_t sizes[] = { 200, 4097 };
    const zn_optim_ops *first = NULL;
    for (int o = 0; o < nops && !first; o++)
        first = ops[o]->isa != ZN_ISA_SCALAR ? ops[o] : NULL;
    if (!first)
        return;
    for (size_t si = 0; si < 2; si++) {
        for (int var = 0; var < 3; var++) {
            size_t n = sizes[si];
            zn_dtype gt = var == 0 ? ZN_DTYPE_F16 : ZN_DTYPE_BF16;
            zn_dtype ct = var == 1 ? ZN_DTYPE_F16 : ZN_DTYPE_BF16;
            int adamw = var != 2;
            state ref;
            state_init(&ref, ZN_MOM_Q8, n, n + (size_t)var);
            run_steps_as(first, &ref, ZN_MOM_Q8, n, 1, gt, adamw, ct);
            for (int o = 0; o < nops; o++) {
                if (ops[o]->isa == ZN_ISA_SCALAR || ops[o] == first)
                    continue;
                state s;
                state_init(&s, ZN_MOM_Q8, n, n + (size_t)var);
                run_steps_as(ops[o], &s, ZN_MOM_Q8, n, 2, gt, adamw, ct);
                ZT_CHECK_MSG(state_same(&s, &ref, ZN_MOM_Q8, n), "int8 moments, n %zu, variant "
                             "%d: %s differs from %s", n, var, ops[o]->name, first->name);
                state_free(&s);
            }
            state_free(&ref);
        }
    }
}

/* Each path's fused steps (adam_bf16 for bf16 moments, q8_step for 8-bit
 * ones) against the same path's pieces (widen or dequantize, the fp32
 * kernel, round or quantize, block by block): the same bits for every
 * gradient and copy type, Adam with L2 and AdamW, without a copy, on tails
 * of every length, with NaN and infinite gradients, bf16 moments over 40
 * decades and near bf16's largest, random 8-bit codes and absmax under
 * bitsandbytes' and torchao's schemes, 1 and 3 threads. Three steps each. */
static void check_fused(const zn_optim_ops *const *ops, int nops)
{
    static const size_t sizes[] = { 1, 7, 15, 16, 17, 31, 255, 256, 257, 4097, 100003 };
    for (int o = 0; o < nops; o++) {
        for (int fv = 0; fv < 3; fv++) {
            zn_mom_fmt f = fv ? ZN_MOM_Q8 : ZN_MOM_BF16;
            zn_q8_scheme scheme = fv == 2 ? ZN_Q8_TORCHAO : ZN_Q8_BNB;
            zn_optim_ops pieces = *ops[o];
            if (f == ZN_MOM_BF16 ? !pieces.adam_bf16 : !pieces.q8_step)
                continue;
            if (f == ZN_MOM_BF16)
                pieces.adam_bf16 = NULL;
            else
                pieces.q8_step = NULL;
            size_t mb = f == ZN_MOM_Q8 ? 1 : 2;
            int bad = 0, runs = 0;
            for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                for (int var = 0; var < 5; var++) {
                    size_t n = sizes[si], nb = zn_q8_blocks(n);
                    zn_dtype gt = var == 0 ? ZN_DTYPE_F32 : var == 1 ? ZN_DTYPE_F16 : ZN_DTYPE_BF16;
                    zn_dtype ct = var == 1 ? ZN_DTYPE_F16 : ZN_DTYPE_BF16;
                    int copy = var != 3, adamw = var != 4, threads = 1 + 2 * (var & 1);
                    float *p[2], *am[2], *av[2], *g = xmalloc(n * 4);
                    uint8_t *m[2], *v[2];
                    uint16_t *c[2], *g16 = xmalloc(n * 2);
                    for (int k = 0; k < 2; k++) {
                        p[k] = xmalloc(n * 4);
                        m[k] = xmalloc(n * mb);
                        v[k] = xmalloc(n * mb);
                        am[k] = xmalloc(nb * 4);
                        av[k] = xmalloc(nb * 4);
                        c[k] = xmalloc(n * 2);
                        for (size_t i = 0; i < n; i++) {
                            uint64_t r = mix(n * 131 + i);
                            p[k][i] = (float)((double)(r >> 11) * 0x1p-53 - 0.5);
                            if (f == ZN_MOM_Q8) {
                                m[k][i] = (uint8_t)(r >> 24);
                                v[k][i] = (uint8_t)(r >> 32);
                                continue;
                            }
                            /* over 40 decades, a few near bf16's largest */
                            double e = pow(10.0, -36.0 + 40.0 * (double)(r & 0xffff) / 65536.0);
                            float mm = (float)(e * ((r >> 20 & 1) ? -1 : 1));
                            float vv = (float)(e * e > 3e38 ? e : e * e);
                            ((uint16_t *)m[k])[i] = zn_f32_to_bf16(i % 97 == 5 ? -3e38f : mm);
                            ((uint16_t *)v[k])[i] = zn_f32_to_bf16(i % 89 == 7 ? 3e38f : vv);
                        }
                        for (size_t b = 0; b < nb; b++) {
                            double e = (double)(mix(b + 5) & 0xff) / 256.0;
                            am[k][b] = (float)pow(10.0, -8.0 + 7.0 * e);
                            av[k][b] = am[k][b] * am[k][b];
                        }
                        memset(c[k], 0xab, n * 2);
                    }
                    for (int step = 1; step <= 3; step++) {
                        for (size_t i = 0; i < n; i++) {
                            uint64_t r = mix(step * 7919u + i);
                            double mag = pow(10.0, -8.0 * (double)(r >> 11) * 0x1p-53);
                            float x = (float)(mag * ((double)(mix(r) >> 11) * 0x1p-53 - 0.5));
                            x = i % 211 == 13 ? NAN : i % 223 == 17 ? -INFINITY : x;
                            g[i] = x;
                            g16[i] = gt == ZN_DTYPE_BF16 ? zn_f32_to_bf16(x) : zn_f16_round(x);
                        }
                        const void *gp = gt == ZN_DTYPE_F32 ? (const void *)g : (const void *)g16;
                        zn_adam_params hp = zn_adam_params_default();
                        hp.step = step;
                        hp.weight_decay = 0.01f;
                        hp.adamw_mode = adamw;
                        hp.threads = threads;
                        for (int k = 0; k < 2; k++) {
                            zn_moments mv = zn_moments_of(f, m[k], v[k], am[k], av[k], scheme);
                            int rc = zn_adam_step_mom_with(k ? &pieces : ops[o], &hp, p[k], &mv,
                                                           gp, gt, 0.5f, copy ? c[k] : NULL, ct,
                                                           n);
                            ZT_CHECK_MSG(rc == 0, "step: %s", zn_last_error());
                        }
                    }
                    runs++;
                    if (memcmp(p[0], p[1], n * 4) || memcmp(m[0], m[1], n * mb) ||
                        memcmp(v[0], v[1], n * mb) || memcmp(c[0], c[1], n * 2) ||
                        (f == ZN_MOM_Q8 && (memcmp(am[0], am[1], nb * 4) ||
                                            memcmp(av[0], av[1], nb * 4)))) {
                        if (bad++ < 3)
                            fprintf(stderr, "%s fused %s step (scheme %d): n %zu variant %d "
                                    "differs from the pieces\n", ops[o]->name,
                                    zn_mom_fmt_name(f), (int)scheme, n, var);
                    }
                    for (int k = 0; k < 2; k++) {
                        free(p[k]);
                        free(m[k]);
                        free(v[k]);
                        free(am[k]);
                        free(av[k]);
                        free(c[k]);
                    }
                    free(g);
                    free(g16);
                }
            }
            ZT_CHECK_MSG(bad == 0, "%s: %d of %d fused %s runs (scheme %d) differ from the "
                         "pieces", ops[o]->name, bad, runs, zn_mom_fmt_name(f), (int)scheme);
        }
    }
}

/* ---- each path's pieces against the scalar forms -------------------------
 * Quantize and dequantize one block of every kind below with every path and
 * both schemes; scale and codes must equal the scalar forms' bit for bit,
 * and nothing past n may be written (outputs start as poison). */

enum { PIECE_KINDS = 9 };

/* block kind `kind` of n elements for the map of table t, seeded */
static void piece_block(float *x, size_t n, int kind, const zn_q8_table *t, int is_signed,
                        uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = mix(seed * 1009 + i);
        double u = (double)(r >> 11) * 0x1p-53;
        float sgn = is_signed && (r & 1) ? -1.0f : 1.0f;
        float v;
        switch (kind) {
        case 0: /* magnitudes over 60 decades */
            v = sgn * (float)pow(10.0, -40.0 + 60.0 * u);
            break;
        case 1: /* ties: the midpoints themselves and their neighbours, at scale 1 */
        {
            float m = t->mid[(r >> 8) % 255];
            int w = (int)((r >> 20) % 3);
            v = w == 0 ? m : nextafterf(m, w == 1 ? -2.0f : 2.0f);
            if (!is_signed && v < 0.0f)
                v = 0.0f;
            break;
        }
        case 2: /* zeros of both signs, denormals, the smallest normals */
        {
            static const float z[] = { 0.0f, -0.0f, 0x1p-149f, 0x1.8p-140f, 0x1p-126f,
                                       0x1.fffffcp-127f };
            v = z[(r >> 8) % 6];
            v = is_signed && (r & 2) ? -v : v;
            break;
        }
        case 3: /* only denormals: a scale whose reciprocal overflows */
            v = sgn * zn_bits_f32((uint32_t)(r >> 40) & 0x7fffffu);
            break;
        case 4: /* huge values beside small ones */
            v = sgn * (u < 0.1 ? 3e38f : (float)u * 1e-3f);
            break;
        case 5: /* absmax 0: zeros of both signs */
            v = is_signed && (r & 2) ? -0.0f : 0.0f;
            break;
        case 6: /* a NaN among ordinary values */
            v = i == 3 ? NAN : sgn * (float)u;
            break;
        case 7: /* tiny magnitudes around the smallest midpoints */
            v = sgn * (float)ldexp(u, -20 - (int)((r >> 30) % 12));
            break;
        default: /* ordinary moments */
            v = sgn * (float)(u * u * 1e-2);
        }
        x[i] = v;
    }
    /* ties are exact only at scale 1: one element 1 (or -1) */
    if (kind == 1 && n > 1)
        x[n / 2] = is_signed && (seed & 1) ? -1.0f : 1.0f;
}

static void check_pieces(const zn_optim_ops *const *ops, int nops)
{
    static const size_t sizes[] = { 256, 255, 200, 17, 16, 15, 1 };
    float x[ZN_Q8_BLOCK + 16], ref_out[ZN_Q8_BLOCK + 16], out[ZN_Q8_BLOCK + 16];
    uint8_t ref_q[ZN_Q8_BLOCK + 16], qq[ZN_Q8_BLOCK + 16];
    for (int sc = ZN_Q8_BNB; sc <= ZN_Q8_TORCHAO; sc++) {
        for (int sg = 0; sg < 2; sg++) {
            const zn_q8_table *t = zn_q8_table_get((zn_q8_scheme)sc, sg);
            if (!t)
                continue;
            int bad_q = 0, bad_d = 0, blocks = 0;
            for (int kind = 0; kind < PIECE_KINDS; kind++) {
                for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                    for (uint64_t seed = 1; seed <= 4; seed++) {
                        size_t n = sizes[si];
                        piece_block(x, n, kind, t, sg, seed * 31 + (uint64_t)kind);
                        memset(ref_q, 0xab, sizeof ref_q);
                        float ref_scale = zn_q8_quant_scalar(x, t, ref_q, n);
                        /* dequantize the codes just made, and random codes */
                        uint8_t codes[ZN_Q8_BLOCK];
                        for (size_t i = 0; i < n; i++)
                            codes[i] = seed & 1 ? ref_q[i] : (uint8_t)mix(seed * 7 + i);
                        float absmax = kind == 3 ? 0x1p-140f : kind == 4 ? 3e38f : ref_scale;
                        memset(ref_out, 0xab, sizeof ref_out);
                        zn_q8_dequant_scalar(codes, t, absmax, ref_out, n);
                        blocks++;
                        for (int o = 0; o < nops; o++) {
                            memset(qq, 0xab, sizeof qq);
                            float scale = ops[o]->q8_quant(x, t, qq, n);
                            if (zn_f32_bits(scale) != zn_f32_bits(ref_scale) ||
                                memcmp(qq, ref_q, sizeof qq)) {
                                if (bad_q++ < 3)
                                    fprintf(stderr, "quant %s: kind %d n %zu seed %llu differs\n",
                                            ops[o]->name, kind, n, (unsigned long long)seed);
                            }
                            memset(out, 0xab, sizeof out);
                            ops[o]->q8_dequant(codes, t, absmax, out, n);
                            if (memcmp(out, ref_out, sizeof out)) {
                                if (bad_d++ < 3)
                                    fprintf(stderr, "dequant %s: kind %d n %zu differs\n",
                                            ops[o]->name, kind, n);
                            }
                        }
                    }
                }
            }
            const char *name = sc == ZN_Q8_BNB ? "bitsandbytes" : "torchao";
            ZT_CHECK_MSG(bad_q == 0, "%s %s map: %d of %d blocks quantized unlike the scalar "
                         "form", name, sg ? "signed" : "unsigned", bad_q, blocks * nops);
            ZT_CHECK_MSG(bad_d == 0, "%s %s map: %d of %d blocks dequantized unlike the scalar "
                         "form", name, sg ? "signed" : "unsigned", bad_d, blocks * nops);
        }
    }
}

/* Every range of floats sharing their top 16 bits, through each path's
 * quantize: both ends of each range in [-1, 1] and both neighbours of every
 * midpoint, 255 to a block beside a 1 that makes the scale 1 (so y is the
 * value itself), codes against the scalar form. The blocks above reach the
 * ranges at random; the VBMI path's search has a path per range. */
static void check_sweep(const zn_optim_ops *const *ops, int nops)
{
    enum { PER = ZN_Q8_BLOCK - 1 };
    for (int sc = ZN_Q8_BNB; sc <= ZN_Q8_TORCHAO; sc++) {
        for (int sg = 0; sg < 2; sg++) {
            const zn_q8_table *t = zn_q8_table_get((zn_q8_scheme)sc, sg);
            if (!t)
                continue;
            float *val = xmalloc((2 * 65536 + 3 * 255) * sizeof *val);
            size_t nv = 0;
            for (uint32_t key = 0; key < 65536; key++) {
                for (uint32_t low = 0; low <= 0xffffu; low += 0xffffu) {
                    float y = zn_bits_f32(key << 16 | low);
                    if (!isnan(y) && fabsf(y) <= 1.0f)
                        val[nv++] = y;
                }
            }
            for (int i = 0; i < 255; i++) {
                val[nv++] = nextafterf(t->mid[i], -2.0f);
                val[nv++] = t->mid[i];
                val[nv++] = nextafterf(t->mid[i], 2.0f);
            }
            int bad = 0, blocks = 0;
            for (size_t at = 0; at < nv; at += PER, blocks++) {
                float x[ZN_Q8_BLOCK];
                size_t k = nv - at < PER ? nv - at : PER;
                memcpy(x, val + at, k * sizeof *x);
                x[k] = 1.0f;
                uint8_t ref[ZN_Q8_BLOCK], q[ZN_Q8_BLOCK];
                float rs = zn_q8_quant_scalar(x, t, ref, k + 1);
                for (int o = 0; o < nops; o++) {
                    memset(q, 0xab, sizeof q);
                    float s = ops[o]->q8_quant(x, t, q, k + 1);
                    if (s != rs || memcmp(q, ref, k + 1)) {
                        if (bad++ < 3)
                            fprintf(stderr, "sweep %s: block at %zu differs\n", ops[o]->name,
                                    at);
                    }
                }
            }
            ZT_CHECK_MSG(bad == 0, "%s %s map: %d of %d sweep blocks quantized unlike the "
                         "scalar form", sc == ZN_Q8_BNB ? "bitsandbytes" : "torchao",
                         sg ? "signed" : "unsigned", bad, blocks * nops);
            free(val);
        }
    }
}

/* ---- bf16 moments against double ------------------------------------------ */

static double bf16_of(double x)
{
    return zn_bf16_to_f32(zn_f32_to_bf16((float)x));
}

/* whether x lies within 2^-20 of `scale` (the magnitude of the terms
 * summed into x: fp32 arithmetic errs by a few ulps of it, and cancellation
 * makes that large next to x) from a boundary between two bf16 values,
 * where rounding through fp32 may go the other way */
static int near_bf16_boundary(double x, double scale)
{
    double lo = bf16_of(x);
    if (x == 0)
        return 0;
    double ulp = ldexp(1.0, ilogb(lo == 0 ? x : lo) - 7);
    double to_mid = fabs(fabs(x - lo) - ulp / 2);
    return to_mid <= scale * 0x1p-20;
}

static void check_bf16(const zn_optim_ops *ops)
{
    size_t n = 50001;
    uint16_t *m = xmalloc(n * 2), *v = xmalloc(n * 2);
    float *p = xmalloc(n * 4), *g = xmalloc(n * 4);
    double *pd = xmalloc(n * 8), *md = xmalloc(n * 8), *vd = xmalloc(n * 8);
    for (size_t i = 0; i < n; i++) {
        p[i] = (float)((double)(mix(i) >> 11) * 0x1p-53 - 0.5);
        g[i] = (float)(((double)(mix(i + n) >> 11) * 0x1p-53 - 0.5) * 1e-2);
        m[i] = zn_f32_to_bf16((float)(((double)(mix(i + 2 * n) >> 11) * 0x1p-53 - 0.5) * 1e-3));
        v[i] = zn_f32_to_bf16((float)((double)(mix(i + 3 * n) >> 11) * 0x1p-53 * 1e-5));
        pd[i] = p[i];
        md[i] = zn_bf16_to_f32(m[i]);
        vd[i] = zn_bf16_to_f32(v[i]);
    }
    zn_adam_params hp = zn_adam_params_default();
    hp.step = 3;
    hp.weight_decay = 0.1f;
    zn_moments mv = zn_moments_of(ZN_MOM_BF16, m, v, NULL, NULL, ZN_Q8_BNB);
    int rc = zn_adam_step_mom_with(ops, &hp, p, &mv, g, ZN_DTYPE_F32, 1.0f, NULL, ZN_DTYPE_BF16, n);
    ZT_CHECK_MSG(rc == 0, "bf16 step: %s", zn_last_error());
    double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, eps = hp.eps, wd = hp.weight_decay;
    double bc1 = 1 - pow(b1, 3), bc2 = 1 - pow(b2, 3);
    int boundary = 0, wrong = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double gi = g[i];
        double mi = b1 * md[i] + (1 - b1) * gi, vi = b2 * vd[i] + (1 - b2) * gi * gi;
        double pi = pd[i] - lr * wd * pd[i] - lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
        double e = fabs(p[i] - pi) / fabs(pi);
        worst = e > worst ? e : worst;
        double xs[2] = { mi, vi };
        double sc[2] = { fabs(b1 * md[i]) + fabs((1 - b1) * gi), vd[i] + (1 - b2) * gi * gi };
        uint16_t got[2] = { m[i], v[i] };
        for (int s = 0; s < 2; s++) {
            if (got[s] == zn_f32_to_bf16((float)xs[s]) && bf16_of(xs[s]) == zn_bf16_to_f32(got[s]))
                continue;
            if (near_bf16_boundary(xs[s], sc[s]))
                boundary++;
            else
                wrong++;
        }
    }
    ZT_CHECK_MSG(worst <= 1e-6, "%s bf16 moments: p %.3g relative from the double reference",
                 ops->name, worst);
    ZT_CHECK_MSG(wrong == 0, "%s bf16 moments: %d moments are not the bf16 rounding of the "
                 "double result", ops->name, wrong);
    printf("# %s bf16 moments: p within %.3g; %d of %zu moments round the other way at a "
           "boundary\n", ops->name, worst, boundary, 2 * n);
    free(m); free(v); free(p); free(g); free(pd); free(md); free(vd);
}

/* ---- conversions and bad input -------------------------------------------- */

static void check_convert(void)
{
    size_t n = 1000, nb = zn_q8_blocks(n);
    float *m = xmalloc(n * 4), *v = xmalloc(n * 4), *m2 = xmalloc(n * 4), *v2 = xmalloc(n * 4);
    uint8_t *mq = xmalloc(n), *vq = xmalloc(n), *mq2 = xmalloc(n), *vq2 = xmalloc(n);
    float *am = xmalloc(nb * 4), *av = xmalloc(nb * 4), *am2 = xmalloc(nb * 4), *av2 = xmalloc(nb * 4);
    uint16_t *mh = xmalloc(n * 2), *vh = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        m[i] = (float)((double)(mix(i) >> 11) * 0x1p-53 - 0.5);
        v[i] = (float)((double)(mix(i + n) >> 11) * 0x1p-53);
    }
    zn_moments f = zn_moments_of(ZN_MOM_F32, m, v, NULL, NULL, ZN_Q8_BNB);
    zn_moments f2 = zn_moments_of(ZN_MOM_F32, m2, v2, NULL, NULL, ZN_Q8_BNB);
    zn_moments q = zn_moments_of(ZN_MOM_Q8, mq, vq, am, av, ZN_Q8_BNB);
    zn_moments q2 = zn_moments_of(ZN_MOM_Q8, mq2, vq2, am2, av2, ZN_Q8_BNB);
    zn_moments h = zn_moments_of(ZN_MOM_BF16, mh, vh, NULL, NULL, ZN_Q8_BNB);
    ZT_EQ_INT(zn_mom_convert(&q, &f, n), 0);
    ZT_EQ_INT(zn_mom_convert(&f2, &q, n), 0);
    /* the nearest entry: within half the widest gap of the map (1/64 near
     * 1 for the signed map, 1/128 for the unsigned) times the block's absmax */
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double em = fabs((double)m2[i] - m[i]) / am[i / ZN_Q8_BLOCK];
        double ev = fabs((double)v2[i] - v[i]) / av[i / ZN_Q8_BLOCK];
        worst = em > worst ? em : worst;
        worst = ev > worst ? ev : worst;
    }
    ZT_CHECK_MSG(worst <= 1.0 / 128, "q8 round trip off by %.3g of absmax", worst);
    /* requantizing the dequantized v gives it back (the unsigned map ends
     * at 1.0, so the absmax survives); the signed map ends at -0.99297 on
     * the negative side, so m's absmax may shrink there and is not checked */
    ZT_EQ_INT(zn_mom_convert(&q2, &f2, n), 0);
    ZT_CHECK(!memcmp(vq, vq2, n) && !memcmp(av, av2, nb * 4));
    ZT_EQ_INT(zn_mom_convert(&h, &f, n), 0);
    int same = 1;
    for (size_t i = 0; i < n; i++)
        same &= mh[i] == zn_f32_to_bf16(m[i]) && vh[i] == zn_f32_to_bf16(v[i]);
    ZT_CHECK_MSG(same, "fp32 -> bf16 moments is not zn_f32_to_bf16");
    /* bad input */
    zn_moments bad = zn_moments_of(ZN_MOM_Q8, mq, vq, NULL, av, ZN_Q8_BNB);
    ZT_EQ_INT(zn_mom_convert(&bad, &f, n), -EINVAL);
    zn_adam_params hp = zn_adam_params_default();
    ZT_EQ_INT(zn_adam_step_mom(&hp, m, &bad, v, ZN_DTYPE_F32, 1.0f, NULL, ZN_DTYPE_BF16, n),
              -EINVAL);
    ZT_CONTAINS(zn_last_error(), "absmax");
    bad.fmt = (zn_mom_fmt)7;
    ZT_EQ_INT(zn_adam_step_mom(&hp, m, &bad, v, ZN_DTYPE_F32, 1.0f, NULL, ZN_DTYPE_BF16, n),
              -EINVAL);
    ZT_EQ_INT((int)zn_mom_bytes(ZN_MOM_Q8, 257), 2 * 257 + 8 * 2);
    ZT_EQ_INT((int)zn_mom_bytes(ZN_MOM_BF16, 10), 40);
    ZT_EQ_STR(zn_mom_fmt_name(ZN_MOM_Q8), "int8");
    free(m); free(v); free(m2); free(v2); free(mq); free(vq); free(mq2); free(vq2);
    free(am); free(av); free(am2); free(av2); free(mh); free(vh);
}

int main(void)
{
    zn_st *st = NULL;
    if (zn_st_open(&st, FIX))
        ZT_SETUP_FAIL("%s: %s", FIX, zn_last_error());
    const char *meta = zn_st_metadata(st, "zinc");
    fixmeta fm = { 0 };
    double lr = 0, b1 = 0, b2 = 0, eps = 0, wd = 0;
    int steps = 0;
    size_t n = 0;
    if (!meta || !strstr(meta, "\"n\"") ||
        sscanf(strstr(meta, "\"n\""), "\"n\": %zu, \"steps\": %d", &n, &steps) != 2 ||
        sscanf(strstr(meta, "\"lr\""), "\"lr\": %lf, \"beta1\": %lf, \"beta2\": %lf, \"eps\": "
               "%lf, \"weight_decay\": %lf", &lr, &b1, &b2, &eps, &wd) != 5)
        ZT_SETUP_FAIL("%s: metadata unreadable", FIX);
    fm.n = n;
    fm.nb = zn_q8_blocks(n);
    fm.lr = (float)lr;
    fm.b1 = b1;
    fm.b2 = b2;
    fm.eps = (float)eps;
    fm.wd = (float)wd;

    check_maps(st);
    /* every path this CPU has, AVX-512 with and without its VBMI pieces
     * (whatever ZINC_SIMD_VBMI says) */
    const zn_optim_ops *ops[4];
    int nops = 0;
    const zn_optim_ops *paths[] = { zn_optim_get_ops(ZN_ISA_AVX2), zn_optim_get_ops_novbmi(),
                                    zn_optim_get_ops_vbmi(), zn_optim_get_ops(ZN_ISA_SCALAR) };
    for (int i = 0; i < 4; i++)
        if (paths[i])
            ops[nops++] = paths[i];
    if (!zn_optim_get_ops_vbmi())
        printf("# no AVX-512 VBMI on this CPU: its path is not run here\n");
    for (int o = 0; o < nops; o++)
        for (int k = 1; k <= steps; k++)
            for (int th = 1; th <= 2; th++)
                check_bnb_step(st, &fm, k, ops[o], th);
    zn_st *stt = NULL;
    if (zn_st_open(&stt, FIX_T))
        ZT_SETUP_FAIL("%s: %s", FIX_T, zn_last_error());
    for (int o = 0; o < nops; o++)
        for (int th = 1; th <= 2; th++)
            check_bnb_tensors(stt, ops[o], th);
    zn_st_close(stt);
    for (int o = 0; o < nops; o++)
        check_f32_runs(ops[o]);
    check_identity(ops, nops);
    check_identity_variants(ops, nops);
    check_fused(ops, nops);
    check_pieces(ops, nops);
    check_sweep(ops, nops);
    for (int o = 0; o < nops; o++)
        check_bf16(ops[o]);
    check_convert();
    zn_st_close(st);
    return zt_done();
}
