/* LLaMA-Factory training recipes: the flat YAML of `llamafactory-cli train
 * RECIPE.yaml` (model, method, dataset, output, train and eval keys), read
 * with libyaml and turned into what zinc runs: the DeepSpeed config the
 * recipe names (or none), --set overrides with the HF Trainer's names that
 * zinc already resolves "auto" from, and the data to prepare. Every key is
 * honoured, accepted as changing nothing zinc computes (with a note), or
 * refused with the reason: a recipe never trains other than it says. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

#include "zinc/config.h"

/* How a key is taken. */
typedef enum {
    K_NUM,    /* a number, set as train.<key> */
    K_STR,    /* a string, set as train.<key> */
    K_NOTE,   /* accepted: changes nothing zinc computes (the note says why) */
    K_SPECIAL /* handled in take() */
} kind;

typedef struct {
    const char *key;
    kind k;
    const char *note; /* K_NOTE: why it changes nothing; K_NUM/K_STR: the zinc key, NULL: train.<key> */
} rule;

static const rule rules[] = {
    /* model */
    { "model_name_or_path", K_SPECIAL, NULL },
    { "trust_remote_code", K_NOTE, "zinc runs no model code from the folder" },
    /* method */
    { "stage", K_SPECIAL, NULL },
    { "do_train", K_SPECIAL, NULL },
    { "finetuning_type", K_SPECIAL, NULL },
    { "lora_rank", K_SPECIAL, NULL },
    { "lora_alpha", K_SPECIAL, NULL },
    { "lora_dropout", K_SPECIAL, NULL },
    { "lora_target", K_SPECIAL, NULL },
    { "use_rslora", K_SPECIAL, NULL },
    { "use_dora", K_SPECIAL, NULL },
    { "deepspeed", K_SPECIAL, NULL },
    /* dataset */
    { "dataset", K_SPECIAL, NULL },
    { "eval_dataset", K_SPECIAL, NULL },
    { "dataset_dir", K_SPECIAL, NULL },
    { "template", K_SPECIAL, NULL },
    { "cutoff_len", K_SPECIAL, NULL },
    { "max_samples", K_SPECIAL, NULL },
    { "val_size", K_SPECIAL, NULL },
    { "overwrite_cache", K_NOTE, "zinc prepares the data again each run" },
    { "preprocessing_num_workers", K_NOTE, "tokenizing is zinc prepare's" },
    { "dataloader_num_workers", K_NOTE, "zinc reads its token file directly" },
    { "packing", K_NOTE, "zinc packs documents that do not attend to each other, which "
                         "computes what one document per sequence does" },
    /* output */
    { "output_dir", K_SPECIAL, NULL },
    { "logging_steps", K_NUM, NULL },
    { "save_steps", K_NUM, NULL },
    { "save_total_limit", K_NUM, NULL },
    { "plot_loss", K_SPECIAL, NULL },
    { "overwrite_output_dir", K_NOTE, "zinc writes into output_dir as it is" },
    { "save_only_model", K_NOTE, "zinc's checkpoints always hold what a resume needs" },
    { "report_to", K_SPECIAL, NULL },
    /* train */
    { "per_device_train_batch_size", K_NUM, NULL },
    { "gradient_accumulation_steps", K_NUM, NULL },
    { "learning_rate", K_NUM, NULL },
    { "num_train_epochs", K_NUM, NULL },
    { "max_steps", K_NUM, NULL },
    { "lr_scheduler_type", K_STR, NULL },
    { "optim", K_STR, NULL },
    { "warmup_ratio", K_NUM, NULL },
    { "warmup_steps", K_NUM, NULL },
    { "weight_decay", K_NUM, NULL },
    { "adam_beta1", K_NUM, NULL },
    { "adam_beta2", K_NUM, NULL },
    { "adam_epsilon", K_NUM, NULL },
    { "max_grad_norm", K_NUM, NULL },
    { "seed", K_NUM, "train.seed" },
    { "bf16", K_SPECIAL, NULL },
    { "fp16", K_SPECIAL, NULL },
    { "ddp_timeout", K_NOTE, "zinc's ranks fail fast on a dead peer instead of timing out" },
    { "resume_from_checkpoint", K_SPECIAL, NULL },
    /* eval */
    { "per_device_eval_batch_size", K_NOTE, "zinc evaluates with the training micro-batch" },
    { "eval_strategy", K_SPECIAL, NULL },
    { "eval_steps", K_NUM, NULL },
};

static const rule *find_rule(const char *key)
{
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (!strcmp(rules[i].key, key))
            return &rules[i];
    return NULL;
}

