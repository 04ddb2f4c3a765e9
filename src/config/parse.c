/* The JSON configuration parsed with jansson against the schema: types,
 * ranges, enums, sizes, the DeepSpeed keys zinc accepts only at one value
 * or refuses, --set overrides; every error of a file reported in one run. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "zinc/model.h"
#include "config/config-impl.h"
#include "util/json-impl.h"

/* ---- the parser ---------------------------------------------------------- */

static void add_line(parse_ctx *ctx, const char *line)
{
    size_t n = strlen(line);
    if (ctx->errs_len + n + 2 > ctx->errs_cap) {
        size_t cap = (ctx->errs_len + n + 2) * 2;
        char *nb = realloc(ctx->errs, cap);
        if (!nb)
            return; /* the count still says how many there were */
        ctx->errs = nb;
        ctx->errs_cap = cap;
    }
    memcpy(ctx->errs + ctx->errs_len, line, n);
    ctx->errs_len += n;
    ctx->errs[ctx->errs_len++] = '\n';
    ctx->errs[ctx->errs_len] = '\0';
}

int zn_cfg_err(parse_ctx *ctx, const char *path, const char *fmt, ...)
{
    char msg[1024], line[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(line, sizeof line, "%s: %s", path, msg);
    add_line(ctx, line);
    ctx->n_err++;
    return ZN_ECONFIG;
}

void zn_cfg_warn(parse_ctx *ctx, const char *path, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    zn_warn("%s: %s: %s", ctx->file, path, msg);
    ctx->cfg->n_warnings++;
}

/* The zn_cfg_schema index a key's origin is kept under: an alias shares its key's. */
size_t zn_cfg_canon_index(const key_spec *k)
{
    for (const key_spec *p = zn_cfg_schema; p < k; p++)
        if (p->kind == k->kind && p->off == k->off && p->off != 0 && p->kind != K_OBJ)
            return (size_t)(p - zn_cfg_schema);
    return (size_t)(k - zn_cfg_schema);
}

static void set_origin(parse_ctx *ctx, const key_spec *k, const char *path, bool is_auto)
{
    zn_config_origin o = ZN_ORIGIN_CONFIG;
    for (int i = 0; i < ctx->n_overrides; i++) {
        const char *ov = ctx->overrides[i];
        size_t n = strcspn(ov, "=");
        if (!strncmp(ov, path, n) && (path[n] == '\0' || path[n] == '.'))
            o = ZN_ORIGIN_SET;
    }
    if (is_auto)
        o = ZN_ORIGIN_AUTO;
    ctx->cfg->origin[zn_cfg_canon_index(k)] = (unsigned char)o;
}

/* A JSON number that is a whole number (5e8 counts) as int64. */
/* DeepSpeed's pydantic models take numbers written as strings ("0", "1e9"). */
static bool num_string(const json_t *v, double *out)
{
    if (!json_is_string(v))
        return false;
    const char *s = json_string_value(v);
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(d))
        return false;
    *out = d;
    return true;
}

static int get_int(parse_ctx *ctx, const char *path, const json_t *v, int64_t *out)
{
    double sd;
    if (num_string(v, &sd)) {
        if (sd == floor(sd) && fabs(sd) < 9.2e18) {
            *out = (int64_t)sd;
            return 0;
        }
        return zn_cfg_err(ctx, path, "expected an integer, got \"%s\"", json_string_value(v));
    }
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9.2e18) {
            *out = (int64_t)d;
            return 0;
        }
        return zn_cfg_err(ctx, path, "expected an integer, got %g", d);
    }
    return zn_cfg_err(ctx, path, "expected an integer, got %s", zn_json_kind(v));
}

static int check_range(parse_ctx *ctx, const key_spec *k, const char *path, double v)
{
    if (v < k->min || v > k->max) {
        if (k->max >= 9e18)
            return zn_cfg_err(ctx, path, "%g is out of range (must be >= %g)", v, k->min);
        return zn_cfg_err(ctx, path, "%g is out of range [%g, %g]", v, k->min, k->max);
    }
    return 0;
}

