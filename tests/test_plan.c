/* The planner: byte figures computed by hand for a small model, the
 * not-fits explanation, ZeRO sharding, and the parameter counts of real
 * models (published figures) from the config's model section. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/config.h"
#include "zinc/model.h"
#include "zinc/plan.h"
#include "zinc/train.h"
#include "zinc/run.h"
#include "zt.h"

static const uint64_t blocks[] = { 100, 1000, 1000, 100 };

/* zn_plan_compute on the spec the door makes of config c, input in and
 * budgets b */
static int plan_of(zn_plan *p, const zn_config *c, const zn_plan_input *in,
                   const zn_plan_budgets *b)
{
    static zn_spec sp;
    int rc = zn_run_spec(c, in, b, &sp);
    return rc ? rc : zn_plan_compute(p, &sp);
}

static zn_plan_input small_input(int world)
{
    zn_plan_input in = {
        .n_blocks = 4, .block_params = blocks, .persistent_params = 10,
        .n_layers = 2, .hidden = 8, .n_heads = 2, .n_kv_heads = 2, .head_dim = 4,
        .intermediate = 16, .vocab = 100, .micro_batch = 1, .seq_len = 4,
        .param_bytes = 2, .world_size = world, .activation_checkpointing = true,
    };
    return in;
}

static void small_config(zn_config *c)
{
    const char *json =
        "{\"zero_optimization\": {\"stage\": 3,"
        "  \"offload_param\": {\"device\": \"cpu\"},"
        "  \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/x\"}}}";
    if (zn_config_parse(c, json, "small", NULL, 0))
        ZT_SETUP_FAIL("config: %s", zn_last_error());
}

static void test_hand_computed(void)
{
    zn_config c;
    small_config(&c);
    zn_plan_input in = small_input(1);
    zn_plan_budgets b = { { 17668, 47580, 35200 } };
    zn_plan p;
    int rc = plan_of(&p, &c, &in, &b);
    ZT_CHECK_MSG(rc == 0, "plan: %s", zn_last_error());
    ZT_EQ_U64(p.params_total, 2200);
    ZT_EQ_U64(p.bytes[ZN_STATE_PARAMS][ZN_TIER_GPU], 20);       /* 10 persistent x 2 B */
    ZT_EQ_U64(p.bytes[ZN_STATE_PARAMS][ZN_TIER_CPU], 4380);     /* 2190 x 2 B */
    ZT_EQ_U64(p.bytes[ZN_STATE_MASTER][ZN_TIER_NVME], 8800);    /* 2200 x 4 B */
    ZT_EQ_U64(p.bytes[ZN_STATE_ADAM_M][ZN_TIER_NVME], 8800);
    ZT_EQ_U64(p.bytes[ZN_STATE_ADAM_V][ZN_TIER_NVME], 8800);
    ZT_EQ_U64(p.bytes[ZN_STATE_GRADS][ZN_TIER_NVME], 8800);
    ZT_EQ_U64(p.bytes[ZN_STATE_ACT_CKPT][ZN_TIER_GPU], 128);    /* 2 layers x 4 tok x 8 x 2 B */
    /* window 2200 x 2 + 2 fp32 block grads 2 x 1000 x 4 + layer work 1920 + logits
     * chunk 3200 */
    ZT_EQ_U64(p.bytes[ZN_STATE_WORK][ZN_TIER_GPU], 4400 + 8000 + 5120);
    /* buffer_count x sub-group + 2 x the largest block's fp32 grad staging */
    ZT_EQ_U64(p.bytes[ZN_STATE_WORK][ZN_TIER_CPU], 4 * 2200 * 4 + 2 * 1000 * 4);
    ZT_EQ_U64(p.tier_total[ZN_TIER_GPU], 17668);
    ZT_EQ_U64(p.tier_total[ZN_TIER_CPU], 47580);
    ZT_EQ_U64(p.tier_total[ZN_TIER_NVME], 35200);
    ZT_CHECK(p.fits);

    /* One byte short on the GPU: refused, with the amount and the fix. */
    b.bytes[ZN_TIER_GPU] = 17667;
    rc = plan_of(&p, &c, &in, &b);
    ZT_EQ_INT(rc, ZN_ENOFIT);
    ZT_CHECK(!p.fits);
    ZT_CONTAINS(p.why, "gpu tier needs 17.25 KiB");
    ZT_CONTAINS(p.why, "short by 1 B");
    ZT_CONTAINS(p.why, "lower train_micro_batch_size_per_gpu or data.seq_len");
    ZT_CONTAINS(zn_last_error(), "short by 1 B");

    /* CPU short with the optimizer on the CPU: suggests NVMe with the figure. */
    const char *sets[] = { "zero_optimization.offload_optimizer.device=cpu" };
    if (zn_config_parse(&c, "{\"zero_optimization\": {\"stage\": 3, \"offload_param\":"
                            " {\"device\": \"cpu\"}}}", "small", sets, 1))
        ZT_SETUP_FAIL("config: %s", zn_last_error());
    zn_plan_budgets b2 = { { 1 << 20, 1000, 0 } };
    rc = plan_of(&p, &c, &in, &b2);
    ZT_EQ_INT(rc, ZN_ENOFIT);
    ZT_CONTAINS(p.why, "cpu tier needs");
    ZT_CONTAINS(p.why, "offload_optimizer.device=nvme needs 34.38 KiB on nvme; tiers.nvme has 0 B");
}

