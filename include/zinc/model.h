/* zinc model: the Llama-family decoder (Llama 2/3, Qwen2/2.5). Its shape
 * (zn_model_dims) comes from a Hugging Face config.json or from numbers; the
 * parameter counts here are what `zinc plan` budgets with. The layer-by-layer
 * compute API (blocks, forward/backward) is further down. */
#ifndef ZINC_MODEL_H
#define ZINC_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- architecture --------------------------------------------------------*/
typedef enum {
    ZN_ARCH_LLAMA = 1, /* model_type "llama": Llama 2, Llama 3, ... */
    ZN_ARCH_QWEN2 = 2, /* model_type "qwen2": Qwen2, Qwen2.5 (q/k/v bias) */
    ZN_ARCH_MISTRAL = 3, /* model_type "mistral": the Llama block, its own name */
    ZN_ARCH_QWEN3 = 4, /* model_type "qwen3": Qwen3 dense (per-head q/k RMSNorm) */
    ZN_ARCH_PHI3 = 5,  /* model_type "phi3": Phi-3, phi-4 (qkv_proj, gate_up_proj fused) */
    ZN_ARCH_OLMO2 = 6, /* model_type "olmo2": OLMo 2 (post-norms, full-width q/k norm) */
    ZN_ARCH_GEMMA = 7, /* model_type "gemma": Gemma (1 + w norms, GeGLU, scaled embedding) */
    ZN_ARCH_GEMMA2 = 8, /* model_type "gemma2": Gemma 2 (Gemma's pieces, four norms a layer,
                           soft-capping, sliding windows on alternate layers) */
    ZN_ARCH_GEMMA3 = 9, /* model_type "gemma3_text": Gemma 3's text model (Gemma 2's block,
                           per-head q/k norm, two RoPE bases, 5 local : 1 global) */
    ZN_ARCH_OLMO3 = 10, /* model_type "olmo3": OLMo 3 (OLMo 2's block, sliding-window
                           layers, YaRN on the full-attention ones) */
    ZN_ARCH_QWEN3_MOE = 11, /* model_type "qwen3_moe": Qwen3's attention, mixture-of-experts
                              MLPs (a softmax router, top-k experts) */
    ZN_ARCH_MIXTRAL = 12, /* model_type "mixtral": Mistral's attention, every MLP 8 experts,
                              2 a token, always renormalized */
} zn_model_arch;

/* The families (src/model/family.c). zn_model_family_lookup: the arch of a
 * config.json's model_type, its default max_position_embeddings and
 * head_dim (0: hidden_size / num_attention_heads; either may be NULL);
 * ZN_EUNSUPPORTED for one not built, with *missing (when zinc knows
 * the family) saying what it needs that zinc lacks, NULL for a model_type
 * zinc does not know. */
ZN_API int zn_model_family_lookup(const char *model_type, zn_model_arch *arch,
                                  int64_t *max_pos, int64_t *head_dim, const char **missing);
/* The model_type and the transformers class of an arch ("?" for none). */
ZN_API const char *zn_model_arch_name(zn_model_arch a);
ZN_API const char *zn_model_arch_class(zn_model_arch a);
/* The built families' model_types, ", "-separated, into out; returns how
 * many. */
ZN_API int zn_model_families(char *out, size_t len);

typedef enum {
    ZN_ROPE_DEFAULT = 0, /* theta^(-2i/d) */
    ZN_ROPE_LLAMA3 = 1,  /* Llama 3.1 frequency rescaling (rope_scaling.rope_type "llama3") */
    ZN_ROPE_LINEAR = 2,  /* every frequency / factor ("linear": gemma-3-12b/27b's global layers) */
    ZN_ROPE_YARN = 3,    /* YaRN ("yarn": OLMo 3.1's full-attention layers): frequencies
                            blended by beta_fast / beta_slow, and cos, sin times
                            attention_factor (the scores times its square) */
} zn_rope_type;

/* LoRA adapters (PEFT's LoraConfig) on the decoder layers' linear
 * projections: each targeted W [out][in] gains lora_A [r][in] and lora_B
 * [out][r] and computes W x + scale B A x, scale = alpha / r (alpha /
 * sqrt(r) with rslora). With r > 0 every parameter of the decoder is
 * frozen and only the adapters train (PEFT's bias "none"). */
typedef enum {
    ZN_LORA_Q = 1 << 0,    /* self_attn.q_proj */
    ZN_LORA_K = 1 << 1,    /* self_attn.k_proj */
    ZN_LORA_V = 1 << 2,    /* self_attn.v_proj */
    ZN_LORA_O = 1 << 3,    /* self_attn.o_proj */
    ZN_LORA_GATE = 1 << 4, /* mlp.gate_proj */
    ZN_LORA_UP = 1 << 5,   /* mlp.up_proj */
    ZN_LORA_DOWN = 1 << 6, /* mlp.down_proj */
    ZN_LORA_ALL = 127,     /* PEFT's "all-linear" (zn_lora_fit_family maps it to a
                              fused family's projections) */
    ZN_LORA_QKV = 1 << 7,  /* self_attn.qkv_proj (phi3: q, k, v fused) */
    ZN_LORA_GATE_UP = 1 << 8, /* mlp.gate_up_proj (phi3: gate, up fused) */
    ZN_LORA_LAST = ZN_LORA_GATE_UP,
    ZN_LORA_ANY = 511,     /* every target bit */
} zn_lora_target;

