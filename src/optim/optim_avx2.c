/* AVX2 + FMA + F16C kernels of the CPU optimizer (this file alone is built
 * for that target; adam.c checks the CPU before calling it). Tails go
 * through an 8-element buffer and the same vector code, so an element's
 * result never depends on where a thread's range ends. */
#include "optim/optim-impl.h"

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
    if (gt == ZN_DTYPE_BF16) {
        /* both 128-bit lanes hold the 8 halves; one shuffle puts halves 0-3
         * (low lane) and 4-7 (high lane) into the top of 32-bit lanes, zeros
         * below: one shuffle-port op instead of a widen and a shift */
        const __m256i wmask = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1,
                                               6, 7, -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12,
                                               13, -1, -1, 14, 15);
        return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(h), wmask));
    }
    return _mm256_cvtph_ps(h);
}

/* bf16 rounding on 32-bit lanes: each lane's high half becomes the bf16
 * (round to nearest even). NaN lanes get no rounding bias, so they keep
 * their top bits; the kernels only round results of an arithmetic
 * instruction, whose NaNs are already quiet (x86 sets the quiet bit), so
 * this equals zn_bf16_round in util.h (top bits | quiet bit). Masking the
 * bias (and-not, any vector ALU) instead of blending the result saves an
 * op on the ports the FMAs need. */
static inline __m256i bf16_hi(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
    __m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_add_epi32(u, _mm256_andnot_si256(_mm256_castps_si256(isnan), bias));
}

/* Gathers each 128-bit lane's four high (hi = 1) or low halves into that
 * lane's low 8 bytes: one shuffle instead of a shift and a pack. */
static inline __m256i halves(__m256i r, int hi)
{
    const __m256i hmask = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1,
                                           -1, -1, 2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1,
                                           -1, -1, -1, -1);
    const __m256i lmask = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1,
                                           -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1,
                                           -1, -1, -1, -1);
    return _mm256_shuffle_epi8(r, hi ? hmask : lmask);
}

