/* Lane helpers shared by the AVX-512 kernels (optim_avx512.c) and the
 * VBMI ones (optim_avx512vbmi.c), so both load gradients and round the
 * 16-bit copy by the same code: included by each after its target pragma
 * and <immintrin.h> (or, for tests/test_adam_avx512emu.c, after the
 * intrinsics are defined in plain C). */
#ifndef ZN_OPTIM_AVX512_INL_H
#define ZN_OPTIM_AVX512_INL_H

/* 16 gradients of dtype gt from g[i], lanes outside k zero */
static inline __m512 load_g(const void *g, zn_dtype gt, size_t i, __mmask16 k)
{
    if (gt == ZN_DTYPE_F32)
        return _mm512_maskz_loadu_ps(k, (const float *)g + i);
    __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)g + i);
    if (gt == ZN_DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

static inline __m256i round16(__m512 x, zn_dtype ct)
{
    if (ct == ZN_DTYPE_F16)
        return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512i u = _mm512_castps_si512(x);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)),
                                                     _mm512_set1_epi32(0x7fff)));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 isnan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, isnan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);   /* values < 2^16: truncation is exact */
}

/* zn_lowbias32 on 16 lanes */
static inline __m512i lowbias16(__m512i x)
{
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)0x846ca68bu));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

/* zn_bf16_round_sr of 16 lanes with the bits zn_sr_hash(k1, k2, idx) */
static inline __m256i sr16(__m512 x, __m512i idx, __m512i K1, __m512i K2)
{
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), maxf = _mm512_set1_epi32(0x7f7fffff);
    const __m512i inf = _mm512_set1_epi32(0x7f800000), top = _mm512_set1_epi32(0x7f7f);
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_srli_epi32(
        lowbias16(_mm512_add_epi32(lowbias16(_mm512_xor_si512(idx, K1)), K2)), 16);
    __m512i a = _mm512_and_si512(u, absm);
    /* magnitudes are below 2^31: the signed min is the unsigned one */
    __m512i t = _mm512_min_epi32(_mm512_srli_epi32(_mm512_add_epi32(a, r), 16), top);
    __mmask16 nonfin = _mm512_cmp_epi32_mask(a, maxf, _MM_CMPINT_GT);
    __mmask16 isnan = _mm512_cmp_epi32_mask(a, inf, _MM_CMPINT_GT);
    __m512i ahi = _mm512_srli_epi32(a, 16);
    t = _mm512_mask_mov_epi32(t, nonfin, ahi);
    t = _mm512_mask_or_epi32(t, isnan, ahi, _mm512_set1_epi32(0x40));
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000));
    return _mm512_cvtepi32_epi16(_mm512_or_si512(t, sign));
}

#endif
