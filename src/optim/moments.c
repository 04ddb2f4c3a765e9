/* Adam moments in fewer bytes (zn_adam_step_mom): bf16 moments and 8-bit
 * blockwise moments, quantized by bitsandbytes' rules or by torchao's (the
 * same storage; other rounding tables, floor and scaling, see zn_q8_table).
 * The step works block by block:
 * a block of ZN_Q8_BLOCK moments is widened (bf16) or dequantized (8-bit)
 * into two fp32 buffers on the stack, the fp32 kernel of the chosen SIMD
 * path steps it exactly as zn_adam_step steps fp32 moments, and the new
 * moments are rounded or quantized back. The buffers stay in L1, so main
 * memory is read and written once: p, g, the compressed moments, the copy.
 * The per-ISA pieces (dequantize, quantize, widen, round) live in the
 * kernel tables of optim_*.c; their scalar forms and the maps live here. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim-impl.h"

/* bitsandbytes' dynamic maps (functional.create_dynamic_map, signed=True
 * and signed=False, max_exponent_bits 7, 8 bits), sorted, as float32 bits.
 * tests/test_adam_q8.c checks them against the maps bitsandbytes made. */
static const float map_signed[256] = {
    -0x1.fc6666p-1f, -0x1.f53334p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f, -0x1.df999ap-1f, -0x1.d86666p-1f,
    -0x1.d13334p-1f, -0x1.cap-1f, -0x1.c2ccccp-1f, -0x1.bb999ap-1f, -0x1.b46666p-1f, -0x1.ad3334p-1f,
    -0x1.a6p-1f, -0x1.9eccccp-1f, -0x1.97999ap-1f, -0x1.906666p-1f, -0x1.893334p-1f, -0x1.82p-1f,
    -0x1.7accccp-1f, -0x1.73999ap-1f, -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56ccccp-1f,
    -0x1.4f999ap-1f, -0x1.486668p-1f, -0x1.413334p-1f, -0x1.3ap-1f, -0x1.32ccccp-1f, -0x1.2b999ap-1f,
    -0x1.246668p-1f, -0x1.1d3334p-1f, -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.079998p-1f, -0x1.006666p-1f,
    -0x1.f26664p-2f, -0x1.e4p-2f, -0x1.d59998p-2f, -0x1.c73334p-2f, -0x1.b8ccccp-2f, -0x1.aa6666p-2f,
    -0x1.9cp-2f, -0x1.8d9998p-2f, -0x1.7f3334p-2f, -0x1.70ccccp-2f, -0x1.626666p-2f, -0x1.54p-2f,
    -0x1.459998p-2f, -0x1.373334p-2f, -0x1.28ccccp-2f, -0x1.1a6668p-2f, -0x1.0cp-2f, -0x1.fb3332p-3f,
    -0x1.de6666p-3f, -0x1.c1999ap-3f, -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3334p-3f, -0x1.4e6666p-3f,
    -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f, -0x1.b66668p-4f, -0x1.93d70ap-4f, -0x1.8851eep-4f,
    -0x1.7ccccep-4f, -0x1.7147aep-4f, -0x1.65c29p-4f, -0x1.5a3d7p-4f, -0x1.4eb854p-4f, -0x1.433334p-4f,
    -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f, -0x1.151ebap-4f, -0x1.09999ap-4f, -0x1.fc28f6p-5f,
    -0x1.e51ebap-5f, -0x1.ce147ap-5f, -0x1.b70a3ep-5f, -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f,
    -0x1.5ae146p-5f, -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c29p-5f, -0x1.fd70a4p-6f, -0x1.cf5c2ap-6f,
    -0x1.a147aep-6f, -0x1.733334p-6f, -0x1.451ebap-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f, -0x1.75c29p-7f,
    -0x1.3e76c8p-7f, -0x1.2c083p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f, -0x1.e978d4p-8f, -0x1.c49ba6p-8f,
    -0x1.9fbe76p-8f, -0x1.7ae148p-8f, -0x1.56041ap-8f, -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f,
    -0x1.851eb8p-9f, -0x1.3b645ap-9f, -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, -0x1.eecbfep-11f, -0x1.b3d07cp-11f,
    -0x1.78d5p-11f, -0x1.3dd982p-11f, -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, -0x1.040bfep-17f, -0x1.b43528p-19f,
    -0x1.27476ep-21f, 0x0p+0f, 0x1.27476ep-21f, 0x1.b43528p-19f, 0x1.040bfep-17f, 0x1.64840cp-16f,
    0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f, 0x1.19ce0ap-12f, 0x1.8fc506p-12f,
    0x1.02de02p-11f, 0x1.3dd982p-11f, 0x1.78d5p-11f, 0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f,
    0x1.e353f8p-10f, 0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f, 0x1.0c49bap-8f, 0x1.3126e8p-8f,
    0x1.56041ap-8f, 0x1.7ae148p-8f, 0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f, 0x1.072b02p-7f,
    0x1.19999ap-7f, 0x1.2c083p-7f, 0x1.3e76c8p-7f, 0x1.75c29p-7f, 0x1.d1eb86p-7f, 0x1.170a3ep-6f,
    0x1.451ebap-6f, 0x1.733334p-6f, 0x1.a147aep-6f, 0x1.cf5c2ap-6f, 0x1.fd70a4p-6f, 0x1.15c29p-5f,
    0x1.2ccccep-5f, 0x1.43d70ap-5f, 0x1.5ae146p-5f, 0x1.71eb86p-5f, 0x1.88f5c2p-5f, 0x1.ap-5f,
    0x1.b70a3ep-5f, 0x1.ce147ap-5f, 0x1.e51ebap-5f, 0x1.fc28f6p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f,
    0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae14p-4f, 0x1.433334p-4f, 0x1.4eb854p-4f, 0x1.5a3d7p-4f,
    0x1.65c29p-4f, 0x1.7147aep-4f, 0x1.7ccccep-4f, 0x1.8851eep-4f, 0x1.93d70ap-4f, 0x1.b66668p-4f,
    0x1.fp-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f, 0x1.6b3334p-3f, 0x1.88p-3f,
    0x1.a4ccccp-3f, 0x1.c1999ap-3f, 0x1.de6666p-3f, 0x1.fb3332p-3f, 0x1.0cp-2f, 0x1.1a6668p-2f,
    0x1.28ccccp-2f, 0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f, 0x1.626666p-2f, 0x1.70ccccp-2f,
    0x1.7f3334p-2f, 0x1.8d9998p-2f, 0x1.9cp-2f, 0x1.aa6666p-2f, 0x1.b8ccccp-2f, 0x1.c73334p-2f,
    0x1.d59998p-2f, 0x1.e4p-2f, 0x1.f26664p-2f, 0x1.006666p-1f, 0x1.079998p-1f, 0x1.0eccccp-1f,
    0x1.16p-1f, 0x1.1d3334p-1f, 0x1.246668p-1f, 0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3ap-1f,
    0x1.413334p-1f, 0x1.486668p-1f, 0x1.4f999ap-1f, 0x1.56ccccp-1f, 0x1.5ep-1f, 0x1.653334p-1f,
    0x1.6c6668p-1f, 0x1.73999ap-1f, 0x1.7accccp-1f, 0x1.82p-1f, 0x1.893334p-1f, 0x1.906666p-1f,
    0x1.97999ap-1f, 0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3334p-1f, 0x1.b46666p-1f, 0x1.bb999ap-1f,
    0x1.c2ccccp-1f, 0x1.cap-1f, 0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df999ap-1f, 0x1.e6ccccp-1f,
    0x1.eep-1f, 0x1.f53334p-1f, 0x1.fc6666p-1f, 0x1p+0f,
};

