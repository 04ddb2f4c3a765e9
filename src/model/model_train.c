/* The Llama / Qwen2 decoder of include/zinc/model.h as a zn_train_model: a
 * block's tensors are views into its flat parameter (and gradient) buffer,
 * laid out in zn_model_block_param order. The model object (workspace, RoPE
 * table) is created in prepare(), on the trainer's device. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "zinc/safetensors.h"
#include "zinc/train_model.h"
#include "util/hash-impl.h"

/* A block's tensors: a dense layer has up to 19 and 18 adapters; a
 * mixture-of-experts layer its router and 3 per expert (Qwen3-30B-A3B:
 * 128 experts, 393 tensors), up to 512 experts here */
#define MAX_TENSORS (3 * 512 + 64)

typedef struct {
    int n;
    uint64_t off[MAX_TENSORS];   /* elements */
    int kind[MAX_TENSORS];       /* 0 matrix (normal), 1 norm (ones), 2 bias (zeros),
                                    3 lora_A (PEFT's Kaiming uniform), 4 lora_B (zeros) */
    int64_t fan_in[MAX_TENSORS]; /* lora_A: its in features */
    const zn_st_tensor *src[MAX_TENSORS]; /* loaded: the checkpoint's tensor */
    uint64_t src_off[MAX_TENSORS]; /* the part's first element in the whole tensor */
    int pidx[MAX_TENSORS];       /* its index in zn_model_block_param order */
    uint64_t numel[MAX_TENSORS]; /* the whole tensor's elements */
    int block, part;             /* the model block and its part (zn_model_part) */
    int tied;                    /* the tied head: its last tensor is block 0's table */
    int64_t row0, rows;          /* an embedding or head part's rows */
    int n_all;                   /* tensors the block calls take (own + tied views) */
} block_layout;

struct zn_train_llama {
    int attention;          /* zn_model_config.attention */
    zn_model_dims d;
    int64_t batch, seq;
    double init_std;
    uint64_t seed;
    int nb;                      /* the trainer's blocks: the model's parts */
    uint64_t *block_params;
    unsigned char *joins;        /* a further part of the same model block */
    int64_t *sparse_row0;        /* an untied embedding's parts: their first row */
    uint64_t *block_frozen;      /* LoRA: the decoder's own tensors */
    block_layout *lay;
    zn_st *ast;                  /* LoRA: the adapter the adapters start from */
    uint64_t lora_seed;
    zn_model *m;
    size_t esz;
    zn_st *st;                   /* the checkpoint the weights come from, or NULL */
    zn_dev *dev;
    void **embed;                /* tied: the embedding parts' resident tables (device) */
    int n_embed;                 /* how many parts the embedding has */
    float *tied_grad;            /* tied: the head's lm_head gradient (device, fp32) */
    _Atomic uint64_t bytes_read;
    uint64_t bytes_total;        /* tensor bytes the model takes from st */
    zn_train_model tm;
};

static uint64_t mix(uint64_t z)
{
    return zn_mix64(z + ZN_GOLDEN64); /* one splitmix64 step */
}

/* Seeded normal(0, std) values of elements [first, first + n) of a tensor:
 * Box-Muller on two hashes of (key, pair) gives the pair (2j, 2j+1) its
 * cosine and sine halves, so any range is the same numbers wherever it is
 * cut. */
static void normal_range(uint64_t key, double std, uint64_t first, uint64_t n, float *out)
{
    /* single precision: the init of a 1.35B model is ~1.35G of these, and
     * float logf/sincosf cost about half of the double ones; 24-bit
     * uniforms (u1 in (0, 1]) keep the tails to |z| < 5.8 */
    const float fstd = (float)std;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (uint64_t k = 0; k < n; k++) {
        uint64_t e = first + k, j = e >> 1;
        uint64_t h = mix(key + j);
        float u1 = ((float)(uint32_t)(h >> 40) + 1.0f) * (1.0f / 16777216.0f);
        float u2 = (float)(uint32_t)(h & 0xffffff) * (float)(2.0 * M_PI / 16777216.0);
        float r = fstd * sqrtf(-2.0f * logf(u1)), sn, cs;
        sincosf(u2, &sn, &cs);
        out[k] = r * ((e & 1) ? sn : cs);
    }
}

