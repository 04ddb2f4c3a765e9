/* The 8-bit moments' dequantize, quantize and fused block step with
 * AVX-512 VBMI byte permutes (vpermb, vpermi2b: 64 byte lanes looked up in
 * one instruction from a 64- or 128-byte table), for CPUs that have VBMI
 * (Intel since Ice Lake, AMD Zen 4): no gathers, which are slow on Zen 4.
 * adam.c checks the CPU and puts these three into a copy of the AVX-512
 * table; everything else is the AVX-512 path's. */
#include "optim/optim-impl.h"

#if ZN_OPTIM_X86
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")
#include <immintrin.h>

#define V 64   /* codes per step: one zmm of bytes */

static inline __mmask16 mask16(size_t left)
{
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

static inline __mmask64 mask64(size_t left)
{
    return left >= V ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
}

/* 64 bytes of a 256-byte table t at the 64 indices c (every bit of c
 * used): bits 0-6 pick within each half, bit 7 the half. */
static inline __m512i lookup256(const uint8_t *t, __m512i c, __mmask64 hi)
{
    __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(t), c, _mm512_load_si512(t + 64));
    __m512i up = _mm512_permutex2var_epi8(_mm512_load_si512(t + 128), c,
                                          _mm512_load_si512(t + 192));
    return _mm512_mask_blend_epi8(hi, lo, up);
}

/* The map's four byte planes looked up for 64 codes at once (12 byte
 * permutes and blends), then put together into floats by two rounds of
 * byte and word unpacks. The unpacks work within 128-bit lanes, so the
 * codes are first permuted such that the four result registers hold
 * elements 0-15, 16-31, 32-47, 48-63 in order: register r's lane L, dword
 * k, comes from position 16L + 4r + k and is element 16r + 4L + k. Where
 * the AVX-512 path runs 8 two-register permutes and 7 blends per 16
 * codes, this runs about 30 instructions per 64. */
static const uint8_t map_order[64] __attribute__((aligned(64))) = {
#define ROW(L) 4 * L + 0, 4 * L + 1, 4 * L + 2, 4 * L + 3, 16 + 4 * L, 17 + 4 * L, 18 + 4 * L, \
               19 + 4 * L, 32 + 4 * L, 33 + 4 * L, 34 + 4 * L, 35 + 4 * L, 48 + 4 * L,         \
               49 + 4 * L, 50 + 4 * L, 51 + 4 * L
    ROW(0), ROW(1), ROW(2), ROW(3),
#undef ROW
};

/* map[q[e]] for the 64 codes at q (left of them valid) into r[0..3]. */
static inline __attribute__((always_inline)) void map64(const zn_q8_table *t, const uint8_t *q,
                                                        size_t left, __m512 r[4])
{
    __m512i c = _mm512_maskz_loadu_epi8(mask64(left), q);
    c = _mm512_permutexvar_epi8(_mm512_load_si512(map_order), c);
    __mmask64 hi = _mm512_movepi8_mask(c);
    __m512i b0 = lookup256(t->map_plane[0], c, hi), b1 = lookup256(t->map_plane[1], c, hi);
    __m512i b2 = lookup256(t->map_plane[2], c, hi), b3 = lookup256(t->map_plane[3], c, hi);
    __m512i w01lo = _mm512_unpacklo_epi8(b0, b1), w01hi = _mm512_unpackhi_epi8(b0, b1);
    __m512i w23lo = _mm512_unpacklo_epi8(b2, b3), w23hi = _mm512_unpackhi_epi8(b2, b3);
    r[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01lo, w23lo));
    r[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01lo, w23lo));
    r[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01hi, w23hi));
    r[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01hi, w23hi));
}

static void vbmi_q8_dequant(const uint8_t *q, const zn_q8_table *t, float absmax, float *out,
                            size_t n)
{
    const __m512 a = _mm512_set1_ps(absmax);
    for (size_t i = 0; i < n; i += V) {
        __m512 r[4];
        map64(t, q + i, n - i, r);
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            size_t at = i + 16 * (size_t)k;
            if (at < n)
                _mm512_mask_storeu_ps(out + at, mask16(n - at), _mm512_mul_ps(r[k], a));
        }
    }
}