static const float map_unsigned[256] = {
    0x0p+0f, 0x1.5cf754p-22f, 0x1.a0133p-21f, 0x1.1d367p-19f, 0x1.2599ecp-18f, 0x1.bc98a2p-18f,
    0x1.29cbaap-17f, 0x1.0624dcp-16f, 0x1.c2e34p-16f, 0x1.3fd0dp-15f, 0x1.9e3p-15f, 0x1.fc8f34p-15f,
    0x1.2d7732p-14f, 0x1.5ca6c8p-14f, 0x1.8bd662p-14f, 0x1.0cb296p-13f, 0x1.82a994p-13f, 0x1.f8a092p-13f,
    0x1.374bc8p-12f, 0x1.724744p-12f, 0x1.ad42c6p-12f, 0x1.e83e44p-12f, 0x1.119ce2p-11f, 0x1.2f1aap-11f,
    0x1.4c986p-11f, 0x1.6a162p-11f, 0x1.8793dep-11f, 0x1.a511ap-11f, 0x1.c28f5ep-11f, 0x1.e00d1cp-11f,
    0x1.fd8adcp-11f, 0x1.2b020cp-10f, 0x1.74bc6ap-10f, 0x1.be76c8p-10f, 0x1.041894p-9f, 0x1.28f5c2p-9f,
    0x1.4dd2fp-9f, 0x1.72b02p-9f, 0x1.978d4ep-9f, 0x1.bc6a8p-9f, 0x1.e147aep-9f, 0x1.03126ep-8f,
    0x1.158104p-8f, 0x1.27ef9ep-8f, 0x1.3a5e34p-8f, 0x1.4cccccp-8f, 0x1.5f3b64p-8f, 0x1.71a9fap-8f,
    0x1.841894p-8f, 0x1.96872ap-8f, 0x1.a8f5c2p-8f, 0x1.bb645cp-8f, 0x1.cdd2fp-8f, 0x1.e0418ap-8f,
    0x1.f2b01ep-8f, 0x1.028f5cp-7f, 0x1.0bc6a8p-7f, 0x1.14fdf2p-7f, 0x1.1e354p-7f, 0x1.276c8ap-7f,
    0x1.30a3d6p-7f, 0x1.39db24p-7f, 0x1.43126ep-7f, 0x1.5eb854p-7f, 0x1.8ccccep-7f, 0x1.bae146p-7f,
    0x1.e8f5c4p-7f, 0x1.0b851ep-6f, 0x1.228f5ep-6f, 0x1.39999ap-6f, 0x1.50a3d6p-6f, 0x1.67ae16p-6f,
    0x1.7eb852p-6f, 0x1.95c28ep-6f, 0x1.accccep-6f, 0x1.c3d70ep-6f, 0x1.dae146p-6f, 0x1.f1eb86p-6f,
    0x1.047aep-5f, 0x1.1p-5f, 0x1.1b851ep-5f, 0x1.270a3ep-5f, 0x1.328f5ep-5f, 0x1.3e147ap-5f,
    0x1.49999ap-5f, 0x1.551eb8p-5f, 0x1.60a3d6p-5f, 0x1.6c28f6p-5f, 0x1.77ae14p-5f, 0x1.833334p-5f,
    0x1.8eb85p-5f, 0x1.9a3d7p-5f, 0x1.a5c28ep-5f, 0x1.b147aep-5f, 0x1.bccccep-5f, 0x1.c851eep-5f,
    0x1.d3d70ep-5f, 0x1.df5c2ap-5f, 0x1.eae146p-5f, 0x1.f66666p-5f, 0x1.00f5c4p-4f, 0x1.06b854p-4f,
    0x1.0c7ae2p-4f, 0x1.123d7p-4f, 0x1.18p-4f, 0x1.1dc29p-4f, 0x1.23852p-4f, 0x1.2947aep-4f,
    0x1.2f0a3ep-4f, 0x1.34cccep-4f, 0x1.3a8f5ep-4f, 0x1.4051ecp-4f, 0x1.46147cp-4f, 0x1.4bd70ap-4f,
    0x1.51999ap-4f, 0x1.575c2ap-4f, 0x1.5d1eb8p-4f, 0x1.62e148p-4f, 0x1.68a3d6p-4f, 0x1.6e6666p-4f,
    0x1.7428f6p-4f, 0x1.79eb86p-4f, 0x1.7fae16p-4f, 0x1.8570a4p-4f, 0x1.8b3334p-4f, 0x1.90f5c4p-4f,
    0x1.96b852p-4f, 0x1.a8p-4f, 0x1.c4ccccp-4f, 0x1.e1999ap-4f, 0x1.fe6666p-4f, 0x1.0d9998p-3f,
    0x1.1cp-3f, 0x1.2a6668p-3f, 0x1.38ccccp-3f, 0x1.473334p-3f, 0x1.559998p-3f, 0x1.64p-3f,
    0x1.726668p-3f, 0x1.80ccccp-3f, 0x1.8f3334p-3f, 0x1.9d9998p-3f, 0x1.acp-3f, 0x1.ba6668p-3f,
    0x1.c8ccccp-3f, 0x1.d73334p-3f, 0x1.e59998p-3f, 0x1.f4p-3f, 0x1.013332p-2f, 0x1.086666p-2f,
    0x1.0f999ap-2f, 0x1.16ccccp-2f, 0x1.1ep-2f, 0x1.253334p-2f, 0x1.2c6666p-2f, 0x1.339998p-2f,
    0x1.3accccp-2f, 0x1.42p-2f, 0x1.493334p-2f, 0x1.506666p-2f, 0x1.579998p-2f, 0x1.5eccccp-2f,
    0x1.66p-2f, 0x1.6d3334p-2f, 0x1.746666p-2f, 0x1.7b9998p-2f, 0x1.82ccccp-2f, 0x1.8ap-2f,
    0x1.913334p-2f, 0x1.986666p-2f, 0x1.9f9998p-2f, 0x1.a6ccccp-2f, 0x1.aep-2f, 0x1.b53334p-2f,
    0x1.bc6666p-2f, 0x1.c39998p-2f, 0x1.caccccp-2f, 0x1.d2p-2f, 0x1.d93334p-2f, 0x1.e06666p-2f,
    0x1.e79998p-2f, 0x1.eeccccp-2f, 0x1.f6p-2f, 0x1.fd3332p-2f, 0x1.023334p-1f, 0x1.05ccccp-1f,
    0x1.096666p-1f, 0x1.0dp-1f, 0x1.109998p-1f, 0x1.143334p-1f, 0x1.17ccccp-1f, 0x1.1b6668p-1f,
    0x1.1fp-1f, 0x1.22999ap-1f, 0x1.263334p-1f, 0x1.29ccccp-1f, 0x1.2d6668p-1f, 0x1.31p-1f,
    0x1.34999ap-1f, 0x1.383334p-1f, 0x1.3bccccp-1f, 0x1.3f6668p-1f, 0x1.43p-1f, 0x1.46999ap-1f,
    0x1.4a3334p-1f, 0x1.4dccccp-1f, 0x1.516668p-1f, 0x1.55p-1f, 0x1.58999ap-1f, 0x1.5c3334p-1f,
    0x1.5fccccp-1f, 0x1.636668p-1f, 0x1.67p-1f, 0x1.6a999ap-1f, 0x1.6e3334p-1f, 0x1.71ccccp-1f,
    0x1.756668p-1f, 0x1.79p-1f, 0x1.7c999ap-1f, 0x1.803334p-1f, 0x1.83ccccp-1f, 0x1.876668p-1f,
    0x1.8bp-1f, 0x1.8e9998p-1f, 0x1.923334p-1f, 0x1.95ccccp-1f, 0x1.996668p-1f, 0x1.9dp-1f,
    0x1.a09998p-1f, 0x1.a43334p-1f, 0x1.a7ccccp-1f, 0x1.ab6668p-1f, 0x1.afp-1f, 0x1.b29998p-1f,
    0x1.b63334p-1f, 0x1.b9ccccp-1f, 0x1.bd6668p-1f, 0x1.c1p-1f, 0x1.c49998p-1f, 0x1.c83334p-1f,
    0x1.cbccccp-1f, 0x1.cf6668p-1f, 0x1.d3p-1f, 0x1.d69998p-1f, 0x1.da3334p-1f, 0x1.ddccccp-1f,
    0x1.e16668p-1f, 0x1.e5p-1f, 0x1.e89998p-1f, 0x1.ec3334p-1f, 0x1.efccccp-1f, 0x1.f36668p-1f,
    0x1.f7p-1f, 0x1.fa9998p-1f, 0x1.fe3334p-1f, 0x1p+0f,
};

