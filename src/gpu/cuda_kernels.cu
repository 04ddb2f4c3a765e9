// CUDA kernels of the device layer: the generic ones (fill, element-wise
// arithmetic, casts, dropout, sums, column sums, the optimizer) and
// zn_cuda_run_kernel, which hands the decoder's ops to cuda_nn.cu and the
// fused attention to cuda_flash.cu. Each kernel follows its C reference in
// host_kernels.c: fp32 math, bf16 stored as uint16 with the same rounding,
// reductions as fixed-shape trees (deterministic: no floating-point atomics;
// column sums go through per-chunk partials summed in a fixed order).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "gpu/cuda-impl.cuh"
#include "util/hash-impl.h"

namespace {

constexpr int kReduceBlocks = 256; // fixed grid of the two-phase reductions

// ---- simple element-wise kernels -------------------------------------------
__global__ void k_fill(void *x, int dt, int64_t n, float v)
{
    GRID_STRIDE(i, n) stv(x, dt, i, v);
}

__global__ void k_scale2d(void *c, int dt, int64_t m, int64_t n, int64_t ld, float beta)
{
    GRID_STRIDE(i, m * n)
    {
        int64_t o = (i / n) * ld + i % n;
        stv(c, dt, o, beta == 0.0f ? 0.0f : beta * ldv(c, dt, o));
    }
}

__global__ void k_dropout(const void *x, int xdt, int64_t ldx, void *y, int ydt, int64_t ldy,
                          int64_t rows, int64_t cols, uint64_t key, uint32_t thr, float sc,
                          int accumulate)
{
    GRID_STRIDE(i, rows * cols)
    {
        const int64_t r = i / cols, c = i - r * cols;
        const int64_t xi = r * ldx + c, yi = r * ldy + c;
        float v = thr == 0 || zn_draw24(key, (uint64_t)i) >= thr ? ldv(x, xdt, xi) * sc : 0.0f;
        if (accumulate)
            v = ldv(y, ydt, yi) + v;
        stv(y, ydt, yi, v);
    }
}

__global__ void k_add(const void *a, const void *b, void *y, int dt, int64_t n)
{
    GRID_STRIDE(i, n) stv(y, dt, i, ldv(a, dt, i) + ldv(b, dt, i));
}

__global__ void k_axpy(float alpha, const void *x, int xdt, void *y, int ydt, int64_t n)
{
    GRID_STRIDE(i, n) stv(y, ydt, i, ldv(y, ydt, i) + alpha * ldv(x, xdt, i));
}

__global__ void k_scale(void *x, int dt, int64_t n, float alpha)
{
    GRID_STRIDE(i, n) stv(x, dt, i, alpha * ldv(x, dt, i));
}

__global__ void k_bias_add(void *y, int ydt, int64_t ld, const void *bias, int bdt,
                           int64_t rows, int64_t cols)
{
    GRID_STRIDE(i, rows * cols)
    {
        int64_t r = i / cols, c = i % cols, o = r * ld + c;
        stv(y, ydt, o, ldv(y, ydt, o) + ldv(bias, bdt, c));
    }
}

__global__ void k_cast(const void *x, int xdt, void *y, int ydt, int64_t n)
{
    GRID_STRIDE(i, n) stv(y, ydt, i, ldv(x, xdt, i));
}

// ---- reductions ------------------------------------------------------------
// Sum (or sum of squares): kReduceBlocks partials, then one block adds them
// in index order in double.
__global__ void k_reduce_part(const void *x, int dt, int64_t n, int square, float *part)
{
    float acc = 0.0f;
    GRID_STRIDE(i, n)
    {
        float v = ldv(x, dt, i);
        acc += square ? v * v : v;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0)
        part[blockIdx.x] = acc;
}

__global__ void k_reduce_final(const float *part, int nparts, float *out, int accumulate)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        double acc = 0.0;
        for (int i = 0; i < nparts; i++)
            acc += part[i];
        if (accumulate)
            acc += *out;
        *out = (float)acc;
    }
}