static int parse_enum(parse_ctx *ctx, const key_spec *k, const char *path, const json_t *v, int *out)
{
    /* a JSON true / false names the choice "true" / "false" where there is one */
    if (!json_is_string(v) && !json_is_boolean(v))
        return zn_cfg_err(ctx, path, "expected one of %s, got %s", k->choices, zn_json_kind(v));
    const char *s = json_is_boolean(v) ? (json_is_true(v) ? "true" : "false")
                                       : json_string_value(v);
    const char *c = k->choices;
    int idx = 0;
    while (*c) {
        const char *bar = strchr(c, '|');
        size_t n = bar ? (size_t)(bar - c) : strlen(c);
        /* DeepSpeed matches optimizer and scheduler names case-insensitively. */
        if (strlen(s) == n && strncasecmp(s, c, n) == 0) {
            *out = idx + k->aux;
            return 0;
        }
        idx++;
        c += n + (bar ? 1 : 0);
    }
    return zn_cfg_err(ctx, path, "'%s' is not one of %s", s, k->choices);
}

int zn_config_lora_targets(const void *json_value, unsigned *out, const char *where)
{
    char msg[400];
    if (zn_lora_targets_of(json_value, out, msg, sizeof msg))
        return zn_set_error(ZN_ECONFIG, "%s: %s", where, msg);
    return 0;
}

static int parse_targets(parse_ctx *ctx, const char *path, const json_t *v, unsigned *out)
{
    char msg[400];
    if (zn_lora_targets_of(v, out, msg, sizeof msg))
        return zn_cfg_err(ctx, path, "%s", msg);
    return 0;
}

static int parse_nvme(parse_ctx *ctx, const char *path, const json_t *v)
{
    zn_config_tiers *t = &ctx->cfg->tiers;
    t->n_nvme = 0;
    if (json_is_string(v)) {
        if (json_string_length(v) >= ZN_PATH_MAX || !json_string_length(v))
            return zn_cfg_err(ctx, path, "expected a directory name shorter than %d bytes",
                           ZN_PATH_MAX);
        snprintf(t->nvme[0].path, ZN_PATH_MAX, "%s", json_string_value(v));
        t->nvme[0].size_auto = true;
        t->n_nvme = 1;
        return 0;
    }
    if (json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return zn_cfg_err(ctx, path, "expected a list of {\"path\": DIR, \"size\": SIZE} "
                       "or a path string, got %s", zn_json_kind(v));
    if (json_array_size(v) > ZN_MAX_NVME_PATHS)
        return zn_cfg_err(ctx, path, "%zu paths given; at most %d are supported",
                       json_array_size(v), ZN_MAX_NVME_PATHS);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        char ep[600];
        snprintf(ep, sizeof ep, "%s[%zu]", path, i);
        zn_config_nvme_path *np = &t->nvme[i];
        np->size_auto = true;
        if (json_is_string(e)) {
            if (json_string_length(e) >= ZN_PATH_MAX || !json_string_length(e))
                return zn_cfg_err(ctx, ep, "expected a directory name shorter than %d bytes",
                               ZN_PATH_MAX);
            snprintf(np->path, ZN_PATH_MAX, "%s", json_string_value(e));
        } else if (json_is_object(e)) {
            const char *key;
            json_t *val;
            json_object_foreach(e, key, val) {
                if (!strcmp(key, "path")) {
                    if (!json_is_string(val) || !json_string_length(val))
                        return zn_cfg_err(ctx, ep, "path: expected a directory name");
                    if (json_string_length(val) >= ZN_PATH_MAX)
                        return zn_cfg_err(ctx, ep, "path: longer than %d bytes", ZN_PATH_MAX - 1);
                    snprintf(np->path, ZN_PATH_MAX, "%s", json_string_value(val));
                } else if (!strcmp(key, "size")) {
                    if (json_is_string(val) && !strcmp(json_string_value(val), "auto")) {
                        np->size_auto = true;
                    } else if (json_is_string(val)) {
                        if (zn_parse_size(json_string_value(val), &np->size))
                            return zn_cfg_err(ctx, ep, "size: %s", zn_last_error());
                        np->size_auto = false;
                    } else {
                        int64_t n;
                        if (get_int(ctx, ep, val, &n))
                            return ZN_ECONFIG;
                        if (n < 0)
                            return zn_cfg_err(ctx, ep, "size: must not be negative");
                        np->size = (uint64_t)n;
                        np->size_auto = false;
                    }
                } else {
                    return zn_cfg_err(ctx, ep, "unknown key '%s' (expected 'path' and 'size')", key);
                }
            }
        } else {
            return zn_cfg_err(ctx, ep, "expected {\"path\": DIR, \"size\": SIZE}, got %s", zn_json_kind(e));
        }
        if (!np->path[0])
            return zn_cfg_err(ctx, ep, "missing 'path'");
        t->n_nvme++;
    }
    return 0;
}