/* 8 gathered halves in order */
static inline __m128i join8(__m256i s)
{
    return _mm_unpacklo_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* 16 gathered halves (a: elements 0-7, b: 8-15) in order */
static inline __m256i join16(__m256i a, __m256i b)
{
    return _mm256_permute4x64_epi64(_mm256_unpacklo_epi64(a, b), 0xd8);
}

/* 16 16-bit values to dst, streamed past the cache with nt. */
static inline void store16(uint16_t *dst, __m256i h, int nt)
{
    if (nt)
        _mm256_stream_si256((__m256i *)dst, h);
    else
        _mm256_storeu_si256((__m256i *)dst, h);
}

/* The 16-bit copy of 2 x 8 updated floats: their bits' low halves
 * (shuffles, no arithmetic). */
static inline void store_low_halves(uint16_t *dst, __m256 p0, __m256 p1, int nt)
{
    store16(dst, join16(halves(_mm256_castps_si256(p0), 0), halves(_mm256_castps_si256(p1), 0)),
            nt);
}

static inline __m128i copy8(__m256 x, zn_dtype ct)
{
    if (ct == ZN_DTYPE_F16)
        return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return join8(halves(bf16_hi(x), 1));
}

static inline __m256i copy16(__m256 x0, __m256 x1, zn_dtype ct)
{
    if (ct == ZN_DTYPE_F16)
        return _mm256_set_m128i(
            _mm256_cvtps_ph(x1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
            _mm256_cvtps_ph(x0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return join16(halves(bf16_hi(x0), 1), halves(bf16_hi(x1), 1));
}

typedef struct {
    __m256 b1, omb1, omb2, step, eps, gs, l2, decay;
} consts;

static inline consts load_consts(const zn_adam_consts *k)
{
    consts c = {
        _mm256_set1_ps(k->b1), _mm256_set1_ps(k->omb1), _mm256_set1_ps(k->omb2),
        _mm256_set1_ps(k->step_size),
        _mm256_set1_ps(k->eps), _mm256_set1_ps(k->g_scale), _mm256_set1_ps(k->l2),
        _mm256_set1_ps(k->decay),
    };
    return c;
}

/* Weight decay mode of a call: none, L2 (into the gradient), decoupled. */
enum { WD_NONE, WD_L2, WD_DECAY };

/* W moments at offset i: fp32 (mh 0) or bf16 (mh 1), widened exactly;
 * stored back rounded to nearest even (copy8, as zn_bf16_round for the
 * quiet NaNs arithmetic gives). */
static inline __m256 load_mom(const void *m, int mh, size_t i)
{
    return mh ? load_g(m, ZN_DTYPE_BF16, i) : _mm256_loadu_ps((const float *)m + i);
}

static inline void store_mom(void *m, int mh, size_t i, __m256 x)
{
    if (mh)
        _mm_storeu_si128((__m128i *)((uint16_t *)m + i), copy8(x, ZN_DTYPE_BF16));
    else
        _mm256_storeu_ps((float *)m + i, x);
}

/* W elements at offset i: the formula of zn_adam_elem with FMAs. Stores p,
 * m, v (as load_mom) and returns the new p for the copy. `scale` and `wd` are constants
 * in the main loops (one loop per option set), so that no option is tested
 * per vector. (A scale of 1 is skipped: x * 1 is x exactly.) */
static inline __attribute__((always_inline)) __m256
step8(const consts *K, int scale, int wd, float *p, void *m, void *v, int mh, const void *g,
      zn_dtype gt, size_t i)
{
    __m256 pv = _mm256_loadu_ps(p + i), mv = load_mom(m, mh, i), vv = load_mom(v, mh, i);
    __m256 gv = load_g(g, gt, i);
    if (scale)
        gv = _mm256_mul_ps(gv, K->gs);
    if (wd == WD_L2)
        gv = _mm256_fmadd_ps(pv, K->l2, gv);
    /* v as a step toward g*g: two FMAs (see zn_adam_elem) */
    mv = _mm256_fmadd_ps(K->b1, mv, _mm256_mul_ps(K->omb1, gv));
    vv = _mm256_fmadd_ps(K->omb2, _mm256_fmsub_ps(gv, gv, vv), vv);
    __m256 upd = _mm256_div_ps(mv, _mm256_add_ps(_mm256_sqrt_ps(vv), K->eps));
    if (wd == WD_DECAY) {
        __m256 dp = _mm256_fmadd_ps(pv, K->decay, _mm256_mul_ps(K->step, upd));
        pv = _mm256_add_ps(pv, dp);
    } else {
        pv = _mm256_fmadd_ps(K->step, upd, pv);
    }
    _mm256_storeu_ps(p + i, pv);
    store_mom(m, mh, i, mv);
    store_mom(v, mh, i, vv);
    return pv;
}

static inline void store_copy16(uint16_t *c, __m256 x0, __m256 x1, zn_dtype ct, int nt)
{
    store16(c, copy16(x0, x1, ct), nt);
}

/* Whole turns of four vectors from element 0; returns the elements done.
 * The copy of a turn is rounded and stored in the next turn, after that
 * turn's Adam arithmetic: its inputs are then ready when it is issued, so
 * it does not sit in the scheduler behind the sqrt and divide chain of its
 * own elements. (Measured on Zen 3, data in L1, bf16 grads with a bf16
 * copy: 1.69 -> 2.15 Gparam/s per core from this alone.) */
static inline __attribute__((always_inline)) size_t
main_loop(const consts *K, int scale, int wd, float *p, void *m, void *v, int mh, const void *g,
          zn_dtype gt, uint16_t *c, zn_dtype ct, int nt, size_t n)
{
    if (n < 4 * W)
        return 0;
    __m256 x0 = step8(K, scale, wd, p, m, v, mh, g, gt, 0);
    __m256 x1 = step8(K, scale, wd, p, m, v, mh, g, gt, W);
    __m256 x2 = step8(K, scale, wd, p, m, v, mh, g, gt, 2 * W);
    __m256 x3 = step8(K, scale, wd, p, m, v, mh, g, gt, 3 * W);
    size_t i = 4 * W;
    for (; i + 4 * W <= n; i += 4 * W) {
        __m256 y0 = step8(K, scale, wd, p, m, v, mh, g, gt, i);
        __m256 y1 = step8(K, scale, wd, p, m, v, mh, g, gt, i + W);
        __m256 y2 = step8(K, scale, wd, p, m, v, mh, g, gt, i + 2 * W);
        __m256 y3 = step8(K, scale, wd, p, m, v, mh, g, gt, i + 3 * W);
        if (c) {
            store_copy16(c + i - 4 * W, x0, x1, ct, nt);
            store_copy16(c + i - 2 * W, x2, x3, ct, nt);
        }
        x0 = y0;
        x1 = y1;
        x2 = y2;
        x3 = y3;
    }
    if (c) {
        store_copy16(c + i - 4 * W, x0, x1, ct, nt);
        store_copy16(c + i - 2 * W, x2, x3, ct, nt);
    }
    return i;
}

static inline __attribute__((always_inline)) void
adam_body(const zn_adam_consts *k, float *p, void *m, void *v, int mh, const void *g,
          zn_dtype gt, void *c, zn_dtype ct, size_t n)
{
    consts K = load_consts(k);
    uint16_t *c16 = c;
    int nt = zn_optim_nt_copy && c && (n >= NT_MIN || k->copy_stream) &&
             ((uintptr_t)c & 31) == 0;
    int scale = k->g_scale != 1.0f;
    int wd = k->use_l2 ? WD_L2 : k->use_decay ? WD_DECAY : WD_NONE;
    size_t i;
#define MAIN(S, D) main_loop(&K, S, D, p, m, v, mh, g, gt, c16, ct, nt, n)
    if (scale)
        i = wd == WD_NONE ? MAIN(1, WD_NONE) : wd == WD_L2 ? MAIN(1, WD_L2) : MAIN(1, WD_DECAY);
    else
        i = wd == WD_NONE ? MAIN(0, WD_NONE) : wd == WD_L2 ? MAIN(0, WD_L2) : MAIN(0, WD_DECAY);
#undef MAIN
    if (nt)
        _mm_sfence();
    /* fewer than 4 vectors left: options tested per vector, that is fine */
    for (; i + W <= n; i += W) {
        __m256 x = step8(&K, scale, wd, p, m, v, mh, g, gt, i);
        if (c)
            _mm_storeu_si128((__m128i *)(c16 + i), copy8(x, ct));
    }
    if (i < n) {
        /* the tail: the same vector code on a zero-padded copy */
        size_t r = n - i, gs = zn_dtype_size(gt), ms = mh ? 2 : 4;
        float tp[W] = { 0 }, tm[W] = { 0 }, tv[W] = { 0 };
        float tg[W] = { 0 };
        memcpy(tp, p + i, r * 4);
        memcpy(tm, (char *)m + i * ms, r * ms);
        memcpy(tv, (char *)v + i * ms, r * ms);
        memcpy(tg, (const char *)g + i * gs, r * gs);
        __m256 x = step8(&K, scale, wd, tp, tm, tv, mh, tg, gt, 0);
        memcpy(p + i, tp, r * 4);
        memcpy((char *)m + i * ms, tm, r * ms);
        memcpy((char *)v + i * ms, tv, r * ms);
        if (c) {
            uint16_t tc[W];
            _mm_storeu_si128((__m128i *)tc, copy8(x, ct));
            memcpy(c16 + i, tc, r * 2);
        }
    }
}

/* one instance per dtype pair and moment format, so that the type tests
 * fold away */
#define CASE(G, C, CP, MH)                                                \
    if (gt == (G) && (CP) == (c != NULL) && (!(CP) || ct == (C))) {       \
        adam_body(k, p, m, v, MH, g, G, (CP) ? c : NULL, C, n);           \
        return;                                                           \
    }

static void avx2_adam(const zn_adam_consts *k, float *p, float *m, float *v, const void *g,
                      zn_dtype gt, void *c, zn_dtype ct, size_t n)
{
    ZN_ADAM_DTYPE_CASES(CASE, 0)
}

static void avx2_adam_bf16(const zn_adam_consts *k, float *p, uint16_t *m, uint16_t *v,
                           const void *g, zn_dtype gt, void *c, zn_dtype ct, size_t n)
{
    ZN_ADAM_DTYPE_CASES(CASE, 1)
}
#undef CASE

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
    /* the same turn of two vectors and the same store kinds as adam_body */
    uint16_t *c16 = c;
    int nt = zn_optim_nt_copy && c && n >= NT_MIN && ((uintptr_t)c & 31) == 0;
    size_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        __m256 p0 = _mm256_loadu_ps(p + i), m0 = _mm256_loadu_ps(m + i);
        __m256 v0 = _mm256_loadu_ps(v + i), g0 = load_g(g, gt, i);
        __m256 p1 = _mm256_loadu_ps(p + i + W), m1 = _mm256_loadu_ps(m + i + W);
        __m256 v1 = _mm256_loadu_ps(v + i + W), g1 = load_g(g, gt, i + W);
        /* opaque to the compiler: the stores below must happen */
        __asm__ volatile("" : "+x"(p0), "+x"(m0), "+x"(v0), "+x"(g0));
        __asm__ volatile("" : "+x"(p1), "+x"(m1), "+x"(v1), "+x"(g1));
        _mm256_storeu_ps(p + i, p0);
        _mm256_storeu_ps(m + i, m0);
        _mm256_storeu_ps(v + i, v0);
        _mm256_storeu_ps(p + i + W, p1);
        _mm256_storeu_ps(m + i + W, m1);
        _mm256_storeu_ps(v + i + W, v1);
        if (c)
            store_low_halves(c16 + i, p0, p1, nt);
    }
    if (nt)
        _mm_sfence();
    for (; i < n; i++) {
        if (c)
            c16[i] = (uint16_t)zn_f32_bits(p[i]);
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

/* ---- compressed moments (moments.c) -------------------------------------
 * Whole vectors here, the last n % 8 elements by the scalar forms: every
 * piece is one exact operation per element (a multiply, a compare, a
 * rounding), so both give the same bits. */

/* byte 0 of each 32-bit lane, in order, in the low 8 bytes */
static inline __m128i lane_bytes(__m256i c)
{
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1, -1, -1);
    __m256i s = _mm256_shuffle_epi8(c, pick);
    return _mm_unpacklo_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

static void avx2_q8_dequant(const uint8_t *q, const zn_q8_table *t, float absmax, float *out,
                            size_t n)
{
    const float *map = t->map;
    __m256 a = _mm256_set1_ps(absmax);
    size_t i = 0;
    for (; i + W <= n; i += W) {
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_i32gather_ps(map, idx, 4), a));
    }
    zn_q8_dequant_scalar(q + i, t, absmax, out + i, n - i);
}

static float avx2_q8_quant(const float *x, const zn_q8_table *t, uint8_t *q, size_t n)
{
    const __m256 nosign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mx = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + W <= n; i += W)
        mx = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), nosign), mx);
    float lanes[W], amax = 0.0f;
    _mm256_storeu_ps(lanes, mx);
    for (int j = 0; j < W; j++)
        amax = lanes[j] > amax ? lanes[j] : amax;
    for (; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    float scale = zn_q8_scale(t, amax);
    if (scale == 0.0f) {
        memset(q, 0, n);
        return scale;
    }
    float svs = zn_q8_scale_operand(t, scale);
    const __m256 sv = _mm256_set1_ps(svs), lo = _mm256_set1_ps(-1.0f);
    const __m256 hi = _mm256_set1_ps(1.0f);
    /* zn_q8_code_cell: one gather per element from the cell table (23 KiB
     * per map), where the key table and its midpoint took two, one of them
     * from 64 KiB that did not stay in L1 */
    const __m256i byte = _mm256_set1_epi32(0xff), low16 = _mm256_set1_epi32(0xffff);
    const __m256i nosign_i = _mm256_set1_epi32(0x7fffffff);
    const __m256i cell_lo = _mm256_set1_epi32((int)t->cell_lo);
    const __m256i cell_n = _mm256_set1_epi32((int)t->cell_n);
    const __m256i base = _mm256_set1_epi32((int)(t->cell_lo >> 16));
    const int *cell = (const int *)t->cell;
    const int divide = t->divide;
    for (i = 0; i + W <= n; i += W) {
        __m256 x8 = _mm256_loadu_ps(x + i);
        __m256 y = divide ? _mm256_div_ps(x8, sv) : _mm256_mul_ps(x8, sv);
        /* a NaN becomes -1 (maxps gives its second operand), whose code
         * is NaN's, 0 (the table checks mid[0] >= -1) */
        y = _mm256_min_ps(hi, _mm256_max_ps(y, lo));
        __m256i u = _mm256_castps_si256(y);
        __m256i neg = _mm256_srai_epi32(u, 31);   /* all ones where the sign is set */
        /* |y| in [cell_lo, 1] */
        __m256i a = _mm256_max_epi32(_mm256_and_si256(u, nosign_i), cell_lo);
        __m256i idx = _mm256_add_epi32(_mm256_sub_epi32(_mm256_srli_epi32(a, 16), base),
                                       _mm256_and_si256(neg, cell_n));
        __m256i w = _mm256_i32gather_epi32(cell, idx, 4);
        __m256i lo16 = _mm256_xor_si256(_mm256_and_si256(a, low16), _mm256_and_si256(neg, low16));
        /* a true compare is all ones: minus -1 is plus 1 */
        __m256i c = _mm256_sub_epi32(_mm256_and_si256(w, byte),
                                     _mm256_cmpgt_epi32(lo16, _mm256_srli_epi32(w, 16)));
        _mm_storel_epi64((__m128i *)(q + i), lane_bytes(c));
    }
    for (; i < n; i++)
        q[i] = zn_q8_scaled_code(t, x[i], svs);
    return scale;
}

