/* `zinc chat`: a conversation in the terminal through the model folder's
 * chat template (cli/gen-impl.h holds what it shares with zinc generate). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/generate.h"
#include "zinc/model.h"
#include "cli/cli.h"
#include "cli/gen-impl.h"

static void chat_usage(FILE *f)
{
    fprintf(f,
            "usage: zinc chat (--model DIR [--adapter DIR] | --checkpoint DIR [--model DIR])\n"
            "                 [--system TEXT]\n"
            "                 [--max-new-tokens N] [--do-sample | --greedy] [--temperature T]\n"
            "                 [--top-k K] [--top-p P] [--repetition-penalty R] [--seed S]\n"
            "                 [--context N] [--device auto|host|cuda[:N]] [--dtype f32|bf16]\n"
            "                 [--gpu-mem SIZE] [--nvme DIR] [--kv-cache auto|device|pinned]\n"
            "A conversation through the folder's chat template: each line you type is a\n"
            "user turn, the reply streams as it is decoded, and the whole history is the\n"
            "next prompt. /reset forgets the history, /system TEXT sets the system prompt\n"
            "(and resets), /exit or end of input ends. Decoding as `zinc generate`;\n"
            "--context (default: max_position_embeddings, at most 4096) bounds the\n"
            "history in tokens.\n");
}

int zn_cmd_chat(int argc, char **argv)
{
    const char *model = NULL, *adapter = NULL, *ckpt = NULL, *device = "auto", *dtype = NULL, *gpu_mem = NULL,
               *nvme = NULL;
    const char *system = NULL;
    double context = 0;
    decode_flags df = DECODE_FLAGS_UNSET;
    int ret = 1, rc, kv_home = ZN_GEN_KV_AUTO;
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
        { "nvme", required_argument, 0, 'V' },
        { "kv-cache", required_argument, 0, 'Y' },
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
            bad = zn_gc_decode_flag(c, optarg, &df);
            break;
        case 'C': bad = zn_gc_num_arg("--context", optarg, 2, &context); break;
        case 'D': device = optarg; break;
        case 't': dtype = optarg; break;
        case 'g': gpu_mem = optarg; break;
        case 'V': nvme = optarg; break;
        case 'Y': bad = zn_gc_kv_flag(optarg, &kv_home, "chat"); break;
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
    if ((rc = zn_gc_setup(&df, &model, ck_model, sizeof ck_model, adapter, ckpt, "chat", &gp, &d)))
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
    if (zn_gc_tok_open(&tok, model))
        goto out;
    if (tok.eos && !gp.n_eos)
        zn_gc_eos_from(&gp, tok.eos);
    zn_gc_install_signals();
    gen_place gpo = GEN_PLACE_DEFAULT;
    gpo.device = device;
    gpo.dtype = dtype;
    gpo.gpu_mem = gpu_mem;
    gpo.nvme = nvme;
    gpo.ctx = ctx;
    gpo.batch = 1;
    gpo.kv_home = kv_home;
    if ((ret = zn_gc_engine_open(&en, &d, model, adapter, ckpt, &gpo, 0, "chat"))) {
        if (ret != 2)
            ret = 1;
        zn_gc_tok_close(&tok);
        goto out;
    }
    zn_dev_info di;
    zn_dev_get_info(en.dev, &di);
    char where[256];
    zn_gc_placement_line(&en, where, sizeof where);
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
        json_t *ids = zn_gc_tok_ask(&tok, req, "ids");
        prompts pr;
        memset(&pr, 0, sizeof pr);
        if (!ids || zn_gc_prompts_add(&pr, ids, "chat")) {
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
            zn_gc_prompts_free(&pr);
            continue;
        }
        int32_t *gen = NULL;
        int64_t gn = 0;
        sm.n = 0;
        sm.printed = 0;
        double t0 = zn_now_s();
        rc = zn_gen_run(en.g, 1, (const int32_t *const *)pr.ids, pr.len, &gp, &gen, &gn,
                        zn_gc_on_token, &sm);
        double t1 = zn_now_s();
        zn_gc_prompts_free(&pr);
        if (rc) {
            failed = zn_cli_fail(rc, "chat");
            break;
        }
        char *text = zn_gc_tok_decode(&tok, gen, gn);
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
    zn_gc_engine_close(&en);
    zn_gc_tok_close(&tok);
out:
    free(line);
    free(sm.gen);
    free((void *)system);
    json_decref(msgs);
    return ret;
}

