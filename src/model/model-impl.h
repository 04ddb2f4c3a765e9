/* Private declarations shared by the files of src/model/: the model object
 * (model.c sets it up, model_layer.c and model_head.c run it), the
 * safetensors reader's state, the generator's. */
#ifndef ZN_MODEL_IMPL_H
#define ZN_MODEL_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/generate.h"
#include "zinc/model.h"
#include "zinc/nvme.h"
#include "zinc/safetensors.h"

/* The scalar fp conversions (zn_bf16_round, zn_f16_widen, ...) are
 * zinc/util.h's, the arrays' zn_convert (zinc/optim.h). */

/* ---- config.json (hf_config.c parses its top level and reads typed keys;
 * hf_rope.c, hf_window.c, hf_moe.c parse their families' keys into d) -------- */

struct json_t;
typedef struct {
    const char *name; /* file name for messages */
    struct json_t *root;
} zn_m_cfg;

/* A key of the top level (or of obj, named where + key in messages): absent
 * or null takes def unless required; 0 or ZN_ECONFIG naming the key. The
 * integers must be positive. */
int zn_m_cfg_int(zn_m_cfg *c, const char *key, int required, int64_t def, int64_t *out);
int zn_m_cfg_num(zn_m_cfg *c, struct json_t *obj, const char *where, const char *key,
                 int required, double def, double *out);
int zn_m_cfg_bool(zn_m_cfg *c, const char *key, int def, int *out);
int zn_m_cfg_str(zn_m_cfg *c, const char *key, const char **out); /* NULL when absent */
/* rope_theta and rope_scaling / rope_parameters of the one-table families */
int zn_m_cfg_rope(zn_m_cfg *c, zn_model_dims *d);
/* gemma3_text's and olmo3's per-layer-type RoPE */
int zn_m_cfg_rope_layered(zn_m_cfg *c, zn_model_dims *d);
/* gemma2's, gemma3_text's and olmo3's windows, pattern, scalar, soft-caps
 * (after num_hidden_layers) */
int zn_m_cfg_windowed(zn_m_cfg *c, zn_model_dims *d);
/* qwen3_moe's and mixtral's experts (after intermediate_size) */
int zn_m_cfg_moe(zn_m_cfg *c, zn_model_dims *d);
int zn_m_cfg_mixtral(zn_m_cfg *c, zn_model_dims *d);

/* ---- reading a checkpoint's tensors (state.c) ---------------------------------------
 * Every parameter tensor `which` selects (all, the decoder's own, or the
 * LoRA adapters) of dims d, named prefix + its Hugging Face name in the
 * safetensors at `path`, checked for presence and shape (the message names
 * the tensor, its file and both shapes), converted to dt and handed to
 * put(ctx, block, tensor index, byte offset in the tensor, data, bytes) in
 * bounded pieces. Unused tensors other than ignorable ones are warned of. */
enum { ZN_M_LOAD_ALL, ZN_M_LOAD_BASE, ZN_M_LOAD_ADAPTERS };
typedef int (*zn_m_put_fn)(void *ctx, int block, int i, uint64_t off, const void *h,
                           size_t bytes);
int zn_m_load_tensors(const zn_model_dims *d, zn_dtype dt, const char *path, const char *prefix,
                      int which, zn_m_put_fn put, void *ctx);

/* ---- the model (model.c lays it out; model_layer.c, model_head.c run it) ---------- */

/* Layer parameter slots, in the order of zn_model_block_param. */
enum {
    ZN_M_P_IN_NORM, ZN_M_P_WQ, ZN_M_P_WK, ZN_M_P_WV, ZN_M_P_WO, ZN_M_P_POST_NORM, ZN_M_P_WG,
    ZN_M_P_WU, ZN_M_P_WD, ZN_M_P_BQ, ZN_M_P_BK, ZN_M_P_BV, ZN_M_P_BO, ZN_M_P_QN, ZN_M_P_KN,
    ZN_M_P_WQKV, ZN_M_P_WGU, ZN_M_P_FF_NORM, ZN_M_P_PRE_FF_NORM, ZN_M_P_NSLOTS
};
/* POST_NORM is post_attention_layernorm: the MLP's input norm in the
 * pre-norm families, the attention output's with post-norms (olmo2,
 * gemma2), where FF_NORM is post_feedforward_layernorm and, with both
 * (gemma2), PRE_FF_NORM pre_feedforward_layernorm the MLP's input norm. */
/* With fused projections (dims.fused_proj) WQ, WK, WV are row blocks of
 * WQKV and WG, WU of WGU: zn_m_slot_part says which and where. */