static void avx2_bf16_widen(const uint16_t *h, float *out, size_t n)
{
    size_t i = 0;
    for (; i + W <= n; i += W) {
        __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(u, 16)));
    }
    zn_bf16_widen_scalar(h + i, out + i, n - i);
}

static void avx2_bf16_round(const float *x, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + W <= n; i += W)
        _mm_storeu_si128((__m128i *)(out + i), copy8(_mm256_loadu_ps(x + i), ZN_DTYPE_BF16));
    zn_bf16_round_scalar(x + i, out + i, n - i);
}

static void avx2_rmw_mom(void *p, int pb, void *m, void *v, int mb, float *am, float *av,
                         const void *g, zn_dtype gt, void *c, size_t n)
{
    int nt = zn_optim_nt_copy && c && ((uintptr_t)c & 31) == 0;
    uint16_t *c16 = c;
    if (gt != ZN_DTYPE_F32)
        gt = ZN_DTYPE_BF16;   /* F16 moves the same bytes */
    size_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        __m256 g0 = load_g(g, gt, i), g1 = load_g(g, gt, i + W);
        __asm__ volatile("" : "+x"(g0), "+x"(g1));
        if (pb == 4) {
            float *pf = (float *)p + i;
            __m256 p0 = _mm256_loadu_ps(pf), p1 = _mm256_loadu_ps(pf + W);
            __asm__ volatile("" : "+x"(p0), "+x"(p1));
            _mm256_storeu_ps(pf, p0);
            _mm256_storeu_ps(pf + W, p1);
            if (c)
                store_low_halves(c16 + i, p0, p1, nt);
        } else {
            __m256i ph = _mm256_loadu_si256((const __m256i *)((uint16_t *)p + i));
            __asm__ volatile("" : "+x"(ph));
            _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), ph);
        }
        if (mb == 4) {
            float *mf = (float *)m + i, *vf = (float *)v + i;
            __m256 m0 = _mm256_loadu_ps(mf), m1 = _mm256_loadu_ps(mf + W);
            __m256 v0 = _mm256_loadu_ps(vf), v1 = _mm256_loadu_ps(vf + W);
            __asm__ volatile("" : "+x"(m0), "+x"(m1), "+x"(v0), "+x"(v1));
            _mm256_storeu_ps(mf, m0);
            _mm256_storeu_ps(mf + W, m1);
            _mm256_storeu_ps(vf, v0);
            _mm256_storeu_ps(vf + W, v1);
        } else if (mb == 2) {
            __m256i mh = _mm256_loadu_si256((const __m256i *)((uint16_t *)m + i));
            __m256i vh = _mm256_loadu_si256((const __m256i *)((uint16_t *)v + i));
            __asm__ volatile("" : "+x"(mh), "+x"(vh));
            _mm256_storeu_si256((__m256i *)((uint16_t *)m + i), mh);
            _mm256_storeu_si256((__m256i *)((uint16_t *)v + i), vh);
        } else {
            __m128i mq = _mm_loadu_si128((const __m128i *)((uint8_t *)m + i));
            __m128i vq = _mm_loadu_si128((const __m128i *)((uint8_t *)v + i));
            __asm__ volatile("" : "+x"(mq), "+x"(vq));
            _mm_storeu_si128((__m128i *)((uint8_t *)m + i), mq);
            _mm_storeu_si128((__m128i *)((uint8_t *)v + i), vq);
            if ((i & (ZN_Q8_BLOCK - 1)) == 0) {
                size_t b = i / ZN_Q8_BLOCK;
                float x = am[b], y = av[b];
                __asm__ volatile("" : "+x"(x), "+x"(y));
                am[b] = x;
                av[b] = y;
            }
        }
    }
    if (nt)
        _mm_sfence();
    if (i < n) {
        size_t gs = zn_dtype_size(gt);
        zn_rmw_mom_scalar((char *)p + i * (size_t)pb, pb, (char *)m + i * (size_t)mb,
                          (char *)v + i * (size_t)mb, mb, NULL, NULL, (const char *)g + i * gs,
                          gt, c ? c16 + i : NULL, n - i);
    }
}

