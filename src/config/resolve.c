/* A parsed configuration checked key against key (legacy DeepSpeed
 * spellings mapped as DeepSpeed maps them), its "auto" values resolved as
 * the HF Trainer resolves them, and its batch sizes derived. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "config/config-impl.h"

/* ---- cross-key checks ---------------------------------------------------- */


/* A deprecated DeepSpeed spelling that says "offload to cpu" (old, when
 * given true): the modern key `dev_key` becomes "cpu", as DeepSpeed maps it,
 * unless the config gives that key another device. */
static void legacy_offload(parse_ctx *ctx, const char *old, bool on, const char *dev_key,
                           zn_offload_device *dev)
{
    zn_config *c = ctx->cfg;
    zn_config_origin o = zn_cfg_origin_at(c, old);
    if (o == ZN_ORIGIN_DEFAULT || !on)
        return;
    if (zn_cfg_origin_at(c, dev_key) != ZN_ORIGIN_DEFAULT && *dev != ZN_OFFLOAD_CPU) {
        zn_cfg_err(ctx, old, "true is DeepSpeed's old spelling of %s = \"cpu\", and %s is \"%s\"; "
                "keep one of the two", dev_key, dev_key, zn_offload_device_name(*dev));
        return;
    }
    *dev = ZN_OFFLOAD_CPU;
    c->origin[zn_cfg_canon_index(zn_cfg_find_key(dev_key))] = (unsigned char)o;
}

/* cpu_offload_use_pin_memory: the pin_memory of both offload sections,
 * where the config does not give them. */
static void legacy_pin(parse_ctx *ctx)
{
    zn_config *c = ctx->cfg;
    const char *old = "zero_optimization.cpu_offload_use_pin_memory";
    zn_config_origin o = zn_cfg_origin_at(c, old);
    if (o == ZN_ORIGIN_DEFAULT)
        return;
    static const char *const keys[2] = { "zero_optimization.offload_param.pin_memory",
                                         "zero_optimization.offload_optimizer.pin_memory" };
    bool *vals[2] = { &c->zero.offload_param.pin_memory, &c->zero.offload_optimizer.pin_memory };
    for (int i = 0; i < 2; i++)
        if (zn_cfg_origin_at(c, keys[i]) == ZN_ORIGIN_DEFAULT) {
            *vals[i] = c->zero.legacy_pin_memory;
            c->origin[zn_cfg_canon_index(zn_cfg_find_key(keys[i]))] = (unsigned char)o;
        }
}

