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
} zn_model_arch;

typedef enum {
    ZN_ROPE_DEFAULT = 0, /* theta^(-2i/d) */
    ZN_ROPE_LLAMA3 = 1,  /* Llama 3.1 frequency rescaling (rope_scaling.rope_type "llama3") */
} zn_rope_type;

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
    int64_t rope_orig_max_pos;   /* llama3: original_max_position_embeddings */
    double rms_eps;        /* rms_norm_eps */
    int tie_embeddings;    /* tie_word_embeddings: lm_head shares embed_tokens */
    int qkv_bias;          /* q/k/v projections have a bias (qwen2; llama attention_bias) */
    int o_bias;            /* o_proj has a bias (llama attention_bias) */
} zn_model_dims;

/* A small Llama-shaped default (the demo's tiny model): hidden 256, 4 layers,
 * 8 heads / 4 kv heads, intermediate 688, vocab 320. Never fails. */
ZN_API void zn_model_dims_default(zn_model_dims *d);

/* Checks the fields for consistency (positive sizes, n_heads a multiple of
 * n_kv_heads, even head_dim, finite positive theta and eps, ...).
 * Returns 0 or ZN_ECONFIG with a message naming the field. */
ZN_API int zn_model_dims_validate(const zn_model_dims *d);

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
 * zn_model_dims_from_hf reads back to the same dims). Atomic: written to
 * path.tmp and renamed. Returns 0, -errno, or ZN_ECONFIG for invalid dims. */
ZN_API int zn_model_dims_write_hf(const zn_model_dims *d, const char *path);

/* ---- parameter counts ----------------------------------------------------
 * Blocks are numbered in execution order: block 0 is the embedding, blocks
 * 1..n_layers the decoder layers, block n_layers + 1 the head (final norm +
 * lm_head; lm_head counts 0 when tied to the embedding). */
ZN_API int zn_model_num_blocks(const zn_model_dims *d);

/* Number of parameters (elements) of one block; 0 for a block index out of
 * range. */
ZN_API uint64_t zn_model_block_param_count(const zn_model_dims *d, int block);

/* Total parameters (tied embeddings counted once), e.g. 6,738,415,616 for
 * Llama-2-7B. */
ZN_API uint64_t zn_model_param_count(const zn_model_dims *d);

#ifdef __cplusplus
}
#endif
#endif
