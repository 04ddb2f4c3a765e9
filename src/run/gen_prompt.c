/* The text side of a generation session (run/gen-impl.h): the folder's own
 * tokenizer and chat template in a Python co-process (scripts/
 * zinc_tokenize.py, the renderer zinc prepare uses), prompts as ids, the
 * decoding defaults of the folder's generation_config.json as transformers
 * reads them, and generated ids streamed back as text. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zinc/generate.h"
#include "zinc/util.h"
#include "run/gen-impl.h"

/* ---- the tokenizer co-process ------------------------------------------------------ */

void zn_gs_tok_close(zn_gs_tok *t)
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

/* One answer line, or a code with the reason set. */
static int tok_read(zn_gs_tok *t, json_t **out)
{
    *out = NULL;
    if (getline(&t->line, &t->cap, t->from) < 0)
        return zn_set_error(-EPIPE, "the tokenizer process ended without an answer (its error "
                            "is above)");
    json_error_t je;
    json_t *r = json_loads(t->line, 0, &je);
    if (!r)
        return zn_set_error(ZN_ECORRUPT, "the tokenizer answered '%s'", t->line);
    json_t *err = json_object_get(r, "error");
    if (err) {
        int rc = zn_set_error(ZN_ECONFIG, "tokenizer: %s", json_string_value(err));
        json_decref(r);
        return rc;
    }
    *out = r;
    return 0;
}

/* The child's end: the pipes on stdin and stdout, then the script. */
static void tok_exec(int in[2], int out[2], const char *py, const char *script,
                     const char *model, const char *targs)
{
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    execl(py, py, script, model, targs, (char *)NULL); /* targs NULL ends the list */
    /* the parent reads no greeting and says the process ended: the reason
     * can only be told from here */
    fprintf(stderr, "zinc: error: generate: exec %s: %s\n", py, strerror(errno));
    _exit(127);
}

int zn_gs_tok_open(zn_gs_tok *t, const char *python, const char *source_root,
                   const char *model, const char *template_args)
{
    char script[4096], py[4096];
    const char *root = source_root ? source_root : ".";
    memset(t, 0, sizeof *t);
    snprintf(script, sizeof script, "%s/scripts/zinc_tokenize.py", root);
    const char *env = getenv("ZINC_PYTHON");
    if (python)
        snprintf(py, sizeof py, "%s", python);
    else if (env && *env)
        snprintf(py, sizeof py, "%s", env);
    else
        snprintf(py, sizeof py, "%s/.venv/bin/python", root);
    int e;
    if (access(py, X_OK)) {
        e = errno;
        return zn_set_error(-e, "%s: %s: text needs the tokenizer's virtual environment "
                            "(`bash %s/scripts/setup.sh venv`, or ZINC_PYTHON), or give the "
                            "prompt as --ids", py, strerror(e), root);
    }
    int in[2], out[2];
    if (pipe(in)) {
        e = errno;
        return zn_set_error(-e, "pipe: %s", strerror(e));
    }
    if (pipe(out)) {
        e = errno;
        int rc = zn_set_error(-e, "pipe: %s", strerror(e));
        close(in[0]);
        close(in[1]);
        return rc;
    }
    fflush(NULL); /* nothing buffered here is written twice by the child */
    pid_t pid = fork();
    if (pid < 0) {
        e = errno;
        int rc = zn_set_error(-e, "fork: %s", strerror(e));
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        return rc;
    }
    if (!pid)
        tok_exec(in, out, py, script, model, template_args);
    close(in[0]);
    close(out[1]);
    t->pid = pid;
    t->to = fdopen(in[1], "w");
    t->from = fdopen(out[0], "r");
    if (!t->to || !t->from) {
        e = errno;
        int rc = zn_set_error(-e, "fdopen: %s", strerror(e));
        if (!t->to)
            close(in[1]);
        if (!t->from)
            close(out[0]);
        zn_gs_tok_close(t);
        return rc;
    }
    json_t *r;
    int rc = tok_read(t, &r);
    if (rc) {
        zn_gs_tok_close(t);
        return rc;
    }
    t->eos = json_incref(json_object_get(r, "eos"));
    json_decref(r);
    return 0;
}

int zn_gs_tok_ask(zn_gs_tok *t, json_t *req, const char *key, json_t **out)
{
    *out = NULL;
    char *s = json_dumps(req, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(req);
    if (!s || fprintf(t->to, "%s\n", s) < 0 || fflush(t->to)) {
        free(s);
        return zn_set_error(-EPIPE, "the tokenizer process is gone");
    }
    free(s);
    json_t *r;
    int rc = tok_read(t, &r);
    if (rc)
        return rc;
    *out = json_incref(json_object_get(r, key));
    json_decref(r);
    return *out ? 0 : zn_set_error(ZN_ECORRUPT, "the tokenizer's answer has no \"%s\"", key);
}

json_t *zn_gs_ids_json(const int32_t *ids, int64_t n)
{
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

int zn_gs_tok_decode(zn_gs_tok *t, const int32_t *ids, int64_t n, char **text)
{
    *text = NULL;
    json_t *req = json_object(), *v;
    json_object_set_new(req, "decode", zn_gs_ids_json(ids, n));
    int rc = zn_gs_tok_ask(t, req, "text", &v);
    if (rc)
        return rc;
    if (!json_is_string(v))
        rc = zn_set_error(ZN_ECORRUPT, "the tokenizer's \"text\" is not a string");
    else if (!(*text = strdup(json_string_value(v))))
        rc = -ENOMEM;
    json_decref(v);
    return rc;
}

/* ---- prompts ----------------------------------------------------------------------- */

int zn_gs_prompts_add(zn_gs_prompts *p, json_t *arr, const char *where)
{
    if (!json_is_array(arr) || !json_array_size(arr))
        return zn_set_error(ZN_ECONFIG, "%s: the prompt's ids must be a non-empty list of "
                            "integers", where);
    if (p->n == p->cap) {
        int64_t c = p->cap ? 2 * p->cap : 16;
        int32_t **a = realloc(p->ids, (size_t)c * sizeof *a);
        if (a)
            p->ids = a;
        int64_t *l = realloc(p->len, (size_t)c * sizeof *l);
        if (l)
            p->len = l;
        if (!a || !l)
            return -ENOMEM;
        p->cap = c;
    }
    size_t n = json_array_size(arr);
    int32_t *v = malloc(n * sizeof *v);
    if (!v)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            json_integer_value(x) > INT32_MAX) {
            free(v);
            return zn_set_error(ZN_ECONFIG, "%s: id %zu is not a token id", where, i);
        }
        v[i] = (int32_t)json_integer_value(x);
    }
    p->ids[p->n] = v;
    p->len[p->n++] = (int64_t)n;
    return 0;
}