/* Reads of a loaded range, cut into pieces of at most READ_PIECE elements
 * that the OpenMP threads pread and widen in parallel. */
#define READ_PIECE ((uint64_t)4 << 20)

typedef struct {
    zn_st *st;
    const zn_st_tensor *t;
    uint64_t first, n;   /* tensor elements */
    float *out;
} read_piece;

static int read_pieces(zn_train_llama *l, const read_piece *rp, int np)
{
    _Atomic int err = 0;
    char msg[512] = "";
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < np; i++) {
        if (atomic_load(&err))
            continue;
        int rc = zn_st_read_range(rp[i].st, rp[i].t, rp[i].first, rp[i].n, ZN_DTYPE_F32, rp[i].out,
                                  (size_t)(rp[i].n * 4));
        if (rc) {
            int zero = 0;
            if (atomic_compare_exchange_strong(&err, &zero, rc))
                snprintf(msg, sizeof msg, "%s", zn_last_error());
        } else {
            atomic_fetch_add(&l->bytes_read, rp[i].n * zn_st_dtype_size(rp[i].t->dtype));
        }
    }
    int rc = atomic_load(&err);
    return rc ? zn_set_error(rc, "%s", msg) : 0;
}

static int ll_tensor_parts(void *ctx, int b, uint64_t *off, uint64_t *numel, int cap)
{
    const zn_train_llama *l = ctx;
    const block_layout *ly = &l->lay[b];
    if (ly->n > cap)
        return zn_set_error(ZN_EINTERNAL, "block %d: %d tensor parts, room for %d", b, ly->n,
                            cap);
    for (int k = 0; k < ly->n; k++) {
        off[k] = ly->off[k];
        numel[k] = ly->numel[k];
    }
    return ly->n;
}

static int ll_init(void *ctx, int b, uint64_t first, uint64_t n, float *out)
{
    zn_train_llama *l = ctx;
    const block_layout *ly = &l->lay[b];
    uint64_t total = l->block_params[b];
    if (first > total || n > total - first)
        return zn_set_error(ZN_EARG, "init: block %d range [%llu, +%llu) outside its %llu "
                            "elements", b, (unsigned long long)first, (unsigned long long)n,
                            (unsigned long long)total);
    read_piece rp[64];
    int np = 0, rc = 0;
    for (int i = 0; i < ly->n && !rc; i++) {
        uint64_t ts = ly->off[i], te = i + 1 < ly->n ? ly->off[i + 1] : total;
        uint64_t a = first > ts ? first : ts, e = first + n < te ? first + n : te;
        if (a >= e)
            continue;
        float *o = out + (a - first);
        if (ly->src[i]) {
            for (uint64_t x = a; x < e; x += READ_PIECE) {
                if (np == (int)(sizeof rp / sizeof rp[0])) {
                    if ((rc = read_pieces(l, rp, np)))
                        return rc;
                    np = 0;
                }
                rp[np++] = (read_piece){ ly->kind[i] >= 3 ? l->ast : l->st, ly->src[i],
                                         x - ts + ly->src_off[i],
                                         e - x < READ_PIECE ? e - x : READ_PIECE,
                                         out + (x - first) };
            }
        } else if (ly->kind[i] == 1) {
            for (uint64_t k = 0; k < e - a; k++)
                o[k] = 1.0f;
        } else if (ly->kind[i] == 2 || ly->kind[i] == 4) {
            memset(o, 0, (e - a) * sizeof *o);
        } else if (ly->kind[i] == 3) {
            /* PEFT: kaiming_uniform_(a = sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)) */
            uint64_t key = mix(l->lora_seed ^ mix(((uint64_t)ly->block << 8) |
                                                  (uint64_t)ly->pidx[i]));
            double bound = 1.0 / sqrt((double)ly->fan_in[i]);
            for (uint64_t k = 0; k < e - a; k++) {
                uint64_t h = mix(key + (a - ts) + k);
                o[k] = (float)((2.0 * ((double)(h >> 11) * 0x1.0p-53) - 1.0) * bound);
            }
        } else {
            /* keyed by the model's block, tensor and element: the same
             * values however the block is cut into parts */
            uint64_t key = mix(l->seed ^ mix(((uint64_t)ly->block << 8) |
                                             (uint64_t)ly->pidx[i]));
            normal_range(key, l->init_std, a - ts + ly->src_off[i], e - a, o);
        }
    }
    return np ? read_pieces(l, rp, np) : 0;
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
    mc.attention = l->attention;
    int rc = zn_model_create(&l->m, d, &l->d, &mc);
    if (rc)
        return rc;
    l->dev = d;
    if (l->d.tie_embeddings && l->d.lora.r == 0 &&
        (rc = zn_dev_alloc(d, (size_t)(l->d.vocab * l->d.hidden) * 4, "tied lm_head gradient",
                           (void **)&l->tied_grad))) {
        zn_model_destroy(l->m);
        l->m = NULL;
        return rc;
    }
    l->esz = zn_dtype_size(dt);
    l->tm.act_bytes = (size_t)zn_model_act_bytes(l->m);
    return 0;
}

