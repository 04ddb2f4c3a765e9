/* The effective training settings: "auto" resolved against the model and the
 * device, then printed at the start of `zinc plan` and `zinc train`, each
 * value tagged with where it came from (config, auto, default, --set), so
 * that a DeepSpeed config written for the HF Trainer shows what zinc made
 * of it before anything runs. */
#include <stdio.h>
#include <string.h>

#include "zinc/run.h"
#include "zinc/device.h"

/* "[origin]" for a key; `rule` says what "auto" resolved from, `deflt` where
 * a default came from (a train.* key, whose own origin is shown). */
static const char *tag(const zn_config *cfg, const char *key, const char *rule,
                       const char *deflt, char *buf, size_t len)
{
    zn_config_origin o = zn_config_get_origin(cfg, key);
    if (o == ZN_ORIGIN_AUTO && rule)
        snprintf(buf, len, "[auto: %s]", rule);
    else if (o == ZN_ORIGIN_DEFAULT && deflt && !strncmp(deflt, "train.", 6))
        snprintf(buf, len, "[%s: %s]",
                 zn_config_get_origin(cfg, deflt) == ZN_ORIGIN_DEFAULT
                     ? "default" : zn_config_origin_name(zn_config_get_origin(cfg, deflt)),
                 deflt);
    else if (o == ZN_ORIGIN_DEFAULT && deflt)
        snprintf(buf, len, "[default: %s]", deflt);
    else
        snprintf(buf, len, "[%s]", zn_config_origin_name(o));
    return buf;
}

static const char *sched_name(zn_scheduler_type t)
{
    switch (t) {
    case ZN_SCHED_NONE: return "constant";
    case ZN_SCHED_WARMUP_LR: return "WarmupLR";
    case ZN_SCHED_WARMUP_DECAY_LR: return "WarmupDecayLR";
    case ZN_SCHED_WARMUP_COSINE_LR: return "WarmupCosineLR";
    case ZN_SCHED_HF_LINEAR: return "linear";
    case ZN_SCHED_HF_COSINE: return "cosine";
    case ZN_SCHED_HF_CONSTANT_WARMUP: return "constant_with_warmup";
    }
    return "?";
}

