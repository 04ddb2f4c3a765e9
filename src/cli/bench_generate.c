/* `zinc bench generate`: the flags and the table of prefill and decode
 * tokens/s of an HF model folder for batches of 1 .. 64 prompts, placed as
 * `zinc generate` places them, beside the link and compute ceilings of a
 * decoding step and the bound `zinc generate --plan` states; the runs,
 * their checks and the figures are src/bench/generate.c's. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/bench.h"
#include "zinc/cost.h"
#include "zinc/device.h"
#include "zinc/generate.h"
#include "zinc/gensession.h"
#include "zinc/model.h"
#include "cli/cli.h"
#include "cli/gen-impl.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zinc bench generate --model DIR [--batches 1,2,4,..] [--prompt-len N]\n"
            "                           [--new-tokens N] [--device D] [--dtype f32|bf16]\n"
            "                           [--gpu-mem SIZE] [--resident N] [--ring K] [--nvme DIR]\n"
            "                           [--kv-cache auto|device|pinned] [--target NAME]\n"
            "                           [--csv FILE]\n"
            "  --batches     prompts decoded together (default 1,2,4,8,16,32,64)\n"
            "  --prompt-len  ids per prompt (default 32), --new-tokens per prompt (default 16)\n"
            "  --gpu-mem     the device arena (what does not fit streams from pinned RAM)\n"
            "  --resident    at most N layers on the device (default: as many as fit)\n"
            "  --ring        device slots for streamed layers (default 2)\n"
            "  --nvme        home the streamed layers on NVMe in DIR (the link ceiling is\n"
            "                then the slower of the reads alone and the copies alone)\n"
            "  --kv-cache    where the KV cache lives, as `zinc generate --kv-cache`: auto\n"
            "                (the device when it fits, else pinned RAM), device, pinned\n"
            "  --target      the plan's bound on a named machine's figures (a10, h100,\n"
            "                h200) instead of this machine's measured link (zinc plan --tune)\n"
            "  --csv         append one line per batch to FILE (header when new)\n"
            "Per batch: prefill tokens/s, decode tokens/s and ms per step; the step's\n"
            "ceilings: link (its streamed bytes copied alone) and compute (every weight\n"
            "resident, when the arena holds them); ratio = the slower ceiling / the step\n"
            "(on the host backend their sum: its copies run on the cores that compute).\n"
            "bound t/s: what `zinc generate --plan` bounds decode at (the step's bytes\n"
            "over the cost model's measured link and disk, or the compute above where\n"
            "that is slower; on the host backend the copies and the compute added);\n"
            "of bound = decode t/s / bound t/s. in/step, out/step: the\n"
            "bytes a decoding step moved host to device and back (streamed layers, a\n"
            "pinned cache's rows, embedding rows, logits); #wrong: how many of those and\n"
            "the NVMe reads differ from the plan's count (the bench then fails).\n");
}

/* What the flags ask for. */
typedef struct {
    const char *model, *csv, *target, *batches, *dtype, *gpu_mem;
    zn_gen_place o;
    int64_t plen, new_tokens;
    int64_t bs[16], nbs, maxb;
} bench_args;

/* Reads argv into a. Returns -1 to go on, or the exit code. */
static int parse_args(int argc, char **argv, bench_args *a)
{
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' },      { "batches", required_argument, 0, 'b' },
        { "prompt-len", required_argument, 0, 'p' }, { "new-tokens", required_argument, 0, 'n' },
        { "device", required_argument, 0, 'D' },     { "dtype", required_argument, 0, 't' },
        { "gpu-mem", required_argument, 0, 'g' },    { "resident", required_argument, 0, 'r' },
        { "ring", required_argument, 0, 'k' },       { "csv", required_argument, 0, 'o' },
        { "nvme", required_argument, 0, 'V' },       { "target", required_argument, 0, 'R' },
        { "kv-cache", required_argument, 0, 'Y' },   { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    memset(a, 0, sizeof *a);
    a->batches = "1,2,4,8,16,32,64";
    a->o = zn_gen_place_default();
    a->plen = 32;
    a->new_tokens = 16;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        switch (c) {
        case 'm': a->model = optarg; break;
        case 'b': a->batches = optarg; break;
        case 'p': a->plen = strtoll(optarg, NULL, 10); break;
        case 'n': a->new_tokens = strtoll(optarg, NULL, 10); break;
        case 'D': a->o.device = optarg; break;
        case 't': a->dtype = optarg; break;
        case 'g': a->gpu_mem = optarg; break;
        case 'r': a->o.resident = atoi(optarg); break;
        case 'k': a->o.ring = atoi(optarg); break;
        case 'o': a->csv = optarg; break;
        case 'V': a->o.nvme = optarg; break;
        case 'R': a->target = optarg; break;
        case 'Y':
            if (zn_gc_kv_flag(optarg, &a->o.kv_home, "bench generate"))
                return 2;
            break;
        default: return zn_cli_bench_usage_exit(c, usage);
        }
    }
    if (!a->model || optind < argc || a->plen < 1 || a->new_tokens < 2 || a->o.ring < 1) {
        usage(stderr);
        return 2;
    }
    for (const char *s = a->batches; *s && a->nbs < 16;) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 1 || (*end && *end != ',')) {
            fprintf(stderr, "zinc: error: bench generate: --batches '%s'\n", a->batches);
            return 2;
        }
        a->bs[a->nbs++] = v;
        a->maxb = v > a->maxb ? v : a->maxb;
        s = *end ? end + 1 : end;
    }
    return -1;
}

