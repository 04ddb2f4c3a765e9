/* fp32 <-> bf16 / fp16 rounding, bit for bit, of the one home of the
 * scalar conversions (zinc/util.h's inline zn_bf16_round, zn_bf16_widen,
 * zn_f16_round, zn_f16_widen) and of their out-of-line forms: fp32 inputs
 * against an independent value-based reference (bf16) and against the
 * CPU's own vcvtps2ph (fp16, when the CPU has F16C); ties, subnormals,
 * overflow, Inf and NaN against the value-based fp16 reference; every
 * 16-bit input widened against a value-based reference and rounded back
 * to itself; zn_convert for every dtype pair.
 * `test_half full` (suite slow) sweeps all 2^32 inputs: 25 s on 2 idle
 * cores, 52 s beside the rest of the suite. Without it (suite unit) every
 * high half is taken with the low halves that decide its rounding (0,
 * 1, below / at / above the tie, all ones) and 48 others drawn per high
 * half: 2^16 x 56 inputs, well under a second. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/optim.h"
#include "zinc/util.h"
#include "optim/optim-impl.h"
#include "zt.h"
#include "util/cpu-impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

/* ---- references that reason about values, not bits ---------------------- */

/* Nearest bf16 by comparing distances to the two neighbours (ties: even). */
static uint16_t ref_bf16(uint32_t u)
{
    float x = zn_bits_f32(u);
    if (isnan(x))
        return (uint16_t)((u >> 16) | 0x40);
    uint16_t lo = (uint16_t)(u >> 16);          /* truncation: toward zero */
    if ((u & 0xffff) == 0)
        return lo;
    double dx = fabs((double)x), dl = fabs((double)zn_bits_f32((uint32_t)lo << 16));
    /* the neighbour away from zero; past the largest bf16 it is 2^128 = Inf */
    double dh = (lo & 0x7fff) == 0x7f7f ? ldexp(1, 128)
                                       : fabs((double)zn_bits_f32((uint32_t)(lo + 1) << 16));
    if (dx - dl < dh - dx)
        return lo;
    if (dx - dl > dh - dx)
        return (uint16_t)(lo + 1);
    return (lo & 1) ? (uint16_t)(lo + 1) : lo;
}

/* Nearest binary16 by scaling to units of the target's ulp and rint(). */
static uint16_t ref_f16(uint32_t u)
{
    float x = zn_bits_f32(u);
    uint16_t s = (uint16_t)((u >> 16) & 0x8000);
    if (isnan(x))
        return (uint16_t)(s | 0x7e00 | ((u >> 13) & 0x3ff));
    double d = fabs((double)x);
    if (d >= 65520.0)                            /* 65504 + half an ulp, ties to Inf */
        return (uint16_t)(s | 0x7c00);
    int e = d < 0x1p-14 ? -14 : ilogb(d);
    double ulp = ldexp(1, e - 10);
    double q = rint(d / ulp);                    /* exact scaling; rint: ties to even */
    double y = q * ulp;
    if (y == 0)
        return s;
    if (y < 0x1p-14)
        return (uint16_t)(s | (uint16_t)q);
    int ey = ilogb(y);
    return (uint16_t)(s | (uint16_t)((ey + 15) << 10) | (uint16_t)(ldexp(y, -ey) * 1024 - 1024));
}

static double ref_f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double s = (h & 0x8000) ? -1 : 1;
    if (e == 0)
        return s * ldexp(mant, -24);
    if (e == 31)
        return mant ? NAN : s * INFINITY;
    return s * ldexp(1024 + mant, e - 25);
}


/* bf16's value from its fields: 8 exponent bits, 7 of mantissa */
static double ref_bf16_value(uint16_t h)
{
    int e = (h >> 7) & 0xff, mant = h & 0x7f;
    double s = (h & 0x8000) ? -1 : 1;
    if (e == 0)
        return s * ldexp(mant, -133);
    if (e == 255)
        return mant ? NAN : s * INFINITY;
    return s * ldexp(128 + mant, e - 134);
}

