/* The command-line half `zinc generate`, `zinc chat` and `zinc bench
 * generate` share (cli/gen-impl.h): their flags, text on the terminal and
 * the signals. The session they drive is the library's (src/run/
 * gen_session.c). */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/gensession.h"
#include "zinc/nvme.h"
#include "zinc/util.h"
#include "cli/cli.h"
#include "cli/gen-impl.h"

int zn_gc_template_arg(zn_gc_targs *t, const char *kv, const char *cmd)
{
    const char *eq = strchr(kv, '=');
    size_t klen = eq ? (size_t)(eq - kv) : 0;
    int name = klen > 0 && (isalpha((unsigned char)kv[0]) || kv[0] == '_');
    for (size_t i = 0; name && i < klen; i++)
        name = isalnum((unsigned char)kv[i]) || kv[i] == '_';
    if (!name) {
        fprintf(stderr, "zinc: error: %s: --template-arg '%s': expected KEY=VALUE (for example "
                "enable_thinking=true)\n", cmd, kv);
        return 2;
    }
    static const char *const own[] = { "messages", "add_generation_prompt", "bos_token",
                                       "eos_token" };
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (strlen(own[i]) == klen && !strncmp(kv, own[i], klen)) {
            fprintf(stderr, "zinc: error: %s: --template-arg %s: zinc sets that variable "
                    "itself\n", cmd, own[i]);
            return 2;
        }
    if (t->n == ZN_GC_MAX_TARGS) {
        fprintf(stderr, "zinc: error: %s: more than %d --template-arg\n", cmd, ZN_GC_MAX_TARGS);
        return 2;
    }
    t->kv[t->n++] = kv;
    return 0;
}

int zn_gc_template_args(zn_gen_session *s, const zn_gc_targs *t, const char *cmd)
{
    if (!t->n)
        return 0;
    json_t *o = json_object();
    int bad = !o;
    for (int i = 0; i < t->n && !bad; i++) {
        const char *eq = strchr(t->kv[i], '=');
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - t->kv[i]), t->kv[i]);
        json_error_t e;
        json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, &e);
        if (!v)
            v = json_string(eq + 1);
        bad = !v || json_object_set_new(o, key, v);
    }
    char *text = bad ? NULL : json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!text) {
        fprintf(stderr, "zinc: error: %s: --template-arg: out of memory\n", cmd);
        return 1;
    }
    int rc = zn_gen_session_set_template_args(s, text);
    free(text);
    if (rc) {
        fprintf(stderr, "zinc: error: %s: --template-arg: %s\n", cmd, zn_last_error());
        return 1;
    }
    return 0;
}

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

int zn_gc_decode_flag(int c, const char *arg, zn_gen_overrides *f)
{
    double v;
    switch (c) {
    case 'n':
        if (zn_gc_num_arg("--max-new-tokens", arg, 1, &v))
            return 2;
        f->max_new_tokens = (int64_t)v;
        return 0;
    case 'S': f->do_sample = 1; return 0;
    case 'G': f->do_sample = 0; return 0;
    case 'T': return zn_gc_num_arg("--temperature", arg, 1e-30, &f->temperature) ? 2 : 0;
    case 'k':
        if (zn_gc_num_arg("--top-k", arg, 0, &v))
            return 2;
        f->top_k = (int64_t)v;
        return 0;
    case 'q': return zn_gc_num_arg("--top-p", arg, 1e-30, &f->top_p) ? 2 : 0;
    case 'r': return zn_gc_num_arg("--repetition-penalty", arg, 1e-30,
                                   &f->repetition_penalty) ? 2 : 0;
    default:
        if (zn_gc_num_arg("--seed", arg, 0, &v))
            return 2;
        f->seed = (uint64_t)v;
        return 0;
    }
}

int zn_gc_kv_flag(const char *arg, int *kv_home, const char *cmd)
{
    int rc = zn_gen_parse_kv_home(arg, kv_home);
    if (rc) {
        zn_cli_fail(rc, cmd);
        return 2;
    }
    return 0;
}

int zn_gc_place_flags(zn_gen_place *o, const char *gpu_mem, const char *dtype, const char *cmd)
{
    char what[64];
    int rc;
    if (gpu_mem && (rc = zn_parse_size(gpu_mem, &o->gpu_budget))) {
        snprintf(what, sizeof what, "%s: --gpu-mem", cmd);
        return zn_cli_fail(rc, what);
    }
    if (dtype && strcmp(dtype, "f32") && strcmp(dtype, "bf16")) {
        fprintf(stderr, "zinc: error: %s: --dtype must be f32 or bf16\n", cmd);
        return 2;
    }
    if (dtype)
        o->dtype = strcmp(dtype, "f32") ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    return 0;
}

int zn_gc_print_text(void *ctx, const char *text, size_t len, int last)
{
    (void)ctx;
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    if (last)
        putchar('\n');
    return 0;
}

int zn_gc_open(zn_gen_session **s, const char *model, const char *adapter, const char *ckpt,
               const zn_gen_overrides *decode, const char *cmd)
{
    zn_gen_session_config cfg = zn_gen_session_config_default();
    cfg.model = model;
    cfg.adapter = adapter;
    cfg.checkpoint = ckpt;
    cfg.decode = *decode;
    cfg.source_root = ZN_SOURCE_ROOT;
    int rc = zn_gen_session_open(s, &cfg);
    if (!rc)
        return 0;
    zn_cli_fail(rc, cmd);
    return rc == ZN_EARG ? 2 : 1;
}
