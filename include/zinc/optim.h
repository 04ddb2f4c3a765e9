/* zinc CPU optimizer: the fused Adam/AdamW step that runs on offloaded fp32
 * master weights (OpenMP + AVX-512 / AVX2+FMA / scalar, chosen at run time),
 * the global gradient norm, and fp32 <-> bf16/fp16 conversion. */
#ifndef ZINC_OPTIM_H
#define ZINC_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Adam / AdamW ----------------------------------------------------------
 * Hyperparameters of one parameter group for one step. Semantics follow
 * DeepSpeed's cpu_adam (and torch.optim.Adam/AdamW):
 *   g  = grad * g_scale
 *   g += weight_decay * p                 (Adam, adamw_mode == 0, wd > 0)
 *   m  = beta1 * m + (1 - beta1) * g
 *   v  = beta2 * v + (1 - beta2) * g * g
 *   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
 *        + lr * weight_decay * p         (the second term: AdamW only,
 *                                          adamw_mode != 0, wd > 0)
 * with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step when bias_correction is
 * set, else bc1 = bc2 = 1. */
typedef struct {
    float lr;
    /* double, as PyTorch holds them: 1 - beta is taken in double and then
     * rounded (1 - 0.999 is 0.001f; 1 - 0.999f would be 1.3e-5 off it) */
    double beta1, beta2;
    float eps;
    float weight_decay;
    int adamw_mode;       /* nonzero: decoupled weight decay (AdamW) */
    int bias_correction;  /* nonzero: divide by 1 - beta^step */
    int64_t step;         /* 1 for the first step (count after incrementing) */
    int threads;          /* OpenMP threads; 0: omp_get_max_threads()
                             (OMP_NUM_THREADS). Results never depend on it. */
} zn_adam_params;

/* lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0, adamw_mode 1,
 * bias_correction 1, step 1, threads 0 (DeepSpeed's defaults). */
ZN_API zn_adam_params zn_adam_params_default(void);

/* One fused Adam/AdamW step over n elements, in one pass over memory: reads
 * p, g, m, v once and writes p, m, v (and p16_out) once.
 *   p, m, v   fp32 master weights and moments, updated in place.
 *   g         gradients of g_dtype (F32, BF16 or F16); multiplied by g_scale
 *             (1/loss_scale, 1/accumulation steps, clipping coefficient, or
 *             1) before use. Not modified.
 *   p16_out   optional (NULL): receives the updated p rounded to p16_dtype
 *             (BF16 or F16, round to nearest even, NaN stays a quiet NaN).
 *             p16_dtype is ignored when p16_out is NULL.
 * No alignment is required. The arrays must not overlap. Each element's
 * result depends only on its inputs and the selected SIMD path (see
 * zn_adam_set_isa): never on the thread count or on where threads split.
 * Returns 0; -EINVAL (with zn_last_error) for NULL arrays with n > 0, a bad
 * dtype, step < 1 with bias correction, a non-finite lr/eps/weight_decay/
 * g_scale, beta outside [0, 1), eps < 0; n == 0 is a no-op. */
ZN_API int zn_adam_step(const zn_adam_params *hp, float *p, float *m, float *v,
                        const void *g, zn_dtype g_dtype, float g_scale,
                        void *p16_out, zn_dtype p16_dtype, size_t n);

/* The per-call constants of one Adam step, computed once in double and
 * rounded to float, so that every path, every thread and the device
 * kernels (zn_dev_adam) use the same values. */
typedef struct {
    float b1, omb1;      /* beta1, 1 - beta1 (each rounded from double) */
    float b2, omb2;      /* beta2, 1 - beta2 */
    float step_size;     /* -lr * sqrt(1 - beta2^t) / (1 - beta1^t) */
    float eps;           /* eps * sqrt(1 - beta2^t) */
    float g_scale;
    float l2;            /* weight_decay (Adam L2 mode), used when use_l2 */
    float decay;         /* -lr * weight_decay (AdamW), used when use_decay */
    int use_l2, use_decay;
    int copy_stream;     /* 0: the kernels stream the 16-bit copy (non-
                            temporal stores) when it is long and aligned;
                            1: whenever aligned (zn_adam_step_mom calls them
                            per block of a long array) */
} zn_adam_consts;

/* Checks zn_adam_step's arguments and fills *out with the step's
 * constants. Returns 0 or -EINVAL with zn_last_error, as zn_adam_step. */