/* What ll_prepare allocates on the device, for the plan: the model's
 * workspace and, tied, the lm_head gradient (each rounded as the arena
 * rounds). */
static int ll_plan_prepare(void *ctx, zn_dtype dt, uint64_t *device_bytes, size_t *act_bytes)
{
    zn_train_llama *l = ctx;
    zn_model_config mc = zn_model_config_default(NULL);
    mc.dtype = dt;
    mc.max_batch = l->batch;
    mc.max_seq = l->seq;
    mc.checkpoint = 1;
    mc.attention = l->attention;
    uint64_t ws = zn_model_workspace_bytes(&l->d, &mc);
    if (!ws) {
        int rc = zn_model_config_check(&l->d, &mc); /* names what is wrong */
        return rc ? rc : zn_set_error(ZN_ECONFIG, "model: no workspace for these dims and batch");
    }
    uint64_t a = ZN_DEV_ALIGN;
    *device_bytes = (ws + a - 1) / a * a;
    if (l->d.tie_embeddings && l->d.lora.r == 0)
        *device_bytes += ((uint64_t)(l->d.vocab * l->d.hidden) * 4 + a - 1) / a * a;
    *act_bytes = (size_t)(l->batch * l->seq * l->d.hidden) * zn_dtype_size(dt);
    return 0;
}

static void ll_release(void *ctx, zn_dev *d)
{
    zn_train_llama *l = ctx;
    zn_dev_free(d, l->tied_grad);
    l->tied_grad = NULL;
    zn_model_destroy(l->m);
    l->m = NULL;
}

static int ll_set_batch(void *ctx, zn_stream *s, const int32_t *ids, const int32_t *targets,
                        const int32_t *pos, int64_t batch, int64_t seq, float loss_scale)
{
    zn_train_llama *l = ctx;
    int rc = zn_model_set_batch(l->m, s, batch, seq, ids, targets, pos);
    if (rc)
        return rc;
    zn_model_set_loss_scale(l->m, loss_scale);
    return 0;
}

/* The LoRA dropout key of one micro-batch: a stream of lora.seed (apart
 * from the init's) and the micro-batch's index. The model derives each
 * layer's and target's stream from it (lora_key in model.c). */
static void ll_set_dropout(void *ctx, int training, uint64_t micro_index)
{
    zn_train_llama *l = ctx;
    uint64_t k = zn_mix64(l->lora_seed ^ 0x6C6F72612D64726Full); /* "lora-dro" */
    zn_model_set_dropout(l->m, training, zn_mix64(k ^ zn_mix64(micro_index + 1)));
}

static int ll_read_loss(void *ctx, zn_stream *s, float *loss)
{
    zn_train_llama *l = ctx;
    return zn_model_read_loss(l->m, s, loss);
}

