/* A mixture-of-experts MLP (qwen3_moe, mixtral), as transformers'
 * Qwen3MoeSparseMoeBlock and MixtralSparseMoeBlock compute it: router logits x Wr^T, their softmax in fp32, the top k
 * experts of each token (their probabilities renormalized with
 * norm_topk_prob, then cast to the compute type), each expert a SwiGLU MLP
 * over the rows routed to it, the outputs weighted and summed per token in
 * expert order. The routing is decided on the host from the logits read
 * back (so it is one C function, the same on every placement and backend;
 * ties in the top-k as torch.topk breaks them on the CPU);
 * the rows move with the device's gather / scatter-add / dot ops and the
 * experts run as one GEMM each over their rows. The backward recomputes
 * the forward from the layer's MLP input and goes through the experts, the
 * routing weights, the renormalization, the top-k selection and the
 * softmax as autograd does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "model/model-impl.h"
#include "util/try-impl.h"

/* y[n][out] = x[n][in] W[out][in]^T */
static int rows_linear(zn_model *m, zn_stream *s, int64_t n, const void *x, const void *W,
                       int64_t out, int64_t in, void *y)
{
    return zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_TRANS, n, out, in, 1.0f, x, m->dt, in, W,
                       m->dt, in, 0.0f, y, m->dt, out);
}

/* ---- top-k as torch.topk computes it on the CPU ------------------------------------
 * ATen's CPU topk puts (value, index) pairs in a vector and, largest first,
 * runs libstdc++'s std::partial_sort when k * 64 <= n, else std::nth_element
 * on the k-th and std::sort over the k - 1 before it. Which of several
 * equal probabilities are chosen, and their order, is those algorithms'
 * (not the lower index): a zero-initialized router ties every expert. The
 * functions below are those algorithms step for step (introselect with
 * median-of-three pivots, introsort, insertion sorts, the binary heap);
 * checked against torch.topk on 12,200 tie-heavy rows (n 2..256, k 1..8)
 * when written. */
static int before(const zn_m_topk_el *a, const zn_m_topk_el *b)
{
    return a->v > b->v;
}

static void el_swap(zn_m_topk_el *q, int64_t a, int64_t b)
{
    zn_m_topk_el t = q[a];
    q[a] = q[b];
    q[b] = t;
}

static int64_t lg2(int64_t n)
{
    int64_t l = 0;
    while (n >>= 1)
        l++;
    return l;
}

static void median_to_first(zn_m_topk_el *q, int64_t r, int64_t a, int64_t b, int64_t c)
{
    if (before(&q[a], &q[b])) {
        if (before(&q[b], &q[c]))
            el_swap(q, r, b);
        else if (before(&q[a], &q[c]))
            el_swap(q, r, c);
        else
            el_swap(q, r, a);
    } else if (before(&q[a], &q[c])) {
        el_swap(q, r, a);
    } else if (before(&q[b], &q[c])) {
        el_swap(q, r, c);
    } else {
        el_swap(q, r, b);
    }
}

static int64_t unguarded_partition(zn_m_topk_el *q, int64_t first, int64_t last, int64_t pivot)
{
    for (;;) {
        while (before(&q[first], &q[pivot]))
            first++;
        last--;
        while (before(&q[pivot], &q[last]))
            last--;
        if (!(first < last))
            return first;
        el_swap(q, first, last);
        first++;
    }
}

static int64_t partition_pivot(zn_m_topk_el *q, int64_t first, int64_t last)
{
    median_to_first(q, first, first + 1, first + (last - first) / 2, last - 1);
    return unguarded_partition(q, first + 1, last, first);
}

static void linear_insert(zn_m_topk_el *q, int64_t i)
{
    zn_m_topk_el val = q[i];
    while (before(&val, &q[i - 1])) {
        q[i] = q[i - 1];
        i--;
    }
    q[i] = val;
}

static void insertion_sort(zn_m_topk_el *q, int64_t first, int64_t last)
{
    for (int64_t i = first + 1; i < last; i++) {
        if (before(&q[i], &q[first])) {
            zn_m_topk_el val = q[i];
            memmove(&q[first + 1], &q[first], (size_t)(i - first) * sizeof *q);
            q[first] = val;
        } else {
            linear_insert(q, i);
        }
    }
}

