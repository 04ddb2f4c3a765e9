/* The simple driver: every parameter (and gradient) resident in the device
 * arena, loaded from / saved to Hugging Face safetensors, and whole-model
 * forward / forward+backward over the blocks. Tests, `zinc eval` and the
 * model benchmark use it; the offload scheduler drives the blocks itself. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "zinc/optim.h"
#include "zinc/safetensors.h"
#include "zinc/tokens.h"
#include "model/model-impl.h"
#include "util/try-impl.h"


/* Host staging for loads, saves and init: bounded, whatever the tensor size. */
#define STAGING_BYTES (16u << 20)

struct zn_model_state {
    zn_model *m;
    zn_dev *dev;
    int nb;
    int *np;
    void ***params;
    float ***grads;
    void **acts;   /* n_layers + 1 activations: x_0 (embedding out) .. x_L */
    void *dbuf;    /* the gradient flowing back (dx may alias dy) */
    void **saved;  /* per layer, when checkpointing is off */
};

void zn_model_state_destroy(zn_model_state *st)
{
    if (!st)
        return;
    const zn_model_dims *d = zn_model_get_dims(st->m);
    for (int b = 0; b < st->nb; b++) {
        for (int i = 0; i < (st->np ? st->np[b] : 0); i++) {
            zn_param_info pi;
            if (zn_model_block_param(d, b, i, &pi) || pi.owner_block >= 0)
                continue; /* a tied tensor is freed by its owner */
            if (st->params && st->params[b])
                zn_dev_free(st->dev, st->params[b][i]);
            if (st->grads && st->grads[b])
                zn_dev_free(st->dev, st->grads[b][i]);
        }
        if (st->params)
            free(st->params[b]);
        if (st->grads)
            free(st->grads[b]);
    }
    if (st->acts)
        for (int l = 0; l <= d->n_layers; l++)
            zn_dev_free(st->dev, st->acts[l]);
    if (st->saved)
        for (int l = 0; l < d->n_layers; l++)
            zn_dev_free(st->dev, st->saved[l]);
    zn_dev_free(st->dev, st->dbuf);
    free(st->acts);
    free(st->saved);
    free(st->params);
    free(st->grads);
    free(st->np);
    free(st);
}

int zn_model_state_create(zn_model_state **out, zn_model *m, int with_grads)
{
    int rc = 0;
    const zn_model_dims *d = zn_model_get_dims(m);
    size_t esz = zn_dtype_size(zn_model_get_config(m)->dtype);
    *out = NULL;
    zn_model_state *st = calloc(1, sizeof *st);
    if (!st)
        return zn_set_error(-ENOMEM, "out of memory");
    st->m = m;
    st->dev = zn_model_get_dev(m);
    st->nb = zn_model_num_blocks(d);
    st->np = calloc((size_t)st->nb, sizeof *st->np);
    st->params = calloc((size_t)st->nb, sizeof *st->params);
    st->grads = calloc((size_t)st->nb, sizeof *st->grads);
    st->acts = calloc((size_t)d->n_layers + 1, sizeof *st->acts);
    if (!zn_model_get_config(m)->checkpoint)
        st->saved = calloc((size_t)d->n_layers, sizeof *st->saved);
    if (!st->np || !st->params || !st->grads || !st->acts ||
        (!zn_model_get_config(m)->checkpoint && !st->saved)) {
        rc = zn_set_error(-ENOMEM, "out of memory");
        goto fail;
    }
    for (int b = 0; b < st->nb; b++) {
        int np = zn_model_block_nparams(d, b);
        st->params[b] = calloc((size_t)np, sizeof **st->params);
        st->grads[b] = calloc((size_t)np, sizeof **st->grads);
        if (!st->params[b] || !st->grads[b]) {
            rc = zn_set_error(-ENOMEM, "out of memory");
            goto fail;
        }
        st->np[b] = np;
        for (int i = 0; i < np; i++) {
            zn_param_info pi;
            if ((rc = zn_model_block_param(d, b, i, &pi)))
                goto fail;
            if (pi.owner_block >= 0) {
                /* Tied: the same buffers as the owner's tensor of that name. */
                for (int k = 0; k < st->np[pi.owner_block]; k++) {
                    zn_param_info po;
                    zn_model_block_param(d, pi.owner_block, k, &po);
                    if (!strcmp(po.name, pi.name)) {
                        st->params[b][i] = st->params[pi.owner_block][k];
                        st->grads[b][i] = st->grads[pi.owner_block][k];
                    }
                }
                continue;
            }
            if ((rc = zn_dev_alloc(st->dev, (size_t)pi.numel * esz, pi.name, &st->params[b][i])))
                goto fail;
            if (with_grads) {
                char what[128];
                snprintf(what, sizeof what, "grad %s", pi.name);
                void *g;
                if ((rc = zn_dev_alloc(st->dev, (size_t)pi.numel * 4, what, &g)))
                    goto fail;
                st->grads[b][i] = g;
            }
        }
    }
    uint64_t ab = zn_model_act_bytes(m);
    for (int l = 0; l <= d->n_layers; l++)
        if ((rc = zn_dev_alloc(st->dev, ab, "activation", &st->acts[l])))
            goto fail;
    if ((rc = zn_dev_alloc(st->dev, ab, "activation grad", &st->dbuf)))
        goto fail;
    if (st->saved)
        for (int l = 0; l < d->n_layers; l++)
            if ((rc = zn_dev_alloc(st->dev, zn_model_layer_saved_bytes(m), "saved activations",
                                   &st->saved[l])))
                goto fail;
    if (with_grads && (rc = zn_model_state_zero_grads(st, NULL)))
        goto fail;
    *out = st;
    return 0;
fail:
    zn_model_state_destroy(st);
    return rc;
}

