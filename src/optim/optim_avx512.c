/* AVX-512 (F, BW, VL) kernels of the CPU optimizer (this file alone is
 * built for that target; adam.c checks the CPU before calling it). Tails
 * use masked loads and stores of the same vector code, so an element's
 * result never depends on where a thread's range ends. */
#include "optim/optim-impl.h"

#if defined(ZN_OPTIM_AVX512_EMULATE)
/* tests/test_adam_avx512emu.c includes this file after defining the
 * intrinsics in plain C, so that machines without AVX-512 still run it. */
#define ZN_AVX512_OPS zn_optim_ops_avx512_emu
#define ZN_OPAQUE(x) __asm__ volatile("" : : "g"(&(x)) : "memory")
#elif ZN_OPTIM_X86
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")
#include <immintrin.h>
#define ZN_AVX512_OPS zn_optim_ops_avx512
#define ZN_OPAQUE(x) __asm__ volatile("" : "+v"(x))
#endif

#if defined(ZN_AVX512_OPS)

#define W 16

/* As in optim_avx2.c: small copies stay in cache with ordinary stores. */
#define NT_MIN ((size_t)1 << 16)

#include "optim/optim-avx512-inl.h"

typedef struct {
    __m512 b1, omb1, b2, omb2, step, eps, gs, l2, decay;
    int scale;
} consts;

static inline consts load_consts(const zn_adam_consts *k)
{
    consts c = {
        _mm512_set1_ps(k->b1), _mm512_set1_ps(k->omb1), _mm512_set1_ps(k->b2),
        _mm512_set1_ps(k->omb2), _mm512_set1_ps(k->step_size),
        _mm512_set1_ps(k->eps), _mm512_set1_ps(k->g_scale), _mm512_set1_ps(k->l2),
        _mm512_set1_ps(k->decay), k->g_scale != 1.0f,
    };
    return c;
}

/* W moments at offset i under mask `mk`: fp32 (mh 0) or bf16 (mh 1),
 * widened exactly; stored back rounded to nearest even (round16, as
 * zn_bf16_round). */
static inline __m512 load_mom(const void *m, int mh, size_t i, __mmask16 mk)
{
    return mh ? load_g(m, ZN_DTYPE_BF16, i, mk) : _mm512_maskz_loadu_ps(mk, (const float *)m + i);
}

static inline void store_mom(void *m, int mh, size_t i, __mmask16 mk, __m512 x)
{
    if (mh)
        _mm256_mask_storeu_epi16((uint16_t *)m + i, mk, round16(x, ZN_DTYPE_BF16));
    else
        _mm512_mask_storeu_ps((float *)m + i, mk, x);
}

/* The formula of zn_adam_elem with FMAs, as in optim_avx2.c, on W
 * elements in registers; vec16: W elements at offset i under mask `mk`
 * (all ones in the body), moments as load_mom. */
static inline __attribute__((always_inline)) void
adam16(const consts *K, int l2, int decay, __m512 *pp, __m512 *mp, __m512 *vp, __m512 gv)
{
    __m512 pv = *pp, mv = *mp, vv = *vp;
    if (K->scale)
        gv = _mm512_mul_ps(gv, K->gs);
    if (l2)
        gv = _mm512_fmadd_ps(pv, K->l2, gv);
    mv = _mm512_fmadd_ps(K->b1, mv, _mm512_mul_ps(K->omb1, gv));
    vv = _mm512_fmadd_ps(K->omb2, _mm512_fmsub_ps(gv, gv, vv), vv);
    __m512 upd = _mm512_div_ps(mv, _mm512_add_ps(_mm512_sqrt_ps(vv), K->eps));
    if (decay) {
        __m512 dp = _mm512_fmadd_ps(pv, K->decay, _mm512_mul_ps(K->step, upd));
        pv = _mm512_add_ps(pv, dp);
    } else {
        pv = _mm512_fmadd_ps(K->step, upd, pv);
    }
    *pp = pv;
    *mp = mv;
    *vp = vv;
}