/* The cpu tier short with fp32 moments in it: the advice says what 8-bit
 * moments (train.optim=adamw_bnb_8bit) save, the plan of that config's own
 * figure, and whether that alone fits; first when it does, after the NVMe
 * offload when it does not. A LoRA run's moments are too few to say it. */
static void test_q8_advice(void)
{
    zn_config c32, c8;
    zn_plan p, p8;
    const char *json = "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": "
                       "{\"device\": \"cpu\"}, \"offload_optimizer\": {\"device\": \"cpu\"}}}";
    const char *q8[] = { "train.optim=adamw_bnb_8bit" };
    if (zn_config_parse(&c32, json, "fp32", NULL, 0) || zn_config_parse(&c8, json, "q8", q8, 1))
        ZT_SETUP_FAIL("config: %s", zn_last_error());
    zn_plan_input in = small_input(1);
    zn_plan_budgets b = { { 1 << 20, 1 << 20, 0 } };
    ZT_EQ_INT(plan_of(&p, &c32, &in, &b), 0);
    ZT_EQ_INT(plan_of(&p8, &c8, &in, &b), 0);
    ZT_EQ_INT(p.moment_bytes, 4);
    ZT_EQ_INT(p8.moment_bytes, 1);
    uint64_t T = p.tier_total[ZN_TIER_CPU], T8 = p8.tier_total[ZN_TIER_CPU];
    /* 2200 elements: m and v 8800 B each in fp32; in 8 bits 2240 (padded to
     * 64) + 9 absmax x 4 = 2276 each */
    ZT_EQ_U64(T - T8, 2 * 8800 - 2 * 2276);
    char save[32], need8[32], want[256];
    zn_format_size(T - T8, save, sizeof save);
    zn_format_size(T8, need8, sizeof need8);

    /* short by exactly what 8 bits save: that alone fits, and comes first */
    b.bytes[ZN_TIER_CPU] = T8;
    ZT_EQ_INT(plan_of(&p, &c32, &in, &b), ZN_ENOFIT);
    snprintf(want, sizeof want, "saves %s and alone fits (the cpu tier then needs %s); or "
             "zero_optimization.offload_optimizer.device=nvme needs", save, need8);
    ZT_CONTAINS(p.why, want);
    ZT_CONTAINS(p.why, "train.optim=adamw_bnb_8bit keeps Adam's m and v in 8 bits");
    ZT_EQ_INT(plan_of(&p8, &c8, &in, &b), 0);

    /* a byte more short: the NVMe offload first, then what 8 bits save */
    b.bytes[ZN_TIER_CPU] = T8 - 1;
    ZT_EQ_INT(plan_of(&p, &c32, &in, &b), ZN_ENOFIT);
    snprintf(want, sizeof want, "tiers.nvme has 0 B; train.optim=adamw_bnb_8bit keeps Adam's m "
             "and v in 8 bits (4.45 KiB instead of 17.19 KiB) and saves %s, not enough alone "
             "(short by 1 B even so)", save);
    ZT_CONTAINS(p.why, want);
    ZT_CHECK_MSG(strstr(p.why, "offload_optimizer.device=nvme") < strstr(p.why, "adamw_bnb_8bit"),
                 "the NVMe offload is not first: %s", p.why);
    ZT_EQ_INT(plan_of(&p8, &c8, &in, &b), ZN_ENOFIT);

    /* 8-bit moments already: nothing more to say about them */
    b.bytes[ZN_TIER_CPU] = T8 - 1;
    ZT_EQ_INT(plan_of(&p8, &c8, &in, &b), ZN_ENOFIT);
    ZT_CHECK_MSG(!strstr(p8.why, "adamw_bnb_8bit"), "advice for 8-bit moments: %s", p8.why);

    /* LoRA: 20 trainable elements, their moments 160 B of a tier of kilobytes
     * of frozen params: not worth saying, even where it would make it fit */
    in.trainable_params = 20;
    b.bytes[ZN_TIER_CPU] = 1 << 20;
    ZT_EQ_INT(plan_of(&p, &c32, &in, &b), 0);
    b.bytes[ZN_TIER_CPU] = p.tier_total[ZN_TIER_CPU] - 1;
    ZT_EQ_INT(plan_of(&p, &c32, &in, &b), ZN_ENOFIT);
    ZT_CONTAINS(p.why, "offload_optimizer.device=nvme needs");
    ZT_CHECK_MSG(!strstr(p.why, "adamw_bnb_8bit"), "LoRA: 8-bit advice for %llu B of moments: %s",
                 (unsigned long long)(p.bytes[ZN_STATE_ADAM_M][ZN_TIER_CPU] +
                                      p.bytes[ZN_STATE_ADAM_V][ZN_TIER_CPU]), p.why);
}

