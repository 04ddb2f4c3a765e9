/* The AVX-512 kernels of the CPU optimizer run on intrinsics written here in
 * plain C, so that a machine without AVX-512 still executes their masks,
 * tails, conversions and lane order. They follow the AVX2
 * kernels' operation order exactly, so every output must match the AVX2
 * path bit for bit (the AVX2 path is checked against a double reference by
 * test_adam). On a CPU with AVX-512, test_adam runs the real instructions. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zt.h"

#include "zinc/optim.h"
#include "optim/optim-impl.h"

#if ZN_OPTIM_X86
#define HAVE_EMU 1
#define ZN_OPTIM_AVX512_EMULATE 1

/* ---- the intrinsics optim_avx512.c uses, in plain C ----------------------
 * Each is written from the instruction's definition, lane by lane. Vector
 * types are unions (no compiler vector types, so no AVX state and no ABI
 * questions); casts are then plain copies. FMAs are fmaf()/fma(): one
 * rounding, as the instruction. The fp16 conversions use zinc's scalar
 * rounding, which test_half checks against vcvtps2ph/vcvtph2ps on every
 * input. Masked loads read only the selected lanes (the hardware's do not
 * fault on the others), masked stores write only those. */
typedef union { float f[16]; double d[8]; uint32_t u[16]; uint16_t h[32]; } zn_v512;
typedef union { float f[8]; double d[4]; uint32_t u[8]; uint16_t h[16]; } zn_v256;
typedef union { float f[4]; double d[2]; uint8_t b[16]; } zn_v128;
typedef zn_v512 __m512, __m512i, __m512d;
typedef zn_v256 __m256, __m256i, __m256d;
typedef zn_v128 __m128d, __m128i;
typedef uint16_t __mmask16;
#define _MM_FROUND_TO_NEAREST_INT 0
#define _MM_FROUND_NO_EXC 8
#define _CMP_UNORD_Q 3
#define _CMP_GT_OQ 30

