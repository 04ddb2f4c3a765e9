/* A resolved configuration written back as JSON, each value with where it
 * came from. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "config/config-impl.h"

/* ---- dump ---------------------------------------------------------------- */

static json_t *obj_at(json_t *root, const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    char *dot = strrchr(buf, '.');
    if (!dot)
        return root;
    *dot = '\0';
    json_t *cur = root;
    char *save = NULL;
    for (char *seg = strtok_r(buf, ".", &save); seg; seg = strtok_r(NULL, ".", &save)) {
        json_t *child = json_object_get(cur, seg);
        if (!child) {
            child = json_object();
            json_object_set_new(cur, seg, child);
        }
        cur = child;
    }
    return cur;
}

static bool is_alias(const key_spec *k)
{
    for (const key_spec *p = zn_cfg_schema; p < k; p++)
        if (p->kind == k->kind && p->off == k->off && p->kind != K_OBJ &&
            p->kind != K_FIXED && p->kind != K_ACCEPT && p->kind != K_UNSUPP)
            return true;
    return false;
}

char *zn_config_dump(const zn_config *c)
{
    json_t *root = json_object();
    const char *base = (const char *)c;
    for (size_t i = 0; i < zn_cfg_n_schema; i++) {
        const key_spec *k = &zn_cfg_schema[i];
        if (k->kind == K_OBJ || k->kind == K_FIXED || k->kind == K_ACCEPT ||
            k->kind == K_UNSUPP || k->kind == K_TUNING || is_alias(k))
            continue;
        /* steps_per_print is DeepSpeed's name for train.log_every: dump the latter;
         * the deprecated offload spellings are dumped as the keys they set */
        if (!strcmp(k->path, "steps_per_print") ||
            !strncmp(k->path, "zero_optimization.cpu_offload", 29))
            continue;
        /* a model key the config did not set stays unset when the dump is
         * parsed again (a checkpoint's recorded config): the dimension-given
         * families gemma2 .. mixtral read an unset key as their HF default,
         * not as zinc's default of that key (src/run/setup.c) */
        if (!strncmp(k->path, "model.", 6) && zn_config_get_origin(c, k->path) == ZN_ORIGIN_DEFAULT)
            continue;
        json_t *o = obj_at(root, k->path);
        const char *leaf = zn_cfg_leaf_of(k->path);
        json_t *v = NULL;
        switch (k->kind) {
        case K_BOOL: v = json_boolean(*(const bool *)(base + k->off)); break;
        case K_INT: {
            /* A value outside the key's range is "unset" (model dimensions
             * when model.path is used): leave it out. */
            int64_t n = *(const int64_t *)(base + k->off);
            if ((double)n >= k->min && (double)n <= k->max)
                v = json_integer(n);
            break;
        }
        case K_BATCH: v = json_integer(*(const int64_t *)(base + k->off)); break;
        case K_INT32: v = json_integer(*(const int *)(base + k->off)); break;
        case K_NUM: v = json_real(*(const double *)(base + k->off)); break;
        case K_STR: v = json_string(base + k->off); break;
        case K_SIZE:
            if (k->aux && *(const bool *)(base + k->aux - 1))
                v = json_string("auto");
            else
                v = json_integer((json_int_t)*(const uint64_t *)(base + k->off));
            break;
        case K_ENUM: {
            int idx = *(const int *)(base + k->off) - k->aux;
            if (idx < 0) {
                v = json_null();
                break;
            }
            const char *ch = k->choices;
            for (int j = 0; j < idx && ch; j++) {
                ch = strchr(ch, '|');
                if (ch)
                    ch++;
            }
            if (!ch) {
                v = json_null();
                break;
            }
            size_t n = strcspn(ch, "|");
            v = json_stringn(ch, n);
            break;
        }
        case K_BETAS:
            v = json_pack("[ff]", c->optimizer.beta1, c->optimizer.beta2);
            break;
        case K_TARGETS: {
            static const char *const names[] = { "q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj" };
            v = json_array();
            for (int j = 0; j < 7; j++)
                if (c->lora.targets & (1u << j))
                    json_array_append_new(v, json_string(names[j]));
            break;
        }
        case K_NVME: {
            v = json_array();
            for (int j = 0; j < c->tiers.n_nvme; j++) {
                const zn_config_nvme_path *np = &c->tiers.nvme[j];
                json_t *e = json_pack("{ss}", "path", np->path);
                json_object_set_new(e, "size", np->size_auto ? json_string("auto")
                                                              : json_integer((json_int_t)np->size));
                json_array_append_new(v, e);
            }
            break;
        }
        default: break;
        }
        if (v)
            json_object_set_new(o, leaf, v);
    }
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return s;
}