static int truthy(const char *v, int *out)
{
    if (!strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) {
        *out = 1;
        return 0;
    }
    if (!strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off")) {
        *out = 0;
        return 0;
    }
    return -1;
}

static int is_number(const char *v)
{
    char *end;
    errno = 0;
    strtod(v, &end);
    return *v && !*end && !errno;
}

static int add_set(zn_recipe *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add_set(zn_recipe *r, const char *fmt, ...)
{
    if (r->n_sets >= ZN_RECIPE_MAX_SETS)
        return zn_set_error(ZN_ECONFIG, "%s: too many settings", r->path);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->sets[r->n_sets], sizeof r->sets[0], fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof r->sets[0])
        return zn_set_error(ZN_ECONFIG, "%s: a setting is too long", r->path);
    r->n_sets++;
    return 0;
}

static void add_note(zn_recipe *r, const char *key, const char *why)
{
    size_t o = strlen(r->notes);
    snprintf(r->notes + o, sizeof r->notes - o, "%s%s (%s)", o ? "; " : "", key, why);
}

/* A path from the recipe: as given when it exists from here (LLaMA-Factory
 * resolves from where it runs), else beside the recipe. */
static void resolve_path(const zn_recipe *r, const char *v, char *out, size_t n)
{
    struct stat st;
    int k = v[0] == '/' || !stat(v, &st) || !r->dir[0] ? snprintf(out, n, "%s", v)
                                                        : snprintf(out, n, "%s/%s", r->dir, v);
    if (k < 0 || (size_t)k >= n)
        out[0] = 0; /* too long: reported as missing where it is needed */
}

#define BAD(...) zn_set_error(ZN_ECONFIG, __VA_ARGS__)