#define LANES(k) for (int j = 0; j < (k); j++)
static inline zn_v512 _mm512_set1_ps(float x) { zn_v512 r; LANES(16) r.f[j] = x; return r; }
static inline zn_v512 _mm512_set1_epi32(int x) { zn_v512 r; LANES(16) r.u[j] = (uint32_t)x; return r; }
static inline zn_v512 _mm512_setzero_pd(void) { zn_v512 r; LANES(8) r.d[j] = 0; return r; }
static inline zn_v512 _mm512_castsi512_ps(zn_v512 a) { return a; }
static inline zn_v512 _mm512_castps_si512(zn_v512 a) { return a; }
static inline zn_v512 _mm512_castps_pd(zn_v512 a) { return a; }
static inline zn_v256 _mm256_castpd_ps(zn_v256 a) { return a; }
static inline zn_v256 _mm512_castps512_ps256(zn_v512 a)
{ zn_v256 r; memcpy(&r, &a, 32); return r; }
static inline zn_v256 _mm512_castpd512_pd256(zn_v512 a)
{ zn_v256 r; memcpy(&r, &a, 32); return r; }
static inline zn_v256 _mm512_extractf64x4_pd(zn_v512 a, int i)
{ zn_v256 r; memcpy(&r, (char *)&a + 32 * (i & 1), 32); return r; }
static inline zn_v128 _mm256_castpd256_pd128(zn_v256 a)
{ zn_v128 r; memcpy(&r, &a, 16); return r; }
static inline zn_v128 _mm256_extractf128_pd(zn_v256 a, int i)
{ zn_v128 r; memcpy(&r, (char *)&a + 16 * (i & 1), 16); return r; }
static inline zn_v512 _mm512_maskz_loadu_ps(__mmask16 k, const void *p)
{ zn_v512 r; LANES(16) { r.u[j] = 0; if (k >> j & 1) memcpy(&r.f[j], (const char *)p + 4 * j, 4); } return r; }
static inline void _mm512_mask_storeu_ps(void *p, __mmask16 k, zn_v512 a)
{ LANES(16) if (k >> j & 1) memcpy((char *)p + 4 * j, &a.f[j], 4); }
static inline zn_v256 _mm256_maskz_loadu_epi16(__mmask16 k, const void *p)
{ zn_v256 r; LANES(16) { r.h[j] = 0; if (k >> j & 1) memcpy(&r.h[j], (const char *)p + 2 * j, 2); } return r; }
static inline void _mm256_mask_storeu_epi16(void *p, __mmask16 k, zn_v256 a)
{ LANES(16) if (k >> j & 1) memcpy((char *)p + 2 * j, &a.h[j], 2); }
static inline void _mm256_stream_si256(void *p, zn_v256 a)
{
    if ((uintptr_t)p & 31)   /* the instruction faults on a misaligned address */
        ZT_SETUP_FAIL("vmovntdq to %p: not 32-byte aligned", p);
    memcpy(p, &a, 32);
}
static inline void _mm_sfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline zn_v512 _mm512_slli_epi32(zn_v512 a, int c) { LANES(16) a.u[j] <<= c; return a; }
static inline zn_v512 _mm512_srli_epi32(zn_v512 a, int c) { LANES(16) a.u[j] >>= c; return a; }
static inline zn_v512 _mm512_add_epi32(zn_v512 a, zn_v512 b) { LANES(16) a.u[j] += b.u[j]; return a; }
static inline zn_v512 _mm512_and_si512(zn_v512 a, zn_v512 b) { LANES(16) a.u[j] &= b.u[j]; return a; }
static inline zn_v512 _mm512_mask_or_epi32(zn_v512 src, __mmask16 k, zn_v512 a, zn_v512 b)
{ LANES(16) if (k >> j & 1) src.u[j] = a.u[j] | b.u[j]; return src; }
static inline __mmask16 _mm512_cmp_ps_mask(zn_v512 a, zn_v512 b, int pred)
{
    __mmask16 k = 0;
    if (pred == _CMP_GT_OQ) {
        LANES(16) if (a.f[j] > b.f[j]) k |= (__mmask16)(1u << j);
        return k;
    }
    if (pred != _CMP_UNORD_Q)
        ZT_SETUP_FAIL("emulated vcmpps: predicate %d not written", pred);
    LANES(16) if (isnan(a.f[j]) || isnan(b.f[j])) k |= (__mmask16)(1u << j);
    return k;
}
static inline zn_v512 _mm512_cvtepu16_epi32(zn_v256 a) { zn_v512 r; LANES(16) r.u[j] = a.h[j]; return r; }
static inline zn_v256 _mm512_cvtepi32_epi16(zn_v512 a) { zn_v256 r; LANES(16) r.h[j] = (uint16_t)a.u[j]; return r; }
static inline zn_v512 _mm512_cvtph_ps(zn_v256 a) { zn_v512 r; LANES(16) r.f[j] = zn_f16_widen(a.h[j]); return r; }
static inline zn_v256 _mm512_cvtps_ph(zn_v512 a, int imm)
{
    zn_v256 r;
    if (imm & 7)   /* the kernels use round-to-nearest-even only */
        ZT_SETUP_FAIL("emulated vcvtps2ph: rounding %d not written", imm);
    LANES(16) r.h[j] = zn_f16_round(a.f[j]);
    return r;
}
static inline zn_v512 _mm512_cvtps_pd(zn_v256 a) { zn_v512 r; LANES(8) r.d[j] = a.f[j]; return r; }
static inline zn_v512 _mm512_mul_ps(zn_v512 a, zn_v512 b) { LANES(16) a.f[j] *= b.f[j]; return a; }
static inline zn_v512 _mm512_add_ps(zn_v512 a, zn_v512 b) { LANES(16) a.f[j] += b.f[j]; return a; }
static inline zn_v512 _mm512_sub_ps(zn_v512 a, zn_v512 b) { LANES(16) a.f[j] -= b.f[j]; return a; }
static inline zn_v512 _mm512_div_ps(zn_v512 a, zn_v512 b) { LANES(16) a.f[j] /= b.f[j]; return a; }
static inline zn_v512 _mm512_sqrt_ps(zn_v512 a) { LANES(16) a.f[j] = sqrtf(a.f[j]); return a; }
static inline zn_v512 _mm512_fmadd_ps(zn_v512 a, zn_v512 b, zn_v512 c)
{ LANES(16) a.f[j] = fmaf(a.f[j], b.f[j], c.f[j]); return a; }
static inline zn_v512 _mm512_fmsub_ps(zn_v512 a, zn_v512 b, zn_v512 c)
{ LANES(16) a.f[j] = fmaf(a.f[j], b.f[j], -c.f[j]); return a; }
static inline zn_v512 _mm512_fmadd_pd(zn_v512 a, zn_v512 b, zn_v512 c)
{ LANES(8) a.d[j] = fma(a.d[j], b.d[j], c.d[j]); return a; }
static inline zn_v512 _mm512_add_pd(zn_v512 a, zn_v512 b) { LANES(8) a.d[j] += b.d[j]; return a; }
static inline zn_v256 _mm256_add_pd(zn_v256 a, zn_v256 b) { LANES(4) a.d[j] += b.d[j]; return a; }
static inline zn_v128 _mm_add_pd(zn_v128 a, zn_v128 b) { LANES(2) a.d[j] += b.d[j]; return a; }
static inline zn_v128 _mm_add_sd(zn_v128 a, zn_v128 b) { a.d[0] += b.d[0]; return a; }
static inline zn_v128 _mm_unpackhi_pd(zn_v128 a, zn_v128 b) { zn_v128 r = { .d = { a.d[1], b.d[1] } }; return r; }
static inline double _mm_cvtsd_f64(zn_v128 a) { return a.d[0]; }
/* the compressed moments' pieces */
static inline zn_v512 _mm512_setzero_ps(void) { zn_v512 r; LANES(16) r.f[j] = 0; return r; }
static inline zn_v128 _mm_maskz_loadu_epi8(__mmask16 k, const void *p)
{ zn_v128 r; LANES(16) r.b[j] = (k >> j & 1) ? ((const uint8_t *)p)[j] : 0; return r; }
static inline void _mm_mask_storeu_epi8(void *p, __mmask16 k, zn_v128 a)
{ LANES(16) if (k >> j & 1) ((uint8_t *)p)[j] = a.b[j]; }
static inline zn_v512 _mm512_cvtepu8_epi32(zn_v128 a) { zn_v512 r; LANES(16) r.u[j] = a.b[j]; return r; }
static inline zn_v128 _mm512_cvtepi32_epi8(zn_v512 a) { zn_v128 r; LANES(16) r.b[j] = (uint8_t)a.u[j]; return r; }
static inline zn_v512 _mm512_i32gather_ps(zn_v512 idx, const void *base, int scale)
{ zn_v512 r; LANES(16) memcpy(&r.f[j], (const char *)base + (int32_t)idx.u[j] * scale, 4); return r; }
static inline zn_v512 _mm512_i32gather_epi32(zn_v512 idx, const void *base, int scale)
{ zn_v512 r; LANES(16) memcpy(&r.u[j], (const char *)base + (int32_t)idx.u[j] * scale, 4); return r; }
/* maxps/minps: the first operand when it compares greater (less), else
 * the second, so a NaN in either gives the second */
