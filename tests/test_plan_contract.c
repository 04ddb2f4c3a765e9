/* The plan is a contract: for each of many configurations (four decoder
 * shapes, one with Qwen2.5's 151936-token vocabulary streamed in parts, one
 * with tied embeddings and one training LoRA adapters with dropout on a
 * frozen base; every placement of params and optimizer; ZeRO stages 1-3;
 * accumulation 1 and 2; param cache on and off; gradients in RAM, on NVMe
 * or split between them; bf16 gradient transfer; the fused attention; cpu
 * checkpointing; buffer counts 4 and 8; Adam's moments as fp32, bf16 and
 * 8-bit in the cpu tier and on NVMe; the bf16 master with stochastic
 * rounding; sub-groups), zn_train_plan's figure for each tier
 * must hold the run: after two steps on the host backend, every tier's
 * high-water mark is <= the plan and >= 0.9 of it (and 0 where the plan
 * says 0). Then a few of them on 2 ranks (forked, joined by the TCP
 * communicator), the bf16 master among them: each rank's high-water
 * against the plan its trainer made for its own shares (the last rank's
 * are shorter), and rank 0's is zn_train_plan's for the world size (what
 * `zinc plan --world 2` prints). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zinc/comm.h"
#include "zinc/run.h"
#include "zinc/config.h"
#include "zinc/model.h"
#include "zinc/train.h"
#include "test_net.h"
#include "test_nvme_common.h"
#include "zt.h"

typedef struct {
    const char *name;
    const char *model;  /* --set fragments of the model section */
    const char *lora;   /* and of the lora section, or NULL */
} shape;

static const shape shapes[] = {
    { "llama-320", "model={\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                   " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                   " \"intermediate_size\": 128, \"vocab_size\": 320}", NULL },
    { "qwen2-152k", "model={\"model_type\": \"qwen2\", \"hidden_size\": 32, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 4, \"num_key_value_heads\": 1,"
                    " \"intermediate_size\": 64, \"vocab_size\": 151936}", NULL },
    { "llama-tied", "model={\"model_type\": \"llama\", \"hidden_size\": 32, \"num_hidden_layers\": 3,"
                    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                    " \"intermediate_size\": 96, \"vocab_size\": 256,"
                    " \"tie_word_embeddings\": true}", NULL },
    /* LoRA: a frozen base (no optimizer state, its own NVMe extent) */
    { "llama-lora", "model={\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                    " \"intermediate_size\": 128, \"vocab_size\": 320}",
      "lora={\"r\": 4, \"lora_alpha\": 8, \"lora_dropout\": 0.1, \"target_modules\": \"all-linear\"}" },
};

typedef struct {
    const char *param, *opt;
    int stage;
} placement;

static const placement places[] = {
    { "none", "none", 1 }, { "none", "cpu", 2 }, { "none", "none", 3 }, { "cpu", "cpu", 3 },
    { "none", "cpu", 3 },  { "cpu", "nvme", 3 }, { "nvme", "nvme", 3 },
    { "cpu", "none", 3 },  /* the optimizer on the device, the blocks' homes off it */
};

static int checked, failed_cfgs;
static double min_ratio[ZN_TIER_COUNT] = { 2, 2, 2 }, max_ratio[ZN_TIER_COUNT];
/* the cpu budget of the runs, and one more --set (NULL: none) */
static char cpu_budget[64] = "tiers.cpu=\"4GiB\"";
static const char *extra_set;
/* the last run's plan total per tier */
static uint64_t last_plan[ZN_TIER_COUNT], last_grads[ZN_TIER_COUNT];

/* The config of one configuration on `world` ranks, its model's shape and
 * plan input (blocks: its block sizes); label (256 bytes) names it.
 * Returns 0, or -1 (a check failed). */
