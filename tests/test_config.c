/* The config parser: good files, each class of bad file, and the text of
 * the errors (the key path, the line:column, the suggestion). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/config.h"
#include "zinc/model.h"
#include "zinc/run.h"
#include <stdio.h>
#include <unistd.h>
#include "zt.h"

#ifndef ZN_SOURCE_ROOT
#error "ZN_SOURCE_ROOT must point at the source tree"
#endif

static int parse(zn_config *c, const char *json)
{
    return zn_config_parse(c, json, "t.json", NULL, 0);
}

/* Expects the JSON to be refused with a message containing `want`. */
static void bad(const char *json, const char *want)
{
    zn_config c;
    int rc = parse(&c, json);
    ZT_CHECK_MSG(rc == ZN_ECONFIG, "expected ZN_ECONFIG for %s, got %d", json, rc);
    ZT_CONTAINS(zn_last_error(), want);
}

/* Parses `json` (NULL: loads the file `path`) with stderr caught in `out`:
 * the warnings the parse gave, as a user sees them. Returns the parse's code. */
static int parse_caught(zn_config *c, const char *json, const char *path, char *out, size_t len)
{
    fflush(stderr);
    FILE *f = tmpfile();
    int saved = dup(2);
    if (!f || saved < 0 || dup2(fileno(f), 2) != 2)
        ZT_SETUP_FAIL("catching stderr: %s", strerror(errno));
    int rc = json ? parse(c, json) : zn_config_load(c, path, NULL, 0);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    size_t n = fread(out, 1, len - 1, f);
    out[n] = '\0';
    fclose(f);
    return rc;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static void test_defaults(void)
{
    zn_config c;
    ZT_EQ_INT(parse(&c, "{}"), 0);
    /* DeepSpeed's defaults (shared/reference/deepspeed.md, section 2). */
    ZT_EQ_INT(c.zero.stage, 0);
    ZT_EQ_INT(c.zero.sub_group_size, 1000000000);
    ZT_EQ_INT(c.zero.stage3_prefetch_bucket_size, 50000000);
    ZT_EQ_INT(c.zero.stage3_param_persistence_threshold, 100000);
    ZT_EQ_INT(c.zero.offload_param.buffer_count, 5);
    ZT_EQ_INT(c.zero.offload_param.buffer_size, 100000000);
    ZT_EQ_INT(c.zero.offload_param.max_in_cpu, 1000000000);
    ZT_EQ_INT(c.zero.offload_optimizer.buffer_count, 4);
    ZT_EQ_INT(c.aio.block_size, 1048576);
    ZT_EQ_INT(c.aio.queue_depth, 8);
    ZT_EQ_INT(c.aio.intra_op_parallelism, 1);
    ZT_CHECK(c.aio.overlap_events);
    ZT_CHECK(!c.aio.single_submit);
    /* no optimizer section: AdamW with the HF Trainer's defaults (issue 16) */
    ZT_CHECK(c.optimizer_from_train && c.scheduler_from_train);
    ZT_EQ_INT(c.optimizer.type, ZN_OPT_ADAMW);
    ZT_CHECK(c.optimizer.lr == 5e-5 && c.optimizer.beta1 == 0.9 && c.optimizer.beta2 == 0.999);
    ZT_CHECK(c.optimizer.eps == 1e-8 && c.optimizer.weight_decay == 0.0);
    ZT_EQ_INT(c.scheduler.type, ZN_SCHED_HF_LINEAR);
    ZT_EQ_INT(c.scheduler.warmup_num_steps, 0);
    ZT_EQ_INT(c.scheduler.total_num_steps, 100);
    ZT_CHECK(c.gradient_clipping == 0.0); /* absent: DeepSpeed's default */
    ZT_EQ_INT(c.n_warnings, 2);
    ZT_CHECK(c.optimizer.bias_correction);
    ZT_EQ_INT(c.fp16.initial_scale_power, 16);
    ZT_EQ_INT(c.fp16.loss_scale_window, 1000);
    ZT_EQ_INT(c.fp16.hysteresis, 2);
    ZT_CHECK(c.tiers.gpu_auto && c.tiers.cpu_auto);
    ZT_EQ_INT(zn_config_resolve_batch(&c, 1), 0);
    ZT_EQ_INT(c.train_batch_size, 1);
}

static void test_good(void)
{
    zn_config c;
    int rc = parse(&c,
        "{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 4,"
        " \"steps_per_print\": 7, \"wall_clock_breakdown\": false,"
        " \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 2e-5, \"betas\": [0.8, 0.99],"
        "   \"weight_decay\": 0.1, \"torch_adam\": false}},"
        " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": 100,"
        "   \"warmup_num_steps\": 10, \"warmup_max_lr\": 2e-5}},"
        " \"bf16\": {\"enabled\": true},"
        " \"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 1e8,"
        "   \"reduce_scatter\": true, \"stage3_gather_16bit_weights_on_model_save\": true,"
        "   \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/nvme\", \"max_in_cpu\": 5e8},"
        "   \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": null}},"
        " \"aio\": {\"thread_count\": 3, \"queue_depth\": 32},"
        " \"tiers\": {\"gpu\": \"24GiB\", \"cpu\": \"auto\","
        "   \"nvme\": [{\"path\": \"/a\", \"size\": \"1TiB\"}, {\"path\": \"/b\"}]},"
        " \"_note\": \"keys starting with _ are comments\"}");
    ZT_CHECK_MSG(rc == 0, "parse failed: %s", zn_last_error());
    ZT_EQ_INT(c.optimizer.type, ZN_OPT_ADAMW);
    ZT_CHECK(c.optimizer.adam_w_mode);
    ZT_CHECK(c.optimizer.lr == 2e-5 && c.optimizer.beta1 == 0.8 && c.optimizer.beta2 == 0.99);
    ZT_EQ_INT(c.scheduler.type, ZN_SCHED_WARMUP_DECAY_LR);
    ZT_EQ_INT(c.scheduler.total_num_steps, 100);
    ZT_CHECK(c.bf16);
    ZT_EQ_INT(c.zero.stage, 3);
    ZT_EQ_INT(c.zero.sub_group_size, 100000000);
    ZT_EQ_INT(c.zero.offload_param.device, ZN_OFFLOAD_NVME);
    ZT_EQ_STR(c.zero.offload_param.nvme_path, "/nvme");
    ZT_EQ_INT(c.zero.offload_param.max_in_cpu, 500000000);
    ZT_EQ_INT(c.zero.offload_optimizer.device, ZN_OFFLOAD_CPU);
    ZT_CHECK(c.zero.offload_optimizer.pin_memory); /* null keeps the default */
    ZT_EQ_INT(c.aio.intra_op_parallelism, 3);      /* thread_count is the old name */
    ZT_EQ_INT(c.train.log_every, 7);               /* steps_per_print */
    ZT_CHECK(!c.tiers.gpu_auto);
    ZT_EQ_U64(c.tiers.gpu, 24ull << 30);
    ZT_CHECK(c.tiers.cpu_auto);
    ZT_EQ_INT(c.tiers.n_nvme, 2);
    ZT_EQ_U64(c.tiers.nvme[0].size, 1ull << 40);
    ZT_CHECK(!c.tiers.nvme[0].size_auto);
    ZT_CHECK(c.tiers.nvme[1].size_auto);
    ZT_EQ_INT(zn_config_resolve_batch(&c, 2), 0);
    ZT_EQ_INT(c.train_micro_batch_size_per_gpu, 4);

    /* The dump parses back to the same config. */
    char *dump = zn_config_dump(&c);
    ZT_CHECK(dump != NULL);
    zn_config c2;
    rc = parse(&c2, dump);
    ZT_CHECK_MSG(rc == 0, "re-parsing the dump failed: %s\n%s", zn_last_error(), dump);
    ZT_CHECK(c2.optimizer.lr == c.optimizer.lr);
    ZT_EQ_INT(c2.zero.offload_param.max_in_cpu, c.zero.offload_param.max_in_cpu);
    ZT_EQ_U64(c2.tiers.nvme[0].size, c.tiers.nvme[0].size);
    ZT_EQ_INT(c2.tiers.n_nvme, 2);
    ZT_EQ_INT(c2.scheduler.type, c.scheduler.type);
    ZT_EQ_INT(c2.train_batch_size, c.train_batch_size);
    free(dump);
}