ZN_API int zn_adam_prepare(const zn_adam_params *hp, float *p, float *m, float *v,
                           const void *g, zn_dtype g_dtype, float g_scale, void *p16_out,
                           zn_dtype p16_dtype, size_t n, zn_adam_consts *out);

/* ---- Adam moments in fewer bytes --------------------------------------
 * The first and second moments of zn_adam_step may be kept as
 *   ZN_MOM_F32   fp32 (4 + 4 bytes per element): zn_adam_step itself;
 *   ZN_MOM_BF16  bf16 (2 + 2 bytes): widened exactly, stepped in fp32 as
 *                zn_adam_step does, rounded back to nearest even;
 *   ZN_MOM_Q8    8-bit blockwise (1 + 1 bytes, and 4 + 4 bytes per block
 *                of ZN_Q8_BLOCK elements): bitsandbytes' scheme. Each block
 *                of 256 elements stores one absmax per moment and a code
 *                per element, an index into a 256-entry dynamic map
 *                (zn_q8_map: signed for m, unsigned for v); the value is
 *                map[code] * absmax. After the step, a block's absmax is
 *                the largest |value| of its new moments, each value is
 *                scaled by 1/absmax, clamped to [-1, 1] and stored as the
 *                code of the nearest map entry (ties to the lower entry:
 *                bitsandbytes' CUDA rounding; its 0.50 CPU kernel looks
 *                the value up in a 65536-bin table instead, which differs
 *                near the map's midpoints and below 1.5e-5, see
 *                tests/test_adam_q8.c). A block whose absmax is 0 stores
 *                codes 0. The parameter update uses the unquantized new
 *                moments, as bitsandbytes does.
 * The master weights stay fp32. A zero-filled state (codes and absmax 0,
 * or bf16 zeros) is the initial state m = v = 0 in every format.
 *
 * 8-bit moments are quantized by one of two schemes (zn_moments.scheme).
 * Both store the same thing (codes into the same maps, a float scale per
 * block, value = map[code] * scale), so a state written by one is read by
 * the other unchanged:
 *   ZN_Q8_BNB      as above (bitsandbytes' AdamW8bit, and its CUDA
 *                  rounding);
 *   ZN_Q8_TORCHAO  torchao's AdamW8bit (the HF Trainer's adamw_torch_8bit):
 *                  the scale is max(absmax, 1e-12), so a zero block stores
 *                  1e-12 and the code of 0 and a block below 1e-12 is
 *                  quantized against 1e-12; the scaled value is x / scale;
 *                  the code is the nearest entry with ties going up, as
 *                  torchao decides it in float32 (x - map[lo] >=
 *                  (map[lo + 1] - map[lo]) * 0.5); and the step's bias
 *                  corrections are float32 powers of the float32 betas,
 *                  1 - (float)beta^step, as torchao computes them (1 -
 *                  0.999f is 1.3e-5 off 0.001: the first steps are up to
 *                  6.4e-6 larger than torch.optim.AdamW's). */
typedef enum { ZN_MOM_F32 = 0, ZN_MOM_BF16 = 1, ZN_MOM_Q8 = 2 } zn_mom_fmt;
typedef enum { ZN_Q8_BNB = 0, ZN_Q8_TORCHAO = 1 } zn_q8_scheme;

#define ZN_Q8_BLOCK 256

/* Blocks of 8-bit moments kept in fp32 instead: bitsandbytes and torchao
 * give a parameter tensor too small to quantize (bitsandbytes: under 4096
 * elements, its min_8bit_size; torchao: also one that is not whole blocks)
 * fp32 states. Blocks [block, block + n) of the caller's numbering; the
 * k-th keeps its moments at slot + k of zn_moments' m_f32 and v_f32. */
typedef struct {
    uint64_t block, n, slot;
} zn_q8_f32_run;

/* The moments of n elements. m, v: float[n] (F32), uint16_t[n] bf16 bits
 * (BF16), uint8_t[n] codes (Q8); m_absmax, v_absmax: float[
 * zn_q8_blocks(n)] (Q8 only, else ignored). For Q8 the elements start on
 * a block boundary: element i belongs to block i / ZN_Q8_BLOCK.
 * Q8 only, optional (n_f32 0: none): the blocks whose moments are fp32,
 * f32[0, n_f32) sorted and disjoint, in which this range's block b is
 * f32_base + b; a slot s holds elements [s * ZN_Q8_BLOCK, (s + 1) *
 * ZN_Q8_BLOCK) of m_f32 and v_f32. Such a block's codes and absmax are
 * neither read nor written. */