/* The lines above the table: the placement, the device, the link, the
 * cache; then the table's header. */
static void print_header(const zn_bench_gen_info *in, const bench_args *a)
{
    const zn_gen_placement *pl = &in->placement;
    const zn_ceilings *fig = &in->fig;
    char s1[32], s2[32];
    printf("model    %s: %d layers, %d on the device, %d streamed from %s (%.1f MiB each, "
           "ring %d)\n", a->model, pl->layers, pl->resident_layers, pl->streamed_layers,
           pl->nvme_bytes ? "NVMe" : "pinned RAM", (double)pl->layer_bytes / (1 << 20),
           pl->ring);
    printf("device   %s, %s; prompts of %lld ids, %lld new tokens each\n", in->dev.name,
           zn_dtype_name(in->dtype), (long long)a->plen, (long long)a->new_tokens);
    if (fig->h2d_bps > 0)
        printf("bound    host to device %.2f GB/s, device to host %.2f GB/s, NVMe read %.2f GB/s: "
               "%s%s%s\n", fig->h2d_bps / 1e9, fig->d2h_bps / 1e9, fig->nvme_read_bps / 1e9,
               strcmp(fig->name, "this machine") ? fig->name : "",
               strcmp(fig->name, "this machine") ? ", " : "", fig->source);
    else
        printf("bound    unknown: no measured link for this machine (`zinc generate --plan "
               "--recalibrate` measures it)\n");
    printf("kv cache %s (--kv-cache %s), %s per sequence of %lld tokens, %lld sequences: %s; "
           "%.1f KiB a token\n",
           pl->kv_pinned ? "in pinned RAM" : "on the device",
           a->o.kv_home == ZN_GEN_KV_PINNED   ? "pinned"
           : a->o.kv_home == ZN_GEN_KV_DEVICE ? "device"
                                              : "auto",
           zn_format_size(pl->kv_bytes_per_seq, s1, sizeof s1), (long long)a->o.ctx,
           (long long)a->maxb, zn_format_size(pl->kv_bytes, s2, sizeof s2),
           (double)pl->kv_token_bytes / 1024);
    if (pl->kv_pinned)
        printf("         a decoding step of B sequences at context c moves B x c x %.1f KiB of "
               "it in and B x %.1f KiB out\n", (double)pl->kv_token_bytes / 1024,
               (double)pl->kv_token_bytes / 1024);
    printf("%6s %12s %12s %10s %10s %10s %7s %10s %8s %11s %11s %6s\n", "batch", "prefill t/s",
           "decode t/s", "step ms", "link ms", "compute ms", "ratio", "bound t/s", "of bound",
           "in MiB/st", "out KiB/st", "#wrong");
}

/* Batch b's row, the bytes it moved when they are not the plan's, and its
 * line in the csv. */
