/* bf16 master weights with stochastic rounding (zn_adam_step_sr): the step
 * widens a block of bf16 params into an fp32 buffer on the stack, steps it
 * (and its moments, in any format) with the fp32 kernel of the chosen
 * path, and rounds it back with random bits from a counter-based hash of
 * each element's index in the model (runs of indices: zn_sr_span).
 * The scalar kernels here follow the vector paths' operation order, so
 * every path gives the same bits. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "optim/optim-impl.h"

uint32_t zn_sr_bits(uint64_t seed, int64_t step, uint64_t index)
{
    uint32_t k1, k2;
    zn_sr_key(seed, step, (uint32_t)(index >> 32), &k1, &k2);
    return zn_sr_hash(k1, k2, (uint32_t)index);
}

uint16_t zn_f32_to_bf16_sr(float x, uint32_t r16)
{
    return zn_bf16_round_sr(x, r16 & 0xffffu);
}

void zn_sr_round_scalar(const float *x, uint16_t *out, size_t n, uint32_t k1, uint32_t k2,
                        uint32_t idx_lo)
{
    for (size_t i = 0; i < n; i++)
        out[i] = zn_bf16_round_sr(x[i], zn_sr_hash(k1, k2, idx_lo + (uint32_t)i));
}

/* One element as the AVX2 step8 computes it (optim_avx2.c): the same
 * operations in the same order, each FMA one fmaf. */
static inline void adam_elem_fma(const zn_adam_consts *k, float *pp, float *mp, float *vp,
                                 float g)
{
    float p = *pp, m = *mp, v = *vp;
    if (k->g_scale != 1.0f)
        g = g * k->g_scale;
    if (k->use_l2)
        g = fmaf(p, k->l2, g);
    m = fmaf(k->b1, m, k->omb1 * g);
    v = fmaf(k->omb2, fmaf(g, g, -v), v);
    float upd = m / (sqrtf(v) + k->eps);
    if (k->use_decay)
        p = p + fmaf(p, k->decay, k->step_size * upd);
    else
        p = fmaf(k->step_size, upd, p);
    *pp = p;
    *mp = m;
    *vp = v;
}

void zn_adam_fma_scalar_kernel(const zn_adam_consts *k, float *p, float *m, float *v,
                               const void *g, zn_dtype g_dtype, void *c, zn_dtype c_dtype,
                               size_t n)
{
    for (size_t i = 0; i < n; i++) {
        adam_elem_fma(k, &p[i], &m[i], &v[i], zn_load_elem(g, g_dtype, i));
        if (c)
            ((uint16_t *)c)[i] = zn_round_elem(p[i], c_dtype);
    }
}

typedef struct {
    const zn_optim_ops *ops;
    zn_adam_kernel_fn adam;
    const zn_adam_consts *k;
    const zn_q8_table *ts, *tu;
    const zn_moments *mv;
    uint16_t *p;
    const char *g;
    size_t gs;
    zn_dtype gt;
    uint64_t seed;
    const zn_sr_span *spans;
    size_t n_spans;
    int64_t step;
} sr_job;

/* The rounding of x[0, n) into out for elements index + [0, n): one call
 * per run of indices sharing their high word (the key holds it). */
static void sr_round_at(const sr_job *j, const float *x, uint16_t *out, size_t n, uint64_t index)
{
    while (n) {
        uint64_t to_wrap = ((index >> 32) + 1) * ((uint64_t)1 << 32) - index;
        size_t len = (uint64_t)n < to_wrap ? n : (size_t)to_wrap;
        uint32_t k1, k2;
        zn_sr_key(j->seed, j->step, (uint32_t)(index >> 32), &k1, &k2);
        j->ops->sr_round(x, out, len, k1, k2, (uint32_t)index);
        x += len;
        out += len;
        index += len;
        n -= len;
    }
}

/* The rounding of x[0, n) into out for p's elements [i, i + n), each with
 * the index its span gives it; *s is the span that holds i (the caller
 * walks p upwards, so the search goes on from there). */
static void sr_round_spans(const sr_job *j, const float *x, uint16_t *out, size_t n, size_t i,
                           size_t *s)
{
    while (n) {
        while (j->spans[*s].off + j->spans[*s].n <= i)
            (*s)++;
        const zn_sr_span *sp = &j->spans[*s];
        size_t take = sp->off + sp->n - i < n ? (size_t)(sp->off + sp->n - i) : n;
        sr_round_at(j, x, out, take, sp->index + (i - sp->off));
        x += take;
        out += take;
        i += take;
        n -= take;
    }
}

/* The fused step (adam_sr) of elements [i, i + n) of p, whose indices
 * start at `index`: one call per run of indices sharing their high word. */
