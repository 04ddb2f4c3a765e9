// The fused attention on CUDA (host_kernels.c flash_fwd / flash_bwd are its
// C reference): bf16 tensor cores through WMMA 16x16x16 fragments with
// fp32 accumulation. Every operand goes through shared memory, so no
// fragment's element layout is assumed: S = Q K^T lands in fp32 smem, the
// softmax runs there a lane per key (a key tile is one warp wide), P goes
// back as bf16 for P V. Each warp owns 16 rows (queries, or keys in the
// dK/dV kernel) and only needs __syncwarp between its steps;
// __syncthreads guards the shared K/V (or Q/dO) tiles. Leading dimensions
// are padded (+8 bf16, +4 fp32) against bank conflicts and keep every
// fragment pointer 32-byte aligned.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <math.h>
#include <stdint.h>

#include "gpu/cuda-impl.cuh"

namespace {

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

} // namespace

// Launches the fused attention of `op` (forward, or delta + dK/dV + dQ).
cudaError_t zn_cuda_run_flash(const zn_op *op, cudaStream_t st, const char **what)
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