/* ---- sweeps ------------------------------------------------------------ */

static int full;  /* all 2^32 inputs, else SAMPLES low halves per high half */
#define SAMPLES 56

/* The j-th low half tried with high half hi: the rounding's deciding
 * patterns for bf16 (tie 0x8000) and fp16 (tie at bit 12 in the normal
 * range), then a hash of (hi, j). */
static uint32_t sample_low(uint32_t hi, uint32_t j)
{
    static const uint16_t fixed[] = { 0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff,
                                      0x0fff, 0x1000 };
    if (j < sizeof fixed / sizeof fixed[0])
        return fixed[j];
    uint64_t z = ((uint64_t)hi << 32 | j) * 0x9E3779B97F4A7C15ull;
    z ^= z >> 29;
    z *= 0xBF58476D1CE4E5B9ull;
    return (uint32_t)(z >> 48);
}

/* One high half, all 65536 low halves: both neighbours are then fixed and
 * their distances to x are exact in float (x lies between them, within a
 * factor of two). Halves whose neighbours are NaN, Inf or past the largest
 * bf16 go through ref_bf16 instead. */
static uint64_t sweep_bf16_hi(uint32_t hi, uint32_t *first)
{
    uint64_t bad = 0;
    uint32_t nl = full ? 65536 : SAMPLES;
    if ((hi & 0x7fff) >= 0x7f7f) {
        for (uint32_t j = 0; j < nl; j++) {
            uint32_t l = full ? j : sample_low(hi, j);
            uint32_t u = hi << 16 | l;
            if (zn_bf16_round(zn_bits_f32(u)) != ref_bf16(u)) {
                *first = u;
                bad++;
            }
        }
        return bad;
    }
    uint16_t lo = (uint16_t)hi, up = (uint16_t)(hi + 1), tie = (hi & 1) ? up : lo;
    float xl = fabsf(zn_bits_f32(hi << 16)), xh = fabsf(zn_bits_f32((hi + 1) << 16));
    for (uint32_t j = 0; j < nl; j++) {
        uint32_t l = full ? j : sample_low(hi, j);
        uint32_t u = hi << 16 | l;
        float x = fabsf(zn_bits_f32(u));
        float d1 = x - xl, d2 = xh - x;
        uint16_t want = d1 < d2 ? lo : d1 > d2 ? up : tie;
        if (zn_bf16_round(zn_bits_f32(u)) != want) {
            *first = u;
            bad++;
        }
    }
    return bad;
}

static void sweep_bf16(void)
{
    uint64_t bad = 0;
    uint32_t first = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (uint32_t hi = 0; hi < 65536; hi++) {
        uint32_t f = 0;
        uint64_t b = sweep_bf16_hi(hi, &f);
        if (b) {
            __atomic_store_n(&first, f, __ATOMIC_RELAXED);
            bad += b;
        }
    }
    ZT_CHECK_MSG(bad == 0, "bf16: %llu of %s inputs round wrongly (e.g. 0x%08x)",
                 (unsigned long long)bad, full ? "2^32" : "the sampled", (unsigned)first);
    /* the public entry points are the same code */
    size_t pub = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 65521)
        pub += zn_f32_to_bf16(zn_bits_f32((uint32_t)u)) != ref_bf16((uint32_t)u);
    ZT_EQ_U64(pub, 0);
    size_t wbad = 0;
    for (uint32_t h = 0; h < 65536; h++)
        wbad += zn_f32_bits(zn_bf16_to_f32((uint16_t)h)) != h << 16;
    ZT_EQ_U64(wbad, 0);
}

#if HAVE_X86
/* all inputs with one high half: 8 at a time through vcvtps2ph, each
 * against zn_f16_round (inlined here, so built for this target too) */