/* Byte b of each of 64 keys, in element order, from four registers of 16
 * keys: two byte permutes put bytes hb and lb of 32 keys into one register
 * (hb in its low half), then 256-bit halves are joined. */
static inline void planes(const __m512i k[4], __m512i idx, __m512i *ph, __m512i *pl)
{
    __m512i a = _mm512_permutex2var_epi8(k[0], idx, k[1]);
    __m512i b = _mm512_permutex2var_epi8(k[2], idx, k[3]);
    *ph = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(1, 0, 1, 0));
    *pl = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 2, 3, 2));
}

/* zn_q8_code_tree for 64 elements at once, without a gather: the keys'
 * top 16 bits go through the 8-step binary search in two chains of 32
 * word lanes (a one-register vpermw per step while the step's midpoints
 * fit in 32 words, two-register vpermi2w after), then the 64 results, as
 * bytes, look up the four byte planes of their midpoint's key, which adds
 * one where that key is below the element's. On AMD Zen 4 (256 elements
 * in L1, best of 200 x 3000 calls, interleaved, one session): 0.605 ns per
 * element (0.556 with two blocks at once, below) against the AVX-512
 * path's gather 0.628; the same search in 64
 * byte lanes (two-byte compares in masks) took 0.70, and the gather with
 * its codes packed by one byte permute per 64 instead of a vpmovdb store
 * per 16 took 0.62: the gather, not the store, is that path's cost. */
typedef struct {
    __m512 sv, lo;
    __m512i top, one, oddw, evenb, onew, b6w, idx32, idx10;
    int divide;
} qconsts;

/* The codes of the 64 elements at x (left of them valid, the rest taken
 * as 0), as bytes. */
static inline __attribute__((always_inline)) __m512i
search64(const qconsts *Q, const zn_q8_table *t, const float *x, size_t left)
{
    __m512i k[4];
    #pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        size_t at = 16 * (size_t)r;
        __m512 x16 = at < left ? _mm512_maskz_loadu_ps(mask16(left - at), x + at)
                               : _mm512_setzero_ps();
        __m512 y = Q->divide ? _mm512_div_ps(x16, Q->sv) : _mm512_mul_ps(x16, Q->sv);
        /* a NaN becomes -1 (maxps gives its second operand), whose code
         * is NaN's, 0 (the table checks mid[0] >= -1). No clamp at 1: every
         * y above 1, +Inf too, is above the 255 midpoints below 1 and
         * not above mid[255] = +Inf, so its code is 1's, 255. */
        y = _mm512_max_ps(y, Q->lo);
        __m512i u = _mm512_castps_si512(y);
        /* the key: u ^ (u < 0 ? 0xffffffff : 0x80000000) */
        k[r] = _mm512_xor_si512(u, _mm512_or_si512(_mm512_srai_epi32(u, 31), Q->top));
    }
    /* the search in 16-bit lanes: two chains of 32 */
    __m512i w[2] = { _mm512_permutex2var_epi16(k[0], Q->oddw, k[1]),
                     _mm512_permutex2var_epi16(k[2], Q->oddw, k[3]) };
    __m512i jw[2] = { _mm512_setzero_si512(), _mm512_setzero_si512() };
    #pragma GCC unroll 8
    for (int l = 0; l < 8; l++) {
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512i m;
            if (l < 6) {
                m = _mm512_permutexvar_epi16(jw[h], _mm512_load_si512(t->tree16[l]));
            } else if (l == 6) {
                m = _mm512_permutex2var_epi16(_mm512_load_si512(t->tree16[6]), jw[h],
                                              _mm512_load_si512(t->tree16[6] + 32));
            } else {
                __m512i a = _mm512_permutex2var_epi16(_mm512_load_si512(t->tree16[7]), jw[h],
                                                      _mm512_load_si512(t->tree16[7] + 32));
                __m512i b = _mm512_permutex2var_epi16(_mm512_load_si512(t->tree16[7] + 64),
                                                      jw[h],
                                                      _mm512_load_si512(t->tree16[7] + 96));
                m = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(jw[h], Q->b6w), a, b);
            }
            __mmask32 below = _mm512_cmplt_epu16_mask(m, w[h]);
            jw[h] = _mm512_add_epi16(jw[h], jw[h]);
            jw[h] = _mm512_mask_add_epi16(jw[h], below, jw[h], Q->onew);
        }
    }
    __m512i j = _mm512_permutex2var_epi8(jw[0], Q->evenb, jw[1]);
    __m512i k3, k2, k1, k0;
    planes(k, Q->idx32, &k3, &k2);
    planes(k, Q->idx10, &k1, &k0);
    __mmask64 up = _mm512_movepi8_mask(j);
    __m512i c3 = lookup256(t->mid_plane[3], j, up), c2 = lookup256(t->mid_plane[2], j, up);
    __m512i c1 = lookup256(t->mid_plane[1], j, up), c0 = lookup256(t->mid_plane[0], j, up);
    __mmask64 same = _mm512_cmpeq_epi8_mask(c3, k3) & _mm512_cmpeq_epi8_mask(c2, k2);
    __mmask64 below = _mm512_cmplt_epu8_mask(c1, k1) |
                      (_mm512_cmpeq_epi8_mask(c1, k1) & _mm512_cmplt_epu8_mask(c0, k0));
    return _mm512_mask_add_epi8(j, same & below, j, Q->one);
}