static void test_bad(void)
{
    /* Syntax errors carry line:column. */
    bad("{\n  \"a\": 1,\n}", "t.json:3:1");
    bad("[1, 2]", "top level must be an object");
    bad("{\"train_batch_size\": 1, \"train_batch_size\": 2}", "duplicate");
    /* Unknown keys: the path and the closest key. */
    bad("{\"zero_optimization\": {\"offload_parm\": {}}}",
        "zero_optimization.offload_parm: unknown key (did you mean 'offload_param'?)");
    bad("{\"zero_optimization\": {\"offload_param\": {\"devise\": \"cpu\"}}}",
        "did you mean 'device'?");
    bad("{\"sub_group_size\": 5}", "it belongs at 'zero_optimization.sub_group_size'");
    bad("{\"frobnicate\": 5}", "frobnicate: unknown key");
    /* DeepSpeed keys zinc does not implement. */
    bad("{\"zero_optimization\": {\"reduce_scatter\": false}}",
        "reduce_scatter is not implemented by zinc; only its default (true) is accepted");
    /* DeepSpeed's deprecated cpu_offload spellings against an explicit
     * modern key that says otherwise */
    bad("{\"zero_optimization\": {\"stage\": 3, \"cpu_offload\": true, "
        "\"offload_optimizer\": {\"device\": \"nvme\"}}}",
        "zero_optimization.cpu_offload: true is DeepSpeed's old spelling of "
        "zero_optimization.offload_optimizer.device = \"cpu\", and "
        "zero_optimization.offload_optimizer.device is \"nvme\"");
    bad("{\"zero_optimization\": {\"stage\": 3, \"cpu_offload_param\": true, "
        "\"offload_param\": {\"device\": \"none\"}}}", "cpu_offload_param: true is");
    bad("{\"aio\": {\"use_gds\": 1}}", "aio.use_gds: expected true or false, got an integer");
    /* Types and ranges. */
    bad("{\"zero_optimization\": {\"stage\": 4}}", "zero_optimization.stage: 4 is out of range [0, 3]");
    bad("{\"zero_optimization\": {\"stage\": \"three\"}}", "expected an integer, got a string");
    bad("{\"zero_optimization\": {\"sub_group_size\": 1.5}}", "expected an integer, got 1.5");
    bad("{\"zero_optimization\": {\"offload_param\": {\"device\": \"disk\"}}}",
        "'disk' is not one of none|cpu|nvme");
    bad("{\"optimizer\": {\"type\": \"SGD\"}}", "'SGD' is not one of Adam|AdamW");
    /* the bf16 master with stochastic rounding: named values, every
     * optimizer tier, bf16 or fp32 params */
    bad("{\"train\": {\"master_weights\": \"bf16\"}}",
        "train.master_weights: 'bf16' is not one of fp32|bf16_sr");
    bad("{\"fp16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2, "
        "\"offload_optimizer\": {\"device\": \"cpu\"}}, \"train\": {\"master_weights\": "
        "\"bf16_sr\"}}", "fp16.enabled is true");
    {
        zn_config c;
        ZT_EQ_INT(parse(&c, "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
                            "{\"device\": \"cpu\"}}, \"train\": {\"master_weights\": "
                            "\"bf16_sr\"}}"), 0);
        ZT_EQ_INT(c.train.master_weights, ZN_MASTER_BF16_SR);
        ZT_EQ_INT(parse(&c, "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": "
                            "{\"device\": \"nvme\", \"nvme_path\": \"/tmp\"}}, \"train\": "
                            "{\"master_weights\": \"bf16_sr\"}}"), 0);
        ZT_EQ_INT(c.train.master_weights, ZN_MASTER_BF16_SR);
        /* the optimizer on the device (zn_dev_adam_sr) */
        ZT_EQ_INT(parse(&c, "{\"train\": {\"master_weights\": \"bf16_sr\"}}"), 0);
        ZT_EQ_INT(c.train.master_weights, ZN_MASTER_BF16_SR);
        ZT_EQ_INT(parse(&c, "{}"), 0);
        ZT_EQ_INT(c.train.master_weights, ZN_MASTER_FP32);
    }
    bad("{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}", "expected [beta1, beta2]");
    bad("{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.5]}}}", "must be in [0, 1)");
    bad("{\"bf16\": {\"enabled\": 1}}", "expected true or false");
    bad("{\"tiers\": {\"gpu\": \"24GB!\"}}", "tiers.gpu: size '24GB!'");
    bad("{\"tiers\": {\"gpu\": -5}}", "must not be negative");
    bad("{\"tiers\": {\"nvme\": [{\"size\": \"1GiB\"}]}}", "tiers.nvme[0]: missing 'path'");
    bad("{\"tiers\": {\"nvme\": [{\"path\": \"/x\", \"speed\": 1}]}}", "unknown key 'speed'");
    bad("{\"tiers\": {\"param_cache\": 65}}", "tiers.param_cache: 65 is out of range [0, 64]");
    bad("{\"train_micro_batch_size_per_gpu\": 0}", "must be >= 1, or \"auto\"");
    bad("{\"aio\": {\"block_size\": 5000}}", "aio.block_size: 5000 is not a multiple of 4096");
    /* Cross-key rules. */
    bad("{\"bf16\": {\"enabled\": true}, \"fp16\": {\"enabled\": true}}", "choose one");
    bad("{\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"cpu\"}}}",
        "offload_param: needs zero_optimization.stage = 3");
    bad("{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\"}}}",
        "needs offload_optimizer.nvme_path or tiers.nvme");
    bad("{\"scheduler\": {\"type\": \"WarmupCosineLR\"}}", "total_num_steps: required");
    bad("{\"model\": {\"hidden_size\": 64, \"num_hidden_layers\": 2}}", "give either 'path'");
    bad("{\"model\": {\"hidden_size\": 60, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
        " \"intermediate_size\": 10, \"vocab_size\": 10}}", "not a multiple of num_attention_heads");
    bad("{\"train\": {\"checkpoint\": {\"every\": 5}}}", "train.checkpoint.dir is not");

    /* Batch arithmetic. */
    zn_config c;
    ZT_EQ_INT(parse(&c, "{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 3}"), 0);
    ZT_EQ_INT(zn_config_resolve_batch(&c, 1), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "not divisible");
    ZT_EQ_INT(parse(&c, "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 2,"
                        " \"gradient_accumulation_steps\": 2}"), 0);
    ZT_EQ_INT(zn_config_resolve_batch(&c, 1), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "train_batch_size (8) != ");
    ZT_EQ_INT(zn_config_resolve_batch(&c, 2), 0);
}

