/* The command-line half `zinc generate`, `zinc chat` and `zinc bench
 * generate` share (cli/gen-impl.h): their flags, text on the terminal and
 * the signals. The session they drive is the library's (src/run/
 * gen_session.c). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/gensession.h"
#include "zinc/nvme.h"
#include "zinc/util.h"
#include "cli/cli.h"
#include "cli/gen-impl.h"

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