static zn_q8_table g_q8[2][2];       /* [scheme][0 unsigned, 1 signed] */
static int g_q8_rc;
static pthread_once_t g_q8_once = PTHREAD_ONCE_INIT;

/* torchao's floor under a block's scale (quant_utils.scale_tensor) */
#define AO_SCALE_FLOOR 1e-12f

/* The code of y by the definition: the count of midpoints below it. */
static int code_by_count(const float *mid, float y)
{
    int lo = 0, hi = 255;             /* mid[0..254] sorted; answer in [0, 255] */
    while (lo < hi) {
        int h = (lo + hi) / 2;
        if (mid[h] < y)
            lo = h + 1;
        else
            hi = h;
    }
    return lo;
}

static uint32_t f32_ord(float x)
{
    return zn_q8_ord(x);
}

static float ord_f32(uint32_t o)
{
    return zn_bits_f32(o & 0x80000000u ? o & 0x7fffffffu : ~o);
}

/* torchao's rounding between map entries a < b: x goes up to b when
 * x - a >= (b - a) * 0.5, both sides in float32 (quantize_8bit_with_qmap).
 * x - a never decreases as x grows, so the floats going up are those from
 * one threshold on; returns the largest float below it, so that "x > it"
 * is torchao's decision, the form zn_q8_code uses. */
static float ao_below_threshold(float a, float b)
{
    volatile float half = (b - a) * 0.5f;   /* float32, as torch computes it */
    uint32_t lo = f32_ord(a), hi = f32_ord(b);   /* a: stays down; b: goes up */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        volatile float d = ord_f32(mid) - a;
        if (d >= half)
            hi = mid;
        else
            lo = mid;
    }
    return ord_f32(lo);
}

/* The cell table (zn_q8_code_cell). Each cell's count comes from its
 * lowest float; no cell holds two midpoints (build_table checks the same
 * ranges), so one compare with the midpoint inside, if any, finishes it. */
static int build_cells(zn_q8_table *t)
{
    float least = INFINITY;
    for (int i = 0; i < 255; i++)
        least = fabsf(t->mid[i]) < least ? fabsf(t->mid[i]) : least;
    /* a power of two below every midpoint's magnitude (strictly: the
     * values under it, taken as it, must all count the same midpoints) */
    uint32_t lo = (zn_f32_bits(least) - 1u) & 0x7f800000u;
    /* the vector paths turn a NaN into -1 and need its code to be 0 */
    if (!(t->mid[0] >= -1.0f))
        return zn_set_error(-EINVAL, "q8 map: its first midpoint %a is below -1",
                            (double)t->mid[0]);
    if (!(least > 0.0f) || lo < 0x2f800000u)
        return zn_set_error(-EINVAL, "q8 map: a midpoint at %a, below the cell table's 2^-32",
                            (double)least);
    t->cell_lo = lo;
    t->cell_n = 0x3f80u - (lo >> 16) + 1;
    for (uint32_t neg = 0; neg < 2; neg++) {
        for (uint32_t key = lo >> 16; key <= 0x3f80u; key++) {
            uint32_t top = neg << 31 | key << 16;
            float least_y = zn_bits_f32(neg ? top | 0xffffu : top);
            int base = code_by_count(t->mid, least_y);
            uint32_t t16 = 0xffffu;
            if (base < 255 && (zn_f32_bits(t->mid[base]) >> 16) == (top >> 16))
                t16 = (zn_f32_bits(t->mid[base]) & 0xffffu) ^ (neg ? 0xffffu : 0u);
            t->cell[key - (lo >> 16) + (neg ? t->cell_n : 0)] = (uint32_t)base | t16 << 16;
        }
    }
    return 0;
}