static int take(zn_recipe *r, const char *key, const char *v, int line)
{
    const rule *ru = find_rule(key);
    char where[4200];
    snprintf(where, sizeof where, "%s:%d: %s", r->path, line, key);
    if (!ru) {
        if (!strcmp(key, "do_eval") || !strcmp(key, "do_predict"))
            return BAD("%s: zinc trains (evaluation runs with val_size or eval_dataset)",
                       where);
        return BAD("%s: not a LLaMA-Factory training key zinc knows (zinc would not train as "
                   "the recipe says: remove it or ask for it)", where);
    }
    int b;
    switch (ru->k) {
    case K_NOTE:
        add_note(r, key, ru->note);
        return 0;
    case K_NUM:
        if (!is_number(v))
            return BAD("%s: '%s' is not a number", where, v);
        if (ru->note)
            return add_set(r, "%s=%s", ru->note, v);
        return add_set(r, "train.%s=%s", key, v);
    case K_STR:
        return add_set(r, "train.%s=\"%s\"", key, v);
    case K_SPECIAL:
        break;
    }
    if (!strcmp(key, "model_name_or_path")) {
        struct stat st;
        resolve_path(r, v, r->model, sizeof r->model);
        if (stat(r->model, &st) || !S_ISDIR(st.st_mode))
            return BAD("%s: %s is not a folder here: zinc reads a local HF model folder "
                       "(download it first, e.g. `huggingface-cli download %s --local-dir "
                       "DIR`)", where, v, v);
        return add_set(r, "model.path=\"%s\"", r->model);
    }
    if (!strcmp(key, "stage")) {
        if (strcmp(v, "sft"))
            return BAD("%s: stage '%s': zinc trains stage sft (pt, rm, ppo, dpo, kto are not "
                       "implemented)", where, v);
        return 0;
    }
    if (!strcmp(key, "do_train")) {
        if (truthy(v, &b) || !b)
            return BAD("%s: zinc train trains: do_train must be true", where);
        return 0;
    }
    if (!strcmp(key, "finetuning_type")) {
        if (!strcmp(v, "lora"))
            r->lora = 1;
        else if (strcmp(v, "full"))
            return BAD("%s: '%s': zinc does full and lora (freeze and oft are not "
                       "implemented)", where, v);
        return 0;
    }
    if (!strcmp(key, "lora_rank") || !strcmp(key, "lora_alpha") || !strcmp(key, "lora_dropout")) {
        if (!is_number(v))
            return BAD("%s: '%s' is not a number", where, v);
        if (!strcmp(key, "lora_rank"))
            r->lora_rank = atoi(v);
        else if (!strcmp(key, "lora_alpha"))
            r->lora_alpha = strtod(v, NULL);
        else
            r->lora_dropout = strtod(v, NULL);
        return 0;
    }
    if (!strcmp(key, "lora_target")) {
        snprintf(r->lora_target, sizeof r->lora_target, "%s", v);
        return 0;
    }
    if (!strcmp(key, "use_rslora")) {
        if (truthy(v, &b))
            return BAD("%s: '%s' is not true or false", where, v);
        r->rslora = b;
        return 0;
    }
    if (!strcmp(key, "use_dora")) {
        if (truthy(v, &b))
            return BAD("%s: '%s' is not true or false", where, v);
        return b ? BAD("%s: DoRA is not implemented by zinc", where) : 0;
    }
    if (!strcmp(key, "deepspeed")) {
        resolve_path(r, v, r->ds_config, sizeof r->ds_config);
        return 0;
    }
    if (!strcmp(key, "dataset")) {
        snprintf(r->datasets, sizeof r->datasets, "%s", v);
        return 0;
    }
    if (!strcmp(key, "eval_dataset")) {
        snprintf(r->eval_datasets, sizeof r->eval_datasets, "%s", v);
        return 0;
    }
    if (!strcmp(key, "dataset_dir")) {
        resolve_path(r, v, r->dataset_dir, sizeof r->dataset_dir);
        return 0;
    }
    if (!strcmp(key, "template")) {
        snprintf(r->template_name, sizeof r->template_name, "%s", v);
        return 0;
    }
    if (!strcmp(key, "cutoff_len") || !strcmp(key, "max_samples")) {
        char *end;
        long long n = strtoll(v, &end, 10);
        if (*end || n <= 0)
            return BAD("%s: '%s' is not a positive whole number", where, v);
        if (!strcmp(key, "cutoff_len"))
            r->cutoff_len = n;
        else
            r->max_samples = n;
        return 0;
    }
    if (!strcmp(key, "val_size")) {
        if (!is_number(v) || strtod(v, NULL) < 0)
            return BAD("%s: '%s' is not a fraction (or a count of examples)", where, v);
        r->val_size = strtod(v, NULL);
        return 0;
    }
    if (!strcmp(key, "output_dir")) {
        snprintf(r->output_dir, sizeof r->output_dir, "%s", v); /* from here, as LLaMA-Factory */
        return add_set(r, "train.output_dir=\"%s\"", r->output_dir);
    }
    if (!strcmp(key, "plot_loss")) {
        if (truthy(v, &b))
            return BAD("%s: '%s' is not true or false", where, v);
        r->plot_loss = b;
        return 0;
    }
    if (!strcmp(key, "report_to")) {
        if (!strcmp(v, "none") || !strcmp(v, "[]"))
            return 0;
        if (!strcmp(v, "tensorboard"))
            return add_set(r, "tensorboard.enabled=true");
        return BAD("%s: '%s': zinc sends no metrics to a service (use report_to none or "
                   "tensorboard; zinc train --json-log writes every step)", where, v);
    }
    if (!strcmp(key, "bf16") || !strcmp(key, "fp16")) {
        if (truthy(v, &b))
            return BAD("%s: '%s' is not true or false", where, v);
        if (!strcmp(key, "fp16") && b)
            return BAD("%s: fp16 training is not implemented by zinc's kernels (bf16 is)",
                       where);
        if (!strcmp(key, "bf16"))
            r->bf16 = b ? 1 : 0;
        return 0;
    }
    if (!strcmp(key, "resume_from_checkpoint")) {
        if (strcmp(v, "null") && strcmp(v, "false") && *v)
            return BAD("%s: resume with `zinc train RECIPE.yaml --resume [DIR]`", where);
        return 0;
    }
    if (!strcmp(key, "eval_strategy")) {
        if (strcmp(v, "steps") && strcmp(v, "no"))
            return BAD("%s: '%s': zinc evaluates every eval_steps (steps) or not (no)", where,
                       v);
        return 0;
    }
    return BAD("%s: internal: no handler", where);
}