/* Activations of one layer (forward results needed by the backward). */
typedef struct {
    void *h1;      /* [N][H]   rmsnorm(x_in); post-norm: o_proj's output before its norm */
    float *rstd1;  /* [N] */
    void *qkv;     /* [N][qkv_ld] q | k | v, q and k after RoPE */
    void *attn;    /* [N][qd]  attention output before o_proj */
    void *x_mid;   /* [N][H]   x_in + o_proj(attn) */
    void *h2;      /* [N][H]   rmsnorm(x_mid); post-norm: down_proj's output before its norm */
    float *rstd2;  /* [N] */
    void *gate;    /* [N][I] */
    void *up;      /* [N][I] */
    void *act;     /* [N][I]   silu(gate) * up */
    float *lse;    /* fused attention: [B][nh][T] log-sum-exp of each query's scores */
    void *qk_pre;  /* q/k norm: [N][qd + kvd] q | k before their norm (NULL: none) */
    float *qk_rstd;/* q/k norm: [max_n][nh] then [max_n][nkv], each head's rstd */
    /* pre- and post-norms both (gemma2; else NULL): o_proj's and
     * down_proj's outputs before their norms, with their rstds */
    void *o_pre;   /* [N][H] */
    float *rstd3;  /* [N] */
    void *d_pre;   /* [N][H] */
    float *rstd4;  /* [N] */
} zn_m_layer_acts;

/* A (probability, expert) pair of the top-k selection (model_moe.c). */
typedef struct {
    float v;
    int32_t i;
} zn_m_topk_el;

/* The routing of the current mixture-of-experts layer, on the host
 * (model_moe.c): N tokens, E experts, K per token. */
typedef struct {
    void *raw;        /* [N][E] the logits read back (compute type), then their gradient */
    float *p;         /* [N][E] softmax probabilities */
    int32_t *sel;     /* [N][K] the chosen experts, best first */
    float *val;       /* [N][K] their probabilities */
    float *vsum;      /* [N] the sum of those */
    float *wt;        /* [N][K] the weights (renormalized, in the compute type's values) */
    int32_t *slot;    /* [N][K] the routed row of (token, choice) */
    int64_t *off;     /* [E + 1] each expert's first routed row */
    int32_t *idx;     /* [N K] the routed rows' tokens, expert by expert */
    float *w;         /* [N K] their weights */
    float *dw;        /* [N K] their weights' gradients */
    float *dp, *dv;   /* [E], [K] per-token scratch */
    zn_m_topk_el *q;  /* [E] the top-k's working array */
} zn_m_moe_host;

/* The k largest of p[0..n) into sel (their indices, largest first) and
 * val, with ties as torch.topk breaks them on the CPU; q: n scratch. */
void zn_m_topk(const float *p, int64_t n, int64_t k, zn_m_topk_el *q, int32_t *sel, float *val);
int zn_m_moe_fwd(zn_model *m, zn_stream *s, int layer, void *const *params, const void *x,
                 void *y); /* y += moe(x) */
int zn_m_moe_bwd(zn_model *m, zn_stream *s, int layer, void *const *params, float *const *grads,
                 const void *x, const void *dy, float *dx); /* dx = d moe / dx (fp32) */

struct zn_model {
    zn_dev *dev;
    zn_model_dims d;
    zn_model_config cfg;
    zn_dtype dt;
    size_t esz;
    int64_t H, qd, kvd, I, V, nh, nkv, hd, g, qkv_ld;
    int64_t max_n, max_t, chunk;
    int64_t qb;         /* attention query rows per block (attn_rows) */
    int fused;          /* fused attention (zn_dev_flash_attn_*), else GEMMs + softmax */