/* The byte planes of the VBMI path (see zn_q8_table). */
static void build_planes(zn_q8_table *t)
{
    for (int c = 0; c < 256; c++) {
        uint32_t mb = zn_f32_bits(t->map[c]), kb = f32_ord(t->mid[c]);
        for (int b = 0; b < 4; b++) {
            t->map_plane[b][c] = (uint8_t)(mb >> 8 * b);
            t->mid_plane[b][c] = (uint8_t)(kb >> 8 * b);
        }
    }
    memset(t->tree16, 0, sizeof t->tree16);
    for (int l = 0; l < 8; l++) {
        int s = 128 >> l;
        for (int j = 0; j < (1 << l); j++) {
            t->tree16[l][j] = (uint16_t)(f32_ord(t->mid[j * 2 * s + s - 1]) >> 16);
        }
    }
    /* the key order is the float order but at +-0 (and NaN, which the
     * search never meets: it is clamped to -1 first) */
    t->vbmi_ok = 1;
    for (int i = 0; i < 255; i++)
        if (t->mid[i] == 0.0f)
            t->vbmi_ok = 0;
}

/* ---- the linear estimate (see zn_q8_table) ------------------------------ */

/* U's margin: flagged within 2 eps above an integer. optim_avx512vbmi.c
 * tests bits 5-15 of 2^16 U, which is 2 eps = 2^-11. */
#define LIN_EPS 0x1p-12f

/* The group of a map entry: 0 for 0, else its decade of |v| counted from
 * the lowest decade (kmin) up, from 1. */
static int lin_group(float v, int kmin)
{
    return v == 0.0f ? 0 : (int)floor(log10(fabs((double)v))) - kmin + 1;
}

/* The boundaries of one side in side order k (k = 0 at |y| = 0): y >= 0
 * has code cz + k, and k + 1 from above bnd[k] on; y < 0 has code cz - k,
 * and k + 1 from |y| >= bnd[k] on. Returns how many. */
static int lin_bounds(const zn_q8_table *t, int neg, int cz, double *bnd)
{
    int nb = 0;
    if (!neg)
        for (int c = cz; c < 255; c++)
            bnd[nb++] = t->mid[c];
    else
        for (int c = cz - 1; c >= 0; c--)
            bnd[nb++] = -(double)t->mid[c];
    return nb;
}

/* One group's alpha, beta and cap (side order), or -1 if the side's codes
 * of group d are not one run. */
static int lin_fit(const zn_q8_table *t, int neg, int cz, int kmin, int d, float out[3])
{
    double bnd[256];
    int nb = lin_bounds(t, neg, cz, bnd), klo = -1, khi = -1;
    for (int k = 0; k <= nb; k++) {
        int g = lin_group(t->map[neg ? cz - k : cz + k], kmin);
        if (g == d) {
            if (khi >= 0 && khi != k - 1)
                return -1;
            klo = klo < 0 ? k : klo;
            khi = k;
        }
    }
    if (klo < 0) {
        /* no code of this side in group d: the side's last k above its
         * groups, its first below them */
        int top = lin_group(t->map[neg ? cz - nb : cz + nb], kmin) < d;
        int k = top ? nb : 0;
        if (!top && lin_group(t->map[cz], kmin) < d)
            return -1;
        out[0] = 0.0f;
        out[1] = out[2] = (float)k + 0.5f;
        return 0;
    }
    int n = khi - klo + 1;
    if (n == 1) {
        out[0] = 0.0f;
        out[1] = out[2] = (float)klo + 0.5f;
        return 0;
    }
    double first = bnd[klo], s;
    if (n >= 3)
        s = (bnd[khi - 1] - bnd[klo]) / (n - 2);
    else
        s = 1.25 * (klo ? bnd[klo] - bnd[klo - 1] : bnd[klo]);
    if (!(s > 0.0))
        return -1;
    out[0] = (float)(1.0 / s);
    out[1] = (float)(klo + 1 - first / s) + LIN_EPS;
    out[2] = (float)khi + 0.5f;
    return 0;
}

/* Whether the estimate at y is right or flagged, in the form that also
 * covers the points between two checked ones: U within [k, k + 1 + 2 eps)
 * of y's side-order k (U is monotone where nothing changes). */
static int lin_holds(const zn_q8_table *t, float y)
{
    if (!isfinite(y) || (y < 0.0f && -y == FLT_MAX))
        return 1;   /* U is NaN: flagged (y < 0 at FLT_MAX takes +Inf) */
    float yc = y < -1.0f ? -1.0f : y > 1.0f ? 1.0f : y;
    int c = code_by_count(t->mid, yc), neg;
    float u = zn_q8_lin_u(t, y, &neg);
    double k = neg ? t->lin_kneg - c : c;
    return u >= k && u < k + 1.0 + 2.0 * LIN_EPS;
}

static int lin_check_at(const zn_q8_table *t, float a)
{
    float up = nextafterf(a, INFINITY), down = a > 0.0f ? nextafterf(a, 0.0f) : a;
    float pts[5] = { a, up, nextafterf(up, INFINITY), down,
                     down > 0.0f ? nextafterf(down, 0.0f) : a };
    for (int i = 0; i < 5; i++)
        if (!lin_holds(t, pts[i]) || !lin_holds(t, -pts[i]))
            return 0;
    return 1;
}

/* The check (see zn_q8_table): every midpoint's magnitude, group boundary
 * and binade edge, with the two floats on either side, both signs; U is
 * monotone between any two of them, where nothing changes. */
static int lin_check(const zn_q8_table *t, const float *gb, int ngb)
{
    for (int c = 0; c < 255; c++)
        if (!lin_check_at(t, fabsf(t->mid[c])))
            return 0;
    for (int j = 0; j < ngb; j++)
        if (!lin_check_at(t, gb[j]))
            return 0;
    for (int e = -31; e <= 1; e++)
        if (!lin_check_at(t, ldexpf(1.0f, e)))
            return 0;
    float ends[] = { 0.0f, 0x1p-149f, FLT_MAX };
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
        if (!lin_check_at(t, ends[i]))
            return 0;
    return 1;
}

/* Whether b lies in binade i of the group test (2^(i - 31) .. 2^(i - 30);
 * the first takes everything below, the last everything above). */
