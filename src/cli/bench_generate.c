/* `zinc bench generate`: prefill and decode tokens/s of an HF model folder
 * for batches of 1 .. 64 prompts, with the weights and the KV cache placed
 * as `zinc generate` places them for the same settings (the same function,
 * zn_gen_place_model), against the two ceilings of a decoding step measured
 * in the same run: the link (the step's streamed layers copied alone) and
 * the compute (the same batch with every weight and the cache resident,
 * when the device holds them), and against the bound `zinc generate --plan`
 * states. The data are checked: the streamed run's ids must be the
 * resident run's, and the bytes its decoding steps moved the plan's. */
#include <errno.h>
#include <getopt.h>
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

/* The resident run: the same sizing as the placed one (zn_gen_place_model)
 * with every weight and the cache on the device, on the same device. */
static int runner_open(runner *r, zn_dev *dev, const zn_model_dims *d, zn_dtype dt,
                       const zn_gen_place *o, const char *dir)
{
    int rc = zn_gen_place_model(dev, d, dt, o, &r->m, &r->g);
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
                     zn_gen_bytes *moved)
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
        default: return zn_bench_usage_exit(c, usage);
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

/* What a run holds: the placed model and the resident one, the prompts and
 * the two runs' outputs, the link's figures, the csv. */
typedef struct {
    zn_model_dims d;
    zn_gen_engine st;
    zn_gen_placement pl;
    runner res;
    int have_res;
    zn_ceilings fig;
    zn_dev_info di;
    int32_t **ids, **o1, **o2;
    int64_t *lens, *n1, *n2;
    FILE *out;
} bench;

static void bench_free(bench *B, int64_t maxb)
{
    if (B->out)
        fclose(B->out);
    for (int64_t i = 0; i < maxb; i++) {
        if (B->ids)
            free(B->ids[i]);
        if (B->o1)
            free(B->o1[i]);
        if (B->o2)
            free(B->o2[i]);
    }
    free(B->ids);
    free(B->o1);
    free(B->o2);
    free(B->lens);
    free(B->n1);
    free(B->n2);
    runner_close(&B->res);
    zn_gen_engine_close(&B->st);
}

/* The prompts (seeded ids), the placed model, the resident one beside it
 * when the device holds it, the link's figures. Returns -1 to go on, or
 * the exit code. */
static int bench_open(bench *B, bench_args *a)
{
    int64_t maxb = a->maxb;
    int rc;
    B->ids = calloc((size_t)maxb, sizeof *B->ids);
    B->o1 = calloc((size_t)maxb, sizeof *B->o1);
    B->o2 = calloc((size_t)maxb, sizeof *B->o2);
    B->lens = calloc((size_t)maxb, sizeof *B->lens);
    B->n1 = calloc((size_t)maxb, 8);
    B->n2 = calloc((size_t)maxb, 8);
    if (!B->ids || !B->o1 || !B->o2 || !B->lens || !B->n1 || !B->n2)
        return zn_cli_fail(-ENOMEM, "bench generate");
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < maxb; i++) {
        B->lens[i] = a->plen;
        if (!(B->ids[i] = malloc((size_t)a->plen * sizeof **B->ids)))
            return zn_cli_fail(-ENOMEM, "bench generate");
        for (int64_t k = 0; k < a->plen; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            B->ids[i][k] = (int32_t)(x % (uint64_t)B->d.vocab);
        }
    }
    /* the placed model: the device, the model and its generator exactly as
     * `zinc generate` opens them */
    if ((rc = zn_gc_place_flags(&a->o, a->gpu_mem, a->dtype, "bench generate")))
        return rc;
    if ((rc = zn_gen_engine_open(&B->st, &B->d, a->model, NULL, NULL, &a->o, 0)))
        return zn_cli_fail(rc, "bench generate");
    zn_gen_get_placement(B->st.g, &B->pl);
    /* the compute ceiling: every weight and the cache resident, when the
     * arena holds them beside the placed model */
    if (B->pl.streamed_layers || B->pl.kv_pinned) {
        zn_gen_place ro = a->o;
        ro.nvme = NULL;
        ro.resident = -1;
        ro.kv_home = ZN_GEN_KV_DEVICE;
        B->have_res = !runner_open(&B->res, B->st.dev, &B->d, B->st.dt, &ro, a->model);
        zn_gen_placement rp;
        if (B->have_res) {
            zn_gen_get_placement(B->res.g, &rp);
            B->have_res = !rp.streamed_layers && !rp.kv_pinned;
        }
        if (!B->have_res)
            runner_close(&B->res);
    }
    if ((rc = zn_gen_link_figures(a->o.device, a->o.nvme, a->target, 0, &B->fig, stderr))) {
        zn_cli_fail(rc, "bench generate");
        return a->target ? 2 : 1; /* with a target, only its name can be wrong */
    }
    zn_dev_get_info(B->st.dev, &B->di);
    return -1;
}