static void print_row(const zn_bench_gen_info *in, const bench_args *a, FILE *out,
                      const zn_bench_gen_row *r)
{
    const zn_gen_placement *pl = &in->placement;
    long long b = (long long)r->batch;
    char cs[32] = "-", rs[32] = "-", bs_[32] = "-", os[32] = "-";
    if (r->compute_ms >= 0)
        snprintf(cs, sizeof cs, "%.2f", r->compute_ms);
    if (r->ratio > 0)
        snprintf(rs, sizeof rs, "%.2f", r->ratio);
    if (r->bound_tps > 0) {
        snprintf(bs_, sizeof bs_, "%.1f", r->bound_tps);
        snprintf(os, sizeof os, "%.2f", r->of_bound);
    }
    printf("%6lld %12.1f %12.1f %10.2f %10.2f %10s %7s %10s %8s %11.2f %11.1f %6d\n", b,
           r->prefill_tps, r->decode_tps, r->step_ms, r->link_ms, cs, rs, bs_, os,
           r->h2d_per_step / (1 << 20), r->d2h_per_step / 1024, r->wrong);
    if (r->wrong)
        fprintf(stderr, "zinc: bench generate: batch %lld: the decoding steps moved %llu "
                "bytes in, %llu out, %llu read from NVMe; the plan counts %llu, %llu, "
                "%llu\n", b, (unsigned long long)r->moved.h2d,
                (unsigned long long)r->moved.d2h, (unsigned long long)r->moved.nvme,
                (unsigned long long)r->plan.h2d, (unsigned long long)r->plan.d2h,
                (unsigned long long)r->plan.nvme);
    if (out)
        fprintf(out, "\"%s\",%s,%s,%d,%d,%d,%lld,%lld,%lld,%.1f,%.1f,%.3f,%.3f,%.3f,%.3f,"
                "%.1f,%.3f,%d,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%d\n", in->dev.name,
                zn_dtype_name(in->dtype), a->model, pl->layers, pl->resident_layers,
                pl->streamed_layers, b, (long long)a->plen, (long long)a->new_tokens,
                r->prefill_tps, r->decode_tps, r->step_ms, r->link_ms, r->compute_ms, r->ratio,
                r->bound_tps, r->of_bound, pl->kv_pinned,
                (unsigned long long)pl->kv_bytes_per_seq, (unsigned long long)pl->kv_token_bytes,
                (unsigned long long)r->plan.h2d, (unsigned long long)r->moved.h2d,
                (unsigned long long)r->plan.d2h, (unsigned long long)r->moved.d2h,
                (unsigned long long)r->plan.nvme, (unsigned long long)r->moved.nvme, r->wrong);
}

int zn_cli_bench_generate(int argc, char **argv)
{
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    zn_model_dims d;
    if ((rc = zn_model_dims_from_hf(&d, a.model)))
        return zn_cli_fail(rc, "bench generate");
    int64_t ctx = a.plen + a.new_tokens;
    if (ctx > d.max_pos) {
        fprintf(stderr, "zinc: error: bench generate: %lld + %lld tokens exceed "
                "max_position_embeddings %lld\n", (long long)a.plen, (long long)a.new_tokens,
                (long long)d.max_pos);
        return 2;
    }
    /* the cache holds the largest batch, as `zinc generate --batch-size` with
     * that many prompts and --context prompt-len + new-tokens sizes it */
    a.o.ctx = ctx;
    a.o.batch = a.maxb;
    if ((rc = zn_gc_place_flags(&a.o, a.gpu_mem, a.dtype, "bench generate")))
        return rc;
    zn_bench_gen_config bc = { .model = a.model, .place = a.o, .prompt_len = a.plen,
                               .new_tokens = a.new_tokens };
    zn_bench_gen *B = NULL;
    FILE *out = NULL;
    int ret = 1;
    if ((rc = zn_bench_gen_create(&B, &d, &bc))) {
        zn_cli_fail(rc, "bench generate");
        goto out;
    }
    if ((rc = zn_bench_gen_ceilings(B, a.target, stderr))) {
        zn_cli_fail(rc, "bench generate");
        ret = a.target ? 2 : 1; /* with a target, only its name can be wrong */
        goto out;
    }
    zn_bench_gen_info in;
    zn_bench_gen_get_info(B, &in);
    print_header(&in, &a);
    if (a.csv && !(out = zn_cli_bench_csv_open(a.csv, "device,dtype,model,layers,resident,"
                                                     "streamed,batch,prompt_len,new_tokens,"
                                                     "prefill_tps,decode_tps,step_ms,link_ms,"
                                                     "compute_ms,ratio,bound_tps,of_bound,"
                                                     "kv_pinned,kv_seq_bytes,kv_token_bytes,"
                                                     "h2d_plan,h2d_run,d2h_plan,d2h_run,"
                                                     "nvme_plan,nvme_run,wrong"))) {
        zn_cli_fail(-errno, "bench generate: --csv");
        goto out;
    }
    int wrong_total = 0;
    for (int64_t k = 0; k < a.nbs; k++) {
        zn_bench_gen_row r;
        if ((rc = zn_bench_gen_batch(B, a.bs[k], &r))) {
            zn_cli_fail(rc, "bench generate");
            goto out;
        }
        print_row(&in, &a, out, &r);
        wrong_total += r.wrong;
    }
    if (wrong_total) {
        fprintf(stderr, "zinc: error: bench generate: the bytes the decoding steps moved are "
                "not the plan's (#wrong %d)\n", wrong_total);
        goto out;
    }
    ret = 0;
out:
    if (out)
        fclose(out);
    zn_bench_gen_destroy(B);
    return ret;
}