static inline zn_v512 _mm512_max_ps(zn_v512 a, zn_v512 b) { LANES(16) a.f[j] = a.f[j] > b.f[j] ? a.f[j] : b.f[j]; return a; }
static inline zn_v512 _mm512_min_ps(zn_v512 a, zn_v512 b) { LANES(16) a.f[j] = a.f[j] < b.f[j] ? a.f[j] : b.f[j]; return a; }
static inline float _mm512_reduce_max_ps(zn_v512 a)
{ float r = a.f[0]; LANES(16) r = a.f[j] > r ? a.f[j] : r; return r; }
static inline zn_v512 _mm512_mask_add_epi32(zn_v512 src, __mmask16 k, zn_v512 a, zn_v512 b)
{ LANES(16) if (k >> j & 1) src.u[j] = a.u[j] + b.u[j]; return src; }
/* the 8-bit maps' lookups: a two-register permute takes the low 5 bits
 * of each index lane (bit 4 picks the second register) */
static inline zn_v512 _mm512_loadu_ps(const void *p) { zn_v512 r; memcpy(&r, p, 64); return r; }
static inline zn_v512 _mm512_setzero_si512(void) { zn_v512 r; LANES(16) r.u[j] = 0; return r; }
static inline __mmask16 _mm512_test_epi32_mask(zn_v512 a, zn_v512 b)
{ __mmask16 k = 0; LANES(16) k |= (__mmask16)(((a.u[j] & b.u[j]) != 0) << j); return k; }
static inline zn_v512 _mm512_mask_mov_epi32(zn_v512 src, __mmask16 k, zn_v512 a)
{ LANES(16) if (k >> j & 1) src.u[j] = a.u[j]; return src; }
static inline zn_v512 _mm512_mask_blend_ps(__mmask16 k, zn_v512 a, zn_v512 b)
{ LANES(16) if (k >> j & 1) a.u[j] = b.u[j]; return a; }
static inline zn_v512 _mm512_permutex2var_ps(zn_v512 a, zn_v512 idx, zn_v512 b)
{ zn_v512 r; LANES(16) r.u[j] = (idx.u[j] & 16) ? b.u[idx.u[j] & 15] : a.u[idx.u[j] & 15]; return r; }
#define _MM_CMPINT_LT 1
#define _MM_CMPINT_GT 6
static inline __mmask16 _mm512_cmp_epi32_mask(zn_v512 a, zn_v512 b, int pred)
{
    __mmask16 k = 0;
    LANES(16) {
        int32_t x = (int32_t)a.u[j], y = (int32_t)b.u[j];
        k |= (__mmask16)((pred == _MM_CMPINT_LT ? x < y : x > y) << j);
    }
    return k;
}
static inline zn_v512 _mm512_sub_epi32(zn_v512 a, zn_v512 b) { LANES(16) a.u[j] -= b.u[j]; return a; }
static inline zn_v512 _mm512_min_epi32(zn_v512 a, zn_v512 b)
{ LANES(16) a.u[j] = (int32_t)a.u[j] < (int32_t)b.u[j] ? a.u[j] : b.u[j]; return a; }
static inline zn_v512 _mm512_max_epi32(zn_v512 a, zn_v512 b)
{ LANES(16) a.u[j] = (int32_t)a.u[j] > (int32_t)b.u[j] ? a.u[j] : b.u[j]; return a; }
static inline zn_v512 _mm512_mask_xor_epi32(zn_v512 src, __mmask16 k, zn_v512 a, zn_v512 b)
{ LANES(16) if (k >> j & 1) src.u[j] = a.u[j] ^ b.u[j]; return src; }
static inline zn_v512 _mm512_xor_si512(zn_v512 a, zn_v512 b) { LANES(16) a.u[j] ^= b.u[j]; return a; }
static inline zn_v512 _mm512_or_si512(zn_v512 a, zn_v512 b) { LANES(16) a.u[j] |= b.u[j]; return a; }
static inline zn_v512 _mm512_mullo_epi32(zn_v512 a, zn_v512 b) { LANES(16) a.u[j] *= b.u[j]; return a; }
static inline zn_v512 _mm512_setr_epi32(int e0, int e1, int e2, int e3, int e4, int e5, int e6,
                                         int e7, int e8, int e9, int e10, int e11, int e12,
                                         int e13, int e14, int e15)
{
    const int e[16] = { e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15 };
    zn_v512 r;
    LANES(16) r.u[j] = (uint32_t)e[j];
    return r;
}
#undef LANES

