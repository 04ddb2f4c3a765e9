/* `zinc generate`: text from a Hugging Face model folder (or a base and a
 * PEFT adapter, unmerged), decoded with a KV cache (include/zinc/generate.h).
 * Text goes through the folder's own tokenizer and chat template in a
 * Python co-process (scripts/zinc_tokenize.py, the renderer zinc prepare
 * uses); --ids and --prompts with "ids" need no tokenizer. Decoding
 * defaults come from the folder's generation_config.json as transformers
 * reads them; the flags carry transformers' generate() names. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zinc/ckpt.h"
#include "zinc/device.h"
#include "zinc/generate.h"
#include "zinc/model.h"
#include "cli/cli.h"

#ifndef ZN_SOURCE_ROOT
#define ZN_SOURCE_ROOT "."
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zinc generate (--model DIR [--adapter DIR] | --checkpoint DIR [--model DIR])\n"
            "                     (--prompt TEXT | --chat TEXT | --ids ID,ID,.. |\n"
            "                      --prompts FILE.jsonl [--out FILE.jsonl])\n"
            "                     [--max-new-tokens N] [--do-sample | --greedy]\n"
            "                     [--temperature T] [--top-k K] [--top-p P]\n"
            "                     [--repetition-penalty R] [--seed S] [--batch-size B]\n"
            "                     [--context N] [--device auto|host|cuda[:N]] [--dtype f32|bf16]\n"
            "                     [--gpu-mem SIZE] [--json] [--plan]\n"
            "  --model      Hugging Face folder (config.json, safetensors; tokenizer.json\n"
            "               and tokenizer_config.json for text), e.g. a `zinc export`\n"
            "  --adapter    a PEFT LoRA adapter folder for that base, applied unmerged\n"
            "  --checkpoint a `zinc train` checkpoint (a step folder, or the root: its\n"
            "               latest), read in place, no export; the tokenizer (and a LoRA\n"
            "               run's base) from --model or the folder the run recorded\n"
            "  --prompt     raw text (no chat template; BOS as add_bos_token says)\n"
            "  --chat       one user turn through the folder's chat template\n"
            "  --ids        the prompt as token ids (no tokenizer needed)\n"
            "  --prompts    jsonl, one prompt per line: {\"prompt\": TEXT}, {\"messages\":\n"
            "               [{\"role\", \"content\"}, ..]} or {\"ids\": [..]}; generated\n"
            "               together, --batch-size at a time (default 8)\n"
            "  --out        write one JSON object per prompt there (default: stdout)\n"
            "  --json       print JSON objects (index, prompt_ids, ids, text, finish)\n"
            "               instead of streaming the text\n"
            "  decoding     as transformers' generate(): defaults from the folder's\n"
            "               generation_config.json (greedy where it says nothing);\n"
            "               stops at its eos_token_id (or config.json's) and after\n"
            "               --max-new-tokens (default: its max_new_tokens, else 256)\n"
            "  --gpu-mem    the device arena: weights that do not fit it stay in pinned RAM\n"
            "               and stream through the device layer by layer each step\n"
            "  --plan       print what is on the device, what streams, the KV cache and\n"
            "               the bound streaming puts on a step, then stop (nothing loaded)\n"
            "  --context    tokens per sequence the KV cache holds (default: the\n"
            "               longest prompt + max-new-tokens, at most\n"
            "               max_position_embeddings)\n");
}

/* ---- the tokenizer co-process ------------------------------------------------------ */

typedef struct {
    pid_t pid;
    FILE *to, *from;
    char *line;
    size_t cap;
    json_t *eos;
} tokenizer;

static void tok_close(tokenizer *t)
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
static json_t *tok_read(tokenizer *t)
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

static int tok_open(tokenizer *t, const char *model)
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
        tok_close(t);
        return -1;
    }
    json_t *r = tok_read(t);
    if (!r) {
        tok_close(t);
        return -1;
    }
    t->eos = json_incref(json_object_get(r, "eos"));
    json_decref(r);
    return 0;
}

