/* The shared half of `zinc generate` and `zinc chat` (cli/gen-impl.h).
 * `zinc generate`: text from a Hugging Face model folder (or a base and a
 * PEFT adapter, unmerged), decoded with a KV cache (include/zinc/generate.h).
 * Text goes through the folder's own tokenizer and chat template in a
 * Python co-process (scripts/zinc_tokenize.py, the renderer zinc prepare
 * uses); --ids and --prompts with "ids" need no tokenizer. Decoding
 * defaults come from the folder's generation_config.json as transformers
 * reads them; the flags carry transformers' generate() names. */
#include <errno.h>
#include <signal.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zinc/ckpt.h"
#include "zinc/config.h"
#include "zinc/cost.h"
#include "zinc/run.h"
#include "zinc/device.h"
#include "zinc/generate.h"
#include "zinc/model.h"
#include "cli/cli.h"

#ifndef ZN_SOURCE_ROOT
#define ZN_SOURCE_ROOT "."
#endif

#include "cli/gen-impl.h"
#include "zinc/nvme.h"

/* ---- the tokenizer co-process ------------------------------------------------------ */


void zn_gc_tok_close(tokenizer *t)
{
    if (t->to)
        fclose(t->to);
    if (t->from)
        fclose(t->from);
    if (t->pid > 0) {
        int st;
        while (waitpid(t->pid, &st, 0) < 0 && errno == EINTR)
            ;
    }
    free(t->line);
    json_decref(t->eos);
    memset(t, 0, sizeof *t);
}

/* One response line (NULL after printing why there is none). */
json_t *zn_gc_tok_read(tokenizer *t)
{
    if (getline(&t->line, &t->cap, t->from) < 0) {
        fprintf(stderr, "zinc: error: generate: the tokenizer process ended without an answer "
                "(its error is above)\n");
        return NULL;
    }
    json_error_t je;
    json_t *r = json_loads(t->line, 0, &je);
    if (!r) {
        fprintf(stderr, "zinc: error: generate: the tokenizer answered '%s'\n", t->line);
        return NULL;
    }
    json_t *err = json_object_get(r, "error");
    if (err) {
        fprintf(stderr, "zinc: error: generate: tokenizer: %s\n", json_string_value(err));
        json_decref(r);
        return NULL;
    }
    return r;
}

int zn_gc_tok_open(tokenizer *t, const char *model)
{
    char script[4096], py[4096];
    memset(t, 0, sizeof *t);
    snprintf(script, sizeof script, "%s/scripts/zinc_tokenize.py", ZN_SOURCE_ROOT);
    const char *env = getenv("ZINC_PYTHON");
    snprintf(py, sizeof py, "%s", env && *env ? env : ZN_SOURCE_ROOT "/.venv/bin/python");
    if (access(py, X_OK)) {
        fprintf(stderr, "zinc: error: generate: %s: %s: text needs the tokenizer's virtual "
                "environment (`bash %s/scripts/setup.sh venv`, or ZINC_PYTHON), or give the "
                "prompt as --ids\n", py, strerror(errno), ZN_SOURCE_ROOT);
        return -1;
    }
    int in[2], out[2];
    if (pipe(in))
        return -1;
    if (pipe(out)) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "zinc: error: generate: fork: %s\n", strerror(errno));
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        return -1;
    }
    if (!pid) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execl(py, py, script, model, (char *)NULL);
        fprintf(stderr, "zinc: error: generate: exec %s: %s\n", py, strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    t->pid = pid;
    t->to = fdopen(in[1], "w");
    t->from = fdopen(out[0], "r");
    if (!t->to || !t->from) {
        zn_gc_tok_close(t);
        return -1;
    }
    json_t *r = zn_gc_tok_read(t);
    if (!r) {
        zn_gc_tok_close(t);
        return -1;
    }
    t->eos = json_incref(json_object_get(r, "eos"));
    json_decref(r);
    return 0;
}