/* The deprecated spellings DeepSpeed still maps (zero/config.py's
 * deprecated fields): cpu_offload -> offload_optimizer.device "cpu",
 * cpu_offload_param -> offload_param.device "cpu",
 * cpu_offload_use_pin_memory -> both pin_memory. */
static void test_legacy_offload(void)
{
    zn_config c;
    ZT_EQ_INT(parse(&c, "{\"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true}}"), 0);
    ZT_EQ_INT(c.zero.offload_optimizer.device, ZN_OFFLOAD_CPU);
    ZT_EQ_INT(c.zero.offload_param.device, ZN_OFFLOAD_NONE);
    ZT_EQ_INT(zn_config_get_origin(&c, "zero_optimization.offload_optimizer.device"),
              ZN_ORIGIN_CONFIG);
    ZT_EQ_INT(parse(&c, "{\"zero_optimization\": {\"stage\": 3, \"cpu_offload\": true, "
                        "\"cpu_offload_param\": true, \"cpu_offload_use_pin_memory\": false}}"),
              0);
    ZT_EQ_INT(c.zero.offload_optimizer.device, ZN_OFFLOAD_CPU);
    ZT_EQ_INT(c.zero.offload_param.device, ZN_OFFLOAD_CPU);
    ZT_CHECK(!c.zero.offload_param.pin_memory && !c.zero.offload_optimizer.pin_memory);
    /* false changes nothing; the same device said twice is fine */
    ZT_EQ_INT(parse(&c, "{\"zero_optimization\": {\"stage\": 3, \"cpu_offload\": false}}"), 0);
    ZT_EQ_INT(c.zero.offload_optimizer.device, ZN_OFFLOAD_NONE);
    ZT_EQ_INT(parse(&c, "{\"zero_optimization\": {\"stage\": 3, \"cpu_offload\": true, "
                        "\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}, "
                        "\"cpu_offload_use_pin_memory\": false}}"),
              0);
    ZT_CHECK(c.zero.offload_optimizer.pin_memory); /* the modern key wins */
    /* the dump writes the keys they set, not the old spellings */
    char *dump = zn_config_dump(&c);
    ZT_CHECK_MSG(dump && !strstr(dump, "cpu_offload"), "dump: %s", dump ? dump : "(null)");
    free(dump);
}

static void test_overrides(void)
{
    zn_config c;
    const char *sets[] = { "zero_optimization.stage=3", "tiers.gpu=2GiB",
                           "optimizer.params.lr=0.5", "train.device=host",
                           "zero_optimization.offload_param.device=cpu" };
    int rc = zn_config_parse(&c, "{\"zero_optimization\": {\"stage\": 1}}", "t.json", sets, 5);
    ZT_CHECK_MSG(rc == 0, "overrides failed: %s", zn_last_error());
    ZT_EQ_INT(c.zero.stage, 3);
    ZT_EQ_U64(c.tiers.gpu, 2ull << 30);
    ZT_CHECK(c.optimizer.lr == 0.5);
    ZT_EQ_STR(c.train.device, "host");
    ZT_EQ_INT(c.zero.offload_param.device, ZN_OFFLOAD_CPU);
    const char *badset[] = { "zero_optimization.stage.x=1" };
    ZT_EQ_INT(zn_config_parse(&c, "{\"zero_optimization\": {\"stage\": 1}}", "t.json", badset, 1),
              ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "zero_optimization.stage: --set zero_optimization.stage.x=1: not an object");
    const char *noeq[] = { "tiers.gpu" };
    ZT_EQ_INT(zn_config_parse(&c, "{}", "t.json", noeq, 1), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "expected key.path=value");
    const char *typo[] = { "tiers.gpus=1GiB" };
    ZT_EQ_INT(zn_config_parse(&c, "{}", "t.json", typo, 1), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "tiers.gpus: unknown key (did you mean 'gpu'?)");
}

static void test_files(void)
{
    static const char *files[] = { "examples/tiny.json", "examples/a10-qwen2.5-7b.json",
                                   "examples/a10-qwen2.5-14b-nvme.json" };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", ZN_SOURCE_ROOT, files[i]);
        zn_config c;
        int rc = zn_config_load(&c, path, NULL, 0);
        ZT_CHECK_MSG(rc == 0, "%s: %s", files[i], zn_last_error());
        ZT_EQ_INT(zn_config_resolve_batch(&c, 1), 0);
    }
    zn_config c;
    ZT_EQ_INT(zn_config_load(&c, "/nonexistent/ds.json", NULL, 0), -ENOENT);
    ZT_CONTAINS(zn_last_error(), "/nonexistent/ds.json");
}

