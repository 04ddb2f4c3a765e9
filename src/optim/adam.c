/* The fused CPU Adam/AdamW step: argument checks, per-call constants, the
 * OpenMP split, run-time choice of the SIMD path (AVX-512 / AVX2 / scalar)
 * and the portable scalar kernel. The SIMD kernels live in optim_avx2.c and
 * optim_avx512.c, each compiled with its own target flags. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "optim/optim-impl.h"
#include "util/cpu-impl.h"

/* Below this many elements one thread does the step: an OpenMP fork/join
 * costs a few microseconds, about what one core needs for 32K elements at
 * memory speed (28 bytes each at ~10 GB/s per core). */
#define ZN_OPTIM_MIN_PER_THREAD ((size_t)32768)

int zn_optim_nt_copy = 1;

zn_adam_params zn_adam_params_default(void)
{
    zn_adam_params hp = {
        .lr = 1e-3f, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8f,
        .weight_decay = 0.0f, .adamw_mode = 1, .bias_correction = 1,
        .step = 1, .threads = 0,
    };
    return hp;
}

/* ---- the portable scalar kernel ------------------------------------------ */

static inline void scalar_body(const zn_adam_consts *k, float *p, float *m, float *v, const void *g,
                               zn_dtype gt, void *c, zn_dtype ct, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        zn_adam_elem(k, &p[i], &m[i], &v[i], zn_load_elem(g, gt, i));
        if (c)
            ((uint16_t *)c)[i] = zn_round_elem(p[i], ct);
    }
}

/* One instance per dtype pair, so that the loads and rounding are inlined
 * and no type test runs per element. */
static void scalar_kernel(const zn_adam_consts *k, float *p, float *m, float *v, const void *g,
                          zn_dtype gt, void *c, zn_dtype ct, size_t n)
{
#define ZN_SCALAR_CASE(G, C, CP)                                          \
    if (gt == (G) && (CP) == (c != NULL) && (!(CP) || ct == (C))) {       \
        scalar_body(k, p, m, v, g, G, c, C, n);                           \
        return;                                                           \
    }
    ZN_SCALAR_CASE(ZN_DTYPE_F32, ZN_DTYPE_BF16, 0)
    ZN_SCALAR_CASE(ZN_DTYPE_F32, ZN_DTYPE_BF16, 1)
    ZN_SCALAR_CASE(ZN_DTYPE_F32, ZN_DTYPE_F16, 1)
    ZN_SCALAR_CASE(ZN_DTYPE_BF16, ZN_DTYPE_BF16, 0)
    ZN_SCALAR_CASE(ZN_DTYPE_BF16, ZN_DTYPE_BF16, 1)
    ZN_SCALAR_CASE(ZN_DTYPE_BF16, ZN_DTYPE_F16, 1)
    ZN_SCALAR_CASE(ZN_DTYPE_F16, ZN_DTYPE_BF16, 0)
    ZN_SCALAR_CASE(ZN_DTYPE_F16, ZN_DTYPE_BF16, 1)
    ZN_SCALAR_CASE(ZN_DTYPE_F16, ZN_DTYPE_F16, 1)
#undef ZN_SCALAR_CASE
}

static double scalar_norm_chunk(const void *x, zn_dtype t, size_t n)
{
    double acc[16] = { 0 };
    for (size_t i = 0; i < n; i++) {
        double d = zn_load_elem(x, t, i);
        acc[i % 16] += d * d;      /* exact square: 24-bit mantissa */
    }
    for (size_t s = 8; s >= 1; s /= 2)
        for (size_t j = 0; j < s; j++)
            acc[j] += acc[j + s];
    return acc[0];
}

static void scalar_rmw(float *p, float *m, float *v, const void *g, zn_dtype gt, void *c,
                       size_t n)
{
    /* The benchmark never runs the scalar ceiling; keep it correct anyway. */
    size_t gs = zn_dtype_size(gt);
    for (size_t i = 0; i < n; i++) {
        float pv = p[i], mv = m[i], vv = v[i];
        uint32_t gv = 0;
        memcpy(&gv, (const char *)g + i * gs, gs);
        /* the clobber makes the stores below necessary; gv must be loaded */
        __asm__ volatile("" : : "r"(gv) : "memory");
        p[i] = pv;
        m[i] = mv;
        v[i] = vv;
        if (c)
            ((uint16_t *)c)[i] = (uint16_t)zn_f32_bits(pv);
    }
}

static void scalar_triad(float *a, const float *b, const float *c, float s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] + s * c[i];
}