/* zn_lowbias32 on 8 lanes */
static inline __m256i lowbias8(__m256i x)
{
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846ca68bu));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* zn_bf16_round_sr of 8 lanes with the bits of zn_sr_hash, each lane's
 * result in the low half of its 32-bit lane */
static inline __m256i sr8(__m256 xv, __m256i idx, __m256i k1, __m256i k2)
{
    __m256i r = _mm256_srli_epi32(lowbias8(_mm256_add_epi32(lowbias8(_mm256_xor_si256(idx, k1)),
                                                            k2)), 16);
    __m256i u = _mm256_castps_si256(xv);
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000));
    __m256i t = _mm256_min_epu32(_mm256_srli_epi32(_mm256_add_epi32(a, r), 16),
                                 _mm256_set1_epi32(0x7f7f));
    /* NaN and Inf: their top bits, NaN made quiet */
    __m256i nonfin = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f7fffff));
    __m256i isnan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
    __m256i nf = _mm256_or_si256(_mm256_srli_epi32(a, 16),
                                 _mm256_and_si256(isnan, _mm256_set1_epi32(0x40)));
    return _mm256_or_si256(sign, _mm256_blendv_epi8(t, nf, nonfin));
}

static void avx2_sr_round(const float *x, uint16_t *out, size_t n, uint32_t k1, uint32_t k2,
                          uint32_t idx_lo)
{
    const __m256i K1 = _mm256_set1_epi32((int)k1), K2 = _mm256_set1_epi32((int)k2);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    size_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(idx_lo + (uint32_t)i)), lane);
        __m256i r0 = sr8(_mm256_loadu_ps(x + i), idx, K1, K2);
        __m256i r1 = sr8(_mm256_loadu_ps(x + i + W),
                         _mm256_add_epi32(idx, _mm256_set1_epi32(W)), K1, K2);
        /* values <= 0xffff: the unsigned-saturating pack keeps them */
        _mm256_storeu_si256((__m256i *)(out + i),
                            _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xd8));
    }
    /* the tail: the same integer formula, element by element */
    zn_sr_round_scalar(x + i, out + i, n - i, k1, k2, idx_lo + (uint32_t)i);
}

const zn_optim_ops zn_optim_ops_avx2 = {
    ZN_ISA_AVX2, "avx2", avx2_adam, avx2_norm_chunk, avx2_rmw, avx2_triad,
    avx2_q8_dequant, avx2_q8_quant, avx2_bf16_widen, avx2_bf16_round, avx2_rmw_mom,
    avx2_sr_round, NULL, avx2_adam_bf16,
    NULL,   /* no fused bf16-master step: 0.91-0.92x the pieces on Zen 4 */
    NULL,
};
#endif
