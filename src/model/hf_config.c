/* Hugging Face config.json <-> zn_model_dims, and parameter counts. The keys
 * and defaults follow transformers' LlamaConfig and Qwen2Config; anything zinc
 * cannot compute exactly (sliding windows, other RoPE scalings, MLP bias) is
 * refused rather than silently ignored. */
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

typedef struct {
    const char *name; /* file name for messages */
    json_t *root;
} cfg_ctx;

static int get_int(cfg_ctx *c, const char *key, int required, int64_t def, int64_t *out)
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

static int get_num_in(cfg_ctx *c, json_t *obj, const char *where, const char *key, int required,
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

static int get_bool(cfg_ctx *c, const char *key, int def, int *out)
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

static int get_str(cfg_ctx *c, const char *key, const char **out)
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

static int parse_scaling(cfg_ctx *c, json_t *rs, const char *rs_name, int theta_only,
                         int layered, zn_model_dims *d);

/* RoPE: transformers < 5 writes rope_theta and rope_scaling (null or
 * {rope_type|type, ...}); transformers 5 writes rope_parameters {rope_type,
 * rope_theta, ...}. Both are read; where both give a theta they must agree. */
static int parse_rope(cfg_ctx *c, zn_model_dims *d)
{
    int rc;
    json_t *rp = json_object_get(c->root, "rope_parameters");
    json_t *rs = json_object_get(c->root, "rope_scaling");
    const char *rs_name = "rope_scaling.";
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp))
            return zn_set_error(ZN_ECONFIG, "%s: key 'rope_parameters' must be an object",
                                c->name);
        if (rs && !json_is_null(rs))
            return zn_set_error(ZN_ECONFIG, "%s: both 'rope_parameters' and 'rope_scaling' are "
                                            "set; keep one", c->name);
        rs = rp;
        rs_name = "rope_parameters.";
    }
    if ((rc = get_num_in(c, c->root, "", "rope_theta", 0, 0.0, &d->rope_theta)))
        return rc;
    if (rs == rp && rp && !json_is_null(rp)) {
        double t;
        if ((rc = get_num_in(c, rp, rs_name, "rope_theta", 0, 0.0, &t)))
            return rc;
        if (t != 0.0 && d->rope_theta != 0.0 && t != d->rope_theta)
            return zn_set_error(ZN_ECONFIG, "%s: rope_theta (%g) and rope_parameters.rope_theta "
                                            "(%g) disagree", c->name, d->rope_theta, t);
        if (t != 0.0)
            d->rope_theta = t;
    }
    if (d->rope_theta == 0.0)
        d->rope_theta = 10000.0; /* LlamaConfig / Qwen2Config default */

    d->rope_type = ZN_ROPE_DEFAULT;
    if (!rs || json_is_null(rs))
        return 0;
    if (!json_is_object(rs))
        return zn_set_error(ZN_ECONFIG, "%s: key 'rope_scaling' must be an object or null",
                            c->name);
    return parse_scaling(c, rs, rs_name, rs == rp, 0, d);
}

/* YaRN's keys (_compute_yarn_parameters): factor (default
 * max_position_embeddings / original_max_position_embeddings),
 * attention_factor (default 0.1 ln(factor) + 1), beta_fast 32, beta_slow 1
 * (0 or null: those); DeepSeek's mscale pair and truncate false are
 * refused by name. */
static int parse_yarn(cfg_ctx *c, json_t *rs, const char *rs_name, zn_model_dims *d)
{
    int rc;
    double orig, af;
    if ((rc = get_num_in(c, rs, rs_name, "original_max_position_embeddings", 0,
                         (double)d->max_pos, &orig)))
        return rc;
    if (orig != floor(orig) || orig <= 0 || orig > 1e12)
        return zn_set_error(ZN_ECONFIG, "%s: key '%soriginal_max_position_embeddings' must be a "
                            "positive integer", c->name, rs_name);
    d->rope_orig_max_pos = (int64_t)orig;
    if ((rc = get_num_in(c, rs, rs_name, "factor", 0, (double)d->max_pos / orig,
                         &d->rope_factor)) ||
        (rc = get_num_in(c, rs, rs_name, "beta_fast", 0, 0, &d->rope_beta_fast)) ||
        (rc = get_num_in(c, rs, rs_name, "beta_slow", 0, 0, &d->rope_beta_slow)) ||
        (rc = get_num_in(c, rs, rs_name, "attention_factor", 0, 0, &af)))
        return rc;
    if (d->rope_beta_fast == 0)
        d->rope_beta_fast = 32;
    if (d->rope_beta_slow == 0)
        d->rope_beta_slow = 1;
    static const char *const refused[] = { "mscale", "mscale_all_dim" };
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(rs, refused[i]);
        if (v && !json_is_null(v))
            return zn_set_error(ZN_EUNSUPPORTED, "%s: key '%s%s' is not supported (zinc's yarn "
                                "takes attention_factor, or 0.1 ln(factor) + 1)", c->name,
                                rs_name, refused[i]);
    }
    json_t *tr = json_object_get(rs, "truncate");
    if (tr && !json_is_null(tr) && !json_is_true(tr))
        return zn_set_error(ZN_EUNSUPPORTED, "%s: key '%struncate' other than true is not "
                            "supported (zinc's yarn rounds the ramp's ends to whole "
                            "dimensions)", c->name, rs_name);
    if (!(d->rope_factor > 0))
        return zn_set_error(ZN_ECONFIG, "%s: key '%sfactor' must be positive, got %g", c->name,
                            rs_name, d->rope_factor);
    d->rope_attn_factor = af != 0 ? af : d->rope_factor <= 1 ? 1.0
                                                             : 0.1 * log(d->rope_factor) + 1.0;
    d->rope_type = ZN_ROPE_YARN;
    return 0;
}

/* One rope_scaling / rope_parameters object's type and its keys into d:
 * 'default' and 'llama3'; with `layered` (gemma3_text's and olmo3's
 * full-attention layers) also 'linear' and 'yarn'. `theta_only`: an object
 * without a type is a theta alone (transformers 5's rope_parameters). */
