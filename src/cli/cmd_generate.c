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

#include "cli/gen-impl.h"

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
            "                     [--gpu-mem SIZE] [--nvme DIR] [--kv-cache WHERE] [--json]\n"
            "                     [--plan [--target NAME] [--recalibrate]]\n"
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
            "  --nvme DIR   home the streamed layers on NVMe in DIR instead of pinned RAM\n"
            "               (a swap file, removed at exit): for models beyond the RAM\n"
            "  --kv-cache   auto (default: on the device when it fits beside the weights'\n"
            "               least, else in pinned RAM), device or pinned: there, or refused;\n"
            "               pinned, each layer's cache crosses the link around its attention\n"
            "  --plan       print what is on the device, what streams, the KV cache and\n"
            "               the bound streaming puts on decode tokens/s, then stop\n"
            "               (nothing loaded); the bound divides by this machine's link\n"
            "               and disk as the cost model measured them (`zinc plan --tune`)\n"
            "  --target     the bound on a named machine's figures instead (a10, h100, h200)\n"
            "  --recalibrate measure this machine's link (and --nvme's disk) again\n"
            "  --context    tokens per sequence the KV cache holds (default: the\n"
            "               longest prompt + max-new-tokens, at most\n"
            "               max_position_embeddings)\n");
}

/* ---- the command --------------------------------------------------------------------- */

int zn_cmd_generate(int argc, char **argv)
{
    const char *model = NULL, *adapter = NULL, *ckpt = NULL, *prompt = NULL, *chat = NULL, *idlist = NULL;
    const char *pfile = NULL, *outfile = NULL, *device = "auto", *dtype = NULL, *gpu_mem = NULL,
               *nvme = NULL;
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
        { "nvme", required_argument, 0, 'V' },
        { "kv-cache", required_argument, 0, 'Y' },
        { "json", no_argument, 0, 'j' },
        { "plan", no_argument, 0, 'L' },
        { "target", required_argument, 0, 'R' },
        { "recalibrate", no_argument, 0, 'E' },
        { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    int plan_only = 0, recalibrate = 0, kv_home = ZN_GEN_KV_AUTO;
    const char *target = NULL;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 'L': plan_only = 1; break;
        case 'R': target = optarg; break;
        case 'E': recalibrate = 1; break;
        case 'm': model = optarg; break;
        case 'a': adapter = optarg; break;
        case 'K': ckpt = optarg; break;
        case 'p': prompt = optarg; break;
        case 'c': chat = optarg; break;
        case 'i': idlist = optarg; break;
        case 'P': pfile = optarg; break;
        case 'o': outfile = optarg; break;
        case 'n': case 'S': case 'G': case 'T': case 'k': case 'q': case 'r': case 's':
            bad = zn_gc_decode_flag(c, optarg, &df);
            break;
        case 'b': bad = zn_gc_num_arg("--batch-size", optarg, 1, &batch); break;
        case 'C': bad = zn_gc_num_arg("--context", optarg, 2, &context); break;
        case 'D': device = optarg; break;
        case 't': dtype = optarg; break;
        case 'g': gpu_mem = optarg; break;
        case 'V': nvme = optarg; break;
        case 'Y': bad = zn_gc_kv_flag(optarg, &kv_home, "generate"); break;
        case 'j': json_out = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad)
            return 2;
    }
    int sources = !!prompt + !!chat + !!idlist + !!pfile;
    if ((target || recalibrate) && !plan_only) {
        fprintf(stderr, "zinc: error: generate: --target and --recalibrate go with --plan\n");
        return 2;
    }
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
    if ((rc = zn_gc_setup(&df, &model, ck_model, sizeof ck_model, adapter, ckpt, "generate", &gp, &d)))
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
    if (need_text && zn_gc_tok_open(&tok, model))
        goto out;
    if (tok.eos && !gp.n_eos)
        zn_gc_eos_from(&gp, tok.eos);
    if (prompt || chat) {
        json_t *r = json_object();
        if (prompt)
            json_object_set_new(r, "prompt", json_string(prompt));
        else
            json_object_set_new(r, "messages",
                                json_pack("[{s:s, s:s}]", "role", "user", "content", chat));
        int e = zn_gc_prompt_from(&pr, &tok, r, prompt ? "--prompt" : "--chat");
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
        int e = zn_gc_prompts_add(&pr, a, "--ids");
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
            if (zn_gc_prompt_from(&pr, &tok, r, where))
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

    zn_gc_install_signals();
    gen_place gpo = GEN_PLACE_DEFAULT;
    gpo.device = device;
    gpo.dtype = dtype;
    gpo.gpu_mem = gpu_mem;
    gpo.nvme = nvme;
    gpo.ctx = ctx;
    gpo.batch = B;
    gpo.kv_home = kv_home;
    /* the plan's link figures first: measuring them (--recalibrate) opens a
     * device of its own, which would not fit beside the engine's arena (on
     * a GPU that arena takes all the free memory but the margin) */
    zn_ceilings link;
    if (plan_only && (ret = zn_gc_link_figures(device, nvme, target, recalibrate, &link,
                                               "generate")))
        goto out;
    if ((ret = zn_gc_engine_open(&en, &d, model, adapter, ckpt, &gpo, plan_only, "generate"))) {
        if (ret != 2)
            ret = 1;
        goto out;
    }
    ret = 1;
    if (plan_only) {
        zn_gc_print_plan(&en, ctx, B, &link, &d);
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
                    zn_gc_on_token, &sm);
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
        char *text = tok.pid ? zn_gc_tok_decode(&tok, gen[i], gen_len[i]) : NULL;
        if (json_out || pfile) {
            json_t *o = json_pack("{s:I, s:o, s:o, s:s}", "index", (json_int_t)i, "prompt_ids",
                                  zn_gc_ids_json(pr.ids[i], pr.len[i]), "ids",
                                  zn_gc_ids_json(gen[i], gen_len[i]), "finish",
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
    zn_gc_placement_line(&en, where, sizeof where);
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
    zn_gc_engine_close(&en);
    zn_gc_prompts_free(&pr);
    zn_gc_tok_close(&tok);
    json_decref(recs);
    return ret;
}