#include "optim/optim_avx512.c"
#else
#define HAVE_EMU 0
#endif

#if HAVE_EMU
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static float rndf(uint64_t seed, uint64_t i, double lo, double hi)
{
    return (float)(lo + (hi - lo) * (double)(mix(seed * 977 + i) >> 11) * 0x1p-53);
}

typedef struct {
    float *p, *m, *v;
    char *g;
    uint16_t *c;
    void *blk[5];
} bufs;

static void bufs_alloc(bufs *b, size_t n, int off)
{
    for (int i = 0; i < 5; i++)
        if (posix_memalign(&b->blk[i], 64, (n + 64) * 4))
            ZT_SETUP_FAIL("out of memory");
    b->p = (float *)b->blk[0] + off;
    b->m = (float *)b->blk[1] + 2 * off;
    b->v = (float *)b->blk[2] + 3 * off;
    b->g = (char *)b->blk[3] + 2 * off;
    b->c = (uint16_t *)b->blk[4] + off;
}

static void bufs_free(bufs *b)
{
    for (int i = 0; i < 5; i++)
        free(b->blk[i]);
}

static void fill(bufs *b, size_t n, zn_dtype gt, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        b->p[i] = rndf(seed, 4 * i, -1, 1);
        b->m[i] = rndf(seed, 4 * i + 1, -0.1, 0.1);
        b->v[i] = rndf(seed, 4 * i + 2, 0, 0.01);
        float g = rndf(seed, 4 * i + 3, -1, 1);
        if (gt == ZN_DTYPE_F32)
            memcpy(b->g + i * 4, &g, 4);
        else {
            uint16_t h = gt == ZN_DTYPE_BF16 ? zn_f32_to_bf16(g) : zn_f32_to_f16(g);
            memcpy(b->g + i * 2, &h, 2);
        }
        b->c[i] = 0x7dad;
    }
    for (size_t i = n; i < n + 16; i++)
        b->c[i] = 0x7dad;
}

static int same(const bufs *x, const bufs *y, size_t n, int copy)
{
    return !memcmp(x->p, y->p, n * 4) && !memcmp(x->m, y->m, n * 4) &&
           !memcmp(x->v, y->v, n * 4) && (!copy || !memcmp(x->c, y->c, (n + 16) * 2));
}