    void *mem;          /* the one arena block everything below lives in */
    uint64_t mem_bytes;
    int32_t *ids, *targets, *pos; /* pos: each token's position in its document */
    int32_t *kstart;              /* each token's document's first position */
    int32_t *bwd_ids;             /* with a pad id: ids, the pad's as -1 (the embedding's
                                     backward skips them); else NULL: ids */
    int32_t *kwin;                /* a sliding window (dims.sliding_window): each token's
                                     first key, its window's or its document's, the later;
                                     else NULL */
    float *inv_freq;    /* RoPE: [hd / 2] the full-attention layers' (every layer's
                           unless rope_local_theta), then the sliding layers' */
    float *loss;        /* scalar */
    /* head */
    void *hN;
    float *rstdN, *lse, *row_loss, *run_max, *run_sum, *tgt, *logits, *dhN;
    void *dlogits;
    /* layer workspace */
    zn_m_layer_acts w;
    float *SS, *dP;     /* [nh][T][T] fp32 scores; dP (may alias) */
    float *SC;          /* attention soft-capping, GEMM path: [nh][qb][T] the capped
                           scores (the backward's 1 - tanh^2); else NULL */
    void *P, *dS;       /* [nh][T][T] probabilities / score grads (cfg.dtype) */
    float *dh, *dxm32;  /* [N][H] fp32 */
    void *dxm;          /* [N][H] cfg.dtype (aliases dxm32 for f32) */
    void *d_attn;       /* [N][qd] */
    void *dqkv;         /* [N][qkv_ld] */
    float *dkv32;       /* GQA, 16-bit: [T][2 kvd] one sequence's dK | dV summed in fp32 */
    float *fdelta;      /* fused attention backward: [B][nh][T] rowsum(dO * O) */
    void *lu, *ldu;     /* LoRA: [N][r] A x and its gradient (cfg.dtype) */
    void *lxd;          /* LoRA dropout: [N][max in] the dropped input (cfg.dtype) */
    float *ltmp;        /* LoRA dropout: [N][max in] du A before its mask (fp32) */
    float lscale;       /* LoRA scale */
    float woff;         /* every norm's weight offset: 1 for Gemma's (1 + w), else 0 */
    float attn_scale;   /* the scores' scale: head_dim^-1/2, or query_pre_attn_scalar's */
    float attn_scale_full; /* the full-attention layers' (yarn's attention_factor squared
                              times attn_scale); attn_scale where no yarn */
    float attn_cap, final_cap; /* soft-capping of the scores and the logits (0: none) */
    float emb_scale;    /* the embedding's scale (Gemma's sqrt(hidden) in the compute type),
                           else 1 */
    /* mixture of experts (dims.n_experts > 0): the router's logits (then their
     * gradient), the routed rows' tokens and weights, every routed row's
     * gathered input, gate, up, act and output (then d output), the fp32
     * combine, the rows' input gradients, the weights' gradients */
    void *moe_log;      /* [N][E] */
    int32_t *moe_idx;   /* [N K] */
    float *moe_w, *moe_dw; /* [N K] */
    void *moe_xg, *moe_eo; /* [N K][H] */
    void *moe_g, *moe_u, *moe_a; /* [N K][moe_intermediate] */
    float *moe_acc;     /* [N][H] */
    float *moe_dxg;     /* [N K][H] */
    zn_m_moe_host moe;
    /* the load-balancing loss (dims.router_logits): the current batch's
     * top-k assignments and probability sums per expert over the sparse
     * layers' forwards (not the backward's recompute, in_bwd), host */
    double *aux_cnt;    /* [E] */
    float *aux_psum;    /* [E] */
    int64_t aux_rows;
    int in_bwd;
    int drop_on;        /* training with lora.dropout > 0 (zn_model_set_dropout) */
    uint64_t drop_key;

    /* current batch */
    int64_t B, T, N, n_valid;
    int packed;         /* the batch packs documents: attention uses kstart */
    int win_on;         /* the batch reaches past the window: attention uses kwin */
    float loss_scale;
    int32_t *staging;   /* host: 6 x max_n */
    /* decoding (zn_model_set_decode): the batch's tokens follow cached ones */
    int decode;
    int64_t *kv_pos0;   /* host, per sequence: tokens already in its cache */
    int64_t *kv_slot;   /* host, per sequence: its slot of the KV cache */
};

/* The workspace carved by offset, and one layer's activations in it (the
 * workspace's own, or those a layer saved for its backward). */
typedef struct {
    unsigned char *base; /* NULL: only count */
    uint64_t off;
} zn_m_carver;

void zn_m_carve_acts(zn_m_carver *c, zn_m_layer_acts *a, const zn_model *m);
int64_t zn_m_lse_floats(const zn_model *m);
int zn_m_need_batch(const zn_model *m); /* ZN_EARG until a batch is set */

/* The norms, the MLP's activation and the embedding as the family computes
 * them (Gemma: 1 + w, tanh GELU, scaled rows), on the device ops. */
static inline int zn_m_rms_fwd(const zn_model *m, zn_stream *s, const void *x, zn_dtype x_dt,
                               const void *w, zn_dtype w_dt, void *y, zn_dtype y_dt, float *rstd,
                               int64_t rows, int64_t dim, float eps)
{
    if (m->woff == 0.0f)
        return zn_dev_rmsnorm_fwd(m->dev, s, x, x_dt, w, w_dt, y, y_dt, rstd, rows, dim, eps);
    return zn_dev_rmsnorm_heads_fwd(m->dev, s, x, x_dt, dim, w, w_dt, y, y_dt, dim, rstd, rows, 1,
                                    dim, eps, m->woff);
}