static int configure(const shape *sh, const placement *pl, int accum, int pcache,
                     const char *grads, int bcount, int subgroup, int world, zn_config *cfg,
                     zn_model_dims *d, uint64_t *blocks, zn_plan_input *in, char *label)
{
    snprintf(label, 256, "%s param=%s opt=%s stage=%d acc=%d pcache=%d grads=%s "
             "bc=%d sg=%d %s %s%s", sh->name, pl->param, pl->opt, pl->stage, accum, pcache, grads,
             bcount, subgroup, cpu_budget, extra_set ? extra_set : "",
             world > 1 ? " (2 ranks)" : "");
    char s_param[96], s_opt[96], s_stage[64], s_acc[64], s_pc[64], s_gr[64], s_bc[96], s_sg[96];
    char s_nvme[4400];
    snprintf(s_param, sizeof s_param, "zero_optimization.offload_param.device=\"%s\"", pl->param);
    snprintf(s_opt, sizeof s_opt, "zero_optimization.offload_optimizer.device=\"%s\"", pl->opt);
    snprintf(s_stage, sizeof s_stage, "zero_optimization.stage=%d", pl->stage);
    snprintf(s_acc, sizeof s_acc, "gradient_accumulation_steps=%d", accum);
    snprintf(s_pc, sizeof s_pc, "tiers.param_cache=%d", pcache);
    snprintf(s_gr, sizeof s_gr, "tiers.grads=\"%s\"", grads);
    snprintf(s_bc, sizeof s_bc, "zero_optimization.offload_optimizer.buffer_count=%d", bcount);
    snprintf(s_sg, sizeof s_sg, "zero_optimization.sub_group_size=%d", subgroup);
    snprintf(s_nvme, sizeof s_nvme, "tiers.nvme=[{\"path\": \"%s\", \"size\": \"1GiB\"}]",
             tn_tmpdir("plan-contract"));
    const char *sets[] = { sh->model, s_param, s_opt, s_stage, s_acc, s_pc, s_gr, s_bc, s_sg,
                           s_nvme, "tiers.gpu=\"512MiB\"", cpu_budget,
                           "train.device=\"host\"", "train_micro_batch_size_per_gpu=2",
                           "data.seq_len=16", "zero_optimization.stage3_param_persistence_threshold=0",
                           "aio.block_size=65536", extra_set ? extra_set : sh->lora, sh->lora };
    const char *json =
        "{\"gradient_clipping\": 1.0,"
        " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}},"
        " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 2}}}";
    int nsets = (int)(sizeof sets / sizeof sets[0]) - 2 + (extra_set || sh->lora) +
                (extra_set && sh->lora);
    int rc = zn_config_parse(cfg, json, label, sets, nsets);
    if (!rc)
        rc = zn_config_resolve_batch(cfg, world);
    ZT_CHECK_MSG(rc == 0, "%s: config: %s", label, zn_last_error());
    if (rc)
        return -1;
    rc = zn_run_model_dims(cfg, d);
    ZT_CHECK_MSG(rc == 0, "%s: model: %s", label, zn_last_error());
    if (rc)
        return -1;
    zn_run_plan_input(cfg, d, world, blocks, in);
    return 0;
}

/* Two steps of `accum` micro-batches of token ids that depend on salt
 * (each rank its own). */
static int two_steps(zn_trainer *tr, int accum, int vocab, int salt, const char *label)
{
    int n = accum * 2 * 16, rc = 0;
    int32_t *ids = malloc((size_t)n * sizeof *ids), *tg = malloc((size_t)n * sizeof *tg);
    if (!ids || !tg)
        ZT_SETUP_FAIL("out of memory");
    for (int s = 0; s < 2 && !rc; s++) {
        for (int i = 0; i < n; i++) {
            ids[i] = (int32_t)((i * 7919 + s * 104729 + salt * 31) % vocab);
            tg[i] = (int32_t)((i * 6007 + s * 7 + salt) % vocab);
        }
        zn_train_step_info info;
        rc = zn_train_step(tr, ids, tg, NULL, &info);
        ZT_CHECK_MSG(rc == 0, "%s: step %d: %s", label, s + 1, zn_last_error());
    }
    free(ids);
    free(tg);
    return rc;
}