typedef struct {
    int r;              /* rank; 0: no adapters */
    double alpha;       /* lora_alpha */
    double dropout;     /* lora_dropout (on the adapter's input, training only) */
    int rslora;         /* use_rslora: scale alpha / sqrt(r) */
    unsigned targets;   /* zn_lora_target bits */
} zn_lora;

/* PEFT's module name of target bit t ("q_proj", ...), NULL for another
 * value. */
ZN_API const char *zn_lora_target_name(unsigned t);
/* PEFT's target_modules (a jansson value: a list of module names, a full
 * name counting by its last part, or "all-linear") into zn_lora_target
 * bits. Returns 0, or ZN_ECONFIG with what is wrong written into msg (the
 * caller names where it came from). */
ZN_API int zn_lora_targets_of(const void *json_value, unsigned *out, char *msg, size_t len);
/* The adapters' scale: alpha / r, or alpha / sqrt(r) with rslora. */
ZN_API double zn_lora_scale(const zn_lora *l);
/* Reads a PEFT adapter folder's adapter_config.json (dir/adapter_config.json).
 * Returns 0, -ENOENT, ZN_ECONFIG (malformed: the key named), or
 * ZN_EUNSUPPORTED (DoRA, a bias, modules_to_save, per-layer patterns, another
 * peft_type). */
ZN_API int zn_lora_read_peft_config(const char *dir, zn_lora *l);
/* The same from a file of that format at `path` (a checkpoint's
 * lora_config.json). */
ZN_API int zn_lora_read_peft_file(const char *path, zn_lora *l);
/* Writes PEFT's adapter_config.json for `l` at path (atomically);
 * base_model (may be NULL) becomes base_model_name_or_path. */
ZN_API int zn_lora_write_peft_config(const zn_lora *l, const char *path, const char *base_model);

/* The shape of a decoder. Every field is filled by zn_model_dims_from_hf()
 * or zn_model_dims_default(); zn_model_dims_validate() checks consistency. */
typedef struct {
    zn_model_arch arch;
    int64_t hidden;        /* hidden_size */
    int64_t n_layers;      /* num_hidden_layers */
    int64_t n_heads;       /* num_attention_heads */
    int64_t n_kv_heads;    /* num_key_value_heads (GQA); default n_heads */
    int64_t head_dim;      /* head_dim; default hidden / n_heads */
    int64_t intermediate;  /* intermediate_size (SwiGLU width) */
    int64_t vocab;         /* vocab_size */
    int64_t max_pos;       /* max_position_embeddings */
    double rope_theta;     /* rope_theta; default 10000 */
    zn_rope_type rope_type;
    double rope_factor;          /* llama3: factor */
    double rope_low_freq_factor; /* llama3: low_freq_factor */
    double rope_high_freq_factor;/* llama3: high_freq_factor */
    int64_t rope_orig_max_pos;   /* llama3, yarn: original_max_position_embeddings */
    double rope_beta_fast;       /* yarn: beta_fast (32) */
    double rope_beta_slow;       /* yarn: beta_slow (1) */
    double rope_attn_factor;     /* yarn: attention_factor (given, or 0.1 ln(factor) + 1) */
    double rope_local_theta;     /* gemma3, olmo3: the sliding layers' RoPE base, unscaled
                                    (gemma3's rope_local_base_freq, olmo3's rope_theta);
                                    rope_theta and rope_type then apply to the
                                    full-attention layers only. 0: every layer alike */
    double rms_eps;        /* rms_norm_eps */
    int tie_embeddings;    /* tie_word_embeddings: lm_head shares embed_tokens */
    int qkv_bias;          /* q/k/v projections have a bias (qwen2; llama attention_bias) */
    int o_bias;            /* o_proj has a bias (llama, qwen3 attention_bias) */
    int qk_norm;           /* RMSNorm of the queries and keys before RoPE
                              (self_attn.q_norm, k_norm): 1 over head_dim on
                              each head (qwen3, gemma3), 2 over the whole projection
                              (olmo2, olmo3) */
    int post_norm;         /* the attention's and the MLP's outputs are normed
                              (post_attention_layernorm, post_feedforward_layernorm)
                              before the residual: 1 with no norm before them
                              (olmo2, olmo3), 2 beside the input_layernorm and
                              pre_feedforward_layernorm before them (gemma2, gemma3) */
    int has_pad;           /* pad_token_id is set: transformers' nn.Embedding takes it
                              as padding_idx, so that row's lookup passes no gradient */
    int64_t pad_id;        /* with has_pad: pad_token_id, in [0, vocab) */
    int gemma_norm;        /* gemma, gemma2, gemma3: every RMSNorm scales by (1 + w), w stored as is */
    int gelu_mlp;          /* gemma, gemma2, gemma3: the MLP's gate is tanh GELU (GeGLU), not silu */
    int embed_scaled;      /* gemma, gemma2, gemma3: the embedding's rows times sqrt(hidden_size), in
                              the compute type */
    int fused_proj;        /* phi3: q, k, v are one tensor (self_attn.qkv_proj, rows
                              q | k | v) and gate, up another (mlp.gate_up_proj,
                              rows gate | up), as on disk and in PEFT */
    int64_t sliding_window;/* mistral, phi3, gemma2/3, olmo3: a query sees only the last
                              sliding_window keys, itself included (0: none) */
    int64_t full_every;    /* gemma2/3's, olmo3's layer_types: 0, every layer alike; k >= 1,
                              layer l attends fully when l % k == k - 1 and the
                              others slide (k 1: none slides; zn_model_layer_slides) */
    double attn_scalar;    /* gemma2, gemma3: query_pre_attn_scalar, the scores scaled by
                              its -1/2 power (0: head_dim's) */
    double attn_softcap;   /* gemma2 (gemma3 when set): attn_logit_softcapping, the scaled scores
                              become cap tanh(s / cap) before the mask (0: none) */
    double final_softcap;  /* gemma2 (gemma3 when set): final_logit_softcapping, the logits likewise
                              (0: none) */
    /* mixture of experts (qwen3_moe, mixtral; n_experts 0: every MLP dense) */
    int64_t n_experts;     /* num_experts */
    int64_t top_k;         /* num_experts_per_tok */
    int64_t moe_intermediate; /* moe_intermediate_size: each expert's SwiGLU width */
    int norm_topk;         /* norm_topk_prob: the top-k probabilities renormalized */
    int64_t sparse_step;   /* decoder_sparse_step: layer l is sparse when (l + 1) % step == 0 */
    uint64_t mlp_only[4];  /* mlp_only_layers as a bitmap (layers < 256): dense MLPs of
                              intermediate_size */
    int router_logits;     /* output_router_logits: the load-balancing loss is added
                              (zn_model_aux_loss) */
    double router_aux_coef;/* router_aux_loss_coef */
    zn_lora lora;          /* adapters (not part of config.json); r 0: none */
} zn_model_dims;