static inline __attribute__((always_inline)) void
vec16(const consts *K, int l2, int decay, float *p, void *m, void *v, int mh, const void *g,
      zn_dtype gt, void *c, zn_dtype ct, int nt, size_t i, __mmask16 mk)
{
    __m512 pv = _mm512_maskz_loadu_ps(mk, p + i), mv = load_mom(m, mh, i, mk);
    __m512 vv = load_mom(v, mh, i, mk);
    adam16(K, l2, decay, &pv, &mv, &vv, load_g(g, gt, i, mk));
    _mm512_mask_storeu_ps(p + i, mk, pv);
    store_mom(m, mh, i, mk, mv);
    store_mom(v, mh, i, mk, vv);
    if (c) {
        __m256i h = round16(pv, ct);
        if (nt)
            _mm256_stream_si256((__m256i *)((uint16_t *)c + i), h);
        else
            _mm256_mask_storeu_epi16((uint16_t *)c + i, mk, h);
    }
}

static inline __attribute__((always_inline)) void
adam_body(const zn_adam_consts *k, float *p, void *m, void *v, int mh, const void *g,
          zn_dtype gt, void *c, zn_dtype ct, size_t n)
{
    consts K = load_consts(k);
    int l2 = k->use_l2, decay = k->use_decay;
    int nt = zn_optim_nt_copy && c && (n >= NT_MIN || k->copy_stream) &&
             ((uintptr_t)c & 31) == 0;
    size_t i = 0;
    for (; i + W <= n; i += W)
        vec16(&K, l2, decay, p, m, v, mh, g, gt, c, ct, nt, i, (__mmask16)0xffff);
    if (nt)
        _mm_sfence();
    if (i < n)
        vec16(&K, l2, decay, p, m, v, mh, g, gt, c, ct, 0, i,
              (__mmask16)((1u << (n - i)) - 1));
}

/* one instance per dtype pair and moment format, so that the tests fold */
#define CASE(G, C, CP, MH)                                                \
    if (gt == (G) && (CP) == (c != NULL) && (!(CP) || ct == (C))) {       \
        adam_body(k, p, m, v, MH, g, G, c, C, n);                         \
        return;                                                           \
    }

static void avx512_adam(const zn_adam_consts *k, float *p, float *m, float *v, const void *g,
                        zn_dtype gt, void *c, zn_dtype ct, size_t n)
{
    ZN_ADAM_DTYPE_CASES(CASE, 0)
}

static void avx512_adam_bf16(const zn_adam_consts *k, float *p, uint16_t *m, uint16_t *v,
                             const void *g, zn_dtype gt, void *c, zn_dtype ct, size_t n)
{
    ZN_ADAM_DTYPE_CASES(CASE, 1)
}
#undef CASE

/* ---- gradient norm: 16 double lanes in two registers ------------------ */

static inline double norm_body(const void *x, zn_dtype t, size_t n)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (size_t i = 0; i < n; i += W) {
        /* masked-off lanes load 0.0 and add nothing */
        __mmask16 mk = n - i >= W ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 x16 = load_g(x, t, i, mk);
        __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(x16));
        __m512d d1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(
            _mm512_castps_pd(x16), 1)));
        a0 = _mm512_fmadd_pd(d0, d0, a0);
        a1 = _mm512_fmadd_pd(d1, d1, a1);
    }
    /* s = 8, 4, 2, 1 of the canonical order */
    __m512d s8 = _mm512_add_pd(a0, a1);
    __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
    __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

static double avx512_norm_chunk(const void *x, zn_dtype t, size_t n)
{
    if (t == ZN_DTYPE_F32)
        return norm_body(x, ZN_DTYPE_F32, n);
    if (t == ZN_DTYPE_BF16)
        return norm_body(x, ZN_DTYPE_BF16, n);
    return norm_body(x, ZN_DTYPE_F16, n);
}

