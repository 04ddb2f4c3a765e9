/* Private to the config subsystem (src/config/): the schema table's types,
 * the parser's context and the helpers its stages share. schema.c holds the
 * table and the defaults, parse.c turns JSON and --set into a zn_config,
 * resolve.c checks keys against each other and resolves "auto" and the
 * batch sizes, dump.c writes a resolved config back as JSON. */
#ifndef ZN_CONFIG_IMPL_H
#define ZN_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "zinc/config.h"

typedef enum {
    K_OBJ,       /* a section: value must be an object */
    K_BOOL,
    K_INT,       /* int64; an integral JSON real (5e8) is accepted */
    K_INT32,     /* int */
    K_NUM,       /* double */
    K_SIZE,      /* bytes: integer or size string ("24GiB"); "auto" if aux set */
    K_STR,       /* char[ZN_PATH_MAX or cap]; null = "" */
    K_ENUM,      /* string from `choices` ('|'-separated), stored as int index + base */
    K_BATCH,     /* int64 >= 1, or "auto" = 0 (derived) */
    K_BETAS,     /* [beta1, beta2] */
    K_NVME,      /* tiers.nvme: [{path, size}] or a single path string */
    K_TARGETS,   /* lora.target_modules: a list of module names or "all-linear" */
    K_FIXED,     /* DeepSpeed key zinc accepts only at the value in `fixed` */
    K_ACCEPT,    /* DeepSpeed key whose every value matches zinc's behaviour */
    K_UNSUPP,    /* DeepSpeed key zinc does not implement */
    K_OFFSEC,    /* DeepSpeed section accepted only switched off ("enabled" not
                    true, "disable" not false, anywhere inside it) */
    K_TUNING,    /* DeepSpeed key that changes only diagnostics or speed, which
                    zinc does its own way: every value of its type accepted.
                    `choices`: DeepSpeed's default as JSON (its type: bool, or
                    a number in [min, max]); NULL: a section. A value that asks
                    for something (not the default; a section switched on) gets
                    one warning with `note`, what zinc does instead */
} key_kind;

/* What "auto" resolves to (the HF Trainer integration's rules, from
 * transformers' HfTrainerDeepSpeedConfig.trainer_config_process and
 * trainer_config_finalize); A_NONE: "auto" is refused. */
typedef enum {
    A_NONE = 0, A_CLIP, A_BF16, A_FP16, A_LR, A_BETAS, A_EPS, A_WD, A_WMIN, A_WMAX,
    A_WSTEPS, A_TOTAL, A_HSQ, A_HSQ09, A_H10, A_DSDEFAULT,
} auto_rule;

typedef struct {
    const char *path;
    key_kind kind;
    size_t off;       /* offset in zn_config (leaf keys) */
    double min, max;  /* K_INT, K_INT32, K_NUM */
    const char *choices; /* K_ENUM choices; K_FIXED JSON value; K_ACCEPT JSON type;
                            K_TUNING default */
    int aux;          /* K_ENUM base; K_SIZE: offset+1 of the "auto" bool; K_STR cap */
    const char *note; /* why a K_ACCEPT/K_UNSUPP key is what it is; K_TUNING: what
                         zinc does instead */
    int autorule;     /* auto_rule; omitted (0) in most entries */
} key_spec;

#define OFF(f) offsetof(zn_config, f)
#define I64MAX 9.2e18
#define AUTO(f) ((int)(OFF(f) + 1))

/* The schema (schema.c): one entry per key, aliases included. */
extern const key_spec zn_cfg_schema[];
extern const size_t zn_cfg_n_schema;


/* The parser goes on after an error, so that one run reports every problem
 * of a file: each error is appended to `errs` (one line each, key path
 * first) and the parse fails at the end. */
typedef struct {
    zn_config *cfg;
    const char *file;
    char *errs;
    size_t errs_len, errs_cap;
    int n_err;
    const char *const *overrides; /* "key.path=value": leaves under a key are --set */
    int n_overrides;
    /* the K_TUNING notes given: each is said once a parse */
    const char *noted[32];
    int n_noted;
} parse_ctx;

/* schema.c: the schema entry of a key path (NULL: none), the last part of
 * a path, and " (did you mean 'x'?)" for an unknown key (or "" ). */
const key_spec *zn_cfg_find_key(const char *path);
const char *zn_cfg_leaf_of(const char *path);
void zn_cfg_suggest(const char *prefix, const char *key, char *out, size_t len);

/* parse.c: an error (appended to the context's list; returns ZN_ECONFIG)
 * or a warning about key `path`; the schema index a key's origin is kept
 * under (an alias shares its key's). */
int zn_cfg_err(parse_ctx *ctx, const char *path, const char *fmt, ...) ZN_PRINTF(3, 4);
void zn_cfg_warn(parse_ctx *ctx, const char *path, const char *fmt, ...) ZN_PRINTF(3, 4);
size_t zn_cfg_canon_index(const key_spec *k);

/* resolve.c: the cross-key checks after a parse (every problem reported);
 * the origin of the value at a key path. */
int zn_cfg_validate(parse_ctx *ctx);
zn_config_origin zn_cfg_origin_at(const zn_config *c, const char *path);

#endif