static int parse_object(parse_ctx *ctx, const char *prefix, json_t *obj);

/* Whether a JSON value matches one of a K_FIXED key's '|'-separated JSON values. */
static bool fixed_match(const char *choices, const json_t *v)
{
    char buf[128];
    const char *c = choices;
    if (json_is_null(v)) /* DeepSpeed's None: its default */
        return true;
    while (*c) {
        size_t n = strcspn(c, "|");
        snprintf(buf, sizeof buf, "%.*s", (int)n, c);
        json_t *want = json_loads(buf, JSON_DECODE_ANY, NULL);
        double sd;
        bool same = want && (json_equal(want, v) ||
                             (json_is_number(want) && json_is_number(v) &&
                              json_number_value(want) == json_number_value(v)) ||
                             (json_is_number(want) && num_string(v, &sd) &&
                              json_number_value(want) == sd));
        json_decref(want);
        if (same)
            return true;
        c += n + (c[n] == '|');
    }
    return false;
}

/* A section accepted only switched off: names the first "enabled": true or
 * "disable": false inside it, or returns NULL. */
static const char *switched_on(const json_t *v, char *where, size_t len)
{
    if (!json_is_object(v))
        return NULL;
    const char *key;
    json_t *e;
    json_object_foreach((json_t *)v, key, e) {
        if ((!strcmp(key, "enabled") && (json_is_true(e) || (json_is_string(e) &&
                                                             strcmp(json_string_value(e), "false")))) ||
            (!strcmp(key, "disable") && json_is_false(e))) {
            snprintf(where, len, "%s", key);
            return where;
        }
        if (json_is_object(e)) {
            char sub[256];
            if (switched_on(e, sub, sizeof sub)) {
                snprintf(where, len, "%s.%s", key, sub);
                return where;
            }
        }
    }
    return NULL;
}

/* Says a K_TUNING key's note once a parse (a run parses its config once):
 * two spellings that share a note give one line. */
static void note_once(parse_ctx *ctx, const key_spec *k, const char *path, const char *what)
{
    for (int i = 0; i < ctx->n_noted; i++)
        if (!strcmp(ctx->noted[i], k->note))
            return;
    if (ctx->n_noted < (int)(sizeof ctx->noted / sizeof ctx->noted[0]))
        ctx->noted[ctx->n_noted++] = k->note;
    zn_cfg_warn(ctx, path, "%s is accepted (it changes no number of the training): %s", what,
                k->note);
}

/* A key that changes only diagnostics or speed (K_TUNING): any value of its
 * type is accepted, and one that asks for something zinc does its own way
 * says so once. "auto" is DeepSpeed's default (its config model drops an
 * "auto" nothing fills). */
