/* Dynamic loss scaling for fp16 training, with the semantics of DeepSpeed's
 * DynamicLossScaler (scale factor 2, window, hysteresis = delayed_shift,
 * consecutive_hysteresis false, min scale). */
#include <math.h>

#include "zinc/optim.h"

void zn_loss_scaler_init(zn_loss_scaler *ls, const zn_loss_scale_config *cfg)
{
    ls->factor = 2.0;
    ls->iter = 0;
    ls->last_overflow_iter = -1;
    ls->overflows = 0;
    ls->window = cfg->loss_scale_window > 0 ? cfg->loss_scale_window : 1000;
    ls->hysteresis = cfg->hysteresis > 0 ? cfg->hysteresis : 1;
    ls->cur_hysteresis = ls->hysteresis;
    ls->min_scale = cfg->min_loss_scale > 0 ? cfg->min_loss_scale : 1.0;
    if (!cfg->enabled) {
        ls->scale = 1.0;
        ls->dynamic = 0;
    } else if (cfg->loss_scale > 0) {
        ls->scale = cfg->loss_scale;
        ls->dynamic = 0;
    } else {
        ls->scale = ldexp(1.0, cfg->initial_scale_power);
        ls->dynamic = 1;
    }
}

int zn_loss_scaler_update(zn_loss_scaler *ls, int overflow)
{
    int at_min = 0;
    if (overflow) {
        ls->overflows++;
        if (ls->dynamic) {
            if (ls->hysteresis == 1 || ls->cur_hysteresis == 1) {
                if (ls->scale <= ls->min_scale)
                    at_min = 1;
                ls->scale = fmax(ls->scale / ls->factor, ls->min_scale);
            } else {
                ls->cur_hysteresis--;
            }
        }
        ls->last_overflow_iter = ls->iter;
    } else if (ls->dynamic) {
        if ((ls->iter - ls->last_overflow_iter) % ls->window == 0) {
            ls->cur_hysteresis = ls->hysteresis;
            ls->scale *= ls->factor;
        }
    }
    ls->iter++;
    return at_min;
}