/* Whether decoder layer `layer` (0-based) has a mixture-of-experts MLP
 * (its block: the attention, mlp.gate.weight [n_experts][hidden], then
 * each expert's gate_proj, up_proj and down_proj, as the published
 * checkpoints name them) rather than a dense one. */
ZN_API int zn_model_layer_moe(const zn_model_dims *d, int64_t layer);
#define ZN_MODEL_MLP_ONLY_MAX 256

/* "all-linear" (every projection, ZN_LORA_ALL) for d's family: a fused
 * family's (phi3) are qkv_proj, o_proj, gate_up_proj and down_proj. Any
 * other set is left as given (zn_model_dims_validate refuses a target the
 * family does not have). Call once the lora targets are in d. */
ZN_API void zn_lora_fit_family(zn_model_dims *d);

/* A small Llama-shaped default (the demo's tiny model): hidden 256, 4 layers,
 * 8 heads / 4 kv heads, intermediate 688, vocab 320. Never fails. */
ZN_API void zn_model_dims_default(zn_model_dims *d);

/* Checks the fields for consistency (positive sizes, n_heads a multiple of
 * n_kv_heads, even head_dim, finite positive theta and eps, ...).
 * Returns 0 or ZN_ECONFIG with a message naming the field. */
ZN_API int zn_model_dims_validate(const zn_model_dims *d);
/* Whether layer `layer` (0-based) attends within the sliding window. */
ZN_API int zn_model_layer_slides(const zn_model_dims *d, int64_t layer);
/* Layer `layer`'s RoPE: inv_freq[head_dim / 2] (the table zn_dev_rope_fwd
 * takes) and *score_factor, what its scores are multiplied by beyond the
 * family's scale (YaRN's attention_factor squared: transformers multiplies
 * cos and sin by it, so q.k carries it twice; else 1). The sliding layers
 * of gemma3 and olmo3 (rope_local_theta > 0) take the unscaled table of
 * rope_local_theta, every other layer rope_theta with rope_type, as
 * transformers' rotary embeddings compute them in fp32. Returns 0 or
 * ZN_EARG for a layer out of range. */
ZN_API int zn_model_rope_table(const zn_model_dims *d, int64_t layer, float *inv_freq,
                               double *score_factor);
/* Whether sequences of `seq` tokens compute as the family does (0; a
 * sliding window shorter than them masks the keys before it), ZN_EARG for
 * sizes out of range. */
ZN_API int zn_model_check_window(const zn_model_dims *d, int64_t seq);

/* Reads a Hugging Face config.json. `path` is the file or the model folder
 * that holds it. Accepts model_type "llama" and "qwen2" (hidden_act "silu").
 * Returns 0; -errno when the file cannot be read; ZN_ECONFIG for bad JSON, a
 * missing or mistyped key (the message names the file and the key);
 * ZN_EUNSUPPORTED for a valid config zinc does not implement (another
 * model_type, sliding-window attention, mlp_bias, other rope_scaling). */
ZN_API int zn_model_dims_from_hf(zn_model_dims *d, const char *path);

/* The same from JSON text; `name` is used in error messages. */
ZN_API int zn_model_dims_from_json(zn_model_dims *d, const char *text, const char *name);

