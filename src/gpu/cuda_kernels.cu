// CUDA kernels of the device layer. Each follows its C reference in
// host_kernels.c: fp32 math, bf16 stored as uint16 with the same rounding,
// reductions as fixed-shape trees (deterministic: no floating-point atomics;
// column sums go through per-chunk partials summed in a fixed order).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
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
// Parallel over (column, row bucket): blockIdx.y owns the rows with
// id % gridDim.y == blockIdx.y, so no two threads write one element, and
// each element still sums its tokens in token order: the same bits as one
// thread per column (and the host reference), with gridDim.y times the
// blocks (20 blocks on 132 SMs at dim 5120 before, 640 with 32 buckets).
__global__ void k_emb_bwd(const int32_t *ids, int64_t nt, int64_t row0, int64_t vocab,
                          int64_t dim, const void *dout, int ddt, float *dtable)
{
    const int64_t nb = gridDim.y, bucket = blockIdx.y;
    GRID_STRIDE(j, dim)
    {
        for (int64_t t = 0; t < nt; t++) {
            int64_t id = (int64_t)ids[t] - row0;
            if (id >= 0 && id < vocab && id % nb == bucket)
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

// ---- fused attention (host_kernels.c flash_fwd / flash_bwd) --------------
// bf16 tensor cores through WMMA 16x16x16 fragments with fp32 accumulation.
// Every operand goes through shared memory, so no fragment's element layout
// is assumed: S = Q K^T lands in fp32 smem, the softmax runs there a lane
// per key (a key tile is one warp wide), P goes back as bf16 for P V. Each
// warp owns 16 rows (queries, or keys in the dK/dV kernel) and only needs
// __syncwarp between its steps; __syncthreads guards the shared K/V (or
// Q/dO) tiles. Leading dimensions are padded (+8 bf16, +4 fp32) against
// bank conflicts and keep every fragment pointer 32-byte aligned.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the fused attention needs bf16 tensor cores (sm_80 or later): set -Dgpu_arch"
#endif
using namespace nvcuda;

constexpr int kFlBC = 32;      // keys (or queries) per tile: one per lane
constexpr int kFlFwdRows = 64; // forward: query rows per block, 4 warps
constexpr int kFlBwdRows = 32; // backward: rows per block, 2 warps

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> FlA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> FlBr;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> FlBc;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FlAcc;

struct FlArgs {
    const uint16_t *qkv; int64_t ld, B, T, nh, nkv, hd; const int32_t *ks; float scale;
    uint16_t *out; const uint16_t *dout; int64_t ldo; float *lse, *delta;
    uint16_t *dqkv; int64_t ldd;
};

__device__ __forceinline__ const __nv_bfloat16 *bfp(const uint16_t *p)
{
    return reinterpret_cast<const __nv_bfloat16 *>(p);
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Query t's first key (t < T): key_start clamped to [0, t].
__device__ __forceinline__ int64_t fl_lo(const int32_t *ks, int64_t t)
{
    int64_t k = ks ? ks[t] : 0;
    return k < 0 ? 0 : k > t ? t : k;
}

// Rows [r0, r0 + rows) x columns [c0, c0 + hd) of a bf16 matrix into smem
// [rows][lds], zero past T rows and past hd up to hdp columns.
__device__ void fl_load(uint16_t *sm, int lds, const uint16_t *g, int64_t ld, int64_t c0,
                        int64_t r0, int rows, int64_t T, int hd, int hdp)
{
    for (int i = threadIdx.x; i < rows * hdp; i += blockDim.x) {
        int r = i / hdp, c = i % hdp;
        int64_t t = r0 + r;
        sm[r * lds + c] = t < T && c < hd ? g[t * ld + c0 + c] : (uint16_t)0;
    }
}

// K and V rows [k0, k0 + rows) of kv head j.
__device__ void fl_load_kv(uint16_t *sK, uint16_t *sV, int lds, const uint16_t *x, const FlArgs &a,
                           int64_t j, int64_t k0, int rows, int hdp)
{
    fl_load(sK, lds, x, a.ld, (a.nh + j) * a.hd, k0, rows, a.T, (int)a.hd, hdp);
    fl_load(sV, lds, x, a.ld, (a.nh + a.nkv + j) * a.hd, k0, rows, a.T, (int)a.hd, hdp);
}

// Whether query t sees key k (both within the sequence).
__device__ __forceinline__ bool fl_sees(const int32_t *ks, int64_t T, int64_t t, int64_t k)
{
    return t < T && k <= t && k >= fl_lo(ks, t);
}

// The first key tile queries [q0, qend) see (the same for every thread).
__device__ int64_t fl_first_key(const int32_t *ks, int64_t q0, int64_t qend)
{
    int64_t lo = q0;
    for (int64_t t = q0; t < qend; t++) {
        int64_t l = fl_lo(ks, t);
        lo = l < lo ? l : lo;
    }
    return lo / kFlBC * kFlBC;
}

// acc(16 x 16) = A(16 x kdim) B(kdim x 16), B read transposed from rows
// (B^T row-major = B column-major): Q K^T and dO V^T.
__device__ __forceinline__ void fl_mm_nt(FlAcc &acc, const uint16_t *a, int lda,
                                         const uint16_t *bt, int ldb, int kdim)
{
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < kdim; kk += 16) {
        FlA fa;
        FlBc fb;
        wmma::load_matrix_sync(fa, bfp(a + kk), lda);
        wmma::load_matrix_sync(fb, bfp(bt + kk), ldb);
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

// C(16 x hdp, fp32 smem, ldc) += A(16 x kFlBC) B(kFlBC x hdp): P V, dS K,
// P^T dO, dS^T Q.
__device__ __forceinline__ void fl_mm_acc(float *c, int ldc, const uint16_t *a, int lda,
                                          const uint16_t *b, int ldb, int hdp)
{
    for (int n = 0; n < hdp; n += 16) {
        FlAcc acc;
        wmma::load_matrix_sync(acc, c + n, ldc, wmma::mem_row_major);
        for (int kk = 0; kk < kFlBC; kk += 16) {
            FlA fa;
            FlBr fb;
            wmma::load_matrix_sync(fa, bfp(a + kk), lda);
            wmma::load_matrix_sync(fb, bfp(b + (int64_t)kk * ldb + n), ldb);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(c + n, acc, ldc, wmma::mem_row_major);
    }
}

__host__ __device__ constexpr size_t fl_fwd_smem(int hdp)
{
    return (size_t)(kFlFwdRows + 2 * kFlBC) * (hdp + 8) * 2 + (size_t)kFlFwdRows * (kFlBC + 4) * 4 +
           (size_t)kFlFwdRows * (kFlBC + 8) * 2 + (size_t)kFlFwdRows * (hdp + 4) * 4 +
           3 * kFlFwdRows * 4;
}

// grid (query tiles of 64, heads, batch), 128 threads.
__global__ void __launch_bounds__(128) k_flash_fwd(FlArgs a, int hdp)
{
    extern __shared__ __align__(128) unsigned char fl_smem[];
    const int LQ = hdp + 8, LS = kFlBC + 4, LP = kFlBC + 8, LO = hdp + 4, R = kFlFwdRows;
    uint16_t *sQ = (uint16_t *)fl_smem;
    uint16_t *sK = sQ + R * LQ;
    uint16_t *sV = sK + kFlBC * LQ;
    float *sS = (float *)(sV + kFlBC * LQ);
    uint16_t *sP = (uint16_t *)(sS + R * LS);
    float *sO = (float *)(sP + R * LP);
    float *sM = sO + R * LO, *sL = sM + R, *sA = sL + R;
    const int64_t T = a.T, hd = a.hd, b = blockIdx.z, h = blockIdx.y, j = h / (a.nh / a.nkv);
    // the last query tiles (the most keys) first: the long blocks start early
    const int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * R;
    const int64_t qend = q0 + R < T ? q0 + R : T;
    const uint16_t *x = a.qkv + b * T * a.ld;
    const int32_t *ks = a.ks ? a.ks + b * T : nullptr;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, w0 = warp * 16;
    fl_load(sQ, LQ, x, a.ld, h * hd, q0, R, T, (int)hd, hdp);
    for (int i = threadIdx.x; i < R * LO; i += blockDim.x)
        sO[i] = 0.0f;
    if (threadIdx.x < R) {
        sM[threadIdx.x] = -INFINITY;
        sL[threadIdx.x] = 0.0f;
    }
    for (int64_t k0 = fl_first_key(ks, q0, qend); k0 < qend; k0 += kFlBC) {
        __syncthreads();
        fl_load_kv(sK, sV, LQ, x, a, j, k0, kFlBC, hdp);
        __syncthreads();
        for (int n = 0; n < kFlBC; n += 16) {
            FlAcc acc;
            fl_mm_nt(acc, sQ + w0 * LQ, LQ, sK + n * LQ, LQ, hdp);
            wmma::store_matrix_sync(sS + w0 * LS + n, acc, LS, wmma::mem_row_major);
        }
        __syncwarp();
        for (int r = w0; r < w0 + 16; r++) {
            int64_t t = q0 + r, k = k0 + lane;
            bool ok = fl_sees(ks, T, t, k);
            float sv = ok ? sS[r * LS + lane] * a.scale : -INFINITY;
            float mo = sM[r], mn = fmaxf(mo, warp_max(sv)), p = 0.0f, alpha = 1.0f;
            if (mn != -INFINITY) {
                alpha = expf(mo - mn);
                p = ok ? expf(sv - mn) : 0.0f;
            }
            float sum = warp_sum(p);
            sP[r * LP + lane] = f2bf(p);
            __syncwarp();
            if (lane == 0) {
                sM[r] = mn;
                sL[r] = sL[r] * alpha + sum;
                sA[r] = alpha;
            }
        }
        __syncwarp();
        for (int i = lane; i < 16 * hdp; i += 32) {
            int r = w0 + i / hdp;
            sO[r * LO + i % hdp] *= sA[r];
        }
        __syncwarp();
        fl_mm_acc(sO + w0 * LO, LO, sP + w0 * LP, LP, sV, LQ, hdp);
        __syncwarp();
    }
    __syncthreads();
    for (int i = threadIdx.x; i < R * hd; i += blockDim.x) {
        int r = i / (int)hd, c = i % (int)hd;
        int64_t t = q0 + r;
        if (t < T) {
            float inv = sL[r] > 0.0f ? 1.0f / sL[r] : 0.0f;
            a.out[(b * T + t) * a.ldo + h * hd + c] = f2bf(sO[r * LO + c] * inv);
        }
    }
    if (threadIdx.x < R && q0 + threadIdx.x < T) {
        int r = threadIdx.x;
        a.lse[(b * a.nh + h) * T + q0 + r] = sL[r] > 0.0f ? sM[r] + logf(sL[r]) : -INFINITY;
    }
}

// delta[(b nh + h) T + t] = rowsum(dout * out), a warp per row.
__global__ void k_flash_delta(FlArgs a)
{
    int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= a.B * a.nh * a.T)
        return;
    int64_t t = w % a.T, h = (w / a.T) % a.nh, b = w / (a.T * a.nh);
    int64_t o = (b * a.T + t) * a.ldo + h * a.hd;
    float s = 0.0f;
    for (int64_t c = lane; c < a.hd; c += 32)
        s += bf2f(a.dout[o + c]) * bf2f(a.out[o + c]);
    s = warp_sum(s);
    if (lane == 0)
        a.delta[w] = s;
}

__host__ __device__ constexpr size_t fl_kv_smem(int hdp)
{
    return (size_t)4 * kFlBwdRows * (hdp + 8) * 2 + (size_t)2 * kFlBwdRows * (kFlBC + 4) * 4 +
           (size_t)2 * kFlBwdRows * (kFlBC + 8) * 2 + (size_t)2 * kFlBwdRows * (hdp + 4) * 4 +
           2 * kFlBC * 4;
}

// dK, dV of one key tile of one kv head: grid (key tiles of 32, kv heads,
// batch), 64 threads. Sums over the group's heads, then the query tiles in
// order; written once.
__global__ void __launch_bounds__(64) k_flash_bwd_kv(FlArgs a, int hdp)
{
    extern __shared__ __align__(128) unsigned char fl_smem[];
    const int LQ = hdp + 8, LS = kFlBC + 4, LP = kFlBC + 8, LO = hdp + 4, R = kFlBwdRows;
    uint16_t *sK = (uint16_t *)fl_smem;
    uint16_t *sV = sK + R * LQ;
    uint16_t *sQ = sV + R * LQ;
    uint16_t *sdO = sQ + kFlBC * LQ;
    float *sST = (float *)(sdO + kFlBC * LQ);
    float *sdPT = sST + R * LS;
    uint16_t *sPT = (uint16_t *)(sdPT + R * LS);
    uint16_t *sdST = sPT + R * LP;
    float *sdK = (float *)(sdST + R * LP);
    float *sdV = sdK + R * LO;
    float *sLse = sdV + R * LO, *sD = sLse + kFlBC;
    const int64_t T = a.T, hd = a.hd, b = blockIdx.z, j = blockIdx.y, g = a.nh / a.nkv;
    const int64_t k0 = (int64_t)blockIdx.x * R, kend = k0 + R < T ? k0 + R : T;
    const uint16_t *x = a.qkv + b * T * a.ld, *dout = a.dout + b * T * a.ldo;
    const int32_t *ks = a.ks ? a.ks + b * T : nullptr;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, w0 = warp * 16;
    fl_load_kv(sK, sV, LQ, x, a, j, k0, R, hdp);
    for (int i = threadIdx.x; i < R * LO; i += blockDim.x) {
        sdK[i] = 0.0f;
        sdV[i] = 0.0f;
    }
    for (int64_t h = j * g; h < (j + 1) * g; h++)
        for (int64_t q0 = k0; q0 < T; q0 += kFlBC) {
            int64_t qend = q0 + kFlBC < T ? q0 + kFlBC : T;
            bool any = false;   // does a query of the tile see a key of ours?
            for (int64_t t = q0; t < qend && !any; t++)
                any = fl_lo(ks, t) < kend;
            if (!any)
                continue;
            __syncthreads();
            fl_load(sQ, LQ, x, a.ld, h * hd, q0, kFlBC, T, (int)hd, hdp);
            fl_load(sdO, LQ, dout, a.ldo, h * hd, q0, kFlBC, T, (int)hd, hdp);
            if (threadIdx.x < kFlBC) {
                int64_t t = q0 + threadIdx.x;
                sLse[threadIdx.x] = t < T ? a.lse[(b * a.nh + h) * T + t] : 0.0f;
                sD[threadIdx.x] = t < T ? a.delta[(b * a.nh + h) * T + t] : 0.0f;
            }
            __syncthreads();
            for (int n = 0; n < kFlBC; n += 16) {
                FlAcc acc;
                fl_mm_nt(acc, sK + w0 * LQ, LQ, sQ + n * LQ, LQ, hdp);
                wmma::store_matrix_sync(sST + w0 * LS + n, acc, LS, wmma::mem_row_major);
                fl_mm_nt(acc, sV + w0 * LQ, LQ, sdO + n * LQ, LQ, hdp);
                wmma::store_matrix_sync(sdPT + w0 * LS + n, acc, LS, wmma::mem_row_major);
            }
            __syncwarp();
            for (int r = w0; r < w0 + 16; r++) {
                int64_t k = k0 + r, t = q0 + lane;
                bool ok = fl_sees(ks, T, t, k);
                float p = ok ? expf(sST[r * LS + lane] * a.scale - sLse[lane]) : 0.0f;
                sPT[r * LP + lane] = f2bf(p);
                sdST[r * LP + lane] = f2bf(p * (sdPT[r * LS + lane] - sD[lane]) * a.scale);
            }
            __syncwarp();
            fl_mm_acc(sdV + w0 * LO, LO, sPT + w0 * LP, LP, sdO, LQ, hdp);
            fl_mm_acc(sdK + w0 * LO, LO, sdST + w0 * LP, LP, sQ, LQ, hdp);
            __syncwarp();
        }
    __syncthreads();
    uint16_t *dx = a.dqkv + b * T * a.ldd;
    for (int i = threadIdx.x; i < R * hd; i += blockDim.x) {
        int r = i / (int)hd, c = i % (int)hd;
        int64_t k = k0 + r;
        if (k < T) {
            dx[k * a.ldd + (a.nh + j) * hd + c] = f2bf(sdK[r * LO + c]);
            dx[k * a.ldd + (a.nh + a.nkv + j) * hd + c] = f2bf(sdV[r * LO + c]);
        }
    }
}

__host__ __device__ constexpr size_t fl_q_smem(int hdp)
{
    return (size_t)4 * kFlBwdRows * (hdp + 8) * 2 + (size_t)2 * kFlBwdRows * (kFlBC + 4) * 4 +
           (size_t)kFlBwdRows * (kFlBC + 8) * 2 + (size_t)kFlBwdRows * (hdp + 4) * 4 +
           2 * kFlBwdRows * 4;
}

// dQ of one query tile of one head: grid (query tiles of 32, heads, batch),
// 64 threads; the key tiles in order, written once.
__global__ void __launch_bounds__(64) k_flash_bwd_q(FlArgs a, int hdp)
{
    extern __shared__ __align__(128) unsigned char fl_smem[];
    const int LQ = hdp + 8, LS = kFlBC + 4, LP = kFlBC + 8, LO = hdp + 4, R = kFlBwdRows;
    uint16_t *sQ = (uint16_t *)fl_smem;
    uint16_t *sdO = sQ + R * LQ;
    uint16_t *sK = sdO + R * LQ;
    uint16_t *sV = sK + kFlBC * LQ;
    float *sS = (float *)(sV + kFlBC * LQ);
    float *sdP = sS + R * LS;
    uint16_t *sdS = (uint16_t *)(sdP + R * LS);
    float *sdQ = (float *)(sdS + R * LP);
    float *sLse = sdQ + R * LO, *sD = sLse + R;
    const int64_t T = a.T, hd = a.hd, b = blockIdx.z, h = blockIdx.y, j = h / (a.nh / a.nkv);
    // the last query tiles (the most keys) first: the long blocks start early
    const int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * R;
    const int64_t qend = q0 + R < T ? q0 + R : T;
    const uint16_t *x = a.qkv + b * T * a.ld, *dout = a.dout + b * T * a.ldo;
    const int32_t *ks = a.ks ? a.ks + b * T : nullptr;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, w0 = warp * 16;
    fl_load(sQ, LQ, x, a.ld, h * hd, q0, R, T, (int)hd, hdp);
    fl_load(sdO, LQ, dout, a.ldo, h * hd, q0, R, T, (int)hd, hdp);
    for (int i = threadIdx.x; i < R * LO; i += blockDim.x)
        sdQ[i] = 0.0f;
    if (threadIdx.x < R) {
        int64_t t = q0 + threadIdx.x;
        sLse[threadIdx.x] = t < T ? a.lse[(b * a.nh + h) * T + t] : 0.0f;
        sD[threadIdx.x] = t < T ? a.delta[(b * a.nh + h) * T + t] : 0.0f;
    }
    for (int64_t k0 = fl_first_key(ks, q0, qend); k0 < qend; k0 += kFlBC) {
        __syncthreads();
        fl_load_kv(sK, sV, LQ, x, a, j, k0, kFlBC, hdp);
        __syncthreads();
        for (int n = 0; n < kFlBC; n += 16) {
            FlAcc acc;
            fl_mm_nt(acc, sQ + w0 * LQ, LQ, sK + n * LQ, LQ, hdp);
            wmma::store_matrix_sync(sS + w0 * LS + n, acc, LS, wmma::mem_row_major);
            fl_mm_nt(acc, sdO + w0 * LQ, LQ, sV + n * LQ, LQ, hdp);
            wmma::store_matrix_sync(sdP + w0 * LS + n, acc, LS, wmma::mem_row_major);
        }
        __syncwarp();
        for (int r = w0; r < w0 + 16; r++) {
            int64_t t = q0 + r, k = k0 + lane;
            bool ok = fl_sees(ks, T, t, k);
            float p = ok ? expf(sS[r * LS + lane] * a.scale - sLse[r]) : 0.0f;
            sdS[r * LP + lane] = f2bf(p * (sdP[r * LS + lane] - sD[r]) * a.scale);
        }
        __syncwarp();
        fl_mm_acc(sdQ + w0 * LO, LO, sdS + w0 * LP, LP, sK, LQ, hdp);
        __syncwarp();
    }
    __syncthreads();
    uint16_t *dx = a.dqkv + b * T * a.ldd;
    for (int i = threadIdx.x; i < R * hd; i += blockDim.x) {
        int r = i / (int)hd, c = i % (int)hd;
        int64_t t = q0 + r;
        if (t < T)
            dx[t * a.ldd + h * hd + c] = f2bf(sdQ[r * LO + c]);
    }
}

// Launches the fused attention of `op` (forward, or delta + dK/dV + dQ).
cudaError_t flash_launch(const zn_op *op, cudaStream_t st, const char **what)
{
    FlArgs a;
    a.qkv = (const uint16_t *)op->u.flash.qkv;
    a.ld = op->u.flash.ld;
    a.B = op->u.flash.batch;
    a.T = op->u.flash.seq;
    a.nh = op->u.flash.nh;
    a.nkv = op->u.flash.nkv;
    a.hd = op->u.flash.hd;
    a.ks = op->u.flash.key_start;
    a.scale = op->u.flash.scale;
    a.out = (uint16_t *)op->u.flash.out;
    a.dout = (const uint16_t *)op->u.flash.dout;
    a.ldo = op->u.flash.ldo;
    a.lse = op->u.flash.lse;
    a.delta = op->u.flash.delta;
    a.dqkv = (uint16_t *)op->u.flash.dqkv;
    a.ldd = op->u.flash.ldd;
    *what = "fused attention (sizes)";
    if (op->u.flash.dt != ZN_DTYPE_BF16 || a.hd > ZN_FLASH_MAX_HEAD_DIM || a.B > 65535 ||
        a.nh > 65535 || a.T > ((int64_t)1 << 30))
        return cudaErrorInvalidValue;
    const int hdp = (int)((a.hd + 15) / 16 * 16);
    cudaError_t e;
    if (op->kind == ZN_OPK_FLASH_FWD) {
        size_t sm = fl_fwd_smem(hdp);
        *what = "k_flash_fwd";
        e = cudaFuncSetAttribute(k_flash_fwd, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)sm);
        if (e != cudaSuccess)
            return e;
        dim3 grid((unsigned)((a.T + kFlFwdRows - 1) / kFlFwdRows), (unsigned)a.nh,
                  (unsigned)a.B);
        k_flash_fwd<<<grid, 128, sm, st>>>(a, hdp);
        return cudaGetLastError();
    }
    *what = "k_flash_delta";
    int64_t rows = a.B * a.nh * a.T, blocks = (rows * 32 + kThreads - 1) / kThreads;
    if (blocks > 0x7fffffff)
        return cudaErrorInvalidValue;
    k_flash_delta<<<(unsigned)blocks, kThreads, 0, st>>>(a);
    if ((e = cudaGetLastError()) != cudaSuccess)
        return e;
    size_t sm = fl_kv_smem(hdp);
    *what = "k_flash_bwd_kv";
    e = cudaFuncSetAttribute(k_flash_bwd_kv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)sm);
    if (e != cudaSuccess)
        return e;
    dim3 gkv((unsigned)((a.T + kFlBwdRows - 1) / kFlBwdRows), (unsigned)a.nkv, (unsigned)a.B);
    k_flash_bwd_kv<<<gkv, 64, sm, st>>>(a, hdp);
    if ((e = cudaGetLastError()) != cudaSuccess)
        return e;
    sm = fl_q_smem(hdp);
    *what = "k_flash_bwd_q";
    e = cudaFuncSetAttribute(k_flash_bwd_q, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)sm);
    if (e != cudaSuccess)
        return e;
    dim3 gq((unsigned)((a.T + kFlBwdRows - 1) / kFlBwdRows), (unsigned)a.nh, (unsigned)a.B);
    k_flash_bwd_q<<<gq, 64, sm, st>>>(a, hdp);
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
        k_emb_bwd<<<dim3(grid_for(op->u.emb.dim),
                         (unsigned)(op->u.emb.vocab < 32 ? op->u.emb.vocab : 32)),
                    T, 0, st>>>(op->u.emb.ids, op->u.emb.n_tokens, op->u.emb.row0,
                                op->u.emb.vocab, op->u.emb.dim, op->u.emb.dout,
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
    case ZN_OPK_FLASH_FWD:
    case ZN_OPK_FLASH_BWD:
        return (int)flash_launch(op, st, what);
    default:
        *what = "zn_cuda_run_kernel (unknown op)";
        return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}
