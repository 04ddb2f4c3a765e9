/* A small block model for the trainer's tests, written against device.h so
 * that its numerics are the device layer's: block 0 an embedding, blocks
 * 1..n a residual SwiGLU (x + silu(x Wg^T) * (x Wu^T)), the last an output
 * projection with cross-entropy. Small enough to train 20 steps in a
 * blink, with blocks of two sizes so that rings and pieces are exercised. */
#ifndef TEST_TRAIN_TOY_H
#define TEST_TRAIN_TOY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/train.h"

typedef struct {
    int64_t V, H, n_mid, max_n;
    uint64_t seed;
    uint64_t init_calls;  /* init_params calls (tests of the chunked init) */
    uint64_t block_params[64];
    zn_dev *dev;
    zn_dtype dt;
    /* device scratch */
    void *base;
    float *gate, *up, *h, *dg, *du, *logits, *run_max, *run_sum, *tgt, *lse, *row_loss, *loss;
    int32_t *ids, *targets;
    int64_t N;
    float loss_scale;
    /* tests of skipped steps: the poison_at-th backward of the embedding
     * (counting from 1; 0: never) leaves a NaN in its gradient */
    int64_t poison_at, emb_bwd_calls;
    zn_train_model model;
} toy_model;

static uint64_t toy_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int toy_init(void *ctx, int block, uint64_t first, uint64_t n, float *out)
{
    toy_model *t = ctx;
    double a = block == 0 ? 1.0 : 1.0 / sqrt((double)t->H);
    if (first + n > t->block_params[block])
        return zn_set_error(ZN_EARG, "toy_init: block %d range [%llu, +%llu) outside it", block,
                            (unsigned long long)first, (unsigned long long)n);
    t->init_calls++;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t i = first + j;
        uint64_t r = toy_mix(t->seed * 1000003u + (uint64_t)block * 0x10000000ull + i);
        out[j] = (float)(a * ((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0));
    }
    return 0;
}

static int toy_prepare(void *ctx, zn_dev *d, zn_stream *s, zn_dtype dt)
{
    toy_model *t = ctx;
    t->dev = d;
    t->dt = dt;
    int64_t N = t->max_n, H = t->H, V = t->V;
    size_t fl = (size_t)(5 * N * H + N * V + 6 * N + 64 + 2 * N);
    int rc = zn_dev_alloc(d, fl * 4, "toy scratch", &t->base);
    if (rc)
        return rc;
    float *p = t->base;
    t->gate = p; p += N * H;
    t->up = p; p += N * H;
    t->h = p; p += N * H;
    t->dg = p; p += N * H;
    t->du = p; p += N * H;
    t->logits = p; p += N * V;
    t->run_max = p; p += N;
    t->run_sum = p; p += N;
    t->tgt = p; p += N;
    t->lse = p; p += N;
    t->row_loss = p; p += N;
    t->loss = p; p += 64 + N;
    t->ids = (int32_t *)p; p += N;
    t->targets = (int32_t *)p;
    (void)s;
    return 0;
}

static void toy_release(void *ctx, zn_dev *d)
{
    toy_model *t = ctx;
    zn_dev_free(d, t->base);
    t->base = NULL;
}

static int toy_set_batch(void *ctx, zn_stream *s, const int32_t *ids, const int32_t *targets,
                         const int32_t *pos, int64_t batch, int64_t seq, float loss_scale)
{
    (void)pos; /* the toy has no attention */
    toy_model *t = ctx;
    t->N = batch * seq;
    t->loss_scale = loss_scale;
    int rc = zn_dev_copy_h2d(t->dev, s, t->ids, ids, (size_t)t->N * 4);
    if (!rc)
        rc = zn_dev_copy_h2d(t->dev, s, t->targets, targets, (size_t)t->N * 4);
    if (!rc)
        rc = zn_dev_stream_sync(t->dev, s);
    return rc;
}

static int toy_read_loss(void *ctx, zn_stream *s, float *loss)
{
    toy_model *t = ctx;
    int rc = zn_dev_copy_d2h(t->dev, s, loss, t->loss, 4);
    return rc ? rc : zn_dev_stream_sync(t->dev, s);
}

#define TOY_TRY(x)          \
    do {                    \
        int rc_ = (x);      \
        if (rc_)            \
            return rc_;     \
    } while (0)