/* Writes `d` as a Hugging Face config.json that transformers can load (and
 * zn_model_dims_from_hf reads back to the same dims). Atomic: written to a
 * private temporary and renamed. Returns 0, -errno, or ZN_ECONFIG for
 * invalid dims. */
ZN_API int zn_model_dims_write_hf(const zn_model_dims *d, const char *path);
/* The same, declaring the weights' dtype (torch_dtype and transformers-5's
 * dtype: "float32", "float16" or "bfloat16"); zn_model_dims_write_hf says
 * bfloat16. */
ZN_API int zn_model_dims_write_hf_as(const zn_model_dims *d, const char *path, zn_dtype dtype);

/* ---- parameter counts ----------------------------------------------------
 * Blocks are numbered in execution order: block 0 is the embedding, blocks
 * 1..n_layers the decoder layers, block n_layers + 1 the head (final norm +
 * lm_head; lm_head counts 0 when tied to the embedding). */
ZN_API int zn_model_num_blocks(const zn_model_dims *d);

/* Number of parameters (elements) of one block, adapters included; 0 for a
 * block index out of range. */
ZN_API uint64_t zn_model_block_param_count(const zn_model_dims *d, int block);
/* Of those, the frozen ones: with LoRA the block's own decoder tensors (all
 * of them: they come first in the block's order, the adapters after);
 * without, 0. */
ZN_API uint64_t zn_model_block_frozen_count(const zn_model_dims *d, int block);
/* ---- parts: a big vocabulary in row ranges ---------------------------------
 * The embedding and an untied lm_head are split into row ranges ("parts")
 * of at most one decoder layer's parameters, so whoever streams the model
 * block by block (the offload trainer) never sizes a buffer by the
 * vocabulary: Qwen2.5-7B's embedding is 545M elements, 2.3 decoder layers.
 * A part is a contiguous range of its block's flat order (tensors in
 * zn_model_block_param order): the embedding's part p holds table rows
 * [row0, row0 + rows); the head's part 0 holds the final norm and lm_head
 * rows [0, rows), a later part only lm_head rows. A decoder layer, a tied
 * model's head (its own tensor is the final norm; its lm_head is the
 * embedding's parts, which stay resident) and a vocabulary within a layer's
 * size are one part. Parts are a function of the dims only, so checkpoints
 * written in parts agree with every later run. */
typedef struct {
    int block;          /* the model block */
    int part, nparts;   /* this part of how many of that block */
    uint64_t first, n;  /* elements [first, first + n) of the block's flat order */
    int64_t row0, rows; /* its embedding or lm_head rows (0 and 0 in a layer) */
} zn_model_part_info;

/* Parts of block b (1 for a decoder layer; 0 when b is out of range). */
ZN_API int zn_model_block_parts(const zn_model_dims *d, int block);
/* Parts of the whole model, in execution order: the embedding's, the
 * layers, the head's. */
ZN_API int zn_model_num_parts(const zn_model_dims *d);
/* Part `index` (0 .. zn_model_num_parts - 1). Returns 0 or ZN_EARG. */
ZN_API int zn_model_part(const zn_model_dims *d, int index, zn_model_part_info *out);

/* Parameters that train: all of them, or the adapters with LoRA. */
ZN_API uint64_t zn_model_trainable_count(const zn_model_dims *d);

/* Total parameters (tied embeddings counted once), e.g. 6,738,415,616 for
 * Llama-2-7B. */
ZN_API uint64_t zn_model_param_count(const zn_model_dims *d);

/* Model FLOPs of one forward + backward over batch x seq tokens (no
 * recompute counted): 6 x (matmul parameters) x tokens, plus causal
 * attention 6 x batch x seq^2 x n_heads x head_dim per layer (QK^T and PV:
 * 4 seq^2 qd forward, half of it masked, backward twice the forward), plus
 * the lm_head's 6 x tokens x hidden x vocab. For `block` >= 0 only that
 * block (the embedding counts 0); -1 = the whole model. */
ZN_API double zn_model_flops(const zn_model_dims *d, int block, int64_t batch, int64_t seq);