static void sr_fused_at(const sr_job *j, size_t i, size_t n, uint64_t index)
{
    const zn_moments *mv = j->mv;
    int mb = mv->fmt == ZN_MOM_BF16 ? 2 : 4;
    while (n) {
        uint64_t to_wrap = ((index >> 32) + 1) * ((uint64_t)1 << 32) - index;
        size_t len = (uint64_t)n < to_wrap ? n : (size_t)to_wrap;
        uint32_t k1, k2;
        zn_sr_key(j->seed, j->step, (uint32_t)(index >> 32), &k1, &k2);
        j->ops->adam_sr(j->k, j->p + i, (char *)mv->m + i * (size_t)mb,
                        (char *)mv->v + i * (size_t)mb, mb, j->g + i * j->gs, j->gt, len, k1, k2,
                        (uint32_t)index);
        i += len;
        index += len;
        n -= len;
    }
}

/* Elements [lo, hi) (lo on a block boundary): with fp32 or bf16 moments and
 * a fused step, run by run of indices in one pass; else block by block, the
 * params and compressed moments widened into L1, stepped, rounded back. */
static void sr_range(const sr_job *j, size_t lo, size_t hi)
{
    float pb[ZN_Q8_BLOCK] __attribute__((aligned(64)));
    float mb[ZN_Q8_BLOCK] __attribute__((aligned(64)));
    float vb[ZN_Q8_BLOCK] __attribute__((aligned(64)));
    const zn_optim_ops *o = j->ops;
    const zn_moments *mv = j->mv;
    /* the last span that starts at or before lo (spans are never empty) */
    size_t s = 0, top = j->n_spans;
    while (top - s > 1) {
        size_t mid = s + (top - s) / 2;
        if (j->spans[mid].off <= lo)
            s = mid;
        else
            top = mid;
    }
    if (o->adam_sr && (mv->fmt == ZN_MOM_F32 || mv->fmt == ZN_MOM_BF16)) {
        for (size_t i = lo; i < hi;) {
            while (j->spans[s].off + j->spans[s].n <= i)
                s++;
            const zn_sr_span *sp = &j->spans[s];
            size_t take = sp->off + sp->n - i < hi - i ? (size_t)(sp->off + sp->n - i) : hi - i;
            sr_fused_at(j, i, take, sp->index + (i - sp->off));
            i += take;
        }
        return;
    }
    for (size_t i = lo; i < hi; i += ZN_Q8_BLOCK) {
        size_t len = hi - i < ZN_Q8_BLOCK ? hi - i : ZN_Q8_BLOCK;
        size_t b = i / ZN_Q8_BLOCK;
        const char *g = j->g + i * j->gs;
        if (mv->fmt == ZN_MOM_Q8 && o->q8_sr_step && zn_q8_f32_slot(mv, b) < 0) {
            /* an 8-bit block inside one run of indices sharing their high
             * word (all but a few): fused */
            while (j->spans[s].off + j->spans[s].n <= i)
                s++;
            const zn_sr_span *sp = &j->spans[s];
            uint64_t index = sp->index + (i - sp->off);
            if (sp->off + sp->n >= i + len && index >> 32 == (index + len - 1) >> 32) {
                uint32_t k1, k2;
                zn_sr_key(j->seed, j->step, (uint32_t)(index >> 32), &k1, &k2);
                o->q8_sr_step(j->k, j->p + i, (uint8_t *)mv->m + i, (uint8_t *)mv->v + i,
                              &mv->m_absmax[b], &mv->v_absmax[b], j->ts, j->tu, g, j->gt, len,
                              k1, k2, (uint32_t)index);
                continue;
            }
        }
        o->bf16_widen(j->p + i, pb, len);
        if (mv->fmt == ZN_MOM_F32) {
            j->adam(j->k, pb, (float *)mv->m + i, (float *)mv->v + i, g, j->gt, NULL,
                    ZN_DTYPE_BF16, len);
        } else if (mv->fmt == ZN_MOM_BF16 && o->adam_bf16) {
            /* the same operations as the pieces below, the moments in
             * registers */
            o->adam_bf16(j->k, pb, (uint16_t *)mv->m + i, (uint16_t *)mv->v + i, g, j->gt, NULL,
                         ZN_DTYPE_BF16, len);
        } else if (mv->fmt == ZN_MOM_BF16) {
            uint16_t *mh = (uint16_t *)mv->m + i, *vh = (uint16_t *)mv->v + i;
            o->bf16_widen(mh, mb, len);
            o->bf16_widen(vh, vb, len);
            j->adam(j->k, pb, mb, vb, g, j->gt, NULL, ZN_DTYPE_BF16, len);
            o->bf16_round(mb, mh, len);
            o->bf16_round(vb, vh, len);
        } else if (zn_q8_f32_slot(mv, b) >= 0) {
            /* a block kept in fp32 */
            size_t at = (size_t)zn_q8_f32_slot(mv, b) * ZN_Q8_BLOCK;
            j->adam(j->k, pb, mv->m_f32 + at, mv->v_f32 + at, g, j->gt, NULL, ZN_DTYPE_BF16,
                    len);
        } else {
            uint8_t *mq = (uint8_t *)mv->m + i, *vq = (uint8_t *)mv->v + i;
            o->q8_dequant(mq, j->ts, mv->m_absmax[b], mb, len);
            o->q8_dequant(vq, j->tu, mv->v_absmax[b], vb, len);
            j->adam(j->k, pb, mb, vb, g, j->gt, NULL, ZN_DTYPE_BF16, len);
            mv->m_absmax[b] = o->q8_quant(mb, j->ts, mq, len);
            mv->v_absmax[b] = o->q8_quant(vb, j->tu, vq, len);
        }
        sr_round_spans(j, pb, j->p + i, len, i, &s);
    }
}

