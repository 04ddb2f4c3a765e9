/* The Llama / Qwen2 decoder of include/zinc/model.h as a zn_train_model: a
 * block's tensors are views into its flat parameter (and gradient) buffer,
 * laid out in zn_model_block_param order. The model object (workspace, RoPE
 * table) is created in prepare(), on the trainer's device. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/model.h"
#include "zinc/train.h"

#define MAX_TENSORS 32

typedef struct {
    int n;
    uint64_t off[MAX_TENSORS];   /* elements */
    int kind[MAX_TENSORS];       /* 0 matrix (normal), 1 norm (ones), 2 bias (zeros) */
} block_layout;

struct zn_train_llama {
    zn_model_dims d;
    int64_t batch, seq;
    double init_std;
    uint64_t seed;
    int nb;
    uint64_t *block_params;
    block_layout *lay;
    zn_model *m;
    size_t esz;
    zn_train_model tm;
};

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int ll_init(void *ctx, int b, float *out, uint64_t n)
{
    zn_train_llama *l = ctx;
    const block_layout *ly = &l->lay[b];
    for (int i = 0; i < ly->n; i++) {
        uint64_t end = i + 1 < ly->n ? ly->off[i + 1] : n;
        uint64_t key = mix(l->seed ^ mix(((uint64_t)b << 8) | (uint64_t)i));
        for (uint64_t k = ly->off[i]; k < end; k++) {
            if (ly->kind[i] == 1) {
                out[k] = 1.0f;
            } else if (ly->kind[i] == 2) {
                out[k] = 0.0f;
            } else {
                /* Box-Muller from two hashes of (key, element) */
                uint64_t a = mix(key + 2 * k), c = mix(key + 2 * k + 1);
                double u1 = ((double)(a >> 11) + 0.5) / 9007199254740992.0;
                double u2 = (double)(c >> 11) / 9007199254740992.0;
                out[k] = (float)(l->init_std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
            }
        }
    }
    return 0;
}

static int ll_prepare(void *ctx, zn_dev *d, zn_stream *s, zn_dtype dt)
{
    zn_train_llama *l = ctx;
    (void)s;
    zn_model_config mc = zn_model_config_default(d);
    mc.dtype = dt;
    mc.max_batch = l->batch;
    mc.max_seq = l->seq;
    mc.checkpoint = 1;
    int rc = zn_model_create(&l->m, d, &l->d, &mc);
    if (rc)
        return rc;
    l->esz = zn_dtype_size(dt);
    l->tm.act_bytes = (size_t)zn_model_act_bytes(l->m);
    return 0;
}

static void ll_release(void *ctx, zn_dev *d)
{
    zn_train_llama *l = ctx;
    (void)d;
    zn_model_destroy(l->m);
    l->m = NULL;
}

static int ll_set_batch(void *ctx, zn_stream *s, const int32_t *ids, const int32_t *targets,
                        int64_t batch, int64_t seq, float loss_scale)
{
    zn_train_llama *l = ctx;
    int rc = zn_model_set_batch(l->m, s, batch, seq, ids, targets);
    if (rc)
        return rc;
    zn_model_set_loss_scale(l->m, loss_scale);
    return 0;
}

static int ll_read_loss(void *ctx, zn_stream *s, float *loss)
{
    zn_train_llama *l = ctx;
    return zn_model_read_loss(l->m, s, loss);
}

static void views(const zn_train_llama *l, int b, void *base, size_t esz, void **out)
{
    const block_layout *ly = &l->lay[b];
    for (int i = 0; i < ly->n; i++)
        out[i] = (char *)base + ly->off[i] * esz;
}

static int ll_forward(void *ctx, zn_stream *s, int b, void *params, const void *in, void *out)
{
    zn_train_llama *l = ctx;
    void *p[MAX_TENSORS];
    views(l, b, params, l->esz, p);
    if (b == 0)
        return zn_model_embed_fwd(l->m, s, p, out);
    if (b == l->nb - 1)
        return zn_model_head_fwd(l->m, s, p, in);
    return zn_model_layer_fwd(l->m, s, b - 1, p, in, out, NULL);
}

static int ll_backward(void *ctx, zn_stream *s, int b, void *params, const void *in,
                       const void *dout, void *din, float *dparams)
{
    zn_train_llama *l = ctx;
    void *p[MAX_TENSORS], *g[MAX_TENSORS];
    views(l, b, params, l->esz, p);
    views(l, b, dparams, 4, g);
    if (b == 0)
        return zn_model_embed_bwd(l->m, s, p, dout, (float *const *)g);
    if (b == l->nb - 1)
        return zn_model_head_bwd(l->m, s, p, in, din, (float *const *)g);
    return zn_model_layer_bwd(l->m, s, b - 1, p, in, NULL, dout, din, (float *const *)g);
}

int zn_train_llama_create(zn_train_llama **out, const zn_model_dims *dims, int64_t micro_batch,
                          int64_t seq, double init_std, uint64_t seed)
{
    *out = NULL;
    int rc = zn_model_dims_validate(dims);
    if (rc)
        return rc;
    if (dims->tie_embeddings)
        return zn_set_error(ZN_EUNSUPPORTED, "tie_word_embeddings: the offload schedule does "
                            "not support tied embeddings yet (the head would need the "
                            "embedding's parameters resident with its own)");
    zn_train_llama *l = calloc(1, sizeof *l);
    if (!l)
        return zn_set_error(-ENOMEM, "out of memory");
    l->d = *dims;
    l->batch = micro_batch;
    l->seq = seq;
    l->init_std = init_std > 0 ? init_std : 0.02;
    l->seed = seed;
    l->nb = zn_model_num_blocks(dims);
    l->block_params = calloc((size_t)l->nb, sizeof *l->block_params);
    l->lay = calloc((size_t)l->nb, sizeof *l->lay);
    if (!l->block_params || !l->lay) {
        zn_train_llama_destroy(l);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    for (int b = 0; b < l->nb; b++) {
        block_layout *ly = &l->lay[b];
        ly->n = zn_model_block_nparams(dims, b);
        if (ly->n > MAX_TENSORS) {
            zn_train_llama_destroy(l);
            return zn_set_error(ZN_EINTERNAL, "block %d has %d tensors", b, ly->n);
        }
        uint64_t off = 0;
        for (int i = 0; i < ly->n; i++) {
            zn_param_info pi;
            if ((rc = zn_model_block_param(dims, b, i, &pi))) {
                zn_train_llama_destroy(l);
                return rc;
            }
            size_t nl = strlen(pi.name);
            ly->off[i] = off;
            ly->kind[i] = strstr(pi.name, "norm.weight") ? 1
                          : (nl > 5 && !strcmp(pi.name + nl - 5, ".bias")) ? 2 : 0;
            off += (uint64_t)pi.numel;
        }
        l->block_params[b] = off;
        if (off != zn_model_block_param_count(dims, b)) {
            zn_train_llama_destroy(l);
            return zn_set_error(ZN_EINTERNAL, "block %d: tensors hold %llu elements, the "
                                "block count is %llu", b, (unsigned long long)off,
                                (unsigned long long)zn_model_block_param_count(dims, b));
        }
    }
    zn_train_model *m = &l->tm;
    m->ctx = l;
    m->n_blocks = l->nb;
    m->block_params = l->block_params;
    m->act_bytes = (size_t)(micro_batch * seq * dims->hidden) * 4;
    m->flops_per_token = zn_model_flops(dims, -1, 1, seq) / (double)seq;
    m->prepare = ll_prepare;
    m->release = ll_release;
    m->init_params = ll_init;
    m->set_batch = ll_set_batch;
    m->read_loss = ll_read_loss;
    m->forward = ll_forward;
    m->backward = ll_backward;
    *out = l;
    return 0;
}

const zn_train_model *zn_train_llama_model(zn_train_llama *l)
{
    return &l->tm;
}

void zn_train_llama_destroy(zn_train_llama *l)
{
    if (!l)
        return;
    free(l->block_params);
    free(l->lay);
    free(l);
}