/* Sends `req` (stolen) and returns the answer's `key`, or NULL. */
static json_t *tok_ask(tokenizer *t, json_t *req, const char *key)
{
    char *s = json_dumps(req, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(req);
    if (!s || fprintf(t->to, "%s\n", s) < 0 || fflush(t->to)) {
        free(s);
        fprintf(stderr, "zinc: error: generate: the tokenizer process is gone\n");
        return NULL;
    }
    free(s);
    json_t *r = tok_read(t);
    if (!r)
        return NULL;
    json_t *v = json_incref(json_object_get(r, key));
    json_decref(r);
    return v;
}

static json_t *ids_json(const int32_t *ids, int64_t n)
{
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* Text of ids, malloc'd, or NULL. */
static char *tok_decode(tokenizer *t, const int32_t *ids, int64_t n)
{
    json_t *req = json_object();
    json_object_set_new(req, "decode", ids_json(ids, n));
    json_t *v = tok_ask(t, req, "text");
    char *s = v && json_is_string(v) ? strdup(json_string_value(v)) : NULL;
    json_decref(v);
    return s;
}

/* ---- prompts ----------------------------------------------------------------------- */

typedef struct {
    int64_t n, cap;
    int32_t **ids;
    int64_t *len;
} prompts;

static int prompts_add(prompts *p, json_t *arr, const char *where)
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

static void prompts_free(prompts *p)
{
    for (int64_t i = 0; i < p->n; i++)
        free(p->ids[i]);
    free(p->ids);
    free(p->len);
}

/* A prompt record (jsonl line or a flag) to ids through the tokenizer. */
static int prompt_from(prompts *p, tokenizer *t, json_t *rec, const char *where)
{
    json_t *ids = json_object_get(rec, "ids");
    if (ids)
        return prompts_add(p, ids, where);
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
    json_t *v = tok_ask(t, req, "ids");
    if (!v)
        return -1;
    int rc = prompts_add(p, v, where);
    json_decref(v);
    return rc;
}

/* ---- defaults from the folder ------------------------------------------------------ */

static void eos_from(zn_gen_params *gp, json_t *v)
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
static int folder_defaults(const char *dir, zn_gen_params *gp)
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
        eos_from(gp, json_object_get(g, "eos_token_id"));
        json_decref(g);
    }
    if (!gp->n_eos) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        json_t *c = json_load_file(path, 0, &je);
        if (c)
            eos_from(gp, json_object_get(c, "eos_token_id"));
        json_decref(c);
    }
    return 0;
}

/* ---- streaming ----------------------------------------------------------------------- */

typedef struct {
    tokenizer *tok;
    int stream;         /* print text as it comes (one prompt, no --json) */
    int32_t *gen;       /* the streamed sequence's ids so far */
    int64_t n, cap;
    size_t printed;     /* bytes of its text already printed */
} streamer;

static int on_token(void *ctx, int64_t seq, int32_t id, int last)
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
    char *text = tok_decode(s->tok, s->gen, s->n);
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

typedef struct {
    double max_new, temp, topk, topp, rep, seed; /* < 0 (seed: 0): not given */
    int do_sample;                               /* -1: not given */
} decode_flags;

#define DECODE_FLAGS_UNSET { -1, -1, -1, -1, -1, 0, -1 }

#define DECODE_OPTIONS                                                                       \
    { "max-new-tokens", required_argument, 0, 'n' }, { "do-sample", no_argument, 0, 'S' },   \
    { "greedy", no_argument, 0, 'G' }, { "temperature", required_argument, 0, 'T' },         \
    { "top-k", required_argument, 0, 'k' }, { "top-p", required_argument, 0, 'q' },          \
    { "repetition-penalty", required_argument, 0, 'r' }, { "seed", required_argument, 0, 's' }

static int num_arg(const char *name, const char *s, double lo, double *out)
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
static int decode_flag(int c, const char *arg, decode_flags *f)
{
    switch (c) {
    case 'n': return num_arg("--max-new-tokens", arg, 1, &f->max_new) ? 2 : 0;
    case 'S': f->do_sample = 1; return 0;
    case 'G': f->do_sample = 0; return 0;
    case 'T': return num_arg("--temperature", arg, 1e-30, &f->temp) ? 2 : 0;
    case 'k': return num_arg("--top-k", arg, 0, &f->topk) ? 2 : 0;
    case 'q': return num_arg("--top-p", arg, 1e-30, &f->topp) ? 2 : 0;
    case 'r': return num_arg("--repetition-penalty", arg, 1e-30, &f->rep) ? 2 : 0;
    default: return num_arg("--seed", arg, 0, &f->seed) ? 2 : 0;
    }
}