static void adjust_heap(zn_m_topk_el *q, int64_t first, int64_t hole, int64_t len,
                        zn_m_topk_el value)
{
    const int64_t top = hole;
    int64_t second = hole;
    while (second < (len - 1) / 2) {
        second = 2 * (second + 1);
        if (before(&q[first + second], &q[first + second - 1]))
            second--;
        q[first + hole] = q[first + second];
        hole = second;
    }
    if ((len & 1) == 0 && second == (len - 2) / 2) {
        second = 2 * (second + 1);
        q[first + hole] = q[first + second - 1];
        hole = second - 1;
    }
    int64_t parent = (hole - 1) / 2;
    while (hole > top && before(&q[first + parent], &value)) {
        q[first + hole] = q[first + parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    q[first + hole] = value;
}

static void make_heap(zn_m_topk_el *q, int64_t first, int64_t last)
{
    int64_t n = last - first;
    if (n < 2)
        return;
    for (int64_t parent = (n - 2) / 2;; parent--) {
        adjust_heap(q, first, parent, n, q[first + parent]);
        if (parent == 0)
            return;
    }
}

static void pop_heap(zn_m_topk_el *q, int64_t first, int64_t last, int64_t result)
{
    zn_m_topk_el value = q[result];
    q[result] = q[first];
    adjust_heap(q, first, 0, last - first, value);
}

static void heap_select(zn_m_topk_el *q, int64_t first, int64_t middle, int64_t last)
{
    make_heap(q, first, middle);
    for (int64_t i = middle; i < last; i++)
        if (before(&q[i], &q[first]))
            pop_heap(q, first, middle, i);
}

static void sort_heap(zn_m_topk_el *q, int64_t first, int64_t last)
{
    while (last - first > 1) {
        last--;
        pop_heap(q, first, last, last);
    }
}

static void introselect(zn_m_topk_el *q, int64_t first, int64_t nth, int64_t last, int64_t depth)
{
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(q, first, nth + 1, last);
            el_swap(q, first, nth);
            return;
        }
        depth--;
        int64_t cut = partition_pivot(q, first, last);
        if (cut <= nth)
            first = cut;
        else
            last = cut;
    }
    insertion_sort(q, first, last);
}

static void introsort_loop(zn_m_topk_el *q, int64_t first, int64_t last, int64_t depth)
{
    while (last - first > 16) {
        if (depth == 0) {
            heap_select(q, first, last, last);
            sort_heap(q, first, last);
            return;
        }
        depth--;
        int64_t cut = partition_pivot(q, first, last);
        introsort_loop(q, cut, last, depth);
        last = cut;
    }
}

static void std_sort(zn_m_topk_el *q, int64_t first, int64_t last)
{
    if (first == last)
        return;
    introsort_loop(q, first, last, 2 * lg2(last - first));
    if (last - first > 16) {
        insertion_sort(q, first, first + 16);
        for (int64_t i = first + 16; i < last; i++)
            linear_insert(q, i);
    } else {
        insertion_sort(q, first, last);
    }
}

void zn_m_topk(const float *p, int64_t n, int64_t k, zn_m_topk_el *q, int32_t *sel, float *val)
{
    for (int64_t e = 0; e < n; e++)
        q[e] = (zn_m_topk_el){ p[e], (int32_t)e };
    if (k * 64 <= n) {
        heap_select(q, 0, k, n);
        sort_heap(q, 0, k);
    } else {
        introselect(q, 0, k - 1, n, 2 * lg2(n));
        std_sort(q, 0, k - 1);
    }
    for (int64_t j = 0; j < k; j++) {
        sel[j] = q[j].i;
        val[j] = q[j].v;
    }
}

/* Qwen3-MoE casts the routing weights to the compute type before they
 * scale the experts' outputs; Mixtral keeps them fp32 (torch promotes the
 * product). */
static int weights_rounded(const zn_model *m)
{
    return m->d.arch == ZN_ARCH_QWEN3_MOE;
}

/* Reads the router logits back and routes on the host: per expert its rows
 * (tokens in top-k slot order, then token order, as torch.where over
 * transformers' expert mask lists them) and their weights, uploaded to
 * moe_idx / moe_w. */