/* zn_q8_code_lin for 64 elements at once (the linear estimate, see
 * zn_q8_table): 15-18 instructions per 16 elements, in float lanes,
 * where the search takes about 32 per 16 in word and byte lanes. Returns
 * whether every lane decided (about one element in 20000 does not: near a
 * midpoint, or NaN); then the caller searches those 64. */
typedef struct {
    __m512 sv, b0, b1, bn0, bn1, al0, al1, be0, be1, cap0, cap1;
    __m512i dlo0, dlo1, absm, lo, one, sixteen, kneg, fracm, pack4, pack2;
    int divide;
} lconsts;

/* The map kinds lin16 is compiled for: signed with one group-boundary
 * table for both sides (bitsandbytes'), signed with one per side
 * (torchao's), unsigned. */
enum { LIN_SYM, LIN_TWO_B, LIN_UNSIGNED };

static inline __attribute__((always_inline)) __m512i lin16(const lconsts *L, __m512 x,
                                                           __mmask16 *ok, const int kind)
{
    __m512 y = L->divide ? _mm512_div_ps(x, L->sv) : _mm512_mul_ps(x, L->sv);
    __m512i u = _mm512_castps_si512(y);
    __mmask16 neg = _mm512_movepi32_mask(u);
    /* |y| <= 1 (times 1 + 2^-23 at most): exponents up to 127. A NaN has
     * 255, whose low 5 bits, all the permutes read, are 127's; it is
     * flagged below whatever its group. Below 2^-31 the smallest binade. */
    if (kind == LIN_UNSIGNED) {
        /* no side of 0 to choose: a set sign bit (-0 or a negative, which no
         * second moment is, or a NaN) sends the 64 to the search, so its
         * table indices (from the exponent of u, 256 or more) do not
         * matter: 15 instructions per 16 where the signed forms take 18 */
        __m512i ex = _mm512_max_epi32(_mm512_srli_epi32(u, 23), L->lo);
        __m512i d = _mm512_permutex2var_epi32(L->dlo0, ex, L->dlo1);
        __m512 b = _mm512_permutex2var_ps(L->b0, ex, L->b1);
        d = _mm512_mask_add_epi32(d, _mm512_cmp_ps_mask(b, y, _CMP_LT_OQ), d, L->one);
        __m512 f = _mm512_fmadd_ps(y, _mm512_permutex2var_ps(L->al0, d, L->al1),
                                   _mm512_permutex2var_ps(L->be0, d, L->be1));
        __m512 U = _mm512_min_ps(_mm512_permutex2var_ps(L->cap0, d, L->cap1), f);
        __m512i e = _mm512_cvt_roundps_epi32(U, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        *ok = _mm512_mask_test_epi32_mask(_knot_mask16(neg), e, L->fracm);
        return e;
    }
    /* y < 0: the float after |y|, (u & 0x7fffffff) + 1, is u - 0x7fffffff */
    __m512i ab = _mm512_mask_sub_epi32(u, neg, u, L->absm);
    __m512i ex = _mm512_max_epi32(_mm512_srli_epi32(ab, 23), L->lo);
    __m512 a = _mm512_castsi512_ps(ab);
    /* the two-register permutes read the index's low 5 bits: ex - 96 */
    __m512i d = _mm512_permutex2var_epi32(L->dlo0, ex, L->dlo1);
    __m512 b = _mm512_permutex2var_ps(L->b0, ex, L->b1);
    if (kind == LIN_TWO_B)
        b = _mm512_mask_blend_ps(neg, b, _mm512_permutex2var_ps(L->bn0, ex, L->bn1));
    d = _mm512_mask_add_epi32(d, _mm512_cmp_ps_mask(b, a, _CMP_LT_OQ), d, L->one);
    d = _mm512_mask_add_epi32(d, neg, d, L->sixteen);
    __m512 f = _mm512_fmadd_ps(a, _mm512_permutex2var_ps(L->al0, d, L->al1),
                               _mm512_permutex2var_ps(L->be0, d, L->be1));
    /* the tables are scaled by 2^16, so this U is 2^16 times the scalar
     * form's, exactly: its floor has floor(U) in bits 16-23 and U - floor(U)
     * in bits 0-15, which must be 2^-11 (2 eps) at least; NaN and +-Inf
     * give 0x80000000, flagged */
    __m512 U = _mm512_min_ps(_mm512_permutex2var_ps(L->cap0, d, L->cap1), f);
    __m512i e = _mm512_cvt_roundps_epi32(U, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    *ok = _mm512_test_epi32_mask(e, L->fracm);
    /* y < 0: kneg - floor(U) in bits 16-23 (0xffff less the fraction
     * borrows nothing) */
    return _mm512_mask_sub_epi32(e, neg, L->kneg, e);
}

static inline __attribute__((always_inline)) int lin64(const lconsts *L, const float *x,
                                                       size_t left, __m512i *codes,
                                                       const int kind)
{
    __m512i e[4];
    __mmask16 ok = 0xffff;
    #pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        size_t at = 16 * (size_t)r;
        __m512 x16 = at < left ? _mm512_maskz_loadu_ps(mask16(left - at), x + at)
                               : _mm512_setzero_ps();
        __mmask16 k;
        e[r] = lin16(L, x16, &k, kind);
        ok &= k;
    }
    /* byte 2 of each dword: 16 + 16 from two registers, then the halves */
    __m512i lo = _mm512_permutex2var_epi8(e[0], L->pack4, e[1]);
    __m512i hi = _mm512_permutex2var_epi8(e[2], L->pack4, e[3]);
    *codes = _mm512_permutex2var_epi8(lo, L->pack2, hi);
    return ok == 0xffff;
}

static inline __attribute__((always_inline)) void
lin_codes(const lconsts *L, const qconsts *Q, const zn_q8_table *t, const float *x, uint8_t *q,
          size_t n, const int kind)
{
    size_t i = 0;
    for (; i + V <= n; i += V) {
        __m512i c;
        if (!lin64(L, x + i, V, &c, kind))
            c = search64(Q, t, x + i, V);
        _mm512_storeu_si512(q + i, c);
    }
    if (i < n) {
        __m512i c;
        if (!lin64(L, x + i, n - i, &c, kind))
            c = search64(Q, t, x + i, n - i);
        _mm512_mask_storeu_epi8(q + i, mask64(n - i), c);
    }
}

/* The codes of x[0, n) for a block whose largest |x| is amax; returns the
 * scale (zn_q8_quant_fn). */
static inline __attribute__((always_inline)) float
quant_codes(const float *x, const zn_q8_table *t, uint8_t *q, size_t n, float amax)
{
    float scale = zn_q8_scale(t, amax);
    if (scale == 0.0f) {
        memset(q, 0, n);
        return scale;
    }
    if (!t->vbmi_ok) {
        /* a map with a midpoint at +-0 (none of the built-in ones) */
        float sv = zn_q8_scale_operand(t, scale);
        for (size_t i = 0; i < n; i++)
            q[i] = zn_q8_scaled_code(t, x[i], sv);
        return scale;
    }
    static const uint8_t pick32[64] __attribute__((aligned(64))) = {
        /* bytes 3 of keys 0-31 (0-15 from the first register, 16-31 from
         * the second: index + 64), then bytes 2 */
#define B4(b, e) 4 * (e) + (b), 4 * (e) + 4 + (b), 4 * (e) + 8 + (b), 4 * (e) + 12 + (b)
#define B16(b, e) B4(b, e), B4(b, (e) + 4), B4(b, (e) + 8), B4(b, (e) + 12)
        B16(3, 0), B16(3 + 64, 0), B16(2, 0), B16(2 + 64, 0),
    };
    static const uint8_t pick10[64] __attribute__((aligned(64))) = {
        B16(1, 0), B16(1 + 64, 0), B16(0, 0), B16(0 + 64, 0),
#undef B16
#undef B4
    };
    static const uint16_t pickw[32] __attribute__((aligned(64))) = {
        1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
        33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63,
    };
    static const uint8_t pickb[64] __attribute__((aligned(64))) = {
        0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42,
        44, 46, 48, 50, 52, 54, 56, 58, 60, 62, 64, 66, 68, 70, 72, 74, 76, 78, 80, 82, 84,
        86, 88, 90, 92, 94, 96, 98, 100, 102, 104, 106, 108, 110, 112, 114, 116, 118, 120,
        122, 124, 126,
    };
    qconsts Q = {
        .sv = _mm512_set1_ps(zn_q8_scale_operand(t, scale)), .lo = _mm512_set1_ps(-1.0f),
        .top = _mm512_set1_epi32((int)0x80000000u),
        .one = _mm512_set1_epi8(1), .oddw = _mm512_load_si512(pickw),
        .evenb = _mm512_load_si512(pickb), .onew = _mm512_set1_epi16(1),
        .b6w = _mm512_set1_epi16(64), .idx32 = _mm512_load_si512(pick32),
        .idx10 = _mm512_load_si512(pick10), .divide = t->divide,
    };
    if (t->lin_ok) {
        static const uint8_t pack4[64] __attribute__((aligned(64))) = {
            2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62,
            66, 70, 74, 78, 82, 86, 90, 94, 98, 102, 106, 110, 114, 118, 122, 126,
        };
        const __m512 sc = _mm512_set1_ps(65536.0f);
        static const uint8_t pack2[64] __attribute__((aligned(64))) = {
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
            22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73,
            74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93,
            94, 95,
        };
        lconsts L = {
            .sv = Q.sv,
            .b0 = _mm512_load_ps(t->lin_b), .b1 = _mm512_load_ps(t->lin_b + 16),
            .bn0 = _mm512_load_ps(t->lin_b + 32), .bn1 = _mm512_load_ps(t->lin_b + 48),
            .al0 = _mm512_mul_ps(_mm512_load_ps(t->lin_alpha), sc),
            .al1 = _mm512_mul_ps(_mm512_load_ps(t->lin_alpha + 16), sc),
            .be0 = _mm512_mul_ps(_mm512_load_ps(t->lin_beta), sc),
            .be1 = _mm512_mul_ps(_mm512_load_ps(t->lin_beta + 16), sc),
            .cap0 = _mm512_mul_ps(_mm512_load_ps(t->lin_cap), sc),
            .cap1 = _mm512_mul_ps(_mm512_load_ps(t->lin_cap + 16), sc),
            .dlo0 = _mm512_load_si512(t->lin_dlo), .dlo1 = _mm512_load_si512(t->lin_dlo + 16),
            .absm = _mm512_set1_epi32(0x7fffffff), .lo = _mm512_set1_epi32(96),
            .one = _mm512_set1_epi32(1),
            .sixteen = _mm512_set1_epi32(16),
            .kneg = _mm512_set1_epi32(t->lin_kneg << 16 | 0xffff),
            /* the fraction's bits from 2^-11 up */
            .fracm = _mm512_set1_epi32(0xffe0),
            .pack4 = _mm512_load_si512(pack4), .pack2 = _mm512_load_si512(pack2),
            .divide = t->divide,
        };
        if (t->lin_pos)
            lin_codes(&L, &Q, t, x, q, n, LIN_UNSIGNED);
        else if (t->lin_two_b)
            lin_codes(&L, &Q, t, x, q, n, LIN_TWO_B);
        else
            lin_codes(&L, &Q, t, x, q, n, LIN_SYM);
        return scale;
    }
    size_t i = 0;
    /* two blocks of 64 at once: two independent search chains (0.558-0.577
     * against 0.582-0.586 ns per element one at a time, Zen 4) */
    for (; i + 2 * V <= n; i += 2 * V) {
        __m512i a = search64(&Q, t, x + i, V), b = search64(&Q, t, x + i + V, V);
        _mm512_storeu_si512(q + i, a);
        _mm512_storeu_si512(q + i + V, b);
    }
    for (; i < n; i += V)
        _mm512_mask_storeu_epi8(q + i, mask64(n - i), search64(&Q, t, x + i, n - i));
    return scale;
}

static float vbmi_q8_quant(const float *x, const zn_q8_table *t, uint8_t *q, size_t n)
{
    const __m512i sign = _mm512_set1_epi32(0x7fffffff);
    __m512 mx = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        __m512 a = _mm512_castsi512_ps(_mm512_and_si512(
            _mm512_castps_si512(_mm512_maskz_loadu_ps(mask16(n - i), x + i)), sign));
        mx = _mm512_max_ps(a, mx);   /* a NaN lane keeps mx, as the scalar form */
    }
    return quant_codes(x, t, q, n, _mm512_reduce_max_ps(mx));
}

