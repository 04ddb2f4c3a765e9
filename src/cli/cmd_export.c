/* `zinc export CHECKPOINT --out DIR`: a checkpoint's master weights as a
 * Hugging Face folder transformers loads (config.json, safetensors shards,
 * index). `--verify` only checks every file against the manifest. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "zinc/ckpt.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zinc export CHECKPOINT --out DIR [--dtype bf16|fp32] [--shard-size SIZE]\n"
            "       zinc export LORA-CHECKPOINT --merge --out DIR [--base DIR] [--dtype ...]\n"
            "       zinc export CHECKPOINT --verify\n"
            "  CHECKPOINT    a step folder (step-NNNNNNNN) or a checkpoint folder (its\n"
            "                'latest' is used)\n"
            "  --out DIR     Hugging Face folder to write: config.json,\n"
            "                model-0000K-of-0000N.safetensors, model.safetensors.index.json\n"
            "  --dtype       bf16 or fp32: the fp32 master weights rounded (default bf16;\n"
            "                fp32 for a LoRA checkpoint)\n"
            "A LoRA checkpoint becomes a PEFT adapter folder (adapter_config.json,\n"
            "adapter_model.safetensors) that peft.PeftModel.from_pretrained loads.\n"
            "  --merge       LoRA: a full HF model instead, the base with W + scale B A\n"
            "                folded into each target (fp32 math); the base's config,\n"
            "                tokenizer files and tensor types (unless --dtype is given)\n"
            "  --base DIR    the base model folder for --merge (default: the model.path\n"
            "                the run recorded)\n"
            "  --shard-size  largest safetensors file (default 2GiB)\n"
            "  --verify      read every file and compare its size and crc32c with the\n"
            "                manifest; exit 0 when all match\n"
            "A sharded checkpoint's blocks are reassembled from every rank's part.\n");
}

int zn_cmd_export(int argc, char **argv)
{
    const char *out = NULL, *dtype = NULL, *shard = NULL, *ck = NULL, *base = NULL;
    int verify = 0, merge = 0;
    static const struct option opts[] = {
        { "out", required_argument, 0, 'o' },   { "dtype", required_argument, 0, 't' },
        { "shard-size", required_argument, 0, 's' }, { "verify", no_argument, 0, 'v' },
        { "merge", no_argument, 0, 'm' },       { "base", required_argument, 0, 'b' },
        { "help", no_argument, 0, 'h' },        { 0, 0, 0, 0 },
    };
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1;) {
        switch (c) {
        case 'o': out = optarg; break;
        case 't': dtype = optarg; break;
        case 's': shard = optarg; break;
        case 'v': verify = 1; break;
        case 'm': merge = 1; break;
        case 'b': base = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "zinc: error: export: one CHECKPOINT expected\n");
        usage(stderr);
        return 2;
    }
    ck = argv[optind];
    if (verify) {
        int rc = zn_ckpt_verify(ck);
        if (rc)
            return zn_cli_fail(rc, "verify");
        printf("%s: every file matches the manifest\n", ck);
        return 0;
    }
    if (!out) {
        fprintf(stderr, "zinc: error: export: --out DIR is required\n");
        return 2;
    }
    if (base && !merge) {
        fprintf(stderr, "zinc: error: export: --base only goes with --merge\n");
        return 2;
    }
    int force_dtype = dtype != NULL;
    if (!dtype && merge)
        dtype = "the base's types";
    else if (!dtype) {
        /* default: bf16 weights, fp32 adapters (small, and what peft keeps) */
        zn_ckpt *c = NULL;
        zn_model_dims d;
        dtype = !zn_ckpt_open(&c, ck) && !zn_ckpt_dims(c, &d) && d.lora.r > 0 ? "fp32" : "bf16";
        zn_ckpt_close(c);
    }
    zn_dtype dt = ZN_DTYPE_BF16;
    if (merge && !force_dtype)
        ;
    else if (!strcmp(dtype, "bf16"))
        dt = ZN_DTYPE_BF16;
    else if (!strcmp(dtype, "fp32") || !strcmp(dtype, "f32"))
        dt = ZN_DTYPE_F32;
    else {
        fprintf(stderr, "zinc: error: export: --dtype %s: expected bf16 or fp32\n", dtype);
        return 2;
    }
    uint64_t shard_bytes = 0;
    if (shard && zn_parse_size(shard, &shard_bytes)) {
        fprintf(stderr, "zinc: error: export: --shard-size %s: %s\n", shard, zn_last_error());
        return 2;
    }
    double t0 = zn_now_s();
    int rc = merge ? zn_ckpt_export_merged(ck, out, base, force_dtype, dt, shard_bytes)
                   : zn_ckpt_export(ck, out, dt, shard_bytes);
    if (rc)
        return zn_cli_fail(rc, "export");
    printf("exported %s to %s (%s%s) in %.2f s\n", ck, out, merge ? "merged, " : "", dtype,
           zn_now_s() - t0);
    return 0;
}
