/* Learning-rate schedules with DeepSpeed's formulas (lr_schedules.py:
 * WarmupLR, WarmupDecayLR, WarmupCosineLR) and the HF Trainer's (linear,
 * cosine, constant_with_warmup: what a config without a scheduler section
 * gets), as a pure function of the scheduler iteration so that any step can
 * be recomputed (resume, tests). */
#include <math.h>

#include "zinc/optim.h"

static double warmup_gamma(const zn_lr_sched *s, int64_t it, int64_t W)
{
    if (s->warmup_type == 1) /* linear */
        return (double)it / (double)W;
    return log((double)it + 1.0) / log((double)W);
}

double zn_lr_schedule(const zn_lr_sched *s, double base_lr, int64_t it)
{
    int64_t W = s->warmup_num_steps < 2 ? 2 : s->warmup_num_steps;
    double T = (double)s->total_num_steps;
    switch (s->type) {
    case ZN_SCHED_NONE:
        return base_lr;
    case ZN_SCHED_WARMUP_LR:
    case ZN_SCHED_WARMUP_DECAY_LR: {
        if (it < 0)
            return s->warmup_min_lr;
        double gamma;
        if (it < W)
            gamma = warmup_gamma(s, it, W);
        else if (s->type == ZN_SCHED_WARMUP_LR)
            gamma = 1.0;
        else
            gamma = fmax(0.0, (T - (double)it) / fmax(1.0, T - (double)W));
        return s->warmup_min_lr + (s->warmup_max_lr - s->warmup_min_lr) * gamma;
    }
    case ZN_SCHED_WARMUP_COSINE_LR: {
        if (it < 0)
            return 0.0;
        double ratio;
        if (it < W) {
            ratio = warmup_gamma(s, it, W);
            ratio = s->warmup_min_ratio + ratio * (1.0 - s->warmup_min_ratio);
        } else {
            double real_last = (double)(it - W + 1), real_total = T - (double)W;
            double c = real_total > 0 ? (1.0 + cos(M_PI * real_last / real_total)) / 2.0 : 0.0;
            ratio = fmax(0.0, s->cos_min_ratio + (1.0 - s->cos_min_ratio) * c);
        }
        return base_lr * ratio;
    }
    /* transformers' get_*_schedule_with_warmup: lr * it / W during warmup
     * (W = 0: no warmup), then decay over the remaining T - W steps */
    case ZN_SCHED_HF_LINEAR:
    case ZN_SCHED_HF_COSINE:
    case ZN_SCHED_HF_CONSTANT_WARMUP: {
        int64_t w = s->warmup_num_steps;
        if (it < 0)
            return 0.0;
        if (it < w)
            return base_lr * (double)it / (double)w;
        if (s->type == ZN_SCHED_HF_CONSTANT_WARMUP)
            return base_lr;
        double span = fmax(1.0, T - (double)w);
        if (s->type == ZN_SCHED_HF_LINEAR)
            return base_lr * fmax(0.0, (T - (double)it) / span);
        double progress = ((double)it - (double)w) / span;
        return base_lr * fmax(0.0, 0.5 * (1.0 + cos(M_PI * progress)));
    }
    }
    return base_lr;
}