/* ---- one block fused ------------------------------------------------------
 * The pieces above, and between them the AVX-512 path's Adam formula
 * (optim_avx512.c, vec16: the same operations in the same order, so the
 * same bits; tests/test_adam_q8.c compares the two paths' states), with
 * the moments taken from the dequantize in registers and their absmax
 * kept in registers on the way out: the block's fp32 moments are written
 * to L1 once and read once (by the quantize), where the pieces wrote and
 * read them three times and ran a separate absmax pass. */

#include "optim/optim-avx512-inl.h"

/* ph: p is the bf16 master (zn_adam_step_sr), widened on load and rounded
 * stochastically (sr16) with the bits of indices idx_lo + i; c is NULL. */
static inline __attribute__((always_inline)) void
step_body(const zn_adam_consts *k, void *p, int ph, uint8_t *mq, uint8_t *vq, float *am,
          float *av, const zn_q8_table *ts, const zn_q8_table *tu, const void *g, zn_dtype gt,
          void *c, zn_dtype ct, size_t n, uint32_t k1, uint32_t k2, uint32_t idx_lo)
{
    float mb[ZN_Q8_BLOCK] __attribute__((aligned(64)));
    float vb[ZN_Q8_BLOCK] __attribute__((aligned(64)));
    const __m512 b1 = _mm512_set1_ps(k->b1), omb1 = _mm512_set1_ps(k->omb1);
    const __m512 omb2 = _mm512_set1_ps(k->omb2), step = _mm512_set1_ps(k->step_size);
    const __m512 eps = _mm512_set1_ps(k->eps), gs = _mm512_set1_ps(k->g_scale);
    const __m512 l2 = _mm512_set1_ps(k->l2), decay = _mm512_set1_ps(k->decay);
    const __m512 sam = _mm512_set1_ps(*am), sav = _mm512_set1_ps(*av);
    const __m512i sign = _mm512_set1_epi32(0x7fffffff);
    const __m512i K1 = _mm512_set1_epi32((int)k1), K2 = _mm512_set1_epi32((int)k2);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                           15);
    const int scale = k->g_scale != 1.0f, use_l2 = k->use_l2, use_decay = k->use_decay;
    /* as adam_body with copy_stream set (moments.c sets it) */
    const int nt = zn_optim_nt_copy && c && ((uintptr_t)c & 31) == 0;
    __m512 mxm = _mm512_setzero_ps(), mxv = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += V) {
        __m512 mr[4], vr[4];
        map64(ts, mq + i, n - i, mr);
        map64(tu, vq + i, n - i, vr);
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            size_t at = i + 16 * (size_t)r;
            if (at >= n)
                break;
            __mmask16 mk = mask16(n - at);
            __m512 pv = ph ? load_g(p, ZN_DTYPE_BF16, at, mk)
                           : _mm512_maskz_loadu_ps(mk, (float *)p + at);
            __m512 gv = load_g(g, gt, at, mk);
            __m512 mv = _mm512_mul_ps(mr[r], sam), vv = _mm512_mul_ps(vr[r], sav);
            if (scale)
                gv = _mm512_mul_ps(gv, gs);
            if (use_l2)
                gv = _mm512_fmadd_ps(pv, l2, gv);
            mv = _mm512_fmadd_ps(b1, mv, _mm512_mul_ps(omb1, gv));
            vv = _mm512_fmadd_ps(omb2, _mm512_fmsub_ps(gv, gv, vv), vv);
            __m512 upd = _mm512_div_ps(mv, _mm512_add_ps(_mm512_sqrt_ps(vv), eps));
            if (use_decay) {
                __m512 dp = _mm512_fmadd_ps(pv, decay, _mm512_mul_ps(step, upd));
                pv = _mm512_add_ps(pv, dp);
            } else {
                pv = _mm512_fmadd_ps(step, upd, pv);
            }
            if (ph) {
                __m512i idx = _mm512_add_epi32(
                    _mm512_set1_epi32((int)(idx_lo + (uint32_t)at)), lane);
                _mm256_mask_storeu_epi16((uint16_t *)p + at, mk, sr16(pv, idx, K1, K2));
            } else {
                _mm512_mask_storeu_ps((float *)p + at, mk, pv);
            }
            _mm512_store_ps(mb + at, mv);
            _mm512_store_ps(vb + at, vv);
            /* a NaN lane keeps the maximum, as the scalar form */
            mxm = _mm512_mask_max_ps(mxm, mk, _mm512_castsi512_ps(_mm512_and_si512(
                                                  _mm512_castps_si512(mv), sign)), mxm);
            mxv = _mm512_mask_max_ps(mxv, mk, _mm512_castsi512_ps(_mm512_and_si512(
                                                  _mm512_castps_si512(vv), sign)), mxv);
            if (c) {
                __m256i h = round16(pv, ct);
                if (nt && mk == 0xffff)
                    _mm256_stream_si256((__m256i *)((uint16_t *)c + at), h);
                else
                    _mm256_mask_storeu_epi16((uint16_t *)c + at, mk, h);
            }
        }
    }
    if (nt)
        _mm_sfence();
    *am = quant_codes(mb, ts, mq, n, _mm512_reduce_max_ps(mxm));
    *av = quant_codes(vb, tu, vq, n, _mm512_reduce_max_ps(mxv));
}