// Column sums in two phases. Phase 1: chunk c of the rows, column j ->
// part[c * cols + j]. mode 0: sum dy; mode 1: sum dy * x * rstd[row].
// Row r sits at r / heads rows of ld (ldx in x) and r % heads groups of
// cols in: a per-head norm's groups (heads 1: plain rows).
__global__ void k_colsum_part(const void *dy, int dydt, int64_t ld, const void *x, int xdt,
                              const float *rstd, int mode, int64_t rows, int64_t cols,
                              int64_t rows_per_chunk, float *part, int64_t heads, int64_t ldx)
{
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t c = blockIdx.y;
    if (j >= cols)
        return;
    int64_t r0 = c * rows_per_chunk, r1 = r0 + rows_per_chunk;
    if (r1 > rows)
        r1 = rows;
    float acc = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t in = r % heads * cols + j;
        float v = ldv(dy, dydt, r / heads * ld + in);
        if (mode == 1)
            v *= ldv(x, xdt, r / heads * ldx + in) * rstd[r];
        acc += v;
    }
    part[c * cols + j] = acc;
}

__global__ void k_colsum_final(const float *part, int64_t chunks, int64_t cols, float *out)
{
    GRID_STRIDE(j, cols)
    {
        float acc = 0.0f;
        for (int64_t c = 0; c < chunks; c++)
            acc += part[c * cols + j];
        out[j] += acc;
    }
}

// Chunks for a two-phase column sum: as many as fit the scratch, at most 64.
int64_t col_chunks(int64_t rows, int64_t cols)
{
    int64_t ch = (int64_t)ZN_CUDA_SCRATCH / cols;
    if (ch > 64)
        ch = 64;
    if (ch > rows)
        ch = rows;
    return ch > 0 ? ch : 1;
}

// ---- the optimizer ---------------------------------------------------------
// Adam/AdamW in the operation order of the CPU's FMA paths (optim_avx2.c
// step8): explicit round-to-nearest intrinsics, so that nvcc's contraction
// cannot regroup it, and IEEE sqrt and division (__fsqrt_rn, __fdiv_rn).
struct AdamK {
    float b1, omb1, b2, omb2, step, eps, gs, l2, decay;
    int use_l2, use_decay;
};

// One element: p, m, v updated in place from g.
__device__ __forceinline__ void adam1(const AdamK &k, float &pv, float &mv, float &vv, float gv)
{
    if (k.gs != 1.0f)
        gv = __fmul_rn(gv, k.gs);
    if (k.use_l2)
        gv = __fmaf_rn(pv, k.l2, gv);
    mv = __fmaf_rn(k.b1, mv, __fmul_rn(k.omb1, gv));
    vv = __fmaf_rn(k.omb2, __fmaf_rn(gv, gv, -vv), vv);
    float upd = __fdiv_rn(mv, __fadd_rn(__fsqrt_rn(vv), k.eps));
    if (k.use_decay)
        pv = __fadd_rn(pv, __fmaf_rn(pv, k.decay, __fmul_rn(k.step, upd)));
    else
        pv = __fmaf_rn(k.step, upd, pv);
}

// The parameter as the step sees it: fp32, or the bf16 master
// (train.master_weights bf16_sr, zn_adam_step_sr_spans) widened exactly
// and rounded back with the random bits of (seed, step, its index in the
// model, from the span that holds it), util/hash-impl.h's formulas as the
// CPU computes them.
struct ParamF32 {
    float *p;
    __device__ __forceinline__ float load(int64_t i) const { return p[i]; }
    __device__ __forceinline__ void store(int64_t i, float x) const { p[i] = x; }
};

struct ParamSR {
    uint16_t *p;
    const zn_sr_span *spans;
    int64_t n_spans;
    uint64_t seed;
    int64_t step;
    __device__ __forceinline__ float load(int64_t i) const
    {
        return __uint_as_float((uint32_t)p[i] << 16);
    }
    __device__ __forceinline__ void store(int64_t i, float x) const
    {
        int64_t lo = 0, hi = n_spans - 1;   // the last span starting at or before i
        while (lo < hi) {
            int64_t mid = (lo + hi + 1) / 2;
            if (spans[mid].off <= (uint64_t)i)
                lo = mid;
            else
                hi = mid - 1;
        }
        uint64_t idx = spans[lo].index + ((uint64_t)i - spans[lo].off);
        uint32_t k1, k2;
        zn_sr_key(seed, step, (uint32_t)(idx >> 32), &k1, &k2);
        p[i] = zn_bf16_round_sr_bits(__float_as_uint(x), zn_sr_hash(k1, k2, (uint32_t)idx));
    }
};