static void one(const shape *sh, const placement *pl, int accum, int pcache, const char *grads,
                int bcount, int subgroup)
{
    char label[256];
    zn_config cfg;
    zn_model_dims d;
    uint64_t blocks[256]; /* zn_model_num_parts: at most 32 + layers + 32 */
    zn_plan_input in;
    if (configure(sh, pl, accum, pcache, grads, bcount, subgroup, 1, &cfg, &d, blocks, &in,
                  label))
        return;
    int rc;
    zn_train_llama *l = NULL;
    zn_trainer *tr = NULL;
    ZT_EQ_INT(zn_train_llama_create(&l, &d, 2, 16, 0.02, 1), 0);
    zn_train_options o = zn_train_options_default();
    zn_spec o_spec;
    ZT_EQ_INT(zn_run_spec(&cfg, &in, NULL, &o_spec), 0);
    o.spec = &o_spec;
    o.model = zn_train_llama_model(l);
    o_spec.budgets.bytes[ZN_TIER_GPU] = cfg.tiers.gpu;
    o_spec.budgets.bytes[ZN_TIER_CPU] = cfg.tiers.cpu;
    o_spec.budgets.bytes[ZN_TIER_NVME] = 1u << 30;
    o_spec.threads = 2;
    zn_plan plan;
    rc = zn_train_plan(&plan, &o, 1);
    ZT_CHECK_MSG(rc == 0, "%s: plan: %s", label, zn_last_error());
    if (!rc)
        rc = zn_train_create(&tr, &o);
    ZT_CHECK_MSG(rc == 0, "%s: create: %s", label, zn_last_error());
    if (!rc)
        rc = two_steps(tr, accum, (int)d.vocab, 0, label);
    if (!rc)
        rc = zn_train_sync(tr);
    if (!rc) {
        zn_train_report r;
        zn_train_get_report(tr, &r);
        int bad = 0;
        for (int t = 0; t < ZN_TIER_COUNT; t++) {
            uint64_t want = plan.tier_total[t], got = r.peak[t];
            last_plan[t] = want;
            last_grads[t] = plan.bytes[ZN_STATE_GRADS][t];
            bool ok = want ? got <= want && (double)got >= 0.9 * (double)want : got == 0;
            ZT_CHECK_MSG(ok, "%s: %s tier high-water %llu, plan %llu (%.3f)", label,
                         zn_tier_name((zn_tier)t), (unsigned long long)got,
                         (unsigned long long)want, want ? (double)got / (double)want : 0.0);
            bad += !ok;
            if (want) {
                double q = (double)got / (double)want;
                min_ratio[t] = q < min_ratio[t] ? q : min_ratio[t];
                max_ratio[t] = q > max_ratio[t] ? q : max_ratio[t];
            }
        }
        failed_cfgs += bad > 0;
        checked++;
    }
    zn_train_destroy(tr);
    zn_train_llama_destroy(l);
}

/* ---- several ranks ---------------------------------------------------------- */
typedef struct {
    int shape, place;
    const char *grads;
    int subgroup;
    const char *extra;
} rank_case;

static const rank_case rank_cases[] = {
    /* the bf16 master: stage 3 in RAM, on NVMe (grads in RAM and on NVMe),
     * stage 2 (replicated params), and LoRA adapters on a frozen base */
    { 0, 3, "auto", 100000, "train.master_weights=\"bf16_sr\"" },
    { 0, 5, "cpu", 30000, "train.master_weights=\"bf16_sr\"" },
    { 0, 6, "nvme", 30000, "train.master_weights=\"bf16_sr\"" },
    { 0, 1, "auto", 100000, "train.master_weights=\"bf16_sr\"" },
    { 3, 6, "nvme", 100000, "train.master_weights=\"bf16_sr\"" },
    { 1, 6, "nvme", 100000, "train.master_weights=\"bf16_sr\"" },
    /* the fp32 master beside them */
    { 0, 3, "auto", 100000, NULL },
    { 0, 6, "nvme", 30000, NULL },
};
#define N_RANK_CASES (int)(sizeof rank_cases / sizeof rank_cases[0])

typedef struct {
    int rc;
    uint64_t plan[ZN_TIER_COUNT];   /* the plan of this rank's trainer */
    uint64_t peak[ZN_TIER_COUNT];
    uint64_t zplan[ZN_TIER_COUNT];  /* rank 0: zn_train_plan for the world size */
} rank_result;

