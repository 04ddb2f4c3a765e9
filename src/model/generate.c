/* Generation with a KV cache: prompts are prefilled one at a time into
 * their own cache slot, then every live sequence advances one token per
 * step together (one embedding, one pass over the layers, one lm_head for
 * the whole batch). A finished sequence's slot takes the next prompt. The
 * next id is chosen on the host from the step's fp32 logits, with the
 * logits processors in the order transformers applies them (repetition
 * penalty, then temperature, top-k, top-p when sampling). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/generate.h"
#include "util/hash-impl.h"
#include "util/try-impl.h"

struct zn_gen {
    zn_model_state *st;
    zn_model *m;
    zn_dev *dev;
    int64_t max_batch, max_t, V, L;
    void **kv;          /* per layer: [max_batch][max_t][k | v] */
    void *xa, *xb;      /* activations between blocks */
    float *dlogits;     /* device: [max_batch][V] */
    float *logits;      /* host: [max_batch][V] of the last step */
    int64_t nrows;      /* rows in `logits` */
};

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

uint64_t zn_gen_bytes(const zn_model *m, int64_t max_batch)
{
    const zn_model_dims *d = zn_model_get_dims(m);
    return zn_model_kv_bytes(m, max_batch) * (uint64_t)d->n_layers +
           2 * zn_model_act_bytes(m) + (uint64_t)(max_batch * d->vocab) * 4;
}

void zn_gen_destroy(zn_gen *g)
{
    if (!g)
        return;
    for (int64_t l = 0; g->kv && l < g->L; l++)
        zn_dev_free(g->dev, g->kv[l]);
    free(g->kv);
    zn_dev_free(g->dev, g->xa);
    zn_dev_free(g->dev, g->xb);
    zn_dev_free(g->dev, g->dlogits);
    free(g->logits);
    free(g);
}

