/* `zinc eval`: mean next-token cross-entropy of a Hugging Face model folder
 * (config.json + safetensors) over token data, so that zinc's numbers can be
 * compared with another implementation's on the same ids. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "zinc/tokens.h"
#include "cli/cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zinc eval --model DIR --data FILE|synthetic [--seq-len N] [--batches K]\n"
            "                 [--batch B] [--device auto|host|cuda[:N]] [--dtype f32|bf16]\n"
            "                 [--gpu-mem SIZE] [--json]\n"
            "  --model    Hugging Face folder: config.json and model.safetensors or a\n"
            "             sharded model.safetensors.index.json (a family `zinc info` lists)\n"
            "  --data     token file (docs/tokens.md) or 'synthetic' (seeded Markov chain)\n"
            "  --seq-len  tokens per sequence (default 512, at most max_position_embeddings)\n"
            "  --batches  evaluate the first K batches (default: all full batches)\n"
            "  --batch    sequences per batch (default 1)\n"
            "  --device   default auto (CUDA when a GPU answers, else host)\n"
            "  --dtype    compute dtype (default bf16 on CUDA, f32 on host)\n"
            "  --gpu-mem  device arena size (default: the device layer's)\n"
            "  --json     one JSON object on stdout instead of text\n"
            "Windows of seq-len + 1 ids are read in file order; the result is the mean\n"
            "cross-entropy (nats) over every predicted token, and its exp (perplexity).\n");
}

int zn_cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *data = NULL, *device = "auto", *dtype = NULL, *gpu_mem = NULL;
    int64_t seq = 512, batches = 0, batch = 1;
    int json = 0, rc;
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' },  { "data", required_argument, 0, 'd' },
        { "seq-len", required_argument, 0, 's' }, { "batches", required_argument, 0, 'k' },
        { "batch", required_argument, 0, 'b' },  { "device", required_argument, 0, 'D' },
        { "dtype", required_argument, 0, 't' },  { "gpu-mem", required_argument, 0, 'g' },
        { "json", no_argument, 0, 'j' },         { "help", no_argument, 0, 'h' },
        { 0, 0, 0, 0 },
    };
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
        char *end = NULL;
        switch (c) {
        case 'm': model = optarg; break;
        case 'd': data = optarg; break;
        case 's': seq = strtoll(optarg, &end, 10); break;
        case 'k': batches = strtoll(optarg, &end, 10); break;
        case 'b': batch = strtoll(optarg, &end, 10); break;
        case 'D': device = optarg; break;
        case 't': dtype = optarg; break;
        case 'g': gpu_mem = optarg; break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (end && (*end || (c == 'k' ? batches < 0 : (c == 's' ? seq : batch) <= 0))) {
            fprintf(stderr, "zinc: error: eval: bad number '%s'\n", optarg);
            return 2;
        }
    }
    if (!model || !data || optind < argc) {
        usage(stderr);
        return 2;
    }

    zn_model_dims d;
    if ((rc = zn_model_dims_from_hf(&d, model)))
        return zn_cli_fail(rc, "eval");
    if (seq > d.max_pos) {
        fprintf(stderr, "zinc: error: eval: --seq-len %lld exceeds max_position_embeddings %lld\n",
                (long long)seq, (long long)d.max_pos);
        return 2;
    }
    zn_tokens *tok = NULL;
    if (!strcmp(data, "synthetic")) {
        uint64_t n = (uint64_t)(batches ? batches : 8) * (uint64_t)batch * (uint64_t)seq + 1;
        rc = zn_tokens_synthetic(&tok, n, (uint32_t)d.vocab, 1);
    } else {
        rc = zn_tokens_open(&tok, data);
    }
    if (rc)
        return zn_cli_fail(rc, "eval");

    zn_dev_config dc = zn_dev_config_default();
    dc.name = device;
    if (gpu_mem && (rc = zn_parse_size(gpu_mem, &dc.gpu_budget))) {
        zn_tokens_close(tok);
        return zn_cli_fail(rc, "eval: --gpu-mem");
    }
    zn_dev *dev = NULL;
    zn_model *m = NULL;
    zn_model_state *st = NULL;
    int ret = 1;
    if ((rc = zn_dev_create(&dev, &dc))) {
        zn_cli_fail(rc, "eval: device");
        goto out;
    }
    zn_model_config mc = zn_model_config_default(dev);
    if (dtype) {
        if (!strcmp(dtype, "f32"))
            mc.dtype = ZN_DTYPE_F32;
        else if (!strcmp(dtype, "bf16"))
            mc.dtype = ZN_DTYPE_BF16;
        else {
            fprintf(stderr, "zinc: error: eval: --dtype must be f32 or bf16\n");
            ret = 2;
            goto out;
        }
    }
    mc.max_batch = batch;
    mc.max_seq = seq;
    if ((rc = zn_model_create(&m, dev, &d, &mc)) || (rc = zn_model_state_create(&st, m, 0))) {
        zn_cli_fail(rc, "eval: model");
        goto out;
    }
    double t0 = zn_now_s();
    if ((rc = zn_model_state_load(st, model))) {
        zn_cli_fail(rc, "eval: loading weights");
        goto out;
    }
    double t1 = zn_now_s(), loss;
    int64_t ntok, nbat;
    if ((rc = zn_model_state_eval(st, NULL, tok, batch, seq, batches, &loss, &ntok, &nbat))) {
        zn_cli_fail(rc, "eval");
        goto out;
    }
    double t2 = zn_now_s();
    zn_dev_info di;
    zn_dev_get_info(dev, &di);
    if (json) {
        printf("{\"model\": \"%s\", \"model_type\": \"%s\", \"params\": %llu, \"data\": \"%s\", "
               "\"device\": \"%s\", \"dtype\": \"%s\", \"seq_len\": %lld, \"batch\": %lld, "
               "\"batches\": %lld, \"tokens\": %lld, \"loss\": %.9g, \"perplexity\": %.9g, "
               "\"load_s\": %.3f, \"eval_s\": %.3f}\n",
               model, zn_model_arch_name(d.arch),
               (unsigned long long)zn_model_param_count(&d), zn_tokens_name(tok), di.name,
               zn_dtype_name(mc.dtype), (long long)seq, (long long)batch, (long long)nbat,
               (long long)ntok, loss, exp(loss), t1 - t0, t2 - t1);
    } else {
        printf("model:   %s (%s, %.3g M parameters)\n", model,
               zn_model_arch_name(d.arch),
               (double)zn_model_param_count(&d) / 1e6);
        printf("data:    %s: %lld batches x %lld x %lld tokens (%lld predicted)\n",
               zn_tokens_name(tok), (long long)nbat, (long long)batch, (long long)seq,
               (long long)ntok);
        printf("device:  %s, %s\n", di.name, zn_dtype_name(mc.dtype));
        printf("loss:    %.6f nats/token (perplexity %.4f)\n", loss, exp(loss));
        printf("time:    load %.2f s, eval %.2f s (%.0f tokens/s)\n", t1 - t0, t2 - t1,
               (double)ntok / (t2 - t1 > 0 ? t2 - t1 : 1e-9));
    }
    ret = 0;
out:
    zn_model_state_destroy(st);
    zn_model_destroy(m);
    zn_dev_destroy(dev);
    zn_tokens_close(tok);
    return ret;
}
