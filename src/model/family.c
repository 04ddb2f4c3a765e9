/* The model families: each HF model_type zinc knows, the architecture it
 * computes with, its transformers class (written on export), its defaults,
 * and, for the families not built yet, what they need that zinc lacks, so
 * that a refusal names the missing piece instead of "not supported". One
 * table: config.json parsing, export, the plan and `zinc info` read it. */
#include <stdio.h>
#include <string.h>

#include "zinc/model.h"

typedef struct {
    const char *model_type;  /* config.json's */
    zn_model_arch arch;      /* 0: known, not built */
    const char *cls;         /* transformers' *ForCausalLM */
    int64_t max_pos;         /* max_position_embeddings when absent (its
                                PretrainedConfig's default) */
    int64_t head_dim;        /* head_dim when absent (0: hidden / heads) */
    const char *missing;     /* not built: what the family needs */
} family;

static const family families[] = {
    { "llama", ZN_ARCH_LLAMA, "LlamaForCausalLM", 2048, 0, NULL },
    { "qwen2", ZN_ARCH_QWEN2, "Qwen2ForCausalLM", 32768, 0, NULL },
    /* the Llama block under its own name (MistralConfig's defaults: 4096 x
     * 32 positions, a 4096-token sliding window unless null) */
    { "mistral", ZN_ARCH_MISTRAL, "MistralForCausalLM", 131072, 0, NULL },
    /* Qwen3Config: head_dim 128 whatever the width (Qwen3-8B's config.json
     * leaves it out) */
    { "qwen3", ZN_ARCH_QWEN3, "Qwen3ForCausalLM", 32768, 128, NULL },
    /* Qwen3MoeConfig: 32768 positions, head_dim 128; experts inside the
     * layer's block */
    { "qwen3_moe", ZN_ARCH_QWEN3_MOE, "Qwen3MoeForCausalLM", 32768, 128, NULL },
    /* MixtralConfig: 4096 x 32 positions; experts inside the layer's block,
     * under the published block_sparse_moe names */
    { "mixtral", ZN_ARCH_MIXTRAL, "MixtralForCausalLM", 131072, 0, NULL },
    { "qwen2_moe", 0, NULL, 0, 0, "mixture-of-experts layers and a shared expert" },
    /* GemmaConfig: 8192 positions, head_dim 256 */
    { "gemma", ZN_ARCH_GEMMA, "GemmaForCausalLM", 8192, 256, NULL },
    /* Gemma2Config: 8192 positions, head_dim 256; four norms a layer,
     * soft-capping, every other layer within a 4096-token window */
    { "gemma2", ZN_ARCH_GEMMA2, "Gemma2ForCausalLM", 8192, 256, NULL },
    /* Gemma3TextConfig: 131072 positions, head_dim 256; Gemma 2's block with
     * a per-head q/k norm, 5 local layers (rope_local_base_freq) : 1 global */
    { "gemma3_text", ZN_ARCH_GEMMA3, "Gemma3ForCausalLM", 131072, 256, NULL },
    { "gemma3", 0, NULL, 0, 0,
      "a vision tower (Gemma 3's multimodal model; its text_config alone is a gemma3_text "
      "config.json, which zinc trains, but the checkpoint's weights are the multimodal "
      "model's)" },
    /* Phi3Config: 4096 positions; its fused projections are zinc's tensors */
    { "phi3", ZN_ARCH_PHI3, "Phi3ForCausalLM", 4096, 0, NULL },
    /* Olmo2Config: 2048 positions */
    { "olmo2", ZN_ARCH_OLMO2, "Olmo2ForCausalLM", 2048, 0, NULL },
    /* Olmo3Config: 2048 positions; OLMo 2's block, 3 sliding layers : 1 full */
    { "olmo3", ZN_ARCH_OLMO3, "Olmo3ForCausalLM", 2048, 0, NULL },
    { "qwen3_5", 0, NULL, 0, 0,
      "linear-attention (gated delta) layers between the full-attention ones, and a vision "
      "wrapper" },
    { "qwen3_next", 0, NULL, 0, 0, "linear-attention layers and mixture-of-experts layers" },
};

#define N_FAMILIES (int)(sizeof families / sizeof families[0])

static const family *by_arch(zn_model_arch a)
{
    for (int i = 0; i < N_FAMILIES; i++)
        if (families[i].arch && families[i].arch == a)
            return &families[i];
    return NULL;
}

int zn_model_family_lookup(const char *model_type, zn_model_arch *arch, int64_t *max_pos,
                           int64_t *head_dim, const char **missing)
{
    *arch = 0;
    *missing = NULL;
    for (int i = 0; i < N_FAMILIES; i++) {
        if (strcmp(families[i].model_type, model_type))
            continue;
        *arch = families[i].arch;
        *missing = families[i].missing;
        if (max_pos)
            *max_pos = families[i].max_pos;
        if (head_dim)
            *head_dim = families[i].head_dim;
        return families[i].arch ? 0 : ZN_EUNSUPPORTED;
    }
    return ZN_EUNSUPPORTED;
}

const char *zn_model_arch_name(zn_model_arch a)
{
    const family *f = by_arch(a);
    return f ? f->model_type : "?";
}

const char *zn_model_arch_class(zn_model_arch a)
{
    const family *f = by_arch(a);
    return f ? f->cls : "?";
}

int zn_model_layer_slides(const zn_model_dims *d, int64_t layer)
{
    if (d->sliding_window <= 0)
        return 0;
    /* full_every k: every k-th layer full (k 1: all), 0: none */
    return d->full_every <= 0 || layer % d->full_every != d->full_every - 1;
}

int zn_model_layer_moe(const zn_model_dims *d, int64_t layer)
{
    if (d->n_experts <= 0 || layer < 0 || layer >= d->n_layers)
        return 0;
    if (layer < ZN_MODEL_MLP_ONLY_MAX && (d->mlp_only[layer / 64] >> (layer % 64) & 1))
        return 0;
    return d->sparse_step > 0 && (layer + 1) % d->sparse_step == 0;
}

int zn_model_check_window(const zn_model_dims *d, int64_t seq)
{
    /* a window shorter than the sequence masks the keys before it, in both
     * attentions and over the KV cache */
    if (d->sliding_window < 0 || seq <= 0)
        return zn_set_error(ZN_EARG, "model: sliding_window %lld, sequence %lld",
                            (long long)d->sliding_window, (long long)seq);
    return 0;
}

int zn_model_families(char *out, size_t len)
{
    size_t at = 0;
    int n = 0;
    if (len)
        out[0] = '\0';
    for (int i = 0; i < N_FAMILIES; i++) {
        if (!families[i].arch)
            continue;
        int w = snprintf(out + at, at < len ? len - at : 0, "%s%s", n ? ", " : "",
                         families[i].model_type);
        if (w > 0)
            at += (size_t)w;
        n++;
    }
    return n;
}
