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

#endif