/* as zn_optim_by_blocks calls it */
static void sr_range_of(const void *arg, size_t lo, size_t hi)
{
    sr_range(arg, lo, hi);
}

int zn_adam_step_sr_spans_with(const zn_optim_ops *ops, const zn_adam_params *hp, uint16_t *p,
                               const zn_moments *mv, const void *g, zn_dtype g_dtype,
                               float g_scale, uint64_t seed, const zn_sr_span *spans,
                               size_t n_spans, size_t n)
{
    if (!ops)
        return zn_set_error(ZN_EUNSUPPORTED, "adam (bf16 master): SIMD path not available");
    /* the spans tile [0, n) in order: the walk in sr_range relies on it */
    uint64_t at = 0;
    for (size_t i = 0; i < n_spans && spans; i++) {
        if (spans[i].off != at || !spans[i].n)
            return zn_set_error(-EINVAL, "adam (bf16 master): span %zu covers [%llu, %llu); "
                                "the spans before it end at %llu", i,
                                (unsigned long long)spans[i].off,
                                (unsigned long long)(spans[i].off + spans[i].n),
                                (unsigned long long)at);
        at += spans[i].n;
    }
    if (n && (!spans || at != n))
        return zn_set_error(-EINVAL, "adam (bf16 master): %zu spans cover %llu of %zu elements",
                            spans ? n_spans : 0, (unsigned long long)(spans ? at : 0), n);
    zn_adam_consts k;
    /* the checks (p stands for the fp32 array in the NULL test) and, for
     * torchao's 8-bit scheme, its bias corrections */
    int rc = zn_adam_prepare_mom(hp, (float *)(void *)p, mv, g, g_dtype, g_scale, NULL,
                                 ZN_DTYPE_BF16, n, &k);
    if (rc < 0 || n == 0)
        return rc;
    sr_job j = {
        .ops = ops, .adam = ops->isa == ZN_ISA_SCALAR ? zn_adam_fma_scalar_kernel : ops->adam,
        .k = &k, .mv = mv, .p = p, .g = g, .gs = zn_dtype_size(g_dtype), .gt = g_dtype,
        .seed = seed, .spans = spans, .n_spans = n_spans, .step = hp->step,
    };
    if (mv->fmt == ZN_MOM_Q8 && (!(j.ts = zn_q8_table_get(mv->scheme, 1)) ||
                                 !(j.tu = zn_q8_table_get(mv->scheme, 0))))
        return -EINVAL;
    zn_optim_by_blocks(zn_optim_threads(hp->threads, n), n, sr_range_of, &j);
    return 0;
}

int zn_adam_step_sr_with(const zn_optim_ops *ops, const zn_adam_params *hp, uint16_t *p,
                         const zn_moments *mv, const void *g, zn_dtype g_dtype, float g_scale,
                         uint64_t seed, uint64_t index0, size_t n)
{
    zn_sr_span one = { 0, n, index0 };
    return zn_adam_step_sr_spans_with(ops, hp, p, mv, g, g_dtype, g_scale, seed, &one, n ? 1 : 0,
                                      n);
}

int zn_adam_step_sr(const zn_adam_params *hp, uint16_t *p, const zn_moments *mv, const void *g,
                    zn_dtype g_dtype, float g_scale, uint64_t seed, uint64_t index0, size_t n)
{
    return zn_adam_step_sr_with(zn_optim_get_ops(ZN_ISA_AUTO), hp, p, mv, g, g_dtype, g_scale,
                                seed, index0, n);
}

int zn_adam_step_sr_spans(const zn_adam_params *hp, uint16_t *p, const zn_moments *mv,
                          const void *g, zn_dtype g_dtype, float g_scale, uint64_t seed,
                          const zn_sr_span *spans, size_t n_spans, size_t n)
{
    return zn_adam_step_sr_spans_with(zn_optim_get_ops(ZN_ISA_AUTO), hp, p, mv, g, g_dtype,
                                      g_scale, seed, spans, n_spans, n);
}