static int ll_read_aux_loss(void *ctx, double *weighted, double *aux)
{
    zn_train_llama *l = ctx;
    float a = 0;
    int rc = zn_model_aux_loss(l->m, &a);
    if (rc)
        return rc;
    *aux = a;
    *weighted = l->d.router_aux_coef * (double)a;
    return 0;
}

/* The block calls' tensor pointers: its own tensors in its flat buffer; a
 * tied head's lm_head is the resident embedding (params) or the tied
 * gradient buffer (grads). */
static void views(const zn_train_llama *l, int b, void *base, size_t esz, void **out, int grads)
{
    const block_layout *ly = &l->lay[b];
    /* gradients cover only the trainable tail [frozen, n): a frozen
     * tensor's is NULL (never formed) */
    uint64_t fz = grads ? l->block_frozen[b] : 0;
    out[0] = out[1] = NULL; /* a head part past the first has no norm */
    for (int i = 0; i < ly->n; i++)
        out[ly->pidx[i]] = !base || ly->off[i] < fz ? NULL : (char *)base + (ly->off[i] - fz) * esz;
    if (ly->tied)  /* the tied head: lm_head is the embedding's parts (ll_forward) */
        out[ly->n_all - 1] = NULL;
}

static void ll_bind_block0(void *ctx, int b, void *dev_params)
{
    zn_train_llama *l = ctx;
    if (b >= 0 && b < l->nb && l->lay[b].block == 0 && l->lay[b].part < l->n_embed)
        l->embed[l->lay[b].part] = dev_params;
}

static int ll_forward(void *ctx, zn_stream *s, int b, void *params, const void *in, void *out)
{
    zn_train_llama *l = ctx;
    void *p[MAX_TENSORS];
    const block_layout *ly = &l->lay[b];
    views(l, b, params, l->esz, p, 0);
    if (ly->block == 0)
        return zn_model_embed_fwd_part(l->m, s, ly->part, p[0], out);
    if (ly->block == l->d.n_layers + 1 && ly->tied) {
        /* the tied head reads the resident embedding part by part */
        int rc = 0;
        for (int k = 0; k < l->n_embed && !rc; k++)
            rc = zn_model_head_fwd_part(l->m, s, k, k ? NULL : p[0], l->embed[k], in);
        return rc;
    }
    if (ly->block == l->d.n_layers + 1)
        return zn_model_head_fwd_part(l->m, s, ly->part, p[0], p[1], in);
    return zn_model_layer_fwd(l->m, s, ly->block - 1, p, in, out, NULL);
}

static int ll_backward(void *ctx, zn_stream *s, int b, void *params, const void *in,
                       const void *dout, void *din, float *dparams)
{
    zn_train_llama *l = ctx;
    void *p[MAX_TENSORS], *g[MAX_TENSORS];
    views(l, b, params, l->esz, p, 0);
    views(l, b, dparams, 4, g, 1);
    int rc;
    const block_layout *ly = &l->lay[b];
    if (ly->block == 0) {
        if ((rc = zn_model_embed_bwd_part(l->m, s, ly->part, dout, g[0])))
            return rc;
        /* tied: the head's lm_head gradient of this micro-batch joins the
         * embedding's, the part's rows of it (the head's backward ran first) */
        return l->tied_grad && g[0]
                   ? zn_dev_add_inplace(l->dev, s, g[0], ZN_DTYPE_F32,
                                        l->tied_grad + ly->row0 * l->d.hidden, ZN_DTYPE_F32,
                                        ly->rows * l->d.hidden)
                   : 0;
    }
    if (ly->block == l->d.n_layers + 1) {
        if (l->tied_grad &&
            (rc = zn_dev_memset(l->dev, s, l->tied_grad, 0,
                                (size_t)(l->d.vocab * l->d.hidden) * 4)))
            return rc;
        if (ly->tied) {
            /* the embedding's parts last to first; their lm_head gradients
             * into the tied buffer, which their own backward adds */
            rc = 0;
            for (int k = l->n_embed - 1; k >= 0 && !rc; k--) {
                const block_layout *ek = &l->lay[k];
                rc = zn_model_head_bwd_part(l->m, s, k, k ? NULL : p[0], l->embed[k], in, din,
                                            k ? NULL : g[0],
                                            l->tied_grad ? l->tied_grad + ek->row0 * l->d.hidden
                                                         : NULL);
            }
            return rc;
        }
        return zn_model_head_bwd_part(l->m, s, ly->part, p[0], p[1], in, din, g[0], g[1]);
    }
    return zn_model_layer_bwd(l->m, s, ly->block - 1, p, in, NULL, dout, din,
                              (float *const *)g);
}

