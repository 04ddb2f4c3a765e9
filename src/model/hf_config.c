/* Hugging Face config.json -> zn_model_dims: the dims' defaults and their
 * validation, the typed key readers the parsers share and the top level of
 * the parse (each family's keys; the RoPE in hf_rope.c, the windows in
 * hf_window.c, the experts in hf_moe.c). The keys and defaults follow
 * transformers' configs; anything zinc cannot compute exactly is refused
 * rather than silently ignored. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "zinc/model.h"
#include "util/json-impl.h"
#include "model/model-impl.h"
#include "util/fs-impl.h"

void zn_model_dims_default(zn_model_dims *d)
{
    memset(d, 0, sizeof *d);
    d->arch = ZN_ARCH_LLAMA;
    d->hidden = 256;
    d->n_layers = 4;
    d->n_heads = 8;
    d->n_kv_heads = 4;
    d->head_dim = 32;
    d->intermediate = 688;
    d->vocab = 320;
    d->max_pos = 2048;
    d->rope_theta = 10000.0;
    d->rope_type = ZN_ROPE_DEFAULT;
    d->rms_eps = 1e-5;
    d->tie_embeddings = 0;
    d->qkv_bias = 0;
    d->o_bias = 0;
}

/* Limits that keep every derived size (elements of any tensor, bytes of a
 * layer) far from int64 overflow; real models are orders of magnitude below. */
#define DIM_MAX ((int64_t)1 << 24)
#define LAYERS_MAX 4096