static int parse_tuning(parse_ctx *ctx, const key_spec *k, const char *path, const json_t *v)
{
    char where[300], what[400];
    if (!k->choices) {
        if (!json_is_object(v) && !json_is_boolean(v))
            return zn_cfg_err(ctx, path, "expected an object, got %s", zn_json_kind(v));
        if (json_is_false(v) || (json_is_object(v) && !switched_on(v, where, sizeof where))) {
            zn_debug("%s: %s accepted: switched off", ctx->file, path);
            return 0;
        }
        snprintf(what, sizeof what, "switched on (%s)", json_is_true(v) ? "true" : where);
        note_once(ctx, k, path, what);
        return 0;
    }
    if (json_is_string(v) && !strcmp(json_string_value(v), "auto")) {
        zn_debug("%s: %s: \"auto\": DeepSpeed's default %s", ctx->file, path, k->choices);
        return 0;
    }
    json_t *def = json_loads(k->choices, JSON_DECODE_ANY, NULL);
    if (!def)
        return zn_cfg_err(ctx, path, "internal: bad K_TUNING default '%s'", k->choices);
    bool asks;
    if (json_is_boolean(def)) {
        bool b;
        if (json_is_string(v) && (!strcmp(json_string_value(v), "true") ||
                                  !strcmp(json_string_value(v), "false"))) {
            b = !strcmp(json_string_value(v), "true");
        } else if (json_is_boolean(v)) {
            b = json_is_true(v);
        } else {
            json_decref(def);
            return zn_cfg_err(ctx, path, "expected true or false, got %s", zn_json_kind(v));
        }
        asks = b != json_is_true(def);
        snprintf(what, sizeof what, "%s", b ? "true" : "false");
    } else {
        double d;
        int64_t n;
        if (json_is_integer(def)) {
            if (get_int(ctx, path, v, &n)) {
                json_decref(def);
                return ZN_ECONFIG;
            }
            d = (double)n;
            snprintf(what, sizeof what, "%lld", (long long)n);
        } else if (num_string(v, &d) || json_is_number(v)) {
            if (json_is_number(v))
                d = json_number_value(v);
            snprintf(what, sizeof what, "%g", d);
        } else {
            json_decref(def);
            return zn_cfg_err(ctx, path, "expected a number, got %s", zn_json_kind(v));
        }
        if (check_range(ctx, k, path, d)) {
            json_decref(def);
            return ZN_ECONFIG;
        }
        asks = d != json_number_value(def);
    }
    json_decref(def);
    if (asks)
        note_once(ctx, k, path, what);
    else
        zn_debug("%s: %s accepted: DeepSpeed's default %s", ctx->file, path, k->choices);
    return 0;
}