int zn_cfg_validate(parse_ctx *ctx)
{
    zn_config *c = ctx->cfg;
    const zn_config_zero *z = &c->zero;

    legacy_offload(ctx, "zero_optimization.cpu_offload", z->legacy_cpu_offload,
                   "zero_optimization.offload_optimizer.device",
                   &c->zero.offload_optimizer.device);
    legacy_offload(ctx, "zero_optimization.cpu_offload_param", z->legacy_cpu_offload_param,
                   "zero_optimization.offload_param.device", &c->zero.offload_param.device);
    legacy_pin(ctx);

    if (c->bf16 && c->fp16.enabled)
        zn_cfg_err(ctx, "bf16.enabled", "bf16.enabled and fp16.enabled are both true; choose one");
    if (z->offload_param.device != ZN_OFFLOAD_NONE && z->stage != 3)
        zn_cfg_err(ctx, "zero_optimization.offload_param", "needs zero_optimization.stage = 3 "
                "(it is %d)", z->stage);
    if (z->offload_optimizer.device == ZN_OFFLOAD_NVME && z->stage != 3)
        zn_cfg_err(ctx, "zero_optimization.offload_optimizer.device", "\"nvme\" needs "
                "zero_optimization.stage = 3 (it is %d)", z->stage);
    if (z->offload_optimizer.device != ZN_OFFLOAD_NONE && z->stage == 0)
        zn_cfg_err(ctx, "zero_optimization.offload_optimizer", "needs zero_optimization.stage "
                ">= 1 (it is 0)");
    if (z->offload_optimizer.ratio < 1.0 && z->stage != 3)
        zn_cfg_err(ctx, "zero_optimization.offload_optimizer.ratio", "< 1 needs stage 3");
    if (c->tiers.grads == ZN_GRADS_NVME && z->offload_optimizer.device != ZN_OFFLOAD_NVME)
        zn_cfg_err(ctx, "tiers.grads", "\"nvme\" needs zero_optimization.offload_optimizer.device "
                "= \"nvme\" (gradients go to NVMe only with the optimizer states)");
    bool any_nvme_path = c->tiers.n_nvme > 0;
    if (z->offload_param.device == ZN_OFFLOAD_NVME && !z->offload_param.nvme_path[0] && !any_nvme_path)
        zn_cfg_err(ctx, "zero_optimization.offload_param.device", "\"nvme\" needs "
                "offload_param.nvme_path or tiers.nvme");
    if (z->offload_optimizer.device == ZN_OFFLOAD_NVME && !z->offload_optimizer.nvme_path[0] &&
        !any_nvme_path)
        zn_cfg_err(ctx, "zero_optimization.offload_optimizer.device", "\"nvme\" needs "
                "offload_optimizer.nvme_path or tiers.nvme");
    if (z->offload_param.buffer_size < z->stage3_param_persistence_threshold)
        zn_debug("%s: offload_param.buffer_size < stage3_param_persistence_threshold", ctx->file);
    /* A bf16 master with stochastic rounding: bf16 training only (an fp16
     * run's loss scaling and its overflow steps assume an fp32 master) */
    if (c->train.master_weights == ZN_MASTER_BF16_SR && c->fp16.enabled)
        zn_cfg_err(ctx, "train.master_weights", "\"bf16_sr\" keeps bf16 master weights; "
                   "fp16.enabled is true: train in bf16 (bf16.enabled), or use "
                   "train.master_weights \"fp32\"");
    if (c->aio.block_size % 4096)
        zn_cfg_err(ctx, "aio.block_size", "%lld is not a multiple of 4096",
                (long long)c->aio.block_size);

    const zn_config_scheduler *s = &c->scheduler;
    if ((s->type == ZN_SCHED_WARMUP_DECAY_LR || s->type == ZN_SCHED_WARMUP_COSINE_LR) &&
        s->total_num_steps == 0)
        zn_cfg_err(ctx, "scheduler.params.total_num_steps", "required for %s (or \"auto\": "
                "train.steps)", s->type == ZN_SCHED_WARMUP_DECAY_LR ? "WarmupDecayLR"
                                                                    : "WarmupCosineLR");
    if (s->type >= ZN_SCHED_WARMUP_LR && s->type <= ZN_SCHED_WARMUP_COSINE_LR &&
        s->total_num_steps && s->warmup_num_steps > s->total_num_steps)
        zn_cfg_err(ctx, "scheduler.params.warmup_num_steps", "%lld exceeds total_num_steps (%lld)",
                (long long)s->warmup_num_steps, (long long)s->total_num_steps);
    if (s->type == ZN_SCHED_WARMUP_LR || s->type == ZN_SCHED_WARMUP_DECAY_LR) {
        if (s->warmup_min_lr > s->warmup_max_lr)
            zn_cfg_err(ctx, "scheduler.params.warmup_min_lr", "%g exceeds warmup_max_lr (%g)",
                    s->warmup_min_lr, s->warmup_max_lr);
    }
    if (c->optimizer.type == ZN_OPT_ADAMW)
        c->optimizer.adam_w_mode = true;

    const zn_config_model *m = &c->model;
    if (!m->path[0] && m->hidden_size) {
        if (!m->num_hidden_layers || !m->num_attention_heads || !m->intermediate_size ||
            !m->vocab_size) {
            zn_cfg_err(ctx, "model", "give either 'path' (an HF model folder) or all of "
                    "hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, "
                    "vocab_size");
        } else {
            int64_t kv = m->num_key_value_heads ? m->num_key_value_heads : m->num_attention_heads;
            /* gemma2, gemma3_text (256) and qwen3_moe (128): an unset
             * head_dim is their HF default, not hidden / heads (the
             * config.json parser checks it, src/run/setup.c) */
            bool own_head_dim = m->arch == 7 || m->arch == 8 || m->arch == 10;
            if (!m->head_dim && !own_head_dim && m->hidden_size % m->num_attention_heads)
                zn_cfg_err(ctx, "model.hidden_size", "%lld is not a multiple of "
                        "num_attention_heads (%lld); set model.head_dim",
                        (long long)m->hidden_size, (long long)m->num_attention_heads);
            if (m->num_attention_heads % kv)
                zn_cfg_err(ctx, "model.num_attention_heads", "%lld is not a multiple of "
                        "num_key_value_heads (%lld)", (long long)m->num_attention_heads,
                        (long long)kv);
            int64_t hd = m->head_dim ? m->head_dim : m->hidden_size / m->num_attention_heads;
            if (hd % 2 && (m->head_dim || !own_head_dim))
                zn_cfg_err(ctx, "model", "head dimension %lld is odd; RoPE needs an even one",
                        (long long)hd);
        }
    } else if (!m->path[0] && (m->num_hidden_layers || m->vocab_size || m->intermediate_size)) {
        zn_cfg_err(ctx, "model.hidden_size", "missing (or give model.path)");
    }
    if (c->model.num_key_value_heads == 0)
        c->model.num_key_value_heads = c->model.num_attention_heads;
    if (c->train.checkpoint.every && !c->train.checkpoint.dir[0])
        zn_cfg_err(ctx, "train.checkpoint.every", "set, but train.checkpoint.dir is not");
    return ctx->n_err ? ZN_ECONFIG : 0;
}