int zn_model_dims_validate(const zn_model_dims *d)
{
#define POS(f, max)                                                            \
    if (d->f <= 0 || d->f > (max))                                             \
        return zn_set_error(ZN_ECONFIG, "model dims: " #f " = %lld must be in 1..%lld", \
                            (long long)d->f, (long long)(max));
    if (d->arch != ZN_ARCH_LLAMA && d->arch != ZN_ARCH_QWEN2 && d->arch != ZN_ARCH_MISTRAL &&
        d->arch != ZN_ARCH_QWEN3 && d->arch != ZN_ARCH_PHI3 && d->arch != ZN_ARCH_OLMO2 &&
        d->arch != ZN_ARCH_GEMMA && d->arch != ZN_ARCH_GEMMA2 && d->arch != ZN_ARCH_GEMMA3 &&
        d->arch != ZN_ARCH_OLMO3 && d->arch != ZN_ARCH_QWEN3_MOE && d->arch != ZN_ARCH_MIXTRAL)
        return zn_set_error(ZN_ECONFIG, "model dims: unknown arch %d", (int)d->arch);
    int moe = d->arch == ZN_ARCH_QWEN3_MOE || d->arch == ZN_ARCH_MIXTRAL;
    if ((d->n_experts > 0) != moe)
        return zn_set_error(ZN_ECONFIG, "model dims: %s %s experts (num_experts %lld)",
                            zn_model_arch_name(d->arch), moe ? "needs" : "has no",
                            (long long)d->n_experts);
    if (d->arch == ZN_ARCH_MIXTRAL &&
        (!d->norm_topk || d->sparse_step != 1 || d->mlp_only[0] || d->mlp_only[1] ||
         d->mlp_only[2] || d->mlp_only[3] || d->moe_intermediate != d->intermediate))
        return zn_set_error(ZN_ECONFIG, "model dims: mixtral's layers are all sparse, its "
                            "experts intermediate_size wide, their weights renormalized");
    if (d->n_experts > 0) {
        if (d->n_experts > 65536 || d->top_k <= 0 || d->top_k > d->n_experts ||
            d->moe_intermediate <= 0 || d->moe_intermediate > DIM_MAX || d->sparse_step <= 0)
            return zn_set_error(ZN_ECONFIG, "model dims: num_experts %lld (1..65536), "
                                "num_experts_per_tok %lld (1..num_experts), "
                                "moe_intermediate_size %lld, decoder_sparse_step %lld (>= 1)",
                                (long long)d->n_experts, (long long)d->top_k,
                                (long long)d->moe_intermediate, (long long)d->sparse_step);
        if (!(d->router_aux_coef >= 0) || !isfinite(d->router_aux_coef))
            return zn_set_error(ZN_ECONFIG, "model dims: router_aux_loss_coef %g must be >= 0",
                                d->router_aux_coef);
        if (d->lora.r > 0 && (d->lora.targets & (ZN_LORA_GATE | ZN_LORA_UP | ZN_LORA_DOWN)))
            return zn_set_error(ZN_EUNSUPPORTED, "lora: %s: adapters on the MLP (gate_proj, "
                                "up_proj, down_proj: the experts' projections) are not built; "
                                "target q_proj, k_proj, v_proj, o_proj",
                                zn_model_arch_name(d->arch));
    }
    if (d->sliding_window < 0)
        return zn_set_error(ZN_ECONFIG, "model dims: sliding_window = %lld must be >= 0",
                            (long long)d->sliding_window);
    if (d->has_pad && (d->pad_id < 0 || d->pad_id >= d->vocab))
        return zn_set_error(ZN_ECONFIG, "model dims: pad_token_id %lld is outside the vocabulary",
                            (long long)d->pad_id);
    if (d->fused_proj != (d->arch == ZN_ARCH_PHI3))
        return zn_set_error(ZN_ECONFIG, "model dims: only phi3 stores its projections fused");
    int gem = d->arch == ZN_ARCH_GEMMA || d->arch == ZN_ARCH_GEMMA2 || d->arch == ZN_ARCH_GEMMA3;
    int g23 = d->arch == ZN_ARCH_GEMMA2 || d->arch == ZN_ARCH_GEMMA3;
    int layered = d->arch == ZN_ARCH_GEMMA3 || d->arch == ZN_ARCH_OLMO3; /* two RoPE tables */
    if (d->gemma_norm != gem || d->gelu_mlp != gem || d->embed_scaled != gem)
        return zn_set_error(ZN_ECONFIG, "model dims: only gemma, gemma2 and gemma3_text have the "
                            "(1 + w) norm, GeGLU and the scaled embedding");
    if (!g23 && (d->attn_scalar != 0 || d->attn_softcap != 0 || d->final_softcap != 0))
        return zn_set_error(ZN_ECONFIG, "model dims: only gemma2 and gemma3_text have "
                            "query_pre_attn_scalar and soft-capping");
    if (!g23 && !layered && d->full_every)
        return zn_set_error(ZN_ECONFIG, "model dims: only gemma2, gemma3_text and olmo3 have "
                            "windows on some layers");
    if (!layered && d->rope_local_theta != 0)
        return zn_set_error(ZN_ECONFIG, "model dims: only gemma3_text and olmo3 have a second "
                            "RoPE base for their sliding layers");
    if (d->full_every < 0 || !(d->attn_scalar >= 0) || !isfinite(d->attn_scalar) ||
        !(d->attn_softcap >= 0) || !isfinite(d->attn_softcap) || !(d->final_softcap >= 0) ||
        !isfinite(d->final_softcap))
        return zn_set_error(ZN_ECONFIG, "model dims: layer pattern %lld, query_pre_attn_scalar "
                            "%g, soft-caps %g / %g must be >= 0", (long long)d->full_every,
                            d->attn_scalar, d->attn_softcap, d->final_softcap);
    if (g23 && (d->sliding_window <= 0 || !(d->attn_scalar > 0)))
        return zn_set_error(ZN_ECONFIG, "model dims: %s needs a sliding_window and "
                            "query_pre_attn_scalar (got %lld, %g)", zn_model_arch_name(d->arch),
                            (long long)d->sliding_window, d->attn_scalar);
    if (layered && (d->sliding_window <= 0 || !(d->rope_local_theta > 0) ||
                    !isfinite(d->rope_local_theta)))
        return zn_set_error(ZN_ECONFIG, "model dims: %s needs a sliding_window and its sliding "
                            "layers' RoPE base (got %lld, %g)", zn_model_arch_name(d->arch),
                            (long long)d->sliding_window, d->rope_local_theta);
    int olmo = d->arch == ZN_ARCH_OLMO2 || d->arch == ZN_ARCH_OLMO3;
    int pn = olmo ? 1 : g23 ? 2 : 0;
    int qn = d->arch == ZN_ARCH_QWEN3 || d->arch == ZN_ARCH_QWEN3_MOE || d->arch == ZN_ARCH_GEMMA3
                 ? 1 : olmo ? 2 : 0;
    if (d->post_norm != pn || d->qk_norm != qn)
        return zn_set_error(ZN_ECONFIG, "model dims: %s's norms are its family's (qk_norm %d, "
                            "post_norm %d)", zn_model_arch_name(d->arch), d->qk_norm,
                            d->post_norm);
    POS(hidden, DIM_MAX);
    POS(n_layers, LAYERS_MAX);
    POS(n_heads, 4096);
    POS(n_kv_heads, 4096);
    POS(head_dim, 65536);
    POS(intermediate, DIM_MAX);
    POS(vocab, DIM_MAX);
    POS(max_pos, (int64_t)1 << 30);
#undef POS
    if (d->n_heads % d->n_kv_heads)
        return zn_set_error(ZN_ECONFIG,
                            "model dims: num_attention_heads (%lld) is not a multiple of "
                            "num_key_value_heads (%lld)",
                            (long long)d->n_heads, (long long)d->n_kv_heads);
    if (d->head_dim % 2)
        return zn_set_error(ZN_ECONFIG, "model dims: head_dim (%lld) must be even for RoPE",
                            (long long)d->head_dim);
    if (d->n_heads * d->head_dim > DIM_MAX)
        return zn_set_error(ZN_ECONFIG, "model dims: num_attention_heads x head_dim too large");
    if (!(d->rope_theta > 0) || !isfinite(d->rope_theta))
        return zn_set_error(ZN_ECONFIG, "model dims: rope_theta must be a positive number");
    if (!(d->rms_eps > 0) || !isfinite(d->rms_eps) || d->rms_eps > 1)
        return zn_set_error(ZN_ECONFIG, "model dims: rms_norm_eps must be in (0, 1]");
    if (d->lora.r < 0 || d->lora.r > 65536)
        return zn_set_error(ZN_ECONFIG, "lora: r = %d must be in 0..65536", d->lora.r);
    if (d->lora.r > 0) {
        if (!d->lora.targets || (d->lora.targets & ~(unsigned)ZN_LORA_ANY))
            return zn_set_error(ZN_ECONFIG, "lora: target_modules names no projection");
        unsigned split = ZN_LORA_Q | ZN_LORA_K | ZN_LORA_V | ZN_LORA_GATE | ZN_LORA_UP;
        unsigned fused = ZN_LORA_QKV | ZN_LORA_GATE_UP;
        if (d->fused_proj && (d->lora.targets & split))
            return zn_set_error(ZN_ECONFIG, "lora: %s has no q_proj, k_proj, v_proj, gate_proj "
                                "or up_proj: it fuses them into qkv_proj and gate_up_proj "
                                "(target_modules of it: qkv_proj, o_proj, gate_up_proj, "
                                "down_proj, or \"all-linear\")", zn_model_arch_name(d->arch));
        if (!d->fused_proj && (d->lora.targets & fused))
            return zn_set_error(ZN_ECONFIG, "lora: %s has no qkv_proj or gate_up_proj (those are "
                                "phi3's fused projections): name q_proj, k_proj, v_proj, "
                                "gate_proj, up_proj", zn_model_arch_name(d->arch));
        if (!isfinite(d->lora.alpha) || d->lora.alpha == 0)
            return zn_set_error(ZN_ECONFIG, "lora: lora_alpha must be a finite nonzero number");
        if (!(d->lora.dropout >= 0 && d->lora.dropout < 1))
            return zn_set_error(ZN_ECONFIG, "lora: lora_dropout must be in [0, 1)");
    }
    if (d->rope_type == ZN_ROPE_LLAMA3) {
        if (!(d->rope_factor >= 1) || !isfinite(d->rope_factor))
            return zn_set_error(ZN_ECONFIG, "model dims: rope_scaling.factor must be >= 1");
        if (!(d->rope_low_freq_factor > 0) || !(d->rope_high_freq_factor > d->rope_low_freq_factor) ||
            !isfinite(d->rope_high_freq_factor))
            return zn_set_error(ZN_ECONFIG, "model dims: rope_scaling needs 0 < low_freq_factor "
                                            "< high_freq_factor");
        if (d->rope_orig_max_pos <= 0)
            return zn_set_error(ZN_ECONFIG, "model dims: rope_scaling."
                                            "original_max_position_embeddings must be positive");
    } else if (d->rope_type == ZN_ROPE_LINEAR || d->rope_type == ZN_ROPE_YARN) {
        if (!layered)
            return zn_set_error(ZN_ECONFIG, "model dims: %s rope scaling is built for gemma3_text "
                                "and olmo3 only", d->rope_type == ZN_ROPE_YARN ? "yarn" : "linear");
        if (!(d->rope_factor > 0) || !isfinite(d->rope_factor))
            return zn_set_error(ZN_ECONFIG, "model dims: rope factor %g must be positive",
                                d->rope_factor);
        if (d->rope_type == ZN_ROPE_YARN &&
            (d->rope_orig_max_pos <= 0 || !(d->rope_beta_fast > 0) || !(d->rope_beta_slow > 0) ||
             !isfinite(d->rope_beta_fast) || !isfinite(d->rope_beta_slow) ||
             !(d->rope_attn_factor > 0) || !isfinite(d->rope_attn_factor)))
            return zn_set_error(ZN_ECONFIG, "model dims: yarn needs a positive "
                                "original_max_position_embeddings, beta_fast, beta_slow and "
                                "attention_factor (got %lld, %g, %g, %g)",
                                (long long)d->rope_orig_max_pos, d->rope_beta_fast,
                                d->rope_beta_slow, d->rope_attn_factor);
    } else if (d->rope_type != ZN_ROPE_DEFAULT) {
        return zn_set_error(ZN_ECONFIG, "model dims: unknown rope type %d", (int)d->rope_type);
    }
    return 0;
}