void *const *zn_model_state_params(zn_model_state *st, int block)
{
    return block >= 0 && block < st->nb ? st->params[block] : NULL;
}

float *const *zn_model_state_grads(zn_model_state *st, int block)
{
    return block >= 0 && block < st->nb ? st->grads[block] : NULL;
}

int zn_model_state_zero_grads(zn_model_state *st, zn_stream *s)
{
    const zn_model_dims *d = zn_model_get_dims(st->m);
    for (int b = 0; b < st->nb; b++)
        for (int i = 0; i < st->np[b]; i++) {
            zn_param_info pi;
            ZN_TRY(zn_model_block_param(d, b, i, &pi));
            if (pi.owner_block < 0 && st->grads[b][i])
                ZN_TRY(zn_dev_memset(st->dev, s, st->grads[b][i], 0, (size_t)pi.numel * 4));
        }
    return zn_dev_stream_sync(st->dev, s);
}

/* ---- init, load, save ------------------------------------------------------------ */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Standard normal as a function of (seed, tensor, element). */
static float normal_at(uint64_t seed, uint64_t tensor, uint64_t i)
{
    uint64_t a = mix64(seed * 0x9e3779b97f4a7c15ull ^ mix64(tensor + 0x632be59bd9b4e019ull) ^ i);
    uint64_t b = mix64(a + 0x9e3779b97f4a7c15ull);
    double u1 = ((double)(a >> 11) + 0.5) * 0x1.0p-53, u2 = (double)(b >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}


int zn_model_state_init_random(zn_model_state *st, uint64_t seed)
{
    const zn_model_dims *d = zn_model_get_dims(st->m);
    zn_dtype dt = zn_model_get_config(st->m)->dtype;
    size_t esz = zn_dtype_size(dt), per = STAGING_BYTES / 4;
    float *f = malloc(STAGING_BYTES);
    void *h = malloc(per * esz);
    int rc = 0;
    uint64_t tensor = 0;
    if (!f || !h) {
        rc = zn_set_error(-ENOMEM, "out of memory");
        goto out;
    }
    for (int b = 0; b < st->nb && !rc; b++)
        for (int i = 0; i < st->np[b] && !rc; i++) {
            zn_param_info pi;
            if ((rc = zn_model_block_param(d, b, i, &pi)) || pi.owner_block >= 0)
                continue;
            size_t nl = strlen(pi.name);
            int is_norm = nl > 11 && strstr(pi.name, "norm.weight") != NULL;
            int is_bias = nl > 5 && !strcmp(pi.name + nl - 5, ".bias");
            for (int64_t first = 0; first < pi.numel && !rc; first += (int64_t)per) {
                size_t n = (size_t)(pi.numel - first < (int64_t)per ? pi.numel - first
                                                                     : (int64_t)per);
                for (size_t k = 0; k < n; k++)
                    f[k] = is_norm ? 1.0f : is_bias ? 0.0f
                                                    : 0.02f * normal_at(seed, tensor,
                                                                        (uint64_t)first + k);
                rc = zn_convert(h, dt, f, ZN_DTYPE_F32, n);
                if (!rc)
                    rc = zn_dev_copy_h2d(st->dev, NULL,
                                         (unsigned char *)st->params[b][i] + (size_t)first * esz,
                                         h, n * esz);
                if (!rc)
                    rc = zn_dev_stream_sync(st->dev, NULL);
            }
            tensor++;
        }
out:
    free(f);
    free(h);
    return rc;
}

/* Tensors a checkpoint may carry that zinc does not use. */
static int ignorable(const char *name, const zn_model_dims *d)
{
    if (strstr(name, "rotary_emb.inv_freq"))
        return 1;
    return d->tie_embeddings && !strcmp(name, "lm_head.weight");
}

int zn_m_load_tensors(const zn_model_dims *d, zn_dtype dt, const char *path, const char *prefix,
                      int which, zn_m_put_fn put, void *ctx)
{
    size_t esz = zn_dtype_size(dt);
    int nb = zn_model_num_blocks(d);
    uint64_t per = STAGING_BYTES / esz;
    zn_st *f = NULL;
    int rc = zn_st_open(&f, path);
    if (rc)
        return rc;
    size_t nt = zn_st_count(f), used = 0;
    unsigned char *usedv = calloc(nt ? nt : 1, 1);
    void *h = malloc(STAGING_BYTES);
    if (!h || !usedv) {
        rc = zn_set_error(-ENOMEM, "out of memory");
        goto out;
    }
    for (int b = 0; b < nb && !rc; b++)
        for (int i = 0; i < zn_model_block_nparams(d, b) && !rc; i++) {
            zn_param_info pi;
            if ((rc = zn_model_block_param(d, b, i, &pi)) || pi.owner_block >= 0)
                continue;
            if ((which == ZN_M_LOAD_BASE && pi.lora) || (which == ZN_M_LOAD_ADAPTERS && !pi.lora))
                continue;
            char name[sizeof pi.name + 64];
            snprintf(name, sizeof name, "%s%s", prefix, pi.name);
            const zn_st_tensor *t = zn_st_find(f, name);
            if (!t) {
                rc = zn_set_error(ZN_ECONFIG, "%s: tensor '%s' is missing (%s)", path, name,
                                  which == ZN_M_LOAD_ADAPTERS ? "adapter_config.json and the adapter's "
                                  "weights disagree?" : "config.json and the weights disagree?");
                break;
            }
            int same = t->ndim == pi.ndim;
            for (int k = 0; same && k < pi.ndim; k++)
                same = t->shape[k] == pi.shape[k];
            if (!same) {
                char want[64], have[128] = "";
                snprintf(want, sizeof want, pi.ndim == 2 ? "[%lld, %lld]" : "[%lld]",
                         (long long)pi.shape[0], (long long)pi.shape[1]);
                size_t o = 0;
                for (int k = 0; k < t->ndim && o < sizeof have - 24; k++)
                    o += (size_t)snprintf(have + o, sizeof have - o, "%s%lld", k ? ", " : "",
                                          (long long)t->shape[k]);
                rc = zn_set_error(ZN_ECONFIG, "%s: tensor '%s' has shape [%s], the config needs %s",
                                  zn_st_shard_path(f, t->shard), name, have, want);
                break;
            }
            usedv[t - zn_st_tensor_at(f, 0)] = 1;
            used++;
            for (uint64_t first = 0; first < t->numel && !rc; first += per) {
                uint64_t n = t->numel - first < per ? t->numel - first : per;
                rc = zn_st_read_range(f, t, first, n, dt, h, (size_t)(n * esz));
                if (!rc)
                    rc = put(ctx, b, i, first * esz, h, (size_t)(n * esz));
            }
        }
    if (!rc && used < nt) {
        size_t extra = 0;
        const char *first = NULL;
        for (size_t k = 0; k < nt; k++) {
            const zn_st_tensor *t = zn_st_tensor_at(f, k);
            if (usedv[k])
                continue;
            if (ignorable(t->name, d)) {
                zn_debug("%s: skipping '%s'", path, t->name);
                continue;
            }
            extra++;
            if (!first)
                first = t->name;
        }
        if (extra)
            zn_warn("%s: %zu tensors are not used by the model (first: '%s')", path, extra,
                    first);
    }
out:
    free(h);
    free(usedv);
    zn_st_close(f);
    return rc;
}

/* A state's destination: its device tensor, through the staging copy. */
static int put_state(void *ctx, int b, int i, uint64_t off, const void *h, size_t bytes)
{
    zn_model_state *st = ctx;
    ZN_TRY(zn_dev_copy_h2d(st->dev, NULL, (unsigned char *)st->params[b][i] + off, h, bytes));
    return zn_dev_stream_sync(st->dev, NULL);
}

static int load_tensors(zn_model_state *st, const char *path, const char *prefix, int which)
{
    return zn_m_load_tensors(zn_model_get_dims(st->m), zn_model_get_config(st->m)->dtype, path,
                             prefix, which, put_state, st);
}

zn_model *zn_model_state_model(const zn_model_state *st)
{
    return st->m;
}

int zn_model_state_load(zn_model_state *st, const char *path)
{
    return load_tensors(st, path, "", ZN_M_LOAD_ALL);
}

int zn_model_state_load_peft(zn_model_state *st, const char *base, const char *adapter_dir)
{
    const zn_model_dims *d = zn_model_get_dims(st->m);
    if (d->lora.r <= 0)
        return zn_set_error(ZN_EARG, "%s: the model was made without LoRA adapters", adapter_dir);
    ZN_TRY(load_tensors(st, base, "", ZN_M_LOAD_BASE));
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", adapter_dir);
    return load_tensors(st, path, "base_model.model.", ZN_M_LOAD_ADAPTERS);
}

int zn_model_state_save(zn_model_state *st, const char *dir)
{
    const zn_model_dims *d = zn_model_get_dims(st->m);
    zn_dtype dt = zn_model_get_config(st->m)->dtype;
    size_t esz = zn_dtype_size(dt);
    uint64_t per = STAGING_BYTES / esz;
    char path[4096];
    int rc;

    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return zn_set_error(-ENAMETOOLONG, "%s: path too long", dir);
    ZN_TRY(zn_model_dims_write_hf_as(d, path, dt));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    zn_st_writer *w;
    ZN_TRY(zn_st_writer_create(&w, path));
    void *h = malloc(STAGING_BYTES);
    if (!h) {
        zn_st_writer_destroy(w);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    rc = zn_st_writer_set_metadata(w, "format", "pt");
    for (int pass = 0; pass < 2 && !rc; pass++)
        for (int b = 0; b < st->nb && !rc; b++)
            for (int i = 0; i < st->np[b] && !rc; i++) {
                zn_param_info pi;
                if ((rc = zn_model_block_param(d, b, i, &pi)) || pi.owner_block >= 0)
                    continue;
                if (pass == 0) {
                    rc = zn_st_writer_add(w, pi.name, zn_st_dtype_from(dt), pi.ndim, pi.shape);
                    continue;
                }
                for (uint64_t first = 0; first < (uint64_t)pi.numel && !rc; first += per) {
                    uint64_t n = (uint64_t)pi.numel - first < per ? (uint64_t)pi.numel - first
                                                                   : per;
                    rc = zn_dev_copy_d2h(st->dev, NULL, h,
                                         (unsigned char *)st->params[b][i] + first * esz,
                                         (size_t)(n * esz));
                    if (!rc)
                        rc = zn_dev_stream_sync(st->dev, NULL);
                    if (!rc)
                        rc = zn_st_writer_write(w, pi.name, dt, h, first, n);
                }
            }
    if (!rc)
        rc = zn_st_writer_finish(w);
    zn_st_writer_destroy(w);
    free(h);
    return rc;
}

/* ---- whole-model passes ------------------------------------------------------------ */

static int forward_blocks(zn_model_state *st, zn_stream *s)
{
    zn_model *m = st->m;
    int L = (int)zn_model_get_dims(m)->n_layers;
    ZN_TRY(zn_model_embed_fwd(m, s, st->params[0], st->acts[0]));
    for (int l = 0; l < L; l++)
        ZN_TRY(zn_model_layer_fwd(m, s, l, st->params[l + 1], st->acts[l], st->acts[l + 1],
                               st->saved ? st->saved[l] : NULL));
    return zn_model_head_fwd(m, s, st->params[L + 1], st->acts[L]);
}

int zn_model_state_forward(zn_model_state *st, zn_stream *s, float *loss)
{
    ZN_TRY(forward_blocks(st, s));
    return zn_model_read_loss(st->m, s, loss);
}

int zn_model_state_forward_backward(zn_model_state *st, zn_stream *s, float *loss)
{
    zn_model *m = st->m;
    int L = (int)zn_model_get_dims(m)->n_layers;
    if (!st->grads[0][0])
        return zn_set_error(ZN_EARG, "model state was created without gradients");
    ZN_TRY(forward_blocks(st, s));
    ZN_TRY(zn_model_head_bwd(m, s, st->params[L + 1], st->acts[L], st->dbuf, st->grads[L + 1]));
    for (int l = L - 1; l >= 0; l--)
        ZN_TRY(zn_model_layer_bwd(m, s, l, st->params[l + 1], st->acts[l],
                               st->saved ? st->saved[l] : NULL, st->dbuf, st->dbuf,
                               st->grads[l + 1]));
    ZN_TRY(zn_model_embed_bwd(m, s, st->params[0], st->dbuf, st->grads[0]));
    return zn_model_read_loss(m, s, loss);
}

int zn_model_state_logits(zn_model_state *st, zn_stream *s, int64_t row0, int64_t nrows,
                          float *out)
{
    zn_model *m = st->m;
    const zn_model_dims *d = zn_model_get_dims(m);
    int L = (int)d->n_layers;
    void *buf;
    if (nrows <= 0)
        return zn_set_error(ZN_EARG, "model: nrows %lld", (long long)nrows);
    ZN_TRY(zn_dev_alloc(st->dev, (size_t)(nrows * d->vocab) * 4, "logits", &buf));
    int rc = zn_model_head_logits(m, s, st->params[L + 1], st->acts[L], row0, nrows, buf);
    if (!rc)
        rc = zn_dev_copy_d2h(st->dev, s, out, buf, (size_t)(nrows * d->vocab) * 4);
    if (!rc)
        rc = zn_dev_stream_sync(st->dev, s);
    zn_dev_sync(st->dev);
    zn_dev_free(st->dev, buf);
    return rc;
}

int zn_model_state_eval(zn_model_state *st, zn_stream *s, const zn_tokens *data, int64_t batch,
                        int64_t seq, int64_t max_batches, double *mean_loss, int64_t *n_tokens,
                        int64_t *n_batches)
{
    zn_model *m = st->m;
    const zn_model_config *cfg = zn_model_get_config(m);
    if (batch <= 0 || seq <= 0 || batch * seq > cfg->max_batch * cfg->max_seq ||
        seq > cfg->max_seq)
        return zn_set_error(ZN_EARG, "eval: batch %lld x seq %lld beyond the model's %lld x %lld",
                            (long long)batch, (long long)seq, (long long)cfg->max_batch,
                            (long long)cfg->max_seq);
    zn_loader_config lc = zn_loader_config_default();
    lc.seq_len = seq;
    lc.batch = batch;
    lc.shuffle = 0;
    lc.vocab = zn_model_get_dims(m)->vocab;
    zn_loader *l;
    ZN_TRY(zn_loader_create(&l, data, &lc));
    uint64_t nb = zn_loader_steps_per_epoch(l);
    if (max_batches > 0 && (uint64_t)max_batches < nb)
        nb = (uint64_t)max_batches;
    int32_t *in = malloc((size_t)(batch * seq) * 3 * sizeof *in);
    int rc = in ? 0 : zn_set_error(-ENOMEM, "out of memory");
    double sum = 0;
    int64_t toks = 0;
    for (uint64_t k = 0; k < nb && !rc; k++) {
        float loss;
        rc = zn_loader_get(l, k, in, in + batch * seq, in + 2 * batch * seq);
        if (!rc)
            rc = zn_model_set_batch(m, s, batch, seq, in, in + batch * seq,
                                    in + 2 * batch * seq);
        if (!rc && !zn_model_batch_tokens(m))
            continue;  /* every target masked: nothing to average */
        if (!rc)
            rc = zn_model_state_forward(st, s, &loss);
        if (!rc) {
            int64_t n = zn_model_batch_tokens(m);
            sum += (double)loss * (double)n;
            toks += n;
        }
    }
    free(in);
    zn_loader_destroy(l);
    if (rc)
        return rc;
    if (mean_loss)
        *mean_loss = toks ? sum / (double)toks : NAN;
    if (n_tokens)
        *n_tokens = toks;
    if (n_batches)
        *n_batches = (int64_t)nb;
    return 0;
}
