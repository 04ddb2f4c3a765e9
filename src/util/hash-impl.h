/* Counter-based hashing shared by the host, the CUDA kernels and the
 * trainer: a mask drawn from (key, index) needs no state, so a kernel can
 * regenerate it in the backward pass and any thread can draw any element.
 * Mixer: the splitmix64 finalizer (Steele, Lea, Flood 2014), a bijection on
 * 64-bit words whose output passes BigCrush as a counter-mode generator.
 * scripts/gen_lora_fixtures.py reimplements these lines in numpy. */
#ifndef ZN_UTIL_HASH_IMPL_H
#define ZN_UTIL_HASH_IMPL_H

#include <stdint.h>

#if defined(__CUDACC__)
#define ZN_HD __host__ __device__ __forceinline__
#else
#define ZN_HD static inline
#endif

#define ZN_GOLDEN64 0x9E3779B97F4A7C15ull

ZN_HD uint64_t zn_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The i-th draw of the stream `key`, as 24 uniform bits. */
ZN_HD uint32_t zn_draw24(uint64_t key, uint64_t i)
{
    return (uint32_t)(zn_mix64(key + (i + 1) * ZN_GOLDEN64) >> 40);
}

/* Dropout's keep threshold: element i of stream key is kept when
 * zn_draw24(key, i) >= zn_drop_threshold(p), so with probability 1 - p
 * (to 2^-24). */
ZN_HD uint32_t zn_drop_threshold(double p)
{
    return (uint32_t)(p * 16777216.0 + 0.5);
}

/* ---- stochastic rounding to bf16 (zn_adam_step_sr, and the device's
 * step) ------------------------------------------------------------------
 * Chris Wellons' lowbias32 (an integer hash with low avalanche bias, from
 * his hash-prospector search): 32-bit multiplies only, which AVX2 and
 * AVX-512F both have per lane (64-bit multiplies need AVX-512DQ). */
ZN_HD uint32_t zn_lowbias32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* The 16 random bits of the element whose index has low word idx_lo, in a
 * call keyed by (k1, k2) (zn_sr_key: seed, step, the index's high word).
 * Two rounds keyed differently, so that steps are not shifts of one
 * sequence. The top 16 bits: the final xor-shift leaves them the best
 * mixed. */
ZN_HD uint32_t zn_sr_hash(uint32_t k1, uint32_t k2, uint32_t idx_lo)
{
    return zn_lowbias32(zn_lowbias32(idx_lo ^ k1) + k2) >> 16;
}

/* splitmix64 (its increment, then the finalizer) */
ZN_HD uint64_t zn_splitmix64(uint64_t x)
{
    return zn_mix64(x + ZN_GOLDEN64);
}

ZN_HD void zn_sr_key(uint64_t seed, int64_t step, uint32_t idx_hi, uint32_t *k1, uint32_t *k2)
{
    uint64_t k = zn_splitmix64(zn_splitmix64(zn_splitmix64(seed) ^ (uint64_t)step) ^ idx_hi);
    *k1 = (uint32_t)k;
    *k2 = (uint32_t)(k >> 32);
}

/* The float with bits u to bf16 adding r16 to its low half (the rules of
 * zn_adam_step_sr): on the magnitude, so a negative value rounds away from
 * zero with the same probability; a finite value saturates at the largest
 * finite bf16; NaN and Inf as zn_bf16_round. */
ZN_HD uint16_t zn_bf16_round_sr_bits(uint32_t u, uint32_t r16)
{
    uint32_t a = u & 0x7fffffffu, sign = (u >> 16) & 0x8000u;
    if (a > 0x7f7fffffu)
        return (uint16_t)(sign | (a >> 16) | (a > 0x7f800000u ? 0x0040u : 0u));
    uint32_t t = (a + r16) >> 16;
    return (uint16_t)(sign | (t < 0x7f7fu ? t : 0x7f7fu));
}

#endif