template <typename P>
__global__ void k_adam(AdamK k, P p, float *m, float *v, const float *g, uint16_t *c, int64_t n)
{
    GRID_STRIDE(i, n) {
        float pv = p.load(i), mv = m[i], vv = v[i];
        adam1(k, pv, mv, vv, g[i]);
        p.store(i, pv);
        m[i] = mv;
        v[i] = vv;
        if (c)
            c[i] = f2bf(pv);
    }
}

// bf16 moments (zn_adam_step_mom, ZN_MOM_BF16): widened exactly, stepped
// as k_adam, rounded back to nearest even.
template <typename P>
__global__ void k_adam_bf16mom(AdamK k, P p, uint16_t *m, uint16_t *v, const float *g,
                               uint16_t *c, int64_t n)
{
    GRID_STRIDE(i, n) {
        float pv = p.load(i);
        float mv = __uint_as_float((uint32_t)m[i] << 16), vv = __uint_as_float((uint32_t)v[i] << 16);
        adam1(k, pv, mv, vv, g[i]);
        p.store(i, pv);
        m[i] = f2bf(mv);
        v[i] = f2bf(vv);
        if (c)
            c[i] = f2bf(pv);
    }
}

// 8-bit blockwise moments (zn_adam_step_mom, ZN_MOM_Q8): one thread block
// of ZN_Q8_BLOCK threads per quantization block. Dequantize (map[code] *
// scale), step as k_adam, the block's largest |m| and |v| (a max, so the
// order of the reduction does not matter; a NaN is passed over as the
// CPU's `a > amax` does), then each code by the CPU's rule: the value
// scaled (x * (1 / scale), or x / scale for torchao), clamped to [-1, 1],
// and the count of the rounding's midpoints strictly below it.
struct Q8Round {
    float map[256], mid[256];
    float floor;
    int divide;
};
static_assert(sizeof(Q8Round) == sizeof(zn_q8_rounding), "Q8Round mirrors zn_q8_rounding");
static_assert(ZN_Q8_BLOCK == kThreads, "one thread per element of a quantization block");

__device__ __forceinline__ float q8_scale(const Q8Round &r, float amax)
{
    return amax > r.floor ? amax : r.floor;
}

__device__ __forceinline__ uint8_t q8_code(const float *mid, const Q8Round &r, float x, float sv)
{
    float y = r.divide ? __fdiv_rn(x, sv) : __fmul_rn(x, sv);
    y = -1.0f > y ? -1.0f : y;
    y = 1.0f < y ? 1.0f : y;
    int lo = 0, hi = 255;
    while (lo < hi) {
        int h = (lo + hi) / 2;
        if (mid[h] < y)
            lo = h + 1;
        else
            hi = h;
    }
    return (uint8_t)lo;
}

// The blocks kept in fp32 (zn_moments.f32: a tensor too small to
// quantize): the runs, this call's first block's number in them, and the
// slots' moments.
struct Q8F32 {
    const zn_q8_f32_run *runs;
    int64_t n;
    uint64_t base;
    float *m, *v;
};