static int toy_head_logits(toy_model *t, zn_stream *s, const void *W, const void *x)
{
    zn_dev *d = t->dev;
    TOY_TRY(zn_dev_gemm(d, s, ZN_NOTRANS, ZN_TRANS, t->N, t->V, t->H, 1.0f, x, t->dt, t->H, W,
                        t->dt, t->H, 0.0f, t->logits, ZN_DTYPE_F32, t->V));
    TOY_TRY(zn_dev_xent_fwd_chunk(d, s, t->logits, ZN_DTYPE_F32, t->N, t->V, t->V, 0,
                                  t->targets, t->run_max, t->run_sum, t->tgt, 1));
    return zn_dev_xent_finish(d, s, t->run_max, t->run_sum, t->tgt, t->targets, t->N, t->lse,
                              t->row_loss);
}

static int toy_forward(void *ctx, zn_stream *s, int b, void *params, const void *in, void *out)
{
    toy_model *t = ctx;
    zn_dev *d = t->dev;
    int64_t N = t->N, H = t->H;
    if (b == 0)
        return zn_dev_embedding_fwd(d, s, t->ids, N, params, t->dt, t->V, H, out, t->dt);
    if (b == t->n_mid + 1) {
        TOY_TRY(toy_head_logits(t, s, params, in));
        TOY_TRY(zn_dev_sum(d, s, t->row_loss, ZN_DTYPE_F32, N, t->loss, 0));
        return zn_dev_scale(d, s, t->loss, ZN_DTYPE_F32, 1, t->loss_scale);
    }
    const char *Wg = params, *Wu = (const char *)params + (size_t)(H * H) * zn_dtype_size(t->dt);
    TOY_TRY(zn_dev_gemm(d, s, ZN_NOTRANS, ZN_TRANS, N, H, H, 1.0f, in, t->dt, H, Wg, t->dt, H,
                        0.0f, t->gate, ZN_DTYPE_F32, H));
    TOY_TRY(zn_dev_gemm(d, s, ZN_NOTRANS, ZN_TRANS, N, H, H, 1.0f, in, t->dt, H, Wu, t->dt, H,
                        0.0f, t->up, ZN_DTYPE_F32, H));
    TOY_TRY(zn_dev_swiglu_fwd(d, s, t->gate, t->up, t->h, ZN_DTYPE_F32, N * H));
    return zn_dev_add(d, s, in, t->h, out, ZN_DTYPE_F32, N * H);
}

static int toy_backward(void *ctx, zn_stream *s, int b, void *params, const void *in,
                        const void *dout, void *din, float *dparams)
{
    toy_model *t = ctx;
    zn_dev *d = t->dev;
    int64_t N = t->N, H = t->H, V = t->V;
    if (b == 0) {
        TOY_TRY(zn_dev_embedding_bwd(d, s, t->ids, N, dout, t->dt, V, H, dparams));
        if (++t->emb_bwd_calls == t->poison_at)
            return zn_dev_scale(d, s, dparams, ZN_DTYPE_F32, 1, NAN);
        return 0;
    }
    if (b == t->n_mid + 1) {
        TOY_TRY(toy_head_logits(t, s, params, in));
        TOY_TRY(zn_dev_xent_bwd_chunk(d, s, t->logits, ZN_DTYPE_F32, N, V, V, 0, t->targets,
                                      t->lse, t->loss_scale, 0.0f, t->logits, ZN_DTYPE_F32,
                                      V));
        /* dW[V][H] += dlogits^T x ; dx = dlogits W */
        TOY_TRY(zn_dev_gemm(d, s, ZN_TRANS, ZN_NOTRANS, V, H, N, 1.0f, t->logits, ZN_DTYPE_F32,
                            V, in, t->dt, H, 1.0f, dparams, ZN_DTYPE_F32, H));
        return zn_dev_gemm(d, s, ZN_NOTRANS, ZN_NOTRANS, N, H, V, 1.0f, t->logits, ZN_DTYPE_F32,
                           V, params, t->dt, H, 0.0f, din, t->dt, H);
    }
    const char *Wg = params, *Wu = (const char *)params + (size_t)(H * H) * zn_dtype_size(t->dt);
    TOY_TRY(zn_dev_gemm(d, s, ZN_NOTRANS, ZN_TRANS, N, H, H, 1.0f, in, t->dt, H, Wg, t->dt, H,
                        0.0f, t->gate, ZN_DTYPE_F32, H));
    TOY_TRY(zn_dev_gemm(d, s, ZN_NOTRANS, ZN_TRANS, N, H, H, 1.0f, in, t->dt, H, Wu, t->dt, H,
                        0.0f, t->up, ZN_DTYPE_F32, H));
    TOY_TRY(zn_dev_swiglu_bwd(d, s, t->gate, t->up, dout, t->dg, t->du, ZN_DTYPE_F32, N * H));
    TOY_TRY(zn_dev_gemm(d, s, ZN_TRANS, ZN_NOTRANS, H, H, N, 1.0f, t->dg, ZN_DTYPE_F32, H, in,
                        t->dt, H, 1.0f, dparams, ZN_DTYPE_F32, H));
    TOY_TRY(zn_dev_gemm(d, s, ZN_TRANS, ZN_NOTRANS, H, H, N, 1.0f, t->du, ZN_DTYPE_F32, H, in,
                        t->dt, H, 1.0f, dparams + H * H, ZN_DTYPE_F32, H));
    /* din = dout + dg Wg + du Wu */
    TOY_TRY(zn_dev_copy_d2d(d, s, din, dout, (size_t)(N * H) * 4));
    TOY_TRY(zn_dev_gemm(d, s, ZN_NOTRANS, ZN_NOTRANS, N, H, H, 1.0f, t->dg, ZN_DTYPE_F32, H, Wg,
                        t->dt, H, 1.0f, din, t->dt, H));
    return zn_dev_gemm(d, s, ZN_NOTRANS, ZN_NOTRANS, N, H, H, 1.0f, t->du, ZN_DTYPE_F32, H, Wu,
                       t->dt, H, 1.0f, din, t->dt, H);
}