int zn_train_llama_create(zn_train_llama **out, const zn_model_dims *dims, int64_t micro_batch,
                          int64_t seq, double init_std, uint64_t seed)
{
    *out = NULL;
    int rc = zn_model_dims_validate(dims);
    if (!rc)
        rc = zn_model_check_window(dims, seq);
    if (rc)
        return rc;
    zn_train_llama *l = calloc(1, sizeof *l);
    if (!l)
        return zn_set_error(-ENOMEM, "out of memory");
    l->d = *dims;
    l->batch = micro_batch;
    l->seq = seq;
    l->init_std = init_std > 0 ? init_std : 0.02;
    l->seed = seed;
    l->nb = zn_model_num_parts(dims);
    l->block_params = calloc((size_t)l->nb, sizeof *l->block_params);
    l->block_frozen = calloc((size_t)l->nb, sizeof *l->block_frozen);
    l->joins = calloc((size_t)l->nb, 1);
    l->sparse_row0 = calloc((size_t)l->nb, sizeof *l->sparse_row0);
    l->lay = calloc((size_t)l->nb, sizeof *l->lay);
    if (!l->block_params || !l->block_frozen || !l->joins || !l->sparse_row0 || !l->lay) {
        zn_train_llama_destroy(l);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    for (int b = 0; b < l->nb; b++) {
        block_layout *ly = &l->lay[b];
        zn_model_part_info pt;
        if ((rc = zn_model_part(dims, b, &pt))) {
            zn_train_llama_destroy(l);
            return rc;
        }
        ly->block = pt.block;
        ly->part = pt.part;
        ly->row0 = pt.row0;
        ly->rows = pt.rows;
        l->joins[b] = pt.part > 0;
        /* the embedding's gradient touches only its tokens' rows, unless the
         * head adds the tied lm_head's (dense) into it */
        l->sparse_row0[b] = pt.block == 0 && !dims->tie_embeddings ? pt.row0 : -1;
        ly->n_all = zn_model_block_nparams(dims, pt.block);
        if (ly->n_all > MAX_TENSORS) {
            zn_train_llama_destroy(l);
            return zn_set_error(ZN_EUNSUPPORTED, "block %d has %d tensors: the trainer takes "
                                "up to %d (512 experts a layer)", pt.block, ly->n_all,
                                MAX_TENSORS);
        }
        /* the block's own tensors, cut to the part's range of its flat order */
        uint64_t toff = 0, end = pt.first + pt.n;
        ly->n = 0;
        for (int i = 0; i < ly->n_all; i++) {
            zn_param_info pi;
            if ((rc = zn_model_block_param(dims, pt.block, i, &pi))) {
                zn_train_llama_destroy(l);
                return rc;
            }
            if (pi.owner_block >= 0) {
                /* a view of another block's tensor: only the tied lm_head,
                 * the head's last tensor, a view of block 0's table */
                if (pi.owner_block != 0 || i != ly->n_all - 1 ||
                    pt.block != zn_model_num_blocks(dims) - 1 || pt.nparts != 1) {
                    zn_train_llama_destroy(l);
                    return zn_set_error(ZN_EINTERNAL, "block %d tensor %d: unexpected tie",
                                        pt.block, i);
                }
                ly->tied = 1;
                continue;
            }
            uint64_t ts = toff, te = toff + (uint64_t)pi.numel;
            toff = te;
            uint64_t a = ts > pt.first ? ts : pt.first, e = te < end ? te : end;
            if (a >= e)
                continue; /* in another part */
            size_t nl = strlen(pi.name);
            int k = ly->n++;
            ly->pidx[k] = i;
            ly->numel[k] = (uint64_t)pi.numel;
            ly->off[k] = a - pt.first;
            ly->src_off[k] = a - ts;
            ly->kind[k] = pi.lora == 1 ? 3 : pi.lora == 2 ? 4
                          : strstr(pi.name, "norm.weight") ? 1
                          : (nl > 5 && !strcmp(pi.name + nl - 5, ".bias")) ? 2 : 0;
            ly->fan_in[k] = pi.shape[1];
        }
        l->block_params[b] = pt.n;
        /* LoRA: the decoder's own tensors are frozen (the whole of an
         * embedding or head part); they come first in a layer's order */
        l->block_frozen[b] = pt.nparts > 1 ? (dims->lora.r > 0 ? pt.n : 0)
                                           : zn_model_block_frozen_count(dims, pt.block);
        if (pt.nparts == 1 && pt.n != zn_model_block_param_count(dims, pt.block)) {
            zn_train_llama_destroy(l);
            return zn_set_error(ZN_EINTERNAL, "block %d: its part holds %llu elements, the "
                                "block count is %llu", pt.block, (unsigned long long)pt.n,
                                (unsigned long long)zn_model_block_param_count(dims, pt.block));
        }
    }
    zn_train_model *m = &l->tm;
    m->ctx = l;
    m->n_blocks = l->nb;
    m->block_params = l->block_params;
    m->block_frozen = dims->lora.r > 0 ? l->block_frozen : NULL;
    m->block_joins = l->joins;
    m->block_sparse_row0 = l->sparse_row0;
    m->tensor_parts = ll_tensor_parts;
    m->row_width = dims->hidden;
    m->act_bytes = (size_t)(micro_batch * seq * dims->hidden) * 4;
    m->flops_per_token = zn_model_flops(dims, -1, 1, seq) / (double)seq;
    m->prepare = ll_prepare;
    m->release = ll_release;
    m->init_params = ll_init;
    m->set_batch = ll_set_batch;
    m->read_loss = ll_read_loss;
    m->read_aux_loss = dims->router_logits ? ll_read_aux_loss : NULL;
    m->set_dropout = ll_set_dropout;
    m->forward = ll_forward;
    m->backward = ll_backward;
    m->plan_prepare = ll_plan_prepare;
    m->keep_block0 = dims->tie_embeddings != 0;
    l->n_embed = zn_model_block_parts(dims, 0);
    if (!(l->embed = calloc((size_t)l->n_embed, sizeof *l->embed))) {
        zn_train_llama_destroy(l);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    m->bind_block0 = ll_bind_block0;
    *out = l;
    return 0;
}

void zn_train_llama_set_attention(zn_train_llama *l, int attention)
{
    l->attention = attention;
}

const zn_train_model *zn_train_llama_model(zn_train_llama *l)
{
    return &l->tm;
}

void zn_train_llama_destroy(zn_train_llama *l)
{
    if (!l)
        return;
    zn_st_close(l->st);
    zn_st_close(l->ast);
    free(l->block_params);
    free(l->block_frozen);
    free(l->joins);
    free(l->embed);
    free(l->sparse_row0);
    free(l->lay);
    free(l);
}

uint64_t zn_train_llama_bytes_read(const zn_train_llama *l, uint64_t *total)
{
    if (total)
        *total = l ? l->bytes_total : 0;
    return l ? atomic_load(&l->bytes_read) : 0;
}

/* Tensors a checkpoint may hold that the model does not use. */
static int ignorable(const zn_model_dims *d, const char *name)
{
    if (strstr(name, "rotary_emb.inv_freq"))
        return 1;
    return d->tie_embeddings && !strcmp(name, "lm_head.weight");
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t o = 0;
    buf[0] = '\0';
    o += (size_t)snprintf(buf, n, "[");
    for (int k = 0; k < ndim && o < n; k++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", k ? ", " : "", (long long)shape[k]);
    if (o < n)
        snprintf(buf + o, n - o, "]");
}

int zn_train_llama_load(zn_train_llama *l, const char *path, char *summary, size_t summary_len)
{
    zn_st *st = NULL;
    int rc = zn_st_open(&st, path);
    if (rc)
        return zn_error_prefix(rc, "model weights");
    size_t nt = zn_st_count(st), used = 0;
    uint64_t total = 0;
    unsigned char *seen = calloc(nt ? nt : 1, 1);
    int dtypes = 0;  /* bit per zn_st_dtype among the tensors used */
    if (!seen) {
        zn_st_close(st);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    /* the sources are installed only once every tensor checked out */
    const zn_st_tensor **tab = calloc((size_t)l->nb * MAX_TENSORS, sizeof *tab);
    if (!tab) {
        free(seen);
        zn_st_close(st);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    for (int b = 0; b < l->nb && !rc; b++) {
        for (int i = 0; i < l->lay[b].n && !rc; i++) {
            zn_param_info pi;
            if ((rc = zn_model_block_param(&l->d, l->lay[b].block, l->lay[b].pidx[i], &pi)))
                break;
            if (pi.lora)
                continue; /* adapters: zn_train_llama_load_adapter, or the init */
            const zn_st_tensor *t = zn_st_find(st, pi.name);
            if (!t) {
                rc = zn_set_error(ZN_ECONFIG, "model weights %s: tensor '%s' is missing "
                                  "(config.json and the weights disagree?)", path, pi.name);
                break;
            }
            int same = t->ndim == pi.ndim;
            for (int k = 0; same && k < pi.ndim; k++)
                same = t->shape[k] == pi.shape[k];
            if (!same) {
                char want[64], have[128];
                shape_str(want, sizeof want, pi.ndim, pi.shape);
                shape_str(have, sizeof have, t->ndim, t->shape);
                rc = zn_set_error(ZN_ECONFIG, "model weights %s: tensor '%s' has shape %s, "
                                  "config.json needs %s", zn_st_shard_path(st, t->shard),
                                  pi.name, have, want);
                break;
            }
            if (t->dtype != ZN_ST_F32 && t->dtype != ZN_ST_BF16 && t->dtype != ZN_ST_F16) {
                rc = zn_set_error(ZN_EUNSUPPORTED, "model weights %s: tensor '%s' is %s; zinc "
                                  "trains from F32, BF16 or F16 weights (a quantized "
                                  "checkpoint needs dequantizing first)",
                                  zn_st_shard_path(st, t->shard), pi.name,
                                  zn_st_dtype_name(t->dtype));
                break;
            }
            size_t idx = (size_t)(t - zn_st_tensor_at(st, 0));
            if (!seen[idx]) {
                seen[idx] = 1;
                used++;
                total += t->nbytes; /* once, however many parts read it */
            }
            dtypes |= 1 << t->dtype;
            tab[(size_t)b * MAX_TENSORS + (size_t)i] = t;
        }
    }
    for (size_t k = 0; k < nt && !rc; k++) {
        const zn_st_tensor *t = zn_st_tensor_at(st, k);
        if (seen[k] || ignorable(&l->d, t->name))
            continue;
        rc = zn_set_error(ZN_ECONFIG, "model weights %s: tensor '%s' is not a parameter of "
                          "this %s model (config.json and the weights disagree?)",
                          zn_st_shard_path(st, t->shard), t->name,
                          zn_model_arch_name(l->d.arch));
    }
    free(seen);
    if (rc) {
        free(tab);
        zn_st_close(st);
        return rc;
    }
    for (int b = 0; b < l->nb; b++)
        for (int i = 0; i < l->lay[b].n; i++)
            if (l->lay[b].kind[i] < 3)
                l->lay[b].src[i] = tab[(size_t)b * MAX_TENSORS + (size_t)i];
    free(tab);
    zn_st_close(l->st);
    l->st = st;
    l->bytes_total = total;
    atomic_store(&l->bytes_read, 0);
    if (summary && summary_len) {
        char dts[64] = "";
        size_t o = 0;
        for (int t = 0; t < ZN_ST_NDTYPES; t++)
            if (dtypes & (1 << t))
                o += (size_t)snprintf(dts + o, sizeof dts - o, "%s%s", o ? "+" : "",
                                      zn_st_dtype_name((zn_st_dtype)t));
        for (char *c = dts; *c; c++)
            *c = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
        snprintf(summary, summary_len, "%zu tensors from %s, %s", used, path, dts);
    }
    return 0;
}

void zn_train_llama_set_lora_seed(zn_train_llama *l, uint64_t seed)
{
    l->lora_seed = seed;
}

int zn_train_llama_load_adapter(zn_train_llama *l, const char *dir, char *summary,
                                size_t summary_len)
{
    if (l->d.lora.r <= 0)
        return zn_set_error(ZN_ECONFIG, "lora.adapter %s: the model has no LoRA adapters", dir);
    char path[4096];
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    else
        snprintf(path, sizeof path, "%s", dir);
    zn_st *st = NULL;
    int rc = zn_st_open(&st, path);
    if (rc)
        return zn_error_prefix(rc, "lora.adapter");
    size_t nt = zn_st_count(st), used = 0;
    unsigned char *seen = calloc(nt ? nt : 1, 1);
    if (!seen) {
        zn_st_close(st);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    for (int b = 0; b < l->nb && !rc; b++) {
        for (int i = 0; i < l->lay[b].n && !rc; i++) {
            if (l->lay[b].kind[i] < 3)
                continue;
            zn_param_info pi;
            if ((rc = zn_model_block_param(&l->d, l->lay[b].block, l->lay[b].pidx[i], &pi)))
                break;
            char name[160];
            snprintf(name, sizeof name, "base_model.model.%s", pi.name);
            const zn_st_tensor *t = zn_st_find(st, name);
            if (!t) {
                rc = zn_set_error(ZN_ECONFIG, "lora.adapter %s: tensor '%s' is missing (the "
                                  "adapter's target_modules or r differ from the lora "
                                  "section?)", path, name);
                break;
            }
            if (t->ndim != 2 || t->shape[0] != pi.shape[0] || t->shape[1] != pi.shape[1]) {
                char want[64], have[128];
                shape_str(want, sizeof want, pi.ndim, pi.shape);
                shape_str(have, sizeof have, t->ndim, t->shape);
                rc = zn_set_error(ZN_ECONFIG, "lora.adapter %s: tensor '%s' has shape %s, "
                                  "this model and r need %s", path, name, have, want);
                break;
            }
            if (t->dtype != ZN_ST_F32 && t->dtype != ZN_ST_BF16 && t->dtype != ZN_ST_F16) {
                rc = zn_set_error(ZN_EUNSUPPORTED, "lora.adapter %s: tensor '%s' is %s, not "
                                  "F32, BF16 or F16", path, name, zn_st_dtype_name(t->dtype));
                break;
            }
            size_t idx = (size_t)(t - zn_st_tensor_at(st, 0));
            if (!seen[idx]) {
                seen[idx] = 1;
                used++;
            }
        }
    }
    for (size_t k = 0; k < nt && !rc; k++)
        if (!seen[k])
            rc = zn_set_error(ZN_EUNSUPPORTED, "lora.adapter %s: tensor '%s' is not an adapter "
                              "zinc trains (only lora_A/lora_B of the decoder layers' "
                              "projections; no bias, modules_to_save or DoRA)", path,
                              zn_st_tensor_at(st, k)->name);
    free(seen);
    if (rc) {
        zn_st_close(st);
        return rc;
    }
    for (int b = 0; b < l->nb; b++)
        for (int i = 0; i < l->lay[b].n; i++) {
            if (l->lay[b].kind[i] < 3)
                continue;
            zn_param_info pi;
            zn_model_block_param(&l->d, l->lay[b].block, l->lay[b].pidx[i], &pi);
            char name[160];
            snprintf(name, sizeof name, "base_model.model.%s", pi.name);
            l->lay[b].src[i] = zn_st_find(st, name);
        }
    zn_st_close(l->ast);
    l->ast = st;
    if (summary && summary_len)
        snprintf(summary, summary_len, "%zu adapter tensors from %s", used, dir);
    return 0;
}