/* ---- parsing ------------------------------------------------------------ */

int zn_m_cfg_int(zn_m_cfg *c, const char *key, int required, int64_t def, int64_t *out)
{
    json_t *v = json_object_get(c->root, key);
    if (!v || json_is_null(v)) {
        if (required)
            return zn_set_error(ZN_ECONFIG, "%s: missing key '%s'", c->name, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return zn_set_error(ZN_ECONFIG, "%s: key '%s' must be an integer", c->name, key);
    json_int_t x = json_integer_value(v);
    if (x <= 0)
        return zn_set_error(ZN_ECONFIG, "%s: key '%s' must be positive, got %lld", c->name, key,
                            (long long)x);
    *out = (int64_t)x;
    return 0;
}

int zn_m_cfg_num(zn_m_cfg *c, json_t *obj, const char *where, const char *key, int required,
                      double def, double *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required)
            return zn_set_error(ZN_ECONFIG, "%s: missing key '%s%s'", c->name, where, key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return zn_set_error(ZN_ECONFIG, "%s: key '%s%s' must be a number", c->name, where, key);
    *out = json_number_value(v);
    if (!isfinite(*out))
        return zn_set_error(ZN_ECONFIG, "%s: key '%s%s' is not finite", c->name, where, key);
    return 0;
}

int zn_m_cfg_bool(zn_m_cfg *c, const char *key, int def, int *out)
{
    json_t *v = json_object_get(c->root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return zn_set_error(ZN_ECONFIG, "%s: key '%s' must be true or false", c->name, key);
    *out = json_is_true(v);
    return 0;
}

int zn_m_cfg_str(zn_m_cfg *c, const char *key, const char **out)
{
    json_t *v = json_object_get(c->root, key);
    if (!v || json_is_null(v)) {
        *out = NULL;
        return 0;
    }
    if (!json_is_string(v))
        return zn_set_error(ZN_ECONFIG, "%s: key '%s' must be a string", c->name, key);
    *out = json_string_value(v);
    return 0;
}

static int parse_root(zn_m_cfg *c, zn_model_dims *d)
{
    int rc;
    const char *s;

    if (!json_is_object(c->root))
        return zn_set_error(ZN_ECONFIG, "%s: top level must be a JSON object", c->name);
    memset(d, 0, sizeof *d);

    if ((rc = zn_m_cfg_str(c, "model_type", &s)))
        return rc;
    if (!s)
        return zn_set_error(ZN_ECONFIG, "%s: missing key 'model_type'", c->name);
    const char *missing;
    int64_t max_pos_default = 2048, head_dim_default = 0;
    if (zn_model_family_lookup(s, &d->arch, &max_pos_default, &head_dim_default, &missing)) {
        char built[128];
        zn_model_families(built, sizeof built);
        if (missing)
            return zn_set_error(ZN_EUNSUPPORTED, "%s: model_type '%s' is not built yet: it "
                                "needs %s (zinc trains %s)", c->name, s, missing, built);
        return zn_set_error(ZN_EUNSUPPORTED, "%s: model_type '%s' is not a family zinc knows "
                            "(it trains %s)", c->name, s, built);
    }

    /* the MLP's gate: silu; Gemma's tanh GELU (older Gemma configs say it in
     * hidden_activation, beside a hidden_act transformers no longer reads) */
    int gemma = d->arch == ZN_ARCH_GEMMA || d->arch == ZN_ARCH_GEMMA2 || d->arch == ZN_ARCH_GEMMA3;
    if ((rc = zn_m_cfg_str(c, gemma && json_object_get(c->root, "hidden_activation")
                             ? "hidden_activation" : "hidden_act", &s)))
        return rc;
    const char *want_act = gemma ? "gelu_pytorch_tanh" : "silu";
    if (s && strcmp(s, want_act))
        return zn_set_error(ZN_EUNSUPPORTED, "%s: %s '%s' is not supported (%s computes '%s')",
                            c->name, gemma ? "the activation" : "hidden_act", s,
                            zn_model_arch_name(d->arch), want_act);
    d->gemma_norm = d->gelu_mlp = d->embed_scaled = gemma;

    if ((rc = zn_m_cfg_int(c, "hidden_size", 1, 0, &d->hidden)) ||
        (rc = zn_m_cfg_int(c, "num_hidden_layers", 1, 0, &d->n_layers)) ||
        (rc = zn_m_cfg_int(c, "num_attention_heads", 1, 0, &d->n_heads)) ||
        (rc = zn_m_cfg_int(c, "intermediate_size", 1, 0, &d->intermediate)) ||
        (rc = zn_m_cfg_int(c, "vocab_size", 1, 0, &d->vocab)) ||
        (rc = zn_m_cfg_int(c, "num_key_value_heads", 0, d->n_heads, &d->n_kv_heads)) ||
        (rc = zn_m_cfg_int(c, "max_position_embeddings", 0, max_pos_default, &d->max_pos)))
        return rc;
    if (d->hidden % d->n_heads && !head_dim_default && !json_object_get(c->root, "head_dim"))
        return zn_set_error(ZN_ECONFIG,
                            "%s: hidden_size (%lld) is not a multiple of num_attention_heads "
                            "(%lld) and there is no 'head_dim'", c->name, (long long)d->hidden,
                            (long long)d->n_heads);
    if ((rc = zn_m_cfg_int(c, "head_dim", 0, head_dim_default ? head_dim_default
                                                         : d->hidden / d->n_heads, &d->head_dim)))
        return rc;

    if ((rc = zn_m_cfg_num(c, c->root, "", "rms_norm_eps", 0, 1e-6, &d->rms_eps)))
        return rc;
    int layered = d->arch == ZN_ARCH_GEMMA3 || d->arch == ZN_ARCH_OLMO3;
    if ((rc = layered ? zn_m_cfg_rope_layered(c, d) : zn_m_cfg_rope(c, d)))
        return rc;
    /* GemmaConfig, Gemma2Config and Gemma3TextConfig tie by default; the
     * others do not */
    if ((rc = zn_m_cfg_bool(c, "tie_word_embeddings", gemma, &d->tie_embeddings)))
        return rc;

    /* every family's embedding is nn.Embedding(vocab, hidden, padding_idx=
     * pad_token_id): the pad row gets no gradient from the lookup */
    json_t *pad = json_object_get(c->root, "pad_token_id");
    if (pad && !json_is_null(pad)) {
        if (!json_is_integer(pad))
            return zn_set_error(ZN_ECONFIG, "%s: key 'pad_token_id' must be an integer or null, "
                                "got %s", c->name, zn_json_kind(pad));
        d->pad_id = (int64_t)json_integer_value(pad);
        if (d->pad_id < 0 || d->pad_id >= d->vocab)
            return zn_set_error(ZN_ECONFIG, "%s: pad_token_id %lld is outside the vocabulary "
                                "(vocab_size %lld; transformers' embedding refuses it too)",
                                c->name, (long long)d->pad_id, (long long)d->vocab);
        d->has_pad = 1;
    }

    int flag;
    if (d->arch == ZN_ARCH_QWEN3_MOE && (rc = zn_m_cfg_moe(c, d)))
        return rc;
    if (d->arch == ZN_ARCH_MIXTRAL && (rc = zn_m_cfg_mixtral(c, d)))
        return rc;
    if (d->arch == ZN_ARCH_QWEN2 || d->arch == ZN_ARCH_QWEN3 || d->arch == ZN_ARCH_QWEN3_MOE) {
        if ((rc = zn_m_cfg_bool(c, "use_sliding_window", 0, &flag)))
            return rc;
        if (flag)
            return zn_set_error(ZN_EUNSUPPORTED,
                                "%s: use_sliding_window=true is not supported (zinc computes full "
                                "causal attention)", c->name);
    }
    if (d->arch == ZN_ARCH_PHI3) {
        /* Phi3Config: the rotary dims (phi-4-mini rotates 3/4 of each
         * head) and the training dropouts transformers applies */
        double f;
        if ((rc = zn_m_cfg_num(c, c->root, "", "partial_rotary_factor", 0, 1.0, &f)))
            return rc;
        if (f != 1.0)
            return zn_set_error(ZN_EUNSUPPORTED, "%s: partial_rotary_factor %g is not supported "
                                "(zinc rotates every dimension of a head)", c->name, f);
        static const char *const drops[] = { "resid_pdrop", "embd_pdrop", "attention_dropout" };
        for (size_t i = 0; i < sizeof drops / sizeof drops[0]; i++) {
            if ((rc = zn_m_cfg_num(c, c->root, "", drops[i], 0, 0.0, &f)))
                return rc;
            if (f != 0)
                return zn_set_error(ZN_EUNSUPPORTED, "%s: %s %g is not supported (zinc trains "
                                    "without dropout in the model; set it to 0)", c->name,
                                    drops[i], f);
        }
        d->fused_proj = 1;
    }
    if (d->arch == ZN_ARCH_MISTRAL || d->arch == ZN_ARCH_PHI3 || d->arch == ZN_ARCH_MIXTRAL) {
        /* MistralConfig's sliding_window: null (v0.2 on) or the window */
        json_t *sw = json_object_get(c->root, "sliding_window");
        if (sw && !json_is_null(sw) && (rc = zn_m_cfg_int(c, "sliding_window", 1, 0,
                                                     &d->sliding_window)))
            return rc;
    }
    int windowed = d->arch == ZN_ARCH_GEMMA2 || layered;
    if (windowed && (rc = zn_m_cfg_windowed(c, d)))
        return rc;
    /* transformers 5: per-layer attention kinds (the windowed families'
     * read above). */
    json_t *lt = json_object_get(c->root, "layer_types");
    if (lt && !json_is_null(lt) && !windowed) {
        if (!json_is_array(lt))
            return zn_set_error(ZN_ECONFIG, "%s: key 'layer_types' must be an array", c->name);
        size_t i;
        json_t *x;
        json_array_foreach(lt, i, x) {
            if (!json_is_string(x) || strcmp(json_string_value(x), "full_attention"))
                return zn_set_error(ZN_EUNSUPPORTED, "%s: layer_types[%zu] is not "
                                                     "\"full_attention\" (zinc computes full causal "
                                                     "attention only)", c->name, i);
        }
    }
    if (d->arch == ZN_ARCH_QWEN2) {
        d->qkv_bias = 1; /* Qwen2Attention: q/k/v bias=True, o_proj bias=False */
    } else if (d->arch == ZN_ARCH_MISTRAL || d->arch == ZN_ARCH_PHI3 ||
               d->arch == ZN_ARCH_MIXTRAL) {
        /* MistralAttention, Phi3Attention, MixtralAttention: no bias on any
         * projection (none reads attention_bias) */
    } else {
        /* llama, qwen3, qwen3_moe, olmo2/3, gemma, gemma2/3: attention_bias on q, k, v
         * and o alike; qwen3's and gemma3's per-head q/k norm, olmo2/3's
         * full-width one and their post-norms always */
        int olmo = d->arch == ZN_ARCH_OLMO2 || d->arch == ZN_ARCH_OLMO3;
        int g23 = d->arch == ZN_ARCH_GEMMA2 || d->arch == ZN_ARCH_GEMMA3;
        d->qk_norm = d->arch == ZN_ARCH_QWEN3 || d->arch == ZN_ARCH_QWEN3_MOE || d->arch == ZN_ARCH_GEMMA3
                         ? 1 : olmo ? 2 : 0;
        d->post_norm = olmo ? 1 : g23 ? 2 : 0;
        if ((rc = zn_m_cfg_bool(c, "attention_bias", 0, &flag)))
            return rc;
        d->qkv_bias = d->o_bias = flag;
    }
    if ((rc = zn_m_cfg_bool(c, "mlp_bias", 0, &flag)))
        return rc;
    if (flag)
        return zn_set_error(ZN_EUNSUPPORTED, "%s: mlp_bias=true is not supported", c->name);

    if ((rc = zn_model_dims_validate(d)))
        return zn_error_prefix(rc, "%s", c->name);
    return 0;
}

int zn_model_dims_from_json(zn_model_dims *d, const char *text, const char *name)
{
    json_error_t jerr;
    zn_m_cfg c = { name ? name : "config", NULL };

    c.root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!c.root)
        return zn_set_error(ZN_ECONFIG, "%s: line %d: %s", c.name, jerr.line, jerr.text);
    int rc = parse_root(&c, d);
    json_decref(c.root);
    return rc;
}

int zn_model_dims_from_hf(zn_model_dims *d, const char *path)
{
    char file[4096];
    struct stat st;
    json_error_t jerr;

    if (stat(path, &st))
        return zn_set_error(-errno, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        if ((size_t)snprintf(file, sizeof file, "%s/config.json", path) >= sizeof file)
            return zn_set_error(-ENAMETOOLONG, "%s: path too long", path);
    } else {
        if ((size_t)snprintf(file, sizeof file, "%s", path) >= sizeof file)
            return zn_set_error(-ENAMETOOLONG, "%s: path too long", path);
    }
    if (stat(file, &st))
        return zn_set_error(-errno, "%s: %s", file, strerror(errno));
    if (st.st_size > (16 << 20))
        return zn_set_error(ZN_ECONFIG, "%s: %lld bytes is too large for a config.json", file,
                            (long long)st.st_size);
    json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (access(file, R_OK))
            return zn_set_error(-errno, "%s: %s", file, strerror(errno));
        return zn_set_error(ZN_ECONFIG, "%s: line %d: %s", file, jerr.line, jerr.text);
    }
    zn_m_cfg c = { file, root };
    int rc = parse_root(&c, d);
    json_decref(root);
    return rc;
}
