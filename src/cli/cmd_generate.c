/* `zinc generate`: text from a Hugging Face model folder (or a base and a
 * PEFT adapter, unmerged, or a training checkpoint), decoded with a KV
 * cache. The session (the tokenizer, the prompts, the decoding settings,
 * the placed model) is the library's (include/zinc/gensession.h); this
 * file reads the flags, prints the plan, the text or its JSON lines and
 * the summary, and chooses the exit code. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/cost.h"
#include "zinc/device.h"
#include "zinc/generate.h"
#include "zinc/gensession.h"
#include "zinc/model.h"
#include "cli/cli.h"
#include "cli/gen-impl.h"

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
            "                     [--gpu-mem SIZE] [--nvme DIR] [--kv-cache WHERE] [--json]\n"
            "                     [--plan [--target NAME] [--recalibrate]]\n"
            "                     [--template-arg KEY=VALUE]...\n"
            "  --model      Hugging Face folder (config.json, safetensors; tokenizer.json\n"
            "               and tokenizer_config.json for text), e.g. a `zinc export`\n"
            "  --adapter    a PEFT LoRA adapter folder for that base, applied unmerged\n"
            "  --checkpoint a `zinc train` checkpoint (a step folder, or the root: its\n"
            "               latest), read in place, no export; the tokenizer (and a LoRA\n"
            "               run's base) from --model or the folder the run recorded\n"
            "  --prompt     raw text (no chat template; BOS as add_bos_token says)\n"
            "  --chat       one user turn through the folder's chat template\n"
            "  --template-arg KEY=VALUE  a variable of the chat template (VALUE as JSON,\n"
            "               else a string), e.g. enable_thinking=true: Qwen3's is false\n"
            "               unless set\n"
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

/* What the flags ask for. */
typedef struct {
    const char *model, *adapter, *ckpt;
    const char *prompt, *chat, *idlist, *pfile, *outfile; /* the prompts, one of four */
    const char *device, *dtype, *gpu_mem, *nvme;
    const char *target;
    double batch, context;
    zn_gen_overrides decode;
    int json_out, plan_only, recalibrate, kv_home;
    zn_gc_targs targs;
} gen_args;

/* Reads argv into a. Returns -1 to go on, or the exit code (0 after
 * --help, 2 after a usage error). */
static int parse_args(int argc, char **argv, gen_args *a)
{
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' },
        { "adapter", required_argument, 0, 'a' },
        { "template-arg", required_argument, 0, 'X' },
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
    memset(a, 0, sizeof *a);
    a->device = "auto";
    a->batch = 8;
    a->decode = zn_gen_session_config_default().decode;
    a->kv_home = ZN_GEN_KV_AUTO;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        int bad = 0;
        switch (c) {
        case 'L': a->plan_only = 1; break;
        case 'R': a->target = optarg; break;
        case 'E': a->recalibrate = 1; break;
        case 'm': a->model = optarg; break;
        case 'a': a->adapter = optarg; break;
        case 'X': bad = zn_gc_template_arg(&a->targs, optarg, "generate"); break;
        case 'K': a->ckpt = optarg; break;
        case 'p': a->prompt = optarg; break;
        case 'c': a->chat = optarg; break;
        case 'i': a->idlist = optarg; break;
        case 'P': a->pfile = optarg; break;
        case 'o': a->outfile = optarg; break;
        case 'n': case 'S': case 'G': case 'T': case 'k': case 'q': case 'r': case 's':
            bad = zn_gc_decode_flag(c, optarg, &a->decode);
            break;
        case 'b': bad = zn_gc_num_arg("--batch-size", optarg, 1, &a->batch); break;
        case 'C': bad = zn_gc_num_arg("--context", optarg, 2, &a->context); break;
        case 'D': a->device = optarg; break;
        case 't': a->dtype = optarg; break;
        case 'g': a->gpu_mem = optarg; break;
        case 'V': a->nvme = optarg; break;
        case 'Y': bad = zn_gc_kv_flag(optarg, &a->kv_home, "generate"); break;
        case 'j': a->json_out = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad)
            return 2;
    }
    int sources = !!a->prompt + !!a->chat + !!a->idlist + !!a->pfile;
    if ((a->target || a->recalibrate) && !a->plan_only) {
        fprintf(stderr, "zinc: error: generate: --target and --recalibrate go with --plan\n");
        return 2;
    }
    if ((!a->model && !a->ckpt) || sources != 1 || optind < argc || (a->outfile && !a->pfile)) {
        if ((a->model || a->ckpt) && sources != 1)
            fprintf(stderr, "zinc: error: generate: give one of --prompt, --chat, --ids, "
                    "--prompts\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

/* --ids ID,ID,..: malloc'd into *ids. 0, or 1 after printing the error. */
static int parse_ids(const char *idlist, int64_t **ids, int64_t *n)
{
    int64_t cap = 64;
    *n = 0;
    if (!(*ids = malloc((size_t)cap * sizeof **ids))) /* set even when empty: ids given */
        return zn_cli_fail(-ENOMEM, "generate");
    for (const char *s = idlist; *s;) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || (*end && *end != ',')) {
            fprintf(stderr, "zinc: error: generate: --ids: '%s' is not a list of ids\n", idlist);
            free(*ids);
            *ids = NULL;
            return 1;
        }
        if (*n == cap) {
            int64_t *a = realloc(*ids, (size_t)(cap *= 2) * sizeof *a);
            if (!a) {
                free(*ids);
                *ids = NULL;
                return zn_cli_fail(-ENOMEM, "generate");
            }
            *ids = a;
        }
        (*ids)[(*n)++] = v;
        s = *end == ',' ? end + 1 : end;
    }
    return 0;
}