static int in_binade(float b, int i)
{
    return b >= (i ? ldexpf(1.0f, i - 31) : 0.0f) && (i == 31 || b < ldexpf(1.0f, i - 30));
}

static void build_lin(zn_q8_table *t)
{
    t->lin_ok = 0;
    int cz = code_by_count(t->mid, 0.0f), kmin = 0, ng = 0;
    for (int c = 0; c < 256; c++) {
        if (t->map[c] != 0.0f) {
            int k = (int)floor(log10(fabs((double)t->map[c])));
            kmin = k < kmin ? k : kmin;
        }
    }
    for (int c = 0; c < 256; c++) {
        int g = lin_group(t->map[c], kmin);
        ng = g + 1 > ng ? g + 1 : ng;
    }
    if (ng > 16)
        return;
    memset(t->lin_alpha, 0, sizeof t->lin_alpha);
    memset(t->lin_beta, 0, sizeof t->lin_beta);
    memset(t->lin_cap, 0, sizeof t->lin_cap);
    for (int neg = 0; neg < 2; neg++) {
        for (int d = 0; d < ng; d++) {
            float f[3];
            if (lin_fit(t, neg, cz, kmin, d, f))
                return;
            int at = d + 16 * neg;
            t->lin_alpha[at] = f[0];
            /* y >= 0: in codes, not side order */
            t->lin_beta[at] = f[1] + (neg ? 0.0f : (float)cz);
            t->lin_cap[at] = f[2] + (neg ? 0.0f : (float)cz);
        }
    }
    t->lin_kneg = cz;
    t->lin_flag = 2.0f * LIN_EPS;
    t->lin_pos = !(t->map[0] < 0.0f);
    /* the group boundaries (the y >= 0 side's): above gb[d], group d + 1 */
    float gb[32];
    int ngb = 0;
    for (int c = cz; c < 255; c++)
        if (lin_group(t->map[c + 1], kmin) != lin_group(t->map[c], kmin))
            gb[ngb++] = t->mid[c];
    if (ngb != ng - 1)
        return;
    for (int i = 0; i < 32; i++) {
        float lo = i ? ldexpf(1.0f, i - 31) : 0.0f;
        int below = 0, inside = 0;
        float b = INFINITY;
        for (int j = 0; j < ngb; j++) {
            below += gb[j] < lo;
            if (in_binade(gb[j], i)) {
                inside++;
                b = gb[j];
            }
        }
        if (inside > 1)
            return;
        t->lin_dlo[i] = below;
        t->lin_b[i] = b;
    }
    /* y < 0: its own boundaries, in the shifted |y| of zn_q8_lin_u (above
     * bnd there is at or above it before the shift); the same binades */
    int k = 0;
    for (int c = cz; c > 0; c--) {
        if (lin_group(t->map[c - 1], kmin) != lin_group(t->map[c], kmin)) {
            if (k >= ngb)
                return;
            gb[16 + k++] = -t->mid[c - 1];
        }
    }
    t->lin_two_b = 0;
    for (int i = 0; i < 32; i++) {
        float b = t->lin_b[i];
        int j = 0;
        while (j < ngb && gb[j] != b)
            j++;
        if (j < k) {
            /* y < 0 has that boundary too (its groups are the first k + 1) */
            b = gb[16 + j];
            if (!in_binade(b, i))
                return;
        }
        t->lin_b[32 + i] = b;
        t->lin_two_b |= b != t->lin_b[i];
    }
    t->lin_ok = lin_check(t, gb, ngb) && lin_check(t, gb + 16, k);
}

static int build_table(zn_q8_table *t, const float *map, zn_q8_scheme scheme)
{
    memcpy(t->map, map, sizeof t->map);
    for (int i = 0; i < 255; i++)
        t->mid[i] = scheme == ZN_Q8_TORCHAO ? ao_below_threshold(map[i], map[i + 1])
                                            : 0.5f * (map[i] + map[i + 1]);
    t->mid[255] = INFINITY;
    t->divide = scheme == ZN_Q8_TORCHAO;
    t->floor = scheme == ZN_Q8_TORCHAO ? AO_SCALE_FLOOR : 0.0f;
    for (uint32_t key = 0; key < 65536; key++) {
        /* the floats whose top 16 bits are `key`: lowest and highest value */
        uint32_t a = key << 16, b = a | 0xffffu;
        float lo = zn_bits_f32((key & 0x8000u) ? b : a);
        float hi = zn_bits_f32((key & 0x8000u) ? a : b);
        if (isnan(lo) || isnan(hi)) {
            t->key[key] = 0;
            continue;
        }
        int c0 = code_by_count(t->mid, lo), c1 = code_by_count(t->mid, hi);
        /* the midpoints in [lo, hi]: those below hi not below lo, and one
         * at hi itself */
        int inside = c1 - c0 + (c1 < 255 && t->mid[c1] == hi);
        if (inside > 1)
            return zn_set_error(-EINVAL, "q8 map: %d midpoints between %a and %a", inside,
                                (double)lo, (double)hi);
        t->key[key] = (uint8_t)c0;
    }
    build_planes(t);
    build_lin(t);
    return build_cells(t);
}

static void build_tables(void)
{
    for (int sc = 0; sc < 2 && !g_q8_rc; sc++) {
        g_q8_rc = build_table(&g_q8[sc][0], map_unsigned, (zn_q8_scheme)sc);
        if (!g_q8_rc)
            g_q8_rc = build_table(&g_q8[sc][1], map_signed, (zn_q8_scheme)sc);
    }
}

const zn_q8_table *zn_q8_table_get(zn_q8_scheme scheme, int is_signed)
{
    if (scheme != ZN_Q8_BNB && scheme != ZN_Q8_TORCHAO) {
        zn_set_error(-EINVAL, "q8: scheme %d is neither bitsandbytes' nor torchao's", (int)scheme);
        return NULL;
    }
    pthread_once(&g_q8_once, build_tables);
    if (g_q8_rc) {
        zn_set_error(g_q8_rc, "q8 maps: a rounding table could not be built");
        return NULL;
    }
    return &g_q8[scheme][is_signed ? 1 : 0];
}

const float *zn_q8_map(int is_signed)
{
    return is_signed ? map_signed : map_unsigned;
}

size_t zn_mom_bytes(zn_mom_fmt fmt, size_t n)
{
    switch (fmt) {
    case ZN_MOM_F32: return 8 * n;
    case ZN_MOM_BF16: return 4 * n;
    case ZN_MOM_Q8: return 2 * n + 8 * zn_q8_blocks(n);
    }
    return 0;
}