/* One rank of rank case c (a child process): its result into dir/c<c>.r<rank>. */
static int rank_worker(int c, const char *dir)
{
    const rank_case *rc_ = &rank_cases[c];
    zn_comm *comm = NULL;
    zn_comm_config cc = zn_comm_config_default();
    cc.timeout_s = 60;
    if (zn_comm_create(&comm, &cc)) {
        fprintf(stderr, "worker: comm: %s\n", zn_last_error());
        return 2;
    }
    int W = zn_comm_size(comm), R = zn_comm_rank(comm);
    extra_set = rc_->extra;
    rank_result res;
    memset(&res, 0, sizeof res);
    char label[256];
    zn_config cfg;
    zn_model_dims d;
    uint64_t blocks[256];
    zn_plan_input in;
    const shape *sh = &shapes[rc_->shape];
    const placement *pl = &places[rc_->place];
    res.rc = configure(sh, pl, 2, 4, rc_->grads, 4, rc_->subgroup, W, &cfg, &d, blocks, &in,
                       label);
    zn_train_llama *l = NULL;
    zn_trainer *tr = NULL;
    if (!res.rc && (res.rc = zn_train_llama_create(&l, &d, 2, 16, 0.02, 1)))
        fprintf(stderr, "%s: model: %s\n", label, zn_last_error());
    zn_train_options o = zn_train_options_default();
    zn_spec o_spec;
    ZT_EQ_INT(zn_run_spec(&cfg, &in, NULL, &o_spec), 0);
    o.spec = &o_spec;
    o.model = l ? zn_train_llama_model(l) : NULL;
    o_spec.budgets.bytes[ZN_TIER_GPU] = cfg.tiers.gpu;
    o_spec.budgets.bytes[ZN_TIER_CPU] = cfg.tiers.cpu;
    o_spec.budgets.bytes[ZN_TIER_NVME] = 1u << 30;
    o_spec.threads = 1;
    o.comm = comm;
    zn_plan plan;
    if (!res.rc && R == 0 && (res.rc = zn_train_plan(&plan, &o, W)))
        fprintf(stderr, "%s: plan: %s\n", label, zn_last_error());
    if (!res.rc && R == 0)
        for (int t = 0; t < ZN_TIER_COUNT; t++)
            res.zplan[t] = plan.tier_total[t];
    if (!res.rc && (res.rc = zn_train_create(&tr, &o)))
        fprintf(stderr, "%s: rank %d: create: %s\n", label, R, zn_last_error());
    if (!res.rc)
        res.rc = two_steps(tr, 2, (int)d.vocab, R + 1, label);
    if (!res.rc)
        res.rc = zn_train_sync(tr);
    if (!res.rc) {
        zn_train_report r;
        zn_train_get_report(tr, &r);
        for (int t = 0; t < ZN_TIER_COUNT; t++)
            res.plan[t] = r.plan[t], res.peak[t] = r.peak[t];
    }
    zn_train_destroy(tr);
    zn_train_llama_destroy(l);
    zn_comm_destroy(comm);
    char path[4200];
    snprintf(path, sizeof path, "%s/c%d.r%d", dir, c, R);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(&res, sizeof res, 1, f) != 1 || fclose(f)) {
        fprintf(stderr, "worker: writing %s\n", path);
        return 2;
    }
    return res.rc ? 1 : 0;
}