/* `--plan`: what is where, the cache, the bytes a decoding step moves, and
 * the bound they put on decode tokens/s over the link figures `c`
 * (zn_gen_link_figures): each resource alone, the step no faster than the
 * busiest (the copies overlap compute and each other). */
static void print_plan(const zn_gen_engine *e, const zn_ceilings *c, const zn_model_dims *d)
{
    int64_t ctx = e->ctx, B = e->batch;
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
        t[full] = zn_gen_step_bound(&p, B, full ? ctx - 1 : 0, c, d, -1, &by[full]);
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

static json_t *ids_json(const int32_t *ids, int64_t n)
{
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* Each prompt's result on `out`: a JSON object a line (--json, --prompts),
 * else its text, else its ids. A text the tokenizer could not give is said
 * and left out. */
static void write_outputs(zn_gen_session *s, const gen_args *a, FILE *out, int64_t n)
{
    zn_gen_session_info info;
    zn_gen_session_get_info(s, &info);
    for (int64_t i = 0; i < n; i++) {
        zn_gen_output o;
        zn_gen_session_output(s, i, &o);
        char *text = NULL;
        int rc;
        if (info.tokenizer && (rc = zn_gen_session_decode(s, o.ids, o.len, &text)))
            zn_cli_fail(rc, "generate");
        if (a->json_out || a->pfile) {
            json_t *j = json_pack("{s:I, s:o, s:o, s:s}", "index", (json_int_t)i, "prompt_ids",
                                  ids_json(o.prompt, o.prompt_len), "ids",
                                  ids_json(o.ids, o.len), "finish", o.eos ? "eos" : "length");
            if (text)
                json_object_set_new(j, "text", json_string(text));
            char *line = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
            if (line)
                fprintf(out, "%s\n", line);
            free(line);
            json_decref(j);
        } else if (text) {
            fprintf(out, "%s\n", text);
        } else {
            for (int64_t k = 0; k < o.len; k++)
                fprintf(out, "%s%d", k ? "," : "", o.ids[k]);
            fprintf(out, "\n");
        }
        free(text);
    }
}

/* The line on stderr after a generation: how much, how fast, where. */
static void print_summary(zn_gen_session *s, double secs)
{
    zn_gen_session_info info;
    zn_gen_session_get_info(s, &info);
    const zn_gen_engine *en = zn_gen_session_engine(s);
    int64_t total = 0;
    for (int64_t i = 0; i < info.prompts; i++) {
        zn_gen_output o;
        zn_gen_session_output(s, i, &o);
        total += o.len;
    }
    zn_dev_info di;
    zn_dev_get_info(en->dev, &di);
    char where[256];
    zn_gen_engine_placement_line(en, where, sizeof where);
    zn_gen_placement gpl;
    zn_gen_get_placement(en->g, &gpl);
    fprintf(stderr, "zinc: generate: %lld prompts, %lld new tokens in %.2f s (%.1f tokens/s; "
            "weights loaded in %.2f s), %s, %s, %s", (long long)info.prompts, (long long)total,
            secs, (double)total / (secs > 0 ? secs : 1e-9), en->load_s, di.name,
            zn_dtype_name(en->dt), where);
    if (gpl.streamed_bytes)
        fprintf(stderr, ", %.2f GB streamed (%.2f GB/s)", (double)gpl.streamed_bytes / 1e9,
                (double)gpl.streamed_bytes / 1e9 / (secs > 0 ? secs : 1e-9));
    fputc('\n', stderr);
}

/* The prompts, then the model placed (and with --plan its plan printed).
 * Returns -1 to go on generating, or the exit code. */
static int prepare(zn_gen_session *s, const gen_args *a)
{
    int64_t *ids = NULL, n_ids = 0;
    int rc;
    if (a->idlist && parse_ids(a->idlist, &ids, &n_ids))
        return 1;
    zn_gen_prompt_source src = { a->prompt, a->chat, ids, n_ids, a->pfile };
    rc = zn_gen_session_prompts(s, &src, (int64_t)a->context);
    free(ids);
    if (rc)
        return zn_cli_fail(rc, "generate");
    zn_gen_place o = zn_gen_place_default();
    o.device = a->device;
    o.nvme = a->nvme;
    o.batch = (int64_t)a->batch;
    o.kv_home = a->kv_home;
    /* the plan's link figures first: measuring them (--recalibrate) opens a
     * device of its own, which would not fit beside the engine's arena (on
     * a GPU that arena takes all the free memory but the margin) */
    zn_ceilings link;
    if (a->plan_only &&
        (rc = zn_gen_link_figures(a->device, a->nvme, a->target, a->recalibrate, &link,
                                  stderr))) {
        zn_cli_fail(rc, "generate");
        return a->target ? 2 : 1; /* with a target, only its name can be wrong */
    }
    if ((rc = zn_gc_place_flags(&o, a->gpu_mem, a->dtype, "generate")))
        return rc;
    if ((rc = zn_gen_session_place(s, &o, a->plan_only)))
        return zn_cli_fail(rc, "generate");
    if (a->plan_only) {
        zn_gen_session_info info;
        zn_gen_session_get_info(s, &info);
        print_plan(zn_gen_session_engine(s), &link, &info.dims);
        return 0;
    }
    return -1;
}

int zn_cmd_generate(int argc, char **argv)
{
    gen_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    zn_gen_session *s;
    if ((rc = zn_gc_open(&s, a.model, a.adapter, a.ckpt, &a.decode, "generate")))
        return rc;
    if ((rc = zn_gc_template_args(s, &a.targs, "generate"))) {
        zn_gen_session_close(s);
        return rc;
    }
    int ret = prepare(s, &a);
    if (ret >= 0)
        goto out;
    ret = 1;
    zn_gen_session_info info;
    zn_gen_session_get_info(s, &info);
    int stream = !a.json_out && !a.pfile && info.tokenizer;
    double secs;
    if ((rc = zn_gen_session_generate(s, stream ? zn_gc_print_text : NULL, NULL, &secs))) {
        zn_cli_fail(rc, "generate");
        goto out;
    }
    FILE *out = stdout;
    if (a.outfile && !(out = fopen(a.outfile, "w"))) {
        fprintf(stderr, "zinc: error: generate: %s: %s\n", a.outfile, strerror(errno));
        goto out;
    }
    if (!stream)
        write_outputs(s, &a, out, info.prompts);
    if (out != stdout && fclose(out)) {
        fprintf(stderr, "zinc: error: generate: %s: %s\n", a.outfile, strerror(errno));
        goto out;
    }
    print_summary(s, secs);
    ret = 0;
out:
    zn_gen_session_close(s);
    return ret;
}
