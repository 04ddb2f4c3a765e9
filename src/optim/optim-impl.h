/* Private to the CPU optimizer (adam.c, gradnorm.c, half.c and the per-ISA
 * kernel files optim_*.c, each compiled with its own target flags): the
 * kernel table, the per-call constants, and the scalar element formulas
 * that every path follows. */
#ifndef ZN_OPTIM_OPTIM_IMPL_H
#define ZN_OPTIM_OPTIM_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "util/hash-impl.h"
#include "zinc/optim.h"

/* The SIMD files are built (with `#pragma GCC target`) for x86-64 GCC. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ZN_OPTIM_X86 1
#else
#define ZN_OPTIM_X86 0
#endif


/* Updates elements [0, n) of the given arrays. c (16-bit copy, c_dtype
 * BF16/F16) may be NULL. A kernel may use non-temporal stores for c; it
 * ends with a store fence when it did. */
typedef void (*zn_adam_kernel_fn)(const zn_adam_consts *k, float *p, float *m, float *v,
                                  const void *g, zn_dtype g_dtype,
                                  void *c, zn_dtype c_dtype, size_t n);

/* Sum of squares of x[0, n) (n <= ZN_NORM_CHUNK) in the canonical order:
 * element i goes to double accumulator i % 16; then for s = 8, 4, 2, 1:
 * acc[j] += acc[j + s] (j < s); the result is acc[0]. Every path follows
 * this order exactly, so all paths give the same bits. */
typedef double (*zn_norm_chunk_fn)(const void *x, zn_dtype dtype, size_t n);
#define ZN_NORM_CHUNK ZN_GRAD_NORM_CHUNK

/* Benchmark ceilings with Adam's memory pattern: read p, g, m, v, write p,
 * m, v unchanged (and c: the low half of p's bits, with the same store kind
 * the kernel uses); and the STREAM triad a = b + s * c. */
typedef void (*zn_rmw_fn)(float *p, float *m, float *v, const void *g, zn_dtype g_dtype,
                          void *c, size_t n);
typedef void (*zn_triad_fn)(float *a, const float *b, const float *c, float s, size_t n);

/* ---- compressed moments (moments.c drives these block by block) ------
 * The rounding table of one dynamic map and scheme: code(y) for y in
 * [-1, 1] is the count of midpoints below y. For bitsandbytes' scheme
 * mid[i] is the float midpoint of entries i and i + 1 (the nearest entry,
 * ties to the lower one); for torchao's it is the largest float that
 * torchao rounds down to entry i (ties go up). key[bits(y) >> 16] is that
 * count at the lowest value whose top 16 bits are those; no such range of
 * floats holds two midpoints (checked when the table is built), so
 * code(y) = key + (y > mid[key]) (the scalar form). mid[255] is +Inf.
 * A block is scaled by zn_q8_scale(amax): bitsandbytes' multiplies by
 * 1 / amax; torchao's divides by max(amax, floor). */
