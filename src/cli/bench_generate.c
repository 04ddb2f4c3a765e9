/* `zinc bench generate`: prefill and decode tokens/s of an HF model folder
 * for batches of 1 .. 64 prompts, with the weights and the KV cache placed
 * as `zinc generate` places them for the same settings (the same function,
 * zn_gc_gen_place), against the two ceilings of a decoding step measured in
 * the same run: the link (the step's streamed layers copied alone) and the
 * compute (the same batch with every weight and the cache resident, when
 * the device holds them), and against the bound `zinc generate --plan`
 * states. The data are checked: the streamed run's ids must be the
 * resident run's, and the bytes its decoding steps moved the plan's. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/generate.h"
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

typedef struct {
    const zn_gen *g;
    int64_t b, firsts;
    double t_prefilled;
    zn_gen_placement at_prefilled; /* the byte counters as decoding starts */
} timing;

static int on_token(void *ctx, int64_t seq, int32_t id, int last)
{
    timing *t = ctx;
    (void)seq;
    (void)id;
    (void)last;
    if (t->firsts < t->b && ++t->firsts == t->b) {
        t->t_prefilled = zn_now_s();
        zn_gen_get_placement(t->g, &t->at_prefilled);
    }
    return 0;
}

typedef struct {
    zn_model *m;
    zn_gen *g;
} runner;

static void runner_close(runner *r)
{
    zn_gen_destroy(r->g);
    zn_model_destroy(r->m);
    r->g = NULL;
    r->m = NULL;
}

/* The resident run: the same sizing as the placed one (zn_gc_gen_place)
 * with every weight and the cache on the device, on the same device. */
static int runner_open(runner *r, zn_dev *dev, const zn_model_dims *d, zn_dtype dt,
                       const gen_place *o, const char *dir)
{
    int rc = zn_gc_gen_place(dev, d, dt, o, &r->m, &r->g);
    if (!rc)
        rc = zn_gen_load(r->g, dir, NULL);
    if (rc)
        runner_close(r);
    return rc;
}

static void free_out(int32_t **o, int64_t b)
{
    for (int64_t i = 0; i < b; i++) {
        free(o[i]);
        o[i] = NULL;
    }
}

/* One batch: seconds of the prefills and of the decoding steps, and (when
 * moved is not NULL) the bytes the decoding steps moved. */
static int run_batch(zn_gen *g, int64_t b, int32_t **ids, const int64_t *lens, int64_t new_tokens,
                     int32_t **out, int64_t *out_n, double *prefill_s, double *decode_s,
                     gen_step_bytes *moved)
{
    zn_gen_params p = zn_gen_params_default();
    p.max_new_tokens = new_tokens;
    timing t;
    memset(&t, 0, sizeof t);
    t.g = g;
    t.b = b;
    double t0 = zn_now_s();
    int rc = zn_gen_run(g, b, (const int32_t *const *)ids, lens, &p, out, out_n, on_token, &t);
    double t1 = zn_now_s();
    *prefill_s = t.t_prefilled - t0;
    *decode_s = t1 - t.t_prefilled;
    if (moved && !rc) {
        zn_gen_placement e, *s = &t.at_prefilled;
        zn_gen_get_placement(g, &e);
        moved->h2d = (e.streamed_bytes - s->streamed_bytes) + (e.kv_in_bytes - s->kv_in_bytes) +
                     (e.embed_in_bytes - s->embed_in_bytes);
        moved->d2h = (e.kv_out_bytes - s->kv_out_bytes) +
                     (e.logits_out_bytes - s->logits_out_bytes);
        moved->nvme = e.nvme_read - s->nvme_read;
    }
    return rc;
}