static int parse_value(parse_ctx *ctx, const key_spec *k, const char *path, json_t *v)
{
    char *base = (char *)ctx->cfg;

    /* null keeps the default, as DeepSpeed's None does. */
    if (json_is_null(v) && k->kind != K_FIXED && k->kind != K_UNSUPP)
        return 0;

    /* "auto": the HF integration's value, resolved once the parse is done
     * (zn_config_resolve_auto) from train.*, the model and the device. */
    if (json_is_string(v) && !strcmp(json_string_value(v), "auto") && k->autorule != A_NONE) {
        set_origin(ctx, k, path, true);
        return 0;
    }

    switch (k->kind) {
    case K_OBJ:
        if (!json_is_object(v))
            return zn_cfg_err(ctx, path, "expected an object, got %s", zn_json_kind(v));
        return parse_object(ctx, path, v);
    case K_BOOL:
        if (json_is_string(v) && (!strcmp(json_string_value(v), "true") ||
                                  !strcmp(json_string_value(v), "false"))) {
            *(bool *)(base + k->off) = !strcmp(json_string_value(v), "true");
            break;
        }
        if (!json_is_boolean(v))
            return zn_cfg_err(ctx, path, "expected true or false, got %s", zn_json_kind(v));
        *(bool *)(base + k->off) = json_is_true(v);
        break;
    case K_INT: {
        int64_t n;
        if (get_int(ctx, path, v, &n) || check_range(ctx, k, path, (double)n))
            return ZN_ECONFIG;
        *(int64_t *)(base + k->off) = n;
        break;
    }
    case K_INT32: {
        int64_t n;
        if (get_int(ctx, path, v, &n) || check_range(ctx, k, path, (double)n))
            return ZN_ECONFIG;
        *(int *)(base + k->off) = (int)n;
        break;
    }
    case K_NUM: {
        double d;
        if (num_string(v, &d))
            ;
        else if (json_is_number(v))
            d = json_number_value(v);
        else
            return zn_cfg_err(ctx, path, "expected a number%s, got %s",
                           k->autorule ? " or \"auto\"" : "", zn_json_kind(v));
        if (check_range(ctx, k, path, d))
            return ZN_ECONFIG;
        *(double *)(base + k->off) = d;
        break;
    }
    case K_BATCH: {
        int64_t n = 0;
        if (json_is_string(v) && !strcmp(json_string_value(v), "auto")) {
            n = 0;
            set_origin(ctx, k, path, true);
            *(int64_t *)(base + k->off) = 0;
            return 0;
        }
        if (get_int(ctx, path, v, &n))
            return ZN_ECONFIG;
        if (n < 1)
            return zn_cfg_err(ctx, path, "%lld is out of range (must be >= 1, or \"auto\")",
                           (long long)n);
        *(int64_t *)(base + k->off) = n;
        break;
    }
    case K_SIZE: {
        bool *autof = k->aux ? (bool *)(base + k->aux - 1) : NULL;
        uint64_t bytes;
        if (json_is_string(v) && !strcmp(json_string_value(v), "auto") && autof) {
            *autof = true;
            break;
        }
        if (json_is_string(v)) {
            if (zn_parse_size(json_string_value(v), &bytes))
                return zn_cfg_err(ctx, path, "%s", zn_last_error());
        } else if (json_is_number(v)) {
            int64_t n;
            if (get_int(ctx, path, v, &n))
                return ZN_ECONFIG;
            if (n < 0)
                return zn_cfg_err(ctx, path, "a size must not be negative");
            bytes = (uint64_t)n;
        } else {
            return zn_cfg_err(ctx, path, "expected a size (\"24GiB\", bytes%s), got %s",
                           autof ? " or \"auto\"" : "", zn_json_kind(v));
        }
        *(uint64_t *)(base + k->off) = bytes;
        if (autof)
            *autof = false;
        break;
    }
    case K_STR: {
        if (!json_is_string(v))
            return zn_cfg_err(ctx, path, "expected a string, got %s", zn_json_kind(v));
        if (json_string_length(v) >= (size_t)k->aux)
            return zn_cfg_err(ctx, path, "longer than %d bytes", k->aux - 1);
        snprintf(base + k->off, (size_t)k->aux, "%s", json_string_value(v));
        break;
    }
    case K_ENUM:
        if (parse_enum(ctx, k, path, v, (int *)(base + k->off)))
            return ZN_ECONFIG;
        break;
    case K_BETAS: {
        if (!json_is_array(v) || json_array_size(v) != 2 ||
            !json_is_number(json_array_get(v, 0)) || !json_is_number(json_array_get(v, 1)))
            return zn_cfg_err(ctx, path, "expected [beta1, beta2], two numbers in [0, 1), "
                           "or \"auto\"");
        double b1 = json_number_value(json_array_get(v, 0));
        double b2 = json_number_value(json_array_get(v, 1));
        if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1))
            return zn_cfg_err(ctx, path, "[%g, %g]: both betas must be in [0, 1)", b1, b2);
        ctx->cfg->optimizer.beta1 = b1;
        ctx->cfg->optimizer.beta2 = b2;
        break;
    }
    case K_NVME:
        if (parse_nvme(ctx, path, v))
            return ZN_ECONFIG;
        break;
    case K_TARGETS:
        if (parse_targets(ctx, path, v, (unsigned *)(base + k->off)))
            return ZN_ECONFIG;
        break;
    case K_FIXED: {
        if (fixed_match(k->choices, v))
            return 0;
        char *got = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        char want[160];
        snprintf(want, sizeof want, "%s", k->choices);
        for (char *p = want; *p; p++)
            if (*p == '|')
                *p = '/';
        int rc = zn_cfg_err(ctx, path, "DeepSpeed's %s is not implemented by zinc; only %s (%s) "
                         "is accepted, got %s%s%s", zn_cfg_leaf_of(path),
                         strchr(want, '/') ? "what computes as zinc does" : "its default",
                         want, got ? got : "?", k->note ? "; " : "", k->note ? k->note : "");
        free(got);
        return rc;
    }
    case K_ACCEPT:
        if (json_is_string(v) && !strcmp(json_string_value(v), "auto"))
            ;
        else if ((!strcmp(k->choices, "bool") && !json_is_boolean(v)) ||
                 (!strcmp(k->choices, "int") && !json_is_integer(v)))
            return zn_cfg_err(ctx, path, "expected %s, got %s",
                           !strcmp(k->choices, "bool") ? "true or false" : "an integer",
                           zn_json_kind(v));
        zn_debug("%s: %s accepted and ignored: %s", ctx->file, path, k->note);
        return 0;
    case K_OFFSEC: {
        char where[300];
        if (json_is_boolean(v) || json_is_object(v)) {
            if (json_is_false(v) || (json_is_object(v) && !switched_on(v, where, sizeof where))) {
                zn_debug("%s: %s accepted: switched off", ctx->file, path);
                return 0;
            }
        }
        if (!json_is_object(v) && !json_is_true(v))
            return zn_cfg_err(ctx, path, "expected an object, got %s", zn_json_kind(v));
        return zn_cfg_err(ctx, path, "DeepSpeed's %s is not implemented by zinc; it is accepted "
                       "only switched off (\"enabled\": false)%s%s", zn_cfg_leaf_of(path),
                       k->note ? "; " : "", k->note ? k->note : "");
    }
    case K_TUNING:
        return parse_tuning(ctx, k, path, v);
    case K_UNSUPP:
        return zn_cfg_err(ctx, path, "DeepSpeed's %s is not implemented by zinc%s%s",
                       zn_cfg_leaf_of(path), k->note ? "; " : "", k->note ? k->note : "");
    default:
        return zn_cfg_err(ctx, path, "internal: bad zn_cfg_schema kind");
    }
    set_origin(ctx, k, path, false);
    return 0;
}