/* ==== compute: blocks with forward and backward =============================
 * The model is a list of blocks run in order (block numbers as above):
 *   0            embedding:    x = embed_tokens[ids]
 *   1..L         layer l-1:    x = x + attn(rmsnorm(x)); x = x + mlp(rmsnorm(x))
 *   L+1          head:         loss = mean xent(lm_head(rmsnorm(x)), targets)
 * A zn_model holds NO weights. Every forward/backward takes the block's
 * parameters as an array of device pointers (in the order of
 * zn_model_block_param) and its gradients as an array of fp32 device
 * pointers that are ADDED to (+=; the caller zeroes them), so a scheduler
 * decides where parameters and gradients live. All calls are asynchronous on
 * the given stream (NULL = the device's default stream) and return 0 or a
 * device-layer error (the arguments are checked at the call).
 *
 * Precision: parameters and activations (x between blocks) are in
 * cfg.dtype (F32 on the host backend; BF16 on CUDA by default); GEMMs
 * accumulate in fp32; RMSNorm, softmax and cross-entropy reduce in fp32;
 * gradients are fp32.
 *
 * Memory (N = batch x seq tokens, per model, allocated once from the device
 * arena at zn_model_create; zn_model_workspace_bytes says how much):
 *   layer workspace  N x (3H + 4(qd + 2kvd) + 2qd + 3I) activations + 2 N H
 *                    fp32 grads, and for attention either (fused) 2 x N x
 *                    n_heads fp32 statistics, or (GEMM) n_heads x qb x seq
 *                    x (4 + 2 x dtype) bytes of scores/probabilities, qb =
 *                    min(seq, attn_block) query rows at a time of ONE
 *                    sequence (not O(batch x heads x seq^2)),
 *   head             N x chunk x (4 + dtype) logits of one vocabulary chunk
 *                    (the full N x vocab logits never exist) + N x H,
 *   where H = hidden, qd = n_heads x head_dim, kvd = n_kv_heads x head_dim,
 *   I = intermediate. Activation checkpointing (default) keeps only each
 *   layer's input x (owned by the caller) and recomputes the layer in its
 *   backward; without it the caller passes a `saved` buffer per layer of
 *   zn_model_layer_saved_bytes() and the backward recomputes only the
 *   attention probabilities, one sequence at a time. */

typedef struct zn_dev zn_dev;       /* include/zinc/device.h */
typedef struct zn_stream zn_stream;

typedef struct zn_model zn_model;

/* How attention is computed. FUSED: zn_dev_flash_attn_* (flash-attention
 * style tiles, no score matrix in the workspace; on CUDA bf16 only, head_dim
 * <= ZN_FLASH_MAX_HEAD_DIM). GEMM: batched GEMMs and a softmax kernel over
 * heads x attn_block x seq scores. AUTO (0, the default): GEMM up to
 * ZN_ATTN_AUTO_FUSED_SEQ tokens a sequence, FUSED beyond for bf16 with
 * head_dim <= ZN_FLASH_MAX_HEAD_DIM, where the GEMM path's scores grow
 * with the sequence (7B: +0.9 GiB at 8192, +3.6 GiB at 32768). On the
 * first GPU (an H200, bench/results/gpu-h200.md) the fused kernels ran a
 * Qwen2.5-0.5B-shaped step 5.2x slower than the GEMM path at seq 4096
 * (its backward 6.2x), so GEMM is the default where its memory is modest. */
enum { ZN_ATTN_AUTO = 0, ZN_ATTN_GEMM = 1, ZN_ATTN_FUSED = 2 };
#define ZN_ATTN_AUTO_FUSED_SEQ 8192

typedef struct {
    zn_dtype dtype;     /* parameters and activations: ZN_DTYPE_F32 or BF16.
                           Default: BF16 on a CUDA device, F32 on host. */
    int64_t max_batch;  /* the workspace is sized for batch x seq tokens */
    int64_t max_seq;    /* (defaults 1 x 512) */
    int checkpoint;     /* 1 (default): recompute each layer in its backward */
    int64_t xent_chunk; /* vocabulary columns per cross-entropy chunk;
                           0 (default) = up to 256 MiB of fp32 logits */
    int64_t attn_block; /* attention query rows per block: each block of
                           queries meets only the keys up to its last (the
                           causal mask skips the rest) and the scores held
                           are heads x attn_block x seq; 0 (default) = 512 */
    int attention;      /* ZN_ATTN_AUTO (default), ZN_ATTN_GEMM, ZN_ATTN_FUSED */
} zn_model_config;

/* Whether a model of these dims and config runs the fused attention. */
ZN_API int zn_model_attention_fused(const zn_model_dims *d, const zn_model_config *cfg);

/* Defaults for device `dev` (which picks the dtype); dev may be NULL (F32). */
ZN_API zn_model_config zn_model_config_default(const zn_dev *dev);

/* The checks of zn_model_create that need no device: 0 or ZN_ECONFIG with
 * what is wrong. */
ZN_API int zn_model_config_check(const zn_model_dims *d, const zn_model_config *cfg);

/* Device bytes zn_model_create allocates for these dims and config (0 when
 * zn_model_config_check refuses them). */
ZN_API uint64_t zn_model_workspace_bytes(const zn_model_dims *d, const zn_model_config *cfg);

/* Creates the compute object: validates dims, allocates the workspace from
 * dev's arena, uploads the RoPE table. Returns 0, ZN_ECONFIG (bad dims or
 * config), ZN_EBUDGET (the workspace does not fit the arena), or a device
 * error. `d` is copied; `dev` must outlive the model. */
ZN_API int zn_model_create(zn_model **out, zn_dev *dev, const zn_model_dims *d,
                           const zn_model_config *cfg);
ZN_API void zn_model_destroy(zn_model *m); /* accepts NULL; device must be idle */

ZN_API const zn_model_dims *zn_model_get_dims(const zn_model *m);
ZN_API const zn_model_config *zn_model_get_config(const zn_model *m);
ZN_API zn_dev *zn_model_get_dev(const zn_model *m);

