/* Private declarations shared by the files of src/model/. */
#ifndef ZN_MODEL_IMPL_H
#define ZN_MODEL_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "zinc/model.h"

/* ---- scalar fp conversions (file I/O; the device layer has its own) -------
 * fp32 -> 16 bit: round to nearest, ties to even; NaN stays a quiet NaN. */
static inline float zn_m_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t zn_m_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float zn_m_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t zn_m_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a >= 0x477ff000u) /* rounds to >= 65520: overflow to Inf */
        return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000u) { /* below 2^-14: subnormal or zero */
        if (a < 0x33000000u) /* below half of the smallest subnormal */
            return sign;
        uint32_t man = (a & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(a >> 23); /* 14..24 */
        uint32_t r = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1);
    return (uint16_t)(sign | (r >> 13));
}

/* ---- reading a checkpoint's tensors (state.c) ---------------------------------------
 * Every parameter tensor `which` selects (all, the decoder's own, or the
 * LoRA adapters) of dims d, named prefix + its Hugging Face name in the
 * safetensors at `path`, checked for presence and shape (the message names
 * the tensor, its file and both shapes), converted to dt and handed to
 * put(ctx, block, tensor index, byte offset in the tensor, data, bytes) in
 * bounded pieces. Unused tensors other than ignorable ones are warned of. */
enum { ZN_M_LOAD_ALL, ZN_M_LOAD_BASE, ZN_M_LOAD_ADAPTERS };
typedef int (*zn_m_put_fn)(void *ctx, int block, int i, uint64_t off, const void *h,
                           size_t bytes);
int zn_m_load_tensors(const zn_model_dims *d, zn_dtype dt, const char *path, const char *prefix,
                      int which, zn_m_put_fn put, void *ctx);

#endif