/* Sends `req` (stolen) and returns the answer's `key`, or NULL. */
json_t *zn_gc_tok_ask(tokenizer *t, json_t *req, const char *key)
{
    char *s = json_dumps(req, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(req);
    if (!s || fprintf(t->to, "%s\n", s) < 0 || fflush(t->to)) {
        free(s);
        fprintf(stderr, "zinc: error: generate: the tokenizer process is gone\n");
        return NULL;
    }
    free(s);
    json_t *r = zn_gc_tok_read(t);
    if (!r)
        return NULL;
    json_t *v = json_incref(json_object_get(r, key));
    json_decref(r);
    return v;
}

json_t *zn_gc_ids_json(const int32_t *ids, int64_t n)
{
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* Text of ids, malloc'd, or NULL. */
char *zn_gc_tok_decode(tokenizer *t, const int32_t *ids, int64_t n)
{
    json_t *req = json_object();
    json_object_set_new(req, "decode", zn_gc_ids_json(ids, n));
    json_t *v = zn_gc_tok_ask(t, req, "text");
    char *s = v && json_is_string(v) ? strdup(json_string_value(v)) : NULL;
    json_decref(v);
    return s;
}

/* ---- prompts ----------------------------------------------------------------------- */


int zn_gc_prompts_add(prompts *p, json_t *arr, const char *where)
{
    if (!json_is_array(arr) || !json_array_size(arr)) {
        fprintf(stderr, "zinc: error: generate: %s: the prompt's ids must be a non-empty list "
                "of integers\n", where);
        return -1;
    }
    if (p->n == p->cap) {
        int64_t c = p->cap ? 2 * p->cap : 16;
        int32_t **a = realloc(p->ids, (size_t)c * sizeof *a);
        if (a)
            p->ids = a;
        int64_t *l = realloc(p->len, (size_t)c * sizeof *l);
        if (l)
            p->len = l;
        if (!a || !l)
            return -1;
        p->cap = c;
    }
    size_t n = json_array_size(arr);
    int32_t *v = malloc(n * sizeof *v);
    if (!v)
        return -1;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            json_integer_value(x) > INT32_MAX) {
            fprintf(stderr, "zinc: error: generate: %s: id %zu is not a token id\n", where, i);
            free(v);
            return -1;
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    p->ids[p->n] = v;
    p->len[p->n++] = (int64_t)n;
    return 0;
}

void zn_gc_prompts_free(prompts *p)
{
    for (int64_t i = 0; i < p->n; i++)
        free(p->ids[i]);
    free(p->ids);
    free(p->len);
}

/* A prompt record (jsonl line or a flag) to ids through the tokenizer. */
int zn_gc_prompt_from(prompts *p, tokenizer *t, json_t *rec, const char *where)
{
    json_t *ids = json_object_get(rec, "ids");
    if (ids)
        return zn_gc_prompts_add(p, ids, where);
    json_t *req = json_object();
    json_t *msgs = json_object_get(rec, "messages"), *text = json_object_get(rec, "prompt");
    if (json_is_array(msgs)) {
        json_object_set(req, "messages", msgs);
    } else if (json_is_string(text)) {
        json_object_set(req, "text", text);
    } else {
        json_decref(req);
        fprintf(stderr, "zinc: error: generate: %s: a prompt needs \"prompt\" (text), "
                "\"messages\" (a chat) or \"ids\"\n", where);
        return -1;
    }
    if (!t->pid) {
        json_decref(req);
        fprintf(stderr, "zinc: error: generate: %s: text prompts need the model's tokenizer\n",
                where);
        return -1;
    }
    json_t *v = zn_gc_tok_ask(t, req, "ids");
    if (!v)
        return -1;
    int rc = zn_gc_prompts_add(p, v, where);
    json_decref(v);
    return rc;
}

/* ---- defaults from the folder ------------------------------------------------------ */

void zn_gc_eos_from(zn_gen_params *gp, json_t *v)
{
    if (json_is_integer(v) && gp->n_eos < ZN_GEN_MAX_EOS) {
        gp->eos[gp->n_eos++] = (int32_t)json_integer_value(v);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x)
            if (json_is_integer(x) && gp->n_eos < ZN_GEN_MAX_EOS)
                gp->eos[gp->n_eos++] = (int32_t)json_integer_value(x);
    }
}

/* generation_config.json's settings over zn_gen_params_default, eos from
 * it or config.json. Returns 0 or 1 after printing a malformed file. */
int zn_gc_folder_defaults(const char *dir, zn_gen_params *gp)
{
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    json_t *g = NULL;
    if (!access(path, F_OK) && !(g = json_load_file(path, 0, &je))) {
        fprintf(stderr, "zinc: error: generate: %s:%d: %s\n", path, je.line, je.text);
        return 1;
    }
    if (g) {
        json_t *v;
        if ((v = json_object_get(g, "do_sample")) && json_is_boolean(v))
            gp->do_sample = json_is_true(v);
        if ((v = json_object_get(g, "temperature")) && json_is_number(v))
            gp->temperature = json_number_value(v);
        if ((v = json_object_get(g, "top_k")) && json_is_integer(v))
            gp->top_k = json_integer_value(v);
        if ((v = json_object_get(g, "top_p")) && json_is_number(v))
            gp->top_p = json_number_value(v);
        if ((v = json_object_get(g, "repetition_penalty")) && json_is_number(v))
            gp->repetition_penalty = json_number_value(v);
        if ((v = json_object_get(g, "max_new_tokens")) && json_is_integer(v))
            gp->max_new_tokens = json_integer_value(v);
        zn_gc_eos_from(gp, json_object_get(g, "eos_token_id"));
        json_decref(g);
    }
    if (!gp->n_eos) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        json_t *c = json_load_file(path, 0, &je);
        if (c)
            zn_gc_eos_from(gp, json_object_get(c, "eos_token_id"));
        json_decref(c);
    }
    return 0;
}