template <typename P>
__global__ void k_adam_q8(AdamK k, Q8Round rm, Q8Round rv, Q8F32 f, P p, uint8_t *mq,
                          uint8_t *vq, float *am, float *av, const float *g, uint16_t *c,
                          int64_t n)
{
    __shared__ float mid_m[256], mid_v[256], red_m[kThreads], red_v[kThreads];
    int64_t b = blockIdx.x, i = b * ZN_Q8_BLOCK + threadIdx.x;
    bool in = i < n;
    if (f.n) {
        // the run that holds this block, if any (the same for all its
        // threads: the whole block takes one branch)
        uint64_t gb = f.base + (uint64_t)b;
        int64_t lo = 0, hi = f.n;
        while (lo < hi) {
            int64_t h = (lo + hi) / 2;
            if (f.runs[h].block + f.runs[h].n <= gb)
                lo = h + 1;
            else
                hi = h;
        }
        if (lo < f.n && f.runs[lo].block <= gb) {
            uint64_t at = (f.runs[lo].slot + (gb - f.runs[lo].block)) * ZN_Q8_BLOCK + threadIdx.x;
            if (in) {
                float pv = p.load(i), mv = f.m[at], vv = f.v[at];
                adam1(k, pv, mv, vv, g[i]);
                p.store(i, pv);
                f.m[at] = mv;
                f.v[at] = vv;
                if (c)
                    c[i] = f2bf(pv);
            }
            return;
        }
    }
    mid_m[threadIdx.x] = rm.mid[threadIdx.x];
    mid_v[threadIdx.x] = rv.mid[threadIdx.x];
    float pv = 0, mv = 0, vv = 0;
    if (in) {
        pv = p.load(i);
        mv = __fmul_rn(rm.map[mq[i]], am[b]);
        vv = __fmul_rn(rv.map[vq[i]], av[b]);
        adam1(k, pv, mv, vv, g[i]);
        p.store(i, pv);
        if (c)
            c[i] = f2bf(pv);
    }
    float a = fabsf(mv), e = fabsf(vv);
    red_m[threadIdx.x] = in && a > 0.0f ? a : 0.0f;
    red_v[threadIdx.x] = in && e > 0.0f ? e : 0.0f;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) {
            float x = red_m[threadIdx.x + s], y = red_v[threadIdx.x + s];
            red_m[threadIdx.x] = x > red_m[threadIdx.x] ? x : red_m[threadIdx.x];
            red_v[threadIdx.x] = y > red_v[threadIdx.x] ? y : red_v[threadIdx.x];
        }
        __syncthreads();
    }
    float sm = q8_scale(rm, red_m[0]), sv = q8_scale(rv, red_v[0]);
    if (in) {
        mq[i] = sm == 0.0f ? 0 : q8_code(mid_m, rm, mv, rm.divide ? sm : __fdiv_rn(1.0f, sm));
        vq[i] = sv == 0.0f ? 0 : q8_code(mid_v, rv, vv, rv.divide ? sv : __fdiv_rn(1.0f, sv));
    }
    if (threadIdx.x == 0) {
        am[b] = sm;
        av[b] = sv;
    }
}

// The step's constants (zn_adam_prepare's) as the kernels take them.
template <typename A>
AdamK adam_k(const A &adam)
{
    return AdamK{ adam.b1, adam.omb1, adam.b2, adam.omb2, adam.step, adam.eps,
                  adam.g_scale, adam.l2, adam.decay, adam.use_l2, adam.use_decay };
}

// The step with bf16 or 8-bit moments, for either kind of parameter.
template <typename A, typename P>
cudaError_t adam_mom(const char **what, cudaStream_t st, const A &adam, P p, uint16_t *c)
{
    if (adam.mv.fmt == ZN_MOM_BF16)
        return launch(what, "k_adam_bf16mom", k_adam_bf16mom<P>, grid_for(adam.n), st,
                      adam_k(adam), p, (uint16_t *)adam.mv.m, (uint16_t *)adam.mv.v, adam.g, c,
                      adam.n);
    Q8Round rm, rv;   // the kernel's parameters (4 KiB together), copied at launch
    if (zn_q8_rounding_get(adam.mv.scheme, 1, (zn_q8_rounding *)&rm) ||
        zn_q8_rounding_get(adam.mv.scheme, 0, (zn_q8_rounding *)&rv))
        return cudaErrorInvalidValue;
    Q8F32 f = { adam.mv.f32_dev, (int64_t)adam.mv.n_f32, adam.mv.f32_base, adam.mv.m_f32,
                adam.mv.v_f32 };
    return launch_rows(what, "k_adam_q8", k_adam_q8<P>, (int64_t)zn_q8_blocks((size_t)adam.n),
                       st, adam_k(adam), rm, rv, f, p, (uint8_t *)adam.mv.m,
                       (uint8_t *)adam.mv.v, adam.mv.m_absmax, adam.mv.v_absmax, adam.g, c,
                       adam.n);
}

// Sums of squares by chunks of kNormChunk elements in zn_grad_norm_sq's
// order: lane j (of 16) adds the squares of elements j, j + 16, ... in
// double, one after another; then for s = 8, 4, 2, 1: acc[j] += acc[j + s].
// A block of 256 threads does 16 chunks; each half-warp reads 64
// contiguous bytes per round.
constexpr int64_t kNormChunk = (int64_t)ZN_GRAD_NORM_CHUNK;