/* ---- "auto" and the training defaults ------------------------------------ */


zn_config_origin zn_cfg_origin_at(const zn_config *c, const char *path)
{
    const key_spec *k = zn_cfg_find_key(path);
    return k ? (zn_config_origin)c->origin[zn_cfg_canon_index(k)] : ZN_ORIGIN_DEFAULT;
}

zn_config_origin zn_config_get_origin(const zn_config *c, const char *key)
{
    return zn_cfg_origin_at(c, key);
}

const char *zn_config_origin_name(zn_config_origin o)
{
    switch (o) {
    case ZN_ORIGIN_DEFAULT: return "default";
    case ZN_ORIGIN_CONFIG: return "config";
    case ZN_ORIGIN_AUTO: return "auto";
    case ZN_ORIGIN_SET: return "--set";
    }
    return "?";
}

int zn_config_resolve_auto(zn_config *c, int64_t hidden, int device_bf16)
{
    const zn_config_train *t = &c->train;
    if (t->warmup_ratio > 0 && zn_cfg_origin_at(c, "train.warmup_steps") == ZN_ORIGIN_DEFAULT)
        c->train.warmup_steps = (int64_t)ceil(t->warmup_ratio * (double)t->steps);
    bool fp16_given = zn_cfg_origin_at(c, "fp16.enabled") != ZN_ORIGIN_AUTO && c->fp16.enabled;
    for (size_t i = 0; i < zn_cfg_n_schema; i++) {
        const key_spec *k = &zn_cfg_schema[i];
        if (!k->autorule || zn_cfg_canon_index(k) != i || c->origin[i] != ZN_ORIGIN_AUTO)
            continue;
        switch ((auto_rule)k->autorule) {
        case A_NONE: break;
        case A_CLIP: c->gradient_clipping = t->max_grad_norm; break;
        /* HF takes precision from --bf16/--fp16; zinc from the device: bf16
         * where it computes in bf16, never fp16 unless asked for. */
        case A_BF16: c->bf16 = device_bf16 == 1 && !fp16_given; break;
        case A_FP16: c->fp16.enabled = false; break;
        case A_LR: c->optimizer.lr = t->learning_rate; break;
        case A_BETAS:
            c->optimizer.beta1 = t->adam_beta1;
            c->optimizer.beta2 = t->adam_beta2;
            break;
        case A_EPS: c->optimizer.eps = t->adam_epsilon; break;
        case A_WD: c->optimizer.weight_decay = t->weight_decay; break;
        case A_WMIN: c->scheduler.warmup_min_lr = 0.0; break;
        case A_WMAX: c->scheduler.warmup_max_lr = t->learning_rate; break;
        case A_WSTEPS: c->scheduler.warmup_num_steps = t->warmup_steps; break;
        case A_TOTAL: c->scheduler.total_num_steps = t->steps > 0 ? t->steps : 1; break;
        case A_HSQ:
            if (hidden > 0)
                c->zero.reduce_bucket_size = hidden * hidden;
            break;
        case A_HSQ09:
            if (hidden > 0)
                c->zero.stage3_prefetch_bucket_size = (int64_t)(0.9 * (double)hidden * (double)hidden);
            break;
        case A_H10:
            if (hidden > 0)
                c->zero.stage3_param_persistence_threshold = 10 * hidden;
            break;
        case A_DSDEFAULT: c->zero.sub_group_size = 1000000000; break;
        }
    }
    if (c->zero.sub_group_size == 0)
        c->zero.sub_group_size = 1000000000;
    if (c->optimizer_from_train) {
        c->optimizer.type = ZN_OPT_ADAMW;
        c->optimizer.adam_w_mode = true;
        c->optimizer.bias_correction = true;
        c->optimizer.lr = t->learning_rate;
        c->optimizer.beta1 = t->adam_beta1;
        c->optimizer.beta2 = t->adam_beta2;
        c->optimizer.eps = t->adam_epsilon;
        c->optimizer.weight_decay = t->weight_decay;
    }
    if (c->scheduler_from_train) {
        static const zn_scheduler_type hf[] = { ZN_SCHED_HF_LINEAR, ZN_SCHED_HF_COSINE,
                                                ZN_SCHED_NONE, ZN_SCHED_HF_CONSTANT_WARMUP };
        c->scheduler.type = hf[t->lr_scheduler_type & 3];
        c->scheduler.warmup_num_steps = t->warmup_steps;
        c->scheduler.total_num_steps = t->steps > 0 ? t->steps : 1;
        c->scheduler.warmup_min_lr = 0.0;
        c->scheduler.warmup_max_lr = c->optimizer.lr;
        c->scheduler.warmup_type = 1;
    }
    /* the batch keys: HF fills micro-batch and accumulation from its
     * arguments; zn_config_resolve_batch derives what is still open */
    if (!c->train_micro_batch_size_per_gpu && t->per_device_train_batch_size)
        c->train_micro_batch_size_per_gpu = t->per_device_train_batch_size;
    if (!c->gradient_accumulation_steps && t->gradient_accumulation_steps)
        c->gradient_accumulation_steps = t->gradient_accumulation_steps;
    return 0;
}