__attribute__((target("avx2,f16c"))) static uint64_t sweep_f16_hi(uint32_t hi, uint32_t *first)
{
    uint64_t bad = 0;
    const __m256i step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    /* sampled: groups of 8 starting at the sampled low halves (clipped) */
    uint32_t ng = full ? 65536 / 8 : SAMPLES;
    for (uint32_t gi = 0; gi < ng; gi++) {
        uint32_t l = full ? gi * 8 : sample_low(hi, gi);
        if (l > 65528)
            l = 65528;
        __m256i u = _mm256_add_epi32(_mm256_set1_epi32((int)(hi << 16 | l)), step);
        uint16_t out[8];
        _mm_storeu_si128((__m128i *)out,
                         _mm256_cvtps_ph(_mm256_castsi256_ps(u), _MM_FROUND_TO_NEAREST_INT));
        for (uint32_t j = 0; j < 8; j++) {
            uint32_t w = hi << 16 | (l + j);
            if (zn_f16_round(zn_bits_f32(w)) != out[j]) {
                *first = w;
                bad++;
            }
        }
    }
    return bad;
}

__attribute__((target("f16c"))) static uint32_t hw_f16_widen(uint16_t h)
{
    __m128 x = _mm_cvtph_ps(_mm_cvtsi32_si128(h));
    return zn_f32_bits(_mm_cvtss_f32(x));
}
#endif

static void sweep_f16_hw(void)
{
#if HAVE_X86
    if (!zn_cpu_has_f16c() || !__builtin_cpu_supports("avx2")) {
        printf("note: fp16 sweep against vcvtps2ph skipped: no F16C/AVX2 on this CPU\n");
        return;
    }
    uint64_t bad = 0;
    uint32_t first = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (uint32_t hi = 0; hi < 65536; hi++) {
        uint32_t f = 0;
        uint64_t b = sweep_f16_hi(hi, &f);
        if (b) {
            __atomic_store_n(&first, f, __ATOMIC_RELAXED);
            bad += b;
        }
    }
    ZT_CHECK_MSG(bad == 0, "f16: %llu of %s inputs differ from vcvtps2ph (e.g. 0x%08x)",
                 (unsigned long long)bad, full ? "2^32" : "the sampled", (unsigned)first);
    size_t wbad = 0;
    for (uint32_t h = 0; h < 65536; h++)
        wbad += zn_f32_bits(zn_f16_to_f32((uint16_t)h)) != hw_f16_widen((uint16_t)h);
    ZT_CHECK_MSG(wbad == 0, "f16 widen: %zu of 65536 differ from vcvtph2ps", wbad);
#else
    printf("note: fp16 sweep against vcvtps2ph skipped: not an x86-64 build\n");
#endif
}

/* Every rounding position of binary16 with the bit patterns that decide it
 * (below, at and above the tie), the f16-subnormal range at a stride, and
 * the edges, against the value-based reference. */