__global__ void k_norm_chunks(const float *x, int64_t n, double *out)
{
    __shared__ double acc[kThreads];
    int64_t c = (int64_t)blockIdx.x * (kThreads / 16) + threadIdx.x / 16;
    int lane = threadIdx.x % 16;
    int64_t base = c * kNormChunk;
    int64_t len = base < n ? (n - base < kNormChunk ? n - base : kNormChunk) : 0;
    double a = 0;
    for (int64_t i = lane; i < len; i += 16) {
        double d = (double)x[base + i];
        a = __dadd_rn(a, __dmul_rn(d, d));  // the square is exact in double
    }
    acc[threadIdx.x] = a;
    __syncthreads();
    if (lane == 0 && len > 0) {
        double *A = acc + threadIdx.x;
        for (int s = 8; s >= 1; s /= 2)
            for (int j = 0; j < s; j++)
                A[j] = __dadd_rn(A[j], A[j + s]);
        out[c] = A[0];
    }
}

} // namespace

cudaError_t zn_cuda_colsum(cudaStream_t st, const void *dy, int dydt, int64_t ld, const void *x,
                           int xdt, const float *rstd, int mode, int64_t rows, int64_t cols,
                           float *scratch, float *out, int64_t heads, int64_t ldx)
{
    if ((uint64_t)cols > ZN_CUDA_SCRATCH || heads < 1)
        return cudaErrorInvalidValue;
    int64_t ch = col_chunks(rows, cols), rpc = (rows + ch - 1) / ch;
    ch = (rows + rpc - 1) / rpc;
    dim3 g((unsigned)((cols + kThreads - 1) / kThreads), (unsigned)ch);
    k_colsum_part<<<g, kThreads, 0, st>>>(dy, dydt, ld, x, xdt, rstd, mode, rows, cols, rpc,
                                          scratch, heads, ldx);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    k_colsum_final<<<grid_for(cols), kThreads, 0, st>>>(scratch, ch, cols, out);
    return cudaGetLastError();
}