static int parse_scaling(cfg_ctx *c, json_t *rs, const char *rs_name, int theta_only,
                         int layered, zn_model_dims *d)
{
    int rc;
    d->rope_type = ZN_ROPE_DEFAULT;
    json_t *t = json_object_get(rs, "rope_type");
    if (!t)
        t = json_object_get(rs, "type"); /* older transformers spelling */
    if (!t && theta_only)
        return 0; /* rope_parameters with only a theta */
    if (!t || !json_is_string(t))
        return zn_set_error(ZN_ECONFIG, "%s: key '%srope_type' must be a string", c->name,
                            rs_name);
    const char *type = json_string_value(t);
    if (!strcmp(type, "default"))
        return 0;
    if (layered && !strcmp(type, "linear")) {
        if ((rc = get_num_in(c, rs, rs_name, "factor", 1, 0, &d->rope_factor)))
            return rc;
        if (!(d->rope_factor > 0))
            return zn_set_error(ZN_ECONFIG, "%s: key '%sfactor' must be positive, got %g",
                                c->name, rs_name, d->rope_factor);
        d->rope_type = ZN_ROPE_LINEAR;
        return 0;
    }
    if (layered && !strcmp(type, "yarn"))
        return parse_yarn(c, rs, rs_name, d);
    if (strcmp(type, "llama3"))
        return zn_set_error(ZN_EUNSUPPORTED,
                            "%s: %srope_type '%s' is not supported (zinc implements 'default' "
                            "and 'llama3'%s)", c->name, rs_name, type,
                            layered ? ", 'linear' and 'yarn'" : "");
    double orig;
    d->rope_type = ZN_ROPE_LLAMA3;
    if ((rc = get_num_in(c, rs, rs_name, "factor", 1, 0, &d->rope_factor)) ||
        (rc = get_num_in(c, rs, rs_name, "low_freq_factor", 1, 0, &d->rope_low_freq_factor)) ||
        (rc = get_num_in(c, rs, rs_name, "high_freq_factor", 1, 0, &d->rope_high_freq_factor)) ||
        (rc = get_num_in(c, rs, rs_name, "original_max_position_embeddings", 1, 0, &orig)))
        return rc;
    if (orig != floor(orig) || orig <= 0 || orig > 1e12)
        return zn_set_error(ZN_ECONFIG,
                            "%s: key '%soriginal_max_position_embeddings' must be a positive "
                            "integer", c->name, rs_name);
    d->rope_orig_max_pos = (int64_t)orig;
    return 0;
}

/* A soft-cap key of Gemma2Config / Gemma3TextConfig: its default when
 * absent (0: none), null for none, else a positive number. */
static int get_cap(cfg_ctx *c, const char *key, double def, double *out)
{
    json_t *v = json_object_get(c->root, key);
    if ((v && json_is_null(v)) || (!v && def == 0)) {
        *out = 0;
        return 0;
    }
    int rc = get_num_in(c, c->root, "", key, 0, def, out);
    if (!rc && !(*out > 0))
        return zn_set_error(ZN_ECONFIG, "%s: key '%s' must be positive or null, got %g", c->name,
                            key, *out);
    return rc;
}

/* The keys of the families with windows on some layers (Gemma2Config,
 * Gemma3TextConfig, Olmo3Config): the scores' scalar and the two soft-caps
 * (Gemma's; capped by default in Gemma 2, not in Gemma 3), the window and
 * which layers slide (layer_types; by default one full layer every k, the
 * (i + 1) % k of the configs: Gemma 2's k 2, Gemma 3's
 * sliding_window_pattern 6, OLMo 3's 4; zinc's full_every k). */
static int parse_windowed(cfg_ctx *c, zn_model_dims *d)
{
    int rc, flag;
    int g23 = d->arch == ZN_ARCH_GEMMA2 || d->arch == ZN_ARCH_GEMMA3;
    int gemma3 = d->arch == ZN_ARCH_GEMMA3;
    const char *who = d->arch == ZN_ARCH_GEMMA2 ? "Gemma 2" : gemma3 ? "Gemma 3" : "OLMo 3";
    if (g23) {
        if ((rc = get_num_in(c, c->root, "", "query_pre_attn_scalar", 0, 256, &d->attn_scalar)))
            return rc;
        if (!(d->attn_scalar > 0))
            return zn_set_error(ZN_ECONFIG, "%s: key 'query_pre_attn_scalar' must be positive, "
                                "got %g", c->name, d->attn_scalar);
        if ((rc = get_cap(c, "attn_logit_softcapping", gemma3 ? 0 : 50.0, &d->attn_softcap)) ||
            (rc = get_cap(c, "final_logit_softcapping", gemma3 ? 0 : 30.0, &d->final_softcap)))
            return rc;
        if ((rc = get_bool(c, "use_bidirectional_attention", 0, &flag)))
            return rc;
        if (flag)
            return zn_set_error(ZN_EUNSUPPORTED, "%s: use_bidirectional_attention=true is not "
                                "supported (zinc computes causal attention)", c->name);
    }
    json_t *sw = json_object_get(c->root, "sliding_window");
    if (sw && json_is_null(sw))
        return zn_set_error(ZN_EUNSUPPORTED, "%s: sliding_window null is not supported (%s's "
                            "sliding layers need a window; transformers refuses it too)", c->name,
                            who);
    if ((rc = get_int(c, "sliding_window", 0, 4096, &d->sliding_window)))
        return rc;
    double drop;
    if ((rc = get_num_in(c, c->root, "", "attention_dropout", 0, 0.0, &drop)))
        return rc;
    if (drop != 0)
        return zn_set_error(ZN_EUNSUPPORTED, "%s: attention_dropout %g is not supported (zinc "
                            "trains without dropout in the model; set it to 0)", c->name, drop);
    d->full_every = d->arch == ZN_ARCH_GEMMA2 ? 2 : 4;
    /* Gemma3TextConfig reads sliding_window_pattern when layer_types is absent */
    if (gemma3 && (rc = get_int(c, "sliding_window_pattern", 0, 6, &d->full_every)))
        return rc;
    json_t *lt = json_object_get(c->root, "layer_types");
    if (!lt || json_is_null(lt))
        return 0;
    if (!json_is_array(lt) || (int64_t)json_array_size(lt) != d->n_layers)
        return zn_set_error(ZN_ECONFIG, "%s: key 'layer_types' must be an array of "
                            "num_hidden_layers (%lld) strings", c->name, (long long)d->n_layers);
    /* the pattern: every k-th layer full (k - 1 sliding ones before each),
     * k = 1 none sliding, none full: all sliding (full_every 0) */
    int64_t k = 0;
    for (size_t i = 0; i < json_array_size(lt) && !k; i++) {
        json_t *x = json_array_get(lt, i);
        if (json_is_string(x) && !strcmp(json_string_value(x), "full_attention"))
            k = (int64_t)i + 1;
    }
    d->full_every = k;
    for (size_t i = 0; i < json_array_size(lt); i++) {
        json_t *x = json_array_get(lt, i);
        const char *want = zn_model_layer_slides(d, (int64_t)i) ? "sliding_attention"
                                                                : "full_attention";
        if (!json_is_string(x) || strcmp(json_string_value(x), want))
            return zn_set_error(ZN_EUNSUPPORTED, "%s: layer_types[%zu] is not \"%s\": zinc "
                                "computes a full-attention layer every k layers (k - 1 "
                                "sliding_attention ones before each), or all alike", c->name, i,
                                want);
    }
    return 0;
}