/* ---- streaming ----------------------------------------------------------------------- */


int zn_gc_on_token(void *ctx, int64_t seq, int32_t id, int last)
{
    streamer *s = ctx;
    (void)seq;
    if (!s->stream)
        return 0;
    if (s->n == s->cap) {
        int64_t c = s->cap ? 2 * s->cap : 64;
        int32_t *g = realloc(s->gen, (size_t)c * sizeof *g);
        if (!g)
            return zn_set_error(-ENOMEM, "out of memory");
        s->gen = g;
        s->cap = c;
    }
    s->gen[s->n++] = id;
    char *text = zn_gc_tok_decode(s->tok, s->gen, s->n);
    if (!text)
        return zn_set_error(-EIO, "the tokenizer could not decode the ids");
    size_t len = strlen(text);
    /* hold back an incomplete character (decoded as U+FFFD) until it is whole */
    if (!last && len >= 3 && !memcmp(text + len - 3, "\xef\xbf\xbd", 3))
        len -= 3;
    if (len > s->printed) {
        fwrite(text + s->printed, 1, len - s->printed, stdout);
        fflush(stdout);
        s->printed = len;
    }
    free(text);
    if (last)
        putchar('\n');
    return 0;
}

/* ---- the decoding flags both commands take ---------------------------------------------- */