// The generic ops' kernels.
static cudaError_t run_generic(const zn_op *op, cudaStream_t st, float *scratch,
                               const char **what)
{
    switch (op->kind) {
    case ZN_OPK_FILL: {
        const auto &fill = op->u.fill;
        return launch(what, "k_fill", k_fill, grid_for(fill.n), st, fill.x, fill.dt, fill.n,
                      fill.value);
    }
    case ZN_OPK_GEMM: {   // only C = beta * C (k == 0 or alpha == 0)
        const auto &gemm = op->u.gemm;
        cudaError_t e = cudaSuccess;
        for (int64_t b = 0; b < gemm.batch && e == cudaSuccess; b++) {
            char *c = (char *)gemm.C + b * gemm.sc * (int64_t)zn_dtype_size(gemm.cdt);
            e = launch(what, "k_scale2d", k_scale2d, grid_for(gemm.m * gemm.n), st, c, gemm.cdt,
                       gemm.m, gemm.n, gemm.ldc, gemm.beta);
        }
        return e;
    }
    case ZN_OPK_ADD: {
        const auto &ew = op->u.ew;
        return launch(what, "k_add", k_add, grid_for(ew.n), st, ew.a, ew.b, ew.y, ew.a_dt, ew.n);
    }
    case ZN_OPK_AXPY: {
        const auto &ew = op->u.ew;
        return launch(what, "k_axpy", k_axpy, grid_for(ew.n), st, ew.alpha, ew.a, ew.a_dt, ew.y,
                      ew.y_dt, ew.n);
    }
    case ZN_OPK_SCALE: {
        const auto &ew = op->u.ew;
        return launch(what, "k_scale", k_scale, grid_for(ew.n), st, ew.y, ew.y_dt, ew.n,
                      ew.alpha);
    }
    case ZN_OPK_BIAS_ADD: {
        const auto &bias = op->u.bias;
        return launch(what, "k_bias_add", k_bias_add, grid_for(bias.rows * bias.cols), st,
                      bias.y, bias.y_dt, bias.ld, bias.bias, bias.bias_dt, bias.rows, bias.cols);
    }
    case ZN_OPK_BIAS_GRAD: {
        const auto &bias = op->u.bias;
        *what = "bias grad column sum";
        return zn_cuda_colsum(st, bias.dy, bias.y_dt, bias.ld, nullptr, 0, nullptr, 0,
                              bias.rows, bias.cols, scratch, bias.dbias, 1, bias.ld);
    }
    case ZN_OPK_CAST: {
        const auto &cast = op->u.cast;
        return launch(what, "k_cast", k_cast, grid_for(cast.n), st, cast.x, cast.x_dt, cast.y,
                      cast.y_dt, cast.n);
    }
    case ZN_OPK_DROPOUT: {
        const auto &drop = op->u.drop;
        return launch(what, "k_dropout", k_dropout, grid_for(drop.rows * drop.cols), st, drop.x,
                      drop.x_dt, drop.ldx, drop.y, drop.y_dt, drop.ldy, drop.rows, drop.cols,
                      drop.key, drop.thresh, drop.scale, drop.accumulate);
    }
    case ZN_OPK_REDUCE: {
        const auto &reduce = op->u.reduce;
        cudaError_t e = launch(what, "k_reduce_part", k_reduce_part, kReduceBlocks, st, reduce.x,
                               reduce.dt, reduce.n, reduce.square, scratch);
        if (e != cudaSuccess)
            return e;
        *what = "k_reduce_final";
        k_reduce_final<<<1, 32, 0, st>>>(scratch, kReduceBlocks, reduce.out, reduce.accumulate);
        return cudaGetLastError();
    }
    case ZN_OPK_ADAM: {
        const auto &adam = op->u.adam;
        return launch(what, "k_adam", k_adam<ParamF32>, grid_for(adam.n), st, adam_k(adam),
                      ParamF32{ adam.p }, adam.m, adam.v, adam.g, (uint16_t *)adam.c, adam.n);
    }
    case ZN_OPK_ADAM_MOM:
        return adam_mom(what, st, op->u.adam, ParamF32{ op->u.adam.p }, (uint16_t *)op->u.adam.c);
    case ZN_OPK_ADAM_SR: {
        const auto &adam = op->u.adam;
        ParamSR p = { adam.p16, adam.sr_spans, adam.sr_nspans, adam.sr_seed, adam.hp.step };
        if (adam.mv.fmt == ZN_MOM_F32)
            return launch(what, "k_adam (bf16 master)", k_adam<ParamSR>, grid_for(adam.n), st,
                          adam_k(adam), p, (float *)adam.mv.m, (float *)adam.mv.v, adam.g,
                          (uint16_t *)nullptr, adam.n);
        return adam_mom(what, st, adam, p, nullptr);
    }
    case ZN_OPK_NORM_CHUNKS: {
        const auto &normc = op->u.normc;
        int64_t nc = (normc.n + kNormChunk - 1) / kNormChunk;
        int64_t blocks = (nc + kThreads / 16 - 1) / (kThreads / 16);
        *what = "k_norm_chunks";
        if (blocks > kMaxBlocks)
            return cudaErrorInvalidValue;
        return launch(what, "k_norm_chunks", k_norm_chunks, dim3((unsigned)blocks), st, normc.x,
                      normc.n, normc.out);
    }
    default:
        *what = "zn_cuda_run_kernel (unknown op)";
        return cudaErrorInvalidValue;
    }
}

extern "C" int zn_cuda_run_kernel(const zn_op *op, void *stream, float *scratch,
                                  const char **what)
{
    cudaStream_t st = (cudaStream_t)stream;
    switch (op->kind) {
    case ZN_OPK_EMB_FWD:
    case ZN_OPK_EMB_BWD:
    case ZN_OPK_RMS_FWD:
    case ZN_OPK_RMS_BWD:
    case ZN_OPK_ROPE:
    case ZN_OPK_SOFTMAX_FWD:
    case ZN_OPK_SOFTMAX_BWD:
    case ZN_OPK_SWIGLU_FWD:
    case ZN_OPK_SWIGLU_BWD:
    case ZN_OPK_XENT_FWD:
    case ZN_OPK_XENT_FINISH:
    case ZN_OPK_XENT_BWD:
    case ZN_OPK_SOFTCAP_FWD:
    case ZN_OPK_SOFTCAP_BWD:
    case ZN_OPK_ROWS:
        return (int)zn_cuda_run_nn(op, st, scratch, what);
    case ZN_OPK_FLASH_FWD:
    case ZN_OPK_FLASH_BWD:
        return (int)zn_cuda_run_flash(op, st, what);
    default:
        return (int)run_generic(op, st, scratch, what);
    }
}