/* a * b * w for the batch keys, or -1 when it does not fit in an int64
 * (the keys' ranges alone allow 9.2e18 each). */
static int64_t batch_product(int64_t a, int64_t b, int w)
{
    int64_t ab, abw;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, (int64_t)w, &abw))
        return -1;
    return abw;
}

int zn_config_resolve_batch(zn_config *c, int world)
{
    int64_t tb = c->train_batch_size, mb = c->train_micro_batch_size_per_gpu,
            ga = c->gradient_accumulation_steps;
    if (world < 1)
        return zn_set_error(ZN_ECONFIG, "world size %d must be >= 1", world);
    if (batch_product(mb ? mb : 1, ga ? ga : 1, world) < 0 ||
        batch_product(mb ? mb : 1, 1, world) < 0 || batch_product(ga ? ga : 1, 1, world) < 0)
        return zn_set_error(ZN_ECONFIG, "%s: train_micro_batch_size_per_gpu (%lld) * "
                            "gradient_accumulation_steps (%lld) * world size (%d) overflows "
                            "a 64-bit integer", c->source, (long long)mb, (long long)ga, world);
    if (tb && mb && ga) {
        if (tb != mb * ga * world)
            return zn_set_error(ZN_ECONFIG, "%s: train_batch_size (%lld) != "
                                "train_micro_batch_size_per_gpu (%lld) * "
                                "gradient_accumulation_steps (%lld) * world size (%d)",
                                c->source, (long long)tb, (long long)mb, (long long)ga, world);
    } else if (tb && mb) {
        if (tb % (mb * world))
            return zn_set_error(ZN_ECONFIG, "%s: train_batch_size (%lld) is not divisible by "
                                "train_micro_batch_size_per_gpu (%lld) * world size (%d)",
                                c->source, (long long)tb, (long long)mb, world);
        ga = tb / (mb * world);
    } else if (tb && ga) {
        if (tb % (ga * world))
            return zn_set_error(ZN_ECONFIG, "%s: train_batch_size (%lld) is not divisible by "
                                "gradient_accumulation_steps (%lld) * world size (%d)",
                                c->source, (long long)tb, (long long)ga, world);
        mb = tb / (ga * world);
    } else if (tb) {
        if (tb % world)
            return zn_set_error(ZN_ECONFIG, "%s: train_batch_size (%lld) is not divisible by "
                                "the world size (%d)", c->source, (long long)tb, world);
        ga = 1;
        mb = tb / world;
    } else {
        if (!mb)
            mb = 1;
        if (!ga)
            ga = 1;
    }
    tb = mb * ga * world;
    c->train_batch_size = tb;
    c->train_micro_batch_size_per_gpu = mb;
    c->gradient_accumulation_steps = ga;
    return 0;
}