static int route(zn_model *m, zn_stream *s)
{
    const int64_t N = m->N, E = m->d.n_experts, K = m->d.top_k;
    const int round_w = weights_rounded(m);
    zn_m_moe_host *h = &m->moe;
    ZN_TRY(zn_dev_copy_d2h(m->dev, s, h->raw, m->moe_log, (size_t)(N * E) * m->esz));
    ZN_TRY(zn_dev_stream_sync(m->dev, s));
    for (int64_t t = 0; t < N; t++) {
        float *p = h->p + t * E;
        for (int64_t e = 0; e < E; e++)
            p[e] = m->dt == ZN_DTYPE_F32 ? ((const float *)h->raw)[t * E + e]
                                         : zn_bf16_widen(((const uint16_t *)h->raw)[t * E + e]);
        float mx = p[0];
        for (int64_t e = 1; e < E; e++)
            mx = p[e] > mx ? p[e] : mx;
        float sum = 0.0f;
        for (int64_t e = 0; e < E; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        for (int64_t e = 0; e < E; e++)
            p[e] /= sum;
        /* the top k, largest first, ties as torch.topk has them */
        float *v = h->val + t * K;
        zn_m_topk(p, E, K, h->q, h->sel + t * K, v);
        float vs = 0.0f;
        for (int64_t j = 0; j < K; j++)
            vs += v[j];
        h->vsum[t] = vs;
        for (int64_t j = 0; j < K; j++) {
            float w = m->d.norm_topk ? v[j] / vs : v[j];
            h->wt[t * K + j] = m->dt == ZN_DTYPE_F32 || !round_w ? w
                                                                  : zn_bf16_widen(zn_bf16_round(w));
        }
    }
    if (m->aux_cnt && !m->in_bwd && !m->decode) {
        /* the load-balancing loss's statistics (load_balancing_loss_func):
         * every top-k assignment and every token's probabilities, summed
         * per expert in fp32 over this forward's sparse layers */
        for (int64_t t = 0; t < N; t++) {
            for (int64_t j = 0; j < K; j++)
                m->aux_cnt[h->sel[t * K + j]] += 1.0;
        }
        for (int64_t e = 0; e < E; e++) {
            float sum = 0.0f;
            for (int64_t t = 0; t < N; t++)
                sum += h->p[t * E + e];
            m->aux_psum[e] += sum;
        }
        m->aux_rows += N;
    }
    int64_t at = 0;
    for (int64_t e = 0; e < E; e++) {
        h->off[e] = at;
        for (int64_t j = 0; j < K; j++)
            for (int64_t t = 0; t < N; t++)
                if (h->sel[t * K + j] == e) {
                    h->idx[at] = (int32_t)t;
                    h->w[at] = h->wt[t * K + j];
                    h->slot[t * K + j] = (int32_t)at;
                    at++;
                }
    }
    h->off[E] = at;
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->moe_idx, h->idx, (size_t)at * 4));
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->moe_w, h->w, (size_t)at * 4));
    /* the host arrays are the next layer's: the copies must have read them */
    return zn_dev_stream_sync(m->dev, s);
}

/* Expert e's three tensors (or gradients) in the layer's array. */
static void *expert_param(const zn_model *m, int layer, void *const *params, int64_t e, int w)
{
    return params[zn_m_moe_index(&m->d, layer) + 1 + 3 * e + w];
}

static float *expert_grad(const zn_model *m, int layer, float *const *grads, int64_t e, int w)
{
    return grads[zn_m_moe_index(&m->d, layer) + 1 + 3 * e + w];
}

/* Routing and every expert's rows up to their outputs (moe_eo), from the
 * MLP input x. */
static int experts_fwd(zn_model *m, zn_stream *s, int layer, void *const *params, const void *x)
{
    const int64_t N = m->N, H = m->H, E = m->d.n_experts, Im = m->d.moe_intermediate;
    const size_t es = m->esz;
    ZN_TRY(rows_linear(m, s, N, x, params[zn_m_moe_index(&m->d, layer)], E, H, m->moe_log));
    ZN_TRY(route(m, s));
    for (int64_t e = 0; e < E; e++) {
        int64_t o = m->moe.off[e], n = m->moe.off[e + 1] - o;
        if (!n)
            continue;
        void *xg = zn_m_at(m->moe_xg, o * H, es), *g = zn_m_at(m->moe_g, o * Im, es);
        void *u = zn_m_at(m->moe_u, o * Im, es), *a = zn_m_at(m->moe_a, o * Im, es);
        ZN_TRY(zn_dev_rows_gather(m->dev, s, m->moe_idx + o, n, NULL, x, m->dt, N, H, xg, m->dt));
        ZN_TRY(rows_linear(m, s, n, xg, expert_param(m, layer, params, e, 0), Im, H, g));
        ZN_TRY(rows_linear(m, s, n, xg, expert_param(m, layer, params, e, 1), Im, H, u));
        ZN_TRY(zn_dev_swiglu_fwd(m->dev, s, g, u, a, m->dt, n * Im));
        ZN_TRY(rows_linear(m, s, n, a, expert_param(m, layer, params, e, 2), H, Im,
                           zn_m_at(m->moe_eo, o * H, es)));
    }
    return 0;
}

