/* fp32 <-> bf16 / fp16 conversion: the out-of-line forms of the scalar
 * rounding in zinc/util.h (which the SIMD kernels match bit for bit), and
 * the array conversion every layer uses (zn_convert). */
#include <errno.h>
#include <omp.h>
#include <string.h>

#include "optim/optim-impl.h"

uint16_t zn_f32_to_bf16(float x) { return zn_bf16_round(x); }
float zn_bf16_to_f32(uint16_t h) { return zn_bf16_widen(h); }
uint16_t zn_f32_to_f16(float x) { return zn_f16_round(x); }
float zn_f16_to_f32(uint16_t h) { return zn_f16_widen(h); }

static void convert_range(void *dst, zn_dtype dt, const void *src, zn_dtype st, size_t lo,
                          size_t hi)
{
    if (dt == st) {
        size_t es = zn_dtype_size(dt);
        if (dst != src)
            memcpy((char *)dst + lo * es, (const char *)src + lo * es, (hi - lo) * es);
        return;
    }
    if (dt == ZN_DTYPE_F32) {
        float *d = dst;
        const uint16_t *s = src;
        if (st == ZN_DTYPE_BF16)
            for (size_t i = lo; i < hi; i++)
                d[i] = zn_bf16_widen(s[i]);
        else
            for (size_t i = lo; i < hi; i++)
                d[i] = zn_f16_widen(s[i]);
        return;
    }
    uint16_t *d = dst;
    if (st == ZN_DTYPE_F32) {
        const float *s = src;
        if (dt == ZN_DTYPE_BF16)
            for (size_t i = lo; i < hi; i++)
                d[i] = zn_bf16_round(s[i]);
        else
            for (size_t i = lo; i < hi; i++)
                d[i] = zn_f16_round(s[i]);
        return;
    }
    /* bf16 <-> f16 goes through the exact fp32 value: one rounding */
    const uint16_t *s = src;
    for (size_t i = lo; i < hi; i++)
        d[i] = zn_round_elem(zn_load_elem(s, st, i), dt);
}

int zn_convert(void *dst, zn_dtype dst_dtype, const void *src, zn_dtype src_dtype, size_t n)
{
    if (!zn_dtype_size(dst_dtype) || !zn_dtype_size(src_dtype))
        return zn_set_error(-EINVAL, "convert: dtype %d -> %d is not f32, bf16 or f16",
                            (int)src_dtype, (int)dst_dtype);
    if (n == 0)
        return 0;
    if (!dst || !src)
        return zn_set_error(-EINVAL, "convert: NULL %s for %zu elements",
                            !dst ? "destination" : "source", n);
    if (dst == src && dst_dtype != src_dtype)
        return zn_set_error(-EINVAL, "convert: in place %s -> %s", zn_dtype_name(src_dtype),
                            zn_dtype_name(dst_dtype));
    int nt = zn_optim_threads(0, n);
    if (nt == 1) {
        convert_range(dst, dst_dtype, src, src_dtype, 0, n);
        return 0;
    }
#pragma omp parallel num_threads(nt)
    {
        size_t lo, hi;
        zn_optim_range(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
        convert_range(dst, dst_dtype, src, src_dtype, lo, hi);
    }
    return 0;
}
