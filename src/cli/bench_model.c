/* `zinc bench model`: the flags, the model's dims (a config or an HF
 * folder) and the table of the decoder blocks' forward and backward
 * TFLOP/s beside the device's GEMM peak measured in the same run; the
 * timing and the figures are src/bench/model.c's. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zinc/bench.h"
#include "zinc/config.h"
#include "zinc/device.h"
#include "zinc/model.h"
#include "cli/cli.h"
#include "zinc/topo.h"
#include "zn_build_config.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zinc bench model [--config FILE [--set KEY=VALUE]... | --model DIR]\n"
            "                        [--batch B] [--seq T] [--device D] [--dtype f32|bf16]\n"
            "                        [--iters N] [--no-checkpoint] [--gpu-mem SIZE] [--csv FILE]\n"
            "                        [--attention auto|fused|gemm]\n"
            "  --config   a zinc/DeepSpeed config: model section (or model.path), micro batch,\n"
            "             data.seq_len, train.device\n"
            "  --model    a Hugging Face folder (config.json) instead of a config\n"
            "  --batch, --seq, --device, --dtype   override the config (defaults 1, 512,\n"
            "             auto, bf16 on CUDA / f32 on host)\n"
            "  --iters    timed repetitions after one warm-up (default 5; best is reported)\n"
            "  --attention  fused (flash-style kernels), gemm (batched GEMMs + softmax) or\n"
            "             auto (default: gemm up to %d tokens a sequence, fused beyond\n"
            "             for bf16 with head_dim <= %d)\n"
            "  --csv      append one line per row to FILE (header when new)\n",
            ZN_ATTN_AUTO_FUSED_SEQ, ZN_FLASH_MAX_HEAD_DIM);
}

/* The '#' lines, the table and, with --csv, a line per row in FILE. */
static void print_result(const zn_bench_model_config *c, const zn_bench_model_result *r,
                         const char *csv)
{
    const zn_model_dims *d = &c->dims;
    char cpu[256];
    zn_cpu_model(cpu, sizeof cpu);
    printf("# zinc bench model: decoder blocks forward + backward, achieved TFLOP/s vs the "
           "GEMM peak measured in this run\n");
    printf("# machine: %s, %ld CPUs online; device: %s (%s); zinc %s\n", cpu,
           sysconf(_SC_NPROCESSORS_ONLN), r->dev.name, r->dev.driver, ZN_VERSION);
    printf("# model: %s hidden %lld, %lld layers, heads %lld/%lld x %lld, intermediate %lld, "
           "vocab %lld%s (%.3g B params); timed: 1 layer + head, params resident\n",
           zn_model_arch_name(d->arch), (long long)d->hidden,
           (long long)d->n_layers, (long long)d->n_heads, (long long)d->n_kv_heads,
           (long long)d->head_dim, (long long)d->intermediate, (long long)d->vocab,
           d->tie_embeddings ? " tied" : "", (double)zn_model_param_count(d) / 1e9);
    printf("# batch %lld x seq %lld = %lld tokens, %s, activation checkpointing %s, "
           "%s attention, xent chunk of the vocab; best of %d after 1 warm-up\n",
           (long long)c->batch, (long long)c->seq, (long long)r->tokens, zn_dtype_name(r->dtype),
           c->checkpoint ? "on" : "off", r->fused ? "fused" : "GEMM",
           c->iters);
    printf("# model TF/s: 6 x params x tokens + causal attention 6 B T^2 qd, recompute not "
           "counted; hw TF/s counts the recompute (and the head's logits recompute)\n");
    printf("# GEMM peak: %lld^3 %s, best of %d: %.2f TFLOP/s; model step = layers x (fwd + bwd) "
           "+ head (embedding not timed)\n", (long long)r->gemm_n, zn_dtype_name(r->dtype),
           c->iters, r->peak_tflops);
    printf("# loss at init %.4f (expected ~%.4f = ln vocab + 0.02^2 hidden / 2); #wrong counts: "
           "loss off that, non-finite or zero layer grads/output, wrong GEMM check element\n",
           r->loss, r->want_loss);
    printf("#\n# %-12s %8s %10s %10s %10s %10s %7s %7s\n", "block", "tokens", "ms", "model TF/s",
           "hw TF/s", "peak TF/s", "ratio", "#wrong");
    FILE *cf = NULL;
    if (csv && !(cf = zn_cli_bench_csv_open(csv, "device,model_hidden,layers,batch,seq,dtype,"
                                            "checkpoint,block,tokens,ms,model_tflops,"
                                            "hw_tflops,peak_tflops,ratio,wrong")))
        fprintf(stderr, "zinc: warning: %s\n", zn_last_error());
    for (int i = 0; i < 4; i++) {
        const zn_bench_model_row *w = &r->rows[i];
        printf("  %-12s %8lld %10.3f %10.3f %10.3f %10.3f %7.3f %7llu\n", w->name,
               (long long)r->tokens, w->ms, w->model_tflops, w->hw_tflops, r->peak_tflops,
               w->ratio, (unsigned long long)r->wrong);
        if (cf)
            fprintf(cf, "\"%s\",%lld,%lld,%lld,%lld,%s,%d,\"%s\",%lld,%.4f,%.4f,%.4f,%.4f,%.4f,"
                    "%llu\n", r->dev.name, (long long)d->hidden, (long long)d->n_layers,
                    (long long)c->batch, (long long)c->seq, zn_dtype_name(r->dtype),
                    c->checkpoint, w->name, (long long)r->tokens, w->ms, w->model_tflops,
                    w->hw_tflops, r->peak_tflops, w->ratio, (unsigned long long)r->wrong);
    }
    if (cf)
        fclose(cf);
}