/* "auto" takes the HF Trainer integration's values (issue 16). */
static const char *hf_auto_json =
    "{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\","
    " \"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\","
    " \"fp16\": {\"enabled\": \"auto\"}, \"bf16\": {\"enabled\": \"auto\"},"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": \"auto\","
    "   \"eps\": \"auto\", \"weight_decay\": \"auto\"}},"
    " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": \"auto\","
    "   \"warmup_max_lr\": \"auto\", \"warmup_num_steps\": \"auto\", \"total_num_steps\": \"auto\"}},"
    " \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": \"auto\","
    "   \"stage3_prefetch_bucket_size\": \"auto\", \"param_persistence_threshold\": \"auto\","
    "   \"sub_group_size\": \"auto\", \"stage3_gather_16bit_weights_on_model_save\": \"auto\"},"
    " \"train\": {\"steps\": 300, \"learning_rate\": 2e-5, \"adam_beta1\": 0.8,"
    "   \"adam_beta2\": 0.95, \"adam_epsilon\": 1e-6, \"weight_decay\": 0.1,"
    "   \"max_grad_norm\": 0.5, \"warmup_steps\": 30, \"per_device_train_batch_size\": 4,"
    "   \"gradient_accumulation_steps\": 2}}";

static void test_auto(void)
{
    zn_config c;
    ZT_EQ_INT(parse(&c, hf_auto_json), 0);
    ZT_EQ_INT(c.n_warnings, 0);
    /* before the model is known the buckets keep DeepSpeed's defaults */
    ZT_EQ_INT(c.zero.reduce_bucket_size, 500000000);
    ZT_EQ_INT(zn_config_resolve_auto(&c, 4096, 1), 0);
    ZT_EQ_INT(c.zero.reduce_bucket_size, 4096LL * 4096);              /* hidden^2 */
    ZT_EQ_INT(c.zero.stage3_prefetch_bucket_size, 15099494);          /* int(0.9 * 4096^2) */
    ZT_EQ_INT(c.zero.stage3_param_persistence_threshold, 40960);      /* 10 hidden */
    ZT_EQ_INT(c.zero.sub_group_size, 1000000000);
    ZT_CHECK(c.bf16 && !c.fp16.enabled);
    ZT_CHECK(c.optimizer.lr == 2e-5 && c.optimizer.beta1 == 0.8 && c.optimizer.beta2 == 0.95);
    ZT_CHECK(c.optimizer.eps == 1e-6 && c.optimizer.weight_decay == 0.1);
    ZT_CHECK(c.gradient_clipping == 0.5);
    ZT_CHECK(c.scheduler.warmup_min_lr == 0.0 && c.scheduler.warmup_max_lr == 2e-5);
    ZT_EQ_INT(c.scheduler.warmup_num_steps, 30);
    ZT_EQ_INT(c.scheduler.total_num_steps, 300);
    ZT_EQ_INT(zn_config_resolve_batch(&c, 2), 0);
    ZT_EQ_INT(c.train_micro_batch_size_per_gpu, 4);
    ZT_EQ_INT(c.gradient_accumulation_steps, 2);
    ZT_EQ_INT(c.train_batch_size, 16);                                /* 4 x 2 x 2 ranks */
    /* a device that computes in fp32 gets fp32; train.steps changed later
     * (zinc train --steps) moves total_num_steps with it */
    c.train.steps = 50;
    ZT_EQ_INT(zn_config_resolve_auto(&c, 896, 0), 0);
    ZT_CHECK(!c.bf16 && !c.fp16.enabled);
    ZT_EQ_INT(c.zero.reduce_bucket_size, 802816);
    ZT_EQ_INT(c.zero.stage3_prefetch_bucket_size, 722534);            /* int(0.9 * 802816) */
    ZT_EQ_INT(c.scheduler.total_num_steps, 50);
    /* fp16 asked for explicitly: bf16 "auto" stays off */
    const char *fp = "{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": \"auto\"}}";
    ZT_EQ_INT(parse(&c, fp), 0);
    ZT_EQ_INT(zn_config_resolve_auto(&c, 64, 1), 0);
    ZT_CHECK(c.fp16.enabled && !c.bf16);
    /* "auto" where the HF integration fills nothing: DeepSpeed drops it and
     * the key keeps DeepSpeed's default (OpenRLHF's generated configs) */
    ZT_EQ_INT(parse(&c, "{\"zero_optimization\": {}}"), 0);
    int base_warnings = c.n_warnings;
    ZT_EQ_INT(parse(&c, "{\"zero_optimization\": {\"stage3_max_live_parameters\": \"auto\", "
                        "\"stage3_max_reuse_distance\": \"auto\"}}"), 0);
    ZT_EQ_INT(c.zero.stage3_max_live_parameters, 1000000000);
    ZT_EQ_INT(c.zero.stage3_max_reuse_distance, 1000000000);
    ZT_EQ_INT(c.n_warnings, base_warnings + 2);  /* each says it took the default */
    /* DeepSpeed's aliases and accepted keys */
    ZT_EQ_INT(parse(&c, "{\"bfloat16\": {\"enabled\": true}, \"zero_optimization\": {"
                        "\"max_live_parameters\": 0, \"max_reuse_distance\": 7, "
                        "\"gather_16bit_weights_on_model_save\": true, \"sub_group_size\": \"0\","
                        "\"round_robin_gradients\": true, \"memory_efficient_linear\": false},"
                        " \"hybrid_engine\": {\"enabled\": false, \"max_out_tokens\": 512},"
                        " \"tensorboard\": {\"enabled\": false, \"output_path\": \"x\"},"
                        " \"monitor_config\": {\"wandb\": {\"enabled\": false}},"
                        " \"comms_config\": {\"verbose\": false}, \"amp\": {\"enabled\": false},"
                        " \"compile\": {\"enabled\": false}, \"tensor_parallel\": {\"autotp_size\": 1},"
                        " \"checkpoint\": {\"load_universal\": false},"
                        " \"data_types\": {\"grad_accum_dtype\": \"fp32\"},"
                        " \"communication_data_type\": \"fp32\","
                        " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"torch_adam\": true}},"
                        " \"scheduler\": {\"type\": \"WarmupLR\"}}"), 0);
    ZT_CHECK(c.bf16);
    ZT_EQ_INT(c.zero.stage3_max_live_parameters, 0);
    ZT_EQ_INT(c.zero.stage3_max_reuse_distance, 7);
    ZT_EQ_INT(c.zero.sub_group_size, 1000000000);
    ZT_EQ_INT(c.n_warnings, 1); /* sub_group_size 0 */
    bad("{\"hybrid_engine\": {\"enabled\": true}}", "hybrid_engine is not implemented");
    /* DeepSpeed ignores a top-level monitor_config whatever it holds (its
     * monitors are the top-level sections), as LLaMA-Factory's configs have it */
    ZT_EQ_INT(parse(&c, "{\"monitor_config\": {\"enabled\": true, \"tag\": \"DeepSpeedMonitor\", "
                        "\"csv_monitor\": {\"enabled\": false}}}"), 0);
    /* comet as DeepSpeed's config names it: accepted off (on: test_tuning) */
    ZT_EQ_INT(parse(&c, "{\"comet\": {\"enabled\": false, \"project\": \"p\"}}"), 0);
    bad("{\"tensor_parallel\": {\"autotp_size\": 2}}", "autotp_size is not implemented");
    bad("{\"communication_data_type\": \"bf16\"}", "communication_data_type is not implemented");
}