void zn_config_set_steps(zn_config *c, int64_t steps)
{
    zn_config_train *t = &c->train;
    t->steps = steps;
    if (t->warmup_ratio > 0 && zn_cfg_origin_at(c, "train.warmup_steps") == ZN_ORIGIN_DEFAULT)
        t->warmup_steps = (int64_t)ceil(t->warmup_ratio * (double)steps);
    if (c->scheduler_from_train) {
        c->scheduler.warmup_num_steps = t->warmup_steps;
        c->scheduler.total_num_steps = steps > 0 ? steps : 1;
    } else {
        if (zn_cfg_origin_at(c, "scheduler.params.warmup_num_steps") == ZN_ORIGIN_AUTO)
            c->scheduler.warmup_num_steps = t->warmup_steps;
        if (zn_cfg_origin_at(c, "scheduler.params.total_num_steps") == ZN_ORIGIN_AUTO)
            c->scheduler.total_num_steps = steps > 0 ? steps : 1;
    }
}

int zn_config_nvme_paths(const zn_config *cfg, const char **paths, int max)
{
    int n = 0;
    for (int i = 0; i < cfg->tiers.n_nvme && n < max; i++)
        paths[n++] = cfg->tiers.nvme[i].path;
    if (n || max < 1)
        return n;
    const char *a = cfg->zero.offload_optimizer.nvme_path;
    const char *p = cfg->zero.offload_param.nvme_path;
    if (cfg->zero.offload_optimizer.device == ZN_OFFLOAD_NVME && a[0])
        paths[n++] = a;
    if (cfg->zero.offload_param.device == ZN_OFFLOAD_NVME && p[0] && n < max &&
        (!n || strcmp(paths[0], p)))
        paths[n++] = p;
    return n;
}

/* The setting a swap folder of zn_config_nvme_paths came from. */
static void nvme_path_key(const zn_config *cfg, const char *path, char *key, size_t n)
{
    for (int i = 0; i < cfg->tiers.n_nvme; i++)
        if (path == cfg->tiers.nvme[i].path) {
            snprintf(key, n, "tiers.nvme[%d].path", i);
            return;
        }
    snprintf(key, n, "zero_optimization.%s.nvme_path",
             path == cfg->zero.offload_param.nvme_path ? "offload_param" : "offload_optimizer");
}

int zn_config_nvme_path_check(const zn_config *cfg, int i, int *missing)
{
    const char *paths[ZN_MAX_NVME_PATHS + 2];
    int np = zn_config_nvme_paths(cfg, paths, ZN_MAX_NVME_PATHS + 2);
    if (missing)
        *missing = 0;
    if (i < 0 || i >= np)
        return zn_set_error(-EINVAL, "%s: no NVMe path %d (the config has %d)", cfg->source, i,
                            np);
    const char *path = paths[i];
    char key[96], where[ZN_PATH_MAX + 32] = "", cwd[ZN_PATH_MAX];
    nvme_path_key(cfg, path, key, sizeof key);
    if (path[0] != '/' && getcwd(cwd, sizeof cwd))
        snprintf(where, sizeof where, " (in %s)", cwd);
    struct stat st;
    if (stat(path, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return zn_set_error(ZN_ECONFIG, "%s: %s %s%s is not a directory", cfg->source, key,
                                path, where);
        return 0;
    }
    int e = errno;
    if (e != ENOENT)
        return zn_set_error(-e, "%s: %s %s%s: %s", cfg->source, key, path, where, strerror(e));
    char to[ZN_PATH_MAX] = "";
    ssize_t tl = readlink(path, to, sizeof to - 1);
    if (tl > 0) {
        to[tl] = '\0';
        return zn_set_error(ZN_ECONFIG, "%s: %s %s%s is a symbolic link to %s, which does not "
                            "exist", cfg->source, key, path, where, to);
    }
    if (!cfg->tiers.create_nvme_path)
        return zn_set_error(ZN_ECONFIG, "%s: %s %s%s does not exist. zinc creates no swap folder "
                            "unless told to (a mistyped or unmounted path would put the swap "
                            "on another disk): create it (mkdir -p %s), or let zinc create it "
                            "with --set tiers.create_nvme_path=true (\"create_nvme_path\": true "
                            "in the config's tiers section)", cfg->source, key, path, where,
                            path);
    if (missing)
        *missing = 1;
    return 0;
}