static void sweep_f16_ref(void)
{
    static const uint32_t lows[] = { 0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x0800 };
    uint64_t bad = 0, first = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (uint32_t hi = 0; hi < (1u << 19); hi++) {
        for (size_t j = 0; j < sizeof lows / sizeof lows[0]; j++) {
            uint32_t u = hi << 13 | lows[j];
            if (zn_f16_round(zn_bits_f32(u)) != ref_f16(u)) {
                if (!bad)
                    __atomic_store_n(&first, u, __ATOMIC_RELAXED);
                bad++;
            }
        }
    }
    /* below 2^-14 the rounding position moves: take every input there, both signs */
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (uint32_t u = 0x32800000; u < 0x38800000; u++) {
        uint32_t w = u | ((u & 1) << 31);
        if (zn_f16_round(zn_bits_f32(w)) != ref_f16(w)) {
            if (!bad)
                __atomic_store_n(&first, w, __ATOMIC_RELAXED);
            bad++;
        }
    }
    ZT_CHECK_MSG(bad == 0, "f16: %llu inputs differ from the value-based rounding (e.g. "
                 "0x%08llx)", (unsigned long long)bad, (unsigned long long)first);

    /* named cases */
    ZT_EQ_INT(zn_f32_to_f16(65504.0f), 0x7bff);
    ZT_EQ_INT(zn_f32_to_f16(65519.996f), 0x7bff);
    ZT_EQ_INT(zn_f32_to_f16(65520.0f), 0x7c00);          /* tie above the max: Inf */
    ZT_EQ_INT(zn_f32_to_f16(-INFINITY), 0xfc00);
    ZT_EQ_INT(zn_f32_to_f16(0x1p-24f), 0x0001);
    ZT_EQ_INT(zn_f32_to_f16(0x1p-25f), 0x0000);          /* tie: to even zero */
    ZT_EQ_INT(zn_f32_to_f16(0x1.8p-24f), 0x0002);        /* tie: to even 2 */
    ZT_EQ_INT(zn_f32_to_f16(0x1.000002p-25f), 0x0001);
    ZT_EQ_INT(zn_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);   /* tie: to even 1.0 */
    ZT_EQ_INT(zn_f32_to_f16(1.0f + 0x3p-11f), 0x3c02);
    ZT_EQ_INT(zn_f32_to_f16(zn_bits_f32(0x7f800001)), 0x7e00);   /* sNaN: quiet */
    ZT_EQ_INT(zn_f32_to_f16(zn_bits_f32(0xffc00000)), 0xfe00);
    ZT_EQ_INT(zn_f32_to_bf16(zn_bits_f32(0x7f800001)), 0x7fc0);  /* not Inf */
    ZT_EQ_INT(zn_f32_to_bf16(zn_bits_f32(0x3f808000)), 0x3f80);  /* tie: even */
    ZT_EQ_INT(zn_f32_to_bf16(zn_bits_f32(0x3f818000)), 0x3f82);
    ZT_EQ_INT(zn_f32_to_bf16(zn_bits_f32(0x7f7fffff)), 0x7f80);  /* overflow: Inf */
    ZT_EQ_INT(zn_f32_to_bf16(zn_bits_f32(0x00008000)), 0x0000);  /* subnormal tie */
    ZT_EQ_INT(zn_f32_to_bf16(zn_bits_f32(0x00018000)), 0x0002);

    size_t wbad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double want = ref_f16_value((uint16_t)h);
        float got = zn_f16_to_f32((uint16_t)h);
        if (isnan(want) ? !isnan(got) || (zn_f32_bits(got) >> 13 & 0x3ff) != ((h & 0x3ffu) | 0x200u) ||
                              (zn_f32_bits(got) >> 31) != (h >> 15u)
                        : (double)got != want || !signbit(got) != !signbit(want))
            wbad++;
    }
    ZT_CHECK_MSG(wbad == 0, "f16 widen: %zu of 65536 values wrong", wbad);
}

/* Every 16-bit input of both formats through the inline home: widened
 * against the value-based reference (and its NaNs made quiet, sign and
 * payload kept), then rounded back to itself (a NaN to itself made
 * quiet). */
static void sweep_home_16(void)
{
    size_t bad_w = 0, bad_rt = 0, bad_bw = 0, bad_brt = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t x = (uint16_t)h;
        int nan16 = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
        float w = zn_f16_widen(x);
        double want = ref_f16_value(x);
        if (nan16 ? !isnan(w) || (zn_f32_bits(w) >> 13 & 0x3ffu) != ((h & 0x3ffu) | 0x200u) ||
                        (zn_f32_bits(w) >> 31) != (h >> 15)
                  : (double)w != want || !signbit(w) != !(h & 0x8000u))
            bad_w++;
        if (zn_f16_round(w) != (nan16 ? (uint16_t)(h | 0x200u) : x))
            bad_rt++;
        /* bf16: the top half of the float's bits, by definition */
        int nanb = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
        float b = zn_bf16_widen(x);
        if (zn_f32_bits(b) != h << 16 || (!nanb && (double)b != ref_bf16_value(x)))
            bad_bw++;
        if (zn_bf16_round(b) != (nanb ? (uint16_t)(h | 0x40u) : x))
            bad_brt++;
    }
    ZT_CHECK_MSG(bad_w == 0, "zn_f16_widen: %zu of 65536 values wrong", bad_w);
    ZT_CHECK_MSG(bad_rt == 0, "zn_f16_round(zn_f16_widen(h)) != h for %zu of 65536", bad_rt);
    ZT_CHECK_MSG(bad_bw == 0, "zn_bf16_widen: %zu of 65536 values wrong", bad_bw);
    ZT_CHECK_MSG(bad_brt == 0, "zn_bf16_round(zn_bf16_widen(h)) != h for %zu of 65536", bad_brt);
}