/* ---- benchmark ceilings ------------------------------------------------- */

/* The 16-bit copy of 16 updated floats (their bits' low halves: a pack,
 * no arithmetic), masked to mk; streamed past the cache with nt when whole. */
static inline void store_low_halves(uint16_t *dst, __m512 pv, __mmask16 mk, int nt)
{
    __m256i h = _mm512_cvtepi32_epi16(_mm512_castps_si512(pv));
    if (nt && mk == 0xffff)
        _mm256_stream_si256((__m256i *)dst, h);
    else
        _mm256_mask_storeu_epi16(dst, mk, h);
}

static inline void rmw_body(float *p, float *m, float *v, const void *g, zn_dtype gt, void *c,
                            size_t n)
{
    int nt = zn_optim_nt_copy && c && n >= NT_MIN && ((uintptr_t)c & 31) == 0;
    for (size_t i = 0; i < n; i += W) {
        __mmask16 mk = n - i >= W ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 pv = _mm512_maskz_loadu_ps(mk, p + i), mv = _mm512_maskz_loadu_ps(mk, m + i);
        __m512 vv = _mm512_maskz_loadu_ps(mk, v + i), gv = load_g(g, gt, i, mk);
        /* opaque to the compiler: the stores below must happen */
        ZN_OPAQUE(pv);
        ZN_OPAQUE(mv);
        ZN_OPAQUE(vv);
        ZN_OPAQUE(gv);
        _mm512_mask_storeu_ps(p + i, mk, pv);
        _mm512_mask_storeu_ps(m + i, mk, mv);
        _mm512_mask_storeu_ps(v + i, mk, vv);
        if (c)
            store_low_halves((uint16_t *)c + i, pv, mk, nt);
    }
    if (nt)
        _mm_sfence();
}

static void avx512_rmw(float *p, float *m, float *v, const void *g, zn_dtype gt, void *c,
                       size_t n)
{
    if (gt == ZN_DTYPE_F32)
        rmw_body(p, m, v, g, ZN_DTYPE_F32, c, n);
    else
        rmw_body(p, m, v, g, ZN_DTYPE_BF16, c, n);
}

static void avx512_triad(float *a, const float *b, const float *c, float s, size_t n)
{
    __m512 sv = _mm512_set1_ps(s);
    for (size_t i = 0; i < n; i += W) {
        __mmask16 mk = n - i >= W ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(a + i, mk,
                              _mm512_fmadd_ps(sv, _mm512_maskz_loadu_ps(mk, c + i),
                                              _mm512_maskz_loadu_ps(mk, b + i)));
    }
}

/* ---- compressed moments (moments.c) ----------------------------------- */

static inline __mmask16 tail_mask(size_t left)
{
    return left >= W ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

/* out = map[q] * absmax with the 256 entries of the map in 16 registers:
 * eight two-register permutes each cover 32 codes (the low 5 bits of the
 * code), and bits 5, 6, 7 choose among the eight. On AMD Zen 4 this took
 * 0.24 ns per element where the 16-lane gather took 0.40 (256 elements in
 * L1, the same session). */
static void avx512_q8_dequant(const uint8_t *q, const zn_q8_table *tab, float absmax,
                              float *out, size_t n)
{
    const float *map = tab->map;
    __m512 t[16];
    #pragma GCC unroll 16
    for (int r = 0; r < 16; r++)
        t[r] = _mm512_loadu_ps(map + 16 * r);
    const __m512 a = _mm512_set1_ps(absmax);
    const __m512i b5 = _mm512_set1_epi32(32), b6 = _mm512_set1_epi32(64);
    const __m512i b7 = _mm512_set1_epi32(128);
    for (size_t i = 0; i < n; i += W) {
        __mmask16 mk = tail_mask(n - i);
        __m512i idx = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mk, q + i));
        __mmask16 k5 = _mm512_test_epi32_mask(idx, b5), k6 = _mm512_test_epi32_mask(idx, b6);
        __mmask16 k7 = _mm512_test_epi32_mask(idx, b7);
        __m512 x[8];
        #pragma GCC unroll 8
        for (int h = 0; h < 8; h++)
            x[h] = _mm512_permutex2var_ps(t[2 * h], idx, t[2 * h + 1]);
        #pragma GCC unroll 4
        for (int h = 0; h < 4; h++)
            x[h] = _mm512_mask_blend_ps(k5, x[2 * h], x[2 * h + 1]);
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            x[h] = _mm512_mask_blend_ps(k6, x[2 * h], x[2 * h + 1]);
        __m512 v = _mm512_mask_blend_ps(k7, x[0], x[1]);
        _mm512_mask_storeu_ps(out + i, mk, _mm512_mul_ps(v, a));
    }
}