int zn_cli_bench_model(int argc, char **argv)
{
    const char *config = NULL, *model_dir = NULL, *device = NULL, *dtype = NULL, *csv = NULL;
    const char *gpu_mem = NULL, *attention = NULL;
    const char *sets[64];
    int n_sets = 0, iters = 5, checkpoint = 1, rc;
    int64_t batch = 0, seq = 0;
    argc = zn_cli_take_sets(argc, argv, sets, 64, &n_sets);
    if (argc < 0)
        return 2;
    static const struct option opts[] = {
        { "config", required_argument, 0, 'c' }, { "model", required_argument, 0, 'm' },
        { "batch", required_argument, 0, 'b' },  { "seq", required_argument, 0, 's' },
        { "device", required_argument, 0, 'D' }, { "dtype", required_argument, 0, 't' },
        { "iters", required_argument, 0, 'i' },  { "csv", required_argument, 0, 'o' },
        { "gpu-mem", required_argument, 0, 'g' }, { "no-checkpoint", no_argument, 0, 'n' },
        { "attention", required_argument, 0, 'a' },
        { "help", no_argument, 0, 'h' },         { 0, 0, 0, 0 },
    };
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        switch (c) {
        case 'c': config = optarg; break;
        case 'm': model_dir = optarg; break;
        case 'b': batch = atoll(optarg); break;
        case 's': seq = atoll(optarg); break;
        case 'D': device = optarg; break;
        case 't': dtype = optarg; break;
        case 'i': iters = atoi(optarg); break;
        case 'o': csv = optarg; break;
        case 'g': gpu_mem = optarg; break;
        case 'n': checkpoint = 0; break;
        case 'a': attention = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if ((!config == !model_dir) || optind < argc || iters < 1 || batch < 0 || seq < 0) {
        usage(stderr);
        return 2;
    }
    if (dtype && strcmp(dtype, "bf16") && strcmp(dtype, "f32")) {
        fprintf(stderr, "zinc: bench model: --dtype %s (f32 or bf16)\n", dtype);
        return 2;
    }
    int attn = ZN_ATTN_AUTO;
    if (attention && !strcmp(attention, "fused"))
        attn = ZN_ATTN_FUSED;
    else if (attention && !strcmp(attention, "gemm"))
        attn = ZN_ATTN_GEMM;
    else if (attention && strcmp(attention, "auto")) {
        fprintf(stderr, "zinc: bench model: --attention %s (auto, fused or gemm)\n", attention);
        return 2;
    }

    zn_model_dims d;
    zn_dev_config dc = zn_dev_config_default();
    dc.name = "auto";
    zn_config cfg;   /* dc.name may point into it: it lives as long as dc */
    if (config) {
        if ((rc = zn_config_load(&cfg, config, sets, n_sets)) ||
            (rc = zn_run_resolve(&cfg, NULL, 1, NULL)) || (rc = zn_run_model_dims(&cfg, &d)))
            return zn_cli_fail(rc, "bench model");
        if (!batch)
            batch = cfg.train_micro_batch_size_per_gpu;
        if (!seq)
            seq = cfg.data.seq_len;
        dc.name = cfg.train.device[0] ? cfg.train.device : "auto";
        checkpoint = checkpoint && cfg.train.activation_checkpointing;
        if (!cfg.tiers.gpu_auto && cfg.tiers.gpu)
            dc.gpu_budget = cfg.tiers.gpu;
    } else if ((rc = zn_model_dims_from_hf(&d, model_dir))) {
        return zn_cli_fail(rc, "bench model");
    }
    if (!batch)
        batch = 1;
    if (!seq)
        seq = 512;
    if (device)
        dc.name = device;
    if (gpu_mem && (rc = zn_parse_size(gpu_mem, &dc.gpu_budget)))
        return zn_cli_fail(rc, "bench model: --gpu-mem");

    zn_bench_model_config bc = { .dims = d, .dev = dc, .batch = batch, .seq = seq,
                                 .dtype = dtype ? (!strcmp(dtype, "bf16") ? ZN_DTYPE_BF16
                                                                          : ZN_DTYPE_F32) : -1,
                                 .checkpoint = checkpoint, .attention = attn, .iters = iters };
    zn_bench_model_result r;
    if ((rc = zn_bench_model_run(&bc, &r)))
        return zn_cli_fail(rc, "bench model");
    print_result(&bc, &r, csv);
    return r.wrong ? 1 : 0;
}
