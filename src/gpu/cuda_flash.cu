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
    float cap; // the scaled scores soft-capped, cap tanh(s / cap) (0: not)
    uint16_t *out; const uint16_t *dout; int64_t ldo; float *lse, *delta;
    uint16_t *dqkv; int64_t ldd;
};

__device__ __forceinline__ const __nv_bfloat16 *bfp(const uint16_t *p)
{
    return reinterpret_cast<const __nv_bfloat16 *>(p);
}

// `op` across the warp, every lane getting the result (butterfly).
template <typename Op>
__device__ __forceinline__ float warp_all(float v, Op op)
{
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
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

// A raw score's softmax input (scaled, capped when a.cap > 0) and, for the
// backward, d(input)/d(raw) / scale, 1 - tanh^2 (1 without a cap).
__device__ __forceinline__ float fl_score(float raw, const FlArgs &a, float *grad)
{
    float v = raw * a.scale;
    if (a.cap > 0.0f) {
        v = softcapf(v, 1.0f, a.cap);
        float t = v / a.cap;
        *grad = 1.0f - t * t;
    } else {
        *grad = 1.0f;
    }
    return v;
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

// A warp's 16 x 16 block of scores into fp32 smem (s, lds): A(16 x hdp)
// B^T, B's 16 rows read transposed (B^T row-major = B column-major), both
// bf16 with ld ldq: Q K^T and dO V^T, or for dK/dV, K Q^T and V dO^T.
__device__ __forceinline__ void fl_score16(float *s, int lds, const uint16_t *a,
                                           const uint16_t *b, int ldq, int hdp)
{
    FlAcc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < hdp; kk += 16) {
        FlA fa;
        FlBc fb;
        wmma::load_matrix_sync(fa, bfp(a + kk), ldq);
        wmma::load_matrix_sync(fb, bfp(b + kk), ldq);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(s, acc, lds, wmma::mem_row_major);
}

// The backward's scores and their gradients for one tile, a warp's 16 x
// kFlBC of each (fp32 smem s, dp with ld lds): A1 B1^T and A2 B2^T, 16
// columns of each in turn (Q K^T, dO V^T for dQ; K Q^T, V dO^T for dK/dV).
__device__ __forceinline__ void fl_score_pair(float *s, float *dp, int lds, const uint16_t *a1,
                                              const uint16_t *b1, const uint16_t *a2,
                                              const uint16_t *b2, int ldq, int hdp)
{
    for (int n = 0; n < kFlBC; n += 16) {
        fl_score16(s + n, lds, a1, b1 + n * ldq, ldq, hdp);
        fl_score16(dp + n, lds, a2, b2 + n * ldq, ldq, hdp);
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

// lse and delta of head h's queries [q0, q0 + rows) into smem, 0 past T.
__device__ __forceinline__ void fl_load_stats(float *lse, float *delta, const FlArgs &a,
                                              int64_t b, int64_t h, int64_t q0, int rows)
{
    if (threadIdx.x < rows) {
        int64_t t = q0 + threadIdx.x;
        lse[threadIdx.x] = t < a.T ? a.lse[(b * a.nh + h) * a.T + t] : 0.0f;
        delta[threadIdx.x] = t < a.T ? a.delta[(b * a.nh + h) * a.T + t] : 0.0f;
    }
}

// fp32 smem [rows][lds] into rows [r0, r0 + rows) x columns [c0, c0 + hd)
// of a bf16 matrix, rows past T left alone: fl_load's way back.
__device__ void fl_store(uint16_t *g, int64_t ld, int64_t c0, int64_t r0, const float *sm,
                         int lds, int rows, int64_t T, int hd)
{
    for (int i = threadIdx.x; i < rows * hd; i += blockDim.x) {
        int r = i / hd, c = i % hd;
        int64_t t = r0 + r;
        if (t < T)
            g[t * ld + c0 + c] = f2bf(sm[r * lds + c]);
    }
}

// ---- shared memory -----------------------------------------------------------
// Every kernel's tiles, in dynamic shared memory (FlFwdTiles, FlBwdTiles).
extern __shared__ __align__(128) unsigned char fl_smem[];

// Leading dimensions of the tiles, padded against bank conflicts: LQ for
// head-dim rows (bf16 Q, K, V, dO), LS for fp32 scores, LP for bf16
// probabilities, LO for fp32 sums over the head dim.
struct FlLd {
    int LQ, LS, LP, LO;
    __host__ __device__ explicit FlLd(int hdp)
        : LQ(hdp + 8), LS(kFlBC + 4), LP(kFlBC + 8), LO(hdp + 4)
    {
    }
};

// Hands out a block's shared memory tile after tile, counting the bytes:
// on the host (at null) it only counts, so that one layout gives a kernel
// its tiles and its launch the byte count.
struct FlSmem {
    unsigned char *at;
    size_t used;
    template <typename T> __host__ __device__ T *take(int count)
    {
        used += (size_t)count * sizeof(T);
#ifdef __CUDA_ARCH__
        T *p = reinterpret_cast<T *>(at);
        at = reinterpret_cast<unsigned char *>(p + count);
        return p;
#else
        return nullptr;
#endif
    }
};

// The forward's tiles: its 64 query rows, a tile of keys and values, the
// tile's scores and probabilities, the output sums and each row's running
// max M, sum L and rescale factor A. *bytes: what they take.
struct FlFwdTiles {
    uint16_t *Q, *K, *V;
    float *S;
    uint16_t *P;
    float *O, *M, *L, *A;
    __host__ __device__ FlFwdTiles(unsigned char *base, int hdp, size_t *bytes = nullptr)
    {
        const auto [LQ, LS, LP, LO] = FlLd(hdp);
        const int R = kFlFwdRows;
        FlSmem m = { base, 0 };
        Q = m.take<uint16_t>(R * LQ);
        K = m.take<uint16_t>(kFlBC * LQ);
        V = m.take<uint16_t>(kFlBC * LQ);
        S = m.take<float>(R * LS);
        P = m.take<uint16_t>(R * LP);
        O = m.take<float>(R * LO);
        M = m.take<float>(R);
        L = m.take<float>(R);
        A = m.take<float>(R);
        if (bytes)
            *bytes = m.used;
    }
};

// The backward's tiles, one layout for its two kernels, whose blocks are as
// wide as their tiles: the block's 32 rows of two head-dim matrices (mine:
// K, V for dK/dV; Q, dO for dQ), a tile of the other two (theirs), fp32
// scores s and their gradients dp (transposed for dK/dV), n_out bf16 tiles
// p and fp32 sums (P^T, dS^T and dK, dV; dS and dQ), and the lse and delta
// of the query rows.
static_assert(kFlBwdRows == kFlBC, "a backward block is one tile wide");
struct FlBwdTiles {
    uint16_t *mine[2], *theirs[2], *p[2];
    float *s, *dp, *sum[2], *lse, *delta;
    __host__ __device__ FlBwdTiles(unsigned char *base, int hdp, int n_out,
                                   size_t *bytes = nullptr)
    {
        const auto [LQ, LS, LP, LO] = FlLd(hdp);
        const int R = kFlBwdRows;
        FlSmem m = { base, 0 };
        mine[0] = m.take<uint16_t>(R * LQ);
        mine[1] = m.take<uint16_t>(R * LQ);
        theirs[0] = m.take<uint16_t>(kFlBC * LQ);
        theirs[1] = m.take<uint16_t>(kFlBC * LQ);
        s = m.take<float>(R * LS);
        dp = m.take<float>(R * LS);
        p[0] = m.take<uint16_t>(R * LP);
        p[1] = n_out > 1 ? m.take<uint16_t>(R * LP) : nullptr;
        sum[0] = m.take<float>(R * LO);
        sum[1] = n_out > 1 ? m.take<float>(R * LO) : nullptr;
        lse = m.take<float>(kFlBC);
        delta = m.take<float>(kFlBC);
        if (bytes)
            *bytes = m.used;
    }
};

// The launch's shared memory bytes for a block of Tiles.
template <typename Tiles, typename... Shape>
size_t fl_smem_bytes(Shape... shape)
{
    size_t bytes = 0;
    const Tiles tiles(nullptr, shape..., &bytes);
    (void)tiles;
    return bytes;
}

// ---- kernels -------------------------------------------------------------------
// grid (query tiles of 64, heads, batch), 128 threads.
__global__ void __launch_bounds__(128) k_flash_fwd(FlArgs a, int hdp)
{
    const auto [LQ, LS, LP, LO] = FlLd(hdp);
    const int R = kFlFwdRows;
    const auto [sQ, sK, sV, sS, sP, sO, sM, sL, sA] = FlFwdTiles(fl_smem, hdp);
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
        for (int n = 0; n < kFlBC; n += 16)
            fl_score16(sS + w0 * LS + n, LS, sQ + w0 * LQ, sK + n * LQ, LQ, hdp);
        __syncwarp();
        for (int r = w0; r < w0 + 16; r++) {
            int64_t t = q0 + r, k = k0 + lane;
            bool ok = fl_sees(ks, T, t, k);
            float gr;
            float sv = ok ? fl_score(sS[r * LS + lane], a, &gr) : -INFINITY;
            float mo = sM[r], mn = fmaxf(mo, warp_all(sv, MaxOp())), p = 0.0f, alpha = 1.0f;
            if (mn != -INFINITY) {
                alpha = expf(mo - mn);
                p = ok ? expf(sv - mn) : 0.0f;
            }
            float sum = warp_all(p, SumOp());
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
    s = warp_all(s, SumOp());
    if (lane == 0)
        a.delta[w] = s;
}

// dK, dV of one key tile of one kv head: grid (key tiles of 32, kv heads,
// batch), 64 threads. Sums over the group's heads, then the query tiles in
// order; written once.
__global__ void __launch_bounds__(64) k_flash_bwd_kv(FlArgs a, int hdp)
{
    const int R = kFlBwdRows;
    const int64_t T = a.T, hd = a.hd, b = blockIdx.z, j = blockIdx.y, g = a.nh / a.nkv;
    const int64_t k0 = (int64_t)blockIdx.x * R, kend = k0 + R < T ? k0 + R : T;
    const uint16_t *x = a.qkv + b * T * a.ld, *dout = a.dout + b * T * a.ldo;
    const int32_t *ks = a.ks ? a.ks + b * T : nullptr;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, w0 = warp * 16;
    const auto [LQ, LS, LP, LO] = FlLd(hdp);
    const FlBwdTiles tiles(fl_smem, hdp, 2);
    const auto [sK, sV] = tiles.mine;    // the block's keys
    const auto [sQ, sdO] = tiles.theirs; // a tile of queries
    const auto [sPT, sdST] = tiles.p;
    const auto [sdK, sdV] = tiles.sum;
    float *sST = tiles.s, *sdPT = tiles.dp, *sLse = tiles.lse, *sD = tiles.delta;
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
            fl_load_stats(sLse, sD, a, b, h, q0, kFlBC);
            __syncthreads();
            fl_score_pair(sST + w0 * LS, sdPT + w0 * LS, LS, sK + w0 * LQ, sQ, sV + w0 * LQ, sdO,
                          LQ, hdp);
            __syncwarp();
            for (int r = w0; r < w0 + 16; r++) {
                int64_t k = k0 + r, t = q0 + lane;
                bool ok = fl_sees(ks, T, t, k);
                float gr, sv = fl_score(sST[r * LS + lane], a, &gr);
                float p = ok ? expf(sv - sLse[lane]) : 0.0f;
                float ds = p * (sdPT[r * LS + lane] - sD[lane]) * a.scale;
                sPT[r * LP + lane] = f2bf(p);
                sdST[r * LP + lane] = f2bf(a.cap > 0.0f ? ds * gr : ds);
            }
            __syncwarp();
            fl_mm_acc(sdV + w0 * LO, LO, sPT + w0 * LP, LP, sdO, LQ, hdp);
            fl_mm_acc(sdK + w0 * LO, LO, sdST + w0 * LP, LP, sQ, LQ, hdp);
            __syncwarp();
        }
    __syncthreads();
    uint16_t *dx = a.dqkv + b * T * a.ldd;
    fl_store(dx, a.ldd, (a.nh + j) * hd, k0, sdK, LO, R, T, (int)hd);
    fl_store(dx, a.ldd, (a.nh + a.nkv + j) * hd, k0, sdV, LO, R, T, (int)hd);
}

// dQ of one query tile of one head: grid (query tiles of 32, heads, batch),
// 64 threads; the key tiles in order, written once.
__global__ void __launch_bounds__(64) k_flash_bwd_q(FlArgs a, int hdp)
{
    const auto [LQ, LS, LP, LO] = FlLd(hdp);
    const int R = kFlBwdRows;
    const FlBwdTiles tiles(fl_smem, hdp, 1);
    const auto [sQ, sdO] = tiles.mine;  // the block's queries
    const auto [sK, sV] = tiles.theirs; // a tile of keys
    uint16_t *sdS = tiles.p[0];
    float *sS = tiles.s, *sdP = tiles.dp, *sdQ = tiles.sum[0], *sLse = tiles.lse;
    float *sD = tiles.delta;
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
    fl_load_stats(sLse, sD, a, b, h, q0, R);
    for (int64_t k0 = fl_first_key(ks, q0, qend); k0 < qend; k0 += kFlBC) {
        __syncthreads();
        fl_load_kv(sK, sV, LQ, x, a, j, k0, kFlBC, hdp);
        __syncthreads();
        fl_score_pair(sS + w0 * LS, sdP + w0 * LS, LS, sQ + w0 * LQ, sK, sdO + w0 * LQ, sV, LQ,
                      hdp);
        __syncwarp();
        for (int r = w0; r < w0 + 16; r++) {
            int64_t t = q0 + r, k = k0 + lane;
            bool ok = fl_sees(ks, T, t, k);
            float gr, sv = fl_score(sS[r * LS + lane], a, &gr);
            float p = ok ? expf(sv - sLse[r]) : 0.0f;
            float ds = p * (sdP[r * LS + lane] - sD[r]) * a.scale;
            sdS[r * LP + lane] = f2bf(a.cap > 0.0f ? ds * gr : ds);
        }
        __syncwarp();
        fl_mm_acc(sdQ + w0 * LO, LO, sdS + w0 * LP, LP, sK, LQ, hdp);
        __syncwarp();
    }
    __syncthreads();
    fl_store(a.dqkv + b * T * a.ldd, a.ldd, h * hd, q0, sdQ, LO, R, T, (int)hd);
}

// Sets the dynamic shared memory a kernel needs and launches it.
cudaError_t fl_launch(void (*kernel)(FlArgs, int), const char *name, dim3 grid, int threads,
                      size_t smem, cudaStream_t st, const FlArgs &a, int hdp, const char **what)
{
    *what = name;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess)
        return e;
    kernel<<<grid, threads, smem, st>>>(a, hdp);
    return cudaGetLastError();
}

} // namespace

// Launches the fused attention of `op` (forward, or delta + dK/dV + dQ).
cudaError_t zn_cuda_run_flash(const zn_op *op, cudaStream_t st, const char **what)
{
    const auto &fl = op->u.flash;
    const FlArgs a = { (const uint16_t *)fl.qkv, fl.ld, fl.batch, fl.seq, fl.nh, fl.nkv, fl.hd,
                       fl.key_start, fl.scale, fl.softcap, (uint16_t *)fl.out,
                       (const uint16_t *)fl.dout,
                       fl.ldo, fl.lse, fl.delta, (uint16_t *)fl.dqkv, fl.ldd };
    *what = "fused attention (sizes)";
    if (fl.dt != ZN_DTYPE_BF16 || a.hd > ZN_FLASH_MAX_HEAD_DIM || a.B > 65535 || a.nh > 65535 ||
        a.T > ((int64_t)1 << 30))
        return cudaErrorInvalidValue;
    const int hdp = (int)((a.hd + 15) / 16 * 16);
    if (op->kind == ZN_OPK_FLASH_FWD)
        return fl_launch(k_flash_fwd, "k_flash_fwd",
                         dim3((unsigned)((a.T + kFlFwdRows - 1) / kFlFwdRows), (unsigned)a.nh,
                              (unsigned)a.B),
                         128, fl_smem_bytes<FlFwdTiles>(hdp), st, a, hdp, what);
    int64_t rows = a.B * a.nh * a.T, blocks = (rows * 32 + kThreads - 1) / kThreads;
    *what = "k_flash_delta";
    if (blocks > kMaxBlocks)
        return cudaErrorInvalidValue;
    cudaError_t e = launch(what, "k_flash_delta", k_flash_delta, dim3((unsigned)blocks), st, a);
    if (e != cudaSuccess)
        return e;
    const unsigned tiles = (unsigned)((a.T + kFlBwdRows - 1) / kFlBwdRows);
    e = fl_launch(k_flash_bwd_kv, "k_flash_bwd_kv", dim3(tiles, (unsigned)a.nkv, (unsigned)a.B),
                  64, fl_smem_bytes<FlBwdTiles>(hdp, 2), st, a, hdp, what);
    if (e != cudaSuccess)
        return e;
    return fl_launch(k_flash_bwd_q, "k_flash_bwd_q", dim3(tiles, (unsigned)a.nh, (unsigned)a.B),
                     64, fl_smem_bytes<FlBwdTiles>(hdp, 1), st, a, hdp, what);
}
