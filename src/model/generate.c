/* Generation with a KV cache: prompts are prefilled one at a time into
 * their own cache slot, then every live sequence advances one token per
 * step together (one embedding, one pass over the layers, one lm_head for
 * the whole batch). A finished sequence's slot takes the next prompt. The
 * next id is chosen on the host from the step's fp32 logits, with the
 * logits processors in the order transformers applies them (repetition
 * penalty, then temperature, top-k, top-p when sampling). Where the
 * weights a generator owns live and how they stream: generate_weights.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/nvme.h"
#include "zinc/generate.h"
#include "model/model-impl.h"
#include "util/hash-impl.h"
#include "util/try-impl.h"

zn_gen_params zn_gen_params_default(void)
{
    zn_gen_params p;
    memset(&p, 0, sizeof p);
    p.max_new_tokens = 256;
    p.temperature = 1.0;
    p.top_k = 50;
    p.top_p = 1.0;
    p.repetition_penalty = 1.0;
    return p;
}

int zn_gen_params_check(const zn_gen_params *p)
{
    if (p->max_new_tokens <= 0)
        return zn_set_error(ZN_ECONFIG, "max_new_tokens must be positive (it is %lld)",
                            (long long)p->max_new_tokens);
    if (p->do_sample && !(p->temperature > 0 && isfinite(p->temperature)))
        return zn_set_error(ZN_ECONFIG, "temperature must be positive (it is %g)",
                            p->temperature);
    if (p->top_k < 0)
        return zn_set_error(ZN_ECONFIG, "top_k must be 0 (off) or positive (it is %lld)",
                            (long long)p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return zn_set_error(ZN_ECONFIG, "top_p must be in (0, 1] (it is %g)", p->top_p);
    if (!(p->repetition_penalty > 0 && isfinite(p->repetition_penalty)))
        return zn_set_error(ZN_ECONFIG, "repetition_penalty must be positive (it is %g)",
                            p->repetition_penalty);
    if (p->n_eos < 0 || p->n_eos > ZN_GEN_MAX_EOS)
        return zn_set_error(ZN_ECONFIG, "at most %d eos ids", ZN_GEN_MAX_EOS);
    return 0;
}

zn_gen_config zn_gen_config_default(void)
{
    zn_gen_config c;
    memset(&c, 0, sizeof c);
    c.max_batch = 1;
    c.ring = 2;
    c.max_resident_layers = -1;
    return c;
}

void zn_gen_destroy(zn_gen *g)
{
    if (!g)
        return;
    if (g->aio)
        zn_aio_wait_all(g->aio);
    if (g->copy)
        zn_dev_stream_destroy(g->dev, g->copy);
    zn_dev_sync(g->dev);
    for (int k = 0; k < ZN_M_GEN_MAX_RING; k++)
        zn_dev_host_free(g->dev, g->stage[k]);
    free(g->ext);
    free(g->on_nvme);
    zn_aio_buffer_free(g->asm_buf);
    zn_swap_destroy(g->swap);
    zn_aio_destroy(g->aio);
    for (int k = 0; k < ZN_M_GEN_MAX_RING; k++) {
        zn_dev_free(g->dev, g->ring[k]);
        free(g->ring_ptr[k]);
        zn_dev_event_destroy(g->dev, g->ready[k]);
        zn_dev_event_destroy(g->dev, g->freed[k]);
    }
    for (int b = 0; b < g->nb; b++) {
        if (g->home && g->home[b]) {
            if (g->on_dev[b])
                zn_dev_free(g->dev, g->home[b]);
            else
                zn_dev_host_free(g->dev, g->home[b]);
        }
        if (g->off)
            free(g->off[b]);
        if (g->ptr)
            free(g->ptr[b]);
    }
    free(g->np);
    free(g->off);
    free(g->bytes);
    free(g->home);
    free(g->on_dev);
    free(g->ptr);
    zn_dev_host_free(g->dev, g->hx);
    zn_m_gen_kv_release(g);
    free(g->kv);
    free(g->cur_pos0);
    free(g->cur_slot);
    zn_dev_free(g->dev, g->xa);
    zn_dev_free(g->dev, g->xb);
    zn_dev_free(g->dev, g->dlogits);
    free(g->logits);
    free(g->kv_ids);
    free(g->kv_n);
    free(g);
}

void zn_gen_set_prefix_reuse(zn_gen *g, int on)
{
    g->reuse = on;
}

void zn_gen_get_stats(const zn_gen *g, zn_gen_stats *out)
{
    *out = g->stats;
}

/* What every generator allocates but the cache (zn_m_gen_kv_place): two
 * activations, the logits. */