static int parse_object(parse_ctx *ctx, const char *prefix, json_t *obj)
{
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(obj, key, v) {
        char path[512];
        if (*prefix)
            snprintf(path, sizeof path, "%s.%s", prefix, key);
        else
            snprintf(path, sizeof path, "%s", key);
        /* Keys that start with '_' are comments (JSON has none). */
        if (key[0] == '_')
            continue;
        const key_spec *k = zn_cfg_find_key(path);
        if (!k) {
            char hint[256];
            zn_cfg_suggest(prefix, key, hint, sizeof hint);
            rc = zn_cfg_err(ctx, path, "unknown key%s", hint);
            continue;
        }
        if (json_is_string(v) && !strcmp(json_string_value(v), "auto") &&
            k->autorule == A_NONE && (k->kind == K_BOOL || k->kind == K_INT ||
                                      k->kind == K_INT32 || k->kind == K_NUM)) {
            /* nothing fills it (the HF integration neither): DeepSpeed's
             * config model drops an "auto" it is not given, so the key
             * takes DeepSpeed's default; so does zinc, saying which */
            const char *base = (const char *)ctx->cfg;
            char val[64];
            if (k->kind == K_BOOL)
                snprintf(val, sizeof val, "%s", *(const bool *)(base + k->off) ? "true" : "false");
            else if (k->kind == K_INT)
                snprintf(val, sizeof val, "%lld", (long long)*(const int64_t *)(base + k->off));
            else if (k->kind == K_INT32)
                snprintf(val, sizeof val, "%d", *(const int *)(base + k->off));
            else
                snprintf(val, sizeof val, "%g", *(const double *)(base + k->off));
            zn_cfg_warn(ctx, path, "\"auto\" with nothing to fill it (the HF integration "
                        "neither): DeepSpeed's default %s, as DeepSpeed takes it", val);
            continue;
        }
        if (parse_value(ctx, k, path, v))
            rc = ZN_ECONFIG;
    }
    return rc;
}


