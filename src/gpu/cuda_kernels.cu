// CUDA kernels of the device layer. Each follows its C reference in
// host_kernels.c: fp32 math, bf16 stored as uint16 with the same rounding,
// reductions as fixed-shape trees (deterministic: no floating-point atomics;
// column sums go through per-chunk partials summed in a fixed order).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "gpu/gpu-impl.h"
#include "util/hash-impl.h"

namespace {

constexpr int kThreads = 256;      // block size of every kernel here
constexpr int kReduceBlocks = 256; // fixed grid of the two-phase reductions

__device__ __forceinline__ float bf2f(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ uint16_t f2bf(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// dt: 0 = f32, 1 = bf16 (zn_dtype). The branch is uniform across a warp.
__device__ __forceinline__ float ldv(const void *p, int dt, int64_t i)
{
    return dt == ZN_DTYPE_F32 ? ((const float *)p)[i] : bf2f(((const uint16_t *)p)[i]);
}

__device__ __forceinline__ void stv(void *p, int dt, int64_t i, float v)
{
    if (dt == ZN_DTYPE_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = f2bf(v);
}

// Sum over the block (blockDim.x == kThreads), same tree every time; the
// result is returned to every thread.
__device__ float block_sum(float v)
{
    __shared__ float sh[32];
    __shared__ float total;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0)
            total = v;
    }
    __syncthreads();
    float r = total;
    __syncthreads();   // sh/total may be reused by the caller's next reduction
    return r;
}

__device__ float block_max(float v)
{
    __shared__ float sh[32];
    __shared__ float total;
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sh[lane] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1)
            v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
        if (lane == 0)
            total = v;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

#define GRID_STRIDE(i, n)                                                         \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);   \
         i += (int64_t)gridDim.x * blockDim.x)

unsigned grid_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    if (b > 65535LL * 16)
        b = 65535LL * 16;      // grid-stride loops cover the rest
    return (unsigned)(b > 0 ? b : 1);
}

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

__global__ void k_emb_fwd(const int32_t *ids, int64_t nt, int64_t row0, int64_t vocab,
                          int64_t dim, int skip, const void *table, int tdt, void *out, int odt)
{
    GRID_STRIDE(i, nt * dim)
    {
        int64_t t = i / dim, j = i % dim;
        int64_t id = (int64_t)ids[t] - row0;
        bool ok = id >= 0 && id < vocab;
        if (!ok && skip)
            continue; // another part's row
        stv(out, odt, i, ok ? ldv(table, tdt, id * dim + j) : 0.0f);
    }
}

// One thread per column walks the tokens in order: repeated ids add up in
// the same order as the C reference, with no atomics.
__global__ void k_emb_bwd(const int32_t *ids, int64_t nt, int64_t row0, int64_t vocab,
                          int64_t dim, const void *dout, int ddt, float *dtable)
{
    GRID_STRIDE(j, dim)
    {
        for (int64_t t = 0; t < nt; t++) {
            int64_t id = (int64_t)ids[t] - row0;
            if (id >= 0 && id < vocab)
                dtable[id * dim + j] += ldv(dout, ddt, t * dim + j);
        }
    }
}

__global__ void k_rms_fwd(const void *x, int xdt, const void *w, int wdt, void *y, int ydt,
                          float *rstd, int64_t dim, float eps)
{
    const int64_t r = blockIdx.x, o = r * dim;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = ldv(x, xdt, o + j);
        ss += v * v;
    }
    ss = block_sum(ss);
    const float rs = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
        stv(y, ydt, o + j, ldv(w, wdt, j) * (ldv(x, xdt, o + j) * rs));
    if (rstd && threadIdx.x == 0)
        rstd[r] = rs;
}

__global__ void k_rms_bwd(const void *x, int xdt, const void *w, int wdt, const float *rstd,
                          const void *dy, int dydt, void *dx, int dxdt, int64_t dim)
{
    const int64_t r = blockIdx.x, o = r * dim;
    const float rs = rstd[r];
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
        dot += ldv(w, wdt, j) * ldv(dy, dydt, o + j) * ldv(x, xdt, o + j);
    dot = block_sum(dot);
    const float c = dot / (float)dim * rs * rs;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        float xv = ldv(x, xdt, o + j), dyv = ldv(dy, dydt, o + j);
        stv(dx, dxdt, o + j, rs * (ldv(w, wdt, j) * dyv - xv * c));
    }
}