int zn_bench_generate(int argc, char **argv)
{
    const char *model = NULL, *csv = NULL, *target = NULL;
    const char *batches = "1,2,4,8,16,32,64";
    gen_place o = GEN_PLACE_DEFAULT;
    int64_t plen = 32, new_tokens = 16;
    int rc;
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
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'b': batches = optarg; break;
        case 'p': plen = strtoll(optarg, NULL, 10); break;
        case 'n': new_tokens = strtoll(optarg, NULL, 10); break;
        case 'D': o.device = optarg; break;
        case 't': o.dtype = optarg; break;
        case 'g': o.gpu_mem = optarg; break;
        case 'r': o.resident = atoi(optarg); break;
        case 'k': o.ring = atoi(optarg); break;
        case 'o': csv = optarg; break;
        case 'V': o.nvme = optarg; break;
        case 'R': target = optarg; break;
        case 'Y':
            if (zn_gc_kv_flag(optarg, &o.kv_home, "bench generate"))
                return 2;
            break;
        default: return zn_bench_usage_exit(c, usage);
        }
    }
    if (!model || optind < argc || plen < 1 || new_tokens < 2 || o.ring < 1) {
        usage(stderr);
        return 2;
    }
    int64_t bs[16], nbs = 0, maxb = 0;
    for (const char *s = batches; *s && nbs < 16;) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 1 || (*end && *end != ',')) {
            fprintf(stderr, "zinc: error: bench generate: --batches '%s'\n", batches);
            return 2;
        }
        bs[nbs++] = v;
        maxb = v > maxb ? v : maxb;
        s = *end ? end + 1 : end;
    }
    zn_model_dims d;
    if ((rc = zn_model_dims_from_hf(&d, model)))
        return zn_cli_fail(rc, "bench generate");
    int64_t ctx = plen + new_tokens;
    if (ctx > d.max_pos) {
        fprintf(stderr, "zinc: error: bench generate: %lld + %lld tokens exceed "
                "max_position_embeddings %lld\n", (long long)plen, (long long)new_tokens,
                (long long)d.max_pos);
        return 2;
    }
    /* the cache holds the largest batch, as `zinc generate --batch-size` with
     * that many prompts and --context prompt-len + new-tokens sizes it */
    o.ctx = ctx;
    o.batch = maxb;

    int ret = 1, wrong_total = 0;
    engine st;
    memset(&st, 0, sizeof st);
    runner res = { 0 };
    FILE *out = NULL;
    int32_t **ids = calloc((size_t)maxb, sizeof *ids), **o1 = calloc((size_t)maxb, sizeof *o1);
    int32_t **o2 = calloc((size_t)maxb, sizeof *o2);
    int64_t *lens = calloc((size_t)maxb, sizeof *lens), *n1 = calloc((size_t)maxb, 8),
            *n2 = calloc((size_t)maxb, 8);
    if (!ids || !o1 || !o2 || !lens || !n1 || !n2) {
        zn_cli_fail(-ENOMEM, "bench generate");
        goto out;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < maxb; i++) {
        lens[i] = plen;
        if (!(ids[i] = malloc((size_t)plen * sizeof **ids))) {
            zn_cli_fail(-ENOMEM, "bench generate");
            goto out;
        }
        for (int64_t k = 0; k < plen; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            ids[i][k] = (int32_t)(x % (uint64_t)d.vocab);
        }
    }
    /* the placed model: the device, the model and its generator exactly as
     * `zinc generate` opens them */
    if ((rc = zn_gc_engine_open(&st, &d, model, NULL, NULL, &o, 0, "bench generate"))) {
        ret = rc;
        goto out;
    }
    zn_dev *dev = st.dev;
    zn_dtype dt = st.dt;
    zn_gen_placement pl;
    zn_gen_get_placement(st.g, &pl);
    /* the compute ceiling: every weight and the cache resident, when the
     * arena holds them beside the placed model */
    int have_res = 0;
    if (pl.streamed_layers || pl.kv_pinned) {
        gen_place ro = o;
        ro.nvme = NULL;
        ro.resident = -1;
        ro.kv_home = ZN_GEN_KV_DEVICE;
        have_res = !runner_open(&res, dev, &d, dt, &ro, model);
        zn_gen_placement rp;
        if (have_res) {
            zn_gen_get_placement(res.g, &rp);
            have_res = !rp.streamed_layers && !rp.kv_pinned;
        }
        if (!have_res)
            runner_close(&res);
    }
    zn_ceilings fig;
    if ((rc = zn_gc_link_figures(o.device, o.nvme, target, 0, &fig, "bench generate"))) {
        ret = rc;
        goto out;
    }
    zn_dev_info di;
    zn_dev_get_info(dev, &di);
    char a[32], b2[32];
    printf("model    %s: %d layers, %d on the device, %d streamed from %s (%.1f MiB each, "
           "ring %d)\n", model, pl.layers, pl.resident_layers, pl.streamed_layers,
           pl.nvme_bytes ? "NVMe" : "pinned RAM", (double)pl.layer_bytes / (1 << 20), pl.ring);
    printf("device   %s, %s; prompts of %lld ids, %lld new tokens each\n", di.name,
           zn_dtype_name(dt), (long long)plen, (long long)new_tokens);
    if (fig.h2d_bps > 0)
        printf("bound    host to device %.2f GB/s, device to host %.2f GB/s, NVMe read %.2f GB/s: "
               "%s%s%s\n", fig.h2d_bps / 1e9, fig.d2h_bps / 1e9, fig.nvme_read_bps / 1e9,
               strcmp(fig.name, "this machine") ? fig.name : "",
               strcmp(fig.name, "this machine") ? ", " : "", fig.source);
    else
        printf("bound    unknown: no measured link for this machine (`zinc generate --plan "
               "--recalibrate` measures it)\n");
    printf("kv cache %s (--kv-cache %s), %s per sequence of %lld tokens, %lld sequences: %s; "
           "%.1f KiB a token\n",
           pl.kv_pinned ? "in pinned RAM" : "on the device",
           o.kv_home == ZN_GEN_KV_PINNED   ? "pinned"
           : o.kv_home == ZN_GEN_KV_DEVICE ? "device"
                                           : "auto",
           zn_format_size(pl.kv_bytes_per_seq, a, sizeof a), (long long)ctx, (long long)maxb,
           zn_format_size(pl.kv_bytes, b2, sizeof b2), (double)pl.kv_token_bytes / 1024);
    if (pl.kv_pinned)
        printf("         a decoding step of B sequences at context c moves B x c x %.1f KiB of "
               "it in and B x %.1f KiB out\n", (double)pl.kv_token_bytes / 1024,
               (double)pl.kv_token_bytes / 1024);
    printf("%6s %12s %12s %10s %10s %10s %7s %10s %8s %11s %11s %6s\n", "batch", "prefill t/s",
           "decode t/s", "step ms", "link ms", "compute ms", "ratio", "bound t/s", "of bound",
           "in MiB/st", "out KiB/st", "#wrong");
    if (csv && !(out = zn_bench_csv_open(csv, "device,dtype,model,layers,resident,streamed,"
                                              "batch,prompt_len,new_tokens,prefill_tps,"
                                              "decode_tps,step_ms,link_ms,compute_ms,ratio,"
                                              "bound_tps,of_bound,kv_pinned,kv_seq_bytes,"
                                              "kv_token_bytes,h2d_plan,h2d_run,d2h_plan,"
                                              "d2h_run,nvme_plan,nvme_run,wrong"))) {
        zn_cli_fail(-errno, "bench generate: --csv");
        goto out;
    }
    for (int64_t k = 0; k < nbs; k++) {
        int64_t b = bs[k];
        double pre, dec, rpre = 0, rdec = 0, link = 0;
        gen_step_bytes moved;
        /* a warm-up batch, then the timed one */
        if ((rc = run_batch(st.g, b, ids, lens, 2, o1, n1, &pre, &dec, NULL)) ||
            (free_out(o1, b),
             rc = run_batch(st.g, b, ids, lens, new_tokens, o1, n1, &pre, &dec, &moved)) ||
            (rc = zn_gen_time_link(st.g, &link))) {
            zn_cli_fail(rc, "bench generate");
            goto out;
        }
        double steps = (double)(new_tokens - 1);
        double step_ms = dec / steps * 1e3, link_ms = link * 1e3, comp_ms = -1;
        if (have_res) {
            if ((rc = run_batch(res.g, b, ids, lens, 2, o2, n2, &rpre, &rdec, NULL)) ||
                (free_out(o2, b),
                 rc = run_batch(res.g, b, ids, lens, new_tokens, o2, n2, &rpre, &rdec, NULL))) {
                zn_cli_fail(rc, "bench generate: resident");
                goto out;
            }
            comp_ms = rdec / steps * 1e3;
            for (int64_t i = 0; i < b; i++)
                if (n1[i] != n2[i] || memcmp(o1[i], o2[i], (size_t)n1[i] * 4)) {
                    fprintf(stderr, "zinc: error: bench generate: batch %lld, prompt %lld: the "
                            "streamed run's ids differ from the resident run's\n",
                            (long long)b, (long long)i);
                    goto out;
                }
        } else if (!pl.streamed_layers && !pl.kv_pinned) {
            comp_ms = step_ms; /* everything resident: the step is the compute */
        }
        for (int64_t i = 0; i < b; i++) {
            free(o1[i]);
            free(o2[i]);
            o1[i] = o2[i] = NULL;
            if (n1[i] != new_tokens) {
                fprintf(stderr, "zinc: error: bench generate: prompt %lld gave %lld ids, not "
                        "%lld\n", (long long)i, (long long)n1[i], (long long)new_tokens);
                goto out;
            }
        }
        /* the plan's bytes for these steps: step j feeds the token at
         * position plen + j, with that many rows cached per sequence */
        gen_step_bytes plan = { 0, 0, 0 };
        for (int64_t j = 0; j + 1 < new_tokens; j++) {
            gen_step_bytes sb;
            zn_gc_step_bytes(&pl, b, plen + j, &sb);
            plan.h2d += sb.h2d;
            plan.d2h += sb.d2h;
            plan.nvme += sb.nvme;
        }
        int wrong = (plan.h2d != moved.h2d) + (plan.d2h != moved.d2h) +
                    (plan.nvme != moved.nvme);
        wrong_total += wrong;
        /* the run's own copies and compute: on shared cores they add */
        double ceil_ms = fig.shared_cores && comp_ms > 0 ? link_ms + comp_ms
                         : link_ms > comp_ms ? link_ms : comp_ms;
        double ratio = ceil_ms > 0 ? ceil_ms / step_ms : 0;
        double ptps = (double)(b * plen) / pre, dtps = (double)b * steps / dec;
        /* the plan's bound at the decoding steps' mean context (positions
         * plen .. plen + new_tokens - 2), with the compute measured here
         * (the busiest of the two; their sum on the host backend) */
        const char *by;
        double bound_ms = zn_gc_step_bound(&pl, b, plen + (new_tokens - 2) / 2, &fig, &d,
                                           comp_ms >= 0 ? comp_ms * 1e-3 : -1, &by) * 1e3;
        double btps = bound_ms > 0 ? (double)b / bound_ms * 1e3 : 0;
        char cs[32] = "-", rs[32] = "-", bs_[32] = "-", os[32] = "-";
        if (comp_ms >= 0)
            snprintf(cs, sizeof cs, "%.2f", comp_ms);
        if (ratio > 0)
            snprintf(rs, sizeof rs, "%.2f", ratio);
        if (btps > 0) {
            snprintf(bs_, sizeof bs_, "%.1f", btps);
            snprintf(os, sizeof os, "%.2f", dtps / btps);
        }
        printf("%6lld %12.1f %12.1f %10.2f %10.2f %10s %7s %10s %8s %11.2f %11.1f %6d\n",
               (long long)b, ptps, dtps, step_ms, link_ms, cs, rs, bs_, os,
               (double)moved.h2d / steps / (1 << 20), (double)moved.d2h / steps / 1024, wrong);
        if (wrong)
            fprintf(stderr, "zinc: bench generate: batch %lld: the decoding steps moved %llu "
                    "bytes in, %llu out, %llu read from NVMe; the plan counts %llu, %llu, "
                    "%llu\n", (long long)b, (unsigned long long)moved.h2d,
                    (unsigned long long)moved.d2h, (unsigned long long)moved.nvme,
                    (unsigned long long)plan.h2d, (unsigned long long)plan.d2h,
                    (unsigned long long)plan.nvme);
        if (out)
            fprintf(out, "\"%s\",%s,%s,%d,%d,%d,%lld,%lld,%lld,%.1f,%.1f,%.3f,%.3f,%.3f,%.3f,"
                    "%.1f,%.3f,%d,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%d\n", di.name,
                    zn_dtype_name(dt), model, pl.layers, pl.resident_layers, pl.streamed_layers,
                    (long long)b, (long long)plen, (long long)new_tokens, ptps, dtps, step_ms,
                    link_ms, comp_ms, ratio, btps, btps > 0 ? dtps / btps : 0, pl.kv_pinned,
                    (unsigned long long)pl.kv_bytes_per_seq,
                    (unsigned long long)pl.kv_token_bytes, (unsigned long long)plan.h2d,
                    (unsigned long long)moved.h2d, (unsigned long long)plan.d2h,
                    (unsigned long long)moved.d2h, (unsigned long long)plan.nvme,
                    (unsigned long long)moved.nvme, wrong);
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
    for (int64_t i = 0; i < maxb; i++) {
        if (ids)
            free(ids[i]);
        if (o1)
            free(o1[i]);
        if (o2)
            free(o2[i]);
    }
    free(ids);
    free(o1);
    free(o2);
    free(lens);
    free(n1);
    free(n2);
    runner_close(&res);
    zn_gc_engine_close(&st);
    return ret;
}
