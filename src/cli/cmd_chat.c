/* `zinc chat`: a conversation in the terminal through the model folder's
 * chat template. The session and its history are the library's
 * (include/zinc/gensession.h); this file reads the flags and the lines
 * typed, streams the replies and says what each turn cost. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "zinc/device.h"
#include "zinc/generate.h"
#include "zinc/gensession.h"
#include "zinc/model.h"
#include "cli/cli.h"
#include "cli/gen-impl.h"

#ifndef ZN_SOURCE_ROOT
#define ZN_SOURCE_ROOT "."
#endif

/* The tokenizer's failures have always been reported as generate's (the
 * co-process is generate's); chat keeps saying so. */
#define TOKENIZER_WHAT "generate"

static void chat_usage(FILE *f)
{
    fprintf(f,
            "usage: zinc chat (--model DIR [--adapter DIR] | --checkpoint DIR [--model DIR])\n"
            "                 [--system TEXT]\n"
            "                 [--max-new-tokens N] [--do-sample | --greedy] [--temperature T]\n"
            "                 [--top-k K] [--top-p P] [--repetition-penalty R] [--seed S]\n"
            "                 [--context N] [--device auto|host|cuda[:N]] [--dtype f32|bf16]\n"
            "                 [--gpu-mem SIZE] [--nvme DIR] [--kv-cache auto|device|pinned]\n"
            "                 [--template-arg KEY=VALUE]...\n"
            "A conversation through the folder's chat template: each line you type is a\n"
            "user turn, the reply streams as it is decoded, and the whole history is the\n"
            "next prompt. /reset forgets the history, /system TEXT sets the system prompt\n"
            "(and resets), /exit or end of input ends. Decoding as `zinc generate`;\n"
            "--context (default: max_position_embeddings, at most 4096) bounds the\n"
            "history in tokens. --template-arg sets a variable of the chat template\n"
            "(VALUE as JSON, else a string), e.g. enable_thinking=true: Qwen3's is false\n"
            "unless set.\n");
}

typedef struct {
    const char *model, *adapter, *ckpt, *device, *dtype, *gpu_mem, *nvme, *system;
    double context;
    zn_gen_overrides decode;
    int kv_home;
    zn_gc_targs targs;
} chat_args;

/* Reads argv into a. Returns -1 to go on, or the exit code. */
static int parse_args(int argc, char **argv, chat_args *a)
{
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' },
        { "adapter", required_argument, 0, 'a' },
        { "template-arg", required_argument, 0, 'X' },
        { "checkpoint", required_argument, 0, 'K' },
        { "system", required_argument, 0, 'y' },
        DECODE_OPTIONS,
        { "context", required_argument, 0, 'C' },
        { "device", required_argument, 0, 'D' },
        { "dtype", required_argument, 0, 't' },
        { "gpu-mem", required_argument, 0, 'g' },
        { "nvme", required_argument, 0, 'V' },
        { "kv-cache", required_argument, 0, 'Y' },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    memset(a, 0, sizeof *a);
    a->device = "auto";
    a->decode = zn_gen_session_config_default().decode;
    a->kv_home = ZN_GEN_KV_AUTO;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'a': a->adapter = optarg; break;
        case 'X': bad = zn_gc_template_arg(&a->targs, optarg, "chat"); break;
        case 'K': a->ckpt = optarg; break;
        case 'y': a->system = optarg; break;
        case 'n': case 'S': case 'G': case 'T': case 'k': case 'q': case 'r': case 's':
            bad = zn_gc_decode_flag(c, optarg, &a->decode);
            break;
        case 'C': bad = zn_gc_num_arg("--context", optarg, 2, &a->context); break;
        case 'D': a->device = optarg; break;
        case 't': a->dtype = optarg; break;
        case 'g': a->gpu_mem = optarg; break;
        case 'V': a->nvme = optarg; break;
        case 'Y': bad = zn_gc_kv_flag(optarg, &a->kv_home, "chat"); break;
        case 'h': chat_usage(stdout); return 0;
        default: chat_usage(stderr); return 2;
        }
        if (bad)
            return 2;
    }
    if ((!a->model && !a->ckpt) || optind < argc) {
        chat_usage(stderr);
        return 2;
    }
    return -1;
}

/* The session ready to talk: the chat begun, the tokenizer started, the
 * model placed and the line saying so printed. Returns -1 to go on, or
 * the exit code. */
