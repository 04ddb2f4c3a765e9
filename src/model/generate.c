/* Generation with a KV cache: prompts are prefilled one at a time into
 * their own cache slot, then every live sequence advances one token per
 * step together (one embedding, one pass over the layers, one lm_head for
 * the whole batch). A finished sequence's slot takes the next prompt. The
 * next id is chosen on the host from the step's fp32 logits, with the
 * logits processors in the order transformers applies them (repetition
 * penalty, then temperature, top-k, top-p when sampling). */
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

/* Weights the generator owns (zn_gen_open): each block's tensors back to
 * back (each at a ZN_DEV_ALIGN offset) in one buffer at its home, the
 * device or pinned host memory. Decoder layers share one layout, so a
 * streamed layer runs from whichever ring slot holds it. */
#define MAX_RING 8

struct zn_gen {
    zn_model_state *st; /* zn_gen_create: every weight resident in a state */
    zn_model *m;
    zn_dev *dev;
    int64_t max_batch, max_t, V, L, H;
    size_t esz;
    void **kv;          /* per layer: [max_batch][max_t][k | v] */
    void *xa, *xb;      /* activations between blocks */
    float *dlogits;     /* device: [max_batch][V] */
    float *logits;      /* host: [max_batch][V] of the last step */
    int64_t nrows;      /* rows in `logits` */

