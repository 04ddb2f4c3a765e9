/* Resolving a run's config once: the batch a resumed checkpoint trained
 * with (kept across a change of world size), every "auto" against the model
 * and the device, the three batch keys against the world, and the effective
 * settings printed once, each with where it came from. zinc train, plan,
 * plan --tune, bench train, generate and the cost model's calibration all
 * call it (directly or through zn_run_open); what it changes from what the
 * user wrote it says here, with the reason. */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "zinc/ckpt.h"
#include "zinc/device.h"
#include "zinc/run.h"

/* Whether the device `train.device` names computes in bf16 (CUDA does; the
 * host backend computes in fp32). Probed only when precision is "auto". */
static int device_bf16(const zn_config *cfg)
{
    /* a config that names a CUDA device is planned for it, wherever the
     * plan is made (a login node, a laptop): it computes in bf16 there */
    if (!strncmp(cfg->train.device, "cuda", 4))
        return 1;
    return zn_run_has_cuda(cfg);
}

/* A checkpoint saved by another number of ranks: the global batch it
 * trained with stays (from the config it recorded when the user's leaves it
 * open), and the accumulation follows, or the resume is refused when no
 * whole accumulation keeps it. */
static int elastic_batch(zn_config *cfg, const zn_ckpt *ck, int world, FILE *out)
{
    if (zn_ckpt_world(ck) == world)
        return 0;
    if (!cfg->train_batch_size) {
        const char *text = zn_ckpt_config_text(ck);
        json_t *rec = text ? json_loads(text, 0, NULL) : NULL;
        json_t *tb = json_object_get(rec, "train_batch_size");
        if (json_is_integer(tb))
            cfg->train_batch_size = (int64_t)json_integer_value(tb);
        json_t *mb = json_object_get(rec, "train_micro_batch_size_per_gpu");
        if (!cfg->train_micro_batch_size_per_gpu && json_is_integer(mb))
            cfg->train_micro_batch_size_per_gpu = (int64_t)json_integer_value(mb);
        json_decref(rec);
    }
    if (cfg->train_batch_size <= 0 || cfg->train_micro_batch_size_per_gpu <= 0)
        return 0;
    int64_t mb = cfg->train_micro_batch_size_per_gpu, tb = cfg->train_batch_size;
    if (tb % (mb * world))
        return zn_set_error(ZN_ECONFIG, "--resume: the checkpoint's global batch %lld "
                            "(saved by %d rank(s)) is not micro-batch %lld x accumulation x %d "
                            "ranks for any accumulation: set train_batch_size or "
                            "train_micro_batch_size_per_gpu for this world size",
                            (long long)tb, zn_ckpt_world(ck), (long long)mb, world);
    if (out)
        fprintf(out, "resume     saved by %d rank(s), resumed on %d: global batch %lld kept "
                "(micro-batch %lld x gradient_accumulation_steps %lld x %d ranks)\n",
                zn_ckpt_world(ck), world, (long long)tb, (long long)mb,
                (long long)(tb / (mb * world)), world);
    cfg->gradient_accumulation_steps = 0;  /* derived from the global batch */
    return 0;
}

int zn_run_resolve(zn_config *cfg, const zn_ckpt *resume, int world, FILE *out)
{
    if (world < 1)
        world = 1;
    if (cfg->resolved_world == world)
        return 0;
    if (cfg->resolved_world)
        return zn_set_error(ZN_EARG, "%s: resolved for %d rank(s), run on %d", cfg->source,
                            cfg->resolved_world, world);
    int rc = resume ? elastic_batch(cfg, resume, world, out) : 0;
    if (rc)
        return rc;
    zn_model_dims d;
    if ((rc = zn_run_model_dims(cfg, &d)))
        return rc;
    bool prec_auto = zn_config_get_origin(cfg, "bf16.enabled") == ZN_ORIGIN_AUTO;
    if ((rc = zn_config_resolve_auto(cfg, d.hidden, prec_auto ? device_bf16(cfg) : -1)) ||
        (rc = zn_config_resolve_batch(cfg, world)))
        return rc;
    cfg->resolved_world = world;
    zn_debug("run: %s resolved for %d rank(s): micro-batch %lld x accumulation %lld", cfg->source,
             world, (long long)cfg->train_micro_batch_size_per_gpu,
             (long long)cfg->gradient_accumulation_steps);
    if (out) {
        zn_run_effective_print(cfg, world, out);
        fflush(out);
    }
    return 0;
}

int zn_run_effective(zn_config *cfg, int world, FILE *out)
{
    return zn_run_resolve(cfg, NULL, world, out);
}