/* Adam's state on NVMe: 8-bit moments are swapped at their size (the NVMe
 * tier and the pinned staging shrink with them); an NVMe tier short with
 * fp32 moments on it is told what 8-bit ones save, first when that alone
 * fits. */
/* The speculative step's second copy of the NVMe optimizer states: auto
 * takes it when the nvme tier has room for it, true counts it whatever
 * the room (and a short plan names the way out), false never. */
static void test_spec_nvme(void)
{
    const char *json = "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\":"
                       " \"cpu\"}, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\":"
                       " \"/x\"}}}";
    const char *sets[3][2] = { { "tiers.grads=nvme", "train.speculative_step=auto" },
                               { "tiers.grads=nvme", "train.speculative_step=true" },
                               { "tiers.grads=nvme", "train.speculative_step=false" } };
    zn_config c[3];
    for (int i = 0; i < 3; i++)
        if (zn_config_parse(&c[i], json, "spec", sets[i], 2))
            ZT_SETUP_FAIL("config: %s", zn_last_error());
    zn_plan_input in = small_input(1);
    zn_plan_budgets b = { { 1 << 20, 1 << 20, 1 << 20 } };
    zn_plan p[3];
    for (int i = 0; i < 3; i++)
        ZT_EQ_INT(plan_of(&p[i], &c[i], &in, &b), 0);
    /* 2200 elements: master, m, v 8800 B each, once more for the copy */
    ZT_EQ_U64(p[0].spec_shadow, 3 * 8800);
    ZT_EQ_U64(p[1].spec_shadow, 3 * 8800);
    ZT_EQ_U64(p[2].spec_shadow, 0);
    ZT_EQ_U64(p[0].tier_total[ZN_TIER_NVME], p[2].tier_total[ZN_TIER_NVME] + 3 * 8800);
    ZT_EQ_U64(p[0].bytes[ZN_STATE_WORK][ZN_TIER_NVME], 3 * 8800);
    /* what a step writes is one copy */
    ZT_EQ_U64(p[0].nvme_write_step, p[2].nvme_write_step);
    /* auto keeps room for the states once more beside the copy: one byte
     * short of that, it goes without the copy and says so */
    b.bytes[ZN_TIER_NVME] = p[2].tier_total[ZN_TIER_NVME] + 2 * 3 * 8800;
    ZT_EQ_INT(plan_of(&p[0], &c[0], &in, &b), 0);
    ZT_EQ_U64(p[0].spec_shadow, 3 * 8800);
    b.bytes[ZN_TIER_NVME]--;
    ZT_EQ_INT(plan_of(&p[0], &c[0], &in, &b), 0);
    ZT_EQ_U64(p[0].spec_shadow, 0);
    ZT_EQ_U64(p[0].spec_declined, 3 * 8800);
    /* room for the states but not the copy: true is short and says what
     * to turn off */
    b.bytes[ZN_TIER_NVME] = p[2].tier_total[ZN_TIER_NVME];
    ZT_EQ_INT(plan_of(&p[1], &c[1], &in, &b), ZN_ENOFIT);
    ZT_CONTAINS(p[1].why, "train.speculative_step=false");
    /* the states in pinned RAM: no copy */
    const char *cpu = "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": "
                      "{\"device\": \"cpu\"}}}";
    zn_config cc;
    const char *on[] = { "train.speculative_step=true" };
    if (zn_config_parse(&cc, cpu, "cpu", on, 1))
        ZT_SETUP_FAIL("config: %s", zn_last_error());
    b.bytes[ZN_TIER_NVME] = 1 << 20;
    ZT_EQ_INT(plan_of(&p[0], &cc, &in, &b), 0);
    ZT_EQ_U64(p[0].spec_shadow, 0);
}