// Column sums in two phases. Phase 1: chunk c of the rows, column j ->
// part[c * cols + j]. mode 0: sum dy; mode 1: sum dy * x * rstd[row].
__global__ void k_colsum_part(const void *dy, int dydt, int64_t ld, const void *x, int xdt,
                              const float *rstd, int mode, int64_t rows, int64_t cols,
                              int64_t rows_per_chunk, float *part)
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
        float v = ldv(dy, dydt, r * ld + j);
        if (mode == 1)
            v *= ldv(x, xdt, r * ld + j) * rstd[r];
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

__global__ void k_rope(void *x, int dt, int64_t tokens, int64_t heads, int64_t hd, int64_t ld,
                       const int32_t *pos, const float *inv_freq, float sign)
{
    const int64_t half = hd / 2;
    GRID_STRIDE(idx, tokens * heads * half)
    {
        int64_t i = idx % half, h = (idx / half) % heads, t = idx / (half * heads);
        float a = (float)pos[t] * inv_freq[i];
        float s, c;
        sincosf(a, &s, &c);
        s *= sign;
        int64_t b = t * ld + h * hd;
        float x1 = ldv(x, dt, b + i), x2 = ldv(x, dt, b + i + half);
        stv(x, dt, b + i, x1 * c - x2 * s);
        stv(x, dt, b + i + half, x2 * c + x1 * s);
    }
}

// Row r's valid keys [lo, lim): causal, and from its document's first
// position on when key_start is given (clamped to keep the diagonal).
__device__ __forceinline__ void softmax_keys(int64_t r, int64_t cols, int64_t q_offset,
                                             const int32_t *key_start, int64_t *lo, int64_t *lim)
{
    int64_t hi = q_offset + r + 1;
    if (hi > cols)
        hi = cols;
    int64_t l = key_start ? key_start[r] : 0;
    *lo = l < 0 ? 0 : l >= hi ? hi - 1 : l;
    *lim = hi;
}

// One block per row of scores.
__global__ void k_softmax_fwd(const void *S, int sdt, void *P, int pdt, int64_t rows,
                              int64_t cols, int64_t q_offset, const int32_t *key_start,
                              float scale)
{
    const int64_t row = blockIdx.x, r = row % rows, o = row * cols;
    int64_t lo, lim;
    softmax_keys(r, cols, q_offset, key_start, &lo, &lim);
    float mx = -INFINITY;
    for (int64_t j = lo + threadIdx.x; j < lim; j += blockDim.x)
        mx = fmaxf(mx, scale * ldv(S, sdt, o + j));
    mx = block_max(mx);
    float sum = 0.0f;
    for (int64_t j = lo + threadIdx.x; j < lim; j += blockDim.x)
        sum += expf(scale * ldv(S, sdt, o + j) - mx);
    sum = block_sum(sum);
    const float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        stv(P, pdt, o + j,
            j >= lo && j < lim ? expf(scale * ldv(S, sdt, o + j) - mx) * inv : 0.0f);
}

__global__ void k_softmax_bwd(const void *P, int pdt, const void *dP, int dpdt, void *dS,
                              int dsdt, int64_t rows, int64_t cols, int64_t q_offset,
                              const int32_t *key_start, float scale)
{
    const int64_t row = blockIdx.x, r = row % rows, o = row * cols;
    int64_t lo, lim;
    softmax_keys(r, cols, q_offset, key_start, &lo, &lim);
    float dot = 0.0f;
    for (int64_t j = lo + threadIdx.x; j < lim; j += blockDim.x)
        dot += ldv(P, pdt, o + j) * ldv(dP, dpdt, o + j);
    dot = block_sum(dot);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = 0.0f;
        if (j >= lo && j < lim)
            v = scale * ldv(P, pdt, o + j) * (ldv(dP, dpdt, o + j) - dot);
        stv(dS, dsdt, o + j, v);
    }
}

__device__ __forceinline__ float sigm(float g)
{
    return 1.0f / (1.0f + expf(-g));
}

__global__ void k_swiglu_fwd(const void *gate, const void *up, void *out, int dt, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        float g = ldv(gate, dt, i), u = ldv(up, dt, i);
        stv(out, dt, i, g * sigm(g) * u);
    }
}

