// CUDA kernels of the decoder's ops: embedding, RMSNorm, RoPE, the GEMM
// attention's causal softmax, SwiGLU and cross-entropy in vocabulary
// chunks, each following its C reference in host_kernels.c (fp32 math,
// bf16 stored as uint16, reductions as fixed-shape trees).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "gpu/cuda-impl.cuh"

namespace {

__global__ void k_emb_fwd(const int32_t *ids, int64_t nt, int64_t row0, int64_t vocab,
                          int64_t dim, int skip, const void *table, int tdt, void *out, int odt,
                          float scale)
{
    GRID_STRIDE(i, nt * dim)
    {
        int64_t t = i / dim, j = i % dim;
        int64_t id = (int64_t)ids[t] - row0;
        bool ok = id >= 0 && id < vocab;
        if (!ok && skip)
            continue; // another part's row
        float v = ok ? ldv(table, tdt, id * dim + j) : 0.0f;
        stv(out, odt, i, scale != 1.0f ? v * scale : v);
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
                          int64_t dim, const void *dout, int ddt, float *dtable, float scale)
{
    const int64_t nb = gridDim.y, bucket = blockIdx.y;
    GRID_STRIDE(j, dim)
    {
        for (int64_t t = 0; t < nt; t++) {
            int64_t id = (int64_t)ids[t] - row0;
            if (id >= 0 && id < vocab && id % nb == bucket) {
                float g = ldv(dout, ddt, t * dim + j);
                dtable[id * dim + j] += scale != 1.0f ? g * scale : g;
            }
        }
    }
}

// Group r of the rows x heads groups starts at r / heads rows of ld and
// r % heads groups of dim in (the plain norm: heads 1, ld dim).
__device__ __forceinline__ int64_t rms_at(int64_t r, int64_t heads, int64_t ld, int64_t dim)
{
    return r / heads * ld + r % heads * dim;
}

// A norm weight with Gemma's offset (1 + w), or as it is (0).
__device__ __forceinline__ float wof(float w, float off)
{
    return off != 0.0f ? w + off : w;
}

// One block per group.
__global__ void k_rms_fwd(const void *x, int xdt, const void *w, int wdt, void *y, int ydt,
                          float *rstd, int64_t dim, float eps, int64_t heads, int64_t ldx,
                          int64_t ldy, float w_off)
{
    const int64_t r = blockIdx.x, o = rms_at(r, heads, ldx, dim), oy = rms_at(r, heads, ldy, dim);
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = ldv(x, xdt, o + j);
        ss += v * v;
    }
    ss = block_sum(ss);
    const float rs = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
        stv(y, ydt, oy + j, wof(ldv(w, wdt, j), w_off) * (ldv(x, xdt, o + j) * rs));
    if (rstd && threadIdx.x == 0)
        rstd[r] = rs;
}

__global__ void k_rms_bwd(const void *x, int xdt, const void *w, int wdt, const float *rstd,
                          const void *dy, int dydt, void *dx, int dxdt, int64_t dim,
                          int64_t heads, int64_t ldx, int64_t ldd, float w_off)
{
    const int64_t r = blockIdx.x, o = rms_at(r, heads, ldx, dim), od = rms_at(r, heads, ldd, dim);
    const float rs = rstd[r];
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
        dot += wof(ldv(w, wdt, j), w_off) * ldv(dy, dydt, od + j) * ldv(x, xdt, o + j);
    dot = block_sum(dot);
    const float c = dot / (float)dim * rs * rs;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
        float xv = ldv(x, xdt, o + j), dyv = ldv(dy, dydt, od + j);
        stv(dx, dxdt, od + j, rs * (wof(ldv(w, wdt, j), w_off) * dyv - xv * c));
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

// tanh GELU (transformers' gelu_pytorch_tanh) and its derivative, as the
// host reference computes them
#define GELU_K 0.7978845608028654f
__device__ __forceinline__ float gelu_tanh(float g)
{
    return 0.5f * g * (1.0f + tanhf(GELU_K * (g + 0.044715f * g * g * g)));
}

__device__ __forceinline__ float gelu_tanh_grad(float g)
{
    float t = tanhf(GELU_K * (g + 0.044715f * g * g * g));
    return 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * 0.044715f * g * g);
}

// act 0: SwiGLU (silu gate), 1: GeGLU (tanh GELU gate)
__global__ void k_swiglu_fwd(const void *gate, const void *up, void *out, int dt, int64_t n,
                             int act)
{
    GRID_STRIDE(i, n)
    {
        float g = ldv(gate, dt, i), u = ldv(up, dt, i);
        stv(out, dt, i, act ? gelu_tanh(g) * u : g * sigm(g) * u);
    }
}

__global__ void k_swiglu_bwd(const void *gate, const void *up, const void *dout, void *dgate,
                             void *dup, int dt, int64_t n, int act)
{
    GRID_STRIDE(i, n)
    {
        float g = ldv(gate, dt, i), u = ldv(up, dt, i), d = ldv(dout, dt, i);
        if (act) {
            stv(dgate, dt, i, d * u * gelu_tanh_grad(g));
            stv(dup, dt, i, d * gelu_tanh(g));
            continue;
        }
        float sg = sigm(g);
        stv(dgate, dt, i, d * u * sg * (1.0f + g * (1.0f - sg)));
        stv(dup, dt, i, d * g * sg);
    }
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
                           void *dl, int ddt, int64_t ldd, float cap)
{
    GRID_STRIDE(i, rows * cols)
    {
        int64_t r = i / cols, j = i % cols;
        int64_t t = targets[r];
        float g = 0.0f;
        if (t >= 0 && cap > 0.0f) { // through c = cap tanh(x / cap)
            float c = softcapf(ldv(logits, dt, r * ld + j), 1.0f, cap), tc = c / cap;
            g = gs * (expf(c - lse[r]) - (v0 + j == t ? 1.0f : 0.0f)) * (1.0f - tc * tc);
        } else if (t >= 0) {
            float p = expf(ldv(logits, dt, r * ld + j) - lse[r]);
            g = gs * (p - (v0 + j == t ? 1.0f : 0.0f));
        }
        stv(dl, ddt, r * ldd + j, g);
    }
}

// fwd: y = cap tanh(scale x / cap); bwd (x the forward's y): y = scale dy (1 - (x / cap)^2)
__global__ void k_softcap(const void *x, int xdt, const void *dy, int dydt, void *y, int ydt,
                          int64_t n, float scale, float cap, int bwd)
{
    GRID_STRIDE(i, n)
    {
        float v = ldv(x, xdt, i);
        if (bwd) {
            float t = v / cap;
            stv(y, ydt, i, scale * ldv(dy, dydt, i) * (1.0f - t * t));
        } else {
            stv(y, ydt, i, softcapf(v, scale, cap));
        }
    }
}

// Mixture-of-experts rows (host_kernels.c's rows_op). Gather: one thread an
// element. Scatter-add: one thread per (column, row bucket) walks the rows
// in order, as k_emb_bwd does, so repeated rows add in the reference's
// order without atomics. Dot: one thread a row, summing in column order
// (the reference's bits).
__global__ void k_rows_gather(const int32_t *idx, int64_t n, int64_t dim, const float *w,
                              const void *x, int xdt, void *y, int ydt)
{
    GRID_STRIDE(i, n * dim)
    {
        int64_t r = i / dim, c = i % dim;
        float v = ldv(x, xdt, (int64_t)idx[r] * dim + c);
        stv(y, ydt, i, w ? w[r] * v : v);
    }
}

__global__ void k_rows_scatter(const int32_t *idx, int64_t n, int64_t dim, const float *w,
                               const void *x, int xdt, float *y)
{
    const int64_t nb = gridDim.y, bucket = blockIdx.y;
    GRID_STRIDE(c, dim)
    {
        for (int64_t r = 0; r < n; r++) {
            int64_t t = idx[r];
            if (t % nb != bucket)
                continue;
            float v = ldv(x, xdt, r * dim + c);
            y[t * dim + c] += w ? w[r] * v : v;
        }
    }
}

__global__ void k_rows_dot(const int32_t *idx, int64_t n, int64_t dim, const void *a, int adt,
                           const void *x, int xdt, float *out)
{
    GRID_STRIDE(r, n)
    {
        int64_t t = idx[r];
        float acc = 0.0f;
        for (int64_t c = 0; c < dim; c++)
            acc += ldv(a, adt, t * dim + c) * ldv(x, xdt, r * dim + c);
        out[r] = acc;
    }
}

} // namespace

