// What the CUDA kernel files share (cuda_kernels.cu: the generic kernels
// and zn_cuda_run_kernel; cuda_nn.cu: the decoder's; cuda_flash.cu: the
// fused attention): bf16 loads and stores, block reductions, grid sizing,
// and each file's launcher for the ops it owns.
#ifndef ZN_GPU_CUDA_IMPL_CUH
#define ZN_GPU_CUDA_IMPL_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "gpu/gpu-impl.h"

// The launchers each file exports to the dispatcher (zn_cuda_run_kernel).
// Each returns a cudaError_t (cudaSuccess = launched) and names the kernel
// that failed in *what.
//   zn_cuda_run_nn: the decoder's ops (embedding, RMSNorm, RoPE, softmax,
//     SwiGLU, cross-entropy); scratch as for zn_cuda_run_kernel.
//   zn_cuda_run_flash: the fused attention, forward or backward.
//   zn_cuda_colsum: out[j] += the sum over rows of dy[r][j] (mode 0) or of
//     dy[r][j] * x[r][j] * rstd[r] (mode 1), deterministic, through scratch;
//     row r at r / heads rows of ld (x: ldx) and r % heads groups of cols in
//     (heads 1 and ldx == ld: plain rows).
cudaError_t zn_cuda_run_nn(const zn_op *op, cudaStream_t st, float *scratch, const char **what);
cudaError_t zn_cuda_run_flash(const zn_op *op, cudaStream_t st, const char **what);
cudaError_t zn_cuda_colsum(cudaStream_t st, const void *dy, int dydt, int64_t ld, const void *x,
                           int xdt, const float *rstd, int mode, int64_t rows, int64_t cols,
                           float *scratch, float *out, int64_t heads, int64_t ldx);

// Internal to each kernel file (its own copy of each helper, of the shared
// memory of the block reductions included).
namespace {

constexpr int kThreads = 256;   // block size (the fused attention's tiles set their own)

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

// Soft-capping (Gemma 2): cap tanh(scale x / cap), host_kernels.c's softcapf.
__device__ __forceinline__ float softcapf(float x, float scale, float cap)
{
    return cap * tanhf(x * scale / cap);
}

struct SumOp {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// `op` over the block (blockDim.x == kThreads), same tree every time: down
// each warp, then across the warps' results in warp 0; the result is
// returned to every thread. `none` stands in for the missing warps.
template <typename Op>
__device__ float block_reduce(float v, float none, Op op)
{
    __shared__ float sh[32];
    __shared__ float total;
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sh[lane] : none;
        for (int o = 16; o > 0; o >>= 1)
            v = op(v, __shfl_down_sync(0xffffffffu, v, o));
        if (lane == 0)
            total = v;
    }
    __syncthreads();
    float r = total;
    __syncthreads();   // sh/total may be reused by the caller's next reduction
    return r;
}

__device__ __forceinline__ float block_sum(float v)
{
    return block_reduce(v, 0.0f, SumOp());
}

__device__ __forceinline__ float block_max(float v)
{
    return block_reduce(v, -INFINITY, MaxOp());
}

#define GRID_STRIDE(i, n)                                                         \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);   \
         i += (int64_t)gridDim.x * blockDim.x)

inline unsigned grid_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    if (b > 65535LL * 16)
        b = 65535LL * 16;      // grid-stride loops cover the rest
    return (unsigned)(b > 0 ? b : 1);
}

constexpr int64_t kMaxBlocks = 0x7fffffff;   // in the grid's x dimension

// kernel<<<grid, kThreads>>>(args...) on st; *what names the kernel for the
// caller's message should the launch fail.
template <typename... Params, typename... Args>
cudaError_t launch(const char **what, const char *name, void (*kernel)(Params...), dim3 grid,
                   cudaStream_t st, Args... args)
{
    *what = name;
    kernel<<<grid, kThreads, 0, st>>>(args...);
    return cudaGetLastError();
}

// launch with a block per row, refusing more rows than a grid holds.
template <typename... Params, typename... Args>
cudaError_t launch_rows(const char **what, const char *name, void (*kernel)(Params...),
                        int64_t rows, cudaStream_t st, Args... args)
{
    *what = name;
    if (rows > kMaxBlocks)
        return cudaErrorInvalidValue;
    return launch(what, name, kernel, dim3((unsigned)rows), st, args...);
}

} // namespace

#endif
