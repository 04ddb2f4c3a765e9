/* The benchmark's "plain scalar loop": the same element formula as the
 * portable path, built with vectorisation off (-fno-tree-vectorize
 * -fno-tree-slp-vectorize, by the pragma below) so that `zinc bench adam` shows
 * what the SIMD paths gain. Not used by zn_adam_step. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-vectorize", "no-tree-slp-vectorize")
#endif
#include "optim/optim-impl.h"

void zn_adam_plain_kernel(const zn_adam_consts *k, float *p, float *m, float *v, const void *g,
                          zn_dtype g_dtype, void *c, zn_dtype c_dtype, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        zn_adam_elem(k, &p[i], &m[i], &v[i], zn_load_elem(g, g_dtype, i));
        if (c)
            ((uint16_t *)c)[i] = zn_round_elem(p[i], c_dtype);
    }
}