/* gemma3_text's and olmo3's RoPE, per layer type. transformers 5 writes
 * rope_parameters {"sliding_attention": {rope_type, rope_theta},
 * "full_attention": {rope_type, rope_theta, factor, ...}}; 4.x wrote
 * rope_theta and rope_scaling (the full-attention layers') and, for
 * gemma3, rope_local_base_freq (the sliding layers'). The sliding layers
 * rotate unscaled. */
static int parse_rope_layered(cfg_ctx *c, zn_model_dims *d)
{
    int rc, gemma3 = d->arch == ZN_ARCH_GEMMA3;
    /* Gemma3TextConfig.default_theta (global, local), Olmo3Config's */
    double def_full = gemma3 ? 1000000.0 : 500000.0, def_local = gemma3 ? 10000.0 : 500000.0;
    json_t *rp = json_object_get(c->root, "rope_parameters");
    json_t *rs = json_object_get(c->root, "rope_scaling");
    json_t *lb = json_object_get(c->root, "rope_local_base_freq");
    double theta, local;
    if ((rc = get_num_in(c, c->root, "", "rope_theta", 0, 0.0, &theta)) ||
        (rc = get_num_in(c, c->root, "", "rope_local_base_freq", 0, 0.0, &local)))
        return rc;
    if (!gemma3 && lb && !json_is_null(lb))
        return zn_set_error(ZN_EUNSUPPORTED, "%s: key 'rope_local_base_freq' is Gemma 3's, not "
                            "%s's (its sliding layers rotate with rope_theta)", c->name,
                            zn_model_arch_name(d->arch));
    d->rope_type = ZN_ROPE_DEFAULT;
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp))
            return zn_set_error(ZN_ECONFIG, "%s: key 'rope_parameters' must be an object",
                                c->name);
        if ((rs && !json_is_null(rs)) || theta != 0 || local != 0)
            return zn_set_error(ZN_ECONFIG, "%s: rope_parameters beside rope_scaling, rope_theta "
                                "or rope_local_base_freq: keep rope_parameters alone (one "
                                "object per layer type)", c->name);
        const char *key;
        json_t *v;
        json_object_foreach(rp, key, v) {
            if (strcmp(key, "sliding_attention") && strcmp(key, "full_attention"))
                return zn_set_error(ZN_EUNSUPPORTED, "%s: key 'rope_parameters.%s' is not "
                                    "supported (%s's rope_parameters holds one object per layer "
                                    "type: sliding_attention, full_attention)", c->name, key,
                                    zn_model_arch_name(d->arch));
            if (!json_is_null(v) && !json_is_object(v))
                return zn_set_error(ZN_ECONFIG, "%s: key 'rope_parameters.%s' must be an object",
                                    c->name, key);
        }
        json_t *full = json_object_get(rp, "full_attention");
        json_t *sl = json_object_get(rp, "sliding_attention");
        d->rope_theta = def_full;
        d->rope_local_theta = def_local;
        if (full && !json_is_null(full) &&
            ((rc = get_num_in(c, full, "rope_parameters.full_attention.", "rope_theta", 0,
                              def_full, &d->rope_theta)) ||
             (rc = parse_scaling(c, full, "rope_parameters.full_attention.", 1, 1, d))))
            return rc;
        if (sl && !json_is_null(sl)) {
            zn_model_dims tmp = *d;
            if ((rc = get_num_in(c, sl, "rope_parameters.sliding_attention.", "rope_theta", 0,
                                 def_local, &d->rope_local_theta)) ||
                (rc = parse_scaling(c, sl, "rope_parameters.sliding_attention.", 1, 1, &tmp)))
                return rc;
            if (tmp.rope_type != ZN_ROPE_DEFAULT)
                return zn_set_error(ZN_EUNSUPPORTED, "%s: a rope_parameters.sliding_attention."
                                    "rope_type other than 'default' is not supported (zinc "
                                    "scales the full-attention layers' RoPE only, as %s's "
                                    "checkpoints do)", c->name, zn_model_arch_name(d->arch));
        }
        return 0;
    }
    d->rope_theta = theta != 0 ? theta : def_full;
    if (gemma3) {
        d->rope_local_theta = local != 0 ? local : def_local;
    } else {
        /* transformers 4.x rotates OLMo 3's sliding layers with rope_theta;
         * 5.x (Olmo3Config.convert_rope_params_to_dict) with its default
         * 500000 whatever rope_theta says: they agree only there */
        if (theta != 0 && theta != def_full)
            return zn_set_error(ZN_EUNSUPPORTED, "%s: rope_theta %g without rope_parameters is "
                                "ambiguous for olmo3 (transformers 4.x rotates the sliding "
                                "layers with it, 5.x with 500000): give rope_parameters per "
                                "layer type", c->name, theta);
        d->rope_local_theta = d->rope_theta;
    }
    if (!rs || json_is_null(rs))
        return 0;
    if (!json_is_object(rs))
        return zn_set_error(ZN_ECONFIG, "%s: key 'rope_scaling' must be an object or null",
                            c->name);
    return parse_scaling(c, rs, "rope_scaling.", 0, 1, d);
}