typedef struct {
    zn_mom_fmt fmt;
    void *m, *v;
    float *m_absmax, *v_absmax;
    zn_q8_scheme scheme;   /* Q8 only: how the step quantizes (0: bitsandbytes') */
    const zn_q8_f32_run *f32;
    size_t n_f32;
    uint64_t f32_base;
    float *m_f32, *v_f32;
    /* the device's step (zn_dev_adam_mom, zn_dev_adam_sr): a copy of
     * f32[0, n_f32) in device memory, which its kernel reads */
    const zn_q8_f32_run *f32_dev;
} zn_moments;

/* The moments of arrays m, v (and, 8-bit, absmax arrays am, av) with no
 * fp32 blocks. */
static inline zn_moments zn_moments_of(zn_mom_fmt fmt, void *m, void *v, float *am, float *av,
                                       zn_q8_scheme scheme)
{
    /* (every member, in order: C and C++ alike) */
    zn_moments r = { fmt, m, v, am, av, scheme, NULL, 0, 0, NULL, NULL, NULL };
    return r;
}

/* Whether a parameter tensor of numel elements keeps fp32 moments beside
 * 8-bit ones, as the references decide: bitsandbytes below its
 * min_8bit_size (4096); torchao also when it is not whole blocks. */
#define ZN_Q8_MIN_SIZE 4096
static inline int zn_q8_keeps_f32(uint64_t numel, zn_q8_scheme scheme)
{
    return numel < ZN_Q8_MIN_SIZE || (scheme == ZN_Q8_TORCHAO && numel % ZN_Q8_BLOCK);
}

static inline size_t zn_q8_blocks(size_t n)
{
    return (n + ZN_Q8_BLOCK - 1) / ZN_Q8_BLOCK;
}

/* Bytes of both moments of n elements (absmax included). */
ZN_API size_t zn_mom_bytes(zn_mom_fmt fmt, size_t n);
/* Bytes of one moment of n elements laid out in one buffer (the trainer's
 * memory, a checkpoint's m.bin / v.bin): fp32 n x 4; bf16 and 8-bit the
 * elements padded to 64 bytes, then (8-bit) the blocks' absmax. */
ZN_API size_t zn_mom_layout_bytes(zn_mom_fmt fmt, size_t n);
/* zn_mom_layout_bytes' parts: where the absmax starts (8-bit), and the
 * moments of elements [off, ...) (off on a block boundary for 8-bit) of
 * the buffers m and v holding n elements each in that layout. */
ZN_API size_t zn_mom_layout_absmax_at(zn_mom_fmt fmt, size_t n);
ZN_API zn_moments zn_mom_layout_at(zn_mom_fmt fmt, void *m, void *v, size_t n, size_t off);
/* The format named "fp32", "bf16" or "int8"; -1 for another name. */
ZN_API int zn_mom_fmt_parse(const char *name);
/* "fp32", "bf16", "int8"; "?" for other values. */
ZN_API const char *zn_mom_fmt_name(zn_mom_fmt fmt);

/* zn_adam_step with the moments in mv->fmt. The result of an element
 * depends only on its inputs, its block's moments (Q8) and the SIMD path:
 * never on the thread count. Q8 threads split on whole blocks. Returns as
 * zn_adam_step; -EINVAL also for a bad format, a NULL absmax or an unknown
 * scheme (Q8). */
ZN_API int zn_adam_step_mom(const zn_adam_params *hp, float *p, const zn_moments *mv,
                            const void *g, zn_dtype g_dtype, float g_scale, void *p16_out,
                            zn_dtype p16_dtype, size_t n);

/* What an 8-bit moment's rounding is, for a step that runs elsewhere (the
 * device op zn_dev_adam_mom): the map, the code boundaries (a value y
 * scaled into [-1, 1] gets the count of mid[0..254] strictly below it),
 * the scale's floor and whether values are divided by the scale (torchao)
 * or multiplied by its float reciprocal (bitsandbytes). */
typedef struct {
    float map[256], mid[256];
    float floor;
    int divide;
} zn_q8_rounding;

/* The rounding of a scheme's signed (m) or unsigned (v) map. Returns 0 or
 * -EINVAL for an unknown scheme. */
ZN_API int zn_q8_rounding_get(zn_q8_scheme scheme, int is_signed, zn_q8_rounding *out);

/* zn_adam_step_mom's checks and constants (with torchao's bias
 * corrections for its scheme), for a step that runs elsewhere. Returns 0 or
 * -EINVAL as zn_adam_step_mom. */