static inline int zn_m_rms_bwd(const zn_model *m, zn_stream *s, const void *x, zn_dtype x_dt,
                               const void *w, zn_dtype w_dt, const float *rstd, const void *dy,
                               zn_dtype dy_dt, void *dx, zn_dtype dx_dt, float *dw, int64_t rows,
                               int64_t dim)
{
    if (m->woff == 0.0f)
        return zn_dev_rmsnorm_bwd(m->dev, s, x, x_dt, w, w_dt, rstd, dy, dy_dt, dx, dx_dt, dw,
                                  rows, dim);
    /* the heads form takes one ld for dy and dx: the same here (dim) */
    return zn_dev_rmsnorm_heads_bwd(m->dev, s, x, x_dt, dim, w, w_dt, rstd, dy, dy_dt, dx, dx_dt,
                                    dim, dw, rows, 1, dim, m->woff);
}

static inline int zn_m_glu_fwd(const zn_model *m, zn_stream *s, const void *gate, const void *up,
                               void *out, zn_dtype dt, int64_t n)
{
    return m->d.gelu_mlp ? zn_dev_geglu_fwd(m->dev, s, gate, up, out, dt, n)
                         : zn_dev_swiglu_fwd(m->dev, s, gate, up, out, dt, n);
}

static inline int zn_m_glu_bwd(const zn_model *m, zn_stream *s, const void *gate, const void *up,
                               const void *dout, void *dgate, void *dup, zn_dtype dt, int64_t n)
{
    return m->d.gelu_mlp ? zn_dev_geglu_bwd(m->dev, s, gate, up, dout, dgate, dup, dt, n)
                         : zn_dev_swiglu_bwd(m->dev, s, gate, up, dout, dgate, dup, dt, n);
}

/* Byte offset helper for typed device pointers. */
static inline void *zn_m_at(const void *p, int64_t elems, size_t esz)
{
    return (unsigned char *)p + elems * (int64_t)esz;
}

/* ---- parameter lists (model_params.c) -----------------------------------------------
 * Where a layer slot (ZN_M_P_*) or target t's lora_A (lora_B follows) sits
 * in a layer's parameter array; -1 when the model has none. */
int zn_m_slot_index(const zn_model_dims *d, int layer, int slot);
/* A sparse layer's router (mlp.gate.weight); expert e's gate_proj, up_proj
 * and down_proj follow at + 1 + 3 e, + 2 + 3 e, + 3 + 3 e. -1: a dense layer. */
int zn_m_moe_index(const zn_model_dims *d, int layer);
/* A slot absent as a tensor of its own but a row block of a fused one: 1
 * with the fused slot and the block's first element in it; else 0. */
int zn_m_slot_part(const zn_model_dims *d, int slot, int *fused, int64_t *elem);
int zn_m_lora_index(const zn_model_dims *d, int layer, unsigned t);

/* ---- safetensors (safetensors.c opens, safetensors_read.c reads,
 * safetensors_write.c writes) -------------------------------------------------------- */

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "zinc's safetensors code assumes a little-endian host"
#endif

/* Bytes converted per pread when the on-disk type differs from the target. */
#define ZN_M_ST_CONVERT_CHUNK (1u << 20)
#define ZN_M_ST_NAME_MAX 1024

typedef struct {
    char *path;
    int fd;
    uint64_t size;
} zn_m_st_shard;

struct zn_st {
    zn_m_st_shard *shards;
    int nshards;
    zn_st_tensor *t;
    size_t n, cap;
    size_t *by_name; /* indices into t, sorted by name */
    struct json_t *meta; /* first shard's __metadata__ (object) or NULL; the tag
                          * spares the other files <jansson.h> */
};

static inline int zn_m_st_is_float_io(zn_st_dtype t)
{
    return t == ZN_ST_F32 || t == ZN_ST_F16 || t == ZN_ST_BF16;
}

/* len bytes at off of fd, whole (EINTR and short reads retried); the error
 * names path and what. */
int zn_m_st_pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path,
                       const char *what);
/* n elements from one float type to another (memcpy when they are one). */
void zn_m_st_convert(void *dst, zn_st_dtype to, const void *src, zn_st_dtype from, size_t n);
/* A bare file name (no '/', not "." or ".."), as an index's shards must be. */
int zn_m_st_valid_shard_name(const char *f);

/* ---- the generator (generate.c runs it, generate_weights.c places, loads and
 * streams the weights it owns) ---------------------------------------------------- */