static void check_adam(const zn_optim_ops *ref, const zn_optim_ops *emu)
{
    static const size_t sizes[] = { 1, 7, 15, 16, 17, 31, 33, 1000, 70001 };
    static const zn_dtype gts[] = { ZN_DTYPE_F32, ZN_DTYPE_BF16, ZN_DTYPE_F16 };
    int cases = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        for (int gi = 0; gi < 3; gi++) {
            for (int ci = 0; ci < 3; ci++) {
                for (int mode = 0; mode < 3; mode++) {
                    int off = (int)((si + (size_t)ci + (size_t)mode) & 1);
                    bufs a, b;
                    bufs_alloc(&a, n, off);
                    bufs_alloc(&b, n, off);
                    fill(&a, n, gts[gi], n * 31 + (size_t)gi);
                    fill(&b, n, gts[gi], n * 31 + (size_t)gi);
                    zn_adam_params hp = zn_adam_params_default();
                    hp.weight_decay = mode ? 0.05f : 0.0f;
                    hp.adamw_mode = mode == 2;
                    hp.bias_correction = (int)(n & 1);
                    int rc = 0;
                    zn_dtype ct = ci == 2 ? ZN_DTYPE_F16 : ZN_DTYPE_BF16;
                    for (int t = 0; t < 3; t++) {
                        hp.step = 1 + t;
                        rc |= zn_adam_step_with(ref->adam, &hp, a.p, a.m, a.v, a.g, gts[gi],
                                                0.5f, ci ? a.c : NULL, ct, n);
                        rc |= zn_adam_step_with(emu->adam, &hp, b.p, b.m, b.v, b.g, gts[gi],
                                                0.5f, ci ? b.c : NULL, ct, n);
                    }
                    ZT_CHECK_MSG(rc == 0 && same(&a, &b, n, ci != 0),
                                 "adam n=%zu g=%s copy=%d mode=%d off=%d: avx512 (emulated) "
                                 "differs from avx2", n, zn_dtype_name(gts[gi]), ci, mode, off);
                    cases++;
                    bufs_free(&a);
                    bufs_free(&b);
                }
            }
        }
    }
    printf("adam: %d cases compared\n", cases);
}

/* lr = 0: the copies of ties, subnormals, Inf, NaN, overflow edges. */
static void check_specials(const zn_optim_ops *ref, const zn_optim_ops *emu)
{
    static const uint32_t lows[] = { 0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000,
                                     0x8001, 0xffff };
    size_t n = 65536 * 9 + 5;
    bufs a, b;
    bufs_alloc(&a, n, 0);
    bufs_alloc(&b, n, 1);
    for (int ct = 1; ct <= 2; ct++) {
        size_t k = 0;
        for (uint32_t hi = 0; hi < 65536; hi++)
            for (size_t j = 0; j < 9; j++) {
                uint32_t u = hi << 16 | lows[j];
                memcpy(&a.p[k], &u, 4);
                memcpy(&b.p[k], &u, 4);
                k++;
            }
        for (; k < n; k++)
            a.p[k] = b.p[k] = 1.0f;
        memset(a.m, 0, n * 4);
        memset(b.m, 0, n * 4);
        memset(a.v, 0, n * 4);
        memset(b.v, 0, n * 4);
        memset(a.g, 0, n * 4);
        memset(b.g, 0, n * 4);
        zn_adam_params hp = zn_adam_params_default();
        hp.lr = 0;
        hp.eps = 1;
        hp.bias_correction = 0;
        int rc = zn_adam_step_with(ref->adam, &hp, a.p, a.m, a.v, a.g, ZN_DTYPE_F32, 1, a.c,
                                   (zn_dtype)ct, n);
        rc |= zn_adam_step_with(emu->adam, &hp, b.p, b.m, b.v, b.g, ZN_DTYPE_F32, 1, b.c,
                                (zn_dtype)ct, n);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += a.c[i] != b.c[i] || memcmp(&a.p[i], &b.p[i], 4) != 0;
        ZT_CHECK_MSG(rc == 0 && bad == 0, "special values, copy %s: %zu differ",
                     zn_dtype_name((zn_dtype)ct), bad);
    }
    bufs_free(&a);
    bufs_free(&b);
}

static void check_norm(const zn_optim_ops *ref, const zn_optim_ops *emu)
{
    float *x = malloc(ZN_NORM_CHUNK * 4 + 64);
    if (!x)
        ZT_SETUP_FAIL("out of memory");
    size_t bad = 0;
    for (int r = 0; r < 120; r++) {
        zn_dtype t = (zn_dtype)(r % 3);
        size_t n = r < 40 ? (size_t)r + 1 : 1 + (size_t)(mix((uint64_t)r) % ZN_NORM_CHUNK);
        char *d = (char *)x + (r & 1 ? 2 : 0);
        for (size_t i = 0; i < n; i++) {
            uint64_t h = mix(((uint64_t)r << 32) + i);
            float v = (float)(((double)(h >> 40) / (double)(1 << 24)) *
                              ldexp(1, (int)(h % 40) - 20));
            if (t == ZN_DTYPE_F32)
                memcpy(d + i * 4, &v, 4);
            else {
                uint16_t hb = t == ZN_DTYPE_BF16 ? zn_f32_to_bf16(v) : zn_f32_to_f16(v);
                memcpy(d + i * 2, &hb, 2);
            }
        }
        double u = ref->norm_chunk(d, t, n), w = emu->norm_chunk(d, t, n);
        bad += memcmp(&u, &w, sizeof u) != 0;
    }
    ZT_CHECK_MSG(bad == 0, "grad norm: %zu of 120 chunk sums differ", bad);
    free(x);
}