static void check_convert(void)
{
    const size_t n = 200003;   /* parallel and with a tail */
    float *f = malloc(n * 4), *f2 = malloc(n * 4);
    uint16_t *h = malloc(n * 2), *h2 = malloc(n * 2);
    if (!f || !f2 || !h || !h2)
        ZT_SETUP_FAIL("out of memory");
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        f[i] = zn_bits_f32(x);
    }
    static const zn_dtype t[] = { ZN_DTYPE_F32, ZN_DTYPE_BF16, ZN_DTYPE_F16 };
    for (int a = 1; a < 3; a++) {
        /* f32 -> 16 bit */
        ZT_EQ_INT(zn_convert(h, t[a], f, ZN_DTYPE_F32, n), 0);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += h[i] != (a == 1 ? zn_f32_to_bf16(f[i]) : zn_f32_to_f16(f[i]));
        ZT_EQ_U64(bad, 0);
        /* 16 bit -> f32 */
        ZT_EQ_INT(zn_convert(f2, ZN_DTYPE_F32, h, t[a], n), 0);
        bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += zn_f32_bits(f2[i]) !=
                   zn_f32_bits(a == 1 ? zn_bf16_to_f32(h[i]) : zn_f16_to_f32(h[i]));
        ZT_EQ_U64(bad, 0);
        /* 16 bit -> the other 16 bit: one rounding of the exact value */
        int b = 3 - a;
        ZT_EQ_INT(zn_convert(h2, t[b], h, t[a], n), 0);
        bad = 0;
        for (size_t i = 0; i < n; i++) {
            float w = a == 1 ? zn_bf16_to_f32(h[i]) : zn_f16_to_f32(h[i]);
            bad += h2[i] != (b == 1 ? zn_f32_to_bf16(w) : zn_f32_to_f16(w));
        }
        ZT_EQ_U64(bad, 0);
        /* same type: a copy */
        ZT_EQ_INT(zn_convert(h2, t[a], h, t[a], n), 0);
        ZT_CHECK(!memcmp(h2, h, n * 2));
    }
    ZT_EQ_INT(zn_convert(f2, ZN_DTYPE_F32, f, ZN_DTYPE_F32, n), 0);
    ZT_CHECK(!memcmp(f2, f, n * 4));
    ZT_EQ_INT(zn_convert(h, (zn_dtype)5, f, ZN_DTYPE_F32, n), -EINVAL);
    ZT_EQ_INT(zn_convert(NULL, ZN_DTYPE_BF16, f, ZN_DTYPE_F32, n), -EINVAL);
    ZT_EQ_INT(zn_convert(f, ZN_DTYPE_BF16, f, ZN_DTYPE_F32, n), -EINVAL);
    ZT_EQ_INT(zn_convert(NULL, ZN_DTYPE_BF16, NULL, ZN_DTYPE_F32, 0), 0);
    free(f);
    free(f2);
    free(h);
    free(h2);
}

int main(int argc, char **argv)
{
    full = argc > 1 && !strcmp(argv[1], "full");
    double t0 = zn_now_s();
    sweep_bf16();
    double t1 = zn_now_s();
    sweep_f16_hw();
    double t2 = zn_now_s();
    sweep_f16_ref();
    sweep_home_16();
    check_convert();
    printf("%s: bf16 sweep %.1f s, f16 hardware sweep %.1f s, rest %.1f s (%d threads)\n",
           full ? "all 2^32 inputs" : "sampled", t1 - t0, t2 - t1, zn_now_s() - t2,
           omp_get_max_threads());
    return zt_done();
}