/* Keys that change only diagnostics or speed, scheduled zinc's own way:
 * accepted at any value of their type, with one note saying what zinc does
 * instead; a key that changes the numbers or the memory is still refused. */
static void test_tuning(void)
{
    zn_config c;
    static char log[16384];
    char path[1024];
    /* LLaMA-Factory's partial-offload config with the flops profiler on */
    snprintf(path, sizeof path, "%s/tests/fixtures/ds-configs/"
             "llamafactory-ca7359c-ds_z3_partial_offload_config.json", ZN_SOURCE_ROOT);
    int rc = parse_caught(&c, NULL, path, log, sizeof log);
    ZT_CHECK_MSG(rc == 0, "partial offload with flops_profiler: %s", zn_last_error());
    ZT_EQ_INT(count_of(log, "flops_profiler: switched on (enabled) is accepted (it changes no "
                            "number of the training): DeepSpeed's flops profiler is not run; "
                            "zinc train prints the achieved TFLOP/s on each log line"), 1);
    ZT_EQ_INT(count_of(log, "is accepted"), 1);   /* comms_logger is off: nothing to say */
    ZT_EQ_INT(c.zero.offload_optimizer.device, ZN_OFFLOAD_CPU);
    ZT_CHECK(!c.zero.offload_optimizer.pin_memory);
    ZT_EQ_INT(c.n_warnings, 3);                   /* and no optimizer, no scheduler */

    /* ZeRO-3's module grouping (LLaMA-Factory's hparam sweep, E6) */
    snprintf(path, sizeof path, "%s/tests/fixtures/ds-configs/"
             "llamafactory-5851f9f-ds_z3_e6_modgran_16.json", ZN_SOURCE_ROOT);
    rc = parse_caught(&c, NULL, path, log, sizeof log);
    ZT_CHECK_MSG(rc == 0, "stage3_module_granularity_threshold 16: %s", zn_last_error());
    ZT_EQ_INT(count_of(log, "zero_optimization.stage3_module_granularity_threshold: 16 is "
                            "accepted (it changes no number of the training): ZeRO-3 fetches "
                            "modules smaller than it together"), 1);
    ZT_CHECK(c.bf16 && c.zero.stage == 3);
    ZT_EQ_INT(c.zero.stage3_prefetch_bucket_size, 200000000);
#define GRAN "{\"zero_optimization\": {\"stage3_module_granularity_threshold\": %s}}"
    char json[512];
    snprintf(json, sizeof json, GRAN, "0");       /* DeepSpeed's default: nothing to say */
    ZT_EQ_INT(parse_caught(&c, json, NULL, log, sizeof log), 0);
    ZT_EQ_INT(count_of(log, "granularity"), 0);
    snprintf(json, sizeof json, GRAN, "\"1e4\"");
    ZT_EQ_INT(parse_caught(&c, json, NULL, log, sizeof log), 0);
    ZT_EQ_INT(count_of(log, "stage3_module_granularity_threshold: 10000 is accepted"), 1);
    snprintf(json, sizeof json, GRAN, "-1");
    bad(json, "stage3_module_granularity_threshold: -1 is out of range (must be >= 0)");
    snprintf(json, sizeof json, GRAN, "1.5");
    bad(json, "stage3_module_granularity_threshold: expected an integer, got 1.5");
#undef GRAN

    /* every such key, each said once in the parse (and again in the next) */
    const char *all =
        "{\"flops_profiler\": {\"enabled\": true, \"detailed\": {\"enabled\": true}},"
        " \"comms_logger\": {\"enabled\": true, \"verbose\": true},"
        " \"wandb\": {\"enabled\": true, \"project\": \"p\"}, \"comet\": {\"enabled\": true},"
        " \"dump_state\": true, \"aio\": {\"use_gds\": true},"
        " \"zero_optimization\": {\"stage\": 3, \"allgather_partitions\": false,"
        "   \"stage3_module_granularity_threshold\": 16,"
        "   \"offload_optimizer\": {\"device\": \"cpu\", \"fast_init\": true,"
        "     \"cpuadam_cores_perc\": 0.9}}}";
    for (int pass = 0; pass < 2; pass++) {
        rc = parse_caught(&c, all, NULL, log, sizeof log);
        ZT_CHECK_MSG(rc == 0, "tuning keys: %s", zn_last_error());
        ZT_EQ_INT(count_of(log, "is accepted (it changes no number of the training)"), 10);
        ZT_EQ_INT(count_of(log, "flops_profiler: switched on (enabled) is accepted"), 1);
        ZT_EQ_INT(count_of(log, "comms_logger: switched on (enabled) is accepted"), 1);
        ZT_EQ_INT(count_of(log, "wandb: switched on (enabled) is accepted"), 1);
        ZT_EQ_INT(count_of(log, "wandb sync DIR"), 1);
        ZT_EQ_INT(count_of(log, "comet: switched on (enabled) is accepted"), 1);
        ZT_EQ_INT(count_of(log, "dump_state: true is accepted"), 1);
        ZT_EQ_INT(count_of(log, "aio.use_gds: true is accepted"), 1);
        ZT_EQ_INT(count_of(log, "zero_optimization.allgather_partitions: false is accepted"), 1);
        ZT_EQ_INT(count_of(log, "offload_optimizer.fast_init: true is accepted"), 1);
        ZT_EQ_INT(count_of(log, "offload_optimizer.cpuadam_cores_perc: 0.9 is accepted"), 1);
        ZT_EQ_INT(c.n_warnings, 12);              /* and no optimizer, no scheduler */
    }
    /* switched off, at DeepSpeed's defaults, null or "auto": nothing to say */
    rc = parse_caught(&c, "{\"flops_profiler\": {\"enabled\": false, \"profile_step\": 1},"
                          " \"comms_logger\": false, \"wandb\": {\"enabled\": false},"
                          " \"dump_state\": \"false\", \"aio\": {\"use_gds\": null},"
                          " \"zero_optimization\": {\"allgather_partitions\": true,"
                          "   \"offload_optimizer\": {\"fast_init\": \"auto\","
                          "     \"cpuadam_cores_perc\": 0.8}}}", NULL, log, sizeof log);
    ZT_CHECK_MSG(rc == 0, "tuning keys at their defaults: %s", zn_last_error());
    ZT_EQ_INT(count_of(log, "is accepted"), 0);
    ZT_EQ_INT(c.n_warnings, 2);
    /* their types still hold */
    bad("{\"flops_profiler\": 1}", "flops_profiler: expected an object, got an integer");
    bad("{\"zero_optimization\": {\"offload_optimizer\": {\"cpuadam_cores_perc\": 2}}}",
        "cpuadam_cores_perc: 2 is out of range [0, 1]");
    bad("{\"zero_optimization\": {\"allgather_partitions\": \"no\"}}",
        "allgather_partitions: expected true or false, got a string");

    /* a key that changes the numbers or the memory stays refused */
    bad("{\"zero_optimization\": {\"reduce_scatter\": false}}",
        "reduce_scatter is not implemented by zinc; only its default (true) is accepted");
    bad("{\"prescale_gradients\": true}", "prescale_gradients is not implemented by zinc");
    bad("{\"zero_optimization\": {\"zero_quantized_gradients\": true}}",
        "zero_quantized_gradients is not implemented by zinc");
    bad("{\"data_types\": {\"grad_accum_dtype\": \"bf16\"}}", "zinc accumulates gradients in fp32");
    bad("{\"zero_optimization\": {\"offload_optimizer\": {\"super_offload\": true}}}",
        "super_offload is not implemented by zinc");
    bad("{\"compile\": {\"enabled\": true}}", "compile is not implemented by zinc");
}