static void check_ceilings(const zn_optim_ops *ref, const zn_optim_ops *emu)
{
    const size_t n = 70001;
    bufs a, b;
    bufs_alloc(&a, n, 0);
    bufs_alloc(&b, n, 0);
    fill(&a, n, ZN_DTYPE_BF16, 3);
    fill(&b, n, ZN_DTYPE_BF16, 3);
    ref->rmw(a.p, a.m, a.v, a.g, ZN_DTYPE_BF16, a.c, n);
    emu->rmw(b.p, b.m, b.v, b.g, ZN_DTYPE_BF16, b.c, n);
    ZT_CHECK_MSG(same(&a, &b, n, 1), "rmw: the emulated AVX-512 pass differs from AVX2");
    ref->triad(a.p, a.m, a.v, 3.0f, n);
    emu->triad(b.p, b.m, b.v, 3.0f, n);
    ZT_CHECK_MSG(!memcmp(a.p, b.p, n * 4), "triad: the emulated AVX-512 pass differs");
    bufs_free(&a);
    bufs_free(&b);
}

/* Compressed moments: five steps from zero moments, gradients over six
 * decades, through the emulated pieces and AVX2's: the same bits (the
 * pieces are exact operations per element; the step is the fp32 kernel).
 * bf16, then 8-bit with bitsandbytes' and torchao's schemes (the latter
 * with a first block under torchao's 1e-12 floor). */
static void check_moments(const zn_optim_ops *ref, const zn_optim_ops *emu)
{
    static const size_t sizes[] = { 1, 17, 256, 300, 4099 };
    for (int fv = 0; fv < 3; fv++) {
        int f = fv ? ZN_MOM_Q8 : ZN_MOM_BF16;
        zn_q8_scheme scheme = fv == 2 ? ZN_Q8_TORCHAO : ZN_Q8_BNB;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            size_t n = sizes[si], nb = zn_q8_blocks(n), mb = f == ZN_MOM_Q8 ? 1 : 2;
            float *p[2], *g = malloc(n * 4), *am[2], *av[2];
            uint8_t *m[2], *v[2];
            uint16_t *c[2];
            for (int k = 0; k < 2; k++) {
                p[k] = malloc(n * 4);
                m[k] = calloc(n, mb);
                v[k] = calloc(n, mb);
                am[k] = calloc(nb, 4);
                av[k] = calloc(nb, 4);
                c[k] = malloc(n * 2);
                if (!p[k] || !m[k] || !v[k] || !am[k] || !av[k] || !c[k] || !g)
                    ZT_SETUP_FAIL("out of memory");
                for (size_t i = 0; i < n; i++)
                    p[k][i] = rndf(n, i, -1, 1);
            }
            for (int step = 1; step <= 5; step++) {
                for (size_t i = 0; i < n; i++)
                    g[i] = rndf(step, i, -1, 1) * (float)pow(10.0, -6.0 * rndf(step + 9, i, 0, 1)) *
                           (scheme == ZN_Q8_TORCHAO && i < ZN_Q8_BLOCK ? 1e-9f : 1.0f);
                zn_adam_params hp = zn_adam_params_default();
                hp.step = step;
                hp.weight_decay = 0.01f;
                hp.threads = 1;
                for (int k = 0; k < 2; k++) {
                    zn_moments mv = zn_moments_of((zn_mom_fmt)f, m[k], v[k], am[k], av[k], scheme);
                    int rc = zn_adam_step_mom_with(k ? emu : ref, &hp, p[k], &mv, g, ZN_DTYPE_F32,
                                                   1.0f, c[k], ZN_DTYPE_BF16, n);
                    ZT_CHECK_MSG(rc == 0, "step: %s", zn_last_error());
                }
            }
            int same = !memcmp(p[0], p[1], n * 4) && !memcmp(m[0], m[1], n * mb) &&
                       !memcmp(v[0], v[1], n * mb) && !memcmp(c[0], c[1], n * 2) &&
                       (f != ZN_MOM_Q8 || (!memcmp(am[0], am[1], nb * 4) &&
                                           !memcmp(av[0], av[1], nb * 4)));
            ZT_CHECK_MSG(same, "%s moments%s, n %zu: the emulated AVX-512 step differs from "
                         "AVX2", zn_mom_fmt_name((zn_mom_fmt)f),
                         scheme == ZN_Q8_TORCHAO ? " (torchao's scheme)" : "", n);
            for (int k = 0; k < 2; k++) {
                /* the ceiling moves the bytes and changes none */
                (k ? emu : ref)->rmw_mom(p[k], 4, m[k], v[k], (int)mb, am[k], av[k], g,
                                         ZN_DTYPE_F32, c[k], n);
            }
            ZT_CHECK_MSG(!memcmp(m[0], m[1], n * mb) && !memcmp(p[0], p[1], n * 4),
                         "rmw_mom changed the state");
            for (int k = 0; k < 2; k++) {
                free(p[k]); free(m[k]); free(v[k]); free(am[k]); free(av[k]); free(c[k]);
            }
            free(g);
        }
    }
}