int zn_m_moe_fwd(zn_model *m, zn_stream *s, int layer, void *const *params, const void *x,
                 void *y)
{
    const int64_t N = m->N, H = m->H, E = m->d.n_experts;
    ZN_TRY(experts_fwd(m, s, layer, params, x));
    ZN_TRY(zn_dev_memset(m->dev, s, m->moe_acc, 0, (size_t)(N * H) * 4));
    for (int64_t e = 0; e < E; e++) {
        int64_t o = m->moe.off[e], n = m->moe.off[e + 1] - o;
        ZN_TRY(zn_dev_rows_scatter_add(m->dev, s, m->moe_idx + o, n, m->moe_w + o,
                                       zn_m_at(m->moe_eo, o * H, m->esz), m->dt, N, H,
                                       m->moe_acc));
    }
    return zn_dev_add_inplace(m->dev, s, y, m->dt, m->moe_acc, ZN_DTYPE_F32, N * H);
}

/* The routing weights' gradient (dw, one per routed row) to the router
 * logits' (into moe_log, the compute type): through the cast, the
 * renormalization, the top-k's scatter and the softmax. */
static int router_bwd(zn_model *m, zn_stream *s)
{
    const int64_t N = m->N, E = m->d.n_experts, K = m->d.top_k;
    zn_m_moe_host *h = &m->moe;
    ZN_TRY(zn_dev_copy_d2h(m->dev, s, h->dw, m->moe_dw, (size_t)h->off[E] * 4));
    ZN_TRY(zn_dev_stream_sync(m->dev, s));
    for (int64_t t = 0; t < N; t++) {
        const float *p = h->p + t * E, *v = h->val + t * K;
        float *dp = h->dp;
        for (int64_t e = 0; e < E; e++)
            dp[e] = 0.0f;
        float dot = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            float g = h->dw[h->slot[t * K + j]];
            if (m->dt != ZN_DTYPE_F32 && weights_rounded(m)) /* the weights' gradient in
                                                                their type */
                g = zn_bf16_widen(zn_bf16_round(g));
            h->dv[j] = g;
            dot += g * v[j];
        }
        if (m->aux_cnt && m->aux_rows) {
            /* coef x E sum_e (count_e / R) (sum_t p_te / R): d / d p_te =
             * coef E count_e / R^2, the counts held fixed (torch's histc) */
            const double R = (double)m->aux_rows;
            for (int64_t e = 0; e < E; e++)
                dp[e] = (float)(m->d.router_aux_coef * (double)E * (m->aux_cnt[e] / R) / R);
        }
        for (int64_t j = 0; j < K; j++) {
            /* v / S: dv = (g - sum_i g_i v_i / S) / S */
            float g = m->d.norm_topk ? (h->dv[j] - dot / h->vsum[t]) / h->vsum[t] : h->dv[j];
            dp[h->sel[t * K + j]] += g;
        }
        float pd = 0.0f;
        for (int64_t e = 0; e < E; e++)
            pd += p[e] * dp[e];
        for (int64_t e = 0; e < E; e++) {
            float dl = p[e] * (dp[e] - pd);
            if (m->dt == ZN_DTYPE_F32)
                ((float *)h->raw)[t * E + e] = dl;
            else
                ((uint16_t *)h->raw)[t * E + e] = zn_bf16_round(dl);
        }
    }
    ZN_TRY(zn_dev_copy_h2d(m->dev, s, m->moe_log, h->raw, (size_t)(N * E) * m->esz));
    return zn_dev_stream_sync(m->dev, s);
}