static void test_q8_nvme(void)
{
    zn_config c32, c8;
    zn_plan p, p8;
    const char *json = "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\":"
                       " \"cpu\"}, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\":"
                       " \"/x\"}}}";
    /* (without the speculative step's second copy, test_spec_nvme's) */
    const char *f32[] = { "tiers.grads=nvme", "train.speculative_step=false" };
    const char *q8[] = { "tiers.grads=nvme", "train.optim=adamw_bnb_8bit",
                         "train.speculative_step=false" };
    if (zn_config_parse(&c32, json, "fp32", f32, 2) || zn_config_parse(&c8, json, "q8", q8, 3))
        ZT_SETUP_FAIL("config: %s", zn_last_error());
    zn_plan_input in = small_input(1);
    zn_plan_budgets b = { { 1 << 20, 1 << 20, 1 << 20 } };
    ZT_EQ_INT(plan_of(&p, &c32, &in, &b), 0);
    ZT_EQ_INT(plan_of(&p8, &c8, &in, &b), 0);
    /* 2200 elements: master and grads 8800 B each, m and v 2276 B each in
     * 8 bits (2240 padded codes + 9 absmax) instead of 8800 */
    ZT_EQ_U64(p.tier_total[ZN_TIER_NVME], 4 * 8800);
    ZT_EQ_U64(p8.tier_total[ZN_TIER_NVME], 2 * 8800 + 2 * 2276);
    ZT_EQ_U64(p8.bytes[ZN_STATE_ADAM_M][ZN_TIER_NVME], 2276);
    /* the staging: buffer_count 4 x the sub-group (2200) fp32, a quarter
     * of it in flight as master, m, v, grads: the moments at their size */
    ZT_EQ_U64(p.bytes[ZN_STATE_WORK][ZN_TIER_CPU] - p8.bytes[ZN_STATE_WORK][ZN_TIER_CPU],
              4 * 2200 * 4 - (8 * 2200 + 2 * 2276));
    /* what a step writes: the moments at their size */
    ZT_EQ_U64(p.nvme_write_part[0] - p8.nvme_write_part[0], 2 * (8800 - 2276));

    char want[160];
    b.bytes[ZN_TIER_NVME] = p8.tier_total[ZN_TIER_NVME];
    ZT_EQ_INT(plan_of(&p, &c32, &in, &b), ZN_ENOFIT);
    ZT_CONTAINS(p.why, "nvme tier needs");
    ZT_CONTAINS(p.why, "train.optim=adamw_bnb_8bit keeps Adam's m and v in 8 bits");
    snprintf(want, sizeof want, "alone fits (the nvme tier then needs about %s); or give "
             "tiers.nvme more space", zn_format_size(p8.tier_total[ZN_TIER_NVME],
                                                     (char[32]){ 0 }, 32));
    ZT_CONTAINS(p.why, want);
    ZT_EQ_INT(plan_of(&p8, &c8, &in, &b), 0);
    b.bytes[ZN_TIER_NVME]--;
    ZT_EQ_INT(plan_of(&p, &c32, &in, &b), ZN_ENOFIT);
    ZT_CONTAINS(p.why, "or move state to the cpu tier; train.optim=adamw_bnb_8bit");
    ZT_CONTAINS(p.why, "not enough alone (short by 1 B even so)");
}