static int start(zn_gen_session *s, const chat_args *a)
{
    int rc;
    if ((rc = zn_gen_session_chat_begin(s, (int64_t)a->context, a->system)))
        return zn_cli_fail(rc, "chat");
    if ((rc = zn_gen_session_open_tokenizer(s)))
        return zn_cli_fail(rc, TOKENIZER_WHAT);
    zn_gen_place o = zn_gen_place_default();
    o.device = a->device;
    o.nvme = a->nvme;
    o.batch = 1;
    o.kv_home = a->kv_home;
    if ((rc = zn_gc_place_flags(&o, a->gpu_mem, a->dtype, "chat")))
        return rc;
    if ((rc = zn_gen_session_place(s, &o, 0)))
        return zn_cli_fail(rc, "chat");
    zn_gen_session_info info;
    zn_gen_session_get_info(s, &info);
    const zn_gen_engine *en = zn_gen_session_engine(s);
    zn_dev_info di;
    zn_dev_get_info(en->dev, &di);
    char where[256];
    zn_gen_engine_placement_line(en, where, sizeof where);
    fprintf(stderr, "zinc chat: %s (%s, %.3g M parameters%s) on %s, %s, %s; a history of up "
            "to %lld tokens. /reset, /system TEXT, /exit.\n", info.model,
            zn_model_arch_name(info.dims.arch),
            (double)zn_model_param_count(&info.dims) / 1e6, a->adapter ? ", with the adapter" : "",
            di.name, zn_dtype_name(en->dt), where, (long long)info.ctx);
    return -1;
}

/* One user line: the history rendered, the reply streamed, its cost said.
 * Returns 0 (a turn too long for the context is refused and forgotten),
 * or 1 after printing a failure that ends the chat. */
static int turn(zn_gen_session *s, const char *line, int64_t ctx)
{
    int64_t n;
    int rc = zn_gen_session_chat_prompt(s, line, &n);
    if (rc)
        return zn_cli_fail(rc, TOKENIZER_WHAT);
    if (n >= ctx) {
        fprintf(stderr, "zinc: error: chat: the conversation is %lld tokens, the context "
                "holds %lld: /reset (or a larger --context)\n", (long long)n, (long long)ctx);
        zn_gen_session_chat_undo(s);
        return 0;
    }
    zn_gen_turn t;
    if ((rc = zn_gen_session_chat_reply(s, zn_gc_print_text, NULL, &t)))
        return zn_cli_fail(rc, "chat");
    zn_gen_stats gs;
    zn_gen_get_stats(zn_gen_session_engine(s)->g, &gs);
    fprintf(stderr, "[%lld tokens, %.1f tokens/s; %llu prompt tokens from the cache, "
            "%llu prefilled, in all]\n", (long long)t.tokens,
            (double)t.tokens / (t.seconds > 0 ? t.seconds : 1e-9),
            (unsigned long long)gs.reused, (unsigned long long)gs.prefilled);
    return 0;
}

/* Lines from stdin until /exit or its end. Returns 0, or 1 after a
 * failure. */
static int talk(zn_gen_session *s, int have_system)
{
    zn_gen_session_info info;
    zn_gen_session_get_info(s, &info);
    char *line = NULL;
    size_t cap = 0;
    int failed = 0;
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
                have_system = *t != 0;
                int rc = zn_gen_session_chat_system(s, t);
                if (rc) {
                    failed = zn_cli_fail(rc, "chat");
                    break;
                }
            } else {
                zn_gen_session_chat_reset(s);
            }
            fprintf(stderr, "[history cleared%s]\n", have_system ? "; system prompt set" : "");
            continue;
        }
        if ((failed = turn(s, line, info.ctx)))
            break;
    }
    free(line);
    return failed;
}

int zn_cmd_chat(int argc, char **argv)
{
    chat_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    zn_gen_session *s;
    if ((rc = zn_gc_open(&s, a.model, a.adapter, a.ckpt, &a.decode, "chat")))
        return rc;
    if ((rc = zn_gc_template_args(s, &a.targs, "chat"))) {
        zn_gen_session_close(s);
        return rc;
    }
    int ret = start(s, &a);
    if (ret < 0)
        ret = talk(s, a.system != NULL);
    zn_gen_session_close(s);
    return ret;
}