/* One parameter tensor of a block. */
typedef struct {
    char name[96];      /* Hugging Face name: "model.layers.3.self_attn.q_proj.weight" */
    int ndim;           /* 1 or 2 */
    int64_t shape[2];   /* [out, in] for a projection, as in torch */
    int64_t numel;
    int owner_block;    /* -1: this block's own tensor. >= 0: the same tensor
                           as in that block (the head's lm_head when
                           tie_word_embeddings: pass the embedding's
                           parameter and gradient pointers again) */
    int lora;           /* 0: a decoder tensor (frozen when dims.lora.r > 0);
                           1: a lora_A [r][in], 2: a lora_B [out][r] (named
                           "model.layers.3.self_attn.q_proj.lora_A.weight") */
    unsigned target;    /* the adapter's zn_lora_target (lora 1 and 2) */
} zn_param_info;

/* Number of parameter tensors of block b, 0 when b is out of range. A
 * decoder layer lists its own tensors, then with LoRA lora_A and lora_B of
 * each target in zn_lora_target order. Gradient pointers of frozen tensors
 * (all decoder tensors with LoRA) may be NULL: their weight gradients are
 * then never formed (the input gradients still are). */
ZN_API int zn_model_block_nparams(const zn_model_dims *d, int block);
/* Fills *out for tensor i of block b. Returns 0 or ZN_EARG. */
ZN_API int zn_model_block_param(const zn_model_dims *d, int block, int i, zn_param_info *out);

/* Sets the batch for the following block calls: ids and targets are host
 * arrays of batch x seq int32 (row-major; a target < 0 is ignored, like
 * HF's -100), copied to the device on `s` before this returns. pos (NULL:
 * 0..seq-1 in every sequence) gives each token's position in its document,
 * as HF's position_ids for packed sequences: 0 starts a document, the next
 * tokens count up. Documents packed into one sequence do not attend to
 * each other (block-diagonal causal attention) and RoPE restarts with each,
 * so a packed sequence computes what its documents would one at a time.
 * The mean loss divides by the number of non-ignored targets
 * (zn_model_batch_tokens) unless grad_scale is set with
 * zn_model_set_loss_scale. Returns 0, ZN_EARG (batch x seq beyond the
 * configured maximum, an id outside the vocab, positions that do not start
 * at 0 or count up) or a device error. */
ZN_API int zn_model_set_batch(zn_model *m, zn_stream *s, int64_t batch, int64_t seq,
                              const int32_t *ids, const int32_t *targets, const int32_t *pos);
/* Non-ignored targets of the current batch. */
ZN_API int64_t zn_model_batch_tokens(const zn_model *m);
/* The loss is sum(xent) * scale; default 1 / zn_model_batch_tokens (a
 * mean). For gradient accumulation over k micro-batches, pass
 * 1 / (targets of all k). Call after zn_model_set_batch. */
ZN_API void zn_model_set_loss_scale(zn_model *m, float scale);
/* Training mode for LoRA dropout (off until called, so evaluation and the
 * plain forward never drop): with training != 0 and lora.dropout > 0 the
 * adapters' inputs are dropped with masks drawn from `key` (one key per
 * micro-batch; each layer and target derives its own stream). The key is
 * captured when an op is queued, so set it before a micro-batch's forward
 * and keep it through its backward. */
ZN_API void zn_model_set_dropout(zn_model *m, int training, uint64_t key);

/* ---- decoding with a KV cache ------------------------------------------------
 * Generation runs the same blocks over new tokens only: the keys and values
 * of the tokens before them wait in a cache, per layer [slots][max_seq][k | v]
 * (k after RoPE; cfg.dtype; zn_model_kv_bytes per layer), owned by the
 * caller. zn_model_set_decode sets `batch` sequences of `seq` new tokens
 * each: sequence b has pos0[b] tokens cached in slot slot[b] (NULL: slot b)
 * and its new tokens sit at positions pos0[b] .. pos0[b] + seq - 1 (a
 * prompt: pos0 0 and its whole length; a decoding step: seq 1). Then
 * zn_model_embed_fwd, zn_model_layer_fwd_kv for every layer (which adds the
 * new keys and values to the cache and attends over all of them, causally)
 * and zn_model_head_logits compute what the full forward over the whole
 * sequences would, for the new rows. Needs the GEMM attention (the fused
 * kernels take no cache). Returns 0 or ZN_EARG (a size beyond the
 * configured maximum, a position beyond max_seq, an id outside the vocab). */
ZN_API int zn_model_set_decode(zn_model *m, zn_stream *s, int64_t batch, int64_t seq,
                               const int32_t *ids, const int64_t *pos0, const int64_t *slot);
/* Bytes of one layer's cache of `slots` sequences of up to max_seq tokens. */
ZN_API uint64_t zn_model_kv_bytes(const zn_model *m, int64_t slots);
/* The decoder layer's forward for a decoding batch; kv: the layer's cache. */
ZN_API int zn_model_layer_fwd_kv(zn_model *m, zn_stream *s, int layer, void *const *params,
                                 const void *x_in, void *x_out, void *kv);

/* Bytes of one activation tensor between blocks: batch x seq x hidden x dtype. */
ZN_API uint64_t zn_model_act_bytes(const zn_model *m);