int zn_gen_create(zn_gen **out, zn_model_state *st, int64_t max_batch)
{
    *out = NULL;
    zn_model *m = zn_model_state_model(st);
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
    g->st = st;
    g->m = m;
    g->dev = zn_model_get_dev(m);
    g->max_batch = max_batch;
    g->max_t = cfg->max_seq;
    g->V = d->vocab;
    g->L = d->n_layers;
    int rc = 0;
    g->kv = calloc((size_t)g->L, sizeof *g->kv);
    g->logits = malloc((size_t)(max_batch * g->V) * sizeof *g->logits);
    if (!g->kv || !g->logits) {
        zn_gen_destroy(g);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    for (int64_t l = 0; l < g->L && !rc; l++)
        rc = zn_dev_alloc(g->dev, zn_model_kv_bytes(m, max_batch), "KV cache", &g->kv[l]);
    if (!rc)
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

const float *zn_gen_last_logits(const zn_gen *g, int64_t seq)
{
    if (!g || seq < 0 || seq >= g->nrows)
        return NULL;
    return g->logits + seq * g->V;
}

/* One forward over a decoding batch set with zn_model_set_decode: the
 * logits of rows `rows` (each the index of a sequence's last new token)
 * land in g->logits. */
static int step(zn_gen *g, int64_t nrows, const int64_t *rows)
{
    zn_model *m = g->m;
    void *x = g->xa, *y = g->xb;
    ZN_TRY(zn_model_embed_fwd(m, NULL, zn_model_state_params(g->st, 0), x));
    for (int64_t l = 0; l < g->L; l++) {
        ZN_TRY(zn_model_layer_fwd_kv(m, NULL, (int)l, zn_model_state_params(g->st, (int)l + 1), x,
                                     y, g->kv[l]));
        void *t = x;
        x = y;
        y = t;
    }
    void *const *head = zn_model_state_params(g->st, (int)g->L + 1);
    /* rows in runs of consecutive indices: one lm_head GEMM each */
    for (int64_t i = 0; i < nrows;) {
        int64_t j = i + 1;
        while (j < nrows && rows[j] == rows[j - 1] + 1)
            j++;
        ZN_TRY(zn_model_head_logits(m, NULL, head, x, rows[i], j - i, g->dlogits + i * g->V));
        i = j;
    }
    ZN_TRY(zn_dev_copy_d2h(g->dev, NULL, g->logits, g->dlogits, (size_t)(nrows * g->V) * 4));
    ZN_TRY(zn_dev_stream_sync(g->dev, NULL));
    g->nrows = nrows;
    return 0;
}

/* ---- choosing the next id ---------------------------------------------------------- */

static double uniform(uint64_t *rng)
{
    *rng += ZN_GOLDEN64;
    return (double)(zn_mix64(*rng) >> 11) * 0x1.0p-53;
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

typedef struct {
    float v;
    int32_t id;
} scored;

static int cmp_scored_desc(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->v != y->v)
        return (x->v < y->v) - (x->v > y->v);
    return (x->id > y->id) - (x->id < y->id);
}

int32_t zn_gen_choose(const zn_gen_params *p, float *lg, int64_t V, const int32_t *seq,
                      int64_t seq_len, uint64_t *rng)
{
    if (p->repetition_penalty != 1.0) {
        /* once per distinct id: transformers gathers the ids' logits,
         * penalizes them and scatters them back */
        float pen = (float)p->repetition_penalty;
        unsigned char *seen = calloc((size_t)V, 1);
        for (int64_t i = 0; i < seq_len; i++) {
            int32_t t = seq[i];
            if (t < 0 || t >= V || (seen && seen[t]))
                continue;
            if (seen)
                seen[t] = 1;
            lg[t] = lg[t] < 0 ? lg[t] * pen : lg[t] / pen;
        }
        free(seen);
    }
    if (!p->do_sample) {
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (lg[v] > lg[best])
                best = v;
        return (int32_t)best;
    }
    float inv_t = (float)(1.0 / p->temperature);
    for (int64_t v = 0; v < V; v++)
        lg[v] *= inv_t;
    if (p->top_k > 0 && p->top_k < V) {
        float *c = malloc((size_t)V * sizeof *c);
        if (c) {
            memcpy(c, lg, (size_t)V * sizeof *c);
            qsort(c, (size_t)V, sizeof *c, cmp_desc);
            float kth = c[p->top_k - 1];
            for (int64_t v = 0; v < V; v++)
                if (lg[v] < kth)
                    lg[v] = -INFINITY;
            free(c);
        }
    }
    float mx = -INFINITY;
    for (int64_t v = 0; v < V; v++)
        mx = lg[v] > mx ? lg[v] : mx;
    scored *sc = malloc((size_t)V * sizeof *sc);
    if (!sc) {
        int64_t best = 0; /* out of memory: the most likely id */
        for (int64_t v = 1; v < V; v++)
            if (lg[v] > lg[best])
                best = v;
        return (int32_t)best;
    }
    double sum = 0;
    for (int64_t v = 0; v < V; v++) {
        sc[v].id = (int32_t)v;
        sc[v].v = lg[v] == -INFINITY ? 0.0f : expf(lg[v] - mx);
        sum += sc[v].v;
    }
    qsort(sc, (size_t)V, sizeof *sc, cmp_scored_desc);
    int64_t keep = V;
    if (p->top_p < 1.0) {
        /* transformers drops an id when the mass of the ids more likely than
         * it already reaches top_p (the most likely always stays) */
        double above = 0;
        for (int64_t r = 0; r < V; r++) {
            if (r > 0 && above >= p->top_p * sum) {
                keep = r;
                break;
            }
            above += sc[r].v;
        }
    }
    double kept = 0;
    for (int64_t r = 0; r < keep; r++)
        kept += sc[r].v;
    double u = uniform(rng) * kept, acc = 0;
    int32_t pick = sc[0].id;
    for (int64_t r = 0; r < keep; r++) {
        acc += sc[r].v;
        if (sc[r].v > 0 && u < acc) {
            pick = sc[r].id;
            break;
        }
    }
    free(sc);
    return pick;
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
            int64_t p0 = 0, row = s->len - 1;
            if ((rc = zn_model_set_decode(g->m, NULL, 1, s->len, s->seq, &p0, &b)) ||
                (rc = step(g, 1, &row)))
                break;
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
        if ((rc = zn_model_set_decode(g->m, NULL, nb, 1, bid, pos0, slot)) ||
            (rc = step(g, nb, rows)))
            break;
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