/* --checkpoint: the checkpoint's model (its dims and LoRA), and the HF
 * folder for the tokenizer and the base: --model, else the one the run
 * recorded (model_out). A --model of another shape is refused. Returns 0 or
 * 1 after printing an error. */
static int ckpt_source(const char *ckpt, const char *model, char *model_out, size_t n,
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
static int decode_setup(const decode_flags *f, const char *model, const char *adapter,
                        const char *cmd, int have_dims, zn_gen_params *gp, zn_model_dims *d)
{
    char what[64];
    int rc;
    *gp = zn_gen_params_default();
    if (folder_defaults(model, gp))
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
static int put_ckpt(void *ctx, int block, int i, uint64_t first, const float *v, uint64_t n)
{
    return zn_gen_put(ctx, block, i, first, v, n);
}

/* ---- the model and its generator ------------------------------------------------------ */

typedef struct {
    zn_dev *dev;
    zn_model *m;
    zn_gen *g;
    zn_dtype dt;
    double load_s;
} engine;

static void engine_close(engine *e)
{
    zn_gen_destroy(e->g);
    zn_model_destroy(e->m);
    zn_dev_destroy(e->dev);
    memset(e, 0, sizeof *e);
}

/* The device, the model (GEMM attention, a context of ctx tokens), the
 * generator of B sequences with its weights placed (resident, or streamed
 * from pinned memory where the device has no room) and, unless plan_only,
 * loaded (the base and the adapter, unmerged). Returns 0, 1 after printing
 * an error, 2 after a usage error. */
static int engine_open(engine *e, const zn_model_dims *d, const char *model, const char *adapter,
                       const char *ckpt, const char *device, const char *dtype,
                       const char *gpu_mem, int64_t ctx, int64_t B, int plan_only,
                       const char *cmd)
{
    char what[64];
    int rc;
    memset(e, 0, sizeof *e);
    zn_dev_config dc = zn_dev_config_default();
    dc.name = device;
    if (gpu_mem && (rc = zn_parse_size(gpu_mem, &dc.gpu_budget))) {
        snprintf(what, sizeof what, "%s: --gpu-mem", cmd);
        return zn_cli_fail(rc, what);
    }
    if (dtype && strcmp(dtype, "f32") && strcmp(dtype, "bf16")) {
        fprintf(stderr, "zinc: error: %s: --dtype must be f32 or bf16\n", cmd);
        return 2;
    }
    if ((rc = zn_dev_create(&e->dev, &dc))) {
        snprintf(what, sizeof what, "%s: device", cmd);
        return zn_cli_fail(rc, what);
    }
    zn_model_config mc = zn_model_config_default(e->dev);
    if (dtype)
        mc.dtype = strcmp(dtype, "f32") ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    e->dt = mc.dtype;
    mc.max_batch = (B + ctx - 1) / ctx; /* the workspace holds a prompt or B decoded tokens */
    mc.max_seq = ctx;
    mc.attention = ZN_ATTN_GEMM;
    zn_gen_config gc = zn_gen_config_default();
    gc.max_batch = B;
    if ((rc = zn_model_create(&e->m, e->dev, d, &mc)) || (rc = zn_gen_open(&e->g, e->m, &gc))) {
        snprintf(what, sizeof what, "%s: placing the model", cmd);
        engine_close(e);
        return zn_cli_fail(rc, what);
    }
    if (plan_only)
        return 0;
    double t0 = zn_now_s();
    if (ckpt) { /* a LoRA checkpoint holds the adapters only: the base from its folder */
        rc = d->lora.r > 0 ? zn_gen_load_base(e->g, model) : 0;
        if (!rc)
            rc = zn_ckpt_read_weights(ckpt, put_ckpt, e->g);
    } else {
        rc = zn_gen_load(e->g, model, adapter);
    }
    if (rc) {
        snprintf(what, sizeof what, "%s: loading %s", cmd,
                 ckpt ? "the checkpoint" : adapter ? "the base and adapter" : "weights");
        engine_close(e);
        return zn_cli_fail(rc, what);
    }
    e->load_s = zn_now_s() - t0;
    return 0;
}

/* Where the weights are, in one line for people. */
static void placement_line(const engine *e, char *buf, size_t n)
{
    zn_gen_placement p;
    zn_gen_get_placement(e->g, &p);
    if (!p.streamed_layers)
    {
        char a[32];
        snprintf(buf, n, "every weight on the device (%s)",
                 zn_format_size(p.device_weight_bytes, a, sizeof a));
    } else {
        char a[32];
        snprintf(buf, n, "%d of %d layers on the device, %d streamed from pinned RAM through %d "
                 "slots (%s per step)", p.resident_layers, p.layers, p.streamed_layers, p.ring,
                 zn_format_size(p.streamed_bytes_per_step, a, sizeof a));
    }
}

/* `--plan`: what is where, the cache, and the bound streaming puts on a
 * decoding step. */
static void print_plan(const engine *e, int64_t ctx, int64_t B)
{
    zn_gen_placement p;
    zn_gen_get_placement(e->g, &p);
    zn_dev_info di;
    zn_dev_get_info(e->dev, &di);
    zn_dev_mem ms;
    zn_dev_mem_stats(e->dev, &ms);
    char a[32], b[32], c[32];
    printf("device       %s, %s, arena %s, %s allocated\n", di.name, zn_dtype_name(e->dt),
           zn_format_size(ms.budget, a, sizeof a), zn_format_size(ms.used, b, sizeof b));
    printf("layers       %d of %d on the device, %d streamed from pinned RAM (%s each) "
           "through %d device slots\n", p.resident_layers, p.layers, p.streamed_layers,
           zn_format_size(p.layer_bytes, a, sizeof a), p.ring);
    printf("embedding    %s\n", p.embed_resident ? "on the device"
                                                 : "pinned RAM (its rows gathered per step)");
    printf("weights      %s on the device (ring slots included), %s pinned\n",
           zn_format_size(p.device_weight_bytes, a, sizeof a),
           zn_format_size(p.pinned_bytes, b, sizeof b));
    printf("kv cache     %s per sequence of %lld tokens, %lld sequences: %s\n",
           zn_format_size(p.kv_bytes_per_seq, a, sizeof a), (long long)ctx, (long long)B,
           zn_format_size(p.kv_bytes, c, sizeof c));
    printf("per step     %s host to device", zn_format_size(p.streamed_bytes_per_step, a,
                                                          sizeof a));
    if (p.streamed_bytes_per_step && di.pcie_peak_gbs > 0)
        printf(": at most %.1f steps/s over the link's %.1f GB/s peak, %.1f tokens/s with %lld "
               "sequences", di.pcie_peak_gbs * 1e9 / (double)p.streamed_bytes_per_step,
               di.pcie_peak_gbs, di.pcie_peak_gbs * 1e9 / (double)p.streamed_bytes_per_step *
               (double)B, (long long)B);
    if (p.streamed_layers && !p.streamed_bytes_per_step)
        printf(" (the slots hold every streamed layer: loaded once)");
    printf("\n");
}

/* ---- the command --------------------------------------------------------------------- */

int zn_cmd_generate(int argc, char **argv)
{
    const char *model = NULL, *adapter = NULL, *ckpt = NULL, *prompt = NULL, *chat = NULL, *idlist = NULL;
    const char *pfile = NULL, *outfile = NULL, *device = "auto", *dtype = NULL, *gpu_mem = NULL;
    double batch = 8, context = 0;
    decode_flags df = DECODE_FLAGS_UNSET;
    int json_out = 0, ret = 1, rc;
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' },
        { "adapter", required_argument, 0, 'a' },
        { "checkpoint", required_argument, 0, 'K' },
        { "prompt", required_argument, 0, 'p' },
        { "chat", required_argument, 0, 'c' },
        { "ids", required_argument, 0, 'i' },
        { "prompts", required_argument, 0, 'P' },
        { "out", required_argument, 0, 'o' },
        DECODE_OPTIONS,
        { "batch-size", required_argument, 0, 'b' },
        { "context", required_argument, 0, 'C' },
        { "device", required_argument, 0, 'D' },
        { "dtype", required_argument, 0, 't' },
        { "gpu-mem", required_argument, 0, 'g' },
        { "json", no_argument, 0, 'j' },
        { "plan", no_argument, 0, 'L' },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    int plan_only = 0;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 'L': plan_only = 1; break;
        case 'm': model = optarg; break;
        case 'a': adapter = optarg; break;
        case 'K': ckpt = optarg; break;
        case 'p': prompt = optarg; break;
        case 'c': chat = optarg; break;
        case 'i': idlist = optarg; break;
        case 'P': pfile = optarg; break;
        case 'o': outfile = optarg; break;
        case 'n': case 'S': case 'G': case 'T': case 'k': case 'q': case 'r': case 's':
            bad = decode_flag(c, optarg, &df);
            break;
        case 'b': bad = num_arg("--batch-size", optarg, 1, &batch); break;
        case 'C': bad = num_arg("--context", optarg, 2, &context); break;
        case 'D': device = optarg; break;
        case 't': dtype = optarg; break;
        case 'g': gpu_mem = optarg; break;
        case 'j': json_out = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad)
            return 2;
    }
    int sources = !!prompt + !!chat + !!idlist + !!pfile;
    if ((!model && !ckpt) || sources != 1 || optind < argc || (outfile && !pfile)) {
        if ((model || ckpt) && sources != 1)
            fprintf(stderr, "zinc: error: generate: give one of --prompt, --chat, --ids, "
                    "--prompts\n");
        usage(stderr);
        return 2;
    }

    zn_gen_params gp;
    zn_model_dims d;
    char ck_model[4096];
    if (ckpt) {
        if (ckpt_source(ckpt, model, ck_model, sizeof ck_model, &d, "generate"))
            return 1;
        model = ck_model;
    }
    if ((rc = decode_setup(&df, model, adapter, "generate", ckpt != NULL, &gp, &d)))
        return rc;

    tokenizer tok;
    memset(&tok, 0, sizeof tok);
    prompts pr;
    memset(&pr, 0, sizeof pr);
    streamer sm;
    memset(&sm, 0, sizeof sm);
    FILE *out = stdout;
    engine en;
    memset(&en, 0, sizeof en);
    int32_t **gen = NULL;
    int64_t *gen_len = NULL;
    int need_text = !idlist && !pfile; /* --prompts: when a line has no "ids" */
    json_t *recs = json_array();
    if (pfile) {
        FILE *f = fopen(pfile, "r");
        if (!f) {
            fprintf(stderr, "zinc: error: generate: %s: %s\n", pfile, strerror(errno));
            goto out;
        }
        char *line = NULL;
        size_t cap = 0;
        int lineno = 0, bad = 0;
        while (getline(&line, &cap, f) >= 0) {
            lineno++;
            if (strspn(line, " \t\r\n") == strlen(line))
                continue;
            json_error_t je;
            json_t *r = json_loads(line, 0, &je);
            if (!json_is_object(r)) {
                fprintf(stderr, "zinc: error: generate: %s:%d: %s\n", pfile, lineno,
                        r ? "a line must be a JSON object" : je.text);
                json_decref(r);
                bad = 1;
                break;
            }
            json_object_set_new(r, "_line", json_integer(lineno));
            need_text |= !json_object_get(r, "ids");
            json_array_append_new(recs, r);
        }
        free(line);
        fclose(f);
        if (bad)
            goto out;
        if (!json_array_size(recs)) {
            fprintf(stderr, "zinc: error: generate: %s: no prompts\n", pfile);
            goto out;
        }
    }
    if (need_text && tok_open(&tok, model))
        goto out;
    if (tok.eos && !gp.n_eos)
        eos_from(&gp, tok.eos);
    if (prompt || chat) {
        json_t *r = json_object();
        if (prompt)
            json_object_set_new(r, "prompt", json_string(prompt));
        else
            json_object_set_new(r, "messages",
                                json_pack("[{s:s, s:s}]", "role", "user", "content", chat));
        int e = prompt_from(&pr, &tok, r, prompt ? "--prompt" : "--chat");
        json_decref(r);
        if (e)
            goto out;
    } else if (idlist) {
        json_t *a = json_array();
        for (const char *s = idlist; *s;) {
            char *end;
            errno = 0;
            long long v = strtoll(s, &end, 10);
            if (end == s || errno) {
                fprintf(stderr, "zinc: error: generate: --ids: '%s' is not a list of ids\n",
                        idlist);
                json_decref(a);
                goto out;
            }
            json_array_append_new(a, json_integer(v));
            s = *end == ',' ? end + 1 : end;
            if (*end && *end != ',') {
                fprintf(stderr, "zinc: error: generate: --ids: '%s' is not a list of ids\n",
                        idlist);
                json_decref(a);
                goto out;
            }
        }
        int e = prompts_add(&pr, a, "--ids");
        json_decref(a);
        if (e)
            goto out;
    } else {
        size_t i;
        json_t *r;
        json_array_foreach(recs, i, r) {
            char where[4200];
            snprintf(where, sizeof where, "%s:%lld", pfile,
                     (long long)json_integer_value(json_object_get(r, "_line")));
            if (prompt_from(&pr, &tok, r, where))
                goto out;
        }
    }

    /* the context: the longest prompt and the new tokens, within the model's */
    int64_t longest = 0;
    for (int64_t i = 0; i < pr.n; i++)
        longest = pr.len[i] > longest ? pr.len[i] : longest;
    int64_t ctx = context > 0 ? (int64_t)context : longest + gp.max_new_tokens;
    if (ctx > d.max_pos)
        ctx = d.max_pos;
    if (longest >= ctx) {
        fprintf(stderr, "zinc: error: generate: a prompt of %lld tokens leaves no room in a "
                "context of %lld (max_position_embeddings %lld%s)\n", (long long)longest,
                (long long)ctx, (long long)d.max_pos, context > 0 ? ", --context" : "");
        goto out;
    }
    int64_t B = (int64_t)batch < pr.n ? (int64_t)batch : pr.n;

    if ((ret = engine_open(&en, &d, model, adapter, ckpt, device, dtype, gpu_mem, ctx, B, plan_only,
                           "generate"))) {
        if (ret != 2)
            ret = 1;
        goto out;
    }
    ret = 1;
    if (plan_only) {
        print_plan(&en, ctx, B);
        ret = 0;
        goto out;
    }
    gen = calloc((size_t)pr.n, sizeof *gen);
    gen_len = calloc((size_t)pr.n, sizeof *gen_len);
    if (!gen || !gen_len) {
        zn_cli_fail(-ENOMEM, "generate");
        goto out;
    }
    sm.tok = &tok;
    sm.stream = !json_out && !pfile && tok.pid;
    double t0 = zn_now_s();
    rc = zn_gen_run(en.g, pr.n, (const int32_t *const *)pr.ids, pr.len, &gp, gen, gen_len,
                    on_token, &sm);
    double t1 = zn_now_s();
    if (rc) {
        zn_cli_fail(rc, "generate");
        goto out;
    }
    if (outfile && !(out = fopen(outfile, "w"))) {
        fprintf(stderr, "zinc: error: generate: %s: %s\n", outfile, strerror(errno));
        out = stdout;
        goto out;
    }
    int64_t total = 0;
    for (int64_t i = 0; i < pr.n; i++) {
        total += gen_len[i];
        if (sm.stream)
            continue;
        int eos = 0;
        for (int k = 0; k < gp.n_eos && gen_len[i]; k++)
            eos |= gen[i][gen_len[i] - 1] == gp.eos[k];
        char *text = tok.pid ? tok_decode(&tok, gen[i], gen_len[i]) : NULL;
        if (json_out || pfile) {
            json_t *o = json_pack("{s:I, s:o, s:o, s:s}", "index", (json_int_t)i, "prompt_ids",
                                  ids_json(pr.ids[i], pr.len[i]), "ids",
                                  ids_json(gen[i], gen_len[i]), "finish",
                                  eos ? "eos" : "length");
            if (text)
                json_object_set_new(o, "text", json_string(text));
            char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
            if (s)
                fprintf(out, "%s\n", s);
            free(s);
            json_decref(o);
        } else if (text) {
            fprintf(out, "%s\n", text);
        } else {
            for (int64_t k = 0; k < gen_len[i]; k++)
                fprintf(out, "%s%d", k ? "," : "", gen[i][k]);
            fprintf(out, "\n");
        }
        free(text);
    }
    if (out != stdout && fclose(out)) {
        out = stdout;
        fprintf(stderr, "zinc: error: generate: %s: %s\n", outfile, strerror(errno));
        goto out;
    }
    out = stdout;
    zn_dev_info di;
    zn_dev_get_info(en.dev, &di);
    char where[256];
    placement_line(&en, where, sizeof where);
    zn_gen_placement gpl;
    zn_gen_get_placement(en.g, &gpl);
    fprintf(stderr, "zinc: generate: %lld prompts, %lld new tokens in %.2f s (%.1f tokens/s; "
            "weights loaded in %.2f s), %s, %s, %s", (long long)pr.n, (long long)total, t1 - t0,
            (double)total / (t1 - t0 > 0 ? t1 - t0 : 1e-9), en.load_s, di.name,
            zn_dtype_name(en.dt), where);
    if (gpl.streamed_bytes)
        fprintf(stderr, ", %.2f GB streamed (%.2f GB/s)", (double)gpl.streamed_bytes / 1e9,
                (double)gpl.streamed_bytes / 1e9 / (t1 - t0 > 0 ? t1 - t0 : 1e-9));
    fputc('\n', stderr);
    ret = 0;
out:
    if (out != stdout)
        fclose(out);
    for (int64_t i = 0; gen && i < pr.n; i++)
        free(gen[i]);
    free(gen);
    free(gen_len);
    free(sm.gen);
    engine_close(&en);
    prompts_free(&pr);
    tok_close(&tok);
    json_decref(recs);
    return ret;
}