/* zn_q8_code_cell: one gather per element from the cell table (23 KiB per
 * map, in L1 on most cores), where the key table and its midpoint took two,
 * one of them from 64 KiB that did not stay in L1. A binary search over the
 * 255 midpoints held in 16 registers (11 permutes and 8 compares per 16
 * elements, commit 70f8c24) was slower on AMD Zen 4: 0.83 against 0.65 ns
 * per element on 256 elements in L1. */
static float avx512_q8_quant(const float *x, const zn_q8_table *t, uint8_t *q, size_t n)
{
    const __m512i sign = _mm512_set1_epi32(0x7fffffff);
    __m512 mx = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += W) {
        __m512 a = _mm512_castsi512_ps(_mm512_and_si512(
            _mm512_castps_si512(_mm512_maskz_loadu_ps(tail_mask(n - i), x + i)), sign));
        mx = _mm512_max_ps(a, mx);   /* a NaN lane keeps mx, as the scalar form */
    }
    float scale = zn_q8_scale(t, _mm512_reduce_max_ps(mx));
    if (scale == 0.0f) {
        memset(q, 0, n);
        return scale;
    }
    const __m512 sv = _mm512_set1_ps(zn_q8_scale_operand(t, scale)), lo = _mm512_set1_ps(-1.0f);
    const __m512 hi = _mm512_set1_ps(1.0f);
    const __m512i byte = _mm512_set1_epi32(0xff), low16 = _mm512_set1_epi32(0xffff);
    const __m512i cell_lo = _mm512_set1_epi32((int)t->cell_lo);
    const __m512i cell_n = _mm512_set1_epi32((int)t->cell_n);
    const __m512i base = _mm512_set1_epi32((int)(t->cell_lo >> 16)), one = _mm512_set1_epi32(1);
    const __m512i zero = _mm512_setzero_si512();
    const int divide = t->divide;
    for (size_t i = 0; i < n; i += W) {
        __mmask16 mk = tail_mask(n - i);
        __m512 x16 = _mm512_maskz_loadu_ps(mk, x + i);
        __m512 y = divide ? _mm512_div_ps(x16, sv) : _mm512_mul_ps(x16, sv);
        /* a NaN becomes -1 (maxps gives its second operand), whose code
         * is NaN's, 0 (the table checks mid[0] >= -1) */
        y = _mm512_min_ps(hi, _mm512_max_ps(y, lo));
        __m512i u = _mm512_castps_si512(y);
        __mmask16 neg = _mm512_cmp_epi32_mask(u, zero, _MM_CMPINT_LT);
        /* |y| in [cell_lo, 1] */
        __m512i a = _mm512_max_epi32(_mm512_and_si512(u, sign), cell_lo);
        __m512i idx = _mm512_sub_epi32(_mm512_srli_epi32(a, 16), base);
        idx = _mm512_mask_add_epi32(idx, neg, idx, cell_n);
        __m512i w = _mm512_i32gather_epi32(idx, t->cell, 4);
        __m512i lo16 = _mm512_and_si512(a, low16);
        lo16 = _mm512_mask_xor_epi32(lo16, neg, lo16, low16);
        __m512i c = _mm512_and_si512(w, byte);
        c = _mm512_mask_add_epi32(c, _mm512_cmp_epi32_mask(lo16, _mm512_srli_epi32(w, 16),
                                                           _MM_CMPINT_GT), c, one);
        _mm_mask_storeu_epi8(q + i, mk, _mm512_cvtepi32_epi8(c));
    }
    return scale;
}