/* The lines above the table: the placement, the device, the link, the
 * cache; then the table's header. */
static void print_header(const bench *B, const bench_args *a)
{
    const zn_gen_placement *pl = &B->pl;
    const zn_ceilings *fig = &B->fig;
    char s1[32], s2[32];
    printf("model    %s: %d layers, %d on the device, %d streamed from %s (%.1f MiB each, "
           "ring %d)\n", a->model, pl->layers, pl->resident_layers, pl->streamed_layers,
           pl->nvme_bytes ? "NVMe" : "pinned RAM", (double)pl->layer_bytes / (1 << 20),
           pl->ring);
    printf("device   %s, %s; prompts of %lld ids, %lld new tokens each\n", B->di.name,
           zn_dtype_name(B->st.dt), (long long)a->plen, (long long)a->new_tokens);
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

/* Batch b timed on the placed model (and on the resident one, whose ids
 * it must give), then its row: the figures, the ceilings, the bound and
 * whether the bytes moved are the plan's (*wrong). Returns 0, or 1 after
 * printing a failure. */
static int bench_batch(bench *B, const bench_args *a, int64_t b, int *wrong)
{
    const zn_gen_placement *pl = &B->pl;
    int64_t plen = a->plen, new_tokens = a->new_tokens;
    double pre, dec, rpre = 0, rdec = 0, link = 0;
    zn_gen_bytes moved;
    int rc;
    /* a warm-up batch, then the timed one */
    if ((rc = run_batch(B->st.g, b, B->ids, B->lens, 2, B->o1, B->n1, &pre, &dec, NULL)) ||
        (free_out(B->o1, b),
         rc = run_batch(B->st.g, b, B->ids, B->lens, new_tokens, B->o1, B->n1, &pre, &dec,
                        &moved)) ||
        (rc = zn_gen_time_link(B->st.g, &link)))
        return zn_cli_fail(rc, "bench generate");
    double steps = (double)(new_tokens - 1);
    double step_ms = dec / steps * 1e3, link_ms = link * 1e3, comp_ms = -1;
    if (B->have_res) {
        if ((rc = run_batch(B->res.g, b, B->ids, B->lens, 2, B->o2, B->n2, &rpre, &rdec,
                            NULL)) ||
            (free_out(B->o2, b),
             rc = run_batch(B->res.g, b, B->ids, B->lens, new_tokens, B->o2, B->n2, &rpre,
                            &rdec, NULL)))
            return zn_cli_fail(rc, "bench generate: resident");
        comp_ms = rdec / steps * 1e3;
        for (int64_t i = 0; i < b; i++)
            if (B->n1[i] != B->n2[i] || memcmp(B->o1[i], B->o2[i], (size_t)B->n1[i] * 4)) {
                fprintf(stderr, "zinc: error: bench generate: batch %lld, prompt %lld: the "
                        "streamed run's ids differ from the resident run's\n",
                        (long long)b, (long long)i);
                return 1;
            }
    } else if (!pl->streamed_layers && !pl->kv_pinned) {
        comp_ms = step_ms; /* everything resident: the step is the compute */
    }
    for (int64_t i = 0; i < b; i++) {
        free(B->o1[i]);
        free(B->o2[i]);
        B->o1[i] = B->o2[i] = NULL;
        if (B->n1[i] != new_tokens) {
            fprintf(stderr, "zinc: error: bench generate: prompt %lld gave %lld ids, not "
                    "%lld\n", (long long)i, (long long)B->n1[i], (long long)new_tokens);
            return 1;
        }
    }
    /* the plan's bytes for these steps: step j feeds the token at
     * position plen + j, with that many rows cached per sequence */
    zn_gen_bytes plan = { 0, 0, 0 };
    for (int64_t j = 0; j + 1 < new_tokens; j++) {
        zn_gen_bytes sb;
        zn_gen_step_bytes(pl, b, plen + j, &sb);
        plan.h2d += sb.h2d;
        plan.d2h += sb.d2h;
        plan.nvme += sb.nvme;
    }
    *wrong = (plan.h2d != moved.h2d) + (plan.d2h != moved.d2h) + (plan.nvme != moved.nvme);
    /* the run's own copies and compute: on shared cores they add */
    double ceil_ms = B->fig.shared_cores && comp_ms > 0 ? link_ms + comp_ms
                     : link_ms > comp_ms ? link_ms : comp_ms;
    double ratio = ceil_ms > 0 ? ceil_ms / step_ms : 0;
    double ptps = (double)(b * plen) / pre, dtps = (double)b * steps / dec;
    /* the plan's bound at the decoding steps' mean context (positions
     * plen .. plen + new_tokens - 2), with the compute measured here
     * (the busiest of the two; their sum on the host backend) */
    const char *by;
    double bound_ms = zn_gen_step_bound(pl, b, plen + (new_tokens - 2) / 2, &B->fig, &B->d,
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
           (double)moved.h2d / steps / (1 << 20), (double)moved.d2h / steps / 1024, *wrong);
    if (*wrong)
        fprintf(stderr, "zinc: bench generate: batch %lld: the decoding steps moved %llu "
                "bytes in, %llu out, %llu read from NVMe; the plan counts %llu, %llu, "
                "%llu\n", (long long)b, (unsigned long long)moved.h2d,
                (unsigned long long)moved.d2h, (unsigned long long)moved.nvme,
                (unsigned long long)plan.h2d, (unsigned long long)plan.d2h,
                (unsigned long long)plan.nvme);
    if (B->out)
        fprintf(B->out, "\"%s\",%s,%s,%d,%d,%d,%lld,%lld,%lld,%.1f,%.1f,%.3f,%.3f,%.3f,%.3f,"
                "%.1f,%.3f,%d,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%d\n", B->di.name,
                zn_dtype_name(B->st.dt), a->model, pl->layers, pl->resident_layers,
                pl->streamed_layers, (long long)b, (long long)plen, (long long)new_tokens, ptps,
                dtps, step_ms, link_ms, comp_ms, ratio, btps, btps > 0 ? dtps / btps : 0,
                pl->kv_pinned, (unsigned long long)pl->kv_bytes_per_seq,
                (unsigned long long)pl->kv_token_bytes, (unsigned long long)plan.h2d,
                (unsigned long long)moved.h2d, (unsigned long long)plan.d2h,
                (unsigned long long)moved.d2h, (unsigned long long)plan.nvme,
                (unsigned long long)moved.nvme, *wrong);
    return 0;
}

int zn_bench_generate(int argc, char **argv)
{
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    bench B;
    memset(&B, 0, sizeof B);
    if ((rc = zn_model_dims_from_hf(&B.d, a.model)))
        return zn_cli_fail(rc, "bench generate");
    int64_t ctx = a.plen + a.new_tokens;
    if (ctx > B.d.max_pos) {
        fprintf(stderr, "zinc: error: bench generate: %lld + %lld tokens exceed "
                "max_position_embeddings %lld\n", (long long)a.plen, (long long)a.new_tokens,
                (long long)B.d.max_pos);
        return 2;
    }
    /* the cache holds the largest batch, as `zinc generate --batch-size` with
     * that many prompts and --context prompt-len + new-tokens sizes it */
    a.o.ctx = ctx;
    a.o.batch = a.maxb;
    int ret = bench_open(&B, &a);
    if (ret >= 0)
        goto out;
    ret = 1;
    print_header(&B, &a);
    if (a.csv && !(B.out = zn_bench_csv_open(a.csv, "device,dtype,model,layers,resident,"
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
        int wrong = 0;
        if (bench_batch(&B, &a, a.bs[k], &wrong))
            goto out;
        wrong_total += wrong;
    }
    if (wrong_total) {
        fprintf(stderr, "zinc: error: bench generate: the bytes the decoding steps moved are "
                "not the plan's (#wrong %d)\n", wrong_total);
        goto out;
    }
    ret = 0;
out:
    bench_free(&B, a.maxb);
    return ret;
}