void zn_run_effective_print(const zn_config *c, int world, FILE *f)
{
    char t1[96], t2[96], t3[96], t4[96], t5[96], t6[96];
    bool ot = c->optimizer_from_train, st = c->scheduler_from_train;
    const zn_config_optimizer *o = &c->optimizer;
    const zn_config_scheduler *s = &c->scheduler;
    const zn_config_zero *z = &c->zero;

    fprintf(f, "effective config ([where each value came from]):\n");
    fprintf(f, "  optimizer  %s %s, lr %g %s, betas [%g, %g] %s, eps %g %s, weight_decay %g %s\n",
            o->type == ZN_OPT_ADAMW ? "AdamW" : (o->adam_w_mode ? "Adam (adam_w_mode)" : "Adam"),
            tag(c, "optimizer.type", NULL, ot ? "no optimizer section" : "DeepSpeed", t1, sizeof t1),
            o->lr, tag(c, "optimizer.params.lr", "train.learning_rate",
                       ot ? "train.learning_rate" : "DeepSpeed", t2, sizeof t2),
            o->beta1, o->beta2, tag(c, "optimizer.params.betas", "train.adam_beta1/2",
                                    ot ? "train.adam_beta1" : "DeepSpeed", t3, sizeof t3),
            o->eps, tag(c, "optimizer.params.eps", "train.adam_epsilon",
                        ot ? "train.adam_epsilon" : "DeepSpeed", t4, sizeof t4),
            o->weight_decay, tag(c, "optimizer.params.weight_decay", "train.weight_decay",
                                 ot ? "train.weight_decay" : "DeepSpeed", t5, sizeof t5));
    {
        /* train.optim: the HF Trainer's name and the moments it keeps */
        static const char *names[] = { "adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit",
                                       "adamw_8bit", "paged_adamw_8bit", "adamw_bf16",
                                       "adamw_torch_8bit" };
        int oi = c->train.optim >= 0 && c->train.optim < 7 ? c->train.optim : 0;
        int mb = zn_config_moment_bytes(oi);
        fprintf(f, "  moments    %s: Adam m and v as %s (%s per parameter), master %s %s\n",
                names[oi], mb == 4 ? "fp32" : mb == 2 ? "bf16"
                           : zn_config_q8_scheme(oi) ? "int8, blocks of 256, torchao's rounding"
                                                     : "int8, blocks of 256",
                mb == 4 ? "8 bytes" : mb == 2 ? "4 bytes" : "2.03 bytes",
                c->train.master_weights == ZN_MASTER_BF16_SR
                    ? "bf16 with stochastic rounding (train.master_weights bf16_sr, 2 bytes)"
                    : "fp32",
                tag(c, "train.optim", NULL, "adamw_torch", t6, sizeof t6));
    }
    if (s->type == ZN_SCHED_NONE) {
        fprintf(f, "  schedule   constant lr %s\n",
                tag(c, "scheduler.type", NULL, st ? "train.lr_scheduler_type" : "DeepSpeed",
                    t1, sizeof t1));
    } else {
        bool ds_warm = s->type == ZN_SCHED_WARMUP_LR || s->type == ZN_SCHED_WARMUP_DECAY_LR;
        char range[96] = "";
        if (ds_warm)
            snprintf(range, sizeof range, ", lr %g %s -> %g %s", s->warmup_min_lr,
                     tag(c, "scheduler.params.warmup_min_lr", "0", "DeepSpeed", t5, sizeof t5),
                     s->warmup_max_lr,
                     tag(c, "scheduler.params.warmup_max_lr", "train.learning_rate", "DeepSpeed",
                         t6, sizeof t6));
        bool has_total = s->type != ZN_SCHED_WARMUP_LR && s->type != ZN_SCHED_HF_CONSTANT_WARMUP;
        char total[96] = "";
        if (has_total)
            snprintf(total, sizeof total, ", total %lld steps %s", (long long)s->total_num_steps,
                     tag(c, "scheduler.params.total_num_steps", "train.steps",
                         st ? "train.steps" : "DeepSpeed", t3, sizeof t3));
        fprintf(f, "  schedule   %s %s, warmup %lld steps (%s) %s%s%s\n", sched_name(s->type),
                tag(c, "scheduler.type", NULL, st ? "train.lr_scheduler_type" : "DeepSpeed",
                    t1, sizeof t1),
                (long long)s->warmup_num_steps,
                s->type >= ZN_SCHED_HF_LINEAR || s->warmup_type == 1 ? "linear" : "log",
                tag(c, "scheduler.params.warmup_num_steps", "train.warmup_steps",
                    st ? "train.warmup_steps" : "DeepSpeed", t2, sizeof t2),
                total, range);
    }
    if (c->gradient_clipping > 0)
        fprintf(f, "  clipping   global L2 norm %g %s\n", c->gradient_clipping,
                tag(c, "gradient_clipping", "train.max_grad_norm", "DeepSpeed", t1, sizeof t1));
    else
        fprintf(f, "  clipping   off %s\n",
                tag(c, "gradient_clipping", "train.max_grad_norm", "DeepSpeed", t1, sizeof t1));
    const char *prec_key = c->fp16.enabled ? "fp16.enabled" : "bf16.enabled";
    fprintf(f, "  precision  %s %s\n",
            c->bf16 ? (c->train.master_weights == ZN_MASTER_BF16_SR
                           ? "bf16 params and activations, bf16 master (stochastic rounding)"
                           : "bf16 params and activations, fp32 master")
                    : c->fp16.enabled ? "fp16, fp32 master, dynamic loss scale"
                    : c->train.master_weights == ZN_MASTER_BF16_SR
                    ? "fp32 compute, bf16 master (stochastic rounding)" : "fp32",
            tag(c, prec_key, c->fp16.enabled ? "off" : "bf16 where the device computes in bf16",
                "DeepSpeed", t1, sizeof t1));
    fprintf(f, "  batch      micro %lld %s x accumulation %lld %s x ranks %d = %lld %s\n",
            (long long)c->train_micro_batch_size_per_gpu,
            tag(c, "train_micro_batch_size_per_gpu", "the other batch keys, "
                "train.per_device_train_batch_size", "derived", t1, sizeof t1),
            (long long)c->gradient_accumulation_steps,
            tag(c, "gradient_accumulation_steps", "the other batch keys, "
                "train.gradient_accumulation_steps", "derived", t2, sizeof t2),
            world, (long long)c->train_batch_size,
            tag(c, "train_batch_size", "micro x accumulation x ranks", "derived", t3, sizeof t3));
    fprintf(f, "  ZeRO       stage %d %s; params -> %s %s, optimizer -> %s %s\n", z->stage,
            tag(c, "zero_optimization.stage", NULL, "DeepSpeed", t1, sizeof t1),
            zn_offload_device_name(z->offload_param.device),
            tag(c, "zero_optimization.offload_param.device", NULL, "DeepSpeed", t2, sizeof t2),
            zn_offload_device_name(z->offload_optimizer.device),
            tag(c, "zero_optimization.offload_optimizer.device", NULL, "DeepSpeed", t3, sizeof t3));
    fprintf(f, "  buckets    reduce %lld %s, prefetch %lld %s, persistence threshold %lld %s, "
            "sub-group %lld %s (elements)\n",
            (long long)z->reduce_bucket_size,
            tag(c, "zero_optimization.reduce_bucket_size", "hidden^2", "DeepSpeed", t1, sizeof t1),
            (long long)z->stage3_prefetch_bucket_size,
            tag(c, "zero_optimization.stage3_prefetch_bucket_size", "0.9 hidden^2", "DeepSpeed",
                t2, sizeof t2),
            (long long)z->stage3_param_persistence_threshold,
            tag(c, "zero_optimization.stage3_param_persistence_threshold", "10 hidden",
                "DeepSpeed", t3, sizeof t3),
            (long long)z->sub_group_size,
            tag(c, "zero_optimization.sub_group_size", "DeepSpeed's 1e9", "DeepSpeed",
                t4, sizeof t4));
    fprintf(f, "  steps      %lld %s\n", (long long)c->train.steps,
            tag(c, "train.steps", NULL, "zinc", t1, sizeof t1));
}