/* Every problem of a file in one run: five mistakes, five errors. */
static void test_all_errors(void)
{
    zn_config c;
    const char *five =
        "{\"zero_optimization\": {\"stage\": 4, \"offload_parm\": {\"device\": \"cpu\"}},"
        " \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": \"fast\"}},"
        " \"fp16\": {\"auto_cast\": true},"
        " \"prescale_gradients\": true}";
    ZT_EQ_INT(parse(&c, five), ZN_ECONFIG);
    const char *e = zn_last_error();
    ZT_CONTAINS(e, "t.json: 5 errors:");
    ZT_CONTAINS(e, "\n  zero_optimization.stage: 4 is out of range [0, 3]");
    ZT_CONTAINS(e, "\n  zero_optimization.offload_parm: unknown key (did you mean 'offload_param'?)");
    ZT_CONTAINS(e, "\n  optimizer.params.lr: expected a number or \"auto\", got a string");
    ZT_CONTAINS(e, "\n  fp16.auto_cast: DeepSpeed's auto_cast is not implemented");
    ZT_CONTAINS(e, "\n  prescale_gradients: DeepSpeed's prescale_gradients is not implemented");
    int lines = 0;
    for (const char *p = e; *p; p++)
        lines += *p == '\n';
    ZT_EQ_INT(lines, 5);
    /* the cross-key checks are collected too, after the key errors */
    ZT_EQ_INT(parse(&c, "{\"zero_optimization\": {\"stage\": 1, \"offload_param\": "
                        "{\"device\": \"cpu\"}}, \"bf16\": {\"enabled\": true}, "
                        "\"fp16\": {\"enabled\": true}, \"aio\": {\"block_size\": 5000}}"), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "3 errors");
    ZT_CONTAINS(zn_last_error(), "bf16.enabled: bf16.enabled and fp16.enabled are both true");
    ZT_CONTAINS(zn_last_error(), "aio.block_size: 5000 is not a multiple of 4096");
}

/* Where each value came from. */
static void test_origin(void)
{
    zn_config c;
    const char *sets[] = { "zero_optimization.reduce_bucket_size=1000",
                           "train.learning_rate=3e-5" };
    ZT_EQ_INT(zn_config_parse(&c, hf_auto_json, "t.json", sets, 2), 0);
    ZT_EQ_INT(zn_config_get_origin(&c, "optimizer.params.lr"), ZN_ORIGIN_AUTO);
    ZT_CHECK(c.optimizer.lr == 3e-5); /* "auto" follows the --set train value */
    ZT_EQ_INT(zn_config_get_origin(&c, "train.learning_rate"), ZN_ORIGIN_SET);
    ZT_EQ_INT(zn_config_get_origin(&c, "zero_optimization.reduce_bucket_size"), ZN_ORIGIN_SET);
    ZT_EQ_INT(c.zero.reduce_bucket_size, 1000);
    ZT_EQ_INT(zn_config_get_origin(&c, "zero_optimization.stage"), ZN_ORIGIN_CONFIG);
    ZT_EQ_INT(zn_config_get_origin(&c, "aio.block_size"), ZN_ORIGIN_DEFAULT);
    /* an alias reports its key's origin */
    ZT_EQ_INT(zn_config_get_origin(&c, "zero_optimization.stage3_param_persistence_threshold"),
              ZN_ORIGIN_AUTO);
    ZT_EQ_INT(zn_config_get_origin(&c, "train_batch_size"), ZN_ORIGIN_AUTO);
    ZT_EQ_STR(zn_config_origin_name(ZN_ORIGIN_SET), "--set");
    ZT_EQ_STR(zn_config_origin_name(ZN_ORIGIN_AUTO), "auto");
}

/* Batch keys whose product overflows int64 are refused, not wrapped (found
 * by fuzzing: micro 3 x accumulation 6148914691236517206 wrapped to a
 * train_batch_size of 2). */
static void test_batch_overflow(void)
{
    zn_config c;
    zn_config_default(&c);
    c.train_micro_batch_size_per_gpu = 3;
    c.gradient_accumulation_steps = 6148914691236517206LL;
    ZT_EQ_INT(zn_config_resolve_batch(&c, 1), ZN_ECONFIG);
    ZT_CHECK_MSG(strstr(zn_last_error(), "overflows"), "message: %s", zn_last_error());
    zn_config_default(&c);
    c.train_micro_batch_size_per_gpu = 1LL << 40;
    ZT_EQ_INT(zn_config_resolve_batch(&c, 1 << 24), ZN_ECONFIG);
    zn_config_default(&c);
    c.train_micro_batch_size_per_gpu = 4;
    c.gradient_accumulation_steps = 8;
    ZT_EQ_INT(zn_config_resolve_batch(&c, 3), 0);
    ZT_EQ_INT((int)c.train_batch_size, 96);
}