/* ---- --set overrides ----------------------------------------------------- */

static int apply_override(parse_ctx *ctx, json_t *root, const char *ov)
{
    const char *eq = strchr(ov, '=');
    if (!eq || eq == ov)
        return zn_cfg_err(ctx, "--set", "%s: expected key.path=value", ov);
    char path[512];
    size_t plen = (size_t)(eq - ov);
    if (plen >= sizeof path)
        return zn_cfg_err(ctx, "--set", "%s: key path too long", ov);
    memcpy(path, ov, plen);
    path[plen] = '\0';
    const char *text = eq + 1;
    json_t *val = json_loads(text, JSON_DECODE_ANY, NULL);
    if (!val)
        val = json_string(text);
    if (!val)
        return zn_set_error(-ENOMEM, "--set %s: out of memory", ov);

    json_t *cur = root;
    char *save = NULL;
    char *seg = strtok_r(path, ".", &save);
    char walked[512] = "";
    while (seg) {
        char *next = strtok_r(NULL, ".", &save);
        if (walked[0])
            strncat(walked, ".", sizeof walked - strlen(walked) - 1);
        strncat(walked, seg, sizeof walked - strlen(walked) - 1);
        if (!next) {
            json_object_set_new(cur, seg, val);
            return 0;
        }
        json_t *child = json_object_get(cur, seg);
        if (!child) {
            child = json_object();
            json_object_set_new(cur, seg, child);
        } else if (!json_is_object(child)) {
            json_decref(val);
            return zn_cfg_err(ctx, walked, "--set %s: not an object", ov);
        }
        cur = child;
        seg = next;
    }
    json_decref(val);
    return zn_cfg_err(ctx, "--set", "%s: empty key path", ov);
}