int zn_m_gen_common(zn_gen **out, zn_model *m, int64_t max_batch)
{
    *out = NULL;
    const zn_model_dims *d = zn_model_get_dims(m);
    const zn_model_config *cfg = zn_model_get_config(m);
    if (max_batch <= 0 || max_batch > cfg->max_batch * cfg->max_seq)
        return zn_set_error(ZN_EARG, "generate: a batch of %lld sequences (the model takes "
                            "1 .. %lld)", (long long)max_batch,
                            (long long)(cfg->max_batch * cfg->max_seq));
    if (zn_model_attention_fused(d, cfg))
        return zn_set_error(ZN_EARG, "generate: the model must use the GEMM attention (the "
                            "fused kernels take no KV cache)");
    zn_gen *g = calloc(1, sizeof *g);
    if (!g)
        return zn_set_error(-ENOMEM, "out of memory");
    g->m = m;
    g->dev = zn_model_get_dev(m);
    g->max_batch = max_batch;
    g->max_t = cfg->max_seq;
    g->V = d->vocab;
    g->L = d->n_layers;
    g->H = d->hidden;
    g->esz = zn_dtype_size(cfg->dtype);
    int rc = 0;
    g->kv = calloc((size_t)g->L, sizeof *g->kv);
    g->logits = malloc((size_t)(max_batch * g->V) * sizeof *g->logits);
    g->kv_ids = malloc((size_t)(max_batch * g->max_t) * sizeof *g->kv_ids);
    g->kv_n = calloc((size_t)max_batch, sizeof *g->kv_n);
    g->cur_pos0 = calloc((size_t)max_batch, sizeof *g->cur_pos0);
    g->cur_slot = calloc((size_t)max_batch, sizeof *g->cur_slot);
    if (!g->kv || !g->logits || !g->kv_ids || !g->kv_n || !g->cur_pos0 || !g->cur_slot) {
        zn_gen_destroy(g);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    rc = zn_dev_alloc(g->dev, zn_model_act_bytes(m), "generate activations", &g->xa);
    if (!rc)
        rc = zn_dev_alloc(g->dev, zn_model_act_bytes(m), "generate activations", &g->xb);
    if (!rc)
        rc = zn_dev_alloc(g->dev, (size_t)(max_batch * g->V) * 4, "generate logits",
                          (void **)&g->dlogits);
    if (rc) {
        zn_gen_destroy(g);
        return rc;
    }
    *out = g;
    return 0;
}

int zn_gen_create(zn_gen **out, zn_model_state *st, int64_t max_batch)
{
    ZN_TRY(zn_m_gen_common(out, zn_model_state_model(st), max_batch));
    (*out)->st = st;
    int rc = zn_m_gen_kv_place(*out, ZN_GEN_KV_DEVICE, 0);
    if (rc) {
        zn_gen_destroy(*out);
        *out = NULL;
    }
    return rc;
}

const float *zn_gen_last_logits(const zn_gen *g, int64_t seq)
{
    if (!g || seq < 0 || seq >= g->nrows)
        return NULL;
    return g->logits + seq * g->V;
}

/* The embedding of the batch's ids into x: on the device, or gathered from
 * a host-homed table into pinned rows and copied up. */
static int embed(zn_gen *g, const int32_t *ids, int64_t N, void *x)
{
    if (g->st)
        return zn_model_embed_fwd(g->m, NULL, zn_model_state_params(g->st, 0), x);
    if (g->on_dev[0] || !g->hx)
        return zn_model_embed_fwd(g->m, NULL, g->ptr[0], x);
    size_t row = (size_t)g->H * g->esz;
    for (int64_t t = 0; t < N; t++)
        memcpy((unsigned char *)g->hx + (size_t)t * row,
               (const unsigned char *)g->home[0] + (size_t)ids[t] * row, row);
    g->embed_in_bytes += (uint64_t)N * row;
    ZN_TRY(zn_dev_copy_h2d(g->dev, NULL, x, g->hx, (size_t)N * row));
    /* the rows as the device's embedding makes them (Gemma scales them) */
    if (g->m->emb_scale != 1.0f)
        ZN_TRY(zn_dev_scale(g->dev, NULL, x, g->m->dt, N * g->H, g->m->emb_scale));
    return 0;
}

/* Layer l's forward: from its resident tensors, or from the ring slot its
 * use holds (waiting for the copy), after which the slot's next use is
 * fetched. */
static int layer(zn_gen *g, int64_t l, void *x, void *y)
{
    void *kv;
    ZN_TRY(zn_m_gen_kv_enter(g, l, &kv));
    if (g->st || l < g->r) {
        void *const *w = g->st ? zn_model_state_params(g->st, (int)l + 1) : g->ptr[l + 1];
        ZN_TRY(zn_model_layer_fwd_kv(g->m, NULL, (int)l, w, x, y, kv));
        return zn_m_gen_kv_leave(g, l);
    }
    int k = (int)(g->use % (uint64_t)g->K);
    ZN_TRY(zn_m_gen_complete(g, k));
    ZN_TRY(zn_dev_stream_wait_event(g->dev, NULL, g->ready[k]));
    zn_m_gen_bind_slot(g, k, l);
    ZN_TRY(zn_model_layer_fwd_kv(g->m, NULL, (int)l, g->ring_ptr[k], x, y, kv));
    ZN_TRY(zn_m_gen_kv_leave(g, l));
    if (!g->fixed) {
        ZN_TRY(zn_dev_event_record(g->dev, g->freed[k], NULL));
        ZN_TRY(zn_m_gen_fetch(g, g->use + (uint64_t)g->K));
    }
    g->use++;
    /* the next use's copy goes now, beside this layer's compute */
    return zn_m_gen_complete(g, (int)(g->use % (uint64_t)g->K));
}

/* One forward over a decoding batch of nb sequences of T new tokens each
 * (cache slots `slot`, first positions `pos0`; ids: their nb x T tokens):
 * the logits of rows `rows` (each the index of a sequence's last new token)
 * land in g->logits. */
static int step(zn_gen *g, const int32_t *ids, int64_t nb, int64_t T, const int64_t *pos0,
                const int64_t *slot, int64_t nrows, const int64_t *rows)
{
    zn_model *m = g->m;
    void *x = g->xa, *y = g->xb;
    int64_t N = nb * T;
    ZN_TRY(zn_model_set_decode(m, NULL, nb, T, ids, pos0, slot));
    g->cur_nb = nb;
    g->cur_T = T;
    memcpy(g->cur_pos0, pos0, (size_t)nb * sizeof *pos0);
    memcpy(g->cur_slot, slot, (size_t)nb * sizeof *slot);
    ZN_TRY(embed(g, ids, N, x));
    ZN_TRY(zn_m_gen_kv_begin(g));
    for (int64_t l = 0; l < g->L; l++) {
        ZN_TRY(layer(g, l, x, y));
        void *t = x;
        x = y;
        y = t;
    }
    void *const *head = g->st ? zn_model_state_params(g->st, (int)g->L + 1) : g->ptr[g->L + 1];
    /* rows in runs of consecutive indices: one lm_head GEMM each */
    for (int64_t i = 0; i < nrows;) {
        int64_t j = i + 1;
        while (j < nrows && rows[j] == rows[j - 1] + 1)
            j++;
        ZN_TRY(zn_model_head_logits(m, NULL, head, x, rows[i], j - i, g->dlogits + i * g->V));
        i = j;
    }
    ZN_TRY(zn_dev_copy_d2h(g->dev, NULL, g->logits, g->dlogits, (size_t)(nrows * g->V) * 4));
    g->logits_out_bytes += (uint64_t)(nrows * g->V) * 4;
    ZN_TRY(zn_dev_stream_sync(g->dev, NULL));
    g->nrows = nrows;
    return 0;
}

/* ---- the run ----------------------------------------------------------------------- */

typedef struct {
    int64_t idx;       /* the prompt's index; -1: a free slot */
    int32_t *seq;      /* prompt then generated ids */
    int64_t plen, len; /* prompt length, current length */
    uint64_t rng;
} live;

static int is_eos(const zn_gen_params *p, int32_t t)
{
    for (int i = 0; i < p->n_eos; i++)
        if (p->eos[i] == t)
            return 1;
    return 0;
}

/* Records id t for slot s; returns 1 when the sequence is done. */
static int emit(zn_gen *g, const zn_gen_params *p, live *s, int32_t t, int32_t **out,
                int64_t *out_len, zn_gen_token_fn cb, void *ctx, int *rc)
{
    s->seq[s->len++] = t;
    int64_t n = s->len - s->plen;
    /* done at an eos id, at max_new_tokens, or with the context full (the
     * id just chosen could not be fed back) */
    int done = is_eos(p, t) || n >= p->max_new_tokens || s->len >= g->max_t;
    if (cb && !*rc)
        *rc = cb(ctx, s->idx, t, done);
    if (done) {
        if (out) {
            out[s->idx] = malloc((size_t)(n ? n : 1) * sizeof **out);
            if (out[s->idx])
                memcpy(out[s->idx], s->seq + s->plen, (size_t)n * sizeof **out);
            else if (!*rc)
                *rc = zn_set_error(-ENOMEM, "out of memory");
        }
        if (out_len)
            out_len[s->idx] = n;
        s->idx = -1;
    }
    return done;
}

int zn_gen_run(zn_gen *g, int64_t n, const int32_t *const *ids, const int64_t *lens,
               const zn_gen_params *p, int32_t **out, int64_t *out_len, zn_gen_token_fn cb,
               void *ctx)
{
    ZN_TRY(zn_gen_params_check(p));
    /* the ring's first uses start with the first run, once the weights are in */
    for (; !g->primed && g->use < (uint64_t)g->K; g->use++) {
        ZN_TRY(zn_m_gen_fetch(g, g->use));
        ZN_TRY(zn_m_gen_complete(g, (int)g->use));
    }
    if (!g->primed) {
        g->use = 0;
        g->primed = 1;
    }
    for (int64_t i = 0; i < n; i++) {
        if (lens[i] <= 0 || lens[i] >= g->max_t)
            return zn_set_error(ZN_EARG, "prompt %lld: %lld tokens; the context holds %lld "
                                "(prompt and generated ids together)", (long long)i,
                                (long long)lens[i], (long long)g->max_t);
        for (int64_t k = 0; k < lens[i]; k++)
            if (ids[i][k] < 0 || ids[i][k] >= g->V)
                return zn_set_error(ZN_EARG, "prompt %lld: id %d at %lld is outside the vocab "
                                    "(%lld)", (long long)i, ids[i][k], (long long)k,
                                    (long long)g->V);
        if (out)
            out[i] = NULL;
    }
    int64_t B = g->max_batch;
    live *sl = calloc((size_t)B, sizeof *sl);
    int32_t *bid = malloc((size_t)B * sizeof *bid);
    int64_t *pos0 = malloc((size_t)B * sizeof *pos0), *slot = malloc((size_t)B * sizeof *slot);
    int64_t *rows = malloc((size_t)B * sizeof *rows);
    int rc = 0;
    if (!sl || !bid || !pos0 || !slot || !rows)
        rc = zn_set_error(-ENOMEM, "out of memory");
    for (int64_t b = 0; b < B && !rc; b++) {
        sl[b].idx = -1;
        if (!(sl[b].seq = malloc((size_t)g->max_t * sizeof *sl[b].seq)))
            rc = zn_set_error(-ENOMEM, "out of memory");
    }
    int64_t next = 0;
    for (;;) {
        /* free slots take the next prompts: each prefilled on its own */
        for (int64_t b = 0; b < B && next < n && !rc; b++) {
            if (sl[b].idx >= 0)
                continue;
            live *s = &sl[b];
            s->idx = next++;
            s->plen = s->len = lens[s->idx];
            memcpy(s->seq, ids[s->idx], (size_t)s->len * sizeof *s->seq);
            s->rng = zn_mix64(p->seed ^ zn_mix64((uint64_t)s->idx + 1));
            /* the prefix the slot already holds (reuse on), but at least
             * the last prompt token is fed: its logits choose the next */
            int64_t c = 0;
            int32_t *held = g->kv_ids + b * g->max_t;
            while (g->reuse && c < g->kv_n[b] && c < s->len - 1 && held[c] == s->seq[c])
                c++;
            int64_t row = s->len - c - 1;
            g->kv_n[b] = 0; /* until the prefill is in */
            if ((rc = step(g, s->seq + c, 1, s->len - c, &c, &b, 1, &row)))
                break;
            memcpy(held, s->seq, (size_t)s->len * sizeof *held);
            g->kv_n[b] = s->len;
            g->stats.prefilled += (uint64_t)(s->len - c);
            g->stats.reused += (uint64_t)c;
            int32_t t = zn_gen_choose(p, g->logits, g->V, s->seq, s->len, &s->rng);
            if (emit(g, p, s, t, out, out_len, cb, ctx, &rc))
                b--; /* the slot is free again */
        }
        if (rc)
            break;
        int64_t nb = 0;
        for (int64_t b = 0; b < B; b++)
            if (sl[b].idx >= 0) {
                bid[nb] = sl[b].seq[sl[b].len - 1];
                pos0[nb] = sl[b].len - 1;
                slot[nb] = b;
                rows[nb] = nb;
                nb++;
            }
        if (!nb)
            break;
        for (int64_t k = 0; k < nb; k++)
            g->kv_n[slot[k]] = 0; /* until the step is in */
        if ((rc = step(g, bid, nb, 1, pos0, slot, nb, rows)))
            break;
        for (int64_t k = 0; k < nb; k++) {
            g->kv_ids[slot[k] * g->max_t + pos0[k]] = bid[k];
            g->kv_n[slot[k]] = pos0[k] + 1;
        }
        g->stats.decoded += (uint64_t)nb;
        for (int64_t k = 0; k < nb && !rc; k++) {
            live *s = &sl[slot[k]];
            int32_t t = zn_gen_choose(p, g->logits + k * g->V, g->V, s->seq, s->len, &s->rng);
            emit(g, p, s, t, out, out_len, cb, ctx, &rc);
        }
        if (rc)
            break;
    }
    if (rc && out)
        for (int64_t i = 0; i < n; i++) {
            free(out[i]);
            out[i] = NULL;
        }
    for (int64_t b = 0; sl && b < B; b++)
        free(sl[b].seq);
    free(sl);
    free(bid);
    free(pos0);
    free(slot);
    free(rows);
    return rc;
}