/* One layer's forward, its backward (with the recompute when checkpoint is
 * set) and the head's forward + backward, timed on `dev` with parameters
 * resident: every layer has the same shapes, so one layer (plus embedding
 * and head) stands for the model. Best of `iters` after one warm-up, in
 * seconds. `wrong` counts failed checks: the loss at init against ln(vocab),
 * non-finite or zero layer gradients, a non-finite or zero layer output. */
typedef struct {
    int64_t batch, seq;
    zn_dtype dtype;
    int checkpoint;       /* recompute in the backward */
    int attention;        /* ZN_ATTN_* */
    int iters;
} zn_model_probe_opts;

typedef struct {
    double layer_fwd_s, layer_bwd_s, head_s;
    float loss, want_loss;
    uint64_t wrong;
    int fused;            /* the attention ran fused */
} zn_model_probe;

ZN_API int zn_model_probe_blocks(zn_dev *dev, const zn_model_dims *d,
                                 const zn_model_probe_opts *o, zn_model_probe *out);
/* Bytes of one layer's saved activations when checkpointing is off. */
ZN_API uint64_t zn_model_layer_saved_bytes(const zn_model *m);

/* Embedding (block 0). x_out: [N][hidden] of cfg.dtype. */
ZN_API int zn_model_embed_fwd(zn_model *m, zn_stream *s, void *const *params, void *x_out);
/* dtable += scatter(dx). dx: [N][hidden] of cfg.dtype. */
ZN_API int zn_model_embed_bwd(zn_model *m, zn_stream *s, void *const *params, const void *dx,
                              float *const *grads);

/* The same for one part of the embedding (zn_model_part_info, block 0):
 * `table` holds the part's rows only and x_out receives the rows of the
 * tokens whose ids fall in them (others are left as they are, so the parts
 * in any order assemble the lookup); dtable (the part's rows, fp32; NULL:
 * frozen) gets their scatter. */
ZN_API int zn_model_embed_fwd_part(zn_model *m, zn_stream *s, int part, const void *table,
                                   void *x_out);
ZN_API int zn_model_embed_bwd_part(zn_model *m, zn_stream *s, int part, const void *dx,
                                   float *dtable);

/* Decoder layer `layer` (0-based; block layer + 1). x_in and x_out are
 * [N][hidden] of cfg.dtype and must differ. `saved`: NULL when
 * checkpointing (nothing is kept), else a device buffer of
 * zn_model_layer_saved_bytes() that the forward fills for the backward. */
ZN_API int zn_model_layer_fwd(zn_model *m, zn_stream *s, int layer, void *const *params,
                              const void *x_in, void *x_out, void *saved);
/* Given the layer's input x_in (the checkpoint) or its `saved` buffer, and
 * dy = dL/dx_out, writes dx = dL/dx_in and adds the parameter gradients.
 * dx may alias dy. */
ZN_API int zn_model_layer_bwd(zn_model *m, zn_stream *s, int layer, void *const *params,
                              const void *x_in, const void *saved, const void *dy, void *dx,
                              float *const *grads);

/* Head (final norm + lm_head + cross-entropy). Forward: the loss of the
 * batch (sum of per-token xent x loss scale) into the model's loss slot (read
 * with zn_model_read_loss); keeps per-token log-sum-exp for the backward,
 * so head_bwd must follow head_fwd with the same x_in. */
ZN_API int zn_model_head_fwd(zn_model *m, zn_stream *s, void *const *params, const void *x_in);
/* dx = dL/dx_in (cfg.dtype), gradients +=. Recomputes the logits chunk by
 * chunk. */
ZN_API int zn_model_head_bwd(zn_model *m, zn_stream *s, void *const *params, const void *x_in,
                             void *dx, float *const *grads);
/* The head in parts (zn_model_part_info of block n_layers + 1): the
 * forward runs parts 0, 1, .. in order (part 0 normalizes x_in; each part
 * adds its rows' logits to a running log-sum-exp; the last writes the
 * loss), the backward runs them in reverse after it (each recomputes its
 * logits, adds its rows' gradient and its share of dL/d(normed x); part 0
 * then writes dx and the norm's gradient). norm_w and dnorm are the final
 * norm's weight and gradient, part 0 only (NULL otherwise; dnorm and dW
 * NULL when frozen); W and dW hold the part's lm_head rows. With tied
 * embeddings the head's parts are the embedding's (W: that part's table,
 * dW: where its lm_head gradient goes). */
ZN_API int zn_model_head_fwd_part(zn_model *m, zn_stream *s, int part, const void *norm_w,
                                  const void *W, const void *x_in);
ZN_API int zn_model_head_bwd_part(zn_model *m, zn_stream *s, int part, const void *norm_w,
                                  const void *W, const void *x_in, void *dx, float *dnorm,
                                  float *dW);
/* Logits of rows [row0, row0 + nrows) of the batch (row = b * seq + t),
 * all vocabulary columns (soft-capped where the family caps them: Gemma 2),
 * as fp32 into device memory out[nrows][vocab]. For tests and eval. It
 * reuses the head's saved state: run head_fwd again before a head_bwd. */
ZN_API int zn_model_head_logits(zn_model *m, zn_stream *s, void *const *params,
                                const void *x_in, int64_t row0, int64_t nrows, float *out);