/* Qwen3MoeConfig's experts (its defaults when absent: 128 experts, 8 a
 * token, 768 wide, renormalized, every layer sparse, no aux loss at
 * coefficient 0.001). */
static int parse_moe(cfg_ctx *c, zn_model_dims *d)
{
    int rc;
    int64_t local = 0;
    /* the published configs say num_experts, transformers 5 writes it as
     * num_local_experts (its attribute_map) */
    if ((rc = get_int(c, "num_local_experts", 0, 0, &local)) ||
        (rc = get_int(c, "num_experts", 0, local ? local : 128, &d->n_experts)))
        return rc;
    if (local && local != d->n_experts)
        return zn_set_error(ZN_ECONFIG, "%s: num_experts (%lld) and num_local_experts (%lld) "
                            "disagree", c->name, (long long)d->n_experts, (long long)local);
    if ((rc = get_int(c, "num_experts_per_tok", 0, 8, &d->top_k)) ||
        (rc = get_int(c, "moe_intermediate_size", 0, 768, &d->moe_intermediate)) ||
        (rc = get_int(c, "decoder_sparse_step", 0, 1, &d->sparse_step)) ||
        (rc = get_bool(c, "norm_topk_prob", 0, &d->norm_topk)) ||
        (rc = get_bool(c, "output_router_logits", 0, &d->router_logits)) ||
        (rc = get_num_in(c, c->root, "", "router_aux_loss_coef", 0, 0.001, &d->router_aux_coef)))
        return rc;
    if (d->top_k > d->n_experts)
        return zn_set_error(ZN_ECONFIG, "%s: num_experts_per_tok %lld is more than num_experts "
                            "%lld", c->name, (long long)d->top_k, (long long)d->n_experts);
    json_t *ml = json_object_get(c->root, "mlp_only_layers");
    if (ml && !json_is_null(ml)) {
        if (!json_is_array(ml))
            return zn_set_error(ZN_ECONFIG, "%s: key 'mlp_only_layers' must be an array of layer "
                                "indices", c->name);
        size_t i;
        json_t *x;
        json_array_foreach(ml, i, x) {
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) >= d->n_layers)
                return zn_set_error(ZN_ECONFIG, "%s: mlp_only_layers[%zu] must be a layer index "
                                    "in 0..%lld", c->name, i, (long long)d->n_layers - 1);
            json_int_t l = json_integer_value(x);
            if (l >= ZN_MODEL_MLP_ONLY_MAX)
                return zn_set_error(ZN_EUNSUPPORTED, "%s: mlp_only_layers[%zu] = %lld: zinc "
                                    "takes dense layers below %d", c->name, i, (long long)l,
                                    ZN_MODEL_MLP_ONLY_MAX);
            d->mlp_only[l / 64] |= (uint64_t)1 << (l % 64);
        }
    }
    return 0;
}

/* MixtralConfig's experts (its defaults when absent: 8, 2 a token, as wide
 * as intermediate_size, always renormalized; no aux loss at 0.001). */
static int parse_mixtral(cfg_ctx *c, zn_model_dims *d)
{
    int rc;
    int64_t named = 0;
    double jitter;
    /* num_local_experts; num_experts is its attribute_map name */
    if ((rc = get_int(c, "num_experts", 0, 0, &named)) ||
        (rc = get_int(c, "num_local_experts", 0, named ? named : 8, &d->n_experts)) ||
        (rc = get_int(c, "num_experts_per_tok", 0, 2, &d->top_k)) ||
        (rc = get_bool(c, "output_router_logits", 0, &d->router_logits)) ||
        (rc = get_num_in(c, c->root, "", "router_aux_loss_coef", 0, 0.001, &d->router_aux_coef)) ||
        (rc = get_num_in(c, c->root, "", "router_jitter_noise", 0, 0.0, &jitter)))
        return rc;
    if (named && named != d->n_experts)
        return zn_set_error(ZN_ECONFIG, "%s: num_experts (%lld) and num_local_experts (%lld) "
                            "disagree", c->name, (long long)named, (long long)d->n_experts);
    if (jitter != 0)
        return zn_set_error(ZN_EUNSUPPORTED, "%s: router_jitter_noise %g is not supported (zinc "
                            "routes without the training-time jitter; set it to 0)", c->name,
                            jitter);
    if (d->top_k > d->n_experts)
        return zn_set_error(ZN_ECONFIG, "%s: num_experts_per_tok %lld is more than "
                            "num_local_experts %lld", c->name, (long long)d->top_k,
                            (long long)d->n_experts);
    d->moe_intermediate = d->intermediate;
    d->norm_topk = 1;
    d->sparse_step = 1;
    return 0;
}