static size_t elem_bytes(zn_mom_fmt fmt)
{
    return fmt == ZN_MOM_F32 ? 4 : fmt == ZN_MOM_BF16 ? 2 : 1;
}

size_t zn_mom_layout_absmax_at(zn_mom_fmt fmt, size_t n)
{
    return fmt == ZN_MOM_F32 ? n * 4 : (n * elem_bytes(fmt) + 63) / 64 * 64;
}

size_t zn_mom_layout_bytes(zn_mom_fmt fmt, size_t n)
{
    return zn_mom_layout_absmax_at(fmt, n) + (fmt == ZN_MOM_Q8 ? zn_q8_blocks(n) * 4 : 0);
}

zn_moments zn_mom_layout_at(zn_mom_fmt fmt, void *m, void *v, size_t n, size_t off)
{
    size_t eb = elem_bytes(fmt);
    zn_moments r = zn_moments_of(fmt, (char *)m + off * eb, (char *)v + off * eb, NULL, NULL,
                     ZN_Q8_BNB);
    if (fmt == ZN_MOM_Q8) {
        size_t at = zn_mom_layout_absmax_at(fmt, n);
        r.m_absmax = (float *)((char *)m + at) + off / ZN_Q8_BLOCK;
        r.v_absmax = (float *)((char *)v + at) + off / ZN_Q8_BLOCK;
    }
    return r;
}

int zn_mom_fmt_parse(const char *name)
{
    for (int f = ZN_MOM_F32; f <= ZN_MOM_Q8; f++)
        if (name && !strcmp(name, zn_mom_fmt_name((zn_mom_fmt)f)))
            return f;
    return -1;
}

const char *zn_mom_fmt_name(zn_mom_fmt fmt)
{
    switch (fmt) {
    case ZN_MOM_F32: return "fp32";
    case ZN_MOM_BF16: return "bf16";
    case ZN_MOM_Q8: return "int8";
    }
    return "?";
}

/* ---- scalar forms -------------------------------------------------------- */

void zn_q8_dequant_scalar(const uint8_t *q, const zn_q8_table *t, float absmax, float *out,
                          size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = t->map[q[i]] * absmax;
}

float zn_q8_quant_scalar(const float *x, const zn_q8_table *t, uint8_t *q, size_t n)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    float scale = zn_q8_scale(t, amax);
    if (scale == 0.0f) {
        memset(q, 0, n);
        return scale;
    }
    float sv = zn_q8_scale_operand(t, scale);
    for (size_t i = 0; i < n; i++)
        q[i] = zn_q8_scaled_code(t, x[i], sv);
    return scale;
}

void zn_bf16_widen_scalar(const uint16_t *h, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = zn_bf16_widen(h[i]);
}

void zn_bf16_round_scalar(const float *x, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = zn_bf16_round(x[i]);
}

void zn_rmw_mom_scalar(void *p, int pb, void *m, void *v, int mb, float *am, float *av,
                       const void *g, zn_dtype gt, void *c, size_t n)
{
    size_t gs = zn_dtype_size(gt);
    for (size_t i = 0; i < n; i++) {
        uint32_t pv = 0, gv = 0, mv = 0, vv = 0;
        memcpy(&pv, (char *)p + i * (size_t)pb, (size_t)pb);
        memcpy(&gv, (const char *)g + i * gs, gs);
        memcpy(&mv, (char *)m + i * (size_t)mb, (size_t)mb);
        memcpy(&vv, (char *)v + i * (size_t)mb, (size_t)mb);
        /* opaque to the compiler: the loads and stores must happen */
        __asm__ volatile("" : "+r"(pv), "+r"(gv), "+r"(mv), "+r"(vv) : : "memory");
        memcpy((char *)p + i * (size_t)pb, &pv, (size_t)pb);
        memcpy((char *)m + i * (size_t)mb, &mv, (size_t)mb);
        memcpy((char *)v + i * (size_t)mb, &vv, (size_t)mb);
        if (c)
            ((uint16_t *)c)[i] = (uint16_t)pv;
    }
    if (mb == 1 && am && av) {
        for (size_t b = 0; b < zn_q8_blocks(n); b++) {
            float x = am[b], y = av[b];
            __asm__ volatile("" : "+r"(x), "+r"(y) : : "memory");
            am[b] = x;
            av[b] = y;
        }
    }
}

/* ---- the step ------------------------------------------------------------ */

typedef struct {
    const zn_optim_ops *ops;
    const zn_adam_consts *k;
    const zn_q8_table *ts, *tu;
    const zn_moments *mv;   /* (its fp32 blocks) */
    zn_mom_fmt fmt;
    float *p;
    void *m, *v;
    float *am, *av;
    const char *g;
    size_t gs;
    zn_dtype gt;
    char *c;
    zn_dtype ct;
} mom_job;

/* Elements [lo, hi) (lo on a block boundary), block by block. */
void zn_optim_by_blocks(int nt, size_t n, zn_range_fn range, const void *arg)
{
    if (nt <= 1) {
        range(arg, 0, n);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        /* whole blocks per thread: a block's absmax is one thread's, and
         * no element's result depends on the split */
        size_t nb = zn_q8_blocks(n);
        int t = omp_get_thread_num(), team = omp_get_num_threads();
        size_t b0 = nb * (size_t)t / (size_t)team, b1 = nb * (size_t)(t + 1) / (size_t)team;
        size_t lo = b0 * ZN_Q8_BLOCK, hi = b1 * ZN_Q8_BLOCK < n ? b1 * ZN_Q8_BLOCK : n;
        if (hi > lo)
            range(arg, lo, hi);
    }
}