int zn_gc_num_arg(const char *name, const char *s, double lo, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo)) {
        fprintf(stderr, "zinc: error: %s: bad value '%s'\n", name, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* One of DECODE_OPTIONS: 0, or 2 after printing a bad value. */
int zn_gc_decode_flag(int c, const char *arg, decode_flags *f)
{
    switch (c) {
    case 'n': return zn_gc_num_arg("--max-new-tokens", arg, 1, &f->max_new) ? 2 : 0;
    case 'S': f->do_sample = 1; return 0;
    case 'G': f->do_sample = 0; return 0;
    case 'T': return zn_gc_num_arg("--temperature", arg, 1e-30, &f->temp) ? 2 : 0;
    case 'k': return zn_gc_num_arg("--top-k", arg, 0, &f->topk) ? 2 : 0;
    case 'q': return zn_gc_num_arg("--top-p", arg, 1e-30, &f->topp) ? 2 : 0;
    case 'r': return zn_gc_num_arg("--repetition-penalty", arg, 1e-30, &f->rep) ? 2 : 0;
    default: return zn_gc_num_arg("--seed", arg, 0, &f->seed) ? 2 : 0;
    }
}

/* --checkpoint: the checkpoint's model (its dims and LoRA), and the HF
 * folder for the tokenizer and the base: --model, else the one the run
 * recorded (model_out). A --model of another shape is refused. Returns 0 or
 * 1 after printing an error. */
int zn_gc_ckpt_source(const char *ckpt, const char *model, char *model_out, size_t n,
                       zn_model_dims *d, const char *cmd)
{
    char what[64];
    snprintf(what, sizeof what, "%s: --checkpoint", cmd);
    zn_ckpt *ck = NULL;
    int rc = zn_ckpt_open(&ck, ckpt);
    if (!rc && (rc = zn_ckpt_dims(ck, d)) == -ENOENT)
        rc = zn_set_error(ZN_ECONFIG, "%s records no model shape (a checkpoint of `zinc train` "
                          "with a model section or --model has one)", ckpt);
    if (!rc && !model && zn_ckpt_model_path(ck, model_out, n)) {
        rc = zn_set_error(ZN_ECONFIG, "%s records no model folder: give --model DIR (the HF "
                          "folder it was trained from, for the tokenizer%s)", ckpt,
                          d->lora.r > 0 ? " and the base weights" : "");
    } else if (!rc && model) {
        snprintf(model_out, n, "%s", model);
        zn_model_dims md;
        if (!(rc = zn_model_dims_from_hf(&md, model))) {
            md.lora = d->lora;
            if ((rc = zn_ckpt_check_dims(ck, &md))) {
                char why[512];
                snprintf(why, sizeof why, "%s", zn_last_error());
                rc = zn_set_error(ZN_ECONFIG, "%s (the config being --model %s)", why, model);
            }
        }
    }
    zn_ckpt_close(ck);
    return rc ? zn_cli_fail(rc, what) : 0;
}

/* The decoding settings (the folder's generation_config.json, then the
 * flags) and the model's dims (with the adapter's LoRA; already set when
 * `have_dims`, from a checkpoint). Returns 0, or 1 after printing an error. */
int zn_gc_decode_setup(const decode_flags *f, const char *model, const char *adapter,
                        const char *cmd, int have_dims, zn_gen_params *gp, zn_model_dims *d)
{
    char what[64];
    int rc;
    *gp = zn_gen_params_default();
    if (zn_gc_folder_defaults(model, gp))
        return 1;
    if (f->max_new > 0)
        gp->max_new_tokens = (int64_t)f->max_new;
    if (f->do_sample >= 0)
        gp->do_sample = f->do_sample;
    if (f->temp > 0)
        gp->temperature = f->temp;
    if (f->topk >= 0)
        gp->top_k = (int64_t)f->topk;
    if (f->topp > 0)
        gp->top_p = f->topp;
    if (f->rep > 0)
        gp->repetition_penalty = f->rep;
    gp->seed = (uint64_t)f->seed;
    if ((rc = zn_gen_params_check(gp)) || (!have_dims && (rc = zn_model_dims_from_hf(d, model))))
        return zn_cli_fail(rc, cmd);
    snprintf(what, sizeof what, "%s: --adapter", cmd);
    if (adapter && have_dims) {
        fprintf(stderr, "zinc: error: %s: --adapter and --checkpoint: a LoRA checkpoint holds "
                "its adapters\n", cmd);
        return 2;
    }
    if (adapter && (rc = zn_lora_read_peft_config(adapter, &d->lora)))
        return zn_cli_fail(rc, what);
    return 0;
}

/* A checkpoint's values into the generator. */
int zn_gc_put_ckpt(void *ctx, int block, int i, uint64_t first, const float *v, uint64_t n)
{
    return zn_gen_put(ctx, block, i, first, v, n);
}

/* ---- the model and its generator ------------------------------------------------------ */


void zn_gc_engine_close(engine *e)
{
    zn_gen_destroy(e->g);
    zn_model_destroy(e->m);
    zn_dev_destroy(e->dev);
    memset(e, 0, sizeof *e);
}

/* --kv-cache WHERE: auto (the device when the cache fits beside the least
 * the weights need there, else pinned RAM), device or pinned (there, or
 * refused). Returns 0, or 2 after printing a usage error. */
int zn_gc_kv_flag(const char *arg, int *kv_home, const char *cmd)
{
    if (!strcmp(arg, "auto"))
        *kv_home = ZN_GEN_KV_AUTO;
    else if (!strcmp(arg, "device"))
        *kv_home = ZN_GEN_KV_DEVICE;
    else if (!strcmp(arg, "pinned"))
        *kv_home = ZN_GEN_KV_PINNED;
    else {
        fprintf(stderr, "zinc: error: %s: --kv-cache must be auto, device or pinned (not "
                "'%s')\n", cmd, arg);
        return 2;
    }
    return 0;
}

/* The model (GEMM attention, a context of o->ctx tokens) and its generator
 * of o->batch sequences placed on dev: the one sizing rule generate, chat
 * and bench generate share, so that a bench measures the placement
 * generate makes. Returns the library's code (*m and *g NULL on failure). */
int zn_gc_gen_place(zn_dev *dev, const zn_model_dims *d, zn_dtype dt, const gen_place *o,
                    zn_model **m, zn_gen **g)
{
    *m = NULL;
    *g = NULL;
    zn_model_config mc = zn_model_config_default(dev);
    mc.dtype = dt;
    /* the workspace holds a prompt or a batch's decoded tokens, whichever is
     * more (a batch beyond the context was refused when it held a prompt) */
    mc.max_batch = (o->batch + o->ctx - 1) / o->ctx;
    mc.max_seq = o->ctx;
    mc.attention = ZN_ATTN_GEMM;
    zn_gen_config gc = zn_gen_config_default();
    gc.max_batch = o->batch;
    gc.nvme_dir = o->nvme;
    gc.kv_home = o->kv_home;
    gc.max_resident_layers = o->resident;
    gc.ring = o->ring;
    int rc = zn_model_create(m, dev, d, &mc);
    if (!rc)
        rc = zn_gen_open(g, *m, &gc);
    if (rc) {
        zn_model_destroy(*m);
        *m = NULL;
    }
    return rc;
}

/* The device, then the model and its generator (zn_gc_gen_place: weights
 * resident, or streamed from pinned memory or NVMe where the device has no
 * room; the KV cache where o->kv_home says) and, unless plan_only, loaded
 * (the base and the adapter, unmerged). Returns 0, 1 after printing an
 * error, 2 after a usage error. */
int zn_gc_engine_open(engine *e, const zn_model_dims *d, const char *model, const char *adapter,
                       const char *ckpt, const gen_place *o, int plan_only, const char *cmd)
{
    char what[64];
    int rc;
    memset(e, 0, sizeof *e);
    zn_dev_config dc = zn_dev_config_default();
    dc.name = o->device;
    if (o->gpu_mem && (rc = zn_parse_size(o->gpu_mem, &dc.gpu_budget))) {
        snprintf(what, sizeof what, "%s: --gpu-mem", cmd);
        return zn_cli_fail(rc, what);
    }
    if (o->dtype && strcmp(o->dtype, "f32") && strcmp(o->dtype, "bf16")) {
        fprintf(stderr, "zinc: error: %s: --dtype must be f32 or bf16\n", cmd);
        return 2;
    }
    if ((rc = zn_dev_create(&e->dev, &dc))) {
        snprintf(what, sizeof what, "%s: device", cmd);
        return zn_cli_fail(rc, what);
    }
    e->dt = zn_model_config_default(e->dev).dtype;
    if (o->dtype)
        e->dt = strcmp(o->dtype, "f32") ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    e->kv_home = o->kv_home;
    if ((rc = zn_gc_gen_place(e->dev, d, e->dt, o, &e->m, &e->g))) {
        snprintf(what, sizeof what, "%s: placing the model", cmd);
        zn_gc_engine_close(e);
        return zn_cli_fail(rc, what);
    }
    if (plan_only)
        return 0;
    double t0 = zn_now_s();
    if (ckpt) { /* a LoRA checkpoint holds the adapters only: the base from its folder */
        rc = d->lora.r > 0 ? zn_gen_load_base(e->g, model) : 0;
        if (!rc)
            rc = zn_ckpt_read_weights(ckpt, zn_gc_put_ckpt, e->g);
    } else {
        rc = zn_gen_load(e->g, model, adapter);
    }
    if (rc) {
        snprintf(what, sizeof what, "%s: loading %s", cmd,
                 ckpt ? "the checkpoint" : adapter ? "the base and adapter" : "weights");
        zn_gc_engine_close(e);
        return zn_cli_fail(rc, what);
    }
    e->load_s = zn_now_s() - t0;
    return 0;
}

/* Where the weights are, in one line for people. */
void zn_gc_placement_line(const engine *e, char *buf, size_t n)
{
    zn_gen_placement p;
    zn_gen_get_placement(e->g, &p);
    char a[32];
    int w;
    if (!p.streamed_layers)
        w = snprintf(buf, n, "every weight on the device (%s)",
                     zn_format_size(p.device_weight_bytes, a, sizeof a));
    else
        w = snprintf(buf, n, "%d of %d layers on the device, %d streamed from %s through %d slots "
                     "(%s per step)", p.resident_layers, p.layers, p.streamed_layers,
                     p.nvme_bytes ? "NVMe" : "pinned RAM", p.ring,
                     zn_format_size(p.streamed_bytes_per_step, a, sizeof a));
    if (p.kv_pinned && w >= 0 && (size_t)w < n)
        snprintf(buf + w, n - (size_t)w, ", KV cache in pinned RAM");
}

/* The figures the plan's bound divides by: a named target's (--target),
 * else this machine's from the cost model's cache (ZINC_CACHE_DIR, as
 * `zinc plan --tune` keeps them), measured now with --recalibrate. A
 * figure nobody measured stays 0. Returns 0, or 1 / 2 after printing an
 * error. */
int zn_gc_link_figures(const char *device, const char *nvme, const char *target,
                       int recalibrate, zn_ceilings *c, const char *cmd)
{
    memset(c, 0, sizeof *c);
    if (target) {
        const zn_ceilings *t = zn_cost_target(target);
        if (!t) {
            fprintf(stderr, "zinc: error: %s: --target %s: not a target zinc knows (%s)\n", cmd,
                    target, zn_cost_target_names());
            return 2;
        }
        *c = *t;
        return 0;
    }
    zn_config cfg;
    zn_config_default(&cfg);
    snprintf(cfg.train.device, sizeof cfg.train.device, "%s", device);
    if (nvme) {
        cfg.tiers.n_nvme = 1;
        snprintf(cfg.tiers.nvme[0].path, sizeof cfg.tiers.nvme[0].path, "%s", nvme);
    }
    zn_cost_compute comp;
    int rc = zn_run_ceilings(&cfg, NULL, recalibrate ? ZN_CEIL_RECALIBRATE : ZN_CEIL_CACHED, c,
                             &comp, stderr);
    if (rc) {
        char what[64];
        snprintf(what, sizeof what, "%s: the link's figures", cmd);
        return zn_cli_fail(rc, what);
    }
    return 0;
}

/* The bytes one decoding step of B sequences at context ctx_tokens (tokens
 * cached per sequence) moves with placement p: the streamed layers, a
 * pinned cache's cached rows (ctx_tokens per sequence) and the gathered
 * embedding rows in; a pinned cache's new rows and the logits out; the
 * NVMe-homed layers read. The plan, its bound and the bench's check of
 * what a run moved all count with this. */
void zn_gc_step_bytes(const zn_gen_placement *p, int64_t B, int64_t ctx_tokens,
                      gen_step_bytes *s)
{
    uint64_t b = (uint64_t)B;
    s->h2d = p->streamed_bytes_per_step + b * p->embed_row_bytes;
    s->d2h = b * p->logits_row_bytes;
    s->nvme = p->nvme_bytes ? p->streamed_bytes_per_step : 0;
    if (p->kv_pinned) {
        s->h2d += b * (uint64_t)ctx_tokens * p->kv_token_bytes;
        s->d2h += b * p->kv_token_bytes;
    }
}

/* The least seconds a decoding step of B sequences at context `ctx_tokens`
 * (tokens cached per sequence) takes on figures c: each resource alone
 * (the host link, the device-to-host link and NVMe reads with the bytes
 * of zn_gc_step_bytes; the compute: comp_s when it is measured (>= 0),
 * else from a GEMM rate), the busiest one (*by names it); on shared cores
 * (the host backend) compute and the copies added, or the disk when
 * longer. 0 when nothing moves (*by "nothing") or a figure it
 * needs is unknown (*by "unknown"). */
double zn_gc_step_bound(const zn_gen_placement *p, int64_t B, int64_t ctx_tokens,
                        const zn_ceilings *c, const zn_model_dims *d, double comp_s,
                        const char **by)
{
    gen_step_bytes sb;
    zn_gc_step_bytes(p, B, ctx_tokens, &sb);
    *by = "nothing";
    if ((sb.h2d && !(c->h2d_bps > 0)) || (sb.nvme && !(c->nvme_read_bps > 0))) {
        *by = "unknown";
        return 0;
    }
    double comp = comp_s >= 0 ? comp_s : 0;
    if (comp_s < 0 && c->gemm_flops > 0) {
        uint64_t pc = zn_model_param_count(d);
        if (!d->tie_embeddings)
            pc -= (uint64_t)(d->vocab * d->hidden); /* a gather, not a GEMM */
        comp = 2.0 * (double)pc * (double)B /
               (c->gemm_flops * (c->model_eff > 0 ? c->model_eff : 1));
    }
    double t = 0, h2d = c->h2d_bps > 0 ? (double)sb.h2d / c->h2d_bps : 0;
    double d2h = c->d2h_bps > 0 ? (double)sb.d2h / c->d2h_bps : 0;
    double rd = sb.nvme ? (double)sb.nvme / c->nvme_read_bps : 0;
    if (c->shared_cores) {
        /* the host backend: its copies are memcpy on the cores that
         * compute, so they add (the cost model's rule); the disk beside */
        t = comp + h2d + d2h;
        *by = comp > 0 ? "compute and copies on the shared cores" : "the copies";
        if (rd > t)
            t = rd, *by = "NVMe reads";
        return t;
    }
    if (h2d > t)
        t = h2d, *by = "the host link";
    if (d2h > t)
        t = d2h, *by = "the device-to-host link";
    if (rd > t)
        t = rd, *by = "NVMe reads";
    if (comp > t)
        t = comp, *by = "compute";
    return t;
}

/* `--plan`: what is where, the cache, the bytes a decoding step moves, and
 * the bound they put on decode tokens/s over the link figures `c`
 * (zn_gc_link_figures): each resource alone, the step no faster than the
 * busiest (the copies overlap compute and each other). */
void zn_gc_print_plan(const engine *e, int64_t ctx, int64_t B, const zn_ceilings *c,
                      const zn_model_dims *d)
{
    zn_gen_placement p;
    zn_gen_get_placement(e->g, &p);
    zn_dev_info di;
    zn_dev_get_info(e->dev, &di);
    zn_dev_mem ms;
    zn_dev_mem_stats(e->dev, &ms);
    char a[32], b[32], cc[32];
    printf("device       %s, %s, arena %s, %s allocated\n", di.name, zn_dtype_name(e->dt),
           zn_format_size(ms.budget, a, sizeof a), zn_format_size(ms.used, b, sizeof b));
    printf("layers       %d of %d on the device, %d streamed from %s (%s each) "
           "through %d device slots\n", p.resident_layers, p.layers, p.streamed_layers,
           p.nvme_bytes ? "NVMe" : "pinned RAM", zn_format_size(p.layer_bytes, a, sizeof a),
           p.ring);
    if (p.nvme_bytes)
        printf("nvme         %s of swap for the streamed layers; each read into a pinned stage "
               "per slot\n", zn_format_size(p.nvme_bytes, a, sizeof a));
    printf("embedding    %s\n", p.embed_resident ? "on the device"
                                                 : "pinned RAM (its rows gathered per step)");
    printf("weights      %s on the device (ring slots included), %s pinned\n",
           zn_format_size(p.device_weight_bytes, a, sizeof a),
           zn_format_size(p.pinned_bytes, b, sizeof b));
    printf("kv cache     %s per sequence of %lld tokens, %lld sequences: %s ",
           zn_format_size(p.kv_bytes_per_seq, a, sizeof a), (long long)ctx, (long long)B,
           zn_format_size(p.kv_bytes, cc, sizeof cc));
    if (p.kv_pinned)
        printf("in pinned RAM (%s): each layer's through one of 2 device slots (%s "
               "together), its rows copied in while the layer before computes\n",
               e->kv_home == ZN_GEN_KV_PINNED ? "--kv-cache pinned"
                                              : "the device cannot hold it beside the weights",
               zn_format_size(p.kv_device_bytes, a, sizeof a));
    else
        printf("on the device\n");

    /* a step's bytes at context t (tokens cached per sequence) */
    uint64_t w_h2d = p.streamed_bytes_per_step;
    uint64_t w_nvme = p.nvme_bytes ? p.streamed_bytes_per_step : 0;
    uint64_t kv_full = p.kv_pinned ? (uint64_t)B * (uint64_t)(ctx - 1) * p.kv_token_bytes : 0;
    uint64_t kv_out = p.kv_pinned ? (uint64_t)B * p.kv_token_bytes : 0;
    printf("per step     %s of weights host to device", zn_format_size(w_h2d, a, sizeof a));
    if (p.streamed_layers && !w_h2d)
        printf(" (the slots hold every streamed layer: loaded once)");
    if (w_nvme)
        printf(", read from NVMe first");
    if (p.kv_pinned)
        printf("; kv cache %s in per 1k tokens of context and sequence (%s with %lld at the "
               "full %lld), %s out", zn_format_size(p.kv_token_bytes * 1000, b, sizeof b),
               zn_format_size(kv_full, cc, sizeof cc), (long long)B, (long long)ctx,
               zn_format_size(kv_out, a, sizeof a));
    if (p.embed_row_bytes)
        printf("; embedding rows %s in", zn_format_size((uint64_t)B * p.embed_row_bytes, a,
                                                          sizeof a));
    printf("; logits %s out\n", zn_format_size((uint64_t)B * p.logits_row_bytes, a, sizeof a));

    if (!w_h2d && !p.kv_pinned) {
        printf("bound        nothing crosses the link per step: decoding is the device's "
               "compute\n");
        return;
    }
    if (!(c->h2d_bps > 0) || (w_nvme && !(c->nvme_read_bps > 0))) {
        printf("bound        unknown: no measured %s for this machine (`zinc generate --plan "
               "--recalibrate` measures it once and keeps it; or --target %s)\n",
               c->h2d_bps > 0 ? "NVMe read rate" : "host link", zn_cost_target_names());
        if (di.pcie_peak_gbs > 0 && w_h2d)
            printf("             the link's %.1f GB/s peak alone would allow %.1f tokens/s "
                   "with %lld sequences\n", di.pcie_peak_gbs,
                   di.pcie_peak_gbs * 1e9 / (double)w_h2d * (double)B, (long long)B);
        return;
    }
    /* the busiest resource at contexts 0 (weights alone) and full */
    double t[2];
    const char *by[2];
    for (int full = 0; full < 2; full++)
        t[full] = zn_gc_step_bound(&p, B, full ? ctx - 1 : 0, c, d, -1, &by[full]);
    if (t[0] > 0)
        printf("bound        decode at most %.1f tokens/s with %lld sequences (%.2f steps/s, %s)",
               (double)B / t[0], (long long)B, 1 / t[0], by[0]);
    else
        printf("bound        none from the link as the cache starts");
    if (p.kv_pinned && t[1] > 0)
        printf(" as the cache starts, %.1f tokens/s with it full (%s)", (double)B / t[1], by[1]);
    printf("\n             over host to device %.2f GB/s", c->h2d_bps / 1e9);
    if (p.kv_pinned && c->d2h_bps > 0)
        printf(", device to host %.2f GB/s", c->d2h_bps / 1e9);
    if (w_nvme)
        printf(", NVMe read %.2f GB/s", c->nvme_read_bps / 1e9);
    if (c->gemm_flops > 0)
        printf(", GEMM %.0f TFLOP/s x %.2f", c->gemm_flops / 1e12, c->model_eff);
    if (strcmp(c->name, "this machine"))
        printf(": the %s target's figures (%s)\n", c->name, c->source);
    else
        printf(": %s\n", c->source);
    if (c->shared_cores)
        printf("             (the host backend: copies and compute share the cores, so the "
               "bound is their sum, not the busiest)\n");
}

/* The model to run (a folder, or --checkpoint with the folder it records
 * or --model), its dims and the decoding settings: zn_gc_ckpt_source then
 * zn_gc_decode_setup. *model may point into model_buf afterwards. Returns
 * 0, or 1 / 2 after printing an error. */
int zn_gc_setup(const decode_flags *f, const char **model, char *model_buf, size_t n,
                const char *adapter, const char *ckpt, const char *cmd, zn_gen_params *gp,
                zn_model_dims *d)
{
    if (ckpt) {
        if (zn_gc_ckpt_source(ckpt, *model, model_buf, n, d, cmd))
            return 1;
        *model = model_buf;
    }
    return zn_gc_decode_setup(f, *model, adapter, cmd, ckpt != NULL, gp, d);
}

/* SIGINT, SIGTERM, SIGHUP: the NVMe swap files go first (unlink only:
 * async-signal-safe), then the signal takes its default course. */
static void on_signal(int sig)
{
    zn_swap_remove_all_now();
    signal(sig, SIG_DFL);
    raise(sig);
}

void zn_gc_install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}
