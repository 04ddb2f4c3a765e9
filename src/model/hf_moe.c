/* The mixture-of-experts keys of config.json: Qwen3MoeConfig's and
 * MixtralConfig's experts, top-k, widths, dense layers and aux loss, with
 * their defaults when absent. */
#include <string.h>

#include <jansson.h>

#include "zinc/model.h"
#include "model/model-impl.h"

/* Qwen3MoeConfig's experts (its defaults when absent: 128 experts, 8 a
 * token, 768 wide, renormalized, every layer sparse, no aux loss at
 * coefficient 0.001). */
int zn_m_cfg_moe(zn_m_cfg *c, zn_model_dims *d)
{
    int rc;
    int64_t local = 0;
    /* the published configs say num_experts, transformers 5 writes it as
     * num_local_experts (its attribute_map) */
    if ((rc = zn_m_cfg_int(c, "num_local_experts", 0, 0, &local)) ||
        (rc = zn_m_cfg_int(c, "num_experts", 0, local ? local : 128, &d->n_experts)))
        return rc;
    if (local && local != d->n_experts)
        return zn_set_error(ZN_ECONFIG, "%s: num_experts (%lld) and num_local_experts (%lld) "
                            "disagree", c->name, (long long)d->n_experts, (long long)local);
    if ((rc = zn_m_cfg_int(c, "num_experts_per_tok", 0, 8, &d->top_k)) ||
        (rc = zn_m_cfg_int(c, "moe_intermediate_size", 0, 768, &d->moe_intermediate)) ||
        (rc = zn_m_cfg_int(c, "decoder_sparse_step", 0, 1, &d->sparse_step)) ||
        (rc = zn_m_cfg_bool(c, "norm_topk_prob", 0, &d->norm_topk)) ||
        (rc = zn_m_cfg_bool(c, "output_router_logits", 0, &d->router_logits)) ||
        (rc = zn_m_cfg_num(c, c->root, "", "router_aux_loss_coef", 0, 0.001, &d->router_aux_coef)))
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
int zn_m_cfg_mixtral(zn_m_cfg *c, zn_model_dims *d)
{
    int rc;
    int64_t named = 0;
    double jitter;
    /* num_local_experts; num_experts is its attribute_map name */
    if ((rc = zn_m_cfg_int(c, "num_experts", 0, 0, &named)) ||
        (rc = zn_m_cfg_int(c, "num_local_experts", 0, named ? named : 8, &d->n_experts)) ||
        (rc = zn_m_cfg_int(c, "num_experts_per_tok", 0, 2, &d->top_k)) ||
        (rc = zn_m_cfg_bool(c, "output_router_logits", 0, &d->router_logits)) ||
        (rc = zn_m_cfg_num(c, c->root, "", "router_aux_loss_coef", 0, 0.001, &d->router_aux_coef)) ||
        (rc = zn_m_cfg_num(c, c->root, "", "router_jitter_noise", 0, 0.0, &jitter)))
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