/* tiers.grads: with the states on NVMe, the gradients stay in pinned RAM
 * when the cpu tier has room after everything else (auto), or go where
 * they are told. */
static void test_grads_tier(void)
{
    zn_config c;
    zn_plan p;
    zn_plan_input in = small_input(1);
    zn_plan_budgets roomy = { { 17668, 1 << 20, 35200 } };
    zn_plan_budgets tight = { { 17668, 47580, 35200 } };  /* test_hand_computed's */
    small_config(&c);
    ZT_EQ_INT(plan_of(&p, &c, &in, &roomy), 0);
    ZT_EQ_INT(p.grads_tier, ZN_TIER_CPU);
    ZT_EQ_U64(p.bytes[ZN_STATE_GRADS][ZN_TIER_CPU], 8800);
    ZT_EQ_U64(p.bytes[ZN_STATE_GRADS][ZN_TIER_NVME], 0);
    ZT_EQ_U64(p.tier_total[ZN_TIER_NVME], 3 * 8800);
    ZT_EQ_INT(plan_of(&p, &c, &in, &tight), 0);  /* no room: with the states */
    ZT_EQ_INT(p.grads_tier, ZN_TIER_NVME);
    ZT_EQ_U64(p.bytes[ZN_STATE_GRADS][ZN_TIER_NVME], 8800);

    const char *json = "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\":"
                       " \"cpu\"}, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\":"
                       " \"/x\"}}}";
    const char *to_nvme[] = { "tiers.grads=nvme" }, *to_cpu[] = { "tiers.grads=cpu" };
    ZT_EQ_INT(zn_config_parse(&c, json, "g", to_nvme, 1), 0);
    ZT_EQ_INT(plan_of(&p, &c, &in, &roomy), 0);
    ZT_EQ_INT(p.grads_tier, ZN_TIER_NVME);
    ZT_EQ_INT(zn_config_parse(&c, json, "g", to_cpu, 1), 0);
    ZT_EQ_INT(plan_of(&p, &c, &in, &tight), ZN_ENOFIT);
    ZT_CONTAINS(p.why, "cpu tier needs");

    /* gradients on NVMe without the states there is refused */
    const char *bad[] = { "tiers.grads=nvme", "zero_optimization.offload_optimizer.device=cpu" };
    ZT_EQ_INT(zn_config_parse(&c, json, "g", bad, 2), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "tiers.grads");
}