static int parse_root(cfg_ctx *c, zn_model_dims *d)
{
    int rc;
    const char *s;

    if (!json_is_object(c->root))
        return zn_set_error(ZN_ECONFIG, "%s: top level must be a JSON object", c->name);
    memset(d, 0, sizeof *d);

    if ((rc = get_str(c, "model_type", &s)))
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
    if ((rc = get_str(c, gemma && json_object_get(c->root, "hidden_activation")
                             ? "hidden_activation" : "hidden_act", &s)))
        return rc;
    const char *want_act = gemma ? "gelu_pytorch_tanh" : "silu";
    if (s && strcmp(s, want_act))
        return zn_set_error(ZN_EUNSUPPORTED, "%s: %s '%s' is not supported (%s computes '%s')",
                            c->name, gemma ? "the activation" : "hidden_act", s,
                            zn_model_arch_name(d->arch), want_act);
    d->gemma_norm = d->gelu_mlp = d->embed_scaled = gemma;

    if ((rc = get_int(c, "hidden_size", 1, 0, &d->hidden)) ||
        (rc = get_int(c, "num_hidden_layers", 1, 0, &d->n_layers)) ||
        (rc = get_int(c, "num_attention_heads", 1, 0, &d->n_heads)) ||
        (rc = get_int(c, "intermediate_size", 1, 0, &d->intermediate)) ||
        (rc = get_int(c, "vocab_size", 1, 0, &d->vocab)) ||
        (rc = get_int(c, "num_key_value_heads", 0, d->n_heads, &d->n_kv_heads)) ||
        (rc = get_int(c, "max_position_embeddings", 0, max_pos_default, &d->max_pos)))
        return rc;
    if (d->hidden % d->n_heads && !head_dim_default && !json_object_get(c->root, "head_dim"))
        return zn_set_error(ZN_ECONFIG,
                            "%s: hidden_size (%lld) is not a multiple of num_attention_heads "
                            "(%lld) and there is no 'head_dim'", c->name, (long long)d->hidden,
                            (long long)d->n_heads);
    if ((rc = get_int(c, "head_dim", 0, head_dim_default ? head_dim_default
                                                         : d->hidden / d->n_heads, &d->head_dim)))
        return rc;

    if ((rc = get_num_in(c, c->root, "", "rms_norm_eps", 0, 1e-6, &d->rms_eps)))
        return rc;
    int layered = d->arch == ZN_ARCH_GEMMA3 || d->arch == ZN_ARCH_OLMO3;
    if ((rc = layered ? parse_rope_layered(c, d) : parse_rope(c, d)))
        return rc;
    /* GemmaConfig, Gemma2Config and Gemma3TextConfig tie by default; the
     * others do not */
    if ((rc = get_bool(c, "tie_word_embeddings", gemma, &d->tie_embeddings)))
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
    if (d->arch == ZN_ARCH_QWEN3_MOE && (rc = parse_moe(c, d)))
        return rc;
    if (d->arch == ZN_ARCH_MIXTRAL && (rc = parse_mixtral(c, d)))
        return rc;
    if (d->arch == ZN_ARCH_QWEN2 || d->arch == ZN_ARCH_QWEN3 || d->arch == ZN_ARCH_QWEN3_MOE) {
        if ((rc = get_bool(c, "use_sliding_window", 0, &flag)))
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
        if ((rc = get_num_in(c, c->root, "", "partial_rotary_factor", 0, 1.0, &f)))
            return rc;
        if (f != 1.0)
            return zn_set_error(ZN_EUNSUPPORTED, "%s: partial_rotary_factor %g is not supported "
                                "(zinc rotates every dimension of a head)", c->name, f);
        static const char *const drops[] = { "resid_pdrop", "embd_pdrop", "attention_dropout" };
        for (size_t i = 0; i < sizeof drops / sizeof drops[0]; i++) {
            if ((rc = get_num_in(c, c->root, "", drops[i], 0, 0.0, &f)))
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
        if (sw && !json_is_null(sw) && (rc = get_int(c, "sliding_window", 1, 0,
                                                     &d->sliding_window)))
            return rc;
    }
    int windowed = d->arch == ZN_ARCH_GEMMA2 || layered;
    if (windowed && (rc = parse_windowed(c, d)))
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
        if ((rc = get_bool(c, "attention_bias", 0, &flag)))
            return rc;
        d->qkv_bias = d->o_bias = flag;
    }
    if ((rc = get_bool(c, "mlp_bias", 0, &flag)))
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
    cfg_ctx c = { name ? name : "config", NULL };

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
    cfg_ctx c = { file, root };
    int rc = parse_root(&c, d);
    json_decref(root);
    return rc;
}

/* ---- writing ------------------------------------------------------------ */

static int set_or_fail(json_t *o, const char *k, json_t *v)
{
    if (!v || json_object_set_new(o, k, v))
        return -1;
    return 0;
}

/* One layer type's RoPE object of transformers 5's rope_parameters. */
static json_t *rope_object(double theta, const zn_model_dims *d, int scaled)
{
    json_t *r = json_object();
    if (!r)
        return NULL;
    int bad = set_or_fail(r, "rope_theta", json_real(theta));
    zn_rope_type t = scaled ? d->rope_type : ZN_ROPE_DEFAULT;
    const char *name = t == ZN_ROPE_LLAMA3 ? "llama3" : t == ZN_ROPE_LINEAR ? "linear"
                       : t == ZN_ROPE_YARN ? "yarn" : "default";
    bad |= set_or_fail(r, "rope_type", json_string(name));
    if (t != ZN_ROPE_DEFAULT)
        bad |= set_or_fail(r, "factor", json_real(d->rope_factor));
    if (t == ZN_ROPE_LLAMA3) {
        bad |= set_or_fail(r, "low_freq_factor", json_real(d->rope_low_freq_factor));
        bad |= set_or_fail(r, "high_freq_factor", json_real(d->rope_high_freq_factor));
    }
    if (t == ZN_ROPE_LLAMA3 || t == ZN_ROPE_YARN)
        bad |= set_or_fail(r, "original_max_position_embeddings",
                           json_integer(d->rope_orig_max_pos));
    if (t == ZN_ROPE_YARN) {
        bad |= set_or_fail(r, "beta_fast", json_real(d->rope_beta_fast));
        bad |= set_or_fail(r, "beta_slow", json_real(d->rope_beta_slow));
        bad |= set_or_fail(r, "attention_factor", json_real(d->rope_attn_factor));
    }
    if (bad) {
        json_decref(r);
        return NULL;
    }
    return r;
}

/* The windowed families' keys (Gemma2Config, Gemma3TextConfig,
 * Olmo3Config), layer_types spelled out (transformers 5 reads it; 4.x
 * computes the same default pattern), and for gemma3_text and olmo3 the
 * RoPE of each layer type as transformers 5's rope_parameters (5.x reads
 * OLMo 3's 4.x keys with the sliding layers at 500000 whatever rope_theta
 * says). Nonzero on a failed set. */
