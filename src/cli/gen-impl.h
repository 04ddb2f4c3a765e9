/* What `zinc generate`, `zinc chat` and `zinc bench generate` share on the
 * command line (gen_common.c): the decoding flags, the placement flags,
 * text streamed to the terminal and the signals. The session itself is the
 * library's (include/zinc/gensession.h). Private to src/cli. */
#ifndef ZN_CLI_GEN_H
#define ZN_CLI_GEN_H

#include <getopt.h>
#include <stddef.h>

#include "zinc/gensession.h"

#define DECODE_OPTIONS                                                                       \
    { "max-new-tokens", required_argument, 0, 'n' }, { "do-sample", no_argument, 0, 'S' },   \
    { "greedy", no_argument, 0, 'G' }, { "temperature", required_argument, 0, 'T' },         \
    { "top-k", required_argument, 0, 'k' }, { "top-p", required_argument, 0, 'q' },          \
    { "repetition-penalty", required_argument, 0, 'r' }, { "seed", required_argument, 0, 's' }

/* A number >= lo: 0, or -1 after printing "NAME: bad value". */
int zn_gc_num_arg(const char *name, const char *s, double lo, double *out);
/* One of DECODE_OPTIONS into f: 0, or 2 after printing a bad value. */
int zn_gc_decode_flag(int c, const char *arg, zn_gen_overrides *f);
/* --kv-cache WHERE: 0, or 2 after printing the usage error. */
int zn_gc_kv_flag(const char *arg, int *kv_home, const char *cmd);
/* --gpu-mem and --dtype into o (NULL: not given): 0, 1 after printing a
 * bad size, 2 after printing a bad dtype. */
int zn_gc_place_flags(zn_gen_place *o, const char *gpu_mem, const char *dtype, const char *cmd);
/* A zn_gen_text_fn that writes the text to stdout as it comes and ends the
 * sequence with a newline. */
int zn_gc_print_text(void *ctx, const char *text, size_t len, int last);
/* Opens the library's session on a model (and an adapter or checkpoint)
 * with the decoding overrides: 0, or the command's exit code after printing
 * the failure under `cmd` (2 for a usage error, 1 otherwise). */
int zn_gc_open(zn_gen_session **s, const char *model, const char *adapter, const char *ckpt,
               const zn_gen_overrides *decode, const char *cmd);
/* --template-arg KEY=VALUE (at most ZN_GC_MAX_TARGS): the chat template's
 * variables. zn_gc_template_arg keeps one (2 after printing a usage error:
 * no '=', KEY not a name, one zinc sets itself, too many);
 * zn_gc_template_args gives those kept to the session as a JSON object
 * (VALUE as JSON when it parses, else the string): 0, or 1 after printing
 * the failure. */
#define ZN_GC_MAX_TARGS 16
typedef struct {
    const char *kv[ZN_GC_MAX_TARGS];
    int n;
} zn_gc_targs;
int zn_gc_template_arg(zn_gc_targs *t, const char *kv, const char *cmd);
int zn_gc_template_args(zn_gen_session *s, const zn_gc_targs *t, const char *cmd);
/* A signal removes the NVMe swap files before ending the process. */

#endif