/* Params on NVMe: the pinned staging (offload_param.buffer_count, default 5)
 * and the param cache (tiers.param_cache blocks, default 4) count in the cpu
 * tier; the cache only where the step is pipelined (one rank, or stage 3). */
static void test_param_cache(void)
{
    zn_config c;
    zn_plan p;
    zn_plan_input in = small_input(1);
    zn_plan_budgets b = { { 1 << 20, 1 << 20, 1 << 20 } };
    const char *json = "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\":"
                       " \"nvme\", \"nvme_path\": \"/x\", \"max_in_cpu\": 0},"
                       " \"offload_optimizer\": {\"device\": \"cpu\"}}}";
    ZT_EQ_INT(zn_config_parse(&c, json, "pc", NULL, 0), 0);
    ZT_EQ_INT(plan_of(&p, &c, &in, &b), 0);
    uint64_t stage = 5 * 1000 * 2, grads = 2 * 1000 * 4;
    ZT_EQ_U64(p.bytes[ZN_STATE_WORK][ZN_TIER_CPU], stage + 4 * 1000 * 2 + grads);
    const char *off[] = { "tiers.param_cache=0" };
    ZT_EQ_INT(zn_config_parse(&c, json, "pc", off, 1), 0);
    ZT_EQ_INT(plan_of(&p, &c, &in, &b), 0);
    ZT_EQ_U64(p.bytes[ZN_STATE_WORK][ZN_TIER_CPU], stage + grads);
    /* two ranks at stage 3: one shard of the largest block per buffer */
    ZT_EQ_INT(zn_config_parse(&c, json, "pc", NULL, 0), 0);
    in = small_input(2);
    ZT_EQ_INT(plan_of(&p, &c, &in, &b), 0);
    ZT_EQ_U64(p.bytes[ZN_STATE_WORK][ZN_TIER_CPU], stage + 4 * 500 * 2 + 2 * 500 * 4);
}

static void test_sharded(void)
{
    zn_config c;
    small_config(&c);
    zn_plan_input in = small_input(2);
    zn_plan_budgets b = { { 1 << 30, 1 << 30, 1 << 30 } };
    zn_plan p;
    ZT_EQ_INT(plan_of(&p, &c, &in, &b), 0);
    /* Stage 3 over 2 ranks: each rank owns half of everything. */
    ZT_EQ_U64(p.bytes[ZN_STATE_PARAMS][ZN_TIER_GPU], 5 * 2);
    ZT_EQ_U64(p.bytes[ZN_STATE_PARAMS][ZN_TIER_CPU], 1095 * 2);
    ZT_EQ_U64(p.bytes[ZN_STATE_MASTER][ZN_TIER_NVME], 1100 * 4);
    ZT_EQ_U64(p.bytes[ZN_STATE_GRADS][ZN_TIER_CPU], 1100 * 4);  /* tiers.grads auto: room */
    /* Stage 1: only the optimizer state is sharded. */
    const char *sets[] = { "zero_optimization.stage=1" };
    if (zn_config_parse(&c, "{\"zero_optimization\": {\"offload_optimizer\": {\"device\":"
                            " \"cpu\"}}}", "s1", sets, 1))
        ZT_SETUP_FAIL("config: %s", zn_last_error());
    ZT_EQ_INT(plan_of(&p, &c, &in, &b), 0);
    ZT_EQ_U64(p.bytes[ZN_STATE_PARAMS][ZN_TIER_GPU], 2200 * 2);
    ZT_EQ_U64(p.bytes[ZN_STATE_MASTER][ZN_TIER_CPU], 1100 * 4);
    ZT_EQ_U64(p.bytes[ZN_STATE_GRADS][ZN_TIER_CPU], 2200 * 4);
}