static int write_windowed(json_t *o, const zn_model_dims *d)
{
    int bad = 0;
    if (d->arch != ZN_ARCH_OLMO3) {
        bad |= set_or_fail(o, "hidden_activation", json_string("gelu_pytorch_tanh"));
        /* Gemma2Config types it int: written as one when it is whole */
        double qs = d->attn_scalar;
        bad |= set_or_fail(o, "query_pre_attn_scalar", qs == floor(qs) && qs < 1e15
                                                           ? json_integer((json_int_t)qs)
                                                           : json_real(qs));
        bad |= set_or_fail(o, "attn_logit_softcapping",
                           d->attn_softcap > 0 ? json_real(d->attn_softcap) : json_null());
        bad |= set_or_fail(o, "final_logit_softcapping",
                           d->final_softcap > 0 ? json_real(d->final_softcap) : json_null());
    }
    if (d->rope_local_theta > 0) {
        json_t *rp = json_object();
        bad |= !rp;
        if (rp) {
            bad |= set_or_fail(rp, "full_attention", rope_object(d->rope_theta, d, 1));
            bad |= set_or_fail(rp, "sliding_attention", rope_object(d->rope_local_theta, d, 0));
        }
        bad |= set_or_fail(o, "rope_parameters", rp);
    }
    bad |= set_or_fail(o, "sliding_window", json_integer(d->sliding_window));
    json_t *lt = json_array();
    bad |= !lt;
    for (int64_t l = 0; lt && l < d->n_layers; l++)
        bad |= json_array_append_new(lt, json_string(zn_model_layer_slides(d, l)
                                                         ? "sliding_attention"
                                                         : "full_attention"));
    return bad | set_or_fail(o, "layer_types", lt);
}

/* Qwen3MoeConfig's keys (MixtralConfig's: its experts and the aux loss).
 * Nonzero on a failed set. */
static int write_moe(json_t *o, const zn_model_dims *d)
{
    if (d->arch == ZN_ARCH_MIXTRAL) {
        int bad = set_or_fail(o, "num_local_experts", json_integer(d->n_experts));
        bad |= set_or_fail(o, "num_experts_per_tok", json_integer(d->top_k));
        bad |= set_or_fail(o, "output_router_logits", json_boolean(d->router_logits));
        bad |= set_or_fail(o, "router_aux_loss_coef", json_real(d->router_aux_coef));
        return bad | set_or_fail(o, "router_jitter_noise", json_real(0.0));
    }
    int bad = set_or_fail(o, "num_experts", json_integer(d->n_experts));
    bad |= set_or_fail(o, "num_experts_per_tok", json_integer(d->top_k));
    bad |= set_or_fail(o, "moe_intermediate_size", json_integer(d->moe_intermediate));
    bad |= set_or_fail(o, "norm_topk_prob", json_boolean(d->norm_topk));
    bad |= set_or_fail(o, "decoder_sparse_step", json_integer(d->sparse_step));
    bad |= set_or_fail(o, "output_router_logits", json_boolean(d->router_logits));
    bad |= set_or_fail(o, "router_aux_loss_coef", json_real(d->router_aux_coef));
    json_t *ml = json_array();
    bad |= !ml;
    for (int64_t l = 0; ml && l < d->n_layers && l < ZN_MODEL_MLP_ONLY_MAX; l++)
        if (d->mlp_only[l / 64] >> (l % 64) & 1)
            bad |= json_array_append_new(ml, json_integer(l));
    return bad | set_or_fail(o, "mlp_only_layers", ml);
}

int zn_model_dims_write_hf(const zn_model_dims *d, const char *path)
{
    return zn_model_dims_write_hf_as(d, path, ZN_DTYPE_BF16);
}

