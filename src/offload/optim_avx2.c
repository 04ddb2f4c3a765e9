/* AVX2 + FMA + F16C kernels of the CPU optimizer (this file alone is built
 * for that target; adam.c checks the CPU before calling it). Tails go
 * through an 8-element buffer and the same vector code, so an element's
 * result never depends on where a thread's range ends. */
#include "offload/optim-impl.h"

#if ZN_OPTIM_X86
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#define W 8

/* Copies shorter than this use ordinary stores: the copy is then small
 * enough to stay in cache, where a streaming store would only evict it. */
#define NT_MIN ((size_t)1 << 16)

static inline __m256 load_g(const void *g, zn_dtype gt, size_t i)
{
    if (gt == ZN_DTYPE_F32)
        return _mm256_loadu_ps((const float *)g + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
    if (gt == ZN_DTYPE_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

static inline __m128i round16(__m256 x, zn_dtype ct)
{
    if (ct == ZN_DTYPE_F16)
        return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i u = _mm256_castps_si256(x);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)),
                                                     _mm256_set1_epi32(0x7fff)));
    r = _mm256_srli_epi32(r, 16);
    __m256i qnan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(isnan));
    /* values are in [0, 0xffff]: the unsigned saturating pack is exact */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

typedef struct {
    __m256 b1, omb1, b2, omb2, step, bc2, eps, gs, l2, decay;
} consts;

static inline consts load_consts(const zn_adam_k *k)
{
    consts c = {
        _mm256_set1_ps(k->b1), _mm256_set1_ps(k->omb1), _mm256_set1_ps(k->b2),
        _mm256_set1_ps(k->omb2), _mm256_set1_ps(k->step_size), _mm256_set1_ps(k->bc2),
        _mm256_set1_ps(k->eps), _mm256_set1_ps(k->g_scale), _mm256_set1_ps(k->l2),
        _mm256_set1_ps(k->decay),
    };
    return c;
}

/* W elements at offset i: the formula of zn_adam_elem with FMAs. */
static inline __attribute__((always_inline)) void
vec8(const consts *K, int l2, int decay, float *p, float *m, float *v, const void *g,
     zn_dtype gt, void *c, zn_dtype ct, int nt, size_t i)
{
    __m256 pv = _mm256_loadu_ps(p + i), mv = _mm256_loadu_ps(m + i), vv = _mm256_loadu_ps(v + i);
    __m256 gv = _mm256_mul_ps(load_g(g, gt, i), K->gs);
    if (l2)
        gv = _mm256_fmadd_ps(pv, K->l2, gv);
    mv = _mm256_fmadd_ps(K->b1, mv, _mm256_mul_ps(K->omb1, gv));
    vv = _mm256_fmadd_ps(K->b2, vv, _mm256_mul_ps(_mm256_mul_ps(K->omb2, gv), gv));
    __m256 den = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), K->bc2, K->eps);
    __m256 upd = _mm256_div_ps(mv, den);
    __m256 dp = _mm256_mul_ps(K->step, upd);
    if (decay)
        dp = _mm256_fmadd_ps(pv, K->decay, dp);
    pv = _mm256_add_ps(pv, dp);
    _mm256_storeu_ps(p + i, pv);
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    if (c) {
        __m128i h = round16(pv, ct);
        if (nt)
            _mm_stream_si128((__m128i *)((uint16_t *)c + i), h);
        else
            _mm_storeu_si128((__m128i *)((uint16_t *)c + i), h);
    }
}

static inline __attribute__((always_inline)) void
adam_body(const zn_adam_k *k, float *p, float *m, float *v, const void *g, zn_dtype gt,
          void *c, zn_dtype ct, size_t n)
{
    consts K = load_consts(k);
    int l2 = k->use_l2, decay = k->use_decay;
    int nt = zn_optim_nt_copy && c && n >= NT_MIN && ((uintptr_t)c & 15) == 0;
    size_t i = 0;
    for (; i + W <= n; i += W)
        vec8(&K, l2, decay, p, m, v, g, gt, c, ct, nt, i);
    if (nt)
        _mm_sfence();
    if (i < n) {
        /* the tail: the same vector code on a zero-padded copy */
        size_t r = n - i, gs = zn_dtype_size(gt);
        float tp[W] = { 0 }, tm[W] = { 0 }, tv[W] = { 0 };
        float tg[W] = { 0 };
        uint16_t tc[W];
        memcpy(tp, p + i, r * 4);
        memcpy(tm, m + i, r * 4);
        memcpy(tv, v + i, r * 4);
        memcpy(tg, (const char *)g + i * gs, r * gs);
        vec8(&K, l2, decay, tp, tm, tv, tg, gt, c ? tc : NULL, ct, 0, 0);
        memcpy(p + i, tp, r * 4);
        memcpy(m + i, tm, r * 4);
        memcpy(v + i, tv, r * 4);
        if (c)
            memcpy((uint16_t *)c + i, tc, r * 2);
    }
}

