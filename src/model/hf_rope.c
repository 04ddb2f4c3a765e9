/* RoPE from config.json: rope_theta with rope_scaling (transformers < 5)
 * or rope_parameters (5), the scalings zinc computes (llama3; linear and
 * YaRN on gemma3_text's and olmo3's full-attention layers) and the
 * per-layer-type tables of those two families. */
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "zinc/model.h"
#include "model/model-impl.h"

static int parse_scaling(zn_m_cfg *c, json_t *rs, const char *rs_name, int theta_only,
                         int layered, zn_model_dims *d);

/* RoPE: transformers < 5 writes rope_theta and rope_scaling (null or
 * {rope_type|type, ...}); transformers 5 writes rope_parameters {rope_type,
 * rope_theta, ...}. Both are read; where both give a theta they must agree. */
int zn_m_cfg_rope(zn_m_cfg *c, zn_model_dims *d)
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
    if ((rc = zn_m_cfg_num(c, c->root, "", "rope_theta", 0, 0.0, &d->rope_theta)))
        return rc;
    if (rs == rp && rp && !json_is_null(rp)) {
        double t;
        if ((rc = zn_m_cfg_num(c, rp, rs_name, "rope_theta", 0, 0.0, &t)))
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
static int parse_yarn(zn_m_cfg *c, json_t *rs, const char *rs_name, zn_model_dims *d)
{
    int rc;
    double orig, af;
    if ((rc = zn_m_cfg_num(c, rs, rs_name, "original_max_position_embeddings", 0,
                         (double)d->max_pos, &orig)))
        return rc;
    if (orig != floor(orig) || orig <= 0 || orig > 1e12)
        return zn_set_error(ZN_ECONFIG, "%s: key '%soriginal_max_position_embeddings' must be a "
                            "positive integer", c->name, rs_name);
    d->rope_orig_max_pos = (int64_t)orig;
    if ((rc = zn_m_cfg_num(c, rs, rs_name, "factor", 0, (double)d->max_pos / orig,
                         &d->rope_factor)) ||
        (rc = zn_m_cfg_num(c, rs, rs_name, "beta_fast", 0, 0, &d->rope_beta_fast)) ||
        (rc = zn_m_cfg_num(c, rs, rs_name, "beta_slow", 0, 0, &d->rope_beta_slow)) ||
        (rc = zn_m_cfg_num(c, rs, rs_name, "attention_factor", 0, 0, &af)))
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
static int parse_scaling(zn_m_cfg *c, json_t *rs, const char *rs_name, int theta_only,
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
        if ((rc = zn_m_cfg_num(c, rs, rs_name, "factor", 1, 0, &d->rope_factor)))
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
    if ((rc = zn_m_cfg_num(c, rs, rs_name, "factor", 1, 0, &d->rope_factor)) ||
        (rc = zn_m_cfg_num(c, rs, rs_name, "low_freq_factor", 1, 0, &d->rope_low_freq_factor)) ||
        (rc = zn_m_cfg_num(c, rs, rs_name, "high_freq_factor", 1, 0, &d->rope_high_freq_factor)) ||
        (rc = zn_m_cfg_num(c, rs, rs_name, "original_max_position_embeddings", 1, 0, &orig)))
        return rc;
    if (orig != floor(orig) || orig <= 0 || orig > 1e12)
        return zn_set_error(ZN_ECONFIG,
                            "%s: key '%soriginal_max_position_embeddings' must be a positive "
                            "integer", c->name, rs_name);
    d->rope_orig_max_pos = (int64_t)orig;
    return 0;
}

/* gemma3_text's and olmo3's RoPE, per layer type. transformers 5 writes
 * rope_parameters {"sliding_attention": {rope_type, rope_theta},
 * "full_attention": {rope_type, rope_theta, factor, ...}}; 4.x wrote
 * rope_theta and rope_scaling (the full-attention layers') and, for
 * gemma3, rope_local_base_freq (the sliding layers'). The sliding layers
 * rotate unscaled. */
int zn_m_cfg_rope_layered(zn_m_cfg *c, zn_model_dims *d)
{
    int rc, gemma3 = d->arch == ZN_ARCH_GEMMA3;
    /* Gemma3TextConfig.default_theta (global, local), Olmo3Config's */
    double def_full = gemma3 ? 1000000.0 : 500000.0, def_local = gemma3 ? 10000.0 : 500000.0;
    json_t *rp = json_object_get(c->root, "rope_parameters");
    json_t *rs = json_object_get(c->root, "rope_scaling");
    json_t *lb = json_object_get(c->root, "rope_local_base_freq");
    double theta, local;
    if ((rc = zn_m_cfg_num(c, c->root, "", "rope_theta", 0, 0.0, &theta)) ||
        (rc = zn_m_cfg_num(c, c->root, "", "rope_local_base_freq", 0, 0.0, &local)))
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
            ((rc = zn_m_cfg_num(c, full, "rope_parameters.full_attention.", "rope_theta", 0,
                              def_full, &d->rope_theta)) ||
             (rc = parse_scaling(c, full, "rope_parameters.full_attention.", 1, 1, d))))
            return rc;
        if (sl && !json_is_null(sl)) {
            zn_model_dims tmp = *d;
            if ((rc = zn_m_cfg_num(c, sl, "rope_parameters.sliding_attention.", "rope_theta", 0,
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