static void mom_range(const mom_job *j, size_t lo, size_t hi)
{
    float mb[ZN_Q8_BLOCK] __attribute__((aligned(64)));
    float vb[ZN_Q8_BLOCK] __attribute__((aligned(64)));
    const zn_optim_ops *o = j->ops;
    if (j->fmt == ZN_MOM_BF16 && o->adam_bf16) {
        /* elementwise: the whole range in one pass */
        o->adam_bf16(j->k, j->p + lo, (uint16_t *)j->m + lo, (uint16_t *)j->v + lo,
                     j->g + lo * j->gs, j->gt, j->c ? j->c + lo * 2 : NULL, j->ct, hi - lo);
        return;
    }
    for (size_t i = lo; i < hi; i += ZN_Q8_BLOCK) {
        size_t len = hi - i < ZN_Q8_BLOCK ? hi - i : ZN_Q8_BLOCK;
        size_t b = i / ZN_Q8_BLOCK;
        char *c = j->c ? j->c + i * 2 : NULL;
        int64_t f = j->fmt == ZN_MOM_Q8 ? zn_q8_f32_slot(j->mv, b) : -1;
        if (f >= 0) {
            /* a block kept in fp32: the fp32 step */
            size_t at = (size_t)f * ZN_Q8_BLOCK;
            o->adam(j->k, j->p + i, j->mv->m_f32 + at, j->mv->v_f32 + at, j->g + i * j->gs,
                    j->gt, c, j->ct, len);
        } else if (j->fmt == ZN_MOM_Q8 && o->q8_step) {
            o->q8_step(j->k, j->p + i, (uint8_t *)j->m + i, (uint8_t *)j->v + i, &j->am[b],
                       &j->av[b], j->ts, j->tu, j->g + i * j->gs, j->gt, c, j->ct, len);
        } else if (j->fmt == ZN_MOM_Q8) {
            uint8_t *mq = (uint8_t *)j->m + i, *vq = (uint8_t *)j->v + i;
            o->q8_dequant(mq, j->ts, j->am[b], mb, len);
            o->q8_dequant(vq, j->tu, j->av[b], vb, len);
            o->adam(j->k, j->p + i, mb, vb, j->g + i * j->gs, j->gt, c, j->ct, len);
            j->am[b] = o->q8_quant(mb, j->ts, mq, len);
            j->av[b] = o->q8_quant(vb, j->tu, vq, len);
        } else {
            uint16_t *mh = (uint16_t *)j->m + i, *vh = (uint16_t *)j->v + i;
            o->bf16_widen(mh, mb, len);
            o->bf16_widen(vh, vb, len);
            o->adam(j->k, j->p + i, mb, vb, j->g + i * j->gs, j->gt, c, j->ct, len);
            o->bf16_round(mb, mh, len);
            o->bf16_round(vb, vh, len);
        }
    }
}

/* as zn_optim_by_blocks calls it */
static void mom_range_of(const void *arg, size_t lo, size_t hi)
{
    mom_range(arg, lo, hi);
}

/* torchao's step constants: its bias corrections are float32 powers of
 * the float32 betas (beta ** step with step a float32 tensor); the rest as
 * zn_adam_prepare. */
static void ao_bias_corrections(const zn_adam_params *hp, zn_adam_consts *k)
{
    float t = (float)hp->step;
    float bc1 = 1.0f - powf((float)hp->beta1, t), bc2 = 1.0f - powf((float)hp->beta2, t);
    k->step_size = (float)(-(double)hp->lr * sqrt((double)bc2) / (double)bc1);
    k->eps = (float)((double)hp->eps * sqrt((double)bc2));
}

int zn_q8_f32_check(const zn_moments *mv, size_t n)
{
    if (!mv->n_f32)
        return 0;
    if (mv->fmt != ZN_MOM_Q8)
        return zn_set_error(-EINVAL, "adam: fp32 blocks in %s moments (8-bit ones only)",
                            zn_mom_fmt_name(mv->fmt));
    if (!mv->f32 || (n && (!mv->m_f32 || !mv->v_f32)))
        return zn_set_error(-EINVAL, "adam: fp32 blocks without their runs or arrays");
    for (size_t r = 0; r < mv->n_f32; r++) {
        const zn_q8_f32_run *x = &mv->f32[r];
        if (!x->n || x->block + x->n < x->block)
            return zn_set_error(-EINVAL, "adam: fp32 block run %zu is empty or wraps", r);
        if (r && x->block < mv->f32[r - 1].block + mv->f32[r - 1].n)
            return zn_set_error(-EINVAL, "adam: fp32 block runs %zu and %zu overlap or are out "
                                "of order", r - 1, r);
    }
    return 0;
}

int zn_adam_step_mom_with(const zn_optim_ops *ops, const zn_adam_params *hp, float *p,
                          const zn_moments *mv, const void *g, zn_dtype g_dtype, float g_scale,
                          void *c, zn_dtype c_dtype, size_t n)
{
    if (!mv)
        return zn_set_error(-EINVAL, "adam: NULL moments");
    if (mv->fmt == ZN_MOM_F32)
        return zn_adam_step_with(ops->adam, hp, p, mv->m, mv->v, g, g_dtype, g_scale, c,
                                 c_dtype, n);
    if (mv->fmt != ZN_MOM_BF16 && mv->fmt != ZN_MOM_Q8)
        return zn_set_error(-EINVAL, "adam: moment format %d is not fp32, bf16 or int8",
                            (int)mv->fmt);
    /* the fp32 checks, with m and v standing for the fp32 arrays */
    zn_adam_consts k;
    int rc = zn_adam_prepare(hp, p, mv->m, mv->v, g, g_dtype, g_scale, c, c_dtype, n, &k);
    if (rc < 0 || n == 0)
        return rc;
    if (mv->fmt == ZN_MOM_Q8 && (!mv->m_absmax || !mv->v_absmax))
        return zn_set_error(-EINVAL, "adam: int8 moments without their absmax arrays");
    if ((rc = zn_q8_f32_check(mv, n)))
        return rc;
    if (mv->fmt == ZN_MOM_Q8 && mv->scheme == ZN_Q8_TORCHAO && hp->bias_correction)
        ao_bias_corrections(hp, &k);
    k.copy_stream = 1;
    mom_job j = {
        .ops = ops, .k = &k, .mv = mv, .fmt = mv->fmt, .p = p, .m = mv->m, .v = mv->v,
        .am = mv->m_absmax, .av = mv->v_absmax, .g = g, .gs = zn_dtype_size(g_dtype),
        .gt = g_dtype, .c = c, .ct = c_dtype,
    };
    if (mv->fmt == ZN_MOM_Q8 && (!(j.ts = zn_q8_table_get(mv->scheme, 1)) ||
                                 !(j.tu = zn_q8_table_get(mv->scheme, 0))))
        return -EINVAL;
    zn_optim_by_blocks(zn_optim_threads(hp->threads, n), n, mom_range_of, &j);
    return 0;
}

int zn_q8_rounding_get(zn_q8_scheme scheme, int is_signed, zn_q8_rounding *r)
{
    const zn_q8_table *t = zn_q8_table_get(scheme, is_signed);
    if (!t)
        return -EINVAL;
    memcpy(r->map, t->map, sizeof r->map);
    memcpy(r->mid, t->mid, sizeof r->mid);
    r->floor = t->floor;
    r->divide = t->divide;
    return 0;
}