/* The recipe's settings that need every key first. */
static int finish(zn_recipe *r)
{
    if (!r->model[0])
        return BAD("%s: model_name_or_path is missing", r->path);
    if (!r->datasets[0])
        return BAD("%s: dataset is missing", r->path);
    if (!r->dataset_dir[0])
        resolve_path(r, "data", r->dataset_dir, sizeof r->dataset_dir);
    if (r->lora) {
        int rank = r->lora_rank > 0 ? r->lora_rank : 8;
        /* LLaMA-Factory's defaults: alpha twice the rank, no dropout, "all" */
        double alpha = r->lora_alpha > 0 ? r->lora_alpha : 2.0 * rank;
        const char *t = r->lora_target[0] ? r->lora_target : "all";
        char targets[600];
        if (!strcmp(t, "all")) {
            snprintf(targets, sizeof targets, "\"all-linear\"");
        } else {
            /* a comma list of module names as a JSON list */
            size_t o = 0;
            targets[o++] = '[';
            for (const char *s = t; *s;) {
                size_t n = strcspn(s, ",");
                while (n && s[n - 1] == ' ')
                    n--;
                o += (size_t)snprintf(targets + o, sizeof targets - o, "%s\"%.*s\"",
                                      o > 1 ? "," : "", (int)n, s);
                s += strcspn(s, ",");
                s += *s == ',';
                s += strspn(s, " ");
                if (o >= sizeof targets - 8)
                    return BAD("%s: lora_target is too long", r->path);
            }
            snprintf(targets + o, sizeof targets - o, "]");
        }
        int e;
        if ((e = add_set(r, "lora.r=%d", rank)) || (e = add_set(r, "lora.lora_alpha=%g", alpha)) ||
            (e = add_set(r, "lora.lora_dropout=%g", r->lora_dropout)) ||
            (e = add_set(r, "lora.target_modules=%s", targets)) ||
            (r->rslora && (e = add_set(r, "lora.use_rslora=true"))))
            return e;
    } else if (r->lora_rank || r->lora_alpha > 0 || r->lora_target[0]) {
        return BAD("%s: lora_* keys with finetuning_type full", r->path);
    }
    int e;
    if (r->bf16 == 0 && (e = add_set(r, "bf16.enabled=false")))
        return e;
    if (r->cutoff_len && (e = add_set(r, "data.seq_len=%lld", (long long)r->cutoff_len)))
        return e;
    if (r->template_name[0])
        add_note(r, "template", "the model folder's own chat template renders the data");
    return 0;
}

int zn_recipe_read(const char *path, zn_recipe *r)
{
    memset(r, 0, sizeof *r);
    r->bf16 = -1;
    snprintf(r->path, sizeof r->path, "%s", path);
    const char *slash = strrchr(path, '/');
    if (slash)
        snprintf(r->dir, sizeof r->dir, "%.*s", (int)(slash - path), path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return zn_set_error(-errno, "%s: %s", path, strerror(errno));
    yaml_parser_t p;
    yaml_event_t ev;
    if (!yaml_parser_initialize(&p)) {
        fclose(f);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    yaml_parser_set_input_file(&p, f);
    int rc = 0, depth = 0, done = 0;
    char key[128] = "";
    int have_key = 0;
    while (!rc && !done) {
        if (!yaml_parser_parse(&p, &ev)) {
            rc = BAD("%s:%zu: not YAML: %s", path, p.problem_mark.line + 1,
                     p.problem ? p.problem : "parse error");
            break;
        }
        int line = (int)ev.start_mark.line + 1;
        switch (ev.type) {
        case YAML_MAPPING_START_EVENT:
            if (++depth > 1)
                rc = BAD("%s:%d: %s: a nested mapping: a recipe is flat key: value lines",
                         path, line, have_key ? key : "(value)");
            break;
        case YAML_SEQUENCE_START_EVENT:
            rc = BAD("%s:%d: %s: a list: give it as a comma-separated string, as "
                     "LLaMA-Factory's own recipes do", path, line, have_key ? key : "(value)");
            break;
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        case YAML_SCALAR_EVENT: {
            const char *s = (const char *)ev.data.scalar.value;
            if (depth != 1) {
                rc = BAD("%s:%d: a recipe is a mapping of keys to values", path, line);
            } else if (!have_key) {
                snprintf(key, sizeof key, "%s", s);
                have_key = 1;
            } else {
                /* an unquoted empty value or ~ is YAML's null */
                int null = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                           (!*s || !strcmp(s, "~") || !strcmp(s, "null"));
                rc = take(r, key, null ? "null" : s, line);
                have_key = 0;
            }
            break;
        }
        case YAML_ALIAS_EVENT:
            rc = BAD("%s:%d: YAML aliases are not read in a recipe", path, line);
            break;
        case YAML_STREAM_END_EVENT:
            done = 1;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    fclose(f);
    if (!rc)
        rc = finish(r);
    return rc;
}

int zn_recipe_is_path(const char *path)
{
    size_t n = strlen(path);
    return (n > 5 && !strcmp(path + n - 5, ".yaml")) || (n > 4 && !strcmp(path + n - 4, ".yml"));
}

int zn_recipe_add_data(zn_recipe *r, const char *train, const char *eval)
{
    int e = add_set(r, "data.path=\"%s\"", train);
    if (!e && eval)
        e = add_set(r, "data.eval_path=\"%s\"", eval);
    return e;
}