int zn_model_dims_write_hf_as(const zn_model_dims *d, const char *path, zn_dtype dtype)
{
    int rc = zn_model_dims_validate(d);
    if (rc)
        return rc;
    int ab = d->arch == ZN_ARCH_LLAMA || d->arch == ZN_ARCH_QWEN3 || d->arch == ZN_ARCH_OLMO2 ||
             d->arch == ZN_ARCH_QWEN3_MOE || d->arch == ZN_ARCH_GEMMA || d->arch == ZN_ARCH_GEMMA2 ||
             d->arch == ZN_ARCH_GEMMA3 || d->arch == ZN_ARCH_OLMO3; /* writes attention_bias */
    int windowed = d->arch == ZN_ARCH_GEMMA2 || d->arch == ZN_ARCH_GEMMA3 ||
                   d->arch == ZN_ARCH_OLMO3;
    if (d->o_bias != d->qkv_bias && ab)
        return zn_set_error(ZN_ECONFIG, "model dims: %s's attention_bias covers q/k/v and o "
                                        "alike; qkv_bias != o_bias cannot be written",
                            zn_model_arch_name(d->arch));

    if (d->arch == ZN_ARCH_QWEN2 && (!d->qkv_bias || d->o_bias))
        return zn_set_error(ZN_ECONFIG, "model dims: qwen2 always has q/k/v bias and no o bias");
    if ((d->arch == ZN_ARCH_MISTRAL || d->arch == ZN_ARCH_PHI3 || d->arch == ZN_ARCH_MIXTRAL) &&
        (d->qkv_bias || d->o_bias))
        return zn_set_error(ZN_ECONFIG, "model dims: %s has no attention bias",
                            zn_model_arch_name(d->arch));

    int is_qwen = d->arch == ZN_ARCH_QWEN2;
    json_t *o = json_object();
    int bad = !o;
    if (!bad) {
        json_t *arch = json_array();
        bad |= !arch || json_array_append_new(arch, json_string(zn_model_arch_class(d->arch)));
        bad |= set_or_fail(o, "architectures", arch);
        bad |= set_or_fail(o, "model_type", json_string(zn_model_arch_name(d->arch)));
        bad |= set_or_fail(o, "hidden_act",
                           json_string(d->gelu_mlp ? "gelu_pytorch_tanh" : "silu"));
        bad |= set_or_fail(o, "hidden_size", json_integer(d->hidden));
        bad |= set_or_fail(o, "intermediate_size", json_integer(d->intermediate));
        bad |= set_or_fail(o, "num_hidden_layers", json_integer(d->n_layers));
        bad |= set_or_fail(o, "num_attention_heads", json_integer(d->n_heads));
        bad |= set_or_fail(o, "num_key_value_heads", json_integer(d->n_kv_heads));
        bad |= set_or_fail(o, "head_dim", json_integer(d->head_dim));
        bad |= set_or_fail(o, "vocab_size", json_integer(d->vocab));
        bad |= set_or_fail(o, "max_position_embeddings", json_integer(d->max_pos));
        if (d->rope_local_theta <= 0) /* else in rope_parameters */
            bad |= set_or_fail(o, "rope_theta", json_real(d->rope_theta));
        bad |= set_or_fail(o, "rms_norm_eps", json_real(d->rms_eps));
        bad |= set_or_fail(o, "tie_word_embeddings", json_boolean(d->tie_embeddings));
        if (d->has_pad)
            bad |= set_or_fail(o, "pad_token_id", json_integer(d->pad_id));
        /* transformers < 5 reads torch_dtype, 5 and later dtype: write both,
         * so that a default from_pretrained loads the weights as stored */
        const char *tdt = dtype == ZN_DTYPE_F32 ? "float32"
                          : dtype == ZN_DTYPE_F16 ? "float16" : "bfloat16";
        bad |= set_or_fail(o, "torch_dtype", json_string(tdt));
        bad |= set_or_fail(o, "dtype", json_string(tdt));
        if (ab)
            bad |= set_or_fail(o, "attention_bias", json_boolean(d->qkv_bias));
        if (windowed)
            bad |= write_windowed(o, d);
        if (d->n_experts > 0)
            bad |= write_moe(o, d);
        if (is_qwen || d->arch == ZN_ARCH_QWEN3 || d->arch == ZN_ARCH_QWEN3_MOE)
            bad |= set_or_fail(o, "use_sliding_window", json_false());
        else if (d->arch == ZN_ARCH_MISTRAL || d->arch == ZN_ARCH_PHI3 ||
                 d->arch == ZN_ARCH_MIXTRAL)
            bad |= set_or_fail(o, "sliding_window", d->sliding_window
                                                        ? json_integer(d->sliding_window)
                                                        : json_null());
        if (d->rope_local_theta > 0) {
            /* in rope_parameters (write_windowed) */
        } else if (d->rope_type == ZN_ROPE_LLAMA3) {
            json_t *rs = json_object();
            bad |= !rs;
            if (rs) {
                bad |= set_or_fail(rs, "rope_type", json_string("llama3"));
                bad |= set_or_fail(rs, "factor", json_real(d->rope_factor));
                bad |= set_or_fail(rs, "low_freq_factor", json_real(d->rope_low_freq_factor));
                bad |= set_or_fail(rs, "high_freq_factor", json_real(d->rope_high_freq_factor));
                bad |= set_or_fail(rs, "original_max_position_embeddings",
                                   json_integer(d->rope_orig_max_pos));
            }
            bad |= set_or_fail(o, "rope_scaling", rs);
        } else {
            bad |= set_or_fail(o, "rope_scaling", json_null());
        }
    }
    if (bad) {
        json_decref(o);
        return zn_set_error(-ENOMEM, "%s: out of memory building config.json", path);
    }
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!text)
        return zn_set_error(-ENOMEM, "%s: out of memory writing config.json", path);
    rc = zn_fs_write_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

/* ---- parameter counts --------------------------------------------------- */

int zn_model_num_blocks(const zn_model_dims *d)
{
    return (int)d->n_layers + 2;
}

static uint64_t base_count(const zn_model_dims *d, int block)
{
    uint64_t h = (uint64_t)d->hidden, v = (uint64_t)d->vocab;
    uint64_t qd = (uint64_t)(d->n_heads * d->head_dim), kvd = (uint64_t)(d->n_kv_heads * d->head_dim);
    if (block < 0 || block > d->n_layers + 1)
        return 0;
    if (block == 0)
        return v * h;
    if (block == d->n_layers + 1)
        return h + (d->tie_embeddings ? 0 : v * h);
    uint64_t n = 2 * h;                           /* input + post-attention RMSNorm */
    if (d->post_norm == 2)
        n += 2 * h;                               /* pre- and post-feedforward */
    n += h * qd + 2 * h * kvd + qd * h;           /* q, k, v, o */
    if (d->qkv_bias)
        n += qd + 2 * kvd;
    if (d->o_bias)
        n += h;
    if (d->qk_norm == 1)
        n += 2 * (uint64_t)d->head_dim;           /* q_norm, k_norm: per head */
    else if (d->qk_norm == 2)
        n += qd + kvd;                            /* over the whole projections */
    if (zn_model_layer_moe(d, block - 1))         /* the router, each expert's three */
        n += (uint64_t)d->n_experts * (h + 3 * h * (uint64_t)d->moe_intermediate);
    else
        n += 3 * h * (uint64_t)d->intermediate;   /* gate, up, down */
    return n;
}

/* in and out features of LoRA target t */
static void lora_shape(const zn_model_dims *d, unsigned t, uint64_t *in, uint64_t *out)
{
    uint64_t h = (uint64_t)d->hidden, i = (uint64_t)d->intermediate;
    uint64_t qd = (uint64_t)(d->n_heads * d->head_dim), kvd = (uint64_t)(d->n_kv_heads * d->head_dim);
    *in = h;
    switch (t) {
    case ZN_LORA_Q: *out = qd; break;
    case ZN_LORA_K: case ZN_LORA_V: *out = kvd; break;
    case ZN_LORA_O: *in = qd; *out = h; break;
    case ZN_LORA_GATE: case ZN_LORA_UP: *out = i; break;
    case ZN_LORA_QKV: *out = qd + 2 * kvd; break;
    case ZN_LORA_GATE_UP: *out = 2 * i; break;
    default: *in = i; *out = h; break; /* down */
    }
}