int zn_adam_prepare_mom(const zn_adam_params *hp, float *p, const zn_moments *mv, const void *g,
                        zn_dtype g_dtype, float g_scale, void *c, zn_dtype c_dtype, size_t n,
                        zn_adam_consts *k)
{
    if (!mv)
        return zn_set_error(-EINVAL, "adam: NULL moments");
    if (mv->fmt != ZN_MOM_F32 && mv->fmt != ZN_MOM_BF16 && mv->fmt != ZN_MOM_Q8)
        return zn_set_error(-EINVAL, "adam: moment format %d is not fp32, bf16 or int8",
                            (int)mv->fmt);
    int rc = zn_adam_prepare(hp, p, mv->m, mv->v, g, g_dtype, g_scale, c, c_dtype, n, k);
    if (rc < 0 || (rc = zn_q8_f32_check(mv, n)) || mv->fmt != ZN_MOM_Q8)
        return rc;
    if (!mv->m_absmax || !mv->v_absmax)
        return zn_set_error(-EINVAL, "adam: int8 moments without their absmax arrays");
    if (mv->scheme != ZN_Q8_BNB && mv->scheme != ZN_Q8_TORCHAO)
        return zn_set_error(-EINVAL, "q8: scheme %d is neither bitsandbytes' nor torchao's",
                            (int)mv->scheme);
    if (mv->scheme == ZN_Q8_TORCHAO && hp->bias_correction)
        ao_bias_corrections(hp, k);
    return 0;
}

int zn_adam_step_mom(const zn_adam_params *hp, float *p, const zn_moments *mv, const void *g,
                     zn_dtype g_dtype, float g_scale, void *p16_out, zn_dtype p16_dtype, size_t n)
{
    return zn_adam_step_mom_with(zn_optim_get_ops(ZN_ISA_AUTO), hp, p, mv, g, g_dtype, g_scale,
                                 p16_out, p16_dtype, n);
}

/* ---- format conversion --------------------------------------------------- */

static int mom_ok(const zn_moments *x, size_t n, const char *which)
{
    if (!x || x->fmt < ZN_MOM_F32 || x->fmt > ZN_MOM_Q8)
        return zn_set_error(-EINVAL, "zn_mom_convert: bad %s moments", which);
    if (n && (!x->m || !x->v || (x->fmt == ZN_MOM_Q8 && (!x->m_absmax || !x->v_absmax))))
        return zn_set_error(-EINVAL, "zn_mom_convert: %s moments lack an array", which);
    return zn_q8_f32_check(x, n);
}

int zn_mom_convert(const zn_moments *dst, const zn_moments *src, size_t n)
{
    int rc;
    if ((rc = mom_ok(dst, n, "destination")) || (rc = mom_ok(src, n, "source")))
        return rc;
    size_t nb = zn_q8_blocks(n);
    if (n == 0)
        return 0;
    if (dst->fmt == src->fmt && !dst->n_f32 && !src->n_f32) {
        size_t eb = elem_bytes(dst->fmt);
        memcpy(dst->m, src->m, n * eb);
        memcpy(dst->v, src->v, n * eb);
        if (dst->fmt == ZN_MOM_Q8) {
            memcpy(dst->m_absmax, src->m_absmax, nb * 4);
            memcpy(dst->v_absmax, src->v_absmax, nb * 4);
        }
        return 0;
    }
    const zn_optim_ops *o = zn_optim_get_ops(ZN_ISA_AUTO);
    zn_q8_scheme dq = dst->fmt == ZN_MOM_Q8 ? dst->scheme : src->scheme;
    const zn_q8_table *ts = zn_q8_table_get(dq, 1), *tu = zn_q8_table_get(dq, 0);
    if (!ts || !tu)
        return -EINVAL;
    int nthr = zn_optim_threads(0, n);
#pragma omp parallel for num_threads(nthr) schedule(static)
    for (size_t b = 0; b < nb; b++) {
        float mb[ZN_Q8_BLOCK], vb[ZN_Q8_BLOCK];
        size_t i = b * ZN_Q8_BLOCK, len = n - i < ZN_Q8_BLOCK ? n - i : ZN_Q8_BLOCK;
        int64_t fs = src->fmt == ZN_MOM_Q8 ? zn_q8_f32_slot(src, b) : -1;
        int64_t fd = dst->fmt == ZN_MOM_Q8 ? zn_q8_f32_slot(dst, b) : -1;
        if (fs < 0 && fd < 0 && src->fmt == ZN_MOM_Q8 && dst->fmt == ZN_MOM_Q8) {
            /* 8-bit both sides: as stored (the schemes share the storage) */
            memcpy((uint8_t *)dst->m + i, (const uint8_t *)src->m + i, len);
            memcpy((uint8_t *)dst->v + i, (const uint8_t *)src->v + i, len);
            dst->m_absmax[b] = src->m_absmax[b];
            dst->v_absmax[b] = src->v_absmax[b];
            continue;
        }
        if (fs >= 0) {
            memcpy(mb, src->m_f32 + fs * ZN_Q8_BLOCK, len * 4);
            memcpy(vb, src->v_f32 + fs * ZN_Q8_BLOCK, len * 4);
        } else if (src->fmt == ZN_MOM_F32) {
            memcpy(mb, (const float *)src->m + i, len * 4);
            memcpy(vb, (const float *)src->v + i, len * 4);
        } else if (src->fmt == ZN_MOM_BF16) {
            o->bf16_widen((const uint16_t *)src->m + i, mb, len);
            o->bf16_widen((const uint16_t *)src->v + i, vb, len);
        } else {
            o->q8_dequant((const uint8_t *)src->m + i, ts, src->m_absmax[b], mb, len);
            o->q8_dequant((const uint8_t *)src->v + i, tu, src->v_absmax[b], vb, len);
        }
        if (fd >= 0) {
            memcpy(dst->m_f32 + fd * ZN_Q8_BLOCK, mb, len * 4);
            memcpy(dst->v_f32 + fd * ZN_Q8_BLOCK, vb, len * 4);
        } else if (dst->fmt == ZN_MOM_F32) {
            memcpy((float *)dst->m + i, mb, len * 4);
            memcpy((float *)dst->v + i, vb, len * 4);
        } else if (dst->fmt == ZN_MOM_BF16) {
            o->bf16_round(mb, (uint16_t *)dst->m + i, len);
            o->bf16_round(vb, (uint16_t *)dst->v + i, len);
        } else {
            dst->m_absmax[b] = o->q8_quant(mb, ts, (uint8_t *)dst->m + i, len);
            dst->v_absmax[b] = o->q8_quant(vb, tu, (uint8_t *)dst->v + i, len);
        }
    }
    return 0;
}