typedef struct {
    float map[256];
    float mid[256];
    float floor;      /* the smallest scale: 0, or torchao's 1e-12 */
    int divide;       /* y = x / scale (torchao), else x * (1 / scale) */
    /* The same code in one 32-bit word per range of floats sharing their
     * top 16 bits (a cell), for paths that gather (zn_q8_code_cell): the
     * low byte is key's count, bits 16-31 the low 16 bits of the cell's
     * midpoint in the float order (0xffff: no midpoint in the cell). Only
     * |y| in [cell_lo, 1] has cells of its own: cell_lo is a power of two
     * below every midpoint's magnitude, so smaller |y| share the cell of
     * cell_lo (its low bits taken as 0). bitsandbytes' maps have 2 x 2945
     * cells (23 KiB, in L1 for one pass over a block) where key has 64 KiB;
     * the table is sized for cell_lo down to 2^-32. */
    uint32_t cell_lo;   /* float bits of cell_lo, >= 2^-32 */
    uint32_t cell_n;    /* cells per sign; the negative ones follow */
    uint32_t cell[2 * 4097];
    uint8_t key[65536];
    /* Tables for the AVX-512 VBMI path (optim_avx512vbmi.c), whose byte
     * and word permutes look up 64 or 32 lanes at once where a gather looks
     * up 16. Keys are floats in their order as unsigned integers
     * (zn_q8_ord). map_plane[b][c]: byte b of map[c]'s bits. mid_plane[b][c]:
     * byte b of mid[c]'s key. tree16[l][j] for l = 0..7, s = 128 >> l: the
     * top 16 bits of the key of mid[j * 2s + s - 1], the midpoint that step
     * l of a binary search over the top 16 bits meets after the steps before
     * it chose j (zn_q8_code_tree, the scalar form of that search). vbmi_ok:
     * the search gives zn_q8_code's answer for every y in [-1, 1] (no
     * midpoint is +-0, where the key order and the float order part). */
    uint8_t map_plane[4][256] __attribute__((aligned(64)));
    uint8_t mid_plane[4][256] __attribute__((aligned(64)));
    uint16_t tree16[8][128] __attribute__((aligned(64)));
    int vbmi_ok;
    /* The linear estimate (zn_q8_lin_u, the VBMI path's first try). The
     * map's entries fall in groups, one per decade of |entry| (bitsandbytes'
     * maps space their entries evenly within a decade), so within a group
     * the code is nearly a linear function of |y|. Per side of 0 (index d,
     * or 16 + d for y < 0), U = min(cap, fma(|y|, alpha, beta)) puts the
     * group's midpoints on integers (plus eps) and its regions between them;
     * the cap holds the group's last region, which reaches past its
     * spacing. floor(U) is the code (y >= 0) or lin_kneg less it (y < 0),
     * except where U is within 2 eps above an integer (lin_flag): there,
     * and at NaN, the search decides. The group of |y| (y < 0 shifted
     * first, see zn_q8_lin_u): lin_dlo of its binade (exponents 2^-31 ..
     * 2^0, smaller and larger clamped), plus one when above lin_b, the one
     * group boundary inside that binade (+Inf if none); lin_b[32 + i] for
     * y < 0, the same in bitsandbytes' symmetric maps (lin_two_b 0), one
     * ulp off in some of torchao's (1). lin_ok: built and checked
     * (build_lin in moments.c checks U at every point where the code, the
     * side, the binade or the group changes, and U is monotone in
     * between), else the path searches. */
    int32_t lin_dlo[32] __attribute__((aligned(64)));
    float lin_b[64] __attribute__((aligned(64)));
    float lin_alpha[32] __attribute__((aligned(64)));
    float lin_beta[32] __attribute__((aligned(64)));
    float lin_cap[32] __attribute__((aligned(64)));
    int32_t lin_kneg;
    float lin_flag;
    int lin_two_b;
    int lin_pos;   /* no entry below 0 (an unsigned map): the VBMI path
                    * leaves every y with its sign bit set to the search */
    int lin_ok;
} zn_q8_table;

/* The linear estimate's U for y (see zn_q8_table), as the vector path
 * computes it; *neg: whether y's sign bit is set. */
static inline float zn_q8_lin_u(const zn_q8_table *t, float y, int *neg)
{
    uint32_t u, ab;
    memcpy(&u, &y, 4);
    /* y < 0 takes the next float above |y|: its regions are closed below
     * (code k + 1 from |y| >= bnd on), and "above" is what the group test
     * and the floor decide */
    ab = (u & 0x7fffffffu) + (u >> 31);
    uint32_t ex = ab >> 23;
    ex = ex < 96 ? 96 : ex > 127 ? 127 : ex;
    float a;
    memcpy(&a, &ab, 4);
    *neg = (int)(u >> 31);
    int d = t->lin_dlo[ex & 31] + (t->lin_b[(ex & 31) + (*neg ? 32 : 0)] < a) + (*neg ? 16 : 0);
    float f = fmaf(a, t->lin_alpha[d], t->lin_beta[d]);
    return t->lin_cap[d] < f ? t->lin_cap[d] : f;   /* vminps(cap, f): a NaN f stays */
}

/* The code of y by the linear estimate: 1 and *code where it decides, 0
 * where the search must (tests/test_adam_q8.c checks it against the
 * definition). */