/* Stochastic rounding to bf16 (zn_adam_step_sr): the emulated masks and
 * tails give AVX2's bits (and the scalar formula's) for every length, the
 * index low word wrapping inside a call, and NaN, Inf, the largest finite
 * values and zeros among random values. */
static void check_sr(const zn_optim_ops *ref, const zn_optim_ops *emu)
{
    static const size_t sizes[] = { 1, 7, 15, 16, 17, 33, 1000, 4099 };
    static const uint32_t edges[] = { 0x7fc00000, 0xff800000, 0x7f800000, 0x7f7fffff,
                                      0xff7f8001, 0x00000000, 0x80000000, 0x00000001 };
    const size_t nmax = 4099;
    float *x = malloc(nmax * 4);
    uint16_t *a = malloc(nmax * 2), *b = malloc(nmax * 2), *c = malloc(nmax * 2);
    if (!x || !a || !b || !c)
        ZT_SETUP_FAIL("out of memory");
    for (size_t i = 0; i < nmax; i++) {
        uint32_t u = (uint32_t)zn_splitmix64(i * 2654435761u);
        x[i] = i % 97 < 8 ? zn_bits_f32(edges[i % 97]) : zn_bits_f32((u & 0x8fffffffu) | 0x30000000u);
    }
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        /* idx_lo near 2^32: the counter wraps inside the call */
        uint32_t idx = si & 1 ? 0xfffffff0u : (uint32_t)(si * 1000);
        ref->sr_round(x, a, n, 0x1234567u, 0x89abcdefu, idx);
        emu->sr_round(x, b, n, 0x1234567u, 0x89abcdefu, idx);
        zn_sr_round_scalar(x, c, n, 0x1234567u, 0x89abcdefu, idx);
        ZT_CHECK_MSG(!memcmp(a, b, n * 2) && !memcmp(a, c, n * 2),
                     "sr_round n=%zu: emulated AVX-512, AVX2 and scalar differ", n);
    }
    free(x);
    free(a);
    free(b);
    free(c);
}

/* The bf16-master step (zn_adam_step_sr), fused on the emulated AVX-512
 * path (adam_sr) and in pieces on AVX2: the same bits for fp32 and bf16
 * moments, fp32 and bf16 gradients, the three decay modes, every tail,
 * an index crossing 2^32, NaN and infinite gradients. */
