/* `zinc bench model`: times the decoder's blocks (one layer's forward and
 * backward with recompute, the head's chunked cross-entropy) on the chosen
 * device with parameters resident, and prints achieved TFLOP/s beside the
 * device's GEMM peak measured in the same run. Only one layer (plus the
 * embedding and head) is allocated: every layer has the same shapes, so a
 * 14B model's layer can be timed on a 24 GB GPU. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

typedef struct {
    const char *name;
    double ms, model_flops, hw_flops;
} row;

int zn_bench_model(int argc, char **argv)
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
    if (config) {
        zn_config cfg;
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

    zn_dev *dev = NULL;
    void *gA = NULL, *gB = NULL, *gC = NULL;
    zn_event *ev[2] = { 0 };
    int ret = 1;
    if ((rc = zn_dev_create(&dev, &dc))) {
        zn_cli_fail(rc, "bench model: device");
        goto out;
    }
    zn_model_config mc = zn_model_config_default(dev);
    if (dtype)
        mc.dtype = !strcmp(dtype, "bf16") ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    mc.attention = attn;
    zn_model_probe_opts po = { .batch = batch, .seq = seq, .dtype = mc.dtype,
                               .checkpoint = checkpoint, .attention = attn, .iters = iters };
    zn_model_probe pr;
    if ((rc = zn_model_probe_blocks(dev, &d, &po, &pr))) {
        zn_cli_fail(rc, "bench model: model");
        goto out;
    }
    for (int i = 0; i < 2; i++)
        if ((rc = zn_dev_event_create_timed(dev, &ev[i]))) {
            zn_cli_fail(rc, "bench model: events");
            goto out;
        }
    int64_t N = batch * seq;
    double best[3] = { pr.layer_fwd_s * 1e3, pr.layer_bwd_s * 1e3, pr.head_s * 1e3 };
    float loss = pr.loss;
    double want_loss = pr.want_loss;
    uint64_t wrong = pr.wrong;

    /* The GEMM ceiling on this device in this run: a square product in the
     * model's dtype (bf16 -> bf16 on CUDA, f32 on host). */
    zn_dev_info di;
    zn_dev_get_info(dev, &di);
    int64_t S = di.kind == ZN_DEV_CUDA ? 8192 : 1024;
    size_t es = zn_dtype_size(mc.dtype);
    double peak = 0;
    if (!zn_dev_alloc(dev, (size_t)(S * S) * es, "gemm A", &gA) &&
        !zn_dev_alloc(dev, (size_t)(S * S) * es, "gemm B", &gB) &&
        !zn_dev_alloc(dev, (size_t)(S * S) * es, "gemm C", &gC)) {
        zn_dev_fill(dev, NULL, gA, mc.dtype, S * S, 0.01f);
        zn_dev_fill(dev, NULL, gB, mc.dtype, S * S, 0.02f);
        for (int it = 0; it <= iters; it++) {
            float ms;
            zn_dev_event_record(dev, ev[0], NULL);
            rc = zn_dev_gemm(dev, NULL, ZN_NOTRANS, ZN_TRANS, S, S, S, 1.0f, gA, mc.dtype, S, gB,
                             mc.dtype, S, 0.0f, gC, mc.dtype, S);
            zn_dev_event_record(dev, ev[1], NULL);
            if (rc || (rc = zn_dev_stream_sync(dev, NULL)))
                break;
            zn_dev_event_elapsed_ms(dev, ev[0], ev[1], &ms);
            if (it > 0 && ms > 0)
                peak = fmax(peak, 2.0 * (double)S * S * S / (ms * 1e-3) / 1e12);
        }
        /* Check one element: 0.01 * 0.02 * S. */
        float c0 = 0;
        uint16_t hb;
        if (mc.dtype == ZN_DTYPE_F32) {
            zn_dev_copy_d2h(dev, NULL, &c0, gC, 4);
        } else {
            zn_dev_copy_d2h(dev, NULL, &hb, gC, 2);
        }
        zn_dev_stream_sync(dev, NULL);
        if (mc.dtype != ZN_DTYPE_F32) {
            uint32_t u = (uint32_t)hb << 16;
            memcpy(&c0, &u, 4);
        }
        if (fabs(c0 - 0.0002 * (double)S) > 0.02 * 0.0002 * (double)S)
            wrong++;
    }

    char cpu[256];
    zn_cpu_model(cpu, sizeof cpu);
    double lf = zn_model_flops(&d, 1, batch, seq), hf = zn_model_flops(&d, d.n_layers + 1, batch, seq);
    /* Forward alone is a third of the model FLOPs; the backward with
     * recompute runs a forward again plus the two backward thirds. */
    row rows[4] = {
        { "layer fwd", best[0], lf / 3, lf / 3 },
        { "layer bwd", best[1], lf * 2 / 3, checkpoint ? lf : lf * 2 / 3 },
        { "head f+b", best[2], hf, hf * 4 / 3 },
        { "model step", best[0] * (double)d.n_layers + best[1] * (double)d.n_layers + best[2],
          zn_model_flops(&d, -1, batch, seq),
          (checkpoint ? lf * 4 / 3 : lf) * (double)d.n_layers + hf * 4 / 3 },
    };
    printf("# zinc bench model: decoder blocks forward + backward, achieved TFLOP/s vs the "
           "GEMM peak measured in this run\n");
    printf("# machine: %s, %ld CPUs online; device: %s (%s); zinc %s\n", cpu,
           sysconf(_SC_NPROCESSORS_ONLN), di.name, di.driver, ZN_VERSION);
    printf("# model: %s hidden %lld, %lld layers, heads %lld/%lld x %lld, intermediate %lld, "
           "vocab %lld%s (%.3g B params); timed: 1 layer + head, params resident\n",
           zn_model_arch_name(d.arch), (long long)d.hidden,
           (long long)d.n_layers, (long long)d.n_heads, (long long)d.n_kv_heads,
           (long long)d.head_dim, (long long)d.intermediate, (long long)d.vocab,
           d.tie_embeddings ? " tied" : "", (double)zn_model_param_count(&d) / 1e9);
    printf("# batch %lld x seq %lld = %lld tokens, %s, activation checkpointing %s, "
           "%s attention, xent chunk of the vocab; best of %d after 1 warm-up\n",
           (long long)batch, (long long)seq, (long long)N, zn_dtype_name(mc.dtype),
           checkpoint ? "on" : "off", pr.fused ? "fused" : "GEMM",
           iters);
    printf("# model TF/s: 6 x params x tokens + causal attention 6 B T^2 qd, recompute not "
           "counted; hw TF/s counts the recompute (and the head's logits recompute)\n");
    printf("# GEMM peak: %lld^3 %s, best of %d: %.2f TFLOP/s; model step = layers x (fwd + bwd) "
           "+ head (embedding not timed)\n", (long long)S, zn_dtype_name(mc.dtype), iters, peak);
    printf("# loss at init %.4f (expected ~%.4f = ln vocab + 0.02^2 hidden / 2); #wrong counts: "
           "loss off that, non-finite or zero layer grads/output, wrong GEMM check element\n",
           loss, want_loss);
    printf("#\n# %-12s %8s %10s %10s %10s %10s %7s %7s\n", "block", "tokens", "ms", "model TF/s",
           "hw TF/s", "peak TF/s", "ratio", "#wrong");
    FILE *cf = NULL;
    if (csv && !(cf = zn_bench_csv_open(csv, "device,model_hidden,layers,batch,seq,dtype,"
                                        "checkpoint,block,tokens,ms,model_tflops,hw_tflops,"
                                        "peak_tflops,ratio,wrong")))
        fprintf(stderr, "zinc: warning: %s\n", zn_last_error());
    for (int i = 0; i < 4; i++) {
        double tf = rows[i].model_flops / (rows[i].ms * 1e-3) / 1e12;
        double hw = rows[i].hw_flops / (rows[i].ms * 1e-3) / 1e12;
        printf("  %-12s %8lld %10.3f %10.3f %10.3f %10.3f %7.3f %7llu\n", rows[i].name,
               (long long)N, rows[i].ms, tf, hw, peak, peak > 0 ? hw / peak : 0.0,
               (unsigned long long)wrong);
        if (cf)
            fprintf(cf, "\"%s\",%lld,%lld,%lld,%lld,%s,%d,\"%s\",%lld,%.4f,%.4f,%.4f,%.4f,%.4f,%llu\n",
                    di.name, (long long)d.hidden, (long long)d.n_layers, (long long)batch,
                    (long long)seq, zn_dtype_name(mc.dtype), checkpoint, rows[i].name,
                    (long long)N, rows[i].ms, tf, hw, peak, peak > 0 ? hw / peak : 0.0,
                    (unsigned long long)wrong);
    }
    if (cf)
        fclose(cf);
    ret = wrong ? 1 : 0;
out:
    for (int i = 0; i < 2; i++)
        zn_dev_event_destroy(dev, ev[i]);
    if (dev) {
        zn_dev_sync(dev);
        zn_dev_free(dev, gA);
        zn_dev_free(dev, gB);
        zn_dev_free(dev, gC);
    }
    zn_dev_destroy(dev);
    return ret;
}