ZN_API int zn_adam_prepare_mom(const zn_adam_params *hp, float *p, const zn_moments *mv,
                               const void *g, zn_dtype g_dtype, float g_scale, void *p16_out,
                               zn_dtype p16_dtype, size_t n, zn_adam_consts *k);

/* bitsandbytes' dynamic quantization maps (create_dynamic_map), sorted,
 * 256 entries: signed (m; -0.99297 .. 1, 0 at code 127) and unsigned (v;
 * 0 .. 1, 0 at code 0). */
ZN_API const float *zn_q8_map(int is_signed);

/* Converts the moments of n elements between formats (checkpoints saved
 * with one format and resumed with another; the same format: a copy, Q8
 * whatever the schemes). To Q8 quantizes as the step does with dst's
 * scheme; to BF16 rounds to nearest even; from either widens exactly. dst
 * and src must not overlap. Returns 0 or -EINVAL. */
ZN_API int zn_mom_convert(const zn_moments *dst, const zn_moments *src, size_t n);

/* ---- bf16 master weights with stochastic rounding ------------------------
 * The second, explicit choice beside the fp32 master (train.master_weights
 * "bf16_sr", torchao's _AdamW(bf16_stochastic_round=True)): the parameters
 * are kept in bf16 only, 2 bytes instead of 4 + 2. Each step widens p
 * (exactly), runs the fp32 Adam step of the chosen SIMD path on it (the
 * scalar path takes the FMA form of the vector paths, so all three give
 * the same fp32 result) and stores the result rounded stochastically:
 * the 16 low bits of the fp32 magnitude are added to 16 random bits and
 * the sum truncated, so the result is one of the two bf16 neighbours of
 * the fp32 value, the upper one with probability (low bits) / 65536:
 * unbiased in expectation, where round to nearest would drop every update
 * smaller than half an ulp of p.
 * The random bits are a counter-based hash of (seed, step, index0 + i):
 * no state, so the result is the same for every thread count, placement
 * and SIMD path, and a resumed run draws the same bits.
 * Rules at the edges: NaN stays NaN (quiet, its top bits kept) and +-Inf
 * stays +-Inf, as zn_f32_to_bf16; a finite value never becomes Inf: a
 * round up past the largest finite bf16 (3.3895e38) stays at it (round to
 * nearest sends values from 3.3961e38 up to Inf; stochastic rounding
 * saturates instead, which is never more overflow than round to nearest);
 * zero and subnormals round like any other value (their bf16 steps are
 * evenly spaced). */

/* The 16 random bits of element `index` at step `step` of a run seeded
 * with `seed` (the value the rounding adds to the low half). */
ZN_API uint32_t zn_sr_bits(uint64_t seed, int64_t step, uint64_t index);

/* x rounded to bf16 with the random bits r16 (< 65536) by the rules
 * above. */
ZN_API uint16_t zn_f32_to_bf16_sr(float x, uint32_t r16);

/* zn_adam_step_mom on bf16 master weights p (updated in place, by
 * stochastic rounding), with no separate 16-bit copy: p is the working
 * copy. index0 is the global index of p[0] in the model (the hash's
 * counter), seed the run's seed. Returns as zn_adam_step_mom. */
ZN_API int zn_adam_step_sr(const zn_adam_params *hp, uint16_t *p, const zn_moments *mv,
                           const void *g, zn_dtype g_dtype, float g_scale, uint64_t seed,
                           uint64_t index0, size_t n);

/* A run of p's elements whose indices in the model follow each other:
 * p[off + j] is element index + j, for j < n. */
typedef struct {
    uint64_t off, n;
    uint64_t index;
} zn_sr_span;

/* zn_adam_step_sr on elements whose indices in the model come in runs (a
 * rank's share of the model is pieces of the blocks' shards, with the
 * other ranks' shares between them): span i names the index of p[off,
 * off + n). The spans are in order and back to back, each of one element
 * or more, from 0 to n. Only the rounding bits follow them: an 8-bit
 * moment's block of 256 elements is stepped whole across a span's edge
 * (its absmax covers them all). One span {0, n, index0} is
 * zn_adam_step_sr. Returns as zn_adam_step_sr, and -EINVAL for spans that
 * do not cover [0, n) so. */
ZN_API int zn_adam_step_sr_spans(const zn_adam_params *hp, uint16_t *p, const zn_moments *mv,
                                 const void *g, zn_dtype g_dtype, float g_scale, uint64_t seed,
                                 const zn_sr_span *spans, size_t n_spans, size_t n);