static inline int zn_q8_code_lin(const zn_q8_table *t, float y, uint8_t *code)
{
    int neg;
    float U = zn_q8_lin_u(t, y, &neg);
    float fl = floorf(U);
    if (!(U - fl >= t->lin_flag))
        return 0;
    int e = (int)fl;
    *code = (uint8_t)(neg ? t->lin_kneg - e : e);
    return 1;
}

/* A float in its order as an unsigned integer (-0 just below +0). */
static inline uint32_t zn_q8_ord(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* The code of y in [-1, 1] (or NaN, taken as -1 as the vector clamp does)
 * by the search the VBMI path runs: c = the count of midpoints whose key's
 * top 16 bits are below y's (an 8-step binary search over tree16), then one
 * more if the midpoint at c shares y's top 16 bits and its low 16 are
 * below y's (no 16-bit range holds two midpoints: build_table checks it).
 * tests/test_adam_q8.c checks it against zn_q8_code. */
static inline uint8_t zn_q8_code_tree(const zn_q8_table *t, float y)
{
    if (y != y)
        y = -1.0f;
    uint32_t k = zn_q8_ord(y), k16 = k >> 16, j = 0;
    for (int l = 0; l < 8; l++) {
        j = 2 * j + (t->tree16[l][j] < k16);
    }
    uint32_t mk = (uint32_t)t->mid_plane[3][j] << 24 | (uint32_t)t->mid_plane[2][j] << 16 |
                  (uint32_t)t->mid_plane[1][j] << 8 | t->mid_plane[0][j];
    return (uint8_t)(j + ((mk >> 16) == k16 && (mk & 0xffffu) < (k & 0xffffu)));
}

/* The tables of the signed (m) and unsigned (v) maps of a scheme, built
 * once; NULL (with zn_last_error) for an unknown scheme or if a map broke
 * the one-midpoint rule. */
const zn_q8_table *zn_q8_table_get(zn_q8_scheme scheme, int is_signed);

/* The scale a block with largest |x| amax stores (0: codes all 0, the
 * bitsandbytes scheme's zero block), and the operand its elements meet:
 * the scale itself (divide) or its reciprocal. */
static inline float zn_q8_scale(const zn_q8_table *t, float amax)
{
    return amax > t->floor ? amax : t->floor;
}

static inline float zn_q8_scale_operand(const zn_q8_table *t, float scale)
{
    return t->divide ? scale : 1.0f / scale;
}

/* out[i] = t->map[q[i]] * absmax, i < n <= ZN_Q8_BLOCK (the whole table,
 * not only its map: the VBMI path reads the map's byte planes). */
typedef void (*zn_q8_dequant_fn)(const uint8_t *q, const zn_q8_table *t, float absmax,
                                 float *out, size_t n);
/* The block's scale (zn_q8_scale of its largest |x[i]|, i < n <=
 * ZN_Q8_BLOCK) and the codes of x[i] scaled by it (zn_q8_scaled_code);
 * all codes 0 when the scale is 0. */
typedef float (*zn_q8_quant_fn)(const float *x, const zn_q8_table *t, uint8_t *q, size_t n);
/* bf16 <-> fp32 of n <= ZN_Q8_BLOCK elements (round to nearest even, as
 * zn_f32_to_bf16). */
typedef void (*zn_bf16_widen_fn)(const uint16_t *h, float *out, size_t n);
typedef void (*zn_bf16_round_fn)(const float *x, uint16_t *out, size_t n);
/* The benchmark ceiling of a compressed step: reads p (pb bytes each: 4,
 * fp32; 2, the bf16 master of zn_adam_step_sr), g and mb bytes of m and of
 * v per element (4, 2 or 1; with 1 each block's absmax too, n from a
 * block's start), writes them back unchanged, and c (fp32 p only) as rmw
 * does. */
typedef void (*zn_rmw_mom_fn)(void *p, int pb, void *m, void *v, int mb, float *am, float *av,
                              const void *g, zn_dtype g_dtype, void *c, size_t n);

/* Stochastic rounding of n fp32 values to bf16 (zn_adam_step_sr): element
 * i takes the random bits zn_sr_hash(k1, k2, idx_lo + i); the caller keeps
 * idx_lo + n within 2^32 (k1, k2 carry the index's high word). */
typedef void (*zn_sr_round_fn)(const float *x, uint16_t *out, size_t n, uint32_t k1,
                               uint32_t k2, uint32_t idx_lo);

/* One block of the 8-bit step, fused (n <= ZN_Q8_BLOCK): dequantize m and
 * v, step them as the path's adam kernel does, store the new absmax
 * (*am, *av) and codes. Optional (NULL: moments.c runs the pieces); the
 * same bits as the pieces. */
typedef void (*zn_q8_step_fn)(const zn_adam_consts *k, float *p, uint8_t *mq, uint8_t *vq,
                              float *am, float *av, const zn_q8_table *ts,
                              const zn_q8_table *tu, const void *g, zn_dtype g_dtype, void *c,
                              zn_dtype c_dtype, size_t n);

/* The gradient and copy dtype pairs each SIMD kernel is instantiated for,
 * as CASE(gradient dtype, copy dtype, has a copy, A): one instance per
 * pair, so that the dtype tests fold away. The kernels' dispatchers define
 * CASE. */
#define ZN_ADAM_DTYPE_CASES(CASE, A)                                      \
    CASE(ZN_DTYPE_F32, ZN_DTYPE_BF16, 0, A)                               \
    CASE(ZN_DTYPE_F32, ZN_DTYPE_BF16, 1, A)                               \
    CASE(ZN_DTYPE_F32, ZN_DTYPE_F16, 1, A)                                \
    CASE(ZN_DTYPE_BF16, ZN_DTYPE_BF16, 0, A)                              \
    CASE(ZN_DTYPE_BF16, ZN_DTYPE_BF16, 1, A)                              \
    CASE(ZN_DTYPE_BF16, ZN_DTYPE_F16, 1, A)                               \
    CASE(ZN_DTYPE_F16, ZN_DTYPE_BF16, 0, A)                               \
    CASE(ZN_DTYPE_F16, ZN_DTYPE_BF16, 1, A)                               \
    CASE(ZN_DTYPE_F16, ZN_DTYPE_F16, 1, A)

/* The step on bf16 moments, fused (any n): widen m and v, step them as the
 * path's adam kernel does, round them back (zn_bf16_round), in one pass
 * over memory. Optional (NULL: moments.c runs the pieces block by block);
 * the same bits as the pieces. */
typedef void (*zn_adam_bf16_fn)(const zn_adam_consts *k, float *p, uint16_t *m, uint16_t *v,
                                const void *g, zn_dtype g_dtype, void *c, zn_dtype c_dtype,
                                size_t n);

/* The bf16-master step (zn_adam_step_sr) on fp32 (mb 4) or bf16 (mb 2)
 * moments, fused (any n): widen p (and bf16 moments), step them as the
 * path's adam kernel does, round the moments to nearest even and p
 * stochastically with element i's bits zn_sr_hash(k1, k2, idx_lo + i) (the
 * caller keeps idx_lo + n within 2^32), in one pass over memory. Optional
 * (NULL: master_sr.c runs the pieces block by block); the same bits. */
typedef void (*zn_adam_sr_fn)(const zn_adam_consts *k, uint16_t *p, void *m, void *v, int mb,
                              const void *g, zn_dtype g_dtype, size_t n, uint32_t k1,
                              uint32_t k2, uint32_t idx_lo);

/* One block of the bf16-master step with 8-bit moments, fused (n <=
 * ZN_Q8_BLOCK): zn_q8_step_fn with p the bf16 master, rounded as
 * zn_adam_sr_fn rounds it (the caller keeps idx_lo + n within 2^32).
 * Optional (NULL: the pieces); the same bits. */
typedef void (*zn_q8_sr_step_fn)(const zn_adam_consts *k, uint16_t *p, uint8_t *mq, uint8_t *vq,
                                 float *am, float *av, const zn_q8_table *ts,
                                 const zn_q8_table *tu, const void *g, zn_dtype g_dtype,
                                 size_t n, uint32_t k1, uint32_t k2, uint32_t idx_lo);

typedef struct {
    zn_isa isa;
    const char *name;
    zn_adam_kernel_fn adam;
    zn_norm_chunk_fn norm_chunk;
    zn_rmw_fn rmw;
    zn_triad_fn triad;
    zn_q8_dequant_fn q8_dequant;
    zn_q8_quant_fn q8_quant;
    zn_bf16_widen_fn bf16_widen;
    zn_bf16_round_fn bf16_round;
    zn_rmw_mom_fn rmw_mom;
    zn_sr_round_fn sr_round;
    zn_q8_step_fn q8_step;
    zn_adam_bf16_fn adam_bf16;
    zn_adam_sr_fn adam_sr;
    zn_q8_sr_step_fn q8_sr_step;
} zn_optim_ops;

/* zn_adam_step_mom with an explicit path (tests, benchmark). */
int zn_adam_step_mom_with(const zn_optim_ops *ops, const zn_adam_params *hp, float *p,
                          const zn_moments *mv, const void *g, zn_dtype g_dtype, float g_scale,
                          void *c, zn_dtype c_dtype, size_t n);

/* zn_adam_step_sr with an explicit path (tests). */
int zn_adam_step_sr_with(const zn_optim_ops *ops, const zn_adam_params *hp, uint16_t *p,
                         const zn_moments *mv, const void *g, zn_dtype g_dtype, float g_scale,
                         uint64_t seed, uint64_t index0, size_t n);
int zn_adam_step_sr_spans_with(const zn_optim_ops *ops, const zn_adam_params *hp, uint16_t *p,
                               const zn_moments *mv, const void *g, zn_dtype g_dtype,
                               float g_scale, uint64_t seed, const zn_sr_span *spans,
                               size_t n_spans, size_t n);

/* The scalar forms of the four, shared by every table's tails and by the
 * scalar path (moments.c). */
void zn_q8_dequant_scalar(const uint8_t *q, const zn_q8_table *t, float absmax, float *out,
                          size_t n);
float zn_q8_quant_scalar(const float *x, const zn_q8_table *t, uint8_t *q, size_t n);
void zn_bf16_widen_scalar(const uint16_t *h, float *out, size_t n);
void zn_bf16_round_scalar(const float *x, uint16_t *out, size_t n);
void zn_rmw_mom_scalar(void *p, int pb, void *m, void *v, int mb, float *am, float *av,
                       const void *g, zn_dtype g_dtype, void *c, size_t n);
void zn_sr_round_scalar(const float *x, uint16_t *out, size_t n, uint32_t k1, uint32_t k2,
                        uint32_t idx_lo);

/* The fp32 Adam step in the vector paths' operation order (their FMAs as
 * fmaf, one rounding each): the scalar path of zn_adam_step_sr, so that
 * its stochastic rounding meets the same fp32 values as the vector
 * paths'. */
void zn_adam_fma_scalar_kernel(const zn_adam_consts *k, float *p, float *m, float *v,
                               const void *g, zn_dtype g_dtype, void *c, zn_dtype c_dtype,
                               size_t n);

/* One element's code: the formula every path follows. */
static inline uint8_t zn_q8_code(const zn_q8_table *t, float y)
{
    uint32_t key;
    memcpy(&key, &y, 4);
    uint8_t lo = t->key[key >> 16];
    return (uint8_t)(lo + (y > t->mid[lo]));
}

/* zn_q8_code from the cell table (the form the gathering paths follow;
 * tests/test_adam_q8.c checks it against zn_q8_code). y is in [-1, 1] or
 * NaN (code 0). */
static inline uint8_t zn_q8_code_cell(const zn_q8_table *t, float y)
{
    if (y != y)
        return 0;
    uint32_t u;
    memcpy(&u, &y, 4);
    uint32_t a = u & 0x7fffffffu, neg = u >> 31;
    a = a < t->cell_lo ? t->cell_lo : a;
    uint32_t w = t->cell[(a >> 16) - (t->cell_lo >> 16) + (neg ? t->cell_n : 0)];
    uint32_t lo = (a & 0xffffu) ^ (neg ? 0xffffu : 0u);
    return (uint8_t)((w & 0xffu) + (lo > w >> 16));
}

/* The code of x in a block whose scale operand is sv (zn_q8_scale_operand):
 * x / sv or x * sv, clamped to [-1, 1] (a NaN stays NaN, as the SIMD
 * max/min keep it), then its code. */
static inline uint8_t zn_q8_scaled_code(const zn_q8_table *t, float x, float sv)
{
    float y = t->divide ? x / sv : x * sv;
    y = -1.0f > y ? -1.0f : y;
    y = 1.0f < y ? 1.0f : y;
    return zn_q8_code(t, y);
}

/* Whether kernels may write the 16-bit copy with non-temporal stores (when
 * it is aligned and large); 1 by default. `zinc bench adam --nt-copy 0`
 * clears it to measure what they gain. */
extern int zn_optim_nt_copy;

/* Per-ISA tables (defined only when built; see src/optim/meson.build). */
extern const zn_optim_ops zn_optim_ops_scalar;
extern const zn_optim_ops zn_optim_ops_avx2;
extern const zn_optim_ops zn_optim_ops_avx512;

/* The VBMI forms of the 8-bit pieces (optim_avx512vbmi.c). */
extern const zn_q8_dequant_fn zn_q8_dequant_vbmi;
extern const zn_q8_quant_fn zn_q8_quant_vbmi;
extern const zn_q8_step_fn zn_q8_step_vbmi;
extern const zn_q8_sr_step_fn zn_q8_sr_step_vbmi;

/* The table of `isa` (ZN_ISA_AUTO: the one in use), or NULL when it is not
 * built in or the CPU lacks it. For ZN_ISA_AVX512 on a CPU with AVX-512
 * VBMI that is zn_optim_get_ops_vbmi()'s table, unless ZINC_SIMD_VBMI=0. */
const zn_optim_ops *zn_optim_get_ops(zn_isa isa);

/* The AVX-512 table with the VBMI 8-bit pieces (named "avx512vbmi"), or
 * NULL when not built in or the CPU lacks AVX-512 VBMI; whether or not
 * ZINC_SIMD_VBMI turned it off. zn_optim_get_ops_novbmi: the AVX-512 table
 * without them (NULL without AVX-512), for tests and the benchmark. */
const zn_optim_ops *zn_optim_get_ops_vbmi(void);
const zn_optim_ops *zn_optim_get_ops_novbmi(void);

/* The plain scalar loop of the benchmark (optim_plain.c, built without
 * vectorisation): fp32/bf16/fp16 grads, optional copy. */
void zn_adam_plain_kernel(const zn_adam_consts *k, float *p, float *m, float *v, const void *g,
                          zn_dtype g_dtype, void *c, zn_dtype c_dtype, size_t n);


/* zn_adam_step with an explicit kernel (tests, benchmark). */
int zn_adam_step_with(zn_adam_kernel_fn kern, const zn_adam_params *hp, float *p, float *m,
                      float *v, const void *g, zn_dtype g_dtype, float g_scale, void *c,
                      zn_dtype c_dtype, size_t n);

/* The threads that zn_adam_step uses for n elements when asked for
 * `threads` (0: OpenMP default): 1 below a size where a parallel region
 * costs more than it saves. */
int zn_optim_threads(int threads, size_t n);
/* range(arg, lo, hi) over [0, n) on nt OpenMP threads, each a run of whole
 * 8-bit blocks (ZN_Q8_BLOCK), or on this thread when nt <= 1. */
typedef void (*zn_range_fn)(const void *arg, size_t lo, size_t hi);
void zn_optim_by_blocks(int nt, size_t n, zn_range_fn range, const void *arg);

/* Element range [lo, hi) of thread `t` of `nt` over n elements: contiguous
 * blocks split on multiples of ZN_OPTIM_BLOCK elements, so that every split
 * starts on a whole vector and a whole cache line. The benchmark first-
 * touches its arrays with the same split. */
#define ZN_OPTIM_BLOCK ((size_t)64)
static inline void zn_optim_range(size_t n, int nt, int t, size_t *lo, size_t *hi)
{
    size_t nb = (n + ZN_OPTIM_BLOCK - 1) / ZN_OPTIM_BLOCK;
    size_t b0 = nb * (size_t)t / (size_t)nt, b1 = nb * (size_t)(t + 1) / (size_t)nt;
    *lo = b0 * ZN_OPTIM_BLOCK < n ? b0 * ZN_OPTIM_BLOCK : n;
    *hi = b1 * ZN_OPTIM_BLOCK < n ? b1 * ZN_OPTIM_BLOCK : n;
}

/* ---- scalar formulas (the reference for every SIMD path) ---------------- */

static inline uint32_t zn_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static inline float zn_bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* zn_f16_round and zn_f16_widen, like the bf16 pair, are zinc/util.h's. */

/* x need not be aligned to its element (UBSan reported a misaligned
 * float load here): memcpy, which compiles to one plain load. */
static inline float zn_load_elem(const void *x, zn_dtype t, size_t i)
{
    if (t == ZN_DTYPE_F32) {
        float f;
        memcpy(&f, (const char *)x + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)x + 2 * i, 2);
    return t == ZN_DTYPE_BF16 ? zn_bf16_widen(h) : zn_f16_widen(h);
}

static inline uint16_t zn_round_elem(float x, zn_dtype t)
{
    return t == ZN_DTYPE_BF16 ? zn_bf16_round(x) : zn_f16_round(x);
}

/* One element of the Adam step, without fused multiply-adds (the portable
 * path; the SIMD paths use FMA and may differ in the last bit). The bias
 * corrections are folded into step_size and eps (as torch.optim.Adam
 * does): lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps) equals
 * lr*sqrt(bc2)/bc1 * m / (sqrt(v) + eps*sqrt(bc2)), one multiply less.
 * The second moment is written as a step toward g*g (the lerp form torch
 * uses for exp_avg): b2*v + (1-b2)*g*g = v + (1-b2)*(g*g - v) in real
 * numbers, with omb2 the float nearest to 1 - beta2 (taken in double, as
 * torch does): the form uses omb2 alone, so its beta2 is 1 - omb2, within
 * half an ulp of omb2 of the user's beta2. With FMA that is two FMAs instead of two
 * multiplies and an FMA, and the multiply/FMA ports are what the AVX2 step
 * with a 16-bit copy runs short of. (The first moment keeps b1*m + omb1*g:
 * its lerp form m + omb1*(g - m) raised the worst error of tests/test_adam
 * from 4.7e-7 to 2.9e-6, over the 1e-6 bound. An infinite v becomes NaN at
 * the next step in the lerp form; before, v stayed Inf and froze p.) */
static inline void zn_adam_elem(const zn_adam_consts *k, float *pp, float *mp, float *vp, float g)
{
    float p = *pp, m = *mp, v = *vp;
    g = g * k->g_scale;
    if (k->use_l2)
        g = p * k->l2 + g;
    m = k->b1 * m + k->omb1 * g;
    v = v + k->omb2 * (g * g - v);
    float upd = m / (sqrtf(v) + k->eps);
    /* both decrements are summed before they meet p: one rounding at p's
     * magnitude per step instead of two */
    float dp = k->step_size * upd;
    if (k->use_decay)
        dp = p * k->decay + dp;
    p = p + dp;
    *pp = p;
    *mp = m;
    *vp = v;
}


/* mv's fp32 blocks (zn_moments.f32): none, or sorted disjoint non-empty
 * runs with their arrays (8-bit moments only); -EINVAL naming what is
 * wrong otherwise. */
int zn_q8_f32_check(const zn_moments *mv, size_t n);

/* The fp32 slot of block b of mv's range (zn_moments.f32), or -1 when the
 * block is quantized. */
static inline int64_t zn_q8_f32_slot(const zn_moments *mv, size_t b)
{
    if (!mv->n_f32)
        return -1;
    uint64_t gb = mv->f32_base + b;
    size_t lo = 0, hi = mv->n_f32;
    while (lo < hi) {
        size_t h = lo + (hi - lo) / 2;
        if (mv->f32[h].block + mv->f32[h].n <= gb)
            lo = h + 1;
        else
            hi = h;
    }
    if (lo < mv->n_f32 && mv->f32[lo].block <= gb)
        return (int64_t)(mv->f32[lo].slot + (gb - mv->f32[lo].block));
    return -1;
}

/* ---- stochastic rounding (the formulas the SIMD paths follow; the hash
 * and the rounding on bits live in util/hash-impl.h, shared with the
 * device's kernel) ----------------------------------------------------- */
/* x to bf16 adding r16 to its low half (zn_bf16_round_sr_bits) */
static inline uint16_t zn_bf16_round_sr(float x, uint32_t r16)
{
    return zn_bf16_round_sr_bits(zn_f32_bits(x), r16);
}

#endif