__global__ void k_swiglu_bwd(const void *gate, const void *up, const void *dout, void *dgate,
                             void *dup, int dt, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        float g = ldv(gate, dt, i), u = ldv(up, dt, i), d = ldv(dout, dt, i);
        float sg = sigm(g);
        stv(dgate, dt, i, d * u * sg * (1.0f + g * (1.0f - sg)));
        stv(dup, dt, i, d * g * sg);
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

// One block per row: fold this chunk into the running max / sum.
__global__ void k_xent_fwd(const void *logits, int dt, int64_t cols, int64_t ld, int64_t v0,
                           const int32_t *targets, float *run_max, float *run_sum, float *tgt,
                           int first)
{
    const int64_t r = blockIdx.x, o = r * ld;
    float cm = -INFINITY;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        cm = fmaxf(cm, ldv(logits, dt, o + j));
    cm = block_max(cm);
    const float m = first ? -INFINITY : run_max[r];
    const float nm = cm > m ? cm : m;
    float cs = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        cs += expf(ldv(logits, dt, o + j) - nm);
    cs = block_sum(cs);
    if (threadIdx.x == 0) {
        const float s = first ? 0.0f : run_sum[r];
        run_max[r] = nm;
        run_sum[r] = (m == -INFINITY ? 0.0f : s * expf(m - nm)) + cs;
        const int64_t t = targets[r];
        if (first)
            tgt[r] = 0.0f;
        if (t >= v0 && t < v0 + cols)
            tgt[r] = ldv(logits, dt, o + (t - v0));
    }
}

__global__ void k_xent_finish(const float *m, const float *s, const float *tgt,
                              const int32_t *targets, int64_t rows, float *lse, float *loss)
{
    GRID_STRIDE(r, rows)
    {
        float l = m[r] + logf(s[r]);
        lse[r] = l;
        if (loss)
            loss[r] = targets[r] < 0 ? 0.0f : l - tgt[r];
    }
}

__global__ void k_xent_bwd(const void *logits, int dt, int64_t rows, int64_t cols, int64_t ld,
                           int64_t v0, const int32_t *targets, const float *lse, float gs,
                           void *dl, int ddt, int64_t ldd)
{
    GRID_STRIDE(i, rows * cols)
    {
        int64_t r = i / cols, j = i % cols;
        int64_t t = targets[r];
        float g = 0.0f;
        if (t >= 0) {
            float p = expf(ldv(logits, dt, r * ld + j) - lse[r]);
            g = gs * (p - (v0 + j == t ? 1.0f : 0.0f));
        }
        stv(dl, ddt, r * ldd + j, g);
    }
}

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

// ---- the optimizer ---------------------------------------------------------
// Adam/AdamW in the operation order of the CPU's FMA paths (optim_avx2.c
// step8): explicit round-to-nearest intrinsics, so that nvcc's contraction
// cannot regroup it, and IEEE sqrt and division (__fsqrt_rn, __fdiv_rn).
struct AdamK {
    float b1, omb1, b2, omb2, step, eps, gs, l2, decay;
    int use_l2, use_decay;
};

__global__ void k_adam(AdamK k, float *p, float *m, float *v, const float *g, uint16_t *c,
                       int64_t n)
{
    GRID_STRIDE(i, n) {
        float pv = p[i], mv = m[i], vv = v[i], gv = g[i];
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
        p[i] = pv;
        m[i] = mv;
        v[i] = vv;
        if (c)
            c[i] = f2bf(pv);
    }
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

cudaError_t colsum(cudaStream_t st, const void *dy, int dydt, int64_t ld, const void *x, int xdt,
                   const float *rstd, int mode, int64_t rows, int64_t cols, float *scratch,
                   float *out)
{
    if ((uint64_t)cols > ZN_CUDA_SCRATCH)
        return cudaErrorInvalidValue;
    int64_t ch = col_chunks(rows, cols), rpc = (rows + ch - 1) / ch;
    ch = (rows + rpc - 1) / rpc;
    dim3 g((unsigned)((cols + kThreads - 1) / kThreads), (unsigned)ch);
    k_colsum_part<<<g, kThreads, 0, st>>>(dy, dydt, ld, x, xdt, rstd, mode, rows, cols, rpc,
                                          scratch);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    k_colsum_final<<<grid_for(cols), kThreads, 0, st>>>(scratch, ch, cols, out);
    return cudaGetLastError();
}

} // namespace

extern "C" int zn_cuda_run_kernel(const zn_op *op, void *stream, float *scratch,
                                  const char **what)
{
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e = cudaSuccess;
    const int T = kThreads;

    switch (op->kind) {
    case ZN_OPK_FILL:
        *what = "k_fill";
        k_fill<<<grid_for(op->u.fill.n), T, 0, st>>>(op->u.fill.x, op->u.fill.dt, op->u.fill.n,
                                                     op->u.fill.value);
        break;
    case ZN_OPK_GEMM:   // only C = beta * C (k == 0 or alpha == 0)
        *what = "k_scale2d";
        for (int64_t b = 0; b < op->u.gemm.batch && e == cudaSuccess; b++) {
            char *c = (char *)op->u.gemm.C + b * op->u.gemm.sc * (int64_t)zn_dtype_size(op->u.gemm.cdt);
            k_scale2d<<<grid_for(op->u.gemm.m * op->u.gemm.n), T, 0, st>>>(
                c, op->u.gemm.cdt, op->u.gemm.m, op->u.gemm.n, op->u.gemm.ldc, op->u.gemm.beta);
            e = cudaGetLastError();
        }
        return (int)e;
    case ZN_OPK_EMB_FWD:
        *what = "k_emb_fwd";
        k_emb_fwd<<<grid_for(op->u.emb.n_tokens * op->u.emb.dim), T, 0, st>>>(
            op->u.emb.ids, op->u.emb.n_tokens, op->u.emb.row0, op->u.emb.vocab, op->u.emb.dim,
            op->u.emb.skip, op->u.emb.table, op->u.emb.table_dt, op->u.emb.out,
            op->u.emb.out_dt);
        break;
    case ZN_OPK_EMB_BWD:
        *what = "k_emb_bwd";
        k_emb_bwd<<<grid_for(op->u.emb.dim), T, 0, st>>>(op->u.emb.ids, op->u.emb.n_tokens,
                                                         op->u.emb.row0, op->u.emb.vocab,
                                                         op->u.emb.dim, op->u.emb.dout,
                                                         op->u.emb.dout_dt, op->u.emb.dtable);
        break;
    case ZN_OPK_RMS_FWD:
        *what = "k_rms_fwd";
        if (op->u.rms_fwd.rows > 0x7fffffff)
            return (int)cudaErrorInvalidValue;
        k_rms_fwd<<<(unsigned)op->u.rms_fwd.rows, T, 0, st>>>(
            op->u.rms_fwd.x, op->u.rms_fwd.x_dt, op->u.rms_fwd.w, op->u.rms_fwd.w_dt,
            op->u.rms_fwd.y, op->u.rms_fwd.y_dt, op->u.rms_fwd.rstd, op->u.rms_fwd.dim,
            op->u.rms_fwd.eps);
        break;
    case ZN_OPK_RMS_BWD:
        if (op->u.rms_bwd.rows > 0x7fffffff)
            return (int)cudaErrorInvalidValue;
        // dw first: dx may overwrite dy.
        if (op->u.rms_bwd.dw) {
            *what = "rmsnorm dw column sum";
            e = colsum(st, op->u.rms_bwd.dy, op->u.rms_bwd.dy_dt, op->u.rms_bwd.dim,
                       op->u.rms_bwd.x, op->u.rms_bwd.x_dt, op->u.rms_bwd.rstd, 1,
                       op->u.rms_bwd.rows, op->u.rms_bwd.dim, scratch, op->u.rms_bwd.dw);
            if (e != cudaSuccess)
                return (int)e;
        }
        *what = "k_rms_bwd";
        k_rms_bwd<<<(unsigned)op->u.rms_bwd.rows, T, 0, st>>>(
            op->u.rms_bwd.x, op->u.rms_bwd.x_dt, op->u.rms_bwd.w, op->u.rms_bwd.w_dt,
            op->u.rms_bwd.rstd, op->u.rms_bwd.dy, op->u.rms_bwd.dy_dt, op->u.rms_bwd.dx,
            op->u.rms_bwd.dx_dt, op->u.rms_bwd.dim);
        break;
    case ZN_OPK_ROPE:
        *what = "k_rope";
        k_rope<<<grid_for(op->u.rope.tokens * op->u.rope.n_heads * (op->u.rope.head_dim / 2)), T,
                 0, st>>>(op->u.rope.x, op->u.rope.dt, op->u.rope.tokens, op->u.rope.n_heads,
                          op->u.rope.head_dim, op->u.rope.ld, op->u.rope.pos,
                          op->u.rope.inv_freq, op->u.rope.inverse ? -1.0f : 1.0f);
        break;
    case ZN_OPK_SOFTMAX_FWD:
    case ZN_OPK_SOFTMAX_BWD: {
        int64_t nrows = op->u.softmax.batch * op->u.softmax.rows;
        if (nrows > 0x7fffffff)
            return (int)cudaErrorInvalidValue;
        if (op->kind == ZN_OPK_SOFTMAX_FWD) {
            *what = "k_softmax_fwd";
            k_softmax_fwd<<<(unsigned)nrows, T, 0, st>>>(
                op->u.softmax.S, op->u.softmax.S_dt, op->u.softmax.P, op->u.softmax.P_dt,
                op->u.softmax.rows, op->u.softmax.cols, op->u.softmax.q_offset,
                op->u.softmax.key_start, op->u.softmax.scale);
        } else {
            *what = "k_softmax_bwd";
            k_softmax_bwd<<<(unsigned)nrows, T, 0, st>>>(
                op->u.softmax.Pin, op->u.softmax.Pin_dt, op->u.softmax.dP, op->u.softmax.dP_dt,
                op->u.softmax.P, op->u.softmax.P_dt, op->u.softmax.rows, op->u.softmax.cols,
                op->u.softmax.q_offset, op->u.softmax.key_start, op->u.softmax.scale);
        }
        break;
    }
    case ZN_OPK_SWIGLU_FWD:
        *what = "k_swiglu_fwd";
        k_swiglu_fwd<<<grid_for(op->u.swiglu.n), T, 0, st>>>(op->u.swiglu.gate, op->u.swiglu.up,
                                                             op->u.swiglu.out, op->u.swiglu.dt,
                                                             op->u.swiglu.n);
        break;
    case ZN_OPK_SWIGLU_BWD:
        *what = "k_swiglu_bwd";
        k_swiglu_bwd<<<grid_for(op->u.swiglu.n), T, 0, st>>>(
            op->u.swiglu.gate, op->u.swiglu.up, op->u.swiglu.dout, op->u.swiglu.dgate,
            op->u.swiglu.dup, op->u.swiglu.dt, op->u.swiglu.n);
        break;
    case ZN_OPK_ADD:
        *what = "k_add";
        k_add<<<grid_for(op->u.ew.n), T, 0, st>>>(op->u.ew.a, op->u.ew.b, op->u.ew.y,
                                                  op->u.ew.a_dt, op->u.ew.n);
        break;
    case ZN_OPK_AXPY:
        *what = "k_axpy";
        k_axpy<<<grid_for(op->u.ew.n), T, 0, st>>>(op->u.ew.alpha, op->u.ew.a, op->u.ew.a_dt,
                                                   op->u.ew.y, op->u.ew.y_dt, op->u.ew.n);
        break;
    case ZN_OPK_SCALE:
        *what = "k_scale";
        k_scale<<<grid_for(op->u.ew.n), T, 0, st>>>(op->u.ew.y, op->u.ew.y_dt, op->u.ew.n,
                                                    op->u.ew.alpha);
        break;
    case ZN_OPK_BIAS_ADD:
        *what = "k_bias_add";
        k_bias_add<<<grid_for(op->u.bias.rows * op->u.bias.cols), T, 0, st>>>(
            op->u.bias.y, op->u.bias.y_dt, op->u.bias.ld, op->u.bias.bias, op->u.bias.bias_dt,
            op->u.bias.rows, op->u.bias.cols);
        break;
    case ZN_OPK_BIAS_GRAD:
        *what = "bias grad column sum";
        return (int)colsum(st, op->u.bias.dy, op->u.bias.y_dt, op->u.bias.ld, nullptr, 0, nullptr,
                           0, op->u.bias.rows, op->u.bias.cols, scratch, op->u.bias.dbias);
    case ZN_OPK_CAST:
        *what = "k_cast";
        k_cast<<<grid_for(op->u.cast.n), T, 0, st>>>(op->u.cast.x, op->u.cast.x_dt, op->u.cast.y,
                                                     op->u.cast.y_dt, op->u.cast.n);
        break;
    case ZN_OPK_XENT_FWD:
        *what = "k_xent_fwd";
        if (op->u.xent.rows > 0x7fffffff)
            return (int)cudaErrorInvalidValue;
        k_xent_fwd<<<(unsigned)op->u.xent.rows, T, 0, st>>>(
            op->u.xent.logits, op->u.xent.dt, op->u.xent.cols, op->u.xent.ld, op->u.xent.v0,
            op->u.xent.targets, op->u.xent.run_max, op->u.xent.run_sum, op->u.xent.tgt,
            op->u.xent.first);
        break;
    case ZN_OPK_XENT_FINISH:
        *what = "k_xent_finish";
        k_xent_finish<<<grid_for(op->u.xent.rows), T, 0, st>>>(
            op->u.xent.cmax, op->u.xent.csum, op->u.xent.ctgt, op->u.xent.targets,
            op->u.xent.rows, op->u.xent.lse_out, op->u.xent.loss);
        break;
    case ZN_OPK_XENT_BWD:
        *what = "k_xent_bwd";
        k_xent_bwd<<<grid_for(op->u.xent.rows * op->u.xent.cols), T, 0, st>>>(
            op->u.xent.logits, op->u.xent.dt, op->u.xent.rows, op->u.xent.cols, op->u.xent.ld,
            op->u.xent.v0, op->u.xent.targets, op->u.xent.lse, op->u.xent.grad_scale,
            op->u.xent.dlogits, op->u.xent.d_dt, op->u.xent.ld_d);
        break;
    case ZN_OPK_DROPOUT:
        *what = "k_dropout";
        k_dropout<<<grid_for(op->u.drop.rows * op->u.drop.cols), T, 0, st>>>(
            op->u.drop.x, op->u.drop.x_dt, op->u.drop.ldx, op->u.drop.y, op->u.drop.y_dt,
            op->u.drop.ldy, op->u.drop.rows, op->u.drop.cols, op->u.drop.key, op->u.drop.thresh,
            op->u.drop.scale, op->u.drop.accumulate);
        break;
    case ZN_OPK_REDUCE:
        *what = "k_reduce_part";
        k_reduce_part<<<kReduceBlocks, T, 0, st>>>(op->u.reduce.x, op->u.reduce.dt, op->u.reduce.n,
                                                   op->u.reduce.square, scratch);
        e = cudaGetLastError();
        if (e != cudaSuccess)
            return (int)e;
        *what = "k_reduce_final";
        k_reduce_final<<<1, 32, 0, st>>>(scratch, kReduceBlocks, op->u.reduce.out,
                                         op->u.reduce.accumulate);
        break;
    case ZN_OPK_ADAM: {
        *what = "k_adam";
        AdamK k = { op->u.adam.b1, op->u.adam.omb1, op->u.adam.b2, op->u.adam.omb2,
                    op->u.adam.step, op->u.adam.eps, op->u.adam.g_scale, op->u.adam.l2,
                    op->u.adam.decay, op->u.adam.use_l2, op->u.adam.use_decay };
        k_adam<<<grid_for(op->u.adam.n), T, 0, st>>>(k, op->u.adam.p, op->u.adam.m, op->u.adam.v,
                                                     op->u.adam.g, (uint16_t *)op->u.adam.c,
                                                     op->u.adam.n);
        break;
    }
    case ZN_OPK_NORM_CHUNKS: {
        *what = "k_norm_chunks";
        int64_t nc = (op->u.normc.n + kNormChunk - 1) / kNormChunk;
        int64_t blocks = (nc + kThreads / 16 - 1) / (kThreads / 16);
        if (blocks > 0x7fffffff)
            return (int)cudaErrorInvalidValue;
        k_norm_chunks<<<(unsigned)blocks, T, 0, st>>>(op->u.normc.x, op->u.normc.n,
                                                      op->u.normc.out);
        break;
    }
    default:
        *what = "zn_cuda_run_kernel (unknown op)";
        return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}