static void avx512_bf16_widen(const uint16_t *h, float *out, size_t n)
{
    for (size_t i = 0; i < n; i += W) {
        __mmask16 mk = tail_mask(n - i);
        __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, h + i));
        _mm512_mask_storeu_ps(out + i, mk, _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)));
    }
}

static void avx512_bf16_round(const float *x, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i += W) {
        __mmask16 mk = tail_mask(n - i);
        _mm256_mask_storeu_epi16(out + i, mk,
                                 round16(_mm512_maskz_loadu_ps(mk, x + i), ZN_DTYPE_BF16));
    }
}

static void avx512_rmw_mom(void *p, int pb, void *m, void *v, int mb, float *am, float *av,
                           const void *g, zn_dtype gt, void *c, size_t n)
{
    /* the copy is streamed as the compressed step streams it */
    int nt = zn_optim_nt_copy && c && ((uintptr_t)c & 31) == 0;
    if (gt != ZN_DTYPE_F32)
        gt = ZN_DTYPE_BF16;   /* F16 moves the same bytes */
    for (size_t i = 0; i < n; i += W) {
        __mmask16 mk = tail_mask(n - i);
        __m512 gv = load_g(g, gt, i, mk);
        ZN_OPAQUE(gv);
        if (pb == 4) {
            __m512 pv = _mm512_maskz_loadu_ps(mk, (float *)p + i);
            ZN_OPAQUE(pv);
            _mm512_mask_storeu_ps((float *)p + i, mk, pv);
            if (c)
                store_low_halves((uint16_t *)c + i, pv, mk, nt);
        } else {
            __m256i ph = _mm256_maskz_loadu_epi16(mk, (uint16_t *)p + i);
            ZN_OPAQUE(ph);
            _mm256_mask_storeu_epi16((uint16_t *)p + i, mk, ph);
        }
        if (mb == 4) {
            __m512 mv = _mm512_maskz_loadu_ps(mk, (float *)m + i);
            __m512 vv = _mm512_maskz_loadu_ps(mk, (float *)v + i);
            ZN_OPAQUE(mv);
            ZN_OPAQUE(vv);
            _mm512_mask_storeu_ps((float *)m + i, mk, mv);
            _mm512_mask_storeu_ps((float *)v + i, mk, vv);
        } else if (mb == 2) {
            __m256i mh = _mm256_maskz_loadu_epi16(mk, (uint16_t *)m + i);
            __m256i vh = _mm256_maskz_loadu_epi16(mk, (uint16_t *)v + i);
            ZN_OPAQUE(mh);
            ZN_OPAQUE(vh);
            _mm256_mask_storeu_epi16((uint16_t *)m + i, mk, mh);
            _mm256_mask_storeu_epi16((uint16_t *)v + i, mk, vh);
        } else {
            __m128i mq = _mm_maskz_loadu_epi8(mk, (uint8_t *)m + i);
            __m128i vq = _mm_maskz_loadu_epi8(mk, (uint8_t *)v + i);
            ZN_OPAQUE(mq);
            ZN_OPAQUE(vq);
            _mm_mask_storeu_epi8((uint8_t *)m + i, mk, mq);
            _mm_mask_storeu_epi8((uint8_t *)v + i, mk, vq);
            if ((i & (ZN_Q8_BLOCK - 1)) == 0) {
                size_t b = i / ZN_Q8_BLOCK;
                float x = am[b], y = av[b];
                __asm__ volatile("" : "+v"(x), "+v"(y));
                am[b] = x;
                av[b] = y;
            }
        }
    }
    if (nt)
        _mm_sfence();
}