/* ---- zinc chat ----------------------------------------------------------------------- */

static void chat_usage(FILE *f)
{
    fprintf(f,
            "usage: zinc chat (--model DIR [--adapter DIR] | --checkpoint DIR [--model DIR])\n"
            "                 [--system TEXT]\n"
            "                 [--max-new-tokens N] [--do-sample | --greedy] [--temperature T]\n"
            "                 [--top-k K] [--top-p P] [--repetition-penalty R] [--seed S]\n"
            "                 [--context N] [--device auto|host|cuda[:N]] [--dtype f32|bf16]\n"
            "                 [--gpu-mem SIZE]\n"
            "A conversation through the folder's chat template: each line you type is a\n"
            "user turn, the reply streams as it is decoded, and the whole history is the\n"
            "next prompt. /reset forgets the history, /system TEXT sets the system prompt\n"
            "(and resets), /exit or end of input ends. Decoding as `zinc generate`;\n"
            "--context (default: max_position_embeddings, at most 4096) bounds the\n"
            "history in tokens.\n");
}

int zn_cmd_chat(int argc, char **argv)
{
    const char *model = NULL, *adapter = NULL, *ckpt = NULL, *device = "auto", *dtype = NULL, *gpu_mem = NULL;
    const char *system = NULL;
    double context = 0;
    decode_flags df = DECODE_FLAGS_UNSET;
    int ret = 1, rc;
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' },
        { "adapter", required_argument, 0, 'a' },
        { "checkpoint", required_argument, 0, 'K' },
        { "system", required_argument, 0, 'y' },
        DECODE_OPTIONS,
        { "context", required_argument, 0, 'C' },
        { "device", required_argument, 0, 'D' },
        { "dtype", required_argument, 0, 't' },
        { "gpu-mem", required_argument, 0, 'g' },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 'm': model = optarg; break;
        case 'a': adapter = optarg; break;
        case 'K': ckpt = optarg; break;
        case 'y': system = optarg; break; /* copied below */
        case 'n': case 'S': case 'G': case 'T': case 'k': case 'q': case 'r': case 's':
            bad = decode_flag(c, optarg, &df);
            break;
        case 'C': bad = num_arg("--context", optarg, 2, &context); break;
        case 'D': device = optarg; break;
        case 't': dtype = optarg; break;
        case 'g': gpu_mem = optarg; break;
        case 'h': chat_usage(stdout); return 0;
        default: chat_usage(stderr); return 2;
        }
        if (bad)
            return 2;
    }
    if ((!model && !ckpt) || optind < argc) {
        chat_usage(stderr);
        return 2;
    }
    zn_gen_params gp;
    zn_model_dims d;
    char ck_model[4096];
    if (ckpt) {
        if (ckpt_source(ckpt, model, ck_model, sizeof ck_model, &d, "chat"))
            return 1;
        model = ck_model;
    }
    if ((rc = decode_setup(&df, model, adapter, "chat", ckpt != NULL, &gp, &d)))
        return rc;
    int64_t ctx = context > 0 ? (int64_t)context : (d.max_pos < 4096 ? d.max_pos : 4096);
    int failed = 0;
    if (system && !(system = strdup(system)))
        return zn_cli_fail(-ENOMEM, "chat");
    if (ctx > d.max_pos)
        ctx = d.max_pos;

    tokenizer tok;
    engine en;
    streamer sm;
    memset(&sm, 0, sizeof sm);
    json_t *msgs = json_array();
    char *line = NULL;
    size_t cap = 0;
    if (tok_open(&tok, model))
        goto out;
    if (tok.eos && !gp.n_eos)
        eos_from(&gp, tok.eos);
    if ((ret = engine_open(&en, &d, model, adapter, ckpt, device, dtype, gpu_mem, ctx, 1, 0, "chat"))) {
        if (ret != 2)
            ret = 1;
        tok_close(&tok);
        goto out;
    }
    zn_dev_info di;
    zn_dev_get_info(en.dev, &di);
    char where[256];
    placement_line(&en, where, sizeof where);
    fprintf(stderr, "zinc chat: %s (%s, %.3g M parameters%s) on %s, %s, %s; a history of up "
            "to %lld tokens. /reset, /system TEXT, /exit.\n", model,
            d.arch == ZN_ARCH_QWEN2 ? "qwen2" : "llama",
            (double)zn_model_param_count(&d) / 1e6, adapter ? ", with the adapter" : "",
            di.name, zn_dtype_name(en.dt), where, (long long)ctx);
    sm.tok = &tok;
    sm.stream = 1;
    /* each turn's prompt is the history so far: its cache stays */
    zn_gen_set_prefix_reuse(en.g, 1);
    for (;;) {
        fputs("> ", stdout);
        fflush(stdout);
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) {
            putchar('\n');
            break;
        }
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        if (!n)
            continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit"))
            break;
        if (!strcmp(line, "/reset") || !strncmp(line, "/system", 7)) {
            if (!strncmp(line, "/system", 7)) {
                const char *t = line + 7;
                t += strspn(t, " \t");
                free((void *)system);
                system = *t ? strdup(t) : NULL;
                if (*t && !system) {
                    failed = zn_cli_fail(-ENOMEM, "chat");
                    break;
                }
            }
            json_array_clear(msgs);
            fprintf(stderr, "[history cleared%s]\n", system ? "; system prompt set" : "");
            continue;
        }
        if (!json_array_size(msgs) && system)
            json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content",
                                                  system));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", line));
        json_t *req = json_object();
        json_object_set(req, "messages", msgs);
        json_t *ids = tok_ask(&tok, req, "ids");
        prompts pr;
        memset(&pr, 0, sizeof pr);
        if (!ids || prompts_add(&pr, ids, "chat")) {
            json_decref(ids);
            failed = 1; /* the tokenizer said why */
            break;
        }
        json_decref(ids);
        if (pr.len[0] >= ctx) {
            fprintf(stderr, "zinc: error: chat: the conversation is %lld tokens, the context "
                    "holds %lld: /reset (or a larger --context)\n", (long long)pr.len[0],
                    (long long)ctx);
            json_array_remove(msgs, json_array_size(msgs) - 1);
            prompts_free(&pr);
            continue;
        }
        int32_t *gen = NULL;
        int64_t gn = 0;
        sm.n = 0;
        sm.printed = 0;
        double t0 = zn_now_s();
        rc = zn_gen_run(en.g, 1, (const int32_t *const *)pr.ids, pr.len, &gp, &gen, &gn,
                        on_token, &sm);
        double t1 = zn_now_s();
        prompts_free(&pr);
        if (rc) {
            failed = zn_cli_fail(rc, "chat");
            break;
        }
        char *text = tok_decode(&tok, gen, gn);
        free(gen);
        if (!text) {
            failed = 1;
            break;
        }
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content",
                                              text));
        free(text);
        zn_gen_stats gs;
        zn_gen_get_stats(en.g, &gs);
        fprintf(stderr, "[%lld tokens, %.1f tokens/s; %llu prompt tokens from the cache, "
                "%llu prefilled, in all]\n", (long long)gn,
                (double)gn / (t1 - t0 > 0 ? t1 - t0 : 1e-9), (unsigned long long)gs.reused,
                (unsigned long long)gs.prefilled);
    }
    ret = failed;
    engine_close(&en);
    tok_close(&tok);
out:
    free(line);
    free(sm.gen);
    free((void *)system);
    json_decref(msgs);
    return ret;
}