/* The load-balancing loss of the current batch (mixture of experts with
 * output_router_logits: transformers' load_balancing_loss_func over every
 * sparse layer's router of the forwards since zn_model_set_batch,
 * unweighted; 0 before any). The layers' backward adds the gradient of
 * router_aux_loss_coef times it (the assignment counts held fixed, as
 * torch.histc passes none), not scaled by zn_model_set_loss_scale: the
 * training loss of a micro-batch is its scaled cross-entropy plus
 * router_aux_loss_coef x this, which zn_model_read_loss leaves out.
 * Returns 0, or ZN_EARG for a model without it. Host state: call after the
 * forward's layers (their routing synchronizes the stream). */
ZN_API int zn_model_aux_loss(const zn_model *m, float *aux);
/* Waits for `s` and returns the loss of the last head_fwd. */
ZN_API int zn_model_read_loss(zn_model *m, zn_stream *s, float *loss);

/* ==== a simple driver: every parameter resident on the device ===============
 * For tests, `zinc eval` and small models. The issue-7 scheduler drives the
 * blocks above directly with offloaded parameters instead. */
typedef struct zn_model_state zn_model_state;

/* Allocates every parameter (cfg.dtype) and, with with_grads, an fp32
 * gradient per parameter (zeroed), plus the activations between blocks.
 * Parameters are uninitialised until init_random or load. Returns 0,
 * ZN_EBUDGET or a device error. */
ZN_API int zn_model_state_create(zn_model_state **out, zn_model *m, int with_grads);
ZN_API void zn_model_state_destroy(zn_model_state *st); /* accepts NULL */
/* The model it was made for. */
ZN_API zn_model *zn_model_state_model(const zn_model_state *st);

/* Seeded init like transformers' (normal(0, 0.02) weights, ones for norms,
 * zero biases); the values are a function of (seed, tensor, element) only. */
ZN_API int zn_model_state_init_random(zn_model_state *st, uint64_t seed);
/* Loads a Hugging Face checkpoint (a folder with model.safetensors or a
 * sharded index, or a .safetensors file) tensor by tensor, converting
 * bf16/fp16/fp32 to cfg.dtype. Every parameter must be present with its
 * shape (message names the tensor and the file); lm_head.weight of a tied
 * model and tensors zinc does not use (rotary inv_freq) are skipped with
 * a debug line. Returns 0, -errno, ZN_ECORRUPT, ZN_ECONFIG. */
ZN_API int zn_model_state_load(zn_model_state *st, const char *path);
/* A base model and a PEFT LoRA adapter, unmerged (the dims' lora from the
 * adapter's zn_lora_read_peft_config): the decoder's tensors from `base`
 * as zn_model_state_load reads them, the adapters from
 * adapter_dir/adapter_model.safetensors (PEFT's names, "base_model.model."
 * before the model's). Returns as zn_model_state_load; a missing adapter
 * tensor or one of another shape (an adapter for another base) is
 * ZN_ECONFIG naming it. */
ZN_API int zn_model_state_load_peft(zn_model_state *st, const char *base,
                                    const char *adapter_dir);
/* Writes config.json and model.safetensors (cfg.dtype) into folder `dir`
 * (which must exist): a checkpoint transformers can load. */
ZN_API int zn_model_state_save(zn_model_state *st, const char *dir);

/* Parameter / gradient pointer arrays of a block, for the block calls. */
ZN_API void *const *zn_model_state_params(zn_model_state *st, int block);
ZN_API float *const *zn_model_state_grads(zn_model_state *st, int block);
ZN_API int zn_model_state_zero_grads(zn_model_state *st, zn_stream *s);

/* Forward over all blocks for the current batch; *loss = the loss (mean
 * over targets by default). Synchronises `s`. */
ZN_API int zn_model_state_forward(zn_model_state *st, zn_stream *s, float *loss);
/* Forward and backward; gradients are added. *loss as above. */
ZN_API int zn_model_state_forward_backward(zn_model_state *st, zn_stream *s, float *loss);
/* Mean next-token cross-entropy over token data: the loader's windows of
 * `seq` + 1 ids in file order (no shuffle), `batch` at a time, the first
 * max_batches batches (0 = every full batch). batch and seq must be within
 * the model's configured maximum. *mean_loss is the mean over all target
 * tokens (in double); *n_tokens and *n_batches what was evaluated (either
 * may be NULL). Returns 0, ZN_ECONFIG (too little data), ZN_ECORRUPT (an
 * id outside the vocab), or a device error. */
typedef struct zn_tokens zn_tokens; /* include/zinc/tokens.h */
ZN_API int zn_model_state_eval(zn_model_state *st, zn_stream *s, const zn_tokens *data,
                               int64_t batch, int64_t seq, int64_t max_batches,
                               double *mean_loss, int64_t *n_tokens, int64_t *n_batches);

/* After a forward: logits of rows [row0, row0 + nrows) into host memory
 * out[nrows][vocab] (fp32). Synchronises `s`. */
ZN_API int zn_model_state_logits(zn_model_state *st, zn_stream *s, int64_t row0, int64_t nrows,
                                 float *out);

#ifdef __cplusplus
}
#endif
#endif