int zn_m_moe_bwd(zn_model *m, zn_stream *s, int layer, void *const *params, float *const *grads,
                 const void *x, const void *dy, float *dx)
{
    const int64_t N = m->N, H = m->H, E = m->d.n_experts, Im = m->d.moe_intermediate;
    const size_t es = m->esz;
    const zn_dtype dt = m->dt;
    m->in_bwd = 1; /* the recompute adds nothing to the load-balancing statistics */
    int rc = experts_fwd(m, s, layer, params, x);
    m->in_bwd = 0;
    ZN_TRY(rc);
    ZN_TRY(zn_dev_memset(m->dev, s, dx, 0, (size_t)(N * H) * 4));
    for (int64_t e = 0; e < E; e++) {
        int64_t o = m->moe.off[e], n = m->moe.off[e + 1] - o;
        if (!n)
            continue;
        const int32_t *idx = m->moe_idx + o;
        void *xg = zn_m_at(m->moe_xg, o * H, es), *g = zn_m_at(m->moe_g, o * Im, es);
        void *u = zn_m_at(m->moe_u, o * Im, es), *a = zn_m_at(m->moe_a, o * Im, es);
        void *eo = zn_m_at(m->moe_eo, o * H, es);
        float *dxg = m->moe_dxg + o * H;
        const void *Wg = expert_param(m, layer, params, e, 0);
        const void *Wu = expert_param(m, layer, params, e, 1);
        const void *Wd = expert_param(m, layer, params, e, 2);
        float *dWg = expert_grad(m, layer, grads, e, 0), *dWu = expert_grad(m, layer, grads, e, 1);
        float *dWd = expert_grad(m, layer, grads, e, 2);
        /* d(weight) = dy . expert output; then d(output) = w dy, over eo */
        ZN_TRY(zn_dev_rows_dot(m->dev, s, idx, n, dy, dt, N, eo, dt, H, m->moe_dw + o));
        ZN_TRY(zn_dev_rows_gather(m->dev, s, idx, n, m->moe_w + o, dy, dt, N, H, eo, dt));
        if (dWd)
            ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, H, Im, n, 1.0f, eo, dt, H, a, dt,
                               Im, 1.0f, dWd, ZN_DTYPE_F32, Im));
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, n, Im, H, 1.0f, eo, dt, H, Wd, dt,
                           Im, 0.0f, a, dt, Im)); /* d(act), over act */
        ZN_TRY(zn_dev_swiglu_bwd(m->dev, s, g, u, a, g, u, dt, n * Im));
        if (dWg)
            ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, Im, H, n, 1.0f, g, dt, Im, xg, dt,
                               H, 1.0f, dWg, ZN_DTYPE_F32, H));
        if (dWu)
            ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, Im, H, n, 1.0f, u, dt, Im, xg, dt,
                               H, 1.0f, dWu, ZN_DTYPE_F32, H));
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, n, H, Im, 1.0f, g, dt, Im, Wg, dt,
                           H, 0.0f, dxg, ZN_DTYPE_F32, H));
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, n, H, Im, 1.0f, u, dt, Im, Wu, dt,
                           H, 1.0f, dxg, ZN_DTYPE_F32, H));
        ZN_TRY(zn_dev_rows_scatter_add(m->dev, s, idx, n, NULL, dxg, ZN_DTYPE_F32, N, H, dx));
    }
    ZN_TRY(router_bwd(m, s));
    int ri = zn_m_moe_index(&m->d, layer);
    if (grads[ri])
        ZN_TRY(zn_dev_gemm(m->dev, s, ZN_TRANS, ZN_NOTRANS, E, H, N, 1.0f, m->moe_log, dt, E, x,
                           dt, H, 1.0f, grads[ri], ZN_DTYPE_F32, H));
    return zn_dev_gemm(m->dev, s, ZN_NOTRANS, ZN_NOTRANS, N, H, E, 1.0f, m->moe_log, dt, E,
                       params[ri], dt, H, 1.0f, dx, ZN_DTYPE_F32, H);
}

int zn_model_aux_loss(const zn_model *m, float *aux)
{
    *aux = 0.0f;
    if (!m->aux_cnt)
        return zn_set_error(ZN_EARG, "model: %s computes no load-balancing loss "
                            "(output_router_logits is false)", zn_model_arch_name(m->d.arch));
    if (!m->aux_rows)
        return 0;
    /* tokens_per_expert x router_prob_per_expert, summed, times num_experts
     * (each quotient in fp32, as torch divides its fp32 sums) */
    const float R = (float)m->aux_rows;
    float sum = 0.0f;
    for (int64_t e = 0; e < m->d.n_experts; e++)
        sum += ((float)m->aux_cnt[e] / R) * (m->aux_psum[e] / R);
    *aux = sum * (float)m->d.n_experts;
    return 0;
}