/* Published parameter counts, from the models' config.json values. */
static void test_real_models(void)
{
    static const struct { const char *name, *json; uint64_t params; } models[] = {
        { "Llama-2-7B", "{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 4096,"
          " \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 32,"
          " \"intermediate_size\": 11008, \"vocab_size\": 32000}}", 6738415616ull },
        { "Llama-3-8B", "{\"model\": {\"model_type\": \"llama\", \"hidden_size\": 4096,"
          " \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
          " \"intermediate_size\": 14336, \"vocab_size\": 128256, \"rope_theta\": 500000}}",
          8030261248ull },
        { "Qwen2.5-7B", "{\"model\": {\"model_type\": \"qwen2\", \"hidden_size\": 3584,"
          " \"num_hidden_layers\": 28, \"num_attention_heads\": 28, \"num_key_value_heads\": 4,"
          " \"intermediate_size\": 18944, \"vocab_size\": 152064}}", 7615616512ull },
        { "Qwen2.5-14B", "{\"model\": {\"model_type\": \"qwen2\", \"hidden_size\": 5120,"
          " \"num_hidden_layers\": 48, \"num_attention_heads\": 40, \"num_key_value_heads\": 8,"
          " \"intermediate_size\": 13824, \"vocab_size\": 152064}}", 14770033664ull },
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        zn_config c;
        if (zn_config_parse(&c, models[i].json, models[i].name, NULL, 0))
            ZT_SETUP_FAIL("%s: %s", models[i].name, zn_last_error());
        zn_model_dims d;
        int rc = zn_run_model_dims(&c, &d);
        ZT_CHECK_MSG(rc == 0, "%s: %s", models[i].name, zn_last_error());
        uint64_t n = zn_model_param_count(&d);
        ZT_CHECK_MSG(n == models[i].params, "%s: %llu parameters, published %llu",
                     models[i].name, (unsigned long long)n, (unsigned long long)models[i].params);
        /* The planner sums the same blocks. */
        uint64_t *bl = calloc((size_t)zn_model_num_parts(&d), sizeof *bl);
        zn_plan_input in;
        zn_config_resolve_batch(&c, 1);
        zn_run_plan_input(&c, &d, 1, bl, &in);
        zn_plan_budgets b = { { UINT64_MAX / 4, UINT64_MAX / 4, UINT64_MAX / 4 } };
        zn_plan p;
        ZT_EQ_INT(plan_of(&p, &c, &in, &b), 0);
        ZT_EQ_U64(p.params_total, models[i].params);
        free(bl);
    }
}

/* LLaMA-Factory's ZeRO-3 config without offload (the optimizer on the GPU):
 * the states stay on the device where the plan fits, and move to pinned RAM
 * (with a note) where it does not, the same for `zinc plan` and `zinc
 * train`, which both call zn_run_fit_optimizer. */
static int fit_plan_rc(zn_config *c, uint64_t gpu, FILE *note, zn_plan *p, int *plan_rc)
{
    zn_model_dims d;
    ZT_EQ_INT(zn_run_model_dims(c, &d), 0);
    uint64_t bl[16];
    zn_plan_input in;
    zn_run_plan_input(c, &d, 1, bl, &in);
    zn_train_llama *ll = NULL;
    ZT_EQ_INT(zn_train_llama_create(&ll, &d, 1, c->data.seq_len, 0.02f, 1), 0);
    static zn_spec sp;
    zn_plan_budgets b = { { gpu, 1ull << 40, 1ull << 40 } };
    ZT_EQ_INT(zn_run_spec(c, &in, &b, &sp), 0);
    zn_train_options to = zn_train_options_default();
    to.spec = &sp;
    to.model = zn_train_llama_model(ll);
    int moved = zn_run_fit_optimizer(c, &sp, &to, 1, note);
    *plan_rc = zn_train_plan(p, &to, 1);
    zn_train_llama_destroy(ll);
    return moved;
}