uint64_t zn_model_block_param_count(const zn_model_dims *d, int block)
{
    uint64_t n = base_count(d, block);
    if (d->lora.r > 0 && block >= 1 && block <= d->n_layers)
        for (unsigned t = 1; t <= ZN_LORA_LAST; t <<= 1)
            if (d->lora.targets & t) {
                uint64_t in, out;
                lora_shape(d, t, &in, &out);
                n += (uint64_t)d->lora.r * (in + out);
            }
    return n;
}

uint64_t zn_model_block_frozen_count(const zn_model_dims *d, int block)
{
    return d->lora.r > 0 ? base_count(d, block) : 0;
}

/* Rows of the embedding / lm_head per part: as many as keep a part (the
 * head's first with the final norm) within one decoder layer's own
 * parameters, spread evenly over the parts; at most MAX_PARTS parts (only a
 * toy's layers are that small against its vocabulary: Qwen2.5-7B and 14B
 * take 3). */
#define MAX_PARTS 32
static int64_t part_rows(const zn_model_dims *d, int *nparts)
{
    int64_t V = d->vocab, H = d->hidden;
    int64_t most = (int64_t)(base_count(d, 1) / (uint64_t)H) - 1;
    if (most < 1 || V <= most) {
        *nparts = 1;
        return V;
    }
    int64_t k = (V + most - 1) / most;
    if (k > MAX_PARTS)
        k = MAX_PARTS;
    *nparts = (int)k;
    return (V + k - 1) / k;
}

int zn_model_block_parts(const zn_model_dims *d, int block)
{
    if (block < 0 || block > d->n_layers + 1)
        return 0;
    if (block > 0 && block <= d->n_layers)
        return 1;
    if (block == d->n_layers + 1 && d->tie_embeddings)
        return 1;
    int k;
    part_rows(d, &k);
    return k;
}

int zn_model_num_parts(const zn_model_dims *d)
{
    return zn_model_block_parts(d, 0) + (int)d->n_layers + zn_model_block_parts(d, (int)d->n_layers + 1);
}

int zn_model_part(const zn_model_dims *d, int index, zn_model_part_info *out)
{
    memset(out, 0, sizeof *out);
    int e = zn_model_block_parts(d, 0), L = (int)d->n_layers;
    int h = zn_model_block_parts(d, L + 1);
    if (index < 0 || index >= e + L + h)
        return zn_set_error(ZN_EARG, "model: no part %d (the model has %d)", index, e + L + h);
    int k;
    int64_t rows = part_rows(d, &k), H = d->hidden, V = d->vocab;
    if (index >= e && index < e + L) {
        out->block = index - e + 1;
        out->nparts = 1;
        out->n = zn_model_block_param_count(d, out->block);
        return 0;
    }
    int head = index >= e + L;
    out->block = head ? L + 1 : 0;
    out->part = head ? index - e - L : index;
    out->nparts = head ? h : e;
    out->row0 = (int64_t)out->part * rows;
    out->rows = V - out->row0 < rows ? V - out->row0 : rows;
    if (head && d->tie_embeddings) {
        out->rows = V; /* the resident table's view: only the norm is the head's own */
        out->n = (uint64_t)H;
        return 0;
    }
    uint64_t lead = head ? (uint64_t)H : 0; /* the final norm, in the head's part 0 */
    out->first = out->part ? lead + (uint64_t)(out->row0 * H) : 0;
    out->n = (uint64_t)(out->rows * H) + (out->part ? 0 : lead);
    return 0;
}

uint64_t zn_model_trainable_count(const zn_model_dims *d)
{
    uint64_t n = 0;
    for (int b = 0; b < zn_model_num_blocks(d); b++)
        n += zn_model_block_param_count(d, b) - zn_model_block_frozen_count(d, b);
    return n;
}

void zn_lora_fit_family(zn_model_dims *d)
{
    unsigned split = ZN_LORA_Q | ZN_LORA_K | ZN_LORA_V | ZN_LORA_GATE | ZN_LORA_UP;
    if (d->fused_proj && (d->lora.targets & ZN_LORA_ALL) == ZN_LORA_ALL)
        d->lora.targets = (d->lora.targets & ~split) | ZN_LORA_QKV | ZN_LORA_GATE_UP;
    /* qwen3_moe: PEFT's all-linear finds the attention's nn.Linear layers
     * (transformers 5 keeps the experts as 3-D parameters and the router
     * as its own module); the dense layers' MLPs (mlp_only_layers) it would
     * would adapt too are not built for adapters: with every layer sparse
     * all-linear is the attention, with a dense one zn_model_dims_validate
     * refuses its MLP targets */
    int dense = 0;
    for (int64_t l = 0; l < d->n_layers; l++)
        dense |= !zn_model_layer_moe(d, l);
    if (d->n_experts > 0 && !dense && (d->lora.targets & ZN_LORA_ALL) == ZN_LORA_ALL)
        d->lora.targets &= ~(unsigned)(ZN_LORA_GATE | ZN_LORA_UP | ZN_LORA_DOWN);
}

const char *zn_lora_target_name(unsigned t)
{
    switch (t) {
    case ZN_LORA_Q: return "q_proj";
    case ZN_LORA_K: return "k_proj";
    case ZN_LORA_V: return "v_proj";
    case ZN_LORA_O: return "o_proj";
    case ZN_LORA_GATE: return "gate_proj";
    case ZN_LORA_UP: return "up_proj";
    case ZN_LORA_DOWN: return "down_proj";
    case ZN_LORA_QKV: return "qkv_proj";
    case ZN_LORA_GATE_UP: return "gate_up_proj";
    default: return NULL;
    }
}

double zn_lora_scale(const zn_lora *l)
{
    if (l->r <= 0)
        return 0;
    return l->rslora ? l->alpha / sqrt((double)l->r) : l->alpha / (double)l->r;
}

uint64_t zn_model_param_count(const zn_model_dims *d)
{
    uint64_t n = 0;
    for (int b = 0; b < zn_model_num_blocks(d); b++)
        n += zn_model_block_param_count(d, b);
    return n;
}