// Launches the kernel(s) of one of the decoder's ops (zn_cuda_run_kernel).
cudaError_t zn_cuda_run_nn(const zn_op *op, cudaStream_t st, float *scratch, const char **what)
{
    switch (op->kind) {
    case ZN_OPK_EMB_FWD: {
        const auto &emb = op->u.emb;
        return launch(what, "k_emb_fwd", k_emb_fwd, grid_for(emb.n_tokens * emb.dim), st,
                      emb.ids, emb.n_tokens, emb.row0, emb.vocab, emb.dim, emb.skip, emb.table,
                      emb.table_dt, emb.out, emb.out_dt, emb.scale);
    }
    case ZN_OPK_EMB_BWD: {
        const auto &emb = op->u.emb;
        dim3 grid(grid_for(emb.dim), (unsigned)(emb.vocab < 32 ? emb.vocab : 32));
        return launch(what, "k_emb_bwd", k_emb_bwd, grid, st, emb.ids, emb.n_tokens, emb.row0,
                      emb.vocab, emb.dim, emb.dout, emb.dout_dt, emb.dtable, emb.scale);
    }
    case ZN_OPK_RMS_FWD: {
        const auto &rms = op->u.rms_fwd;
        return launch_rows(what, "k_rms_fwd", k_rms_fwd, rms.rows * rms.heads, st, rms.x,
                           rms.x_dt, rms.w, rms.w_dt, rms.y, rms.y_dt, rms.rstd, rms.dim, rms.eps,
                           rms.heads, rms.ldx, rms.ldy, rms.w_off);
    }
    case ZN_OPK_RMS_BWD: {
        const auto &rms = op->u.rms_bwd;
        if (rms.rows * rms.heads > kMaxBlocks)
            return cudaErrorInvalidValue;
        // dw first: dx may overwrite dy.
        if (rms.dw) {
            *what = "rmsnorm dw column sum";
            cudaError_t e = zn_cuda_colsum(st, rms.dy, rms.dy_dt, rms.ldd, rms.x, rms.x_dt,
                                           rms.rstd, 1, rms.rows * rms.heads, rms.dim, scratch,
                                           rms.dw, rms.heads, rms.ldx);
            if (e != cudaSuccess)
                return e;
        }
        return launch_rows(what, "k_rms_bwd", k_rms_bwd, rms.rows * rms.heads, st, rms.x,
                           rms.x_dt, rms.w, rms.w_dt, rms.rstd, rms.dy, rms.dy_dt, rms.dx,
                           rms.dx_dt, rms.dim, rms.heads, rms.ldx, rms.ldd, rms.w_off);
    }
    case ZN_OPK_ROPE: {
        const auto &rope = op->u.rope;
        return launch(what, "k_rope", k_rope,
                      grid_for(rope.tokens * rope.n_heads * (rope.head_dim / 2)), st, rope.x,
                      rope.dt, rope.tokens, rope.n_heads, rope.head_dim, rope.ld, rope.pos,
                      rope.inv_freq, rope.inverse ? -1.0f : 1.0f);
    }
    case ZN_OPK_SOFTMAX_FWD: {
        const auto &sm = op->u.softmax;
        return launch_rows(what, "k_softmax_fwd", k_softmax_fwd, sm.batch * sm.rows, st, sm.S,
                           sm.S_dt, sm.P, sm.P_dt, sm.rows, sm.cols, sm.q_offset, sm.key_start,
                           sm.scale);
    }
    case ZN_OPK_SOFTMAX_BWD: {
        const auto &sm = op->u.softmax;
        return launch_rows(what, "k_softmax_bwd", k_softmax_bwd, sm.batch * sm.rows, st, sm.Pin,
                           sm.Pin_dt, sm.dP, sm.dP_dt, sm.P, sm.P_dt, sm.rows, sm.cols,
                           sm.q_offset, sm.key_start, sm.scale);
    }
    case ZN_OPK_SWIGLU_FWD: {
        const auto &sw = op->u.swiglu;
        return launch(what, "k_swiglu_fwd", k_swiglu_fwd, grid_for(sw.n), st, sw.gate, sw.up,
                      sw.out, sw.dt, sw.n, sw.act);
    }
    case ZN_OPK_SWIGLU_BWD: {
        const auto &sw = op->u.swiglu;
        return launch(what, "k_swiglu_bwd", k_swiglu_bwd, grid_for(sw.n), st, sw.gate, sw.up,
                      sw.dout, sw.dgate, sw.dup, sw.dt, sw.n, sw.act);
    }
    case ZN_OPK_XENT_FWD: {
        const auto &xent = op->u.xent;
        return launch_rows(what, "k_xent_fwd", k_xent_fwd, xent.rows, st, xent.logits, xent.dt,
                           xent.cols, xent.ld, xent.v0, xent.targets, xent.run_max,
                           xent.run_sum, xent.tgt, xent.first);
    }
    case ZN_OPK_XENT_FINISH: {
        const auto &xent = op->u.xent;
        return launch(what, "k_xent_finish", k_xent_finish, grid_for(xent.rows), st, xent.cmax,
                      xent.csum, xent.ctgt, xent.targets, xent.rows, xent.lse_out, xent.loss);
    }
    case ZN_OPK_XENT_BWD: {
        const auto &xent = op->u.xent;
        return launch(what, "k_xent_bwd", k_xent_bwd, grid_for(xent.rows * xent.cols), st,
                      xent.logits, xent.dt, xent.rows, xent.cols, xent.ld, xent.v0,
                      xent.targets, xent.lse, xent.grad_scale, xent.dlogits, xent.d_dt,
                      xent.ld_d, xent.softcap);
    }
    case ZN_OPK_SOFTCAP_FWD:
    case ZN_OPK_SOFTCAP_BWD: {
        const auto &sc = op->u.softcap;
        return launch(what, "k_softcap", k_softcap, grid_for(sc.n), st, sc.x, sc.x_dt, sc.dy,
                      sc.dy_dt, sc.y, sc.y_dt, sc.n, sc.scale, sc.cap,
                      op->kind == ZN_OPK_SOFTCAP_BWD ? 1 : 0);
    }
    case ZN_OPK_ROWS: {
        const auto &rw = op->u.rows;
        if (rw.mode == 0)
            return launch(what, "k_rows_gather", k_rows_gather, grid_for(rw.n * rw.dim), st,
                          rw.idx, rw.n, rw.dim, rw.w, rw.x, rw.x_dt, rw.y, rw.y_dt);
        if (rw.mode == 1) {
            dim3 grid(grid_for(rw.dim), (unsigned)(rw.rows < 32 ? rw.rows : 32));
            return launch(what, "k_rows_scatter", k_rows_scatter, grid, st, rw.idx, rw.n,
                          rw.dim, rw.w, rw.x, rw.x_dt, rw.y32);
        }
        return launch(what, "k_rows_dot", k_rows_dot, grid_for(rw.n), st, rw.idx, rw.n, rw.dim,
                      rw.a, rw.a_dt, rw.x, rw.x_dt, rw.out);
    }
    default:
        *what = "zn_cuda_run_nn (not a decoder op)";
        return cudaErrorInvalidValue;
    }
}