    /* owned weights (zn_gen_open) */
    int nb;             /* blocks */
    int *np;            /* tensors per block */
    uint64_t **off;     /* per block and tensor: byte offset in its buffer */
    uint64_t *bytes;    /* per block: its buffer's bytes */
    void **home;        /* per block: its buffer */
    int *on_dev;        /* per block: the buffer is on the device */
    void ***ptr;        /* per block: each tensor's address at home */
    void *hx;           /* pinned [max_n][H]: a host-homed embedding's rows */
    /* the ring: streamed layers [r, L) pass through K slots in turn; use
     * number u (counting over every step) runs layer r + u % n from slot
     * u % K, and the copy for use u + K goes into that slot once use u
     * is done */
    int r, n, K, fixed; /* resident layers, streamed, slots; fixed: n <= K (loaded once) */
    void *ring[MAX_RING];
    void **ring_ptr[MAX_RING];
    zn_event *ready[MAX_RING], *freed[MAX_RING];
    zn_stream *copy;
    /* NVMe homes (zn_gen_config.nvme_dir): each streamed layer's tensors in
     * extents of a swap space; a use's reads land in its pinned stage (one
     * per slot), then one copy takes the stage to the device slot */
    zn_aio *aio;
    zn_swap *swap;
    zn_extent **ext;    /* per block, per tensor (NVMe-homed layers) */
    unsigned char *on_nvme;
    void *stage[MAX_RING];
    zn_aio_handle *rd[MAX_RING];
    int pending[MAX_RING]; /* reads in flight, the copy not yet queued */
    void *asm_buf;      /* loading: a tensor assembled before its write */
    size_t asm_cap;
    uint64_t nvme_bytes, nvme_read;
    uint64_t use;       /* the next use number */
    int primed;         /* the first K uses were fetched */
    uint64_t streamed;  /* bytes copied into the ring so far */
    /* what each cache slot holds: the ids whose keys and values are in it
     * (kv_n of them), so that a prompt sharing their prefix (a chat's
     * history) is prefilled from where they differ (reuse on) */
    int reuse;
    zn_gen_stats stats;
    int32_t *kv_ids;    /* [max_batch][max_t] */
    int64_t *kv_n;
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
    for (int k = 0; k < MAX_RING; k++) {
        zn_dev_host_free(g->dev, g->stage[k]);
        free(g->rd[k]);
    }
    for (int b = 0; g->ext && b < g->nb; b++)
        free(g->ext[b]);
    free(g->ext);
    free(g->on_nvme);
    free(g->asm_buf);
    zn_swap_destroy(g->swap);
    zn_aio_destroy(g->aio);
    for (int k = 0; k < MAX_RING; k++) {
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
    for (int64_t l = 0; g->kv && l < g->L; l++)
        zn_dev_free(g->dev, g->kv[l]);
    free(g->kv);
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

/* What every generator allocates: the cache, two activations, the logits. */
static int gen_common(zn_gen **out, zn_model *m, int64_t max_batch)
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
    if (!g->kv || !g->logits || !g->kv_ids || !g->kv_n) {
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

int zn_gen_create(zn_gen **out, zn_model_state *st, int64_t max_batch)
{
    ZN_TRY(gen_common(out, zn_model_state_model(st), max_batch));
    (*out)->st = st;
    return 0;
}

/* ---- owned weights: placement ------------------------------------------------------- */

static uint64_t align_up(uint64_t x)
{
    return (x + ZN_DEV_ALIGN - 1) / ZN_DEV_ALIGN * ZN_DEV_ALIGN;
}

/* Block b's layout: offsets of its own tensors; a tied lm_head has none. */
static int layout_blocks(zn_gen *g)
{
    const zn_model_dims *d = zn_model_get_dims(g->m);
    g->nb = zn_model_num_blocks(d);
    g->np = calloc((size_t)g->nb, sizeof *g->np);
    g->off = calloc((size_t)g->nb, sizeof *g->off);
    g->bytes = calloc((size_t)g->nb, sizeof *g->bytes);
    g->home = calloc((size_t)g->nb, sizeof *g->home);
    g->on_dev = calloc((size_t)g->nb, sizeof *g->on_dev);
    g->ptr = calloc((size_t)g->nb, sizeof *g->ptr);
    if (!g->np || !g->off || !g->bytes || !g->home || !g->on_dev || !g->ptr)
        return zn_set_error(-ENOMEM, "out of memory");
    for (int b = 0; b < g->nb; b++) {
        g->np[b] = zn_model_block_nparams(d, b);
        g->off[b] = calloc((size_t)g->np[b] + 1, sizeof **g->off);
        g->ptr[b] = calloc((size_t)g->np[b] + 1, sizeof **g->ptr);
        if (!g->off[b] || !g->ptr[b])
            return zn_set_error(-ENOMEM, "out of memory");
        uint64_t o = 0;
        for (int i = 0; i < g->np[b]; i++) {
            zn_param_info pi;
            ZN_TRY(zn_model_block_param(d, b, i, &pi));
            g->off[b][i] = o;
            if (pi.owner_block < 0)
                o += align_up((uint64_t)pi.numel * g->esz);
        }
        g->bytes[b] = o;
    }
    return 0;
}

/* The tensors' addresses in block b's buffer `base`. */
static void bind(zn_gen *g, int b, void *base, void **ptr)
{
    const zn_model_dims *d = zn_model_get_dims(g->m);
    for (int i = 0; i < g->np[b]; i++) {
        zn_param_info pi;
        zn_model_block_param(d, b, i, &pi);
        ptr[i] = pi.owner_block >= 0 ? NULL : (unsigned char *)base + g->off[b][i];
    }
}

/* Block b's tensors as extents of the swap space. */
static int nvme_alloc(zn_gen *g, int b)
{
    const zn_model_dims *d = zn_model_get_dims(g->m);
    if (!(g->ext[b] = calloc((size_t)g->np[b] + 1, sizeof **g->ext)))
        return zn_set_error(-ENOMEM, "out of memory");
    for (int i = 0; i < g->np[b]; i++) {
        zn_param_info pi;
        ZN_TRY(zn_model_block_param(d, b, i, &pi));
        if (pi.owner_block < 0)
            ZN_TRY(zn_swap_alloc(g->swap, (uint64_t)pi.numel * g->esz, pi.name, &g->ext[b][i]));
    }
    g->on_nvme[b] = 1;
    return 0;
}

/* Allocates block b's home on the device (on_dev) or in pinned memory. */
static int home_alloc(zn_gen *g, int b, int on_dev)
{
    char what[64];
    int L = (int)g->L;
    if (b == 0)
        snprintf(what, sizeof what, "weights: embedding");
    else if (b == L + 1)
        snprintf(what, sizeof what, "weights: head");
    else
        snprintf(what, sizeof what, "weights: layer %d", b - 1);
    if (!g->bytes[b])
        return 0;
    int rc = on_dev ? zn_dev_alloc(g->dev, g->bytes[b], what, &g->home[b])
                    : zn_dev_host_alloc(g->dev, g->bytes[b], what, &g->home[b]);
    if (!rc) {
        g->on_dev[b] = on_dev;
        bind(g, b, g->home[b], g->ptr[b]);
    }
    return rc;
}

/* The swap space for the streamed layers in nvme_dir, and a pinned stage
 * per slot. */
static int nvme_open(zn_gen *g, const char *dir)
{
    zn_aio_config ac = zn_aio_config_default();
    uint64_t need = 0, blk = ac.block_size;
    const zn_model_dims *d = zn_model_get_dims(g->m);
    for (int i = 0; i < g->np[1]; i++) {
        zn_param_info pi;
        ZN_TRY(zn_model_block_param(d, 1, i, &pi));
        need += ((uint64_t)pi.numel * g->esz + blk - 1) / blk * blk;
    }
    need = need * (uint64_t)g->n + blk;
    g->on_nvme = calloc((size_t)g->nb, 1);
    g->ext = calloc((size_t)g->nb, sizeof *g->ext);
    if (!g->on_nvme || !g->ext)
        return zn_set_error(-ENOMEM, "out of memory");
    ZN_TRY(zn_aio_create(&g->aio, &ac));
    zn_swap_config sc = zn_swap_config_default();
    sc.npaths = 1;
    sc.paths[0] = dir;
    sc.bytes = need;
    sc.file_prefix = "zinc-gen";
    ZN_TRY(zn_swap_create(&g->swap, g->aio, &sc));
    g->nvme_bytes = need;
    for (int k = 0; k < g->K; k++) {
        ZN_TRY(zn_dev_host_alloc(g->dev, g->bytes[1], "streamed layer stage", &g->stage[k]));
        if (!(g->rd[k] = calloc((size_t)g->np[1] + 1, sizeof **g->rd)))
            return zn_set_error(-ENOMEM, "out of memory");
    }
    return 0;
}

/* The device bytes still free for weights. */
static uint64_t dev_room(const zn_gen *g)
{
    zn_dev_mem ms;
    zn_dev_mem_stats(g->dev, &ms);
    return ms.budget > ms.used ? ms.budget - ms.used : 0;
}

int zn_gen_open(zn_gen **out, zn_model *m, const zn_gen_config *c)
{
    if (c->nvme_dir) {
        /* a killed run's swap files go first (never a live one's), whether
         * or not this run streams from there */
        uint64_t stale_bytes;
        int stale_files;
        ZN_TRY(zn_swap_clean_stale(c->nvme_dir, "zinc-gen", &stale_bytes, &stale_files));
    }
    ZN_TRY(gen_common(out, m, c->max_batch));
    zn_gen *g = *out;
    const zn_model_dims *d = zn_model_get_dims(m);
    int L = (int)g->L, head = L + 1, rc;
    if ((rc = layout_blocks(g)))
        goto fail;
    /* the head (and a tied embedding, its lm_head) stays on the device:
     * every step reads all of it */
    uint64_t lb = g->bytes[1], need_all = 0;
    for (int b = 0; b < g->nb; b++)
        need_all += g->bytes[b];
    int want_r = c->max_resident_layers < 0 || c->max_resident_layers > L ? L
                                                                           : c->max_resident_layers;
    if (want_r == L && need_all + (uint64_t)g->nb * ZN_DEV_ALIGN <= dev_room(g)) {
        for (int b = 0; b < g->nb && !rc; b++)
            rc = home_alloc(g, b, 1);
        g->r = L;
    } else {
        int K = c->ring < 1 ? 1 : c->ring > MAX_RING ? MAX_RING : c->ring;
        if ((rc = home_alloc(g, head, 1)) || (rc = home_alloc(g, 0, d->tie_embeddings)))
            goto fail;
        if (!d->tie_embeddings &&
            (rc = zn_dev_host_alloc(g->dev, (size_t)(zn_model_act_bytes(m)), "embedding rows",
                                    &g->hx)))
            goto fail;
        /* the ring first, then as many layers resident as fit */
        uint64_t room = dev_room(g);
        int64_t fit = room >= lb * (uint64_t)K ? (int64_t)((room - lb * (uint64_t)K) /
                                                          (lb + ZN_DEV_ALIGN)) : 0;
        g->r = (int)(fit < want_r ? fit : want_r);
        if (g->r > L - 1)
            g->r = L - 1; /* not everything fits: at least one layer streams */
        g->n = L - g->r;
        g->K = K < g->n ? K : g->n;
        g->fixed = g->n <= g->K;
        for (int k = 0; k < g->K && !rc; k++) {
            char what[64];
            snprintf(what, sizeof what, "weights: streamed layer slot %d", k);
            rc = zn_dev_alloc(g->dev, lb, what, &g->ring[k]);
            if (!rc && !(g->ring_ptr[k] = calloc((size_t)g->np[1] + 1, sizeof(void *))))
                rc = zn_set_error(-ENOMEM, "out of memory");
            if (!rc)
                bind(g, 1, g->ring[k], g->ring_ptr[k]);
            if (!rc)
                rc = zn_dev_event_create(g->dev, &g->ready[k]);
            if (!rc)
                rc = zn_dev_event_create(g->dev, &g->freed[k]);
        }
        if (!rc && c->nvme_dir && !g->fixed)
            rc = nvme_open(g, c->nvme_dir);
        for (int l = 0; l < L && !rc; l++)
            rc = l < g->r || !g->aio ? home_alloc(g, l + 1, l < g->r) : nvme_alloc(g, l + 1);
        if (!rc)
            rc = zn_dev_stream_create(g->dev, "generate-h2d", &g->copy);
    }
    if (rc)
        goto fail;
    /* a tied head's lm_head is the embedding */
    for (int i = 0; i < g->np[head]; i++) {
        zn_param_info pi;
        zn_model_block_param(d, head, i, &pi);
        if (pi.owner_block == 0)
            g->ptr[head][i] = g->ptr[0][0];
    }
    return 0;
fail:
    zn_gen_destroy(g);
    *out = NULL;
    return rc;
}

void zn_gen_get_placement(const zn_gen *g, zn_gen_placement *p)
{
    memset(p, 0, sizeof *p);
    const zn_model_dims *d = zn_model_get_dims(g->m);
    p->layers = (int)g->L;
    p->kv_bytes_per_seq = zn_model_kv_bytes(g->m, 1) * (uint64_t)g->L;
    p->kv_bytes = zn_model_kv_bytes(g->m, g->max_batch) * (uint64_t)g->L;
    if (g->st) {
        p->resident_layers = (int)g->L;
        p->embed_resident = 1;
        return;
    }
    p->resident_layers = g->r;
    p->streamed_layers = g->n;
    p->ring = g->K;
    p->layer_bytes = g->bytes[1];
    p->embed_resident = g->on_dev[0] || d->tie_embeddings;
    for (int b = 0; b < g->nb; b++) {
        if (g->on_dev[b])
            p->device_weight_bytes += g->bytes[b];
        else if (!(g->on_nvme && g->on_nvme[b]))
            p->pinned_bytes += g->bytes[b];
    }
    p->device_weight_bytes += (uint64_t)g->K * g->bytes[1];
    for (int k = 0; k < g->K; k++)
        p->pinned_bytes += g->stage[k] ? g->bytes[1] : 0;
    p->nvme_bytes = g->nvme_bytes;
    p->nvme_read = g->nvme_read;
    p->streamed_bytes_per_step = g->fixed ? 0 : (uint64_t)g->n * g->bytes[1];
    p->streamed_bytes = g->streamed;
}

/* ---- owned weights: loading ---------------------------------------------------------- */

/* An NVMe-homed tensor's piece: assembled in a buffer, written whole when
 * its last piece is in (pieces come in order). */
static int put_nvme(zn_gen *g, int b, int i, uint64_t off, const void *h, size_t bytes)
{
    zn_param_info pi;
    ZN_TRY(zn_model_block_param(zn_model_get_dims(g->m), b, i, &pi));
    size_t total = (size_t)pi.numel * g->esz;
    if (g->asm_cap < total) {
        free(g->asm_buf);
        g->asm_cap = 0;
        if (!(g->asm_buf = malloc(total)))
            return zn_set_error(-ENOMEM, "out of memory");
        g->asm_cap = total;
    }
    memcpy((unsigned char *)g->asm_buf + off, h, bytes);
    if (off + bytes < total)
        return 0;
    zn_aio_handle hd;
    ZN_TRY(zn_aio_submit_write(g->aio, &g->ext[b][i], g->asm_buf, total, &hd));
    return zn_aio_wait(g->aio, hd);
}

static int put_home(void *ctx, int b, int i, uint64_t off, const void *h, size_t bytes)
{
    zn_gen *g = ctx;
    if (g->on_nvme && g->on_nvme[b])
        return put_nvme(g, b, i, off, h, bytes);
    unsigned char *dst = (unsigned char *)g->home[b] + g->off[b][i] + off;
    if (!g->on_dev[b]) {
        memcpy(dst, h, bytes);
        return 0;
    }
    ZN_TRY(zn_dev_copy_h2d(g->dev, NULL, dst, h, bytes));
    return zn_dev_stream_sync(g->dev, NULL);
}

/* Use u's layer from NVMe: its reads into the slot's stage, once the
 * stage's last copy is done; the copy is queued by complete(). */
static int read_stage(zn_gen *g, uint64_t u)
{
    int k = (int)(u % (uint64_t)g->K), b = 1 + g->r + (int)(u % (uint64_t)g->n);
    ZN_TRY(zn_dev_event_sync(g->dev, g->ready[k]));
    const zn_model_dims *d = zn_model_get_dims(g->m);
    for (int i = 0; i < g->np[b]; i++) {
        zn_param_info pi;
        ZN_TRY(zn_model_block_param(d, b, i, &pi));
        g->rd[k][i] = 0;
        if (pi.owner_block < 0)
            ZN_TRY(zn_aio_submit_read(g->aio, &g->ext[b][i],
                                      (unsigned char *)g->stage[k] + g->off[b][i],
                                      (size_t)pi.numel * g->esz, &g->rd[k][i]));
    }
    g->pending[k] = 1;
    g->nvme_read += g->bytes[b];
    return 0;
}

/* The slot's reads waited for, then its copy queued (after the slot's last
 * use); nothing when no read is pending. */
static int complete(zn_gen *g, int k)
{
    if (!g->pending[k])
        return 0;
    g->pending[k] = 0;
    int rc = 0;
    for (int i = 0; i < g->np[1]; i++) {
        int r = g->rd[k][i] ? zn_aio_wait(g->aio, g->rd[k][i]) : 0;
        rc = rc ? rc : r;
    }
    ZN_TRY(rc);
    ZN_TRY(zn_dev_stream_wait_event(g->dev, g->copy, g->freed[k]));
    ZN_TRY(zn_dev_copy_h2d(g->dev, g->copy, g->ring[k], g->stage[k], g->bytes[1]));
    g->streamed += g->bytes[1];
    return zn_dev_event_record(g->dev, g->ready[k], g->copy);
}

/* Queues the move of use u's layer into its slot, after the slot's last
 * use: a copy from pinned memory, or NVMe reads into the slot's stage. */
static int fetch(zn_gen *g, uint64_t u)
{
    int k = (int)(u % (uint64_t)g->K), b = 1 + g->r + (int)(u % (uint64_t)g->n);
    if (g->aio)
        return read_stage(g, u);
    ZN_TRY(zn_dev_stream_wait_event(g->dev, g->copy, g->freed[k]));
    ZN_TRY(zn_dev_copy_h2d(g->dev, g->copy, g->ring[k], g->home[b], g->bytes[b]));
    g->streamed += g->bytes[b];
    return zn_dev_event_record(g->dev, g->ready[k], g->copy);
}

int zn_gen_load(zn_gen *g, const char *base, const char *adapter_dir)
{
    if (g->st)
        return zn_set_error(ZN_EARG, "generate: this generator's weights are a model state's");
    const zn_model_dims *d = zn_model_get_dims(g->m);
    zn_dtype dt = zn_model_get_config(g->m)->dtype;
    if (adapter_dir && d->lora.r <= 0)
        return zn_set_error(ZN_EARG, "%s: the model was made without LoRA adapters",
                            adapter_dir);
    if (!adapter_dir && d->lora.r > 0)
        return zn_set_error(ZN_EARG, "generate: the model has LoRA adapters: give their folder");
    ZN_TRY(zn_gen_load_base(g, base));
    if (adapter_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", adapter_dir);
        ZN_TRY(zn_m_load_tensors(d, dt, path, "base_model.model.", ZN_M_LOAD_ADAPTERS, put_home,
                                 g));
    }
    return 0;
}

int zn_gen_load_base(zn_gen *g, const char *base)
{
    if (g->st)
        return zn_set_error(ZN_EARG, "generate: this generator's weights are a model state's");
    const zn_model_dims *d = zn_model_get_dims(g->m);
    return zn_m_load_tensors(d, zn_model_get_config(g->m)->dtype, base, "",
                             d->lora.r > 0 ? ZN_M_LOAD_BASE : ZN_M_LOAD_ALL, put_home, g);
}

int zn_gen_put(zn_gen *g, int block, int i, uint64_t first, const float *v, uint64_t n)
{
    if (g->st || block < 0 || block >= g->nb || i < 0 || i >= g->np[block])
        return zn_set_error(ZN_EARG, "generate: no tensor %d of block %d to fill", i, block);
    zn_param_info pi;
    ZN_TRY(zn_model_block_param(zn_model_get_dims(g->m), block, i, &pi));
    if (pi.owner_block >= 0 || first + n > (uint64_t)pi.numel)
        return zn_set_error(ZN_EARG, "generate: elements [%llu, +%llu) of '%s' (%lld)",
                            (unsigned long long)first, (unsigned long long)n, pi.name,
                            (long long)pi.numel);
    if (g->esz == 4)
        return put_home(g, block, i, first * 4, v, (size_t)n * 4);
    uint16_t *h = malloc((size_t)n * 2);
    if (!h)
        return zn_set_error(-ENOMEM, "out of memory");
    for (uint64_t k = 0; k < n; k++)
        h[k] = zn_m_f32_to_bf16(v[k]);
    int rc = put_home(g, block, i, first * 2, h, (size_t)n * 2);
    free(h);
    return rc;
}

int zn_gen_time_link(zn_gen *g, double *seconds)
{
    *seconds = 0;
    if (g->st || !g->n)
        return 0;
    for (int k = 0; k < g->K; k++)
        ZN_TRY(complete(g, k)); /* what is in flight lands first */
    ZN_TRY(zn_dev_sync(g->dev));
    uint64_t keep = g->streamed, keep_rd = g->nvme_read;
    if (g->aio) {
        /* NVMe reads alone, then the copies alone: the pipeline overlaps
         * them, so the step's ceiling is the slower of the two */
        const zn_model_dims *d = zn_model_get_dims(g->m);
        double t0 = zn_now_s();
        for (int j = 0; j < g->n; j++)
            for (int i = 0; i < g->np[1]; i++) {
                zn_param_info pi;
                zn_aio_handle h;
                ZN_TRY(zn_model_block_param(d, 1 + g->r + j, i, &pi));
                if (pi.owner_block >= 0)
                    continue;
                ZN_TRY(zn_aio_submit_read(g->aio, &g->ext[1 + g->r + j][i],
                                          (unsigned char *)g->stage[0] + g->off[1][i],
                                          (size_t)pi.numel * g->esz, &h));
                ZN_TRY(zn_aio_wait(g->aio, h));
            }
        double t_read = zn_now_s() - t0;
        t0 = zn_now_s();
        for (int j = 0; j < g->n; j++)
            ZN_TRY(zn_dev_copy_h2d(g->dev, g->copy, g->ring[j % g->K], g->stage[0],
                                   g->bytes[1]));
        ZN_TRY(zn_dev_stream_sync(g->dev, g->copy));
        double t_copy = zn_now_s() - t0;
        *seconds = t_read > t_copy ? t_read : t_copy;
    } else {
        double t0 = zn_now_s();
        for (int j = 0; j < g->n; j++) {
            int b = 1 + g->r + j;
            ZN_TRY(zn_dev_copy_h2d(g->dev, g->copy, g->ring[j % g->K], g->home[b],
                                   g->bytes[b]));
        }
        ZN_TRY(zn_dev_stream_sync(g->dev, g->copy));
        *seconds = zn_now_s() - t0;
    }
    /* the slots again hold what their next uses expect */
    for (int k = 0; k < g->K && g->primed; k++) {
        ZN_TRY(fetch(g, g->use + (uint64_t)k));
        ZN_TRY(complete(g, (int)((g->use + (uint64_t)k) % (uint64_t)g->K)));
    }
    ZN_TRY(zn_dev_stream_sync(g->dev, g->copy));
    g->streamed = keep;
    g->nvme_read = keep_rd;
    return 0;
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
    return zn_dev_copy_h2d(g->dev, NULL, x, g->hx, (size_t)N * row);
}

/* Layer l's forward: from its resident tensors, or from the ring slot its
 * use holds (waiting for the copy), after which the slot's next use is
 * fetched. */
static int layer(zn_gen *g, int64_t l, void *x, void *y)
{
    if (g->st)
        return zn_model_layer_fwd_kv(g->m, NULL, (int)l, zn_model_state_params(g->st, (int)l + 1),
                                     x, y, g->kv[l]);
    if (l < g->r)
        return zn_model_layer_fwd_kv(g->m, NULL, (int)l, g->ptr[l + 1], x, y, g->kv[l]);
    int k = (int)(g->use % (uint64_t)g->K);
    ZN_TRY(complete(g, k));
    ZN_TRY(zn_dev_stream_wait_event(g->dev, NULL, g->ready[k]));
    ZN_TRY(zn_model_layer_fwd_kv(g->m, NULL, (int)l, g->ring_ptr[k], x, y, g->kv[l]));
    if (!g->fixed) {
        ZN_TRY(zn_dev_event_record(g->dev, g->freed[k], NULL));
        ZN_TRY(fetch(g, g->use + (uint64_t)g->K));
    }
    g->use++;
    /* the next use's copy goes now, beside this layer's compute */
    return complete(g, (int)(g->use % (uint64_t)g->K));
}

/* One forward over a decoding batch set with zn_model_set_decode (ids: its
 * N tokens): the logits of rows `rows` (each the index of a sequence's last
 * new token) land in g->logits. */
static int step(zn_gen *g, const int32_t *ids, int64_t N, int64_t nrows, const int64_t *rows)
{
    zn_model *m = g->m;
    void *x = g->xa, *y = g->xb;
    ZN_TRY(embed(g, ids, N, x));
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
        ZN_TRY(fetch(g, g->use));
        ZN_TRY(complete(g, (int)g->use));
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
            if ((rc = zn_model_set_decode(g->m, NULL, 1, s->len - c, s->seq + c, &c, &b)) ||
                (rc = step(g, s->seq + c, s->len - c, 1, &row)))
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
        if ((rc = zn_model_set_decode(g->m, NULL, nb, 1, bid, pos0, slot)) ||
            (rc = step(g, bid, nb, nb, rows)))
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