static void vbmi_q8_step(const zn_adam_consts *k, float *p, uint8_t *mq, uint8_t *vq, float *am,
                         float *av, const zn_q8_table *ts, const zn_q8_table *tu, const void *g,
                         zn_dtype gt, void *c, zn_dtype ct, size_t n)
{
#define CASE(G, C, CP, A)                                                           \
    if (gt == (G) && (CP) == (c != NULL) && (!(CP) || ct == (C))) {                 \
        step_body(k, p, 0, mq, vq, am, av, ts, tu, g, G, c, C, n, 0, 0, 0);         \
        return;                                                                     \
    }
    ZN_ADAM_DTYPE_CASES(CASE, 0)
#undef CASE
}

static void vbmi_q8_sr_step(const zn_adam_consts *k, uint16_t *p, uint8_t *mq, uint8_t *vq,
                            float *am, float *av, const zn_q8_table *ts, const zn_q8_table *tu,
                            const void *g, zn_dtype gt, size_t n, uint32_t k1, uint32_t k2,
                            uint32_t idx_lo)
{
    if (gt == ZN_DTYPE_F32)
        step_body(k, p, 1, mq, vq, am, av, ts, tu, g, ZN_DTYPE_F32, NULL, ZN_DTYPE_BF16, n, k1,
                  k2, idx_lo);
    else if (gt == ZN_DTYPE_BF16)
        step_body(k, p, 1, mq, vq, am, av, ts, tu, g, ZN_DTYPE_BF16, NULL, ZN_DTYPE_BF16, n, k1,
                  k2, idx_lo);
    else
        step_body(k, p, 1, mq, vq, am, av, ts, tu, g, ZN_DTYPE_F16, NULL, ZN_DTYPE_BF16, n, k1,
                  k2, idx_lo);
}

const zn_q8_dequant_fn zn_q8_dequant_vbmi = vbmi_q8_dequant;
const zn_q8_sr_step_fn zn_q8_sr_step_vbmi = vbmi_q8_sr_step;
const zn_q8_step_fn zn_q8_step_vbmi = vbmi_q8_step;
const zn_q8_quant_fn zn_q8_quant_vbmi = vbmi_q8_quant;
#endif

