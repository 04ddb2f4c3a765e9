/* The keys of the families with sliding windows on some layers
 * (Gemma2Config, Gemma3TextConfig, Olmo3Config) from config.json: the
 * window, the layer pattern (layer_types), Gemma's scalar and soft-caps. */
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "zinc/model.h"
#include "model/model-impl.h"

/* A soft-cap key of Gemma2Config / Gemma3TextConfig: its default when
 * absent (0: none), null for none, else a positive number. */
static int get_cap(zn_m_cfg *c, const char *key, double def, double *out)
{
    json_t *v = json_object_get(c->root, key);
    if ((v && json_is_null(v)) || (!v && def == 0)) {
        *out = 0;
        return 0;
    }
    int rc = zn_m_cfg_num(c, c->root, "", key, 0, def, out);
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
int zn_m_cfg_windowed(zn_m_cfg *c, zn_model_dims *d)
{
    int rc, flag;
    int g23 = d->arch == ZN_ARCH_GEMMA2 || d->arch == ZN_ARCH_GEMMA3;
    int gemma3 = d->arch == ZN_ARCH_GEMMA3;
    const char *who = d->arch == ZN_ARCH_GEMMA2 ? "Gemma 2" : gemma3 ? "Gemma 3" : "OLMo 3";
    if (g23) {
        if ((rc = zn_m_cfg_num(c, c->root, "", "query_pre_attn_scalar", 0, 256, &d->attn_scalar)))
            return rc;
        if (!(d->attn_scalar > 0))
            return zn_set_error(ZN_ECONFIG, "%s: key 'query_pre_attn_scalar' must be positive, "
                                "got %g", c->name, d->attn_scalar);
        if ((rc = get_cap(c, "attn_logit_softcapping", gemma3 ? 0 : 50.0, &d->attn_softcap)) ||
            (rc = get_cap(c, "final_logit_softcapping", gemma3 ? 0 : 30.0, &d->final_softcap)))
            return rc;
        if ((rc = zn_m_cfg_bool(c, "use_bidirectional_attention", 0, &flag)))
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
    if ((rc = zn_m_cfg_int(c, "sliding_window", 0, 4096, &d->sliding_window)))
        return rc;
    double drop;
    if ((rc = zn_m_cfg_num(c, c->root, "", "attention_dropout", 0, 0.0, &drop)))
        return rc;
    if (drop != 0)
        return zn_set_error(ZN_EUNSUPPORTED, "%s: attention_dropout %g is not supported (zinc "
                            "trains without dropout in the model; set it to 0)", c->name, drop);
    d->full_every = d->arch == ZN_ARCH_GEMMA2 ? 2 : 4;
    /* Gemma3TextConfig reads sliding_window_pattern when layer_types is absent */
    if (gemma3 && (rc = zn_m_cfg_int(c, "sliding_window_pattern", 0, 6, &d->full_every)))
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