/* A PEFT adapter_config.json without target_modules (PEFT itself accepts
 * it): a named error, not a crash (found by fuzzing: json_kind(NULL)). */
static void test_lora_no_targets(void)
{
    unsigned t = 0;
    ZT_EQ_INT(zn_config_lora_targets(NULL, &t, "adapter_config.json"), ZN_ECONFIG);
    ZT_CHECK_MSG(strstr(zn_last_error(), "target_modules") || strstr(zn_last_error(), "missing"),
                 "message: %s", zn_last_error());
    /* and through the PEFT folder reader, as `--set lora.adapter=DIR` does */
    char dir[] = "/tmp/zn_peft_XXXXXX", path[64];
    if (!mkdtemp(dir))
        ZT_SETUP_FAIL("mkdtemp");
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        ZT_SETUP_FAIL("fopen %s", path);
    fputs("{\"r\": 2, \"lora_alpha\": 4}", f);
    fclose(f);
    zn_lora l;
    int rc = zn_lora_read_peft_config(dir, &l);
    ZT_CHECK_MSG(rc == ZN_ECONFIG && strstr(zn_last_error(), "adapter_config.json"),
                 "adapter without target_modules: %d %s", rc, zn_last_error());
    unlink(path);
    rmdir(dir);
}

/* No scheduler section: a config that gives the optimizer its own lr is
 * DeepSpeed's own, and DeepSpeed runs it at a constant lr; where the lr is
 * "auto" (or no optimizer is given) the HF Trainer's linear decay applies. */
static void test_no_scheduler(void)
{
    zn_config c;
    ZT_EQ_INT(zn_config_parse(&c, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4}}}",
                              "ds", NULL, 0), 0);
    ZT_EQ_INT(zn_config_resolve_auto(&c, 64, 0), 0);
    ZT_CHECK_MSG(c.scheduler.type == ZN_SCHED_NONE && !c.scheduler_from_train,
                 "DeepSpeed's own config: scheduler %d", (int)c.scheduler.type);
    ZT_EQ_INT(zn_config_parse(&c, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}}}",
                              "hf", NULL, 0), 0);
    ZT_EQ_INT(zn_config_resolve_auto(&c, 64, 0), 0);
    ZT_CHECK_MSG(c.scheduler.type == ZN_SCHED_HF_LINEAR && c.scheduler_from_train,
                 "an HF Trainer config: scheduler %d", (int)c.scheduler.type);
}

/* The families described by model.* keys alone (no folder): the dims and
 * the parameter count equal those of the same shape's config.json read by
 * zn_model_dims_from_hf, the keys a config does not set take the family's
 * HF default, and a key of another family is refused by name. */
static void from_keys(zn_model_dims *d, const char *model, int want_rc)
{
    char json[2048];
    snprintf(json, sizeof json, "{\"model\": {%s}}", model);
    zn_config c;
    int rc = zn_config_parse(&c, json, "keys.json", NULL, 0);
    ZT_CHECK_MSG(rc == 0, "%s: %s", json, zn_last_error());
    rc = zn_run_model_dims(&c, d);
    ZT_CHECK_MSG(rc == want_rc, "%s: rc %d (want %d): %s", json, rc, want_rc,
                 rc ? zn_last_error() : "");
}

static void from_folder(zn_model_dims *d, const char *config_json)
{
    char dir[] = "/tmp/zn_keys_XXXXXX", path[64];
    if (!mkdtemp(dir))
        ZT_SETUP_FAIL("mkdtemp");
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        ZT_SETUP_FAIL("fopen %s", path);
    fputs(config_json, f);
    fclose(f);
    int rc = zn_model_dims_from_hf(d, dir);
    ZT_CHECK_MSG(rc == 0, "%s: %s", config_json, zn_last_error());
    unlink(path);
    rmdir(dir);
}

#define SHAPE "\"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, " \
              "\"num_key_value_heads\": 2, \"intermediate_size\": 128, \"vocab_size\": 320"
