/* The door: a resolved config (DeepSpeed's keys, zinc's sections, a recipe's
 * settings) becomes the run spec the planner and the trainer take
 * (include/zinc/plan.h, zn_spec). This file is the only place where a
 * config key turns into a trainer setting; nothing below src/run reads the
 * config. The names of the keys a plan's fix or a trainer's refusal should
 * point the user to travel in zn_spec.keys, so that those messages name
 * what the user wrote without the lower layers knowing any key. */
#include <stdio.h>
#include <string.h>

#include "zinc/run.h"

static zn_tier tier_of(zn_offload_device d)
{
    return d == ZN_OFFLOAD_NONE ? ZN_TIER_GPU : d == ZN_OFFLOAD_CPU ? ZN_TIER_CPU : ZN_TIER_NVME;
}

zn_aio_config zn_run_aio_config(const zn_config *cfg)
{
    zn_aio_config ac = zn_aio_config_default();
    ac.block_size = (size_t)cfg->aio.block_size;
    ac.queue_depth = (int)cfg->aio.queue_depth;
    ac.intra_op_parallelism = (int)cfg->aio.intra_op_parallelism;
    ac.single_submit = cfg->aio.single_submit;
    ac.overlap_events = cfg->aio.overlap_events;
    return ac;
}

/* The swap folders and, for each, whether the run may create it; a folder
 * the run may not use is remembered, not reported: only a run that opens
 * its swap (never a plan) stops at it, with the config's message. */
static void spec_nvme(const zn_config *cfg, zn_spec *sp)
{
    const char *paths[ZN_SWAP_MAX_PATHS];
    int np = zn_config_nvme_paths(cfg, paths, ZN_SWAP_MAX_PATHS);
    sp->n_nvme = np;
    sp->stripe_paths = cfg->tiers.n_nvme > 0 ? cfg->tiers.n_nvme : 1;
    for (int i = 0; i < np; i++) {
        snprintf(sp->nvme_path[i], sizeof sp->nvme_path[i], "%s", paths[i]);
        int missing = 0;
        if (zn_config_nvme_path_check(cfg, i, &missing)) {
            snprintf(sp->nvme_error, sizeof sp->nvme_error, "%s", zn_last_error());
            sp->n_nvme = i;
            return;
        }
        sp->nvme_create[i] = missing != 0;
    }
    if (!np)
        snprintf(sp->nvme_error, sizeof sp->nvme_error,
                 "%s: state is placed on nvme but no path is given: set tiers.nvme or "
                 "zero_optimization.offload_*.nvme_path", cfg->source);
}

int zn_run_spec(const zn_config *cfg, const zn_plan_input *in, const zn_plan_budgets *b,
                zn_spec *sp)
{
    memset(sp, 0, sizeof *sp);
    if (!cfg || !in)
        return zn_set_error(ZN_EARG, "run spec: no config or plan input");
    const zn_config_zero *z = &cfg->zero;
    sp->source = cfg->source;
    sp->key = (zn_spec_keys){
        .opt_home = "zero_optimization.offload_optimizer.device",
        .param_home = "zero_optimization.offload_param.device",
        .param_max_in_cpu = "zero_optimization.offload_param.max_in_cpu",
        .micro_batch = "train_micro_batch_size_per_gpu",
        .opt_unit = "sub_group_size",
        .zero_stage = "zero_optimization.stage",
    };
    sp->plan = *in;
    if (b)
        sp->budgets = *b;
    sp->accumulation = cfg->gradient_accumulation_steps;
    sp->seed = cfg->train.seed;
    sp->clip = cfg->gradient_clipping;
    sp->lr = cfg->optimizer.lr;
    sp->sched = cfg->scheduler;
    sp->beta1 = cfg->optimizer.beta1;
    sp->beta2 = cfg->optimizer.beta2;
    sp->eps = cfg->optimizer.eps;
    sp->weight_decay = cfg->optimizer.weight_decay;
    sp->adamw = cfg->optimizer.type == ZN_OPT_ADAMW || cfg->optimizer.adam_w_mode;
    sp->bias_correction = cfg->optimizer.bias_correction;
    sp->bf16 = cfg->bf16;
    sp->fp16 = cfg->fp16.enabled;
    sp->loss_scale = cfg->fp16;
    sp->grad_transfer = cfg->train.grad_transfer;
    sp->moment_bytes = zn_config_moment_bytes(cfg->train.optim);
    sp->q8_scheme = zn_config_q8_scheme(cfg->train.optim) ? ZN_Q8_TORCHAO : ZN_Q8_BNB;
    sp->master_bf16_sr = cfg->train.master_weights == ZN_MASTER_BF16_SR;
    sp->speculate = cfg->train.speculative_step;
    {
        const zn_config_checkpoint *cc = &cfg->train.checkpoint;
        sp->commit_only = cc->dir[0] && cc->commit && cc->in_place && cc->every == 0;
    }
    sp->zero_stage = (int)z->stage;
    sp->param_home = tier_of(z->offload_param.device);
    sp->opt_home = tier_of(z->offload_optimizer.device);
    sp->persistence_threshold = (uint64_t)z->stage3_param_persistence_threshold;
    sp->param_max_in_cpu = (uint64_t)z->offload_param.max_in_cpu;
    sp->param_buffers = z->offload_param.buffer_count;
    sp->opt_buffers = z->offload_optimizer.buffer_count;
    sp->param_buffer_size = (uint64_t)z->offload_param.buffer_size;
    sp->opt_unit = (uint64_t)z->sub_group_size;
    sp->opt_ratio = z->offload_optimizer.ratio;
    sp->prefetch_bucket = (uint64_t)z->stage3_prefetch_bucket_size;
    sp->max_live_params = (uint64_t)z->stage3_max_live_parameters;
    sp->param_cache = cfg->tiers.param_cache;
    sp->grads = (zn_grads_tier)cfg->tiers.grads;
    sp->cpu_activations = cfg->activation_checkpointing.cpu_checkpointing;
    snprintf(sp->device, sizeof sp->device, "%s", cfg->train.device[0] ? cfg->train.device : "auto");
    sp->threads = (int)cfg->train.threads;
    sp->aio = zn_run_aio_config(cfg);
    sp->keep_swap = cfg->tiers.keep_swap;
    spec_nvme(cfg, sp);
    zn_debug("run spec: micro-batch %lld x accumulation %lld, %lld tokens, %d rank(s), %s",
             (long long)in->micro_batch, (long long)sp->accumulation, (long long)in->seq_len,
             in->world_size, cfg->source);
    return 0;
}