/* Rank case c on W forked ranks: each rank's tiers against its plan. */
static void several(int c, int W, const char *dir)
{
    pid_t pids[8];
    char cs[16];
    snprintf(cs, sizeof cs, "%d", c);
    const char *args[] = { "--rank", cs, dir, NULL };
    tnet_spawn_ranks(W, "tcp", NULL, 200, args, pids);
    int bad = 0;
    for (int r = 0; r < W; r++) {
        int ws;
        if (waitpid(pids[r], &ws, 0) != pids[r] || !WIFEXITED(ws) || WEXITSTATUS(ws)) {
            ZT_FAIL_AT("rank case %d, %d ranks: rank %d ended with status %d", c, W, r, ws);
            bad++;
        }
    }
    if (bad) {
        failed_cfgs++;
        return;
    }
    const rank_case *rk = &rank_cases[c];
    for (int r = 0; r < W; r++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/c%d.r%d", dir, c, r);
        rank_result res;
        FILE *f = fopen(path, "rb");
        int got_it = f && fread(&res, sizeof res, 1, f) == 1;
        if (f)
            fclose(f);
        unlink(path);
        if (!got_it) {
            ZT_FAIL_AT("cannot read %s", path);
            failed_cfgs++;
            continue;
        }
        int nbad = 0;
        for (int t = 0; t < ZN_TIER_COUNT; t++) {
            uint64_t want = res.plan[t], got = res.peak[t];
            bool ok = want ? got <= want && (double)got >= 0.9 * (double)want : got == 0;
            if (r == 0)
                ok = ok && res.zplan[t] == want;
            ZT_CHECK_MSG(ok, "%s param=%s opt=%s stage=%d grads=%s sg=%d %s, rank %d of %d: %s "
                         "tier high-water %llu, its plan %llu (%.3f)%s%llu", shapes[rk->shape].name,
                         places[rk->place].param, places[rk->place].opt, places[rk->place].stage,
                         rk->grads, rk->subgroup, rk->extra ? rk->extra : "fp32 master", r, W,
                         zn_tier_name((zn_tier)t), (unsigned long long)got,
                         (unsigned long long)want, want ? (double)got / (double)want : 0.0,
                         r == 0 ? ", zn_train_plan's " : "",
                         r == 0 ? (unsigned long long)res.zplan[t] : 0ull);
            nbad += !ok;
            if (want) {
                double q = (double)got / (double)want;
                min_ratio[t] = q < min_ratio[t] ? q : min_ratio[t];
                max_ratio[t] = q > max_ratio[t] ? q : max_ratio[t];
            }
        }
        failed_cfgs += nbad > 0;
    }
    checked++;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--rank"))
        return rank_worker(atoi(argv[2]), argv[3]);
    int n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t p = 0; p < sizeof places / sizeof places[0]; p++) {
            const placement *pl = &places[p];
            bool opt_nvme = !strcmp(pl->opt, "nvme"), par_nvme = !strcmp(pl->param, "nvme");
            /* the base combination of each shape and placement */
            one(&shapes[s], pl, 1, 4, "auto", 4, 100000);
            n++;
            one(&shapes[s], pl, 2, 4, "auto", 4, 100000);
            n++;
            if (opt_nvme) {
                one(&shapes[s], pl, 2, 4, "cpu", 8, 30000);
                one(&shapes[s], pl, 2, 4, "nvme", 4, 30000);
                n += 2;
            }
            if (par_nvme) {
                one(&shapes[s], pl, 1, 0, "auto", 8, 100000);
                one(&shapes[s], pl, 1, 1, "nvme", 4, 50000);
                n += 2;
            }
        }
    /* the optimizer on the device with NVMe-homed blocks */
    {
        const placement pl = { "nvme", "none", 3 };
        one(&shapes[0], &pl, 2, 4, "auto", 4, 100000);
        n++;
    }
    /* gradient accumulators split between RAM and NVMe (tiers.grads auto
     * with pinned room for about half of them): the budget from the plan
     * with all of them on NVMe */
    {
        const placement pl = { "cpu", "nvme", 3 };
        one(&shapes[0], &pl, 2, 4, "nvme", 4, 30000);
        uint64_t G = 0;
        {
            zn_model_dims dd;
            zn_config cc;
            if (zn_config_parse(&cc, "{}", "g", &shapes[0].model, 1) || zn_run_model_dims(&cc, &dd))
                ZT_SETUP_FAIL("shape: %s", zn_last_error());
            G = zn_model_trainable_count(&dd) * 4;
        }
        snprintf(cpu_budget, sizeof cpu_budget, "tiers.cpu=%llu",
                 (unsigned long long)(last_plan[ZN_TIER_CPU] + G / 2));
        one(&shapes[0], &pl, 2, 4, "auto", 4, 30000);
        ZT_CHECK_MSG(last_grads[ZN_TIER_CPU] > 0 && last_grads[ZN_TIER_NVME] > 0,
                     "split grads: %llu B of them in RAM, %llu B on NVMe",
                     (unsigned long long)last_grads[ZN_TIER_CPU],
                     (unsigned long long)last_grads[ZN_TIER_NVME]);
        snprintf(cpu_budget, sizeof cpu_budget, "tiers.cpu=\"4GiB\"");
        n += 2;
    }
    /* One setting at a time, in two placements and with a 152k vocabulary:
     * bf16 gradient transfer (the default with bf16 params on CUDA) and its
     * device buffer; cpu checkpointing (the group inputs in pinned RAM, a
     * ring of three on the device); the fused attention (bf16's default;
     * here in fp32, its C reference: a smaller model workspace). */
    static const char *const extras[] = { "train.grad_transfer=\"bf16\"",
                                          "activation_checkpointing.cpu_checkpointing=true",
                                          "train.attention=\"fused\"" };
    for (size_t e = 0; e < sizeof extras / sizeof extras[0]; e++) {
        extra_set = extras[e];
        for (size_t s = 0; s < 2; s++) {
            one(&shapes[s], &places[3], 2, 4, "auto", 4, 100000);
            one(&shapes[s], &places[6], 2, 4, "nvme", 4, 100000);
            n += 2;
        }
    }
    /* Adam's moments in fewer bytes (train.optim), in the cpu optimizer
     * tier, on the device and on NVMe (swap extents and staging at their own size, grads
     * in RAM or on NVMe); a sub-group of 100000 or 30000 is not a whole
     * number of 8-bit blocks, so the units are rounded up to them */
    static const char *const optims[] = { "train.optim=\"adamw_bnb_8bit\"",
                                          "train.optim=\"adamw_bf16\"" };
    for (size_t e = 0; e < sizeof optims / sizeof optims[0]; e++) {
        extra_set = optims[e];
        for (size_t s = 0; s < 2; s++) {
            one(&shapes[s], &places[3], 2, 4, "auto", 4, 100000);
            one(&shapes[s], &places[1], 2, 4, "auto", 4, 100000);
            one(&shapes[s], &places[5], 2, 4, "cpu", 8, 30000);
            one(&shapes[s], &places[6], 2, 4, "nvme", 4, 100000);
            /* the optimizer on the device (zn_dev_adam_mom) */
            one(&shapes[s], &places[2], 2, 4, "auto", 4, 100000);
            one(&shapes[s], &places[7], 2, 4, "auto", 4, 100000);
            n += 6;
        }
    }
    /* the bf16 master with stochastic rounding (train.master_weights), in
     * the cpu optimizer tier, on NVMe and on the device: 2 bytes per
     * parameter of master (NVMe extents too), and the fp32 params' update
     * staging of the host backend (the master widened); LoRA adapters on
     * a frozen base too */
    extra_set = "train.master_weights=\"bf16_sr\"";
    for (size_t s = 0; s < 2; s++) {
        one(&shapes[s], &places[1], 2, 4, "auto", 4, 100000);
        one(&shapes[s], &places[3], 2, 4, "auto", 4, 100000);
        one(&shapes[s], &places[4], 1, 1, "auto", 4, 30000);
        one(&shapes[s], &places[5], 2, 4, "cpu", 8, 30000);
        one(&shapes[s], &places[6], 2, 4, "nvme", 4, 100000);
        /* the optimizer on the device (zn_dev_adam_sr) */
        one(&shapes[s], &places[2], 2, 4, "auto", 4, 100000);
        one(&shapes[s], &places[7], 2, 4, "auto", 4, 100000);
        n += 7;
    }
    one(&shapes[3], &places[3], 2, 4, "auto", 4, 100000);
    n++;
    /* torchao's 8-bit scheme: the same storage, one configuration */
    extra_set = "train.optim=\"adamw_torch_8bit\"";
    one(&shapes[0], &places[3], 2, 4, "auto", 4, 100000);
    one(&shapes[0], &places[6], 1, 1, "auto", 8, 50000);
    n += 2;
    extra_set = NULL;
    /* on 2 ranks */
    {
        char rdir[] = "plan-contract-ranks-XXXXXX";
        if (!mkdtemp(rdir))
            ZT_SETUP_FAIL("mkdtemp: %s", strerror(errno));
        for (int c = 0; c < N_RANK_CASES; c++, n++)
            several(c, 2, rdir);
        rmdir(rdir);
    }
    printf("%d configurations, %d checked, %d with a tier off the plan\n", n, checked,
           failed_cfgs);
    for (int t = 0; t < ZN_TIER_COUNT; t++)
        printf("  %-5s high-water / plan: %.4f .. %.4f\n", zn_tier_name((zn_tier)t),
               min_ratio[t], max_ratio[t]);
    ZT_CHECK_MSG(n >= 50, "only %d configurations", n);
    tn_rmdir();
    return zt_done();
}