/* Weights the generator owns (zn_gen_open): each block's tensors back to
 * back (each at a ZN_DEV_ALIGN offset) in one buffer at its home, the
 * device or pinned host memory. A ring slot holds the largest decoder
 * layer, and a streamed layer's tensors are bound in its slot at its use
 * (layers of a mixture-of-experts family differ: dense and sparse). */
#define ZN_M_GEN_MAX_RING 8

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
    uint64_t lmax;      /* the largest decoder layer's buffer (a slot's size; a
                           mixture-of-experts family's dense layers are smaller) */
    int npmax;          /* the most tensors of a decoder layer */
    int slot_block[ZN_M_GEN_MAX_RING]; /* the block each slot's pending read is for */
    void *ring[ZN_M_GEN_MAX_RING];
    void **ring_ptr[ZN_M_GEN_MAX_RING];
    zn_event *ready[ZN_M_GEN_MAX_RING], *freed[ZN_M_GEN_MAX_RING];
    zn_stream *copy;
    /* NVMe homes (zn_gen_config.nvme_dir): each streamed layer in one
     * extent of a swap space, its tensors at their offsets in the layer's
     * buffer (off), so a use is one read into its pinned stage (one per
     * slot), then one copy takes the stage to the device slot. One extent
     * per layer, not per tensor: a tensor's own extent would be rounded up
     * to the swap block (1 MiB), a norm weight of a few KiB included */
    zn_aio *aio;
    zn_swap *swap;
    zn_extent *ext;     /* per block (NVMe-homed layers) */
    unsigned char *on_nvme; /* per block: 1 homed there, 2 written at least once */
    void *stage[ZN_M_GEN_MAX_RING];
    zn_aio_handle rd[ZN_M_GEN_MAX_RING];
    int pending[ZN_M_GEN_MAX_RING]; /* a read in flight, the copy not yet queued */
    /* loading: the layer being filled (asm_block, -1 none), written whole
     * when a piece of another layer comes or before a read (dirty) */
    void *asm_buf;
    int asm_block, asm_dirty;
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

    /* the KV cache homed in pinned memory (generate_kv.c): kv[] is NULL,
     * layer l's cache is kv_host + l * kv_layer, and a step's use of layer
     * l (use number kv_use + l) runs from device slot use % kv_K: copied
     * in (rows [0, pos0) of each sequence) one layer ahead on kv_in, the
     * new rows copied out on kv_out after the layer ran */
    int kv_pinned, kv_K;
    uint64_t kv_layer;  /* one layer's cache: zn_model_kv_bytes(max_batch) */
    void *kv_host;
    void *kv_slot[2];
    zn_event *kv_ready[2], *kv_used[2], *kv_saved[2];
    zn_stream *kv_in, *kv_out;
    uint64_t kv_use;
    uint64_t kv_in_bytes, kv_out_bytes;
    /* gathered embedding rows in, logits out, so far (zn_gen_placement) */
    uint64_t embed_in_bytes, logits_out_bytes;
    /* the step being run: its sequences' cache slots, first positions and
     * new tokens each (zn_model_set_decode's) */
    int64_t cur_nb, cur_T;
    int64_t *cur_pos0, *cur_slot;
};

/* generate.c: a generator's cache, activations and logits, for zn_gen_create
 * and zn_gen_open. */
int zn_m_gen_common(zn_gen **out, zn_model *m, int64_t max_batch);
/* generate_weights.c: the ring. fetch queues use u's layer into its slot;
 * complete waits for slot k's NVMe reads and queues its copy. */
int zn_m_gen_fetch(zn_gen *g, uint64_t u);
int zn_m_gen_complete(zn_gen *g, int k);
/* Slot k's tensor pointers (ring_ptr[k]) for layer l's layout. */
void zn_m_gen_bind_slot(zn_gen *g, int k, int64_t l);
/* generate_kv.c: the cache's home. place allocates it (on the device, or
 * pinned with its two device slots) given the device bytes the weights
 * need at least; begin queues the step's first layer in; enter gives layer
 * l's cache on the device (queueing layer l + 1's in); leave queues the
 * rows layer l added out; release frees what place made. */
int zn_m_gen_kv_place(zn_gen *g, int kv_home, uint64_t least_weights);
int zn_m_gen_kv_begin(zn_gen *g);
int zn_m_gen_kv_enter(zn_gen *g, int64_t l, void **kv);
int zn_m_gen_kv_leave(zn_gen *g, int64_t l);
void zn_m_gen_kv_release(zn_gen *g);

#endif