static void check_sr_step(const zn_optim_ops *ref, const zn_optim_ops *emu)
{
    static const size_t sizes[] = { 1, 15, 17, 300, 4099 };
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        for (int var = 0; var < 12; var++) {
            int mh = var & 1, wd = (var >> 1) % 3;
            zn_dtype gt = var >= 6 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
            size_t mb = mh ? 2 : 4;
            uint16_t *p[2], *g16 = malloc(n * 2);
            float *g = malloc(n * 4);
            void *m[2], *v[2];
            if (!g16 || !g)
                ZT_SETUP_FAIL("out of memory");
            for (int k = 0; k < 2; k++) {
                p[k] = malloc(n * 2);
                m[k] = malloc(n * mb);
                v[k] = malloc(n * mb);
                if (!p[k] || !m[k] || !v[k])
                    ZT_SETUP_FAIL("out of memory");
                for (size_t i = 0; i < n; i++) {
                    float mm = rndf(si + 3, i, -1e-3f, 1e-3f), vv = rndf(si + 4, i, 0, 1e-6f);
                    p[k][i] = zn_f32_to_bf16(rndf(si + 5, i, -1, 1));
                    if (mh) {
                        ((uint16_t *)m[k])[i] = zn_f32_to_bf16(mm);
                        ((uint16_t *)v[k])[i] = zn_f32_to_bf16(vv);
                    } else {
                        ((float *)m[k])[i] = mm;
                        ((float *)v[k])[i] = vv;
                    }
                }
            }
            for (size_t i = 0; i < n; i++) {
                g[i] = i % 101 == 7   ? NAN
                       : i % 103 == 9 ? INFINITY
                                      : rndf(si + 6, i, -1e-2f, 1e-2f);
                g16[i] = zn_f32_to_bf16(g[i]);
            }
            zn_adam_params hp = zn_adam_params_default();
            hp.step = 4;
            hp.weight_decay = wd ? 0.1f : 0.0f;
            hp.adamw_mode = wd == 2;
            hp.threads = 1;
            for (int k = 0; k < 2; k++) {
                zn_moments mv = zn_moments_of(mh ? ZN_MOM_BF16 : ZN_MOM_F32, m[k], v[k], NULL,
                                              NULL, ZN_Q8_BNB);
                int rc = zn_adam_step_sr_with(k ? emu : ref, &hp, p[k], &mv,
                                              gt == ZN_DTYPE_F32 ? (const void *)g : g16, gt,
                                              0.5f, 3, ((uint64_t)1 << 32) - n / 2, n);
                ZT_CHECK_MSG(rc == 0, "sr step: %s", zn_last_error());
            }
            ZT_CHECK_MSG(!memcmp(p[0], p[1], n * 2) && !memcmp(m[0], m[1], n * mb) &&
                         !memcmp(v[0], v[1], n * mb),
                         "bf16-master step, %s moments, n %zu, variant %d: the emulated "
                         "AVX-512 fused step differs from AVX2's pieces", mh ? "bf16" : "fp32",
                         n, var);
            for (int k = 0; k < 2; k++) {
                free(p[k]);
                free(m[k]);
                free(v[k]);
            }
            free(g);
            free(g16);
        }
    }
}

/* The bf16-master ceiling (rmw_mom of 2-byte params) of each moment width moves the bytes and
 * changes none, through the emulated masks and AVX2's scalar tail alike: a
 * partial 8-bit block at the end. */
static void check_sr_ceiling(const zn_optim_ops *ref, const zn_optim_ops *emu)
{
    const size_t n = 4099, nb = zn_q8_blocks(n);
    for (int mb = 1; mb <= 4; mb *= 2) {
        /* p, m, v in one buffer, the absmax (floats) in another */
        size_t bytes = 2 * n + 2 * n * (size_t)mb;
        char *x = malloc(bytes), *keep = malloc(bytes);
        float *g = malloc(n * 4), *am = malloc(2 * nb * 4), *amk = malloc(2 * nb * 4);
        if (!x || !keep || !g || !am || !amk)
            ZT_SETUP_FAIL("out of memory");
        for (size_t i = 0; i < bytes; i++)
            x[i] = (char)zn_splitmix64(i * 31 + (size_t)mb);
        for (size_t i = 0; i < n; i++)
            g[i] = (float)i;
        for (size_t b = 0; b < 2 * nb; b++)
            am[b] = (float)b + 0.5f;
        memcpy(keep, x, bytes);
        memcpy(amk, am, 2 * nb * 4);
        uint16_t *p = (uint16_t *)(void *)x;
        char *m = x + 2 * n, *v = m + n * (size_t)mb;
        for (int k = 0; k < 2; k++)
            (k ? emu : ref)->rmw_mom(p, 2, m, v, mb, am, am + nb, g, ZN_DTYPE_F32, NULL, n);
        ZT_CHECK_MSG(!memcmp(x, keep, bytes) && !memcmp(am, amk, 2 * nb * 4),
                     "rmw_mom of bf16 params (moments of %d bytes) changed the state", mb);
        free(x);
        free(keep);
        free(g);
        free(am);
        free(amk);
    }
}
#endif

int main(void)
{
#if HAVE_EMU
    const zn_optim_ops *ref = zn_optim_get_ops(ZN_ISA_AVX2);
    if (!ref)
        ZT_SKIP("no AVX2 on this CPU to compare the emulated AVX-512 kernels with");
    const zn_optim_ops *emu = &zn_optim_ops_avx512_emu;
    check_adam(ref, emu);
    check_specials(ref, emu);
    check_norm(ref, emu);
    check_ceilings(ref, emu);
    check_moments(ref, emu);
    check_sr(ref, emu);
    check_sr_step(ref, emu);
    check_sr_ceiling(ref, emu);
    return zt_done();
#else
    ZT_SKIP("not an x86-64 GCC build: there are no AVX-512 kernels to emulate");
#endif
}