/* SIMD paths. ZN_ISA_AUTO picks the one that is fastest on this CPU
 * (zn_adam_isa_reason says why); the environment variable ZINC_SIMD=avx512|avx2|scalar|auto sets
 * the starting choice (an unknown or unsupported value is warned about and
 * ignored). AVX-512 needs AVX512F+BW+VL; AVX2 needs AVX2+FMA+F16C. */
typedef enum { ZN_ISA_AUTO = 0, ZN_ISA_SCALAR = 1, ZN_ISA_AVX2 = 2, ZN_ISA_AVX512 = 3 } zn_isa;

/* Forces a path for zn_adam_step and zn_grad_norm_sq (process wide; call
 * it while no step runs). Returns 0, or ZN_EUNSUPPORTED (path
 * not built in or not supported by this CPU; the choice is unchanged) or
 * -EINVAL (not a zn_isa value). */
ZN_API int zn_adam_set_isa(zn_isa isa);

/* The path in use now (never ZN_ISA_AUTO) and its name ("avx512", "avx2",
 * "scalar"). */
ZN_API zn_isa zn_adam_get_isa(void);
ZN_API const char *zn_adam_isa_name(void);
/* Why that path: the rule auto follows on this CPU (AVX2 on Intel, which
 * reaches the memory roofline with it and not with AVX-512; otherwise the
 * widest path), "ZINC_SIMD", or "set by the program". A static string. */
ZN_API const char *zn_adam_isa_reason(void);

/* Whether `isa` is built in and supported by this CPU (SCALAR always is).
 * zn_isa_name(isa) names any value ("auto", ..., "?"). */
ZN_API int zn_adam_isa_available(zn_isa isa);
ZN_API const char *zn_isa_name(zn_isa isa);

/* ---- global gradient norm ----------------------------------------------
 * One tensor (or a slice of one) for zn_grad_norm_sq. */
typedef struct {
    const void *data;
    size_t n;            /* elements */
    zn_dtype dtype;      /* F32, BF16 or F16 */
} zn_grad_span;

/* Sum of the squares of every element of every span, accumulated in double
 * (each square of a 16- or 32-bit float is exact in double). The order of
 * additions is fixed by the data alone, so the result is bit-identical for
 * any thread count and for every SIMD path. `threads` as in zn_adam_params.
 * *out_nonfinite (optional) is set to 1 when some element is NaN or Inf
 * (then *out_sq is NaN or Inf), else 0: the fp16 overflow check.
 * Returns 0, -EINVAL (NULL spans or data with n > 0, bad dtype, NULL
 * out_sq), -ENOMEM. */
ZN_API int zn_grad_norm_sq(const zn_grad_span *spans, size_t nspans, int threads,
                           double *out_sq, int *out_nonfinite);

/* The pieces of zn_grad_norm_sq, for sums of squares computed elsewhere
 * (zn_dev_norm_sq_chunks on a device): a tensor is cut into chunks of
 * ZN_GRAD_NORM_CHUNK elements, each summed in a fixed 16-lane order, and
 * zn_grad_norm_combine adds the chunk sums of all tensors (in tensor order)
 * in a fixed pairwise tree. Combining a tensor's device chunk sums gives
 * the bits zn_grad_norm_sq gives for it. */
#define ZN_GRAD_NORM_CHUNK ((size_t)1 << 14)
ZN_API double zn_grad_norm_combine(const double *chunk_sums, size_t n);
/* The canonical sum of squares of x[0, n), n <= ZN_GRAD_NORM_CHUNK. */
ZN_API double zn_grad_norm_chunk(const float *x, size_t n);

/* ---- fp32 <-> bf16 / fp16 ----------------------------------------------
 * fp32 -> 16 bit rounds to nearest, ties to even; overflow goes to Inf;
 * subnormals are kept (no flush to zero); a NaN stays NaN with its sign and
 * the top payload bits, and is made quiet (as x86's vcvtps2ph does).
 * 16 bit -> fp32 is exact (an fp16 NaN is made quiet, as vcvtph2ps does;
 * bf16 -> fp32 keeps every bit). */
ZN_API uint16_t zn_f32_to_bf16(float x);
ZN_API float zn_bf16_to_f32(uint16_t h);
ZN_API uint16_t zn_f32_to_f16(float x);
ZN_API float zn_f16_to_f32(uint16_t h);