static int fit_plan(zn_config *c, uint64_t gpu, FILE *note, zn_plan *p)
{
    int rc = 0, moved = fit_plan_rc(c, gpu, note, p, &rc);
    ZT_EQ_INT(rc, 0);
    return moved;
}

static void test_fit_optimizer(void)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/tests/fixtures/ds-configs/llamafactory-ds_z3_config.json",
             ZN_SOURCE_ROOT);
    const char *sets[] = { "model={\"model_type\": \"llama\", \"hidden_size\": 64, "
                           "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                           "\"intermediate_size\": 128, \"vocab_size\": 320}",
                           "train_micro_batch_size_per_gpu=1", "gradient_accumulation_steps=1",
                           "data.seq_len=64" };
    zn_config c;
    if (zn_config_load(&c, path, sets, 4))
        ZT_SETUP_FAIL("%s: %s", path, zn_last_error());
    zn_config_resolve_batch(&c, 1);
    ZT_EQ_INT(c.zero.offload_optimizer.device, ZN_OFFLOAD_NONE);
    zn_config cpu = c, dev = c;

    /* room: the states stay on the device, no note */
    char *buf = NULL;
    size_t len = 0;
    FILE *note = open_memstream(&buf, &len);
    zn_plan pd, pc, pm;
    ZT_EQ_INT(fit_plan(&dev, 1ull << 40, note, &pd), 0);
    fflush(note);
    ZT_EQ_INT(dev.zero.offload_optimizer.device, ZN_OFFLOAD_NONE);
    ZT_EQ_INT((int)len, 0);
    ZT_CHECK(pd.bytes[ZN_STATE_MASTER][ZN_TIER_GPU] > 0 &&
             !pd.bytes[ZN_STATE_MASTER][ZN_TIER_CPU]);

    /* a GPU budget that holds the cpu optimizer's plan and a little more,
     * but not the states: moved, said, and planned in pinned RAM */
    cpu.zero.offload_optimizer.device = ZN_OFFLOAD_CPU;
    ZT_EQ_INT(fit_plan(&cpu, 1ull << 40, NULL, &pc), 0);
    uint64_t states = pd.bytes[ZN_STATE_MASTER][ZN_TIER_GPU] * 4;
    uint64_t gpu = pc.tier_total[ZN_TIER_GPU] + states / 4;
    ZT_EQ_INT(fit_plan(&c, gpu, note, &pm), 1);
    fflush(note);
    ZT_EQ_INT(c.zero.offload_optimizer.device, ZN_OFFLOAD_CPU);
    ZT_CHECK_MSG(buf && strstr(buf, "offload_optimizer.device \"none\" -> \"cpu\"") &&
                     strstr(buf, "does not fit"), "note: %s", buf ? buf : "(none)");
    ZT_CHECK(pm.bytes[ZN_STATE_MASTER][ZN_TIER_CPU] > 0 &&
             !pm.bytes[ZN_STATE_MASTER][ZN_TIER_GPU]);
    ZT_CHECK(pm.tier_total[ZN_TIER_GPU] <= gpu);
    /* once moved, nothing more happens */
    ZT_EQ_INT(fit_plan(&c, gpu, note, &pm), 0);
    /* a GPU too small for either: "none" stays, and its own reason stands */
    zn_config small = dev;
    int prc = 0;
    ZT_EQ_INT(fit_plan_rc(&small, pc.tier_total[ZN_TIER_GPU] / 2, NULL, &pm, &prc), 0);
    ZT_EQ_INT(prc, ZN_ENOFIT);
    ZT_EQ_INT(small.zero.offload_optimizer.device, ZN_OFFLOAD_NONE);
    fclose(note);
    free(buf);
}

int main(void)
{
    test_fit_optimizer();
    test_hand_computed();
    test_sharded();
    test_q8_nvme();
    test_spec_nvme();
    test_grads_tier();
    test_q8_advice();
    test_param_cache();
    test_real_models();
    return zt_done();
}