const zn_optim_ops zn_optim_ops_scalar = {
    ZN_ISA_SCALAR, "scalar", scalar_kernel, scalar_norm_chunk, scalar_rmw, scalar_triad,
    zn_q8_dequant_scalar, zn_q8_quant_scalar, zn_bf16_widen_scalar, zn_bf16_round_scalar,
    zn_rmw_mom_scalar, zn_sr_round_scalar, NULL, NULL, NULL, NULL,
};

/* ---- path selection ------------------------------------------------------ */

static int cpu_supports(zn_isa isa)
{
    if (isa == ZN_ISA_SCALAR)
        return 1;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (isa == ZN_ISA_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               zn_cpu_has_f16c();
    if (isa == ZN_ISA_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma") && zn_cpu_has_f16c();
#endif
    return 0;
}

static const zn_optim_ops *built_ops(zn_isa isa)
{
    switch (isa) {
    case ZN_ISA_SCALAR:
        return &zn_optim_ops_scalar;
#if ZN_OPTIM_X86
    case ZN_ISA_AVX2:
        return &zn_optim_ops_avx2;
    case ZN_ISA_AVX512:
        return &zn_optim_ops_avx512;
#endif
    default:
        return NULL;
    }
}

int zn_adam_isa_available(zn_isa isa)
{
    return built_ops(isa) != NULL && cpu_supports(isa);
}

const char *zn_isa_name(zn_isa isa)
{
    switch (isa) {
    case ZN_ISA_AUTO: return "auto";
    case ZN_ISA_SCALAR: return "scalar";
    case ZN_ISA_AVX2: return "avx2";
    case ZN_ISA_AVX512: return "avx512";
    }
    return "?";
}

/* Why auto takes the path it takes (zn_adam_isa_reason). */
static const char *g_reason = "";

/* The Adam step is bound by memory, not arithmetic: both vector paths run
 * at the read-modify-write roofline, and the choice is which one reaches it.
 * Measured with `zinc bench adam` (bench/results/adam.md), median of passes
 * over the roofline:
 *   Intel Xeon, AVX-512 (issue 29): avx512 0.92-0.97, avx2 1.00-1.01, with
 *     fp32 and bf16 gradients: 512-bit stores and the license drop cost it;
 *   AMD EPYC Zen 4 (family 25, 2026-11-26): avx512 0.97-1.00, avx2
 *     0.94-1.02 over six 256M runs: no frequency penalty, a tie within the
 *     runs' noise.
 * So Intel CPUs take AVX2 and others the widest path they have. A rule
 * rather than a timing at start-up: the two paths are within a few percent
 * of each other, less than a short timing's noise on a loaded machine, so
 * a timed choice would flip from run to run (and cost a second at every
 * start). The paths give the same bits (test_adam), so the rule changes
 * speed only. */
static zn_isa best_isa(void)
{
    if (zn_adam_isa_available(ZN_ISA_AVX512)) {
#if defined(__x86_64__) && defined(__GNUC__)
        if (__builtin_cpu_is("intel") && zn_adam_isa_available(ZN_ISA_AVX2)) {
            g_reason = "Intel: AVX2 runs at the memory roofline, AVX-512 at 0.92-0.97 of it";
            return ZN_ISA_AVX2;
        }
#endif
        g_reason = "widest path; on AMD Zen 4 AVX-512 ties or beats AVX2";
        return ZN_ISA_AVX512;
    }
    if (zn_adam_isa_available(ZN_ISA_AVX2)) {
        g_reason = "widest path this CPU has";
        return ZN_ISA_AVX2;
    }
    g_reason = "no AVX2+FMA+F16C on this CPU (or not built in)";
    return ZN_ISA_SCALAR;
}

static zn_isa g_isa;          /* set once by init_isa, then by zn_adam_set_isa */
static pthread_once_t g_isa_once = PTHREAD_ONCE_INIT;

static void init_isa(void)
{
    zn_isa isa = best_isa();
    const char *env = getenv("ZINC_SIMD");
    if (env && *env && strcasecmp(env, "auto") != 0) {
        zn_isa want = ZN_ISA_AUTO;
        if (!strcasecmp(env, "avx512"))
            want = ZN_ISA_AVX512;
        else if (!strcasecmp(env, "avx2"))
            want = ZN_ISA_AVX2;
        else if (!strcasecmp(env, "scalar"))
            want = ZN_ISA_SCALAR;
        if (want == ZN_ISA_AUTO)
            zn_warn("ZINC_SIMD=%s is not one of avx512, avx2, scalar, auto; using %s", env,
                    zn_isa_name(isa));
        else if (!zn_adam_isa_available(want))
            zn_warn("ZINC_SIMD=%s: this %s; using %s", env,
                    built_ops(want) ? "CPU lacks it" : "build has no such path",
                    zn_isa_name(isa));
        else {
            isa = want;
            g_reason = "ZINC_SIMD";
        }
    }
    __atomic_store_n(&g_isa, isa, __ATOMIC_RELEASE);
}

int zn_adam_set_isa(zn_isa isa)
{
    pthread_once(&g_isa_once, init_isa);
    if (isa < ZN_ISA_AUTO || isa > ZN_ISA_AVX512)
        return zn_set_error(-EINVAL, "zn_adam_set_isa: %d is not a zn_isa value", (int)isa);
    if (isa == ZN_ISA_AUTO)
        isa = best_isa();
    else if (!zn_adam_isa_available(isa))
        return zn_set_error(ZN_EUNSUPPORTED, "SIMD path %s: %s", zn_isa_name(isa),
                            built_ops(isa) ? "this CPU lacks it" : "not built in");
    else
        g_reason = "set by the program (zn_adam_set_isa)";
    __atomic_store_n(&g_isa, isa, __ATOMIC_RELEASE);
    return 0;
}

zn_isa zn_adam_get_isa(void)
{
    pthread_once(&g_isa_once, init_isa);
    return __atomic_load_n(&g_isa, __ATOMIC_ACQUIRE);
}

const char *zn_adam_isa_name(void)
{
    return zn_isa_name(zn_adam_get_isa());
}

const char *zn_adam_isa_reason(void)
{
    pthread_once(&g_isa_once, init_isa);
    return g_reason;
}

/* The VBMI table: a copy of the AVX-512 one with the 8-bit pieces that
 * look codes up with byte permutes instead of gathers and two-register
 * float permutes (issue 35: on AMD Zen 4 the gather was half of the
 * quantize time). A copy made at run time, because whether the CPU has
 * VBMI is only known then. ZINC_SIMD_VBMI=0 keeps the AVX-512 pieces (for
 * an A/B run on one machine); the codes are the same either way. */
static zn_optim_ops g_vbmi_ops;
static int g_vbmi_have, g_vbmi_use;
static pthread_once_t g_vbmi_once = PTHREAD_ONCE_INIT;

static void init_vbmi(void)
{
#if ZN_OPTIM_X86
    __builtin_cpu_init();
    if (!zn_adam_isa_available(ZN_ISA_AVX512) || !__builtin_cpu_supports("avx512vbmi") ||
        !__builtin_cpu_supports("avx512dq"))
        return;
    g_vbmi_ops = zn_optim_ops_avx512;
    g_vbmi_ops.name = "avx512vbmi";
    g_vbmi_ops.q8_dequant = zn_q8_dequant_vbmi;
    g_vbmi_ops.q8_quant = zn_q8_quant_vbmi;
    g_vbmi_ops.q8_step = zn_q8_step_vbmi;
    g_vbmi_ops.q8_sr_step = zn_q8_sr_step_vbmi;
    g_vbmi_have = 1;
    const char *env = getenv("ZINC_SIMD_VBMI");
    g_vbmi_use = !(env && !strcmp(env, "0"));
#endif
}

const zn_optim_ops *zn_optim_get_ops_vbmi(void)
{
    pthread_once(&g_vbmi_once, init_vbmi);
    return g_vbmi_have ? &g_vbmi_ops : NULL;
}

const zn_optim_ops *zn_optim_get_ops_novbmi(void)
{
    return zn_adam_isa_available(ZN_ISA_AVX512) ? built_ops(ZN_ISA_AVX512) : NULL;
}

const zn_optim_ops *zn_optim_get_ops(zn_isa isa)
{
    if (isa == ZN_ISA_AUTO)
        isa = zn_adam_get_isa();
    if (!zn_adam_isa_available(isa))
        return NULL;
    if (isa == ZN_ISA_AVX512 && zn_optim_get_ops_vbmi() && g_vbmi_use)
        return &g_vbmi_ops;
    return built_ops(isa);
}

/* ---- the step ------------------------------------------------------------ */

int zn_optim_threads(int threads, size_t n)
{
    int nt = threads > 0 ? threads : omp_get_max_threads();
    size_t cap = n / ZN_OPTIM_MIN_PER_THREAD;
    if (cap < 1)
        cap = 1;
    if ((size_t)nt > cap)
        nt = (int)cap;
    return nt < 1 ? 1 : nt;
}

static int valid_dtype(zn_dtype t)
{
    return t == ZN_DTYPE_F32 || t == ZN_DTYPE_BF16 || t == ZN_DTYPE_F16;
}

int zn_adam_prepare(const zn_adam_params *hp, float *p, float *m, float *v, const void *g,
                    zn_dtype g_dtype, float g_scale, void *c, zn_dtype c_dtype, size_t n,
                    zn_adam_consts *out)
{
    if (!hp || !out)
        return zn_set_error(-EINVAL, "adam: NULL hyperparameters");
    if (n > 0 && (!p || !m || !v || !g))
        return zn_set_error(-EINVAL, "adam: NULL %s array for %zu elements",
                            !p ? "param" : !m ? "exp_avg" : !v ? "exp_avg_sq" : "grad", n);
    if (!valid_dtype(g_dtype))
        return zn_set_error(-EINVAL, "adam: gradient dtype %d is not f32, bf16 or f16",
                            (int)g_dtype);
    if (c && c_dtype != ZN_DTYPE_BF16 && c_dtype != ZN_DTYPE_F16)
        return zn_set_error(-EINVAL, "adam: the 16-bit copy must be bf16 or f16, not %s",
                            zn_dtype_name(c_dtype));
    if (!isfinite(hp->lr) || !isfinite(hp->eps) || hp->eps < 0 ||
        !isfinite(hp->weight_decay) || !isfinite(g_scale))
        return zn_set_error(-EINVAL, "adam: lr %g, eps %g, weight_decay %g and grad scale %g "
                            "must be finite (eps >= 0)", (double)hp->lr, (double)hp->eps,
                            (double)hp->weight_decay, (double)g_scale);
    if (!(hp->beta1 >= 0 && hp->beta1 < 1) || !(hp->beta2 >= 0 && hp->beta2 < 1))
        return zn_set_error(-EINVAL, "adam: betas (%g, %g) must lie in [0, 1)",
                            (double)hp->beta1, (double)hp->beta2);
    if (hp->bias_correction && hp->step < 1)
        return zn_set_error(-EINVAL, "adam: step %lld with bias correction: steps count "
                            "from 1", (long long)hp->step);

    double lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2, wd = hp->weight_decay;
    double bc1 = 1.0, bc2 = 1.0;
    if (hp->bias_correction) {
        bc1 = 1.0 - pow(b1, (double)hp->step);
        bc2 = 1.0 - pow(b2, (double)hp->step);
    }
    memset(out, 0, sizeof *out);
    out->b1 = (float)b1;
    out->omb1 = (float)(1.0 - b1);   /* as torch: 1 - beta in double, then rounded */
    out->b2 = (float)b2;
    out->omb2 = (float)(1.0 - b2);
    out->step_size = (float)(-lr * sqrt(bc2) / bc1);
    out->eps = (float)(hp->eps * sqrt(bc2));
    out->g_scale = g_scale;
    if (wd != 0) {
        if (hp->adamw_mode) {
            out->use_decay = 1;
            out->decay = (float)(-lr * wd);
        } else {
            out->use_l2 = 1;
            out->l2 = hp->weight_decay;
        }
    }
    return 0;
}

int zn_adam_step_with(zn_adam_kernel_fn kern, const zn_adam_params *hp, float *p, float *m,
                      float *v, const void *g, zn_dtype g_dtype, float g_scale, void *c,
                      zn_dtype c_dtype, size_t n)
{
    zn_adam_consts k;
    int rc = zn_adam_prepare(hp, p, m, v, g, g_dtype, g_scale, c, c_dtype, n, &k);
    if (rc < 0 || n == 0)
        return rc;
    size_t gs = zn_dtype_size(g_dtype);
    int nt = zn_optim_threads(hp->threads, n);
    if (nt == 1) {
        kern(&k, p, m, v, g, g_dtype, c, c_dtype, n);
        return 0;
    }
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), team = omp_get_num_threads();
        size_t lo, hi;
        zn_optim_range(n, team, t, &lo, &hi);
        if (hi > lo)
            kern(&k, p + lo, m + lo, v + lo, (const char *)g + lo * gs, g_dtype,
                 c ? (char *)c + lo * 2 : NULL, c_dtype, hi - lo);
    }
    return 0;
}

int zn_adam_step(const zn_adam_params *hp, float *p, float *m, float *v, const void *g,
                 zn_dtype g_dtype, float g_scale, void *p16_out, zn_dtype p16_dtype, size_t n)
{
    const zn_optim_ops *ops = zn_optim_get_ops(ZN_ISA_AUTO);
    return zn_adam_step_with(ops->adam, hp, p, m, v, g, g_dtype, g_scale, p16_out, p16_dtype,
                             n);
}