/* The toy's tensors as 8-bit moments see them: each residual block's Wg
 * starts with H elements of a tensor of their own (as a decoder layer's
 * norm weight: fewer than bitsandbytes' 4096, so its moments stay fp32 in
 * 8-bit runs); every other block is one tensor. */
static int toy_tensor_parts(void *ctx, int block, uint64_t *off, uint64_t *numel, int cap)
{
    const toy_model *t = ctx;
    uint64_t H = (uint64_t)t->H, n = t->block_params[block];
    if (block == 0 || block == t->n_mid + 1 || cap < 2) {
        off[0] = 0;
        numel[0] = n;
        return 1;
    }
    off[0] = 0, numel[0] = H;
    off[1] = H, numel[1] = n - H;
    return 2;
}

/* A toy with V tokens, hidden H, n_mid residual blocks, up to max_n tokens
 * per micro-batch. fp32 only (the host backend). */
static void toy_setup(toy_model *t, int64_t V, int64_t H, int64_t n_mid, int64_t max_n,
                      uint64_t seed)
{
    memset(t, 0, sizeof *t);
    t->V = V;
    t->H = H;
    t->n_mid = n_mid;
    t->max_n = max_n;
    t->seed = seed;
    t->block_params[0] = (uint64_t)(V * H);
    for (int64_t i = 1; i <= n_mid; i++)
        t->block_params[i] = (uint64_t)(2 * H * H);
    t->block_params[n_mid + 1] = (uint64_t)(V * H);
    zn_train_model *m = &t->model;
    m->ctx = t;
    m->n_blocks = (int)n_mid + 2;
    m->block_params = t->block_params;
    m->act_bytes = (size_t)(max_n * H) * 4;
    m->flops_per_token = 6.0 * (double)(2 * V * H + n_mid * 2 * H * H);
    m->prepare = toy_prepare;
    m->release = toy_release;
    m->init_params = toy_init;
    m->set_batch = toy_set_batch;
    m->read_loss = toy_read_loss;
    m->forward = toy_forward;
    m->backward = toy_backward;
    m->tensor_parts = toy_tensor_parts;
}

/* The planner's view of the toy (shaped like a tiny decoder). */
static void toy_plan_input(const toy_model *t, int64_t micro_batch, int64_t seq,
                           zn_plan_input *in)
{
    memset(in, 0, sizeof *in);
    in->n_blocks = (int)t->n_mid + 2;
    in->block_params = t->block_params;
    in->n_layers = t->n_mid;
    in->hidden = t->H;
    in->n_heads = 1;
    in->n_kv_heads = 1;
    in->head_dim = t->H;
    in->intermediate = t->H;
    in->vocab = t->V;
    in->micro_batch = micro_batch;
    in->seq_len = seq;
    in->param_bytes = 4;
    in->world_size = 1;
    in->activation_checkpointing = true;
}

#endif
