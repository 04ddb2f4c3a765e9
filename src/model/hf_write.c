/* zn_model_dims -> a Hugging Face config.json that transformers loads as
 * the same model: the common keys, the windowed families' and the
 * experts', the RoPE as each transformers version reads it. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "zinc/model.h"
#include "model/model-impl.h"
#include "util/fs-impl.h"

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