/* Converts n elements between any two zn_dtype types (same type: a copy),
 * with the rounding above, in parallel for large n. dst and src must not
 * overlap unless they are equal and the types are equal. Returns 0 or
 * -EINVAL. */
ZN_API int zn_convert(void *dst, zn_dtype dst_dtype, const void *src, zn_dtype src_dtype,
                      size_t n);

/* ---- the schedule around the optimizer: learning rate and fp16 loss scale
 * (src/optim/lr.c, scaler.c). Pure functions of their settings and the
 * step, so any step can be recomputed (resume, tests). */
typedef enum {
    ZN_SCHED_NONE = 0, ZN_SCHED_WARMUP_LR, ZN_SCHED_WARMUP_DECAY_LR, ZN_SCHED_WARMUP_COSINE_LR,
    /* the HF Trainer's schedules (transformers get_scheduler): linear warmup
     * from 0 over warmup_num_steps, then as named, on optimizer.lr */
    ZN_SCHED_HF_LINEAR, ZN_SCHED_HF_COSINE, ZN_SCHED_HF_CONSTANT_WARMUP,
} zn_scheduler_type;

typedef struct {
    zn_scheduler_type type;
    double warmup_min_lr, warmup_max_lr;  /* WarmupLR, WarmupDecayLR */
    int64_t warmup_num_steps;
    int64_t total_num_steps;              /* WarmupDecayLR, WarmupCosineLR */
    int warmup_type;                      /* 0 "log" (DeepSpeed's default), 1 "linear" */
    double warmup_min_ratio, cos_min_ratio; /* WarmupCosineLR */
} zn_lr_sched;

typedef struct {
    bool enabled;
    double loss_scale; /* 0 = dynamic */
    int initial_scale_power;
    int64_t loss_scale_window;
    int hysteresis;
    double min_loss_scale;
} zn_loss_scale_config;

/* ---- learning-rate schedules ---------------------------------------------
 * DeepSpeed's lr_schedules.py formulas, as a function of DeepSpeed's
 * `last_batch_iteration` (0-based). WarmupLR: min + (max-min) * gamma,
 * gamma = log(it+1)/log(W) ("log") or it/W ("linear") while it < W, then 1;
 * W = max(2, warmup_num_steps). WarmupDecayLR: the same warmup, then
 * max(0, (T - it) / max(1, T - W)). WarmupCosineLR: ratio of base_lr, warmup
 * from warmup_min_ratio to 1, then cos_min_ratio + (1 - cos_min_ratio) *
 * (1 + cos(pi * (it - W + 1) / (T - W))) / 2, floored at 0. No scheduler:
 * base_lr. iteration < 0 gives DeepSpeed's value before its first step
 * (warmup_min_lr, or 0 for WarmupCosineLR).
 * zinc's optimizer step k (1-based) uses iteration k - 1. (DeepSpeed's engine
 * steps the scheduler after the optimizer, so its step k uses iteration
 * k - 2 and its first step the pre-start value; zinc does not spend a step
 * at that value.) */
ZN_API double zn_lr_schedule(const zn_lr_sched *s, double base_lr, int64_t iteration);

/* ---- dynamic loss scaling (fp16) -------------------------------------------
 * DeepSpeed's DynamicLossScaler: on overflow the step is skipped and, once
 * `hysteresis` overflows have been absorbed, the scale is divided by 2 (not
 * below min_scale); after `window` steps without overflow it is doubled
 * (and the hysteresis budget refilled). A static scale (fp16.loss_scale > 0)
 * never changes; overflowed steps are still skipped. */
typedef struct {
    double scale;
    int dynamic;
    double factor;          /* 2 */
    int64_t window;         /* loss_scale_window */
    int hysteresis;         /* delayed shift */
    int cur_hysteresis;
    double min_scale;
    int64_t iter, last_overflow_iter;
    uint64_t overflows;     /* steps skipped */
} zn_loss_scaler;

/* Initialises from the config (scale 2^initial_scale_power when dynamic;
 * scale 1 and dynamic 0 when fp16 is off). */
ZN_API void zn_loss_scaler_init(zn_loss_scaler *ls, const zn_loss_scale_config *cfg);
/* Records one step's outcome. Returns 1 when an overflow happened with the
 * scale already at min_scale (DeepSpeed stops the run there; so does
 * zn_train_step), else 0. */
ZN_API int zn_loss_scaler_update(zn_loss_scaler *ls, int overflow);

#ifdef __cplusplus
}
#endif
#endif