void zn_gs_prompts_free(zn_gs_prompts *p)
{
    for (int64_t i = 0; i < p->n; i++)
        free(p->ids[i]);
    free(p->ids);
    free(p->len);
    memset(p, 0, sizeof *p);
}

int zn_gs_prompt_from(zn_gs_prompts *p, zn_gs_tok *t, json_t *rec, const char *where)
{
    json_t *ids = json_object_get(rec, "ids");
    if (ids)
        return zn_gs_prompts_add(p, ids, where);
    json_t *req = json_object();
    json_t *msgs = json_object_get(rec, "messages"), *text = json_object_get(rec, "prompt");
    if (json_is_array(msgs)) {
        json_object_set(req, "messages", msgs);
    } else if (json_is_string(text)) {
        json_object_set(req, "text", text);
    } else {
        json_decref(req);
        return zn_set_error(ZN_ECONFIG, "%s: a prompt needs \"prompt\" (text), \"messages\" "
                            "(a chat) or \"ids\"", where);
    }
    if (!t->pid) {
        json_decref(req);
        return zn_set_error(ZN_ECONFIG, "%s: text prompts need the model's tokenizer", where);
    }
    json_t *v;
    int rc = zn_gs_tok_ask(t, req, "ids", &v);
    if (!rc)
        rc = zn_gs_prompts_add(p, v, where);
    json_decref(v);
    return rc;
}

int zn_gs_read_prompts(const char *path, json_t **recs, int *need_text)
{
    FILE *f = fopen(path, "r");
    int e = errno;
    *recs = json_array();
    if (!f)
        return zn_set_error(-e, "%s: %s", path, strerror(e));
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, rc = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == strlen(line))
            continue;
        json_error_t je;
        json_t *r = json_loads(line, 0, &je);
        if (!json_is_object(r)) {
            rc = zn_set_error(ZN_ECONFIG, "%s:%d: %s", path, lineno,
                              r ? "a line must be a JSON object" : je.text);
            json_decref(r);
            break;
        }
        json_object_set_new(r, "_line", json_integer(lineno));
        *need_text |= !json_object_get(r, "ids");
        json_array_append_new(*recs, r);
    }
    free(line);
    fclose(f);
    if (!rc && !json_array_size(*recs))
        rc = zn_set_error(ZN_ECONFIG, "%s: no prompts", path);
    return rc;
}

/* ---- defaults from the folder ------------------------------------------------------ */

void zn_gs_eos_from(zn_gen_params *gp, json_t *v)
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

int zn_gs_folder_defaults(const char *dir, zn_gen_params *gp)
{
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    json_t *g = NULL;
    if (!access(path, F_OK) && !(g = json_load_file(path, 0, &je)))
        return zn_set_error(ZN_ECONFIG, "%s:%d: %s", path, je.line, je.text);
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
        zn_gs_eos_from(gp, json_object_get(g, "eos_token_id"));
        json_decref(g);
    }
    if (!gp->n_eos) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        json_t *c = json_load_file(path, 0, &je);
        if (c)
            zn_gs_eos_from(gp, json_object_get(c, "eos_token_id"));
        json_decref(c);
    }
    return 0;
}

/* ---- streaming ----------------------------------------------------------------------- */

int zn_gs_stream_token(void *ctx, int64_t seq, int32_t id, int last)
{
    zn_gs_stream *s = ctx;
    (void)seq;
    if (!s->fn)
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
    free(s->text);
    int rc = zn_gs_tok_decode(s->tok, s->gen, s->n, &s->text);
    if (rc)
        return zn_error_prefix(-EIO, "the tokenizer could not decode the ids");
    size_t len = strlen(s->text);
    /* hold back an incomplete character (decoded as U+FFFD) until it is whole */
    if (!last && len >= 3 && !memcmp(s->text + len - 3, "\xef\xbf\xbd", 3))
        len -= 3;
    size_t from = s->printed;
    if (len > s->printed)
        s->printed = len;
    if (len > from || last)
        return s->fn(s->ctx, s->text + from, len > from ? len - from : 0, last);
    return 0;
}

void zn_gs_stream_free(zn_gs_stream *s)
{
    free(s->gen);
    free(s->text);
    memset(s, 0, sizeof *s);
}