/* ---- stochastic rounding (master_sr.c) --------------------------------- */

/* zn_sr_round_scalar on 16 lanes at a time; the tail masked (the same
 * vector code, so an element's bits never depend on where a range ends) */
static void avx512_sr_round(const float *x, uint16_t *out, size_t n, uint32_t k1, uint32_t k2,
                            uint32_t idx_lo)
{
    const __m512i K1 = _mm512_set1_epi32((int)k1), K2 = _mm512_set1_epi32((int)k2);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                           15);
    for (size_t i = 0; i < n; i += W) {
        __mmask16 mk = tail_mask(n - i);
        __m512i idx = _mm512_add_epi32(_mm512_set1_epi32((int)(idx_lo + (uint32_t)i)), lane);
        _mm256_mask_storeu_epi16(out + i, mk, sr16(_mm512_maskz_loadu_ps(mk, x + i), idx, K1,
                                                   K2));
    }
}

/* The bf16-master step fused (zn_adam_sr_fn): p widened, stepped by
 * adam16 with its moments (fp32, or bf16 as load_mom), rounded by sr16. */
static inline __attribute__((always_inline)) void
sr_body(const zn_adam_consts *k, uint16_t *p, void *m, void *v, int mh, const void *g,
        zn_dtype gt, size_t n, uint32_t k1, uint32_t k2, uint32_t idx_lo)
{
    consts K = load_consts(k);
    int l2 = k->use_l2, decay = k->use_decay;
    const __m512i K1 = _mm512_set1_epi32((int)k1), K2 = _mm512_set1_epi32((int)k2);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                           15);
    for (size_t i = 0; i < n; i += W) {
        __mmask16 mk = tail_mask(n - i);
        __m512 pv = load_g(p, ZN_DTYPE_BF16, i, mk), mv = load_mom(m, mh, i, mk);
        __m512 vv = load_mom(v, mh, i, mk);
        adam16(&K, l2, decay, &pv, &mv, &vv, load_g(g, gt, i, mk));
        store_mom(m, mh, i, mk, mv);
        store_mom(v, mh, i, mk, vv);
        __m512i idx = _mm512_add_epi32(_mm512_set1_epi32((int)(idx_lo + (uint32_t)i)), lane);
        _mm256_mask_storeu_epi16(p + i, mk, sr16(pv, idx, K1, K2));
    }
}

static void avx512_adam_sr(const zn_adam_consts *k, uint16_t *p, void *m, void *v, int mb,
                           const void *g, zn_dtype gt, size_t n, uint32_t k1, uint32_t k2,
                           uint32_t idx_lo)
{
#define CASE(G, MH)                                                       \
    if (gt == (G) && (mb == 2) == (MH)) {                                 \
        sr_body(k, p, m, v, MH, g, G, n, k1, k2, idx_lo);                 \
        return;                                                           \
    }
    CASE(ZN_DTYPE_F32, 0)
    CASE(ZN_DTYPE_BF16, 0)
    CASE(ZN_DTYPE_F16, 0)
    CASE(ZN_DTYPE_F32, 1)
    CASE(ZN_DTYPE_BF16, 1)
    CASE(ZN_DTYPE_F16, 1)
#undef CASE
}

const zn_optim_ops ZN_AVX512_OPS = {
    ZN_ISA_AVX512, "avx512", avx512_adam, avx512_norm_chunk, avx512_rmw, avx512_triad,
    avx512_q8_dequant, avx512_q8_quant, avx512_bf16_widen, avx512_bf16_round, avx512_rmw_mom,
    avx512_sr_round,
    NULL,   /* no fused 8-bit block: moments.c runs the pieces */
    avx512_adam_bf16, avx512_adam_sr,
    NULL,   /* no fused 8-bit block for the bf16 master either */
};
#endif