int zn_config_parse(zn_config *cfg, const char *json, const char *name,
                    const char *const *overrides, int n_overrides)
{
    json_error_t jerr;
    zn_config_default(cfg);
    snprintf(cfg->source, sizeof cfg->source, "%s", name);
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return zn_set_error(ZN_ECONFIG, "%s:%d:%d: %s", name, jerr.line, jerr.column, jerr.text);
    int rc = 0;
    parse_ctx ctx = { .cfg = cfg, .file = name, .overrides = overrides,
                      .n_overrides = n_overrides };
    if (!json_is_object(root)) {
        rc = zn_set_error(ZN_ECONFIG, "%s: the top level must be an object, got %s",
                          name, zn_json_kind(root));
        goto out;
    }
    for (int i = 0; i < n_overrides; i++)
        apply_override(&ctx, root, overrides[i]);
    parse_object(&ctx, "", root);

    /* What the HF Trainer does when the DeepSpeed config leaves them out. */
    const zn_config_train *t = &cfg->train;
    json_t *opt = json_object_get(root, "optimizer");
    if (!opt || json_is_null(opt)) {
        cfg->optimizer_from_train = true;
        zn_cfg_warn(&ctx, "optimizer", "no optimizer section: AdamW with zinc's training defaults "
                 "(train.learning_rate %g, betas [%g, %g], eps %g, weight_decay %g), as the HF "
                 "Trainer does", t->learning_rate, t->adam_beta1, t->adam_beta2, t->adam_epsilon,
                 t->weight_decay);
    }
    json_t *sch = json_object_get(root, "scheduler");
    json_t *olr = json_object_get(json_object_get(opt, "params"), "lr");
    if ((!sch || json_is_null(sch)) && json_is_number(olr)) {
        /* a config written for DeepSpeed itself (its own number for lr):
         * deepspeed.initialize makes no scheduler, the lr stays constant */
        cfg->scheduler.type = ZN_SCHED_NONE;
        zn_cfg_warn(&ctx, "scheduler", "no scheduler section, and the optimizer gives its own lr: "
                    "a constant lr, as DeepSpeed runs such a config (the HF Trainer's schedule "
                    "applies where the optimizer or its lr is \"auto\" or absent)");
    } else if (!sch || json_is_null(sch)) {
        static const char *names[] = { "linear", "cosine", "constant", "constant_with_warmup" };
        cfg->scheduler_from_train = true;
        zn_cfg_warn(&ctx, "scheduler", "no scheduler section: train.lr_scheduler_type '%s' with "
                 "train.warmup_steps %lld over train.steps %lld, as the HF Trainer does",
                 names[t->lr_scheduler_type & 3], (long long)t->warmup_steps,
                 (long long)t->steps);
    }
    if (cfg->origin[zn_cfg_canon_index(zn_cfg_find_key("zero_optimization.sub_group_size"))] !=
            ZN_ORIGIN_AUTO && cfg->zero.sub_group_size == 0)
        zn_cfg_warn(&ctx, "zero_optimization.sub_group_size", "0 (DeepSpeed: a sub-group per "
                 "tensor) only sizes the optimizer's staging; zinc uses its default 1e9");
    zn_config_resolve_auto(cfg, cfg->model.hidden_size, -1);
    zn_cfg_validate(&ctx);

    if (ctx.n_err == 1) {
        rc = zn_set_error(ZN_ECONFIG, "%s: %.*s", name, (int)(ctx.errs_len - 1), ctx.errs);
    } else if (ctx.n_err > 1) {
        /* one line per error, indented under a count */
        char *list = ctx.errs ? ctx.errs : "";
        size_t len = ctx.errs_len ? ctx.errs_len - 1 : 0;
        char *ind = malloc(len * 2 + ctx.n_err * 2 + 16);
        if (ind) {
            size_t o = 0;
            ind[o++] = ' ';
            ind[o++] = ' ';
            for (size_t i = 0; i < len; i++) {
                ind[o++] = list[i];
                if (list[i] == '\n') {
                    ind[o++] = ' ';
                    ind[o++] = ' ';
                }
            }
            ind[o] = '\0';
        }
        rc = zn_set_error(ZN_ECONFIG, "%s: %d errors:\n%s", name, ctx.n_err, ind ? ind : list);
        free(ind);
    }
out:
    free(ctx.errs);
    json_decref(root);
    return rc;
}

int zn_config_load(zn_config *cfg, const char *path,
                   const char *const *overrides, int n_overrides)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return zn_set_error(-errno, "%s: cannot open config: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 16384;
            if (cap > (64u << 20)) {
                free(buf);
                fclose(f);
                return zn_set_error(ZN_ECONFIG, "%s: larger than 64 MiB; not a config file", path);
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return zn_set_error(-ENOMEM, "%s: out of memory", path);
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return zn_set_error(-EIO, "%s: read error", path);
    }
    buf[len] = '\0';
    if (strlen(buf) != len) {
        free(buf);
        return zn_set_error(ZN_ECONFIG, "%s: contains a NUL byte; not a JSON file", path);
    }
    int rc = zn_config_parse(cfg, buf, path, overrides, n_overrides);
    free(buf);
    return rc;
}