static void test_model_keys(void)
{
    zn_model_dims a, b;
    /* qwen3_moe: 4 experts, 2 a token, 32 wide, every second layer sparse.
     * By hand: embedding 320 x 64 = 20480, head 20480 + the norm 64; a
     * layer's norms 128, q/k/v/o 12288, q/k norm 32, a dense MLP 24576, a
     * sparse one 4 x (64 + 3 x 64 x 32) = 24832: 189632 */
    const char *moe = "\"model_type\": \"qwen3_moe\", " SHAPE ", \"head_dim\": 16, "
                      "\"num_experts\": 4, \"num_experts_per_tok\": 2, "
                      "\"moe_intermediate_size\": 32, \"decoder_sparse_step\": 2, "
                      "\"norm_topk_prob\": true";
    char hf[2048];
    from_keys(&a, moe, 0);
    snprintf(hf, sizeof hf, "{%s}", moe);
    from_folder(&b, hf);
    ZT_EQ_U64(zn_model_param_count(&a), 189632);
    ZT_EQ_U64(zn_model_param_count(&a), zn_model_param_count(&b));
    ZT_CHECK(a.arch == ZN_ARCH_QWEN3_MOE && a.n_experts == 4 && a.top_k == 2 &&
             a.moe_intermediate == 32 && a.sparse_step == 2 && a.norm_topk && a.qk_norm == 1);
    ZT_CHECK(!zn_model_layer_moe(&a, 0) && zn_model_layer_moe(&a, 1));
    /* unset: Qwen3MoeConfig's max_position_embeddings, rms_norm_eps,
     * rope_theta, aux loss, as the folder without them */
    ZT_CHECK(a.max_pos == b.max_pos && a.rms_eps == b.rms_eps && a.rope_theta == b.rope_theta &&
             a.router_aux_coef == 0.001 && !a.router_logits && !a.tie_embeddings);

    /* gemma2: head_dim 256, tied, 50 / 30 soft-caps, 8192 positions, one
     * full layer in two by Gemma2Config's defaults. By hand: embedding
     * 20480, head the norm 64, a layer's four norms 256, q/k/v/o 196608,
     * MLP 24576: 906304 */
    const char *g2 = "\"model_type\": \"gemma2\", " SHAPE ", \"sliding_window\": 16";
    from_keys(&a, g2, 0);
    snprintf(hf, sizeof hf, "{%s}", g2);
    from_folder(&b, hf);
    ZT_EQ_U64(zn_model_param_count(&a), 906304);
    ZT_EQ_U64(zn_model_param_count(&a), zn_model_param_count(&b));
    ZT_CHECK(a.head_dim == 256 && a.tie_embeddings && a.attn_scalar == 256 &&
             a.attn_softcap == 50 && a.final_softcap == 30 && a.max_pos == 8192 &&
             a.sliding_window == 16 && a.full_every == 2);
    ZT_CHECK(zn_model_layer_slides(&a, 0) && !zn_model_layer_slides(&a, 1));
    /* a soft-cap of 0 is config.json's null: none */
    from_keys(&a, "\"model_type\": \"gemma2\", " SHAPE ", \"attn_logit_softcapping\": 0, "
                  "\"query_pre_attn_scalar\": 64", 0);
    ZT_CHECK(a.attn_softcap == 0 && a.final_softcap == 30 && a.attn_scalar == 64);

    /* the other three by their defaults; gemma3_text's pattern and local
     * base, mixtral's num_local_experts */
    from_keys(&a, "\"model_type\": \"gemma3_text\", " SHAPE ", \"sliding_window_pattern\": 2, "
                  "\"rope_local_base_freq\": 20000", 0);
    ZT_CHECK(a.arch == ZN_ARCH_GEMMA3 && a.full_every == 2 && a.rope_local_theta == 20000 &&
             a.rope_theta == 1000000.0 && a.qk_norm == 1);
    from_keys(&a, "\"model_type\": \"olmo3\", " SHAPE, 0);
    ZT_CHECK(a.arch == ZN_ARCH_OLMO3 && a.full_every == 4 && a.sliding_window == 4096 &&
             a.rope_theta == 500000.0);
    from_keys(&a, "\"model_type\": \"mixtral\", " SHAPE ", \"num_experts\": 4", 0);
    ZT_CHECK(a.arch == ZN_ARCH_MIXTRAL && a.n_experts == 4 && a.top_k == 2 &&
             a.moe_intermediate == 128 && a.max_pos == 131072);

    /* an unset head_dim is the family's HF default: qwen3_moe's 128 whatever
     * hidden / heads is (here 64 / 3, no whole number) */
    from_keys(&a, "\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, "
                  "\"num_hidden_layers\": 2, \"num_attention_heads\": 3, "
                  "\"intermediate_size\": 128, \"vocab_size\": 320, \"num_experts\": 2, "
                  "\"num_experts_per_tok\": 1", 0);
    ZT_CHECK(a.head_dim == 128 && a.n_heads == 3 && a.n_kv_heads == 3);

    /* a key another family reads is refused, not ignored */
    from_keys(&a, "\"model_type\": \"gemma2\", " SHAPE ", \"num_experts\": 4", ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "model.num_experts is not a key of model_type gemma2");
    from_keys(&a, "\"model_type\": \"mixtral\", " SHAPE ", \"moe_intermediate_size\": 32",
              ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "model.moe_intermediate_size is not a key of model_type mixtral");
    from_keys(&a, "\"model_type\": \"llama\", " SHAPE ", \"query_pre_attn_scalar\": 64",
              ZN_EUNSUPPORTED);
    ZT_CONTAINS(zn_last_error(), "query_pre_attn_scalar");
    /* and the family's parser names what is wrong, under the config's name */
    from_keys(&a, "\"model_type\": \"qwen3_moe\", " SHAPE ", \"num_experts\": 2, "
                  "\"num_experts_per_tok\": 4", ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "keys.json: model: num_experts_per_tok 4 is more than num_experts 2");
    /* the dump of a config recorded by a checkpoint leaves the keys it did
     * not set unset: parsed again it is the same model (gemma3_text's
     * rope_theta its HF default, not zinc's 10000 of the other families) */
    {
        zn_config c, c2;
        ZT_EQ_INT(zn_config_parse(&c, "{\"model\": {\"model_type\": \"gemma3_text\", " SHAPE
                                  ", \"sliding_window\": 32}}", "keys.json", NULL, 0), 0);
        ZT_EQ_INT(zn_config_resolve_batch(&c, 1), 0);
        char *text = zn_config_dump(&c);
        ZT_CHECK(text != NULL);
        ZT_EQ_INT(zn_config_parse(&c2, text ? text : "{}", "dump", NULL, 0), 0);
        free(text);
        ZT_EQ_INT(zn_run_model_dims(&c2, &b), 0);
        ZT_EQ_INT(zn_run_model_dims(&c, &a), 0);
        ZT_CHECK(b.rope_theta == 1000000.0 && b.max_pos == a.max_pos && b.sliding_window == 32 &&
                 zn_model_param_count(&a) == zn_model_param_count(&b));
        /* and a dimension-given llama's dump still parses to the same dims */
        ZT_EQ_INT(zn_config_parse(&c, "{\"model\": {\"model_type\": \"llama\", " SHAPE
                                  ", \"rope_theta\": 500000}}", "keys.json", NULL, 0), 0);
        ZT_EQ_INT(zn_config_resolve_batch(&c, 1), 0);
        text = zn_config_dump(&c);
        ZT_EQ_INT(zn_config_parse(&c2, text ? text : "{}", "dump", NULL, 0), 0);
        free(text);
        ZT_EQ_INT(zn_run_model_dims(&c2, &b), 0);
        ZT_EQ_INT(zn_run_model_dims(&c, &a), 0);
        ZT_CHECK(b.rope_theta == 500000.0 && b.max_pos == a.max_pos && b.rms_eps == a.rms_eps &&
                 zn_model_param_count(&a) == zn_model_param_count(&b));
    }
    /* mistral's window, as its config.json gives it */
    from_keys(&a, "\"model_type\": \"mistral\", " SHAPE ", \"sliding_window\": 64", 0);
    ZT_CHECK(a.arch == ZN_ARCH_MISTRAL && a.sliding_window == 64);
}
#undef SHAPE

int main(void)
{
    test_model_keys();
    test_batch_overflow();
    test_no_scheduler();
    test_lora_no_targets();
    test_defaults();
    test_good();
    test_bad();
    test_legacy_offload();
    test_overrides();
    test_files();
    test_auto();
    test_tuning();
    test_all_errors();
    test_origin();
    return zt_done();
}
