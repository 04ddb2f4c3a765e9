/* PEFT's adapter_config.json: read (a LoRA adapter zinc can train on) and
 * written (with the adapters zinc exports), so that a folder moves between
 * zinc and peft.PeftModel either way. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "zinc/model.h"
#include "util/fs-impl.h"
#include "util/json-impl.h"

/* PEFT's target_modules for these decoders: module names (a full
 * "model.layers.3.self_attn.q_proj" counts by its last part) or
 * "all-linear" (every projection of the layers; not lm_head): the model
 * knows its projections, and both the config parser and adapter_config.json
 * take them from here. */
int zn_lora_targets_of(const void *json_value, unsigned *out, char *msg, size_t len)
{
    const json_t *v = json_value;
    static const char *const names[] = { "q_proj", "k_proj", "v_proj", "o_proj",
                                          "gate_proj", "up_proj", "down_proj",
                                          "qkv_proj", "gate_up_proj" };
    const int nn = (int)(sizeof names / sizeof names[0]);
    *out = 0;
    if (json_is_string(v) && !strcmp(json_string_value(v), "all-linear")) {
        *out = 127;
        return 0;
    }
    json_t *one = json_is_string(v) ? json_pack("[O]", v) : NULL;
    const json_t *arr = one ? one : v;
    if (!json_is_array(arr)) {
        snprintf(msg, len, "expected a list of module names (q_proj, k_proj, v_proj, o_proj, "
                 "gate_proj, up_proj, down_proj) or \"all-linear\", got %s", zn_json_kind(v));
        return ZN_ECONFIG;
    }
    size_t i;
    json_t *e;
    int rc = 0;
    json_array_foreach(arr, i, e) {
        const char *n = json_is_string(e) ? json_string_value(e) : NULL;
        const char *leaf = n ? strrchr(n, '.') : NULL;
        leaf = leaf ? leaf + 1 : n;
        int k = 0;
        while (leaf && k < nn && strcmp(leaf, names[k]))
            k++;
        if (!leaf || k == nn) {
            char *got = json_dumps(e, JSON_ENCODE_ANY | JSON_COMPACT);
            snprintf(msg, len, "[%zu] = %s is not a projection zinc adapts: one of q_proj, "
                     "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or phi3's fused "
                     "qkv_proj and gate_up_proj (lm_head and "
                     "embed_tokens adapters are not supported)", i, got ? got : "?");
            free(got);
            rc = ZN_ECONFIG;
            break;
        }
        *out |= 1u << k;
    }
    json_decref(one);
    if (!rc && !*out) {
        snprintf(msg, len, "names no module");
        rc = ZN_ECONFIG;
    }
    return rc;
}

int zn_lora_read_peft_config(const char *dir, zn_lora *l)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    memset(l, 0, sizeof *l);
    if (access(path, F_OK))
        return zn_set_error(-ENOENT, "%s: no such file (a PEFT adapter folder holds "
                            "adapter_config.json and adapter_model.safetensors)", path);
    return zn_lora_read_peft_file(path, l);
}

int zn_lora_read_peft_file(const char *path, zn_lora *l)
{
    memset(l, 0, sizeof *l);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return zn_set_error(ZN_ECONFIG, "%s: line %d: %s", path, je.line, je.text);
    int rc = 0;
    const char *pt = json_string_value(json_object_get(root, "peft_type"));
    const char *bias = json_string_value(json_object_get(root, "bias"));
    json_t *r = json_object_get(root, "r"), *a = json_object_get(root, "lora_alpha");
    json_t *t = json_object_get(root, "target_modules");
    if (!json_is_object(root))
        rc = zn_set_error(ZN_ECONFIG, "%s: not a JSON object", path);
    else if (pt && strcmp(pt, "LORA"))
        rc = zn_set_error(ZN_EUNSUPPORTED, "%s: peft_type %s; zinc trains LORA adapters", path,
                          pt);
    else if (!json_is_integer(r) || json_integer_value(r) <= 0 || json_integer_value(r) > 65536)
        rc = zn_set_error(ZN_ECONFIG, "%s: r must be an integer in 1..65536", path);
    else if (!json_is_number(a))
        rc = zn_set_error(ZN_ECONFIG, "%s: lora_alpha must be a number", path);
    else if (json_is_true(json_object_get(root, "use_dora")))
        rc = zn_set_error(ZN_EUNSUPPORTED, "%s: use_dora: DoRA is not implemented", path);
    else if (json_is_true(json_object_get(root, "fan_in_fan_out")))
        rc = zn_set_error(ZN_EUNSUPPORTED, "%s: fan_in_fan_out (Conv1D models) is not "
                          "supported", path);
    else if (bias && strcmp(bias, "none"))
        rc = zn_set_error(ZN_EUNSUPPORTED, "%s: bias \"%s\": zinc trains adapters with bias "
                          "\"none\" only", path, bias);
    else if (json_array_size(json_object_get(root, "modules_to_save")))
        rc = zn_set_error(ZN_EUNSUPPORTED, "%s: modules_to_save is not supported", path);
    else if (json_object_get(root, "layers_to_transform") &&
             !json_is_null(json_object_get(root, "layers_to_transform")))
        rc = zn_set_error(ZN_EUNSUPPORTED, "%s: layers_to_transform is not supported (zinc "
                          "adapts every layer)", path);
    else if (json_object_size(json_object_get(root, "rank_pattern")) ||
             json_object_size(json_object_get(root, "alpha_pattern")))
        rc = zn_set_error(ZN_EUNSUPPORTED, "%s: rank_pattern / alpha_pattern are not "
                          "supported", path);
    if (!rc) {
        l->r = (int)json_integer_value(r);
        l->alpha = json_number_value(a);
        l->rslora = json_is_true(json_object_get(root, "use_rslora"));
        json_t *dp = json_object_get(root, "lora_dropout");
        l->dropout = json_is_number(dp) ? json_number_value(dp) : 0;
        /* target_modules: the config parser's rules (names or "all-linear") */
        char where[4300];
        snprintf(where, sizeof where, "%s: target_modules", path);
        char msg[400];
        if (zn_lora_targets_of(t, &l->targets, msg, sizeof msg))
            rc = zn_set_error(ZN_ECONFIG, "%s: %s", where, msg);
    }
    json_decref(root);
    return rc;
}

int zn_lora_write_peft_config(const zn_lora *l, const char *path, const char *base_model)
{
    if (l->r <= 0)
        return zn_set_error(ZN_EARG, "adapter_config.json: no adapters (r = 0)");
    json_t *tm = json_array();
    for (unsigned t = 1; t <= ZN_LORA_LAST; t <<= 1)
        if (l->targets & t)
            json_array_append_new(tm, json_string(zn_lora_target_name(t)));
    json_t *o = json_pack("{ss ss* ss si sf sf so ss sb sb sb sb sn sn sb}", "peft_type", "LORA",
                          "base_model_name_or_path", base_model, "task_type", "CAUSAL_LM", "r",
                          l->r, "lora_alpha", l->alpha, "lora_dropout", l->dropout,
                          "target_modules", tm, "bias", "none", "use_rslora", l->rslora != 0,
                          "use_dora", 0, "fan_in_fan_out", 0, "inference_mode", 1,
                          "modules_to_save", "layers_to_transform", "init_lora_weights", 1);
    if (!o)
        return zn_set_error(-ENOMEM, "adapter_config.json: out of memory");
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text)
        return zn_set_error(-ENOMEM, "%s: out of memory writing adapter_config.json", path);
    int rc = zn_fs_write_atomic(path, text, strlen(text));
    free(text);
    return rc;
}