static void avx2_adam(const zn_adam_k *k, float *p, float *m, float *v, const void *g,
                      zn_dtype gt, void *c, zn_dtype ct, size_t n)
{
    /* one instance per dtype pair so that the type tests fold away */
#define CASE(G, C, CP)                                                    \
    if (gt == (G) && (CP) == (c != NULL) && (!(CP) || ct == (C))) {       \
        adam_body(k, p, m, v, g, G, c, C, n);                             \
        return;                                                           \
    }
    CASE(ZN_DTYPE_F32, ZN_DTYPE_BF16, 0)
    CASE(ZN_DTYPE_F32, ZN_DTYPE_BF16, 1)
    CASE(ZN_DTYPE_F32, ZN_DTYPE_F16, 1)
    CASE(ZN_DTYPE_BF16, ZN_DTYPE_BF16, 0)
    CASE(ZN_DTYPE_BF16, ZN_DTYPE_BF16, 1)
    CASE(ZN_DTYPE_BF16, ZN_DTYPE_F16, 1)
    CASE(ZN_DTYPE_F16, ZN_DTYPE_BF16, 0)
    CASE(ZN_DTYPE_F16, ZN_DTYPE_BF16, 1)
    CASE(ZN_DTYPE_F16, ZN_DTYPE_F16, 1)
#undef CASE
}

/* ---- gradient norm: 16 double lanes in four registers ----------------- */

static inline void norm16(const void *x, zn_dtype t, size_t i, __m256d acc[4])
{
    __m256 a = load_g(x, t, i), b = load_g(x, t, i + 8);
    __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(a));
    __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
    __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(b));
    __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1));
    /* the square is exact in double, so the FMA rounds like acc + x*x */
    acc[0] = _mm256_fmadd_pd(d0, d0, acc[0]);
    acc[1] = _mm256_fmadd_pd(d1, d1, acc[1]);
    acc[2] = _mm256_fmadd_pd(d2, d2, acc[2]);
    acc[3] = _mm256_fmadd_pd(d3, d3, acc[3]);
}

static inline double norm_body(const void *x, zn_dtype t, size_t n)
{
    __m256d acc[4] = { _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                       _mm256_setzero_pd() };
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        norm16(x, t, i, acc);
    if (i < n) {
        /* zeros add nothing: lane i % 16 of the padded block is lane i % 16 */
        float tail[16] = { 0 };
        for (size_t j = 0; i + j < n; j++)
            tail[j] = zn_load_elem(x, t, i + j);
        norm16(tail, ZN_DTYPE_F32, 0, acc);
    }
    /* s = 8: lanes 0-7 += lanes 8-15; s = 4: lanes 0-3 += 4-7; then 2, 1 */
    __m256d s0 = _mm256_add_pd(acc[0], acc[2]);
    __m256d s1 = _mm256_add_pd(acc[1], acc[3]);
    s0 = _mm256_add_pd(s0, s1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s0), _mm256_extractf128_pd(s0, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

static double avx2_norm_chunk(const void *x, zn_dtype t, size_t n)
{
    if (t == ZN_DTYPE_F32)
        return norm_body(x, ZN_DTYPE_F32, n);
    if (t == ZN_DTYPE_BF16)
        return norm_body(x, ZN_DTYPE_BF16, n);
    return norm_body(x, ZN_DTYPE_F16, n);
}

/* ---- benchmark ceilings ------------------------------------------------- */

static inline void rmw_body(float *p, float *m, float *v, const void *g, zn_dtype gt, void *c,
                            size_t n)
{
    int nt = zn_optim_nt_copy && c && n >= NT_MIN && ((uintptr_t)c & 15) == 0;
    size_t i = 0;
    for (; i + W <= n; i += W) {
        __m256 pv = _mm256_loadu_ps(p + i), mv = _mm256_loadu_ps(m + i);
        __m256 vv = _mm256_loadu_ps(v + i), gv = load_g(g, gt, i);
        /* opaque to the compiler: the stores below must happen */
        __asm__ volatile("" : "+x"(pv), "+x"(mv), "+x"(vv), "+x"(gv));
        _mm256_storeu_ps(p + i, pv);
        _mm256_storeu_ps(m + i, mv);
        _mm256_storeu_ps(v + i, vv);
        if (c) {
            /* the low halves of p's bits: a pack, no arithmetic */
            __m256i u = _mm256_and_si256(_mm256_castps_si256(pv), _mm256_set1_epi32(0xffff));
            __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(u),
                                         _mm256_extracti128_si256(u, 1));
            if (nt)
                _mm_stream_si128((__m128i *)((uint16_t *)c + i), h);
            else
                _mm_storeu_si128((__m128i *)((uint16_t *)c + i), h);
        }
    }
    if (nt)
        _mm_sfence();
    for (; i < n; i++) {
        if (c)
            ((uint16_t *)c)[i] = (uint16_t)zn_f32_bits(p[i]);
    }
}

static void avx2_rmw(float *p, float *m, float *v, const void *g, zn_dtype gt, void *c,
                     size_t n)
{
    if (gt == ZN_DTYPE_F32)
        rmw_body(p, m, v, g, ZN_DTYPE_F32, c, n);
    else
        rmw_body(p, m, v, g, ZN_DTYPE_BF16, c, n);  /* F16 moves the same bytes */
}

static void avx2_triad(float *a, const float *b, const float *c, float s, size_t n)
{
    __m256 sv = _mm256_set1_ps(s);
    size_t i = 0;
    for (; i + W <= n; i += W)
        _mm256_storeu_ps(a + i, _mm256_fmadd_ps(sv, _mm256_loadu_ps(c + i),
                                                _mm256_loadu_ps(b + i)));
    for (; i < n; i++)
        a[i] = b[i] + s * c[i];
}

const zn_optim_ops zn_optim_ops_avx2 = {
    ZN_ISA_AVX2, "avx2", avx2_adam, avx2_norm_chunk, avx2_rmw, avx2_triad,
};
#endif
